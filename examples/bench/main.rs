//! The yardstick for every performance claim: each stage of reflexr measured
//! side by side, in the same run, with raw SQLite doing the same work.
//!
//! ```text
//! cargo run --release --example bench -- [--quick] [--json PATH] [--synchronous normal]
//! cargo run --release --example bench --features postgres -- --backend postgres|both [--postgres URL]
//! ```
//!
//! Every result has a `baseline` measured in this run on this machine, and
//! `ratio = value / baseline`. Rates are per second (higher is better).

mod admin;
mod growth;
mod keys;
mod latency;
#[cfg(feature = "otlp")]
mod otel;
#[cfg(feature = "postgres")]
mod pg;
mod raw;
mod relay;
mod slow;
mod stages;
mod versions;
mod workflow;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use reflexr::Synchronous;
use serde::Serialize;

#[derive(Parser, Debug)]
#[command(about = "reflexr benchmarks, side by side with raw SQLite")]
struct Args {
    /// Smaller counts: finishes in well under two minutes on 2 cores.
    #[arg(long)]
    quick: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// full (the default) or normal.
    #[arg(long, default_value = "full")]
    synchronous: String,
    /// Run only the stages whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// sqlite (the default); postgres (feature `postgres`): the
    /// PostgreSQL stages, against the server `--postgres` names; both: the
    /// PostgreSQL stages after SQLite's append and runs stages, in one run.
    #[arg(long, default_value = "sqlite")]
    backend: String,
    /// The PostgreSQL server for `--backend postgres` (a libpq string or a
    /// URL); default: the REFLEXR_PG_URL environment variable.
    #[arg(long)]
    postgres: Option<String>,
    /// (Internal) the child process of the cross-process latency stage.
    #[arg(long, hide = true)]
    child_append: Option<PathBuf>,
    /// (Internal) the second process of the slow-handler stages: the file
    /// whose runs it works.
    #[arg(long, hide = true)]
    child_slow_runs: Option<PathBuf>,
    /// (Internal) a child process of `pg_runs_4processes`: the PostgreSQL
    /// config of the schema whose runs it executes.
    #[arg(long, hide = true)]
    child_pg_runs: Option<String>,
}

/// One measured figure, as the JSON reports it.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    pub unit: String,
    pub baseline: f64,
    pub ratio: f64,
}

impl Figure {
    pub fn new(name: &str, value: f64, unit: &str, baseline: f64) -> Figure {
        Figure {
            name: name.into(),
            value,
            unit: unit.into(),
            baseline,
            ratio: if baseline > 0.0 {
                value / baseline
            } else {
                0.0
            },
        }
    }
}

/// The run's settings, handed to every stage.
pub struct Ctx {
    pub quick: bool,
    pub sync: Synchronous,
    pub dir: tempfile::TempDir,
    /// Figures of the stages run so far, for stages whose baseline is
    /// another stage's figure.
    pub done: std::cell::RefCell<std::collections::BTreeMap<String, f64>>,
}

impl Ctx {
    /// A fresh database path for one measurement.
    pub fn db(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.db"))
    }

    /// The figure of a stage run earlier in this run (running it now if it
    /// was not: `--only` may have skipped it).
    pub fn figure(&self, name: &str) -> f64 {
        if let Some(v) = self.done.borrow().get(name) {
            return *v;
        }
        let stage = stages::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a stage of that name")
            .1;
        let figs = stage(self);
        let v = figs
            .iter()
            .find(|f| f.name == name)
            .expect("its figure")
            .value;
        self.done.borrow_mut().insert(name.into(), v);
        v
    }

    /// `quick` or `full` counts.
    pub fn n(&self, quick: usize, full: usize) -> usize {
        if self.quick { quick } else { full }
    }
}

#[derive(Serialize)]
struct Report<'a> {
    mode: &'a str,
    synchronous: &'a str,
    results: &'a [Figure],
}

/// Events per second for `n` events done in `elapsed`.
pub fn rate(n: usize, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64()
}

/// Peak resident memory of this process so far, in MiB (Linux).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The machine's floor: 4 KiB writes each followed by fdatasync.
fn fdatasync_rate(ctx: &Ctx) -> f64 {
    use std::io::Write;
    let path = ctx.dir.path().join("fsync.bin");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = [0x5Au8; 4096];
    let budget = Duration::from_millis(if ctx.quick { 500 } else { 2_000 });
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < budget {
        f.write_all(&block).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    rate(n, start.elapsed())
}

/// A stage, as the run calls it.
type StageFn = Box<dyn Fn(&Ctx) -> Vec<Figure>>;

fn main() {
    env_logger::init();
    let args = Args::parse();
    if let Some(db) = &args.child_append {
        latency::child_append(db);
        return;
    }
    if let Some(db) = &args.child_slow_runs {
        slow::child_slow_runs(db);
        return;
    }
    #[cfg(feature = "postgres")]
    if let Some(config) = &args.child_pg_runs {
        pg::child_runs(config);
        return;
    }
    #[cfg(not(feature = "postgres"))]
    if args.child_pg_runs.is_some() {
        eprintln!("--child-pg-runs needs the feature postgres");
        std::process::exit(2);
    }
    let sync = match args.synchronous.to_ascii_lowercase().as_str() {
        "full" => Synchronous::Full,
        "normal" => Synchronous::Normal,
        other => {
            eprintln!("--synchronous must be full or normal, not {other:?}");
            std::process::exit(2);
        }
    };
    let ctx = Ctx {
        quick: args.quick,
        sync,
        dir: tempfile::tempdir().expect("temp dir"),
        done: Default::default(),
    };
    let mode = if ctx.quick { "quick" } else { "full" };
    println!(
        "reflexr bench: mode {mode}, synchronous {}, files in {}",
        sync.as_str(),
        ctx.dir.path().display()
    );
    let floor = fdatasync_rate(&ctx);
    println!("raw 4 KiB write + fdatasync: {floor:.0}/s (the floor under every durable commit)\n");

    let started = Instant::now();
    let mut results = Vec::new();
    println!(
        "{:<28} {:>14} {:<10} {:>14} {:>8}",
        "name", "value", "unit", "baseline", "ratio"
    );
    let stages: Vec<(String, StageFn)> = match args.backend.as_str() {
        "sqlite" => stages::ALL
            .iter()
            .map(|(n, s)| (n.to_string(), Box::new(*s) as StageFn))
            .collect(),
        #[cfg(feature = "postgres")]
        backend @ ("postgres" | "both") => {
            let url = args
                .postgres
                .clone()
                .or_else(|| std::env::var("REFLEXR_PG_URL").ok())
                .unwrap_or_else(|| {
                    eprintln!("--backend {backend} needs --postgres URL or REFLEXR_PG_URL");
                    std::process::exit(2);
                });
            let mut stages: Vec<(String, StageFn)> = Vec::new();
            if backend == "both" {
                // SQLite's stages of the same work, in the same run.
                let same = |n: &str| n.starts_with("append_") || n == "runs_4executors";
                for (n, s) in stages::ALL.iter().filter(|(n, _)| same(n)) {
                    stages.push((n.to_string(), Box::new(*s) as StageFn));
                }
            }
            for (n, s) in pg::ALL {
                let url = url.clone();
                stages.push((
                    n.to_string(),
                    Box::new(move |ctx: &Ctx| s(&url, ctx)) as StageFn,
                ));
            }
            stages
        }
        other => {
            eprintln!(
                "--backend must be sqlite, or postgres or both (feature `postgres`), not {other:?}"
            );
            std::process::exit(2);
        }
    };
    for (name, stage) in &stages {
        if let Some(only) = &args.only
            && !name.contains(only.as_str())
        {
            continue;
        }
        for fig in stage(&ctx) {
            ctx.done.borrow_mut().insert(fig.name.clone(), fig.value);
            println!(
                "{:<28} {:>14.1} {:<10} {:>14.1} {:>8.2}",
                fig.name, fig.value, fig.unit, fig.baseline, fig.ratio
            );
            results.push(fig);
        }
    }
    results.push(Figure::new("fdatasync_floor", floor, "ops/s", floor));
    println!("\ndone in {:.1} s", started.elapsed().as_secs_f64());

    if let Some(path) = args.json {
        let report = Report {
            mode,
            synchronous: sync.as_str(),
            results: &results,
        };
        let text = serde_json::to_string_pretty(&report).unwrap();
        std::fs::write(&path, text).expect("write the JSON report");
        println!("wrote {}", path.display());
    }
}
