//! Flat combining: the one place reflexr uses `unsafe`.
//!
//! Callers [`Combiner::submit`] their work and block. If no caller is
//! leading, the submitter leads: it takes every request queued (up to
//! [`MAX_BATCH`]) as a [`Batch`], has the writer run them in one transaction,
//! and repeats until its own request has been in a batch; then it hands the
//! lead to the first caller still queued. A caller is woken once: for its
//! outcome, or to lead.
//!
//! # Why `unsafe`, and why it is sound
//!
//! A request points at its caller's closure, which lives on the caller's
//! stack and may borrow from it: the closure's lifetime is erased so the
//! leader can run it from another thread. That is sound because the closure
//! is used only while its caller is blocked in [`Combiner::submit`], and the
//! caller cannot leave `submit` — by returning or by unwinding — before its
//! request is finished:
//!
//! - a request is used only through a [`Member`] of a [`Batch`]; a member is
//!   neither `Clone` nor `Copy`, runs at most once, and is finished (its
//!   caller told the batch's outcome) when the batch is dropped — on the
//!   normal path and when the leader unwinds alike — after which nothing can
//!   reach the pointer;
//! - the caller's [`Waiter`] guard, on every exit from `submit`, either takes
//!   its request back out of the queue (nobody took it: nobody will) or waits
//!   until it is finished;
//! - the lead is handed on by a guard as well, so a leader that unwinds
//!   leaves neither the queue without a leader nor a caller waiting for ever.
//!
//! Nothing else in the crate may use `unsafe` (`#![deny(unsafe_code)]`).
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::base::error::Error;
use crate::core::db::Backend;
use crate::core::db::Tx;
use crate::core::wake::Wake;
use crate::store::Sqlite;

/// Most requests one batch (one transaction) holds.
pub(crate) const MAX_BATCH: usize = 512;

/// How a request's batch ended: committed, or the error that ended it.
pub(crate) type Ended = Result<(), Arc<Error>>;

/// What one piece of work reports to the leader: whether it succeeded (and
/// so awaits the commit), and what it made that the commit should wake
/// this process's waiting threads for.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Outcome {
    pub ok: bool,
    pub nudge: Wake,
}

/// A caller's work, as the leader runs it.
pub(crate) type Work<'a, B = Sqlite> = dyn FnMut(&mut Tx<'_, B>) -> Outcome + Send + 'a;

/// Where a caller waits: for its outcome, or for the lead.
#[derive(Default)]
struct Signal {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
enum State {
    #[default]
    Queued,
    /// Lead the next batch (the caller's request is still queued).
    Lead,
    /// The request ran (or never will) and its batch ended so.
    Finished(Ended),
}

impl Signal {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, to: State) {
        *self.lock() = to;
        self.changed.notify_one();
    }
}

/// What a caller says of its work, so a writer may run it cheaper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Any work: a savepoint of its own when it shares its batch, and on
    /// PostgreSQL the log's head taken first (it may append).
    Any,
    /// At most one change, by one statement, failing only before it or by
    /// that statement's own failure (which the database undoes), and
    /// nothing but reads after it: no savepoint of its own (see
    /// [`Member::single`]), and on PostgreSQL, alone in its batch, no
    /// transaction at all (its statement is its own). A single append.
    Single,
    /// Work that appends nothing (an enqueue, a delivery): on PostgreSQL a
    /// batch of such work alone begins without the log's head (see
    /// [`Member::may_append`]). (SQLite's one writer has no use for it.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Quiet,
}

/// A queued request: the caller's work, lifetime erased (see the module's
/// safety notes), and where the caller waits.
struct Request<B: Backend> {
    work: NonNull<Work<'static, B>>,
    signal: Arc<Signal>,
    /// What the caller said of the work.
    shape: Shape,
}

// SAFETY: `work` points at a `Send` closure; it is used by one thread at a
// time (the leader) while its owner is blocked, and the signal is `Sync`.
unsafe impl<B: Backend> Send for Request<B> {}

struct Queue<B: Backend> {
    requests: VecDeque<Request<B>>,
    /// A caller is leading (running batches, or about to hand the lead on).
    leading: bool,
}

/// The queue of one writer.
pub(crate) struct Combiner<B: Backend = Sqlite> {
    queue: Mutex<Queue<B>>,
}

/// One request in the batch being run.
pub(crate) struct Member<B: Backend = Sqlite> {
    request: Request<B>,
}

impl<B: Backend> Member<B> {
    /// Runs the caller's work (the writer runs each member once).
    pub(crate) fn run(&mut self, tx: &mut Tx<'_, B>) -> Outcome {
        // SAFETY: the owner is blocked in `submit` until this member's batch
        // is dropped (see the module's notes), so the closure is alive; the
        // leader is the only thread using it.
        let work = unsafe { self.request.work.as_mut() };
        work(tx)
    }

    /// Whether the caller said its work writes with one statement at most,
    /// and fails only before it or by its own failure (a single append):
    /// a writer may run it without a savepoint, provided it checks that a
    /// failed run changed nothing (a panic after the statement would leave
    /// its change in the transaction, which must then not commit).
    pub(crate) fn single(&self) -> bool {
        self.request.shape == Shape::Single
    }

    /// Whether the work may append: false only when its caller said it
    /// appends nothing ([`Shape::Quiet`]).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn may_append(&self) -> bool {
        self.request.shape != Shape::Quiet
    }
}

/// The requests one transaction holds. Dropping it — after the writer
/// recorded how the transaction ended with [`Batch::end`], or while the
/// leader unwinds before it could — tells every member its outcome: the one
/// recorded, or [`Error::TransactionAborted`].
pub(crate) struct Batch<B: Backend = Sqlite> {
    members: Vec<Member<B>>,
    ended: Option<Ended>,
}

impl<B: Backend> Batch<B> {
    pub(crate) fn members(&mut self) -> &mut [Member<B>] {
        &mut self.members
    }

    /// Records how the transaction ended; the members are told when the
    /// batch is dropped.
    pub(crate) fn end(&mut self, ended: Ended) {
        self.ended = Some(ended);
    }
}

impl<B: Backend> Drop for Batch<B> {
    fn drop(&mut self) {
        let ended = self.ended.take().unwrap_or_else(|| {
            Err(Arc::new(Error::TransactionAborted {
                detail: "the writer failed while running this batch; nothing of it committed"
                    .into(),
            }))
        });
        // Setting a signal cannot panic (a poisoned lock is taken as it is).
        for m in self.members.drain(..) {
            m.request.signal.set(State::Finished(ended.clone()));
        }
    }
}

impl<B: Backend> Combiner<B> {
    pub(crate) fn new() -> Combiner<B> {
        Combiner {
            queue: Mutex::new(Queue {
                requests: VecDeque::new(),
                leading: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<B>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many requests wait for a leader (for tests that build a batch).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.lock().requests.len()
    }

    /// Queues `work` and returns how its batch ended, once it has: the work
    /// ran in a transaction that committed, or the error that ended it (the
    /// work may not have run at all). Whenever this caller leads,
    /// `run_batch` runs on its thread with the batch to run.
    pub(crate) fn submit(
        &self,
        work: &mut Work<'_, B>,
        shape: Shape,
        run_batch: &mut dyn FnMut(Batch<B>),
    ) -> Ended {
        let work: NonNull<Work<'_, B>> = NonNull::from(work);
        // SAFETY: only the lifetime is erased. `waiter` (below) keeps this
        // frame from ending — by return or unwind — while the request can
        // still be reached: see the module's notes.
        let work: NonNull<Work<'static, B>> = unsafe { std::mem::transmute(work) };
        let signal = Arc::new(Signal::default());
        let lead = {
            let mut q = self.lock();
            q.requests.push_back(Request {
                work,
                signal: Arc::clone(&signal),
                shape,
            });
            !std::mem::replace(&mut q.leading, true)
        };
        let waiter = Waiter {
            combiner: self,
            signal: &signal,
        };
        if lead {
            self.lead(&signal, run_batch);
        }
        loop {
            let mut s = signal.lock();
            match std::mem::take(&mut *s) {
                State::Finished(ended) => {
                    std::mem::forget(waiter);
                    return ended;
                }
                State::Lead => {
                    drop(s);
                    self.lead(&signal, run_batch);
                }
                State::Queued => {
                    drop(
                        signal
                            .changed
                            .wait(s)
                            .unwrap_or_else(PoisonError::into_inner),
                    );
                }
            }
        }
    }

    /// Runs `f` as one caller's work and returns its value once its batch
    /// committed — or `f`'s own error, or the batch's, or `f`'s panic
    /// re-raised here. `spoilt` is asked after `f` returned Ok, in its
    /// savepoint: an error from it fails the work instead (PostgreSQL's
    /// transaction, aborted by a statement whose error `f` caught). `shape`:
    /// what the caller says of `f` (see [`Shape`]). Each
    /// writer (SQLite's, PostgreSQL's) calls this with its own `run_batch`.
    pub(crate) fn call<T, E, F>(
        &self,
        f: F,
        shape: Shape,
        spoilt: &(dyn Fn(&Tx<'_, B>) -> Option<Error> + Sync),
        run_batch: &mut dyn FnMut(Batch<B>),
    ) -> Result<T, E>
    where
        F: FnOnce(&mut Tx<'_, B>) -> Result<T, E> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        let mut f = Some(f);
        let mut slot: Option<std::thread::Result<Result<T, E>>> = None;
        let mut work = |tx: &mut Tx<'_, B>| -> Outcome {
            let Some(f) = f.take() else {
                return Outcome::default();
            };
            let mut result = catch_unwind(AssertUnwindSafe(|| f(tx)));
            if matches!(result, Ok(Ok(_)))
                && let Some(e) = tx.take_conflict().or_else(|| spoilt(tx))
            {
                result = Ok(Err(E::from(e)));
            }
            let ok = matches!(result, Ok(Ok(_)));
            slot = Some(result);
            Outcome {
                ok,
                nudge: tx.wants_nudge(),
            }
        };
        let ended = self.submit(&mut work, shape, run_batch);
        match slot {
            Some(Err(panic)) => resume_unwind(panic),
            Some(Ok(Err(e))) => Err(e),
            Some(Ok(Ok(v))) => match ended {
                Ok(()) => Ok(v),
                Err(e) => Err(E::from(Error::clone(&e))),
            },
            // The work never ran: its batch could not begin, or ended
            // before its turn.
            None => Err(E::from(match ended {
                Err(e) => Error::clone(&e),
                Ok(()) => Error::TransactionAborted {
                    detail: "the write was not run".into(),
                },
            })),
        }
    }

    /// Runs batches until the one holding `mine` has been run; the guard
    /// then hands the lead on.
    fn lead(&self, mine: &Arc<Signal>, run_batch: &mut dyn FnMut(Batch<B>)) {
        let _lead = LeadGuard {
            combiner: self,
            mine,
        };
        loop {
            let batch = {
                let mut q = self.lock();
                let n = q.requests.len().min(MAX_BATCH);
                Batch {
                    members: q
                        .requests
                        .drain(..n)
                        .map(|request| Member { request })
                        .collect(),
                    ended: None,
                }
            };
            let has_mine = batch
                .members
                .iter()
                .any(|m| Arc::ptr_eq(&m.request.signal, mine));
            run_batch(batch);
            if has_mine {
                return;
            }
        }
    }
}

/// Hands the lead to the first caller still queued (other than the leader
/// itself, which only happens when the leader unwinds), or gives it up.
struct LeadGuard<'a, B: Backend> {
    combiner: &'a Combiner<B>,
    mine: &'a Arc<Signal>,
}

impl<B: Backend> Drop for LeadGuard<'_, B> {
    fn drop(&mut self) {
        let mut q = self.combiner.lock();
        match q
            .requests
            .iter()
            .find(|r| !Arc::ptr_eq(&r.signal, self.mine))
        {
            Some(next) => next.signal.set(State::Lead),
            None => q.leading = false,
        }
    }
}

/// Runs only when `submit` is left without its outcome (an unwind): takes
/// the caller's request back out of the queue if nobody took it, and
/// otherwise waits until its batch is dropped. Either way, nothing can reach
/// the caller's closure once `submit` is left.
struct Waiter<'a, B: Backend> {
    combiner: &'a Combiner<B>,
    signal: &'a Arc<Signal>,
}

impl<B: Backend> Drop for Waiter<'_, B> {
    fn drop(&mut self) {
        {
            let mut q = self.combiner.lock();
            if let Some(i) = q
                .requests
                .iter()
                .position(|r| Arc::ptr_eq(&r.signal, self.signal))
            {
                q.requests.remove(i);
                // It may have been handed the lead: pass it on.
                if matches!(*self.signal.lock(), State::Lead) {
                    match q.requests.front() {
                        Some(next) => next.signal.set(State::Lead),
                        None => q.leading = false,
                    }
                }
                return;
            }
        }
        let mut s = self.signal.lock();
        while !matches!(*s, State::Finished(_)) {
            s = self
                .signal
                .changed
                .wait(s)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}
