//! PostgreSQL: the audit log (the seam's `store::audit`).

use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Audit;

impl Audit for PgConn {
    fn record(&self, e: &crate::store::audit::Entry<'_>) -> Result<()> {
        let action = e.action.as_str();
        self.query(
            "INSERT INTO reflexr_audit (at, operator, action, target, reason, detail) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                (&e.at, Type::INT8),
                (&e.operator, Type::TEXT),
                (&action, Type::TEXT),
                (&e.target, Type::TEXT),
                (&e.reason, Type::TEXT),
                (&e.detail, Type::TEXT),
            ],
        )?;
        Ok(())
    }

    fn recent(&self, limit: i64) -> Result<Vec<crate::base::audit::AuditEntry>> {
        self.query(
            "SELECT at, operator, action, target, reason, detail FROM reflexr_audit \
             ORDER BY id DESC LIMIT $1",
            &[(&limit, Type::INT8)],
        )?
        .iter()
        .map(|r| {
            Ok(crate::base::audit::AuditEntry {
                at: col(r, 0)?,
                operator: col(r, 1)?,
                action: crate::base::audit::AuditAction::from_stored(&col::<String>(r, 2)?),
                target: col(r, 3)?,
                reason: col(r, 4)?,
                detail: col(r, 5)?,
            })
        })
        .collect()
    }
}
