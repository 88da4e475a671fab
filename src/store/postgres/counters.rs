//! PostgreSQL: counters: the sum of a counter's rows (the seam's `store::counters`).

use postgres::types::Type;

use super::{PgConn, col};
use crate::base::counter::Counter;
use crate::base::error::Result;
use crate::store::Counters;

/// One bump in this many folds its counter's rows into one.
const FOLD_EVERY: u32 = 256;

/// The advisory lock a fold holds ("rfxc" in ASCII), so folds never wait
/// for each other.
const FOLD_LOCK: i64 = 0x7266_7863;

impl Counters for PgConn {
    fn bump(&self, name: Counter, by: usize) -> Result<()> {
        if by == 0 {
            return Ok(());
        }
        let name = name.as_str();
        let by = i64::try_from(by).unwrap_or(i64::MAX);
        self.query(
            "INSERT INTO reflexr_counters (name, value) VALUES ($1, $2)",
            &[(&name, Type::TEXT), (&by, Type::INT8)],
        )?;
        if fastrand::u32(..FOLD_EVERY) == 0 {
            self.fold_counter(name)?;
        }
        Ok(())
    }

    fn bump_all(&self, bumps: &[(Counter, usize)]) -> Result<()> {
        let nonzero: Vec<(Counter, usize)> =
            bumps.iter().copied().filter(|(_, by)| *by > 0).collect();
        match nonzero[..] {
            [] => return Ok(()),
            [(name, by)] => return self.bump(name, by),
            _ => {}
        }
        let names: Vec<&str> = nonzero.iter().map(|(name, _)| name.as_str()).collect();
        let values: Vec<i64> = nonzero
            .iter()
            .map(|(_, by)| i64::try_from(*by).unwrap_or(i64::MAX))
            .collect();
        self.query(
            "INSERT INTO reflexr_counters (name, value) \
             SELECT * FROM unnest($1::text[], $2::int8[])",
            &[(&names, Type::TEXT_ARRAY), (&values, Type::INT8_ARRAY)],
        )?;
        for name in names {
            if fastrand::u32(..FOLD_EVERY) == 0 {
                self.fold_counter(name)?;
            }
        }
        Ok(())
    }

    fn all(&self) -> Result<Vec<(Counter, i64)>> {
        let rows = self.query(
            "SELECT name, sum(value)::bigint FROM reflexr_counters GROUP BY name ORDER BY name",
            &[],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = col(r, 0)?;
            // Another version's counters are left out.
            if let Ok(counter) = name.parse() {
                out.push((counter, col(r, 1)?));
            }
        }
        Ok(out)
    }
}

impl PgConn {
    /// Folds a counter's rows into one, if no other transaction is folding
    /// one (a try-lock: a bump never waits). The rows deleted are those
    /// committed when the statement began; bumps made meanwhile stay beside
    /// the sum, so nothing is counted twice or lost.
    fn fold_counter(&self, name: &str) -> Result<()> {
        self.query(
            "WITH mine AS (SELECT pg_try_advisory_xact_lock($2) AS locked), \
                  gone AS (DELETE FROM reflexr_counters \
                           WHERE name = $1 AND (SELECT locked FROM mine) RETURNING value) \
             INSERT INTO reflexr_counters (name, value) \
             SELECT $1, sum(value)::bigint FROM gone HAVING count(*) > 0",
            &[(&name, Type::TEXT), (&FOLD_LOCK, Type::INT8)],
        )?;
        Ok(())
    }
}
