//! SQLite: workflows' steps, what suspended runs wait for, and runs' logs and progress.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;
use crate::store::Steps;
use crate::store::steps::{EventWait, LogRow, ProgressRow, StepRow};

const STEP_COLUMNS: &str =
    "run, name, position, kind, state, attempt, output, detail, wake_at, recorded_at";

fn step_from(r: &Row<'_>) -> rusqlite::Result<StepRow> {
    Ok(StepRow {
        run: r.get(0)?,
        name: r.get(1)?,
        position: r.get(2)?,
        kind: r.get(3)?,
        state: r.get(4)?,
        attempt: r.get(5)?,
        output: r.get(6)?,
        detail: r.get(7)?,
        wake_at: r.get(8)?,
        recorded_at: r.get(9)?,
    })
}

fn json_ids(ids: &[String]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".into())
}

impl Steps for Connection {
    fn steps(&self, run: &str) -> Result<Vec<StepRow>> {
        let mut stmt = self.prepare_cached(&format!(
            "SELECT {STEP_COLUMNS} FROM reflexr_steps WHERE run = ?1 ORDER BY position"
        ))?;
        let rows = stmt
            .query_map([run], step_from)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn insert_step(&self, s: &StepRow) -> Result<()> {
        self.prepare_cached(&format!(
            "INSERT INTO reflexr_steps ({STEP_COLUMNS}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        ))?
        .execute(params![
            s.run,
            s.name,
            s.position,
            s.kind,
            s.state,
            s.attempt,
            s.output,
            s.detail,
            s.wake_at,
            s.recorded_at
        ])?;
        Ok(())
    }

    fn resolve_step(&self, run: &str, name: &str, output: &str, now: i64) -> Result<bool> {
        Ok(self
            .prepare_cached(
                "UPDATE reflexr_steps SET state = 'done', output = ?3, recorded_at = ?4 \
                 WHERE run = ?1 AND name = ?2 AND state = 'waiting'",
            )?
            .execute(params![run, name, output, now])?
            == 1)
    }

    fn forget_steps(&self, run: &str, position: i64) -> Result<usize> {
        let n = self
            .prepare_cached("DELETE FROM reflexr_steps WHERE run = ?1 AND position >= ?2")?
            .execute(params![run, position])?;
        Steps::delete_waits_of(self, run)?;
        Ok(n)
    }

    fn delete_steps_of(&self, runs: &[String]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let ids = json_ids(runs);
        for sql in [
            "DELETE FROM reflexr_steps WHERE run IN (SELECT value FROM json_each(?1))",
            "DELETE FROM reflexr_event_waits WHERE run IN (SELECT value FROM json_each(?1))",
            "DELETE FROM reflexr_run_waits WHERE run IN (SELECT value FROM json_each(?1))",
            "DELETE FROM reflexr_run_logs WHERE run IN (SELECT value FROM json_each(?1))",
            "DELETE FROM reflexr_run_progress WHERE run IN (SELECT value FROM json_each(?1))",
        ] {
            self.prepare_cached(sql)?.execute([&ids])?;
        }
        Ok(())
    }

    fn append_log(&self, l: &LogRow, holder: &str) -> Result<bool> {
        Ok(self
            .prepare_cached(
                "INSERT INTO reflexr_run_logs (run, n, attempt, at, level, message, fields) \
                 SELECT ?1, coalesce((SELECT max(n) FROM reflexr_run_logs WHERE run = ?1), 0) + 1, \
                   ?2, ?3, ?4, ?5, ?6 \
                 WHERE EXISTS (SELECT 1 FROM reflexr_runs WHERE id = ?1 AND state = 'running' \
                                 AND claimed_by = ?7 AND attempt = ?2)",
            )?
            .execute(params![
                l.run, l.attempt, l.at, l.level, l.message, l.fields, holder
            ])?
            == 1)
    }

    fn count_logs(&self, run: &str, attempt: i64) -> Result<i64> {
        Ok(self
            .prepare_cached(
                "SELECT count(*) FROM reflexr_run_logs WHERE run = ?1 AND attempt = ?2",
            )?
            .query_row(params![run, attempt], |r| r.get(0))?)
    }

    fn run_logs(&self, run: &str, after: i64, limit: usize) -> Result<Vec<LogRow>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self.prepare_cached(
            "SELECT run, n, attempt, at, level, message, fields FROM reflexr_run_logs \
             WHERE run = ?1 AND n > ?2 ORDER BY n LIMIT ?3",
        )?;
        let rows = stmt
            .query_map(params![run, after, limit], |r| {
                Ok(LogRow {
                    run: r.get(0)?,
                    n: r.get(1)?,
                    attempt: r.get(2)?,
                    at: r.get(3)?,
                    level: r.get(4)?,
                    message: r.get(5)?,
                    fields: r.get(6)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn set_progress(&self, run: &str, holder: &str, p: &ProgressRow) -> Result<bool> {
        Ok(self
            .prepare_cached(
                "INSERT INTO reflexr_run_progress (run, attempt, done, total, at) \
                 SELECT ?1, ?2, ?3, ?4, ?5 \
                 WHERE EXISTS (SELECT 1 FROM reflexr_runs WHERE id = ?1 AND state = 'running' \
                                 AND claimed_by = ?6 AND attempt = ?2) \
                 ON CONFLICT (run) DO UPDATE SET attempt = excluded.attempt, \
                   done = excluded.done, total = excluded.total, at = excluded.at",
            )?
            .execute(params![run, p.attempt, p.done, p.total, p.at, holder])?
            == 1)
    }

    fn run_progress(&self, run: &str) -> Result<Option<ProgressRow>> {
        Ok(self
            .prepare_cached(
                "SELECT attempt, done, total, at FROM reflexr_run_progress WHERE run = ?1",
            )?
            .query_row([run], |r| {
                Ok(ProgressRow {
                    attempt: r.get(0)?,
                    done: r.get(1)?,
                    total: r.get(2)?,
                    at: r.get(3)?,
                })
            })
            .optional()?)
    }

    fn insert_event_wait(&self, w: &EventWait<'_>) -> Result<()> {
        // A workspace no wait was matched in lately starts at this wait's
        // seq (everything before it was looked at by the wait itself).
        self.prepare_cached(
            "INSERT INTO reflexr_wait_positions (workspace, position) VALUES (?1, ?2) \
             ON CONFLICT (workspace) DO UPDATE SET position = CASE \
               WHEN EXISTS (SELECT 1 FROM reflexr_event_waits WHERE workspace = ?1) \
               THEN min(position, excluded.position) ELSE excluded.position END",
        )?
        .execute(params![w.workspace, w.after_seq])?;
        self.prepare_cached(
            "INSERT INTO reflexr_event_waits (run, step, workspace, type, by, key, after_seq) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (run, step) DO UPDATE SET after_seq = excluded.after_seq",
        )?
        .execute(params![
            w.run,
            w.step,
            w.workspace,
            w.event_type,
            w.by,
            w.key,
            w.after_seq
        ])?;
        Ok(())
    }

    fn delete_event_wait(&self, run: &str, step: &str) -> Result<()> {
        self.prepare_cached("DELETE FROM reflexr_event_waits WHERE run = ?1 AND step = ?2")?
            .execute(params![run, step])?;
        Ok(())
    }

    fn delete_waits_of(&self, run: &str) -> Result<()> {
        self.prepare_cached("DELETE FROM reflexr_event_waits WHERE run = ?1")?
            .execute([run])?;
        self.prepare_cached("DELETE FROM reflexr_run_waits WHERE run = ?1")?
            .execute([run])?;
        Ok(())
    }

    fn waits_behind(&self) -> Result<bool> {
        Ok(self
            .prepare_cached(WAITS_BEHIND)?
            .query_row([], |r| r.get(0))?)
    }

    fn any_event_wait(&self) -> Result<bool> {
        Ok(self
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM reflexr_event_waits)")?
            .query_row([], |r| r.get(0))?)
    }

    fn wait_positions_behind(&self) -> Result<Vec<(String, i64)>> {
        let mut stmt = self.prepare_cached(
            "SELECT p.workspace, p.position FROM reflexr_wait_positions p \
             WHERE EXISTS (SELECT 1 FROM reflexr_event_waits w WHERE w.workspace = p.workspace) \
               AND EXISTS (SELECT 1 FROM reflexr_events e \
                           WHERE e.workspace = p.workspace AND e.seq > p.position)",
        )?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn next_waited(
        &self,
        workspace: &str,
        after: (&str, &str),
    ) -> Result<Option<(String, String)>> {
        Ok(self
            .prepare_cached(
                "SELECT type, by FROM reflexr_event_waits INDEXED BY reflexr_event_waits_by_match \
                 WHERE workspace = ?1 AND (type, by) > (?2, ?3) ORDER BY type, by LIMIT 1",
            )?
            .query_row(params![workspace, after.0, after.1], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?)
    }

    fn waits_for(
        &self,
        workspace: &str,
        event_type: &str,
        by: &str,
        key: &str,
        seq: i64,
    ) -> Result<Vec<(String, String)>> {
        let mut stmt = self.prepare_cached(
            "SELECT run, step FROM reflexr_event_waits INDEXED BY reflexr_event_waits_by_match \
             WHERE workspace = ?1 AND type = ?2 AND by = ?3 AND key = ?4 AND after_seq < ?5",
        )?;
        let rows = stmt
            .query_map(params![workspace, event_type, by, key, seq], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn set_wait_position(&self, workspace: &str, position: i64) -> Result<()> {
        self.prepare_cached(
            "UPDATE reflexr_wait_positions SET position = max(position, ?2) WHERE workspace = ?1",
        )?
        .execute(params![workspace, position])?;
        Ok(())
    }

    fn insert_run_wait(&self, child: &str, run: &str, step: &str) -> Result<()> {
        self.prepare_cached(
            "INSERT INTO reflexr_run_waits (child, run, step) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO NOTHING",
        )?
        .execute(params![child, run, step])?;
        Ok(())
    }

    fn take_run_waiters(&self, child: &str) -> Result<Vec<String>> {
        let mut stmt =
            self.prepare_cached("DELETE FROM reflexr_run_waits WHERE child = ?1 RETURNING run")?;
        let rows = stmt
            .query_map([child], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(rows)
    }
}

/// Whether a workspace with waits has events after the seq its waits were
/// matched up to.
const WAITS_BEHIND: &str = "SELECT EXISTS (SELECT 1 FROM reflexr_wait_positions p \
     WHERE EXISTS (SELECT 1 FROM reflexr_event_waits w WHERE w.workspace = p.workspace) \
       AND EXISTS (SELECT 1 FROM reflexr_events e \
                   WHERE e.workspace = p.workspace AND e.seq > p.position))";
