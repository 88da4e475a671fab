//! Durable workflows: three-step workflows per second and their latency,
//! an append's wake of a waiting run, and claims and appends beside 100,000
//! suspended runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use reflexr::{Engine, Enqueue, EventMatch, NewEvent, RunState};

use super::{Ctx, Figure, rate, raw};

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn started(ctx: &Ctx, name: &str, executors: usize) -> Engine {
    let e = Engine::builder(ctx.db(name))
        .synchronous(ctx.sync)
        .executors(executors)
        .open()
        .unwrap();
    e.ensure_workspace("bench", &["tick", "confirmed"]).unwrap();
    e
}

/// A workflow of three steps, each recorded durably before the next.
fn three_steps(e: &Engine, done: impl Fn() + Send + Sync + 'static) {
    e.register_action("flow", move |_run, ctx| {
        let a: u64 = ctx.step("a", |_| Ok::<_, reflexr::Error>(1))?;
        let b: u64 = ctx.step("b", |_| Ok::<_, reflexr::Error>(a + 1))?;
        ctx.step("c", |_| Ok::<_, reflexr::Error>(b + 1))?;
        done();
        Ok(())
    })
    .unwrap();
}

/// Three-step workflows completed per second by 4 executors, enqueued
/// before the clock starts. Baseline: `runs_4executors` of this run (a
/// run with no step).
pub fn workflow_3steps(ctx: &Ctx) -> Vec<Figure> {
    let baseline = ctx.figure("runs_4executors");
    let n = ctx.n(2_000, 10_000);
    let e = Engine::builder(ctx.db("workflow_3steps"))
        .synchronous(ctx.sync)
        .executors(4)
        .open()
        .unwrap();
    for chunk in 0..n / 1_000 {
        e.write(|tx| {
            for k in 0..1_000 {
                tx.enqueue(&Enqueue::new("flow", &(chunk * 1_000 + k)))?;
            }
            Ok(())
        })
        .unwrap();
    }
    let count = Arc::new(AtomicUsize::new(0));
    let (all_tx, all) = mpsc::channel();
    let all_tx = Mutex::new(all_tx);
    let c = Arc::clone(&count);
    three_steps(&e, move || {
        if c.fetch_add(1, Ordering::SeqCst) + 1 == n {
            all_tx.lock().unwrap().send(()).unwrap();
        }
    });
    let start = Instant::now();
    e.start().unwrap();
    all.recv_timeout(Duration::from_secs(600)).unwrap();
    while e.runs(Some(RunState::Running), 1).unwrap().len()
        + e.runs(Some(RunState::Ready), 1).unwrap().len()
        > 0
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let value = rate(n, start.elapsed());
    e.shutdown();
    vec![Figure::new(
        "workflow_3steps",
        value,
        "workflows/s",
        baseline,
    )]
}

/// From an enqueue to the end of one three-step workflow, on an idle
/// started engine, p50 over the samples. Baseline: the same for a run with
/// no step.
pub fn workflow_3steps_latency_p50_ms(ctx: &Ctx) -> Vec<Figure> {
    let samples = ctx.n(30, 100);
    let measure = |name: &str, steps: bool| {
        let e = started(ctx, name, 2);
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        if steps {
            three_steps(&e, move || tx.lock().unwrap().send(()).unwrap());
        } else {
            e.register_action("flow", move |_, _| {
                tx.lock().unwrap().send(()).unwrap();
                Ok(())
            })
            .unwrap();
        }
        e.start().unwrap();
        let mut v: Vec<f64> = (0..samples)
            .map(|i| {
                let t = Instant::now();
                let id = e.enqueue(&Enqueue::new("flow", &i)).unwrap().id;
                rx.recv_timeout(Duration::from_secs(10)).unwrap();
                let run = e.wait_for_run(&id, Duration::from_secs(10)).unwrap();
                assert_eq!(run.state, RunState::Succeeded);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        e.shutdown();
        percentile(&mut v, 0.5)
    };
    let baseline = measure("latency-plain", false);
    let value = measure("latency-3steps", true);
    vec![Figure::new(
        "workflow_3steps_latency_p50_ms",
        value,
        "ms",
        baseline,
    )]
}

/// From an append to the handler of the run that waited for it continuing,
/// p50: each sample a new run, suspended on its own subject before the
/// event is appended. Baseline: the median of one raw durable commit.
pub fn wake_on_event_p50_ms(ctx: &Ctx) -> Vec<Figure> {
    let samples = ctx.n(30, 100);
    let e = started(ctx, "wake", 2);
    let (tx, rx) = mpsc::channel::<Instant>();
    let tx = Mutex::new(tx);
    e.register_action("wait", move |run, ctx| {
        let subject: String = run.input()?;
        let m = EventMatch::new("bench", "confirmed").subject(subject);
        ctx.wait_for_event("confirmed", &m, None)?;
        tx.lock().unwrap().send(Instant::now()).unwrap();
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    let mut v = Vec::with_capacity(samples);
    for i in 0..samples {
        let subject = format!("session/{i}");
        let id = e.enqueue(&Enqueue::new("wait", &subject)).unwrap().id;
        // Suspended: ready and due never.
        while e
            .run(&id)
            .unwrap()
            .is_none_or(|r| r.state != RunState::Ready || r.due_at != reflexr::limits::NEVER)
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        let t = Instant::now();
        e.append("bench", &NewEvent::new("confirmed", &subject, "bench", 0))
            .unwrap();
        let woke = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        v.push(woke.duration_since(t).as_secs_f64() * 1000.0);
    }
    e.shutdown();
    let conn = raw::open(&ctx.db("wake-raw"), ctx.sync);
    conn.execute_batch("CREATE TABLE t (v TEXT)").unwrap();
    let mut commits: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            conn.execute("INSERT INTO t VALUES ('x')", []).unwrap();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    vec![Figure::new(
        "wake_on_event_p50_ms",
        percentile(&mut v, 0.5),
        "ms",
        percentile(&mut commits, 0.5),
    )]
}

/// 100,000 suspended workflow runs, as the engine writes them: each ready
/// and due never, its wait step recorded and its wait for an event of the
/// workspace `bench` (a subject of its own) indexed; checkpointed, so the
/// measurement does not pay for copying the prefill out of the WAL.
fn waiting_100k(path: &std::path::Path) {
    let conn = reflexr::rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "BEGIN;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
         INSERT INTO reflexr_runs (id, kind, action, input, state, max_attempts, backoff_ms,
             backoff_max_ms, backoff_factor, jitter, due_at, created_at, updated_at)
         SELECT 'waiter/' || i, 'task', 'waiter', '{}', 'ready', 3, 1000, 60000, 2.0, 0.1,
             253402300799999, 0, 0 FROM n;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
         INSERT INTO reflexr_steps (run, name, position, kind, state, attempt, detail, recorded_at)
         SELECT 'waiter/' || i, 'confirmed', 1, 'wait', 'waiting', 1, '{}', 0 FROM n;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
         INSERT INTO reflexr_event_waits (run, step, workspace, type, by, key, after_seq)
         SELECT 'waiter/' || i, 'confirmed', 'bench', 'confirmed', 'subject', 'session/' || i, 0
         FROM n;
         INSERT INTO reflexr_wait_positions (workspace, position) VALUES ('bench', 0);
         COMMIT;
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
}

/// `runs_4executors` beside 100,000 suspended workflow runs waiting for
/// events of the same workspace. Baseline: `runs_4executors` of this run.
pub fn runs_4executors_beside_100k_waiting(ctx: &Ctx) -> Vec<Figure> {
    let baseline = ctx.figure("runs_4executors");
    let n = ctx.n(5_000, 20_000);
    let value = super::stages::run_rate(
        ctx,
        "runs_4executors_beside_100k_waiting",
        4,
        n,
        waiting_100k,
    );
    vec![Figure::new(
        "runs_4executors_beside_100k_waiting",
        value,
        "runs/s",
        baseline,
    )]
}

/// `append_batch1000` into the workspace 100,000 suspended runs wait on
/// (for another type). Baseline: the same appends beside none, this run.
pub fn append_batch1000_beside_100k_waiting(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(50_000, 200_000);
    let measure = |name: &str, prefill: bool| {
        let path = ctx.db(name);
        drop(Engine::builder(&path).synchronous(ctx.sync).open().unwrap());
        if prefill {
            waiting_100k(&path);
        }
        let e = Engine::builder(&path).synchronous(ctx.sync).open().unwrap();
        e.ensure_workspace("bench", &["tick", "confirmed"]).unwrap();
        let start = Instant::now();
        super::stages::append_in_thousands(&e, 0, n, super::stages::event);
        rate(n, start.elapsed())
    };
    let baseline = measure("append-beside-none", false);
    let value = measure("append-beside-100k", true);
    vec![Figure::new(
        "append_batch1000_beside_100k_waiting",
        value,
        "events/s",
        baseline,
    )]
}
