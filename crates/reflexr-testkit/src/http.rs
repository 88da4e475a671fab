//! Clients of the administration server for the tests: HTTP through `ureq`,
//! raw bytes for what a well-behaved client would never send, and a
//! WebSocket through `tungstenite`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::{Message, WebSocket};

/// How long a test waits for an answer before it fails (only matters when
/// it fails).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// An HTTP client of one server.
pub struct Api {
    pub addr: SocketAddr,
    agent: ureq::Agent,
    token: Option<String>,
}

impl Api {
    pub fn new(addr: SocketAddr, token: Option<&str>) -> Api {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(PATIENCE))
            .build()
            .into();
        Api {
            addr,
            agent,
            token: token.map(String::from),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn authed<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => r.header("Authorization", format!("Bearer {t}")),
            None => r,
        }
    }

    /// GET, the status and the body as JSON (`Value::Null` if it is not).
    pub fn get(&self, path: &str) -> (u16, Value) {
        let (status, text) = self.get_text(path);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// GET, the status and the body as text.
    pub fn get_text(&self, path: &str) -> (u16, String) {
        let mut r = self
            .authed(self.agent.get(self.url(path)))
            .call()
            .expect("a response");
        let status = r.status().as_u16();
        (status, r.body_mut().read_to_string().unwrap_or_default())
    }

    /// POST of a JSON body, the status and the answer as JSON.
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let mut r = self
            .authed(self.agent.post(self.url(path)))
            .send_json(body)
            .expect("a response");
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// POST with headers of the test's own.
    pub fn post_with(&self, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
        let mut req = self.authed(self.agent.post(self.url(path)));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut r = req.send(body).expect("a response");
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// Sends `bytes` as they are and reads the answer until the server closes
/// the connection: its status (0 if none came) and its whole text.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    (status_of(&text), text)
}

/// One request, as a browser on another name might send it: `method`,
/// `path`, the headers given (`Host` among them) and a JSON body if any.
/// The status and the answer's body as JSON (`Value::Null` if it is not).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, Value) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.map(Value::to_string).unwrap_or_default();
    let typed = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-type"));
    if !body.is_empty() && !typed {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let (status, text) = raw(addr, head.as_bytes());
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// The status code of a response's text.
pub fn status_of(text: &str) -> u16 {
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A WebSocket client of the stream; as an iterator, the JSON messages it
/// gets, pings skipped, until the server closes.
pub struct Stream {
    ws: WebSocket<TcpStream>,
}

impl Stream {
    /// Connects to `/api/v1/stream`, with the token as a header (or none),
    /// and an `Origin` if given. `Err(status)` when the upgrade is refused.
    pub fn connect(
        addr: SocketAddr,
        token: Option<&str>,
        origin: Option<&str>,
    ) -> Result<Stream, u16> {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = Vec::new();
        if let Some(b) = &bearer {
            headers.push(("Authorization", b.as_str()));
        }
        if let Some(o) = origin {
            headers.push(("Origin", o));
        }
        Stream::connect_with(addr, &headers)
    }

    /// Connects to `/api/v1/stream` with headers of the test's own (a
    /// `Host` among them replaces the address's).
    pub fn connect_with(addr: SocketAddr, headers: &[(&str, &str)]) -> Result<Stream, u16> {
        use tungstenite::client::IntoClientRequest;
        let mut req = format!("ws://{addr}/api/v1/stream")
            .into_client_request()
            .unwrap();
        for (name, value) in headers {
            let name = tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            req.headers_mut().insert(name, value.parse().unwrap());
        }
        let tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(PATIENCE)).unwrap();
        match tungstenite::client(req, tcp) {
            Ok((ws, _)) => Ok(Stream { ws }),
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
                Err(r.status().as_u16())
            }
            Err(e) => panic!("handshake: {e}"),
        }
    }

    /// Sends a JSON message.
    pub fn send(&mut self, v: Value) {
        self.ws.send(Message::text(v.to_string())).expect("send");
    }

    /// Messages until one for which `done` is true (that one included).
    pub fn until(&mut self, mut done: impl FnMut(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        let mut out = Vec::new();
        while Instant::now() < deadline {
            let Some(m) = self.next() else { break };
            let end = done(&m);
            out.push(m);
            if end {
                return out;
            }
        }
        let last: Vec<String> = out
            .iter()
            .rev()
            .take(3)
            .map(|m| {
                let t = m.to_string();
                t.chars().take(300).collect()
            })
            .collect();
        panic!(
            "the stream ended or stalled after {} messages; the last: {last:?}",
            out.len()
        );
    }

    /// The message that answers `op` (`subscribed`, `error`, …) with this id.
    pub fn answer(&mut self, id: &str) -> Value {
        self.until(|m| m["id"] == id && m["type"] != "event")
            .pop()
            .unwrap()
    }
}

impl Iterator for Stream {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        loop {
            match self.ws.read() {
                Ok(Message::Text(t)) => return Some(serde_json::from_str(t.as_str()).unwrap()),
                Ok(Message::Close(_)) => return None,
                Ok(_) => continue,
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    return None;
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }
}
