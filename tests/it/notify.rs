//! Change notification: the nudge wakes this process's waiters at a commit;
//! the heartbeat notices other connections' commits (DESIGN.md, "Threads").
//! Each test runs on every backend (`on_backends!`) but the file watch,
//! SQLite's (PostgreSQL's LISTEN/NOTIFY wakes a waiter without a heartbeat
//! in `every_backend` below).
//!
//! The waits below have long timeouts that only matter if the behaviour is
//! broken: each test passes as soon as the waiter is woken, and the
//! heartbeat is set so long where a test must prove a nudge (not a poll)
//! woke it.

use reflexr_testkit as common;

use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, on_backends};
use reflexr::{Engine, Enqueue, EventMatch, Follow, ManualClock, NewEvent, Query, RunState};

on_backends!(
    a_commit_that_appends_wakes_a_waiter_in_the_same_process_at_once,
    a_waiter_returns_what_is_already_there_without_waiting,
    a_commit_by_another_engine_is_noticed_by_the_heartbeat,
    a_commit_by_another_process_is_noticed_by_the_heartbeat,
    an_append_wakes_the_workflow_waiting_for_it_without_a_heartbeat,
    a_reaction_and_a_follower_made_after_the_start_are_woken_without_a_heartbeat,
);

children_on_backends!(child_process_appends_on_cue);

const NEVER: Duration = Duration::from_secs(3600);
/// A heartbeat that notices other connections' commits at once.
const QUICK: Duration = Duration::from_millis(5);
const PATIENCE: Duration = Duration::from_secs(60);

fn tick(i: usize) -> NewEvent {
    NewEvent::new("tick", format!("t/{i}"), "clock", 0)
}

/// An engine on the place with `heartbeat`, and the workspace `app`.
fn open<B: TestBackend>(place: &B::Place, holder: &str, heartbeat: Duration) -> Engine<B> {
    let clock = ManualClock::new(1_800_000_000_000);
    let e = B::open_opts(place, &Opts::new(&clock, holder).heartbeat(heartbeat));
    e.ensure_workspace("app", &["tick"]).unwrap();
    e
}

/// "Threads": a commit of this process wakes its waiters at once.
fn a_commit_that_appends_wakes_a_waiter_in_the_same_process_at_once<B: TestBackend>() {
    let place = B::place();
    // A heartbeat of an hour: only the nudge can wake the waiter in time.
    let engine = open::<B>(&place, "test", NEVER);

    let (started_tx, started) = mpsc::channel();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            started_tx.send(()).unwrap();
            let t = Instant::now();
            let page = engine
                .wait_for_events(&Query::new("app"), PATIENCE)
                .unwrap();
            (page, t.elapsed())
        })
    };
    started.recv().unwrap();
    engine.append("app", &tick(1)).unwrap();
    let (page, waited) = waiter.join().unwrap();
    assert_eq!(page.len(), 1, "woken with the event");
    assert!(waited < PATIENCE, "woken by the nudge, not by the timeout");
}

/// "Threads": a wait returns what is there already, without waiting.
fn a_waiter_returns_what_is_already_there_without_waiting<B: TestBackend>() {
    let place = B::place();
    let engine = open::<B>(&place, "test", NEVER);
    engine.append("app", &tick(1)).unwrap();
    let page = engine.wait_for_events(&Query::new("app"), NEVER).unwrap();
    assert_eq!(page.len(), 1);
    // After the cursor there is nothing: a zero timeout returns at once, empty.
    let page = engine
        .wait_for_events(&Query::new("app").after(1), Duration::ZERO)
        .unwrap();
    assert!(page.is_empty());
}

/// "Threads": two engines share no nudges; the heartbeat (SQLite's
/// `PRAGMA data_version`, PostgreSQL's head row or its notification) tells
/// the first about the second's commit.
fn a_commit_by_another_engine_is_noticed_by_the_heartbeat<B: TestBackend>() {
    let place = B::place();
    let watcher = open::<B>(&place, "watcher", QUICK);
    let other = open::<B>(&place, "other", QUICK);

    let (started_tx, started) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        started_tx.send(()).unwrap();
        watcher
            .wait_for_events(&Query::new("app"), PATIENCE)
            .unwrap()
    });
    started.recv().unwrap();
    other.append("app", &tick(1)).unwrap();
    assert_eq!(waiter.join().unwrap().len(), 1);
}

/// Invariant 12, live: with the engine's threads and a heartbeat of an
/// hour, an append wakes the workflow suspended waiting for it. An append
/// wakes this process's executors (which match waits) only while a
/// workflow may wait for an event: the wait's record says so, and the
/// executors' looks keep it said (`core::wake::WaitsHint`); a wake-up that
/// depended on the heartbeat would fail the minute's patience.
fn an_append_wakes_the_workflow_waiting_for_it_without_a_heartbeat<B: TestBackend>() {
    let place = B::place();
    let engine = open::<B>(&place, "test", NEVER);
    let (done_tx, done) = mpsc::channel();
    let done_tx = Mutex::new(done_tx);
    engine
        .register_action("flow", move |_, ctx| {
            let m = EventMatch::new("app", "tick").subject("t/1");
            let got = ctx.wait_for_event("ticked", &m, None)?;
            done_tx.lock().unwrap().send(got.map(|e| e.seq)).unwrap();
            Ok(())
        })
        .unwrap();
    // Subscribed before anything commits, so no commit goes unseen.
    let watch = engine.watch();
    engine.start().unwrap();
    let id = engine
        .enqueue(&Enqueue::new("flow", &serde_json::Value::Null))
        .unwrap()
        .id;
    // Until it is suspended: started, ready again with nothing due.
    loop {
        let run = engine.run(&id).unwrap().unwrap();
        if run.started_at.is_some()
            && run.state == RunState::Ready
            && run.due_at == reflexr::limits::NEVER
        {
            break;
        }
        assert!(
            watch.wait(PATIENCE),
            "the workflow never suspended: {run:?}"
        );
    }
    let seq = engine.append("app", &tick(1)).unwrap().seq;
    assert_eq!(done.recv_timeout(PATIENCE).unwrap(), Some(seq));
    let run = engine.wait_for_run(&id, PATIENCE).unwrap();
    assert_eq!(run.state, RunState::Succeeded);
    engine.shutdown();
}

/// "Threads": the loop waits for appends only while it has reactions, and
/// the follower thread only while the ledger has followers; registering a
/// reaction and making a follower wake them, so with a heartbeat of an hour
/// both see the next append at once (and the follower relays it).
fn a_reaction_and_a_follower_made_after_the_start_are_woken_without_a_heartbeat<B: TestBackend>() {
    let place = B::place();
    let engine = open::<B>(&place, "test", NEVER);
    engine.ensure_workspace("copy", &["tick"]).unwrap();
    engine.start().unwrap();
    let (seen_tx, seen) = mpsc::channel();
    let seen_tx = Mutex::new(seen_tx);
    engine
        .register_reaction(
            B::reaction("seen", "app")
                .on(["tick"])
                .handle(move |event, _| {
                    seen_tx.lock().unwrap().send(event.seq).unwrap();
                    Ok(())
                }),
        )
        .unwrap();
    engine.follow(Follow::new("app", "copy")).unwrap();
    let seq = engine.append("app", &tick(1)).unwrap().seq;
    assert_eq!(seen.recv_timeout(PATIENCE).unwrap(), seq);
    let copied = engine
        .wait_for_events(&Query::new("copy"), PATIENCE)
        .unwrap();
    assert_eq!(copied.len(), 1, "relayed at once");
    engine.shutdown();
}

/// The child's side of the cross-process test: appends one event when told.
fn child_process_appends_on_cue<B: TestBackend>() {
    let engine = parent_engine::<B>(&Opts::system("child"));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let a = engine.append("app", &tick(99)).unwrap();
    println!("\nappended {}", a.seq);
}

/// "Threads": another process's commit is noticed by the heartbeat.
fn a_commit_by_another_process_is_noticed_by_the_heartbeat<B: TestBackend>() {
    let place = B::place();
    let engine = open::<B>(&place, "test", QUICK);
    let mut child = child::<B>(&place, "child_process_appends_on_cue", &[]);
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            engine
                .wait_for_events(&Query::new("app"), PATIENCE)
                .unwrap()
        })
    };
    child.send("go\n");
    let page = waiter.join().unwrap();
    assert_eq!(page.len(), 1);
    // Read to the end: a child whose stdout is closed early fails writing
    // libtest's own last lines.
    let ended = child.finish();
    let out = ended
        .rest
        .iter()
        .find_map(|l| l.strip_prefix("appended ").map(str::to_owned))
        .expect("the child appended");
    assert_eq!(out.parse::<i64>().unwrap(), page[0].seq);
    assert!(ended.success);
}

/// A thread waiting (up to [`PATIENCE`]) for the workspace `app`'s events:
/// what it read, and how long it waited.
#[cfg(feature = "watch")]
fn waits_for_app(
    engine: &Engine<reflexr::Sqlite>,
) -> std::thread::JoinHandle<(Vec<reflexr::Event>, Duration)> {
    let engine = engine.clone();
    std::thread::spawn(move || {
        let t = Instant::now();
        let page = engine
            .wait_for_events(&Query::new("app"), PATIENCE)
            .unwrap();
        (page, t.elapsed())
    })
}

/// "Threads", feature `watch`: another process's commit wakes a waiter
/// through the WAL's writes. The heartbeat is an hour, so without the
/// watch this would wait out its patience.
#[cfg(feature = "watch")]
#[test]
fn a_commit_by_another_process_is_noticed_by_the_file_watch_without_a_heartbeat() {
    let place = <reflexr::Sqlite as TestBackend>::place();
    let engine = open::<reflexr::Sqlite>(&place, "test", NEVER);
    let mut child = child::<reflexr::Sqlite>(&place, "child_process_appends_on_cue", &[]);
    let waiter = waits_for_app(&engine);
    child.send("go\n");
    let (page, waited) = waiter.join().unwrap();
    assert!(waited < PATIENCE, "woken by the watch, not at the deadline");
    assert_eq!(page.len(), 1, "woken by the watch, with the event");
    let ended = child.finish();
    assert!(ended.success);
}

/// "Threads", feature `watch`, on Linux deaf to the directory while it
/// polls densely: this process commits rows of its own without a pause, in
/// turn to the file and to a neighbouring file of the same directory (each
/// commit a burst of WAL writes, none of them news, and none nudging the
/// waiter: they made no event or run), so the watch spends its time in its
/// dense polls, then deaf for as long as the process commits on, its
/// writer looking for other processes' commits as its transactions begin;
/// another process's commit meanwhile must still wake the waiter. The
/// heartbeat is an hour.
#[cfg(feature = "watch")]
#[test]
fn a_commit_by_another_process_is_noticed_by_the_file_watch_while_this_one_writes_on() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let place = <reflexr::Sqlite as TestBackend>::place();
    let engine = open::<reflexr::Sqlite>(&place, "test", NEVER);
    let neighbour = Engine::open(engine.path().with_file_name("neighbour.db")).unwrap();
    for e in [&engine, &neighbour] {
        e.write(|tx| {
            tx.conn()
                .execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")?;
            Ok(())
        })
        .unwrap();
    }
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let busy = {
        let (engines, stop) = ([engine.clone(), neighbour], stop.clone());
        std::thread::spawn(move || {
            let mut commits = 0u64;
            while !stop.load(Ordering::Relaxed) {
                engines[(commits % 2) as usize]
                    .write(|tx| {
                        tx.conn()
                            .execute("INSERT INTO notes (body) VALUES ('busy')", [])?;
                        Ok(())
                    })
                    .unwrap();
                commits += 1;
            }
            commits
        })
    };
    let mut child = child::<reflexr::Sqlite>(&place, "child_process_appends_on_cue", &[]);
    let waiter = waits_for_app(&engine);
    child.send("go\n");
    let (page, waited) = waiter.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let commits = busy.join().unwrap();
    assert!(waited < PATIENCE, "woken by the watch, not at the deadline");
    assert_eq!(page.len(), 1, "woken by the watch, with the event");
    assert!(commits > 0, "this process wrote meanwhile");
    let ended = child.finish();
    assert!(ended.success);
}

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use reflexr::Query;
    use reflexr_testkit as common;
    use std::time::Duration;

    on_backends!(a_wait_wakes_on_another_engines_commit,);

    /// Invariant 1, live: a reader waiting on its watch is woken by a commit of
    /// another engine on the same database (another process, as far as either
    /// knows) — by a notification (LISTEN/NOTIFY; on SQLite the WAL watch of the
    /// default feature `watch`), not by polling: the reader's heartbeat is an hour,
    /// so a wake-up that depended on it would fail the minute's wait.
    fn a_wait_wakes_on_another_engines_commit<B: TestBackend>() {
        let (place, clock, _engine) = setup::<B>();
        let reader = B::open_with(&place, &clock, "reader", Some(Duration::from_secs(3_600)));
        let writer = B::open(&place, &clock, "writer");
        // Subscribed before the commit, so the commit cannot come first unseen.
        let watch = reader.watch();
        assert!(reader.read(&Query::new("app")).unwrap().is_empty());
        writer.append("app", &made("late")).unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            assert!(
                watch.wait(Duration::from_secs(60)),
                "no wake-up within a minute"
            );
            got = reader.read(&Query::new("app")).unwrap();
        }
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].subject, "thing/late");
    }
}
