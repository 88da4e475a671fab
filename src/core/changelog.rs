//! The change log: appending (with its checks) and reading.

use serde::de::IgnoredAny;

use crate::base::error::{Error, Result};
use crate::base::event::{
    AppendCondition, Appended, Event, Expected, NewEvent, Query, RESERVED_TYPES,
};
use crate::base::limits::{self, MAX_ID_BYTES, MAX_SUBJECT_BYTES};
use crate::base::step::{EventMatch, check_field_path};
use crate::base::upcast::Upcasters;
use crate::core::settings::Limits;
use crate::store::events;
use crate::store::{Batched, one_by_one};
use crate::store::{Events, Inserted, Workspaces};

/// Who is appending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// An application: reserved types refused, depth from the causation.
    App,
    /// The engine itself (`RuleFired`, `RuleErrored`): reserved types
    /// allowed, at the given depth.
    Engine { depth: i64 },
    /// A run's emitted event: reserved types refused, at the given depth.
    Run { depth: i64 },
}

/// A time-ordered id: UUIDv7, so new ids land at the end of the id index
/// (DESIGN.md measured random ids 7× slower under a UNIQUE index).
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Appends `ev` to `workspace`'s log in the caller's transaction, with
/// `now` as its `recorded_at`; an id the workspace has already appends
/// nothing and reports the existing seq (invariant 3). The event takes the
/// next version of its subject, and an expectation of that version that
/// does not hold appends nothing and fails with `AppendConflict`
/// (invariant 13): read after the head's lock, so no other writer moves
/// the subject between the look and the commit.
pub(crate) fn append<C: Events + Workspaces + ?Sized>(
    conn: &C,
    now: i64,
    limits: Limits,
    workspace: &str,
    ev: &NewEvent,
    origin: Origin,
    span: Option<&str>,
) -> Result<Appended> {
    let checked = match check(conn, limits, workspace, ev, origin)? {
        Checked::Existing(appended) => return Ok(appended),
        Checked::New(checked) => checked,
    };

    // An expectation is checked after the head's lock; without one, the
    // insert finds the version itself (SQLite's in its one statement;
    // PostgreSQL's too when its transaction holds the head already).
    let version = match ev.expected {
        Expected::Any => None,
        expected => {
            Events::lock_head(conn)?;
            let version = Events::subject_version(conn, workspace, &ev.subject)?;
            if !expected.holds(version) {
                let last = Events::subject_events(conn, workspace, &ev.subject, version, 1)?;
                return Err(Error::AppendConflict {
                    workspace: workspace.to_string(),
                    subject: Some(ev.subject.clone()),
                    expected: expected.to_string(),
                    actual_version: Some(version),
                    seq: last.first().map(|e| e.seq),
                });
            }
            Some(version + 1)
        }
    };
    let row = checked.row(workspace, ev, version, now, span);
    let inserted = Events::insert(conn, &row)?;
    appended(conn, workspace, ev, checked.id, inserted)
}

/// Appends `events`, the engine's own (`RuleFired`, each at its depth), to
/// `workspace`'s log in order, in the caller's transaction, as
/// [`append`] each would — in one statement where the backend can
/// ([`Events::insert_all`]). What each append did, or which was refused
/// ([`Batched`]: a failed statement for the whole batch blames none, and
/// the caller may append them one by one to find which).
pub(crate) fn append_all<C: Events + Workspaces + ?Sized>(
    conn: &C,
    now: i64,
    limits: Limits,
    workspace: &str,
    events: &[(NewEvent, Origin)],
) -> Batched<Appended> {
    // An expectation is checked one append at a time, after the head.
    if events
        .iter()
        .any(|(ev, _)| !matches!(ev.expected, Expected::Any))
    {
        return one_by_one(events, |(ev, origin)| {
            append(conn, now, limits, workspace, ev, *origin, None)
        });
    }
    let mut checked = Vec::with_capacity(events.len());
    for (i, (ev, origin)) in events.iter().enumerate() {
        match check(conn, limits, workspace, ev, *origin).map_err(|e| (Some(i), e))? {
            Checked::New(c) => checked.push(c),
            // Only an expectation looks an id up first.
            Checked::Existing(_) => unreachable!("no expectation, no look-up"),
        }
    }
    let rows: Vec<events::NewRow<'_>> = checked
        .iter()
        .zip(events)
        .map(|(c, (ev, _))| c.row(workspace, ev, None, now, None))
        .collect();
    let inserted = Events::insert_all(conn, &rows)?;
    drop(rows);
    checked
        .into_iter()
        .zip(inserted)
        .zip(events)
        .enumerate()
        .map(|(i, ((c, inserted), (ev, _)))| {
            appended(conn, workspace, ev, c.id, inserted).map_err(|e| (Some(i), e))
        })
        .collect()
}

/// An append's checks passed: what its row is made of.
struct CheckedEvent<'e> {
    id: String,
    depth: i64,
    payload: &'e str,
}

impl<'e> CheckedEvent<'e> {
    fn row<'r>(
        &'r self,
        workspace: &'r str,
        ev: &'r NewEvent,
        version: Option<i64>,
        now: i64,
        span: Option<&'r str>,
    ) -> events::NewRow<'r> {
        events::NewRow {
            workspace,
            id: &self.id,
            event_type: &ev.event_type,
            subject: &ev.subject,
            version,
            actor: &ev.actor,
            occurred_at: ev.occurred_at,
            recorded_at: now,
            payload: self.payload,
            causation_id: ev.causation_id.as_deref(),
            correlation_id: ev.correlation_id.as_deref(),
            depth: self.depth,
            // The append's span when there is one (a child of the given
            // traceparent), else what it was given.
            traceparent: span.or(ev.traceparent.as_deref()),
        }
    }
}

/// What an append's checks found.
enum Checked<'e> {
    /// Its id is there already (looked up only before an expectation).
    Existing(Appended),
    New(CheckedEvent<'e>),
}

/// An append's checks, before its row is written: its fields, its
/// payload, its id (an expectation's append finds one there already
/// first), its depth.
fn check<'e, C: Events + ?Sized>(
    conn: &C,
    limits: Limits,
    workspace: &str,
    ev: &'e NewEvent,
    origin: Origin,
) -> Result<Checked<'e>> {
    limits::check_name("workspace", workspace)?;
    limits::check_name("event type", &ev.event_type)?;
    if !matches!(origin, Origin::Engine { .. }) && RESERVED_TYPES.contains(&ev.event_type.as_str())
    {
        return Err(Error::ReservedType {
            event_type: ev.event_type.clone(),
        });
    }
    limits::check_text("subject", &ev.subject, MAX_SUBJECT_BYTES)?;
    limits::check_text("actor", &ev.actor, MAX_ID_BYTES)?;
    for (field, v) in [
        ("causation_id", &ev.causation_id),
        ("correlation_id", &ev.correlation_id),
    ] {
        if let Some(v) = v {
            limits::check_text(field, v, MAX_ID_BYTES)?;
        }
    }
    if let Some(tp) = &ev.traceparent {
        limits::check_traceparent("traceparent", tp)?;
    }
    let payload = checked_payload(ev, limits.max_payload_bytes, origin)?;
    if let Expected::Version(n) = ev.expected
        && n < 0
    {
        return Err(Error::invalid(
            "expected version",
            format!("{n}: a version is never negative"),
        ));
    }
    let id = match &ev.id {
        Some(id) => {
            limits::check_text("id", id, MAX_ID_BYTES)?;
            // Looked up first only before an expectation is checked (an
            // append made already is found, whatever its subject's version
            // is now); otherwise the insert finds it itself, which takes no
            // seq (see `Events::insert`): a statement less. A fresh
            // generated id cannot be there, and skips both.
            if !matches!(ev.expected, Expected::Any)
                && let Some(seq) = Events::seq_of(conn, workspace, id)?
            {
                return Ok(Checked::Existing(existing(conn, seq, id.clone())?));
            }
            id.clone()
        }
        None => new_id(),
    };
    let depth = match (origin, &ev.causation_id) {
        (Origin::Engine { depth } | Origin::Run { depth }, _) => depth,
        (Origin::App, Some(cause)) => {
            Events::depth_of(conn, workspace, cause)?.map_or(0, |d| d + 1)
        }
        (Origin::App, None) => 0,
    };
    Ok(Checked::New(CheckedEvent { id, depth, payload }))
}

/// What an append whose insert did `inserted` reports.
fn appended<C: Events + Workspaces + ?Sized>(
    conn: &C,
    workspace: &str,
    ev: &NewEvent,
    id: String,
    inserted: Inserted,
) -> Result<Appended> {
    match inserted {
        Inserted::At { seq, version } => Ok(Appended {
            seq,
            id,
            existing: false,
            version,
        }),
        // An id this call made, which nothing else has: the event is this
        // call's, committed by a try whose answer a cut connection lost
        // (a lone append on PostgreSQL is sent again on another).
        Inserted::Existing { seq } if ev.id.is_none() => Ok(Appended {
            existing: false,
            ..existing(conn, seq, id)?
        }),
        Inserted::Existing { seq } => existing(conn, seq, id),
        Inserted::Unregistered => {
            // The only foreign key is (workspace, type): find out which half.
            if !Workspaces::exists(conn, workspace)? {
                Err(Error::not_found("workspace", workspace))
            } else {
                Err(Error::not_found(
                    "event type",
                    format!("{} (workspace {workspace})", ev.event_type),
                ))
            }
        }
    }
}

/// What re-appending the id of the event at `seq` reports.
fn existing<C: Events + ?Sized>(conn: &C, seq: i64, id: String) -> Result<Appended> {
    let version = Events::get(conn, seq)?.map_or(0, |e| e.version);
    Ok(Appended {
        seq,
        id,
        existing: true,
        version,
    })
}

/// Checks `cond` in the caller's transaction: `AppendConflict` naming the
/// first event that matches it after its position, if one does. After the
/// head's lock, as an append's expectation: no other writer can append a
/// match between this look and the commit.
pub(crate) fn check_condition<C: Events + ?Sized>(
    conn: &C,
    cond: &AppendCondition,
    up: &Upcasters,
) -> Result<()> {
    limits::check_name("workspace", &cond.workspace)?;
    if cond.after < 0 {
        return Err(Error::invalid("after", "a seq is never negative"));
    }
    for t in &cond.types {
        limits::check_name("event type", t)?;
    }
    if let Some(s) = &cond.subject {
        limits::check_text("subject", s, MAX_SUBJECT_BYTES)?;
    }
    let field = match &cond.field {
        None => None,
        Some((path, value)) => {
            let value = value
                .as_deref()
                .map_err(|m| Error::Encode { message: m.clone() })?;
            check_field_path(path)?;
            Some((path.as_str(), value))
        }
    };
    // Matched as readers see events: by the newest version's type and
    // payload.
    let Some(types) = up.stored_types(&cond.types) else {
        return Ok(());
    };
    Events::lock_head(conn)?;
    const PAGE: usize = 500;
    let mut after = cond.after;
    loop {
        let mut page = match &cond.subject {
            Some(subject) => {
                Events::by_subject(conn, &cond.workspace, after, &types, subject, PAGE)?
            }
            None => Events::page(conn, &cond.workspace, after, &types, PAGE)?,
        };
        up.apply_all(&mut page);
        for event in &page {
            let matches = match field {
                None => true,
                Some((path, value)) => EventMatch::key_of(path, &event.subject, event.json()?)
                    .is_some_and(|k| k == value),
            };
            if matches {
                return Err(Error::AppendConflict {
                    workspace: cond.workspace.clone(),
                    subject: cond.subject.clone(),
                    expected: cond.describe(),
                    actual_version: None,
                    seq: Some(event.seq),
                });
            }
        }
        match page.last() {
            Some(last) if page.len() == PAGE => after = last.seq,
            _ => return Ok(()),
        }
    }
}

/// Up to `limit` of `subject`'s events in `workspace` from version `from`
/// on, in order, through the subject's index.
pub(crate) fn read_subject<C: Events + ?Sized>(
    conn: &C,
    workspace: &str,
    subject: &str,
    from: i64,
    limit: usize,
) -> Result<Vec<Event>> {
    limits::check_name("workspace", workspace)?;
    limits::check_text("subject", subject, MAX_SUBJECT_BYTES)?;
    if from < 0 {
        return Err(Error::invalid(
            "from version",
            "a version is never negative",
        ));
    }
    if limit == 0 || limit > Query::MAX_LIMIT {
        return Err(Error::invalid(
            "limit",
            format!("must be 1 to {}, got {limit}", Query::MAX_LIMIT),
        ));
    }
    Events::subject_events(conn, workspace, subject, from, limit)
}

/// `subject`'s version in `workspace` (0: no events yet).
pub(crate) fn subject_version<C: Events + ?Sized>(
    conn: &C,
    workspace: &str,
    subject: &str,
) -> Result<i64> {
    limits::check_name("workspace", workspace)?;
    limits::check_text("subject", subject, MAX_SUBJECT_BYTES)?;
    Events::subject_version(conn, workspace, subject)
}

/// How much larger than the payload limit the engine's own envelopes
/// (`RuleFired`, `RuleErrored`) may be: their wrapper — names, ids, the
/// scope, a clipped error — around an action's input, which is itself
/// checked against the limit. So a firing the log could hold the input of is
/// always recorded.
pub const ENVELOPE_ALLOWANCE_BYTES: usize = 16 * 1024;

fn checked_payload(ev: &NewEvent, max: usize, origin: Origin) -> Result<&str> {
    let payload = match &ev.payload {
        Ok(p) => p.as_str(),
        Err(message) => {
            return Err(Error::Encode {
                message: message.clone(),
            });
        }
    };
    match origin {
        // The engine's envelopes (`RuleFired`, `RuleErrored`) are serde's
        // text of a value, JSON by construction: their size and depth are
        // checked, not parsed again. One more level of nesting: the wrapper
        // around the input.
        Origin::Engine { .. } => check_size_and_depth(
            "payload",
            payload,
            max + ENVELOPE_ALLOWANCE_BYTES,
            MAX_JSON_DEPTH + 1,
        )?,
        _ => check_json("payload", payload, max)?,
    }
    Ok(payload)
}

/// Checks JSON text the engine stores (a payload, a run's input, a
/// checkpoint, a rule's state): at most `max` bytes, at most
/// [`MAX_JSON_DEPTH`] levels deep, and JSON. A malformed value is a typed
/// error here rather than a CHECK constraint failure in SQLite.
pub(crate) fn check_json(field: &'static str, text: &str, max: usize) -> Result<()> {
    // Depth first: serde skips an ignored value without its recursion
    // limit, and SQLite's json_valid refuses more than 1,000 levels.
    check_size_and_depth(field, text, max, MAX_JSON_DEPTH)?;
    if let Err(e) = serde_json::from_str::<IgnoredAny>(text) {
        return Err(Error::invalid(field, format!("not JSON: {e}")));
    }
    Ok(())
}

/// [`check_json`] for text serde produced from a typed value (a rule's
/// state, a firing's input): valid JSON by construction, so only its size
/// and depth are checked, not parsed again.
pub(crate) fn check_serialized(field: &'static str, text: &str, max: usize) -> Result<()> {
    check_size_and_depth(field, text, max, MAX_JSON_DEPTH)
}

/// At most `max` bytes and `max_depth` levels of nesting.
fn check_size_and_depth(
    field: &'static str,
    text: &str,
    max: usize,
    max_depth: usize,
) -> Result<()> {
    if text.len() > max {
        return Err(Error::invalid(
            field,
            format!("{} bytes, more than the limit of {max}", text.len()),
        ));
    }
    let depth = json_depth(text);
    if depth > max_depth {
        return Err(Error::invalid(
            field,
            format!("nested {depth} levels deep; at most {max_depth}"),
        ));
    }
    Ok(())
}

/// How deeply a payload's arrays and objects may nest.
pub const MAX_JSON_DEPTH: usize = 256;

/// The deepest nesting of arrays and objects in JSON text (brackets inside
/// strings do not count). Linear, and without recursion.
pub(crate) fn json_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// One event by seq.
pub(crate) fn event<C: Events + ?Sized>(conn: &C, seq: i64) -> Result<Option<Event>> {
    Events::get(conn, seq)
}

/// One event of `workspace` by its id.
pub(crate) fn event_by_id<C: Events + ?Sized>(
    conn: &C,
    workspace: &str,
    id: &str,
) -> Result<Option<Event>> {
    limits::check_name("workspace", workspace)?;
    limits::check_text("id", id, MAX_ID_BYTES)?;
    Events::by_id(conn, workspace, id)
}

/// The highest seq ever assigned (0 before the first append).
pub(crate) fn head<C: Events + ?Sized>(conn: &C) -> Result<i64> {
    Events::head(conn)
}

/// [`read`] as the application gets it: a filter by type names the newest
/// versions (and reads the older ones stored), and each event comes upcast.
pub(crate) fn read_upcast<C: Events + ?Sized>(
    conn: &C,
    q: &Query,
    up: &Upcasters,
) -> Result<Vec<Event>> {
    if up.is_empty() {
        return read(conn, q);
    }
    q.validate()?;
    let Some(types) = up.stored_types(&q.types) else {
        return Ok(Vec::new());
    };
    let mut stored = q.clone();
    stored.types = types;
    let mut events = read(conn, &stored)?;
    up.apply_all(&mut events);
    Ok(events)
}

pub(crate) fn read<C: Events + ?Sized>(conn: &C, q: &Query) -> Result<Vec<Event>> {
    q.validate()?;
    match &q.subject {
        None => Events::page(conn, &q.workspace, q.after, &q.types, q.limit),
        Some(subject) => {
            Events::by_subject(conn, &q.workspace, q.after, &q.types, subject, q.limit)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::json_depth;

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(json_depth("{}"), 1);
        assert_eq!(json_depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(json_depth(r#"{"a":"[[[[\"]]]]"}"#), 1);
        assert_eq!(json_depth("12"), 0);
    }
}
