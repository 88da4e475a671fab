//! Statements on `reflexr_events`, the change log.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;
use crate::base::event::Event;

use crate::store::Events;
use crate::store::events::*;

/// Inserts the row and returns its seq. An id the workspace has already
/// fails the statement (`SQLITE_CONSTRAINT_UNIQUE`), which leaves the
/// transaction as it was: not `ON CONFLICT DO NOTHING`, whose skipped row
/// still moves AUTOINCREMENT's counter on (a gap in the log, and a head
/// that counts an event never appended); a failed statement's change to
/// `sqlite_sequence` is undone with it.
///
/// A row without a version takes the next of its subject, found by the
/// statement itself ([`INSERT`]) and handed back through
/// [`VERSION_FN`]: one statement an append, where a look-up before it
/// made two (the same two seeks, without a statement's start, binding and
/// end: a relayed event's instructions 3 % fewer).
fn insert(conn: &Connection, row: &NewRow<'_>) -> rusqlite::Result<i64> {
    // Not `RETURNING seq`: SQLite runs a RETURNING statement through a
    // statement journal and a temporary table, which halved the append rate.
    // The last rowid says the same.
    conn.prepare_cached(INSERT)?.execute(params![
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
        row.version,
        row.traceparent,
    ])?;
    Ok(conn.last_insert_rowid())
}

/// A subject's version (the workspace and the subject as the given
/// parameters): its last event's, through the index's last entry for the
/// subject; a subject pruned to nothing has its floor; else 0.
macro_rules! version_of {
    ($workspace:literal, $subject:literal) => {
        concat!(
            "coalesce((SELECT max(version) FROM reflexr_events WHERE workspace = ",
            $workspace,
            " AND subject = ",
            $subject,
            "), (SELECT version FROM reflexr_subject_floors WHERE workspace = ",
            $workspace,
            " AND subject = ",
            $subject,
            "), 0)"
        )
    };
}

/// The name of [`VERSION_FN`], for the statements' text.
macro_rules! version_fn {
    () => {
        "reflexr_version_found"
    };
}

/// The insert: a row without a version (`?12` NULL) takes one more than
/// its subject's, which [`VERSION_FN`] hands back.
const INSERT: &str = concat!(
    "INSERT INTO reflexr_events (workspace, id, type, subject, actor, occurred_at, \
     recorded_at, payload, causation_id, correlation_id, depth, version, traceparent) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, \
       coalesce(?12, ",
    version_fn!(),
    "(",
    version_of!("?1", "?4"),
    " + 1)), ?13)"
);

/// The SQL function through which an insert hands back the version it
/// found: it returns its argument and keeps it for the calling thread
/// (SQLite calls it inside `sqlite3_step`, on the thread that steps), where
/// [`Events::insert`] takes it once the statement is done. Registered on
/// the writer's connection ([`add_functions`]); not deterministic, so
/// SQLite calls it for each row, and direct-only, so no trigger or view
/// of a file's can call it.
const VERSION_FN: &str = version_fn!();

thread_local! {
    static FOUND: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
}

/// Adds the functions the statements here call to a writer's connection.
pub(super) fn add_functions(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        VERSION_FN,
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DIRECTONLY,
        |ctx| {
            let version: i64 = ctx.get(0)?;
            FOUND.set(Some(version));
            Ok(version)
        },
    )
}

/// The seq of a workspace's event by id.
const SEQ_OF: &str = "SELECT seq FROM reflexr_events WHERE workspace = ?1 AND id = ?2";
/// The depth of a workspace's event by id.
const DEPTH_OF: &str = "SELECT depth FROM reflexr_events WHERE workspace = ?1 AND id = ?2";
/// A subject's version ([`version_of`]).
const SUBJECT_VERSION: &str = concat!("SELECT ", version_of!("?1", "?2"));

pub(super) const COLUMNS: &str = "seq, id, workspace, type, subject, actor, occurred_at, recorded_at, \
                       causation_id, correlation_id, depth, payload, version, traceparent";

pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<Event> {
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
        version: r.get(12)?,
        traceparent: r.get(13)?,
        parsed: Default::default(),
    })
}

/// [`from_row`] into an event read before: each text copied into the
/// string already there, which keeps its room (a page read this way
/// allocates nothing once its strings have grown to fit), and the parse of
/// the old payload dropped.
fn refill(e: &mut Event, r: &Row<'_>) -> rusqlite::Result<()> {
    e.seq = r.get(0)?;
    set_text(&mut e.id, r, 1)?;
    set_text(&mut e.workspace, r, 2)?;
    set_text(&mut e.event_type, r, 3)?;
    set_text(&mut e.subject, r, 4)?;
    set_text(&mut e.actor, r, 5)?;
    e.occurred_at = r.get(6)?;
    e.recorded_at = r.get(7)?;
    set_optional(&mut e.causation_id, r, 8)?;
    set_optional(&mut e.correlation_id, r, 9)?;
    e.depth = r.get(10)?;
    set_text(&mut e.payload, r, 11)?;
    e.version = r.get(12)?;
    set_optional(&mut e.traceparent, r, 13)?;
    e.parsed = Default::default();
    Ok(())
}

/// Column `i`'s text, into `s`.
fn set_text(s: &mut String, r: &Row<'_>, i: usize) -> rusqlite::Result<()> {
    let v = r.get_ref(i)?;
    let text = v
        .as_str()
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, v.data_type(), Box::new(e)))?;
    s.clear();
    s.push_str(text);
    Ok(())
}

/// Column `i`'s text or NULL, into `s`.
fn set_optional(s: &mut Option<String>, r: &Row<'_>, i: usize) -> rusqlite::Result<()> {
    if r.get_ref(i)? == rusqlite::types::ValueRef::Null {
        *s = None;
        return Ok(());
    }
    set_text(s.get_or_insert_with(String::new), r, i)
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

impl Events for Connection {
    fn insert(&self, row: &NewRow<'_>) -> Result<Inserted> {
        FOUND.set(None);
        match insert(self, row) {
            Ok(seq) => {
                // The version given, or the one the statement found; read
                // back should the function not have said (it always does).
                let version = match row.version.or_else(|| FOUND.take()) {
                    Some(v) => v,
                    None => self
                        .prepare_cached("SELECT version FROM reflexr_events WHERE seq = ?1")?
                        .query_row([seq], |r| r.get(0))?,
                };
                Ok(Inserted::At { seq, version })
            }
            // The only foreign key is (workspace, type).
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY =>
            {
                Ok(Inserted::Unregistered)
            }
            // Two unique keys: the id, and the subject's version (which the
            // one writer found in the statement, so only the id conflicts
            // in practice; the look-up tells them apart).
            Err(rusqlite::Error::SqliteFailure(f, m))
                if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE =>
            {
                match Events::seq_of(self, row.workspace, row.id)? {
                    Some(seq) => Ok(Inserted::Existing { seq }),
                    None => Err(rusqlite::Error::SqliteFailure(f, m).into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    fn subject_version(&self, workspace: &str, subject: &str) -> Result<i64> {
        // The last event's version through the index's last entry for the
        // subject; a subject pruned to nothing has its floor.
        Ok(self
            .prepare_cached(SUBJECT_VERSION)?
            .query_row(params![workspace, subject], |r| r.get(0))?)
    }

    fn subject_events(
        &self,
        workspace: &str,
        subject: &str,
        from: i64,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let mut stmt = self.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_events INDEXED BY reflexr_events_by_subject \
             WHERE workspace = ?1 AND subject = ?2 AND version >= ?3 \
             ORDER BY version LIMIT {limit}"
        ))?;
        let events = stmt
            .query_map(params![workspace, subject, from], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(events)
    }

    /// The seq of the workspace's event with this id.
    fn seq_of(&self, workspace: &str, id: &str) -> Result<Option<i64>> {
        let conn = self;
        Ok(conn
            .prepare_cached(SEQ_OF)?
            .query_row(params![workspace, id], |r| r.get(0))
            .optional()?)
    }

    /// The depth of the workspace's event with this id.
    fn depth_of(&self, workspace: &str, id: &str) -> Result<Option<i64>> {
        let conn = self;
        Ok(conn
            .prepare_cached(DEPTH_OF)?
            .query_row(params![workspace, id], |r| r.get(0))
            .optional()?)
    }

    /// Up to `limit` of the workspace's events after `after`, in seq order; only
    /// those whose type is in `types` unless it is empty.
    fn page(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        limit: usize,
    ) -> Result<Vec<Event>> {
        let conn = self;
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

    fn page_into(
        &self,
        workspace: &str,
        after: i64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<()> {
        let mut stmt = self.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_events \
             WHERE workspace = ?1 AND seq > ?2 ORDER BY seq LIMIT {limit}"
        ))?;
        let mut rows = stmt.query(params![workspace, after])?;
        let mut n = 0;
        let read = loop {
            let row = match rows.next() {
                Ok(Some(row)) => row,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            let filled = match out.get_mut(n) {
                Some(event) => refill(event, row),
                None => from_row(row).map(|e| out.push(e)),
            };
            if let Err(e) = filled {
                break Err(e);
            }
            n += 1;
        };
        // A page that failed half-way is no page: nothing half-filled is
        // left for a caller to read.
        out.truncate(if read.is_ok() { n } else { 0 });
        Ok(read?)
    }

    fn by_subject(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: &str,
        limit: usize,
    ) -> Result<Vec<Event>> {
        // Through the subject's index: its events in version order, which
        // is their seq order.
        let types = serde_json::to_string(types).expect("a list of strings encodes");
        let mut stmt = self.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_events INDEXED BY reflexr_events_by_subject \
             WHERE workspace = ?1 AND subject = ?2 AND seq > ?3 \
               AND (?4 = '[]' OR type IN (SELECT value FROM json_each(?4))) \
             ORDER BY version LIMIT {limit}"
        ))?;
        let events = stmt
            .query_map(params![workspace, subject, after, types], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(events)
    }

    /// One event by seq.
    fn get(&self, seq: i64) -> Result<Option<Event>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM reflexr_events WHERE seq = ?1"
            ))?
            .query_row([seq], from_row)
            .optional()?)
    }

    /// The workspace's event with this id.
    fn by_id(&self, workspace: &str, id: &str) -> Result<Option<Event>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM reflexr_events WHERE workspace = ?1 AND id = ?2"
            ))?
            .query_row(params![workspace, id], from_row)
            .optional()?)
    }

    /// The highest seq ever assigned in the file (0 before the first append).
    /// Read from `sqlite_sequence`, so pruning does not lower it.
    fn head(&self) -> Result<i64> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'reflexr_events'")?
            .query_row([], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    /// How many of the workspace's events are after `position`.
    fn count_after(&self, workspace: &str, position: i64) -> Result<i64> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT count(*) FROM reflexr_events WHERE workspace = ?1 AND seq > ?2",
            )?
            .query_row(params![workspace, position], |r| r.get(0))?)
    }

    /// Deletes up to `limit` of the workspace's oldest events that are at or
    /// before `up_to` and were recorded before `recorded_before`. Returns how
    /// many were deleted.
    fn delete_old(
        &self,
        workspace: &str,
        up_to: i64,
        recorded_before: i64,
        limit: usize,
    ) -> Result<usize> {
        let conn = self;
        // The subjects' reached versions first, from the rows about to go
        // (the same rows: the same statement's bounds, in one transaction).
        conn.prepare_cached(&format!(
            "INSERT INTO reflexr_subject_floors (workspace, subject, version) \
             SELECT workspace, subject, max(version) FROM \
               (SELECT workspace, subject, version FROM reflexr_events \
                WHERE workspace = ?1 AND seq <= ?2 AND recorded_at < ?3 \
                ORDER BY seq LIMIT {limit}) \
             WHERE version > 0 GROUP BY workspace, subject \
             ON CONFLICT (workspace, subject) DO UPDATE \
               SET version = max(version, excluded.version)"
        ))?
        .execute(params![workspace, up_to, recorded_before])?;
        Ok(conn
            .prepare_cached(&format!(
                "DELETE FROM reflexr_events WHERE seq IN \
                   (SELECT seq FROM reflexr_events \
                    WHERE workspace = ?1 AND seq <= ?2 AND recorded_at < ?3 \
                    ORDER BY seq LIMIT {limit})"
            ))?
            .execute(params![workspace, up_to, recorded_before])?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::sqlite::plans::{plan, schema_file};

    /// Invariant 3 (once per id) and 13 (a subject's version) at a cost
    /// that does not grow with the log: an append's look-ups by id and by
    /// subject seek the id's and the subject's indexes on both of their
    /// columns (the id or the subject first, then the workspace), not a
    /// walk of a workspace's events.
    #[test]
    fn the_log_s_look_ups_by_id_and_subject_seek_their_indexes() {
        let (_dir, conn) = schema_file();
        for sql in [SEQ_OF, DEPTH_OF] {
            let p = plan(&conn, sql);
            assert!(
                p.contains("reflexr_events_by_id (id=? AND workspace=?)"),
                "{p}"
            );
        }
        // The look-up, and the insert that finds the version itself.
        for sql in [SUBJECT_VERSION, INSERT] {
            let p = plan(&conn, sql);
            assert!(
                p.contains("COVERING INDEX reflexr_events_by_subject (subject=? AND workspace=?)"),
                "{p}"
            );
            assert!(
                p.contains("reflexr_subject_floors USING PRIMARY KEY"),
                "{p}"
            );
        }
    }
}
