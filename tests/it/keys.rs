//! Flow control by key: fair claims across keys, per-key limits and
//! weights, debounced enqueues and batch actions (DESIGN.md invariants 5
//! and 6 under keys; 10 for bad input). Written once for every backend
//! (`on_backends!`), the child processes of the cross-process tests too.
//!
//! The fairness bound these tests hold the claim to: a fair action's keys
//! are served by start-time fair queuing, so while two keys both have runs
//! ready, the runs each was given, over its weight, never differ by more
//! than one. A key B with `n` runs behind a key A with a backlog therefore
//! has all of them started within the first `n + n × w_A / w_B + 1` runs
//! the action starts (201 for 100 runs at equal weights), however long A's
//! backlog — and the passes live in the file, so the order holds across
//! claims and processes.

use reflexr_testkit as common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, on_backends};
use reflexr::{
    ActionConfig, Debounce, Engine, Enqueue, Error, KeyLimits, ManualClock, RetryPolicy, RunState,
};
use serde_json::{Value, json};

on_backends!(
    a_key_behind_a_backlog_of_ten_thousand_starts_all_its_runs_within_twice_its_count,
    weights_share_the_claims_within_one_run_of_their_ratio,
    a_key_that_had_nothing_ready_comes_back_level_not_ahead,
    an_action_made_fair_after_its_runs_were_enqueued_keys_them_and_serves_them_in_turn,
    a_key_behind_a_backlog_starts_within_the_bound_across_two_processes,
    a_key_override_holds_across_processes_and_the_other_keys_keep_the_default,
    a_key_rate_override_counts_in_its_own_window,
    key_limits_of_bad_input_are_typed_errors_that_change_nothing_and_changes_are_audited,
    many_enqueues_in_a_debounce_window_make_one_run_with_the_last_input,
    a_debounced_enqueue_at_the_windows_edge_is_never_lost,
    a_debounce_is_due_at_most_its_maximum_wait_after_the_first_enqueue,
    a_registered_merge_folds_every_debounced_input_into_the_run,
    a_batch_whose_third_run_fails_settles_the_others_once_and_retries_the_third,
    a_batch_handler_that_panics_or_miscounts_fails_every_run_of_its_call,
    a_run_that_ended_before_its_action_was_made_fair_is_claimed_when_an_operator_retries_it,
    a_debounced_run_waiting_for_its_retry_takes_no_more_input_and_gives_its_key_up,
);

children_on_backends!(
    child_process_works_fair_runs,
    child_process_works_keyed_runs
);

const PATIENCE: Duration = Duration::from_secs(120);

/// The round, recognisable time a test's clock starts at.
const START_MS: i64 = 1_800_000_000_000;

fn setup<B: TestBackend>(opts: impl FnOnce(Opts) -> Opts) -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = B::open_opts(&place, &opts(Opts::new(&clock, "test")));
    (place, clock, e)
}

/// Enqueues `n` runs of `action` for `tenant` (its input's `tenant` field),
/// in one transaction.
fn backlog<B: TestBackend>(e: &Engine<B>, action: &str, tenant: &str, n: usize) {
    e.write(|tx| {
        for i in 0..n {
            tx.enqueue(&Enqueue::new(action, &json!({ "tenant": tenant, "n": i })))?;
        }
        Ok(())
    })
    .unwrap();
}

/// Registers a no-op `action` that records the tenant of each run it
/// handles, in the order they ran.
fn tenants_in_order<B: TestBackend>(e: &Engine<B>, action: &str) -> Arc<Mutex<Vec<String>>> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = Arc::clone(&order);
    e.register_action(action, move |run, _| {
        let input: Value = run.input()?;
        o.lock()
            .unwrap()
            .push(input["tenant"].as_str().unwrap_or("").to_string());
        Ok(())
    })
    .unwrap();
    order
}

/// Where in `order` the last run of `key` is (1-based).
fn last_of(order: &[String], key: &str) -> usize {
    order.iter().rposition(|k| k == key).unwrap() + 1
}

fn fair(action: &str) -> ActionConfig {
    ActionConfig::new(action).partition_by("tenant").fair()
}

/// Invariant 6 under keys (fairness): key B's 100 runs enqueued behind key
/// A's 10,000 all start within the first 2 × 100 (+1) runs started, and
/// in turn with A's: B's k-th run is at most the (2k)-th.
fn a_key_behind_a_backlog_of_ten_thousand_starts_all_its_runs_within_twice_its_count<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    e.configure_action(&fair("report")).unwrap();
    backlog(&e, "report", "a", 10_000);
    backlog(&e, "report", "b", 100);
    let order = tenants_in_order(&e, "report");
    e.run_until_idle().unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 10_100);
    let b_at: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, k)| *k == "b")
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(b_at.len(), 100);
    for (k, at) in b_at.iter().enumerate() {
        assert!(
            *at <= 2 * (k + 1) + 1,
            "b's run {} started {at}th: {:?}",
            k + 1,
            &b_at[..5]
        );
    }
    assert!(last_of(&order, "b") <= 201);
    // The runs carry their keys.
    let runs = e.runs(None, 5).unwrap();
    assert!(runs.iter().all(|r| r.key.is_some()), "{runs:?}");
}

/// Fairness with weights: with A at weight 3 and B at 1, both with a
/// backlog, every prefix of the order gives A three runs to B's one within
/// one run of each (|n_A / 3 − n_B / 1| ≤ 1), until one runs out.
fn weights_share_the_claims_within_one_run_of_their_ratio<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    e.configure_action(&fair("report")).unwrap();
    e.set_key_limits("report", &KeyLimits::new("a").weight(3))
        .unwrap();
    backlog(&e, "report", "a", 600);
    backlog(&e, "report", "b", 600);
    let order = tenants_in_order(&e, "report");
    e.run_until_idle().unwrap();
    let order = order.lock().unwrap().clone();
    let (mut a, mut b) = (0.0f64, 0.0f64);
    for (i, k) in order.iter().enumerate() {
        if k == "a" {
            a += 1.0;
        } else {
            b += 1.0;
        }
        if a >= 600.0 {
            break;
        }
        assert!(
            (a / 3.0 - b).abs() <= 1.0 + 1e-9,
            "after {} runs: a {a}, b {b}",
            i + 1
        );
    }
    assert!(a >= 600.0, "a ran out first, as its weight says");
}

/// Fairness with an idle key: a key that had nothing ready while another
/// was served does not come back with credit — it is served in turn with
/// the other from where the clock stands, not given a burst.
fn a_key_that_had_nothing_ready_comes_back_level_not_ahead<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    e.configure_action(&fair("report")).unwrap();
    let order = tenants_in_order(&e, "report");
    backlog(&e, "report", "a", 300);
    e.run_until_idle().unwrap();
    // a was served 300 times alone; now both have 50.
    order.lock().unwrap().clear();
    backlog(&e, "report", "a", 50);
    backlog(&e, "report", "b", 50);
    e.run_until_idle().unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 100);
    let first_20_b = order[..20].iter().filter(|k| *k == "b").count();
    assert!(
        (9..=11).contains(&first_20_b),
        "b is served in turn, not 300 ahead nor behind: {order:?}"
    );
}

/// Invariant 6 under keys for runs that came before the config: making an
/// action fair keys its unfinished runs from their input in the same
/// transaction, and they are served in turn.
fn an_action_made_fair_after_its_runs_were_enqueued_keys_them_and_serves_them_in_turn<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    backlog(&e, "report", "a", 500);
    backlog(&e, "report", "b", 10);
    assert!(e.runs(None, 1).unwrap()[0].key.is_none(), "no keys yet");
    e.configure_action(&fair("report")).unwrap();
    assert_eq!(
        B::count(
            &e,
            "SELECT count(*) FROM reflexr_runs WHERE flow_key IS NULL"
        ),
        0
    );
    let order = tenants_in_order(&e, "report");
    e.run_until_idle().unwrap();
    let order = order.lock().unwrap().clone();
    assert!(last_of(&order, "b") <= 21, "{:?}", &order[..30]);
}

/// The child's side of the cross-process fairness test: two executors on
/// the parent's database, on the system clock.
fn child_process_works_fair_runs<B: TestBackend>() {
    let e = parent_engine::<B>(&Opts::system("child").executors(2));
    e.register_action("report", |_, _| Ok(())).unwrap();
    e.start().unwrap();
    println!("\nstarted");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    e.shutdown();
}

/// Waits until no run of the file is unfinished.
fn drained<B: TestBackend>(e: &Engine<B>) {
    let deadline = std::time::Instant::now() + PATIENCE;
    let watch = e.watch();
    loop {
        let left = B::count(
            e,
            "SELECT count(*) FROM reflexr_runs WHERE state NOT IN ('succeeded', 'dead')",
        );
        if left == 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{left} runs left");
        watch.wait(Duration::from_millis(200));
    }
}

/// Fairness across processes: with the 10,100 runs of the first test
/// worked by four executors in two processes, B's runs all start early.
/// Checked from the file: fewer than 2 × 100 + 1 of A's runs started
/// strictly before B's last start, give or take one claim batch (256) per
/// executor — the claims of two processes read their clocks before they
/// take their turn on the passes, so the start times of claims made in the
/// same instant may be out of their order by one batch.
fn a_key_behind_a_backlog_starts_within_the_bound_across_two_processes<B: TestBackend>() {
    let place = B::place();
    {
        let e = B::open_opts(&place, &Opts::system("setup").executors(1));
        e.configure_action(&fair("report")).unwrap();
        backlog(&e, "report", "a", 10_000);
        backlog(&e, "report", "b", 100);
    }
    let mut child = child::<B>(&place, "child_process_works_fair_runs", &[]);
    assert!(child.past("started"));
    let e = B::open_opts(&place, &Opts::system("parent").executors(2));
    e.register_action("report", |_, _| Ok(())).unwrap();
    e.start().unwrap();
    drained(&e);
    e.shutdown();
    child.send("done\n");
    assert!(child.finish().success);
    let b_last = B::count(
        &e,
        "SELECT max(started_at) FROM reflexr_runs WHERE flow_key = 'b'",
    );
    let a_before = B::count(
        &e,
        &format!(
            "SELECT count(*) FROM reflexr_runs WHERE flow_key = 'a' AND started_at < {b_last}"
        ),
    );
    let ran_here = B::count(
        &e,
        "SELECT count(*) FROM reflexr_runs WHERE claimed_by IS NULL AND state = 'succeeded'",
    );
    assert_eq!(ran_here, 10_100);
    eprintln!("a_before {a_before}");
    assert!(
        a_before <= 201 + 4 * 256,
        "{a_before} of a's runs started before b's last"
    );
}

/// The child's side of the cross-process override test: two executors, the
/// keyed action's handler taking a few milliseconds.
fn child_process_works_keyed_runs<B: TestBackend>() {
    let e = parent_engine::<B>(&Opts::system("child").executors(2));
    e.register_action("sync", |_, _| {
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

/// The most runs of `key` that held a claim at once, from their claim and
/// end times in the file.
fn most_at_once<B: TestBackend>(e: &Engine<B>, key: &str) -> i64 {
    let times = B::strings(
        e,
        &format!(
            "SELECT started_at || ' ' || finished_at FROM reflexr_runs WHERE flow_key = '{key}'"
        ),
    );
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for t in times {
        let (s, f) = t.split_once(' ').unwrap();
        edges.push((s.parse().unwrap(), 1));
        edges.push((f.parse().unwrap(), -1));
    }
    // Ends before starts at the same millisecond: a slot freed and taken.
    edges.sort_by_key(|(t, d)| (*t, *d));
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in edges {
        now += i64::from(d);
        most = most.max(now);
    }
    most
}

/// Invariant 5 under a key's limit, across processes: an action limited to
/// one running run per key, with the key `acme` allowed three, worked by
/// four executors in two processes — from the runs' claim and end times in
/// the file, acme never has more than three at once, and the other key
/// never more than one.
fn a_key_override_holds_across_processes_and_the_other_keys_keep_the_default<B: TestBackend>() {
    let place = B::place();
    {
        let e = B::open_opts(&place, &Opts::system("setup").executors(1));
        e.configure_action(
            &ActionConfig::new("sync")
                .partition_by("tenant")
                .max_running(1),
        )
        .unwrap();
        e.operator("ops", "acme pays for more")
            .unwrap()
            .set_key_limits("sync", &KeyLimits::new("acme").max_running(3))
            .unwrap();
        backlog(&e, "sync", "acme", 40);
        backlog(&e, "sync", "free", 20);
    }
    let mut child = child::<B>(&place, "child_process_works_keyed_runs", &[]);
    assert!(child.past("started"));
    let e = B::open_opts(&place, &Opts::system("parent").executors(2));
    e.register_action("sync", |_, _| {
        std::thread::sleep(Duration::from_millis(3));
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    drained(&e);
    e.shutdown();
    child.send("done\n");
    assert!(child.finish().success);
    let acme = most_at_once(&e, "acme");
    let free = most_at_once(&e, "free");
    assert!((1..=3).contains(&acme), "acme ran {acme} at once");
    assert_eq!(free, 1, "free ran {free} at once");
}

/// Invariant 5 under a key's rate: a key with a rate of its own (2 a
/// minute) starts no more than that in its window while the other keys
/// keep the action's (100 a minute); a minute later it starts two more.
fn a_key_rate_override_counts_in_its_own_window<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>(|o| o);
    e.configure_action(
        &ActionConfig::new("sync")
            .partition_by("tenant")
            .rate(100, Duration::from_secs(60)),
    )
    .unwrap();
    e.set_key_limits(
        "sync",
        &KeyLimits::new("slow").rate(2, Duration::from_secs(60)),
    )
    .unwrap();
    backlog(&e, "sync", "slow", 10);
    backlog(&e, "sync", "fast", 10);
    let order = tenants_in_order(&e, "sync");
    e.run_until_idle().unwrap();
    let count = |k: &str| order.lock().unwrap().iter().filter(|x| *x == k).count();
    assert_eq!((count("slow"), count("fast")), (2, 10));
    clock.advance(Duration::from_secs(61));
    e.run_until_idle().unwrap();
    assert_eq!(count("slow"), 4);
}

/// Invariant 10 for key limits: a key limit for an action without keys, a
/// weight, limit or rate of zero, an empty key, a clear of a key without
/// overrides — each a typed error that stores nothing; what was set is on
/// the record, and read back as it was set.
fn key_limits_of_bad_input_are_typed_errors_that_change_nothing_and_changes_are_audited<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    let ops = e.operator("ops", "tuning").unwrap();
    let err = ops
        .set_key_limits("plain", &KeyLimits::new("acme").max_running(2))
        .unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    e.configure_action(&fair("report")).unwrap();
    for bad in [
        KeyLimits::new("acme").weight(0),
        KeyLimits::new("acme").max_running(0),
        KeyLimits::new("acme").rate(0, Duration::from_secs(1)),
        KeyLimits::new("acme").rate(1, Duration::ZERO),
        KeyLimits::new(""),
        KeyLimits::new("a\u{0}b"),
    ] {
        let err = ops.set_key_limits("report", &bad).unwrap_err();
        assert!(err.is_bad_input(), "{bad:?}: {err}");
    }
    assert!(e.key_limits("report").unwrap().is_empty());
    assert!(matches!(
        ops.clear_key_limits("report", "acme").unwrap_err(),
        Error::NotFound { .. }
    ));
    let acme = KeyLimits::new("acme")
        .max_running(20)
        .rate(5, Duration::from_secs(1))
        .weight(4);
    ops.set_key_limits("report", &acme).unwrap();
    assert_eq!(e.key_limits("report").unwrap(), std::slice::from_ref(&acme));
    backlog(&e, "report", "acme", 3);
    backlog(&e, "report", "other", 1);
    let keys = e.action_keys("report").unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        (keys[0].key.as_str(), keys[0].ready, keys[0].weight),
        ("acme", 3, 4)
    );
    assert_eq!(keys[0].max_running, Some(20));
    assert!(keys[0].overridden && !keys[1].overridden);
    assert_eq!(
        (keys[1].key.as_str(), keys[1].ready, keys[1].weight),
        ("other", 1, 1)
    );
    ops.clear_key_limits("report", "acme").unwrap();
    assert!(e.key_limits("report").unwrap().is_empty());
    let audit = B::strings(
        &e,
        "SELECT action || ' ' || target || ' ' || operator FROM reflexr_audit ORDER BY id",
    );
    assert!(
        audit.contains(&"set_key_limits report key acme ops".to_string())
            && audit.contains(&"clear_key_limits report key acme ops".to_string()),
        "{audit:?}"
    );
}

fn ping(n: i64) -> Enqueue {
    Enqueue::new("reindex", &json!({ "n": n }))
        .debounce(Debounce::new("user/7", Duration::from_secs(2)))
}

/// Invariant 5 with a debounce: ten enqueues of one key within its window
/// make one run, with the last input, due a window after the last; each
/// enqueue says which run it folded into. Bad debounces are typed errors.
fn many_enqueues_in_a_debounce_window_make_one_run_with_the_last_input<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>(|o| o);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    e.register_action("reindex", move |run, _| {
        s.lock()
            .unwrap()
            .push(run.input::<Value>()?["n"].as_i64().unwrap());
        Ok(())
    })
    .unwrap();
    let first = e.enqueue(&ping(0)).unwrap();
    assert!(!first.deduplicated);
    for n in 1..10 {
        clock.advance(Duration::from_millis(500));
        let again = e.enqueue(&ping(n)).unwrap();
        assert_eq!(again.id, first.id);
        assert!(again.deduplicated);
        e.run_until_idle().unwrap();
        assert!(seen.lock().unwrap().is_empty(), "not due within the window");
    }
    let run = e.run(&first.id).unwrap().unwrap();
    assert_eq!(run.due_at, START_MS + 9 * 500 + 2_000);
    clock.advance(Duration::from_secs(2));
    e.run_until_idle().unwrap();
    assert_eq!(*seen.lock().unwrap(), [9]);
    assert_eq!(B::count(&e, "SELECT count(*) FROM reflexr_runs"), 1);
    for bad in [
        ping(1).after(Duration::from_secs(1)),
        ping(1).unique("k", reflexr::Unique::WhilePending),
        Enqueue::new("reindex", &1).debounce(Debounce::new("k", Duration::ZERO)),
        Enqueue::new("reindex", &1)
            .debounce(Debounce::new("k", Duration::from_secs(1)).max_wait(Duration::ZERO)),
        Enqueue::new("reindex", &1).debounce(Debounce::new("", Duration::from_secs(1))),
    ] {
        let err = e.enqueue(&bad).unwrap_err();
        assert!(err.is_bad_input(), "{bad:?}: {err}");
    }
    assert_eq!(B::count(&e, "SELECT count(*) FROM reflexr_runs"), 1);
}

/// Invariant 5 at a debounce window's edge: an enqueue made once the run
/// started is not folded into it (its input would be lost) but makes the
/// next run, which runs too.
fn a_debounced_enqueue_at_the_windows_edge_is_never_lost<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>(|o| o);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let e2 = e.clone();
    e.register_action("reindex", move |run, _| {
        let n = run.input::<Value>()?["n"].as_i64().unwrap();
        s.lock().unwrap().push(n);
        if n == 1 {
            // While the first runs, another enqueue of the key.
            let next = e2.enqueue(&ping(2))?;
            assert!(!next.deduplicated, "a run that started takes no more input");
        }
        Ok(())
    })
    .unwrap();
    let first = e.enqueue(&ping(0)).unwrap();
    e.enqueue(&ping(1)).unwrap();
    clock.advance(Duration::from_secs(2));
    e.run_until_idle().unwrap();
    assert_eq!(*seen.lock().unwrap(), [1]);
    clock.advance(Duration::from_secs(2));
    e.run_until_idle().unwrap();
    assert_eq!(*seen.lock().unwrap(), [1, 2]);
    assert_eq!(
        e.run(&first.id).unwrap().unwrap().state,
        RunState::Succeeded
    );
}

/// A debounce's maximum wait: enqueues that keep coming within the window
/// push the run's due time on, but never past the maximum wait after the
/// first.
fn a_debounce_is_due_at_most_its_maximum_wait_after_the_first_enqueue<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>(|o| o);
    let d = || Debounce::new("k", Duration::from_secs(2)).max_wait(Duration::from_secs(5));
    let first = e
        .enqueue(&Enqueue::new("reindex", &json!({ "n": 0 })).debounce(d()))
        .unwrap();
    for n in 1..8 {
        clock.advance(Duration::from_secs(1));
        e.enqueue(&Enqueue::new("reindex", &json!({ "n": n })).debounce(d()))
            .unwrap();
    }
    let run = e.run(&first.id).unwrap().unwrap();
    assert_eq!(run.due_at, START_MS + 5_000, "capped at the maximum wait");
    assert_eq!(run.input, r#"{"n":7}"#);
}

/// A registered merge: every debounced input is folded into the run, none
/// lost, in the order enqueued.
fn a_registered_merge_folds_every_debounced_input_into_the_run<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| {
        o.merge("reindex", |mut old, new| {
            if let (Some(a), Some(b)) = (old["ids"].as_array_mut(), new["ids"].as_array()) {
                a.extend(b.iter().cloned());
            }
            old
        })
    });
    let mut id = String::new();
    for n in 0..5 {
        id = e
            .enqueue(
                &Enqueue::new("reindex", &json!({ "ids": [n] }))
                    .debounce(Debounce::new("k", Duration::from_secs(2))),
            )
            .unwrap()
            .id;
    }
    let run = e.run(&id).unwrap().unwrap();
    let input: Value = serde_json::from_str(&run.input).unwrap();
    assert_eq!(input, json!({ "ids": [0, 1, 2, 3, 4] }));
}

/// Invariant 5 per run of a batch (contained failures): a batch action's
/// handler takes the runs of a claim together; the third's failure is its
/// own — retried alone — and the others settle once, each handled once.
fn a_batch_whose_third_run_fails_settles_the_others_once_and_retries_the_third<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    let calls = Arc::new(Mutex::new(Vec::<Vec<i64>>::new()));
    let c = Arc::clone(&calls);
    e.register_batch_action("send", 10, move |batch| {
        let ns: Vec<i64> = batch
            .iter()
            .map(|ctx| ctx.run().input::<Value>().unwrap()["n"].as_i64().unwrap())
            .collect();
        c.lock().unwrap().push(ns.clone());
        ns.iter()
            .zip(batch.iter())
            .map(|(n, ctx)| {
                if *n == 2 && ctx.run().attempt == 1 {
                    Err("the third bounced".into())
                } else {
                    Ok(())
                }
            })
            .collect()
    })
    .unwrap();
    let retry = RetryPolicy::attempts(3).fixed(Duration::ZERO);
    e.write(|tx| {
        for n in 0..6 {
            tx.enqueue(&Enqueue::new("send", &json!({ "n": n })).retry(retry))?;
        }
        Ok(())
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls[0],
        [0, 1, 2, 3, 4, 5],
        "one call for the claim's runs"
    );
    let mut handled: HashMap<i64, usize> = HashMap::new();
    for n in calls.iter().flatten() {
        *handled.entry(*n).or_default() += 1;
    }
    for n in [0, 1, 3, 4, 5] {
        assert_eq!(handled[&n], 1, "run {n} handled once");
    }
    assert_eq!(handled[&2], 2, "the third retried alone");
    assert_eq!(idle.succeeded, 6);
    assert_eq!(
        B::count(
            &e,
            "SELECT count(*) FROM reflexr_runs WHERE state = 'succeeded' AND attempt = 1"
        ),
        5
    );
}

/// Invariant 5 when a batch call itself fails: a handler that panics, or
/// returns a number of outcomes other than its runs', fails the attempt of
/// every run of the call (each retried by its policy), and nothing is lost.
fn a_batch_handler_that_panics_or_miscounts_fails_every_run_of_its_call<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    e.register_batch_action("panics", 10, |_| panic!("the bulk API is down"))
        .unwrap();
    e.register_batch_action("miscounts", 10, |_| vec![Ok(())])
        .unwrap();
    let once = RetryPolicy::attempts(1);
    e.write(|tx| {
        for n in 0..3 {
            tx.enqueue(&Enqueue::new("panics", &n).retry(once))?;
            tx.enqueue(&Enqueue::new("miscounts", &n).retry(once))?;
        }
        Ok(())
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!(idle.dead, 6);
    let errors = B::strings(
        &e,
        "SELECT action || ': ' || last_error FROM reflexr_runs ORDER BY action, ord",
    );
    assert!(
        errors[..3]
            .iter()
            .all(|e| e.starts_with("miscounts: the batch handler returned 1 outcomes for 3 runs")),
        "{errors:?}"
    );
    assert!(
        errors[3..]
            .iter()
            .all(|e| e.contains("panicked: the bulk API is down")),
        "{errors:?}"
    );
}

/// Invariant 5 across a change of config: a run that died before its
/// action became fair has no key; an operator's retry gives it one, so the
/// fair claim (which reads only keyed runs) takes it.
fn a_run_that_ended_before_its_action_was_made_fair_is_claimed_when_an_operator_retries_it<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>(|o| o);
    e.register_action("report", |run, _| {
        if run.attempt == 1 && run.key.is_none() {
            return Err("the first attempt fails".into());
        }
        Ok(())
    })
    .unwrap();
    let id = e
        .enqueue(
            &Enqueue::new("report", &json!({ "tenant": "acme" })).retry(RetryPolicy::attempts(1)),
        )
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&id).unwrap().unwrap().state, RunState::Dead);
    e.configure_action(&fair("report")).unwrap();
    e.operator("ops", "the tenant's service is back")
        .unwrap()
        .retry_run(&id)
        .unwrap();
    assert_eq!(e.run(&id).unwrap().unwrap().key.as_deref(), Some("acme"));
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&id).unwrap().unwrap().state, RunState::Succeeded);
}

/// Invariant 5 with a debounce and a retry: a debounced run that started,
/// failed and waits for its backoff takes no more input (its attempt used
/// the input it had) — the next enqueue of the key gives the key up from it
/// and makes a new run; both run, each with its own input. A maximum wait
/// of any length is taken.
fn a_debounced_run_waiting_for_its_retry_takes_no_more_input_and_gives_its_key_up<
    B: TestBackend,
>() {
    let (_place, clock, e) = setup::<B>(|o| o);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    e.register_action("reindex", move |run, _| {
        let n = run.input::<Value>()?["n"].as_i64().unwrap();
        s.lock().unwrap().push((n, run.attempt));
        if n == 1 && run.attempt == 1 {
            return Err("the index is busy".into());
        }
        Ok(())
    })
    .unwrap();
    let d =
        || Debounce::new("user/7", Duration::from_secs(2)).max_wait(Duration::from_secs(u64::MAX));
    let retry = RetryPolicy::attempts(2).fixed(Duration::from_secs(60));
    let first = e
        .enqueue(
            &Enqueue::new("reindex", &json!({ "n": 1 }))
                .debounce(d())
                .retry(retry),
        )
        .unwrap();
    clock.advance(Duration::from_secs(2));
    e.run_until_idle().unwrap();
    assert_eq!(*seen.lock().unwrap(), [(1, 1)], "failed, waits a minute");
    let second = e
        .enqueue(&Enqueue::new("reindex", &json!({ "n": 2 })).debounce(d()))
        .unwrap();
    assert!(!second.deduplicated, "a new run: the first has started");
    assert_ne!(second.id, first.id);
    assert_eq!(e.run(&first.id).unwrap().unwrap().input, r#"{"n":1}"#);
    clock.advance(Duration::from_secs(61));
    e.run_until_idle().unwrap();
    let mut ran = seen.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, [(1, 1), (1, 2), (2, 1)]);
}
