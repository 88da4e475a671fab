//! MCP: the operators' tools for AI assistants, over stdio (`reflexr <DB>
//! mcp`, [`Mcp::serve_stdio`]) and over HTTP (`POST /api/v1/mcp` on
//! `reflexr-admin`'s server, [`Mcp::handle_http`]). One dispatcher serves both; the protocol is written here on
//! `serde_json` (the official Rust SDK needs an async runtime, and the
//! protocol is small: framing, versions, tools, resources).
//!
//! # Revisions
//!
//! - **2025-11-25** and the older revisions clients still speak
//!   (2025-06-18, 2025-03-26, 2024-11-05): `initialize` negotiates — the
//!   client's version when supported, 2025-11-25 otherwise — then
//!   `tools/*`, `resources/*` and `ping`. The server keeps no session: any
//!   request after (or without) `initialize` is answered the same way.
//! - **2026-07-28**, stateless: a request whose `params._meta` carries
//!   `io.modelcontextprotocol/protocolVersion` is served in that revision's
//!   shape (`resultType`, `ttlMs`/`cacheScope` on lists and reads, server
//!   info in `_meta`); `server/discover` lists the supported versions; an
//!   unsupported version gets `-32022` with the supported list.
//!
//! JSON-RPC errors: `-32700` (not JSON; id null), `-32600` (not a request:
//! a batch, no `jsonrpc: "2.0"`, a bad id or method), `-32601` (no such
//! method), `-32602` (bad params, an unknown tool, a missing `_meta` key).
//! A tool that fails answers a result with `isError: true` and the reason.
//!
//! # Safety
//!
//! The tools call the engine's public operations, so a change made here is
//! checked and audited as one made in code: with the operator the server
//! was given (`--operator`, default `mcp`) and the `reason` argument every
//! mutating tool requires. `retry` is a dry run unless told otherwise;
//! `discard` and `reset_cursor` need `confirm: true`. In read-only mode
//! the mutating tools are not listed, and calling one is refused.
//!
//! # Cargo features
//!
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod http;
mod tools;

pub use http::HttpAnswer;

use std::io::{BufRead, Write};

use serde_json::{Map, Value, json};

use reflexr::Backend;
use reflexr::Engine;
use reflexr::Result;
use reflexr::Sqlite;

/// The revision served statelessly, per request.
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// The revisions negotiated by `initialize`, newest first.
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The longest line the stdio transport reads (a longer one is refused,
/// and skipped to its end).
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// JSON-RPC and MCP error codes.
pub(crate) mod code {
    pub const PARSE: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// A resource that is not there (2025-11-25 and older).
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// An HTTP header that disagrees with the body (2026-07-28).
    pub const HEADER_MISMATCH: i64 = -32020;
    /// A protocol version this server does not speak (2026-07-28).
    pub const UNSUPPORTED_VERSION: i64 = -32022;
}

/// How an MCP server acts.
#[derive(Debug, Clone)]
pub struct McpConfig {
    pub(crate) read_only: bool,
    pub(crate) operator: String,
}

impl Default for McpConfig {
    fn default() -> McpConfig {
        McpConfig {
            read_only: false,
            operator: "mcp".into(),
        }
    }
}

impl McpConfig {
    /// Mutating tools listed and allowed, changes audited as `mcp`.
    pub fn new() -> McpConfig {
        McpConfig::default()
    }

    /// Leaves the mutating tools out, and refuses them if called.
    pub fn read_only(mut self, read_only: bool) -> McpConfig {
        self.read_only = read_only;
        self
    }

    /// Who the audit log says made the changes (default `mcp`).
    pub fn operator(mut self, operator: impl Into<String>) -> McpConfig {
        self.operator = operator.into();
        self
    }
}

/// An MCP server on an engine: give it messages, it gives the answers.
///
/// ```no_run
/// # fn main() -> reflexr::Result<()> {
/// use reflexr::Engine;
/// use reflexr_mcp::{Mcp, McpConfig};
/// let engine = Engine::open("app.db")?;
/// let mcp = Mcp::new(engine, McpConfig::new().read_only(true));
/// mcp.serve_stdio(std::io::stdin().lock(), std::io::stdout().lock())?;
/// # Ok(()) }
/// ```
pub struct Mcp<B: Backend = Sqlite> {
    engine: Engine<B>,
    config: McpConfig,
}

/// The era a request is served in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Era {
    /// 2025-11-25 and older: `initialize`, then plain results.
    Legacy,
    /// 2026-07-28: `_meta` per request, results with `resultType`.
    Modern,
}

/// A JSON-RPC error.
#[derive(Debug, Clone)]
pub(crate) struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(crate) fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INVALID_PARAMS, message)
    }

    pub(crate) fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }
}

/// A request's head, for a transport's checks.
pub(crate) struct Head<'a> {
    pub method: &'a str,
    /// The 2026-07-28 version its `_meta` names, if any.
    pub meta_version: Option<&'a str>,
    /// The tool or resource it names.
    pub name: Option<&'a str>,
}

/// What the dispatcher made of one message, for a transport to answer.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The answer (None for a notification or a response).
    pub reply: Option<Value>,
    /// The request's method, when it was one.
    pub method: Option<String>,
    /// Its era, when it was a request.
    pub era: Option<Era>,
    /// The 2026-07-28 version it named in `_meta`, if any.
    pub meta_version: Option<String>,
    /// The tool or resource it names (`Mcp-Name` over HTTP).
    pub name: Option<String>,
    /// The error code of the answer, if it is an error.
    pub error: Option<i64>,
}

impl<B: Backend> Mcp<B> {
    /// A server on `engine`.
    pub fn new(engine: Engine<B>, config: McpConfig) -> Mcp<B> {
        Mcp { engine, config }
    }

    pub(crate) fn engine(&self) -> &Engine<B> {
        &self.engine
    }

    pub(crate) fn config(&self) -> &McpConfig {
        &self.config
    }

    /// Answers one message (a line of JSON text): the answer's text, or
    /// None when there is nothing to answer (a notification, a response).
    pub fn handle_line(&self, line: &str) -> Option<String> {
        self.dispatch(line).reply.map(|v| v.to_string())
    }

    /// Serves newline-delimited JSON-RPC from `input` to `output` until
    /// `input` ends. Only protocol messages are written to `output`.
    ///
    /// # Errors
    /// [`reflexr::Error::Io`] when `output` cannot be written or `input` read.
    pub fn serve_stdio(&self, mut input: impl BufRead, mut output: impl Write) -> Result<()> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let (n, whole) = read_line(&mut input, &mut line, MAX_LINE_BYTES)?;
            if n == 0 {
                return Ok(());
            }
            let reply = if whole {
                match std::str::from_utf8(&line) {
                    Ok(text) if text.trim().is_empty() => None,
                    Ok(text) => self.handle_line(text),
                    Err(_) => Some(
                        error_reply(
                            Value::Null,
                            &RpcError::new(code::PARSE, "parse error: the line is not UTF-8"),
                        )
                        .to_string(),
                    ),
                }
            } else {
                Some(
                    error_reply(
                        Value::Null,
                        &RpcError::new(
                            code::INVALID_REQUEST,
                            format!("a message is at most {MAX_LINE_BYTES} bytes"),
                        ),
                    )
                    .to_string(),
                )
            };
            if let Some(reply) = reply {
                output.write_all(reply.as_bytes())?;
                output.write_all(b"\n")?;
                output.flush()?;
            }
        }
    }

    /// Reads one message and works out its answer.
    pub(crate) fn dispatch(&self, text: &str) -> Outcome {
        self.dispatch_checked(text, &|_| Ok(()))
    }

    /// [`Mcp::dispatch`], with `check` run on a request's head before it is
    /// served (a transport's own rules: HTTP's headers must agree with the
    /// body); its error is the answer.
    pub(crate) fn dispatch_checked(
        &self,
        text: &str,
        check: &dyn Fn(&Head<'_>) -> Result<(), RpcError>,
    ) -> Outcome {
        let mut out = Outcome {
            reply: None,
            method: None,
            era: None,
            meta_version: None,
            name: None,
            error: None,
        };
        let msg: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                let err = RpcError::new(code::PARSE, format!("parse error: {e}"));
                out.error = Some(err.code);
                out.reply = Some(error_reply(Value::Null, &err));
                return out;
            }
        };
        let Some(obj) = msg.as_object() else {
            let why = if msg.is_array() {
                "batches are not supported: send one message at a time"
            } else {
                "a message is a JSON object"
            };
            let err = RpcError::new(code::INVALID_REQUEST, why);
            out.error = Some(err.code);
            out.reply = Some(error_reply(Value::Null, &err));
            return out;
        };
        let id = obj.get("id").cloned();
        let id_ok = matches!(&id, Some(Value::String(_) | Value::Number(_)));
        let reply_id = if id_ok {
            id.clone().unwrap()
        } else {
            Value::Null
        };
        let invalid = |why: &str, out: &mut Outcome| {
            let err = RpcError::new(code::INVALID_REQUEST, why);
            out.error = Some(err.code);
            out.reply = Some(error_reply(reply_id.clone(), &err));
        };
        if obj.get("jsonrpc") != Some(&json!("2.0")) {
            invalid("jsonrpc must be \"2.0\"", &mut out);
            return out;
        }
        let method = match obj.get("method") {
            Some(Value::String(m)) => m.clone(),
            Some(_) => {
                invalid("method must be a string", &mut out);
                return out;
            }
            // A response to something we never ask: nothing to answer.
            None if obj.contains_key("result") || obj.contains_key("error") => return out,
            None => {
                invalid("a request needs a method", &mut out);
                return out;
            }
        };
        out.method = Some(method.clone());
        let params = match obj.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => {
                if id.is_none() {
                    return out;
                }
                let err = RpcError::params("params must be an object");
                out.error = Some(err.code);
                out.reply = Some(error_reply(reply_id, &err));
                return out;
            }
        };
        out.name = ["name", "uri"]
            .iter()
            .find_map(|k| params.get(*k).and_then(Value::as_str).map(String::from));
        let Some(id) = id else {
            // A notification (initialized, cancelled, …): never answered.
            return out;
        };
        if !id_ok {
            invalid("id must be a string or a number", &mut out);
            return out;
        }
        let era = match era_of(&params) {
            Ok((era, version)) => {
                out.meta_version = version;
                era
            }
            Err(err) => {
                out.error = Some(err.code);
                out.reply = Some(error_reply(id, &err));
                return out;
            }
        };
        out.era = Some(era);
        let head = Head {
            method: &method,
            meta_version: out.meta_version.as_deref(),
            name: out.name.as_deref(),
        };
        if let Err(err) = check(&head) {
            out.error = Some(err.code);
            out.reply = Some(error_reply(id, &err));
            return out;
        }
        let result = self.request(era, &method, &params);
        out.reply = Some(match result {
            Ok(mut result) => {
                if era == Era::Modern {
                    result.insert("resultType".into(), json!("complete"));
                    let meta = result
                        .entry("_meta")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(m) = meta {
                        m.insert(META_SERVER_INFO.into(), server_info());
                    }
                }
                json!({ "jsonrpc": "2.0", "id": id, "result": result })
            }
            Err(err) => {
                out.error = Some(err.code);
                error_reply(id, &err)
            }
        });
        out
    }

    fn request(
        &self,
        era: Era,
        method: &str,
        params: &Map<String, Value>,
    ) -> Result<Map<String, Value>, RpcError> {
        let listing = |mut m: Map<String, Value>| {
            if era == Era::Modern {
                m.insert("ttlMs".into(), json!(0));
                m.insert("cacheScope".into(), json!("private"));
            }
            m
        };
        match (era, method) {
            (Era::Legacy, "initialize") => Ok(self.initialize(params)),
            (Era::Modern, "initialize") => Err(RpcError::new(
                code::INVALID_REQUEST,
                "initialize is not part of 2026-07-28: use server/discover",
            )),
            (_, "server/discover") => Ok(listing(object(json!({
                "supportedVersions": supported(),
                "capabilities": capabilities(),
                "serverInfo": server_info(),
                "instructions": INSTRUCTIONS,
            })))),
            (Era::Legacy, "ping") => Ok(Map::new()),
            (_, "tools/list") => {
                check_cursor(params)?;
                Ok(listing(object(json!({ "tools": tools::list(self) }))))
            }
            (_, "tools/call") => tools::call(self, params).map(object),
            (_, "resources/list") => {
                check_cursor(params)?;
                Ok(listing(object(json!({ "resources": tools::resources() }))))
            }
            (_, "resources/templates/list") => {
                check_cursor(params)?;
                Ok(listing(object(
                    json!({ "resourceTemplates": tools::resource_templates() }),
                )))
            }
            (_, "resources/read") => tools::read_resource(self, era, params).map(listing),
            _ => Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
            )),
        }
    }

    fn initialize(&self, params: &Map<String, Value>) -> Map<String, Value> {
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        let version = match asked {
            Some(v) if LEGACY_VERSIONS.contains(&v) => v,
            _ => LEGACY_VERSIONS[0],
        };
        object(json!({
            "protocolVersion": version,
            "capabilities": capabilities(),
            "serverInfo": server_info(),
            "instructions": INSTRUCTIONS,
        }))
    }
}

const INSTRUCTIONS: &str = "reflexr keeps an application's event log, the cursors of what reacts \
to it, runs, leases and dead letters in one SQLite file. Start with `status`; `list_dead_letters` \
and `list_runs` (state dead) say what failed and why; `retry` is a dry run unless dry_run is \
false; `discard` and `reset_cursor` need confirm: true. Every change needs a reason and is audited.";

fn capabilities() -> Value {
    json!({
        "tools": { "listChanged": false },
        "resources": { "subscribe": false, "listChanged": false },
    })
}

fn server_info() -> Value {
    json!({
        "name": "reflexr",
        "title": "reflexr operator tools",
        "version": env!("CARGO_PKG_VERSION"),
    })
}

fn supported() -> Vec<&'static str> {
    MODERN_VERSIONS
        .iter()
        .chain(LEGACY_VERSIONS)
        .copied()
        .collect()
}

/// Which era a request belongs to: 2026-07-28 when its `_meta` names a
/// version (which must be one served so, with the client's capabilities),
/// the negotiated era otherwise.
fn era_of(params: &Map<String, Value>) -> Result<(Era, Option<String>), RpcError> {
    let meta = params.get("_meta").and_then(Value::as_object);
    let Some(version) = meta.and_then(|m| m.get(META_VERSION)) else {
        return Ok((Era::Legacy, None));
    };
    let Some(version) = version.as_str() else {
        return Err(RpcError::params(format!(
            "_meta.{META_VERSION} must be a string"
        )));
    };
    if !MODERN_VERSIONS.contains(&version) {
        return Err(
            RpcError::new(code::UNSUPPORTED_VERSION, "Unsupported protocol version")
                .with_data(json!({ "supported": supported(), "requested": version })),
        );
    }
    if !meta.is_some_and(|m| m.get(META_CAPABILITIES).is_some_and(Value::is_object)) {
        return Err(RpcError::params(format!(
            "_meta.{META_CAPABILITIES} is required (an object)"
        )));
    }
    Ok((Era::Modern, Some(version.to_string())))
}

/// Every list fits one page: a cursor can only be one we never gave.
fn check_cursor(params: &Map<String, Value>) -> Result<(), RpcError> {
    match params.get("cursor") {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(RpcError::params("invalid cursor: every list fits one page")),
    }
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => {
            let mut m = Map::new();
            m.insert("value".into(), other);
            m
        }
    }
}

fn error_reply(id: Value, err: &RpcError) -> Value {
    let mut e = json!({ "code": err.code, "message": err.message });
    if let Some(data) = &err.data {
        e["data"] = data.clone();
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": e })
}

/// Reads up to a newline (dropped) into `buf`, keeping at most `max`
/// bytes: `(bytes read, whether the line fit)`. 0 bytes read: the end.
fn read_line(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<(usize, bool)> {
    let mut total = 0;
    let mut fits = true;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((total, fits));
        }
        let (used, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let data = &chunk[..if done { used - 1 } else { used }];
        if fits && buf.len() + data.len() <= max {
            buf.extend_from_slice(data);
        } else {
            fits = false;
            buf.clear();
        }
        total += used;
        input.consume(used);
        if done {
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok((total, fits));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_over_the_cap_is_skipped_to_its_end_and_the_next_one_is_read() {
        let text = format!("{}\nnext\n", "x".repeat(100));
        let mut input = std::io::BufReader::with_capacity(16, text.as_bytes());
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut input, &mut buf, 50).unwrap(), (101, false));
        buf.clear();
        assert_eq!(read_line(&mut input, &mut buf, 50).unwrap(), (5, true));
        assert_eq!(buf, b"next");
        buf.clear();
        assert_eq!(read_line(&mut input, &mut buf, 50).unwrap(), (0, true));
    }
}
