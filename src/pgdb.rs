//! [`PgDb`]: one open PostgreSQL database (feature `postgres`) — the core
//! the engine works through on a server, as [`crate::db::Db`] is on a file.
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
//!   each in a savepoint of its own (group commit by flat combining, as on
//!   SQLite): appends take their seqs one transaction at a time across
//!   every process (see `store::pg`), so a commit that carries many
//!   callers' appends turns the head's lock once for all of them. Other
//!   processes write beside this one.
//! - **Wake-ups.** A transaction that appended sends `NOTIFY reflexr` with
//!   its commit; a listener thread (a connection of its own, `LISTEN`)
//!   nudges this process's waiters when one arrives, from any process. The
//!   heartbeat stays the correctness path: it reads the head seq, so a
//!   missed notification (the listener reconnecting) costs a heartbeat,
//!   never an event. Notifications are debounced by the nudge itself: a
//!   burst of them wakes a waiter once.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls};

use crate::clock::Clock;
use crate::combiner::{Batch, Combiner, Ended, Outcome};
use crate::db::CoreDb;
use crate::error::{Error, Result};
use crate::notify::{Notifier, Subscription};
use crate::settings::Settings;
use crate::store::backend::Postgres;
use crate::store::pg::{self, PgConn, Pool};
use crate::tx::{Env, Tx};
use crate::writer::{Inside, NEXT_WRITER_ID, WriterStats};

/// The channel commits are announced on.
pub(crate) const CHANNEL: &str = "reflexr";

/// One open PostgreSQL database.
pub struct PgDb {
    /// The server and database, for messages (never the password).
    what: String,
    env: Env,
    pool: Pool,
    notifier: Arc<Notifier>,
    stop: Arc<AtomicBool>,
    listener: Mutex<Option<JoinHandle<()>>>,
    /// Concurrent writers of this process share transactions (group
    /// commit), as on SQLite: one commit, one turn of the head's lock.
    combiner: Combiner<Postgres>,
    /// This writer's id, for catching a write started inside a write.
    id: usize,
    /// The writer's counters ([`WriterStats`]).
    commits: AtomicU64,
    writes: AtomicU64,
    aborts: AtomicU64,
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
        pg::schema::apply(&mut first, &what)?;

        let manager = r2d2_postgres::PostgresConnectionManager::new(config.clone(), NoTls);
        // Not tested on checkout (a round trip per operation): a broken
        // connection shows when its BEGIN fails, and `begin` takes another.
        let pool = r2d2::Pool::builder()
            .max_size(pool_size)
            .test_on_check_out(false)
            .min_idle(Some(1))
            .connection_timeout(settings.busy_timeout.max(Duration::from_secs(1)))
            .thread_pool(Arc::new(scheduled_thread_pool::ScheduledThreadPool::new(1)))
            .build(manager)?;

        // The heartbeat reads the head seq on a connection of its own,
        // connected again (within a few seconds, or not this beat) when the
        // server cut it: waiting threads poll it under a lock.
        let mut poll_config = config.clone();
        if poll_config.get_connect_timeout().is_none() {
            poll_config.connect_timeout(Duration::from_secs(3));
        }
        let poller = Mutex::new(Some(first));
        let notifier = Arc::new(Notifier::polling(Box::new(move || {
            let mut slot = poller.lock().unwrap_or_else(|e| e.into_inner());
            if slot.as_ref().is_none_or(Client::is_closed) {
                *slot = poll_config.connect(NoTls).ok();
            }
            let seq = slot
                .as_mut()?
                .query_one("SELECT seq FROM reflexr_head", &[])
                .map(|r| r.get(0));
            if seq.is_err() {
                *slot = None;
            }
            seq.ok()
        })));

        let stop = Arc::new(AtomicBool::new(false));
        let mut config = config;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(3));
        }
        let listener = if listen {
            let (notifier, stop) = (Arc::clone(&notifier), Arc::clone(&stop));
            Some(
                std::thread::Builder::new()
                    .name("reflexr-listen".into())
                    .spawn(move || listen_for_commits(&config, &notifier, &stop))?,
            )
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
            stop,
            listener: Mutex::new(listener),
            combiner: Combiner::new(),
            id: NEXT_WRITER_ID.fetch_add(1, Ordering::Relaxed),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
        })
    }

    /// The server and database, as `host:port/dbname`.
    pub(crate) fn what(&self) -> &str {
        &self.what
    }

    /// Runs `f` on a pooled connection, in a READ ONLY transaction of its
    /// own, ended when `f` returns.
    pub(crate) fn read<T>(&self, mut f: impl FnMut(&PgConn) -> Result<T>) -> Result<T> {
        let conn = self.begin_as(true)?;
        let out = f(&conn)?;
        conn.commit()?;
        Ok(out)
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
    /// SQLite's writer), each in a savepoint of its own, so an error (or a
    /// panic) of `f` rolls back its work alone.
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
        let _inside = Inside::enter(self.id);
        let mut f = Some(f);
        let mut slot: Option<std::thread::Result<std::result::Result<T, E>>> = None;
        let mut work = |tx: &mut Tx<'_, Postgres>| -> Outcome {
            let Some(f) = f.take() else {
                return Outcome::default();
            };
            let mut result = catch_unwind(AssertUnwindSafe(|| f(tx)));
            // A statement failed on the server and the closure went on
            // (it caught the error): PostgreSQL aborted the transaction,
            // so none of this write can commit. Say so, rather than Ok.
            if matches!(result, Ok(Ok(_))) && tx.core().is_aborted() {
                result = Ok(Err(E::from(Error::TransactionAborted {
                    detail: "a statement of this write failed on the server, which aborted \
                             its transaction; the closure went on and returned Ok, but nothing \
                             of the write was kept"
                        .into(),
                })));
            }
            let ok = matches!(result, Ok(Ok(_)));
            slot = Some(result);
            Outcome {
                ok,
                nudge: tx.wants_nudge(),
            }
        };
        let ended = self
            .combiner
            .submit(&mut work, &mut |batch| self.run_batch(batch));
        match slot {
            Some(Err(panic)) => resume_unwind(panic),
            Some(Ok(Err(e))) => Err(e),
            Some(Ok(Ok(v))) => match ended {
                Ok(()) => Ok(v),
                Err(e) => Err(E::from(Error::clone(&e))),
            },
            None => Err(E::from(match ended {
                Err(e) => Error::clone(&e),
                Ok(()) => Error::TransactionAborted {
                    detail: "the write was not run".into(),
                },
            })),
        }
    }

    /// One transaction over the batch: each member in a savepoint (none
    /// for a batch of one: its transaction is its own), then the commit;
    /// the batch, dropped on the way out, tells the members. A failure of
    /// the connection itself ends the batch, and nothing of it commits.
    fn run_batch(&self, mut batch: Batch<Postgres>) {
        const SAVEPOINT: &str = "reflexr_call";
        let conn = match self.begin() {
            Ok(c) => c,
            Err(e) => return batch.end(Err(Arc::new(e))),
        };
        let alone = batch.members().len() == 1;
        let (mut nudge, mut kept) = (false, 0usize);
        let mut failed: Option<Error> = None;
        // The previous member's savepoint, released with the next's making:
        // one round trip between members.
        let mut release = false;
        for member in batch.members() {
            if !alone {
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
            let mark = conn.last_seq();
            let mut tx = Tx::<Postgres>::new(&conn, &(), &self.env);
            let outcome = member.run(&mut tx);
            if outcome.ok {
                kept += 1;
                nudge |= outcome.nudge;
            } else if !alone && let Err(e) = conn.rollback_to(SAVEPOINT, mark) {
                failed = Some(e);
                break;
            }
            release = true;
        }
        let ended: Ended = match failed {
            Some(e) => Err(Arc::new(e)),
            // A lone member that failed: its transaction rolls back (when
            // `conn` is dropped), and the member reports its own error.
            None if kept == 0 => Ok(()),
            None => {
                let committed = if nudge {
                    conn.commit_notifying(CHANNEL)
                } else {
                    conn.commit()
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
        let woke = nudge && ended.is_ok();
        batch.end(ended);
        drop(batch);
        if woke {
            self.notifier.nudge();
        }
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
        let mut tries = self.pool.max_size() + 1;
        loop {
            match PgConn::begin_as(self.pool.get()?, read_only) {
                Err(Error::Io { .. }) if tries > 1 => tries -= 1,
                other => return other,
            }
        }
    }

    /// Stops the listener and waits for it.
    pub(crate) fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let handle = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        self.close();
    }
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

/// The listener: `LISTEN reflexr` on a connection of its own, a nudge for
/// every notification (the nudge coalesces a burst), reconnecting half a
/// second after the connection broke, until `stop`.
fn listen_for_commits(config: &postgres::Config, notifier: &Notifier, stop: &AtomicBool) {
    // How long one wait for a notification lasts: the stop is seen this soon.
    const TURN: Duration = Duration::from_millis(100);
    // How long after a failed connection the listener tries again.
    const RECONNECT: Duration = Duration::from_millis(500);
    while !stop.load(Ordering::SeqCst) {
        let mut client: Client = match config.connect(NoTls) {
            Ok(c) => c,
            Err(e) => {
                log::debug!("reflexr: the PostgreSQL listener cannot connect: {e}");
                std::thread::sleep(RECONNECT);
                continue;
            }
        };
        if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")) {
            log::debug!("reflexr: LISTEN failed: {e}");
            std::thread::sleep(RECONNECT);
            continue;
        }
        // Whatever committed while no one listened is found by the next
        // heartbeat; nudge now so waiters read at once.
        notifier.nudge();
        while !stop.load(Ordering::SeqCst) {
            let next = client.notifications().timeout_iter(TURN).next();
            match next {
                // Nudged at once; a burst costs a waiter one wake-up.
                Ok(Some(_)) => notifier.nudge(),
                Ok(None) => {}
                Err(e) => {
                    log::debug!("reflexr: the PostgreSQL listener lost its connection: {e}");
                    break;
                }
            }
            if client.is_closed() {
                break;
            }
        }
    }
}

impl CoreDb<Postgres> for PgDb {
    fn settings(&self) -> &Settings {
        &self.env.settings
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
    fn subscribe(&self) -> Subscription {
        self.notifier.subscribe()
    }
    fn writer_stats(&self) -> WriterStats {
        WriterStats {
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            aborts: self.aborts.load(Ordering::Relaxed),
        }
    }
}
