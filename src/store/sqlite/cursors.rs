//! Statements on `reflexr_cursors`.

use rusqlite::{Connection, OptionalExtension, params};

use crate::base::error::Result;

use crate::store::Cursors;
use crate::store::cursors;
use crate::store::cursors::*;

/// Moves the cursor to `position` if that is not behind where it is. Returns
/// `Err(current)` when it would have moved backwards (nothing is written).
/// A move clears the failures recorded at the old position.
///
/// A cursor that exists moves by [`ADVANCE`], an update: an insert (the
/// upsert below, for a cursor's first move) checks the row's `kind`
/// against its list of four, which SQLite does with a temporary b-tree
/// every time, and an upsert checks it even when it ends as an update —
/// that check was half of what moving a rule's cursor cost.
pub(crate) fn advance(
    conn: &Connection,
    workspace: &str,
    kind: &str,
    name: &str,
    position: i64,
    now: i64,
) -> Result<std::result::Result<(), i64>> {
    let args = params![workspace, kind, name, position, now];
    if conn.prepare_cached(ADVANCE)?.execute(args)? == 1 {
        return Ok(Ok(()));
    }
    let n = conn
        .prepare_cached(
            "INSERT INTO reflexr_cursors (workspace, kind, name, position, updated_at, high_water) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?4) \
             ON CONFLICT (workspace, kind, name) DO UPDATE \
             SET position = excluded.position, \
                 updated_at = max(excluded.updated_at, reflexr_cursors.updated_at + 1), \
                 high_water = max(reflexr_cursors.high_water, excluded.position), \
                 failures = iif(excluded.position > reflexr_cursors.position, 0, \
                                reflexr_cursors.failures), \
                 last_error = iif(excluded.position > reflexr_cursors.position, NULL, \
                                  reflexr_cursors.last_error) \
             WHERE excluded.position >= reflexr_cursors.position",
        )?
        .execute(args)?;
    if n == 1 {
        return Ok(Ok(()));
    }
    let current = Cursors::get(conn, workspace, kind, name)?.unwrap_or(0);
    Ok(Err(current))
}

/// [`advance`] of a cursor that exists: what the upsert's update does, as
/// an update (`?1`–`?3` the cursor, `?4` the position, `?5` now).
pub(crate) const ADVANCE: &str = "UPDATE reflexr_cursors \
     SET position = ?4, updated_at = max(?5, updated_at + 1), \
         high_water = max(high_water, ?4), \
         failures = iif(?4 > position, 0, failures), \
         last_error = iif(?4 > position, NULL, last_error) \
     WHERE workspace = ?1 AND kind = ?2 AND name = ?3 AND ?4 >= position";

/// Every cursor, with the number of its workspace's events after it.
pub(crate) fn list(conn: &Connection) -> Result<Vec<Listed>> {
    let mut stmt = conn.prepare_cached(
        "SELECT c.workspace, c.kind, c.name, c.position, \
                (SELECT count(*) FROM reflexr_events e \
                  WHERE e.workspace = c.workspace AND e.seq > c.position), \
                c.updated_at, c.failures, c.last_error \
         FROM reflexr_cursors c ORDER BY c.workspace, c.kind, c.name",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok(Listed {
                workspace: r.get(0)?,
                kind: r.get(1)?,
                name: r.get(2)?,
                position: r.get(3)?,
                lag: r.get(4)?,
                updated_at: r.get(5)?,
                failures: r.get(6)?,
                last_error: r.get(7)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

impl Cursors for Connection {
    /// The cursor's position, if it was ever saved.
    fn get(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<i64>> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT position FROM reflexr_cursors WHERE workspace = ?1 AND kind = ?2 AND name = ?3",
            )?
            .query_row(params![workspace, kind, name], |r| r.get(0))
            .optional()?)
    }

    fn advance(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<std::result::Result<(), i64>> {
        advance(self, workspace, kind, name, position, now)
    }

    fn list(&self) -> Result<Vec<cursors::Listed>> {
        list(self)
    }

    /// The lowest position of any cursor on the workspace (None: it has none).
    fn min_position(&self, workspace: &str) -> Result<Option<i64>> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT min(position) FROM reflexr_cursors WHERE workspace = ?1")?
            .query_row([workspace], |r| r.get(0))?)
    }

    /// Sets the cursor to `position`, forwards or backwards (an operator's reset),
    /// and returns where it was. Its stamp moves past any value read before.
    fn set(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<Option<i64>> {
        let conn = self;
        let before = Cursors::get(conn, workspace, kind, name)?;
        conn.prepare_cached(
            "INSERT INTO reflexr_cursors (workspace, kind, name, position, updated_at, high_water) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?4) \
             ON CONFLICT (workspace, kind, name) DO UPDATE \
             SET position = excluded.position, \
                 updated_at = max(excluded.updated_at, reflexr_cursors.updated_at + 1), \
                 high_water = max(reflexr_cursors.high_water, excluded.position), \
                 failures = 0, last_error = NULL",
        )?
        .execute(params![workspace, kind, name, position, now])?;
        Ok(before)
    }

    /// The cursor's position and the stamp of its last change (`updated_at`):
    /// together they tell whether anything moved the cursor, or reset what it
    /// stands for, since they were read.
    fn get_stamped(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<(i64, i64)>> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT position, updated_at FROM reflexr_cursors \
                 WHERE workspace = ?1 AND kind = ?2 AND name = ?3",
            )?
            .query_row(params![workspace, kind, name], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?)
    }

    /// Marks the cursor changed without moving it (an operator reset the state
    /// its consumer keeps): its stamp moves past any value read before.
    fn touch(&self, workspace: &str, kind: &str, name: &str, now: i64) -> Result<()> {
        let conn = self;
        conn.prepare_cached(
            "UPDATE reflexr_cursors SET updated_at = max(?4, updated_at + 1) \
             WHERE workspace = ?1 AND kind = ?2 AND name = ?3",
        )?
        .execute(params![workspace, kind, name, now])?;
        Ok(())
    }

    /// One statement instead of two.
    fn stamped_and_high_water(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
    ) -> Result<(Option<(i64, i64)>, i64)> {
        Ok(self
            .prepare_cached(
                "SELECT position, updated_at, high_water FROM reflexr_cursors \
                 WHERE workspace = ?1 AND kind = ?2 AND name = ?3",
            )?
            .query_row(params![workspace, kind, name], |r| {
                Ok((Some((r.get(0)?, r.get(1)?)), r.get(2)?))
            })
            .optional()?
            .unwrap_or((None, 0)))
    }

    /// The furthest the cursor has ever been (its position, unless an operator
    /// moved it back since): below it, a rule is replaying.
    fn high_water(&self, workspace: &str, kind: &str, name: &str) -> Result<i64> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT high_water FROM reflexr_cursors \
                 WHERE workspace = ?1 AND kind = ?2 AND name = ?3",
            )?
            .query_row(params![workspace, kind, name], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    fn delete(&self, workspace: &str, kind: &str, name: &str) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "DELETE FROM reflexr_cursors WHERE workspace = ?1 AND kind = ?2 AND name = ?3",
            )?
            .execute(params![workspace, kind, name])?
            == 1)
    }

    /// Records that the consumer's commit failed while its cursor stood at
    /// `position` (nothing happens if it has moved since). A consumer with
    /// [`STUCK_AFTER_FAILURES`](crate::limits::STUCK_AFTER_FAILURES) failures at one
    /// position shows in `reflexr_stuck_consumers`. Returns the failures so far.
    fn record_failure(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_cursors SET failures = failures + 1, last_error = ?5, failed_at = ?6 \
                 WHERE workspace = ?1 AND kind = ?2 AND name = ?3 AND position = ?4 \
                 RETURNING failures",
            )?
            .query_row(
                params![
                    workspace,
                    kind,
                    name,
                    position,
                    crate::base::limits::clip_error(error),
                    now
                ],
                |r| r.get(0),
            )
            .optional()?)
    }
}
