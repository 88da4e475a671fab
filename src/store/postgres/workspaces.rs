//! PostgreSQL: workspaces and the event types each accepts (the seam's `store::workspaces`).

use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Workspaces;

impl Workspaces for PgConn {
    fn insert(&self, name: &str, now: i64) -> Result<bool> {
        let row = self.query_opt(
            "INSERT INTO reflexr_workspaces (name, created_at) VALUES ($1, $2) \
             ON CONFLICT (name) DO NOTHING RETURNING 1",
            &[(&name, Type::TEXT), (&now, Type::INT8)],
        )?;
        Ok(row.is_some())
    }

    fn exists(&self, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM reflexr_workspaces WHERE name = $1",
                &[(&name, Type::TEXT)],
            )?
            .is_some())
    }

    fn register_type(
        &self,
        workspace: &str,
        event_type: &str,
        reserved: bool,
        now: i64,
    ) -> Result<bool> {
        let row = self.query_opt(
            "INSERT INTO reflexr_event_types (workspace, type, reserved, registered_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (workspace, type) DO NOTHING RETURNING 1",
            &[
                (&workspace, Type::TEXT),
                (&event_type, Type::TEXT),
                (&reserved, Type::BOOL),
                (&now, Type::INT8),
            ],
        )?;
        Ok(row.is_some())
    }

    fn list(&self) -> Result<Vec<(String, i64)>> {
        self.query(
            "SELECT name, created_at FROM reflexr_workspaces ORDER BY name",
            &[],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn app_types(&self, workspace: &str) -> Result<Vec<String>> {
        self.query(
            "SELECT type FROM reflexr_event_types WHERE workspace = $1 AND NOT reserved \
             ORDER BY type",
            &[(&workspace, Type::TEXT)],
        )?
        .iter()
        .map(|r| col(r, 0))
        .collect()
    }
}
