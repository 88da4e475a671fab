//! PostgreSQL at the core (feature `postgres`): its open database
//! ([`db::PgDb`]: a pool, group commit and transactions of their own), its
//! wake-ups (`listen`), and the [`Backend`] impl that ties them to
//! `store::postgres`.

pub(crate) mod db;
pub(crate) mod listen;
mod tx;

use std::sync::Arc;

use crate::base::clock::Clock;
use crate::base::error::Result;
use crate::core::db::{Backend, sealed::Sealed};
use crate::core::settings::Settings;
use crate::store::Postgres;
use crate::store::postgres::{Mark, NESTED, PgConn};

impl Sealed for Postgres {}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Backend for Postgres {
    type Conn = PgConn;
    type Guard = ();
    type Db = db::PgDb;
    const FEEDS_BY_TRANSACTION: bool = true;
    const STATEMENTS_ARE_ROUND_TRIPS: bool = true;
    type Options = db::PgOpen;
    fn open_db(
        options: &db::PgOpen,
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<db::PgDb> {
        db::PgDb::open(&options.config, options.pool_size, settings, clock, true)
    }
    type Mark = Mark;
    fn begin_nested(conn: &PgConn, _: &()) -> Result<Mark> {
        conn.control(&format!("SAVEPOINT {NESTED}"))?;
        Ok(conn.mark())
    }
    fn rollback_nested(conn: &PgConn, _: &(), mark: Mark) -> Result<()> {
        conn.rollback_to(NESTED, mark)
    }
    fn release_nested(conn: &PgConn, _: &()) -> Result<()> {
        conn.release_nested()
    }
}
