//! Workspaces: named logs inside the file, and the event types each accepts.

use crate::base::error::{Error, Result};
use crate::base::event::RESERVED_TYPES;
use crate::base::limits;
use crate::store::Workspaces;

/// A workspace as listed by [`crate::Engine::workspaces`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct WorkspaceInfo {
    /// Its name.
    pub name: String,
    /// When it was created (ms since the epoch).
    pub created_at: i64,
    /// The types applications may append to it (the reserved ones left out).
    pub event_types: Vec<String>,
}

/// Creates the workspace with its reserved types; false when it existed.
pub(crate) fn create<C: Workspaces + ?Sized>(conn: &C, now: i64, name: &str) -> Result<bool> {
    limits::check_name("workspace", name)?;
    let created = Workspaces::insert(conn, name, now)?;
    // Registered for every workspace, so the engine's RuleFired and
    // RuleErrored pass the (workspace, type) foreign key.
    for t in RESERVED_TYPES {
        Workspaces::register_type(conn, name, t, true, now)?;
    }
    Ok(created)
}

/// Registers application event types; registering one again is a no-op.
pub(crate) fn register_types<C: Workspaces + ?Sized>(
    conn: &C,
    now: i64,
    workspace: &str,
    types: &[&str],
) -> Result<()> {
    limits::check_name("workspace", workspace)?;
    for t in types {
        limits::check_name("event type", t)?;
        if RESERVED_TYPES.contains(t) {
            return Err(Error::ReservedType {
                event_type: (*t).to_string(),
            });
        }
    }
    if !Workspaces::exists(conn, workspace)? {
        return Err(Error::not_found("workspace", workspace));
    }
    for t in types {
        Workspaces::register_type(conn, workspace, t, false, now)?;
    }
    Ok(())
}

pub(crate) fn list<C: Workspaces + ?Sized>(conn: &C) -> Result<Vec<WorkspaceInfo>> {
    Workspaces::list(conn)?
        .into_iter()
        .map(|(name, created_at)| {
            let event_types = Workspaces::app_types(conn, &name)?;
            Ok(WorkspaceInfo {
                name,
                created_at,
                event_types,
            })
        })
        .collect()
}
