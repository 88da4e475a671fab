//! `Engine::stats`: counters and gauges an application can export.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cursor::{self, CursorInfo};
use crate::db::Db;
use crate::error::Result;
use crate::follow::FollowerInfo;
use crate::store::{counters, events};
use crate::writer::WriterStats;

/// A snapshot of what the file holds and what the engines did to it.
///
/// `counters` are monotonic totals kept in the file (`reflexr_counters`),
/// across processes and restarts, so any process — the `reflexr` CLI
/// included — reads the same numbers. The rest are gauges of the moment.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// The highest seq ever assigned: every event ever appended (never goes
    /// down, not even when events are pruned).
    pub events_appended: i64,
    /// Totals: `decisions`, `fired`, `errored` (rules), `runs_succeeded`,
    /// `runs_retried` (failed attempts that will be retried), `runs_dead`,
    /// `reacted`, `reaction_errors`, `deliveries`, `occurrences`. A counter
    /// that never moved is absent.
    pub counters: BTreeMap<String, i64>,
    /// Runs in each state now.
    pub runs: BTreeMap<String, i64>,
    /// Dead letters not yet resolved, by kind (`rule`, `run`, `reaction`,
    /// `follower`).
    pub dead_letters: BTreeMap<String, i64>,
    /// Every cursor with its lag.
    pub cursors: Vec<CursorStat>,
    /// Every follower with its counters (published, dead letters, stops).
    pub followers: Vec<FollowerStat>,
    /// This process's writer: commits and the writes they held.
    pub writer: WriterStat,
}

/// A cursor's position and lag.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct CursorStat {
    /// The workspace it reads.
    pub workspace: String,
    /// `app`, `rule`, `reaction` or `follower`.
    pub kind: String,
    /// The consumer.
    pub name: String,
    /// Its position.
    pub position: i64,
    /// Events of its workspace after it.
    pub lag: i64,
}

/// A follower's counters.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct FollowerStat {
    /// Its name.
    pub name: String,
    /// Envelopes published.
    pub published: i64,
    /// Envelopes dead-lettered.
    pub dead_letters: i64,
    /// Times it stopped.
    pub stops: i64,
    /// Source events after its cursor.
    pub lag: i64,
}

/// The writer's counters, for serialising.
#[derive(Debug, Clone, Copy, Serialize)]
#[non_exhaustive]
pub struct WriterStat {
    /// Transactions committed by this process.
    pub commits: u64,
    /// Callers' writes they held.
    pub writes: u64,
    /// Transactions rolled back.
    pub aborts: u64,
}

impl From<WriterStats> for WriterStat {
    fn from(w: WriterStats) -> WriterStat {
        WriterStat {
            commits: w.commits,
            writes: w.writes,
            aborts: w.aborts,
        }
    }
}

impl From<&CursorInfo> for CursorStat {
    fn from(c: &CursorInfo) -> CursorStat {
        CursorStat {
            workspace: c.workspace.clone(),
            kind: c.kind.as_str().into(),
            name: c.name.clone(),
            position: c.position,
            lag: c.lag,
        }
    }
}

impl From<&FollowerInfo> for FollowerStat {
    fn from(f: &FollowerInfo) -> FollowerStat {
        FollowerStat {
            name: f.name.clone(),
            published: f.published,
            dead_letters: f.dead_letters,
            stops: f.stops,
            lag: f.lag,
        }
    }
}

pub(crate) fn collect(db: &Db, followers: &[FollowerInfo]) -> Result<Stats> {
    db.read(|c| {
        let runs = crate::store::runs::counts(c)?.into_iter().collect();
        let dead_letters = crate::store::dead_letters::open_counts(c)?
            .into_iter()
            .collect();
        Ok(Stats {
            events_appended: events::head(c)?,
            counters: counters::all(c)?.into_iter().collect(),
            runs,
            dead_letters,
            cursors: cursor::list(c)?.iter().map(Into::into).collect(),
            followers: followers.iter().map(Into::into).collect(),
            writer: db.writer_stats().into(),
        })
    })
}
