//! PostgreSQL: the change log, its seqs in commit order (the head row) (the seam's `store::events`).

use postgres::Row;
use postgres::types::Type;

use super::limit_of;
use super::{PgConn, col};
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::store::events::NewRow;
use crate::store::{Events, Inserted};

pub(super) const EVENT_COLUMNS: &str = "seq, id, workspace, type, subject, actor, occurred_at, recorded_at, \
                             causation_id, correlation_id, depth, payload";

pub(super) fn event_from(r: &Row) -> Result<Event> {
    Ok(Event {
        seq: col(r, 0)?,
        id: col(r, 1)?,
        workspace: col(r, 2)?,
        event_type: col(r, 3)?,
        subject: col(r, 4)?,
        actor: col(r, 5)?,
        occurred_at: col(r, 6)?,
        recorded_at: col(r, 7)?,
        causation_id: col(r, 8)?,
        correlation_id: col(r, 9)?,
        depth: i64::from(col::<i32>(r, 10)?),
        payload: col(r, 11)?,
        parsed: Default::default(),
    })
}

pub(super) fn events_from(rows: &[Row]) -> Result<Vec<Event>> {
    rows.iter().map(event_from).collect()
}

impl PgConn {
    /// The append's one statement: the row at the next seq, or None when
    /// the type is not registered (as the statement's snapshot sees it) or
    /// the id is there already.
    ///
    /// The seq is taken only when the type is registered (so the foreign
    /// key cannot fail: a failed statement would abort the transaction).
    /// Taking it locks the head row until commit (FOR UPDATE: a lock, not a
    /// new row version per append); a transaction that waited for the lock
    /// reads the head its holder committed (PostgreSQL re-reads a row it
    /// waited for). The head row itself is moved once, at commit
    /// ([`PgConn::finish`]); until then this transaction's own appends go on
    /// from `last_seq`.
    fn insert_once(&self, row: &NewRow<'_>, depth: i32) -> Result<Option<i64>> {
        let last = self.last_seq.get();
        let inserted = self.query_opt(
            "WITH head AS (SELECT seq FROM reflexr_head FOR UPDATE), \
                  next AS (SELECT greatest(head.seq, $12) + 1 AS seq FROM head \
                           WHERE EXISTS (SELECT 1 FROM reflexr_event_types \
                                         WHERE workspace = $1 AND type = $3)) \
             INSERT INTO reflexr_events (seq, workspace, id, type, subject, actor, occurred_at, \
               recorded_at, payload, causation_id, correlation_id, depth) \
             SELECT next.seq, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM next \
             ON CONFLICT (workspace, id) DO NOTHING \
             RETURNING seq",
            &[
                (&row.workspace, Type::TEXT),
                (&row.id, Type::TEXT),
                (&row.event_type, Type::TEXT),
                (&row.subject, Type::TEXT),
                (&row.actor, Type::TEXT),
                (&row.occurred_at, Type::INT8),
                (&row.recorded_at, Type::INT8),
                (&row.payload, Type::TEXT),
                (&row.causation_id, Type::TEXT),
                (&row.correlation_id, Type::TEXT),
                (&depth, Type::INT4),
                (&last, Type::INT8),
            ],
        )?;
        inserted.map(|r| col(&r, 0)).transpose()
    }
}

impl Events for PgConn {
    fn lock_head(&self) -> Result<()> {
        self.query("SELECT 1 FROM reflexr_head FOR UPDATE", &[])?;
        Ok(())
    }

    fn insert(&self, row: &NewRow<'_>) -> Result<Inserted> {
        let depth = i32::try_from(row.depth)
            .map_err(|_| Error::invalid("depth", "more than 2^31 causes deep"))?;
        // Twice at most: the statement checks the type's registration with
        // the snapshot it began with, before it waited for the head's lock,
        // so a type another process registered meanwhile looks missing to
        // it, and present to the look-up after it.
        for _ in 0..2 {
            if let Some(seq) = self.insert_once(row, depth)? {
                self.last_seq.set(seq);
                return Ok(Inserted::At(seq));
            }
            // Another transaction appended this id first (the core looked it
            // up before, so only a race gets here). No seq was taken.
            if Events::seq_of(self, row.workspace, row.id)?.is_some() {
                return Ok(Inserted::Existing);
            }
            let registered = self
                .query_opt(
                    "SELECT 1 FROM reflexr_event_types WHERE workspace = $1 AND type = $2",
                    &[(&row.workspace, Type::TEXT), (&row.event_type, Type::TEXT)],
                )?
                .is_some();
            if !registered {
                return Ok(Inserted::Unregistered);
            }
        }
        Err(Error::Busy {
            detail: "the event type was registered while this append ran; try again".into(),
        })
    }

    fn seq_of(&self, workspace: &str, id: &str) -> Result<Option<i64>> {
        self.query_opt(
            "SELECT seq FROM reflexr_events WHERE workspace = $1 AND id = $2",
            &[(&workspace, Type::TEXT), (&id, Type::TEXT)],
        )?
        .map(|r| col(&r, 0))
        .transpose()
    }

    fn depth_of(&self, workspace: &str, id: &str) -> Result<Option<i64>> {
        self.query_opt(
            "SELECT depth FROM reflexr_events WHERE workspace = $1 AND id = $2",
            &[(&workspace, Type::TEXT), (&id, Type::TEXT)],
        )?
        .map(|r| col::<i32>(&r, 0).map(i64::from))
        .transpose()
    }

    fn page(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        limit: usize,
    ) -> Result<Vec<Event>> {
        let limit = limit_of(limit);
        let rows = if types.is_empty() {
            self.query(
                &format!(
                    "SELECT {EVENT_COLUMNS} FROM reflexr_events \
                     WHERE workspace = $1 AND seq > $2 ORDER BY seq LIMIT $3"
                ),
                &[
                    (&workspace, Type::TEXT),
                    (&after, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )?
        } else {
            self.query(
                &format!(
                    "SELECT {EVENT_COLUMNS} FROM reflexr_events \
                     WHERE workspace = $1 AND seq > $2 AND type = ANY ($3) \
                     ORDER BY seq LIMIT $4"
                ),
                &[
                    (&workspace, Type::TEXT),
                    (&after, Type::INT8),
                    (&types, Type::TEXT_ARRAY),
                    (&limit, Type::INT8),
                ],
            )?
        };
        events_from(&rows)
    }

    fn by_subject(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: &str,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let limit = limit_of(limit);
        let rows = self.query(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM reflexr_events \
                 WHERE workspace = $1 AND seq > $2 AND subject = $3 \
                   AND (cardinality($4::text[]) = 0 OR type = ANY ($4)) \
                 ORDER BY seq LIMIT $5"
            ),
            &[
                (&workspace, Type::TEXT),
                (&after, Type::INT8),
                (&subject, Type::TEXT),
                (&types, Type::TEXT_ARRAY),
                (&limit, Type::INT8),
            ],
        )?;
        events_from(&rows)
    }

    fn get(&self, seq: i64) -> Result<Option<Event>> {
        self.query_opt(
            &format!("SELECT {EVENT_COLUMNS} FROM reflexr_events WHERE seq = $1"),
            &[(&seq, Type::INT8)],
        )?
        .as_ref()
        .map(event_from)
        .transpose()
    }

    fn by_id(&self, workspace: &str, id: &str) -> Result<Option<Event>> {
        self.query_opt(
            &format!("SELECT {EVENT_COLUMNS} FROM reflexr_events WHERE workspace = $1 AND id = $2"),
            &[(&workspace, Type::TEXT), (&id, Type::TEXT)],
        )?
        .as_ref()
        .map(event_from)
        .transpose()
    }

    fn delete_old(
        &self,
        workspace: &str,
        up_to: i64,
        recorded_before: i64,
        limit: usize,
    ) -> Result<usize> {
        let limit = limit_of(limit);
        let rows = self.query(
            "WITH gone AS (DELETE FROM reflexr_events WHERE seq IN \
               (SELECT seq FROM reflexr_events \
                WHERE workspace = $1 AND seq <= $2 AND recorded_at < $3 \
                ORDER BY seq LIMIT $4) RETURNING 1) \
             SELECT count(*) FROM gone",
            &[
                (&workspace, Type::TEXT),
                (&up_to, Type::INT8),
                (&recorded_before, Type::INT8),
                (&limit, Type::INT8),
            ],
        )?;
        let n: i64 = col(&rows[0], 0)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn count_after(&self, workspace: &str, position: i64) -> Result<i64> {
        let rows = self.query(
            "SELECT count(*) FROM reflexr_events WHERE workspace = $1 AND seq > $2",
            &[(&workspace, Type::TEXT), (&position, Type::INT8)],
        )?;
        rows.first().map_or(Ok(0), |r| col(r, 0))
    }

    fn head(&self) -> Result<i64> {
        // This transaction's own appends count before its commit moves
        // the row.
        let last = self.last_seq.get();
        let rows = self.query(
            "SELECT greatest(seq, $1) FROM reflexr_head",
            &[(&last, Type::INT8)],
        )?;
        match rows.first() {
            Some(r) => col(r, 0),
            None => Ok(0),
        }
    }
}
