//! Leases: holder, generation (the fencing token), expiry by the engine's
//! clock, and fenced writes (DESIGN.md, invariant 7).

mod common;

use std::time::Duration;

use common::{Arrange, Scene, count};
use reflexr::{Clock, Error};

const TTL: Duration = Duration::from_secs(30);

/// The application's table of work done under a lease.
const WORK_SQL: &str = "CREATE TABLE work (by TEXT, generation INTEGER)";

#[test]
fn one_holder_at_a_time_until_the_lease_lapses_then_the_generation_goes_up() {
    let s = Scene::new();
    let (a, b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    let la = a.acquire_lease("evaluator/app", Some(TTL)).unwrap();
    assert_eq!((la.holder.as_str(), la.generation), ("proc-a", 1));
    assert_eq!(la.expires_at, s.clock.now_ms() + 30_000);
    assert_eq!(
        la.renew_due_at(),
        s.clock.now_ms() + 10_000,
        "renewed every third"
    );

    match b.acquire_lease("evaluator/app", Some(TTL)) {
        Err(Error::LeaseHeld { holder, .. }) => assert_eq!(holder, "proc-a"),
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    s.clock.advance(Duration::from_secs(29));
    assert!(
        b.acquire_lease("evaluator/app", Some(TTL)).is_err(),
        "not yet lapsed"
    );
    s.clock.advance(Duration::from_secs(1));
    let lb = b.acquire_lease("evaluator/app", Some(TTL)).unwrap();
    assert_eq!((lb.holder.as_str(), lb.generation), ("proc-b", 2));
}

#[test]
fn renewal_extends_a_held_lease_and_fails_once_it_was_taken_over() {
    let s = Scene::new();
    let (a, b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    let mut la = a.acquire_lease("follower/edge", Some(TTL)).unwrap();
    for _ in 0..5 {
        s.clock.advance(Duration::from_secs(10));
        la = a.renew_lease(&la).unwrap();
        assert_eq!(la.generation, 1, "renewal keeps the generation");
        assert_eq!(la.expires_at, s.clock.now_ms() + 30_000);
    }
    // Renewals stop (a paused process); the lease lapses; b takes over.
    s.clock.advance(Duration::from_secs(31));
    let lb = b.acquire_lease("follower/edge", Some(TTL)).unwrap();
    let e = a.renew_lease(&la).unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    // Re-acquiring by the same holder after a lapse is a takeover too.
    b.release_lease(&lb).unwrap();
    let la2 = a.acquire_lease("follower/edge", Some(TTL)).unwrap();
    assert_eq!(la2.generation, lb.generation + 1);
}

#[test]
fn a_stale_holders_fenced_write_is_refused_after_another_took_over() {
    // Invariant 7: a write made under a lease commits only while the lease is
    // held, and the check is in the write's own transaction.
    let s = Scene::new();
    let (a, b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    let la = a.acquire_lease("scheduler", Some(TTL)).unwrap();
    a.write(|tx| {
        tx.fence(&la)?;
        tx.execute("INSERT INTO work VALUES ('a', ?1)", [la.generation])
    })
    .unwrap();

    s.clock.advance(TTL);
    let lb = b.acquire_lease("scheduler", Some(TTL)).unwrap();
    assert_eq!(lb.generation, la.generation + 1);

    // a wakes from its pause and writes as if it still held the lease.
    let e = a
        .write(|tx| {
            tx.fence(&la)?;
            tx.execute("INSERT INTO work VALUES ('a', ?1)", [la.generation])
        })
        .unwrap_err();
    match e {
        Error::LeaseLost {
            holder, generation, ..
        } => assert_eq!((holder.as_str(), generation), ("proc-a", 1)),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // Fencing after the write in the same transaction refuses it just the same.
    let e = a
        .write(|tx| {
            tx.execute("INSERT INTO work VALUES ('a-late', ?1)", [la.generation])?;
            tx.fence(&la)
        })
        .unwrap_err();
    assert!(e.is_lease_lost());

    b.write(|tx| {
        tx.fence(&lb)?;
        tx.execute("INSERT INTO work VALUES ('b', ?1)", [lb.generation])
    })
    .unwrap();
    assert_eq!(count(&a, "SELECT count(*) FROM work WHERE by LIKE 'a%'"), 1);
    assert_eq!(count(&a, "SELECT count(*) FROM work WHERE by = 'b'"), 1);
}

#[test]
fn an_expired_lease_fences_even_before_anyone_takes_it() {
    // Invariant 7: held means "not expired" too, by the engine's clock.
    let s = Scene::new();
    let (a, _b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    let la = a.acquire_lease("scheduler", Some(TTL)).unwrap();
    s.clock.advance(TTL);
    let e = a.write(|tx| tx.fence(&la)).unwrap_err();
    assert!(e.is_lease_lost());
    assert!(a.renew_lease(&la).unwrap_err().is_lease_lost());
}

#[test]
fn release_frees_the_lease_at_once_and_never_reuses_a_generation() {
    let s = Scene::new();
    let (a, b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    let la = a.acquire_lease("loop", None).unwrap();
    assert_eq!(la.ttl_ms, 30_000, "the engine's default ttl");
    assert!(a.release_lease(&la).unwrap());
    assert!(!a.release_lease(&la).unwrap(), "released already");
    let lb = b.acquire_lease("loop", None).unwrap();
    assert_eq!(lb.generation, 2);
    assert!(a.write(|tx| tx.fence(&la)).unwrap_err().is_lease_lost());
    let listed = a.leases().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].holder.as_str(), listed[0].generation),
        ("proc-b", 2)
    );
}

#[test]
fn acquiring_a_lease_one_holds_extends_it_without_a_new_generation() {
    let s = Scene::new();
    let (a, _b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    let first = a.acquire_lease("loop", Some(TTL)).unwrap();
    s.clock.advance(Duration::from_secs(5));
    let again = a.acquire_lease("loop", Some(TTL)).unwrap();
    assert_eq!(again.generation, first.generation);
    assert_eq!(again.acquired_at, first.acquired_at);
    assert_eq!(again.expires_at, s.clock.now_ms() + 30_000);
}

#[test]
fn a_clock_that_jumps_back_never_shortens_a_lease() {
    let s = Scene::new();
    let (a, b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    let la = a.acquire_lease("loop", Some(TTL)).unwrap();
    let t0 = s.clock.now_ms();
    s.clock.set(t0 - 60_000);
    let renewed = a.renew_lease(&la).unwrap();
    assert_eq!(
        renewed.expires_at, la.expires_at,
        "expiry only moves forward"
    );
    s.clock.set(t0 + 29_000);
    assert!(b.acquire_lease("loop", Some(TTL)).is_err());
}

#[test]
fn bad_lease_arguments_are_typed_errors() {
    // Invariant 10.
    let s = Scene::new();
    let (a, _b) = (s.open("proc-a").sql(WORK_SQL), s.open("proc-b"));
    for (name, ttl) in [
        ("", TTL),
        ("has space", TTL),
        ("ok", Duration::from_millis(1)),
        ("ok", Duration::from_secs(400 * 24 * 3600)),
    ] {
        let e = a.acquire_lease(name, Some(ttl)).unwrap_err();
        assert!(e.is_bad_input(), "{name:?} {ttl:?}: {e}");
    }
    assert!(a.leases().unwrap().is_empty());
}
