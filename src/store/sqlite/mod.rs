//! SQLite's statements, one file per table group of the seam, each
//! implementing its group on [`rusqlite::Connection`] in place; its
//! connections (`conn`: pragmas set and read back, the writer's guard) and
//! its schema (`schema`: `schema.sql` and its migrations).

pub(crate) mod audit;
pub(crate) mod conn;
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
pub(crate) mod schema;
pub(crate) mod steps;
pub(crate) mod workspaces;
