//! Runs act at least once: claims under leases, retries with backoff, dead
//! letters, scope order, completion in the application's transaction
//! (DESIGN.md, invariants 2, 5, 6). Every test here is written once,
//! generic over the backend, and runs on SQLite and — with the feature
//! `postgres` — on PostgreSQL (`on_backends!`); the child process of the
//! kill test too.

use reflexr_testkit as common;

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::rules::{JOB_TYPES, job, on_job};
use common::{children_on_backends, on_backends};
use proptest::prelude::*;
use reflexr::{Clock, Engine, ManualClock, NewEvent, RetryPolicy, RunOrder, RunState};

on_backends!(
    a_handler_that_fails_twice_then_succeeds_runs_three_times_and_completes_once,
    exhausted_retries_dead_letter_the_run_with_the_error_text,
    a_run_whose_executor_was_killed_mid_handler_is_taken_by_another_after_its_lease_lapses,
    completing_in_the_same_transaction_as_an_app_row_is_atomic,
    a_panicking_handler_is_a_failed_attempt_and_the_executor_threads_go_on,
    operators_list_runs_by_state_and_only_dead_runs_are_retried_or_discarded,
);

children_on_backends!(child_process_hangs_in_a_handler);

const BACKOFF: Duration = Duration::from_secs(10);

/// The round, recognisable time a test's clock starts at.
const START_MS: i64 = 1_800_000_000_000;

const APP_TYPES: &[&str] = JOB_TYPES;

/// The application's table: the worker that completed each run.
const DONE_SQL: &str = "CREATE TABLE IF NOT EXISTS done (run TEXT PRIMARY KEY, by TEXT)";

/// An engine on the place with the workspace `app` and the table `done`.
fn app_engine<B: TestBackend>(place: &B::Place, clock: &ManualClock, holder: &str) -> Engine<B> {
    let e = B::open(place, clock, holder);
    e.ensure_workspace("app", APP_TYPES).unwrap();
    B::sql(&e, DONE_SQL);
    e
}

fn only_run<B: TestBackend>(e: &Engine<B>) -> reflexr::inspect::RunInfo {
    let runs = e.runs(None, 10).unwrap();
    assert_eq!(runs.len(), 1);
    runs.into_iter().next().unwrap()
}

/// Invariant 5: a run is executed until it succeeds; each retry waits for
/// its backoff, and the run completes once.
fn a_handler_that_fails_twice_then_succeeds_runs_three_times_and_completes_once<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = app_engine::<B>(&place, &clock, "test");
    e.register_rule(on_job(RetryPolicy::attempts(5).fixed(BACKOFF)))
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    e.register_action("work", move |run, _| {
        c.fetch_add(1, AtomicOrdering::SeqCst);
        if run.attempt <= 2 {
            Err(format!("the mail server said no (attempt {})", run.attempt).into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    e.append("app", &job("a", 0)).unwrap();

    let first = e.run_until_idle().unwrap();
    assert_eq!((first.fired, first.retried, first.succeeded), (1, 1, 0));
    let run = only_run(&e);
    assert_eq!(run.state, RunState::Ready);
    assert_eq!(run.due_at, clock.now_ms() + 10_000, "due after its backoff");
    assert_eq!(e.run_until_idle().unwrap().claimed, 0, "not due yet");

    clock.advance(BACKOFF);
    assert_eq!(e.run_until_idle().unwrap().retried, 1);
    clock.advance(BACKOFF);
    assert_eq!(e.run_until_idle().unwrap().succeeded, 1);
    clock.advance(BACKOFF * 10);
    assert_eq!(e.run_until_idle().unwrap().claimed, 0);

    assert_eq!(calls.load(AtomicOrdering::SeqCst), 3);
    let run = only_run(&e);
    assert_eq!((run.state, run.attempt), (RunState::Succeeded, 3));
    assert!(e.dead_letters(false, 10).unwrap().is_empty());
}

/// Invariant 5: a run whose attempts are spent is dead, with one dead
/// letter carrying the last error; an operator's retry gives it a fresh set
/// of attempts, on the record.
fn exhausted_retries_dead_letter_the_run_with_the_error_text<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = app_engine::<B>(&place, &clock, "test");
    e.register_rule(on_job(RetryPolicy::attempts(3).fixed(BACKOFF)))
        .unwrap();
    e.register_action("work", |run, _| {
        Err(format!("SMTP 550 on attempt {}", run.attempt).into())
    })
    .unwrap();
    e.append("app", &job("a", 0)).unwrap();
    for _ in 0..3 {
        e.run_until_idle().unwrap();
        clock.advance(BACKOFF);
    }
    let run = only_run(&e);
    assert_eq!((run.state, run.attempt), (RunState::Dead, 3));
    assert_eq!(run.last_error.as_deref(), Some("SMTP 550 on attempt 3"));
    let letters = e.dead_letters(false, 10).unwrap();
    assert_eq!(letters.len(), 1);
    let d = &letters[0];
    assert_eq!(
        (
            d.kind.as_str(),
            d.reason.as_str(),
            d.error.as_str(),
            d.attempts
        ),
        ("run", "attempts_exhausted", "SMTP 550 on attempt 3", 3)
    );
    assert_eq!(d.run_id.as_deref(), Some(run.id.as_str()));

    // An operator retries it: a fresh set of attempts, on the record.
    e.operator("ops", "the mail server is back")
        .unwrap()
        .retry_dead_letter(d.id)
        .unwrap();
    assert_eq!(only_run(&e).state, RunState::Ready);
    assert!(e.dead_letters(false, 10).unwrap().is_empty());
    assert_eq!(
        e.dead_letters(true, 10).unwrap()[0]
            .resolution
            .map(|r| r.as_str()),
        Some("retried")
    );
    assert_eq!(e.audit_log(1).unwrap()[0].action.as_str(), "retry_run");
    e.run_until_idle().unwrap();
    assert_eq!(only_run(&e).attempt, 1, "attempts start again");
}

/// The child's side of the kill test: claims the run and hangs in its
/// handler until killed. Its clock starts at the present, a little after
/// the parent's.
fn child_process_hangs_in_a_handler<B: TestBackend>() {
    let e = parent_engine::<B>(&Opts::new(&ManualClock::starting_now(), "child"));
    e.register_action("work", |run, _| {
        println!("\nhandling {} attempt {}", run.id, run.attempt);
        loop {
            std::thread::park();
        }
    })
    .unwrap();
    e.run_until_idle().unwrap();
}

/// Invariant 5: a claimed run whose lease lapses is claimable again — here
/// one whose executor, another process, was killed in its handler.
fn a_run_whose_executor_was_killed_mid_handler_is_taken_by_another_after_its_lease_lapses<
    B: TestBackend,
>() {
    let place = B::place();
    let clock = ManualClock::starting_now();
    let e = app_engine::<B>(&place, &clock, "survivor");
    e.register_rule(on_job(RetryPolicy::attempts(5))).unwrap();
    e.append("app", &job("a", 0)).unwrap();
    // Decide here, leave the run for the child to claim.
    let executed = e.run_until_idle().unwrap();
    assert_eq!(
        (executed.fired, executed.claimed),
        (1, 0),
        "no handler registered yet"
    );

    let mut child = child::<B>(&place, "child_process_hangs_in_a_handler", &[]);
    let line = child
        .until(|l| l.starts_with("handling").then(|| l.to_string()))
        .expect("the child claimed the run");
    assert!(line.ends_with("attempt 1"));
    child.kill();
    assert_eq!(only_run(&e).state, RunState::Running);
    assert_eq!(only_run(&e).claimed_by.as_deref(), Some("child"));

    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    e.register_action("work", move |_, _| {
        r.fetch_add(1, AtomicOrdering::SeqCst);
        Ok(())
    })
    .unwrap();
    assert_eq!(
        e.run_until_idle().unwrap().claimed,
        0,
        "the child's claim is live"
    );
    // The child's clock started at the present, a little after this
    // clock's start: a minute past covers its 30 s claim.
    clock.advance(Duration::from_secs(60));
    assert_eq!(e.run_until_idle().unwrap().succeeded, 1);
    assert_eq!(ran.load(AtomicOrdering::SeqCst), 1);
    let run = only_run(&e);
    assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
}

/// Invariant 2 for runs: the application's row and the run's completion
/// commit together — a completion refused after the insert leaves no row.
fn completing_in_the_same_transaction_as_an_app_row_is_atomic<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = app_engine::<B>(&place, &clock, "test");
    e.register_rule(on_job(RetryPolicy::attempts(3).fixed(BACKOFF)))
        .unwrap();
    e.register_action("work", |run, ctx| {
        let by = format!("attempt {}", run.attempt);
        ctx.complete(|tx| {
            // Test data: a run id and a fixed text, formatted in.
            B::run_sql(
                tx,
                &format!("INSERT INTO done VALUES ('{}', '{by}')", run.id),
            )?;
            if run.attempt == 1 {
                return Err(reflexr::Error::Invalid {
                    field: "row",
                    reason: "refused after the insert".into(),
                });
            }
            Ok(())
        })?;
        Ok(())
    })
    .unwrap();
    e.append("app", &job("a", 0)).unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM done"),
        0,
        "rolled back with the completion"
    );
    assert_eq!(only_run(&e).state, RunState::Ready);
    clock.advance(BACKOFF);
    e.run_until_idle().unwrap();
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM done WHERE by = 'attempt 2'"),
        1
    );
    assert_eq!(only_run(&e).state, RunState::Succeeded);
}

/// Invariant 5: a panic in a handler is a failed attempt, retried like any
/// other, and the executor threads go on working.
fn a_panicking_handler_is_a_failed_attempt_and_the_executor_threads_go_on<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = B::open_opts(&place, &Opts::new(&clock, "test").executors(2));
    e.ensure_workspace("app", &["job"]).unwrap();
    e.register_rule(on_job(RetryPolicy::attempts(3).fixed(Duration::ZERO)))
        .unwrap();
    let (done_tx, done) = mpsc::channel();
    let done_tx = Mutex::new(done_tx);
    e.register_action("work", move |run, _| {
        if run.attempt == 1 {
            panic!("a bug in the handler");
        }
        done_tx.lock().unwrap().send(run.id.clone()).unwrap();
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    for i in 0..4 {
        e.append("app", &job(&format!("s{i}"), i)).unwrap();
    }
    for _ in 0..4 {
        done.recv_timeout(Duration::from_secs(60))
            .expect("every run succeeds");
    }
    e.shutdown();
    let runs = e.runs(None, 10).unwrap();
    assert!(
        runs.iter()
            .all(|r| r.state == RunState::Succeeded && r.attempt == 2)
    );
}

/// Operators list runs by state; only a dead run is retried or discarded
/// (a checked, audited mutation), and bad input is a typed error
/// (invariant 10).
fn operators_list_runs_by_state_and_only_dead_runs_are_retried_or_discarded<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = app_engine::<B>(&place, &clock, "test");
    e.register_rule(on_job(RetryPolicy::never()).ordering(RunOrder::None))
        .unwrap();
    e.register_action("work", |run, _| {
        let input: serde_json::Value = run.input()?;
        if input["idx"] == 1 {
            Err("no".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    for i in 0..3 {
        e.append("app", &job("a", i)).unwrap();
    }
    e.run_until_idle().unwrap();
    let counts: Vec<_> = e.stats().unwrap().runs.into_iter().collect();
    assert_eq!(counts, [(RunState::Succeeded, 2), (RunState::Dead, 1)]);
    let ok = &e.runs(Some(RunState::Succeeded), 10).unwrap()[0];
    let err = e
        .operator("ops", "why not")
        .unwrap()
        .retry_run(&ok.id)
        .unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    let err = e
        .operator("ops", "typo")
        .unwrap()
        .discard_run("no-such-run")
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let dead = &e.runs(Some(RunState::Dead), 10).unwrap()[0];
    let err = e.operator("", "who?").unwrap_err();
    assert!(err.is_bad_input());
    e.operator("ops", "known bad input")
        .unwrap()
        .discard_run(&dead.id)
        .unwrap();
    assert_eq!(e.run(&dead.id).unwrap().unwrap().state, RunState::Discarded);
    assert_eq!(
        e.dead_letters(true, 10).unwrap()[0]
            .resolution
            .map(|r| r.as_str()),
        Some("discarded")
    );
}

/// One handler call: (scope, idx, attempt, start or end, succeeded).
type Trace = Arc<Mutex<Vec<(String, usize, u32, bool, bool)>>>;

/// Invariant 6: runs of one rule and scope start in firing order, each
/// after the previous one ended, whatever fails and retries — under four
/// executors claiming two at a time.
fn scope_order_holds_under_four_executors_with_random_failures<B: TestBackend>(
    jobs: Vec<(usize, u32)>,
) -> Result<(), TestCaseError> {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = B::open_opts(
        &place,
        &Opts::new(&clock, "test").executors(4).claim_batch(2),
    );
    e.ensure_workspace("app", &["job"]).unwrap();
    e.register_rule(on_job(RetryPolicy::attempts(5).fixed(Duration::ZERO)))
        .unwrap();
    let trace: Trace = Arc::default();
    let (done_tx, done) = mpsc::channel();
    let done_tx = Mutex::new(done_tx);
    let t = Arc::clone(&trace);
    e.register_action("work", move |run, _| {
        let input: serde_json::Value = run.input()?;
        let scope = input["scope"].as_str().unwrap().to_string();
        let idx = input["idx"].as_u64().unwrap() as usize;
        let fails = input["fails"].as_u64().unwrap() as u32;
        t.lock()
            .unwrap()
            .push((scope.clone(), idx, run.attempt, true, false));
        let ok = run.attempt > fails;
        t.lock().unwrap().push((scope, idx, run.attempt, false, ok));
        if ok {
            done_tx.lock().unwrap().send(()).unwrap();
            Ok(())
        } else {
            Err("random failure".into())
        }
    })
    .unwrap();
    e.start().unwrap();
    e.write(|tx| {
        for (idx, (scope, fails)) in jobs.iter().enumerate() {
            tx.append(
                "app",
                &NewEvent::new("job", format!("job/{idx}"), "app", 0).payload(
                    &serde_json::json!({ "scope": format!("s{scope}"), "idx": idx, "fails": fails }),
                ),
            )?;
        }
        Ok(())
    })
    .unwrap();
    for _ in 0..jobs.len() {
        done.recv_timeout(Duration::from_secs(60))
            .expect("every run succeeds");
    }
    e.shutdown();

    let trace = trace.lock().unwrap();
    for scope in 0..4 {
        let name = format!("s{scope}");
        let mine: Vec<_> = trace.iter().filter(|t| t.0 == name).collect();
        let expected: Vec<usize> = jobs
            .iter()
            .enumerate()
            .filter(|(_, (s, _))| *s == scope)
            .map(|(i, _)| i)
            .collect();
        // Starts and ends alternate: nothing of a scope overlaps.
        for (k, t) in mine.iter().enumerate() {
            prop_assert_eq!(t.3, k % 2 == 0, "scope {} overlapped: {:?}", name, mine);
        }
        // Each job's attempts all come before the next job's, in firing order.
        let mut succeeded = Vec::new();
        for w in mine.chunks(2) {
            let (start, end) = (w[0], w[1]);
            prop_assert_eq!((start.1, start.2), (end.1, end.2));
            if let Some(last) = succeeded.last() {
                prop_assert!(
                    start.1 > *last,
                    "scope {} ran {} after {}",
                    name,
                    start.1,
                    last
                );
            }
            if end.4 {
                succeeded.push(end.1);
            }
        }
        prop_assert_eq!(succeeded, expected);
    }
    Ok(())
}

/// The proptest cases of the scope-order test, one per backend, named as
/// `on_backends!` names its tests.
mod scope_order_holds_under_four_executors_with_random_failures {
    use proptest::prelude::*;

    /// Up to 40 jobs, each of one of four scopes and failing 0 to 2 times.
    fn jobs() -> impl Strategy<Value = Vec<(usize, u32)>> {
        prop::collection::vec((0usize..4, 0u32..3), 1..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

        #[test]
        fn sqlite(jobs in jobs()) {
            super::scope_order_holds_under_four_executors_with_random_failures::<reflexr::Sqlite>(
                jobs,
            )?;
        }
    }

    #[cfg(feature = "postgres")]
    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

        #[test]
        fn postgres(jobs in jobs()) {
            super::scope_order_holds_under_four_executors_with_random_failures::<reflexr::Postgres>(
                jobs,
            )?;
        }
    }
}

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use common::rules::{job, on_job};
    use reflexr::{
        ChannelPolicy, Delivery, Engine, Enqueue, Error, ManualClock, NewEvent, Query, RetryPolicy,
        RunState, Unique,
    };
    use reflexr_testkit as common;
    use serde_json::{Value, json};
    use std::sync::Arc;
    use std::time::Duration;

    on_backends!(
        an_enqueue_commits_with_the_callers_rows_and_another_engine_runs_it,
        a_failing_run_is_retried_after_its_backoff_and_dead_lettered_once_spent,
        a_completed_run_commits_its_rows_and_events_with_its_settlement,
        a_lapsed_claim_is_claimed_again_at_the_next_attempt,
        the_executors_of_four_engines_run_every_run_and_settle_it_once,
        a_worker_whose_claim_lapsed_cannot_complete_once_another_worker_claimed_the_run,
        a_batch_settled_in_one_statement_settles_run_by_run_what_a_lost_claim_refuses,
        one_runs_refused_output_fails_only_that_run_and_the_rest_of_its_batch_settles,
        events_emitted_by_a_run_are_not_duplicated_across_retries,
    );

    /// Invariants 2 and 5 for enqueued work: a run exists if and only if the
    /// caller's transaction commits, and any engine on the database that
    /// registered its action runs it; bad input is refused and changes nothing
    /// (invariant 10).
    fn an_enqueue_commits_with_the_callers_rows_and_another_engine_runs_it<B: TestBackend>() {
        let (place, clock, producer) = setup::<B>();
        let failed: reflexr::Result<()> = producer.write(|tx| {
            B::insert_thing(tx, "order-1")?;
            tx.enqueue(&task(1))?;
            Err(Error::Invalid {
                field: "order",
                reason: "out of stock".into(),
            })
        });
        assert!(failed.is_err());
        assert!(producer.runs(None, 10).unwrap().is_empty(), "rolled back");
        assert!(B::things(&producer).is_empty());
        let done = producer
            .write(|tx| {
                B::insert_thing(tx, "order-2")?;
                tx.enqueue(&task(2))
            })
            .unwrap();
        assert!(!done.deduplicated);
        let run = producer.run(&done.id).unwrap().unwrap();
        assert_eq!(run.state, RunState::Ready);
        assert_eq!(
            producer.run_until_idle().unwrap().claimed,
            0,
            "no handler here"
        );

        let consumer = B::open(&place, &clock, "consumer");
        let seen = recording(&consumer);
        assert_eq!(consumer.run_until_idle().unwrap().succeeded, 1);
        assert_eq!(*seen.lock().unwrap(), [2]);
        let run = producer.run(&done.id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Succeeded, 1));
        assert!(producer.enqueue(&Enqueue::new("", &json!({}))).is_err());
        assert!(
            producer
                .enqueue(&task(3).unique("", Unique::WhilePending))
                .is_err()
        );
        assert_eq!(producer.runs(None, 10).unwrap().len(), 1);
    }

    /// Invariant 5: a failed attempt is retried once its backoff passes (not
    /// before), and a run whose attempts are spent is dead with one dead letter.
    fn a_failing_run_is_retried_after_its_backoff_and_dead_lettered_once_spent<B: TestBackend>() {
        let (_place, clock, engine) = setup::<B>();
        let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t = Arc::clone(&tries);
        engine
            .register_action("work", move |_, _| {
                t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err("the mail server said no".into())
            })
            .unwrap();
        let policy = RetryPolicy::attempts(3).fixed(Duration::from_secs(10));
        let id = engine.enqueue(&task(1).retry(policy)).unwrap().id;
        let idle = engine.run_until_idle().unwrap();
        assert_eq!((idle.claimed, idle.retried), (1, 1));
        assert_eq!(engine.run_until_idle().unwrap().claimed, 0, "not due yet");
        clock.advance(Duration::from_secs(10));
        assert_eq!(engine.run_until_idle().unwrap().retried, 1);
        clock.advance(Duration::from_secs(10));
        assert_eq!(engine.run_until_idle().unwrap().dead, 1);
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            engine.run_until_idle().unwrap().claimed,
            0,
            "dead stays dead"
        );
        assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 3);
        let run = engine.run(&id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Dead, 3));
        assert_eq!(run.last_error.as_deref(), Some("the mail server said no"));
        let letters = engine.dead_letters(false, 10).unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].run_id.as_deref(), Some(id.as_str()));
        assert_eq!(letters[0].attempts, 3);
        let counts: Vec<_> = engine.stats().unwrap().runs.into_iter().collect();
        assert_eq!(counts, [(RunState::Dead, 1)]);
    }

    /// Invariants 2 and 5: what a handler completes — the application's rows
    /// and the events it emitted — commits with the run's settlement, once,
    /// with ids derived from the run's; a panic is a failed attempt.
    fn a_completed_run_commits_its_rows_and_events_with_its_settlement<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let f = Arc::clone(&first);
        engine
            .register_action("work", move |run, ctx| {
                if f.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    panic!("the first attempt panics");
                }
                let id = run.id.clone();
                ctx.emit_to("app", "made", made(&id))?;
                ctx.complete(|tx| B::insert_thing(tx, &id))?;
                Ok(())
            })
            .unwrap();
        let policy = RetryPolicy::attempts(2).fixed(Duration::ZERO);
        let id = engine.enqueue(&task(1).retry(policy)).unwrap().id;
        let idle = engine.run_until_idle().unwrap();
        assert_eq!((idle.retried, idle.succeeded), (1, 1));
        let run = engine.run(&id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
        assert!(run.last_error.unwrap().contains("the first attempt panics"));
        assert_eq!(B::things(&engine), std::slice::from_ref(&id));
        let events = all(&engine);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, format!("{id}/made"));
        assert_eq!(engine.run_until_idle().unwrap().claimed, 0);
    }

    /// Invariant 5: a claim whose executor stopped renewing it (forged here: a
    /// holder that is gone) lapses with the lease TTL, and the run is claimed
    /// again at its next attempt; until then nobody else takes it.
    fn a_lapsed_claim_is_claimed_again_at_the_next_attempt<B: TestBackend>() {
        let (_place, clock, engine) = setup::<B>();
        let seen = recording(&engine);
        let id = engine.enqueue(&task(1)).unwrap().id;
        let now = engine.now_ms();
        engine
            .write(|tx| {
                B::run_sql(
                    tx,
                    &format!(
                        "UPDATE reflexr_runs SET state = 'running', attempt = 1, \
                           claimed_by = 'gone', claim_expires_at = {}, started_at = {now} \
                         WHERE id = '{id}'",
                        now + 1_000
                    ),
                )
            })
            .unwrap();
        assert_eq!(engine.run_until_idle().unwrap().claimed, 0, "still held");
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(engine.run_until_idle().unwrap().succeeded, 1);
        assert_eq!(*seen.lock().unwrap(), [1]);
        let run = engine.run(&id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
    }

    /// Invariant 5 across engines: the executor threads of four engines on one
    /// database claim from one queue; every run is handled and its completion
    /// (the application's row, with the settlement) commits exactly once.
    fn the_executors_of_four_engines_run_every_run_and_settle_it_once<B: TestBackend>() {
        let (place, clock, first) = setup::<B>();
        let engines: Vec<Engine<B>> = (0..4)
            .map(|i| B::open(&place, &clock, &format!("executor-{i}")))
            .collect();
        for e in &engines {
            e.register_action("work", move |run, ctx| {
                let id = run.id.clone();
                ctx.complete(|tx| B::insert_thing(tx, &id))?;
                Ok(())
            })
            .unwrap();
            e.start().unwrap();
        }
        let ids: Vec<String> = (0..200)
            .map(|n| first.enqueue(&task(n)).unwrap().id)
            .collect();
        for id in &ids {
            let run = first.wait_for_run(id, Duration::from_secs(120)).unwrap();
            assert_eq!(run.state, RunState::Succeeded, "{id}");
        }
        for e in &engines {
            e.shutdown();
        }
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(B::things(&first), expected, "each completed once");
    }

    /// Invariants 5 and 7: a completion checks the claim's holder and attempt.
    /// A worker paused in its handler past its claim's lease loses the run to
    /// another, which completes it; the first one's completion (its row with
    /// the settlement) is refused and leaves nothing.
    fn a_worker_whose_claim_lapsed_cannot_complete_once_another_worker_claimed_the_run<
        B: TestBackend,
    >() {
        let (place, clock, a) = setup::<B>();
        let b = B::open(&place, &clock, "worker-b");
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let go = std::sync::Mutex::new(go);
        a.register_action("work", move |run, ctx| {
            started_tx.send(()).unwrap();
            go.lock().unwrap().recv().unwrap(); // paused past its lease
            let id = format!("{}:a", run.id);
            ctx.complete(|tx| B::insert_thing(tx, &id))?;
            Ok(())
        })
        .unwrap();
        b.register_action("work", |run, ctx| {
            let id = format!("{}:b", run.id);
            ctx.complete(|tx| B::insert_thing(tx, &id))?;
            Ok(())
        })
        .unwrap();
        let id = a
            .enqueue(&task(1).retry(RetryPolicy::attempts(5)))
            .unwrap()
            .id;
        let worker_a = {
            let a = a.clone();
            std::thread::spawn(move || a.run_until_idle())
        };
        started.recv().unwrap();
        clock.advance(Duration::from_secs(31));
        let idle = b.run_until_idle().unwrap();
        assert_eq!((idle.claimed, idle.succeeded), (1, 1));
        go_tx.send(()).unwrap();
        let idle_a = worker_a.join().unwrap().unwrap();
        assert_eq!(idle_a.succeeded, 0, "a's completion was refused");
        let run = b.run(&id).unwrap().unwrap();
        assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
        assert_eq!(B::things(&b), [format!("{id}:b")]);
    }

    /// Invariants 5 and 7: plain successes settle in one statement that checks
    /// every claim; one taken by another holder meanwhile is refused (and
    /// settled by nobody here), the others succeed.
    fn a_batch_settled_in_one_statement_settles_run_by_run_what_a_lost_claim_refuses<
        B: TestBackend,
    >() {
        let (place, clock, e) = setup::<B>();
        let ids: Vec<String> = (0..3).map(|n| e.enqueue(&task(n)).unwrap().id).collect();
        let thief = B::open(&place, &clock, "thief");
        let victim = ids[0].clone();
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = Arc::clone(&handled);
        e.register_action("work", move |_, _| {
            if h.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 3 {
                thief.write(|tx| {
                    B::run_sql(
                        tx,
                        &format!(
                            "UPDATE reflexr_runs SET claimed_by = 'someone-else' WHERE id = '{victim}'"
                        ),
                    )
                })?;
            }
            Ok(())
        })
        .unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!(
            handled.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "one batch"
        );
        assert_eq!((idle.claimed, idle.succeeded), (3, 2));
        let run = |id: &str| e.run(id).unwrap().unwrap();
        assert_eq!(
            run(&ids[0]).state,
            RunState::Running,
            "the lost claim settled nothing"
        );
        assert_eq!(run(&ids[0]).claimed_by.as_deref(), Some("someone-else"));
        for id in &ids[1..] {
            assert_eq!(run(id).state, RunState::Succeeded, "{id}");
        }
    }

    /// Invariant 5, contained: runs claimed in one batch whose outputs the log
    /// refuses (an unregistered type, a payload over the limit, an id over the
    /// limit), whose completion fails in the application's statement (which
    /// on PostgreSQL aborts that write's transaction), or whose checkpoint is
    /// too large, each fail their own attempt with the reason; the run that
    /// did its job succeeds with its event, and the executor goes on.
    fn one_runs_refused_output_fails_only_that_run_and_the_rest_of_its_batch_settles<
        B: TestBackend,
    >() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = B::open_limited(&place, &clock, 64 * 1024, 8);
        e.ensure_workspace("app", TYPES).unwrap();
        e.register_action("work", |run, ctx| {
            let input: Value = run.input()?;
            let made = || NewEvent::new("thing.made", "thing/x", "worker", 0);
            match input["what"].as_str().unwrap() {
                "ok" => ctx.emit_to("app", "done", made())?,
                "unregistered" => ctx.emit_to("app", "done", NewEvent::new("nope", "x", "w", 0))?,
                "too-big" => ctx.emit_to(
                    "app",
                    "done",
                    made().payload(&json!({ "blob": "x".repeat(100_000) })),
                )?,
                "app-statement" => {
                    ctx.complete(|tx| B::run_sql(tx, "INSERT INTO no_such_table VALUES (1)"))?
                }
                "checkpoint" => ctx.checkpoint(&"y".repeat(100_000))?,
                other => panic!("{other}"),
            }
            Ok(())
        })
        .unwrap();
        e.register_channel("sms", ChannelPolicy::BestEffort, |msg, ctx| {
            // The emitted id is `<delivery id>/sent`: past the id limit.
            ctx.emit_to(
                "app",
                "sent",
                NewEvent::new("thing.made", &msg.template, "sms", 0),
            )?;
            Ok(())
        })
        .unwrap();
        let whats = [
            "ok",
            "unregistered",
            "too-big",
            "app-statement",
            "checkpoint",
        ];
        let ids: Vec<String> = e
            .write(|tx| {
                whats
                    .iter()
                    .map(|w| {
                        let t =
                            Enqueue::new("work", &json!({ "what": w })).retry(RetryPolicy::never());
                        Ok(tx.enqueue(&t)?.id)
                    })
                    .collect()
            })
            .unwrap();
        let long_id = "d".repeat(reflexr::limits::MAX_ID_BYTES - 2);
        e.deliver(&Delivery::new("sms", "hello").id(&long_id))
            .unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!(idle.claimed, 6, "one batch");
        assert_eq!((idle.succeeded, idle.dead), (1, 5));
        let run = |i: usize| e.run(&ids[i]).unwrap().unwrap();
        assert_eq!(run(0).state, RunState::Succeeded);
        let done = all(&e);
        assert_eq!(done.len(), 1, "the successful run's event, and no other");
        assert_eq!(done[0].id, format!("{}/done", ids[0]));
        for (i, says) in [
            (1, "event type not found"),
            (2, "invalid payload"),
            (3, "no_such_table"),
            (4, "invalid checkpoint"),
        ] {
            assert_eq!(run(i).state, RunState::Dead, "{}", whats[i]);
            let error = run(i).last_error.unwrap();
            assert!(error.contains(says), "{}: {error}", whats[i]);
        }
        let sms = e.run(&long_id).unwrap().unwrap();
        assert_eq!(sms.state, RunState::Dead);
        assert!(sms.last_error.unwrap().contains("invalid id"));
        assert_eq!(e.dead_letters(false, 10).unwrap().len(), 5);
    }

    /// Invariants 3 and 5: what a run emits is appended with its completion,
    /// its id derived from the run's (the firing's), so a retry emits nothing
    /// twice; its causation is the firing event and its depth one more.
    fn events_emitted_by_a_run_are_not_duplicated_across_retries<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = jobs_engine::<B>(&place, &clock);
        e.register_rule(on_job(RetryPolicy::attempts(3).fixed(BACKOFF)))
            .unwrap();
        e.register_action("work", |run, ctx| {
            ctx.emit(
                "done",
                NewEvent::new("done", format!("job/{}", run.id), "worker", ctx.now_ms()),
            )?;
            if run.attempt == 1 {
                return Err("failed after emitting".into());
            }
            Ok(())
        })
        .unwrap();
        let trigger = e.append("app", &job("a", 0)).unwrap();
        e.run_until_idle().unwrap();
        assert!(
            e.read(&Query::new("app").types(["done"]))
                .unwrap()
                .is_empty()
        );
        clock.advance(BACKOFF);
        e.run_until_idle().unwrap();
        let done = e.read(&Query::new("app").types(["done"])).unwrap();
        assert_eq!(done.len(), 1);
        let runs = e.runs(None, 10).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(done[0].id, format!("{}/done", runs[0].id));
        assert_eq!(done[0].causation_id.as_deref(), Some(trigger.id.as_str()));
        assert_eq!(done[0].depth, 1);
    }
}
