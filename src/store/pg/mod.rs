//! The store on PostgreSQL (feature `postgres`): the statements of every
//! table group ([`super::backend`]) in PostgreSQL's dialect, one module per
//! concept as in `store`, beside its schema file `schema.pg.sql` and the
//! migrations in [`schema`].
//!
//! Where PostgreSQL differs from SQLite, and what this module does about it:
//!
//! - **Seqs in commit order.** Many transactions write at once, and a
//!   sequence's numbers become visible in another order than they were
//!   handed out. An append locks the one row of `reflexr_head` instead
//!   (and its transaction's commit moves it to its last seq), so appending
//!   transactions take their seqs one at a time, from their first append
//!   to their commit: the seqs a reader
//!   sees only ever grow, and a cursor never skips an event that commits
//!   later (`matrix::a_reader_never_skips_an_event_committed_late`). The
//!   cost: appends serialise across processes the way SQLite's one writer
//!   does; transactions that append nothing are not held up.
//! - **A failed statement aborts the transaction.** SQLite carries on after
//!   a constraint failure; PostgreSQL refuses every later statement of the
//!   transaction. So nothing here relies on a statement failing: an append
//!   checks the type's registration in the statement that takes the seq,
//!   and an id already there is found, not collided with.
//! - **One round trip per statement.** Statements go with their parameter
//!   types (`query_typed`), which PostgreSQL parses, binds and runs in one
//!   exchange instead of a prepare and an execute.

mod control;
mod followers;
mod guard;
mod inspect;
mod rules;
mod runs;
mod schedules;
pub(crate) mod schema;

use std::cell::RefCell;

use postgres::Row;
use postgres::types::{ToSql, Type};

use super::backend::{Audit, Cursors, Events, Inserted, Leases, Workspaces};
use super::events::NewRow;
use super::leases::LeaseRow;
use crate::base::error::{Error, Result};
use crate::base::event::Event;

/// The pool of connections an engine on PostgreSQL keeps.
pub(crate) type Pool = r2d2::Pool<r2d2_postgres::PostgresConnectionManager<postgres::NoTls>>;
/// One of the pool's connections.
pub(crate) type Pooled =
    r2d2::PooledConnection<r2d2_postgres::PostgresConnectionManager<postgres::NoTls>>;

/// The head seq as last committed, on a connection outside any
/// transaction of the engine's: what the heartbeat compares.
pub(crate) fn committed_head(client: &mut postgres::Client) -> Result<i64> {
    Ok(client
        .query_one("SELECT seq FROM reflexr_head", &[])?
        .try_get(0)?)
}

/// Has `client` listen on `channel` (a name of the engine's own).
pub(crate) fn listen(client: &mut postgres::Client, channel: &str) -> Result<()> {
    debug_assert!(
        channel
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    );
    Ok(client.batch_execute(&format!("LISTEN {channel}"))?)
}

/// One pooled connection inside a transaction, as the core's table groups
/// see it: `BEGIN` when made, `COMMIT` by [`PgConn::commit`], `ROLLBACK`
/// when dropped uncommitted (the connection goes back to the pool clean).
///
/// The core's methods take `&self` (SQLite's connection does); the
/// PostgreSQL client needs `&mut` for every statement, so it sits in a
/// `RefCell`. No method holds the borrow across a call into another, so it
/// is never borrowed twice.
pub struct PgConn {
    client: RefCell<Pooled>,
    open: std::cell::Cell<bool>,
    /// A statement failed on the server: PostgreSQL has aborted the
    /// transaction (or the savepoint's part of it), and refuses every
    /// statement until a rollback. Its `COMMIT` would roll back and report
    /// success, so [`PgConn::finish`] refuses to send it.
    aborted: std::cell::Cell<bool>,
    /// The highest seq this transaction appended (0: none): the head
    /// row is set to it at commit.
    last_seq: std::cell::Cell<i64>,
}

type Param<'p> = (&'p (dyn ToSql + Sync), Type);

impl PgConn {
    /// Begins a transaction on `client`: READ COMMITTED whatever the
    /// server's, database's or role's default (an append waits for the
    /// head's lock and reads the head its holder committed; under REPEATABLE
    /// READ it would fail instead), and READ ONLY if `read_only` (a write
    /// in it fails with [`Error::ReadOnly`]), else READ WRITE.
    pub(crate) fn begin_as(client: Pooled, read_only: bool) -> Result<PgConn> {
        PgConn::begin_with(
            client,
            if read_only {
                "BEGIN ISOLATION LEVEL READ COMMITTED, READ ONLY"
            } else {
                "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE"
            },
        )
    }

    /// Begins a write transaction that holds the head row's lock from its
    /// first statement, sent with the BEGIN (no round trip of its own).
    ///
    /// The order of locks: a transaction that appends takes the head row
    /// before any other. Every append locks the head, and holds it to the
    /// commit; one that took a lane, a run or a lease row first and then
    /// waited for the head, while the head's holder waited for that row,
    /// would deadlock — which a shared write (one member appending, the
    /// next settling a run, say) or an application's write (an append,
    /// then an enqueue) would otherwise do now and then. With the head
    /// first, a transaction waiting for it holds nothing anyone waits for.
    pub(crate) fn begin_ordered(client: Pooled) -> Result<PgConn> {
        PgConn::begin_with(
            client,
            "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE; \
             SELECT 1 FROM reflexr_head FOR UPDATE",
        )
    }

    fn begin_with(mut client: Pooled, begin: &str) -> Result<PgConn> {
        if let Err(e) = client.batch_execute(begin) {
            // A statement sent with the BEGIN failed (the head's lock met a
            // `lock_timeout`, say): the transaction is open and aborted.
            // End it, or the connection would go back to the pool in it
            // and fail every BEGIN after (on a broken connection this
            // fails too, and the pool drops it).
            let _ = client.batch_execute("ROLLBACK");
            return Err(e.into());
        }
        Ok(PgConn {
            client: RefCell::new(client),
            open: std::cell::Cell::new(true),
            aborted: std::cell::Cell::new(false),
            last_seq: std::cell::Cell::new(0),
        })
    }

    /// Whether a statement failed on the server since the transaction (or
    /// the last rollback to a savepoint) began: nothing more can commit.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.get()
    }

    /// Passes a statement's result on, noting a failure on the server (it
    /// aborts the transaction). A failure on the client's side (a value
    /// that does not convert) sent nothing.
    fn note<T>(&self, r: std::result::Result<T, postgres::Error>) -> Result<T> {
        if let Err(e) = &r
            && e.as_db_error().is_some()
        {
            self.aborted.set(true);
        }
        Ok(r?)
    }

    /// Commits the transaction.
    pub(crate) fn commit(self) -> Result<()> {
        self.finish(None)
    }

    /// Commits the transaction with a notification on `channel` (a name
    /// of the engine's own, not the caller's), delivered to listeners with
    /// the commit.
    pub(crate) fn commit_notifying(self, channel: &'static str) -> Result<()> {
        debug_assert!(
            channel
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        );
        self.finish(Some(channel))
    }

    /// The commit, in one round trip: the head row moved to the last seq
    /// appended (if any), the notification (if any), `COMMIT`. If a
    /// statement fails, the rest are not run, and dropping the connection
    /// rolls back.
    fn finish(self, notify: Option<&'static str>) -> Result<()> {
        if self.aborted.get() {
            // Dropping `self` rolls back.
            return Err(Error::TransactionAborted {
                detail: "a statement of this write failed on the server, which aborted the \
                         transaction; nothing of it was committed"
                    .into(),
            });
        }
        let mut sql = String::new();
        let last = self.last_seq.get();
        if last > 0 {
            sql.push_str(&format!(
                "UPDATE reflexr_head SET seq = greatest(seq, {last}); "
            ));
        }
        if let Some(channel) = notify {
            sql.push_str(&format!("NOTIFY {channel}; "));
        }
        sql.push_str("COMMIT");
        self.client.borrow_mut().batch_execute(&sql)?;
        self.open.set(false);
        Ok(())
    }

    /// The highest seq this transaction appended so far (0: none).
    pub(crate) fn last_seq(&self) -> i64 {
        self.last_seq.get()
    }

    /// Runs the engine's own transaction-control statements (savepoints),
    /// in one round trip.
    pub(crate) fn control(&self, sql: &str) -> Result<()> {
        let r = self.client.borrow_mut().batch_execute(sql);
        self.note(r)
    }

    /// Rolls back to the engine's savepoint `name`, and forgets the seqs
    /// taken since (`mark`: [`PgConn::last_seq`] when it was made), so the
    /// next append does not leave a gap.
    pub(crate) fn rollback_to(&self, name: &str, mark: i64) -> Result<()> {
        self.control(&format!("ROLLBACK TO SAVEPOINT {name}"))?;
        self.last_seq.set(mark);
        self.aborted.set(false);
        Ok(())
    }

    /// Runs one statement of the caller's own, with its parameters'
    /// types left to the server: the application's SQL (or a test's),
    /// refused first if it would end or replace the engine's transaction
    /// (see `guard`).
    pub(crate) fn query_untyped(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        guard::refuse_transaction_control(sql)?;
        let r = self.client.borrow_mut().query(sql, params);
        self.note(r)
    }

    /// [`PgConn::query_untyped`] for a statement whose rows are not wanted:
    /// the number of rows it changed.
    pub(crate) fn execute_untyped(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        guard::refuse_transaction_control(sql)?;
        let r = self.client.borrow_mut().execute(sql, params);
        self.note(r)
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>> {
        let r = self.client.borrow_mut().query_typed(sql, params);
        self.note(r)
    }

    fn query_opt(&self, sql: &str, params: &[Param<'_>]) -> Result<Option<Row>> {
        let mut rows = self.query(sql, params)?;
        Ok(if rows.is_empty() {
            None
        } else {
            Some(rows.swap_remove(0))
        })
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        if self.open.get() {
            // Best effort: a connection that cannot roll back is broken,
            // and the pool drops broken connections.
            let _ = self.client.get_mut().batch_execute("ROLLBACK");
        }
    }
}

/// A column of a row, its decoding failure a typed error.
fn col<'r, T: postgres::types::FromSql<'r>>(row: &'r Row, i: usize) -> Result<T> {
    row.try_get(i).map_err(Error::from)
}

impl Workspaces for PgConn {
    fn insert(&self, name: &str, now: i64) -> Result<bool> {
        let row = self.query_opt(
            "INSERT INTO reflexr_workspaces (name, created_at) VALUES ($1, $2) \
             ON CONFLICT (name) DO NOTHING RETURNING 1",
            &[(&name, Type::TEXT), (&now, Type::INT8)],
        )?;
        Ok(row.is_some())
    }

    fn exists(&self, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM reflexr_workspaces WHERE name = $1",
                &[(&name, Type::TEXT)],
            )?
            .is_some())
    }

    fn register_type(
        &self,
        workspace: &str,
        event_type: &str,
        reserved: bool,
        now: i64,
    ) -> Result<bool> {
        let row = self.query_opt(
            "INSERT INTO reflexr_event_types (workspace, type, reserved, registered_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (workspace, type) DO NOTHING RETURNING 1",
            &[
                (&workspace, Type::TEXT),
                (&event_type, Type::TEXT),
                (&reserved, Type::BOOL),
                (&now, Type::INT8),
            ],
        )?;
        Ok(row.is_some())
    }

    fn list(&self) -> Result<Vec<(String, i64)>> {
        self.query(
            "SELECT name, created_at FROM reflexr_workspaces ORDER BY name",
            &[],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn app_types(&self, workspace: &str) -> Result<Vec<String>> {
        self.query(
            "SELECT type FROM reflexr_event_types WHERE workspace = $1 AND NOT reserved \
             ORDER BY type",
            &[(&workspace, Type::TEXT)],
        )?
        .iter()
        .map(|r| col(r, 0))
        .collect()
    }
}

const EVENT_COLUMNS: &str = "seq, id, workspace, type, subject, actor, occurred_at, recorded_at, \
                             causation_id, correlation_id, depth, payload";

fn event_from(r: &Row) -> Result<Event> {
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

fn events_from(rows: &[Row]) -> Result<Vec<Event>> {
    rows.iter().map(event_from).collect()
}

/// A page size as PostgreSQL's LIMIT takes it.
fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
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

impl Cursors for PgConn {
    fn get(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<i64>> {
        self.query_opt(
            "SELECT position FROM reflexr_cursors \
             WHERE workspace = $1 AND kind = $2 AND name = $3",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
            ],
        )?
        .map(|r| col(&r, 0))
        .transpose()
    }

    fn advance(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<std::result::Result<(), i64>> {
        let moved = self.query_opt(
            "INSERT INTO reflexr_cursors (workspace, kind, name, position, updated_at, high_water) \
             VALUES ($1, $2, $3, $4, $5, $4) \
             ON CONFLICT (workspace, kind, name) DO UPDATE \
             SET position = excluded.position, \
                 updated_at = greatest(excluded.updated_at, reflexr_cursors.updated_at + 1), \
                 high_water = greatest(reflexr_cursors.high_water, excluded.position), \
                 failures = CASE WHEN excluded.position > reflexr_cursors.position THEN 0 \
                            ELSE reflexr_cursors.failures END, \
                 last_error = CASE WHEN excluded.position > reflexr_cursors.position THEN NULL \
                              ELSE reflexr_cursors.last_error END \
             WHERE excluded.position >= reflexr_cursors.position \
             RETURNING 1",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&position, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        if moved.is_some() {
            return Ok(Ok(()));
        }
        let current = Cursors::get(self, workspace, kind, name)?.unwrap_or(0);
        Ok(Err(current))
    }

    fn set(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<Option<i64>> {
        let before = Cursors::get(self, workspace, kind, name)?;
        self.query(
            "INSERT INTO reflexr_cursors (workspace, kind, name, position, updated_at, high_water) \
             VALUES ($1, $2, $3, $4, $5, $4) \
             ON CONFLICT (workspace, kind, name) DO UPDATE \
             SET position = excluded.position, \
                 updated_at = greatest(excluded.updated_at, reflexr_cursors.updated_at + 1), \
                 high_water = greatest(reflexr_cursors.high_water, excluded.position), \
                 failures = 0, last_error = NULL",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&position, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(before)
    }

    fn get_stamped(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<(i64, i64)>> {
        self.query_opt(
            "SELECT position, updated_at FROM reflexr_cursors \
             WHERE workspace = $1 AND kind = $2 AND name = $3",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
            ],
        )?
        .map(|r| Ok((col(&r, 0)?, col(&r, 1)?)))
        .transpose()
    }

    fn touch(&self, workspace: &str, kind: &str, name: &str, now: i64) -> Result<()> {
        self.query(
            "UPDATE reflexr_cursors SET updated_at = greatest($4, updated_at + 1) \
             WHERE workspace = $1 AND kind = $2 AND name = $3",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn high_water(&self, workspace: &str, kind: &str, name: &str) -> Result<i64> {
        Ok(self
            .query_opt(
                "SELECT high_water FROM reflexr_cursors \
                 WHERE workspace = $1 AND kind = $2 AND name = $3",
                &[
                    (&workspace, Type::TEXT),
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                ],
            )?
            .map(|r| col(&r, 0))
            .transpose()?
            .unwrap_or(0))
    }

    fn delete(&self, workspace: &str, kind: &str, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "DELETE FROM reflexr_cursors WHERE workspace = $1 AND kind = $2 AND name = $3 \
                 RETURNING 1",
                &[
                    (&workspace, Type::TEXT),
                    (&kind, Type::TEXT),
                    (&name, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn record_failure(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>> {
        let error = crate::base::limits::clip_error(error);
        self.query_opt(
            "UPDATE reflexr_cursors SET failures = failures + 1, last_error = $5, failed_at = $6 \
             WHERE workspace = $1 AND kind = $2 AND name = $3 AND position = $4 \
             RETURNING failures",
            &[
                (&workspace, Type::TEXT),
                (&kind, Type::TEXT),
                (&name, Type::TEXT),
                (&position, Type::INT8),
                (&error, Type::TEXT),
                (&now, Type::INT8),
            ],
        )?
        .map(|r| Ok(i64::from(col::<i32>(&r, 0)?)))
        .transpose()
    }

    fn min_position(&self, workspace: &str) -> Result<Option<i64>> {
        let rows = self.query(
            "SELECT min(position) FROM reflexr_cursors WHERE workspace = $1",
            &[(&workspace, Type::TEXT)],
        )?;
        col(&rows[0], 0)
    }

    fn list(&self) -> Result<Vec<crate::store::cursors::Listed>> {
        self.query(
            "SELECT c.workspace, c.kind, c.name, c.position, \
                    (SELECT count(*) FROM reflexr_events e \
                      WHERE e.workspace = c.workspace AND e.seq > c.position), \
                    c.updated_at, c.failures, c.last_error \
             FROM reflexr_cursors c ORDER BY c.workspace, c.kind, c.name",
            &[],
        )?
        .iter()
        .map(|r| {
            Ok(crate::store::cursors::Listed {
                workspace: col(r, 0)?,
                kind: col(r, 1)?,
                name: col(r, 2)?,
                position: col(r, 3)?,
                lag: col(r, 4)?,
                updated_at: col(r, 5)?,
                failures: i64::from(col::<i32>(r, 6)?),
                last_error: col(r, 7)?,
            })
        })
        .collect()
    }
}

const LEASE_COLUMNS: &str = "name, holder, generation, acquired_at, renewed_at, expires_at";

fn lease_from(r: &Row) -> Result<LeaseRow> {
    Ok(LeaseRow {
        name: col(r, 0)?,
        holder: col(r, 1)?,
        generation: col(r, 2)?,
        acquired_at: col(r, 3)?,
        renewed_at: col(r, 4)?,
        expires_at: col(r, 5)?,
    })
}

impl Leases for PgConn {
    fn acquire(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<Option<LeaseRow>> {
        // The same statement as SQLite's (see store::leases::acquire).
        self.query_opt(
            &format!(
                "INSERT INTO reflexr_leases \
                   (name, holder, generation, acquired_at, renewed_at, expires_at) \
                 VALUES ($1, $2, 1, $3, $3, $3 + $4) \
                 ON CONFLICT (name) DO UPDATE SET \
                   generation = CASE WHEN reflexr_leases.expires_at <= excluded.acquired_at \
                                THEN reflexr_leases.generation + 1 \
                                ELSE reflexr_leases.generation END, \
                   acquired_at = CASE WHEN reflexr_leases.expires_at <= excluded.acquired_at \
                                 THEN excluded.acquired_at \
                                 ELSE reflexr_leases.acquired_at END, \
                   holder = excluded.holder, \
                   renewed_at = excluded.renewed_at, \
                   expires_at = greatest(reflexr_leases.expires_at, excluded.expires_at) \
                 WHERE reflexr_leases.expires_at <= excluded.acquired_at \
                    OR reflexr_leases.holder = excluded.holder \
                 RETURNING {LEASE_COLUMNS}"
            ),
            &[
                (&name, Type::TEXT),
                (&holder, Type::TEXT),
                (&now, Type::INT8),
                (&ttl_ms, Type::INT8),
            ],
        )?
        .as_ref()
        .map(lease_from)
        .transpose()
    }

    fn renew(
        &self,
        name: &str,
        holder: &str,
        generation: i64,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<LeaseRow>> {
        self.query_opt(
            &format!(
                "UPDATE reflexr_leases \
                 SET renewed_at = $4, expires_at = greatest(expires_at, $4 + $5) \
                 WHERE name = $1 AND holder = $2 AND generation = $3 AND expires_at > $4 \
                 RETURNING {LEASE_COLUMNS}"
            ),
            &[
                (&name, Type::TEXT),
                (&holder, Type::TEXT),
                (&generation, Type::INT8),
                (&now, Type::INT8),
                (&ttl_ms, Type::INT8),
            ],
        )?
        .as_ref()
        .map(lease_from)
        .transpose()
    }

    fn release(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        let released = self.query_opt(
            "UPDATE reflexr_leases SET expires_at = 0, renewed_at = $4 \
             WHERE name = $1 AND holder = $2 AND generation = $3 AND expires_at > $4 \
             RETURNING 1",
            &[
                (&name, Type::TEXT),
                (&holder, Type::TEXT),
                (&generation, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(released.is_some())
    }

    fn is_held(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                // FOR SHARE: a takeover (which updates the row) waits for
                // this write to end, so the fenced write and the new
                // holder's first read never overlap.
                "SELECT 1 FROM reflexr_leases \
                 WHERE name = $1 AND holder = $2 AND generation = $3 AND expires_at > $4 \
                 FOR SHARE",
                &[
                    (&name, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&generation, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    fn get(&self, name: &str) -> Result<Option<LeaseRow>> {
        self.query_opt(
            &format!("SELECT {LEASE_COLUMNS} FROM reflexr_leases WHERE name = $1"),
            &[(&name, Type::TEXT)],
        )?
        .as_ref()
        .map(lease_from)
        .transpose()
    }

    fn list(&self) -> Result<Vec<LeaseRow>> {
        self.query(
            &format!("SELECT {LEASE_COLUMNS} FROM reflexr_leases ORDER BY name"),
            &[],
        )?
        .iter()
        .map(lease_from)
        .collect()
    }
}

impl Audit for PgConn {
    fn record(&self, e: &crate::store::audit::Entry<'_>) -> Result<()> {
        let action = e.action.as_str();
        self.query(
            "INSERT INTO reflexr_audit (at, operator, action, target, reason, detail) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                (&e.at, Type::INT8),
                (&e.operator, Type::TEXT),
                (&action, Type::TEXT),
                (&e.target, Type::TEXT),
                (&e.reason, Type::TEXT),
                (&e.detail, Type::TEXT),
            ],
        )?;
        Ok(())
    }

    fn recent(&self, limit: i64) -> Result<Vec<crate::base::audit::AuditEntry>> {
        self.query(
            "SELECT at, operator, action, target, reason, detail FROM reflexr_audit \
             ORDER BY id DESC LIMIT $1",
            &[(&limit, Type::INT8)],
        )?
        .iter()
        .map(|r| {
            Ok(crate::base::audit::AuditEntry {
                at: col(r, 0)?,
                operator: col(r, 1)?,
                action: crate::base::audit::AuditAction::from_stored(&col::<String>(r, 2)?),
                target: col(r, 3)?,
                reason: col(r, 4)?,
                detail: col(r, 5)?,
            })
        })
        .collect()
    }
}
