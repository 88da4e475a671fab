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
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
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

/// Decides one batch of `rule` under `lease` and commits it. If an operator
/// moved the cursor or reset the state while the batch was being decided,
/// the batch is decided again from what is there now.
pub(crate) fn batch(shared: &Shared, lease: &Lease, rule: &Rule) -> Result<Pass> {
    for _ in 0..10 {
        if let Some(pass) = try_batch(shared, lease, rule)? {
            return Ok(pass);
        }
    }
    ::log::warn!(
        "rule {}: its cursor keeps changing under the evaluator; trying again later",
        rule.name
    );
    Ok(Pass::default())
}

/// One attempt at a batch: `None` when the commit found the cursor or the
/// state changed since they were read (nothing was written).
fn try_batch(shared: &Shared, lease: &Lease, rule: &Rule) -> Result<Option<Pass>> {
    let kind = ConsumerKind::Rule.as_str();
    let (stamp, page) = shared.read(|c| {
        let stamp = cursors::get_stamped(c, &rule.workspace, kind, &rule.name)?.unwrap_or((0, 0));
        let page = events::page(
            c,
            &rule.workspace,
            stamp.0,
            &[],
            shared.config.evaluate_batch,
        )?;
        Ok((stamp, page))
    })?;
    if page.is_empty() {
        return Ok(Some(Pass::default()));
    }

    // Scopes of the events the rule watches, and their stored states.
    let scopes: Vec<Option<std::result::Result<String, String>>> = page
        .iter()
        .map(|e| {
            rule.types.contains(&e.event_type).then(|| {
                catch_unwind(AssertUnwindSafe(|| rule.scope.of(e))).unwrap_or_else(|p| {
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

    let decide = rule
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
        if i > 0 && started.elapsed() >= DECIDE_BUDGET {
            break;
        }
        last = i;
        let Some(scope) = &scopes[i] else { continue };
        decided += 1;
        let scope = match scope {
            Ok(s) => s.clone(),
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
        if !states.contains_key(&scope) {
            let loaded = match stored.get(&scope) {
                Some(json) => decide.load(json),
                None => Ok(decide.initial()),
            };
            match loaded {
                Ok(s) => {
                    states.insert(scope.clone(), s);
                }
                Err(why) => {
                    errors.push(Errored {
                        event: i,
                        scope: Some(scope),
                        reason: "state_unreadable",
                        error: why,
                    });
                    continue;
                }
            }
        }
        let current = states.get(&scope).expect("loaded above");
        let mut copy = decide.copy(&**current);
        let outcome = catch_unwind(AssertUnwindSafe(|| decide.decide(event, &mut *copy)));
        match outcome {
            Ok(Ok(decision)) => {
                states.insert(scope.clone(), copy);
                dirty.insert(scope.clone(), event.seq);
                if let Decision::Fire(input) = decision {
                    firings.push(Firing {
                        id: log::new_id(),
                        event: i,
                        scope,
                        input: input.to_string(),
                    });
                }
            }
            Ok(Err(e)) => errors.push(Errored {
                event: i,
                scope: Some(scope),
                reason: "decision_error",
                error: e.to_string(),
            }),
            Err(panic) => errors.push(Errored {
                event: i,
                scope: Some(scope),
                reason: "decision_panic",
                error: panic_text(&*panic),
            }),
        }
    }
    let new_cursor = page[last].seq;

    // Only states that changed are written.
    let mut changed = Vec::new();
    for (scope, seq) in &dirty {
        let state = states.get(scope).expect("dirty states are loaded");
        match decide.save(&**state) {
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

    let committed = shared.write(|tx| {
        commit(
            tx, lease, rule, stamp, new_cursor, decided, &page, &changed, &firings, &errors,
        )
    })?;
    if !committed {
        return Ok(None);
    }
    Ok(Some(Pass {
        events: last + 1,
        decided,
        fired: firings.len(),
        errored: errors.len(),
    }))
}

#[allow(clippy::too_many_arguments)]
fn commit(
    tx: &mut Tx<'_>,
    lease: &Lease,
    rule: &Rule,
    read_stamp: (i64, i64),
    new_cursor: i64,
    decided: usize,
    page: &[Event],
    changed: &[(String, String, i64)],
    firings: &[Firing],
    errors: &[Errored],
) -> Result<bool> {
    let now = tx.now_ms();
    let shared = tx.shared();
    let conn = tx.conn();
    lease::fence(conn, now, lease)?;
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
                max_attempts: i64::from(rule.retry.max_attempts),
                backoff_ms: rule.retry.initial.as_millis() as i64,
                backoff_max_ms: rule.retry.max_delay.as_millis() as i64,
                backoff_factor: rule.retry.factor,
                jitter: rule.retry.jitter,
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
