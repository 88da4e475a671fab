//! Crash torture, on every backend: a child process runs a mixed workload
//! on one database — appends with application rows, a stateful rule firing
//! runs, executors with failing handlers, a follower, a reaction enqueueing
//! deliveries — and is killed with SIGKILL at varying moments, again and
//! again. After every kill a checker verifies the invariants from what the
//! database holds (DESIGN.md 1–5, 8):
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
//! - each order's workflow: a `step_tx`'s row exactly when its step is
//!   recorded, a recorded step's outside effect never run again, children
//!   made once, a join over only when its children ended;
//! - no cursor ever moved back (8).
//!
//! `RELIABILITY_KILLS` sets the number of kills on each backend (default
//! 50; 10,000 for the long run, in a fresh database every 500 kills).

use reflexr_testkit as common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::torture::{
    append_orders_until_stopped, check, child_opts, prepare_place, rounds, workflows, workload,
};
use common::{children_on_backends, later, on_backends};

on_backends!(killed_again_and_again_the_invariants_hold);

children_on_backends!(child_process_workload);

/// The child: runs the workload with the engine's threads and appends orders,
/// printing each event's id once its transaction committed, until killed.
fn child_process_workload<B: TestBackend>() {
    let hours: i64 = std::env::var("REFLEXR_HOURS").unwrap().parse().unwrap();
    let e = parent_engine::<B>(&child_opts(hours));
    workload(&e);
    let _outside = workflows(&e);
    e.start().unwrap();
    println!("\nstarted");
    append_orders_until_stopped(&e, hours);
}

/// Kills per database. The checker reads the whole database after every
/// kill, so a long run goes on in fresh ones, one for every this many
/// kills, to stay linear in kills.
const KILLS_PER_FILE: u64 = 500;

/// Invariants 1–5 and 8 across SIGKILLs of the process that writes, at any
/// moment, `RELIABILITY_KILLS` times (see the module's doc).
fn killed_again_and_again_the_invariants_hold<B: TestBackend>() {
    let kills = rounds("RELIABILITY_KILLS", 50);
    let (mut done, mut file) = (0, 0);
    while done < kills {
        let n = (kills - done).min(KILLS_PER_FILE);
        let started = Instant::now();
        let kept = kill_again_and_again::<B>(n);
        file += 1;
        done += n;
        println!(
            "crash ({}): database {file}: {n} kills, {kept} acknowledged orders all kept, {:.1} s ({done} of {kills} kills)",
            B::NAME,
            started.elapsed().as_secs_f64()
        );
    }
}

/// One database: `kills` children killed at random moments, every
/// invariant checked after each; then a finisher ends the work and the
/// database is checked once more. Returns the number of acknowledged orders.
fn kill_again_and_again<B: TestBackend>(kills: u64) -> usize {
    let place = B::place();
    prepare_place::<B>(&place);
    // The checker runs nothing: it only reads.
    let checker = B::open(&place, &later(0), "checker");
    let committed = Mutex::new(HashSet::new());
    let mut cursors = BTreeMap::new();
    for i in 0..kills {
        let mut child = child::<B>(
            &place,
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
        cursors = check(&checker, &c, &cursors);
    }
    // A last engine, later than every child, finishes the work; then
    // everything has ended, and exactly once.
    let clock = later(kills as i64 + 10);
    let e = B::open_opts(&place, &Opts::new(&clock, "finisher"));
    workload(&e);
    let _outside = workflows(&e);
    // The workflows' sleeps and waits' timeouts pass on its clock.
    for _ in 0..20 {
        e.run_until_idle().unwrap();
        clock.advance(Duration::from_secs(3600));
    }
    let c = committed.lock().unwrap();
    assert!(
        c.len() as u64 > kills,
        "the children committed work ({} orders)",
        c.len()
    );
    check(&e, &c, &cursors);
    let unfinished: Vec<String> = e
        .runs(None, 100_000)
        .unwrap()
        .into_iter()
        .filter(|r| r.state != reflexr::RunState::Succeeded)
        .map(|r| {
            format!(
                "{} {} {:?} attempt {}/{} scope {:?} claimed by {:?} until {:?} due {} error {:?}",
                r.id,
                r.action,
                r.state,
                r.attempt,
                r.max_attempts,
                r.scope,
                r.claimed_by,
                r.claim_expires_at,
                r.due_at,
                r.last_error
            )
        })
        .collect();
    assert!(
        unfinished.is_empty(),
        "every run ended well: {unfinished:#?}"
    );
    assert_eq!(
        B::count(
            &e,
            "SELECT count(*) FROM reflexr_events WHERE workspace = 'mirror'"
        ),
        B::count(&e, "SELECT count(*) FROM orders"),
        "the mirror holds every order once"
    );
    for c in e.cursors().unwrap() {
        assert_eq!(c.lag, 0, "{c:?}");
    }
    c.len()
}
