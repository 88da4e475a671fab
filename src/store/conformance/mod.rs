//! The conformance suite: the contract every backend signs. Each test is
//! written once, against the table groups of the seam (`crate::store`), and
//! names the invariant it checks; [`on_every_backend`] runs it on an SQLite
//! temp file in every `cargo test`, and — with the feature `postgres` — on
//! a fresh schema of the PostgreSQL server that `REFLEXR_PG_URL` names
//! (`bash .ci/run` starts one; see `tests/pg/cluster.sh`). One file per
//! table group. The concurrency tests are PostgreSQL's own: on SQLite one
//! writer makes them hold by construction. A new backend adds its variant
//! to [`Db`] and passes every test here.

mod counters;
mod cursors;
mod events;
mod leases;
mod rules;
pub(crate) mod runs;
#[cfg(feature = "postgres")]
mod schema;
mod workspaces;

#[cfg(feature = "postgres")]
use std::collections::BTreeSet;
#[cfg(feature = "postgres")]
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[cfg(feature = "postgres")]
pub(super) use postgres::{Client, NoTls};

use crate::base::durability::Synchronous;
use crate::base::error::{Error, Result};
use crate::base::event::{NewEvent, Query};
use crate::base::retry::RetryPolicy;
use crate::core::changelog::{self, Origin};
use crate::core::cursor::{self, ConsumerKind};
use crate::core::lease;
use crate::core::settings::Limits;
use crate::core::workspace;
#[cfg(feature = "postgres")]
use crate::store::postgres::{self as pg, PgConn};
use crate::store::runs::{Inserted, NewRun, Requeued, Uniq};
use crate::store::{Control, Counters, Cursors, Events, Lanes, Leases, Rules, Runs, Workspaces};

/// Every table group the tests use.
trait Core: Events + Workspaces + Cursors + Leases + Runs + Lanes + Rules + Counters + Control {}
impl<T: Events + Workspaces + Cursors + Leases + Runs + Lanes + Rules + Counters + Control + ?Sized>
    Core for T
{
}

#[cfg(feature = "postgres")]
fn pg_url() -> String {
    std::env::var("REFLEXR_PG_URL").expect(
        "REFLEXR_PG_URL names the PostgreSQL server these tests use \
         (`eval \"$(bash tests/pg/cluster.sh start /tmp/reflexr-pg)\"` starts one)",
    )
}

/// A fresh, empty schema of its own on the test server: tests run side by
/// side without seeing each other's rows. Dropped with the database.
#[cfg(feature = "postgres")]
pub(crate) struct PgSchema {
    name: String,
}

#[cfg(feature = "postgres")]
impl PgSchema {
    pub(crate) fn new() -> PgSchema {
        let name = format!("t_{}", uuid::Uuid::now_v7().simple());
        let mut admin = Client::connect(&pg_url(), NoTls).expect("the test server answers");
        admin
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .expect("a schema of its own");
        PgSchema { name }
    }

    pub(crate) fn url(&self) -> String {
        format!("{} options='-c search_path={}'", pg_url(), self.name)
    }

    /// A client whose tables live in this schema, with reflexr's applied.
    pub(crate) fn client(&self) -> Client {
        let mut client = Client::connect(&self.url(), NoTls).expect("the test server answers");
        pg::schema::apply(&mut client, &self.name).expect("the schema applies");
        client
    }

    /// A pool of `n` connections on this schema, with reflexr's applied.
    pub(crate) fn pool(&self, n: u32) -> pg::Pool {
        drop(self.client());
        let config: postgres::Config = self.url().parse().unwrap();
        r2d2::Pool::builder()
            .max_size(n)
            .build(pg::Manager::new(config))
            .expect("a pool")
    }

    /// A transaction on a new connection of this schema.
    fn begin(&self) -> PgConn {
        PgConn::begin_as(self.pool(1).get().unwrap(), false).unwrap()
    }
}

#[cfg(feature = "postgres")]
impl Drop for PgSchema {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&pg_url(), NoTls) {
            let _ = admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name));
        }
    }
}

enum Db {
    // The directory and the schema live as long as the connection.
    Sqlite(rusqlite::Connection, #[allow(dead_code)] tempfile::TempDir),
    #[cfg(feature = "postgres")]
    Pg(pg::Pool, #[allow(dead_code)] Arc<PgSchema>),
}

impl Db {
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::sqlite::schema::open_writer(
            &dir.path().join("core.db"),
            None,
            true,
            Synchronous::Full,
            false,
            Duration::from_secs(5),
        )
        .unwrap();
        Db::Sqlite(conn, dir)
    }

    #[cfg(feature = "postgres")]
    fn pg() -> Db {
        let schema = Arc::new(PgSchema::new());
        Db::Pg(schema.pool(1), schema)
    }

    fn name(&self) -> &'static str {
        match self {
            Db::Sqlite(..) => "sqlite",
            #[cfg(feature = "postgres")]
            Db::Pg(..) => "postgres",
        }
    }

    /// Runs `f` in one transaction: committed when it returns Ok, rolled
    /// back when it returns an error.
    fn tx<T>(&mut self, f: impl FnOnce(&dyn Core) -> Result<T>) -> Result<T> {
        match self {
            Db::Sqlite(conn, _) => {
                conn.execute_batch("BEGIN IMMEDIATE")?;
                let out = f(&*conn);
                conn.execute_batch(if out.is_ok() { "COMMIT" } else { "ROLLBACK" })?;
                out
            }
            #[cfg(feature = "postgres")]
            Db::Pg(pool, _) => {
                let conn = PgConn::begin_as(pool.get()?, false)?;
                let out = f(&conn)?;
                conn.commit()?;
                Ok(out)
            }
        }
    }

    /// [`Db::tx`] in a transaction that takes the log's head with its
    /// `BEGIN`, as the engine's shared writes do (PostgreSQL; on SQLite the
    /// one writer holds it).
    fn tx_ordered<T>(&mut self, f: impl FnOnce(&dyn Core) -> Result<T>) -> Result<T> {
        match self {
            Db::Sqlite(..) => self.tx(f),
            #[cfg(feature = "postgres")]
            Db::Pg(pool, _) => {
                let conn = PgConn::begin_ordered(pool.get()?)?;
                let out = f(&conn)?;
                conn.commit()?;
                Ok(out)
            }
        }
    }
}

/// Runs `body` on a fresh SQLite file, then — with the feature `postgres`
/// — on a fresh PostgreSQL schema.
fn on_every_backend(body: impl Fn(&mut Db)) {
    #[allow(unused_mut)]
    let mut dbs = vec![Db::sqlite()];
    #[cfg(feature = "postgres")]
    dbs.push(Db::pg());
    for mut db in dbs {
        eprintln!("-- {}", db.name());
        body(&mut db);
    }
}

const NOW: i64 = 1_700_000_000_000;
const LIMITS: Limits = Limits {
    max_payload_bytes: 64 * 1024,
    max_chain_depth: 16,
};

fn event(event_type: &str, subject: &str) -> NewEvent {
    NewEvent::new(event_type, subject, "tester", NOW).payload_json(r#"{"n":1}"#)
}

fn append(c: &dyn Core, ws: &str, e: &NewEvent) -> Result<crate::base::event::Appended> {
    changelog::append(c, NOW, LIMITS, ws, e, Origin::App, None)
}

fn setup(db: &mut Db, ws: &str) {
    db.tx(|c| {
        workspace::create(c, NOW, ws)?;
        workspace::register_types(c, NOW, ws, &["Opened", "Closed"])
    })
    .unwrap();
}

fn query(ws: &str, after: i64) -> Query {
    Query::new(ws).after(after).limit(1000)
}
