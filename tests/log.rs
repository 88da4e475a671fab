//! The change log: appends in the caller's transaction, ids, seq order,
//! concurrent and cross-process appenders, reads.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Arrange, Scene, count, is_child, parent_file};
use reflexr::{Engine, Error, NewEvent, Query};
use serde::{Deserialize, Serialize};

/// The types of `app`, the workspace of every test.
const APP_TYPES: &[&str] = &["thing.made", "thing.gone"];

/// The application's table, written with its events.
const THINGS_SQL: &str = "CREATE TABLE things (id TEXT PRIMARY KEY)";

fn made(id: &str) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000)
        .payload(&serde_json::json!({ "id": id }))
}

#[test]
fn app_rows_and_events_commit_or_roll_back_together() {
    // Invariant 2: together or not at all.
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);

    engine
        .write(|tx| {
            tx.execute("INSERT INTO things VALUES ('kept')", [])?;
            tx.append("app", &made("kept"))
        })
        .unwrap();

    let err = engine
        .write(|tx| {
            tx.execute("INSERT INTO things VALUES ('failed')", [])?;
            tx.append("app", &made("failed"))?;
            Err::<(), _>(Error::Invalid {
                field: "thing",
                reason: "the application changed its mind".into(),
            })
        })
        .unwrap_err();
    assert!(err.is_bad_input());

    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = engine.write(|tx| {
            tx.execute("INSERT INTO things VALUES ('panicked')", [])?;
            tx.append("app", &made("panicked"))?;
            panic!("the application panics mid-write");
            #[allow(unreachable_code)]
            Ok(())
        });
    }));
    assert!(panicked.is_err(), "the panic reaches the caller");

    // An append that fails rolls back the rows written before it too.
    let err = engine
        .write(|tx| {
            tx.execute("INSERT INTO things VALUES ('bad-append')", [])?;
            tx.append("app", &NewEvent::new("not.registered", "x", "tester", 1))
        })
        .unwrap_err();
    assert!(err.is_not_found());

    assert_eq!(count(&engine, "SELECT count(*) FROM things"), 1);
    let events = engine.read(&Query::new("app")).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].subject, "thing/kept");
}

#[test]
fn reappending_an_id_is_a_noop_that_reports_the_existing_seq() {
    // Invariant 3: once per id, per workspace.
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    engine.ensure_workspace("other", &["thing.made"]).unwrap();

    let first = engine.append("app", &made("a").id("evt-1")).unwrap();
    assert!(!first.existing);
    engine.append("app", &made("b")).unwrap();
    // Same id, different content: still a no-op, and the first one stands.
    let again = engine.append("app", &made("changed").id("evt-1")).unwrap();
    assert!(again.existing);
    assert_eq!(again.seq, first.seq);
    assert_eq!(again.id, "evt-1");
    let stored = engine.event(first.seq).unwrap().unwrap();
    assert_eq!(stored.subject, "thing/a");

    // The same id in another workspace is another event.
    let elsewhere = engine.append("other", &made("a").id("evt-1")).unwrap();
    assert!(!elsewhere.existing);
    assert_ne!(elsewhere.seq, first.seq);

    // Twice in one transaction: one event.
    let (x, y) = engine
        .write(|tx| {
            let x = tx.append("app", &made("c").id("evt-2"))?;
            let y = tx.append("app", &made("c").id("evt-2"))?;
            Ok((x, y))
        })
        .unwrap();
    assert_eq!((x.existing, y.existing, x.seq), (false, true, y.seq));
    assert_eq!(
        count(
            &engine,
            "SELECT count(*) FROM reflexr_events WHERE id = 'evt-2'"
        ),
        1
    );

    // A re-append takes no seq: the head stays, and the next event comes
    // right after the last one (no gap, and `events_appended` counts only
    // events that exist).
    let head = engine.head_seq().unwrap();
    for _ in 0..3 {
        assert!(
            engine
                .append("app", &made("x").id("evt-1"))
                .unwrap()
                .existing
        );
    }
    assert_eq!(engine.head_seq().unwrap(), head);
    assert_eq!(engine.append("app", &made("d")).unwrap().seq, head + 1);
}

#[test]
fn generated_ids_are_time_ordered_uuids() {
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    let ids: Vec<String> = (0..50)
        .map(|i| engine.append("app", &made(&i.to_string())).unwrap().id)
        .collect();
    for id in &ids {
        let u = uuid::Uuid::parse_str(id).expect("a UUID");
        assert_eq!(u.get_version_num(), 7);
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids, "later ids sort later");
}

#[test]
fn concurrent_appenders_get_gap_free_seqs_in_commit_order() {
    // Invariant 1: a reader after cursor c sees every committed event after
    // c in seq order, and nothing later appears below what it has seen.
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    const THREADS: usize = 4;
    const EACH: usize = 300;
    let done = Arc::new(AtomicBool::new(false));

    // A reader tails the log while the writers run: each page must start
    // right after what it has seen (no gaps, nothing inserted below).
    let reader = {
        let engine = engine.clone();
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut seen = 0i64;
            loop {
                let finished = done.load(Ordering::SeqCst);
                let page = engine.read(&Query::new("app").after(seen)).unwrap();
                for e in &page {
                    assert_eq!(e.seq, seen + 1, "gap or reorder after {seen}");
                    seen = e.seq;
                }
                if finished && page.is_empty() {
                    return seen;
                }
            }
        })
    };

    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..EACH {
                    let a = engine.append("app", &made(&format!("{t}-{i}"))).unwrap();
                    mine.push(a.seq);
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in writers {
        let mine = w.join().unwrap();
        assert!(
            mine.windows(2).all(|p| p[0] < p[1]),
            "one thread's seqs rise"
        );
        all.extend(mine);
    }
    done.store(true, Ordering::SeqCst);
    let tailed = reader.join().unwrap();

    all.sort_unstable();
    let expected: Vec<i64> = (1..=(THREADS * EACH) as i64).collect();
    assert_eq!(all, expected, "gap-free, each seq once");
    assert_eq!(tailed, (THREADS * EACH) as i64);
    let stats = engine.writer_stats();
    assert!(stats.writes >= stats.commits);
}

/// The child's side of the cross-process test: appends through its own
/// engine, printing each seq, until its stdin is closed.
#[test]
fn child_process_appender() {
    if !is_child() {
        return; // Only a child started by the test below does this work.
    }
    let engine = Engine::open(parent_file()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut sink);
            stop.store(true, Ordering::SeqCst);
        });
    }
    let mut i = 0;
    loop {
        // Checked before the append, so the last append comes after the
        // parent closed stdin, which it does after its own last append.
        let last = stop.load(Ordering::SeqCst);
        let a = engine.append("app", &made(&format!("child-{i}"))).unwrap();
        // On a line of its own: libtest prints its text without a line break.
        println!("\nseq {}", a.seq);
        i += 1;
        if last {
            break;
        }
    }
}

#[test]
fn a_second_process_appends_at_the_same_time_without_busy_errors() {
    // Invariant 1 across processes, and "no database is locked reaches the
    // user": the child appends from before the parent's first append until
    // after its last, every append of both succeeds, and the seqs of both
    // are gap-free together.
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    const N: usize = 300;
    let mut child = s.child("child_process_appender", &[]);
    let seq_of = |l: &str| l.strip_prefix("seq ").map(|s| s.parse::<i64>().unwrap());
    let mut theirs = vec![child.until(seq_of).expect("the child appends")];
    let mine: Vec<i64> = (0..N)
        .map(|i| {
            engine
                .append("app", &made(&format!("parent-{i}")))
                .unwrap()
                .seq
        })
        .collect();
    child.hang_up(); // tells the child to stop
    let ended = child.finish();
    theirs.extend(ended.rest.iter().filter_map(|l| seq_of(l)));
    assert!(ended.success, "the child's appends all succeeded");

    let first_mine = mine[0];
    let last_mine = mine[N - 1];
    assert!(
        theirs[0] < first_mine && *theirs.last().unwrap() > last_mine,
        "the two overlapped"
    );
    let mut all: Vec<i64> = mine.iter().chain(&theirs).copied().collect();
    all.sort_unstable();
    let total = all.len() as i64;
    assert_eq!(all, (1..=total).collect::<Vec<_>>());
    let page = engine
        .read(&Query::new("app").limit(Query::MAX_LIMIT))
        .unwrap();
    assert_eq!(page.len() as i64, total);
    let ids: HashSet<_> = page.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids.len() as i64, total);
}

#[test]
fn unregistered_types_are_not_found_and_reserved_types_are_refused() {
    // Invariant 10: typed errors, nothing committed changed.
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    engine.append("app", &made("before")).unwrap();

    let e = engine
        .append("app", &NewEvent::new("thing.unknown", "x", "tester", 1))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotFound {
                kind: "event type",
                ..
            }
        ),
        "{e}"
    );
    let e = engine.append("nowhere", &made("x")).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotFound {
                kind: "workspace",
                ..
            }
        ),
        "{e}"
    );
    for reserved in reflexr::RESERVED_TYPES {
        let e = engine
            .append("app", &NewEvent::new(reserved, "x", "tester", 1))
            .unwrap_err();
        assert!(matches!(e, Error::ReservedType { .. }), "{e}");
        let e = engine.register_types("app", &[reserved]).unwrap_err();
        assert!(matches!(e, Error::ReservedType { .. }), "{e}");
    }
    // A refused registration registers none of its types.
    let e = engine
        .register_types("app", &["thing.fine", "RuleFired"])
        .unwrap_err();
    assert!(matches!(e, Error::ReservedType { .. }));
    let types = &engine.workspaces().unwrap()[0].event_types;
    assert_eq!(types, &["thing.gone", "thing.made"]);
    assert_eq!(engine.head_seq().unwrap(), 1);
}

#[test]
fn malformed_events_get_typed_errors_and_change_nothing() {
    // Invariant 10.
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    engine.append("app", &made("before").id("keep")).unwrap();
    let long = "x".repeat(reflexr::MAX_ID_BYTES + 1);
    let cases: Vec<(NewEvent, &str)> = vec![
        (made("a").id(""), "id"),
        (made("a").id(long.clone()), "id"),
        (made("a").id("line\nbreak"), "id"),
        (NewEvent::new("thing.made", "", "tester", 1), "subject"),
        (NewEvent::new("thing.made", "s", "", 1), "actor"),
        (NewEvent::new("thing made", "s", "tester", 1), "event type"),
        (made("a").payload_json("{not json"), "payload"),
        (
            made("a").payload_json(format!("\"{}\"", "y".repeat(2 << 20))),
            "payload",
        ),
        (made("a").causation_id(long), "causation_id"),
    ];
    for (event, field) in cases {
        match engine.append("app", &event) {
            Err(Error::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected Invalid, got {other:?}"),
        }
    }
    // A value serde cannot encode (a map with non-string keys).
    let mut m = std::collections::HashMap::new();
    m.insert(vec![1u8], 1);
    let e = engine.append("app", &made("a").payload(&m)).unwrap_err();
    assert!(matches!(e, Error::Encode { .. }), "{e}");

    assert_eq!(engine.head_seq().unwrap(), 1);
    let only = engine.read(&Query::new("app")).unwrap();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0].id, "keep");
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Made {
    id: String,
}

#[test]
fn reads_page_by_seq_filter_by_type_and_decode_payloads() {
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    for i in 0..10 {
        engine.append("app", &made(&i.to_string())).unwrap();
        if i % 3 == 0 {
            engine
                .append(
                    "app",
                    &NewEvent::new("thing.gone", format!("thing/{i}"), "t", 5),
                )
                .unwrap();
        }
    }
    let first = engine.read(&Query::new("app").limit(4)).unwrap();
    assert_eq!(
        first.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let next = engine
        .read(&Query::new("app").after(first[3].seq).limit(4))
        .unwrap();
    assert_eq!(next[0].seq, 5);

    let gone = engine
        .read(&Query::new("app").types(["thing.gone"]))
        .unwrap();
    assert_eq!(gone.len(), 4);
    assert!(gone.iter().all(|e| e.event_type == "thing.gone"));
    let both = engine
        .read(&Query::new("app").types(["thing.gone", "thing.made"]))
        .unwrap();
    assert_eq!(both.len(), 14);

    let e = &first[0];
    assert_eq!(e.payload::<Made>().unwrap(), Made { id: "0".into() });
    assert_eq!(e.payload_json(), r#"{"id":"0"}"#);
    assert_eq!((e.actor.as_str(), e.occurred_at), ("tester", 1_000));
    assert_eq!(
        e.recorded_at, 1_800_000_000_000,
        "recorded by the engine's clock"
    );
    let err = e.payload::<Vec<u8>>().unwrap_err();
    assert!(matches!(err, Error::Decode { seq: Some(1), .. }), "{err}");

    for bad in [
        Query::new("app").limit(0),
        Query::new("app").limit(Query::MAX_LIMIT + 1),
        Query::new("app").after(-1),
        Query::new("bad name"),
    ] {
        assert!(engine.read(&bad).unwrap_err().is_bad_input());
    }
}

#[test]
fn depth_follows_the_causation_within_a_workspace() {
    let s = Scene::new();
    let engine = s.open("test").workspace("app", APP_TYPES).sql(THINGS_SQL);
    let root = engine.append("app", &made("root")).unwrap();
    let child = engine
        .append("app", &made("child").causation_id(root.id.clone()))
        .unwrap();
    let grandchild = engine
        .append("app", &made("grandchild").causation_id(child.id.clone()))
        .unwrap();
    let unknown = engine
        .append("app", &made("orphan").causation_id("not-here"))
        .unwrap();
    let depth = |seq| engine.event(seq).unwrap().unwrap().depth;
    assert_eq!(
        [root.seq, child.seq, grandchild.seq, unknown.seq].map(depth),
        [0, 1, 2, 0]
    );
}
