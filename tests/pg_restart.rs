//! Fault: the PostgreSQL server restarts mid-work (`pg_ctl restart -m
//! fast`, which cuts every connection as a crash or a failover would). The
//! engine reconnects; a write cut before its commit is reported and left
//! no trace; nothing acknowledged is lost or appended twice (invariants 1,
//! 2 and 3). Its own test binary: the restart cuts every connection to the
//! server, so no other test may run beside it (`cargo test` runs test
//! binaries one after another).
#![cfg(feature = "postgres")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::backend::{PgSchema, TestBackend};
use reflexr::{Engine, Error, ManualClock, NewEvent, Postgres, Query};

fn restart_server() {
    let dir = std::env::var("REFLEXR_PG_DIR")
        .expect("REFLEXR_PG_DIR: the cluster tests/pg/cluster.sh started");
    let status = Command::new("bash")
        .args(["tests/pg/cluster.sh", "restart", &dir])
        .status()
        .expect("run cluster.sh");
    assert!(status.success(), "the server restarted");
}

fn made(id: &str) -> NewEvent {
    NewEvent::new("thing.made", format!("thing/{id}"), "tester", 1_000).id(id)
}

/// Appends `id`, retrying a write that met the restart: what an
/// application does with [`Error::Io`].
fn append_retrying(engine: &Engine<Postgres>, id: &str) -> (i64, usize) {
    let mut failures = 0;
    loop {
        match engine.write(|tx| {
            Postgres::insert_thing(tx, id)?;
            tx.append("app", &made(id))
        }) {
            Ok(a) => return (a.seq, failures),
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

/// Invariants 1, 2 and 3 across a server restart (see the module's notes).
#[test]
fn a_server_restart_loses_nothing_acknowledged_and_decides_nothing_twice() {
    let place = PgSchema::new();
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

    // A write whose connection is cut before it commits: an error, and no
    // trace of it.
    let cut = engine.write(|tx| {
        Postgres::insert_thing(tx, "cut")?;
        tx.append("app", &made("cut"))?;
        restart_server();
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
    let mut expected: Vec<String> = (0..10).map(|i| format!("before-{i}")).collect();
    expected.extend((0..10).map(|i| format!("after-{i}")));
    assert_eq!(ids, expected, "retried {retried} times");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=20).collect::<Vec<_>>(),
        "dense: the cut write took no seq"
    );
    let things = Postgres::things(&engine);
    assert!(!things.contains(&"cut".to_string()));
    assert_eq!(things.len(), 20);
}
