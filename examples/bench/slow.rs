//! Handlers that take real time: 20 ms each, like a call to a provider,
//! worked by two processes of four executors on one file. The baseline is
//! the ideal — every executor (or every slot of a limit) busy all the time:
//! executors ÷ duration — so the ratio says how much of the executors'
//! time claims, settlements and idle waits take, and whether a claim hoards
//! runs another executor could have started.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reflexr::{ActionConfig, Engine, Enqueue};

use super::{Ctx, Figure, rate};

/// How long each handler takes.
const HANDLER: Duration = Duration::from_millis(20);

/// Executors per process (two processes).
const EXECUTORS: usize = 4;

fn open(path: &Path, sync: reflexr::Synchronous) -> Engine {
    let e = Engine::builder(path)
        .synchronous(sync)
        .executors(EXECUTORS)
        .open()
        .unwrap();
    e.register_action("slow", |_, _| {
        std::thread::sleep(HANDLER);
        Ok(())
    })
    .unwrap();
    e
}

/// The second process: works the file's runs, in the durability mode the
/// parent names (`REFLEXR_BENCH_SYNC`), until its stdin closes.
pub fn child_slow_runs(db: &Path) {
    let sync = match std::env::var("REFLEXR_BENCH_SYNC").as_deref() {
        Ok("NORMAL") => reflexr::Synchronous::Normal,
        _ => reflexr::Synchronous::Full,
    };
    let e = open(db, sync);
    e.start().unwrap();
    println!("started");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    e.shutdown();
}

/// `n` runs of `slow` (with `limit` as its `max_running`, if any) worked by
/// two processes: runs per second from both started to the last settled.
fn two_processes(ctx: &Ctx, name: &str, n: usize, limit: Option<u32>) -> f64 {
    let path = ctx.db(name);
    {
        let e = Engine::builder(&path).synchronous(ctx.sync).open().unwrap();
        if let Some(limit) = limit {
            e.configure_action(&ActionConfig::new("slow").max_running(limit))
                .unwrap();
        }
        e.write(|tx| {
            for i in 0..n {
                tx.enqueue(&Enqueue::new("slow", &i))?;
            }
            Ok(())
        })
        .unwrap();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--child-slow-runs")
        .arg(&path)
        .env("REFLEXR_BENCH_SYNC", ctx.sync.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "started", "the second process did not start");
    let e = open(&path, ctx.sync);
    let start = Instant::now();
    e.start().unwrap();
    let watch = e.watch();
    let left = || {
        e.with_reader(|c| {
            Ok(c.query_row(
                "SELECT count(*) FROM reflexr_runs WHERE state != 'succeeded'",
                [],
                |r| r.get::<_, i64>(0),
            )?)
        })
        .unwrap()
    };
    while left() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "{name}: too slow"
        );
        watch.wait(Duration::from_millis(5));
    }
    let value = rate(n, start.elapsed());
    e.shutdown();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "the second process failed");
    value
}

/// `runs_slow_handlers_8executors`: two processes of four executors,
/// handlers of 20 ms; baseline 8 ÷ 20 ms.
pub fn runs_slow_handlers_8executors(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(400, 2_000);
    let value = two_processes(ctx, "runs_slow_handlers_8executors", n, None);
    let ideal = (2 * EXECUTORS) as f64 / HANDLER.as_secs_f64();
    vec![Figure::new(
        "runs_slow_handlers_8executors",
        value,
        "runs/s",
        ideal,
    )]
}

/// `runs_limited_slow`: the same under `max_running(4)`; baseline 4 ÷ 20 ms.
pub fn runs_limited_slow(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(200, 1_000);
    let value = two_processes(ctx, "runs_limited_slow", n, Some(4));
    let ideal = 4.0 / HANDLER.as_secs_f64();
    vec![Figure::new("runs_limited_slow", value, "runs/s", ideal)]
}
