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

struct Poller {
    conn: Connection,
    last: Option<i64>,
}

impl Notifier {
    /// `conn` is a dedicated read connection on the file, used only to poll
    /// `data_version`.
    pub(crate) fn new(conn: Connection) -> Notifier {
        Notifier {
            subscribers: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            version: AtomicU64::new(0),
            poll: Mutex::new(Poller { conn, last: None }),
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
        let now: Option<i64> = p
            .conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .ok();
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
pub(crate) struct Subscription {
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
