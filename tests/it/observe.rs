//! What a run's handler logs and how far it says it got, kept with the run
//! (DESIGN.md invariant 5: what an attempt wrote is its own, and a worker
//! that lost its claim writes nothing; 10 for bad input). Written once for
//! every backend (`on_backends!`), the crashing child process too.

use reflexr_testkit as common;

use std::time::Duration;

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, on_backends};
use reflexr::limits::{MAX_LOG_LINES_PER_ATTEMPT, MAX_LOG_MESSAGE_BYTES};
use reflexr::{
    Decision, Engine, Enqueue, Follow, ManualClock, NewEvent, Retention, RetryPolicy, Rule,
    RunState,
};
use serde_json::json;

on_backends!(
    a_runs_log_and_progress_are_kept_per_attempt_in_order_across_retries,
    an_attempts_log_is_bounded_and_bad_lines_are_typed_errors_that_write_nothing,
    a_worker_that_lost_its_claim_logs_nothing,
    a_crash_mid_attempt_keeps_what_was_logged_before_it,
    logs_and_progress_go_with_their_run_when_it_is_pruned,
    a_trace_context_goes_from_an_append_to_its_run_to_what_the_run_emits_and_a_relay,
    a_trace_context_that_is_not_w3c_is_a_typed_error_that_appends_nothing,
);

children_on_backends!(child_process_logs_then_dies);

/// The round, recognisable time a test's clock starts at.
const START_MS: i64 = 1_800_000_000_000;

fn setup<B: TestBackend>() -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = B::open_opts(&place, &Opts::new(&clock, "test"));
    (place, clock, e)
}

/// Invariant 5 for what a handler reports: each attempt's lines are kept
/// under it, numbered in the order logged across attempts, with their
/// fields; the last progress said wins, with its attempt.
fn a_runs_log_and_progress_are_kept_per_attempt_in_order_across_retries<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    e.register_action("import", |run, ctx| {
        ctx.log(
            log::Level::Info,
            "started",
            json!({ "attempt": run.attempt }),
        )?;
        ctx.progress(1, 3)?;
        if run.attempt == 1 {
            ctx.log(log::Level::Error, "the source timed out", json!(null))?;
            return Err("timed out".into());
        }
        ctx.progress(3, 3)?;
        ctx.log(log::Level::Debug, "done", json!(null))?;
        Ok(())
    })
    .unwrap();
    let id = e
        .enqueue(
            &Enqueue::new("import", &json!({}))
                .retry(RetryPolicy::attempts(2).fixed(Duration::ZERO)),
        )
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&id).unwrap().unwrap().state, RunState::Succeeded);
    let lines = e.run_logs(&id, 0, 100).unwrap();
    let seen: Vec<(i64, u32, &str, &str)> = lines
        .iter()
        .map(|l| (l.n, l.attempt, l.level.as_str(), l.message.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (1, 1, "info", "started"),
            (2, 1, "error", "the source timed out"),
            (3, 2, "info", "started"),
            (4, 2, "debug", "done"),
        ]
    );
    assert_eq!(lines[0].fields.as_deref(), Some(r#"{"attempt":1}"#));
    assert_eq!(lines[1].fields, None);
    assert_eq!(
        e.run_logs(&id, 2, 1).unwrap()[0].n,
        3,
        "after a line, a page"
    );
    let p = e.run_progress(&id).unwrap().unwrap();
    assert_eq!((p.attempt, p.done, p.total), (2, 3, 3));
    assert!(e.run_logs("nope", 0, 10).unwrap().is_empty());
    assert!(e.run_progress("nope").unwrap().is_none());
}

/// Invariant 10 for logs: an attempt keeps at most its limit of lines and
/// then one that says the rest were dropped; a long message is cut; fields
/// too large and progress past its total are typed errors that write
/// nothing — and the run goes on.
fn an_attempts_log_is_bounded_and_bad_lines_are_typed_errors_that_write_nothing<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    e.register_action("chatty", |_, ctx| {
        for i in 0..MAX_LOG_LINES_PER_ATTEMPT + 50 {
            ctx.log(log::Level::Trace, format!("line {i}"), json!(null))?;
        }
        ctx.log(
            log::Level::Info,
            "x".repeat(3 * MAX_LOG_MESSAGE_BYTES),
            json!(null),
        )?;
        let big = json!({ "blob": "y".repeat(reflexr::limits::MAX_LOG_FIELDS_BYTES) });
        let err = ctx.log(log::Level::Info, "too big", big).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        let err = ctx.progress(4, 3).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("chatty", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&id).unwrap().unwrap().state, RunState::Succeeded);
    let lines = e.run_logs(&id, 0, 10_000).unwrap();
    assert_eq!(lines.len(), MAX_LOG_LINES_PER_ATTEMPT + 1);
    assert_eq!(lines[MAX_LOG_LINES_PER_ATTEMPT - 1].message, "line 999");
    let last = &lines[MAX_LOG_LINES_PER_ATTEMPT];
    assert_eq!(last.level, "warn");
    assert!(
        last.message.contains("the rest are dropped"),
        "{}",
        last.message
    );
    assert!(e.run_progress(&id).unwrap().is_none());
    // A message cut to its limit, in a run with room for it.
    e.register_action("long", |_, ctx| {
        ctx.log(
            log::Level::Info,
            "é".repeat(MAX_LOG_MESSAGE_BYTES),
            json!(null),
        )?;
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("long", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    let line = &e.run_logs(&id, 0, 10).unwrap()[0];
    assert!(
        line.message.len() <= MAX_LOG_MESSAGE_BYTES,
        "{}",
        line.message.len()
    );
    assert!(line.message.ends_with("more bytes cut)"));
}

/// Invariant 5: a worker whose claim was taken over writes nothing to the
/// run's log or progress — the call says so with `LeaseLost`.
fn a_worker_that_lost_its_claim_logs_nothing<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    let e2 = e.clone();
    e.register_action("slow", move |run, ctx| {
        ctx.log(log::Level::Info, "mine", json!(null))?;
        // Another executor takes the claim over meanwhile (forged).
        let id = run.id.clone();
        e2.write(|tx| {
            B::run_sql(
                tx,
                &format!("UPDATE reflexr_runs SET claimed_by = 'other' WHERE id = '{id}'"),
            )
        })
        .unwrap();
        let err = ctx
            .log(log::Level::Info, "not mine", json!(null))
            .unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        let err = ctx.progress(1, 2).unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("slow", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    let lines = e.run_logs(&id, 0, 10).unwrap();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].message, "mine");
    assert!(e.run_progress(&id).unwrap().is_none());
}

/// The child's side of the crash test: it claims the parent's run, logs two
/// lines and says how far it got, then dies in the middle of the attempt.
fn child_process_logs_then_dies<B: TestBackend>() {
    let e = parent_engine::<B>(&Opts::system("child").executors(1));
    e.register_action("import", |_, ctx| {
        ctx.log(log::Level::Info, "fetched", json!({ "rows": 120 }))?;
        ctx.progress(60, 120)?;
        ctx.log(log::Level::Warn, "row 61 looks odd", json!(null))?;
        std::process::abort();
    })
    .unwrap();
    let _ = e.run_until_idle();
}

/// Invariant 5 through a crash: a process killed in the middle of an
/// attempt leaves every line it logged before, and its progress, in the
/// file; the run's claim lapses and the next attempt runs.
fn a_crash_mid_attempt_keeps_what_was_logged_before_it<B: TestBackend>() {
    let place = B::place();
    let id = {
        let e = B::open_opts(&place, &Opts::system("setup").executors(1));
        e.enqueue(&Enqueue::new("import", &json!({}))).unwrap().id
    };
    let child = child::<B>(&place, "child_process_logs_then_dies", &[]);
    assert!(!child.finish().success, "the child died");
    let e = B::open_opts(
        &place,
        &Opts::system("parent").lease_ttl(Duration::from_millis(300)),
    );
    let lines = e.run_logs(&id, 0, 10).unwrap();
    let kept: Vec<&str> = lines.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(kept, ["fetched", "row 61 looks odd"]);
    let p = e.run_progress(&id).unwrap().unwrap();
    assert_eq!((p.attempt, p.done, p.total), (1, 60, 120));
    assert_eq!(e.run(&id).unwrap().unwrap().state, RunState::Running);
}

/// What a run reported goes when the run is pruned, not before.
fn logs_and_progress_go_with_their_run_when_it_is_pruned<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>();
    e.register_action("import", |_, ctx| {
        ctx.log(log::Level::Info, "hello", json!(null))?;
        ctx.progress(1, 1)?;
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("import", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    B::prune(&e, &Retention::older_than(Duration::from_secs(3600))).unwrap();
    assert_eq!(
        e.run_logs(&id, 0, 10).unwrap().len(),
        1,
        "a recent run keeps them"
    );
    clock.advance(Duration::from_secs(7200));
    B::prune(&e, &Retention::older_than(Duration::from_secs(3600))).unwrap();
    assert!(e.run(&id).unwrap().is_none(), "the run was pruned");
    assert!(e.run_logs(&id, 0, 10).unwrap().is_empty());
    assert!(e.run_progress(&id).unwrap().is_none());
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM reflexr_run_logs")
            + B::count(&e, "SELECT count(*) FROM reflexr_run_progress"),
        0
    );
}

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The trace context an application gives its append is kept with the
/// event, carried by the run it fires and by the events that run emits,
/// and by a follower's relay of them; an enqueue's too.
fn a_trace_context_goes_from_an_append_to_its_run_to_what_the_run_emits_and_a_relay<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>();
    e.ensure_workspace("shop", &["order.placed", "order.confirmed"])
        .unwrap();
    e.ensure_workspace("audit", &["order.placed", "order.confirmed"])
        .unwrap();
    e.register_rule(
        Rule::new("confirm", "shop")
            .on(["order.placed"])
            .action("confirm")
            .decide(|_| Ok(Decision::Fire(json!({})))),
    )
    .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = std::sync::Arc::clone(&seen);
    e.register_action("confirm", move |run, ctx| {
        s.lock().unwrap().push(run.traceparent.clone());
        ctx.emit(
            "ok",
            NewEvent::new("order.confirmed", "order/7", "engine", 0),
        )?;
        Ok(())
    })
    .unwrap();
    // Followers relay from a file (SQLite's).
    let follows = B::NAME == "sqlite";
    if follows {
        e.follow(Follow::new("shop", "audit")).unwrap();
    }
    let placed = NewEvent::new("order.placed", "order/7", "web", 1).traceparent(TP);
    let seq = e.append("shop", &placed).unwrap().seq;
    e.run_until_idle().unwrap();
    assert_eq!(
        e.event(seq).unwrap().unwrap().traceparent.as_deref(),
        Some(TP)
    );
    assert_eq!(*seen.lock().unwrap(), [Some(TP.to_string())]);
    let shop = e.read(&reflexr::Query::new("shop")).unwrap();
    let confirmed = shop
        .iter()
        .find(|ev| ev.event_type == "order.confirmed")
        .unwrap();
    assert_eq!(
        confirmed.traceparent.as_deref(),
        Some(TP),
        "an emitted event carries it"
    );
    if follows {
        let audit = e.read(&reflexr::Query::new("audit")).unwrap();
        assert_eq!(audit.len(), 2);
        assert!(
            audit.iter().all(|ev| ev.traceparent.as_deref() == Some(TP)),
            "{audit:?}"
        );
    }
    // An event without one has none, and says nothing of it in JSON.
    let plain = e
        .append(
            "shop",
            &NewEvent::new("order.confirmed", "order/8", "web", 1),
        )
        .unwrap()
        .seq;
    let plain = e.event(plain).unwrap().unwrap();
    assert_eq!(plain.traceparent, None);
    assert!(
        !serde_json::to_string(&plain)
            .unwrap()
            .contains("traceparent")
    );
    // An enqueue's.
    e.register_action("job", |_, _| Ok(())).unwrap();
    let id = e
        .enqueue(&Enqueue::new("job", &json!({})).traceparent(TP))
        .unwrap()
        .id;
    assert_eq!(
        B::strings(
            &e,
            &format!("SELECT traceparent FROM reflexr_runs WHERE id = '{id}'")
        ),
        [TP]
    );
    // Operators read it with the run, and its JSON has it only when there.
    let info = e.run(&id).unwrap().unwrap();
    assert_eq!(info.traceparent.as_deref(), Some(TP));
    assert!(serde_json::to_string(&info).unwrap().contains(TP));
    let plain = e.enqueue(&Enqueue::new("job", &json!({}))).unwrap().id;
    let plain = e.run(&plain).unwrap().unwrap();
    assert_eq!(plain.traceparent, None);
    assert!(
        !serde_json::to_string(&plain)
            .unwrap()
            .contains("traceparent")
    );
}

/// Invariant 10: a trace context that is not W3C's version 00 — upper
/// case, short, all-zero ids, another version — is a typed error, and the
/// append or enqueue makes nothing.
fn a_trace_context_that_is_not_w3c_is_a_typed_error_that_appends_nothing<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    e.ensure_workspace("shop", &["order.placed"]).unwrap();
    for bad in [
        "",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    ] {
        let err = e
            .append(
                "shop",
                &NewEvent::new("order.placed", "o", "web", 1).traceparent(bad),
            )
            .unwrap_err();
        assert!(err.is_bad_input(), "{bad:?}: {err}");
        let err = e
            .enqueue(&Enqueue::new("job", &json!({})).traceparent(bad))
            .unwrap_err();
        assert!(err.is_bad_input(), "{bad:?}: {err}");
    }
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM reflexr_events")
            + B::count(&e, "SELECT count(*) FROM reflexr_runs"),
        0
    );
}
