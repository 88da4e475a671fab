//! The evaluator: decides every rule of a workspace over new events, exactly
//! once per (rule, event) (DESIGN.md, invariant 4).
//!
//! For each rule and batch:
//!
//! 1. **Read** (a pooled connection, no lock held): the rule's cursor, the
//!    events after it, and the stored states of the scopes they touch.
//! 2. **Decide** (the application's code, still no lock held): for each
//!    event the rule watches, compute the scope and run the decision on a
//!    copy of the scope's state. An error, a panic, a missing scope, an
//!    input or a state the file cannot hold is a `RuleErrored` and a dead
//!    letter; the decision's state changes are dropped. A batch stops after
//!    [`DECIDE_BUDGET`] of decisions, so a slow rule holds back the
//!    workspace's other rules by one batch at most.
//! 3. **Commit** (one transaction, through the writer): check the
//!    workspace's evaluator lease (holder and generation) and that the
//!    rule's cursor is as step 1 read it (position and stamp: an operator's
//!    reset of the cursor or of the state changes the stamp); then write the
//!    changed states, the `RuleFired` and `RuleErrored` events, the dead
//!    letters, the new runs, and the cursor. A crash anywhere before the
//!    commit leaves nothing, and the batch is decided again from the same
//!    cursor and state; after it, nothing is decided again.
//!
//! # Firing ids
//!
//! A firing's id — its run's id, the idempotency key its action gives the
//! outside world — is a pure function of the decision: see [`firing_id`].
//! Deciding an event again (a replay, after [`crate::RuleReset::Replay`] or
//! [`crate::OnNewVersion::Replay`]) derives the same ids, so a firing made
//! before is found, not made twice: its `RuleFired` event and its run stay as
//! they are, whatever state the run is in.
//!
//! # Nothing wedges a rule
//!
//! A rule's batch is written in a savepoint of its own, its firings without
//! one each: a firing the log refuses (it should not happen once inputs are
//! checked; this is the guard) rolls the rule's savepoint back, and the
//! batch is written again with that firing a `RuleErrored` and a dead
//! letter for that (rule, event); the rule moves on. A commit that still
//! fails is recorded against the rule's cursor (`reflexr_stuck_consumers`
//! once it failed [`crate::limits::STUCK_AFTER_FAILURES`] times at one
//! position) and tried again.
//!
//! On PostgreSQL, where each statement is a round trip, a batch's
//! `RuleFired` envelopes are appended together, then its runs made
//! together, [`FIRINGS_TOGETHER`] firings at a time: one statement each
//! (where each firing's envelope and run were round trips of their own);
//! on SQLite each firing's envelope and run go in turn. A refusal still
//! names its firing — the checks are made before anything is sent, and
//! what a statement does not insert is reported for its row. Should a
//! statement fail as a whole, the batch is written again one firing at a
//! time, to find the firing to blame.

use std::any::Any;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::counter::Counter;
use crate::base::dead_letter::{DeadLetterKind, Reason};
use crate::base::error::{Error, Result, panic_text};
use crate::base::event::{Event, NewEvent};
use crate::base::limits::MAX_SUBJECT_BYTES;
use crate::base::telemetry::Op;
use crate::core::changelog::{self, Origin};
use crate::core::cursor::ConsumerKind;
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::core::lease::Lease;
use crate::store::dead_letters::NewDeadLetter;
use crate::store::runs::{Inserted, NewRun};
use crate::store::{Control, Counters, Cursors, DeadLetters, Events, Rules, Runs};
use crate::work::consumer::{self, PageBuffer, Stand};
use crate::work::queue::handoff::{Hand, HandedRow, Handing};
use crate::work::queue::run::RunKind;
use crate::work::rule::{Decision, Rule, RunOrder, Scope};

/// Firings whose envelopes, then runs, are written together, where each
/// statement is a round trip (PostgreSQL): a statement each for many, and
/// what the batch holds in memory bounded.
const FIRINGS_TOGETHER: usize = 256;

/// Longest a rule decides before its batch is committed.
pub(crate) const DECIDE_BUDGET: Duration = Duration::from_millis(50);

/// The evaluator lease of a workspace.
pub(crate) fn lease_name(workspace: &str) -> String {
    format!("evaluator/{workspace}")
}

/// The namespace of the ids the engine derives (RFC 9562, UUIDv5): the
/// UUIDv5 of the URL `https://reflexr.dev/ids`.
const ID_NAMESPACE: uuid::Uuid = uuid::uuid!("efed730c-4498-5f3a-b0e8-cf8af01091f1");

/// The id of the firing `index` (0: a decision fires at most once per event
/// today) of `rule` for `event`: a UUIDv8 (RFC 9562) whose first 48 bits are
/// the event's `recorded_at` in milliseconds — so firing ids sort by time,
/// like the UUIDv7 ids of events, and the run index grows at its end — and
/// whose other 74 bits are the last bits of the UUIDv5 (SHA-1) of
/// `firing\0<rule>\0<workspace>\0<event id>\0<index>` in the engine's
/// namespace. It depends on nothing but the rule's name and the event, so
/// deciding the event again derives it again.
pub fn firing_id(rule: &str, event: &Event, index: u32) -> String {
    derived_id("firing", rule, event, index)
}

/// The id of the `RuleErrored` event of `rule` for `event`, derived like
/// [`firing_id`] (so a replay that fails again records nothing twice).
fn errored_id(rule: &str, event: &Event) -> String {
    format!("{}:errored", derived_id("errored", rule, event, 0))
}

fn derived_id(kind: &str, rule: &str, event: &Event, index: u32) -> String {
    let name = format!("{kind}\0{rule}\0{}\0{}\0{index}", event.workspace, event.id);
    let hash = uuid::Uuid::new_v5(&ID_NAMESPACE, name.as_bytes());
    let mut bytes = *hash.as_bytes();
    let ms = u64::try_from(event.recorded_at).unwrap_or(0).to_be_bytes();
    bytes[..6].copy_from_slice(&ms[2..]);
    uuid::Uuid::new_v8(bytes).to_string()
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pass {
    /// Events the rules moved past (decided or skipped).
    pub events: usize,
    pub decided: usize,
    /// New firings (a replay's firings found made before are not counted).
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
    reason: Reason,
    error: String,
}

/// Everything one rule decided over one page, ready to commit.
struct Decided<'r> {
    rule: &'r Rule,
    /// Where the cursor stood when the page was read.
    stand: Stand,
    /// The furthest the cursor has been: events up to it are decided again.
    high_water: i64,
    /// How many of the page's events it got through.
    through: usize,
    decided: usize,
    /// (scope, state JSON, seq of the last event that changed it).
    changed: Vec<(String, String, i64)>,
    firings: Vec<Firing>,
    errors: Vec<Errored>,
    /// Events decided again (at or below the high water) that fired nothing
    /// this time: a firing made before is looked for, and kept.
    quiet_replays: Vec<usize>,
}

/// What committing one rule's batch did.
#[derive(Default)]
struct Committed {
    fired: usize,
    errored: usize,
    /// Where the rule's cursor was moved to.
    at: i64,
    /// Runs claimed at their insert for idle executors of this process.
    handed: Vec<HandedRow>,
}

/// One pass over the rules of a workspace, `batch` events at a time. Rules
/// whose cursors stand at the same position share one read of the page (and
/// each event's parsed payload) and one commit, each rule's part in a
/// savepoint of its own. A rule whose cursor or state an operator changed
/// meanwhile is decided again (up to ten times a pass); a rule whose commit
/// fails otherwise is recorded against its cursor and left for the next
/// pass, without holding back the others. `lease` gives the workspace's
/// evaluator lease (renewing it when due) before each group; `None` ends the
/// pass.
pub(crate) fn pass<B: Backend>(
    db: &B::Db,
    rules: &[Arc<Rule>],
    batch: usize,
    lease: &mut dyn FnMut() -> Result<Option<Lease>>,
    hand: Option<&Hand<'_>>,
) -> Result<Pass> {
    let Some(workspace) = rules.first().map(|r| r.workspace.clone()) else {
        return Ok(Pass::default());
    };
    // Versions in shadow: hand over where both versions reached the
    // position, then see which code decides for which row, and where each
    // stops until a handover.
    let (resolved, caps) = if rules.iter().any(|r| r.shadow_of.is_some()) {
        let (resolved, caps) = db.read_with(&mut |c| resolve_shadows(c, rules))?;
        if caps.is_empty() {
            (resolved, caps)
        } else {
            // A promote is under way: hand over if both versions are there.
            let Some(held) = lease()? else {
                return Ok(Pass::default());
            };
            let handed = db.write_with(|tx| {
                tx.fence(&held)?;
                let now = tx.now_ms();
                crate::work::operate::complete_promotions(tx.core(), now, &workspace)
            })?;
            if handed == 0 {
                (resolved, caps)
            } else {
                db.read_with(&mut |c| resolve_shadows(c, rules))?
            }
        }
    } else {
        (Vec::new(), HashMap::new())
    };
    let rules: &[Arc<Rule>] = if resolved.is_empty() {
        rules
    } else {
        &resolved
    };
    let mut total = Pass::default();
    let mut pending: Vec<&Rule> = rules.iter().map(|r| &**r).collect();
    let mut page = PageBuffer::take(ConsumerKind::Rule);
    for _ in 0..10 {
        // One read: the pauses, where each rule not paused stands, and the
        // page after them when they all stand at one position (the usual
        // case: rules that keep up share their reads and commits).
        let (stood, mut read_at) = db.read_with(&mut |c| {
            // Paused rules decide nothing; their cursors stay where they
            // are (a pause that commits while a batch is decided is seen by
            // its commit, `consumer::advance`, and the batch is read again
            // here). Where each other stands and how far it decided
            // before, in one read of its cursor's row (of all of them and
            // the pauses, on PostgreSQL).
            let names: Vec<&str> = pending.iter().map(|r| r.name.as_str()).collect();
            let stood = Control::stands(c, &workspace, ConsumerKind::Rule.as_str(), &names)?;
            let mut positions = stood.iter().flatten().map(|(s, _)| Stand::from_stamped(*s));
            let read_at = match positions.next() {
                Some(first) if positions.all(|s| s.position == first.position) => {
                    Events::page_into(c, &workspace, first.position, batch, &mut page)?;
                    Some(first.position)
                }
                _ => None,
            };
            Ok((stood, read_at))
        })?;
        let stands: Vec<(&Rule, (Stand, i64))> = pending
            .iter()
            .zip(stood)
            .filter_map(|(r, s)| {
                s.map(|(stamped, high)| (*r, (Stand::from_stamped(stamped), high)))
            })
            .collect();
        pending = stands.iter().map(|(r, _)| *r).collect();
        if pending.is_empty() {
            break;
        }
        let mut groups: BTreeMap<i64, Vec<(&Rule, Stand, i64)>> = BTreeMap::new();
        for (r, (stand, high)) in stands {
            groups
                .entry(stand.position)
                .or_default()
                .push((r, stand, high));
        }
        let mut again = Vec::new();
        for (position, group) in groups {
            let Some(lease) = lease()? else {
                return Ok(total);
            };
            if read_at.take() != Some(position) {
                db.read_with(&mut |c| {
                    Events::page_into(c, &workspace, position, batch, &mut page)
                })?;
            }
            // Rules decide on events as the application reads them.
            db.settings().upcasters.apply_all(&mut page);
            if page.is_empty() {
                continue;
            }
            let max_json = db.settings().limits.max_payload_bytes;
            let mut decided = Vec::with_capacity(group.len());
            let mut shared = PageScopes::new(&page);
            for (rule, stand, high_water) in group {
                // A version waiting for a handover decides up to it only.
                let page = match caps.get(&rule.name) {
                    Some(&cap) => &page[..page.partition_point(|e| e.seq <= cap)],
                    None => &page[..],
                };
                if page.is_empty() {
                    continue;
                }
                match decide::<B>(db, rule, (stand, high_water), page, &mut shared, max_json) {
                    Ok(d) => decided.push(d),
                    Err(e) => consumer::failed(db, rule.consumer(), position, &e),
                }
            }
            // Runs claimed at their insert for idle executors (`handoff`),
            // sent once the commit holds; the slots of the others go back.
            let handing = hand.filter(|h| h.handoff.idle() > 0).map(Handing::new);
            let page_end = page.last().map_or(position, |e| e.seq);
            let outcomes = db.write_with(|tx| -> Result<Vec<Result<Option<Committed>>>> {
                // Whether nothing was after the page in the log when the
                // write began (what it appends after the page is then its
                // own envelopes): read by the first rule to write, before
                // anything is appended (see `commit_rule`).
                let mut reached_head = None;
                let outcomes: Vec<_> = decided
                    .iter()
                    .map(|d| {
                        let hand = handing.as_ref();
                        commit_rule(tx, d, &page, &lease, hand, &mut reached_head)
                    })
                    .collect();
                if reached_head == Some(true) {
                    past_own_envelopes(tx, &decided, &outcomes, page.len(), page_end)?;
                }
                Ok(outcomes)
            });
            let outcomes = match (outcomes, &handing) {
                (Ok(mut outcomes), Some(h)) => {
                    let rows: Vec<_> = outcomes
                        .iter_mut()
                        .filter_map(|o| o.as_mut().ok().and_then(Option::as_mut))
                        .flat_map(|c| std::mem::take(&mut c.handed))
                        .collect();
                    h.sent(rows);
                    outcomes
                }
                (Ok(outcomes), None) => outcomes,
                (Err(e), h) => {
                    if let Some(h) = h {
                        h.sent(Vec::new());
                    }
                    return Err(e);
                }
            };
            for (d, outcome) in decided.iter().zip(outcomes) {
                match outcome {
                    Ok(Some(c)) => total.add(Pass {
                        events: d.through,
                        decided: d.decided,
                        fired: c.fired,
                        errored: c.errored,
                    }),
                    Ok(None) => again.push(d.rule),
                    Err(e) if e.is_lease_lost() => return Err(e),
                    Err(e) => consumer::failed(db, d.rule.consumer(), position, &e),
                }
            }
        }
        pending = again;
        if pending.is_empty() {
            break;
        }
    }
    if !pending.is_empty() {
        ::log::warn!("rules whose cursors keep changing under the evaluator try again later");
    }
    Ok(total)
}

/// A page's scopes and event types, hashed by foldhash: a look-up per
/// event and way of scoping, where SipHash was a tenth of ten rules'
/// decisions. Its seed is random per process, and a map lives for one batch
/// (a page of events at most), so scopes chosen to collide cost one batch,
/// not the engine.
type ScopeMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// An event's scope (borrowed from the event where it can be), or why it
/// has none.
type ScopeOf<'e> = std::result::Result<Cow<'e, str>, (Reason, String)>;

/// An event's scope as its index among a page's distinct scopes
/// ([`ScopeTable::distinct`]), or why it has none.
type ScopeAt = std::result::Result<u32, (Reason, String)>;

/// The scope of `event` by `scope`, checked for length.
fn scope_of<'e>(scope: &Scope, event: &'e Event) -> ScopeOf<'e> {
    let scope = catch_unwind(AssertUnwindSafe(|| scope.of(event)))
        .unwrap_or_else(|p| Err(format!("the scope function panicked: {}", panic_text(&*p))))
        .map_err(|why| (Reason::MissingScope, why))?;
    if scope.len() > MAX_SUBJECT_BYTES {
        return Err((
            Reason::ScopeTooLong,
            format!(
                "the scope is {} bytes, more than the limit of {MAX_SUBJECT_BYTES}",
                scope.len()
            ),
        ));
    }
    Ok(scope)
}

/// A page's event types and scopes, each found once a page: a rule's
/// decisions then go by index, with no string compared or hashed for each
/// (ten rules did twenty look-ups an event, and each one read the event's
/// scope again from memory a page of ten rules' reads had moved out of the
/// caches: a fifth of their time).
struct PageScopes<'p, 'r> {
    /// By event: its type's index in `types`.
    type_of: Vec<u32>,
    /// The page's distinct event types.
    types: Vec<&'p str>,
    /// A table for each way the group's rules scope events.
    tables: HashMap<ScopeKey<'r>, ScopeTable<'p>>,
}

impl<'p, 'r> PageScopes<'p, 'r> {
    fn new(page: &'p [Event]) -> Self {
        let mut types: Vec<&'p str> = Vec::new();
        let mut index: ScopeMap<&'p str, u32> = ScopeMap::default();
        let mut last: Option<(&'p str, u32)> = None;
        let type_of = page
            .iter()
            .map(|e| {
                let t = e.event_type.as_str();
                // Runs of one type are the usual page: no look-up for them.
                if let Some((prev, at)) = last
                    && prev == t
                {
                    return at;
                }
                let at = *index.entry(t).or_insert_with(|| {
                    types.push(t);
                    u32::try_from(types.len() - 1).expect("a page holds fewer than 2^32 types")
                });
                last = Some((t, at));
                at
            })
            .collect();
        PageScopes {
            type_of,
            types,
            tables: HashMap::new(),
        }
    }
}

/// A way of scoping events, as the key of its [`ScopeTable`]: rules that
/// scope alike share one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum ScopeKey<'r> {
    Subject,
    Global,
    Field(&'r str),
    /// An application's function, by its address: the same function is
    /// called once an event, however many rules it scopes.
    Custom(usize),
}

impl<'r> ScopeKey<'r> {
    fn of(scope: &'r Scope) -> ScopeKey<'r> {
        match scope {
            Scope::Subject => ScopeKey::Subject,
            Scope::Global => ScopeKey::Global,
            Scope::Payload(field) => ScopeKey::Field(field),
            Scope::Custom(f) => ScopeKey::Custom(Arc::as_ptr(f).cast::<()>() as usize),
        }
    }
}

/// One way of scoping over one page: each event's scope, found the first
/// time a rule watching the event asks, as an index into the page's
/// distinct scopes.
struct ScopeTable<'p> {
    /// By event: `None` until a rule asked.
    of: Vec<Option<ScopeAt>>,
    /// The distinct scopes, in the order they were first found.
    distinct: Vec<Cow<'p, str>>,
    index: ScopeMap<Cow<'p, str>, u32>,
}

impl<'p> ScopeTable<'p> {
    fn new(len: usize) -> Self {
        ScopeTable {
            of: std::iter::repeat_with(|| None).take(len).collect(),
            distinct: Vec::new(),
            index: ScopeMap::default(),
        }
    }

    /// The scope of `event`, the page's `i`th, by `scope`.
    fn find(&mut self, scope: &Scope, i: usize, event: &'p Event) -> &ScopeAt {
        if self.of[i].is_none() {
            let found = scope_of(scope, event).map(|s| self.intern(s));
            self.of[i] = Some(found);
        }
        self.of[i].as_ref().expect("found above")
    }

    fn intern(&mut self, scope: Cow<'p, str>) -> u32 {
        if let Some(&at) = self.index.get(&*scope) {
            return at;
        }
        let at = u32::try_from(self.distinct.len()).expect("a page holds fewer than 2^32 scopes");
        self.index.insert(scope.clone(), at);
        self.distinct.push(scope);
        at
    }
}

/// Where each version waiting for a handover stops, by its row's name.
type Caps = HashMap<String, i64>;

/// Which code decides for which rule row of a workspace whose rules have
/// versions in shadow registered here, and where a version waiting for a
/// handover stops: a live rule whose row reached the version of its
/// shadow's code was promoted, and that code decides for it now; a shadow
/// whose row is gone (promoted, or deleted) decides nothing.
fn resolve_shadows<C: Rules + ?Sized>(
    c: &C,
    rules: &[Arc<Rule>],
) -> Result<(Vec<Arc<Rule>>, Caps)> {
    let mut out = Vec::with_capacity(rules.len());
    let mut caps = HashMap::new();
    for live in rules.iter().filter(|r| r.shadow_of.is_none()) {
        let version = Rules::rule(c, &live.name)?.map_or(0, |row| row.version);
        let promoted = rules.iter().find(|s| {
            s.shadow_of.as_deref() == Some(live.name.as_str())
                && i64::from(s.version) == version
                && s.version > live.version
        });
        out.push(match promoted {
            Some(s) => Arc::new(s.as_live()),
            None => Arc::clone(live),
        });
    }
    for shadow in rules.iter().filter(|r| r.shadow_of.is_some()) {
        let Some(row) = Rules::rule(c, &shadow.name)? else {
            continue;
        };
        if let Some(at) = row.promote_at {
            caps.insert(shadow.name.clone(), at);
            caps.insert(shadow.firing_name().to_string(), at);
        }
        out.push(Arc::clone(shadow));
    }
    Ok((out, caps))
}

/// Decides `rule` over `page` (which starts right after its cursor):
/// scopes, states, decisions; writes nothing.
fn decide<'r, 'p, B: Backend>(
    db: &B::Db,
    rule: &'r Rule,
    (stand, high_water): (Stand, i64),
    page: &'p [Event],
    shared: &mut PageScopes<'p, 'r>,
    max_json: usize,
) -> Result<Decided<'r>> {
    // The page's types the rule watches, and the scope of each event of
    // them (found once a page for the rules that scope alike): each scope
    // once, in the order of its first event.
    let watched: Vec<bool> = shared
        .types
        .iter()
        .map(|t| rule.types.iter().any(|w| w == t))
        .collect();
    let type_of = &shared.type_of;
    let table = shared
        .tables
        .entry(ScopeKey::of(&rule.scope))
        .or_insert_with(|| ScopeTable::new(type_of.len()));
    let mut wanted: Vec<u32> = Vec::new();
    let mut is_wanted: Vec<bool> = Vec::new();
    for (i, e) in page.iter().enumerate() {
        if !watched[type_of[i] as usize] {
            continue;
        }
        if let Ok(at) = *table.find(&rule.scope, i, e) {
            let at = at as usize;
            if at >= is_wanted.len() {
                is_wanted.resize(at + 1, false);
            }
            if !is_wanted[at] {
                is_wanted[at] = true;
                wanted.push(at as u32);
            }
        }
    }
    let table = &*table;
    // Their stored states, by scope index.
    let mut stored: Vec<Option<String>> = vec![None; table.distinct.len()];
    if !wanted.is_empty() {
        let names: Vec<&str> = wanted
            .iter()
            .map(|&at| &*table.distinct[at as usize])
            .collect();
        for (scope, json) in db.read_with(&mut |c| Rules::states(c, &rule.name, &names))? {
            if let Some(&at) = table.index.get(scope.as_str()) {
                stored[at as usize] = Some(json);
            }
        }
    }

    let decider = rule
        .decide
        .as_ref()
        .expect("a registered rule has a decision");
    // Each scope's state, by scope index, loaded at its first event of the
    // batch.
    let mut states: Vec<Option<Slot>> = std::iter::repeat_with(|| None)
        .take(table.distinct.len())
        .collect();
    let mut firings = Vec::new();
    let mut errors = Vec::new();
    let mut quiet_replays = Vec::new();
    let mut decided = 0;
    let mut last = 0usize;
    // The box a decision's copy of its state is made in: the state it
    // replaces, or the copy it dropped, is the next one's.
    let mut spare = None;
    let started = Instant::now();
    for (i, event) in page.iter().enumerate() {
        // The clock is read every 32 events: reading it costs more than a
        // trivial decision.
        if i > 0 && i % 32 == 0 && started.elapsed() >= DECIDE_BUDGET {
            break;
        }
        last = i;
        if !watched[type_of[i] as usize] {
            continue;
        }
        let scope = table.of[i].as_ref().expect("found before the decisions");
        decided += 1;
        let fired_before = firings.len();
        decide_one(
            decider.as_ref(),
            rule,
            (i, event),
            scope,
            &table.distinct,
            &stored,
            &mut states,
            &mut spare,
            &mut firings,
            &mut errors,
            max_json,
        );
        if event.seq <= high_water && firings.len() == fired_before {
            quiet_replays.push(i);
        }
    }

    // Only states that changed are written. A state the file cannot hold
    // is an error of the last event that changed it; the stored state stays.
    let mut changed = Vec::new();
    for (at, slot) in states.iter().enumerate() {
        let Some(Slot {
            state,
            changed_at: Some(i),
        }) = slot
        else {
            continue;
        };
        let scope = &*table.distinct[at];
        let json = decider.save(&**state).and_then(|json| {
            match changelog::check_serialized("state", &json, max_json) {
                Ok(()) => Ok(json),
                Err(e) => Err(e.to_string()),
            }
        });
        match json {
            Ok(json) if stored[at].as_deref() != Some(json.as_str()) => {
                changed.push((scope.to_string(), json, page[*i].seq));
            }
            Ok(_) => {}
            Err(why) => errors.push(Errored {
                event: *i,
                scope: Some(scope.to_string()),
                reason: Reason::StateRefused,
                error: format!("the state cannot be stored, and stays as it was: {why}"),
            }),
        }
    }
    Ok(Decided {
        rule,
        stand,
        high_water,
        through: last + 1,
        decided,
        changed,
        firings,
        errors,
        quiet_replays,
    })
}

/// A scope's state during a batch's decisions.
struct Slot {
    state: Box<dyn Any + Send>,
    /// The index of the last event that changed it (None: unchanged, not
    /// written back).
    changed_at: Option<usize>,
}

/// One decision: the scope's state (loaded once per batch), the decision on
/// a copy of it, and what came of it.
#[allow(clippy::too_many_arguments)]
fn decide_one(
    decider: &dyn crate::work::rule::Decide,
    rule: &Rule,
    (i, event): (usize, &Event),
    scope: &ScopeAt,
    distinct: &[Cow<'_, str>],
    stored: &[Option<String>],
    states: &mut [Option<Slot>],
    spare: &mut Option<Box<dyn Any + Send>>,
    firings: &mut Vec<Firing>,
    errors: &mut Vec<Errored>,
    max_json: usize,
) {
    let at = match scope {
        Ok(at) => *at as usize,
        Err((reason, why)) => {
            errors.push(Errored {
                event: i,
                scope: None,
                reason: reason.clone(),
                error: why.clone(),
            });
            return;
        }
    };
    let scope = &*distinct[at];
    let error = |reason, error| Errored {
        event: i,
        scope: Some(scope.to_string()),
        reason,
        error,
    };
    if states[at].is_none() {
        let loaded = match &stored[at] {
            Some(json) => decider.load(json),
            None => Ok(decider.initial()),
        };
        match loaded {
            Ok(state) => {
                states[at] = Some(Slot {
                    state,
                    changed_at: None,
                });
            }
            Err(why) => return errors.push(error(Reason::StateUnreadable, why)),
        }
    }
    let slot = states[at].as_mut().expect("loaded above");
    let mut copy = match spare.take() {
        Some(mut spare) => {
            decider.copy_into(&*slot.state, &mut *spare);
            spare
        }
        None => decider.copy(&*slot.state),
    };
    // The box left over (the state replaced, or the copy dropped) is the
    // next decision's; but the copy a panic left, whatever it holds.
    match catch_unwind(AssertUnwindSafe(|| decider.decide(event, &mut *copy))) {
        Ok(Ok(decision)) => {
            let input = match &decision {
                Decision::Skip => None,
                Decision::Fire(input) => {
                    let text = input.to_string();
                    match changelog::check_serialized("input", &text, max_json) {
                        Ok(()) => Some(text),
                        // The firing cannot be recorded: an error like any
                        // other, and the decision's state changes go too.
                        Err(e) => {
                            *spare = Some(copy);
                            return errors.push(error(Reason::InputRefused, e.to_string()));
                        }
                    }
                }
            };
            *spare = Some(std::mem::replace(&mut slot.state, copy));
            slot.changed_at = Some(i);
            if let Some(input) = input {
                firings.push(Firing {
                    id: firing_id(&rule.name, event, 0),
                    event: i,
                    scope: scope.to_string(),
                    input,
                });
            }
        }
        Ok(Err(e)) => {
            *spare = Some(copy);
            errors.push(error(Reason::DecisionError, e.to_string()));
        }
        Err(panic) => errors.push(error(Reason::DecisionPanic, panic_text(&*panic))),
    }
}

/// Moves the cursors of the rules that decided a whole page, which reached
/// the log's head, past the `RuleFired` and `RuleErrored` envelopes their
/// write appended after it (in the same transaction, under the same lease
/// check): no rule decides on the engine's own envelopes (registration
/// refuses those types), so reading them again would only move the
/// cursors — a durable commit (on PostgreSQL with the log's head held)
/// for every page that fired, which the next append waited behind. Only
/// when every event between the page and the head is this write's:
/// nothing was after the page when the write began (`page_end` the head
/// then), and the write appends nothing else.
fn past_own_envelopes<B: Backend>(
    tx: &mut Tx<'_, B>,
    decided: &[Decided<'_>],
    outcomes: &[Result<Option<Committed>>],
    page_len: usize,
    page_end: i64,
) -> Result<()> {
    let head = Events::head(tx.core())?;
    if head <= page_end {
        return Ok(());
    }
    let now = tx.now_ms();
    let kind = ConsumerKind::Rule.as_str();
    for (d, outcome) in decided.iter().zip(outcomes) {
        // Only a rule whose batch committed, through the whole page, and
        // not already past them (see `commit_rule`).
        match outcome {
            Ok(Some(c)) if d.through == page_len && c.at < head => {}
            _ => continue,
        }
        // Behind where it stands (`Err`): it moved meanwhile; leave it.
        let _ = Cursors::advance(tx.core(), &d.rule.workspace, kind, &d.rule.name, head, now)?;
    }
    Ok(())
}

/// True when the firing `id` was recorded before: its run exists, or its
/// `RuleFired` event does (the run may have been pruned).
fn firing_exists<C: Runs + Events + ?Sized>(conn: &C, workspace: &str, id: &str) -> Result<bool> {
    Ok(Runs::get(conn, id)?.is_some()
        || Events::seq_of(conn, workspace, &format!("{id}:fired"))?.is_some())
}

/// Why writing a rule's batch stopped.
enum CommitError {
    /// The firing at this index of [`Decided::firings`] could not be
    /// recorded: the batch is written again with it as an error.
    Firing(usize, Error),
    /// The one statement of the firings' envelopes, or of their runs,
    /// failed, no firing to blame: the batch is written again one firing
    /// at a time.
    Batch(Error),
    Other(Error),
}

impl From<Error> for CommitError {
    fn from(e: Error) -> CommitError {
        CommitError::Other(e)
    }
}

/// Commits what one rule decided through the consumer loop: `None` if its
/// cursor moved meanwhile. Firings are recorded without a savepoint each; a
/// firing the file refuses rolls the rule's savepoint back, and the batch
/// is written again with that firing recorded as a `firing_refused` error.
///
/// `reached_head` says whether nothing was after the page in the log when
/// the write began; the first rule to write reads it, before it appends
/// (no rule appends before: on PostgreSQL the head is then known from the
/// write's `BEGIN`, sent with the rule's savepoint, so no round trip reads
/// it). If so, a rule that decided the whole page has its cursor moved
/// past what the write appended so far, its own envelopes with the rest
/// (see [`past_own_envelopes`]): one statement where the page's end and
/// then its envelopes were two, for a rule alone in its write.
fn commit_rule<B: Backend>(
    tx: &mut Tx<'_, B>,
    d: &Decided<'_>,
    page: &[Event],
    lease: &Lease,
    handing: Option<&Handing<'_>>,
    reached_head: &mut Option<bool>,
) -> Result<Option<Committed>> {
    let page_end = page[d.through - 1].seq;
    let last = page.last().map_or(page_end, |e| e.seq);
    let mut refused: Vec<(usize, Error)> = Vec::new();
    let mut one_by_one = false;
    loop {
        let attempt = consumer::advance(tx, d.rule.consumer(), lease, d.stand, |tx| {
            let reached = match *reached_head {
                Some(reached) => reached,
                None => *reached_head.insert(Events::head(tx.core())? == last),
            };
            let mut done = commit(tx, d, page, lease, &refused, handing, one_by_one)?;
            done.at = if reached && d.through == page.len() {
                Events::head(tx.core())?.max(page_end)
            } else {
                page_end
            };
            let to = done.at;
            Ok((done, to))
        });
        match attempt {
            Ok(done) => return Ok(done),
            Err(CommitError::Firing(i, e)) if !refused.iter().any(|(r, _)| *r == i) => {
                refused.push((i, e));
            }
            // The envelopes' statement failed as a whole: written again one
            // firing at a time, to find the firing to blame.
            Err(CommitError::Batch(_)) if !one_by_one => one_by_one = true,
            Err(CommitError::Firing(_, e) | CommitError::Batch(e) | CommitError::Other(e)) => {
                return Err(e);
            }
        }
    }
}

/// Writes what one rule decided, inside [`consumer::advance`] (which checked
/// the evaluator lease and the cursor, and moves the cursor after); the
/// firings in `refused` are recorded as errors instead. Each firing's
/// envelope and run are recorded in turn; where each statement is a round
/// trip (PostgreSQL), unless `one_by_one`, the envelopes of up to
/// [`FIRINGS_TOGETHER`] firings are appended together, then their runs
/// made together.
fn commit<B: Backend>(
    tx: &mut Tx<'_, B>,
    d: &Decided<'_>,
    page: &[Event],
    lease: &Lease,
    refused: &[(usize, Error)],
    handing: Option<&Handing<'_>>,
    one_by_one: bool,
) -> std::result::Result<Committed, CommitError> {
    let rule = d.rule;
    let now = tx.now_ms();
    let changed: Vec<(&str, &str, i64)> = d
        .changed
        .iter()
        .map(|(scope, json, seq)| (scope.as_str(), json.as_str(), *seq))
        .collect();
    Rules::save_states(tx.core(), &rule.name, &changed, now)?;
    if rule.shadow_of.is_some() {
        // A version in shadow fires nothing: what it would have done is
        // counted on its row, for operators to compare.
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        Rules::count_shadow(tx.core(), &rule.name, n(d.firings.len()), n(d.errors.len()))?;
        return Ok(Committed::default());
    }
    let mut done = Committed::default();
    let (mut existing, mut kept) = (0, 0);
    let mut refused_errors = Vec::new();
    // The firings to record, by their index in `d.firings`.
    let mut fresh = Vec::with_capacity(d.firings.len());
    for (i, f) in d.firings.iter().enumerate() {
        let event = &page[f.event];
        if let Some((_, e)) = refused.iter().find(|(r, _)| *r == i) {
            refused_errors.push(Errored {
                event: f.event,
                scope: Some(f.scope.clone()),
                reason: Reason::FiringRefused,
                error: format!("the firing could not be recorded: {e}"),
            });
            continue;
        }
        if event.seq <= d.high_water && firing_exists(tx.core(), &rule.workspace, &f.id)? {
            existing += 1;
            continue;
        }
        fresh.push(i);
    }
    if one_by_one || !B::STATEMENTS_ARE_ROUND_TRIPS {
        for &i in &fresh {
            let f = &d.firings[i];
            let handed = record_firing(tx, rule, f, &page[f.event], lease, handing)
                .map_err(|e| blame(i, e))?;
            done.fired += 1;
            done.handed.extend(handed);
        }
    } else {
        for chunk in fresh.chunks(FIRINGS_TOGETHER) {
            record_together(tx, d, page, lease, chunk, handing, &mut done)?;
        }
    }
    let refused = refused_errors;
    for &i in &d.quiet_replays {
        let event = &page[i];
        let id = firing_id(&rule.name, event, 0);
        if firing_exists(tx.core(), &rule.workspace, &id)? {
            kept += 1;
            ::log::info!(
                "rule {}: replaying seq {} no longer fires; firing {id} made before is kept \
                 as it was",
                rule.name,
                event.seq
            );
        }
    }
    let errored_at: std::collections::HashSet<usize> =
        d.errors.iter().chain(&refused).map(|e| e.event).collect();
    for e in d.errors.iter().chain(&refused) {
        record_error(tx, rule, e, &page[e.event])?;
        done.errored += 1;
    }
    // A replay that now decides an event without error settles the dead
    // letter an earlier decision of it left open.
    for (i, event) in page[..d.through].iter().enumerate() {
        if event.seq > d.high_water {
            break;
        }
        if !errored_at.contains(&i) && rule.types.contains(&event.event_type) {
            DeadLetters::resolve_for_event(
                tx.core(),
                DeadLetterKind::Rule,
                &rule.name,
                &rule.workspace,
                event.seq,
                now,
            )?;
        }
    }
    // Runs an executor must claim wake the executors; those claimed at
    // their insert go to theirs directly, after the commit. (The
    // `RuleFired` and `RuleErrored` events wake the log's consumers.)
    if done.fired > done.handed.len() {
        tx.mark_runs();
    }
    Counters::bump_all(
        tx.core(),
        &[
            (Counter::Decisions, d.decided),
            (Counter::Fired, done.fired),
            (Counter::Errored, done.errored),
            (Counter::ReplayExisting, existing),
            (Counter::ReplayKept, kept),
        ],
    )?;
    Ok(done)
}

/// A `RuleFired` event's payload, written straight from its parts (a JSON
/// value built to be printed cost a firing a tenth of its instructions).
/// Its keys in the order the JSON object of a build without serde_json's
/// `preserve_order` printed them (sorted), so the text is what it was —
/// but for the input, now the text the decision's value printed: parsed
/// again, a float could move by its last digit (without serde_json's
/// `float_roundtrip`), and an input deeper than 128 levels (serde_json's
/// recursion limit, under the engine's [`crate::limits::MAX_JSON_DEPTH`])
/// was refused.
#[derive(serde::Serialize)]
struct FiredPayload<'a> {
    action: &'a str,
    evaluator: Evaluator<'a>,
    event_id: &'a str,
    event_seq: i64,
    firing_id: &'a str,
    input: &'a serde_json::value::RawValue,
    rule: &'a str,
    run: &'static str,
    scope: &'a str,
}

/// The evaluator lease a firing was made under.
#[derive(serde::Serialize)]
struct Evaluator<'a> {
    generation: i64,
    holder: &'a str,
}

/// A firing's failure is its own, unless the transaction cannot go on.
fn blame(i: usize, e: Error) -> CommitError {
    if e.dooms_transaction() {
        CommitError::Other(e)
    } else {
        CommitError::Firing(i, e)
    }
}

/// Records the firings at `chunk`'s indexes of [`Decided::firings`] where
/// each statement is a round trip: their envelopes appended together, then
/// their runs made together (one statement each on PostgreSQL), then each
/// dead run's dead letter, or the hand-over of each run inserted. A lone
/// firing's run is inserted and handed over in one statement
/// ([`Handing::insert_handed`]).
fn record_together<B: Backend>(
    tx: &mut Tx<'_, B>,
    d: &Decided<'_>,
    page: &[Event],
    lease: &Lease,
    chunk: &[usize],
    handing: Option<&Handing<'_>>,
    done: &mut Committed,
) -> std::result::Result<(), CommitError> {
    let rule = d.rule;
    let together = |(k, e): (Option<usize>, Error)| match k {
        Some(k) => blame(chunk[k], e),
        None if e.dooms_transaction() => CommitError::Other(e),
        None => CommitError::Batch(e),
    };
    let mut envelopes = Vec::with_capacity(chunk.len());
    for &i in chunk {
        let event = &page[d.firings[i].event];
        let envelope =
            fired_envelope(tx, rule, &d.firings[i], event, lease).map_err(|e| blame(i, e))?;
        envelopes.push((envelope, Origin::Engine { depth: event.depth }));
    }
    tx.append_all_as(&rule.workspace, &envelopes)
        .map_err(together)?;
    drop(envelopes);
    let runs: Vec<FiringRun> = chunk
        .iter()
        .map(|&i| FiringRun::of(tx, rule, &d.firings[i], &page[d.firings[i].event]))
        .collect();
    // A lone firing's run is inserted and handed over in one statement.
    if let ([i], [run], Some(h)) = (chunk, &runs[..], handing)
        && run.dead.is_none()
    {
        let f = &d.firings[*i];
        let handed = h
            .insert_handed(tx, &run.new_run(rule, f, &page[f.event]))
            .map_err(|e| blame(*i, e))?;
        done.fired += 1;
        done.handed.extend(handed);
        return Ok(());
    }
    let rows: Vec<NewRun<'_>> = chunk
        .iter()
        .zip(&runs)
        .map(|(&i, run)| run.new_run(rule, &d.firings[i], &page[d.firings[i].event]))
        .collect();
    let inserted = Runs::insert_all(tx.core(), &rows).map_err(together)?;
    drop(rows);
    for ((&i, run), inserted) in chunk.iter().zip(runs).zip(inserted) {
        let f = &d.firings[i];
        // Only a run this write inserted is handed over.
        let handing = handing.filter(|_| inserted == Inserted::New);
        let handed = run
            .finish(tx, rule, f, &page[f.event], handing)
            .map_err(|e| blame(i, e))?;
        done.fired += 1;
        done.handed.extend(handed);
    }
    Ok(())
}

/// Records one firing: its `RuleFired` event and its run (or, past the
/// chain depth limit, its dead run and dead letter), handed to an idle
/// executor when `handing` has one.
fn record_firing<B: Backend>(
    tx: &mut Tx<'_, B>,
    rule: &Rule,
    f: &Firing,
    event: &Event,
    lease: &Lease,
    handing: Option<&Handing<'_>>,
) -> Result<Option<HandedRow>> {
    let fired = fired_envelope(tx, rule, f, event, lease)?;
    tx.append_as(
        &rule.workspace,
        &fired,
        Origin::Engine { depth: event.depth },
    )?;
    let run = FiringRun::of(tx, rule, f, event);
    if let (Some(h), None) = (handing, &run.dead) {
        return h.insert_handed(tx, &run.new_run(rule, f, event));
    }
    Runs::insert(tx.core(), &run.new_run(rule, f, event))?;
    run.finish(tx, rule, f, event, handing)
}

/// A firing's `RuleFired` event, made under `lease`.
fn fired_envelope<B: Backend>(
    tx: &Tx<'_, B>,
    rule: &Rule,
    f: &Firing,
    event: &Event,
    lease: &Lease,
) -> Result<NewEvent> {
    let actor = format!("rule:{}", rule.name);
    let action = rule_action(rule);
    let too_deep = past_depth_limit(tx, event);
    // The decision's input as it was written (checked JSON), not parsed
    // into a value to be written again.
    let input: &serde_json::value::RawValue =
        serde_json::from_str(&f.input).map_err(|e| Error::Encode {
            message: e.to_string(),
        })?;
    let fired = NewEvent::new("RuleFired", &event.subject, &actor, event.occurred_at)
        .id(format!("{}:fired", f.id))
        .payload(&FiredPayload {
            action,
            evaluator: Evaluator {
                generation: lease.generation,
                holder: &lease.holder,
            },
            event_id: &event.id,
            event_seq: event.seq,
            firing_id: &f.id,
            input,
            rule: &rule.name,
            run: if too_deep {
                "dead: chain depth limit"
            } else {
                "created"
            },
            scope: &f.scope,
        });
    Ok(with_cause(fired, event))
}

/// A firing's run, before its insert: what the row is made of besides the
/// firing, and the decision's span, which lives until the run is recorded.
struct FiringRun {
    now: i64,
    lane: Option<String>,
    /// Past the chain depth limit: why the run is dead.
    dead: Option<String>,
    traceparent: Option<String>,
    _span: crate::base::telemetry::Span,
}

impl FiringRun {
    fn of<B: Backend>(tx: &Tx<'_, B>, rule: &Rule, f: &Firing, event: &Event) -> FiringRun {
        let dead = past_depth_limit(tx, event).then(|| {
            format!(
                "the firing event is {} deep; a run would emit events past the chain depth \
                 limit of {}",
                event.depth,
                tx.limits().max_chain_depth
            )
        });
        let lane = (rule.ordering == RunOrder::Scope).then(|| format!("{} {}", rule.name, f.scope));
        // The decision's span, a child of the event's: the run carries it.
        let span = tx.settings().telemetry.start(Op::Decide {
            workspace: &rule.workspace,
            rule: &rule.name,
            event_id: &event.id,
            run_id: &f.id,
            action: rule_action(rule),
            parent: event.traceparent.as_deref(),
        });
        let traceparent = span.traceparent().or_else(|| event.traceparent.clone());
        FiringRun {
            now: tx.now_ms(),
            lane,
            dead,
            traceparent,
            _span: span,
        }
    }

    fn new_run<'a>(&'a self, rule: &'a Rule, f: &'a Firing, event: &'a Event) -> NewRun<'a> {
        NewRun {
            id: &f.id,
            kind: RunKind::Rule.as_str(),
            action: rule_action(rule),
            workspace: Some(&rule.workspace),
            rule: Some(&rule.name),
            scope: Some(&f.scope),
            lane: self.lane.as_deref(),
            on_dead_letter: rule.on_dead_letter.as_str(),
            input: &f.input,
            event_seq: Some(event.seq),
            event_id: Some(&event.id),
            depth: event.depth,
            retry: &rule.retry,
            due_at: self.now,
            now: self.now,
            dead: self.dead.as_deref(),
            priority: None,
            unique: None,
            parent: None,
            key: None,
            traceparent: self.traceparent.as_deref(),
        }
    }

    /// After the run's insert: a dead run's dead letter, or the run handed
    /// to an idle executor when `handing` has one.
    fn finish<B: Backend>(
        self,
        tx: &mut Tx<'_, B>,
        rule: &Rule,
        f: &Firing,
        event: &Event,
        handing: Option<&Handing<'_>>,
    ) -> Result<Option<HandedRow>> {
        if let Some(why) = &self.dead {
            DeadLetters::insert(
                tx.core(),
                &NewDeadLetter {
                    kind: DeadLetterKind::Run,
                    consumer: &rule.name,
                    workspace: Some(&rule.workspace),
                    event_seq: Some(event.seq),
                    event_id: Some(&event.id),
                    run_id: Some(&f.id),
                    reason: Reason::DepthLimit,
                    error: why,
                    attempts: 0,
                    now: self.now,
                },
            )?;
            return Ok(None);
        }
        match handing {
            Some(h) => h.hand_over(tx, rule_action(rule), &f.id, self.now),
            None => Ok(None),
        }
    }
}

/// Whether a run of a firing on `event` would emit events past the chain
/// depth limit: its run is then dead, and its envelope says so.
fn past_depth_limit<B: Backend>(tx: &Tx<'_, B>, event: &Event) -> bool {
    event.depth + 1 > tx.limits().max_chain_depth
}

/// A registered rule's action.
fn rule_action(rule: &Rule) -> &str {
    rule.action
        .as_deref()
        .expect("a registered rule has an action")
}

/// Records an evaluation error: a `RuleErrored` event (its id derived from
/// the rule and the event, so a replay that fails again appends nothing
/// twice) and a dead letter (reopened if an operator had resolved it).
fn record_error<B: Backend>(
    tx: &mut Tx<'_, B>,
    rule: &Rule,
    e: &Errored,
    event: &Event,
) -> Result<()> {
    let now = tx.now_ms();
    let actor = format!("rule:{}", rule.name);
    let error = crate::base::limits::clip_error(&e.error);
    let errored = NewEvent::new("RuleErrored", &event.subject, &actor, event.occurred_at)
        .id(errored_id(&rule.name, event))
        .payload(&serde_json::json!({
            "rule": rule.name,
            "scope": e.scope,
            "reason": e.reason,
            "error": error,
            "event_seq": event.seq,
            "event_id": event.id,
        }));
    let errored = with_cause(errored, event);
    tx.append_as(
        &rule.workspace,
        &errored,
        Origin::Engine { depth: event.depth },
    )?;
    DeadLetters::insert(
        tx.core(),
        &NewDeadLetter {
            kind: DeadLetterKind::Rule,
            consumer: &rule.name,
            workspace: Some(&rule.workspace),
            event_seq: Some(event.seq),
            event_id: Some(&event.id),
            run_id: None,
            reason: e.reason.clone(),
            error: &error,
            attempts: 1,
            now,
        },
    )?;
    Ok(())
}

fn with_cause(ev: NewEvent, cause: &Event) -> NewEvent {
    let ev = ev.causation_id(cause.id.clone());
    match &cause.correlation_id {
        Some(c) => ev.correlation_id(c.clone()),
        None => ev,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariant 4's `RuleFired` envelopes: a payload written from its
    /// parts is the text the JSON value of the same fields printed (the
    /// input parsed into it, as the firing did before), for inputs of
    /// several shapes: the log's envelopes read the same whichever way
    /// they were made.
    #[test]
    fn a_fired_payload_is_the_text_its_json_value_printed() {
        for input in [
            serde_json::json!(null),
            serde_json::json!(7),
            serde_json::json!(-0.1),
            serde_json::json!(1e300),
            serde_json::json!("é \"quoted\" \u{1}"),
            serde_json::json!({ "z": [1, { "b": 2, "a": null }], "a": true }),
        ] {
            let text = input.to_string();
            let raw: &serde_json::value::RawValue = serde_json::from_str(&text).unwrap();
            let made = serde_json::to_string(&FiredPayload {
                action: "notify",
                evaluator: Evaluator {
                    generation: 3,
                    holder: "host-1",
                },
                event_id: "0190-abc",
                event_seq: 42,
                firing_id: "f-1",
                input: raw,
                rule: "r",
                run: "created",
                scope: "s/1",
            })
            .unwrap();
            let value = serde_json::json!({
                "rule": "r",
                "firing_id": "f-1",
                "action": "notify",
                "scope": "s/1",
                "input": serde_json::from_str::<serde_json::Value>(&text).unwrap(),
                "event_seq": 42,
                "event_id": "0190-abc",
                "run": "created",
                "evaluator": { "holder": "host-1", "generation": 3 },
            });
            assert_eq!(made, value.to_string(), "{input}");
        }
    }

    /// Invariant 4's `RuleFired` envelopes: the payload's text, pinned:
    /// keys sorted, as a JSON object printed them without serde_json's
    /// `preserve_order`.
    #[test]
    fn a_fired_payload_reads_as_before() {
        let raw: &serde_json::value::RawValue = serde_json::from_str(r#"{"n":1}"#).unwrap();
        let made = serde_json::to_string(&FiredPayload {
            action: "a",
            evaluator: Evaluator {
                generation: 2,
                holder: "h",
            },
            event_id: "e",
            event_seq: 9,
            firing_id: "f",
            input: raw,
            rule: "r",
            run: "created",
            scope: "s",
        })
        .unwrap();
        assert_eq!(
            made,
            r#"{"action":"a","evaluator":{"generation":2,"holder":"h"},"event_id":"e","event_seq":9,"firing_id":"f","input":{"n":1},"rule":"r","run":"created","scope":"s"}"#
        );
    }

    fn event(workspace: &str, id: &str, recorded_at: i64) -> Event {
        Event {
            seq: 1,
            id: id.into(),
            workspace: workspace.into(),
            event_type: "t".into(),
            subject: "s".into(),
            version: 1,
            actor: "a".into(),
            occurred_at: 0,
            recorded_at,
            causation_id: None,
            correlation_id: None,
            depth: 0,
            traceparent: None,
            payload: "{}".into(),
            parsed: Default::default(),
        }
    }

    #[test]
    fn the_namespace_is_the_uuid5_of_its_url() {
        assert_eq!(
            ID_NAMESPACE,
            uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, b"https://reflexr.dev/ids")
        );
    }

    #[test]
    fn firing_ids_depend_on_the_rule_and_the_event_only_and_sort_by_time() {
        // Invariant 4 across replays: the id of a decision is derived again,
        // not drawn again.
        let e = event("app", "e-1", 1_800_000_000_000);
        let id = firing_id("r", &e, 0);
        assert_eq!(id, firing_id("r", &e.clone(), 0));
        let parsed = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(parsed.get_version_num(), 8);
        for other in [
            firing_id("r2", &e, 0),
            firing_id("r", &event("app2", "e-1", 1_800_000_000_000), 0),
            firing_id("r", &event("app", "e-2", 1_800_000_000_000), 0),
            firing_id("r", &e, 1),
            errored_id("r", &e),
        ] {
            assert_ne!(id, other);
        }
        assert!(firing_id("r", &event("app", "e-3", 1_800_000_000_001), 0) > id);
    }
}
