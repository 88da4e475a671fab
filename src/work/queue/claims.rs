//! The claims this engine holds on runs whose handlers are working, so the
//! renewer can extend them every third of their TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::work::queue::run::Run;

/// One claim held: its holder, attempt and expiry, and whether an operator
/// asked the run to stop.
struct Held {
    holder: String,
    attempt: i64,
    expires_at: i64,
    cancelled: Arc<AtomicBool>,
}

#[derive(Default)]
pub(crate) struct Claims {
    /// run id → its claim.
    held: Mutex<HashMap<String, Held>>,
}

impl Claims {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn track(&self, runs: &[Run]) {
        let mut held = self.lock();
        for r in runs {
            held.insert(
                r.id.clone(),
                Held {
                    holder: r.holder.clone(),
                    attempt: i64::from(r.attempt),
                    expires_at: r.claim_expires_at,
                    cancelled: Arc::new(AtomicBool::new(false)),
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
    /// to stop.
    pub fn cancel(&self, ids: &[String]) {
        let held = self.lock();
        for id in ids {
            if let Some(h) = held.get(id) {
                h.cancelled.store(true, Ordering::SeqCst);
            }
        }
    }

    pub fn untrack(&self, runs: &[Run]) {
        let mut held = self.lock();
        for r in runs {
            held.remove(&r.id);
        }
    }

    /// The claims with less than two thirds of `ttl` left at `now`.
    pub fn due(&self, now: i64, ttl: i64) -> Vec<(String, String, i64)> {
        self.lock()
            .iter()
            .filter(|(_, h)| h.expires_at - now <= ttl * 2 / 3)
            .map(|(id, h)| (id.clone(), h.holder.clone(), h.attempt))
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
