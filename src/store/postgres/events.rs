//! PostgreSQL: the change log, its seqs in commit order (the head row) (the seam's `store::events`).

use postgres::Row;
use postgres::types::Type;

use super::limit_of;
use super::{PgConn, col};
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::store::events::NewRow;
use crate::store::{Batched, one_by_one};
use crate::store::{Events, Inserted};

pub(super) const EVENT_COLUMNS: &str = "seq, id, workspace, type, subject, actor, occurred_at, recorded_at, \
                             causation_id, correlation_id, depth, payload, version, traceparent";

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
        version: col(r, 12)?,
        traceparent: col(r, 13)?,
        parsed: Default::default(),
    })
}

pub(super) fn events_from(rows: &[Row]) -> Result<Vec<Event>> {
    rows.iter().map(event_from).collect()
}

/// A subject's version (workspace `$1`, subject `$2`): its last event's,
/// through the index's last entry — `ORDER BY … DESC LIMIT 1`, not
/// `max(version)`, which the planner aggregates over every entry of the
/// subject when the table has no statistics yet (a new table filled in one
/// transaction) — or the version a pruned subject had reached.
macro_rules! version_of {
    ($ws:literal, $subject:literal) => {
        concat!(
            "coalesce((SELECT version FROM reflexr_events WHERE workspace = ",
            $ws,
            " AND subject = ",
            $subject,
            " ORDER BY version DESC LIMIT 1), (SELECT version FROM reflexr_subject_floors \
             WHERE workspace = ",
            $ws,
            " AND subject = ",
            $subject,
            "), 0)"
        )
    };
}
const VERSION_OF_2: &str = concat!("SELECT ", version_of!("$1", "$2"));

/// The append's common expressions: the head locked, the next seq taken
/// only when the type is registered, the row inserted at it unless
/// `$on_conflict` says otherwise (see [`PgConn::insert_once`]).
macro_rules! append_ctes {
    ($on_conflict:literal) => {
        concat!(
            "WITH head AS (SELECT seq FROM reflexr_head FOR UPDATE), \
                  next AS (SELECT greatest(head.seq, $12) + 1 AS seq FROM head \
                           WHERE EXISTS (SELECT 1 FROM reflexr_event_types \
                                         WHERE workspace = $1 AND type = $3)), \
                  ins AS (INSERT INTO reflexr_events (seq, workspace, id, type, subject, actor, \
                    occurred_at, recorded_at, payload, causation_id, correlation_id, depth, version, \
                    traceparent) \
                  SELECT next.seq, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, coalesce($13, ",
            version_of!("$1", "$4"),
            " + 1), $14 FROM next ",
            $on_conflict,
            " RETURNING seq, version)"
        )
    };
}

/// The append's statement in a transaction (see [`PgConn::insert_once`]).
const INSERT: &str = concat!(
    append_ctes!("ON CONFLICT (workspace, id) DO NOTHING"),
    " SELECT seq, version FROM ins"
);

/// A lone append's statement, its own transaction (see
/// [`PgConn::insert_alone`]): the append's, the head moved to the seq it
/// took and the notification `$15, $16` sent, both only if it inserted. Any
/// unique key it meets inserts nothing: its id, or its subject's version
/// taken by an append committed after the statement's snapshot.
const INSERT_ALONE: &str = concat!(
    append_ctes!("ON CONFLICT DO NOTHING"),
    ", moved AS (UPDATE reflexr_head SET seq = ins.seq FROM ins) \
     SELECT ins.seq, ins.version, pg_notify($15, $16) FROM ins"
);

/// Appends of one workspace in one statement ([`Events::insert_all`]),
/// in a transaction that holds the head: `$1` the workspace, `$2` the last
/// seq the transaction took (0: none), `$3`–`$13` the rows' columns as
/// arrays in order. The ids there already (found through the ids' index,
/// the array passed as a subquery's value as a batch of runs passes its
/// positions; a unit test pins the plan on a log never analysed) and the
/// rows whose type the workspace has not registered insert nothing; the
/// rest take the seqs after the head in order, with no gap, and each the
/// next version of its subject (rows of one subject in order). No other
/// transaction can append while this one holds the head, so no insert
/// meets an id: nothing to do on a conflict. Returns the inserted rows'
/// ids with their seqs and versions, and the ids found there with their
/// seqs (a null version).
pub(in crate::store) const INSERT_ALL: &str = concat!(
    "WITH head AS (SELECT seq FROM reflexr_head FOR UPDATE), \
          rows AS (SELECT * FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], \
                     $7::bigint[], $8::bigint[], $9::text[], $10::text[], $11::text[], \
                     $12::int[], $13::text[]) \
                   WITH ORDINALITY AS r (id, type, subject, actor, occurred_at, recorded_at, \
                     payload, causation_id, correlation_id, depth, traceparent, ord)), \
          there AS (SELECT id, seq FROM reflexr_events \
                    WHERE workspace = $1 AND id = ANY ((SELECT $3::text[])::text[])), \
          fresh AS (SELECT r.*, row_number() OVER (ORDER BY r.ord) AS n FROM rows r \
                    WHERE r.id NOT IN (SELECT id FROM there) \
                      AND EXISTS (SELECT 1 FROM reflexr_event_types \
                                  WHERE workspace = $1 AND type = r.type)), \
          ins AS (INSERT INTO reflexr_events (seq, workspace, id, type, subject, actor, \
                    occurred_at, recorded_at, payload, causation_id, correlation_id, depth, \
                    version, traceparent) \
                  SELECT greatest(head.seq, $2) + f.n, $1, f.id, f.type, f.subject, f.actor, \
                    f.occurred_at, f.recorded_at, f.payload, f.causation_id, f.correlation_id, \
                    f.depth, ",
    version_of!("$1", "f.subject"),
    " + row_number() OVER (PARTITION BY f.subject ORDER BY f.ord), f.traceparent \
                  FROM head, fresh f \
                  RETURNING id, seq, version) \
     SELECT id, seq, version FROM ins \
     UNION ALL SELECT id, seq, NULL FROM there"
);

/// The append's statement's 14 parameters ([`append_ctes`]): the row,
/// its depth, and the last seq its transaction took (0: none).
fn append_params<'p>(row: &'p NewRow<'_>, depth: &'p i32, last: &'p i64) -> Vec<super::Param<'p>> {
    vec![
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
        (depth, Type::INT4),
        (last, Type::INT8),
        (&row.version, Type::INT8),
        (&row.traceparent, Type::TEXT),
    ]
}

/// What a lone append's statement did.
enum Lone {
    /// Inserted at this seq and version, and committed.
    At(i64, i64),
    /// Inserted nothing: the id is there, the type is not registered (as
    /// the statement's snapshot saw it), or the subject's version the
    /// snapshot read was taken by an append committed after it.
    Nothing,
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
    fn insert_once(&self, row: &NewRow<'_>, depth: i32) -> Result<Option<(i64, i64)>> {
        let last = self.last_seq.get();
        let inserted = self.query_opt(INSERT, &append_params(row, &depth, &last))?;
        inserted.map(|r| Ok((col(&r, 0)?, col(&r, 1)?))).transpose()
    }

    /// A single append alone in its write, on a deferred connection, as
    /// one statement that is its own transaction ([`INSERT_ALONE`]): the
    /// head locked, the row at the next seq, the head moved and the
    /// notification sent, committed together — the order every reader
    /// relies on (the head's lock from before the seq is taken to the
    /// commit) in one round trip, where a transaction takes three.
    ///
    /// The subject's version is read with the statement's snapshot, taken
    /// before it waited for the head: an append of the same subject that
    /// committed meanwhile has taken that version, and the statement
    /// inserts nothing ([`Lone::Nothing`]; the caller tries once more, then
    /// appends in a transaction that holds the head first). Sent again on
    /// another connection when the server had cut this one: the id makes it
    /// once (had the cut come after the server committed it, the next try
    /// finds the id).
    fn insert_alone(&self, row: &NewRow<'_>, depth: i32) -> Result<Lone> {
        let notify = self.lone_notify().expect("a deferred connection");
        let last = 0i64;
        let mut params = append_params(row, &depth, &last);
        params.push((&notify.0, Type::TEXT));
        params.push((&notify.1, Type::TEXT));
        let lone = self.on_live_connection(|client| {
            match client.query_prepared(INSERT_ALONE, &params) {
                Ok(rows) => Ok(match rows.first() {
                    Some(r) => Lone::At(col(r, 0)?, col(r, 1)?),
                    None => Lone::Nothing,
                }),
                // A session above READ COMMITTED (the pool sets it, but a
                // pooler in transaction mode does not keep it) whose head
                // moved meanwhile: nothing done, made again as above.
                Err(e)
                    if e.code() == Some(&postgres::error::SqlState::T_R_SERIALIZATION_FAILURE) =>
                {
                    Ok(Lone::Nothing)
                }
                Err(e) => Err(e.into()),
            }
        })?;
        self.begun.set(super::Begun::Alone);
        Ok(lone)
    }

    /// Whether the workspace registered the event type.
    fn type_registered(&self, workspace: &str, event_type: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM reflexr_event_types WHERE workspace = $1 AND type = $2",
                &[(&workspace, Type::TEXT), (&event_type, Type::TEXT)],
            )?
            .is_some())
    }
}

impl Events for PgConn {
    fn lock_head(&self) -> Result<()> {
        // A transaction begun ordered holds it from its BEGIN, to the end
        // (a deferred connection's begins so).
        self.ensure_begun()?;
        if self.holds_head.get() {
            return Ok(());
        }
        self.query("SELECT 1 FROM reflexr_head FOR UPDATE", &[])?;
        Ok(())
    }

    fn subject_version(&self, workspace: &str, subject: &str) -> Result<i64> {
        let rows = self.query(
            VERSION_OF_2,
            &[(&workspace, Type::TEXT), (&subject, Type::TEXT)],
        )?;
        col(&rows[0], 0)
    }

    fn subject_events(
        &self,
        workspace: &str,
        subject: &str,
        from: i64,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let limit = limit_of(limit);
        let rows = self.query(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM reflexr_events \
                 WHERE workspace = $1 AND subject = $2 AND version >= $3 \
                 ORDER BY version LIMIT $4"
            ),
            &[
                (&workspace, Type::TEXT),
                (&subject, Type::TEXT),
                (&from, Type::INT8),
                (&limit, Type::INT8),
            ],
        )?;
        events_from(&rows)
    }

    fn insert(&self, row: &NewRow<'_>) -> Result<Inserted> {
        let depth = i32::try_from(row.depth)
            .map_err(|_| Error::invalid("depth", "more than 2^31 causes deep"))?;
        // A single append alone in its write, its version not fixed by an
        // expectation: one statement, its own transaction (see
        // `insert_alone`); in a transaction after all if another append
        // took its subject's version meanwhile.
        self.refuse_on_reads()?;
        let alone = matches!(self.begun.get(), super::Begun::NotYet | super::Begun::Alone)
            && row.version.is_none();
        if alone {
            // Twice at most, each with a snapshot of its own: a type
            // registered, or a subject's version taken, while the last
            // waited for the head.
            for _ in 0..2 {
                if let Lone::At(seq, version) = self.insert_alone(row, depth)? {
                    return Ok(Inserted::At { seq, version });
                }
                if let Some(seq) = Events::seq_of(self, row.workspace, row.id)? {
                    return Ok(Inserted::Existing { seq });
                }
                if !self.type_registered(row.workspace, row.event_type)? {
                    return Ok(Inserted::Unregistered);
                }
            }
            // Nothing was written: a transaction of its own, the head first.
            self.begin_now()?;
        }
        // Twice at most: the statement checks the type's registration with
        // the snapshot it began with, before it waited for the head's lock,
        // so a type another process registered meanwhile looks missing to
        // it, and present to the look-up after it.
        // The version found in the statement is right only if the head was
        // held before the statement began (its snapshot then has every
        // committed append); else it is looked up after taking the head.
        // An owed transaction begins first (ordered, it then holds the
        // head, and the statement below finds the version itself).
        if matches!(self.begun.get(), super::Begun::Owed { .. }) {
            self.ensure_begun()?;
        }
        let looked_up;
        let row = if row.version.is_none() && !self.holds_head.get() {
            Events::lock_head(self)?;
            looked_up = NewRow {
                version: Some(Events::subject_version(self, row.workspace, row.subject)? + 1),
                ..*row
            };
            &looked_up
        } else {
            row
        };
        for _ in 0..2 {
            if let Some((seq, version)) = self.insert_once(row, depth)? {
                self.last_seq.set(seq);
                return Ok(Inserted::At { seq, version });
            }
            // The id is there already (committed before, or by another
            // transaction meanwhile): found by this insert, which took no
            // seq.
            if let Some(seq) = Events::seq_of(self, row.workspace, row.id)? {
                return Ok(Inserted::Existing { seq });
            }
            if !self.type_registered(row.workspace, row.event_type)? {
                return Ok(Inserted::Unregistered);
            }
        }
        Err(Error::Busy {
            detail: "the event type was registered while this append ran; try again".into(),
        })
    }

    fn insert_all(&self, rows: &[NewRow<'_>]) -> Batched<Inserted> {
        // One statement where the transaction holds the head (the engine's
        // shared writes do), for rows of one workspace, distinct ids, their
        // versions left to the insert; else one insert after another.
        let Some(first) = rows.first() else {
            return Ok(Vec::new());
        };
        let ids: std::collections::HashMap<&str, usize> =
            rows.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
        // An owed transaction begins here (ordered: then it holds the head).
        if matches!(self.begun.get(), super::Begun::Owed { .. })
            && let Err(e) = self.ensure_begun()
        {
            return Err((None, e));
        }
        if rows.len() < 2
            || self.begun.get() != super::Begun::Yes
            || !self.holds_head.get()
            || ids.len() != rows.len()
            || rows
                .iter()
                .any(|r| r.workspace != first.workspace || r.version.is_some())
        {
            return one_by_one(rows, |row| self.insert(row));
        }
        let mut depths = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            depths.push(i32::try_from(row.depth).map_err(|_| {
                (
                    Some(i),
                    Error::invalid("depth", "more than 2^31 causes deep"),
                )
            })?);
        }
        let id: Vec<&str> = rows.iter().map(|r| r.id).collect();
        let event_type: Vec<&str> = rows.iter().map(|r| r.event_type).collect();
        let subject: Vec<&str> = rows.iter().map(|r| r.subject).collect();
        let actor: Vec<&str> = rows.iter().map(|r| r.actor).collect();
        let payload: Vec<&str> = rows.iter().map(|r| r.payload).collect();
        let causation: Vec<Option<&str>> = rows.iter().map(|r| r.causation_id).collect();
        let correlation: Vec<Option<&str>> = rows.iter().map(|r| r.correlation_id).collect();
        let traceparent: Vec<Option<&str>> = rows.iter().map(|r| r.traceparent).collect();
        let occurred: Vec<i64> = rows.iter().map(|r| r.occurred_at).collect();
        let recorded: Vec<i64> = rows.iter().map(|r| r.recorded_at).collect();
        let last = self.last_seq.get();
        let found = self
            .query(
                INSERT_ALL,
                &[
                    (&first.workspace, Type::TEXT),
                    (&last, Type::INT8),
                    (&id, Type::TEXT_ARRAY),
                    (&event_type, Type::TEXT_ARRAY),
                    (&subject, Type::TEXT_ARRAY),
                    (&actor, Type::TEXT_ARRAY),
                    (&occurred, Type::INT8_ARRAY),
                    (&recorded, Type::INT8_ARRAY),
                    (&payload, Type::TEXT_ARRAY),
                    (&causation, Type::TEXT_ARRAY),
                    (&correlation, Type::TEXT_ARRAY),
                    (&depths, Type::INT4_ARRAY),
                    (&traceparent, Type::TEXT_ARRAY),
                ],
            )
            .map_err(|e| (None, e))?;
        // A row neither inserted nor found: its type is not registered.
        let mut out = vec![Inserted::Unregistered; rows.len()];
        for row in &found {
            let (row_id, seq, version): (&str, i64, Option<i64>) =
                (|| Ok::<_, Error>((col(row, 0)?, col(row, 1)?, col(row, 2)?)))()
                    .map_err(|e| (None, e))?;
            let i = ids[row_id];
            out[i] = match version {
                Some(version) => {
                    self.last_seq.set(self.last_seq.get().max(seq));
                    Inserted::At { seq, version }
                }
                None => Inserted::Existing { seq },
            };
        }
        Ok(out)
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
                 WHERE workspace = $1 AND subject = $3 AND seq > $2 \
                   AND (cardinality($4::text[]) = 0 OR type = ANY ($4)) \
                 ORDER BY version LIMIT $5"
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
            // The subjects' reached versions kept from the rows deleted.
            "WITH gone AS (DELETE FROM reflexr_events WHERE seq IN \
               (SELECT seq FROM reflexr_events \
                WHERE workspace = $1 AND seq <= $2 AND recorded_at < $3 \
                ORDER BY seq LIMIT $4) RETURNING workspace, subject, version), \
             floors AS (INSERT INTO reflexr_subject_floors (workspace, subject, version) \
               SELECT workspace, subject, max(version) FROM gone \
               WHERE version > 0 GROUP BY workspace, subject \
               ON CONFLICT (workspace, subject) DO UPDATE \
                 SET version = greatest(reflexr_subject_floors.version, excluded.version)) \
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
        // An owed transaction begins (ordered, it reads the head then).
        if matches!(self.begun.get(), super::Begun::Owed { .. }) {
            self.ensure_begun()?;
        }
        // This transaction's own appends count before its commit moves
        // the row.
        let last = self.last_seq.get();
        // Held from the BEGIN: nobody else can have moved it.
        if self.holds_head.get() {
            return Ok(self.head_at_begin.get().max(last));
        }
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
