//! The claims this engine holds on runs whose handlers are working, so the
//! renewer can extend them every third of their TTL.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::run::Run;

#[derive(Default)]
pub(crate) struct Claims {
    /// run id → (holder, attempt, expires_at).
    held: Mutex<HashMap<String, (String, i64, i64)>>,
}

impl Claims {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, i64, i64)>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn track(&self, runs: &[Run]) {
        let mut held = self.lock();
        for r in runs {
            held.insert(
                r.id.clone(),
                (r.holder.clone(), i64::from(r.attempt), r.claim_expires_at),
            );
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
            .filter(|(_, (_, _, expires))| expires - now <= ttl * 2 / 3)
            .map(|(id, (holder, attempt, _))| (id.clone(), holder.clone(), *attempt))
            .collect()
    }

    pub fn renewed(&self, ids: &[String], expires_at: i64) {
        let mut held = self.lock();
        for id in ids {
            if let Some(c) = held.get_mut(id) {
                c.2 = expires_at;
            }
        }
    }
}
