//! `reflexr_schedules`: the scheduled jobs, and when each is next due.
//!
//! The table group every backend implements (`store::sqlite::schedules`,
//! `store::postgres::schedules`), and the rows it speaks in.

use crate::base::error::Result;

/// A schedule's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRow {
    pub name: String,
    pub spec: String,
    pub guarantee: String,
    pub missed: String,
    pub next_due_at: Option<i64>,
    pub last_due_at: Option<i64>,
    pub updated_at: i64,
}

/// `reflexr_schedules`: the scheduled jobs a database knows, and when each
/// is next due.
pub trait Schedules {
    fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>>;
    fn schedule_rows(&self) -> Result<Vec<ScheduleRow>>;
    /// Writes the schedule as registered; `next_due_at` as given.
    fn upsert_schedule(&self, row: &ScheduleRow) -> Result<()>;
    /// Moves a schedule on from the occurrence due at `expected_next`
    /// (only if nobody moved it first); false if it had moved.
    #[allow(clippy::too_many_arguments)]
    fn advance_schedule(
        &self,
        name: &str,
        expected_next: i64,
        next: Option<i64>,
        last: Option<i64>,
        now: i64,
    ) -> Result<bool>;
}
