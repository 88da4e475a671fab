//! The backends the engine tests run on: a test written once, generic over
//! [`TestBackend`], is run by [`on_backends!`](crate::on_backends)
//! on an SQLite temp file and — with the feature `postgres` — on a fresh
//! schema of the PostgreSQL server `REFLEXR_PG_URL` names (`bash .ci/run`
//! starts one with `tests/pg/cluster.sh`). A test that needs a child
//! process starts it with [`child`] and writes the child's side once too
//! ([`children_on_backends!`](crate::children_on_backends)).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reflexr::{
    Backend, Clock, Engine, Job, ManualClock, Reaction, Retention, Sqlite, SystemClock, Tx,
};

use reflexr::inspect::Pruned;

use super::{Scene, Watched, spawn_child};

/// What an engine of a test is opened with besides its database: the
/// test's clock, a holder id, and the settings a test may change. The busy
/// timeout is 20 s everywhere, short enough that a bug shows as an error
/// rather than a long hang.
#[derive(Clone)]
pub struct Opts {
    pub clock: SharedClock,
    pub holder: String,
    pub heartbeat: Option<Duration>,
    pub lease_ttl: Option<Duration>,
    pub executors: Option<usize>,
    pub claim_batch: Option<usize>,
    pub evaluate_batch: Option<usize>,
    pub max_payload_bytes: Option<usize>,
    pub max_chain_depth: Option<u32>,
    /// Upcasters: (a type's base name, the version each reads, what it
    /// does), registered in order.
    pub upcasters: Vec<(String, u32, Upcast)>,
    pub mergers: Vec<(String, Merge)>,
}

/// An upcaster of a test's.
pub type Upcast = Arc<dyn Fn(serde_json::Value) -> serde_json::Value + Send + Sync>;

/// A debounced action's merge of a test's.
pub type Merge =
    Arc<dyn Fn(serde_json::Value, serde_json::Value) -> serde_json::Value + Send + Sync>;

/// Any clock, shared: a test's [`ManualClock`] or the system's.
#[derive(Clone)]
pub struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_ms(&self) -> i64 {
        self.0.now_ms()
    }
}

impl Opts {
    pub fn new<C: Clock + Clone>(clock: &C, holder: &str) -> Opts {
        Opts {
            clock: SharedClock(Arc::new(clock.clone())),
            holder: holder.to_string(),
            heartbeat: None,
            lease_ttl: None,
            executors: None,
            claim_batch: None,
            evaluate_batch: None,
            max_payload_bytes: None,
            max_chain_depth: None,
            upcasters: Vec::new(),
            mergers: Vec::new(),
        }
    }

    /// Registers an upcaster of version `from` of `base`
    /// (`Builder::upcast`).
    pub fn upcast(
        mut self,
        base: &str,
        from: u32,
        f: impl Fn(serde_json::Value) -> serde_json::Value + Send + Sync + 'static,
    ) -> Opts {
        self.upcasters.push((base.to_string(), from, Arc::new(f)));
        self
    }

    /// Registers how debounced runs of `action` merge inputs
    /// (`Builder::merge_debounced`).
    pub fn merge(
        mut self,
        action: &str,
        f: impl Fn(serde_json::Value, serde_json::Value) -> serde_json::Value + Send + Sync + 'static,
    ) -> Opts {
        self.mergers.push((action.to_string(), Arc::new(f)));
        self
    }

    /// A heartbeat of its own: a test that must be woken by a notification,
    /// not by polling, sets it to an hour.
    pub fn heartbeat(mut self, t: Duration) -> Opts {
        self.heartbeat = Some(t);
        self
    }

    /// On the system clock: for a process that must see time pass by
    /// itself (leases that lapse while it runs).
    pub fn system(holder: &str) -> Opts {
        Opts::new(&SystemClock, holder)
    }

    pub fn lease_ttl(mut self, t: Duration) -> Opts {
        self.lease_ttl = Some(t);
        self
    }

    pub fn executors(mut self, n: usize) -> Opts {
        self.executors = Some(n);
        self
    }

    pub fn claim_batch(mut self, n: usize) -> Opts {
        self.claim_batch = Some(n);
        self
    }

    pub fn evaluate_batch(mut self, n: usize) -> Opts {
        self.evaluate_batch = Some(n);
        self
    }

    pub fn limits(mut self, max_payload_bytes: usize, max_chain_depth: u32) -> Opts {
        self.max_payload_bytes = Some(max_payload_bytes);
        self.max_chain_depth = Some(max_chain_depth);
        self
    }
}

/// Sets each of [`Opts`] a test gave on a builder; both builders have the
/// same setters.
macro_rules! apply_opts {
    ($builder:expr, $opts:expr) => {{
        let o: &Opts = $opts;
        let mut b = $builder
            .clock(o.clock.clone())
            .holder_id(o.holder.clone())
            .busy_timeout(Duration::from_secs(20));
        if let Some(t) = o.heartbeat {
            b = b.heartbeat(t);
        }
        if let Some(t) = o.lease_ttl {
            b = b.lease_ttl(t);
        }
        if let Some(n) = o.executors {
            b = b.executors(n);
        }
        if let Some(n) = o.claim_batch {
            b = b.claim_batch(n);
        }
        if let Some(n) = o.evaluate_batch {
            b = b.evaluate_batch(n);
        }
        if let Some(n) = o.max_payload_bytes {
            b = b.max_payload_bytes(n);
        }
        if let Some(n) = o.max_chain_depth {
            b = b.max_chain_depth(n);
        }
        for (base, from, f) in &o.upcasters {
            let f = Arc::clone(f);
            b = b.upcast(base, *from, move |v| f(v));
        }
        for (action, f) in &o.mergers {
            let f = Arc::clone(f);
            b = b.merge_debounced(action, move |old, new| f(old, new));
        }
        b
    }};
}

/// What a test needs of a backend besides the engine's API: where a
/// database lives, and the application's own SQL in its dialect.
pub trait TestBackend: Backend + Sized {
    /// The backend's name, as the tests `on_backends!` makes call it.
    const NAME: &'static str;
    /// A database of the test's own, removed when dropped.
    type Place;
    fn place() -> Self::Place;
    /// How another process finds the place: a file's path, a connection
    /// string.
    fn locator(place: &Self::Place) -> String;
    /// An engine on the database `locator` names, opened with `opts`.
    fn open_at(locator: &str, opts: &Opts) -> Engine<Self>;
    /// `value` (an environment variable for a child) with the connections
    /// it opens marked `tag`, when it is a locator of this backend's that
    /// names a server; as it is otherwise.
    fn tagged(value: &str, _tag: &str) -> String {
        value.to_string()
    }
    /// Waits until no connection marked `tag` is left on the server (a
    /// file's connections end with their process).
    fn await_gone(_tag: &str) {}
    /// An engine on the place, with `clock` and `holder` as its holder id.
    fn open(place: &Self::Place, clock: &ManualClock, holder: &str) -> Engine<Self> {
        Self::open_opts(place, &Opts::new(clock, holder))
    }
    /// An engine on the place, opened with `opts`.
    fn open_opts(place: &Self::Place, opts: &Opts) -> Engine<Self> {
        Self::open_at(&Self::locator(place), opts)
    }
    /// [`TestBackend::open`] with a heartbeat of its own.
    fn open_with(
        place: &Self::Place,
        clock: &ManualClock,
        holder: &str,
        heartbeat: Option<Duration>,
    ) -> Engine<Self> {
        let mut opts = Opts::new(clock, holder);
        opts.heartbeat = heartbeat;
        Self::open_opts(place, &opts)
    }
    /// [`TestBackend::open`] with these limits.
    fn open_limited(
        place: &Self::Place,
        clock: &ManualClock,
        max_payload_bytes: usize,
        max_chain_depth: u32,
    ) -> Engine<Self> {
        Self::open_opts(
            place,
            &Opts::new(clock, "test").limits(max_payload_bytes, max_chain_depth),
        )
    }
    /// Creates the application's table `things (id text primary key)`.
    fn create_things(engine: &Engine<Self>);
    /// Inserts a row into `things`, in the engine's transaction.
    fn insert_thing(tx: &mut Tx<'_, Self>, id: &str) -> reflexr::Result<()>;
    /// The ids in `things`, in order.
    fn things(engine: &Engine<Self>) -> Vec<String>;
    /// Runs `sql`, a statement of the application's, in the transaction.
    fn run_sql(tx: &mut Tx<'_, Self>, sql: &str) -> reflexr::Result<()>;
    /// Runs `sql`, a statement of the application's, in a write of its own.
    fn sql(engine: &Engine<Self>, sql: &str) {
        engine
            .write(|tx| Self::run_sql(tx, sql))
            .expect("the application's SQL");
    }
    /// The single integer a query returns (`SELECT count(*) ...`).
    fn count(engine: &Engine<Self>, sql: &str) -> i64;
    /// The first column of a query's rows, as text.
    fn strings(engine: &Engine<Self>, sql: &str) -> Vec<String>;
    /// A trigger `name` that makes `BEFORE {event} ON {table}` (e.g.
    /// `UPDATE OF position ON reflexr_cursors`) fail with `message` for the
    /// rows `when` selects (`NEW.kind = 'rule'`): how a test makes the
    /// database refuse what the engine writes.
    fn refuse(engine: &Engine<Self>, name: &str, event: &str, when: &str, message: &str);
    /// Drops the trigger `name` of [`TestBackend::refuse`] on `table`.
    fn allow(engine: &Engine<Self>, name: &str, table: &str);
    /// `Engine::prune` of the backend.
    fn prune(engine: &Engine<Self>, retention: &Retention) -> reflexr::Result<Pruned>;
    /// A reaction for the backend (`Reaction::new`, made PostgreSQL's).
    fn reaction(name: &str, workspace: &str) -> Reaction<Self>;
    /// A job for the backend, before its handler.
    fn job(job: Job) -> Job<Self>;
}

/// Starts the child side of `entry` (written with `children_on_backends!`)
/// for the backend `B`, on the place; the child opens it with
/// [`parent_engine`]. `vars` go into its environment besides.
///
/// Once it has exited ([`Watched::kill`], [`Watched::finish`]), its
/// sessions on a server have ended too: a killed client's session may
/// still finish the `COMMIT` it had received, and the test's next reads
/// must not see that land between two of them.
pub fn child<B: TestBackend>(place: &B::Place, entry: &str, vars: &[(&str, String)]) -> Watched {
    static CHILDREN: AtomicUsize = AtomicUsize::new(0);
    let tag = format!(
        "reflexr_child_{}_{}",
        std::process::id(),
        CHILDREN.fetch_add(1, Ordering::Relaxed)
    );
    let mut all = vec![("REFLEXR_DB", B::tagged(&B::locator(place), &tag))];
    all.extend(vars.iter().map(|(k, v)| (*k, B::tagged(v, &tag))));
    Watched::new(spawn_child(&format!("{entry}::{}", B::NAME), &all))
        .on_gone(move || B::await_gone(&tag))
}

/// Inside a child started by [`child`]: an engine on the parent's place.
pub fn parent_engine<B: TestBackend>(opts: &Opts) -> Engine<B> {
    let locator = std::env::var("REFLEXR_DB").expect("REFLEXR_DB, set by common::backend::child");
    B::open_at(&locator, opts)
}

impl TestBackend for Sqlite {
    const NAME: &'static str = "sqlite";
    /// SQLite's place is a [`Scene`]: the temp directory and its
    /// `test.db` that the SQLite-only tests (a file's own faults, opening
    /// files, the power cuts, the surfaces) use too.
    type Place = Scene;

    fn place() -> Scene {
        Scene::new()
    }

    fn locator(place: &Scene) -> String {
        place.path.to_string_lossy().into_owned()
    }

    fn open_at(locator: &str, opts: &Opts) -> Engine {
        apply_opts!(Engine::builder(locator), opts)
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

    fn count(engine: &Engine, sql: &str) -> i64 {
        engine
            .with_reader(|c| Ok(c.query_row(sql, [], |r| r.get(0))?))
            .expect("count")
    }

    fn strings(engine: &Engine, sql: &str) -> Vec<String> {
        engine
            .with_reader(|c| {
                let mut stmt = c.prepare(sql)?;
                let rows = stmt
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()?;
                Ok(rows)
            })
            .expect("strings")
    }

    fn refuse(engine: &Engine, name: &str, event: &str, when: &str, message: &str) {
        Self::sql(
            engine,
            &format!(
                "CREATE TRIGGER {name} BEFORE {event} WHEN {when} \
                 BEGIN SELECT RAISE(ABORT, '{message}'); END;"
            ),
        );
    }

    fn allow(engine: &Engine, name: &str, _table: &str) {
        Self::sql(engine, &format!("DROP TRIGGER {name}"));
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

// Used by the tests that run on PostgreSQL alone (tests/it/pg/).
#[cfg(feature = "postgres")]
#[allow(unused_imports)]
pub use pg::{PgSchema, PgServer};

#[cfg(feature = "postgres")]
mod pg {
    use std::path::{Path, PathBuf};
    use std::process::Command;

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
        url: String,
    }

    impl Default for PgSchema {
        fn default() -> PgSchema {
            PgSchema::new()
        }
    }

    impl PgSchema {
        /// A schema on the test server (`REFLEXR_PG_URL`).
        pub fn new() -> PgSchema {
            PgSchema::on(&url())
        }

        /// A schema on the server at `url` (a [`PgServer`] of the test's own).
        pub fn on(url: &str) -> PgSchema {
            let name = format!("t_{}", uuid::Uuid::now_v7().simple());
            let mut admin = Client::connect(url, NoTls).expect("the test server answers");
            admin
                .batch_execute(&format!("CREATE SCHEMA {name}"))
                .expect("a schema of its own");
            PgSchema {
                name,
                url: url.to_string(),
            }
        }

        /// The connection string for this schema.
        pub fn config(&self) -> String {
            format!("{} options='-c search_path={}'", self.url, self.name)
        }
    }

    impl Drop for PgSchema {
        fn drop(&mut self) {
            if let Ok(mut admin) = Client::connect(&self.url, NoTls) {
                let _ = admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name));
            }
        }
    }

    /// A PostgreSQL server of one test's own, started by
    /// `tests/pg/cluster.sh` in a temporary directory and stopped when
    /// dropped: for a test that restarts its server, which would cut every
    /// other test's connections on the shared one.
    pub struct PgServer {
        dir: tempfile::TempDir,
        /// Its connection string (`host=… port=… user=… dbname=…`).
        pub url: String,
    }

    impl PgServer {
        pub fn start() -> PgServer {
            let dir = tempfile::Builder::new()
                .prefix("reflexr-pg-")
                .tempdir()
                .expect("a directory for the server");
            let out = Command::new("bash")
                .arg(cluster_script())
                .arg("start")
                .arg(dir.path())
                .output()
                .expect("run tests/pg/cluster.sh");
            assert!(
                out.status.success(),
                "the server started: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let url = text
                .lines()
                .find_map(|l| l.strip_prefix("export REFLEXR_PG_URL='"))
                .and_then(|l| l.strip_suffix('\''))
                .expect("cluster.sh prints the server's URL")
                .to_string();
            PgServer { dir, url }
        }

        /// Restarts the server fast: every connection is cut, as a crash or
        /// a failover would.
        pub fn restart(&self) {
            let status = Command::new("bash")
                .arg(cluster_script())
                .arg("restart")
                .arg(self.dir.path())
                .status()
                .expect("run tests/pg/cluster.sh");
            assert!(status.success(), "the server restarted");
        }
    }

    impl Drop for PgServer {
        fn drop(&mut self) {
            let _ = Command::new("bash")
                .arg(cluster_script())
                .arg("stop")
                .arg(self.dir.path())
                .status();
        }
    }

    /// `tests/pg/cluster.sh` of the workspace this crate is in.
    fn cluster_script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/pg/cluster.sh")
    }

    impl TestBackend for Postgres {
        const NAME: &'static str = "postgres";
        type Place = PgSchema;

        fn place() -> PgSchema {
            PgSchema::new()
        }

        fn locator(place: &PgSchema) -> String {
            place.config()
        }

        fn tagged(value: &str, tag: &str) -> String {
            if value.starts_with(&url()) {
                format!("{value} application_name={tag}")
            } else {
                value.to_string()
            }
        }

        fn await_gone(tag: &str) {
            let mut admin = Client::connect(&url(), NoTls).expect("the test server answers");
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                let left: i64 = admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                        &[&tag],
                    )
                    .expect("the server's sessions")
                    .get(0);
                if left == 0 {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{left} sessions of the child {tag} outlived it by two minutes"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }

        fn open_at(locator: &str, opts: &Opts) -> Engine<Postgres> {
            apply_opts!(Engine::builder_postgres(locator).pool_size(8), opts)
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

        fn count(engine: &Engine<Postgres>, sql: &str) -> i64 {
            engine
                .with_reader(|tx| Ok(tx.query(sql, &[])?[0].get(0)))
                .expect("count")
        }

        fn strings(engine: &Engine<Postgres>, sql: &str) -> Vec<String> {
            engine
                .with_reader(|tx| Ok(tx.query(sql, &[])?.iter().map(|r| r.get(0)).collect()))
                .expect("strings")
        }

        fn refuse(engine: &Engine<Postgres>, name: &str, event: &str, when: &str, message: &str) {
            Self::sql(
                engine,
                &format!(
                    "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN RAISE EXCEPTION '{message}'; END $$"
                ),
            );
            Self::sql(
                engine,
                &format!(
                    "CREATE TRIGGER {name} BEFORE {event} FOR EACH ROW WHEN ({when}) \
                     EXECUTE FUNCTION {name}()"
                ),
            );
        }

        fn allow(engine: &Engine<Postgres>, name: &str, table: &str) {
            Self::sql(engine, &format!("DROP TRIGGER {name} ON {table}"));
            Self::sql(engine, &format!("DROP FUNCTION {name}()"));
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
