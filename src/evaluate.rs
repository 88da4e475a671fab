//! The evaluator: decides every rule of a workspace over new events, exactly
//! once per (rule, event) (DESIGN.md, invariant 4).
//!
//! For each rule and batch:
//!
//! 1. **Read** (a pooled connection, no lock held): the rule's cursor, the
//!    events after it, and the stored states of the scopes they touch.
//! 2. **Decide** (the application's code, still no lock held): for each
//!    event the rule watches, compute the scope and run the decision on a
//!    copy of the scope's state. An error, a panic or a missing scope is a
//!    `RuleErrored` and a dead letter; the decision's state changes are
//!    dropped. A batch stops after [`DECIDE_BUDGET`] of decisions, so a slow
//!    rule holds back the workspace's other rules by one batch at most.
//! 3. **Commit** (one transaction, through the writer): check the
//!    workspace's evaluator lease (holder and generation) and that the
//!    rule's cursor is as step 1 read it (position and stamp: an operator's
//!    reset of the cursor or of the state changes the stamp); then write the changed
//!    states, the `RuleFired` and `RuleErrored` events, the dead letters, the
//!    new runs, and the cursor. A crash anywhere before the commit leaves
//!    nothing, and the batch is decided again from the same cursor and state;
//!    after it, nothing is decided again.

use std::any::Any;
use std::cell::OnceCell;
use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cursor::ConsumerKind;
use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::event::{Event, NewEvent};
use crate::lease::{self, Lease};
use crate::log::{self, Origin};
use crate::rule::{Decision, Ordering, Rule};
use crate::store::dead_letters::{self, NewDeadLetter};
use crate::store::runs::{self, NewRun};
use crate::store::{counters, cursors, events, rules};
use crate::tx::Tx;

/// Longest a rule decides before its batch is committed.
pub(crate) const DECIDE_BUDGET: Duration = Duration::from_millis(50);

/// The evaluator lease of a workspace.
pub(crate) fn lease_name(workspace: &str) -> String {
    format!("evaluator/{workspace}")
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pass {
    /// Events the rules moved past (decided or skipped).
    pub events: usize,
    pub decided: usize,
    pub fired: usize,
    pub errored: usize,
}

impl Pass {
    pub(crate) fn add(&mut self, o: Pass) {
        self.events += o.events;
        self.decided += o.decided;
        self.fired += o.fired;
        self.errored += o.errored;
    }
}

/// A firing to commit.
struct Firing {
    id: String,
    event: usize,
    scope: String,
    input: String,
}

/// An evaluation error to commit.
struct Errored {
    event: usize,
    scope: Option<String>,
    reason: &'static str,
    error: String,
}

/// A cursor's position and the stamp of its last change.
type Stamp = (i64, i64);

/// Everything one rule decided over one page, ready to commit.
struct Decided<'r> {
    rule: &'r Rule,
    /// The cursor's (position, stamp) when the page was read.
    stamp: (i64, i64),
    /// How many of the page's events it got through.
    through: usize,
    decided: usize,
    /// (scope, state JSON, seq of the last event that changed it).
    changed: Vec<(String, String, i64)>,
    firings: Vec<Firing>,
    errors: Vec<Errored>,
}

/// One pass over the rules of a workspace. Rules whose cursors stand at the
/// same position share one read of the page (and each event's parsed
/// payload) and one commit, each rule's part in a savepoint of its own. A
/// rule whose cursor or state an operator changed meanwhile is decided again
/// (up to ten times a pass); a rule whose commit fails otherwise is logged
/// and left for the next pass, without holding back the others. `lease`
/// gives the workspace's evaluator lease (renewing it when due) before each
/// group; `None` ends the pass.
pub(crate) fn pass(
    shared: &Shared,
    rules: &[Arc<Rule>],
    lease: &mut dyn FnMut() -> Result<Option<Lease>>,
) -> Result<Pass> {
    let Some(workspace) = rules.first().map(|r| r.workspace.clone()) else {
        return Ok(Pass::default());
    };
    let kind = ConsumerKind::Rule.as_str();
    let mut total = Pass::default();
    let mut pending: Vec<&Rule> = rules.iter().map(|r| &**r).collect();
    for _ in 0..10 {
        if pending.is_empty() {
            break;
        }
        let stamps: Vec<(i64, i64)> = shared.read(|c| {
            pending
                .iter()
                .map(|r| Ok(cursors::get_stamped(c, &workspace, kind, &r.name)?.unwrap_or((0, 0))))
                .collect()
        })?;
        let mut groups: BTreeMap<i64, Vec<(&Rule, Stamp)>> = BTreeMap::new();
        for (r, stamp) in pending.iter().zip(stamps) {
            groups.entry(stamp.0).or_default().push((r, stamp));
        }
        let mut again = Vec::new();
        for (position, group) in groups {
            let Some(lease) = lease()? else {
                return Ok(total);
            };
            let page = shared.read(|c| {
                events::page(c, &workspace, position, &[], shared.config.evaluate_batch)
            })?;
            if page.is_empty() {
                continue;
            }
            let parsed: Vec<OnceCell<Option<serde_json::Value>>> =
                page.iter().map(|_| OnceCell::new()).collect();
            let mut decided = Vec::with_capacity(group.len());
            for (rule, stamp) in group {
                match decide(shared, rule, stamp, &page, &parsed) {
                    Ok(d) => decided.push(d),
                    Err(e) => ::log::error!("rule {}: {e}; it tries again next pass", rule.name),
                }
            }
            let outcomes = shared.write(|tx| -> Result<Vec<Result<bool>>> {
                lease::fence(tx.conn(), tx.now_ms(), &lease)?;
                Ok(decided
                    .iter()
                    .map(|d| tx.nested(|tx| commit(tx, d, &page, &lease)))
                    .collect::<Vec<Result<bool>>>())
            })?;
            for (d, outcome) in decided.iter().zip(outcomes) {
                match outcome {
                    Ok(true) => total.add(Pass {
                        events: d.through,
                        decided: d.decided,
                        fired: d.firings.len(),
                        errored: d.errors.len(),
                    }),
                    Ok(false) => again.push(d.rule),
                    Err(e) if e.is_lease_lost() => return Err(e),
                    Err(e) => ::log::error!("rule {}: {e}; it tries again next pass", d.rule.name),
                }
            }
        }
        pending = again;
    }
    if !pending.is_empty() {
        ::log::warn!("rules whose cursors keep changing under the evaluator try again later");
    }
    Ok(total)
}

/// Decides `rule` over `page` (which starts right after its cursor):
/// scopes, states, decisions; writes nothing.
fn decide<'r>(
    shared: &Shared,
    rule: &'r Rule,
    stamp: (i64, i64),
    page: &[Event],
    parsed: &[OnceCell<Option<serde_json::Value>>],
) -> Result<Decided<'r>> {
    // Scopes of the events the rule watches, and their stored states.
    let scopes: Vec<Option<std::result::Result<String, String>>> = page
        .iter()
        .zip(parsed)
        .map(|(e, p)| {
            rule.types.contains(&e.event_type).then(|| {
                catch_unwind(AssertUnwindSafe(|| rule.scope.of(e, p))).unwrap_or_else(|p| {
                    Err(format!("the scope function panicked: {}", panic_text(&*p)))
                })
            })
        })
        .collect();
    let wanted: Vec<&str> = {
        let mut v: Vec<&str> = scopes
            .iter()
            .filter_map(|s| s.as_ref().and_then(|r| r.as_deref().ok()))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let stored: HashMap<String, String> = if wanted.is_empty() {
        HashMap::new()
    } else {
        shared
            .read(|c| rules::states(c, &rule.name, &wanted))?
            .into_iter()
            .collect()
    };

    let decider = rule
        .decide
        .as_ref()
        .expect("a registered rule has a decision");
    let mut states: HashMap<String, Box<dyn Any + Send>> = HashMap::new();
    let mut dirty: HashMap<String, i64> = HashMap::new();
    let mut firings = Vec::new();
    let mut errors = Vec::new();
    let mut decided = 0;
    let mut last = 0usize;
    let started = Instant::now();
    for (i, event) in page.iter().enumerate() {
        // The clock is read every 32 events: reading it costs more than a
        // trivial decision.
        if i > 0 && i % 32 == 0 && started.elapsed() >= DECIDE_BUDGET {
            break;
        }
        last = i;
        let Some(scope) = &scopes[i] else { continue };
        decided += 1;
        let scope = match scope {
            Ok(s) => s.as_str(),
            Err(why) => {
                errors.push(Errored {
                    event: i,
                    scope: None,
                    reason: "missing_scope",
                    error: why.clone(),
                });
                continue;
            }
        };
        if !states.contains_key(scope) {
            let loaded = match stored.get(scope) {
                Some(json) => decider.load(json),
                None => Ok(decider.initial()),
            };
            match loaded {
                Ok(s) => {
                    states.insert(scope.to_string(), s);
                }
                Err(why) => {
                    errors.push(Errored {
                        event: i,
                        scope: Some(scope.to_string()),
                        reason: "state_unreadable",
                        error: why,
                    });
                    continue;
                }
            }
        }
        let current = states.get_mut(scope).expect("loaded above");
        let mut copy = decider.copy(&**current);
        let outcome = catch_unwind(AssertUnwindSafe(|| decider.decide(event, &mut *copy)));
        match outcome {
            Ok(Ok(decision)) => {
                *current = copy;
                match dirty.get_mut(scope) {
                    Some(seq) => *seq = event.seq,
                    None => {
                        dirty.insert(scope.to_string(), event.seq);
                    }
                }
                if let Decision::Fire(input) = decision {
                    firings.push(Firing {
                        id: log::new_id(),
                        event: i,
                        scope: scope.to_string(),
                        input: input.to_string(),
                    });
                }
            }
            Ok(Err(e)) => errors.push(Errored {
                event: i,
                scope: Some(scope.to_string()),
                reason: "decision_error",
                error: e.to_string(),
            }),
            Err(panic) => errors.push(Errored {
                event: i,
                scope: Some(scope.to_string()),
                reason: "decision_panic",
                error: panic_text(&*panic),
            }),
        }
    }

    // Only states that changed are written.
    let mut changed = Vec::new();
    for (scope, seq) in &dirty {
        let state = states.get(scope).expect("dirty states are loaded");
        match decider.save(&**state) {
            Ok(json) if stored.get(scope) != Some(&json) => {
                changed.push((scope.clone(), json, *seq))
            }
            Ok(_) => {}
            Err(why) => {
                return Err(Error::Encode {
                    message: format!("rule {}: {why}", rule.name),
                });
            }
        }
    }
    Ok(Decided {
        rule,
        stamp,
        through: last + 1,
        decided,
        changed,
        firings,
        errors,
    })
}

/// Commits what one rule decided, in the caller's transaction (which checked
/// the evaluator lease): false, writing nothing, if its cursor or state was
/// changed since the page was read.
fn commit(tx: &mut Tx<'_>, d: &Decided<'_>, page: &[Event], lease: &Lease) -> Result<bool> {
    let Decided {
        rule,
        stamp: read_stamp,
        through,
        decided,
        changed,
        firings,
        errors,
    } = d;
    let (rule, read_stamp, decided) = (*rule, *read_stamp, *decided);
    let new_cursor = page[through - 1].seq;
    let now = tx.now_ms();
    let shared = tx.shared();
    let conn = tx.conn();
    let kind = ConsumerKind::Rule.as_str();
    // Nobody moved the cursor or reset the state since step 1 read them.
    if cursors::get_stamped(conn, &rule.workspace, kind, &rule.name)?.unwrap_or((0, 0))
        != read_stamp
    {
        return Ok(false);
    }
    for (scope, json, seq) in changed {
        rules::save_state(conn, &rule.name, scope, json, *seq, now)?;
    }
    let actor = format!("rule:{}", rule.name);
    let action = rule
        .action
        .as_deref()
        .expect("a registered rule has an action");
    for f in firings {
        let event = &page[f.event];
        let too_deep = event.depth + 1 > shared.config.max_chain_depth;
        let fired = NewEvent::new("RuleFired", &event.subject, &actor, event.occurred_at)
            .id(format!("{}:fired", f.id))
            .payload(&serde_json::json!({
                "rule": rule.name,
                "firing_id": f.id,
                "action": action,
                "scope": f.scope,
                "input": serde_json::from_str::<serde_json::Value>(&f.input).unwrap_or_default(),
                "event_seq": event.seq,
                "event_id": event.id,
                "run": if too_deep { "dead: chain depth limit" } else { "created" },
                "evaluator": { "holder": lease.holder, "generation": lease.generation },
            }));
        let fired = with_cause(fired, event);
        log::append(
            conn,
            shared,
            &rule.workspace,
            &fired,
            Origin::Engine { depth: event.depth },
        )?;
        let dead = too_deep.then(|| {
            format!(
                "the firing event is {} deep; a run would emit events past the chain depth limit of {}",
                event.depth, shared.config.max_chain_depth
            )
        });
        let lane = (rule.ordering == Ordering::Scope).then(|| format!("{} {}", rule.name, f.scope));
        runs::insert(
            conn,
            &NewRun {
                id: &f.id,
                kind: "rule",
                action,
                workspace: Some(&rule.workspace),
                rule: Some(&rule.name),
                scope: Some(&f.scope),
                lane: lane.as_deref(),
                on_dead_letter: rule.on_dead_letter.as_str(),
                input: &f.input,
                event_seq: Some(event.seq),
                event_id: Some(&event.id),
                depth: event.depth,
                retry: &rule.retry,
                due_at: now,
                now,
                dead: dead.as_deref(),
            },
        )?;
        if let Some(why) = &dead {
            dead_letters::insert(
                conn,
                &NewDeadLetter {
                    kind: "run",
                    consumer: &rule.name,
                    workspace: Some(&rule.workspace),
                    event_seq: Some(event.seq),
                    event_id: Some(&event.id),
                    run_id: Some(&f.id),
                    reason: "depth_limit",
                    error: why,
                    attempts: 0,
                    now,
                },
            )?;
        }
    }
    for e in errors {
        let event = &page[e.event];
        let errored = NewEvent::new("RuleErrored", &event.subject, &actor, event.occurred_at)
            .id(format!("{}:errored", log::new_id()))
            .payload(&serde_json::json!({
                "rule": rule.name,
                "scope": e.scope,
                "reason": e.reason,
                "error": e.error,
                "event_seq": event.seq,
                "event_id": event.id,
            }));
        let errored = with_cause(errored, event);
        log::append(
            conn,
            shared,
            &rule.workspace,
            &errored,
            Origin::Engine { depth: event.depth },
        )?;
        dead_letters::insert(
            conn,
            &NewDeadLetter {
                kind: "rule",
                consumer: &rule.name,
                workspace: Some(&rule.workspace),
                event_seq: Some(event.seq),
                event_id: Some(&event.id),
                run_id: None,
                reason: e.reason,
                error: &e.error,
                attempts: 1,
                now,
            },
        )?;
    }
    if !firings.is_empty() || !errors.is_empty() {
        tx.mark_nudge();
    }
    counters::bump(tx.conn(), "decisions", decided)?;
    counters::bump(tx.conn(), "fired", firings.len())?;
    counters::bump(tx.conn(), "errored", errors.len())?;
    match cursors::advance(
        tx.conn(),
        &rule.workspace,
        kind,
        &rule.name,
        new_cursor,
        now,
    )? {
        Ok(()) => Ok(true),
        Err(_) => Ok(false),
    }
}

fn with_cause(ev: NewEvent, cause: &Event) -> NewEvent {
    let ev = ev.causation_id(cause.id.clone());
    match &cause.correlation_id {
        Some(c) => ev.correlation_id(c.clone()),
        None => ev,
    }
}

/// The message of a caught panic.
pub(crate) fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}
