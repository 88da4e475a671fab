//! Control of the work: waiting for a run, unique runs enforced by the
//! database, priorities, pauses, cancels, and concurrency limits across
//! processes (DESIGN.md invariants 2, 5 and 6; 10 for bad input). Every
//! test here is written once, generic over the backend, and runs on SQLite
//! and — with the feature `postgres` — on PostgreSQL (`on_backends!`); the child
//! process of the cross-process limit test too.

use reflexr_testkit as common;

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, on_backends};
use reflexr::{
    ActionConfig, Decision, Engine, Enqueue, Error, ManualClock, NewEvent, Pausable, RetryPolicy,
    Rule, RunState, Unique,
};
use serde_json::{Value, json};

on_backends!(
    wait_for_run_returns_when_the_run_ends,
    a_waiter_that_comes_as_its_run_settles_is_woken_by_the_settlement,
    higher_priorities_are_claimed_first_and_a_scope_keeps_its_order,
    four_executors_in_two_processes_never_exceed_a_concurrency_limit,
    a_run_going_back_to_pending_yields_its_key_to_the_run_that_took_it_and_claims_go_on,
    a_cancelled_run_whose_executor_died_ends_cancelled_and_its_scope_moves_on,
    a_partition_that_is_not_a_json_path_is_refused_and_changes_nothing,
    limited_runs_of_a_higher_priority_go_before_a_backlog_of_unlimited_ones,
    a_partition_with_a_long_backlog_does_not_hide_another_partitions_runs,
    a_rule_cannot_take_a_name_that_an_enqueued_actions_lanes_use,
    pruning_sweeps_ended_uniqueness_periods_and_starts_outside_every_window,
    a_claimed_run_cancelled_before_it_started_is_never_started_after_a_shutdown,
    a_rule_paused_while_its_batch_is_decided_commits_nothing_of_it,
    at_one_priority_a_limited_actions_backlog_leaves_the_others_their_share,
);

children_on_backends!(child_process_works_limited_runs);

const PATIENCE: Duration = Duration::from_secs(60);

/// The round, recognisable time a test's clock starts at.
const START_MS: i64 = 1_800_000_000_000;

/// A place, its clock, and an engine on it opened with `opts` (which is
/// given the clock and the holder `test`).
fn setup<B: TestBackend>(opts: impl FnOnce(Opts) -> Opts) -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = B::open_opts(&place, &opts(Opts::new(&clock, "test")));
    (place, clock, e)
}

fn task(n: i64) -> Enqueue {
    Enqueue::new("work", &json!({ "n": n }))
}

/// Registers no-op `actions` that record, in one list, which action each
/// run they handle was of, in the order they ran.
fn handled_in_order<B: TestBackend, const N: usize>(
    e: &Engine<B>,
    actions: [&'static str; N],
) -> Arc<Mutex<Vec<&'static str>>> {
    let order = Arc::new(Mutex::new(Vec::new()));
    for action in actions {
        let o = Arc::clone(&order);
        e.register_action(action, move |_, _| {
            o.lock().unwrap().push(action);
            Ok(())
        })
        .unwrap();
    }
    order
}

/// Records the `n` of each run its handler saw, in order.
fn recording<B: TestBackend>(e: &Engine<B>) -> Arc<Mutex<Vec<i64>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    e.register_action("work", move |run, _| {
        let input: Value = run.input()?;
        s.lock().unwrap().push(input["n"].as_i64().unwrap());
        Ok(())
    })
    .unwrap();
    seen
}

/// Invariant 5 seen by a caller: waiting for a run returns when it ends,
/// with its final state; a run that is not there is a typed error
/// (invariant 10).
fn wait_for_run_returns_when_the_run_ends<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    let (go_tx, go) = mpsc::channel::<()>();
    let go = Mutex::new(go);
    e.register_action("work", move |_, _| {
        go.lock().unwrap().recv().unwrap();
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&task(1)).unwrap().id;
    let waiter = {
        let e = e.clone();
        let id = id.clone();
        std::thread::spawn(move || e.wait_for_run(&id, PATIENCE).unwrap())
    };
    let worker = {
        let e = e.clone();
        std::thread::spawn(move || e.run_until_idle().unwrap())
    };
    go_tx.send(()).unwrap();
    let run = waiter.join().unwrap();
    assert_eq!(run.state, RunState::Succeeded);
    worker.join().unwrap();
    // A run that is not there is a typed error.
    assert!(
        e.wait_for_run("nope", Duration::ZERO)
            .unwrap_err()
            .is_not_found()
    );
}

/// Invariant 5 seen by a caller: a thread waiting for a run is woken when
/// the run's settlement commits, whenever it began to wait — also when it
/// came while the settlement's transaction was open (asked inside it
/// whether anyone waited, a settlement told nobody of a waiter that came
/// in between, and that waiter slept until the heartbeat). The heartbeat
/// here is longer than the wait, so a wait not woken lasts its whole
/// timeout (and then returns the run as it stands, settled by then); each
/// waiter starts as its handler returns, when the settlement is on its
/// way.
fn a_waiter_that_comes_as_its_run_settles_is_woken_by_the_settlement<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o.heartbeat(Duration::from_secs(600)));
    let (done_tx, done) = mpsc::channel::<()>();
    let done_tx = Mutex::new(done_tx);
    e.register_action("work", move |_, _| {
        done_tx.lock().unwrap().send(()).unwrap();
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    for n in 0..40 {
        let id = e.enqueue(&task(n)).unwrap().id;
        done.recv_timeout(PATIENCE).unwrap();
        let wait = Duration::from_secs(10);
        let began = std::time::Instant::now();
        let run = e.wait_for_run(&id, wait).unwrap();
        assert_eq!(run.state, RunState::Succeeded);
        assert!(
            began.elapsed() < wait,
            "run {n}: the wait lasted its whole timeout: the settlement woke nobody"
        );
    }
    e.shutdown();
}

/// Invariant 6 with priorities: within a scope, enqueue order; among the
/// runs a claim can take, higher priority first; an action's default
/// priority is stored with its runs.
fn higher_priorities_are_claimed_first_and_a_scope_keeps_its_order<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    let seen = recording(&e);
    e.configure_action(&ActionConfig::new("work").priority(1))
        .unwrap();
    e.enqueue(&task(1).priority(0)).unwrap();
    e.enqueue(&task(2)).unwrap(); // the action's default: 1
    e.enqueue(&task(3).priority(9)).unwrap();
    e.enqueue(&task(4).priority(5).scope("s")).unwrap();
    e.enqueue(&task(5).priority(9).scope("s")).unwrap(); // waits behind 4
    e.enqueue(&task(6).priority(-3)).unwrap();
    e.run_until_idle().unwrap();
    let order = seen.lock().unwrap().clone();
    let without_5: Vec<i64> = order.iter().copied().filter(|n| *n != 5).collect();
    assert_eq!(without_5, [3, 4, 2, 1, 6], "by priority: 9, 5, 1, 0, -3");
    let at = |n| order.iter().position(|x| *x == n).unwrap();
    assert!(
        at(4) < at(5),
        "a scope keeps its order whatever the priorities"
    );
    let priorities: Vec<i64> = {
        let mut runs = e.runs(None, 10).unwrap();
        runs.sort_by_key(|r| r.created_at);
        runs.iter().map(|r| r.priority).collect()
    };
    assert!(
        priorities.contains(&1),
        "the action's default was stored: {priorities:?}"
    );
}

/// The child's side of the cross-process limit test: two executors on the
/// parent's database, on the system clock, the limited action's handler
/// taking a few milliseconds.
fn child_process_works_limited_runs<B: TestBackend>() {
    let e = parent_engine::<B>(&Opts::system("child").executors(2));
    e.register_action("limited", |_, _| {
        std::thread::sleep(Duration::from_millis(3));
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    println!("\nstarted");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    e.shutdown();
}

/// Control of the work across processes (invariant 5 under a limit): four
/// executors in two processes never hold more claims of a limited action at
/// once than its `max_running`. Checked from the database: by their claim
/// (started_at) and end (finished_at) times, at no moment do more than 2
/// runs of the action hold a claim. Both processes run on the system clock,
/// the one timeline on which those times of two processes compare.
fn four_executors_in_two_processes_never_exceed_a_concurrency_limit<B: TestBackend>() {
    let place = B::place();
    {
        let e = B::open_opts(&place, &Opts::system("setup").executors(1));
        e.configure_action(&ActionConfig::new("limited").max_running(2))
            .unwrap();
        for n in 0..40 {
            e.enqueue(&Enqueue::new("limited", &json!({ "n": n })))
                .unwrap();
        }
    }
    let mut child = child::<B>(&place, "child_process_works_limited_runs", &[]);
    assert!(child.past("started"));
    let e = B::open_opts(&place, &Opts::system("parent").executors(2));
    e.register_action("limited", |_, _| {
        std::thread::sleep(Duration::from_millis(3));
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    let watch = e.watch();
    loop {
        let left = B::count(
            &e,
            "SELECT count(*) FROM reflexr_runs WHERE state != 'succeeded'",
        );
        if left == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{left} runs left");
        watch.wait(Duration::from_millis(200));
    }
    e.shutdown();
    child.send("done\n");
    assert!(child.finish().success);
    let runs = e.runs(None, 100).unwrap();
    assert_eq!(runs.iter().filter(|r| r.started_at.is_some()).count(), 40);
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for r in &runs {
        edges.push((r.started_at.unwrap(), 1));
        edges.push((r.finished_at.unwrap(), -1));
    }
    // Ends before starts at the same millisecond: a slot freed and taken.
    edges.sort_by_key(|(t, d)| (*t, *d));
    let (mut now, mut most) = (0, 0);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    assert!(most <= 2, "{most} ran at once");
    assert!(most >= 1);
}

/// Forges what an executor that died mid-run leaves: `id` running under a
/// holder that will never renew its claim, which lapses in one second.
fn held_by_a_dead_executor<B: TestBackend>(e: &Engine<B>, id: &str) {
    e.write(|tx| {
        let now = tx.now_ms();
        // Test data: a run id and times, formatted in.
        B::run_sql(
            tx,
            &format!(
                "UPDATE reflexr_runs SET state = 'running', attempt = 1, claimed_by = 'gone', \
                   claim_expires_at = {}, started_at = {now} WHERE id = '{id}'",
                now + 1_000
            ),
        )
    })
    .unwrap();
}

/// Invariants 5 and 6 with uniqueness: a `WhilePending` key is free once
/// its run starts; if that run fails and is retried (or revived) while a
/// newer run holds the key, it keeps its retry without the key — the
/// unique index is never broken, and no claim is refused because of it.
fn a_run_going_back_to_pending_yields_its_key_to_the_run_that_took_it_and_claims_go_on<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (seen2, e2) = (Arc::clone(&seen), e.clone());
    e.register_action("work", move |run, _| {
        let n = run.input::<Value>()?["n"].as_i64().unwrap();
        seen2.lock().unwrap().push(n);
        if n == 1 && run.attempt == 1 {
            // While it runs the key is free: a newer run takes it, waiting
            // behind it in the scope. Then this attempt fails.
            let b = e2.enqueue(&task(2).scope("s").unique("k", Unique::WhilePending))?;
            assert!(!b.deduplicated);
            return Err("the first attempt fails".into());
        }
        Ok(())
    })
    .unwrap();
    let retried = RetryPolicy::attempts(3).fixed(Duration::ZERO);
    let a = e
        .enqueue(
            &task(1)
                .scope("s")
                .unique("k", Unique::WhilePending)
                .retry(retried),
        )
        .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [1, 1, 2],
        "retried, then the next of the scope"
    );
    assert_eq!(idle.succeeded, 2);
    let key_of = |id: &str| -> Option<String> { e.run(id).unwrap().unwrap().unique_key };
    assert_eq!(key_of(&a.id), None, "the retried run gave the key up");

    // An operator's retry of a dead run whose key another run holds now.
    e.register_action("dies", |_, _| Err("always".into()))
        .unwrap();
    let dies = |n: i64| {
        Enqueue::new("dies", &json!({ "n": n }))
            .unique("d", Unique::WhileActive)
            .retry(RetryPolicy::attempts(1))
    };
    let dead = e.enqueue(&dies(1)).unwrap().id;
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&dead).unwrap().unwrap().state, RunState::Dead);
    let holder = e.enqueue(&dies(2).after(Duration::from_secs(600))).unwrap();
    assert!(!holder.deduplicated, "a dead run holds no key");
    e.operator("ops", "the service is back")
        .unwrap()
        .retry_run(&dead)
        .unwrap();
    assert_eq!(e.run(&dead).unwrap().unwrap().state, RunState::Ready);
    assert_eq!(key_of(&dead), None);
    assert_eq!(key_of(&holder.id).as_deref(), Some("d"));
}

/// Invariant 6: a run that ended, however, lets the next of its scope
/// start — here one cancelled while its executor was gone.
fn a_cancelled_run_whose_executor_died_ends_cancelled_and_its_scope_moves_on<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>(|o| o);
    let seen = recording(&e);
    let first = e.enqueue(&task(1).scope("s")).unwrap().id;
    e.enqueue(&task(2).scope("s")).unwrap();
    held_by_a_dead_executor(&e, &first);
    let ops = e.operator("ops", "stuck").unwrap();
    assert_eq!(ops.cancel_run(&first).unwrap(), RunState::Running);
    clock.advance(Duration::from_secs(2)); // the dead executor's claim lapses
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&first).unwrap().unwrap().state, RunState::Cancelled);
    assert_eq!(
        *seen.lock().unwrap(),
        [2],
        "the next of the scope ran; the cancelled one never"
    );
}

/// Invariant 10: a partition path the database would refuse at every claim
/// is refused when it is configured, and nothing is stored.
fn a_partition_that_is_not_a_json_path_is_refused_and_changes_nothing<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    for bad in ["$customer", "$.a[", "cust\"omer"] {
        let err = e
            .configure_action(&ActionConfig::new("work").max_running(1).partition_by(bad))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Invalid {
                    field: "partition_by",
                    ..
                }
            ),
            "{bad}: {err}"
        );
    }
    assert_eq!(B::count(&e, "SELECT count(*) FROM reflexr_actions"), 0);
    // A key with dots or spaces is a key, as it is.
    e.configure_action(
        &ActionConfig::new("work")
            .max_running(1)
            .partition_by("a.b c"),
    )
    .unwrap();
}

/// Invariant 5 under priorities: a backlog of unlimited work does not keep
/// a limited action's urgent runs waiting; priorities hold across actions
/// with and without limits.
fn limited_runs_of_a_higher_priority_go_before_a_backlog_of_unlimited_ones<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o.claim_batch(4));
    let order = handled_in_order(&e, ["bulk", "urgent"]);
    e.configure_action(&ActionConfig::new("urgent").max_running(10))
        .unwrap();
    for _ in 0..40 {
        e.enqueue(&Enqueue::new("bulk", &json!({}))).unwrap();
    }
    for _ in 0..2 {
        e.enqueue(&Enqueue::new("urgent", &json!({})).priority(10))
            .unwrap();
    }
    e.run_until_idle().unwrap();
    let order = order.lock().unwrap();
    assert_eq!(order.len(), 42);
    assert_eq!(order[..2], ["urgent", "urgent"], "{order:?}");
}

/// Invariant 5 under a limit per partition: the claim looks past a full
/// partition's backlog for the runs of partitions that have room.
fn a_partition_with_a_long_backlog_does_not_hide_another_partitions_runs<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    let seen = recording(&e);
    e.configure_action(
        &ActionConfig::new("work")
            .max_running(1)
            .partition_by("customer"),
    )
    .unwrap();
    let mut a = Vec::new();
    for n in 0..200 {
        a.push(
            e.enqueue(&Enqueue::new("work", &json!({ "n": n, "customer": "a" })))
                .unwrap()
                .id,
        );
    }
    e.enqueue(&Enqueue::new(
        "work",
        &json!({ "n": 1000, "customer": "b" }),
    ))
    .unwrap();
    // Customer a's one slot is taken by an executor elsewhere.
    held_by_a_dead_executor(&e, &a[0]);
    e.run_until_idle().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [1000],
        "b ran; a's backlog waits for its slot"
    );
}

/// Invariant 6: a rule's scope lanes and an enqueued action's never mix —
/// a rule cannot take the name an enqueued action's lanes use.
fn a_rule_cannot_take_a_name_that_an_enqueued_actions_lanes_use<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    e.ensure_workspace("app", &["order"]).unwrap();
    let err = e
        .register_rule(
            Rule::new("task:work", "app")
                .on(["order"])
                .decide(|_| Ok(Decision::Skip)),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Invalid { field: "rule", .. }), "{err}");
}

/// Invariant 9's housekeeping for the control tables: pruning deletes a
/// uniqueness period or a rate start only once it no longer holds.
fn pruning_sweeps_ended_uniqueness_periods_and_starts_outside_every_window<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>(|o| o);
    recording(&e);
    e.configure_action(&ActionConfig::new("work").rate(5, Duration::from_secs(1)))
        .unwrap();
    e.enqueue(&task(1).unique("p", Unique::For(Duration::from_secs(10))))
        .unwrap();
    e.run_until_idle().unwrap();
    let rows = |table: &str| B::count(&e, &format!("SELECT count(*) FROM {table}"));
    assert_eq!(
        (rows("reflexr_unique_periods"), rows("reflexr_starts")),
        (1, 1)
    );
    B::prune(&e, &reflexr::Retention::default()).unwrap();
    assert_eq!(
        (rows("reflexr_unique_periods"), rows("reflexr_starts")),
        (1, 1),
        "both still hold"
    );
    clock.advance(Duration::from_secs(11));
    B::prune(&e, &reflexr::Retention::default()).unwrap();
    assert_eq!(
        (rows("reflexr_unique_periods"), rows("reflexr_starts")),
        (0, 0)
    );
}

/// Invariant 5 with cancels: a run an executor claimed but had not started
/// when it stopped is given back — unless its cancellation was asked for
/// meanwhile: then it ends cancelled and never starts.
fn a_claimed_run_cancelled_before_it_started_is_never_started_after_a_shutdown<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o.executors(1).claim_batch(2));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let (started_tx, started) = mpsc::channel();
    let started_tx = Mutex::new(started_tx);
    let r = Arc::clone(&ran);
    e.register_action("work", move |run, ctx| {
        let n = run.input::<Value>()?["n"].as_i64().unwrap();
        r.lock().unwrap().push(n);
        if n == 1 {
            started_tx.lock().unwrap().send(()).unwrap();
            // Works until the engine stops (a condition, not a duration).
            while !ctx.is_shutting_down() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    })
    .unwrap();
    e.enqueue(&task(1)).unwrap();
    let second = e.enqueue(&task(2)).unwrap().id;
    e.start().unwrap();
    started.recv_timeout(PATIENCE).unwrap();
    // One claim took both: the second is claimed, not started.
    assert_eq!(e.run(&second).unwrap().unwrap().state, RunState::Running);
    let ops = e.operator("ops", "not needed").unwrap();
    assert_eq!(ops.cancel_run(&second).unwrap(), RunState::Running);
    e.shutdown();
    assert_eq!(e.run(&second).unwrap().unwrap().state, RunState::Cancelled);
    e.run_until_idle().unwrap();
    assert_eq!(*ran.lock().unwrap(), [1], "the cancelled run never started");
}

/// Invariants 4 and 8: once a pause commits, the rule's cursor stays — a
/// batch decided before it is not written after it (the commit checks),
/// and is decided again after the resume: nothing lost, nothing twice.
fn a_rule_paused_while_its_batch_is_decided_commits_nothing_of_it<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    e.ensure_workspace("app", &["job"]).unwrap();
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (f, e2) = (Arc::clone(&first), e.clone());
    e.register_rule(
        Rule::new("fire", "app")
            .on(["job"])
            .action("work")
            .decide(move |_| {
                if f.swap(false, AtomicOrdering::SeqCst) {
                    // An operator pauses the rule while it decides.
                    e2.operator("ops", "maintenance")
                        .unwrap()
                        .pause(&Pausable::Rule("fire".into()))
                        .unwrap();
                }
                Ok(Decision::Fire(json!({})))
            }),
    )
    .unwrap();
    for n in 0..3 {
        e.append("app", &NewEvent::new("job", format!("j/{n}"), "app", 0))
            .unwrap();
    }
    let idle = e.run_until_idle().unwrap();
    assert_eq!(
        idle.fired, 0,
        "the batch decided under the pause is not written"
    );
    let cursor = |e: &Engine<B>| {
        B::count(
            e,
            "SELECT coalesce(max(position), 0) FROM reflexr_cursors WHERE kind = 'rule' AND name = 'fire'",
        )
    };
    assert_eq!(cursor(&e), 0, "its cursor stays");
    e.operator("ops", "done")
        .unwrap()
        .resume(&Pausable::Rule("fire".into()))
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(
        cursor(&e),
        B::count(
            &e,
            "SELECT max(seq) FROM reflexr_events WHERE workspace = 'app'"
        ),
        "past the jobs and its own RuleFired envelopes"
    );
    assert_eq!(
        B::count(
            &e,
            "SELECT count(*) FROM reflexr_events WHERE type = 'RuleFired'"
        ),
        3,
        "each event decided once"
    );
}

/// Invariant 5 under limits: a limited action with a long backlog and an
/// unlimited one at the same priority — each claim gives both a share, so
/// neither waits for the other's backlog to drain.
fn at_one_priority_a_limited_actions_backlog_leaves_the_others_their_share<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o.claim_batch(4));
    let order = handled_in_order(&e, ["limited", "free"]);
    e.configure_action(&ActionConfig::new("limited").max_running(1_000))
        .unwrap();
    for _ in 0..40 {
        e.enqueue(&Enqueue::new("limited", &json!({}))).unwrap();
    }
    for _ in 0..2 {
        e.enqueue(&Enqueue::new("free", &json!({}))).unwrap();
    }
    e.run_until_idle().unwrap();
    let order = order.lock().unwrap();
    assert_eq!(order.len(), 42);
    let first: Vec<&str> = order[..4].to_vec();
    assert_eq!(
        first.iter().filter(|a| **a == "free").count(),
        2,
        "the first claim shared: {first:?}"
    );
}

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use reflexr::{
        ActionConfig, Decision, Engine, Enqueue, Error, Pausable, Rule, RunState, Unique,
    };
    use reflexr_testkit as common;
    use serde_json::json;
    use std::sync::Arc;
    use std::time::Duration;

    on_backends!(
        a_scope_runs_in_order_and_higher_priorities_go_first,
        a_unique_key_gives_the_holders_id_while_it_is_pending,
        a_rate_limit_holds_in_every_window_of_its_period,
        a_concurrency_limit_partitioned_by_an_input_field_counts_each_value,
        pausing_an_action_rule_or_reaction_stops_it_where_it_stands_until_resumed,
        the_executors_of_four_engines_never_exceed_a_concurrency_limit,
        a_unique_key_holds_while_pending_while_active_or_for_a_period,
        a_pending_run_cancelled_never_starts_and_a_running_one_is_refused_its_completion,
    );

    /// Invariant 6: the runs of one scope run one at a time in the order they
    /// were made; between scopes, a higher priority is claimed first.
    fn a_scope_runs_in_order_and_higher_priorities_go_first<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        let seen = recording(&engine);
        for n in 1..=4 {
            engine.enqueue(&task(n).scope("cart-7")).unwrap();
        }
        engine.enqueue(&task(100).priority(10)).unwrap();
        engine.enqueue(&task(50).priority(5)).unwrap();
        let idle = engine.run_until_idle().unwrap();
        assert_eq!(idle.succeeded, 6);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(&seen[..2], [100, 50], "priorities first");
        let scoped: Vec<i64> = seen.iter().copied().filter(|n| *n < 50).collect();
        assert_eq!(scoped, [1, 2, 3, 4], "a scope in its order");
    }

    /// A uniqueness key held while its run is pending: a second enqueue gets
    /// the holder's id, marked deduplicated; once the run started, the key is
    /// free again.
    fn a_unique_key_gives_the_holders_id_while_it_is_pending<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        let seen = recording(&engine);
        let keyed = |n| task(n).unique("rebuild/3", Unique::WhilePending);
        let first = engine.enqueue(&keyed(1)).unwrap();
        let again = engine.enqueue(&keyed(2)).unwrap();
        assert!(again.deduplicated);
        assert_eq!(again.id, first.id);
        engine.run_until_idle().unwrap();
        let later = engine.enqueue(&keyed(3)).unwrap();
        assert!(!later.deduplicated);
        engine.run_until_idle().unwrap();
        assert_eq!(*seen.lock().unwrap(), [1, 3]);
    }

    /// Control of the work: at most 3 starts in any 1,000 ms, over a long run
    /// on a manual clock, counted in the database.
    fn a_rate_limit_holds_in_every_window_of_its_period<B: TestBackend>() {
        let (_place, clock, engine) = setup::<B>();
        let seen = recording(&engine);
        engine
            .configure_action(&ActionConfig::new("work").rate(3, Duration::from_millis(1_000)))
            .unwrap();
        assert_eq!(engine.action_configs().unwrap().len(), 1);
        for n in 0..20 {
            engine.enqueue(&task(n)).unwrap();
        }
        for _ in 0..40 {
            engine.run_until_idle().unwrap();
            clock.advance(Duration::from_millis(250));
        }
        assert_eq!(seen.lock().unwrap().len(), 20, "all ran, in time");
        let mut starts: Vec<i64> = engine
            .runs(None, 100)
            .unwrap()
            .iter()
            .map(|r| r.started_at.unwrap())
            .collect();
        starts.sort_unstable();
        for (i, t) in starts.iter().enumerate() {
            let in_window = starts[i..].iter().take_while(|u| **u < t + 1_000).count();
            assert!(
                in_window <= 3,
                "{in_window} starts in the 1,000 ms from {t}"
            );
        }
    }

    /// Control of the work: a concurrency limit partitioned by an input field
    /// lets one run per value start in a claim.
    fn a_concurrency_limit_partitioned_by_an_input_field_counts_each_value<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        let seen = recording(&engine);
        engine
            .configure_action(
                &ActionConfig::new("work")
                    .max_running(1)
                    .partition_by("customer"),
            )
            .unwrap();
        for (n, customer) in [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")] {
            engine
                .enqueue(&Enqueue::new(
                    "work",
                    &json!({ "n": n, "customer": customer }),
                ))
                .unwrap();
        }
        let idle = engine.run_until_idle().unwrap();
        assert_eq!(idle.succeeded, 5);
        let first_batch: Vec<i64> = seen.lock().unwrap().iter().take(3).copied().collect();
        assert_eq!(first_batch, [1, 3, 5], "a, b, c: one each, then the rest");
    }

    /// Control of the work: a paused action, rule or reaction stops where it
    /// stands (a run is not claimed, an event not decided or handled, its cursor
    /// stays) until resumed, in every engine on the database; each pause and
    /// resume is on the record.
    fn pausing_an_action_rule_or_reaction_stops_it_where_it_stands_until_resumed<B: TestBackend>() {
        let (_place, _clock, e) = setup::<B>();
        let seen = recording(&e);
        let reacted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = Arc::clone(&reacted);
        e.register_reaction(B::reaction("counter", "app").on(["thing.made"]).handle(
            move |_, _| {
                r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            },
        ))
        .unwrap();
        e.register_rule(
            Rule::new("fire", "app")
                .on(["thing.made"])
                .action("work")
                .decide(|_| Ok(Decision::fire(&json!({ "n": 2 })))),
        )
        .unwrap();
        let ops = e.operator("ops", "maintenance").unwrap();
        assert!(ops.pause(&Pausable::Action("work".into())).unwrap());
        assert!(
            !ops.pause(&Pausable::Action("work".into())).unwrap(),
            "paused already"
        );
        ops.pause(&Pausable::Rule("fire".into())).unwrap();
        ops.pause(&Pausable::Reaction("counter".into())).unwrap();
        e.enqueue(&task(1)).unwrap();
        e.append("app", &made("t-1")).unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!((idle.claimed, idle.decided, idle.reacted), (0, 0, 0));
        assert_eq!(e.paused().unwrap().len(), 3);
        ops.resume(&Pausable::Rule("fire".into())).unwrap();
        ops.resume(&Pausable::Reaction("counter".into())).unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!((idle.decided, idle.claimed), (1, 0), "work still paused");
        assert_eq!(reacted.load(std::sync::atomic::Ordering::SeqCst), 1);
        ops.resume(&Pausable::Action("work".into())).unwrap();
        assert_eq!(e.run_until_idle().unwrap().succeeded, 2);
        let mut ns = seen.lock().unwrap().clone();
        ns.sort_unstable();
        assert_eq!(ns, [1, 2]);
        let e2 = ops.resume(&Pausable::Rule("fire".into())).unwrap_err();
        assert!(e2.is_not_found(), "{e2}");
        let actions: Vec<String> = e
            .audit_log(20)
            .unwrap()
            .iter()
            .map(|a| a.action.to_string())
            .collect();
        assert_eq!(actions.iter().filter(|a| *a == "pause").count(), 3);
        assert_eq!(actions.iter().filter(|a| *a == "resume").count(), 3);
    }

    /// Control of the work across engines: the executor threads of four
    /// engines (each claiming in transactions of its own) never run more of a
    /// limited action at once than its `max_running`, counted in the database.
    fn the_executors_of_four_engines_never_exceed_a_concurrency_limit<B: TestBackend>() {
        let (place, clock, first) = setup::<B>();
        first
            .configure_action(&ActionConfig::new("work").max_running(2))
            .unwrap();
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let engines: Vec<Engine<B>> = (0..4)
            .map(|i| B::open(&place, &clock, &format!("executor-{i}")))
            .collect();
        for e in &engines {
            let (r, m) = (Arc::clone(&running), Arc::clone(&most));
            e.register_action("work", move |_, _| {
                let now = r.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                m.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(500));
                r.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
            e.start().unwrap();
        }
        let ids: Vec<String> = first
            .write(|tx| (0..200).map(|n| Ok(tx.enqueue(&task(n))?.id)).collect())
            .unwrap();
        for id in &ids {
            let run = first.wait_for_run(id, Duration::from_secs(120)).unwrap();
            assert_eq!(run.state, RunState::Succeeded, "{id}");
        }
        for e in &engines {
            e.shutdown();
        }
        let most = most.load(std::sync::atomic::Ordering::SeqCst);
        assert!((1..=2).contains(&most), "{most} ran at once");
    }

    /// Control of the work: the database refuses a second run with a held key
    /// (the enqueue gets the holder's id, marked deduplicated) while the first
    /// is pending, while it is active, or for a period after it was made.
    fn a_unique_key_holds_while_pending_while_active_or_for_a_period<B: TestBackend>() {
        let (place, clock, e) = setup::<B>();
        let seen = recording(&e);
        let a = e
            .enqueue(&task(1).unique("k", Unique::WhilePending))
            .unwrap();
        let b = e
            .enqueue(&task(2).unique("k", Unique::WhilePending))
            .unwrap();
        assert!(b.deduplicated && b.id == a.id);
        e.run_until_idle().unwrap();
        let c = e
            .enqueue(&task(3).unique("k", Unique::WhilePending))
            .unwrap();
        assert!(!c.deduplicated, "the first ended: the key is free");
        // The unique index itself: a second pending run with the key is
        // refused by the database, whoever writes it.
        let forged = e.write(|tx| {
            B::run_sql(
                tx,
                &format!(
                    "UPDATE reflexr_runs SET unique_key = 'k', unique_mode = 'pending' \
                     WHERE id = '{}'",
                    a.id
                ),
            )?;
            B::run_sql(
                tx,
                &format!(
                    "UPDATE reflexr_runs SET state = 'ready' WHERE id = '{}'",
                    a.id
                ),
            )
        });
        assert!(forged.is_err(), "the partial unique index holds");
        e.run_until_idle().unwrap();

        let d = e
            .enqueue(&task(4).unique("j", Unique::WhileActive))
            .unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let go = std::sync::Mutex::new(go);
        let worker_engine = B::open(&place, &clock, "worker");
        worker_engine
            .register_action("work", move |_, _| {
                started_tx.send(()).unwrap();
                go.lock().unwrap().recv().unwrap();
                Ok(())
            })
            .unwrap();
        let worker = std::thread::spawn(move || worker_engine.run_until_idle().unwrap());
        started.recv().unwrap();
        let f = e
            .enqueue(&task(5).unique("j", Unique::WhileActive))
            .unwrap();
        assert!(
            f.deduplicated && f.id == d.id,
            "still running: the key holds"
        );
        go_tx.send(()).unwrap();
        worker.join().unwrap();
        let again = e
            .enqueue(&task(6).unique("j", Unique::WhileActive))
            .unwrap();
        assert!(!again.deduplicated);
        e.run_until_idle().unwrap();

        let period = || Unique::For(Duration::from_secs(60));
        let g = e.enqueue(&task(7).unique("p", period())).unwrap();
        e.run_until_idle().unwrap();
        let h = e.enqueue(&task(8).unique("p", period())).unwrap();
        assert!(
            h.deduplicated && h.id == g.id,
            "within the period, though it ended"
        );
        clock.advance(Duration::from_secs(61));
        assert!(
            !e.enqueue(&task(9).unique("p", period()))
                .unwrap()
                .deduplicated
        );
        e.run_until_idle().unwrap();
        let mut ns = seen.lock().unwrap().clone();
        ns.sort_unstable();
        // 4 ran in the other worker; no deduplicated one (2, 5, 8) ran at all.
        assert_eq!(ns, [1, 3, 6, 7, 9]);
        assert_eq!(e.run(&d.id).unwrap().unwrap().state, RunState::Succeeded);
        assert_eq!(
            e.runs(None, 20).unwrap().len(),
            6,
            "one run per enqueue kept"
        );
    }

    /// Invariants 5 and 7: a cancelled pending run never starts; a running
    /// one's handler sees the cancel at once in this process and its
    /// completion is refused: it ends cancelled; an ended run cannot be
    /// cancelled; each cancel is on the record.
    fn a_pending_run_cancelled_never_starts_and_a_running_one_is_refused_its_completion<
        B: TestBackend,
    >() {
        let (_place, clock, e) = setup::<B>();
        let pending = e
            .enqueue(&task(1).after(Duration::from_secs(60)))
            .unwrap()
            .id;
        let ops = e.operator("ops", "not needed").unwrap();
        assert_eq!(ops.cancel_run(&pending).unwrap(), RunState::Ready);
        let run = e.run(&pending).unwrap().unwrap();
        assert_eq!(
            (run.state, run.cancelled_by.as_deref()),
            (RunState::Cancelled, Some("ops"))
        );

        let running = e.enqueue(&task(2)).unwrap().id;
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let go = std::sync::Mutex::new(go);
        let saw_cancel = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let saw = Arc::clone(&saw_cancel);
        e.register_action("work", move |_, ctx| {
            started_tx.send(()).unwrap();
            go.lock().unwrap().recv().unwrap();
            if ctx.is_cancelled() {
                saw.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(()) // says it succeeded: refused
        })
        .unwrap();
        clock.advance(Duration::from_secs(61)); // the cancelled one would be due
        let worker = {
            let e = e.clone();
            std::thread::spawn(move || e.run_until_idle().unwrap())
        };
        started.recv().unwrap();
        assert_eq!(ops.cancel_run(&running).unwrap(), RunState::Running);
        go_tx.send(()).unwrap();
        let idle = worker.join().unwrap();
        assert_eq!(
            (idle.claimed, idle.succeeded),
            (1, 0),
            "only the running one was claimed"
        );
        assert_eq!(
            saw_cancel.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "seen at once"
        );
        let run = e.run(&running).unwrap().unwrap();
        assert_eq!(run.state, RunState::Cancelled);
        assert!(run.cancel_requested_at.is_some());
        let err = ops.cancel_run(&running).unwrap_err();
        assert!(matches!(err, Error::Conflict { .. }), "{err}");
        assert!(ops.cancel_run("nope").unwrap_err().is_not_found());
        let cancels = e
            .audit_log(10)
            .unwrap()
            .iter()
            .filter(|a| a.action.to_string() == "cancel")
            .count();
        assert_eq!(cancels, 2);
    }
}
