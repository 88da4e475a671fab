//! reflexr keeps an application's change log, the cursors of everything that
//! reacts to it, leases, a work queue and dead letters in **one SQLite file**.
//!
//! Applications append events in the same transaction as their own rows
//! ([`Engine::write`], [`Tx::append`]). [`Rule`]s decide exactly once per
//! event; their actions run at least once as [`Run`]s, under leases, with
//! retries and backoff. [`Reaction`]s, scheduled [`Job`]s and [`Delivery`]s
//! run in one loop per file; [`Follow`]ers bridge one workspace's log into
//! another with the same ids. Synchronous and thread-based: no async runtime.
//! [`Engine::start`] runs the engine's threads; tests drive the same work in
//! their own thread with [`Engine::run_until_idle`] and a [`ManualClock`].
//!
//! ```
//! use reflexr::{Engine, NewEvent, Query};
//!
//! # fn main() -> reflexr::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path().join("app.db"))?;
//! engine.ensure_workspace("events-app", &["session.changed"])?;
//! engine.write(|tx| tx.execute("CREATE TABLE sessions (id INTEGER PRIMARY KEY, title TEXT)", []))?;
//!
//! // The application's row and the event commit together, or not at all.
//! engine.write(|tx| {
//!     tx.execute("INSERT INTO sessions (id, title) VALUES (42, 'Rust in anger')", [])?;
//!     let at = tx.now_ms();
//!     let ev = NewEvent::new("session.changed", "session/42", "admin", at)
//!         .payload(&serde_json::json!({ "after": { "title": "Rust in anger" } }));
//!     tx.append("events-app", &ev)
//! })?;
//!
//! // A consumer reads after its cursor and moves it forward.
//! let after = engine.cursor("mailer", "events-app")?;
//! let page = engine.read(&Query::new("events-app").after(after))?;
//! assert_eq!(page.len(), 1);
//! engine.save_cursor("mailer", "events-app", page[0].seq)?;
//! # Ok(()) }
//! ```
//!
//! With the feature `postgres`, the same engine opens on a PostgreSQL
//! database — `Engine::open_postgres`, an `Engine<Postgres>` — for
//! processes on several machines, with the methods every [`Backend`] has
//! (workspaces, writes with the application's own SQL, appends, reads,
//! cursors, leases, rules, actions and runs, reactions, deliveries,
//! scheduled jobs, the threads and the drain, operators, stats, the
//! administration server and MCP), and as the hub an edge's followers relay
//! into (`Follow::to_postgres`). The README's "Scaling out" says what is
//! there and what is not yet.
//!
//! The README describes the design, its guarantees and the tests that prove
//! them; `docs/ARCHITECTURE.md` the layers the modules stand in; the schema
//! is `schema.sql` (and `schema.pg.sql` on PostgreSQL), readable with any
//! `sqlite3` shell.

#![warn(missing_docs)]
#![deny(unsafe_code)]

// The layers, each a folder; imports flow down (docs/ARCHITECTURE.md).
mod base;
mod core;
mod runtime;
mod store;
mod work;
// The facade: what an application calls.
mod builder;
mod engine;
mod operator;

// What an application calls: the engine, its builder and its operators'
// view, the writes and what they take, the work it registers.
pub use crate::core::cursor::ConsumerKind;
pub use crate::core::db::{Backend, Tx};
pub use crate::core::lease::Lease;
pub use base::clock::{Clock, ManualClock, SystemClock};
pub use base::durability::Synchronous;
pub use base::error::{Error, HandlerError, Result};
pub use base::event::{Appended, Event, NewEvent, Query};
pub use base::retry::RetryPolicy;
pub use builder::Builder;
pub use engine::{Engine, Watch};
pub use operator::Operator;
pub use runtime::{Drained, Service};
#[cfg(feature = "postgres")]
pub use store::Postgres;
pub use store::Sqlite;
pub use work::control::{ActionConfig, Pausable};
pub use work::delivery::{ChannelPolicy, Delivery, Message};
pub use work::follow::Follow;
pub use work::operate::RuleReset;
pub use work::prune::Retention;
pub use work::queue::enqueue::{Enqueue, Enqueued, Unique};
pub use work::queue::run::{Run, RunContext, RunState};
pub use work::reaction::Reaction;
pub use work::rule::{Decision, OnDeadLetter, OnNewVersion, Rule, RunOrder, Scope, Start};
pub use work::schedule::{Guarantee, Job, Missed, Occurrence};

/// What operators (and applications that show their work) read back: the
/// records, filters, pages and feeds of [`Engine`]'s and [`Operator`]'s
/// reads, and the counters of [`Engine::stats`].
pub mod inspect {
    pub use crate::base::audit::{AuditAction, AuditEntry};
    pub use crate::base::counter::Counter;
    pub use crate::base::dead_letter::{DeadLetter, DeadLetterKind, Reason, Resolution};
    pub use crate::core::cursor::{CursorInfo, CursorReset};
    pub use crate::core::lease::LeaseInfo;
    pub use crate::core::workspace::WorkspaceInfo;
    pub use crate::core::writer::WriterStats;
    pub use crate::work::control::PausedInfo;
    pub use crate::work::evaluate::firing_id;
    pub use crate::work::follow::{FollowerInfo, same_event};
    pub use crate::work::inspect::{
        BlockedLane, DeadLetterFilter, DeadLetterPage, EventPage, RunDetail, RunFilter,
        RunFilterSpec, RunPage, RunsFeed,
    };
    pub use crate::work::operate::{Bulk, Matches, RuleInfo};
    pub use crate::work::prune::Pruned;
    pub use crate::work::queue::run::{RunInfo, RunKind};
    pub use crate::work::schedule::ScheduleInfo;
    pub use crate::work::stats::Stats;
}

/// The engine's limits and tuning constants: how long names and texts may
/// be, how large a page or a bulk change, how often a follower saves, and
/// the schema version this library writes.
pub mod limits {
    pub use crate::base::event::RESERVED_TYPES;
    pub use crate::base::limits::{
        MAX_ERROR_BYTES, MAX_ID_BYTES, MAX_NAME_BYTES, MAX_SUBJECT_BYTES,
    };
    pub use crate::core::changelog::{ENVELOPE_ALLOWANCE_BYTES, MAX_JSON_DEPTH};
    pub use crate::core::cursor::STUCK_AFTER_FAILURES;
    pub use crate::core::lease::DEFAULT_LEASE_TTL;
    pub use crate::store::sqlite::schema::SCHEMA_VERSION;
    pub use crate::work::follow::{PUBLISH_BATCH, SKIP_SAVE_EVERY};
    pub use crate::work::inspect::{MAX_PAGE, SCAN_WINDOW};
    pub use crate::work::operate::MAX_BULK;
}

/// The PostgreSQL client the engine's `Tx<'_, Postgres>` runs the
/// application's SQL with (feature `postgres`): its `Row` and `types`.
#[cfg(feature = "postgres")]
pub use postgres;
/// The rusqlite this crate is built with, for the application's own SQL inside
/// a [`Tx`] (`tx.conn()` is a [`rusqlite::Connection`]).
pub use rusqlite;
