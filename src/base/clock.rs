//! Where the engine's time comes from.
//!
//! Every time the engine writes — `recorded_at`, lease expiries, due times,
//! backoff — comes from the [`Clock`] it was opened with. Tests open their
//! engines with a [`ManualClock`] and move it by hand, so nothing waits on the
//! wall clock to see a lease lapse or a retry come due.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The operating system's wall clock. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        system_now_ms()
    }
}

pub(crate) fn system_now_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        // A clock set before 1970 is a broken clock; 0 keeps time monotone
        // with respect to everything the engine wrote since.
        Err(_) => 0,
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// ```
/// use reflexr::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000);
/// let seen_by_engine = clock.clone();
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(seen_by_engine.now_ms(), 31_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at `start_ms` (milliseconds since the epoch).
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock {
            now: Arc::new(AtomicI64::new(start_ms)),
        }
    }

    /// A clock standing at the current wall-clock time.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(system_now_ms())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `ms`, forwards or backwards (to test a clock jump).
    pub fn set(&self, ms: i64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}
