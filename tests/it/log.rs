//! The change log, on every backend: appends in the caller's transaction,
//! ids, seq order, concurrent and cross-process appenders, reads. Each test
//! is written once, generic over the backend, and `on_backends!` runs it on
//! an SQLite temp file and — with the feature `postgres` — on a PostgreSQL
//! schema of its own; each names the DESIGN.md invariant it checks.

use reflexr_testkit as common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, later, on_backends};
use reflexr::{Engine, Error, ManualClock, NewEvent, Query};
use serde::{Deserialize, Serialize};

on_backends!(
    app_rows_and_events_commit_or_roll_back_together,
    reappending_an_id_is_a_noop_that_reports_the_existing_seq,
    generated_ids_are_time_ordered_uuids,
    concurrent_appenders_get_gap_free_seqs_in_commit_order,
    a_second_process_appends_at_the_same_time_without_busy_errors,
    unregistered_types_are_not_found_and_reserved_types_are_refused,
    malformed_events_get_typed_errors_and_change_nothing,
    reads_page_by_seq_filter_by_type_and_decode_payloads,
    depth_follows_the_causation_within_a_workspace,
);

children_on_backends!(child_process_appender);

/// The types of `app`, the workspace of every test.
const APP_TYPES: &[&str] = &["thing.made", "thing.gone"];

/// Where every test's clock starts (and so what the engine records).
const START_MS: i64 = 1_800_000_000_000;

fn made(id: &str) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000)
        .payload(&serde_json::json!({ "id": id }))
}

/// A place, its clock, and an engine on it with the workspace `app` and the
/// application's table `things`, written with its events.
fn setup<B: TestBackend>() -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let engine = B::open(&place, &clock, "test");
    engine.ensure_workspace("app", APP_TYPES).unwrap();
    B::create_things(&engine);
    (place, clock, engine)
}

/// Invariant 2: together or not at all — an error, a panic, or an append
/// that fails in the closure leaves neither the rows nor the events, and
/// takes no seq.
fn app_rows_and_events_commit_or_roll_back_together<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();

    engine
        .write(|tx| {
            B::insert_thing(tx, "kept")?;
            tx.append("app", &made("kept"))
        })
        .unwrap();

    let err = engine
        .write(|tx| {
            B::insert_thing(tx, "failed")?;
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
            B::insert_thing(tx, "panicked")?;
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
            B::insert_thing(tx, "bad-append")?;
            tx.append("app", &NewEvent::new("not.registered", "x", "tester", 1))
        })
        .unwrap_err();
    assert!(err.is_not_found());

    assert_eq!(B::things(&engine), ["kept"]);
    let events = engine.read(&Query::new("app")).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].subject, "thing/kept");
    // Nothing was skipped: the next append takes the next seq.
    let next = engine.append("app", &made("next")).unwrap();
    assert_eq!(next.seq, events[0].seq + 1);
}

/// Invariant 3: once per id, per workspace — appending an id again is a
/// no-op that reports the existing seq and takes no seq of its own.
fn reappending_an_id_is_a_noop_that_reports_the_existing_seq<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
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
        B::count(
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

/// The ids of invariant 3 when the application gives none: the engine's
/// are UUIDv7, and a later one sorts later.
fn generated_ids_are_time_ordered_uuids<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
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

/// Invariant 1: a reader after cursor c sees every committed event after c
/// in seq order, and nothing later appears below what it has seen — while
/// the threads of one engine append at once.
fn concurrent_appenders_get_gap_free_seqs_in_commit_order<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
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
/// engine on the parent's database, printing each seq, until its stdin is
/// closed.
fn child_process_appender<B: TestBackend>() {
    let engine = parent_engine::<B>(&Opts::new(&later(0), "child"));
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

/// Invariant 1 across processes, and "no database is locked reaches the
/// user": the child appends from before the parent's first append until
/// after its last, every append of both succeeds, and the seqs of both are
/// gap-free together.
fn a_second_process_appends_at_the_same_time_without_busy_errors<B: TestBackend>() {
    let (place, _clock, engine) = setup::<B>();
    const N: usize = 300;
    let mut child = child::<B>(&place, "child_process_appender", &[]);
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

/// Invariant 10: an unregistered type or workspace is `NotFound`, every
/// reserved type is refused to appends and registrations alike, and nothing
/// committed changes.
fn unregistered_types_are_not_found_and_reserved_types_are_refused<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
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
    for reserved in reflexr::limits::RESERVED_TYPES {
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

/// Invariant 10: each malformed field of an event is a typed error naming
/// the field, and the log is as it was.
fn malformed_events_get_typed_errors_and_change_nothing<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    engine.append("app", &made("before").id("keep")).unwrap();
    let long = "x".repeat(reflexr::limits::MAX_ID_BYTES + 1);
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

/// Invariant 1 for a reader: pages in seq order from after a cursor,
/// filtered by type; an event's payload decodes, and one that does not fit
/// the type asked for is a typed error (as is a bad query: invariant 10).
fn reads_page_by_seq_filter_by_type_and_decode_payloads<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
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
    assert_eq!(e.recorded_at, START_MS, "recorded by the engine's clock");
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

/// The causation chain that bounds rules triggering rules: an event's depth
/// is one more than its cause's in the same workspace, and 0 for an unknown
/// cause (so a bad causation id loses nothing: invariant 10).
fn depth_follows_the_causation_within_a_workspace<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
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

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use reflexr::{Error, NewEvent, Query};
    use reflexr_testkit as common;
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::time::Duration;

    on_backends!(
        an_id_is_appended_once_and_seqs_are_dense,
        a_refused_append_is_a_typed_error_and_the_write_goes_on,
        a_write_cannot_end_the_engines_transaction,
        engines_appending_at_once_are_read_once_in_seq_order,
        writers_sharing_a_transaction_fail_alone,
        a_write_that_swallows_a_failed_statement_is_told_what_the_database_holds,
        random_appends_are_typed_errors_or_appends,
        pruning_deletes_only_what_every_cursor_passed_and_the_retention_allows,
    );

    /// Invariants 1 and 3: seqs are dense and increasing; an id is appended once,
    /// and appending it again reports the first seq.
    fn an_id_is_appended_once_and_seqs_are_dense<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        let first = engine.append("app", &made("a").id("id-a")).unwrap();
        let second = engine.append("app", &made("b")).unwrap();
        let again = engine.append("app", &made("a").id("id-a")).unwrap();
        assert_eq!((first.seq, second.seq), (1, 2));
        assert!(again.existing);
        assert_eq!(again.seq, 1);
        let in_one = engine
            .write(|tx| {
                let c = tx.append("app", &made("c").id("id-c"))?;
                let c_again = tx.append("app", &made("c").id("id-c"))?;
                Ok((c.seq, c_again.seq, c_again.existing))
            })
            .unwrap();
        assert_eq!(in_one, (3, 3, true));
        assert_eq!(engine.head_seq().unwrap(), 3);
        let seqs: Vec<i64> = all(&engine).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(engine.event(2).unwrap().unwrap().subject, "thing/b");
        assert_eq!(
            engine.event_by_id("app", "id-c").unwrap().map(|e| e.seq),
            Some(3)
        );
        let b_only = engine.read(&Query::new("app").subject("thing/b")).unwrap();
        assert_eq!(b_only.len(), 1);
        assert_eq!(
            engine
                .read(&Query::new("app").types(["thing.gone"]))
                .unwrap()
                .len(),
            0
        );
    }

    /// Invariant 10: bad input: each refused append is a typed error, takes no seq,
    /// and the write that made it goes on (on PostgreSQL a failed statement would
    /// abort the transaction, so the engine must not run one).
    fn a_refused_append_is_a_typed_error_and_the_write_goes_on<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        let seq = engine
            .write(|tx| {
                let e = tx.append("nowhere", &made("x")).unwrap_err();
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
                let e = tx
                    .append("app", &NewEvent::new("thing.sold", "s", "a", 0))
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
                let e = tx
                    .append("app", &NewEvent::new("RuleFired", "s", "a", 0))
                    .unwrap_err();
                assert!(matches!(e, Error::ReservedType { .. }), "{e}");
                let e = tx
                    .append(
                        "app",
                        &NewEvent::new("thing.made", "s", "a", 0).payload_json("{not json"),
                    )
                    .unwrap_err();
                assert!(
                    matches!(
                        e,
                        Error::Invalid {
                            field: "payload",
                            ..
                        }
                    ),
                    "{e}"
                );
                let e = tx
                    .append("app", &made("x").id("i".repeat(1_000)))
                    .unwrap_err();
                assert!(matches!(e, Error::Invalid { field: "id", .. }), "{e}");
                B::insert_thing(tx, "kept")?;
                Ok(tx.append("app", &made("kept"))?.seq)
            })
            .unwrap();
        assert_eq!(seq, 1);
        assert_eq!(B::things(&engine), ["kept"]);
        let e = engine.register_types("app", &["RuleErrored"]).unwrap_err();
        assert!(matches!(e, Error::ReservedType { .. }));
        let e = engine.create_workspace("app").unwrap_err();
        assert!(matches!(e, Error::AlreadyExists { .. }));
    }

    /// Invariant 2, guarded: the application's SQL cannot commit or roll back the
    /// engine's transaction halfway; the statement is refused before it runs and
    /// the write is rolled back as a whole.
    fn a_write_cannot_end_the_engines_transaction<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        for sql in [
            "COMMIT",
            "rollback",
            "  /* c */ END",
            "BEGIN",
            "RELEASE SAVEPOINT reflexr_call",
        ] {
            let e = engine
                .write(|tx| {
                    B::insert_thing(tx, sql.trim())?;
                    tx.append("app", &made("x"))?;
                    B::run_sql(tx, sql)
                })
                .unwrap_err();
            assert!(matches!(e, Error::StatementRefused { .. }), "{sql}: {e}");
        }
        assert!(B::things(&engine).is_empty());
        assert!(all(&engine).is_empty());
        // Savepoints of the application's own are fine.
        engine
            .write(|tx| {
                B::run_sql(tx, "SAVEPOINT mine")?;
                B::insert_thing(tx, "undone")?;
                B::run_sql(tx, "ROLLBACK TO SAVEPOINT mine")?;
                B::insert_thing(tx, "kept")
            })
            .unwrap();
        assert_eq!(B::things(&engine), ["kept"]);
    }

    /// Invariants 1 and 3 across engines: four engines (each its own connections,
    /// as four processes would have) append at once while a fifth follows with a
    /// cursor; it reads every event once, in dense seq order.
    fn engines_appending_at_once_are_read_once_in_seq_order<B: TestBackend>() {
        const WRITERS: usize = 4;
        const EACH: usize = 40;
        let (place, clock, follower) = setup::<B>();
        let place = Arc::new(place);
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let engine = B::open(&place, &clock, &format!("writer-{w}"));
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let id = format!("w{w}-{i}");
                        engine
                            .write(|tx| {
                                B::insert_thing(tx, &id)?;
                                tx.append("app", &made(&id).id(&id))
                            })
                            .unwrap();
                    }
                })
            })
            .collect();
        let mut seen: Vec<(i64, String)> = Vec::new();
        let mut cursor = 0;
        while seen.len() < WRITERS * EACH {
            let page = follower
                .wait_for_events(&Query::new("app").after(cursor), Duration::from_secs(60))
                .unwrap();
            assert!(!page.is_empty(), "a wait of a minute ended with nothing");
            for e in page {
                assert!(e.seq > cursor, "seq order");
                cursor = e.seq;
                seen.push((e.seq, e.id));
            }
        }
        for w in writers {
            w.join().unwrap();
        }
        let seqs: Vec<i64> = seen.iter().map(|s| s.0).collect();
        assert_eq!(seqs, (1..=(WRITERS * EACH) as i64).collect::<Vec<_>>());
        let ids: BTreeSet<String> = seen.into_iter().map(|s| s.1).collect();
        assert_eq!(ids.len(), WRITERS * EACH);
        assert_eq!(B::things(&follower).len(), WRITERS * EACH);
        assert!(all(&follower).len() == WRITERS * EACH);
    }

    /// Invariant 2 under group commit: writers of one engine that arrive together
    /// share a transaction, each in a savepoint of its own. A writer that fails or
    /// panics rolls back alone; every caller's outcome is what the database holds,
    /// and the log stays dense.
    fn writers_sharing_a_transaction_fail_alone<B: TestBackend>() {
        const THREADS: usize = 8;
        const EACH: usize = 30;
        let (_place, _clock, engine) = setup::<B>();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let engine = engine.clone();
                std::thread::spawn(move || {
                    let mut kept = Vec::new();
                    for i in 0..EACH {
                        let id = format!("t{t}-{i}");
                        let fate = (t * 7 + i * 3) % 10;
                        let outcome =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                engine.write(|tx| {
                                    B::insert_thing(tx, &id)?;
                                    tx.append("app", &made(&id).id(&id))?;
                                    match fate {
                                        0..=1 => Err(Error::Invalid {
                                            field: "test",
                                            reason: "this caller gives up".into(),
                                        }),
                                        2 => panic!("this caller falls over"),
                                        _ => Ok(()),
                                    }
                                })
                            }));
                        if let Ok(Ok(())) = outcome {
                            kept.push(id);
                        }
                    }
                    kept
                })
            })
            .collect();
        let mut kept: Vec<String> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        kept.sort();
        assert_eq!(kept.len(), THREADS * EACH * 7 / 10);
        assert_eq!(
            B::things(&engine),
            kept,
            "the rows of the callers told Ok, only"
        );
        let events = all(&engine);
        let mut ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
        ids.sort();
        assert_eq!(ids, kept, "the events of the callers told Ok, only");
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=kept.len() as i64).collect::<Vec<_>>(), "dense");
        // Eight threads writing at once shared transactions (else this test
        // did not test what it says).
        let stats = engine.writer_stats();
        assert!(stats.writes > stats.commits, "no batch of two: {stats:?}");
    }

    /// Invariant 2 when the application catches its own statement's error and goes
    /// on: on SQLite the transaction goes on and commits; on PostgreSQL the failed
    /// statement aborted it, so the caller is told `TransactionAborted` — never Ok
    /// for work that did not commit.
    fn a_write_that_swallows_a_failed_statement_is_told_what_the_database_holds<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        engine.write(|tx| B::insert_thing(tx, "first")).unwrap();
        let outcome = engine.write(|tx| {
            B::insert_thing(tx, "second")?;
            tx.append("app", &made("second"))?;
            // A duplicate key: the statement fails; the closure ignores it and
            // returns Ok.
            assert!(B::insert_thing(tx, "first").is_err());
            Ok(())
        });
        let rows = B::things(&engine);
        let events = all(&engine);
        match outcome {
            Ok(_) => {
                assert_eq!(rows, ["first", "second"]);
                assert_eq!(events.len(), 1);
            }
            Err(e) => {
                assert!(matches!(e, Error::TransactionAborted { .. }), "{e}");
                assert_eq!(rows, ["first"], "nothing of the aborted write");
                assert!(events.is_empty());
            }
        }
        // And the engine goes on.
        engine.append("app", &made("after")).unwrap();
    }

    /// Invariant 10 on every backend: random names, ids, types, subjects and
    /// payloads — empty, huge, deeply nested, control characters, not JSON —
    /// appended in a transaction beside a good append. Each is appended or a typed
    /// error; a refused one changes nothing, and the good append in the same
    /// transaction commits (on PostgreSQL, nothing the engine runs for a refused
    /// append may fail on the server, or the transaction would be lost).
    fn random_appends_are_typed_errors_or_appends<B: TestBackend>() {
        use common::inputs::{payload, text};
        use proptest::test_runner::{Config, TestRunner};
        let (_place, _clock, engine) = setup::<B>();
        let mut runner = TestRunner::new(Config {
            cases: 48,
            ..Config::default()
        });
        runner
            .run(
                &(text(), text(), text(), text(), text(), payload()),
                |(workspace, event_type, id, subject, actor, body): (
                    String,
                    String,
                    String,
                    String,
                    String,
                    String,
                )| {
                    let before = engine.head_seq().unwrap();
                    let ev = NewEvent::new(&event_type, &subject, &actor, 0)
                        .id(&id)
                        .payload_json(&body);
                    let (good, tried) = engine
                        .write(|tx| {
                            let good = tx.append("app", &made(&format!("good-{before}")))?;
                            Ok((good, tx.append(&workspace, &ev)))
                        })
                        .unwrap();
                    let stored = engine.event(good.seq).unwrap();
                    assert!(stored.is_some(), "the good append committed");
                    match tried {
                        Ok(a) => {
                            assert_eq!(
                                (workspace.as_str(), event_type.as_str()),
                                ("app", "thing.made")
                            );
                            let e = engine.event(a.seq).unwrap().unwrap();
                            assert_eq!(e.id, id);
                            assert_eq!(e.payload_json(), body.as_str());
                        }
                        Err(err) => {
                            assert!(
                                err.is_bad_input()
                                    || matches!(err, Error::NotFound { .. } | Error::Encode { .. }),
                                "untyped: {err:?}"
                            );
                            assert_eq!(
                                engine.head_seq().unwrap(),
                                good.seq,
                                "nothing else appended"
                            );
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
    }

    /// Invariant 9: pruning deletes an event only once every cursor on its
    /// workspace passed it and it is older than the retention; a workspace without
    /// cursors goes by age alone; a pruned seq never comes back.
    fn pruning_deletes_only_what_every_cursor_passed_and_the_retention_allows<B: TestBackend>() {
        let (_place, clock, engine) = setup::<B>();
        engine.ensure_workspace("quiet", TYPES).unwrap();
        for i in 0..10 {
            engine.append("app", &made(&format!("a{i}"))).unwrap();
            engine.append("quiet", &made(&format!("q{i}"))).unwrap();
        }
        // Seq 7 is app's fourth event (app has the odd seqs).
        engine.save_cursor("mailer", "app", 7).unwrap();
        engine.save_cursor("audit", "app", 19).unwrap();
        let head = engine.head_seq().unwrap();
        let retention = reflexr::Retention::older_than(Duration::from_secs(3_600));
        let young = B::prune(&engine, &retention).unwrap();
        assert_eq!(young.events, 0, "nothing is older than the retention yet");
        clock.advance(Duration::from_secs(7_200));
        let pruned = B::prune(&engine, &retention).unwrap();
        assert_eq!(
            pruned.events,
            4 + 10,
            "app up to the lowest cursor; quiet by age"
        );
        let left: Vec<i64> = all(&engine).iter().map(|e| e.seq).collect();
        assert_eq!(left, [9, 11, 13, 15, 17, 19]);
        assert!(engine.read(&Query::new("quiet")).unwrap().is_empty());
        assert_eq!(engine.head_seq().unwrap(), head, "the head is not lowered");
        assert_eq!(engine.append("app", &made("next")).unwrap().seq, head + 1);
    }
}
