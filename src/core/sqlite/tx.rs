//! What a [`Tx`] on SQLite has besides every backend's: the connection
//! itself, for the application's own SQL.

use rusqlite::{Connection, Params};

use crate::base::error::Result;
use crate::core::db::Tx;
use crate::store::Sqlite;

/// SQLite's side: the connection itself, and savepoints of the engine's.
impl<'a> Tx<'a, Sqlite> {
    /// The connection, inside the transaction, for the application's own SQL.
    pub fn conn(&self) -> &'a Connection {
        self.core()
    }

    /// Runs one statement of the application's own (shorthand for
    /// `tx.conn().execute(..)`) and returns the number of rows changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        Ok(self.core().execute(sql, params)?)
    }
}
