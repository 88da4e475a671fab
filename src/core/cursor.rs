//! Cursors: a consumer's last handled seq in one workspace.
//!
//! A cursor is durable, per (workspace, kind, name), and only moves forward
//! (DESIGN.md, invariant 8): saving an older position is an error. The one
//! exception is an operator's reset, which is recorded in `reflexr_audit`.

use crate::base::audit::AuditAction;
use crate::base::error::{Error, Result};
use crate::base::limits::{self, MAX_ID_BYTES};
use crate::base::text::text_enum;
use crate::store::audit;
use crate::store::{Audit, Cursors, Events, Workspaces};

text_enum! {
    /// What kind of consumer a cursor belongs to. The kinds have separate
    /// name spaces: an application consumer called `mail` and a reaction
    /// called `mail` have separate cursors.
    pub enum ConsumerKind ("consumer kind") {
        /// A consumer of the application's own ([`crate::Engine::save_cursor`]).
        App = "app",
        /// A rule's evaluation cursor.
        Rule = "rule",
        /// A reaction's cursor.
        Reaction = "reaction",
        /// A follower's cursor on its source workspace.
        Follower = "follower",
    }
}

/// A cursor as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CursorInfo {
    /// The workspace it reads.
    pub workspace: String,
    /// The consumer's kind.
    pub kind: ConsumerKind,
    /// The consumer's name.
    pub name: String,
    /// The last seq the consumer handled.
    pub position: i64,
    /// How many of the workspace's events are after it.
    pub lag: i64,
    /// When it last moved, in ms since the epoch.
    pub updated_at: i64,
    /// How many times the consumer's commit failed at this position (0 once
    /// it moves). At [`STUCK_AFTER_FAILURES`] it is stuck.
    pub failures: i64,
    /// The last of those failures' error.
    pub last_error: Option<String>,
}

impl CursorInfo {
    /// True when the consumer's commit failed [`STUCK_AFTER_FAILURES`] times
    /// or more at this position: it is not moving (`reflexr_stuck_consumers`).
    pub fn is_stuck(&self) -> bool {
        self.failures >= STUCK_AFTER_FAILURES
    }
}

/// How many failed commits at one position make a consumer stuck (the view
/// `reflexr_stuck_consumers` uses the same number).
pub const STUCK_AFTER_FAILURES: i64 = 3;

/// What an operator's reset did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CursorReset {
    /// Where the cursor was (None: it had never been saved).
    pub from: Option<i64>,
    /// Where it is now.
    pub to: i64,
}

pub(crate) fn load<C: Cursors + ?Sized>(
    conn: &C,
    workspace: &str,
    kind: ConsumerKind,
    name: &str,
) -> Result<i64> {
    limits::check_name("workspace", workspace)?;
    limits::check_name("consumer", name)?;
    Ok(Cursors::get(conn, workspace, kind.as_str(), name)?.unwrap_or(0))
}

fn check_position<C: Events + Workspaces + ?Sized>(
    conn: &C,
    workspace: &str,
    name: &str,
    position: i64,
) -> Result<()> {
    limits::check_name("workspace", workspace)?;
    limits::check_name("consumer", name)?;
    if position < 0 {
        return Err(Error::invalid("position", "a seq is never negative"));
    }
    if !Workspaces::exists(conn, workspace)? {
        return Err(Error::not_found("workspace", workspace));
    }
    let head = Events::head(conn)?;
    if position > head {
        return Err(Error::CursorAhead {
            consumer: name.into(),
            workspace: workspace.into(),
            requested: position,
            head,
        });
    }
    Ok(())
}

/// Moves the cursor forward to `position` (saving the same position again is
/// a no-op).
pub(crate) fn save<C: Cursors + Events + Workspaces + ?Sized>(
    conn: &C,
    now: i64,
    (workspace, kind, name): (&str, ConsumerKind, &str),
    position: i64,
) -> Result<()> {
    check_position(conn, workspace, name, position)?;
    match Cursors::advance(conn, workspace, kind.as_str(), name, position, now)? {
        Ok(()) => Ok(()),
        Err(current) => Err(Error::CursorBackwards {
            consumer: name.into(),
            workspace: workspace.into(),
            current,
            requested: position,
        }),
    }
}

/// An operator's reset: moves the cursor to `position`, backwards if need be,
/// and records who did it and why.
pub(crate) fn reset<C: Cursors + Events + Workspaces + Audit + ?Sized>(
    conn: &C,
    now: i64,
    target: (&str, ConsumerKind, &str),
    position: i64,
    operator: &str,
    reason: &str,
) -> Result<CursorReset> {
    let (workspace, kind, name) = target;
    check_position(conn, workspace, name, position)?;
    limits::check_text("operator", operator, MAX_ID_BYTES)?;
    limits::check_text("reason", reason, 4096)?;
    let from = Cursors::set(conn, workspace, kind.as_str(), name, position, now)?;
    let detail = serde_json::json!({ "from": from, "to": position }).to_string();
    Audit::record(
        conn,
        &audit::Entry {
            at: now,
            operator,
            action: AuditAction::ResetCursor,
            target: &format!("cursor {}/{name}@{workspace}", kind.as_str()),
            reason,
            detail: &detail,
        },
    )?;
    Ok(CursorReset { from, to: position })
}

pub(crate) fn list<C: Cursors + ?Sized>(conn: &C) -> Result<Vec<CursorInfo>> {
    Cursors::list(conn)?
        .into_iter()
        .map(|c| {
            Ok(CursorInfo {
                kind: c.kind.parse()?,
                workspace: c.workspace,
                name: c.name,
                position: c.position,
                lag: c.lag,
                updated_at: c.updated_at,
                failures: c.failures,
                last_error: c.last_error,
            })
        })
        .collect()
}
