//! `reflexr_events`, the change log.
//!
//! The table group every backend implements (`store::sqlite::events`,
//! `store::postgres::events`), and the rows it speaks in.

use crate::base::error::Result;
use crate::base::event::Event;
use crate::store::{Batched, one_by_one};

/// One row to insert.
pub struct NewRow<'a> {
    pub workspace: &'a str,
    pub id: &'a str,
    pub event_type: &'a str,
    pub subject: &'a str,
    /// The subject's version this event takes, one more than
    /// [`Events::subject_version`] read in the same transaction after
    /// [`Events::lock_head`]; `None`: the insert finds it (SQLite in its
    /// one statement, the one writer holding the file; PostgreSQL in its
    /// one statement where the transaction holds the head already, else
    /// after taking it).
    pub version: Option<i64>,
    pub actor: &'a str,
    pub occurred_at: i64,
    pub recorded_at: i64,
    pub payload: &'a str,
    pub causation_id: Option<&'a str>,
    pub correlation_id: Option<&'a str>,
    pub depth: i64,
    /// The W3C trace context of the work that appended it.
    pub traceparent: Option<&'a str>,
}

/// What inserting an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Appended at this seq, at this subject version.
    At { seq: i64, version: i64 },
    /// The workspace has an event with this id already, at this seq;
    /// nothing inserted.
    Existing { seq: i64 },
    /// The (workspace, type) pair is not registered: the workspace does
    /// not exist, or does not accept the type. Nothing inserted.
    Unregistered,
}

/// `reflexr_events`, the change log.
///
/// Every backend keeps one seq for the whole log, dense (a rolled-back
/// append leaves no gap) and in commit order: a reader that has seen seq
/// `n` will never later see a new event below `n` (invariant 1, and what a
/// cursor relies on never to skip an event).
pub trait Events {
    /// Appends the row, or finds its id there already
    /// ([`Inserted::Existing`]) and leaves the log as it was: no seq taken,
    /// no gap. So an append without an expected version need not look its
    /// id up first.
    fn insert(&self, row: &NewRow<'_>) -> Result<Inserted>;
    /// Inserts `rows` in order, each as [`Events::insert`] would, their
    /// versions left to the insert (see [`Batched`]). One insert after
    /// another here; a backend whose every statement is a round trip makes
    /// them one statement (PostgreSQL).
    fn insert_all(&self, rows: &[NewRow<'_>]) -> Batched<Inserted> {
        one_by_one(rows, |row| self.insert(row))
    }
    /// Takes the log's head before a transaction that will append takes
    /// anything else, where writers run side by side (PostgreSQL: see
    /// `PgConn::begin_ordered`); SQLite's one writer needs nothing.
    fn lock_head(&self) -> Result<()> {
        Ok(())
    }
    /// The subject's version in the workspace: its last event's, or what
    /// it had reached when its events were pruned; 0 for a subject with no
    /// events. Read after [`Events::lock_head`], so no other append can
    /// move it before this transaction's commits.
    fn subject_version(&self, workspace: &str, subject: &str) -> Result<i64>;
    /// Up to `limit` of the subject's events from version `from` on, in
    /// order, through the subject's index (on SQLite its keys begin with
    /// the subject, then the workspace and the version): the cost does not
    /// grow with the log.
    fn subject_events(
        &self,
        workspace: &str,
        subject: &str,
        from: i64,
        limit: usize,
    ) -> Result<Vec<Event>>;
    /// The seq of the workspace's event with this id.
    fn seq_of(&self, workspace: &str, id: &str) -> Result<Option<i64>>;
    /// The depth of the workspace's event with this id.
    fn depth_of(&self, workspace: &str, id: &str) -> Result<Option<i64>>;
    /// Up to `limit` of the workspace's events after `after`, in seq order;
    /// only those whose type is in `types` unless it is empty.
    fn page(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        limit: usize,
    ) -> Result<Vec<Event>>;
    /// [`Events::page`] of every type into `out`, which it replaces; a
    /// backend may reuse the events already there (their strings' room),
    /// so a reader that keeps `out` between pages allocates a page's
    /// strings once rather than once a page.
    fn page_into(
        &self,
        workspace: &str,
        after: i64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<()> {
        *out = self.page(workspace, after, &[], limit)?;
        Ok(())
    }
    /// Up to `limit` of the workspace's events after `after` with this
    /// subject (and a type in `types` unless it is empty), in seq order.
    fn by_subject(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: &str,
        limit: usize,
    ) -> Result<Vec<Event>>;
    /// One event by seq.
    fn get(&self, seq: i64) -> Result<Option<Event>>;
    /// The workspace's event with this id.
    fn by_id(&self, workspace: &str, id: &str) -> Result<Option<Event>>;
    /// The highest seq ever assigned (0 before the first append); pruning
    /// does not lower it.
    fn head(&self) -> Result<i64>;
    /// How many of the workspace's events come after `position`.
    fn count_after(&self, workspace: &str, position: i64) -> Result<i64>;
    /// Deletes up to `limit` of the workspace's oldest events at or before
    /// `up_to` and recorded before `recorded_before`; how many it deleted.
    /// Each subject whose events it deletes keeps the version it reached
    /// (`reflexr_subject_floors`), so a pruned subject does not count again
    /// from 1.
    fn delete_old(
        &self,
        workspace: &str,
        up_to: i64,
        recorded_before: i64,
        limit: usize,
    ) -> Result<usize>;
}
