//! PostgreSQL: dead letters (the seam's `store::dead_letters`).

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::dead_letter::{DeadLetter, DeadLetterKind, Reason, Resolution};
use crate::base::error::Result;
use crate::store::DeadLetters;
use crate::store::dead_letters::NewDeadLetter;

pub(super) const DEAD_LETTER_COLUMNS: &str = "id, kind, consumer, workspace, event_seq, event_id, run_id, \
                                   reason, error, attempts, created_at, resolved_at, resolution";

pub(super) fn dead_letter_from(r: &Row) -> Result<DeadLetter> {
    Ok(DeadLetter {
        id: col(r, 0)?,
        kind: col::<String>(r, 1)?.parse()?,
        consumer: col(r, 2)?,
        workspace: col(r, 3)?,
        event_seq: col(r, 4)?,
        event_id: col(r, 5)?,
        run_id: col(r, 6)?,
        reason: Reason::from_stored(&col::<String>(r, 7)?),
        error: col(r, 8)?,
        attempts: col(r, 9)?,
        created_at: col(r, 10)?,
        resolved_at: col(r, 11)?,
        resolution: col::<Option<String>>(r, 12)?
            .map(|t| t.parse())
            .transpose()?,
    })
}

impl DeadLetters for PgConn {
    fn delete_resolved(&self, before: i64, limit: usize) -> Result<usize> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(
            "WITH gone AS (DELETE FROM reflexr_dead_letters WHERE id IN \
               (SELECT id FROM reflexr_dead_letters WHERE resolved_at < $1 LIMIT $2) \
               RETURNING 1) SELECT count(*) FROM gone",
            &[(&before, Type::INT8), (&limit, Type::INT8)],
        )?;
        let n: i64 = rows.first().map_or(Ok(0), |r| col(r, 0))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn insert(&self, d: &NewDeadLetter<'_>) -> Result<bool> {
        // PostgreSQL takes one conflict target per statement: a run's dead
        // letter meets only the per-run index, another only the per-event
        // one (they are partial on `run_id`), so the statement is chosen by
        // the run.
        let conflict = if d.run_id.is_some() {
            "ON CONFLICT (run_id) WHERE run_id IS NOT NULL AND resolved_at IS NULL DO NOTHING"
        } else {
            "ON CONFLICT (kind, consumer, workspace, event_seq) WHERE run_id IS NULL \
             DO UPDATE SET reason = excluded.reason, error = excluded.error, \
               attempts = reflexr_dead_letters.attempts + excluded.attempts, \
               created_at = excluded.created_at, resolved_at = NULL, resolution = NULL \
             WHERE reflexr_dead_letters.resolved_at IS NOT NULL"
        };
        let error = crate::base::limits::clip_error(d.error);
        let rows = self.query(
            &format!(
                "INSERT INTO reflexr_dead_letters \
                   (kind, consumer, workspace, event_seq, event_id, run_id, reason, error, \
                    attempts, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) {conflict} RETURNING 1"
            ),
            &[
                (&d.kind.as_str(), Type::TEXT),
                (&d.consumer, Type::TEXT),
                (&d.workspace, Type::TEXT),
                (&d.event_seq, Type::INT8),
                (&d.event_id, Type::TEXT),
                (&d.run_id, Type::TEXT),
                (&d.reason.as_str(), Type::TEXT),
                (&error, Type::TEXT),
                (&d.attempts, Type::INT8),
                (&d.now, Type::INT8),
            ],
        )?;
        Ok(rows.len() == 1)
    }

    fn list(&self, include_resolved: bool, after_id: i64, limit: i64) -> Result<Vec<DeadLetter>> {
        self.query(
            &format!(
                "SELECT {DEAD_LETTER_COLUMNS} FROM reflexr_dead_letters \
                 WHERE id > $1 AND ($2 OR resolved_at IS NULL) ORDER BY id LIMIT $3"
            ),
            &[
                (&after_id, Type::INT8),
                (&include_resolved, Type::BOOL),
                (&limit, Type::INT8),
            ],
        )?
        .iter()
        .map(dead_letter_from)
        .collect()
    }

    fn get(&self, id: i64) -> Result<Option<DeadLetter>> {
        self.query_opt(
            &format!("SELECT {DEAD_LETTER_COLUMNS} FROM reflexr_dead_letters WHERE id = $1"),
            &[(&id, Type::INT8)],
        )?
        .as_ref()
        .map(dead_letter_from)
        .transpose()
    }

    fn open_for_run(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        self.query_opt(
            &format!(
                "SELECT {DEAD_LETTER_COLUMNS} FROM reflexr_dead_letters \
                 WHERE run_id = $1 AND resolved_at IS NULL"
            ),
            &[(&run_id, Type::TEXT)],
        )?
        .as_ref()
        .map(dead_letter_from)
        .transpose()
    }

    fn resolve(&self, id: i64, resolution: Resolution, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_dead_letters SET resolved_at = $2, resolution = $3 \
                 WHERE id = $1 AND resolved_at IS NULL RETURNING 1",
                &[
                    (&id, Type::INT8),
                    (&now, Type::INT8),
                    (&resolution.as_str(), Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn open_counts(&self) -> Result<Vec<(DeadLetterKind, i64)>> {
        self.query(
            "SELECT kind, count(*) FROM reflexr_dead_letters WHERE resolved_at IS NULL \
             GROUP BY kind ORDER BY kind",
            &[],
        )?
        .iter()
        .map(|r| Ok((col::<String>(r, 0)?.parse()?, col(r, 1)?)))
        .collect()
    }

    fn resolve_for_event(
        &self,
        kind: DeadLetterKind,
        consumer: &str,
        workspace: &str,
        seq: i64,
        now: i64,
    ) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_dead_letters SET resolved_at = $5, resolution = 'retried' \
                 WHERE kind = $1 AND consumer = $2 AND workspace = $3 AND event_seq = $4 \
                   AND run_id IS NULL AND resolved_at IS NULL RETURNING 1",
                &[
                    (&kind.as_str(), Type::TEXT),
                    (&consumer, Type::TEXT),
                    (&workspace, Type::TEXT),
                    (&seq, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }
}
