//! Fault: the PostgreSQL server restarts mid-work (`pg_ctl restart -m
//! fast`, which cuts every connection as a crash or a failover would). The
//! engine reconnects; a write cut before its commit is reported and left
//! no trace; nothing acknowledged is lost or appended twice (invariants 1,
//! 2 and 3); rules and runs working through the restart decide each event
//! once and complete each run once (4 and 5). The restart cuts every connection to
//! its server, so the test starts a server of its own (`PgServer`) and
//! the other tests go on beside it on the shared one.
#![cfg(feature = "postgres")]

use reflexr_testkit as common;

use std::time::Duration;

use common::backend::{Opts, PgSchema, PgServer, TestBackend};
use common::rules::{APP_TYPES, every_nth, expected, fired, rsvp};
use reflexr::{Engine, Error, ManualClock, NewEvent, Postgres, Query, RunState};

fn made(id: &str) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000).id(id)
}

/// `f` again until it succeeds, while it meets the restart (an I/O error,
/// or a conflict with a transaction the restart cut): what an application
/// does with [`Error::Io`]. Returns the value and the number of failures.
fn retrying<T>(mut f: impl FnMut() -> reflexr::Result<T>) -> (T, usize) {
    let mut failures = 0;
    loop {
        match f() {
            Ok(v) => return (v, failures),
            Err(e) => {
                assert!(
                    matches!(e, Error::Io { .. } | Error::Busy { .. }),
                    "a cut connection is an I/O error: {e}"
                );
                failures += 1;
                assert!(failures < 50, "the engine did not reconnect: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// An engine on a schema of its own whose rule (every third RSVP of a
/// session fires) and action (a row per completed run, once: its key is the
/// run's id) work in its threads through the restart.
fn worker(place: &PgSchema, clock: &ManualClock) -> Engine<Postgres> {
    let e = Postgres::open_opts(place, &Opts::new(clock, "worker").executors(2));
    e.ensure_workspace("app", APP_TYPES).unwrap();
    Postgres::sql(&e, "CREATE TABLE done (run text PRIMARY KEY)");
    e.register_rule(every_nth("third", 3)).unwrap();
    e.register_action("noop", |run, ctx| {
        std::thread::sleep(Duration::from_millis(5));
        ctx.complete(|tx| {
            Postgres::run_sql(tx, &format!("INSERT INTO done VALUES ('{}')", run.id))
        })?;
        Ok(())
    })
    .unwrap();
    e
}

/// Appends `per_session` RSVPs to each of ten sessions, in one write.
fn rsvps(e: &Engine<Postgres>, from: u32, per_session: u32) {
    retrying(|| {
        e.write(|tx| {
            for g in from..from + per_session {
                for s in 0..10 {
                    tx.append("app", &rsvp(s, s * 10_000 + g))?;
                }
            }
            Ok(())
        })
    });
}

/// Appends `id`, retrying a write that met the restart.
fn append_retrying(engine: &Engine<Postgres>, id: &str) -> (i64, usize) {
    let (a, failures) = retrying(|| {
        engine.write(|tx| {
            Postgres::insert_thing(tx, id)?;
            tx.append("app", &made(id))
        })
    });
    (a.seq, failures)
}

/// Invariants 1 to 5 across a server restart (see the module's notes).
#[test]
fn a_server_restart_loses_nothing_acknowledged_and_decides_nothing_twice() {
    let server = PgServer::start();
    let place = PgSchema::on(&server.url);
    let clock = ManualClock::new(1_800_000_000_000);
    let engine = Postgres::open(&place, &clock, "writer");
    // The reader's heartbeat is an hour: after the restart, only its
    // listener (connected again) can wake it within the test's minute.
    let reader = Postgres::open_with(&place, &clock, "reader", Some(Duration::from_secs(3_600)));
    engine.ensure_workspace("app", &["thing.made"]).unwrap();
    Postgres::create_things(&engine);
    for i in 0..10 {
        append_retrying(&engine, &format!("before-{i}"));
    }
    // Work in flight when the server goes: a backlog of decisions and runs.
    let work_place = PgSchema::on(&server.url);
    let worker = worker(&work_place, &clock);
    rsvps(&worker, 0, 30);
    worker.start().unwrap();
    // Restart once the worker is busy: some runs done, most to come.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while Postgres::count(&worker, "SELECT count(*) FROM done") < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never got going"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // A write whose connection is cut before it commits: an error, and no
    // trace of it.
    let cut = engine.write(|tx| {
        Postgres::insert_thing(tx, "cut")?;
        tx.append("app", &made("cut"))?;
        server.restart();
        Ok(())
    });
    let e = cut.unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");

    // The same engines go on: broken connections are replaced.
    let watch = reader.watch();
    let mut retried = 0;
    for i in 0..10 {
        retried += append_retrying(&engine, &format!("after-{i}")).1;
    }
    // The same id again appends nothing (invariant 3).
    let again = engine.append("app", &made("after-0")).unwrap();
    assert!(again.existing);

    // The reader's listener connected again, and its watch was woken.
    assert!(
        watch.wait(Duration::from_secs(60)),
        "the reader was not woken after the restart"
    );
    let page = reader.read(&Query::new("app").after(10)).unwrap();
    assert_eq!(page.first().map(|e| e.id.as_str()), Some("after-0"));

    let events = reader.read(&Query::new("app").limit(1_000)).unwrap();
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let mut ids_in_order: Vec<String> = (0..10).map(|i| format!("before-{i}")).collect();
    ids_in_order.extend((0..10).map(|i| format!("after-{i}")));
    assert_eq!(ids, ids_in_order, "retried {retried} times");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=20).collect::<Vec<_>>(),
        "dense: the cut write took no seq"
    );
    let things = Postgres::things(&engine);
    assert!(!things.contains(&"cut".to_string()));
    assert_eq!(things.len(), 20);

    // The worker's threads went on after the restart; more work, then its
    // end: a minute later (claims the restart cut have lapsed), the rest.
    rsvps(&worker, 30, 30);
    worker.shutdown();
    println!(
        "the restart cut {} of the worker's shared writes and failed {} attempts",
        worker.writer_stats().aborts,
        Postgres::count(
            &worker,
            "SELECT count(*) FROM reflexr_runs WHERE attempt > 1 OR last_error IS NOT NULL"
        )
    );
    clock.advance(Duration::from_secs(60));
    retrying(|| worker.run_until_idle());
    let (fired_now, want) = (fired(&worker), expected(&worker, "third", 3));
    assert_eq!(fired_now.len(), 200, "ten sessions of 60, every third");
    assert_eq!(fired_now, want, "each (rule, event) decided once");
    assert_eq!(
        worker.stats().unwrap().runs.into_iter().collect::<Vec<_>>(),
        [(RunState::Succeeded, 200)],
        "every run completed"
    );
    assert_eq!(
        Postgres::count(&worker, "SELECT count(*) FROM done"),
        200,
        "each run completed once"
    );
}
