//! Statements on `reflexr_counters`.

use rusqlite::{Connection, params};

use crate::base::counter::Counter;
use crate::base::error::Result;

use crate::store::Counters;

impl Counters for Connection {
    /// Adds `by` to the counter `name` (created at 0), in the caller's
    /// transaction. Does nothing for 0.
    fn bump(&self, name: Counter, by: usize) -> Result<()> {
        let conn = self;
        if by == 0 {
            return Ok(());
        }
        conn.prepare_cached(
            "INSERT INTO reflexr_counters (name, value) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        )?
        .execute(params![name.as_str(), by as i64])?;
        Ok(())
    }

    /// Every counter this version knows (another version's are left out).
    fn all(&self) -> Result<Vec<(Counter, i64)>> {
        let conn = self;
        let mut stmt =
            conn.prepare_cached("SELECT name, value FROM reflexr_counters ORDER BY name")?;
        let rows: Vec<(String, i64)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows
            .into_iter()
            .filter_map(|(name, v)| Some((name.parse().ok()?, v)))
            .collect())
    }
}
