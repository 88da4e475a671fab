//! Layer 1, the store: every SQL statement reflexr runs, with the table it
//! touches, behind the seam between the engine and its database.
//!
//! The seam is one small trait per table group — [`Workspaces`],
//! [`Events`], [`Cursors`], [`Leases`], [`Audit`] (what the core asks of a
//! connection, [`Core`]), and [`Runs`], [`Lanes`], [`Control`],
//! [`Counters`], [`DeadLetters`], [`Rules`], [`Schedules`], [`Inspect`],
//! [`Followers`], [`Steps`] (what the work layer asks, [`Work`]) — each in its own file
//! with the rows it speaks in. A backend is a folder with the same file
//! list, implementing each group in place on its connection:
//! `store::sqlite` on [`rusqlite::Connection`], and `store::postgres`
//! (feature `postgres`) on its own, beside its schema and migrations.
//! Nothing is boxed: the SQLite path compiles to its statements' calls.
//!
//! A connection here is one inside a transaction, or a reader: the store
//! never begins or ends a transaction itself. A function above states the
//! groups it needs as bounds (`C: Events + Workspaces`), and a backend
//! supports it when it implements those groups: the compiler, not a
//! runtime check, says what runs where.
//!
//! Call the methods through the trait (`Events::page(conn, …)`): an
//! inherent method of the connection type with the same name would win over
//! the trait's in method-call syntax. The conformance suite
//! (`store::conformance`) is the contract every backend signs.

pub(crate) mod audit;
#[cfg(test)]
pub(crate) mod conformance;
pub(crate) mod control;
pub(crate) mod counters;
pub(crate) mod cursors;
pub(crate) mod dead_letters;
pub(crate) mod events;
pub(crate) mod followers;
pub(crate) mod inspect;
pub(crate) mod leases;
pub(crate) mod rules;
pub(crate) mod runs;
pub(crate) mod schedules;
pub(crate) mod steps;
pub(crate) mod workspaces;

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod sqlite;

pub use audit::Audit;
pub use control::{ClaimPlan, Control};
pub use counters::Counters;
pub use cursors::Cursors;
pub use dead_letters::DeadLetters;
pub use events::{Events, Inserted};
pub use followers::Followers;
pub use inspect::{Inspect, RunFind};
pub use leases::Leases;
pub use rules::Rules;
pub use runs::{Lanes, Runs};
pub use schedules::Schedules;
pub use steps::Steps;
pub use workspaces::Workspaces;

/// What the work layer (rules, runs, executors) asks of a connection.
pub trait Work:
    Core
    + Runs
    + Lanes
    + Control
    + Counters
    + DeadLetters
    + Rules
    + Schedules
    + Inspect
    + Followers
    + Steps
{
}
impl<T> Work for T where
    T: Core
        + Runs
        + Lanes
        + Control
        + Counters
        + DeadLetters
        + Rules
        + Schedules
        + Inspect
        + Followers
        + Steps
        + ?Sized
{
}

/// What each row of a batch written in one call (a rule's firings) did,
/// in order; or the index of the row whose write failed, and why (`None`:
/// a statement for the whole batch failed, so no one row is to blame).
/// After a failure the caller rolls back what the batch wrote: one
/// statement may have written the rows after the one refused. A backend
/// whose every statement is a round trip writes such a batch in one
/// statement; the others write it [`one_by_one`].
pub(crate) type Batched<T> =
    std::result::Result<Vec<T>, (Option<usize>, crate::base::error::Error)>;

/// A batch written one row after another by `write`, to the first row it
/// fails on.
pub(crate) fn one_by_one<R, T>(
    rows: &[R],
    mut write: impl FnMut(&R) -> crate::base::error::Result<T>,
) -> Batched<T> {
    rows.iter()
        .enumerate()
        .map(|(i, row)| write(row).map_err(|e| (Some(i), e)))
        .collect()
}

/// Everything the core asks of a connection.
pub trait Core: Events + Workspaces + Cursors + Leases + Audit {}
impl<T: Events + Workspaces + Cursors + Leases + Audit + ?Sized> Core for T {}

/// SQLite, the default backend: one file, one writer per file (see
/// [`crate::Engine`]). Its statements are `store::sqlite`'s, its open
/// database `core::sqlite`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sqlite {}

/// PostgreSQL (feature `postgres`): a server database that processes on
/// several machines share (see `Engine::builder_postgres`). Its statements
/// are `store::postgres`'s, its open database `core::postgres`'s.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Postgres {}
