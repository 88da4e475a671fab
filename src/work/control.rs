//! Control of the work: pausing and resuming, cancelling, priorities, and
//! concurrency and rate limits per action — all kept in the file, so every
//! process on it obeys them. (Enqueueing directly, with unique runs, is
//! `work::queue::enqueue`; the claim that obeys the limits,
//! `work::queue::claim`.)
//!
//! - **Pause** ([`Pausable`]): an action (a channel's or a scheduled job's
//!   is its action), a rule's evaluation, a reaction. Nothing of an action
//!   is claimed while it is paused; a paused rule or reaction does not move
//!   its cursor. Resuming picks up where it stood.
//! - **Cancel**: a pending run ends `cancelled` at once; a running one is
//!   asked to stop (its handler sees [`crate::RunContext::is_cancelled`] at
//!   its next claim renewal, at once in the same process) and its
//!   completion is refused: it ends `cancelled`.
//! - **Priorities and limits** ([`ActionConfig`]): a default priority per
//!   action (higher is claimed first), at most N running at once across
//!   every process, at most R starts per period (a sliding window), each
//!   optionally per value of an input field.

use std::collections::HashSet;
use std::time::Duration;

use serde::Serialize;

use crate::base::audit::AuditAction;
use crate::base::error::{Error, Result};
use crate::base::limits;
use crate::store::audit::Entry;
use crate::store::control::ActionRow;
use crate::store::{Audit, Control, Runs, Steps, Work};

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
            Pausable::Channel(c) => ("action", limits::channel_action(c)),
            Pausable::Job(j) => ("action", limits::job_action(j)),
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
    limits::check_name("name", what.name())?;
    crate::work::operate::check_operator(op, why)?;
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
    /// path): the run's key, unless its enqueue named one.
    pub partition_by: Option<String>,
    /// Claims serve its keys in turn, by weight ([`ActionConfig::fair`]).
    pub fair: bool,
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
            fair: false,
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
        self.rate = Some((count, period_ms(period)));
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

    /// Claims serve the action's keys in turn: among its ready runs of one
    /// priority, the key that has been served least (for its weight: see
    /// [`KeyLimits::weight`]) goes next, across every process, so a key with
    /// a backlog of thousands does not hold back a key that has a few. A
    /// key that had nothing ready comes back level with the others, not
    /// ahead. A run's key is the one its enqueue named ([`Enqueue::key`]),
    /// else its input's [`ActionConfig::partition_by`] field, else `""`; the
    /// limits count per key.
    ///
    /// [`Enqueue::key`]: crate::Enqueue::key
    pub fn fair(mut self) -> ActionConfig {
        self.fair = true;
        self
    }

    /// Whether its runs have keys: it is fair or partitioned.
    pub fn keyed(&self) -> bool {
        self.fair || self.partition_by.is_some()
    }

    fn validate(&self) -> Result<()> {
        limits::check_name("action", &self.action)?;
        check_limits(self.max_running, self.rate)?;
        if let Some(f) = &self.partition_by {
            limits::check_text("partition_by", f, limits::MAX_NAME_BYTES)?;
            // A path SQLite refuses would fail every claim of the action:
            // refused here instead.
            limits::check_json_path("partition_by", &json_path(f))?;
        }
        Ok(())
    }

    /// The JSON path of the partition field.
    pub(crate) fn path(&self) -> Option<String> {
        self.partition_by.as_deref().map(json_path)
    }
}

/// A rate's period in ms, as stored.
fn period_ms(period: Duration) -> i64 {
    i64::try_from(period.as_millis()).unwrap_or(i64::MAX)
}

/// The checks an action's limits and a key's overrides share: at least one
/// running, at least one start per period of at least 1 ms.
fn check_limits(max_running: Option<u32>, rate: Option<(u32, i64)>) -> Result<()> {
    if max_running == Some(0) {
        return Err(Error::invalid("max_running", "at least 1"));
    }
    if let Some((n, p)) = rate
        && (n == 0 || p <= 0)
    {
        return Err(Error::invalid(
            "rate",
            "at least 1 start per period of at least 1 ms",
        ));
    }
    Ok(())
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

/// Sets an action's settings. An action that becomes keyed gives its
/// unfinished runs their keys (from their input) in the same transaction,
/// so every run a fair claim or a key's limit must see has one.
pub(crate) fn configure<C: Control + ?Sized>(conn: &C, c: &ActionConfig, now: i64) -> Result<()> {
    c.validate()?;
    let was_keyed = Control::action_row(conn, &c.action)?.is_some_and(|a| a.keyed());
    let path = c.path();
    Control::configure_action(
        conn,
        &ActionRow {
            action: c.action.clone(),
            priority: c.priority,
            max_running: c.max_running,
            rate_count: c.rate.map(|r| r.0),
            rate_period_ms: c.rate.map(|r| r.1),
            partition_by: c.partition_by.clone(),
            fair: c.fair,
        },
        path.as_deref(),
        now,
    )?;
    if c.keyed() && !was_keyed {
        Control::key_runs(conn, &c.action, path.as_deref())?;
    }
    Ok(())
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
            fair: a.fair,
        }
    }
}

/// What one key of a keyed action has of its own: limits that replace the
/// action's for this key, and its weight in a fair claim. Kept in the file
/// (`reflexr_action_keys`), so every process obeys them from its next
/// claim; a key without overrides has the action's limits and weight 1.
///
/// ```
/// # use reflexr::KeyLimits;
/// # use std::time::Duration;
/// let acme = KeyLimits::new("acme")
///     .max_running(20)                        // acme may run 20 at once
///     .rate(1_000, Duration::from_secs(60))   // and start 1,000 a minute
///     .weight(5);                             // served 5 runs to another key's 1
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyLimits {
    /// The key.
    pub key: String,
    /// At most this many of the key's runs at once, across every process
    /// (`None`: the action's `max_running`).
    pub max_running: Option<u32>,
    /// At most `.0` starts of the key in any window of `.1` ms (`None`:
    /// the action's rate).
    pub rate: Option<(u32, i64)>,
    /// Its share in a fair claim, against the other keys' (`None`: 1).
    pub weight: Option<u32>,
}

impl KeyLimits {
    /// No overrides yet: the action's limits, weight 1.
    pub fn new(key: impl Into<String>) -> KeyLimits {
        KeyLimits {
            key: key.into(),
            max_running: None,
            rate: None,
            weight: None,
        }
    }

    /// At most `n` of the key's runs at once, across every process.
    pub fn max_running(mut self, n: u32) -> KeyLimits {
        self.max_running = Some(n);
        self
    }

    /// At most `count` starts of the key in any window of `period`.
    pub fn rate(mut self, count: u32, period: Duration) -> KeyLimits {
        self.rate = Some((count, period_ms(period)));
        self
    }

    /// Its weight in a fair claim: served `w` runs to a weight-1 key's one
    /// while both have runs ready.
    pub fn weight(mut self, w: u32) -> KeyLimits {
        self.weight = Some(w);
        self
    }

    fn validate(&self) -> Result<()> {
        limits::check_text("key", &self.key, limits::MAX_SUBJECT_BYTES)?;
        check_limits(self.max_running, self.rate)?;
        if self.weight == Some(0) {
            return Err(Error::invalid("weight", "at least 1"));
        }
        Ok(())
    }
}

impl From<crate::store::control::KeyRow> for KeyLimits {
    fn from(k: crate::store::control::KeyRow) -> KeyLimits {
        KeyLimits {
            key: k.key,
            max_running: k.max_running,
            rate: k.rate_count.zip(k.rate_period_ms),
            weight: k.weight,
        }
    }
}

/// One key of a keyed action as operators see it: its runs by state, and
/// the limits that hold for it (its overrides, else the action's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyInfo {
    /// The key.
    pub key: String,
    /// Its runs waiting behind their scope or for a workflow's step.
    pub waiting: i64,
    /// Its runs ready (due now or later).
    pub ready: i64,
    /// Its runs running.
    pub running: i64,
    /// At most this many at once (its override, else the action's).
    pub max_running: Option<u32>,
    /// At most `.0` starts per `.1` ms (its override, else the action's).
    pub rate: Option<(u32, i64)>,
    /// Its weight in a fair claim.
    pub weight: u32,
    /// Whether it has overrides of its own.
    pub overridden: bool,
}

/// Sets one key's overrides, audited.
pub(crate) fn set_key_limits<C: Work + ?Sized>(
    conn: &C,
    action: &str,
    k: &KeyLimits,
    now: i64,
    op: &str,
    why: &str,
) -> Result<()> {
    limits::check_name("action", action)?;
    k.validate()?;
    crate::work::operate::check_operator(op, why)?;
    if !Control::action_row(conn, action)?.is_some_and(|a| a.keyed()) {
        return Err(Error::invalid(
            "action",
            format!(
                "{action} has no keys: configure it fair or with partition_by first \
                 (ActionConfig::fair, ActionConfig::partition_by)"
            ),
        ));
    }
    Control::set_key_row(
        conn,
        &crate::store::control::KeyRow {
            action: action.to_string(),
            key: k.key.clone(),
            max_running: k.max_running,
            rate_count: k.rate.map(|r| r.0),
            rate_period_ms: k.rate.map(|r| r.1),
            weight: k.weight,
            updated_at: now,
        },
    )?;
    let detail = serde_json::to_string(k).unwrap_or_default();
    audit(
        conn,
        now,
        op,
        AuditAction::SetKeyLimits,
        &format!("{action} key {}", k.key),
        why,
        &detail,
    )
}

/// Deletes one key's overrides, audited: the key has the action's limits
/// and weight 1 again.
pub(crate) fn clear_key_limits<C: Work + ?Sized>(
    conn: &C,
    action: &str,
    key: &str,
    now: i64,
    op: &str,
    why: &str,
) -> Result<()> {
    limits::check_name("action", action)?;
    crate::work::operate::check_operator(op, why)?;
    if !Control::delete_key_row(conn, action, key)? {
        return Err(Error::not_found(
            "key limits",
            format!("{action} key {key}"),
        ));
    }
    audit(
        conn,
        now,
        op,
        AuditAction::ClearKeyLimits,
        &format!("{action} key {key}"),
        why,
        "{}",
    )
}

/// The overrides of one action's keys (every action's with `None`): `(action, limits)`.
pub(crate) fn key_limits<C: Control + ?Sized>(
    conn: &C,
    action: Option<&str>,
) -> Result<Vec<(String, KeyLimits)>> {
    if let Some(a) = action {
        limits::check_name("action", a)?;
    }
    Ok(Control::key_rows(conn, action)?
        .into_iter()
        .map(|k| (k.action.clone(), KeyLimits::from(k)))
        .collect())
}

/// The keys of an action with unfinished runs or overrides, by key: what
/// each has waiting, ready and running, and the limits that hold for it.
pub(crate) fn keys<C: Control + ?Sized>(conn: &C, action: &str) -> Result<Vec<KeyInfo>> {
    limits::check_name("action", action)?;
    let config = Control::action_row(conn, action)?.map(ActionConfig::from);
    let overrides: std::collections::BTreeMap<String, KeyLimits> = key_limits(conn, Some(action))?
        .into_iter()
        .map(|(_, k)| (k.key.clone(), k))
        .collect();
    let mut keys: std::collections::BTreeMap<String, KeyInfo> = std::collections::BTreeMap::new();
    let info = |key: &str| {
        let o = overrides.get(key);
        KeyInfo {
            key: key.to_string(),
            waiting: 0,
            ready: 0,
            running: 0,
            max_running: o
                .and_then(|o| o.max_running)
                .or(config.as_ref().and_then(|c| c.max_running)),
            rate: o
                .and_then(|o| o.rate)
                .or(config.as_ref().and_then(|c| c.rate)),
            weight: o.and_then(|o| o.weight).unwrap_or(1),
            overridden: o.is_some(),
        }
    };
    for key in overrides.keys() {
        keys.insert(key.clone(), info(key));
    }
    for (key, state, n) in Control::key_counts(conn, action)? {
        let k = keys.entry(key.clone()).or_insert_with(|| info(&key));
        match state.as_str() {
            "waiting" => k.waiting += n,
            "ready" => k.ready += n,
            "running" => k.running += n,
            _ => {}
        }
    }
    Ok(keys.into_values().collect())
}

/// Cancels a run (see the module's docs), recorded with who and why, and
/// with it the workflow's children that have not ended (and theirs):
/// what it was, and the children cancelled.
pub(crate) fn cancel<C: Work + ?Sized>(
    conn: &C,
    id: &str,
    now: i64,
    op: &str,
    why: &str,
) -> Result<(String, Vec<String>)> {
    // The descendants' rows first, deepest first, as a child's end takes
    // them (its own, then its parent's): a cancel and a settlement never
    // wait for each other in a circle.
    let mut descendants = Vec::new();
    let mut parents = vec![id.to_string()];
    while let Some(parent) = parents.pop() {
        for child in Runs::children(conn, &parent)? {
            parents.push(child.clone());
            descendants.push(child);
        }
    }
    let deepest_first: Vec<String> = descendants.iter().rev().cloned().collect();
    Runs::lock_runs(conn, &deepest_first)?;
    let was = cancel_one(conn, id, now, op, why)?.ok_or_else(|| Error::not_found("run", id))?;
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
    // The children, and theirs, that have not ended: cancelled with it.
    let mut children = Vec::new();
    for child in descendants {
        if let Some(state) = cancel_one(conn, &child, now, op, why)?
            && matches!(state.as_str(), "waiting" | "ready" | "running")
        {
            children.push(child);
        }
    }
    let detail = if children.is_empty() {
        serde_json::json!({ "was": was })
    } else {
        serde_json::json!({ "was": was, "children": children })
    }
    .to_string();
    audit(
        conn,
        now,
        op,
        AuditAction::Cancel,
        &format!("run {id}"),
        why,
        &detail,
    )?;
    Ok((was, children))
}

/// Cancels one run: what it was (none: no such run). One that ended at
/// once (it was pending) forgets what it waited for, and its parent, if
/// it waits for it, is due.
fn cancel_one<C: Work + ?Sized>(
    conn: &C,
    id: &str,
    now: i64,
    op: &str,
    why: &str,
) -> Result<Option<String>> {
    let was = Runs::cancel(conn, id, now, op, why)?;
    if matches!(was.as_deref(), Some("waiting" | "ready")) {
        Steps::delete_waits_of(conn, id)?;
        let parent = Runs::get(conn, id)?.and_then(|r| r.parent);
        crate::work::queue::waits::child_ended_on(conn, id, parent.as_deref(), now)?;
    }
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
    crate::work::operate::check_operator(op, why)?;
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
