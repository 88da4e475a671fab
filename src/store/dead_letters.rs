//! Statements on `reflexr_dead_letters`.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::dead_letter::{DeadLetter, DeadLetterKind, Reason, Resolution};
use crate::base::error::Result;

/// A dead letter to record.
pub struct NewDeadLetter<'a> {
    pub kind: DeadLetterKind,
    pub consumer: &'a str,
    pub workspace: Option<&'a str>,
    pub event_seq: Option<i64>,
    pub event_id: Option<&'a str>,
    pub run_id: Option<&'a str>,
    pub reason: Reason,
    pub error: &'a str,
    pub attempts: i64,
    pub now: i64,
}

/// Records it; a second dead letter for the same (consumer, event) or the
/// same open run is not recorded twice. A (consumer, event) that fails again
/// after an operator resolved its dead letter (a replay that still fails)
/// opens it again, with the new error. Returns whether it was new or opened
/// again.
pub(crate) fn insert(conn: &Connection, d: &NewDeadLetter<'_>) -> Result<bool> {
    let n = conn
        .prepare_cached(
            "INSERT INTO reflexr_dead_letters \
               (kind, consumer, workspace, event_seq, event_id, run_id, reason, error, \
                attempts, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
             ON CONFLICT (kind, consumer, workspace, event_seq) WHERE run_id IS NULL \
             DO UPDATE SET reason = excluded.reason, error = excluded.error, \
               attempts = reflexr_dead_letters.attempts + excluded.attempts, \
               created_at = excluded.created_at, resolved_at = NULL, resolution = NULL \
             WHERE reflexr_dead_letters.resolved_at IS NOT NULL \
             ON CONFLICT DO NOTHING",
        )?
        .execute(params![
            d.kind.as_str(),
            d.consumer,
            d.workspace,
            d.event_seq,
            d.event_id,
            d.run_id,
            d.reason.as_str(),
            crate::base::limits::clip_error(d.error),
            d.attempts,
            d.now
        ])?;
    Ok(n == 1)
}

const COLUMNS: &str = "id, kind, consumer, workspace, event_seq, event_id, run_id, reason, \
                       error, attempts, created_at, resolved_at, resolution";

/// A text column holding one of `T`'s values.
fn parsed<T: std::str::FromStr>(r: &Row<'_>, i: usize) -> rusqlite::Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: String = r.get(i)?;
    text.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<DeadLetter> {
    Ok(DeadLetter {
        id: r.get(0)?,
        kind: parsed(r, 1)?,
        consumer: r.get(2)?,
        workspace: r.get(3)?,
        event_seq: r.get(4)?,
        event_id: r.get(5)?,
        run_id: r.get(6)?,
        reason: Reason::from_stored(&r.get::<_, String>(7)?),
        error: r.get(8)?,
        attempts: r.get(9)?,
        created_at: r.get(10)?,
        resolved_at: r.get(11)?,
        resolution: r
            .get::<_, Option<String>>(12)?
            .map(|t| {
                t.parse::<Resolution>().map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        12,
                        rusqlite::types::Type::Text,
                        Box::new(e),
                    )
                })
            })
            .transpose()?,
    })
}

/// Open dead letters (or all, with `include_resolved`), oldest first, after
/// `after_id`.
pub(crate) fn list(
    conn: &Connection,
    include_resolved: bool,
    after_id: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_dead_letters \
         WHERE id > ?1 AND (?2 OR resolved_at IS NULL) ORDER BY id LIMIT {limit}"
    ))?;
    let rows = stmt
        .query_map(params![after_id, include_resolved], from_row)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

pub(crate) fn get(conn: &Connection, id: i64) -> Result<Option<DeadLetter>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_dead_letters WHERE id = ?1"
        ))?
        .query_row([id], from_row)
        .optional()?)
}

/// The open dead letter of a run.
pub(crate) fn open_for_run(conn: &Connection, run_id: &str) -> Result<Option<DeadLetter>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_dead_letters \
             WHERE run_id = ?1 AND resolved_at IS NULL"
        ))?
        .query_row([run_id], from_row)
        .optional()?)
}

/// Marks an open dead letter resolved; false if it was not open.
pub(crate) fn resolve(
    conn: &Connection,
    id: i64,
    resolution: Resolution,
    now: i64,
) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "UPDATE reflexr_dead_letters SET resolved_at = ?2, resolution = ?3 \
             WHERE id = ?1 AND resolved_at IS NULL",
        )?
        .execute(params![id, now, resolution.as_str()])?
        == 1)
}

/// Resolves (as retried) the open dead letter of `consumer` for the event
/// at `seq`, if there is one: the event was handled after all (a replay).
pub(crate) fn resolve_for_event(
    conn: &Connection,
    kind: DeadLetterKind,
    consumer: &str,
    workspace: &str,
    seq: i64,
    now: i64,
) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "UPDATE reflexr_dead_letters SET resolved_at = ?5, resolution = 'retried' \
             WHERE kind = ?1 AND consumer = ?2 AND workspace = ?3 AND event_seq = ?4 \
               AND run_id IS NULL AND resolved_at IS NULL",
        )?
        .execute(params![kind.as_str(), consumer, workspace, seq, now])?
        == 1)
}

/// Deletes up to `limit` dead letters an operator resolved before `before`.
pub(crate) fn delete_resolved(conn: &Connection, before: i64, limit: usize) -> Result<usize> {
    Ok(conn
        .prepare_cached(&format!(
            "DELETE FROM reflexr_dead_letters WHERE id IN \
               (SELECT id FROM reflexr_dead_letters WHERE resolved_at < ?1 LIMIT {limit})"
        ))?
        .execute([before])?)
}

/// Dead letters not yet resolved, by kind.
pub(crate) fn open_counts(conn: &Connection) -> Result<Vec<(DeadLetterKind, i64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT kind, count(*) FROM reflexr_dead_letters INDEXED BY reflexr_dead_letters_open \
         WHERE resolved_at IS NULL GROUP BY kind ORDER BY kind",
    )?;
    let rows = stmt
        .query_map([], |r| Ok((parsed(r, 0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// What to look for among dead letters, as the store takes it.
pub struct Find<'a> {
    pub kind: Option<DeadLetterKind>,
    pub consumer: Option<&'a str>,
    pub workspace: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub include_resolved: bool,
    /// Only dead letters before this id (newest first).
    pub before: i64,
    pub limit: usize,
    /// How many ids below `before` one call looks through.
    pub window: i64,
}

/// Dead letters matching `f`, newest first, among the `f.window` ids below
/// `f.before`; and the id to go on below (None at the start).
pub(crate) fn find(conn: &Connection, f: &Find<'_>) -> Result<(Vec<DeadLetter>, Option<i64>)> {
    let floor = f.before.saturating_sub(f.window).max(0);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_dead_letters \
         WHERE id < ?1 AND id >= ?2 AND (?3 OR resolved_at IS NULL) \
           AND (?4 IS NULL OR kind = ?4) AND (?5 IS NULL OR consumer = ?5) \
           AND (?6 IS NULL OR workspace = ?6) AND (?7 IS NULL OR reason = ?7) \
         ORDER BY id DESC LIMIT {}",
        f.limit
    ))?;
    let rows = stmt
        .query_map(
            params![
                f.before,
                floor,
                f.include_resolved,
                f.kind.map(DeadLetterKind::as_str),
                f.consumer,
                f.workspace,
                f.reason
            ],
            from_row,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let next = match rows.last() {
        Some(last) if rows.len() == f.limit => Some(last.id),
        _ => (floor > 0).then_some(floor),
    };
    Ok((rows, next))
}

/// One past the newest dead letter's id.
pub(crate) fn end(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT coalesce(max(id), 0) + 1 FROM reflexr_dead_letters")?
        .query_row([], |r| r.get(0))?)
}
