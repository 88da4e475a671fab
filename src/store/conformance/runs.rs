//! The conformance suite for runs and lanes: claims settled by their holder at their attempt, lanes in order, unique keys, lapsed claims.

use super::*;

/// A task run to create: ready now unless `lane` or `unique` say otherwise.
pub(crate) fn task<'a>(id: &'a str, lane: Option<&'a str>, unique: Option<Uniq<'a>>) -> NewRun<'a> {
    static RETRY: std::sync::LazyLock<RetryPolicy> = std::sync::LazyLock::new(RetryPolicy::default);
    NewRun {
        id,
        kind: "task",
        action: "send",
        workspace: None,
        rule: None,
        scope: None,
        lane,
        on_dead_letter: "continue",
        input: r#"{"to":"a@example.com"}"#,
        event_seq: None,
        event_id: None,
        depth: 0,
        retry: &RETRY,
        due_at: NOW,
        now: NOW,
        dead: None,
        priority: None,
        unique,
        parent: None,
        key: None,
        traceparent: None,
    }
}

fn send() -> Vec<String> {
    vec!["send".to_string()]
}

/// Invariant 5 (a run's claim is its holder's at its attempt): only the claim
/// that holds settles a run; a retry is claimed again at the next attempt, and
/// the old claim settles nothing.
#[test]
fn a_claim_is_settled_only_by_its_holder_at_its_attempt() {
    on_every_backend(|db| {
        db.tx(|c| {
            for id in ["r1", "r2", "r3"] {
                assert_eq!(Runs::insert(c, &task(id, None, None))?, Inserted::New);
            }
            assert_eq!(Runs::insert(c, &task("r1", None, None))?, Inserted::Existed);
            Ok(())
        })
        .unwrap();
        let claimed = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 30_000, 2, &send(), 0))
            .unwrap();
        assert_eq!(claimed.len(), 2, "{}", db.name());
        assert!(
            claimed
                .iter()
                .all(|r| r.attempt == 1 && r.state == "running")
        );
        let (first, second) = (&claimed[0].id, &claimed[1].id);
        db.tx(|c| {
            assert!(!Runs::succeed(c, first, "b", 1, NOW)?, "another holder");
            assert!(!Runs::succeed(c, first, "a", 2, NOW)?, "another attempt");
            assert!(Runs::succeed(c, first, "a", 1, NOW)?);
            assert!(!Runs::succeed(c, first, "a", 1, NOW)?, "settled once");
            assert!(Runs::renew(c, second, "a", 1, NOW + 1, NOW + 40_000)?);
            assert!(Runs::retry_later(
                c,
                second,
                "a",
                1,
                NOW + 2,
                NOW + 5_000,
                "timeout"
            )?);
            Ok(())
        })
        .unwrap();
        // Not due yet: only the third run is claimable now.
        let now_claimed = db
            .tx(|c| Runs::claim_at(c, "b", NOW + 3, NOW + 30_000, 10, &send(), 0))
            .unwrap();
        assert_eq!(now_claimed.len(), 1);
        assert_eq!(now_claimed[0].id, "r3");
        let again = db
            .tx(|c| Runs::claim_at(c, "b", NOW + 5_000, NOW + 35_000, 10, &send(), 0))
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].id.as_str(), again[0].attempt),
            (second.as_str(), 2)
        );
        db.tx(|c| {
            assert!(!Runs::kill(c, second, "a", 1, NOW + 5_001, "stale")?);
            assert!(Runs::kill(c, second, "b", 2, NOW + 5_001, "gave up")?);
            let row = Runs::get(c, second)?.expect("the run");
            assert_eq!(row.state, "dead");
            assert_eq!(row.last_error.as_deref(), Some("gave up"));
            assert_eq!(
                Runs::get(c, first)?.map(|r| r.state),
                Some("succeeded".into())
            );
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 5, for a batch's plain successes settled in one call: of the
/// claims given, exactly those still held — by this holder, at this attempt,
/// still running, with no cancellation asked for — succeed, and the call
/// names them; a claim of another holder or of a later attempt, a run
/// asked to stop, and one settled already are left as they were.
#[test]
fn a_batch_of_successes_settles_only_the_claims_that_still_hold() {
    on_every_backend(|db| {
        db.tx(|c| {
            for id in ["s1", "s2", "s3", "s4", "s5"] {
                Runs::insert(c, &task(id, None, None))?;
            }
            Ok(())
        })
        .unwrap();
        let claimed = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 30_000, 5, &send(), 0))
            .unwrap();
        assert_eq!(claimed.len(), 5, "{}", db.name());
        let by_id = |id: &str| claimed.iter().find(|r| r.id == id).expect("claimed");
        db.tx(|c| {
            // s2 settled already; s3 asked to stop; s4 retried, and claimed
            // again by the same holder at the next attempt.
            assert!(Runs::succeed(c, "s2", "a", 1, NOW)?);
            assert!(Runs::cancel(c, "s3", NOW, "operator", "stop")?.is_some());
            assert!(Runs::retry_later(c, "s4", "a", 1, NOW, NOW, "again")?);
            Ok(())
        })
        .unwrap();
        let retaken = db
            .tx(|c| Runs::claim_at(c, "a", NOW + 1, NOW + 30_000, 5, &send(), 0))
            .unwrap();
        assert_eq!(
            retaken
                .iter()
                .map(|r| (r.id.as_str(), r.attempt))
                .collect::<Vec<_>>(),
            [("s4", 2)],
            "{}",
            db.name()
        );
        let mut done = db
            .tx(|c| {
                let s1 = [(by_id("s1").ord, "s1", 1)];
                assert!(
                    Runs::succeed_many(c, "b", &s1, NOW + 2)?.is_empty(),
                    "another holder"
                );
                let claims: Vec<(i64, &str, i64)> = ["s1", "s2", "s3", "s4", "s5"]
                    .iter()
                    .map(|id| (by_id(id).ord, *id, 1))
                    .collect();
                Runs::succeed_many(c, "a", &claims, NOW + 2)
            })
            .unwrap();
        done.sort();
        assert_eq!(done, ["s1", "s5"], "{}", db.name());
        db.tx(|c| {
            let state = |id: &str| Runs::get(c, id).map(|r| r.expect("the run").state);
            assert_eq!(state("s1")?, "succeeded");
            assert_eq!(state("s5")?, "succeeded");
            assert_eq!(state("s2")?, "succeeded");
            assert_eq!(state("s3")?, "running", "asked to stop, not settled");
            assert_eq!(state("s4")?, "running", "the claim of a later attempt");
            let s4 = Runs::get(c, "s4")?.expect("s4");
            assert_eq!((s4.claimed_by.as_deref(), s4.attempt), (Some("a"), 2));
            // The same claims again: nothing holds any more.
            let claims = [(by_id("s1").ord, "s1", 1), (by_id("s5").ord, "s5", 1)];
            assert!(Runs::succeed_many(c, "a", &claims, NOW + 3)?.is_empty());
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 6 (scope order) and uniqueness, as runs are created: the first run
/// of a lane is ready and the next waits; a key another pending run holds
/// creates nothing and names that run.
#[test]
fn a_lane_runs_one_at_a_time_and_a_unique_key_is_held_once() {
    on_every_backend(|db| {
        let pending = Uniq {
            key: "shard/3",
            mode: "pending",
            period_ms: 0,
        };
        db.tx(|c| {
            assert_eq!(
                Runs::insert(c, &task("l1", Some("lane/a"), None))?,
                Inserted::New
            );
            assert_eq!(
                Runs::insert(c, &task("l2", Some("lane/a"), None))?,
                Inserted::New
            );
            assert_eq!(
                Runs::insert(c, &task("u1", None, Some(pending)))?,
                Inserted::New
            );
            assert_eq!(
                Runs::insert(c, &task("u2", None, Some(pending)))?,
                Inserted::Duplicate("u1".into())
            );
            assert_eq!(Runs::get(c, "l1")?.map(|r| r.state), Some("ready".into()));
            assert_eq!(Runs::get(c, "l2")?.map(|r| r.state), Some("waiting".into()));
            assert!(Runs::get(c, "u2")?.is_none());
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 6 (scope order), as runs are created: a run whose id is there
/// already (a firing made before, decided again) enters no lane — not the
/// one it asked for, nor its own a second time.
#[test]
fn a_run_whose_id_is_there_already_enters_no_lane() {
    on_every_backend(|db| {
        db.tx(|c| {
            assert_eq!(
                Runs::insert(c, &task("l1", Some("lane/a"), None))?,
                Inserted::New
            );
            assert_eq!(
                Runs::insert(c, &task("l1", Some("lane/b"), None))?,
                Inserted::Existed
            );
            assert_eq!(
                Runs::insert(c, &task("l1", Some("lane/a"), None))?,
                Inserted::Existed
            );
            Ok(())
        })
        .unwrap();
        db.tx(|c| {
            assert_eq!(Lanes::lane_head(c, "lane/b")?, None, "no lane made");
            assert_eq!(Lanes::lane_head(c, "lane/a")?, Some(("l1".into(), false)));
            let run = Runs::get(c, "l1")?.expect("the first insert's");
            assert_eq!(
                (run.state.as_str(), run.lane.as_deref()),
                ("ready", Some("lane/a"))
            );
            // The lane's next run waits behind its head.
            assert_eq!(
                Runs::insert(c, &task("l2", Some("lane/a"), None))?,
                Inserted::New
            );
            assert_eq!(Runs::get(c, "l2")?.map(|r| r.state), Some("waiting".into()));
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 6 (scope order), for runs made together (a rule's firings:
/// one statement on PostgreSQL): in order, each as made alone — an id
/// there already makes nothing and enters no lane; a new lane's first run
/// is its head and ready, the next waits; a lane that has a head keeps it;
/// a run with no lane is ready.
#[test]
fn runs_made_together_take_their_lanes_in_order() {
    on_every_backend(|db| {
        let name = db.name();
        db.tx(|c| {
            assert_eq!(
                Runs::insert(c, &task("old", Some("lane/a"), None))?,
                Inserted::New
            );
            Ok(())
        })
        .unwrap();
        let made = db
            .tx(|c| {
                Runs::insert_all(
                    c,
                    &[
                        task("b1", Some("lane/b"), None),
                        task("old", Some("lane/c"), None),
                        task("a1", Some("lane/a"), None),
                        task("free", None, None),
                        task("b2", Some("lane/b"), None),
                    ],
                )
                .map_err(|(_, e)| e)
            })
            .unwrap();
        assert_eq!(
            made,
            [
                Inserted::New,
                Inserted::Existed,
                Inserted::New,
                Inserted::New,
                Inserted::New
            ],
            "{}",
            name
        );
        db.tx(|c| {
            let state = |id: &str| Runs::get(c, id).map(|r| r.map(|r| (r.state, r.ord)));
            let (b1, a1, free, b2) = (state("b1")?, state("a1")?, state("free")?, state("b2")?);
            let (b1, a1, free, b2) = (b1.unwrap(), a1.unwrap(), free.unwrap(), b2.unwrap());
            assert_eq!(
                [&b1.0, &a1.0, &free.0, &b2.0],
                ["ready", "waiting", "ready", "waiting"],
                "{}",
                name
            );
            assert!(b1.1 < a1.1 && a1.1 < free.1 && free.1 < b2.1, "in order");
            assert_eq!(Lanes::lane_head(c, "lane/b")?, Some(("b1".into(), false)));
            assert_eq!(Lanes::lane_head(c, "lane/a")?, Some(("old".into(), false)));
            assert_eq!(Lanes::lane_head(c, "lane/c")?, None, "no lane made");
            assert_eq!(
                Runs::get(c, "old")?.and_then(|r| r.lane),
                Some("lane/a".into())
            );
            // The lane hands on in order: b1, then b2.
            Lanes::advance_lane(c, "lane/b", "b1", NOW + 1)?;
            assert_eq!(Lanes::lane_head(c, "lane/b")?, Some(("b2".into(), false)));
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 6 on PostgreSQL, for runs made together: a run whose id a
/// transaction that committed while the batch's statement waited inserted
/// is not made, and the lane's row the statement made it the head of is
/// given up; the batch's other runs are made.
#[test]
#[cfg(feature = "postgres")]
fn runs_made_together_give_up_the_lane_of_one_another_transaction_inserted_first() {
    let schema = PgSchema::new();
    let (first, second, pid) = x_inserted_uncommitted(&schema);
    let inserting = std::thread::spawn(move || {
        let made = Runs::insert_all(
            &second,
            &[
                task("y", Some("lane/e"), None),
                task("x", Some("lane/d"), None),
            ],
        );
        (made.map_err(|(_, e)| e), second)
    });
    await_lock_wait(&schema, pid);
    first.commit().unwrap();
    let (made, second) = inserting.join().unwrap();
    assert_eq!(made.unwrap(), [Inserted::New, Inserted::Existed]);
    second.commit().unwrap();
    let check = schema.begin();
    assert_eq!(
        Lanes::lane_head(&check, "lane/d").unwrap(),
        None,
        "given up"
    );
    assert_eq!(
        Lanes::lane_head(&check, "lane/e").unwrap(),
        Some(("y".into(), false))
    );
    assert_eq!(
        Runs::get(&check, "x").unwrap().and_then(|r| r.lane),
        Some("lane/c".into())
    );
}

/// Two transactions on `schema`: the first has inserted run `x` (lane
/// `lane/c`) and not committed; the second, begun, with its server
/// backend's pid.
#[cfg(feature = "postgres")]
fn x_inserted_uncommitted(schema: &PgSchema) -> (PgConn, PgConn, i32) {
    let first = schema.begin();
    assert_eq!(
        Runs::insert(&first, &task("x", Some("lane/c"), None)).unwrap(),
        Inserted::New
    );
    let second = schema.begin();
    let pid: i32 = second
        .query_untyped("SELECT pg_backend_pid()", &[])
        .unwrap()[0]
        .get(0);
    (first, second, pid)
}

/// Returns once the server's backend `pid` waits for a lock (another
/// transaction's), asked of the server until it does (a minute at most).
#[cfg(feature = "postgres")]
fn await_lock_wait(schema: &PgSchema, pid: i32) {
    let mut admin = Client::connect(&schema.url(), NoTls).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            &[&pid],
        )
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "backend {pid} never waited for a lock"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Invariant 6 on PostgreSQL: a laned run's insert that meets its id
/// inserted by a transaction that committed while it waited inserts
/// nothing, and leaves no lane behind — the lane's row it made, with the
/// run its head, is given up (a lane whose head never exists would hold
/// every later run of the lane waiting).
#[test]
#[cfg(feature = "postgres")]
fn a_laned_run_another_transaction_inserted_first_leaves_no_lane() {
    let schema = PgSchema::new();
    let (first, second, pid) = x_inserted_uncommitted(&schema);
    let inserting = std::thread::spawn(move || {
        let inserted = Runs::insert(&second, &task("x", Some("lane/d"), None));
        (inserted, second)
    });
    // The second insert waits for the first transaction (the run's id).
    await_lock_wait(&schema, pid);
    first.commit().unwrap();
    let (inserted, second) = inserting.join().unwrap();
    assert_eq!(inserted.unwrap(), Inserted::Existed);
    assert_eq!(
        Lanes::lane_head(&second, "lane/d").unwrap(),
        None,
        "given up"
    );
    second.commit().unwrap();
    let check = schema.begin();
    assert_eq!(Lanes::lane_head(&check, "lane/d").unwrap(), None);
    assert_eq!(
        Lanes::lane_head(&check, "lane/c").unwrap(),
        Some(("x".into(), false))
    );
    assert_eq!(
        Runs::get(&check, "x").unwrap().and_then(|r| r.lane),
        Some("lane/c".into())
    );
}

/// Invariant 5: claims on PostgreSQL: four claimers at once over 2,000 runs,
/// each claiming batches in transactions of its own and settling them. Every
/// run is claimed exactly once; and a claimer never waits for another's
/// uncommitted claim (`SKIP LOCKED`: with a lock timeout of a second, a wait
/// would be an error).
#[test]
#[cfg(feature = "postgres")]
fn concurrent_claimers_never_share_a_run_and_never_wait_for_each_other() {
    const RUNS: usize = 2_000;
    let schema = Arc::new(PgSchema::new());
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    let ids: Vec<String> = (0..RUNS).map(|i| format!("run-{i:05}")).collect();
    db.tx(|c| {
        for id in &ids {
            Runs::insert(c, &task(id, None, None))?;
        }
        Ok(())
    })
    .unwrap();

    // One claimer holds its claim open; another claims beside it at once.
    let holding = schema.begin();
    let held = Runs::claim_at(&holding, "slow", NOW, NOW + 30_000, 10, &send(), 0).unwrap();
    let beside = schema.begin();
    beside
        .execute_untyped("SET LOCAL lock_timeout = '1s'", &[])
        .unwrap();
    let other = Runs::claim_at(&beside, "quick", NOW, NOW + 30_000, 10, &send(), 0).unwrap();
    assert_eq!((held.len(), other.len()), (10, 10));
    assert!(held.iter().all(|h| other.iter().all(|o| o.id != h.id)));
    drop(beside); // rolled back: its runs are ready again
    drop(holding);

    let claimers: Vec<_> = (0..4)
        .map(|w| {
            let schema = Arc::clone(&schema);
            std::thread::spawn(move || {
                let pool = schema.pool(1);
                let holder = format!("claimer-{w}");
                let mut mine = Vec::new();
                loop {
                    let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
                    conn.execute_untyped("SET LOCAL lock_timeout = '1s'", &[])
                        .unwrap();
                    let batch =
                        Runs::claim_at(&conn, &holder, NOW, NOW + 30_000, 25, &send(), 0).unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    for r in &batch {
                        assert!(Runs::succeed(&conn, &r.id, &holder, r.attempt, NOW).unwrap());
                        mine.push(r.id.clone());
                    }
                    conn.commit().unwrap();
                }
                mine
            })
        })
        .collect();
    let mut claimed: Vec<String> = claimers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    claimed.sort();
    assert_eq!(claimed, ids, "every run claimed exactly once");
}

/// Invariant 6 (scope order): a lane runs one run at a time, in order — when
/// its head ends, the next waiting run becomes head and ready; a blocked lane
/// says so; a lane with nothing left goes.
#[test]
fn a_lane_hands_on_to_its_next_run_when_its_head_ends() {
    on_every_backend(|db| {
        db.tx(|c| {
            for id in ["l1", "l2", "l3"] {
                Runs::insert(c, &task(id, Some("lane/a"), None))?;
            }
            Ok(())
        })
        .unwrap();
        let claimed = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 30_000, 10, &send(), 0))
            .unwrap();
        let ids: Vec<&str> = claimed.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["l1"], "{}: only the head is ready", db.name());
        db.tx(|c| {
            assert!(Runs::succeed(c, "l1", "a", 1, NOW + 1)?);
            // Not the head: nothing moves.
            Lanes::advance_lane(c, "lane/a", "l3", NOW + 1)?;
            assert_eq!(Lanes::lane_head(c, "lane/a")?, Some(("l1".into(), false)));
            Lanes::advance_lane(c, "lane/a", "l1", NOW + 1)?;
            assert_eq!(Lanes::lane_head(c, "lane/a")?, Some(("l2".into(), false)));
            assert_eq!(Runs::get(c, "l2")?.map(|r| r.state), Some("ready".into()));
            assert_eq!(Runs::get(c, "l3")?.map(|r| r.state), Some("waiting".into()));
            assert!(Lanes::set_blocked(c, "lane/a", true, NOW + 2)?);
            assert_eq!(Lanes::lane_head(c, "lane/a")?, Some(("l2".into(), true)));
            assert!(!Lanes::set_blocked(c, "lane/none", true, NOW + 2)?);
            Lanes::advance_lane(c, "lane/a", "l2", NOW + 3)?;
            Lanes::advance_lane(c, "lane/a", "l3", NOW + 3)?;
            assert_eq!(Lanes::lane_head(c, "lane/a")?, None, "an empty lane goes");
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 5 (at least once): a claim whose executor stopped renewing it
/// lapses and is claimable again at the next attempt; a claim given back at
/// shutdown does not count as an attempt; a checkpoint is saved only by the
/// claim that holds.
#[test]
fn a_lapsed_claim_is_claimed_again_and_a_released_one_keeps_its_attempt() {
    on_every_backend(|db| {
        db.tx(|c| Runs::insert(c, &task("r1", None, None)).map(|_| ()))
            .unwrap();
        let first = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 10, 1, &send(), 0))
            .unwrap();
        let ord = first[0].ord;
        let name = db.name();
        db.tx(|c| {
            assert!(Runs::save_checkpoint(
                c,
                "r1",
                "a",
                1,
                r#"{"page":2}"#,
                NOW + 1
            )?);
            assert!(!Runs::save_checkpoint(c, "r1", "b", 1, "{}", NOW + 1)?);
            assert!(Runs::lapsed(c, NOW + 9, 10)?.is_empty(), "not yet");
            let lapsed = Runs::lapsed(c, NOW + 10, 10)?;
            assert_eq!(lapsed.len(), 1, "{name}");
            assert_eq!(Runs::requeue_lapsed(c, ord, NOW + 10)?, Requeued::Ready);
            assert_eq!(Runs::requeue_lapsed(c, ord, NOW + 10)?, Requeued::No);
            Ok(())
        })
        .unwrap();
        let second = db
            .tx(|c| Runs::claim_at(c, "b", NOW + 11, NOW + 40, 1, &send(), 0))
            .unwrap();
        assert_eq!(
            (second[0].attempt, second[0].checkpoint.as_deref()),
            (2, Some(r#"{"page":2}"#))
        );
        db.tx(|c| {
            assert!(
                !Runs::succeed(c, "r1", "a", 1, NOW + 12)?,
                "the lapsed claim settles nothing"
            );
            assert_eq!(Runs::release(c, ord, "a", 1, NOW + 12)?, Requeued::No);
            assert_eq!(Runs::release(c, ord, "b", 2, NOW + 12)?, Requeued::Ready);
            assert_eq!(
                Runs::get(c, "r1")?.map(|r| (r.state, r.attempt)),
                Some(("ready".into(), 1))
            );
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 5 (an executor acts on the claim it holds): what a claim
/// returns is each run as the store now holds it — its holder, attempt,
/// expiry, start and the log's head at its first claim, which a run
/// claimed again keeps.
#[test]
fn a_claim_returns_each_run_as_the_store_now_holds_it() {
    on_every_backend(|db| {
        let name = db.name();
        setup(db, "shop");
        db.tx(|c| {
            append(c, "shop", &event("Opened", "a"))?;
            for id in ["r1", "r2", "r3"] {
                Runs::insert(c, &task(id, None, None))?;
            }
            Ok(())
        })
        .unwrap();
        let first = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 10, 1, &send(), 0))
            .unwrap();
        db.tx(|c| {
            append(c, "shop", &event("Closed", "a"))?;
            Runs::requeue_lapsed(c, first[0].ord, NOW + 10).map(|_| ())
        })
        .unwrap();
        let claimed = db
            .tx(|c| Runs::claim_at(c, "b", NOW + 11, NOW + 40, 3, &send(), 0))
            .unwrap();
        assert_eq!(claimed.len(), 3, "{name}");
        db.tx(|c| {
            for r in &claimed {
                let stored = Runs::get(c, &r.id)?.expect("claimed runs are there");
                assert_eq!(format!("{r:?}"), format!("{stored:?}"), "{name}");
                assert_eq!(
                    (r.claimed_by.as_deref(), r.claim_expires_at, r.started_at),
                    (Some("b"), Some(NOW + 40), Some(NOW + 11)),
                    "{name}"
                );
            }
            Ok(())
        })
        .unwrap();
        let again = claimed.iter().find(|r| r.id == first[0].id).unwrap();
        let fresh = claimed.iter().find(|r| r.id != first[0].id).unwrap();
        assert_eq!(again.attempt, 2, "{name}");
        assert_eq!(again.began_seq, first[0].began_seq, "{name}");
        assert!(again.began_seq < fresh.began_seq, "{name}");
        // A claim of picked runs (a keyed action's) by their positions.
        db.tx(|c| {
            let mut ords = Vec::new();
            for id in ["r4", "r5"] {
                Runs::insert(c, &task(id, None, None))?;
                ords.push(Runs::get(c, id)?.expect("inserted").ord);
            }
            let picked = Control::claim_ords(c, "c", NOW + 12, NOW + 50, &ords)?;
            assert_eq!(picked.len(), 2, "{name}");
            for r in &picked {
                let stored = Runs::get(c, &r.id)?.expect("claimed runs are there");
                assert_eq!(format!("{r:?}"), format!("{stored:?}"), "{name}");
                assert_eq!(r.claimed_by.as_deref(), Some("c"), "{name}");
            }
            Ok(())
        })
        .unwrap();
    });
}

/// Gives the action "mail" a concurrency limit of one: its runs go
/// through the claim, which counts what it takes.
fn limit_mail(c: &dyn Core) -> Result<()> {
    Control::configure_action(
        c,
        &crate::store::control::ActionRow {
            action: "mail".into(),
            priority: 0,
            max_running: Some(1),
            rate_count: None,
            rate_period_ms: None,
            partition_by: None,
            fair: false,
        },
        None,
        NOW,
    )
}

/// Invariant 14 (claims match the work) at the hand-over: a run just
/// inserted is claimed for an idle executor only if its action is neither
/// paused nor limited (a limit counts what a claim takes), and only while
/// it is ready; the answer says whether the action may be handed, so the
/// evaluator asks once per action and write.
#[test]
fn a_fresh_run_is_handed_over_only_when_its_action_may_be_and_it_is_ready() {
    on_every_backend(|db| {
        let name = db.name();
        setup(db, "shop");
        db.tx(|c| {
            Runs::insert(c, &task("r1", None, None))?;
            let (may, run) = Control::hand_over_fresh(c, "send", "h", NOW, NOW + 10, "r1")?;
            let run = run.expect("a ready run of an action that may be handed");
            assert!(may, "{name}");
            let stored = Runs::get(c, "r1")?.expect("inserted");
            assert_eq!(format!("{run:?}"), format!("{stored:?}"), "{name}");
            assert_eq!(
                (run.state.as_str(), run.claimed_by.as_deref(), run.attempt),
                ("running", Some("h"), 1),
                "{name}"
            );
            // Claimed already: not ready, so not handed again.
            let again = Control::hand_over_fresh(c, "send", "h2", NOW, NOW + 10, "r1")?;
            assert_eq!((again.0, again.1.is_none()), (true, true), "{name}");
            // A limited action: its runs go through the claim.
            limit_mail(c)?;
            Runs::insert(
                c,
                &NewRun {
                    action: "mail",
                    ..task("r2", None, None)
                },
            )?;
            let limited = Control::hand_over_fresh(c, "mail", "h", NOW, NOW + 10, "r2")?;
            assert_eq!((limited.0, limited.1.is_none()), (false, true), "{name}");
            // A paused action: nothing of it starts.
            Control::pause(c, "action", "send", NOW, "op", "maintenance")?;
            Runs::insert(c, &task("r3", None, None))?;
            let paused = Control::hand_over_fresh(c, "send", "h", NOW, NOW + 10, "r3")?;
            assert_eq!((paused.0, paused.1.is_none()), (false, true), "{name}");
            for id in ["r2", "r3"] {
                let run = Runs::get(c, id)?.expect("inserted");
                assert_eq!(
                    (run.state.as_str(), run.attempt),
                    ("ready", 0),
                    "{name} {id}"
                );
            }
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 14 (claims match the work) at a run's insert: a run inserted
/// and handed over at once (`insert_handed`, one statement on PostgreSQL
/// for a run that holds no key) is the run the insert and then the
/// hand-over make — claimed only at its lane's head, only if its action is
/// neither paused nor limited, and only if the insert made it.
#[test]
fn a_run_handed_over_at_its_insert_is_the_run_an_insert_then_a_hand_over_make() {
    use crate::store::control::insert_handed;
    use crate::store::runs::RunRow;
    on_every_backend(|db| {
        let name = db.name();
        setup(db, "shop");
        db.tx(|c| {
            // The log's head, which a claim records as where the run began.
            append(c, "shop", &event("Opened", "s-1"))?;
            append(c, "shop", &event("Opened", "s-2"))?;
            // Due before its insert, so a start or a change time taken
            // from the wrong value shows.
            let early = |id, lane| NewRun {
                due_at: NOW - 5,
                ..task(id, lane, None)
            };
            // What the two ways may differ in: the id, the position, the lane.
            let same = |r: &RunRow| RunRow {
                ord: 0,
                id: String::new(),
                lane: None,
                ..r.clone()
            };
            for (at_once, in_turn, lanes) in [("r1", "r2", Some(("a", "b"))), ("r4", "r7", None)] {
                let (inserted, may, run) =
                    insert_handed(c, &early(at_once, lanes.map(|l| l.0)), "h", NOW + 10)?;
                let run = run.expect("ready, of an action that may be handed");
                assert_eq!((inserted, may), (Inserted::New, true), "{name}");
                let stored = Runs::get(c, at_once)?.expect("inserted");
                assert_eq!(format!("{run:?}"), format!("{stored:?}"), "{name}");
                Runs::insert(c, &early(in_turn, lanes.map(|l| l.1)))?;
                let (_, turn) = Control::hand_over_fresh(c, "send", "h", NOW, NOW + 10, in_turn)?;
                let turn = turn.expect("ready");
                assert_eq!(
                    format!("{:?}", same(&run)),
                    format!("{:?}", same(&turn)),
                    "{name}"
                );
                assert_eq!(
                    (run.state.as_str(), run.attempt, run.claimed_by.as_deref()),
                    ("running", 1, Some("h")),
                    "{name}"
                );
                assert_eq!(
                    (run.claim_expires_at, run.started_at, run.began_seq),
                    (Some(NOW + 10), Some(NOW), Some(2)),
                    "{name}"
                );
                assert_eq!((run.due_at, run.updated_at), (NOW - 5, NOW), "{name}");
            }
            // Behind its lane's head: waiting, not claimed.
            let behind = insert_handed(c, &task("r3", Some("a"), None), "h", NOW + 10)?;
            assert_eq!(
                (behind.0, behind.1, behind.2.is_none()),
                (Inserted::New, true, true),
                "{name}"
            );
            // An id there already, with a lane or none: nothing inserted,
            // nothing claimed, no lane made.
            for lane in [Some("c"), None] {
                let again = insert_handed(c, &task("r1", lane, None), "h2", NOW + 10)?;
                assert_eq!(
                    (again.0, again.2.is_none()),
                    (Inserted::Existed, true),
                    "{name}"
                );
            }
            assert_eq!(Lanes::lane_head(c, "c")?, None, "{name}");
            // A limited action: inserted ready, for the claim.
            limit_mail(c)?;
            let mail = NewRun {
                action: "mail",
                ..task("r5", Some("d"), None)
            };
            let limited = insert_handed(c, &mail, "h", NOW + 10)?;
            assert_eq!(
                (limited.0, limited.1, limited.2.is_none()),
                (Inserted::New, false, true),
                "{name}"
            );
            // A paused action: inserted ready, nothing of it starts.
            Control::pause(c, "action", "send", NOW, "op", "maintenance")?;
            for (id, lane) in [("r6", Some("e")), ("r8", None)] {
                let paused = insert_handed(c, &task(id, lane, None), "h", NOW + 10)?;
                assert_eq!(
                    (paused.0, paused.1, paused.2.is_none()),
                    (Inserted::New, false, true),
                    "{name} {id}"
                );
            }
            for (id, state) in [
                ("r3", "waiting"),
                ("r5", "ready"),
                ("r6", "ready"),
                ("r8", "ready"),
            ] {
                let run = Runs::get(c, id)?.expect("inserted");
                assert_eq!(
                    (run.state.as_str(), run.attempt, run.claimed_by),
                    (state, 0, None),
                    "{name} {id}"
                );
            }
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 9 (a lane runs one run at a time, in order) when two
/// transactions insert the same run into its lane at once, on PostgreSQL:
/// the second waits for the lane's row the first made, finds the run's id
/// its head and the id taken, and inserts nothing — and leaves the lane's
/// row, which is the first one's run's, where it gave up a row it had made
/// itself. (It deleted it, and the lane's next run then started beside
/// its head.) Both ways of inserting a run: the insert alone, and the
/// insert that hands the run over at once.
#[test]
#[cfg(feature = "postgres")]
fn a_run_inserted_twice_at_once_leaves_its_lane_to_the_one_that_committed() {
    use crate::store::control::insert_handed;
    for handed in [false, true] {
        let schema = Arc::new(PgSchema::new());
        let mut watcher = schema.client();
        let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
        setup(&mut db, "shop");
        let insert = move |c: &PgConn| -> Inserted {
            let run = task("r1", Some("a"), None);
            if handed {
                insert_handed(c, &run, "h", NOW + 10).unwrap().0
            } else {
                Runs::insert(c, &run).unwrap()
            }
        };
        let first = schema.begin();
        assert_eq!(insert(&first), Inserted::New);
        let (pid_tx, pid_rx) = std::sync::mpsc::channel();
        let second = {
            let schema = Arc::clone(&schema);
            std::thread::spawn(move || {
                let conn = schema.begin();
                let pid: i32 =
                    conn.query_untyped("SELECT pg_backend_pid()", &[]).unwrap()[0].get(0);
                pid_tx.send(pid).unwrap();
                let inserted = insert(&conn);
                conn.commit().unwrap();
                inserted
            })
        };
        // The second insert waits for the first's lane row.
        let pid = pid_rx.recv().unwrap();
        while !super::events::waits_for_a_lock(&mut watcher, pid) {
            std::thread::yield_now();
        }
        first.commit().unwrap();
        assert_eq!(
            second.join().unwrap(),
            Inserted::Existed,
            "handed: {handed}"
        );
        let head: Option<String> = watcher
            .query_opt("SELECT head FROM reflexr_lanes WHERE lane = 'a'", &[])
            .unwrap()
            .map(|r| r.get(0));
        assert_eq!(head.as_deref(), Some("r1"), "handed: {handed}");
    }
}

/// Invariant 14 (claims match the work) at an idle executor's look: the
/// look in one statement (`work_due_at_once`, PostgreSQL) answers as its
/// reads one after another do — a ready, due run of an action not paused,
/// or a lapsed claim, is work; a paused action's run, or one not due yet,
/// is not.
#[test]
fn an_idle_look_at_once_answers_as_its_reads_in_turn() {
    on_every_backend(|db| {
        let name = db.name();
        setup(db, "shop");
        db.tx(|c| {
            let send = send();
            let both = |now| -> Result<Option<(bool, (bool, bool))>> {
                let at_once = Control::work_due_at_once(c, now, &send)?;
                let paused = Control::paused_names(c, "action")?;
                let open: Vec<&String> = send.iter().filter(|a| !paused.contains(*a)).collect();
                let due = if open.is_empty() {
                    Control::lapsed_due(c, now)?
                } else {
                    Control::work_due(c, now, &open)?
                };
                Ok(at_once.map(|l| (due, l)))
            };
            let Some((due, look)) = both(NOW)? else {
                return Ok(()); // this backend has no such statement
            };
            assert_eq!((due, look), (false, (false, false)), "{name}: nothing");
            Runs::insert(
                c,
                &NewRun {
                    due_at: NOW + 100,
                    ..task("later", None, None)
                },
            )?;
            let (due, look) = both(NOW)?.unwrap();
            assert_eq!((due, look.0), (false, false), "{name}: not due yet");
            let (due, look) = both(NOW + 100)?.unwrap();
            assert_eq!((due, look.0), (true, true), "{name}: due");
            // Another kind's pause of the same name holds nothing back.
            Control::pause(c, "rule", "send", NOW, "op", "maintenance")?;
            let (due, look) = both(NOW + 100)?.unwrap();
            assert_eq!((due, look.0), (true, true), "{name}: a rule paused");
            Control::pause(c, "action", "send", NOW, "op", "maintenance")?;
            let (due, look) = both(NOW + 100)?.unwrap();
            assert_eq!((due, look.0), (false, false), "{name}: paused");
            // A claim that lapsed is work whatever is paused.
            Runs::insert(c, &task("r1", None, None))?;
            Control::claim_fresh(c, "h", NOW, NOW + 10, "r1")?;
            let (due, look) = both(NOW + 100)?.unwrap();
            assert_eq!((due, look.0), (true, true), "{name}: lapsed");
            Ok(())
        })
        .unwrap();
    });
}
