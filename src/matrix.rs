//! Tests only: the core's invariants on both backends: each test body is written once,
//! against the table groups of `store::backend`, and run on an SQLite temp
//! file and on a fresh schema of the PostgreSQL server that
//! `REFLEXR_PG_URL` names (`bash .ci/run` starts one; see
//! `tests/pg/cluster.sh`). The concurrency tests are PostgreSQL's own: on
//! SQLite one writer makes them hold by construction.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use postgres::{Client, NoTls};

use crate::base::error::{Error, Result};
use crate::base::event::{NewEvent, Query};
use crate::base::retry::RetryPolicy;
use crate::core::changelog::{self, Origin};
use crate::core::cursor::{self, ConsumerKind};
use crate::core::lease;
use crate::core::settings::Limits;
use crate::core::workspace;
use crate::store::backend::{Cursors, Events, Leases, Runs, Workspaces};
use crate::store::conn::Synchronous;
use crate::store::pg::{self, PgConn};
use crate::store::runs::{self, Inserted, NewRun, Uniq};

/// Every table group the tests use.
trait Core: Events + Workspaces + Cursors + Leases + Runs {}
impl<T: Events + Workspaces + Cursors + Leases + Runs + ?Sized> Core for T {}

fn pg_url() -> String {
    std::env::var("REFLEXR_PG_URL").expect(
        "REFLEXR_PG_URL names the PostgreSQL server these tests use \
         (`eval \"$(bash tests/pg/cluster.sh start /tmp/reflexr-pg)\"` starts one)",
    )
}

/// A fresh, empty schema of its own on the test server: tests run side by
/// side without seeing each other's rows. Dropped with the database.
struct PgSchema {
    name: String,
}

impl PgSchema {
    fn new() -> PgSchema {
        let name = format!("t_{}", uuid::Uuid::now_v7().simple());
        let mut admin = Client::connect(&pg_url(), NoTls).expect("the test server answers");
        admin
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .expect("a schema of its own");
        PgSchema { name }
    }

    fn url(&self) -> String {
        format!("{} options='-c search_path={}'", pg_url(), self.name)
    }

    /// A client whose tables live in this schema, with reflexr's applied.
    fn client(&self) -> Client {
        let mut client = Client::connect(&self.url(), NoTls).expect("the test server answers");
        pg::schema::apply(&mut client, &self.name).expect("the schema applies");
        client
    }

    /// A pool of `n` connections on this schema, with reflexr's applied.
    fn pool(&self, n: u32) -> pg::Pool {
        drop(self.client());
        let config: postgres::Config = self.url().parse().unwrap();
        r2d2::Pool::builder()
            .max_size(n)
            .build(r2d2_postgres::PostgresConnectionManager::new(config, NoTls))
            .expect("a pool")
    }

    /// A transaction on a new connection of this schema.
    fn begin(&self) -> PgConn {
        PgConn::begin_as(self.pool(1).get().unwrap(), false).unwrap()
    }
}

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
    Pg(pg::Pool, #[allow(dead_code)] Arc<PgSchema>),
}

impl Db {
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::schema::open_writer(
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

    fn pg() -> Db {
        let schema = Arc::new(PgSchema::new());
        Db::Pg(schema.pool(1), schema)
    }

    fn name(&self) -> &'static str {
        match self {
            Db::Sqlite(..) => "sqlite",
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
            Db::Pg(pool, _) => {
                let conn = PgConn::begin_as(pool.get()?, false)?;
                let out = f(&conn)?;
                conn.commit()?;
                Ok(out)
            }
        }
    }
}

/// Runs `body` on a fresh SQLite file, then on a fresh PostgreSQL schema.
fn on_both(body: impl Fn(&mut Db)) {
    for mut db in [Db::sqlite(), Db::pg()] {
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
    changelog::append(c, NOW, LIMITS, ws, e, Origin::App)
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

/// Invariants 1 and 3: seqs are dense and increasing; an id is appended once,
/// and appending it again reports the first seq.
#[test]
fn appends_are_dense_once_per_id_and_read_in_seq_order() {
    on_both(|db| {
        setup(db, "shop");
        let (a, b, again) = db
            .tx(|c| {
                let a = append(c, "shop", &event("Opened", "s-1").id("e-1"))?;
                let b = append(c, "shop", &event("Closed", "s-2"))?;
                let again = append(c, "shop", &event("Opened", "s-1").id("e-1"))?;
                Ok((a, b, again))
            })
            .unwrap();
        assert_eq!((a.seq, b.seq), (1, 2), "{}", db.name());
        assert!(!a.existing && again.existing);
        assert_eq!(again.seq, 1);
        // Once more, in a transaction of its own: found, no seq taken.
        let later = db
            .tx(|c| append(c, "shop", &event("Opened", "s-1").id("e-1")))
            .unwrap();
        assert_eq!((later.seq, later.existing), (1, true));
        db.tx(|c| {
            assert_eq!(changelog::head(c)?, 2);
            let all = changelog::read(c, &query("shop", 0))?;
            assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
            assert_eq!(all[0].id, "e-1");
            assert_eq!(all[0].payload, r#"{"n":1}"#);
            let closed = changelog::read(c, &query("shop", 0).types(["Closed"]))?;
            assert_eq!(closed.len(), 1);
            assert_eq!(closed[0].subject, "s-2");
            let s1 = changelog::read(c, &query("shop", 0).subject("s-1"))?;
            assert_eq!(s1.len(), 1);
            assert_eq!(changelog::read(c, &query("shop", 1))?.len(), 1);
            assert_eq!(
                changelog::event_by_id(c, "shop", "e-1")?.map(|e| e.seq),
                Some(1)
            );
            assert_eq!(
                changelog::event(c, 2)?.map(|e| e.subject),
                Some("s-2".into())
            );
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 10: a refused append (unknown workspace, unregistered type,
/// reserved type) is a typed error, takes no seq, and leaves the transaction
/// usable: on PostgreSQL a failed statement would abort it, so none may fail.
#[test]
fn a_refused_append_takes_no_seq_and_the_transaction_goes_on() {
    on_both(|db| {
        setup(db, "shop");
        let seq = db
            .tx(|c| {
                let e = append(c, "nowhere", &event("Opened", "x")).unwrap_err();
                assert!(
                    matches!(
                        e,
                        Error::NotFound {
                            kind: "workspace",
                            ..
                        }
                    ),
                    "{e}"
                );
                let e = append(c, "shop", &event("Refunded", "x")).unwrap_err();
                assert!(
                    matches!(
                        e,
                        Error::NotFound {
                            kind: "event type",
                            ..
                        }
                    ),
                    "{e}"
                );
                let e = append(c, "shop", &event("RuleFired", "x")).unwrap_err();
                assert!(matches!(e, Error::ReservedType { .. }), "{e}");
                Ok(append(c, "shop", &event("Opened", "s-1"))?.seq)
            })
            .unwrap();
        assert_eq!(seq, 1, "{}", db.name());
    });
}

/// Invariant 2 and a dense log: a transaction that fails appends nothing, and
/// its seqs are handed out again.
#[test]
fn a_rolled_back_append_leaves_no_gap() {
    on_both(|db| {
        setup(db, "shop");
        let failed: Result<()> = db.tx(|c| {
            append(c, "shop", &event("Opened", "s-1"))?;
            append(c, "shop", &event("Opened", "s-2"))?;
            Err(Error::invalid("test", "the caller gave up"))
        });
        assert!(failed.is_err());
        let seq = db
            .tx(|c| Ok(append(c, "shop", &event("Opened", "s-3"))?.seq))
            .unwrap();
        assert_eq!(seq, 1, "{}", db.name());
        db.tx(|c| {
            assert_eq!(changelog::read(c, &query("shop", 0))?.len(), 1);
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 8: a cursor moves only forward, never past the head.
#[test]
fn a_cursor_moves_only_forward_and_never_past_the_head() {
    on_both(|db| {
        setup(db, "shop");
        let at = ("shop", ConsumerKind::App, "mailer");
        db.tx(|c| {
            for i in 0..3 {
                append(c, "shop", &event("Opened", &format!("s-{i}")))?;
            }
            assert_eq!(cursor::load(c, "shop", ConsumerKind::App, "mailer")?, 0);
            cursor::save(c, NOW, at, 2)
        })
        .unwrap();
        let back = db.tx(|c| cursor::save(c, NOW, at, 1)).unwrap_err();
        assert!(
            matches!(
                back,
                Error::CursorBackwards {
                    current: 2,
                    requested: 1,
                    ..
                }
            ),
            "{}: {back}",
            db.name()
        );
        let ahead = db.tx(|c| cursor::save(c, NOW, at, 4)).unwrap_err();
        assert!(
            matches!(ahead, Error::CursorAhead { head: 3, .. }),
            "{ahead}"
        );
        let unknown = db
            .tx(|c| cursor::save(c, NOW, ("elsewhere", ConsumerKind::App, "m"), 0))
            .unwrap_err();
        assert!(matches!(unknown, Error::NotFound { .. }), "{unknown}");
        db.tx(|c| cursor::save(c, NOW + 1, at, 2)).unwrap();
        db.tx(|c| cursor::save(c, NOW + 2, at, 3)).unwrap();
        let pos = db
            .tx(|c| cursor::load(c, "shop", ConsumerKind::App, "mailer"))
            .unwrap();
        assert_eq!(pos, 3);
    });
}

/// Invariant 7: one holder at a time; taking a lapsed lease bumps the
/// generation, and the old holder's fence fails.
#[test]
fn a_lease_has_one_holder_and_fences_the_one_that_lost_it() {
    on_both(|db| {
        let ttl = Duration::from_secs(30);
        let a = db
            .tx(|c| lease::acquire(c, NOW, "evaluator/shop", "proc-a", ttl))
            .unwrap();
        assert_eq!(a.generation, 1);
        let held = db
            .tx(|c| lease::acquire(c, NOW + 1, "evaluator/shop", "proc-b", ttl))
            .unwrap_err();
        assert!(
            matches!(&held, Error::LeaseHeld { holder, .. } if holder == "proc-a"),
            "{}: {held}",
            db.name()
        );
        let a = db.tx(|c| lease::renew(c, NOW + 10_000, &a)).unwrap();
        assert_eq!(a.expires_at, NOW + 40_000);
        db.tx(|c| lease::fence(c, NOW + 39_999, &a)).unwrap();
        // A pauses past its expiry; B takes over.
        let b = db
            .tx(|c| lease::acquire(c, NOW + 40_000, "evaluator/shop", "proc-b", ttl))
            .unwrap();
        assert_eq!(b.generation, 2);
        let lost = db.tx(|c| lease::fence(c, NOW + 40_001, &a)).unwrap_err();
        assert!(
            matches!(lost, Error::LeaseLost { generation: 1, .. }),
            "{lost}"
        );
        assert!(db.tx(|c| lease::renew(c, NOW + 40_001, &a)).is_err());
        assert!(!db.tx(|c| lease::release(c, NOW + 40_001, &a)).unwrap());
        assert!(db.tx(|c| lease::release(c, NOW + 40_001, &b)).unwrap());
        // Released: free at once, and the generation is not reused.
        let c2 = db
            .tx(|c| lease::acquire(c, NOW + 40_002, "evaluator/shop", "proc-c", ttl))
            .unwrap();
        assert_eq!(c2.generation, 3);
        let listed = db.tx(|c| lease::list(c)).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].holder, "proc-c");
    });
}

/// Invariant 10 (an unregistered type is `NotFound`): workspaces and their
/// types list the same on both backends.
#[test]
fn workspaces_list_their_application_types() {
    on_both(|db| {
        setup(db, "shop");
        db.tx(|c| {
            assert!(!workspace::create(c, NOW, "shop")?);
            workspace::register_types(c, NOW, "shop", &["Opened", "Paid"])?;
            let e = workspace::register_types(c, NOW, "nowhere", &["Opened"]).unwrap_err();
            assert!(matches!(e, Error::NotFound { .. }));
            let listed = workspace::list(c)?;
            assert_eq!(listed.len(), 1);
            assert_eq!(listed[0].event_types, ["Closed", "Opened", "Paid"]);
            Ok(())
        })
        .unwrap();
    });
}

/// Whether the server's backend `pid` is waiting for a lock.
fn waits_for_a_lock(client: &mut Client, pid: i32) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)",
            &[&pid],
        )
        .unwrap()
        .get(0)
}

/// Invariant 1 on PostgreSQL, the way event stores on it have got it wrong: a
/// transaction that appended first and commits last must not be skipped by a
/// reader that saw later appends. Here the later append waits for the first to
/// commit, so the reader never sees seq 2 without seq 1.
#[test]
fn a_reader_never_skips_an_event_committed_late() {
    let schema = Arc::new(PgSchema::new());
    let reader = schema.pool(1);
    let mut watcher = schema.client();
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    setup(&mut db, "shop");

    let slow = schema.begin();
    assert_eq!(
        append(&slow, "shop", &event("Opened", "slow")).unwrap().seq,
        1
    );

    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    let later = {
        let schema = Arc::clone(&schema);
        std::thread::spawn(move || {
            let conn = schema.begin();
            let pid: i32 = conn.query_untyped("SELECT pg_backend_pid()", &[]).unwrap()[0].get(0);
            pid_tx.send(pid).unwrap();
            let seq = append(&conn, "shop", &event("Opened", "quick"))
                .unwrap()
                .seq;
            conn.commit().unwrap();
            seq
        })
    };
    // The later append is waiting on the first (not merely not started).
    let pid = pid_rx.recv().unwrap();
    while !waits_for_a_lock(&mut watcher, pid) {
        std::thread::yield_now();
    }
    let seen = {
        let conn = PgConn::begin_as(reader.get().unwrap(), false).unwrap();
        let seen = changelog::read(&conn, &query("shop", 0)).unwrap();
        conn.commit().unwrap();
        seen
    };
    assert!(seen.is_empty(), "nothing is committed yet: {seen:?}");
    slow.commit().unwrap();
    assert_eq!(later.join().unwrap(), 2);
    let conn = PgConn::begin_as(reader.get().unwrap(), false).unwrap();
    let seen = changelog::read(&conn, &query("shop", 0)).unwrap();
    assert_eq!(
        seen.iter()
            .map(|e| (e.seq, e.subject.as_str()))
            .collect::<Vec<_>>(),
        [(1, "slow"), (2, "quick")]
    );
}

/// Invariant 1 under load: writers append in transactions held open for a
/// random while (`pg_sleep`) — some roll back — while a reader follows the log
/// with a cursor. The reader gets every committed event exactly once, in seq
/// order, and the seqs are dense. Its assertions do not depend on the timing;
/// the sleeps only vary the interleavings.
#[test]
fn a_cursor_following_concurrent_writers_gets_every_committed_event_once() {
    const WRITERS: usize = 4;
    const TXS: usize = 40;
    let schema = Arc::new(PgSchema::new());
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    setup(&mut db, "shop");
    let start = Arc::new(Barrier::new(WRITERS + 1));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (schema, start) = (Arc::clone(&schema), Arc::clone(&start));
            std::thread::spawn(move || {
                let pool = schema.pool(1);
                let mut committed = Vec::new();
                start.wait();
                for t in 0..TXS {
                    let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
                    let mut ids = Vec::new();
                    for k in 0..=(t % 3) {
                        let id = format!("w{w}-t{t}-{k}");
                        append(&conn, "shop", &event("Opened", &id).id(&id)).unwrap();
                        ids.push(id);
                    }
                    let pause = fastrand::u32(0..4);
                    conn.execute_untyped(&format!("SELECT pg_sleep({pause} / 1000.0)"), &[])
                        .unwrap();
                    if t % 5 == 4 {
                        drop(conn); // rolled back
                    } else {
                        conn.commit().unwrap();
                        committed.extend(ids);
                    }
                }
                committed
            })
        })
        .collect();

    let reader = schema.pool(1);
    let mut seen: Vec<(i64, String)> = Vec::new();
    let mut cursor = 0;
    start.wait();
    let follow = |reader: &pg::Pool, cursor: &mut i64, seen: &mut Vec<(i64, String)>| {
        let conn = PgConn::begin_as(reader.get().unwrap(), false).unwrap();
        let page = changelog::read(&conn, &query("shop", *cursor)).unwrap();
        conn.commit().unwrap();
        for e in page {
            assert!(e.seq > *cursor);
            *cursor = e.seq;
            seen.push((e.seq, e.id));
        }
    };
    while writers.iter().any(|w| !w.is_finished()) {
        follow(&reader, &mut cursor, &mut seen);
    }
    let committed: BTreeSet<String> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    follow(&reader, &mut cursor, &mut seen);

    let seqs: Vec<i64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        seqs,
        (1..=committed.len() as i64).collect::<Vec<_>>(),
        "dense, in order"
    );
    let ids: BTreeSet<String> = seen.into_iter().map(|s| s.1).collect();
    assert_eq!(ids, committed, "every committed event, and only those");
}

/// Invariant 10 (nothing committed is changed): the schema is applied once, by
/// one of several openers at once; a database with a newer schema is refused
/// and left as it is.
#[test]
fn the_schema_is_applied_once_and_a_newer_one_is_refused() {
    let schema = Arc::new(PgSchema::new());
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let schema = Arc::clone(&schema);
            std::thread::spawn(move || drop(schema.client()))
        })
        .collect();
    for o in openers {
        o.join().unwrap();
    }
    let mut client = schema.client();
    let versions: i64 = client
        .query_one("SELECT count(*) FROM reflexr_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        versions,
        i64::from(pg::schema::SCHEMA_VERSION),
        "each version once"
    );
    client
        .batch_execute("INSERT INTO reflexr_schema_version (version) VALUES (99)")
        .unwrap();
    let e = pg::schema::apply(&mut client, "test").unwrap_err();
    assert!(
        matches!(
            e,
            Error::SchemaTooNew {
                found: 99,
                supported,
                ..
            } if supported == i64::from(pg::schema::SCHEMA_VERSION)
        ),
        "{e}"
    );
}

/// Invariant 1 with the application's savepoints: appends rolled back to a
/// savepoint give their lock up with them, so another transaction may append
/// and commit before this one; what this one appends after that still gets new
/// seqs, in commit order, and no two events share one (a gap is allowed where
/// the rolled-back appends were; a skip is not).
#[test]
fn appends_rolled_back_to_a_savepoint_leave_no_duplicate_and_no_skip() {
    let schema = Arc::new(PgSchema::new());
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    setup(&mut db, "shop");
    let first = schema.begin();
    first.execute_untyped("SAVEPOINT mine", &[]).unwrap();
    assert_eq!(
        append(&first, "shop", &event("Opened", "undone"))
            .unwrap()
            .seq,
        1
    );
    first
        .execute_untyped("ROLLBACK TO SAVEPOINT mine", &[])
        .unwrap();
    // The head's lock went with the savepoint: another transaction appends
    // and commits without waiting.
    let other = schema.begin();
    assert_eq!(
        append(&other, "shop", &event("Opened", "other"))
            .unwrap()
            .seq,
        1
    );
    other.commit().unwrap();
    let kept = append(&first, "shop", &event("Opened", "kept"))
        .unwrap()
        .seq;
    assert!(kept > 1, "after the other's commit: {kept}");
    first.commit().unwrap();
    let reader = schema.begin();
    let seen = changelog::read(&reader, &query("shop", 0)).unwrap();
    assert_eq!(
        seen.iter().map(|e| e.subject.as_str()).collect::<Vec<_>>(),
        ["other", "kept"]
    );
    assert_eq!(changelog::head(&reader).unwrap(), kept);
}

/// A schema's shape: (table, column, type, nullable) of the engine's
/// tables, and the indexes' definitions.
type Shape = (Vec<(String, String, String, String)>, Vec<String>);

/// The shape of the engine's tables in a schema.
fn shape(client: &mut Client, schema: &str) -> Shape {
    let columns = client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text \
             FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name LIKE 'reflexr%' \
             ORDER BY table_name, column_name",
            &[&schema],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let indexes = client
        .query(
            "SELECT replace(indexdef, $1 || '.', '') FROM pg_indexes \
             WHERE schemaname = $1 ORDER BY indexname",
            &[&schema],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    (columns, indexes)
}

/// Invariant 10 (nothing committed is lost): a database at version 1 (what the
/// first release wrote) migrates to the current version, and ends the same
/// shape as a new one.
#[test]
fn a_version_1_database_migrates_to_the_shape_of_a_new_one() {
    let old = PgSchema::new();
    let mut client = Client::connect(&old.url(), NoTls).unwrap();
    client.batch_execute(pg::schema::SCHEMA_SQL).unwrap();
    let v: i32 = client
        .query_one("SELECT max(version) FROM reflexr_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, 1);
    pg::schema::apply(&mut client, "old").unwrap();
    let new = PgSchema::new();
    let mut fresh = new.client();
    assert_eq!(shape(&mut client, &old.name), shape(&mut fresh, &new.name));
    let v: i32 = client
        .query_one("SELECT max(version) FROM reflexr_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, pg::schema::SCHEMA_VERSION);
}

/// A task run to create: ready now unless `lane` or `unique` say otherwise.
fn task<'a>(id: &'a str, lane: Option<&'a str>, unique: Option<Uniq<'a>>) -> NewRun<'a> {
    static RETRY: std::sync::LazyLock<RetryPolicy> = std::sync::LazyLock::new(RetryPolicy::default);
    NewRun {
        id,
        kind: "task",
        action: "send",
        workspace: None,
        rule: None,
        scope: None,
        lane,
        on_dead_letter: "continue",
        input: r#"{"to":"a@example.com"}"#,
        event_seq: None,
        event_id: None,
        depth: 0,
        retry: &RETRY,
        due_at: NOW,
        now: NOW,
        dead: None,
        priority: None,
        unique,
    }
}

fn send() -> Vec<String> {
    vec!["send".to_string()]
}

/// Invariant 5 (a run's claim is its holder's at its attempt): only the claim
/// that holds settles a run; a retry is claimed again at the next attempt, and
/// the old claim settles nothing.
#[test]
fn a_claim_is_settled_only_by_its_holder_at_its_attempt() {
    on_both(|db| {
        db.tx(|c| {
            for id in ["r1", "r2", "r3"] {
                assert_eq!(Runs::insert(c, &task(id, None, None))?, Inserted::New);
            }
            assert_eq!(Runs::insert(c, &task("r1", None, None))?, Inserted::Existed);
            Ok(())
        })
        .unwrap();
        let claimed = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 30_000, 2, &send(), 0))
            .unwrap();
        assert_eq!(claimed.len(), 2, "{}", db.name());
        assert!(
            claimed
                .iter()
                .all(|r| r.attempt == 1 && r.state == "running")
        );
        let (first, second) = (&claimed[0].id, &claimed[1].id);
        db.tx(|c| {
            assert!(!Runs::succeed(c, first, "b", 1, NOW)?, "another holder");
            assert!(!Runs::succeed(c, first, "a", 2, NOW)?, "another attempt");
            assert!(Runs::succeed(c, first, "a", 1, NOW)?);
            assert!(!Runs::succeed(c, first, "a", 1, NOW)?, "settled once");
            assert!(Runs::renew(c, second, "a", 1, NOW + 1, NOW + 40_000)?);
            assert!(Runs::retry_later(
                c,
                second,
                "a",
                1,
                NOW + 2,
                NOW + 5_000,
                "timeout"
            )?);
            Ok(())
        })
        .unwrap();
        // Not due yet: only the third run is claimable now.
        let now_claimed = db
            .tx(|c| Runs::claim_at(c, "b", NOW + 3, NOW + 30_000, 10, &send(), 0))
            .unwrap();
        assert_eq!(now_claimed.len(), 1);
        assert_eq!(now_claimed[0].id, "r3");
        let again = db
            .tx(|c| Runs::claim_at(c, "b", NOW + 5_000, NOW + 35_000, 10, &send(), 0))
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].id.as_str(), again[0].attempt),
            (second.as_str(), 2)
        );
        db.tx(|c| {
            assert!(!Runs::kill(c, second, "a", 1, NOW + 5_001, "stale")?);
            assert!(Runs::kill(c, second, "b", 2, NOW + 5_001, "gave up")?);
            let row = Runs::get(c, second)?.expect("the run");
            assert_eq!(row.state, "dead");
            assert_eq!(row.last_error.as_deref(), Some("gave up"));
            assert_eq!(
                Runs::get(c, first)?.map(|r| r.state),
                Some("succeeded".into())
            );
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 6 (scope order) and uniqueness, as runs are created: the first run
/// of a lane is ready and the next waits; a key another pending run holds
/// creates nothing and names that run.
#[test]
fn a_lane_runs_one_at_a_time_and_a_unique_key_is_held_once() {
    on_both(|db| {
        let pending = Uniq {
            key: "shard/3",
            mode: "pending",
            period_ms: 0,
        };
        db.tx(|c| {
            assert_eq!(
                Runs::insert(c, &task("l1", Some("lane/a"), None))?,
                Inserted::New
            );
            assert_eq!(
                Runs::insert(c, &task("l2", Some("lane/a"), None))?,
                Inserted::New
            );
            assert_eq!(
                Runs::insert(c, &task("u1", None, Some(pending)))?,
                Inserted::New
            );
            assert_eq!(
                Runs::insert(c, &task("u2", None, Some(pending)))?,
                Inserted::Duplicate("u1".into())
            );
            assert_eq!(Runs::get(c, "l1")?.map(|r| r.state), Some("ready".into()));
            assert_eq!(Runs::get(c, "l2")?.map(|r| r.state), Some("waiting".into()));
            assert!(Runs::get(c, "u2")?.is_none());
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 5: claims on PostgreSQL: four claimers at once over 2,000 runs,
/// each claiming batches in transactions of its own and settling them. Every
/// run is claimed exactly once; and a claimer never waits for another's
/// uncommitted claim (`SKIP LOCKED`: with a lock timeout of a second, a wait
/// would be an error).
#[test]
fn concurrent_claimers_never_share_a_run_and_never_wait_for_each_other() {
    const RUNS: usize = 2_000;
    let schema = Arc::new(PgSchema::new());
    let mut db = Db::Pg(schema.pool(1), Arc::clone(&schema));
    let ids: Vec<String> = (0..RUNS).map(|i| format!("run-{i:05}")).collect();
    db.tx(|c| {
        for id in &ids {
            Runs::insert(c, &task(id, None, None))?;
        }
        Ok(())
    })
    .unwrap();

    // One claimer holds its claim open; another claims beside it at once.
    let holding = schema.begin();
    let held = Runs::claim_at(&holding, "slow", NOW, NOW + 30_000, 10, &send(), 0).unwrap();
    let beside = schema.begin();
    beside
        .execute_untyped("SET LOCAL lock_timeout = '1s'", &[])
        .unwrap();
    let other = Runs::claim_at(&beside, "quick", NOW, NOW + 30_000, 10, &send(), 0).unwrap();
    assert_eq!((held.len(), other.len()), (10, 10));
    assert!(held.iter().all(|h| other.iter().all(|o| o.id != h.id)));
    drop(beside); // rolled back: its runs are ready again
    drop(holding);

    let claimers: Vec<_> = (0..4)
        .map(|w| {
            let schema = Arc::clone(&schema);
            std::thread::spawn(move || {
                let pool = schema.pool(1);
                let holder = format!("claimer-{w}");
                let mut mine = Vec::new();
                loop {
                    let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
                    conn.execute_untyped("SET LOCAL lock_timeout = '1s'", &[])
                        .unwrap();
                    let batch =
                        Runs::claim_at(&conn, &holder, NOW, NOW + 30_000, 25, &send(), 0).unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    for r in &batch {
                        assert!(Runs::succeed(&conn, &r.id, &holder, r.attempt, NOW).unwrap());
                        mine.push(r.id.clone());
                    }
                    conn.commit().unwrap();
                }
                mine
            })
        })
        .collect();
    let mut claimed: Vec<String> = claimers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    claimed.sort();
    assert_eq!(claimed, ids, "every run claimed exactly once");
}

/// Invariant 6 (scope order): a lane runs one run at a time, in order — when
/// its head ends, the next waiting run becomes head and ready; a blocked lane
/// says so; a lane with nothing left goes.
#[test]
fn a_lane_hands_on_to_its_next_run_when_its_head_ends() {
    on_both(|db| {
        db.tx(|c| {
            for id in ["l1", "l2", "l3"] {
                Runs::insert(c, &task(id, Some("lane/a"), None))?;
            }
            Ok(())
        })
        .unwrap();
        let claimed = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 30_000, 10, &send(), 0))
            .unwrap();
        let ids: Vec<&str> = claimed.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["l1"], "{}: only the head is ready", db.name());
        db.tx(|c| {
            assert!(Runs::succeed(c, "l1", "a", 1, NOW + 1)?);
            // Not the head: nothing moves.
            Runs::advance_lane(c, "lane/a", "l3", NOW + 1)?;
            assert_eq!(Runs::lane_head(c, "lane/a")?, Some(("l1".into(), false)));
            Runs::advance_lane(c, "lane/a", "l1", NOW + 1)?;
            assert_eq!(Runs::lane_head(c, "lane/a")?, Some(("l2".into(), false)));
            assert_eq!(Runs::get(c, "l2")?.map(|r| r.state), Some("ready".into()));
            assert_eq!(Runs::get(c, "l3")?.map(|r| r.state), Some("waiting".into()));
            assert!(Runs::set_blocked(c, "lane/a", true, NOW + 2)?);
            assert_eq!(Runs::lane_head(c, "lane/a")?, Some(("l2".into(), true)));
            assert!(!Runs::set_blocked(c, "lane/none", true, NOW + 2)?);
            Runs::advance_lane(c, "lane/a", "l2", NOW + 3)?;
            Runs::advance_lane(c, "lane/a", "l3", NOW + 3)?;
            assert_eq!(Runs::lane_head(c, "lane/a")?, None, "an empty lane goes");
            Ok(())
        })
        .unwrap();
    });
}

/// Invariant 5 (at least once): a claim whose executor stopped renewing it
/// lapses and is claimable again at the next attempt; a claim given back at
/// shutdown does not count as an attempt; a checkpoint is saved only by the
/// claim that holds.
#[test]
fn a_lapsed_claim_is_claimed_again_and_a_released_one_keeps_its_attempt() {
    on_both(|db| {
        db.tx(|c| Runs::insert(c, &task("r1", None, None)).map(|_| ()))
            .unwrap();
        let first = db
            .tx(|c| Runs::claim_at(c, "a", NOW, NOW + 10, 1, &send(), 0))
            .unwrap();
        let ord = first[0].ord;
        let name = db.name();
        db.tx(|c| {
            assert!(Runs::save_checkpoint(
                c,
                "r1",
                "a",
                1,
                r#"{"page":2}"#,
                NOW + 1
            )?);
            assert!(!Runs::save_checkpoint(c, "r1", "b", 1, "{}", NOW + 1)?);
            assert!(Runs::lapsed(c, NOW + 9, 10)?.is_empty(), "not yet");
            let lapsed = Runs::lapsed(c, NOW + 10, 10)?;
            assert_eq!(lapsed.len(), 1, "{name}");
            assert_eq!(
                Runs::requeue_lapsed(c, ord, NOW + 10)?,
                runs::Requeued::Ready
            );
            assert_eq!(Runs::requeue_lapsed(c, ord, NOW + 10)?, runs::Requeued::No);
            Ok(())
        })
        .unwrap();
        let second = db
            .tx(|c| Runs::claim_at(c, "b", NOW + 11, NOW + 40, 1, &send(), 0))
            .unwrap();
        assert_eq!(
            (second[0].attempt, second[0].checkpoint.as_deref()),
            (2, Some(r#"{"page":2}"#))
        );
        db.tx(|c| {
            assert!(
                !Runs::succeed(c, "r1", "a", 1, NOW + 12)?,
                "the lapsed claim settles nothing"
            );
            assert_eq!(Runs::release(c, ord, "a", 1, NOW + 12)?, runs::Requeued::No);
            assert_eq!(
                Runs::release(c, ord, "b", 2, NOW + 12)?,
                runs::Requeued::Ready
            );
            assert_eq!(
                Runs::get(c, "r1")?.map(|r| (r.state, r.attempt)),
                Some(("ready".into(), 1))
            );
            Ok(())
        })
        .unwrap();
    });
}
