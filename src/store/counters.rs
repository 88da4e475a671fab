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
    /// Every counter this version knows.
    fn all(&self) -> Result<Vec<(Counter, i64)>>;
}
