//! Executors: claim runs, run their handlers, and complete, retry or
//! dead-letter them (DESIGN.md, invariants 5 and 6).
//!
//! A claim takes up to `claim_batch` ready, due runs in one transaction
//! (through the writer, so concurrent executors' claims share commits).
//! Each claim is `(holder, attempt)` with an expiry a renewer extends while
//! the handler works; once it lapses, the run is claimable again. The
//! outcomes of a claimed batch are settled in one transaction, each run in a
//! savepoint of its own, and every settlement checks the claim: an executor
//! whose claim lapsed and was taken over settles nothing. A turn may start
//! with runs handed to it instead of a claim: claimed for it in the
//! transaction that made them (`work::queue::handoff`).

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::base::counter::Counter;
use crate::base::dead_letter::{DeadLetterKind, Reason};
use crate::base::error::{Error, Result, panic_text};
use crate::base::telemetry::{Op, Span};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::store::dead_letters::NewDeadLetter;
use crate::store::runs::{Requeued, RunRow};
use crate::store::steps::StepRow;
use crate::store::{Control, Counters, DeadLetters, Events, Lanes, Runs};
use crate::work::queue::claims::{Claims, due_for_renewal};
use crate::work::queue::handoff::Handed;
use crate::work::queue::pace::{BATCH_BUDGET, Pace};
use crate::work::queue::run::{self, Actions, Emitted, Run, RunContext};
use crate::work::queue::waits;

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
    /// Workflow runs that suspended (a sleep, a wait, a join).
    pub suspended: usize,
}

enum Outcome {
    /// Completed by the handler itself ([`RunContext::complete`]).
    AlreadyDone,
    /// Succeeded, with the events it emitted, its output, and the
    /// workflow steps it recorded last, to write with its success.
    Succeeded(Vec<Emitted>, Option<String>, Vec<StepRow>),
    /// A workflow's run suspended (recorded by the handler's step).
    Suspended,
    /// Failed, with the workflow steps it recorded before, to write with
    /// the failure.
    Failed(String, Vec<StepRow>),
}

impl Outcome {
    /// The workflow steps recorded and not written yet.
    fn pending(&self) -> &[StepRow] {
        match self {
            Outcome::Succeeded(_, _, p) | Outcome::Failed(_, p) => p,
            Outcome::AlreadyDone | Outcome::Suspended => &[],
        }
    }
}

/// Rounds of settle-and-claim one call makes at most before it returns
/// (so threads check for shutdown and the drain evaluates in between).
const MAX_ROUNDS: usize = 64;

/// The most runs one claim takes when batches grow (see [`execute`]).
pub(crate) const MAX_CLAIM: usize = 256;

/// Claims runs of `actions`, runs them in this thread, and settles them in
/// the same transaction that claims the next batch: one durable commit per
/// batch after the first. Goes on while there is work, up to
/// [`MAX_ROUNDS`] batches, and takes no new run once `stop` is set.
/// `claims` tracks the claims whose handlers work, for the renewer, and
/// carries this process's pauses and cancels to the executors at once.
///
/// What a claim holds ([`crate::work::queue::pace`]): up to `limit` runs,
/// doubled after a full claim up to [`MAX_CLAIM`] (or `limit` when that is
/// larger), but of each action no more than fit in [`BATCH_BUDGET`] at the
/// pace its handlers ran here lately (no cap before the first), of an action
/// with a concurrency limit no more than one plus what fits in a
/// millisecond, and cut where the batch's expected duration passes the
/// budget (the cut runs go back at once). Handlers stop taking runs of a
/// batch after [`BATCH_BUDGET`]; before each start, a pause or a cancel made
/// in this process since the claim, or any made in another process when a
/// heartbeat has passed since the batch last looked, holds its runs back.
/// A run of a batch that did not start goes first (within its priority) in
/// the next batch, still claimed, and the next claim takes only what fits
/// behind it; it is given back, without an attempt, in the commit that
/// settles the batch when its action was paused, its cancellation asked
/// for, or this is the last round.
pub(crate) fn execute<B: Backend>(
    db: &B::Db,
    actions: &Actions<B>,
    claims: &Claims,
    pace: &Pace,
    stop: &AtomicBool,
    limit: usize,
    handed: Vec<Handed>,
) -> Result<Executed> {
    // Runs claimed for this process's executors at their insert (`handed`)
    // go first: they are this turn's first batch, with no claim of its own.
    // One that reached its executor late (see `give_back_stale`) is given back
    // instead, and claimed again like any ready run; at a shutdown, when
    // every one of them was late, nothing is claimed in their place.
    let was_handed = !handed.is_empty();
    let (handed, ended) = give_back_stale::<B>(db, handed);
    let given_back = Executed {
        cancelled: ended,
        ..Executed::default()
    };
    if (actions.is_empty() || (was_handed && stop.load(Ordering::SeqCst))) && handed.is_empty() {
        return Ok(given_back);
    }
    let names = &actions.names;
    // A cheap read first: an idle executor opens no write transaction. It
    // also tells whether workflows wait for events, which decides whether
    // appends wake this process's executors (`core::wake::WaitsHint`).
    let now = db.now_ms();
    if handed.is_empty() {
        let hint = db.waits_hint();
        let before = hint.before_look();
        let (due, waits) =
            db.read_with(&mut |c| crate::work::queue::claim::work_due(c, now, names))?;
        hint.looked(before, waits);
        if !due {
            return Ok(given_back);
        }
    }
    let handlers = &actions.handlers;
    let batches = &actions.batches;
    let stopping = || stop.load(Ordering::SeqCst);
    let holder = db.settings().holder_id.clone();
    let ttl = db.settings().lease_ttl_ms();
    let recheck_every = db.settings().heartbeat;
    let base = limit.max(1);
    let most = MAX_CLAIM.max(base);
    // Runs that ended cancelled when their lapsed claim was found.
    let lapsed_cancelled = std::sync::atomic::AtomicUsize::new(0);
    // The actions the last claim read as paused: what a round carries of
    // them does not start (a pause another process committed before the
    // round's commit holds from that commit, not a heartbeat later).
    let paused_at_claim: std::sync::Mutex<HashSet<String>> = Default::default();
    let claim = |tx: &mut Tx<'_, B>, n: usize, ahead: &[&str]| -> Result<Vec<RunRow>> {
        let now = tx.now_ms();
        let mut plan = Control::claim_plan(tx.core(), now, names)?;
        paused_at_claim
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone_from(&plan.paused);
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
                    waits::run_ended(tx, &lapsed.id, lapsed.parent.as_deref())?;
                    // It ended: threads waiting for it look again, once
                    // this commits (see `wake_run_waiters`).
                    lapsed_cancelled.fetch_add(1, Ordering::Relaxed);
                }
                Requeued::No => {}
            }
        }
        Counters::bump(tx.core(), Counter::ClaimsRescued, rescued)?;
        if rescued > 0 {
            // Ready again: their priorities may be new to the plan.
            plan.priorities = Control::ready_priorities(tx.core())?;
        }
        // The limited actions' turns first, in the order the claim takes
        // them, and the claim's time read after them: a claim that waited
        // for another process's turn stamps its runs' starts with the time
        // it took them, not the time it began waiting (a limit's slot freed
        // by a settlement stamped in between would seem taken twice).
        let mut turns: Vec<&str> = plan.limited.iter().map(|l| l.action.as_str()).collect();
        turns.sort_unstable();
        for action in &turns {
            if !plan.paused.contains(*action) {
                Control::lock_limits(tx.core(), action)?;
            }
        }
        let now = if turns.is_empty() { now } else { tx.now_ms() };
        let held_to_one = |a: &str| {
            plan.limited
                .iter()
                .any(|l| l.action == a && l.max_running.is_some())
        };
        let caps = pace.caps(names, &held_to_one, ahead);
        let mut rows = crate::work::queue::claim::claim(
            tx.core(),
            plan,
            &holder,
            now,
            now + ttl,
            n,
            names,
            &caps,
        )?;
        // What the batch (behind the runs carried ahead of it) will not
        // start within the budget goes back now.
        let keep = pace.fitting_after(ahead, rows.iter().map(|r| r.action.as_str()));
        for row in rows.split_off(keep) {
            give_back_row(tx, &row, &holder)?;
        }
        Ok(rows)
    };
    // Pauses and cancels made in this process after this are seen by the
    // batch this claim makes.
    let mut seen = claims.epoch();
    let mut size = base;
    let mut fresh: Vec<RunRow> = if handed.is_empty() {
        let fresh = db.write_apart(|tx| {
            waits::match_waits(tx)?;
            claim(tx, size, &[])
        })?;
        if lapsed_cancelled.load(Ordering::Relaxed) > 0 {
            wake_run_waiters::<B>(db);
        }
        fresh
    } else {
        // Claimed before this turn: the pauses and cancels made here since
        // their transaction began are looked at before they start.
        seen = handed.iter().map(|h| h.epoch).fold(seen, u64::min);
        handed.into_iter().map(|h| h.row).collect()
    };
    // Claimed in an earlier round and not started within its budget: still
    // ours, tracked, and first in the next round (within their priority).
    let mut carried: Vec<Claimed> = Vec::new();
    // When the batches last looked at the file for other processes' pauses
    // and cancels (a claim reads them too).
    let mut looked = Instant::now();
    let mut done = given_back;
    let mut rounds = 0;
    while !fresh.is_empty() || !carried.is_empty() {
        rounds += 1;
        // The next claim's size: doubled after a full one, back to the base
        // after one that found less.
        size = if fresh.len() + carried.len() >= size {
            (size * 2).min(most)
        } else {
            base
        };
        done.claimed += fresh.len();
        let mut fresh_runs: Vec<Claimed> = fresh
            .into_iter()
            .map(|mut row| {
                let kept = Kept {
                    priority: row.priority,
                    last_error: row.last_error.take(),
                };
                (kept, Run::from_row(row))
            })
            .collect();
        claims.track(fresh_runs.iter_mut().map(|(_, r)| r));
        // Higher priorities first; within one, what was carried first.
        let mut batch: Vec<Claimed> = carried.drain(..).chain(fresh_runs).collect();
        batch.sort_by_key(|(kept, _)| std::cmp::Reverse(kept.priority));

        let started = Instant::now();
        // What the claim in this round's transaction read as paused holds
        // back what was carried into it (claimed before the pause).
        let mut held: HashSet<String> = {
            let paused = paused_at_claim
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            batch
                .iter()
                .filter(|(_, r)| paused.contains(&r.action))
                .map(|(_, r)| r.id.clone())
                .collect()
        };
        let mut outcomes: Vec<Option<Outcome>> = (0..batch.len()).map(|_| None).collect();
        // The handlers' durations, for the pace of the claims to come.
        let mut took: Vec<(&str, std::time::Duration)> = Vec::with_capacity(batch.len());
        for (i, (kept, run)) in batch.iter().enumerate() {
            if outcomes[i].is_some() {
                // Ran already, in a batch action's call.
                continue;
            }
            let any_started = outcomes.iter().any(Option::is_some);
            if stopping() || (any_started && started.elapsed() > BATCH_BUDGET) {
                break;
            }
            // A pause or cancel of this process since the claim, or of any
            // process once a heartbeat has passed: look at the file again.
            // The heartbeat counts from the end of the last look: a look
            // slower than a heartbeat (a loaded server) is not made again
            // at once, run after run.
            while claims.epoch() != seen || looked.elapsed() >= recheck_every {
                seen = claims.epoch();
                let rest: Vec<&Run> = batch[i..].iter().map(|(_, r)| r).collect();
                held = held_back::<B>(db, &rest).unwrap_or_else(|e| {
                    // Unsure what was paused: start none of them; they go
                    // back with the batch's settlement.
                    log::warn!("looking for pauses and cancels: {e}");
                    rest.iter().map(|r| r.id.clone()).collect()
                });
                looked = Instant::now();
            }
            if let Some((max, h)) = batches.get(&run.action) {
                // This run and the next of the action in the batch that may
                // start, up to `max`, in one call.
                let mut together: Vec<usize> = Vec::new();
                for (j, (kept, other)) in batch.iter().enumerate().skip(i) {
                    if together.len() >= *max {
                        break;
                    }
                    if other.action != run.action
                        || outcomes[j].is_some()
                        || held.contains(&other.id)
                        || !claims.start(&other.id)
                    {
                        continue;
                    }
                    if other.attempt > other.max_attempts {
                        outcomes[j] = Some(Outcome::Failed(
                            kept.last_error
                                .clone()
                                .unwrap_or_else(|| "no attempts left".into()),
                            Vec::new(),
                        ));
                        continue;
                    }
                    together.push(j);
                }
                if together.is_empty() {
                    continue;
                }
                let runs: Vec<&Run> = together.iter().map(|j| &batch[*j].1).collect();
                let t = Instant::now();
                let results = call_batch::<B>(db, stop, claims, h, &runs);
                let each = t.elapsed() / u32::try_from(runs.len()).unwrap_or(u32::MAX);
                for (j, outcome) in together.into_iter().zip(results) {
                    took.push((batch[j].1.action.as_str(), each));
                    outcomes[j] = Some(outcome);
                }
                continue;
            }
            if held.contains(&run.id) || !claims.start(&run.id) {
                continue;
            }
            let outcome = if run.attempt > run.max_attempts {
                Outcome::Failed(
                    kept.last_error
                        .clone()
                        .unwrap_or_else(|| "no attempts left".into()),
                    Vec::new(),
                )
            } else {
                match handlers.get(&run.action) {
                    Some(h) => {
                        let t = Instant::now();
                        let outcome = call::<B>(db, stop, claims, h, run);
                        took.push((run.action.as_str(), t.elapsed()));
                        outcome
                    }
                    None => {
                        Outcome::Failed(format!("no handler for action {}", run.action), Vec::new())
                    }
                }
            };
            outcomes[i] = Some(outcome);
        }
        pace.record_all(took);
        let ran: Vec<(&Run, &Outcome)> = batch
            .iter()
            .zip(&outcomes)
            .filter_map(|((_, run), o)| o.as_ref().map(|o| (run, o)))
            .collect();
        // Claimed but not started: carried into the next round, first, when
        // there is one; back without an attempt when its action was paused,
        // its cancellation asked for, or this executor stops.
        let more = rounds < MAX_ROUNDS && !stopping();
        let (carry, rest): (Vec<&Claimed>, Vec<&Claimed>) = batch
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.is_none())
            .map(|(b, _)| b)
            .partition(|(_, r)| more && !held.contains(&r.id) && !claims.is_stopped(&r.id));
        // The next claim reads the pauses itself; what is carried was looked
        // at only up to `seen`, so a pause or cancel since then still makes
        // the next batch look again.
        if carry.is_empty() {
            seen = claims.epoch();
        }
        // What the renewer gave back already is not released again.
        let ids: Vec<&str> = rest.iter().map(|(_, r)| r.id.as_str()).collect();
        let mine = claims.take_back(&ids);
        let rest: Vec<&Claimed> = rest
            .into_iter()
            .filter(|(_, r)| mine.contains(&r.id))
            .collect();
        let ahead: Vec<&str> = carry.iter().map(|(_, r)| r.action.as_str()).collect();
        let want = size.saturating_sub(carry.len());

        let next = db.write_apart(|tx| {
            // Waits matched first (it takes the log's head when it must).
            waits::match_waits(tx)?;
            // A round that appends (what its runs emitted) takes the head
            // first, as every appending transaction does.
            if ran
                .iter()
                .any(|(_, o)| matches!(o, Outcome::Succeeded(e, _, _) if !e.is_empty()))
            {
                Events::lock_head(tx.core())?;
            }
            let mut round = Executed::default();
            // Plain successes (nothing emitted, no lane to move on) settle in
            // one call (`Runs::succeed_many`), which succeeds those whose
            // claims still hold and says which; the rest (a claim lost, a
            // cancellation asked for) and the other outcomes settle one by
            // one.
            let plain: Vec<usize> = ran
                .iter()
                .enumerate()
                .filter(|(_, (run, o))| {
                    matches!(o, Outcome::Succeeded(e, None, p) if e.is_empty() && p.is_empty())
                        && run.lane.is_none()
                        && run.parent.is_none()
                })
                .map(|(i, _)| i)
                .collect();
            let mut settled = vec![false; ran.len()];
            if plain.len() > 1 {
                let claims: Vec<(i64, &str, i64)> = plain
                    .iter()
                    .map(|i| {
                        let run = ran[*i].0;
                        (run.ord, run.id.as_str(), i64::from(run.attempt))
                    })
                    .collect();
                let now = tx.now_ms();
                let done: std::collections::HashSet<String> =
                    Runs::succeed_many(tx.core(), &holder, &claims, now)?
                        .into_iter()
                        .collect();
                for i in &plain {
                    if done.contains(&ran[*i].0.id) {
                        settled[*i] = true;
                        round.succeeded += 1;
                    }
                }
            }
            // One by one in id order, as the renewer locks claims (see
            // `renew_claims`): the two never wait for each other in a
            // circle where the database runs them side by side.
            let mut rest_in_order: Vec<usize> = (0..ran.len()).filter(|i| !settled[*i]).collect();
            rest_in_order.sort_by(|a, b| ran[*a].0.id.cmp(&ran[*b].0.id));
            for i in rest_in_order {
                let (run, outcome) = ran[i];
                match settle_contained(tx, run, outcome) {
                    Ok(Settled::Cancelled) => round.cancelled += 1,
                    Ok(Settled::Succeeded) => round.succeeded += 1,
                    Ok(Settled::Retried) => round.retried += 1,
                    Ok(Settled::Dead) => round.dead += 1,
                    Ok(Settled::Suspended) => round.suspended += 1,
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
            for (_, run) in &rest {
                if give_back(
                    tx,
                    &run.id,
                    run.ord,
                    &run.holder,
                    i64::from(run.attempt),
                    run.lane.as_deref(),
                    run.parent.as_deref(),
                )? {
                    round.cancelled += 1;
                }
            }
            Counters::bump(tx.core(), Counter::RunsSucceeded, round.succeeded)?;
            // Runs went back: executors that may take them look again
            // (threads waiting for runs to end are woken after the commit).
            if !rest.is_empty() {
                tx.mark_runs();
            }
            Counters::bump(tx.core(), Counter::RunsRetried, round.retried)?;
            Counters::bump(tx.core(), Counter::RunsDead, round.dead)?;
            // The next batch, in the same commit (it may include runs this
            // settlement just made ready or gave back).
            let next = if more && want > 0 {
                claim(tx, want, &ahead)?
            } else {
                Vec::new()
            };
            Ok((round, next))
        });
        // Every run of the batch is settled, given back or carried, or (if
        // the commit failed) left to its claim's expiry: only the carried
        // are tracked now.
        let carried_ids: HashSet<&str> = carry.iter().map(|(_, r)| r.id.as_str()).collect();
        claims.untrack(
            batch
                .iter()
                .map(|(_, r)| (r.id.as_str(), r.token))
                .filter(|(id, _)| next.is_err() || !carried_ids.contains(id)),
        );
        let (round, next) = next?;
        // Runs ended: threads waiting for them look again.
        wake_run_waiters::<B>(db);
        carried = carry.into_iter().cloned().collect();
        done.succeeded += round.succeeded;
        done.retried += round.retried;
        done.dead += round.dead;
        done.lost += round.lost;
        done.cancelled += round.cancelled;
        done.suspended += round.suspended;
        fresh = next;
    }
    done.cancelled += lapsed_cancelled.load(Ordering::Relaxed);
    Ok(done)
}

/// A claimed run: what the batch keeps of its row, and what its handler
/// gets.
type Claimed = (Kept, Run);

/// What the batch needs of a claimed run's row beside its [`Run`] (whose
/// text is moved out of the row, not copied): its priority, for the
/// batch's order, and its last error, which a run out of attempts dies
/// with.
#[derive(Clone, Debug)]
struct Kept {
    priority: i64,
    last_error: Option<String>,
}

/// Wakes the threads of this process waiting for runs to end
/// (`Engine::wait_for_run`), after a commit that may have ended some. Asked
/// after the commit, never inside the transaction: a waiter counts itself
/// before it reads the run, so one that read the run unended read it before
/// the commit and is counted by now. Asked inside, a waiter that came
/// between the question and the commit was told nothing, and its wait
/// lasted a heartbeat.
fn wake_run_waiters<B: Backend>(db: &B::Db) {
    if db.has_run_waiters() {
        db.nudge();
    }
}

/// Of the runs handed to an executor, those it may start, and how many of
/// the others ended cancelled: a run may start while its claim holds for
/// two thirds of a lease more, as long as the renewer lets a claimed run
/// wait for its handler (`Claims::overdue`). A hand-over reaches its
/// executor within the write that made it, normally a millisecond after its
/// claim; one held up longer (a write stuck past `RESERVATION_WAIT`,
/// delivered to an executor that had moved on) may come after its claim
/// lapsed and another executor took the run, and would run it a second
/// time beside it. Those are given back, unstarted and without an attempt,
/// in one write (a claim taken over meanwhile is its new holder's and
/// stays as it is), and are claimed again like any ready run. A write that
/// fails gives none back (logged): their claims lapse, and the claims
/// take them again then.
fn give_back_stale<B: Backend>(db: &B::Db, handed: Vec<Handed>) -> (Vec<Handed>, usize) {
    if handed.is_empty() {
        return (handed, 0);
    }
    let now = db.now_ms();
    let ttl = db.settings().lease_ttl_ms();
    let (fresh, stale): (Vec<Handed>, Vec<Handed>) = handed.into_iter().partition(|h| {
        h.row
            .claim_expires_at
            .is_some_and(|until| !due_for_renewal(until, now, ttl))
    });
    if stale.is_empty() {
        return (fresh, 0);
    }
    let holder = db.settings().holder_id.clone();
    let given = db.write_apart(|tx| {
        let mut ended = 0;
        for h in &stale {
            if give_back_row(tx, &h.row, &holder)? {
                ended += 1;
            }
        }
        tx.mark_runs();
        Ok::<_, crate::base::error::Error>(ended)
    });
    match given {
        Ok(ended) => {
            log::warn!(
                "{} run(s) handed over more than a third of a lease after their claim: \
                 not started, and given back unless another claim has them",
                stale.len()
            );
            if ended > 0 {
                wake_run_waiters::<B>(db);
            }
            (fresh, ended)
        }
        Err(e) => {
            log::warn!(
                "{} run(s) handed over too late to start, not given back ({e}): \
                 their claims will lapse",
                stale.len()
            );
            (fresh, 0)
        }
    }
}

/// [`give_back`] of a row this executor's holder claimed.
fn give_back_row<B: Backend>(tx: &mut Tx<'_, B>, row: &RunRow, holder: &str) -> Result<bool> {
    give_back(
        tx,
        &row.id,
        row.ord,
        holder,
        row.attempt,
        row.lane.as_deref(),
        row.parent.as_deref(),
    )
}

/// Gives a claimed run back, unstarted and without an attempt; true when
/// its cancellation had been asked for, so it ended cancelled instead (and
/// its scope moves on).
#[allow(clippy::too_many_arguments)]
fn give_back<B: Backend>(
    tx: &mut Tx<'_, B>,
    id: &str,
    ord: i64,
    holder: &str,
    attempt: i64,
    lane: Option<&str>,
    parent: Option<&str>,
) -> Result<bool> {
    let now = tx.now_ms();
    if Runs::release(tx.core(), ord, holder, attempt, now)? == Requeued::Cancelled {
        if let Some(lane) = lane {
            Lanes::advance_lane(tx.core(), lane, id, now)?;
        }
        waits::run_ended(tx, id, parent)?;
        return Ok(true);
    }
    Ok(false)
}

/// The runs of `rest` not to start: those of a paused action, and those
/// whose cancellation was asked for (in any process). Two statements
/// whatever the batch's size: the pauses, then the cancellations among the
/// others' ids. A claimed run no longer in the file (deleted by hand) is
/// not held: its settlement finds no row, and counts it lost.
fn held_back<B: Backend>(db: &B::Db, rest: &[&Run]) -> Result<HashSet<String>> {
    db.read_with(&mut |c| {
        let paused = crate::work::control::paused_names(c, "action")?;
        let mut held: HashSet<String> = HashSet::new();
        let mut others: Vec<(i64, &str)> = Vec::new();
        for run in rest {
            if paused.contains(&run.action) {
                held.insert(run.id.clone());
            } else {
                others.push((run.ord, &run.id));
            }
        }
        if !others.is_empty() {
            held.extend(Runs::cancel_requested(c, &others)?);
        }
        Ok(held)
    })
}

fn call<B: Backend>(
    db: &B::Db,
    stop: &AtomicBool,
    claims: &Claims,
    handler: &Arc<run::ActionFn<B>>,
    run: &Run,
) -> Outcome {
    let mut span = attempt_span::<B>(db, run);
    let mut ctx = RunContext::<B>::new(db, stop, claims.cancel_flag(&run.id), run);
    ctx.span = span.traceparent();
    let result = {
        // The handler's own spans, and its appends, are the attempt's.
        let _entered = span.enter();
        catch_unwind(AssertUnwindSafe(|| handler(run, &mut ctx)))
    };
    let outcome = outcome_of(run, &mut ctx, result);
    end_attempt(&mut span, &outcome);
    outcome
}

/// The span of `run`'s attempt.
fn attempt_span<B: Backend>(db: &B::Db, run: &Run) -> Span {
    db.settings().telemetry.start(Op::Attempt {
        action: &run.action,
        run_id: &run.id,
        attempt: run.attempt,
        parent: run.traceparent.as_deref(),
    })
}

/// Ends an attempt's span with its outcome.
fn end_attempt(span: &mut Span, outcome: &Outcome) {
    if let Outcome::Failed(why, _) = outcome {
        let kind = if why.starts_with("panicked") {
            "panic"
        } else {
            "handler_error"
        };
        span.fail(kind, why);
    }
}

/// One call of a batch action's handler for `runs`: their outcomes, in
/// order. A panic, or a count of outcomes that is not the count of runs,
/// fails every run's attempt (what a run recorded stays its own: a step, a
/// completion).
fn call_batch<B: Backend>(
    db: &B::Db,
    stop: &AtomicBool,
    claims: &Claims,
    handler: &Arc<run::BatchFn<B>>,
    runs: &[&Run],
) -> Vec<Outcome> {
    // One span per run's attempt, around the one call.
    let mut spans: Vec<Span> = runs.iter().map(|run| attempt_span::<B>(db, run)).collect();
    let mut ctxs: Vec<RunContext<'_, B>> = runs
        .iter()
        .zip(&spans)
        .map(|(run, span)| {
            let mut ctx = RunContext::<B>::new(db, stop, claims.cancel_flag(&run.id), run);
            ctx.span = span.traceparent();
            ctx
        })
        .collect();
    let results = catch_unwind(AssertUnwindSafe(|| handler(&mut ctxs)));
    let results: Vec<
        std::thread::Result<std::result::Result<(), crate::base::error::HandlerError>>,
    > = match results {
        Ok(r) if r.len() == runs.len() => r.into_iter().map(Ok).collect(),
        Ok(r) => {
            let why = format!(
                "the batch handler returned {} outcomes for {} runs",
                r.len(),
                runs.len()
            );
            runs.iter().map(|_| Ok(Err(why.clone().into()))).collect()
        }
        Err(panic) => {
            // Each run's outcome says the call panicked, and why.
            let why = panic_text(&*panic).to_string();
            runs.iter()
                .map(|_| Err(Box::new(why.clone()) as Box<dyn std::any::Any + Send>))
                .collect()
        }
    };
    runs.iter()
        .zip(ctxs.iter_mut())
        .zip(results)
        .zip(spans.iter_mut())
        .map(|(((run, ctx), result), span)| {
            let outcome = outcome_of(run, ctx, result);
            end_attempt(span, &outcome);
            outcome
        })
        .collect()
}

/// What an attempt's handler left: its result (or panic) and what it did
/// with its context.
fn outcome_of<B: Backend>(
    run: &Run,
    ctx: &mut RunContext<'_, B>,
    result: std::thread::Result<std::result::Result<(), crate::base::error::HandlerError>>,
) -> Outcome {
    if ctx.suspended {
        // Recorded with the step that waits, whatever the handler returned.
        return Outcome::Suspended;
    }
    match result {
        Ok(Ok(())) if ctx.completed => Outcome::AlreadyDone,
        Ok(Ok(())) => Outcome::Succeeded(
            std::mem::take(&mut ctx.emitted),
            ctx.output.take(),
            std::mem::take(&mut ctx.pending),
        ),
        Ok(Err(e)) if ctx.completed => {
            log::warn!(
                "run {}: the handler completed the run, then failed: {e}",
                run.id
            );
            Outcome::AlreadyDone
        }
        Ok(Err(e)) => Outcome::Failed(e.to_string(), std::mem::take(&mut ctx.pending)),
        Err(panic) if ctx.completed => {
            log::warn!(
                "run {}: the handler completed the run, then panicked: {}",
                run.id,
                panic_text(&*panic)
            );
            Outcome::AlreadyDone
        }
        Err(panic) => Outcome::Failed(
            format!("panicked: {}", panic_text(&*panic)),
            std::mem::take(&mut ctx.pending),
        ),
    }
}

enum Settled {
    Succeeded,
    Retried,
    Dead,
    Cancelled,
    Suspended,
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
                if done {
                    waits::run_ended(tx, &run.id, run.parent.as_deref())?;
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
            tx.nested(|tx| {
                let settled = fail(tx, run, &why)?;
                run::insert_rows(tx, outcome.pending())?;
                Ok(settled)
            })
        }
        other => other,
    }
}

fn settle<B: Backend>(tx: &mut Tx<'_, B>, run: &Run, outcome: &Outcome) -> Result<Settled> {
    match outcome {
        Outcome::AlreadyDone => Ok(Settled::Succeeded),
        Outcome::Suspended => Ok(Settled::Suspended),
        Outcome::Succeeded(emitted, output, pending) => {
            // The claim is checked first: a lost one writes nothing.
            run::finish_success(tx, run, emitted, output.as_deref())?;
            run::insert_rows(tx, pending)?;
            Ok(Settled::Succeeded)
        }
        Outcome::Failed(error, pending) => {
            let settled = fail(tx, run, error)?;
            run::insert_rows(tx, pending)?;
            Ok(settled)
        }
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
    waits::run_ended(tx, &run.id, run.parent.as_deref())?;
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
    let mut overdue = claims.overdue(now, ttl);
    if due.is_empty() && overdue.is_empty() {
        return Ok(0);
    }
    overdue.sort();
    // In id order, as settlements lock them (see `Runs::succeed_many`);
    // apart from the shared write, which holds the log's head on
    // PostgreSQL (a renewal appends nothing).
    due.sort();
    let (renewed, cancelled) = db.write_apart(|tx| {
        let now = tx.now_ms();
        let mut renewed = Vec::new();
        for (id, holder, attempt, _) in &due {
            if Runs::renew(tx.core(), id, holder, *attempt, now, now + ttl)? {
                renewed.push(id.clone());
            }
        }
        // Claimed a third of the TTL ago and still not started (behind a
        // handler that takes long): back to the queue, for another executor.
        for (id, ord, holder, attempt, lane, parent) in &overdue {
            give_back(
                tx,
                id,
                *ord,
                holder,
                *attempt,
                lane.as_deref(),
                parent.as_deref(),
            )?;
        }
        if !overdue.is_empty() {
            tx.mark_runs();
        }
        // A renewal is where a handler in another process learns that an
        // operator cancelled its run.
        let runs: Vec<(i64, &str)> = due
            .iter()
            .map(|(id, _, _, ord)| (*ord, id.as_str()))
            .collect();
        let cancelled = Runs::cancel_requested(tx.core(), &runs)?;
        Ok::<_, Error>((renewed, cancelled))
    })?;
    claims.renewed(&renewed, now + ttl);
    claims.cancel(&cancelled);
    Ok(renewed.len())
}
