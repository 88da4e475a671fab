//! Counters of what this engine did since it opened.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub(crate) struct Counters {
    pub decisions: AtomicU64,
    pub fired: AtomicU64,
    pub errored: AtomicU64,
    pub runs_claimed: AtomicU64,
    pub runs_succeeded: AtomicU64,
    pub runs_retried: AtomicU64,
    pub runs_dead: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}
