//! Statements on `reflexr_events`, the change log.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;
use crate::base::event::Event;

/// One row to insert.
pub struct NewRow<'a> {
    pub workspace: &'a str,
    pub id: &'a str,
    pub event_type: &'a str,
    pub subject: &'a str,
    pub actor: &'a str,
    pub occurred_at: i64,
    pub recorded_at: i64,
    pub payload: &'a str,
    pub causation_id: Option<&'a str>,
    pub correlation_id: Option<&'a str>,
    pub depth: i64,
}

/// Inserts the row and returns its seq, or `None` when the workspace already
/// has an event with this id (nothing is inserted then).
pub(crate) fn insert(conn: &Connection, row: &NewRow<'_>) -> rusqlite::Result<Option<i64>> {
    // Not `RETURNING seq`: SQLite runs a RETURNING statement through a
    // statement journal and a temporary table, which halved the append rate.
    // The row count and the last rowid say the same.
    let inserted = conn
        .prepare_cached(
            "INSERT INTO reflexr_events (workspace, id, type, subject, actor, occurred_at, \
             recorded_at, payload, causation_id, correlation_id, depth) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT (workspace, id) DO NOTHING",
        )?
        .execute(params![
            row.workspace,
            row.id,
            row.event_type,
            row.subject,
            row.actor,
            row.occurred_at,
            row.recorded_at,
            row.payload,
            row.causation_id,
            row.correlation_id,
            row.depth,
        ])?;
    Ok((inserted == 1).then(|| conn.last_insert_rowid()))
}

/// The seq of the workspace's event with this id.
pub(crate) fn seq_of(conn: &Connection, workspace: &str, id: &str) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT seq FROM reflexr_events WHERE workspace = ?1 AND id = ?2")?
        .query_row(params![workspace, id], |r| r.get(0))
        .optional()?)
}

/// The depth of the workspace's event with this id.
pub(crate) fn depth_of(conn: &Connection, workspace: &str, id: &str) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT depth FROM reflexr_events WHERE workspace = ?1 AND id = ?2")?
        .query_row(params![workspace, id], |r| r.get(0))
        .optional()?)
}

const COLUMNS: &str = "seq, id, workspace, type, subject, actor, occurred_at, recorded_at, \
                       causation_id, correlation_id, depth, payload";

fn from_row(r: &Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        seq: r.get(0)?,
        id: r.get(1)?,
        workspace: r.get(2)?,
        event_type: r.get(3)?,
        subject: r.get(4)?,
        actor: r.get(5)?,
        occurred_at: r.get(6)?,
        recorded_at: r.get(7)?,
        causation_id: r.get(8)?,
        correlation_id: r.get(9)?,
        depth: r.get(10)?,
        payload: r.get(11)?,
        parsed: Default::default(),
    })
}

/// Up to `limit` of the workspace's events after `after`, in seq order; only
/// those whose type is in `types` unless it is empty.
pub(crate) fn page(
    conn: &Connection,
    workspace: &str,
    after: i64,
    types: &[String],
    limit: usize,
) -> Result<Vec<Event>> {
    // The limit is written into the statement, not bound: this SQLite build
    // (STAT4) prepares a statement again every time a bound LIMIT changes its
    // value, which cost the claim a recompilation per call. Callers use a few
    // fixed page sizes, so the statement cache still hits.
    let events = if types.is_empty() {
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_events \
             WHERE workspace = ?1 AND seq > ?2 ORDER BY seq LIMIT {limit}"
        ))?;
        stmt.query_map(params![workspace, after], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?
    } else {
        // One statement for any number of types: they travel as a JSON array.
        let types = serde_json::to_string(types).expect("a list of strings encodes");
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_events \
             WHERE workspace = ?1 AND seq > ?2 \
               AND type IN (SELECT value FROM json_each(?3)) \
             ORDER BY seq LIMIT {limit}"
        ))?;
        stmt.query_map(params![workspace, after, types], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?
    };
    Ok(events)
}

/// One event by seq.
pub(crate) fn get(conn: &Connection, seq: i64) -> Result<Option<Event>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_events WHERE seq = ?1"
        ))?
        .query_row([seq], from_row)
        .optional()?)
}

/// The highest seq ever assigned in the file (0 before the first append).
/// Read from `sqlite_sequence`, so pruning does not lower it.
pub(crate) fn head(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'reflexr_events'")?
        .query_row([], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// How many of the workspace's events are after `position`.
pub(crate) fn count_after(conn: &Connection, workspace: &str, position: i64) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT count(*) FROM reflexr_events WHERE workspace = ?1 AND seq > ?2")?
        .query_row(params![workspace, position], |r| r.get(0))?)
}

/// Deletes up to `limit` of the workspace's oldest events that are at or
/// before `up_to` and were recorded before `recorded_before`. Returns how
/// many were deleted.
pub(crate) fn delete_old(
    conn: &Connection,
    workspace: &str,
    up_to: i64,
    recorded_before: i64,
    limit: usize,
) -> Result<usize> {
    Ok(conn
        .prepare_cached(&format!(
            "DELETE FROM reflexr_events WHERE seq IN \
               (SELECT seq FROM reflexr_events \
                WHERE workspace = ?1 AND seq <= ?2 AND recorded_at < ?3 \
                ORDER BY seq LIMIT {limit})"
        ))?
        .execute(params![workspace, up_to, recorded_before])?)
}

/// The workspace's events after `after` that match `types` (any, if empty)
/// and `subject`, in seq order: at most `limit` of them, found among at most
/// `window` of the workspace's events after `after`. Returns them and the
/// seq the window reached (to go on from), or None when it reached the end
/// of the log.
pub(crate) fn scan(
    conn: &Connection,
    workspace: &str,
    after: i64,
    types: &[String],
    subject: Option<&str>,
    limit: usize,
    window: usize,
) -> Result<(Vec<Event>, Option<i64>)> {
    // The window's last seq: an index-only walk of `window` entries (none
    // for an unbounded window).
    let bound: Option<i64> = match i64::try_from(window) {
        Ok(w) if w < i64::MAX => conn
            .prepare_cached(&format!(
                "SELECT seq FROM reflexr_events WHERE workspace = ?1 AND seq > ?2 \
                 ORDER BY seq LIMIT 1 OFFSET {}",
                w.saturating_sub(1)
            ))?
            .query_row(params![workspace, after], |r| r.get(0))
            .optional()?,
        _ => None,
    };
    let types_json = serde_json::to_string(types).expect("a list of strings encodes");
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_events \
         WHERE workspace = ?1 AND seq > ?2 AND seq <= ?3 \
           AND (?4 = '[]' OR type IN (SELECT value FROM json_each(?4))) \
           AND (?5 IS NULL OR subject = ?5) \
         ORDER BY seq LIMIT {limit}"
    ))?;
    let events = stmt
        .query_map(
            params![
                workspace,
                after,
                bound.unwrap_or(i64::MAX),
                types_json,
                subject
            ],
            from_row,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let reached = match events.last() {
        Some(last) if events.len() == limit => Some(last.seq),
        _ => bound,
    };
    Ok((events, reached))
}

/// The workspace's event with this id.
pub(crate) fn by_id(conn: &Connection, workspace: &str, id: &str) -> Result<Option<Event>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_events WHERE workspace = ?1 AND id = ?2"
        ))?
        .query_row(params![workspace, id], from_row)
        .optional()?)
}

/// Events in any workspace whose id starts with `prefix` (a run's emitted
/// events: `<run id>/<key>`), through the id index of each workspace.
pub(crate) fn with_id_prefix(conn: &Connection, prefix: &str, limit: usize) -> Result<Vec<Event>> {
    // Every id with the prefix sorts between the prefix and the prefix with
    // its last byte raised by one ('/' + 1 = '0').
    let mut upper = prefix.to_string();
    let last = upper.pop().map_or(0, |c| c as u32 + 1);
    upper.push(char::from_u32(last).unwrap_or(char::MAX));
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_events \
         WHERE workspace IN (SELECT name FROM reflexr_workspaces) \
           AND id >= ?1 AND id < ?2 ORDER BY seq LIMIT {limit}"
    ))?;
    let events = stmt
        .query_map(params![prefix, upper], from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(events)
}
