//! Layer 2, core: one open database — its writer and `Tx`, the change log,
//! cursors, leases, workspaces, the wake-ups — and nothing of rules, runs or
//! threads.

pub(crate) mod changelog;
pub(crate) mod combiner;
pub(crate) mod cursor;
pub(crate) mod db;
pub(crate) mod lease;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod settings;
pub(crate) mod sqlite;
pub(crate) mod wake;
pub(crate) mod workspace;
pub(crate) mod writer;
