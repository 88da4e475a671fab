//! Administration of a reflexr engine over HTTP: a REST API, live WebSocket
//! streams, Prometheus metrics and a web console, served from threads on
//! `std::net` (no async runtime).
//!
//! [`AdminServer::start`] runs the server in the application's process,
//! sharing its engine; `reflexr <DB> serve` (the `reflexr-cli` crate) runs
//! it beside the application, on the same file. Either way it is a surface
//! over the engine's public operations: parse, authorise, call, render.
//!
//! ```no_run
//! # fn main() -> reflexr::Result<()> {
//! use reflexr_admin::{AdminConfig, AdminServer};
//! let engine = reflexr::Engine::open("app.db")?;
//! let server = AdminServer::start(&engine, AdminConfig::new())?;
//! println!("the console is on http://{}", server.local_addr());
//! # Ok(()) }
//! ```
//!
//! # Threads
//!
//! One acceptor thread, and one thread per open connection, up to
//! [`AdminConfig::max_connections`] in all and
//! [`AdminConfig::max_connections_per_peer`] from one address; a connection
//! over the cap of its address is answered `503` and closed at once. A
//! server at its cap in all makes room for a newcomer by shedding the
//! connection that has waited longest for a request to arrive whole (told
//! `503`); one being answered, or holding a stream, is never shed. A
//! request must arrive whole within its deadlines, so a slow client holds
//! a thread for seconds at most.
//!
//! # Security (the defaults)
//!
//! Loopback only (`127.0.0.1`) unless told otherwise, and a token required
//! for any other address. Every request's `Host` must name this server —
//! its loopback names and addresses, the address it listens on, or a name
//! given to [`AdminConfig::allow_host`] — or it is answered `421`: a page
//! on a rebound name reaches nothing. With a token, every route but
//! `/healthz` and the console's static files wants `Authorization: Bearer
//! <token>` (the scheme in any case), compared in constant time. Changes
//! want a JSON body, refuse cross-site requests (`Sec-Fetch-Site`, an
//! `Origin` that is no page of this server's names), and are refused in
//! read-only mode; every WebSocket upgrade has its `Origin` checked. TLS is
//! a reverse proxy's job (the operating guide, `docs/guide/operating.md`, says how).
//!
//! # Cargo features
//!
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod api;
mod console;
mod hosts;
mod http;
mod metrics;
mod openapi;
mod stream;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use reflexr::Engine;
use reflexr::{Backend, Service};
use reflexr::{Error, Result};

pub use http::{MAX_BODY_BYTES, MAX_HEAD_BYTES};

/// How an administration server listens and what it allows.
///
/// # Defaults
///
/// | setting | default |
/// | --- | --- |
/// | [`listen`](AdminConfig::listen) | `127.0.0.1:7878` |
/// | [`token`](AdminConfig::token) | none (allowed on loopback only) |
/// | [`allow_host`](AdminConfig::allow_host) | none: the loopback names and the listening address, with its port |
/// | [`read_only`](AdminConfig::read_only) | `false` |
/// | [`max_connections`](AdminConfig::max_connections) | 128 |
/// | [`max_connections_per_peer`](AdminConfig::max_connections_per_peer) | 32 |
/// | [`head_timeout`](AdminConfig::head_timeout) | 10 s for a request's head once it began |
/// | [`idle_timeout`](AdminConfig::idle_timeout) | 15 s for a kept-alive connection's next request |
/// | [`io_timeout`](AdminConfig::io_timeout) | 10 s for a body, or a response to be taken |
/// | [`stream_buffer`](AdminConfig::stream_buffer) | 1,024 messages per WebSocket client |
///
/// Request heads are capped at [`MAX_HEAD_BYTES`] (16 KiB), bodies at
/// [`MAX_BODY_BYTES`] (1 MiB).
#[derive(Clone)]
pub struct AdminConfig {
    pub(crate) listen: SocketAddr,
    pub(crate) token: Option<String>,
    pub(crate) allowed_hosts: Vec<String>,
    pub(crate) read_only: bool,
    pub(crate) max_connections: usize,
    pub(crate) max_connections_per_peer: usize,
    pub(crate) head_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) stream_buffer: usize,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("allowed_hosts", &self.allowed_hosts)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl Default for AdminConfig {
    fn default() -> AdminConfig {
        AdminConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            token: None,
            allowed_hosts: Vec::new(),
            read_only: false,
            max_connections: 128,
            max_connections_per_peer: 32,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(15),
            io_timeout: Duration::from_secs(10),
            stream_buffer: 1_024,
        }
    }
}

impl AdminConfig {
    /// The defaults.
    pub fn new() -> AdminConfig {
        AdminConfig::default()
    }

    /// Where to listen (port 0: any free port; see
    /// [`AdminServer::local_addr`]). Default `127.0.0.1:7878`. An address
    /// other than loopback needs a [`token`](AdminConfig::token).
    pub fn listen(mut self, addr: SocketAddr) -> AdminConfig {
        self.listen = addr;
        self
    }

    /// The bearer token every request but `/healthz` must carry. Default
    /// none: allowed on loopback only.
    pub fn token(mut self, token: impl Into<String>) -> AdminConfig {
        self.token = Some(token.into());
        self
    }

    /// Reads the token from a file (its first line, trimmed).
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be read; [`Error::Invalid`] if it is
    /// empty.
    pub fn token_file(self, path: impl AsRef<std::path::Path>) -> Result<AdminConfig> {
        let text = std::fs::read_to_string(path.as_ref())?;
        let token = text.lines().next().unwrap_or("").trim().to_string();
        if token.is_empty() {
            return Err(Error::invalid("token file", "the file holds no token"));
        }
        Ok(self.token(token))
    }

    /// Also answer to requests whose `Host` is `name` — the name a reverse
    /// proxy forwards, say — and to pages whose `Origin` is
    /// `http://name` or `https://name`. `name` alone matches any port;
    /// `name:port` only that port. May be given several times.
    ///
    /// Without it the server answers only to what names it on its own:
    /// `localhost`, the loopback addresses and the address it listens on,
    /// each with its port (any address literal when it listens on every
    /// address). Any other `Host` gets `421` with the error code
    /// `unknown_host`, on every route: a page on a name its author
    /// controls, resolved to this machine (DNS rebinding), reaches nothing.
    pub fn allow_host(mut self, name: impl Into<String>) -> AdminConfig {
        self.allowed_hosts.push(name.into());
        self
    }

    /// Serve reads only: every mutating route and stream command is
    /// refused with `403`. Default `false`.
    pub fn read_only(mut self, read_only: bool) -> AdminConfig {
        self.read_only = read_only;
        self
    }

    /// Open connections at most (1 to 4,096). Default 128.
    pub fn max_connections(mut self, n: usize) -> AdminConfig {
        self.max_connections = n;
        self
    }

    /// Open connections from one address at most. Default 32.
    pub fn max_connections_per_peer(mut self, n: usize) -> AdminConfig {
        self.max_connections_per_peer = n;
        self
    }

    /// How long a request's head may take once its first byte came.
    /// Default 10 s.
    pub fn head_timeout(mut self, t: Duration) -> AdminConfig {
        self.head_timeout = t;
        self
    }

    /// How long a kept-alive connection waits for its next request.
    /// Default 15 s.
    pub fn idle_timeout(mut self, t: Duration) -> AdminConfig {
        self.idle_timeout = t;
        self
    }

    /// How long a body may take to arrive, and a response to be taken by
    /// the client. Default 10 s.
    pub fn io_timeout(mut self, t: Duration) -> AdminConfig {
        self.io_timeout = t;
        self
    }

    /// How many messages a WebSocket client's buffer holds before its
    /// subscriptions are cut with `lagged`. Default 1,024.
    pub fn stream_buffer(mut self, n: usize) -> AdminConfig {
        self.stream_buffer = n;
        self
    }

    fn validate(&self) -> Result<()> {
        if !self.listen.ip().is_loopback() && self.token.is_none() {
            return Err(Error::invalid(
                "listen",
                format!(
                    "{} is not a loopback address: a token is required to serve on it",
                    self.listen
                ),
            ));
        }
        if let Some(t) = &self.token
            && (t.len() < 16 || t.chars().any(|c| c.is_control() || c == ' '))
        {
            return Err(Error::invalid(
                "token",
                "at least 16 characters, without spaces or control characters",
            ));
        }
        if !(1..=4_096).contains(&self.max_connections) || self.max_connections_per_peer == 0 {
            return Err(Error::invalid(
                "max_connections",
                "1 to 4096 in all, at least 1 per peer",
            ));
        }
        if self.stream_buffer < 16 {
            return Err(Error::invalid("stream_buffer", "at least 16 messages"));
        }
        for t in [self.head_timeout, self.idle_timeout, self.io_timeout] {
            if t.is_zero() {
                return Err(Error::invalid("timeout", "must be more than zero"));
            }
        }
        hosts::Hosts::new(self.listen, &self.allowed_hosts)?;
        Ok(())
    }
}

/// A running administration server. Dropping it (or [`AdminServer::shutdown`],
/// or [`Engine::shutdown`]) stops it: no new connection is taken, open ones
/// are closed after the request they are in, and every thread is joined.
///
/// The server keeps its engine open while it runs.
pub struct AdminServer {
    inner: Arc<dyn Running>,
}

/// A running server, whatever its engine's backend.
trait Running: Service {
    fn addr(&self) -> SocketAddr;
}

impl<B: Backend> Running for Server<B> {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("local_addr", &self.inner.addr())
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// The address it listens on (with the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr()
    }

    /// Stops the server and joins its threads.
    pub fn shutdown(self) {
        self.inner.stop();
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.inner.stop();
    }
}

impl AdminServer {
    /// Serves the administration API for `engine` on threads of its own
    /// (see the crate's docs): the REST routes under `/api/v1`, the
    /// WebSocket streams at `/api/v1/stream`, Prometheus metrics at
    /// `/metrics`, `/healthz` and the console at `/`. It stops when it is
    /// dropped or shut down, and when the engine shuts down.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a non-loopback address without a token or a
    /// bad setting; [`Error::Io`] when the address cannot be bound.
    pub fn start<B: Backend>(engine: &Engine<B>, config: AdminConfig) -> Result<AdminServer> {
        config.validate()?;
        let listener = TcpListener::bind(config.listen)?;
        let addr = listener.local_addr()?;
        let routes = api::routes();
        let server = Arc::new(Server {
            engine: engine.clone(),
            openapi: openapi::written(&routes),
            routes,
            hosts: hosts::Hosts::new(addr, &config.allowed_hosts)?,
            config,
            addr,
            stop: AtomicBool::new(false),
            conns: Mutex::new(Conns::default()),
            acceptor: Mutex::new(None),
        });
        let s = Arc::clone(&server);
        let acceptor = std::thread::Builder::new()
            .name("reflexr-admin".into())
            .spawn(move || s.accept(listener))?;
        *lock(&server.acceptor) = Some(acceptor);
        engine.add_service(&(Arc::clone(&server) as Arc<dyn Service>));
        log::info!("admin server listening on {addr}");
        Ok(AdminServer { inner: server })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The open connections: each one's address, a handle to close it with,
/// and since when it waits for a request; their threads.
#[derive(Default)]
struct Conns {
    open: HashMap<u64, Conn>,
    per_peer: HashMap<IpAddr, usize>,
    threads: Vec<JoinHandle<()>>,
    next_id: u64,
}

struct Conn {
    peer: IpAddr,
    /// A second handle on the socket, to shut it when the connection is
    /// shed (none if the system would not give one: never shed).
    stream: Option<TcpStream>,
    /// Since when it waits for a request to arrive whole (its next one,
    /// on a kept-alive connection); `None` while it is being answered or
    /// holds a stream.
    waiting_since: Option<Instant>,
}

impl Conns {
    /// Takes `peer`'s new connection in, if the caps allow it. A server
    /// that is full makes room by shedding the connection that has waited
    /// longest for a request to arrive whole (a slow or idle client); a
    /// connection being answered, or holding a stream, is never shed.
    fn admit(&mut self, peer: IpAddr, stream: &TcpStream, config: &AdminConfig) -> Option<u64> {
        let from_peer = self.per_peer.get(&peer).copied().unwrap_or(0);
        if from_peer >= config.max_connections_per_peer {
            return None;
        }
        if self.open.len() >= config.max_connections {
            let (&oldest, _) = self
                .open
                .iter()
                .filter(|(_, c)| c.stream.is_some())
                .filter_map(|(id, c)| c.waiting_since.map(|t| (id, t)))
                .min_by_key(|(_, t)| *t)?;
            self.shed(oldest);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.open.insert(
            id,
            Conn {
                peer,
                stream: stream.try_clone().ok(),
                waiting_since: Some(Instant::now()),
            },
        );
        *self.per_peer.entry(peer).or_default() += 1;
        Some(id)
    }

    /// Closes connection `id` and gives its place back: its thread finds
    /// its socket shut and ends.
    fn shed(&mut self, id: u64) {
        if let Some(conn) = self.release(id)
            && let Some(stream) = conn.stream
        {
            log::debug!("admin: shedding a waiting connection from {}", conn.peer);
            busy(&stream);
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Forgets connection `id` (if it was not shed already).
    fn release(&mut self, id: u64) -> Option<Conn> {
        let conn = self.open.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&conn.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&conn.peer);
            }
        }
        Some(conn)
    }
}

pub(crate) struct Server<B: Backend> {
    pub(crate) engine: Engine<B>,
    /// The routes, made once for the engine's backend.
    pub(crate) routes: Vec<api::Route<B>>,
    /// The routes' OpenAPI document, as served.
    pub(crate) openapi: String,
    /// What names this server (`Host` and `Origin` are checked with it).
    pub(crate) hosts: hosts::Hosts,
    pub(crate) config: AdminConfig,
    addr: SocketAddr,
    stop: AtomicBool,
    conns: Mutex<Conns>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl<B: Backend> Service for Server<B> {
    fn stop(&self) {
        if self.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the acceptor out of accept().
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = lock(&self.acceptor).take() {
            let _ = t.join();
        }
        let threads = std::mem::take(&mut lock(&self.conns).threads);
        for t in threads {
            let _ = t.join();
        }
        log::info!("admin server on {} stopped", self.addr);
    }
}

impl<B: Backend> Server<B> {
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn accept(self: Arc<Self>, listener: TcpListener) {
        for stream in listener.incoming() {
            if self.stopping() {
                break;
            }
            let Ok(stream) = stream else { continue };
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            let admitted = {
                let mut c = lock(&self.conns);
                c.threads.retain(|t| !t.is_finished());
                c.admit(peer.ip(), &stream, &self.config)
            };
            let Some(id) = admitted else {
                busy(&stream);
                continue;
            };
            let s = Arc::clone(&self);
            let spawned = std::thread::Builder::new()
                .name("reflexr-admin-conn".into())
                .spawn(move || {
                    let _slot = Slot { server: &s, id };
                    s.serve(id, stream);
                });
            match spawned {
                Ok(t) => lock(&self.conns).threads.push(t),
                Err(e) => {
                    log::error!("admin: cannot start a connection thread: {e}");
                    lock(&self.conns).release(id);
                }
            }
        }
    }

    /// Marks connection `id` as waiting for a request (`true`) or being
    /// answered; `false` if it was shed meanwhile.
    fn waiting(&self, id: u64, waiting: bool) -> bool {
        match lock(&self.conns).open.get_mut(&id) {
            Some(c) => {
                c.waiting_since = waiting.then(Instant::now);
                true
            }
            None => false,
        }
    }

    /// One connection: requests until it closes, goes idle, or the server
    /// stops; a WebSocket upgrade hands the connection to the stream.
    fn serve(&self, id: u64, mut stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let mut buf = Vec::new();
        // It waits for its first request since it was admitted (so the
        // server sheds connections in the order they came), and for each
        // next one since the last answer went out.
        loop {
            let idle_until = Instant::now() + self.config.idle_timeout;
            let read = http::read_request(
                &mut stream,
                &mut buf,
                &|| self.stopping(),
                idle_until,
                self.config.head_timeout,
                self.config.io_timeout,
            );
            if read.is_ok() && !self.waiting(id, false) {
                return;
            }
            let response = match read {
                Ok(req) => match api::check_host(self, &req) {
                    Err(e) => e.response(),
                    Ok(()) if stream::is_upgrade(&req) => {
                        stream::serve(self, stream, &req);
                        return;
                    }
                    Ok(()) => {
                        let keep = req.keep_alive() && !self.stopping();
                        let mut r = api::handle(self, &req);
                        r.head_only = req.method == "HEAD";
                        let keep = keep && !r.close;
                        if http::write_response(&stream, &r, keep, self.config.io_timeout).is_err()
                            || !keep
                            || !self.waiting(id, true)
                        {
                            return;
                        }
                        continue;
                    }
                },
                Err(http::ReadError::Idle | http::ReadError::Io) => return,
                Err(http::ReadError::Timeout) => {
                    http::Response::error(408, "timeout", "the request did not arrive in time")
                }
                Err(http::ReadError::HeadTooLarge) => http::Response::error(
                    431,
                    "head_too_large",
                    format!("a request head is at most {MAX_HEAD_BYTES} bytes and 64 headers"),
                ),
                Err(http::ReadError::BodyTooLarge) => http::Response::error(
                    413,
                    "too_large",
                    format!("a request body is at most {MAX_BODY_BYTES} bytes"),
                ),
                Err(http::ReadError::LengthRequired) => http::Response::error(
                    411,
                    "length_required",
                    "a body must say its length (Content-Length); chunked bodies are refused",
                ),
                Err(http::ReadError::Malformed(why)) => {
                    http::Response::error(400, "bad_request", why)
                }
            };
            let _ = http::write_response(&stream, &response, false, self.config.io_timeout);
            return;
        }
    }
}

/// A connection's place in the caps, given back when its thread ends.
struct Slot<'a, B: Backend> {
    server: &'a Server<B>,
    id: u64,
}

impl<B: Backend> Drop for Slot<'_, B> {
    fn drop(&mut self) {
        lock(&self.server.conns).release(self.id);
    }
}

/// Answers a connection over the caps with `503`, without waiting for it.
fn busy(stream: &TcpStream) {
    let r = http::Response::error(503, "busy", "too many connections; try again")
        .with_header("Retry-After", "1");
    let _ = http::write_response(stream, &r, false, Duration::from_millis(200));
}
