//! Rules decide exactly once per (rule, event) (DESIGN.md, invariant 4), with
//! errors contained per rule, under the workspace's evaluator lease
//! (invariant 7), with forward cursors but for recorded resets (invariant 8).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::{count, engine_with, is_child, spawn_child, temp_db};
use reflexr::{
    Clock, ConsumerKind, Decision, Engine, Error, ManualClock, NewEvent, OnNewVersion, Query, Rule,
    RuleReset, Scope, Start,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Default, Serialize, Deserialize, Debug, PartialEq)]
struct Count {
    n: u32,
}

/// Fires on every `every`-th event of a scope: a stateful rule whose firings
/// an independent fold over the log can predict.
fn every_nth(name: &str, every: u32) -> Rule {
    Rule::new(name, "app")
        .on(["rsvp"])
        .scope(Scope::payload("session"))
        .action("noop")
        .decide_with_state(Count::default(), move |_, state| {
            state.n += 1;
            Ok(if state.n.is_multiple_of(every) {
                Decision::fire(&serde_json::json!({ "n": state.n }))
            } else {
                Decision::Skip
            })
        })
}

fn rsvp(session: u32, guest: u32) -> NewEvent {
    NewEvent::new("rsvp", format!("guest/{guest}"), "guest", 0)
        .payload(&serde_json::json!({ "session": session, "guest": guest }))
}

fn setup(path: &std::path::Path) -> Engine {
    let e = engine_with(path, &common::clock(), "test");
    e.ensure_workspace("app", &["rsvp", "other"]).unwrap();
    e.register_action("noop", |_, _| Ok(())).unwrap();
    e
}

fn append_rsvps(e: &Engine, sessions: u32, per_session: u32) {
    e.write(|tx| {
        for g in 0..per_session {
            for s in 0..sessions {
                tx.append("app", &rsvp(s, s * 10_000 + g))?;
            }
        }
        Ok(())
    })
    .unwrap();
}

/// (rule, event_seq) of every RuleFired in the log, with its count.
fn fired(e: &Engine) -> BTreeMap<(String, i64), usize> {
    let mut out = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = e
            .read(
                &Query::new("app")
                    .after(after)
                    .types(["RuleFired"])
                    .limit(5_000),
            )
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        for ev in &page {
            let p: serde_json::Value = ev.payload().unwrap();
            let key = (
                p["rule"].as_str().unwrap().to_string(),
                p["event_seq"].as_i64().unwrap(),
            );
            *out.entry(key).or_default() += 1;
        }
    }
    out
}

/// What `every_nth(rule, every)` must fire over the log: computed from the
/// events alone, independently of the engine.
fn expected(e: &Engine, rule: &str, every: u32) -> BTreeMap<(String, i64), usize> {
    let mut counts: HashMap<i64, u32> = HashMap::new();
    let mut out = BTreeMap::new();
    for ev in e
        .read(&Query::new("app").types(["rsvp"]).limit(10_000))
        .unwrap()
    {
        let p: serde_json::Value = ev.payload().unwrap();
        let c = counts.entry(p["session"].as_i64().unwrap()).or_default();
        *c += 1;
        if (*c).is_multiple_of(every) {
            out.insert((rule.to_string(), ev.seq), 1);
        }
    }
    out
}

#[test]
fn a_stateful_rule_fires_exactly_what_an_independent_fold_predicts() {
    // Invariant 4.
    let (_dir, path) = temp_db();
    let e = setup(&path);
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
    // RuleFired carries the firing id, which is the run id.
    let runs = e.runs(None, 100).unwrap();
    assert_eq!(runs.len(), 9);
    let page = e.read(&Query::new("app").types(["RuleFired"])).unwrap();
    for ev in page {
        let p: serde_json::Value = ev.payload().unwrap();
        let id = p["firing_id"].as_str().unwrap();
        assert_eq!(
            ev.id,
            format!("{id}:fired"),
            "the event id derives from the firing id"
        );
        assert!(runs.iter().any(|r| r.id == id));
    }
    // Nothing more to decide: a second drain does nothing.
    assert_eq!(e.run_until_idle().unwrap().decided, 0);
}

/// The child's side of the crash test: evaluates slowly, in small batches,
/// until killed (or done).
#[test]
fn child_process_evaluator() {
    if !is_child() {
        return; // Only a child started by the crash test does this work.
    }
    let path = std::env::var("REFLEXR_DB").unwrap();
    // Each child's clock stands an hour after the last one's, so the lease a
    // killed child held has lapsed for the next: no one waits for it.
    let hours: i64 = std::env::var("REFLEXR_HOURS").unwrap().parse().unwrap();
    let e = Engine::builder(&path)
        .clock(ManualClock::new(
            common::clock().now_ms() + hours * 3_600_000,
        ))
        .evaluate_batch(7)
        .holder_id(format!("child-{}", std::process::id()))
        .open()
        .unwrap();
    e.register_action("noop", |_, _| Ok(())).unwrap();
    let slow = every_nth("tenth", 10).decide_with_state(Count::default(), |_, state| {
        // Slow enough that a kill lands inside a batch.
        std::thread::sleep(Duration::from_micros(300));
        state.n += 1;
        Ok(if state.n.is_multiple_of(10) {
            Decision::fire(&serde_json::json!({ "n": state.n }))
        } else {
            Decision::Skip
        })
    });
    e.register_rule(slow).unwrap();
    println!("\nevaluating");
    e.run_until_idle().unwrap();
    println!("\ndone");
}

#[test]
fn every_decision_is_made_exactly_once_across_kills_mid_batch() {
    // Invariant 4: state, cursor, RuleFired events and runs commit together,
    // so a process killed anywhere in a batch loses and repeats nothing.
    let (_dir, path) = temp_db();
    {
        let e = setup(&path);
        append_rsvps(&e, 5, 60);
    }
    let kills: usize = std::env::var("REFLEXR_RULE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut killed = 0;
    let mut finished = false;
    for i in 0..kills * 3 {
        let mut child = spawn_child(
            "child_process_evaluator",
            &[
                ("REFLEXR_DB", path.to_string_lossy().into_owned()),
                ("REFLEXR_HOURS", (i + 1).to_string()),
            ],
        );
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        while let Some(Ok(l)) = lines.next() {
            if l.ends_with("evaluating") {
                break;
            }
        }
        // Kill at a varying moment inside the run: 1 to 25 ms in.
        std::thread::sleep(Duration::from_millis(1 + (i as u64 * 7) % 25));
        let _ = child.kill();
        let status = child.wait().unwrap();
        let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
        if status.success() && rest.iter().any(|l| l.ends_with("done")) {
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
    let late = ManualClock::new(common::clock().now_ms() + 1_000 * 3_600_000);
    let e = engine_with(&path, &late, "finisher");
    e.register_action("noop", |_, _| Ok(())).unwrap();
    e.register_rule(every_nth("tenth", 10)).unwrap();
    e.run_until_idle().unwrap();

    let want = expected(&e, "tenth", 10);
    assert_eq!(want.len(), 30);
    assert_eq!(
        fired(&e),
        want,
        "each firing once (killed {killed} times, finished early: {finished})"
    );
    assert_eq!(count(&e, "SELECT count(*) FROM reflexr_runs"), 30);
    for s in 0..5 {
        assert_eq!(
            e.rule_state::<Count>("tenth", &s.to_string()).unwrap(),
            Some(Count { n: 60 })
        );
    }
    let rule = &e.rules().unwrap()[0];
    assert_eq!(rule.lag, 0);
}

#[test]
fn a_stateful_rule_keeps_its_state_across_a_restart() {
    // Invariant 4: the state is in the file, with the cursor.
    let (_dir, path) = temp_db();
    {
        let e = setup(&path);
        e.register_rule(every_nth("hundredth", 100)).unwrap();
        append_rsvps(&e, 1, 60);
        assert_eq!(e.run_until_idle().unwrap().fired, 0);
    }
    let e = setup(&path);
    e.register_rule(every_nth("hundredth", 100)).unwrap();
    append_rsvps(&e, 1, 40);
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired), (40, 1), "the 100th RSVP fires");
}

#[test]
fn a_rule_added_later_catches_up_and_one_starting_at_the_head_does_not() {
    let (_dir, path) = temp_db();
    let e = setup(&path);
    e.register_rule(every_nth("early", 10)).unwrap();
    append_rsvps(&e, 2, 20);
    e.run_until_idle().unwrap();
    drop(e);

    let e = setup(&path);
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
    assert_eq!(
        of("from-now"),
        2,
        "only the 20 events after it was first registered"
    );
}

#[test]
fn a_failing_rule_does_not_hold_back_another() {
    // Errors are per rule: recorded as RuleErrored and dead-lettered, and the
    // rule moves on.
    let (_dir, path) = temp_db();
    let e = setup(&path);
    e.register_rule(every_nth("healthy", 5)).unwrap();
    e.register_rule(
        Rule::new("broken", "app")
            .on(["rsvp"])
            .scope(Scope::payload("session"))
            .action("noop")
            .decide(|ev| {
                let p: serde_json::Value = ev.payload()?;
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
            .map(|d| d.reason.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(reasons("broken"), ["decision_error", "decision_panic"]);
    assert_eq!(reasons("scopeless"), ["missing_scope"]);
    assert!(letters.iter().any(|d| d.error.contains("unreachable")));
    assert!(
        letters
            .iter()
            .any(|d| d.error.contains("a bug in the rule"))
    );
    let errored = e.read(&Query::new("app").types(["RuleErrored"])).unwrap();
    assert_eq!(errored.len(), 15);
    for rule in e.rules().unwrap() {
        assert_eq!(rule.lag, 0, "{} moved on", rule.name);
    }
}

#[test]
fn only_the_lease_holder_evaluates_and_another_takes_over_when_renewal_stops() {
    // Invariant 7 (fencing) and 4 (exactly once) across two engines.
    let (_dir, path) = temp_db();
    let clock = common::clock();
    let a = engine_with(&path, &clock, "engine-a");
    a.ensure_workspace("app", &["rsvp"]).unwrap();
    let b = engine_with(&path, &clock, "engine-b");
    for e in [&a, &b] {
        e.register_action("noop", |_, _| Ok(())).unwrap();
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

    // a stops renewing (paused, or gone); its lease lapses; b takes over.
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
    // a comes back: its lease is gone and b's is live, so a decides nothing.
    append_rsvps(&a, 1, 10);
    assert_eq!(a.run_until_idle().unwrap().decided, 0);
    assert_eq!(b.run_until_idle().unwrap().fired, 1);
    assert_eq!(fired(&a), expected(&a, "tenth", 10));
}

#[test]
fn rules_may_not_watch_reserved_types_and_must_be_complete() {
    // Invariant 10.
    let (_dir, path) = temp_db();
    let e = setup(&path);
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

#[test]
fn an_operator_replays_a_rule_and_resets_its_state_on_the_record() {
    // Invariant 8: the rule's cursor moves back only by a recorded reset.
    let (_dir, path) = temp_db();
    let e = setup(&path);
    e.register_rule(every_nth("tenth", 10)).unwrap();
    append_rsvps(&e, 1, 20);
    assert_eq!(e.run_until_idle().unwrap().fired, 2);

    e.reset_rule("tenth", RuleReset::Replay(0), "ops", "fixed the rule")
        .unwrap();
    assert_eq!(e.rule_state::<Count>("tenth", "0").unwrap(), None);
    let idle = e.run_until_idle().unwrap();
    assert_eq!(
        (idle.decided, idle.fired),
        (20, 2),
        "decided again from the start"
    );
    assert_eq!(
        e.runs(None, 100).unwrap().len(),
        4,
        "new firings, new run ids"
    );

    e.reset_rule("tenth", RuleReset::State, "ops", "start counting again")
        .unwrap();
    append_rsvps(&e, 1, 10);
    assert_eq!(e.run_until_idle().unwrap().fired, 1);
    let audit = e.audit_log(10).unwrap();
    assert_eq!(audit.len(), 2);
    assert!(audit.iter().all(|a| a.action == "reset_rule"));
    let err = e
        .reset_rule("tenth", RuleReset::Cursor(10_000), "ops", "typo")
        .unwrap_err();
    assert!(err.is_bad_input());
    let err = e
        .reset_rule("nope", RuleReset::State, "ops", "typo")
        .unwrap_err();
    assert!(err.is_not_found());
}

#[test]
fn a_new_rule_version_continues_resets_its_state_or_replays_as_it_says() {
    let (_dir, path) = temp_db();
    let run = |version: u32, on_new: OnNewVersion| {
        let e = setup(&path);
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
        (20, 2),
        "all 20 decided again from a fresh state"
    );
    let idle = run(4, OnNewVersion::Replay);
    assert_eq!(idle.decided, 5, "the same version again: nothing replayed");
}

#[test]
fn a_rule_gone_from_the_code_keeps_its_rows_until_deleted() {
    let (_dir, path) = temp_db();
    {
        let e = setup(&path);
        e.register_rule(every_nth("retired", 10)).unwrap();
        append_rsvps(&e, 1, 15);
        e.run_until_idle().unwrap();
    }
    let e = setup(&path);
    let rules = e.rules().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!((rules[0].registered_here, rules[0].cursor), (false, 16));
    assert_eq!(
        e.rule_state::<Count>("retired", "0").unwrap(),
        Some(Count { n: 15 })
    );
    e.delete_rule("retired", "ops", "the feature is gone")
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

#[test]
fn a_state_reset_while_a_batch_is_being_decided_makes_it_decide_again() {
    // Invariant 4 under an operator: the batch's commit checks that nothing
    // moved the cursor or reset the state since it read them.
    let (_dir, path) = temp_db();
    let e = setup(&path);
    let operator = Engine::open(&path).unwrap();
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
                        .reset_rule("third", RuleReset::State, "ops", "start over")
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
