//! Handing a fresh run to an idle executor of this process, claimed in the
//! transaction that creates it: one durable commit between an append and
//! its handler instead of two (the firing's, then the claim's).
//!
//! An executor that finds no work *parks*: it counts itself idle here and
//! waits for a nudge, a heartbeat or a handed run. The evaluator, writing a
//! firing whose run would be ready at once, takes one idle executor's slot
//! ([`Handoff::take_slot`]) and claims the run in the same transaction,
//! under this process's holder and the run's first attempt, exactly as a
//! claim would (`Control::claim_ords`); after the commit it sends the
//! claimed row here, and a parked executor receives it and runs it as the
//! first batch of its turn. Nothing else changes:
//!
//! - A crash between the commit and the handler leaves a claimed run whose
//!   claim lapses and is claimed again, as after any claim (invariant 5).
//! - A commit that fails sends nothing: the claim was rolled back with the
//!   run. Slots taken for runs that were not handed go back.
//! - Only runs an executor of this process would claim at once are handed:
//!   the action is registered here, not paused, without concurrency, rate,
//!   fairness or partition limits (their claims count and order what they
//!   take), and the run is ready (the head of its lane, not dead). Every
//!   other run is claimed as before.
//! - The slots are a hint: an executor that wakes for something else first
//!   gives its slot back only if nobody took it. A run handed while no
//!   executor is parked waits in the channel for the next executor's turn
//!   (each turn starts by taking what was handed), at most a heartbeat;
//!   shutdown gives back, unstarted and without an attempt, what was
//!   handed and not taken.
//! - The pauses and cancels made in this process after the claim are seen
//!   before the run starts: each handed run carries the pause epoch
//!   ([`Claims::epoch`]) read before its transaction, and the executor
//!   looks at the file again when the epoch moved since.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::base::error::Result;
use crate::core::db::{Backend, Tx};
use crate::store::runs::RunRow;
use crate::store::{Control, Runs};
use crate::work::queue::claims::Claims;

/// A run claimed at its insert for an idle executor, with the pause epoch
/// of this process read before the claim's transaction began.
#[derive(Debug, Clone)]
pub(crate) struct Handed {
    pub row: RunRow,
    pub epoch: u64,
}

/// The idle executors of this process and the runs handed to them.
pub(crate) struct Handoff {
    /// Executors parked now, less the slots evaluators took since.
    idle: AtomicUsize,
    tx: Sender<Handed>,
    rx: Receiver<Handed>,
}

impl Default for Handoff {
    fn default() -> Self {
        let (tx, rx) = unbounded();
        Handoff {
            idle: AtomicUsize::new(0),
            tx,
            rx,
        }
    }
}

impl Handoff {
    /// An executor found no work and waits: one more idle slot.
    pub fn park(&self) {
        self.idle.fetch_add(1, Ordering::SeqCst);
    }

    /// An executor woke: its slot, unless an evaluator took it (a run is
    /// then on its way to whichever executor looks first).
    pub fn unpark(&self) {
        let _ = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Takes one idle executor's slot for a run about to be claimed at its
    /// insert; false when no executor is idle.
    pub fn take_slot(&self) -> bool {
        self.idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Gives back slots taken for runs that were not handed (not ready,
    /// or their transaction failed).
    pub fn return_slots(&self, n: usize) {
        if n > 0 {
            self.idle.fetch_add(n, Ordering::SeqCst);
        }
    }

    /// Idle slots now (for tests and the evaluator's cheap check).
    pub fn idle(&self) -> usize {
        self.idle.load(Ordering::SeqCst)
    }

    /// Sends runs claimed in a transaction that committed.
    pub fn hand(&self, rows: Vec<RunRow>, epoch: u64) {
        for row in rows {
            // The receiver lives as long as the sender (both are ours).
            let _ = self.tx.send(Handed { row, epoch });
        }
    }

    /// What parked executors wait on beside the nudges.
    pub fn receiver(&self) -> &Receiver<Handed> {
        &self.rx
    }

    /// Up to `most` runs handed and not taken yet.
    pub fn take(&self, most: usize) -> Vec<Handed> {
        self.rx.try_iter().take(most).collect()
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
/// runs may be handed (read once per action in the write), and how many
/// idle executors' slots it took.
pub(crate) struct Handing<'a> {
    hand: &'a Hand<'a>,
    epoch: u64,
    eligible: Mutex<HashMap<String, bool>>,
    taken: AtomicUsize,
}

impl<'a> Handing<'a> {
    pub fn new(hand: &'a Hand<'a>) -> Handing<'a> {
        Handing {
            hand,
            epoch: hand.claims.epoch(),
            eligible: Mutex::new(HashMap::new()),
            taken: AtomicUsize::new(0),
        }
    }

    /// Whether a ready run of `action` may be claimed at its insert: run
    /// here, not paused, and claimed without limits (theirs count and order
    /// what a claim takes). Read in the write, once per action.
    fn may_hand<B: Backend>(&self, tx: &Tx<'_, B>, action: &str) -> Result<bool> {
        if !self.hand.actions.iter().any(|a| a == action) {
            return Ok(false);
        }
        let mut eligible = self.eligible.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&ok) = eligible.get(action) {
            return Ok(ok);
        }
        let conn = tx.core();
        let ok = !Control::is_paused(conn, "action", action)?
            && Control::limited(conn, &[action.to_string()])?.is_empty();
        eligible.insert(action.to_string(), ok);
        Ok(ok)
    }

    /// Claims the run `id` of `action`, just inserted, for an idle executor
    /// of this process, if one is idle, the action may be handed and the
    /// run is ready (the head of its lane): as a claim would, by its
    /// position, under this process's holder.
    pub fn hand_over<B: Backend>(
        &self,
        tx: &mut Tx<'_, B>,
        action: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<RunRow>> {
        if !self.may_hand(tx, action)? || !self.hand.handoff.take_slot() {
            return Ok(None);
        }
        self.taken.fetch_add(1, Ordering::SeqCst);
        let conn = tx.core();
        let Some(row) = Runs::get(conn, id)?.filter(|r| r.state == "ready") else {
            return Ok(None);
        };
        let holder = &tx.settings().holder_id;
        let expires_at = now + tx.settings().lease_ttl_ms();
        Ok(
            Control::claim_ords(conn, holder, now, expires_at, &[row.ord])?
                .into_iter()
                .next(),
        )
    }

    /// After the write: sends the rows of the commits that held, and gives
    /// back the slots taken for any other.
    pub fn sent(&self, rows: Vec<RunRow>) {
        let handoff = self.hand.handoff;
        handoff.return_slots(self.taken.load(Ordering::SeqCst).saturating_sub(rows.len()));
        handoff.hand(rows, self.epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_only_from_parked_executors_and_never_go_below_zero() {
        // Invariant 5's fast path: a run is claimed at its insert only for
        // an executor that is waiting for work.
        let h = Handoff::default();
        assert!(!h.take_slot(), "nobody parked");
        h.park();
        h.park();
        assert!(h.take_slot());
        h.unpark(); // the other executor woke for something else
        assert_eq!(h.idle(), 0);
        assert!(!h.take_slot());
        h.unpark(); // the executor whose slot was taken: nothing to give back
        assert_eq!(h.idle(), 0);
        h.return_slots(1); // a transaction that failed
        assert!(h.take_slot());
    }
}
