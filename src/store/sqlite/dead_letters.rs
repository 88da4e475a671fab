//! Statements on `reflexr_dead_letters`.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::dead_letter::{DeadLetter, DeadLetterKind, Reason, Resolution};
use crate::base::error::Result;

use crate::store::DeadLetters;
use crate::store::dead_letters::*;

const COLUMNS: &str = "id, kind, consumer, workspace, event_seq, event_id, run_id, reason, \
                       error, attempts, created_at, resolved_at, resolution";

/// A text column holding one of `T`'s values.
fn parsed<T: std::str::FromStr>(r: &Row<'_>, i: usize) -> rusqlite::Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: String = r.get(i)?;
    text.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<DeadLetter> {
    Ok(DeadLetter {
        id: r.get(0)?,
        kind: parsed(r, 1)?,
        consumer: r.get(2)?,
        workspace: r.get(3)?,
        event_seq: r.get(4)?,
        event_id: r.get(5)?,
        run_id: r.get(6)?,
        reason: Reason::from_stored(&r.get::<_, String>(7)?),
        error: r.get(8)?,
        attempts: r.get(9)?,
        created_at: r.get(10)?,
        resolved_at: r.get(11)?,
        resolution: r
            .get::<_, Option<String>>(12)?
            .map(|t| {
                t.parse::<Resolution>().map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        12,
                        rusqlite::types::Type::Text,
                        Box::new(e),
                    )
                })
            })
            .transpose()?,
    })
}

/// Dead letters matching `f`, newest first, among the `f.window` ids below
/// `f.before`; and the id to go on below (None at the start).
pub(crate) fn find(conn: &Connection, f: &Find<'_>) -> Result<(Vec<DeadLetter>, Option<i64>)> {
    let floor = f.before.saturating_sub(f.window).max(0);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_dead_letters \
         WHERE id < ?1 AND id >= ?2 AND (?3 OR resolved_at IS NULL) \
           AND (?4 IS NULL OR kind = ?4) AND (?5 IS NULL OR consumer = ?5) \
           AND (?6 IS NULL OR workspace = ?6) AND (?7 IS NULL OR reason = ?7) \
         ORDER BY id DESC LIMIT {}",
        f.limit
    ))?;
    let rows = stmt
        .query_map(
            params![
                f.before,
                floor,
                f.include_resolved,
                f.kind.map(DeadLetterKind::as_str),
                f.consumer,
                f.workspace,
                f.reason
            ],
            from_row,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let next = match rows.last() {
        Some(last) if rows.len() == f.limit => Some(last.id),
        _ => (floor > 0).then_some(floor),
    };
    Ok((rows, next))
}

impl DeadLetters for Connection {
    /// Deletes up to `limit` dead letters an operator resolved before `before`.
    fn delete_resolved(&self, before: i64, limit: usize) -> Result<usize> {
        Ok(self
            .prepare_cached(&format!(
                "DELETE FROM reflexr_dead_letters WHERE id IN \
                   (SELECT id FROM reflexr_dead_letters WHERE resolved_at < ?1 LIMIT {limit})"
            ))?
            .execute([before])?)
    }

    /// Records it; a second dead letter for the same (consumer, event) or the
    /// same open run is not recorded twice. A (consumer, event) that fails again
    /// after an operator resolved its dead letter (a replay that still fails)
    /// opens it again, with the new error. Returns whether it was new or opened
    /// again.
    fn insert(&self, d: &NewDeadLetter<'_>) -> Result<bool> {
        let conn = self;
        let n = conn
            .prepare_cached(
                "INSERT INTO reflexr_dead_letters \
                   (kind, consumer, workspace, event_seq, event_id, run_id, reason, error, \
                    attempts, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                 ON CONFLICT (kind, consumer, workspace, event_seq) WHERE run_id IS NULL \
                 DO UPDATE SET reason = excluded.reason, error = excluded.error, \
                   attempts = reflexr_dead_letters.attempts + excluded.attempts, \
                   created_at = excluded.created_at, resolved_at = NULL, resolution = NULL \
                 WHERE reflexr_dead_letters.resolved_at IS NOT NULL \
                 ON CONFLICT DO NOTHING",
            )?
            .execute(params![
                d.kind.as_str(),
                d.consumer,
                d.workspace,
                d.event_seq,
                d.event_id,
                d.run_id,
                d.reason.as_str(),
                crate::base::limits::clip_error(d.error),
                d.attempts,
                d.now
            ])?;
        Ok(n == 1)
    }

    /// Open dead letters (or all, with `include_resolved`), oldest first, after
    /// `after_id`.
    fn list(&self, include_resolved: bool, after_id: i64, limit: i64) -> Result<Vec<DeadLetter>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_dead_letters \
             WHERE id > ?1 AND (?2 OR resolved_at IS NULL) ORDER BY id LIMIT {limit}"
        ))?;
        let rows = stmt
            .query_map(params![after_id, include_resolved], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn get(&self, id: i64) -> Result<Option<DeadLetter>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM reflexr_dead_letters WHERE id = ?1"
            ))?
            .query_row([id], from_row)
            .optional()?)
    }

    /// The open dead letter of a run.
    fn open_for_run(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM reflexr_dead_letters \
                 WHERE run_id = ?1 AND resolved_at IS NULL"
            ))?
            .query_row([run_id], from_row)
            .optional()?)
    }

    /// Marks an open dead letter resolved; false if it was not open.
    fn resolve(&self, id: i64, resolution: Resolution, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_dead_letters SET resolved_at = ?2, resolution = ?3 \
                 WHERE id = ?1 AND resolved_at IS NULL",
            )?
            .execute(params![id, now, resolution.as_str()])?
            == 1)
    }

    /// Dead letters not yet resolved, by kind.
    fn open_counts(&self) -> Result<Vec<(DeadLetterKind, i64)>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(
            "SELECT kind, count(*) FROM reflexr_dead_letters INDEXED BY reflexr_dead_letters_open \
             WHERE resolved_at IS NULL GROUP BY kind ORDER BY kind",
        )?;
        let rows = stmt
            .query_map([], |r| Ok((parsed(r, 0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Resolves (as retried) the open dead letter of `consumer` for the event
    /// at `seq`, if there is one: the event was handled after all (a replay).
    fn resolve_for_event(
        &self,
        kind: DeadLetterKind,
        consumer: &str,
        workspace: &str,
        seq: i64,
        now: i64,
    ) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_dead_letters SET resolved_at = ?5, resolution = 'retried' \
                 WHERE kind = ?1 AND consumer = ?2 AND workspace = ?3 AND event_seq = ?4 \
                   AND run_id IS NULL AND resolved_at IS NULL",
            )?
            .execute(params![kind.as_str(), consumer, workspace, seq, now])?
            == 1)
    }
}
