//! Opening a PostgreSQL database: applying `schema.pg.sql` to a new one,
//! migrating an older one forward, refusing a newer one.

use std::path::PathBuf;

use postgres::Client;

use crate::base::error::{Error, Result};

/// The schema of a new database, `schema.pg.sql` at the repository root.
pub(crate) const SCHEMA_SQL: &str = include_str!("../../../schema.pg.sql");

/// The PostgreSQL schema version this library writes: `schema.pg.sql`
/// (version 1) and the migrations after it.
pub(crate) const SCHEMA_VERSION: i32 = 17;

/// Steps that take a database forward: `(n, sql)` takes version `n - 1` to
/// `n`, and its SQL ends by recording `n` in `reflexr_schema_version`. A new
/// database gets `schema.pg.sql` and then every step, so a new database and
/// a migrated one are the same by construction (the store's tables are
/// being ported a group at a time; each group comes as a step).
pub(crate) const MIGRATIONS: &[(i32, &str)] = &[
    (2, MIGRATE_TO_2),
    (3, MIGRATE_TO_3),
    (4, MIGRATE_TO_4),
    (5, MIGRATE_TO_5),
    (6, MIGRATE_TO_6),
    (7, MIGRATE_TO_7),
    (8, MIGRATE_TO_8),
    (9, MIGRATE_TO_9),
    (10, MIGRATE_TO_10),
    (11, MIGRATE_TO_11),
    (12, MIGRATE_TO_12),
    (13, MIGRATE_TO_13),
    (14, MIGRATE_TO_14),
    (15, MIGRATE_TO_15),
    (16, MIGRATE_TO_16),
    (17, MIGRATE_TO_17),
];

// The last step reaches the version this library writes.
const _: () = assert!(MIGRATIONS[MIGRATIONS.len() - 1].0 == SCHEMA_VERSION);

/// Version 17: the runs whose cancellation was asked for, by id. An
/// executor looks for them among its batch's runs (up to 256 ids) before
/// it starts them and at each renewal. With only the ids' unique index to
/// read them by, the planner costed 256 seeks above reading the whole
/// table while it held some 20,000 runs or fewer, and read every run at
/// each look (7–13 ms of the server's time on average under a drain of
/// 20,000). This index holds only the runs asked to stop — few, and none
/// on most pages — so the look costs what the batch holds, whatever the
/// table holds. No row changes.
const MIGRATE_TO_17: &str = "
CREATE INDEX reflexr_runs_cancelling ON reflexr_runs (id)
    WHERE cancel_requested_at IS NOT NULL;
INSERT INTO reflexr_schema_version (version) VALUES (17);
";

/// Version 16: the runs' checks are their columns' domains. PostgreSQL
/// reads a table's CHECK constraints from the catalog's text and prepares
/// them again at every statement that inserts or updates a row of it
/// (`ExecConstraints`: `stringToNode`, then the expression's steps) — 7 KB
/// of node text for the runs' nine, about 13 µs of the server's time at
/// every enqueue, whatever it changed. A domain's check is read once a
/// session (the type cache) and is tested only where a statement gives the
/// column a value. The same sets of values and bounds. The domains have no
/// constraint while the columns change type, so the table is not
/// rewritten (its indexes on `state` and `unique_mode` are built again);
/// their constraints come `NOT VALID`, since the table's checks they
/// replace held every row until this transaction. The one view of the
/// engine's that reads a column whose type changes is made again, and the
/// table analysed (a column's statistics go with its type) when it holds
/// a run. An empty table is left as never analysed: analysed, it is known
/// to be empty, and the plan the server keeps for a statement by id after
/// its first five executions — made while the table held a handful of
/// runs — read every run once it held thousands (4.2 ms against 0.03 at
/// 20,000); a table never analysed counts as ten pages at least, and its
/// plans read by index from the start. The server analyses the table
/// itself once it has changed.
const MIGRATE_TO_16: &str = "
CREATE DOMAIN reflexr_run_kind AS text;
CREATE DOMAIN reflexr_dead_letter_policy AS text;
CREATE DOMAIN reflexr_run_state AS text;
CREATE DOMAIN reflexr_unique_mode AS text;
CREATE DOMAIN reflexr_positive AS bigint;
CREATE DOMAIN reflexr_nonnegative AS bigint;
CREATE DOMAIN reflexr_factor AS double precision;
CREATE DOMAIN reflexr_fraction AS double precision;
DROP VIEW reflexr_runs_by_key;
ALTER TABLE reflexr_runs
    DROP CONSTRAINT IF EXISTS reflexr_runs_kind_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_on_dead_letter_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_state_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_unique_mode_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_max_attempts_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_backoff_ms_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_backoff_max_ms_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_backoff_factor_check,
    DROP CONSTRAINT IF EXISTS reflexr_runs_jitter_check,
    ALTER COLUMN kind TYPE reflexr_run_kind,
    ALTER COLUMN on_dead_letter TYPE reflexr_dead_letter_policy,
    ALTER COLUMN state TYPE reflexr_run_state,
    ALTER COLUMN unique_mode TYPE reflexr_unique_mode,
    ALTER COLUMN max_attempts TYPE reflexr_positive,
    ALTER COLUMN backoff_ms TYPE reflexr_nonnegative,
    ALTER COLUMN backoff_max_ms TYPE reflexr_nonnegative,
    ALTER COLUMN backoff_factor TYPE reflexr_factor,
    ALTER COLUMN jitter TYPE reflexr_fraction;
ALTER DOMAIN reflexr_run_kind ADD CONSTRAINT reflexr_run_kind_check
    CHECK (VALUE IN ('rule', 'delivery', 'job', 'task')) NOT VALID;
ALTER DOMAIN reflexr_dead_letter_policy ADD CONSTRAINT reflexr_dead_letter_policy_check
    CHECK (VALUE IN ('continue', 'block')) NOT VALID;
ALTER DOMAIN reflexr_run_state ADD CONSTRAINT reflexr_run_state_check
    CHECK (VALUE IN ('waiting', 'ready', 'running', 'succeeded', 'dead', 'discarded', 'cancelled'))
    NOT VALID;
ALTER DOMAIN reflexr_unique_mode ADD CONSTRAINT reflexr_unique_mode_check
    CHECK (VALUE IN ('pending', 'active', 'period')) NOT VALID;
ALTER DOMAIN reflexr_positive ADD CONSTRAINT reflexr_positive_check
    CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN reflexr_nonnegative ADD CONSTRAINT reflexr_nonnegative_check
    CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN reflexr_factor ADD CONSTRAINT reflexr_factor_check
    CHECK (VALUE >= 1.0) NOT VALID;
ALTER DOMAIN reflexr_fraction ADD CONSTRAINT reflexr_fraction_check
    CHECK (VALUE >= 0.0 AND VALUE <= 1.0) NOT VALID;
CREATE VIEW reflexr_runs_by_key AS
SELECT action, flow_key AS key, state::text AS state, count(*) AS runs
FROM reflexr_runs
WHERE flow_key IS NOT NULL
GROUP BY action, flow_key, state;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM reflexr_runs) THEN
        ANALYZE reflexr_runs;
    END IF;
END
$$;
INSERT INTO reflexr_schema_version (version) VALUES (16);
";

/// Version 15: fewer index entries a claim writes, as SQLite's version 12.
/// An update that changes an indexed column writes an entry of the new row
/// into every index whose predicate it meets: a claim wrote six (the
/// position, the id, the transaction's stamp, the runs by state — every
/// state —, the lapsed claims', the running runs'), and now four. The
/// claim's index holds only ready runs; one index of running runs also
/// says when each claim expires; the runs neither ready nor running have
/// one of their own. No row changes.
const MIGRATE_TO_15: &str = "
DROP INDEX reflexr_runs_due;
DROP INDEX reflexr_runs_lapsed;
DROP INDEX reflexr_runs_running;
CREATE INDEX reflexr_runs_due ON reflexr_runs (priority DESC, due_at) WHERE state = 'ready';
CREATE INDEX reflexr_runs_running ON reflexr_runs (claim_expires_at, action, flow_key)
    WHERE state = 'running';
CREATE INDEX reflexr_runs_at_rest ON reflexr_runs (state, due_at)
    WHERE state NOT IN ('ready', 'running');
INSERT INTO reflexr_schema_version (version) VALUES (15);
";

/// Version 14: what runs' handlers logged, and how far they got; the W3C
/// trace context of events and runs; as in `schema.sql`.
const MIGRATE_TO_14: &str = "
ALTER TABLE reflexr_events ADD COLUMN traceparent text;
ALTER TABLE reflexr_runs ADD COLUMN traceparent text;
CREATE TABLE reflexr_run_logs (
    run     text NOT NULL,
    n       bigint NOT NULL,
    attempt bigint NOT NULL,
    at      bigint NOT NULL,
    level   text NOT NULL CHECK (level IN ('error', 'warn', 'info', 'debug', 'trace')),
    message text NOT NULL,
    fields  text,
    PRIMARY KEY (run, n)
);
CREATE TABLE reflexr_run_progress (
    run     text PRIMARY KEY,
    attempt bigint NOT NULL,
    done    bigint NOT NULL CHECK (done >= 0),
    total   bigint NOT NULL CHECK (total >= 0),
    at      bigint NOT NULL
);
INSERT INTO reflexr_schema_version (version) VALUES (14);
";

/// Version 13: flow control by key, as in `schema.sql`: a run's key, fair
/// actions with their key path (`jsonb` path elements, see
/// `control::path_elements`, here translated from the stored JSON path by
/// a pattern) and virtual clock, per-key overrides, the passes of the keys a
/// fair claim served. Partitioned actions get their key path, and their
/// unfinished runs their keys.
const MIGRATE_TO_13: &str = r#"
ALTER TABLE reflexr_runs ADD COLUMN flow_key text;
CREATE INDEX reflexr_runs_keyed ON reflexr_runs (action, priority, flow_key, due_at)
    WHERE state = 'ready' AND flow_key IS NOT NULL;
ALTER TABLE reflexr_actions ADD COLUMN fair boolean NOT NULL DEFAULT false;
ALTER TABLE reflexr_actions ADD COLUMN key_path text[];
ALTER TABLE reflexr_actions ADD COLUMN fair_clock double precision NOT NULL DEFAULT 0;
UPDATE reflexr_actions SET key_path = CASE WHEN left(partition_by, 1) <> '$'
    THEN ARRAY[partition_by]
    ELSE (SELECT coalesce(array_agg(coalesce(m[1], m[2], '-' || m[3], m[4]) ORDER BY n), '{}')
          FROM regexp_matches(partition_by, '\."([^"]*)"|\.([^.\[]+)|\[#-([0-9]+)\]|\[([0-9]+)\]', 'g')
               WITH ORDINALITY AS t(m, n)) END
  WHERE partition_by IS NOT NULL;
UPDATE reflexr_runs r SET flow_key = coalesce(r.input::jsonb #>> a.key_path, '')
  FROM reflexr_actions a
 WHERE a.action = r.action AND a.key_path IS NOT NULL
   AND r.state IN ('waiting', 'ready', 'running');
CREATE TABLE reflexr_action_keys (
    action         text NOT NULL,
    key            text NOT NULL,
    max_running    bigint CHECK (max_running IS NULL OR max_running >= 1),
    rate_count     bigint CHECK (rate_count IS NULL OR rate_count >= 1),
    rate_period_ms bigint CHECK (rate_period_ms IS NULL OR rate_period_ms >= 1),
    weight         bigint CHECK (weight IS NULL OR weight >= 1),
    updated_at     bigint NOT NULL,
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL)),
    PRIMARY KEY (action, key)
);
CREATE TABLE reflexr_key_passes (
    action text NOT NULL,
    key    text NOT NULL,
    pass   double precision NOT NULL,
    PRIMARY KEY (action, key)
);
CREATE INDEX reflexr_key_passes_by_pass ON reflexr_key_passes (action, pass);
CREATE VIEW reflexr_runs_by_key AS
SELECT action, flow_key AS key, state, count(*) AS runs
FROM reflexr_runs
WHERE flow_key IS NOT NULL
GROUP BY action, flow_key, state;
INSERT INTO reflexr_schema_version (version) VALUES (13);
"#;

/// Version 12: rule versions warmed up in shadow, as in `schema.sql`.
const MIGRATE_TO_12: &str = "
ALTER TABLE reflexr_rules ADD COLUMN shadow_of text;
ALTER TABLE reflexr_rules ADD COLUMN promote_at bigint;
ALTER TABLE reflexr_rules ADD COLUMN shadow_fired bigint NOT NULL DEFAULT 0;
ALTER TABLE reflexr_rules ADD COLUMN shadow_errored bigint NOT NULL DEFAULT 0;
INSERT INTO reflexr_schema_version (version) VALUES (12);
";

/// Version 11: subject versions, as in `schema.sql`: each event's place
/// among its subject's events (counted in seq order for the events kept),
/// under a unique index that also reads a subject's stream, and the
/// versions pruned subjects reached.
const MIGRATE_TO_11: &str = "
ALTER TABLE reflexr_events ADD COLUMN version bigint NOT NULL DEFAULT 0 CHECK (version >= 0);
UPDATE reflexr_events e SET version = v.n
  FROM (SELECT seq, row_number() OVER (PARTITION BY workspace, subject ORDER BY seq) AS n
          FROM reflexr_events) v
 WHERE v.seq = e.seq;
CREATE UNIQUE INDEX reflexr_events_by_subject ON reflexr_events (workspace, subject, version);
CREATE TABLE reflexr_subject_floors (
    workspace text NOT NULL,
    subject   text NOT NULL,
    version   bigint NOT NULL CHECK (version >= 1),
    PRIMARY KEY (workspace, subject)
);
CREATE OR REPLACE VIEW reflexr_event_log AS
SELECT e.seq, e.workspace, e.id, e.type, e.subject, e.actor,
       to_timestamp(e.occurred_at / 1000.0) AS occurred,
       to_timestamp(e.recorded_at / 1000.0) AS recorded,
       e.causation_id, e.correlation_id, e.depth, e.payload, e.version
FROM reflexr_events e;
INSERT INTO reflexr_schema_version (version) VALUES (11);
";

/// Version 10: durable workflows, as in `schema.sql`: a run's parent and
/// output, its steps, and what suspended runs wait for.
const MIGRATE_TO_10: &str = "
ALTER TABLE reflexr_runs ADD COLUMN output text;
ALTER TABLE reflexr_runs ADD COLUMN parent text;
ALTER TABLE reflexr_runs ADD COLUMN began_seq bigint;
CREATE INDEX reflexr_runs_by_parent ON reflexr_runs (parent) WHERE parent IS NOT NULL;
CREATE TABLE reflexr_steps (
    run         text NOT NULL,
    name        text NOT NULL,
    position    bigint NOT NULL CHECK (position >= 0),
    kind        text NOT NULL
                CHECK (kind IN ('begin', 'step', 'tx', 'sleep', 'wait', 'spawn', 'join', 'patch')),
    state       text NOT NULL CHECK (state IN ('done', 'waiting')),
    attempt     bigint NOT NULL,
    output      text,
    detail      text NOT NULL DEFAULT '{}',
    wake_at     bigint,
    recorded_at bigint NOT NULL,
    PRIMARY KEY (run, name)
);
CREATE UNIQUE INDEX reflexr_steps_by_position ON reflexr_steps (run, position);
CREATE TABLE reflexr_event_waits (
    run       text NOT NULL,
    step      text NOT NULL,
    workspace text NOT NULL,
    type      text NOT NULL,
    by        text NOT NULL,
    key       text NOT NULL,
    after_seq bigint NOT NULL,
    PRIMARY KEY (run, step)
);
CREATE INDEX reflexr_event_waits_by_match ON reflexr_event_waits (workspace, type, by, key);
CREATE TABLE reflexr_wait_positions (
    workspace text PRIMARY KEY,
    position  bigint NOT NULL CHECK (position >= 0)
);
CREATE TABLE reflexr_run_waits (
    child text NOT NULL,
    run   text NOT NULL,
    step  text NOT NULL,
    PRIMARY KEY (child, run, step)
);
CREATE INDEX reflexr_run_waits_by_run ON reflexr_run_waits (run);
INSERT INTO reflexr_schema_version (version) VALUES (10);
";

/// Version 9: each run's change stamped with the transaction that made it
/// (`changed_tx`: `pg_current_xact_id()`, by default on insert and by every
/// statement that changes a run's state, attempt or change time), for the
/// feed of run changes in commit order (`Inspect::runs_feed`): concurrent
/// transactions commit in another order than they stamp `updated_at`, and
/// a feed by time would pass over a change committed late. Its index takes
/// the place of the one by change time, which only that feed read (every
/// change of a run writes each index of it, so an index more costs every
/// claim and settlement). Runs changed before this version have no stamp
/// (the feed starts after them).
const MIGRATE_TO_9: &str = "
ALTER TABLE reflexr_runs ADD COLUMN changed_tx bigint;
ALTER TABLE reflexr_runs ALTER COLUMN changed_tx SET DEFAULT (pg_current_xact_id()::text::bigint);
DROP INDEX reflexr_runs_by_change;
CREATE INDEX reflexr_runs_by_tx ON reflexr_runs (changed_tx, ord);
INSERT INTO reflexr_schema_version (version) VALUES (9);
";

/// Version 8: the followers' ledger, for followers that read a workspace
/// of this database, as in `schema.sql`.
const MIGRATE_TO_8: &str = "
CREATE TABLE reflexr_followers (
    name             text PRIMARY KEY,
    source           text NOT NULL REFERENCES reflexr_workspaces (name),
    target           text NOT NULL,
    target_file      text,
    projection       text NOT NULL,
    published        bigint NOT NULL DEFAULT 0,
    dead_letters     bigint NOT NULL DEFAULT 0,
    stops            bigint NOT NULL DEFAULT 0,
    last_error       text,
    stopped_at       bigint,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    restart_requests bigint NOT NULL DEFAULT 0 CHECK (restart_requests >= 0),
    target_postgres  text
);
INSERT INTO reflexr_schema_version (version) VALUES (8);
";

/// Version 7: an index on event ids by prefix, whatever the database's
/// collation (an operator's view of a run finds the events it emitted,
/// `<run id>/<key>`, through it).
const MIGRATE_TO_7: &str = "
CREATE INDEX reflexr_events_id_prefix ON reflexr_events (id text_pattern_ops);
INSERT INTO reflexr_schema_version (version) VALUES (7);
";

/// Version 6: scheduled jobs, as in `schema.sql`.
const MIGRATE_TO_6: &str = "
CREATE TABLE reflexr_schedules (
    name        text PRIMARY KEY,
    spec        text NOT NULL,
    guarantee   text NOT NULL CHECK (guarantee IN ('at_least_once', 'at_most_once')),
    missed      text NOT NULL CHECK (missed IN ('run_once', 'skip')),
    next_due_at bigint,
    last_due_at bigint,
    updated_at  bigint NOT NULL
);
INSERT INTO reflexr_schema_version (version) VALUES (6);
";

/// Version 5: rules and their state per scope, as in `schema.sql`.
const MIGRATE_TO_5: &str = "
CREATE TABLE reflexr_rules (
    name          text PRIMARY KEY,
    workspace     text NOT NULL REFERENCES reflexr_workspaces (name),
    version       bigint NOT NULL CHECK (version >= 1),
    definition    text NOT NULL,
    registered_at bigint NOT NULL,
    updated_at    bigint NOT NULL
);
CREATE TABLE reflexr_rule_state (
    rule        text NOT NULL,
    scope       text NOT NULL,
    state       text NOT NULL,
    updated_seq bigint NOT NULL,
    updated_at  bigint NOT NULL,
    PRIMARY KEY (rule, scope)
);
INSERT INTO reflexr_schema_version (version) VALUES (5);
";

/// Version 4: what executors need besides the runs — pauses, rate-limit
/// starts, counters, dead letters — as in `schema.sql`, but for the
/// counters: a counter is the sum of its rows, each bump inserting one (and
/// now and then folding them into one), so the settlements of many
/// processes never wait for one row's lock.
const MIGRATE_TO_4: &str = "
CREATE TABLE reflexr_paused (
    kind     text NOT NULL CHECK (kind IN ('action', 'rule', 'reaction')),
    name     text NOT NULL,
    since    bigint NOT NULL,
    operator text NOT NULL,
    reason   text NOT NULL,
    PRIMARY KEY (kind, name)
);
CREATE TABLE reflexr_starts (
    action text NOT NULL,
    part   text NOT NULL,
    at     bigint NOT NULL,
    n      bigint NOT NULL CHECK (n >= 1)
);
CREATE INDEX reflexr_starts_window ON reflexr_starts (action, part, at);
CREATE TABLE reflexr_counters (
    name  text NOT NULL,
    value bigint NOT NULL
);
CREATE INDEX reflexr_counters_name ON reflexr_counters (name);
CREATE TABLE reflexr_dead_letters (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('rule', 'run', 'reaction', 'follower')),
    consumer    text NOT NULL,
    workspace   text,
    event_seq   bigint,
    event_id    text,
    run_id      text,
    reason      text NOT NULL,
    error       text NOT NULL,
    attempts    bigint NOT NULL DEFAULT 0,
    created_at  bigint NOT NULL,
    resolved_at bigint,
    resolution  text CHECK (resolution IN ('retried', 'discarded'))
);
CREATE UNIQUE INDEX reflexr_dead_letters_per_event
    ON reflexr_dead_letters (kind, consumer, workspace, event_seq) WHERE run_id IS NULL;
CREATE UNIQUE INDEX reflexr_dead_letters_per_run
    ON reflexr_dead_letters (run_id) WHERE run_id IS NOT NULL AND resolved_at IS NULL;
CREATE INDEX reflexr_dead_letters_open ON reflexr_dead_letters (kind, id)
    WHERE resolved_at IS NULL;
INSERT INTO reflexr_schema_version (version) VALUES (4);
";

/// Version 3: the audit — what operators did (a cursor reset, …).
const MIGRATE_TO_3: &str = "
CREATE TABLE reflexr_audit (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       bigint NOT NULL,
    operator text NOT NULL,
    action   text NOT NULL,
    target   text NOT NULL,
    reason   text NOT NULL,
    detail   text NOT NULL DEFAULT '{}'
);
INSERT INTO reflexr_schema_version (version) VALUES (3);
";

/// Version 2: the work queue — runs, lanes, per-action settings, unique
/// periods — as in `schema.sql`.
const MIGRATE_TO_2: &str = "
CREATE TABLE reflexr_runs (
    ord              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               text NOT NULL UNIQUE,
    kind             text NOT NULL CHECK (kind IN ('rule', 'delivery', 'job', 'task')),
    action           text NOT NULL,
    workspace        text,
    rule             text,
    scope            text,
    lane             text,
    on_dead_letter   text NOT NULL DEFAULT 'continue'
                     CHECK (on_dead_letter IN ('continue', 'block')),
    input            text NOT NULL,
    event_seq        bigint,
    event_id         text,
    depth            bigint NOT NULL DEFAULT 0,
    state            text NOT NULL
                     CHECK (state IN ('waiting', 'ready', 'running', 'succeeded', 'dead',
                                      'discarded', 'cancelled')),
    attempt          bigint NOT NULL DEFAULT 0,
    max_attempts     bigint NOT NULL CHECK (max_attempts >= 1),
    backoff_ms       bigint NOT NULL CHECK (backoff_ms >= 0),
    backoff_max_ms   bigint NOT NULL CHECK (backoff_max_ms >= 0),
    backoff_factor   double precision NOT NULL CHECK (backoff_factor >= 1.0),
    jitter           double precision NOT NULL CHECK (jitter >= 0.0 AND jitter <= 1.0),
    due_at           bigint NOT NULL,
    claimed_by       text,
    claim_expires_at bigint,
    checkpoint       text,
    last_error       text,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    finished_at      bigint,
    priority         bigint NOT NULL DEFAULT 0,
    unique_key       text,
    unique_mode      text CHECK (unique_mode IS NULL OR unique_mode IN ('pending', 'active', 'period')),
    started_at       bigint,
    cancel_requested_at bigint,
    cancelled_by     text,
    cancel_reason    text
);
CREATE INDEX reflexr_runs_due ON reflexr_runs (state, priority DESC, due_at);
CREATE INDEX reflexr_runs_lapsed ON reflexr_runs (claim_expires_at) WHERE state = 'running';
CREATE INDEX reflexr_runs_waiting ON reflexr_runs (lane, ord) WHERE state = 'waiting';
CREATE INDEX reflexr_runs_by_change ON reflexr_runs (updated_at, ord);
CREATE INDEX reflexr_runs_running ON reflexr_runs (action) WHERE state = 'running';
CREATE UNIQUE INDEX reflexr_runs_unique_pending ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'pending' AND state IN ('waiting', 'ready');
CREATE UNIQUE INDEX reflexr_runs_unique_active ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'active' AND state IN ('waiting', 'ready', 'running');
CREATE TABLE reflexr_lanes (
    lane       text PRIMARY KEY,
    head       text NOT NULL,
    blocked    boolean NOT NULL DEFAULT false,
    updated_at bigint NOT NULL
);
CREATE INDEX reflexr_lanes_blocked ON reflexr_lanes (updated_at) WHERE blocked;
CREATE TABLE reflexr_actions (
    action         text PRIMARY KEY,
    priority       bigint NOT NULL DEFAULT 0,
    max_running    bigint CHECK (max_running IS NULL OR max_running >= 1),
    rate_count     bigint CHECK (rate_count IS NULL OR rate_count >= 1),
    rate_period_ms bigint CHECK (rate_period_ms IS NULL OR rate_period_ms >= 1),
    partition_by   text,
    updated_at     bigint NOT NULL,
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
);
CREATE TABLE reflexr_unique_periods (
    action text NOT NULL,
    key    text NOT NULL,
    until  bigint NOT NULL,
    run_id text NOT NULL,
    PRIMARY KEY (action, key)
);
INSERT INTO reflexr_schema_version (version) VALUES (2);
";

/// The advisory lock (a constant key: "rflx" in ASCII) that one opener
/// holds while it applies or migrates the schema; another opener waits for
/// it, then finds the schema applied.
const SCHEMA_LOCK: i64 = 0x7266_6c78;

/// Applies or migrates the schema on `client`'s database, in one
/// transaction; `what` names the database in errors.
pub(crate) fn apply(client: &mut Client, what: &str) -> Result<()> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
    let exists: bool = tx
        .query_one(
            "SELECT to_regclass('reflexr_schema_version') IS NOT NULL",
            &[],
        )?
        .get(0);
    let found = if exists {
        let found: Option<i32> = tx
            .query_one("SELECT max(version) FROM reflexr_schema_version", &[])?
            .get(0);
        found.unwrap_or(0)
    } else {
        tx.batch_execute(SCHEMA_SQL)?;
        1
    };
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            path: PathBuf::from(what),
            found: found.into(),
            supported: SCHEMA_VERSION.into(),
        });
    }
    for (to, sql) in MIGRATIONS {
        if *to > found {
            tx.batch_execute(sql)?;
        }
    }
    Ok(tx.commit()?)
}
