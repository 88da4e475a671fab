//! Statements on `reflexr_followers`, the followers' ledger.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerRow {
    pub name: String,
    pub source: String,
    pub target: String,
    pub target_file: Option<String>,
    pub projection: String,
    pub published: i64,
    pub dead_letters: i64,
    pub stops: i64,
    pub last_error: Option<String>,
    pub stopped_at: Option<i64>,
    pub restart_requests: i64,
    /// The registered PostgreSQL target's name (feature `postgres`).
    pub target_postgres: Option<String>,
}

const COLUMNS: &str = "name, source, target, target_file, projection, published, dead_letters, \
                       stops, last_error, stopped_at, restart_requests, target_postgres";

fn from_row(r: &Row<'_>) -> rusqlite::Result<FollowerRow> {
    Ok(FollowerRow {
        name: r.get(0)?,
        source: r.get(1)?,
        target: r.get(2)?,
        target_file: r.get(3)?,
        projection: r.get(4)?,
        published: r.get(5)?,
        dead_letters: r.get(6)?,
        stops: r.get(7)?,
        last_error: r.get(8)?,
        stopped_at: r.get(9)?,
        restart_requests: r.get(10)?,
        target_postgres: r.get(11)?,
    })
}

pub(crate) fn get(conn: &Connection, name: &str) -> Result<Option<FollowerRow>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_followers WHERE name = ?1"
        ))?
        .query_row([name], from_row)
        .optional()?)
}

pub(crate) fn list(conn: &Connection) -> Result<Vec<FollowerRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_followers ORDER BY name"
    ))?;
    let rows = stmt
        .query_map([], from_row)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// Where a follower publishes: the target workspace, in this file, another
/// file, or a registered PostgreSQL target.
pub struct Target<'a> {
    pub workspace: &'a str,
    pub file: Option<&'a str>,
    pub postgres: Option<&'a str>,
}

/// Creates the follower's row, or updates its target and projection.
pub(crate) fn upsert(
    conn: &Connection,
    name: &str,
    source: &str,
    target: &Target<'_>,
    projection: &str,
    now: i64,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO reflexr_followers \
           (name, source, target, target_file, target_postgres, projection, created_at, \
            updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
         ON CONFLICT (name) DO UPDATE SET source = excluded.source, target = excluded.target, \
           target_file = excluded.target_file, target_postgres = excluded.target_postgres, \
           projection = excluded.projection, updated_at = excluded.updated_at",
    )?
    .execute(params![
        name,
        source,
        target.workspace,
        target.file,
        target.postgres,
        projection,
        now
    ])?;
    Ok(())
}

pub(crate) fn delete(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("DELETE FROM reflexr_followers WHERE name = ?1")?
        .execute([name])?
        == 1)
}

/// Adds to the counters of a batch.
pub(crate) fn count(
    conn: &Connection,
    name: &str,
    published: i64,
    dead_letters: i64,
    now: i64,
) -> Result<()> {
    conn.prepare_cached(
        "UPDATE reflexr_followers SET published = published + ?2, \
           dead_letters = dead_letters + ?3, updated_at = ?4 WHERE name = ?1",
    )?
    .execute(params![name, published, dead_letters, now])?;
    Ok(())
}

/// Records a stop.
pub(crate) fn stopped(conn: &Connection, name: &str, error: &str, now: i64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE reflexr_followers SET stops = stops + 1, last_error = ?2, stopped_at = ?3, \
           updated_at = ?3 WHERE name = ?1",
    )?
    .execute(params![name, crate::base::limits::clip_error(error), now])?;
    Ok(())
}

/// Records an operator's request that the follower, if stopped, start again
/// at its cursor; false when there is no such follower.
pub(crate) fn request_restart(conn: &Connection, name: &str, now: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "UPDATE reflexr_followers SET restart_requests = restart_requests + 1, \
               updated_at = ?2 WHERE name = ?1",
        )?
        .execute(params![name, now])?
        == 1)
}
