//! SQLite's open database, [`Db`]: one open reflexr file — the core every other part of the engine
//! works through. It owns the writer (and so every [`Tx`]), the pool of read
//! connections, the notifier, the clock and the settings; it knows nothing
//! of rules, runs or threads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::time::Duration;

use r2d2::Pool;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;

use crate::base::clock::Clock;
use crate::base::error::{Error, Result};
use crate::core::db::{CoreDb, RunWaiter};
use crate::core::db::{Env, Tx};
use crate::core::settings::Settings;
use crate::core::sqlite::watch::FileWatch;
use crate::core::sqlite::writer::Writer;
use crate::core::wake::{Notifier, Subscription, WaitsHint, Wake};
use crate::core::writer::WriterStats;
use crate::store::Sqlite;
use crate::store::sqlite::conn::{self, Role};
use crate::store::sqlite::schema;

/// How to open a file, besides the settings.
#[derive(Clone)]
pub struct Open {
    /// The file.
    pub(crate) path: PathBuf,
    pub(crate) create: bool,
    pub(crate) pool_size: u32,
    pub(crate) verify: bool,
    /// A VFS registered with SQLite to open the file through (None: the
    /// default).
    pub(crate) vfs: Option<String>,
}

/// One open reflexr file.
pub struct Db {
    path: PathBuf,
    env: Env,
    pool: Pool<Readers>,
    /// Declared after the pool, so dropped after it: waits for the read
    /// connections a job of the pool's own thread may still hold.
    _readers_closed: ReadersClosed,
    writer: Writer,
    notifier: Arc<Notifier>,
    /// The WAL watch (feature `watch`), ended with the file.
    _watch: Option<FileWatch>,
    /// The VFS the file was opened through, if not the default.
    vfs: Option<String>,
    /// Threads waiting for runs to end ([`Db::run_waiter`]): settlements
    /// nudge only while there are some.
    run_waiters: std::sync::atomic::AtomicUsize,
}

/// The pool's read connections, each counted while it is open.
///
/// r2d2 opens connections on a thread of its own, and a job of that thread
/// holds the pool while it connects: a file dropped meanwhile kept that
/// connection — and SQLite's checkpoint at the last close — past its drop,
/// so a caller that read or copied the file right after saw it change.
/// [`Live`] makes the drop wait for them.
struct Readers {
    inner: SqliteConnectionManager,
    live: Live,
}

/// A pooled read connection: a SQLite connection, counted in [`Live`]
/// until it has closed (the fields drop in order: the connection, then
/// its count).
struct Reader {
    conn: Connection,
    _counted: Counted,
}

impl std::ops::Deref for Reader {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

/// One open connection's place in [`Live`].
struct Counted(Live);

impl Drop for Counted {
    fn drop(&mut self) {
        let (open, closed) = &*self.0.0;
        let mut n = open.lock().unwrap_or_else(PoisonError::into_inner);
        *n = n.saturating_sub(1);
        closed.notify_all();
    }
}

impl r2d2::ManageConnection for Readers {
    type Connection = Reader;
    type Error = rusqlite::Error;

    fn connect(&self) -> std::result::Result<Reader, rusqlite::Error> {
        let conn = self.inner.connect()?;
        *self.live.0.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Ok(Reader {
            conn,
            _counted: Counted(self.live.clone()),
        })
    }

    fn is_valid(&self, conn: &mut Reader) -> std::result::Result<(), rusqlite::Error> {
        self.inner.is_valid(&mut conn.conn)
    }

    fn has_broken(&self, conn: &mut Reader) -> bool {
        self.inner.has_broken(&mut conn.conn)
    }
}

/// How many of a pool's read connections are open.
#[derive(Clone, Default)]
struct Live(Arc<(Mutex<usize>, Condvar)>);

/// Set while a file's drop waits for its read connections (tests watch it).
#[cfg(test)]
static READERS_AWAITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The file's own hold on [`Live`]: dropped after the pool, it waits (up to
/// ten seconds) until every read connection has closed.
struct ReadersClosed(Live);

impl Drop for ReadersClosed {
    fn drop(&mut self) {
        let (open, closed) = &*self.0.0;
        let n = open.lock().unwrap_or_else(PoisonError::into_inner);
        #[cfg(test)]
        if *n > 0 {
            READERS_AWAITED.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let _ = closed
            .wait_timeout_while(n, Duration::from_secs(10), |n| *n > 0)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// The default heartbeat while the WAL watch runs.
const WATCHED_HEARTBEAT: Duration = Duration::from_millis(200);

impl Db {
    /// Opens (creating it if allowed) the file at `path`: recognised, its
    /// schema applied or migrated, every connection configured and its
    /// pragmas read back.
    pub(crate) fn open(open: &Open, settings: Settings, clock: Arc<dyn Clock>) -> Result<Db> {
        if let Some(vfs) = &open.vfs {
            crate::base::limits::check_name("vfs", vfs)?;
        }
        let path = open.path.as_path();
        if !(1..=64).contains(&open.pool_size) {
            return Err(Error::invalid("pool_size", "must be 1 to 64"));
        }
        let writer_conn = schema::open_writer(
            path,
            open.vfs.as_deref(),
            open.create,
            settings.synchronous,
            open.verify,
            settings.busy_timeout,
        )?;

        // One reader configured by hand first, so a pragma SQLite refuses is
        // reported as such instead of as a pool that never fills.
        let first = conn::open_raw(path, false, open.vfs.as_deref())?;
        conn::retry_busy(settings.busy_timeout, || {
            conn::configure(&first, settings.synchronous, Role::Reader)
        })?;
        drop(first);
        let writer_conn = Arc::new(Mutex::new(writer_conn));
        let notifier = Arc::new(Notifier::sqlite(Arc::clone(&writer_conn)));

        let sync = settings.synchronous;
        let (target, flags) = conn::target(path, open.vfs.as_deref(), false)?;
        let manager = SqliteConnectionManager::file(target)
            .with_flags(flags)
            .with_init(move |conn| {
                conn::configure(conn, sync, Role::Reader)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
            });
        let live = Live::default();
        let manager = Readers {
            inner: manager,
            live: live.clone(),
        };
        let pool = Pool::builder()
            .max_size(open.pool_size)
            .min_idle(Some(1))
            .connection_timeout(settings.busy_timeout.max(Duration::from_secs(1)))
            .thread_pool(Arc::new(scheduled_thread_pool::ScheduledThreadPool::new(1)))
            .build(manager)?;
        let writer = Writer::new(writer_conn, settings.busy_timeout, Arc::clone(&notifier))?;
        let watch = notifier.watch_file(path);
        let mut settings = settings;
        if watch.is_some() && !settings.heartbeat_set {
            // Other processes' commits come through the watch: the
            // heartbeat is the fallback, and the clock for what comes due.
            settings.heartbeat = WATCHED_HEARTBEAT;
        }
        Ok(Db {
            path: path.to_path_buf(),
            env: Env {
                clock,
                settings,
                channels: RwLock::new(BTreeMap::new()),
            },
            pool,
            _readers_closed: ReadersClosed(live),
            writer,
            notifier,
            _watch: watch,
            vfs: open.vfs.clone(),
            run_waiters: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The VFS the file was opened through, if not the default.
    pub(crate) fn vfs(&self) -> Option<&str> {
        self.vfs.as_deref()
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.env.settings
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.env.clock
    }

    /// The engine clock's time, in ms since the epoch.
    pub(crate) fn now_ms(&self) -> i64 {
        self.env.clock.now_ms()
    }

    /// The channels this process may enqueue deliveries on, with the retry
    /// policy each delivery is stored with.
    pub(crate) fn channels(&self) -> &RwLock<BTreeMap<String, crate::base::retry::RetryPolicy>> {
        &self.env.channels
    }

    /// Runs `f` on a pooled read connection. Reads never block the writer (WAL)
    /// and cannot write (`query_only`). A read that meets a busy file is
    /// repeated until the busy timeout.
    pub(crate) fn read<T>(&self, mut f: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        conn::retry_busy(self.env.settings.busy_timeout, || {
            let c = self.pool.get()?;
            f(&c)
        })
    }

    /// Runs `f` in the process's shared write transaction (see
    /// [`crate::core::writer`]) and returns its value once committed.
    pub(crate) fn write<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.writer.write(&self.env, false, f)
    }

    /// [`Db::write`] for work that writes with one statement at most, and
    /// fails only before it or by its own failure (a single append): it
    /// shares the transaction without a savepoint of its own.
    pub(crate) fn write_single<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.writer.write(&self.env, true, f)
    }

    pub(crate) fn writer_stats(&self) -> WriterStats {
        self.writer.stats()
    }

    /// Counts a thread waiting for runs to end, while the guard lives.
    pub(crate) fn run_waiter(&self) -> RunWaiter<'_> {
        RunWaiter::new(&self.run_waiters)
    }

    /// Whether a thread of this process waits for runs to end.
    pub(crate) fn has_run_waiters(&self) -> bool {
        self.run_waiters.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// A subscription to commits that made what `wake` names: this
    /// process's at once (the nudge), other processes' within a heartbeat.
    /// Subscribe before reading what you will wait for.
    pub(crate) fn subscribe_to(&self, wake: Wake) -> Subscription {
        self.notifier.subscribe(wake)
    }

    /// For the core's own tests: a new file with the default settings and
    /// the system clock.
    #[cfg(test)]
    pub(crate) fn open_for_test(path: &Path) -> Db {
        let settings = Settings::for_test();
        let open = Open {
            path: path.to_path_buf(),
            create: true,
            pool_size: 2,
            verify: false,
            vfs: None,
        };
        Db::open(&open, settings, Arc::new(crate::base::clock::SystemClock)).expect("open")
    }

    /// For the writer's own tests.
    #[cfg(test)]
    pub(crate) fn writer(&self) -> &Writer {
        &self.writer
    }
}

impl CoreDb<Sqlite> for Db {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    fn settings(&self) -> &Settings {
        Db::settings(self)
    }
    fn clock(&self) -> &Arc<dyn Clock> {
        Db::clock(self)
    }
    fn vfs(&self) -> Option<&str> {
        Db::vfs(self)
    }
    fn now_ms(&self) -> i64 {
        Db::now_ms(self)
    }
    fn read_with<T>(&self, f: &mut dyn FnMut(&Connection) -> Result<T>) -> Result<T> {
        self.read(f)
    }
    fn write_with<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        self.write(f)
    }
    fn write_single<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        Db::write_single(self, f)
    }
    fn subscribe_to(&self, wake: Wake) -> Subscription {
        Db::subscribe_to(self, wake)
    }
    fn waits_hint(&self) -> &WaitsHint {
        self.notifier.waits()
    }
    fn writer_stats(&self) -> WriterStats {
        Db::writer_stats(self)
    }
    fn channels(&self) -> &RwLock<BTreeMap<String, crate::base::retry::RetryPolicy>> {
        Db::channels(self)
    }
    fn nudge(&self) {
        self.notifier.nudge();
    }
    fn nudge_for(&self, made: Wake) {
        self.notifier.nudge_for(made);
    }
    fn run_waiter(&self) -> RunWaiter<'_> {
        Db::run_waiter(self)
    }
    fn has_run_waiters(&self) -> bool {
        Db::has_run_waiters(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;

    /// Invariant 10 (nothing committed is changed behind the caller's
    /// back) once a file is closed: a read connection the pool's own thread
    /// still holds — as a job that connects does — keeps the file's drop
    /// waiting until it has closed, so no checkpoint at its close touches
    /// the file after the drop returns.
    #[test]
    fn a_file_is_dropped_only_once_its_read_connections_closed() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open_for_test(&dir.path().join("f.db"));
        let held = db.pool.get().unwrap();
        let returned = Arc::new(AtomicBool::new(false));
        let dropping = {
            let returned = Arc::clone(&returned);
            std::thread::spawn(move || {
                drop(db);
                returned.store(true, Ordering::SeqCst);
            })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !READERS_AWAITED.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the drop never waited");
            std::thread::yield_now();
        }
        assert!(
            !returned.load(Ordering::SeqCst),
            "returned with a reader open"
        );
        drop(held);
        dropping.join().unwrap();
        assert!(returned.load(Ordering::SeqCst));
    }
}
