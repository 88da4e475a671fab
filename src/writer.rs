//! The writer: one connection per engine through which every write of the
//! process goes, committing several callers' work in one transaction.
//!
//! # Why
//!
//! A durable commit costs one fsync (DESIGN.md, "Writes": ~6,100 commits/s
//! here, against ~550,000 rows/s when a thousand rows share a commit). More
//! connections do not help: SQLite has one writer. So callers share commits.
//!
//! # How (group commit on the callers' threads)
//!
//! A caller announces itself (`queued += 1`), takes the connection's mutex,
//! opens the batch's `BEGIN IMMEDIATE` if none is open, and runs its own
//! closure inside a savepoint (`SAVEPOINT` … `RELEASE`, or `ROLLBACK TO` when
//! the closure fails or panics, so one caller's failure undoes only its own
//! part). Then:
//!
//! - if nobody else is queued (or the batch is full, or old), it commits the
//!   batch and tells every member the outcome;
//! - otherwise it leaves the transaction open for the next caller, releases
//!   the mutex and waits for the batch's outcome.
//!
//! The closure runs on the caller's own thread, so it may borrow anything and
//! need not be `Send`, and a panic in it reaches its caller, not some writer
//! thread. While one batch commits (the fsync), the next callers queue on the
//! mutex and form the next batch, which is where the throughput comes from.
//!
//! A closure that ends the transaction itself (`COMMIT`/`ROLLBACK` through
//! [`crate::Tx::conn`]), or an error after which SQLite rolled the
//! transaction back, abandons the whole batch: every member is told
//! [`Error::TransactionAborted`], and nothing of it is committed.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::store::conn::retry_busy;
use crate::tx::Tx;

/// Most callers one transaction holds before it is committed.
const MAX_BATCH_MEMBERS: usize = 512;
/// Longest a batch stays open while callers keep arriving.
const MAX_BATCH_AGE: Duration = Duration::from_millis(20);

static NEXT_WRITER_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The writers this thread is inside a write closure of.
    static INSIDE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Counters of the writer's work since the engine opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WriterStats {
    /// Transactions committed.
    pub commits: u64,
    /// Callers' writes those transactions held (a caller whose closure failed
    /// is not counted).
    pub writes: u64,
    /// Transactions that ended in a rollback (a failed commit, or a
    /// transaction a closure ended).
    pub aborts: u64,
}

pub(crate) struct Writer {
    id: usize,
    commits: AtomicU64,
    writes: AtomicU64,
    aborts: AtomicU64,
    state: Mutex<State>,
    /// Callers that have announced themselves and not yet taken the mutex.
    queued: AtomicUsize,
    busy_timeout: Duration,
    /// [`MAX_BATCH_AGE`] in ms; tests that build a batch slowly raise it.
    max_batch_age_ms: AtomicU64,
}

struct State {
    conn: Connection,
    batch: Option<Batch>,
}

/// The open transaction and who is in it.
struct Batch {
    outcome: Arc<Outcome>,
    /// Members whose work succeeded and waits for the commit.
    members: usize,
    opened: Instant,
    nudge: bool,
}

/// How a batch ended: committed, or the error that ended it.
type Ended = std::result::Result<(), Arc<Error>>;

/// How a batch ended, for the members waiting on it.
struct Outcome {
    result: Mutex<Option<Ended>>,
    done: Condvar,
}

impl Outcome {
    fn new() -> Arc<Outcome> {
        Arc::new(Outcome {
            result: Mutex::new(None),
            done: Condvar::new(),
        })
    }

    fn set(&self, r: Ended) {
        let mut g = self.result.lock().unwrap_or_else(PoisonError::into_inner);
        if g.is_none() {
            *g = Some(r);
        }
        self.done.notify_all();
    }

    fn wait(&self) -> Ended {
        let mut g = self.result.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            g = self.done.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Every path that ends a batch sets its outcome first; this is the net
        // under them, so no member can wait forever.
        self.outcome.set(Err(Arc::new(aborted(
            "the writer dropped the transaction".into(),
        ))));
    }
}

/// Who ended a batch, and how.
enum Ending {
    Committed,
    Failed(Error),
}

impl Writer {
    pub(crate) fn new(conn: Connection, busy_timeout: Duration) -> Writer {
        Writer {
            id: NEXT_WRITER_ID.fetch_add(1, Ordering::Relaxed),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            state: Mutex::new(State { conn, batch: None }),
            queued: AtomicUsize::new(0),
            busy_timeout,
            max_batch_age_ms: AtomicU64::new(MAX_BATCH_AGE.as_millis() as u64),
        }
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
    /// you were given.
    pub(crate) fn write<T, E, F>(&self, shared: &Shared, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let _inside = Inside::enter(self.id);
        self.queued.fetch_add(1, Ordering::SeqCst);
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.queued.fetch_sub(1, Ordering::SeqCst);

        if st.batch.is_none() {
            retry_busy(self.busy_timeout, || {
                Ok(st.conn.execute_batch("BEGIN IMMEDIATE")?)
            })?;
            st.batch = Some(Batch {
                outcome: Outcome::new(),
                members: 0,
                opened: Instant::now(),
                nudge: false,
            });
        }

        let (result, nudge, step_error) = {
            let conn = &st.conn;
            match savepoint(conn) {
                Err(e) => (None, false, Some(e)),
                Ok(()) => {
                    let mut tx = Tx::new(conn, shared);
                    let result = catch_unwind(AssertUnwindSafe(|| f(&mut tx)));
                    let nudge = tx.wants_nudge();
                    let ok = matches!(result, Ok(Ok(_)));
                    let step_error = end_savepoint(conn, ok).err();
                    (Some(result), nudge, step_error)
                }
            }
        };
        let ok = matches!(result, Some(Ok(Ok(_))));

        // Did the transaction survive this caller?
        let mine: Ended = if let Some(e) = step_error {
            let (outcome, _) = self.end_batch(&mut st, Ending::Failed(e));
            drop(st);
            outcome
        } else {
            let batch = st.batch.as_mut().expect("a batch is open");
            if ok {
                batch.members += 1;
                batch.nudge |= nudge;
            }
            let must_commit = self.queued.load(Ordering::SeqCst) == 0
                || batch.members >= MAX_BATCH_MEMBERS
                || batch.opened.elapsed()
                    >= Duration::from_millis(self.max_batch_age_ms.load(Ordering::Relaxed));
            if must_commit {
                let (outcome, nudge) = self.end_batch(&mut st, Ending::Committed);
                drop(st);
                if nudge {
                    shared.notifier.nudge();
                }
                outcome
            } else {
                let outcome = Arc::clone(&batch.outcome);
                drop(st);
                if ok { outcome.wait() } else { Ok(()) }
            }
        };

        match result {
            Some(Err(panic)) => resume_unwind(panic),
            Some(Ok(Err(e))) => Err(e),
            Some(Ok(Ok(v))) => match mine {
                Ok(()) => Ok(v),
                Err(e) => Err(E::from(Error::clone(&e))),
            },
            None => match mine {
                Ok(()) => unreachable!("a failed savepoint ends the batch with its error"),
                Err(e) => Err(E::from(Error::clone(&e))),
            },
        }
    }

    /// Commits (or, after a failure, rolls back) the open batch and tells its
    /// members. Returns the outcome, and whether the committed batch created
    /// something to react to — events, runs — (so the caller nudges the
    /// waiters once it let go of the mutex).
    fn end_batch(&self, st: &mut State, ending: Ending) -> (Ended, bool) {
        let batch = st.batch.take().expect("a batch is open");
        let outcome = match ending {
            Ending::Committed => match st.conn.execute_batch("COMMIT") {
                Ok(()) => Ok(()),
                Err(e) => {
                    rollback(&st.conn);
                    Err(Arc::new(Error::from(e)))
                }
            },
            Ending::Failed(e) => {
                rollback(&st.conn);
                Err(Arc::new(e))
            }
        };
        if outcome.is_ok() {
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.writes
                .fetch_add(batch.members as u64, Ordering::Relaxed);
        } else {
            self.aborts.fetch_add(1, Ordering::Relaxed);
        }
        batch.outcome.set(outcome.clone());
        let nudge = outcome.is_ok() && batch.nudge;
        (outcome, nudge)
    }
}

fn aborted(detail: String) -> Error {
    Error::TransactionAborted { detail }
}

fn savepoint(conn: &Connection) -> Result<()> {
    conn.prepare_cached("SAVEPOINT reflexr_call")?.execute([])?;
    Ok(())
}

/// Releases the caller's savepoint, rolling its work back first unless it
/// succeeded. An error here, or a transaction SQLite already ended, dooms the
/// batch.
fn end_savepoint(conn: &Connection, keep: bool) -> Result<()> {
    if conn.is_autocommit() {
        return Err(Error::TransactionAborted {
            detail: "the transaction was ended inside a write closure \
                     (a COMMIT or ROLLBACK through Tx::conn, or an I/O error SQLite \
                     rolled back)"
                .into(),
        });
    }
    if !keep {
        conn.prepare_cached("ROLLBACK TO reflexr_call")?
            .execute([])?;
    }
    conn.prepare_cached("RELEASE reflexr_call")?.execute([])?;
    Ok(())
}

fn rollback(conn: &Connection) {
    if !conn.is_autocommit()
        && let Err(e) = conn.execute_batch("ROLLBACK")
    {
        log::error!("reflexr: rollback failed: {e}");
    }
}

/// Marks this thread as inside a write closure of one writer, for as long as
/// the guard lives.
struct Inside(usize);

impl Inside {
    fn enter(id: usize) -> Inside {
        INSIDE.with(|v| {
            let mut v = v.borrow_mut();
            assert!(
                !v.contains(&id),
                "reflexr: a write was started from inside a write closure of the same \
                 engine; use the Tx the closure was given"
            );
            v.push(id);
        });
        Inside(id)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|v| v.borrow_mut().retain(|&i| i != self.0));
    }
}

#[cfg(test)]
mod tests {
    //! Group commit, driven deterministically: the first caller's closure
    //! waits (on the writer's own queue counter, not on time) until the others
    //! are queued behind it, so all of them share one transaction.

    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use crate::{Engine, Error};

    fn engine() -> (tempfile::TempDir, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path().join("w.db")).unwrap();
        // Spawning the batch's threads may take longer than a batch may stay
        // open; these tests are about what happens inside one batch.
        engine
            .shared
            .writer
            .max_batch_age_ms
            .store(60_000, Ordering::Relaxed);
        engine
            .write(|tx| tx.execute("CREATE TABLE t (name TEXT PRIMARY KEY)", []))
            .unwrap();
        (dir, engine)
    }

    fn names(engine: &Engine) -> Vec<String> {
        engine
            .with_reader(|c| {
                let mut s = c.prepare("SELECT name FROM t ORDER BY name")?;
                let v = s
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()?;
                Ok(v)
            })
            .unwrap()
    }

    /// Runs `a` in a write whose closure holds the transaction until `others`
    /// more callers are queued, while `others` run theirs from other threads.
    fn batch_of<R: Send + 'static>(
        engine: &Engine,
        a: &'static str,
        others: Vec<Box<dyn FnOnce(Engine) -> R + Send>>,
    ) -> (crate::Result<()>, Vec<std::thread::Result<R>>) {
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
        let writer = &engine.shared.writer;
        let r = engine.write(|tx| {
            tx.execute("INSERT INTO t VALUES (?1)", [a])?;
            // Let the others go only once we hold the transaction, and wait
            // until every one of them is queued behind us.
            gate.wait();
            while writer.queued.load(Ordering::SeqCst) < n {
                std::thread::yield_now();
            }
            Ok(())
        });
        (r, handles.into_iter().map(|h| h.join()).collect())
    }

    #[test]
    fn one_callers_failure_rolls_back_only_its_own_part() {
        // Invariant 2, within a shared batch: each caller's work commits or
        // rolls back as a unit, whatever its neighbours in the batch do.
        let (_dir, engine) = engine();
        let before = engine.writer_stats();
        let (a, rest) = batch_of(
            &engine,
            "a",
            vec![
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
        a.unwrap();
        assert!(
            rest[0].as_ref().unwrap().is_err(),
            "b's own error reaches b"
        );
        assert!(rest[1].is_err(), "c's panic reaches c's thread");
        rest[2].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(names(&engine), ["a", "d"]);
        let after = engine.writer_stats();
        assert_eq!(
            after.commits - before.commits,
            1,
            "one commit for the batch"
        );
        assert_eq!(after.writes - before.writes, 2, "a and d shared it");
    }

    #[test]
    fn a_closure_that_ends_the_transaction_aborts_the_whole_batch() {
        // The batch's earlier members were told nothing yet; they must learn
        // their work did not commit, not be told it did.
        let (_dir, engine) = engine();
        let (a, rest) = batch_of(
            &engine,
            "a",
            vec![Box::new(|e: Engine| {
                e.write(|tx| {
                    tx.execute("INSERT INTO t VALUES ('b')", [])?;
                    tx.conn().execute_batch("ROLLBACK")?;
                    Ok(())
                })
            })],
        );
        assert!(matches!(a, Err(Error::TransactionAborted { .. })), "{a:?}");
        let b = rest.into_iter().next().unwrap().unwrap();
        assert!(matches!(b, Err(Error::TransactionAborted { .. })), "{b:?}");
        assert!(names(&engine).is_empty());
        // The writer is usable afterwards.
        engine
            .write(|tx| tx.execute("INSERT INTO t VALUES ('e')", []).map(|_| ()))
            .unwrap();
        assert_eq!(names(&engine), ["e"]);
    }

    #[test]
    #[should_panic(expected = "from inside a write closure")]
    fn a_nested_write_on_the_same_engine_is_a_programmer_error() {
        let (_dir, engine) = engine();
        let inner = engine.clone();
        let _ = engine.write(|_| inner.write(|_| Ok(())));
    }
}
