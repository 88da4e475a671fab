//! How much an executor claims: what its handlers' recent durations say it
//! can start soon, so a claim never hoards runs it will not start.
//!
//! Each process keeps, per action, a moving average of its handlers'
//! durations. A claim takes, of each action, no more runs than fit in
//! [`BATCH_BUDGET`] at that pace (no cap for an action not timed yet), and of
//! an action with a concurrency limit no more than one plus what fits in
//! [`LIMITED_SLACK`], counting the runs of it carried from the last batch —
//! so a limit of N means N handlers running at once, not N claims held by
//! one executor that runs them one after another. After the
//! claim, the batch is cut where its expected duration — behind the runs
//! carried from the last batch — passes the budget (keeping at least one
//! run), and the cut runs are given back at once.
//! Handlers that take microseconds still claim in batches of hundreds.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How long one batch's handlers may start runs: what did not start goes
/// first in the next batch, so a run claimed but not started waits about
/// two of these, plus what the handlers before it overran their actions'
/// recent durations.
pub(crate) const BATCH_BUDGET: Duration = Duration::from_millis(50);

/// What an executor may hold, beyond the one it runs, of an action with a
/// concurrency limit: the runs that fit in this much of its pace. Slots of a
/// limit held by runs waiting behind another handler run nothing.
pub(crate) const LIMITED_SLACK: Duration = Duration::from_millis(1);

/// The weight of the newest duration in the moving average.
const WEIGHT: f64 = 0.25;

/// Each action's recent handler duration in this process.
#[derive(Default)]
pub(crate) struct Pace {
    /// Action → moving average of its handlers' durations, in nanoseconds.
    recent: Mutex<HashMap<String, f64>>,
}

impl Pace {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, f64>> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records one handler's duration.
    #[cfg(test)]
    pub fn record(&self, action: &str, took: Duration) {
        self.record_all([(action, took)]);
    }

    /// Records handlers' durations, in the order they ran (a batch's, under
    /// one lock).
    pub fn record_all<'a>(&self, took: impl IntoIterator<Item = (&'a str, Duration)>) {
        let mut recent = self.lock();
        for (action, took) in took {
            let ns = took.as_nanos() as f64;
            match recent.get_mut(action) {
                Some(avg) => *avg += WEIGHT * (ns - *avg),
                None => {
                    recent.insert(action.to_string(), ns);
                }
            }
        }
    }

    /// An action's recent handler duration; `None` before its first.
    #[cfg(test)]
    pub fn estimate(&self, action: &str) -> Option<Duration> {
        self.lock()
            .get(action)
            .map(|ns| Duration::from_nanos(*ns as u64))
    }

    /// The most runs of `action` one claim may take: what fits in the
    /// budget at its pace, and for a limited action at most one more than
    /// fits in [`LIMITED_SLACK`]. Before it is timed here, no cap: the
    /// first batch's handlers still stop at the budget, and the renewer
    /// gives back what a long first handler held (see `renew_claims`).
    #[cfg(test)]
    pub fn cap(&self, action: &str, limited: bool) -> usize {
        cap_at(self.estimate(action), limited)
    }

    /// The caps of `actions` (see [`Pace::cap`]), under one lock, for a
    /// claim made while the executor holds `ahead` (the runs carried from
    /// its last batch, which go first in the next): `limited` names the
    /// actions with a concurrency limit, and a limited action's cap counts
    /// the runs of it already held, so what an executor holds of it, the
    /// carried runs with the claimed, stays within [`LIMITED_SLACK`].
    pub fn caps(&self, actions: &[String], limited: &dyn Fn(&str) -> bool, ahead: &[&str]) -> Caps {
        let recent = self.lock();
        Caps(
            actions
                .iter()
                .map(|a| {
                    let pace = recent.get(a).map(|ns| Duration::from_nanos(*ns as u64));
                    let limited = limited(a);
                    let cap = cap_at(pace, limited);
                    if limited && cap != usize::MAX {
                        let held = ahead.iter().filter(|h| **h == a.as_str()).count();
                        (a.clone(), cap.saturating_sub(held))
                    } else {
                        (a.clone(), cap)
                    }
                })
                .collect(),
        )
    }

    /// How many of a batch, in order, start within the budget at their
    /// actions' pace: at least one; a run of an action not timed yet counts
    /// as nothing.
    #[cfg(test)]
    pub fn fitting<'a>(&self, actions: impl IntoIterator<Item = &'a str>) -> usize {
        self.fitting_after(&[], actions)
    }

    /// [`Pace::fitting`] for a batch that runs after `ahead` (the runs
    /// carried from the last one): how many of `actions` still start within
    /// the budget; at least one when nothing is ahead.
    pub fn fitting_after<'a>(
        &self,
        ahead: &[&str],
        actions: impl IntoIterator<Item = &'a str>,
    ) -> usize {
        let recent = self.lock();
        let pace = |a: &str| {
            recent
                .get(a)
                .map_or(Duration::ZERO, |ns| Duration::from_nanos(*ns as u64))
        };
        let mut total: Duration = ahead.iter().map(|a| pace(a)).sum();
        let mut n = 0;
        for action in actions {
            total += pace(action);
            if (n > 0 || !ahead.is_empty()) && total > BATCH_BUDGET {
                break;
            }
            n += 1;
        }
        n
    }
}

/// [`Pace::cap`] for an action whose recent duration is `pace`.
fn cap_at(pace: Option<Duration>, limited: bool) -> usize {
    let Some(d) = pace else {
        return usize::MAX;
    };
    let fits = |within: Duration| {
        let ns = d.as_nanos().max(1);
        usize::try_from(within.as_nanos() / ns).unwrap_or(usize::MAX)
    };
    let cap = fits(BATCH_BUDGET).max(1);
    if limited {
        cap.min(fits(LIMITED_SLACK).saturating_add(1))
    } else {
        cap
    }
}

/// The most runs of each action one claim takes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Caps(HashMap<String, usize>);

impl Caps {
    /// `action`'s cap; unbounded for an action it does not name.
    pub fn of(&self, action: &str) -> usize {
        self.0.get(action).copied().unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_slow_action_is_claimed_a_run_or_two_at_a_time_and_a_fast_one_by_the_thousand() {
        let pace = Pace::default();
        assert_eq!(pace.cap("new", false), usize::MAX, "not timed yet: no cap");
        for _ in 0..10 {
            pace.record("fast", Duration::from_micros(10));
        }
        assert_eq!(pace.cap("fast", false), 5_000);
        assert_eq!(pace.cap("fast", true), 101);
        for _ in 0..10 {
            pace.record("slow", 20 * MS);
        }
        assert_eq!(pace.cap("slow", false), 2);
        assert_eq!(pace.cap("slow", true), 1, "a limit's slots are not hoarded");
    }

    #[test]
    fn a_limited_action_is_not_claimed_beside_its_runs_carried_ahead() {
        // Control of the work: a limit of N is N handlers running, so an
        // executor holding a carried run of a limited action claims no
        // other run of it.
        let pace = Pace::default();
        let names = ["limited".to_string(), "open".to_string()];
        let limited = |a: &str| a == "limited";
        for _ in 0..5 {
            pace.record("limited", 20 * MS);
            pace.record("open", 20 * MS);
        }
        let caps = pace.caps(&names, &limited, &[]);
        assert_eq!((caps.of("limited"), caps.of("open")), (1, 2));
        // One of each carried: the limited action's slot is held already;
        // what else fits the budget is the batch's cut to make.
        let caps = pace.caps(&names, &limited, &["limited", "open"]);
        assert_eq!((caps.of("limited"), caps.of("open")), (0, 2));
        // Not timed yet: no cap, carried runs or not.
        let caps = Pace::default().caps(&names, &limited, &["limited"]);
        assert_eq!(caps.of("limited"), usize::MAX);
    }

    #[test]
    fn the_average_follows_recent_durations() {
        let pace = Pace::default();
        pace.record("a", 100 * MS);
        for _ in 0..40 {
            pace.record("a", MS);
        }
        let d = pace.estimate("a").unwrap();
        assert!(d < 2 * MS, "{d:?}");
    }

    #[test]
    fn a_batch_is_cut_where_it_passes_the_budget_but_keeps_its_first_run() {
        let pace = Pace::default();
        for _ in 0..5 {
            pace.record("slow", 30 * MS);
            pace.record("fast", MS);
        }
        assert_eq!(pace.fitting(["slow", "slow", "slow"]), 1);
        assert_eq!(pace.fitting(["fast", "slow", "fast", "slow"]), 3);
        assert_eq!(pace.fitting(["unknown", "fast", "slow", "slow"]), 3);
        assert_eq!(pace.fitting(["fast"; 80]), 50);
        assert_eq!(pace.fitting([]), 0);
    }
}
