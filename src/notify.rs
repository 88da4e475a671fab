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
//! costs no disk I/O.
//!
//! **Watch** (feature `watch`). A thread of the notifier's waits for the
//! operating system to say the file's WAL was written (inotify, kqueue, …)
//! and then polls `data_version` at once and a few times more over the next
//! ~60 ms (a commit's last frame is written before its fsync and before the
//! WAL index says it is committed), so another process's commit wakes the
//! waiters within a millisecond or two instead of a heartbeat. The
//! heartbeat stays: it is the correctness path if the watch misses or
//! cannot be set up.

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
