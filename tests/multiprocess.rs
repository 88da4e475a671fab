//! Four processes on one file, for a bounded time, each appending and
//! running the engine's threads; one is killed midway. Checked from what was
//! written:
//!
//! - at most one evaluator per workspace at any moment (invariant 7): every
//!   `RuleFired` records the evaluator lease it was committed under, and in
//!   seq order the generation never goes down — no holder of an older lease
//!   committed after a newer one took over;
//! - no `SQLITE_BUSY` / `database is locked` reached a caller: every append of
//!   every process succeeded (a process whose append failed exits non-zero);
//! - nothing lost or duplicated: every append a process reported is there
//!   once, every (rule, event) is decided once, every run completed once.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{Scene, is_child, parent_file};
use reflexr::{Clock, Decision, Engine, NewEvent, Rule, Scope, SystemClock};
use rusqlite::Connection;

const EVERY: i64 = 4;

fn register(e: &Engine) {
    e.ensure_workspace("app", &["tick"]).unwrap();
    e.write(|tx| {
        tx.execute(
            "CREATE TABLE IF NOT EXISTS executed (run TEXT PRIMARY KEY)",
            [],
        )
    })
    .unwrap();
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
            tx.execute("INSERT INTO executed (run) VALUES (?1)", [&run.id])?;
            Ok(())
        })?;
        Ok(())
    })
    .unwrap();
}

/// One process: runs the engine's threads and appends for `REFLEXR_SECS`
/// seconds, printing each appended id; exits non-zero if any call failed.
#[test]
fn child_process_node() {
    if !is_child() {
        return; // Only a child started by the test below does this work.
    }
    let node: i64 = std::env::var("REFLEXR_NODE").unwrap().parse().unwrap();
    let ms: u64 = std::env::var("REFLEXR_MS").unwrap().parse().unwrap();
    let delay: u64 = std::env::var("REFLEXR_DELAY").unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_millis(delay));
    let e = Engine::builder(parent_file())
        .holder_id(format!("node-{node}"))
        .lease_ttl(Duration::from_millis(600))
        .heartbeat(Duration::from_millis(10))
        .open()
        .unwrap();
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

#[test]
fn four_processes_on_one_file_lose_nothing_duplicate_nothing_and_fence_their_evaluators() {
    let s = Scene::new();
    register(&Engine::open(&s.path).unwrap());
    // Staggered starts and lives, so the evaluator lease moves from process
    // to process: node 0 starts first (and so most likely evaluates first)
    // and is killed midway, so its leases must lapse before another takes
    // over; the others release theirs as they exit one after another.
    let children: Vec<_> = (0..4)
        .map(|node| {
            let ms = 1_000 + node * 400;
            let child = s.child(
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
                // Kill node 0 once it has appended for a while.
                child.until(|l| {
                    ids.extend(l.strip_prefix("appended ").map(str::to_string));
                    (ids.len() == 200).then_some(())
                });
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
    let e = Engine::builder(&s.path)
        .clock(reflexr::ManualClock::new(SystemClock.now_ms() + 3_600_000))
        .open()
        .unwrap();
    register(&e);
    e.run_until_idle().unwrap();

    let conn = Connection::open(&s.path).unwrap();
    let ids: Vec<String> = conn
        .prepare("SELECT id FROM reflexr_events WHERE workspace = 'app' AND type = 'tick'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let stored: HashSet<String> = ids.iter().cloned().collect();
    assert_eq!(ids.len(), stored.len(), "no event twice");
    for id in &appended {
        assert!(stored.contains(id), "appended {id} lost");
    }
    assert!(
        appended.len() > 500,
        "the processes did work ({})",
        appended.len()
    );

    // Fencing: the evaluator generation never goes down in commit order, and
    // each generation belongs to one holder.
    let mut stmt = conn
        .prepare(
            "SELECT seq, json_extract(payload, '$.event_seq'), \
                    json_extract(payload, '$.evaluator.holder'), \
                    json_extract(payload, '$.evaluator.generation') \
             FROM reflexr_events WHERE type = 'RuleFired' ORDER BY seq",
        )
        .unwrap();
    let fired: Vec<(i64, i64, String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let mut holders: HashMap<i64, String> = HashMap::new();
    let mut last_generation = 0;
    for (_, _, holder, generation) in &fired {
        assert!(
            *generation >= last_generation,
            "an older evaluator committed after a newer one"
        );
        last_generation = *generation;
        let owner = holders.entry(*generation).or_insert_with(|| holder.clone());
        assert_eq!(owner, holder, "one holder per generation");
    }
    let distinct: HashSet<&String> = holders.values().collect();
    assert!(
        distinct.len() >= 2,
        "the lease moved between processes: {holders:?}"
    );

    // Exactly once: the firings are the fold's, and each run completed once.
    let mut counts: HashMap<i64, i64> = HashMap::new();
    let mut want = BTreeMap::new();
    let mut stmt = conn
        .prepare(
            "SELECT seq, json_extract(payload, '$.node') FROM reflexr_events \
             WHERE type = 'tick' ORDER BY seq",
        )
        .unwrap();
    for row in stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
    {
        let (seq, node) = row.unwrap();
        let c = counts.entry(node).or_default();
        *c += 1;
        if *c % EVERY == 0 {
            want.insert(seq, 1);
        }
    }
    let mut got: BTreeMap<i64, i64> = BTreeMap::new();
    for (_, event_seq, _, _) in &fired {
        *got.entry(*event_seq).or_default() += 1;
    }
    assert_eq!(got, want);
    let executed: i64 = conn
        .query_row("SELECT count(*) FROM executed", [], |r| r.get(0))
        .unwrap();
    assert_eq!(executed as usize, fired.len(), "each run completed once");
}
