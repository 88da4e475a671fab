//! `reflexr_counters`, the totals every process reads the same.
//!
//! The table group every backend implements (`store::sqlite::counters`,
//! `store::postgres::counters`), and the rows it speaks in.

use crate::base::counter::Counter;
use crate::base::error::Result;

/// `reflexr_counters`, the totals every process reads the same.
pub trait Counters {
    /// Adds `by` to `name` in the caller's transaction (nothing for 0).
    fn bump(&self, name: Counter, by: usize) -> Result<()>;
    /// [`Counters::bump`] of each, where a backend may take them in one
    /// statement (PostgreSQL: one round trip).
    fn bump_all(&self, bumps: &[(Counter, usize)]) -> Result<()> {
        for (name, by) in bumps {
            self.bump(*name, *by)?;
        }
        Ok(())
    }
    /// Every counter this version knows.
    fn all(&self) -> Result<Vec<(Counter, i64)>>;
}
