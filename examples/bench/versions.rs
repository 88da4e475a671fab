//! Event-store appends: an append that expects its subject's version
//! against one that does not, and a subject's stream read in a long log
//! against a short one.

use std::collections::HashMap;
use std::time::Instant;

use reflexr::Engine;
use reflexr::rusqlite::{Connection, params};

use super::stages::{engine, median};
use super::{Ctx, Figure, rate};

/// One event per transaction, one caller, each expecting the version its
/// subject (one of 100, in turn) is at. Baseline: `append_single` of this
/// run (the same events, no expectation).
pub fn append_expected_version(ctx: &Ctx) -> Vec<Figure> {
    let baseline = ctx.figure("append_single");
    let n = ctx.n(2_000, 10_000);
    let value = median(ctx, 3, |r| {
        let engine = engine(ctx, &format!("expected-{r}"));
        let mut versions: HashMap<usize, i64> = HashMap::new();
        let start = Instant::now();
        for i in 0..n {
            let subject = i % 100;
            let at = versions.entry(subject).or_insert(0);
            let ev = reflexr::NewEvent::new("tick", format!("tick/{subject}"), "bench", 1)
                .payload_json(super::raw::payload(i))
                .expect_version(*at);
            *at = engine.append("bench", &ev).unwrap().version;
        }
        rate(n, start.elapsed())
    });
    vec![Figure::new(
        "append_expected_version",
        value,
        "events/s",
        baseline,
    )]
}

/// A file of `events` events about `events / 10` subjects, ten each, a
/// subject's ten one after another (a session's burst of changes), written
/// straight into the engine's table: the log a long-lived application
/// reaches, made in seconds rather than by appending.
fn log_of(ctx: &Ctx, name: &str, events: usize) -> Engine {
    let path = ctx.db(name);
    drop(engine(ctx, name));
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "synchronous", "OFF").unwrap();
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1) \
         INSERT INTO reflexr_events (workspace, id, type, subject, version, actor, \
           occurred_at, recorded_at, payload) \
         SELECT 'bench', printf('e-%09d', i), 'tick', printf('sub/%08d', i / 10), i % 10 + 1, \
           'bench', \
           1800000000000 + i, 1800000000000 + i, \
           '{\"n\":' || i || ',\"note\":\"a small event payload of about sixty bytes\"}' \
         FROM n",
        params![events as i64],
    )
    .unwrap();
    drop(conn);
    Engine::builder(&path).open().unwrap()
}

/// Subjects' streams read per second (all ten events of a subject each) in
/// a log of 10 million events (1 million in quick mode), against the same
/// reads in a log of 10,000 events, measured alongside. Two figures: the
/// 1,000 subjects written last (a working set of the same size in both
/// logs: what the index's cost does with the log's length), and subjects
/// drawn from the whole log (the whole file as the working set: what the
/// memory hierarchy adds on top).
pub fn read_subject_10m(ctx: &Ctx) -> Vec<Figure> {
    let big = ctx.n(1_000_000, 10_000_000);
    let reads = ctx.n(20_000, 100_000);
    // Reads of `reads` random subjects among the last `span` of `events / 10`.
    let measure = |engine: &Engine, events: usize, span: usize| -> f64 {
        let subjects = events / 10;
        let first = subjects - span.min(subjects);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("sub/{:08}", first as u64 + x % (subjects - first) as u64)
        };
        // Warm: the first reads bring the index's upper pages in.
        for _ in 0..1_000 {
            engine.read_subject("bench", &next(), 1, 100).unwrap();
        }
        let start = Instant::now();
        for _ in 0..reads {
            let stream = engine.read_subject("bench", &next(), 1, 100).unwrap();
            assert_eq!(stream.len(), 10);
        }
        rate(reads, start.elapsed())
    };
    let small = log_of(ctx, "subjects-10k", 10_000);
    let large = log_of(ctx, "subjects-10m", big);
    // Side by side, twice each, alternating: the better of each pair.
    let mut figures = Vec::new();
    for (name, span) in [
        ("read_subject_10m", 1_000),
        ("read_subject_10m_whole_log", usize::MAX),
    ] {
        let (mut baseline, mut value): (f64, f64) = (0.0, 0.0);
        for _ in 0..2 {
            baseline = baseline.max(measure(&small, 10_000, span));
            value = value.max(measure(&large, big, span));
        }
        figures.push(Figure::new(name, value, "reads/s", baseline));
    }
    figures
}
