//! The conformance suite for the counters: totals every process reads the same.

use super::*;
use crate::base::counter::Counter;

/// The totals beside invariant 4 (the decisions, firings and errors a rule
/// batch counts in its commit) add up, bumped one at a time or several in
/// one call (one statement on PostgreSQL): `Engine::stats` reads the same
/// totals either way, and a bump of 0 counts nothing.
#[test]
fn bumps_one_at_a_time_or_together_add_up() {
    on_every_backend(|db| {
        db.tx(|c| {
            Counters::bump(c, Counter::Decisions, 3)?;
            Counters::bump_all(
                c,
                &[
                    (Counter::Decisions, 2),
                    (Counter::Fired, 1),
                    (Counter::Errored, 0),
                ],
            )?;
            Counters::bump_all(c, &[(Counter::Fired, 4)])?;
            Counters::bump_all(c, &[(Counter::Errored, 0), (Counter::ReplayKept, 0)])?;
            Ok(())
        })
        .unwrap();
        let all = db.tx(|c| Counters::all(c)).unwrap();
        let total = |k: Counter| all.iter().find(|(c, _)| *c == k).map_or(0, |(_, v)| *v);
        assert_eq!(total(Counter::Decisions), 5, "{}", db.name());
        assert_eq!(total(Counter::Fired), 5);
        assert_eq!(total(Counter::Errored), 0);
        assert_eq!(total(Counter::ReplayKept), 0);
    });
}
