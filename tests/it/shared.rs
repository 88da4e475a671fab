//! Helpers the tests written once for every backend share: a place with the
//! workspace `app`, its events, and the engines of the rule, job and run tests.

use common::backend::TestBackend;
use common::rules::{APP_TYPES, JOB_TYPES};
use reflexr::{Engine, Enqueue, Job, ManualClock, NewEvent, Query};
use reflexr_testkit as common;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

pub(crate) const TYPES: &[&str] = &["thing.made", "thing.gone"];
pub(crate) const START_MS: i64 = 1_800_000_000_000;

pub(crate) fn made(id: &str) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000)
        .payload(&serde_json::json!({ "id": id }))
}

/// A place, its clock, and an engine on it with the workspace `app`.
pub(crate) fn setup<B: TestBackend>() -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let engine = B::open(&place, &clock, "test");
    engine.ensure_workspace("app", TYPES).unwrap();
    B::create_things(&engine);
    (place, clock, engine)
}

pub(crate) fn all<B: TestBackend>(engine: &Engine<B>) -> Vec<reflexr::Event> {
    engine.read(&Query::new("app").limit(10_000)).unwrap()
}

pub(crate) fn task(n: i64) -> Enqueue {
    Enqueue::new("work", &json!({ "n": n }))
}

/// Registers `work`, recording the `n` of each run it handles, in order.
pub(crate) fn recording<B: TestBackend>(engine: &Engine<B>) -> Arc<std::sync::Mutex<Vec<i64>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    engine
        .register_action("work", move |run, _| {
            let input: Value = run.input()?;
            s.lock().unwrap().push(input["n"].as_i64().unwrap());
            Ok(())
        })
        .unwrap();
    seen
}

/// An engine on the place with the workspace `app` of the rule tests and a
/// no-op `noop` action.
pub(crate) fn rules_engine<B: TestBackend>(
    place: &B::Place,
    clock: &ManualClock,
    holder: &str,
) -> Engine<B> {
    let e = B::open(place, clock, holder);
    e.ensure_workspace("app", APP_TYPES).unwrap();
    e.register_action("noop", |_, _| Ok(())).unwrap();
    e
}

pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// A thing made, with who is told of it.
pub(crate) fn made_for(id: &str, emails: &[&str]) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000)
        .payload(&json!({ "id": id, "tell": emails }))
}

pub(crate) fn counting_job<B: TestBackend>(
    name: &str,
    every: Duration,
    runs: &Arc<std::sync::atomic::AtomicUsize>,
) -> Job<B> {
    let r = Arc::clone(runs);
    B::job(Job::every(name, every)).handler(move |_, _| {
        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
}

pub(crate) const BACKOFF: Duration = Duration::from_secs(10);

/// An engine with the workspace `app` of the run tests.
pub(crate) fn jobs_engine<B: TestBackend>(place: &B::Place, clock: &ManualClock) -> Engine<B> {
    let e = B::open(place, clock, "test");
    e.ensure_workspace("app", JOB_TYPES).unwrap();
    e
}
