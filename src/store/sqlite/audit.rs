//! Statements on `reflexr_audit`, the record of what operators did.

use rusqlite::{Connection, params};

use crate::base::audit::{AuditAction, AuditEntry};
use crate::base::error::Result;

use crate::store::Audit;
use crate::store::audit;

/// The most recent `limit` entries, newest first.
pub(crate) fn recent(conn: &Connection, limit: i64) -> Result<Vec<AuditEntry>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT at, operator, action, target, reason, detail FROM reflexr_audit \
         ORDER BY id DESC LIMIT {limit}"
    ))?;
    let rows = stmt
        .query_map([], |r| {
            Ok(AuditEntry {
                at: r.get(0)?,
                operator: r.get(1)?,
                action: AuditAction::from_stored(&r.get::<_, String>(2)?),
                target: r.get(3)?,
                reason: r.get(4)?,
                detail: r.get(5)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

impl Audit for Connection {
    fn record(&self, entry: &audit::Entry<'_>) -> Result<()> {
        let conn = self;
        let e = entry;
        conn.prepare_cached(
            "INSERT INTO reflexr_audit (at, operator, action, target, reason, detail) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            e.at,
            e.operator,
            e.action.as_str(),
            e.target,
            e.reason,
            e.detail
        ])?;
        Ok(())
    }

    fn recent(&self, limit: i64) -> Result<Vec<crate::base::audit::AuditEntry>> {
        recent(self, limit)
    }
}
