//! `reflexr_steps`, `reflexr_event_waits`, `reflexr_wait_positions`,
//! `reflexr_run_waits`, `reflexr_run_logs` and `reflexr_run_progress`: what
//! a run keeps of its own besides its row — what a workflow's steps
//! recorded, what its suspension waits for, and what its handler logged and
//! how far it got — each deleted with the run.
//!
//! The table group every backend implements (`store::sqlite::steps`,
//! `store::postgres::steps`), and the rows it speaks in.

use crate::base::error::Result;

/// A recorded step: every column of `reflexr_steps`.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub run: String,
    pub name: String,
    pub position: i64,
    /// `begin`, `step`, `tx`, `sleep`, `wait`, `spawn`, `join` or `patch`.
    pub kind: String,
    /// `done` or `waiting`.
    pub state: String,
    pub attempt: i64,
    pub output: Option<String>,
    pub detail: String,
    pub wake_at: Option<i64>,
    pub recorded_at: i64,
}

/// A line a run's handler logged (`reflexr_run_logs`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogRow {
    pub run: String,
    pub n: i64,
    pub attempt: i64,
    pub at: i64,
    pub level: String,
    pub message: String,
    pub fields: Option<String>,
}

/// How far a run's handler last said it got (`reflexr_run_progress`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressRow {
    pub attempt: i64,
    pub done: i64,
    pub total: i64,
    pub at: i64,
}

/// A run waiting for an event of the log (`reflexr_event_waits`).
#[derive(Debug, Clone, PartialEq)]
pub struct EventWait<'a> {
    pub run: &'a str,
    pub step: &'a str,
    pub workspace: &'a str,
    pub event_type: &'a str,
    /// `''`, `subject`, or a payload path.
    pub by: &'a str,
    pub key: &'a str,
    /// Events up to this seq were looked at when the wait was recorded.
    pub after_seq: i64,
}

/// The group's statements.
pub trait Steps {
    /// A run's recorded steps, by position.
    fn steps(&self, run: &str) -> Result<Vec<StepRow>>;
    /// Records a step; the caller checked its name and position are free.
    fn insert_step(&self, step: &StepRow) -> Result<()>;
    /// A waiting step is over, with this output: false when it was over
    /// already (a wait's event and its timeout race; the first wins).
    fn resolve_step(&self, run: &str, name: &str, output: &str, now: i64) -> Result<bool>;
    /// Forgets the run's steps from `position` on, and what it waits for;
    /// how many steps went.
    fn forget_steps(&self, run: &str, position: i64) -> Result<usize>;
    /// Deletes the steps and waits of these runs (pruned), and their logs
    /// and progress.
    fn delete_steps_of(&self, runs: &[String]) -> Result<()>;
    /// Appends a line to the run's log (numbered after its last), if the
    /// claim `(holder, attempt)` still holds: false when it does not.
    fn append_log(&self, line: &LogRow, holder: &str) -> Result<bool>;
    /// How many lines the run's log has of `attempt`.
    fn count_logs(&self, run: &str, attempt: i64) -> Result<i64>;
    /// Up to `limit` lines of the run's log after line `after`, in order.
    fn run_logs(&self, run: &str, after: i64, limit: usize) -> Result<Vec<LogRow>>;
    /// Sets how far the run got, if the claim `(holder, attempt)` still
    /// holds: false when it does not.
    fn set_progress(&self, run: &str, holder: &str, p: &ProgressRow) -> Result<bool>;
    /// How far the run last said it got.
    fn run_progress(&self, run: &str) -> Result<Option<ProgressRow>>;

    /// Records a wait for an event, and makes sure its workspace's waits are
    /// matched from `after_seq` on.
    fn insert_event_wait(&self, wait: &EventWait<'_>) -> Result<()>;
    /// Forgets one wait for an event.
    fn delete_event_wait(&self, run: &str, step: &str) -> Result<()>;
    /// Forgets every wait of a run (events and runs).
    fn delete_waits_of(&self, run: &str) -> Result<()>;
    /// True when some workspace with waits has events its waits were not
    /// matched against: the cheap read before the match.
    fn waits_behind(&self) -> Result<bool>;
    /// Whether any run waits for an event at all (an index's first entry).
    fn any_event_wait(&self) -> Result<bool>;
    /// The workspaces whose waits are behind, with the seq they were
    /// matched up to.
    fn wait_positions_behind(&self) -> Result<Vec<(String, i64)>>;
    /// The first `(type, by)` of the workspace's waits after `after`, in
    /// order (a skip through the index: one look per distinct pair).
    fn next_waited(&self, workspace: &str, after: (&str, &str))
    -> Result<Option<(String, String)>>;
    /// The waits (run, step) that match an event with this key at `seq`.
    fn waits_for(
        &self,
        workspace: &str,
        event_type: &str,
        by: &str,
        key: &str,
        seq: i64,
    ) -> Result<Vec<(String, String)>>;
    /// The workspace's waits were matched up to `position`.
    fn set_wait_position(&self, workspace: &str, position: i64) -> Result<()>;

    /// Records that `run`'s step waits for `child` to end.
    fn insert_run_wait(&self, child: &str, run: &str, step: &str) -> Result<()>;
    /// `child` ended: forgets the waits for it, and says which runs waited.
    fn take_run_waiters(&self, child: &str) -> Result<Vec<String>>;
}
