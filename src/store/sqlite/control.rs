//! The control tables: what is paused (`reflexr_paused`) and each action's
//! settings (`reflexr_actions`). Rate-limit starts and uniqueness periods
//! live with the runs (`runs.rs`).

use std::collections::HashSet;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

use super::runs::{READY_PRIORITIES, partition};
use crate::store::Control;
use crate::store::control::*;
use crate::store::runs::RunRow;

const ACTION_COLUMNS: &str =
    "action, priority, max_running, rate_count, rate_period_ms, partition_by";

fn action_row(r: &Row<'_>) -> rusqlite::Result<ActionRow> {
    Ok(ActionRow {
        action: r.get(0)?,
        priority: r.get(1)?,
        max_running: r.get(2)?,
        rate_count: r.get(3)?,
        rate_period_ms: r.get(4)?,
        partition_by: r.get(5)?,
    })
}

/// The settings of those of `actions` (a JSON array) that have a limit.
pub(crate) fn limited(conn: &Connection, actions: &str) -> Result<Vec<ActionRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ACTION_COLUMNS} FROM reflexr_actions \
         WHERE action IN (SELECT value FROM json_each(?1)) \
           AND (max_running IS NOT NULL OR rate_count IS NOT NULL)"
    ))?;
    let rows = stmt
        .query_map([actions], action_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

impl Control for Connection {
    /// The names of this kind that are paused.
    fn paused_names(&self, kind: &str) -> Result<HashSet<String>> {
        let conn = self;
        let mut stmt = conn.prepare_cached("SELECT name FROM reflexr_paused WHERE kind = ?1")?;
        let rows = stmt
            .query_map([kind], |r| r.get(0))?
            .collect::<rusqlite::Result<HashSet<String>>>()?;
        Ok(rows)
    }

    /// Whether `(kind, name)` is paused.
    fn is_paused(&self, kind: &str, name: &str) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT 1 FROM reflexr_paused WHERE kind = ?1 AND name = ?2")?
            .query_row(params![kind, name], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// Pauses `(kind, name)`; false when it was paused already.
    fn pause(
        &self,
        kind: &str,
        name: &str,
        now: i64,
        operator: &str,
        reason: &str,
    ) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "INSERT INTO reflexr_paused (kind, name, since, operator, reason) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (kind, name) DO NOTHING",
            )?
            .execute(params![kind, name, now, operator, reason])?
            == 1)
    }

    /// Resumes `(kind, name)`; false when it was not paused.
    fn resume(&self, kind: &str, name: &str) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached("DELETE FROM reflexr_paused WHERE kind = ?1 AND name = ?2")?
            .execute(params![kind, name])?
            == 1)
    }

    /// Everything paused, by kind and name.
    fn paused(&self) -> Result<Vec<PausedRow>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(
            "SELECT kind, name, since, operator, reason FROM reflexr_paused ORDER BY kind, name",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Sets an action's settings, replacing what it had.
    fn configure_action(&self, a: &ActionRow, now: i64) -> Result<()> {
        let conn = self;
        conn.prepare_cached(&format!(
            "INSERT INTO reflexr_actions ({ACTION_COLUMNS}, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (action) DO UPDATE SET priority = excluded.priority, \
               max_running = excluded.max_running, rate_count = excluded.rate_count, \
               rate_period_ms = excluded.rate_period_ms, partition_by = excluded.partition_by, \
               updated_at = excluded.updated_at"
        ))?
        .execute(params![
            a.action,
            a.priority,
            a.max_running,
            a.rate_count,
            a.rate_period_ms,
            a.partition_by,
            now
        ])?;
        Ok(())
    }

    /// Every action's settings, by name.
    fn action_rows(&self) -> Result<Vec<ActionRow>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {ACTION_COLUMNS} FROM reflexr_actions ORDER BY action"
        ))?;
        let rows = stmt
            .query_map([], action_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn limited(&self, actions: &[String]) -> Result<Vec<ActionRow>> {
        let names = serde_json::to_string(actions).expect("names encode");
        limited(self, &names)
    }

    /// The priorities ready runs have, highest first: one index seek each.
    fn ready_priorities(&self) -> Result<Vec<i64>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(READY_PRIORITIES)?;
        let rows = stmt
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?;
        Ok(rows)
    }

    fn candidates(
        &self,
        action: &str,
        now: i64,
        priority: i64,
        path: &str,
        full: &[String],
        after: (i64, i64),
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>> {
        let full = serde_json::to_string(full).expect("partitions encode");
        super::runs::candidates(self, action, now, priority, path, &full, after, limit)
    }

    fn claim_ords(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        ords: &[i64],
    ) -> Result<Vec<RunRow>> {
        let ords = serde_json::to_string(ords).expect("ords encode");
        super::runs::claim_ords(self, holder, now, expires_at, &ords)
    }

    /// How many runs of `action` run now, by partition ([`partition`]; one
    /// group, `""`, without a path).
    fn running_by(&self, action: &str, path: Option<&str>) -> Result<Vec<(String, i64)>> {
        let conn = self;
        let Some(path) = path else {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM reflexr_runs INDEXED BY reflexr_runs_running \
                     WHERE state = 'running' AND action = ?1",
                )?
                .query_row([action], |r| r.get(0))?;
            return Ok(vec![(String::new(), n)]);
        };
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {}, count(*) FROM reflexr_runs \
             INDEXED BY reflexr_runs_running WHERE state = 'running' AND action = ?1 GROUP BY 1",
            partition("?2")
        ))?;
        let rows = stmt
            .query_map(params![action, path], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Starts of `action` in the window after `since`, by partition.
    fn starts_since(&self, action: &str, since: i64) -> Result<Vec<(String, i64)>> {
        let conn = self;
        conn.prepare_cached("DELETE FROM reflexr_starts WHERE action = ?1 AND at <= ?2")?
            .execute(params![action, since])?;
        let mut stmt = conn.prepare_cached(
            "SELECT part, sum(n) FROM reflexr_starts WHERE action = ?1 AND at > ?2 GROUP BY part",
        )?;
        let rows = stmt
            .query_map(params![action, since], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Records `n` starts of a rate-limited action's partition, at `at`.
    fn record_starts(&self, action: &str, part: &str, at: i64, n: i64) -> Result<()> {
        let conn = self;
        conn.prepare_cached(
            "INSERT INTO reflexr_starts (action, part, at, n) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![action, part, at, n])?;
        Ok(())
    }

    fn work_due(&self, now: i64, actions: &[&String]) -> Result<bool> {
        let names = serde_json::to_string(actions).expect("names encode");
        super::runs::work_due(self, now, &names)
    }

    /// True when a claim lapsed (its executor stopped renewing it).
    fn lapsed_due(&self, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM reflexr_runs INDEXED BY reflexr_runs_lapsed \
                                WHERE state = 'running' AND claim_expires_at <= ?1)",
            )?
            .query_row([now], |r| r.get(0))?)
    }

    /// Deletes what the control tables no longer need at `now`: uniqueness
    /// periods that ended, and starts outside their action's rate window (or
    /// of an action no longer rate-limited). How many rows went.
    fn sweep_control(&self, now: i64) -> Result<usize> {
        let conn = self;
        let periods = conn
            .prepare_cached("DELETE FROM reflexr_unique_periods WHERE until <= ?1")?
            .execute([now])?;
        let starts = conn
            .prepare_cached(
                "DELETE FROM reflexr_starts WHERE NOT EXISTS (SELECT 1 FROM reflexr_actions a \
                   WHERE a.action = reflexr_starts.action AND a.rate_count IS NOT NULL \
                     AND reflexr_starts.at > ?1 - a.rate_period_ms)",
            )?
            .execute([now])?;
        Ok(periods + starts)
    }
}
