//! Durable workflows: a handler that re-runs from the top, whose recorded
//! steps return their output instead of running again (DESIGN.md,
//! invariant 5, runs act at least once, and 2, the application's rows and
//! the engine's commit together); durable sleeps and waits that hold no
//! claim; waits on the log that find their event whenever it committed;
//! children spawned once and joined. Every test runs on SQLite and, with
//! the feature `postgres`, on PostgreSQL (`on_backends!`), driven by a
//! manual clock and `run_until_idle`.

use reflexr_testkit as common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::backend::TestBackend;
use common::on_backends;
use reflexr::inspect::{AuditAction, StepKind, StepState};
use reflexr::{Engine, Enqueue, Error, EventMatch, ManualClock, NewEvent, RetryPolicy, RunState};
use serde_json::json;

on_backends!(
    a_recorded_step_never_runs_again_across_retries,
    a_recorded_step_never_runs_again_after_its_claim_lapsed,
    a_step_tx_writes_its_rows_exactly_once,
    a_durable_sleep_holds_no_claim_and_continues_at_its_time,
    a_wait_finds_an_event_appended_before_it_was_reached,
    a_wait_wakes_once_on_the_first_matching_event,
    a_wait_receives_an_event_appended_while_no_process_ran,
    a_wait_matches_a_payload_field,
    a_wait_times_out_once_and_a_later_event_changes_nothing,
    children_are_spawned_once_and_joined_with_their_outputs,
    cancelling_a_suspended_workflow_ends_it_and_its_children_at_once,
    a_step_reached_out_of_place_is_a_typed_error,
    patched_keeps_runs_that_passed_on_the_old_path,
    an_operator_resets_a_run_to_a_step_and_only_the_steps_from_it_run_again,
    limits_refuse_what_a_step_cannot_record,
);

/// The round, recognisable time a test's clock starts at.
const START_MS: i64 = 1_800_000_000_000;
const HOUR: Duration = Duration::from_secs(3600);
const TYPES: &[&str] = &["session.moved", "speaker.confirmed", "payment.received"];

fn engine<B: TestBackend>(place: &B::Place, clock: &ManualClock) -> Engine<B> {
    let e = B::open(place, clock, "test");
    e.ensure_workspace("events", TYPES).unwrap();
    B::sql(
        &e,
        "CREATE TABLE IF NOT EXISTS ledger (run TEXT NOT NULL, step TEXT NOT NULL)",
    );
    e
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

fn run_state<B: TestBackend>(e: &Engine<B>, id: &str) -> RunState {
    e.run(id).unwrap().unwrap().state
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy::attempts(5).fixed(Duration::ZERO)
}

/// A step's closure runs once across attempts: an attempt that fails after
/// two steps is retried, and the retry returns their recorded outputs.
fn a_recorded_step_never_runs_again_across_retries<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let (one, two, three) = (counter(), counter(), counter());
    let (c1, c2, c3) = (one.clone(), two.clone(), three.clone());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    e.register_action("flow", move |run, ctx| {
        let a: i64 = ctx.step("a", |_| {
            c1.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(20)
        })?;
        let b: String = ctx.step("b", |step| {
            c2.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(format!("{}+{a}", step.idempotency_key()))
        })?;
        s.lock().unwrap().push(b.clone());
        if run.attempt == 1 {
            return Err("the network went away after b".into());
        }
        ctx.step("c", |_| {
            c3.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(())
        })?;
        ctx.set_output(&json!({ "a": a, "b": b }))?;
        Ok(())
    })
    .unwrap();
    let id = e
        .enqueue(&Enqueue::new("flow", &json!({})).retry(fast_retry()))
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    let counts = [&one, &two, &three].map(|c| c.load(Ordering::SeqCst));
    assert_eq!(counts, [1, 1, 1], "each step ran once over two attempts");
    let key = format!("{id}/b+20");
    assert_eq!(*seen.lock().unwrap(), vec![key.clone(), key.clone()]);
    let out: serde_json::Value = e.run_output(&id).unwrap().unwrap();
    assert_eq!(out, json!({ "a": 20, "b": key }));
    let steps = e.run_steps(&id).unwrap();
    let names: Vec<(&str, i64, StepKind, u32)> = steps
        .iter()
        .map(|s| (s.name.as_str(), s.position, s.kind, s.attempt))
        .collect();
    assert_eq!(
        names,
        vec![
            ("begin", 0, StepKind::Begin, 1),
            ("a", 1, StepKind::Step, 1),
            ("b", 2, StepKind::Step, 1),
            ("c", 3, StepKind::Step, 2),
        ]
    );
    assert!(steps.iter().all(|s| s.state == StepState::Done));
    assert_eq!(steps[1].output.as_deref(), Some("20"));
    assert_eq!(steps[1].output_bytes, 2);
}

/// Invariant 5 for steps: an executor whose claim lapsed mid-workflow is
/// taken over; the new holder runs only the steps not recorded, and the
/// old one records nothing more and cannot complete the run.
fn a_recorded_step_never_runs_again_after_its_claim_lapsed<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let first = engine::<B>(&place, &clock);
    let second = B::open(&place, &clock, "second");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let register = |e: &Engine<B>, who: &'static str, take_over: Option<Engine<B>>| {
        let calls = calls.clone();
        let clock = clock.clone();
        e.register_action("flow", move |_run, ctx| {
            let c = calls.clone();
            ctx.step("a", move |_| {
                c.lock().unwrap().push(format!("a by {who}"));
                Ok::<_, Error>(())
            })?;
            let c = calls.clone();
            let other = take_over.clone();
            let clock = clock.clone();
            ctx.step("b", move |_| {
                c.lock().unwrap().push(format!("b by {who}"));
                if let Some(other) = other {
                    // This executor stalls past its lease: the other takes
                    // the run over and finishes it meanwhile.
                    clock.advance(HOUR);
                    other.run_until_idle().unwrap();
                }
                Ok::<_, Error>(())
            })?;
            let c = calls.clone();
            ctx.step("c", move |_| {
                c.lock().unwrap().push(format!("c by {who}"));
                Ok::<_, Error>(())
            })?;
            Ok(())
        })
        .unwrap();
    };
    register(&second, "second", None);
    register(&first, "first", Some(second.clone()));
    let id = first.enqueue(&Enqueue::new("flow", &json!({}))).unwrap().id;
    first.run_until_idle().unwrap();
    assert_eq!(run_state(&first, &id), RunState::Succeeded);
    assert_eq!(
        *calls.lock().unwrap(),
        vec!["a by first", "b by first", "b by second", "c by second"],
        "a ran once; b's record by the stalled executor was refused"
    );
    let steps = first.run_steps(&id).unwrap();
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["begin", "a", "b", "c"]);
    assert_eq!(steps[1].attempt, 1);
    assert_eq!(steps[2].attempt, 2, "b is the second attempt's");
}

/// Invariant 2 for steps: a step_tx's rows and its record commit together,
/// so a retried workflow writes them once; a step_tx whose closure fails
/// leaves nothing of it.
fn a_step_tx_writes_its_rows_exactly_once<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let failed_once = Arc::new(AtomicBool::new(false));
    let f = failed_once.clone();
    e.register_action("reserve", move |run, ctx| {
        let id = run.id.clone();
        let seats: i64 = ctx.step_tx("reserve", |tx| {
            B::run_sql(
                tx,
                &format!("INSERT INTO ledger VALUES ('{id}', 'reserve')"),
            )?;
            Ok(2)
        })?;
        // A step_tx that fails once: its insert is rolled back with it.
        let id = run.id.clone();
        let first = !f.swap(true, Ordering::SeqCst);
        ctx.step_tx("bill", |tx| {
            B::run_sql(tx, &format!("INSERT INTO ledger VALUES ('{id}', 'bill')"))?;
            if first {
                return Err(Error::invalid("bill", "the card was declined"));
            }
            Ok(seats * 10)
        })?;
        Ok(())
    })
    .unwrap();
    let id = e
        .enqueue(&Enqueue::new("reserve", &json!({})).retry(fast_retry()))
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    assert_eq!(e.run(&id).unwrap().unwrap().attempt, 2);
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM ledger WHERE step = 'reserve'"),
        1
    );
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM ledger WHERE step = 'bill'"),
        1
    );
    let steps = e.run_steps(&id).unwrap();
    assert_eq!(steps[2].output.as_deref(), Some("20"));
}

/// A sleeping run is ready, unclaimed and due at its wake time: no claim,
/// no thread, no attempt counted; it continues once the clock gets there.
fn a_durable_sleep_holds_no_claim_and_continues_at_its_time<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let (before, after) = (counter(), counter());
    let (b, a) = (before.clone(), after.clone());
    e.register_action("remind", move |_run, ctx| {
        ctx.step("before", |_| {
            Ok::<_, Error>(b.fetch_add(1, Ordering::SeqCst))
        })?;
        if let Err(e) = ctx.sleep("an-hour", HOUR) {
            // Suspended: this attempt writes nothing more.
            assert!(e.is_suspended(), "{e}");
            assert!(ctx.checkpoint(&1).unwrap_err().is_suspended());
            assert!(
                ctx.step("x", |_| Ok::<_, Error>(()))
                    .unwrap_err()
                    .is_suspended()
            );
            return Err(e.into());
        }
        ctx.step("after", |_| {
            Ok::<_, Error>(a.fetch_add(1, Ordering::SeqCst))
        })?;
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("remind", &json!({}))).unwrap().id;
    let drained = e.run_until_idle().unwrap();
    assert_eq!((drained.suspended, drained.succeeded), (1, 0));
    let run = e.run(&id).unwrap().unwrap();
    assert_eq!(run.state, RunState::Ready);
    assert_eq!(run.claimed_by, None);
    assert_eq!(run.attempt, 0, "a suspension counts no attempt");
    assert_eq!(run.due_at, START_MS + 3_600_000);
    let sleep = &e.run_steps(&id).unwrap()[2];
    assert_eq!(
        (sleep.kind, sleep.state),
        (StepKind::Sleep, StepState::Waiting)
    );
    assert_eq!(sleep.wake_at, Some(START_MS + 3_600_000));

    clock.advance(HOUR - Duration::from_millis(1));
    assert_eq!(e.run_until_idle().unwrap().claimed, 0, "not due yet");
    clock.advance(Duration::from_millis(1));
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    assert_eq!(
        (before.load(Ordering::SeqCst), after.load(Ordering::SeqCst)),
        (1, 1)
    );
    assert_eq!(e.run_steps(&id).unwrap()[2].state, StepState::Done);
}

fn confirmed(subject: &str, at: i64) -> NewEvent {
    NewEvent::new("speaker.confirmed", subject, "speaker", at).payload(&json!({ "by": subject }))
}

/// The log is the mailbox: an event appended while the run slept, before
/// its wait was reached, is found when the wait is reached.
fn a_wait_finds_an_event_appended_before_it_was_reached<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let got = Arc::new(Mutex::new(None));
    let g = got.clone();
    e.register_action("flow", move |_run, ctx| {
        ctx.sleep("first", Duration::from_secs(60))?;
        let m = EventMatch::new("events", "speaker.confirmed").subject("session/1");
        let event = ctx.wait_for_event("confirmed", &m, Some(HOUR))?;
        *g.lock().unwrap() = event.map(|e| e.seq);
        Ok(())
    })
    .unwrap();
    // An event before the run began is not one it waits for.
    e.append("events", &confirmed("session/1", START_MS))
        .unwrap();
    let id = e.enqueue(&Enqueue::new("flow", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    let seq = e
        .append("events", &confirmed("session/1", START_MS))
        .unwrap()
        .seq;
    clock.advance(Duration::from_secs(60));
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    assert_eq!(*got.lock().unwrap(), Some(seq));
    let wait = &e.run_steps(&id).unwrap()[2];
    assert_eq!((wait.kind, wait.state), (StepKind::Wait, StepState::Done));
}

/// A waiting run wakes once, on the first matching event; other subjects
/// and other types do not wake it, and a second match finds it gone.
fn a_wait_wakes_once_on_the_first_matching_event<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let (starts, woke) = (counter(), counter());
    let (s, w) = (starts.clone(), woke.clone());
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    e.register_action("flow", move |run, ctx| {
        s.fetch_add(1, Ordering::SeqCst);
        let session: String = run.input::<serde_json::Value>()?["session"]
            .as_str()
            .unwrap()
            .into();
        let m = EventMatch::new("events", "speaker.confirmed").subject(session);
        let event = ctx.wait_for_event("confirmed", &m, None)?;
        w.fetch_add(1, Ordering::SeqCst);
        g.lock().unwrap().push(event.map(|e| e.seq));
        Ok(())
    })
    .unwrap();
    let ids: Vec<String> = (1..=3)
        .map(|i| {
            e.enqueue(&Enqueue::new(
                "flow",
                &json!({ "session": format!("session/{i}") }),
            ))
            .unwrap()
            .id
        })
        .collect();
    e.run_until_idle().unwrap();
    assert!(ids.iter().all(|id| run_state(&e, id) == RunState::Ready));
    let due = e.run(&ids[0]).unwrap().unwrap().due_at;
    assert_eq!(due, reflexr::limits::NEVER, "no timeout: due never");
    // Not these: another type, another subject.
    e.append(
        "events",
        &NewEvent::new("session.moved", "session/2", "web", START_MS),
    )
    .unwrap();
    e.append("events", &confirmed("session/9", START_MS))
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(woke.load(Ordering::SeqCst), 0);
    // The first of two matches is the one.
    let first = e
        .append("events", &confirmed("session/2", START_MS))
        .unwrap()
        .seq;
    e.append("events", &confirmed("session/2", START_MS))
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(woke.load(Ordering::SeqCst), 1);
    assert_eq!(*got.lock().unwrap(), vec![Some(first)]);
    assert_eq!(run_state(&e, &ids[1]), RunState::Succeeded);
    assert_eq!(run_state(&e, &ids[0]), RunState::Ready);
    assert_eq!(run_state(&e, &ids[2]), RunState::Ready);
    e.append("events", &confirmed("session/2", START_MS))
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(woke.load(Ordering::SeqCst), 1, "it woke once");
    assert_eq!(
        starts.load(Ordering::SeqCst),
        4,
        "three starts and one wake"
    );
}

/// The log is the mailbox across processes: a run suspended by one engine,
/// an event appended by another that runs no workflow while the first is
/// gone, and the first, reopened, wakes it.
fn a_wait_receives_an_event_appended_while_no_process_ran<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let register = |e: &Engine<B>, got: Arc<Mutex<Vec<i64>>>| {
        e.register_action("flow", move |_run, ctx| {
            let m = EventMatch::new("events", "speaker.confirmed").subject("session/7");
            let event = ctx
                .wait_for_event("confirmed", &m, None)?
                .expect("no timeout");
            got.lock().unwrap().push(event.seq);
            Ok(())
        })
        .unwrap();
    };
    let got = Arc::new(Mutex::new(Vec::new()));
    let id = {
        let first = engine::<B>(&place, &clock);
        register(&first, got.clone());
        let id = first.enqueue(&Enqueue::new("flow", &json!({}))).unwrap().id;
        first.run_until_idle().unwrap();
        assert_eq!(run_state(&first, &id), RunState::Ready);
        id
    };
    let seq = {
        let other = engine::<B>(&place, &clock);
        let seq = other
            .append("events", &confirmed("session/7", START_MS))
            .unwrap()
            .seq;
        other.run_until_idle().unwrap();
        seq
    };
    assert_eq!(*got.lock().unwrap(), Vec::<i64>::new(), "nobody ran it yet");
    let again = engine::<B>(&place, &clock);
    register(&again, got.clone());
    again.run_until_idle().unwrap();
    assert_eq!(run_state(&again, &id), RunState::Succeeded);
    assert_eq!(*got.lock().unwrap(), vec![seq]);
}

/// A wait by a payload field matches the value as JSON.
fn a_wait_matches_a_payload_field<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let got = Arc::new(Mutex::new(None));
    let g = got.clone();
    e.register_action("ship", move |_run, ctx| {
        let m = EventMatch::new("events", "payment.received").field("order.id", 1017);
        let event = ctx.wait_for_event("paid", &m, None)?.expect("no timeout");
        *g.lock().unwrap() = Some(event.json()?["amount"].clone());
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("ship", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    let paid = |order: serde_json::Value, amount: i64| {
        NewEvent::new("payment.received", "payments", "bank", START_MS)
            .payload(&json!({ "order": { "id": order }, "amount": amount }))
    };
    e.append("events", &paid(json!("1017"), 1)).unwrap();
    e.append("events", &paid(json!(1016), 2)).unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Ready, "\"1017\" is not 1017");
    e.append("events", &paid(json!(1017), 3)).unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    assert_eq!(*got.lock().unwrap(), Some(json!(3)));
}

/// A timeout wakes once with `None`; an event after it changes nothing.
fn a_wait_times_out_once_and_a_later_event_changes_nothing<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let o = outcomes.clone();
    e.register_action("flow", move |_run, ctx| {
        let m = EventMatch::new("events", "speaker.confirmed").subject("session/1");
        let event = ctx.wait_for_event("confirmed", &m, Some(HOUR))?;
        o.lock().unwrap().push(event.is_some());
        ctx.sleep("then", HOUR)?;
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("flow", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&id).unwrap().unwrap().due_at, START_MS + 3_600_000);
    clock.advance(HOUR);
    e.run_until_idle().unwrap();
    assert_eq!(*outcomes.lock().unwrap(), vec![false]);
    // Sleeping now; the event that comes late is not received.
    e.append("events", &confirmed("session/1", START_MS))
        .unwrap();
    e.run_until_idle().unwrap();
    clock.advance(HOUR);
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    assert_eq!(*outcomes.lock().unwrap(), vec![false, false]);
    let wait = &e.run_steps(&id).unwrap()[1];
    assert_eq!(wait.output.as_deref(), Some("null"));
}

/// Children have ids from the parent and the step, so a retried parent
/// spawns nothing twice; a join waits for them all and returns their ends
/// and outputs.
fn children_are_spawned_once_and_joined_with_their_outputs<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    e.register_action("notify", |run, ctx| {
        let n = run.input::<serde_json::Value>()?["n"].as_i64().unwrap();
        if n == 3 {
            return Err("attendee 3 has no address".into());
        }
        ctx.set_output(&(n * 10))?;
        Ok(())
    })
    .unwrap();
    let failed = Arc::new(AtomicBool::new(false));
    let f = failed.clone();
    e.register_action("announce", move |_run, ctx| {
        let mut children = Vec::new();
        for n in 1..=3_i64 {
            let child = Enqueue::new("notify", &json!({ "n": n })).retry(RetryPolicy::attempts(1));
            children.push(ctx.spawn(("notify", n as u64), child)?);
        }
        if !f.swap(true, Ordering::SeqCst) {
            return Err("the parent failed after spawning".into());
        }
        let ends = ctx.join("all", &children)?;
        let total: i64 = ends
            .iter()
            .filter_map(|end| end.output::<i64>().unwrap())
            .sum();
        let dead: Vec<&str> = ends
            .iter()
            .filter(|end| end.state == RunState::Dead)
            .map(|end| end.id.as_str())
            .collect();
        ctx.set_output(&json!({ "total": total, "dead": dead }))?;
        Ok(())
    })
    .unwrap();
    let id = e
        .enqueue(&Enqueue::new("announce", &json!({})).retry(fast_retry()))
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    assert_eq!(e.runs(None, 100).unwrap().len(), 4, "three children, once");
    let child = e.run(&format!("{id}/notify/1")).unwrap().unwrap();
    assert_eq!(child.parent.as_deref(), Some(id.as_str()));
    assert_eq!(child.output.as_deref(), Some("10"));
    let out: serde_json::Value = e.run_output(&id).unwrap().unwrap();
    assert_eq!(
        out,
        json!({ "total": 30, "dead": [format!("{id}/notify/3")] })
    );
}

/// Cancelling a suspended workflow ends it at once, and its children that
/// have not ended with it.
fn cancelling_a_suspended_workflow_ends_it_and_its_children_at_once<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    e.register_action("child", |_run, ctx| {
        ctx.sleep("long", 24 * HOUR)?;
        Ok(())
    })
    .unwrap();
    e.register_action("parent", |_run, ctx| {
        let a = ctx.spawn("a", Enqueue::new("child", &json!({})))?;
        let b = ctx.spawn("b", Enqueue::new("child", &json!({})))?;
        ctx.join("both", &[a, b])?;
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("parent", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &format!("{id}/a")), RunState::Ready);
    let join = &e.run_steps(&id).unwrap()[3];
    assert_eq!(
        (join.kind, join.state),
        (StepKind::Join, StepState::Waiting)
    );
    let was = e
        .operator("ops", "the session was dropped")
        .unwrap()
        .cancel_run(&id)
        .unwrap();
    assert_eq!(was, RunState::Ready);
    for run in [id.clone(), format!("{id}/a"), format!("{id}/b")] {
        assert_eq!(run_state(&e, &run), RunState::Cancelled, "{run}");
    }
    let audit = e.audit_log(10).unwrap();
    assert_eq!(audit[0].action, AuditAction::Cancel);
    clock.advance(48 * HOUR);
    assert_eq!(e.run_until_idle().unwrap().claimed, 0);
}

/// A name met where it was not recorded is a typed error, never a silent
/// reuse: a loop that reuses a name, or code changed under a sleeping run.
fn a_step_reached_out_of_place_is_a_typed_error<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let reordered = Arc::new(AtomicBool::new(false));
    let r = reordered.clone();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let errs = errors.clone();
    e.register_action("flow", move |_run, ctx| {
        let order: &[&str] = if r.load(Ordering::SeqCst) {
            &["b", "a"]
        } else {
            &["a", "b"]
        };
        for name in order {
            if let Err(err) = ctx.step(*name, |_| Ok::<_, Error>(1)) {
                errs.lock()
                    .unwrap()
                    .push(matches!(err, Error::StepMoved { .. }));
                return Err(err.into());
            }
        }
        ctx.sleep("nap", HOUR)?;
        Ok(())
    })
    .unwrap();
    e.register_action("looping", |_run, ctx| {
        for _ in 0..2 {
            ctx.step("same", |_| Ok::<_, Error>(1))?;
        }
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("flow", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    reordered.store(true, Ordering::SeqCst);
    clock.advance(HOUR);
    e.run_until_idle().unwrap();
    assert_eq!(*errors.lock().unwrap(), vec![true]);
    let run = e.run(&id).unwrap().unwrap();
    assert_eq!(run.state, RunState::Ready, "retried by its policy");
    assert!(run.last_error.unwrap().contains("recorded at position 2"));

    let looping = e
        .enqueue(&Enqueue::new("looping", &json!({})).retry(RetryPolicy::attempts(1)))
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    let run = e.run(&looping).unwrap().unwrap();
    assert_eq!(run.state, RunState::Dead);
    assert!(run.last_error.unwrap().contains("reached already"));
    assert_eq!(
        e.run_steps(&looping).unwrap().len(),
        2,
        "begin and one step"
    );
}

/// Code changed while runs sleep: a run that recorded steps past the patch
/// point keeps the old path; a run that had not reached it takes the new.
fn patched_keeps_runs_that_passed_on_the_old_path<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let new_code = Arc::new(AtomicBool::new(false));
    let n = new_code.clone();
    let paths = Arc::new(Mutex::new(Vec::new()));
    let p = paths.clone();
    e.register_action("flow", move |run, ctx| {
        let early = run.input::<serde_json::Value>()?["early"]
            .as_bool()
            .unwrap();
        if early {
            ctx.sleep("wait-a-bit", HOUR)?;
        }
        ctx.step("a", |_| Ok::<_, Error>(()))?;
        let new = n.load(Ordering::SeqCst) && ctx.patched("sms")?;
        if new {
            ctx.step("sms", |_| Ok::<_, Error>(()))?;
        }
        ctx.sleep("later", HOUR)?;
        ctx.step("b", |_| Ok::<_, Error>(()))?;
        p.lock().unwrap().push((run.input_json().to_string(), new));
        Ok(())
    })
    .unwrap();
    let old = e
        .enqueue(&Enqueue::new("flow", &json!({ "early": false })))
        .unwrap()
        .id;
    let young = e
        .enqueue(&Enqueue::new("flow", &json!({ "early": true })))
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    new_code.store(true, Ordering::SeqCst);
    clock.advance(HOUR);
    e.run_until_idle().unwrap();
    clock.advance(HOUR);
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &old), RunState::Succeeded);
    assert_eq!(run_state(&e, &young), RunState::Succeeded);
    let mut paths = paths.lock().unwrap().clone();
    paths.sort();
    assert_eq!(
        paths,
        vec![
            (r#"{"early":false}"#.to_string(), false),
            (r#"{"early":true}"#.to_string(), true)
        ]
    );
    let kinds: Vec<StepKind> = e
        .run_steps(&young)
        .unwrap()
        .iter()
        .map(|s| s.kind)
        .collect();
    assert!(kinds.contains(&StepKind::Patch));
}

/// An operator's reset forgets a step and those after it; they run again,
/// the steps before it do not, and the reset is on the record.
fn an_operator_resets_a_run_to_a_step_and_only_the_steps_from_it_run_again<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    e.register_action("flow", move |_run, ctx| {
        for name in ["a", "b", "c"] {
            let c = c.clone();
            ctx.step(name, move |_| {
                c.lock().unwrap().push(name);
                Ok::<_, Error>(())
            })?;
        }
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("flow", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    let op = e
        .operator("ops", "the mail provider lost the batch")
        .unwrap();
    assert!(matches!(
        op.reset_run_to_step(&id, "nope"),
        Err(Error::NotFound { .. })
    ));
    op.reset_run_to_step(&id, "b").unwrap();
    assert_eq!(run_state(&e, &id), RunState::Ready);
    e.run_until_idle().unwrap();
    assert_eq!(run_state(&e, &id), RunState::Succeeded);
    assert_eq!(*calls.lock().unwrap(), vec!["a", "b", "c", "b", "c"]);
    let entry = &e.audit_log(1).unwrap()[0];
    assert_eq!(entry.action, AuditAction::ResetRunToStep);
    assert_eq!(entry.target, format!("run {id}"));
    assert!(entry.detail.contains("\"forgotten\":2"));
}

/// Bad names and outputs over the limit are typed errors; nothing is
/// recorded.
fn limits_refuse_what_a_step_cannot_record<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = engine::<B>(&place, &clock);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let errs = errors.clone();
    e.register_action("flow", move |_run, ctx| {
        let big = "x".repeat(2 * 1024 * 1024);
        let tries = [
            ctx.step("has space", |_| Ok::<_, Error>(1)).map(|_| ()),
            ctx.step("big", |_| Ok::<_, Error>(big)).map(|_| ()),
            ctx.step("fails", |_| Err::<(), _>("no")).map(|_| ()),
            ctx.wait_for_event("w", &EventMatch::new("events", "nope"), None)
                .map(|_| ()),
        ];
        let mut errs = errs.lock().unwrap();
        for t in tries {
            errs.push(match t {
                Err(Error::Invalid { field, .. }) => format!("invalid {field}"),
                Err(Error::StepFailed { step, .. }) => format!("failed {step}"),
                Err(Error::NotFound { kind, .. }) => format!("not found {kind}"),
                other => format!("{other:?}"),
            });
        }
        Ok(())
    })
    .unwrap();
    let id = e.enqueue(&Enqueue::new("flow", &json!({}))).unwrap().id;
    e.run_until_idle().unwrap();
    assert_eq!(
        *errors.lock().unwrap(),
        vec![
            "invalid step name",
            "invalid step output",
            "failed fails",
            "not found event type"
        ]
    );
    assert!(e.run_steps(&id).unwrap().is_empty(), "nothing recorded");
}
