//! Crash torture: a child process runs a mixed workload on one file —
//! appends with application rows, a stateful rule firing runs, executors with
//! failing handlers, a follower, a reaction enqueueing deliveries — and is
//! killed with SIGKILL at varying moments, again and again. After every kill
//! a checker verifies the invariants from the file alone (DESIGN.md 1–5, 8):
//!
//! - no committed event lost, and none without its application row (2);
//! - ids unique per workspace (3);
//! - each (rule, event) decided exactly once: the `RuleFired` events are
//!   exactly what an independent fold of the log predicts up to the rule's
//!   cursor, and none after it (4);
//! - every run ended or still pending, none lost, none completed twice (5);
//! - each handled order's delivery enqueued exactly once;
//! - the follower's target holds every selected source event up to its
//!   cursor exactly once;
//! - no cursor ever moved back (8).
//!
//! `RELIABILITY_KILLS` sets the number of kills (default 50; 10,000 for the
//! long run, in a fresh file every 500 kills).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::torture::{
    Later, append_orders_until_stopped, check, child_engine, int, prepare, rounds, workload,
};
use common::{Scene, is_child, parent_file};
use reflexr::Engine;
use rusqlite::Connection;

/// The child: runs the workload with the engine's threads and appends orders,
/// printing each event's id once its transaction committed, until killed.
#[test]
fn child_process_workload() {
    if !is_child() {
        return; // Only a child started by the torture test does this work.
    }
    let hours: i64 = std::env::var("REFLEXR_HOURS").unwrap().parse().unwrap();
    let e = child_engine(Engine::builder(parent_file()), hours);
    e.start().unwrap();
    println!("\nstarted");
    append_orders_until_stopped(&e, hours);
}

/// Kills per file. The checker reads the whole file after every kill, so a
/// long run goes on in fresh files, a file for every this many kills, to
/// stay linear in kills.
const KILLS_PER_FILE: u64 = 500;

#[test]
fn killed_again_and_again_the_invariants_hold() {
    let kills = rounds("RELIABILITY_KILLS", 50);
    let (mut done, mut file) = (0, 0);
    while done < kills {
        let n = (kills - done).min(KILLS_PER_FILE);
        let started = Instant::now();
        let kept = kill_again_and_again(n);
        file += 1;
        done += n;
        println!(
            "crash: file {file}: {n} kills, {kept} acknowledged orders all kept, {:.1} s ({done} of {kills} kills)",
            started.elapsed().as_secs_f64()
        );
    }
}

/// One file: `kills` children killed at random moments, every invariant
/// checked after each; then a finisher ends the work and the file is
/// checked once more. Returns the number of acknowledged orders.
fn kill_again_and_again(kills: u64) -> usize {
    let s = Scene::new();
    prepare(&s.path);
    let committed = Mutex::new(HashSet::new());
    let mut cursors = BTreeMap::new();
    for i in 0..kills {
        let mut child = s.child(
            "child_process_workload",
            &[("REFLEXR_HOURS", (i + 1).to_string())],
        );
        child.past("started");
        // Kill at a varying moment: 5 to 150 ms into the work.
        std::thread::sleep(Duration::from_millis(5 + fastrand::u64(..145)));
        let ended = child.kill();
        let mut c = committed.lock().unwrap();
        for l in ended.rest {
            if let Some(id) = l.strip_prefix("committed ") {
                c.insert(id.to_string());
            }
        }
        cursors = check(&s.path, &c, &cursors);
    }
    // A last engine, later than every child, finishes the work; then
    // everything has ended, and exactly once.
    let e = Engine::builder(&s.path)
        .clock(Later(kills as i64 + 10))
        .holder_id("finisher")
        .open()
        .unwrap();
    workload(&e);
    e.run_until_idle().unwrap();
    let c = committed.lock().unwrap();
    assert!(
        c.len() as u64 > kills,
        "the children committed work ({} orders)",
        c.len()
    );
    check(&s.path, &c, &cursors);
    let conn = Connection::open(&s.path).unwrap();
    assert_eq!(
        int(
            &conn,
            "SELECT count(*) FROM reflexr_runs WHERE state NOT IN ('succeeded')"
        ),
        0,
        "every run ended well"
    );
    assert_eq!(
        int(
            &conn,
            "SELECT count(*) FROM reflexr_events WHERE workspace = 'mirror'"
        ),
        int(&conn, "SELECT count(*) FROM orders"),
        "the mirror holds every order once"
    );
    for c in e.cursors().unwrap() {
        assert_eq!(c.lag, 0, "{c:?}");
    }
    c.len()
}
