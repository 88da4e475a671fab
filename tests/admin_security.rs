//! The administration server's security defaults, one test each: tokens,
//! read-only mode, cross-site requests, binding, size limits, slow clients
//! (DESIGN.md, "Surfaces": safe defaults, enforced by the server).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::http::{Api, PATIENCE, Stream, raw, status_of};
use common::{Arrange, Scene};
use reflexr::{AdminConfig, AdminServer, Engine, NewEvent};
use serde_json::json;

const TOKEN: &str = "correct-horse-battery-staple";

fn engine(s: &Scene) -> Engine {
    let e = s.open("test").workspace("shop", &["order"]);
    e.append("shop", &NewEvent::new("order", "o", "w", 0))
        .unwrap();
    e
}

fn serve(e: &Engine, config: AdminConfig) -> AdminServer {
    e.serve_admin(config.listen("127.0.0.1:0".parse().unwrap()))
        .unwrap()
}

fn change() -> serde_json::Value {
    json!({ "workspace": "shop", "kind": "app", "name": "mailer", "to": 1,
            "operator": "ops", "reason": "test" })
}

#[test]
fn with_a_token_every_route_but_healthz_wants_it_and_a_wrong_one_is_refused() {
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new().token(TOKEN));
    let addr = server.local_addr();
    let none = Api::new(addr, None);
    let wrong = Api::new(addr, Some("not-the-right-token-at-all"));
    let right = Api::new(addr, Some(TOKEN));
    for path in ["/api/v1/status", "/metrics", "/api/v1/openapi.json"] {
        let (st, body) = none.get(path);
        assert_eq!(
            (st, &body["error"]["code"]),
            (401, &json!("unauthorized")),
            "{path}"
        );
        assert_eq!(wrong.get(path).0, 401, "{path}");
        assert_eq!(right.get(path).0, 200, "{path}");
    }
    assert_eq!(none.get("/healthz").0, 200, "health needs no token");
    assert_eq!(none.post("/api/v1/cursors/reset", change()).0, 401);
    assert_eq!(right.post("/api/v1/cursors/reset", change()).0, 200);
    // The stream: the header, or a first message (what a browser can do).
    assert_eq!(
        Stream::connect(addr, Some("wrong-token-wrong-token"), None).err(),
        Some(401)
    );
    let mut header = Stream::connect(addr, Some(TOKEN), None).unwrap();
    header.send(json!({ "op": "ping" }));
    assert_eq!(header.next().unwrap()["type"], "pong");
    let mut message = Stream::connect(addr, None, None).unwrap();
    message.send(json!({ "op": "subscribe", "id": "a", "topic": "stats" }));
    assert_eq!(message.answer("a")["error"]["code"], "unauthorized");
    message.send(json!({ "op": "auth", "token": "nope" }));
    assert_eq!(message.next().unwrap()["error"]["code"], "unauthorized");
    message.send(json!({ "op": "auth", "token": TOKEN }));
    assert_eq!(message.next().unwrap()["type"], "authenticated");
    message.send(json!({ "op": "subscribe", "id": "a", "topic": "stats" }));
    assert_eq!(message.answer("a")["type"], "subscribed");
}

#[test]
fn read_only_refuses_every_change_and_the_file_stays_as_it_was() {
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new().read_only(true));
    let api = Api::new(server.local_addr(), None);
    let (st, status) = api.get("/api/v1/status");
    assert_eq!((st, &status["read_only"]), (200, &json!(true)));
    let (st, body) = api.post("/api/v1/cursors/reset", change());
    assert_eq!((st, &body["error"]["code"]), (403, &json!("read_only")));
    assert_eq!(e.cursor("mailer", "shop").unwrap(), 0);
    assert!(e.audit_log(10).unwrap().is_empty());
}

#[test]
fn cross_site_requests_are_refused_on_changes_and_on_every_stream_upgrade() {
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new());
    let addr = server.local_addr();
    let api = Api::new(addr, None);
    let body = change().to_string();
    let json = ("Content-Type", "application/json");
    for headers in [
        vec![json, ("Origin", "http://evil.example")],
        vec![json, ("Sec-Fetch-Site", "cross-site")],
        vec![json, ("Sec-Fetch-Site", "same-site")],
    ] {
        let (st, answer) = api.post_with("/api/v1/cursors/reset", &headers, &body);
        assert_eq!(
            (st, &answer["error"]["code"]),
            (403, &json!("cross_site")),
            "{headers:?}"
        );
    }
    // A form post (no JSON content type) cannot be a change either.
    let (st, _) = api.post_with(
        "/api/v1/cursors/reset",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &body,
    );
    assert_eq!(st, 415);
    assert_eq!(e.cursor("mailer", "shop").unwrap(), 0);
    // The same origin is fine.
    let own = format!("http://{addr}");
    let (st, _) = api.post_with("/api/v1/cursors/reset", &[json, ("Origin", &own)], &body);
    assert_eq!(st, 200);
    assert_eq!(
        Stream::connect(addr, None, Some("http://evil.example")).err(),
        Some(403)
    );
    assert!(Stream::connect(addr, None, Some(&own)).is_ok());
}

#[test]
fn a_non_loopback_address_needs_a_token_and_weak_settings_are_refused() {
    let s = Scene::new();
    let e = engine(&s);
    let open = AdminConfig::new().listen("0.0.0.0:0".parse().unwrap());
    let err = e.serve_admin(open.clone()).unwrap_err();
    assert!(
        err.is_bad_input() && err.to_string().contains("token"),
        "{err}"
    );
    assert!(
        e.serve_admin(open.clone().token("short"))
            .unwrap_err()
            .is_bad_input()
    );
    let served = e.serve_admin(open.token(TOKEN)).unwrap();
    assert!(!served.local_addr().ip().is_loopback());
    drop(served);
    assert!(
        e.serve_admin(AdminConfig::new().max_connections(0))
            .unwrap_err()
            .is_bad_input()
    );
}

#[test]
fn oversized_heads_and_bodies_and_chunked_bodies_are_refused() {
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new());
    let addr = server.local_addr();
    let big_header = format!(
        "GET /api/v1/status HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(reflexr::admin::MAX_HEAD_BYTES)
    );
    assert_eq!(raw(addr, big_header.as_bytes()).0, 431);
    let many = format!(
        "GET /api/v1/status HTTP/1.1\r\n{}\r\n",
        (0..100)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect::<String>()
    );
    assert_eq!(raw(addr, many.as_bytes()).0, 431);
    let body = format!(
        "POST /api/v1/prune HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        reflexr::admin::MAX_BODY_BYTES + 1
    );
    assert_eq!(raw(addr, body.as_bytes()).0, 413);
    let chunked = "POST /api/v1/prune HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                   Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    assert_eq!(raw(addr, chunked.as_bytes()).0, 411);
    for junk in [
        &b"HELLO\r\n\r\n"[..],
        b"GET /api/v1/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/v1/runs?state=%FF HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET relative HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let (st, text) = raw(addr, junk);
        assert_eq!(st, 400, "{junk:?}: {text}");
        assert!(text.contains("\"error\""), "{text}");
    }
    assert_eq!(Api::new(addr, None).get("/healthz").0, 200, "still serving");
}

/// A connection from `from` (a loopback address of its own) that sends the
/// start of a request head and then nothing.
fn slow_client(from: &str, to: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let here: SocketAddr = format!("{from}:0").parse().unwrap();
    socket.bind(&here.into()).unwrap();
    socket.connect(&to.into()).unwrap();
    let mut s: TcpStream = socket.into();
    s.write_all(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

#[test]
fn a_slow_client_holds_only_its_share_of_connections_and_only_until_its_deadline() {
    // A slow-loris client from one address gets its per-address share and
    // a 503 past it, each of its connections closed (408) when its head's
    // deadline passes; a client from another address is served meanwhile.
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(
        &e,
        AdminConfig::new()
            .max_connections(16)
            .max_connections_per_peer(4)
            .head_timeout(Duration::from_millis(300)),
    );
    let addr = server.local_addr();
    let mut slow: Vec<TcpStream> = (0..8).map(|_| slow_client("127.0.0.2", addr)).collect();
    assert_eq!(
        Api::new(addr, None).get("/api/v1/status").0,
        200,
        "served meanwhile"
    );
    let mut statuses: Vec<u16> = slow
        .iter_mut()
        .map(|c| {
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            status_of(&out)
        })
        .collect();
    statuses.sort();
    assert_eq!(statuses, [408, 408, 408, 408, 503, 503, 503, 503]);
}

#[test]
fn a_stopped_server_answers_no_more_and_the_engine_goes_on() {
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new());
    let addr = server.local_addr();
    assert_eq!(Api::new(addr, None).get("/healthz").0, 200);
    e.shutdown();
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
    drop(server);
    e.append("shop", &NewEvent::new("order", "o", "w", 1))
        .unwrap();
}
