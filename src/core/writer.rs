//! What every backend's writer shares: its counters ([`WriterStats`]) and
//! the guard that catches a write started from inside a write closure of
//! the same engine ([`Inside`]). SQLite's writer is `core::sqlite::writer`;
//! PostgreSQL's group commit, `core::postgres::db`.

use std::cell::RefCell;
use std::sync::atomic::AtomicUsize;

pub(crate) static NEXT_WRITER_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The writers this thread is inside a write of (its own, or another
    /// caller's closure it runs as leader).
    static INSIDE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Counters of the writer's work since the engine opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct WriterStats {
    /// Transactions committed.
    pub commits: u64,
    /// Callers' writes those transactions held (a caller whose closure failed
    /// is not counted).
    pub writes: u64,
    /// Transactions that ended in a rollback (a failed commit, SQLite ending
    /// the transaction, or the writer failing mid-batch).
    pub aborts: u64,
}

/// Marks this thread as inside a write of one writer, for as long as the
/// guard lives: the leader runs other callers' closures inside its own
/// write, so a nested write from any of them is caught.
pub(crate) struct Inside(usize);

impl Inside {
    pub(crate) fn enter(id: usize) -> Inside {
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
