//! What operators look for: bounded pages of events, runs and dead letters by filter, and feeds of what changed.
//!
//! The table group every backend implements (`store::sqlite::inspect`,
//! `store::postgres::inspect`), and the rows it speaks in.

use crate::base::dead_letter::DeadLetter;
use crate::base::error::Result;
use crate::base::event::Event;
use crate::store::runs::{FeedPos, RunRow};
use crate::store::{dead_letters, runs};

/// Which runs to find (`find_runs`), as every backend takes it:
/// each field set must match; newest first, among the `window` positions
/// below `before`.
pub struct RunFind<'a> {
    pub state: Option<&'a str>,
    pub action: Option<&'a str>,
    pub rule: Option<&'a str>,
    pub workspace: Option<&'a str>,
    pub scope: Option<&'a str>,
    /// A JSON path of the input and the value it must hold.
    pub input: Option<(&'a str, &'a serde_json::Value)>,
    pub before: i64,
    pub limit: usize,
    pub window: i64,
}

/// What operators look for (`inspect`): bounded pages of events, runs and
/// dead letters by filter, and feeds of what changed.
pub trait Inspect {
    /// Events of the workspace after `after` matching `types` (all when
    /// empty) and `subject`, at most `limit`, among at most `window` events;
    /// and the seq to go on after (None: the end of the log).
    #[allow(clippy::too_many_arguments)]
    fn scan_events(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: Option<&str>,
        limit: usize,
        window: usize,
    ) -> Result<(Vec<Event>, Option<i64>)>;
    /// Events (of any workspace) whose id starts with `prefix`, in seq order.
    fn events_with_id_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<Event>>;
    /// One past the newest run's position.
    fn runs_end(&self) -> Result<i64>;
    /// Runs matching `f`, newest first, and the position to go on below.
    fn find_runs(&self, f: &RunFind<'_>) -> Result<(Vec<RunRow>, Option<i64>)>;
    /// Runs changed after `(updated_at, position)`, in the order they changed.
    fn runs_changed_after(&self, after: (i64, i64), limit: usize) -> Result<Vec<RunRow>>;
    /// Runs changed since `pos`, at most `limit`, in the order their
    /// changes became visible; moves `pos` past them. A run changed twice
    /// before it is read comes once, as it is now.
    ///
    /// By default by change time, paging through
    /// [`Inspect::runs_changed_after`]: right where changes commit in the
    /// order they were stamped (SQLite's one writer). PostgreSQL's
    /// transactions do not, and it follows transactions instead.
    fn runs_feed(&self, pos: &mut FeedPos, limit: usize) -> Result<Vec<RunRow>> {
        runs::feed_by_change_time(self, pos, limit)
    }
    /// The blocked lanes, most recently blocked first.
    fn blocked_lanes(&self, limit: usize) -> Result<Vec<runs::BlockedRow>>;
    /// One past the newest dead letter's id.
    fn dead_letters_end(&self) -> Result<i64>;
    /// Dead letters matching `f`, newest first, and the id to go on below.
    fn find_dead_letters(
        &self,
        f: &dead_letters::Find<'_>,
    ) -> Result<(Vec<DeadLetter>, Option<i64>)>;
}
