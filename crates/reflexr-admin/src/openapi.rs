//! The OpenAPI 3.1 document of the routes, made from what the server is:
//! one entry per route (its summary, parameters, body and success), the
//! error statuses each route's shared checks can answer (from the route's
//! flags: every route checks `Host`, a route that is not public the token,
//! a change the read-only mode, the origin and the media type), the values
//! of every enum taken from its type, and the names and texts the engine
//! accepts from its own limits. `crates/reflexr-admin/openapi.json` is this document,
//! written out (a test keeps the two equal); `GET /api/v1/openapi.json`
//! serves it.

use serde_json::{Map, Value, json};

use super::api::Route;
use reflexr::Backend;
use reflexr::ConsumerKind;
use reflexr::RunState;
use reflexr::inspect::AuditAction;
use reflexr::inspect::RunKind;
use reflexr::inspect::{DeadLetterKind, Resolution};
use reflexr::inspect::{StepKind, StepState};
use reflexr::limits::MAX_PAGE;
use reflexr::limits::{MAX_ID_BYTES, MAX_NAME_BYTES, MAX_SUBJECT_BYTES};
use reflexr::{Guarantee, Missed};

/// The longest reason an operator may give, in bytes.
const MAX_REASON_BYTES: usize = 4096;

/// What a route answers besides the shared errors: its summary, its
/// parameters and body, its success, and the errors of its own.
struct Operation {
    method: &'static str,
    path: &'static str,
    doc: Value,
    /// Errors of the handler's own (a missing resource, a conflict).
    errors: &'static [u16],
}

fn op(method: &'static str, path: &'static str, errors: &'static [u16], doc: Value) -> Operation {
    Operation {
        method,
        path,
        doc,
        errors,
    }
}

/// The values of a text enum, as the server writes and reads them.
fn values<T: Copy>(all: &[T], text: fn(T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(|v| text(*v)).collect()
}

fn one_of(all: Vec<&'static str>) -> Value {
    json!({ "type": "string", "enum": all })
}

/// A name: what `names::check_name` accepts.
fn name(description: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_NAME_BYTES,
        "pattern": "^[A-Za-z0-9._:/@+-]+$",
        "description": description,
    })
}

/// A text that must be present: what `names::check_text` accepts. Its
/// limit is in bytes of UTF-8 (`maxLength` counts characters, so the
/// description says so).
fn text(max_bytes: usize, description: &str) -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": max_bytes,
        "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
        "description": format!("{description} (at most {max_bytes} bytes of UTF-8, no control characters)"),
    })
}

fn nullable(t: &str) -> Value {
    json!({ "type": [t, "null"] })
}

fn reference(schema: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{schema}") })
}

fn array_of(schema: &str) -> Value {
    json!({ "type": "array", "items": reference(schema) })
}

fn json_ok(schema: Value) -> Value {
    json!({ "200": { "description": "OK", "content": { "application/json": { "schema": schema } } } })
}

/// An object whose listed properties are always there.
fn object(properties: Value) -> Value {
    let required: Vec<String> = properties
        .as_object()
        .expect("properties")
        .keys()
        .cloned()
        .collect();
    json!({ "type": "object", "properties": properties, "required": required })
}

/// `schema` (an [`object`]) with one more property that may be absent.
fn with_optional(mut schema: Value, name: &str, property: Value) -> Value {
    schema["properties"][name] = property;
    schema
}

/// A W3C `traceparent` property (an event's, a run's).
fn traceparent(description: &str) -> Value {
    json!({
        "type": "string",
        "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        "description": description,
    })
}

fn path_param(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": schema })
}

fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
}

fn limit() -> Value {
    query(
        "limit",
        "at most this many (default 100)",
        json!({ "type": "integer", "minimum": 1, "maximum": MAX_PAGE }),
    )
}

fn int64(minimum: i64) -> Value {
    json!({ "type": "integer", "minimum": minimum, "maximum": i64::MAX })
}

/// A change's body: who asks and why, plus the change's own fields, each
/// required unless named in `optional`.
fn change_body(description: &str, fields: Value, optional: &[&str]) -> Value {
    let mut properties = Map::new();
    properties.insert(
        "operator".into(),
        text(MAX_ID_BYTES, "who asks (recorded in the audit log)"),
    );
    properties.insert("reason".into(), text(MAX_REASON_BYTES, "why (recorded)"));
    for (k, v) in fields.as_object().expect("fields") {
        properties.insert(k.clone(), v.clone());
    }
    let required: Vec<&String> = properties
        .keys()
        .filter(|k| !optional.contains(&k.as_str()))
        .collect();
    json!({
        "required": true,
        "description": description,
        "content": { "application/json": { "schema": {
            "type": "object",
            "additionalProperties": false,
            "properties": properties,
            "required": required,
        } } },
    })
}

/// A change's body that acts on a filter or on ids, one of the two.
fn bulk_body(filter: &str, id: Value) -> Value {
    let mut body = change_body(
        "a filter or ids, one of the two",
        json!({
            "filter": or_null(reference(filter)),
            "ids": or_null(json!({ "type": "array", "items": id, "maxItems": reflexr::limits::MAX_BULK })),
            "confirm": { "type": "boolean", "description": "act (default: a dry run that says what it would act on)" },
            "max": or_null(json!({ "type": "integer", "minimum": 1, "maximum": reflexr::limits::MAX_BULK, "description": "a dry run's most ids (default 1000)" })),
        }),
        &["filter", "ids", "confirm", "max"],
    );
    body["content"]["application/json"]["schema"]["oneOf"] = json!([
        { "required": ["filter"], "properties": { "filter": { "type": "object" }, "ids": { "type": "null" } } },
        { "required": ["ids"], "properties": { "ids": { "type": "array" }, "filter": { "type": "null" } } },
    ]);
    body
}

fn done() -> Value {
    json_ok(object(json!({
        "ok": { "const": true },
        "action": { "type": "string" },
    })))
}

fn who_body() -> Value {
    change_body("who asks and why", json!({}), &[])
}

fn pausable_body() -> Value {
    change_body(
        "what to pause or resume",
        json!({
            "kind": one_of(vec!["action", "channel", "job", "rule", "reaction"]),
            "name": name("its name"),
        }),
        &[],
    )
}

/// What to prune: events, finished work, or both.
fn prune_body() -> Value {
    let mut body = change_body(
        "what to prune",
        json!({
            "events_older_than_ms": or_null(json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX })),
            "work_older_than_ms": or_null(json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX })),
            "batch": or_null(json!({ "type": "integer", "minimum": 1, "maximum": 100_000 })),
        }),
        &["events_older_than_ms", "work_older_than_ms", "batch"],
    );
    body["content"]["application/json"]["schema"]["anyOf"] = json!([
        { "required": ["events_older_than_ms"], "properties": { "events_older_than_ms": { "type": "integer" } } },
        { "required": ["work_older_than_ms"], "properties": { "work_older_than_ms": { "type": "integer" } } },
    ]);
    body
}

/// A body whose `rate_count` and `rate_period_ms` go together.
fn rates_together(mut body: Value) -> Value {
    body["content"]["application/json"]["schema"]["dependentRequired"] = json!({
        "rate_count": ["rate_period_ms"],
        "rate_period_ms": ["rate_count"],
    });
    body
}

/// A field that may also be `null`, which the server reads as absent.
fn or_null(schema: Value) -> Value {
    json!({ "anyOf": [schema, { "type": "null" }] })
}

fn run_id() -> Value {
    path_param("id", "the run's id", json!({ "type": "string" }))
}

fn dead_letter_id() -> Value {
    path_param("id", "the dead letter's id", int64(i64::MIN))
}

/// Every route's own part of the document.
fn operations() -> Vec<Operation> {
    let workspace = path_param("workspace", "the workspace", name("a workspace"));
    let action = path_param(
        "action",
        "the action (a / in its name written %2F)",
        name("an action"),
    );
    vec![
        op(
            "GET",
            "/healthz",
            &[],
            json!({
                "summary": "Liveness: the file reads. No token needed.",
                "security": [],
                "responses": json_ok(object(json!({ "ok": { "const": true }, "head_seq": { "type": "integer" } }))),
            }),
        ),
        op(
            "GET",
            "/",
            &[],
            json!({
                "summary": "The web console (public: it holds no data; it asks for the token).",
                "security": [],
                "responses": {
                    "200": { "description": "The console's page", "content": { "text/html": {} } },
                    "304": { "description": "Not modified (If-None-Match)" },
                },
            }),
        ),
        op(
            "GET",
            "/console/{file}",
            &[404],
            json!({
                "summary": "The console's scripts (ES modules), style sheet and icon (public: they hold no data).",
                "security": [],
                "parameters": [path_param("file", "the file", one_of(super::console::names()))],
                "responses": {
                    "200": { "description": "The file" },
                    "304": { "description": "Not modified (If-None-Match)" },
                },
            }),
        ),
        op(
            "GET",
            "/metrics",
            &[],
            json!({
                "summary": "Prometheus metrics (text format 0.0.4).",
                "responses": { "200": { "description": "OK", "content": { "text/plain": { "schema": { "type": "string" } } } } },
            }),
        ),
        op(
            "GET",
            "/api/v1/openapi.json",
            &[],
            json!({
                "summary": "This document.",
                "responses": json_ok(json!({ "type": "object" })),
            }),
        ),
        op(
            "GET",
            "/api/v1/stream",
            &[],
            json!({
                "summary": "Live updates over a WebSocket (upgrade required; a GET without one is 400): subscribe to events, runs, dead_letters, stats. The operating guide (docs/guide/operating.md) gives the stream protocol.",
                "responses": { "101": { "description": "Switching Protocols" } },
            }),
        ),
        op(
            "GET",
            "/api/v1/status",
            &[],
            json!({
                "summary": "Workspaces, consumers (cursor, lag, failures), stuck consumers, leases, runs by state, open dead letters by kind, blocked lanes, what is paused, followers.",
                "responses": json_ok(reference("Status")),
            }),
        ),
        op(
            "GET",
            "/api/v1/stats",
            &[],
            json!({
                "summary": "Counters and gauges (Engine::stats).",
                "responses": json_ok(reference("Stats")),
            }),
        ),
        op(
            "GET",
            "/api/v1/workspaces",
            &[],
            json!({
                "summary": "Every workspace and the types it accepts.",
                "responses": json_ok(array_of("Workspace")),
            }),
        ),
        op(
            "GET",
            "/api/v1/workspaces/{workspace}/events",
            &[404],
            json!({
                "summary": "A page of a workspace's events after a seq, by type and subject, looked for among at most 10,000 events; go on from next_after.",
                "parameters": [
                    workspace.clone(),
                    query("after", "only events after this seq (default 0)", int64(0)),
                    query("type", "only events of this type (repeatable)", name("an event type")),
                    query("subject", "only events about this subject", text(MAX_SUBJECT_BYTES, "a subject")),
                    limit(),
                ],
                "responses": json_ok(reference("EventPage")),
            }),
        ),
        op(
            "GET",
            "/api/v1/workspaces/{workspace}/events/{id}",
            &[404],
            json!({
                "summary": "One event by its id.",
                "parameters": [workspace, path_param("id", "the event's id", text(MAX_ID_BYTES, "an event id"))],
                "responses": json_ok(reference("Event")),
            }),
        ),
        op(
            "GET",
            "/api/v1/events/{seq}",
            &[404],
            json!({
                "summary": "One event by its seq.",
                "parameters": [path_param("seq", "the event's seq", int64(i64::MIN))],
                "responses": json_ok(reference("Event")),
            }),
        ),
        op(
            "GET",
            "/api/v1/runs",
            &[],
            json!({
                "summary": "A page of runs, newest first, by state, action, rule, workspace, scope, and one value in the input (a parameter input.<key or $path>=<value>, the value JSON if it parses, e.g. input.session=42), looked for among at most 10,000 runs; go on with before=next.",
                "parameters": [
                    query("state", "the state", one_of(values(RunState::ALL, RunState::as_str))),
                    query("action", "the action", name("an action")),
                    query("rule", "the rule", name("a rule")),
                    query("workspace", "the workspace", name("a workspace")),
                    query("scope", "the scope", json!({ "type": "string" })),
                    query("before", "a page's next", int64(i64::MIN)),
                    limit(),
                ],
                "responses": json_ok(reference("RunPage")),
            }),
        ),
        op(
            "GET",
            "/api/v1/runs/{id}",
            &[404],
            json!({
                "summary": "A run in detail: attempts, last error, checkpoint, claim, the event that fired it, the events it emitted, and a workflow's steps.",
                "parameters": [run_id()],
                "responses": json_ok(reference("RunDetail")),
            }),
        ),
        op(
            "GET",
            "/api/v1/runs/{id}/steps",
            &[404],
            json!({
                "summary": "A workflow run's timeline: the steps it recorded, in the order its handler reached them (where it began, each step's kind, state, attempt, time and output, and what a waiting step waits for and when it wakes). Empty for a run that is not a workflow.",
                "parameters": [run_id()],
                "responses": json_ok(array_of("Step")),
            }),
        ),
        op(
            "GET",
            "/api/v1/runs/{id}/logs",
            &[404],
            json!({
                "summary": "A page of the lines a run's handler logged (RunContext::log), oldest first across its attempts, after a line number, and how far it last said it got (RunContext::progress, null if it never said). Go on from next: the last line's number, or after when there is none. 404 for no such run.",
                "parameters": [
                    run_id(),
                    query("after", "only lines after this line number (default 0: from the first)", int64(0)),
                    limit(),
                ],
                "responses": json_ok(reference("RunLogPage")),
            }),
        ),
        op(
            "POST",
            "/api/v1/runs/{id}/retry",
            &[404, 409],
            json!({
                "summary": "Retries a dead run (409 if it is not dead).",
                "parameters": [run_id()],
                "requestBody": who_body(),
                "responses": done(),
            }),
        ),
        op(
            "POST",
            "/api/v1/runs/{id}/discard",
            &[404, 409],
            json!({
                "summary": "Discards a dead run (409 if it is not dead).",
                "parameters": [run_id()],
                "requestBody": who_body(),
                "responses": done(),
            }),
        ),
        op(
            "POST",
            "/api/v1/runs/{id}/cancel",
            &[404, 409],
            json!({
                "summary": "Cancels a run: a pending one at once; a running one is asked to stop and its completion refused (409 if it has ended).",
                "parameters": [run_id()],
                "requestBody": who_body(),
                "responses": json_ok(object(json!({
                    "ok": { "const": true },
                    "action": { "const": "cancel" },
                    "was": one_of(values(RunState::ALL, RunState::as_str)),
                }))),
            }),
        ),
        op(
            "POST",
            "/api/v1/runs/{id}/reset",
            &[404, 409],
            json!({
                "summary": "Resets a workflow run to one of its steps: that step and every step after it are forgotten, and the run is ready now with fresh attempts, to run them again. What those steps did outside the file (a charge, a mail) may happen again. For a run that ended or is suspended (404 for no such run or step; 409 for a running run, one waiting behind its scope, or a run of an ordered scope).",
                "parameters": [run_id()],
                "requestBody": change_body("the step to reset to", json!({
                    "step": name("the step's name, as the run's timeline lists it (not its begin)"),
                }), &[]),
                "responses": json_ok(object(json!({
                    "ok": { "const": true },
                    "action": { "const": "reset" },
                    "step": { "type": "string" },
                }))),
            }),
        ),
        op(
            "POST",
            "/api/v1/runs/retry",
            &[],
            json!({
                "summary": "Retries dead runs in bulk: without confirm, a dry run that says which (up to max); with confirm: true, acts on the ids given (or on what the filter matches).",
                "requestBody": bulk_body("RunFilter", json!({ "type": "string" })),
                "responses": json_ok(reference("Bulk")),
            }),
        ),
        op(
            "POST",
            "/api/v1/runs/discard",
            &[],
            json!({
                "summary": "Discards dead runs in bulk (as /runs/retry).",
                "requestBody": bulk_body("RunFilter", json!({ "type": "string" })),
                "responses": json_ok(reference("Bulk")),
            }),
        ),
        op(
            "GET",
            "/api/v1/dead-letters",
            &[],
            json!({
                "summary": "A page of dead letters, newest first, by kind, consumer, workspace, reason; all=true for resolved ones too.",
                "parameters": [
                    query("kind", "the kind", one_of(values(DeadLetterKind::ALL, DeadLetterKind::as_str))),
                    query("consumer", "the rule, reaction, follower or action", name("a consumer")),
                    query("workspace", "the workspace", name("a workspace")),
                    query("reason", "e.g. attempts_exhausted", name("a reason")),
                    query("all", "resolved ones too", json!({ "type": "boolean" })),
                    query("before", "a page's next", int64(i64::MIN)),
                    limit(),
                ],
                "responses": json_ok(reference("DeadLetterPage")),
            }),
        ),
        op(
            "POST",
            "/api/v1/dead-letters/{id}/retry",
            &[404, 409],
            json!({
                "summary": "Retries what a dead letter gave up on (409 if it was resolved).",
                "parameters": [dead_letter_id()],
                "requestBody": who_body(),
                "responses": done(),
            }),
        ),
        op(
            "POST",
            "/api/v1/dead-letters/{id}/discard",
            &[404, 409],
            json!({
                "summary": "Marks a dead letter handled without retrying it (409 if it was resolved).",
                "parameters": [dead_letter_id()],
                "requestBody": who_body(),
                "responses": done(),
            }),
        ),
        op(
            "POST",
            "/api/v1/dead-letters/retry",
            &[],
            json!({
                "summary": "Retries dead letters in bulk: a dry run without confirm, then confirm: true with the ids it gave.",
                "requestBody": bulk_body("DeadLetterFilter", json!({ "type": "integer" })),
                "responses": json_ok(reference("Bulk")),
            }),
        ),
        op(
            "POST",
            "/api/v1/dead-letters/discard",
            &[],
            json!({
                "summary": "Discards dead letters in bulk (as /dead-letters/retry).",
                "requestBody": bulk_body("DeadLetterFilter", json!({ "type": "integer" })),
                "responses": json_ok(reference("Bulk")),
            }),
        ),
        op(
            "GET",
            "/api/v1/lanes",
            &[],
            json!({
                "summary": "The blocked lanes (scopes held behind a dead run), most recently blocked first.",
                "parameters": [limit()],
                "responses": json_ok(object(json!({ "blocked": array_of("BlockedLane") }))),
            }),
        ),
        op(
            "POST",
            "/api/v1/lanes/unblock",
            &[404, 409],
            json!({
                "summary": "Lets a scope blocked behind a dead run go on.",
                "requestBody": change_body("the lane", json!({
                    "rule": { "type": "string", "description": "the rule (or task:<action> for enqueued runs)" },
                    "scope": { "type": "string" },
                }), &[]),
                "responses": done(),
            }),
        ),
        op(
            "GET",
            "/api/v1/actions",
            &[],
            json!({
                "summary": "Every action's priority, limits and fairness, and what is paused.",
                "responses": json_ok(object(json!({
                    "actions": array_of("ActionConfig"),
                    "paused": array_of("Paused"),
                }))),
            }),
        ),
        op(
            "POST",
            "/api/v1/actions/configure",
            &[],
            json!({
                "summary": "Sets an action's default priority, limits and fairness (replacing what was set).",
                "requestBody": rates_together(change_body("the action's settings", json!({
                    "action": name("the action"),
                    "priority": { "type": "integer", "minimum": i64::MIN, "maximum": i64::MAX, "description": "default 0" },
                    "max_running": or_null(json!({ "type": "integer", "minimum": 1, "maximum": u32::MAX })),
                    "rate_count": or_null(json!({ "type": "integer", "minimum": 1, "maximum": u32::MAX, "description": "with rate_period_ms" })),
                    "rate_period_ms": or_null(json!({ "type": "integer", "minimum": 1, "maximum": u64::MAX, "description": "with rate_count" })),
                    "partition_by": or_null(json!({ "type": "string", "description": "a key or a $ path of the input" })),
                    "fair": { "type": "boolean", "description": "claims serve the action's keys in turn, by weight (default false)" },
                }), &["priority", "max_running", "rate_count", "rate_period_ms", "partition_by", "fair"])),
                "responses": done(),
            }),
        ),
        op(
            "GET",
            "/api/v1/actions/{action}/keys",
            &[],
            json!({
                "summary": "A keyed action's keys (fair, or partitioned): each key with unfinished runs or overrides, its runs waiting, ready and running, and the limits that hold for it (its overrides, else the action's); and the keys' own overrides. Both empty for an action without keys.",
                "parameters": [action.clone()],
                "responses": json_ok(object(json!({
                    "keys": array_of("KeyInfo"),
                    "limits": array_of("KeyLimits"),
                }))),
            }),
        ),
        op(
            "POST",
            "/api/v1/actions/{action}/keys",
            &[],
            json!({
                "summary": "Sets one key's limits and weight, replacing what the key had (a limit left out is the action's; a weight left out is 1); every process obeys them from its next claim. 400 for an action without keys (configure it fair or with partition_by first). Audited as set_key_limits.",
                "parameters": [action.clone()],
                "requestBody": rates_together(change_body("the key's limits and weight", json!({
                    "key": text(MAX_SUBJECT_BYTES, "the key"),
                    "max_running": or_null(json!({ "type": "integer", "minimum": 1, "maximum": u32::MAX })),
                    "rate_count": or_null(json!({ "type": "integer", "minimum": 1, "maximum": u32::MAX, "description": "with rate_period_ms" })),
                    "rate_period_ms": or_null(json!({ "type": "integer", "minimum": 1, "maximum": u64::MAX, "description": "with rate_count" })),
                    "weight": or_null(json!({ "type": "integer", "minimum": 1, "maximum": u32::MAX, "description": "its share in a fair claim against the other keys' (default 1)" })),
                }), &["max_running", "rate_count", "rate_period_ms", "weight"])),
                "responses": done(),
            }),
        ),
        op(
            "POST",
            "/api/v1/actions/{action}/keys/clear",
            &[404],
            json!({
                "summary": "Clears one key's limits and weight: it has the action's again (404 when the key has none). Audited as clear_key_limits.",
                "parameters": [action],
                "requestBody": change_body("the key", json!({
                    "key": text(MAX_SUBJECT_BYTES, "the key"),
                }), &[]),
                "responses": done(),
            }),
        ),
        op(
            "POST",
            "/api/v1/pause",
            &[],
            json!({
                "summary": "Pauses an action, a channel, a scheduled job, a rule or a reaction, in every process on the file.",
                "requestBody": pausable_body(),
                "responses": json_ok(object(json!({
                    "ok": { "const": true },
                    "action": { "const": "pause" },
                    "paused_now": { "type": "boolean", "description": "false if it was paused already" },
                }))),
            }),
        ),
        op(
            "POST",
            "/api/v1/resume",
            &[404],
            json!({
                "summary": "Resumes what was paused (404 if it is not paused).",
                "requestBody": pausable_body(),
                "responses": done(),
            }),
        ),
        op(
            "POST",
            "/api/v1/cursors/reset",
            &[404, 409],
            json!({
                "summary": "Moves a consumer's cursor, backwards too.",
                "requestBody": change_body("the cursor and where to", json!({
                    "workspace": name("the workspace"),
                    "kind": one_of(values(ConsumerKind::ALL, ConsumerKind::as_str)),
                    "name": name("the consumer"),
                    "to": int64(0),
                }), &[]),
                "responses": json_ok(reference("Reset")),
            }),
        ),
        op(
            "POST",
            "/api/v1/prune",
            &[],
            json!({
                "summary": "Deletes events every cursor passed and finished work, older than given (one of the two at least).",
                "requestBody": prune_body(),
                "responses": json_ok(reference("Pruned")),
            }),
        ),
        op(
            "GET",
            "/api/v1/leases",
            &[],
            json!({
                "summary": "Every lease, its holder, generation and state.",
                "responses": json_ok(array_of("Lease")),
            }),
        ),
        op(
            "GET",
            "/api/v1/rules",
            &[],
            json!({
                "summary": "Every rule the file knows, with its cursor and lag.",
                "responses": json_ok(array_of("Rule")),
            }),
        ),
        op(
            "GET",
            "/api/v1/rules/{name}",
            &[404],
            json!({
                "summary": "One rule.",
                "parameters": [path_param("name", "the rule", json!({ "type": "string" }))],
                "responses": json_ok(reference("Rule")),
            }),
        ),
        op(
            "POST",
            "/api/v1/rules/{name}/promote",
            &[404, 409],
            json!({
                "summary": "Promotes a rule's version in shadow (Rule::shadow): sets the handover position, the further of the two versions' cursors, and answers it. The live version decides and fires up to it, the shadow after it; the process evaluating the workspace hands over once both reached it (audited as rule_promoted). 404 for no such rule; 409 when it has no version in shadow, or one being promoted already; 400 for the name of the shadow itself.",
                "parameters": [path_param("name", "the live rule (not its shadow's <rule>@v<version>)", name("a rule"))],
                "requestBody": who_body(),
                "responses": json_ok(object(json!({
                    "ok": { "const": true },
                    "action": { "const": "promoted" },
                    "at": { "type": "integer", "description": "the handover position: the live version decides up to this seq, the shadow after it" },
                }))),
            }),
        ),
        op(
            "GET",
            "/api/v1/rules/{name}/state/{scope}",
            &[404],
            json!({
                "summary": "A rule's state for one scope.",
                "parameters": [
                    path_param("name", "the rule", name("a rule")),
                    path_param("scope", "the scope", json!({ "type": "string" })),
                ],
                "responses": json_ok(object(json!({
                    "rule": { "type": "string" },
                    "scope": { "type": "string" },
                    "state": {},
                }))),
            }),
        ),
        op(
            "GET",
            "/api/v1/reactions",
            &[],
            json!({
                "summary": "Every reaction's cursor.",
                "responses": json_ok(array_of("Cursor")),
            }),
        ),
        op(
            "GET",
            "/api/v1/followers",
            &[],
            json!({
                "summary": "Every follower: cursor, lag, published, dead letters, stops.",
                "responses": json_ok(array_of("Follower")),
            }),
        ),
        op(
            "POST",
            "/api/v1/followers/{name}/restart",
            &[404, 409],
            json!({
                "summary": "Asks a stopped follower to go on, whichever process runs it.",
                "parameters": [path_param("name", "the follower", json!({ "type": "string" }))],
                "requestBody": who_body(),
                "responses": done(),
            }),
        ),
        op(
            "GET",
            "/api/v1/schedules",
            &[],
            json!({
                "summary": "Every scheduled job and when it is next due.",
                "responses": json_ok(array_of("Schedule")),
            }),
        ),
        op(
            "GET",
            "/api/v1/audit",
            &[],
            json!({
                "summary": "What operators did, newest first.",
                "parameters": [limit()],
                "responses": json_ok(array_of("AuditEntry")),
            }),
        ),
        op(
            "POST",
            "/api/v1/mcp",
            &[403, 404, 406, 415],
            json!({
                "summary": "MCP (Streamable HTTP, JSON responses): one JSON-RPC message; revisions 2025-11-25 (and older, by initialize) and 2026-07-28 (stateless, _meta per request). A notification gets 202. Read-only mode hides the tools that change things. The operating guide (docs/guide/operating.md) gives its tools.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": {
                "type": "object",
                "description": "a JSON-RPC 2.0 request, notification or response",
                "properties": {
                    "jsonrpc": { "const": "2.0" },
                    "method": { "type": "string" },
                    "id": { "description": "a request's id, or a response's" },
                    "params": { "description": "a request's parameters" },
                },
                "required": ["jsonrpc"],
            } } } },
                "responses": {
                    "200": { "description": "The JSON-RPC answer (a result, or an error object)", "content": { "application/json": { "schema": { "type": "object" } } } },
                    "202": { "description": "A notification or response: accepted, no body" },
                    "400": { "description": "Not JSON, not a JSON-RPC request, a header that disagrees with the body, an unsupported version (a JSON-RPC error object, or the error shape)", "content": { "application/json": { "schema": { "type": "object" } } } },
                    "404": { "description": "An unknown method (2026-07-28; a JSON-RPC error object)", "content": { "application/json": { "schema": { "type": "object" } } } },
                },
            }),
        ),
    ]
}

/// The schemas the answers share.
fn schemas() -> Value {
    let ts = || json!({ "type": "integer", "description": "ms since the epoch" });
    let ts_or_null = || json!({ "type": ["integer", "null"], "description": "ms since the epoch" });
    let mut all = json!({
        "Error": object(json!({
            "error": object(json!({
                "code": { "type": "string", "description": "bad_request, not_found, conflict, unauthorized, unknown_host, read_only, cross_site, too_large, head_too_large, length_required, unsupported_media_type, not_acceptable, method_not_allowed, timeout, unavailable, busy, internal" },
                "message": { "type": "string" },
            })),
        })),
        "Event": with_optional(object(json!({
            "seq": { "type": "integer" },
            "id": { "type": "string" },
            "workspace": { "type": "string" },
            "type": { "type": "string" },
            "subject": { "type": "string" },
            "version": { "type": "integer", "minimum": 0, "description": "The subject version: the event's 1-based place among its subject's events in its workspace" },
            "actor": { "type": "string" },
            "occurred_at": ts(),
            "recorded_at": ts(),
            "causation_id": nullable("string"),
            "correlation_id": nullable("string"),
            "depth": { "type": "integer" },
            "payload": {},
        })), "traceparent", traceparent("The W3C trace context of the work that appended it; absent when it had none")),
        "EventPage": object(json!({
            "events": array_of("Event"),
            "next_after": nullable("integer"),
        })),
        "Run": with_optional(object(json!({
            "id": { "type": "string" },
            "position": { "type": "integer" },
            "kind": one_of(values(RunKind::ALL, RunKind::as_str)),
            "action": { "type": "string" },
            "rule": nullable("string"),
            "workspace": nullable("string"),
            "scope": nullable("string"),
            "state": one_of(values(RunState::ALL, RunState::as_str)),
            "attempt": { "type": "integer" },
            "max_attempts": { "type": "integer" },
            "due_at": ts(),
            "claimed_by": nullable("string"),
            "claim_expires_at": ts_or_null(),
            "last_error": nullable("string"),
            "event_seq": nullable("integer"),
            "input": {},
            "checkpoint": {},
            "priority": { "type": "integer" },
            "unique_key": nullable("string"),
            "unique_mode": nullable("string"),
            "started_at": ts_or_null(),
            "cancel_requested_at": ts_or_null(),
            "cancelled_by": nullable("string"),
            "cancel_reason": nullable("string"),
            "created_at": ts(),
            "updated_at": ts(),
            "finished_at": ts_or_null(),
            "output": {},
            "parent": nullable("string"),
            "key": { "type": ["string", "null"], "description": "its key, for its action's per-key limits and fair claims; null for an action without keys" },
        })), "traceparent", traceparent("The W3C trace context the run carries (its event's, its enqueue's, or with the feature otel its decision's or enqueue's span); absent when it has none")),
        "Step": object(json!({
            "run": { "type": "string" },
            "name": { "type": "string" },
            "position": { "type": "integer" },
            "kind": one_of(values(StepKind::ALL, StepKind::as_str)),
            "state": one_of(values(StepState::ALL, StepState::as_str)),
            "attempt": { "type": "integer" },
            "recorded_at": ts(),
            "output_bytes": { "type": "integer" },
            "output": {},
            "detail": { "type": "object" },
            "wake_at": ts_or_null(),
        })),
        "RunPage": object(json!({
            "runs": array_of("Run"),
            "next": nullable("integer"),
        })),
        "RunDetail": object(json!({
            "run": reference("Run"),
            "event": { "oneOf": [reference("Event"), { "type": "null" }] },
            "emitted": array_of("Event"),
            "steps": array_of("Step"),
        })),
        "RunFilter": {
            "type": "object",
            "additionalProperties": false,
            "description": "Each field may be null, as if absent.",
            "properties": {
                "state": or_null(one_of(values(RunState::ALL, RunState::as_str))),
                "action": or_null(name("the action")),
                "rule": or_null(name("the rule")),
                "workspace": or_null(name("the workspace")),
                "scope": or_null(json!({ "type": "string" })),
                "input": or_null(json!({ "type": "object", "minProperties": 1, "maxProperties": 1, "description": "one {\"<key or $path>\": <value>} entry" })),
            },
        },
        "DeadLetter": object(json!({
            "id": { "type": "integer" },
            "kind": one_of(values(DeadLetterKind::ALL, DeadLetterKind::as_str)),
            "consumer": { "type": "string" },
            "workspace": nullable("string"),
            "event_seq": nullable("integer"),
            "event_id": nullable("string"),
            "run_id": nullable("string"),
            "reason": { "type": "string" },
            "error": { "type": "string" },
            "attempts": { "type": "integer" },
            "created_at": ts(),
            "resolved_at": ts_or_null(),
            "resolution": { "enum": values(Resolution::ALL, Resolution::as_str).into_iter().map(Value::from).chain([Value::Null]).collect::<Vec<_>>() },
        })),
        "DeadLetterPage": object(json!({
            "dead_letters": array_of("DeadLetter"),
            "next": nullable("integer"),
        })),
        "DeadLetterFilter": {
            "type": "object",
            "additionalProperties": false,
            "description": "Each field may be null, as if absent.",
            "properties": {
                "kind": or_null(one_of(values(DeadLetterKind::ALL, DeadLetterKind::as_str))),
                "consumer": or_null(name("the consumer")),
                "workspace": or_null(name("the workspace")),
                "reason": or_null(name("the reason")),
            },
        },
        "Bulk": {
            "oneOf": [
                object(json!({
                    "dry_run": { "const": true },
                    "matched": { "type": "integer" },
                    "ids": { "type": "array", "items": { "type": ["string", "integer"] } },
                    "more": { "type": "boolean", "description": "the filter matched more than max" },
                })),
                object(json!({
                    "dry_run": { "const": false },
                    "done": { "type": "array", "items": { "type": ["string", "integer"] } },
                    "skipped": { "type": "array", "items": { "type": "array", "items": { "type": ["string", "integer"] }, "minItems": 2, "maxItems": 2 }, "description": "[id, why] of each not acted on" },
                    "more": { "type": "boolean" },
                })),
            ],
        },
        "Cursor": object(json!({
            "workspace": { "type": "string" },
            "kind": one_of(values(ConsumerKind::ALL, ConsumerKind::as_str)),
            "name": { "type": "string" },
            "position": { "type": "integer" },
            "lag": { "type": "integer" },
            "updated_at": ts(),
            "failures": { "type": "integer" },
            "last_error": nullable("string"),
        })),
        "Follower": object(json!({
            "name": { "type": "string" },
            "source": { "type": "string" },
            "target": { "type": "string" },
            "target_file": nullable("string"),
            "target_postgres": nullable("string"),
            "projection": { "type": "string" },
            "cursor": { "type": "integer" },
            "lag": { "type": "integer" },
            "published": { "type": "integer" },
            "dead_letters": { "type": "integer" },
            "stops": { "type": "integer" },
            "last_error": nullable("string"),
            "stopped_here": { "type": "boolean" },
        })),
        "Stats": object(json!({
            "events_appended": { "type": "integer" },
            "counters": { "type": "object", "additionalProperties": { "type": "integer" } },
            "runs": { "type": "object", "additionalProperties": { "type": "integer" }, "propertyNames": one_of(values(RunState::ALL, RunState::as_str)) },
            "oldest_ready_due_at": ts_or_null(),
            "dead_letters": { "type": "object", "additionalProperties": { "type": "integer" }, "propertyNames": one_of(values(DeadLetterKind::ALL, DeadLetterKind::as_str)) },
            "blocked_lanes": { "type": "integer" },
            "cursors": array_of("Cursor"),
            "followers": array_of("Follower"),
            "writer": object(json!({
                "commits": { "type": "integer" },
                "writes": { "type": "integer" },
                "aborts": { "type": "integer" },
            })),
        })),
        "Workspace": object(json!({
            "name": { "type": "string" },
            "created_at": ts(),
            "event_types": { "type": "array", "items": { "type": "string" } },
        })),
        "Lease": object(json!({
            "name": { "type": "string" },
            "holder": { "type": "string" },
            "generation": { "type": "integer" },
            "acquired_at": ts(),
            "renewed_at": ts(),
            "expires_at": ts(),
            "state": one_of(vec!["held", "lapsed", "released"]),
        })),
        "Rule": object(json!({
            "name": { "type": "string" },
            "workspace": { "type": "string" },
            "version": { "type": "integer" },
            "definition": {},
            "cursor": { "type": "integer" },
            "lag": { "type": "integer" },
            "registered_here": { "type": "boolean" },
            "registered_at": ts(),
            "updated_at": ts(),
            "shadow_of": { "type": ["string", "null"], "description": "for a version in shadow (named <rule>@v<version>): the live rule it is to take over from; null for a live rule" },
            "promote_at": { "type": ["integer", "null"], "description": "a shadow's handover position once promoted: the live version decides up to this seq, the shadow after it" },
            "shadow_fired": { "type": "integer", "description": "what a shadow would have fired so far (it fires nothing); 0 for a live rule" },
            "shadow_errored": { "type": "integer", "description": "the decisions a shadow failed so far; 0 for a live rule" },
        })),
        "Schedule": object(json!({
            "name": { "type": "string" },
            "spec": { "type": "string" },
            "guarantee": one_of(values(Guarantee::ALL, Guarantee::as_str)),
            "missed": one_of(values(Missed::ALL, Missed::as_str)),
            "next_due_at": ts_or_null(),
            "last_due_at": ts_or_null(),
        })),
        "AuditEntry": object(json!({
            "at": ts(),
            "operator": { "type": "string" },
            "action": { "type": "string", "examples": AuditAction::KNOWN, "description": "what was done: one of the examples, or a value another version of reflexr wrote" },
            "target": { "type": "string" },
            "reason": { "type": "string" },
            "detail": {},
        })),
        "Reset": object(json!({
            "from": nullable("integer"),
            "to": { "type": "integer" },
        })),
        "Pruned": object(json!({
            "events": { "type": "integer" },
            "runs": { "type": "integer" },
            "dead_letters": { "type": "integer" },
        })),
        "Paused": object(json!({
            "kind": one_of(vec!["action", "rule", "reaction"]),
            "name": { "type": "string" },
            "since": ts(),
            "operator": { "type": "string" },
            "reason": { "type": "string" },
        })),
        "ActionConfig": object(json!({
            "action": { "type": "string" },
            "priority": { "type": "integer" },
            "max_running": nullable("integer"),
            "rate": { "type": ["array", "null"], "items": { "type": "integer" }, "minItems": 2, "maxItems": 2, "description": "[count, period in ms]" },
            "partition_by": nullable("string"),
            "fair": { "type": "boolean", "description": "claims serve its keys in turn, by weight" },
        })),
        "KeyInfo": object(json!({
            "key": { "type": "string" },
            "waiting": { "type": "integer", "description": "its runs waiting behind their scope or for a workflow's step" },
            "ready": { "type": "integer", "description": "its runs ready (due now or later)" },
            "running": { "type": "integer" },
            "max_running": { "type": ["integer", "null"], "description": "its override, else the action's" },
            "rate": { "type": ["array", "null"], "items": { "type": "integer" }, "minItems": 2, "maxItems": 2, "description": "[count, period in ms]: its override, else the action's" },
            "weight": { "type": "integer", "minimum": 1, "description": "its share in a fair claim" },
            "overridden": { "type": "boolean", "description": "whether it has overrides of its own" },
        })),
        "KeyLimits": object(json!({
            "key": { "type": "string" },
            "max_running": { "type": ["integer", "null"], "description": "null: the action's" },
            "rate": { "type": ["array", "null"], "items": { "type": "integer" }, "minItems": 2, "maxItems": 2, "description": "[count, period in ms]; null: the action's" },
            "weight": { "type": ["integer", "null"], "description": "null: 1" },
        })),
        "Status": object(json!({
            "now": ts(),
            "read_only": { "type": "boolean" },
            "head_seq": { "type": "integer" },
            "workspaces": array_of("Workspace"),
            "consumers": array_of("Cursor"),
            "stuck": array_of("Cursor"),
            "leases": array_of("Lease"),
            "runs": { "type": "object", "additionalProperties": { "type": "integer" }, "propertyNames": one_of(values(RunState::ALL, RunState::as_str)) },
            "oldest_ready_due_at": ts_or_null(),
            "dead_letters": { "type": "object", "additionalProperties": { "type": "integer" }, "propertyNames": one_of(values(DeadLetterKind::ALL, DeadLetterKind::as_str)) },
            "blocked_lanes": { "type": "integer" },
            "paused": array_of("Paused"),
            "followers": array_of("Follower"),
        })),
        "BlockedLane": object(json!({
            "rule": { "type": "string" },
            "scope": { "type": "string" },
            "run_id": { "type": "string" },
            "last_error": nullable("string"),
            "since": ts(),
        })),
    });
    let schemas = all.as_object_mut().expect("schemas");
    schemas.extend(run_log_schemas().as_object().expect("schemas").clone());
    all
}

/// The schemas of a run's log and progress (apart: `json!` has a
/// recursion limit).
fn run_log_schemas() -> Value {
    let ts = || json!({ "type": "integer", "description": "ms since the epoch" });
    json!({
        "RunLog": object(json!({
            "n": { "type": "integer", "minimum": 1, "description": "its place in the run's log, from 1, across attempts" },
            "attempt": { "type": "integer", "minimum": 0, "description": "the attempt that logged it" },
            "at": ts(),
            "level": one_of(vec!["error", "warn", "info", "debug", "trace"]),
            "message": { "type": "string" },
            "fields": { "description": "the JSON the handler gave with the line; null for none" },
        })),
        "RunProgress": object(json!({
            "attempt": { "type": "integer", "minimum": 0, "description": "the attempt that said it" },
            "done": { "type": "integer", "minimum": 0 },
            "total": { "type": "integer", "minimum": 0 },
            "at": ts(),
        })),
        "RunLogPage": object(json!({
            "logs": array_of("RunLog"),
            "progress": { "oneOf": [reference("RunProgress"), { "type": "null" }] },
            "next": { "type": "integer", "minimum": 0, "description": "the last line's number, or after when there is none: the after of the next page" },
        })),
    })
}

/// Why a shared check answers `status`, as the document says it.
fn shared(status: u16) -> &'static str {
    match status {
        400 => "A request the server cannot read, or a parameter or body it refuses",
        401 => "The server has a token, and the request does not carry it (Authorization: Bearer)",
        403 => {
            "Read-only mode, or a cross-site request (Sec-Fetch-Site, an Origin that is no page of this server)"
        }
        404 => "What the request names does not exist",
        409 => "The change conflicts with the state of what it changes",
        413 => "A body over 1 MiB",
        415 => "A change without a JSON body (Content-Type: application/json)",
        421 => {
            "A Host that does not name this server (its loopback names and addresses, and the names allowed)"
        }
        503 => {
            "The database is busy, full or read-only, or the server is at its connection limit; try again"
        }
        _ => "An error",
    }
}

/// The document for these routes.
///
/// # Panics
/// When a route has no entry here, or an entry no route: a programmer's
/// error, which the test of this module finds.
pub(crate) fn document<B: Backend>(routes: &[Route<B>]) -> Value {
    let mut operations = operations();
    let mut paths = Map::new();
    for r in routes {
        let at = operations
            .iter()
            .position(|o| o.method == r.method && o.path == r.path)
            .unwrap_or_else(|| panic!("the document has no entry for {} {}", r.method, r.path));
        let o = operations.swap_remove(at);
        let mut doc = o.doc;
        // Every route answers these; a route of its own kind, these too.
        let mut errors = vec![400, 413, 421, 503];
        if !r.public {
            errors.push(401);
        }
        if r.mutating {
            errors.extend([403, 415]);
        }
        errors.extend(o.errors);
        let responses = doc["responses"].as_object_mut().expect("responses");
        for status in errors {
            responses
                .entry(status.to_string())
                .or_insert_with(|| json!({ "description": shared(status), "content": { "application/json": { "schema": reference("Error") } } }));
        }
        let mut sorted: Vec<(String, Value)> = std::mem::take(responses).into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        *responses = sorted.into_iter().collect();
        let item = paths
            .entry(o.path.to_string())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("a path item");
        item.insert(o.method.to_ascii_lowercase(), doc);
    }
    assert!(
        operations.is_empty(),
        "the document has entries for no route: {:?}",
        operations
            .iter()
            .map(|o| (o.method, o.path))
            .collect::<Vec<_>>()
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "reflexr administration API",
            "version": "1",
            "description": "The operations of the reflexr CLI over HTTP: reads, checked and audited changes, live streams and metrics. Errors are {\"error\": {\"code\", \"message\"}}. The server answers only requests whose Host names it (421 otherwise).",
        },
        "servers": [{ "url": "http://127.0.0.1:7878" }],
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer", "description": "Required when the server has a token (always off loopback)." },
            },
            "schemas": schemas(),
        },
    })
}

/// The document as `crates/reflexr-admin/openapi.json` holds it: indented, a newline at
/// the end.
pub(crate) fn written<B: Backend>(routes: &[Route<B>]) -> String {
    let mut t = serde_json::to_string_pretty(&document(routes)).expect("JSON");
    t.push('\n');
    t
}
