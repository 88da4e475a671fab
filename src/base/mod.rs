//! Layer 0, base: values and words, no I/O — errors, the limits on names and
//! texts, time, the event envelope, retry policies, dead letters, the
//! audit's records, counters, enums stored as text.

pub(crate) mod audit;
pub(crate) mod clock;
pub(crate) mod counter;
pub(crate) mod dead_letter;
pub(crate) mod durability;
pub(crate) mod error;
pub(crate) mod event;
pub(crate) mod limits;
pub(crate) mod merge;
pub(crate) mod retry;
pub(crate) mod step;
pub(crate) mod telemetry;
pub(crate) mod text;
pub(crate) mod upcast;
