//! What operators do to rules, runs and dead letters. Every intervention is
//! checked (a typed error for what cannot be done) and recorded in
//! `reflexr_audit`, in the same transaction as the change it makes.

use crate::base::audit::AuditAction;
use crate::base::dead_letter::{DeadLetter, Resolution};
use crate::base::error::{Error, Result};
use crate::base::limits::{self, MAX_ID_BYTES};
use crate::base::step::StepKind;
use crate::core::cursor::ConsumerKind;
use crate::store::audit;
use crate::store::{
    Audit, Cursors, DeadLetters, Events, Followers, Lanes, Rules, Runs, Steps, Work, Workspaces,
};
use crate::work::queue::run::{RunInfo, RunState};
use crate::work::rule::{OnNewVersion, Rule, Start};

use crate::store::runs;

/// Who did it and why, for the audit record.
pub(crate) fn check_operator(operator: &str, reason: &str) -> Result<()> {
    limits::check_text("operator", operator, MAX_ID_BYTES)?;
    limits::check_text("reason", reason, 4096)
}

fn record<C: Audit + ?Sized>(
    conn: &C,
    now: i64,
    operator: &str,
    action: AuditAction,
    target: &str,
    reason: &str,
    detail: serde_json::Value,
) -> Result<()> {
    Audit::record(
        conn,
        &audit::Entry {
            at: now,
            operator,
            action,
            target,
            reason,
            detail: &detail.to_string(),
        },
    )
}

/// A rule as the file knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RuleInfo {
    /// The rule's name.
    pub name: String,
    /// The workspace it reads.
    pub workspace: String,
    /// Its version.
    pub version: i64,
    /// Its settings as registered, JSON (serialised as the JSON it holds).
    #[serde(serialize_with = "crate::base::text::raw_json")]
    pub definition: String,
    /// Its cursor.
    pub cursor: i64,
    /// Events of its workspace after the cursor.
    pub lag: i64,
    /// Registered by this process (false: only in the file, e.g. a rule the
    /// code no longer has).
    pub registered_here: bool,
    /// When the file first saw it.
    pub registered_at: i64,
    /// When it was last registered.
    pub updated_at: i64,
    /// For a version in shadow ([`crate::Rule::shadow`], a row named
    /// `<rule>@v<version>`): the live rule it is to take over from. `None`
    /// for a live rule.
    pub shadow_of: Option<String>,
    /// A shadow's handover position, once an operator promoted it
    /// ([`crate::Operator::promote_rule`]): the live version decides up to
    /// it, the shadow after it.
    pub promote_at: Option<i64>,
    /// What a shadow would have fired so far (it fires nothing).
    pub shadow_fired: i64,
    /// The decisions a shadow failed so far (recorded nowhere else).
    pub shadow_errored: i64,
}

/// What to reset of a rule ([`crate::Operator::reset_rule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuleReset {
    /// Move the cursor to this seq (0: replay the whole log) and keep the state.
    Cursor(i64),
    /// Forget every scope's state and keep the cursor.
    State,
    /// Both: forget the state and decide again from this seq.
    Replay(i64),
}

// ----- rules -----------------------------------------------------------------

/// Records a rule being registered: a new rule gets its row and its start
/// position; a known rule at a higher version gets what `on_new_version`
/// says.
pub(crate) fn register_rule<C: Work + ?Sized>(conn: &C, now: i64, rule: &Rule) -> Result<()> {
    if !Workspaces::exists(conn, &rule.workspace)? {
        return Err(Error::not_found("workspace", &rule.workspace));
    }
    let kind = ConsumerKind::Rule.as_str();
    let version = i64::from(rule.version);
    let start_at = |conn: &C| -> Result<i64> {
        Ok(match rule.start {
            Start::Beginning => 0,
            Start::Head => Events::head(conn)?,
        })
    };
    match Rules::rule(conn, &rule.name)? {
        None => {
            let at = start_at(conn)?;
            Cursors::set(conn, &rule.workspace, kind, &rule.name, at, now)?;
        }
        Some(stored) if stored.workspace != rule.workspace => {
            return Err(Error::invalid(
                "rule",
                format!(
                    "{} reads workspace {} in this file; a rule cannot move to {} \
                     (register it under another name, or delete it first)",
                    rule.name, stored.workspace, rule.workspace
                ),
            ));
        }
        Some(stored) if stored.version < version => {
            let target = format!("rule {}", rule.name);
            let detail =
                serde_json::json!({ "from_version": stored.version, "to_version": version });
            match rule.on_new_version {
                OnNewVersion::Continue => {}
                OnNewVersion::ResetState => {
                    Rules::clear_states(conn, &rule.name)?;
                    Cursors::touch(conn, &rule.workspace, kind, &rule.name, now)?;
                    record(
                        conn,
                        now,
                        "reflexr",
                        AuditAction::RuleVersionResetState,
                        &target,
                        "new version",
                        detail,
                    )?;
                }
                OnNewVersion::Replay => {
                    Rules::clear_states(conn, &rule.name)?;
                    let at = start_at(conn)?;
                    Cursors::set(conn, &rule.workspace, kind, &rule.name, at, now)?;
                    record(
                        conn,
                        now,
                        "reflexr",
                        AuditAction::RuleVersionReplay,
                        &target,
                        "new version",
                        detail,
                    )?;
                }
            }
        }
        Some(stored) if stored.version > version => {
            log::warn!(
                "rule {} is at version {} in the file; this code registers version {} \
                 and continues from the stored cursor and state",
                rule.name,
                stored.version,
                version
            );
        }
        Some(_) => {}
    }
    let stored_version = Rules::rule(conn, &rule.name)?.map_or(version, |r| r.version.max(version));
    Rules::upsert_rule(
        conn,
        &rule.name,
        &rule.workspace,
        stored_version,
        &rule.definition(),
        now,
    )
}

/// Records a rule version registered in shadow (`shadow` is the engine's
/// copy, `Rule::as_shadow`): a new shadow gets its row and its cursor at
/// its start; a known one keeps them. A shadow whose version the live rule
/// reached already (it was promoted) records nothing.
pub(crate) fn register_shadow<C: Work + ?Sized>(conn: &C, now: i64, shadow: &Rule) -> Result<()> {
    let live_name = shadow.firing_name();
    let Some(live) = Rules::rule(conn, live_name)? else {
        return Err(Error::invalid(
            "rule",
            format!("{live_name}: a version in shadow needs its live rule registered first"),
        ));
    };
    if live.workspace != shadow.workspace {
        return Err(Error::invalid(
            "rule",
            format!(
                "{live_name} reads workspace {}; its shadow cannot read {}",
                live.workspace, shadow.workspace
            ),
        ));
    }
    let version = i64::from(shadow.version);
    if live.version == version {
        // Promoted already: the live rule is this version now.
        return Ok(());
    }
    if live.version > version {
        return Err(Error::invalid(
            "rule",
            format!(
                "{live_name}: version {version} in shadow, but the live rule is at version {} \
                 already",
                live.version
            ),
        ));
    }
    if let Some(other) = Rules::rule_rows(conn)?
        .into_iter()
        .find(|r| r.shadow_of.as_deref() == Some(live_name) && r.name != shadow.name)
    {
        return Err(Error::Conflict {
            kind: "rule",
            reason: format!(
                "{live_name} has version {} in shadow already ({}); promote it or delete it \
                 first",
                other.version, other.name
            ),
        });
    }
    let kind = ConsumerKind::Rule.as_str();
    if Rules::rule(conn, &shadow.name)?.is_none() {
        let from = shadow.shadow.unwrap_or(0);
        let head = Events::head(conn)?;
        if from > head {
            return Err(Error::invalid(
                "shadow",
                format!("{from} is not a seq of this file (0 to {head})"),
            ));
        }
        Cursors::set(conn, &shadow.workspace, kind, &shadow.name, from, now)?;
    }
    Rules::upsert_shadow(
        conn,
        &shadow.name,
        &shadow.workspace,
        version,
        &shadow.definition(),
        live_name,
        now,
    )
}

/// The version in shadow of the live rule `live`, if it has one.
pub(crate) fn shadow_of<C: Work + ?Sized>(
    conn: &C,
    live: &str,
) -> Result<Option<crate::store::rules::RuleRow>> {
    Ok(Rules::rule_rows(conn)?
        .into_iter()
        .find(|r| r.shadow_of.as_deref() == Some(live)))
}

/// An operator's promote of `name`'s version in shadow: sets the handover
/// position, the further of the two versions' cursors, and returns it. The
/// evaluator hands over once both versions decided up to it
/// ([`complete_promotions`]).
pub(crate) fn promote_rule<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    name: &str,
    operator: &str,
    reason: &str,
) -> Result<i64> {
    check_operator(operator, reason)?;
    let live = Rules::rule(conn, name)?.ok_or_else(|| Error::not_found("rule", name))?;
    if let Some(of) = &live.shadow_of {
        return Err(Error::invalid(
            "rule",
            format!("{name} is a version in shadow; promote the live rule, {of}"),
        ));
    }
    let Some(shadow) = shadow_of(conn, name)? else {
        return Err(Error::Conflict {
            kind: "rule",
            reason: format!("{name} has no version in shadow to promote"),
        });
    };
    if let Some(at) = shadow.promote_at {
        return Err(Error::Conflict {
            kind: "rule",
            reason: format!(
                "{name}'s version {} is being promoted already, at seq {at}",
                shadow.version
            ),
        });
    }
    let kind = ConsumerKind::Rule.as_str();
    let live_at = Cursors::get(conn, &live.workspace, kind, name)?.unwrap_or(0);
    let shadow_at = Cursors::get(conn, &live.workspace, kind, &shadow.name)?.unwrap_or(0);
    let at = live_at.max(shadow_at);
    Rules::set_promote_at(conn, &shadow.name, at, now)?;
    // A batch either version decided past the position before this commit
    // must not commit: new stamps make the evaluator read again, capped.
    Cursors::touch(conn, &live.workspace, kind, name, now)?;
    Cursors::touch(conn, &live.workspace, kind, &shadow.name, now)?;
    record(
        conn,
        now,
        operator,
        AuditAction::PromoteRule,
        &format!("rule {name}"),
        reason,
        serde_json::json!({
            "from_version": live.version,
            "to_version": shadow.version,
            "at": at,
            "live_cursor": live_at,
            "shadow_cursor": shadow_at,
        }),
    )?;
    Ok(at)
}

/// Whether the consumer at `position` has decided every event of
/// `workspace` up to `at`.
fn decided_to<C: Work + ?Sized>(conn: &C, workspace: &str, position: i64, at: i64) -> Result<bool> {
    Ok(Events::page(conn, workspace, position, &[], 1)?
        .first()
        .is_none_or(|e| e.seq > at))
}

/// The handovers of `workspace` whose two versions both decided up to the
/// position: the shadow's state and cursor become the live rule's, at its
/// version, and the shadow's rows go. In the evaluator's transaction,
/// under its lease. Returns how many handed over.
pub(crate) fn complete_promotions<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    workspace: &str,
) -> Result<usize> {
    let kind = ConsumerKind::Rule.as_str();
    let mut done = 0;
    for shadow in Rules::rule_rows(conn)? {
        let (Some(live), Some(at)) = (shadow.shadow_of.as_deref(), shadow.promote_at) else {
            continue;
        };
        if shadow.workspace != workspace {
            continue;
        }
        let Some(live_row) = Rules::rule(conn, live)? else {
            continue;
        };
        let live_at = Cursors::get(conn, workspace, kind, live)?.unwrap_or(0);
        let shadow_at = Cursors::get(conn, workspace, kind, &shadow.name)?.unwrap_or(0);
        if !decided_to(conn, workspace, live_at, at)?
            || !decided_to(conn, workspace, shadow_at, at)?
        {
            continue;
        }
        Rules::clear_states(conn, live)?;
        let states = Rules::move_states(conn, &shadow.name, live)?;
        Rules::upsert_rule(
            conn,
            live,
            workspace,
            shadow.version,
            &shadow.definition,
            now,
        )?;
        // At the handover position exactly, with a new stamp: a batch the
        // old version decided past it cannot commit.
        Cursors::set(conn, workspace, kind, live, at.max(live_at), now)?;
        Cursors::delete(conn, workspace, kind, &shadow.name)?;
        Rules::delete_rule(conn, &shadow.name)?;
        record(
            conn,
            now,
            "reflexr",
            AuditAction::RulePromoted,
            &format!("rule {live}"),
            "handover",
            serde_json::json!({
                "from_version": live_row.version,
                "to_version": shadow.version,
                "at": at,
                "states": states,
                "fired_in_shadow": shadow.shadow_fired,
            }),
        )?;
        done += 1;
    }
    Ok(done)
}

pub(crate) fn rule_infos<C: Work + ?Sized>(
    conn: &C,
    registered: &[String],
) -> Result<Vec<RuleInfo>> {
    let kind = ConsumerKind::Rule.as_str();
    Rules::rule_rows(conn)?
        .into_iter()
        .map(|r| {
            let cursor = Cursors::get(conn, &r.workspace, kind, &r.name)?.unwrap_or(0);
            let lag = Events::count_after(conn, &r.workspace, cursor)?;
            Ok(RuleInfo {
                registered_here: registered.contains(&r.name),
                name: r.name,
                workspace: r.workspace,
                version: r.version,
                definition: r.definition,
                cursor,
                lag,
                registered_at: r.registered_at,
                updated_at: r.updated_at,
                shadow_of: r.shadow_of,
                promote_at: r.promote_at,
                shadow_fired: r.shadow_fired,
                shadow_errored: r.shadow_errored,
            })
        })
        .collect()
}

pub(crate) fn reset_rule<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    name: &str,
    what: RuleReset,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    let rule = Rules::rule(conn, name)?.ok_or_else(|| Error::not_found("rule", name))?;
    let kind = ConsumerKind::Rule.as_str();
    let from = Cursors::get(conn, &rule.workspace, kind, name)?;
    let (cursor, state) = match what {
        RuleReset::Cursor(at) => (Some(at), false),
        RuleReset::State => (None, true),
        RuleReset::Replay(at) => (Some(at), true),
    };
    if let Some(at) = cursor {
        let head = Events::head(conn)?;
        if !(0..=head).contains(&at) {
            return Err(Error::invalid(
                "position",
                format!("{at} is not a seq of this file (0 to {head})"),
            ));
        }
        Cursors::set(conn, &rule.workspace, kind, name, at, now)?;
    }
    let cleared = if state {
        // A batch decided on the old state must not commit over the reset.
        Cursors::touch(conn, &rule.workspace, kind, name, now)?;
        Rules::clear_states(conn, name)?
    } else {
        0
    };
    record(
        conn,
        now,
        operator,
        AuditAction::ResetRule,
        &format!("rule {name}"),
        reason,
        serde_json::json!({ "cursor_from": from, "cursor_to": cursor, "states_cleared": cleared }),
    )
}

pub(crate) fn delete_rule<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    name: &str,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    let rule = Rules::rule(conn, name)?.ok_or_else(|| Error::not_found("rule", name))?;
    let cleared = Rules::clear_states(conn, name)?;
    Cursors::delete(conn, &rule.workspace, ConsumerKind::Rule.as_str(), name)?;
    Rules::delete_rule(conn, name)?;
    record(
        conn,
        now,
        operator,
        AuditAction::DeleteRule,
        &format!("rule {name}"),
        reason,
        serde_json::json!({ "states_cleared": cleared, "definition": rule.definition }),
    )
}

// ----- runs ------------------------------------------------------------------

fn dead_run<C: Runs + ?Sized>(conn: &C, id: &str) -> Result<runs::RunRow> {
    let row = Runs::get(conn, id)?.ok_or_else(|| Error::not_found("run", id))?;
    if row.state != "dead" {
        return Err(Error::Conflict {
            kind: "run",
            reason: format!(
                "{id} is {}, not dead; only a dead run is retried or discarded",
                row.state
            ),
        });
    }
    Ok(row)
}

pub(crate) fn retry_run<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    id: &str,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    let row = dead_run(conn, id)?;
    Runs::revive(conn, id, row.lane.as_deref(), now)?;
    if let Some(d) = DeadLetters::open_for_run(conn, id)? {
        DeadLetters::resolve(conn, d.id, Resolution::Retried, now)?;
    }
    record(
        conn,
        now,
        operator,
        AuditAction::RetryRun,
        &format!("run {id}"),
        reason,
        serde_json::json!({ "attempts": row.attempt, "last_error": row.last_error }),
    )
}

/// An operator's reset of a workflow run to one of its steps, audited: that step and every
/// step after it are forgotten, and the run is ready now with fresh
/// attempts, to run them again. Refused for a running run (cancel it, or
/// wait for it to end or suspend), for a run of an ordered scope (its
/// scope moved on) and for the step where the run began.
pub(crate) fn reset_run_to_step<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    id: &str,
    step: &str,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    // Its row first, so no claim takes it between the look and the reset
    // (PostgreSQL; one writer on SQLite).
    Runs::lock_runs(conn, &[id.to_string()])?;
    let row = Runs::get(conn, id)?.ok_or_else(|| Error::not_found("run", id))?;
    let conflict = |reason: String| Error::Conflict {
        kind: "run",
        reason,
    };
    match row.state.as_str() {
        "running" => {
            return Err(conflict(format!(
                "{id} is running: cancel it, or reset it once it ended or suspended"
            )));
        }
        "waiting" => return Err(conflict(format!("{id} waits behind its scope's head"))),
        _ => {}
    }
    if row.lane.is_some() {
        return Err(conflict(format!(
            "{id} runs in an ordered scope, which moved on: it cannot run again"
        )));
    }
    let steps = Steps::steps(conn, id)?;
    let target = steps
        .iter()
        .find(|s| s.name == step && s.kind != StepKind::Begin.as_str())
        .ok_or_else(|| Error::not_found("step", format!("{step} of run {id}")))?;
    let forgotten = Steps::forget_steps(conn, id, target.position)?;
    if !Runs::reopen(conn, id, now)? {
        return Err(conflict(format!("{id} changed under the reset: try again")));
    }
    if row.state == "dead"
        && let Some(d) = DeadLetters::open_for_run(conn, id)?
    {
        DeadLetters::resolve(conn, d.id, Resolution::Retried, now)?;
    }
    record(
        conn,
        now,
        operator,
        AuditAction::ResetRunToStep,
        &format!("run {id}"),
        reason,
        serde_json::json!({ "step": step, "was": row.state, "forgotten": forgotten }),
    )
}

pub(crate) fn discard_run<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    id: &str,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    let row = dead_run(conn, id)?;
    Runs::discard(conn, id, now)?;
    if let Some(lane) = &row.lane {
        Lanes::advance_lane(conn, lane, id, now)?;
    }
    if let Some(d) = DeadLetters::open_for_run(conn, id)? {
        DeadLetters::resolve(conn, d.id, Resolution::Discarded, now)?;
    }
    record(
        conn,
        now,
        operator,
        AuditAction::DiscardRun,
        &format!("run {id}"),
        reason,
        serde_json::json!({ "attempts": row.attempt, "last_error": row.last_error }),
    )
}

/// Lets a blocked scope go on past its dead run (which stays dead, to be
/// retried or discarded on its own).
pub(crate) fn unblock<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    rule: &str,
    scope: &str,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    let lane = format!("{rule} {scope}");
    let (head, blocked) = Lanes::lane_head(conn, &lane)?
        .filter(|(_, blocked)| *blocked)
        .ok_or_else(|| Error::not_found("blocked scope", &lane))?;
    debug_assert!(blocked);
    Lanes::set_blocked(conn, &lane, false, now)?;
    Lanes::advance_lane(conn, &lane, &head, now)?;
    record(
        conn,
        now,
        operator,
        AuditAction::Unblock,
        &format!("scope {scope} of rule {rule}"),
        reason,
        serde_json::json!({ "dead_run": head }),
    )
}

pub(crate) fn run_info<C: Runs + ?Sized>(conn: &C, id: &str) -> Result<Option<RunInfo>> {
    Runs::get(conn, id)?.map(RunInfo::from_row).transpose()
}

pub(crate) fn list_runs<C: Runs + ?Sized>(
    conn: &C,
    state: Option<RunState>,
    limit: usize,
) -> Result<Vec<RunInfo>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    Runs::list(conn, state.map(RunState::as_str), limit)?
        .into_iter()
        .map(RunInfo::from_row)
        .collect()
}

// ----- dead letters ----------------------------------------------------------

/// The dead letter `id`, still open (an operator resolves it once).
fn open_dead_letter<C: DeadLetters + ?Sized>(conn: &C, id: i64) -> Result<DeadLetter> {
    let d = DeadLetters::get(conn, id)?
        .ok_or_else(|| Error::not_found("dead letter", id.to_string()))?;
    if d.resolved_at.is_some() {
        return Err(Error::Conflict {
            kind: "dead letter",
            reason: format!("{id} is resolved already"),
        });
    }
    Ok(d)
}

pub(crate) fn retry_dead_letter<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    id: i64,
    operator: &str,
    reason: &str,
) -> Result<()> {
    let d = open_dead_letter(conn, id)?;
    match (d.kind.as_str(), &d.run_id) {
        ("run", Some(run)) => retry_run(conn, now, run, operator, reason),
        (kind, _) => {
            let replay = if kind == "rule" {
                "an evaluation is replayed by resetting the rule's cursor (reset_rule)"
            } else {
                "its events are replayed by resetting the consumer's cursor (reset_cursor)"
            };
            Err(Error::invalid(
                "dead letter",
                format!(
                    "{id} is a {kind} dead letter: {replay}, not retried alone; \
                     discard it once handled"
                ),
            ))
        }
    }
}

pub(crate) fn discard_dead_letter<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    id: i64,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    let d = open_dead_letter(conn, id)?;
    if let ("run", Some(run)) = (d.kind.as_str(), &d.run_id) {
        return discard_run(conn, now, run, operator, reason);
    }
    DeadLetters::resolve(conn, id, Resolution::Discarded, now)?;
    record(
        conn,
        now,
        operator,
        AuditAction::DiscardDeadLetter,
        &format!("dead letter {id}"),
        reason,
        serde_json::json!({ "kind": d.kind, "consumer": d.consumer, "event_seq": d.event_seq }),
    )
}

pub(crate) fn unfollow<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    name: &str,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    let row = Followers::follower(conn, name)?.ok_or_else(|| Error::not_found("follower", name))?;
    let cursor = Cursors::get(conn, &row.source, ConsumerKind::Follower.as_str(), name)?;
    Cursors::delete(conn, &row.source, ConsumerKind::Follower.as_str(), name)?;
    Followers::delete_follower(conn, name)?;
    record(
        conn,
        now,
        operator,
        AuditAction::Unfollow,
        &format!("follower {name}"),
        reason,
        serde_json::json!({ "source": row.source, "target": row.target, "cursor": cursor }),
    )
}

/// Records an operator's request that a stopped follower start again at its
/// cursor; the process running it picks it up (see
/// [`crate::Operator::restart_follower`]).
pub(crate) fn restart_follower<C: Work + ?Sized>(
    conn: &C,
    now: i64,
    name: &str,
    operator: &str,
    reason: &str,
) -> Result<()> {
    check_operator(operator, reason)?;
    if !Followers::request_restart(conn, name, now)? {
        return Err(Error::not_found("follower", name));
    }
    record(
        conn,
        now,
        operator,
        AuditAction::RestartFollower,
        &format!("follower {name}"),
        reason,
        serde_json::json!({}),
    )
}

// ----- bulk ------------------------------------------------------------------

/// What a bulk intervention did ([`crate::Operator::retry_runs`] and
/// friends).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct Bulk {
    /// The ids acted on.
    pub done: Vec<String>,
    /// The ids left as they were, with why (not found; no longer dead;
    /// resolved already).
    pub skipped: Vec<(String, String)>,
}

/// Most ids one bulk intervention takes.
pub const MAX_BULK: usize = 1_000;

/// Runs `one` for each id in a savepoint of its own: an id that cannot be
/// acted on (the error is the thing's, not the file's) is skipped and said
/// why; the others go ahead, all in the caller's transaction.
pub(crate) fn bulk<B: crate::core::db::Backend, I: ToString>(
    tx: &mut crate::core::db::Tx<'_, B>,
    ids: &[I],
    mut one: impl FnMut(&B::Conn, i64, &I) -> Result<()>,
) -> Result<Bulk> {
    if ids.len() > MAX_BULK {
        return Err(Error::invalid(
            "ids",
            format!("{} at once; at most {MAX_BULK}", ids.len()),
        ));
    }
    let mut out = Bulk::default();
    for id in ids {
        let done = tx.nested(|tx| one(tx.core(), tx.now_ms(), id));
        match done {
            Ok(()) => out.done.push(id.to_string()),
            Err(e) if e.dooms_transaction() => return Err(e),
            Err(e) => out.skipped.push((id.to_string(), e.to_string())),
        }
    }
    Ok(out)
}

/// The ids of what a bulk intervention would act on, found by a filter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Matches<T> {
    /// The ids, newest first.
    pub ids: Vec<T>,
    /// True when more match than were taken (act, then ask again).
    pub more: bool,
}

/// How many pages a search for matches looks through at most.
const MATCH_PAGES: usize = 100;

/// The dead runs `filter` matches, at most `max` (its state must be unset or
/// dead; its limit and cursor are the search's own).
pub(crate) fn matching_dead_runs<C: Work + ?Sized>(
    conn: &C,
    filter: &crate::work::inspect::RunFilter,
    max: usize,
) -> Result<Matches<String>> {
    if filter.state.is_some_and(|s| s != RunState::Dead) {
        return Err(Error::invalid(
            "state",
            "only dead runs are retried or discarded",
        ));
    }
    let mut f = filter
        .clone()
        .state(RunState::Dead)
        .limit(crate::work::inspect::MAX_PAGE);
    let mut ids = Vec::new();
    for _ in 0..MATCH_PAGES {
        let page = crate::work::inspect::find_runs(conn, &f)?;
        ids.extend(page.runs.into_iter().map(|r| r.id));
        match page.next {
            Some(next) if ids.len() <= max => f.before = Some(next),
            _ => break,
        }
    }
    let more = ids.len() > max;
    ids.truncate(max);
    Ok(Matches { ids, more })
}

/// The open dead letters `filter` matches, at most `max`.
pub(crate) fn matching_dead_letters<C: Work + ?Sized>(
    conn: &C,
    filter: &crate::work::inspect::DeadLetterFilter,
    max: usize,
) -> Result<Matches<i64>> {
    let mut f = filter
        .clone()
        .include_resolved(false)
        .limit(crate::work::inspect::MAX_PAGE);
    let mut ids = Vec::new();
    for _ in 0..MATCH_PAGES {
        let page = crate::work::inspect::find_dead_letters(conn, &f)?;
        ids.extend(page.dead_letters.into_iter().map(|d| d.id));
        match page.next {
            Some(next) if ids.len() <= max => f.before = Some(next),
            _ => break,
        }
    }
    let more = ids.len() > max;
    ids.truncate(max);
    Ok(Matches { ids, more })
}

/// Records a prune an operator asked for, with what it removed.
pub(crate) fn record_prune<C: Audit + ?Sized>(
    conn: &C,
    now: i64,
    retention: &crate::work::prune::Retention,
    pruned: &crate::work::prune::Pruned,
    operator: &str,
    reason: &str,
) -> Result<()> {
    let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_millis() as u64);
    record(
        conn,
        now,
        operator,
        AuditAction::Prune,
        "the file",
        reason,
        serde_json::json!({
            "events_older_than_ms": ms(retention.events),
            "work_older_than_ms": ms(retention.finished_work),
            "removed": pruned,
        }),
    )
}
