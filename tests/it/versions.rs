//! Subject versions, expected versions, conditional appends, a subject's
//! stream and upcasters (DESIGN.md, invariant 13 and the words "subject
//! version"). Each test is written once, generic over the backend, and
//! runs on SQLite and PostgreSQL.

use reflexr_testkit as common;

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier, Mutex};

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, later, on_backends};
use reflexr::{
    AppendCondition, Decision, Engine, EventMatch, Expected, Follow, ManualClock, NewEvent,
    OnNewVersion, Query, Retention, Rule,
};
use serde_json::json;

on_backends!(
    each_subject_counts_its_events_from_one,
    an_expectation_that_does_not_hold_changes_nothing,
    a_conflict_fails_the_whole_write_even_if_the_closure_goes_on,
    two_writers_expecting_one_version_exactly_one_wins,
    two_processes_expecting_one_version_never_both_win,
    a_conditional_append_racing_a_matching_append_exactly_one_commits,
    a_subject_read_from_a_version_and_a_pruned_subject_goes_on_counting,
    an_upcaster_chain_is_applied_on_every_read_path_and_never_stored,
    a_shadow_version_fires_nothing_and_a_promote_hands_over_with_no_gap_and_no_duplicate,
    a_shadow_is_refused_without_a_live_rule_and_a_promote_without_a_shadow,
);

children_on_backends!(child_expecting_appender);

const START_MS: i64 = 1_800_000_000_000;

fn setup<B: TestBackend>() -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let engine = B::open(&place, &clock, "test");
    engine
        .ensure_workspace("app", &["item.added", "seat.booked"])
        .unwrap();
    B::create_things(&engine);
    (place, clock, engine)
}

/// Runs `f(w)` for `w` in `0..n`, each on a thread of its own, all released
/// at once; their results, in order.
fn race<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|w| {
                let (barrier, f) = (&barrier, &f);
                s.spawn(move || {
                    barrier.wait();
                    f(w)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn added(subject: &str) -> NewEvent {
    NewEvent::new("item.added", subject, "tester", 1_000)
}

/// Invariant 13's ground: an event's version is its 1-based place among
/// its subject's events in its workspace, reported by the append and read
/// back with the event; an existing id reports its own.
fn each_subject_counts_its_events_from_one<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    let mut seen = Vec::new();
    for s in ["cart/1", "cart/2", "cart/1", "cart/1", "cart/2"] {
        let a = e.append("app", &added(s)).unwrap();
        seen.push((s, a.version));
    }
    assert_eq!(
        seen,
        [
            ("cart/1", 1),
            ("cart/2", 1),
            ("cart/1", 2),
            ("cart/1", 3),
            ("cart/2", 2)
        ]
    );
    let read: Vec<(String, i64)> = e
        .read(&Query::new("app"))
        .unwrap()
        .into_iter()
        .map(|ev| (ev.subject, ev.version))
        .collect();
    let expected: Vec<(String, i64)> = seen.iter().map(|(s, v)| (s.to_string(), *v)).collect();
    assert_eq!(read, expected);
    assert_eq!(e.subject_version("app", "cart/1").unwrap(), 3);
    assert_eq!(e.subject_version("app", "cart/9").unwrap(), 0);

    // An id appended again is a no-op that reports the first one's version,
    // whatever the expectation.
    let first = e.append("app", &added("cart/3").id("x-1")).unwrap();
    let again = e
        .append("app", &added("cart/3").id("x-1").expect_version(7))
        .unwrap();
    assert!(again.existing);
    assert_eq!((again.seq, again.version), (first.seq, 1));
}

/// Invariant 13: each expectation holds or refuses, and a refused one is a
/// typed conflict carrying the subject's actual version and last seq; the
/// subject and the log stay as they were.
fn an_expectation_that_does_not_hold_changes_nothing<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    assert!(
        e.append("app", &added("c").expect(Expected::Exists))
            .is_err()
    );
    let a1 = e
        .append("app", &added("c").expect(Expected::NoEvents))
        .unwrap();
    assert_eq!(a1.version, 1);
    let err = e
        .append("app", &added("c").expect(Expected::NoEvents))
        .unwrap_err();
    assert!(err.is_append_conflict(), "{err}");
    assert_eq!(err.actual_version(), Some(1));
    match &err {
        reflexr::Error::AppendConflict { subject, seq, .. } => {
            assert_eq!(subject.as_deref(), Some("c"));
            assert_eq!(*seq, Some(a1.seq));
        }
        other => panic!("{other}"),
    }
    e.append("app", &added("c").expect(Expected::Exists))
        .unwrap();
    for wrong in [0, 1, 3, 100] {
        let err = e
            .append("app", &added("c").expect_version(wrong))
            .unwrap_err();
        assert_eq!(err.actual_version(), Some(2), "{err}");
    }
    assert_eq!(
        e.append("app", &added("c").expect_version(2))
            .unwrap()
            .version,
        3
    );
    let bad = e.append("app", &added("c").expect_version(-1)).unwrap_err();
    assert!(bad.is_bad_input(), "{bad}");
    assert_eq!(e.read(&Query::new("app")).unwrap().len(), 3);
    assert_eq!(e.head_seq().unwrap(), 3, "a refused append took no seq");
}

/// Invariants 2 and 13: a write whose append's expectation fails commits
/// nothing — its application rows, its other subjects' appends — even when
/// the closure swallows the error and returns Ok; appends to several
/// subjects in one write commit all or none.
fn a_conflict_fails_the_whole_write_even_if_the_closure_goes_on<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    e.append("app", &added("b")).unwrap();
    let out = e.write(|tx| {
        B::insert_thing(tx, "row-1")?;
        tx.append("app", &added("a").expect(Expected::NoEvents))?;
        let refused = tx.append("app", &added("b").expect(Expected::NoEvents));
        assert!(refused.unwrap_err().is_append_conflict());
        Ok(()) // the closure goes on as if nothing happened
    });
    assert!(out.unwrap_err().is_append_conflict());
    assert!(
        B::things(&e).is_empty(),
        "the application's row rolled back"
    );
    assert_eq!(e.subject_version("app", "a").unwrap(), 0);
    assert_eq!(e.read(&Query::new("app")).unwrap().len(), 1);

    // Both expectations hold: both commit, with the row.
    e.write(|tx| {
        B::insert_thing(tx, "row-2")?;
        tx.append("app", &added("a").expect(Expected::NoEvents))?;
        tx.append("app", &added("b").expect_version(1))?;
        Ok(())
    })
    .unwrap();
    assert_eq!(B::things(&e), ["row-2"]);
    assert_eq!(e.subject_version("app", "a").unwrap(), 1);
    assert_eq!(e.subject_version("app", "b").unwrap(), 2);
}

/// Invariant 13 under threads: writers that read the same version and
/// append expecting it race; in each round exactly one wins, every other
/// gets the conflict with the winner's version, and their rows are gone.
fn two_writers_expecting_one_version_exactly_one_wins<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    const WRITERS: usize = 4;
    const ROUNDS: usize = 25;
    for round in 0..ROUNDS {
        let seen = e.subject_version("app", "account/1").unwrap();
        let results = race(WRITERS, |w| {
            e.write(|tx| {
                B::insert_thing(tx, &format!("r{round}-w{w}"))?;
                let ev = added("account/1").expect_version(seen);
                Ok(tx.append("app", &ev)?.version)
            })
        });
        let won: Vec<i64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .copied()
            .collect();
        assert_eq!(won, [seen + 1], "round {round}: exactly one wins");
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(r.is_append_conflict(), "{r}");
            assert_eq!(r.actual_version(), Some(seen + 1));
        }
    }
    assert_eq!(B::things(&e).len(), ROUNDS, "only the winners' rows");
    let versions: Vec<i64> = e
        .read_subject("app", "account/1", 1, 1000)
        .unwrap()
        .iter()
        .map(|ev| ev.version)
        .collect();
    assert_eq!(versions, (1..=ROUNDS as i64).collect::<Vec<_>>());
}

/// The child of `two_processes_expecting_one_version_never_both_win`: reads
/// the subject's version and appends expecting it, until it has won
/// `WINS` times; prints each win's version.
fn child_expecting_appender<B: TestBackend>() {
    let e = parent_engine::<B>(&Opts::new(&later(0), "child"));
    expecting_loop(&e, "child");
}

const WINS: usize = 60;

/// Appends to `account/2` expecting the version just read until `WINS`
/// appends won; prints each win's version on a line of its own.
fn expecting_loop<B: TestBackend>(e: &Engine<B>, who: &str) -> Vec<i64> {
    let mut won = Vec::new();
    let mut conflicts = 0;
    while won.len() < WINS {
        let seen = e.subject_version("app", "account/2").unwrap();
        let ev = NewEvent::new("item.added", "account/2", who, 1).expect_version(seen);
        match e.append("app", &ev) {
            Ok(a) => {
                assert_eq!(a.version, seen + 1);
                println!("\nwon {}", a.version);
                won.push(a.version);
            }
            Err(err) if err.is_append_conflict() => {
                assert!(err.actual_version().unwrap() > seen, "{err}");
                conflicts += 1;
            }
            Err(err) => panic!("{err}"),
        }
    }
    println!("\nconflicts {conflicts}");
    won
}

/// Invariant 13 across processes: two processes read-decide-append on one
/// subject at the same time; no version is won twice, and the subject's
/// stream is exactly the wins of both.
fn two_processes_expecting_one_version_never_both_win<B: TestBackend>() {
    let (place, _clock, e) = setup::<B>();
    let mut child = child::<B>(&place, "child_expecting_appender", &[]);
    let won_of = |l: &str| l.strip_prefix("won ").map(|s| s.parse::<i64>().unwrap());
    let mut theirs = vec![child.until(won_of).expect("the child appends")];
    let mine = expecting_loop(&e, "parent");
    let ended = child.finish();
    assert!(ended.success, "the child's appends ran to the end");
    theirs.extend(ended.rest.iter().filter_map(|l| won_of(l)));
    let all: BTreeSet<i64> = mine.iter().chain(&theirs).copied().collect();
    assert_eq!(all.len(), 2 * WINS, "no version was won twice");
    let stream = e.read_subject("app", "account/2", 1, 1000).unwrap();
    let versions: BTreeSet<i64> = stream.iter().map(|ev| ev.version).collect();
    assert_eq!(versions, all);
    assert_eq!(versions, (1..=2 * WINS as i64).collect());
    let actors: BTreeSet<&str> = stream.iter().map(|ev| ev.actor.as_str()).collect();
    assert_eq!(actors.len(), 2, "both processes won some");
}

/// Invariant 13 for a condition across subjects: writers that decided from
/// the same position check that no booking of the seat came after it and
/// book it; exactly one commits in each round, the others get the conflict
/// naming the winner's seq. A booking of another seat does not conflict.
fn a_conditional_append_racing_a_matching_append_exactly_one_commits<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    const WRITERS: usize = 3;
    for round in 0..15 {
        let seat = format!("{round}A");
        let seen = e.head_seq().unwrap();
        // Booked elsewhere meanwhile: another seat, no conflict.
        e.append(
            "app",
            &NewEvent::new("seat.booked", "booking/other", "t", 1)
                .payload(&json!({ "seat": format!("{round}B") })),
        )
        .unwrap();
        let cond = AppendCondition::new("app")
            .types(["seat.booked"])
            .field("seat", &seat)
            .after(seen);
        let results = race(WRITERS, |w| {
            e.write(|tx| {
                tx.check(&cond)?;
                let ev = NewEvent::new("seat.booked", format!("booking/{w}"), "t", 1)
                    .payload(&json!({ "seat": &seat }));
                Ok(tx.append("app", &ev)?.seq)
            })
        });
        let won: Vec<i64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .copied()
            .collect();
        assert_eq!(won.len(), 1, "round {round}: exactly one commits");
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            match r {
                reflexr::Error::AppendConflict {
                    seq,
                    actual_version,
                    ..
                } => {
                    assert_eq!(*seq, Some(won[0]));
                    assert_eq!(*actual_version, None);
                }
                other => panic!("{other}"),
            }
        }
        let booked = e
            .read(&Query::new("app").after(seen).types(["seat.booked"]))
            .unwrap()
            .into_iter()
            .filter(|ev| ev.json().unwrap()["seat"] == seat.as_str())
            .count();
        assert_eq!(booked, 1);
    }
    let bad = e
        .write(|tx| tx.check(&AppendCondition::new("app").field("a..b", 1)))
        .unwrap_err();
    assert!(bad.is_bad_input(), "{bad}");
}

/// A subject's stream read from a version, through its index; invariant 9
/// with versions: pruning a subject's events leaves its version where it
/// was, so the next event goes on counting (an expectation of 0 does not
/// come true again).
fn a_subject_read_from_a_version_and_a_pruned_subject_goes_on_counting<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>();
    for i in 0..10 {
        e.append("app", &added(if i % 2 == 0 { "s/even" } else { "s/odd" }))
            .unwrap();
    }
    let from3: Vec<i64> = e
        .read_subject("app", "s/even", 3, 2)
        .unwrap()
        .iter()
        .map(|ev| ev.version)
        .collect();
    assert_eq!(from3, [3, 4]);
    assert_eq!(e.read_subject("app", "s/even", 0, 100).unwrap().len(), 5);
    assert!(e.read_subject("app", "s/even", 6, 100).unwrap().is_empty());
    assert!(
        e.read_subject("app", "s/even", 1, 0)
            .unwrap_err()
            .is_bad_input()
    );
    // Query::subject reads the same events.
    let by_query = e
        .read(&Query::new("app").subject("s/odd").after(4))
        .unwrap();
    assert_eq!(
        by_query.iter().map(|ev| ev.version).collect::<Vec<_>>(),
        [3, 4, 5]
    );

    clock.advance(std::time::Duration::from_secs(3600));
    let pruned = B::prune(
        &e,
        &Retention::older_than(std::time::Duration::from_secs(60)),
    )
    .unwrap();
    assert_eq!(pruned.events, 10);
    assert_eq!(e.subject_version("app", "s/even").unwrap(), 5);
    assert!(
        e.append("app", &added("s/even").expect(Expected::NoEvents))
            .unwrap_err()
            .is_append_conflict()
    );
    let next = e.append("app", &added("s/even").expect_version(5)).unwrap();
    assert_eq!(next.version, 6);
    assert_eq!(e.read_subject("app", "s/even", 1, 10).unwrap().len(), 1);
}

/// Upcasters: a chain v1 → v2 → v3 hands every event out as v3 — reads by
/// every call, a transaction's read, a rule's decision, a reaction, a
/// follower's projection, a workflow's wait, a condition's field — and
/// what is stored stays as written.
fn an_upcaster_chain_is_applied_on_every_read_path_and_never_stored<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let opts = Opts::new(&clock, "test")
        // v1 {"title"} -> v2 {"name"} -> v3 {"name", "lang"}
        .upcast(
            "talk.changed",
            1,
            |mut p| json!({ "name": p["title"].take() }),
        )
        .upcast("talk.changed", 2, |mut p| {
            p["lang"] = json!("en");
            p
        });
    let e = B::open_opts(&place, &opts);
    let types = [
        "talk.changed",
        "talk.changed.v2",
        "talk.changed.v3",
        "talk.seen",
    ];
    e.ensure_workspace("app", &types).unwrap();
    e.ensure_workspace("copies", &types).unwrap();
    let v1 = NewEvent::new("talk.changed", "talk/1", "t", 1).payload(&json!({ "title": "A" }));
    let v2 = NewEvent::new("talk.changed.v2", "talk/1", "t", 1).payload(&json!({ "name": "B" }));
    let v3 = NewEvent::new("talk.changed.v3", "talk/1", "t", 1)
        .payload(&json!({ "name": "C", "lang": "de" }));
    let first = e.append("app", &v1.id("first")).unwrap();
    e.append("app", &v2).unwrap();
    e.append("app", &v3).unwrap();
    let want = [
        json!({ "name": "A", "lang": "en" }),
        json!({ "name": "B", "lang": "en" }),
        json!({ "name": "C", "lang": "de" }),
    ];
    let shape = |events: &[reflexr::Event]| -> Vec<serde_json::Value> {
        events
            .iter()
            .map(|ev| {
                assert_eq!(ev.event_type, "talk.changed.v3");
                ev.json().unwrap().clone()
            })
            .collect()
    };
    let newest = Query::new("app").types(["talk.changed.v3"]);
    assert_eq!(shape(&e.read(&newest).unwrap()), want);
    assert_eq!(shape(&e.read(&Query::new("app")).unwrap()), want);
    assert_eq!(
        shape(&e.read_subject("app", "talk/1", 1, 10).unwrap()),
        want
    );
    assert_eq!(shape(&[e.event(first.seq).unwrap().unwrap()]), want[..1]);
    assert_eq!(
        shape(&[e.event_by_id("app", "first").unwrap().unwrap()]),
        want[..1]
    );
    assert_eq!(shape(&e.write(|tx| tx.read(&newest)).unwrap()), want);
    // An old version is never handed out, so a filter on it finds nothing.
    assert!(
        e.read(&Query::new("app").types(["talk.changed"]))
            .unwrap()
            .is_empty()
    );

    // A rule, a reaction, a follower's projection, a workflow's wait.
    let decided = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::clone(&decided);
    e.register_rule(
        Rule::new("names", "app")
            .on(["talk.changed.v3"])
            .action("noop")
            .decide(move |ev| {
                d.lock().unwrap().push(ev.json()?.clone());
                Ok(Decision::Skip)
            }),
    )
    .unwrap();
    e.register_action("noop", |_, _| Ok(())).unwrap();
    let reacted = Arc::new(Mutex::new(Vec::new()));
    let r = Arc::clone(&reacted);
    e.register_reaction(B::reaction("seen", "app").on(["talk.changed.v3"]).handle(
        move |ev, _tx| {
            r.lock().unwrap().push(ev.json()?.clone());
            Ok(())
        },
    ))
    .unwrap();
    let projected = Arc::new(Mutex::new(Vec::new()));
    let p = Arc::clone(&projected);
    e.register_projection("names", move |ev| {
        p.lock().unwrap().push(ev.json()?.clone());
        Ok(None)
    })
    .unwrap();
    e.follow(Follow::new("app", "copies").projection("names"))
        .unwrap();
    let waited = Arc::new(Mutex::new(None));
    let w = Arc::clone(&waited);
    e.register_action("flow", move |_run, ctx| {
        let m = EventMatch::new("app", "talk.changed.v3").field("name", "D");
        let event = ctx
            .wait_for_event("renamed", &m, None)?
            .expect("no timeout");
        *w.lock().unwrap() = Some((event.event_type.clone(), event.json()?.clone()));
        Ok(())
    })
    .unwrap();
    let run = e
        .enqueue(&reflexr::Enqueue::new("flow", &json!({})))
        .unwrap()
        .id;
    e.run_until_idle().unwrap();
    // The wait matches an old version's event by its upcast field.
    let v1d = NewEvent::new("talk.changed", "talk/2", "t", 1).payload(&json!({ "title": "D" }));
    let d_seq = e.append("app", &v1d).unwrap().seq;
    e.run_until_idle().unwrap();
    let all4 = {
        let mut w = want.to_vec();
        w.push(json!({ "name": "D", "lang": "en" }));
        w
    };
    assert_eq!(*decided.lock().unwrap(), all4);
    assert_eq!(*reacted.lock().unwrap(), all4);
    assert_eq!(*projected.lock().unwrap(), all4);
    assert_eq!(
        *waited.lock().unwrap(),
        Some(("talk.changed.v3".to_string(), all4[3].clone()))
    );
    assert_eq!(
        e.wait_for_run(&run, std::time::Duration::ZERO)
            .unwrap()
            .state,
        reflexr::RunState::Succeeded
    );

    // A condition's field matches the upcast payload.
    let cond = AppendCondition::new("app")
        .types(["talk.changed.v3"])
        .field("lang", "en")
        .after(d_seq - 1);
    assert!(
        e.write(|tx| tx.check(&cond))
            .unwrap_err()
            .is_append_conflict()
    );

    // Never stored: the log holds what was written.
    let stored = B::strings(
        &e,
        "SELECT type || ' ' || payload FROM reflexr_events WHERE workspace = 'app' ORDER BY seq",
    );
    assert_eq!(stored.len(), 4);
    assert!(stored[0].starts_with("talk.changed {"), "{}", stored[0]);
    assert!(stored[0].contains("\"title\""), "{}", stored[0]);
    assert!(stored[1].starts_with("talk.changed.v2 {"), "{}", stored[1]);
    assert!(!stored[1].contains("lang"), "{}", stored[1]);
}

/// Invariant 10 for upcasters: a chain with a gap, a second upcaster for a
/// version, or a base name that carries a version is refused when the
/// engine opens, which then opens nothing.
#[test]
fn a_broken_upcaster_chain_is_refused_when_the_engine_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let open = |b: reflexr::Builder| b.open().map(|_| ()).unwrap_err();
    let gap = open(Engine::builder(&path).upcast("x.y", 2, |v| v));
    assert!(gap.is_bad_input(), "{gap}");
    let twice = open(
        Engine::builder(&path)
            .upcast("x.y", 1, |v| v)
            .upcast("x.y", 1, |v| v),
    );
    assert!(twice.is_bad_input(), "{twice}");
    let versioned = open(Engine::builder(&path).upcast("x.y.v2", 1, |v| v));
    assert!(versioned.is_bad_input(), "{versioned}");
    assert!(!path.exists(), "nothing was opened");
}

/// Version 1 fires `{"v": 1, "seq": …}` for every tick; version 2 fires
/// `{"v": 2, …}` and counts each subject's ticks in its state.
fn counting(version: u32) -> Rule {
    let rule = Rule::new("count", "app")
        .on(["item.added"])
        .action("work")
        .version(version, OnNewVersion::Continue);
    rule.decide_with_state(0u64, move |ev, seen: &mut u64| {
        *seen += 1;
        Ok(Decision::Fire(json!({ "v": version, "seq": ev.seq })))
    })
}

/// Rule versions in shadow (invariant 4 across a handover): a version in
/// shadow decides everything from its start without firing, while the live
/// one fires; a promote over a log being appended to hands over at one
/// position, and the fold of every firing shows each event fired exactly
/// once — by version 1 up to the position, by version 2 after it — with
/// the new version's state, built in shadow, carried on.
fn a_shadow_version_fires_nothing_and_a_promote_hands_over_with_no_gap_and_no_duplicate<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>();
    e.register_action("work", |_, _| Ok(())).unwrap();
    e.register_rule(counting(1)).unwrap();
    let subjects = ["s/a", "s/b", "s/c"];
    let mut n = 0;
    let mut append = |e: &Engine<B>, k: usize| {
        for _ in 0..k {
            e.append("app", &added(subjects[n % 3])).unwrap();
            n += 1;
        }
    };
    append(&e, 30);
    e.run_until_idle().unwrap();
    e.register_rule(counting(2).shadow(0)).unwrap();
    append(&e, 30);
    e.run_until_idle().unwrap();

    let infos = e.rules().unwrap();
    let live = infos.iter().find(|r| r.name == "count").unwrap();
    let shadow = infos.iter().find(|r| r.name == "count@v2").unwrap();
    assert_eq!((live.version, live.shadow_of.as_deref()), (1, None));
    assert_eq!(shadow.shadow_of.as_deref(), Some("count"));
    assert_eq!(
        (shadow.version, shadow.lag, shadow.shadow_fired),
        (2, 0, 60)
    );
    assert_eq!(
        B::count(&e, "SELECT count(*) FROM reflexr_runs"),
        60,
        "the shadow fired nothing"
    );

    // The handover over a log being appended to: another thread appends
    // while this one decides, promotes, and decides on.
    let operator = e.operator("ops", "v2 decides as v1 did").unwrap();
    let (half, halfway) = std::sync::mpsc::channel();
    let (go, promoted) = std::sync::mpsc::channel();
    let at = std::thread::scope(|s| {
        let writer = {
            let e = e.clone();
            s.spawn(move || {
                for i in 0..150 {
                    if i == 50 {
                        half.send(()).unwrap();
                        promoted.recv().unwrap();
                    }
                    e.append("app", &added(subjects[i % 3])).unwrap();
                }
            })
        };
        halfway.recv().unwrap();
        e.run_until_idle().unwrap();
        let at = operator.promote_rule("count").unwrap();
        assert!(operator.promote_rule("count").unwrap_err().is_conflict());
        go.send(()).unwrap();
        while !writer.is_finished() {
            e.run_until_idle().unwrap();
        }
        writer.join().unwrap();
        at
    });
    assert!(
        at >= 110,
        "the handover came after the first 110 events: {at}"
    );
    e.run_until_idle().unwrap();
    e.run_until_idle().unwrap();

    // The fold: every event fired once, by the version its side of the
    // position says.
    let events = e
        .read(
            &Query::new("app")
                .types(["item.added"])
                .limit(Query::MAX_LIMIT),
        )
        .unwrap();
    assert_eq!(events.len(), 210);
    let inputs = B::strings(&e, "SELECT input FROM reflexr_runs ORDER BY ord");
    let mut fired: std::collections::BTreeMap<i64, Vec<u64>> = Default::default();
    for input in &inputs {
        let v: serde_json::Value = serde_json::from_str(input).unwrap();
        fired
            .entry(v["seq"].as_i64().unwrap())
            .or_default()
            .push(v["v"].as_u64().unwrap());
    }
    for ev in &events {
        let want = if ev.seq <= at { 1 } else { 2 };
        assert_eq!(
            fired.get(&ev.seq).map(Vec::as_slice),
            Some(&[want][..]),
            "seq {} (handover at {at})",
            ev.seq
        );
    }
    assert_eq!(inputs.len(), events.len(), "no gap, no duplicate");
    assert_eq!(
        events.iter().filter(|ev| ev.seq > at).count(),
        100,
        "version 2 fired for the events after the handover"
    );

    // Version 2 is the rule now, with the state it built in shadow.
    let infos = e.rules().unwrap();
    assert_eq!(infos.len(), 1, "{infos:?}");
    assert_eq!((infos[0].name.as_str(), infos[0].version), ("count", 2));
    assert_eq!(infos[0].lag, 0);
    for s in subjects {
        assert_eq!(e.rule_state::<u64>("count", s).unwrap(), Some(70));
    }
    let actions: Vec<String> = e
        .audit_log(10)
        .unwrap()
        .iter()
        .map(|a| a.action.as_str().to_string())
        .collect();
    assert!(actions.iter().any(|a| a == "promote_rule"), "{actions:?}");
    assert!(actions.iter().any(|a| a == "rule_promoted"), "{actions:?}");
}

/// Invariant 10 for shadows: a shadow needs its live rule and a higher
/// version, one shadow at a time; a promote needs a shadow; nothing is
/// recorded by a refusal.
fn a_shadow_is_refused_without_a_live_rule_and_a_promote_without_a_shadow<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    e.register_action("work", |_, _| Ok(())).unwrap();
    let err = e.register_rule(counting(2).shadow(0)).unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    e.register_rule(counting(2)).unwrap();
    let err = e.register_rule(counting(1).shadow(0)).unwrap_err();
    assert!(err.is_bad_input(), "a lower version: {err}");
    let op = e.operator("ops", "test").unwrap();
    assert!(op.promote_rule("count").unwrap_err().is_conflict());
    assert!(op.promote_rule("nope").unwrap_err().is_not_found());
    e.register_rule(counting(3).shadow(0)).unwrap();
    let err = e.register_rule(counting(4).shadow(0)).unwrap_err();
    assert!(err.is_conflict(), "one shadow at a time: {err}");
    assert!(
        op.promote_rule("count@v3").unwrap_err().is_bad_input(),
        "promote the live rule's name"
    );
    let err = e
        .register_rule(
            Rule::new("x@v2", "app")
                .on(["item.added"])
                .action("work")
                .decide(|_| Ok(Decision::Skip)),
        )
        .unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    let names: Vec<String> = e.rules().unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["count", "count@v3"]);
}
