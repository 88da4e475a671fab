//! Locks on PostgreSQL (feature `postgres`): a shared write takes the
//! log's head with its BEGIN (the one lock order, see `core::postgres::db`), and a
//! server setting that makes lock waits fail (`lock_timeout`) fails that
//! write alone, with a typed error, and leaves its pooled connection
//! clean for the next (invariant 10: nothing committed is lost or
//! changed; a refused write leaves nothing behind).
#![cfg(feature = "postgres")]

use reflexr_testkit as common;

use std::sync::{Mutex, mpsc};
use std::time::Duration;

use common::backend::{PgSchema, TestBackend};
use reflexr::{Engine, ManualClock, NewEvent, Postgres, Query};

fn tick(i: usize) -> NewEvent {
    NewEvent::new("tick", format!("t/{i}"), "test", 0)
}

#[test]
fn a_write_that_meets_a_lock_timeout_fails_alone_and_its_connection_serves_the_next() {
    let place = PgSchema::new();
    let holder = Postgres::open(&place, &ManualClock::new(1_800_000_000_000), "holder");
    holder.ensure_workspace("app", &["tick"]).unwrap();
    // One connection, whose lock waits give up after 100 ms.
    let config = place.config();
    let config = format!(
        "{} -c lock_timeout=100'",
        config.strip_suffix('\'').expect("options in quotes")
    );
    let impatient = Engine::builder_postgres(config)
        .pool_size(1)
        .holder_id("impatient")
        .open()
        .unwrap();

    // The holder's write holds the head until told to commit.
    let (held_tx, held) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (held_tx, go) = (Mutex::new(held_tx), Mutex::new(go));
    let writer = {
        let holder = holder.clone();
        std::thread::spawn(move || {
            holder
                .write(|tx| {
                    tx.append("app", &tick(1))?;
                    held_tx.lock().unwrap().send(()).unwrap();
                    go.lock().unwrap().recv().unwrap();
                    Ok(())
                })
                .unwrap()
        })
    };
    held.recv_timeout(Duration::from_secs(60)).unwrap();
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
