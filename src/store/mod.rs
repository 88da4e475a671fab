//! The storage layer: every SQL statement reflexr runs lives here, with the
//! table it touches. The engine above it decides; this layer reads and writes
//! rows. `backend` is the seam the engine calls the tables through, so a
//! second backend stands in: `pg` (feature `postgres`) holds PostgreSQL's
//! statements and schema.

pub(crate) mod audit;
pub(crate) mod backend;
pub(crate) mod conn;
pub(crate) mod control;
pub(crate) mod counters;
pub(crate) mod cursors;
pub(crate) mod dead_letters;
pub(crate) mod events;
pub(crate) mod followers;
pub(crate) mod leases;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
pub(crate) mod rules;
pub(crate) mod runs;
pub(crate) mod schedules;
pub(crate) mod schema;
pub(crate) mod workspaces;
