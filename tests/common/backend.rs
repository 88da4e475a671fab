//! The backends the engine tests run on: each test of `tests/backends.rs`
//! is written once, generic over [`TestBackend`], and run on an SQLite temp
//! file and — with the feature `postgres` — on a fresh schema of the
//! PostgreSQL server `REFLEXR_PG_URL` names (`bash .ci/run` starts one with
//! `tests/pg/cluster.sh`).

use std::time::Duration;

use reflexr::{Backend, Engine, Job, ManualClock, Pruned, Reaction, Retention, Sqlite, Tx};

/// What a test needs of a backend besides the engine's API: where a
/// database lives, and the application's own SQL in its dialect.
pub trait TestBackend: Backend + Sized {
    /// A database of the test's own, removed when dropped.
    type Place;
    fn place() -> Self::Place;
    /// An engine on the place, with `clock` and `holder` as its holder id.
    fn open(place: &Self::Place, clock: &ManualClock, holder: &str) -> Engine<Self> {
        Self::open_with(place, clock, holder, None)
    }
    /// [`TestBackend::open`] with a heartbeat of its own: a test that must
    /// be woken by a notification, not by polling, sets it to an hour.
    fn open_with(
        place: &Self::Place,
        clock: &ManualClock,
        holder: &str,
        heartbeat: Option<Duration>,
    ) -> Engine<Self>;
    /// [`TestBackend::open`] with these limits.
    fn open_limited(
        place: &Self::Place,
        clock: &ManualClock,
        max_payload_bytes: usize,
        max_chain_depth: u32,
    ) -> Engine<Self>;
    /// Creates the application's table `things (id text primary key)`.
    fn create_things(engine: &Engine<Self>);
    /// Inserts a row into `things`, in the engine's transaction.
    fn insert_thing(tx: &mut Tx<'_, Self>, id: &str) -> reflexr::Result<()>;
    /// The ids in `things`, in order.
    fn things(engine: &Engine<Self>) -> Vec<String>;
    /// Runs `sql`, a statement of the application's, in the transaction.
    fn run_sql(tx: &mut Tx<'_, Self>, sql: &str) -> reflexr::Result<()>;
    /// `Engine::prune` of the backend.
    fn prune(engine: &Engine<Self>, retention: &Retention) -> reflexr::Result<Pruned>;
    /// A reaction for the backend (`Reaction::new`, made PostgreSQL's).
    fn reaction(name: &str, workspace: &str) -> Reaction<Self>;
    /// A job for the backend, before its handler.
    fn job(job: Job) -> Job<Self>;
}

impl TestBackend for Sqlite {
    type Place = tempfile::TempDir;

    fn place() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    fn open_with(
        place: &tempfile::TempDir,
        clock: &ManualClock,
        holder: &str,
        heartbeat: Option<Duration>,
    ) -> Engine {
        let mut b = Engine::builder(place.path().join("test.db"))
            .clock(clock.clone())
            .holder_id(holder)
            .busy_timeout(Duration::from_secs(20));
        if let Some(h) = heartbeat {
            b = b.heartbeat(h);
        }
        b.open().expect("open engine")
    }

    fn open_limited(
        place: &tempfile::TempDir,
        clock: &ManualClock,
        max_payload_bytes: usize,
        max_chain_depth: u32,
    ) -> Engine {
        Engine::builder(place.path().join("test.db"))
            .clock(clock.clone())
            .max_payload_bytes(max_payload_bytes)
            .max_chain_depth(max_chain_depth)
            .open()
            .expect("open engine")
    }

    fn create_things(engine: &Engine) {
        engine
            .write(|tx| {
                tx.execute(
                    "CREATE TABLE IF NOT EXISTS things (id TEXT PRIMARY KEY)",
                    [],
                )
            })
            .expect("the table");
    }

    fn insert_thing(tx: &mut Tx<'_>, id: &str) -> reflexr::Result<()> {
        tx.execute("INSERT INTO things (id) VALUES (?1)", [id])?;
        Ok(())
    }

    fn things(engine: &Engine) -> Vec<String> {
        engine
            .with_reader(|c| {
                let mut stmt = c.prepare("SELECT id FROM things ORDER BY id")?;
                let rows = stmt
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()?;
                Ok(rows)
            })
            .expect("things")
    }

    fn run_sql(tx: &mut Tx<'_>, sql: &str) -> reflexr::Result<()> {
        tx.execute(sql, [])?;
        Ok(())
    }

    fn prune(engine: &Engine, retention: &Retention) -> reflexr::Result<Pruned> {
        engine.prune(retention)
    }

    fn reaction(name: &str, workspace: &str) -> Reaction {
        Reaction::new(name, workspace)
    }

    fn job(job: Job) -> Job {
        job
    }
}

// Used by the tests that run on PostgreSQL alone (tests/pg_restart.rs).
#[cfg(feature = "postgres")]
#[allow(unused_imports)]
pub use pg::PgSchema;

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use reflexr::Postgres;
    use reflexr::postgres::{Client, NoTls};

    /// The test server: `REFLEXR_PG_URL`.
    pub fn url() -> String {
        std::env::var("REFLEXR_PG_URL").expect(
            "REFLEXR_PG_URL names the PostgreSQL server the tests use \
             (`eval \"$(bash tests/pg/cluster.sh start /tmp/reflexr-pg)\"` starts one)",
        )
    }

    /// A schema of the test's own on the test server, so tests run side by
    /// side without seeing each other's rows; dropped with everything in it.
    pub struct PgSchema {
        pub name: String,
    }

    impl PgSchema {
        pub fn new() -> PgSchema {
            let name = format!("t_{}", uuid::Uuid::now_v7().simple());
            let mut admin = Client::connect(&url(), NoTls).expect("the test server answers");
            admin
                .batch_execute(&format!("CREATE SCHEMA {name}"))
                .expect("a schema of its own");
            PgSchema { name }
        }

        /// The connection string for this schema.
        pub fn config(&self) -> String {
            format!("{} options='-c search_path={}'", url(), self.name)
        }
    }

    impl Drop for PgSchema {
        fn drop(&mut self) {
            if let Ok(mut admin) = Client::connect(&url(), NoTls) {
                let _ = admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name));
            }
        }
    }

    impl TestBackend for Postgres {
        type Place = PgSchema;

        fn place() -> PgSchema {
            PgSchema::new()
        }

        fn open_with(
            place: &PgSchema,
            clock: &ManualClock,
            holder: &str,
            heartbeat: Option<Duration>,
        ) -> Engine<Postgres> {
            let mut b = Engine::builder_postgres(place.config())
                .clock(clock.clone())
                .holder_id(holder)
                .pool_size(4)
                .busy_timeout(Duration::from_secs(20));
            if let Some(h) = heartbeat {
                b = b.heartbeat(h);
            }
            b.open().expect("open engine")
        }

        fn open_limited(
            place: &PgSchema,
            clock: &ManualClock,
            max_payload_bytes: usize,
            max_chain_depth: u32,
        ) -> Engine<Postgres> {
            Engine::builder_postgres(place.config())
                .clock(clock.clone())
                .max_payload_bytes(max_payload_bytes)
                .max_chain_depth(max_chain_depth)
                .open()
                .expect("open engine")
        }

        fn create_things(engine: &Engine<Postgres>) {
            engine
                .write(|tx| {
                    tx.execute(
                        "CREATE TABLE IF NOT EXISTS things (id text PRIMARY KEY)",
                        &[],
                    )
                })
                .expect("the table");
        }

        fn insert_thing(tx: &mut Tx<'_, Postgres>, id: &str) -> reflexr::Result<()> {
            tx.execute("INSERT INTO things (id) VALUES ($1)", &[&id])?;
            Ok(())
        }

        fn things(engine: &Engine<Postgres>) -> Vec<String> {
            engine
                .with_reader(|tx| {
                    Ok(tx
                        .query("SELECT id FROM things ORDER BY id", &[])?
                        .iter()
                        .map(|r| r.get(0))
                        .collect())
                })
                .expect("things")
        }

        fn run_sql(tx: &mut Tx<'_, Postgres>, sql: &str) -> reflexr::Result<()> {
            tx.execute(sql, &[])?;
            Ok(())
        }

        fn prune(engine: &Engine<Postgres>, retention: &Retention) -> reflexr::Result<Pruned> {
            engine.prune(retention)
        }

        fn reaction(name: &str, workspace: &str) -> Reaction<Postgres> {
            Reaction::new(name, workspace).postgres()
        }

        fn job(job: Job) -> Job<Postgres> {
            job.postgres()
        }
    }
}
