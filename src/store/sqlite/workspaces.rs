//! Statements on `reflexr_workspaces` and `reflexr_event_types`.

use rusqlite::{Connection, OptionalExtension, params};

use crate::base::error::Result;

use crate::store::Workspaces;

impl Workspaces for Connection {
    /// Inserts the workspace; false when it existed already.
    fn insert(&self, name: &str, now: i64) -> Result<bool> {
        let conn = self;
        let n = conn
            .prepare_cached(
                "INSERT INTO reflexr_workspaces (name, created_at) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO NOTHING",
            )?
            .execute(params![name, now])?;
        Ok(n == 1)
    }

    fn exists(&self, name: &str) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT 1 FROM reflexr_workspaces WHERE name = ?1")?
            .query_row([name], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// Registers `event_type` for the workspace; false when it was registered
    /// already.
    fn register_type(
        &self,
        workspace: &str,
        event_type: &str,
        reserved: bool,
        now: i64,
    ) -> Result<bool> {
        let conn = self;
        let n = conn
            .prepare_cached(
                "INSERT INTO reflexr_event_types (workspace, type, reserved, registered_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (workspace, type) DO NOTHING",
            )?
            .execute(params![workspace, event_type, reserved, now])?;
        Ok(n == 1)
    }

    /// Every workspace with its creation time, by name.
    fn list(&self) -> Result<Vec<(String, i64)>> {
        let conn = self;
        let mut stmt =
            conn.prepare_cached("SELECT name, created_at FROM reflexr_workspaces ORDER BY name")?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// The types an application may append to the workspace (the reserved ones
    /// left out), by name.
    fn app_types(&self, workspace: &str) -> Result<Vec<String>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(
            "SELECT type FROM reflexr_event_types WHERE workspace = ?1 AND reserved = 0 ORDER BY type",
        )?;
        let rows = stmt
            .query_map([workspace], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }
}
