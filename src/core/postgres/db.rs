//! [`PgDb`]: one open PostgreSQL database (feature `postgres`) — the core
//! the engine works through on a server, as [`crate::core::sqlite::db::Db`] is on a file.
//!
//! - **Connections.** An r2d2 pool of the sync `postgres` client (its
//!   private runtime never reaches the API). A connection that broke — the
//!   server restarted — fails its next BEGIN and is replaced; the
//!   statement that met the break fails with [`Error::Io`], and nothing of
//!   its transaction committed — unless the break came during the `COMMIT`
//!   itself, when the server may have committed it: the caller cannot
//!   tell, as with any database over a network (an append's id makes it
//!   safe to append again).
//! - **Writes.** Concurrent writers of this process share transactions,
//!   each in a savepoint of its own but single appends (group commit by
//!   flat combining, as on SQLite; see [`PgDb::write_single`]): appends
//!   take their seqs one transaction at a time across every process (see
//!   `store::postgres`), so a commit that carries many callers' appends
//!   turns the head's lock once for all of them. Other processes write
//!   beside this one. An executor's round (settle a batch,
//!   claim the next) takes a transaction of its own instead
//!   (`CoreDb::write_apart`): rounds run side by side on their own
//!   connections, and the server merges their commits' flushes itself.
//!   A single append alone in its batch (no expected version, no
//!   causation to look up) is one statement, its own transaction
//!   (`PgConn::deferred`); so is a plain enqueue, which shares nothing
//!   (see [`PgDb::insert_run_alone`]).
//! - **One lock order.** A transaction that may append takes the head's
//!   lock before anything else: the shared write with its BEGIN
//!   (`PgConn::begin_ordered`), a round that appends what its runs emitted
//!   before it appends (`Events::lock_head`). Lease updates and claim
//!   renewals append nothing and run apart; a shared write whose members
//!   all append nothing (enqueues and deliveries, `PgDb::write_quiet`)
//!   begins without the head, and so never waits for it. So no transaction
//!   waits for the head while holding a row another waits for: processes
//!   never deadlock over the head, whatever the members of a shared write
//!   do in what order.
//! - **Wake-ups.** A transaction that appended or made runs claimable
//!   notifies its schema's channel (`pg::channel_of`: the server's
//!   channels are per database, and engines of other schemas must not
//!   wake) with its commit (a lone append's or a plain enqueue's
//!   statement, with `pg_notify` in it); the notifier's listener and heartbeat
//!   (`crate::core::wake`) wake this process's waiters. A missed
//!   notification costs a heartbeat, never an event; a burst of them wakes
//!   a waiter once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use postgres::NoTls;

use crate::base::clock::Clock;
use crate::base::error::{Error, Result};
use crate::core::combiner::{Batch, Combiner, Ended, Shape};
use crate::core::db::{CoreDb, RunWaiter};
use crate::core::db::{Env, Tx};
use crate::core::postgres::listen::{Notices, PgListen};
use crate::core::settings::Settings;
use crate::core::wake::{Notifier, Subscription, WaitsHint, Wake};
use crate::core::writer::{Inside, NEXT_WRITER_ID, WriterStats};
use crate::store::Postgres;
use crate::store::postgres::{self as pg, PgConn, Pool, Pooled};
use crate::store::runs::{Inserted, NewRun, RunRow};

/// Where a PostgreSQL database is, and how many connections to keep, as a
/// [`crate::Builder`] holds them.
#[derive(Clone)]
pub struct PgOpen {
    /// A libpq connection string or a `postgresql://` URL.
    pub(crate) config: String,
    pub(crate) pool_size: u32,
}

/// One open PostgreSQL database.
pub struct PgDb {
    /// The server and database, for messages (never the password).
    what: String,
    env: Env,
    pool: Pool,
    notifier: Arc<Notifier>,
    /// The channel its commits are announced on (`pg::channel_of` its
    /// schema).
    channel: Arc<str>,
    /// The payloads its commits notify with: what each made, and this
    /// handle's token, by which its listener knows its own.
    notices: Notices,
    /// Other processes' commits, heard at once (None for a follower's
    /// target, which nobody waits on).
    listener: Option<PgListen>,
    /// Concurrent writers of this process share transactions (group
    /// commit), as on SQLite: one commit, one turn of the head's lock.
    combiner: Combiner<Postgres>,
    /// This writer's id, for catching a write started inside a write.
    id: usize,
    /// The writer's counters ([`WriterStats`]).
    commits: AtomicU64,
    writes: AtomicU64,
    aborts: AtomicU64,
    /// Threads waiting for runs to end (see `Db::run_waiter`).
    run_waiters: std::sync::atomic::AtomicUsize,
}

impl PgDb {
    /// Connects to the database `config` names (a libpq-style string:
    /// `host=… port=… user=… dbname=…`, or a `postgresql://` URL), applies
    /// or migrates the schema, and starts the listener if `listen` (a
    /// follower's target, which nobody waits on, needs none).
    pub(crate) fn open(
        config: &str,
        pool_size: u32,
        settings: Settings,
        clock: Arc<dyn Clock>,
        listen: bool,
    ) -> Result<PgDb> {
        if !(1..=64).contains(&pool_size) {
            return Err(Error::invalid("pool_size", "must be 1 to 64"));
        }
        let config: postgres::Config = config
            .parse()
            .map_err(|e| Error::invalid("postgres config", format!("{e}")))?;
        let what = describe(&config);
        let mut first = config.connect(NoTls)?;
        // The migration's transaction, too, writes whatever the session's
        // defaults.
        first.batch_execute(pg::SESSION_DEFAULTS)?;
        pg::schema::apply(&mut first, &what)?;
        // The schema the tables are in (found through `search_path`, as
        // every statement finds them; not `current_schema()`, which may be
        // an earlier schema of the path without them): its commits' channel.
        let schema: String = first
            .query_one(
                "SELECT n.nspname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = 'reflexr_head'::regclass",
                &[],
            )?
            .get(0);
        let channel: Arc<str> = pg::channel_of(&schema).into();

        let manager = pg::Manager::new(config.clone());
        // Not tested on checkout (a round trip per operation): a broken
        // connection shows when its BEGIN fails, and `begin` takes another.
        let pool = r2d2::Pool::builder()
            .max_size(pool_size)
            .test_on_check_out(false)
            .min_idle(Some(1))
            .connection_timeout(settings.busy_timeout.max(Duration::from_secs(1)))
            .thread_pool(Arc::new(scheduled_thread_pool::ScheduledThreadPool::new(1)))
            .build(manager)?;

        let notifier = Arc::new(Notifier::postgres(first, &config));
        let notices = Notices::new();
        let listener = if listen {
            Some(notifier.listen_postgres(&config, Arc::clone(&channel), notices.clone())?)
        } else {
            None
        };
        Ok(PgDb {
            what,
            env: Env {
                clock,
                settings,
                channels: RwLock::new(BTreeMap::new()),
            },
            pool,
            notifier,
            channel,
            notices,
            listener,
            combiner: Combiner::new(),
            id: NEXT_WRITER_ID.fetch_add(1, Ordering::Relaxed),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            run_waiters: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Runs `f`, the engine's own reads, on a pooled connection outside any
    /// transaction block: each statement a transaction of its own
    /// ([`PgConn::reads`]). On a connection the server cut, `f` runs again
    /// on another, as a failed `BEGIN` would be sent again (reads change
    /// nothing).
    pub(crate) fn read<T>(&self, mut f: impl FnMut(&PgConn) -> Result<T>) -> Result<T> {
        self.on_a_live_connection(|client| f(&PgConn::reads(client)))
    }

    /// Runs `f` with a [`Tx`] on a READ ONLY transaction of its own: the
    /// application's queries (`Tx::query`) and the engine's reads, one
    /// each statement seeing what was committed when it began (READ
    /// COMMITTED); a write in it fails
    /// with [`Error::ReadOnly`].
    pub(crate) fn with_reader<T>(
        &self,
        mut f: impl FnMut(&Tx<'_, Postgres>) -> Result<T>,
    ) -> Result<T> {
        let conn = self.begin_as(true)?;
        let out = f(&Tx::<Postgres>::new(&conn, &(), &self.env))?;
        conn.commit()?;
        Ok(out)
    }

    /// Runs `f` in this process's shared write transaction and returns its
    /// value once committed: the writers that arrive while a transaction
    /// runs share the next (group commit, by the same flat combining as
    /// SQLite's writer), each in a savepoint of its own (but a batch's lone
    /// member, whose transaction is its own), so an error (or a panic) of
    /// `f` rolls back its work alone.
    ///
    /// # Panics
    /// When called from inside a write closure of the same engine; a panic
    /// of `f` is re-raised here, after its work was rolled back.
    pub(crate) fn write<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.shared(Shape::Any, f)
    }

    /// [`PgDb::write`] for work that appends nothing (an enqueue, a
    /// delivery): a batch whose members all say so begins without the
    /// log's head, so it never waits for another process's appends (see
    /// the module's notes on the order of locks). Work that appends anyway
    /// still gets its seqs in order (the append's statement takes the head
    /// itself), but outside the order that keeps processes from
    /// deadlocking: say so only of work that cannot append.
    pub(crate) fn write_quiet<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.shared(Shape::Quiet, f)
    }

    /// [`PgDb::write`] for a single append (`Engine::append`): it shares
    /// the transaction without a savepoint of its own, one round trip less
    /// per caller. It may: the transaction holds the head from its BEGIN,
    /// so the append's one statement finds its seq and version without a
    /// race, skips an id already there (`ON CONFLICT DO NOTHING`) and
    /// inserts only a registered type, and every field was checked before
    /// it (names, lengths, no control characters, JSON) — no input makes it
    /// fail on the server. If it fails there all the same (a
    /// `statement_timeout`, a broken connection), or fails after it
    /// appended, the batch it shared commits nothing and every caller in
    /// it gets [`Error::TransactionAborted`].
    ///
    /// Alone in its batch (no other caller waiting), with no expected
    /// version and no causation to look up, it takes no transaction: its
    /// statement is sent as its own, which locks the head, inserts, moves
    /// the head and notifies in one round trip where a transaction takes
    /// three (see `PgConn::deferred`; a subject's version taken meanwhile
    /// sends it once more, then in a transaction). The closure must
    /// then keep its word — a write after the append, or a failure after
    /// it, would find the append committed already.
    pub(crate) fn write_single<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.shared(Shape::Single, f)
    }

    /// `f` as a member of the next shared batch, of the shape its caller
    /// says (see [`Shape`]).
    fn shared<T, E, F>(&self, shape: Shape, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        let _inside = Inside::enter(self.id);
        self.combiner
            .call(f, shape, &spoilt, &mut |batch| self.run_batch(batch))
    }

    /// Runs `f` in a transaction of its own on a pooled connection, beside
    /// the shared one (see `CoreDb::write_apart`): committed when `f`
    /// returns Ok, rolled back otherwise (or if `f` panics, the panic going
    /// on).
    ///
    /// # Panics
    /// When called from inside a write closure of the same engine.
    pub(crate) fn write_alone<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let _inside = Inside::enter(self.id);
        let conn = self.begin()?;
        let mut tx = Tx::<Postgres>::new(&conn, &(), &self.env);
        let value = f(&mut tx);
        let value = match value {
            Ok(v) => match tx.take_conflict().or_else(|| spoilt(&tx)) {
                Some(e) => Err(e.into()),
                None => Ok(v),
            },
            Err(e) => Err(e),
        };
        let nudge = tx.wants_nudge();
        // A closure's own error rolls back (dropping `conn`); like a lone
        // member of a shared write that failed, it is not an abort.
        let Ok(v) = value else {
            return value;
        };
        let committed = match self.notices.of(nudge) {
            None => conn.commit(),
            Some(payload) => conn.commit_notifying(&self.channel, &payload),
        };
        if let Err(e) = committed {
            self.aborts.fetch_add(1, Ordering::Relaxed);
            return Err(e.into());
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.notifier.nudge_for(nudge);
        Ok(v)
    }

    /// The payload of a commit that made `made`, events or runs (which
    /// other processes wait for).
    fn notice(&self, made: Wake) -> Arc<str> {
        self.notices
            .of(made)
            .expect("events and runs are what other processes wait for")
    }

    /// A ready run that takes no lane and holds no key (a plain
    /// `Engine::enqueue`), inserted outside any transaction block by one
    /// statement that is its own commit, with the notification that wakes
    /// other processes' executors in that commit
    /// (`PgConn::insert_run_alone`): one round trip, where a
    /// write in a transaction takes three (its `BEGIN`, the insert, its
    /// `COMMIT`). It appends nothing and shares no transaction, so it
    /// waits for no appender and for no other caller's write.
    ///
    /// A connection the server cut (a restart, a failover) fails the
    /// statement, and it is sent again on another, up to the pool's size
    /// and one more, as a failed `BEGIN` is (see [`PgDb::begin`]): safe,
    /// since the run's id makes it once. Had the server committed it before
    /// the connection broke, the next try finds the id and reports
    /// [`Inserted::Existed`].
    ///
    /// # Panics
    /// When called from inside a write closure of the same engine.
    pub(crate) fn insert_run_alone(&self, run: &NewRun<'_>) -> Result<Inserted> {
        let _inside = Inside::enter(self.id);
        let conn = PgConn::deferred(
            self.pool.get()?,
            self.pool.clone(),
            (Arc::clone(&self.channel), self.notice(Wake::RUNS)),
        );
        let inserted = conn.insert_run_alone(run)?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
        // Sent again, a run found there may be the first try's own.
        if inserted == Inserted::New || conn.was_resent() {
            self.notifier.nudge_for(Wake::RUNS);
        }
        Ok(inserted)
    }

    /// [`PgDb::insert_run_alone`] with the run handed over at its insert
    /// (see `CoreDb::insert_run_alone_handed`): one round trip, its own
    /// commit, the notification in it only for a run not claimed. The
    /// place is reserved once the connection is in hand.
    pub(crate) fn insert_run_alone_handed(
        &self,
        run: &NewRun<'_>,
        reserve: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Inserted, Option<RunRow>)> {
        let _inside = Inside::enter(self.id);
        let conn = PgConn::deferred(
            self.pool.get()?,
            self.pool.clone(),
            (Arc::clone(&self.channel), self.notice(Wake::RUNS)),
        );
        let (inserted, claimed) = if reserve() {
            let settings = self.settings();
            let expires_at = self.now_ms() + settings.lease_ttl_ms();
            conn.insert_run_alone_handed(run, &settings.holder_id, expires_at)?
        } else {
            (conn.insert_run_alone(run)?, None)
        };
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
        match (&inserted, &claimed) {
            (Inserted::New, None) => self.notifier.nudge_for(Wake::RUNS),
            (Inserted::New, Some(_)) => self.notifier.nudge_for(Wake::COMMITS),
            // Sent again, a run found there may be the first try's own.
            (_, _) if conn.was_resent() => self.notifier.nudge_for(Wake::RUNS),
            _ => {}
        }
        Ok((inserted, claimed))
    }

    /// One transaction over the batch: each member in a savepoint (none
    /// for a batch of one: its transaction is its own; none for a single
    /// append, see [`PgDb::write_single`]), then the commit; the batch,
    /// dropped on the way out, tells the members. A failure of the
    /// connection itself ends the batch, and nothing of it commits.
    fn run_batch(&self, mut batch: Batch<Postgres>) {
        const SAVEPOINT: &str = "reflexr_call";
        // The head first (see `PgConn::begin_ordered`) when any member may
        // append; a batch of work that appends nothing waits for no
        // appender.
        let alone = batch.members().len() == 1;
        let begun = if alone && batch.members()[0].single() {
            // A single append alone: its statement may be its own
            // transaction (`PgConn::deferred`).
            self.pool.get().map_err(Error::from).map(|client| {
                PgConn::deferred(
                    client,
                    self.pool.clone(),
                    (Arc::clone(&self.channel), self.notice(Wake::EVENTS)),
                )
            })
        } else {
            // Begun by its first statement: with the first member's
            // savepoint, or a lone member's first savepoint, in one round
            // trip (`PgConn::owed`).
            let ordered = batch.members().iter().any(|m| m.may_append());
            self.pool
                .get()
                .map_err(Error::from)
                .map(|client| PgConn::owed(client, self.pool.clone(), ordered))
        };
        let conn = match begun {
            Ok(c) => c,
            Err(e) => return batch.end(Err(Arc::new(e))),
        };
        let (mut nudge, mut kept) = (Wake::NONE, 0usize);
        let mut failed: Option<Error> = None;
        // The previous member's savepoint, released with the next's making:
        // one round trip between members.
        let mut release = false;
        for member in batch.members() {
            // A single append runs inside whatever savepoint is open (the
            // previous member's, released with the next one made).
            let single = member.single();
            if !alone && !single {
                let sql = if release {
                    format!("RELEASE SAVEPOINT {SAVEPOINT}; SAVEPOINT {SAVEPOINT}")
                } else {
                    format!("SAVEPOINT {SAVEPOINT}")
                };
                if let Err(e) = conn.control(&sql) {
                    failed = Some(e);
                    break;
                }
            }
            let mark = conn.mark();
            let mut tx = Tx::<Postgres>::new(&conn, &(), &self.env);
            let outcome = member.run(&mut tx);
            if outcome.ok {
                kept += 1;
                nudge = nudge.with(outcome.nudge);
            } else if single && !alone {
                // Without a savepoint, a failure is the member's alone only
                // if it left the transaction as it found it: not aborted by
                // a failed statement, nothing appended.
                if conn.is_aborted() || conn.last_seq() != mark.seq() {
                    failed = Some(Error::TransactionAborted {
                        detail: "a single append sharing this write's transaction failed \
                                 on the server or after it appended; the transaction is not \
                                 committed"
                            .into(),
                    });
                    break;
                }
            } else if !alone && let Err(e) = conn.rollback_to(SAVEPOINT, mark) {
                failed = Some(e);
                break;
            }
            release |= !single;
        }
        // A lone append sent again after the server cut its connection may
        // have been committed, and notified, by its first try, and is then
        // reported as there already: this engine's threads are woken for it
        // all the same (its listener passes over the notification).
        let resent_append = alone && batch.members()[0].single() && conn.was_resent();
        let ended: Ended = match failed {
            Some(e) => Err(Arc::new(e)),
            // A lone member that failed: its transaction rolls back (when
            // `conn` is dropped), and the member reports its own error.
            None if kept == 0 => Ok(()),
            None => {
                let committed = match self.notices.of(nudge) {
                    None => conn.commit(),
                    Some(payload) => conn.commit_notifying(&self.channel, &payload),
                };
                committed.map_err(Arc::new)
            }
        };
        match &ended {
            Ok(()) if kept > 0 => {
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.writes.fetch_add(kept as u64, Ordering::Relaxed);
            }
            Ok(()) => {}
            Err(_) => {
                self.aborts.fetch_add(1, Ordering::Relaxed);
            }
        }
        let woke = match &ended {
            Ok(()) if resent_append => nudge.with(Wake::EVENTS),
            Ok(()) => nudge,
            Err(_) => Wake::NONE,
        };
        batch.end(ended);
        drop(batch);
        self.notifier.nudge_for(woke);
    }

    /// A transaction on a pooled connection. A connection the server cut
    /// (a restart, a failover) fails its BEGIN — nothing done yet — and is
    /// dropped by the pool; another is taken, up to the pool's size and
    /// one more (a new one).
    fn begin(&self) -> Result<PgConn> {
        self.begin_as(false)
    }

    /// [`PgDb::begin`], READ ONLY if `read_only` (see `PgConn::begin_as`).
    fn begin_as(&self, read_only: bool) -> Result<PgConn> {
        self.on_a_live_connection(|client| PgConn::begin_as(client, read_only))
    }

    /// `f` on a pooled connection; on one the server cut (its first
    /// statement fails with [`Error::Io`]), again on another, up to the
    /// pool's size and one more. `f` must change nothing before its first
    /// statement answers: a `BEGIN`, or reads.
    fn on_a_live_connection<T>(&self, mut f: impl FnMut(Pooled) -> Result<T>) -> Result<T> {
        let mut tries = self.pool.max_size() + 1;
        loop {
            match f(self.pool.get()?) {
                Err(Error::Io { .. }) if tries > 1 => tries -= 1,
                other => return other,
            }
        }
    }

    /// Stops the listener and waits for it.
    pub(crate) fn close(&self) {
        if let Some(l) = &self.listener {
            l.stop();
        }
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        self.close();
    }
}

/// A statement failed on the server and the closure went on (it caught the
/// error): PostgreSQL aborted the transaction, so none of the write can
/// commit. Say so, rather than Ok.
fn spoilt(tx: &Tx<'_, Postgres>) -> Option<Error> {
    tx.core().is_aborted().then(|| Error::TransactionAborted {
        detail: "a statement of this write failed on the server, which aborted its \
                 transaction; the closure went on and returned Ok, but nothing of the write \
                 was kept"
            .into(),
    })
}

/// `host:port/dbname` of a config (the first host; no user, no password).
fn describe(config: &postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("");
    format!("postgresql {host}:{port}/{db}")
}

impl CoreDb<Postgres> for PgDb {
    /// The server and database, as `postgresql host:port/dbname`.
    fn describe(&self) -> String {
        self.what.clone()
    }
    fn close(&self) {
        PgDb::close(self);
    }
    fn settings(&self) -> &Settings {
        &self.env.settings
    }
    fn clock(&self) -> &Arc<dyn Clock> {
        &self.env.clock
    }
    fn now_ms(&self) -> i64 {
        self.env.clock.now_ms()
    }
    fn read_with<T>(&self, f: &mut dyn FnMut(&PgConn) -> Result<T>) -> Result<T> {
        self.read(f)
    }
    fn write_with<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.write(f)
    }
    fn write_single<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        PgDb::write_single(self, f)
    }
    fn write_apart<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.write_alone(f)
    }
    fn write_quiet<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, Postgres>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        PgDb::write_quiet(self, f)
    }
    fn insert_run_alone(&self, run: &NewRun<'_>) -> Result<Inserted> {
        PgDb::insert_run_alone(self, run)
    }
    fn insert_run_alone_handed(
        &self,
        run: &NewRun<'_>,
        reserve: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Inserted, Option<RunRow>)> {
        PgDb::insert_run_alone_handed(self, run, reserve)
    }
    fn subscribe_to(&self, wake: Wake) -> Subscription {
        self.notifier.subscribe(wake)
    }
    fn waits_hint(&self) -> &WaitsHint {
        self.notifier.waits()
    }
    fn writer_stats(&self) -> WriterStats {
        WriterStats {
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            aborts: self.aborts.load(Ordering::Relaxed),
        }
    }
    fn channels(&self) -> &RwLock<BTreeMap<String, crate::base::retry::RetryPolicy>> {
        &self.env.channels
    }
    fn nudge(&self) {
        self.notifier.nudge();
    }
    fn nudge_for(&self, made: Wake) {
        self.notifier.nudge_for(made);
    }
    fn run_waiter(&self) -> RunWaiter<'_> {
        RunWaiter::new(&self.run_waiters)
    }
    fn has_run_waiters(&self) -> bool {
        self.run_waiters.load(Ordering::SeqCst) > 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::PgDb;
    use crate::base::clock::ManualClock;
    use crate::base::error::{Error, Result};
    use crate::base::event::NewEvent;
    use crate::core::db::CoreDb;
    use crate::core::settings::Settings;
    use crate::core::workspace;
    use crate::store::conformance::PgSchema;

    const NOW: i64 = 1_700_000_000_000;

    fn open(schema: &PgSchema) -> Arc<PgDb> {
        open_as(schema, false)
    }

    /// A handle with a workspace `ws`, and its listener if `listen`.
    fn open_as(schema: &PgSchema, listen: bool) -> Arc<PgDb> {
        drop(schema.client());
        let db = PgDb::open(
            &schema.url(),
            8,
            Settings::for_test(),
            Arc::new(ManualClock::new(NOW)),
            listen,
        )
        .unwrap();
        db.write(|tx| {
            workspace::create(tx.core(), NOW, "ws")?;
            workspace::register_types(tx.core(), NOW, "ws", &["Opened"])
        })
        .unwrap();
        Arc::new(db)
    }

    /// A single append (`Engine::append`'s write) of `subject`.
    fn append(db: &PgDb, subject: &str) -> Result<()> {
        let ev = NewEvent::new("Opened", subject, "tester", NOW).payload_json("{}");
        db.write_single(move |tx| tx.append("ws", &ev).map(|_| ()))
    }

    fn subjects(db: &PgDb) -> Vec<String> {
        db.with_reader(|tx| {
            let rows = tx.query(
                "SELECT subject FROM reflexr_events WHERE workspace = 'ws' ORDER BY subject",
                &[],
            )?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .unwrap()
    }

    type Caller = Box<dyn FnOnce(&PgDb) -> Result<()> + Send>;

    /// Holds the lead in a write until every caller is queued, so that
    /// they all share the transaction after it; their outcomes in order.
    fn batch_of(db: &Arc<PgDb>, callers: Vec<Caller>) -> Vec<Result<()>> {
        let n = callers.len();
        let gate = Arc::new(Barrier::new(n + 1));
        let handles: Vec<_> = callers
            .into_iter()
            .map(|f| {
                let (db, gate) = (Arc::clone(db), Arc::clone(&gate));
                std::thread::spawn(move || {
                    gate.wait();
                    f(&db)
                })
            })
            .collect();
        db.write(|_| {
            gate.wait();
            while db.combiner.queued() < n {
                std::thread::yield_now();
            }
            Ok::<_, Error>(())
        })
        .unwrap();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn single_appends_share_a_batch_without_savepoints_and_fail_alone() {
        // Invariant 2, for single appends sharing a transaction without
        // savepoints: one refused before its statement (a malformed field)
        // or by what its statement found (a type not registered, which
        // fails no statement) leaves nothing, and its neighbours commit.
        let schema = PgSchema::new();
        let db = open(&schema);
        let before = db.writer_stats();
        let results = batch_of(
            &db,
            vec![
                Box::new(|db| append(db, "a")),
                Box::new(|db| append(db, "")),
                Box::new(|db| {
                    let ev = NewEvent::new("Unknown", "b", "tester", NOW).payload_json("{}");
                    db.write_single(move |tx| tx.append("ws", &ev).map(|_| ()))
                }),
                Box::new(|db| {
                    db.write(|tx| {
                        let ev = NewEvent::new("Opened", "c", "tester", NOW).payload_json("{}");
                        tx.append("ws", &ev).map(|_| ())
                    })
                }),
                Box::new(|db| append(db, "d")),
            ],
        );
        results[0].as_ref().unwrap();
        assert!(
            matches!(results[1], Err(Error::Invalid { .. })),
            "{results:?}"
        );
        assert!(
            matches!(results[2], Err(Error::NotFound { .. })),
            "{results:?}"
        );
        results[3].as_ref().unwrap();
        results[4].as_ref().unwrap();
        assert_eq!(subjects(&db), ["a", "c", "d"]);
        let after = db.writer_stats();
        assert_eq!(
            after.commits - before.commits,
            2,
            "the holder's, then one for all"
        );
        assert_eq!(after.writes - before.writes, 4, "the holder, a, c and d");
        assert_eq!(after.aborts, before.aborts);
    }

    #[test]
    fn a_single_append_that_fails_on_the_server_or_after_appending_fails_its_whole_batch() {
        // Invariant 2: a single append has no savepoint to roll back to.
        // If its statement fails on the server anyway (here a trigger of
        // the application's refuses it), or its closure fails after it
        // appended, the batch commits nothing, and every caller in it is
        // told so; the writer goes on.
        let schema = PgSchema::new();
        let db = open(&schema);
        db.write(|tx| {
            tx.core().execute_untyped(
                "CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'no bad subjects'; END $$",
                &[],
            )?;
            tx.core().execute_untyped(
                "CREATE TRIGGER refuse_bad BEFORE INSERT ON reflexr_events FOR EACH ROW \
                 WHEN (NEW.subject = 'bad') EXECUTE FUNCTION refuse_bad()",
                &[],
            )
        })
        .unwrap();
        for failing in [
            Box::new(|db: &PgDb| append(db, "bad")) as Caller,
            Box::new(|db: &PgDb| {
                let ev = NewEvent::new("Opened", "late", "tester", NOW).payload_json("{}");
                db.write_single(move |tx| {
                    tx.append("ws", &ev)?;
                    Err(Error::invalid("late", "refused after its append"))
                })
            }),
        ] {
            let before = db.writer_stats();
            let results = batch_of(
                &db,
                vec![
                    Box::new(|db| append(db, "a")),
                    failing,
                    Box::new(|db| {
                        db.write(|tx| {
                            let ev = NewEvent::new("Opened", "c", "tester", NOW).payload_json("{}");
                            tx.append("ws", &ev).map(|_| ())
                        })
                    }),
                ],
            );
            assert!(
                matches!(results[0], Err(Error::TransactionAborted { .. })),
                "{results:?}"
            );
            assert!(results[1].is_err(), "{results:?}");
            assert!(
                matches!(results[2], Err(Error::TransactionAborted { .. })),
                "{results:?}"
            );
            assert!(subjects(&db).is_empty(), "{:?}", subjects(&db));
            assert_eq!(db.writer_stats().aborts - before.aborts, 1);
        }
        append(&db, "d").unwrap();
        assert_eq!(subjects(&db), ["d"]);
    }

    /// No invariant of its own: the wake-ups' economy. An engine's listener
    /// passes over its own engine's notifications (its threads were woken
    /// as each commit returned) and wakes them for another's. The
    /// notifier's count of nudges says how many each commit made: one for
    /// each of this engine's commits (its own, at the commit), one for the
    /// mark another session sends after them, heard once the listener read
    /// every notification before it (the server delivers them in commit
    /// order).
    #[test]
    fn an_engine_is_woken_once_for_its_own_commits_and_by_its_listener_for_anothers() {
        use crate::core::wake::Wake;
        use std::time::{Duration, Instant};

        let schema = PgSchema::new();
        let db = open_as(&schema, true);
        // The listener nudges once when it is listening (making the
        // workspace woke no one).
        let deadline = Instant::now() + Duration::from_secs(60);
        while db.notifier.version() == 0 {
            assert!(Instant::now() < deadline, "the listener never listened");
            std::thread::yield_now();
        }
        let before = db.notifier.version();
        const OWN: u64 = 10;
        for _ in 0..OWN {
            db.write_alone(|tx| {
                tx.mark_runs();
                Ok::<_, Error>(())
            })
            .unwrap();
        }
        // Only the mark wakes a thread waiting for events (the commits made
        // runs claimable). The wait's heartbeat comes at its deadline only,
        // and would wake it too: the wait must end before.
        let events = db.notifier.subscribe(Wake::EVENTS);
        schema
            .client()
            .batch_execute(&format!("NOTIFY {}, 'e'", db.channel))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        assert!(events.wait(Duration::from_secs(3600), deadline));
        assert!(Instant::now() < deadline, "the mark was not heard");
        assert_eq!(db.notifier.version() - before, OWN + 1);
    }

    /// Invariant 5 with one commit fewer for a plain enqueue: the run
    /// handed over at its insert is claimed under the holder's first
    /// attempt once its one statement returns, and wakes no other process;
    /// a run left for the claim (its action paused, or no place reserved)
    /// is notified as a plain enqueue's is, and an id there already is
    /// neither made nor claimed.
    #[test]
    fn a_lone_run_handed_over_is_claimed_in_its_own_commit_and_notified_only_when_left() {
        use crate::core::postgres::listen::Heard;
        use crate::core::wake::Wake;
        use crate::store::Control;
        use crate::store::conformance::runs::task;
        use crate::store::runs::{Inserted, NewRun};
        use postgres::fallible_iterator::FallibleIterator;

        let schema = PgSchema::new();
        let db = open(&schema);
        let mut listener = schema.client();
        listener
            .batch_execute(&format!("LISTEN {}", db.channel))
            .unwrap();
        // The conformance tests' task, of `action`.
        let run = |id, action| NewRun {
            action,
            ..task(id, None, None)
        };
        let (made, claimed) = db
            .insert_run_alone_handed(&run("r1", "send"), &|| true)
            .unwrap();
        let claimed = claimed.expect("claimed at its insert");
        assert_eq!(made, Inserted::New);
        assert_eq!(
            (claimed.id.as_str(), claimed.state.as_str(), claimed.attempt),
            ("r1", "running", 1)
        );
        let settings = db.settings();
        assert_eq!(
            (claimed.claimed_by.as_deref(), claimed.claim_expires_at),
            (
                Some(settings.holder_id.as_str()),
                Some(NOW + settings.lease_ttl_ms())
            )
        );
        db.write(|tx| Control::pause(tx.core(), "action", "mail", NOW, "op", "maintenance"))
            .unwrap();
        let left = db
            .insert_run_alone_handed(&run("r2", "mail"), &|| true)
            .unwrap();
        assert_eq!((left.0, left.1.is_none()), (Inserted::New, true));
        let r2 = db
            .read_with(&mut |c| crate::store::Runs::get(c, "r2"))
            .unwrap()
            .expect("inserted");
        assert_eq!((r2.state.as_str(), r2.attempt), ("ready", 0));
        let again = db
            .insert_run_alone_handed(&run("r1", "send"), &|| true)
            .unwrap();
        assert_eq!((again.0, again.1.is_none()), (Inserted::Existed, true));
        // No place reserved: the plain insert, notified.
        let plain = db
            .insert_run_alone_handed(&run("r3", "send"), &|| false)
            .unwrap();
        assert_eq!((plain.0, plain.1.is_none()), (Inserted::New, true));
        // A mark after the four: notifications come in commit order.
        schema
            .client()
            .batch_execute(&format!("NOTIFY {}, 'end'", db.channel))
            .unwrap();
        let mut heard = Vec::new();
        let mut notes = listener.notifications();
        let mut iter = notes.blocking_iter();
        while let Some(n) = iter.next().unwrap() {
            if n.payload() == "end" {
                break;
            }
            heard.push(n.payload().to_string());
        }
        // The run left for the claim and the plain one (the pause's commit
        // made no claimable run), each notified as this handle's own and
        // heard by another as runs.
        let runs = db.notice(Wake::RUNS);
        assert_eq!(heard.last().map(String::as_str), Some(&*runs), "{heard:?}");
        assert_eq!(
            heard.iter().filter(|p| **p == *runs).count(),
            2,
            "{heard:?}"
        );
        assert_eq!(db.notices.heard(&runs), Heard::Own);
        let other = open(&schema);
        assert_eq!(other.notices.heard(&runs), Heard::Made(Wake::RUNS));
    }
}
