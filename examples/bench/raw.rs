//! Baselines: raw rusqlite doing the same work as reflexr, on the same
//! schema (`schema.sql`, so the same table and the same indexes), the same
//! pragmas and the same rows.

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, bounded, unbounded};
use reflexr::Synchronous;
use rusqlite::{Connection, params};

const SCHEMA: &str = include_str!("../../schema.sql");

/// A connection like reflexr's writer: WAL, the given synchronous, foreign
/// keys on, reflexr's schema, and one workspace with one type.
pub fn open(path: &Path, sync: Synchronous) -> Connection {
    let conn = Connection::open(path).unwrap();
    let _: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    conn.pragma_update(None, "synchronous", sync.as_str())
        .unwrap();
    conn.pragma_update(None, "foreign_keys", "ON").unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn.execute_batch(SCHEMA).unwrap();
    conn.execute_batch(
        "INSERT INTO reflexr_workspaces VALUES ('bench', 0);
         INSERT INTO reflexr_event_types (workspace, type, registered_at) VALUES ('bench', 'tick', 0);",
    )
    .unwrap();
    conn
}

/// The payload every append in the benchmarks carries.
pub fn payload(i: usize) -> String {
    serde_json::json!({ "n": i, "note": "a small event payload of about sixty bytes" }).to_string()
}

fn insert(conn: &Connection, i: usize) {
    let id = uuid::Uuid::now_v7().to_string();
    let now = 1_800_000_000_000i64 + i as i64;
    conn.prepare_cached(
        "INSERT INTO reflexr_events (workspace, id, type, subject, actor, occurred_at, \
         recorded_at, payload, causation_id, correlation_id, depth) \
         VALUES ('bench', ?1, 'tick', ?2, 'bench', ?3, ?3, ?4, NULL, NULL, 0)",
    )
    .unwrap()
    .execute(params![id, format!("tick/{i}"), now, payload(i)])
    .unwrap();
}

/// `n` rows, `per_tx` to a transaction. Returns rows per second.
pub fn batched(path: &Path, sync: Synchronous, n: usize, per_tx: usize) -> f64 {
    let conn = open(path, sync);
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        for _ in 0..per_tx.min(n - i) {
            insert(&conn, i);
            i += 1;
        }
        conn.execute_batch("COMMIT").unwrap();
    }
    super::rate(n, start.elapsed())
}

/// A hand-written single-writer group-commit loop: one thread owns the
/// connection, takes every request waiting, commits them in one transaction
/// and acknowledges each. `callers` threads each send `each` requests, one at
/// a time, waiting for the ack. Returns acknowledged rows per second.
pub fn group_commit(path: &Path, sync: Synchronous, callers: usize, each: usize) -> f64 {
    let conn = open(path, sync);
    let (tx, rx) = unbounded::<(usize, Sender<()>)>();
    let writer = std::thread::spawn(move || {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            for (i, _) in &batch {
                insert(&conn, *i);
            }
            conn.execute_batch("COMMIT").unwrap();
            for (_, ack) in batch {
                let _ = ack.send(());
            }
        }
    });
    let start = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|c| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let (ack_tx, ack_rx) = bounded(1);
                for k in 0..each {
                    tx.send((c * each + k, ack_tx.clone())).unwrap();
                    ack_rx.recv().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = start.elapsed();
    drop(tx);
    writer.join().unwrap();
    super::rate(callers * each, elapsed)
}
