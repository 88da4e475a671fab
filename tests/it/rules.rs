//! Rules decide exactly once per (rule, event) (DESIGN.md, invariant 4), with
//! errors contained per rule, under the workspace's evaluator lease
//! (invariant 7), with forward cursors but for recorded resets (invariant 8).
//! Each test is written once, generic over the backend, and runs on every
//! backend: `on_backends!` runs it on an SQLite temp file and — with the
//! feature `postgres` — on PostgreSQL (`name::sqlite`, `name::postgres`).

use reflexr_testkit as common;

use std::time::Duration;

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::rules::{APP_TYPES, Count, append_rsvps, every_nth, expected, fired, slow_every_nth};
use common::{children_on_backends, later, on_backends};
use reflexr::{
    ConsumerKind, Decision, Engine, Error, ManualClock, NewEvent, OnNewVersion, Query, Rule,
    RuleReset, RunState, Scope,
};
use serde::{Deserialize, Serialize};

on_backends!(
    every_decision_is_made_exactly_once_across_kills_mid_batch,
    a_stateful_rule_keeps_its_state_across_a_restart,
    rules_may_not_watch_reserved_types_and_must_be_complete,
    an_operator_replays_a_rule_and_resets_its_state_on_the_record,
    a_replay_from_zero_derives_the_same_firing_ids_and_makes_nothing_twice,
    a_replay_after_a_fix_that_fires_more_adds_only_the_new_firings_and_keeps_the_old,
    a_replay_that_fails_again_records_nothing_twice_and_one_that_succeeds_settles_the_dead_letter,
    a_pass_through_rule_fires_on_an_event_just_under_the_payload_limit,
    what_the_file_cannot_hold_is_an_evaluation_error_and_the_rule_moves_on,
    a_firing_the_file_refuses_is_an_evaluation_error_and_the_others_are_recorded,
    a_firing_whose_envelope_the_log_refuses_is_an_evaluation_error_and_the_others_are_recorded,
    a_page_of_many_firings_records_each_envelope_and_run_in_order,
    a_rule_whose_commit_keeps_failing_shows_as_stuck_until_it_moves,
    a_new_rule_version_continues_resets_its_state_or_replays_as_it_says,
    a_rule_gone_from_the_code_keeps_its_rows_until_deleted,
    a_state_reset_while_a_batch_is_being_decided_makes_it_decide_again,
    a_page_that_fires_passes_its_own_envelopes_in_its_commit,
    a_failed_decision_leaves_its_scopes_state_as_the_last_good_one_left_it,
    rules_scoped_by_one_field_each_decide_as_they_would_alone,
    rules_scoped_alike_by_a_function_the_subject_or_globally_decide_as_they_would_alone,
);

children_on_backends!(child_process_evaluator);

/// An engine on the place with the workspace `app` of the rule tests and a
/// no-op `noop` action; `clock` a new scene's (see [`later`]) unless a test
/// says otherwise.
fn rules_engine<B: TestBackend>(place: &B::Place, clock: &ManualClock, holder: &str) -> Engine<B> {
    let e = B::open(place, clock, holder);
    e.ensure_workspace("app", APP_TYPES).unwrap();
    e.register_action("noop", |_, _| Ok(())).unwrap();
    e
}

/// A place and the clock of its engines, at the round time every test
/// starts from.
fn scene<B: TestBackend>() -> (B::Place, ManualClock) {
    (B::place(), later(0))
}

/// The child's side of the crash test: evaluates slowly, in small batches,
/// until killed (or done).
fn child_process_evaluator<B: TestBackend>() {
    // Each child's clock stands an hour after the last one's, so the lease a
    // killed child held has lapsed for the next: no one waits for it.
    let hours: i64 = std::env::var("REFLEXR_HOURS").unwrap().parse().unwrap();
    let e = parent_engine::<B>(
        &Opts::new(&later(hours), &format!("child-{}", std::process::id())).evaluate_batch(7),
    );
    e.register_action("noop", |_, _| Ok(())).unwrap();
    let slow = slow_every_nth("tenth", 10);
    e.register_rule(slow).unwrap();
    println!("\nevaluating");
    e.run_until_idle().unwrap();
    println!("\ndone");
}

/// Invariant 4: state, cursor, RuleFired events and runs commit together,
/// so a process killed anywhere in a batch loses and repeats nothing.
fn every_decision_is_made_exactly_once_across_kills_mid_batch<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    {
        let e = rules_engine::<B>(&place, &clock, "test");
        append_rsvps(&e, 5, 60);
    }
    let kills: usize = std::env::var("REFLEXR_RULE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut killed = 0;
    let mut finished = false;
    for i in 0..kills * 3 {
        let mut child = child::<B>(
            &place,
            "child_process_evaluator",
            &[("REFLEXR_HOURS", (i + 1).to_string())],
        );
        assert!(child.past("evaluating"), "the child started evaluating");
        // Kill at a varying moment inside the run: 1 to 25 ms in.
        std::thread::sleep(Duration::from_millis(1 + (i as u64 * 7) % 25));
        let ended = child.kill();
        if ended.success && ended.rest.iter().any(|l| l.ends_with("done")) {
            finished = true;
            break;
        }
        killed += 1;
        if killed >= kills {
            break;
        }
    }
    assert!(killed > 0, "the child was killed at least once");
    // Whatever the kills left, a last evaluator, later than every child,
    // finishes the work.
    let e = rules_engine::<B>(&place, &later(1_000), "finisher");
    e.register_rule(every_nth("tenth", 10)).unwrap();
    let left = e.run_until_idle().unwrap().decided;

    let want = expected(&e, "tenth", 10);
    assert_eq!(want.len(), 30);
    assert_eq!(
        fired(&e),
        want,
        "each firing once (killed {killed} times, finished early: {finished})"
    );
    assert_eq!(B::count(&e, "SELECT count(*) FROM reflexr_runs"), 30);
    for s in 0..5 {
        assert_eq!(
            e.rule_state::<Count>("tenth", &s.to_string()).unwrap(),
            Some(Count { n: 60 })
        );
    }
    let rule = &e.rules().unwrap()[0];
    assert_eq!(rule.lag, 0);
    println!(
        "{killed} evaluators killed mid-batch (finished early: {finished}), {left} of 300 \
         decisions left to the last; every decision made once"
    );
}

/// Invariant 4: the state is in the database, with the cursor, and
/// survives a restart.
fn a_stateful_rule_keeps_its_state_across_a_restart<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    {
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("hundredth", 100)).unwrap();
        append_rsvps(&e, 1, 60);
        assert_eq!(e.run_until_idle().unwrap().fired, 0);
    }
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("hundredth", 100)).unwrap();
    append_rsvps(&e, 1, 40);
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired), (40, 1), "the 100th RSVP fires");
}

/// Invariant 10: a rule may not watch the engine's reserved types and must
/// be complete (types, action, decision, a valid name, a known workspace);
/// an application may not append a reserved type.
fn rules_may_not_watch_reserved_types_and_must_be_complete<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    let bad = [
        Rule::new("r", "app")
            .on(["RuleFired"])
            .action("noop")
            .decide(|_| Ok(Decision::Skip)),
        Rule::new("r", "app")
            .action("noop")
            .decide(|_| Ok(Decision::Skip)),
        Rule::new("r", "app")
            .on(["rsvp"])
            .decide(|_| Ok(Decision::Skip)),
        Rule::new("r", "app").on(["rsvp"]).action("noop"),
        Rule::new("bad name", "app")
            .on(["rsvp"])
            .action("noop")
            .decide(|_| Ok(Decision::Skip)),
    ];
    for rule in bad {
        let err = e.register_rule(rule).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
    }
    let err = e
        .register_rule(every_nth("x", 1).scope(Scope::Subject))
        .and_then(|_| {
            e.register_rule(
                Rule::new("y", "nowhere")
                    .on(["rsvp"])
                    .action("a")
                    .decide(|_| Ok(Decision::Skip)),
            )
        })
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = e
        .append("app", &NewEvent::new("RuleFired", "x", "app", 0))
        .unwrap_err();
    assert!(matches!(err, Error::ReservedType { .. }));
}

/// Invariant 8: the rule's cursor moves back only by a recorded reset.
fn an_operator_replays_a_rule_and_resets_its_state_on_the_record<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("tenth", 10)).unwrap();
    append_rsvps(&e, 1, 20);
    assert_eq!(e.run_until_idle().unwrap().fired, 2);

    e.operator("ops", "fixed the rule")
        .unwrap()
        .reset_rule("tenth", RuleReset::Replay(0))
        .unwrap();
    assert_eq!(e.rule_state::<Count>("tenth", "0").unwrap(), None);
    let idle = e.run_until_idle().unwrap();
    assert_eq!(
        (idle.decided, idle.fired),
        (20, 0),
        "decided again from the start, and the same two firings found made"
    );
    assert_eq!(e.runs(None, 100).unwrap().len(), 2, "no run made twice");
    assert_eq!(
        e.rule_state::<Count>("tenth", "0").unwrap(),
        Some(Count { n: 20 }),
        "the state is rebuilt"
    );

    e.operator("ops", "start counting again")
        .unwrap()
        .reset_rule("tenth", RuleReset::State)
        .unwrap();
    append_rsvps(&e, 1, 10);
    assert_eq!(e.run_until_idle().unwrap().fired, 1);
    let audit = e.audit_log(10).unwrap();
    assert_eq!(audit.len(), 2);
    assert!(audit.iter().all(|a| a.action.as_str() == "reset_rule"));
    let err = e
        .operator("ops", "typo")
        .unwrap()
        .reset_rule("tenth", RuleReset::Cursor(10_000))
        .unwrap_err();
    assert!(err.is_bad_input());
    let err = e
        .operator("ops", "typo")
        .unwrap()
        .reset_rule("nope", RuleReset::State)
        .unwrap_err();
    assert!(err.is_not_found());
}

/// Every RuleFired's firing id, and every run's id, sorted.
fn firing_and_run_ids<B: TestBackend>(e: &Engine<B>) -> (Vec<String>, Vec<String>) {
    let mut fired: Vec<String> = e
        .read(&Query::new("app").types(["RuleFired"]).limit(10_000))
        .unwrap()
        .iter()
        .map(|ev| {
            let p: serde_json::Value = ev.payload().unwrap();
            p["firing_id"].as_str().unwrap().to_string()
        })
        .collect();
    let mut runs: Vec<String> = e
        .runs(None, 10_000)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    fired.sort();
    runs.sort();
    (fired, runs)
}

fn counter<B: TestBackend>(e: &Engine<B>, c: reflexr::inspect::Counter) -> i64 {
    e.stats().unwrap().counter(c)
}

/// Invariant 4 across a replay: each (rule, event) fired once, with one id
/// — the idempotency key its action gave the world.
fn a_replay_from_zero_derives_the_same_firing_ids_and_makes_nothing_twice<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("tenth", 10)).unwrap();
    append_rsvps(&e, 3, 40);
    assert_eq!(e.run_until_idle().unwrap().fired, 12);
    let before = firing_and_run_ids(&e);
    assert_eq!((before.0.len(), before.1.len()), (12, 12));
    assert_eq!(before.0, before.1, "firing id = run id");
    for run in e.runs(None, 100).unwrap() {
        let event = e.event(run.event_seq.unwrap()).unwrap().unwrap();
        assert_eq!(
            run.id,
            reflexr::inspect::firing_id("tenth", &event, 0),
            "derived"
        );
    }

    e.operator("ops", "replay")
        .unwrap()
        .reset_rule("tenth", RuleReset::Replay(0))
        .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired), (120, 0));
    assert_eq!(
        firing_and_run_ids(&e),
        before,
        "the same N firings, the same ids"
    );
    assert_eq!(counter(&e, reflexr::inspect::Counter::ReplayExisting), 12);
    assert_eq!(fired(&e), expected(&e, "tenth", 10), "each once");
}

/// Invariant 4: a firing the new code makes and the old did not is made;
/// one the old code made and the new does not is kept as it was.
fn a_replay_after_a_fix_that_fires_more_adds_only_the_new_firings_and_keeps_the_old<
    B: TestBackend,
>() {
    let (place, clock) = scene::<B>();
    {
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("nth", 10)).unwrap();
        append_rsvps(&e, 1, 30);
        assert_eq!(e.run_until_idle().unwrap().fired, 3);
    }
    let (old_fired, old_runs) = {
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("nth", 10)).unwrap();
        firing_and_run_ids(&e)
    };
    // Version 2 fires on every 4th: the 4th, 8th, …, 28th (7 of them), of
    // which the 20th is shared with version 1; the 10th and 30th are not.
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("nth", 4).version(2, OnNewVersion::Replay))
        .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired), (30, 6), "only the new ones");
    assert_eq!(
        counter(&e, reflexr::inspect::Counter::ReplayExisting),
        1,
        "the 20th"
    );
    assert_eq!(
        counter(&e, reflexr::inspect::Counter::ReplayKept),
        2,
        "the 10th and the 30th"
    );
    let (fired_now, runs_now) = firing_and_run_ids(&e);
    assert_eq!((fired_now.len(), runs_now.len()), (9, 9));
    assert!(old_fired.iter().all(|id| fired_now.contains(id)));
    assert!(old_runs.iter().all(|id| runs_now.contains(id)));
    assert!(
        e.runs(None, 100)
            .unwrap()
            .iter()
            .all(|r| r.state == reflexr::RunState::Succeeded),
        "old runs left as they were, new ones run"
    );
}

/// Invariant 4 for errors: RuleErrored ids derive like firing ids, so a
/// replay that fails again records nothing twice, and one that succeeds
/// settles the dead letter.
fn a_replay_that_fails_again_records_nothing_twice_and_one_that_succeeds_settles_the_dead_letter<
    B: TestBackend,
>() {
    let (place, clock) = scene::<B>();
    let broken = |fail: bool| {
        Rule::new("picky", "app")
            .on(["rsvp"])
            .action("noop")
            .decide(move |ev| {
                let p: serde_json::Value = ev.payload()?;
                if fail && p["guest"] == 1 {
                    return Err("guest 1 breaks the rule".into());
                }
                Ok(Decision::Skip)
            })
    };
    {
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(broken(true)).unwrap();
        append_rsvps(&e, 1, 3);
        assert_eq!(e.run_until_idle().unwrap().errored, 1);
        let dl = &e.dead_letters(false, 10).unwrap()[0];
        e.operator("ops", "looking into it")
            .unwrap()
            .discard_dead_letter(dl.id)
            .unwrap();
        e.operator("ops", "again")
            .unwrap()
            .reset_rule("picky", RuleReset::Replay(0))
            .unwrap();
        assert_eq!(e.run_until_idle().unwrap().errored, 1);
        let errored = e.read(&Query::new("app").types(["RuleErrored"])).unwrap();
        assert_eq!(errored.len(), 1, "the same RuleErrored, not a second");
        let open = e.dead_letters(false, 10).unwrap();
        assert_eq!(open.len(), 1, "failing again opens its dead letter again");
    }
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(broken(false).version(2, OnNewVersion::Replay))
        .unwrap();
    assert_eq!(e.run_until_idle().unwrap().errored, 0);
    assert!(
        e.dead_letters(false, 10).unwrap().is_empty(),
        "decided without error now: the dead letter is settled"
    );
    let all = e.dead_letters(true, 10).unwrap();
    assert_eq!(
        all[0].resolution,
        Some(reflexr::inspect::Resolution::Retried)
    );
}

/// Invariant 4 and "nothing wedges a rule": the input counts against the
/// payload limit; RuleFired's wrapper around it does not.
fn a_pass_through_rule_fires_on_an_event_just_under_the_payload_limit<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(
        Rule::new("pass-through", "app")
            .on(["other"])
            .action("noop")
            .decide(|ev| Ok(Decision::Fire(ev.payload()?))),
    )
    .unwrap();
    let blob = "x".repeat((1 << 20) - 100);
    e.append(
        "app",
        &NewEvent::new("other", "big", "app", 0).payload(&serde_json::json!({ "b": blob })),
    )
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.fired, idle.errored, idle.succeeded), (1, 0, 1));
    let fired = e.read(&Query::new("app").types(["RuleFired"])).unwrap();
    assert!(
        fired[0].payload_json().len() > 1 << 20,
        "over the limit by its wrapper"
    );
    assert_eq!(e.rules().unwrap()[0].lag, 0);
}

/// A state whose serialisation fails (serde_json wants string keys).
#[derive(Clone, Default, Serialize, Deserialize)]
struct Unstorable {
    #[serde(default)]
    by_pair: std::collections::HashMap<(u8, u8), u8>,
}

/// Invariant 4 with errors per rule (ADR-0005): an input over the limit or
/// too deep, a scope too long, a state that cannot be stored, a decision
/// error of a megabyte — each a RuleErrored and a dead letter for its
/// event, and the rule's cursor moves past them all; an input as deep as
/// the limit allows fires.
fn what_the_file_cannot_hold_is_an_evaluation_error_and_the_rule_moves_on<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    let deep = (0..300).fold(serde_json::json!(1), |v, _| serde_json::json!([v]));
    // As deep as the limit allows: it fires (serde_json's parse, which
    // stops at 128 levels, once refused it in the firing's envelope).
    let at_limit = (0..reflexr::limits::MAX_JSON_DEPTH)
        .fold(serde_json::json!(1), |v, _| serde_json::json!([v]));
    let at_limit_text = at_limit.to_string();
    e.register_rule(
        Rule::new("fussy", "app")
            .on(["other"])
            .scope(Scope::with(|ev| {
                Some(if ev.subject == "long-scope" {
                    "s".repeat(5_000)
                } else {
                    ev.subject.clone()
                })
            }))
            .action("noop")
            .decide_with_state(Unstorable::default(), move |ev, state| {
                Ok(match ev.subject.as_str() {
                    "too-big" => Decision::Fire(serde_json::json!("y".repeat(2 << 20))),
                    "too-deep" => Decision::Fire(deep.clone()),
                    "deep-enough" => Decision::Fire(at_limit.clone()),
                    "unstorable" => {
                        state.by_pair.insert((1, 2), 3);
                        Decision::Skip
                    }
                    "long-error" => return Err("e".repeat(1 << 20).into()),
                    _ => Decision::fire(&serde_json::json!({ "ok": ev.subject })),
                })
            }),
    )
    .unwrap();
    let subjects = [
        "fine-1",
        "too-big",
        "too-deep",
        "deep-enough",
        "long-scope",
        "unstorable",
        "long-error",
        "fine-2",
    ];
    e.write(|tx| {
        for s in subjects {
            tx.append("app", &NewEvent::new("other", s, "app", 0))?;
        }
        Ok(())
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired, idle.errored), (8, 3, 5));
    let inputs: Vec<String> = e
        .runs(None, 10)
        .unwrap()
        .into_iter()
        .map(|r| r.input)
        .collect();
    assert!(inputs.contains(&at_limit_text), "{}", inputs.len());
    assert_eq!(
        e.rules().unwrap()[0].lag,
        0,
        "the rule moved past every one"
    );
    let mut reasons: Vec<(String, String)> = e
        .dead_letters(false, 10)
        .unwrap()
        .into_iter()
        .map(|d| {
            assert!(
                d.error.len() <= reflexr::limits::MAX_ERROR_BYTES,
                "{}",
                d.error.len()
            );
            (d.reason.to_string(), d.error.chars().take(40).collect())
        })
        .collect();
    reasons.sort();
    let got: Vec<&str> = reasons.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        got,
        [
            "decision_error",
            "input_refused",
            "input_refused",
            "scope_too_long",
            "state_refused"
        ],
        "{reasons:?}"
    );
    let errored = e.read(&Query::new("app").types(["RuleErrored"])).unwrap();
    assert_eq!(errored.len(), 5);
}

/// Invariant 4 with errors per (rule, event): a decision that fails — an
/// error, a panic, an input the file cannot hold — after changing its copy
/// of the scope's state changes nothing; the next decision of the scope, in
/// the same batch, starts from the state the last good one left. (A
/// batch's decisions make their copies in one reused box.)
fn a_failed_decision_leaves_its_scopes_state_as_the_last_good_one_left_it<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(
        Rule::new("careful", "app")
            .on(["other"])
            .scope(Scope::payload("session"))
            .action("noop")
            .decide_with_state(Count::default(), move |ev, state| {
                // Every decision counts, then some fail after counting.
                state.n += 100;
                let how = ev.json()?["how"].as_str().unwrap_or_default().to_string();
                match how.as_str() {
                    "error" => Err("refused after counting".into()),
                    "panic" => panic!("panicked after counting"),
                    "too-big" => Ok(Decision::Fire(serde_json::json!("y".repeat(2 << 20)))),
                    _ => {
                        state.n -= 99;
                        Ok(Decision::fire(&serde_json::json!({ "n": state.n })))
                    }
                }
            }),
    )
    .unwrap();
    let hows = [
        "ok", "error", "ok", "panic", "panic", "ok", "too-big", "error", "ok",
    ];
    e.write(|tx| {
        for (i, how) in hows.iter().enumerate() {
            for session in ["a", "b"] {
                tx.append(
                    "app",
                    &NewEvent::new("other", format!("{session}/{i}"), "app", 0)
                        .payload(&serde_json::json!({ "session": session, "how": how })),
                )?;
            }
        }
        Ok(())
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired, idle.errored), (18, 8, 10));
    for session in ["a", "b"] {
        assert_eq!(
            e.rule_state::<Count>("careful", session).unwrap(),
            Some(Count { n: 4 }),
            "{session}: four good decisions, each one up"
        );
    }
    // Each firing carries the count its good decision reached: 1, 2, 3, 4.
    let mut inputs: Vec<u64> = e
        .runs(None, 100)
        .unwrap()
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(&r.input).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    inputs.sort_unstable();
    assert_eq!(inputs, [1, 1, 2, 2, 3, 3, 4, 4]);
}

/// A rule of `app` watching `types`, scoped by `scope`, counting each
/// scope's events in its state and firing nothing.
fn counting(name: &str, types: &[&str], scope: Scope) -> Rule {
    Rule::new(name, "app")
        .on(types.iter().copied())
        .scope(scope)
        .action("noop")
        .decide_with_state(Count::default(), |_, state| {
            state.n += 1;
            Ok(Decision::Skip)
        })
}

/// What `rule` counted for `scope` (0: no state).
fn count_of<B: TestBackend>(e: &Engine<B>, rule: &str, scope: &str) -> u32 {
    e.rule_state::<Count>(rule, scope)
        .unwrap()
        .map_or(0, |c| c.n)
}

/// The open dead letters as (consumer, reason), sorted.
fn dead_letter_reasons<B: TestBackend>(e: &Engine<B>) -> Vec<(String, String)> {
    let mut dead: Vec<(String, String)> = e
        .dead_letters(false, 10)
        .unwrap()
        .into_iter()
        .map(|d| (d.consumer, d.reason.to_string()))
        .collect();
    dead.sort();
    dead
}

/// Invariant 4 with rules side by side: rules scoped by the same payload
/// field, watching different types, each find every event's scope (or its
/// error) as they would alone — a batch finds a field's scopes once for all
/// of them — and each records its own errors.
fn rules_scoped_by_one_field_each_decide_as_they_would_alone<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    let by_session = |name: &str, types: &[&str]| counting(name, types, Scope::payload("session"));
    e.register_rule(by_session("rsvps", &["rsvp"])).unwrap();
    e.register_rule(by_session("both", &["rsvp", "other"]))
        .unwrap();
    e.register_rule(by_session("others", &["other"])).unwrap();
    let long = "s".repeat(5_000);
    e.write(|tx| {
        for (ty, session) in [
            ("rsvp", serde_json::json!(1)),
            ("other", serde_json::json!("b")),
            ("rsvp", serde_json::json!("b")),
            ("other", serde_json::json!(null)),
            ("rsvp", serde_json::json!(long)),
            ("other", serde_json::json!(1)),
            ("rsvp", serde_json::json!(1)),
        ] {
            tx.append(
                "app",
                &NewEvent::new(ty, "s", "app", 0)
                    .payload(&serde_json::json!({ "session": session })),
            )?;
        }
        Ok(())
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    // rsvps: 4 rsvps, one too long; others: 3 others, one null; both: all 7.
    assert_eq!((idle.decided, idle.errored), (14, 4));
    let state = |rule: &str, scope: &str| count_of(&e, rule, scope);
    assert_eq!((state("rsvps", "1"), state("rsvps", "b")), (2, 1));
    assert_eq!((state("others", "1"), state("others", "b")), (1, 1));
    assert_eq!((state("both", "1"), state("both", "b")), (3, 2));
    assert_eq!(
        dead_letter_reasons(&e),
        [
            ("both".to_string(), "missing_scope".to_string()),
            ("both".to_string(), "scope_too_long".to_string()),
            ("others".to_string(), "missing_scope".to_string()),
            ("rsvps".to_string(), "scope_too_long".to_string()),
        ]
    );
}

/// Invariant 4 with rules side by side, for the other ways of scoping: two
/// rules sharing one scope function (a page finds each event's scope once
/// for both: the function is called once an event), a rule with a function
/// of its own, and pairs of rules scoped by the subject and globally,
/// watching different types of one page, each keep the states they would
/// keep alone, and each records its own missing scopes.
fn rules_scoped_alike_by_a_function_the_subject_or_globally_decide_as_they_would_alone<
    B: TestBackend,
>() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    // The session's text, upper-cased; none for a number.
    let calls = Arc::new(AtomicUsize::new(0));
    let upper = {
        let calls = Arc::clone(&calls);
        Scope::with(move |ev| {
            calls.fetch_add(1, Ordering::SeqCst);
            ev.json().ok()?["session"].as_str().map(str::to_uppercase)
        })
    };
    let own = Scope::with(|ev| Some(format!("own-{}", ev.subject)));
    let all: &[&str] = &["rsvp", "other"];
    for rule in [
        counting("fn-rsvps", &["rsvp"], upper.clone()),
        counting("fn-all", all, upper),
        counting("fn-own", all, own),
        counting("subjects", &["other"], Scope::subject()),
        counting("subjects-all", all, Scope::subject()),
        counting("global", &["rsvp"], Scope::global()),
        counting("global-all", all, Scope::global()),
    ] {
        e.register_rule(rule).unwrap();
    }
    e.write(|tx| {
        for (ty, subject, session) in [
            ("rsvp", "s1", serde_json::json!("a")),
            ("other", "s2", serde_json::json!("b")),
            ("rsvp", "s2", serde_json::json!(7)),
            ("other", "s1", serde_json::json!("a")),
            ("rsvp", "s1", serde_json::json!("b")),
        ] {
            tx.append(
                "app",
                &NewEvent::new(ty, subject, "app", 0)
                    .payload(&serde_json::json!({ "session": session })),
            )?;
        }
        Ok(())
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    // fn-rsvps 3, fn-all 5, fn-own 5, subjects 2, subjects-all 5, global 3,
    // global-all 5; the rsvp of session 7 has no upper-cased scope, for
    // either rule of the shared function.
    assert_eq!((idle.decided, idle.errored), (28, 2));
    // Once an event for both rules (3 + 5 calls were it asked for each).
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    let state = |rule: &str, scope: &str| count_of(&e, rule, scope);
    assert_eq!((state("fn-rsvps", "A"), state("fn-rsvps", "B")), (1, 1));
    assert_eq!((state("fn-all", "A"), state("fn-all", "B")), (2, 2));
    assert_eq!(
        (state("fn-own", "own-s1"), state("fn-own", "own-s2")),
        (3, 2)
    );
    assert_eq!((state("subjects", "s1"), state("subjects", "s2")), (1, 1));
    assert_eq!(
        (state("subjects-all", "s1"), state("subjects-all", "s2")),
        (3, 2)
    );
    assert_eq!((state("global", ""), state("global-all", "")), (3, 5));
    assert_eq!(
        dead_letter_reasons(&e),
        [
            ("fn-all".to_string(), "missing_scope".to_string()),
            ("fn-rsvps".to_string(), "missing_scope".to_string()),
        ]
    );
}

/// Invariant 4 with errors per (rule, event): a firing whose run cannot be
/// recorded (here an application trigger refuses one scope's runs) becomes
/// a RuleErrored and a dead letter; the batch's other firings, its state
/// and its cursor commit as decided.
fn a_firing_the_file_refuses_is_an_evaluation_error_and_the_others_are_recorded<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("each", 1)).unwrap();
    B::refuse(
        &e,
        "no_runs_for_1",
        "INSERT ON reflexr_runs",
        "NEW.scope = '1'",
        "no runs for session 1",
    );
    append_rsvps(&e, 3, 2);
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired, idle.errored), (6, 4, 2));
    let runs: Vec<String> = e
        .runs(None, 10)
        .unwrap()
        .into_iter()
        .map(|r| r.scope.unwrap())
        .collect();
    assert_eq!(runs.len(), 4);
    assert!(runs.iter().all(|scope| scope != "1"));
    let dead = e.dead_letters(false, 10).unwrap();
    assert_eq!(dead.len(), 2);
    assert!(
        dead.iter()
            .all(|d| d.reason == reflexr::inspect::Reason::FiringRefused
                && d.error.contains("no runs for session 1")),
        "{dead:?}"
    );
    assert_eq!(
        e.read(&Query::new("app").types(["RuleFired"]))
            .unwrap()
            .len(),
        4,
        "a refused firing leaves no RuleFired behind"
    );
    assert_eq!(
        e.rule_state::<Count>("each", "1").unwrap(),
        Some(Count { n: 2 })
    );
    assert_eq!(e.rules().unwrap()[0].lag, 0);
}

/// Invariant 4 with errors per (rule, event), for the envelopes (on
/// PostgreSQL a batch's `RuleFired` envelopes are one statement, which a
/// refusal fails as a whole: the batch is written again one firing at a
/// time to find the one to blame; on SQLite each is an insert of its
/// own). A firing whose envelope
/// the log refuses (an application trigger, here, on one scope's) becomes
/// a RuleErrored and a dead letter; the others, the state and the cursor
/// commit as decided.
fn a_firing_whose_envelope_the_log_refuses_is_an_evaluation_error_and_the_others_are_recorded<
    B: TestBackend,
>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("each", 1)).unwrap();
    B::refuse(
        &e,
        "no_envelopes_for_1",
        "INSERT ON reflexr_events",
        "NEW.type = 'RuleFired' AND NEW.payload LIKE '%\"scope\":\"1\"%'",
        "no envelopes for session 1",
    );
    append_rsvps(&e, 3, 2);
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired, idle.errored), (6, 4, 2));
    let mut scopes: Vec<String> = e
        .runs(None, 10)
        .unwrap()
        .into_iter()
        .map(|r| r.scope.unwrap())
        .collect();
    scopes.sort();
    assert_eq!(scopes, ["0", "0", "2", "2"]);
    let dead = e.dead_letters(false, 10).unwrap();
    assert_eq!(dead.len(), 2);
    assert!(
        dead.iter()
            .all(|d| d.reason == reflexr::inspect::Reason::FiringRefused
                && d.error.contains("no envelopes for session 1")),
        "{dead:?}"
    );
    let fired = e.read(&Query::new("app").types(["RuleFired"])).unwrap();
    assert_eq!(fired.len(), 4);
    // Dense seqs: the refused envelopes took none.
    let all = e.read(&Query::new("app")).unwrap();
    let seqs: Vec<i64> = all.iter().map(|ev| ev.seq).collect();
    assert_eq!(seqs, (1..=all.len() as i64).collect::<Vec<_>>());
    assert_eq!(
        e.rule_state::<Count>("each", "1").unwrap(),
        Some(Count { n: 2 })
    );
    assert_eq!(e.rules().unwrap()[0].lag, 0);
}

/// Invariants 1, 4 and 6 for a page of many firings (600, written a few
/// hundred at a time on PostgreSQL): each firing's `RuleFired` envelope at
/// the next dense seq, in the order of the events it fired on; its run
/// made in that order too; each scope's first run the head of its lane and
/// ready, the others waiting behind it.
fn a_page_of_many_firings_records_each_envelope_and_run_in_order<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    // An action with no handler here: the runs stay as they were made.
    e.register_rule(every_nth("each", 1).action("later"))
        .unwrap();
    append_rsvps(&e, 3, 200);
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired, idle.errored), (600, 600, 0));
    let fired = e
        .read(&Query::new("app").types(["RuleFired"]).limit(1_000))
        .unwrap();
    let seqs: Vec<i64> = fired.iter().map(|ev| ev.seq).collect();
    assert_eq!(
        seqs,
        (601..=1_200).collect::<Vec<_>>(),
        "dense, after the events"
    );
    let on: Vec<i64> = fired
        .iter()
        .map(|ev| ev.json().unwrap()["event_seq"].as_i64().unwrap())
        .collect();
    assert_eq!(on, (1..=600).collect::<Vec<_>>(), "in the events' order");
    let mut runs = e.runs(None, 1_000).unwrap();
    runs.sort_by_key(|r| r.position);
    let made: Vec<i64> = runs.iter().map(|r| r.event_seq.unwrap()).collect();
    assert_eq!(made, (1..=600).collect::<Vec<_>>(), "made in order");
    for scope in ["0", "1", "2"] {
        let states: Vec<RunState> = runs
            .iter()
            .filter(|r| r.scope.as_deref() == Some(scope))
            .map(|r| r.state)
            .collect();
        assert_eq!(states.len(), 200);
        assert_eq!(states[0], RunState::Ready, "scope {scope}");
        assert!(
            states[1..].iter().all(|s| *s == RunState::Waiting),
            "scope {scope}"
        );
    }
}

/// Invariant 8 and "nothing wedges a rule silently": a commit that fails
/// again and again at one position leaves the cursor where it is, counted
/// and shown with its error, until it moves.
fn a_rule_whose_commit_keeps_failing_shows_as_stuck_until_it_moves<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("tenth", 10)).unwrap();
    B::refuse(
        &e,
        "no_rule_moves",
        "UPDATE OF position ON reflexr_cursors",
        "NEW.kind = 'rule'",
        "rules may not move today",
    );
    append_rsvps(&e, 1, 5);
    for _ in 0..3 {
        assert_eq!(e.run_until_idle().unwrap().decided, 0);
    }
    let cursor = e
        .cursors()
        .unwrap()
        .into_iter()
        .find(|c| c.kind == ConsumerKind::Rule)
        .unwrap();
    assert!(cursor.is_stuck(), "{cursor:?}");
    assert_eq!((cursor.position, cursor.failures), (0, 3));
    assert!(
        cursor
            .last_error
            .as_deref()
            .unwrap()
            .contains("rules may not move today")
    );
    assert_eq!(stuck(&e), 1);
    assert_eq!(
        e.stats()
            .unwrap()
            .counter(reflexr::inspect::Counter::ConsumerFailures),
        3
    );

    B::allow(&e, "no_rule_moves", "reflexr_cursors");
    assert_eq!(e.run_until_idle().unwrap().decided, 5);
    assert_eq!(stuck(&e), 0);
}

/// How many consumers are stuck, as the engine shows them on every backend
/// (`Engine::cursors`); on SQLite also as its view `reflexr_stuck_consumers`
/// shows them, which must agree (the view is SQLite's alone).
fn stuck<B: TestBackend>(e: &Engine<B>) -> i64 {
    let shown = e.cursors().unwrap().iter().filter(|c| c.is_stuck()).count() as i64;
    if B::NAME == "sqlite" {
        let in_view = B::count(e, "SELECT count(*) FROM reflexr_stuck_consumers");
        assert_eq!(in_view, shown, "the view agrees with the engine");
    }
    shown
}

/// Invariant 4 across versions: a new version continues, resets its state
/// or replays from the start, as it says; the same version again replays
/// nothing.
fn a_new_rule_version_continues_resets_its_state_or_replays_as_it_says<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let run = |version: u32, on_new: OnNewVersion| {
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("tenth", 10).version(version, on_new))
            .unwrap();
        append_rsvps(&e, 1, 5);
        e.run_until_idle().unwrap()
    };
    assert_eq!(run(1, OnNewVersion::Continue).decided, 5);
    assert_eq!(
        run(2, OnNewVersion::Continue).fired,
        1,
        "5 + 5: the state went on"
    );
    let idle = run(3, OnNewVersion::ResetState);
    assert_eq!((idle.decided, idle.fired), (5, 0), "counting from 0 again");
    let idle = run(4, OnNewVersion::Replay);
    assert_eq!(
        (idle.decided, idle.fired),
        (20, 1),
        "all 20 decided again from a fresh state: the 10th's firing was made by \
         version 2, the 20th's is new"
    );
    let idle = run(4, OnNewVersion::Replay);
    assert_eq!(idle.decided, 5, "the same version again: nothing replayed");
}

/// Invariant 8: a rule no longer registered keeps its cursor, state and
/// runs until an operator deletes it on the record; its runs stay.
fn a_rule_gone_from_the_code_keeps_its_rows_until_deleted<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    {
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("retired", 10)).unwrap();
        append_rsvps(&e, 1, 15);
        e.run_until_idle().unwrap();
    }
    let e = rules_engine::<B>(&place, &clock, "test");
    let rules = e.rules().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!((rules[0].registered_here, rules[0].cursor), (false, 16));
    assert_eq!(
        e.rule_state::<Count>("retired", "0").unwrap(),
        Some(Count { n: 15 })
    );
    e.operator("ops", "the feature is gone")
        .unwrap()
        .delete_rule("retired")
        .unwrap();
    assert!(e.rules().unwrap().is_empty());
    assert_eq!(e.rule_state::<Count>("retired", "0").unwrap(), None);
    assert_eq!(e.runs(None, 10).unwrap().len(), 1, "its runs stay");
    assert!(
        e.cursors()
            .unwrap()
            .iter()
            .all(|c| c.kind != ConsumerKind::Rule)
    );
}

/// Invariant 4 under an operator: the batch's commit checks that nothing
/// moved the cursor or reset the state since it read them.
fn a_state_reset_while_a_batch_is_being_decided_makes_it_decide_again<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    let e = rules_engine::<B>(&place, &clock, "test");
    let operator = B::open(&place, &clock, "operator");
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trigger = std::sync::Arc::clone(&armed);
    e.register_rule(
        Rule::new("third", "app")
            .on(["rsvp"])
            .scope(Scope::payload("session"))
            .action("noop")
            .decide_with_state(Count::default(), move |_, state| {
                if trigger.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    // An operator resets the state between this batch's read
                    // and its commit.
                    operator
                        .operator("ops", "start over")
                        .unwrap()
                        .reset_rule("third", RuleReset::State)
                        .unwrap();
                }
                state.n += 1;
                Ok(if state.n.is_multiple_of(3) {
                    Decision::fire(&state.n)
                } else {
                    Decision::Skip
                })
            }),
    )
    .unwrap();
    append_rsvps(&e, 1, 2);
    e.run_until_idle().unwrap();
    assert_eq!(
        e.rule_state::<Count>("third", "0").unwrap(),
        Some(Count { n: 2 })
    );

    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    append_rsvps(&e, 1, 3);
    e.run_until_idle().unwrap();
    // Decided again from the reset state: 3 new RSVPs, one firing on the 3rd.
    assert_eq!(
        e.rule_state::<Count>("third", "0").unwrap(),
        Some(Count { n: 3 })
    );
    let fired = fired(&e);
    assert_eq!(fired.len(), 1);
    assert_eq!(
        fired.keys().next().unwrap().1,
        5,
        "the 5th RSVP, counted from the reset"
    );
}

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use common::rules::{Count, append_rsvps, every_nth, expected, fired, job, on_job};
    use reflexr::{
        Decision, ManualClock, NewEvent, OnDeadLetter, Query, RetryPolicy, Rule, RunState, Scope,
        Start,
    };
    use reflexr_testkit as common;
    use serde_json::{Value, json};
    use std::sync::Arc;
    use std::time::Duration;

    on_backends!(
        a_stateful_rule_fires_exactly_what_an_independent_fold_predicts,
        a_rule_added_later_catches_up_and_one_starting_at_the_head_does_not,
        a_failing_rule_does_not_hold_back_another,
        only_the_lease_holder_evaluates_and_another_takes_over_when_renewal_stops,
        a_rule_fires_a_run_whose_events_another_rule_decides,
        a_chain_of_rules_stops_at_the_depth_limit_with_a_dead_letter,
        block_holds_the_scope_until_an_operator_unblocks_it,
        continue_lets_the_scope_go_on_after_a_dead_run,
        a_retry_waiting_for_its_backoff_holds_back_only_its_own_scope,
    );

    /// Invariant 4: a stateful rule fires exactly what an independent fold
    /// over the log predicts, its state per scope saved with its cursor, and
    /// each firing's id is its run's.
    fn a_stateful_rule_fires_exactly_what_an_independent_fold_predicts<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("tenth", 10)).unwrap();
        append_rsvps(&e, 3, 35);
        let idle = e.run_until_idle().unwrap();
        assert_eq!(idle.decided, 105);
        assert_eq!(idle.fired, 9);
        assert_eq!(idle.succeeded, 9, "every firing's run ran");
        assert_eq!(fired(&e), expected(&e, "tenth", 10));
        assert_eq!(
            e.rule_state::<Count>("tenth", "1").unwrap(),
            Some(Count { n: 35 })
        );
        let runs = e.runs(None, 100).unwrap();
        assert_eq!(runs.len(), 9);
        for ev in e.read(&Query::new("app").types(["RuleFired"])).unwrap() {
            let p: Value = ev.payload().unwrap();
            let id = p["firing_id"].as_str().unwrap();
            assert_eq!(ev.id, format!("{id}:fired"));
            assert!(runs.iter().any(|r| r.id == id));
        }
        assert_eq!(e.run_until_idle().unwrap().decided, 0, "nothing twice");
        let rules = e.rules().unwrap();
        assert_eq!((rules.len(), rules[0].lag), (1, 0));
    }

    /// Invariant 8: a rule registered later starts at the beginning and
    /// catches up; one that starts at the head decides only what comes after.
    fn a_rule_added_later_catches_up_and_one_starting_at_the_head_does_not<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("early", 10)).unwrap();
        append_rsvps(&e, 2, 20);
        e.run_until_idle().unwrap();
        drop(e);

        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("early", 10)).unwrap();
        e.register_rule(every_nth("late", 10)).unwrap();
        e.register_rule(every_nth("from-now", 10).start(Start::Head))
            .unwrap();
        append_rsvps(&e, 2, 10);
        e.run_until_idle().unwrap();
        let f = fired(&e);
        let of = |rule: &str| f.keys().filter(|(r, _)| r == rule).count();
        assert_eq!(of("early"), 6);
        assert_eq!(of("late"), 6, "caught up on all 60 events");
        assert_eq!(of("from-now"), 2, "only the 20 events after it");
    }

    /// Errors are contained per rule: a decision that fails or panics, or an
    /// event without a scope, is a `RuleErrored` event and a dead letter, and
    /// the rule moves on; the other rules are not held back.
    fn a_failing_rule_does_not_hold_back_another<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("healthy", 5)).unwrap();
        e.register_rule(
            Rule::new("broken", "app")
                .on(["rsvp"])
                .scope(Scope::payload("session"))
                .action("noop")
                .decide(|ev| {
                    let p: Value = ev.payload()?;
                    match p["guest"].as_u64().unwrap() % 3 {
                        0 => Err("the guest list is unreachable".into()),
                        1 => panic!("a bug in the rule"),
                        _ => Ok(Decision::Skip),
                    }
                }),
        )
        .unwrap();
        e.register_rule(
            Rule::new("scopeless", "app")
                .on(["rsvp"])
                .scope(Scope::payload("no_such_field"))
                .action("noop")
                .decide(|_| Ok(Decision::Skip)),
        )
        .unwrap();
        append_rsvps(&e, 1, 9);
        let idle = e.run_until_idle().unwrap();
        assert_eq!(idle.fired, 1, "the healthy rule fired on its 5th event");
        assert_eq!(idle.errored, 6 + 9);
        let letters = e.dead_letters(false, 100).unwrap();
        let reasons = |consumer: &str| {
            let mut v: Vec<String> = letters
                .iter()
                .filter(|d| d.consumer == consumer)
                .map(|d| d.reason.to_string())
                .collect();
            v.sort();
            v.dedup();
            v
        };
        assert_eq!(reasons("broken"), ["decision_error", "decision_panic"]);
        assert_eq!(reasons("scopeless"), ["missing_scope"]);
        let errored = e.read(&Query::new("app").types(["RuleErrored"])).unwrap();
        assert_eq!(errored.len(), 15);
        for rule in e.rules().unwrap() {
            assert_eq!(rule.lag, 0, "{} moved on", rule.name);
        }
        // Decided again (nothing new): no error recorded twice.
        assert_eq!(e.run_until_idle().unwrap().errored, 0);
        assert_eq!(e.dead_letters(false, 100).unwrap().len(), letters.len());
    }

    /// Invariants 7 (fencing) and 4 (exactly once) across two engines: only
    /// the holder of the workspace's evaluator lease decides; when it stops
    /// renewing, the other takes over at the next generation, and the one that
    /// comes back decides nothing.
    fn only_the_lease_holder_evaluates_and_another_takes_over_when_renewal_stops<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let a = rules_engine::<B>(&place, &clock, "engine-a");
        let b = rules_engine::<B>(&place, &clock, "engine-b");
        for e in [&a, &b] {
            e.register_rule(every_nth("tenth", 10)).unwrap();
        }
        append_rsvps(&a, 1, 10);
        assert_eq!(a.run_until_idle().unwrap().fired, 1);
        append_rsvps(&a, 1, 10);
        assert_eq!(
            b.run_until_idle().unwrap().decided,
            0,
            "b does not hold the lease"
        );
        assert_eq!(a.run_until_idle().unwrap().fired, 1);
        append_rsvps(&a, 1, 10);
        clock.advance(Duration::from_secs(31));
        let idle = b.run_until_idle().unwrap();
        assert_eq!((idle.decided, idle.fired), (10, 1));
        let lease = b
            .leases()
            .unwrap()
            .into_iter()
            .find(|l| l.name == "evaluator/app")
            .unwrap();
        assert_eq!((lease.holder.as_str(), lease.generation), ("engine-b", 2));
        append_rsvps(&a, 1, 10);
        assert_eq!(a.run_until_idle().unwrap().decided, 0);
        assert_eq!(b.run_until_idle().unwrap().fired, 1);
        assert_eq!(fired(&a), expected(&a, "tenth", 10));
    }

    /// The loop of the design: an event fires a rule; its run emits an event
    /// (its id derived from the run's, its causation the firing event); a
    /// second rule decides that one and fires a run of its own — all from one
    /// drain, each exactly once.
    fn a_rule_fires_a_run_whose_events_another_rule_decides<B: TestBackend>() {
        let (_place, _clock, e) = setup::<B>();
        e.register_action("make-gone", |run, ctx| {
            let p: Value = run.input()?;
            let id = p["id"].as_str().unwrap().to_string();
            ctx.emit(
                "gone",
                NewEvent::new("thing.gone", format!("thing/{id}"), "mover", 2_000),
            )?;
            Ok(())
        })
        .unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        e.register_action("note", move |run, _| {
            s.lock().unwrap().push(run.event_id.clone().unwrap());
            Ok(())
        })
        .unwrap();
        e.register_rule(
            Rule::new("mover", "app")
                .on(["thing.made"])
                .action("make-gone")
                .decide(|ev| Ok(Decision::fire(&ev.payload::<Value>()?))),
        )
        .unwrap();
        e.register_rule(
            Rule::new("noter", "app")
                .on(["thing.gone"])
                .action("note")
                .decide(|_| Ok(Decision::fire(&json!({})))),
        )
        .unwrap();
        e.append("app", &made("t-1")).unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!((idle.fired, idle.succeeded), (2, 2));
        let gone = e.read(&Query::new("app").types(["thing.gone"])).unwrap();
        assert_eq!(gone.len(), 1);
        assert!(gone[0].id.ends_with("/gone"));
        assert_eq!(*seen.lock().unwrap(), [gone[0].id.clone()]);
        assert_eq!(e.run_until_idle().unwrap().fired, 0);
    }

    /// Rules that trigger each other stop at the chain depth limit: the firing
    /// whose run would go deeper is a dead run with a `depth_limit` dead
    /// letter instead of a run.
    fn a_chain_of_rules_stops_at_the_depth_limit_with_a_dead_letter<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = B::open_limited(&place, &clock, 1 << 20, 3);
        e.ensure_workspace("app", &["ping"]).unwrap();
        e.register_rule(
            Rule::new("echo", "app")
                .on(["ping"])
                .scope(Scope::Global)
                .action("pong")
                .decide(|_| Ok(Decision::Fire(Value::Null))),
        )
        .unwrap();
        e.register_action("pong", |_, ctx| {
            ctx.emit("ping", NewEvent::new("ping", "loop", "echo", ctx.now_ms()))?;
            Ok(())
        })
        .unwrap();
        e.append("app", &NewEvent::new("ping", "loop", "app", 0))
            .unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!((idle.fired, idle.succeeded), (4, 3));
        let pings = e.read(&Query::new("app").types(["ping"])).unwrap();
        let depths: Vec<i64> = pings.iter().map(|p| p.depth).collect();
        assert_eq!(depths, [0, 1, 2, 3]);
        let letters = e.dead_letters(false, 10).unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].reason.as_str(), "depth_limit");
        assert_eq!(letters[0].event_seq, Some(pings[3].seq));
    }

    /// Invariant 6 with `on_dead_letter = block`: a scope stops at its dead
    /// run until an operator unblocks it (or discards the run); operators find
    /// what is held; the scope then resumes in order, on the record.
    fn block_holds_the_scope_until_an_operator_unblocks_it<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = jobs_engine::<B>(&place, &clock);
        e.register_rule(on_job(RetryPolicy::never()).on_dead_letter(OnDeadLetter::Block))
            .unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let o = Arc::clone(&order);
        e.register_action("work", move |run, _| {
            let input: Value = run.input()?;
            let idx = input["idx"].as_u64().unwrap();
            o.lock().unwrap().push(idx);
            if idx == 0 || idx == 3 {
                return Err("poison".into());
            }
            Ok(())
        })
        .unwrap();
        for (i, scope) in ["a", "a", "a", "b", "b"].iter().enumerate() {
            e.append("app", &job(scope, i)).unwrap();
        }
        e.run_until_idle().unwrap();
        assert_eq!(
            *order.lock().unwrap(),
            [0, 3],
            "both scopes stop at their dead run"
        );
        assert_eq!(e.runs(Some(RunState::Waiting), 10).unwrap().len(), 3);
        let scope_b_dead = e
            .runs(Some(RunState::Dead), 10)
            .unwrap()
            .into_iter()
            .find(|r| r.scope.as_deref() == Some("b"))
            .unwrap();
        let blocked = e.blocked_lanes(10).unwrap();
        let mut held: Vec<(String, String)> = blocked
            .iter()
            .map(|l| (l.scope.clone(), l.last_error.clone().unwrap_or_default()))
            .collect();
        held.sort();
        assert_eq!(
            held,
            [("a".into(), "poison".into()), ("b".into(), "poison".into())]
        );
        assert_eq!(e.stats().unwrap().blocked_lanes, 2);
        e.operator("ops", "skip the poison message")
            .unwrap()
            .unblock("jobs", "a")
            .unwrap();
        e.operator("ops", "not needed")
            .unwrap()
            .discard_run(&scope_b_dead.id)
            .unwrap();
        e.run_until_idle().unwrap();
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 5);
        let at = |idx| order.iter().position(|&i| i == idx).unwrap();
        assert!(at(1) < at(2), "scope a resumed in order: {order:?}");
        assert!(at(4) > at(3), "scope b went on: {order:?}");
        assert!(e.blocked_lanes(10).unwrap().is_empty());
        let err = e
            .operator("ops", "again")
            .unwrap()
            .unblock("jobs", "a")
            .unwrap_err();
        assert!(err.is_not_found(), "no longer blocked: {err}");
        let actions: Vec<String> = e
            .audit_log(10)
            .unwrap()
            .into_iter()
            .map(|a| a.action.to_string())
            .collect();
        assert_eq!(actions, ["discard_run", "unblock"]);
    }

    /// Invariant 6 with `on_dead_letter = continue` (the default): a scope goes
    /// on past its dead run.
    fn continue_lets_the_scope_go_on_after_a_dead_run<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = jobs_engine::<B>(&place, &clock);
        e.register_rule(on_job(RetryPolicy::never())).unwrap();
        e.register_action("work", |run, _| {
            let input: Value = run.input()?;
            if input["idx"] == 0 {
                Err("poison".into())
            } else {
                Ok(())
            }
        })
        .unwrap();
        for i in 0..3 {
            e.append("app", &job("a", i)).unwrap();
        }
        let idle = e.run_until_idle().unwrap();
        assert_eq!((idle.dead, idle.succeeded), (1, 2));
    }

    /// Invariant 6: a run waiting for its retry's backoff holds back its own
    /// scope, and no other.
    fn a_retry_waiting_for_its_backoff_holds_back_only_its_own_scope<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = jobs_engine::<B>(&place, &clock);
        e.register_rule(on_job(RetryPolicy::attempts(3).fixed(BACKOFF)))
            .unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let o = Arc::clone(&order);
        e.register_action("work", move |run, _| {
            let input: Value = run.input()?;
            let idx = input["idx"].as_u64().unwrap();
            o.lock().unwrap().push((idx, run.attempt));
            if idx == 0 && run.attempt == 1 {
                Err("busy".into())
            } else {
                Ok(())
            }
        })
        .unwrap();
        for (i, scope) in ["a", "a", "b", "b"].iter().enumerate() {
            e.append("app", &job(scope, i)).unwrap();
        }
        e.run_until_idle().unwrap();
        assert_eq!(
            *order.lock().unwrap(),
            [(0, 1), (2, 1), (3, 1)],
            "b went on; a waits"
        );
        clock.advance(BACKOFF);
        e.run_until_idle().unwrap();
        assert_eq!(
            *order.lock().unwrap(),
            [(0, 1), (2, 1), (3, 1), (0, 2), (1, 1)],
            "then a, in order"
        );
    }
}

/// Invariant 4 at one commit a firing: a page that reached the log's head
/// and fired moves each rule's cursor past the `RuleFired` envelopes its
/// commit appended, in that commit (no rule decides on them), so an event
/// that fires costs one commit, not a second one that moves the cursors
/// over the envelopes; and every event is still decided once.
fn a_page_that_fires_passes_its_own_envelopes_in_its_commit<B: TestBackend>() {
    let (place, clock) = scene::<B>();
    // No action registered: the drain runs nothing, so every commit below
    // is the evaluator's.
    let e = B::open(&place, &clock, "test");
    e.ensure_workspace("app", APP_TYPES).unwrap();
    e.register_rule(every_nth("each", 1)).unwrap();
    e.register_rule(every_nth("second", 2)).unwrap();
    e.run_until_idle().unwrap(); // takes the evaluator's lease
    let rsvp = |n: i64| {
        NewEvent::new("rsvp", format!("guest/{n}"), "web", 0)
            .payload(&serde_json::json!({ "session": "s-1", "n": n }))
    };
    e.append("app", &rsvp(1)).unwrap();
    e.append("app", &rsvp(2)).unwrap();
    let before = e.writer_stats().commits;
    let drained = e.run_until_idle().unwrap();
    assert_eq!(drained.decided, 4);
    assert_eq!(drained.fired, 3);
    assert_eq!(e.writer_stats().commits - before, 1, "one commit");
    let head = e.head_seq().unwrap();
    assert_eq!(head, 5, "two events and three envelopes");
    let positions = |e: &Engine<B>| {
        let mut p: Vec<(String, i64, i64)> = e
            .cursors()
            .unwrap()
            .into_iter()
            .filter(|c| c.kind == ConsumerKind::Rule)
            .map(|c| (c.name, c.position, c.lag))
            .collect();
        p.sort();
        p
    };
    assert_eq!(
        positions(&e),
        [("each".into(), 5, 0), ("second".into(), 5, 0)]
    );
    // From there, the next events are decided once each, as ever.
    e.append("app", &rsvp(3)).unwrap();
    e.append("app", &rsvp(4)).unwrap();
    let drained = e.run_until_idle().unwrap();
    assert_eq!((drained.decided, drained.fired), (4, 3));
    assert_eq!(e.head_seq().unwrap(), 10);
    assert_eq!(
        positions(&e),
        [("each".into(), 10, 0), ("second".into(), 10, 0)]
    );
    // Decided once each: the firings the two rules' folds predict.
    let fired: Vec<String> = e
        .read(&Query::new("app").types(["RuleFired"]))
        .unwrap()
        .iter()
        .map(|ev| ev.json().unwrap()["rule"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(fired.iter().filter(|r| *r == "each").count(), 4);
    assert_eq!(fired.iter().filter(|r| *r == "second").count(), 2);
}
