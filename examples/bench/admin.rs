//! The administration server: a page of events over HTTP against the same
//! read in-process, and the WebSocket tail against the append rate.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use reflexr::{Engine, Query};
use reflexr_admin::AdminConfig;
use serde_json::{Value, json};
use tungstenite::Message;

use super::stages::{append_in_thousands, engine, event};
use super::{Ctx, Figure, rate};

/// An engine holding `n` events, appended 1,000 to a transaction.
fn filled(ctx: &Ctx, name: &str, n: usize) -> Engine {
    let engine = engine(ctx, name);
    append_batches(&engine, 0, n);
    engine
}

fn append_batches(engine: &Engine, from: usize, n: usize) {
    append_in_thousands(engine, from, n, event);
}

/// What the client makes of a page: it reads every byte and counts the
/// events, without building them.
#[derive(serde::Deserialize)]
struct Page {
    events: Vec<serde::de::IgnoredAny>,
}

/// Pages of 100 events per second: one keep-alive HTTP client walking the
/// log with `after`, against `Engine::read` of the same pages in-process.
pub fn admin_events_page_rps(ctx: &Ctx) -> Vec<Figure> {
    const EVENTS: usize = 20_000;
    let pages = ctx.n(1_000, 5_000);
    let engine = filled(ctx, "admin-page", EVENTS);
    // Page k starts after seq (k * 100) mod EVENTS: every page is full.
    let after = |k: usize| ((k * 100) % (EVENTS - 100)) as i64;

    let start = Instant::now();
    let mut seen = 0;
    for k in 0..pages {
        let page = engine
            .read(&Query::new("bench").after(after(k)).limit(100))
            .unwrap();
        seen += page.len();
    }
    let baseline = rate(pages, start.elapsed());
    assert_eq!(seen, pages * 100);

    let server = reflexr_admin::AdminServer::start(
        &engine,
        AdminConfig::new().listen("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let base = format!(
        "http://{}/api/v1/workspaces/bench/events",
        server.local_addr()
    );
    let start = Instant::now();
    let mut seen = 0;
    for k in 0..pages {
        let body: Page = agent
            .get(format!("{base}?after={}&limit=100", after(k)))
            .call()
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap();
        seen += body.events.len();
    }
    let value = rate(pages, start.elapsed());
    assert_eq!(seen, pages * 100, "every page came back full");
    server.shutdown();
    vec![Figure::new(
        "admin_events_page_rps",
        value,
        "pages/s",
        baseline,
    )]
}

/// Events per second delivered to one WebSocket subscriber while the
/// application appends in batches of 1,000: from the first append to the
/// last event in the client's hands. Baseline: the same appends with no
/// server at all.
pub fn ws_tail_events_per_s(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(50_000, 200_000);
    let quiet = engine(ctx, "ws-tail-quiet");
    let start = Instant::now();
    append_batches(&quiet, 0, n);
    let baseline = rate(n, start.elapsed());
    drop(quiet);

    let engine = engine(ctx, "ws-tail");
    let server = reflexr_admin::AdminServer::start(
        &engine,
        AdminConfig::new().listen("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    let addr = server.local_addr();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (mut ws, _) = tungstenite::client(format!("ws://{addr}/api/v1/stream"), tcp).unwrap();
    ws.send(Message::text(
        json!({ "op": "subscribe", "id": "tail", "topic": "events", "workspace": "bench", "after": 0 })
            .to_string(),
    ))
    .unwrap();
    loop {
        let m = next(&mut ws);
        assert_ne!(m["type"], "error", "{m}");
        if m["type"] == "subscribed" {
            break;
        }
    }

    let start = Instant::now();
    let appender = {
        let engine = engine.clone();
        std::thread::spawn(move || append_batches(&engine, 0, n))
    };
    let mut received = 0;
    let mut last_seq = 0;
    while received < n {
        let m = next(&mut ws);
        match m["type"].as_str() {
            Some("event") => {
                let seq = m["event"]["seq"].as_i64().unwrap();
                assert!(seq > last_seq, "events arrive in order");
                last_seq = seq;
                received += 1;
            }
            Some("lagged") => panic!("the subscriber fell behind: {m}"),
            _ => {}
        }
    }
    let value = rate(n, start.elapsed());
    appender.join().unwrap();
    drop(ws);
    server.shutdown();
    vec![Figure::new(
        "ws_tail_events_per_s",
        value,
        "events/s",
        baseline,
    )]
}

fn next(ws: &mut tungstenite::WebSocket<TcpStream>) -> Value {
    loop {
        match ws.read().expect("the stream is open") {
            Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            Message::Close(f) => panic!("the server closed the stream: {f:?}"),
            _ => continue,
        }
    }
}
