//! The feed of run changes on PostgreSQL (feature `postgres`), where
//! transactions commit in another order than they stamp their changes: a
//! change a transaction held open commits after a later one still comes
//! (invariant 1's promise for the log, kept for the admin stream's `runs`
//! topic: a follower of the feed never passes over a committed change).
#![cfg(feature = "postgres")]

use reflexr_testkit as common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::backend::{PgSchema, TestBackend};
use reflexr::inspect::RunsFeed;
use reflexr::postgres::{Client, NoTls};
use reflexr::{Clock, Enqueue, ManualClock, Postgres};

#[test]
fn a_run_change_committed_late_still_comes_in_the_feed() {
    let place = PgSchema::new();
    let clock = ManualClock::new(1_800_000_000_000);
    let e = Postgres::open(&place, &clock, "test");
    let work = |name: &str| Enqueue::new("work", &serde_json::json!({ "name": name }));
    let late = e.enqueue(&work("late")).unwrap().id;
    let mut feed = RunsFeed::<Postgres>::since(clock.now_ms());
    let mut seen: HashMap<String, usize> = HashMap::new();
    let read = |feed: &mut RunsFeed<Postgres>, seen: &mut HashMap<String, usize>| {
        for r in e.runs_feed(feed, 100).unwrap() {
            *seen.entry(r.id).or_default() += 1;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.contains_key(&late) {
        assert!(Instant::now() < deadline, "the new run never came");
        read(&mut feed, &mut seen);
    }

    // A transaction of its own (as an executor's round of another process
    // is) changes "late" at t + 1 s — stamping its transaction, as each
    // statement of the engine's that changes a run does — and stays open,
    // holding no lock of the log's: the engine's writes go on meanwhile.
    let mut other = Client::connect(&place.config(), NoTls).unwrap();
    let mut held = other.transaction().unwrap();
    held.execute(
        "UPDATE reflexr_runs SET priority = 5, updated_at = $2, \
           changed_tx = pg_current_xact_id()::text::bigint WHERE id = $1",
        &[&late, &(clock.now_ms() + 1_000)],
    )
    .unwrap();
    // "early" is enqueued at t + 2 s and commits first.
    clock.advance(Duration::from_secs(2));
    let early = e.enqueue(&work("early")).unwrap().id;
    read(&mut feed, &mut seen);
    // By change time the feed would now stand at t + 2 s, past "late"'s
    // change at t + 1 s, which commits now.
    held.commit().unwrap();

    while seen.get(&late) != Some(&2) || !seen.contains_key(&early) {
        assert!(Instant::now() < deadline, "only {seen:?}");
        read(&mut feed, &mut seen);
    }
    assert_eq!(
        seen.get(&late),
        Some(&2),
        "once new, once changed: {seen:?}"
    );
    assert_eq!(seen.get(&early), Some(&1), "{seen:?}");
    assert_eq!(seen.len(), 2, "{seen:?}");

    // Following the change time instead, from where "early" stands,
    // passes over it: what the feed by transaction is for.
    let by_time: Vec<String> = other
        .query(
            "SELECT id FROM reflexr_runs WHERE updated_at >= $1 ORDER BY updated_at, ord",
            &[&clock.now_ms()],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(by_time.iter().all(|id| *id != late), "{by_time:?}");
}
