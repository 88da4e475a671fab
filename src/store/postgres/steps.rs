//! PostgreSQL: workflows' steps, what suspended runs wait for, and runs' logs and progress, as
//! `store::sqlite::steps` has them.
//!
//! What differs: a join locks the rows of the runs it waits for
//! ([`Runs::lock_runs`]), so a child's end and its parent's look at it
//! never pass each other; the rest is serialised by the log's head, which
//! a wait's record and the match both take first.

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Steps;
use crate::store::steps::{EventWait, LogRow, ProgressRow, StepRow};

const STEP_COLUMNS: &str =
    "run, name, position, kind, state, attempt, output, detail, wake_at, recorded_at";

fn step_from(r: &Row) -> Result<StepRow> {
    Ok(StepRow {
        run: col(r, 0)?,
        name: col(r, 1)?,
        position: col(r, 2)?,
        kind: col(r, 3)?,
        state: col(r, 4)?,
        attempt: col(r, 5)?,
        output: col(r, 6)?,
        detail: col(r, 7)?,
        wake_at: col(r, 8)?,
        recorded_at: col(r, 9)?,
    })
}

impl Steps for PgConn {
    fn steps(&self, run: &str) -> Result<Vec<StepRow>> {
        self.query(
            &format!("SELECT {STEP_COLUMNS} FROM reflexr_steps WHERE run = $1 ORDER BY position"),
            &[(&run, Type::TEXT)],
        )?
        .iter()
        .map(step_from)
        .collect()
    }

    fn insert_step(&self, s: &StepRow) -> Result<()> {
        self.query(
            &format!(
                "INSERT INTO reflexr_steps ({STEP_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ),
            &[
                (&s.run, Type::TEXT),
                (&s.name, Type::TEXT),
                (&s.position, Type::INT8),
                (&s.kind, Type::TEXT),
                (&s.state, Type::TEXT),
                (&s.attempt, Type::INT8),
                (&s.output, Type::TEXT),
                (&s.detail, Type::TEXT),
                (&s.wake_at, Type::INT8),
                (&s.recorded_at, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn resolve_step(&self, run: &str, name: &str, output: &str, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_steps SET state = 'done', output = $3, recorded_at = $4 \
                 WHERE run = $1 AND name = $2 AND state = 'waiting' RETURNING 1",
                &[
                    (&run, Type::TEXT),
                    (&name, Type::TEXT),
                    (&output, Type::TEXT),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    fn forget_steps(&self, run: &str, position: i64) -> Result<usize> {
        let n = self
            .query(
                "DELETE FROM reflexr_steps WHERE run = $1 AND position >= $2 RETURNING 1",
                &[(&run, Type::TEXT), (&position, Type::INT8)],
            )?
            .len();
        Steps::delete_waits_of(self, run)?;
        Ok(n)
    }

    fn delete_steps_of(&self, runs: &[String]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        for sql in [
            "DELETE FROM reflexr_steps WHERE run = ANY ($1)",
            "DELETE FROM reflexr_event_waits WHERE run = ANY ($1)",
            "DELETE FROM reflexr_run_waits WHERE run = ANY ($1)",
            "DELETE FROM reflexr_run_logs WHERE run = ANY ($1)",
            "DELETE FROM reflexr_run_progress WHERE run = ANY ($1)",
        ] {
            self.query(sql, &[(&runs, Type::TEXT_ARRAY)])?;
        }
        Ok(())
    }

    fn append_log(&self, l: &LogRow, holder: &str) -> Result<bool> {
        // The run's row is locked first, so two lines of one run never take
        // one number (the claim check reads it anyway).
        Ok(self
            .query_opt(
                "WITH claim AS (SELECT 1 FROM reflexr_runs WHERE id = $1 AND state = 'running' COLLATE \"C\" \
                                  AND claimed_by = $7 AND attempt = $2 FOR UPDATE) \
                 INSERT INTO reflexr_run_logs (run, n, attempt, at, level, message, fields) \
                 SELECT $1, coalesce((SELECT max(n) FROM reflexr_run_logs WHERE run = $1), 0) + 1, \
                   $2, $3, $4, $5, $6 \
                 WHERE EXISTS (SELECT 1 FROM claim) RETURNING 1",
                &[
                    (&l.run, Type::TEXT),
                    (&l.attempt, Type::INT8),
                    (&l.at, Type::INT8),
                    (&l.level, Type::TEXT),
                    (&l.message, Type::TEXT),
                    (&l.fields, Type::TEXT),
                    (&holder, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn count_logs(&self, run: &str, attempt: i64) -> Result<i64> {
        self.query(
            "SELECT count(*) FROM reflexr_run_logs WHERE run = $1 AND attempt = $2",
            &[(&run, Type::TEXT), (&attempt, Type::INT8)],
        )?
        .first()
        .map_or(Ok(0), |r| col(r, 0))
    }

    fn run_logs(&self, run: &str, after: i64, limit: usize) -> Result<Vec<LogRow>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(
            "SELECT run, n, attempt, at, level, message, fields FROM reflexr_run_logs \
             WHERE run = $1 AND n > $2 ORDER BY n LIMIT $3",
            &[
                (&run, Type::TEXT),
                (&after, Type::INT8),
                (&limit, Type::INT8),
            ],
        )?
        .iter()
        .map(|r| {
            Ok(LogRow {
                run: col(r, 0)?,
                n: col(r, 1)?,
                attempt: col(r, 2)?,
                at: col(r, 3)?,
                level: col(r, 4)?,
                message: col(r, 5)?,
                fields: col(r, 6)?,
            })
        })
        .collect()
    }

    fn set_progress(&self, run: &str, holder: &str, p: &ProgressRow) -> Result<bool> {
        Ok(self
            .query_opt(
                "INSERT INTO reflexr_run_progress (run, attempt, done, total, at) \
                 SELECT $1, $2, $3, $4, $5 \
                 WHERE EXISTS (SELECT 1 FROM reflexr_runs WHERE id = $1 AND state = 'running' COLLATE \"C\" \
                                 AND claimed_by = $6 AND attempt = $2) \
                 ON CONFLICT (run) DO UPDATE SET attempt = excluded.attempt, \
                   done = excluded.done, total = excluded.total, at = excluded.at \
                 RETURNING 1",
                &[
                    (&run, Type::TEXT),
                    (&p.attempt, Type::INT8),
                    (&p.done, Type::INT8),
                    (&p.total, Type::INT8),
                    (&p.at, Type::INT8),
                    (&holder, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn run_progress(&self, run: &str) -> Result<Option<ProgressRow>> {
        self.query_opt(
            "SELECT attempt, done, total, at FROM reflexr_run_progress WHERE run = $1",
            &[(&run, Type::TEXT)],
        )?
        .map(|r| {
            Ok(ProgressRow {
                attempt: col(&r, 0)?,
                done: col(&r, 1)?,
                total: col(&r, 2)?,
                at: col(&r, 3)?,
            })
        })
        .transpose()
    }

    fn insert_event_wait(&self, w: &EventWait<'_>) -> Result<()> {
        self.query(
            "INSERT INTO reflexr_wait_positions (workspace, position) VALUES ($1, $2) \
             ON CONFLICT (workspace) DO UPDATE SET position = CASE \
               WHEN EXISTS (SELECT 1 FROM reflexr_event_waits WHERE workspace = $1) \
               THEN least(reflexr_wait_positions.position, excluded.position) \
               ELSE excluded.position END",
            &[(&w.workspace, Type::TEXT), (&w.after_seq, Type::INT8)],
        )?;
        self.query(
            "INSERT INTO reflexr_event_waits (run, step, workspace, type, by, key, after_seq) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (run, step) DO UPDATE SET after_seq = excluded.after_seq",
            &[
                (&w.run, Type::TEXT),
                (&w.step, Type::TEXT),
                (&w.workspace, Type::TEXT),
                (&w.event_type, Type::TEXT),
                (&w.by, Type::TEXT),
                (&w.key, Type::TEXT),
                (&w.after_seq, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn delete_event_wait(&self, run: &str, step: &str) -> Result<()> {
        self.query(
            "DELETE FROM reflexr_event_waits WHERE run = $1 AND step = $2",
            &[(&run, Type::TEXT), (&step, Type::TEXT)],
        )?;
        Ok(())
    }

    fn delete_waits_of(&self, run: &str) -> Result<()> {
        self.query(
            "DELETE FROM reflexr_event_waits WHERE run = $1",
            &[(&run, Type::TEXT)],
        )?;
        self.query(
            "DELETE FROM reflexr_run_waits WHERE run = $1",
            &[(&run, Type::TEXT)],
        )?;
        Ok(())
    }

    fn waits_behind(&self) -> Result<bool> {
        let row = self.query_opt(
            "SELECT EXISTS (SELECT 1 FROM reflexr_wait_positions p \
               WHERE EXISTS (SELECT 1 FROM reflexr_event_waits w WHERE w.workspace = p.workspace) \
                 AND EXISTS (SELECT 1 FROM reflexr_events e \
                             WHERE e.workspace = p.workspace AND e.seq > p.position))",
            &[],
        )?;
        Ok(match row {
            Some(r) => col(&r, 0)?,
            None => false,
        })
    }

    fn any_event_wait(&self) -> Result<bool> {
        let rows = self.query("SELECT EXISTS (SELECT 1 FROM reflexr_event_waits)", &[])?;
        col(&rows[0], 0)
    }

    fn wait_positions_behind(&self) -> Result<Vec<(String, i64)>> {
        self.query(
            "SELECT p.workspace, p.position FROM reflexr_wait_positions p \
             WHERE EXISTS (SELECT 1 FROM reflexr_event_waits w WHERE w.workspace = p.workspace) \
               AND EXISTS (SELECT 1 FROM reflexr_events e \
                           WHERE e.workspace = p.workspace AND e.seq > p.position)",
            &[],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn next_waited(
        &self,
        workspace: &str,
        after: (&str, &str),
    ) -> Result<Option<(String, String)>> {
        self.query_opt(
            "SELECT type, by FROM reflexr_event_waits \
             WHERE workspace = $1 AND (type, by) > ($2, $3) ORDER BY type, by LIMIT 1",
            &[
                (&workspace, Type::TEXT),
                (&after.0, Type::TEXT),
                (&after.1, Type::TEXT),
            ],
        )?
        .map(|r| Ok((col(&r, 0)?, col(&r, 1)?)))
        .transpose()
    }

    fn waits_for(
        &self,
        workspace: &str,
        event_type: &str,
        by: &str,
        key: &str,
        seq: i64,
    ) -> Result<Vec<(String, String)>> {
        self.query(
            "SELECT run, step FROM reflexr_event_waits \
             WHERE workspace = $1 AND type = $2 AND by = $3 AND key = $4 AND after_seq < $5",
            &[
                (&workspace, Type::TEXT),
                (&event_type, Type::TEXT),
                (&by, Type::TEXT),
                (&key, Type::TEXT),
                (&seq, Type::INT8),
            ],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn set_wait_position(&self, workspace: &str, position: i64) -> Result<()> {
        self.query(
            "UPDATE reflexr_wait_positions SET position = greatest(position, $2) \
             WHERE workspace = $1",
            &[(&workspace, Type::TEXT), (&position, Type::INT8)],
        )?;
        Ok(())
    }

    fn insert_run_wait(&self, child: &str, run: &str, step: &str) -> Result<()> {
        self.query(
            "INSERT INTO reflexr_run_waits (child, run, step) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
            &[
                (&child, Type::TEXT),
                (&run, Type::TEXT),
                (&step, Type::TEXT),
            ],
        )?;
        Ok(())
    }

    fn take_run_waiters(&self, child: &str) -> Result<Vec<String>> {
        self.query(
            "DELETE FROM reflexr_run_waits WHERE child = $1 RETURNING run",
            &[(&child, Type::TEXT)],
        )?
        .iter()
        .map(|r| col(r, 0))
        .collect()
    }
}
