//! Latency from an append's commit to its action's handler starting, with
//! the engine's own threads: in one process (woken by the nudge), and with
//! the append made by another process (noticed by the heartbeat, 50 ms by
//! default). Baseline: the median latency of one raw durable commit, the
//! floor any of this pays.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reflexr::{Backend, Decision, Engine, Enqueue, NewEvent, Rule, RunOrder};

use super::{Ctx, Figure, raw};

pub(crate) fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn micros_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// An engine with a rule firing on every tick and an action that reports
/// when its handler starts (the event's seq and the wall clock in µs).
fn reacting_engine(ctx: &Ctx, name: &str) -> (Engine, mpsc::Receiver<(i64, i64)>) {
    let e = Engine::builder(ctx.db(name))
        .synchronous(ctx.sync)
        .open()
        .unwrap();
    e.ensure_workspace("bench", &["tick"]).unwrap();
    let handled = react(&e);
    (e, handled)
}

/// Registers on `e` a rule firing on every tick and an action that reports
/// when its handler starts (the event's seq and the wall clock in µs), and
/// starts its threads.
pub(crate) fn react<B: Backend>(e: &Engine<B>) -> mpsc::Receiver<(i64, i64)> {
    e.register_rule(
        Rule::new("every", "bench")
            .on(["tick"])
            .ordering(RunOrder::None)
            .action("mark")
            .decide(|_| Ok(Decision::Fire(serde_json::Value::Null))),
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    e.register_action("mark", move |run, _| {
        let now = micros_now();
        let _ = tx.lock().unwrap().send((run.event_seq.unwrap_or(0), now));
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    rx
}

/// `samples` appends to `e`, each once the last one's handler started: the
/// milliseconds from each append's return to its handler's start.
pub(crate) fn measure<B: Backend>(
    e: &Engine<B>,
    handled: &mpsc::Receiver<(i64, i64)>,
    samples: usize,
) -> Vec<f64> {
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        let a = e
            .append(
                "bench",
                &NewEvent::new("tick", format!("t/{i}"), "bench", 0),
            )
            .unwrap();
        let committed = micros_now();
        let (seq, started) = handled.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(seq, a.seq);
        lat.push(((started - committed).max(0)) as f64 / 1e3);
    }
    lat
}

/// Registers on `e` an action that reports when its handler starts (the
/// run's id and the wall clock in µs), and starts its threads.
pub(crate) fn handle<B: Backend>(e: &Engine<B>) -> mpsc::Receiver<(String, i64)> {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    e.register_action("mark", move |run, _| {
        let now = micros_now();
        let _ = tx.lock().unwrap().send((run.id.clone(), now));
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    rx
}

/// `samples` enqueues on `e`, each on an idle engine — once the last
/// one's run ended and its executors had `IDLE` to go back to waiting for
/// work — or, `back_to_back`, each as soon as the last one's handler
/// started (its executor still busy settling it): the milliseconds from
/// each `Engine::enqueue` call to its handler's start (the call's commit
/// included: a run handed over at its insert can start before the call
/// returns).
pub(crate) fn measure_enqueues<B: Backend>(
    e: &Engine<B>,
    handled: &mpsc::Receiver<(String, i64)>,
    samples: usize,
    back_to_back: bool,
) -> Vec<f64> {
    const IDLE: Duration = Duration::from_millis(3);
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        let called = micros_now();
        let q = e.enqueue(&Enqueue::new("mark", &i)).unwrap();
        let (id, started) = handled.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(id, q.id);
        lat.push(((started - called).max(0)) as f64 / 1e3);
        if !back_to_back {
            e.wait_for_run(&q.id, Duration::from_secs(30)).unwrap();
            std::thread::sleep(IDLE);
        }
    }
    lat
}

fn raw_commit_ms(ctx: &Ctx, name: &str, samples: usize) -> f64 {
    let conn = raw::open(&ctx.db(name), ctx.sync);
    let mut v: Vec<f64> = (0..samples)
        .map(|i| {
            let t = Instant::now();
            raw::insert_one(&conn, i);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    percentile(&mut v, 0.5)
}

pub fn latency_inprocess(ctx: &Ctx) -> Vec<Figure> {
    let samples = ctx.n(200, 1_000);
    let baseline = raw_commit_ms(ctx, "latency-in-raw", samples);
    let (e, handled) = reacting_engine(ctx, "latency-in");
    let mut lat = measure(&e, &handled, samples);
    e.shutdown();
    vec![
        Figure::new(
            "latency_inprocess_p50_ms",
            percentile(&mut lat, 0.5),
            "ms",
            baseline,
        ),
        Figure::new(
            "latency_inprocess_p99_ms",
            percentile(&mut lat, 0.99),
            "ms",
            baseline,
        ),
    ]
}

/// From an `Engine::enqueue` call to its handler's start, on an idle
/// started engine (the path a job queue's latency is: no rule between;
/// see [`measure_enqueues`]). Baseline: the median latency of one raw
/// durable commit, which the call's commit pays.
pub fn latency_enqueue(ctx: &Ctx) -> Vec<Figure> {
    let samples = ctx.n(200, 1_000);
    let baseline = raw_commit_ms(ctx, "latency-enq-raw", samples);
    let e = Engine::builder(ctx.db("latency-enq"))
        .synchronous(ctx.sync)
        .open()
        .unwrap();
    let handled = handle(&e);
    let mut lat = measure_enqueues(&e, &handled, samples, false);
    e.shutdown();
    vec![
        Figure::new(
            "latency_enqueue_p50_ms",
            percentile(&mut lat, 0.5),
            "ms",
            baseline,
        ),
        Figure::new(
            "latency_enqueue_p99_ms",
            percentile(&mut lat, 0.99),
            "ms",
            baseline,
        ),
    ]
}

/// The child process: appends one event every 20 ms, printing each seq and
/// the wall clock (µs) right after its commit.
pub fn child_append(db: &Path) {
    let samples: usize = std::env::var("REFLEXR_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let e = Engine::open(db).unwrap();
    for i in 0..samples {
        let a = e
            .append(
                "bench",
                &NewEvent::new("tick", format!("c/{i}"), "child", 0),
            )
            .unwrap();
        println!("{} {}", a.seq, micros_now());
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn latency_crossprocess(ctx: &Ctx) -> Vec<Figure> {
    let samples = ctx.n(100, 300);
    let baseline = raw_commit_ms(ctx, "latency-cross-raw", samples);
    let (e, handled) = reacting_engine(ctx, "latency-cross");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--child-append")
        .arg(e.path())
        .env("REFLEXR_BENCH_SAMPLES", samples.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let committed: Vec<(i64, i64)> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect();
    assert!(
        child.wait().unwrap().success(),
        "the appending child failed"
    );
    let mut started = std::collections::HashMap::new();
    while started.len() < committed.len() {
        let (seq, at) = handled.recv_timeout(Duration::from_secs(30)).unwrap();
        started.insert(seq, at);
    }
    e.shutdown();
    let mut lat: Vec<f64> = committed
        .iter()
        .map(|(seq, at)| ((started[seq] - at).max(0)) as f64 / 1e3)
        .collect();
    vec![Figure::new(
        "latency_crossprocess_p50_ms",
        percentile(&mut lat, 0.5),
        "ms",
        baseline,
    )]
}
