//! reflexr keeps an application's change log, the cursors of everything that
//! reacts to it, leases, a work queue and dead letters in **one SQLite file**.
//!
//! Applications append events in the same transaction as their own rows
//! ([`Engine::write`], [`Tx::append`]). [`Rule`]s decide exactly once per
//! event; their actions run at least once as [`Run`]s, under leases, with
//! retries and backoff. [`Reaction`]s, scheduled [`Job`]s and [`Delivery`]s
//! run in one loop per file; [`Follow`]ers bridge one workspace's log into
//! another with the same ids. A run can be a durable workflow: its handler's
//! steps ([`RunContext::step`], [`RunContext::step_tx`]) are recorded once,
//! and it sleeps or waits for an event of the log
//! ([`RunContext::wait_for_event`]) suspended, without a thread (see
//! [`guide::workflows`]). Synchronous and thread-based: no async runtime.
//!
//! An application row and its event in one transaction, a rule that decides
//! on it, the run it fires, and a consumer reading the log after its cursor:
//!
//! ```
//! use reflexr::{Decision, Engine, NewEvent, Query, Rule};
//! use serde_json::json;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let dir = tempfile::tempdir()?;
//!     let engine = Engine::open(dir.path().join("shop.db"))?; // WAL, synchronous=FULL
//!     engine.ensure_workspace("shop", &["order.placed"])?;
//!     engine.write(|tx| tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)", []))?;
//!
//!     // A rule decides exactly once per event; its action runs at least once.
//!     engine.register_rule(Rule::new("big-orders", "shop").on(["order.placed"]).action("alert").decide(
//!         |event| match event.json()?["total"].as_i64() {
//!             Some(total) if total >= 100 => Ok(Decision::fire(&json!({ "total": total }))),
//!             _ => Ok(Decision::Skip),
//!         },
//!     ))?;
//!     engine.register_action("alert", |run, _ctx| {
//!         println!("run {}: a big order of {}", run.id, run.input::<serde_json::Value>()?["total"]);
//!         Ok(()) // an error or a panic fails the attempt: retried with backoff
//!     })?;
//!
//!     // The application's row and its event commit together, or not at all.
//!     engine.write(|tx| {
//!         tx.execute("INSERT INTO orders (id, total) VALUES ('o-1', 250)", [])?;
//!         let placed = NewEvent::new("order.placed", "order/o-1", "web", tx.now_ms());
//!         tx.append("shop", &placed.payload(&json!({ "total": 250 })))
//!     })?;
//!     engine.run_until_idle()?; // decides and runs in this thread; engine.start() runs threads
//!
//!     // A consumer reads after its durable cursor and moves it forward.
//!     let after = engine.cursor("mailer", "shop")?;
//!     for event in engine.read(&Query::new("shop").after(after))? {
//!         println!("mailer sees #{} {} {}", event.seq, event.event_type, event.subject);
//!         engine.save_cursor("mailer", "shop", event.seq)?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! [`Engine::start`] runs the same work on the engine's own threads; tests
//! drive it in their own thread with [`Engine::run_until_idle`] and a
//! [`ManualClock`]. With the feature `postgres` the same engine opens on a
//! PostgreSQL database (`Engine::open_postgres`, an `Engine<Postgres>`), for
//! processes on several machines and as the hub an edge's followers relay
//! into.
//!
//! # Guides
//!
//! The manual, a chapter a page (each Rust block in them is a doctest):
//!
//! - [The change log and cursors](guide::log) — workspaces, events, appends
//!   with the application's rows, reads, leases, the writer, settings
//! - [Rules and runs](guide::rules) — deciding exactly once, acting at least
//!   once, retries, scopes, replays, threads and tests
//! - [The jobs loop](guide::jobs) — reactions, deliveries on channels,
//!   scheduled jobs, pruning
//! - [Control of the work](guide::control) — enqueue, pause, cancel, unique
//!   runs, priorities, limits, operators' interventions
//! - [Followers](guide::followers) — one workspace into another, of this file
//!   or another, with the same ids
//! - [Operating](guide::operating) — the `reflexr` CLI, the administration
//!   server, the web console, MCP
//! - [PostgreSQL and scaling out](guide::postgres) — the same engine on a
//!   server database; an edge relaying into a hub
//! - [The file and its schema](guide::file) — pragmas, what opening refuses,
//!   the views for `sqlite3`
//! - [Performance](guide::performance) — the bench, its ratios, what
//!   profiling changed
//! - [Guarantees and how they are tested](guide::guarantees) — the
//!   invariants, the tortures, the faults
//!
//! The schema is `schema.sql` (and `schema.pg.sql` on PostgreSQL), readable
//! with any `sqlite3` shell; `docs/ARCHITECTURE.md` in the repository draws
//! the layers the modules stand in.
//!
//! # Cargo features
//!
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]
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

pub mod guide;
#[cfg(feature = "otlp")]
#[cfg_attr(docsrs, doc(cfg(feature = "otlp")))]
pub mod otlp;

// What an application calls: the engine, its builder and its operators'
// view, the writes and what they take, the work it registers.
pub use crate::core::cursor::ConsumerKind;
pub use crate::core::db::{Backend, Tx};
pub use crate::core::lease::Lease;
pub use base::clock::{Clock, ManualClock, SystemClock};
pub use base::durability::Synchronous;
pub use base::error::{Error, HandlerError, Result};
pub use base::event::{AppendCondition, Appended, Event, Expected, NewEvent, Query};
pub use base::retry::RetryPolicy;
pub use base::step::{EventMatch, StepName};
pub use base::upcast::{type_version, versioned_type};
pub use builder::Builder;
pub use engine::{Engine, Watch};
pub use operator::Operator;
pub use runtime::{Drained, Service};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::Postgres;
pub use store::Sqlite;
pub use work::control::{ActionConfig, KeyInfo, KeyLimits, Pausable};
pub use work::delivery::{ChannelPolicy, Delivery, Message};
pub use work::follow::Follow;
pub use work::operate::RuleReset;
pub use work::prune::Retention;
pub use work::queue::enqueue::{Debounce, Enqueue, Enqueued, Unique};
pub use work::queue::run::{Run, RunContext, RunLog, RunProgress, RunState};
pub use work::queue::workflow::{RunEnd, Step};
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
    pub use crate::base::step::{StepInfo, StepKind, StepState};
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
        MAX_ERROR_BYTES, MAX_ID_BYTES, MAX_LOG_FIELDS_BYTES, MAX_LOG_LINES_PER_ATTEMPT,
        MAX_LOG_MESSAGE_BYTES, MAX_NAME_BYTES, MAX_SUBJECT_BYTES,
    };
    pub use crate::base::step::MAX_STEPS_PER_RUN;
    pub use crate::core::changelog::{ENVELOPE_ALLOWANCE_BYTES, MAX_JSON_DEPTH};
    pub use crate::core::cursor::STUCK_AFTER_FAILURES;
    pub use crate::core::lease::DEFAULT_LEASE_TTL;
    pub use crate::store::sqlite::schema::SCHEMA_VERSION;
    pub use crate::work::follow::{PUBLISH_BATCH, SKIP_SAVE_EVERY};
    pub use crate::work::inspect::{MAX_PAGE, SCAN_WINDOW};
    pub use crate::work::operate::MAX_BULK;
    pub use crate::work::queue::workflow::NEVER;
}

/// The PostgreSQL client the engine's `Tx<'_, Postgres>` runs the
/// application's SQL with (feature `postgres`): its `Row` and `types`.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres;
/// The rusqlite this crate is built with, for the application's own SQL inside
/// a [`Tx`] (`tx.conn()` is a [`rusqlite::Connection`]).
pub use rusqlite;
