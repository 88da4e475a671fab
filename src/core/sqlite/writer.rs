//! SQLite's writer: one connection per engine through which every write of the
//! process goes, committing several callers' work in one transaction.
//!
//! # Why
//!
//! A durable commit costs one fsync (DESIGN.md, "Writes": ~6,100 commits/s
//! here, against ~550,000 rows/s when a thousand rows share a commit). More
//! connections do not help: SQLite has one writer. So callers share commits.
//!
//! # How
//!
//! Callers are combined ([`crate::core::combiner`]): the leader takes every caller
//! queued as a batch, opens `BEGIN IMMEDIATE`, runs each closure in a
//! savepoint of its own (`ROLLBACK TO` it when the closure fails or panics,
//! so one caller's failure undoes only its own part), commits, and tells each
//! caller the outcome. Two kinds of caller need no savepoint, which costs two
//! statements and a copy of every page the caller changes into SQLite's
//! statement journal: the lone member of a batch (its transaction is its
//! own), and a single append (`CoreDb::write_single`: one statement, which
//! SQLite undoes if it fails). While it commits (the fsync), new callers queue and
//! form the next batch. A caller is woken once, for its outcome (or to lead)
//! — no caller waits its turn on the connection, which is where a
//! caller-by-caller handoff spent its time on two cores.
//!
//! So a closure may run on another caller's thread: it must be `Send`. It
//! may still borrow from its caller, which stays blocked until the leader is
//! done with it. A panic in it is caught where it runs and re-raised in its
//! caller's thread.
//!
//! A closure cannot end the transaction: the connection's guard
//! ([`crate::store::sqlite::conn::Guard`], SQLite's authorizer) refuses `COMMIT`,
//! `ROLLBACK`, `BEGIN`, the engine's savepoints and the pragmas the engine
//! relies on before they run, with [`Error::StatementRefused`]. Should SQLite
//! still roll the transaction back on its own (an I/O error), or the leader
//! fail in the writer's own code, the whole batch is abandoned: the
//! transaction is rolled back and every member is told
//! [`Error::TransactionAborted`] (or the error) — what the file holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::base::error::{Error, Result};
use crate::core::combiner::{Batch, Combiner, Ended, Shape};
use crate::core::db::{Env, Tx};
use crate::core::wake::{Notifier, Wake};
use crate::core::writer::{Inside, NEXT_WRITER_ID, WriterStats};
use crate::store::Sqlite;
use crate::store::sqlite::conn::{Control, Guard, retry_busy};

pub(crate) struct Writer {
    id: usize,
    commits: AtomicU64,
    writes: AtomicU64,
    aborts: AtomicU64,
    combiner: Combiner,
    /// Locked by the leader, and by the notifier's polls when no leader
    /// holds it (`core::sqlite::watch`).
    conn: Arc<Mutex<Connection>>,
    guard: Guard,
    busy_timeout: Duration,
    notifier: Arc<Notifier>,
    /// When the writer was made, and when (µs after) it last looked for
    /// other processes' commits ([`Notifier::writer_looks`]).
    born: Instant,
    looked_at_us: AtomicU64,
}

/// The writer looks for other processes' commits at most this often (µs)
/// while the WAL watch is deaf ([`Writer::look_for_others`]).
const LOOK_EVERY_US: u64 = 500;

impl Writer {
    /// The writer on `conn` (configured, schema current); it installs the
    /// connection's guard. Commits that created work wake `notifier`.
    pub(crate) fn new(
        conn: Arc<Mutex<Connection>>,
        busy_timeout: Duration,
        notifier: Arc<Notifier>,
    ) -> Result<Writer> {
        let guard = Guard::install(&conn.lock().unwrap_or_else(PoisonError::into_inner))?;
        Ok(Writer {
            id: NEXT_WRITER_ID.fetch_add(1, Ordering::Relaxed),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            combiner: Combiner::new(),
            conn,
            guard,
            busy_timeout,
            notifier,
            born: Instant::now(),
            looked_at_us: AtomicU64::new(0),
        })
    }

    /// How many callers wait for a leader (for tests that build a batch).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.combiner.queued()
    }

    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            aborts: self.aborts.load(Ordering::Relaxed),
        }
    }

    /// Runs `f` inside the process's shared write transaction and returns its
    /// value once the transaction has committed.
    ///
    /// # Panics
    /// When called from inside a write closure of the same engine: the closure
    /// holds the transaction the nested call would wait for. Use the [`Tx`]
    /// you were given. A panic of `f` is re-raised here, after its work was
    /// rolled back.
    ///
    /// `single`: `f` writes with one statement at most, and fails only
    /// before it or by its own failure (see `Member::single`); it runs
    /// without a savepoint.
    pub(crate) fn write<T, E, F>(&self, env: &Env, single: bool, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        let _inside = Inside::enter(self.id);
        let shape = if single { Shape::Single } else { Shape::Any };
        self.combiner
            .call(f, shape, &|_| None, &mut |batch| self.run_batch(env, batch))
    }

    /// One transaction over the batch: each member in a savepoint, then the
    /// commit; the batch, dropped on the way out, tells the members. Two
    /// kinds of member run without a savepoint (two statements fewer, and
    /// no copies of the pages they change into SQLite's statement journal):
    /// the lone member of a batch, whose transaction rolls back whole if it
    /// fails, and a member that writes with one statement at most — SQLite
    /// undoes a statement that fails, so a failed member changed nothing,
    /// which the count of changes confirms; if it did change a row (a panic
    /// after its statement), the batch fails whole rather than commit it.
    fn run_batch(&self, env: &Env, mut batch: Batch) {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let mut txn = Transaction {
            conn: &conn,
            guard: &self.guard,
            open: false,
        };
        if let Err(e) = retry_busy(self.busy_timeout, || {
            self.guard.control(&conn, Control::Begin)
        }) {
            return batch.end(Err(Arc::new(e)));
        }
        txn.open = true;
        self.look_for_others(&conn);
        // A batch of one needs no savepoint either: its transaction is its
        // own, rolled back whole if it fails.
        let alone = batch.members().len() == 1;
        let (mut members, mut nudge) = (0u64, Wake::NONE);
        let mut failed = None;
        for member in batch.members() {
            let single = member.single() || alone;
            if !single && let Err(e) = self.guard.control(&conn, Control::Call) {
                failed = Some(e);
                break;
            }
            let changes = conn.total_changes();
            let mut tx = Tx::<Sqlite>::new(&conn, &self.guard, env);
            let outcome = member.run(&mut tx);
            let ended = if alone {
                end_alone(&conn)
            } else if single {
                end_single(&conn, outcome.ok, changes)
            } else {
                end_savepoint(&conn, &self.guard, outcome.ok)
            };
            if let Err(e) = ended {
                failed = Some(e);
                break;
            }
            if outcome.ok {
                members += 1;
                nudge = nudge.with(outcome.nudge);
            }
        }
        if let Some(e) = failed {
            return batch.end(self.abort(&mut txn, e));
        }
        if alone && members == 0 {
            // The lone member failed, and reports its own error: nothing
            // of its work may commit.
            txn.roll_back();
            return batch.end(Ok(()));
        }
        #[cfg(test)]
        faults::at(faults::Fault::BeforeCommit);
        match self.guard.control(&conn, Control::Commit) {
            Ok(()) => {
                txn.open = false;
                batch.end(Ok(()));
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.writes.fetch_add(members, Ordering::Relaxed);
                super::watch::own_commit();
            }
            Err(e) => return batch.end(self.abort(&mut txn, e)),
        }
        #[cfg(test)]
        faults::at(faults::Fault::AfterCommit);
        drop(batch);
        #[cfg(test)]
        faults::at(faults::Fault::AfterWake);
        self.notifier.nudge_for(nudge);
    }

    /// While the WAL watch is deaf ([`Notifier::writer_looks`]: this
    /// process commits on), looks for other processes' commits at the
    /// start of a transaction, at most every [`LOOK_EVERY_US`]: its
    /// snapshot already holds them, so `PRAGMA data_version` here costs no
    /// read of the WAL's index of its own, and on this connection the
    /// number changes only for other connections' commits.
    fn look_for_others(&self, conn: &Connection) {
        if !self.notifier.writer_looks() {
            return;
        }
        let now = u64::try_from(self.born.elapsed().as_micros()).unwrap_or(u64::MAX);
        if now.saturating_sub(self.looked_at_us.load(Ordering::Relaxed)) < LOOK_EVERY_US {
            return;
        }
        self.looked_at_us.store(now, Ordering::Relaxed);
        let version = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get(0)));
        if let Ok(v) = version {
            self.notifier.observe(v);
        }
    }

    /// Rolls the open transaction back (if SQLite has not already) and
    /// returns the error every member is told.
    fn abort(&self, txn: &mut Transaction<'_>, e: Error) -> Ended {
        self.aborts.fetch_add(1, Ordering::Relaxed);
        txn.roll_back();
        Err(Arc::new(e))
    }
}

/// The batch's transaction: rolled back when left open, on every way out of
/// [`Writer::run_batch`] — an unwind included.
struct Transaction<'a> {
    conn: &'a Connection,
    guard: &'a Guard,
    open: bool,
}

impl Transaction<'_> {
    fn roll_back(&mut self) {
        if self.open
            && !self.conn.is_autocommit()
            && let Err(e) = self.guard.control(self.conn, Control::Rollback)
        {
            log::error!("reflexr: rollback failed: {e}");
        }
        self.open = false;
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        self.roll_back();
    }
}

/// Releases a caller's savepoint, rolling its work back first unless it
/// succeeded. An error here, or a transaction SQLite already ended, dooms the
/// batch.
fn end_savepoint(conn: &Connection, guard: &Guard, keep: bool) -> Result<()> {
    if conn.is_autocommit() {
        return Err(rolled_back());
    }
    if !keep {
        guard.control(conn, Control::RollbackCall)?;
    }
    guard.control(conn, Control::ReleaseCall)
}

/// After the lone member of a batch, which ran without a savepoint: the
/// transaction must still be open (its outcome decides the commit).
fn end_alone(conn: &Connection) -> Result<()> {
    if conn.is_autocommit() {
        return Err(rolled_back());
    }
    Ok(())
}

/// After a member that ran without a savepoint: the transaction must still
/// be open, and a member that failed must have changed nothing (`changes`:
/// the connection's count of changed rows before it ran).
fn end_single(conn: &Connection, ok: bool, changes: u64) -> Result<()> {
    if conn.is_autocommit() {
        return Err(rolled_back());
    }
    if !ok && conn.total_changes() != changes {
        return Err(Error::TransactionAborted {
            detail: "a write that runs without a savepoint failed after it changed a row; \
                     the batch it shared is not committed"
                .into(),
        });
    }
    Ok(())
}

fn rolled_back() -> Error {
    Error::TransactionAborted {
        detail: "SQLite rolled the transaction back during a write (an I/O error, \
                 or a full disk mid-statement)"
            .into(),
    }
}

/// Points in the leader's own code where a test can make it panic, to prove
/// that a leader failing anywhere leaves every caller with its true outcome
/// and the writer usable.
#[cfg(test)]
pub(crate) mod faults {
    use std::cell::Cell;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(crate) enum Fault {
        BeforeCommit,
        AfterCommit,
        AfterWake,
    }

    thread_local! {
        static ARMED: Cell<Option<Fault>> = const { Cell::new(None) };
    }

    /// Makes this thread's leader panic once at `fault` (arm it from a write
    /// closure: closures run on the leader's thread).
    pub(crate) fn arm(fault: Fault) {
        ARMED.with(|a| a.set(Some(fault)));
    }

    pub(crate) fn at(fault: Fault) {
        if ARMED.with(|a| a.get()) == Some(fault) {
            ARMED.with(|a| a.set(None));
            panic!("the leader fails at {fault:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    //! Group commit, driven deterministically: a first caller's closure holds
    //! the lead until the others are queued behind it (waiting on the queue's
    //! length, not on time), so the others share the next transaction.

    use std::sync::Arc;

    use super::faults::{self, Fault};
    use crate::base::error::Error;
    use crate::core::sqlite::db::Db;

    /// The core of one file, with [`crate::Engine::write`]'s error type.
    #[derive(Clone)]
    struct Engine(Arc<Db>);

    impl Engine {
        fn write<T: Send>(
            &self,
            f: impl FnOnce(&mut crate::core::db::Tx<'_>) -> crate::Result<T> + Send,
        ) -> crate::Result<T> {
            self.0.write(f)
        }

        fn write_single<T: Send>(
            &self,
            f: impl FnOnce(&mut crate::core::db::Tx<'_>) -> crate::Result<T> + Send,
        ) -> crate::Result<T> {
            self.0.write_single(f)
        }

        fn read<T>(
            &self,
            f: impl FnMut(&rusqlite::Connection) -> crate::Result<T>,
        ) -> crate::Result<T> {
            self.0.read(f)
        }

        fn writer_stats(&self) -> super::WriterStats {
            self.0.writer_stats()
        }

        fn writer(&self) -> &super::Writer {
            self.0.writer()
        }
    }

    fn engine() -> (tempfile::TempDir, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine(Arc::new(Db::open_for_test(&dir.path().join("w.db"))));
        engine
            .write(|tx| tx.execute("CREATE TABLE t (name TEXT PRIMARY KEY)", []))
            .unwrap();
        (dir, engine)
    }

    fn names(engine: &Engine) -> Vec<String> {
        engine
            .read(|c| {
                let mut s = c.prepare("SELECT name FROM t ORDER BY name")?;
                let v = s
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()?;
                Ok(v)
            })
            .unwrap()
    }

    /// Holds the lead in a write until `others.len()` more callers are
    /// queued, so that they all share the transaction after it.
    fn batch_of<R: Send + 'static>(
        engine: &Engine,
        others: Vec<Box<dyn FnOnce(Engine) -> R + Send>>,
    ) -> Vec<std::thread::Result<R>> {
        let n = others.len();
        let gate = Arc::new(std::sync::Barrier::new(n + 1));
        let handles: Vec<_> = others
            .into_iter()
            .map(|f| {
                let e = engine.clone();
                let g = Arc::clone(&gate);
                std::thread::spawn(move || {
                    g.wait();
                    f(e)
                })
            })
            .collect();
        let writer = engine.writer();
        engine
            .write(|_| {
                gate.wait();
                while writer.queued() < n {
                    std::thread::yield_now();
                }
                Ok(())
            })
            .unwrap();
        handles.into_iter().map(|h| h.join()).collect()
    }

    #[test]
    fn one_callers_failure_rolls_back_only_its_own_part() {
        // Invariant 2, within a shared batch: each caller's work commits or
        // rolls back as a unit, whatever its neighbours in the batch do.
        let (_dir, engine) = engine();
        let before = engine.writer_stats();
        let rest = batch_of(
            &engine,
            vec![
                Box::new(|e: Engine| {
                    e.write(|tx| tx.execute("INSERT INTO t VALUES ('a')", []).map(|_| ()))
                }),
                Box::new(|e: Engine| {
                    e.write(|tx| {
                        tx.execute("INSERT INTO t VALUES ('b')", [])?;
                        Err::<(), _>(Error::invalid("b", "refused"))
                    })
                    .map(|_| ())
                }),
                Box::new(|e: Engine| {
                    e.write(|tx| {
                        tx.execute("INSERT INTO t VALUES ('c')", [])?;
                        panic!("c panics after its insert");
                    })
                }),
                Box::new(|e: Engine| {
                    e.write(|tx| tx.execute("INSERT INTO t VALUES ('d')", []).map(|_| ()))
                }),
            ],
        );
        rest[0].as_ref().unwrap().as_ref().unwrap();
        assert!(
            rest[1].as_ref().unwrap().is_err(),
            "b's own error reaches b"
        );
        assert!(rest[2].is_err(), "c's panic reaches c's thread");
        rest[3].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(names(&engine), ["a", "d"]);
        let after = engine.writer_stats();
        assert_eq!(
            after.commits - before.commits,
            2,
            "the holder's commit, then one for all four"
        );
        assert_eq!(after.writes - before.writes, 3, "the holder, a and d");
    }

    fn insert(e: &Engine, name: &'static str) -> crate::Result<()> {
        e.write_single(move |tx| tx.execute("INSERT INTO t VALUES (?1)", [name]).map(|_| ()))
    }

    #[test]
    fn single_statement_callers_share_a_batch_without_savepoints_and_fail_alone() {
        // Invariant 2, for work that writes with one statement at most (a
        // single append) and so runs without a savepoint: one that fails by
        // its own statement, or before it, leaves nothing, and its
        // neighbours commit.
        let (_dir, engine) = engine();
        insert(&engine, "x").unwrap();
        let before = engine.writer_stats();
        let rest = batch_of(
            &engine,
            vec![
                Box::new(|e: Engine| insert(&e, "a")),
                // The primary key refuses it: SQLite undoes the statement.
                Box::new(|e: Engine| insert(&e, "x")),
                Box::new(|e: Engine| {
                    e.write_single(|_| Err::<(), _>(Error::invalid("c", "refused before writing")))
                }),
                Box::new(|e: Engine| {
                    e.write(|tx| tx.execute("INSERT INTO t VALUES ('d')", []).map(|_| ()))
                }),
            ],
        );
        rest[0].as_ref().unwrap().as_ref().unwrap();
        let dup = rest[1].as_ref().unwrap().as_ref().unwrap_err();
        assert!(format!("{dup}").contains("UNIQUE"), "{dup}");
        assert!(matches!(
            rest[2].as_ref().unwrap(),
            Err(Error::Invalid { .. })
        ));
        rest[3].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(names(&engine), ["a", "d", "x"]);
        let after = engine.writer_stats();
        assert_eq!(
            after.commits - before.commits,
            2,
            "the holder's, then one for all"
        );
        assert_eq!(after.writes - before.writes, 3, "the holder, a and d");
        assert_eq!(after.aborts, before.aborts);
    }

    #[test]
    fn a_single_statement_caller_that_fails_after_writing_fails_its_whole_batch() {
        // Invariant 2: work without a savepoint that panics after its
        // statement cannot be undone alone; rather than commit its row, the
        // batch fails, and every caller in it is told so.
        let (_dir, engine) = engine();
        let rest = batch_of(
            &engine,
            vec![
                Box::new(|e: Engine| insert(&e, "a")),
                Box::new(|e: Engine| {
                    e.write_single(|tx| {
                        tx.execute("INSERT INTO t VALUES ('b')", [])?;
                        panic!("b panics after its insert");
                    })
                }),
                Box::new(|e: Engine| {
                    e.write(|tx| tx.execute("INSERT INTO t VALUES ('c')", []).map(|_| ()))
                }),
            ],
        );
        assert!(matches!(
            rest[0].as_ref().unwrap(),
            Err(Error::TransactionAborted { .. })
        ));
        assert!(rest[1].is_err(), "b's panic reaches b's thread");
        assert!(matches!(
            rest[2].as_ref().unwrap(),
            Err(Error::TransactionAborted { .. })
        ));
        assert!(names(&engine).is_empty(), "{:?}", names(&engine));
        // The writer goes on.
        insert(&engine, "d").unwrap();
        assert_eq!(names(&engine), ["d"]);
    }

    #[test]
    fn a_lone_caller_that_fails_after_writing_leaves_nothing() {
        // Invariant 2, for a batch of one, which runs without a savepoint:
        // its transaction rolls back whole, by an error or a panic, and
        // the writer goes on.
        let (_dir, engine) = engine();
        let before = engine.writer_stats();
        let refused = engine.write(|tx| {
            tx.execute("INSERT INTO t VALUES ('a')", [])?;
            Err::<(), _>(Error::invalid("a", "refused after its insert"))
        });
        assert!(matches!(refused, Err(Error::Invalid { .. })));
        let engine2 = engine.clone();
        let panicked = std::thread::spawn(move || {
            engine2.write(|tx| {
                tx.execute("INSERT INTO t VALUES ('b')", [])?;
                panic!("b panics after its insert");
                #[allow(unreachable_code)]
                Ok(())
            })
        })
        .join();
        assert!(panicked.is_err(), "b's panic reaches b's thread");
        assert!(names(&engine).is_empty(), "{:?}", names(&engine));
        let after = engine.writer_stats();
        assert_eq!(after.commits, before.commits, "nothing to commit");
        assert_eq!(
            after.aborts, before.aborts,
            "a caller's own failure is no abort"
        );
        insert(&engine, "c").unwrap();
        assert_eq!(names(&engine), ["c"]);
    }

    /// Inserts `name`, then tries `sql` (ignoring its refusal), then ends as
    /// `ok` says: what a closure that ends the transaction itself does.
    fn insert_then(
        e: &Engine,
        name: &'static str,
        sql: &'static str,
        ok: bool,
    ) -> crate::Result<()> {
        e.write(move |tx| {
            tx.execute("INSERT INTO t VALUES (?1)", [name])?;
            let refused = tx.conn().execute_batch(sql).unwrap_err();
            assert!(
                matches!(Error::from(refused), Error::StatementRefused { .. }),
                "{sql} is refused"
            );
            if ok {
                Ok(())
            } else {
                Err(Error::invalid("closure", "fails after its statement"))
            }
        })
    }

    #[test]
    fn a_closure_cannot_commit_or_roll_back_the_engines_transaction() {
        // Invariant 2: a COMMIT then an error, or a ROLLBACK then more
        // writes, would half-apply a write reported as failed (or the
        // reverse). Both are refused before they run, so the caller's
        // outcome is what the file holds.
        let (_dir, engine) = engine();
        insert_then(&engine, "committed-then-failed", "COMMIT", false).unwrap_err();
        insert_then(&engine, "rolled-back-then-ok", "ROLLBACK", true).unwrap();
        insert_then(&engine, "end", "END", false).unwrap_err();
        insert_then(&engine, "begin", "BEGIN", true).unwrap();
        insert_then(&engine, "release", "RELEASE reflexr_call", false).unwrap_err();
        insert_then(&engine, "rollback-to", "ROLLBACK TO reflexr_call", true).unwrap();
        insert_then(&engine, "sync-off", "PRAGMA synchronous = OFF", true).unwrap();
        insert_then(&engine, "attach", "ATTACH ':memory:' AS other", true).unwrap();
        assert_eq!(
            names(&engine),
            [
                "attach",
                "begin",
                "rollback-to",
                "rolled-back-then-ok",
                "sync-off"
            ]
        );
        // What a closure may do: its own savepoints, reading pragmas.
        let sync = engine
            .write(|tx| {
                tx.conn().execute_batch(
                    "SAVEPOINT mine; INSERT INTO t VALUES ('undone'); ROLLBACK TO mine; \
                     INSERT INTO t VALUES ('kept'); RELEASE mine;",
                )?;
                Ok(tx
                    .conn()
                    .pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))?)
            })
            .unwrap();
        assert_eq!(sync, 2, "the writer is still synchronous=FULL");
        assert!(names(&engine).contains(&"kept".to_string()));
        // The writer's own control statements are cached, but not under
        // their plain text: a closure preparing them is refused all the same.
        engine
            .write(|tx| {
                for sql in ["RELEASE reflexr_call", "COMMIT", "SAVEPOINT reflexr_nested"] {
                    let refused = tx.conn().prepare_cached(sql).map(|_| ()).unwrap_err();
                    assert!(
                        matches!(Error::from(refused), Error::StatementRefused { .. }),
                        "{sql}"
                    );
                }
                Ok(())
            })
            .unwrap();
        assert!(!names(&engine).contains(&"undone".to_string()));
        assert_eq!(
            engine.writer_stats().aborts,
            0,
            "no transaction was abandoned"
        );
    }

    #[test]
    fn in_a_shared_batch_a_closure_ending_the_transaction_fails_only_itself() {
        // Invariant 2 within a batch: each caller's outcome matches the file,
        // whatever its neighbours try.
        let (_dir, engine) = engine();
        let rest = batch_of(
            &engine,
            vec![
                Box::new(|e: Engine| {
                    e.write(|tx| tx.execute("INSERT INTO t VALUES ('a')", []).map(|_| ()))
                }),
                Box::new(|e: Engine| insert_then(&e, "b", "COMMIT", false)),
                Box::new(|e: Engine| insert_then(&e, "c", "ROLLBACK", true)),
                Box::new(|e: Engine| {
                    e.write(|tx| {
                        tx.execute("INSERT INTO t VALUES ('d')", [])?;
                        tx.conn().execute_batch("END")?;
                        Ok(())
                    })
                }),
                Box::new(|e: Engine| {
                    e.write(|tx| tx.execute("INSERT INTO t VALUES ('e')", []).map(|_| ()))
                }),
            ],
        );
        let outcomes: Vec<bool> = rest.into_iter().map(|r| r.unwrap().is_ok()).collect();
        assert_eq!(outcomes, [true, false, true, false, true]);
        assert_eq!(names(&engine), ["a", "c", "e"]);
        assert_eq!(engine.writer_stats().aborts, 0);
    }

    #[test]
    #[should_panic(expected = "from inside a write closure")]
    fn a_nested_write_on_the_same_engine_is_a_programmer_error() {
        let (_dir, engine) = engine();
        let inner = engine.clone();
        let _ = engine.write(|_| inner.write(|_| Ok(())));
    }

    #[test]
    fn many_threads_share_commits_and_each_gets_its_own_value() {
        let (_dir, engine) = engine();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let e = engine.clone();
                std::thread::spawn(move || {
                    (0..50)
                        .map(|i| {
                            let name = format!("{t}-{i}");
                            e.write(|tx| {
                                tx.execute("INSERT INTO t VALUES (?1)", [&name])?;
                                Ok(name.clone())
                            })
                            .unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<String> = threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort();
        assert_eq!(all, names(&engine));
        assert_eq!(all.len(), 400);
    }

    /// The name a caller wrote if its write was committed, from how its
    /// call ended: `ok` is what its closure meant to return.
    fn expected_in_file(result: &std::thread::Result<crate::Result<()>>, ok: bool) -> bool {
        match result {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            // The caller's thread panicked: its closure did, or its thread
            // led a batch and failed in the writer's own code.
            Err(panic) => {
                let text = crate::base::error::panic_text(&**panic);
                ok && (text.contains("AfterCommit") || text.contains("AfterWake"))
            }
        }
    }

    #[test]
    fn a_leader_that_fails_at_any_step_leaves_every_caller_with_its_true_outcome() {
        // Invariant 2 through the writer's own failures: the batch's
        // transaction rolls back unless it committed, every member is told
        // what the file holds, the lead passes on, and the writer goes on.
        for fault in [Fault::BeforeCommit, Fault::AfterCommit, Fault::AfterWake] {
            let (_dir, engine) = engine();
            let insert = |name: &'static str,
                          arm: bool|
             -> Box<dyn FnOnce(Engine) -> crate::Result<()> + Send> {
                Box::new(move |e: Engine| {
                    e.write(move |tx| {
                        if arm {
                            faults::arm(fault);
                        }
                        tx.execute("INSERT INTO t VALUES (?1)", [name]).map(|_| ())
                    })
                })
            };
            let rest = batch_of(
                &engine,
                vec![
                    insert("a", false),
                    insert("b", true),
                    insert("c", false),
                    insert("d", false),
                ],
            );
            let committed = fault != Fault::BeforeCommit;
            let panicked = rest.iter().filter(|r| r.is_err()).count();
            assert_eq!(
                panicked, 1,
                "{fault:?}: the batch's leader, and only it, panics"
            );
            let mut want = Vec::new();
            for (r, name) in rest.iter().zip(["a", "b", "c", "d"]) {
                assert_eq!(expected_in_file(r, true), committed, "{fault:?} {name}");
                if committed {
                    want.push(name.to_string());
                }
            }
            assert_eq!(names(&engine), want, "{fault:?}");
            assert_eq!(engine.writer().queued(), 0);
            engine
                .write(|tx| tx.execute("INSERT INTO t VALUES ('after')", []).map(|_| ()))
                .unwrap();
            assert!(names(&engine).contains(&"after".to_string()), "{fault:?}");
        }
    }

    #[test]
    fn many_callers_with_random_failures_and_panics_each_get_the_outcome_the_file_holds() {
        // Invariant 2 under stress: closures that fail or panic, leaders that
        // fail in the writer's own code at random steps; every caller's
        // outcome is what the file holds, and nothing hangs.
        let (_dir, engine) = engine();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let e = engine.clone();
                std::thread::spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(t);
                    let mut out = Vec::new();
                    for i in 0..150 {
                        let name = format!("{t}-{i}");
                        let (kind, fault) = (rng.u8(..10), rng.u8(..3));
                        let n = name.clone();
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            e.write(move |tx| {
                                tx.execute("INSERT INTO t VALUES (?1)", [&n])?;
                                match kind {
                                    0 => Err(Error::invalid("x", "refused")),
                                    1 => panic!("the closure panics"),
                                    2 => {
                                        faults::arm(
                                            [
                                                Fault::BeforeCommit,
                                                Fault::AfterCommit,
                                                Fault::AfterWake,
                                            ][usize::from(fault)],
                                        );
                                        Ok(())
                                    }
                                    _ => Ok(()),
                                }
                            })
                        }));
                        out.push((name, kind != 0 && kind != 1, result));
                    }
                    out
                })
            })
            .collect();
        let mut want: Vec<String> = Vec::new();
        for t in threads {
            for (name, ok, result) in t.join().unwrap() {
                if expected_in_file(&result, ok) {
                    want.push(name);
                }
            }
        }
        want.sort();
        assert_eq!(names(&engine), want);
        assert_eq!(engine.writer().queued(), 0);
    }
}
