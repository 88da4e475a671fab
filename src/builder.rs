//! [`Builder`]: how an [`Engine`] is opened, on any backend, and its
//! settings' defaults.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::base::clock::{Clock, SystemClock};
use crate::base::durability::Synchronous;
use crate::base::error::{Error, Result};
use crate::base::event::Query;
use crate::base::limits;
use crate::core::db::Backend;
use crate::core::lease::{self, DEFAULT_LEASE_TTL};
use crate::core::settings::{Limits, Settings};
use crate::core::sqlite::db::{Db, Open};
use crate::engine::Engine;
use crate::runtime::{self, Context};
use crate::store::Sqlite;
use crate::work::follow;
use crate::work::prune::Retention;

/// Opens an [`Engine`] with settings other than the defaults:
/// [`Engine::builder`] for a file, `Engine::builder_postgres` (feature
/// `postgres`) for a PostgreSQL database. Every backend takes the settings
/// of `impl<B> Builder<B>`; a file takes those of `impl Builder<Sqlite>`
/// besides, a PostgreSQL database those of `impl Builder<Postgres>`.
///
/// # Defaults
///
/// | setting | default |
/// | --- | --- |
/// | [`clock`](Builder::clock) | [`SystemClock`] |
/// | [`busy_timeout`](Builder::busy_timeout) | 30 s |
/// | [`heartbeat`](Builder::heartbeat) | SQLite: 50 ms, 200 ms with the WAL watch (feature `watch`); PostgreSQL: 200 ms (other processes' commits arrive by `LISTEN` first) |
/// | [`lease_ttl`](Builder::lease_ttl) | 30 s ([`DEFAULT_LEASE_TTL`]) |
/// | [`max_payload_bytes`](Builder::max_payload_bytes) | 1 MiB |
/// | [`max_chain_depth`](Builder::max_chain_depth) | 8 |
/// | [`holder_id`](Builder::holder_id) | `pid<pid>-<8 random hex digits>` |
/// | [`executors`](Builder::executors) | 2 threads |
/// | [`claim_batch`](Builder::claim_batch) | 16 runs per claim (growing to 256 while claims come back full) |
/// | [`evaluate_batch`](Builder::evaluate_batch) | 4,000 events per rule and batch |
/// | [`retention`](Builder::retention) | none: nothing is pruned automatically |
/// | `pool_size` | SQLite: 4 read connections; PostgreSQL: 8 connections (reads and writes) |
/// | SQLite's [`synchronous`](Builder::synchronous) | [`Synchronous::Full`] |
/// | SQLite's [`create_if_missing`](Builder::create_if_missing) | `true` |
/// | SQLite's [`verify_on_open`](Builder::verify_on_open) | `false` |
/// | SQLite's [`vfs`](Builder::vfs) | SQLite's default VFS |
///
/// On PostgreSQL durability is the server's (`synchronous_commit`,
/// replication), not the engine's.
#[derive(Clone)]
pub struct Builder<B: Backend = Sqlite> {
    options: B::Options,
    clock: Arc<dyn Clock>,
    settings: Settings,
    runtime: runtime::Config,
    /// Whether [`Builder::opentelemetry`] chose the providers (else the
    /// global ones, as they are at [`Builder::open`]).
    #[cfg(feature = "otel")]
    telemetry_set: bool,
}

impl Engine {
    /// Opens (creating it if missing) the reflexr file at `path` with the
    /// defaults of [`Builder`].
    pub fn open(path: impl AsRef<Path>) -> Result<Engine> {
        Engine::builder(path).open()
    }

    /// A builder for opening `path` with other settings.
    pub fn builder(path: impl AsRef<Path>) -> Builder {
        Builder::with(Open {
            path: path.as_ref().to_path_buf(),
            create: true,
            pool_size: 4,
            verify: false,
            vfs: None,
        })
    }
}

impl<B: Backend> Builder<B> {
    fn with(options: B::Options) -> Builder<B> {
        Builder {
            options,
            clock: Arc::new(SystemClock),
            settings: default_settings(),
            runtime: runtime::Config {
                executors: 2,
                claim_batch: 16,
                evaluate_batch: 4_000,
                retention: None,
                hubs: HUBS,
            },
            #[cfg(feature = "otel")]
            telemetry_set: false,
        }
    }

    /// Where time comes from. Default [`SystemClock`]; tests pass a
    /// [`crate::ManualClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How long a write waits for another process's lock (SQLite) or a
    /// pooled connection (PostgreSQL), and a read for a busy file, before
    /// failing with [`Error::Busy`]. Default 30 s.
    pub fn busy_timeout(mut self, t: Duration) -> Self {
        self.settings.busy_timeout = t;
        self
    }

    /// How often a waiting thread checks for commits made by other
    /// processes (SQLite's `PRAGMA data_version`, PostgreSQL's head seq)
    /// and for retries and schedules coming due. Commits made through this
    /// engine wake waiters at once regardless, and so do other processes'
    /// when the WAL watch runs (feature `watch`) or PostgreSQL's `LISTEN`
    /// hears them. Default: see the table above.
    pub fn heartbeat(mut self, t: Duration) -> Self {
        self.settings.heartbeat = t;
        self.settings.heartbeat_set = true;
        self
    }

    /// How long the engine's leases last unless renewed. Default 30 s, renewed
    /// every third (ADR-0015).
    pub fn lease_ttl(mut self, t: Duration) -> Self {
        self.settings.lease_ttl = t;
        self
    }

    /// The largest payload an append accepts, in bytes. Default 1 MiB; at
    /// most 256 MiB.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.settings.limits.max_payload_bytes = n;
        self
    }

    /// The name this engine holds leases under. Default `pid<pid>-<random>`,
    /// unique per open. Two engines must never share one.
    pub fn holder_id(mut self, id: impl Into<String>) -> Self {
        self.settings.holder_id = id.into();
        self
    }

    /// How many executor threads [`Engine::start`] spawns (0 to 64). Default 2.
    /// With 0 this process decides but leaves the runs to other processes.
    pub fn executors(mut self, n: usize) -> Self {
        self.runtime.executors = n;
        self
    }

    /// How many runs an executor claims in one transaction (1 to 1,000).
    /// Default 16. A claim that comes back full doubles the next one, up to
    /// 256 (or this, when larger), and one that finds less goes back to it:
    /// a backlog is worked in large batches (more runs per commit), a
    /// trickle in small ones spread across executors. Whatever this allows,
    /// a claim takes of each action no more runs than its handlers' recent
    /// pace in this process lets start within 50 ms (of an action with a
    /// concurrency limit, one more than fits in 1 ms), and what a batch did
    /// not start goes first in the next: slow handlers claim a run or two
    /// at a time (the control guide's "What a claim holds").
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.runtime.claim_batch = n;
        self
    }

    /// How many events a rule reads per batch (1 to 10,000). Default 4,000.
    ///
    /// A batch is one commit for the rules at one position: its states,
    /// firings and cursors, so a larger batch writes each scope's state and
    /// makes a durable commit less often when the rules have a backlog.
    /// Its events are held in memory while they are decided (the
    /// evaluating thread keeps their buffer for its next batch), so with
    /// large payloads a smaller batch holds less.
    pub fn evaluate_batch(mut self, n: usize) -> Self {
        self.runtime.evaluate_batch = n;
        self
    }

    /// The deepest chain of causes a run may extend: an application's event
    /// is at depth 0, an event a run emits is one deeper than the event that
    /// fired the run, and a firing whose run would emit events deeper than
    /// this is dead-lettered (reason `depth_limit`) instead of run, so rules
    /// that trigger each other cannot loop for ever. Default 8.
    pub fn max_chain_depth(mut self, n: u32) -> Self {
        self.settings.limits.max_chain_depth = i64::from(n);
        self
    }

    /// Prunes automatically: the loop (while this process holds its lease)
    /// runs [`Engine::prune`] with `retention` every ten minutes. Default:
    /// none, nothing is deleted unless [`Engine::prune`] is called.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.runtime.retention = Some(retention);
        self
    }

    /// Registers an upcaster: `f` turns the payload of version `from` of
    /// the event type `base` into version `from + 1`'s. Version 1 is the
    /// plain name (`session.changed`), version *n* ≥ 2 the name with
    /// `.v<n>` (`session.changed.v2`); register from version 1 up, one per
    /// version, and they chain.
    ///
    /// Every event the engine hands to the application — reads
    /// ([`Engine::read`], [`Engine::read_subject`], [`Engine::event`], a
    /// [`crate::Tx`]'s), rules' decisions, reactions, followers'
    /// projections, the event a workflow's wait receives, an
    /// [`crate::AppendCondition`]'s field — comes as the newest version:
    /// its type is the newest name and its payload the chain's result. A
    /// read by type names the newest version and gets the older ones too.
    /// The stored event never changes (the `sqlite3` view, the operators'
    /// pages and followers' copies of stored bytes show what was written).
    ///
    /// ```
    /// # fn main() -> reflexr::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// use reflexr::{Engine, NewEvent, Query};
    /// let engine = Engine::builder(dir.path().join("app.db"))
    ///     // v1 had "title"; v2 calls it "name".
    ///     .upcast("session.changed", 1, |mut p| {
    ///         let title = p["title"].take();
    ///         serde_json::json!({ "name": title })
    ///     })
    ///     .open()?;
    /// engine.ensure_workspace("events", &["session.changed", "session.changed.v2"])?;
    /// let old = NewEvent::new("session.changed", "session/1", "admin", 1)
    ///     .payload(&serde_json::json!({ "title": "Rust in anger" }));
    /// engine.append("events", &old)?;
    /// let read = engine.read(&Query::new("events").types(["session.changed.v2"]))?;
    /// assert_eq!(read[0].event_type, "session.changed.v2");
    /// assert_eq!(read[0].json()?["name"], "Rust in anger");
    /// # Ok(()) }
    /// ```
    ///
    /// A chain with a gap, a second upcaster for one version or a base
    /// name that carries a version makes [`Builder::open`] fail with
    /// [`Error::Invalid`] or [`Error::AlreadyExists`].
    pub fn upcast<F>(mut self, base: &str, from: u32, f: F) -> Self
    where
        F: Fn(serde_json::Value) -> serde_json::Value + Send + Sync + 'static,
    {
        self.settings
            .upcasters
            .register(base, from, std::sync::Arc::new(f));
        self
    }

    /// Registers how a debounced run of `action` merges inputs
    /// ([`crate::Debounce`]): when an enqueue with a debounce key finds the
    /// key's run still pending, the run's input becomes `f(its input, the
    /// new input)` instead of the new input (the default: the last input
    /// wins). Applied by this engine's enqueues, in their transactions.
    ///
    /// ```
    /// # use serde_json::{json, Value};
    /// # let dir = tempfile::tempdir().unwrap();
    /// // Each enqueue brings ids; the run gets all of them.
    /// let engine = reflexr::Engine::builder(dir.path().join("app.db"))
    ///     .merge_debounced("reindex", |mut old: Value, new: Value| {
    ///         if let (Some(a), Some(b)) = (old["ids"].as_array_mut(), new["ids"].as_array()) {
    ///             a.extend(b.iter().cloned());
    ///         }
    ///         old
    ///     })
    ///     .open()
    ///     .unwrap();
    /// # let _ = engine;
    /// ```
    pub fn merge_debounced<F>(mut self, action: &str, f: F) -> Self
    where
        F: Fn(serde_json::Value, serde_json::Value) -> serde_json::Value + Send + Sync + 'static,
    {
        self.settings
            .mergers
            .0
            .insert(action.to_string(), std::sync::Arc::new(f));
        self
    }

    /// The OpenTelemetry providers the engine's spans and metrics go to
    /// (feature `otel`). Default: the global ones
    /// (`opentelemetry::global::set_tracer_provider`,
    /// `set_meter_provider`), as they are when the engine opens: install
    /// them first. The spans, their names and attributes, and the metrics
    /// are in the observability guide ([`crate::guide::observability`]).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use opentelemetry::metrics::noop::NoopMeterProvider;
    /// use opentelemetry::trace::noop::NoopTracerProvider;
    /// // Any provider of the API: the SDK's, or (here) no-ops.
    /// let engine = reflexr::Engine::builder(dir.path().join("app.db"))
    ///     .opentelemetry(&NoopTracerProvider::new(), &NoopMeterProvider::new())
    ///     .open()
    ///     .unwrap();
    /// # let _ = engine;
    /// ```
    #[cfg(feature = "otel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
    pub fn opentelemetry<P, M>(mut self, traces: &P, metrics: &M) -> Self
    where
        P: opentelemetry::trace::TracerProvider,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as opentelemetry::trace::Tracer>::Span: Send + Sync + 'static,
        M: opentelemetry::metrics::MeterProvider + ?Sized,
    {
        self.settings.telemetry = crate::base::telemetry::from_providers(traces, metrics);
        self.telemetry_set = true;
        self
    }

    /// Opens the database.
    ///
    /// # Errors
    /// - [`Error::Invalid`]: a setting out of range, or (PostgreSQL) a
    ///   connection string that does not parse.
    /// - A file: [`Error::NotADatabase`], [`Error::Corrupt`],
    ///   [`Error::SchemaTooNew`], [`Error::ForeignDatabase`] (the file was
    ///   refused and left unchanged); [`Error::Missing`] (no file, and
    ///   `create_if_missing(false)`); [`Error::Pragma`] (SQLite did not
    ///   take a setting, e.g. WAL on a file system that cannot share
    ///   memory).
    /// - PostgreSQL: [`Error::Io`] / [`Error::Storage`] when the server
    ///   cannot be reached or refuses; [`Error::SchemaTooNew`] for a
    ///   database a newer reflexr wrote.
    pub fn open(self) -> Result<Engine<B>> {
        check_settings(&self.settings)?;
        if let Some(e) = self.settings.upcasters.refused() {
            return Err(e.clone());
        }
        if let Some(retention) = &self.runtime.retention {
            retention.validate()?;
        }
        check_runtime(&self.runtime)?;
        #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
        let mut settings = self.settings;
        #[cfg(feature = "otel")]
        if !self.telemetry_set {
            settings.telemetry = crate::base::telemetry::Telemetry::global();
        }
        let db = B::open_db(&self.options, settings, self.clock)?;
        Ok(Engine::from_context(Context::new(db, self.runtime)))
    }
}

impl Builder<Sqlite> {
    /// How hard a commit waits for the disk. Default [`Synchronous::Full`]: a
    /// committed event survives power loss. [`Synchronous::Normal`] is an
    /// opt-in that keeps commits safe from a process crash only.
    pub fn synchronous(mut self, s: Synchronous) -> Self {
        self.settings.synchronous = s;
        self
    }

    /// Whether a missing file is created. Default `true`. With `false`, a
    /// missing file is [`Error::Missing`] (the CLI opens this way).
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.options.create = create;
        self
    }

    /// How many read connections the pool keeps (1 to 64). Default 4.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.options.pool_size = n;
        self
    }

    /// Runs `PRAGMA quick_check` before opening, so a damaged file is refused
    /// at once rather than when the damaged part is read. It reads the whole
    /// file. Default `false`.
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.options.verify = verify;
        self
    }

    /// Opens the file through a VFS registered with SQLite under `name`
    /// (e.g. one that encrypts, or the test suite's power-cut simulator)
    /// instead of the default one; every connection of the engine uses it.
    /// Default: the default VFS.
    pub fn vfs(mut self, name: impl Into<String>) -> Self {
        self.options.vfs = Some(name.into());
        self
    }
}

/// The settings' defaults (see [`Builder`]).
fn default_settings() -> Settings {
    Settings {
        synchronous: Synchronous::Full,
        busy_timeout: Duration::from_secs(30),
        heartbeat: Duration::from_millis(50),
        heartbeat_set: false,
        lease_ttl: DEFAULT_LEASE_TTL,
        holder_id: format!("pid{}-{:08x}", std::process::id(), fastrand::u32(..)),
        limits: Limits {
            max_payload_bytes: 1 << 20,
            max_chain_depth: 8,
        },
        upcasters: Default::default(),
        mergers: Default::default(),
        telemetry: Default::default(),
    }
}

/// The checks every backend's runtime settings pass.
fn check_runtime(r: &runtime::Config) -> Result<()> {
    if r.executors > 64 {
        return Err(Error::invalid("executors", "must be 0 to 64"));
    }
    if !(1..=1_000).contains(&r.claim_batch) {
        return Err(Error::invalid("claim_batch", "must be 1 to 1000"));
    }
    if !(1..=Query::MAX_LIMIT).contains(&r.evaluate_batch) {
        return Err(Error::invalid("evaluate_batch", "must be 1 to 10000"));
    }
    Ok(())
}

/// The checks every backend's settings pass.
fn check_settings(s: &Settings) -> Result<()> {
    if s.limits.max_payload_bytes == 0 || s.limits.max_payload_bytes > 256 << 20 {
        return Err(Error::invalid(
            "max_payload_bytes",
            "must be 1 byte to 256 MiB",
        ));
    }
    if s.heartbeat.is_zero() {
        return Err(Error::invalid("heartbeat", "must be more than zero"));
    }
    lease::ttl_ms(s.lease_ttl)?;
    limits::check_text("holder_id", &s.holder_id, limits::MAX_ID_BYTES)
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Engine<crate::store::Postgres> {
    /// Opens the engine on the PostgreSQL database `config` names, with the
    /// defaults of [`Builder`]. `config` is a libpq connection string
    /// (`host=db.internal user=app dbname=app`) or a `postgresql://` URL.
    /// The engine's tables (`reflexr_*`, from `schema.pg.sql`) are created
    /// on first open, in the first schema of the connection's
    /// `search_path`.
    ///
    /// # Errors
    /// As [`Builder::open`].
    pub fn open_postgres(config: &str) -> Result<Engine<crate::store::Postgres>> {
        Engine::builder_postgres(config).open()
    }

    /// A builder for opening the PostgreSQL database `config` names with
    /// other settings.
    pub fn builder_postgres(config: impl Into<String>) -> Builder<crate::store::Postgres> {
        let mut b = Builder::with(crate::core::postgres::db::PgOpen {
            config: config.into(),
            pool_size: 8,
        });
        b.settings.heartbeat = Duration::from_millis(200);
        b
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Builder<crate::store::Postgres> {
    /// How many connections the pool keeps, for reads and writes (1 to
    /// 64). Default 8.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.options.pool_size = n;
        self
    }
}

/// How every engine opens the databases its followers publish into: the
/// facade names the backends, the runtime calls these.
const HUBS: runtime::Hubs = runtime::Hubs {
    file: open_file_hub,
    #[cfg(feature = "postgres")]
    postgres: open_postgres_hub,
};

/// Opens the file a cross-file follower publishes into (which must exist:
/// a typo must not create an empty hub). The publishes are synced before
/// the source's cursor moves past them, whatever the source's own mode:
/// under `Normal` a checkpoint of the source could make its cursor durable
/// while the target's last commits, never synced, are lost to a power cut
/// — and those events would never be relayed (tests/it/power.rs found it).
fn open_file_hub(
    like: &Settings,
    clock: &Arc<dyn Clock>,
    vfs: Option<&str>,
    path: &str,
) -> Result<Arc<follow::Publish>> {
    let open = Open {
        path: PathBuf::from(path),
        create: false,
        pool_size: 2,
        verify: false,
        vfs: vfs.map(String::from),
    };
    let mut settings = like.clone();
    settings.synchronous = Synchronous::Full;
    let db = Db::open(&open, settings, Arc::clone(clock))?;
    Ok(follow::publisher::<crate::Sqlite>(Arc::new(db)))
}

/// Connects to the PostgreSQL database a follower publishes into (its
/// schema applied).
#[cfg(feature = "postgres")]
fn open_postgres_hub(
    like: &Settings,
    clock: &Arc<dyn Clock>,
    config: &str,
) -> Result<Arc<follow::Publish>> {
    let db =
        crate::core::postgres::db::PgDb::open(config, 2, like.clone(), Arc::clone(clock), false)?;
    Ok(follow::publisher::<crate::Postgres>(Arc::new(db)))
}
