//! The tools and resources: each a name, a JSON Schema for its input and
//! its output, hints for the client, and a call on the engine's public
//! operations.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::{Era, Mcp, RpcError, code};
use reflexr::Backend;
use reflexr::ConsumerKind;
use reflexr::Query;
use reflexr::RunState;
use reflexr::inspect::DeadLetterKind;
use reflexr::inspect::StepKind;
use reflexr::inspect::{DeadLetterFilter, RunFilterSpec};
use reflexr::limits::MAX_BULK;
use reflexr::limits::MAX_PAGE;

/// What a tool call gives back: its structured result, or why it failed.
type Answer = Result<Value, String>;

struct Tool<B: Backend> {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    input: fn() -> Value,
    output: fn() -> Value,
    /// Changes the file (left out in read-only mode).
    mutating: bool,
    destructive: bool,
    idempotent: bool,
    call: fn(&Mcp<B>, Value) -> Answer,
}

/// Every tool, made for the engine's backend.
fn tools<B: Backend>() -> Vec<Tool<B>> {
    vec![
        Tool {
            name: "status",
            title: "Status",
            description: "The file at a glance: the log's head, workspaces, every consumer's cursor and lag, stuck consumers, leases, runs by state, open dead letters by kind, blocked lanes, followers.",
            input: no_input,
            output: status_schema,
            mutating: false,
            destructive: false,
            idempotent: true,
            call: status,
        },
        Tool {
            name: "stats",
            title: "Counters and gauges",
            description: "The engine's totals (events appended, decisions, firings, runs succeeded/retried/dead, …) and gauges, as Engine::stats gives them.",
            input: no_input,
            output: any_object,
            mutating: false,
            destructive: false,
            idempotent: true,
            call: stats,
        },
        Tool {
            name: "list_events",
            title: "List events",
            description: "A workspace's events after a seq, in order, optionally of some types or about one subject. Go on with next_after (null: the end of the log was reached).",
            input: list_events_input,
            output: || page_schema("events", "next_after"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_events,
        },
        Tool {
            name: "get_event",
            title: "Get an event",
            description: "One event: by workspace and id, or by seq.",
            input: get_event_input,
            output: || wrapped("event"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: get_event,
        },
        Tool {
            name: "list_runs",
            title: "List runs",
            description: "Runs of the work queue, newest first, by state, action, rule, workspace, scope, or a value in their input. Go on with next (as before).",
            input: list_runs_input,
            output: || page_schema("runs", "next"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_runs,
        },
        Tool {
            name: "get_run",
            title: "Get a run",
            description: "One run with its attempts, last error, input, checkpoint and output, the event that fired it, the events it emitted, a workflow's steps (each step's name, kind, state, attempt, time and output, and what a waiting one waits for (detail) and when it wakes (wake_at)), how far its handler said it got (progress: done of total), and the last 100 lines its handler logged (logs; logs_note says how many there are when there are more).",
            input: get_run_input,
            output: run_detail_schema,
            mutating: false,
            destructive: false,
            idempotent: true,
            call: get_run,
        },
        Tool {
            name: "list_dead_letters",
            title: "List dead letters",
            description: "What a consumer or an executor gave up on, and why, newest first: open ones (resolved ones too with include_resolved). Go on with next.",
            input: list_dead_letters_input,
            output: || page_schema("dead_letters", "next"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_dead_letters,
        },
        Tool {
            name: "retry",
            title: "Retry dead runs or dead letters",
            description: "Gives dead runs (or what dead letters gave up on) a fresh set of attempts: by ids, or all that a filter matches (at most max). A dry run unless dry_run is false: it reports what would be retried. Audited with the reason.",
            input: || bulk_input(false),
            output: bulk_output,
            mutating: true,
            destructive: false,
            idempotent: false,
            call: retry,
        },
        Tool {
            name: "discard",
            title: "Discard dead runs or dead letters",
            description: "Discards dead runs (or dead letters): they will not run again. Needs confirm: true; without it, it says what it would discard. Audited with the reason.",
            input: || bulk_input(true),
            output: bulk_output,
            mutating: true,
            destructive: true,
            idempotent: false,
            call: discard,
        },
        Tool {
            name: "unblock",
            title: "Unblock a lane",
            description: "Lets a rule's scope held behind a dead run go on (the dead run stays dead). Audited with the reason.",
            input: unblock_input,
            output: any_object,
            mutating: true,
            destructive: false,
            idempotent: false,
            call: unblock,
        },
        Tool {
            name: "list_consumers",
            title: "List consumers",
            description: "Every consumer (rule, reaction, follower, application cursor): its cursor, lag, and failures at its position.",
            input: no_input,
            output: || list_schema("consumers"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_consumers,
        },
        Tool {
            name: "reset_cursor",
            title: "Reset a cursor",
            description: "Moves a consumer's cursor to a seq, backwards (it sees those events again) or forwards (it skips them). Needs confirm: true. Audited with the reason.",
            input: reset_cursor_input,
            output: any_object,
            mutating: true,
            destructive: true,
            idempotent: true,
            call: reset_cursor,
        },
        Tool {
            name: "list_rules",
            title: "List rules",
            description: "Every rule the file knows, each version live or in shadow (shadow_of names the live rule; promote_at is a pending handover's position): version, cursor, lag, and what a shadow would have fired.",
            input: no_input,
            output: || list_schema("rules"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_rules,
        },
        Tool {
            name: "list_followers",
            title: "List followers",
            description: "Every follower bridging one workspace into another: cursor, lag, published, dead letters, stops, last error.",
            input: no_input,
            output: || list_schema("followers"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_followers,
        },
        Tool {
            name: "restart_follower",
            title: "Restart a follower",
            description: "Asks whichever process runs a stopped follower to go on from its cursor. Audited with the reason.",
            input: restart_follower_input,
            output: any_object,
            mutating: true,
            destructive: false,
            idempotent: true,
            call: restart_follower,
        },
        Tool {
            name: "list_schedules",
            title: "List schedules",
            description: "Scheduled jobs: their spec, guarantee, next and last due times.",
            input: no_input,
            output: || list_schema("schedules"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_schedules,
        },
        Tool {
            name: "list_actions",
            title: "Actions: priorities, limits, pauses",
            description: "Every action's default priority, concurrency and rate limits (and what they are partitioned by), and what is paused (actions, channels, jobs, rules, reactions), by whom and why.",
            input: no_input,
            output: actions_schema,
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_actions,
        },
        Tool {
            name: "list_action_keys",
            title: "An action's keys: backlog, running, limits",
            description: "The keys of a fair or partitioned action (a run's key is the one its enqueue named, else its input's partition field): for each key with unfinished runs or limits of its own, its runs waiting, ready and running, the limits that hold for it (its own, else the action's), its weight in a fair claim, and whether it has overrides; and the overrides themselves. Both lists are empty for an action without keys.",
            input: list_action_keys_input,
            output: action_keys_schema,
            mutating: false,
            destructive: false,
            idempotent: true,
            call: list_action_keys,
        },
        Tool {
            name: "set_key_limits",
            title: "Set one key's limits and weight",
            description: "Sets one key's own limits and weight for a fair or partitioned action, replacing what the key had: a limit left out is the action's, a weight left out is 1. At most max_running of the key's runs at once, at most rate_count starts per rate_period_ms (the two together), and weight: served weight runs to a weight-1 key's one in a fair claim. Every process obeys them from its next claim. Refused for an action without keys. Audited with the reason.",
            input: set_key_limits_input,
            output: set_key_limits_output,
            mutating: true,
            destructive: false,
            idempotent: true,
            call: set_key_limits,
        },
        Tool {
            name: "cancel_run",
            title: "Cancel a run",
            description: "Cancels a run: a pending one ends cancelled at once; a running one is asked to stop (its handler sees it) and its completion is refused. Needs confirm: true. Audited with the reason.",
            input: cancel_input,
            output: any_object,
            mutating: true,
            destructive: true,
            idempotent: false,
            call: cancel_run,
        },
        Tool {
            name: "reset_run_to_step",
            title: "Reset a workflow run to a step",
            description: "Forgets a workflow run's step and every step after it (get_run lists them) and makes the run ready now with fresh attempts, to run them again; the steps before it keep what they recorded. What the forgotten steps did outside the file (a charge, a mail) may happen again. For a run that ended or is suspended; refused for a running run, one waiting behind its scope, or one of an ordered scope. Needs confirm: true; without it, it says what it would forget. Audited with the reason.",
            input: reset_run_input,
            output: any_object,
            mutating: true,
            destructive: true,
            idempotent: false,
            call: reset_run_to_step,
        },
        Tool {
            name: "pause",
            title: "Pause",
            description: "Pauses an action (none of its runs is claimed), a channel or a scheduled job (their actions), a rule or a reaction (its cursor stays), in every process on the file. Audited with the reason.",
            input: pause_input,
            output: any_object,
            mutating: true,
            destructive: false,
            idempotent: true,
            call: pause,
        },
        Tool {
            name: "resume",
            title: "Resume",
            description: "Resumes what was paused: it goes on from where it stood. Audited with the reason.",
            input: pause_input,
            output: any_object,
            mutating: true,
            destructive: false,
            idempotent: false,
            call: resume,
        },
        Tool {
            name: "promote_rule",
            title: "Promote a rule's version in shadow",
            description: "Hands a rule over to its version in shadow (registered with Rule::shadow, listed by list_consumers as <rule>@v<version>): sets the handover position, the further of the two versions' cursors, and returns it. The live version decides and fires up to it, the shadow after it; no event is decided by both or by neither. Once both reached it, the old version retires and its state is replaced by the shadow's. Give the live rule's name. Audited with the reason.",
            input: promote_rule_input,
            output: promote_rule_output,
            mutating: true,
            destructive: false,
            idempotent: false,
            call: promote_rule,
        },
        Tool {
            name: "audit_log",
            title: "Audit log",
            description: "What operators did, newest first: who, what, to what, and why.",
            input: audit_input,
            output: || list_schema("entries"),
            mutating: false,
            destructive: false,
            idempotent: true,
            call: audit_log,
        },
    ]
}

/// The tools this server offers (the mutating ones only when it may change
/// the file).
pub(super) fn list<B: Backend>(mcp: &Mcp<B>) -> Vec<Value> {
    tools::<B>()
        .iter()
        .filter(|t| !(t.mutating && mcp.config().read_only))
        .map(|t| {
            json!({
                "name": t.name,
                "title": t.title,
                "description": t.description,
                "inputSchema": (t.input)(),
                "outputSchema": (t.output)(),
                "annotations": {
                    "title": t.title,
                    "readOnlyHint": !t.mutating,
                    "destructiveHint": t.destructive,
                    "idempotentHint": t.idempotent,
                    "openWorldHint": false,
                },
            })
        })
        .collect()
}

/// `tools/call`: the tool's result, `isError` with the reason when it
/// failed; an unknown tool (or a mutating one in read-only mode) is a
/// protocol error.
pub(super) fn call<B: Backend>(
    mcp: &Mcp<B>,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::params("tools/call needs the tool's name"))?;
    let all = tools::<B>();
    let tool = all
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| RpcError::params(format!("Unknown tool: {name}")))?;
    if tool.mutating && mcp.config().read_only {
        return Err(RpcError::params(format!(
            "Unknown tool: {name} (this server is read-only: it lists and allows no tool that changes the file)"
        )));
    }
    let args = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => return Err(RpcError::params("arguments must be an object")),
    };
    Ok(match (tool.call)(mcp, args) {
        Ok(result) => json!({
            "content": [{ "type": "text", "text": result.to_string() }],
            "structuredContent": result,
            "isError": false,
        }),
        Err(why) => json!({
            "content": [{ "type": "text", "text": why }],
            "isError": true,
        }),
    })
}

// ----- arguments -----------------------------------------------------------

fn args<T: DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| format!("invalid arguments: {e}"))
}

fn fail(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn to_value(v: &impl serde::Serialize) -> Answer {
    serde_json::to_value(v).map_err(fail)
}

fn limit(l: Option<usize>) -> Result<usize, String> {
    match l {
        None => Ok(100),
        Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(n) => Err(format!("limit {n}: 1 to {MAX_PAGE}")),
    }
}

fn parsed<T: std::str::FromStr>(what: &str, v: Option<String>) -> Result<Option<T>, String>
where
    T::Err: std::fmt::Display,
{
    v.map(|s| s.parse::<T>().map_err(|e| format!("{what}: {e}")))
        .transpose()
}

fn need_reason(reason: &str) -> Result<(), String> {
    if reason.trim().is_empty() {
        return Err("a reason is required: say why, for the audit log".into());
    }
    Ok(())
}

// ----- the reads -------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nothing {}

fn status<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let Nothing {} = args(a)?;
    let e = mcp.engine();
    let stats = e.stats().map_err(fail)?;
    let stuck: Vec<_> = stats.cursors.iter().filter(|c| c.is_stuck()).collect();
    Ok(json!({
        "now": e.now_ms(),
        "read_only": mcp.config().read_only,
        "head_seq": stats.events_appended,
        "workspaces": e.workspaces().map_err(fail)?,
        "consumers": stats.cursors,
        "stuck": stuck,
        "leases": e.leases().map_err(fail)?,
        "runs": stats.runs,
        "oldest_ready_due_at": stats.oldest_ready_due_at,
        "dead_letters": stats.dead_letters,
        "blocked_lanes": stats.blocked_lanes,
        "followers": stats.followers,
    }))
}

fn stats<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let Nothing {} = args(a)?;
    to_value(&mcp.engine().stats().map_err(fail)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListEvents {
    workspace: String,
    #[serde(default)]
    after: i64,
    #[serde(default)]
    types: Vec<String>,
    subject: Option<String>,
    limit: Option<usize>,
}

fn list_events<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: ListEvents = args(a)?;
    let mut q = Query::new(a.workspace)
        .after(a.after)
        .types(a.types)
        .limit(limit(a.limit)?);
    if let Some(s) = a.subject {
        q = q.subject(s);
    }
    to_value(&mcp.engine().events_page(&q).map_err(fail)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetEvent {
    workspace: Option<String>,
    id: Option<String>,
    seq: Option<i64>,
}

fn get_event<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: GetEvent = args(a)?;
    let e = mcp.engine();
    let (found, what) = match (a.workspace, a.id, a.seq) {
        (Some(ws), Some(id), None) => (
            e.event_by_id(&ws, &id).map_err(fail)?,
            format!("no event {id:?} in {ws}"),
        ),
        (None, None, Some(seq)) => (
            e.event(seq).map_err(fail)?,
            format!("no event at seq {seq}"),
        ),
        _ => return Err("give workspace and id, or seq".into()),
    };
    match found {
        Some(ev) => Ok(json!({ "event": ev })),
        None => Err(what),
    }
}

/// Takes the paging arguments out, leaving a filter's.
fn paging(a: &mut Value) -> Result<(Option<i64>, Option<usize>), String> {
    let Some(m) = a.as_object_mut() else {
        return Err("arguments must be an object".into());
    };
    let before = m
        .remove("before")
        .map(|v| args::<i64>(v).map_err(|e| format!("before: {e}")))
        .transpose()?;
    let limit = m
        .remove("limit")
        .map(|v| args::<usize>(v).map_err(|e| format!("limit: {e}")))
        .transpose()?;
    Ok((before, limit))
}

fn list_runs<B: Backend>(mcp: &Mcp<B>, mut a: Value) -> Answer {
    let (before, lim) = paging(&mut a)?;
    let filter: RunFilterSpec = args(a)?;
    let mut f = filter.filter().map_err(fail)?.limit(limit(lim)?);
    f.before = before;
    to_value(&mcp.engine().find_runs(&f).map_err(fail)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetRun {
    id: String,
}

fn get_run<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: GetRun = args(a)?;
    match run_with_logs(mcp.engine(), &a.id).map_err(fail)? {
        Some(d) => Ok(d),
        None => Err(format!("no run {:?}", a.id)),
    }
}

/// How many of a run's last log lines `get_run` (and its resource) gives.
const RUN_LOG_LINES: usize = 100;

/// A run in detail ([`reflexr::Engine::run_detail`]) with its `progress`
/// (or null) and the last [`RUN_LOG_LINES`] lines of its log, oldest
/// first; `logs_note` says how many there are when there are more.
fn run_with_logs<B: Backend>(e: &reflexr::Engine<B>, id: &str) -> reflexr::Result<Option<Value>> {
    let Some(detail) = e.run_detail(id)? else {
        return Ok(None);
    };
    let mut last = std::collections::VecDeque::with_capacity(RUN_LOG_LINES + 1);
    let mut total = 0usize;
    let mut after = 0;
    loop {
        let page = e.run_logs(id, after, MAX_PAGE)?;
        let full = page.len() == MAX_PAGE;
        total += page.len();
        after = page.last().map_or(after, |l| l.n);
        for line in page {
            last.push_back(line);
            if last.len() > RUN_LOG_LINES {
                last.pop_front();
            }
        }
        if !full {
            break;
        }
    }
    let mut v = json!(detail);
    let o = v.as_object_mut().expect("a run's detail is an object");
    o.insert("progress".into(), json!(e.run_progress(id)?));
    o.insert("logs".into(), json!(last));
    if total > last.len() {
        o.insert(
            "logs_note".into(),
            json!(format!(
                "the last {} of its {total} log lines; the first {} are not shown",
                last.len(),
                total - last.len()
            )),
        );
    }
    Ok(Some(v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterFilterArgs {
    kind: Option<String>,
    consumer: Option<String>,
    workspace: Option<String>,
    reason: Option<String>,
}

impl DeadLetterFilterArgs {
    fn filter(self) -> Result<DeadLetterFilter, String> {
        let mut f = DeadLetterFilter::new();
        f.kind = parsed::<DeadLetterKind>("kind", self.kind)?;
        f.consumer = self.consumer;
        f.workspace = self.workspace;
        f.reason = self.reason;
        Ok(f)
    }
}

fn list_dead_letters<B: Backend>(mcp: &Mcp<B>, mut a: Value) -> Answer {
    let (before, lim) = paging(&mut a)?;
    let include_resolved = match a.as_object_mut().and_then(|m| m.remove("include_resolved")) {
        Some(v) => args::<bool>(v).map_err(|e| format!("include_resolved: {e}"))?,
        None => false,
    };
    let filter: DeadLetterFilterArgs = args(a)?;
    let mut f = filter
        .filter()?
        .limit(limit(lim)?)
        .include_resolved(include_resolved);
    f.before = before;
    to_value(&mcp.engine().find_dead_letters(&f).map_err(fail)?)
}

fn list_consumers<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let Nothing {} = args(a)?;
    Ok(json!({ "consumers": mcp.engine().cursors().map_err(fail)? }))
}

fn list_rules<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let Nothing {} = args(a)?;
    Ok(json!({ "rules": mcp.engine().rules().map_err(fail)? }))
}

fn list_followers<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let Nothing {} = args(a)?;
    Ok(json!({ "followers": mcp.engine().followers().map_err(fail)? }))
}

fn list_schedules<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let Nothing {} = args(a)?;
    Ok(json!({ "schedules": mcp.engine().schedules().map_err(fail)? }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Audit {
    limit: Option<usize>,
}

fn audit_log<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: Audit = args(a)?;
    Ok(json!({ "entries": mcp.engine().audit_log(limit(a.limit)?).map_err(fail)? }))
}

fn list_actions<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let Nothing {} = args(a)?;
    let e = mcp.engine();
    Ok(json!({ "actions": e.action_configs().map_err(fail)?, "paused": e.paused().map_err(fail)? }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionArg {
    action: String,
}

fn list_action_keys<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: ActionArg = args(a)?;
    let e = mcp.engine();
    Ok(json!({
        "action": a.action,
        "keys": e.action_keys(&a.action).map_err(fail)?,
        "limits": e.key_limits(&a.action).map_err(fail)?,
    }))
}

// ----- the changes -------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetKeyLimits {
    action: String,
    key: String,
    max_running: Option<u32>,
    rate_count: Option<u32>,
    rate_period_ms: Option<u64>,
    weight: Option<u32>,
    reason: String,
}

fn set_key_limits<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: SetKeyLimits = args(a)?;
    need_reason(&a.reason)?;
    let mut k = reflexr::KeyLimits::new(a.key);
    if let Some(n) = a.max_running {
        k = k.max_running(n);
    }
    match (a.rate_count, a.rate_period_ms) {
        (Some(n), Some(ms)) => k = k.rate(n, std::time::Duration::from_millis(ms)),
        (None, None) => {}
        _ => return Err("rate_count and rate_period_ms go together".into()),
    }
    if let Some(w) = a.weight {
        k = k.weight(w);
    }
    mcp.engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .set_key_limits(&a.action, &k)
        .map_err(fail)?;
    Ok(json!({ "action": a.action, "set": k }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Cancel {
    id: String,
    #[serde(default)]
    confirm: bool,
    reason: String,
}

fn cancel_run<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: Cancel = args(a)?;
    need_reason(&a.reason)?;
    if !a.confirm {
        return Err(format!(
            "cancel_run needs confirm: true. It would cancel run {}.",
            a.id
        ));
    }
    let was = mcp
        .engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .cancel_run(&a.id)
        .map_err(fail)?;
    Ok(json!({ "cancelled": a.id, "was": was }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRun {
    id: String,
    step: String,
    #[serde(default)]
    confirm: bool,
    reason: String,
}

fn reset_run_to_step<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: ResetRun = args(a)?;
    need_reason(&a.reason)?;
    if !a.confirm {
        let steps = mcp.engine().run_steps(&a.id).map_err(fail)?;
        let Some(at) = steps
            .iter()
            .find(|s| s.name == a.step && s.kind != StepKind::Begin)
        else {
            return Err(format!("run {} has no step {:?}", a.id, a.step));
        };
        let forgotten: Vec<&str> = steps
            .iter()
            .filter(|s| s.position >= at.position)
            .map(|s| s.name.as_str())
            .collect();
        return Err(format!(
            "reset_run_to_step needs confirm: true. It would forget the steps {forgotten:?} of run {} \
             and run them again: what they did outside the file may happen again.",
            a.id
        ));
    }
    mcp.engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .reset_run_to_step(&a.id, &a.step)
        .map_err(fail)?;
    Ok(json!({ "reset": a.id, "step": a.step }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseArgs {
    kind: String,
    name: String,
    reason: String,
}

impl PauseArgs {
    fn target(&self) -> Result<reflexr::Pausable, String> {
        reflexr::Pausable::parse(&self.kind, &self.name).map_err(fail)
    }
}

fn pause<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: PauseArgs = args(a)?;
    need_reason(&a.reason)?;
    let what = a.target()?;
    let fresh = mcp
        .engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .pause(&what)
        .map_err(fail)?;
    Ok(json!({ "paused": what, "paused_now": fresh }))
}

fn resume<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: PauseArgs = args(a)?;
    need_reason(&a.reason)?;
    let what = a.target()?;
    mcp.engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .resume(&what)
        .map_err(fail)?;
    Ok(json!({ "resumed": what }))
}

/// What a bulk tool acts on.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Target {
    Runs,
    DeadLetters,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Bulk {
    target: Target,
    ids: Option<Vec<Value>>,
    filter: Option<Map<String, Value>>,
    max: Option<usize>,
    dry_run: Option<bool>,
    confirm: Option<bool>,
    reason: String,
}

/// The ids a bulk call acts on, and whether more match than it took.
enum Ids {
    Runs(Vec<String>),
    Letters(Vec<i64>),
}

impl Ids {
    fn json(&self) -> Value {
        match self {
            Ids::Runs(ids) => json!(ids),
            Ids::Letters(ids) => json!(ids),
        }
    }

    fn len(&self) -> usize {
        match self {
            Ids::Runs(ids) => ids.len(),
            Ids::Letters(ids) => ids.len(),
        }
    }
}

fn bulk_ids<B: Backend>(mcp: &Mcp<B>, b: &Bulk) -> Result<(Ids, bool), String> {
    let max = match b.max {
        None => 100,
        Some(n) if (1..=MAX_BULK).contains(&n) => n,
        Some(n) => return Err(format!("max {n}: 1 to {MAX_BULK}")),
    };
    // The dry run is the operator's too: who asks and why are checked as
    // for the change it previews.
    let ops = mcp
        .engine()
        .operator(mcp.config().operator.clone(), b.reason.clone())
        .map_err(fail)?;
    match (&b.ids, &b.filter, b.target) {
        (Some(ids), None, Target::Runs) => {
            let ids: Vec<String> = ids
                .iter()
                .map(|v| v.as_str().map(String::from).ok_or("a run id is a string"))
                .collect::<Result<_, _>>()?;
            check_count(ids.len(), max)?;
            Ok((Ids::Runs(ids), false))
        }
        (Some(ids), None, Target::DeadLetters) => {
            let ids: Vec<i64> = ids
                .iter()
                .map(|v| v.as_i64().ok_or("a dead letter id is an integer"))
                .collect::<Result<_, _>>()?;
            check_count(ids.len(), max)?;
            Ok((Ids::Letters(ids), false))
        }
        (None, Some(f), Target::Runs) => {
            let mut filter: RunFilterSpec = args(Value::Object(f.clone()))?;
            if filter.state.as_deref().is_some_and(|s| s != "dead") {
                return Err("only dead runs are retried or discarded: leave state out".into());
            }
            filter.state = None;
            let m = ops
                .matching_dead_runs(&filter.filter().map_err(fail)?, max)
                .map_err(fail)?;
            Ok((Ids::Runs(m.ids), m.more))
        }
        (None, Some(f), Target::DeadLetters) => {
            let filter: DeadLetterFilterArgs = args(Value::Object(f.clone()))?;
            let m = ops
                .matching_dead_letters(&filter.filter()?, max)
                .map_err(fail)?;
            Ok((Ids::Letters(m.ids), m.more))
        }
        _ => Err("give either ids or a filter".into()),
    }
}

fn check_count(n: usize, max: usize) -> Result<(), String> {
    if n > max {
        return Err(format!(
            "{n} ids: at most {max} a call (max, up to {MAX_BULK})"
        ));
    }
    Ok(())
}

fn act<B: Backend>(mcp: &Mcp<B>, ids: &Ids, retry: bool, reason: &str) -> Answer {
    let ops = mcp
        .engine()
        .operator(mcp.config().operator.clone(), reason)
        .map_err(fail)?;
    let done = match (ids, retry) {
        (Ids::Runs(ids), true) => ops.retry_runs(ids),
        (Ids::Runs(ids), false) => ops.discard_runs(ids),
        (Ids::Letters(ids), true) => ops.retry_dead_letters(ids),
        (Ids::Letters(ids), false) => ops.discard_dead_letters(ids),
    }
    .map_err(fail)?;
    to_value(&done)
}

fn retry<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let b: Bulk = args(a)?;
    if b.confirm.is_some() {
        return Err("retry takes dry_run (true by default), not confirm".into());
    }
    need_reason(&b.reason)?;
    let (ids, more) = bulk_ids(mcp, &b)?;
    if b.dry_run.unwrap_or(true) {
        return Ok(json!({
            "dry_run": true, "matched": ids.len(), "ids": ids.json(), "more": more,
            "done": [], "skipped": [],
        }));
    }
    let mut out = act(mcp, &ids, true, &b.reason)?;
    out["dry_run"] = json!(false);
    out["matched"] = json!(ids.len());
    out["ids"] = ids.json();
    out["more"] = json!(more);
    Ok(out)
}

fn discard<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let b: Bulk = args(a)?;
    if b.dry_run.is_some() {
        return Err("discard takes confirm: true, not dry_run".into());
    }
    need_reason(&b.reason)?;
    let (ids, more) = bulk_ids(mcp, &b)?;
    if b.confirm != Some(true) {
        return Err(format!(
            "discard needs confirm: true. It would discard {} ({}){}.",
            ids.len(),
            ids.json(),
            if more { ", and more match" } else { "" }
        ));
    }
    let mut out = act(mcp, &ids, false, &b.reason)?;
    out["dry_run"] = json!(false);
    out["matched"] = json!(ids.len());
    out["ids"] = ids.json();
    out["more"] = json!(more);
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Unblock {
    rule: String,
    scope: String,
    reason: String,
}

fn unblock<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: Unblock = args(a)?;
    need_reason(&a.reason)?;
    mcp.engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .unblock(&a.rule, &a.scope)
        .map_err(fail)?;
    Ok(json!({ "unblocked": { "rule": a.rule, "scope": a.scope } }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetCursor {
    workspace: String,
    kind: String,
    name: String,
    to: i64,
    #[serde(default)]
    confirm: bool,
    reason: String,
}

fn reset_cursor<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: ResetCursor = args(a)?;
    need_reason(&a.reason)?;
    let kind: ConsumerKind = a.kind.parse().map_err(fail)?;
    if !a.confirm {
        return Err(format!(
            "reset_cursor needs confirm: true. It would move {} {} on {} to seq {}.",
            a.kind, a.name, a.workspace, a.to
        ));
    }
    let reset = mcp
        .engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .reset_cursor(&a.workspace, kind, &a.name, a.to)
        .map_err(fail)?;
    Ok(json!({ "reset": reset }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestartFollower {
    name: String,
    reason: String,
}

fn restart_follower<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: RestartFollower = args(a)?;
    need_reason(&a.reason)?;
    mcp.engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .restart_follower(&a.name)
        .map_err(fail)?;
    Ok(json!({ "restarted": a.name }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromoteRule {
    name: String,
    reason: String,
}

fn promote_rule<B: Backend>(mcp: &Mcp<B>, a: Value) -> Answer {
    let a: PromoteRule = args(a)?;
    need_reason(&a.reason)?;
    let at = mcp
        .engine()
        .operator(mcp.config().operator.clone(), a.reason)
        .map_err(fail)?
        .promote_rule(&a.name)
        .map_err(fail)?;
    Ok(json!({ "promoted": a.name, "at": at }))
}

// ----- resources -------------------------------------------------------------

pub(super) fn resources() -> Value {
    json!([{
        "uri": "reflexr://status",
        "name": "status",
        "title": "The file at a glance",
        "description": "What the status tool returns: the log's head, consumers and lag, runs by state, open dead letters, blocked lanes, leases, followers.",
        "mimeType": "application/json",
    }])
}

pub(super) fn resource_templates() -> Value {
    json!([
        {
            "uriTemplate": "reflexr://runs/{id}",
            "name": "run",
            "title": "A run",
            "description": "One run with the event that fired it, what it emitted, a workflow's steps, its progress and the last 100 lines of its log.",
            "mimeType": "application/json",
        },
        {
            "uriTemplate": "reflexr://events/{workspace}/{id}",
            "name": "event",
            "title": "An event",
            "description": "One event of a workspace, by id.",
            "mimeType": "application/json",
        },
        {
            "uriTemplate": "reflexr://rules/{name}/state/{scope}",
            "name": "rule-state",
            "title": "A rule's state for a scope",
            "description": "The state a stateful rule keeps for one scope.",
            "mimeType": "application/json",
        },
    ])
}

pub(super) fn read_resource<B: Backend>(
    mcp: &Mcp<B>,
    era: Era,
    params: &Map<String, Value>,
) -> Result<Map<String, Value>, RpcError> {
    let uri = params
        .get("uri")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::params("resources/read needs a uri"))?;
    let not_found = || {
        let code = match era {
            Era::Legacy => code::RESOURCE_NOT_FOUND,
            Era::Modern => code::INVALID_PARAMS,
        };
        RpcError::new(code, "Resource not found").with_data(json!({ "uri": uri }))
    };
    let internal = |e: reflexr::Error| {
        if e.is_bad_input() {
            not_found()
        } else {
            RpcError::new(code::INTERNAL, e.to_string())
        }
    };
    let rest = uri.strip_prefix("reflexr://").ok_or_else(not_found)?;
    let parts: Vec<String> = rest.split('/').map(decode).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let e = mcp.engine();
    let value = match parts.as_slice() {
        ["status"] => status(mcp, json!({})).map_err(|m| RpcError::new(code::INTERNAL, m))?,
        ["runs", id] => run_with_logs(e, id)
            .map_err(internal)?
            .ok_or_else(not_found)?,
        ["events", ws, id] => json!(
            e.event_by_id(ws, id)
                .map_err(internal)?
                .ok_or_else(not_found)?
        ),
        ["rules", name, "state", scope] => {
            let state = e
                .rule_state::<Value>(name, scope)
                .map_err(internal)?
                .ok_or_else(not_found)?;
            json!({ "rule": name, "scope": scope, "state": state })
        }
        _ => return Err(not_found()),
    };
    Ok(super::object(json!({
        "contents": [{
            "uri": uri,
            "mimeType": "application/json",
            "text": serde_json::to_string_pretty(&value).unwrap_or_default(),
        }],
    })))
}

/// Percent-decoding of one URI segment (ids and scopes may hold `/` as
/// `%2F`); a `%` not followed by two hex digits stays as it is.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ----- schemas -----------------------------------------------------------------

fn no_input() -> Value {
    json!({ "type": "object", "properties": {}, "additionalProperties": false })
}

fn any_object() -> Value {
    json!({ "type": "object" })
}

fn limit_schema() -> Value {
    json!({ "type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100, "description": "At most this many." })
}

fn reason_schema() -> Value {
    json!({ "type": "string", "minLength": 1, "description": "Why: recorded in the audit log." })
}

fn wrapped(key: &str) -> Value {
    json!({ "type": "object", "properties": { key: { "type": "object" } }, "required": [key] })
}

fn list_schema(key: &str) -> Value {
    json!({
        "type": "object",
        "properties": { key: { "type": "array", "items": { "type": "object" } } },
        "required": [key],
    })
}

fn page_schema(key: &str, next: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            key: { "type": "array", "items": { "type": "object" } },
            next: { "type": ["integer", "null"] },
        },
        "required": [key, next],
    })
}

fn status_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "now": { "type": "integer" },
            "read_only": { "type": "boolean" },
            "head_seq": { "type": "integer" },
            "workspaces": { "type": "array", "items": { "type": "object" } },
            "consumers": { "type": "array", "items": { "type": "object" } },
            "stuck": { "type": "array", "items": { "type": "object" } },
            "leases": { "type": "array", "items": { "type": "object" } },
            "runs": { "type": "object", "additionalProperties": { "type": "integer" } },
            "oldest_ready_due_at": { "type": ["integer", "null"] },
            "dead_letters": { "type": "object", "additionalProperties": { "type": "integer" } },
            "blocked_lanes": { "type": "integer" },
            "followers": { "type": "array", "items": { "type": "object" } },
        },
        "required": ["head_seq", "workspaces", "consumers", "runs", "dead_letters", "blocked_lanes"],
    })
}

fn run_detail_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run": { "type": "object" },
            "event": { "type": ["object", "null"] },
            "emitted": { "type": "array", "items": { "type": "object" } },
            "steps": {
                "type": "array",
                "items": { "type": "object" },
                "description": "A workflow's timeline, in order (empty for a run that is not one): name, position, kind, state (done or waiting), attempt, recorded_at, output_bytes, output, detail (what it waits or waited for), wake_at.",
            },
            "progress": {
                "type": ["object", "null"],
                "description": "How far its handler last said it got: attempt, done, total, at (ms); null if it never said.",
            },
            "logs": {
                "type": "array",
                "items": { "type": "object" },
                "description": "The last 100 lines its handler logged, oldest first, across attempts: n (from 1), attempt, at (ms), level (error, warn, info, debug or trace), message, fields (JSON or null).",
            },
            "logs_note": {
                "type": "string",
                "description": "When it logged more than the lines given: how many there are.",
            },
        },
        "required": ["run", "event", "emitted", "steps", "progress", "logs"],
    })
}

fn list_events_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "workspace": { "type": "string", "description": "The workspace (log)." },
            "after": { "type": "integer", "minimum": 0, "default": 0, "description": "Only events after this seq (a page's next_after)." },
            "types": { "type": "array", "items": { "type": "string" }, "description": "Only events of these types." },
            "subject": { "type": "string", "description": "Only events about this subject (e.g. session/42)." },
            "limit": limit_schema(),
        },
        "required": ["workspace"],
        "additionalProperties": false,
    })
}

fn get_event_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "workspace": { "type": "string" },
            "id": { "type": "string", "description": "With workspace: the event's id." },
            "seq": { "type": "integer", "description": "Or: the event's seq." },
        },
        "additionalProperties": false,
    })
}

fn run_filter_properties() -> Map<String, Value> {
    super::object(json!({
        "action": { "type": "string" },
        "rule": { "type": "string" },
        "workspace": { "type": "string" },
        "scope": { "type": "string" },
        "input": {
            "type": "object",
            "description": "One entry: a top-level key of the input (or a $.path) and the JSON value it must hold, e.g. {\"session\": 42}.",
            "minProperties": 1,
            "maxProperties": 1,
        },
    }))
}

fn list_runs_input() -> Value {
    let mut props = run_filter_properties();
    props.insert(
        "state".into(),
        json!({ "type": "string", "enum": RunState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>() }),
    );
    props.insert(
        "before".into(),
        json!({ "type": "integer", "description": "Only runs older than this (a page's next)." }),
    );
    props.insert("limit".into(), limit_schema());
    json!({ "type": "object", "properties": props, "additionalProperties": false })
}

fn get_run_input() -> Value {
    json!({
        "type": "object",
        "properties": { "id": { "type": "string", "description": "The run's id." } },
        "required": ["id"],
        "additionalProperties": false,
    })
}

fn dead_letter_filter_properties() -> Map<String, Value> {
    super::object(json!({
        "kind": { "type": "string", "enum": DeadLetterKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>() },
        "consumer": { "type": "string", "description": "e.g. a rule's name, or delivery/push." },
        "workspace": { "type": "string" },
        "reason": { "type": "string", "description": "e.g. attempts_exhausted." },
    }))
}

fn list_dead_letters_input() -> Value {
    let mut props = dead_letter_filter_properties();
    props.insert(
        "include_resolved".into(),
        json!({ "type": "boolean", "default": false }),
    );
    props.insert(
        "before".into(),
        json!({ "type": "integer", "description": "Only older than this id (a page's next)." }),
    );
    props.insert("limit".into(), limit_schema());
    json!({ "type": "object", "properties": props, "additionalProperties": false })
}

fn bulk_input(discard: bool) -> Value {
    let mut filter = run_filter_properties();
    filter.extend(dead_letter_filter_properties());
    let mut props = super::object(json!({
        "target": {
            "type": "string",
            "enum": ["runs", "dead_letters"],
            "description": "Dead runs (ids are run ids) or dead letters (ids are integers).",
        },
        "ids": { "type": "array", "items": { "type": ["string", "integer"] }, "description": "Exactly these." },
        "filter": {
            "type": "object",
            "properties": filter,
            "additionalProperties": false,
            "description": "Or: all that match (dead runs; open dead letters), at most max. For runs: action, rule, workspace, scope, input; for dead letters: kind, consumer, workspace, reason.",
        },
        "max": { "type": "integer", "minimum": 1, "maximum": MAX_BULK, "default": 100 },
        "reason": reason_schema(),
    }));
    if discard {
        props.insert(
            "confirm".into(),
            json!({ "type": "boolean", "description": "Must be true to discard; otherwise the answer says what would be discarded." }),
        );
    } else {
        props.insert(
            "dry_run".into(),
            json!({ "type": "boolean", "default": true, "description": "True (the default): only report what would be retried." }),
        );
    }
    json!({
        "type": "object",
        "properties": props,
        "required": ["target", "reason"],
        "additionalProperties": false,
    })
}

fn actions_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "actions": { "type": "array", "items": { "type": "object" } },
            "paused": { "type": "array", "items": { "type": "object" } },
        },
        "required": ["actions", "paused"],
    })
}

fn list_action_keys_input() -> Value {
    json!({
        "type": "object",
        "properties": { "action": { "type": "string", "description": "The action." } },
        "required": ["action"],
        "additionalProperties": false,
    })
}

fn action_keys_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": { "type": "string" },
            "keys": {
                "type": "array",
                "items": { "type": "object" },
                "description": "By key: key, waiting, ready, running, max_running and rate (the limits that hold: its own, else the action's; rate is [count, period in ms]), weight, overridden.",
            },
            "limits": {
                "type": "array",
                "items": { "type": "object" },
                "description": "The keys' own overrides: key, max_running, rate, weight (null: not overridden).",
            },
        },
        "required": ["action", "keys", "limits"],
    })
}

fn set_key_limits_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": { "type": "string", "description": "A fair or partitioned action." },
            "key": { "type": "string", "minLength": 1, "description": "The key (e.g. a tenant), as list_action_keys names it." },
            "max_running": { "type": "integer", "minimum": 1, "description": "At most this many of the key's runs at once (left out: the action's)." },
            "rate_count": { "type": "integer", "minimum": 1, "description": "At most this many starts of the key per rate_period_ms (with it; left out: the action's)." },
            "rate_period_ms": { "type": "integer", "minimum": 1, "description": "The rate's period, in ms (with rate_count)." },
            "weight": { "type": "integer", "minimum": 1, "description": "Its share in a fair claim against the other keys' (left out: 1)." },
            "reason": reason_schema(),
        },
        "required": ["action", "key", "reason"],
        "dependentRequired": { "rate_count": ["rate_period_ms"], "rate_period_ms": ["rate_count"] },
        "additionalProperties": false,
    })
}

fn set_key_limits_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": { "type": "string" },
            "set": { "type": "object", "description": "The key's limits now: key, max_running, rate ([count, period in ms]), weight." },
        },
        "required": ["action", "set"],
    })
}

fn cancel_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": { "type": "string", "description": "The run's id." },
            "confirm": { "type": "boolean", "description": "Must be true." },
            "reason": reason_schema(),
        },
        "required": ["id", "confirm", "reason"],
        "additionalProperties": false,
    })
}

fn reset_run_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": { "type": "string", "description": "The run's id." },
            "step": { "type": "string", "description": "The step to reset to, as get_run's steps name it (not the begin)." },
            "confirm": { "type": "boolean", "description": "Must be true." },
            "reason": reason_schema(),
        },
        "required": ["id", "step", "confirm", "reason"],
        "additionalProperties": false,
    })
}

fn pause_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "kind": { "type": "string", "enum": ["action", "channel", "job", "rule", "reaction"] },
            "name": { "type": "string" },
            "reason": reason_schema(),
        },
        "required": ["kind", "name", "reason"],
        "additionalProperties": false,
    })
}

fn bulk_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "dry_run": { "type": "boolean" },
            "matched": { "type": "integer" },
            "ids": { "type": "array" },
            "more": { "type": "boolean" },
            "done": { "type": "array", "items": { "type": "string" } },
            "skipped": { "type": "array" },
        },
        "required": ["dry_run", "matched", "ids", "more", "done", "skipped"],
    })
}

fn unblock_input() -> Value {
    json!({
        "type": "object",
        "properties": { "rule": { "type": "string" }, "scope": { "type": "string" }, "reason": reason_schema() },
        "required": ["rule", "scope", "reason"],
        "additionalProperties": false,
    })
}

fn reset_cursor_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "workspace": { "type": "string" },
            "kind": { "type": "string", "enum": ConsumerKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>() },
            "name": { "type": "string" },
            "to": { "type": "integer", "minimum": 0, "description": "The seq to move the cursor to." },
            "confirm": { "type": "boolean", "description": "Must be true." },
            "reason": reason_schema(),
        },
        "required": ["workspace", "kind", "name", "to", "confirm", "reason"],
        "additionalProperties": false,
    })
}

fn restart_follower_input() -> Value {
    json!({
        "type": "object",
        "properties": { "name": { "type": "string" }, "reason": reason_schema() },
        "required": ["name", "reason"],
        "additionalProperties": false,
    })
}

fn promote_rule_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "description": "The live rule's name (not its shadow's <rule>@v<version>)." },
            "reason": reason_schema(),
        },
        "required": ["name", "reason"],
        "additionalProperties": false,
    })
}

fn promote_rule_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "promoted": { "type": "string", "description": "The rule." },
            "at": { "type": "integer", "description": "The handover position: the live version decides up to this seq, the shadow after it." },
        },
        "required": ["promoted", "at"],
    })
}

fn audit_input() -> Value {
    json!({ "type": "object", "properties": { "limit": limit_schema() }, "additionalProperties": false })
}
