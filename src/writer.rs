//! The writer: one connection per engine through which every write of the
//! process goes, committing several callers' work in one transaction.
//!
//! # Why
//!
//! A durable commit costs one fsync (DESIGN.md, "Writes": ~6,100 commits/s
//! here, against ~550,000 rows/s when a thousand rows share a commit). More
//! connections do not help: SQLite has one writer. So callers share commits.
//!
//! # How (flat combining)
//!
//! A caller queues its closure and, if no caller is leading, leads. The
//! leader takes every closure queued, opens `BEGIN IMMEDIATE`, runs each in a
//! savepoint of its own (`ROLLBACK TO` it when the closure fails or panics,
//! so one caller's failure undoes only its own part), commits, and tells each
//! caller the outcome. While it commits (the fsync), new callers queue; when
//! its own closure is done, it hands the lead to the first of them, which
//! takes them all as the next batch. A follower is woken once, for its
//! outcome (or to lead) — no caller waits its turn on the connection, which
//! is where a caller-by-caller handoff spent its time on two cores.
//!
//! So a closure may run on another caller's thread: it must be `Send`. It
//! may still borrow from its caller, which stays blocked until the leader is
//! done with it. A panic in it is caught where it runs and re-raised in its
//! caller's thread.
//!
//! A closure cannot end the transaction: the connection's guard
//! ([`crate::store::conn::Guard`], SQLite's authorizer) refuses `COMMIT`,
//! `ROLLBACK`, `BEGIN`, the engine's savepoints and the pragmas the engine
//! relies on before they run, with [`Error::StatementRefused`]. Should SQLite
//! still roll the transaction back on its own (an I/O error), the whole batch
//! is abandoned: every member is told [`Error::TransactionAborted`] (or the
//! error), and nothing of it commits.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::Connection;

use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::store::conn::{Guard, retry_busy};
use crate::tx::Tx;

/// Most callers one transaction holds.
const MAX_BATCH_MEMBERS: usize = 512;

static NEXT_WRITER_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The writers this thread is inside a write of (its own, or another
    /// caller's closure it runs as leader).
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

/// How a caller's batch ended: committed, or the error that ended it.
type Ended = std::result::Result<(), Arc<Error>>;

/// A caller's closure as the leader runs it: returns whether the caller's
/// work succeeded (and so awaits the commit).
type Run<'a> = dyn FnMut(&mut Tx<'_>) -> Outcome + Send + 'a;

/// What one closure did.
#[derive(Clone, Copy)]
struct Outcome {
    ok: bool,
    nudge: bool,
}

/// Where a caller waits: for its outcome, or for the lead.
#[derive(Default)]
struct Signal {
    state: Mutex<Waiting>,
    changed: Condvar,
}

#[derive(Default)]
enum Waiting {
    #[default]
    Queued,
    /// Lead the next batch (the caller's own closure is still queued).
    Lead,
    /// The closure ran (or never will) and its batch ended so.
    Done(Ended),
}

impl Signal {
    fn set(&self, to: Waiting) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        *s = to;
        self.changed.notify_one();
    }
}

/// A queued caller. `run` points into the caller's stack: the caller stays
/// blocked in [`Writer::write`] until its signal says `Done`, and the leader
/// uses `run` only before it signals `Done`, so the pointer never outlives
/// what it points to.
struct Job {
    run: *mut Run<'static>,
    signal: Arc<Signal>,
}

// SAFETY: `run` points to a `Send` closure, used by one thread at a time (the
// leader) while its owner is blocked; the signal is `Sync`.
unsafe impl Send for Job {}

struct Queue {
    jobs: Vec<Job>,
    /// A caller is leading (running batches, or about to hand the lead on).
    leading: bool,
}

pub(crate) struct Writer {
    id: usize,
    commits: AtomicU64,
    writes: AtomicU64,
    aborts: AtomicU64,
    queue: Mutex<Queue>,
    /// Locked by the leader only.
    conn: Mutex<Connection>,
    guard: Guard,
    busy_timeout: Duration,
}

impl Writer {
    pub(crate) fn new(conn: Connection, busy_timeout: Duration) -> Result<Writer> {
        let guard = Guard::install(&conn)?;
        Ok(Writer {
            id: NEXT_WRITER_ID.fetch_add(1, Ordering::Relaxed),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            queue: Mutex::new(Queue {
                jobs: Vec::new(),
                leading: false,
            }),
            conn: Mutex::new(conn),
            guard,
            busy_timeout,
        })
    }

    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            aborts: self.aborts.load(Ordering::Relaxed),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` inside the process's shared write transaction and returns its
    /// value once the transaction has committed.
    ///
    /// # Panics
    /// When called from inside a write closure of the same engine: the closure
    /// holds the transaction the nested call would wait for. Use the [`Tx`]
    /// you were given. A panic of `f` is re-raised here, after its work was
    /// rolled back.
    pub(crate) fn write<T, E, F>(&self, shared: &Shared, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut Tx<'_>) -> std::result::Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        let _inside = Inside::enter(self.id);
        let mut f = Some(f);
        let mut slot: Option<std::thread::Result<std::result::Result<T, E>>> = None;
        let mut run = |tx: &mut Tx<'_>| -> Outcome {
            let f = f.take().expect("a caller's closure runs once");
            let result = catch_unwind(AssertUnwindSafe(|| f(tx)));
            let ok = matches!(result, Ok(Ok(_)));
            slot = Some(result);
            Outcome {
                ok,
                nudge: tx.wants_nudge(),
            }
        };
        let signal = Arc::new(Signal::default());
        let run_ptr: *mut Run<'_> = &mut run;
        // SAFETY: only the lifetime is erased; see `Job`. This function does
        // not return before the signal says `Done`, after which the leader
        // no longer uses the pointer.
        let run_ptr: *mut Run<'static> = unsafe { std::mem::transmute(run_ptr) };
        let lead = {
            let mut q = self.queue();
            q.jobs.push(Job {
                run: run_ptr,
                signal: Arc::clone(&signal),
            });
            !std::mem::replace(&mut q.leading, true)
        };
        if lead {
            self.lead(shared, &signal);
        }
        let ended = loop {
            let mut s = signal.state.lock().unwrap_or_else(PoisonError::into_inner);
            match std::mem::take(&mut *s) {
                Waiting::Done(ended) => break ended,
                Waiting::Lead => {
                    drop(s);
                    self.lead(shared, &signal);
                }
                Waiting::Queued => {
                    drop(
                        signal
                            .changed
                            .wait(s)
                            .unwrap_or_else(PoisonError::into_inner),
                    );
                }
            }
        };
        // The leader wrote `slot` (through `run`) before it signalled Done,
        // which this thread has seen under the signal's lock.
        match slot {
            Some(Err(panic)) => resume_unwind(panic),
            Some(Ok(Err(e))) => Err(e),
            Some(Ok(Ok(v))) => match ended {
                Ok(()) => Ok(v),
                Err(e) => Err(E::from(Error::clone(&e))),
            },
            // The closure never ran: its batch could not begin, or ended
            // before its turn.
            None => Err(E::from(match ended {
                Err(e) => Error::clone(&e),
                Ok(()) => Error::TransactionAborted {
                    detail: "the write was not run".into(),
                },
            })),
        }
    }

    /// Runs batches until the one holding `mine` has ended, then hands the
    /// lead to the first caller still queued (or gives it up).
    fn lead(&self, shared: &Shared, mine: &Arc<Signal>) {
        loop {
            let jobs: Vec<Job> = {
                let mut q = self.queue();
                let n = q.jobs.len().min(MAX_BATCH_MEMBERS);
                q.jobs.drain(..n).collect()
            };
            let done_mine = jobs.iter().any(|j| Arc::ptr_eq(&j.signal, mine));
            // Closures cannot panic out of run_batch (each runs under
            // catch_unwind); this guards the writer's own code, so that no
            // caller waits for ever and the lead is never left taken.
            let (ended, nudge) = catch_unwind(AssertUnwindSafe(|| self.run_batch(shared, &jobs)))
                .unwrap_or_else(|_| {
                    let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
                    let e = Error::TransactionAborted {
                        detail: "the writer failed while committing this batch".into(),
                    };
                    (self.abort(&conn, e), false)
                });
            for job in &jobs {
                job.signal.set(Waiting::Done(ended.clone()));
            }
            if nudge {
                shared.notifier.nudge();
            }
            if done_mine {
                let mut q = self.queue();
                match q.jobs.first() {
                    Some(next) => next.signal.set(Waiting::Lead),
                    None => q.leading = false,
                }
                return;
            }
        }
    }

    /// One transaction over `jobs`: each closure in a savepoint, then the
    /// commit. Returns how it ended and whether it created work to nudge for.
    fn run_batch(&self, shared: &Shared, jobs: &[Job]) -> (Ended, bool) {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let guard = &self.guard;
        if let Err(e) = retry_busy(self.busy_timeout, || {
            guard.control(&conn, "BEGIN IMMEDIATE")
        }) {
            return (Err(Arc::new(e)), false);
        }
        let (mut members, mut nudge) = (0u64, false);
        for job in jobs {
            if let Err(e) = guard.control(&conn, "SAVEPOINT reflexr_call") {
                return (self.abort(&conn, e), false);
            }
            // SAFETY: the job's caller is blocked until its signal says Done,
            // which happens after this batch; see `Job`.
            let run = unsafe { &mut *job.run };
            let mut tx = Tx::new(&conn, guard, shared);
            let outcome = run(&mut tx);
            if let Err(e) = end_savepoint(&conn, guard, outcome.ok) {
                return (self.abort(&conn, e), false);
            }
            if outcome.ok {
                members += 1;
                nudge |= outcome.nudge;
            }
        }
        match guard.control(&conn, "COMMIT") {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.writes.fetch_add(members, Ordering::Relaxed);
                (Ok(()), nudge)
            }
            Err(e) => (self.abort(&conn, e), false),
        }
    }

    /// Rolls the open transaction back (if SQLite has not already) and
    /// returns the error every member is told.
    fn abort(&self, conn: &Connection, e: Error) -> Ended {
        self.aborts.fetch_add(1, Ordering::Relaxed);
        if !conn.is_autocommit()
            && let Err(err) = self.guard.control(conn, "ROLLBACK")
        {
            log::error!("reflexr: rollback failed: {err}");
        }
        Err(Arc::new(e))
    }
}

/// Releases a caller's savepoint, rolling its work back first unless it
/// succeeded. An error here, or a transaction SQLite already ended, dooms the
/// batch.
fn end_savepoint(conn: &Connection, guard: &Guard, keep: bool) -> Result<()> {
    if conn.is_autocommit() {
        return Err(Error::TransactionAborted {
            detail: "SQLite rolled the transaction back during a write (an I/O error, \
                     or a full disk mid-statement)"
                .into(),
        });
    }
    if !keep {
        guard.control(conn, "ROLLBACK TO reflexr_call")?;
    }
    guard.control(conn, "RELEASE reflexr_call")
}

/// Marks this thread as inside a write of one writer, for as long as the
/// guard lives: the leader runs other callers' closures inside its own
/// write, so a nested write from any of them is caught.
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
    //! Group commit, driven deterministically: a first caller's closure holds
    //! the lead until the others are queued behind it (waiting on the queue's
    //! length, not on time), so the others share the next transaction.

    use std::sync::Arc;

    use crate::{Engine, Error};

    fn engine() -> (tempfile::TempDir, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path().join("w.db")).unwrap();
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
        let writer = &engine.shared.writer;
        engine
            .write(|_| {
                gate.wait();
                while writer.queue().jobs.len() < n {
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
}
