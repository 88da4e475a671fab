//! The one seam every layer above the store names a backend through:
//! [`Backend`], a sealed trait whose associated types are the backend's
//! connection inside a transaction (the table groups of `crate::store`
//! implemented on it), what its writer guards that transaction with, and
//! its open database ([`CoreDb`]: pool, writer, wake-ups, clock,
//! settings). Each backend is a folder with the same file list at each
//! layer — `store::sqlite` and `core::sqlite`, `store::postgres` and
//! `core::postgres` (feature `postgres`) — and only those folders (and the
//! facade) name it.
//!
//! And the caller's side of a write: [`Tx`], which a backend's writer hands
//! each closure, and the environment it consults ([`Env`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::base::clock::Clock;
use crate::base::error::{Error, Result};
use crate::base::event::{AppendCondition, Appended, Event, NewEvent, Query};
use crate::base::retry::RetryPolicy;
use crate::base::telemetry::Op;
use crate::core::changelog::{self, Origin};
use crate::core::cursor::{self, ConsumerKind};
use crate::core::lease::{self, Lease};
use crate::core::settings::{Limits, Settings};
use crate::core::wake::{Subscription, WaitsHint, Wake};
use crate::core::writer::WriterStats;
use crate::store::Batched;
use crate::store::control::insert_handed;
use crate::store::runs::{Inserted, NewRun, RunRow};
use crate::store::{Runs, Sqlite, Work};

pub(crate) mod sealed {
    /// Only this crate's backends are backends.
    pub trait Sealed {}
}

/// A database the engine runs on: [`crate::Sqlite`] (the default) and,
/// with the feature `postgres`, `Postgres`. Sealed: its items are the
/// engine's, named here so that the engine, its handles and their handlers
/// are generic over it (`Engine<B>`, `Tx<'_, B>`, `RunContext<'_, B>`).
pub trait Backend: sealed::Sealed + Send + Sync + Sized + 'static {
    /// A connection inside a transaction (what a [`crate::Tx`] holds).
    #[doc(hidden)]
    type Conn: Work;
    /// What the writer keeps beside the connection to guard its
    /// transaction (SQLite's authorizer and control statements).
    #[doc(hidden)]
    type Guard;
    /// The open database.
    #[doc(hidden)]
    type Db: CoreDb<Self>;
    /// Whether its feed of run changes follows transactions (a
    /// `"tx:…"` position) rather than change times.
    #[doc(hidden)]
    const FEEDS_BY_TRANSACTION: bool;
    /// Whether each statement is a round trip to a server: the evaluator
    /// then writes a batch's firings a few statements for many (on a file,
    /// each firing's statements in turn cost less).
    #[doc(hidden)]
    const STATEMENTS_ARE_ROUND_TRIPS: bool;
    /// Where and how to open it (a file's path and pool; a connection
    /// string), as a [`crate::Builder`] holds it.
    #[doc(hidden)]
    type Options: Clone + Send + Sync;
    /// Opens the database.
    #[doc(hidden)]
    fn open_db(
        options: &Self::Options,
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self::Db>;
    /// What a connection keeps of a transaction besides its rows, as it
    /// stood when a savepoint was made: restored by a rollback to it.
    #[doc(hidden)]
    type Mark: Copy;
    /// Makes the engine's nested savepoint (see `Tx::nested`); returns
    /// what [`Backend::rollback_nested`] needs to undo it.
    #[doc(hidden)]
    fn begin_nested(conn: &Self::Conn, guard: &Self::Guard) -> Result<Self::Mark>;
    /// Rolls back to the nested savepoint made at `mark`.
    #[doc(hidden)]
    fn rollback_nested(conn: &Self::Conn, guard: &Self::Guard, mark: Self::Mark) -> Result<()>;
    /// Releases the nested savepoint.
    #[doc(hidden)]
    fn release_nested(conn: &Self::Conn, guard: &Self::Guard) -> Result<()>;
}

/// A thread waiting for runs to end, counted while it lives.
pub struct RunWaiter<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> RunWaiter<'a> {
    /// Counts one more waiter on `count` until dropped.
    pub(crate) fn new(count: &'a std::sync::atomic::AtomicUsize) -> RunWaiter<'a> {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        RunWaiter(count)
    }
}

impl Drop for RunWaiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the facade's methods that work on every backend (workspaces,
/// appends, reads, cursors, leases, waiting for commits) ask of an open
/// database: SQLite's [`Db`], and PostgreSQL's `PgDb` (feature `postgres`).
pub trait CoreDb<B: Backend>: Send + Sync {
    fn settings(&self) -> &Settings;
    /// The engine's clock.
    fn clock(&self) -> &Arc<dyn Clock>;
    /// The SQLite VFS the database was opened through, if not the default
    /// (a file opened for a follower's target uses the same).
    fn vfs(&self) -> Option<&str> {
        None
    }
    /// The engine clock's time, in ms since the epoch.
    fn now_ms(&self) -> i64;
    /// Runs `f` on a reading connection.
    fn read_with<T>(&self, f: &mut dyn FnMut(&B::Conn) -> Result<T>) -> Result<T>;
    /// Runs `f` in a write transaction, and returns its value once committed.
    fn write_with<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, B>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send;
    /// Runs `f` in a write transaction that other writers of this process
    /// do not share, where the database lets transactions run side by side
    /// (PostgreSQL: its own connection; the server merges concurrent
    /// commits' flushes itself). On SQLite, whose one writer runs one
    /// transaction at a time, the same as [`CoreDb::write_with`]. For the
    /// executors' rounds (heavy, appending little), and for what must not
    /// share a transaction that appends: lease updates and claim renewals
    /// (on PostgreSQL the shared write holds the log's head from its BEGIN;
    /// see `core::postgres::db`). A closure here that appends takes the head first
    /// (`Events::lock_head`).
    fn write_apart<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, B>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.write_with(f)
    }
    /// [`CoreDb::write_with`] for work that writes with one statement at
    /// most, and fails only before it or by that statement's own failure
    /// (a single append): a backend may share its transaction without a
    /// savepoint of its own. SQLite does (it undoes a failed statement);
    /// so does PostgreSQL, where no input makes an append's statement fail
    /// (a statement that fails there anyway aborts the whole transaction,
    /// and the batch fails: see `PgDb::write_single`).
    fn write_single<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, B>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.write_with(f)
    }
    /// [`CoreDb::write_with`] for work that appends nothing (an enqueue, a
    /// delivery): where writers run side by side, a batch of such work
    /// alone need not take the log's head, and waits for no appender
    /// (PostgreSQL; see `PgDb::write_quiet`). On SQLite, whose one writer
    /// runs one transaction at a time, the same as [`CoreDb::write_with`].
    fn write_quiet<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, B>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.write_with(f)
    }
    /// Inserts a ready run that takes no lane and holds no key (a plain
    /// `Engine::enqueue`: one statement makes it) as a write of its own,
    /// and wakes the executors once it committed. A backend may send it
    /// outside any transaction block, as its own commit (PostgreSQL: one
    /// round trip, with its notification in it; see `PgDb::insert_run_alone`);
    /// the default is a [`CoreDb::write_quiet`] of the insert.
    fn insert_run_alone(&self, run: &NewRun<'_>) -> Result<Inserted> {
        self.write_quiet(|tx| {
            let inserted = Runs::insert(tx.core(), run)?;
            if inserted == Inserted::New {
                tx.mark_runs();
            }
            Ok(inserted)
        })
    }
    /// [`CoreDb::insert_run_alone`] with the run handed over at its insert
    /// (`store::control::insert_handed`) to an idle executor of this
    /// process, if `reserve` reserves that executor's place — asked once
    /// the write holds its connection and its lock, so the place waits for
    /// no more than the statement and its commit — and its action may be:
    /// what the insert did, and the run if it is claimed (the caller sends
    /// it to that executor), under this process's holder for a lease's
    /// length from then. The executors are woken only for a run inserted
    /// and not claimed. A backend may send it as its own commit
    /// (PostgreSQL); the default is a [`CoreDb::write_quiet`].
    fn insert_run_alone_handed(
        &self,
        run: &NewRun<'_>,
        reserve: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Inserted, Option<RunRow>)> {
        self.write_quiet(|tx| {
            let (inserted, claimed) = if reserve() {
                let holder = tx.settings().holder_id.clone();
                let expires_at = tx.now_ms() + tx.settings().lease_ttl_ms();
                let (inserted, _, claimed) = insert_handed(tx.core(), run, &holder, expires_at)?;
                (inserted, claimed)
            } else {
                (Runs::insert(tx.core(), run)?, None)
            };
            match (&inserted, &claimed) {
                (Inserted::New, None) => tx.mark_runs(),
                (Inserted::New, Some(_)) => tx.mark_commit(),
                _ => {}
            }
            Ok((inserted, claimed))
        })
    }
    /// A subscription to every commit of this process that made
    /// something (see [`Db::subscribe`]).
    fn subscribe(&self) -> Subscription {
        self.subscribe_to(Wake::ALL)
    }
    /// A subscription to the commits that made what `wake` names (and to
    /// whatever cannot say what it made: the heartbeat's change, another
    /// process's commit on SQLite).
    fn subscribe_to(&self, wake: Wake) -> Subscription;
    /// Whether workflows may wait for an event (see [`WaitsHint`]): the
    /// executors' looks keep it, and an append wakes them while it says so.
    fn waits_hint(&self) -> &WaitsHint;
    /// The writer's counters.
    fn writer_stats(&self) -> WriterStats;
    /// The channels this process may enqueue deliveries on, with the retry
    /// policy each delivery is stored with.
    fn channels(&self) -> &RwLock<BTreeMap<String, crate::base::retry::RetryPolicy>>;
    /// Wakes every waiting thread of this process, whatever it waits for.
    fn nudge(&self);
    /// Wakes the threads of this process that wait for what `made` names.
    fn nudge_for(&self, made: Wake);
    /// Counts a thread waiting for runs to end, while the guard lives. The
    /// waiter takes it (and subscribes) before it reads the run.
    fn run_waiter(&self) -> RunWaiter<'_>;
    /// Whether a thread of this process waits for runs to end (settlements
    /// nudge only then). Asked after the settlement commits, never inside
    /// its transaction: a waiter that read the run unended is counted by
    /// then, one that came in between the question and the commit would not
    /// be (see `work::queue::execute`'s `wake_run_waiters`).
    fn has_run_waiters(&self) -> bool;
    /// What the database is, for logs and operators: SQLite's file path,
    /// PostgreSQL's connection without its password.
    fn describe(&self) -> String;
    /// Ends what the open database keeps beside its connections once the
    /// engine's threads stopped (PostgreSQL's listener); nothing on SQLite,
    /// whose connections close when the last handle drops them.
    fn close(&self) {}
}

/// What a write consults besides its connection: the engine's clock and
/// settings, and the delivery channels this process registered (with the
/// retry policy each delivery is stored with).
pub struct Env {
    pub clock: Arc<dyn Clock>,
    pub settings: Settings,
    pub channels: RwLock<BTreeMap<String, RetryPolicy>>,
}

/// A write in progress, handed to the closure of [`crate::Engine::write`].
///
/// Everything done through it — the application's own SQL through
/// [`Tx::conn`] or [`Tx::execute`], appends, cursor saves, fencing checks —
/// commits together or not at all (DESIGN.md, invariant 2). If the closure
/// returns an error or panics, all of its work is rolled back; other callers'
/// work that shares the transaction is not affected.
///
/// The transaction belongs to the engine: `COMMIT`, `END`, `ROLLBACK`,
/// `BEGIN`, the engine's `reflexr_*` savepoints, `ATTACH`/`DETACH` and
/// setting the pragmas the engine relies on (`journal_mode`, `synchronous`,
/// `foreign_keys`, …) are refused before they run, with
/// [`crate::Error::StatementRefused`]. Savepoints of your own are fine.
///
/// `Tx` is [`Tx<'_, Sqlite>`](Sqlite) unless said otherwise; an engine on
/// PostgreSQL (feature `postgres`) hands out `Tx<'_, Postgres>`, whose
/// `execute` and `query` run the application's SQL on PostgreSQL. What the
/// engine does through a `Tx` — appends, cursors, fencing — is the same on
/// both.
pub struct Tx<'a, B: Backend = Sqlite> {
    conn: &'a B::Conn,
    guard: &'a B::Guard,
    env: &'a Env,
    /// What the transaction made that others react to (events, runs): its
    /// commit wakes this process's threads that wait for it.
    nudge: Wake,
    /// An append's expectation or a condition failed in this write: it
    /// commits nothing even if the closure went on and returned Ok
    /// (invariant 13).
    conflict: Option<Error>,
}

impl<'a, B: Backend> Tx<'a, B> {
    /// Runs `f` in a savepoint of its own inside this transaction: if `f`
    /// fails, only its writes are rolled back (and on PostgreSQL, the seqs
    /// it took are given back, so the log stays dense). For the engine's
    /// batches that commit several independent units together.
    pub(crate) fn nested<T, E: From<Error>>(
        &mut self,
        f: impl FnOnce(&mut Tx<'a, B>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let (conn, guard) = (self.conn, self.guard);
        let mark = B::begin_nested(conn, guard)?;
        let outer = self.conflict.take();
        let mut result = f(self);
        if let Some(conflict) = std::mem::replace(&mut self.conflict, outer)
            && result.is_ok()
        {
            result = Err(E::from(conflict));
        }
        if result.is_err() {
            B::rollback_nested(conn, guard, mark)?;
        }
        B::release_nested(conn, guard)?;
        result
    }

    pub(crate) fn new(conn: &'a B::Conn, guard: &'a B::Guard, env: &'a Env) -> Tx<'a, B> {
        Tx {
            conn,
            guard,
            env,
            nudge: Wake::NONE,
            conflict: None,
        }
    }

    /// The conflict that spoils this write, if an append's expectation or
    /// a condition failed in it: the writer fails the write with it.
    pub(crate) fn take_conflict(&mut self) -> Option<Error> {
        self.conflict.take()
    }

    /// Notes a conflict in `result`, so the write cannot commit without it.
    fn note<T>(&mut self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result
            && e.is_append_conflict()
        {
            self.conflict = Some(e.clone());
        }
        result
    }

    /// The connection, as the core's table groups see it.
    pub(crate) fn core(&self) -> &'a B::Conn {
        self.conn
    }

    pub(crate) fn wants_nudge(&self) -> Wake {
        self.nudge
    }

    pub(crate) fn env(&self) -> &'a Env {
        self.env
    }

    /// The limits on what the engine stores.
    pub(crate) fn limits(&self) -> Limits {
        self.env.settings.limits
    }

    pub(crate) fn settings(&self) -> &crate::core::settings::Settings {
        &self.env.settings
    }

    /// Records that the engine made runs claimable through this
    /// transaction (or changed runs that threads wait for), so its commit
    /// wakes the executors and those threads. Appends note their events
    /// themselves.
    pub(crate) fn mark_runs(&mut self) {
        self.nudge = self.nudge.with(Wake::RUNS);
    }

    /// Marks that this commit made what no thread of the engine waits for
    /// (a run handed over at its insert): it wakes only the watches of
    /// every commit ([`Wake::COMMITS`]).
    pub(crate) fn mark_commit(&mut self) {
        self.nudge = self.nudge.with(Wake::COMMITS);
    }

    /// The engine clock's current time, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.env.clock.now_ms()
    }

    /// Appends `event` to `workspace`'s log.
    ///
    /// # Errors
    /// - [`crate::Error::NotFound`]: the workspace does not exist, or has not
    ///   registered the event's type.
    /// - [`crate::Error::ReservedType`]: the type is one only the engine appends.
    /// - [`crate::Error::Invalid`] / [`crate::Error::Encode`]: a malformed field
    ///   or payload.
    /// - [`crate::Error::AppendConflict`]: the event's expectation of its
    ///   subject's version ([`NewEvent::expect`]) does not hold. The whole
    ///   write then commits nothing, even if the closure goes on and
    ///   returns Ok (DESIGN.md, invariant 13).
    ///
    /// Appending an id the workspace already has appends nothing and reports
    /// the existing seq with `existing: true` (invariant 3). Several appends
    /// in one write, to one subject or several, commit all or none.
    pub fn append(&mut self, workspace: &str, event: &NewEvent) -> Result<Appended> {
        let appended = self.append_as(workspace, event, Origin::App);
        self.note(appended)
    }

    /// Checks that no event matching `condition` came after its position,
    /// in this write's transaction: the appends made after the check commit
    /// only if none did, as nothing else can append meanwhile (a
    /// conditional append across subjects).
    ///
    /// ```
    /// # fn main() -> reflexr::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db"))?;
    /// # engine.ensure_workspace("booking", &["seat.booked"])?;
    /// use reflexr::{AppendCondition, NewEvent};
    /// let seen = engine.head_seq()?; // what the decision read up to
    /// let cond = AppendCondition::new("booking")
    ///     .types(["seat.booked"])
    ///     .field("seat", "12A")
    ///     .after(seen);
    /// engine.write(|tx| {
    ///     tx.check(&cond)?;
    ///     let at = tx.now_ms();
    ///     let ev = NewEvent::new("seat.booked", "booking/1", "web", at)
    ///         .payload(&serde_json::json!({ "seat": "12A" }));
    ///     tx.append("booking", &ev)
    /// })?;
    /// // A second booking of 12A decided from the same position conflicts.
    /// let again = engine.write(|tx| tx.check(&cond));
    /// assert!(again.unwrap_err().is_append_conflict());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::AppendConflict`] with the first matching event's
    /// seq; the write then commits nothing, as for an expected version.
    /// [`crate::Error::Invalid`] for a malformed condition.
    ///
    /// Its cost is a look through the events after the position (of the
    /// subject's, through its index, when the condition names a subject):
    /// keep the position recent.
    pub fn check(&mut self, condition: &AppendCondition) -> Result<()> {
        let checked =
            changelog::check_condition(self.conn, condition, &self.env.settings.upcasters);
        self.note(checked)
    }

    /// `subject`'s events in `workspace` from version `from` on, as
    /// [`crate::Engine::read_subject`] reads them, inside this transaction.
    pub fn read_subject(
        &self,
        workspace: &str,
        subject: &str,
        from: i64,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let mut events = changelog::read_subject(self.conn, workspace, subject, from, limit)?;
        self.env.settings.upcasters.apply_all(&mut events);
        Ok(events)
    }

    /// `subject`'s version in `workspace` as this transaction sees it (0:
    /// no events yet).
    pub fn subject_version(&self, workspace: &str, subject: &str) -> Result<i64> {
        changelog::subject_version(self.conn, workspace, subject)
    }

    /// Appends as `origin` says (the engine's own events, a run's).
    pub(crate) fn append_as(
        &mut self,
        workspace: &str,
        event: &NewEvent,
        origin: Origin,
    ) -> Result<Appended> {
        let now = self.now_ms();
        let telemetry = &self.env.settings.telemetry;
        if !telemetry.on() || matches!(origin, Origin::Engine { .. }) {
            // The engine's own bookkeeping events make no spans.
            let appended = changelog::append(
                self.conn,
                now,
                self.limits(),
                workspace,
                event,
                origin,
                None,
            )?;
            if !appended.existing {
                self.nudge = self.nudge.with(Wake::EVENTS);
            }
            return Ok(appended);
        }
        let mut span = telemetry.start(Op::Append {
            workspace,
            event_type: &event.event_type,
            parent: event.traceparent.as_deref(),
        });
        // The event carries its append's span: what decides on it, and
        // what relays it, are that span's children.
        let traceparent = span.traceparent();
        let appended = changelog::append(
            self.conn,
            now,
            self.limits(),
            workspace,
            event,
            origin,
            traceparent.as_deref(),
        );
        match &appended {
            Ok(a) => {
                span.appended(&a.id, a.seq, a.existing);
                if !a.existing {
                    telemetry.appended(workspace);
                }
            }
            Err(e) => span.fail(crate::base::telemetry::error_type(e), &e.to_string()),
        }
        let appended = appended?;
        if !appended.existing {
            self.nudge = self.nudge.with(Wake::EVENTS);
        }
        Ok(appended)
    }

    /// Appends the engine's own `events` (each at its [`Origin::Engine`]
    /// depth; they make no spans) to `workspace`'s log, in order, in as few
    /// statements as the backend can ([`changelog::append_all`]): what each
    /// did, or which was refused and why ([`Batched`]).
    pub(crate) fn append_all_as(
        &mut self,
        workspace: &str,
        events: &[(NewEvent, Origin)],
    ) -> Batched<Appended> {
        debug_assert!(
            events
                .iter()
                .all(|(_, o)| matches!(o, Origin::Engine { .. }))
        );
        let now = self.now_ms();
        let appended = changelog::append_all(self.conn, now, self.limits(), workspace, events)?;
        if appended.iter().any(|a| !a.existing) {
            self.nudge = self.nudge.with(Wake::EVENTS);
        }
        Ok(appended)
    }

    /// Moves the application consumer `consumer`'s cursor on `workspace` to
    /// `seq`, in this transaction: the rows the consumer wrote for the events
    /// it handled commit with the cursor's advance.
    ///
    /// # Errors
    /// [`crate::Error::CursorBackwards`] when `seq` is behind the saved position
    /// (invariant 8), [`crate::Error::CursorAhead`] when it is past the last
    /// seq ever assigned.
    pub fn save_cursor(&mut self, consumer: &str, workspace: &str, seq: i64) -> Result<()> {
        let now = self.now_ms();
        cursor::save(
            self.conn,
            now,
            (workspace, ConsumerKind::App, consumer),
            seq,
        )
    }

    /// Reads events as [`crate::Engine::read`] does, inside this
    /// transaction: it sees what the transaction wrote so far (a reaction's
    /// handler, say, reading the log before it enqueues).
    pub fn read(&self, query: &Query) -> Result<Vec<Event>> {
        changelog::read_upcast(self.conn, query, &self.env.settings.upcasters)
    }

    /// The application consumer's cursor as this transaction sees it.
    pub fn cursor(&self, consumer: &str, workspace: &str) -> Result<i64> {
        cursor::load(self.conn, workspace, ConsumerKind::App, consumer)
    }

    /// Checks, in this transaction, that `lease` is still held: same holder,
    /// same generation, not expired by the engine's clock. Call it first in a
    /// write made under a lease; if it fails, return the error and nothing of
    /// the write commits (invariant 7).
    ///
    /// # Errors
    /// [`crate::Error::LeaseLost`].
    pub fn fence(&mut self, lease: &Lease) -> Result<()> {
        lease::fence(self.conn, self.now_ms(), lease)
    }
}
