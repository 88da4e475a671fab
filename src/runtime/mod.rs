//! The engine's threads, and the drain that does their work in the caller's
//! thread instead. [`Context`] holds the [`Db`] and the state that only the
//! runtime needs: what this process registered, the claims its handlers
//! work under, the leases it holds, its threads, its followers' scheduling
//! and the prune timer.
//!
//! [`start`] spawns:
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
//! coming due). [`shutdown`] stops them taking work, lets each finish the
//! handler it is in, gives back runs claimed but not started, releases every
//! lease this engine holds (the loop's, the evaluators', the followers') and
//! joins every thread.
//!
//! Services that run beside the engine (an administration server) stop with
//! it, first.
//!
//! [`run_until_idle`] runs the same steps in the caller's thread until
//! nothing is ready, so tests need no threads and no sleeping.

pub(crate) mod registry;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Sender, bounded};

use crate::base::clock::Clock;
use crate::base::error::{Error, Result};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::lease::{self, Lease};
use crate::core::settings::Settings;
use crate::core::wake::Wake;
use crate::runtime::registry::Registry;
use crate::store::Sqlite;
use crate::work::evaluate::{self, Pass};
use crate::work::follow::Publish;
use crate::work::prune::{self, Retention};
use crate::work::queue::claims::Claims;
use crate::work::queue::enqueue::{self, Enqueue, Enqueued};
use crate::work::queue::execute::{self, Executed};
use crate::work::queue::handoff::{Hand, Handed, Handoff};
use crate::work::queue::pace::Pace;
use crate::{work::follow, work::reaction, work::schedule};

/// Ends the engine when its last handle goes: its threads stopped, its
/// leases released, then what its open database keeps besides.
pub(crate) fn close<B: Backend>(cx: &Context<B>) {
    shutdown(cx);
    cx.db.close();
}

/// The followers in the ledger, with their cursors and counters.
pub(crate) fn followers<B: Backend>(
    cx: &Context<B>,
) -> Result<Vec<crate::work::follow::FollowerInfo>> {
    let stopped = cx.stopped_followers();
    cx.db.read_with(&mut |c| follow::infos(c, &stopped))
}

/// Removes a follower from the ledger, on the record.
pub(crate) fn unfollow<B: Backend>(cx: &Context<B>, name: &str, op: &str, why: &str) -> Result<()> {
    cx.db
        .write_with(|tx| crate::work::operate::unfollow(tx.core(), tx.now_ms(), name, op, why))
}

/// Asks a stopped follower to start again (whichever process runs it), on
/// the record; this engine's lets it go at once.
pub(crate) fn restart_follower<B: Backend>(
    cx: &Context<B>,
    name: &str,
    op: &str,
    why: &str,
) -> Result<()> {
    cx.db.write_with(|tx| {
        crate::work::operate::restart_follower(tx.core(), tx.now_ms(), name, op, why)
    })?;
    cx.unstop_follower(name);
    cx.db.nudge();
    Ok(())
}

/// The runtime's settings.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub executors: usize,
    pub claim_batch: usize,
    pub evaluate_batch: usize,
    pub retention: Option<Retention>,
    /// How this engine opens the databases its followers publish into.
    pub hubs: Hubs,
}

/// Opens another reflexr file (which must exist) like the engine's own:
/// these settings and clock, this VFS (None: the default); the file's path.
pub(crate) type OpenFile =
    fn(&Settings, &Arc<dyn Clock>, Option<&str>, &str) -> Result<Arc<Publish>>;

/// Connects to a PostgreSQL database by its connection string, with these
/// settings and clock.
#[cfg(feature = "postgres")]
pub(crate) type OpenPostgres = fn(&Settings, &Arc<dyn Clock>, &str) -> Result<Arc<Publish>>;

/// How an engine opens the databases its followers publish into — another
/// file, a PostgreSQL database — each kept open once opened. Given by the
/// facade, which names the backends; the runtime only calls them.
#[derive(Clone, Copy)]
pub(crate) struct Hubs {
    /// Opens another reflexr file (which must exist) with these settings
    /// and clock, through this VFS (None: the default).
    pub file: OpenFile,
    /// Connects to a PostgreSQL database by its connection string.
    #[cfg(feature = "postgres")]
    pub postgres: OpenPostgres,
}

/// An open database with everything its runtime needs: what every clone of
/// an [`crate::Engine`] shares; its threads are every backend's.
pub struct Context<B: Backend = Sqlite> {
    pub(crate) db: B::Db,
    pub(crate) config: Config,
    registry: RwLock<Registry<B>>,
    /// Claims on runs whose handlers are working, for the renewer.
    claims: Claims,
    /// The idle executors, and the runs claimed at their insert for them.
    handoff: Handoff,
    /// Each action's recent handler duration here: what a claim takes.
    pace: Pace,
    /// The leases this engine holds (the loop's, the evaluators', the
    /// followers'), by name.
    leases: Mutex<HashMap<String, Lease>>,
    threads: Mutex<Option<Threads>>,
    /// Set while shutting down: workers take no new work.
    pub(crate) stop: AtomicBool,
    /// When the loop last pruned (engine clock).
    last_prune: Mutex<i64>,
    /// Followers stopped in this engine until restarted, with the ledger's
    /// count of restart requests when they stopped: a request from any
    /// process moves the count, and the follower starts again.
    stopped_followers: Mutex<HashMap<String, i64>>,
    /// When each follower that could not take its lease may try again.
    follower_retry: Mutex<HashMap<String, i64>>,
    /// The cross-file followers' target files, opened once, by path.
    targets: Mutex<HashMap<String, Arc<Publish>>>,
    /// The PostgreSQL targets this process registered, by name: the
    /// connection string, and the database once opened.
    #[cfg(feature = "postgres")]
    pg_targets: Mutex<HashMap<String, PgTarget>>,
    /// What runs beside the engine and stops with it (admin servers).
    services: Mutex<Vec<Weak<dyn Service>>>,
}

/// Something that runs beside the engine on threads of its own and stops
/// with it (an administration server): see [`crate::Engine::add_service`].
pub trait Service: Send + Sync {
    /// Stops it and joins its threads. Called once the engine shuts down;
    /// must return (it holds the shutdown up until it does), and may be
    /// called again, or after the service stopped on its own.
    fn stop(&self);
}

/// The threads of a started engine.
struct Threads {
    handles: Vec<JoinHandle<()>>,
    /// Dropped to wake the renewer at once on shutdown.
    _stop: Sender<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: Backend> Context<B> {
    pub(crate) fn new(db: B::Db, config: Config) -> Context<B> {
        let handoff = Handoff::new(config.executors);
        Context {
            db,
            config,
            registry: RwLock::new(Registry::default()),
            claims: Claims::default(),
            handoff,
            pace: Pace::default(),
            leases: Mutex::new(HashMap::new()),
            threads: Mutex::new(None),
            stop: AtomicBool::new(false),
            last_prune: Mutex::new(i64::MIN / 2),
            stopped_followers: Mutex::new(HashMap::new()),
            follower_retry: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
            #[cfg(feature = "postgres")]
            pg_targets: Mutex::new(HashMap::new()),
            services: Mutex::new(Vec::new()),
        }
    }

    /// Registers (or replaces) the PostgreSQL target `name`; it is
    /// connected to when a follower first publishes into it.
    #[cfg(feature = "postgres")]
    pub(crate) fn register_pg_target(&self, name: &str, config: &str) {
        lock(&self.pg_targets).insert(
            name.to_string(),
            PgTarget {
                config: config.to_string(),
                db: None,
            },
        );
    }

    /// Whether this process registered the PostgreSQL target `name`.
    pub(crate) fn registers_pg_target(&self, name: &str) -> bool {
        #[cfg(feature = "postgres")]
        return lock(&self.pg_targets).contains_key(name);
        #[cfg(not(feature = "postgres"))]
        {
            let _ = name;
            false
        }
    }

    /// Has `service` stopped with the engine ([`shutdown`]).
    pub(crate) fn add_service(&self, service: &Arc<dyn Service>) {
        let mut services = lock(&self.services);
        services.retain(|s| s.strong_count() > 0);
        services.push(Arc::downgrade(service));
    }

    /// The claims this process's handlers work under.
    pub(crate) fn claims(&self) -> &Claims {
        &self.claims
    }

    /// The idle executors, and the runs handed to them.
    #[cfg(test)]
    pub(crate) fn handoff(&self) -> &Handoff {
        &self.handoff
    }

    pub(crate) fn registry(&self) -> RwLockReadGuard<'_, Registry<B>> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn registry_mut(&self) -> RwLockWriteGuard<'_, Registry<B>> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }

    /// True between [`start`] and [`shutdown`].
    pub(crate) fn is_started(&self) -> bool {
        lock(&self.threads).is_some()
    }

    /// The followers stopped in this engine (with the restart requests seen
    /// when they stopped).
    pub(crate) fn stopped_followers(&self) -> HashMap<String, i64> {
        lock(&self.stopped_followers).clone()
    }

    /// Lets a follower stopped in this engine go on at its next turn.
    pub(crate) fn unstop_follower(&self, name: &str) {
        lock(&self.stopped_followers).remove(name);
    }
}

/// What [`crate::Engine::run_until_idle`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Drained {
    /// Events the rules moved past.
    pub events: usize,
    /// Decisions made (events of a watched type).
    pub decided: usize,
    /// Decisions that fired (new firings: a replay's firings found made
    /// before are not counted).
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
    /// Workflow runs that suspended (a durable sleep, a wait for an event
    /// or for children).
    pub suspended: usize,
    /// Events reactions moved past.
    pub reacted: usize,
    /// Scheduled occurrences created (or skipped as missed).
    pub scheduled: usize,
    /// Source envelopes followers moved past.
    pub followed: usize,
}

impl Drained {
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
        self.suspended += e.suspended;
    }
}

/// The lease of the loop (reactions, scheduler, automatic pruning): one
/// process per file runs it.
pub(crate) const LOOP_LEASE: &str = "loop";

/// How often the loop prunes, when a retention is set.
const PRUNE_EVERY_MS: i64 = 10 * 60 * 1000;

/// The lease `name`, taken or renewed (every third of its TTL) as needed;
/// `None` while another holder has it.
fn held_lease<B: Backend>(cx: &Context<B>, name: &str) -> Result<Option<Lease>> {
    let db = &cx.db;
    let mut held = lock(&cx.leases);
    let now = db.now_ms();
    if let Some(l) = held.get(name) {
        if now < l.renew_due_at() && l.is_live_at(now) {
            return Ok(Some(l.clone()));
        }
        match db.write_apart(|tx| lease::renew(tx.core(), tx.now_ms(), l)) {
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
    let holder = db.settings().holder_id.clone();
    let ttl = db.settings().lease_ttl;
    match db.write_apart(|tx| lease::acquire(tx.core(), tx.now_ms(), name, &holder, ttl)) {
        Ok(l) => {
            log::info!("holding {name} (generation {})", l.generation);
            held.insert(name.to_string(), l.clone());
            Ok(Some(l))
        }
        Err(Error::LeaseHeld { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn forget_lease<B: Backend>(cx: &Context<B>, name: &str) {
    lock(&cx.leases).remove(name);
}

/// [`crate::Engine::enqueue`]: a plain enqueue's run, due at once, goes to
/// an idle executor of this process claimed at its insert when one is
/// parked (`work::queue::handoff`), as a firing's does.
pub(crate) fn enqueue<B: Backend>(cx: &Context<B>, e: &Enqueue) -> Result<Enqueued> {
    if cx.handoff.idle() == 0 {
        return enqueue::enqueue_alone::<B>(&cx.db, e, None);
    }
    let actions = Arc::clone(&cx.registry().actions);
    let hand = Hand {
        handoff: &cx.handoff,
        claims: &cx.claims,
        actions: &actions.names,
    };
    enqueue::enqueue_alone::<B>(&cx.db, e, Some(&hand))
}

/// One pass over a workspace's rules, if this engine holds (or can take) its
/// evaluator lease. The lease is checked (and renewed when due) before each
/// group of rules, so a workspace with many slow rules keeps it. With
/// `hand`, fresh runs go to this process's idle executors claimed at their
/// insert (`work::queue::handoff`): the started engine's evaluators do,
/// a drain does not (its executors are the caller's thread, never idle).
pub(crate) fn evaluate_step<B: Backend>(
    cx: &Context<B>,
    workspace: &str,
    hand: bool,
) -> Result<Pass> {
    let rules = cx.registry().rules_of(workspace);
    let name = evaluate::lease_name(workspace);
    let batch = cx.config.evaluate_batch;
    let actions = Arc::clone(&cx.registry().actions);
    let hand = hand.then(|| Hand {
        handoff: &cx.handoff,
        claims: &cx.claims,
        actions: &actions.names,
    });
    let lease = &mut || held_lease(cx, &name);
    match evaluate::pass::<B>(&cx.db, &rules, batch, lease, hand.as_ref()) {
        Err(e) if e.is_lease_lost() => {
            log::warn!("evaluating {workspace}: {e}");
            forget_lease(cx, &name);
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
pub(crate) fn follow_step<B: Backend>(cx: &Context<B>) -> Result<usize> {
    Ok(follow_turn(cx)?.0)
}

/// [`follow_step`], and whether the ledger has any follower (when it has
/// none, the follower thread need not wake for appends).
fn follow_turn<B: Backend>(cx: &Context<B>) -> Result<(usize, bool)> {
    let db = &cx.db;
    let rows = db.read_with(&mut |c| crate::store::Followers::follower_rows(c))?;
    let any = !rows.is_empty();
    let mut moved = 0;
    for row in rows {
        {
            let mut stopped = lock(&cx.stopped_followers);
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
        let projection = cx.registry().projections.get(&row.projection).cloned();
        let Some(projection) = projection else {
            continue; // another process (with the projection) relays for it
        };
        if let Some(pg) = &row.target_postgres
            && !cx.registers_pg_target(pg)
        {
            continue; // another process (with the target) relays for it
        }
        let name = follow::lease_name(&row.name);
        let now = db.now_ms();
        let not_before = lock(&cx.follower_retry).get(&row.name).copied();
        if not_before.is_some_and(|t| now < t) {
            continue;
        }
        let Some(lease) = held_lease(cx, &name)? else {
            let again = now + db.settings().lease_ttl_ms() / 3;
            lock(&cx.follower_retry).insert(row.name.clone(), again);
            continue;
        };
        let target = match (&row.target_file, &row.target_postgres) {
            (Some(path), _) => match target_db(cx, path) {
                Ok(t) => Some(t),
                Err(e) => {
                    stop_follower(cx, &row.name, row.restart_requests, &e);
                    let detail = e.to_string();
                    db.write_with(|tx| {
                        crate::store::Followers::follower_stopped(
                            tx.core(),
                            &row.name,
                            &detail,
                            tx.now_ms(),
                        )
                    })?;
                    continue;
                }
            },
            #[cfg(feature = "postgres")]
            (None, Some(pg)) => match pg_target_db(cx, pg) {
                Ok(t) => Some(t),
                Err(e) => {
                    // A hub out of reach is tried again: not a stop.
                    log::warn!("follower {}: its PostgreSQL target {pg}: {e}", row.name);
                    let again = now + db.settings().lease_ttl_ms() / 3;
                    lock(&cx.follower_retry).insert(row.name.clone(), again);
                    continue;
                }
            },
            _ => None,
        };
        match follow::step::<B>(db, &lease, &row, &*projection, target.as_deref()) {
            Ok(r) => {
                moved += r.moved;
                match r.stopped {
                    // A network target that failed for want of the network
                    // (or a busy server) is tried again, not stopped.
                    Some(e)
                        if row.target_postgres.is_some()
                            && matches!(e, Error::Io { .. } | Error::Busy { .. }) =>
                    {
                        log::warn!("follower {}: {e}; trying again", row.name);
                        let again = db.now_ms() + db.settings().lease_ttl_ms() / 3;
                        lock(&cx.follower_retry).insert(row.name.clone(), again);
                    }
                    Some(e) => stop_follower(cx, &row.name, row.restart_requests, &e),
                    None => {}
                }
            }
            Err(e) if e.is_lease_lost() => {
                log::warn!("follower {}: {e}", row.name);
                forget_lease(cx, &name);
            }
            // A read that failed: this follower tries again next turn; the
            // others go on.
            Err(e) => log::error!("follower {}: {e}", row.name),
        }
    }
    Ok((moved, any))
}

/// Stops a follower in this engine; `requests` is the ledger's count of
/// restart requests as read before the step (a request made since restarts
/// it).
fn stop_follower<B: Backend>(cx: &Context<B>, name: &str, requests: i64, e: &Error) {
    log::error!("follower {name} stopped: {e}; it starts again at its cursor when restarted");
    lock(&cx.stopped_followers).insert(name.to_string(), requests);
}

impl std::fmt::Debug for Hubs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hubs")
    }
}

/// A PostgreSQL target this process registered.
#[cfg(feature = "postgres")]
struct PgTarget {
    config: String,
    db: Option<Arc<Publish>>,
}

/// The PostgreSQL database a follower publishes into, connected once (its
/// schema applied) and kept.
#[cfg(feature = "postgres")]
fn pg_target_db<B: Backend>(cx: &Context<B>, name: &str) -> Result<Arc<Publish>> {
    let config = {
        let targets = lock(&cx.pg_targets);
        let target = targets
            .get(name)
            .ok_or_else(|| Error::not_found("postgres target", name))?;
        if let Some(db) = &target.db {
            return Ok(Arc::clone(db));
        }
        target.config.clone()
    };
    // Connected outside the lock: a server out of reach holds up nobody
    // else.
    let db = (cx.config.hubs.postgres)(cx.db.settings(), cx.db.clock(), &config)?;
    if let Some(t) = lock(&cx.pg_targets).get_mut(name) {
        t.db = Some(Arc::clone(&db));
    }
    Ok(db)
}

/// The file a cross-file follower publishes into, opened once. A missing
/// file is an error (a typo must not create an empty hub).
fn target_db<B: Backend>(cx: &Context<B>, path: &str) -> Result<Arc<Publish>> {
    let mut targets = lock(&cx.targets);
    if let Some(db) = targets.get(path) {
        return Ok(Arc::clone(db));
    }
    let db = (cx.config.hubs.file)(cx.db.settings(), cx.db.clock(), cx.db.vfs(), path)?;
    targets.insert(path.to_string(), Arc::clone(&db));
    Ok(db)
}

/// What one turn of the loop did.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoopPass {
    pub reacted: usize,
    pub scheduled: usize,
}

/// One turn of the loop — every reaction's next batch, every due job, and
/// pruning when due — if this engine holds (or can take) the loop lease.
pub(crate) fn loop_step<B: Backend>(cx: &Context<B>) -> Result<LoopPass> {
    let (reactions, jobs) = {
        let reg = cx.registry();
        let r: Vec<_> = reg.reactions.values().cloned().collect();
        let j: Vec<_> = reg.jobs.values().cloned().collect();
        (r, j)
    };
    let retention = cx.config.retention;
    if reactions.is_empty() && jobs.is_empty() && retention.is_none() {
        return Ok(LoopPass::default());
    }
    let Some(lease) = held_lease(cx, LOOP_LEASE)? else {
        return Ok(LoopPass::default());
    };
    let db = &cx.db;
    let mut pass = LoopPass::default();
    // Each reaction and job on its own: one that fails is logged (a
    // reaction's failure is also recorded on its cursor) and the others go
    // on. Only a lost lease ends the turn.
    let lost = |e: &Error| {
        log::warn!("the loop: {e}");
        forget_lease(cx, LOOP_LEASE);
    };
    // Paused reactions handle nothing; their cursors stay where they are.
    let paused = db.read_with(&mut |c| crate::work::control::paused_names(c, "reaction"))?;
    for r in reactions.iter().filter(|r| !paused.contains(&r.name)) {
        match reaction::step(db, &lease, r) {
            Ok(n) => pass.reacted += n,
            Err(e) if e.is_lease_lost() => {
                lost(&e);
                return Ok(pass);
            }
            Err(e) => log::error!("reaction {}: {e}", r.name),
        }
    }
    for j in &jobs {
        match schedule::step::<B>(db, &lease, j) {
            Ok(created) => pass.scheduled += usize::from(created),
            Err(e) if e.is_lease_lost() => {
                lost(&e);
                return Ok(pass);
            }
            Err(e) => log::error!("job {}: {e}", j.name),
        }
    }
    if let Some(retention) = retention {
        let now = db.now_ms();
        let due = {
            let mut last = lock(&cx.last_prune);
            let due = now - *last >= PRUNE_EVERY_MS;
            if due {
                *last = now;
            }
            due
        };
        if due {
            let pruned = prune::prune::<B>(&cx.db, &retention, &mut |_| {})?;
            if pruned != prune::Pruned::default() {
                log::info!("pruned {pruned:?}");
            }
        }
    }
    Ok(pass)
}

/// One executor's turn: runs what was handed to it, else claims and runs
/// what is due, up to a few batches. `place`: the executor thread's place
/// in the handoff (none for a drain, whose evaluations hand nothing).
pub(crate) fn execute_step<B: Backend>(
    cx: &Context<B>,
    place: Option<usize>,
    handed: Vec<Handed>,
) -> Result<Executed> {
    // What was handed to this executor since goes first too.
    let mut handed = handed;
    if let Some(i) = place {
        handed.extend(
            cx.handoff
                .take(i, execute::MAX_CLAIM.saturating_sub(handed.len())),
        );
    }
    let actions = Arc::clone(&cx.registry().actions);
    execute::execute::<B>(
        &cx.db,
        &actions,
        &cx.claims,
        &cx.pace,
        &cx.stop,
        cx.config.claim_batch,
        handed,
    )
}

/// Executor `place`'s thread: turns while there is work; with none, it
/// parks (its place free for the evaluators' handoff) and waits for a
/// nudge that runs were made, a heartbeat or a message in its place (a
/// run handed to it). A run handed and not run when the engine stops goes
/// back through one last turn, which starts nothing.
fn executor_loop<B: Backend>(cx: &Context<B>, place: usize) {
    // Runs made (and, while workflows may wait for one, events appended):
    // an append that made no run wakes no executor, and the one its firing
    // is handed to runs alone.
    let sub = cx.db.subscribe_to(Wake::RUNS);
    let heartbeat = cx.db.settings().heartbeat;
    let handoff = &cx.handoff;
    let mut handed: Vec<Handed> = Vec::new();
    loop {
        let stopping = cx.stop.load(Ordering::SeqCst);
        if stopping && handed.is_empty() {
            break;
        }
        match execute_step(cx, Some(place), std::mem::take(&mut handed)) {
            Ok(e) if e.claimed > 0 && !stopping => continue,
            Ok(_) => {}
            Err(e) => log::error!(
                "{}: {e}",
                std::thread::current().name().unwrap_or("executor")
            ),
        }
        if stopping {
            break;
        }
        handoff.park(place);
        let deadline = Instant::now() + heartbeat;
        loop {
            let got = sub.wait_or(heartbeat, deadline, handoff.receiver(place));
            // Err: its reservation ended without a run; still parked.
            if let Ok(run) = handoff.wake(place, got) {
                handed.extend(run);
                break;
            }
        }
    }
}

pub(crate) fn run_until_idle<B: Backend>(cx: &Context<B>) -> Result<Drained> {
    let mut total = Drained::default();
    let workspaces = cx.registry().workspaces_with_rules();
    loop {
        let mut progress = false;
        for ws in &workspaces {
            let p = evaluate_step(cx, ws, false)?;
            progress |= p.events > 0;
            total.add_pass(p);
        }
        loop {
            let f = follow_step(cx)?;
            total.followed += f;
            if f == 0 {
                break;
            }
            progress = true;
        }
        loop {
            let l = loop_step(cx)?;
            total.reacted += l.reacted;
            total.scheduled += l.scheduled;
            if l.reacted + l.scheduled == 0 {
                break;
            }
            progress = true;
        }
        loop {
            let e = execute_step(cx, None, Vec::new())?;
            total.add_executed(e);
            // Progress is a run settled; a claim given back is not.
            if e.succeeded + e.retried + e.dead + e.lost + e.cancelled == 0 {
                break;
            }
            progress = true;
        }
        if !progress {
            return Ok(total);
        }
    }
}

pub(crate) fn start<B: Backend>(cx: &Arc<Context<B>>) -> Result<()> {
    let mut slot = lock(&cx.threads);
    if slot.is_some() {
        return Err(Error::invalid("start", "the engine is already started"));
    }
    cx.stop.store(false, Ordering::SeqCst);
    let workspaces = cx.registry().workspaces_with_rules();
    let (stop_tx, stop_rx) = bounded::<()>(0);
    let mut handles = Vec::new();
    let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(Error::from)
    };
    for ws in workspaces {
        let c = Arc::clone(cx);
        handles.push(spawn(
            format!("reflexr-eval-{ws}"),
            Box::new(move || {
                worker_loop(&c, |c| {
                    Ok((evaluate_step(c, &ws, true)?.events > 0, Wake::EVENTS))
                })
            }),
        )?);
    }
    {
        let c = Arc::clone(cx);
        handles.push(spawn(
            "reflexr-loop".into(),
            Box::new(move || {
                worker_loop(&c, |c| {
                    let l = loop_step(c)?;
                    // Appends concern the loop only through its reactions;
                    // jobs and pruning come due by the clock.
                    let listen = if c.registry().reactions.is_empty() {
                        Wake::NONE
                    } else {
                        Wake::EVENTS
                    };
                    Ok((l.reacted + l.scheduled > 0, listen))
                })
            }),
        )?);
    }
    {
        let c = Arc::clone(cx);
        handles.push(spawn(
            "reflexr-follow".into(),
            Box::new(move || {
                worker_loop(&c, |c| {
                    let (moved, any) = follow_turn(c)?;
                    Ok((moved > 0, if any { Wake::EVENTS } else { Wake::NONE }))
                })
            }),
        )?);
    }
    for i in 0..cx.config.executors {
        let c = Arc::clone(cx);
        handles.push(spawn(
            format!("reflexr-exec-{i}"),
            Box::new(move || executor_loop(&c, i)),
        )?);
    }
    {
        let c = Arc::clone(cx);
        handles.push(spawn(
            "reflexr-renew".into(),
            Box::new(move || {
                // Checking costs a lock and a look at the clock; a write
                // happens only for claims due (a third of their TTL left).
                let tick = c.db.settings().heartbeat;
                while !c.stop.load(Ordering::SeqCst) {
                    if let Err(e) = execute::renew_claims(&c.db, &c.claims) {
                        log::error!("renewing claims: {e}");
                    }
                    // Returns at once when shutdown drops the sender.
                    let _ = stop_rx.recv_timeout(tick);
                }
            }),
        )?);
    }
    *slot = Some(Threads {
        handles,
        _stop: stop_tx,
    });
    Ok(())
}

/// Runs `step` while it finds work; when it finds none, waits for a
/// heartbeat or a nudge of the kind the step asked for (the evaluators,
/// the loop's reactions and the followers read the log: appends; nothing,
/// for a loop without reactions or a follower thread without followers),
/// or one that wakes everyone (a registration, another process's commit).
/// What else they do comes due by the clock.
fn worker_loop<B: Backend>(
    cx: &Context<B>,
    mut step: impl FnMut(&Context<B>) -> Result<(bool, Wake)>,
) {
    let sub = cx.db.subscribe_to(Wake::EVENTS);
    let heartbeat = cx.db.settings().heartbeat;
    while !cx.stop.load(Ordering::SeqCst) {
        match step(cx) {
            Ok((true, _)) => continue,
            Ok((false, listen)) => sub.listen(listen),
            Err(e) => {
                sub.listen(Wake::EVENTS);
                log::error!("{}: {e}", std::thread::current().name().unwrap_or("worker"));
            }
        }
        // Work may come due by the clock alone (a retry's backoff, a lease
        // to renew), so no wait is longer than a heartbeat.
        sub.wait(heartbeat, Instant::now() + heartbeat);
    }
}

/// Stops and joins the threads (if started), then releases the leases this
/// engine holds. The engine stays usable: [`run_until_idle`], [`start`].
pub(crate) fn shutdown<B: Backend>(cx: &Context<B>) {
    let services: Vec<_> = lock(&cx.services).drain(..).collect();
    for s in services.iter().filter_map(Weak::upgrade) {
        s.stop();
    }
    let threads = lock(&cx.threads).take();
    if let Some(Threads { handles, _stop }) = threads {
        cx.stop.store(true, Ordering::SeqCst);
        cx.db.nudge();
        drop(_stop);
        for t in handles {
            if t.join().is_err() {
                log::error!("a reflexr worker thread panicked");
            }
        }
        // Handed after the executors' last look: back, unstarted.
        let left = cx.handoff.take_all();
        if !left.is_empty()
            && let Err(e) = execute_step(cx, None, left)
        {
            log::warn!("giving back runs handed at shutdown: {e}");
        }
        cx.stop.store(false, Ordering::SeqCst);
    }
    release_leases(cx);
}

/// Gives back every lease this engine holds (the loop's, the evaluators',
/// the followers'), so another process takes over at once.
fn release_leases<B: Backend>(cx: &Context<B>) {
    let held: Vec<Lease> = lock(&cx.leases).drain().map(|(_, l)| l).collect();
    for l in held {
        if let Err(e) = cx
            .db
            .write_apart(|tx| lease::release(tx.core(), tx.now_ms(), &l))
        {
            log::warn!("releasing {}: {e}", l.name);
        }
    }
}
