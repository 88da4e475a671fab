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

// Base: values and words, no I/O.
mod audit;
mod clock;
mod counter;
mod dead_letter;
mod error;
mod event;
mod names;
mod retry;
mod words;
// Store: every SQL statement, next to the table it touches.
mod store;
// Core: one open file, its writer and the operations every consumer uses.
mod changelog;
mod combiner;
mod cursor;
mod db;
mod lease;
#[cfg(all(test, feature = "postgres"))]
mod matrix;
mod notify;
#[cfg(feature = "postgres")]
mod pgdb;
mod settings;
mod tx;
mod workspace;
mod writer;
// Consumers and work.
mod claims;
mod consumer;
mod control;
mod delivery;
mod evaluate;
mod execute;
mod follow;
mod inspect;
mod operate;
mod prune;
mod reaction;
mod rule;
mod run;
mod schedule;
mod stats;
// Runtime: threads, the drain, lease keeping.
mod registry;
mod runtime;
// Facade: what an application calls.
mod builder;
mod engine;
mod operator;
pub use audit::{AuditAction, AuditEntry};
pub use builder::EngineBuilder;
#[cfg(feature = "postgres")]
pub use builder::PostgresBuilder;
pub use changelog::{ENVELOPE_ALLOWANCE_BYTES, MAX_JSON_DEPTH};
pub use clock::{Clock, ManualClock, SystemClock};
pub use control::{ActionConfig, Enqueue, Enqueued, Pausable, PausedInfo, Unique};
pub use counter::Counter;
pub use cursor::{ConsumerKind, CursorInfo, Reset, STUCK_AFTER_FAILURES};
pub use dead_letter::{DeadLetter, DeadLetterKind, Reason, Resolution};
pub use delivery::{ChannelPolicy, Delivery, Message, SenderFn};
pub use engine::{Engine, Watch};
pub use error::{Error, HandlerError, Result};
pub use evaluate::firing_id;
pub use event::{Appended, Event, NewEvent, Query, RESERVED_TYPES};
pub use follow::{Follow, FollowerInfo, PUBLISH_BATCH, ProjectionFn, SKIP_SAVE_EVERY, same_event};
pub use inspect::{
    BlockedLane, DeadLetterFilter, DeadLetterPage, EventPage, MAX_PAGE, RunDetail, RunFilter,
    RunFilterSpec, RunPage, RunsFeed, SCAN_WINDOW,
};
pub use lease::{DEFAULT_LEASE_TTL, Lease, LeaseInfo};
pub use names::{MAX_ERROR_BYTES, MAX_ID_BYTES, MAX_NAME_BYTES, MAX_SUBJECT_BYTES};
pub use operate::{Bulk, MAX_BULK, Matches, RuleInfo, RuleReset};
pub use operator::Operator;
pub use prune::{Pruned, Retention};
pub use reaction::{Reaction, ReactionFn};
pub use retry::RetryPolicy;
pub use rule::{Decision, OnDeadLetter, OnNewVersion, Ordering, Rule, Scope, ScopeFn, Start};
pub use run::{ActionFn, Run, RunContext, RunInfo, RunKind, RunState};
pub use runtime::Backend;
pub use runtime::{Idle, Service};
pub use schedule::{Guarantee, Job, JobFn, Missed, Occurrence, ScheduleInfo};
pub use stats::Stats;
#[cfg(feature = "postgres")]
pub use store::backend::Postgres;
pub use store::backend::Sqlite;
pub use store::conn::Synchronous;
pub use store::schema::SCHEMA_VERSION;
pub use tx::Tx;
pub use workspace::WorkspaceInfo;
pub use writer::WriterStats;

/// The PostgreSQL client the engine's `Tx<'_, Postgres>` runs the
/// application's SQL with (feature `postgres`): its `Row` and `types`.
#[cfg(feature = "postgres")]
pub use postgres;
/// The rusqlite this crate is built with, for the application's own SQL inside
/// a [`Tx`] (`tx.conn()` is a [`rusqlite::Connection`]).
pub use rusqlite;
