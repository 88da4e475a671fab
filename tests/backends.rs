//! The engine's core on every backend: each test is written once, generic
//! over the backend, and `on_backends!` runs it on an SQLite temp file and
//! — with the feature `postgres` (`cargo test --features postgres`, which
//! `bash .ci/run` runs against a throwaway server) — on PostgreSQL. Each
//! names the DESIGN.md invariant it checks.

use reflexr_testkit as common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::backend::TestBackend;
use common::channels::email_channel;
use common::on_backends;
use common::rules::{
    APP_TYPES, Count, JOB_TYPES, append_rsvps, every_nth, expected, fired, job, on_job,
};
use reflexr::inspect::{Counter, DeadLetterFilter, RunFilter, RunKind};
use reflexr::{
    ActionConfig, ChannelPolicy, Decision, Delivery, Engine, Enqueue, Error, Follow, Job,
    ManualClock, Missed, NewEvent, OnDeadLetter, Pausable, Query, RetryPolicy, Rule, RuleReset,
    RunState, Scope, Start, Unique,
};
use serde_json::{Value, json};

on_backends!(
    an_id_is_appended_once_and_seqs_are_dense,
    a_refused_append_is_a_typed_error_and_the_write_goes_on,
    a_write_cannot_end_the_engines_transaction,
    a_cursor_moves_only_forward_and_saves_with_the_consumers_rows,
    a_lapsed_lease_fences_its_old_holder_out,
    a_wait_wakes_on_another_engines_commit,
    engines_appending_at_once_are_read_once_in_seq_order,
    writers_sharing_a_transaction_fail_alone,
    a_write_that_swallows_a_failed_statement_is_told_what_the_database_holds,
    random_appends_are_typed_errors_or_appends,
    pruning_deletes_only_what_every_cursor_passed_and_the_retention_allows,
    an_enqueue_commits_with_the_callers_rows_and_another_engine_runs_it,
    a_failing_run_is_retried_after_its_backoff_and_dead_lettered_once_spent,
    a_completed_run_commits_its_rows_and_events_with_its_settlement,
    a_scope_runs_in_order_and_higher_priorities_go_first,
    a_unique_key_gives_the_holders_id_while_it_is_pending,
    a_rate_limit_holds_in_every_window_of_its_period,
    a_concurrency_limit_partitioned_by_an_input_field_counts_each_value,
    a_lapsed_claim_is_claimed_again_at_the_next_attempt,
    the_executors_of_four_engines_run_every_run_and_settle_it_once,
    a_stateful_rule_fires_exactly_what_an_independent_fold_predicts,
    a_rule_added_later_catches_up_and_one_starting_at_the_head_does_not,
    a_failing_rule_does_not_hold_back_another,
    only_the_lease_holder_evaluates_and_another_takes_over_when_renewal_stops,
    a_rule_fires_a_run_whose_events_another_rule_decides,
    a_reaction_delivers_once_its_write_commits_and_nothing_when_it_rolls_back,
    a_reaction_skips_unknown_types_and_dead_letters_a_failing_event_then_moves_on,
    the_best_effort_channel_never_retries_and_the_retried_one_gives_up_after_its_policy,
    a_scheduled_occurrence_runs_once_with_two_engines_on_one_database,
    missed_occurrences_run_once_or_are_skipped_as_the_job_says,
    pausing_an_action_rule_or_reaction_stops_it_where_it_stands_until_resumed,
    an_operator_cancels_retries_and_discards_runs_and_their_dead_letters_on_the_record,
    an_operator_replays_a_rule_and_nothing_is_made_twice,
    an_operator_finds_runs_events_and_dead_letters_by_filter_and_acts_on_them_in_bulk,
    the_executors_of_four_engines_never_exceed_a_concurrency_limit,
    a_follower_bridges_a_workspace_into_another_once_by_ids,
    a_worker_whose_claim_lapsed_cannot_complete_once_another_worker_claimed_the_run,
    a_batch_settled_in_one_statement_settles_run_by_run_what_a_lost_claim_refuses,
    one_runs_refused_output_fails_only_that_run_and_the_rest_of_its_batch_settles,
    a_chain_of_rules_stops_at_the_depth_limit_with_a_dead_letter,
    block_holds_the_scope_until_an_operator_unblocks_it,
    continue_lets_the_scope_go_on_after_a_dead_run,
    a_retry_waiting_for_its_backoff_holds_back_only_its_own_scope,
    events_emitted_by_a_run_are_not_duplicated_across_retries,
    a_unique_key_holds_while_pending_while_active_or_for_a_period,
    a_pending_run_cancelled_never_starts_and_a_running_one_is_refused_its_completion,
);

const TYPES: &[&str] = &["thing.made", "thing.gone"];
const START_MS: i64 = 1_800_000_000_000;

fn made(id: &str) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000)
        .payload(&serde_json::json!({ "id": id }))
}

/// A place, its clock, and an engine on it with the workspace `app`.
fn setup<B: TestBackend>() -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let engine = B::open(&place, &clock, "test");
    engine.ensure_workspace("app", TYPES).unwrap();
    B::create_things(&engine);
    (place, clock, engine)
}

fn all<B: TestBackend>(engine: &Engine<B>) -> Vec<reflexr::Event> {
    engine.read(&Query::new("app").limit(10_000)).unwrap()
}

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

/// Invariant 8: a cursor only moves forward, never past the head, and saves in
/// the transaction of the consumer's own rows.
fn a_cursor_moves_only_forward_and_saves_with_the_consumers_rows<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    for i in 0..3 {
        engine.append("app", &made(&i.to_string())).unwrap();
    }
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 0);
    engine
        .write(|tx| {
            B::insert_thing(tx, "mailed-1")?;
            tx.save_cursor("mailer", "app", 1)
        })
        .unwrap();
    let failed: reflexr::Result<()> = engine.write(|tx| {
        B::insert_thing(tx, "mailed-2")?;
        tx.save_cursor("mailer", "app", 2)?;
        Err(Error::Invalid {
            field: "test",
            reason: "the mail server said no".into(),
        })
    });
    assert!(failed.is_err());
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 1);
    assert_eq!(B::things(&engine), ["mailed-1"]);
    engine.save_cursor("mailer", "app", 3).unwrap();
    let back = engine.save_cursor("mailer", "app", 2).unwrap_err();
    assert!(
        matches!(
            back,
            Error::CursorBackwards {
                current: 3,
                requested: 2,
                ..
            }
        ),
        "{back}"
    );
    let ahead = engine.save_cursor("mailer", "app", 4).unwrap_err();
    assert!(
        matches!(ahead, Error::CursorAhead { head: 3, .. }),
        "{ahead}"
    );
    let in_tx = engine.write(|tx| tx.cursor("mailer", "app")).unwrap();
    assert_eq!(in_tx, 3);
    engine.append("app", &made("later")).unwrap();
    let listed = engine.cursors().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].position, listed[0].lag),
        ("mailer", 3, 1)
    );
}

/// Invariant 7: a lease has one live holder; once it lapses another takes it
/// with a new generation, and a write the old holder fences commits nothing.
fn a_lapsed_lease_fences_its_old_holder_out<B: TestBackend>() {
    let (place, clock, a) = setup::<B>();
    let b = B::open(&place, &clock, "other");
    let ttl = Some(Duration::from_secs(30));
    let held = a.acquire_lease("projector", ttl).unwrap();
    assert_eq!(held.generation, 1);
    let e = b.acquire_lease("projector", ttl).unwrap_err();
    assert!(
        matches!(&e, Error::LeaseHeld { holder, .. } if holder == "test"),
        "{e}"
    );
    clock.advance(Duration::from_secs(10));
    let held = a.renew_lease(&held).unwrap();
    clock.advance(Duration::from_secs(31));
    let taken = b.acquire_lease("projector", ttl).unwrap();
    assert_eq!(taken.generation, 2);
    let fenced = a
        .write(|tx| {
            tx.fence(&held)?;
            B::insert_thing(tx, "stale")?;
            tx.append("app", &made("stale"))
        })
        .unwrap_err();
    assert!(
        matches!(fenced, Error::LeaseLost { generation: 1, .. }),
        "{fenced}"
    );
    assert!(B::things(&a).is_empty());
    assert!(all(&a).is_empty());
    assert!(a.renew_lease(&held).is_err());
    assert!(!a.release_lease(&held).unwrap());
    assert!(b.release_lease(&taken).unwrap());
    let leases = a.leases().unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].generation, 2);
}

/// Invariant 1, live: a reader waiting on its watch is woken by a commit of
/// another engine on the same database (another process, as far as either
/// knows) — by a notification (LISTEN/NOTIFY; on SQLite the WAL watch of the
/// default feature `watch`), not by polling: the reader's heartbeat is an hour,
/// so a wake-up that depended on it would fail the minute's wait.
fn a_wait_wakes_on_another_engines_commit<B: TestBackend>() {
    let (place, clock, _engine) = setup::<B>();
    let reader = B::open_with(&place, &clock, "reader", Some(Duration::from_secs(3_600)));
    let writer = B::open(&place, &clock, "writer");
    // Subscribed before the commit, so the commit cannot come first unseen.
    let watch = reader.watch();
    assert!(reader.read(&Query::new("app")).unwrap().is_empty());
    writer.append("app", &made("late")).unwrap();
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(
            watch.wait(Duration::from_secs(60)),
            "no wake-up within a minute"
        );
        got = reader.read(&Query::new("app")).unwrap();
    }
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].subject, "thing/late");
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
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
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

/// PostgreSQL's reader: the application's queries and the engine's reads in a
/// read-only transaction; a write in it is refused by the server and changes
/// nothing (invariant 10).
#[cfg(feature = "postgres")]
#[test]
fn a_reader_on_postgres_reads_and_cannot_write() {
    let (_place, _clock, engine) = setup::<reflexr::Postgres>();
    engine
        .write(|tx| {
            <reflexr::Postgres as TestBackend>::insert_thing(tx, "t-1")?;
            tx.append("app", &made("t-1"))
        })
        .unwrap();
    let (rows, events) = engine
        .with_reader(|tx| {
            let rows: i64 = tx.query("SELECT count(*) FROM things", &[])?[0].get(0);
            Ok((rows, tx.read(&Query::new("app"))?.len()))
        })
        .unwrap();
    assert_eq!((rows, events), (1, 1));
    let e = engine
        .with_reader(|tx| tx.execute("INSERT INTO things (id) VALUES ('t-2')", &[]))
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
    assert_eq!(<reflexr::Postgres as TestBackend>::things(&engine), ["t-1"]);
}

// ----- the work queue --------------------------------------------------------

fn task(n: i64) -> Enqueue {
    Enqueue::new("work", &json!({ "n": n }))
}

/// Registers `work`, recording the `n` of each run it handles, in order.
fn recording<B: TestBackend>(engine: &Engine<B>) -> Arc<std::sync::Mutex<Vec<i64>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    engine
        .register_action("work", move |run, _| {
            let input: Value = run.input()?;
            s.lock().unwrap().push(input["n"].as_i64().unwrap());
            Ok(())
        })
        .unwrap();
    seen
}

/// Invariants 2 and 5 for enqueued work: a run exists if and only if the
/// caller's transaction commits, and any engine on the database that
/// registered its action runs it; bad input is refused and changes nothing
/// (invariant 10).
fn an_enqueue_commits_with_the_callers_rows_and_another_engine_runs_it<B: TestBackend>() {
    let (place, clock, producer) = setup::<B>();
    let failed: reflexr::Result<()> = producer.write(|tx| {
        B::insert_thing(tx, "order-1")?;
        tx.enqueue(&task(1))?;
        Err(Error::Invalid {
            field: "order",
            reason: "out of stock".into(),
        })
    });
    assert!(failed.is_err());
    assert!(producer.runs(None, 10).unwrap().is_empty(), "rolled back");
    assert!(B::things(&producer).is_empty());
    let done = producer
        .write(|tx| {
            B::insert_thing(tx, "order-2")?;
            tx.enqueue(&task(2))
        })
        .unwrap();
    assert!(!done.deduplicated);
    let run = producer.run(&done.id).unwrap().unwrap();
    assert_eq!(run.state, RunState::Ready);
    assert_eq!(
        producer.run_until_idle().unwrap().claimed,
        0,
        "no handler here"
    );

    let consumer = B::open(&place, &clock, "consumer");
    let seen = recording(&consumer);
    assert_eq!(consumer.run_until_idle().unwrap().succeeded, 1);
    assert_eq!(*seen.lock().unwrap(), [2]);
    let run = producer.run(&done.id).unwrap().unwrap();
    assert_eq!((run.state, run.attempt), (RunState::Succeeded, 1));
    assert!(producer.enqueue(&Enqueue::new("", &json!({}))).is_err());
    assert!(
        producer
            .enqueue(&task(3).unique("", Unique::WhilePending))
            .is_err()
    );
    assert_eq!(producer.runs(None, 10).unwrap().len(), 1);
}

/// Invariant 5: a failed attempt is retried once its backoff passes (not
/// before), and a run whose attempts are spent is dead with one dead letter.
fn a_failing_run_is_retried_after_its_backoff_and_dead_lettered_once_spent<B: TestBackend>() {
    let (_place, clock, engine) = setup::<B>();
    let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Arc::clone(&tries);
    engine
        .register_action("work", move |_, _| {
            t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err("the mail server said no".into())
        })
        .unwrap();
    let policy = RetryPolicy::attempts(3).fixed(Duration::from_secs(10));
    let id = engine.enqueue(&task(1).retry(policy)).unwrap().id;
    let idle = engine.run_until_idle().unwrap();
    assert_eq!((idle.claimed, idle.retried), (1, 1));
    assert_eq!(engine.run_until_idle().unwrap().claimed, 0, "not due yet");
    clock.advance(Duration::from_secs(10));
    assert_eq!(engine.run_until_idle().unwrap().retried, 1);
    clock.advance(Duration::from_secs(10));
    assert_eq!(engine.run_until_idle().unwrap().dead, 1);
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        engine.run_until_idle().unwrap().claimed,
        0,
        "dead stays dead"
    );
    assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 3);
    let run = engine.run(&id).unwrap().unwrap();
    assert_eq!((run.state, run.attempt), (RunState::Dead, 3));
    assert_eq!(run.last_error.as_deref(), Some("the mail server said no"));
    let letters = engine.dead_letters(false, 10).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].run_id.as_deref(), Some(id.as_str()));
    assert_eq!(letters[0].attempts, 3);
    let counts: Vec<_> = engine.stats().unwrap().runs.into_iter().collect();
    assert_eq!(counts, [(RunState::Dead, 1)]);
}

/// Invariants 2 and 5: what a handler completes — the application's rows
/// and the events it emitted — commits with the run's settlement, once,
/// with ids derived from the run's; a panic is a failed attempt.
fn a_completed_run_commits_its_rows_and_events_with_its_settlement<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = Arc::clone(&first);
    engine
        .register_action("work", move |run, ctx| {
            if f.swap(false, std::sync::atomic::Ordering::SeqCst) {
                panic!("the first attempt panics");
            }
            let id = run.id.clone();
            ctx.emit_to("app", "made", made(&id))?;
            ctx.complete(|tx| B::insert_thing(tx, &id))?;
            Ok(())
        })
        .unwrap();
    let policy = RetryPolicy::attempts(2).fixed(Duration::ZERO);
    let id = engine.enqueue(&task(1).retry(policy)).unwrap().id;
    let idle = engine.run_until_idle().unwrap();
    assert_eq!((idle.retried, idle.succeeded), (1, 1));
    let run = engine.run(&id).unwrap().unwrap();
    assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
    assert!(run.last_error.unwrap().contains("the first attempt panics"));
    assert_eq!(B::things(&engine), std::slice::from_ref(&id));
    let events = all(&engine);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, format!("{id}/made"));
    assert_eq!(engine.run_until_idle().unwrap().claimed, 0);
}

/// Invariant 6: the runs of one scope run one at a time in the order they
/// were made; between scopes, a higher priority is claimed first.
fn a_scope_runs_in_order_and_higher_priorities_go_first<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    let seen = recording(&engine);
    for n in 1..=4 {
        engine.enqueue(&task(n).scope("cart-7")).unwrap();
    }
    engine.enqueue(&task(100).priority(10)).unwrap();
    engine.enqueue(&task(50).priority(5)).unwrap();
    let idle = engine.run_until_idle().unwrap();
    assert_eq!(idle.succeeded, 6);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(&seen[..2], [100, 50], "priorities first");
    let scoped: Vec<i64> = seen.iter().copied().filter(|n| *n < 50).collect();
    assert_eq!(scoped, [1, 2, 3, 4], "a scope in its order");
}

/// A uniqueness key held while its run is pending: a second enqueue gets
/// the holder's id, marked deduplicated; once the run started, the key is
/// free again.
fn a_unique_key_gives_the_holders_id_while_it_is_pending<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    let seen = recording(&engine);
    let keyed = |n| task(n).unique("rebuild/3", Unique::WhilePending);
    let first = engine.enqueue(&keyed(1)).unwrap();
    let again = engine.enqueue(&keyed(2)).unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.id, first.id);
    engine.run_until_idle().unwrap();
    let later = engine.enqueue(&keyed(3)).unwrap();
    assert!(!later.deduplicated);
    engine.run_until_idle().unwrap();
    assert_eq!(*seen.lock().unwrap(), [1, 3]);
}

/// Control of the work: at most 3 starts in any 1,000 ms, over a long run
/// on a manual clock, counted in the database.
fn a_rate_limit_holds_in_every_window_of_its_period<B: TestBackend>() {
    let (_place, clock, engine) = setup::<B>();
    let seen = recording(&engine);
    engine
        .configure_action(&ActionConfig::new("work").rate(3, Duration::from_millis(1_000)))
        .unwrap();
    assert_eq!(engine.action_configs().unwrap().len(), 1);
    for n in 0..20 {
        engine.enqueue(&task(n)).unwrap();
    }
    for _ in 0..40 {
        engine.run_until_idle().unwrap();
        clock.advance(Duration::from_millis(250));
    }
    assert_eq!(seen.lock().unwrap().len(), 20, "all ran, in time");
    let mut starts: Vec<i64> = engine
        .runs(None, 100)
        .unwrap()
        .iter()
        .map(|r| r.started_at.unwrap())
        .collect();
    starts.sort_unstable();
    for (i, t) in starts.iter().enumerate() {
        let in_window = starts[i..].iter().take_while(|u| **u < t + 1_000).count();
        assert!(
            in_window <= 3,
            "{in_window} starts in the 1,000 ms from {t}"
        );
    }
}

/// Control of the work: a concurrency limit partitioned by an input field
/// lets one run per value start in a claim.
fn a_concurrency_limit_partitioned_by_an_input_field_counts_each_value<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    let seen = recording(&engine);
    engine
        .configure_action(
            &ActionConfig::new("work")
                .max_running(1)
                .partition_by("customer"),
        )
        .unwrap();
    for (n, customer) in [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")] {
        engine
            .enqueue(&Enqueue::new(
                "work",
                &json!({ "n": n, "customer": customer }),
            ))
            .unwrap();
    }
    let idle = engine.run_until_idle().unwrap();
    assert_eq!(idle.succeeded, 5);
    let first_batch: Vec<i64> = seen.lock().unwrap().iter().take(3).copied().collect();
    assert_eq!(first_batch, [1, 3, 5], "a, b, c: one each, then the rest");
}

/// Invariant 5: a claim whose executor stopped renewing it (forged here: a
/// holder that is gone) lapses with the lease TTL, and the run is claimed
/// again at its next attempt; until then nobody else takes it.
fn a_lapsed_claim_is_claimed_again_at_the_next_attempt<B: TestBackend>() {
    let (_place, clock, engine) = setup::<B>();
    let seen = recording(&engine);
    let id = engine.enqueue(&task(1)).unwrap().id;
    let now = engine.now_ms();
    engine
        .write(|tx| {
            B::run_sql(
                tx,
                &format!(
                    "UPDATE reflexr_runs SET state = 'running', attempt = 1, \
                       claimed_by = 'gone', claim_expires_at = {}, started_at = {now} \
                     WHERE id = '{id}'",
                    now + 1_000
                ),
            )
        })
        .unwrap();
    assert_eq!(engine.run_until_idle().unwrap().claimed, 0, "still held");
    clock.advance(Duration::from_millis(1_000));
    assert_eq!(engine.run_until_idle().unwrap().succeeded, 1);
    assert_eq!(*seen.lock().unwrap(), [1]);
    let run = engine.run(&id).unwrap().unwrap();
    assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
}

/// Invariant 5 across engines: the executor threads of four engines on one
/// database claim from one queue; every run is handled and its completion
/// (the application's row, with the settlement) commits exactly once.
fn the_executors_of_four_engines_run_every_run_and_settle_it_once<B: TestBackend>() {
    let (place, clock, first) = setup::<B>();
    let engines: Vec<Engine<B>> = (0..4)
        .map(|i| B::open(&place, &clock, &format!("executor-{i}")))
        .collect();
    for e in &engines {
        e.register_action("work", move |run, ctx| {
            let id = run.id.clone();
            ctx.complete(|tx| B::insert_thing(tx, &id))?;
            Ok(())
        })
        .unwrap();
        e.start().unwrap();
    }
    let ids: Vec<String> = (0..200)
        .map(|n| first.enqueue(&task(n)).unwrap().id)
        .collect();
    for id in &ids {
        let run = first.wait_for_run(id, Duration::from_secs(120)).unwrap();
        assert_eq!(run.state, RunState::Succeeded, "{id}");
    }
    for e in &engines {
        e.shutdown();
    }
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(B::things(&first), expected, "each completed once");
}

// ----- rules -----------------------------------------------------------------

/// An engine on the place with the workspace `app` of the rule tests and a
/// no-op `noop` action.
fn rules_engine<B: TestBackend>(place: &B::Place, clock: &ManualClock, holder: &str) -> Engine<B> {
    let e = B::open(place, clock, holder);
    e.ensure_workspace("app", APP_TYPES).unwrap();
    e.register_action("noop", |_, _| Ok(())).unwrap();
    e
}

/// Invariant 4: a stateful rule fires exactly what an independent fold
/// over the log predicts, its state per scope saved with its cursor, and
/// each firing's id is its run's.
fn a_stateful_rule_fires_exactly_what_an_independent_fold_predicts<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("tenth", 10)).unwrap();
    append_rsvps(&e, 3, 35);
    let idle = e.run_until_idle().unwrap();
    assert_eq!(idle.decided, 105);
    assert_eq!(idle.fired, 9);
    assert_eq!(idle.succeeded, 9, "every firing's run ran");
    assert_eq!(fired(&e), expected(&e, "tenth", 10));
    assert_eq!(
        e.rule_state::<Count>("tenth", "1").unwrap(),
        Some(Count { n: 35 })
    );
    let runs = e.runs(None, 100).unwrap();
    assert_eq!(runs.len(), 9);
    for ev in e.read(&Query::new("app").types(["RuleFired"])).unwrap() {
        let p: Value = ev.payload().unwrap();
        let id = p["firing_id"].as_str().unwrap();
        assert_eq!(ev.id, format!("{id}:fired"));
        assert!(runs.iter().any(|r| r.id == id));
    }
    assert_eq!(e.run_until_idle().unwrap().decided, 0, "nothing twice");
    let rules = e.rules().unwrap();
    assert_eq!((rules.len(), rules[0].lag), (1, 0));
}

/// Invariant 8: a rule registered later starts at the beginning and
/// catches up; one that starts at the head decides only what comes after.
fn a_rule_added_later_catches_up_and_one_starting_at_the_head_does_not<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("early", 10)).unwrap();
    append_rsvps(&e, 2, 20);
    e.run_until_idle().unwrap();
    drop(e);

    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("early", 10)).unwrap();
    e.register_rule(every_nth("late", 10)).unwrap();
    e.register_rule(every_nth("from-now", 10).start(Start::Head))
        .unwrap();
    append_rsvps(&e, 2, 10);
    e.run_until_idle().unwrap();
    let f = fired(&e);
    let of = |rule: &str| f.keys().filter(|(r, _)| r == rule).count();
    assert_eq!(of("early"), 6);
    assert_eq!(of("late"), 6, "caught up on all 60 events");
    assert_eq!(of("from-now"), 2, "only the 20 events after it");
}

/// Errors are contained per rule: a decision that fails or panics, or an
/// event without a scope, is a `RuleErrored` event and a dead letter, and
/// the rule moves on; the other rules are not held back.
fn a_failing_rule_does_not_hold_back_another<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("healthy", 5)).unwrap();
    e.register_rule(
        Rule::new("broken", "app")
            .on(["rsvp"])
            .scope(Scope::payload("session"))
            .action("noop")
            .decide(|ev| {
                let p: Value = ev.payload()?;
                match p["guest"].as_u64().unwrap() % 3 {
                    0 => Err("the guest list is unreachable".into()),
                    1 => panic!("a bug in the rule"),
                    _ => Ok(Decision::Skip),
                }
            }),
    )
    .unwrap();
    e.register_rule(
        Rule::new("scopeless", "app")
            .on(["rsvp"])
            .scope(Scope::payload("no_such_field"))
            .action("noop")
            .decide(|_| Ok(Decision::Skip)),
    )
    .unwrap();
    append_rsvps(&e, 1, 9);
    let idle = e.run_until_idle().unwrap();
    assert_eq!(idle.fired, 1, "the healthy rule fired on its 5th event");
    assert_eq!(idle.errored, 6 + 9);
    let letters = e.dead_letters(false, 100).unwrap();
    let reasons = |consumer: &str| {
        let mut v: Vec<String> = letters
            .iter()
            .filter(|d| d.consumer == consumer)
            .map(|d| d.reason.to_string())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(reasons("broken"), ["decision_error", "decision_panic"]);
    assert_eq!(reasons("scopeless"), ["missing_scope"]);
    let errored = e.read(&Query::new("app").types(["RuleErrored"])).unwrap();
    assert_eq!(errored.len(), 15);
    for rule in e.rules().unwrap() {
        assert_eq!(rule.lag, 0, "{} moved on", rule.name);
    }
    // Decided again (nothing new): no error recorded twice.
    assert_eq!(e.run_until_idle().unwrap().errored, 0);
    assert_eq!(e.dead_letters(false, 100).unwrap().len(), letters.len());
}

/// Invariants 7 (fencing) and 4 (exactly once) across two engines: only
/// the holder of the workspace's evaluator lease decides; when it stops
/// renewing, the other takes over at the next generation, and the one that
/// comes back decides nothing.
fn only_the_lease_holder_evaluates_and_another_takes_over_when_renewal_stops<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let a = rules_engine::<B>(&place, &clock, "engine-a");
    let b = rules_engine::<B>(&place, &clock, "engine-b");
    for e in [&a, &b] {
        e.register_rule(every_nth("tenth", 10)).unwrap();
    }
    append_rsvps(&a, 1, 10);
    assert_eq!(a.run_until_idle().unwrap().fired, 1);
    append_rsvps(&a, 1, 10);
    assert_eq!(
        b.run_until_idle().unwrap().decided,
        0,
        "b does not hold the lease"
    );
    assert_eq!(a.run_until_idle().unwrap().fired, 1);
    append_rsvps(&a, 1, 10);
    clock.advance(Duration::from_secs(31));
    let idle = b.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.fired), (10, 1));
    let lease = b
        .leases()
        .unwrap()
        .into_iter()
        .find(|l| l.name == "evaluator/app")
        .unwrap();
    assert_eq!((lease.holder.as_str(), lease.generation), ("engine-b", 2));
    append_rsvps(&a, 1, 10);
    assert_eq!(a.run_until_idle().unwrap().decided, 0);
    assert_eq!(b.run_until_idle().unwrap().fired, 1);
    assert_eq!(fired(&a), expected(&a, "tenth", 10));
}

/// The loop of the design: an event fires a rule; its run emits an event
/// (its id derived from the run's, its causation the firing event); a
/// second rule decides that one and fires a run of its own — all from one
/// drain, each exactly once.
fn a_rule_fires_a_run_whose_events_another_rule_decides<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    e.register_action("make-gone", |run, ctx| {
        let p: Value = run.input()?;
        let id = p["id"].as_str().unwrap().to_string();
        ctx.emit(
            "gone",
            NewEvent::new("thing.gone", format!("thing/{id}"), "mover", 2_000),
        )?;
        Ok(())
    })
    .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    e.register_action("note", move |run, _| {
        s.lock().unwrap().push(run.event_id.clone().unwrap());
        Ok(())
    })
    .unwrap();
    e.register_rule(
        Rule::new("mover", "app")
            .on(["thing.made"])
            .action("make-gone")
            .decide(|ev| Ok(Decision::fire(&ev.payload::<Value>()?))),
    )
    .unwrap();
    e.register_rule(
        Rule::new("noter", "app")
            .on(["thing.gone"])
            .action("note")
            .decide(|_| Ok(Decision::fire(&json!({})))),
    )
    .unwrap();
    e.append("app", &made("t-1")).unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.fired, idle.succeeded), (2, 2));
    let gone = e.read(&Query::new("app").types(["thing.gone"])).unwrap();
    assert_eq!(gone.len(), 1);
    assert!(gone[0].id.ends_with("/gone"));
    assert_eq!(*seen.lock().unwrap(), [gone[0].id.clone()]);
    assert_eq!(e.run_until_idle().unwrap().fired, 0);
}

// ----- the jobs loop: reactions, deliveries, scheduled jobs ------------------

const MINUTE: Duration = Duration::from_secs(60);

/// A thing made, with who is told of it.
fn made_for(id: &str, emails: &[&str]) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000)
        .payload(&json!({ "id": id, "tell": emails }))
}

/// Invariants 2 and 5 through the loop: a reaction enqueues one delivery
/// per recipient in the transaction that moves its cursor; the channel
/// sends each, all in one drain. A write that rolls back leaves no event,
/// so nothing is sent for it.
fn a_reaction_delivers_once_its_write_commits_and_nothing_when_it_rolls_back<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    let sent = email_channel(&e, ChannelPolicy::Retried(RetryPolicy::default()));
    e.register_reaction(
        B::reaction("notifier", "app")
            .on(["thing.made"])
            .handle(|event, tx| {
                let p: Value = event.payload()?;
                for to in p["tell"].as_array().unwrap() {
                    let to = to.as_str().unwrap();
                    tx.deliver(&Delivery::new("email", "made").to(to).caused_by(event))?;
                }
                Ok(())
            }),
    )
    .unwrap();
    let failed: reflexr::Result<()> = e.write(|tx| {
        B::insert_thing(tx, "t-0")?;
        tx.append("app", &made_for("t-0", &["nobody@x"]))?;
        Err(Error::Invalid {
            field: "thing",
            reason: "refused".into(),
        })
    });
    assert!(failed.is_err());
    e.write(|tx| {
        B::insert_thing(tx, "t-1")?;
        tx.append("app", &made_for("t-1", &["ada@x", "grace@x", "alan@x"]))
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.reacted, idle.succeeded), (1, 3));
    let mut sent = sent.lock().unwrap().clone();
    sent.sort();
    assert_eq!(sent, ["ada@x", "alan@x", "grace@x"]);
    let deliveries = e.runs(None, 10).unwrap();
    assert!(
        deliveries
            .iter()
            .all(|r| r.kind == RunKind::Delivery && r.event_seq == Some(1))
    );
    assert_eq!(e.run_until_idle().unwrap().reacted, 0, "handled once");
}

/// A reaction handles only its types; an event whose handler fails or
/// panics is dead-lettered with its writes rolled back (the deliveries it
/// enqueued too), and the reaction moves on.
fn a_reaction_skips_unknown_types_and_dead_letters_a_failing_event_then_moves_on<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    email_channel(&e, ChannelPolicy::BestEffort);
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = Arc::clone(&handled);
    e.register_reaction(
        B::reaction("picky", "app")
            .on(["thing.made"])
            .handle(move |event, tx| {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tx.deliver(&Delivery::new("email", "x").caused_by(event))?;
                let p: Value = event.payload()?;
                match p["id"].as_str() {
                    Some("bad") => Err("no such thing".into()),
                    Some("worse") => panic!("a bug in the reaction"),
                    _ => Ok(()),
                }
            }),
    )
    .unwrap();
    for id in ["b", "bad", "c", "worse", "d"] {
        e.append("app", &made(id)).unwrap();
        e.append(
            "app",
            &NewEvent::new("thing.gone", format!("thing/{id}"), "t", 0),
        )
        .unwrap();
    }
    e.run_until_idle().unwrap();
    let handled = handled.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(handled, 5, "only its own type");
    assert_eq!(
        e.runs(None, 10).unwrap().len(),
        3,
        "the failed ones' rolled back"
    );
    let letters = e.dead_letters(false, 10).unwrap();
    let mut reasons: Vec<(&str, &str)> = letters
        .iter()
        .map(|d| (d.kind.as_str(), d.reason.as_str()))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [("reaction", "handler_error"), ("reaction", "handler_panic")]
    );
    assert_eq!(letters[0].event_seq, Some(3));
    assert_eq!(e.cursors().unwrap()[0].lag, 0);
}

/// Invariant 5 per channel: a best-effort channel sends once; a retried one
/// as its policy says, then dead-letters; a channel this engine did not
/// register is refused.
fn the_best_effort_channel_never_retries_and_the_retried_one_gives_up_after_its_policy<
    B: TestBackend,
>() {
    let (_place, clock, e) = setup::<B>();
    let tries = Arc::new(std::sync::Mutex::new(Vec::new()));
    for (channel, policy) in [
        ("push", ChannelPolicy::BestEffort),
        (
            "email",
            ChannelPolicy::Retried(RetryPolicy::attempts(3).fixed(MINUTE)),
        ),
    ] {
        let t = Arc::clone(&tries);
        e.register_channel(channel, policy, move |msg, _| {
            t.lock().unwrap().push((msg.channel.clone(), msg.attempt));
            Err("the service is down".into())
        })
        .unwrap();
    }
    e.deliver(&Delivery::new("push", "ping").to("device-1"))
        .unwrap();
    e.deliver(&Delivery::new("email", "ping").to("ada@x"))
        .unwrap();
    for _ in 0..5 {
        e.run_until_idle().unwrap();
        clock.advance(MINUTE);
    }
    let tries = tries.lock().unwrap();
    let of = |c: &str| tries.iter().filter(|(ch, _)| ch == c).count();
    assert_eq!(of("push"), 1, "best effort: once");
    assert_eq!(of("email"), 3, "retried: as its policy says, then given up");
    let runs = e.runs(None, 10).unwrap();
    assert!(runs.iter().all(|r| r.state == RunState::Dead));
    let letters = e.dead_letters(false, 10).unwrap();
    assert_eq!(letters.len(), 2);
    assert!(letters.iter().all(|d| d.error == "the service is down"));
    let err = e.deliver(&Delivery::new("fax", "ping")).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

fn counting_job<B: TestBackend>(
    name: &str,
    every: Duration,
    runs: &Arc<std::sync::atomic::AtomicUsize>,
) -> Job<B> {
    let r = Arc::clone(runs);
    B::job(Job::every(name, every)).handler(move |_, _| {
        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
}

/// Invariant 5 for scheduled work: each due occurrence runs once, whatever
/// the number of engines: the loop lease keeps one scheduler at a time, and
/// the occurrence's id (`<job>@<due>`) keeps a second from making it again.
fn a_scheduled_occurrence_runs_once_with_two_engines_on_one_database<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let a = B::open(&place, &clock, "engine-a");
    let b = B::open(&place, &clock, "engine-b");
    let every = Duration::from_secs(20);
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = || runs.load(std::sync::atomic::Ordering::SeqCst);
    a.register_job(counting_job::<B>("reminders", every, &runs))
        .unwrap();
    b.register_job(counting_job::<B>("reminders", every, &runs))
        .unwrap();
    a.run_until_idle().unwrap(); // a takes the loop lease (30 s)
    assert_eq!(count(), 0, "first due an interval after registering");
    clock.advance(every);
    b.run_until_idle().unwrap();
    assert_eq!(count(), 0, "b cannot schedule while a holds the loop");
    a.run_until_idle().unwrap();
    b.run_until_idle().unwrap();
    assert_eq!(count(), 1);
    clock.advance(Duration::from_secs(31));
    b.run_until_idle().unwrap();
    a.run_until_idle().unwrap();
    assert_eq!(count(), 2);
    let ids: Vec<String> = a
        .runs(None, 10)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        ids,
        [
            format!("reminders@{}", START_MS + 20_000),
            format!("reminders@{}", START_MS + 40_000)
        ]
    );
    assert_eq!(
        a.schedules().unwrap()[0].next_due_at,
        Some(START_MS + 60_000)
    );
}

/// Occurrences missed while no loop ran: one run for them all, or none, as
/// the job says; then both carry on.
fn missed_occurrences_run_once_or_are_skipped_as_the_job_says<B: TestBackend>() {
    let (_place, clock, e) = setup::<B>();
    let once = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let skip = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = |c: &Arc<std::sync::atomic::AtomicUsize>| c.load(std::sync::atomic::Ordering::SeqCst);
    e.register_job(counting_job::<B>("catch-up", MINUTE, &once).missed(Missed::RunOnce))
        .unwrap();
    e.register_job(counting_job::<B>("skip", MINUTE, &skip).missed(Missed::Skip))
        .unwrap();
    clock.advance(MINUTE * 60);
    e.run_until_idle().unwrap();
    assert_eq!(n(&once), 1, "one run for 60 missed");
    assert_eq!(n(&skip), 0, "skipped");
    let catch_up = &e.runs(None, 10).unwrap()[0];
    let input: Value = serde_json::from_str(&catch_up.input).unwrap();
    assert_eq!(input["missed"], 59);
    clock.advance(MINUTE);
    e.run_until_idle().unwrap();
    assert_eq!((n(&once), n(&skip)), (2, 1));
}

// ----- operators and stats ---------------------------------------------------

/// Control of the work: a paused action, rule or reaction stops where it
/// stands (a run is not claimed, an event not decided or handled, its cursor
/// stays) until resumed, in every engine on the database; each pause and
/// resume is on the record.
fn pausing_an_action_rule_or_reaction_stops_it_where_it_stands_until_resumed<B: TestBackend>() {
    let (_place, _clock, e) = setup::<B>();
    let seen = recording(&e);
    let reacted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = Arc::clone(&reacted);
    e.register_reaction(
        B::reaction("counter", "app")
            .on(["thing.made"])
            .handle(move |_, _| {
                r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }),
    )
    .unwrap();
    e.register_rule(
        Rule::new("fire", "app")
            .on(["thing.made"])
            .action("work")
            .decide(|_| Ok(Decision::fire(&json!({ "n": 2 })))),
    )
    .unwrap();
    let ops = e.operator("ops", "maintenance").unwrap();
    assert!(ops.pause(&Pausable::Action("work".into())).unwrap());
    assert!(
        !ops.pause(&Pausable::Action("work".into())).unwrap(),
        "paused already"
    );
    ops.pause(&Pausable::Rule("fire".into())).unwrap();
    ops.pause(&Pausable::Reaction("counter".into())).unwrap();
    e.enqueue(&task(1)).unwrap();
    e.append("app", &made("t-1")).unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.claimed, idle.decided, idle.reacted), (0, 0, 0));
    assert_eq!(e.paused().unwrap().len(), 3);
    ops.resume(&Pausable::Rule("fire".into())).unwrap();
    ops.resume(&Pausable::Reaction("counter".into())).unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.decided, idle.claimed), (1, 0), "work still paused");
    assert_eq!(reacted.load(std::sync::atomic::Ordering::SeqCst), 1);
    ops.resume(&Pausable::Action("work".into())).unwrap();
    assert_eq!(e.run_until_idle().unwrap().succeeded, 2);
    let mut ns = seen.lock().unwrap().clone();
    ns.sort_unstable();
    assert_eq!(ns, [1, 2]);
    let e2 = ops.resume(&Pausable::Rule("fire".into())).unwrap_err();
    assert!(e2.is_not_found(), "{e2}");
    let actions: Vec<String> = e
        .audit_log(20)
        .unwrap()
        .iter()
        .map(|a| a.action.to_string())
        .collect();
    assert_eq!(actions.iter().filter(|a| *a == "pause").count(), 3);
    assert_eq!(actions.iter().filter(|a| *a == "resume").count(), 3);
}

/// Operators' interventions on runs, each checked and audited: a pending
/// run cancelled never starts; a dead run retried gets fresh attempts and
/// its dead letter is resolved as retried; another discarded, its dead
/// letter with it; what cannot be done is a typed error. The stats count
/// what happened.
fn an_operator_cancels_retries_and_discards_runs_and_their_dead_letters_on_the_record<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = Arc::clone(&fail);
    e.register_action("work", move |_, _| {
        if f.load(std::sync::atomic::Ordering::SeqCst) {
            Err("down".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    let once = RetryPolicy::attempts(1);
    let a = e.enqueue(&task(1).retry(once)).unwrap().id;
    let b = e.enqueue(&task(2).retry(once)).unwrap().id;
    let c = e.enqueue(&task(3).at(START_MS + 3_600_000)).unwrap().id;
    let ops = e.operator("ops", "cleaning up").unwrap();
    assert_eq!(ops.cancel_run(&c).unwrap(), RunState::Ready);
    assert_eq!(e.run_until_idle().unwrap().dead, 2);
    assert_eq!(e.dead_letters(false, 10).unwrap().len(), 2);
    let conflict = ops.cancel_run(&a).unwrap_err();
    assert!(matches!(conflict, Error::Conflict { .. }), "{conflict}");
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    ops.retry_run(&a).unwrap();
    let letter_b = e.dead_letters(false, 10).unwrap()[0].id;
    ops.discard_dead_letter(letter_b).unwrap();
    assert_eq!(e.run_until_idle().unwrap().succeeded, 1);
    let state = |id: &str| e.run(id).unwrap().unwrap().state;
    assert_eq!(
        (state(&a), state(&b), state(&c)),
        (
            RunState::Succeeded,
            RunState::Discarded,
            RunState::Cancelled
        )
    );
    assert!(
        e.dead_letters(false, 10).unwrap().is_empty(),
        "both resolved"
    );
    let resolved = e.dead_letters(true, 10).unwrap();
    let mut how: Vec<String> = resolved
        .iter()
        .map(|d| d.resolution.unwrap().to_string())
        .collect();
    how.sort();
    assert_eq!(how, ["discarded", "retried"]);
    assert!(ops.retry_run(&a).is_err(), "only a dead run is retried");
    assert!(ops.retry_run("nope").unwrap_err().is_not_found());
    let stats = e.stats().unwrap();
    assert_eq!(stats.counter(Counter::RunsDead), 2);
    assert_eq!(stats.counter(Counter::RunsSucceeded), 1);
    assert_eq!(stats.runs.get(&RunState::Succeeded), Some(&1));
    assert!(stats.dead_letters.is_empty());
    let actions: Vec<String> = e
        .audit_log(10)
        .unwrap()
        .iter()
        .map(|a| a.action.to_string())
        .collect();
    assert_eq!(actions.len(), 3, "{actions:?}");
}

/// Invariants 4 and 8: an operator replays a rule from zero (its cursor
/// back, its state cleared, on the record); the replay derives the same
/// firing ids, so nothing is made twice.
fn an_operator_replays_a_rule_and_nothing_is_made_twice<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = rules_engine::<B>(&place, &clock, "test");
    e.register_rule(every_nth("tenth", 10)).unwrap();
    append_rsvps(&e, 2, 20);
    assert_eq!(e.run_until_idle().unwrap().fired, 4);
    let before = fired(&e);
    e.operator("ops", "replay after a fix")
        .unwrap()
        .reset_rule("tenth", RuleReset::Replay(0))
        .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!(
        (idle.decided, idle.fired),
        (40, 0),
        "decided again, made once"
    );
    assert_eq!(fired(&e), before);
    assert_eq!(e.runs(None, 100).unwrap().len(), 4);
    assert_eq!(e.stats().unwrap().counter(Counter::ReplayExisting), 4);
    assert_eq!(e.audit_log(5).unwrap()[0].action.to_string(), "reset_rule");
}

/// The operators' view on every backend: events by subject, runs by state,
/// action and input, a run with the event that fired it and what it
/// emitted, the scopes blocked behind a dead run, dead letters by filter,
/// the feeds of changes; and a bulk retry of what a filter matched, which
/// unblocks nothing by itself (the dead run's scope goes on once it
/// succeeds).
fn an_operator_finds_runs_events_and_dead_letters_by_filter_and_acts_on_them_in_bulk<
    B: TestBackend,
>() {
    let (_place, _clock, e) = setup::<B>();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = Arc::clone(&fail);
    e.register_action("ship", move |run, ctx| {
        if f.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("the carrier is down".into());
        }
        let p: Value = run.input()?;
        let id = p["id"].as_str().unwrap().to_string();
        ctx.emit(
            "shipped",
            NewEvent::new("thing.gone", format!("thing/{id}"), "shipper", 3_000),
        )?;
        Ok(())
    })
    .unwrap();
    e.register_rule(
        Rule::new("shipper", "app")
            .on(["thing.made"])
            .scope(Scope::payload("id"))
            .action("ship")
            .retry(RetryPolicy::attempts(1))
            .on_dead_letter(OnDeadLetter::Block)
            .decide(|ev| Ok(Decision::fire(&ev.payload::<Value>()?))),
    )
    .unwrap();
    for id in ["a", "b", "c"] {
        e.append("app", &made(id)).unwrap();
    }
    e.append("app", &made("a")).unwrap(); // a second of scope a, behind its first
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.fired, idle.dead), (4, 3));

    let page = e
        .events_page(&Query::new("app").subject("thing/b"))
        .unwrap();
    let types: Vec<&str> = page.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["thing.made", "RuleFired"]);
    let dead = e
        .find_runs(&RunFilter::new().state(RunState::Dead).action("ship"))
        .unwrap();
    assert_eq!(dead.runs.len(), 3);
    let of_b = e
        .find_runs(&RunFilter::new().input("id", json!("b")))
        .unwrap();
    assert_eq!(of_b.runs.len(), 1);
    let detail = e.run_detail(&of_b.runs[0].id).unwrap().unwrap();
    assert_eq!(detail.event.unwrap().subject, "thing/b");
    assert!(detail.emitted.is_empty());
    let blocked = e.blocked_lanes(10).unwrap();
    let mut scopes: Vec<String> = blocked.iter().map(|b| b.scope.clone()).collect();
    scopes.sort();
    assert_eq!(scopes, ["a", "b", "c"]);
    let letters = e
        .find_dead_letters(&DeadLetterFilter::new().consumer("shipper"))
        .unwrap();
    assert_eq!(letters.dead_letters.len(), 3);
    let mut feed = reflexr::inspect::RunsFeed::<B>::since(0);
    assert_eq!(e.runs_feed(&mut feed, 100).unwrap().len(), 4);
    assert_eq!(e.dead_letters_after(0, 100).unwrap().len(), 3);

    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let matches = e
        .operator("ops", "a dry run")
        .unwrap()
        .matching_dead_runs(&RunFilter::new(), 10)
        .unwrap();
    assert_eq!((matches.ids.len(), matches.more), (3, false));
    let ops = e.operator("ops", "the carrier is back").unwrap();
    let mut ids = matches.ids.clone();
    ids.push("no-such-run".into());
    let bulk = ops.retry_runs(&ids).unwrap();
    assert_eq!((bulk.done.len(), bulk.skipped.len()), (3, 1));
    let idle = e.run_until_idle().unwrap();
    assert_eq!(idle.succeeded, 4, "the three, then scope a's second");
    let detail = e.run_detail(&of_b.runs[0].id).unwrap().unwrap();
    assert_eq!(detail.emitted.len(), 1, "what it emitted, by its id");
    assert!(e.blocked_lanes(10).unwrap().is_empty());
    assert!(
        e.find_dead_letters(&DeadLetterFilter::new())
            .unwrap()
            .dead_letters
            .is_empty()
    );
}

/// Control of the work across engines: the executor threads of four
/// engines (each claiming in transactions of its own) never run more of a
/// limited action at once than its `max_running`, counted in the database.
fn the_executors_of_four_engines_never_exceed_a_concurrency_limit<B: TestBackend>() {
    let (place, clock, first) = setup::<B>();
    first
        .configure_action(&ActionConfig::new("work").max_running(2))
        .unwrap();
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let engines: Vec<Engine<B>> = (0..4)
        .map(|i| B::open(&place, &clock, &format!("executor-{i}")))
        .collect();
    for e in &engines {
        let (r, m) = (Arc::clone(&running), Arc::clone(&most));
        e.register_action("work", move |_, _| {
            let now = r.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            m.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(500));
            r.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        e.start().unwrap();
    }
    let ids: Vec<String> = first
        .write(|tx| (0..200).map(|n| Ok(tx.enqueue(&task(n))?.id)).collect())
        .unwrap();
    for id in &ids {
        let run = first.wait_for_run(id, Duration::from_secs(120)).unwrap();
        assert_eq!(run.state, RunState::Succeeded, "{id}");
    }
    for e in &engines {
        e.shutdown();
    }
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!((1..=2).contains(&most), "{most} ran at once");
}

/// Followers: a workspace bridged into another of the same database with
/// the same ids, exactly once (invariant 3), across a second engine taking
/// over; a projection that fails dead-letters its envelope and the
/// follower moves on; an operator's restart and unfollow are on the record.
fn a_follower_bridges_a_workspace_into_another_once_by_ids<B: TestBackend>() {
    let (place, clock, e) = setup::<B>();
    e.ensure_workspace("mirror", TYPES).unwrap();
    e.register_projection("picky", |ev: &reflexr::Event| {
        if ev.subject == "thing/bad" {
            return Err("cannot project it".into());
        }
        Ok(Some(reflexr::inspect::same_event(ev)))
    })
    .unwrap();
    let name = e
        .follow(Follow::new("app", "mirror").projection("picky"))
        .unwrap();
    for id in ["a", "bad", "b"] {
        e.append("app", &made(id)).unwrap();
    }
    assert_eq!(e.run_until_idle().unwrap().followed, 3);
    let mirrored = e.read(&Query::new("mirror")).unwrap();
    let source = e.read(&Query::new("app")).unwrap();
    let ids = |v: &[reflexr::Event]| v.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&mirrored), [source[0].id.clone(), source[2].id.clone()]);
    let letters = e.dead_letters(false, 10).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason.as_str(), "projection_error");
    // Another engine with the projection takes over once the lease lapses,
    // from the cursor: nothing twice.
    e.append("app", &made("c")).unwrap();
    let other = B::open(&place, &clock, "other");
    other
        .register_projection("picky", |ev: &reflexr::Event| {
            Ok(Some(reflexr::inspect::same_event(ev)))
        })
        .unwrap();
    clock.advance(Duration::from_secs(31));
    assert_eq!(other.run_until_idle().unwrap().followed, 1);
    assert_eq!(e.read(&Query::new("mirror")).unwrap().len(), 3);
    let info = &other.followers().unwrap()[0];
    assert_eq!((info.published, info.dead_letters, info.lag), (3, 1, 0));
    let ops = other.operator("ops", "done with it").unwrap();
    ops.restart_follower(&name).unwrap();
    ops.unfollow(&name).unwrap();
    assert!(other.followers().unwrap().is_empty());
    assert!(ops.unfollow(&name).unwrap_err().is_not_found());
}

/// Invariants 5 and 7: a completion checks the claim's holder and attempt.
/// A worker paused in its handler past its claim's lease loses the run to
/// another, which completes it; the first one's completion (its row with
/// the settlement) is refused and leaves nothing.
fn a_worker_whose_claim_lapsed_cannot_complete_once_another_worker_claimed_the_run<
    B: TestBackend,
>() {
    let (place, clock, a) = setup::<B>();
    let b = B::open(&place, &clock, "worker-b");
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let go = std::sync::Mutex::new(go);
    a.register_action("work", move |run, ctx| {
        started_tx.send(()).unwrap();
        go.lock().unwrap().recv().unwrap(); // paused past its lease
        let id = format!("{}:a", run.id);
        ctx.complete(|tx| B::insert_thing(tx, &id))?;
        Ok(())
    })
    .unwrap();
    b.register_action("work", |run, ctx| {
        let id = format!("{}:b", run.id);
        ctx.complete(|tx| B::insert_thing(tx, &id))?;
        Ok(())
    })
    .unwrap();
    let id = a
        .enqueue(&task(1).retry(RetryPolicy::attempts(5)))
        .unwrap()
        .id;
    let worker_a = {
        let a = a.clone();
        std::thread::spawn(move || a.run_until_idle())
    };
    started.recv().unwrap();
    clock.advance(Duration::from_secs(31));
    let idle = b.run_until_idle().unwrap();
    assert_eq!((idle.claimed, idle.succeeded), (1, 1));
    go_tx.send(()).unwrap();
    let idle_a = worker_a.join().unwrap().unwrap();
    assert_eq!(idle_a.succeeded, 0, "a's completion was refused");
    let run = b.run(&id).unwrap().unwrap();
    assert_eq!((run.state, run.attempt), (RunState::Succeeded, 2));
    assert_eq!(B::things(&b), [format!("{id}:b")]);
}

/// Invariants 5 and 7: plain successes settle in one statement that checks
/// every claim; one taken by another holder meanwhile is refused (and
/// settled by nobody here), the others succeed.
fn a_batch_settled_in_one_statement_settles_run_by_run_what_a_lost_claim_refuses<B: TestBackend>() {
    let (place, clock, e) = setup::<B>();
    let ids: Vec<String> = (0..3).map(|n| e.enqueue(&task(n)).unwrap().id).collect();
    let thief = B::open(&place, &clock, "thief");
    let victim = ids[0].clone();
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = Arc::clone(&handled);
    e.register_action("work", move |_, _| {
        if h.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 3 {
            thief.write(|tx| {
                B::run_sql(
                    tx,
                    &format!(
                        "UPDATE reflexr_runs SET claimed_by = 'someone-else' WHERE id = '{victim}'"
                    ),
                )
            })?;
        }
        Ok(())
    })
    .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!(
        handled.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "one batch"
    );
    assert_eq!((idle.claimed, idle.succeeded), (3, 2));
    let run = |id: &str| e.run(id).unwrap().unwrap();
    assert_eq!(
        run(&ids[0]).state,
        RunState::Running,
        "the lost claim settled nothing"
    );
    assert_eq!(run(&ids[0]).claimed_by.as_deref(), Some("someone-else"));
    for id in &ids[1..] {
        assert_eq!(run(id).state, RunState::Succeeded, "{id}");
    }
}

/// Invariant 5, contained: runs claimed in one batch whose outputs the log
/// refuses (an unregistered type, a payload over the limit, an id over the
/// limit), whose completion fails in the application's statement (which
/// on PostgreSQL aborts that write's transaction), or whose checkpoint is
/// too large, each fail their own attempt with the reason; the run that
/// did its job succeeds with its event, and the executor goes on.
fn one_runs_refused_output_fails_only_that_run_and_the_rest_of_its_batch_settles<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = B::open_limited(&place, &clock, 64 * 1024, 8);
    e.ensure_workspace("app", TYPES).unwrap();
    e.register_action("work", |run, ctx| {
        let input: Value = run.input()?;
        let made = || NewEvent::new("thing.made", "thing/x", "worker", 0);
        match input["what"].as_str().unwrap() {
            "ok" => ctx.emit_to("app", "done", made())?,
            "unregistered" => ctx.emit_to("app", "done", NewEvent::new("nope", "x", "w", 0))?,
            "too-big" => ctx.emit_to(
                "app",
                "done",
                made().payload(&json!({ "blob": "x".repeat(100_000) })),
            )?,
            "app-statement" => {
                ctx.complete(|tx| B::run_sql(tx, "INSERT INTO no_such_table VALUES (1)"))?
            }
            "checkpoint" => ctx.checkpoint(&"y".repeat(100_000))?,
            other => panic!("{other}"),
        }
        Ok(())
    })
    .unwrap();
    e.register_channel("sms", ChannelPolicy::BestEffort, |msg, ctx| {
        // The emitted id is `<delivery id>/sent`: past the id limit.
        ctx.emit_to(
            "app",
            "sent",
            NewEvent::new("thing.made", &msg.template, "sms", 0),
        )?;
        Ok(())
    })
    .unwrap();
    let whats = [
        "ok",
        "unregistered",
        "too-big",
        "app-statement",
        "checkpoint",
    ];
    let ids: Vec<String> = e
        .write(|tx| {
            whats
                .iter()
                .map(|w| {
                    let t = Enqueue::new("work", &json!({ "what": w })).retry(RetryPolicy::never());
                    Ok(tx.enqueue(&t)?.id)
                })
                .collect()
        })
        .unwrap();
    let long_id = "d".repeat(reflexr::limits::MAX_ID_BYTES - 2);
    e.deliver(&Delivery::new("sms", "hello").id(&long_id))
        .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!(idle.claimed, 6, "one batch");
    assert_eq!((idle.succeeded, idle.dead), (1, 5));
    let run = |i: usize| e.run(&ids[i]).unwrap().unwrap();
    assert_eq!(run(0).state, RunState::Succeeded);
    let done = all(&e);
    assert_eq!(done.len(), 1, "the successful run's event, and no other");
    assert_eq!(done[0].id, format!("{}/done", ids[0]));
    for (i, says) in [
        (1, "event type not found"),
        (2, "invalid payload"),
        (3, "no_such_table"),
        (4, "invalid checkpoint"),
    ] {
        assert_eq!(run(i).state, RunState::Dead, "{}", whats[i]);
        let error = run(i).last_error.unwrap();
        assert!(error.contains(says), "{}: {error}", whats[i]);
    }
    let sms = e.run(&long_id).unwrap().unwrap();
    assert_eq!(sms.state, RunState::Dead);
    assert!(sms.last_error.unwrap().contains("invalid id"));
    assert_eq!(e.dead_letters(false, 10).unwrap().len(), 5);
}

/// Rules that trigger each other stop at the chain depth limit: the firing
/// whose run would go deeper is a dead run with a `depth_limit` dead
/// letter instead of a run.
fn a_chain_of_rules_stops_at_the_depth_limit_with_a_dead_letter<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = B::open_limited(&place, &clock, 1 << 20, 3);
    e.ensure_workspace("app", &["ping"]).unwrap();
    e.register_rule(
        Rule::new("echo", "app")
            .on(["ping"])
            .scope(Scope::Global)
            .action("pong")
            .decide(|_| Ok(Decision::Fire(Value::Null))),
    )
    .unwrap();
    e.register_action("pong", |_, ctx| {
        ctx.emit("ping", NewEvent::new("ping", "loop", "echo", ctx.now_ms()))?;
        Ok(())
    })
    .unwrap();
    e.append("app", &NewEvent::new("ping", "loop", "app", 0))
        .unwrap();
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.fired, idle.succeeded), (4, 3));
    let pings = e.read(&Query::new("app").types(["ping"])).unwrap();
    let depths: Vec<i64> = pings.iter().map(|p| p.depth).collect();
    assert_eq!(depths, [0, 1, 2, 3]);
    let letters = e.dead_letters(false, 10).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason.as_str(), "depth_limit");
    assert_eq!(letters[0].event_seq, Some(pings[3].seq));
}

// ----- scopes of rule runs ---------------------------------------------------

const BACKOFF: Duration = Duration::from_secs(10);

/// An engine with the workspace `app` of the run tests.
fn jobs_engine<B: TestBackend>(place: &B::Place, clock: &ManualClock) -> Engine<B> {
    let e = B::open(place, clock, "test");
    e.ensure_workspace("app", JOB_TYPES).unwrap();
    e
}

/// Invariant 6 with `on_dead_letter = block`: a scope stops at its dead
/// run until an operator unblocks it (or discards the run); operators find
/// what is held; the scope then resumes in order, on the record.
fn block_holds_the_scope_until_an_operator_unblocks_it<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = jobs_engine::<B>(&place, &clock);
    e.register_rule(on_job(RetryPolicy::never()).on_dead_letter(OnDeadLetter::Block))
        .unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = Arc::clone(&order);
    e.register_action("work", move |run, _| {
        let input: Value = run.input()?;
        let idx = input["idx"].as_u64().unwrap();
        o.lock().unwrap().push(idx);
        if idx == 0 || idx == 3 {
            return Err("poison".into());
        }
        Ok(())
    })
    .unwrap();
    for (i, scope) in ["a", "a", "a", "b", "b"].iter().enumerate() {
        e.append("app", &job(scope, i)).unwrap();
    }
    e.run_until_idle().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        [0, 3],
        "both scopes stop at their dead run"
    );
    assert_eq!(e.runs(Some(RunState::Waiting), 10).unwrap().len(), 3);
    let scope_b_dead = e
        .runs(Some(RunState::Dead), 10)
        .unwrap()
        .into_iter()
        .find(|r| r.scope.as_deref() == Some("b"))
        .unwrap();
    let blocked = e.blocked_lanes(10).unwrap();
    let mut held: Vec<(String, String)> = blocked
        .iter()
        .map(|l| (l.scope.clone(), l.last_error.clone().unwrap_or_default()))
        .collect();
    held.sort();
    assert_eq!(
        held,
        [("a".into(), "poison".into()), ("b".into(), "poison".into())]
    );
    assert_eq!(e.stats().unwrap().blocked_lanes, 2);
    e.operator("ops", "skip the poison message")
        .unwrap()
        .unblock("jobs", "a")
        .unwrap();
    e.operator("ops", "not needed")
        .unwrap()
        .discard_run(&scope_b_dead.id)
        .unwrap();
    e.run_until_idle().unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 5);
    let at = |idx| order.iter().position(|&i| i == idx).unwrap();
    assert!(at(1) < at(2), "scope a resumed in order: {order:?}");
    assert!(at(4) > at(3), "scope b went on: {order:?}");
    assert!(e.blocked_lanes(10).unwrap().is_empty());
    let err = e
        .operator("ops", "again")
        .unwrap()
        .unblock("jobs", "a")
        .unwrap_err();
    assert!(err.is_not_found(), "no longer blocked: {err}");
    let actions: Vec<String> = e
        .audit_log(10)
        .unwrap()
        .into_iter()
        .map(|a| a.action.to_string())
        .collect();
    assert_eq!(actions, ["discard_run", "unblock"]);
}

/// Invariant 6 with `on_dead_letter = continue` (the default): a scope goes
/// on past its dead run.
fn continue_lets_the_scope_go_on_after_a_dead_run<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = jobs_engine::<B>(&place, &clock);
    e.register_rule(on_job(RetryPolicy::never())).unwrap();
    e.register_action("work", |run, _| {
        let input: Value = run.input()?;
        if input["idx"] == 0 {
            Err("poison".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    for i in 0..3 {
        e.append("app", &job("a", i)).unwrap();
    }
    let idle = e.run_until_idle().unwrap();
    assert_eq!((idle.dead, idle.succeeded), (1, 2));
}

/// Invariant 6: a run waiting for its retry's backoff holds back its own
/// scope, and no other.
fn a_retry_waiting_for_its_backoff_holds_back_only_its_own_scope<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = jobs_engine::<B>(&place, &clock);
    e.register_rule(on_job(RetryPolicy::attempts(3).fixed(BACKOFF)))
        .unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = Arc::clone(&order);
    e.register_action("work", move |run, _| {
        let input: Value = run.input()?;
        let idx = input["idx"].as_u64().unwrap();
        o.lock().unwrap().push((idx, run.attempt));
        if idx == 0 && run.attempt == 1 {
            Err("busy".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    for (i, scope) in ["a", "a", "b", "b"].iter().enumerate() {
        e.append("app", &job(scope, i)).unwrap();
    }
    e.run_until_idle().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        [(0, 1), (2, 1), (3, 1)],
        "b went on; a waits"
    );
    clock.advance(BACKOFF);
    e.run_until_idle().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        [(0, 1), (2, 1), (3, 1), (0, 2), (1, 1)],
        "then a, in order"
    );
}

/// Invariants 3 and 5: what a run emits is appended with its completion,
/// its id derived from the run's (the firing's), so a retry emits nothing
/// twice; its causation is the firing event and its depth one more.
fn events_emitted_by_a_run_are_not_duplicated_across_retries<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let e = jobs_engine::<B>(&place, &clock);
    e.register_rule(on_job(RetryPolicy::attempts(3).fixed(BACKOFF)))
        .unwrap();
    e.register_action("work", |run, ctx| {
        ctx.emit(
            "done",
            NewEvent::new("done", format!("job/{}", run.id), "worker", ctx.now_ms()),
        )?;
        if run.attempt == 1 {
            return Err("failed after emitting".into());
        }
        Ok(())
    })
    .unwrap();
    let trigger = e.append("app", &job("a", 0)).unwrap();
    e.run_until_idle().unwrap();
    assert!(
        e.read(&Query::new("app").types(["done"]))
            .unwrap()
            .is_empty()
    );
    clock.advance(BACKOFF);
    e.run_until_idle().unwrap();
    let done = e.read(&Query::new("app").types(["done"])).unwrap();
    assert_eq!(done.len(), 1);
    let runs = e.runs(None, 10).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(done[0].id, format!("{}/done", runs[0].id));
    assert_eq!(done[0].causation_id.as_deref(), Some(trigger.id.as_str()));
    assert_eq!(done[0].depth, 1);
}

/// Control of the work: the database refuses a second run with a held key
/// (the enqueue gets the holder's id, marked deduplicated) while the first
/// is pending, while it is active, or for a period after it was made.
fn a_unique_key_holds_while_pending_while_active_or_for_a_period<B: TestBackend>() {
    let (place, clock, e) = setup::<B>();
    let seen = recording(&e);
    let a = e
        .enqueue(&task(1).unique("k", Unique::WhilePending))
        .unwrap();
    let b = e
        .enqueue(&task(2).unique("k", Unique::WhilePending))
        .unwrap();
    assert!(b.deduplicated && b.id == a.id);
    e.run_until_idle().unwrap();
    let c = e
        .enqueue(&task(3).unique("k", Unique::WhilePending))
        .unwrap();
    assert!(!c.deduplicated, "the first ended: the key is free");
    // The unique index itself: a second pending run with the key is
    // refused by the database, whoever writes it.
    let forged = e.write(|tx| {
        B::run_sql(
            tx,
            &format!(
                "UPDATE reflexr_runs SET unique_key = 'k', unique_mode = 'pending' \
                 WHERE id = '{}'",
                a.id
            ),
        )?;
        B::run_sql(
            tx,
            &format!(
                "UPDATE reflexr_runs SET state = 'ready' WHERE id = '{}'",
                a.id
            ),
        )
    });
    assert!(forged.is_err(), "the partial unique index holds");
    e.run_until_idle().unwrap();

    let d = e
        .enqueue(&task(4).unique("j", Unique::WhileActive))
        .unwrap();
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let go = std::sync::Mutex::new(go);
    let worker_engine = B::open(&place, &clock, "worker");
    worker_engine
        .register_action("work", move |_, _| {
            started_tx.send(()).unwrap();
            go.lock().unwrap().recv().unwrap();
            Ok(())
        })
        .unwrap();
    let worker = std::thread::spawn(move || worker_engine.run_until_idle().unwrap());
    started.recv().unwrap();
    let f = e
        .enqueue(&task(5).unique("j", Unique::WhileActive))
        .unwrap();
    assert!(
        f.deduplicated && f.id == d.id,
        "still running: the key holds"
    );
    go_tx.send(()).unwrap();
    worker.join().unwrap();
    let again = e
        .enqueue(&task(6).unique("j", Unique::WhileActive))
        .unwrap();
    assert!(!again.deduplicated);
    e.run_until_idle().unwrap();

    let period = || Unique::For(Duration::from_secs(60));
    let g = e.enqueue(&task(7).unique("p", period())).unwrap();
    e.run_until_idle().unwrap();
    let h = e.enqueue(&task(8).unique("p", period())).unwrap();
    assert!(
        h.deduplicated && h.id == g.id,
        "within the period, though it ended"
    );
    clock.advance(Duration::from_secs(61));
    assert!(
        !e.enqueue(&task(9).unique("p", period()))
            .unwrap()
            .deduplicated
    );
    e.run_until_idle().unwrap();
    let mut ns = seen.lock().unwrap().clone();
    ns.sort_unstable();
    // 4 ran in the other worker; no deduplicated one (2, 5, 8) ran at all.
    assert_eq!(ns, [1, 3, 6, 7, 9]);
    assert_eq!(e.run(&d.id).unwrap().unwrap().state, RunState::Succeeded);
    assert_eq!(
        e.runs(None, 20).unwrap().len(),
        6,
        "one run per enqueue kept"
    );
}

/// Invariants 5 and 7: a cancelled pending run never starts; a running
/// one's handler sees the cancel at once in this process and its
/// completion is refused: it ends cancelled; an ended run cannot be
/// cancelled; each cancel is on the record.
fn a_pending_run_cancelled_never_starts_and_a_running_one_is_refused_its_completion<
    B: TestBackend,
>() {
    let (_place, clock, e) = setup::<B>();
    let pending = e
        .enqueue(&task(1).after(Duration::from_secs(60)))
        .unwrap()
        .id;
    let ops = e.operator("ops", "not needed").unwrap();
    assert_eq!(ops.cancel_run(&pending).unwrap(), RunState::Ready);
    let run = e.run(&pending).unwrap().unwrap();
    assert_eq!(
        (run.state, run.cancelled_by.as_deref()),
        (RunState::Cancelled, Some("ops"))
    );

    let running = e.enqueue(&task(2)).unwrap().id;
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let go = std::sync::Mutex::new(go);
    let saw_cancel = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let saw = Arc::clone(&saw_cancel);
    e.register_action("work", move |_, ctx| {
        started_tx.send(()).unwrap();
        go.lock().unwrap().recv().unwrap();
        if ctx.is_cancelled() {
            saw.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(()) // says it succeeded: refused
    })
    .unwrap();
    clock.advance(Duration::from_secs(61)); // the cancelled one would be due
    let worker = {
        let e = e.clone();
        std::thread::spawn(move || e.run_until_idle().unwrap())
    };
    started.recv().unwrap();
    assert_eq!(ops.cancel_run(&running).unwrap(), RunState::Running);
    go_tx.send(()).unwrap();
    let idle = worker.join().unwrap();
    assert_eq!(
        (idle.claimed, idle.succeeded),
        (1, 0),
        "only the running one was claimed"
    );
    assert_eq!(
        saw_cancel.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "seen at once"
    );
    let run = e.run(&running).unwrap().unwrap();
    assert_eq!(run.state, RunState::Cancelled);
    assert!(run.cancel_requested_at.is_some());
    let err = ops.cancel_run(&running).unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    assert!(ops.cancel_run("nope").unwrap_err().is_not_found());
    let cancels = e
        .audit_log(10)
        .unwrap()
        .iter()
        .filter(|a| a.action.to_string() == "cancel")
        .count();
    assert_eq!(cancels, 2);
}
