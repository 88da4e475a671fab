//! HTTP/1.1 on a `std::net` stream: one request read under deadlines and
//! limits (heads parsed by `httparse`), one response written. Requests
//! must say their body's length; chunked bodies are refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The largest request body.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The most headers a request may have.
const MAX_HEADERS: usize = 64;

/// A request, read whole.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    /// The path, percent-decoded, without the query.
    pub path: String,
    /// The path's segments (without a trailing `/`), each percent-decoded
    /// on its own: an encoded `/` (`%2F`) stays inside its segment, so a
    /// route's parameter can hold a name like `delivery/push`.
    pub segments: Vec<String>,
    /// The query's pairs, decoded, in order.
    pub query: Vec<(String, String)>,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// HTTP/1.1 (keep-alive by default) rather than 1.0.
    pub http11: bool,
}

impl Request {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first query parameter named `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection stays open after the response.
    pub fn keep_alive(&self) -> bool {
        let connection = self.header("connection").map(str::to_ascii_lowercase);
        match connection.as_deref() {
            Some(c) if c.contains("close") => false,
            Some(c) if c.contains("keep-alive") => true,
            _ => self.http11,
        }
    }
}

/// How often a connection waiting for its next request looks whether the
/// server is stopping.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Why no request was read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer closed the connection (or sent nothing) before a request
    /// began: nothing to answer.
    Idle,
    /// A request began but did not arrive in time.
    Timeout,
    /// The head is over [`MAX_HEAD_BYTES`] or has too many headers.
    HeadTooLarge,
    /// The body is over [`MAX_BODY_BYTES`].
    BodyTooLarge,
    /// The body's length is not given (chunked, or a body without
    /// `Content-Length`).
    LengthRequired,
    /// Not HTTP, or not UTF-8.
    Malformed(String),
    /// The connection failed.
    Io,
}

/// Reads one request from `stream`, whose bytes already read but not used
/// are in `buf` (keep-alive). Waits for its first byte until `idle_until`;
/// once it began, its head must arrive within `head_timeout` and its body
/// within `body_timeout`. While it waits for a first byte it gives up as
/// soon as `stopping` says so (a server shutting down does not wait out
/// its idle keep-alive connections).
pub(crate) fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    stopping: &dyn Fn() -> bool,
    idle_until: Instant,
    head_timeout: Duration,
    body_timeout: Duration,
) -> Result<Request, ReadError> {
    let mut began = (!buf.is_empty()).then(Instant::now);
    let head_len = loop {
        if let Some(end) = find_head_end(buf) {
            break end;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(ReadError::HeadTooLarge);
        }
        let deadline = match began {
            Some(t) => t + head_timeout,
            None => idle_until.min(Instant::now() + STOP_CHECK),
        };
        match read_some(stream, buf, deadline) {
            Ok(0) => {
                return Err(if buf.is_empty() {
                    ReadError::Idle
                } else {
                    ReadError::Malformed("the connection closed mid-request".into())
                });
            }
            Ok(_) => {
                began.get_or_insert_with(Instant::now);
            }
            Err(Timed::Out) if began.is_none() => {
                if stopping() || Instant::now() >= idle_until {
                    return Err(ReadError::Idle);
                }
            }
            Err(Timed::Out) => return Err(ReadError::Timeout),
            Err(Timed::Failed) => return Err(ReadError::Io),
        }
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(ReadError::HeadTooLarge);
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(&buf[..head_len]) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(ReadError::Malformed("an incomplete request head".into()));
        }
        Err(httparse::Error::TooManyHeaders) => return Err(ReadError::HeadTooLarge),
        Err(e) => return Err(ReadError::Malformed(format!("not an HTTP request: {e}"))),
    }
    let method = parsed.method.unwrap_or_default().to_string();
    let target = parsed.path.unwrap_or_default().to_string();
    let http11 = parsed.version == Some(1);
    let mut header_list = Vec::with_capacity(parsed.headers.len());
    for h in parsed.headers.iter() {
        let value = std::str::from_utf8(h.value)
            .map_err(|_| ReadError::Malformed(format!("header {} is not UTF-8", h.name)))?;
        header_list.push((h.name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let header = |name: &str| {
        header_list
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    if header("transfer-encoding").is_some() {
        return Err(ReadError::LengthRequired);
    }
    let length = match header("content-length") {
        None => 0,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| ReadError::Malformed(format!("Content-Length {v:?}")))?,
    };
    if length > MAX_BODY_BYTES {
        return Err(ReadError::BodyTooLarge);
    }
    let (path, segments, query) = split_target(&target)?;
    buf.drain(..head_len);
    let body_deadline = Instant::now() + body_timeout;
    while buf.len() < length {
        match read_some(stream, buf, body_deadline) {
            Ok(0) => return Err(ReadError::Malformed("the body ended early".into())),
            Ok(_) => {}
            Err(Timed::Out) => return Err(ReadError::Timeout),
            Err(Timed::Failed) => return Err(ReadError::Io),
        }
    }
    let body: Vec<u8> = buf.drain(..length).collect();
    Ok(Request {
        method,
        path,
        segments,
        query,
        headers: header_list,
        body,
        http11,
    })
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

enum Timed {
    Out,
    Failed,
}

/// One read into `buf`, waiting no later than `deadline`.
fn read_some(stream: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> Result<usize, Timed> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Timed::Out);
    }
    // Short slices, so a server that stops does not wait out a long read.
    let slice = left.min(Duration::from_millis(250));
    stream
        .set_read_timeout(Some(slice))
        .map_err(|_| Timed::Failed)?;
    let mut chunk = [0u8; 8 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(Timed::Out);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Timed::Failed),
        }
    }
}

/// The pieces of a request target.
type Target = (String, Vec<String>, Vec<(String, String)>);

/// The percent-decoded path, its segments each decoded on its own, and the
/// decoded query pairs of a request target.
fn split_target(target: &str) -> Result<Target, ReadError> {
    let (raw_path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    if !raw_path.starts_with('/') {
        return Err(ReadError::Malformed(format!("the target {target:?}")));
    }
    let decode = |raw: &str| {
        percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map(|d| d.into_owned())
            .map_err(|_| ReadError::Malformed("the path is not UTF-8".into()))
    };
    let path = decode(raw_path)?;
    let segments = raw_path
        .trim_end_matches('/')
        .split('/')
        .map(decode)
        .collect::<Result<Vec<_>, _>>()?;
    let mut query = Vec::new();
    for (k, v) in form_urlencoded::parse(raw_query.as_bytes()) {
        // form_urlencoded replaces invalid UTF-8; refuse instead.
        if k.contains('\u{FFFD}') || v.contains('\u{FFFD}') {
            return Err(ReadError::Malformed("the query is not UTF-8".into()));
        }
        query.push((k.into_owned(), v.into_owned()));
    }
    Ok((path, segments, query))
}

/// A response to write.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
    /// Close the connection after it.
    pub close: bool,
    /// The answer to a HEAD: the head as a GET would have it, no body.
    pub head_only: bool,
}

impl Response {
    pub fn json(status: u16, value: &impl Serialize) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(value).unwrap_or_else(|e| {
                format!(r#"{{"error":{{"code":"internal","message":"{e}"}}}}"#).into_bytes()
            }),
            headers: Vec::new(),
            close: false,
            head_only: false,
        }
    }

    /// The one error shape: `{"error": {"code", "message"}}`.
    pub fn error(status: u16, code: &str, message: impl Into<String>) -> Response {
        Response::json(
            status,
            &serde_json::json!({ "error": { "code": code, "message": message.into() } }),
        )
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Writes `r` within `timeout`. Every response says `nosniff`; what it may
/// cache, its content security policy and the rest come from its headers.
pub(crate) fn write_response(
    mut stream: &TcpStream,
    r: &Response,
    keep_alive: bool,
    timeout: Duration,
) -> std::io::Result<()> {
    stream.set_write_timeout(Some(timeout))?;
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
         X-Content-Type-Options: nosniff\r\nConnection: {}\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len(),
        if keep_alive && !r.close {
            "keep-alive"
        } else {
            "close"
        },
    );
    if !r
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("cache-control"))
    {
        head.push_str("Cache-Control: no-store\r\n");
    }
    for (name, value) in &r.headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    // One write: the answer leaves in as few segments as it can.
    let mut bytes = head.into_bytes();
    if !r.head_only {
        bytes.extend_from_slice(&r.body);
    }
    stream.write_all(&bytes)?;
    stream.flush()
}
