//! What suspended workflow runs wait for, and what wakes them: the events
//! appended to the log since the last match ([`match_waits`], the first
//! thing of each claim's transaction), and the ends of children
//! ([`child_ended`], in the transaction that ends one). See
//! `work::queue::workflow` for how waits are recorded.

use std::collections::{BTreeMap, HashSet};

use crate::base::error::Result;
use crate::base::step::EventMatch;
use crate::core::db::{Backend, Tx};
use crate::store::{Events, Runs, Steps};

/// Matches the events appended since the last match against the runs that
/// wait for them: each matched wait records its event and makes its run
/// due. The first thing of a claim's transaction; cheap when nothing waits
/// or nothing was appended (one read). How many runs it woke.
pub(crate) fn match_waits<B: Backend>(tx: &mut Tx<'_, B>) -> Result<usize> {
    if !Steps::waits_behind(tx.core())? {
        return Ok(0);
    }
    // As an append does, so no wait is recorded between the look at the
    // log and the match (PostgreSQL; SQLite's one writer has it).
    Events::lock_head(tx.core())?;
    let now = tx.now_ms();
    let head = Events::head(tx.core())?;
    let mut woke = 0;
    for (workspace, position) in Steps::wait_positions_behind(tx.core())? {
        // What this workspace's waits match by, per type: one look through
        // the index per distinct (type, by).
        let mut bys: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut at = (String::new(), String::new());
        while let Some((t, by)) = Steps::next_waited(tx.core(), &workspace, (&at.0, &at.1))? {
            bys.entry(t.clone()).or_default().push(by.clone());
            at = (t, by);
        }
        let types: Vec<String> = bys.keys().cloned().collect();
        // Waits name the types workflows read: the newest versions, whose
        // older ones upcast to them.
        let up = &tx.env().settings.upcasters;
        let Some(types) = up.stored_types(&types) else {
            Steps::set_wait_position(tx.core(), &workspace, head)?;
            continue;
        };
        let mut after = position;
        let mut taken: HashSet<(String, String)> = HashSet::new();
        'pages: loop {
            let mut page = Events::page(tx.core(), &workspace, after, &types, 500)?;
            let short = page.len() < 500;
            up.apply_all(&mut page);
            for event in &page {
                if event.seq > head {
                    break 'pages;
                }
                after = event.seq;
                for by in bys.get(&event.event_type).into_iter().flatten() {
                    let Some(key) = EventMatch::key_of(by, &event.subject, event.json()?) else {
                        continue;
                    };
                    for (run, step) in Steps::waits_for(
                        tx.core(),
                        &workspace,
                        &event.event_type,
                        by,
                        &key,
                        event.seq,
                    )? {
                        if !taken.insert((run.clone(), step.clone())) {
                            continue;
                        }
                        // A run that ended meanwhile waits for nothing.
                        let open = Runs::get(tx.core(), &run)?
                            .is_some_and(|r| r.state == "ready" || r.state == "running");
                        if !open {
                            Steps::delete_event_wait(tx.core(), &run, &step)?;
                            continue;
                        }
                        let output = serde_json::to_string(event).map_err(|e| {
                            crate::base::error::Error::Encode {
                                message: e.to_string(),
                            }
                        })?;
                        if Steps::resolve_step(tx.core(), &run, &step, &output, now)? {
                            Runs::wake(tx.core(), &run, now)?;
                            woke += 1;
                        }
                        Steps::delete_event_wait(tx.core(), &run, &step)?;
                    }
                }
            }
            if short {
                break;
            }
        }
        Steps::set_wait_position(tx.core(), &workspace, head)?;
    }
    if woke > 0 {
        tx.mark_runs();
    }
    Ok(woke)
}

/// A child run ended (succeeded, died, was cancelled): the parents that
/// wait for it are due now. In the transaction that ended it.
pub(crate) fn child_ended<B: Backend>(
    tx: &mut Tx<'_, B>,
    id: &str,
    parent: Option<&str>,
) -> Result<()> {
    let now = tx.now_ms();
    if child_ended_on(tx.core(), id, parent, now)? {
        tx.mark_runs();
    }
    Ok(())
}

/// A run ended otherwise than by its handler's success (it died, or was
/// cancelled): what it waited for is forgotten, and the parents that wait
/// for it are due now. In the transaction that ended it.
pub(crate) fn run_ended<B: Backend>(
    tx: &mut Tx<'_, B>,
    id: &str,
    parent: Option<&str>,
) -> Result<()> {
    Steps::delete_waits_of(tx.core(), id)?;
    child_ended(tx, id, parent)
}

/// [`child_ended`] on a connection (an operator's cancel).
pub(crate) fn child_ended_on<C: Steps + Runs + ?Sized>(
    conn: &C,
    id: &str,
    parent: Option<&str>,
    now: i64,
) -> Result<bool> {
    if parent.is_none() {
        return Ok(false);
    }
    let mut woke = false;
    for run in Steps::take_run_waiters(conn, id)? {
        woke |= Runs::wake(conn, &run, now)?;
    }
    Ok(woke)
}
