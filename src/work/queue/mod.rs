//! The work queue: enqueueing, what a run is and what its handler gets,
//! claiming (as much as the handlers' pace says an executor will start
//! soon), executing and settling runs, the claims whose handlers are
//! working, and the runs handed to idle executors at their insert.

pub(crate) mod claim;
pub(crate) mod claims;
pub(crate) mod enqueue;
pub(crate) mod execute;
pub(crate) mod handoff;
pub(crate) mod pace;
pub(crate) mod run;
pub(crate) mod waits;
pub(crate) mod workflow;
