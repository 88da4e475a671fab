//! Executors: claim runs, run their handlers, and complete, retry or
//! dead-letter them (DESIGN.md, invariants 5 and 6).
//!
//! A claim takes up to `claim_batch` ready, due runs in one transaction
//! (through the writer, so concurrent executors' claims share commits).
//! Each claim is `(holder, attempt)` with an expiry a renewer extends while
//! the handler works; once it lapses, the run is claimable again. The
//! outcomes of a claimed batch are settled in one transaction, each run in a
//! savepoint of its own, and every settlement checks the claim: an executor
//! whose claim lapsed and was taken over settles nothing.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::base::counter::Counter;
use crate::base::dead_letter::{DeadLetterKind, Reason};
use crate::base::error::{Error, Result, panic_text};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::store::dead_letters::NewDeadLetter;
use crate::store::runs::{Requeued, RunRow};
use crate::store::{Control, Counters, DeadLetters, Events, Lanes, Runs};
use crate::work::queue::claims::Claims;
use crate::work::queue::run::{self, Actions, Emitted, Run, RunContext};

/// What happened to the runs of one claim.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Executed {
    pub claimed: usize,
    pub succeeded: usize,
    pub retried: usize,
    pub dead: usize,
    /// Settlements refused because the claim was no longer ours.
    pub lost: usize,
    /// Runs that ended cancelled (an operator asked them to stop).
    pub cancelled: usize,
}

enum Outcome {
    /// Completed by the handler itself ([`RunContext::complete`]).
    AlreadyDone,
    Succeeded(Vec<Emitted>),
    Failed(String),
}

/// Rounds of settle-and-claim one call makes at most before it returns
/// (so threads check for shutdown and the drain evaluates in between).
const MAX_ROUNDS: usize = 64;

/// The most runs one claim takes when batches grow (see [`execute`]).
const MAX_CLAIM: usize = 256;

/// How long one batch's handlers may work before what they finished is
/// settled: a batch of slow handlers does not hold its settlements (and
/// the scopes waiting on them) for long.
const BATCH_BUDGET: std::time::Duration = std::time::Duration::from_millis(50);

/// Claims up to `limit` runs of `actions`, runs them in this thread, and
/// settles them in the same transaction that claims the next batch: one
/// durable commit per batch after the first. Goes on while there is work, up
/// to [`MAX_ROUNDS`] batches, and takes no new run once `stop` is set.
/// `claims` tracks the claims whose handlers work, for the renewer.
///
/// Batches grow with the backlog: a claim that comes back full doubles the
/// next one, up to [`MAX_CLAIM`] (or `limit` when that is larger); one that
/// does not returns to `limit`. Handlers stop taking runs of a batch after
/// [`BATCH_BUDGET`]; the runs not started yet stay claimed and go first in
/// the next round.
pub(crate) fn execute<B: Backend>(
    db: &B::Db,
    actions: &Actions<B>,
    claims: &Claims,
    stop: &AtomicBool,
    limit: usize,
) -> Result<Executed> {
    if actions.handlers.is_empty() {
        return Ok(Executed::default());
    }
    let names = &actions.names;
    // A cheap read first: an idle executor opens no write transaction.
    let now = db.now_ms();
    if !db.read_with(&mut |c| crate::work::queue::claim::work_due(c, now, names))? {
        return Ok(Executed::default());
    }
    let handlers = &actions.handlers;
    let stopping = || stop.load(Ordering::SeqCst);
    let holder = db.settings().holder_id.clone();
    let ttl = db.settings().lease_ttl_ms();
    let base = limit.max(1);
    let most = MAX_CLAIM.max(base);
    // Runs that ended cancelled when their lapsed claim was found.
    let lapsed_cancelled = std::sync::atomic::AtomicUsize::new(0);
    let claim = |tx: &mut Tx<'_, B>, n: usize| -> Result<Vec<RunRow>> {
        let now = tx.now_ms();
        let mut plan = Control::claim_plan(tx.core(), now, names)?;
        let mut rescued = 0;
        let lapsed = if plan.lapsed {
            Runs::lapsed(tx.core(), now, 100)?
        } else {
            Vec::new()
        };
        for lapsed in lapsed {
            match Runs::requeue_lapsed(tx.core(), lapsed.ord, now)? {
                Requeued::Ready => rescued += 1,
                // Cancelled while its executor was gone: it ended, and the
                // next run of its scope may start.
                Requeued::Cancelled => {
                    if let Some(lane) = &lapsed.lane {
                        Lanes::advance_lane(tx.core(), lane, &lapsed.id, now)?;
                    }
                    lapsed_cancelled.fetch_add(1, Ordering::Relaxed);
                    // It ended: threads waiting for it look again.
                    if db.has_run_waiters() {
                        tx.mark_nudge();
                    }
                }
                Requeued::No => {}
            }
        }
        Counters::bump(tx.core(), Counter::ClaimsRescued, rescued)?;
        if rescued > 0 {
            // Ready again: their priorities may be new to the plan.
            plan.priorities = Control::ready_priorities(tx.core())?;
        }
        crate::work::queue::claim::claim(tx.core(), plan, &holder, now, now + ttl, n, names)
    };
    let mut size = base;
    let mut fresh: Vec<RunRow> = db.write_apart(|tx| claim(tx, size))?;
    // Claimed in an earlier round, not started yet (still ours, tracked).
    let mut carried: Vec<(RunRow, Run)> = Vec::new();
    let mut done = Executed::default();
    let mut rounds = 0;
    while !fresh.is_empty() || !carried.is_empty() {
        rounds += 1;
        // The next claim's size: doubled after a full one, back to the base
        // after one that found less.
        size = if fresh.len() >= size {
            (size * 2).min(most)
        } else {
            base
        };
        done.claimed += fresh.len();
        let new_runs: Vec<Run> = fresh.iter().map(Run::from_row).collect();
        claims.track(&new_runs);
        let batch: Vec<(RunRow, Run)> = carried
            .drain(..)
            .chain(fresh.into_iter().zip(new_runs))
            .collect();

        let started = std::time::Instant::now();
        let mut outcomes = Vec::with_capacity(batch.len());
        for (row, run) in &batch {
            if stopping() || (!outcomes.is_empty() && started.elapsed() > BATCH_BUDGET) {
                break;
            }
            let outcome = if run.attempt > run.max_attempts {
                Outcome::Failed(
                    row.last_error
                        .clone()
                        .unwrap_or_else(|| "no attempts left".into()),
                )
            } else {
                match handlers.get(&run.action) {
                    Some(h) => call::<B>(db, stop, claims, h, run),
                    None => Outcome::Failed(format!("no handler for action {}", run.action)),
                }
            };
            outcomes.push(outcome);
        }
        let (ran, rest) = batch.split_at(outcomes.len());
        let ran: Vec<&Run> = ran.iter().map(|(_, r)| r).collect();
        // Runs claimed but not started: back without an attempt when
        // stopping, kept for the next round otherwise.
        let releasing = stopping();
        let more = rounds < MAX_ROUNDS && !releasing;
        let keep = if more { rest.len() } else { 0 };
        let want = size.saturating_sub(keep);

        let next = db.write_apart(|tx| {
            // A round that appends (what its runs emitted) takes the head
            // first, as every appending transaction does.
            if outcomes
                .iter()
                .any(|o| matches!(o, Outcome::Succeeded(e) if !e.is_empty()))
            {
                Events::lock_head(tx.core())?;
            }
            let mut round = Executed::default();
            // Plain successes (nothing emitted, no lane to move on) settle in
            // one statement, which succeeds those whose claims still hold and
            // says which; the rest (a claim lost, a cancellation asked for)
            // and the other outcomes settle one by one.
            let plain: Vec<usize> = outcomes
                .iter()
                .enumerate()
                .filter(|(i, o)| {
                    matches!(o, Outcome::Succeeded(e) if e.is_empty()) && ran[*i].lane.is_none()
                })
                .map(|(i, _)| i)
                .collect();
            let mut settled = vec![false; ran.len()];
            if plain.len() > 1 {
                let claims: Vec<(&str, i64)> = plain
                    .iter()
                    .map(|i| (ran[*i].id.as_str(), i64::from(ran[*i].attempt)))
                    .collect();
                let now = tx.now_ms();
                let done: std::collections::HashSet<String> =
                    Runs::succeed_many(tx.core(), &holder, &claims, now)?
                        .into_iter()
                        .collect();
                for i in &plain {
                    if done.contains(&ran[*i].id) {
                        settled[*i] = true;
                        round.succeeded += 1;
                    }
                }
            }
            // One by one in id order, as the renewer locks claims (see
            // `renew_claims`): the two never wait for each other in a
            // circle where the database runs them side by side.
            let mut rest_in_order: Vec<usize> = (0..ran.len()).filter(|i| !settled[*i]).collect();
            rest_in_order.sort_by(|a, b| ran[*a].id.cmp(&ran[*b].id));
            for i in rest_in_order {
                let (run, outcome) = (ran[i], &outcomes[i]);
                match settle_contained(tx, run, outcome) {
                    Ok(Settled::Cancelled) => round.cancelled += 1,
                    Ok(Settled::Succeeded) => round.succeeded += 1,
                    Ok(Settled::Retried) => round.retried += 1,
                    Ok(Settled::Dead) => round.dead += 1,
                    Err(e) if e.is_lease_lost() => {
                        log::warn!("run {}: {e}; another executor has it", run.id);
                        round.lost += 1;
                    }
                    Err(e) if !e.dooms_transaction() => {
                        // Not even a failed attempt could be recorded: the
                        // claim lapses and the run is claimed again.
                        log::error!("run {}: cannot be settled: {e}", run.id);
                        round.lost += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            if !more {
                for (row, run) in rest {
                    let now = tx.now_ms();
                    let given = Runs::release(
                        tx.core(),
                        row.ord,
                        &run.holder,
                        i64::from(run.attempt),
                        now,
                    )?;
                    if given == Requeued::Cancelled {
                        round.cancelled += 1;
                        if let Some(lane) = &run.lane {
                            Lanes::advance_lane(tx.core(), lane, &run.id, now)?;
                        }
                    }
                }
            }
            Counters::bump(tx.core(), Counter::RunsSucceeded, round.succeeded)?;
            // Runs ended: threads waiting for them look again.
            if db.has_run_waiters() {
                tx.mark_nudge();
            }
            Counters::bump(tx.core(), Counter::RunsRetried, round.retried)?;
            Counters::bump(tx.core(), Counter::RunsDead, round.dead)?;
            // The next batch, in the same commit (it may include runs this
            // settlement just made ready).
            let next = if more && want > 0 {
                claim(tx, want)?
            } else {
                Vec::new()
            };
            Ok((round, next))
        });
        let settled: Vec<Run> = ran.iter().map(|r| (*r).clone()).collect();
        claims.untrack(&settled);
        if !more {
            let released: Vec<Run> = rest.iter().map(|(_, r)| r.clone()).collect();
            claims.untrack(&released);
        }
        let (round, next) = match next {
            Ok(n) => n,
            Err(e) => {
                // Nothing of the round committed: the rest stay claimed
                // until their claims lapse, and are claimed again then.
                let rest: Vec<Run> = rest.iter().map(|(_, r)| r.clone()).collect();
                claims.untrack(&rest);
                return Err(e);
            }
        };
        done.succeeded += round.succeeded;
        done.retried += round.retried;
        done.dead += round.dead;
        done.lost += round.lost;
        done.cancelled += round.cancelled;
        if more {
            carried = rest.to_vec();
        }
        fresh = next;
    }
    done.cancelled += lapsed_cancelled.load(Ordering::Relaxed);
    Ok(done)
}

fn call<B: Backend>(
    db: &B::Db,
    stop: &AtomicBool,
    claims: &Claims,
    handler: &Arc<run::ActionFn<B>>,
    run: &Run,
) -> Outcome {
    let mut ctx = RunContext::<B>::new(db, stop, claims.cancel_flag(&run.id), run);
    let result = catch_unwind(AssertUnwindSafe(|| handler(run, &mut ctx)));
    match result {
        Ok(Ok(())) if ctx.completed => Outcome::AlreadyDone,
        Ok(Ok(())) => Outcome::Succeeded(std::mem::take(&mut ctx.emitted)),
        Ok(Err(e)) if ctx.completed => {
            log::warn!(
                "run {}: the handler completed the run, then failed: {e}",
                run.id
            );
            Outcome::AlreadyDone
        }
        Ok(Err(e)) => Outcome::Failed(e.to_string()),
        Err(panic) if ctx.completed => {
            log::warn!(
                "run {}: the handler completed the run, then panicked: {}",
                run.id,
                panic_text(&*panic)
            );
            Outcome::AlreadyDone
        }
        Err(panic) => Outcome::Failed(format!("panicked: {}", panic_text(&*panic))),
    }
}

enum Settled {
    Succeeded,
    Retried,
    Dead,
    Cancelled,
}

/// Settles one run in a savepoint of its own. When what the handler asked
/// for cannot be recorded — an emitted event the log refuses (a type the
/// workspace does not accept, a payload over the limit, a bad id), an
/// application statement that fails — that is the run's own failure: its
/// writes are rolled back and the attempt fails with the reason, retried or
/// dead-lettered by its policy, while the other runs of the batch settle as
/// their handlers said.
fn settle_contained<B: Backend>(
    tx: &mut Tx<'_, B>,
    run: &Run,
    outcome: &Outcome,
) -> Result<Settled> {
    match tx.nested(|tx| settle(tx, run, outcome)) {
        // Refused because an operator cancelled the run while it ran: it
        // ends cancelled, whatever its handler said.
        Err(e) if e.is_lease_lost() => {
            let cancelled = tx.nested(|tx| {
                let now = tx.now_ms();
                let done = Runs::end_cancelled(
                    tx.core(),
                    &run.id,
                    &run.holder,
                    i64::from(run.attempt),
                    now,
                )?;
                if done && let Some(lane) = &run.lane {
                    Lanes::advance_lane(tx.core(), lane, &run.id, now)?;
                }
                Ok::<_, Error>(done)
            })?;
            if cancelled {
                Ok(Settled::Cancelled)
            } else {
                Err(e)
            }
        }
        Err(e) if !e.is_lease_lost() && !e.dooms_transaction() => {
            log::warn!("run {}: its outcome was refused: {e}", run.id);
            let why = format!("the run's outcome could not be recorded: {e}");
            tx.nested(|tx| fail(tx, run, &why))
        }
        other => other,
    }
}

fn settle<B: Backend>(tx: &mut Tx<'_, B>, run: &Run, outcome: &Outcome) -> Result<Settled> {
    match outcome {
        Outcome::AlreadyDone => Ok(Settled::Succeeded),
        Outcome::Succeeded(emitted) => {
            run::finish_success(tx, run, emitted)?;
            Ok(Settled::Succeeded)
        }
        Outcome::Failed(error) => fail(tx, run, error),
    }
}

/// A failed attempt: ready again after its backoff, or dead once the policy
/// is spent.
fn fail<B: Backend>(tx: &mut Tx<'_, B>, run: &Run, error: &str) -> Result<Settled> {
    let now = tx.now_ms();
    let conn = tx.core();
    let attempt = i64::from(run.attempt);
    let row = Runs::get(conn, &run.id)?.ok_or_else(|| run::claim_lost(run))?;
    if run.attempt < run.max_attempts {
        let due = now + backoff_ms(&row, run.attempt);
        if !Runs::retry_later(conn, &run.id, &run.holder, attempt, now, due, error)? {
            return Err(run::claim_lost(run));
        }
        return Ok(Settled::Retried);
    }
    if !Runs::kill(conn, &run.id, &run.holder, attempt, now, error)? {
        return Err(run::claim_lost(run));
    }
    DeadLetters::insert(
        conn,
        &NewDeadLetter {
            kind: DeadLetterKind::Run,
            consumer: run.rule.as_deref().unwrap_or(&run.action),
            workspace: run.workspace.as_deref(),
            event_seq: run.event_seq,
            event_id: run.event_id.as_deref(),
            run_id: Some(&run.id),
            reason: Reason::AttemptsExhausted,
            error,
            attempts: attempt,
            now,
        },
    )?;
    if let Some(lane) = &row.lane {
        if row.on_dead_letter == "block" {
            Lanes::set_blocked(conn, lane, true, now)?;
        } else {
            Lanes::advance_lane(conn, lane, &run.id, now)?;
        }
    }
    Ok(Settled::Dead)
}

/// The delay before the attempt after `attempt` (1-based): the policy stored
/// on the run, with its jitter.
pub(crate) fn backoff_ms(row: &RunRow, attempt: u32) -> i64 {
    let exp = attempt.saturating_sub(1).min(62) as i32;
    let raw = row.backoff_ms as f64 * row.backoff_factor.powi(exp);
    let capped = raw.min(row.backoff_max_ms as f64);
    let spread = row.jitter * (fastrand::f64() * 2.0 - 1.0);
    (capped * (1.0 + spread)).round().max(0.0) as i64
}

/// Renews every claim this engine holds whose renewal is due: the runs
/// whose handlers are still working.
pub(crate) fn renew_claims<B: Backend>(db: &impl CoreDb<B>, claims: &Claims) -> Result<usize> {
    let ttl = db.settings().lease_ttl_ms();
    let now = db.now_ms();
    let mut due = claims.due(now, ttl);
    if due.is_empty() {
        return Ok(0);
    }
    // In id order, as settlements lock them (see `Runs::succeed_many`);
    // apart from the shared write, which holds the log's head on
    // PostgreSQL (a renewal appends nothing).
    due.sort();
    let (renewed, cancelled) = db.write_apart(|tx| {
        let now = tx.now_ms();
        let mut renewed = Vec::new();
        for (id, holder, attempt) in &due {
            if Runs::renew(tx.core(), id, holder, *attempt, now, now + ttl)? {
                renewed.push(id.clone());
            }
        }
        // A renewal is where a handler in another process learns that an
        // operator cancelled its run.
        let ids: Vec<&str> = due.iter().map(|(id, _, _)| id.as_str()).collect();
        let cancelled = Runs::cancel_requested(tx.core(), &ids)?;
        Ok::<_, Error>((renewed, cancelled))
    })?;
    claims.renewed(&renewed, now + ttl);
    claims.cancel(&cancelled);
    Ok(renewed.len())
}
