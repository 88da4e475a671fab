//! The work queue: enqueueing, what a run is and what its handler gets,
//! claiming, executing and settling runs, the claims whose handlers are
//! working.

pub(crate) mod claim;
pub(crate) mod claims;
pub(crate) mod enqueue;
pub(crate) mod execute;
pub(crate) mod run;
