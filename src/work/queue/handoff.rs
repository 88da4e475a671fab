//! Handing a fresh run to an idle executor of this process, claimed in the
//! transaction that creates it: one durable commit between an append and
//! its handler instead of two (the firing's, then the claim's).
//!
//! An executor that finds no work *parks* in its place here and waits for
//! a nudge that runs were made, a heartbeat, or a message in its place. The
//! evaluator, writing a firing whose run would be ready at once, reserves
//! one parked executor's place ([`Handoff::reserve`]) and claims the run in
//! the same transaction, under this process's holder and the run's first
//! attempt, exactly as a claim would (`Control::claim_fresh`) — on
//! PostgreSQL, for a firing alone in its rule's write, in the run's insert
//! itself, which makes the run claimed (`store::control::insert_handed`,
//! one round trip where two were); after the commit it sends that executor
//! the claimed row, and the executor runs it as the first batch of its
//! turn. A plain `Engine::enqueue`, due at once, hands its run over the
//! same way in its own write ([`insert_alone_handed`]). Nothing else
//! changes:
//!
//! - A crash between the commit and the handler leaves a claimed run whose
//!   claim lapses and is claimed again, as after any claim (invariant 5).
//! - A commit that fails sends nothing: the claim was rolled back with the
//!   run.
//! - Only runs an executor of this process would claim at once are handed:
//!   the action is registered here, not paused, without concurrency, rate,
//!   fairness or partition limits (their claims count and order what they
//!   take), and the run is ready (the head of its lane, not dead). Every
//!   other run is claimed as before.
//! - A reservation always ends with a message to its executor: the row, or
//!   word that none comes (the run was not handed, the write failed, or
//!   the evaluator unwound). An executor woken for something else while
//!   its place is reserved waits for that message first (the length of a
//!   commit), so a run handed to it is never left behind its other work,
//!   and an executor parked is never counted as busy: the places are exact.
//!   Shutdown gives back, unstarted and without an attempt, what was
//!   handed and not taken.
//! - A run that reaches its executor more than a third of a lease after
//!   its claim (a write held up past [`RESERVATION_WAIT`], whose executor went
//!   on meanwhile) is given back, not started: its claim may have lapsed
//!   and another executor may run it (`execute::give_back_stale`).
//! - The pauses and cancels made in this process after the claim are seen
//!   before the run starts: each handed run carries the pause epoch
//!   ([`Claims::epoch`]) read before its transaction, and the executor
//!   looks at the file again when the epoch moved since.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::base::error::Result;
use crate::core::db::{Backend, CoreDb, Tx};
use crate::store::control::insert_handed;
use crate::store::runs::{Inserted, NewRun, RunRow};
use crate::store::{Control, Runs};
use crate::work::queue::claims::Claims;

/// A run claimed at its insert for an idle executor, with the pause epoch
/// of this process read before the claim's transaction began.
#[derive(Debug, Clone)]
pub(crate) struct Handed {
    pub row: RunRow,
    pub epoch: u64,
}

/// An executor's place: what it is doing, and what is sent to it (a run,
/// or `None`: its reservation ended without one).
struct Place {
    state: AtomicU8,
    tx: Sender<Option<Handed>>,
    rx: Receiver<Option<Handed>>,
}

/// Running a turn (or not started).
const BUSY: u8 = 0;
/// Waiting for work, free to be reserved.
const PARKED: u8 = 1;
/// Reserved by an evaluator's write: a message is on its way.
const RESERVED: u8 = 2;

/// The longest an executor woken while its place is reserved waits for the
/// reservation's message (a write's commit normally; a write stuck longer
/// sends it to an executor that has gone on, which takes it at its next
/// turn, and gives it back unstarted if it came more than a third of a
/// lease after its claim).
const RESERVATION_WAIT: Duration = Duration::from_secs(5);

/// The places of this process's executors, and the runs handed to them.
pub(crate) struct Handoff {
    places: Vec<Place>,
}

impl Handoff {
    /// Places for `executors` executor threads.
    pub fn new(executors: usize) -> Handoff {
        Handoff {
            places: (0..executors)
                .map(|_| {
                    let (tx, rx) = unbounded();
                    Place {
                        state: AtomicU8::new(BUSY),
                        tx,
                        rx,
                    }
                })
                .collect(),
        }
    }

    /// Executor `i` found no work and waits: its place may be reserved.
    pub fn park(&self, i: usize) {
        self.places[i].state.store(PARKED, Ordering::SeqCst);
    }

    /// What executor `i` waits on besides the nudges.
    pub fn receiver(&self, i: usize) -> &Receiver<Option<Handed>> {
        &self.places[i].rx
    }

    /// Executor `i` woke, for `got` (a message in its place) or for
    /// something else (`None`): its place is busy from now on, and it
    /// returns the run it was handed, if any. Woken otherwise while its
    /// place is reserved, it waits for the reservation's message first.
    /// `Err(())` when the message said a reservation ended without a run
    /// and the executor woke for nothing else: it stays parked.
    pub fn wake(
        &self,
        i: usize,
        got: Option<Option<Handed>>,
    ) -> std::result::Result<Option<Handed>, ()> {
        let place = &self.places[i];
        match got {
            Some(Some(handed)) => {
                place.state.store(BUSY, Ordering::SeqCst);
                Ok(Some(handed))
            }
            // Parked again by `send` (or reserved anew since).
            Some(None) => Err(()),
            None => {
                let until = Instant::now() + RESERVATION_WAIT;
                loop {
                    if place
                        .state
                        .compare_exchange(PARKED, BUSY, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        return Ok(None);
                    }
                    if place.state.load(Ordering::SeqCst) == BUSY {
                        return Ok(None);
                    }
                    // Reserved: the message comes once the write ends (a
                    // word that none comes may be an earlier reservation's,
                    // so the state is read again).
                    match place
                        .rx
                        .recv_timeout(until.saturating_duration_since(Instant::now()))
                    {
                        Ok(Some(handed)) => {
                            place.state.store(BUSY, Ordering::SeqCst);
                            return Ok(Some(handed));
                        }
                        Ok(None) => {}
                        Err(_) => {
                            place.state.store(BUSY, Ordering::SeqCst);
                            return Ok(None);
                        }
                    }
                }
            }
        }
    }

    /// Reserves a parked executor's place for a run about to be claimed at
    /// its insert; None when no executor is parked. The reservation must
    /// end with [`Handoff::send`].
    pub fn reserve(&self) -> Option<usize> {
        self.places.iter().position(|p| {
            p.state
                .compare_exchange(PARKED, RESERVED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
    }

    /// Ends the reservation of place `i`: the run claimed for it in a write
    /// that committed, or `None` (the place is free again at once).
    pub fn send(&self, i: usize, handed: Option<Handed>) {
        let place = &self.places[i];
        if handed.is_none() {
            let _ =
                place
                    .state
                    .compare_exchange(RESERVED, PARKED, Ordering::SeqCst, Ordering::SeqCst);
        }
        // The receiver lives as long as the sender (both are ours).
        let _ = place.tx.send(handed);
    }

    /// Executors parked now, free to be reserved (the evaluator's cheap
    /// check, and tests).
    pub fn idle(&self) -> usize {
        self.places
            .iter()
            .filter(|p| p.state.load(Ordering::SeqCst) == PARKED)
            .count()
    }

    /// Up to `most` runs handed to executor `i` and not taken yet.
    pub fn take(&self, i: usize, most: usize) -> Vec<Handed> {
        self.places[i].rx.try_iter().flatten().take(most).collect()
    }

    /// Every run handed and not taken, whoever it was handed to (shutdown,
    /// after the executors stopped).
    pub fn take_all(&self) -> Vec<Handed> {
        self.places
            .iter()
            .flat_map(|p| p.rx.try_iter().flatten())
            .collect()
    }
}

/// Where an evaluator may hand fresh runs: this process's idle executors,
/// its claims (for the pause epoch) and the actions its executors run.
pub(crate) struct Hand<'a> {
    pub handoff: &'a Handoff,
    pub claims: &'a Claims,
    pub actions: &'a [String],
}

/// One write's handing: the pause epoch read before it, which actions'
/// runs may be handed (read once per action in the write), and the places
/// it reserved.
pub(crate) struct Handing<'a> {
    hand: &'a Hand<'a>,
    epoch: u64,
    eligible: Mutex<HashMap<String, bool>>,
    reserved: Mutex<Vec<usize>>,
}

/// A run claimed at its insert, and the place of the executor it goes to.
pub(crate) type HandedRow = (usize, RunRow);

impl<'a> Handing<'a> {
    pub fn new(hand: &'a Hand<'a>) -> Handing<'a> {
        Handing {
            hand,
            epoch: hand.claims.epoch(),
            eligible: Mutex::new(HashMap::new()),
            reserved: Mutex::new(Vec::new()),
        }
    }

    /// Whether a ready run of `action` may be claimed at its insert: run
    /// here (`None`: not known yet), not paused, and claimed without limits
    /// (theirs count and order what a claim takes). Read in the write, once
    /// per action: with the first hand-over's claim (see
    /// [`Handing::hand_over`], [`Handing::insert_handed`]).
    fn may_hand(&self, action: &str) -> Option<bool> {
        if !self.hand.actions.iter().any(|a| a == action) {
            return Some(false);
        }
        let eligible = self.eligible.lock().unwrap_or_else(PoisonError::into_inner);
        eligible.get(action).copied()
    }

    /// Reserves the place of a parked executor of this process for a run
    /// of `action`, if one is parked and the action is not known to be one
    /// that may not be handed. The place hears, after the write, of the
    /// run claimed for it, or that none comes ([`Handing::sent`]).
    fn reserve(&self, action: &str) -> Option<usize> {
        if self.may_hand(action) == Some(false) {
            return None;
        }
        let place = self.hand.handoff.reserve()?;
        self.reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(place);
        Some(place)
    }

    /// Keeps whether `action`'s runs may be handed, read in this write.
    fn learn(&self, action: &str, may: bool) {
        self.eligible
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(action.to_string(), may);
    }

    /// Claims the run `id` of `action`, just inserted, for a parked
    /// executor of this process, if one is parked, the action may be handed
    /// and the run is ready (the head of its lane): as a claim would, by
    /// its position, under this process's holder. The first hand-over of an
    /// action in a write asks whether the action may be handed in the
    /// claim's statement (one round trip on PostgreSQL, where they were
    /// two); a place reserved for a run the action may not hand hears that
    /// none comes, as for a run not ready.
    pub fn hand_over<B: Backend>(
        &self,
        tx: &mut Tx<'_, B>,
        action: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<HandedRow>> {
        let Some(place) = self.reserve(action) else {
            return Ok(None);
        };
        let holder = &tx.settings().holder_id;
        let expires_at = now + tx.settings().lease_ttl_ms();
        let claimed = if self.may_hand(action).is_some() {
            Control::claim_fresh(tx.core(), holder, now, expires_at, id)?
        } else {
            let (may, claimed) =
                Control::hand_over_fresh(tx.core(), action, holder, now, expires_at, id)?;
            self.learn(action, may);
            claimed
        };
        Ok(claimed.map(|row| (place, row)))
    }

    /// Inserts `run` (as [`Runs::insert`], due at once) and, if it
    /// inserted it, hands it over as [`Handing::hand_over`] would, when a
    /// parked executor's place is free: where each statement is a round
    /// trip (PostgreSQL), through [`insert_handed`] (one statement for a
    /// run that holds no key and is not dead, where the insert and the
    /// hand-over were two); elsewhere, the first of its action in the write
    /// that way, the others claimed after their insert.
    pub fn insert_handed<B: Backend>(
        &self,
        tx: &mut Tx<'_, B>,
        run: &NewRun<'_>,
    ) -> Result<Option<HandedRow>> {
        let Some(place) = self.reserve(run.action) else {
            Runs::insert(tx.core(), run)?;
            return Ok(None);
        };
        let holder = &tx.settings().holder_id;
        let expires_at = run.now + tx.settings().lease_ttl_ms();
        let claimed = if self.may_hand(run.action).is_some() && !B::STATEMENTS_ARE_ROUND_TRIPS {
            match Runs::insert(tx.core(), run)? {
                Inserted::New => {
                    Control::claim_fresh(tx.core(), holder, run.now, expires_at, run.id)?
                }
                _ => None,
            }
        } else {
            let (_, may, claimed) = insert_handed(tx.core(), run, holder, expires_at)?;
            self.learn(run.action, may);
            claimed
        };
        Ok(claimed.map(|row| (place, row)))
    }

    /// After the write: sends each reserved place its run, claimed in a
    /// commit that held, or word that none comes.
    pub fn sent(&self, rows: Vec<HandedRow>) {
        let reserved =
            std::mem::take(&mut *self.reserved.lock().unwrap_or_else(PoisonError::into_inner));
        let mut rows = rows;
        for place in reserved {
            let handed = rows.iter().position(|(p, _)| *p == place).map(|i| Handed {
                row: rows.swap_remove(i).1,
                epoch: self.epoch,
            });
            self.hand.handoff.send(place, handed);
        }
    }
}

/// Makes `run`, due at once, in a write of its own
/// ([`CoreDb::insert_run_alone`]: a plain `Engine::enqueue`), handed over
/// at its insert to a parked executor of this process if one is parked and
/// its action may be handed ([`CoreDb::insert_run_alone_handed`]): one
/// durable commit from the call to the run's start, where the insert's
/// and then a claim's were two. The executor gets the run once the write
/// committed; an error, or a run not claimed, tells it none comes.
pub(crate) fn insert_alone_handed<B: Backend>(
    db: &B::Db,
    hand: &Hand<'_>,
    run: &NewRun<'_>,
) -> Result<Inserted> {
    let handing = Handing::new(hand);
    // Reserved once the write holds its connection and its lock (a write
    // tried again may reserve again: every place reserved hears, and the
    // run goes to the first).
    let place = std::sync::OnceLock::new();
    let reserve = || match handing.reserve(run.action) {
        Some(p) => {
            let _ = place.set(p);
            true
        }
        None => false,
    };
    let (inserted, claimed) = db.insert_run_alone_handed(run, &reserve)?;
    let handed = claimed.zip(place.get().copied()).map(|(row, p)| (p, row));
    handing.sent(handed.into_iter().collect());
    Ok(inserted)
}

impl Drop for Handing<'_> {
    /// A write that unwound before [`Handing::sent`]: its reservations end
    /// without a run (the claims rolled back with the write).
    fn drop(&mut self) {
        self.sent(Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_reserved_only_when_parked_and_each_reservation_ends_with_a_message() {
        // Invariant 5's fast path: a run is claimed at its insert only for
        // an executor that is waiting for work, and that executor — no
        // other — gets it, or word that it does not come.
        let h = Handoff::new(2);
        assert_eq!(h.reserve(), None, "nobody parked");
        h.park(0);
        h.park(1);
        assert_eq!(h.idle(), 2);
        let a = h.reserve().unwrap();
        assert_eq!(h.idle(), 1);
        let b = h.reserve().unwrap();
        assert_ne!(a, b);
        assert_eq!(h.reserve(), None, "both reserved");
        // `a`'s reservation ends without a run: it is parked again, and the
        // word of it does not wake it.
        h.send(a, None);
        assert_eq!(h.idle(), 1);
        let got = h.receiver(a).try_recv().unwrap();
        assert!(h.wake(a, Some(got)).is_err());
        // `b` woke for something else while reserved: it waits for the
        // message, and takes its run with it.
        let row = RunRow::default();
        h.send(b, Some(Handed { row, epoch: 7 }));
        assert!(matches!(h.wake(b, None), Ok(Some(Handed { epoch: 7, .. }))));
        assert_eq!(h.idle(), 1, "b is busy, a parked");
        // A parked executor woken by a nudge is busy, and not reserved.
        assert!(matches!(h.wake(a, None), Ok(None)));
        assert_eq!(h.idle(), 0);
        assert_eq!(h.reserve(), None);
    }
}
