//! `reflexr_workspaces` and `reflexr_event_types`: the workspaces and the event types each accepts.
//!
//! The table group every backend implements (`store::sqlite::workspaces`,
//! `store::postgres::workspaces`), and the rows it speaks in.

use crate::base::error::Result;

/// `reflexr_workspaces` and `reflexr_event_types`.
pub trait Workspaces {
    /// Inserts the workspace; false when it existed already.
    fn insert(&self, name: &str, now: i64) -> Result<bool>;
    fn exists(&self, name: &str) -> Result<bool>;
    /// Registers `event_type` for the workspace; false when it was
    /// registered already.
    fn register_type(
        &self,
        workspace: &str,
        event_type: &str,
        reserved: bool,
        now: i64,
    ) -> Result<bool>;
    /// Every workspace with its creation time, by name.
    fn list(&self) -> Result<Vec<(String, i64)>>;
    /// The types an application may append (the reserved ones left out).
    fn app_types(&self, workspace: &str) -> Result<Vec<String>>;
}
