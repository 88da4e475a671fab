//! The engine's threads, and the drain that does their work in the caller's
//! thread instead.
//!
//! [`crate::Engine::start`] spawns:
//!
//! - the **loop**, which takes the file's `loop` lease and, while it holds it,
//!   runs the reactions, creates due occurrences of scheduled jobs and (with a
//!   retention set) prunes every ten minutes;
//! - one **evaluator** per workspace with registered rules, which takes the
//!   workspace's evaluator lease (`evaluator/<workspace>`) and, while it holds
//!   it, decides new events; an engine that cannot take the lease tries again
//!   every heartbeat, so a workspace whose evaluator died is evaluated again
//!   once its lease lapses;
//! - the **followers**' thread, which relays for every follower in the ledger
//!   whose projection this engine registered, each under its own lease;
//! - `executors` **executor** threads that claim and run due runs (every
//!   process may execute; each claim is its own lease);
//! - one **renewer** that extends the claims of runs whose handlers are still
//!   working, every third of the lease TTL.
//!
//! Each waits on the nudge (a commit in this process) and the heartbeat
//! (`PRAGMA data_version`, for other processes' commits, and for retries
//! coming due). [`crate::Engine::shutdown`] — or dropping the last `Engine`
//! handle — stops them taking work, lets each finish the handler it is in,
//! gives back runs claimed but not started, releases the evaluator leases and
//! joins every thread.
//!
//! [`crate::Engine::run_until_idle`] runs the same steps in the caller's
//! thread until nothing is ready, so tests need no threads and no sleeping.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Sender, bounded};

use crate::engine::Engine;
use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::evaluate::{self, Pass};
use crate::execute::{self, Executed};
use crate::lease::{self, Lease};
use crate::{follow, prune, reaction, schedule};

/// The threads of a started engine.
pub(crate) struct Runtime {
    threads: Vec<JoinHandle<()>>,
    /// Dropped to wake the renewer at once on shutdown.
    _stop: Sender<()>,
}

/// What [`crate::Engine::run_until_idle`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Idle {
    /// Events the rules moved past.
    pub events: usize,
    /// Decisions made (events of a watched type).
    pub decided: usize,
    /// Decisions that fired.
    pub fired: usize,
    /// Decisions that failed (recorded as `RuleErrored`).
    pub errored: usize,
    /// Runs claimed.
    pub claimed: usize,
    /// Runs that succeeded.
    pub succeeded: usize,
    /// Attempts that failed and will be retried.
    pub retried: usize,
    /// Runs dead-lettered.
    pub dead: usize,
    /// Events reactions moved past.
    pub reacted: usize,
    /// Scheduled occurrences created (or skipped as missed).
    pub scheduled: usize,
    /// Source envelopes followers moved past.
    pub followed: usize,
}

impl Idle {
    fn add_pass(&mut self, p: Pass) {
        self.events += p.events;
        self.decided += p.decided;
        self.fired += p.fired;
        self.errored += p.errored;
    }

    fn add_executed(&mut self, e: Executed) {
        self.claimed += e.claimed;
        self.succeeded += e.succeeded;
        self.retried += e.retried;
        self.dead += e.dead;
    }
}

/// The lease of the loop (reactions, scheduler, automatic pruning): one
/// process per file runs it.
pub(crate) const LOOP_LEASE: &str = "loop";

/// How often the loop prunes, when a retention is set.
const PRUNE_EVERY_MS: i64 = 10 * 60 * 1000;

/// The lease `name`, taken or renewed (every third of its TTL) as needed;
/// `None` while another holder has it.
fn held_lease(shared: &Shared, name: &str) -> Result<Option<Lease>> {
    let mut held = shared.leases.lock().unwrap_or_else(|e| e.into_inner());
    let now = shared.clock.now_ms();
    if let Some(l) = held.get(name) {
        if now < l.renew_due_at() && l.is_live_at(now) {
            return Ok(Some(l.clone()));
        }
        match shared.write(|tx| lease::renew(tx.conn(), tx.now_ms(), l)) {
            Ok(renewed) => {
                held.insert(name.to_string(), renewed.clone());
                return Ok(Some(renewed));
            }
            Err(e) if e.is_lease_lost() => {
                log::warn!("lease {name} lost: {e}");
                held.remove(name);
            }
            Err(e) => return Err(e),
        }
    }
    let holder = shared.config.holder_id.clone();
    let ttl = shared.config.lease_ttl;
    match shared.write(|tx| lease::acquire(tx.conn(), tx.now_ms(), name, &holder, ttl)) {
        Ok(l) => {
            log::info!("holding {name} (generation {})", l.generation);
            held.insert(name.to_string(), l.clone());
            Ok(Some(l))
        }
        Err(Error::LeaseHeld { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn forget_lease(shared: &Shared, name: &str) {
    shared
        .leases
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name);
}

/// One pass over a workspace's rules, if this engine holds (or can take) its
/// evaluator lease. The lease is checked (and renewed when due) before each
/// group of rules, so a workspace with many slow rules keeps it.
pub(crate) fn evaluate_step(shared: &Shared, workspace: &str) -> Result<Pass> {
    let rules = shared
        .registry
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .rules_of(workspace);
    let name = evaluate::lease_name(workspace);
    match evaluate::pass(shared, &rules, &mut || held_lease(shared, &name)) {
        Err(e) if e.is_lease_lost() => {
            log::warn!("evaluating {workspace}: {e}");
            forget_lease(shared, &name);
            Ok(Pass::default())
        }
        other => other,
    }
}

/// One batch of every follower this engine can relay for: those in the
/// ledger whose projection it registered and that did not stop here, each
/// under its lease. A follower that cannot take its lease tries again a
/// third of the lease's TTL later. Returns how many envelopes the followers
/// moved past.
pub(crate) fn follow_step(shared: &Shared) -> Result<usize> {
    let rows = shared.read(crate::store::followers::list)?;
    let mut moved = 0;
    for row in rows {
        {
            let mut stopped = shared
                .stopped_followers
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match stopped.get(&row.name) {
                // An operator asked for a restart since it stopped.
                Some(&seen) if row.restart_requests > seen => {
                    log::info!("follower {} restarts at its cursor", row.name);
                    stopped.remove(&row.name);
                }
                Some(_) => continue,
                None => {}
            }
        }
        let projection = shared
            .registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .projections
            .get(&row.projection)
            .cloned();
        let Some(projection) = projection else {
            continue; // another process (with the projection) relays for it
        };
        let name = follow::lease_name(&row.name);
        let now = shared.clock.now_ms();
        let not_before = shared
            .follower_retry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&row.name)
            .copied();
        if not_before.is_some_and(|t| now < t) {
            continue;
        }
        let Some(lease) = held_lease(shared, &name)? else {
            shared
                .follower_retry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(row.name.clone(), now + shared.claim_ttl_ms() / 3);
            continue;
        };
        let target = match &row.target_file {
            None => None,
            Some(path) => match target_engine(shared, path) {
                Ok(t) => Some(t),
                Err(e) => {
                    stop_follower(shared, &row.name, row.restart_requests, &e);
                    let detail = e.to_string();
                    shared.write(|tx| {
                        crate::store::followers::stopped(tx.conn(), &row.name, &detail, tx.now_ms())
                    })?;
                    continue;
                }
            },
        };
        match follow::step(shared, &lease, &row, &*projection, target.as_ref()) {
            Ok(r) => {
                moved += r.moved;
                if let Some(e) = r.stopped {
                    stop_follower(shared, &row.name, row.restart_requests, &e);
                }
            }
            Err(e) if e.is_lease_lost() => {
                log::warn!("follower {}: {e}", row.name);
                forget_lease(shared, &name);
            }
            // A read that failed: this follower tries again next turn; the
            // others go on.
            Err(e) => log::error!("follower {}: {e}", row.name),
        }
    }
    Ok(moved)
}

/// Stops a follower in this engine; `requests` is the ledger's count of
/// restart requests as read before the step (a request made since restarts
/// it).
fn stop_follower(shared: &Shared, name: &str, requests: i64, e: &Error) {
    log::error!("follower {name} stopped: {e}; it starts again at its cursor when restarted");
    shared
        .stopped_followers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_string(), requests);
}

/// The engine on a cross-file follower's target, opened once. A missing file
/// is an error (a typo must not create an empty hub).
fn target_engine(shared: &Shared, path: &str) -> Result<Engine> {
    let mut targets = shared.targets.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = targets.get(path) {
        return Ok(e.clone());
    }
    let engine = Engine::builder(path)
        .shared_clock(Arc::clone(&shared.clock))
        .synchronous(shared.config.synchronous)
        .busy_timeout(shared.config.busy_timeout)
        .create_if_missing(false)
        .open()?;
    targets.insert(path.to_string(), engine.clone());
    Ok(engine)
}

/// What one turn of the loop did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LoopPass {
    pub reacted: usize,
    pub scheduled: usize,
}

/// One turn of the loop — every reaction's next batch, every due job, and
/// pruning when due — if this engine holds (or can take) the loop lease.
pub(crate) fn loop_step(shared: &Shared) -> Result<LoopPass> {
    let (reactions, jobs) = {
        let reg = shared.registry.read().unwrap_or_else(|e| e.into_inner());
        let r: Vec<_> = reg.reactions.values().cloned().collect();
        let j: Vec<_> = reg.jobs.values().cloned().collect();
        (r, j)
    };
    let retention = shared.config.retention;
    if reactions.is_empty() && jobs.is_empty() && retention.is_none() {
        return Ok(LoopPass::default());
    }
    let Some(lease) = held_lease(shared, LOOP_LEASE)? else {
        return Ok(LoopPass::default());
    };
    let mut pass = LoopPass::default();
    // Each reaction and job on its own: one that fails is logged (a
    // reaction's failure is also recorded on its cursor) and the others go
    // on. Only a lost lease ends the turn.
    let lost = |e: &Error| {
        log::warn!("the loop: {e}");
        forget_lease(shared, LOOP_LEASE);
    };
    for r in &reactions {
        match reaction::step(shared, &lease, r) {
            Ok(n) => pass.reacted += n,
            Err(e) if e.is_lease_lost() => {
                lost(&e);
                return Ok(pass);
            }
            Err(e) => log::error!("reaction {}: {e}", r.name),
        }
    }
    for j in &jobs {
        match schedule::step(shared, &lease, j) {
            Ok(created) => pass.scheduled += usize::from(created),
            Err(e) if e.is_lease_lost() => {
                lost(&e);
                return Ok(pass);
            }
            Err(e) => log::error!("job {}: {e}", j.name),
        }
    }
    if let Some(retention) = retention {
        let now = shared.clock.now_ms();
        let due = {
            let mut last = shared.last_prune.lock().unwrap_or_else(|e| e.into_inner());
            let due = now - *last >= PRUNE_EVERY_MS;
            if due {
                *last = now;
            }
            due
        };
        if due {
            let pruned = prune::prune(shared, &retention, &mut |_| {})?;
            if pruned != prune::Pruned::default() {
                log::info!("pruned {pruned:?}");
            }
        }
    }
    Ok(pass)
}

pub(crate) fn run_until_idle(shared: &Shared) -> Result<Idle> {
    let mut total = Idle::default();
    let workspaces = shared
        .registry
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .workspaces_with_rules();
    loop {
        let mut progress = false;
        for ws in &workspaces {
            let p = evaluate_step(shared, ws)?;
            progress |= p.events > 0;
            total.add_pass(p);
        }
        loop {
            let f = follow_step(shared)?;
            total.followed += f;
            if f == 0 {
                break;
            }
            progress = true;
        }
        loop {
            let l = loop_step(shared)?;
            total.reacted += l.reacted;
            total.scheduled += l.scheduled;
            if l.reacted + l.scheduled == 0 {
                break;
            }
            progress = true;
        }
        loop {
            let e = execute::execute(shared, shared.config.claim_batch)?;
            total.add_executed(e);
            // Progress is a run settled; a claim given back is not.
            if e.succeeded + e.retried + e.dead + e.lost == 0 {
                break;
            }
            progress = true;
        }
        if !progress {
            return Ok(total);
        }
    }
}

pub(crate) fn start(shared: &Arc<Shared>) -> Result<()> {
    let mut slot = shared.runtime.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return Err(Error::invalid("start", "the engine is already started"));
    }
    shared.stop.store(false, Ordering::SeqCst);
    let workspaces = shared
        .registry
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .workspaces_with_rules();
    let (stop_tx, stop_rx) = bounded::<()>(0);
    let mut threads = Vec::new();
    let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(Error::from)
    };
    for ws in workspaces {
        let s = Arc::clone(shared);
        threads.push(spawn(
            format!("reflexr-eval-{ws}"),
            Box::new(move || worker_loop(&s, |s| Ok(evaluate_step(s, &ws)?.events > 0))),
        )?);
    }
    {
        let s = Arc::clone(shared);
        threads.push(spawn(
            "reflexr-loop".into(),
            Box::new(move || {
                worker_loop(&s, |s| {
                    let l = loop_step(s)?;
                    Ok(l.reacted + l.scheduled > 0)
                })
            }),
        )?);
    }
    {
        let s = Arc::clone(shared);
        threads.push(spawn(
            "reflexr-follow".into(),
            Box::new(move || worker_loop(&s, |s| Ok(follow_step(s)? > 0))),
        )?);
    }
    for i in 0..shared.config.executors {
        let s = Arc::clone(shared);
        threads.push(spawn(
            format!("reflexr-exec-{i}"),
            Box::new(move || {
                worker_loop(&s, |s| {
                    Ok(execute::execute(s, s.config.claim_batch)?.claimed > 0)
                })
            }),
        )?);
    }
    {
        let s = Arc::clone(shared);
        threads.push(spawn(
            "reflexr-renew".into(),
            Box::new(move || {
                // Checking costs a lock and a look at the clock; a write
                // happens only for claims due (a third of their TTL left).
                let tick = s.config.heartbeat;
                while !s.stopping() {
                    if let Err(e) = execute::renew_claims(&s) {
                        log::error!("renewing claims: {e}");
                    }
                    // Returns at once when shutdown drops the sender.
                    let _ = stop_rx.recv_timeout(tick);
                }
            }),
        )?);
    }
    *slot = Some(Runtime {
        threads,
        _stop: stop_tx,
    });
    Ok(())
}

/// Runs `step` while it finds work; when it finds none, waits for a nudge or
/// a heartbeat.
fn worker_loop(shared: &Shared, mut step: impl FnMut(&Shared) -> Result<bool>) {
    let sub = shared.notifier.subscribe();
    let heartbeat = shared.config.heartbeat;
    while !shared.stopping() {
        match step(shared) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => log::error!("{}: {e}", std::thread::current().name().unwrap_or("worker")),
        }
        // Work may come due by the clock alone (a retry's backoff, a lease
        // to renew), so no wait is longer than a heartbeat.
        sub.wait(heartbeat, Instant::now() + heartbeat);
    }
}

pub(crate) fn shutdown(shared: &Shared) {
    let runtime = shared
        .runtime
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let Some(runtime) = runtime else { return };
    shared.stop.store(true, Ordering::SeqCst);
    shared.notifier.nudge();
    let Runtime { threads, _stop } = runtime;
    drop(_stop);
    for t in threads {
        if t.join().is_err() {
            log::error!("a reflexr worker thread panicked");
        }
    }
    release_leases(shared);
    // Stopped: the engine is usable again (run_until_idle, start).
    shared.stop.store(false, Ordering::SeqCst);
}

/// Gives the evaluator leases back, so another process takes over at once.
pub(crate) fn release_leases(shared: &Shared) {
    let held: Vec<Lease> = shared
        .leases
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
        .map(|(_, l)| l)
        .collect();
    for l in held {
        if let Err(e) = shared.write(|tx| lease::release(tx.conn(), tx.now_ms(), &l)) {
            log::warn!("releasing {}: {e}", l.name);
        }
    }
}
