//! Control of the work as the claim reads it: pauses, each action's limits and what counts against them.
//!
//! The table group every backend implements (`store::sqlite::control`,
//! `store::postgres::control`), and the rows it speaks in.

use std::collections::HashSet;

use crate::base::error::Result;
use crate::store::runs::{Inserted, NewRun, RunRow};
use crate::store::{Cursors, Leases, Runs};

/// A pause as stored: kind, name, since, operator, reason.
pub type PausedRow = (String, String, i64, String, String);

/// An action's settings as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRow {
    pub action: String,
    pub priority: i64,
    pub max_running: Option<u32>,
    pub rate_count: Option<u32>,
    pub rate_period_ms: Option<i64>,
    pub partition_by: Option<String>,
    /// Claims serve its keys in turn.
    pub fair: bool,
}

impl ActionRow {
    /// Whether its runs have keys (limits count per key).
    pub fn keyed(&self) -> bool {
        self.fair || self.partition_by.is_some()
    }
}

/// One key's overrides of its action's settings, as stored (a `None` keeps
/// the action's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub action: String,
    pub key: String,
    pub max_running: Option<u32>,
    pub rate_count: Option<u32>,
    pub rate_period_ms: Option<i64>,
    pub weight: Option<u32>,
    pub updated_at: i64,
}

/// A fair action's virtual clock and the keys ahead of it, with their passes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FairState {
    pub clock: f64,
    pub passes: Vec<(String, f64)>,
}

/// What a claim reads before it picks runs (see [`Control::claim_plan`]).
#[derive(Debug, Default)]
pub struct ClaimPlan {
    /// The actions paused.
    pub paused: HashSet<String>,
    /// The settings of the claimer's actions that have a limit.
    pub limited: Vec<ActionRow>,
    /// The priorities ready runs have, highest first.
    pub priorities: Vec<i64>,
    /// Whether a claim lapsed at `now`.
    pub lapsed: bool,
}

/// What [`Control::fenced_stand`] read under a lease still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedStand {
    /// The cursor's position and the stamp of its last change; None if it
    /// was never saved.
    pub stand: Option<(i64, i64)>,
    /// Whether the consumer is paused (false when not asked).
    pub paused: bool,
}

/// Control of the work as the claim reads it: pauses, each action's
/// limits and what counts against them (`store::control`, `store::runs`);
/// and what a consumer's commit checks before it writes (its lease, its
/// cursor, its pause).
pub trait Control: Leases + Cursors {
    /// What a claim for `actions` reads first, at `now`: by default one
    /// statement each; a backend a round trip away reads them in one.
    fn claim_plan(&self, now: i64, actions: &[String]) -> Result<ClaimPlan> {
        Ok(ClaimPlan {
            paused: self.paused_names("action")?,
            limited: self.limited(actions)?,
            priorities: self.ready_priorities()?,
            lapsed: self.lapsed_due(now)?,
        })
    }
    /// Where each of the consumers `names` (of `workspace`, of `kind`)
    /// stands, for a pass over them, in the order of `names`: `None` for
    /// one paused (`(kind, name)`), else its cursor's position and stamp
    /// (if it was ever saved) and its high water
    /// ([`Cursors::stamped_and_high_water`]). By default a statement for
    /// the pauses and one per cursor; a backend a round trip away reads
    /// them all in one.
    #[allow(clippy::type_complexity)]
    fn stands(
        &self,
        workspace: &str,
        kind: &str,
        names: &[&str],
    ) -> Result<Vec<Option<(Option<(i64, i64)>, i64)>>> {
        let paused = self.paused_names(kind)?;
        names
            .iter()
            .map(|name| {
                if paused.contains(*name) {
                    return Ok(None);
                }
                self.stamped_and_high_water(workspace, kind, name).map(Some)
            })
            .collect()
    }
    /// What a consumer's commit checks first, in the order it checks it:
    /// `None` when `lease` (name, holder, generation) is not held at `now`;
    /// else where the cursor `(workspace, kind, name)` stands (its
    /// position and stamp, if it was ever saved) and, if `pausable`,
    /// whether `(kind, name)` is paused. By default one statement each; a
    /// backend a round trip away reads them in one.
    #[allow(clippy::too_many_arguments)]
    fn fenced_stand(
        &self,
        lease: (&str, &str, i64),
        now: i64,
        workspace: &str,
        kind: &str,
        name: &str,
        pausable: bool,
    ) -> Result<Option<FencedStand>> {
        let (lease, holder, generation) = lease;
        if !self.is_held(lease, holder, generation, now)? {
            return Ok(None);
        }
        Ok(Some(FencedStand {
            stand: self.get_stamped(workspace, kind, name)?,
            paused: pausable && self.is_paused(kind, name)?,
        }))
    }
    /// Whether a fresh run of `action` may be claimed at its insert for an
    /// idle executor: the action is neither paused nor limited (a limited
    /// action's runs go through the claim, which counts them).
    fn may_hand_over(&self, action: &str) -> Result<bool> {
        Ok(!self.is_paused("action", action)? && self.limited(&[action.to_string()])?.is_empty())
    }
    /// The names of this kind (`action`, `rule`, `reaction`) paused.
    fn paused_names(&self, kind: &str) -> Result<HashSet<String>>;
    /// Whether `(kind, name)` is paused.
    fn is_paused(&self, kind: &str, name: &str) -> Result<bool>;
    /// Pauses `(kind, name)`; false when it was paused already.
    #[allow(clippy::too_many_arguments)]
    fn pause(&self, kind: &str, name: &str, now: i64, operator: &str, reason: &str)
    -> Result<bool>;
    /// Resumes `(kind, name)`; false when it was not paused.
    fn resume(&self, kind: &str, name: &str) -> Result<bool>;
    /// Everything paused, by kind and name.
    fn paused(&self) -> Result<Vec<PausedRow>>;
    /// Sets an action's settings, replacing what it had (its fair clock
    /// stays). `key_path` is the JSON path of `partition_by`.
    fn configure_action(&self, a: &ActionRow, key_path: Option<&str>, now: i64) -> Result<()>;
    /// Gives the unfinished runs of `action` that have no key the input's
    /// value at `key_path` (`""` when missing; every run `""` without a
    /// path): the action became keyed.
    fn key_runs(&self, action: &str, key_path: Option<&str>) -> Result<usize>;
    /// One action's settings.
    fn action_row(&self, action: &str) -> Result<Option<ActionRow>>;
    /// Sets (replacing) one key's overrides.
    fn set_key_row(&self, k: &KeyRow) -> Result<()>;
    /// Deletes one key's overrides; false when it had none.
    fn delete_key_row(&self, action: &str, key: &str) -> Result<bool>;
    /// The overrides of `action`'s keys (every action's with `None`), by
    /// action and key.
    fn key_rows(&self, action: Option<&str>) -> Result<Vec<KeyRow>>;
    /// Each key of `action` with ready runs at `priority`, with the
    /// position of its oldest one if that is due at `now` (keys whose oldest
    /// ready run is not due are left out): one index seek per key.
    fn fair_heads(&self, action: &str, priority: i64, now: i64) -> Result<Vec<(String, i64)>>;
    /// Up to `limit` ready runs of `action`'s `key` at `priority` due at
    /// `now`, oldest first: their positions.
    fn key_ords(
        &self,
        action: &str,
        key: &str,
        priority: i64,
        now: i64,
        limit: usize,
    ) -> Result<Vec<i64>>;
    /// A fair action's clock and passes.
    fn fair_state(&self, action: &str) -> Result<FairState>;
    /// Writes a fair action's clock and the passes of the keys a claim
    /// served, and deletes the passes the clock reached.
    fn save_fair(&self, action: &str, clock: f64, passes: &[(String, f64)]) -> Result<()>;
    /// How many runs of `action` each key has, by state: `(key, state,
    /// runs)` for the unfinished states.
    fn key_counts(&self, action: &str) -> Result<Vec<(String, String, i64)>>;
    /// Every action's settings, by name.
    fn action_rows(&self) -> Result<Vec<ActionRow>>;
    /// The settings of those of `actions` that have a limit.
    fn limited(&self, actions: &[String]) -> Result<Vec<ActionRow>>;
    /// The priorities ready runs have, highest first.
    fn ready_priorities(&self) -> Result<Vec<i64>>;
    /// One page of ready, due runs of a keyed `action` at `priority` after
    /// `after` (`(due_at, ord)`): `(ord, due_at, key)`, those of the keys in
    /// `full` left out.
    #[allow(clippy::too_many_arguments)]
    fn candidates(
        &self,
        action: &str,
        now: i64,
        priority: i64,
        full: &[String],
        after: (i64, i64),
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>>;
    /// Claims the run `id` if it is ready: a run this transaction inserted,
    /// claimed for an executor of this process at its insert (the handoff),
    /// so no other transaction can hold it.
    fn claim_fresh(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        id: &str,
    ) -> Result<Option<RunRow>>;
    /// Claims the run `id` of `action`, just inserted, for an idle
    /// executor (as [`Control::claim_fresh`]) if the action may be handed
    /// over ([`Control::may_hand_over`]): whether it may, and the run if it
    /// was ready and is now claimed. By default the two in turn; a backend
    /// a round trip away does both in one statement.
    fn hand_over_fresh(
        &self,
        action: &str,
        holder: &str,
        now: i64,
        expires_at: i64,
        id: &str,
    ) -> Result<(bool, Option<RunRow>)> {
        if !self.may_hand_over(action)? {
            return Ok((false, None));
        }
        Ok((true, self.claim_fresh(holder, now, expires_at, id)?))
    }
    /// [`insert_handed`] in one statement, where this backend has one for
    /// `run` (on PostgreSQL, a run that holds no key and is not dead, with
    /// or without a lane); `None`: it has none, and nothing was written.
    /// None by default.
    fn insert_handed_at_once(
        &self,
        _run: &NewRun<'_>,
        _holder: &str,
        _expires_at: i64,
    ) -> Result<Option<(Inserted, bool, Option<RunRow>)>> {
        Ok(None)
    }
    /// Claims the ready runs at these positions.
    fn claim_ords(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        ords: &[i64],
    ) -> Result<Vec<RunRow>>;
    /// Makes the claims of a limited action take turns until this
    /// transaction ends, so what it counts next (running runs, starts) is
    /// what the others committed. Nothing to do where one writer takes
    /// every claim in turn (SQLite).
    fn lock_limits(&self, _action: &str) -> Result<()> {
        Ok(())
    }
    /// How many runs of `action` run now, by key when `keyed` (else one
    /// group, `""`).
    fn running_by(&self, action: &str, keyed: bool) -> Result<Vec<(String, i64)>>;
    /// Starts of `action` after `since`, by key; those at or before
    /// `forget` are deleted.
    fn starts_since(&self, action: &str, since: i64, forget: i64) -> Result<Vec<(String, i64)>>;
    /// Starts of `action`'s `key` after `since`.
    fn key_starts_since(&self, action: &str, key: &str, since: i64) -> Result<i64>;
    /// Records `n` starts of a rate-limited action's partition at `at`.
    fn record_starts(&self, action: &str, part: &str, at: i64, n: i64) -> Result<()>;
    /// Whether a run of `actions` is ready and due, or a claim lapsed.
    fn work_due(&self, now: i64, actions: &[&String]) -> Result<bool>;
    /// An idle executor's whole look (`work::queue::claim::work_due`) in
    /// one statement, where this backend has one: whether `actions` have
    /// work an executor could claim at `now` (a ready, due run of an
    /// action not paused, a lapsed claim, or events a waiting workflow has
    /// not seen), and whether any workflow waits for an event. `None` by
    /// default: the look's reads one after another.
    fn work_due_at_once(&self, _now: i64, _actions: &[String]) -> Result<Option<(bool, bool)>> {
        Ok(None)
    }
    /// Whether a claim lapsed.
    fn lapsed_due(&self, now: i64) -> Result<bool>;
    /// Deletes uniqueness periods that ended and starts outside every rate
    /// window at `now`; how many rows went.
    fn sweep_control(&self, now: i64) -> Result<usize>;
}

/// Inserts a run (as [`Runs::insert`]) and, if it inserted it, hands it
/// over to an idle executor under `holder` until `expires_at` (as
/// [`Control::hand_over_fresh`], at the run's `now`): what the insert did,
/// whether the action may be handed over, and the run if it was ready and
/// is now claimed. In one statement where the backend has one
/// ([`Control::insert_handed_at_once`]), else the two in turn (an id there
/// already, or a key another run holds, hands nothing over). The run is
/// due at its insert: the claim does not look at when it is due.
pub(crate) fn insert_handed<C: Control + Runs + ?Sized>(
    c: &C,
    run: &NewRun<'_>,
    holder: &str,
    expires_at: i64,
) -> Result<(Inserted, bool, Option<RunRow>)> {
    if let Some(done) = c.insert_handed_at_once(run, holder, expires_at)? {
        return Ok(done);
    }
    let inserted = Runs::insert(c, run)?;
    if inserted != Inserted::New {
        return Ok((inserted, c.may_hand_over(run.action)?, None));
    }
    let (may, claimed) = c.hand_over_fresh(run.action, holder, run.now, expires_at, run.id)?;
    Ok((inserted, may, claimed))
}
