//! The engine's threads: start, shutdown, and what shutdown does with work in
//! hand (DESIGN.md, "Threads"). Each test runs on every backend
//! (`on_backends!`).

use reflexr_testkit as common;

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use common::backend::{Opts, TestBackend};
use common::on_backends;
use reflexr::{Decision, Engine, ManualClock, NewEvent, RetryPolicy, Rule, RunOrder, RunState};

on_backends!(
    shutdown_finishes_the_handler_in_hand_and_gives_back_runs_not_started,
    dropping_the_last_handle_stops_and_joins_the_threads,
    starting_twice_or_registering_a_rule_after_start_is_refused,
);

/// An engine on the place, opened with `opts`, with the workspace `app`.
fn open<B: TestBackend>(place: &B::Place, opts: Opts) -> Engine<B> {
    let e = B::open_opts(place, &opts);
    e.ensure_workspace("app", &["job"]).unwrap();
    e
}

fn opts(holder: &str) -> Opts {
    Opts::new(&ManualClock::new(1_800_000_000_000), holder)
}

/// A rule firing a `work` run for each `job` event, in no order.
fn on_job() -> Rule {
    Rule::new("jobs", "app")
        .on(["job"])
        .ordering(RunOrder::None)
        .action("work")
        .retry(RetryPolicy::attempts(3))
        .decide(|_| Ok(Decision::Fire(serde_json::Value::Null)))
}

fn jobs<B: TestBackend>(e: &Engine<B>, n: usize) {
    e.write(|tx| {
        for i in 0..n {
            tx.append("app", &NewEvent::new("job", format!("job/{i}"), "app", 0))?;
        }
        Ok(())
    })
    .unwrap();
}

/// Invariant 5 at a shutdown: the handler in hand finishes; runs claimed
/// but not started go back unspent; the leases are released.
fn shutdown_finishes_the_handler_in_hand_and_gives_back_runs_not_started<B: TestBackend>() {
    let place = B::place();
    let e = open::<B>(&place, opts("test").executors(1).claim_batch(4));
    e.register_rule(on_job()).unwrap();
    let (started_tx, started) = mpsc::channel();
    let started_tx = Mutex::new(started_tx);
    let first = AtomicBool::new(true);
    e.register_action("work", move |_, ctx| {
        if first.swap(false, AtomicOrdering::SeqCst) {
            started_tx.lock().unwrap().send(()).unwrap();
            // A long handler that stops when the engine does.
            while !ctx.is_shutting_down() {
                std::thread::yield_now();
            }
        }
        Ok(())
    })
    .unwrap();
    jobs(&e, 4);
    e.start().unwrap();
    started.recv_timeout(Duration::from_secs(60)).unwrap();
    e.shutdown();

    let runs = e.runs(None, 10).unwrap();
    let succeeded: Vec<_> = runs
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .collect();
    let ready: Vec<_> = runs.iter().filter(|r| r.state == RunState::Ready).collect();
    assert_eq!(succeeded.len(), 1, "the run in hand finished: {runs:?}");
    assert_eq!(ready.len(), 3, "the others went back: {runs:?}");
    assert!(
        ready.iter().all(|r| r.attempt == 0),
        "unstarted runs cost no attempt"
    );
    // The evaluator lease was released: another process takes over at once.
    let lease = &e.leases().unwrap()[0];
    assert_eq!(
        (lease.name.as_str(), lease.expires_at),
        ("evaluator/app", 0)
    );
    // The engine is still usable, and can be started again.
    let idle = e.run_until_idle().unwrap();
    assert_eq!(idle.succeeded, 3);
}

/// "Threads": the last handle dropped stops and joins the threads and
/// releases the leases.
fn dropping_the_last_handle_stops_and_joins_the_threads<B: TestBackend>() {
    let place = B::place();
    {
        // The builder's defaults: two executors, claims of 16.
        let e = open::<B>(&place, opts("test"));
        e.register_rule(on_job()).unwrap();
        let (ran_tx, ran) = mpsc::channel();
        let ran_tx = Mutex::new(ran_tx);
        e.register_action("work", move |_, _| {
            ran_tx.lock().unwrap().send(()).unwrap();
            Ok(())
        })
        .unwrap();
        e.start().unwrap();
        let clone = e.clone();
        drop(e);
        // A clone keeps the engine running: its threads decide and run.
        jobs(&clone, 1);
        ran.recv_timeout(std::time::Duration::from_secs(60))
            .unwrap();
    }
    // All handles are gone: the threads were joined and the lease released.
    let e = B::open_opts(&place, &opts("after"));
    let lease = &e.leases().unwrap()[0];
    assert_eq!(lease.expires_at, 0);
}

/// Invariant 10 for the threads: starting twice or registering a rule after
/// start is a typed error; shutting down twice is fine.
fn starting_twice_or_registering_a_rule_after_start_is_refused<B: TestBackend>() {
    let place = B::place();
    let e = open::<B>(&place, opts("test").executors(1));
    e.register_rule(on_job()).unwrap();
    e.start().unwrap();
    assert!(e.start().unwrap_err().is_bad_input());
    let late = Rule::new("late", "app")
        .on(["job"])
        .action("work")
        .decide(|_| Ok(Decision::Skip));
    assert!(e.register_rule(late).unwrap_err().is_bad_input());
    e.shutdown();
    e.shutdown(); // twice is fine
}
