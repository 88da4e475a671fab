//! The stateful rule the rule tests share (`tests/it/rules.rs`,
//! `tests/it/inspect.rs`, `tests/it/runs.rs`), with what it must fire computed from the log
//! alone: generic over the backend.

use std::collections::{BTreeMap, HashMap};

use reflexr::{Backend, Decision, Engine, NewEvent, Query, RetryPolicy, Rule, Scope};
use serde::{Deserialize, Serialize};

#[derive(Clone, Default, Serialize, Deserialize, Debug, PartialEq)]
pub struct Count {
    pub n: u32,
}

/// The types of `app`, the workspace of every rule test.
pub const APP_TYPES: &[&str] = &["rsvp", "other"];

/// Fires on every `every`-th event of a scope: a stateful rule whose firings
/// an independent fold over the log can predict.
pub fn every_nth(name: &str, every: u32) -> Rule {
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

/// [`every_nth`], slow enough (300 µs a decision) that a kill lands inside
/// a batch: the evaluator of the crash tests.
pub fn slow_every_nth(name: &str, every: u32) -> Rule {
    every_nth(name, every).decide_with_state(Count::default(), move |_, state| {
        std::thread::sleep(std::time::Duration::from_micros(300));
        state.n += 1;
        Ok(if state.n.is_multiple_of(every) {
            Decision::fire(&serde_json::json!({ "n": state.n }))
        } else {
            Decision::Skip
        })
    })
}

pub fn rsvp(session: u32, guest: u32) -> NewEvent {
    NewEvent::new("rsvp", format!("guest/{guest}"), "guest", 0)
        .payload(&serde_json::json!({ "session": session, "guest": guest }))
}

/// Appends `per_session` RSVPs to each of `sessions` sessions, in one write.
pub fn append_rsvps<B: Backend>(e: &Engine<B>, sessions: u32, per_session: u32) {
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
pub fn fired<B: Backend>(e: &Engine<B>) -> BTreeMap<(String, i64), usize> {
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
pub fn expected<B: Backend>(
    e: &Engine<B>,
    rule: &str,
    every: u32,
) -> BTreeMap<(String, i64), usize> {
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

/// The types of `app` in the run tests.
pub const JOB_TYPES: &[&str] = &["job", "done", "ping"];

/// A rule firing once per `job` event, with the event's payload as input,
/// scoped by the payload's `scope`.
pub fn on_job(policy: RetryPolicy) -> Rule {
    Rule::new("jobs", "app")
        .on(["job"])
        .scope(Scope::payload("scope"))
        .action("work")
        .retry(policy)
        .decide(|e| Ok(Decision::Fire(e.payload()?)))
}

/// A `job` event of `scope`.
pub fn job(scope: &str, idx: usize) -> NewEvent {
    NewEvent::new("job", format!("job/{idx}"), "app", 0)
        .payload(&serde_json::json!({ "scope": scope, "idx": idx }))
}
