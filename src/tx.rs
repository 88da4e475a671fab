//! The caller's side of a write: [`Tx`].

use rusqlite::{Connection, Params};

use crate::cursor::{self, ConsumerKind};
use crate::engine::Shared;
use crate::error::Result;
use crate::event::{Appended, NewEvent};
use crate::lease::{self, Lease};
use crate::log::{self, Origin};

/// A write in progress, handed to the closure of [`crate::Engine::write`].
///
/// Everything done through it — the application's own SQL through
/// [`Tx::conn`] or [`Tx::execute`], appends, cursor saves, fencing checks —
/// commits together or not at all (DESIGN.md, invariant 2). If the closure
/// returns an error or panics, all of its work is rolled back; other callers'
/// work that shares the transaction is not affected.
///
/// The transaction belongs to the engine: do not run `COMMIT`, `ROLLBACK` or
/// `BEGIN` through [`Tx::conn`]. Savepoints of your own are fine.
pub struct Tx<'a> {
    conn: &'a Connection,
    shared: &'a Shared,
    appended: bool,
}

impl<'a> Tx<'a> {
    pub(crate) fn new(conn: &'a Connection, shared: &'a Shared) -> Tx<'a> {
        Tx {
            conn,
            shared,
            appended: false,
        }
    }

    pub(crate) fn appended(&self) -> bool {
        self.appended
    }

    pub(crate) fn shared(&self) -> &'a Shared {
        self.shared
    }

    /// Records that the engine appended through this transaction, so the
    /// commit nudges waiters.
    pub(crate) fn mark_appended(&mut self) {
        self.appended = true;
    }

    /// Runs `f` in a savepoint of its own inside this transaction: if `f`
    /// fails, only its writes are rolled back. For the engine's batches that
    /// commit several independent units together.
    pub(crate) fn nested<T>(&mut self, f: impl FnOnce(&mut Tx<'a>) -> Result<T>) -> Result<T> {
        self.conn
            .prepare_cached("SAVEPOINT reflexr_nested")?
            .execute([])?;
        let result = f(self);
        if result.is_err() {
            self.conn
                .prepare_cached("ROLLBACK TO reflexr_nested")?
                .execute([])?;
        }
        self.conn
            .prepare_cached("RELEASE reflexr_nested")?
            .execute([])?;
        result
    }

    /// The connection, inside the transaction, for the application's own SQL.
    pub fn conn(&self) -> &'a Connection {
        self.conn
    }

    /// Runs one statement of the application's own (shorthand for
    /// `tx.conn().execute(..)`) and returns the number of rows changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        Ok(self.conn.execute(sql, params)?)
    }

    /// The engine clock's current time, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.shared.clock.now_ms()
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
        let appended = log::append(self.conn, self.shared, workspace, event, Origin::App)?;
        self.appended |= !appended.existing;
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
        cursor::save(
            self.conn,
            self.shared,
            workspace,
            ConsumerKind::App,
            consumer,
            seq,
        )
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
        lease::fence(self.conn, self.shared.clock.now_ms(), lease)
    }
}
