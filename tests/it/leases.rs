//! Leases, on every backend: holder, generation (the fencing token), expiry
//! by the engine's clock, and fenced writes (DESIGN.md, invariant 7). Each
//! test is written once, generic over the backend, and `on_backends!` runs
//! it on an SQLite temp file and — with the feature `postgres` — on a
//! PostgreSQL schema of its own, with two engines on it as two processes.

use reflexr_testkit as common;

use std::time::Duration;

use common::backend::TestBackend;
use common::on_backends;
use reflexr::{Clock, Engine, Error, ManualClock};

on_backends!(
    one_holder_at_a_time_until_the_lease_lapses_then_the_generation_goes_up,
    renewal_extends_a_held_lease_and_fails_once_it_was_taken_over,
    a_stale_holders_fenced_write_is_refused_after_another_took_over,
    an_expired_lease_fences_even_before_anyone_takes_it,
    release_frees_the_lease_at_once_and_never_reuses_a_generation,
    acquiring_a_lease_one_holds_extends_it_without_a_new_generation,
    a_clock_that_jumps_back_never_shortens_a_lease,
    bad_lease_arguments_are_typed_errors,
);

const TTL: Duration = Duration::from_secs(30);

const START_MS: i64 = 1_800_000_000_000;

/// The application's table of work done under a lease.
const WORK_SQL: &str = "CREATE TABLE work (by TEXT, generation INTEGER)";

/// A place, its clock, and two engines on it, as two processes: `proc-a`
/// (which made the table `work`) and `proc-b`.
fn two<B: TestBackend>() -> (B::Place, ManualClock, Engine<B>, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let a = B::open(&place, &clock, "proc-a");
    B::sql(&a, WORK_SQL);
    let b = B::open(&place, &clock, "proc-b");
    (place, clock, a, b)
}

/// Records work done by `by` under `generation`, in the transaction.
fn work<B: TestBackend>(
    tx: &mut reflexr::Tx<'_, B>,
    by: &str,
    generation: i64,
) -> reflexr::Result<()> {
    B::run_sql(
        tx,
        &format!("INSERT INTO work VALUES ('{by}', {generation})"),
    )
}

/// Invariant 7: one holder at a time; the lease lapses exactly at its
/// expiry by the engine's clock, and the next holder's generation is one
/// more.
fn one_holder_at_a_time_until_the_lease_lapses_then_the_generation_goes_up<B: TestBackend>() {
    let (_place, clock, a, b) = two::<B>();
    let la = a.acquire_lease("evaluator/app", Some(TTL)).unwrap();
    assert_eq!((la.holder.as_str(), la.generation), ("proc-a", 1));
    assert_eq!(la.expires_at, clock.now_ms() + 30_000);
    assert_eq!(
        la.renew_due_at(),
        clock.now_ms() + 10_000,
        "renewed every third"
    );

    match b.acquire_lease("evaluator/app", Some(TTL)) {
        Err(Error::LeaseHeld { holder, .. }) => assert_eq!(holder, "proc-a"),
        other => panic!("expected LeaseHeld, got {other:?}"),
    }
    clock.advance(Duration::from_secs(29));
    assert!(
        b.acquire_lease("evaluator/app", Some(TTL)).is_err(),
        "not yet lapsed"
    );
    clock.advance(Duration::from_secs(1));
    let lb = b.acquire_lease("evaluator/app", Some(TTL)).unwrap();
    assert_eq!((lb.holder.as_str(), lb.generation), ("proc-b", 2));
}

/// Invariant 7: renewal extends a held lease under the same generation;
/// once another took it over, the old holder's renewal is `LeaseLost`, and
/// taking it again — even by a former holder — is a new generation.
fn renewal_extends_a_held_lease_and_fails_once_it_was_taken_over<B: TestBackend>() {
    let (_place, clock, a, b) = two::<B>();
    let mut la = a.acquire_lease("follower/edge", Some(TTL)).unwrap();
    for _ in 0..5 {
        clock.advance(Duration::from_secs(10));
        la = a.renew_lease(&la).unwrap();
        assert_eq!(la.generation, 1, "renewal keeps the generation");
        assert_eq!(la.expires_at, clock.now_ms() + 30_000);
    }
    // Renewals stop (a paused process); the lease lapses; b takes over.
    clock.advance(Duration::from_secs(31));
    let lb = b.acquire_lease("follower/edge", Some(TTL)).unwrap();
    let e = a.renew_lease(&la).unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    // Re-acquiring by the same holder after a lapse is a takeover too.
    b.release_lease(&lb).unwrap();
    let la2 = a.acquire_lease("follower/edge", Some(TTL)).unwrap();
    assert_eq!(la2.generation, lb.generation + 1);
}

/// Invariant 7: a write made under a lease commits only while the lease is
/// held, and the check is in the write's own transaction — before the
/// write's statements or after them.
fn a_stale_holders_fenced_write_is_refused_after_another_took_over<B: TestBackend>() {
    let (_place, clock, a, b) = two::<B>();
    let la = a.acquire_lease("scheduler", Some(TTL)).unwrap();
    a.write(|tx| {
        tx.fence(&la)?;
        work(tx, "a", la.generation)
    })
    .unwrap();

    clock.advance(TTL);
    let lb = b.acquire_lease("scheduler", Some(TTL)).unwrap();
    assert_eq!(lb.generation, la.generation + 1);

    // a wakes from its pause and writes as if it still held the lease.
    let e = a
        .write(|tx| {
            tx.fence(&la)?;
            work(tx, "a", la.generation)
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
            work(tx, "a-late", la.generation)?;
            tx.fence(&la)
        })
        .unwrap_err();
    assert!(e.is_lease_lost());

    b.write(|tx| {
        tx.fence(&lb)?;
        work(tx, "b", lb.generation)
    })
    .unwrap();
    assert_eq!(
        B::count(&a, "SELECT count(*) FROM work WHERE by LIKE 'a%'"),
        1
    );
    assert_eq!(B::count(&a, "SELECT count(*) FROM work WHERE by = 'b'"), 1);
}

/// Invariant 7: held means "not expired" too, by the engine's clock: an
/// expired lease fences its holder out and cannot be renewed, even before
/// anyone else takes it.
fn an_expired_lease_fences_even_before_anyone_takes_it<B: TestBackend>() {
    let (_place, clock, a, _b) = two::<B>();
    let la = a.acquire_lease("scheduler", Some(TTL)).unwrap();
    clock.advance(TTL);
    let e = a.write(|tx| tx.fence(&la)).unwrap_err();
    assert!(e.is_lease_lost());
    assert!(a.renew_lease(&la).unwrap_err().is_lease_lost());
}

/// Invariant 7: a release frees the lease at once (once), the next holder
/// gets a new generation, and the released one fences nothing in.
fn release_frees_the_lease_at_once_and_never_reuses_a_generation<B: TestBackend>() {
    let (_place, _clock, a, b) = two::<B>();
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

/// Invariant 7: the holder acquiring its own lease again extends it; the
/// generation (the fencing token its writes carry) stays.
fn acquiring_a_lease_one_holds_extends_it_without_a_new_generation<B: TestBackend>() {
    let (_place, clock, a, _b) = two::<B>();
    let first = a.acquire_lease("loop", Some(TTL)).unwrap();
    clock.advance(Duration::from_secs(5));
    let again = a.acquire_lease("loop", Some(TTL)).unwrap();
    assert_eq!(again.generation, first.generation);
    assert_eq!(again.acquired_at, first.acquired_at);
    assert_eq!(again.expires_at, clock.now_ms() + 30_000);
}

/// Invariant 7 on a clock that jumps back: a renewal never moves the expiry
/// earlier, so another holder cannot take the lease before it lapsed.
fn a_clock_that_jumps_back_never_shortens_a_lease<B: TestBackend>() {
    let (_place, clock, a, b) = two::<B>();
    let la = a.acquire_lease("loop", Some(TTL)).unwrap();
    let t0 = clock.now_ms();
    clock.set(t0 - 60_000);
    let renewed = a.renew_lease(&la).unwrap();
    assert_eq!(
        renewed.expires_at, la.expires_at,
        "expiry only moves forward"
    );
    clock.set(t0 + 29_000);
    assert!(b.acquire_lease("loop", Some(TTL)).is_err());
}

/// Invariant 10: a bad lease name or ttl is a typed error, and no lease is
/// taken.
fn bad_lease_arguments_are_typed_errors<B: TestBackend>() {
    let (_place, _clock, a, _b) = two::<B>();
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

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use reflexr::Error;
    use reflexr_testkit as common;
    use std::time::Duration;

    on_backends!(a_lapsed_lease_fences_its_old_holder_out,);

    /// Invariant 7: a lease has one live holder; once it lapses another takes it
    /// with a new generation, and a write the old holder fences commits nothing.
    fn a_lapsed_lease_fences_its_old_holder_out<B: TestBackend>() {
        let (place, clock, a) = setup::<B>();
        let b = B::open(&place, &clock, "other");
        let ttl = Some(Duration::from_secs(30));
        let held = a.acquire_lease("projector", ttl).unwrap();
        assert_eq!(held.generation, 1);
        let e = b.acquire_lease("projector", ttl).unwrap_err();
        assert!(
            matches!(&e, Error::LeaseHeld { holder, .. } if holder == "test"),
            "{e}"
        );
        clock.advance(Duration::from_secs(10));
        let held = a.renew_lease(&held).unwrap();
        clock.advance(Duration::from_secs(31));
        let taken = b.acquire_lease("projector", ttl).unwrap();
        assert_eq!(taken.generation, 2);
        let fenced = a
            .write(|tx| {
                tx.fence(&held)?;
                B::insert_thing(tx, "stale")?;
                tx.append("app", &made("stale"))
            })
            .unwrap_err();
        assert!(
            matches!(fenced, Error::LeaseLost { generation: 1, .. }),
            "{fenced}"
        );
        assert!(B::things(&a).is_empty());
        assert!(all(&a).is_empty());
        assert!(a.renew_lease(&held).is_err());
        assert!(!a.release_lease(&held).unwrap());
        assert!(b.release_lease(&taken).unwrap());
        let leases = a.leases().unwrap();
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].generation, 2);
    }
}
