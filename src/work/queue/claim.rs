//! The claim, the queue's hottest path: up to a batch of ready runs for an
//! executor, skipping paused actions and respecting each action's limits
//! (at most N running at once across every process, at most R starts per
//! period, each optionally per value of an input field), higher priorities
//! first whatever the action.

use std::collections::{BTreeMap, HashMap};

use crate::base::error::Result;
use crate::store::control::FairState;
use crate::store::runs::RunRow;
use crate::store::{ClaimPlan, Control, Runs};
use crate::work::control::{ActionConfig, KeyLimits, paused_names};
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
    // A keyed action's runs → their place in the order it picked them at
    // their priority.
    let mut ranked: HashMap<i64, usize> = HashMap::new();
    let mut picks: HashMap<(String, i64), usize> = HashMap::new();
    let mut rank = |ranked: &mut HashMap<i64, usize>, action: &str, got: &[RunRow]| {
        for r in got {
            let n = picks.entry((action.to_string(), r.priority)).or_default();
            ranked.insert(r.ord, *n);
            *n += 1;
        }
    };
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
            if l.keyed {
                rank(&mut ranked, l.action, &got);
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
            if l.keyed {
                rank(&mut ranked, l.action, &got);
            }
            if let Some(n) = left.get_mut(l.action) {
                *n -= got.len();
            }
            rows.extend(got);
        }
    }
    for l in &limits {
        l.record(conn, now)?;
    }
    // By priority; within one, the runs of the unordered statements by due
    // time, interleaved with each keyed action's in the order it picked
    // them (a fair action's turns stay in turn when the batch is cut).
    let mut unordered: Vec<&RunRow> = rows
        .iter()
        .filter(|r| !ranked.contains_key(&r.ord))
        .collect();
    unordered.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.due_at, r.ord));
    let mut rank_of: HashMap<i64, usize> = ranked;
    let mut at = (i64::MIN, 0usize);
    for r in unordered {
        if r.priority != at.0 {
            at = (r.priority, 0);
        }
        rank_of.insert(r.ord, at.1);
        at.1 += 1;
    }
    rows.sort_by_key(|r| {
        (
            std::cmp::Reverse(r.priority),
            rank_of.get(&r.ord).copied().unwrap_or(usize::MAX),
            r.due_at,
            r.ord,
        )
    });
    Ok(rows)
}

/// One limited, keyed or fair action during a claim: what each key may
/// still start (running slots and rate tokens, the smaller, from its
/// overrides or the action's limits), counted from the file; for a fair
/// action, its keys' passes.
struct Limited<'a> {
    action: &'a str,
    config: &'a ActionConfig,
    keyed: bool,
    /// Key → its overrides.
    overrides: HashMap<String, KeyLimits>,
    running: HashMap<String, i64>,
    /// Key → starts in the action's rate window.
    started: HashMap<String, i64>,
    /// Key → starts in the key's own rate window (keys with a rate of
    /// their own).
    key_started: HashMap<String, i64>,
    /// Key → what it may still start in this claim.
    room: HashMap<String, i64>,
    /// Keys with no room left.
    full: Vec<String>,
    /// Key → runs picked in this claim (the rate's starts).
    picked: BTreeMap<String, i64>,
    /// A fair action's clock and passes, once read; written back after.
    fair: Option<FairState>,
    /// Whether this claim served a fair key (its passes are to be written).
    fair_moved: bool,
}

/// A pass in a fair claim's queue of keys: lowest first, then the key's
/// oldest run.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Turn {
    pass: f64,
    head: i64,
    slot: usize,
}

impl Eq for Turn {}

impl Ord for Turn {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: the std heap is a max-heap, this queue serves the least.
        other
            .pass
            .total_cmp(&self.pass)
            .then(other.head.cmp(&self.head))
            .then(other.slot.cmp(&self.slot))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One key in a fair claim: what it has ready (the positions read so
/// far), how many this claim took, its weight.
struct FairKey {
    key: String,
    ords: Vec<i64>,
    /// Whether `ords` holds every ready, due run it has at this priority.
    all: bool,
    taken: usize,
    weight: f64,
}

impl<'a> Limited<'a> {
    /// A candidate page holds this many runs per run wanted (at least
    /// [`Limited::MIN_PAGE`]), and a claim reads at most
    /// [`Limited::MAX_PAGES`] pages of an action at one priority: each page
    /// after the first skips the keys the last one filled, so a key's
    /// backlog never hides another key's runs for long.
    const PAGE_FACTOR: usize = 4;
    const MIN_PAGE: usize = 16;
    const MAX_PAGES: usize = 8;

    fn load<C: Control + ?Sized>(
        conn: &C,
        action: &'a str,
        config: &'a ActionConfig,
        now: i64,
    ) -> Result<Self> {
        let keyed = config.keyed();
        Control::lock_limits(conn, action)?;
        let overrides: HashMap<String, KeyLimits> = if keyed {
            Control::key_rows(conn, Some(action))?
                .into_iter()
                .map(|k| (k.key.clone(), KeyLimits::from(k)))
                .collect()
        } else {
            HashMap::new()
        };
        let running = Control::running_by(conn, action, keyed)?
            .into_iter()
            .collect();
        // Starts are kept for the longest window of the action and its keys.
        let longest = overrides
            .values()
            .filter_map(|k| k.rate.map(|r| r.1))
            .chain(config.rate.map(|r| r.1))
            .max();
        let started = match longest {
            Some(longest) => {
                let since = now.saturating_sub(config.rate.map_or(longest, |r| r.1));
                Control::starts_since(conn, action, since, now.saturating_sub(longest))?
                    .into_iter()
                    .collect()
            }
            None => HashMap::new(),
        };
        let mut key_started = HashMap::new();
        for k in overrides.values() {
            if let Some((_, period)) = k.rate {
                let n =
                    Control::key_starts_since(conn, action, &k.key, now.saturating_sub(period))?;
                key_started.insert(k.key.clone(), n);
            }
        }
        Ok(Limited {
            action,
            config,
            keyed,
            overrides,
            running,
            started,
            key_started,
            room: HashMap::new(),
            full: Vec::new(),
            picked: BTreeMap::new(),
            fair: None,
            fair_moved: false,
        })
    }

    /// The rate that holds for `key`, and whether it is the key's own.
    fn rate_of(&self, key: &str) -> Option<((u32, i64), bool)> {
        match self.overrides.get(key).and_then(|k| k.rate) {
            Some(r) => Some((r, true)),
            None => self.config.rate.map(|r| (r, false)),
        }
    }

    /// What `key` may start, before this claim's picks.
    fn allowance(&self, key: &str) -> i64 {
        let max_running = self
            .overrides
            .get(key)
            .and_then(|k| k.max_running)
            .or(self.config.max_running);
        let slots = max_running.map_or(i64::MAX, |m| {
            i64::from(m) - self.running.get(key).copied().unwrap_or(0)
        });
        let tokens = self.rate_of(key).map_or(i64::MAX, |((n, _), own)| {
            let used = if own {
                self.key_started.get(key)
            } else {
                self.started.get(key)
            };
            i64::from(n) - used.copied().unwrap_or(0)
        });
        slots.min(tokens)
    }

    /// What `key` may still start in this claim.
    fn room_of(&mut self, key: &str) -> i64 {
        if let Some(r) = self.room.get(key) {
            return *r;
        }
        let r = self.allowance(key);
        self.room.insert(key.to_string(), r);
        r
    }

    /// Counts one pick of `key` against its limits.
    fn take(&mut self, key: &str) {
        let left = self.room_of(key) - 1;
        self.room.insert(key.to_string(), left);
        *self.picked.entry(key.to_string()).or_default() += 1;
        if left <= 0 && !self.full.iter().any(|f| f == key) {
            self.full.push(key.to_string());
        }
    }

    /// Claims up to `want` ready, due runs at `priority` that the limits
    /// allow, counted against them, in the order the claim picked them.
    /// Without keys there is one count: the claim takes exactly what it may
    /// start, in one statement; with keys, candidates are picked key by key
    /// ([`Limited::pick`]), and a fair action's in turn ([`Limited::pick_fair`]).
    fn claim<C: Runs + Control + ?Sized>(
        &mut self,
        conn: &C,
        holder: &str,
        now: i64,
        expires_at: i64,
        priority: i64,
        want: usize,
    ) -> Result<Vec<RunRow>> {
        if !self.keyed {
            let left = self.room_of("");
            let n = usize::try_from(left.max(0)).unwrap_or(0).min(want);
            if n == 0 {
                return Ok(Vec::new());
            }
            let names = [self.action.to_string()];
            let mut rows =
                Runs::claim_at(conn, holder, now, expires_at, n as i64, &names, priority)?;
            rows.sort_by_key(|r| (r.due_at, r.ord));
            self.room.insert(String::new(), left - rows.len() as i64);
            *self.picked.entry(String::new()).or_default() += rows.len() as i64;
            return Ok(rows);
        }
        let picked = if self.config.fair {
            self.pick_fair(conn, now, priority, want)?
        } else {
            self.pick(conn, now, priority, want)?
        };
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let rank: HashMap<i64, usize> = picked.iter().enumerate().map(|(i, o)| (*o, i)).collect();
        // In the table's order: the rows' pages are visited once each.
        let mut picked = picked;
        picked.sort_unstable();
        let mut rows = Control::claim_ords(conn, holder, now, expires_at, &picked)?;
        rows.sort_by_key(|r| rank.get(&r.ord).copied().unwrap_or(usize::MAX));
        Ok(rows)
    }

    /// Up to `want` ready, due runs at `priority` that the limits of a
    /// keyed action allow (their positions), counted against them: pages
    /// of candidates by due time, each leaving out the keys already full.
    fn pick<C: Control + ?Sized>(
        &mut self,
        conn: &C,
        now: i64,
        priority: i64,
        want: usize,
    ) -> Result<Vec<i64>> {
        let mut picked = Vec::new();
        let page = want.saturating_mul(Self::PAGE_FACTOR).max(Self::MIN_PAGE);
        let mut after = (i64::MIN, i64::MIN);
        for _ in 0..Self::MAX_PAGES {
            let found =
                Control::candidates(conn, self.action, now, priority, &self.full, after, page)?;
            for (ord, due_at, key) in &found {
                after = (*due_at, *ord);
                if picked.len() >= want {
                    break;
                }
                if self.room_of(key) > 0 {
                    self.take(key);
                    picked.push(*ord);
                } else if !self.full.contains(key) {
                    self.full.push(key.clone());
                }
            }
            if picked.len() >= want || found.len() < page {
                break;
            }
        }
        Ok(picked)
    }

    /// Up to `want` ready, due runs at `priority` of a fair action, in turn
    /// by key (start-time fair queuing): each key with a due run starts at
    /// its pass, or at the action's clock if it is behind it (so a key that
    /// had nothing ready does not come back with credit); the key with the
    /// lowest pass gives its oldest run, the clock moves to that pass, and
    /// the key's pass grows by 1 / its weight. While two keys both have
    /// runs ready, the runs served to each, over their weights, differ by
    /// at most one at any point of the order — across claims and processes,
    /// which take turns on the passes in the file. Keys the limits hold are
    /// passed over and keep their pass. One index seek per key with ready
    /// runs finds the keys; a key given more than one run in this claim
    /// reads its next runs in one more statement.
    fn pick_fair<C: Control + ?Sized>(
        &mut self,
        conn: &C,
        now: i64,
        priority: i64,
        want: usize,
    ) -> Result<Vec<i64>> {
        let heads = Control::fair_heads(conn, self.action, priority, now)?;
        if heads.is_empty() || want == 0 {
            return Ok(Vec::new());
        }
        if self.fair.is_none() {
            self.fair = Some(Control::fair_state(conn, self.action)?);
        }
        let state = self.fair.take().unwrap_or_default();
        let mut clock = state.clock;
        let mut passes: HashMap<String, f64> = state.passes.into_iter().collect();
        let mut keys: Vec<FairKey> = Vec::with_capacity(heads.len());
        let mut queue = std::collections::BinaryHeap::with_capacity(heads.len());
        let mut total_weight = 0.0;
        for (key, head) in heads {
            if self.room_of(&key) <= 0 {
                continue;
            }
            let weight = f64::from(
                self.overrides
                    .get(&key)
                    .and_then(|k| k.weight)
                    .unwrap_or(1)
                    .max(1),
            );
            total_weight += weight;
            let pass = passes.get(&key).copied().unwrap_or(clock).max(clock);
            queue.push(Turn {
                pass,
                head,
                slot: keys.len(),
            });
            keys.push(FairKey {
                key,
                ords: vec![head],
                all: false,
                taken: 0,
                weight,
            });
        }
        let mut picked = Vec::new();
        while picked.len() < want {
            let Some(turn) = queue.pop() else { break };
            let k = &mut keys[turn.slot];
            if k.taken == k.ords.len() && !k.all {
                // Its next runs: about its share of what is left, at once.
                let left = (want - picked.len()) as f64;
                let share = (left * k.weight / total_weight.max(1.0)).ceil() as usize + 1;
                let limit = k.taken + share.min(want - picked.len());
                k.ords = Control::key_ords(conn, self.action, &k.key, priority, now, limit)?;
                k.all = k.ords.len() < limit;
            }
            if k.taken == k.ords.len() {
                // Nothing more ready: it leaves the turn with its pass.
                total_weight -= k.weight;
                continue;
            }
            let ord = k.ords[k.taken];
            k.taken += 1;
            let key = k.key.clone();
            let weight = k.weight;
            clock = clock.max(turn.pass);
            let next = turn.pass + 1.0 / weight;
            passes.insert(key.clone(), next);
            picked.push(ord);
            self.fair_moved = true;
            self.take(&key);
            if self.room_of(&key) > 0 {
                queue.push(Turn {
                    pass: next,
                    head: ord,
                    slot: turn.slot,
                });
            } else {
                total_weight -= weight;
            }
        }
        self.fair = Some(FairState {
            clock,
            passes: passes.into_iter().collect(),
        });
        Ok(picked)
    }

    /// Writes what this claim changed of the action's counts: its starts
    /// for rate limits (one row per key and claim, so the window's cost
    /// grows with claims, not runs), and a fair action's clock and passes.
    fn record<C: Control + ?Sized>(&self, conn: &C, now: i64) -> Result<()> {
        for (key, n) in &self.picked {
            if self.rate_of(key).is_some() {
                Control::record_starts(conn, self.action, key, now, *n)?;
            }
        }
        if self.fair_moved
            && let Some(state) = &self.fair
        {
            let ahead: Vec<(String, f64)> = state
                .passes
                .iter()
                .filter(|(_, p)| *p > state.clock)
                .cloned()
                .collect();
            Control::save_fair(conn, self.action, state.clock, &ahead)?;
        }
        Ok(())
    }
}

/// Whether `actions` have work an executor could claim now — a ready, due
/// run of an action that is not paused (limits are the claim's to judge),
/// or events appended that a workflow may be waiting for — and whether any
/// workflow waits for an event at all.
pub(crate) fn work_due<C: Control + crate::store::Steps + ?Sized>(
    conn: &C,
    now: i64,
    actions: &[String],
) -> Result<(bool, bool)> {
    if let Some(look) = Control::work_due_at_once(conn, now, actions)? {
        return Ok(look);
    }
    let paused = paused_names(conn, "action")?;
    let open: Vec<&String> = actions.iter().filter(|a| !paused.contains(*a)).collect();
    let due = if open.is_empty() {
        Control::lapsed_due(conn, now)?
    } else {
        Control::work_due(conn, now, &open)?
    };
    // Events appended that waiting workflows may be waiting for: the
    // claim's transaction matches them.
    let waits = crate::store::Steps::any_event_wait(conn)?;
    Ok((
        due || (waits && crate::store::Steps::waits_behind(conn)?),
        waits,
    ))
}
