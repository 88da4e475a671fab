//! SQLite at the core: its open database ([`db::Db`]), its writer
//! (`writer`: group commit on one connection), its wake-ups (`watch`), and
//! the [`Backend`] impl that ties them to `store::sqlite`.

pub(crate) mod db;
mod tx;
pub(crate) mod watch;
pub(crate) mod writer;

use std::sync::Arc;

use crate::base::clock::Clock;
use crate::base::error::{Error, Result};
use crate::core::db::{Backend, sealed::Sealed};
use crate::core::settings::Settings;
use crate::store::Sqlite;
use crate::store::sqlite::conn;

impl Sealed for Sqlite {}

impl Backend for Sqlite {
    type Conn = rusqlite::Connection;
    type Guard = conn::Guard;
    type Db = db::Db;
    const FEEDS_BY_TRANSACTION: bool = false;
    const STATEMENTS_ARE_ROUND_TRIPS: bool = false;
    type Options = db::Open;
    fn open_db(options: &db::Open, settings: Settings, clock: Arc<dyn Clock>) -> Result<db::Db> {
        db::Db::open(options, settings, clock)
    }
    /// SQLite keeps nothing beside the rows: its rollback restores all.
    type Mark = ();
    fn begin_nested(c: &rusqlite::Connection, guard: &conn::Guard) -> Result<()> {
        in_transaction(c)?;
        guard.control(c, conn::Control::Nested)
    }
    fn rollback_nested(c: &rusqlite::Connection, guard: &conn::Guard, _mark: ()) -> Result<()> {
        in_transaction(c)?;
        guard.control(c, conn::Control::RollbackNested)
    }
    fn release_nested(c: &rusqlite::Connection, guard: &conn::Guard) -> Result<()> {
        in_transaction(c)?;
        guard.control(c, conn::Control::ReleaseNested)
    }
}

/// A savepoint outside a transaction would begin a new one: if SQLite ended
/// the engine's (an I/O error, a full disk mid-statement), stop here.
fn in_transaction(c: &rusqlite::Connection) -> Result<()> {
    if c.is_autocommit() {
        return Err(Error::TransactionAborted {
            detail: "SQLite rolled the transaction back (an I/O error, or a full disk \
                     mid-statement)"
                .into(),
        });
    }
    Ok(())
}
