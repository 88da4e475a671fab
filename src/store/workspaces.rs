//! Statements on `reflexr_workspaces` and `reflexr_event_types`.

use rusqlite::{Connection, OptionalExtension, params};

use crate::base::error::Result;

/// Inserts the workspace; false when it existed already.
pub(crate) fn insert(conn: &Connection, name: &str, now: i64) -> Result<bool> {
    let n = conn
        .prepare_cached(
            "INSERT INTO reflexr_workspaces (name, created_at) VALUES (?1, ?2) \
             ON CONFLICT (name) DO NOTHING",
        )?
        .execute(params![name, now])?;
    Ok(n == 1)
}

pub(crate) fn exists(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM reflexr_workspaces WHERE name = ?1")?
        .query_row([name], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Registers `event_type` for the workspace; false when it was registered
/// already.
pub(crate) fn register_type(
    conn: &Connection,
    workspace: &str,
    event_type: &str,
    reserved: bool,
    now: i64,
) -> Result<bool> {
    let n = conn
        .prepare_cached(
            "INSERT INTO reflexr_event_types (workspace, type, reserved, registered_at) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (workspace, type) DO NOTHING",
        )?
        .execute(params![workspace, event_type, reserved, now])?;
    Ok(n == 1)
}

/// Every workspace with its creation time, by name.
pub(crate) fn list(conn: &Connection) -> Result<Vec<(String, i64)>> {
    let mut stmt =
        conn.prepare_cached("SELECT name, created_at FROM reflexr_workspaces ORDER BY name")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// The types an application may append to the workspace (the reserved ones
/// left out), by name.
pub(crate) fn app_types(conn: &Connection, workspace: &str) -> Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT type FROM reflexr_event_types WHERE workspace = ?1 AND reserved = 0 ORDER BY type",
    )?;
    let rows = stmt
        .query_map([workspace], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}
