//! The change log: appending (with its checks) and reading.

use serde::de::IgnoredAny;

use crate::base::error::{Error, Result};
use crate::base::event::{Appended, Event, NewEvent, Query, RESERVED_TYPES};
use crate::base::limits::{self, MAX_ID_BYTES, MAX_SUBJECT_BYTES};
use crate::core::settings::Limits;
use crate::store::events;
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
/// nothing and reports the existing seq (invariant 3).
pub(crate) fn append<C: Events + Workspaces + ?Sized>(
    conn: &C,
    now: i64,
    limits: Limits,
    workspace: &str,
    ev: &NewEvent,
    origin: Origin,
) -> Result<Appended> {
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
    let payload = checked_payload(ev, limits.max_payload_bytes, origin)?;
    let id = match &ev.id {
        Some(id) => {
            limits::check_text("id", id, MAX_ID_BYTES)?;
            // Looked up first: an INSERT that conflicts would still take a
            // seq from AUTOINCREMENT (sqlite_sequence moves on), leaving a
            // gap and a head that counts an event never appended. A fresh
            // generated id cannot be there, and skips the look-up.
            if let Some(seq) = Events::seq_of(conn, workspace, id)? {
                return Ok(Appended {
                    seq,
                    id: id.clone(),
                    existing: true,
                });
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

    let row = events::NewRow {
        workspace,
        id: &id,
        event_type: &ev.event_type,
        subject: &ev.subject,
        actor: &ev.actor,
        occurred_at: ev.occurred_at,
        recorded_at: now,
        payload,
        causation_id: ev.causation_id.as_deref(),
        correlation_id: ev.correlation_id.as_deref(),
        depth,
    };
    match Events::insert(conn, &row)? {
        Inserted::At(seq) => Ok(Appended {
            seq,
            id,
            existing: false,
        }),
        Inserted::Existing => {
            let seq = Events::seq_of(conn, workspace, &id)?
                .expect("the insert conflicted on this id, so the row exists");
            Ok(Appended {
                seq,
                id,
                existing: true,
            })
        }
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
        // One more level of nesting: the wrapper around the input.
        Origin::Engine { .. } => check_json_within(
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
    check_json_within(field, text, max, MAX_JSON_DEPTH)
}

/// [`check_json`] for text serde produced from a typed value (a rule's
/// state, a firing's input): valid JSON by construction, so only its size
/// and depth are checked, not parsed again.
pub(crate) fn check_serialized(field: &'static str, text: &str, max: usize) -> Result<()> {
    if text.len() > max {
        return Err(Error::invalid(
            field,
            format!("{} bytes, more than the limit of {max}", text.len()),
        ));
    }
    let depth = json_depth(text);
    if depth > MAX_JSON_DEPTH {
        return Err(Error::invalid(
            field,
            format!("nested {depth} levels deep; at most {MAX_JSON_DEPTH}"),
        ));
    }
    Ok(())
}

fn check_json_within(field: &'static str, text: &str, max: usize, max_depth: usize) -> Result<()> {
    if text.len() > max {
        return Err(Error::invalid(
            field,
            format!("{} bytes, more than the limit of {max}", text.len()),
        ));
    }
    // Depth first: serde skips an ignored value without its recursion
    // limit, and SQLite's json_valid refuses more than 1,000 levels.
    let depth = json_depth(text);
    if depth > max_depth {
        return Err(Error::invalid(
            field,
            format!("nested {depth} levels deep; at most {max_depth}"),
        ));
    }
    if let Err(e) = serde_json::from_str::<IgnoredAny>(text) {
        return Err(Error::invalid(field, format!("not JSON: {e}")));
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
