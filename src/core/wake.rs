//! Change notification: the nudge and the heartbeat.
//!
//! **Nudge.** A commit that appended events, or made runs claimable, wakes
//! the subscribers in this process that wait for what it made ([`Wake`]),
//! at once, through a `crossbeam-channel` per subscriber (bounded to one
//! pending wake-up, so a burst of commits costs a waiter one wake-up). The
//! consumers of the log wait for events; the executors for runs, and for
//! events too while workflows of this process may wait for one
//! ([`WaitsHint`]): an append wakes no executor that has nothing to do, so
//! the one that was handed its run (`work::queue::handoff`) has the cores
//! to itself. What cannot say what it made (the heartbeat's change,
//! another process's commit on SQLite, an explicit nudge) wakes everyone.
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
//! waiters within a millisecond or two instead of a heartbeat. On Linux it
//! does not listen during its first, dense polls (every 100–200 µs for
//! ~700 µs): a commit meanwhile is seen by the next of them, and the
//! events a commit's writes raise in the directory (a dozen to the WAL)
//! wake no one. The
//! heartbeat stays: it is the correctness path if the watch misses or
//! cannot be set up.
//!
//! **Listen** (PostgreSQL). A commit that appended, or made runs
//! claimable, sends `NOTIFY` with its `COMMIT`; a thread of the notifier's
//! `LISTEN`s on a connection of its own and nudges at each notification
//! from another engine (its own commits nudged as they committed),
//! connecting again half a second after the connection broke. The
//! heartbeat stays the correctness path here too.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

/// What a commit made, and so who a nudge wakes: a set of kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wake(u8);

impl Wake {
    /// Nothing to wake anyone for.
    pub const NONE: Wake = Wake(0);
    /// Events were appended: the log's consumers (evaluators, reactions,
    /// followers), and the workflows that wait for an event.
    pub const EVENTS: Wake = Wake(1);
    /// Runs became claimable, or changed so that threads waiting for runs
    /// look again: the executors.
    pub const RUNS: Wake = Wake(2);
    /// A commit that made what no thread of the engine waits for (a run
    /// handed over at its insert): only the watches of every commit
    /// (`Db::subscribe`, `Engine::watch`). Never sent to other processes.
    pub const COMMITS: Wake = Wake(4);
    /// Anything: what cannot say what changed.
    pub const ALL: Wake = Wake(7);

    /// Both sets.
    #[must_use]
    pub fn with(self, other: Wake) -> Wake {
        Wake(self.0 | other.0)
    }

    /// Whether the two sets share a kind.
    pub fn meets(self, other: Wake) -> bool {
        self.0 & other.0 != 0
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The set as a `NOTIFY` payload carries it between processes
    /// (PostgreSQL): `e`, `r` or `er`, before the sender's token
    /// (`core::postgres::listen::Notices`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn payload(self) -> &'static str {
        match self.0 & 3 {
            1 => "e",
            2 => "r",
            _ => "er",
        }
    }

    /// What the payload of the notification a commit that made this set
    /// sends other processes says it made; `None` when they have nothing to
    /// wake for (nothing, or only [`Wake::COMMITS`]).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn notified(self) -> Option<&'static str> {
        self.meets(Wake::EVENTS.with(Wake::RUNS))
            .then(|| self.payload())
    }

    /// What a `NOTIFY` payload's kinds say was made; None for anything
    /// else (an older engine's empty payload), which says nothing of it.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn from_payload(payload: &str) -> Option<Wake> {
        match payload {
            "e" => Some(Wake::EVENTS),
            "r" => Some(Wake::RUNS),
            "er" => Some(Wake::ALL),
            _ => None,
        }
    }
}

/// Whether a workflow may be waiting for an event of the log, as this
/// process knows it: while it may, an append wakes the executors too (they
/// match waits), else only the log's consumers.
///
/// It errs towards "may": it starts so, every wait this process records
/// sets it, and only an executor that found no wait in the file clears it,
/// and only if no wait was recorded here since it began looking (a
/// generation counts them). A wait recorded by another process is seen at
/// the next look any executor here makes (at a heartbeat at the latest),
/// and meanwhile that process's executors, which its own hint keeps
/// listening, match it.
pub struct WaitsHint(AtomicU64);

impl Default for WaitsHint {
    fn default() -> Self {
        WaitsHint(AtomicU64::new(1))
    }
}

impl WaitsHint {
    /// Whether a wait may exist.
    pub fn may_exist(&self) -> bool {
        self.0.load(Ordering::SeqCst) & 1 == 1
    }

    /// The hint before a look at the file: hand it back to
    /// [`WaitsHint::looked`].
    pub fn before_look(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// What a look begun at `before` found: waits (the hint says "may"),
    /// or none (it says "none" unless a wait was recorded since).
    pub fn looked(&self, before: u64, found: bool) {
        if found {
            self.0.fetch_or(1, Ordering::SeqCst);
        } else {
            let _ =
                self.0
                    .compare_exchange(before, before & !1, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// A wait was recorded (after its commit).
    pub fn recorded(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| Some((s + 2) | 1));
    }
}

/// A subscriber as the notifier keeps it: its id, the kinds of nudge it
/// waits for (a [`Wake`]'s bits, which it may change), and its channel.
type Subscriber = (u64, Arc<AtomicU8>, Sender<()>);

pub(crate) struct Notifier {
    subscribers: Mutex<Vec<Subscriber>>,
    next_id: AtomicU64,
    /// Bumped by every nudge and every heartbeat that saw a change.
    version: AtomicU64,
    poll: Mutex<Poller>,
    waits: WaitsHint,
    /// Whether the writer should look at the number as its transactions
    /// begin (SQLite: while the WAL watch is deaf, see
    /// `core::sqlite::watch`).
    writer_looks: AtomicBool,
}

/// What the heartbeat reads: a number that changes whenever another
/// process committed (SQLite's `data_version` on the writer's own
/// connection, which this process's commits leave as it is; the head seq
/// on PostgreSQL).
type Version = Box<dyn FnMut() -> Look + Send>;

/// What one look at that number found.
pub(crate) enum Look {
    /// The number.
    Version(i64),
    /// It could not be read without waiting (SQLite: the writer is in a
    /// transaction of its own).
    Busy,
    /// It could not be read.
    Failed,
}

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
            waits: WaitsHint::default(),
            writer_looks: AtomicBool::new(false),
        }
    }

    /// A new subscription to nudges that meet `wake`. Subscribe before
    /// reading what you will wait for, so a commit between the read and the
    /// wait is not missed.
    pub(crate) fn subscribe(self: &Arc<Self>, wake: Wake) -> Subscription {
        let (tx, rx) = bounded(1);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let wants = Arc::new(AtomicU8::new(wake.0));
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, Arc::clone(&wants), tx));
        Subscription {
            id,
            rx,
            wants,
            notifier: Arc::clone(self),
        }
    }

    /// Wakes every subscriber, whatever it waits for (a registration,
    /// shutdown).
    pub(crate) fn nudge(&self) {
        self.wake_where(|_| true);
    }

    /// Wakes the subscribers that wait for what `made` says (the executors
    /// for events too, while a workflow may wait for one).
    pub(crate) fn nudge_for(&self, made: Wake) {
        if made.is_none() {
            return;
        }
        let made = if made.meets(Wake::EVENTS) && self.waits.may_exist() {
            made.with(Wake::RUNS)
        } else {
            made
        };
        self.wake_where(|wants| made.meets(wants));
    }

    fn wake_where(&self, wakes: impl Fn(Wake) -> bool) {
        self.version.fetch_add(1, Ordering::SeqCst);
        let subs = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (_, wants, s) in subs.iter() {
            if wakes(Wake(wants.load(Ordering::Relaxed))) {
                // Full means a wake-up is already pending: one is enough.
                let _ = s.try_send(());
            }
        }
    }

    /// Whether workflows may wait for events (see [`WaitsHint`]).
    pub(crate) fn waits(&self) -> &WaitsHint {
        &self.waits
    }

    /// How many nudges and changed heartbeats there have been.
    #[allow(dead_code)]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// The heartbeat: true (and a nudge to every thread that waits for
    /// events or runs: what the commit made is not known) when another
    /// process committed since the last poll, or when it cannot tell (the
    /// first poll, a number it could not read). Cheap enough to call every
    /// few milliseconds.
    pub(crate) fn poll(&self) -> bool {
        self.poll_as(true)
    }

    /// The WAL watch's polls, dense after the file was written: as
    /// [`Notifier::poll`], but a number that could not be read at once is
    /// no news (the watch looks again within a millisecond or so, and the
    /// heartbeat after that).
    #[cfg_attr(not(feature = "watch"), allow(dead_code))]
    pub(crate) fn poll_soon(&self) -> bool {
        self.poll_as(false)
    }

    /// As [`Notifier::poll`], with the number read by the caller: the
    /// writer, at the start of a transaction, while
    /// [`Notifier::writer_looks`].
    pub(crate) fn observe(&self, version: i64) -> bool {
        let mut p = self.poll.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = p.last != Some(version);
        p.last = Some(version);
        drop(p);
        if changed {
            self.nudge_for(Wake::ALL);
        }
        changed
    }

    /// Whether the writer should read the number as its transactions begin
    /// (at most every 500 µs) and hand it to [`Notifier::observe`].
    pub(crate) fn writer_looks(&self) -> bool {
        self.writer_looks.load(Ordering::Relaxed)
    }

    /// Sets [`Notifier::writer_looks`].
    #[cfg_attr(not(feature = "watch"), allow(dead_code))]
    pub(crate) fn set_writer_looks(&self, on: bool) {
        self.writer_looks.store(on, Ordering::Relaxed);
    }

    fn poll_as(&self, busy_is_news: bool) -> bool {
        let mut p = self.poll.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = match (p.read)() {
            Look::Version(v) => {
                let changed = p.last != Some(v);
                p.last = Some(v);
                changed
            }
            Look::Busy => busy_is_news,
            // An unreadable number: look again to be safe.
            Look::Failed => {
                p.last = None;
                true
            }
        };
        drop(p);
        if changed {
            self.nudge_for(Wake::ALL);
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
    /// The kinds of nudge it waits for (a [`Wake`]'s bits).
    wants: Arc<AtomicU8>,
    notifier: Arc<Notifier>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.notifier
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(id, _, _)| *id != self.id);
    }
}

impl Subscription {
    /// From now on, waits for nudges that meet `wake` (and those that wake
    /// everyone). [`Wake::NONE`]: only those, and the heartbeat.
    pub(crate) fn listen(&self, wake: Wake) {
        self.wants.store(wake.0, Ordering::Relaxed);
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A notifier whose heartbeat reads `versions` in turn (Busy when
    /// they run out).
    fn notifier(versions: Vec<Look>) -> Arc<Notifier> {
        let mut versions = versions.into_iter();
        Arc::new(Notifier::polling(Box::new(move || {
            versions.next().unwrap_or(Look::Busy)
        })))
    }

    fn woken(sub: &Subscription) -> bool {
        sub.receiver().try_recv().is_ok()
    }

    #[test]
    fn a_nudge_wakes_the_subscribers_that_wait_for_what_the_commit_made() {
        // "Threads": a commit wakes this process's waiters at once — those
        // that wait for what it made (an append that made no run wakes no
        // executor) — and what cannot say what it made wakes them all.
        let n = notifier(Vec::new());
        let (events, runs, all) = (
            n.subscribe(Wake::EVENTS),
            n.subscribe(Wake::RUNS),
            n.subscribe(Wake::ALL),
        );
        let idle = n.subscribe(Wake::EVENTS);
        idle.listen(Wake::NONE);
        // No workflow waits (an executor looked and found none).
        n.waits().looked(n.waits().before_look(), false);
        n.nudge_for(Wake::EVENTS);
        assert_eq!(
            [woken(&events), woken(&runs), woken(&all), woken(&idle)],
            [true, false, true, false]
        );
        n.nudge_for(Wake::RUNS);
        assert_eq!(
            [woken(&events), woken(&runs), woken(&all), woken(&idle)],
            [false, true, true, false]
        );
        n.nudge_for(Wake::NONE);
        assert_eq!(
            [woken(&events), woken(&runs), woken(&all), woken(&idle)],
            [false, false, false, false]
        );
        // A registration or shutdown: everyone.
        n.nudge();
        assert_eq!(
            [woken(&events), woken(&runs), woken(&all), woken(&idle)],
            [true, true, true, true]
        );
        // While a workflow may wait for an event, an append wakes the
        // executors too (they match waits: invariant 12).
        n.waits().recorded();
        n.nudge_for(Wake::EVENTS);
        assert_eq!([woken(&events), woken(&runs)], [true, true]);
    }

    #[test]
    fn the_waits_hint_is_cleared_only_by_a_look_that_no_wait_was_recorded_during() {
        // Invariant 12's wake-up: a wait recorded while an executor looked
        // (and found none, having looked before its commit) keeps the hint.
        let hint = WaitsHint::default();
        assert!(hint.may_exist(), "unknown at first: it may");
        let before = hint.before_look();
        hint.looked(before, false);
        assert!(!hint.may_exist());
        // A look begins, a wait is recorded, the look (which did not see
        // it) ends: the hint stays.
        let before = hint.before_look();
        hint.recorded();
        hint.looked(before, false);
        assert!(hint.may_exist());
        // A look that found one says so, whenever it began.
        let before = hint.before_look();
        hint.looked(before, false);
        assert!(!hint.may_exist());
        hint.looked(before, true);
        assert!(hint.may_exist());
    }

    #[test]
    fn a_heartbeat_is_news_only_when_another_process_committed_or_it_cannot_tell() {
        // "Threads": the heartbeat notices other processes' commits; this
        // process's own (which leave the writer's number as it is) are no
        // news, and a look that would wait for the writer is news only to
        // the heartbeat, not to the watch's dense polls.
        let n = notifier(vec![
            Look::Version(1),
            Look::Version(1),
            Look::Version(2),
            Look::Busy,
            Look::Busy,
            Look::Failed,
            Look::Version(2),
        ]);
        assert!(n.poll(), "the first look: news");
        assert!(!n.poll(), "unchanged");
        assert!(n.poll(), "another process committed");
        assert!(!n.poll_soon(), "busy: the watch looks again soon");
        assert!(n.poll(), "busy at a heartbeat: look again to be safe");
        assert!(n.poll(), "unreadable: look again to be safe");
        assert!(n.poll(), "after an unreadable look, any number is news");
    }
}
