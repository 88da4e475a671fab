//! What operators look for: events, runs and dead letters found by filter,
//! a page at a time, each call looking through a bounded stretch of the file
//! so that no question — however rare its answer — costs a scan of it all.
//!
//! A page says where to go on from (`next`): pass it back to read the next
//! stretch. A page may hold fewer items than asked, or none, and still have
//! a `next`: the stretch it looked through held no more matches.

use std::marker::PhantomData;

use serde::Serialize;

use crate::base::dead_letter::{DeadLetter, DeadLetterKind};
use crate::base::error::{Error, Result};
use crate::base::event::{Event, Query};
use crate::base::limits;
use crate::core::db::Backend;
use crate::store::Sqlite;
use crate::store::dead_letters;
use crate::store::runs::FeedPos;
use crate::store::{Events, Inspect, RunFind, Runs, Work, Workspaces};
use crate::work::queue::run::{RunInfo, RunState};

/// How many items a page holds at most.
pub const MAX_PAGE: usize = 1_000;
/// How many events, runs or dead letters one call looks through at most.
pub const SCAN_WINDOW: usize = 10_000;

/// A page of events: those after the query's seq that match it, and the seq
/// to go on after.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct EventPage {
    /// The events, in seq order.
    pub events: Vec<Event>,
    /// Pass as the next query's `after` to go on; None: the page reached the
    /// end of the log (wait for more).
    pub next_after: Option<i64>,
}

/// Events matching `q` (its types and subject), at most its limit, among at
/// most [`SCAN_WINDOW`] events of its workspace after its `after`.
pub(crate) fn events_page<C: Work + ?Sized>(conn: &C, q: &Query) -> Result<EventPage> {
    q.validate()?;
    let page = page_of(conn, q)?;
    // An empty page of a workspace the file does not have is a mistake to
    // name, not a quiet log.
    if page.events.is_empty() && !Workspaces::exists(conn, &q.workspace)? {
        return Err(Error::not_found("workspace", &q.workspace));
    }
    Ok(page)
}

fn page_of<C: Work + ?Sized>(conn: &C, q: &Query) -> Result<EventPage> {
    if q.types.is_empty() && q.subject.is_none() {
        // Every event matches: no window to bound, a plain page.
        let events = Events::page(conn, &q.workspace, q.after, &[], q.limit)?;
        let next_after = match events.last() {
            Some(last) if events.len() == q.limit => Some(last.seq),
            _ => None,
        };
        return Ok(EventPage { events, next_after });
    }
    let (events, next_after) = Inspect::scan_events(
        conn,
        &q.workspace,
        q.after,
        &q.types,
        q.subject.as_deref(),
        q.limit,
        SCAN_WINDOW,
    )?;
    Ok(EventPage { events, next_after })
}

/// A run filter as the surfaces take it in JSON (the admin API's bodies,
/// MCP's arguments): the fields of [`RunFilter`] by name, `state` as its
/// word, `input` as one `{"<key or $.path>": <value>}` entry.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RunFilterSpec {
    /// A [`RunState`]'s word.
    pub state: Option<String>,
    /// The action.
    pub action: Option<String>,
    /// The rule.
    pub rule: Option<String>,
    /// The workspace.
    pub workspace: Option<String>,
    /// The scope.
    pub scope: Option<String>,
    /// One `{"<key or $.path>": <value>}` entry.
    pub input: Option<serde_json::Map<String, serde_json::Value>>,
}

impl RunFilterSpec {
    /// The filter it describes.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a state that is not one, or an `input` that
    /// is not exactly one entry.
    pub fn filter(self) -> Result<RunFilter> {
        let mut f = RunFilter::new();
        f.state = self.state.map(|s| s.parse::<RunState>()).transpose()?;
        f.action = self.action;
        f.rule = self.rule;
        f.workspace = self.workspace;
        f.scope = self.scope;
        if let Some(input) = self.input {
            let mut entries = input.into_iter();
            match (entries.next(), entries.next()) {
                (Some(one), None) => f.input = Some(one),
                _ => {
                    return Err(Error::invalid(
                        "input",
                        "one {\"<key or $.path>\": <value>} entry",
                    ));
                }
            }
        }
        Ok(f)
    }
}

/// Which runs to find ([`crate::Engine::find_runs`]): every field set must
/// match. Newest first.
///
/// ```
/// # use reflexr::RunState;
/// # use reflexr::inspect::RunFilter;
/// let f = RunFilter::new()
///     .state(RunState::Dead)
///     .action("notify-organiser")
///     .input("session", serde_json::json!(42))
///     .limit(50);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct RunFilter {
    /// In this state.
    pub state: Option<RunState>,
    /// Of this action.
    pub action: Option<String>,
    /// Fired by this rule.
    pub rule: Option<String>,
    /// For an event of this workspace.
    pub workspace: Option<String>,
    /// In this scope.
    pub scope: Option<String>,
    /// Whose input holds this value at this place: a top-level key, or a
    /// JSON path starting with `$` (SQLite's `json_extract`). A string
    /// matches a string, a number a number: `"42"` is not `42`.
    pub input: Option<(String, serde_json::Value)>,
    /// Only runs older than this cursor (a page's `next`).
    pub before: Option<i64>,
    /// At most this many (1 to [`MAX_PAGE`]; default 100).
    pub limit: usize,
}

impl RunFilter {
    /// Every run, 100 at a time.
    pub fn new() -> RunFilter {
        RunFilter {
            limit: 100,
            ..RunFilter::default()
        }
    }

    /// Only runs in `state`.
    pub fn state(mut self, state: RunState) -> RunFilter {
        self.state = Some(state);
        self
    }

    /// Only runs of `action`.
    pub fn action(mut self, action: impl Into<String>) -> RunFilter {
        self.action = Some(action.into());
        self
    }

    /// Only runs `rule` fired.
    pub fn rule(mut self, rule: impl Into<String>) -> RunFilter {
        self.rule = Some(rule.into());
        self
    }

    /// Only runs for events of `workspace`.
    pub fn workspace(mut self, workspace: impl Into<String>) -> RunFilter {
        self.workspace = Some(workspace.into());
        self
    }

    /// Only runs of `scope`.
    pub fn scope(mut self, scope: impl Into<String>) -> RunFilter {
        self.scope = Some(scope.into());
        self
    }

    /// Only runs whose input holds `value` at `path` (a key, or a `$` path).
    pub fn input(mut self, path: impl Into<String>, value: serde_json::Value) -> RunFilter {
        self.input = Some((path.into(), value));
        self
    }

    /// Only runs older than `cursor` (a page's `next`).
    pub fn before(mut self, cursor: i64) -> RunFilter {
        self.before = Some(cursor);
        self
    }

    /// At most `n` runs.
    pub fn limit(mut self, n: usize) -> RunFilter {
        self.limit = n;
        self
    }
}

/// A page of runs, newest first.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RunPage {
    /// The runs.
    pub runs: Vec<RunInfo>,
    /// Pass as the filter's `before` to go on; None: the oldest run was
    /// reached.
    pub next: Option<i64>,
}

/// The path `json_extract` takes for a key or a `$` path.
fn json_path(path: &str) -> Result<String> {
    if path.is_empty() || path.len() > limits::MAX_NAME_BYTES || path.chars().any(char::is_control)
    {
        return Err(Error::invalid(
            "input path",
            "a key or a $ path of 1 to 128 characters",
        ));
    }
    let full = if path.starts_with('$') {
        path.to_string()
    } else {
        format!("$.\"{path}\"")
    };
    limits::check_json_path("input path", &full)?;
    Ok(full)
}

fn check_limit(limit: usize) -> Result<()> {
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Error::invalid(
            "limit",
            format!("must be 1 to {MAX_PAGE}, got {limit}"),
        ));
    }
    Ok(())
}

pub(crate) fn find_runs<C: Work + ?Sized>(conn: &C, f: &RunFilter) -> Result<RunPage> {
    check_limit(f.limit)?;
    for (field, v) in [
        ("action", &f.action),
        ("rule", &f.rule),
        ("workspace", &f.workspace),
    ] {
        if let Some(v) = v {
            limits::check_name(field, v)?;
        }
    }
    let input = match &f.input {
        Some((path, value)) => Some((json_path(path)?, value)),
        None => None,
    };
    let before = match f.before {
        Some(b) => b,
        None => Inspect::runs_end(conn)?,
    };
    let (rows, next) = Inspect::find_runs(
        conn,
        &RunFind {
            state: f.state.map(RunState::as_str),
            action: f.action.as_deref(),
            rule: f.rule.as_deref(),
            workspace: f.workspace.as_deref(),
            scope: f.scope.as_deref(),
            input: input.as_ref().map(|(p, v)| (p.as_str(), *v)),
            before,
            limit: f.limit,
            window: SCAN_WINDOW as i64,
        },
    )?;
    Ok(RunPage {
        runs: rows
            .into_iter()
            .map(RunInfo::from_row)
            .collect::<Result<_>>()?,
        next,
    })
}

/// A run with what it came from and what it made.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RunDetail {
    /// The run.
    pub run: RunInfo,
    /// The event that fired it (None: a delivery or a job, or pruned).
    pub event: Option<Event>,
    /// The events it emitted (ids `<run id>/<key>`), in any workspace.
    pub emitted: Vec<Event>,
    /// A workflow's timeline: the steps it recorded, in order
    /// ([`crate::Engine::run_steps`]); empty for a run that is not one.
    pub steps: Vec<crate::base::step::StepInfo>,
}

pub(crate) fn run_detail<C: Work + ?Sized>(conn: &C, id: &str) -> Result<Option<RunDetail>> {
    let Some(row) = Runs::get(conn, id)? else {
        return Ok(None);
    };
    let event = match (&row.workspace, &row.event_id) {
        (Some(ws), Some(event_id)) => Events::by_id(conn, ws, event_id)?,
        _ => None,
    };
    let emitted = Inspect::events_with_id_prefix(conn, &format!("{id}/"), MAX_PAGE)?;
    let steps = crate::work::queue::workflow::timeline(conn, id)?;
    Ok(Some(RunDetail {
        run: RunInfo::from_row(row)?,
        event,
        emitted,
        steps,
    }))
}

/// Which dead letters to find ([`crate::Engine::find_dead_letters`]):
/// every field set must match. Newest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Of this kind.
    pub kind: Option<DeadLetterKind>,
    /// Of this rule, reaction, follower or action.
    pub consumer: Option<String>,
    /// For an event of this workspace.
    pub workspace: Option<String>,
    /// For this reason (as stored, e.g. `attempts_exhausted`).
    pub reason: Option<String>,
    /// Resolved ones too (default: open ones only).
    pub include_resolved: bool,
    /// Only dead letters older than this cursor (a page's `next`).
    pub before: Option<i64>,
    /// At most this many (1 to [`MAX_PAGE`]; default 100).
    pub limit: usize,
}

impl DeadLetterFilter {
    /// Every open dead letter, 100 at a time.
    pub fn new() -> DeadLetterFilter {
        DeadLetterFilter {
            limit: 100,
            ..DeadLetterFilter::default()
        }
    }

    /// Only dead letters of `kind`.
    pub fn kind(mut self, kind: DeadLetterKind) -> DeadLetterFilter {
        self.kind = Some(kind);
        self
    }

    /// Only those of `consumer`.
    pub fn consumer(mut self, consumer: impl Into<String>) -> DeadLetterFilter {
        self.consumer = Some(consumer.into());
        self
    }

    /// Only those for events of `workspace`.
    pub fn workspace(mut self, workspace: impl Into<String>) -> DeadLetterFilter {
        self.workspace = Some(workspace.into());
        self
    }

    /// Only those given up on for `reason`.
    pub fn reason(mut self, reason: impl Into<String>) -> DeadLetterFilter {
        self.reason = Some(reason.into());
        self
    }

    /// Resolved ones too.
    pub fn include_resolved(mut self, yes: bool) -> DeadLetterFilter {
        self.include_resolved = yes;
        self
    }

    /// Only those older than `cursor` (a page's `next`).
    pub fn before(mut self, cursor: i64) -> DeadLetterFilter {
        self.before = Some(cursor);
        self
    }

    /// At most `n`.
    pub fn limit(mut self, n: usize) -> DeadLetterFilter {
        self.limit = n;
        self
    }
}

/// A scope held behind a dead run (`OnDeadLetter::Block`) until an operator
/// unblocks it ([`crate::Operator::unblock`]) or retries the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BlockedLane {
    /// The rule.
    pub rule: String,
    /// The scope.
    pub scope: String,
    /// The dead run it is held behind.
    pub run_id: String,
    /// That run's last error.
    pub last_error: Option<String>,
    /// When the lane was blocked (ms since the epoch, engine clock).
    pub since: i64,
}

/// The blocked lanes, most recently blocked first, at most `limit`
/// (1 to [`MAX_PAGE`]).
pub(crate) fn blocked_lanes<C: Work + ?Sized>(conn: &C, limit: usize) -> Result<Vec<BlockedLane>> {
    check_limit(limit)?;
    Ok(Inspect::blocked_lanes(conn, limit)?
        .into_iter()
        .map(|(lane, head, rule, scope, last_error, since)| {
            // The lane is "<rule> <scope>"; names hold no spaces. The run's
            // own columns say it when it is still there.
            let (r, s) = lane.split_once(' ').unwrap_or((lane.as_str(), ""));
            BlockedLane {
                rule: rule.unwrap_or_else(|| r.to_string()),
                scope: scope.unwrap_or_else(|| s.to_string()),
                run_id: head,
                last_error,
                since,
            }
        })
        .collect())
}

/// A page of dead letters, newest first.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DeadLetterPage {
    /// The dead letters.
    pub dead_letters: Vec<DeadLetter>,
    /// Pass as the filter's `before` to go on; None: the oldest was reached.
    pub next: Option<i64>,
}

pub(crate) fn find_dead_letters<C: Work + ?Sized>(
    conn: &C,
    f: &DeadLetterFilter,
) -> Result<DeadLetterPage> {
    check_limit(f.limit)?;
    if let Some(c) = &f.consumer {
        limits::check_name("consumer", c)?;
    }
    if let Some(w) = &f.workspace {
        limits::check_name("workspace", w)?;
    }
    if let Some(r) = &f.reason {
        limits::check_name("reason", r)?;
    }
    let before = match f.before {
        Some(b) => b,
        None => Inspect::dead_letters_end(conn)?,
    };
    let (dead_letters, next) = Inspect::find_dead_letters(
        conn,
        &dead_letters::Find {
            kind: f.kind,
            consumer: f.consumer.as_deref(),
            workspace: f.workspace.as_deref(),
            reason: f.reason.as_deref(),
            include_resolved: f.include_resolved,
            before,
            limit: f.limit,
            window: SCAN_WINDOW as i64,
        },
    )?;
    Ok(DeadLetterPage { dead_letters, next })
}

/// Where a feed of run changes stands: start one with
/// [`RunsFeed::since`], read on with [`crate::Engine::runs_feed`], which
/// moves it past what it returns.
///
/// The feed gives every run whose state, attempt or change time changed,
/// in the order the changes became visible, once for each time it is read
/// changed (a run changed twice between two reads comes once, as it is
/// now). On SQLite it follows the runs' change time, which its one writer
/// stamps in commit order. On PostgreSQL, where concurrent transactions
/// commit in another order than they stamp, it follows the transactions
/// that made the changes: a change comes once every transaction that began
/// before it has ended, so one committed late is never passed over (a
/// transaction held open holds the feed back until it ends).
///
/// [`RunsFeed::token`] writes the position down (a number, the millisecond
/// it stands at, on SQLite; `"tx:<transaction>:<position>"` on PostgreSQL)
/// and [`RunsFeed::from_token`] reads it back: how a subscription resumes.
///
/// A feed is its backend's (`RunsFeed<Sqlite>`, `RunsFeed<Postgres>`): an
/// engine reads only its own backend's, and a token another backend wrote
/// is refused.
pub struct RunsFeed<B: Backend = Sqlite>(pub(crate) FeedPos, PhantomData<fn() -> B>);

impl<B: Backend> std::fmt::Debug for RunsFeed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RunsFeed").field(&self.0).finish()
    }
}

impl<B: Backend> Clone for RunsFeed<B> {
    fn clone(&self) -> Self {
        RunsFeed(self.0.clone(), PhantomData)
    }
}

impl<B: Backend> PartialEq for RunsFeed<B> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<B: Backend> RunsFeed<B> {
    /// A feed of the changes made at or after `ms` on the engine's clock.
    /// (On PostgreSQL its first read looks through the whole table for the
    /// oldest transaction that changed a run at or after `ms`, and begins
    /// there, so it may also give runs that transaction changed a moment
    /// before.)
    pub fn since(ms: i64) -> RunsFeed<B> {
        RunsFeed(FeedPos::Since(ms), PhantomData)
    }

    /// The position, written down to resume from with
    /// [`RunsFeed::from_token`].
    pub fn token(&self) -> String {
        match &self.0 {
            FeedPos::Since(ms) | FeedPos::Clock { at_ms: ms, .. } => ms.to_string(),
            FeedPos::Xact { tx, ord } => format!("tx:{tx}:{ord}"),
        }
    }

    /// A position [`RunsFeed::token`] wrote (a bare number is a
    /// millisecond, as [`RunsFeed::since`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for text no feed wrote, or a transaction's
    /// position on a backend whose feed follows change times (SQLite).
    pub fn from_token(token: &str) -> Result<RunsFeed<B>> {
        let bad = || {
            Error::invalid(
                "after",
                format!(
                    "{token:?} is neither a millisecond nor a position a feed of run changes wrote"
                ),
            )
        };
        if let Ok(ms) = token.parse::<i64>() {
            return Ok(RunsFeed::since(ms));
        }
        let rest = token.strip_prefix("tx:").ok_or_else(bad)?;
        if !B::FEEDS_BY_TRANSACTION {
            return Err(bad());
        }
        let (tx, ord) = rest.split_once(':').ok_or_else(bad)?;
        Ok(RunsFeed(
            FeedPos::Xact {
                tx: tx.parse().map_err(|_| bad())?,
                ord: ord.parse().map_err(|_| bad())?,
            },
            PhantomData,
        ))
    }
}

/// The next changes of `feed`, at most `limit` (1 to [`MAX_PAGE`]).
pub(crate) fn runs_feed<B: Backend, C: Work + ?Sized>(
    conn: &C,
    feed: &mut RunsFeed<B>,
    limit: usize,
) -> Result<Vec<RunInfo>> {
    check_limit(limit)?;
    let mut pos = feed.0.clone();
    let rows = Inspect::runs_feed(conn, &mut pos, limit)?;
    let runs = rows
        .into_iter()
        .map(RunInfo::from_row)
        .collect::<Result<_>>()?;
    feed.0 = pos;
    Ok(runs)
}

/// Dead letters (open or not) with an id after `after`, oldest first.
pub(crate) fn dead_letters_after<C: Work + ?Sized>(
    conn: &C,
    after: i64,
    limit: usize,
) -> Result<Vec<DeadLetter>> {
    check_limit(limit)?;
    crate::store::DeadLetters::list(conn, true, after, limit as i64)
}
