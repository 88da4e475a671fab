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
//! What each backend adds lives in its folder: SQLite's `data_version`
//! poll and WAL watch in `core::sqlite::watch`, PostgreSQL's head poll and
//! `LISTEN` in `core::postgres::listen`.
//!
//! **Watch** (SQLite, feature `watch`). A thread of the notifier's waits for the
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

use crossbeam_channel::{Receiver, Sender, bounded};

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

/// What ended a [`Subscription`]'s wait.
enum Woken<T> {
    /// A nudge, or a heartbeat that saw another connection's commit.
    Changed,
    /// What the other channel received.
    Got(T),
    /// The deadline passed (or the nudges' sender is gone).
    Deadline,
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
        let never = crossbeam_channel::never::<()>();
        !matches!(self.woken(heartbeat, deadline, &never), Woken::Deadline)
    }

    /// As [`Subscription::wait`], and also ending when `other` receives,
    /// with what it received (None for a nudge, a heartbeat's change, or
    /// the deadline).
    pub(crate) fn wait_or<T>(
        &self,
        heartbeat: Duration,
        deadline: Instant,
        other: &Receiver<T>,
    ) -> Option<T> {
        match self.woken(heartbeat, deadline, other) {
            Woken::Got(t) => Some(t),
            Woken::Changed | Woken::Deadline => None,
        }
    }

    /// The wait itself: a heartbeat at a time until a nudge, `other`, a
    /// heartbeat's change, or `deadline`.
    fn woken<T>(&self, heartbeat: Duration, deadline: Instant, other: &Receiver<T>) -> Woken<T> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Woken::Deadline;
            }
            let slice = heartbeat.min(deadline - now);
            crossbeam_channel::select! {
                recv(self.rx) -> got => {
                    return if got.is_ok() { Woken::Changed } else { Woken::Deadline };
                }
                recv(other) -> got => {
                    return got.map_or(Woken::Deadline, Woken::Got);
                }
                default(slice) => {
                    if self.notifier.poll() {
                        // Our own poll nudged us too; take that wake-up.
                        let _ = self.rx.try_recv();
                        return Woken::Changed;
                    }
                }
            }
        }
    }

    /// The receiving end, for threads that `select!` over it and others.
    #[allow(dead_code)]
    pub(crate) fn receiver(&self) -> &Receiver<()> {
        &self.rx
    }
}
