//! The caller's side of a write: [`Tx`], and the environment it consults.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use rusqlite::{Connection, Params};

use crate::base::clock::Clock;
use crate::base::error::Result;
use crate::base::event::{Appended, Event, NewEvent, Query};
use crate::base::retry::RetryPolicy;
use crate::core::changelog::{self, Origin};
use crate::core::cursor::{self, ConsumerKind};
use crate::core::lease::{self, Lease};
use crate::core::settings::{Limits, Settings};
use crate::store::backend::{Sqlite, Store};

/// What a write consults besides its connection: the engine's clock and
/// settings, and the delivery channels this process registered (with the
/// retry policy each delivery is stored with).
pub struct Env {
    pub clock: Arc<dyn Clock>,
    pub settings: Settings,
    pub channels: RwLock<BTreeMap<String, RetryPolicy>>,
}

/// A write in progress, handed to the closure of [`crate::Engine::write`].
///
/// Everything done through it — the application's own SQL through
/// [`Tx::conn`] or [`Tx::execute`], appends, cursor saves, fencing checks —
/// commits together or not at all (DESIGN.md, invariant 2). If the closure
/// returns an error or panics, all of its work is rolled back; other callers'
/// work that shares the transaction is not affected.
///
/// The transaction belongs to the engine: `COMMIT`, `END`, `ROLLBACK`,
/// `BEGIN`, the engine's `reflexr_*` savepoints, `ATTACH`/`DETACH` and
/// setting the pragmas the engine relies on (`journal_mode`, `synchronous`,
/// `foreign_keys`, …) are refused before they run, with
/// [`crate::Error::StatementRefused`]. Savepoints of your own are fine.
///
/// `Tx` is [`Tx<'_, Sqlite>`](Sqlite) unless said otherwise; an engine on
/// PostgreSQL (feature `postgres`) hands out `Tx<'_, Postgres>`, whose
/// `execute` and `query` run the application's SQL on PostgreSQL. What the
/// engine does through a `Tx` — appends, cursors, fencing — is the same on
/// both.
pub struct Tx<'a, B: Store = Sqlite> {
    conn: &'a B::Conn,
    guard: &'a B::Guard,
    env: &'a Env,
    /// Set when the transaction created something to react to (events,
    /// runs): its commit wakes this process's waiting threads.
    nudge: bool,
}

impl<'a, B: Store> Tx<'a, B> {
    /// Runs `f` in a savepoint of its own inside this transaction: if `f`
    /// fails, only its writes are rolled back (and on PostgreSQL, the seqs
    /// it took are given back, so the log stays dense). For the engine's
    /// batches that commit several independent units together.
    pub(crate) fn nested<T, E: From<crate::base::error::Error>>(
        &mut self,
        f: impl FnOnce(&mut Tx<'a, B>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let (conn, guard) = (self.conn, self.guard);
        let mark = B::begin_nested(conn, guard)?;
        let result = f(self);
        if result.is_err() {
            B::rollback_nested(conn, guard, mark)?;
        }
        B::release_nested(conn, guard)?;
        result
    }

    pub(crate) fn new(conn: &'a B::Conn, guard: &'a B::Guard, env: &'a Env) -> Tx<'a, B> {
        Tx {
            conn,
            guard,
            env,
            nudge: false,
        }
    }

    /// The connection, as the core's table groups see it.
    pub(crate) fn core(&self) -> &'a B::Conn {
        self.conn
    }

    pub(crate) fn wants_nudge(&self) -> bool {
        self.nudge
    }

    pub(crate) fn env(&self) -> &'a Env {
        self.env
    }

    /// The limits on what the engine stores.
    pub(crate) fn limits(&self) -> Limits {
        self.env.settings.limits
    }

    /// Records that the engine created events or runs through this
    /// transaction, so its commit nudges the waiting threads.
    pub(crate) fn mark_nudge(&mut self) {
        self.nudge = true;
    }

    /// The engine clock's current time, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.env.clock.now_ms()
    }

    /// Appends `event` to `workspace`'s log.
    ///
    /// # Errors
    /// - [`crate::Error::NotFound`]: the workspace does not exist, or has not
    ///   registered the event's type.
    /// - [`crate::Error::ReservedType`]: the type is one only the engine appends.
    /// - [`crate::Error::Invalid`] / [`crate::Error::Encode`]: a malformed field
    ///   or payload.
    ///
    /// Appending an id the workspace already has appends nothing and reports
    /// the existing seq with `existing: true` (invariant 3).
    pub fn append(&mut self, workspace: &str, event: &NewEvent) -> Result<Appended> {
        self.append_as(workspace, event, Origin::App)
    }

    /// Appends as `origin` says (the engine's own events, a run's).
    pub(crate) fn append_as(
        &mut self,
        workspace: &str,
        event: &NewEvent,
        origin: Origin,
    ) -> Result<Appended> {
        let now = self.now_ms();
        let appended = changelog::append(self.conn, now, self.limits(), workspace, event, origin)?;
        self.nudge |= !appended.existing;
        Ok(appended)
    }

    /// Moves the application consumer `consumer`'s cursor on `workspace` to
    /// `seq`, in this transaction: the rows the consumer wrote for the events
    /// it handled commit with the cursor's advance.
    ///
    /// # Errors
    /// [`crate::Error::CursorBackwards`] when `seq` is behind the saved position
    /// (invariant 8), [`crate::Error::CursorAhead`] when it is past the last
    /// seq ever assigned.
    pub fn save_cursor(&mut self, consumer: &str, workspace: &str, seq: i64) -> Result<()> {
        let now = self.now_ms();
        cursor::save(
            self.conn,
            now,
            (workspace, ConsumerKind::App, consumer),
            seq,
        )
    }

    /// Reads events as [`crate::Engine::read`] does, inside this
    /// transaction: it sees what the transaction wrote so far (a reaction's
    /// handler, say, reading the log before it enqueues).
    pub fn read(&self, query: &Query) -> Result<Vec<Event>> {
        changelog::read(self.conn, query)
    }

    /// The application consumer's cursor as this transaction sees it.
    pub fn cursor(&self, consumer: &str, workspace: &str) -> Result<i64> {
        cursor::load(self.conn, workspace, ConsumerKind::App, consumer)
    }

    /// Checks, in this transaction, that `lease` is still held: same holder,
    /// same generation, not expired by the engine's clock. Call it first in a
    /// write made under a lease; if it fails, return the error and nothing of
    /// the write commits (invariant 7).
    ///
    /// # Errors
    /// [`crate::Error::LeaseLost`].
    pub fn fence(&mut self, lease: &Lease) -> Result<()> {
        lease::fence(self.conn, self.now_ms(), lease)
    }
}

/// SQLite's side: the connection itself, and savepoints of the engine's.
impl<'a> Tx<'a, Sqlite> {
    /// The connection, inside the transaction, for the application's own SQL.
    pub fn conn(&self) -> &'a Connection {
        self.conn
    }

    /// Runs one statement of the application's own (shorthand for
    /// `tx.conn().execute(..)`) and returns the number of rows changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        Ok(self.conn.execute(sql, params)?)
    }
}

/// PostgreSQL's side (feature `postgres`): the application's own SQL, in
/// the engine's transaction.
///
/// One statement per call (PostgreSQL's extended protocol), with `$1`, `$2`,
/// … parameters. Statements that would end or replace the engine's
/// transaction — `BEGIN`, `START TRANSACTION`, `COMMIT`, `END`,
/// `ROLLBACK` (but `ROLLBACK TO SAVEPOINT`), `ABORT`, `PREPARE TRANSACTION`,
/// `SET TRANSACTION`, the engine's `reflexr_*` savepoints — and `SET`
/// without `LOCAL` (a session setting would outlive the write on a pooled
/// connection) are refused with [`crate::Error::StatementRefused`]
/// before they are sent. Savepoints of your own and `SET LOCAL` are fine.
/// A statement that fails aborts the whole transaction on PostgreSQL
/// (unlike SQLite): return the error, and the write is rolled back; a
/// closure that catches the error and returns Ok anyway is told
/// [`crate::Error::TransactionAborted`], and nothing of it commits.
#[cfg(feature = "postgres")]
impl Tx<'_, crate::store::backend::Postgres> {
    /// Runs one statement and returns the number of rows it changed.
    pub fn execute(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64> {
        self.conn.execute_untyped(sql, params)
    }

    /// Runs one statement and returns its rows.
    pub fn query(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>> {
        self.conn.query_untyped(sql, params)
    }

    /// Runs one statement that returns at most one row.
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] when it returned more than one.
    pub fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<postgres::Row>> {
        let mut rows = self.query(sql, params)?;
        match rows.len() {
            0 => Ok(None),
            1 => Ok(rows.pop()),
            n => Err(crate::base::error::Error::invalid(
                "query",
                format!("returned {n} rows where at most one was expected"),
            )),
        }
    }
}
