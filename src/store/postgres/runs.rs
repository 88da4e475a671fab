//! The work queue on PostgreSQL: `reflexr_runs` and `reflexr_lanes`, as
//! `store::runs` has them on SQLite.
//!
//! What differs: many processes claim at once. A claim picks its runs in a
//! `MATERIALIZED` CTE with `FOR UPDATE SKIP LOCKED` — the rows another
//! claimer holds are passed over, never waited for, and the limit holds
//! because the CTE runs once — then marks them running; a run another
//! claimer took and committed meanwhile fails the recheck of `state =
//! 'ready'` on its new version. And nothing here relies on a statement
//! failing (that would abort the transaction): an insert that races
//! another for an id or a uniqueness key does nothing and says so.
//!
//! A statement that names one run, by its id or its position, and tests
//! its state spells that test in the `"C"` collation (`state = 'running'
//! COLLATE "C"`): the same test for these ASCII states, but one no partial
//! index's predicate (`WHERE state = 'running'`, in the database's
//! collation) is proven from. On a table without statistics the planner
//! otherwise read one run through the partial index of its state, passing
//! over every run in that state; this way the run is read by its key. A
//! statement that names a batch's positions hands them to the planner
//! through `positions!` (below), and the batch's settlement does both.

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::{Error, Result};
use crate::store::runs::{COLUMNS, Inserted, NewRun, Requeued, RunRow, Uniq, YIELD_KEY, ms};
use crate::store::{Batched, one_by_one};
use crate::store::{Lanes, Runs};

/// The `SET` term for a run that ended and is made pending again (an
/// operator's retry or reset): a run that ended before its action became
/// keyed gets its key now, so a fair claim (which reads only keyed runs)
/// finds it.
const KEY_AGAIN: &str = "flow_key = coalesce(flow_key, \
       (SELECT CASE WHEN a.fair OR a.key_path IS NOT NULL \
                    THEN coalesce(reflexr_runs.input::jsonb #>> a.key_path, '') END \
        FROM reflexr_actions a WHERE a.action = reflexr_runs.action))";

pub(super) fn run_from(r: &Row) -> Result<RunRow> {
    run_from_at(r, 0)
}

/// A run from `r`'s columns from the `at`-th on ([`COLUMNS`]' order).
pub(super) fn run_from_at(r: &Row, at: usize) -> Result<RunRow> {
    Ok(RunRow {
        ord: col(r, at)?,
        id: col(r, at + 1)?,
        kind: col(r, at + 2)?,
        action: col(r, at + 3)?,
        workspace: col(r, at + 4)?,
        rule: col(r, at + 5)?,
        scope: col(r, at + 6)?,
        lane: col(r, at + 7)?,
        on_dead_letter: col(r, at + 8)?,
        input: col(r, at + 9)?,
        event_seq: col(r, at + 10)?,
        event_id: col(r, at + 11)?,
        depth: col(r, at + 12)?,
        state: col(r, at + 13)?,
        attempt: col(r, at + 14)?,
        max_attempts: col(r, at + 15)?,
        backoff_ms: col(r, at + 16)?,
        backoff_max_ms: col(r, at + 17)?,
        backoff_factor: col(r, at + 18)?,
        jitter: col(r, at + 19)?,
        due_at: col(r, at + 20)?,
        claimed_by: col(r, at + 21)?,
        claim_expires_at: col(r, at + 22)?,
        checkpoint: col(r, at + 23)?,
        last_error: col(r, at + 24)?,
        created_at: col(r, at + 25)?,
        updated_at: col(r, at + 26)?,
        finished_at: col(r, at + 27)?,
        priority: col(r, at + 28)?,
        unique_key: col(r, at + 29)?,
        unique_mode: col(r, at + 30)?,
        started_at: col(r, at + 31)?,
        cancel_requested_at: col(r, at + 32)?,
        cancelled_by: col(r, at + 33)?,
        cancel_reason: col(r, at + 34)?,
        output: col(r, at + 35)?,
        parent: col(r, at + 36)?,
        began_seq: col(r, at + 37)?,
        flow_key: col(r, at + 38)?,
        traceparent: col(r, at + 39)?,
    })
}

/// A run's columns qualified by the alias `r`, for statements that join.
fn qualified_columns() -> String {
    COLUMNS
        .split(',')
        .map(|c| format!("r.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The claim's statement, built once: its columns are qualified by the
/// table's alias, since it joins.
static CLAIM_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let columns = qualified_columns();
    format!(
        "WITH picked AS MATERIALIZED ( \
           SELECT ord FROM reflexr_runs \
           WHERE state = 'ready' AND priority = $5 AND due_at <= $2 \
             AND action = ANY ($4) \
           ORDER BY due_at LIMIT $6 \
           FOR UPDATE SKIP LOCKED) \
         UPDATE reflexr_runs r SET state = 'running', attempt = r.attempt + 1, \
           claimed_by = $1, claim_expires_at = $3, updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint, started_at = $2, \
           began_seq = coalesce(r.began_seq, (SELECT max(seq) FROM reflexr_events), 0) \
         FROM picked WHERE r.ord = picked.ord AND r.state = 'ready' \
         RETURNING {columns}"
    )
});

/// An array of positions (`bigint[]`) as the value of a subquery run once
/// before the statement (an InitPlan), so that a plan made for the
/// parameter's value counts as few positions as a generic plan does and
/// reads them through the primary key, whatever the table's statistics
/// say; the executor still looks up every position given.
macro_rules! positions {
    ($param:literal) => {
        concat!("((SELECT ", $param, "::bigint[])::bigint[])")
    };
}

/// A batch's settlement of its plain successes
/// ([`Runs::succeed_many`](crate::store::Runs::succeed_many)): `$1` the
/// holder, `$2` the claims' positions, `$3` their attempts, `$4` the time.
///
/// The rows are locked in id order first (bytewise, as the renewer sorts
/// them), so a settlement and a renewal of overlapping claims never wait
/// for each other in a circle. They are read by their positions (the
/// claims say them) through the primary key, with no join for the planner
/// to order, and each row's attempt is looked up in the arrays. Nothing in
/// the statement is a condition the index of running runs could answer:
/// the state test is spelled in the "C" collation, which that partial
/// index's predicate (`state = 'running'` in the database's collation) is
/// not proven from. The planner, whose statistics lag behind busy
/// executors (it thinks few runs are running, and none by this holder),
/// chose that index, or a scan of the table, and joined what it read with
/// the claims' list row by row: 26 to 90 ms for a settlement of 256 under
/// four busy processes (`auto_explain`), 0.6 ms through the key. The
/// positions reach the planner as a subquery's value (`positions!`), not
/// as the array itself: a plan made for the array's 256 positions — the
/// server's first five executions of a statement on each connection, and
/// every one while its generic plan costs more — costed 256 seeks above a
/// read of a table of 20,000 runs whose statistics were not yet gathered,
/// and read the table (6 ms against 0.7). Once locked, a row cannot change
/// before this commits, so the update tests nothing more.
pub(crate) const SUCCEED_MANY: &str = concat!(
    "WITH locked AS ( \
       SELECT r.ord FROM reflexr_runs r \
       WHERE r.ord = ANY ",
    positions!("$2"),
    " \
         AND r.attempt = ($3::bigint[])[array_position($2::bigint[], r.ord)] \
         AND r.state = 'running' COLLATE \"C\" AND r.claimed_by = $1 \
         AND r.cancel_requested_at IS NULL \
       ORDER BY r.id COLLATE \"C\" FOR UPDATE OF r) \
     UPDATE reflexr_runs r SET state = 'succeeded', finished_at = $4, updated_at = $4, \
       changed_tx = pg_current_xact_id()::text::bigint, \
       claimed_by = NULL, claim_expires_at = NULL \
     FROM locked WHERE r.ord = locked.ord RETURNING r.id"
);

/// The claim of runs picked by position (a partitioned action's, whose
/// limits chose them): those another claimer holds are passed over.
pub(crate) static CLAIM_PICKED_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let columns = qualified_columns();
    format!(
        "WITH picked AS MATERIALIZED ( \
           SELECT ord FROM reflexr_runs WHERE ord = ANY {} AND state = 'ready' \
           FOR UPDATE SKIP LOCKED) \
         UPDATE reflexr_runs r SET state = 'running', attempt = r.attempt + 1, \
           claimed_by = $1, claim_expires_at = $3, updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint, started_at = $2, \
           began_seq = coalesce(r.began_seq, (SELECT max(seq) FROM reflexr_events), 0) \
         FROM picked WHERE r.ord = picked.ord AND r.state = 'ready' \
         RETURNING {columns}",
        positions!("$4")
    )
});

/// [`Control::claim_fresh`](crate::store::Control::claim_fresh)'s
/// statement: the run by its id, which no other transaction can hold (this
/// one inserted it), in one round trip.
pub(crate) static CLAIM_FRESH_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("UPDATE reflexr_runs {CLAIM_FRESH} RETURNING {COLUMNS}"));

/// The claim of the ready run `$4` under holder `$1` at `$2` until `$3`
/// (an `UPDATE`'s `SET` and `WHERE`).
const CLAIM_FRESH: &str = "SET state = 'running', attempt = attempt + 1, \
       claimed_by = $1, claim_expires_at = $3, updated_at = $2, \
       changed_tx = pg_current_xact_id()::text::bigint, started_at = $2, \
       began_seq = coalesce(began_seq, (SELECT max(seq) FROM reflexr_events), 0) \
     WHERE id = $4 AND state = 'ready' COLLATE \"C\"";

/// The hand-over of a run just inserted ([`CLAIM_FRESH_SQL`]'s claim, `$5`
/// its action), made only if the action is neither paused nor limited:
/// one row, whether it may (`may`), then the claimed run's columns (null
/// when it was not claimed).
pub(crate) static HAND_OVER_FRESH_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        format!(
            "WITH may AS (SELECT {may} AS may), \
             claimed AS ( \
               UPDATE reflexr_runs {CLAIM_FRESH} AND (SELECT may FROM may) \
               RETURNING {COLUMNS}) \
             SELECT may.may, claimed.* FROM may LEFT JOIN claimed ON true",
            may = super::control::may_hand_over("$5"),
        )
    });

/// Of the runs with these ids, those asked to stop: read through the index
/// that holds only such runs (`reflexr_runs_cancelling`, schema version
/// 17), whose term the statement repeats.
pub(crate) const CANCEL_REQUESTED: &str =
    "SELECT id FROM reflexr_runs WHERE id = ANY ($1) AND cancel_requested_at IS NOT NULL";

/// The term that lets PostgreSQL read the runs neither ready nor running
/// through their partial index (`reflexr_runs_at_rest`), as the index's
/// `WHERE` spells it.
const AT_REST: &str = "state NOT IN ('ready', 'running')";

/// The term of the partial index that holds the runs in `state`.
fn state_term(state: &str) -> &'static str {
    match state {
        "ready" => "state = 'ready'",
        "running" => "state = 'running'",
        _ => AT_REST,
    }
}

/// A new run's priority: the one given (`$given`), else its action's
/// (`$action`), else 0.
macro_rules! priority_of {
    ($given:literal, $action:literal) => {
        concat!(
            "coalesce(",
            $given,
            ", (SELECT priority FROM reflexr_actions WHERE action = ",
            $action,
            "), 0)"
        )
    };
}

/// A new run's flow key: the one given (`$given`), else, for an action
/// that is fair or partitioned, what its key path reads in the input
/// (`$input`; '' where it reads nothing), else none.
macro_rules! flow_key_of {
    ($given:literal, $input:literal, $action:literal) => {
        concat!(
            "coalesce(",
            $given,
            ", (SELECT CASE WHEN fair OR key_path IS NOT NULL THEN coalesce(",
            $input,
            "::jsonb #>> key_path, '') END FROM reflexr_actions WHERE action = ",
            $action,
            "))"
        )
    };
}

/// How a new run enters its lane's row: a new lane's row is made with the
/// run its head; an existing lane's row is locked (the no-op update), so
/// its head's settlement cannot delete it until the run commits waiting
/// behind it (see `advance_lane`).
macro_rules! enter_lane {
    () => {
        "ON CONFLICT (lane) DO UPDATE SET updated_at = reflexr_lanes.updated_at"
    };
}

/// A run's insert, its row made by `$open … $close` around its values,
/// the state's among them `$state` (and, when given, the values `$more`
/// of the columns `$columns` after the others): `ON CONFLICT DO NOTHING`,
/// so an id (or a key) taken already inserts nothing and returns no row.
/// Its parameters are the 27 [`RunValues::params`] makes (and those
/// `$more` names after them).
macro_rules! insert_run {
    ($open:literal, $state:literal, $close:literal) => {
        concat!(insert_run!($open, $state, "", "", $close), " RETURNING 1")
    };
    ($open:literal, $state:literal, $columns:literal, $more:expr, $close:literal) => {
        concat!(
            "INSERT INTO reflexr_runs (id, kind, action, workspace, rule, scope, lane, \
               on_dead_letter, input, event_seq, event_id, depth, state, max_attempts, \
               backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, last_error, \
               created_at, updated_at, finished_at, priority, unique_key, unique_mode, parent, \
               flow_key, traceparent",
            $columns,
            ") ",
            $open,
            "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, ",
            $state,
            ", $14, $15, $16, \
               $17, $18, $19, $20, $21, $21, CASE WHEN $13 = 'dead' THEN $21 END, ",
            priority_of!("$22", "$3"),
            ", $23, $24, $25, ",
            flow_key_of!("$26", "$9", "$3"),
            ", $27",
            $more,
            $close,
            " ON CONFLICT DO NOTHING"
        )
    };
}

/// A run's insert: what [`Runs::insert`] sends once its lane and key are
/// settled, and [`PgConn::insert_run_alone`] inside its statement, in the
/// state `$13`.
const INSERT_RUN: &str = insert_run!("VALUES (", "$13", ")");

/// The head of a laned run's insert ([`INSERT_LANED_RUN`],
/// [`INSERT_LANED_RUN_HANDED`]): `gone`, the run `$1` if its id is there
/// already; `lane`, whether the run heads its lane `$7` — the lane's row
/// made with this run its head, or the lane's existing row locked
/// (`enter_lane!`) — none when the id was there.
macro_rules! enter_laned_run {
    () => {
        concat!(
            "WITH gone AS (SELECT 1 FROM reflexr_runs WHERE id = $1), \
                  lane AS (INSERT INTO reflexr_lanes (lane, head, blocked, updated_at) \
                           SELECT $7, $1, false, $21 WHERE NOT EXISTS (SELECT 1 FROM gone) ",
            enter_lane!(),
            " RETURNING head = $1 AS headed)"
        )
    };
}

/// A run that takes a lane and holds no key, inserted in one statement
/// (where three would look for its id, enter its lane, insert it): nothing
/// when its id is there already (`gone`); else the lane's row made with
/// this run its head, or the lane's existing row locked (`enter_lane!`);
/// and the run, `$13` (ready) at its lane's head,
/// waiting behind it otherwise. Returns whether the id was there, whether
/// the run heads its lane, and whether it was inserted (not, when another
/// transaction inserted the id meanwhile: the caller then gives up the
/// lane's head this statement made).
const INSERT_LANED_RUN: &str = concat!(
    enter_laned_run!(),
    ", ins AS (",
    insert_run!(
        "SELECT ",
        "CASE WHEN lane.headed THEN $13 ELSE 'waiting' END",
        " FROM lane"
    ),
    ") SELECT EXISTS (SELECT 1 FROM gone), coalesce((SELECT headed FROM lane), false), \
              EXISTS (SELECT 1 FROM ins)"
);

/// Whether the run [`insert_handed_sql`]'s statements insert is claimed at
/// its insert: at its lane's head (`lane.headed`; true for a run that takes
/// no lane), of an action that may be handed over (`may.may`).
macro_rules! handed {
    ($then:literal, $else:literal) => {
        concat!(
            "CASE WHEN lane.headed AND may.may THEN ",
            $then,
            " ELSE ",
            $else,
            " END"
        )
    };
}

/// A run's insert and its hand-over in one statement (where they were two
/// round trips), after `head`, the `WITH` that makes `gone` (the run's id
/// if it is there already) and `lane` (whether the run heads its lane):
/// the run, at its lane's head, of an action that may be handed over
/// ([`super::control::may_hand_over`] of `$3`), is inserted claimed under
/// holder `$28` until `$29` — as [`CLAIM_FRESH_SQL`] would claim it, with
/// its first attempt, its start and the log's head at its start. Returns
/// whether the id was there, whether the run heads its lane, whether it
/// was inserted, whether the action may be handed over, then the claimed
/// run's columns (null when it was not claimed). With `notify`, the
/// statement also sends the notification `$30`, `$31` (which wakes other
/// processes' executors) when it inserted a run it did not claim.
fn insert_handed_sql(head: &str, notify: bool) -> String {
    let insert = insert_run!(
        "SELECT ",
        "CASE WHEN NOT lane.headed THEN 'waiting' WHEN may.may THEN 'running' ELSE $13 END",
        ", attempt, claimed_by, claim_expires_at, started_at, began_seq",
        concat!(
            ", ",
            handed!("1", "0"),
            ", ",
            handed!("$28", "NULL"),
            ", ",
            handed!("$29::bigint", "NULL"),
            ", ",
            handed!("$21", "NULL"),
            ", ",
            handed!("coalesce((SELECT max(seq) FROM reflexr_events), 0)", "NULL"),
        ),
        " FROM lane, may"
    );
    // An uncorrelated subquery in a branch not taken is not run: the
    // notification is sent only for a run left for the claim.
    let notified = if notify {
        ", CASE WHEN EXISTS (SELECT 1 FROM ins WHERE state <> 'running') \
            THEN (SELECT 'sent' FROM pg_notify($30, $31)) END"
    } else {
        ""
    };
    format!(
        "{head}, may AS (SELECT {may} AS may), ins AS ({insert} RETURNING {COLUMNS}) \
         SELECT EXISTS (SELECT 1 FROM gone), coalesce((SELECT headed FROM lane), false), \
           EXISTS (SELECT 1 FROM ins), (SELECT may FROM may), claimed.*{notified} \
         FROM (SELECT 1) AS one \
         LEFT JOIN (SELECT * FROM ins WHERE state = 'running') AS claimed ON true",
        may = super::control::may_hand_over("$3"),
    )
}

/// [`INSERT_LANED_RUN`] and the run's hand-over in one statement
/// ([`insert_handed_sql`]).
pub(crate) static INSERT_LANED_RUN_HANDED: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| insert_handed_sql(enter_laned_run!(), false));

/// [`INSERT_RUN`] of a ready run that takes no lane and its hand-over in
/// one statement ([`insert_handed_sql`], [`NO_LANE`]).
pub(crate) static INSERT_RUN_HANDED: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| insert_handed_sql(NO_LANE, false));

/// [`INSERT_RUN_HANDED`] as its own transaction
/// ([`PgConn::insert_run_alone_handed`]), with the notification of a run
/// it did not claim.
static INSERT_RUN_HANDED_ALONE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| insert_handed_sql(NO_LANE, true));

/// [`insert_handed_sql`]'s head for a run that takes no lane: no look for
/// its id (the insert's `ON CONFLICT DO NOTHING` finds it), and it heads no
/// lane but is as ready as one that does.
const NO_LANE: &str = "WITH gone AS (SELECT 1 WHERE false), lane AS (SELECT true AS headed)";

/// [`PgConn::insert_run_alone`]'s statement: [`INSERT_RUN`], and the
/// notification that wakes other processes' executors, sent only if it
/// inserted.
static INSERT_RUN_ALONE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("WITH inserted AS ({INSERT_RUN}) SELECT pg_notify($28, $29) FROM inserted")
});

/// Runs that hold no key and are not dead, inserted in one statement
/// ([`Runs::insert_all`]): `$1`–`$23` their columns as arrays, in order.
/// A run whose id is there already (found through the ids' index) is not
/// inserted and enters no lane. Each lane the others take gets its row,
/// the first of them in order its head when the row is new (an existing
/// lane's row is locked, `enter_lane!`); a run
/// is `ready` with no lane or at its lane's head, `waiting` behind it
/// otherwise. The runs are inserted in order (their positions follow it),
/// `ON CONFLICT DO NOTHING`. Returns `('gone', id, NULL)` for each id
/// there, `('new', id, NULL)` for each run inserted and `('lane', head,
/// lane)` for each lane's row: a run neither, another transaction inserted
/// meanwhile, and the caller gives up the lane's row it made it the head
/// of.
pub(in crate::store) const INSERT_RUNS: &str = concat!(
    "WITH rows AS (SELECT * FROM unnest($1::text[], $2::text[], \
       $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], \
       $10::bigint[], $11::text[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], \
       $16::float8[], $17::float8[], $18::bigint[], $19::bigint[], $20::bigint[], $21::text[], \
       $22::text[], $23::text[]) \
     WITH ORDINALITY AS r (id, kind, action, workspace, rule, scope, lane, on_dead_letter, \
       input, event_seq, event_id, depth, max_attempts, backoff_ms, backoff_max_ms, \
       backoff_factor, jitter, due_at, now, priority, parent, flow_key, traceparent, ord)), \
   gone AS (SELECT id FROM reflexr_runs WHERE id = ANY ((SELECT $1::text[])::text[])), \
   fresh AS (SELECT * FROM rows WHERE id NOT IN (SELECT id FROM gone)), \
   lanes AS (INSERT INTO reflexr_lanes (lane, head, blocked, updated_at) \
             SELECT DISTINCT ON (lane) lane, id, false, now FROM fresh \
             WHERE lane IS NOT NULL ORDER BY lane, ord ",
    enter_lane!(),
    " RETURNING lane, head), \
   ins AS (INSERT INTO reflexr_runs (id, kind, action, workspace, rule, scope, lane, \
             on_dead_letter, input, event_seq, event_id, depth, state, max_attempts, \
             backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, created_at, \
             updated_at, priority, parent, flow_key, traceparent) \
           SELECT f.id, f.kind, f.action, f.workspace, f.rule, f.scope, f.lane, \
             f.on_dead_letter, f.input, f.event_seq, f.event_id, f.depth, \
             CASE WHEN f.lane IS NULL \
                    OR EXISTS (SELECT 1 FROM lanes l WHERE l.lane = f.lane AND l.head = f.id) \
                  THEN 'ready' ELSE 'waiting' END, \
             f.max_attempts, f.backoff_ms, f.backoff_max_ms, f.backoff_factor, f.jitter, \
             f.due_at, f.now, f.now, ",
    priority_of!("f.priority", "f.action"),
    ", f.parent, ",
    flow_key_of!("f.flow_key", "f.input", "f.action"),
    ", f.traceparent \
           FROM fresh f ORDER BY f.ord \
           ON CONFLICT DO NOTHING RETURNING id) \
   SELECT 'gone', id, NULL FROM gone UNION ALL SELECT 'new', id, NULL FROM ins \
   UNION ALL SELECT 'lane', head, lane FROM lanes"
);

/// What a run's insert computes from its [`NewRun`] before it is sent.
struct RunValues<'r> {
    lane: Option<&'r str>,
    state: &'static str,
    unique_key: Option<&'r str>,
    unique_mode: Option<&'r str>,
    error: Option<std::borrow::Cow<'r, str>>,
    max_attempts: i64,
    backoff_ms: i64,
    backoff_max_ms: i64,
}

impl<'r> RunValues<'r> {
    fn of(r: &NewRun<'r>, lane: Option<&'r str>, state: &'static str) -> RunValues<'r> {
        let (unique_key, unique_mode) = r
            .unique
            .map_or((None, None), |u| (Some(u.key), Some(u.mode)));
        RunValues {
            lane,
            state,
            unique_key,
            unique_mode,
            error: r.dead.map(crate::base::limits::clip_error),
            max_attempts: i64::from(r.retry.max_attempts),
            backoff_ms: ms(r.retry.initial),
            backoff_max_ms: ms(r.retry.max_delay),
        }
    }

    /// [`INSERT_RUN`]'s 27 parameters.
    fn params<'p>(&'p self, r: &'p NewRun<'_>) -> Vec<super::Param<'p>> {
        vec![
            (&r.id, Type::TEXT),
            (&r.kind, Type::TEXT),
            (&r.action, Type::TEXT),
            (&r.workspace, Type::TEXT),
            (&r.rule, Type::TEXT),
            (&r.scope, Type::TEXT),
            (&self.lane, Type::TEXT),
            (&r.on_dead_letter, Type::TEXT),
            (&r.input, Type::TEXT),
            (&r.event_seq, Type::INT8),
            (&r.event_id, Type::TEXT),
            (&r.depth, Type::INT8),
            (&self.state, Type::TEXT),
            (&self.max_attempts, Type::INT8),
            (&self.backoff_ms, Type::INT8),
            (&self.backoff_max_ms, Type::INT8),
            (&r.retry.factor, Type::FLOAT8),
            (&r.retry.jitter, Type::FLOAT8),
            (&r.due_at, Type::INT8),
            (&self.error, Type::TEXT),
            (&r.now, Type::INT8),
            (&r.priority, Type::INT8),
            (&self.unique_key, Type::TEXT),
            (&self.unique_mode, Type::TEXT),
            (&r.parent, Type::TEXT),
            (&r.key, Type::TEXT),
            (&r.traceparent, Type::TEXT),
        ]
    }
}

impl PgConn {
    /// Inserts a ready run that takes no lane and holds no key — one
    /// statement makes it — on a deferred connection ([`PgConn::deferred`]),
    /// outside any transaction block: the statement is its own transaction,
    /// so the run commits in one round trip (a write in a transaction takes
    /// three: its `BEGIN`, its statement, its `COMMIT`), with the
    /// connection's notification in the same commit when it inserted. An id
    /// already there inserts nothing: [`Inserted::Existed`]. Sent again on
    /// another connection when the server had cut this one: the id makes
    /// it once.
    pub(crate) fn insert_run_alone(&self, r: &NewRun<'_>) -> Result<Inserted> {
        let (rows, _) = self.send_alone(r, &INSERT_RUN_ALONE, Vec::new())?;
        Ok(if rows.is_empty() {
            Inserted::Existed
        } else {
            Inserted::New
        })
    }

    /// Sends `sql`, a statement that inserts a ready run that takes no
    /// lane and holds no key as its own transaction, on this deferred
    /// connection (again on another if the server had cut it): the run's
    /// values, then `more`, then the connection's notification. Its rows,
    /// and whether it was sent more than once.
    fn send_alone(
        &self,
        r: &NewRun<'_>,
        sql: &str,
        more: Vec<super::Param<'_>>,
    ) -> Result<(Vec<Row>, bool)> {
        debug_assert!(r.lane.is_none() && r.unique.is_none() && r.dead.is_none());
        if holds_nul(r.input) {
            return Err(nul_refused());
        }
        let notify = self.lone_notify().expect("a deferred connection");
        let values = RunValues::of(r, None, "ready");
        let mut params = values.params(r);
        params.extend(more);
        params.push((&notify.0, Type::TEXT));
        params.push((&notify.1, Type::TEXT));
        let mut sent = 0;
        let rows = self.on_live_connection(|client| {
            sent += 1;
            Ok(client.query_prepared(sql, &params)?)
        })?;
        Ok((rows, sent > 1))
    }

    /// [`PgConn::insert_run_alone`] with the run handed over at its insert
    /// ([`INSERT_RUN_HANDED_ALONE`]): claimed under `holder` until
    /// `expires_at` if its action may be handed, the notification sent
    /// only for a run inserted and not claimed; one round trip, its own
    /// commit. Sent again on another connection when the server had cut
    /// this one: the id makes it once. A run the first try inserted and
    /// claimed, whose answer the cut lost, is found then by its claim (this
    /// holder, this expiry, its first attempt, still running) and handed
    /// over as if the answer had come.
    pub(crate) fn insert_run_alone_handed(
        &self,
        r: &NewRun<'_>,
        holder: &str,
        expires_at: i64,
    ) -> Result<(Inserted, Option<RunRow>)> {
        let more: Vec<super::Param<'_>> = vec![(&holder, Type::TEXT), (&expires_at, Type::INT8)];
        let (rows, again) = self.send_alone(r, &INSERT_RUN_HANDED_ALONE, more)?;
        let row = rows
            .first()
            .ok_or_else(|| Error::invalid("hand-over", "no row"))?;
        if !col::<bool>(row, 2)? {
            if !again {
                return Ok((Inserted::Existed, None));
            }
            let mine = self.query_opt(
                &format!(
                    "SELECT {COLUMNS} FROM reflexr_runs WHERE id = $1 \
                       AND state = 'running' COLLATE \"C\" AND claimed_by = $2 \
                       AND claim_expires_at = $3 AND attempt = 1"
                ),
                &[
                    (&r.id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&expires_at, Type::INT8),
                ],
            )?;
            return Ok(match mine {
                Some(row) => (Inserted::New, Some(run_from(&row)?)),
                None => (Inserted::Existed, None),
            });
        }
        let claimed = match col::<Option<i64>>(row, 4)? {
            Some(_) => Some(run_from_at(row, 4)?),
            None => None,
        };
        Ok((Inserted::New, claimed))
    }
}

/// An input PostgreSQL's jsonb cannot hold, refused before it is sent.
fn nul_refused() -> Error {
    Error::invalid(
        "input",
        "holds the character U+0000 (\\u0000), which PostgreSQL's jsonb cannot hold",
    )
}

/// The first key of the advisory locks enqueues of one uniqueness key take
/// ("rfxu" in ASCII, as an int4).
const UNIQUE_LOCK: i32 = 0x7266_7875;

impl PgConn {
    /// Claims the ready runs at these positions (see [`CLAIM_PICKED_SQL`]).
    pub(super) fn claim_picked(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        ords: &[i64],
    ) -> Result<Vec<RunRow>> {
        let rows = self.query(
            &CLAIM_PICKED_SQL,
            &[
                (&holder, Type::TEXT),
                (&now, Type::INT8),
                (&expires_at, Type::INT8),
                (&ords, Type::INT8_ARRAY),
            ],
        )?;
        let mut claimed: Vec<RunRow> = rows.iter().map(run_from).collect::<Result<_>>()?;
        claimed.sort_by_key(|r| (r.due_at, r.ord));
        Ok(claimed)
    }

    /// [`Control::claim_fresh`](crate::store::Control::claim_fresh).
    pub(super) fn claim_fresh_row(
        &self,
        holder: &str,
        now: i64,
        expires_at: i64,
        id: &str,
    ) -> Result<Option<RunRow>> {
        self.query_opt(
            &CLAIM_FRESH_SQL,
            &[
                (&holder, Type::TEXT),
                (&now, Type::INT8),
                (&expires_at, Type::INT8),
                (&id, Type::TEXT),
            ],
        )?
        .as_ref()
        .map(run_from)
        .transpose()
    }

    /// [`Control::insert_handed_at_once`](crate::store::Control::insert_handed_at_once):
    /// a run that holds no key and is not dead, in one statement
    /// ([`INSERT_LANED_RUN_HANDED`], [`INSERT_RUN_HANDED`]); none other.
    pub(super) fn insert_handed_row(
        &self,
        r: &NewRun<'_>,
        holder: &str,
        expires_at: i64,
    ) -> Result<Option<(Inserted, bool, Option<RunRow>)>> {
        if r.unique.is_some() || r.dead.is_some() {
            return Ok(None);
        }
        if holds_nul(r.input) {
            return Err(nul_refused());
        }
        let values = RunValues::of(r, r.lane, "ready");
        let mut params = values.params(r);
        params.push((&holder, Type::TEXT));
        params.push((&expires_at, Type::INT8));
        let sql = match r.lane {
            Some(_) => &*INSERT_LANED_RUN_HANDED,
            None => &*INSERT_RUN_HANDED,
        };
        let row = self
            .query_opt(sql, &params)?
            .ok_or_else(|| Error::invalid("hand-over", "no row"))?;
        let (gone, headed, inserted, may): (bool, bool, bool, bool) =
            (col(&row, 0)?, col(&row, 1)?, col(&row, 2)?, col(&row, 3)?);
        if gone {
            return Ok(Some((Inserted::Existed, may, None)));
        }
        if !inserted {
            // Another transaction inserted this id first: give up the
            // lane's head this statement made.
            if let (true, Some(lane)) = (headed, r.lane) {
                self.give_up_lane(lane, r.id)?;
            }
            return Ok(Some((self.why_not_inserted(r)?, may, None)));
        }
        let claimed = match col::<Option<i64>>(&row, 4)? {
            Some(_) => Some(run_from_at(&row, 4)?),
            None => None,
        };
        Ok(Some((Inserted::New, may, claimed)))
    }

    /// Deletes `lane`'s row that an insert which then inserted nothing made
    /// with `id` its head — unless the run `id` is there in that lane: then
    /// another transaction inserted it first, with the lane's row, and this
    /// insert, which waited for that row, found it with `id` its head; it
    /// is that run's, and stays.
    fn give_up_lane(&self, lane: &str, id: &str) -> Result<()> {
        self.query(
            "DELETE FROM reflexr_lanes WHERE lane = $1 AND head = $2 \
               AND NOT EXISTS (SELECT 1 FROM reflexr_runs WHERE id = $2 AND lane = $1)",
            &[(&lane, Type::TEXT), (&id, Type::TEXT)],
        )?;
        Ok(())
    }

    fn run_exists(&self, id: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM reflexr_runs WHERE id = $1",
                &[(&id, Type::TEXT)],
            )?
            .is_some())
    }

    /// The run that holds `u`'s key for `action` now, if one does.
    fn holder_of_key(&self, action: &str, u: &Uniq<'_>, now: i64) -> Result<Option<String>> {
        let row = match u.mode {
            "period" => self.query_opt(
                "SELECT run_id FROM reflexr_unique_periods \
                 WHERE action = $1 AND key = $2 AND until > $3",
                &[
                    (&action, Type::TEXT),
                    (&u.key, Type::TEXT),
                    (&now, Type::INT8),
                ],
            )?,
            "pending" => self.query_opt(
                "SELECT id FROM reflexr_runs WHERE action = $1 AND unique_key = $2 \
                 AND unique_mode = 'pending' AND state IN ('waiting', 'ready')",
                &[(&action, Type::TEXT), (&u.key, Type::TEXT)],
            )?,
            _ => self.query_opt(
                "SELECT id FROM reflexr_runs WHERE action = $1 AND unique_key = $2 \
                 AND unique_mode = 'active' AND state IN ('waiting', 'ready', 'running')",
                &[(&action, Type::TEXT), (&u.key, Type::TEXT)],
            )?,
        };
        row.map(|r| col(&r, 0)).transpose()
    }

    /// Why an insert that raced another inserted nothing.
    fn why_not_inserted(&self, r: &NewRun<'_>) -> Result<Inserted> {
        if self.run_exists(r.id)? {
            return Ok(Inserted::Existed);
        }
        if let Some(u) = &r.unique
            && let Some(other) = self.holder_of_key(r.action, u, r.now)?
        {
            return Ok(Inserted::Duplicate(other));
        }
        Ok(Inserted::Existed)
    }
}

impl Runs for PgConn {
    fn hold_claim(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET updated_at = $4, \
                   changed_tx = pg_current_xact_id()::text::bigint \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                   AND cancel_requested_at IS NULL RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    fn suspend(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        due_at: i64,
        now: i64,
    ) -> Result<Requeued> {
        let row = self.query_opt(
            &format!(
                "UPDATE reflexr_runs SET state = 'ready', attempt = attempt - 1, due_at = $4, \
                   updated_at = $5, changed_tx = pg_current_xact_id()::text::bigint, \
                   claimed_by = NULL, claim_expires_at = NULL, {YIELD_KEY} \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                   AND cancel_requested_at IS NULL \
                 RETURNING state"
            ),
            &[
                (&id, Type::TEXT),
                (&holder, Type::TEXT),
                (&attempt, Type::INT8),
                (&due_at, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(Requeued::from_state(
            row.map(|r| col::<String>(&r, 0)).transpose()?,
        ))
    }

    fn wake(&self, id: &str, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET due_at = $2, updated_at = $2, \
                   changed_tx = pg_current_xact_id()::text::bigint \
                 WHERE id = $1 AND state = 'ready' COLLATE \"C\" AND due_at > $2 RETURNING 1",
                &[(&id, Type::TEXT), (&now, Type::INT8)],
            )?
            .is_some())
    }

    fn reopen(&self, id: &str, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                &format!(
                    "UPDATE reflexr_runs SET state = 'ready', attempt = 0, due_at = $2, \
                       updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint, \
                       finished_at = NULL, output = NULL, last_error = NULL, \
                       claimed_by = NULL, claim_expires_at = NULL, cancel_requested_at = NULL, \
                       cancelled_by = NULL, cancel_reason = NULL, {YIELD_KEY}, {KEY_AGAIN} \
                     WHERE id = $1 \
                       AND state IN ('ready', 'succeeded', 'dead', 'discarded', 'cancelled') \
                     RETURNING 1"
                ),
                &[(&id, Type::TEXT), (&now, Type::INT8)],
            )?
            .is_some())
    }

    fn set_output(&self, id: &str, holder: &str, attempt: i64, output: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET output = $4 \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                 RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&output, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn children(&self, parent: &str) -> Result<Vec<String>> {
        self.query(
            "SELECT id FROM reflexr_runs WHERE parent = $1 ORDER BY ord",
            &[(&parent, Type::TEXT)],
        )?
        .iter()
        .map(|r| col(r, 0))
        .collect()
    }

    fn debounce(
        &self,
        id: &str,
        input: &str,
        due_at: i64,
        max_wait_ms: Option<i64>,
        now: i64,
    ) -> Result<crate::store::runs::Debounced> {
        use crate::store::runs::Debounced;
        if self
            .query_opt(
                "UPDATE reflexr_runs SET input = $2, updated_at = $5, \
                   changed_tx = pg_current_xact_id()::text::bigint, \
                   due_at = least($3, coalesce(created_at + $4, $3)) \
                 WHERE id = $1 AND state COLLATE \"C\" IN ('waiting', 'ready') AND started_at IS NULL \
                 RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&input, Type::TEXT),
                    (&due_at, Type::INT8),
                    (&max_wait_ms, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some()
        {
            return Ok(Debounced::Folded);
        }
        let released = self
            .query_opt(
                "UPDATE reflexr_runs SET unique_key = NULL, updated_at = $2, \
                   changed_tx = pg_current_xact_id()::text::bigint \
                 WHERE id = $1 AND state COLLATE \"C\" IN ('waiting', 'ready') AND started_at IS NOT NULL \
                 RETURNING 1",
                &[(&id, Type::TEXT), (&now, Type::INT8)],
            )?
            .is_some();
        Ok(if released {
            Debounced::Released
        } else {
            Debounced::Gone
        })
    }

    fn lock_runs(&self, ids: &[String]) -> Result<()> {
        // One at a time, in the order given (the caller's lock order).
        for id in ids {
            self.query(
                "SELECT 1 FROM reflexr_runs WHERE id = $1 FOR UPDATE",
                &[(&id, Type::TEXT)],
            )?;
        }
        Ok(())
    }

    fn insert(&self, r: &NewRun<'_>) -> Result<Inserted> {
        // Claims of a partitioned action and the view's input filter read
        // inputs as jsonb, which cannot hold a NUL character: one such
        // input would fail every claim of its action. Refused here, before
        // anything is sent (an enqueue's typed error; a rule's firing
        // refused, as what the database cannot hold).
        if holds_nul(r.input) {
            return Err(nul_refused());
        }
        if let Some(u) = &r.unique {
            // Enqueues of one (action, key) take turns, so the holder read
            // below is the committed one (a period's key has no unique
            // index to fall back on).
            self.query(
                "SELECT pg_advisory_xact_lock($1, hashtext($2 || ' ' || $3))",
                &[
                    (&UNIQUE_LOCK, Type::INT4),
                    (&r.action, Type::TEXT),
                    (&u.key, Type::TEXT),
                ],
            )?;
        }
        // A lane and no key (a rule's firing, an ordered enqueue): one
        // statement (one round trip where three were).
        if let (Some(lane), None, None) = (r.lane, &r.unique, r.dead) {
            let values = RunValues::of(r, Some(lane), "ready");
            let rows = self.query(INSERT_LANED_RUN, &values.params(r))?;
            let (gone, headed, inserted): (bool, bool, bool) =
                (col(&rows[0], 0)?, col(&rows[0], 1)?, col(&rows[0], 2)?);
            if gone {
                return Ok(Inserted::Existed);
            }
            if !inserted {
                // Another transaction inserted this id first: give up the
                // lane's head this statement made.
                if headed {
                    self.give_up_lane(lane, r.id)?;
                }
                return self.why_not_inserted(r);
            }
            return Ok(Inserted::New);
        }
        // An id already there: found before a key is touched; without
        // one, the insert's `ON CONFLICT DO NOTHING` finds it (one round
        // trip fewer).
        if r.unique.is_some() && self.run_exists(r.id)? {
            return Ok(Inserted::Existed);
        }
        if let Some(u) = &r.unique
            && let Some(other) = self.holder_of_key(r.action, u, r.now)?
        {
            return Ok(Inserted::Duplicate(other));
        }
        let lane = r.dead.map_or(r.lane, |_| None);
        // The lane's head, if this run is the first of its lane: another
        // transaction making a head of the same lane waits for this one.
        let headed = match lane {
            // An existing lane's row is locked (see `enter_lane!`).
            Some(lane) if r.dead.is_none() => self
                .query_opt(
                    concat!(
                        "INSERT INTO reflexr_lanes (lane, head, blocked, updated_at) \
                         VALUES ($1, $2, false, $3) ",
                        enter_lane!(),
                        " RETURNING head = $2"
                    ),
                    &[
                        (&lane, Type::TEXT),
                        (&r.id, Type::TEXT),
                        (&r.now, Type::INT8),
                    ],
                )?
                .map(|row| col::<bool>(&row, 0))
                .transpose()?
                .unwrap_or(false),
            _ => false,
        };
        let state = match (r.dead, lane) {
            (Some(_), _) => "dead",
            (None, Some(_)) if !headed => "waiting",
            _ => "ready",
        };
        let values = RunValues::of(r, lane, state);
        let inserted = self.query_opt(INSERT_RUN, &values.params(r))?;
        if inserted.is_none() {
            // Another transaction inserted this id, or took the key, first:
            // give up the lane's head this insert made.
            if let (true, Some(lane)) = (headed, lane) {
                self.give_up_lane(lane, r.id)?;
            }
            return self.why_not_inserted(r);
        }
        if let Some(u) = r.unique.filter(|u| u.mode == "period") {
            let until = r.now.saturating_add(u.period_ms);
            self.query(
                "INSERT INTO reflexr_unique_periods (action, key, until, run_id) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (action, key) \
                 DO UPDATE SET until = excluded.until, run_id = excluded.run_id",
                &[
                    (&r.action, Type::TEXT),
                    (&u.key, Type::TEXT),
                    (&until, Type::INT8),
                    (&r.id, Type::TEXT),
                ],
            )?;
        }
        Ok(Inserted::New)
    }

    fn insert_all(&self, runs: &[NewRun<'_>]) -> Batched<Inserted> {
        // One statement for runs that hold no key and are not dead, of
        // distinct ids; else one insert after another.
        let ids: std::collections::HashSet<&str> = runs.iter().map(|r| r.id).collect();
        if runs.len() < 2
            || ids.len() != runs.len()
            || runs.iter().any(|r| r.unique.is_some() || r.dead.is_some())
        {
            return one_by_one(runs, |run| self.insert(run));
        }
        if let Some(i) = runs.iter().position(|r| holds_nul(r.input)) {
            return Err((Some(i), nul_refused()));
        }
        fn column<'r, T>(runs: &'r [NewRun<'_>], f: impl Fn(&'r NewRun<'_>) -> T) -> Vec<T> {
            runs.iter().map(f).collect()
        }
        let id = column(runs, |r| r.id);
        let kind = column(runs, |r| r.kind);
        let action = column(runs, |r| r.action);
        let workspace = column(runs, |r| r.workspace);
        let rule = column(runs, |r| r.rule);
        let scope = column(runs, |r| r.scope);
        let lane = column(runs, |r| r.lane);
        let on_dead_letter = column(runs, |r| r.on_dead_letter);
        let input = column(runs, |r| r.input);
        let event_seq = column(runs, |r| r.event_seq);
        let event_id = column(runs, |r| r.event_id);
        let depth = column(runs, |r| r.depth);
        let max_attempts = column(runs, |r| i64::from(r.retry.max_attempts));
        let backoff_ms = column(runs, |r| ms(r.retry.initial));
        let backoff_max_ms = column(runs, |r| ms(r.retry.max_delay));
        let factor = column(runs, |r| r.retry.factor);
        let jitter = column(runs, |r| r.retry.jitter);
        let due_at = column(runs, |r| r.due_at);
        let now = column(runs, |r| r.now);
        let priority = column(runs, |r| r.priority);
        let parent = column(runs, |r| r.parent);
        let key = column(runs, |r| r.key);
        let traceparent = column(runs, |r| r.traceparent);
        let rows = self
            .query(
                INSERT_RUNS,
                &[
                    (&id, Type::TEXT_ARRAY),
                    (&kind, Type::TEXT_ARRAY),
                    (&action, Type::TEXT_ARRAY),
                    (&workspace, Type::TEXT_ARRAY),
                    (&rule, Type::TEXT_ARRAY),
                    (&scope, Type::TEXT_ARRAY),
                    (&lane, Type::TEXT_ARRAY),
                    (&on_dead_letter, Type::TEXT_ARRAY),
                    (&input, Type::TEXT_ARRAY),
                    (&event_seq, Type::INT8_ARRAY),
                    (&event_id, Type::TEXT_ARRAY),
                    (&depth, Type::INT8_ARRAY),
                    (&max_attempts, Type::INT8_ARRAY),
                    (&backoff_ms, Type::INT8_ARRAY),
                    (&backoff_max_ms, Type::INT8_ARRAY),
                    (&factor, Type::FLOAT8_ARRAY),
                    (&jitter, Type::FLOAT8_ARRAY),
                    (&due_at, Type::INT8_ARRAY),
                    (&now, Type::INT8_ARRAY),
                    (&priority, Type::INT8_ARRAY),
                    (&parent, Type::TEXT_ARRAY),
                    (&key, Type::TEXT_ARRAY),
                    (&traceparent, Type::TEXT_ARRAY),
                ],
            )
            .map_err(|e| (None, e))?;
        let (mut gone, mut new, mut heads) = (
            std::collections::HashSet::new(),
            std::collections::HashSet::new(),
            std::collections::HashMap::new(),
        );
        for row in &rows {
            let (what, id, lane): (&str, String, Option<String>) =
                (|| Ok::<_, Error>((col(row, 0)?, col(row, 1)?, col(row, 2)?)))()
                    .map_err(|e| (None, e))?;
            match (what, lane) {
                ("gone", _) => gone.insert(id),
                ("new", _) => new.insert(id),
                (_, lane) => heads.insert(lane.unwrap_or_default(), id).is_none(),
            };
        }
        runs.iter()
            .enumerate()
            .map(|(i, r)| {
                if gone.contains(r.id) {
                    return Ok(Inserted::Existed);
                }
                if new.contains(r.id) {
                    return Ok(Inserted::New);
                }
                // Another transaction inserted this id first: give up the
                // lane's head this statement made.
                if let Some(lane) = r.lane
                    && heads.get(lane).map(String::as_str) == Some(r.id)
                {
                    self.give_up_lane(lane, r.id).map_err(|e| (Some(i), e))?;
                }
                self.why_not_inserted(r).map_err(|e| (Some(i), e))
            })
            .collect()
    }

    fn get(&self, id: &str) -> Result<Option<RunRow>> {
        self.query_opt(
            &format!("SELECT {COLUMNS} FROM reflexr_runs WHERE id = $1"),
            &[(&id, Type::TEXT)],
        )?
        .as_ref()
        .map(run_from)
        .transpose()
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
        let rows = self.query(
            &CLAIM_SQL,
            &[
                (&holder, Type::TEXT),
                (&now, Type::INT8),
                (&expires_at, Type::INT8),
                (&actions, Type::TEXT_ARRAY),
                (&priority, Type::INT8),
                (&limit, Type::INT8),
            ],
        )?;
        let mut claimed: Vec<RunRow> = rows.iter().map(run_from).collect::<Result<_>>()?;
        // UPDATE … RETURNING does not keep the CTE's order: due first, as
        // on SQLite.
        claimed.sort_by_key(|r| (r.due_at, r.ord));
        Ok(claimed)
    }

    fn succeed(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET state = 'succeeded', finished_at = $4, updated_at = $4, changed_tx = pg_current_xact_id()::text::bigint, \
                   claimed_by = NULL, claim_expires_at = NULL \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                   AND cancel_requested_at IS NULL RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    fn retry_later(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        due_at: i64,
        error: &str,
    ) -> Result<bool> {
        let error = crate::base::limits::clip_error(error);
        Ok(self
            .query_opt(
                &format!(
                    "UPDATE reflexr_runs SET state = 'ready', due_at = $5, last_error = $6, \
                       updated_at = $4, changed_tx = pg_current_xact_id()::text::bigint, claimed_by = NULL, claim_expires_at = NULL, {YIELD_KEY} \
                     WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                       AND cancel_requested_at IS NULL RETURNING 1"
                ),
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&now, Type::INT8),
                    (&due_at, Type::INT8),
                    (&error, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn kill(&self, id: &str, holder: &str, attempt: i64, now: i64, error: &str) -> Result<bool> {
        let error = crate::base::limits::clip_error(error);
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET state = 'dead', last_error = $5, finished_at = $4, \
                   updated_at = $4, changed_tx = pg_current_xact_id()::text::bigint, claimed_by = NULL, claim_expires_at = NULL \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                   AND cancel_requested_at IS NULL RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&now, Type::INT8),
                    (&error, Type::TEXT),
                ],
            )?
            .is_some())
    }

    fn renew(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        now: i64,
        expires_at: i64,
    ) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET claim_expires_at = greatest(claim_expires_at, $5) \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                   AND claim_expires_at > $4 RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&now, Type::INT8),
                    (&expires_at, Type::INT8),
                ],
            )?
            .is_some())
    }

    fn delete_finished(&self, before: i64, limit: usize) -> Result<usize> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(
            "WITH gone AS (DELETE FROM reflexr_runs WHERE ord IN \
               (SELECT ord FROM reflexr_runs \
                WHERE state IN ('succeeded', 'discarded') AND due_at < $1 \
                  AND coalesce(finished_at, updated_at) < $1 \
                LIMIT $2) RETURNING id), \
             steps AS (DELETE FROM reflexr_steps WHERE run IN (SELECT id FROM gone)), \
             event_waits AS (DELETE FROM reflexr_event_waits WHERE run IN (SELECT id FROM gone)), \
             run_waits AS (DELETE FROM reflexr_run_waits WHERE run IN (SELECT id FROM gone)), \
             logs AS (DELETE FROM reflexr_run_logs WHERE run IN (SELECT id FROM gone)), \
             progress AS (DELETE FROM reflexr_run_progress WHERE run IN (SELECT id FROM gone)) \
             SELECT count(*) FROM gone",
            &[(&before, Type::INT8), (&limit, Type::INT8)],
        )?;
        let n: i64 = col(&rows[0], 0)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn lapsed(&self, now: i64, limit: i64) -> Result<Vec<RunRow>> {
        self.query(
            &format!(
                "SELECT {COLUMNS} FROM reflexr_runs \
                 WHERE state = 'running' AND claim_expires_at <= $1 \
                 ORDER BY claim_expires_at LIMIT $2"
            ),
            &[(&now, Type::INT8), (&limit, Type::INT8)],
        )?
        .iter()
        .map(run_from)
        .collect()
    }

    fn requeue_lapsed(&self, ord: i64, now: i64) -> Result<Requeued> {
        let state = self.query_opt(
            &format!(
                "UPDATE reflexr_runs SET \
                   state = CASE WHEN cancel_requested_at IS NULL THEN 'ready' ELSE 'cancelled' END, \
                   finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE $2 END, \
                   due_at = $2, claimed_by = NULL, \
                   claim_expires_at = NULL, updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint, {YIELD_KEY}, \
                   last_error = 'the claim lapsed: its executor stopped renewing it' \
                 WHERE ord = $1 AND state = 'running' COLLATE \"C\" AND claim_expires_at <= $2 \
                 RETURNING state"
            ),
            &[(&ord, Type::INT8), (&now, Type::INT8)],
        )?;
        Ok(Requeued::from_state(state.map(|r| col(&r, 0)).transpose()?))
    }

    fn release(&self, ord: i64, holder: &str, attempt: i64, now: i64) -> Result<Requeued> {
        let state = self.query_opt(
            &format!(
                "UPDATE reflexr_runs SET \
                   state = CASE WHEN cancel_requested_at IS NULL THEN 'ready' ELSE 'cancelled' END, \
                   finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE $4 END, \
                   attempt = attempt - 1, updated_at = $4, changed_tx = pg_current_xact_id()::text::bigint, \
                   claimed_by = NULL, claim_expires_at = NULL, {YIELD_KEY} \
                 WHERE ord = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                 RETURNING state"
            ),
            &[
                (&ord, Type::INT8),
                (&holder, Type::TEXT),
                (&attempt, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(Requeued::from_state(state.map(|r| col(&r, 0)).transpose()?))
    }

    fn save_checkpoint(
        &self,
        id: &str,
        holder: &str,
        attempt: i64,
        checkpoint: &str,
        now: i64,
    ) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET checkpoint = $4, updated_at = $5, changed_tx = pg_current_xact_id()::text::bigint \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                 RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&checkpoint, Type::TEXT),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    /// Found by their positions, through the primary key alone
    /// ([`SUCCEED_MANY`]).
    fn succeed_many(
        &self,
        holder: &str,
        claims: &[(i64, &str, i64)],
        now: i64,
    ) -> Result<Vec<String>> {
        let ords: Vec<i64> = claims.iter().map(|c| c.0).collect();
        let attempts: Vec<i64> = claims.iter().map(|c| c.2).collect();
        let rows = self.query(
            SUCCEED_MANY,
            &[
                (&holder, Type::TEXT),
                (&ords, Type::INT8_ARRAY),
                (&attempts, Type::INT8_ARRAY),
                (&now, Type::INT8),
            ],
        )?;
        rows.iter().map(|r| col(r, 0)).collect()
    }

    fn end_cancelled(&self, id: &str, holder: &str, attempt: i64, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET state = 'cancelled', finished_at = $4, updated_at = $4, changed_tx = pg_current_xact_id()::text::bigint, \
                   claimed_by = NULL, claim_expires_at = NULL \
                 WHERE id = $1 AND state = 'running' COLLATE \"C\" AND claimed_by = $2 AND attempt = $3 \
                   AND cancel_requested_at IS NOT NULL RETURNING 1",
                &[
                    (&id, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&attempt, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    /// Through the index of the runs asked to stop
    /// ([`CANCEL_REQUESTED`]).
    fn cancel_requested(&self, runs: &[(i64, &str)]) -> Result<Vec<String>> {
        let ids: Vec<&str> = runs.iter().map(|r| r.1).collect();
        self.query(CANCEL_REQUESTED, &[(&ids, Type::TEXT_ARRAY)])?
            .iter()
            .map(|r| col(r, 0))
            .collect()
    }

    fn list(&self, state: Option<&str>, limit: i64) -> Result<Vec<RunRow>> {
        let rows = match state {
            // The state's partial index's own term beside the parameter: a
            // plan made for any state could use none of them.
            Some(state) => self.query(
                &format!(
                    "SELECT {COLUMNS} FROM reflexr_runs WHERE state = $1 AND {} \
                     ORDER BY due_at, ord LIMIT $2",
                    state_term(state)
                ),
                &[(&state, Type::TEXT), (&limit, Type::INT8)],
            )?,
            None => self.query(
                &format!("SELECT {COLUMNS} FROM reflexr_runs ORDER BY ord LIMIT $1"),
                &[(&limit, Type::INT8)],
            )?,
        };
        rows.iter().map(run_from).collect()
    }

    fn cancel(&self, id: &str, now: i64, by: &str, reason: &str) -> Result<Option<String>> {
        let Some(row) = Runs::get(self, id)? else {
            return Ok(None);
        };
        let reason = crate::base::limits::clip_error(reason);
        match row.state.as_str() {
            "waiting" | "ready" => {
                let was: Option<String> = self
                    .query_opt(
                        "UPDATE reflexr_runs SET state = 'cancelled', finished_at = $2, \
                           updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint, cancelled_by = $3, cancel_reason = $4 \
                         WHERE id = $1 AND state = $5 COLLATE \"C\" RETURNING $5",
                        &[
                            (&id, Type::TEXT),
                            (&now, Type::INT8),
                            (&by, Type::TEXT),
                            (&reason, Type::TEXT),
                            (&row.state, Type::TEXT),
                        ],
                    )?
                    .map(|r| col(&r, 0))
                    .transpose()?;
                if was.is_none() {
                    // Claimed (or promoted) since it was read: as it is now.
                    return Runs::cancel(self, id, now, by, &reason);
                }
                if row.state == "ready"
                    && let Some(lane) = &row.lane
                {
                    Lanes::advance_lane(self, lane, id, now)?;
                }
            }
            "running" => {
                self.query(
                    "UPDATE reflexr_runs SET \
                       cancel_requested_at = coalesce(cancel_requested_at, $2), \
                       updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint, cancelled_by = $3, cancel_reason = $4 \
                     WHERE id = $1 AND state = 'running' COLLATE \"C\"",
                    &[
                        (&id, Type::TEXT),
                        (&now, Type::INT8),
                        (&by, Type::TEXT),
                        (&reason, Type::TEXT),
                    ],
                )?;
            }
            _ => {}
        }
        Ok(Some(row.state))
    }

    fn revive(&self, id: &str, lane: Option<&str>, now: i64) -> Result<bool> {
        let state = match lane {
            Some(lane) => match Lanes::lane_head(self, lane)? {
                Some((head, _)) if head == id => {
                    Lanes::set_blocked(self, lane, false, now)?;
                    "ready"
                }
                Some(_) => "waiting",
                None => {
                    // The lane went when it moved on: this run heads it
                    // again (or waits behind one that took it meanwhile).
                    let headed = self
                        .query_opt(
                            "INSERT INTO reflexr_lanes (lane, head, blocked, updated_at) \
                             VALUES ($1, $2, false, $3) ON CONFLICT (lane) DO NOTHING \
                             RETURNING 1",
                            &[(&lane, Type::TEXT), (&id, Type::TEXT), (&now, Type::INT8)],
                        )?
                        .is_some();
                    if headed { "ready" } else { "waiting" }
                }
            },
            None => "ready",
        };
        Ok(self
            .query_opt(
                &format!(
                    "UPDATE reflexr_runs SET state = $2, attempt = 0, due_at = $3, \
                       updated_at = $3, changed_tx = pg_current_xact_id()::text::bigint, finished_at = NULL, {YIELD_KEY}, \
                       {KEY_AGAIN} \
                     WHERE id = $1 AND state = 'dead' COLLATE \"C\" RETURNING 1"
                ),
                &[(&id, Type::TEXT), (&state, Type::TEXT), (&now, Type::INT8)],
            )?
            .is_some())
    }

    fn discard(&self, id: &str, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_runs SET state = 'discarded', updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint \
                 WHERE id = $1 AND state = 'dead' COLLATE \"C\" RETURNING 1",
                &[(&id, Type::TEXT), (&now, Type::INT8)],
            )?
            .is_some())
    }

    fn oldest_ready_due(&self) -> Result<Option<i64>> {
        let rows = self.query(
            "SELECT min(due_at) FROM reflexr_runs WHERE state = 'ready'",
            &[],
        )?;
        rows.first().map_or(Ok(None), |r| col(r, 0))
    }

    fn counts(&self) -> Result<Vec<(String, i64)>> {
        self.query(
            "SELECT state, count(*) FROM reflexr_runs GROUP BY state ORDER BY state",
            &[],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }
}

impl Lanes for PgConn {
    fn lane_head(&self, lane: &str) -> Result<Option<(String, bool)>> {
        self.query_opt(
            "SELECT head, blocked FROM reflexr_lanes WHERE lane = $1",
            &[(&lane, Type::TEXT)],
        )?
        .map(|r| Ok((col(&r, 0)?, col(&r, 1)?)))
        .transpose()
    }

    fn set_blocked(&self, lane: &str, blocked: bool, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_lanes SET blocked = $2, updated_at = $3 WHERE lane = $1 \
                 RETURNING 1",
                &[
                    (&lane, Type::TEXT),
                    (&blocked, Type::BOOL),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    fn advance_lane(&self, lane: &str, finished: &str, now: i64) -> Result<()> {
        // The lane's row locked first: a run entering the lane behind its
        // head (which locks the row too, see `insert`) commits before this
        // looks for the next waiting run, or waits for this to end — so a
        // waiting run is never left in a lane this deletes.
        let head: Option<String> = self
            .query_opt(
                "SELECT head FROM reflexr_lanes WHERE lane = $1 FOR UPDATE",
                &[(&lane, Type::TEXT)],
            )?
            .map(|r| col(&r, 0))
            .transpose()?;
        if head.as_deref() != Some(finished) {
            // Not the head (a run revived behind another): nothing to move.
            return Ok(());
        }
        let next = self.query_opt(
            "SELECT ord, id FROM reflexr_runs WHERE lane = $1 AND state = 'waiting' \
             ORDER BY ord LIMIT 1",
            &[(&lane, Type::TEXT)],
        )?;
        match next {
            Some(r) => {
                let (ord, id): (i64, String) = (col(&r, 0)?, col(&r, 1)?);
                self.query(
                    "UPDATE reflexr_lanes SET head = $2, blocked = false, updated_at = $3 \
                     WHERE lane = $1",
                    &[(&lane, Type::TEXT), (&id, Type::TEXT), (&now, Type::INT8)],
                )?;
                self.query(
                    "UPDATE reflexr_runs SET state = 'ready', due_at = greatest(due_at, $2), \
                       updated_at = $2, changed_tx = pg_current_xact_id()::text::bigint WHERE ord = $1",
                    &[(&ord, Type::INT8), (&now, Type::INT8)],
                )?;
            }
            None => {
                self.query(
                    "DELETE FROM reflexr_lanes WHERE lane = $1",
                    &[(&lane, Type::TEXT)],
                )?;
            }
        }
        Ok(())
    }

    fn blocked_count(&self) -> Result<i64> {
        let rows = self.query("SELECT count(*) FROM reflexr_lanes WHERE blocked", &[])?;
        rows.first().map_or(Ok(0), |r| col(r, 0))
    }
}

/// Whether a JSON text holds U+0000 in a string or a key (which SQLite
/// stores and PostgreSQL's jsonb refuses). Parsed only when the escape
/// appears in the text at all.
fn holds_nul(json: &str) -> bool {
    fn any_nul(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(a) => a.iter().any(any_nul),
            serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || any_nul(v)),
            _ => false,
        }
    }
    json.contains("\\u0000")
        && serde_json::from_str::<serde_json::Value>(json).is_ok_and(|v| any_nul(&v))
}

#[cfg(test)]
mod tests {
    /// The feed of run changes finds a change by its `changed_tx` (see
    /// `runs_feed`): every statement here that changes a run's change time
    /// stamps its transaction too, or the feed would never give that
    /// change. (A statement that only renews a claim changes neither.)
    #[test]
    fn every_statement_that_changes_a_run_stamps_its_transaction() {
        let source = include_str!("runs.rs");
        let mut statements = 0;
        for (at, _) in source.match_indices("UPDATE reflexr_runs") {
            let rest = &source[at..];
            // The literal ends at the first quote that is not escaped.
            let end = ["\",", "\"\n", "\")"]
                .iter()
                .filter_map(|q| rest.find(q))
                .min()
                .unwrap();
            let statement = &rest[..end];
            if statement.contains("updated_at =") {
                statements += 1;
                assert!(
                    statement.contains("changed_tx = pg_current_xact_id()::text::bigint"),
                    "a change without its transaction: {statement}"
                );
            }
        }
        assert!(statements >= 15, "found {statements}");
    }
}
