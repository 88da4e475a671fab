//! Control of the work as the claim reads it: pauses, each action's limits and what counts against them.
//!
//! The table group every backend implements (`store::sqlite::control`,
//! `store::postgres::control`), and the rows it speaks in.

use std::collections::HashSet;

use crate::base::error::Result;
use crate::store::runs::RunRow;

/// A pause as stored: kind, name, since, operator, reason.
pub type PausedRow = (String, String, i64, String, String);

/// An action's settings as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRow {
    pub action: String,
    pub priority: i64,
    pub max_running: Option<u32>,
    pub rate_count: Option<u32>,
    pub rate_period_ms: Option<i64>,
    pub partition_by: Option<String>,
}

/// What a claim reads before it picks runs (see [`Control::claim_plan`]).
#[derive(Debug, Default)]
pub struct ClaimPlan {
    /// The actions paused.
    pub paused: HashSet<String>,
    /// The settings of the claimer's actions that have a limit.
    pub limited: Vec<ActionRow>,
    /// The priorities ready runs have, highest first.
    pub priorities: Vec<i64>,
    /// Whether a claim lapsed at `now`.
    pub lapsed: bool,
}

/// Control of the work as the claim reads it: pauses, each action's
/// limits and what counts against them (`store::control`, `store::runs`).
pub trait Control {
    /// What a claim for `actions` reads first, at `now`: by default one
    /// statement each; a backend a round trip away reads them in one.
    fn claim_plan(&self, now: i64, actions: &[String]) -> Result<ClaimPlan> {
        Ok(ClaimPlan {
            paused: self.paused_names("action")?,
            limited: self.limited(actions)?,
            priorities: self.ready_priorities()?,
            lapsed: self.lapsed_due(now)?,
        })
    }
    /// The names of this kind (`action`, `rule`, `reaction`) paused.
    fn paused_names(&self, kind: &str) -> Result<HashSet<String>>;
    /// Whether `(kind, name)` is paused.
    fn is_paused(&self, kind: &str, name: &str) -> Result<bool>;
    /// Pauses `(kind, name)`; false when it was paused already.
    #[allow(clippy::too_many_arguments)]
    fn pause(&self, kind: &str, name: &str, now: i64, operator: &str, reason: &str)
    -> Result<bool>;
    /// Resumes `(kind, name)`; false when it was not paused.
    fn resume(&self, kind: &str, name: &str) -> Result<bool>;
    /// Everything paused, by kind and name.
    fn paused(&self) -> Result<Vec<PausedRow>>;
    /// Sets an action's settings, replacing what it had.
    fn configure_action(&self, a: &ActionRow, now: i64) -> Result<()>;
    /// Every action's settings, by name.
    fn action_rows(&self) -> Result<Vec<ActionRow>>;
    /// The settings of those of `actions` that have a limit.
    fn limited(&self, actions: &[String]) -> Result<Vec<ActionRow>>;
    /// The priorities ready runs have, highest first.
    fn ready_priorities(&self) -> Result<Vec<i64>>;
    /// One page of ready, due runs of `action` at `priority` after `after`
    /// (`(due_at, ord)`): `(ord, due_at, partition)`, the partition being
    /// the input's value at the JSON path `path` as text (`""` when
    /// missing), those in `full` left out.
    #[allow(clippy::too_many_arguments)]
    fn candidates(
        &self,
        action: &str,
        now: i64,
        priority: i64,
        path: &str,
        full: &[String],
        after: (i64, i64),
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>>;
    /// Claims the ready runs at these positions.
    fn claim_ords(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        ords: &[i64],
    ) -> Result<Vec<RunRow>>;
    /// Makes the claims of a limited action take turns until this
    /// transaction ends, so what it counts next (running runs, starts) is
    /// what the others committed. Nothing to do where one writer takes
    /// every claim in turn (SQLite).
    fn lock_limits(&self, _action: &str) -> Result<()> {
        Ok(())
    }
    /// How many runs of `action` run now, by partition (one group, `""`,
    /// without a path).
    fn running_by(&self, action: &str, path: Option<&str>) -> Result<Vec<(String, i64)>>;
    /// Starts of `action` after `since`, by partition (older ones deleted).
    fn starts_since(&self, action: &str, since: i64) -> Result<Vec<(String, i64)>>;
    /// Records `n` starts of a rate-limited action's partition at `at`.
    fn record_starts(&self, action: &str, part: &str, at: i64, n: i64) -> Result<()>;
    /// Whether a run of `actions` is ready and due, or a claim lapsed.
    fn work_due(&self, now: i64, actions: &[&String]) -> Result<bool>;
    /// Whether a claim lapsed.
    fn lapsed_due(&self, now: i64) -> Result<bool>;
    /// Deletes uniqueness periods that ended and starts outside every rate
    /// window at `now`; how many rows went.
    fn sweep_control(&self, now: i64) -> Result<usize>;
}
