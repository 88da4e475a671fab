//! The REST routes under `/api/v1`, `/metrics` and `/healthz`: for each,
//! parse, authorise, call one of the engine's operations, render JSON.
//! Errors have one shape, `{"error": {"code", "message"}}`, and a status a
//! client can act on; nothing a client sends is a `500`.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use super::Server;
use super::http::{Request, Response};
use reflexr::Backend;
use reflexr::ConsumerKind;
use reflexr::Engine;
use reflexr::Error;
use reflexr::Query;
use reflexr::Retention;
use reflexr::RunState;
use reflexr::inspect::DeadLetterKind;
use reflexr::inspect::{DeadLetterFilter, RunFilter, RunFilterSpec};
use reflexr::limits::MAX_PAGE;

/// An answer that is not a success.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(404, "not_found", message)
    }

    pub fn response(&self) -> Response {
        let r = Response::error(self.status, self.code, &self.message);
        match self.status {
            401 => r.with_header("WWW-Authenticate", "Bearer"),
            503 => r.with_header("Retry-After", "1"),
            _ => r,
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let message = e.to_string();
        match e {
            Error::NotFound { .. } | Error::Missing { .. } => ApiError::not_found(message),
            Error::Conflict { .. }
            | Error::AlreadyExists { .. }
            | Error::LeaseHeld { .. }
            | Error::LeaseLost { .. }
            | Error::CursorBackwards { .. } => ApiError::new(409, "conflict", message),
            e if e.is_bad_input() => ApiError::bad(message),
            Error::Busy { .. } | Error::DiskFull { .. } | Error::ReadOnly { .. } => {
                ApiError::new(503, "unavailable", message)
            }
            _ => ApiError::new(500, "internal", message),
        }
    }
}

type Outcome = Result<Response, ApiError>;
type Handler<B> = fn(&Ctx<'_, B>) -> Outcome;

/// What a handler has: the engine, the request, its path's parameters.
pub(crate) struct Ctx<'a, B: Backend> {
    pub server: &'a Server<B>,
    pub req: &'a Request,
    params: Vec<(&'static str, String)>,
}

impl<B: Backend> Ctx<'_, B> {
    fn engine(&self) -> &Engine<B> {
        &self.server.engine
    }

    /// A parameter of the path (`{name}`).
    fn path(&self, name: &str) -> &str {
        self.params
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .expect("the route declares it")
    }
}

/// A route: its method and path (`{name}` for a segment), whether it
/// changes anything, and whether it needs the token.
pub(crate) struct Route<B: Backend> {
    pub method: &'static str,
    pub path: &'static str,
    pub mutating: bool,
    pub public: bool,
    handler: Handler<B>,
}

fn get<B: Backend>(path: &'static str, handler: Handler<B>) -> Route<B> {
    Route {
        method: "GET",
        path,
        mutating: false,
        public: false,
        handler,
    }
}

fn post<B: Backend>(path: &'static str, handler: Handler<B>) -> Route<B> {
    Route {
        method: "POST",
        path,
        mutating: true,
        public: false,
        handler,
    }
}

/// Every route. The stream (`GET /api/v1/stream`, a WebSocket upgrade) is
/// answered before routing; a plain GET of it is told to upgrade.
pub(crate) fn routes<B: Backend>() -> Vec<Route<B>> {
    vec![
        Route {
            public: true,
            ..get("/healthz", healthz)
        },
        Route {
            public: true,
            ..get("/", console_index)
        },
        Route {
            public: true,
            ..get("/console/{file}", console_file)
        },
        get("/metrics", metrics),
        get("/api/v1/openapi.json", openapi),
        get("/api/v1/stream", stream_without_upgrade),
        get("/api/v1/status", status),
        get("/api/v1/stats", stats),
        get("/api/v1/workspaces", workspaces),
        get("/api/v1/workspaces/{workspace}/events", events),
        get("/api/v1/workspaces/{workspace}/events/{id}", event_by_id),
        get("/api/v1/events/{seq}", event_by_seq),
        get("/api/v1/runs", runs),
        get("/api/v1/runs/{id}", run),
        get("/api/v1/runs/{id}/steps", run_steps),
        get("/api/v1/runs/{id}/logs", run_logs),
        post("/api/v1/runs/{id}/retry", retry_run),
        post("/api/v1/runs/{id}/discard", discard_run),
        post("/api/v1/runs/{id}/cancel", cancel_run),
        post("/api/v1/runs/{id}/reset", reset_run),
        post("/api/v1/runs/retry", bulk_retry_runs),
        post("/api/v1/runs/discard", bulk_discard_runs),
        get("/api/v1/dead-letters", dead_letters),
        post("/api/v1/dead-letters/{id}/retry", retry_dead_letter),
        post("/api/v1/dead-letters/{id}/discard", discard_dead_letter),
        post("/api/v1/dead-letters/retry", bulk_retry_dead_letters),
        post("/api/v1/dead-letters/discard", bulk_discard_dead_letters),
        get("/api/v1/lanes", lanes),
        get("/api/v1/actions", actions),
        post("/api/v1/actions/configure", configure_action),
        get("/api/v1/actions/{action}/keys", action_keys),
        post("/api/v1/actions/{action}/keys", set_key_limits),
        post("/api/v1/actions/{action}/keys/clear", clear_key_limits),
        post("/api/v1/pause", pause),
        post("/api/v1/resume", resume),
        post("/api/v1/lanes/unblock", unblock),
        post("/api/v1/cursors/reset", reset_cursor),
        post("/api/v1/prune", prune),
        get("/api/v1/leases", leases),
        get("/api/v1/rules", rules),
        get("/api/v1/rules/{name}", rule),
        post("/api/v1/rules/{name}/promote", promote_rule),
        get("/api/v1/rules/{name}/state/{scope}", rule_state),
        get("/api/v1/reactions", reactions),
        get("/api/v1/followers", followers),
        post("/api/v1/followers/{name}/restart", restart_follower),
        get("/api/v1/schedules", schedules),
        get("/api/v1/audit", audit),
        // Not `mutating`: read-only mode hides MCP's mutating tools instead of
        // refusing the route; the cross-site and JSON checks are the handler's.
        Route {
            mutating: false,
            ..post("/api/v1/mcp", mcp)
        },
    ]
}

/// The parameters of a path, given as its decoded segments
/// ([`Request::segments`]), if it matches `pattern`.
fn matches(pattern: &'static str, path: &[String]) -> Option<Vec<(&'static str, String)>> {
    let p: Vec<&'static str> = pattern.trim_end_matches('/').split('/').collect();
    if p.len() != path.len() {
        return None;
    }
    let mut params = Vec::new();
    for (a, b) in p.into_iter().zip(path) {
        if let Some(name) = a.strip_prefix('{').and_then(|n| n.strip_suffix('}')) {
            if b.is_empty() {
                return None;
            }
            params.push((name, b.clone()));
        } else if a != b {
            return None;
        }
    }
    Some(params)
}

/// Answers one request.
pub(crate) fn handle<B: Backend>(server: &Server<B>, req: &Request) -> Response {
    match route(server, req) {
        Ok(r) => r,
        Err(e) => e.response(),
    }
}

fn route<B: Backend>(server: &Server<B>, req: &Request) -> Outcome {
    // A path that matches a route's literal segment is that route's, not a
    // parameter's (`/api/v1/runs/retry` is the bulk retry, not the run
    // "retry"), as OpenAPI reads paths: only the matches with the most
    // literal segments count.
    let literal = |p: &str| p.split('/').filter(|s| !s.starts_with('{')).count();
    let matched: Vec<_> = server
        .routes
        .iter()
        .filter_map(|r| matches(r.path, &req.segments).map(|params| (r, params)))
        .collect();
    let most = matched.iter().map(|(r, _)| literal(r.path)).max();
    let mut allowed = Vec::new();
    let mut found = None;
    for (r, params) in matched {
        if Some(literal(r.path)) != most {
            continue;
        }
        allowed.push(r.method);
        if found.is_none()
            && (r.method == req.method || (req.method == "HEAD" && r.method == "GET"))
        {
            found = Some((r, params));
        }
    }
    let Some((r, params)) = found else {
        if allowed.is_empty() {
            return Err(ApiError::not_found(format!("no route {}", req.path)));
        }
        return Ok(ApiError::new(
            405,
            "method_not_allowed",
            format!("{} {}: use {}", req.method, req.path, allowed.join(", ")),
        )
        .response()
        .with_header("Allow", allowed.join(", ")));
    };
    if !r.public {
        authorise(server, req)?;
    }
    if r.mutating {
        check_mutation(server, req)?;
    }
    let ctx = Ctx {
        server,
        req,
        params,
    };
    (r.handler)(&ctx)
}

/// The request's `Host` must name this server ([`super::hosts`]): checked
/// before any route, the stream's upgrade and MCP included.
pub(crate) fn check_host<B: Backend>(server: &Server<B>, req: &Request) -> Result<(), ApiError> {
    let mut given = req.headers.iter().filter(|(n, _)| n == "host");
    match (given.next(), given.next()) {
        (Some(_), Some(_)) => Err(ApiError::bad("a request has one Host header")),
        (None, _) if req.http11 => Err(ApiError::bad("an HTTP/1.1 request says its Host")),
        (None, _) => Ok(()),
        (Some((_, host)), None) if server.hosts.allows(host, 80) => Ok(()),
        (Some((_, host)), None) => Err(ApiError::new(
            421,
            "unknown_host",
            format!(
                "this server does not answer to Host {host:?}: it answers to localhost and \
                 its own addresses with its port, and to names allowed with --allow-host \
                 (AdminConfig::allow_host)"
            ),
        )),
    }
}

/// With a token configured, the request must carry it: `Authorization:
/// Bearer <token>`, the scheme's name in any case (RFC 9110, 11.1).
pub(crate) fn authorise<B: Backend>(server: &Server<B>, req: &Request) -> Result<(), ApiError> {
    let Some(token) = &server.config.token else {
        return Ok(());
    };
    let given = req.header("authorization").and_then(|h| {
        let (scheme, credentials) = h.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then_some(credentials.trim())
    });
    match given {
        Some(g) if bool::from(g.as_bytes().ct_eq(token.as_bytes())) => Ok(()),
        Some(_) => Err(ApiError::new(401, "unauthorized", "the token is wrong")),
        None => Err(ApiError::new(
            401,
            "unauthorized",
            "a token is required: Authorization: Bearer <token>",
        )),
    }
}

/// A browser on another site must not be able to act: the origin of the
/// request, when a browser says it, must be a page of this server — one of
/// the names its `Host` may be, never merely the `Host` the request
/// itself sends (a rebound name sends both).
pub(crate) fn same_origin<B: Backend>(server: &Server<B>, req: &Request) -> Result<(), ApiError> {
    if let Some(site) = req.header("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return Err(ApiError::new(
            403,
            "cross_site",
            format!("a cross-site request ({site}) is refused"),
        ));
    }
    if let Some(origin) = req.header("origin")
        && !server.hosts.allows_origin(origin)
    {
        return Err(ApiError::new(
            403,
            "cross_site",
            format!("origin {origin} is not a page of this server"),
        ));
    }
    Ok(())
}

/// Whether the request's body is JSON (`Content-Type: application/json`,
/// parameters allowed, the media type in any case: RFC 9110, 8.3.1).
pub(crate) fn is_json(req: &Request) -> bool {
    req.header("content-type").is_some_and(|c| {
        c.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("application/json")
    })
}

fn check_mutation<B: Backend>(server: &Server<B>, req: &Request) -> Result<(), ApiError> {
    if server.config.read_only {
        return Err(ApiError::new(
            403,
            "read_only",
            "the server is read-only: it changes nothing",
        ));
    }
    same_origin(server, req)?;
    if !is_json(req) {
        return Err(ApiError::new(
            415,
            "unsupported_media_type",
            "a change is asked with a JSON body (Content-Type: application/json)",
        ));
    }
    Ok(())
}

// ----- parsing -----------------------------------------------------------

fn body<B: Backend, T: DeserializeOwned>(ctx: &Ctx<'_, B>) -> Result<T, ApiError> {
    if ctx.req.body.is_empty() {
        return Err(ApiError::bad("a JSON body is required"));
    }
    serde_json::from_slice(&ctx.req.body).map_err(|e| ApiError::bad(format!("the body: {e}")))
}

/// Refuses query parameters the route does not know (besides the prefixed
/// ones it takes, e.g. `input.`).
fn only_params<B: Backend>(
    ctx: &Ctx<'_, B>,
    known: &[&str],
    prefix: Option<&str>,
) -> Result<(), ApiError> {
    for (name, _) in &ctx.req.query {
        let ok = known.contains(&name.as_str())
            || prefix.is_some_and(|p| name.starts_with(p) && name.len() > p.len());
        if !ok {
            return Err(ApiError::bad(format!("unknown query parameter {name:?}")));
        }
    }
    Ok(())
}

fn int_param<B: Backend>(ctx: &Ctx<'_, B>, name: &str) -> Result<Option<i64>, ApiError> {
    ctx.req
        .param(name)
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| ApiError::bad(format!("{name}={v:?} is not a whole number")))
        })
        .transpose()
}

fn limit_param<B: Backend>(ctx: &Ctx<'_, B>) -> Result<usize, ApiError> {
    match int_param(ctx, "limit")? {
        None => Ok(100),
        Some(n) if (1..=MAX_PAGE as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::bad(format!("limit={n}: 1 to {MAX_PAGE}"))),
    }
}

fn bool_param<B: Backend>(ctx: &Ctx<'_, B>, name: &str) -> Result<bool, ApiError> {
    match ctx.req.param(name) {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") | Some("") => Ok(true),
        Some(v) => Err(ApiError::bad(format!("{name}={v:?}: true or false"))),
    }
}

fn parsed<T: std::str::FromStr<Err = Error>, B: Backend>(
    ctx: &Ctx<'_, B>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    ctx.req
        .param(name)
        .map(|v| v.parse::<T>().map_err(ApiError::from))
        .transpose()
}

fn ok(value: &impl serde::Serialize) -> Outcome {
    Ok(Response::json(200, value))
}

/// A value given as text in a query: JSON if it parses (`42`, `"42"`,
/// `true`), the text itself otherwise.
fn query_value(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
}

// ----- reads ---------------------------------------------------------------

fn console_index<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    super::console::serve(ctx.req, "index.html")
}

fn console_file<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    super::console::serve(ctx.req, ctx.path("file"))
}

fn healthz<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let head = ctx.engine().head_seq()?;
    ok(&json!({ "ok": true, "head_seq": head }))
}

fn metrics<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let text = super::metrics::render(ctx.engine())?;
    Ok(Response {
        status: 200,
        content_type: "text/plain; version=0.0.4; charset=utf-8",
        body: text.into_bytes(),
        headers: Vec::new(),
        close: false,
        head_only: false,
    })
}

fn openapi<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    Ok(Response {
        status: 200,
        content_type: "application/json",
        body: ctx.server.openapi.as_bytes().to_vec(),
        headers: vec![("Cache-Control", "no-cache".into())],
        close: false,
        head_only: false,
    })
}

fn stream_without_upgrade<B: Backend>(_: &Ctx<'_, B>) -> Outcome {
    Err(ApiError::bad(
        "the stream is a WebSocket: send Upgrade: websocket",
    ))
}

/// A lease's state at `now`: held, lapsed, released.
fn lease_state(expires_at: i64, now: i64) -> &'static str {
    match expires_at {
        0 => "released",
        t if t > now => "held",
        _ => "lapsed",
    }
}

fn leases_json<B: Backend>(e: &Engine<B>) -> Result<Vec<Value>, ApiError> {
    let now = e.now_ms();
    e.leases()?
        .into_iter()
        .map(|l| {
            let state = lease_state(l.expires_at, now);
            let mut v = serde_json::to_value(l)
                .map_err(|e| ApiError::new(500, "internal", e.to_string()))?;
            v["state"] = json!(state);
            Ok(v)
        })
        .collect()
}

fn status<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let e = ctx.engine();
    let stats = e.stats()?;
    let stuck: Vec<_> = stats.cursors.iter().filter(|c| c.is_stuck()).collect();
    ok(&json!({
        "now": e.now_ms(),
        "read_only": ctx.server.config.read_only,
        "head_seq": stats.events_appended,
        "workspaces": e.workspaces()?,
        "consumers": stats.cursors,
        "stuck": stuck,
        "leases": leases_json(e)?,
        "runs": stats.runs,
        "oldest_ready_due_at": stats.oldest_ready_due_at,
        "dead_letters": stats.dead_letters,
        "blocked_lanes": stats.blocked_lanes,
        "paused": e.paused()?,
        "followers": stats.followers,
    }))
}

fn stats<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    ok(&ctx.engine().stats()?)
}

fn workspaces<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    ok(&ctx.engine().workspaces()?)
}

fn events<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &["after", "type", "subject", "limit"], None)?;
    let mut q = Query::new(ctx.path("workspace"))
        .after(int_param(ctx, "after")?.unwrap_or(0))
        .limit(limit_param(ctx)?)
        .types(
            ctx.req
                .query
                .iter()
                .filter(|(n, _)| n == "type")
                .map(|(_, v)| v.clone()),
        );
    if let Some(s) = ctx.req.param("subject") {
        q = q.subject(s);
    }
    ok(&ctx.engine().events_page(&q)?)
}

fn event_by_id<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    match ctx
        .engine()
        .event_by_id(ctx.path("workspace"), ctx.path("id"))?
    {
        Some(ev) => ok(&ev),
        None => Err(ApiError::not_found(format!(
            "no event {:?} in {}",
            ctx.path("id"),
            ctx.path("workspace")
        ))),
    }
}

fn event_by_seq<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let seq: i64 = ctx
        .path("seq")
        .parse()
        .map_err(|_| ApiError::bad(format!("{:?} is not a seq", ctx.path("seq"))))?;
    match ctx.engine().event(seq)? {
        Some(ev) => ok(&ev),
        None => Err(ApiError::not_found(format!("no event at seq {seq}"))),
    }
}

fn run_filter<B: Backend>(ctx: &Ctx<'_, B>) -> Result<RunFilter, ApiError> {
    only_params(
        ctx,
        &[
            "state",
            "action",
            "rule",
            "workspace",
            "scope",
            "before",
            "limit",
        ],
        Some("input."),
    )?;
    let mut f = RunFilter::new().limit(limit_param(ctx)?);
    f.state = parsed::<RunState, _>(ctx, "state")?;
    f.action = ctx.req.param("action").map(String::from);
    f.rule = ctx.req.param("rule").map(String::from);
    f.workspace = ctx.req.param("workspace").map(String::from);
    f.scope = ctx.req.param("scope").map(String::from);
    f.before = int_param(ctx, "before")?;
    let inputs: Vec<_> = ctx
        .req
        .query
        .iter()
        .filter_map(|(n, v)| n.strip_prefix("input.").map(|p| (p, v)))
        .collect();
    match inputs.as_slice() {
        [] => {}
        [(path, value)] => f.input = Some(((*path).to_string(), query_value(value))),
        _ => return Err(ApiError::bad("one input.<path>=<value> at a time")),
    }
    Ok(f)
}

fn runs<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let f = run_filter(ctx)?;
    ok(&ctx.engine().find_runs(&f)?)
}

fn run<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    match ctx.engine().run_detail(ctx.path("id"))? {
        Some(d) => ok(&d),
        None => Err(ApiError::not_found(format!("no run {:?}", ctx.path("id")))),
    }
}

fn run_steps<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    ok(&ctx.engine().run_steps(ctx.path("id"))?)
}

/// A page of a run's log after a line, with its progress: `next` is the
/// last line's number (or `after` when there is none), to ask from next.
fn run_logs<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &["after", "limit"], None)?;
    let after = match int_param(ctx, "after")? {
        None => 0,
        Some(n) if n >= 0 => n,
        Some(n) => {
            return Err(ApiError::bad(format!(
                "after={n}: a line number, 0 or more"
            )));
        }
    };
    let limit = limit_param(ctx)?;
    let id = ctx.path("id");
    let engine = ctx.engine();
    if engine.run(id)?.is_none() {
        return Err(ApiError::not_found(format!("no run {id:?}")));
    }
    let logs = engine.run_logs(id, after, limit)?;
    let progress = engine.run_progress(id)?;
    let next = logs.last().map_or(after, |l| l.n);
    ok(&json!({ "logs": logs, "progress": progress, "next": next }))
}

fn dead_letters<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(
        ctx,
        &[
            "kind",
            "consumer",
            "workspace",
            "reason",
            "all",
            "before",
            "limit",
        ],
        None,
    )?;
    let mut f = DeadLetterFilter::new()
        .limit(limit_param(ctx)?)
        .include_resolved(bool_param(ctx, "all")?);
    f.kind = parsed::<DeadLetterKind, _>(ctx, "kind")?;
    f.consumer = ctx.req.param("consumer").map(String::from);
    f.workspace = ctx.req.param("workspace").map(String::from);
    f.reason = ctx.req.param("reason").map(String::from);
    f.before = int_param(ctx, "before")?;
    ok(&ctx.engine().find_dead_letters(&f)?)
}

fn leases<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    ok(&leases_json(ctx.engine())?)
}

fn rules<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    ok(&ctx.engine().rules()?)
}

fn rule<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let name = ctx.path("name");
    match ctx.engine().rules()?.into_iter().find(|r| r.name == name) {
        Some(r) => ok(&r),
        None => Err(ApiError::not_found(format!("no rule {name:?}"))),
    }
}

fn rule_state<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let (name, scope) = (ctx.path("name"), ctx.path("scope"));
    match ctx.engine().rule_state::<Value>(name, scope)? {
        Some(state) => ok(&json!({ "rule": name, "scope": scope, "state": state })),
        None => Err(ApiError::not_found(format!(
            "rule {name:?} has no state for scope {scope:?}"
        ))),
    }
}

fn reactions<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let cursors: Vec<_> = ctx
        .engine()
        .cursors()?
        .into_iter()
        .filter(|c| c.kind == ConsumerKind::Reaction)
        .collect();
    ok(&cursors)
}

fn followers<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    ok(&ctx.engine().followers()?)
}

fn schedules<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    ok(&ctx.engine().schedules()?)
}

fn audit<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &["limit"], None)?;
    ok(&ctx.engine().audit_log(limit_param(ctx)?)?)
}

/// MCP's Streamable HTTP transport, JSON responses only: one JSON-RPC
/// message a POST; a notification gets 202 and no body.
#[cfg(feature = "mcp")]
fn mcp<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    use reflexr_mcp::McpConfig;
    same_origin(ctx.server, ctx.req)?;
    if !is_json(ctx.req) {
        return Err(ApiError::new(
            415,
            "unsupported_media_type",
            "send application/json",
        ));
    }
    if let Some(accept) = ctx.req.header("accept")
        && !["application/json", "*/*", "application/*"]
            .iter()
            .any(|t| accept.to_ascii_lowercase().contains(t))
    {
        return Err(ApiError::new(
            406,
            "not_acceptable",
            "this server answers application/json",
        ));
    }
    let Ok(text) = std::str::from_utf8(&ctx.req.body) else {
        return Err(ApiError::bad("the body is not UTF-8"));
    };
    let server = reflexr_mcp::Mcp::new(
        ctx.engine().clone(),
        McpConfig::new().read_only(ctx.server.config.read_only),
    );
    let answer = server.handle_http(&|n| ctx.req.header(n), text);
    Ok(match answer.body {
        Some(body) => Response::json(answer.status, &body),
        None => Response {
            status: answer.status,
            content_type: "application/json",
            body: Vec::new(),
            headers: Vec::new(),
            close: false,
            head_only: false,
        },
    })
}

#[cfg(not(feature = "mcp"))]
fn mcp<B: Backend>(_: &Ctx<'_, B>) -> Outcome {
    Err(ApiError::not_found(
        "MCP is not in this build (feature mcp)".to_string(),
    ))
}

// ----- changes -------------------------------------------------------------

/// Who asks for a change, and why: every change's body names them, and the
/// audit log records them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Who {
    operator: String,
    reason: String,
}

fn done(action: &str) -> Outcome {
    ok(&json!({ "ok": true, "action": action }))
}

fn retry_run<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let w: Who = body(ctx)?;
    ctx.engine()
        .operator(w.operator, w.reason)?
        .retry_run(ctx.path("id"))?;
    done("retried")
}

fn discard_run<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let w: Who = body(ctx)?;
    ctx.engine()
        .operator(w.operator, w.reason)?
        .discard_run(ctx.path("id"))?;
    done("discarded")
}

fn dead_letter_id<B: Backend>(ctx: &Ctx<'_, B>) -> Result<i64, ApiError> {
    ctx.path("id")
        .parse()
        .map_err(|_| ApiError::bad(format!("{:?} is not a dead letter's id", ctx.path("id"))))
}

fn retry_dead_letter<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let id = dead_letter_id(ctx)?;
    let w: Who = body(ctx)?;
    ctx.engine()
        .operator(w.operator, w.reason)?
        .retry_dead_letter(id)?;
    done("retried")
}

fn discard_dead_letter<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let id = dead_letter_id(ctx)?;
    let w: Who = body(ctx)?;
    ctx.engine()
        .operator(w.operator, w.reason)?
        .discard_dead_letter(id)?;
    done("discarded")
}

/// A bulk change: what to act on (a filter, or ids from a dry run), and
/// whether to act (`confirm: true`) or only say what would be acted on.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkRuns {
    operator: String,
    reason: String,
    filter: Option<RunFilterSpec>,
    ids: Option<Vec<String>>,
    #[serde(default)]
    confirm: bool,
    max: Option<usize>,
}

fn bulk_max(max: Option<usize>) -> Result<usize, ApiError> {
    match max {
        None => Ok(reflexr::limits::MAX_BULK),
        Some(n) if (1..=reflexr::limits::MAX_BULK).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad(format!(
            "max={n}: 1 to {}",
            reflexr::limits::MAX_BULK
        ))),
    }
}

/// Ids given to act on: as many as one bulk change takes, dry run or not.
fn bulk_ids<T>(ids: Vec<T>) -> Result<Vec<T>, ApiError> {
    if ids.len() > reflexr::limits::MAX_BULK {
        return Err(ApiError::bad(format!(
            "{} ids; at most {} at once",
            ids.len(),
            reflexr::limits::MAX_BULK
        )));
    }
    Ok(ids)
}

fn bulk_runs<B: Backend>(ctx: &Ctx<'_, B>, discard: bool) -> Outcome {
    let b: BulkRuns = body(ctx)?;
    // A dry run changes nothing, but who asks is checked all the same: the
    // confirmed call with the same body must not fail on it.
    let ops = ctx.engine().operator(b.operator, b.reason)?;
    let max = bulk_max(b.max)?;
    let (ids, more) = match (b.ids, b.filter) {
        (Some(ids), None) => (bulk_ids(ids)?, false),
        (None, Some(f)) => {
            let m = ops.matching_dead_runs(&f.filter()?, max)?;
            (m.ids, m.more)
        }
        _ => return Err(ApiError::bad("give either a filter or ids")),
    };
    if !b.confirm {
        return ok(&json!({ "dry_run": true, "matched": ids.len(), "ids": ids, "more": more }));
    }
    let bulk = if discard {
        ops.discard_runs(&ids)?
    } else {
        ops.retry_runs(&ids)?
    };
    ok(&json!({ "dry_run": false, "done": bulk.done, "skipped": bulk.skipped, "more": more }))
}

fn bulk_retry_runs<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    bulk_runs(ctx, false)
}

fn bulk_discard_runs<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    bulk_runs(ctx, true)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DeadLetterFilterBody {
    kind: Option<String>,
    consumer: Option<String>,
    workspace: Option<String>,
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkDeadLetters {
    operator: String,
    reason: String,
    filter: Option<DeadLetterFilterBody>,
    ids: Option<Vec<i64>>,
    #[serde(default)]
    confirm: bool,
    max: Option<usize>,
}

fn bulk_dead_letters<B: Backend>(ctx: &Ctx<'_, B>, discard: bool) -> Outcome {
    let b: BulkDeadLetters = body(ctx)?;
    // A dry run changes nothing, but who asks is checked all the same: the
    // confirmed call with the same body must not fail on it.
    let ops = ctx.engine().operator(b.operator, b.reason)?;
    let max = bulk_max(b.max)?;
    let (ids, more) = match (b.ids, b.filter) {
        (Some(ids), None) => (bulk_ids(ids)?, false),
        (None, Some(f)) => {
            let mut filter = DeadLetterFilter::new();
            filter.kind = f.kind.map(|k| k.parse::<DeadLetterKind>()).transpose()?;
            filter.consumer = f.consumer;
            filter.workspace = f.workspace;
            filter.reason = f.reason;
            let m = ops.matching_dead_letters(&filter, max)?;
            (m.ids, m.more)
        }
        _ => return Err(ApiError::bad("give either a filter or ids")),
    };
    if !b.confirm {
        return ok(&json!({ "dry_run": true, "matched": ids.len(), "ids": ids, "more": more }));
    }
    let bulk = if discard {
        ops.discard_dead_letters(&ids)?
    } else {
        ops.retry_dead_letters(&ids)?
    };
    ok(&json!({ "dry_run": false, "done": bulk.done, "skipped": bulk.skipped, "more": more }))
}

fn bulk_retry_dead_letters<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    bulk_dead_letters(ctx, false)
}

fn bulk_discard_dead_letters<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    bulk_dead_letters(ctx, true)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Unblock {
    rule: String,
    scope: String,
    operator: String,
    reason: String,
}

fn cancel_run<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let w: Who = body(ctx)?;
    let was = ctx
        .engine()
        .operator(w.operator, w.reason)?
        .cancel_run(ctx.path("id"))?;
    ok(&json!({ "ok": true, "action": "cancel", "was": was }))
}

/// A reset of a workflow run to one of its steps: which step, who and why.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRun {
    step: String,
    operator: String,
    reason: String,
}

fn reset_run<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: ResetRun = body(ctx)?;
    ctx.engine()
        .operator(b.operator, b.reason)?
        .reset_run_to_step(ctx.path("id"), &b.step)?;
    ok(&json!({ "ok": true, "action": "reset", "step": b.step }))
}

fn actions<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let e = ctx.engine();
    ok(&json!({ "actions": e.action_configs()?, "paused": e.paused()? }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Configure {
    action: String,
    #[serde(default)]
    priority: i64,
    max_running: Option<u32>,
    rate_count: Option<u32>,
    rate_period_ms: Option<u64>,
    partition_by: Option<String>,
    #[serde(default)]
    fair: bool,
    operator: String,
    reason: String,
}

/// `rate_count` and `rate_period_ms`, which go together: a rate, or none.
fn rate_of(
    count: Option<u32>,
    period_ms: Option<u64>,
) -> Result<Option<(u32, std::time::Duration)>, ApiError> {
    match (count, period_ms) {
        (Some(n), Some(ms)) => Ok(Some((n, std::time::Duration::from_millis(ms)))),
        (None, None) => Ok(None),
        _ => Err(ApiError::bad("rate_count and rate_period_ms go together")),
    }
}

fn configure_action<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: Configure = body(ctx)?;
    let mut c = reflexr::ActionConfig::new(b.action).priority(b.priority);
    if let Some(n) = b.max_running {
        c = c.max_running(n);
    }
    if let Some((n, period)) = rate_of(b.rate_count, b.rate_period_ms)? {
        c = c.rate(n, period);
    }
    if let Some(f) = b.partition_by {
        c = c.partition_by(f);
    }
    if b.fair {
        c = c.fair();
    }
    ctx.engine()
        .operator(b.operator, b.reason)?
        .configure_action(&c)?;
    done("configure_action")
}

/// A keyed action's keys (each one's runs and the limits that hold for
/// it) and the keys' own overrides; both empty for an action without keys.
fn action_keys<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &[], None)?;
    let (e, action) = (ctx.engine(), ctx.path("action"));
    ok(&json!({ "keys": e.action_keys(action)?, "limits": e.key_limits(action)? }))
}

/// One key's limits and weight, replacing what the key had (a field left
/// out is the action's).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetKeyLimits {
    key: String,
    max_running: Option<u32>,
    rate_count: Option<u32>,
    rate_period_ms: Option<u64>,
    weight: Option<u32>,
    operator: String,
    reason: String,
}

fn set_key_limits<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: SetKeyLimits = body(ctx)?;
    let mut k = reflexr::KeyLimits::new(b.key);
    if let Some(n) = b.max_running {
        k = k.max_running(n);
    }
    if let Some((n, period)) = rate_of(b.rate_count, b.rate_period_ms)? {
        k = k.rate(n, period);
    }
    if let Some(w) = b.weight {
        k = k.weight(w);
    }
    ctx.engine()
        .operator(b.operator, b.reason)?
        .set_key_limits(ctx.path("action"), &k)?;
    done("set_key_limits")
}

/// Which key's overrides to clear, who and why.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClearKeyLimits {
    key: String,
    operator: String,
    reason: String,
}

fn clear_key_limits<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: ClearKeyLimits = body(ctx)?;
    ctx.engine()
        .operator(b.operator, b.reason)?
        .clear_key_limits(ctx.path("action"), &b.key)?;
    done("clear_key_limits")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    kind: String,
    name: String,
    operator: String,
    reason: String,
}

impl PauseBody {
    fn target(&self) -> Result<reflexr::Pausable, ApiError> {
        Ok(reflexr::Pausable::parse(&self.kind, &self.name)?)
    }
}

fn pause<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: PauseBody = body(ctx)?;
    let what = b.target()?;
    let fresh = ctx.engine().operator(b.operator, b.reason)?.pause(&what)?;
    ok(&json!({ "ok": true, "action": "pause", "paused_now": fresh }))
}

fn resume<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: PauseBody = body(ctx)?;
    let what = b.target()?;
    ctx.engine().operator(b.operator, b.reason)?.resume(&what)?;
    done("resume")
}

fn lanes<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    only_params(ctx, &["limit"], None)?;
    ok(&json!({ "blocked": ctx.engine().blocked_lanes(limit_param(ctx)?)? }))
}

fn unblock<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: Unblock = body(ctx)?;
    ctx.engine()
        .operator(b.operator, b.reason)?
        .unblock(&b.rule, &b.scope)?;
    done("unblocked")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetCursor {
    workspace: String,
    kind: String,
    name: String,
    to: i64,
    operator: String,
    reason: String,
}

fn reset_cursor<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: ResetCursor = body(ctx)?;
    let kind: ConsumerKind = b.kind.parse()?;
    let reset = ctx.engine().operator(b.operator, b.reason)?.reset_cursor(
        &b.workspace,
        kind,
        &b.name,
        b.to,
    )?;
    ok(&reset)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Prune {
    events_older_than_ms: Option<u64>,
    work_older_than_ms: Option<u64>,
    batch: Option<usize>,
    operator: String,
    reason: String,
}

fn prune<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let b: Prune = body(ctx)?;
    if b.events_older_than_ms.is_none() && b.work_older_than_ms.is_none() {
        return Err(ApiError::bad(
            "say what to prune: events_older_than_ms and/or work_older_than_ms",
        ));
    }
    let retention = Retention {
        events: b.events_older_than_ms.map(std::time::Duration::from_millis),
        finished_work: b.work_older_than_ms.map(std::time::Duration::from_millis),
        batch: b.batch.unwrap_or(1_000),
    };
    let pruned = ctx
        .engine()
        .operator(b.operator, b.reason)?
        .prune(&retention)?;
    ok(&pruned)
}

/// Hands a rule over to its version in shadow: answers the handover
/// position, the seq after which the shadow decides as the live rule.
fn promote_rule<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let w: Who = body(ctx)?;
    let at = ctx
        .engine()
        .operator(w.operator, w.reason)?
        .promote_rule(ctx.path("name"))?;
    ok(&json!({ "ok": true, "action": "promoted", "at": at }))
}

fn restart_follower<B: Backend>(ctx: &Ctx<'_, B>) -> Outcome {
    let w: Who = body(ctx)?;
    ctx.engine()
        .operator(w.operator, w.reason)?
        .restart_follower(ctx.path("name"))?;
    done("restart requested")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_openapi_json_is_the_document_the_server_makes() {
        // The document is made from the routes (every route has its entry,
        // every entry a route: `openapi::document` panics otherwise) and
        // written out as crates/reflexr-admin/openapi.json for readers and tools. Run with
        // REFLEXR_WRITE_OPENAPI=1 to write it after a change.
        let made = super::super::openapi::written(&routes::<reflexr::Sqlite>());
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        if std::env::var_os("REFLEXR_WRITE_OPENAPI").is_some() {
            std::fs::write(file, &made).unwrap();
        }
        let written = std::fs::read_to_string(file).unwrap_or_default();
        assert!(
            written == made,
            "openapi.json is not the document the routes make: run \
             REFLEXR_WRITE_OPENAPI=1 cargo test -p reflexr-admin --lib openapi_json"
        );
        let doc: Value = serde_json::from_str(&made).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
    }

    /// A path's decoded segments, as [`Request::segments`] has them: split
    /// on `/`, each `%2F` kept inside its segment.
    fn segments(path: &str) -> Vec<String> {
        path.trim_end_matches('/')
            .split('/')
            .map(|s| s.replace("%2F", "/"))
            .collect()
    }

    #[test]
    fn a_path_matches_its_pattern_and_names_its_parameters() {
        let p = matches(
            "/api/v1/runs/{id}/retry",
            &segments("/api/v1/runs/abc/retry"),
        )
        .unwrap();
        assert_eq!(p, [("id", "abc".to_string())]);
        assert!(matches("/api/v1/runs/{id}", &segments("/api/v1/runs/")).is_none());
        assert!(matches("/api/v1/runs", &segments("/api/v1/runs/x")).is_none());
        assert!(matches("/", &segments("/")).is_some());
        // An encoded slash is part of its segment: a parameter may hold it.
        let p = matches(
            "/api/v1/actions/{action}/keys",
            &segments("/api/v1/actions/delivery%2Fpush/keys"),
        )
        .unwrap();
        assert_eq!(p, [("action", "delivery/push".to_string())]);
        assert!(matches("/api/v1/runs/{id}", &segments("/api/v1/runs%2Fabc")).is_none());
    }
}
