//! Control of the work: enqueueing directly, pausing and resuming,
//! cancelling, unique runs, priorities, and concurrency and rate limits per
//! action — all kept in the file, so every process on it obeys them.
//!
//! - **Enqueue** ([`Enqueue`], [`crate::Tx::enqueue`]): a run of an action
//!   with JSON arguments, now or at a time, in the caller's transaction. The
//!   producer need not register the action: any process whose executors
//!   have it runs it.
//! - **Pause** ([`Pausable`]): an action (a channel's or a scheduled job's
//!   is its action), a rule's evaluation, a reaction. Nothing of an action
//!   is claimed while it is paused; a paused rule or reaction does not move
//!   its cursor. Resuming picks up where it stood.
//! - **Cancel**: a pending run ends `cancelled` at once; a running one is
//!   asked to stop (its handler sees [`crate::RunContext::is_cancelled`] at
//!   its next claim renewal, at once in the same process) and its
//!   completion is refused: it ends `cancelled`.
//! - **Unique** ([`Unique`]): no second run of an action with a key while
//!   one is pending, pending or running, or within a period. Partial unique
//!   indexes (and a keyed table for periods) hold it.
//! - **Priorities and limits** ([`ActionConfig`]): a default priority per
//!   action (higher is claimed first), at most N running at once across
//!   every process, at most R starts per period (a sliding window), each
//!   optionally per value of an input field.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::audit::AuditAction;
use crate::error::{Error, Result};
use crate::names;
use crate::retry::RetryPolicy;
use crate::store::audit::Entry;
use crate::store::backend::{Audit, ClaimPlan, Control, Runs, RunsMore, Store, Work};
use crate::store::control::ActionRow;
use crate::store::runs::{Inserted, NewRun, RunRow, Uniq};
use crate::tx::Tx;

/// How long a uniqueness key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unique {
    /// While a run with the key waits (waiting or ready): a second is not
    /// made; once it started, another may be enqueued.
    WhilePending,
    /// While a run with the key waits or runs.
    WhileActive,
    /// For this long after the first was enqueued, whatever became of it.
    For(Duration),
}

impl Unique {
    fn mode(self) -> &'static str {
        match self {
            Unique::WhilePending => "pending",
            Unique::WhileActive => "active",
            Unique::For(_) => "period",
        }
    }
}

/// A run to enqueue directly: an action and its arguments.
///
/// ```
/// # use reflexr::{Enqueue, Unique};
/// # use std::time::Duration;
/// let job = Enqueue::new("send-invoice", &serde_json::json!({ "invoice": 42 }))
///     .priority(5)
///     .scope("customer/7")              // one at a time per customer, in order
///     .unique("invoice/42", Unique::WhileActive)
///     .after(Duration::from_secs(60));
/// ```
#[derive(Debug, Clone)]
pub struct Enqueue {
    pub(crate) action: String,
    pub(crate) input: std::result::Result<String, String>,
    pub(crate) at: Option<i64>,
    pub(crate) after: Option<Duration>,
    pub(crate) priority: Option<i64>,
    pub(crate) scope: Option<String>,
    pub(crate) unique: Option<(String, Unique)>,
    pub(crate) retry: RetryPolicy,
    pub(crate) id: Option<String>,
}

impl Enqueue {
    /// A run of `action` with `input` as its arguments (any JSON value).
    pub fn new<T: Serialize + ?Sized>(action: impl Into<String>, input: &T) -> Enqueue {
        Enqueue {
            action: action.into(),
            input: serde_json::to_string(input).map_err(|e| e.to_string()),
            at: None,
            after: None,
            priority: None,
            scope: None,
            unique: None,
            retry: RetryPolicy::default(),
            id: None,
        }
    }

    /// Not before this time (ms since the epoch, by the engine's clock).
    pub fn at(mut self, ms: i64) -> Enqueue {
        self.at = Some(ms);
        self
    }

    /// Not before this long from now.
    pub fn after(mut self, delay: Duration) -> Enqueue {
        self.after = Some(delay);
        self
    }

    /// Its priority: higher is claimed first (default: the action's, see
    /// [`ActionConfig::priority`], else 0).
    pub fn priority(mut self, priority: i64) -> Enqueue {
        self.priority = Some(priority);
        self
    }

    /// Runs of the action with the same scope run one at a time, in the
    /// order they were enqueued.
    pub fn scope(mut self, scope: impl Into<String>) -> Enqueue {
        self.scope = Some(scope.into());
        self
    }

    /// No second run of the action with `key` while `unique` holds: the
    /// enqueue returns the existing run's id, marked deduplicated.
    pub fn unique(mut self, key: impl Into<String>, unique: Unique) -> Enqueue {
        self.unique = Some((key.into(), unique));
        self
    }

    /// How failed attempts are retried (default [`RetryPolicy::default`]).
    pub fn retry(mut self, retry: RetryPolicy) -> Enqueue {
        self.retry = retry;
        self
    }

    /// The run's id (default: a new one); enqueueing an id that exists
    /// enqueues nothing.
    pub fn id(mut self, id: impl Into<String>) -> Enqueue {
        self.id = Some(id.into());
        self
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Enqueued {
    /// The run's id: the new one, or the one that held the key (or the id).
    pub id: String,
    /// True when nothing new was made: the key was held, or the id existed.
    pub deduplicated: bool,
}

/// A checked uniqueness key.
pub(crate) fn uniq(key: &str, u: Unique) -> Result<Uniq<'_>> {
    names::check_text("unique key", key, names::MAX_ID_BYTES)?;
    let period_ms = match u {
        Unique::For(d) if d.is_zero() => {
            return Err(Error::invalid("unique", "a period must be more than zero"));
        }
        Unique::For(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        _ => 0,
    };
    Ok(Uniq {
        key,
        mode: u.mode(),
        period_ms,
    })
}

/// Inserts an enqueued run (or finds the one that holds its key).
pub(crate) fn enqueue<B: Store>(tx: &Tx<'_, B>, e: &Enqueue) -> Result<Enqueued> {
    names::check_name("action", &e.action)?;
    let input = e
        .input
        .as_ref()
        .map_err(|m| Error::Encode { message: m.clone() })?;
    crate::changelog::check_json("input", input, tx.limits().max_payload_bytes)?;
    e.retry.validate()?;
    if let Some(s) = &e.scope {
        names::check_text("scope", s, names::MAX_SUBJECT_BYTES)?;
    }
    let unique = match &e.unique {
        Some((key, u)) => Some(uniq(key, *u)?),
        None => None,
    };
    let id = match &e.id {
        Some(id) => {
            names::check_text("id", id, names::MAX_ID_BYTES)?;
            id.clone()
        }
        None => crate::changelog::new_id(),
    };
    let now = tx.now_ms();
    let due_at = match (e.at, e.after) {
        (Some(at), _) => at,
        (None, Some(d)) => now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        (None, None) => now,
    };
    let lane = e
        .scope
        .as_ref()
        .map(|s| format!("{}{} {s}", names::TASK_LANE_PREFIX, e.action));
    let inserted = Runs::insert(
        tx.core(),
        &NewRun {
            id: &id,
            kind: "task",
            action: &e.action,
            workspace: None,
            rule: None,
            scope: e.scope.as_deref(),
            lane: lane.as_deref(),
            on_dead_letter: "continue",
            input,
            event_seq: None,
            event_id: None,
            depth: 0,
            retry: &e.retry,
            due_at,
            now,
            dead: None,
            priority: e.priority,
            unique,
        },
    )?;
    Ok(match inserted {
        Inserted::New => Enqueued {
            id,
            deduplicated: false,
        },
        Inserted::Existed => Enqueued {
            id,
            deduplicated: true,
        },
        Inserted::Duplicate(other) => Enqueued {
            id: other,
            deduplicated: true,
        },
    })
}

/// What can be paused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Pausable {
    /// An action: none of its runs is claimed.
    Action(String),
    /// A channel's deliveries (its action, `delivery/<channel>`).
    Channel(String),
    /// A scheduled job's occurrences (its action, `job/<name>`): they are
    /// made, and wait.
    Job(String),
    /// A rule: it decides nothing, and its cursor stays.
    Rule(String),
    /// A reaction: it handles nothing, and its cursor stays.
    Reaction(String),
}

impl Pausable {
    /// What `kind` (`action`, `channel`, `job`, `rule` or `reaction`) and
    /// `name` say.
    ///
    /// # Errors
    /// [`Error::Invalid`] for another kind.
    pub fn parse(kind: &str, name: &str) -> Result<Pausable> {
        let name = name.to_string();
        Ok(match kind {
            "action" => Pausable::Action(name),
            "channel" => Pausable::Channel(name),
            "job" => Pausable::Job(name),
            "rule" => Pausable::Rule(name),
            "reaction" => Pausable::Reaction(name),
            other => {
                return Err(Error::invalid(
                    "kind",
                    format!("{other:?}: action, channel, job, rule or reaction"),
                ));
            }
        })
    }

    /// The row's kind and name.
    fn key(&self) -> (&'static str, String) {
        match self {
            Pausable::Action(a) => ("action", a.clone()),
            Pausable::Channel(c) => ("action", names::channel_action(c)),
            Pausable::Job(j) => ("action", names::job_action(j)),
            Pausable::Rule(r) => ("rule", r.clone()),
            Pausable::Reaction(r) => ("reaction", r.clone()),
        }
    }

    fn name(&self) -> &str {
        match self {
            Pausable::Action(n)
            | Pausable::Channel(n)
            | Pausable::Job(n)
            | Pausable::Rule(n)
            | Pausable::Reaction(n) => n,
        }
    }
}

/// Something paused, and by whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PausedInfo {
    /// `action`, `rule` or `reaction` (channels and jobs are their actions).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Since when (ms since the epoch).
    pub since: i64,
    /// Who paused it.
    pub operator: String,
    /// Why.
    pub reason: String,
}

pub(crate) fn pause<C: Work + ?Sized>(
    conn: &C,
    what: &Pausable,
    now: i64,
    op: &str,
    why: &str,
) -> Result<bool> {
    names::check_name("name", what.name())?;
    crate::operate::check_operator(op, why)?;
    let (kind, name) = what.key();
    let new = Control::pause(conn, kind, &name, now, op, why)?;
    if new {
        audit(
            conn,
            now,
            op,
            AuditAction::Pause,
            &format!("{kind} {name}"),
            why,
            "{}",
        )?;
    }
    Ok(new)
}

pub(crate) fn resume<C: Work + ?Sized>(
    conn: &C,
    what: &Pausable,
    now: i64,
    op: &str,
    why: &str,
) -> Result<()> {
    let (kind, name) = what.key();
    if !Control::resume(conn, kind, &name)? {
        return Err(Error::not_found("paused", format!("{kind} {name}")));
    }
    audit(
        conn,
        now,
        op,
        AuditAction::Resume,
        &format!("{kind} {name}"),
        why,
        "{}",
    )
}

pub(crate) fn paused<C: Control + ?Sized>(conn: &C) -> Result<Vec<PausedInfo>> {
    Ok(Control::paused(conn)?
        .into_iter()
        .map(|(kind, name, since, operator, reason)| PausedInfo {
            kind,
            name,
            since,
            operator,
            reason,
        })
        .collect())
}

/// The names of this kind that are paused.
pub(crate) fn paused_names<C: Control + ?Sized>(conn: &C, kind: &str) -> Result<HashSet<String>> {
    Control::paused_names(conn, kind)
}

/// One action's settings: its default priority and its limits.
///
/// ```
/// # use reflexr::ActionConfig;
/// # use std::time::Duration;
/// let c = ActionConfig::new("charge-card")
///     .priority(10)
///     .max_running(4)                          // at most 4 at once, every process together
///     .rate(100, Duration::from_secs(60))      // at most 100 starts a minute
///     .partition_by("customer");               // each per customer (an input field)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ActionConfig {
    /// The action.
    pub action: String,
    /// The priority its runs get unless they say otherwise.
    pub priority: i64,
    /// At most this many running at once, across every process.
    pub max_running: Option<u32>,
    /// At most `.0` starts in any window of `.1` ms.
    pub rate: Option<(u32, i64)>,
    /// Each limit counts per value of this input field (a key, or a `$`
    /// path).
    pub partition_by: Option<String>,
}

impl ActionConfig {
    /// No limits and priority 0.
    pub fn new(action: impl Into<String>) -> ActionConfig {
        ActionConfig {
            action: action.into(),
            priority: 0,
            max_running: None,
            rate: None,
            partition_by: None,
        }
    }

    /// The default priority of its runs.
    pub fn priority(mut self, p: i64) -> ActionConfig {
        self.priority = p;
        self
    }

    /// At most `n` running at once, across every process on the file.
    pub fn max_running(mut self, n: u32) -> ActionConfig {
        self.max_running = Some(n);
        self
    }

    /// At most `count` starts in any window of `period`.
    pub fn rate(mut self, count: u32, period: Duration) -> ActionConfig {
        self.rate = Some((count, i64::try_from(period.as_millis()).unwrap_or(i64::MAX)));
        self
    }

    /// Each limit counts per value of this input field: a field name (any
    /// text but `"`), or a `$` path (`$.a.b`, `$."a b"`, `$.list[0]`; checked
    /// when it is configured: [`Error::Invalid`] otherwise). A run whose input lacks
    /// the field counts in the partition `""`.
    pub fn partition_by(mut self, field: impl Into<String>) -> ActionConfig {
        self.partition_by = Some(field.into());
        self
    }

    fn validate(&self) -> Result<()> {
        names::check_name("action", &self.action)?;
        if self.max_running == Some(0) {
            return Err(Error::invalid("max_running", "at least 1"));
        }
        if let Some((n, p)) = self.rate
            && (n == 0 || p <= 0)
        {
            return Err(Error::invalid(
                "rate",
                "at least 1 start per period of at least 1 ms",
            ));
        }
        if let Some(f) = &self.partition_by {
            names::check_text("partition_by", f, names::MAX_NAME_BYTES)?;
            // A path SQLite refuses would fail every claim of the action:
            // refused here instead.
            names::check_json_path("partition_by", &json_path(f))?;
        }
        Ok(())
    }

    /// The JSON path of the partition field.
    fn path(&self) -> Option<String> {
        self.partition_by.as_deref().map(json_path)
    }
}

/// A field name (quoted, so any character but `"` is taken as it is), or a
/// `$` path as it is.
fn json_path(field: &str) -> String {
    if field.starts_with('$') {
        field.to_string()
    } else {
        format!("$.\"{field}\"")
    }
}

pub(crate) fn configure<C: Control + ?Sized>(conn: &C, c: &ActionConfig, now: i64) -> Result<()> {
    c.validate()?;
    Control::configure_action(
        conn,
        &ActionRow {
            action: c.action.clone(),
            priority: c.priority,
            max_running: c.max_running,
            rate_count: c.rate.map(|r| r.0),
            rate_period_ms: c.rate.map(|r| r.1),
            partition_by: c.partition_by.clone(),
        },
        now,
    )
}

pub(crate) fn configure_audited<C: Work + ?Sized>(
    conn: &C,
    c: &ActionConfig,
    now: i64,
    op: &str,
    why: &str,
) -> Result<()> {
    configure(conn, c, now)?;
    let detail = serde_json::to_string(c).unwrap_or_default();
    audit(
        conn,
        now,
        op,
        AuditAction::ConfigureAction,
        &c.action,
        why,
        &detail,
    )
}

pub(crate) fn configs<C: Control + ?Sized>(conn: &C) -> Result<Vec<ActionConfig>> {
    Ok(Control::action_rows(conn)?
        .into_iter()
        .map(ActionConfig::from)
        .collect())
}

impl From<ActionRow> for ActionConfig {
    fn from(a: ActionRow) -> ActionConfig {
        ActionConfig {
            action: a.action,
            priority: a.priority,
            max_running: a.max_running,
            rate: a.rate_count.zip(a.rate_period_ms),
            partition_by: a.partition_by,
        }
    }
}

/// Cancels a run (see the module's docs), recorded with who and why.
pub(crate) fn cancel<C: Work + ?Sized>(
    conn: &C,
    id: &str,
    now: i64,
    op: &str,
    why: &str,
) -> Result<String> {
    let was =
        RunsMore::cancel(conn, id, now, op, why)?.ok_or_else(|| Error::not_found("run", id))?;
    match was.as_str() {
        "waiting" | "ready" | "running" => {}
        other => {
            return Err(Error::Conflict {
                kind: "run",
                reason: format!(
                    "{id} is {other} already: only a run that has not ended is cancelled"
                ),
            });
        }
    }
    let detail = serde_json::json!({ "was": was }).to_string();
    audit(
        conn,
        now,
        op,
        AuditAction::Cancel,
        &format!("run {id}"),
        why,
        &detail,
    )?;
    Ok(was)
}

fn audit<C: Audit + ?Sized>(
    conn: &C,
    at: i64,
    op: &str,
    action: AuditAction,
    target: &str,
    why: &str,
    detail: &str,
) -> Result<()> {
    crate::operate::check_operator(op, why)?;
    Audit::record(
        conn,
        &Entry {
            at,
            operator: op,
            action,
            target,
            reason: why,
            detail,
        },
    )
}

/// Claims for executors whose actions are `actions`: up to `limit` runs,
/// skipping paused actions and respecting each action's limits, higher
/// priorities first whatever the action. At each priority that ready runs
/// have, each limited action takes up to its share of the batch (what its
/// limits allow, at most), the unlimited ones the rest in one statement,
/// and limited actions that took a full share whatever is still left. The
/// batch comes back by priority, then due time.
/// `plan` is what the claim read first ([`Control::claim_plan`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn claim<C: Runs + Control + ?Sized>(
    conn: &C,
    plan: ClaimPlan,
    holder: &str,
    now: i64,
    expires_at: i64,
    limit: usize,
    actions: &[String],
) -> Result<Vec<RunRow>> {
    let paused = plan.paused;
    let limited: BTreeMap<String, ActionConfig> = plan
        .limited
        .into_iter()
        .map(|a| (a.action.clone(), ActionConfig::from(a)))
        .collect();
    let free: Vec<String> = actions
        .iter()
        .filter(|a| !paused.contains(*a) && !limited.contains_key(*a))
        .cloned()
        .collect();
    let free = (!free.is_empty()).then_some(free);
    let mut limits = Vec::new();
    for (action, c) in &limited {
        if !paused.contains(action) {
            limits.push(Limited::load(conn, action, c, now)?);
        }
    }
    if free.is_none() && limits.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    for priority in plan.priorities {
        if rows.len() >= limit {
            break;
        }
        // Each limited action first takes up to its share of what is left
        // (so one with a backlog does not crowd the rest of this priority
        // out), then the unlimited ones in one statement, then the limited
        // ones that took a full share whatever is still left.
        let parts = limits.len() + usize::from(free.is_some());
        let share = (limit - rows.len()).div_ceil(parts.max(1));
        let mut hungry = Vec::new();
        for (i, l) in limits.iter_mut().enumerate() {
            let want = share.min(limit - rows.len());
            if want == 0 {
                break;
            }
            let got = l.claim(conn, holder, now, expires_at, priority, want)?;
            if got.len() == want {
                hungry.push(i);
            }
            rows.extend(got);
        }
        if let Some(names) = &free
            && rows.len() < limit
        {
            let want = i64::try_from(limit - rows.len()).unwrap_or(i64::MAX);
            rows.extend(Runs::claim_at(
                conn, holder, now, expires_at, want, names, priority,
            )?);
        }
        for i in hungry {
            if rows.len() >= limit {
                break;
            }
            let want = limit - rows.len();
            rows.extend(limits[i].claim(conn, holder, now, expires_at, priority, want)?);
        }
    }
    for l in &limits {
        l.record_starts(conn, now)?;
    }
    rows.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.due_at, r.ord));
    Ok(rows)
}

/// One limited action during a claim: what each partition may still start
/// (running slots and rate tokens, the smaller), counted from the file.
struct Limited<'a> {
    action: &'a str,
    config: &'a ActionConfig,
    path: Option<String>,
    running: HashMap<String, i64>,
    started: HashMap<String, i64>,
    /// Partition → what it may still start in this claim.
    room: HashMap<String, i64>,
    /// Partitions with no room left (a JSON array's items).
    full: Vec<String>,
    /// Partition → runs picked in this claim (the rate's starts).
    picked: BTreeMap<String, i64>,
}

impl<'a> Limited<'a> {
    /// A candidate page holds this many runs per run wanted (at least
    /// [`Limited::MIN_PAGE`]), and a claim reads at most
    /// [`Limited::MAX_PAGES`] pages of an action at one priority: each page
    /// after the first skips the partitions the last one filled, so a
    /// partition's backlog never hides another partition's runs for long.
    const PAGE_FACTOR: usize = 4;
    const MIN_PAGE: usize = 16;
    const MAX_PAGES: usize = 8;

    fn load<C: Control + ?Sized>(
        conn: &C,
        action: &'a str,
        config: &'a ActionConfig,
        now: i64,
    ) -> Result<Self> {
        let path = config.path();
        Control::lock_limits(conn, action)?;
        let running = Control::running_by(conn, action, path.as_deref())?
            .into_iter()
            .collect();
        let started = match config.rate {
            Some((_, period)) => Control::starts_since(conn, action, now.saturating_sub(period))?
                .into_iter()
                .collect(),
            None => HashMap::new(),
        };
        Ok(Limited {
            action,
            config,
            path,
            running,
            started,
            room: HashMap::new(),
            full: Vec::new(),
            picked: BTreeMap::new(),
        })
    }

    /// What `part` may start, before this claim's picks.
    fn allowance(&self, part: &str) -> i64 {
        let c = self.config;
        let slots = c.max_running.map_or(i64::MAX, |m| {
            i64::from(m) - self.running.get(part).copied().unwrap_or(0)
        });
        let tokens = c.rate.map_or(i64::MAX, |(n, _)| {
            i64::from(n) - self.started.get(part).copied().unwrap_or(0)
        });
        slots.min(tokens)
    }

    /// Claims up to `want` ready, due runs at `priority` that the limits
    /// allow, counted against them. Without a partition there is one: the
    /// claim takes exactly what it may start, in one statement; with one,
    /// candidates are picked partition by partition ([`Limited::pick`]).
    fn claim<C: Runs + Control + ?Sized>(
        &mut self,
        conn: &C,
        holder: &str,
        now: i64,
        expires_at: i64,
        priority: i64,
        want: usize,
    ) -> Result<Vec<RunRow>> {
        if self.path.is_none() {
            let allowance = self.allowance("");
            let left = self.room.entry(String::new()).or_insert(allowance);
            let n = usize::try_from((*left).max(0)).unwrap_or(0).min(want);
            if n == 0 {
                return Ok(Vec::new());
            }
            let names = [self.action.to_string()];
            let rows = Runs::claim_at(conn, holder, now, expires_at, n as i64, &names, priority)?;
            *left -= rows.len() as i64;
            *self.picked.entry(String::new()).or_default() += rows.len() as i64;
            return Ok(rows);
        }
        let path = self.path.clone().unwrap_or_default();
        let picked = self.pick(conn, now, priority, &path, want)?;
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        Control::claim_ords(conn, holder, now, expires_at, &picked)
    }

    /// Up to `want` ready, due runs at `priority` that the limits of a
    /// partitioned action allow (their positions), counted against them:
    /// pages of candidates, each leaving out the partitions already full.
    fn pick<C: Control + ?Sized>(
        &mut self,
        conn: &C,
        now: i64,
        priority: i64,
        path: &str,
        want: usize,
    ) -> Result<Vec<i64>> {
        let mut picked = Vec::new();
        let page = want.saturating_mul(Self::PAGE_FACTOR).max(Self::MIN_PAGE);
        let mut after = (i64::MIN, i64::MIN);
        for _ in 0..Self::MAX_PAGES {
            let found = Control::candidates(
                conn,
                self.action,
                now,
                priority,
                path,
                &self.full,
                after,
                page,
            )?;
            for (ord, due_at, part) in &found {
                after = (*due_at, *ord);
                if picked.len() >= want {
                    break;
                }
                let allowance = self.allowance(part);
                let left = self.room.entry(part.clone()).or_insert(allowance);
                if *left > 0 {
                    *left -= 1;
                    picked.push(*ord);
                    *self.picked.entry(part.clone()).or_default() += 1;
                }
                if *left <= 0 && !self.full.contains(part) {
                    self.full.push(part.clone());
                }
            }
            if picked.len() >= want || found.len() < page {
                break;
            }
        }
        Ok(picked)
    }

    /// Records this claim's starts for a rate-limited action: one row per
    /// partition and claim, so the window's cost grows with claims, not runs.
    fn record_starts<C: Control + ?Sized>(&self, conn: &C, now: i64) -> Result<()> {
        if self.config.rate.is_none() {
            return Ok(());
        }
        for (part, n) in &self.picked {
            Control::record_starts(conn, self.action, part, now, *n)?;
        }
        Ok(())
    }
}

/// Whether `actions` have work an executor could claim now: a ready, due
/// run of an action that is not paused (limits are the claim's to judge).
pub(crate) fn work_due<C: Control + ?Sized>(
    conn: &C,
    now: i64,
    actions: &[String],
) -> Result<bool> {
    let paused = paused_names(conn, "action")?;
    let open: Vec<&String> = actions.iter().filter(|a| !paused.contains(*a)).collect();
    if open.is_empty() {
        return Control::lapsed_due(conn, now);
    }
    Control::work_due(conn, now, &open)
}

impl<B: Store> Tx<'_, B> {
    /// Enqueues a run of an action ([`Enqueue`]) in this transaction: it
    /// exists if and only if the transaction commits. No handler need be
    /// registered here: the executors of any process that registered the
    /// action run it.
    ///
    /// # Errors
    /// [`Error::Invalid`] / [`Error::Encode`] for bad fields (nothing is
    /// enqueued).
    pub fn enqueue(&mut self, e: &Enqueue) -> Result<Enqueued> {
        let done = enqueue(self, e)?;
        if !done.deduplicated {
            self.mark_nudge();
        }
        Ok(done)
    }
}
