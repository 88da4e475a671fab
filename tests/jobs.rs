//! The jobs loop: reactions, deliveries, scheduled work and pruning (ADR
//! 0011; DESIGN.md invariants 2, 5, 9). What runs on every backend — a
//! reaction's deliveries, its failures contained, channels' retry
//! policies, an occurrence once across engines, missed occurrences — is in
//! `tests/backends.rs`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::channels::email_channel;
use common::{Arrange, Scene, count, is_child, parent_file};
use proptest::prelude::*;
use reflexr::{
    ChannelPolicy, Clock, ConsumerKind, Delivery, Engine, Guarantee, Job, NewEvent, Query,
    Reaction, Retention, RetryPolicy, RunState,
};

const MINUTE: Duration = Duration::from_secs(60);

/// The types of `app`, the workspace of every test.
const APP_TYPES: &[&str] = &["session.changed", "other"];

/// The application's tables: session 1 in room A, with three RSVPs. Safe to
/// run at every open (the RSVPs are written afresh).
const APP_SQL: &str = "CREATE TABLE IF NOT EXISTS sessions (id INTEGER PRIMARY KEY, room TEXT);
     CREATE TABLE IF NOT EXISTS rsvps (session INTEGER, email TEXT);
     INSERT OR IGNORE INTO sessions VALUES (1, 'A');
     DELETE FROM rsvps;
     INSERT INTO rsvps VALUES (1, 'ada@x'), (1, 'grace@x'), (1, 'alan@x');";

/// A reaction that enqueues one email per RSVP of the changed session.
fn notifier() -> Reaction {
    Reaction::new("notifier", "app")
        .on(["session.changed"])
        .handle(|event, tx| {
            let mut stmt = tx
                .conn()
                .prepare("SELECT email FROM rsvps WHERE session = 1")?;
            let emails: Vec<String> = stmt
                .query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            for email in emails {
                tx.deliver(&Delivery::new("email", "moved").to(email).caused_by(event))?;
            }
            Ok(())
        })
}

fn edit(e: &Engine, room: &str, fail: bool) -> reflexr::Result<()> {
    e.write(|tx| {
        tx.execute("UPDATE sessions SET room = ?1 WHERE id = 1", [room])?;
        let at = tx.now_ms();
        tx.append(
            "app",
            &NewEvent::new("session.changed", "session/1", "admin", at)
                .payload(&serde_json::json!({ "room": room })),
        )?;
        if fail {
            return Err(reflexr::Error::Invalid {
                field: "room",
                reason: "refused".into(),
            });
        }
        Ok(())
    })
}

#[test]
fn a_reaction_whose_commit_keeps_failing_shows_as_stuck_and_holds_back_no_other_work() {
    // "Nothing wedges silently": the failing reaction is recorded on its
    // cursor; another reaction and the scheduler go on meanwhile.
    let scene = Scene::new();
    let e = scene.open("test").workspace("app", APP_TYPES).sql(APP_SQL);
    let sent = email_channel(&e, ChannelPolicy::BestEffort);
    e.register_reaction(notifier()).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&seen);
    e.register_reaction(
        Reaction::new("counter", "app")
            .on(["session.changed"])
            .handle(move |_, _| {
                s.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }),
    )
    .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    e.register_job(counting_job("tick", MINUTE, &runs)).unwrap();
    let e = e.sql(
        "CREATE TRIGGER notifier_stuck BEFORE UPDATE OF position ON reflexr_cursors \
         WHEN NEW.name = 'notifier' BEGIN SELECT RAISE(ABORT, 'the notifier is stuck'); END;",
    );
    edit(&e, "B", false).unwrap();
    scene.clock.advance(MINUTE);
    for _ in 0..3 {
        e.run_until_idle().unwrap();
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the other reaction went on");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "and so did the scheduler");
    assert!(
        sent.lock().unwrap().is_empty(),
        "the stuck one enqueued nothing"
    );
    let stuck: Vec<_> = e
        .cursors()
        .unwrap()
        .into_iter()
        .filter(|c| c.is_stuck())
        .collect();
    assert_eq!(stuck.len(), 1);
    assert_eq!(
        (stuck[0].kind, stuck[0].name.as_str()),
        (ConsumerKind::Reaction, "notifier")
    );
    assert!(stuck[0].failures >= 3, "once per turn of the loop");
    assert!(
        stuck[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("the notifier is stuck")
    );

    e.write(|tx| tx.execute("DROP TRIGGER notifier_stuck", []).map(|_| ()))
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(
        sent.lock().unwrap().len(),
        3,
        "unstuck, its notices go out once"
    );
    assert!(e.cursors().unwrap().iter().all(|c| c.failures == 0));
}

#[test]
fn a_reaction_reads_the_log_inside_its_own_transaction() {
    // Tx::read sees the transaction's own writes, and the committed log.
    let s = Scene::new();
    let e = s.open("test").workspace("app", APP_TYPES).sql(APP_SQL);
    let counts = Arc::new(Mutex::new(Vec::new()));
    let c = Arc::clone(&counts);
    e.register_reaction(
        Reaction::new("history", "app")
            .on(["session.changed"])
            .handle(move |event, tx| {
                let before = tx.read(&Query::new("app").types(["session.changed"]))?;
                c.lock()
                    .unwrap()
                    .push(before.iter().filter(|e| e.seq <= event.seq).count());
                Ok(())
            }),
    )
    .unwrap();
    edit(&e, "B", false).unwrap();
    edit(&e, "C", false).unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(*counts.lock().unwrap(), [1, 2]);
    let seen_own = e
        .write(|tx| {
            let at = tx.now_ms();
            tx.append("app", &NewEvent::new("other", "x", "app", at))?;
            Ok(tx.read(&Query::new("app").types(["other"]))?.len())
        })
        .unwrap();
    assert_eq!(seen_own, 1, "a transaction reads what it appended");
}

/// The child's side of the crash test: handles the change, enqueues its
/// deliveries, and is killed before the reaction's transaction commits.
#[test]
fn child_process_reacts_and_hangs_before_commit() {
    if !is_child() {
        return; // Only a child started by the test below does this work.
    }
    let path = parent_file();
    let e = Engine::builder(&path).holder_id("child").open().unwrap();
    e.register_channel("email", ChannelPolicy::BestEffort, |_, _| Ok(()))
        .unwrap();
    e.register_reaction(notifier().handle(|event, tx| {
        for email in ["ada@x", "grace@x", "alan@x"] {
            tx.deliver(&Delivery::new("email", "moved").to(email).caused_by(event))?;
        }
        println!("\nenqueued");
        loop {
            std::thread::park(); // killed here, inside the transaction
        }
    }))
    .unwrap();
    e.run_until_idle().unwrap();
}

#[test]
fn a_crash_between_a_reactions_handling_and_its_commit_re_handles_without_duplicates() {
    // The deliveries commit with the reaction's cursor: the crash loses both,
    // and the next handling enqueues them once.
    let s = Scene::starting_now();
    {
        let e = s.open("setup").workspace("app", APP_TYPES).sql(APP_SQL);
        edit(&e, "B", false).unwrap();
    }
    let mut child = s.child("child_process_reacts_and_hangs_before_commit", &[]);
    assert!(child.past("enqueued"), "the child handled the event");
    child.kill();

    // The child held the loop lease: past it, this engine takes over.
    s.clock.advance(MINUTE);
    let e = s.open("survivor").workspace("app", APP_TYPES).sql(APP_SQL);
    assert_eq!(
        count(&e, "SELECT count(*) FROM reflexr_runs"),
        0,
        "nothing committed"
    );
    let sent = email_channel(&e, ChannelPolicy::Retried(RetryPolicy::default()));
    e.register_reaction(notifier()).unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(sent.lock().unwrap().len(), 3);
    assert_eq!(count(&e, "SELECT count(*) FROM reflexr_runs"), 3);
    let cursor = e
        .cursors()
        .unwrap()
        .into_iter()
        .find(|c| c.kind == ConsumerKind::Reaction)
        .unwrap();
    assert_eq!((cursor.position, cursor.lag), (1, 0));
}

fn counting_job(name: &str, every: Duration, runs: &Arc<AtomicUsize>) -> Job {
    let r = Arc::clone(runs);
    Job::every(name, every).handler(move |_, _| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
}

#[test]
fn an_at_most_once_occurrence_is_lost_to_a_crash_and_an_at_least_once_one_runs_again() {
    let s = Scene::new();
    let e = s.open("test").workspace("app", APP_TYPES).sql(APP_SQL);
    let calls = Arc::new(Mutex::new(Vec::new()));
    for (name, guarantee) in [
        ("most", Guarantee::AtMostOnce),
        ("least", Guarantee::AtLeastOnce),
    ] {
        let c = Arc::clone(&calls);
        let first = AtomicUsize::new(0);
        e.register_job(
            Job::every(name, MINUTE)
                .guarantee(guarantee)
                .handler(move |o, _| {
                    c.lock().unwrap().push((o.job.clone(), o.attempt));
                    if first.fetch_add(1, Ordering::SeqCst) == 0 {
                        // The process "dies" mid-occurrence: the handler panics,
                        // which fails the attempt like a crash whose claim lapsed.
                        panic!("crashed mid-occurrence");
                    }
                    Ok(())
                }),
        )
        .unwrap();
    }
    s.clock.advance(MINUTE);
    e.run_until_idle().unwrap();
    s.clock.advance(MINUTE * 10);
    e.run_until_idle().unwrap();
    let calls = calls.lock().unwrap();
    let of = |job: &str| calls.iter().filter(|(j, _)| j == job).count();
    // at most once: the first occurrence ran once (and failed); the next
    // minute's ran once. at least once: the first ran again after its backoff.
    assert_eq!(of("most"), 2, "{calls:?}");
    assert!(of("least") >= 2, "{calls:?}");
    let most = e
        .runs(None, 20)
        .unwrap()
        .into_iter()
        .find(|r| r.id.starts_with("most@") && r.state == RunState::Dead)
        .expect("the lost occurrence is dead, not repeated");
    assert_eq!(most.max_attempts, 1);
}

#[test]
fn an_interval_of_zero_switches_a_job_off() {
    let scene = Scene::new();
    let e = scene.open("test").workspace("app", APP_TYPES).sql(APP_SQL);
    let runs = Arc::new(AtomicUsize::new(0));
    e.register_job(counting_job("reminders", Duration::ZERO, &runs))
        .unwrap();
    scene.clock.advance(MINUTE * 100);
    e.run_until_idle().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let s = &e.schedules().unwrap()[0];
    assert_eq!((s.spec.as_str(), s.next_due_at), ("off", None));
    // Switched on again, it is due an interval later.
    drop(e);
    let e = scene.open("test").workspace("app", APP_TYPES).sql(APP_SQL);
    e.register_job(counting_job("reminders", MINUTE, &runs))
        .unwrap();
    scene.clock.advance(MINUTE);
    e.run_until_idle().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn pruning_never_deletes_an_event_a_cursor_has_not_passed(
        events in 1usize..60,
        cursors in prop::collection::vec(0usize..60, 0..4),
        age_minutes in 0u64..30,
    ) {
        // Invariant 9: an event goes only once every cursor on its workspace
        // passed it and it is older than the retention.
        let s = Scene::new();
        let e = s.open("test").workspace("app", APP_TYPES).sql(APP_SQL);
        for i in 0..events {
            e.append("app", &NewEvent::new("other", format!("x/{i}"), "app", 0)).unwrap();
            s.clock.advance(MINUTE);
        }
        for (k, c) in cursors.iter().enumerate() {
            e.save_cursor(&format!("c{k}"), "app", (*c).min(events) as i64).unwrap();
        }
        let retention = Retention {
            events: Some(MINUTE * age_minutes as u32),
            ..Retention::default()
        };
        let pruned = e.prune(&retention).unwrap();
        let min_cursor = cursors.iter().map(|c| (*c).min(events)).min().unwrap_or(events) as i64;
        let now = s.clock.now_ms();
        let left = e.read(&Query::new("app").limit(1_000)).unwrap();
        for ev in &left {
            // Anything left would have been allowed to stay.
            prop_assert!(ev.seq > min_cursor || ev.recorded_at >= now - (age_minutes as i64) * 60_000);
        }
        let gone = events as u64 - left.len() as u64;
        prop_assert_eq!(gone, pruned.events);
        // Nothing a cursor has not passed is gone: every seq after the lowest
        // cursor is still there.
        let after: Vec<i64> = left.iter().map(|e| e.seq).filter(|s| *s > min_cursor).collect();
        prop_assert_eq!(after, ((min_cursor + 1)..=(events as i64)).collect::<Vec<_>>());
        // And seqs never come back.
        let next = e.append("app", &NewEvent::new("other", "new", "app", 0)).unwrap();
        prop_assert_eq!(next.seq, events as i64 + 1);
    }
}

#[test]
fn pruning_removes_finished_runs_but_keeps_dead_ones() {
    let s = Scene::new();
    let e = s.open("test").workspace("app", APP_TYPES).sql(APP_SQL);
    e.register_channel("email", ChannelPolicy::BestEffort, |msg, _| {
        if msg.to.as_deref() == Some("bad") {
            Err("no".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    for to in ["a", "b", "bad"] {
        e.deliver(&Delivery::new("email", "x").to(to)).unwrap();
    }
    e.run_until_idle().unwrap();
    s.clock.advance(MINUTE * 10);
    let pruned = e.prune(&Retention::older_than(MINUTE)).unwrap();
    assert_eq!((pruned.runs, pruned.dead_letters), (2, 0));
    assert_eq!(e.runs(None, 10).unwrap()[0].state, RunState::Dead);
}

#[test]
fn an_occurrence_whose_executor_stopped_mid_run_is_lost_if_at_most_once_and_rerun_if_at_least_once()
{
    // The claim is the "taken" mark: it commits before the handler runs. An
    // executor that stops mid-run (here: paused past its claim's lease)
    // leaves an at-most-once occurrence dead, never run again, and an
    // at-least-once one to be run again by another executor.
    for (guarantee, reruns) in [(Guarantee::AtMostOnce, 0), (Guarantee::AtLeastOnce, 1)] {
        let s = Scene::new();
        let a = s.open("engine-a").workspace("app", APP_TYPES).sql(APP_SQL);
        let b = s.open("engine-b").workspace("app", APP_TYPES).sql(APP_SQL);
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release_tx, release) = std::sync::mpsc::channel::<()>();
        let release = Mutex::new(release);
        let started_tx = Mutex::new(started_tx);
        a.register_job(
            Job::every("j", MINUTE)
                .guarantee(guarantee)
                .handler(move |_, _| {
                    started_tx.lock().unwrap().send(()).unwrap();
                    release.lock().unwrap().recv().unwrap();
                    Ok(())
                }),
        )
        .unwrap();
        let b_runs = Arc::new(AtomicUsize::new(0));
        b.register_job(counting_job("j", MINUTE, &b_runs).guarantee(guarantee))
            .unwrap();
        s.clock.advance(MINUTE);
        let worker = {
            let a = a.clone();
            std::thread::spawn(move || a.run_until_idle())
        };
        started.recv().unwrap();
        s.clock.advance(Duration::from_secs(31)); // a's claim lapses
        b.run_until_idle().unwrap();
        assert_eq!(b_runs.load(Ordering::SeqCst), reruns, "{guarantee:?}");
        release_tx.send(()).unwrap();
        worker.join().unwrap().unwrap();
        let run = &b.runs(None, 10).unwrap()[0];
        let expected = match guarantee {
            Guarantee::AtMostOnce => RunState::Dead,
            Guarantee::AtLeastOnce => RunState::Succeeded,
        };
        assert_eq!(run.state, expected, "{guarantee:?}: {run:?}");
    }
}
