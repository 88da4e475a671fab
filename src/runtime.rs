//! The engine's threads, and the drain that does their work in the caller's
//! thread instead.
//!
//! [`crate::Engine::start`] spawns:
//!
//! - one **evaluator** per workspace with registered rules, which takes the
//!   workspace's evaluator lease (`evaluator/<workspace>`) and, while it holds
//!   it, decides new events; an engine that cannot take the lease tries again
//!   every heartbeat, so a workspace whose evaluator died is evaluated again
//!   once its lease lapses;
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
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, bounded};

use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::evaluate::{self, Pass};
use crate::execute::{self, Executed};
use crate::lease::{self, Lease};

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

/// The evaluator lease of `workspace`, taken or renewed as needed; `None`
/// while another holder has it.
fn evaluator_lease(shared: &Shared, workspace: &str) -> Result<Option<Lease>> {
    let mut held = shared.leases.lock().unwrap_or_else(|e| e.into_inner());
    let now = shared.clock.now_ms();
    if let Some(l) = held.get(workspace) {
        if now < l.renew_due_at() && l.is_live_at(now) {
            return Ok(Some(l.clone()));
        }
        match shared.write(|tx| lease::renew(tx.conn(), tx.now_ms(), l)) {
            Ok(renewed) => {
                held.insert(workspace.to_string(), renewed.clone());
                return Ok(Some(renewed));
            }
            Err(e) if e.is_lease_lost() => {
                log::warn!("evaluator lease of {workspace} lost: {e}");
                held.remove(workspace);
            }
            Err(e) => return Err(e),
        }
    }
    let name = evaluate::lease_name(workspace);
    let holder = shared.config.holder_id.clone();
    let ttl = shared.config.lease_ttl;
    match shared.write(|tx| lease::acquire(tx.conn(), tx.now_ms(), &name, &holder, ttl)) {
        Ok(l) => {
            log::info!("evaluating {workspace} (lease generation {})", l.generation);
            held.insert(workspace.to_string(), l.clone());
            Ok(Some(l))
        }
        Err(Error::LeaseHeld { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// One pass over a workspace's rules, if this engine holds (or can take) its
/// evaluator lease. The lease is checked (and renewed when due) before each
/// rule's batch, so a workspace with many slow rules keeps it.
pub(crate) fn evaluate_step(shared: &Shared, workspace: &str) -> Result<Pass> {
    let rules = shared
        .registry
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .rules_of(workspace);
    let mut total = Pass::default();
    for rule in &rules {
        let Some(lease) = evaluator_lease(shared, workspace)? else {
            break;
        };
        match evaluate::batch(shared, &lease, rule) {
            Ok(p) => total.add(p),
            Err(e) if e.is_lease_lost() => {
                log::warn!("evaluating {workspace}: {e}");
                shared
                    .leases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(workspace);
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(total)
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
                let tick = Duration::from_millis((s.claim_ttl_ms() / 6).clamp(1, 1_000) as u64);
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
