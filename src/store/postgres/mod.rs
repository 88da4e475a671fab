//! The store on PostgreSQL (feature `postgres`): the statements of every
//! table group of the seam ([`crate::store`]) in PostgreSQL's dialect, one
//! file per group as in `store::sqlite`, beside its schema file
//! `schema.pg.sql` and the migrations in [`schema`]. This file: the
//! connection inside a transaction ([`PgConn`]) every group's statements
//! run on.
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
//!   later (`store::conformance::events::a_reader_never_skips_an_event_committed_late`). The
//!   cost: appends serialise across processes the way SQLite's one writer
//!   does; transactions that append nothing are not held up.
//! - **A failed statement aborts the transaction.** SQLite carries on after
//!   a constraint failure; PostgreSQL refuses every later statement of the
//!   transaction. So nothing here relies on a statement failing: an append
//!   checks the type's registration in the statement that takes the seq,
//!   and an id already there is found, not collided with.
//! - **One round trip per statement, its plan kept after five.** The
//!   engine's statements are prepared with their parameter types the first
//!   time a connection runs them and kept with the connection
//!   ([`Client`]): each later run is one exchange (bind and execute) that
//!   the server does not parse again, and, after its first five, does not
//!   plan again either — once a generic plan costs no more than the plans
//!   made for the values at hand. Where a value would make those look
//!   cheaper (an array of one name, where the generic plan guesses ten),
//!   the statement passes it as a subquery's value, which no plan sees
//!   (the claims' plan, the settlements' positions). An append's statement cost
//!   0.86 ms a transaction parsed each time against 0.57 ms prepared
//!   (`pgbench`, one client, the same statement). The application's own
//!   statements are not kept (`Tx::query` on PostgreSQL).

mod audit;
pub(in crate::store) mod control;
mod counters;
mod cursors;
mod dead_letters;
pub(in crate::store) mod events;
mod followers;
mod guard;
mod inspect;
mod leases;
mod rules;
pub(in crate::store) mod runs;
mod schedules;
pub(crate) mod schema;
mod steps;
mod workspaces;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use postgres::types::{ToSql, Type};
use postgres::{Row, Statement};

use crate::base::counter::Counter;
use crate::base::error::{Error, Result};

/// The pool of connections an engine on PostgreSQL keeps.
pub(crate) type Pool = r2d2::Pool<Manager>;
/// One of the pool's connections.
pub(crate) type Pooled = r2d2::PooledConnection<Manager>;

/// The most statements one connection keeps prepared. The engine's are a
/// few hundred texts at most; some are built for their arguments' count
/// (a list of ids), so past this the connection forgets them all and
/// starts again.
const MAX_PREPARED: usize = 512;

/// A connection of the pool, with the engine's statements it has prepared
/// (see the module's notes). A connection that breaks is dropped by the
/// pool, its statements with it; the server forgets them at its end.
pub(crate) struct Client {
    client: postgres::Client,
    prepared: HashMap<String, Statement>,
}

impl Client {
    /// Runs one of the engine's statements, prepared with `params`' types
    /// the first time this connection runs its text. A failed prepare, as
    /// a failed statement, aborts the transaction it was made in (it is a
    /// statement on the server); a prepared statement outlives the
    /// transaction that prepared it, rolled back or not.
    fn query_prepared(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> std::result::Result<Vec<Row>, postgres::Error> {
        let statement = match self.prepared.get(sql) {
            Some(s) => s.clone(),
            None => {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let s = self.client.prepare_typed(sql, &types)?;
                if self.prepared.len() >= MAX_PREPARED {
                    self.prepared.clear();
                }
                self.prepared.insert(sql.to_string(), s.clone());
                s
            }
        };
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        self.client.query(&statement, &values)
    }
}

impl std::ops::Deref for Client {
    type Target = postgres::Client;
    fn deref(&self) -> &postgres::Client {
        &self.client
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut postgres::Client {
        &mut self.client
    }
}

/// What each of the engine's sessions that writes says first: its
/// transactions default to READ COMMITTED, READ WRITE, whatever the
/// server's, database's or role's defaults (a role kept read-only by
/// default, say). The engine's transactions say so in their BEGIN; a
/// statement sent as its own transaction (a plain enqueue, a lone append)
/// and the schema's migration at open take the session's default.
pub(crate) const SESSION_DEFAULTS: &str =
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE";

/// Makes the pool's connections ([`Client`]s): r2d2_postgres's manager,
/// each connection with its prepared statements beside it.
pub(crate) struct Manager(r2d2_postgres::PostgresConnectionManager<postgres::NoTls>);

impl Manager {
    pub(crate) fn new(config: postgres::Config) -> Manager {
        Manager(r2d2_postgres::PostgresConnectionManager::new(
            config,
            postgres::NoTls,
        ))
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Client;
    type Error = postgres::Error;

    /// A new connection with the engine's session defaults
    /// ([`SESSION_DEFAULTS`]).
    fn connect(&self) -> std::result::Result<Client, postgres::Error> {
        let mut client = self.0.connect()?;
        client.batch_execute(SESSION_DEFAULTS)?;
        Ok(Client {
            client,
            prepared: HashMap::new(),
        })
    }

    fn is_valid(&self, conn: &mut Client) -> std::result::Result<(), postgres::Error> {
        self.0.is_valid(&mut conn.client)
    }

    fn has_broken(&self, conn: &mut Client) -> bool {
        self.0.has_broken(&mut conn.client)
    }
}

/// The head seq as last committed, on a connection outside any
/// transaction of the engine's: what the heartbeat compares.
pub(crate) fn committed_head(client: &mut postgres::Client) -> Result<i64> {
    Ok(client
        .query_one("SELECT seq FROM reflexr_head", &[])?
        .try_get(0)?)
}

/// Has `client` listen on `channel` (a name of the engine's own,
/// [`channel_of`]).
pub(crate) fn listen(client: &mut postgres::Client, channel: &str) -> Result<()> {
    debug_assert!(is_plain(channel));
    Ok(client.batch_execute(&format!("LISTEN {channel}"))?)
}

/// The channel the commits of the engine's tables in `schema` are announced
/// on: `reflexr_<schema>` for a schema named in lower-case letters, digits
/// and underscores that fits PostgreSQL's 63 bytes, else `reflexr_` and the
/// first 16 hex digits of the name's UUID v5 (a SHA-1: the same in every
/// process and every build; 60 bits of it, the 13th digit being the UUID's
/// version). The server's channels are per database, not per schema:
/// engines of different schemas of one database wake only their own
/// schema's listeners (two schemas whose channels met would cost each
/// other wasted wakes, never an event).
pub(crate) fn channel_of(schema: &str) -> String {
    // The name's hash, against this namespace of the engine's own.
    const NAMESPACE: uuid::Uuid = uuid::uuid!("5b0c9114-6e0f-5a1e-9c3d-2f4a8e7b1d60");
    let plain = format!("reflexr_{schema}");
    if plain.len() <= 63 && is_plain(&plain) {
        return plain;
    }
    let hash = uuid::Uuid::new_v5(&NAMESPACE, schema.as_bytes())
        .simple()
        .to_string();
    format!("reflexr_{}", &hash[..16])
}

/// Whether `word` needs no quotes in SQL and keeps its case there: a
/// channel or a payload of the engine's, written into `LISTEN` and
/// `NOTIFY` as it is.
fn is_plain(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// One pooled connection inside a transaction, as the core's table groups
/// see it: `BEGIN` when made (or, made [`PgConn::deferred`], by its first
/// statement, unless that is a lone append sent as its own transaction;
/// made [`PgConn::owed`], by its first statement, with it when that is a
/// savepoint),
/// `COMMIT` by [`PgConn::commit`], `ROLLBACK` when dropped uncommitted (the
/// connection goes back to the pool clean).
///
/// The core's methods take `&self` (SQLite's connection does); the
/// PostgreSQL client needs `&mut` for every statement, so it sits in a
/// `RefCell`. No method holds the borrow across a call into another, so it
/// is never borrowed twice.
pub struct PgConn {
    /// None only while a cut connection is swapped for another.
    client: RefCell<Option<Pooled>>,
    open: std::cell::Cell<bool>,
    /// A statement failed on the server: PostgreSQL has aborted the
    /// transaction (or the savepoint's part of it), and refuses every
    /// statement until a rollback. Its `COMMIT` would roll back and report
    /// success, so [`PgConn::finish`] refuses to send it.
    aborted: std::cell::Cell<bool>,
    /// The highest seq this transaction appended (0: none): the head
    /// row is set to it at commit.
    last_seq: std::cell::Cell<i64>,
    /// Begun ordered: the head row's lock is held from the BEGIN to the
    /// end (a lock taken in a savepoint is not: rolling it back lets go).
    pub(super) holds_head: std::cell::Cell<bool>,
    /// The head seq the ordered BEGIN read with its lock: while the lock is
    /// held no other transaction can move it, so the head is this, or
    /// this transaction's own last append (no round trip to ask).
    pub(super) head_at_begin: std::cell::Cell<i64>,
    /// Whether the transaction is open yet (see [`PgConn::deferred`]).
    pub(super) begun: std::cell::Cell<Begun>,
    /// Releases of the engine's nested savepoint not sent yet: each goes
    /// with the next transaction-control statements, or the commit (see
    /// [`PgConn::release_nested`]).
    owed_releases: std::cell::Cell<u32>,
    /// The counters' bumps not sent yet, in a transaction: sent with the
    /// next transaction-control statements or the commit (see
    /// `PgConn::take_bumps_into`).
    pub(super) bumps: RefCell<Vec<(Counter, i64)>>,
    /// A deferred or owed connection's pool, to replace a connection the
    /// server cut before its first statement.
    pool: Option<Pool>,
    /// The notification a deferred connection's lone append carries (a
    /// channel and a payload, the engine's own words).
    lone_notify: Option<(Arc<str>, Arc<str>)>,
    /// Whether a statement was sent again on another connection after the
    /// server cut this one ([`PgConn::on_live_connection`]): the first try
    /// may have committed, with its notification, before the cut.
    resent: std::cell::Cell<bool>,
}

/// Whether a [`PgConn`] is inside its transaction yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begun {
    /// Inside it: begun when made, or by a deferred or owed connection's
    /// first statement.
    Yes,
    /// A deferred connection before its first statement: outside any
    /// transaction block, nothing sent.
    NotYet,
    /// A transaction owed ([`PgConn::owed`]): its `BEGIN` (with the head's
    /// lock if `ordered`) goes with the first statement, in one round trip
    /// with it when that is a transaction-control statement (a savepoint).
    /// Unlike [`Begun::NotYet`], an append first is not sent alone.
    Owed { ordered: bool },
    /// A deferred connection whose single append was sent as its own
    /// transaction (committed, or finding its id there or its type not
    /// registered): still outside any transaction block, and what follows
    /// (reads, by the single append's contract) runs so too.
    Alone,
    /// The engine's own reads ([`PgConn::reads`]): outside any transaction
    /// block, each statement its own; nothing on it may write.
    Reads,
}

/// The engine's nested savepoint (`Tx::nested`): one name at every depth,
/// each `ROLLBACK TO` and `RELEASE` naming the newest.
pub(crate) const NESTED: &str = "reflexr_nested";

/// What a [`PgConn`] keeps of its transaction besides the rows, when a
/// savepoint was made: a rollback to the savepoint restores it. (The
/// counters' bumps owed need no mark: a savepoint is made with none owed,
/// so a rollback to it drops all those owed then.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub struct Mark {
    /// [`PgConn::last_seq`].
    seq: i64,
}

impl Mark {
    /// The highest seq the transaction had appended (0: none).
    pub(crate) fn seq(self) -> i64 {
        self.seq
    }
}

/// A write transaction's BEGIN, the head not taken (see
/// [`PgConn::begin_as`]).
const BEGIN_WRITE: &str = "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE";

/// The ordered BEGIN (see [`PgConn::begin_ordered`]).
const BEGIN_ORDERED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE; \
                             SELECT seq FROM reflexr_head FOR UPDATE";

type Param<'p> = (&'p (dyn ToSql + Sync), Type);

/// Sends `begin` (a BEGIN, and with `holds_head` the head's lock) on
/// `client`: the head seq it read, if it took the lock.
fn begin_on(client: &mut Pooled, begin: &str, holds_head: bool) -> Result<Option<i64>> {
    let head = match client.simple_query(begin) {
        Ok(messages) => head_in(&messages),
        Err(e) => {
            // A statement sent with the BEGIN failed (the head's lock
            // met a `lock_timeout`, say): the transaction is open and
            // aborted. End it, or the connection would go back to the
            // pool in it and fail every BEGIN after (on a broken
            // connection this fails too, and the pool drops it).
            let _ = client.batch_execute("ROLLBACK");
            return Err(e.into());
        }
    };
    if holds_head && head.is_none() {
        let _ = client.batch_execute("ROLLBACK");
        return Err(head_missing());
    }
    Ok(head)
}

/// The head seq an ordered `BEGIN`'s lock read, among a simple query's
/// messages.
fn head_in(messages: &[postgres::SimpleQueryMessage]) -> Option<i64> {
    messages.iter().find_map(|m| match m {
        postgres::SimpleQueryMessage::Row(row) => row.get(0)?.parse::<i64>().ok(),
        _ => None,
    })
}

/// An ordered `BEGIN` that read no head row.
fn head_missing() -> Error {
    Error::Storage {
        code: None,
        message: "PostgreSQL: the log's head row (reflexr_head) is missing".into(),
    }
}

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
                BEGIN_WRITE
            },
            false,
        )
    }

    /// A connection for the engine's own reads, outside any transaction
    /// block: each statement a transaction of its own, in the session's
    /// READ COMMITTED ([`SESSION_DEFAULTS`]). Under READ COMMITTED every
    /// statement reads a snapshot of its own either way, so a `BEGIN` and a
    /// `COMMIT` around the reads buy no consistency, and cost two round
    /// trips: on the way from an append to its handler, a rule's reads
    /// spent about a third of their time on them (the performance guide).
    /// An append, a savepoint or the caller's SQL on it is refused before it
    /// is sent ([`Error::ReadOnly`]); the application's queries keep a READ
    /// ONLY transaction (`PgDb::with_reader`).
    pub(crate) fn reads(client: Pooled) -> PgConn {
        PgConn::outside(client, Begun::Reads, None, None)
    }

    /// A connection outside any transaction block, `begun` as said, with
    /// nothing appended and no head held yet.
    fn outside(
        client: Pooled,
        begun: Begun,
        pool: Option<Pool>,
        lone_notify: Option<(Arc<str>, Arc<str>)>,
    ) -> PgConn {
        PgConn {
            client: RefCell::new(Some(client)),
            open: std::cell::Cell::new(false),
            aborted: std::cell::Cell::new(false),
            last_seq: std::cell::Cell::new(0),
            holds_head: std::cell::Cell::new(false),
            head_at_begin: std::cell::Cell::new(0),
            begun: std::cell::Cell::new(begun),
            owed_releases: std::cell::Cell::new(0),
            bumps: RefCell::new(Vec::new()),
            pool,
            lone_notify,
            resent: std::cell::Cell::new(false),
        }
    }

    /// Refuses a write on a connection made for reads ([`PgConn::reads`]).
    pub(super) fn refuse_on_reads(&self) -> Result<()> {
        if self.begun.get() == Begun::Reads {
            return Err(Error::ReadOnly {
                detail: "a write on the engine's connection for reads (a bug in reflexr: \
                         please report it)"
                    .into(),
            });
        }
        Ok(())
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
    /// The engine's shared writes begin so by their first statement
    /// ([`PgConn::owed`]); this begins at once (the conformance suite's).
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "the engine's writes begin owed (PgConn::owed)")
    )]
    pub(crate) fn begin_ordered(client: Pooled) -> Result<PgConn> {
        PgConn::begin_with(client, BEGIN_ORDERED, true)
    }

    /// A connection for a single append alone in its write
    /// (`PgDb::run_batch`) or a plain enqueue ([`PgConn::insert_run_alone`]),
    /// outside any transaction block until its first statement. The
    /// append's statement, if that is the first, is sent
    /// as its own transaction — the head locked, the event inserted at
    /// the next seq, the head moved to it and `notify` sent, in one
    /// statement and one round trip (see `Events::insert`); any other
    /// first statement begins the transaction ordered, as
    /// [`PgConn::begin_ordered`] does. A connection the server cut fails
    /// that first statement, and another from `pool` takes its place
    /// (nothing was done; the append's id makes sending it again safe).
    pub(crate) fn deferred(client: Pooled, pool: Pool, notify: (Arc<str>, Arc<str>)) -> PgConn {
        PgConn::outside(client, Begun::NotYet, Some(pool), Some(notify))
    }

    /// A write transaction owed: begun by its first statement (ordered, as
    /// [`PgConn::begin_ordered`] begins, if `ordered`; else as
    /// [`PgConn::begin_as`] begins a write), and in one round trip with it
    /// when that is a savepoint — the first of a shared write's members,
    /// or of a settlement alone in its write, where the `BEGIN` was a round
    /// trip of its own. A connection the server cut fails that first
    /// round trip, and another from `pool` takes its place (nothing was
    /// done), as a failed `BEGIN` is sent again (`PgDb::begin`).
    pub(crate) fn owed(client: Pooled, pool: Pool, ordered: bool) -> PgConn {
        PgConn::outside(client, Begun::Owed { ordered }, Some(pool), None)
    }

    /// The connection; none after a cut one could not be replaced (the
    /// pool gave no other: the server down, say), which fails every
    /// statement after it as the cut did.
    fn client(&self) -> Result<std::cell::RefMut<'_, Pooled>> {
        std::cell::RefMut::filter_map(self.client.borrow_mut(), Option::as_mut).map_err(|_| {
            Error::Io {
                kind: std::io::ErrorKind::NotConnected,
                message: "PostgreSQL: the connection was cut and no other could be had".into(),
            }
        })
    }

    /// Opens a deferred connection's transaction, ordered, before its first
    /// statement (and, after a lone append that made nothing, before a
    /// transaction of its own: see `Events::insert`); an owed one's, as it
    /// was made to begin ([`PgConn::owed`]).
    pub(super) fn begin_now(&self) -> Result<()> {
        let ordered = match self.begun.get() {
            Begun::Yes => return Ok(()),
            Begun::Owed { ordered } => ordered,
            _ => true,
        };
        let begin = if ordered { BEGIN_ORDERED } else { BEGIN_WRITE };
        let head = self.on_live_connection(|client| begin_on(client, begin, ordered));
        let head = self.owed_failed_if_err(head)?;
        self.begun_as(ordered, head);
        Ok(())
    }

    /// An owed transaction whose `BEGIN` failed is spoilt: nothing of its
    /// write may commit, whatever statements after it do (a closure that
    /// caught the failure gets [`Error::TransactionAborted`] at the
    /// commit), as when a `BEGIN` sent at once failed its whole write.
    fn owed_failed_if_err<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() && matches!(self.begun.get(), Begun::Owed { .. }) {
            self.aborted.set(true);
        }
        r
    }

    /// Notes the transaction begun (`ordered`: holding the head, read as
    /// `head`).
    fn begun_as(&self, ordered: bool, head: Option<i64>) {
        self.open.set(true);
        self.holds_head.set(ordered);
        self.head_at_begin.set(head.unwrap_or(0));
        self.begun.set(Begun::Yes);
    }

    /// Begins a deferred or owed connection's transaction with `sql`, the
    /// engine's transaction-control statements, in one round trip. A
    /// statement that fails on the server leaves the transaction open and
    /// aborted (as a failed savepoint after its own `BEGIN` would).
    fn begin_with_control(&self, sql: &str) -> Result<()> {
        let ordered = !matches!(self.begun.get(), Begun::Owed { ordered: false });
        let begin = if ordered { BEGIN_ORDERED } else { BEGIN_WRITE };
        let batch = format!("{begin}; {sql}");
        let sent = self.on_live_connection(|client| Ok(client.simple_query(&batch)?));
        let messages = match sent {
            Ok(messages) => messages,
            Err(e) => {
                if !matches!(e, Error::Io { .. }) {
                    // Open, and aborted: dropping it rolls back.
                    self.begun_as(false, None);
                }
                self.aborted.set(true);
                return Err(e);
            }
        };
        let head = head_in(&messages);
        self.begun_as(ordered, head);
        if ordered && head.is_none() {
            return Err(head_missing());
        }
        Ok(())
    }

    /// `f` on the connection; for a deferred or owed one, again on another
    /// from its pool while the server had cut the one it holds (up to the
    /// pool's size and one more, as `PgDb::begin` does). `f` must be safe
    /// to run twice: it fails before it changed anything, or is made once
    /// by an id.
    pub(super) fn on_live_connection<T>(
        &self,
        mut f: impl FnMut(&mut Pooled) -> Result<T>,
    ) -> Result<T> {
        let Some(pool) = &self.pool else {
            return f(&mut *self.client()?);
        };
        let mut tries = pool.max_size() + 1;
        loop {
            match f(&mut *self.client()?) {
                Err(Error::Io { .. }) if tries > 1 => tries -= 1,
                other => return other,
            }
            self.resent.set(true);
            // The cut one back to the pool first (which drops it as
            // broken): a pool of one has no other to give.
            drop(self.client.borrow_mut().take());
            *self.client.borrow_mut() = Some(pool.get()?);
        }
    }

    /// Whether a statement of this connection was sent again after the
    /// server cut the connection: a lone statement's first try may have
    /// committed and notified, and its answer then says the run or event
    /// was there already. Its engine wakes its own threads for it all the
    /// same, as its listener passes over the notification (a statement
    /// that failed in the end wakes no one: the heartbeat does).
    pub(crate) fn was_resent(&self) -> bool {
        self.resent.get()
    }

    /// The notification a deferred connection's lone append carries.
    pub(super) fn lone_notify(&self) -> Option<(&str, &str)> {
        self.lone_notify.as_ref().map(|(c, p)| (&**c, &**p))
    }

    /// `begin` opens the transaction; `holds_head` says it also takes the
    /// head row's lock, held to the end.
    fn begin_with(mut client: Pooled, begin: &str, holds_head: bool) -> Result<PgConn> {
        let head = begin_on(&mut client, begin, holds_head)?;
        let conn = PgConn::outside(client, Begun::Yes, None, None);
        conn.open.set(true);
        conn.holds_head.set(holds_head);
        conn.head_at_begin.set(head.unwrap_or(0));
        Ok(conn)
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

    /// Commits the transaction with a notification on `channel` whose
    /// payload says what the commit made and who made it (both the
    /// engine's own words, not the caller's: `core::postgres::listen::Notices`),
    /// delivered to listeners with the commit.
    pub(crate) fn commit_notifying(self, channel: &str, payload: &str) -> Result<()> {
        debug_assert!(is_plain(channel) && is_plain(payload));
        self.finish(Some((channel, payload)))
    }

    /// The commit, in one round trip: the head row moved to the last seq
    /// appended (if any), the notification (if any), `COMMIT`. If a
    /// statement fails, the rest are not run, and dropping the connection
    /// rolls back.
    fn finish(self, notify: Option<(&str, &str)>) -> Result<()> {
        if self.aborted.get() && matches!(self.begun.get(), Begun::Owed { .. }) {
            return Err(Error::TransactionAborted {
                detail: "this write's BEGIN failed; nothing of it was committed".into(),
            });
        }
        if self.begun.get() != Begun::Yes {
            // Nothing open: a lone append committed itself, with its
            // notification (or made nothing). A notification it did not
            // carry goes alone (a transaction that only notifies waits for
            // no flush).
            let carried = match self.begun.get() {
                Begun::Alone => self.lone_notify(),
                _ => None,
            };
            if let Some((channel, payload)) = notify
                && matches!(self.begun.get(), Begun::Alone | Begun::Owed { .. })
                && carried != Some((channel, payload))
            {
                self.client()?
                    .batch_execute(&format!("NOTIFY {channel}, '{payload}'"))?;
            }
            return Ok(());
        }
        if self.aborted.get() {
            // Dropping `self` rolls back.
            return Err(Error::TransactionAborted {
                detail: "a statement of this write failed on the server, which aborted the \
                         transaction; nothing of it was committed"
                    .into(),
            });
        }
        let mut sql = self.take_owed_releases();
        self.take_bumps_into(&mut sql);
        let last = self.last_seq.get();
        if last > 0 {
            sql.push_str(&format!(
                "UPDATE reflexr_head SET seq = greatest(seq, {last}); "
            ));
        }
        if let Some((channel, payload)) = notify {
            sql.push_str(&format!("NOTIFY {channel}, '{payload}'; "));
        }
        sql.push_str("COMMIT");
        self.client()?.batch_execute(&sql)?;
        self.open.set(false);
        Ok(())
    }

    /// The highest seq this transaction appended so far (0: none).
    pub(crate) fn last_seq(&self) -> i64 {
        self.last_seq.get()
    }

    /// What the transaction keeps besides its rows, for a savepoint made
    /// now: see [`PgConn::rollback_to`].
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            seq: self.last_seq.get(),
        }
    }

    /// Runs the engine's own transaction-control statements (savepoints),
    /// in one round trip, after what is owed: the releases (see
    /// [`PgConn::release_nested`]) and the counters' bumps (a savepoint is
    /// made with none owed, so a rollback to it drops exactly the bumps
    /// owed then: see [`PgConn::rollback_to`]).
    pub(crate) fn control(&self, sql: &str) -> Result<()> {
        if matches!(self.begun.get(), Begun::NotYet | Begun::Owed { .. }) {
            // The first statement: with the BEGIN (nothing is owed yet).
            self.refuse_on_reads()?;
            return self.begin_with_control(sql);
        }
        self.ensure_begun_to_write()?;
        let mut batch = self.take_owed_releases();
        self.take_bumps_into(&mut batch);
        batch.push_str(sql);
        let r = self.client()?.batch_execute(&batch);
        self.note(r)
    }

    /// Releases the engine's nested savepoint ([`NESTED`]), the newest of
    /// that name: owed, and sent with the next transaction-control
    /// statements or the commit, where it costs no round trip of its own.
    /// Until then the savepoint stays open, which changes nothing: a
    /// rollback to a savepoint made before it undoes it with the rest (see
    /// [`PgConn::rollback_to`]), the commit releases it first, and the
    /// caller's own SQL is sent after the releases owed, so its savepoints
    /// are never made inside one. In a transaction a failed statement
    /// aborted, the release is sent at once, and fails as it would have.
    pub(crate) fn release_nested(&self) -> Result<()> {
        self.owed_releases.set(self.owed_releases.get() + 1);
        if self.aborted.get() {
            return self.control("");
        }
        Ok(())
    }

    /// The owed releases of [`NESTED`] as SQL (empty when none), no longer
    /// owed.
    fn take_owed_releases(&self) -> String {
        let n = self.owed_releases.replace(0);
        format!("RELEASE SAVEPOINT {NESTED}; ").repeat(n as usize)
    }

    /// Rolls back to the engine's savepoint `name`, and forgets what was
    /// kept since `mark` ([`PgConn::mark`] when it was made): the seqs taken
    /// (so the next append does not leave a gap) and the counters' bumps
    /// owed.
    ///
    /// The savepoints whose releases are owed were made after `name` (the
    /// statement that made `name` sent every release owed before it, and
    /// savepoints nest), so the rollback undoes them. For [`NESTED`], whose
    /// newest of that name is one of them, the rollback goes to each in
    /// turn and releases it, then to `name`'s own; a release cannot go
    /// first, since a transaction a failed statement aborted takes nothing
    /// but a rollback.
    pub(crate) fn rollback_to(&self, name: &str, mark: Mark) -> Result<()> {
        self.ensure_begun_to_write()?;
        let owed = self.owed_releases.replace(0);
        let mut sql = format!("ROLLBACK TO SAVEPOINT {name}");
        if name == NESTED {
            for _ in 0..owed {
                sql.push_str(&format!(
                    "; RELEASE SAVEPOINT {NESTED}; ROLLBACK TO SAVEPOINT {NESTED}"
                ));
            }
        }
        let r = self.client()?.batch_execute(&sql);
        self.note(r)?;
        self.last_seq.set(mark.seq);
        // The bumps owed were made since the savepoint (none was owed when
        // it was made): dropped. Those sent since, the server's rollback
        // undid.
        self.bumps.borrow_mut().clear();
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
        self.send_owed()?;
        let r = self.client()?.query(sql, params);
        self.note(r)
    }

    /// [`PgConn::query_untyped`] for a statement whose rows are not wanted:
    /// the number of rows it changed.
    pub(crate) fn execute_untyped(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        guard::refuse_transaction_control(sql)?;
        self.send_owed()?;
        let r = self.client()?.execute(sql, params);
        self.note(r)
    }

    /// Before the caller's own SQL, what the engine owes is sent: the
    /// releases of its savepoints (a savepoint of the caller's is then
    /// never made inside one of the engine's it would release) and the
    /// counters' bumps (a rollback to a savepoint of the caller's then
    /// undoes those made after it, and only those); and the transaction is
    /// begun.
    /// In a transaction a failed statement aborted, nothing is sent first
    /// (it would fail): the caller's statement may be its rollback to a
    /// savepoint of its own, made after every owed one was (the caller's
    /// statement that made it sent them), and the write cannot commit.
    pub(super) fn send_owed(&self) -> Result<()> {
        if self.aborted.get() {
            return self.ensure_begun_to_write();
        }
        if self.owed_releases.get() > 0 || !self.bumps.borrow().is_empty() {
            return self.control("");
        }
        self.ensure_begun_to_write()
    }

    /// A deferred connection's first statement begins its transaction
    /// (after a lone append, what follows runs outside one: see
    /// [`Begun::Alone`]).
    pub(super) fn ensure_begun(&self) -> Result<()> {
        if matches!(self.begun.get(), Begun::NotYet | Begun::Owed { .. }) {
            self.begin_now()?;
        }
        Ok(())
    }

    /// [`PgConn::ensure_begun`] for what may write (the caller's SQL, a
    /// savepoint): never after a lone append committed itself, which the
    /// single append's contract rules out.
    fn ensure_begun_to_write(&self) -> Result<()> {
        debug_assert!(
            self.begun.get() != Begun::Alone,
            "a write after a lone append committed itself"
        );
        self.refuse_on_reads()?;
        self.ensure_begun()
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>> {
        self.ensure_begun()?;
        let r = self.client()?.query_prepared(sql, params);
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
            if let Some(client) = self.client.get_mut() {
                let _ = client.batch_execute("ROLLBACK");
            }
        }
    }
}

/// A column of a row, its decoding failure a typed error.
pub(super) fn col<'r, T: postgres::types::FromSql<'r>>(row: &'r Row, i: usize) -> Result<T> {
    row.try_get(i).map_err(Error::from)
}

/// A page size as PostgreSQL's LIMIT takes it.
pub(super) fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::PgConn;
    use crate::store::Events;
    use crate::store::conformance::PgSchema;

    /// DESIGN.md, Threads (wake-ups across processes): a schema's channel
    /// is its name when that is a plain identifier that fits, else a hash
    /// of the name, the same in every process; never a name the SQL would
    /// fold or need quoted.
    #[test]
    fn a_schemas_channel_is_its_plain_name_or_a_stable_hash_of_it() {
        use super::{channel_of, is_plain};
        assert_eq!(channel_of("public"), "reflexr_public");
        assert_eq!(channel_of("tenant_7"), "reflexr_tenant_7");
        let upper = channel_of("Tenant7");
        let long = channel_of(&"s".repeat(60));
        let odd = channel_of("a b\"c");
        for c in [&upper, &long, &odd] {
            assert!(is_plain(c) && c.len() == "reflexr_".len() + 16, "{c}");
        }
        assert_ne!(upper, channel_of("tenant7"));
        assert_ne!(upper, long);
        // The hash is SHA-1's (UUID v5), not the standard library's hasher,
        // which may change between builds: pinned here (Python's
        // `uuid.uuid5` gives the same).
        assert_eq!(upper, "reflexr_6fd783be0f1d5c6c");
        assert_eq!(channel_of(""), channel_of(""));
        assert!(channel_of(&"s".repeat(55)).ends_with(&"s".repeat(55)));
    }

    /// The total of `counter` as a fresh transaction reads it.
    fn total(pool: &super::Pool, counter: crate::base::counter::Counter) -> i64 {
        use crate::store::Counters;
        let conn = PgConn::begin_as(pool.get().unwrap(), true).unwrap();
        let all = Counters::all(&conn).unwrap();
        all.iter()
            .find(|(c, _)| *c == counter)
            .map_or(0, |(_, v)| *v)
    }

    /// DESIGN.md invariant 2 (together or not at all), at the engine's
    /// savepoints: a release owed (sent with the next control statement or
    /// the commit) leaves the inner savepoint open, and a rollback of the
    /// outer one still undoes all the outer's work — the inner's included —
    /// and nothing before it.
    #[test]
    fn a_rollback_undoes_the_inner_savepoints_whose_releases_are_owed() {
        use super::NESTED;
        use crate::base::counter::Counter::{Decisions, Errored, Fired};
        use crate::store::Counters;
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        // Bumps sent as rows at once (the caller's SQL sends what is owed
        // first), so the server's savepoints decide what stays.
        let sent = |counter: crate::base::counter::Counter| {
            Counters::bump(&conn, counter, 1).unwrap();
            conn.execute_untyped("SELECT 1", &[]).unwrap();
        };
        sent(Decisions);
        let savepoint = || {
            conn.control(&format!("SAVEPOINT {NESTED}")).unwrap();
            conn.mark()
        };
        let outer = savepoint();
        sent(Fired);
        let _inner = savepoint();
        sent(Fired);
        let _innermost = savepoint();
        sent(Fired);
        conn.release_nested().unwrap();
        conn.release_nested().unwrap();
        // The outer fails: two releases owed, rolled back past both.
        conn.rollback_to(NESTED, outer).unwrap();
        conn.release_nested().unwrap();
        // A sibling after it commits its work.
        let _sibling = savepoint();
        sent(Errored);
        conn.release_nested().unwrap();
        conn.commit().unwrap();
        assert_eq!(total(&pool, Decisions), 1);
        assert_eq!(
            total(&pool, Fired),
            0,
            "the outer's rollback undid its inner savepoints"
        );
        assert_eq!(total(&pool, Errored), 1);
    }

    /// DESIGN.md invariant 2, for the caller's own savepoints beside the
    /// engine's: what the engine owes (a release of its savepoint, bumps of
    /// its counters) is sent before the caller's SQL, so the caller's
    /// savepoint is not made inside the engine's one it would release, and
    /// the caller's rollback undoes the bumps made after its savepoint, and
    /// only those.
    #[test]
    fn the_callers_savepoints_keep_their_meaning_beside_what_the_engine_owes() {
        use super::NESTED;
        use crate::base::counter::Counter::{Decisions, Fired};
        use crate::store::Counters;
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        conn.control(&format!("SAVEPOINT {NESTED}")).unwrap();
        Counters::bump(&conn, Decisions, 2).unwrap();
        conn.release_nested().unwrap();
        conn.execute_untyped("SAVEPOINT mine", &[]).unwrap();
        Counters::bump(&conn, Fired, 5).unwrap();
        // An engine savepoint inside the caller's, released.
        conn.control(&format!("SAVEPOINT {NESTED}")).unwrap();
        conn.release_nested().unwrap();
        conn.execute_untyped("ROLLBACK TO SAVEPOINT mine", &[])
            .unwrap();
        // The transaction's own bumps, read in it.
        let all = Counters::all(&conn).unwrap();
        assert!(
            all.contains(&(Decisions, 2)) && !all.iter().any(|(c, _)| *c == Fired),
            "{all:?}"
        );
        conn.execute_untyped("RELEASE SAVEPOINT mine", &[]).unwrap();
        conn.commit().unwrap();
        assert_eq!(total(&pool, Decisions), 2);
        assert_eq!(total(&pool, Fired), 0);
    }

    /// DESIGN.md invariant 4's totals: a counter's bump owed when its
    /// savepoint rolls back counts nothing; one owed from before the
    /// savepoint, and one made after the rollback, count at the commit.
    #[test]
    fn a_bump_owed_counts_only_if_its_savepoint_holds() {
        use super::NESTED;
        use crate::base::counter::Counter::{Decisions, Fired, RunsSucceeded};
        use crate::store::Counters;
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        Counters::bump(&conn, Decisions, 3).unwrap();
        conn.control(&format!("SAVEPOINT {NESTED}")).unwrap();
        let mark = conn.mark();
        Counters::bump_all(&conn, &[(Fired, 4), (Decisions, 1)]).unwrap();
        conn.rollback_to(NESTED, mark).unwrap();
        conn.release_nested().unwrap();
        Counters::bump(&conn, RunsSucceeded, 6).unwrap();
        conn.commit().unwrap();
        assert_eq!(total(&pool, Decisions), 3);
        assert_eq!(total(&pool, Fired), 0);
        assert_eq!(total(&pool, RunsSucceeded), 6);
    }

    /// DESIGN.md invariant 10 (a failure loses nothing and makes nothing
    /// twice) for an owed transaction: its `BEGIN` goes with its first
    /// savepoint, and on a connection the server cut while it sat in the
    /// pool both are sent again on another; the write then holds the head
    /// from that `BEGIN` and commits as any other.
    #[test]
    fn an_owed_begin_sent_with_its_savepoint_on_a_cut_connection_is_sent_again() {
        use super::NESTED;
        use crate::base::counter::Counter::Fired;
        use crate::store::Counters;
        let schema = PgSchema::new();
        drop(schema.pool(1));
        // Not tested on checkout, as the engine's pool (`PgDb::open`).
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .test_on_check_out(false)
            .build(super::Manager::new(schema.url().parse().unwrap()))
            .unwrap();
        // The pool's one connection, cut while it sits in the pool.
        let conn = PgConn::begin_as(pool.get().unwrap(), true).unwrap();
        let pid: i32 = conn.query_untyped("SELECT pg_backend_pid()", &[]).unwrap()[0].get(0);
        conn.commit().unwrap();
        let mut admin = postgres::Client::connect(&schema.url(), postgres::NoTls).unwrap();
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .unwrap();
        while admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .unwrap()
            .get::<_, i64>(0)
            > 0
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let conn = PgConn::owed(pool.get().unwrap(), pool.clone(), true);
        assert!(!conn.was_resent());
        conn.control(&format!("SAVEPOINT {NESTED}"))
            .expect("sent again on a new connection");
        // What its engine reads to wake its own threads for a lone
        // statement whose first try may have committed.
        assert!(conn.was_resent());
        let now: i32 = conn.query_untyped("SELECT pg_backend_pid()", &[]).unwrap()[0].get(0);
        assert_ne!(now, pid, "another connection");
        assert!(conn.holds_head.get(), "begun ordered");
        assert_eq!(Events::head(&conn).unwrap(), 0);
        Counters::bump(&conn, Fired, 2).unwrap();
        conn.release_nested().unwrap();
        conn.commit().unwrap();
        assert_eq!(total(&pool, Fired), 2);
    }

    /// DESIGN.md invariant 2 (together or not at all) for an owed
    /// transaction whose `BEGIN` failed (the head's lock met a
    /// `lock_timeout`): a closure that caught the failure and wrote on
    /// commits nothing of it, as when a `BEGIN` sent at once failed.
    #[test]
    fn a_write_whose_owed_begin_failed_commits_nothing() {
        let schema = PgSchema::new();
        let pool = schema.pool(2);
        // Another transaction holds the head.
        let holder = PgConn::begin_ordered(pool.get().unwrap()).unwrap();
        let mut client = pool.get().unwrap();
        client.batch_execute("SET lock_timeout = '50ms'").unwrap();
        let conn = PgConn::owed(client, pool.clone(), true);
        assert!(
            Events::subject_version(&conn, "ws", "a").is_err(),
            "the head is held"
        );
        drop(holder);
        // The closure goes on: its statement runs, and the commit refuses.
        conn.execute_untyped(
            "INSERT INTO reflexr_counters (name, value) VALUES ('fired', 1)",
            &[],
        )
        .unwrap();
        let committed = conn.commit();
        assert!(
            matches!(committed, Err(crate::Error::TransactionAborted { .. })),
            "{committed:?}"
        );
        assert_eq!(total(&pool, crate::base::counter::Counter::Fired), 0);
    }

    /// DESIGN.md invariant 2 (together or not at all) for an owed
    /// transaction whose first statement is an append: the append begins
    /// the transaction (it is not sent as its own, as a deferred
    /// connection's lone append is), so a write that does not commit keeps
    /// nothing of it.
    #[test]
    fn an_append_first_in_an_owed_transaction_commits_only_with_it() {
        use crate::base::event::NewEvent;
        use crate::core::changelog::{self, Origin};
        use crate::core::settings::Limits;
        use crate::core::workspace;
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        workspace::create(&conn, 0, "ws").unwrap();
        workspace::register_types(&conn, 0, "ws", &["Opened"]).unwrap();
        conn.commit().unwrap();
        for ordered in [true, false] {
            let conn = PgConn::owed(pool.get().unwrap(), pool.clone(), ordered);
            let id = format!("e-{ordered}");
            let ev = NewEvent::new("Opened", "a", "tester", 0).id(id.clone());
            let limits = Limits {
                max_payload_bytes: 1024,
                max_chain_depth: 16,
            };
            changelog::append(&conn, 0, limits, "ws", &ev, Origin::App, None).unwrap();
            // Dropped uncommitted: rolled back.
            drop(conn);
            let conn = PgConn::reads(pool.get().unwrap());
            assert_eq!(
                Events::seq_of(&conn, "ws", &id).unwrap(),
                None,
                "ordered: {ordered}"
            );
        }
    }

    /// The engine's statements prepared on this connection (the look-up,
    /// prepared while it runs, left out).
    fn prepared(conn: &PgConn) -> Vec<String> {
        conn.query_untyped(
            "SELECT statement FROM pg_prepared_statements \
             WHERE statement NOT LIKE '%pg_prepared_statements%' ORDER BY statement",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    }

    #[test]
    fn an_engine_statement_is_prepared_once_per_connection_and_outlives_its_transaction() {
        // No invariant of its own: the statements kept per connection are
        // a cost, and what they must not change (every invariant on
        // PostgreSQL) the conformance suite and the `it` suite check. This
        // checks the keeping: one prepare, kept across a rollback.
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        assert!(prepared(&conn).is_empty());
        assert_eq!(Events::subject_version(&conn, "ws", "a").unwrap(), 0);
        assert_eq!(Events::subject_version(&conn, "ws", "b").unwrap(), 0);
        let once = prepared(&conn);
        assert_eq!(once.len(), 1, "{once:?}");
        assert!(once[0].contains("reflexr_subject_floors"), "{once:?}");
        // Rolled back (dropped): the statement stays with the connection,
        // and the next transaction on it runs it as prepared.
        drop(conn);
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        assert_eq!(Events::subject_version(&conn, "ws", "c").unwrap(), 0);
        assert_eq!(prepared(&conn), once);
        conn.commit().unwrap();
    }

    /// No invariant of its own (the conformance suite checks what the
    /// stands say): a pass's read of its rules' stands runs on a generic
    /// plan the server keeps after its first executions on a connection,
    /// under its default `plan_cache_mode`, not one planned again for each
    /// run's names.
    #[test]
    fn a_passs_read_of_its_stands_keeps_a_generic_plan() {
        use crate::store::Control;
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = planning_as_by_default(&pool);
        for names in [&["a"][..], &["a", "b"], &["c"]].iter().cycle().take(9) {
            Control::stands(&conn, "ws", "rule", names).unwrap();
        }
        assert_plan_kept(&conn, "%reflexr_cursors c %");
        conn.commit().unwrap();
    }

    /// A write transaction under the server's default `plan_cache_mode`,
    /// whatever the test server's setting.
    fn planning_as_by_default(pool: &super::Pool) -> PgConn {
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        conn.execute_untyped("SET LOCAL plan_cache_mode = auto", &[])
            .unwrap();
        conn
    }

    /// The statement prepared on `conn` whose text is `LIKE` the pattern
    /// was run on a generic plan the server kept at least once.
    fn assert_plan_kept(conn: &PgConn, like: &str) {
        let plans = conn
            .query_untyped(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
                 WHERE statement LIKE $1 AND statement NOT LIKE '%pg_prepared_statements%'",
                &[&like],
            )
            .unwrap();
        assert_eq!(plans.len(), 1, "{like}");
        let (generic, custom): (i64, i64) = (plans[0].get(0), plans[0].get(1));
        assert!(generic > 0, "{like}: {generic} generic, {custom} custom");
    }

    /// No invariant of its own (the conformance suite checks what the
    /// plan says): the claims' read of their plan, made at every claim and
    /// settlement, runs on a generic plan the server keeps after its first
    /// executions on a connection, under its default `plan_cache_mode`,
    /// not one planned again for each executor's actions.
    #[test]
    fn the_claims_read_of_their_plan_keeps_a_generic_plan() {
        use crate::store::Control;
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = planning_as_by_default(&pool);
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (i, actions) in [names(&["a"]), names(&["a", "b"]), names(&["c"])]
            .iter()
            .cycle()
            .take(9)
            .enumerate()
        {
            Control::claim_plan(&conn, 1_000 + i as i64, actions).unwrap();
        }
        assert_plan_kept(&conn, "%WITH RECURSIVE limited%");
        conn.commit().unwrap();
    }

    /// DESIGN.md invariant 10: the engine's connection for reads runs
    /// outside any transaction block and writes nothing: an append, a
    /// savepoint or the caller's SQL on it is refused before it is sent,
    /// and reads on it work.
    #[test]
    fn the_connection_for_reads_refuses_writes_before_sending_them() {
        use crate::store::events::NewRow;
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = PgConn::reads(pool.get().unwrap());
        assert_eq!(Events::subject_version(&conn, "ws", "a").unwrap(), 0);
        let row = NewRow {
            workspace: "ws",
            id: "e-1",
            event_type: "Opened",
            subject: "a",
            version: None,
            actor: "tester",
            occurred_at: 0,
            recorded_at: 0,
            payload: "{}",
            causation_id: None,
            correlation_id: None,
            depth: 0,
            traceparent: None,
        };
        let refused = [
            Events::insert(&conn, &row).map(|_| ()),
            conn.control("SAVEPOINT reflexr_nested"),
            conn.execute_untyped("DELETE FROM reflexr_events", &[])
                .map(|_| ()),
        ];
        for r in refused {
            assert!(matches!(r, Err(crate::Error::ReadOnly { .. })), "{r:?}");
        }
        // Nothing was written, and the connection still reads.
        assert_eq!(Events::seq_of(&conn, "ws", "e-1").unwrap(), None);
    }
}
