//! The [`Engine`]: the handle an application holds on one reflexr file.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::base::audit::AuditEntry;
use crate::base::dead_letter::DeadLetter;
use crate::base::durability::Synchronous;
use crate::base::error::{Error, HandlerError, Result};
use crate::base::event::{Appended, Event, NewEvent, Query};
use crate::base::limits;
use crate::core::changelog;
use crate::core::cursor::{self, ConsumerKind, CursorInfo};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::core::lease::{self, Lease, LeaseInfo};
use crate::core::wake::Subscription;
use crate::core::workspace::{self, WorkspaceInfo};
use crate::core::writer::WriterStats;
use crate::runtime::Service;
use crate::runtime::{self, Context, Drained};
use crate::store::DeadLetters;
#[cfg(feature = "postgres")]
use crate::store::Postgres;
use crate::store::Sqlite;
use crate::store::{self, sqlite::schema};
use crate::work::control::{self, ActionConfig, PausedInfo};
use crate::work::delivery::{self, ChannelPolicy, Delivery, Message};
use crate::work::follow::{self, Follow, FollowerInfo};
use crate::work::inspect::{
    self, BlockedLane, DeadLetterFilter, DeadLetterPage, EventPage, RunDetail, RunFilter, RunPage,
    RunsFeed,
};
use crate::work::operate::{self, RuleInfo};
use crate::work::prune::{Pruned, Retention};
use crate::work::queue::enqueue::{Enqueue, Enqueued};
use crate::work::queue::run::{Run, RunContext, RunInfo, RunState};
use crate::work::reaction::{self, Reaction};
use crate::work::rule::Rule;
use crate::work::schedule::{self, Job, ScheduleInfo};
use crate::work::stats::{self, Stats};

/// The handle on one reflexr file.
///
/// # About threads and cloning
///
/// `Engine` is a cheap handle: an [`Arc`] around the connection pool, the
/// writer and the clock. Clone it into every thread that needs it; all clones
/// share one writer, so their writes are committed together (DESIGN.md,
/// "Writes"). It is `Send + Sync`. The file is closed when the last clone is
/// dropped.
///
/// Several engines — in one process or several — may open the same file.
/// SQLite's lock arbitrates between them; reflexr waits for a busy file with
/// short, jittered sleeps, up to the busy timeout, instead of surfacing
/// `database is locked`.
pub struct Engine<B: Backend = Sqlite> {
    cx: Arc<Context<B>>,
    /// Shared by the handles, not by the engine's own threads: when the last
    /// handle goes, the threads are stopped and joined.
    _handles: Arc<LastHandle<B>>,
}

impl<B: Backend> Clone for Engine<B> {
    fn clone(&self) -> Self {
        Engine {
            cx: Arc::clone(&self.cx),
            _handles: Arc::clone(&self._handles),
        }
    }
}

struct LastHandle<B: Backend>(Arc<Context<B>>);

impl<B: Backend> Drop for LastHandle<B> {
    fn drop(&mut self) {
        runtime::close(&self.0);
    }
}

const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
    #[cfg(feature = "postgres")]
    assert_send_sync::<Engine<Postgres>>();
};

impl<B: Backend> std::fmt::Debug for Engine<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("database", &self.cx.db.describe())
            .field("holder_id", &self.db().settings().holder_id)
            .finish_non_exhaustive()
    }
}

/// What PostgreSQL does besides (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Engine<Postgres> {
    /// Runs `f` on a read-only transaction of its own, for the
    /// application's own queries (`Tx::query`) and the engine's reads
    /// (`Tx::read`, `Tx::cursor`): what SQLite's `with_reader` is on a
    /// file. A write in it fails with [`Error::ReadOnly`].
    pub fn with_reader<T>(&self, f: impl FnMut(&Tx<'_, Postgres>) -> Result<T>) -> Result<T> {
        self.cx.db.with_reader(f)
    }
}

/// What every backend does: workspaces, writes with the application's own
/// SQL, appends, reads, cursors, leases, waiting for commits.
impl<B: Backend> Engine<B> {
    pub(crate) fn db(&self) -> &B::Db {
        &self.cx.db
    }

    /// What operators did, newest first.
    pub fn audit_log(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.db()
            .read_with(&mut |c| crate::store::Audit::recent(c, limit))
    }

    /// Every cursor, with its lag.
    pub fn cursors(&self) -> Result<Vec<CursorInfo>> {
        self.db().read_with(&mut |c| cursor::list(c))
    }

    /// How many transactions the writer has committed, and how many callers'
    /// writes they held: with concurrent writers, several callers share one
    /// commit.
    pub fn writer_stats(&self) -> WriterStats {
        self.db().writer_stats()
    }

    pub(crate) fn from_context(cx: Context<B>) -> Engine<B> {
        let cx = Arc::new(cx);
        Engine {
            _handles: Arc::new(LastHandle(Arc::clone(&cx))),
            cx,
        }
    }

    /// The name this engine holds leases under.
    pub fn holder_id(&self) -> &str {
        &self.db().settings().holder_id
    }

    /// The engine's clock's current time, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.db().now_ms()
    }

    /// Creates a workspace.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] if it exists; [`Error::Invalid`] for a bad name.
    pub fn create_workspace(&self, name: &str) -> Result<()> {
        self.write(|tx| {
            let now = tx.now_ms();
            if workspace::create(tx.core(), now, name)? {
                Ok(())
            } else {
                Err(Error::AlreadyExists {
                    kind: "workspace",
                    name: name.into(),
                })
            }
        })
    }

    /// Creates the workspace if it does not exist, and registers `types` for
    /// it. Safe to call at every start.
    pub fn ensure_workspace(&self, name: &str, types: &[&str]) -> Result<()> {
        self.write(|tx| {
            let now = tx.now_ms();
            workspace::create(tx.core(), now, name)?;
            workspace::register_types(tx.core(), now, name, types)
        })
    }

    /// Registers event types a workspace accepts. Registering a type again is
    /// a no-op.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a missing workspace, [`Error::ReservedType`] for
    /// `RuleFired`/`RuleErrored`, [`Error::Invalid`] for a bad name. Nothing
    /// is registered when any type is refused.
    pub fn register_types(&self, workspace: &str, types: &[&str]) -> Result<()> {
        self.write(|tx| {
            let now = tx.now_ms();
            workspace::register_types(tx.core(), now, workspace, types)
        })
    }

    /// Every workspace, by name, with the types it accepts.
    pub fn workspaces(&self) -> Result<Vec<WorkspaceInfo>> {
        self.db().read_with(&mut |c| workspace::list(c))
    }

    /// Runs `f` in a write transaction and returns its value once committed.
    ///
    /// The closure gets a [`Tx`]: run the application's own SQL through it
    /// and append events with it, and all of it commits together or not at
    /// all (DESIGN.md, invariant 2). Return an error (or panic) and the
    /// closure's work is rolled back (the panic reaches this caller).
    ///
    /// Concurrent writers of this process share transactions (group commit):
    /// keep closures short, since the callers after you wait for them. The
    /// closure may run on the thread of another caller (the one committing
    /// the batch), so it must be `Send`; it may borrow from its caller, who
    /// waits until it has run.
    ///
    /// ```
    /// # fn main() -> reflexr::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db"))?;
    /// engine.ensure_workspace("shop", &["order.placed"])?;
    /// engine.write(|tx| tx.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT)", []))?;
    /// let seq = engine.write(|tx| {
    ///     tx.execute("INSERT INTO orders (id) VALUES (?1)", ["o-1"])?;
    ///     let at = tx.now_ms();
    ///     let ev = reflexr::NewEvent::new("order.placed", "order/o-1", "web", at);
    ///     Ok(tx.append("shop", &ev)?.seq)
    /// })?;
    /// assert!(seq > 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Whatever the closure returns, or the commit's error: [`Error::DiskFull`],
    /// [`Error::ReadOnly`], [`Error::Busy`] (another process held the file past
    /// the busy timeout), [`Error::TransactionAborted`].
    ///
    /// # Panics
    /// If called from inside a write closure of the same engine (it would wait
    /// for itself). Re-raises a panic of `f` after rolling its work back.
    pub fn write<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce(&mut Tx<'_, B>) -> Result<T> + Send,
        T: Send,
    {
        self.db().write_with(f)
    }

    /// [`Engine::write`] for closures with an error type of their own, which
    /// must be able to hold a reflexr [`Error`] (for the commit's).
    pub fn write_with<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, B>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.db().write_with(f)
    }

    /// Appends one event as a write of its own (shorthand for a
    /// [`Engine::write`] with one [`Tx::append`]).
    ///
    /// Called while this engine's other writes are under way, it shares
    /// their commit (group commit). On PostgreSQL, an append alone with no
    /// expected version (and no causation id to look up) is one statement
    /// sent outside any transaction block: it locks the log's head, takes
    /// the next seq, moves the head and notifies other processes in its
    /// own commit, one round trip.
    pub fn append(&self, workspace: &str, event: &NewEvent) -> Result<Appended> {
        // One INSERT at most, after checks and reads that write nothing.
        self.db().write_single(|tx| tx.append(workspace, event))
    }

    /// The events `query` asks for, in seq order (DESIGN.md, invariant 1: a
    /// reader after a seq sees every committed event after it, in order).
    pub fn read(&self, query: &Query) -> Result<Vec<Event>> {
        let up = &self.db().settings().upcasters;
        self.db()
            .read_with(&mut |c| changelog::read_upcast(c, query, up))
    }

    /// One event by seq.
    pub fn event(&self, seq: i64) -> Result<Option<Event>> {
        let mut event = self.db().read_with(&mut |c| changelog::event(c, seq))?;
        if let Some(e) = &mut event {
            self.db().settings().upcasters.apply(e);
        }
        Ok(event)
    }

    /// One event of `workspace` by its id.
    pub fn event_by_id(&self, workspace: &str, id: &str) -> Result<Option<Event>> {
        let mut event = self
            .db()
            .read_with(&mut |c| changelog::event_by_id(c, workspace, id))?;
        if let Some(e) = &mut event {
            self.db().settings().upcasters.apply(e);
        }
        Ok(event)
    }

    /// One subject's stream: up to `limit` (1 to [`Query::MAX_LIMIT`]) of
    /// `subject`'s events in `workspace` from version `from` on, in order
    /// (`from` 1, or 0, is the start). Read through the subject's index:
    /// its cost does not grow with the log. The last event's version is the
    /// one to expect in the next append ([`NewEvent::expect_version`]).
    ///
    /// ```
    /// # fn main() -> reflexr::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db"))?;
    /// # engine.ensure_workspace("shop", &["cart.item_added"])?;
    /// use reflexr::NewEvent;
    /// let add = |v| NewEvent::new("cart.item_added", "cart/7", "web", 1).expect_version(v);
    /// engine.append("shop", &add(0))?;
    /// engine.append("shop", &add(1))?;
    /// let stream = engine.read_subject("shop", "cart/7", 1, 100)?;
    /// assert_eq!(stream.iter().map(|e| e.version).collect::<Vec<_>>(), [1, 2]);
    /// // A writer that still thinks the cart is at version 1 conflicts.
    /// let stale = engine.append("shop", &add(1)).unwrap_err();
    /// assert_eq!(stale.actual_version(), Some(2));
    /// # Ok(()) }
    /// ```
    pub fn read_subject(
        &self,
        workspace: &str,
        subject: &str,
        from: i64,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let mut events = self
            .db()
            .read_with(&mut |c| changelog::read_subject(c, workspace, subject, from, limit))?;
        self.db().settings().upcasters.apply_all(&mut events);
        Ok(events)
    }

    /// `subject`'s version in `workspace`: its last event's
    /// [`Event::version`], 0 when it has none.
    pub fn subject_version(&self, workspace: &str, subject: &str) -> Result<i64> {
        self.db()
            .read_with(&mut |c| changelog::subject_version(c, workspace, subject))
    }

    /// A watch on the file's commits: [`Watch::wait`] returns when this
    /// process commits (at once) or another process does (within a
    /// heartbeat). For threads that follow the file (a live view).
    pub fn watch(&self) -> Watch {
        Watch {
            sub: self.db().subscribe(),
            heartbeat: self.db().settings().heartbeat,
        }
    }

    /// The highest seq ever assigned in the file (0 before the first append).
    pub fn head_seq(&self) -> Result<i64> {
        self.db().read_with(&mut |c| changelog::head(c))
    }

    /// Like [`Engine::read`], but when nothing is there yet, waits until
    /// something is or `timeout` passes (then returns an empty page).
    ///
    /// A commit through this engine (any clone) wakes the wait at once; a
    /// commit by another process is noticed within one heartbeat.
    pub fn wait_for_events(&self, query: &Query, timeout: Duration) -> Result<Vec<Event>> {
        query.validate()?;
        let deadline = Instant::now() + timeout;
        // Subscribed before the first read, so a commit in between wakes us.
        let sub = self.db().subscribe();
        loop {
            let page = self.read(query)?;
            if !page.is_empty() {
                return Ok(page);
            }
            if !sub.wait(self.db().settings().heartbeat, deadline) {
                return Ok(Vec::new());
            }
        }
    }

    /// The application consumer's cursor on `workspace` (0 if never saved).
    pub fn cursor(&self, consumer: &str, workspace: &str) -> Result<i64> {
        self.db()
            .read_with(&mut |c| cursor::load(c, workspace, ConsumerKind::App, consumer))
    }

    /// Moves the application consumer's cursor forward to `seq`. See
    /// [`Tx::save_cursor`] to save it with the consumer's own rows.
    pub fn save_cursor(&self, consumer: &str, workspace: &str, seq: i64) -> Result<()> {
        self.write(|tx| tx.save_cursor(consumer, workspace, seq))
    }

    /// Takes the lease `name` for this engine's holder id, for `ttl` (the
    /// engine's default if `None`). Taking a lease that expired or was
    /// released bumps its generation; taking one this holder already holds
    /// extends it.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] while another holder's lease is live.
    pub fn acquire_lease(&self, name: &str, ttl: Option<Duration>) -> Result<Lease> {
        let ttl = ttl.unwrap_or(self.db().settings().lease_ttl);
        let holder = self.db().settings().holder_id.clone();
        // Lease updates run apart from other writes: see `lease_apart`.
        self.lease_apart(|tx| lease::acquire(tx.core(), tx.now_ms(), name, &holder, ttl))
    }

    /// Extends a held lease by its TTL from now.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when it expired or another holder took it: stop
    /// acting under it.
    pub fn renew_lease(&self, lease: &Lease) -> Result<Lease> {
        self.lease_apart(|tx| lease::renew(tx.core(), tx.now_ms(), lease))
    }

    /// Gives a held lease up, so another holder can take it at once. False
    /// when it was no longer this holder's.
    pub fn release_lease(&self, lease: &Lease) -> Result<bool> {
        self.lease_apart(|tx| lease::release(tx.core(), tx.now_ms(), lease))
    }

    /// A lease update in a transaction of its own, never shared with other
    /// writes of this process: on PostgreSQL a transaction that locks both
    /// locks the head before a lease row (see the fence), and a lease update
    /// sharing a transaction with an append could take them the other way
    /// round and deadlock with another process's fenced write.
    fn lease_apart<T: Send>(
        &self,
        f: impl FnOnce(&mut Tx<'_, B>) -> Result<T> + Send,
    ) -> Result<T> {
        self.db().write_apart(f)
    }

    /// Every lease in the file.
    pub fn leases(&self) -> Result<Vec<LeaseInfo>> {
        self.db().read_with(&mut |c| lease::list(c))
    }

    // ----- actions and their runs (every backend) --------------------------

    /// Enqueues a run of an action as a write of its own: the run exists
    /// once this returns Ok (the same as an [`Engine::write`] with one
    /// [`Tx::enqueue`], but for the hand-over to an idle executor below).
    /// See [`Enqueue`].
    ///
    /// It appends nothing. On SQLite it goes through the one writer,
    /// sharing a commit with this engine's writes under way. On
    /// PostgreSQL, an enqueue without a scope, a uniqueness key or a
    /// debounce is one statement sent outside any transaction block: its
    /// own commit, in one round trip, with the notification that wakes
    /// other processes' executors in it (none for a run handed over
    /// below); it waits for no other write. Any
    /// other runs in a transaction of enqueues and deliveries, which begins
    /// without the log's head and so waits for no appending transaction of
    /// another process — or, while this engine's other writes are under
    /// way, shares theirs (one commit for all), which takes the head when
    /// any of them may append; so does an enqueue inside an
    /// [`Engine::write`] closure.
    ///
    /// On a started engine ([`Engine::start`]) with an executor waiting
    /// for work, an enqueue without a scope, a uniqueness key, a debounce
    /// or a parent, due at once, of an action registered here that is
    /// neither paused nor limited, has its run claimed for that executor
    /// in the enqueue's own commit (its first attempt), and the executor
    /// may start it as soon as that commits, before this returns: one
    /// durable commit from the call to the handler, where the enqueue's and
    /// then the executor's claim were two. Such a run starts without a
    /// claim's ordering: it may start before ready runs of a higher
    /// priority, or due earlier, that no executor has claimed yet (as a
    /// rule's firing handed over does). Every other run waits for a claim,
    /// as an enqueue in a transaction does.
    ///
    /// ```
    /// # fn main() -> reflexr::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db"))?;
    /// use reflexr::{Enqueue, Unique};
    /// let first = engine.enqueue(
    ///     &Enqueue::new("rebuild-search-index", &serde_json::json!({ "shard": 3 }))
    ///         .unique("shard/3", Unique::WhilePending),
    /// )?;
    /// let again = engine.enqueue(
    ///     &Enqueue::new("rebuild-search-index", &serde_json::json!({ "shard": 3 }))
    ///         .unique("shard/3", Unique::WhilePending),
    /// )?;
    /// assert!(again.deduplicated && again.id == first.id);
    /// # Ok(()) }
    /// ```
    pub fn enqueue(&self, e: &Enqueue) -> Result<Enqueued> {
        runtime::enqueue(&self.cx, e)
    }

    /// Waits until the run ends (succeeded, dead, discarded or cancelled) or
    /// `timeout` passes, and returns it as it stands then (check its
    /// `state`). Woken by this process's settlements at once; looks again
    /// every heartbeat for other processes' (on PostgreSQL, where the
    /// heartbeat sees appends only, a settlement elsewhere shows at the
    /// next look).
    ///
    /// # Errors
    /// [`Error::NotFound`] for a run the database does not have.
    pub fn wait_for_run(&self, id: &str, timeout: Duration) -> Result<RunInfo> {
        let deadline = Instant::now() + timeout;
        let heartbeat = self.db().settings().heartbeat;
        let _waiting = self.db().run_waiter();
        let sub = self.db().subscribe();
        loop {
            let run = self.run(id)?.ok_or_else(|| Error::not_found("run", id))?;
            let ended = matches!(
                run.state,
                RunState::Succeeded | RunState::Dead | RunState::Discarded | RunState::Cancelled
            );
            let now = Instant::now();
            if ended || now >= deadline {
                return Ok(run);
            }
            sub.wait(heartbeat, deadline.min(now + heartbeat));
        }
    }

    /// A run's output ([`crate::RunContext::set_output`]), decoded: none
    /// until it succeeded with one.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a run the database does not have;
    /// [`Error::Decode`] for an output that does not fit `T`.
    pub fn run_output<T: serde::de::DeserializeOwned>(&self, id: &str) -> Result<Option<T>> {
        let run = self.run(id)?.ok_or_else(|| Error::not_found("run", id))?;
        run.output
            .as_deref()
            .map(|o| {
                serde_json::from_str(o).map_err(|e| Error::Decode {
                    what: format!("output of run {id}"),
                    seq: None,
                    message: e.to_string(),
                })
            })
            .transpose()
    }

    /// A workflow run's timeline: the steps it recorded, in the order its
    /// handler reached them — where it began, each step with its attempt,
    /// time and output, and what a waiting step waits for (a sleep's time,
    /// a wait's event and timeout, a join's runs). Empty for a run that is
    /// not a workflow.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a run the database does not have.
    pub fn run_steps(&self, id: &str) -> Result<Vec<crate::inspect::StepInfo>> {
        self.db()
            .read_with(&mut |c| crate::work::queue::workflow::timeline(c, id))
    }

    /// Sets an action's default priority and limits, kept in the file so
    /// every process obeys them (see [`ActionConfig`]); replaces what was
    /// set before. An operator's change goes through
    /// [`crate::Operator::configure_action`], on the record.
    pub fn configure_action(&self, config: &ActionConfig) -> Result<()> {
        self.write(|tx| control::configure(tx.core(), config, tx.now_ms()))
    }

    /// Every action's settings kept in the file.
    pub fn action_configs(&self) -> Result<Vec<ActionConfig>> {
        self.db().read_with(&mut |c| control::configs(c))
    }

    /// Up to `limit` lines of a run's log ([`RunContext::log`]) after line
    /// `after` (0: from the first), in the order they were logged, across
    /// its attempts. A run that is not there, or logged nothing, has none.
    pub fn run_logs(&self, id: &str, after: i64, limit: usize) -> Result<Vec<crate::RunLog>> {
        Ok(self
            .db()
            .read_with(&mut |c| crate::store::Steps::run_logs(c, id, after, limit))?
            .into_iter()
            .map(crate::RunLog::from)
            .collect())
    }

    /// How far a run's handler last said it got ([`RunContext::progress`]).
    pub fn run_progress(&self, id: &str) -> Result<Option<crate::RunProgress>> {
        Ok(self
            .db()
            .read_with(&mut |c| crate::store::Steps::run_progress(c, id))?
            .map(crate::RunProgress::from))
    }

    /// Sets one key's limits and weight for a keyed action (see
    /// [`crate::KeyLimits`]), replacing what the key had; every process
    /// obeys them from its next claim. Recorded in the audit log with the
    /// operator `application`; an operator's change goes through
    /// [`crate::Operator::set_key_limits`], with their name and reason.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad key or limit, or an action that has no
    /// keys (configure it [`ActionConfig::fair`] or with
    /// [`ActionConfig::partition_by`] first).
    pub fn set_key_limits(&self, action: &str, limits: &crate::KeyLimits) -> Result<()> {
        self.write(|tx| {
            control::set_key_limits(
                tx.core(),
                action,
                limits,
                tx.now_ms(),
                "application",
                "Engine::set_key_limits",
            )
        })
    }

    /// The keys of `action` that have limits or a weight of their own.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a name that is not an action's.
    pub fn key_limits(&self, action: &str) -> Result<Vec<crate::KeyLimits>> {
        Ok(self
            .db()
            .read_with(&mut |c| control::key_limits(c, Some(action)))?
            .into_iter()
            .map(|(_, k)| k)
            .collect())
    }

    /// The keys of a keyed action that have unfinished runs or overrides:
    /// each one's runs waiting, ready and running, and the limits that hold
    /// for it, by key.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a name that is not an action's.
    pub fn action_keys(&self, action: &str) -> Result<Vec<crate::KeyInfo>> {
        self.db().read_with(&mut |c| control::keys(c, action))
    }

    /// Registers a rule with this engine, and with the database: a rule new
    /// to it starts at its [`crate::Start`] position; a rule it knows at
    /// a lower version gets what its [`crate::OnNewVersion`] says; a known
    /// rule continues where it stopped. Register every rule before
    /// [`Engine::start`].
    ///
    /// # Errors
    /// [`Error::Invalid`] for a rule missing its types, action or decision,
    /// watching a reserved type, moved to another workspace, or registered
    /// after start; [`Error::NotFound`] for a missing workspace.
    pub fn register_rule(&self, rule: Rule) -> Result<()> {
        rule.validate()?;
        if self.cx.is_started() {
            return Err(Error::invalid(
                "rule",
                format!("{}: rules are registered before Engine::start", rule.name),
            ));
        }
        if rule.shadow.is_some() {
            let shadow = rule.as_shadow();
            self.write(|tx| operate::register_shadow(tx.core(), tx.now_ms(), &shadow))?;
            self.cx
                .registry_mut()
                .rules
                .insert(shadow.name.clone(), Arc::new(shadow));
            return Ok(());
        }
        self.write(|tx| operate::register_rule(tx.core(), tx.now_ms(), &rule))?;
        self.cx
            .registry_mut()
            .rules
            .insert(rule.name.clone(), Arc::new(rule));
        Ok(())
    }

    /// The rules the database knows, with their cursors and lag.
    pub fn rules(&self) -> Result<Vec<RuleInfo>> {
        let registered: Vec<String> = self.cx.registry().rules.keys().cloned().collect();
        self.db()
            .read_with(&mut |c| operate::rule_infos(c, &registered))
    }

    /// A rule's state for one scope, decoded (None: the scope has none yet).
    pub fn rule_state<S: serde::de::DeserializeOwned>(
        &self,
        rule: &str,
        scope: &str,
    ) -> Result<Option<S>> {
        let json = self
            .db()
            .read_with(&mut |c| store::Rules::state(c, rule, scope))?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| Error::Decode {
                what: format!("state of rule {rule}, scope {scope}"),
                seq: None,
                message: e.to_string(),
            })
        })
        .transpose()
    }

    /// Registers a delivery channel: its policy ([`ChannelPolicy::Retried`]
    /// or [`ChannelPolicy::BestEffort`]) and the sender that sends one
    /// message. A process enqueues deliveries only on channels it registered
    /// (the policy is stored on each delivery) and sends only those.
    pub fn register_channel<F>(&self, channel: &str, policy: ChannelPolicy, sender: F) -> Result<()>
    where
        F: Fn(&Message, &mut RunContext<'_, B>) -> std::result::Result<(), HandlerError>
            + Send
            + Sync
            + 'static,
    {
        limits::check_name("channel", channel)?;
        policy.retry().validate()?;
        self.db()
            .channels()
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(channel.to_string(), policy.retry());
        self.cx.registry_mut().add_action(
            &delivery::action_of(channel),
            delivery::action(Arc::new(sender)),
        );
        Ok(())
    }

    /// Enqueues a delivery in a transaction of its own (shorthand for a
    /// [`Engine::write`] with one [`Tx::deliver`]). Like
    /// [`Engine::enqueue`], it appends nothing and says so: on PostgreSQL,
    /// unless it shares a transaction with this engine's writes that may
    /// append, it waits for no appending transaction.
    pub fn deliver(&self, delivery: &Delivery) -> Result<Enqueued> {
        self.db().write_quiet(|tx| tx.deliver(delivery))
    }

    /// Registers a reaction (see [`Reaction`]): the loop will hand it each
    /// new event of its types, in the transaction that moves its cursor. A
    /// reaction new to the database starts at its [`crate::Start`] position.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a reaction without types or handler;
    /// [`Error::NotFound`] for a missing workspace.
    pub fn register_reaction(&self, reaction: Reaction<B>) -> Result<()> {
        reaction.validate()?;
        self.write(|tx| reaction::register(tx.core(), tx.now_ms(), &reaction))?;
        self.cx
            .registry_mut()
            .reactions
            .insert(reaction.name.clone(), Arc::new(reaction));
        self.db().nudge();
        Ok(())
    }

    /// Registers a scheduled job (see [`Job`]). A job the database knows with
    /// the same schedule keeps its next due time; a new or changed one is due
    /// from now; an interval of zero switches it off.
    pub fn register_job(&self, job: Job<B>) -> Result<()> {
        job.validate()?;
        self.write(|tx| schedule::register(tx.core(), tx.now_ms(), &job))?;
        let handler = job.handler.clone().expect("validated");
        let mut reg = self.cx.registry_mut();
        reg.add_action(&schedule::action_of(&job.name), schedule::action(handler));
        reg.jobs.insert(job.name.clone(), Arc::new(job));
        Ok(())
    }

    /// Every scheduled job the database knows, with its next due time.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.db().read_with(&mut |c| {
            store::Schedules::schedule_rows(c)?
                .into_iter()
                .map(ScheduleInfo::from_row)
                .collect()
        })
    }

    /// True when this process registered the rule `name`.
    pub(crate) fn registers_rule(&self, name: &str) -> bool {
        self.cx.registry().rules.contains_key(name)
    }

    /// What is paused, by whom and why.
    pub fn paused(&self) -> Result<Vec<PausedInfo>> {
        self.db().read_with(&mut |c| control::paused(c))
    }

    /// Wakes this process's threads (something they wait on changed).
    pub(crate) fn nudge_all(&self) {
        self.db().nudge();
    }

    /// Tells this process's executors that something was paused.
    pub(crate) fn tell_paused(&self) {
        self.cx.claims().paused();
    }

    /// Tells a handler working here that its run was cancelled.
    pub(crate) fn tell_cancelled(&self, id: &str) {
        self.cx.claims().cancel(&[id.to_string()]);
    }

    /// Counters and gauges for export: totals kept in the database (decisions,
    /// firings, errors, runs' outcomes, reactions, deliveries), runs by
    /// state, open dead letters by kind, every cursor's lag, followers'
    /// counters, and this process's writer. See [`Stats`].
    pub fn stats(&self) -> Result<Stats> {
        let followers = runtime::followers(&self.cx)?;
        stats::collect(self.db(), followers)
    }

    /// A page of the events `query` asks for — its types and its subject —
    /// looked for among at most [`crate::limits::SCAN_WINDOW`] events of its
    /// workspace after its `after`, so a rare subject in a long log costs a
    /// bounded read per page. Go on from the page's `next_after`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a workspace the file does not have.
    pub fn events_page(&self, query: &Query) -> Result<EventPage> {
        self.db().read_with(&mut |c| inspect::events_page(c, query))
    }

    /// A page of the runs `filter` matches, newest first, looked for among
    /// at most [`crate::limits::SCAN_WINDOW`] runs (go on from the page's `next`).
    pub fn find_runs(&self, filter: &RunFilter) -> Result<RunPage> {
        self.db().read_with(&mut |c| inspect::find_runs(c, filter))
    }

    /// The next run changes of `feed`, at most `limit` (1 to
    /// [`crate::limits::MAX_PAGE`]), oldest first; moves `feed` past them (on an
    /// error it stays). The admin stream's `runs` topic; see [`RunsFeed`]
    /// for what it gives on each backend.
    pub fn runs_feed(&self, feed: &mut RunsFeed<B>, limit: usize) -> Result<Vec<RunInfo>> {
        self.db()
            .read_with(&mut |c| inspect::runs_feed(c, feed, limit))
    }

    /// Dead letters with an id after `after` (resolved ones too), oldest
    /// first: a feed of new dead letters.
    pub fn dead_letters_after(&self, after: i64, limit: usize) -> Result<Vec<DeadLetter>> {
        self.db()
            .read_with(&mut |c| inspect::dead_letters_after(c, after, limit))
    }

    /// One run with the event that fired it and the events it emitted.
    pub fn run_detail(&self, id: &str) -> Result<Option<RunDetail>> {
        self.db().read_with(&mut |c| inspect::run_detail(c, id))
    }

    /// The scopes held behind a dead run, most recently blocked first, at
    /// most `limit` (1 to [`crate::limits::MAX_PAGE`]).
    pub fn blocked_lanes(&self, limit: usize) -> Result<Vec<BlockedLane>> {
        self.db()
            .read_with(&mut |c| inspect::blocked_lanes(c, limit))
    }

    /// A page of the dead letters `filter` matches, newest first.
    pub fn find_dead_letters(&self, filter: &DeadLetterFilter) -> Result<DeadLetterPage> {
        self.db()
            .read_with(&mut |c| inspect::find_dead_letters(c, filter))
    }

    /// The followers in the ledger, with their cursors and counters
    /// (published, dead letters, stops).
    pub fn followers(&self) -> Result<Vec<FollowerInfo>> {
        runtime::followers(&self.cx)
    }

    /// Deletes events every cursor has passed and finished work, older than
    /// `retention` (see [`Retention`]), in short batches. Reports what it
    /// removed.
    pub fn prune(&self, retention: &Retention) -> Result<Pruned> {
        crate::work::prune::prune::<B>(&self.cx.db, retention, &mut |_| {})
    }

    /// [`Engine::prune`], calling `progress` with the running totals after
    /// every batch (for a progress bar).
    pub fn prune_with_progress(
        &self,
        retention: &Retention,
        mut progress: impl FnMut(Pruned),
    ) -> Result<Pruned> {
        crate::work::prune::prune::<B>(&self.cx.db, retention, &mut progress)
    }

    /// Has `service` stop with the engine: [`Engine::shutdown`] (and the
    /// last handle's drop) calls its [`Service::stop`] first, before the
    /// engine's own threads stop. The engine keeps only a weak reference:
    /// a service dropped before is simply forgotten. For what runs beside
    /// the engine on threads of its own — the administration server of
    /// `reflexr-admin` does this.
    pub fn add_service(&self, service: &Arc<dyn Service>) {
        self.cx.add_service(service);
    }

    /// The runtime context every handle shares.
    pub(crate) fn context(&self) -> &Context<B> {
        &self.cx
    }

    /// Registers a projection under `name`, for followers to use: it gets
    /// each source envelope and returns the event to publish (it will carry
    /// the envelope's id), `None` to bridge nothing, or an error (the
    /// envelope is dead-lettered). `"same"`, which publishes every envelope as
    /// it is, is registered by every engine.
    pub fn register_projection<F>(&self, name: &str, projection: F) -> Result<()>
    where
        F: Fn(&Event) -> std::result::Result<Option<NewEvent>, HandlerError>
            + Send
            + Sync
            + 'static,
    {
        limits::check_name("projection", name)?;
        self.cx
            .registry_mut()
            .projections
            .insert(name.to_string(), Arc::new(projection));
        // A follower waiting for it relays now.
        self.db().nudge();
        Ok(())
    }

    /// Creates a follower (or updates its target and projection) in the
    /// ledger; returns its name. Any engine on this file that has the
    /// projection registered relays for it, one at a time (its lease): in
    /// [`Engine::run_until_idle`], and in a thread of its own after
    /// [`Engine::start`].
    ///
    /// # Errors
    /// [`Error::NotFound`] for a missing source workspace, or a PostgreSQL
    /// target this process has not registered.
    pub fn follow(&self, follow: Follow) -> Result<String> {
        if let Some(pg) = &follow.target_postgres
            && !self.cx.registers_pg_target(pg)
        {
            return Err(Error::not_found("postgres target", pg));
        }
        let name = self.write(|tx| follow::register(tx, &follow))?;
        // The follower thread, which waits for appends only while there
        // are followers, relays now.
        self.db().nudge();
        Ok(name)
    }

    /// Registers a PostgreSQL database (feature `postgres`) as the target
    /// `name` that followers publish into with [`Follow::to_postgres`]: an
    /// edge's file relayed into a hub over the network. `config` is a libpq
    /// connection string or a `postgresql://` URL; it stays in this
    /// process (the file's ledger keeps only `name`), so register it at
    /// every start, like projections. The engine connects when a follower
    /// first publishes, and creates the engine's tables there if missing;
    /// while the server is out of reach, the follower tries again every
    /// third of the lease TTL and its cursor waits.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name or a config that does not parse.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn register_postgres_target(&self, name: &str, config: &str) -> Result<()> {
        limits::check_name("postgres target", name)?;
        config
            .parse::<postgres::Config>()
            .map_err(|e| Error::invalid("postgres config", e.to_string()))?;
        self.cx.register_pg_target(name, config);
        self.db().nudge();
        Ok(())
    }

    /// Where the database is: the file's path, or the PostgreSQL server
    /// and database (`host:port/dbname`, never the password).
    pub fn location(&self) -> String {
        self.cx.db.describe()
    }

    /// Registers the handler of an action: what runs when a rule with this
    /// action fires. This process's executors claim only runs of actions it
    /// has registered. The handler runs at least once per run (invariant 5):
    /// use [`Run::id`] as the idempotency key towards the outside world.
    ///
    /// Do not capture the `Engine` in a handler (the engine would keep itself
    /// open); use the [`RunContext`] it is given.
    pub fn register_action<F>(&self, name: &str, handler: F) -> Result<()>
    where
        F: Fn(&Run, &mut RunContext<'_, B>) -> std::result::Result<(), HandlerError>
            + Send
            + Sync
            + 'static,
    {
        limits::check_name("action", name)?;
        self.cx.registry_mut().add_action(name, Arc::new(handler));
        Ok(())
    }

    /// Registers the handler of a batch action: executors hand it up to
    /// `max` claimed runs of the action at once (those of one claim), each
    /// with its own [`RunContext`] ([`RunContext::run`] is the run), and it
    /// returns one outcome per run, in their order — one bulk call for a
    /// hundred deliveries. Each run settles by its own outcome: one that
    /// failed is retried or dead-lettered by its policy alone, and the
    /// others complete (invariant 5 holds per run: each is handled at least
    /// once). A panic, or a number of outcomes other than the number of
    /// runs, fails the attempt of every run of the call. The claim, the
    /// limits, the keys and the pacing are those of any action; a batch's
    /// runs are timed as the call's duration shared among them.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db")).unwrap();
    /// engine
    ///     .register_batch_action("send-mail", 100, |batch| {
    ///         // One call for the whole batch; here, every address but
    ///         // "bounce@example.com" is taken.
    ///         batch
    ///             .iter()
    ///             .map(|ctx| {
    ///                 let to: String = ctx.run().input()?;
    ///                 if to == "bounce@example.com" {
    ///                     return Err("the address bounced".into());
    ///                 }
    ///                 Ok(())
    ///             })
    ///             .collect()
    ///     })
    ///     .unwrap();
    /// ```
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name or a `max` of 0.
    pub fn register_batch_action<F>(&self, name: &str, max: usize, handler: F) -> Result<()>
    where
        F: Fn(&mut [RunContext<'_, B>]) -> Vec<std::result::Result<(), HandlerError>>
            + Send
            + Sync
            + 'static,
    {
        limits::check_name("action", name)?;
        if max == 0 {
            return Err(Error::invalid("max", "a batch takes at least 1 run"));
        }
        self.cx
            .registry_mut()
            .add_batch_action(name, max, Arc::new(handler));
        Ok(())
    }

    /// Starts the engine's threads: the loop (reactions, scheduled jobs and
    /// pruning, under the `loop` lease), an evaluator per workspace with
    /// rules (under its evaluator lease), the followers' thread (each
    /// follower under its own lease), `executors` executor threads and the
    /// claim renewer. They run until [`Engine::shutdown`] or until the last
    /// handle is dropped. Register rules, actions, reactions, jobs, channels
    /// and projections first: rules cannot be added once started.
    ///
    /// # Errors
    /// [`Error::Invalid`] if already started; [`Error::Io`] if a thread
    /// cannot be spawned.
    pub fn start(&self) -> Result<()> {
        runtime::start(&self.cx)
    }

    /// Stops the threads: they take no new work, finish the handler they are
    /// in, give back runs claimed but not started, and are joined; then
    /// every lease this engine holds (the loop's, the evaluators', the
    /// followers') is released, so another process takes over at once. The
    /// engine stays usable (and can be started again).
    pub fn shutdown(&self) {
        runtime::shutdown(&self.cx);
    }

    /// Does the threads' work in this thread until nothing is ready: decides
    /// every new event (for the workspaces whose evaluator lease this engine
    /// holds or can take) and runs every due run, repeatedly, since runs emit
    /// events and events fire runs. Runs waiting for a retry's backoff are not
    /// due until the clock passes it: move a [`crate::ManualClock`] and call
    /// again.
    pub fn run_until_idle(&self) -> Result<Drained> {
        runtime::run_until_idle(&self.cx)
    }

    /// Runs in `state`, oldest due first (or all runs, oldest first, if None),
    /// at most `limit`.
    pub fn runs(&self, state: Option<RunState>, limit: usize) -> Result<Vec<RunInfo>> {
        self.db()
            .read_with(&mut |c| operate::list_runs(c, state, limit))
    }

    /// One run.
    pub fn run(&self, id: &str) -> Result<Option<RunInfo>> {
        self.db().read_with(&mut |c| operate::run_info(c, id))
    }

    /// Dead letters, oldest first: the open ones, or all with
    /// `include_resolved`.
    pub fn dead_letters(&self, include_resolved: bool, limit: usize) -> Result<Vec<DeadLetter>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.db()
            .read_with(&mut |c| DeadLetters::list(c, include_resolved, 0, limit))
    }
}

impl Engine<Sqlite> {
    /// The file this engine opened.
    pub fn path(&self) -> &Path {
        self.cx.db.path()
    }

    /// The durability level commits use.
    pub fn synchronous(&self) -> Synchronous {
        self.cx.db.settings().synchronous
    }

    // ----- workspaces -------------------------------------------------------

    // ----- writing ----------------------------------------------------------

    // ----- reading ----------------------------------------------------------

    /// Runs `f` on a pooled read connection, for the application's own
    /// queries. The connection is `query_only`: it cannot write. It sees what
    /// was committed when `f`'s first statement ran, and never blocks the
    /// writer. `f` may run more than once if the file is busy.
    pub fn with_reader<T>(&self, f: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        self.cx.db.read(f)
    }

    // ----- control of the work ----------------------------------------------

    // ----- cursors ----------------------------------------------------------

    // ----- leases -----------------------------------------------------------

    // ----- rules and actions ----------------------------------------------

    // ----- maintenance ------------------------------------------------------

    /// Reads every page of the file (`PRAGMA quick_check`).
    ///
    /// # Errors
    /// [`Error::Corrupt`] with SQLite's findings.
    pub fn check_integrity(&self) -> Result<()> {
        self.cx.db.read(schema::quick_check)
    }
}

/// A watch on a file's commits, from [`Engine::watch`].
pub struct Watch {
    sub: Subscription,
    heartbeat: Duration,
}

impl Watch {
    /// Waits until something may have been committed since the last wait —
    /// by this process (woken at once) or another (noticed within the
    /// heartbeat) — or `timeout` passes. True for a commit, false for the
    /// timeout. A wake-up may be spurious: read to see what changed.
    pub fn wait(&self, timeout: Duration) -> bool {
        self.sub.wait(self.heartbeat, Instant::now() + timeout)
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod handoff_tests {
    //! The handoff (`work::queue::handoff`), driven step by step: an
    //! evaluator's firing, or a plain enqueue, claims its run for a parked
    //! executor in its own commit, and the executor's turn runs it with no
    //! claim.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::runtime;
    use crate::{
        ActionConfig, Decision, Engine, Enqueue, ManualClock, NewEvent, Pausable, Rule, RunOrder,
        RunState, Unique,
    };

    fn engine(dir: &tempfile::TempDir, ordering: RunOrder) -> (Engine, Arc<AtomicUsize>) {
        engine_on(dir, ordering, ManualClock::new(1_800_000_000_000))
    }

    /// [`engine`] on `clock`, which the test keeps to move time.
    fn engine_on(
        dir: &tempfile::TempDir,
        ordering: RunOrder,
        clock: ManualClock,
    ) -> (Engine, Arc<AtomicUsize>) {
        let e = Engine::builder(dir.path().join("h.db"))
            .clock(clock)
            .holder_id("here")
            .open()
            .unwrap();
        e.ensure_workspace("app", &["job"]).unwrap();
        e.register_rule(
            Rule::new("jobs", "app")
                .on(["job"])
                .ordering(ordering)
                .action("work")
                .decide(|_| Ok(Decision::Fire(serde_json::Value::Null))),
        )
        .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        e.register_action("work", move |_, _| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        (e, ran)
    }

    fn job(e: &Engine, subject: &str) {
        e.append("app", &NewEvent::new("job", subject, "app", 0))
            .unwrap();
    }

    #[test]
    fn a_firing_claims_its_run_for_a_parked_executor_in_its_own_commit() {
        // Invariant 5 (one claim at a time) with one commit fewer: the run
        // is running under this holder's first attempt once the firing
        // commits, and the executor's turn runs and settles it.
        let dir = tempfile::tempdir().unwrap();
        let (e, ran) = engine(&dir, RunOrder::Scope);
        let cx = &e.cx;
        let handoff = cx.handoff();
        handoff.park(0);
        job(&e, "a");
        runtime::evaluate_step(cx, "app", true).unwrap();
        assert_eq!(handoff.idle(), 0, "the parked executor's slot was taken");
        let handed = handoff.take(0, 10);
        assert_eq!(handed.len(), 1);
        let run = e.run(&handed[0].row.id).unwrap().unwrap();
        assert_eq!(run.state, RunState::Running);
        assert_eq!(run.attempt, 1);
        let done = runtime::execute_step(cx, Some(0), handed).unwrap();
        assert_eq!((done.claimed, done.succeeded), (1, 1));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(e.run(&run.id).unwrap().unwrap().state, RunState::Succeeded);
    }

    #[test]
    fn no_run_is_handed_without_a_parked_executor_nor_when_it_would_not_be_claimed_at_once() {
        // Invariants 6 and 14: a run behind its lane's head stays waiting,
        // and a paused action's run is not claimed, at its insert either.
        let dir = tempfile::tempdir().unwrap();
        let (e, _) = engine(&dir, RunOrder::Scope);
        let cx = &e.cx;
        let handoff = cx.handoff();
        // Nobody parked: the run is ready, for a claim.
        job(&e, "a");
        runtime::evaluate_step(cx, "app", true).unwrap();
        assert!(handoff.take(0, 10).is_empty());
        // Behind the lane's head (still ready): waiting, and the slot
        // goes back.
        handoff.park(0);
        job(&e, "a");
        runtime::evaluate_step(cx, "app", true).unwrap();
        assert!(handoff.take(0, 10).is_empty());
        assert_eq!(handoff.idle(), 1);
        assert_eq!(e.runs(Some(RunState::Waiting), 10).unwrap().len(), 1);
        // A drain's evaluation hands nothing, whoever is parked.
        job(&e, "b");
        runtime::evaluate_step(cx, "app", false).unwrap();
        assert!(handoff.take(0, 10).is_empty());
        // A paused action's runs wait for the claim, which holds them back.
        let op = e.operator("ops", "test").unwrap();
        op.pause(&Pausable::Action("work".into())).unwrap();
        job(&e, "c");
        runtime::evaluate_step(cx, "app", true).unwrap();
        assert!(handoff.take(0, 10).is_empty());
        assert_eq!(handoff.idle(), 1);
        assert_eq!(e.runs(Some(RunState::Ready), 10).unwrap().len(), 3);
    }

    #[test]
    fn an_enqueue_claims_its_run_for_a_parked_executor_in_its_own_commit() {
        // Invariant 5 (one claim at a time) with one commit fewer, from an
        // `Engine::enqueue`: its run is running under this holder's first
        // attempt once the call returns, and the executor's turn runs and
        // settles it.
        let dir = tempfile::tempdir().unwrap();
        let (e, ran) = engine(&dir, RunOrder::None);
        let cx = &e.cx;
        let handoff = cx.handoff();
        handoff.park(0);
        let watch = e.watch();
        while watch.wait(Duration::from_millis(1)) {}
        let made = e.enqueue(&Enqueue::new("work", &1)).unwrap();
        assert_eq!(handoff.idle(), 0, "the parked executor's slot was taken");
        // The commit woke no executor, but a watch of every commit.
        assert!(watch.wait(Duration::from_millis(1)));
        let handed = handoff.take(0, 10);
        assert_eq!(handed.len(), 1);
        assert_eq!(handed[0].row.id, made.id);
        let run = e.run(&made.id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Running, 1));
        assert_eq!(run.claimed_by.as_deref(), Some("here"));
        let done = runtime::execute_step(cx, Some(0), handed).unwrap();
        assert_eq!((done.claimed, done.succeeded), (1, 1));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(e.run(&made.id).unwrap().unwrap().state, RunState::Succeeded);
    }

    #[test]
    fn an_enqueue_hands_nothing_due_later_keyed_unknown_limited_or_paused_nor_without_a_parked_executor()
     {
        // Invariants 5 and 14: only a run an executor here would claim at
        // once is claimed at its insert; every other waits for the claim,
        // and a reserved place hears that none comes.
        let dir = tempfile::tempdir().unwrap();
        let (e, _) = engine(&dir, RunOrder::None);
        let cx = &e.cx;
        let handoff = cx.handoff();
        // Nobody parked.
        e.enqueue(&Enqueue::new("work", &1)).unwrap();
        assert!(handoff.take(0, 10).is_empty());
        handoff.park(0);
        // Due later; holding a key; of an action no executor here runs.
        e.enqueue(&Enqueue::new("work", &2).after(Duration::from_secs(60)))
            .unwrap();
        e.enqueue(&Enqueue::new("work", &3).unique("k", Unique::WhilePending))
            .unwrap();
        e.enqueue(&Enqueue::new("elsewhere", &4)).unwrap();
        // Of a limited action; of a paused one.
        e.configure_action(&ActionConfig::new("work").max_running(4))
            .unwrap();
        e.enqueue(&Enqueue::new("work", &5)).unwrap();
        e.configure_action(&ActionConfig::new("work")).unwrap();
        let op = e.operator("ops", "test").unwrap();
        op.pause(&Pausable::Action("work".into())).unwrap();
        e.enqueue(&Enqueue::new("work", &6)).unwrap();
        assert!(handoff.take(0, 10).is_empty());
        assert_eq!(handoff.idle(), 1);
        assert_eq!(e.runs(Some(RunState::Running), 10).unwrap().len(), 0);
        assert_eq!(e.runs(Some(RunState::Ready), 10).unwrap().len(), 6);
    }

    #[test]
    fn a_run_handed_over_late_is_given_back_not_started_beside_its_next_claim() {
        use crate::Clock;
        // Invariant 5 (one claim at a time): a hand-over that reaches its
        // executor after a third of a lease is not started on its old claim. Kept
        // by its holder, it goes back and is claimed again; lapsed and run
        // by another claim meanwhile, it is not run a second time.
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_800_000_000_000);
        let (e, ran) = engine_on(&dir, RunOrder::None, clock.clone());
        let cx = &e.cx;
        // Twenty seconds late, its thirty-second claim still ours: given
        // back, then claimed again in the same turn, and run once.
        cx.handoff().park(0);
        let made = e.enqueue(&Enqueue::new("work", &1)).unwrap();
        let handed = cx.handoff().take(0, 10);
        assert_eq!(handed.len(), 1);
        clock.advance(Duration::from_secs(20));
        let done = runtime::execute_step(cx, Some(0), handed).unwrap();
        assert_eq!((done.claimed, done.succeeded), (1, 1));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        let run = e.run(&made.id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Succeeded, 1));
        assert_eq!(run.started_at, Some(clock.now_ms()), "claimed again");
        // Lapsed, and run by the claim that rescued it: not run again.
        cx.handoff().park(0);
        let made = e.enqueue(&Enqueue::new("work", &2)).unwrap();
        let handed = cx.handoff().take(0, 10);
        assert_eq!(handed.len(), 1);
        clock.advance(Duration::from_secs(31));
        e.run_until_idle().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        runtime::execute_step(cx, Some(0), handed).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2, "not run a second time");
        let run = e.run(&made.id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
        // One late beside one on time: the one on time starts on its claim.
        let mut handed = Vec::new();
        let mut made = Vec::new();
        for (n, after) in [(3, 20), (4, 5)] {
            cx.handoff().park(0);
            made.push(e.enqueue(&Enqueue::new("work", &n)).unwrap().id);
            handed.extend(cx.handoff().take(0, 10));
            clock.advance(Duration::from_secs(after));
        }
        assert_eq!(handed.len(), 2);
        let on_time = e.run(&made[1]).unwrap().unwrap().started_at;
        assert_ne!(on_time, Some(clock.now_ms()));
        runtime::execute_step(cx, Some(0), handed).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        let late = e.run(&made[0]).unwrap().unwrap();
        assert_eq!((late.state, late.attempt), (RunState::Succeeded, 1));
        assert_eq!(late.started_at, Some(clock.now_ms()), "claimed again");
        let kept = e.run(&made[1]).unwrap().unwrap();
        assert_eq!(
            (kept.state, kept.started_at),
            (RunState::Succeeded, on_time)
        );
        // Late at a shutdown: given back, and nothing claimed instead.
        cx.handoff().park(0);
        let made = e.enqueue(&Enqueue::new("work", &5)).unwrap();
        let handed = cx.handoff().take(0, 10);
        clock.advance(Duration::from_secs(20));
        cx.stop.store(true, Ordering::SeqCst);
        let done = runtime::execute_step(cx, Some(0), handed).unwrap();
        cx.stop.store(false, Ordering::SeqCst);
        assert_eq!(done.claimed, 0);
        let run = e.run(&made.id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Ready, 0));
        assert_eq!(ran.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn a_run_handed_and_not_started_by_shutdown_goes_back_unattempted() {
        // Invariant 5 at a shutdown: a handed run the executors did not
        // take goes back to ready with its attempt given back.
        let dir = tempfile::tempdir().unwrap();
        let (e, ran) = engine(&dir, RunOrder::None);
        let cx = &e.cx;
        cx.handoff().park(0);
        job(&e, "a");
        runtime::evaluate_step(cx, "app", true).unwrap();
        let handed = cx.handoff().take(0, 10);
        assert_eq!(handed.len(), 1);
        cx.stop.store(true, Ordering::SeqCst);
        runtime::execute_step(cx, Some(0), handed).unwrap();
        cx.stop.store(false, Ordering::SeqCst);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        let run = &e.runs(Some(RunState::Ready), 10).unwrap()[0];
        assert_eq!(run.attempt, 0);
        e.run_until_idle().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}

#[cfg(test)]
mod follow_tests {
    //! A follower's turn, driven one at a time (`runtime::follow_step`).

    use std::time::Duration;

    use crate::runtime;
    use crate::work::follow::same_event;
    use crate::{Engine, Follow, ManualClock, NewEvent};

    /// ADR-0015, stop against dead letter, with a target file whose
    /// transaction fails as a whole (busy: another connection holds its
    /// write lock): a batch that begins with an envelope to dead-letter
    /// records the dead letter and the stop, at the first publish, in one
    /// turn (the stop was missed by that turn, and made by the next one
    /// after a second wait on the busy target). Invariants 8 and 3: the
    /// cursor stops before the envelope not published, and after the
    /// restart each of the rest arrives once.
    #[test]
    fn a_target_failing_a_whole_batch_stops_the_follower_at_its_first_publish_in_one_turn() {
        let dir = tempfile::tempdir().unwrap();
        let hub_path = dir.path().join("hub.db");
        let hub = Engine::open(&hub_path).unwrap();
        hub.ensure_workspace("fleet", &["reading"]).unwrap();
        let e = Engine::builder(dir.path().join("edge.db"))
            .clock(ManualClock::new(1_800_000_000_000))
            .busy_timeout(Duration::from_millis(50))
            .open()
            .unwrap();
        e.ensure_workspace("edge", &["reading"]).unwrap();
        e.register_projection("all-but-the-first", |ev| {
            if ev.subject == "reading/0" {
                return Err("cannot map the first reading".into());
            }
            Ok(Some(same_event(ev)))
        })
        .unwrap();
        e.follow(
            Follow::new("edge", "fleet")
                .to_file(&hub_path)
                .projection("all-but-the-first"),
        )
        .unwrap();
        // A first turn opens the hub (nothing to relay yet).
        assert_eq!(runtime::follow_step(&e.cx).unwrap(), 0);
        for i in 0..3 {
            e.append(
                "edge",
                &NewEvent::new("reading", format!("reading/{i}"), "edge", 0),
            )
            .unwrap();
        }

        let holder = rusqlite::Connection::open(&hub_path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        assert_eq!(
            runtime::follow_step(&e.cx).unwrap(),
            1,
            "past the dead letter"
        );
        let f = &e.followers().unwrap()[0];
        assert_eq!((f.cursor, f.dead_letters, f.published), (1, 1, 0), "{f:?}");
        assert_eq!(f.stops, 1, "stopped in this turn: {f:?}");
        assert!(f.stopped_here);
        assert!(f.last_error.as_deref().unwrap().contains("busy"), "{f:?}");

        // Restarted once the lock is gone: the rest arrive.
        holder.execute_batch("ROLLBACK").unwrap();
        e.operator("ops", "hub free again")
            .unwrap()
            .restart_follower("edge-to-fleet")
            .unwrap();
        e.run_until_idle().unwrap();
        let f = &e.followers().unwrap()[0];
        assert_eq!((f.cursor, f.published, f.stops), (3, 2, 1), "{f:?}");
        assert_eq!(hub.head_seq().unwrap(), 2);
    }
}
