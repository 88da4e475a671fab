//! The jobs loop: reactions, deliveries, scheduled work and pruning (ADR
//! 0011; DESIGN.md invariants 2, 5, 9). Each test is written once, generic
//! over the backend, and runs on every backend: `on_backends!` runs it on an
//! SQLite temp file and — with the feature `postgres` — on PostgreSQL
//! (`name::sqlite`, `name::postgres`).

use reflexr_testkit as common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::channels::email_channel;
use common::{children_on_backends, later, on_backends};
use proptest::prelude::*;
use reflexr::{
    ChannelPolicy, Clock, ConsumerKind, Delivery, Engine, Guarantee, Job, ManualClock, NewEvent,
    Query, Reaction, Retention, RetryPolicy, RunState, Sqlite, Tx,
};

on_backends!(
    a_reaction_whose_commit_keeps_failing_shows_as_stuck_and_holds_back_no_other_work,
    a_reaction_reads_the_log_inside_its_own_transaction,
    a_crash_between_a_reactions_handling_and_its_commit_re_handles_without_duplicates,
    an_at_most_once_occurrence_is_lost_to_a_crash_and_an_at_least_once_one_runs_again,
    an_interval_of_zero_switches_a_job_off,
    pruning_removes_finished_runs_but_keeps_dead_ones,
    an_occurrence_whose_executor_stopped_mid_run_is_lost_if_at_most_once_and_rerun_if_at_least_once,
);

children_on_backends!(child_process_reacts_and_hangs_before_commit);

const MINUTE: Duration = Duration::from_secs(60);

/// The types of `app`, the workspace of every test.
const APP_TYPES: &[&str] = &["session.changed", "other"];

/// The application's tables: session 1 in room A, with three RSVPs, one
/// statement each in both dialects. Safe to run at every open (the RSVPs
/// are written afresh).
const APP_SQL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS sessions (id INTEGER PRIMARY KEY, room TEXT)",
    "CREATE TABLE IF NOT EXISTS rsvps (session INTEGER, email TEXT)",
    "INSERT INTO sessions VALUES (1, 'A') ON CONFLICT DO NOTHING",
    "DELETE FROM rsvps",
    "INSERT INTO rsvps VALUES (1, 'ada@x'), (1, 'grace@x'), (1, 'alan@x')",
];

/// What the tests need of a backend besides [`TestBackend`]: a query of the
/// application's inside the engine's transaction.
trait Rsvps: TestBackend {
    /// The emails of session 1's RSVPs, as the transaction sees them.
    fn emails(tx: &Tx<'_, Self>) -> reflexr::Result<Vec<String>>;
}

impl Rsvps for Sqlite {
    fn emails(tx: &Tx<'_>) -> reflexr::Result<Vec<String>> {
        let mut stmt = tx
            .conn()
            .prepare("SELECT email FROM rsvps WHERE session = 1")?;
        let emails = stmt
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        Ok(emails)
    }
}

#[cfg(feature = "postgres")]
impl Rsvps for reflexr::Postgres {
    fn emails(tx: &Tx<'_, reflexr::Postgres>) -> reflexr::Result<Vec<String>> {
        Ok(tx
            .query("SELECT email FROM rsvps WHERE session = 1", &[])?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }
}

/// An engine on the place with the workspace `app` and the application's
/// tables (see [`APP_SQL`]), written in one transaction.
fn app_engine<B: TestBackend>(place: &B::Place, clock: &ManualClock, holder: &str) -> Engine<B> {
    let e = B::open(place, clock, holder);
    e.ensure_workspace("app", APP_TYPES).unwrap();
    e.write(|tx| APP_SQL.iter().try_for_each(|sql| B::run_sql(tx, sql)))
        .expect("the application's SQL");
    e
}

/// A place and the clock of its engines, at the round time every test
/// starts from.
fn scene<B: TestBackend>() -> (B::Place, ManualClock) {
    (B::place(), later(0))
}

/// A reaction that enqueues one email per RSVP of the changed session.
fn notifier<B: Rsvps>() -> Reaction<B> {
    B::reaction("notifier", "app")
        .on(["session.changed"])
        .handle(|event, tx| {
            for email in B::emails(tx)? {
                tx.deliver(&Delivery::new("email", "moved").to(email).caused_by(event))?;
            }
            Ok(())
        })
}

fn edit<B: TestBackend>(e: &Engine<B>, room: &str, fail: bool) -> reflexr::Result<()> {
    e.write(|tx| {
        B::run_sql(
            tx,
            &format!("UPDATE sessions SET room = '{room}' WHERE id = 1"),
        )?;
        let at = tx.now_ms();
        tx.append(
            "app",
            &NewEvent::new("session.changed", "session/1", "admin", at)
                .payload(&serde_json::json!({ "room": room })),
        )?;
        if fail {
            return Err(reflexr::Error::Invalid {
                field: "room",
                reason: "refused".into(),
            });
        }
        Ok(())
    })
}

/// Invariant 5 and "nothing wedges silently": the failing reaction is
/// recorded on its cursor, which stays where it is; another reaction and
/// the scheduler go on meanwhile, and once unstuck its deliveries go out
/// once.
fn a_reaction_whose_commit_keeps_failing_shows_as_stuck_and_holds_back_no_other_work<B: Rsvps>() {
    let (place, clock) = scene::<B>();
    let e = app_engine::<B>(&place, &clock, "test");
    let sent = email_channel(&e, ChannelPolicy::BestEffort);
    e.register_reaction(notifier::<B>()).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&seen);
    e.register_reaction(
        B::reaction("counter", "app")
            .on(["session.changed"])
            .handle(move |_, _| {
                s.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }),
    )
    .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    e.register_job(counting_job::<B>("tick", MINUTE, &runs))
        .unwrap();
    B::refuse(
        &e,
        "notifier_stuck",
        "UPDATE OF position ON reflexr_cursors",
        "NEW.name = 'notifier'",
        "the notifier is stuck",
    );
    edit(&e, "B", false).unwrap();
    clock.advance(MINUTE);
    for _ in 0..3 {
        e.run_until_idle().unwrap();
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the other reaction went on");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "and so did the scheduler");
    assert!(
        sent.lock().unwrap().is_empty(),
        "the stuck one enqueued nothing"
    );
    let stuck: Vec<_> = e
        .cursors()
        .unwrap()
        .into_iter()
        .filter(|c| c.is_stuck())
        .collect();
    assert_eq!(stuck.len(), 1);
    assert_eq!(
        (stuck[0].kind, stuck[0].name.as_str()),
        (ConsumerKind::Reaction, "notifier")
    );
    assert!(stuck[0].failures >= 3, "once per turn of the loop");
    assert!(
        stuck[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("the notifier is stuck")
    );

    B::allow(&e, "notifier_stuck", "reflexr_cursors");
    e.run_until_idle().unwrap();
    assert_eq!(
        sent.lock().unwrap().len(),
        3,
        "unstuck, its notices go out once"
    );
    assert!(e.cursors().unwrap().iter().all(|c| c.failures == 0));
}

/// Invariant 2 seen from a reaction: `Tx::read` sees the transaction's own
/// writes, and the committed log.
fn a_reaction_reads_the_log_inside_its_own_transaction<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = app_engine::<B>(&place, &clock, "test");
    let counts = Arc::new(Mutex::new(Vec::new()));
    let c = Arc::clone(&counts);
    e.register_reaction(
        B::reaction("history", "app")
            .on(["session.changed"])
            .handle(move |event, tx| {
                let before = tx.read(&Query::new("app").types(["session.changed"]))?;
                c.lock()
                    .unwrap()
                    .push(before.iter().filter(|e| e.seq <= event.seq).count());
                Ok(())
            }),
    )
    .unwrap();
    edit(&e, "B", false).unwrap();
    edit(&e, "C", false).unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(*counts.lock().unwrap(), [1, 2]);
    let seen_own = e
        .write(|tx| {
            let at = tx.now_ms();
            tx.append("app", &NewEvent::new("other", "x", "app", at))?;
            Ok(tx.read(&Query::new("app").types(["other"]))?.len())
        })
        .unwrap();
    assert_eq!(seen_own, 1, "a transaction reads what it appended");
}

/// The child's side of the crash test: handles the change, enqueues its
/// deliveries, and is killed before the reaction's transaction commits. Its
/// clock starts at the present, as the parent's does.
fn child_process_reacts_and_hangs_before_commit<B: Rsvps>() {
    let e = parent_engine::<B>(&Opts::new(&ManualClock::starting_now(), "child"));
    e.register_channel("email", ChannelPolicy::BestEffort, |_, _| Ok(()))
        .unwrap();
    e.register_reaction(notifier::<B>().handle(|event, tx| {
        for email in ["ada@x", "grace@x", "alan@x"] {
            tx.deliver(&Delivery::new("email", "moved").to(email).caused_by(event))?;
        }
        println!("\nenqueued");
        loop {
            std::thread::park(); // killed here, inside the transaction
        }
    }))
    .unwrap();
    e.run_until_idle().unwrap();
}

/// Invariants 2 and 5: the deliveries commit with the reaction's cursor:
/// the crash loses both, and the next handling enqueues them once.
fn a_crash_between_a_reactions_handling_and_its_commit_re_handles_without_duplicates<B: Rsvps>() {
    let place = B::place();
    let clock = ManualClock::starting_now();
    {
        let e = app_engine::<B>(&place, &clock, "setup");
        edit(&e, "B", false).unwrap();
    }
    let mut child = child::<B>(&place, "child_process_reacts_and_hangs_before_commit", &[]);
    assert!(child.past("enqueued"), "the child handled the event");
    child.kill();

    // The child held the loop lease: past it, this engine takes over.
    clock.advance(MINUTE);
    let e = app_engine::<B>(&place, &clock, "survivor");
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM reflexr_runs"),
        0,
        "nothing committed"
    );
    let sent = email_channel(&e, ChannelPolicy::Retried(RetryPolicy::default()));
    e.register_reaction(notifier::<B>()).unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(sent.lock().unwrap().len(), 3);
    assert_eq!(B::count(&e, "SELECT count(*) FROM reflexr_runs"), 3);
    let cursor = e
        .cursors()
        .unwrap()
        .into_iter()
        .find(|c| c.kind == ConsumerKind::Reaction)
        .unwrap();
    assert_eq!((cursor.position, cursor.lag), (1, 0));
}

fn counting_job<B: TestBackend>(name: &str, every: Duration, runs: &Arc<AtomicUsize>) -> Job<B> {
    let r = Arc::clone(runs);
    B::job(Job::every(name, every)).handler(move |_, _| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
}

/// Invariant 5 as a job's guarantee says: an at-most-once occurrence whose
/// attempt crashed is dead, never run again; an at-least-once one runs
/// again after its backoff.
fn an_at_most_once_occurrence_is_lost_to_a_crash_and_an_at_least_once_one_runs_again<
    B: TestBackend,
>() {
    let (place, clock) = scene::<B>();
    let e = app_engine::<B>(&place, &clock, "test");
    let calls = Arc::new(Mutex::new(Vec::new()));
    for (name, guarantee) in [
        ("most", Guarantee::AtMostOnce),
        ("least", Guarantee::AtLeastOnce),
    ] {
        let c = Arc::clone(&calls);
        let first = AtomicUsize::new(0);
        e.register_job(
            B::job(Job::every(name, MINUTE).guarantee(guarantee)).handler(move |o, _| {
                c.lock().unwrap().push((o.job.clone(), o.attempt));
                if first.fetch_add(1, Ordering::SeqCst) == 0 {
                    // The process "dies" mid-occurrence: the handler panics,
                    // which fails the attempt like a crash whose claim lapsed.
                    panic!("crashed mid-occurrence");
                }
                Ok(())
            }),
        )
        .unwrap();
    }
    clock.advance(MINUTE);
    e.run_until_idle().unwrap();
    clock.advance(MINUTE * 10);
    e.run_until_idle().unwrap();
    let calls = calls.lock().unwrap();
    let of = |job: &str| calls.iter().filter(|(j, _)| j == job).count();
    // at most once: the first occurrence ran once (and failed); the next
    // minute's ran once. at least once: the first ran again after its backoff.
    assert_eq!(of("most"), 2, "{calls:?}");
    assert!(of("least") >= 2, "{calls:?}");
    let most = e
        .runs(None, 20)
        .unwrap()
        .into_iter()
        .find(|r| r.id.starts_with("most@") && r.state == RunState::Dead)
        .expect("the lost occurrence is dead, not repeated");
    assert_eq!(most.max_attempts, 1);
}

/// Scheduled work (ADR 0011; no numbered invariant): an interval of zero
/// switches a job off (no occurrence, no due time); switched on again, it is
/// due an interval later.
fn an_interval_of_zero_switches_a_job_off<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = app_engine::<B>(&place, &clock, "test");
    let runs = Arc::new(AtomicUsize::new(0));
    e.register_job(counting_job::<B>("reminders", Duration::ZERO, &runs))
        .unwrap();
    clock.advance(MINUTE * 100);
    e.run_until_idle().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let s = &e.schedules().unwrap()[0];
    assert_eq!((s.spec.as_str(), s.next_due_at), ("off", None));
    // Switched on again, it is due an interval later.
    drop(e);
    let e = app_engine::<B>(&place, &clock, "test");
    e.register_job(counting_job::<B>("reminders", MINUTE, &runs))
        .unwrap();
    clock.advance(MINUTE);
    e.run_until_idle().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Invariant 9: an event goes only once every cursor on its workspace
/// passed it and it is older than the retention; seqs never come back.
fn pruning_never_deletes_an_event_a_cursor_has_not_passed<B: TestBackend>(
    events: usize,
    cursors: &[usize],
    age_minutes: u64,
) -> Result<(), TestCaseError> {
    let (place, clock) = scene::<B>();
    let e = app_engine::<B>(&place, &clock, "test");
    for i in 0..events {
        e.append("app", &NewEvent::new("other", format!("x/{i}"), "app", 0))
            .unwrap();
        clock.advance(MINUTE);
    }
    for (k, c) in cursors.iter().enumerate() {
        e.save_cursor(&format!("c{k}"), "app", (*c).min(events) as i64)
            .unwrap();
    }
    let retention = Retention {
        events: Some(MINUTE * age_minutes as u32),
        ..Retention::default()
    };
    let pruned = B::prune(&e, &retention).unwrap();
    let min_cursor = cursors
        .iter()
        .map(|c| (*c).min(events))
        .min()
        .unwrap_or(events) as i64;
    let now = clock.now_ms();
    let left = e.read(&Query::new("app").limit(1_000)).unwrap();
    for ev in &left {
        // Anything left would have been allowed to stay.
        prop_assert!(ev.seq > min_cursor || ev.recorded_at >= now - (age_minutes as i64) * 60_000);
    }
    let gone = events as u64 - left.len() as u64;
    prop_assert_eq!(gone, pruned.events);
    // Nothing a cursor has not passed is gone: every seq after the lowest
    // cursor is still there.
    let after: Vec<i64> = left
        .iter()
        .map(|e| e.seq)
        .filter(|s| *s > min_cursor)
        .collect();
    prop_assert_eq!(
        after,
        ((min_cursor + 1)..=(events as i64)).collect::<Vec<_>>()
    );
    // And seqs never come back.
    let next = e
        .append("app", &NewEvent::new("other", "new", "app", 0))
        .unwrap();
    prop_assert_eq!(next.seq, events as i64 + 1);
    Ok(())
}

/// [`pruning_never_deletes_an_event_a_cursor_has_not_passed`] on each
/// backend, as `pruning_never_deletes_an_event_a_cursor_has_not_passed::sqlite`
/// and `::postgres`.
mod pruning_never_deletes_an_event_a_cursor_has_not_passed {
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

        #[test]
        fn sqlite(
            events in 1usize..60,
            cursors in prop::collection::vec(0usize..60, 0..4),
            age_minutes in 0u64..30,
        ) {
            super::pruning_never_deletes_an_event_a_cursor_has_not_passed::<Sqlite>(
                events, &cursors, age_minutes,
            )?;
        }
    }

    #[cfg(feature = "postgres")]
    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

        #[test]
        fn postgres(
            events in 1usize..60,
            cursors in prop::collection::vec(0usize..60, 0..4),
            age_minutes in 0u64..30,
        ) {
            super::pruning_never_deletes_an_event_a_cursor_has_not_passed::<reflexr::Postgres>(
                events, &cursors, age_minutes,
            )?;
        }
    }
}

/// Pruning and invariant 5: finished runs older than the retention go; a
/// dead one stays for an operator.
fn pruning_removes_finished_runs_but_keeps_dead_ones<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = app_engine::<B>(&place, &clock, "test");
    e.register_channel("email", ChannelPolicy::BestEffort, |msg, _| {
        if msg.to.as_deref() == Some("bad") {
            Err("no".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    for to in ["a", "b", "bad"] {
        e.deliver(&Delivery::new("email", "x").to(to)).unwrap();
    }
    e.run_until_idle().unwrap();
    clock.advance(MINUTE * 10);
    let pruned = B::prune(&e, &Retention::older_than(MINUTE)).unwrap();
    assert_eq!((pruned.runs, pruned.dead_letters), (2, 0));
    assert_eq!(e.runs(None, 10).unwrap()[0].state, RunState::Dead);
}

/// Invariant 5 and a job's guarantee: the claim is the "taken" mark: it
/// commits before the handler runs. An executor that stops mid-run (here:
/// paused past its claim's lease) leaves an at-most-once occurrence dead,
/// never run again, and an at-least-once one to be run again by another
/// executor.
fn an_occurrence_whose_executor_stopped_mid_run_is_lost_if_at_most_once_and_rerun_if_at_least_once<
    B: TestBackend,
>() {
    for (guarantee, reruns) in [(Guarantee::AtMostOnce, 0), (Guarantee::AtLeastOnce, 1)] {
        let (place, clock) = scene::<B>();
        let a = app_engine::<B>(&place, &clock, "engine-a");
        let b = app_engine::<B>(&place, &clock, "engine-b");
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release_tx, release) = std::sync::mpsc::channel::<()>();
        let release = Mutex::new(release);
        let started_tx = Mutex::new(started_tx);
        a.register_job(
            B::job(Job::every("j", MINUTE).guarantee(guarantee)).handler(move |_, _| {
                started_tx.lock().unwrap().send(()).unwrap();
                release.lock().unwrap().recv().unwrap();
                Ok(())
            }),
        )
        .unwrap();
        let b_runs = Arc::new(AtomicUsize::new(0));
        b.register_job(counting_job::<B>("j", MINUTE, &b_runs).guarantee(guarantee))
            .unwrap();
        clock.advance(MINUTE);
        let worker = {
            let a = a.clone();
            std::thread::spawn(move || a.run_until_idle())
        };
        started.recv().unwrap();
        clock.advance(Duration::from_secs(31)); // a's claim lapses
        b.run_until_idle().unwrap();
        assert_eq!(b_runs.load(Ordering::SeqCst), reruns, "{guarantee:?}");
        release_tx.send(()).unwrap();
        worker.join().unwrap().unwrap();
        let run = &b.runs(None, 10).unwrap()[0];
        let expected = match guarantee {
            Guarantee::AtMostOnce => RunState::Dead,
            Guarantee::AtLeastOnce => RunState::Succeeded,
        };
        assert_eq!(run.state, expected, "{guarantee:?}: {run:?}");
    }
}

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::channels::email_channel;
    use common::on_backends;
    use reflexr::inspect::RunKind;
    use reflexr::{
        ChannelPolicy, Delivery, Error, ManualClock, Missed, NewEvent, RetryPolicy, RunState,
    };
    use reflexr_testkit as common;
    use serde_json::Value;
    use std::sync::Arc;
    use std::time::Duration;

    on_backends!(
        a_reaction_delivers_once_its_write_commits_and_nothing_when_it_rolls_back,
        a_reaction_skips_unknown_types_and_dead_letters_a_failing_event_then_moves_on,
        the_best_effort_channel_never_retries_and_the_retried_one_gives_up_after_its_policy,
        a_scheduled_occurrence_runs_once_with_two_engines_on_one_database,
        missed_occurrences_run_once_or_are_skipped_as_the_job_says,
    );

    /// Invariants 2 and 5 through the loop: a reaction enqueues one delivery
    /// per recipient in the transaction that moves its cursor; the channel
    /// sends each, all in one drain. A write that rolls back leaves no event,
    /// so nothing is sent for it.
    fn a_reaction_delivers_once_its_write_commits_and_nothing_when_it_rolls_back<B: TestBackend>() {
        let (_place, _clock, e) = setup::<B>();
        let sent = email_channel(&e, ChannelPolicy::Retried(RetryPolicy::default()));
        e.register_reaction(B::reaction("notifier", "app").on(["thing.made"]).handle(
            |event, tx| {
                let p: Value = event.payload()?;
                for to in p["tell"].as_array().unwrap() {
                    let to = to.as_str().unwrap();
                    tx.deliver(&Delivery::new("email", "made").to(to).caused_by(event))?;
                }
                Ok(())
            },
        ))
        .unwrap();
        let failed: reflexr::Result<()> = e.write(|tx| {
            B::insert_thing(tx, "t-0")?;
            tx.append("app", &made_for("t-0", &["nobody@x"]))?;
            Err(Error::Invalid {
                field: "thing",
                reason: "refused".into(),
            })
        });
        assert!(failed.is_err());
        e.write(|tx| {
            B::insert_thing(tx, "t-1")?;
            tx.append("app", &made_for("t-1", &["ada@x", "grace@x", "alan@x"]))
        })
        .unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!((idle.reacted, idle.succeeded), (1, 3));
        let mut sent = sent.lock().unwrap().clone();
        sent.sort();
        assert_eq!(sent, ["ada@x", "alan@x", "grace@x"]);
        let deliveries = e.runs(None, 10).unwrap();
        assert!(
            deliveries
                .iter()
                .all(|r| r.kind == RunKind::Delivery && r.event_seq == Some(1))
        );
        assert_eq!(e.run_until_idle().unwrap().reacted, 0, "handled once");
    }

    /// A reaction handles only its types; an event whose handler fails or
    /// panics is dead-lettered with its writes rolled back (the deliveries it
    /// enqueued too), and the reaction moves on.
    fn a_reaction_skips_unknown_types_and_dead_letters_a_failing_event_then_moves_on<
        B: TestBackend,
    >() {
        let (_place, _clock, e) = setup::<B>();
        email_channel(&e, ChannelPolicy::BestEffort);
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = Arc::clone(&handled);
        e.register_reaction(B::reaction("picky", "app").on(["thing.made"]).handle(
            move |event, tx| {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tx.deliver(&Delivery::new("email", "x").caused_by(event))?;
                let p: Value = event.payload()?;
                match p["id"].as_str() {
                    Some("bad") => Err("no such thing".into()),
                    Some("worse") => panic!("a bug in the reaction"),
                    _ => Ok(()),
                }
            },
        ))
        .unwrap();
        for id in ["b", "bad", "c", "worse", "d"] {
            e.append("app", &made(id)).unwrap();
            e.append(
                "app",
                &NewEvent::new("thing.gone", format!("thing/{id}"), "t", 0),
            )
            .unwrap();
        }
        e.run_until_idle().unwrap();
        let handled = handled.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(handled, 5, "only its own type");
        assert_eq!(
            e.runs(None, 10).unwrap().len(),
            3,
            "the failed ones' rolled back"
        );
        let letters = e.dead_letters(false, 10).unwrap();
        let mut reasons: Vec<(&str, &str)> = letters
            .iter()
            .map(|d| (d.kind.as_str(), d.reason.as_str()))
            .collect();
        reasons.sort();
        assert_eq!(
            reasons,
            [("reaction", "handler_error"), ("reaction", "handler_panic")]
        );
        assert_eq!(letters[0].event_seq, Some(3));
        assert_eq!(e.cursors().unwrap()[0].lag, 0);
    }

    /// Invariant 5 per channel: a best-effort channel sends once; a retried one
    /// as its policy says, then dead-letters; a channel this engine did not
    /// register is refused.
    fn the_best_effort_channel_never_retries_and_the_retried_one_gives_up_after_its_policy<
        B: TestBackend,
    >() {
        let (_place, clock, e) = setup::<B>();
        let tries = Arc::new(std::sync::Mutex::new(Vec::new()));
        for (channel, policy) in [
            ("push", ChannelPolicy::BestEffort),
            (
                "email",
                ChannelPolicy::Retried(RetryPolicy::attempts(3).fixed(MINUTE)),
            ),
        ] {
            let t = Arc::clone(&tries);
            e.register_channel(channel, policy, move |msg, _| {
                t.lock().unwrap().push((msg.channel.clone(), msg.attempt));
                Err("the service is down".into())
            })
            .unwrap();
        }
        e.deliver(&Delivery::new("push", "ping").to("device-1"))
            .unwrap();
        e.deliver(&Delivery::new("email", "ping").to("ada@x"))
            .unwrap();
        for _ in 0..5 {
            e.run_until_idle().unwrap();
            clock.advance(MINUTE);
        }
        let tries = tries.lock().unwrap();
        let of = |c: &str| tries.iter().filter(|(ch, _)| ch == c).count();
        assert_eq!(of("push"), 1, "best effort: once");
        assert_eq!(of("email"), 3, "retried: as its policy says, then given up");
        let runs = e.runs(None, 10).unwrap();
        assert!(runs.iter().all(|r| r.state == RunState::Dead));
        let letters = e.dead_letters(false, 10).unwrap();
        assert_eq!(letters.len(), 2);
        assert!(letters.iter().all(|d| d.error == "the service is down"));
        let err = e.deliver(&Delivery::new("fax", "ping")).unwrap_err();
        assert!(err.is_not_found(), "{err}");
    }

    /// Invariant 5 for scheduled work: each due occurrence runs once, whatever
    /// the number of engines: the loop lease keeps one scheduler at a time, and
    /// the occurrence's id (`<job>@<due>`) keeps a second from making it again.
    fn a_scheduled_occurrence_runs_once_with_two_engines_on_one_database<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let a = B::open(&place, &clock, "engine-a");
        let b = B::open(&place, &clock, "engine-b");
        let every = Duration::from_secs(20);
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = || runs.load(std::sync::atomic::Ordering::SeqCst);
        a.register_job(counting_job::<B>("reminders", every, &runs))
            .unwrap();
        b.register_job(counting_job::<B>("reminders", every, &runs))
            .unwrap();
        a.run_until_idle().unwrap(); // a takes the loop lease (30 s)
        assert_eq!(count(), 0, "first due an interval after registering");
        clock.advance(every);
        b.run_until_idle().unwrap();
        assert_eq!(count(), 0, "b cannot schedule while a holds the loop");
        a.run_until_idle().unwrap();
        b.run_until_idle().unwrap();
        assert_eq!(count(), 1);
        clock.advance(Duration::from_secs(31));
        b.run_until_idle().unwrap();
        a.run_until_idle().unwrap();
        assert_eq!(count(), 2);
        let ids: Vec<String> = a
            .runs(None, 10)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(
            ids,
            [
                format!("reminders@{}", START_MS + 20_000),
                format!("reminders@{}", START_MS + 40_000)
            ]
        );
        assert_eq!(
            a.schedules().unwrap()[0].next_due_at,
            Some(START_MS + 60_000)
        );
    }

    /// Occurrences missed while no loop ran: one run for them all, or none, as
    /// the job says; then both carry on.
    fn missed_occurrences_run_once_or_are_skipped_as_the_job_says<B: TestBackend>() {
        let (_place, clock, e) = setup::<B>();
        let once = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let skip = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n =
            |c: &Arc<std::sync::atomic::AtomicUsize>| c.load(std::sync::atomic::Ordering::SeqCst);
        e.register_job(counting_job::<B>("catch-up", MINUTE, &once).missed(Missed::RunOnce))
            .unwrap();
        e.register_job(counting_job::<B>("skip", MINUTE, &skip).missed(Missed::Skip))
            .unwrap();
        clock.advance(MINUTE * 60);
        e.run_until_idle().unwrap();
        assert_eq!(n(&once), 1, "one run for 60 missed");
        assert_eq!(n(&skip), 0, "skipped");
        let catch_up = &e.runs(None, 10).unwrap()[0];
        let input: Value = serde_json::from_str(&catch_up.input).unwrap();
        assert_eq!(input["missed"], 59);
        clock.advance(MINUTE);
        e.run_until_idle().unwrap();
        assert_eq!((n(&once), n(&skip)), (2, 1));
    }
}
