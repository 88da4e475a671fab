//! Locks on PostgreSQL (feature `postgres`): a shared write that may append
//! takes the log's head with its BEGIN (the one lock order, see
//! `core::postgres::db`; enqueues and deliveries do not), and a
//! server setting that makes lock waits fail (`lock_timeout`) fails that
//! write alone, with a typed error, and leaves its pooled connection
//! clean for the next (invariant 10: nothing committed is lost or
//! changed; a refused write leaves nothing behind).
#![cfg(feature = "postgres")]

use reflexr_testkit as common;

use std::sync::{Mutex, mpsc};
use std::time::Duration;

use common::backend::{PgSchema, TestBackend};
use reflexr::{
    ChannelPolicy, Delivery, Engine, Enqueue, ManualClock, NewEvent, Postgres, Query, RunState,
};

fn tick(i: usize) -> NewEvent {
    NewEvent::new("tick", format!("t/{i}"), "test", 0)
}

/// An engine on `place` with one connection, whose lock waits give up
/// after 100 ms: a wait fails its write, it does not hang the test.
fn impatient(place: &PgSchema) -> Engine<Postgres> {
    let config = place.config();
    let config = format!(
        "{} -c lock_timeout=100'",
        config.strip_suffix('\'').expect("options in quotes")
    );
    Engine::builder_postgres(config)
        .pool_size(1)
        .holder_id("impatient")
        .open()
        .unwrap()
}

/// Opens a write of `holder`'s that appends, and so holds the log's head,
/// until the returned sender is told to let it commit (then join the
/// thread).
fn hold_head(holder: &Engine<Postgres>) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (held_tx, held) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (held_tx, go) = (Mutex::new(held_tx), Mutex::new(go));
    let holder = holder.clone();
    let writer = std::thread::spawn(move || {
        holder
            .write(|tx| {
                tx.append("app", &tick(1))?;
                held_tx.lock().unwrap().send(()).unwrap();
                go.lock().unwrap().recv().unwrap();
                Ok(())
            })
            .unwrap();
    });
    held.recv_timeout(Duration::from_secs(60)).unwrap();
    (go_tx, writer)
}

#[test]
fn a_write_that_meets_a_lock_timeout_fails_alone_and_its_connection_serves_the_next() {
    let place = PgSchema::new();
    let holder = Postgres::open(&place, &ManualClock::new(1_800_000_000_000), "holder");
    holder.ensure_workspace("app", &["tick"]).unwrap();
    let impatient = impatient(&place);

    // The holder's write holds the head until told to commit.
    let (go_tx, writer) = hold_head(&holder);
    let err = impatient.append("app", &tick(2)).unwrap_err();
    assert!(err.is_busy(), "a lock wait given up is Busy: {err:?}");
    go_tx.send(()).unwrap();
    writer.join().unwrap();

    // The same (only) connection serves the next write and a read.
    impatient.append("app", &tick(3)).unwrap();
    let ids: Vec<String> = impatient
        .read(&Query::new("app"))
        .unwrap()
        .into_iter()
        .map(|e| e.subject)
        .collect();
    assert_eq!(ids, ["t/1", "t/3"], "the refused write left nothing");
}

/// The one lock order, narrowed: only what may append takes the log's
/// head (invariant 1 stays the appenders': an enqueue takes no seq). An
/// enqueue and a delivery append nothing, so they commit while another
/// engine's write holds the head, on a connection whose lock waits give
/// up after 100 ms (a wait would fail them); a write that may append
/// still waits for it and gives up, leaving nothing (invariant 10).
#[test]
fn an_enqueue_and_a_delivery_wait_for_no_appender() {
    let place = PgSchema::new();
    let holder = Postgres::open(&place, &ManualClock::new(1_800_000_000_000), "holder");
    holder.ensure_workspace("app", &["tick"]).unwrap();
    let impatient = impatient(&place);
    impatient
        .register_channel("email", ChannelPolicy::BestEffort, |_, _| Ok(()))
        .unwrap();

    let (go_tx, writer) = hold_head(&holder);
    let task = impatient
        .enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 1 })))
        .expect("an enqueue takes no head");
    let mail = impatient
        .deliver(&Delivery::new("email", "hello").to("a@example.com"))
        .expect("a delivery takes no head");
    let err = impatient
        .write(|tx| tx.enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 2 }))))
        .unwrap_err();
    assert!(
        err.is_busy(),
        "a write that may append waits for the head: {err:?}"
    );
    go_tx.send(()).unwrap();
    writer.join().unwrap();

    let ready = impatient.runs(Some(RunState::Ready), 10).unwrap();
    let mut ids: Vec<&str> = ready.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    let mut want = vec![task.id.as_str(), mail.id.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want, "both committed; the refused write left nothing");
}

/// Invariants 1 and 13's versions for a single append alone, whose one
/// statement reads its subject's version with a snapshot taken before it
/// waited for the head: another process's append of the same subject,
/// committed while it waited, took that version, the subject's unique
/// index refuses the row, and the append is made again in a transaction
/// that holds the head first — at the next seq and the next version,
/// without an error.
#[test]
fn a_lone_append_whose_subject_version_was_taken_while_it_waited_appends_after_it() {
    let place = PgSchema::new();
    let clock = ManualClock::new(1_800_000_000_000);
    let holder = Postgres::open(&place, &clock, "holder");
    holder.ensure_workspace("app", &["tick"]).unwrap();
    let lone = Postgres::open(&place, &clock, "lone");
    // The holder's append of `t/1` holds the head until told to commit.
    let (go_tx, writer) = hold_head(&holder);
    let appender = std::thread::spawn(move || lone.append("app", &tick(1)));
    // The lone append's statement waits for the head (its snapshot taken).
    let mut admin =
        reflexr::postgres::Client::connect(&place.config(), reflexr::postgres::NoTls).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%moved AS (UPDATE reflexr_head%'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the lone append never waited"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    go_tx.send(()).unwrap();
    writer.join().unwrap();
    let first = holder.read(&Query::new("app")).unwrap().remove(0);
    let second = appender
        .join()
        .unwrap()
        .expect("appended after the holder's");
    assert_eq!(first.version, 1);
    assert_eq!((second.seq, second.version), (first.seq + 1, 2));
    assert_eq!(holder.head_seq().unwrap(), second.seq);
}
