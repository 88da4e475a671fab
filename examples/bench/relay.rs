//! Followers: events per second through a follower, in one file and across
//! two; baseline: a raw batched INSERT of as many rows.

use std::time::Instant;

use reflexr::{Engine, Follow};

use super::stages::{append_in_thousands, engine, event};
use super::{Ctx, Figure, rate, raw};

fn fill(e: &Engine, n: usize) {
    append_in_thousands(e, 0, n, event);
}

/// A follower publishing every event into another workspace of the file.
pub fn relay_same_file(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(20_000, 100_000);
    let baseline = raw::batched(&ctx.db("relay-same-raw"), ctx.sync, n, 1_000);
    let e = engine(ctx, "relay-same");
    e.ensure_workspace("copy", &["tick"]).unwrap();
    fill(&e, n);
    e.follow(Follow::new("bench", "copy")).unwrap();
    let start = Instant::now();
    assert_eq!(e.run_until_idle().unwrap().followed, n);
    let value = rate(n, start.elapsed());
    vec![Figure::new("relay_same_file", value, "events/s", baseline)]
}

/// A follower publishing every event into a workspace of another file.
pub fn relay_cross_file(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(20_000, 100_000);
    let baseline = raw::batched(&ctx.db("relay-cross-raw"), ctx.sync, n, 1_000);
    let hub = Engine::builder(ctx.db("relay-hub"))
        .synchronous(ctx.sync)
        .open()
        .unwrap();
    hub.ensure_workspace("fleet", &["tick"]).unwrap();
    let e = engine(ctx, "relay-edge");
    fill(&e, n);
    e.follow(Follow::new("bench", "fleet").to_file(hub.path()))
        .unwrap();
    let start = Instant::now();
    assert_eq!(e.run_until_idle().unwrap().followed, n);
    let value = rate(n, start.elapsed());
    vec![Figure::new("relay_cross_file", value, "events/s", baseline)]
}
