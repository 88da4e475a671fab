//! Change notification: the nudge and the heartbeat.
//!
//! **Nudge.** A commit that appended events wakes every subscriber in this
//! process at once, through a `crossbeam-channel` per subscriber (bounded to
//! one pending wake-up, so a burst of commits costs a waiter one wake-up).
//!
//! **Heartbeat.** Commits made by other processes send no nudge. A subscriber
//! that has waited one heartbeat without one asks [`Notifier::poll`], which
//! reads `PRAGMA data_version` on a connection kept for that purpose: the
//! number changes whenever any other connection committed, and reading it
//! costs no disk I/O. On PostgreSQL (feature `postgres`) it reads the head
//! seq instead, on a connection of its own that is connected again when the
//! server cut it.
//!
//! **Watch** (feature `watch`). A thread of the notifier's waits for the
//! operating system to say the file's WAL was written (inotify, kqueue, …)
//! and then polls `data_version` at once and a few times more over the next
//! ~60 ms (a commit's last frame is written before its fsync and before the
//! WAL index says it is committed), so another process's commit wakes the
//! waiters within a millisecond or two instead of a heartbeat. The
//! heartbeat stays: it is the correctness path if the watch misses or
//! cannot be set up.
//!
//! **Listen** (PostgreSQL). A commit that appended sends `NOTIFY` with its
//! `COMMIT`; a thread of the notifier's `LISTEN`s on a connection of its
//! own and nudges at each notification, from any process, connecting again
//! half a second after the connection broke. The heartbeat stays the
//! correctness path here too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use rusqlite::Connection;

pub(crate) struct Notifier {
    subscribers: Mutex<Vec<(u64, Sender<()>)>>,
    next_id: AtomicU64,
    /// Bumped by every nudge and every heartbeat that saw a change.
    version: AtomicU64,
    poll: Mutex<Poller>,
}

/// What the heartbeat reads: a number that changes whenever another
/// connection committed (SQLite's `data_version`; the head seq on
/// PostgreSQL), or None when it could not be read.
type Version = Box<dyn FnMut() -> Option<i64> + Send>;

struct Poller {
    read: Version,
    last: Option<i64>,
}

impl Notifier {
    /// `conn` is a dedicated read connection on the file, used only to poll
    /// `data_version`.
    pub(crate) fn new(conn: Connection) -> Notifier {
        Notifier::polling(Box::new(move || {
            conn.query_row("PRAGMA data_version", [], |r| r.get(0)).ok()
        }))
    }

    /// A notifier whose heartbeat calls `read`: a number that changes
    /// whenever another connection committed.
    pub(crate) fn polling(read: Version) -> Notifier {
        Notifier {
            subscribers: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            version: AtomicU64::new(0),
            poll: Mutex::new(Poller { read, last: None }),
        }
    }

    /// A new subscription. Subscribe before reading what you will wait for,
    /// so a commit between the read and the wait is not missed.
    pub(crate) fn subscribe(self: &Arc<Self>) -> Subscription {
        let (tx, rx) = bounded(1);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, tx));
        Subscription {
            id,
            rx,
            notifier: Arc::clone(self),
        }
    }

    /// Wakes every subscriber.
    pub(crate) fn nudge(&self) {
        self.version.fetch_add(1, Ordering::SeqCst);
        let subs = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (_, s) in subs.iter() {
            // Full means a wake-up is already pending: one is enough.
            let _ = s.try_send(());
        }
    }

    /// How many nudges and changed heartbeats there have been.
    #[allow(dead_code)]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// The heartbeat: true (and a nudge to everyone) when some connection
    /// committed since the last poll. Cheap enough to call every few
    /// milliseconds.
    pub(crate) fn poll(&self) -> bool {
        let mut p = self.poll.lock().unwrap_or_else(PoisonError::into_inner);
        let now = (p.read)();
        let changed = match (p.last, now) {
            (Some(a), Some(b)) => a != b,
            // The first poll, or an unreadable file: look again to be safe.
            _ => true,
        };
        p.last = now;
        drop(p);
        if changed {
            self.nudge();
        }
        changed
    }
}

/// One waiter's end of the nudges. Dropping it unsubscribes.
pub struct Subscription {
    id: u64,
    rx: Receiver<()>,
    notifier: Arc<Notifier>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.notifier
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(id, _)| *id != self.id);
    }
}

impl Subscription {
    /// Waits until a nudge, a heartbeat that saw another connection's commit,
    /// or `deadline`. Returns false only when the deadline passed with no sign
    /// of a change.
    pub(crate) fn wait(&self, heartbeat: Duration, deadline: Instant) -> bool {
        let notifier = &self.notifier;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let slice = heartbeat.min(deadline - now);
            match self.rx.recv_timeout(slice) {
                Ok(()) => return true,
                Err(RecvTimeoutError::Timeout) => {
                    if notifier.poll() {
                        // Our own poll nudged us too; take that wake-up.
                        let _ = self.rx.try_recv();
                        return true;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// The receiving end, for threads that `select!` over it and others.
    #[allow(dead_code)]
    pub(crate) fn receiver(&self) -> &Receiver<()> {
        &self.rx
    }
}

/// The WAL watch of one open file (feature `watch`): dropped with the file,
/// which ends its thread.
#[cfg(feature = "watch")]
pub(crate) struct FileWatch {
    watcher: Option<notify::RecommendedWatcher>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "watch")]
impl Drop for FileWatch {
    /// Stops the watch and joins its thread, so a dropped engine leaves no
    /// connection to the file behind.
    fn drop(&mut self) {
        drop(self.watcher.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(not(feature = "watch"))]
pub(crate) struct FileWatch;

impl Notifier {
    /// Watches `db`'s WAL for writes (feature `watch`). None, with a log
    /// line, when the operating system will not watch it: the heartbeat
    /// alone then notices other processes' commits.
    #[cfg(feature = "watch")]
    pub(crate) fn watch_file(self: &Arc<Self>, db: &std::path::Path) -> Option<FileWatch> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let dir = match db.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        let dir = dir.canonicalize().ok()?;
        let mut wal_name = db.file_name()?.to_os_string();
        wal_name.push("-wal");
        let (tx, rx) = bounded::<()>(1);
        let wal = wal_name.clone();
        let handler = move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            let ours = matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_))
                && event
                    .paths
                    .iter()
                    .any(|p| p.file_name().is_some_and(|n| n == wal.as_os_str()));
            if ours {
                // Full: a poll is pending already.
                let _ = tx.try_send(());
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(e) => {
                log::info!(
                    "no file watch ({e}): other processes' commits are noticed by the heartbeat"
                );
                return None;
            }
        };
        if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            log::info!(
                "no file watch on {} ({e}): the heartbeat notices other processes' commits",
                dir.display()
            );
            return None;
        }
        let notifier = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("reflexr-watch".into())
            .spawn(move || {
                // Ends when the watcher (and with it the sender) is dropped.
                'events: while rx.recv().is_ok() {
                    // µs: dense at first (a commit's fsync is usually under
                    // a millisecond), then backing off; a new write starts
                    // over.
                    for pause in [
                        0u64, 200, 300, 500, 1_000, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000,
                    ] {
                        if pause > 0 {
                            match rx.recv_timeout(Duration::from_micros(pause)) {
                                Ok(()) => {}
                                Err(RecvTimeoutError::Timeout) => {}
                                Err(RecvTimeoutError::Disconnected) => break 'events,
                            }
                        }
                        if notifier.poll() {
                            break;
                        }
                    }
                }
            });
        match spawned {
            Ok(thread) => Some(FileWatch {
                watcher: Some(watcher),
                thread: Some(thread),
            }),
            Err(_) => None,
        }
    }

    #[cfg(not(feature = "watch"))]
    pub(crate) fn watch_file(self: &Arc<Self>, _db: &std::path::Path) -> Option<FileWatch> {
        None
    }
}

/// A connection string for the notifier's own connections: the
/// application's, with a connect timeout when it has none, so a server out
/// of reach holds a heartbeat (or the listener's stop) a few seconds at
/// most.
#[cfg(feature = "postgres")]
fn with_timeout(config: &postgres::Config) -> postgres::Config {
    let mut config = config.clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(3));
    }
    config
}

#[cfg(feature = "postgres")]
impl Notifier {
    /// A notifier for a PostgreSQL database: its heartbeat reads the head
    /// seq on `first`, a connection of its own, connected again through
    /// `config` when the server cut it.
    pub(crate) fn postgres(first: postgres::Client, config: &postgres::Config) -> Notifier {
        let config = with_timeout(config);
        let slot = Mutex::new(Some(first));
        Notifier::polling(Box::new(move || {
            let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.as_ref().is_none_or(postgres::Client::is_closed) {
                *slot = config.connect(postgres::NoTls).ok();
            }
            let seq = crate::store::pg::committed_head(slot.as_mut()?);
            if seq.is_err() {
                *slot = None;
            }
            seq.ok()
        }))
    }

    /// Listens on `channel` for other processes' commits, on a connection
    /// of its own, and nudges at each notification: a waiter hears of a
    /// commit at once instead of at the next heartbeat (which stays the
    /// correctness path).
    pub(crate) fn listen_postgres(
        self: &Arc<Self>,
        config: &postgres::Config,
        channel: &'static str,
    ) -> std::io::Result<PgListen> {
        let config = with_timeout(config);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (notifier, stop) = (Arc::clone(self), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("reflexr-listen".into())
                .spawn(move || listen_for_commits(&config, channel, &notifier, &stop))?
        };
        Ok(PgListen {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }
}

/// The listener of one open PostgreSQL database: stopped (and its thread
/// joined) by [`PgListen::stop`] or when dropped.
#[cfg(feature = "postgres")]
pub(crate) struct PgListen {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[cfg(feature = "postgres")]
impl PgListen {
    /// Stops the listener and waits for its thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

#[cfg(feature = "postgres")]
impl Drop for PgListen {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(feature = "postgres")]
/// The listener: `LISTEN` on `channel` on a connection of its own, a nudge for
/// every notification (the nudge coalesces a burst), reconnecting half a
/// second after the connection broke, until `stop`.
fn listen_for_commits(
    config: &postgres::Config,
    channel: &str,
    notifier: &Notifier,
    stop: &std::sync::atomic::AtomicBool,
) {
    // How long one wait for a notification lasts: the stop is seen this soon.
    const TURN: Duration = Duration::from_millis(100);
    // How long after a failed connection the listener tries again.
    const RECONNECT: Duration = Duration::from_millis(500);
    while !stop.load(Ordering::SeqCst) {
        let mut client: postgres::Client = match config.connect(postgres::NoTls) {
            Ok(c) => c,
            Err(e) => {
                log::debug!("reflexr: the PostgreSQL listener cannot connect: {e}");
                std::thread::sleep(RECONNECT);
                continue;
            }
        };
        if let Err(e) = crate::store::pg::listen(&mut client, channel) {
            log::debug!("reflexr: LISTEN failed: {e}");
            std::thread::sleep(RECONNECT);
            continue;
        }
        // Whatever committed while no one listened is found by the next
        // heartbeat; nudge now so waiters read at once.
        notifier.nudge();
        while !stop.load(Ordering::SeqCst) {
            let next = {
                use postgres::fallible_iterator::FallibleIterator;
                client.notifications().timeout_iter(TURN).next()
            };
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
