//! Flow control by key: a fair action's claims over a thousand keys with a
//! skewed backlog, and batch actions, against the plain runs of the same
//! run.

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use reflexr::{ActionConfig, Engine, Enqueue};

use super::{Ctx, Figure, rate};

/// Enqueued runs of `action` per second: `n` runs enqueued by `prefill`
/// before the clock starts, drained by `executors` threads with the
/// handler `register` gives (it calls `done` once per run handled).
fn drain_rate(
    ctx: &Ctx,
    name: &str,
    executors: usize,
    n: usize,
    prefill: impl FnOnce(&Engine),
    register: impl FnOnce(&Engine, Arc<dyn Fn(usize) + Send + Sync>),
) -> f64 {
    let path = ctx.db(name);
    let engine = Engine::builder(&path)
        .synchronous(ctx.sync)
        .executors(executors)
        .open()
        .unwrap();
    prefill(&engine);
    let handled = Arc::new(AtomicUsize::new(0));
    let (all_tx, all) = mpsc::channel();
    let all_tx = Mutex::new(all_tx);
    let h = Arc::clone(&handled);
    let done: Arc<dyn Fn(usize) + Send + Sync> = Arc::new(move |k| {
        let before = h.fetch_add(k, AtomicOrdering::SeqCst);
        if before < n && before + k >= n {
            all_tx.lock().unwrap().send(()).unwrap();
        }
    });
    register(&engine, done);
    let start = Instant::now();
    engine.start().unwrap();
    all.recv_timeout(Duration::from_secs(600)).unwrap();
    while !engine
        .runs(Some(reflexr::RunState::Running), 1)
        .unwrap()
        .is_empty()
    {
        std::thread::yield_now();
    }
    let value = rate(n, start.elapsed());
    engine.shutdown();
    value
}

/// `n` runs of `action`, in transactions of a thousand, each with the
/// input `input(i)`.
fn enqueue_all(
    engine: &Engine,
    action: &str,
    n: usize,
    input: impl Fn(usize) -> serde_json::Value + Sync,
) {
    for chunk in 0..n.div_ceil(1_000) {
        engine
            .write(|tx| {
                for i in chunk * 1_000..((chunk + 1) * 1_000).min(n) {
                    tx.enqueue(&Enqueue::new(action, &input(i)))?;
                }
                Ok(())
            })
            .unwrap();
    }
}

/// No-op runs of a fair action, four executors, over 1,000 keys with a
/// skewed backlog (key k has a share of about 1 / (k + 1): the first key a
/// seventh of the runs, most keys a handful), in two arrival orders: at
/// random (`runs_4executors_fair_1000keys`), where the fair order takes the
/// runs far from the order they were written in, so each claim of a few
/// hundred touches a page or more per run; and already in turn by key
/// (`…_in_turn`: one run of each key that has some left, then again), where
/// the fair order is the table's. Baseline: `runs_4executors` of this run
/// (no-op runs of an action without keys, taken in the order written).
pub(crate) fn runs_4executors_fair_1000keys(ctx: &Ctx) -> Vec<Figure> {
    let baseline = ctx.figure("runs_4executors");
    let n = ctx.n(5_000, 20_000);
    // Key k's share: 1 / (k + 1), over the harmonic number of 1,000.
    let harmonic: f64 = (1..=1_000).map(|k| 1.0 / k as f64).sum();
    let mut shares: Vec<usize> = (0..1_000usize)
        .map(|k| (n as f64 / harmonic / (k + 1) as f64).round().max(1.0) as usize)
        .collect();
    while shares.iter().sum::<usize>() > n {
        let top = (0..1_000).max_by_key(|k| shares[*k]).unwrap_or(0);
        shares[top] -= 1;
    }
    let mut in_turn = Vec::with_capacity(n);
    let mut left = shares.clone();
    while in_turn.len() < shares.iter().sum::<usize>() {
        for (k, l) in left.iter_mut().enumerate() {
            if *l > 0 {
                *l -= 1;
                in_turn.push(k);
            }
        }
    }
    let mut at_random = in_turn.clone();
    fastrand::shuffle(&mut at_random);
    let measure = |name: &str, keys: &[usize]| {
        let n = keys.len();
        let value = drain_rate(
            ctx,
            name,
            4,
            n,
            |e| {
                e.configure_action(&ActionConfig::new("noop").partition_by("tenant").fair())
                    .unwrap();
                enqueue_all(e, "noop", n, |i| serde_json::json!({ "tenant": keys[i] }));
            },
            |e, done| {
                e.register_action("noop", move |_, _| {
                    done(1);
                    Ok(())
                })
                .unwrap();
            },
        );
        Figure::new(name, value, "runs/s", baseline)
    };
    vec![
        measure("runs_4executors_fair_1000keys", &at_random),
        measure("runs_4executors_fair_1000keys_in_turn", &in_turn),
    ]
}

/// What one call to the outside world costs the handlers of the batch
/// stages (a bulk email API's round trip, say).
const CALL: Duration = Duration::from_millis(1);

/// Runs of an action whose handler makes one call of [`CALL`] per call,
/// four executors: a batch action taking up to 100 runs a call, against
/// the same work one run a call (`runs_4executors_call_1ms`, measured in
/// this stage) — what batching is for. And the same with no-op handlers
/// (`batch_action_100_noop`), against `runs_4executors` of this run: what
/// the batch's bookkeeping costs when calls cost nothing.
pub(crate) fn batch_action_100(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(5_000, 20_000);
    let one_by_one = {
        let n = ctx.n(1_000, 4_000);
        drain_rate(
            ctx,
            "runs_4executors_call_1ms",
            4,
            n,
            |e| enqueue_all(e, "mail", n, |i| serde_json::json!(i)),
            |e, done| {
                e.register_action("mail", move |_, _| {
                    std::thread::sleep(CALL);
                    done(1);
                    Ok(())
                })
                .unwrap();
            },
        )
    };
    let batched = drain_rate(
        ctx,
        "batch_action_100",
        4,
        n,
        |e| enqueue_all(e, "mail", n, |i| serde_json::json!(i)),
        |e, done| {
            e.register_batch_action("mail", 100, move |batch| {
                std::thread::sleep(CALL);
                done(batch.len());
                batch.iter().map(|_| Ok(())).collect()
            })
            .unwrap();
        },
    );
    let noop = drain_rate(
        ctx,
        "batch_action_100_noop",
        4,
        n,
        |e| enqueue_all(e, "mail", n, |i| serde_json::json!(i)),
        |e, done| {
            e.register_batch_action("mail", 100, move |batch| {
                done(batch.len());
                batch.iter().map(|_| Ok(())).collect()
            })
            .unwrap();
        },
    );
    vec![
        Figure::new("runs_4executors_call_1ms", one_by_one, "runs/s", one_by_one),
        Figure::new("batch_action_100", batched, "runs/s", one_by_one),
        Figure::new(
            "batch_action_100_noop",
            noop,
            "runs/s",
            ctx.figure("runs_4executors"),
        ),
    ]
}
