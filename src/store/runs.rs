//! `reflexr_runs` and `reflexr_lanes`: the work queue.
//!
//! The table group every backend implements (`store::sqlite::runs`,
//! `store::postgres::runs`), and the rows it speaks in.

use std::collections::HashMap;

use crate::base::error::{Error, Result};
use crate::base::retry::RetryPolicy;
use crate::store::Inspect;
use crate::store::{Batched, one_by_one};

/// A run to create.
pub struct NewRun<'a> {
    pub id: &'a str,
    pub kind: &'a str,
    pub action: &'a str,
    pub workspace: Option<&'a str>,
    pub rule: Option<&'a str>,
    pub scope: Option<&'a str>,
    /// Runs of one lane run one at a time, in order. None: no ordering.
    pub lane: Option<&'a str>,
    pub on_dead_letter: &'a str,
    pub input: &'a str,
    pub event_seq: Option<i64>,
    pub event_id: Option<&'a str>,
    pub depth: i64,
    /// Stored on the run: the executor retries by it.
    pub retry: &'a RetryPolicy,
    pub due_at: i64,
    pub now: i64,
    /// Created dead, with this error (it is never run; it takes no place in
    /// its lane).
    pub dead: Option<&'a str>,
    /// Its priority; None: the action's default (`reflexr_actions`), or 0.
    pub priority: Option<i64>,
    /// No second run of the action with this key while it is in scope.
    pub unique: Option<Uniq<'a>>,
    /// The workflow run that spawned it.
    pub parent: Option<&'a str>,
    /// Its key, as the enqueue named it; None: a keyed action's runs take
    /// the input's value at the action's key path (else `""`), the others
    /// have none.
    pub key: Option<&'a str>,
    /// The W3C trace context it carries (its event's, or its enqueue's).
    pub traceparent: Option<&'a str>,
}

/// What a debounced enqueue did to the run holding its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Debounced {
    /// Folded into it: it had not started.
    Folded,
    /// It had started (and waits again): it gave the key up.
    Released,
    /// It no longer waits (claimed, or ended, meanwhile).
    Gone,
}

/// A uniqueness key and how long it holds.
#[derive(Debug, Clone, Copy)]
pub struct Uniq<'a> {
    pub key: &'a str,
    /// `pending`, `active` or `period`.
    pub mode: &'a str,
    /// For `period`: how long, in ms.
    pub period_ms: i64,
}

/// What an insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// Created.
    New,
    /// A run with this id was there already.
    Existed,
    /// Another run holds the uniqueness key: its id.
    Duplicate(String),
}

/// Every column of a run.
#[derive(Debug, Clone, Default)]
pub struct RunRow {
    pub ord: i64,
    pub id: String,
    pub kind: String,
    pub action: String,
    pub workspace: Option<String>,
    pub rule: Option<String>,
    pub scope: Option<String>,
    pub lane: Option<String>,
    pub on_dead_letter: String,
    pub input: String,
    pub event_seq: Option<i64>,
    pub event_id: Option<String>,
    pub depth: i64,
    pub state: String,
    pub attempt: i64,
    pub max_attempts: i64,
    pub backoff_ms: i64,
    pub backoff_max_ms: i64,
    pub backoff_factor: f64,
    pub jitter: f64,
    pub due_at: i64,
    pub claimed_by: Option<String>,
    pub claim_expires_at: Option<i64>,
    pub checkpoint: Option<String>,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    pub priority: i64,
    pub unique_key: Option<String>,
    pub unique_mode: Option<String>,
    pub started_at: Option<i64>,
    pub cancel_requested_at: Option<i64>,
    pub cancelled_by: Option<String>,
    pub cancel_reason: Option<String>,
    /// What the run returned (JSON), once it succeeded.
    pub output: Option<String>,
    /// The workflow run that spawned it.
    pub parent: Option<String>,
    /// The log's head when it was first claimed.
    pub began_seq: Option<i64>,
    /// Its key, for a keyed action's limits and fair claims.
    pub flow_key: Option<String>,
    /// The W3C trace context it carries.
    pub traceparent: Option<String>,
}

/// Where a feed of run changes stands (`Inspect::runs_feed`).
#[derive(Debug, Clone, PartialEq)]
pub enum FeedPos {
    /// Not read yet: from the changes made at or after this engine-clock
    /// millisecond.
    Since(i64),
    /// By change time (SQLite, where one writer at a time stamps its
    /// changes and commits them): the millisecond caught up to, and what
    /// was delivered of the runs changed in it (position → state and
    /// attempt), so a run changed again within it comes again and one
    /// unchanged does not.
    Clock {
        at_ms: i64,
        seen: HashMap<i64, (String, i64)>,
    },
    /// By transaction (PostgreSQL, where transactions commit in another
    /// order than they stamp): past this `(changed_tx, position)`, every
    /// transaction below `changed_tx` having ended.
    Xact { tx: i64, ord: i64 },
}

/// What became of a lapsed or released claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeued {
    /// Claimable again.
    Ready,
    /// Its cancellation had been asked for: it ended cancelled (its lane,
    /// if any, must move on).
    Cancelled,
    /// Not changed (no longer this claim).
    No,
}

impl Requeued {
    /// From the state an `UPDATE … RETURNING state` left, if it changed a row.
    pub(crate) fn from_state(state: Option<String>) -> Requeued {
        match state.as_deref() {
            None => Requeued::No,
            Some("cancelled") => Requeued::Cancelled,
            Some(_) => Requeued::Ready,
        }
    }
}

/// A blocked lane as the store reads it: the lane, its head run, the head's
/// rule, scope and last error, and when the lane was blocked.
pub type BlockedRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
);

/// The feed of run changes by change time (`Inspect::runs_feed`'s
/// default): from the start of the millisecond `pos` stands at, paging
/// through [`Inspect::runs_changed_after`], and skipping what it delivered
/// at that millisecond unchanged. Right where changes commit in the order
/// they were stamped (SQLite's one writer). On an error, `pos` stays where
/// it was.
pub(crate) fn feed_by_change_time<C: Inspect + ?Sized>(
    conn: &C,
    pos: &mut FeedPos,
    limit: usize,
) -> Result<Vec<RunRow>> {
    let (mut at_ms, mut seen) = match pos {
        FeedPos::Since(ms) => (*ms, HashMap::new()),
        FeedPos::Clock { at_ms, seen } => (*at_ms, seen.clone()),
        FeedPos::Xact { .. } => {
            return Err(Error::invalid(
                "after",
                "a position in PostgreSQL's feed of run changes, and this database is not one",
            ));
        }
    };
    let page_size = limit.clamp(1, 500);
    let (mut out, mut cursor) = (Vec::new(), (at_ms, i64::MIN));
    loop {
        let page = conn.runs_changed_after(cursor, page_size)?;
        let short = page.len() < page_size;
        for r in page {
            cursor = (r.updated_at, r.ord);
            let print = (r.state.clone(), r.attempt);
            if r.updated_at == at_ms && seen.get(&r.ord) == Some(&print) {
                continue;
            }
            if r.updated_at > at_ms {
                at_ms = r.updated_at;
                seen.clear();
            }
            seen.insert(r.ord, print);
            out.push(r);
            if out.len() == limit {
                break;
            }
        }
        if out.len() == limit || short {
            break;
        }
    }
    *pos = FeedPos::Clock { at_ms, seen };
    Ok(out)
}

/// `reflexr_runs`: the work queue's runs — inserted, claimed, settled,
/// retried, renewed, cancelled, revived — as executors and operators use it.
pub trait Runs {
    /// Creates the run (see `store::runs::insert`): the head of its lane
    /// and ready, waiting behind its lane's head, or dead; an id already
    /// there, or a uniqueness key another run holds, creates nothing.
    fn insert(&self, run: &NewRun<'_>) -> Result<Inserted>;
    /// Creates `runs` in order, each as [`Runs::insert`] would (see
    /// [`Batched`]). One insert after another here; a backend whose every
    /// statement is a round trip makes them one statement (PostgreSQL).
    fn insert_all(&self, runs: &[NewRun<'_>]) -> Batched<Inserted> {
        one_by_one(runs, |run| self.insert(run))
    }
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
    fn requeue_lapsed(&self, ord: i64, now: i64) -> Result<Requeued>;
    /// Gives a claimed run back without counting the attempt (see
    /// `store::runs::release`).
    fn release(&self, ord: i64, holder: &str, attempt: i64, now: i64) -> Result<Requeued>;
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
    /// Marks many claimed runs (`(ord, id, attempt)`, all `holder`'s)
    /// succeeded in one call (one statement on PostgreSQL, a prepared one a
    /// run on SQLite, where a statement costs no round trip): the ids of
    /// those whose claims still held (and no cancellation was asked for);
    /// the others are left as they were. A row is found by its position and
    /// must carry the id.
    fn succeed_many(
        &self,
        holder: &str,
        claims: &[(i64, &str, i64)],
        now: i64,
    ) -> Result<Vec<String>>;
    /// Ends a claimed run whose cancellation was asked for, cancelled;
    /// false when the claim is not ours or no cancellation was asked.
    fn end_cancelled(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool>;
    /// Of these runs (`(ord, id)`), the ids of those asked to stop.
    fn cancel_requested(&self, runs: &[(i64, &str)]) -> Result<Vec<String>>;
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

    /// Marks a claimed run changed now; false unless the claim (holder,
    /// attempt) still holds and no cancellation was asked for: the check a
    /// step's record makes in its transaction.
    fn hold_claim(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool>;
    /// Suspends a claimed run: ready at `due_at`, unclaimed, its attempt not
    /// counted. `Requeued::No` when the claim no longer held or its
    /// cancellation was asked for.
    fn suspend(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        due_at: i64,
        now: i64,
    ) -> Result<Requeued>;
    /// A suspended run is due now; false when it is not suspended (not
    /// ready) or due already.
    fn wake(&self, id: &str, now: i64) -> Result<bool>;
    /// Makes a run that is not running ready now with fresh attempts, its
    /// end (output, error, cancellation) forgotten: an operator's reset to
    /// a step. False when it is running or waiting behind its lane.
    fn reopen(&self, id: &str, now: i64) -> Result<bool>;
    /// Sets a claimed run's output; false when the claim no longer held.
    fn set_output(&self, id: &str, holder: &str, attempt: i64, output: &str) -> Result<bool>;
    /// The ids of `parent`'s children.
    fn children(&self, parent: &str) -> Result<Vec<String>>;
    /// Locks these runs' rows for the rest of the transaction, one after
    /// another in the order given, so their states do not change under a
    /// join's or an operator's look (PostgreSQL; one writer on SQLite has
    /// them already).
    fn lock_runs(&self, ids: &[String]) -> Result<()>;
    /// A debounced enqueue folded into the run `id` that holds its key, if
    /// it never started: its input becomes `input`, and it is due at
    /// `due_at` but at most `max_wait_ms` after it was created. One that
    /// started and waits again (a retry's backoff, a suspended workflow)
    /// gives the key up instead, for a new run.
    fn debounce(
        &self,
        id: &str,
        input: &str,
        due_at: i64,
        max_wait_ms: Option<i64>,
        now: i64,
    ) -> Result<Debounced>;
}

/// `reflexr_lanes`: the order of a rule's (or an enqueue's) scope — each
/// lane's head, and whether a dead run blocks it (invariant 6).
pub trait Lanes {
    /// The lane's head run and whether the lane is blocked.
    fn lane_head(&self, lane: &str) -> Result<Option<(String, bool)>>;
    /// Blocks or unblocks the lane; false when there is no such lane.
    fn set_blocked(&self, lane: &str, blocked: bool, now: i64) -> Result<bool>;
    /// The run `finished` (the lane's head) ended: the lane's next waiting
    /// run becomes its head and ready, or the lane goes (invariant 6).
    fn advance_lane(&self, lane: &str, finished: &str, now: i64) -> Result<()>;
    /// How many lanes are blocked behind a dead run.
    fn blocked_count(&self) -> Result<i64>;
}

// SQL both backends' statements share.

/// A duration in whole milliseconds, as the runs table keeps them.
pub(crate) fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The run's columns, in [`RunRow`]'s order.
pub(crate) const COLUMNS: &str = "ord, id, kind, action, workspace, rule, scope, lane, on_dead_letter, \
    input, event_seq, event_id, depth, state, attempt, max_attempts, backoff_ms, \
    backoff_max_ms, backoff_factor, jitter, due_at, claimed_by, claim_expires_at, checkpoint, \
    last_error, created_at, updated_at, finished_at, priority, unique_key, unique_mode, \
    started_at, cancel_requested_at, cancelled_by, cancel_reason, output, parent, began_seq, flow_key, traceparent";

/// The `SET` term for a run going back to waiting or ready (a retry, a
/// lapsed or released claim, an operator's revive): it gives its uniqueness
/// key up if another run took the key meanwhile — a `WhilePending` key is
/// free once its run starts, a `WhileActive` one once its run died — so the
/// run keeps its retry and the unique index is never broken. Without the
/// key it is an ordinary run; the other holds it.
pub(crate) const YIELD_KEY: &str = "unique_key = CASE \
       WHEN unique_mode = 'pending' AND EXISTS (SELECT 1 FROM reflexr_runs o \
         WHERE o.action = reflexr_runs.action AND o.unique_key = reflexr_runs.unique_key \
           AND o.unique_mode = 'pending' AND o.state IN ('waiting', 'ready') \
           AND o.ord <> reflexr_runs.ord) THEN NULL \
       WHEN unique_mode = 'active' AND EXISTS (SELECT 1 FROM reflexr_runs o \
         WHERE o.action = reflexr_runs.action AND o.unique_key = reflexr_runs.unique_key \
           AND o.unique_mode = 'active' AND o.state IN ('waiting', 'ready', 'running') \
           AND o.ord <> reflexr_runs.ord) THEN NULL \
       ELSE unique_key END";
