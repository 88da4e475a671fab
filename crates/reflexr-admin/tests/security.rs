//! The administration server's security defaults, one test each: tokens,
//! read-only mode, cross-site requests, binding, size limits, slow clients
//! (DESIGN.md, "Surfaces": safe defaults, enforced by the server).

use reflexr_testkit as common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::http::{Api, PATIENCE, Stream, raw, request, status_of};
use common::{Arrange, Scene};
use reflexr::{Engine, NewEvent};
use reflexr_admin::{AdminConfig, AdminServer};
use serde_json::json;

const TOKEN: &str = "correct-horse-battery-staple";

fn engine(s: &Scene) -> Engine {
    let e = s.open("test").workspace("shop", &["order"]);
    e.append("shop", &NewEvent::new("order", "o", "w", 0))
        .unwrap();
    e
}

fn serve(e: &Engine, config: AdminConfig) -> AdminServer {
    reflexr_admin::AdminServer::start(e, config.listen("127.0.0.1:0".parse().unwrap())).unwrap()
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

/// What a page on `evil.example`, rebound to this machine, sends: its own
/// name as `Host` and `Origin`, and a browser's word that it is the page's
/// own origin.
fn rebound(addr: SocketAddr) -> [(String, String); 3] {
    let name = format!("evil.example:{}", addr.port());
    [
        ("Host".into(), name.clone()),
        ("Origin".into(), format!("http://{name}")),
        ("Sec-Fetch-Site".into(), "same-origin".into()),
    ]
}

fn refs(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect()
}

fn pause_body() -> serde_json::Value {
    json!({ "kind": "channel", "name": "email", "operator": "page", "reason": "rebound" })
}

/// Every kind of route a browser could reach, each asked as a rebound page
/// would: the status and the error code of each answer.
fn ask_every_route_kind(addr: SocketAddr, extra: &[(&str, &str)]) -> Vec<(String, u16, String)> {
    let rebound = rebound(addr);
    let mut headers = refs(&rebound);
    headers.extend_from_slice(extra);
    let mcp = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" });
    let asked: Vec<(&str, &str, Option<serde_json::Value>)> = vec![
        ("GET", "/healthz", None),
        ("GET", "/", None),
        ("GET", "/console/app.js", None),
        ("GET", "/metrics", None),
        ("GET", "/api/v1/openapi.json", None),
        ("GET", "/api/v1/status", None),
        ("GET", "/api/v1/dead-letters", None),
        ("GET", "/api/v1/no-such-route", None),
        ("POST", "/api/v1/pause", Some(pause_body())),
        (
            "POST",
            "/api/v1/dead-letters/1/retry",
            Some(json!({ "operator": "page", "reason": "rebound" })),
        ),
        ("POST", "/api/v1/mcp", Some(mcp)),
    ];
    let mut answers = Vec::new();
    for (method, path, body) in asked {
        let (st, answer) = request(addr, method, path, &headers, body.as_ref());
        let code = answer["error"]["code"].as_str().unwrap_or("").to_string();
        answers.push((format!("{method} {path}"), st, code));
    }
    let upgrade = Stream::connect_with(addr, &headers).err().unwrap_or(101);
    answers.push(("upgrade /api/v1/stream".into(), upgrade, String::new()));
    answers
}

#[test]
fn a_page_on_a_rebound_name_reaches_no_route_with_or_without_a_token() {
    // Surfaces, safe defaults: a server answers only to the names that are
    // its own. A page on a name its author controls, resolved to 127.0.0.1,
    // sends that name as Host and Origin (consistent with each other): it
    // gets 421 on every route kind — reads, changes, metrics, the console,
    // MCP, the stream's upgrade — and changes nothing.
    let s = Scene::new();
    let e = engine(&s);
    let bearer = format!("Bearer {TOKEN}");
    for (config, extra) in [
        (AdminConfig::new(), vec![]),
        (
            AdminConfig::new().token(TOKEN),
            vec![("Authorization", bearer.as_str())],
        ),
    ] {
        let server = serve(&e, config);
        let addr = server.local_addr();
        for (what, st, code) in ask_every_route_kind(addr, &extra) {
            assert_eq!(st, 421, "{what}");
            if !what.starts_with("upgrade") {
                assert_eq!(code, "unknown_host", "{what}");
            }
        }
        // The same requests under the server's own name are answered.
        let own = addr.to_string();
        let (st, _) = request(addr, "GET", "/api/v1/status", &[("Host", &own)], None);
        assert_eq!(st, if extra.is_empty() { 200 } else { 401 });
    }
    assert!(e.paused().unwrap().is_empty(), "nothing was paused");
    assert!(e.audit_log(10).unwrap().is_empty(), "nothing was done");
}

#[test]
fn the_loopback_names_are_answered_and_an_origin_is_checked_against_them_not_against_host() {
    // Surfaces, safe defaults: localhost, 127.0.0.1 and [::1] with the
    // port are this server's names; an Origin must be one of them, whatever
    // Host the request says — and a Host with another port is not this
    // server either.
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new());
    let addr = server.local_addr();
    let port = addr.port();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (st, _) = request(addr, "GET", "/api/v1/status", &[("Host", &host)], None);
        assert_eq!(st, 200, "{host}");
    }
    let (st, body) = request(
        addr,
        "GET",
        "/healthz",
        &[("Host", &format!("localhost:{}", port + 1))],
        None,
    );
    assert_eq!((st, &body["error"]["code"]), (421, &json!("unknown_host")));
    let (st, body) = request(addr, "GET", "/healthz", &[], None);
    assert_eq!(st, 400, "HTTP/1.1 says its Host: {body}");
    let own = format!("localhost:{port}");
    let evil = format!("http://evil.example:{port}");
    let (st, body) = request(
        addr,
        "POST",
        "/api/v1/pause",
        &[("Host", &own), ("Origin", &evil)],
        Some(&pause_body()),
    );
    assert_eq!((st, &body["error"]["code"]), (403, &json!("cross_site")));
    let (st, _) = request(
        addr,
        "POST",
        "/api/v1/pause",
        &[("Host", &own), ("Origin", "null")],
        Some(&pause_body()),
    );
    assert_eq!(st, 403, "an opaque origin is no page of this server");
    assert!(e.paused().unwrap().is_empty());
    let page = format!("http://localhost:{port}");
    let (st, body) = request(
        addr,
        "POST",
        "/api/v1/pause",
        &[("Host", &own), ("Origin", &page)],
        Some(&pause_body()),
    );
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        Stream::connect_with(addr, &[("Host", &own), ("Origin", &evil)]).err(),
        Some(403)
    );
    assert!(Stream::connect_with(addr, &[("Host", &own), ("Origin", &page)]).is_ok());
}

#[test]
fn a_name_the_operator_allows_is_answered_as_a_reverse_proxy_forwards_it() {
    // Surfaces, safe defaults: behind a reverse proxy, the proxy's name is
    // allowed by the operator (any port, or the one given); its pages may
    // change things; other names stay refused.
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(
        &e,
        AdminConfig::new()
            .token(TOKEN)
            .allow_host("Admin.Example.com")
            .allow_host("other.example:8443"),
    );
    let addr = server.local_addr();
    let bearer = format!("Bearer {TOKEN}");
    let auth = ("Authorization", bearer.as_str());
    for host in [
        "admin.example.com",
        "admin.example.com:443",
        "other.example:8443",
    ] {
        let (st, _) = request(addr, "GET", "/api/v1/status", &[("Host", host), auth], None);
        assert_eq!(st, 200, "{host}");
    }
    for host in ["other.example", "evil.example"] {
        let (st, _) = request(addr, "GET", "/api/v1/status", &[("Host", host), auth], None);
        assert_eq!(st, 421, "{host}");
    }
    let proxied = [
        ("Host", "admin.example.com"),
        ("Origin", "https://admin.example.com"),
        auth,
    ];
    let (st, body) = request(addr, "POST", "/api/v1/pause", &proxied, Some(&pause_body()));
    assert_eq!(st, 200, "{body}");
    let mut foreign = proxied;
    foreign[1] = ("Origin", "https://evil.example");
    let (st, _) = request(
        addr,
        "POST",
        "/api/v1/resume",
        &foreign,
        Some(&pause_body()),
    );
    assert_eq!(st, 403);
    assert!(Stream::connect_with(addr, &proxied).is_ok());
    assert!(
        reflexr_admin::AdminServer::start(
            &e,
            AdminConfig::new()
                .listen("127.0.0.1:0".parse().unwrap())
                .allow_host("a b")
        )
        .unwrap_err()
        .is_bad_input()
    );
}

#[test]
fn the_bearer_scheme_is_read_in_any_case() {
    // Surfaces: RFC 9110 11.1, the auth scheme is case-insensitive; the
    // token itself is not.
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new().token(TOKEN));
    let addr = server.local_addr();
    let host = addr.to_string();
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let auth = format!("{scheme} {TOKEN}");
        let (st, _) = request(
            addr,
            "GET",
            "/api/v1/status",
            &[("Host", &host), ("Authorization", &auth)],
            None,
        );
        assert_eq!(st, 200, "{scheme}");
    }
    let upper = format!("Bearer {}", TOKEN.to_uppercase());
    let (st, _) = request(
        addr,
        "GET",
        "/api/v1/status",
        &[("Host", &host), ("Authorization", &upper)],
        None,
    );
    assert_eq!(st, 401);
    let basic = format!("Basic {TOKEN}");
    let (st, _) = request(
        addr,
        "GET",
        "/api/v1/status",
        &[("Host", &host), ("Authorization", &basic)],
        None,
    );
    assert_eq!(st, 401);
    // And a JSON body's media type is read in any case too (RFC 9110 8.3.1).
    let auth = format!("bearer {TOKEN}");
    let (st, body) = request(
        addr,
        "POST",
        "/api/v1/pause",
        &[
            ("Host", &host),
            ("Authorization", &auth),
            ("Content-Type", "Application/JSON; charset=utf-8"),
        ],
        Some(&pause_body()),
    );
    assert_eq!(st, 200, "{body}");
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
    let err = reflexr_admin::AdminServer::start(&e, open.clone()).unwrap_err();
    assert!(
        err.is_bad_input() && err.to_string().contains("token"),
        "{err}"
    );
    assert!(
        reflexr_admin::AdminServer::start(&e, open.clone().token("short"))
            .unwrap_err()
            .is_bad_input()
    );
    let served = reflexr_admin::AdminServer::start(&e, open.token(TOKEN)).unwrap();
    assert!(!served.local_addr().ip().is_loopback());
    drop(served);
    assert!(
        reflexr_admin::AdminServer::start(&e, AdminConfig::new().max_connections(0))
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
        "GET /api/v1/status HTTP/1.1\r\nHost: {addr}\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(reflexr_admin::MAX_HEAD_BYTES)
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
        reflexr_admin::MAX_BODY_BYTES + 1
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
fn a_full_server_sheds_the_connection_waiting_longest_so_a_whole_request_is_served() {
    // Surfaces, bounded resources: slow clients from many addresses fill
    // every connection; a client whose request arrives whole is still
    // served, by shedding the connection that has waited longest for its
    // head (told 503). Connections being answered, or holding a stream,
    // are never shed: with every place taken by streams, a newcomer gets
    // 503 and the streams go on.
    let s = Scene::new();
    let e = engine(&s);
    let server = serve(&e, AdminConfig::new().max_connections(4));
    let addr = server.local_addr();
    let mut slow: Vec<TcpStream> = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
        .iter()
        .map(|from| slow_client(from, addr))
        .collect();
    // The server takes connections in the order they came: the four slow
    // ones wait, the server is full, and then a whole request comes.
    assert_eq!(
        Api::new(addr, None).get("/api/v1/status").0,
        200,
        "a whole request is served"
    );
    let mut first = String::new();
    let _ = slow[0].read_to_string(&mut first);
    assert_eq!(
        status_of(&first),
        503,
        "the oldest waiting connection was shed: {first}"
    );
    drop(slow);
    // Four streams take every place; none of them is shed for a newcomer.
    let mut streams: Vec<Stream> = Vec::new();
    let deadline = std::time::Instant::now() + PATIENCE;
    while streams.len() < 4 {
        match Stream::connect(addr, None, None) {
            Ok(st) => streams.push(st),
            // A closed slow client's place is given back when its thread
            // has seen it closed.
            Err(503) if std::time::Instant::now() < deadline => std::thread::yield_now(),
            Err(other) => panic!("upgrade: {other}"),
        }
    }
    for st in &mut streams {
        st.send(json!({ "op": "ping" }));
        assert_eq!(st.next().unwrap()["type"], "pong");
    }
    let (st, _) = raw(
        addr,
        format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    );
    assert_eq!(st, 503, "every place holds a stream");
    for st in &mut streams {
        st.send(json!({ "op": "ping" }));
        assert_eq!(st.next().unwrap()["type"], "pong", "the streams go on");
    }
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
