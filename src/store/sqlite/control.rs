//! The control tables: what is paused (`reflexr_paused`) and each action's
//! settings (`reflexr_actions`). Rate-limit starts and uniqueness periods
//! live with the runs (`runs.rs`).

use std::collections::HashSet;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

use super::runs::{READY_PRIORITIES, UNFINISHED};
use crate::store::Control;
use crate::store::control::*;
use crate::store::runs::RunRow;

const ACTION_COLUMNS: &str =
    "action, priority, max_running, rate_count, rate_period_ms, partition_by, fair";

fn action_row(r: &Row<'_>) -> rusqlite::Result<ActionRow> {
    Ok(ActionRow {
        action: r.get(0)?,
        priority: r.get(1)?,
        max_running: r.get(2)?,
        rate_count: r.get(3)?,
        rate_period_ms: r.get(4)?,
        partition_by: r.get(5)?,
        fair: r.get(6)?,
    })
}

const KEY_COLUMNS: &str =
    "action, key, max_running, rate_count, rate_period_ms, weight, updated_at";

fn key_row(r: &Row<'_>) -> rusqlite::Result<KeyRow> {
    Ok(KeyRow {
        action: r.get(0)?,
        key: r.get(1)?,
        max_running: r.get(2)?,
        rate_count: r.get(3)?,
        rate_period_ms: r.get(4)?,
        weight: r.get(5)?,
        updated_at: r.get(6)?,
    })
}

/// The settings of those of `actions` (a JSON array) that the claim must
/// count or order: a limit, fair, or a key's override.
pub(crate) fn limited(conn: &Connection, actions: &str) -> Result<Vec<ActionRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ACTION_COLUMNS} FROM reflexr_actions a \
         WHERE action IN (SELECT value FROM json_each(?1)) AND {LIMITED}"
    ))?;
    let rows = stmt
        .query_map([actions], action_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// [`limited`] of one action (an evaluator handing a fresh run asks it
/// once per action and write): a seek, with no list for SQLite to build a
/// temporary b-tree of.
fn limited_one(conn: &Connection, action: &str) -> Result<Vec<ActionRow>> {
    let mut stmt = conn.prepare_cached(&limited_one_sql())?;
    let rows = stmt
        .query_map([action], action_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// [`limited_one`]'s statement.
pub(crate) fn limited_one_sql() -> String {
    format!("SELECT {ACTION_COLUMNS} FROM reflexr_actions a WHERE action = ?1 AND {LIMITED}")
}

/// An action whose claims count or order what they take.
const LIMITED: &str = "(max_running IS NOT NULL OR rate_count IS NOT NULL OR fair = 1 \
       OR (partition_by IS NOT NULL \
           AND EXISTS (SELECT 1 FROM reflexr_action_keys k WHERE k.action = a.action)))";

/// Each key of an action with ready runs at a priority, with its oldest
/// one (`?1` action, `?2` priority; those due at `?3`): a loose index scan
/// of `reflexr_runs_keyed`, one seek per key.
pub(super) const FAIR_HEADS: &str = "WITH RECURSIVE k(key) AS ( \
       SELECT (SELECT flow_key FROM reflexr_runs INDEXED BY reflexr_runs_keyed \
               WHERE state = 'ready' AND flow_key IS NOT NULL AND action = ?1 AND priority = ?2 \
               ORDER BY flow_key LIMIT 1) \
       UNION ALL \
       SELECT (SELECT flow_key FROM reflexr_runs INDEXED BY reflexr_runs_keyed \
               WHERE state = 'ready' AND flow_key IS NOT NULL AND action = ?1 AND priority = ?2 \
                 AND flow_key > k.key \
               ORDER BY flow_key LIMIT 1) \
       FROM k WHERE k.key IS NOT NULL) \
     SELECT key, head FROM ( \
       SELECT key, (SELECT ord FROM reflexr_runs INDEXED BY reflexr_runs_keyed \
                    WHERE state = 'ready' AND flow_key IS NOT NULL AND action = ?1 \
                      AND priority = ?2 AND flow_key = k.key AND due_at <= ?3 \
                    ORDER BY due_at, ord LIMIT 1) AS head \
       FROM k WHERE key IS NOT NULL) \
     WHERE head IS NOT NULL";

/// One key's ready runs due at `?4`, oldest first, up to `?5`.
pub(super) const KEY_ORDS: &str = "SELECT ord FROM reflexr_runs INDEXED BY reflexr_runs_keyed \
     WHERE state = 'ready' AND flow_key IS NOT NULL AND action = ?1 AND priority = ?2 \
       AND flow_key = ?3 AND due_at <= ?4 \
     ORDER BY due_at, ord LIMIT ?5";

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

    /// Sets an action's settings, replacing what it had (its fair clock
    /// stays).
    fn configure_action(&self, a: &ActionRow, key_path: Option<&str>, now: i64) -> Result<()> {
        let conn = self;
        conn.prepare_cached(&format!(
            "INSERT INTO reflexr_actions ({ACTION_COLUMNS}, key_path, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (action) DO UPDATE SET priority = excluded.priority, \
               max_running = excluded.max_running, rate_count = excluded.rate_count, \
               rate_period_ms = excluded.rate_period_ms, partition_by = excluded.partition_by, \
               fair = excluded.fair, key_path = excluded.key_path, \
               updated_at = excluded.updated_at"
        ))?
        .execute(params![
            a.action,
            a.priority,
            a.max_running,
            a.rate_count,
            a.rate_period_ms,
            a.partition_by,
            a.fair,
            key_path,
            now
        ])?;
        Ok(())
    }

    fn key_runs(&self, action: &str, key_path: Option<&str>) -> Result<usize> {
        Ok(self
            .prepare_cached(&format!(
                "UPDATE reflexr_runs SET flow_key = coalesce(CAST(json_extract(input, ?2) AS TEXT), '') \
                 WHERE ord IN (SELECT ord FROM ({UNFINISHED}) WHERE action = ?1 AND flow_key IS NULL)",
            ))?
            .execute(params![action, key_path])?)
    }

    fn action_row(&self, action: &str) -> Result<Option<ActionRow>> {
        Ok(self
            .prepare_cached(&format!(
                "SELECT {ACTION_COLUMNS} FROM reflexr_actions WHERE action = ?1"
            ))?
            .query_row([action], action_row)
            .optional()?)
    }

    fn set_key_row(&self, k: &KeyRow) -> Result<()> {
        self.prepare_cached(&format!(
            "INSERT INTO reflexr_action_keys ({KEY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (action, key) DO UPDATE SET max_running = excluded.max_running, \
               rate_count = excluded.rate_count, rate_period_ms = excluded.rate_period_ms, \
               weight = excluded.weight, updated_at = excluded.updated_at"
        ))?
        .execute(params![
            k.action,
            k.key,
            k.max_running,
            k.rate_count,
            k.rate_period_ms,
            k.weight,
            k.updated_at
        ])?;
        Ok(())
    }

    fn delete_key_row(&self, action: &str, key: &str) -> Result<bool> {
        Ok(self
            .prepare_cached("DELETE FROM reflexr_action_keys WHERE action = ?1 AND key = ?2")?
            .execute(params![action, key])?
            == 1)
    }

    fn key_rows(&self, action: Option<&str>) -> Result<Vec<KeyRow>> {
        let mut stmt = self.prepare_cached(&format!(
            "SELECT {KEY_COLUMNS} FROM reflexr_action_keys \
             WHERE ?1 IS NULL OR action = ?1 ORDER BY action, key"
        ))?;
        let rows = stmt
            .query_map([action], key_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// A loose index scan of `reflexr_runs_keyed`: from each key's first
    /// entry (its oldest ready run) to the next key's, one seek each.
    fn fair_heads(&self, action: &str, priority: i64, now: i64) -> Result<Vec<(String, i64)>> {
        let mut stmt = self.prepare_cached(FAIR_HEADS)?;
        let rows = stmt
            .query_map(params![action, priority, now], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn key_ords(
        &self,
        action: &str,
        key: &str,
        priority: i64,
        now: i64,
        limit: usize,
    ) -> Result<Vec<i64>> {
        let mut stmt = self.prepare_cached(KEY_ORDS)?;
        let rows = stmt
            .query_map(
                params![
                    action,
                    priority,
                    key,
                    now,
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                |r| r.get(0),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn fair_state(&self, action: &str) -> Result<FairState> {
        let clock: f64 = self
            .prepare_cached("SELECT fair_clock FROM reflexr_actions WHERE action = ?1")?
            .query_row([action], |r| r.get(0))
            .optional()?
            .unwrap_or(0.0);
        let mut stmt = self.prepare_cached(
            "SELECT key, pass FROM reflexr_key_passes WHERE action = ?1 AND pass > ?2",
        )?;
        let passes = stmt
            .query_map(params![action, clock], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(FairState { clock, passes })
    }

    fn save_fair(&self, action: &str, clock: f64, passes: &[(String, f64)]) -> Result<()> {
        self.prepare_cached("UPDATE reflexr_actions SET fair_clock = ?2 WHERE action = ?1")?
            .execute(params![action, clock])?;
        let passes = serde_json::to_string(passes).expect("passes encode");
        self.prepare_cached(
            "INSERT INTO reflexr_key_passes (action, key, pass) \
             SELECT ?1, json_extract(value, '$[0]'), json_extract(value, '$[1]') \
             FROM json_each(?2) WHERE true \
             ON CONFLICT (action, key) DO UPDATE SET pass = excluded.pass",
        )?
        .execute(params![action, passes])?;
        self.prepare_cached("DELETE FROM reflexr_key_passes WHERE action = ?1 AND pass <= ?2")?
            .execute(params![action, clock])?;
        Ok(())
    }

    fn key_counts(&self, action: &str) -> Result<Vec<(String, String, i64)>> {
        let mut stmt = self.prepare_cached(&format!(
            "SELECT flow_key, state, count(*) FROM ({UNFINISHED}) \
             WHERE action = ?1 AND flow_key IS NOT NULL \
             GROUP BY flow_key, state ORDER BY flow_key, state",
        ))?;
        let rows = stmt
            .query_map([action], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
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

    fn claim_fresh(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        id: &str,
    ) -> Result<Option<RunRow>> {
        super::runs::claim_fresh(self, holder, now, expires_at, id)
    }

    fn limited(&self, actions: &[String]) -> Result<Vec<ActionRow>> {
        if let [action] = actions {
            return limited_one(self, action);
        }
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
        full: &[String],
        after: (i64, i64),
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>> {
        let full = serde_json::to_string(full).expect("keys encode");
        super::runs::candidates(self, action, now, priority, &full, after, limit)
    }

    fn claim_ords(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        ords: &[i64],
    ) -> Result<Vec<RunRow>> {
        if let [ord] = ords {
            let claimed = super::runs::claim_ord(self, holder, now, expires_at, *ord)?;
            return Ok(claimed.into_iter().collect());
        }
        let ords = serde_json::to_string(ords).expect("ords encode");
        super::runs::claim_ords(self, holder, now, expires_at, &ords)
    }

    /// How many runs of `action` run now, by key when `keyed` (one group,
    /// `""`, else).
    fn running_by(&self, action: &str, keyed: bool) -> Result<Vec<(String, i64)>> {
        let conn = self;
        if !keyed {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM reflexr_runs INDEXED BY reflexr_runs_running \
                     WHERE state = 'running' AND action = ?1",
                )?
                .query_row([action], |r| r.get(0))?;
            return Ok(vec![(String::new(), n)]);
        }
        let mut stmt = conn.prepare_cached(
            "SELECT coalesce(flow_key, ''), count(*) FROM reflexr_runs \
             INDEXED BY reflexr_runs_running WHERE state = 'running' AND action = ?1 GROUP BY 1",
        )?;
        let rows = stmt
            .query_map(params![action], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Starts of `action` in the window after `since`, by key.
    fn starts_since(&self, action: &str, since: i64, forget: i64) -> Result<Vec<(String, i64)>> {
        let conn = self;
        conn.prepare_cached("DELETE FROM reflexr_starts WHERE action = ?1 AND at <= ?2")?
            .execute(params![action, forget])?;
        let mut stmt = conn.prepare_cached(
            "SELECT part, sum(n) FROM reflexr_starts WHERE action = ?1 AND at > ?2 GROUP BY part",
        )?;
        let rows = stmt
            .query_map(params![action, since], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn key_starts_since(&self, action: &str, key: &str, since: i64) -> Result<i64> {
        Ok(self
            .prepare_cached(
                "SELECT coalesce(sum(n), 0) FROM reflexr_starts \
                 WHERE action = ?1 AND part = ?2 AND at > ?3",
            )?
            .query_row(params![action, key, since], |r| r.get(0))?)
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
                "SELECT EXISTS (SELECT 1 FROM reflexr_runs INDEXED BY reflexr_runs_running \
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
                     AND reflexr_starts.at > ?1 - a.rate_period_ms) \
                 AND NOT EXISTS (SELECT 1 FROM reflexr_action_keys k \
                   WHERE k.action = reflexr_starts.action AND k.rate_count IS NOT NULL \
                     AND reflexr_starts.at > ?1 - k.rate_period_ms)",
            )?
            .execute([now])?;
        Ok(periods + starts)
    }
}
