//! The followers' ledger on PostgreSQL, as `store::followers` has it on
//! SQLite: followers that read a workspace of this database.

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Followers;
use crate::store::followers::{FollowerRow, Target};

const COLUMNS: &str = "name, source, target, target_file, projection, published, dead_letters, \
                       stops, last_error, stopped_at, restart_requests, target_postgres";

fn follower_from(r: &Row) -> Result<FollowerRow> {
    Ok(FollowerRow {
        name: col(r, 0)?,
        source: col(r, 1)?,
        target: col(r, 2)?,
        target_file: col(r, 3)?,
        projection: col(r, 4)?,
        published: col(r, 5)?,
        dead_letters: col(r, 6)?,
        stops: col(r, 7)?,
        last_error: col(r, 8)?,
        stopped_at: col(r, 9)?,
        restart_requests: col(r, 10)?,
        target_postgres: col(r, 11)?,
    })
}

impl Followers for PgConn {
    fn follower(&self, name: &str) -> Result<Option<FollowerRow>> {
        self.query_opt(
            &format!("SELECT {COLUMNS} FROM reflexr_followers WHERE name = $1"),
            &[(&name, Type::TEXT)],
        )?
        .as_ref()
        .map(follower_from)
        .transpose()
    }

    fn follower_rows(&self) -> Result<Vec<FollowerRow>> {
        self.query(
            &format!("SELECT {COLUMNS} FROM reflexr_followers ORDER BY name"),
            &[],
        )?
        .iter()
        .map(follower_from)
        .collect()
    }

    fn upsert_follower(
        &self,
        name: &str,
        source: &str,
        target: &Target<'_>,
        projection: &str,
        now: i64,
    ) -> Result<()> {
        self.query(
            "INSERT INTO reflexr_followers \
               (name, source, target, target_file, target_postgres, projection, created_at, \
                updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
             ON CONFLICT (name) DO UPDATE SET source = excluded.source, \
               target = excluded.target, target_file = excluded.target_file, \
               target_postgres = excluded.target_postgres, projection = excluded.projection, \
               updated_at = excluded.updated_at",
            &[
                (&name, Type::TEXT),
                (&source, Type::TEXT),
                (&target.workspace, Type::TEXT),
                (&target.file, Type::TEXT),
                (&target.postgres, Type::TEXT),
                (&projection, Type::TEXT),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn delete_follower(&self, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "DELETE FROM reflexr_followers WHERE name = $1 RETURNING 1",
                &[(&name, Type::TEXT)],
            )?
            .is_some())
    }

    fn count_follower(
        &self,
        name: &str,
        published: i64,
        dead_letters: i64,
        now: i64,
    ) -> Result<()> {
        self.query(
            "UPDATE reflexr_followers SET published = published + $2, \
               dead_letters = dead_letters + $3, updated_at = $4 WHERE name = $1",
            &[
                (&name, Type::TEXT),
                (&published, Type::INT8),
                (&dead_letters, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn follower_stopped(&self, name: &str, error: &str, now: i64) -> Result<()> {
        let error = crate::base::limits::clip_error(error);
        self.query(
            "UPDATE reflexr_followers SET stops = stops + 1, last_error = $2, stopped_at = $3, \
               updated_at = $3 WHERE name = $1",
            &[
                (&name, Type::TEXT),
                (&error, Type::TEXT),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn request_restart(&self, name: &str, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_followers SET restart_requests = restart_requests + 1, \
                   updated_at = $2 WHERE name = $1 RETURNING 1",
                &[(&name, Type::TEXT), (&now, Type::INT8)],
            )?
            .is_some())
    }
}
