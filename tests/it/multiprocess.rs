//! Four processes on one database — an SQLite file, or with the feature a
//! PostgreSQL schema (`on_backends!`) — for a bounded time, each appending
//! and running the engine's threads; one is killed midway (after its
//! hundredth append). Checked from
//! what was written:
//!
//! - at most one evaluator per workspace at any moment (invariant 7): every
//!   `RuleFired` records the evaluator lease it was committed under, and in
//!   seq order the generation never goes down — no holder of an older lease
//!   committed after a newer one took over;
//! - no busy or lock error reached a caller (`SQLITE_BUSY`, a PostgreSQL
//!   serialization failure or deadlock): every append of every process
//!   succeeded (a process whose append failed exits non-zero);
//! - nothing lost or duplicated: every append a process reported is there
//!   once, every (rule, event) is decided once, every run completed once.

use reflexr_testkit as common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, on_backends};
use reflexr::{Clock, Decision, Engine, ManualClock, NewEvent, Query, Rule, Scope, SystemClock};

on_backends!(
    four_processes_on_one_database_lose_nothing_duplicate_nothing_and_fence_their_evaluators
);

children_on_backends!(child_process_node);

/// How many appends node 0 makes before it is killed.
const KILL_AFTER: usize = 100;

const EVERY: i64 = 4;

fn register<B: TestBackend>(e: &Engine<B>) {
    e.ensure_workspace("app", &["tick"]).unwrap();
    B::sql(
        e,
        "CREATE TABLE IF NOT EXISTS executed (run TEXT PRIMARY KEY)",
    );
    #[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
    struct Count {
        n: i64,
    }
    e.register_rule(
        Rule::new("fourth", "app")
            .on(["tick"])
            .scope(Scope::payload("node"))
            .action("record")
            .decide_with_state(Count::default(), |_, c| {
                c.n += 1;
                Ok(if c.n % EVERY == 0 {
                    Decision::Fire(serde_json::Value::Null)
                } else {
                    Decision::Skip
                })
            }),
    )
    .unwrap();
    e.register_action("record", |run, ctx| {
        ctx.complete(|tx| {
            B::run_sql(
                tx,
                &format!("INSERT INTO executed (run) VALUES ('{}')", run.id),
            )
        })?;
        Ok(())
    })
    .unwrap();
}

/// One process: runs the engine's threads and appends for `REFLEXR_MS`
/// milliseconds, printing each appended id; exits non-zero if any call
/// failed. On the system clock: its leases must lapse by themselves once it
/// is killed.
fn child_process_node<B: TestBackend>() {
    let node: i64 = std::env::var("REFLEXR_NODE").unwrap().parse().unwrap();
    let ms: u64 = std::env::var("REFLEXR_MS").unwrap().parse().unwrap();
    let delay: u64 = std::env::var("REFLEXR_DELAY").unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_millis(delay));
    let e = parent_engine::<B>(
        &Opts::system(&format!("node-{node}"))
            .lease_ttl(Duration::from_millis(600))
            .heartbeat(Duration::from_millis(10)),
    );
    register(&e);
    e.start().unwrap();
    println!("\nstarted");
    let until = Instant::now() + Duration::from_millis(ms);
    let mut i = 0;
    while Instant::now() < until {
        let id = format!("n{node}-{i}");
        e.append(
            "app",
            &NewEvent::new("tick", format!("node/{node}"), "node", 0)
                .id(id.clone())
                .payload(&serde_json::json!({ "node": node })),
        )
        .unwrap();
        println!("\nappended {id}");
        i += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    e.shutdown();
}

/// Every event of `app` of `kind`, in seq order.
fn events<B: TestBackend>(e: &Engine<B>, kind: &str) -> Vec<reflexr::Event> {
    let mut all: Vec<reflexr::Event> = Vec::new();
    loop {
        let after = all.last().map_or(0, |ev| ev.seq);
        let page = e
            .read(&Query::new("app").types([kind]).after(after).limit(1_000))
            .unwrap();
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// Invariants 3, 4, 5 and 7 with four processes on one database (see the
/// module's doc).
fn four_processes_on_one_database_lose_nothing_duplicate_nothing_and_fence_their_evaluators<
    B: TestBackend,
>() {
    let place = B::place();
    register(&B::open_opts(&place, &Opts::system("setup")));
    // Staggered starts and lives, so the evaluator lease moves from process
    // to process: node 0 starts first (and so most likely evaluates first)
    // and is killed midway, so its leases must lapse before another takes
    // over; the others release theirs as they exit one after another.
    let children: Vec<_> = (0..4)
        .map(|node| {
            // Node 0 appends until it is killed (ten minutes at most).
            let ms = if node == 0 {
                600_000
            } else {
                1_000 + node * 400
            };
            let child = child::<B>(
                &place,
                "child_process_node",
                &[
                    ("REFLEXR_NODE", node.to_string()),
                    ("REFLEXR_MS", ms.to_string()),
                    ("REFLEXR_DELAY", (node * 250).to_string()),
                ],
            );
            (node, child)
        })
        .collect();
    let mut appended = HashSet::new();
    let mut readers = Vec::new();
    for (node, mut child) in children {
        readers.push(std::thread::spawn(move || {
            let mut ids = Vec::new();
            let ended = if node == 0 {
                // Kill node 0 once it has appended for a while (however
                // long a loaded server takes to get there).
                let got_there = child.until(|l| {
                    ids.extend(l.strip_prefix("appended ").map(str::to_string));
                    (ids.len() == KILL_AFTER).then_some(())
                });
                assert!(got_there.is_some(), "node 0 ended before it was killed");
                child.kill()
            } else {
                child.finish()
            };
            for l in &ended.rest {
                if let Some(id) = l.strip_prefix("appended ") {
                    ids.push(id.to_string());
                }
            }
            (node, ended.success, ids)
        }));
    }
    for r in readers {
        let (node, success, ids) = r.join().unwrap();
        if node != 0 {
            assert!(success, "node {node}: a call failed (see its stderr)");
        }
        appended.extend(ids);
    }

    // A last engine, an hour later (node 0's leases have lapsed for it),
    // finishes what the processes left.
    let e = B::open_opts(
        &place,
        &Opts::new(
            &ManualClock::new(SystemClock.now_ms() + 3_600_000),
            "finisher",
        ),
    );
    register(&e);
    e.run_until_idle().unwrap();

    let ticks = events(&e, "tick");
    let stored: HashSet<String> = ticks.iter().map(|ev| ev.id.clone()).collect();
    assert_eq!(ticks.len(), stored.len(), "no event twice");
    for id in &appended {
        assert!(stored.contains(id), "appended {id} lost");
    }
    // Every process did work: node 0 until it was killed, the others each
    // for a second or more. (How much is the server's speed, not an
    // invariant: a PostgreSQL server on this machine's two cores takes
    // about 400 appends a second in all, an SQLite file over 1,000, and
    // far fewer while the rest of the suite runs.)
    for node in 0..4 {
        let n = appended
            .iter()
            .filter(|id| id.starts_with(&format!("n{node}-")))
            .count();
        assert!(n > 0, "node {node} appended nothing");
        if node == 0 {
            assert!(n >= KILL_AFTER, "node 0 appended {n} events");
        }
    }

    // Fencing: the evaluator generation never goes down in commit order, and
    // each generation belongs to one holder.
    let fired: Vec<serde_json::Value> = events(&e, "RuleFired")
        .iter()
        .map(|ev| ev.payload().unwrap())
        .collect();
    let mut holders: HashMap<i64, String> = HashMap::new();
    let mut last_generation = 0;
    for f in &fired {
        let holder = f["evaluator"]["holder"].as_str().unwrap().to_string();
        let generation = f["evaluator"]["generation"].as_i64().unwrap();
        assert!(
            generation >= last_generation,
            "an older evaluator committed after a newer one"
        );
        last_generation = generation;
        let owner = holders.entry(generation).or_insert_with(|| holder.clone());
        assert_eq!(*owner, holder, "one holder per generation");
    }
    let distinct: HashSet<&String> = holders.values().collect();
    assert!(
        distinct.len() >= 2,
        "the lease moved between processes: {holders:?}"
    );

    // Exactly once: the firings are the fold's, and each run completed once.
    let mut counts: HashMap<i64, i64> = HashMap::new();
    let mut want = BTreeMap::new();
    for ev in &ticks {
        let p: serde_json::Value = ev.payload().unwrap();
        let c = counts.entry(p["node"].as_i64().unwrap()).or_default();
        *c += 1;
        if *c % EVERY == 0 {
            want.insert(ev.seq, 1);
        }
    }
    let mut got: BTreeMap<i64, i64> = BTreeMap::new();
    for f in &fired {
        *got.entry(f["event_seq"].as_i64().unwrap()).or_default() += 1;
    }
    assert_eq!(got, want);
    let executed = B::count(&e, "SELECT count(*) FROM executed");
    assert_eq!(executed as usize, fired.len(), "each run completed once");
}
