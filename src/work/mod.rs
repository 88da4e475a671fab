//! Layer 3, work: the consumers (rules, reactions, followers) and the work
//! queue (enqueue, claim, execute), schedules, deliveries, control of the
//! work, what operators do and look for, pruning, stats.

pub(crate) mod consumer;
pub(crate) mod control;
pub(crate) mod delivery;
pub(crate) mod evaluate;
pub(crate) mod follow;
pub(crate) mod inspect;
pub(crate) mod operate;
pub(crate) mod prune;
pub(crate) mod queue;
pub(crate) mod reaction;
pub(crate) mod rule;
pub(crate) mod schedule;
pub(crate) mod stats;
