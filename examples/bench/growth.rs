//! How cost grows with the file: each rate measured on a file with 10,000
//! events (and as many finished runs) already in it, and on one with
//! 1,000,000 (10,000,000 in full mode); the figure is the big file's rate,
//! the baseline the small file's. And the process's peak memory once it has
//! worked on the 1M-event file.

use std::time::Instant;

use reflexr::{Decision, Engine, Rule, Scope, Start};

use super::stages::{append_in_thousands, event, run_rate};
use super::{Ctx, Figure, peak_rss_mib, rate, raw};

struct Rates {
    append: f64,
    evaluate: f64,
    runs: f64,
}

fn measure(ctx: &Ctx, size: usize) -> Rates {
    let name = format!("growth-{size}");
    let path = ctx.db(&name);
    {
        let e = Engine::builder(&path).synchronous(ctx.sync).open().unwrap();
        e.ensure_workspace("bench", &["tick"]).unwrap();
    }
    raw::prefill(&path, size, true);
    let e = Engine::builder(&path).synchronous(ctx.sync).open().unwrap();

    // Appends: 20,000 in transactions of 1,000.
    let n = 20_000;
    let start = Instant::now();
    append_in_thousands(&e, size, n, event);
    let append = rate(n, start.elapsed());

    // Evaluation: a stateful rule from the head, over 20,000 new events.
    #[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
    struct Count {
        n: u64,
    }
    e.register_rule(
        Rule::new("growth", "bench")
            .on(["tick"])
            .scope(Scope::payload("n"))
            .start(Start::Head)
            .action("none")
            .decide_with_state(Count::default(), |_, s| {
                s.n += 1;
                Ok(Decision::Skip)
            }),
    )
    .unwrap();
    append_in_thousands(&e, size + n, n, event);
    let start = Instant::now();
    assert_eq!(e.run_until_idle().unwrap().decided, n);
    let evaluate = rate(n, start.elapsed());
    drop(e);

    // Runs: 3,000 no-op runs, one executor, beside the finished ones.
    let runs = run_rate(ctx, &name, 1, 3_000, |_| {});
    Rates {
        append,
        evaluate,
        runs,
    }
}

pub fn growth(ctx: &Ctx) -> Vec<Figure> {
    let rss_before = peak_rss_mib();
    let small = measure(ctx, 10_000);
    let million = measure(ctx, 1_000_000);
    let rss = peak_rss_mib();
    let big = if ctx.quick {
        million
    } else {
        measure(ctx, 10_000_000)
    };
    vec![
        Figure::new("growth_append", big.append, "events/s", small.append),
        Figure::new("growth_evaluate", big.evaluate, "events/s", small.evaluate),
        Figure::new("growth_runs", big.runs, "runs/s", small.runs),
        Figure::new("rss_mib_1m", rss, "MiB", rss_before),
    ]
}
