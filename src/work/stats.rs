//! `Engine::stats`: counters and gauges an application can export.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::base::counter::Counter;
use crate::base::dead_letter::DeadLetterKind;
use crate::base::error::Result;
use crate::core::cursor::{self, CursorInfo};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::writer::WriterStats;
use crate::store::{Counters, DeadLetters, Events, Lanes, Runs};
use crate::work::follow::FollowerInfo;
use crate::work::queue::run::RunState;

/// A snapshot of what the file holds and what the engines did to it.
///
/// `counters` are monotonic totals kept in the file (`reflexr_counters`),
/// across processes and restarts, so any process — the `reflexr` CLI
/// included — reads the same numbers. The rest are gauges of the moment.
/// Serialises to JSON with the counters, states and kinds by name.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// The highest seq ever assigned: every event ever appended (never goes
    /// down, not even when events are pruned).
    pub events_appended: i64,
    /// Totals (see [`Counter`]). A counter that never moved is absent.
    pub counters: BTreeMap<Counter, i64>,
    /// Runs in each state now.
    pub runs: BTreeMap<RunState, i64>,
    /// When the oldest ready run became due (None: none is ready); the
    /// queue's wait is `now - oldest_ready_due_at`.
    pub oldest_ready_due_at: Option<i64>,
    /// Dead letters not yet resolved, by kind.
    pub dead_letters: BTreeMap<DeadLetterKind, i64>,
    /// Scopes held behind a dead run until an operator acts
    /// ([`crate::Engine::blocked_lanes`] lists them).
    pub blocked_lanes: i64,
    /// Every cursor with its lag and failures.
    pub cursors: Vec<CursorInfo>,
    /// Every follower with its counters (published, dead letters, stops).
    pub followers: Vec<FollowerInfo>,
    /// This process's writer: commits and the writes they held.
    pub writer: WriterStats,
}

impl Stats {
    /// A counter's total (0 if it never moved).
    pub fn counter(&self, c: Counter) -> i64 {
        self.counters.get(&c).copied().unwrap_or(0)
    }
}

pub(crate) fn collect<B: Backend>(
    db: &impl CoreDb<B>,
    followers: Vec<FollowerInfo>,
) -> Result<Stats> {
    db.read_with(&mut |c| {
        let runs = Runs::counts(c)?
            .into_iter()
            .map(|(state, n)| Ok((state.parse()?, n)))
            .collect::<Result<_>>()?;
        Ok(Stats {
            events_appended: Events::head(c)?,
            counters: Counters::all(c)?.into_iter().collect(),
            runs,
            oldest_ready_due_at: Runs::oldest_ready_due(c)?,
            dead_letters: DeadLetters::open_counts(c)?.into_iter().collect(),
            blocked_lanes: Lanes::blocked_count(c)?,
            cursors: cursor::list(c)?,
            followers: followers.clone(),
            writer: db.writer_stats(),
        })
    })
}
