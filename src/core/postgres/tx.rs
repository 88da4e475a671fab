//! What a [`Tx`] on PostgreSQL has besides every backend's: the
//! application's own SQL, run on PostgreSQL.

use crate::base::error::Result;
use crate::core::db::Tx;

/// PostgreSQL's side (feature `postgres`): the application's own SQL, in
/// the engine's transaction.
///
/// One statement per call (PostgreSQL's extended protocol), with `$1`, `$2`,
/// … parameters. Statements that would end or replace the engine's
/// transaction — `BEGIN`, `START TRANSACTION`, `COMMIT`, `END`,
/// `ROLLBACK` (but `ROLLBACK TO SAVEPOINT`), `ABORT`, `PREPARE TRANSACTION`,
/// `SET TRANSACTION`, the engine's `reflexr_*` savepoints — and `SET`
/// without `LOCAL` (a session setting would outlive the write on a pooled
/// connection), `DEALLOCATE` and `DISCARD` (the connection keeps the
/// engine's prepared statements) are refused with [`crate::Error::StatementRefused`]
/// before they are sent. Savepoints of your own and `SET LOCAL` are fine.
/// A statement that fails aborts the whole transaction on PostgreSQL
/// (unlike SQLite): return the error, and the write is rolled back; a
/// closure that catches the error and returns Ok anyway is told
/// [`crate::Error::TransactionAborted`], and nothing of it commits.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Tx<'_, crate::store::Postgres> {
    /// Runs one statement and returns the number of rows it changed.
    pub fn execute(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64> {
        self.core().execute_untyped(sql, params)
    }

    /// Runs one statement and returns its rows.
    pub fn query(
        &self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>> {
        self.core().query_untyped(sql, params)
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
