//! The seam between the engine and its database: what the core asks of a
//! connection, one small trait per table group, so the same core code runs
//! on SQLite and on PostgreSQL (issue 19).
//!
//! A connection here is one inside a transaction, or a reader: the core
//! never begins or ends a transaction itself. SQLite's
//! [`rusqlite::Connection`] implements each trait by calling the statements
//! of its table's module (`store::events`, `store::cursors`, …), so the
//! SQLite path compiles to the same calls as before the seam (static
//! dispatch; nothing boxed). PostgreSQL's connection (`store::pg`, feature
//! `postgres`) implements them with its own statements beside its own
//! schema.
//!
//! A core function states the groups it needs as bounds
//! (`C: Events + Workspaces`), and a backend supports a function when it
//! implements those groups: the compiler, not a runtime check, says what
//! runs where. The groups so far are the core's ([`Core`]: workspaces, the
//! change log, cursors, leases, the audit) and the work layer's ([`Work`]:
//! runs and lanes, control's pauses and limits, counters, dead letters,
//! rules and their state, schedules, what operators look for). The
//! followers' ledger and the file's maintenance still take SQLite's
//! connection directly.
//!
//! Call the methods through the trait (`Events::page(conn, …)`): an
//! inherent method of the connection type with the same name would win over
//! the trait's in method-call syntax.

use std::collections::HashSet;

use crate::base::counter::Counter;
use crate::base::dead_letter::{DeadLetter, DeadLetterKind, Resolution};
use crate::base::error::Result;
use crate::base::event::Event;

use super::control::{ActionRow, PausedRow};
use super::dead_letters::NewDeadLetter;
use super::events::NewRow;
use super::followers::FollowerRow;
use super::leases::LeaseRow;
use super::rules::RuleRow;
use super::runs::{FeedPos, NewRun, RunRow};
use super::schedules::ScheduleRow;
use super::{
    audit, control, counters, cursors, dead_letters, events, followers, leases, rules, runs,
    schedules, workspaces,
};

/// What inserting an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Appended at this seq.
    At(i64),
    /// The workspace has an event with this id already; nothing inserted.
    Existing,
    /// The (workspace, type) pair is not registered: the workspace does
    /// not exist, or does not accept the type. Nothing inserted.
    Unregistered,
}

/// `reflexr_workspaces` and `reflexr_event_types`.
pub trait Workspaces {
    /// Inserts the workspace; false when it existed already.
    fn insert(&self, name: &str, now: i64) -> Result<bool>;
    fn exists(&self, name: &str) -> Result<bool>;
    /// Registers `event_type` for the workspace; false when it was
    /// registered already.
    fn register_type(
        &self,
        workspace: &str,
        event_type: &str,
        reserved: bool,
        now: i64,
    ) -> Result<bool>;
    /// Every workspace with its creation time, by name.
    fn list(&self) -> Result<Vec<(String, i64)>>;
    /// The types an application may append (the reserved ones left out).
    fn app_types(&self, workspace: &str) -> Result<Vec<String>>;
}

/// `reflexr_events`, the change log.
///
/// Every backend keeps one seq for the whole log, dense (a rolled-back
/// append leaves no gap) and in commit order: a reader that has seen seq
/// `n` will never later see a new event below `n` (invariant 1, and what a
/// cursor relies on never to skip an event).
pub trait Events {
    fn insert(&self, row: &NewRow<'_>) -> Result<Inserted>;
    /// Takes the log's head before a transaction that will append takes
    /// anything else, where writers run side by side (PostgreSQL: see
    /// `PgConn::begin_ordered`); SQLite's one writer needs nothing.
    fn lock_head(&self) -> Result<()> {
        Ok(())
    }
    /// The seq of the workspace's event with this id.
    fn seq_of(&self, workspace: &str, id: &str) -> Result<Option<i64>>;
    /// The depth of the workspace's event with this id.
    fn depth_of(&self, workspace: &str, id: &str) -> Result<Option<i64>>;
    /// Up to `limit` of the workspace's events after `after`, in seq order;
    /// only those whose type is in `types` unless it is empty.
    fn page(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        limit: usize,
    ) -> Result<Vec<Event>>;
    /// Up to `limit` of the workspace's events after `after` with this
    /// subject (and a type in `types` unless it is empty), in seq order.
    fn by_subject(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: &str,
        limit: usize,
    ) -> Result<Vec<Event>>;
    /// One event by seq.
    fn get(&self, seq: i64) -> Result<Option<Event>>;
    /// The workspace's event with this id.
    fn by_id(&self, workspace: &str, id: &str) -> Result<Option<Event>>;
    /// The highest seq ever assigned (0 before the first append); pruning
    /// does not lower it.
    fn head(&self) -> Result<i64>;
    /// How many of the workspace's events come after `position`.
    fn count_after(&self, workspace: &str, position: i64) -> Result<i64>;
    /// Deletes up to `limit` of the workspace's oldest events at or before
    /// `up_to` and recorded before `recorded_before`; how many it deleted.
    fn delete_old(
        &self,
        workspace: &str,
        up_to: i64,
        recorded_before: i64,
        limit: usize,
    ) -> Result<usize>;
}

/// `reflexr_cursors`.
pub trait Cursors {
    /// The cursor's position, if it was ever saved.
    fn get(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<i64>>;
    /// Moves the cursor to `position` unless that is behind it; returns
    /// `Err(current)` when it would have moved backwards (nothing written).
    fn advance(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<std::result::Result<(), i64>>;
    /// Every cursor, with the number of its workspace's events after it.
    fn list(&self) -> Result<Vec<cursors::Listed>>;
    /// The lowest position of any cursor on the workspace (None: none).
    fn min_position(&self, workspace: &str) -> Result<Option<i64>>;
    /// Sets the cursor to `position`, forwards or backwards (an operator's
    /// reset), and returns where it was; its stamp moves past any value
    /// read before.
    fn set(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<Option<i64>>;
    /// The position and the stamp of its last change (see
    /// `store::cursors::get_stamped`).
    fn get_stamped(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<(i64, i64)>>;
    /// Marks the cursor changed without moving it.
    fn touch(&self, workspace: &str, kind: &str, name: &str, now: i64) -> Result<()>;
    /// The furthest the cursor has ever been (0: never saved).
    fn high_water(&self, workspace: &str, kind: &str, name: &str) -> Result<i64>;
    /// Deletes the cursor; false if there was none.
    fn delete(&self, workspace: &str, kind: &str, name: &str) -> Result<bool>;
    /// Records that the consumer's commit failed at `position` (nothing if
    /// the cursor moved since); the failures so far.
    #[allow(clippy::too_many_arguments)]
    fn record_failure(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>>;
}

/// `reflexr_rules` and `reflexr_rule_state`: the rules a database knows
/// and their state per scope.
pub trait Rules {
    fn rule(&self, name: &str) -> Result<Option<RuleRow>>;
    fn rule_rows(&self) -> Result<Vec<RuleRow>>;
    /// Inserts or replaces the rule's row.
    fn upsert_rule(
        &self,
        name: &str,
        workspace: &str,
        version: i64,
        definition: &str,
        now: i64,
    ) -> Result<()>;
    /// The stored states of `scopes` (those that have one).
    fn states(&self, rule: &str, scopes: &[&str]) -> Result<Vec<(String, String)>>;
    fn state(&self, rule: &str, scope: &str) -> Result<Option<String>>;
    fn save_state(&self, rule: &str, scope: &str, state: &str, seq: i64, now: i64) -> Result<()>;
    /// Forgets every scope's state; how many there were.
    fn clear_states(&self, rule: &str) -> Result<usize>;
    /// Deletes the rule's row; false if there was none.
    fn delete_rule(&self, name: &str) -> Result<bool>;
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

/// Which runs to find (`inspect::find_runs`), as every backend takes it:
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

/// `reflexr_followers`, the followers' ledger.
pub trait Followers {
    fn follower(&self, name: &str) -> Result<Option<FollowerRow>>;
    fn follower_rows(&self) -> Result<Vec<FollowerRow>>;
    /// Creates the follower's row, or updates its target and projection.
    #[allow(clippy::too_many_arguments)]
    fn upsert_follower(
        &self,
        name: &str,
        source: &str,
        target: &followers::Target<'_>,
        projection: &str,
        now: i64,
    ) -> Result<()>;
    fn delete_follower(&self, name: &str) -> Result<bool>;
    /// Adds a batch's publishes and dead letters to the follower's counters.
    fn count_follower(&self, name: &str, published: i64, dead_letters: i64, now: i64)
    -> Result<()>;
    /// Records a stop.
    fn follower_stopped(&self, name: &str, error: &str, now: i64) -> Result<()>;
    /// Records an operator's request to restart; false: no such follower.
    fn request_restart(&self, name: &str, now: i64) -> Result<bool>;
}

/// `reflexr_audit`, the record of what operators did.
pub trait Audit {
    fn record(&self, entry: &audit::Entry<'_>) -> Result<()>;
    /// The most recent `limit` entries, newest first.
    fn recent(&self, limit: i64) -> Result<Vec<crate::base::audit::AuditEntry>>;
}

/// `reflexr_leases`. Every statement that acts under a lease checks holder,
/// generation and expiry (by the caller's clock) in the statement itself.
pub trait Leases {
    /// Takes the lease if it is free or already `holder`'s (see
    /// `store::leases::acquire`); `None` when someone else holds it.
    fn acquire(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<Option<LeaseRow>>;
    /// Extends a live lease held at `generation`; `None` when it is not.
    fn renew(
        &self,
        name: &str,
        holder: &str,
        generation: i64,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<LeaseRow>>;
    /// Gives a live lease up at once; false when it was not the caller's.
    fn release(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool>;
    /// The fencing check, in the transaction of the fenced write.
    fn is_held(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool>;
    fn get(&self, name: &str) -> Result<Option<LeaseRow>>;
    fn list(&self) -> Result<Vec<LeaseRow>>;
}

/// `reflexr_runs` (the work queue) and `reflexr_lanes`: creating runs,
/// claiming them, settling a claim. A claim is `(holder, attempt)`: every
/// settlement names it and reports whether it still held (see
/// `store::runs`), so an executor that lost its claim changes nothing.
pub trait Runs {
    /// Creates the run (see `store::runs::insert`): the head of its lane
    /// and ready, waiting behind its lane's head, or dead; an id already
    /// there, or a uniqueness key another run holds, creates nothing.
    fn insert(&self, run: &NewRun<'_>) -> Result<runs::Inserted>;
    fn get(&self, id: &str) -> Result<Option<RunRow>>;
    /// Claims up to `limit` ready, due runs of `actions` at `priority`,
    /// oldest due first, for `holder` until `expires_at`. Concurrent
    /// claimers never get the same run, and never wait for each other.
    #[allow(clippy::too_many_arguments)]
    fn claim_at(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        limit: i64,
        actions: &[String],
        priority: i64,
    ) -> Result<Vec<RunRow>>;
    /// Marks a claimed run succeeded; false when the claim no longer held.
    fn succeed(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool>;
    /// Puts a claimed run back as ready at `due_at` after a failed attempt.
    #[allow(clippy::too_many_arguments)]
    fn retry_later(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        due_at: i64,
        error: &str,
    ) -> Result<bool>;
    /// Gives a claimed run up: dead.
    fn kill(&self, id: &str, holder: &str, attempt: i64, now: i64, error: &str) -> Result<bool>;
    /// Extends a live claim; the expiry only moves forward.
    fn renew(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        expires_at: i64,
    ) -> Result<bool>;
    /// Deletes up to `limit` runs that succeeded or were discarded before
    /// `before`; how many it deleted.
    fn delete_finished(&self, before: i64, limit: usize) -> Result<usize>;
    /// Runs whose claim lapsed at `now` (the executor stopped renewing it).
    fn lapsed(&self, now: i64, limit: i64) -> Result<Vec<RunRow>>;
    /// Makes a lapsed claim claimable again at once, or ends it cancelled
    /// if its cancellation was asked for.
    fn requeue_lapsed(&self, ord: i64, now: i64) -> Result<runs::Requeued>;
    /// Gives a claimed run back without counting the attempt (see
    /// `store::runs::release`).
    fn release(&self, ord: i64, holder: &str, attempt: i64, now: i64) -> Result<runs::Requeued>;
    /// Saves a claimed run's checkpoint; false when the claim no longer
    /// held.
    #[allow(clippy::too_many_arguments)]
    fn save_checkpoint(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        checkpoint: &str,
        now: i64,
    ) -> Result<bool>;
    /// The lane's head run and whether the lane is blocked.
    fn lane_head(&self, lane: &str) -> Result<Option<(String, bool)>>;
    /// Blocks or unblocks the lane; false when there is no such lane.
    fn set_blocked(&self, lane: &str, blocked: bool, now: i64) -> Result<bool>;
    /// The run `finished` (the lane's head) ended: the lane's next waiting
    /// run becomes its head and ready, or the lane goes (invariant 6).
    fn advance_lane(&self, lane: &str, finished: &str, now: i64) -> Result<()>;
}

/// More of `reflexr_runs` for executors: settling many claims at once and
/// cancellation (see `store::runs`).
pub trait RunsMore {
    /// Marks many claimed runs (`(id, attempt)`, all `holder`'s) succeeded
    /// in one statement: the ids of those whose claims still held (and no
    /// cancellation was asked for); the others are left as they were.
    fn succeed_many(&self, holder: &str, claims: &[(&str, i64)], now: i64) -> Result<Vec<String>>;
    /// Ends a claimed run whose cancellation was asked for, cancelled;
    /// false when the claim is not ours or no cancellation was asked.
    fn end_cancelled(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool>;
    /// Of these runs, those asked to stop.
    fn cancel_requested(&self, ids: &[&str]) -> Result<Vec<String>>;
    /// Runs in `state`, oldest due first; or every run, in creation order.
    fn list(&self, state: Option<&str>, limit: i64) -> Result<Vec<RunRow>>;
    /// How many runs there are in each state.
    fn counts(&self) -> Result<Vec<(String, i64)>>;
    /// Asks a running run to stop, or cancels a pending one outright; what
    /// it was before (None: no such run). A run that ended is left alone.
    fn cancel(&self, id: &str, now: i64, by: &str, reason: &str) -> Result<Option<String>>;
    /// Makes a dead run ready again with fresh attempts (waiting behind
    /// its lane's head if the lane moved on); false if it was not dead.
    fn revive(&self, id: &str, lane: Option<&str>, now: i64) -> Result<bool>;
    /// Marks a dead run discarded; false if it was not dead.
    fn discard(&self, id: &str, now: i64) -> Result<bool>;
    /// When the oldest ready run became due.
    fn oldest_ready_due(&self) -> Result<Option<i64>>;
    /// How many lanes are blocked behind a dead run.
    fn blocked_count(&self) -> Result<i64>;
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

/// `reflexr_counters`, the totals every process reads the same.
pub trait Counters {
    /// Adds `by` to `name` in the caller's transaction (nothing for 0).
    fn bump(&self, name: Counter, by: usize) -> Result<()>;
    /// Every counter this version knows.
    fn all(&self) -> Result<Vec<(Counter, i64)>>;
}

/// `reflexr_dead_letters`.
pub trait DeadLetters {
    /// Records it, once per (consumer, event) or open run (see
    /// `store::dead_letters::insert`); whether it was new or opened again.
    fn insert(&self, d: &NewDeadLetter<'_>) -> Result<bool>;
    /// Open dead letters (or all), oldest first, after `after_id`.
    fn list(&self, include_resolved: bool, after_id: i64, limit: i64) -> Result<Vec<DeadLetter>>;
    fn get(&self, id: i64) -> Result<Option<DeadLetter>>;
    /// The open dead letter of a run.
    fn open_for_run(&self, run_id: &str) -> Result<Option<DeadLetter>>;
    /// Resolves an open dead letter; false if it was resolved already.
    fn resolve(&self, id: i64, resolution: Resolution, now: i64) -> Result<bool>;
    /// Dead letters not yet resolved, by kind.
    fn open_counts(&self) -> Result<Vec<(DeadLetterKind, i64)>>;
    /// Resolves (as retried) the open dead letter of `consumer` for the
    /// event at `seq`, if there is one.
    #[allow(clippy::too_many_arguments)]
    fn resolve_for_event(
        &self,
        kind: DeadLetterKind,
        consumer: &str,
        workspace: &str,
        seq: i64,
        now: i64,
    ) -> Result<bool>;
}

/// What the work layer (rules, runs, executors) asks of a connection.
pub trait Work:
    Core + Runs + RunsMore + Control + Counters + DeadLetters + Rules + Schedules + Inspect + Followers
{
}
impl<T> Work for T where
    T: Core
        + Runs
        + RunsMore
        + Control
        + Counters
        + DeadLetters
        + Rules
        + Schedules
        + Inspect
        + Followers
        + ?Sized
{
}

/// Everything the core asks of a connection.
pub trait Core: Events + Workspaces + Cursors + Leases + Audit {}
impl<T: Events + Workspaces + Cursors + Leases + Audit + ?Sized> Core for T {}

/// The database an engine runs on, as the core sees it: its connection
/// type (what a [`crate::Tx`] holds) and what its writer guards the
/// transaction with. Sealed: implemented by [`Sqlite`] and, with the feature
/// `postgres`, [`Postgres`].
pub trait Store: Send + Sync + Sized + 'static {
    /// A connection inside a transaction.
    type Conn: Work;
    /// What the writer keeps beside the connection to guard its
    /// transaction (SQLite's authorizer and control statements).
    type Guard;
    /// Makes the engine's nested savepoint (see `Tx::nested`); returns
    /// what [`Store::rollback_nested`] needs to undo it.
    #[doc(hidden)]
    fn begin_nested(conn: &Self::Conn, guard: &Self::Guard) -> Result<i64>;
    /// Rolls back to the nested savepoint made at `mark`.
    #[doc(hidden)]
    fn rollback_nested(conn: &Self::Conn, guard: &Self::Guard, mark: i64) -> Result<()>;
    /// Releases the nested savepoint.
    #[doc(hidden)]
    fn release_nested(conn: &Self::Conn, guard: &Self::Guard) -> Result<()>;
}

/// SQLite, the default backend: one file, one writer per file (see
/// [`crate::Engine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sqlite {}

impl Store for Sqlite {
    type Conn = rusqlite::Connection;
    type Guard = super::conn::Guard;
    fn begin_nested(conn: &rusqlite::Connection, guard: &super::conn::Guard) -> Result<i64> {
        sqlite_in_transaction(conn)?;
        guard.control(conn, super::conn::Control::Nested)?;
        Ok(0)
    }
    fn rollback_nested(
        conn: &rusqlite::Connection,
        guard: &super::conn::Guard,
        _mark: i64,
    ) -> Result<()> {
        sqlite_in_transaction(conn)?;
        guard.control(conn, super::conn::Control::RollbackNested)
    }
    fn release_nested(conn: &rusqlite::Connection, guard: &super::conn::Guard) -> Result<()> {
        sqlite_in_transaction(conn)?;
        guard.control(conn, super::conn::Control::ReleaseNested)
    }
}

/// A savepoint outside a transaction would begin a new one: if SQLite ended
/// the engine's (an I/O error, a full disk mid-statement), stop here.
fn sqlite_in_transaction(conn: &rusqlite::Connection) -> Result<()> {
    if conn.is_autocommit() {
        return Err(crate::base::error::Error::TransactionAborted {
            detail: "SQLite rolled the transaction back (an I/O error, or a full disk \
                     mid-statement)"
                .into(),
        });
    }
    Ok(())
}

/// PostgreSQL (feature `postgres`): a server database that processes on
/// several machines share (see `Engine::builder_postgres`).
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Postgres {}

#[cfg(feature = "postgres")]
impl Store for Postgres {
    type Conn = super::pg::PgConn;
    type Guard = ();
    fn begin_nested(conn: &super::pg::PgConn, _: &()) -> Result<i64> {
        conn.control("SAVEPOINT reflexr_nested")?;
        Ok(conn.last_seq())
    }
    fn rollback_nested(conn: &super::pg::PgConn, _: &(), mark: i64) -> Result<()> {
        conn.rollback_to("reflexr_nested", mark)
    }
    fn release_nested(conn: &super::pg::PgConn, _: &()) -> Result<()> {
        conn.control("RELEASE SAVEPOINT reflexr_nested")
    }
}

// SQLite: each method is its table module's statement.

impl Workspaces for rusqlite::Connection {
    fn insert(&self, name: &str, now: i64) -> Result<bool> {
        workspaces::insert(self, name, now)
    }
    fn exists(&self, name: &str) -> Result<bool> {
        workspaces::exists(self, name)
    }
    fn register_type(
        &self,
        workspace: &str,
        event_type: &str,
        reserved: bool,
        now: i64,
    ) -> Result<bool> {
        workspaces::register_type(self, workspace, event_type, reserved, now)
    }
    fn list(&self) -> Result<Vec<(String, i64)>> {
        workspaces::list(self)
    }
    fn app_types(&self, workspace: &str) -> Result<Vec<String>> {
        workspaces::app_types(self, workspace)
    }
}

impl Events for rusqlite::Connection {
    fn insert(&self, row: &NewRow<'_>) -> Result<Inserted> {
        match events::insert(self, row) {
            Ok(Some(seq)) => Ok(Inserted::At(seq)),
            Ok(None) => Ok(Inserted::Existing),
            // The only foreign key is (workspace, type).
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY =>
            {
                Ok(Inserted::Unregistered)
            }
            Err(e) => Err(e.into()),
        }
    }
    fn seq_of(&self, workspace: &str, id: &str) -> Result<Option<i64>> {
        events::seq_of(self, workspace, id)
    }
    fn depth_of(&self, workspace: &str, id: &str) -> Result<Option<i64>> {
        events::depth_of(self, workspace, id)
    }
    fn page(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        limit: usize,
    ) -> Result<Vec<Event>> {
        events::page(self, workspace, after, types, limit)
    }
    fn by_subject(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: &str,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let (events, _) = events::scan(
            self,
            workspace,
            after,
            types,
            Some(subject),
            limit,
            usize::MAX,
        )?;
        Ok(events)
    }
    fn get(&self, seq: i64) -> Result<Option<Event>> {
        events::get(self, seq)
    }
    fn by_id(&self, workspace: &str, id: &str) -> Result<Option<Event>> {
        events::by_id(self, workspace, id)
    }
    fn head(&self) -> Result<i64> {
        events::head(self)
    }
    fn count_after(&self, workspace: &str, position: i64) -> Result<i64> {
        events::count_after(self, workspace, position)
    }
    fn delete_old(
        &self,
        workspace: &str,
        up_to: i64,
        recorded_before: i64,
        limit: usize,
    ) -> Result<usize> {
        events::delete_old(self, workspace, up_to, recorded_before, limit)
    }
}

impl Cursors for rusqlite::Connection {
    fn get(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<i64>> {
        cursors::get(self, workspace, kind, name)
    }
    fn advance(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<std::result::Result<(), i64>> {
        cursors::advance(self, workspace, kind, name, position, now)
    }
    fn list(&self) -> Result<Vec<cursors::Listed>> {
        cursors::list(self)
    }
    fn min_position(&self, workspace: &str) -> Result<Option<i64>> {
        cursors::min_position(self, workspace)
    }
    fn set(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<Option<i64>> {
        cursors::set(self, workspace, kind, name, position, now)
    }
    fn get_stamped(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<(i64, i64)>> {
        cursors::get_stamped(self, workspace, kind, name)
    }
    fn touch(&self, workspace: &str, kind: &str, name: &str, now: i64) -> Result<()> {
        cursors::touch(self, workspace, kind, name, now)
    }
    fn high_water(&self, workspace: &str, kind: &str, name: &str) -> Result<i64> {
        cursors::high_water(self, workspace, kind, name)
    }
    fn delete(&self, workspace: &str, kind: &str, name: &str) -> Result<bool> {
        cursors::delete(self, workspace, kind, name)
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
        cursors::record_failure(self, workspace, kind, name, position, error, now)
    }
}

impl Rules for rusqlite::Connection {
    fn rule(&self, name: &str) -> Result<Option<RuleRow>> {
        rules::get(self, name)
    }
    fn rule_rows(&self) -> Result<Vec<RuleRow>> {
        rules::list(self)
    }
    fn upsert_rule(
        &self,
        name: &str,
        workspace: &str,
        version: i64,
        definition: &str,
        now: i64,
    ) -> Result<()> {
        rules::upsert(self, name, workspace, version, definition, now)
    }
    fn states(&self, rule: &str, scopes: &[&str]) -> Result<Vec<(String, String)>> {
        rules::states(self, rule, scopes)
    }
    fn state(&self, rule: &str, scope: &str) -> Result<Option<String>> {
        rules::state(self, rule, scope)
    }
    fn save_state(&self, rule: &str, scope: &str, state: &str, seq: i64, now: i64) -> Result<()> {
        rules::save_state(self, rule, scope, state, seq, now)
    }
    fn clear_states(&self, rule: &str) -> Result<usize> {
        rules::clear_states(self, rule)
    }
    fn delete_rule(&self, name: &str) -> Result<bool> {
        rules::delete(self, name)
    }
}

impl Audit for rusqlite::Connection {
    fn record(&self, entry: &audit::Entry<'_>) -> Result<()> {
        audit::record(self, entry)
    }
    fn recent(&self, limit: i64) -> Result<Vec<crate::base::audit::AuditEntry>> {
        audit::recent(self, limit)
    }
}

impl Leases for rusqlite::Connection {
    fn acquire(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<Option<LeaseRow>> {
        leases::acquire(self, name, holder, now, ttl_ms)
    }
    fn renew(
        &self,
        name: &str,
        holder: &str,
        generation: i64,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<LeaseRow>> {
        leases::renew(self, name, holder, generation, now, ttl_ms)
    }
    fn release(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        leases::release(self, name, holder, generation, now)
    }
    fn is_held(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        leases::is_held(self, name, holder, generation, now)
    }
    fn get(&self, name: &str) -> Result<Option<LeaseRow>> {
        leases::get(self, name)
    }
    fn list(&self) -> Result<Vec<LeaseRow>> {
        leases::list(self)
    }
}

impl Runs for rusqlite::Connection {
    fn insert(&self, run: &NewRun<'_>) -> Result<runs::Inserted> {
        runs::insert(self, run)
    }
    fn get(&self, id: &str) -> Result<Option<RunRow>> {
        runs::get(self, id)
    }
    fn claim_at(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        limit: i64,
        actions: &[String],
        priority: i64,
    ) -> Result<Vec<RunRow>> {
        let actions = serde_json::to_string(actions).expect("a list of strings encodes");
        runs::claim_at(self, holder, now, expires_at, limit, &actions, priority)
    }
    fn succeed(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        runs::succeed(self, id, holder, attempt, now)
    }
    fn retry_later(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        due_at: i64,
        error: &str,
    ) -> Result<bool> {
        runs::retry_later(self, id, holder, attempt, now, due_at, error)
    }
    fn kill(&self, id: &str, holder: &str, attempt: i64, now: i64, error: &str) -> Result<bool> {
        runs::kill(self, id, holder, attempt, now, error)
    }
    fn renew(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        expires_at: i64,
    ) -> Result<bool> {
        runs::renew(self, id, holder, attempt, now, expires_at)
    }
    fn delete_finished(&self, before: i64, limit: usize) -> Result<usize> {
        runs::delete_finished(self, before, limit)
    }
    fn lapsed(&self, now: i64, limit: i64) -> Result<Vec<RunRow>> {
        runs::lapsed(self, now, limit)
    }
    fn requeue_lapsed(&self, ord: i64, now: i64) -> Result<runs::Requeued> {
        runs::requeue_lapsed(self, ord, now)
    }
    fn release(&self, ord: i64, holder: &str, attempt: i64, now: i64) -> Result<runs::Requeued> {
        runs::release(self, ord, holder, attempt, now)
    }
    fn save_checkpoint(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        checkpoint: &str,
        now: i64,
    ) -> Result<bool> {
        runs::save_checkpoint(self, id, holder, attempt, checkpoint, now)
    }
    fn lane_head(&self, lane: &str) -> Result<Option<(String, bool)>> {
        runs::lane_head(self, lane)
    }
    fn set_blocked(&self, lane: &str, blocked: bool, now: i64) -> Result<bool> {
        runs::set_blocked(self, lane, blocked, now)
    }
    fn advance_lane(&self, lane: &str, finished: &str, now: i64) -> Result<()> {
        runs::advance_lane(self, lane, finished, now)
    }
}

impl RunsMore for rusqlite::Connection {
    fn succeed_many(&self, holder: &str, claims: &[(&str, i64)], now: i64) -> Result<Vec<String>> {
        let claims = serde_json::to_string(claims).expect("ids and attempts encode");
        runs::succeed_many(self, holder, &claims, now)
    }
    fn end_cancelled(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        runs::end_cancelled(self, id, holder, attempt, now)
    }
    fn cancel_requested(&self, ids: &[&str]) -> Result<Vec<String>> {
        let ids = serde_json::to_string(ids).expect("ids encode");
        runs::cancel_requested(self, &ids)
    }
    fn list(&self, state: Option<&str>, limit: i64) -> Result<Vec<RunRow>> {
        runs::list(self, state, limit)
    }
    fn counts(&self) -> Result<Vec<(String, i64)>> {
        runs::counts(self)
    }
    fn cancel(&self, id: &str, now: i64, by: &str, reason: &str) -> Result<Option<String>> {
        runs::cancel(self, id, now, by, reason)
    }
    fn revive(&self, id: &str, lane: Option<&str>, now: i64) -> Result<bool> {
        runs::revive(self, id, lane, now)
    }
    fn discard(&self, id: &str, now: i64) -> Result<bool> {
        runs::discard(self, id, now)
    }
    fn oldest_ready_due(&self) -> Result<Option<i64>> {
        runs::oldest_ready_due(self)
    }
    fn blocked_count(&self) -> Result<i64> {
        runs::blocked_count(self)
    }
}

impl Control for rusqlite::Connection {
    fn paused_names(&self, kind: &str) -> Result<HashSet<String>> {
        control::paused_names(self, kind)
    }
    fn is_paused(&self, kind: &str, name: &str) -> Result<bool> {
        control::is_paused(self, kind, name)
    }
    fn pause(
        &self,
        kind: &str,
        name: &str,
        now: i64,
        operator: &str,
        reason: &str,
    ) -> Result<bool> {
        control::pause(self, kind, name, now, operator, reason)
    }
    fn resume(&self, kind: &str, name: &str) -> Result<bool> {
        control::resume(self, kind, name)
    }
    fn paused(&self) -> Result<Vec<PausedRow>> {
        control::paused(self)
    }
    fn configure_action(&self, a: &ActionRow, now: i64) -> Result<()> {
        control::configure(self, a, now)
    }
    fn action_rows(&self) -> Result<Vec<ActionRow>> {
        control::actions(self)
    }
    fn limited(&self, actions: &[String]) -> Result<Vec<ActionRow>> {
        let names = serde_json::to_string(actions).expect("names encode");
        control::limited(self, &names)
    }
    fn ready_priorities(&self) -> Result<Vec<i64>> {
        runs::ready_priorities(self)
    }
    fn candidates(
        &self,
        action: &str,
        now: i64,
        priority: i64,
        path: &str,
        full: &[String],
        after: (i64, i64),
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>> {
        let full = serde_json::to_string(full).expect("partitions encode");
        runs::candidates(self, action, now, priority, path, &full, after, limit)
    }
    fn claim_ords(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        ords: &[i64],
    ) -> Result<Vec<RunRow>> {
        let ords = serde_json::to_string(ords).expect("ords encode");
        runs::claim_ords(self, holder, now, expires_at, &ords)
    }
    fn running_by(&self, action: &str, path: Option<&str>) -> Result<Vec<(String, i64)>> {
        runs::running_by(self, action, path)
    }
    fn starts_since(&self, action: &str, since: i64) -> Result<Vec<(String, i64)>> {
        runs::starts_since(self, action, since)
    }
    fn record_starts(&self, action: &str, part: &str, at: i64, n: i64) -> Result<()> {
        runs::record_starts(self, action, part, at, n)
    }
    fn work_due(&self, now: i64, actions: &[&String]) -> Result<bool> {
        let names = serde_json::to_string(actions).expect("names encode");
        runs::work_due(self, now, &names)
    }
    fn lapsed_due(&self, now: i64) -> Result<bool> {
        runs::lapsed_due(self, now)
    }
    fn sweep_control(&self, now: i64) -> Result<usize> {
        runs::sweep_control(self, now)
    }
}

impl Counters for rusqlite::Connection {
    fn bump(&self, name: Counter, by: usize) -> Result<()> {
        counters::bump(self, name, by)
    }
    fn all(&self) -> Result<Vec<(Counter, i64)>> {
        counters::all(self)
    }
}

impl DeadLetters for rusqlite::Connection {
    fn insert(&self, d: &NewDeadLetter<'_>) -> Result<bool> {
        dead_letters::insert(self, d)
    }
    fn list(&self, include_resolved: bool, after_id: i64, limit: i64) -> Result<Vec<DeadLetter>> {
        dead_letters::list(self, include_resolved, after_id, limit)
    }
    fn get(&self, id: i64) -> Result<Option<DeadLetter>> {
        dead_letters::get(self, id)
    }
    fn open_for_run(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        dead_letters::open_for_run(self, run_id)
    }
    fn resolve(&self, id: i64, resolution: Resolution, now: i64) -> Result<bool> {
        dead_letters::resolve(self, id, resolution, now)
    }
    fn open_counts(&self) -> Result<Vec<(DeadLetterKind, i64)>> {
        dead_letters::open_counts(self)
    }
    fn resolve_for_event(
        &self,
        kind: DeadLetterKind,
        consumer: &str,
        workspace: &str,
        seq: i64,
        now: i64,
    ) -> Result<bool> {
        dead_letters::resolve_for_event(self, kind, consumer, workspace, seq, now)
    }
}

impl Schedules for rusqlite::Connection {
    fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>> {
        schedules::get(self, name)
    }
    fn schedule_rows(&self) -> Result<Vec<ScheduleRow>> {
        schedules::list(self)
    }
    fn upsert_schedule(&self, row: &ScheduleRow) -> Result<()> {
        schedules::upsert(self, row)
    }
    fn advance_schedule(
        &self,
        name: &str,
        expected_next: i64,
        next: Option<i64>,
        last: Option<i64>,
        now: i64,
    ) -> Result<bool> {
        schedules::advance(self, name, expected_next, next, last, now)
    }
}

impl Inspect for rusqlite::Connection {
    fn scan_events(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: Option<&str>,
        limit: usize,
        window: usize,
    ) -> Result<(Vec<Event>, Option<i64>)> {
        events::scan(self, workspace, after, types, subject, limit, window)
    }
    fn events_with_id_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<Event>> {
        events::with_id_prefix(self, prefix, limit)
    }
    fn runs_end(&self) -> Result<i64> {
        runs::end(self)
    }
    fn find_runs(&self, f: &RunFind<'_>) -> Result<(Vec<RunRow>, Option<i64>)> {
        runs::find(
            self,
            &runs::Find {
                state: f.state,
                action: f.action,
                rule: f.rule,
                workspace: f.workspace,
                scope: f.scope,
                input: f.input.map(|(p, v)| (p, runs::sql_value(v))),
                before: f.before,
                limit: f.limit,
                window: f.window,
            },
        )
    }
    fn runs_changed_after(&self, after: (i64, i64), limit: usize) -> Result<Vec<RunRow>> {
        runs::changed_after(self, after, limit)
    }
    fn blocked_lanes(&self, limit: usize) -> Result<Vec<runs::BlockedRow>> {
        runs::blocked_lanes(self, limit)
    }
    fn dead_letters_end(&self) -> Result<i64> {
        dead_letters::end(self)
    }
    fn find_dead_letters(
        &self,
        f: &dead_letters::Find<'_>,
    ) -> Result<(Vec<DeadLetter>, Option<i64>)> {
        dead_letters::find(self, f)
    }
}

impl Followers for rusqlite::Connection {
    fn follower(&self, name: &str) -> Result<Option<FollowerRow>> {
        followers::get(self, name)
    }
    fn follower_rows(&self) -> Result<Vec<FollowerRow>> {
        followers::list(self)
    }
    fn upsert_follower(
        &self,
        name: &str,
        source: &str,
        target: &followers::Target<'_>,
        projection: &str,
        now: i64,
    ) -> Result<()> {
        followers::upsert(self, name, source, target, projection, now)
    }
    fn delete_follower(&self, name: &str) -> Result<bool> {
        followers::delete(self, name)
    }
    fn count_follower(
        &self,
        name: &str,
        published: i64,
        dead_letters: i64,
        now: i64,
    ) -> Result<()> {
        followers::count(self, name, published, dead_letters, now)
    }
    fn follower_stopped(&self, name: &str, error: &str, now: i64) -> Result<()> {
        followers::stopped(self, name, error, now)
    }
    fn request_restart(&self, name: &str, now: i64) -> Result<bool> {
        followers::request_restart(self, name, now)
    }
}
