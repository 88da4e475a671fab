//! The [`Engine`] handle and its [`EngineBuilder`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use r2d2::Pool;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;

use crate::claims::Claims;
use crate::clock::{Clock, SystemClock};
use crate::cursor::{self, ConsumerKind, CursorInfo, Reset};
use crate::dead_letter::DeadLetter;
use crate::delivery::{self, ChannelPolicy, Delivery, Message};
use crate::error::{Error, Result};
use crate::event::{Appended, Event, NewEvent, Query};
use crate::follow::{self, Follow, FollowerInfo};
use crate::lease::{self, DEFAULT_LEASE_TTL, Lease, LeaseInfo};
use crate::log;
use crate::notify::Notifier;
use crate::operate::{self, RuleInfo, RuleReset};
use crate::prune::{self, Pruned, Retention};
use crate::reaction::{self, Reaction};
use crate::registry::Registry;
use crate::rule::{HandlerError, Rule};
use crate::run::{Run, RunContext, RunInfo, RunState};
use crate::runtime::{self, Idle, Runtime};
use crate::schedule::{self, Job, ScheduleInfo};
use crate::stats::Stats;
use crate::store::audit::{self, AuditEntry};
use crate::store::conn::{self, Role, Synchronous};
use crate::store::dead_letters;
use crate::store::{events, leases, schema};
use crate::tx::Tx;
use crate::workspace::{self, WorkspaceInfo};
use crate::writer::{Writer, WriterStats};

/// Settings fixed when the engine opens.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub synchronous: Synchronous,
    pub busy_timeout: Duration,
    pub heartbeat: Duration,
    pub max_payload_bytes: usize,
    pub lease_ttl: Duration,
    pub holder_id: String,
    pub executors: usize,
    pub claim_batch: usize,
    pub evaluate_batch: usize,
    pub max_chain_depth: i64,
    pub retention: Option<Retention>,
}

/// What every clone of an [`Engine`] shares.
pub(crate) struct Shared {
    pub path: PathBuf,
    pub clock: Arc<dyn Clock>,
    pub config: Config,
    pub pool: Pool<SqliteConnectionManager>,
    pub writer: Writer,
    pub notifier: Arc<Notifier>,
    pub registry: RwLock<Registry>,
    /// Claims on runs whose handlers are working, for the renewer.
    pub claims: Claims,
    /// The evaluator leases this engine holds, by workspace.
    pub leases: Mutex<HashMap<String, Lease>>,
    pub runtime: Mutex<Option<Runtime>>,
    pub stop: AtomicBool,
    /// When the loop last pruned (engine clock).
    pub last_prune: Mutex<i64>,
    /// Followers stopped in this engine until restarted, with the ledger's
    /// count of restart requests when they stopped: a request from any
    /// process moves the count, and the follower starts again.
    pub stopped_followers: Mutex<HashMap<String, i64>>,
    /// When each follower that could not take its lease may try again.
    pub follower_retry: Mutex<HashMap<String, i64>>,
    /// Engines on the target files of cross-file followers, by path.
    pub targets: Mutex<HashMap<String, Engine>>,
}

impl Shared {
    /// Runs `f` on a pooled read connection. Reads never block the writer (WAL)
    /// and cannot write (`query_only`). A read that meets a busy file is
    /// repeated until the busy timeout.
    pub(crate) fn read<T>(&self, mut f: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        conn::retry_busy(self.config.busy_timeout, || {
            let c = self.pool.get()?;
            f(&c)
        })
    }

    /// How long a run's claim lasts unless renewed.
    pub(crate) fn claim_ttl_ms(&self) -> i64 {
        i64::try_from(self.config.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// True once shutdown has begun: workers take no new work.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(crate) fn write<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.writer.write(self, f)
    }
}

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
#[derive(Clone)]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
    /// Shared by the handles, not by the engine's own threads: when the last
    /// handle goes, the threads are stopped and joined.
    _handles: Arc<LastHandle>,
}

struct LastHandle(Arc<Shared>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        runtime::shutdown(&self.0);
        runtime::release_leases(&self.0);
    }
}

const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
};

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("path", &self.shared.path)
            .field("holder_id", &self.shared.config.holder_id)
            .finish_non_exhaustive()
    }
}

/// Opens an [`Engine`] with settings other than the defaults.
///
/// # Defaults
///
/// | setting | default |
/// | --- | --- |
/// | [`synchronous`](EngineBuilder::synchronous) | [`Synchronous::Full`] |
/// | [`clock`](EngineBuilder::clock) | [`SystemClock`] |
/// | [`create_if_missing`](EngineBuilder::create_if_missing) | `true` |
/// | [`pool_size`](EngineBuilder::pool_size) | 4 read connections |
/// | [`busy_timeout`](EngineBuilder::busy_timeout) | 30 s |
/// | [`heartbeat`](EngineBuilder::heartbeat) | 50 ms |
/// | [`lease_ttl`](EngineBuilder::lease_ttl) | 30 s ([`DEFAULT_LEASE_TTL`]) |
/// | [`max_payload_bytes`](EngineBuilder::max_payload_bytes) | 1 MiB |
/// | [`holder_id`](EngineBuilder::holder_id) | `pid<pid>-<8 random hex digits>` |
/// | [`verify_on_open`](EngineBuilder::verify_on_open) | `false` |
/// | [`executors`](EngineBuilder::executors) | 2 threads |
/// | [`claim_batch`](EngineBuilder::claim_batch) | 16 runs per claim |
/// | [`evaluate_batch`](EngineBuilder::evaluate_batch) | 500 events per rule and batch |
/// | [`max_chain_depth`](EngineBuilder::max_chain_depth) | 8 |
/// | [`retention`](EngineBuilder::retention) | none: nothing is pruned automatically |
#[derive(Clone)]
pub struct EngineBuilder {
    path: PathBuf,
    clock: Arc<dyn Clock>,
    create: bool,
    pool_size: u32,
    verify: bool,
    config: Config,
}

impl EngineBuilder {
    /// How hard a commit waits for the disk. Default [`Synchronous::Full`]: a
    /// committed event survives power loss. [`Synchronous::Normal`] is an
    /// opt-in that keeps commits safe from a process crash only.
    pub fn synchronous(mut self, s: Synchronous) -> Self {
        self.config.synchronous = s;
        self
    }

    /// Where time comes from. Default [`SystemClock`]; tests pass a
    /// [`crate::ManualClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    pub(crate) fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Whether a missing file is created. Default `true`. With `false`, a
    /// missing file is [`Error::Missing`] (the CLI opens this way).
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// How many read connections the pool keeps (1 to 64). Default 4.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n;
        self
    }

    /// How long a write waits for another process's lock, and a read for a
    /// busy file, before failing with [`Error::Busy`]. Default 30 s.
    pub fn busy_timeout(mut self, t: Duration) -> Self {
        self.config.busy_timeout = t;
        self
    }

    /// How often a waiting thread checks for commits made by other processes
    /// (`PRAGMA data_version`). Commits made through this engine wake waiters
    /// at once regardless. Default 50 ms.
    pub fn heartbeat(mut self, t: Duration) -> Self {
        self.config.heartbeat = t;
        self
    }

    /// How long the engine's leases last unless renewed. Default 30 s, renewed
    /// every third (ADR-0015).
    pub fn lease_ttl(mut self, t: Duration) -> Self {
        self.config.lease_ttl = t;
        self
    }

    /// The largest payload an append accepts, in bytes. Default 1 MiB; at
    /// most 256 MiB.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.config.max_payload_bytes = n;
        self
    }

    /// The name this engine holds leases under. Default `pid<pid>-<random>`,
    /// unique per open. Two engines must never share one.
    pub fn holder_id(mut self, id: impl Into<String>) -> Self {
        self.config.holder_id = id.into();
        self
    }

    /// Runs `PRAGMA quick_check` before opening, so a damaged file is refused
    /// at once rather than when the damaged part is read. It reads the whole
    /// file. Default `false`.
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }

    /// How many executor threads [`Engine::start`] spawns (0 to 64). Default 2.
    /// With 0 this process decides but leaves the runs to other processes.
    pub fn executors(mut self, n: usize) -> Self {
        self.config.executors = n;
        self
    }

    /// How many runs an executor claims in one transaction (1 to 1,000).
    /// Default 16. Larger batches share more commits; smaller ones spread
    /// work across executors more evenly.
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.config.claim_batch = n;
        self
    }

    /// How many events a rule reads per batch (1 to 10,000). Default 500.
    pub fn evaluate_batch(mut self, n: usize) -> Self {
        self.config.evaluate_batch = n;
        self
    }

    /// The deepest chain of causes a run may extend: an application's event
    /// is at depth 0, an event a run emits is one deeper than the event that
    /// fired the run, and a firing whose run would emit events deeper than
    /// this is dead-lettered (reason `depth_limit`) instead of run, so rules
    /// that trigger each other cannot loop for ever. Default 8.
    pub fn max_chain_depth(mut self, n: u32) -> Self {
        self.config.max_chain_depth = i64::from(n);
        self
    }

    /// Prunes automatically: the loop (while this process holds its lease)
    /// runs [`Engine::prune`] with `retention` every ten minutes. Default:
    /// none, nothing is deleted unless [`Engine::prune`] is called.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.config.retention = Some(retention);
        self
    }

    /// Opens the file.
    ///
    /// # Errors
    /// - [`Error::NotADatabase`], [`Error::Corrupt`], [`Error::SchemaTooNew`],
    ///   [`Error::ForeignDatabase`]: the file was refused and left unchanged.
    /// - [`Error::Missing`]: no file, and `create_if_missing(false)`.
    /// - [`Error::Pragma`]: SQLite did not take a setting (e.g. WAL on a
    ///   file system that cannot share memory).
    /// - [`Error::Invalid`]: a setting out of range.
    pub fn open(self) -> Result<Engine> {
        let c = &self.config;
        if !(1..=64).contains(&self.pool_size) {
            return Err(Error::invalid("pool_size", "must be 1 to 64"));
        }
        if c.max_payload_bytes == 0 || c.max_payload_bytes > 256 << 20 {
            return Err(Error::invalid(
                "max_payload_bytes",
                "must be 1 byte to 256 MiB",
            ));
        }
        if c.heartbeat.is_zero() {
            return Err(Error::invalid("heartbeat", "must be more than zero"));
        }
        lease::ttl_ms(c.lease_ttl)?;
        if let Some(r) = &c.retention {
            r.validate()?;
        }
        if c.executors > 64 {
            return Err(Error::invalid("executors", "must be 0 to 64"));
        }
        if !(1..=1_000).contains(&c.claim_batch) {
            return Err(Error::invalid("claim_batch", "must be 1 to 1000"));
        }
        if !(1..=Query::MAX_LIMIT).contains(&c.evaluate_batch) {
            return Err(Error::invalid("evaluate_batch", "must be 1 to 10000"));
        }
        crate::names::check_text("holder_id", &c.holder_id, crate::names::MAX_ID_BYTES)?;

        let writer_conn = schema::open_writer(
            &self.path,
            self.create,
            c.synchronous,
            self.verify,
            c.busy_timeout,
        )?;

        // One reader configured by hand first, so a pragma SQLite refuses is
        // reported as such instead of as a pool that never fills.
        let first = conn::open_raw(&self.path, false)?;
        conn::retry_busy(c.busy_timeout, || {
            conn::configure(&first, c.synchronous, Role::Reader)
        })?;
        let notifier = Arc::new(Notifier::new(first));

        let sync = c.synchronous;
        let manager = SqliteConnectionManager::file(&self.path)
            .with_flags(conn::open_flags(false))
            .with_init(move |conn| {
                conn::configure(conn, sync, Role::Reader)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
            });
        let pool = Pool::builder()
            .max_size(self.pool_size)
            .min_idle(Some(1))
            .connection_timeout(c.busy_timeout.max(Duration::from_secs(1)))
            .thread_pool(Arc::new(scheduled_thread_pool::ScheduledThreadPool::new(1)))
            .build(manager)?;

        let shared = Shared {
            path: self.path,
            clock: self.clock,
            writer: Writer::new(writer_conn, self.config.busy_timeout)?,
            config: self.config,
            pool,
            notifier,
            registry: RwLock::new(Registry::default()),
            claims: Claims::default(),
            leases: Mutex::new(HashMap::new()),
            runtime: Mutex::new(None),
            stop: AtomicBool::new(false),
            last_prune: Mutex::new(i64::MIN / 2),
            stopped_followers: Mutex::new(HashMap::new()),
            follower_retry: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
        };
        let shared = Arc::new(shared);
        Ok(Engine {
            _handles: Arc::new(LastHandle(Arc::clone(&shared))),
            shared,
        })
    }
}

impl Engine {
    /// Opens (creating it if missing) the reflexr file at `path` with the
    /// defaults of [`EngineBuilder`].
    pub fn open(path: impl AsRef<Path>) -> Result<Engine> {
        Engine::builder(path).open()
    }

    /// A builder for opening `path` with other settings.
    pub fn builder(path: impl AsRef<Path>) -> EngineBuilder {
        EngineBuilder {
            path: path.as_ref().to_path_buf(),
            clock: Arc::new(SystemClock),
            create: true,
            pool_size: 4,
            verify: false,
            config: Config {
                synchronous: Synchronous::Full,
                busy_timeout: Duration::from_secs(30),
                heartbeat: Duration::from_millis(50),
                max_payload_bytes: 1 << 20,
                lease_ttl: DEFAULT_LEASE_TTL,
                holder_id: format!("pid{}-{:08x}", std::process::id(), fastrand::u32(..)),
                executors: 2,
                claim_batch: 16,
                evaluate_batch: 500,
                max_chain_depth: 8,
                retention: None,
            },
        }
    }

    /// The file this engine opened.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The name this engine holds leases under.
    pub fn holder_id(&self) -> &str {
        &self.shared.config.holder_id
    }

    /// The engine's clock's current time, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.shared.clock.now_ms()
    }

    /// The durability level commits use.
    pub fn synchronous(&self) -> Synchronous {
        self.shared.config.synchronous
    }

    // ----- workspaces -------------------------------------------------------

    /// Creates a workspace.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] if it exists; [`Error::Invalid`] for a bad name.
    pub fn create_workspace(&self, name: &str) -> Result<()> {
        self.write(|tx| {
            let now = tx.now_ms();
            if workspace::create(tx.conn(), now, name)? {
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
            workspace::create(tx.conn(), now, name)?;
            workspace::register_types(tx.conn(), now, name, types)
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
            workspace::register_types(tx.conn(), now, workspace, types)
        })
    }

    /// Every workspace, by name, with the types it accepts.
    pub fn workspaces(&self) -> Result<Vec<WorkspaceInfo>> {
        self.shared.read(workspace::list)
    }

    // ----- writing ----------------------------------------------------------

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
        F: FnOnce(&mut Tx<'_>) -> Result<T> + Send,
        T: Send,
    {
        self.shared.write(f)
    }

    /// [`Engine::write`] for closures with an error type of their own, which
    /// must be able to hold a reflexr [`Error`] (for the commit's).
    pub fn write_with<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.shared.write(f)
    }

    /// Appends one event in a transaction of its own (shorthand for a
    /// [`Engine::write`] with one [`Tx::append`]).
    pub fn append(&self, workspace: &str, event: &NewEvent) -> Result<Appended> {
        self.write(|tx| tx.append(workspace, event))
    }

    // ----- reading ----------------------------------------------------------

    /// The events `query` asks for, in seq order (DESIGN.md, invariant 1: a
    /// reader after a seq sees every committed event after it, in order).
    pub fn read(&self, query: &Query) -> Result<Vec<Event>> {
        self.shared.read(|c| log::read(c, query))
    }

    /// Runs `f` on a pooled read connection, for the application's own
    /// queries. The connection is `query_only`: it cannot write. It sees what
    /// was committed when `f`'s first statement ran, and never blocks the
    /// writer. `f` may run more than once if the file is busy.
    pub fn with_reader<T>(&self, f: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        self.shared.read(f)
    }

    /// How many transactions the writer has committed, and how many callers'
    /// writes they held: with concurrent writers, several callers share one
    /// commit.
    pub fn writer_stats(&self) -> WriterStats {
        self.shared.writer.stats()
    }

    /// One event by seq.
    pub fn event(&self, seq: i64) -> Result<Option<Event>> {
        self.shared.read(|c| events::get(c, seq))
    }

    /// The highest seq ever assigned in the file (0 before the first append).
    pub fn head_seq(&self) -> Result<i64> {
        self.shared.read(events::head)
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
        let sub = self.shared.notifier.subscribe();
        loop {
            let page = self.read(query)?;
            if !page.is_empty() {
                return Ok(page);
            }
            if !sub.wait(self.shared.config.heartbeat, deadline) {
                return Ok(Vec::new());
            }
        }
    }

    // ----- cursors ----------------------------------------------------------

    /// The application consumer's cursor on `workspace` (0 if never saved).
    pub fn cursor(&self, consumer: &str, workspace: &str) -> Result<i64> {
        self.shared
            .read(|c| cursor::load(c, workspace, ConsumerKind::App, consumer))
    }

    /// Moves the application consumer's cursor forward to `seq`. See
    /// [`Tx::save_cursor`] to save it with the consumer's own rows.
    pub fn save_cursor(&self, consumer: &str, workspace: &str, seq: i64) -> Result<()> {
        self.write(|tx| tx.save_cursor(consumer, workspace, seq))
    }

    /// An operator's reset: sets any consumer's cursor to `position`,
    /// backwards if need be, and records who did it and why in
    /// `reflexr_audit`. The one way a cursor moves back (invariant 8).
    pub fn reset_cursor(
        &self,
        workspace: &str,
        kind: ConsumerKind,
        name: &str,
        position: i64,
        operator: &str,
        reason: &str,
    ) -> Result<Reset> {
        self.write(|tx| {
            cursor::reset(
                tx.conn(),
                tx.shared(),
                (workspace, kind, name),
                position,
                operator,
                reason,
            )
        })
    }

    /// Every cursor in the file, with its lag.
    pub fn cursors(&self) -> Result<Vec<CursorInfo>> {
        self.shared.read(cursor::list)
    }

    /// What operators did, newest first.
    pub fn audit_log(&self, limit: usize) -> Result<Vec<AuditEntry>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.shared.read(|c| audit::recent(c, limit))
    }

    // ----- leases -----------------------------------------------------------

    /// Takes the lease `name` for this engine's holder id, for `ttl` (the
    /// engine's default if `None`). Taking a lease that expired or was
    /// released bumps its generation; taking one this holder already holds
    /// extends it.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] while another holder's lease is live.
    pub fn acquire_lease(&self, name: &str, ttl: Option<Duration>) -> Result<Lease> {
        let ttl = ttl.unwrap_or(self.shared.config.lease_ttl);
        let holder = self.shared.config.holder_id.clone();
        self.write(|tx| lease::acquire(tx.conn(), tx.now_ms(), name, &holder, ttl))
    }

    /// Extends a held lease by its TTL from now.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when it expired or another holder took it: stop
    /// acting under it.
    pub fn renew_lease(&self, lease: &Lease) -> Result<Lease> {
        self.write(|tx| lease::renew(tx.conn(), tx.now_ms(), lease))
    }

    /// Gives a held lease up, so another holder can take it at once. False
    /// when it was no longer this holder's.
    pub fn release_lease(&self, lease: &Lease) -> Result<bool> {
        self.write(|tx| lease::release(tx.conn(), tx.now_ms(), lease))
    }

    /// Every lease in the file.
    pub fn leases(&self) -> Result<Vec<LeaseInfo>> {
        self.shared
            .read(|c| Ok(leases::list(c)?.into_iter().map(Into::into).collect()))
    }

    // ----- rules and actions ----------------------------------------------

    /// Registers a rule with this engine, and with the file: a rule new to the
    /// file starts at its [`crate::Start`] position; a rule the file knows at
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
        if self
            .shared
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return Err(Error::invalid(
                "rule",
                format!("{}: rules are registered before Engine::start", rule.name),
            ));
        }
        self.write(|tx| operate::register_rule(tx.conn(), tx.shared(), &rule))?;
        self.shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .rules
            .insert(rule.name.clone(), Arc::new(rule));
        Ok(())
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
        F: Fn(&Run, &mut RunContext<'_>) -> std::result::Result<(), HandlerError>
            + Send
            + Sync
            + 'static,
    {
        crate::names::check_name("action", name)?;
        self.shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .actions
            .insert(name.to_string(), Arc::new(handler));
        Ok(())
    }

    /// Starts the engine's threads: an evaluator per workspace with rules,
    /// the executors and the claim renewer (see the runtime notes in the
    /// README). They run until [`Engine::shutdown`] or until the last handle
    /// is dropped.
    ///
    /// # Errors
    /// [`Error::Invalid`] if already started; [`Error::Io`] if a thread
    /// cannot be spawned.
    pub fn start(&self) -> Result<()> {
        runtime::start(&self.shared)
    }

    /// Stops the threads: they take no new work, finish the handler they are
    /// in, give back runs claimed but not started, release the evaluator
    /// leases, and are joined. Does nothing if not started. The engine stays
    /// usable (and can be started again).
    pub fn shutdown(&self) {
        runtime::shutdown(&self.shared);
        runtime::release_leases(&self.shared);
    }

    /// Does the threads' work in this thread until nothing is ready: decides
    /// every new event (for the workspaces whose evaluator lease this engine
    /// holds or can take) and runs every due run, repeatedly, since runs emit
    /// events and events fire runs. Runs waiting for a retry's backoff are not
    /// due until the clock passes it: move a [`crate::ManualClock`] and call
    /// again.
    pub fn run_until_idle(&self) -> Result<Idle> {
        runtime::run_until_idle(&self.shared)
    }

    /// The rules the file knows, with their cursors and lag.
    pub fn rules(&self) -> Result<Vec<RuleInfo>> {
        let registered: Vec<String> = self
            .shared
            .registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .rules
            .keys()
            .cloned()
            .collect();
        self.shared.read(|c| operate::rule_infos(c, &registered))
    }

    /// A rule's state for one scope, decoded (None: the scope has none yet).
    pub fn rule_state<S: serde::de::DeserializeOwned>(
        &self,
        rule: &str,
        scope: &str,
    ) -> Result<Option<S>> {
        let json = self
            .shared
            .read(|c| crate::store::rules::state(c, rule, scope))?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| Error::Decode {
                seq: 0,
                event_type: format!("state of rule {rule}, scope {scope}"),
                message: e.to_string(),
            })
        })
        .transpose()
    }

    /// An operator's reset of a rule's cursor and/or state, recorded.
    pub fn reset_rule(
        &self,
        name: &str,
        what: RuleReset,
        operator: &str,
        reason: &str,
    ) -> Result<()> {
        self.write(|tx| operate::reset_rule(tx.conn(), tx.now_ms(), name, what, operator, reason))
    }

    /// Deletes a rule's row, cursor and state (its runs and dead letters
    /// stay), recorded. For rules the code no longer has.
    pub fn delete_rule(&self, name: &str, operator: &str, reason: &str) -> Result<()> {
        if self
            .shared
            .registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .rules
            .contains_key(name)
        {
            return Err(Error::invalid(
                "rule",
                format!("{name} is registered by this process; remove it from the code first"),
            ));
        }
        self.write(|tx| operate::delete_rule(tx.conn(), tx.now_ms(), name, operator, reason))
    }

    // ----- runs and dead letters ------------------------------------------

    /// Runs in `state`, oldest due first (or all runs, oldest first, if None),
    /// at most `limit`.
    pub fn runs(&self, state: Option<RunState>, limit: usize) -> Result<Vec<RunInfo>> {
        self.shared.read(|c| operate::list_runs(c, state, limit))
    }

    /// One run.
    pub fn run(&self, id: &str) -> Result<Option<RunInfo>> {
        self.shared.read(|c| operate::run_info(c, id))
    }

    /// How many runs are in each state.
    pub fn run_counts(&self) -> Result<Vec<(RunState, i64)>> {
        self.shared.read(operate::run_counts)
    }

    /// An operator's retry of a dead run: ready again with a fresh set of
    /// attempts, recorded.
    pub fn retry_run(&self, id: &str, operator: &str, reason: &str) -> Result<()> {
        self.write(|tx| operate::retry_run(tx.conn(), tx.now_ms(), id, operator, reason))
    }

    /// An operator's discard of a dead run (its scope moves on), recorded.
    pub fn discard_run(&self, id: &str, operator: &str, reason: &str) -> Result<()> {
        self.write(|tx| operate::discard_run(tx.conn(), tx.now_ms(), id, operator, reason))
    }

    /// Lets a scope blocked behind a dead run (`OnDeadLetter::Block`) go on;
    /// the dead run stays dead. Recorded.
    pub fn unblock(&self, rule: &str, scope: &str, operator: &str, reason: &str) -> Result<()> {
        self.write(|tx| operate::unblock(tx.conn(), tx.now_ms(), rule, scope, operator, reason))
    }

    /// Dead letters, oldest first: the open ones, or all with
    /// `include_resolved`.
    pub fn dead_letters(&self, include_resolved: bool, limit: usize) -> Result<Vec<DeadLetter>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.shared
            .read(|c| dead_letters::list(c, include_resolved, 0, limit))
    }

    /// Retries what a dead letter gave up on (a run's: the run, as
    /// [`Engine::retry_run`]). A rule's evaluation error is replayed with
    /// [`Engine::reset_rule`] instead.
    pub fn retry_dead_letter(&self, id: i64, operator: &str, reason: &str) -> Result<()> {
        self.write(|tx| operate::retry_dead_letter(tx.conn(), tx.now_ms(), id, operator, reason))
    }

    /// Marks a dead letter handled without retrying it (a run's: the run is
    /// discarded, as [`Engine::discard_run`]).
    pub fn discard_dead_letter(&self, id: i64, operator: &str, reason: &str) -> Result<()> {
        self.write(|tx| operate::discard_dead_letter(tx.conn(), tx.now_ms(), id, operator, reason))
    }

    // ----- the jobs loop: reactions, channels, scheduled jobs, pruning ------

    /// Registers a reaction (see [`Reaction`]): the loop will hand it each
    /// new event of its types, in the transaction that moves its cursor. A
    /// reaction new to the file starts at its [`crate::Start`] position.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a reaction without types or handler;
    /// [`Error::NotFound`] for a missing workspace.
    pub fn register_reaction(&self, reaction: Reaction) -> Result<()> {
        reaction.validate()?;
        self.write(|tx| reaction::register(tx.conn(), tx.now_ms(), &reaction))?;
        self.shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .reactions
            .insert(reaction.name.clone(), Arc::new(reaction));
        self.shared.notifier.nudge();
        Ok(())
    }

    /// Registers a delivery channel: its policy ([`ChannelPolicy::Retried`]
    /// or [`ChannelPolicy::BestEffort`]) and the sender that sends one
    /// message. A process enqueues deliveries only on channels it registered
    /// (the policy is stored on each delivery) and sends only those.
    pub fn register_channel<F>(&self, channel: &str, policy: ChannelPolicy, sender: F) -> Result<()>
    where
        F: Fn(&Message, &mut RunContext<'_>) -> std::result::Result<(), HandlerError>
            + Send
            + Sync
            + 'static,
    {
        crate::names::check_name("channel", channel)?;
        policy.retry().validate()?;
        let mut reg = self
            .shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner());
        reg.channels.insert(channel.to_string(), policy);
        reg.actions.insert(
            delivery::action_of(channel),
            delivery::action(Arc::new(sender)),
        );
        Ok(())
    }

    /// Enqueues a delivery in a transaction of its own (shorthand for a
    /// [`Engine::write`] with one [`Tx::deliver`]).
    pub fn deliver(&self, delivery: &Delivery) -> Result<String> {
        self.write(|tx| tx.deliver(delivery))
    }

    /// Registers a scheduled job (see [`Job`]). A job the file knows with
    /// the same schedule keeps its next due time; a new or changed one is due
    /// from now; an interval of zero switches it off.
    pub fn register_job(&self, job: Job) -> Result<()> {
        job.validate()?;
        self.write(|tx| schedule::register(tx.conn(), tx.now_ms(), &job))?;
        let handler = job.handler.clone().expect("validated");
        let mut reg = self
            .shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner());
        reg.actions
            .insert(schedule::action_of(&job.name), schedule::action(handler));
        reg.jobs.insert(job.name.clone(), Arc::new(job));
        Ok(())
    }

    /// Every scheduled job the file knows, with its next due time.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.shared.read(|c| {
            Ok(crate::store::schedules::list(c)?
                .into_iter()
                .map(Into::into)
                .collect())
        })
    }

    /// Deletes events every cursor has passed and finished work, older than
    /// `retention` (see [`Retention`]), in short batches. Reports what it
    /// removed.
    pub fn prune(&self, retention: &Retention) -> Result<Pruned> {
        prune::prune(&self.shared, retention, &mut |_| {})
    }

    /// [`Engine::prune`], calling `progress` with the running totals after
    /// every batch (for a progress bar).
    pub fn prune_with_progress(
        &self,
        retention: &Retention,
        mut progress: impl FnMut(Pruned),
    ) -> Result<Pruned> {
        prune::prune(&self.shared, retention, &mut progress)
    }

    // ----- followers ------------------------------------------------------

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
        crate::names::check_name("projection", name)?;
        self.shared
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .projections
            .insert(name.to_string(), Arc::new(projection));
        Ok(())
    }

    /// Creates a follower (or updates its target and projection) in the
    /// ledger; returns its name. Any engine on this file that has the
    /// projection registered relays for it, one at a time (its lease): in
    /// [`Engine::run_until_idle`], and in a thread of its own after
    /// [`Engine::start`].
    pub fn follow(&self, follow: Follow) -> Result<String> {
        self.write(|tx| follow::register(tx, &follow))
    }

    /// The followers in the ledger, with their cursors and counters
    /// (published, dead letters, stops).
    pub fn followed(&self) -> Result<Vec<FollowerInfo>> {
        let stopped = self
            .shared
            .stopped_followers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.shared.read(|c| follow::infos(c, &stopped))
    }

    /// Lets a stopped follower start again at its cursor (after the
    /// configuration that stopped it was mended), whichever process runs it:
    /// the request is recorded in the ledger, and the engine relaying for the
    /// follower picks it up at its next turn (this one at once).
    ///
    /// # Errors
    /// [`Error::NotFound`] for a follower the ledger does not have.
    pub fn restart_follower(&self, name: &str) -> Result<()> {
        let found = self
            .write(|tx| crate::store::followers::request_restart(tx.conn(), name, tx.now_ms()))?;
        if !found {
            return Err(Error::not_found("follower", name));
        }
        self.shared
            .stopped_followers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.shared.notifier.nudge();
        Ok(())
    }

    /// Removes a follower from the ledger, with its cursor (its dead letters
    /// stay), on the record.
    pub fn unfollow(&self, name: &str, operator: &str, reason: &str) -> Result<()> {
        self.write(|tx| operate::unfollow(tx.conn(), tx.now_ms(), name, operator, reason))
    }

    /// Counters and gauges for export: totals kept in the file (decisions,
    /// firings, errors, runs' outcomes, reactions, deliveries), runs by
    /// state, open dead letters by kind, every cursor's lag, followers'
    /// counters, and this process's writer. See [`Stats`].
    pub fn stats(&self) -> Result<Stats> {
        let followers = self.followed()?;
        crate::stats::collect(&self.shared, &followers)
    }

    // ----- maintenance ------------------------------------------------------

    /// Reads every page of the file (`PRAGMA quick_check`).
    ///
    /// # Errors
    /// [`Error::Corrupt`] with SQLite's findings.
    pub fn check_integrity(&self) -> Result<()> {
        self.shared.read(schema::quick_check)
    }
}
