//! PostgreSQL: cursors (the seam's `store::cursors`).

use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Cursors;

impl Cursors for PgConn {
    fn get(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<i64>> {
        self.query_opt(
            "SELECT position FROM reflexr_cursors \
             WHERE workspace = $1 AND kind = $2 AND name = $3",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
            ],
        )?
        .map(|r| col(&r, 0))
        .transpose()
    }

    fn advance(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<std::result::Result<(), i64>> {
        let moved = self.query_opt(
            "INSERT INTO reflexr_cursors (workspace, kind, name, position, updated_at, high_water) \
             VALUES ($1, $2, $3, $4, $5, $4) \
             ON CONFLICT (workspace, kind, name) DO UPDATE \
             SET position = excluded.position, \
                 updated_at = greatest(excluded.updated_at, reflexr_cursors.updated_at + 1), \
                 high_water = greatest(reflexr_cursors.high_water, excluded.position), \
                 failures = CASE WHEN excluded.position > reflexr_cursors.position THEN 0 \
                            ELSE reflexr_cursors.failures END, \
                 last_error = CASE WHEN excluded.position > reflexr_cursors.position THEN NULL \
                              ELSE reflexr_cursors.last_error END \
             WHERE excluded.position >= reflexr_cursors.position \
             RETURNING 1",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&position, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        if moved.is_some() {
            return Ok(Ok(()));
        }
        let current = Cursors::get(self, workspace, kind, name)?.unwrap_or(0);
        Ok(Err(current))
    }

    fn set(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<Option<i64>> {
        let before = Cursors::get(self, workspace, kind, name)?;
        self.query(
            "INSERT INTO reflexr_cursors (workspace, kind, name, position, updated_at, high_water) \
             VALUES ($1, $2, $3, $4, $5, $4) \
             ON CONFLICT (workspace, kind, name) DO UPDATE \
             SET position = excluded.position, \
                 updated_at = greatest(excluded.updated_at, reflexr_cursors.updated_at + 1), \
                 high_water = greatest(reflexr_cursors.high_water, excluded.position), \
                 failures = 0, last_error = NULL",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&position, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(before)
    }

    fn get_stamped(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<(i64, i64)>> {
        self.query_opt(
            "SELECT position, updated_at FROM reflexr_cursors \
             WHERE workspace = $1 AND kind = $2 AND name = $3",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
            ],
        )?
        .map(|r| Ok((col(&r, 0)?, col(&r, 1)?)))
        .transpose()
    }

    fn touch(&self, workspace: &str, kind: &str, name: &str, now: i64) -> Result<()> {
        self.query(
            "UPDATE reflexr_cursors SET updated_at = greatest($4, updated_at + 1) \
             WHERE workspace = $1 AND kind = $2 AND name = $3",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
    }

    /// One round trip instead of two.
    fn stamped_and_high_water(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
    ) -> Result<(Option<(i64, i64)>, i64)> {
        Ok(self
            .query_opt(
                "SELECT position, updated_at, high_water FROM reflexr_cursors \
                 WHERE workspace = $1 AND kind = $2 AND name = $3",
                &[
                    (&workspace, Type::TEXT),
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                ],
            )?
            .map(|r| -> Result<_> { Ok((Some((col(&r, 0)?, col(&r, 1)?)), col(&r, 2)?)) })
            .transpose()?
            .unwrap_or((None, 0)))
    }

    fn high_water(&self, workspace: &str, kind: &str, name: &str) -> Result<i64> {
        Ok(self
            .query_opt(
                "SELECT high_water FROM reflexr_cursors \
                 WHERE workspace = $1 AND kind = $2 AND name = $3",
                &[
                    (&workspace, Type::TEXT),
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                ],
            )?
            .map(|r| col(&r, 0))
            .transpose()?
            .unwrap_or(0))
    }

    fn delete(&self, workspace: &str, kind: &str, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "DELETE FROM reflexr_cursors WHERE workspace = $1 AND kind = $2 AND name = $3 \
                 RETURNING 1",
                &[
                    (&workspace, Type::TEXT),
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn record_failure(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>> {
        let error = crate::base::limits::clip_error(error);
        self.query_opt(
            "UPDATE reflexr_cursors SET failures = failures + 1, last_error = $5, failed_at = $6 \
             WHERE workspace = $1 AND kind = $2 AND name = $3 AND position = $4 \
             RETURNING failures",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&position, Type::INT8),
                (&error, Type::TEXT),
                (&now, Type::INT8),
            ],
        )?
        .map(|r| Ok(i64::from(col::<i32>(&r, 0)?)))
        .transpose()
    }

    fn min_position(&self, workspace: &str) -> Result<Option<i64>> {
        let rows = self.query(
            "SELECT min(position) FROM reflexr_cursors WHERE workspace = $1",
            &[(&workspace, Type::TEXT)],
        )?;
        col(&rows[0], 0)
    }

    fn list(&self) -> Result<Vec<crate::store::cursors::Listed>> {
        self.query(
            "SELECT c.workspace, c.kind, c.name, c.position, \
                    (SELECT count(*) FROM reflexr_events e \
                      WHERE e.workspace = c.workspace AND e.seq > c.position), \
                    c.updated_at, c.failures, c.last_error \
             FROM reflexr_cursors c ORDER BY c.workspace, c.kind, c.name",
            &[],
        )?
        .iter()
        .map(|r| {
            Ok(crate::store::cursors::Listed {
                workspace: col(r, 0)?,
                kind: col(r, 1)?,
                name: col(r, 2)?,
                position: col(r, 3)?,
                lag: col(r, 4)?,
                updated_at: col(r, 5)?,
                failures: i64::from(col::<i32>(r, 6)?),
                last_error: col(r, 7)?,
            })
        })
        .collect()
    }
}
