//! `/api/v1/stream`: live updates over a WebSocket (`tungstenite` framing,
//! one thread per client).
//!
//! A client subscribes to topics with JSON text messages and gets JSON text
//! messages back (the operating guide, `docs/guide/operating.md`, gives the protocol):
//!
//! - `events`: a workspace's events after a seq, in order (resumable: give
//!   the last seq seen, and nothing is missed or repeated);
//! - `runs`: runs as their state changes;
//! - `dead_letters`: new dead letters;
//! - `stats`: [`crate::Stats`] and the rates of appends and settled runs,
//!   every `every_ms`.
//!
//! Each client reads the file for itself, so no client slows the engine or
//! another client. What it has not taken yet waits in a buffer of
//! [`super::AdminConfig::stream_buffer`] messages; a subscription that
//! finds the buffer full ends with a `lagged` message saying where to
//! resume. In the application's own process a commit wakes the clients at
//! once; another process's commit is noticed within a turn (10 ms), when
//! the quiet connection polls the file's `data_version` and reads the
//! client's messages.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use tungstenite::protocol::{Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

use super::Server;
use super::api::{ApiError, authorise, same_origin};
use super::http::{Request, Response, write_response};
use reflexr::Backend;
use reflexr::Query;
use reflexr::inspect::Counter;
use reflexr::inspect::{DeadLetterFilter, RunsFeed};

/// How often a quiet connection is pinged, and how long a client may send
/// nothing (pongs included) before it is closed.
const PING_EVERY: Duration = Duration::from_secs(15);
const IDLE_LIMIT: Duration = Duration::from_secs(60);
/// How long a client that must authenticate by message has to do it.
const AUTH_WITHIN: Duration = Duration::from_secs(10);
/// How long a quiet turn waits for a commit before it looks at the client
/// again: the most a command waits for its answer.
const TICK: Duration = Duration::from_millis(10);
/// How long a write waits for a slow client.
const WRITE_WAIT: Duration = Duration::from_millis(50);
/// Most items one subscription reads per turn.
const PAGE: usize = 500;

/// A GET of the stream asking to upgrade.
pub(crate) fn is_upgrade(req: &Request) -> bool {
    req.method == "GET"
        && req.path == "/api/v1/stream"
        && req
            .header("upgrade")
            .is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
}

fn refuse<B: Backend>(server: &Server<B>, stream: &mut TcpStream, e: &ApiError) {
    let _ = write_response(stream, &e.response(), false, server.config.io_timeout);
}

/// Checks the upgrade, answers it, and runs the session until the client or
/// the server ends it.
pub(crate) fn serve<B: Backend>(server: &Server<B>, mut stream: TcpStream, req: &Request) {
    // Every upgrade's origin is checked: a page of another site must not
    // read the stream with the user's network position.
    if let Err(e) = same_origin(server, req) {
        return refuse(server, &mut stream, &e);
    }
    let authed = match (&server.config.token, req.header("authorization")) {
        (None, _) => true,
        (Some(_), Some(_)) => match authorise(server, req) {
            Ok(()) => true,
            Err(e) => return refuse(server, &mut stream, &e),
        },
        // A browser cannot set the header on a WebSocket: it authenticates
        // with its first message instead.
        (Some(_), None) => false,
    };
    let key = match (
        req.header("sec-websocket-key"),
        req.header("sec-websocket-version"),
    ) {
        (Some(k), Some("13")) => k.to_string(),
        _ => {
            let e = ApiError::new(
                400,
                "bad_request",
                "a WebSocket version 13 upgrade is expected",
            );
            return refuse(server, &mut stream, &e);
        }
    };
    let accept = Response {
        status: 101,
        content_type: "text/plain",
        body: Vec::new(),
        headers: vec![
            ("Upgrade", "websocket".into()),
            (
                "Sec-WebSocket-Accept",
                tungstenite::handshake::derive_accept_key(key.as_bytes()),
            ),
        ],
        close: false,
        head_only: false,
    };
    if write_upgrade(&mut stream, &accept, server.config.io_timeout).is_err() {
        return;
    }
    let _ = stream.set_write_timeout(Some(WRITE_WAIT));
    let config = WebSocketConfig::default()
        .max_message_size(Some(64 * 1024))
        .max_frame_size(Some(64 * 1024))
        .write_buffer_size(64 * 1024)
        .max_write_buffer_size(1 << 20);
    let ws = WebSocket::from_raw_socket(stream, Role::Server, Some(config));
    Session {
        server,
        ws,
        out: VecDeque::new(),
        subs: Vec::new(),
        authed,
        opened: Instant::now(),
        heard: Instant::now(),
        pinged: Instant::now(),
    }
    .run();
}

/// The 101 answer: like any response, but without a body's headers.
fn write_upgrade(stream: &mut TcpStream, r: &Response, timeout: Duration) -> std::io::Result<()> {
    use std::io::Write;
    stream.set_write_timeout(Some(timeout))?;
    let mut head = String::from("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n");
    for (n, v) in &r.headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.flush()
}

/// What a subscription follows, and where it stands.
enum Topic<B: Backend> {
    Events {
        workspace: String,
        after: i64,
        types: Vec<String>,
        subject: Option<String>,
    },
    Runs {
        /// Where its feed of run changes stands.
        feed: RunsFeed<B>,
    },
    DeadLetters {
        after: i64,
    },
    Stats {
        every: Duration,
        next: Instant,
        last: Option<(Instant, i64, i64)>,
    },
}

struct Sub<B: Backend> {
    id: String,
    topic: Topic<B>,
}

// By hand: a derive would ask the backend's marker to be Clone.
impl<B: Backend> Clone for Topic<B> {
    fn clone(&self) -> Self {
        match self {
            Topic::Events {
                workspace,
                after,
                types,
                subject,
            } => Topic::Events {
                workspace: workspace.clone(),
                after: *after,
                types: types.clone(),
                subject: subject.clone(),
            },
            Topic::Runs { feed } => Topic::Runs { feed: feed.clone() },
            Topic::DeadLetters { after } => Topic::DeadLetters { after: *after },
            Topic::Stats { every, next, last } => Topic::Stats {
                every: *every,
                next: *next,
                last: *last,
            },
        }
    }
}

impl<B: Backend> Clone for Sub<B> {
    fn clone(&self) -> Self {
        Sub {
            id: self.id.clone(),
            topic: self.topic.clone(),
        }
    }
}

/// A client's message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Command {
    op: String,
    id: Option<String>,
    token: Option<String>,
    topic: Option<String>,
    workspace: Option<String>,
    after: Option<After>,
    #[serde(default)]
    types: Vec<String>,
    subject: Option<String>,
    every_ms: Option<u64>,
}

/// Where a subscription starts: a number (a seq, a dead letter's id, a
/// millisecond), or a position a `runs` feed wrote (`resume_after` of a
/// `lagged` message on PostgreSQL).
#[derive(Deserialize)]
#[serde(untagged)]
enum After {
    Number(i64),
    Token(String),
}

impl After {
    /// The number a topic other than `runs` takes.
    fn number(after: &Option<After>) -> Result<Option<i64>, ApiError> {
        match after {
            None => Ok(None),
            Some(After::Number(n)) => Ok(Some(*n)),
            Some(After::Token(_)) => Err(ApiError::new(
                400,
                "bad_request",
                "after: a number for this topic",
            )),
        }
    }
}

struct Session<'a, B: Backend> {
    server: &'a Server<B>,
    ws: WebSocket<TcpStream>,
    /// Messages waiting for the client to take them (a frame the socket's
    /// buffer gave back goes to the front, as it came back).
    out: VecDeque<Message>,
    subs: Vec<Sub<B>>,
    authed: bool,
    opened: Instant,
    /// When the client last sent anything.
    heard: Instant,
    pinged: Instant,
}

enum Flow {
    Go,
    End,
}

enum Heard {
    Nothing,
    Something,
    End,
}

impl<B: Backend> Session<'_, B> {
    fn run(mut self) {
        let watch = self.server.engine.watch();
        // Whether the subscriptions may have something new: after a commit,
        // a command, or a turn that filled its page.
        let mut due = true;
        loop {
            if self.server.stopping() {
                let _ = self.ws.close(None);
                let _ = self.ws.flush();
                return;
            }
            match self.read_client() {
                Heard::End => return,
                Heard::Something => due = true,
                Heard::Nothing => {}
            }
            if !self.authed && self.opened.elapsed() > AUTH_WITHIN {
                self.error(
                    None,
                    "unauthorized",
                    "authenticate first: {\"op\":\"auth\",\"token\":…}",
                );
                let _ = self.ws.close(None);
                let _ = self.ws.flush();
                return;
            }
            if self.heard.elapsed() > IDLE_LIMIT {
                let _ = self.ws.close(None);
                let _ = self.ws.flush();
                return;
            }
            if self.pinged.elapsed() > PING_EVERY {
                self.pinged = Instant::now();
                let _ = self.ws.write(Message::Ping(Vec::new().into()));
            }
            let produced = (due || self.timer_due()) && self.produce();
            if let Flow::End = self.send() {
                return;
            }
            // Go round at once while there is more to read; otherwise wait
            // for a commit, a slice at a time so the client is heard.
            due = produced || watch.wait(TICK);
        }
    }

    /// Whether a `stats` subscription is due, commit or not.
    fn timer_due(&self) -> bool {
        let now = Instant::now();
        self.subs
            .iter()
            .any(|s| matches!(s.topic, Topic::Stats { next, .. } if next <= now))
    }

    /// Reads what the client sent, without waiting: up to a few messages a
    /// turn.
    fn read_client(&mut self) -> Heard {
        let mut heard = Heard::Nothing;
        if self.ws.get_ref().set_nonblocking(true).is_err() {
            return Heard::End;
        }
        for _ in 0..16 {
            match self.ws.read() {
                Ok(msg) => {
                    self.heard = Instant::now();
                    heard = Heard::Something;
                    match msg {
                        Message::Text(t) => self.command(t.as_str()),
                        Message::Close(_) => {
                            heard = Heard::End;
                            break;
                        }
                        Message::Binary(_) => {
                            self.error(None, "bad_request", "send JSON text messages")
                        }
                        _ => {}
                    }
                }
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(tungstenite::Error::Capacity(_)) => {
                    self.error(None, "too_large", "a message is at most 64 KiB");
                    heard = Heard::End;
                    break;
                }
                Err(_) => {
                    heard = Heard::End;
                    break;
                }
            }
        }
        // Writes wait (up to the write timeout) for a slow client.
        if self.ws.get_ref().set_nonblocking(false).is_err() {
            return Heard::End;
        }
        heard
    }

    fn push(&mut self, v: Value) {
        self.out.push_back(Message::text(v.to_string()));
    }

    fn error(&mut self, id: Option<&str>, code: &str, message: &str) {
        self.push(
            json!({ "type": "error", "id": id, "error": { "code": code, "message": message } }),
        );
    }

    fn command(&mut self, text: &str) {
        let c: Command = match serde_json::from_str(text) {
            Ok(c) => c,
            Err(e) => return self.error(None, "bad_request", &format!("the message: {e}")),
        };
        let id = c.id.clone();
        if c.op == "auth" {
            let token = self.server.config.token.as_deref();
            let ok = match (token, c.token.as_deref()) {
                (None, _) => true,
                (Some(t), Some(g)) => {
                    use subtle::ConstantTimeEq;
                    bool::from(t.as_bytes().ct_eq(g.as_bytes()))
                }
                (Some(_), None) => false,
            };
            if ok {
                self.authed = true;
                return self.push(json!({ "type": "authenticated" }));
            }
            return self.error(id.as_deref(), "unauthorized", "the token is wrong");
        }
        if !self.authed {
            return self.error(
                id.as_deref(),
                "unauthorized",
                "authenticate first: {\"op\":\"auth\",\"token\":…}",
            );
        }
        match c.op.as_str() {
            "subscribe" => match self.subscribe(c) {
                Ok(id) => self.push(json!({ "type": "subscribed", "id": id })),
                Err(e) => self.error(id.as_deref(), e.code, &e.message),
            },
            "unsubscribe" => {
                let Some(id) = id else {
                    return self.error(None, "bad_request", "unsubscribe needs the id");
                };
                self.subs.retain(|s| s.id != id);
                self.push(json!({ "type": "unsubscribed", "id": id }));
            }
            "ping" => self.push(json!({ "type": "pong" })),
            other => self.error(
                id.as_deref(),
                "bad_request",
                &format!("unknown op {other:?}: auth, subscribe, unsubscribe, ping"),
            ),
        }
    }

    fn subscribe(&mut self, c: Command) -> Result<String, ApiError> {
        let bad = |m: &str| ApiError::new(400, "bad_request", m);
        let id =
            c.id.ok_or_else(|| bad("subscribe needs an id of the client's"))?;
        if id.is_empty() || id.len() > 64 {
            return Err(bad("an id is 1 to 64 characters"));
        }
        if self.subs.iter().any(|s| s.id == id) {
            return Err(ApiError::new(
                409,
                "conflict",
                "that id is subscribed already",
            ));
        }
        if self.subs.len() >= 16 {
            return Err(bad("at most 16 subscriptions per connection"));
        }
        let e = &self.server.engine;
        let topic = match c.topic.as_deref() {
            Some("events") => {
                let after = After::number(&c.after)?;
                let workspace = c.workspace.ok_or_else(|| bad("events need a workspace"))?;
                // Checked now, so a typo is an answer rather than silence.
                let mut q = Query::new(&workspace)
                    .after(after.unwrap_or(0))
                    .types(c.types.clone());
                if let Some(s) = &c.subject {
                    q = q.subject(s);
                }
                if after.is_some_and(|a| a < 0) {
                    return Err(bad("after: a seq is never negative"));
                }
                if !e.workspaces()?.iter().any(|w| w.name == workspace) {
                    return Err(ApiError::new(
                        404,
                        "not_found",
                        format!("no workspace {workspace:?}"),
                    ));
                }
                e.events_page(&q.limit(1))?;
                Topic::Events {
                    after: after.unwrap_or(0),
                    workspace,
                    types: c.types,
                    subject: c.subject,
                }
            }
            Some("runs") => Topic::Runs {
                feed: match &c.after {
                    None => RunsFeed::since(e.now_ms()),
                    Some(After::Number(ms)) => RunsFeed::since(*ms),
                    Some(After::Token(t)) => RunsFeed::from_token(t)?,
                },
            },
            Some("dead_letters") => {
                let after = match After::number(&c.after)? {
                    Some(a) => a,
                    None => e
                        .find_dead_letters(
                            &DeadLetterFilter::new().include_resolved(true).limit(1),
                        )?
                        .dead_letters
                        .first()
                        .map_or(0, |d| d.id),
                };
                Topic::DeadLetters { after }
            }
            Some("stats") => {
                let every = Duration::from_millis(c.every_ms.unwrap_or(1_000).clamp(250, 60_000));
                Topic::Stats {
                    every,
                    next: Instant::now(),
                    last: None,
                }
            }
            other => {
                return Err(bad(&format!(
                    "topic {other:?}: events, runs, dead_letters or stats"
                )));
            }
        };
        self.subs.push(Sub {
            id: id.clone(),
            topic,
        });
        Ok(id)
    }

    /// Reads what each subscription has next into the buffer, as far as it
    /// has room. A subscription that has more when the buffer is full ends
    /// `lagged`, from where it stands: the client resumes from there, and
    /// misses nothing.
    fn produce(&mut self) -> bool {
        let cap = self.server.config.stream_buffer;
        let e = self.server.engine.clone();
        let mut produced = false;
        let mut ended = Vec::new();
        let mut messages = Vec::new();
        for (i, sub) in self.subs.iter_mut().enumerate() {
            let room = cap.saturating_sub(self.out.len() + messages.len());
            if room == 0 {
                if matches!(sub.topic, Topic::Stats { .. }) {
                    continue;
                }
                // A look at a copy: does it have more than there is room for?
                let (mut probe, mut found) = (sub.clone(), Vec::new());
                if poll(&e, &mut probe, 1, &mut found).is_err() || !found.is_empty() {
                    messages.push(
                        json!({
                            "type": "lagged", "sub": sub.id, "resume_after": resume(&sub.topic),
                        })
                        .to_string(),
                    );
                    ended.push(i);
                    produced = true;
                }
                continue;
            }
            match poll(&e, sub, room.min(PAGE), &mut messages) {
                Ok(Poll::Quiet) => {}
                Ok(Poll::Some | Poll::More) => produced = true,
                Err(err) => {
                    messages.push(
                        json!({ "type": "error", "id": sub.id,
                            "error": { "code": err.code, "message": err.message } })
                        .to_string(),
                    );
                    ended.push(i);
                }
            }
        }
        for i in ended.into_iter().rev() {
            self.subs.remove(i);
        }
        self.out.extend(messages.into_iter().map(Message::text));
        produced
    }

    /// Hands the buffer to the socket as far as the client takes it.
    fn send(&mut self) -> Flow {
        while let Some(message) = self.out.pop_front() {
            match self.ws.write(message) {
                Ok(()) => {}
                Err(tungstenite::Error::WriteBufferFull(m)) => {
                    self.out.push_front(*m);
                    break;
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    break;
                }
                Err(_) => return Flow::End,
            }
        }
        match self.ws.flush() {
            Ok(()) => Flow::Go,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Flow::Go
            }
            Err(_) => Flow::End,
        }
    }
}

enum Poll {
    Quiet,
    /// Produced, and took everything there was.
    Some,
    /// Produced or not, and there is more than it took.
    More,
}

/// Where a lagged subscription resumes: its last position.
fn resume<B: Backend>(t: &Topic<B>) -> Value {
    match t {
        Topic::Events { after, .. } => json!(after),
        Topic::Runs { feed } => {
            let token = feed.token();
            token
                .parse::<i64>()
                .map_or_else(|_| json!(token), |ms| json!(ms))
        }
        Topic::DeadLetters { after } => json!(after),
        Topic::Stats { .. } => Value::Null,
    }
}

/// `{"type": kind, "sub": sub, kind: body}`, written straight from the
/// item (no `Value` in between: the tail's cost is mostly this).
fn item(kind: &str, sub: &str, body: &impl serde::Serialize) -> String {
    let body = serde_json::to_string(body).unwrap_or_else(|_| "null".into());
    let sub = serde_json::to_string(sub).unwrap_or_default();
    format!("{{\"type\":\"{kind}\",\"sub\":{sub},\"{kind}\":{body}}}")
}

/// Reads up to `n` of `sub`'s next items into `out`, advancing it.
fn poll<B: Backend>(
    e: &reflexr::Engine<B>,
    sub: &mut Sub<B>,
    n: usize,
    out: &mut Vec<String>,
) -> Result<Poll, ApiError> {
    let id = sub.id.as_str();
    let (got, full) = match &mut sub.topic {
        Topic::Events {
            workspace,
            after,
            types,
            subject,
        } => {
            let mut q = Query::new(workspace.as_str())
                .after(*after)
                .types(types.clone())
                .limit(n);
            if let Some(s) = subject {
                q = q.subject(s.as_str());
            }
            let page = e.events_page(&q)?;
            let (got, full) = (page.events.len(), page.events.len() == n);
            for ev in page.events {
                *after = ev.seq;
                out.push(item("event", id, &ev));
            }
            // A stretch that matched nothing still moves the position on.
            if let Some(next) = page.next_after {
                *after = (*after).max(next);
            }
            (got, full || (got == 0 && page.next_after.is_some()))
        }
        Topic::Runs { feed } => {
            let page = e.runs_feed(feed, n)?;
            let got = page.len();
            for r in page {
                out.push(item("run", id, &r));
            }
            (got, got == n)
        }
        Topic::DeadLetters { after } => {
            let found = e.dead_letters_after(*after, n)?;
            let (got, full) = (found.len(), found.len() == n);
            for d in found {
                *after = d.id;
                out.push(item("dead_letter", id, &d));
            }
            (got, full)
        }
        Topic::Stats { every, next, last } => {
            let now = Instant::now();
            if now < *next {
                return Ok(Poll::Quiet);
            }
            *next = now + *every;
            let stats = e.stats()?;
            let settled = stats.counter(Counter::RunsSucceeded)
                + stats.counter(Counter::RunsRetried)
                + stats.counter(Counter::RunsDead);
            let rates = match last {
                Some((at, appended, done)) => {
                    let secs = now.duration_since(*at).as_secs_f64().max(1e-3);
                    json!({
                        "appended_per_s": (stats.events_appended - *appended) as f64 / secs,
                        "settled_per_s": (settled - *done) as f64 / secs,
                    })
                }
                None => json!({ "appended_per_s": null, "settled_per_s": null }),
            };
            *last = Some((now, stats.events_appended, settled));
            out.push(
                json!({ "type": "stats", "sub": id, "stats": stats, "rates": rates }).to_string(),
            );
            (1, false)
        }
    };
    Ok(match (got, full) {
        (_, true) => Poll::More,
        (0, false) => Poll::Quiet,
        _ => Poll::Some,
    })
}
