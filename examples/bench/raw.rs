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

/// One row in a transaction of its own (a durable commit).
pub fn insert_one(conn: &Connection, i: usize) {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    insert(conn, i);
    conn.execute_batch("COMMIT").unwrap();
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

/// Reads the workspace's whole log in pages of 500 after a cursor, decoding
/// every payload: what any consumer must at least do. Returns events/s.
pub fn scan(conn: &Connection, n: usize) -> f64 {
    let start = Instant::now();
    let mut after = 0i64;
    let mut seen = 0;
    loop {
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq, id, type, subject, actor, occurred_at, payload FROM reflexr_events \
                 WHERE workspace = 'bench' AND seq > ?1 ORDER BY seq LIMIT 500",
            )
            .unwrap();
        let page: Vec<(i64, serde_json::Value)> = stmt
            .query_map([after], |r| {
                let payload: String = r.get(6)?;
                Ok((r.get(0)?, serde_json::from_str(&payload).unwrap()))
            })
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let Some(last) = page.last() else { break };
        after = last.0;
        seen += page.len();
    }
    assert_eq!(seen, n);
    super::rate(n, start.elapsed())
}

/// A job table as a minimal queue would have it, `n` jobs ready; one thread
/// claims 100 per transaction and completes them in one more. Returns jobs/s.
pub fn claim_complete(path: &Path, sync: Synchronous, n: usize) -> f64 {
    let conn = Connection::open(path).unwrap();
    let _: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    conn.pragma_update(None, "synchronous", sync.as_str())
        .unwrap();
    conn.execute_batch(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL, due_at INTEGER NOT NULL,
                            claimed_by TEXT, payload TEXT NOT NULL);
         CREATE INDEX jobs_due ON jobs (state, due_at);",
    )
    .unwrap();
    conn.execute_batch("BEGIN").unwrap();
    for i in 0..n {
        conn.execute(
            "INSERT INTO jobs (state, due_at, payload) VALUES ('ready', ?1, '{}')",
            [i as i64],
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let ids: Vec<i64> = conn
            .prepare_cached(
                "UPDATE jobs SET state = 'running', claimed_by = 'w' WHERE id IN \
                 (SELECT id FROM jobs WHERE state = 'ready' AND due_at <= ?1 ORDER BY due_at LIMIT 100) \
                 RETURNING id",
            )
            .unwrap()
            .query_map([i64::MAX], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        conn.execute_batch("COMMIT").unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        for id in &ids {
            conn.prepare_cached(
                "UPDATE jobs SET state = 'done' WHERE id = ?1 AND claimed_by = 'w'",
            )
            .unwrap()
            .execute([id])
            .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
        done += ids.len();
    }
    super::rate(n, start.elapsed())
}

/// Fills a reflexr file's work queue with `scopes` lanes the claim must not
/// pay for: half blocked behind a dead head (`OnDeadLetter::Block`), half
/// behind a head that is ready but not due for a day; each with a run
/// waiting behind its head. Written with raw SQL: this is set-up, not
/// measurement.
pub fn blocked_scopes(path: &Path, scopes: usize) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("BEGIN").unwrap();
    let far = 1_800_000_000_000i64 * 10;
    for s in 0..scopes {
        let lane = format!("blocked-rule s{s}");
        let (head_state, due) = if s % 2 == 0 {
            ("dead", 0)
        } else {
            ("ready", far)
        };
        for (k, state) in [(0, head_state), (1, "waiting")] {
            conn.execute(
                "INSERT INTO reflexr_runs (id, kind, action, rule, scope, lane, on_dead_letter, \
                   input, state, attempt, max_attempts, backoff_ms, backoff_max_ms, \
                   backoff_factor, jitter, due_at, created_at, updated_at) \
                 VALUES (?1, 'rule', 'noop', 'blocked-rule', ?2, ?3, 'block', 'null', ?4, 1, 1, \
                   0, 0, 1.0, 0.0, ?5, 0, 0)",
                params![format!("b-{s}-{k}"), format!("s{s}"), lane, state, due],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO reflexr_lanes (lane, head, blocked, updated_at) VALUES (?1, ?2, ?3, 0)",
            params![lane, format!("b-{s}-0"), s % 2 == 0],
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
}

/// Fills a reflexr file with `n` events in workspace `bench` (and as many
/// succeeded runs when `runs`), in one statement each: set-up for the growth
/// stages.
pub fn prefill(path: &Path, n: usize, runs: bool) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(&format!(
        "BEGIN;
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < {n})
         INSERT INTO reflexr_events (workspace, id, type, subject, actor, occurred_at,
                                     recorded_at, payload, depth)
         SELECT 'bench', printf('pre-%012d', i), 'tick', 'tick/' || i, 'bench', i, i,
                json_object('session', i % 100, 'n', i, 'note', 'prefilled event'), 0
         FROM c;
         COMMIT;"
    ))
    .unwrap();
    if runs {
        conn.execute_batch(&format!(
            "BEGIN;
             WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < {n})
             INSERT INTO reflexr_runs (id, kind, action, input, state, attempt, max_attempts,
                                       backoff_ms, backoff_max_ms, backoff_factor, jitter,
                                       due_at, created_at, updated_at, finished_at)
             SELECT printf('old-%012d', i), 'rule', 'noop', 'null', 'succeeded', 1, 1, 0, 0,
                    1.0, 0.0, i, i, i, i
             FROM c;
             COMMIT;"
        ))
        .unwrap();
    }
}

/// One job row per transaction into a bare queue table (with the index a
/// queue needs): the floor under an enqueue. Returns rows/s.
pub fn enqueue_one(path: &Path, sync: Synchronous, n: usize) -> f64 {
    let conn = open(path, sync);
    conn.execute_batch(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL, due_at INTEGER NOT NULL,
                            payload TEXT NOT NULL);
         CREATE INDEX jobs_due ON jobs (state, due_at);",
    )
    .unwrap();
    let start = Instant::now();
    for i in 0..n {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.prepare_cached("INSERT INTO jobs (state, due_at, payload) VALUES ('ready', ?1, ?2)")
            .unwrap()
            .execute(rusqlite::params![i as i64, payload(i)])
            .unwrap();
        conn.execute_batch("COMMIT").unwrap();
    }
    super::rate(n, start.elapsed())
}
