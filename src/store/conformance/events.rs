//! The conformance suite for the change log: dense seqs in commit order, once per id, nothing left by a rollback.

use super::*;

/// Invariants 1 and 3 for appends made together (a rule's `RuleFired`
/// envelopes: one statement on PostgreSQL): in order at the next dense
/// seqs, after the transaction's own appends; each subject's versions in
/// order after its last; an id there already found, taking no seq; a type
/// the workspace has not registered refused for that append, by its index.
#[test]
fn appends_made_together_are_dense_in_order_and_once_per_id() {
    on_every_backend(|db| {
        setup(db, "shop");
        db.tx(|c| append(c, "shop", &event("Opened", "s-1").id("e-1")))
            .unwrap();
        let engine = |e: NewEvent| (e, Origin::Engine { depth: 2 });
        let (before, all) = db
            .tx_ordered(|c| {
                let before = append(c, "shop", &event("Opened", "s-2"))?;
                let all = changelog::append_all(
                    c,
                    NOW,
                    LIMITS,
                    "shop",
                    &[
                        engine(event("Closed", "s-1").id("e-2")),
                        engine(event("Closed", "s-9").id("e-1")),
                        engine(event("Opened", "s-3").id("e-3")),
                        engine(event("Closed", "s-1").id("e-4")),
                        engine(event("Closed", "s-2").id("e-5")),
                    ],
                )
                .map_err(|(_, e)| e)?;
                Ok((before, all))
            })
            .unwrap();
        assert_eq!((before.seq, before.version), (2, 1), "{}", db.name());
        let got: Vec<_> = all
            .iter()
            .map(|a| (a.id.as_str(), a.seq, a.version, a.existing))
            .collect();
        assert_eq!(
            got,
            [
                ("e-2", 3, 2, false),
                ("e-1", 1, 1, true),
                ("e-3", 4, 1, false),
                ("e-4", 5, 3, false),
                ("e-5", 6, 2, false),
            ],
            "{}",
            db.name()
        );
        db.tx(|c| {
            assert_eq!(changelog::head(c)?, 6);
            let read = changelog::read(c, &query("shop", 0))?;
            let rows: Vec<_> = read
                .iter()
                .map(|e| (e.seq, e.id.as_str(), e.subject.as_str(), e.version, e.depth))
                .collect();
            assert_eq!(
                rows[2..],
                [
                    (3, "e-2", "s-1", 2, 2),
                    (4, "e-3", "s-3", 1, 2),
                    (5, "e-4", "s-1", 3, 2),
                    (6, "e-5", "s-2", 2, 2),
                ]
            );
            Ok(())
        })
        .unwrap();
        // A type the workspace does not accept: that append is refused
        // (and the write, rolled back, leaves nothing).
        let mut refused = None;
        let rolled_back = db.tx_ordered(|c| {
            let all = changelog::append_all(
                c,
                NOW,
                LIMITS,
                "shop",
                &[
                    engine(event("Opened", "s-4").id("e-6")),
                    engine(event("Refunded", "s-4").id("e-7")),
                ],
            );
            let (i, e) = all.expect_err("a type not accepted");
            refused = Some((i, e.is_not_found()));
            Err::<(), _>(e)
        });
        assert!(rolled_back.is_err());
        assert_eq!(refused, Some((Some(1), true)), "{}", db.name());
        // The next append takes the next seq: nothing was left behind.
        let next = db
            .tx(|c| append(c, "shop", &event("Opened", "s-4")))
            .unwrap();
        assert_eq!(next.seq, 7, "{}", db.name());
    });
}

/// Invariants 1 and 3: seqs are dense and increasing; an id is appended once,
/// and appending it again reports the first seq.
#[test]
fn appends_are_dense_once_per_id_and_read_in_seq_order() {
    on_every_backend(|db| {
        setup(db, "shop");
        let (a, b, again) = db
            .tx(|c| {
                let a = append(c, "shop", &event("Opened", "s-1").id("e-1"))?;
                let b = append(c, "shop", &event("Closed", "s-2"))?;
                let again = append(c, "shop", &event("Opened", "s-1").id("e-1"))?;
                Ok((a, b, again))
            })
            .unwrap();
        assert_eq!((a.seq, b.seq), (1, 2), "{}", db.name());
        assert!(!a.existing && again.existing);
        assert_eq!(again.seq, 1);
        // Once more, in a transaction of its own: found, no seq taken.
        let later = db
            .tx(|c| append(c, "shop", &event("Opened", "s-1").id("e-1")))
            .unwrap();
        assert_eq!((later.seq, later.existing), (1, true));
        db.tx(|c| {
            assert_eq!(changelog::head(c)?, 2);
            Ok(())
        })
        .unwrap();
        // The id found by the insert itself (no look-up first) took no seq
        // either: the next append is the next seq.
        let (found, unregistered, next) = db
            .tx(|c| {
                let found = append(c, "shop", &event("Closed", "s-3").id("e-1"))?;
                // An id already there is found whatever the type sent again
                // (one the workspace does not accept included).
                let unregistered = append(c, "shop", &event("Refunded", "s-3").id("e-1"))?;
                Ok((
                    found,
                    unregistered,
                    append(c, "shop", &event("Closed", "s-3"))?,
                ))
            })
            .unwrap();
        assert_eq!((found.seq, found.existing), (1, true), "{}", db.name());
        assert_eq!(
            (unregistered.seq, unregistered.existing),
            (1, true),
            "{}",
            db.name()
        );
        assert_eq!(next.seq, 3, "{}", db.name());
        db.tx(|c| {
            assert_eq!(changelog::head(c)?, 3);
            let all = changelog::read(c, &query("shop", 0))?;
            assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
            assert_eq!(all[0].id, "e-1");
            assert_eq!(all[0].payload, r#"{"n":1}"#);
            let closed = changelog::read(c, &query("shop", 0).types(["Closed"]))?;
            assert_eq!(closed.len(), 2);
            assert_eq!(closed[0].subject, "s-2");
            let s1 = changelog::read(c, &query("shop", 0).subject("s-1"))?;
            assert_eq!(s1.len(), 1);
            assert_eq!(changelog::read(c, &query("shop", 1))?.len(), 2);
            assert_eq!(
                changelog::event_by_id(c, "shop", "e-1")?.map(|e| e.seq),
                Some(1)
            );
            assert_eq!(
                changelog::event(c, 2)?.map(|e| e.subject),
                Some("s-2".into())
            );
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 10: a refused append (unknown workspace, unregistered type,
/// reserved type) is a typed error, takes no seq, and leaves the transaction
/// usable: on PostgreSQL a failed statement would abort it, so none may fail.
#[test]
fn a_refused_append_takes_no_seq_and_the_transaction_goes_on() {
    on_every_backend(|db| {
        setup(db, "shop");
        let seq = db
            .tx(|c| {
                let e = append(c, "nowhere", &event("Opened", "x")).unwrap_err();
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
                let e = append(c, "shop", &event("Refunded", "x")).unwrap_err();
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
                let e = append(c, "shop", &event("RuleFired", "x")).unwrap_err();
                assert!(matches!(e, Error::ReservedType { .. }), "{e}");
                Ok(append(c, "shop", &event("Opened", "s-1"))?.seq)
            })
            .unwrap();
        assert_eq!(seq, 1, "{}", db.name());
    });
}

/// Invariant 2 and a dense log: a transaction that fails appends nothing, and
/// its seqs are handed out again.
#[test]
fn a_rolled_back_append_leaves_no_gap() {
    on_every_backend(|db| {
        setup(db, "shop");
        let failed: Result<()> = db.tx(|c| {
            append(c, "shop", &event("Opened", "s-1"))?;
            append(c, "shop", &event("Opened", "s-2"))?;
            Err(Error::invalid("test", "the caller gave up"))
        });
        assert!(failed.is_err());
        let seq = db
            .tx(|c| Ok(append(c, "shop", &event("Opened", "s-3"))?.seq))
            .unwrap();
        assert_eq!(seq, 1, "{}", db.name());
        db.tx(|c| {
            assert_eq!(changelog::read(c, &query("shop", 0))?.len(), 1);
            Ok(())
        })
        .unwrap();
    });
}

/// Whether the server's backend `pid` is waiting for a lock.
#[cfg(feature = "postgres")]
pub(super) fn waits_for_a_lock(client: &mut Client, pid: i32) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)",
            &[&pid],
        )
        .unwrap()
        .get(0)
}

/// Invariant 1 on PostgreSQL, the way event stores on it have got it wrong: a
/// transaction that appended first and commits last must not be skipped by a
/// reader that saw later appends. Here the later append waits for the first to
/// commit, so the reader never sees seq 2 without seq 1.
#[test]
#[cfg(feature = "postgres")]
fn a_reader_never_skips_an_event_committed_late() {
    let schema = Arc::new(PgSchema::new());
    let reader = schema.pool(1);
    let mut watcher = schema.client();
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    setup(&mut db, "shop");

    let slow = schema.begin();
    assert_eq!(
        append(&slow, "shop", &event("Opened", "slow")).unwrap().seq,
        1
    );

    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    let later = {
        let schema = Arc::clone(&schema);
        std::thread::spawn(move || {
            let conn = schema.begin();
            let pid: i32 = conn.query_untyped("SELECT pg_backend_pid()", &[]).unwrap()[0].get(0);
            pid_tx.send(pid).unwrap();
            let seq = append(&conn, "shop", &event("Opened", "quick"))
                .unwrap()
                .seq;
            conn.commit().unwrap();
            seq
        })
    };
    // The later append is waiting on the first (not merely not started).
    let pid = pid_rx.recv().unwrap();
    while !waits_for_a_lock(&mut watcher, pid) {
        std::thread::yield_now();
    }
    let seen = {
        let conn = PgConn::begin_as(reader.get().unwrap(), false).unwrap();
        let seen = changelog::read(&conn, &query("shop", 0)).unwrap();
        conn.commit().unwrap();
        seen
    };
    assert!(seen.is_empty(), "nothing is committed yet: {seen:?}");
    slow.commit().unwrap();
    assert_eq!(later.join().unwrap(), 2);
    let conn = PgConn::begin_as(reader.get().unwrap(), false).unwrap();
    let seen = changelog::read(&conn, &query("shop", 0)).unwrap();
    assert_eq!(
        seen.iter()
            .map(|e| (e.seq, e.subject.as_str()))
            .collect::<Vec<_>>(),
        [(1, "slow"), (2, "quick")]
    );
}

/// Invariant 1 under load: writers append in transactions held open for a
/// random while (`pg_sleep`) — some roll back — while a reader follows the log
/// with a cursor. The reader gets every committed event exactly once, in seq
/// order, and the seqs are dense. Its assertions do not depend on the timing;
/// the sleeps only vary the interleavings.
#[test]
#[cfg(feature = "postgres")]
fn a_cursor_following_concurrent_writers_gets_every_committed_event_once() {
    const WRITERS: usize = 4;
    const TXS: usize = 40;
    let schema = Arc::new(PgSchema::new());
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    setup(&mut db, "shop");
    let start = Arc::new(Barrier::new(WRITERS + 1));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (schema, start) = (Arc::clone(&schema), Arc::clone(&start));
            std::thread::spawn(move || {
                let pool = schema.pool(1);
                let mut committed = Vec::new();
                start.wait();
                for t in 0..TXS {
                    let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
                    let mut ids = Vec::new();
                    for k in 0..=(t % 3) {
                        let id = format!("w{w}-t{t}-{k}");
                        append(&conn, "shop", &event("Opened", &id).id(&id)).unwrap();
                        ids.push(id);
                    }
                    let pause = fastrand::u32(0..4);
                    conn.execute_untyped(&format!("SELECT pg_sleep({pause} / 1000.0)"), &[])
                        .unwrap();
                    if t % 5 == 4 {
                        drop(conn); // rolled back
                    } else {
                        conn.commit().unwrap();
                        committed.extend(ids);
                    }
                }
                committed
            })
        })
        .collect();

    let reader = schema.pool(1);
    let mut seen: Vec<(i64, String)> = Vec::new();
    let mut cursor = 0;
    start.wait();
    let follow = |reader: &pg::Pool, cursor: &mut i64, seen: &mut Vec<(i64, String)>| {
        let conn = PgConn::begin_as(reader.get().unwrap(), false).unwrap();
        let page = changelog::read(&conn, &query("shop", *cursor)).unwrap();
        conn.commit().unwrap();
        for e in page {
            assert!(e.seq > *cursor);
            *cursor = e.seq;
            seen.push((e.seq, e.id));
        }
    };
    while writers.iter().any(|w| !w.is_finished()) {
        follow(&reader, &mut cursor, &mut seen);
    }
    let committed: BTreeSet<String> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    follow(&reader, &mut cursor, &mut seen);

    let seqs: Vec<i64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        seqs,
        (1..=committed.len() as i64).collect::<Vec<_>>(),
        "dense, in order"
    );
    let ids: BTreeSet<String> = seen.into_iter().map(|s| s.1).collect();
    assert_eq!(ids, committed, "every committed event, and only those");
}

/// Invariant 1 with the application's savepoints: appends rolled back to a
/// savepoint give their lock up with them, so another transaction may append
/// and commit before this one; what this one appends after that still gets new
/// seqs, in commit order, and no two events share one (a gap is allowed where
/// the rolled-back appends were; a skip is not).
#[test]
#[cfg(feature = "postgres")]
fn appends_rolled_back_to_a_savepoint_leave_no_duplicate_and_no_skip() {
    let schema = Arc::new(PgSchema::new());
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    setup(&mut db, "shop");
    let first = schema.begin();
    first.execute_untyped("SAVEPOINT mine", &[]).unwrap();
    assert_eq!(
        append(&first, "shop", &event("Opened", "undone"))
            .unwrap()
            .seq,
        1
    );
    first
        .execute_untyped("ROLLBACK TO SAVEPOINT mine", &[])
        .unwrap();
    // The head's lock went with the savepoint: another transaction appends
    // and commits without waiting.
    let other = schema.begin();
    assert_eq!(
        append(&other, "shop", &event("Opened", "other"))
            .unwrap()
            .seq,
        1
    );
    other.commit().unwrap();
    let kept = append(&first, "shop", &event("Opened", "kept"))
        .unwrap()
        .seq;
    assert!(kept > 1, "after the other's commit: {kept}");
    first.commit().unwrap();
    let reader = schema.begin();
    let seen = changelog::read(&reader, &query("shop", 0)).unwrap();
    assert_eq!(
        seen.iter().map(|e| e.subject.as_str()).collect::<Vec<_>>(),
        ["other", "kept"]
    );
    assert_eq!(changelog::head(&reader).unwrap(), kept);
}

/// Invariant 13's ground, on every backend: each subject counts its events
/// from 1 in its workspace, reads back in version order from a version,
/// and keeps its version through the deletion of its events; each append
/// reports the version it took (on SQLite the insert finds it itself and
/// hands it back), whatever a refused append or a repeated id did before.
#[test]
fn subjects_count_their_versions_and_keep_them_through_pruning() {
    on_every_backend(|db| {
        setup(db, "shop");
        db.tx(|c| {
            let mut reported = Vec::new();
            for s in ["a", "b", "a", "a"] {
                reported.push(append(c, "shop", &event("Opened", s))?.version);
            }
            assert_eq!(reported, [1, 1, 2, 3]);
            assert_eq!(Events::subject_version(c, "shop", "a")?, 3);
            assert_eq!(Events::subject_version(c, "shop", "b")?, 1);
            assert_eq!(Events::subject_version(c, "shop", "z")?, 0);
            let from2 = Events::subject_events(c, "shop", "a", 2, 10)?;
            assert_eq!(
                from2.iter().map(|e| (e.version, e.seq)).collect::<Vec<_>>(),
                [(2, 3), (3, 4)]
            );
            // Everything deleted: the versions stay where they were.
            assert_eq!(Events::delete_old(c, "shop", 4, i64::MAX, 100)?, 4);
            assert_eq!(Events::subject_version(c, "shop", "a")?, 3);
            assert_eq!(Events::subject_version(c, "shop", "b")?, 1);
            let refused = append(c, "shop", &event("Unregistered", "a")).unwrap_err();
            assert!(refused.is_not_found(), "{refused}");
            let next = append(c, "shop", &event("Opened", "a"))?;
            assert_eq!(next.version, 4);
            let again = append(c, "shop", &event("Opened", "a").id(next.id.clone()))?;
            assert!(again.existing);
            assert_eq!((again.seq, again.version), (next.seq, 4));
            assert_eq!(append(c, "shop", &event("Opened", "b"))?.version, 2);
            assert_eq!(Events::get(c, next.seq)?.map(|e| e.version), Some(4));
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 1 for a reader that keeps its page: a page read into events
/// read before (longer texts, optional fields set where the new ones have
/// none and the other way round, a payload already parsed) is the page
/// read anew, field for field; a page that comes back shorter drops the
/// rest.
#[test]
fn a_page_read_into_an_earlier_page_is_the_page_read_anew() {
    on_every_backend(|db| {
        setup(db, "shop");
        db.tx(|c| {
            let plain = event("Opened", "s-1");
            let caused = event("Closed", "a-much-longer-subject/2")
                .causation_id("cause")
                .correlation_id("conversation")
                .payload_json(r#"{"n":2,"text":"a longer payload than the first"}"#);
            for i in 0..3 {
                append(c, "shop", &plain.clone().id(format!("p-{i}")))?;
                append(c, "shop", &caused.clone().id(format!("c-{i}")))?;
            }
            Ok(())
        })
        .unwrap();
        db.tx(|c| {
            // Read after seq 1 into a page of the events from seq 1: every
            // event lands on one of the other kind.
            let mut page = Events::page(c, "shop", 0, &[], 6)?;
            page[1].json()?;
            Events::page_into(c, "shop", 1, 6, &mut page)?;
            assert_eq!(page, Events::page(c, "shop", 1, &[], 6)?);
            assert_eq!(page.len(), 5);
            // The parse of the payload it replaced is gone with it.
            assert_eq!(page[1].json()?["n"], 1);
            Events::page_into(c, "shop", 4, 6, &mut page)?;
            assert_eq!(page, Events::page(c, "shop", 4, &[], 6)?);
            Events::page_into(c, "shop", 6, 6, &mut page)?;
            assert!(page.is_empty());
            Ok(())
        })
        .unwrap();
    });
}
