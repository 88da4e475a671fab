//! The claims this engine holds on runs, so the renewer can extend them
//! every third of their TTL while their handlers work — and give back, at
//! that point, a run claimed but still not started.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::work::queue::run::Run;

/// One claim held: its holder, attempt and expiry, whether an operator
/// asked the run to stop, and whether its handler started (or the renewer
/// gave it back unstarted).
struct Held {
    /// Which claim of the run this is: a workflow's run that suspended can
    /// be claimed again by another executor of this process before the
    /// batch that ran it settles, and that batch must not untrack it.
    token: u64,
    holder: String,
    attempt: i64,
    expires_at: i64,
    cancelled: Arc<AtomicBool>,
    ord: i64,
    lane: Option<String>,
    parent: Option<String>,
    started: bool,
    given_back: bool,
}

/// A claimed run the renewer gives back unstarted: its id, position,
/// holder, attempt and lane.
pub(crate) type Overdue = (String, i64, String, i64, Option<String>, Option<String>);

/// Run ids hashed by foldhash (seeded at random, as the evaluator's scopes
/// are): several look-ups a run on the executors' path, each a few times
/// cheaper than SipHash's.
type ById<V> = HashMap<String, V, foldhash::fast::RandomState>;

#[derive(Default)]
pub(crate) struct Claims {
    /// run id → its claim.
    held: Mutex<ById<Held>>,
    /// Bumped by every pause or cancel made in this process once it has
    /// committed: an executor that sees it move looks at the file before it
    /// starts another run.
    epoch: AtomicU64,
    /// The last claim token handed out.
    tokens: AtomicU64,
}

impl Claims {
    fn lock(&self) -> std::sync::MutexGuard<'_, ById<Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tracks these claims, each with a token of its own (set on the run,
    /// for [`Claims::untrack`]).
    pub fn track<'a>(&self, runs: impl IntoIterator<Item = &'a mut Run>) {
        let mut held = self.lock();
        for r in runs {
            r.token = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
            held.insert(
                r.id.clone(),
                Held {
                    token: r.token,
                    holder: r.holder.clone(),
                    attempt: i64::from(r.attempt),
                    expires_at: r.claim_expires_at,
                    cancelled: Arc::new(AtomicBool::new(false)),
                    ord: r.ord,
                    lane: r.lane.clone(),
                    parent: r.parent.clone(),
                    started: false,
                    given_back: false,
                },
            );
        }
    }

    /// The flag a run's handler reads for "asked to stop" (a fresh one if
    /// the run is not tracked).
    pub fn cancel_flag(&self, id: &str) -> Arc<AtomicBool> {
        self.lock().get(id).map_or_else(
            || Arc::new(AtomicBool::new(false)),
            |h| Arc::clone(&h.cancelled),
        )
    }

    /// Tells these runs' handlers, if they work here, that they are asked
    /// to stop, and the executors holding them unstarted not to start them.
    pub fn cancel(&self, ids: &[String]) {
        {
            let held = self.lock();
            for id in ids {
                if let Some(h) = held.get(id) {
                    h.cancelled.store(true, Ordering::SeqCst);
                }
            }
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether a run held here must not start: given back by the renewer,
    /// or its cancellation asked for here.
    pub fn is_stopped(&self, id: &str) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|h| h.given_back || h.cancelled.load(Ordering::SeqCst))
    }

    /// Tells the executors that something was paused: they look at the file
    /// before they start another run.
    pub fn paused(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Moves with every pause and cancel made here (see [`Claims::paused`]).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Stops tracking these claims (`(run id, token)`); a run claimed again
    /// since (another token) stays tracked.
    pub fn untrack<'a>(&self, claims: impl IntoIterator<Item = (&'a str, u64)>) {
        let mut held = self.lock();
        for (id, token) in claims {
            if held.get(id).is_some_and(|h| h.token == token) {
                held.remove(id);
            }
        }
    }

    /// Marks a run's handler started; false when the renewer gave the run
    /// back first, or its cancellation was asked for here (it must not
    /// start).
    pub fn start(&self, id: &str) -> bool {
        match self.lock().get_mut(id) {
            Some(h) if h.given_back || h.cancelled.load(Ordering::SeqCst) => false,
            Some(h) => {
                h.started = true;
                true
            }
            None => true,
        }
    }

    /// Marks runs of a batch that did not start as given back by their
    /// executor, and returns those it is to release: the ones the renewer
    /// had not given back already (each is released once, by one of them,
    /// while it is still this engine's).
    pub fn take_back(&self, ids: &[&str]) -> HashSet<String> {
        let mut held = self.lock();
        let mut mine = HashSet::new();
        for id in ids {
            match held.get_mut(*id) {
                Some(h) if h.given_back => {}
                Some(h) => {
                    h.given_back = true;
                    mine.insert((*id).to_string());
                }
                None => {
                    mine.insert((*id).to_string());
                }
            }
        }
        mine
    }

    /// The claims due for renewal at `now` ([`due_for_renewal`]) whose
    /// handlers work: the ones to renew, as `(id, holder, attempt, ord)`.
    pub fn due(&self, now: i64, ttl: i64) -> Vec<(String, String, i64, i64)> {
        self.lock()
            .iter()
            .filter(|(_, h)| h.started && !h.given_back && due_for_renewal(h.expires_at, now, ttl))
            .map(|(id, h)| (id.clone(), h.holder.clone(), h.attempt, h.ord))
            .collect()
    }

    /// The claims due for renewal whose handlers have not started — held a
    /// third of the TTL behind other handlers — marked given back: their
    /// executor will not start them.
    pub fn overdue(&self, now: i64, ttl: i64) -> Vec<Overdue> {
        let mut held = self.lock();
        held.iter_mut()
            .filter(|(_, h)| !h.started && !h.given_back && due_for_renewal(h.expires_at, now, ttl))
            .map(|(id, h)| {
                h.given_back = true;
                (
                    id.clone(),
                    h.ord,
                    h.holder.clone(),
                    h.attempt,
                    h.lane.clone(),
                    h.parent.clone(),
                )
            })
            .collect()
    }

    pub fn renewed(&self, ids: &[String], expires_at: i64) {
        let mut held = self.lock();
        for id in ids {
            if let Some(c) = held.get_mut(id) {
                c.expires_at = expires_at;
            }
        }
    }
}

/// Whether a claim that expires at `expires_at` is due for renewal at
/// `now`: less than two thirds of its lease (`ttl`) left. A run claimed and
/// not started by then is given back, not started (`Claims::overdue`, and a
/// run handed over that late, `execute::give_back_stale`).
pub(crate) fn due_for_renewal(expires_at: i64, now: i64, ttl: i64) -> bool {
    expires_at.saturating_sub(now) <= ttl * 2 / 3
}
