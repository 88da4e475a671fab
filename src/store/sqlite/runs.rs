//! Statements on `reflexr_runs` (the work queue) and `reflexr_lanes`.
//!
//! A run's claim is `(claimed_by, attempt)`: every statement that completes,
//! fails, checkpoints or renews a run says both, and reports whether a row
//! changed, so an executor that lost its claim changes nothing. A claim that
//! lapsed but that nobody took over yet may still complete: the work is
//! done, and nobody else holds the run. Once another executor claims it, the
//! attempt differs and the old claim settles nothing.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::{Error, Result};

use crate::store::runs;
use crate::store::runs::*;
use crate::store::{Lanes, Runs};

/// Creates the run: the head of its lane and ready, behind an earlier run of
/// the lane and waiting, or dead. A run id already present is a no-op, and
/// so is a uniqueness key another run holds (that run's id is returned).
pub(crate) fn insert(conn: &Connection, r: &NewRun<'_>) -> Result<Inserted> {
    // An id already there: found before a lane or a key is touched; without
    // either, the insert's `ON CONFLICT (id) DO NOTHING` finds it.
    if (r.lane.is_some() || r.unique.is_some()) && exists(conn, r.id)? {
        return Ok(Inserted::Existed);
    }
    if let Some(u) = &r.unique
        && let Some(other) = holder_of_key(conn, r.action, u, r.now)?
    {
        return Ok(Inserted::Duplicate(other));
    }
    let state = if r.dead.is_some() {
        "dead"
    } else {
        match r.lane {
            Some(lane) if !enter_lane(conn, lane, r.id, r.now)? => "waiting",
            _ => "ready",
        }
    };
    let (unique_key, unique_mode) = r
        .unique
        .map_or((None, None), |u| (Some(u.key), Some(u.mode)));
    let inserted = conn
        .prepare_cached(
            "INSERT INTO reflexr_runs (id, kind, action, workspace, rule, scope, lane, \
           on_dead_letter, input, event_seq, event_id, depth, state, max_attempts, \
           backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, last_error, \
           created_at, updated_at, finished_at, priority, unique_key, unique_mode, parent, \
           flow_key, traceparent) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
           ?17, ?18, ?19, ?20, ?21, ?21, CASE WHEN ?13 = 'dead' THEN ?21 END, \
           coalesce(?22, (SELECT priority FROM reflexr_actions WHERE action = ?3), 0), \
           ?23, ?24, ?25, \
           coalesce(?26, (SELECT CASE WHEN fair = 1 OR key_path IS NOT NULL \
                                 THEN coalesce(CAST(json_extract(?9, key_path) AS TEXT), '') END \
                          FROM reflexr_actions WHERE action = ?3)), ?27) \
         ON CONFLICT (id) DO NOTHING",
        )?
        .execute(params![
            r.id,
            r.kind,
            r.action,
            r.workspace,
            r.rule,
            r.scope,
            r.dead.map_or(r.lane, |_| None),
            r.on_dead_letter,
            r.input,
            r.event_seq,
            r.event_id,
            r.depth,
            state,
            i64::from(r.retry.max_attempts),
            ms(r.retry.initial),
            ms(r.retry.max_delay),
            r.retry.factor,
            r.retry.jitter,
            r.due_at,
            r.dead.map(crate::base::limits::clip_error),
            r.now,
            r.priority,
            unique_key,
            unique_mode,
            r.parent,
            r.key,
            r.traceparent,
        ])?;
    if inserted == 0 {
        return Ok(Inserted::Existed);
    }
    if let Some(u) = r.unique.filter(|u| u.mode == "period") {
        conn.prepare_cached(
            "INSERT INTO reflexr_unique_periods (action, key, until, run_id) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (action, key) DO UPDATE SET until = excluded.until, run_id = excluded.run_id",
        )?
        .execute(params![r.action, u.key, r.now.saturating_add(u.period_ms), r.id])?;
    }
    Ok(Inserted::New)
}

/// The run that holds `u`'s key for `action` now, if one does. The unique
/// indexes (and the period table's key) are what enforce it; this finds
/// the holder to name it, inside the same write transaction.
fn holder_of_key(
    conn: &Connection,
    action: &str,
    u: &Uniq<'_>,
    now: i64,
) -> Result<Option<String>> {
    Ok(match u.mode {
        "period" => conn
            .prepare_cached(
                "SELECT run_id FROM reflexr_unique_periods WHERE action = ?1 AND key = ?2 AND until > ?3",
            )?
            .query_row(params![action, u.key, now], |r| r.get(0))
            .optional()?,
        "pending" => conn
            .prepare_cached(
                "SELECT id FROM reflexr_runs WHERE action = ?1 AND unique_key = ?2 \
                 AND unique_mode = 'pending' AND state IN ('waiting', 'ready')",
            )?
            .query_row(params![action, u.key], |r| r.get(0))
            .optional()?,
        _ => conn
            .prepare_cached(
                "SELECT id FROM reflexr_runs WHERE action = ?1 AND unique_key = ?2 \
                 AND unique_mode = 'active' \
                 AND (state = 'waiting' OR state = 'ready' OR state = 'running')",
            )?
            .query_row(params![action, u.key], |r| r.get(0))
            .optional()?,
    })
}

fn exists(conn: &Connection, id: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM reflexr_runs WHERE id = ?1")?
        .query_row([id], |_| Ok(()))
        .optional()?
        .is_some())
}

pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        ord: r.get(0)?,
        id: r.get(1)?,
        kind: r.get(2)?,
        action: r.get(3)?,
        workspace: r.get(4)?,
        rule: r.get(5)?,
        scope: r.get(6)?,
        lane: r.get(7)?,
        on_dead_letter: r.get(8)?,
        input: r.get(9)?,
        event_seq: r.get(10)?,
        event_id: r.get(11)?,
        depth: r.get(12)?,
        state: r.get(13)?,
        attempt: r.get(14)?,
        max_attempts: r.get(15)?,
        backoff_ms: r.get(16)?,
        backoff_max_ms: r.get(17)?,
        backoff_factor: r.get(18)?,
        jitter: r.get(19)?,
        due_at: r.get(20)?,
        claimed_by: r.get(21)?,
        claim_expires_at: r.get(22)?,
        checkpoint: r.get(23)?,
        last_error: r.get(24)?,
        created_at: r.get(25)?,
        updated_at: r.get(26)?,
        finished_at: r.get(27)?,
        priority: r.get(28)?,
        unique_key: r.get(29)?,
        unique_mode: r.get(30)?,
        started_at: r.get(31)?,
        cancel_requested_at: r.get(32)?,
        cancelled_by: r.get(33)?,
        cancel_reason: r.get(34)?,
        output: r.get(35)?,
        parent: r.get(36)?,
        began_seq: r.get(37)?,
        flow_key: r.get(38)?,
        traceparent: r.get(39)?,
    })
}

/// Makes a lapsed claim claimable again at once — or, if its cancellation
/// was asked for, ends it cancelled.
pub(crate) fn requeue_lapsed(conn: &Connection, ord: i64, now: i64) -> Result<Requeued> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE reflexr_runs SET \
               state = CASE WHEN cancel_requested_at IS NULL THEN 'ready' ELSE 'cancelled' END, \
               finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE ?2 END, \
               due_at = ?2, claimed_by = NULL, \
               claim_expires_at = NULL, updated_at = ?2, {YIELD_KEY}, \
               last_error = 'the claim lapsed: its executor stopped renewing it' \
             WHERE ord = ?1 AND state = 'running' AND claim_expires_at <= ?2 \
             RETURNING state"
        ))?
        .query_row(params![ord, now], |r| r.get(0))
        .optional()?;
    Ok(Requeued::from_state(changed))
}

/// The log's head that a run's first claim records (`began_seq`): the
/// last seq in the log, 0 for an empty one.
macro_rules! last_seq {
    () => {
        "SELECT coalesce(max(seq), 0) FROM reflexr_events"
    };
}

/// Claims up to `limit` ready runs at `priority` that are due and whose
/// action is in `actions` (a JSON array), oldest due first: each becomes
/// `running` under `holder` at its next attempt until `expires_at`. A range
/// of the ready runs' `(priority, due_at)` index: runs not due yet, waiting,
/// running or ended cost nothing. (`control::claim` walks the priorities that ready
/// runs have, [`ready_priorities`], usually one.)
pub(crate) fn claim_at(
    conn: &Connection,
    holder: &str,
    now: i64,
    expires_at: i64,
    limit: i64,
    actions: &str,
    priority: i64,
) -> Result<Vec<RunRow>> {
    let mut rows = conn
        .prepare_cached(&claimable_sql(limit))?
        .query_map(params![now, actions, priority], from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    claim_rows(conn, (holder, now, expires_at), &mut rows)?;
    rows.sort_unstable_by_key(|r| (r.due_at, r.ord));
    Ok(rows)
}

/// Claims `rows`, ready runs this write transaction has just read, in one
/// update by their positions (each row sought by its key, SQLite taking
/// the positions in order), and sets in each what its claim wrote, so none
/// is read again.
/// Without `RETURNING`, for which SQLite built a temporary b-tree of the
/// 40-column rows it returned; and one statement, not one a run, whose
/// start and end cost an eighth of a claim (callgrind).
fn claim_rows(
    conn: &Connection,
    (holder, now, expires_at): (&str, i64, i64),
    rows: &mut [RunRow],
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    // The log's head, which the update gives the runs claimed for the
    // first time: read once, as the one statement's subquery was.
    let head: i64 = if rows.iter().any(|r| r.began_seq.is_none()) {
        conn.prepare_cached(last_seq!())?
            .query_row([], |r| r.get(0))?
    } else {
        0
    };
    let ords: Vec<i64> = rows.iter().map(|r| r.ord).collect();
    let ords = serde_json::to_string(&ords).expect("positions encode");
    let claimed = conn
        .prepare_cached(CLAIM_LISTED)?
        .execute(params![holder, now, expires_at, ords, head])?;
    // Read as ready in this write transaction, which no other writer
    // shares: each is claimed.
    if claimed != rows.len() {
        return Err(Error::Conflict {
            kind: "run",
            reason: format!(
                "{} of the {} ready runs a claim read were still ready to claim",
                claimed,
                rows.len()
            ),
        });
    }
    for r in rows.iter_mut() {
        r.state = "running".to_string();
        r.attempt += 1;
        r.claimed_by = Some(holder.to_string());
        r.claim_expires_at = Some(expires_at);
        r.updated_at = now;
        r.started_at = Some(now);
        r.began_seq = Some(r.began_seq.unwrap_or(head));
    }
    Ok(())
}

pub(super) const READY_PRIORITIES: &str = "WITH RECURSIVE p(v) AS ( \
       SELECT (SELECT priority FROM reflexr_runs INDEXED BY reflexr_runs_due \
               WHERE state = 'ready' ORDER BY priority DESC LIMIT 1) \
       UNION ALL \
       SELECT (SELECT priority FROM reflexr_runs INDEXED BY reflexr_runs_due \
               WHERE state = 'ready' AND priority < p.v ORDER BY priority DESC LIMIT 1) \
       FROM p WHERE p.v IS NOT NULL) \
     SELECT v FROM p WHERE v IS NOT NULL";

/// The unfinished runs (waiting, ready, running) as a subquery for
/// `FROM (...)`: each state is read through its own partial index
/// (`reflexr_runs_due`, `_running`, `_at_rest`), so finished runs cost
/// nothing. Its columns: `ord, action, flow_key, state`.
pub(super) const UNFINISHED: &str = "SELECT ord, action, flow_key, state FROM reflexr_runs \
       WHERE state = 'ready' \
     UNION ALL SELECT ord, action, flow_key, state FROM reflexr_runs WHERE state = 'running' \
     UNION ALL SELECT ord, action, flow_key, state FROM reflexr_runs \
       WHERE state = 'waiting' AND state NOT IN ('ready', 'running')";

/// The term that lets SQLite read the runs neither ready nor running
/// through their partial index (`reflexr_runs_at_rest`): it must appear in
/// a query's `WHERE` as the index's `WHERE` spells it.
pub(super) const AT_REST: &str = "state NOT IN ('ready', 'running')";

/// Up to `limit` runs whose claim expired by `?1`, the oldest expiry first:
/// a seek of the running runs' index.
fn lapsed_sql(limit: i64) -> String {
    format!(
        "SELECT {COLUMNS} FROM reflexr_runs INDEXED BY reflexr_runs_running \
         WHERE state = 'running' AND claim_expires_at <= ?1 \
         ORDER BY claim_expires_at LIMIT {limit}"
    )
}

/// The runs in `?1` (`state`), oldest due first, through that state's
/// partial index: the claim's for ready runs, the running runs' own, and
/// the one of the runs at rest for the others.
fn list_sql(state: &str, limit: i64) -> String {
    let term = match state {
        "ready" => "state = 'ready'",
        "running" => "state = 'running'",
        _ => AT_REST,
    };
    format!(
        "SELECT {COLUMNS} FROM reflexr_runs WHERE state = ?1 AND {term} \
         ORDER BY due_at, ord LIMIT {limit}"
    )
}

/// How many runs there are in each state that has any, each state counted
/// through its partial index, none read from the rows.
fn counts_sql() -> String {
    format!(
        "SELECT state, n FROM ( \
           SELECT 'ready' AS state, count(*) AS n FROM reflexr_runs WHERE state = 'ready' \
           UNION ALL \
           SELECT 'running', count(*) FROM reflexr_runs WHERE state = 'running' \
           UNION ALL \
           SELECT state, count(*) FROM reflexr_runs WHERE {AT_REST} GROUP BY state) \
         WHERE n > 0 ORDER BY state"
    )
}

/// Deletes up to `limit` runs that ended well before `?1`, returning their
/// ids. `due_at <= finished_at`, so the range on `due_at` bounds the scan of
/// the runs at rest to those old enough to qualify.
fn prune_sql(limit: usize) -> String {
    format!(
        "DELETE FROM reflexr_runs WHERE ord IN \
           (SELECT ord FROM reflexr_runs \
            WHERE state IN ('succeeded', 'discarded') AND {AT_REST} AND due_at < ?1 \
              AND coalesce(finished_at, updated_at) < ?1 \
            LIMIT {limit}) \
         RETURNING id"
    )
}

/// One page of ready, due runs of a keyed `action` at `priority`, by due
/// time, after the run `after` (`(due_at, ord)`): `(ord, due_at, key)`,
/// leaving out the keys in `full` (a JSON array), for a claim that must
/// respect a keyed action's limits.
pub(crate) fn candidates(
    conn: &Connection,
    action: &str,
    now: i64,
    priority: i64,
    full: &str,
    after: (i64, i64),
    limit: usize,
) -> Result<Vec<(i64, i64, String)>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT ord, due_at, coalesce(flow_key, '') FROM reflexr_runs INDEXED BY reflexr_runs_due \
         WHERE state = 'ready' AND priority = ?3 AND due_at <= ?2 AND action = ?1 \
           AND (due_at, ord) > (?4, ?5) \
           AND coalesce(flow_key, '') NOT IN (SELECT value FROM json_each(?6)) \
         ORDER BY due_at, ord LIMIT {limit}"
    ))?;
    let rows = stmt
        .query_map(
            params![action, now, priority, after.0, after.1, full],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// Claims the runs at these positions (a JSON array), as [`claim_at`] does.
pub(crate) fn claim_ords(
    conn: &Connection,
    holder: &str,
    now: i64,
    expires_at: i64,
    ords: &str,
) -> Result<Vec<RunRow>> {
    let mut rows = conn
        .prepare_cached(&picked_sql())?
        .query_map([ords], from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    claim_rows(conn, (holder, now, expires_at), &mut rows)?;
    Ok(rows)
}

/// [`claim_ords`] of one run (a fresh run handed to an idle executor):
/// the update by its position, then its row read back. No list to search
/// and no `RETURNING`: each made SQLite build a temporary b-tree, and the
/// two cost half of what claiming one run did.
pub(crate) fn claim_ord(
    conn: &Connection,
    holder: &str,
    now: i64,
    expires_at: i64,
    ord: i64,
) -> Result<Option<RunRow>> {
    claim_one(
        conn,
        &claim_ord_sql(),
        "ord",
        (holder, now, expires_at),
        &ord,
    )
}

/// Claims the one run whose `key` column is `value` with `update` (which
/// takes `?1` holder, `?2` now, `?3` the claim's expiry, `?4` the key),
/// then reads its row back.
fn claim_one(
    conn: &Connection,
    update: &str,
    key: &str,
    (holder, now, expires_at): (&str, i64, i64),
    value: &dyn rusqlite::ToSql,
) -> Result<Option<RunRow>> {
    let claimed = conn
        .prepare_cached(update)?
        .execute(params![holder, now, expires_at, value])?;
    if claimed == 0 {
        return Ok(None);
    }
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_runs WHERE {key} = ?1"
        ))?
        .query_row([value], from_row)
        .optional()?)
}

/// [`Control::claim_fresh`](crate::store::Control::claim_fresh): the
/// update by the run's id, then its row read back (no `RETURNING`, which
/// makes SQLite build a temporary b-tree).
pub(crate) fn claim_fresh(
    conn: &Connection,
    holder: &str,
    now: i64,
    expires_at: i64,
    id: &str,
) -> Result<Option<RunRow>> {
    claim_one(
        conn,
        &claim_fresh_sql(),
        "id",
        (holder, now, expires_at),
        &id,
    )
}

/// [`claim_fresh`]'s update.
pub(crate) fn claim_fresh_sql() -> String {
    format!("UPDATE reflexr_runs SET {CLAIM_SET} WHERE id = ?4 AND +state = 'ready'")
}

/// The `SET` term for a run that ended and is made pending again (an
/// operator's retry or reset): a run that ended before its action became
/// keyed gets its key now, as the configure gave the unfinished ones, so a
/// fair claim (which reads only keyed runs) finds it.
pub(super) const KEY_AGAIN: &str = "flow_key = coalesce(flow_key, \
       (SELECT CASE WHEN a.fair = 1 OR a.key_path IS NOT NULL \
                    THEN coalesce(CAST(json_extract(reflexr_runs.input, a.key_path) AS TEXT), '') END \
        FROM reflexr_actions a WHERE a.action = reflexr_runs.action))";

/// The read of picked runs for a claim: those still ready of the positions
/// in `?1` (a JSON array), each sought by its position (the `+` keeps
/// SQLite on the primary key: with `state` indexed, it would search every
/// ready run of the queue and test each against the list).
pub(super) fn picked_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM reflexr_runs \
         WHERE ord IN (SELECT value FROM json_each(?1)) AND +state = 'ready'"
    )
}

/// [`claim_ord`]'s update.
pub(crate) fn claim_ord_sql() -> String {
    format!("UPDATE reflexr_runs SET {CLAIM_SET} WHERE ord = ?4 AND +state = 'ready'")
}

/// What a claim sets (`?1` holder, `?2` now, `?3` the claim's expiry) but
/// the log's head a run first claimed keeps (`began_seq`).
macro_rules! claimed {
    () => {
        "state = 'running', attempt = attempt + 1, \
         claimed_by = ?1, claim_expires_at = ?3, updated_at = ?2, started_at = ?2"
    };
}

/// What a claim of one run sets: [`claimed!`], and the log's head.
const CLAIM_SET: &str = concat!(
    claimed!(),
    ", began_seq = coalesce(began_seq, (",
    last_seq!(),
    "))"
);

/// [`claim_rows`]'s update of the ready runs it read (`?4`, a JSON array
/// of their positions, each sought by its key), given the log's head
/// (`?5`, read once a batch: the update looking it up itself, once a run,
/// cost 4 % more a claim).
const CLAIM_LISTED: &str = concat!(
    "UPDATE reflexr_runs SET ",
    claimed!(),
    ", began_seq = coalesce(began_seq, ?5) \
     WHERE ord IN (SELECT value FROM json_each(?4)) AND +state = 'ready'"
);

/// Of the runs at these positions (a JSON array of ords), the position and
/// id of those asked to stop: each a seek of its row by position.
pub(crate) fn cancel_requested(conn: &Connection, ords: &str) -> Result<Vec<(i64, String)>> {
    let mut stmt = conn.prepare_cached(CANCEL_REQUESTED)?;
    let rows = stmt
        .query_map([ords], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// [`cancel_requested`]'s statement: a rowid seek per position.
pub(super) const CANCEL_REQUESTED: &str = "SELECT r.ord, r.id \
     FROM json_each(?1) AS c CROSS JOIN reflexr_runs r ON r.ord = c.value \
     WHERE r.cancel_requested_at IS NOT NULL";

/// True when a run of these actions is ready and due, or a claim lapsed: the
/// cheap read an idle executor makes before it opens a write transaction.
pub(crate) fn work_due(conn: &Connection, now: i64, actions: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(WORK_DUE)?
        .query_row(params![now, actions], |r| r.get(0))?)
}

pub(super) const WORK_DUE: &str = "WITH RECURSIVE p(v) AS ( \
       SELECT (SELECT priority FROM reflexr_runs INDEXED BY reflexr_runs_due \
               WHERE state = 'ready' ORDER BY priority DESC LIMIT 1) \
       UNION ALL \
       SELECT (SELECT priority FROM reflexr_runs INDEXED BY reflexr_runs_due \
               WHERE state = 'ready' AND priority < p.v ORDER BY priority DESC LIMIT 1) \
       FROM p WHERE p.v IS NOT NULL) \
     SELECT EXISTS (SELECT 1 FROM p CROSS JOIN reflexr_runs r INDEXED BY reflexr_runs_due \
                    WHERE p.v IS NOT NULL AND r.state = 'ready' AND r.priority = p.v \
                      AND r.due_at <= ?1 AND r.action IN (SELECT value FROM json_each(?2))) \
         OR EXISTS (SELECT 1 FROM reflexr_runs INDEXED BY reflexr_runs_running \
                    WHERE state = 'running' AND claim_expires_at <= ?1)";

/// The claim's read: up to `{limit}` ready runs at `?3` (priority), due by
/// `?1`, of the actions in `?2` (a JSON array), by due time, through the
/// index that holds only ready runs, so waiting, blocked, running and
/// finished runs cost it nothing; [`claim_rows`] claims them. `{limit}` is
/// written in (see [`crate::store::events::page`] on bound limits).
fn claimable_sql(limit: i64) -> String {
    format!(
        "SELECT {COLUMNS} FROM reflexr_runs INDEXED BY reflexr_runs_due \
         WHERE state = 'ready' AND priority = ?3 AND due_at <= ?1 \
           AND action IN (SELECT value FROM json_each(?2)) \
         ORDER BY due_at LIMIT {limit}"
    )
}

/// Marks many claimed runs succeeded: `claims` are `(ord, id, attempt)`,
/// all held by `holder`, each row sought by its position and its id checked
/// in the row (a position is never another run's while the run it was is in
/// the file; one deleted by hand is not mistaken for the run that takes its
/// position). Returns the ids of those whose claims still held (and no
/// cancellation was asked for): the others are left as they were.
///
/// One statement a run, prepared once: in the process, a statement costs no
/// round trip, and one `UPDATE … FROM json_each(…) RETURNING` for the batch
/// copied each 40-column row into a temporary table before updating it,
/// and its ids into another (about a third more instructions a run).
pub(crate) fn succeed_many(
    conn: &Connection,
    holder: &str,
    claims: &[(i64, &str, i64)],
    now: i64,
) -> Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(SUCCEED_BY_ORD)?;
    let mut done = Vec::with_capacity(claims.len());
    for &(ord, id, attempt) in claims {
        if stmt.execute(params![ord, id, attempt, holder, now])? == 1 {
            done.push(id.to_string());
        }
    }
    Ok(done)
}

/// [`succeed_many`]'s statement: one run, sought by its position (the `+`
/// keeps SQLite on the row's key rather than the running runs' index).
pub(super) const SUCCEED_BY_ORD: &str = "UPDATE reflexr_runs SET state = 'succeeded', \
       finished_at = ?5, updated_at = ?5, claimed_by = NULL, claim_expires_at = NULL \
     WHERE ord = ?1 AND id = ?2 AND attempt = ?3 \
       AND +state = 'running' AND claimed_by = ?4 AND cancel_requested_at IS NULL";

/// Gives a claimed run back without counting the attempt (shutdown before
/// it started) — or, if its cancellation was asked for meanwhile, ends it
/// cancelled: it is never started again.
pub(crate) fn release(
    conn: &Connection,
    ord: i64,
    holder: &str,
    attempt: i64,
    now: i64,
) -> Result<Requeued> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE reflexr_runs SET \
               state = CASE WHEN cancel_requested_at IS NULL THEN 'ready' ELSE 'cancelled' END, \
               finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE ?4 END, \
               attempt = attempt - 1, updated_at = ?4, \
               claimed_by = NULL, claim_expires_at = NULL, {YIELD_KEY} \
             WHERE ord = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
             RETURNING state"
        ))?
        .query_row(params![ord, holder, attempt, now], |r| r.get(0))
        .optional()?;
    Ok(Requeued::from_state(changed))
}

// ----- lanes ---------------------------------------------------------------

/// Makes `id` the head of `lane` if the lane is empty; false if another run
/// is at its head.
fn enter_lane(conn: &Connection, lane: &str, id: &str, now: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "INSERT INTO reflexr_lanes (lane, head, blocked, updated_at) VALUES (?1, ?2, 0, ?3) \
             ON CONFLICT (lane) DO NOTHING",
        )?
        .execute(params![lane, id, now])?
        == 1)
}

/// The blocked lanes, most recently blocked first, at most `limit`.
pub(crate) fn blocked_lanes(conn: &Connection, limit: usize) -> Result<Vec<BlockedRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT l.lane, l.head, r.rule, r.scope, r.last_error, l.updated_at \
         FROM reflexr_lanes l INDEXED BY reflexr_lanes_blocked \
         LEFT JOIN reflexr_runs r ON r.id = l.head \
         WHERE l.blocked = 1 ORDER BY l.updated_at DESC LIMIT {limit}"
    ))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// What to look for among runs, as the store takes it.
pub(crate) struct Find<'a> {
    pub state: Option<&'a str>,
    pub action: Option<&'a str>,
    pub rule: Option<&'a str>,
    pub workspace: Option<&'a str>,
    pub scope: Option<&'a str>,
    /// A JSON path of the input and the value it must hold.
    pub input: Option<(&'a str, rusqlite::types::Value)>,
    /// Only runs before this position in the queue (newest first).
    pub before: i64,
    pub limit: usize,
    /// How many positions below `before` one call looks through.
    pub window: i64,
}

/// Runs matching `f`, newest first, found among the `f.window` positions
/// below `f.before`. Returns them and the position to go on below (None
/// when the queue's start was reached).
pub(crate) fn find(conn: &Connection, f: &Find<'_>) -> Result<(Vec<RunRow>, Option<i64>)> {
    let floor = f.before.saturating_sub(f.window).max(0);
    let (path, value) = match &f.input {
        Some((path, value)) => (Some(*path), value.clone()),
        None => (None, rusqlite::types::Value::Null),
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_runs \
         WHERE ord < ?1 AND ord >= ?2 \
           AND (?3 IS NULL OR state = ?3) AND (?4 IS NULL OR action = ?4) \
           AND (?5 IS NULL OR rule = ?5) AND (?6 IS NULL OR workspace = ?6) \
           AND (?7 IS NULL OR scope = ?7) \
           AND (?8 IS NULL OR json_extract(input, ?8) = ?9) \
         ORDER BY ord DESC LIMIT {}",
        f.limit
    ))?;
    let rows = stmt
        .query_map(
            params![
                f.before,
                floor,
                f.state,
                f.action,
                f.rule,
                f.workspace,
                f.scope,
                path,
                value
            ],
            from_row,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let next = match rows.last() {
        Some(last) if rows.len() == f.limit => Some(last.ord),
        _ => (floor > 0).then_some(floor),
    };
    Ok((rows, next))
}

/// How a JSON value compares with what `json_extract` returns.
pub(crate) fn sql_value(v: &serde_json::Value) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Integer(i64::from(*b)),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::Text(s.clone()),
        other => Value::Text(other.to_string()),
    }
}

impl Runs for Connection {
    fn hold_claim(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        Ok(self
            .prepare_cached(
                "UPDATE reflexr_runs SET updated_at = ?4 \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
                   AND cancel_requested_at IS NULL",
            )?
            .execute(params![id, holder, attempt, now])?
            == 1)
    }

    fn suspend(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        due_at: i64,
        now: i64,
    ) -> Result<Requeued> {
        let changed: Option<String> = self
            .prepare_cached(&format!(
                "UPDATE reflexr_runs SET state = 'ready', attempt = attempt - 1, due_at = ?4, \
                   updated_at = ?5, claimed_by = NULL, claim_expires_at = NULL, {YIELD_KEY} \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
                   AND cancel_requested_at IS NULL \
                 RETURNING state"
            ))?
            .query_row(params![id, holder, attempt, due_at, now], |r| r.get(0))
            .optional()?;
        Ok(Requeued::from_state(changed))
    }

    fn wake(&self, id: &str, now: i64) -> Result<bool> {
        Ok(self
            .prepare_cached(
                "UPDATE reflexr_runs SET due_at = ?2, updated_at = ?2 \
                 WHERE id = ?1 AND state = 'ready' AND due_at > ?2",
            )?
            .execute(params![id, now])?
            == 1)
    }

    fn reopen(&self, id: &str, now: i64) -> Result<bool> {
        Ok(self
            .prepare_cached(&format!(
                "UPDATE reflexr_runs SET state = 'ready', attempt = 0, due_at = ?2, \
                   updated_at = ?2, finished_at = NULL, output = NULL, last_error = NULL, \
                   claimed_by = NULL, claim_expires_at = NULL, cancel_requested_at = NULL, \
                   cancelled_by = NULL, cancel_reason = NULL, {YIELD_KEY}, {KEY_AGAIN} \
                 WHERE id = ?1 AND state IN ('ready', 'succeeded', 'dead', 'discarded', 'cancelled')"
            ))?
            .execute(params![id, now])?
            == 1)
    }

    fn set_output(&self, id: &str, holder: &str, attempt: i64, output: &str) -> Result<bool> {
        Ok(self
            .prepare_cached(
                "UPDATE reflexr_runs SET output = ?4 \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3",
            )?
            .execute(params![id, holder, attempt, output])?
            == 1)
    }

    fn children(&self, parent: &str) -> Result<Vec<String>> {
        let mut stmt = self.prepare_cached(
            "SELECT id FROM reflexr_runs INDEXED BY reflexr_runs_by_parent \
             WHERE parent = ?1 ORDER BY ord",
        )?;
        let rows = stmt
            .query_map([parent], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(rows)
    }

    fn lock_runs(&self, _ids: &[String]) -> Result<()> {
        // One writer: the transaction has every row already.
        Ok(())
    }

    fn debounce(
        &self,
        id: &str,
        input: &str,
        due_at: i64,
        max_wait_ms: Option<i64>,
        now: i64,
    ) -> Result<runs::Debounced> {
        if self
            .prepare_cached(
                "UPDATE reflexr_runs SET input = ?2, updated_at = ?5, \
                   due_at = min(?3, coalesce(created_at + ?4, ?3)) \
                 WHERE id = ?1 AND state IN ('waiting', 'ready') AND started_at IS NULL",
            )?
            .execute(params![id, input, due_at, max_wait_ms, now])?
            == 1
        {
            return Ok(runs::Debounced::Folded);
        }
        let released = self
            .prepare_cached(
                "UPDATE reflexr_runs SET unique_key = NULL, updated_at = ?2 \
                 WHERE id = ?1 AND state IN ('waiting', 'ready') AND started_at IS NOT NULL",
            )?
            .execute(params![id, now])?;
        Ok(if released == 1 {
            runs::Debounced::Released
        } else {
            runs::Debounced::Gone
        })
    }

    fn insert(&self, run: &NewRun<'_>) -> Result<runs::Inserted> {
        insert(self, run)
    }

    fn get(&self, id: &str) -> Result<Option<RunRow>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM reflexr_runs WHERE id = ?1"))?
            .query_row([id], from_row)
            .optional()?)
    }

    fn claim_at(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        limit: i64,
        actions: &[String],
        priority: i64,
    ) -> Result<Vec<RunRow>> {
        let actions = serde_json::to_string(actions).expect("a list of strings encodes");
        claim_at(self, holder, now, expires_at, limit, &actions, priority)
    }

    /// Marks a claimed run succeeded.
    fn succeed(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_runs SET state = 'succeeded', finished_at = ?4, updated_at = ?4, \
                   claimed_by = NULL, claim_expires_at = NULL \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
                   AND cancel_requested_at IS NULL",
            )?
            .execute(params![id, holder, attempt, now])?
            == 1)
    }

    /// Puts a claimed run back as ready at `due_at`, after a failed attempt.
    fn retry_later(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        due_at: i64,
        error: &str,
    ) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "UPDATE reflexr_runs SET state = 'ready', due_at = ?5, last_error = ?6, \
                   updated_at = ?4, claimed_by = NULL, claim_expires_at = NULL, {YIELD_KEY} \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
                   AND cancel_requested_at IS NULL"
            ))?
            .execute(params![
                id,
                holder,
                attempt,
                now,
                due_at,
                crate::base::limits::clip_error(error)
            ])?
            == 1)
    }

    /// Gives a claimed run up: dead.
    fn kill(&self, id: &str, holder: &str, attempt: i64, now: i64, error: &str) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_runs SET state = 'dead', last_error = ?5, finished_at = ?4, \
                   updated_at = ?4, claimed_by = NULL, claim_expires_at = NULL \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
                   AND cancel_requested_at IS NULL",
            )?
            .execute(params![
                id,
                holder,
                attempt,
                now,
                crate::base::limits::clip_error(error)
            ])?
            == 1)
    }

    /// Extends a live claim; the expiry only moves forward.
    fn renew(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        expires_at: i64,
    ) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_runs SET claim_expires_at = max(claim_expires_at, ?5) \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
                   AND claim_expires_at > ?4",
            )?
            .execute(params![id, holder, attempt, now, expires_at])?
            == 1)
    }

    /// Deletes up to `limit` runs that ended well (succeeded or discarded) before
    /// `before`. Dead runs stay until an operator resolves them.
    fn delete_finished(&self, before: i64, limit: usize) -> Result<usize> {
        let conn = self;
        // A workflow's steps go with its run.
        let gone: Vec<String> = conn
            .prepare_cached(&prune_sql(limit))?
            .query_map([before], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        crate::store::Steps::delete_steps_of(conn, &gone)?;
        Ok(gone.len())
    }

    /// Runs whose claim lapsed (the executor stopped renewing it) at `now`.
    fn lapsed(&self, now: i64, limit: i64) -> Result<Vec<RunRow>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(&lapsed_sql(limit))?;
        let rows = stmt
            .query_map(params![now], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn requeue_lapsed(&self, ord: i64, now: i64) -> Result<runs::Requeued> {
        requeue_lapsed(self, ord, now)
    }

    fn release(&self, ord: i64, holder: &str, attempt: i64, now: i64) -> Result<runs::Requeued> {
        release(self, ord, holder, attempt, now)
    }

    fn save_checkpoint(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        checkpoint: &str,
        now: i64,
    ) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_runs SET checkpoint = ?4, updated_at = ?5 \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3",
            )?
            .execute(params![id, holder, attempt, checkpoint, now])?
            == 1)
    }

    fn succeed_many(
        &self,
        holder: &str,
        claims: &[(i64, &str, i64)],
        now: i64,
    ) -> Result<Vec<String>> {
        succeed_many(self, holder, claims, now)
    }

    /// Ends a claimed run whose cancellation was asked for: cancelled, instead
    /// of what its handler said. False when the claim is not ours or no
    /// cancellation was asked.
    fn end_cancelled(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_runs SET state = 'cancelled', finished_at = ?4, updated_at = ?4, \
                   claimed_by = NULL, claim_expires_at = NULL \
                 WHERE id = ?1 AND state = 'running' AND claimed_by = ?2 AND attempt = ?3 \
                   AND cancel_requested_at IS NOT NULL",
            )?
            .execute(params![id, holder, attempt, now])?
            == 1)
    }

    /// The positions alone go to SQLite (a flat array: no element parsed
    /// twice); a row found there is one of these runs if its id is the
    /// run's (a run deleted by hand is not mistaken for the one that took
    /// its position).
    fn cancel_requested(&self, runs: &[(i64, &str)]) -> Result<Vec<String>> {
        let ords: Vec<i64> = runs.iter().map(|r| r.0).collect();
        let ords = serde_json::to_string(&ords).expect("positions encode");
        Ok(cancel_requested(self, &ords)?
            .into_iter()
            .filter(|(ord, id)| runs.iter().any(|r| r.0 == *ord && r.1 == id))
            .map(|(_, id)| id)
            .collect())
    }

    /// Runs in `state`, oldest due first, through that state's partial index
    /// (a million finished runs cost a listing of dead ones nothing); or
    /// every run, in creation order.
    fn list(&self, state: Option<&str>, limit: i64) -> Result<Vec<RunRow>> {
        let conn = self;
        let rows = match state {
            Some(state) => conn
                .prepare_cached(&list_sql(state, limit))?
                .query_map([state], from_row)?
                .collect::<rusqlite::Result<_>>()?,
            None => conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM reflexr_runs ORDER BY ord LIMIT {limit}"
                ))?
                .query_map([], from_row)?
                .collect::<rusqlite::Result<_>>()?,
        };
        Ok(rows)
    }

    /// How many runs there are in each state.
    fn counts(&self) -> Result<Vec<(String, i64)>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(&counts_sql())?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Asks a running run to stop, or cancels a pending one outright: what it
    /// was before. A run that already ended is left as it is (None).
    fn cancel(&self, id: &str, now: i64, by: &str, reason: &str) -> Result<Option<String>> {
        let conn = self;
        let Some(row) = Runs::get(conn, id)? else {
            return Ok(None);
        };
        match row.state.as_str() {
            "waiting" | "ready" => {
                conn.prepare_cached(
                    "UPDATE reflexr_runs SET state = 'cancelled', finished_at = ?2, updated_at = ?2, \
                       cancelled_by = ?3, cancel_reason = ?4 \
                     WHERE id = ?1 AND state IN ('waiting', 'ready')",
                )?
                .execute(params![
                    id,
                    now,
                    by,
                    crate::base::limits::clip_error(reason)
                ])?;
                if row.state == "ready"
                    && let Some(lane) = &row.lane
                {
                    Lanes::advance_lane(conn, lane, id, now)?;
                }
            }
            "running" => {
                conn.prepare_cached(
                    "UPDATE reflexr_runs SET cancel_requested_at = coalesce(cancel_requested_at, ?2), \
                       updated_at = ?2, cancelled_by = ?3, cancel_reason = ?4 \
                     WHERE id = ?1 AND state = 'running'",
                )?
                .execute(params![
                    id,
                    now,
                    by,
                    crate::base::limits::clip_error(reason)
                ])?;
            }
            _ => {}
        }
        Ok(Some(row.state))
    }

    /// An operator's retry of a dead run: ready again with a fresh set of
    /// attempts (or waiting, if its lane moved on to another run meanwhile).
    fn revive(&self, id: &str, lane: Option<&str>, now: i64) -> Result<bool> {
        let conn = self;
        let state = match lane {
            Some(lane) => match Lanes::lane_head(conn, lane)? {
                Some((head, _)) if head == id => {
                    Lanes::set_blocked(conn, lane, false, now)?;
                    "ready"
                }
                Some(_) => "waiting",
                None => {
                    enter_lane(conn, lane, id, now)?;
                    "ready"
                }
            },
            None => "ready",
        };
        Ok(conn
            .prepare_cached(&format!(
                "UPDATE reflexr_runs SET state = ?2, attempt = 0, due_at = ?3, updated_at = ?3, \
                   finished_at = NULL, {YIELD_KEY}, {KEY_AGAIN} \
                 WHERE id = ?1 AND state = 'dead'"
            ))?
            .execute(params![id, state, now])?
            == 1)
    }

    /// An operator's discard of a dead run.
    fn discard(&self, id: &str, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_runs SET state = 'discarded', updated_at = ?2 \
                 WHERE id = ?1 AND state = 'dead'",
            )?
            .execute(params![id, now])?
            == 1)
    }

    /// When the oldest run that is ready became due (None: none is ready).
    fn oldest_ready_due(&self) -> Result<Option<i64>> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT min(due_at) FROM reflexr_runs WHERE state = 'ready'")?
            .query_row([], |r| r.get(0))?)
    }
}

impl Lanes for Connection {
    /// The lane's head run and whether the lane is blocked.
    fn lane_head(&self, lane: &str) -> Result<Option<(String, bool)>> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT head, blocked FROM reflexr_lanes WHERE lane = ?1")?
            .query_row([lane], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    fn set_blocked(&self, lane: &str, blocked: bool, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_lanes SET blocked = ?2, updated_at = ?3 WHERE lane = ?1",
            )?
            .execute(params![lane, blocked, now])?
            == 1)
    }

    /// The run `finished` (the lane's head) ended: the lane's next waiting run
    /// becomes its head and ready, or the lane is removed when none waits.
    fn advance_lane(&self, lane: &str, finished: &str, now: i64) -> Result<()> {
        let conn = self;
        match Lanes::lane_head(conn, lane)? {
            Some((head, _)) if head == finished => {}
            // Not the head (a run revived behind another): nothing to move.
            _ => return Ok(()),
        }
        let next: Option<(i64, String)> = conn
            .prepare_cached(
                "SELECT ord, id FROM reflexr_runs WHERE lane = ?1 AND state = 'waiting' \
                 ORDER BY ord LIMIT 1",
            )?
            .query_row([lane], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match next {
            Some((ord, id)) => {
                conn.prepare_cached(
                    "UPDATE reflexr_lanes SET head = ?2, blocked = 0, updated_at = ?3 WHERE lane = ?1",
                )?
                .execute(params![lane, id, now])?;
                conn.prepare_cached(
                    "UPDATE reflexr_runs SET state = 'ready', due_at = max(due_at, ?2), \
                       updated_at = ?2 WHERE ord = ?1",
                )?
                .execute(params![ord, now])?;
            }
            None => {
                conn.prepare_cached("DELETE FROM reflexr_lanes WHERE lane = ?1")?
                    .execute([lane])?;
            }
        }
        Ok(())
    }

    /// How many lanes are blocked.
    fn blocked_count(&self) -> Result<i64> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT count(*) FROM reflexr_lanes INDEXED BY reflexr_lanes_blocked WHERE blocked = 1",
            )?
            .query_row([], |r| r.get(0))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::sqlite::plans::{plan, schema_file};

    #[test]
    fn the_claim_reads_only_ready_runs_by_index_whatever_else_the_queue_holds() {
        // Invariant: the claim's cost must not grow with waiting, blocked,
        // running, finished or not-yet-due runs. Per priority that ready
        // runs have (found by a seek each), it searches the index that holds
        // only ready runs, (priority, due_at), for due ones, in due order,
        // without sorting; so does the idle executor's check, and it finds a
        // lapsed claim with a seek of the running runs' index.
        let (_dir, conn) = schema_file();
        let p = plan(&conn, &claimable_sql(16));
        assert!(
            p.contains("USING INDEX reflexr_runs_due (priority=? AND due_at<?)"),
            "{p}"
        );
        assert!(!scans_the_table(&p), "{p}");
        assert!(!p.contains("TEMP B-TREE"), "{p}");
        // Then each run it read is claimed by its position.
        let p = plan(&conn, CLAIM_LISTED);
        assert!(p.contains("USING INTEGER PRIMARY KEY (rowid=?)"), "{p}");
        let p = plan(&conn, READY_PRIORITIES);
        assert!(p.contains("COVERING INDEX reflexr_runs_due"), "{p}");
        assert!(p.contains("reflexr_runs_due (priority<?)"), "{p}");
        assert!(!scans_the_table(&p), "{p}");
        let p = plan(&conn, WORK_DUE);
        assert!(
            p.contains("reflexr_runs_due (priority=? AND due_at<?)"),
            "{p}"
        );
        assert!(
            p.contains("COVERING INDEX reflexr_runs_running (claim_expires_at<?)"),
            "{p}"
        );
        assert!(!scans_the_table(&p), "{p}");
    }

    /// Whether a plan reads every row of the runs' table (not an index).
    fn scans_the_table(plan: &str) -> bool {
        plan.lines()
            .any(|l| l.starts_with("SCAN reflexr_runs") && !l.contains("INDEX"))
    }

    #[test]
    fn listings_counts_and_pruning_read_each_state_through_its_partial_index() {
        // Invariant: what operators and pruning read by state costs what
        // that state holds, not the whole queue: each state is in one
        // partial index (ready, running, or at rest), and the statements
        // name its condition so SQLite can use it.
        let (_dir, conn) = schema_file();
        for (state, index) in [
            ("ready", "reflexr_runs_due"),
            ("running", "reflexr_runs_running"),
            ("waiting", "reflexr_runs_at_rest (state=?)"),
            ("dead", "reflexr_runs_at_rest (state=?)"),
        ] {
            let p = plan(&conn, &list_sql(state, 10));
            assert!(p.contains(index), "{state}: {p}");
            assert!(!scans_the_table(&p), "{state}: {p}");
        }
        let p = plan(&conn, &counts_sql());
        assert!(p.contains("COVERING INDEX reflexr_runs_due"), "{p}");
        assert!(p.contains("COVERING INDEX reflexr_runs_running"), "{p}");
        assert!(p.contains("COVERING INDEX reflexr_runs_at_rest"), "{p}");
        assert!(!scans_the_table(&p), "{p}");
        let p = plan(&conn, &prune_sql(100));
        assert!(
            p.contains("reflexr_runs_at_rest (state=? AND due_at<?)"),
            "{p}"
        );
        let p = plan(&conn, &lapsed_sql(10));
        assert!(
            p.contains("reflexr_runs_running (claim_expires_at<?)"),
            "{p}"
        );
        assert!(!p.contains("TEMP B-TREE"), "{p}");
        let p = plan(
            &conn,
            &format!("SELECT ord FROM ({UNFINISHED}) WHERE action = ?1 AND flow_key IS NULL"),
        );
        assert!(p.contains("reflexr_runs_due"), "{p}");
        assert!(p.contains("reflexr_runs_running"), "{p}");
        assert!(p.contains("reflexr_runs_at_rest (state=?)"), "{p}");
        assert!(!scans_the_table(&p), "{p}");
        // The same reads, run: each state is counted once.
        let runs = |state: &str| {
            format!(
                "INSERT INTO reflexr_runs (id, kind, action, input, state, max_attempts, backoff_ms, \
               backoff_max_ms, backoff_factor, jitter, due_at, created_at, updated_at) \
             VALUES ('{state}-' || abs(random()), 'task', 'a', '{{}}', '{state}', 1, 0, 0, 1.0, 0.0, 1, 1, 1)"
            )
        };
        for state in ["waiting", "ready", "ready", "running", "dead", "succeeded"] {
            conn.execute_batch(&runs(state)).unwrap();
        }
        let counts = Runs::counts(&conn).unwrap();
        let want: Vec<(String, i64)> = [
            ("dead", 1),
            ("ready", 2),
            ("running", 1),
            ("succeeded", 1),
            ("waiting", 1),
        ]
        .into_iter()
        .map(|(s, n)| (s.to_string(), n))
        .collect();
        assert_eq!(counts, want);
        for (state, n) in &want {
            assert_eq!(
                Runs::list(&conn, Some(state), 10).unwrap().len() as i64,
                *n,
                "{state}"
            );
        }
        assert!(Runs::list(&conn, Some("cancelled"), 10).unwrap().is_empty());
    }

    #[test]
    fn picked_runs_are_claimed_and_settled_by_their_keys_and_a_fair_claim_seeks_each_key() {
        // A claim of picked positions and a settlement of plain successes
        // must go through the runs' keys, not search every ready (or
        // running) run and test it against the list; a fair claim finds each
        // key's oldest ready run with a seek of the keyed index.
        let (_dir, conn) = schema_file();
        let p = plan(&conn, &picked_sql());
        assert!(p.contains("USING INTEGER PRIMARY KEY (rowid=?)"), "{p}");
        assert!(!p.contains("reflexr_runs_due"), "{p}");
        // The settlement and the look for cancellations seek each row by
        // its position: no search of the ids' index, no temporary table.
        for sql in [SUCCEED_BY_ORD, CANCEL_REQUESTED] {
            let p = plan(&conn, sql);
            assert!(p.contains("USING INTEGER PRIMARY KEY (rowid=?)"), "{p}");
            assert!(!p.contains("autoindex"), "{p}");
            assert!(!p.contains("SCAN reflexr_runs"), "{p}");
            assert!(!p.contains("TEMP B-TREE"), "{p}");
        }
        let p = plan(&conn, super::super::control::FAIR_HEADS);
        assert!(
            p.contains("reflexr_runs_keyed (action=? AND priority=? AND flow_key>?)"),
            "{p}"
        );
        assert!(!p.contains("SCAN reflexr_runs"), "{p}");
        assert!(!p.contains("TEMP B-TREE"), "{p}");
        let p = plan(&conn, super::super::control::KEY_ORDS);
        assert!(
            p.contains("reflexr_runs_keyed (action=? AND priority=? AND flow_key=? AND due_at<?)"),
            "{p}"
        );
        assert!(!p.contains("TEMP B-TREE"), "{p}");
    }

    #[test]
    fn the_claim_is_not_prepared_again_on_every_call() {
        let (_dir, conn) = schema_file();
        for now in 0..5 {
            claim_at(&conn, "h", now, now + 10, 16, "[\"a\"]", 0).unwrap();
        }
        let stmt = conn.prepare_cached(&claimable_sql(16)).unwrap();
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }
}
