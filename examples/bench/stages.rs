//! The stages: each returns its figures, baseline measured alongside.

use std::time::Instant;

use reflexr::{Engine, NewEvent};

use super::{Ctx, Figure, rate, raw};

type Stage = fn(&Ctx) -> Vec<Figure>;

/// Every stage, in the order the table prints them.
pub const ALL: &[(&str, Stage)] = &[
    ("append_single", append_single),
    ("append_concurrent16", append_concurrent16),
    ("append_batch1000", append_batch1000),
];

fn engine(ctx: &Ctx, name: &str) -> Engine {
    let engine = Engine::builder(ctx.db(name))
        .synchronous(ctx.sync)
        .open()
        .unwrap();
    engine.ensure_workspace("bench", &["tick"]).unwrap();
    engine
}

fn event(i: usize) -> NewEvent {
    NewEvent::new(
        "tick",
        format!("tick/{i}"),
        "bench",
        1_800_000_000_000 + i as i64,
    )
    .payload_json(raw::payload(i))
}

/// The median of `runs` measurements (one in quick mode): the machines are
/// shared, and one slow run should not be the figure.
fn median(ctx: &Ctx, runs: usize, mut f: impl FnMut(usize) -> f64) -> f64 {
    let runs = if ctx.quick { 1 } else { runs };
    let mut v: Vec<f64> = (0..runs).map(&mut f).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One event per transaction, one caller.
fn append_single(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(2_000, 10_000);
    let baseline = median(ctx, 3, |r| {
        raw::batched(&ctx.db(&format!("single-raw-{r}")), ctx.sync, n, 1)
    });
    let value = median(ctx, 3, |r| {
        let engine = engine(ctx, &format!("single-{r}"));
        let start = Instant::now();
        for i in 0..n {
            engine.append("bench", &event(i)).unwrap();
        }
        rate(n, start.elapsed())
    });
    vec![Figure::new("append_single", value, "events/s", baseline)]
}

/// 16 threads, each appending one event at a time and waiting for its commit.
fn append_concurrent16(ctx: &Ctx) -> Vec<Figure> {
    const CALLERS: usize = 16;
    let each = ctx.n(250, 2_000);
    let baseline = median(ctx, 3, |r| {
        raw::group_commit(&ctx.db(&format!("c16-raw-{r}")), ctx.sync, CALLERS, each)
    });
    let value = median(ctx, 3, |r| {
        let engine = engine(ctx, &format!("c16-{r}"));
        let start = Instant::now();
        let threads: Vec<_> = (0..CALLERS)
            .map(|c| {
                let engine = engine.clone();
                std::thread::spawn(move || {
                    for k in 0..each {
                        engine.append("bench", &event(c * each + k)).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        rate(CALLERS * each, start.elapsed())
    });
    vec![Figure::new(
        "append_concurrent16",
        value,
        "events/s",
        baseline,
    )]
}

/// 1,000 events per transaction.
fn append_batch1000(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(50_000, 300_000);
    let baseline = median(ctx, 3, |r| {
        raw::batched(&ctx.db(&format!("b1000-raw-{r}")), ctx.sync, n, 1_000)
    });
    let value = median(ctx, 3, |r| {
        let engine = engine(ctx, &format!("b1000-{r}"));
        let start = Instant::now();
        for chunk in 0..n / 1_000 {
            engine
                .write(|tx| {
                    for k in 0..1_000 {
                        tx.append("bench", &event(chunk * 1_000 + k))?;
                    }
                    Ok(())
                })
                .unwrap();
        }
        rate(n, start.elapsed())
    });
    vec![Figure::new("append_batch1000", value, "events/s", baseline)]
}
