//! The control tables: what is paused (`reflexr_paused`) and each action's
//! settings (`reflexr_actions`). Rate-limit starts and uniqueness periods
//! live with the runs (`runs.rs`).

use std::collections::HashSet;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

/// Pauses `(kind, name)`; false when it was paused already.
pub(crate) fn pause(
    conn: &Connection,
    kind: &str,
    name: &str,
    now: i64,
    operator: &str,
    reason: &str,
) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "INSERT INTO reflexr_paused (kind, name, since, operator, reason) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (kind, name) DO NOTHING",
        )?
        .execute(params![kind, name, now, operator, reason])?
        == 1)
}

/// Resumes `(kind, name)`; false when it was not paused.
pub(crate) fn resume(conn: &Connection, kind: &str, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("DELETE FROM reflexr_paused WHERE kind = ?1 AND name = ?2")?
        .execute(params![kind, name])?
        == 1)
}

/// A pause as stored: kind, name, since, operator, reason.
pub type PausedRow = (String, String, i64, String, String);

/// Everything paused, by kind and name.
pub(crate) fn paused(conn: &Connection) -> Result<Vec<PausedRow>> {
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

/// The names of this kind that are paused.
pub(crate) fn paused_names(conn: &Connection, kind: &str) -> Result<HashSet<String>> {
    let mut stmt = conn.prepare_cached("SELECT name FROM reflexr_paused WHERE kind = ?1")?;
    let rows = stmt
        .query_map([kind], |r| r.get(0))?
        .collect::<rusqlite::Result<HashSet<String>>>()?;
    Ok(rows)
}

/// Whether `(kind, name)` is paused.
pub(crate) fn is_paused(conn: &Connection, kind: &str, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM reflexr_paused WHERE kind = ?1 AND name = ?2")?
        .query_row(params![kind, name], |_| Ok(()))
        .optional()?
        .is_some())
}

/// An action's settings as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRow {
    pub action: String,
    pub priority: i64,
    pub max_running: Option<u32>,
    pub rate_count: Option<u32>,
    pub rate_period_ms: Option<i64>,
    pub partition_by: Option<String>,
}

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

/// Sets an action's settings, replacing what it had.
pub(crate) fn configure(conn: &Connection, a: &ActionRow, now: i64) -> Result<()> {
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
pub(crate) fn actions(conn: &Connection) -> Result<Vec<ActionRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ACTION_COLUMNS} FROM reflexr_actions ORDER BY action"
    ))?;
    let rows = stmt
        .query_map([], action_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
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
