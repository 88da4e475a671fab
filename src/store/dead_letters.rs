//! `reflexr_dead_letters`.
//!
//! The table group every backend implements (`store::sqlite::dead_letters`,
//! `store::postgres::dead_letters`), and the rows it speaks in.

use crate::base::dead_letter::{DeadLetter, DeadLetterKind, Reason, Resolution};
use crate::base::error::Result;

/// A dead letter to record.
pub struct NewDeadLetter<'a> {
    pub kind: DeadLetterKind,
    pub consumer: &'a str,
    pub workspace: Option<&'a str>,
    pub event_seq: Option<i64>,
    pub event_id: Option<&'a str>,
    pub run_id: Option<&'a str>,
    pub reason: Reason,
    pub error: &'a str,
    pub attempts: i64,
    pub now: i64,
}

/// What to look for among dead letters, as the store takes it.
pub struct Find<'a> {
    pub kind: Option<DeadLetterKind>,
    pub consumer: Option<&'a str>,
    pub workspace: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub include_resolved: bool,
    /// Only dead letters before this id (newest first).
    pub before: i64,
    pub limit: usize,
    /// How many ids below `before` one call looks through.
    pub window: i64,
}

/// `reflexr_dead_letters`.
pub trait DeadLetters {
    /// Records it, once per (consumer, event) or open run (see
    /// `store::dead_letters::insert`); whether it was new or opened again.
    fn insert(&self, d: &NewDeadLetter<'_>) -> Result<bool>;
    /// Open dead letters (or all), oldest first, after `after_id`.
    fn list(&self, include_resolved: bool, after_id: i64, limit: i64) -> Result<Vec<DeadLetter>>;
    fn get(&self, id: i64) -> Result<Option<DeadLetter>>;
    /// The open dead letter of a run.
    fn open_for_run(&self, run_id: &str) -> Result<Option<DeadLetter>>;
    /// Resolves an open dead letter; false if it was resolved already.
    fn resolve(&self, id: i64, resolution: Resolution, now: i64) -> Result<bool>;
    /// Dead letters not yet resolved, by kind.
    fn open_counts(&self) -> Result<Vec<(DeadLetterKind, i64)>>;
    /// Deletes up to `limit` dead letters an operator resolved before
    /// `before`; how many went.
    fn delete_resolved(&self, before: i64, limit: usize) -> Result<usize>;
    /// Resolves (as retried) the open dead letter of `consumer` for the
    /// event at `seq`, if there is one.
    #[allow(clippy::too_many_arguments)]
    fn resolve_for_event(
        &self,
        kind: DeadLetterKind,
        consumer: &str,
        workspace: &str,
        seq: i64,
        now: i64,
    ) -> Result<bool>;
}
