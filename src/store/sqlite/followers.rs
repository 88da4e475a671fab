//! Statements on `reflexr_followers`, the followers' ledger.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

use crate::store::Followers;
use crate::store::followers;
use crate::store::followers::*;

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

impl Followers for Connection {
    fn follower(&self, name: &str) -> Result<Option<FollowerRow>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM reflexr_followers WHERE name = ?1"
            ))?
            .query_row([name], from_row)
            .optional()?)
    }

    fn follower_rows(&self) -> Result<Vec<FollowerRow>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_followers ORDER BY name"
        ))?;
        let rows = stmt
            .query_map([], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn upsert_follower(
        &self,
        name: &str,
        source: &str,
        target: &followers::Target<'_>,
        projection: &str,
        now: i64,
    ) -> Result<()> {
        upsert(self, name, source, target, projection, now)
    }

    fn delete_follower(&self, name: &str) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached("DELETE FROM reflexr_followers WHERE name = ?1")?
            .execute([name])?
            == 1)
    }

    fn count_follower(
        &self,
        name: &str,
        published: i64,
        dead_letters: i64,
        now: i64,
    ) -> Result<()> {
        count(self, name, published, dead_letters, now)
    }

    /// Records a stop.
    fn follower_stopped(&self, name: &str, error: &str, now: i64) -> Result<()> {
        let conn = self;
        conn.prepare_cached(
            "UPDATE reflexr_followers SET stops = stops + 1, last_error = ?2, stopped_at = ?3, \
               updated_at = ?3 WHERE name = ?1",
        )?
        .execute(params![name, crate::base::limits::clip_error(error), now])?;
        Ok(())
    }

    /// Records an operator's request that the follower, if stopped, start again
    /// at its cursor; false when there is no such follower.
    fn request_restart(&self, name: &str, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_followers SET restart_requests = restart_requests + 1, \
                   updated_at = ?2 WHERE name = ?1",
            )?
            .execute(params![name, now])?
            == 1)
    }
}
