//! The stages on PostgreSQL (`--backend postgres`, feature `postgres`):
//! what the engine does on a server, each beside raw PostgreSQL doing the
//! same work through the same client (`INSERT` into a plain table with a
//! bigint key, no ids to check, no seq to serialise) — and, in the PostgreSQL guide,
//! beside the SQLite stage of the same name.
//!
//! The server is the one `--postgres` (or `REFLEXR_PG_URL`) names; each
//! measurement gets a schema of its own, dropped after.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reflexr::postgres::{Client, NoTls};
use reflexr::{Engine, Enqueue, Postgres, Query, RunState};

use super::stages::{
    append_concurrently, append_in_thousands, event, register_mixed_rules, session_tick,
};
use super::{Ctx, Figure, rate, raw};

/// A schema of its own on the server, dropped with it.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    fn new(url: &str) -> Schema {
        let name = format!("bench_{}", uuid::Uuid::now_v7().simple());
        let mut c = Client::connect(url, NoTls).expect("the server answers");
        c.batch_execute(&format!("CREATE SCHEMA {name}")).unwrap();
        Schema {
            url: url.into(),
            name,
        }
    }

    fn config(&self) -> String {
        format!("{} options='-c search_path={}'", self.url, self.name)
    }

    fn engine(&self) -> Engine<Postgres> {
        let engine = Engine::builder_postgres(self.config())
            .pool_size(20)
            .open()
            .expect("open on PostgreSQL");
        engine.ensure_workspace("bench", &["tick"]).unwrap();
        engine
    }

    /// A client with the raw baseline's table.
    fn raw(&self) -> Client {
        let mut c = Client::connect(&self.config(), NoTls).unwrap();
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS raw_events \
             (seq bigserial PRIMARY KEY, id text NOT NULL, payload text NOT NULL)",
        )
        .unwrap();
        c
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.url, NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name));
        }
    }
}

fn raw_insert(c: &mut impl reflexr::postgres::GenericClient, i: usize) {
    let id = format!("raw-{i}");
    c.execute(
        "INSERT INTO raw_events (id, payload) VALUES ($1, $2)",
        &[&id, &raw::payload(i)],
    )
    .unwrap();
}

/// A stage on the server `url` names.
pub type Stage = fn(&str, &Ctx) -> Vec<Figure>;

/// Every stage, in the order the table prints them.
pub const ALL: &[(&str, Stage)] = &[
    ("pg_append_single", append_single),
    ("pg_append_concurrent16", append_concurrent16),
    ("pg_append_batch1000", append_batch1000),
    ("pg_enqueue_single", enqueue_single),
    ("pg_enqueue_beside_appends", enqueue_beside_appends),
    ("pg_read_pages", read_pages),
    ("pg_evaluate_10rules", evaluate_10rules),
    ("pg_runs_4processes", runs_4processes),
    ("pg_runs_4processes_vs_1", runs_4processes_vs_1),
    ("pg_latency_inprocess", latency_inprocess),
    ("pg_latency_enqueue", latency_enqueue),
    (
        "pg_latency_enqueue_back_to_back",
        latency_enqueue_back_to_back,
    ),
];

/// One event per transaction, one caller: two round trips and a commit.
fn append_single(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(1_000, 5_000);
    let s = Schema::new(url);
    let mut c = s.raw();
    let start = Instant::now();
    for i in 0..n {
        raw_insert(&mut c, i);
    }
    let baseline = rate(n, start.elapsed());
    let engine = s.engine();
    let start = Instant::now();
    for i in 0..n {
        engine.append("bench", &event(i)).unwrap();
    }
    let value = rate(n, start.elapsed());
    vec![Figure::new("pg_append_single", value, "events/s", baseline)]
}

/// 16 threads, each appending one event per transaction (its own pooled
/// connection). Appends serialise on the head row from the append to the
/// commit; the raw baseline's inserts do not.
fn append_concurrent16(url: &str, ctx: &Ctx) -> Vec<Figure> {
    const CALLERS: usize = 16;
    let each = ctx.n(100, 500);
    let s = Arc::new(Schema::new(url));
    drop(s.raw());
    let start = Instant::now();
    let threads: Vec<_> = (0..CALLERS)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut c = Client::connect(&s.config(), NoTls).unwrap();
                for k in 0..each {
                    raw_insert(&mut c, t * each + k);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let baseline = rate(CALLERS * each, start.elapsed());
    let value = append_concurrently(&s.engine(), CALLERS, each);
    vec![Figure::new(
        "pg_append_concurrent16",
        value,
        "events/s",
        baseline,
    )]
}

/// One `Engine::enqueue` per transaction, one caller, against one row per
/// transaction into a plain queue table (a bigint key and the index a
/// queue needs) through the same client.
fn enqueue_single(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(1_000, 5_000);
    let s = Schema::new(url);
    let mut c = Client::connect(&s.config(), NoTls).unwrap();
    c.batch_execute(
        "CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, state text NOT NULL, \
           due_at bigint NOT NULL, payload text NOT NULL); \
         CREATE INDEX raw_jobs_due ON raw_jobs (due_at) WHERE state = 'ready';",
    )
    .unwrap();
    let start = Instant::now();
    for i in 0..n {
        c.execute(
            "INSERT INTO raw_jobs (state, due_at, payload) VALUES ('ready', $1, $2)",
            &[&(i as i64), &raw::payload(i)],
        )
        .unwrap();
    }
    let baseline = rate(n, start.elapsed());
    let engine = s.engine();
    let start = Instant::now();
    for i in 0..n {
        engine
            .enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": i })))
            .unwrap();
    }
    let value = rate(n, start.elapsed());
    vec![Figure::new(
        "pg_enqueue_single",
        value,
        "enqueues/s",
        baseline,
    )]
}

/// One caller's `Engine::enqueue`s while another engine on the schema
/// (another process, as far as the server can tell) appends from 16
/// threads, against the same enqueues with the server to themselves: an
/// enqueue appends nothing, so it takes no lock an appender holds (a
/// shared write that may append takes the log's head with its BEGIN).
fn enqueue_beside_appends(url: &str, ctx: &Ctx) -> Vec<Figure> {
    const APPENDERS: usize = 16;
    let n = ctx.n(1_000, 5_000);
    let s = Schema::new(url);
    let enqueuer = s.engine();
    let enqueue = |from: usize| {
        let start = Instant::now();
        for i in from..from + n {
            enqueuer
                .enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": i })))
                .unwrap();
        }
        rate(n, start.elapsed())
    };
    let alone = enqueue(0);
    let appender = s.engine();
    let stop = AtomicBool::new(false);
    let value = std::thread::scope(|scope| {
        for t in 0..APPENDERS {
            let (appender, stop) = (&appender, &stop);
            scope.spawn(move || {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Subjects apart from every other thread's.
                    appender
                        .append("bench", &event((t + 1) * 10_000_000 + k))
                        .unwrap();
                    k += 1;
                }
            });
        }
        let value = enqueue(n);
        stop.store(true, Ordering::Relaxed);
        value
    });
    vec![Figure::new(
        "pg_enqueue_beside_appends",
        value,
        "enqueues/s",
        alone,
    )]
}

/// From an append's return to its action's handler starting, with the
/// engine's threads, on the server: the commit's nudge wakes the evaluator,
/// whose firing's commit hands the run to a parked executor (the `NOTIFY`
/// reaches other processes). Baseline: the median raw insert and commit
/// (its round trip and the server's flush), the floor any of this pays.
fn latency_inprocess(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let samples = ctx.n(200, 1_000);
    let s = Schema::new(url);
    let baseline = raw_commit_ms(&s, samples);
    let engine = s.engine();
    let handled = super::latency::react(&engine);
    let lat = super::latency::measure(&engine, &handled, samples);
    engine.shutdown();
    latency_figures("pg_latency_inprocess", lat, baseline)
}

/// The median of `samples` raw inserts, each its own commit, on `s`.
fn raw_commit_ms(s: &Schema, samples: usize) -> f64 {
    let mut c = s.raw();
    let mut raw: Vec<f64> = (0..samples)
        .map(|i| {
            let t = Instant::now();
            raw_insert(&mut c, i);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    super::latency::percentile(&mut raw, 0.5)
}

/// `name`'s median and 99th percentile of `lat`, beside `baseline`.
fn latency_figures(name: &str, mut lat: Vec<f64>, baseline: f64) -> Vec<Figure> {
    [("p50", 0.5), ("p99", 0.99)]
        .into_iter()
        .map(|(p, at)| {
            Figure::new(
                &format!("{name}_{p}_ms"),
                super::latency::percentile(&mut lat, at),
                "ms",
                baseline,
            )
        })
        .collect()
}

/// From an `Engine::enqueue` call to its handler's start, on an idle
/// started engine (see `latency::measure_enqueues`): the path pgqueuer's
/// latency measures (an enqueue, then its worker's handler), from the
/// call rather than its return. Baseline: the median raw insert and
/// commit, which the call's commit pays.
fn latency_enqueue(url: &str, ctx: &Ctx) -> Vec<Figure> {
    enqueue_latencies(url, ctx, "pg_latency_enqueue", false)
}

/// [`latency_enqueue`], each enqueue made as soon as the last one's
/// handler started, as pgqueuer's script's `latency` does: the executor
/// that ran it is still settling it, so the run is rarely handed over at
/// its insert and goes through a claim. Baseline: the median raw insert
/// and commit.
fn latency_enqueue_back_to_back(url: &str, ctx: &Ctx) -> Vec<Figure> {
    enqueue_latencies(url, ctx, "pg_latency_enqueue_back_to_back", true)
}

/// `name`'s figures: enqueues on a started engine, each on an idle one or
/// `back_to_back` (see `latency::measure_enqueues`).
fn enqueue_latencies(url: &str, ctx: &Ctx, name: &str, back_to_back: bool) -> Vec<Figure> {
    let samples = ctx.n(200, 1_000);
    let s = Schema::new(url);
    let baseline = raw_commit_ms(&s, samples);
    let engine = s.engine();
    let handled = super::latency::handle(&engine);
    let lat = super::latency::measure_enqueues(&engine, &handled, samples, back_to_back);
    engine.shutdown();
    latency_figures(name, lat, baseline)
}

/// 1,000 events per transaction: one round trip per append.
fn append_batch1000(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(10_000, 50_000);
    let s = Schema::new(url);
    let mut c = s.raw();
    let start = Instant::now();
    for chunk in 0..n / 1_000 {
        let mut tx = c.transaction().unwrap();
        for k in 0..1_000 {
            raw_insert(&mut tx, chunk * 1_000 + k);
        }
        tx.commit().unwrap();
    }
    let baseline = rate(n, start.elapsed());
    let engine = s.engine();
    let start = Instant::now();
    append_in_thousands(&engine, 0, n, event);
    let value = rate(n, start.elapsed());
    vec![Figure::new(
        "pg_append_batch1000",
        value,
        "events/s",
        baseline,
    )]
}

/// A consumer reading the log after its cursor, 1,000 events a page.
/// Baseline: the same page query on a raw connection. The table is
/// analyzed before either side reads, as autovacuum would have done by
/// then: a table of fresh rows no `ANALYZE` has seen yet is planned for a
/// handful of rows (every row after the cursor read and sorted for each
/// page, about 19 ms a page at 100,000), and whether autovacuum's minute
/// came before the timed passes made the stage read 0.4 or 4.
fn read_pages(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(20_000, 100_000);
    let s = Schema::new(url);
    let engine = s.engine();
    append_in_thousands(&engine, 0, n, event);
    let mut c = Client::connect(&s.config(), NoTls).unwrap();
    c.batch_execute("ANALYZE reflexr_events").unwrap();
    // One pass first, not timed: the first read of new rows sets their
    // hint bits (it writes the pages), which neither timed pass should pay.
    let _ = c
        .query(
            "SELECT count(*) FROM reflexr_events WHERE workspace = 'bench'",
            &[],
        )
        .unwrap();
    let start = Instant::now();
    let mut after = 0i64;
    let mut read = 0;
    loop {
        let rows = c
            .query(
                "SELECT seq, id, type, subject, payload FROM reflexr_events \
                 WHERE workspace = 'bench' AND seq > $1 ORDER BY seq LIMIT 1000",
                &[&after],
            )
            .unwrap();
        let Some(last) = rows.last() else { break };
        after = last.get(0);
        read += rows.len();
    }
    let baseline = rate(read, start.elapsed());
    let start = Instant::now();
    let mut after = 0;
    let mut read = 0;
    loop {
        let page = engine
            .read(&Query::new("bench").after(after).limit(1_000))
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        read += page.len();
    }
    let value = rate(read, start.elapsed());
    vec![Figure::new("pg_read_pages", value, "events/s", baseline)]
}

/// Events decided per second by ten rules, half stateful and half trivial
/// (as `evaluate_10rules` on SQLite: a firing for one event in ten), the
/// engine not started (`Engine::run_until_idle`). Baseline: a raw paged
/// scan of the same events, 1,000 a page, each payload decoded.
fn evaluate_10rules(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(5_000, 20_000);
    let s = Schema::new(url);
    let engine = s.engine();
    append_in_thousands(&engine, 0, n, session_tick);
    let mut c = Client::connect(&s.config(), NoTls).unwrap();
    // Analyzed, as in `read_pages`: both sides read pages of the log.
    c.batch_execute("ANALYZE reflexr_events").unwrap();
    let start = Instant::now();
    let (mut after, mut read) = (0i64, 0);
    loop {
        let rows = c
            .query(
                "SELECT seq, payload FROM reflexr_events \
                 WHERE workspace = 'bench' AND seq > $1 ORDER BY seq LIMIT 1000",
                &[&after],
            )
            .unwrap();
        let Some(last) = rows.last() else { break };
        after = last.get(0);
        for r in &rows {
            let v: serde_json::Value = serde_json::from_str(r.get(1)).unwrap();
            std::hint::black_box(v);
        }
        read += rows.len();
    }
    let baseline = rate(read, start.elapsed());
    register_mixed_rules(&engine, 10);
    let start = Instant::now();
    let idle = engine.run_until_idle().unwrap();
    let value = rate(n, start.elapsed());
    assert_eq!(idle.decided, n * 10);
    vec![Figure::new(
        "pg_evaluate_10rules",
        value,
        "events/s",
        baseline,
    )]
}

/// No-op runs claimed, executed and completed per second by four processes
/// with four executor threads each, all claiming from one queue; the runs
/// are enqueued before the clock starts. Baseline: a raw queue on the same
/// server, four threads each claiming 100 ready rows per transaction
/// (`FOR UPDATE SKIP LOCKED`) and completing them in the next.
fn runs_4processes(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(5_000, 20_000);
    let baseline = raw_claim_complete(url, n, 4);
    let value = drain(url, n, 4);
    vec![Figure::new("pg_runs_4processes", value, "runs/s", baseline)]
}

/// The same runs drained by four processes against one (both of four
/// executors), measured in the stage one after the other: more workers on
/// the queue should drain it at least as fast (a ratio of 1 or more).
fn runs_4processes_vs_1(url: &str, ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(5_000, 20_000);
    let one = drain(url, n, 1);
    let four = drain(url, n, 4);
    vec![Figure::new("pg_runs_4processes_vs_1", four, "runs/s", one)]
}

/// Runs per second: `n` no-op runs enqueued before the clock starts, then
/// drained by `processes` child processes of four executors each.
fn drain(url: &str, n: usize, processes: usize) -> f64 {
    let s = Schema::new(url);
    let engine = s.engine();
    for chunk in 0..n / 1_000 {
        engine
            .write(|tx| {
                for k in 0..1_000 {
                    tx.enqueue(&Enqueue::new("noop", &(chunk * 1_000 + k)))?;
                }
                Ok(())
            })
            .unwrap();
    }
    let mut children: Vec<Child> = (0..processes)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .arg("--child-pg-runs")
                .arg(s.config())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a child")
        })
        .collect();
    // Each says when its engine is open and its action registered.
    for c in &mut children {
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
    }
    let start = Instant::now();
    for c in &mut children {
        writeln!(c.stdin.as_mut().unwrap(), "go").unwrap();
    }
    // Done when no run is ready or running: two probes of the runs' state
    // index on a raw connection, cheap next to the work measured
    // (`Engine::runs(Some(state), 1)` orders every run in the state by due
    // time: 60 ms of the server's two cores a look with 20,000 ready).
    let mut probe = Client::connect(&s.config(), NoTls).unwrap();
    let mut left = || -> bool {
        probe
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM reflexr_runs WHERE state = 'ready') \
                     OR EXISTS (SELECT 1 FROM reflexr_runs WHERE state = 'running')",
                &[],
            )
            .unwrap()
            .get(0)
    };
    while left() {
        assert!(start.elapsed() < Duration::from_secs(600), "runs stalled");
        std::thread::sleep(Duration::from_millis(10));
    }
    let value = rate(n, start.elapsed());
    let succeeded = engine
        .stats()
        .unwrap()
        .runs
        .get(&RunState::Succeeded)
        .copied();
    assert_eq!(succeeded, Some(n as i64));
    for mut c in children {
        drop(c.stdin.take()); // end of input: shut down
        assert!(c.wait().unwrap().success());
    }
    value
}

/// A child of [`runs_4processes`]: four executors with a no-op handler,
/// started on "go", shut down at the end of its input.
pub fn child_runs(config: &str) {
    let engine = Engine::builder_postgres(config)
        .pool_size(8)
        .executors(4)
        .open()
        .expect("open on PostgreSQL");
    engine.register_action("noop", |_, _| Ok(())).unwrap();
    println!("ready");
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    engine.start().unwrap();
    // Until the parent closes our input.
    while stdin.read_line(&mut line).unwrap_or(0) > 0 {}
    engine.shutdown();
}

/// The raw queue: `n` rows, `threads` threads each claiming up to 100 in
/// one transaction and completing them in the next.
fn raw_claim_complete(url: &str, n: usize, threads: usize) -> f64 {
    let s = Schema::new(url);
    let mut c = Client::connect(&s.config(), NoTls).unwrap();
    c.batch_execute(
        "CREATE TABLE raw_runs (id bigserial PRIMARY KEY, state text NOT NULL, \
           claimed_by text, input text NOT NULL); \
         CREATE INDEX raw_runs_ready ON raw_runs (id) WHERE state = 'ready';",
    )
    .unwrap();
    for chunk in 0..n / 1_000 {
        let mut tx = c.transaction().unwrap();
        for k in 0..1_000 {
            tx.execute(
                "INSERT INTO raw_runs (state, input) VALUES ('ready', $1)",
                &[&(chunk * 1_000 + k).to_string()],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let config = s.config();
            scope.spawn(move || {
                let mut c = Client::connect(&config, NoTls).unwrap();
                let me = format!("raw-{t}");
                loop {
                    let ids: Vec<i64> = c
                        .query(
                            "WITH picked AS MATERIALIZED (SELECT id FROM raw_runs \
                               WHERE state = 'ready' ORDER BY id LIMIT 100 \
                               FOR UPDATE SKIP LOCKED) \
                             UPDATE raw_runs r SET state = 'running', claimed_by = $1 \
                             FROM picked WHERE r.id = picked.id RETURNING r.id",
                            &[&me],
                        )
                        .unwrap()
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    if ids.is_empty() {
                        break;
                    }
                    c.execute(
                        "UPDATE raw_runs SET state = 'done', claimed_by = NULL \
                         WHERE id = ANY ($1) AND claimed_by = $2",
                        &[&ids, &me],
                    )
                    .unwrap();
                }
            });
        }
    });
    rate(n, start.elapsed())
}
