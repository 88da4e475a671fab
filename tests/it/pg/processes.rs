//! Processes against one PostgreSQL server (feature `postgres`): four child
//! processes append at once while the parent follows the log with a
//! cursor; children SIGKILLed mid-write, over and over, after which the
//! database alone must show every invariant of the core: each acknowledged
//! write present — its application row and its event together (invariant
//! 2) — no id twice (3), and seqs dense in commit order (1); four
//! processes executing one queue while one of them is SIGKILLed, its claims
//! taken over once they lapse (5). (Evaluators SIGKILLed mid-batch, the
//! crash torture and four processes with moving evaluators run on both
//! backends: `tests/it/rules.rs`, `tests/it/crash.rs`, `tests/it/multiprocess.rs`.)
//! The long run: `PG_KILLS=300 cargo test --release --features postgres
//! --test it pg::processes -- --nocapture`.
#![cfg(feature = "postgres")]

use reflexr_testkit as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::backend::{PgSchema, TestBackend};
use common::{Watched, is_child, spawn_child};
use reflexr::postgres::{Client, IsolationLevel, NoTls};
use reflexr::{Engine, Enqueue, ManualClock, NewEvent, Postgres, Query, RunState};

const TYPES: &[&str] = &["thing.made"];

fn made(id: &str) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "child", 1_000).id(id)
}

/// Inside a child: the engine on the parent's schema (`REFLEXR_PG_CONFIG`).
fn child_engine() -> Engine<Postgres> {
    let config = std::env::var("REFLEXR_PG_CONFIG").expect("REFLEXR_PG_CONFIG");
    Engine::builder_postgres(config)
        .holder_id(format!("child-{}", std::process::id()))
        .pool_size(2)
        .open()
        .expect("open")
}

fn open_parent(place: &PgSchema) -> Engine<Postgres> {
    let engine = Postgres::open(place, &ManualClock::new(1_800_000_000_000), "parent");
    engine.ensure_workspace("app", TYPES).unwrap();
    Postgres::create_things(&engine);
    engine
}

fn child(place: &PgSchema, entry: &str, name: &str, count: usize) -> Watched {
    Watched::new(spawn_child(
        entry,
        &[
            ("REFLEXR_PG_CONFIG", place.config()),
            ("REFLEXR_CHILD_NAME", name.to_string()),
            ("REFLEXR_CHILD_COUNT", count.to_string()),
        ],
    ))
}

/// The child of both tests: appends `REFLEXR_CHILD_COUNT` events, each with
/// its application row in one write (in groups of up to three threads'
/// writes sharing transactions), printing each acknowledged id on a line
/// of its own, written at once.
#[test]
fn child_appends() {
    if !is_child() {
        return;
    }
    let engine = child_engine();
    let name = std::env::var("REFLEXR_CHILD_NAME").unwrap();
    let count: usize = std::env::var("REFLEXR_CHILD_COUNT")
        .unwrap()
        .parse()
        .unwrap();
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let (engine, name) = (engine.clone(), name.clone());
            std::thread::spawn(move || {
                use std::io::Write;
                for i in (t..count).step_by(3) {
                    let id = format!("{name}-{i}");
                    engine
                        .write(|tx| {
                            Postgres::insert_thing(tx, &id)?;
                            tx.append("app", &made(&id))
                        })
                        .expect("append");
                    let line = format!("committed {id}\n");
                    std::io::stdout().write_all(line.as_bytes()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    println!("done");
}

/// Invariants 1 and 3 across processes: four processes append at once; the
/// parent, following with a cursor, reads every event once, in dense seq
/// order, and each with its row.
#[test]
fn four_processes_append_and_a_follower_reads_each_once() {
    if is_child() {
        return;
    }
    const EACH: usize = 150;
    let place = PgSchema::new();
    let parent = open_parent(&place);
    let children: Vec<Watched> = (0..4)
        .map(|c| child(&place, "child_appends", &format!("p{c}"), EACH))
        .collect();
    let mut cursor = 0;
    let mut seen: Vec<(i64, String)> = Vec::new();
    while seen.len() < 4 * EACH {
        let page = parent
            .wait_for_events(&Query::new("app").after(cursor), Duration::from_secs(60))
            .unwrap();
        assert!(!page.is_empty(), "a minute passed with nothing new");
        for e in page {
            assert!(e.seq > cursor);
            cursor = e.seq;
            seen.push((e.seq, e.id));
        }
    }
    for c in children {
        let ended = c.finish();
        assert!(ended.success, "a child failed");
    }
    let seqs: Vec<i64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(seqs, (1..=(4 * EACH) as i64).collect::<Vec<_>>());
    let ids: BTreeSet<String> = seen.into_iter().map(|s| s.1).collect();
    assert_eq!(ids.len(), 4 * EACH);
    assert_eq!(
        Postgres::things(&parent)
            .into_iter()
            .collect::<BTreeSet<_>>(),
        ids,
        "each event with its row"
    );
}

/// What the database holds, checked after a kill, in one snapshot (a
/// killed child's backend may still finish a COMMIT it had received): every
/// acknowledged id has its event and its row; rows and events are the same
/// set; no id twice; seqs dense. Returns how many events there are.
fn check(place: &PgSchema, acknowledged: &BTreeSet<String>) -> usize {
    let mut c = Client::connect(&place.config(), NoTls).unwrap();
    let mut tx = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .unwrap();
    let events: Vec<(i64, String)> = tx
        .query(
            "SELECT seq, id FROM reflexr_events WHERE workspace = 'app' ORDER BY seq",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let rows: BTreeSet<String> = tx
        .query("SELECT id FROM things", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let head: i64 = tx
        .query_one("SELECT seq FROM reflexr_head", &[])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.0).collect();
    assert_eq!(
        seqs,
        (1..=events.len() as i64).collect::<Vec<_>>(),
        "seqs dense"
    );
    let ids: BTreeSet<String> = events.iter().map(|e| e.1.clone()).collect();
    assert_eq!(ids.len(), events.len(), "no id twice");
    assert_eq!(rows, ids, "a row for each event and an event for each row");
    let lost: Vec<&String> = acknowledged.difference(&ids).collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    assert_eq!(head, events.len() as i64, "the head is the last seq");
    events.len()
}

/// Crash torture on PostgreSQL: a child appending with three threads is
/// SIGKILLed at a random moment, `PG_KILLS` times (default 12) on one
/// database; after each kill the parent checks the invariants from the
/// database alone, then the next child goes on from where the log stands.
#[test]
fn children_killed_mid_write_lose_nothing_acknowledged() {
    if is_child() {
        return;
    }
    let kills: usize = std::env::var("PG_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let place = PgSchema::new();
    let _parent = open_parent(&place);
    let mut acknowledged = BTreeSet::new();
    let mut held = 0;
    for k in 0..kills {
        let mut c = child(&place, "child_appends", &format!("k{k}"), 1_000_000);
        // Let it write a random number of acknowledged events first, so
        // the kill lands anywhere: between writes, mid-statement, mid-commit.
        let wait_for = fastrand::usize(1..40);
        let mut got = 0;
        while got < wait_for {
            match c.until(|l| l.strip_prefix("committed ").map(String::from)) {
                Some(id) => {
                    acknowledged.insert(id);
                    got += 1;
                }
                None => panic!("the child ended before it was killed"),
            }
        }
        std::thread::sleep(Duration::from_micros(fastrand::u64(0..3_000)));
        let ended = c.kill();
        acknowledged.extend(
            ended
                .rest
                .iter()
                .filter_map(|l| l.strip_prefix("committed ").map(String::from)),
        );
        held = check(&place, &acknowledged);
    }
    println!(
        "{kills} kills: {} acknowledged writes kept, {} more committed whose \
         acknowledgement the kill cut off; every invariant held",
        acknowledged.len(),
        held - acknowledged.len()
    );
}

/// The child of the executing test: two executors whose handler completes
/// each run with its application row, a few milliseconds in; the claims'
/// lease is a second, so a killed child's claims lapse soon.
#[test]
fn child_executes() {
    if !is_child() {
        return;
    }
    let config = std::env::var("REFLEXR_PG_CONFIG").expect("REFLEXR_PG_CONFIG");
    let engine = Engine::builder_postgres(config)
        .holder_id(format!("child-{}", std::process::id()))
        .pool_size(4)
        .executors(2)
        .claim_batch(4)
        .lease_ttl(Duration::from_secs(1))
        .heartbeat(Duration::from_millis(50))
        .open()
        .expect("open");
    engine
        .register_action("work", |run, ctx| {
            std::thread::sleep(Duration::from_millis(fastrand::u64(1..4)));
            let id = run.id.clone();
            ctx.complete(|tx| Postgres::insert_thing(tx, &id))?;
            println!("completed {id}");
            Ok(())
        })
        .unwrap();
    engine.start().unwrap();
    println!("started");
    // Until the parent kills it, or its end of our input closes.
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).unwrap_or(0) > 0 {}
}

/// Invariant 5 across processes: four processes execute one queue; one is
/// SIGKILLed mid-work, and the runs it held are claimed again once their
/// claims lapse. Every run ends succeeded, and its completion — the
/// application's row, committed with the settlement — is there exactly once.
#[test]
fn four_processes_execute_one_queue_and_a_killed_ones_claims_are_taken_over() {
    if is_child() {
        return;
    }
    const RUNS: i64 = 400;
    let place = PgSchema::new();
    // The system clock, as the children's: the runs are due at once.
    let parent = Engine::builder_postgres(place.config())
        .holder_id("parent")
        .heartbeat(Duration::from_millis(50))
        .open()
        .unwrap();
    Postgres::create_things(&parent);
    let ids: Vec<String> = parent
        .write(|tx| {
            (0..RUNS)
                .map(|n| Ok(tx.enqueue(&Enqueue::new("work", &n))?.id))
                .collect::<reflexr::Result<Vec<_>>>()
        })
        .unwrap();
    let mut children: Vec<Watched> = (0..4)
        .map(|c| child(&place, "child_executes", &format!("x{c}"), 0))
        .collect();
    // Kill the first once it has completed a few runs: it holds claims then.
    let mut victim = children.remove(0);
    for _ in 0..5 {
        victim
            .until(|l| l.strip_prefix("completed ").map(String::from))
            .expect("the victim completes runs before it is killed");
    }
    let killed = victim.kill();
    let killed_done = killed
        .rest
        .iter()
        .filter(|l| l.starts_with("completed "))
        .count();
    for id in &ids {
        let run = parent.wait_for_run(id, Duration::from_secs(120)).unwrap();
        assert_eq!(run.state, RunState::Succeeded, "run {id}");
    }
    for c in children {
        c.kill();
    }
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(Postgres::things(&parent), expected, "each completed once");
    // The victim held the rest of its executors' batches when it died
    // (claims of four, a handler of a few milliseconds each).
    let retaken = parent
        .runs(None, RUNS as usize)
        .unwrap()
        .iter()
        .filter(|r| r.attempt > 1)
        .count();
    assert!(retaken > 0, "the killed child's claims were taken over");
    println!(
        "{RUNS} runs over four processes, one killed after completing at least {} of \
         them; {retaken} runs claimed again after its claims lapsed",
        5 + killed_done
    );
}
