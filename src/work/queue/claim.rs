//! The claim, the queue's hottest path: up to a batch of ready runs for an
//! executor, skipping paused actions and respecting each action's limits
//! (at most N running at once across every process, at most R starts per
//! period, each optionally per value of an input field), higher priorities
//! first whatever the action.

use std::collections::{BTreeMap, HashMap};

use crate::base::error::Result;
use crate::store::runs::RunRow;
use crate::store::{ClaimPlan, Control, Runs};
use crate::work::control::{ActionConfig, paused_names};
use crate::work::queue::pace::Caps;

/// Claims for executors whose actions are `actions`: up to `limit` runs,
/// skipping paused actions and respecting each action's limits, higher
/// priorities first whatever the action. At each priority that ready runs
/// have, each limited action takes up to its share of the batch (what its
/// limits allow, at most), the unlimited ones the rest in one statement,
/// and limited actions that took a full share whatever is still left. The
/// batch comes back by priority, then due time.
/// `plan` is what the claim read first ([`Control::claim_plan`]); `caps`
/// the most runs of each action this claim may take, whatever `limit`
/// allows ([`crate::work::queue::pace`]): an action under its cap is
/// claimed in a statement of its own.
#[allow(clippy::too_many_arguments)]
pub(crate) fn claim<C: Runs + Control + ?Sized>(
    conn: &C,
    plan: ClaimPlan,
    holder: &str,
    now: i64,
    expires_at: i64,
    limit: usize,
    actions: &[String],
    caps: &Caps,
) -> Result<Vec<RunRow>> {
    let paused = plan.paused;
    let limited: BTreeMap<String, ActionConfig> = plan
        .limited
        .into_iter()
        .map(|a| (a.action.clone(), ActionConfig::from(a)))
        .collect();
    let open: Vec<&String> = actions
        .iter()
        .filter(|a| !paused.contains(*a) && !limited.contains_key(*a))
        .collect();
    // The unlimited actions whose caps the batch cannot reach go in one
    // statement; the others one by one, each up to its cap.
    let wide: Vec<String> = open
        .iter()
        .filter(|a| caps.of(a) >= limit)
        .map(|a| (*a).clone())
        .collect();
    let narrow: Vec<String> = open
        .iter()
        .filter(|a| caps.of(a) < limit)
        .map(|a| (*a).clone())
        .collect();
    let mut limits = Vec::new();
    for (action, c) in &limited {
        if !paused.contains(action) {
            limits.push(Limited::load(conn, action, c, now)?);
        }
    }
    if open.is_empty() && limits.is_empty() {
        return Ok(Vec::new());
    }
    // What each action may still take in this claim, across priorities.
    let mut left: HashMap<String, usize> =
        actions.iter().map(|a| (a.clone(), caps.of(a))).collect();
    let left_of = |left: &HashMap<String, usize>, a: &str| left.get(a).copied().unwrap_or(0);
    let mut rows = Vec::new();
    for priority in plan.priorities {
        if rows.len() >= limit {
            break;
        }
        // Each limited action first takes up to its share of what is left
        // (so one with a backlog does not crowd the rest of this priority
        // out), then the unlimited ones, then the limited ones that took a
        // full share whatever is still left.
        let parts = limits.len() + narrow.len() + usize::from(!wide.is_empty());
        let share = (limit - rows.len()).div_ceil(parts.max(1));
        let mut hungry = Vec::new();
        for (i, l) in limits.iter_mut().enumerate() {
            let room = share.min(limit - rows.len());
            let want = room.min(left_of(&left, l.action));
            if want == 0 {
                continue;
            }
            let got = l.claim(conn, holder, now, expires_at, priority, want)?;
            if got.len() == room {
                hungry.push(i);
            }
            if let Some(n) = left.get_mut(l.action) {
                *n -= got.len();
            }
            rows.extend(got);
        }
        for action in &narrow {
            let want = left_of(&left, action).min(limit - rows.len());
            if want == 0 {
                continue;
            }
            let got = Runs::claim_at(
                conn,
                holder,
                now,
                expires_at,
                want as i64,
                std::slice::from_ref(action),
                priority,
            )?;
            if let Some(n) = left.get_mut(action) {
                *n -= got.len();
            }
            rows.extend(got);
        }
        if !wide.is_empty() && rows.len() < limit {
            let want = i64::try_from(limit - rows.len()).unwrap_or(i64::MAX);
            rows.extend(Runs::claim_at(
                conn, holder, now, expires_at, want, &wide, priority,
            )?);
        }
        for i in hungry {
            let l = &mut limits[i];
            let want = (limit - rows.len()).min(left_of(&left, l.action));
            if want == 0 {
                continue;
            }
            let got = l.claim(conn, holder, now, expires_at, priority, want)?;
            if let Some(n) = left.get_mut(l.action) {
                *n -= got.len();
            }
            rows.extend(got);
        }
    }
    for l in &limits {
        l.record_starts(conn, now)?;
    }
    rows.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.due_at, r.ord));
    Ok(rows)
}

/// One limited action during a claim: what each partition may still start
/// (running slots and rate tokens, the smaller), counted from the file.
struct Limited<'a> {
    action: &'a str,
    config: &'a ActionConfig,
    path: Option<String>,
    running: HashMap<String, i64>,
    started: HashMap<String, i64>,
    /// Partition → what it may still start in this claim.
    room: HashMap<String, i64>,
    /// Partitions with no room left (a JSON array's items).
    full: Vec<String>,
    /// Partition → runs picked in this claim (the rate's starts).
    picked: BTreeMap<String, i64>,
}

impl<'a> Limited<'a> {
    /// A candidate page holds this many runs per run wanted (at least
    /// [`Limited::MIN_PAGE`]), and a claim reads at most
    /// [`Limited::MAX_PAGES`] pages of an action at one priority: each page
    /// after the first skips the partitions the last one filled, so a
    /// partition's backlog never hides another partition's runs for long.
    const PAGE_FACTOR: usize = 4;
    const MIN_PAGE: usize = 16;
    const MAX_PAGES: usize = 8;

    fn load<C: Control + ?Sized>(
        conn: &C,
        action: &'a str,
        config: &'a ActionConfig,
        now: i64,
    ) -> Result<Self> {
        let path = config.path();
        Control::lock_limits(conn, action)?;
        let running = Control::running_by(conn, action, path.as_deref())?
            .into_iter()
            .collect();
        let started = match config.rate {
            Some((_, period)) => Control::starts_since(conn, action, now.saturating_sub(period))?
                .into_iter()
                .collect(),
            None => HashMap::new(),
        };
        Ok(Limited {
            action,
            config,
            path,
            running,
            started,
            room: HashMap::new(),
            full: Vec::new(),
            picked: BTreeMap::new(),
        })
    }

    /// What `part` may start, before this claim's picks.
    fn allowance(&self, part: &str) -> i64 {
        let c = self.config;
        let slots = c.max_running.map_or(i64::MAX, |m| {
            i64::from(m) - self.running.get(part).copied().unwrap_or(0)
        });
        let tokens = c.rate.map_or(i64::MAX, |(n, _)| {
            i64::from(n) - self.started.get(part).copied().unwrap_or(0)
        });
        slots.min(tokens)
    }

    /// Claims up to `want` ready, due runs at `priority` that the limits
    /// allow, counted against them. Without a partition there is one: the
    /// claim takes exactly what it may start, in one statement; with one,
    /// candidates are picked partition by partition ([`Limited::pick`]).
    fn claim<C: Runs + Control + ?Sized>(
        &mut self,
        conn: &C,
        holder: &str,
        now: i64,
        expires_at: i64,
        priority: i64,
        want: usize,
    ) -> Result<Vec<RunRow>> {
        if self.path.is_none() {
            let allowance = self.allowance("");
            let left = self.room.entry(String::new()).or_insert(allowance);
            let n = usize::try_from((*left).max(0)).unwrap_or(0).min(want);
            if n == 0 {
                return Ok(Vec::new());
            }
            let names = [self.action.to_string()];
            let rows = Runs::claim_at(conn, holder, now, expires_at, n as i64, &names, priority)?;
            *left -= rows.len() as i64;
            *self.picked.entry(String::new()).or_default() += rows.len() as i64;
            return Ok(rows);
        }
        let path = self.path.clone().unwrap_or_default();
        let picked = self.pick(conn, now, priority, &path, want)?;
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        Control::claim_ords(conn, holder, now, expires_at, &picked)
    }

    /// Up to `want` ready, due runs at `priority` that the limits of a
    /// partitioned action allow (their positions), counted against them:
    /// pages of candidates, each leaving out the partitions already full.
    fn pick<C: Control + ?Sized>(
        &mut self,
        conn: &C,
        now: i64,
        priority: i64,
        path: &str,
        want: usize,
    ) -> Result<Vec<i64>> {
        let mut picked = Vec::new();
        let page = want.saturating_mul(Self::PAGE_FACTOR).max(Self::MIN_PAGE);
        let mut after = (i64::MIN, i64::MIN);
        for _ in 0..Self::MAX_PAGES {
            let found = Control::candidates(
                conn,
                self.action,
                now,
                priority,
                path,
                &self.full,
                after,
                page,
            )?;
            for (ord, due_at, part) in &found {
                after = (*due_at, *ord);
                if picked.len() >= want {
                    break;
                }
                let allowance = self.allowance(part);
                let left = self.room.entry(part.clone()).or_insert(allowance);
                if *left > 0 {
                    *left -= 1;
                    picked.push(*ord);
                    *self.picked.entry(part.clone()).or_default() += 1;
                }
                if *left <= 0 && !self.full.contains(part) {
                    self.full.push(part.clone());
                }
            }
            if picked.len() >= want || found.len() < page {
                break;
            }
        }
        Ok(picked)
    }

    /// Records this claim's starts for a rate-limited action: one row per
    /// partition and claim, so the window's cost grows with claims, not runs.
    fn record_starts<C: Control + ?Sized>(&self, conn: &C, now: i64) -> Result<()> {
        if self.config.rate.is_none() {
            return Ok(());
        }
        for (part, n) in &self.picked {
            Control::record_starts(conn, self.action, part, now, *n)?;
        }
        Ok(())
    }
}

/// Whether `actions` have work an executor could claim now: a ready, due
/// run of an action that is not paused (limits are the claim's to judge).
pub(crate) fn work_due<C: Control + crate::store::Steps + ?Sized>(
    conn: &C,
    now: i64,
    actions: &[String],
) -> Result<bool> {
    let paused = paused_names(conn, "action")?;
    let open: Vec<&String> = actions.iter().filter(|a| !paused.contains(*a)).collect();
    let due = if open.is_empty() {
        Control::lapsed_due(conn, now)?
    } else {
        Control::work_due(conn, now, &open)?
    };
    // Events appended that waiting workflows may be waiting for: the
    // claim's transaction matches them.
    Ok(due || crate::store::Steps::waits_behind(conn)?)
}
