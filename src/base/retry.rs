//! How a failed attempt is retried: [`RetryPolicy`].

use std::time::Duration;

use crate::base::error::{Error, Result};

/// How a run is retried after a failed attempt.
///
/// The delay after attempt *n* is `initial × factor^(n−1)`, capped at
/// `max_delay`, then moved up or down by up to `jitter` of itself at random
/// (so runs that failed together do not retry together).
///
/// # Defaults
///
/// 25 attempts, 1 s doubling, capped at 5 minutes, ±20 % jitter: about an
/// hour and a half of retries before a run is dead-lettered. For comparison,
/// River retries 25 times over about three weeks (attempt⁴ seconds);
/// Temporal starts at 1 s, doubles, caps at 100× the initial delay and
/// retries without limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1: never retried).
    pub max_attempts: u32,
    /// The delay after the first failure.
    pub initial: Duration,
    /// What each further delay is multiplied by (≥ 1).
    pub factor: f64,
    /// The longest delay.
    pub max_delay: Duration,
    /// How far a delay may be moved at random, as a fraction of it (0 to 1).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 25,
            initial: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(300),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// One attempt, never retried.
    pub fn never() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// `attempts` in all, with the default delays.
    pub fn attempts(attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: attempts,
            ..RetryPolicy::default()
        }
    }

    /// The same policy with these delays and no jitter (handy in tests).
    pub fn fixed(self, delay: Duration) -> RetryPolicy {
        RetryPolicy {
            initial: delay,
            factor: 1.0,
            max_delay: delay,
            jitter: 0.0,
            ..self
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::invalid(
                "retry policy",
                "max_attempts must be at least 1",
            ));
        }
        if !(self.factor >= 1.0 && self.factor.is_finite()) {
            return Err(Error::invalid("retry policy", "factor must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::invalid("retry policy", "jitter must be 0 to 1"));
        }
        if self.initial > self.max_delay {
            return Err(Error::invalid(
                "retry policy",
                "the initial delay is longer than the longest",
            ));
        }
        Ok(())
    }
}
