//! Pruning: deleting what no one needs any more (DESIGN.md, invariant 9).
//!
//! - An **event** is deleted only once every cursor on its workspace has
//!   passed it — applications', rules', reactions', followers' — and it was
//!   recorded longer ago than the retention. A workspace with no cursor at all
//!   has no one to wait for: its events go by age alone. `seq` is
//!   `AUTOINCREMENT`, so a pruned number never comes back.
//! - A **run** that succeeded or was discarded is deleted once it ended longer
//!   ago than the retention; dead runs stay until an operator resolves them.
//! - A **dead letter** an operator resolved is deleted once resolved longer ago
//!   than the retention.
//!
//! Deletes go in batches, each its own short transaction through the writer,
//! so pruning never holds the write lock for long; the bound for events (the
//! lowest cursor) is read inside each batch's transaction.

use std::time::Duration;

use crate::base::error::{Error, Result};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::store::{Control, Cursors, DeadLetters, Events, Runs, Workspaces};

/// What to keep, and for how long. `None` keeps that kind for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Events recorded longer ago than this, and passed by every cursor.
    pub events: Option<Duration>,
    /// Runs that succeeded or were discarded longer ago than this, and dead
    /// letters resolved longer ago than this.
    pub finished_work: Option<Duration>,
    /// Rows deleted per transaction.
    pub batch: usize,
}

impl Default for Retention {
    /// Nothing is pruned unless asked: both retentions `None`, batches of 1,000.
    fn default() -> Self {
        Retention {
            events: None,
            finished_work: None,
            batch: 1_000,
        }
    }
}

impl Retention {
    /// Events and finished work older than `age`.
    pub fn older_than(age: Duration) -> Retention {
        Retention {
            events: Some(age),
            finished_work: Some(age),
            ..Retention::default()
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !(1..=100_000).contains(&self.batch) {
            return Err(Error::invalid("retention batch", "must be 1 to 100000"));
        }
        Ok(())
    }
}

/// What a prune removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Pruned {
    /// Events deleted.
    pub events: u64,
    /// Finished runs deleted.
    pub runs: u64,
    /// Resolved dead letters deleted.
    pub dead_letters: u64,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Prunes what `retention` allows; `progress` sees the running totals after
/// every batch. The same on every backend.
pub(crate) fn prune<B: Backend>(
    db: &B::Db,
    retention: &Retention,
    progress: &mut dyn FnMut(Pruned),
) -> Result<Pruned> {
    retention.validate()?;
    let mut total = Pruned::default();
    let now = db.now_ms();
    prune_log(db, retention, now, &mut total, progress)?;
    if let Some(age) = retention.finished_work {
        let before = now.saturating_sub(ms(age));
        loop {
            let n = db.write_with(|tx| {
                DeadLetters::delete_resolved(tx.core(), before, retention.batch)
            })?;
            total.dead_letters += n as u64;
            progress(total);
            if n < retention.batch {
                break;
            }
        }
    }
    // The control tables' housekeeping: ended uniqueness periods, starts
    // outside every rate window.
    db.write_with(|tx| Control::sweep_control(tx.core(), now))?;
    Ok(total)
}

/// What every backend prunes: events every cursor passed and older than
/// the retention, workspace by workspace, then finished runs.
fn prune_log<B: Backend, D: CoreDb<B>>(
    db: &D,
    retention: &Retention,
    now: i64,
    total: &mut Pruned,
    progress: &mut dyn FnMut(Pruned),
) -> Result<()>
where
    B::Conn: Runs,
{
    let batch = retention.batch;
    if let Some(age) = retention.events {
        let before = now.saturating_sub(ms(age));
        let spaces = db.read_with(&mut |c| Workspaces::list(c))?;
        for (workspace, _) in spaces {
            loop {
                let n = db.write_with(|tx| -> Result<usize> {
                    // Read in the deleting transaction: no cursor can move
                    // back below it before the delete commits.
                    let up_to = Cursors::min_position(tx.core(), &workspace)?.unwrap_or(i64::MAX);
                    Events::delete_old(tx.core(), &workspace, up_to, before, batch)
                })?;
                total.events += n as u64;
                progress(*total);
                if n < batch {
                    break;
                }
            }
        }
    }
    if let Some(age) = retention.finished_work {
        let before = now.saturating_sub(ms(age));
        loop {
            let n = db.write_with(|tx| Runs::delete_finished(tx.core(), before, batch))?;
            total.runs += n as u64;
            progress(*total);
            if n < batch {
                break;
            }
        }
    }
    Ok(())
}
