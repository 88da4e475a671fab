//! Opening a file: recognising it, then applying or migrating the schema.
//!
//! The order matters for "never an overwrite": everything that could refuse
//! the file (not SQLite, damaged, newer, someone else's) is read before the
//! first write, which is switching the file to WAL mode.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::conn::{self, Role, Synchronous};
use crate::base::error::{Error, Result};

/// The schema of a new file, `schema.sql` at the repository root.
pub(crate) const SCHEMA_SQL: &str = include_str!("../../../schema.sql");

/// The schema version this library writes (`PRAGMA user_version`). Must match
/// the `PRAGMA user_version` line at the end of `schema.sql`.
pub const SCHEMA_VERSION: i64 = 14;

/// Steps that take an older file forward: the entry `(n, sql)` takes a file
/// from version `n - 1` to `n`, and its SQL ends by setting `user_version` to
/// `n`. A migrated file has the same tables, columns and views as a new one
/// (a test compares them).
const MIGRATIONS: &[(i64, &str)] = &[
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
];

/// Version 14: the log's id and subject indexes begin with the id and the
/// subject, then the workspace. They answer the same look-ups (each names
/// both), but the workspace is the same text in nearly every key of a file
/// with few workspaces: every comparison found it equal and went on through
/// SQLite's general comparison of the next column, a fifth of what a
/// relayed event cost. The two indexes are built again over the whole log,
/// in the migration's one transaction; no row changes.
const MIGRATE_TO_14: &str = "
DROP INDEX reflexr_events_by_id;
CREATE UNIQUE INDEX reflexr_events_by_id ON reflexr_events (id, workspace);
DROP INDEX reflexr_events_by_subject;
CREATE UNIQUE INDEX reflexr_events_by_subject ON reflexr_events (subject, workspace, version);
PRAGMA user_version = 14;
";

/// Version 13: the CHECKs of the runs, their log lines and their steps
/// spell their sets of values as `=` terms joined by OR, as does the
/// partial index of runs unique while active: SQLite built a temporary
/// b-tree for each IN list of more than two values at every statement that
/// checked it (half of what inserting a run cost). SQLite cannot change a
/// CHECK, so the three tables are rebuilt (their views and indexes with
/// them); no value changes. The renames are made the legacy way, which
/// leaves other views alone: an application's view of these tables would
/// otherwise fail the rename (it names a table dropped a moment before).
const MIGRATE_TO_13: &str = "
DROP VIEW reflexr_runs_by_state;
DROP VIEW reflexr_runs_by_key;
DROP VIEW reflexr_blocked_lanes;
CREATE TABLE reflexr_runs_v13 (
    ord              INTEGER PRIMARY KEY,
    id               TEXT NOT NULL UNIQUE,
    kind             TEXT NOT NULL
                     CHECK (kind = 'rule' OR kind = 'delivery' OR kind = 'job' OR kind = 'task'),
    action           TEXT NOT NULL,
    workspace        TEXT,
    rule             TEXT,
    scope            TEXT,
    lane             TEXT,
    on_dead_letter   TEXT NOT NULL DEFAULT 'continue'
                     CHECK (on_dead_letter IN ('continue', 'block')),
    input            TEXT NOT NULL CHECK (json_valid(input)),
    event_seq        INTEGER,
    event_id         TEXT,
    depth            INTEGER NOT NULL DEFAULT 0,
    state            TEXT NOT NULL
                     CHECK (state = 'waiting' OR state = 'ready' OR state = 'running'
                            OR state = 'succeeded' OR state = 'dead' OR state = 'discarded'
                            OR state = 'cancelled'),
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    backoff_ms       INTEGER NOT NULL CHECK (backoff_ms >= 0),
    backoff_max_ms   INTEGER NOT NULL CHECK (backoff_max_ms >= 0),
    backoff_factor   REAL NOT NULL CHECK (backoff_factor >= 1.0),
    jitter           REAL NOT NULL CHECK (jitter >= 0.0 AND jitter <= 1.0),
    due_at           INTEGER NOT NULL,
    claimed_by       TEXT,
    claim_expires_at INTEGER,
    checkpoint       TEXT CHECK (checkpoint IS NULL OR json_valid(checkpoint)),
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    priority         INTEGER NOT NULL DEFAULT 0,
    unique_key       TEXT,
    unique_mode      TEXT CHECK (unique_mode IS NULL OR unique_mode = 'pending'
                                 OR unique_mode = 'active' OR unique_mode = 'period'),
    started_at       INTEGER,
    cancel_requested_at INTEGER,
    cancelled_by     TEXT,
    cancel_reason    TEXT,
    output           TEXT CHECK (output IS NULL OR json_valid(output)),
    parent           TEXT,
    began_seq        INTEGER,
    flow_key         TEXT,
    traceparent      TEXT
) STRICT;
INSERT INTO reflexr_runs_v13 (ord, id, kind, action, workspace, rule, scope, lane, on_dead_letter, input, event_seq, event_id, depth, state, attempt, max_attempts, backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, claimed_by, claim_expires_at, checkpoint, last_error, created_at, updated_at, finished_at, priority, unique_key, unique_mode, started_at, cancel_requested_at, cancelled_by, cancel_reason, output, parent, began_seq, flow_key, traceparent)
SELECT ord, id, kind, action, workspace, rule, scope, lane, on_dead_letter, input, event_seq, event_id, depth, state, attempt, max_attempts, backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, claimed_by, claim_expires_at, checkpoint, last_error, created_at, updated_at, finished_at, priority, unique_key, unique_mode, started_at, cancel_requested_at, cancelled_by, cancel_reason, output, parent, began_seq, flow_key, traceparent FROM reflexr_runs;
DROP TABLE reflexr_runs;
PRAGMA legacy_alter_table = ON;
ALTER TABLE reflexr_runs_v13 RENAME TO reflexr_runs;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX reflexr_runs_due ON reflexr_runs (priority DESC, due_at)
    WHERE state = 'ready';
CREATE INDEX reflexr_runs_running ON reflexr_runs (claim_expires_at, action, flow_key)
    WHERE state = 'running';
CREATE INDEX reflexr_runs_at_rest ON reflexr_runs (state, due_at)
    WHERE state NOT IN ('ready', 'running');
CREATE INDEX reflexr_runs_waiting ON reflexr_runs (lane, ord)
    WHERE state = 'waiting';
CREATE INDEX reflexr_runs_by_change ON reflexr_runs (updated_at, ord);
CREATE INDEX reflexr_runs_keyed ON reflexr_runs (action, priority, flow_key, due_at)
    WHERE state = 'ready' AND flow_key IS NOT NULL;
CREATE UNIQUE INDEX reflexr_runs_unique_pending ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'pending' AND state IN ('waiting', 'ready');
CREATE UNIQUE INDEX reflexr_runs_unique_active ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'active' AND (state = 'waiting' OR state = 'ready' OR state = 'running');
CREATE INDEX reflexr_runs_by_parent ON reflexr_runs (parent) WHERE parent IS NOT NULL;
CREATE VIEW reflexr_runs_by_state AS
SELECT kind, action, state, count(*) AS runs,
       strftime('%Y-%m-%dT%H:%M:%fZ', min(due_at) / 1000.0, 'unixepoch') AS earliest_due
FROM reflexr_runs
GROUP BY kind, action, state;
CREATE VIEW reflexr_runs_by_key AS
SELECT action, flow_key AS key, state, count(*) AS runs
FROM reflexr_runs
WHERE flow_key IS NOT NULL
GROUP BY action, flow_key, state;
CREATE VIEW reflexr_blocked_lanes AS
SELECT l.lane, l.head, r.rule, r.scope, r.last_error,
       strftime('%Y-%m-%dT%H:%M:%fZ', l.updated_at / 1000.0, 'unixepoch') AS since
FROM reflexr_lanes l JOIN reflexr_runs r ON r.id = l.head
WHERE l.blocked = 1;
CREATE TABLE reflexr_run_logs_v13 (
    run     TEXT NOT NULL,
    n       INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    level   TEXT NOT NULL CHECK (level = 'error' OR level = 'warn' OR level = 'info'
                                 OR level = 'debug' OR level = 'trace'),
    message TEXT NOT NULL,
    fields  TEXT CHECK (fields IS NULL OR json_valid(fields)),
    PRIMARY KEY (run, n)
) STRICT, WITHOUT ROWID;
INSERT INTO reflexr_run_logs_v13 (run, n, attempt, at, level, message, fields)
SELECT run, n, attempt, at, level, message, fields FROM reflexr_run_logs;
DROP TABLE reflexr_run_logs;
PRAGMA legacy_alter_table = ON;
ALTER TABLE reflexr_run_logs_v13 RENAME TO reflexr_run_logs;
PRAGMA legacy_alter_table = OFF;
CREATE TABLE reflexr_steps_v13 (
    run         TEXT NOT NULL,
    name        TEXT NOT NULL,
    position    INTEGER NOT NULL CHECK (position >= 0),
    kind        TEXT NOT NULL
                CHECK (kind = 'begin' OR kind = 'step' OR kind = 'tx' OR kind = 'sleep'
                       OR kind = 'wait' OR kind = 'spawn' OR kind = 'join' OR kind = 'patch'),
    state       TEXT NOT NULL CHECK (state IN ('done', 'waiting')),
    attempt     INTEGER NOT NULL,
    output      TEXT CHECK (output IS NULL OR json_valid(output)),
    detail      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail)),
    wake_at     INTEGER,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (run, name)
) STRICT, WITHOUT ROWID;
INSERT INTO reflexr_steps_v13 (run, name, position, kind, state, attempt, output, detail, wake_at, recorded_at)
SELECT run, name, position, kind, state, attempt, output, detail, wake_at, recorded_at FROM reflexr_steps;
DROP TABLE reflexr_steps;
PRAGMA legacy_alter_table = ON;
ALTER TABLE reflexr_steps_v13 RENAME TO reflexr_steps;
PRAGMA legacy_alter_table = OFF;
CREATE UNIQUE INDEX reflexr_steps_by_position ON reflexr_steps (run, position);
PRAGMA user_version = 13;
";

/// Version 12: fewer index entries move when a run is claimed and settled.
/// The claim's index holds only ready runs; the running runs' index also
/// says when each claim expires (the index of lapsed claims goes); the runs
/// neither ready nor running get an index of their own. No row changes.
const MIGRATE_TO_12: &str = "
DROP INDEX reflexr_runs_due;
DROP INDEX reflexr_runs_lapsed;
DROP INDEX reflexr_runs_running;
CREATE INDEX reflexr_runs_due ON reflexr_runs (priority DESC, due_at)
    WHERE state = 'ready';
CREATE INDEX reflexr_runs_running ON reflexr_runs (claim_expires_at, action, flow_key)
    WHERE state = 'running';
CREATE INDEX reflexr_runs_at_rest ON reflexr_runs (state, due_at)
    WHERE state NOT IN ('ready', 'running');
PRAGMA user_version = 12;
";

/// Version 11: what runs' handlers logged, and how far they got; the W3C
/// trace context of events and runs.
const MIGRATE_TO_11: &str = "
ALTER TABLE reflexr_events ADD COLUMN traceparent TEXT;
ALTER TABLE reflexr_runs ADD COLUMN traceparent TEXT;
-- What a run's handler logged during its attempts (RunContext::log), each
-- line committed as it was logged: n counts the run's lines across its
-- attempts; level is error, warn, info, debug or trace; fields a JSON value.
-- Deleted with the run.
CREATE TABLE reflexr_run_logs (
    run     TEXT NOT NULL,
    n       INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    level   TEXT NOT NULL CHECK (level IN ('error', 'warn', 'info', 'debug', 'trace')),
    message TEXT NOT NULL,
    fields  TEXT CHECK (fields IS NULL OR json_valid(fields)),
    PRIMARY KEY (run, n)
) STRICT, WITHOUT ROWID;

-- How far a run's handler last said it got (RunContext::progress): done of
-- total, in which attempt, when. Deleted with the run.
CREATE TABLE reflexr_run_progress (
    run     TEXT PRIMARY KEY,
    attempt INTEGER NOT NULL,
    done    INTEGER NOT NULL CHECK (done >= 0),
    total   INTEGER NOT NULL CHECK (total >= 0),
    at      INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
PRAGMA user_version = 11;
";

/// Version 10: flow control by key. Runs carry a key (`flow_key`, NULL for
/// an action without keys); actions may be fair (claims serve their keys in
/// turn) with a key path and a virtual clock; per-key overrides of the
/// limits and weights; the passes of the keys a fair claim served. A file's
/// partitioned actions get their key path, and their unfinished runs the
/// key their input names, as configuring them would.
const MIGRATE_TO_10: &str = "
ALTER TABLE reflexr_runs ADD COLUMN flow_key TEXT;
CREATE INDEX reflexr_runs_keyed ON reflexr_runs (action, priority, flow_key, due_at)
    WHERE state = 'ready' AND flow_key IS NOT NULL;
ALTER TABLE reflexr_actions ADD COLUMN fair INTEGER NOT NULL DEFAULT 0 CHECK (fair IN (0, 1));
ALTER TABLE reflexr_actions ADD COLUMN key_path TEXT;
ALTER TABLE reflexr_actions ADD COLUMN fair_clock REAL NOT NULL DEFAULT 0;
UPDATE reflexr_actions SET key_path = CASE WHEN substr(partition_by, 1, 1) = '$'
    THEN partition_by ELSE '$.\"' || partition_by || '\"' END
  WHERE partition_by IS NOT NULL;
UPDATE reflexr_runs SET flow_key = coalesce(CAST(json_extract(input,
    (SELECT key_path FROM reflexr_actions a WHERE a.action = reflexr_runs.action)) AS TEXT), '')
  WHERE state IN ('waiting', 'ready', 'running')
    AND action IN (SELECT action FROM reflexr_actions WHERE key_path IS NOT NULL);
CREATE TABLE reflexr_action_keys (
    action         TEXT NOT NULL,
    key            TEXT NOT NULL,
    max_running    INTEGER CHECK (max_running IS NULL OR max_running >= 1),
    rate_count     INTEGER CHECK (rate_count IS NULL OR rate_count >= 1),
    rate_period_ms INTEGER CHECK (rate_period_ms IS NULL OR rate_period_ms >= 1),
    weight         INTEGER CHECK (weight IS NULL OR weight >= 1),
    updated_at     INTEGER NOT NULL,
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL)),
    PRIMARY KEY (action, key)
) STRICT, WITHOUT ROWID;
CREATE TABLE reflexr_key_passes (
    action TEXT NOT NULL,
    key    TEXT NOT NULL,
    pass   REAL NOT NULL,
    PRIMARY KEY (action, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX reflexr_key_passes_by_pass ON reflexr_key_passes (action, pass);
CREATE VIEW reflexr_runs_by_key AS
SELECT action, flow_key AS key, state, count(*) AS runs
FROM reflexr_runs
WHERE flow_key IS NOT NULL
GROUP BY action, flow_key, state;
PRAGMA user_version = 10;
";

/// Version 9: rule versions warmed up in shadow (a rule's row may be a
/// shadow of another, with a handover position and what it would have
/// fired).
const MIGRATE_TO_9: &str = "
ALTER TABLE reflexr_rules ADD COLUMN shadow_of TEXT;
ALTER TABLE reflexr_rules ADD COLUMN promote_at INTEGER;
ALTER TABLE reflexr_rules ADD COLUMN shadow_fired INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reflexr_rules ADD COLUMN shadow_errored INTEGER NOT NULL DEFAULT 0;
PRAGMA user_version = 9;
";

/// Version 8: subject versions. Each event has its place among its
/// subject's events (counted, for the events a file has, in seq order: a
/// subject whose older events were pruned before counts from its oldest
/// event still kept), under a unique index that also reads a subject's
/// stream; pruning keeps a subject's reached version in
/// `reflexr_subject_floors`.
const MIGRATE_TO_8: &str = "
ALTER TABLE reflexr_events ADD COLUMN version INTEGER NOT NULL DEFAULT 0 CHECK (version >= 0);
UPDATE reflexr_events SET version = v.n
  FROM (SELECT seq, row_number() OVER (PARTITION BY workspace, subject ORDER BY seq) AS n
          FROM reflexr_events) AS v
 WHERE v.seq = reflexr_events.seq;
CREATE UNIQUE INDEX reflexr_events_by_subject ON reflexr_events (workspace, subject, version);
CREATE TABLE reflexr_subject_floors (
    workspace TEXT NOT NULL,
    subject   TEXT NOT NULL,
    version   INTEGER NOT NULL CHECK (version >= 1),
    PRIMARY KEY (workspace, subject)
) STRICT, WITHOUT ROWID;
DROP VIEW reflexr_event_log;
CREATE VIEW reflexr_event_log AS
SELECT seq,
       workspace,
       id,
       type,
       subject,
       version,
       actor,
       strftime('%Y-%m-%dT%H:%M:%fZ', occurred_at / 1000.0, 'unixepoch') AS occurred,
       strftime('%Y-%m-%dT%H:%M:%fZ', recorded_at / 1000.0, 'unixepoch') AS recorded,
       depth,
       causation_id,
       correlation_id,
       payload
FROM reflexr_events;
PRAGMA user_version = 8;
";

/// Version 7: durable workflows. A run may have a parent (a workflow that
/// spawned it), an output, and the log's head when it was first claimed
/// (`began_seq`: its waits look after it); its steps, and what suspended runs wait for
/// (an event of the log, other runs' ends), have tables of their own.
const MIGRATE_TO_7: &str = "
ALTER TABLE reflexr_runs ADD COLUMN output TEXT CHECK (output IS NULL OR json_valid(output));
ALTER TABLE reflexr_runs ADD COLUMN parent TEXT;
ALTER TABLE reflexr_runs ADD COLUMN began_seq INTEGER;
CREATE INDEX reflexr_runs_by_parent ON reflexr_runs (parent) WHERE parent IS NOT NULL;
CREATE TABLE reflexr_steps (
    run         TEXT NOT NULL,
    name        TEXT NOT NULL,
    position    INTEGER NOT NULL CHECK (position >= 0),
    kind        TEXT NOT NULL
                CHECK (kind IN ('begin', 'step', 'tx', 'sleep', 'wait', 'spawn', 'join', 'patch')),
    state       TEXT NOT NULL CHECK (state IN ('done', 'waiting')),
    attempt     INTEGER NOT NULL,
    output      TEXT CHECK (output IS NULL OR json_valid(output)),
    detail      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail)),
    wake_at     INTEGER,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (run, name)
) STRICT, WITHOUT ROWID;
CREATE UNIQUE INDEX reflexr_steps_by_position ON reflexr_steps (run, position);
CREATE TABLE reflexr_event_waits (
    run       TEXT NOT NULL,
    step      TEXT NOT NULL,
    workspace TEXT NOT NULL,
    type      TEXT NOT NULL,
    by        TEXT NOT NULL,
    key       TEXT NOT NULL,
    after_seq INTEGER NOT NULL,
    PRIMARY KEY (run, step)
) STRICT, WITHOUT ROWID;
CREATE INDEX reflexr_event_waits_by_match ON reflexr_event_waits (workspace, type, by, key);
CREATE TABLE reflexr_wait_positions (
    workspace TEXT PRIMARY KEY,
    position  INTEGER NOT NULL CHECK (position >= 0)
) STRICT, WITHOUT ROWID;
CREATE TABLE reflexr_run_waits (
    child TEXT NOT NULL,
    run   TEXT NOT NULL,
    step  TEXT NOT NULL,
    PRIMARY KEY (child, run, step)
) STRICT, WITHOUT ROWID;
CREATE INDEX reflexr_run_waits_by_run ON reflexr_run_waits (run);
PRAGMA user_version = 7;
";

/// Version 6: a follower may publish into PostgreSQL (`target_postgres`,
/// the name of a target a process registered).
const MIGRATE_TO_6: &str = "
ALTER TABLE reflexr_followers ADD COLUMN target_postgres TEXT;
DROP VIEW reflexr_follower_status;
CREATE VIEW reflexr_follower_status AS
SELECT f.name, f.source, f.target,
       coalesce(f.target_file, 'postgres:' || f.target_postgres, '(this file)') AS target_file,
       f.projection, c.position AS cursor,
       (SELECT count(*) FROM reflexr_events e
         WHERE e.workspace = f.source AND e.seq > c.position) AS lag,
       f.published, f.dead_letters, f.stops, f.last_error
FROM reflexr_followers f
LEFT JOIN reflexr_cursors c
  ON c.workspace = f.source AND c.kind = 'follower' AND c.name = f.name;
PRAGMA user_version = 6;
";

/// Version 5: control of the work. The runs table is rebuilt (SQLite cannot
/// change a CHECK): kind `task`, state `cancelled`, priority, uniqueness,
/// start and cancel columns; the claim's index orders by priority; new
/// tables for pauses, per-action settings and limits, rate windows and
/// unique periods.
const MIGRATE_TO_5: &str = "
DROP VIEW reflexr_runs_by_state;
DROP VIEW reflexr_blocked_lanes;
DROP INDEX reflexr_runs_due;
DROP INDEX reflexr_runs_lapsed;
DROP INDEX reflexr_runs_waiting;
DROP INDEX reflexr_runs_by_change;
CREATE TABLE reflexr_runs_v5 (
    ord              INTEGER PRIMARY KEY,
    id               TEXT NOT NULL UNIQUE,
    kind             TEXT NOT NULL CHECK (kind IN ('rule', 'delivery', 'job', 'task')),
    action           TEXT NOT NULL,
    workspace        TEXT,
    rule             TEXT,
    scope            TEXT,
    lane             TEXT,
    on_dead_letter   TEXT NOT NULL DEFAULT 'continue'
                     CHECK (on_dead_letter IN ('continue', 'block')),
    input            TEXT NOT NULL CHECK (json_valid(input)),
    event_seq        INTEGER,
    event_id         TEXT,
    depth            INTEGER NOT NULL DEFAULT 0,
    state            TEXT NOT NULL
                     CHECK (state IN ('waiting', 'ready', 'running', 'succeeded', 'dead',
                                      'discarded', 'cancelled')),
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    backoff_ms       INTEGER NOT NULL CHECK (backoff_ms >= 0),
    backoff_max_ms   INTEGER NOT NULL CHECK (backoff_max_ms >= 0),
    backoff_factor   REAL NOT NULL CHECK (backoff_factor >= 1.0),
    jitter           REAL NOT NULL CHECK (jitter >= 0.0 AND jitter <= 1.0),
    due_at           INTEGER NOT NULL,
    claimed_by       TEXT,
    claim_expires_at INTEGER,
    checkpoint       TEXT CHECK (checkpoint IS NULL OR json_valid(checkpoint)),
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    priority         INTEGER NOT NULL DEFAULT 0,
    unique_key       TEXT,
    unique_mode      TEXT CHECK (unique_mode IS NULL OR unique_mode IN ('pending', 'active', 'period')),
    started_at       INTEGER,
    cancel_requested_at INTEGER,
    cancelled_by     TEXT,
    cancel_reason    TEXT
) STRICT;
INSERT INTO reflexr_runs_v5 (ord, id, kind, action, workspace, rule, scope, lane, on_dead_letter, input, event_seq, event_id, depth, state, attempt, max_attempts, backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, claimed_by, claim_expires_at, checkpoint, last_error, created_at, updated_at, finished_at)
SELECT ord, id, kind, action, workspace, rule, scope, lane, on_dead_letter, input, event_seq, event_id, depth, state, attempt, max_attempts, backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, claimed_by, claim_expires_at, checkpoint, last_error, created_at, updated_at, finished_at FROM reflexr_runs;
DROP TABLE reflexr_runs;
PRAGMA legacy_alter_table = ON;
ALTER TABLE reflexr_runs_v5 RENAME TO reflexr_runs;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX reflexr_runs_due ON reflexr_runs (state, priority DESC, due_at);
CREATE INDEX reflexr_runs_lapsed ON reflexr_runs (claim_expires_at)
    WHERE state = 'running';
CREATE INDEX reflexr_runs_waiting ON reflexr_runs (lane, ord)
    WHERE state = 'waiting';
CREATE INDEX reflexr_runs_by_change ON reflexr_runs (updated_at, ord);
CREATE INDEX reflexr_runs_running ON reflexr_runs (action) WHERE state = 'running';
CREATE UNIQUE INDEX reflexr_runs_unique_pending ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'pending' AND state IN ('waiting', 'ready');
CREATE UNIQUE INDEX reflexr_runs_unique_active ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'active' AND state IN ('waiting', 'ready', 'running');
CREATE TABLE reflexr_paused (
    kind     TEXT NOT NULL CHECK (kind IN ('action', 'rule', 'reaction')),
    name     TEXT NOT NULL,
    since    INTEGER NOT NULL,
    operator TEXT NOT NULL,
    reason   TEXT NOT NULL,
    PRIMARY KEY (kind, name)
) STRICT, WITHOUT ROWID;

CREATE TABLE reflexr_actions (
    action         TEXT PRIMARY KEY,
    priority       INTEGER NOT NULL DEFAULT 0,
    max_running    INTEGER CHECK (max_running IS NULL OR max_running >= 1),
    rate_count     INTEGER CHECK (rate_count IS NULL OR rate_count >= 1),
    rate_period_ms INTEGER CHECK (rate_period_ms IS NULL OR rate_period_ms >= 1),
    partition_by   TEXT,
    updated_at     INTEGER NOT NULL,
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
) STRICT, WITHOUT ROWID;

CREATE TABLE reflexr_starts (
    action TEXT NOT NULL,
    part   TEXT NOT NULL,
    at     INTEGER NOT NULL,
    n      INTEGER NOT NULL CHECK (n >= 1)
) STRICT;
CREATE INDEX reflexr_starts_window ON reflexr_starts (action, part, at);

CREATE TABLE reflexr_unique_periods (
    action TEXT NOT NULL,
    key    TEXT NOT NULL,
    until  INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (action, key)
) STRICT, WITHOUT ROWID;
CREATE VIEW reflexr_runs_by_state AS
SELECT kind, action, state, count(*) AS runs,
       strftime('%Y-%m-%dT%H:%M:%fZ', min(due_at) / 1000.0, 'unixepoch') AS earliest_due
FROM reflexr_runs
GROUP BY kind, action, state;

CREATE VIEW reflexr_blocked_lanes AS
SELECT l.lane, l.head, r.rule, r.scope, r.last_error,
       strftime('%Y-%m-%dT%H:%M:%fZ', l.updated_at / 1000.0, 'unixepoch') AS since
FROM reflexr_lanes l JOIN reflexr_runs r ON r.id = l.head
WHERE l.blocked = 1;
PRAGMA user_version = 5;
";

/// Version 4: the blocked lanes, indexed (operators list them).
const MIGRATE_TO_4: &str = "
CREATE INDEX reflexr_lanes_blocked ON reflexr_lanes (updated_at) WHERE blocked = 1;
PRAGMA user_version = 4;
";

/// Version 3: runs indexed by when they changed (the feed of run changes).
const MIGRATE_TO_3: &str = "
CREATE INDEX reflexr_runs_by_change ON reflexr_runs (updated_at, ord);
PRAGMA user_version = 3;
";

/// Version 2: cursors know their high-water mark (replays keep their firing
/// ids) and their failures at one position (stuck consumers); followers
/// take restart requests from any process.
const MIGRATE_TO_2: &str = "
ALTER TABLE reflexr_cursors ADD COLUMN high_water INTEGER NOT NULL DEFAULT 0 CHECK (high_water >= 0);
UPDATE reflexr_cursors SET high_water = position;
ALTER TABLE reflexr_cursors ADD COLUMN failures INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0);
ALTER TABLE reflexr_cursors ADD COLUMN last_error TEXT;
ALTER TABLE reflexr_cursors ADD COLUMN failed_at INTEGER;
ALTER TABLE reflexr_followers ADD COLUMN restart_requests INTEGER NOT NULL DEFAULT 0 CHECK (restart_requests >= 0);
CREATE VIEW reflexr_stuck_consumers AS
SELECT workspace, kind, name, position, failures, last_error,
       strftime('%Y-%m-%dT%H:%M:%fZ', failed_at / 1000.0, 'unixepoch') AS last_failed
FROM reflexr_cursors
WHERE failures >= 3;
PRAGMA user_version = 2;
";

/// A table every reflexr file has; its absence means the file is not (yet) one.
const MARKER_TABLE: &str = "reflexr_events";

/// What a file says about itself before anything is written to it.
struct Probe {
    user_version: i64,
    has_reflexr_tables: bool,
    /// Any table, index or view named reflexr_*.
    reflexr_objects: i64,
}

/// Opens (creating if allowed) the file at `path` and returns the connection
/// the writer will use, configured and with the schema current.
pub(crate) fn open_writer(
    path: &Path,
    vfs: Option<&str>,
    create: bool,
    sync: Synchronous,
    verify: bool,
    busy_timeout: Duration,
) -> Result<Connection> {
    if path.is_dir() {
        return Err(Error::invalid(
            "path",
            format!("{} is a directory", path.display()),
        ));
    }
    if !create && !path.exists() {
        return Err(Error::Missing {
            path: path.to_path_buf(),
        });
    }
    let conn = conn::open_raw(path, create, vfs).map_err(|e| at_path(e, path))?;
    let probe = conn::retry_busy(busy_timeout, || probe(&conn)).map_err(|e| at_path(e, path))?;
    // SQLite opens a file it cannot write read-only, without a word; an
    // engine whose every write would then fail is refused here instead.
    if conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(Error::ReadOnly {
            detail: format!(
                "{} cannot be written (a read-only file, directory or file system)",
                path.display()
            ),
        });
    }
    check_probe(&probe, path, SCHEMA_VERSION)?;
    if verify {
        quick_check(&conn)?;
    }
    // Switching a new file to WAL takes an exclusive lock: several processes
    // opening one new file at once wait for each other here.
    conn::retry_busy(busy_timeout, || conn::enable_wal(&conn)).map_err(|e| at_path(e, path))?;
    conn::retry_busy(busy_timeout, || conn::configure(&conn, sync, Role::Writer))?;
    migrate(&conn, path, busy_timeout)?;
    Ok(conn)
}

fn probe(conn: &Connection) -> Result<Probe> {
    // Reading the header and the schema table is what tells a foreign or
    // damaged file apart; neither read writes anything. One statement, so
    // one snapshot: read apart, another process creating the schema between
    // the reads would make a new file look like a foreign one (a version of
    // 0 from before its commit, reflexr's tables from after).
    conn.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version), \
           EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1), \
           (SELECT count(*) FROM sqlite_schema WHERE name LIKE 'reflexr\\_%' ESCAPE '\\')",
        [MARKER_TABLE],
        |r| {
            Ok(Probe {
                user_version: r.get(0)?,
                has_reflexr_tables: r.get(1)?,
                reflexr_objects: r.get(2)?,
            })
        },
    )
    .map_err(Into::into)
}

fn check_probe(p: &Probe, path: &Path, supported: i64) -> Result<()> {
    if p.user_version > 0 && !p.has_reflexr_tables {
        return Err(Error::ForeignDatabase {
            path: path.to_path_buf(),
            detail: format!(
                "its user_version is {} but it has no reflexr tables: \
                 another program versions this file",
                p.user_version
            ),
        });
    }
    if p.user_version > supported {
        return Err(Error::SchemaTooNew {
            path: path.to_path_buf(),
            found: p.user_version,
            supported,
        });
    }
    if p.user_version == 0 && p.reflexr_objects > 0 {
        // Either a clash of names with the application's own tables, or a
        // copy of reflexr's tables without their version: neither is ours to
        // build on.
        return Err(Error::ForeignDatabase {
            path: path.to_path_buf(),
            detail: format!(
                "it has {} table(s), index(es) or view(s) named reflexr_* \
                 but no reflexr schema version",
                p.reflexr_objects
            ),
        });
    }
    Ok(())
}

/// `PRAGMA quick_check`: reads every page, so it costs time in proportion to
/// the file. Only on request ([`crate::Builder::verify_on_open`]) and
/// from [`crate::Engine::check_integrity`].
pub(crate) fn quick_check(conn: &Connection) -> Result<()> {
    let mut stmt = conn.prepare("PRAGMA quick_check")?;
    let problems: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    if problems.len() == 1 && problems[0] == "ok" {
        Ok(())
    } else {
        Err(Error::Corrupt {
            detail: format!("quick_check: {}", problems.join("; ")),
        })
    }
}

fn migrate(conn: &Connection, path: &Path, busy_timeout: Duration) -> Result<()> {
    migrate_with(
        conn,
        path,
        busy_timeout,
        SCHEMA_SQL,
        SCHEMA_VERSION,
        MIGRATIONS,
    )
}

/// Brings the file to `version` in one transaction: the full `schema` for a new
/// file, or the steps of `migrations` after the file's version. Two processes
/// opening one new file at once both get here; `BEGIN IMMEDIATE` makes the
/// second wait, and it finds the work done.
fn migrate_with(
    conn: &Connection,
    path: &Path,
    busy_timeout: Duration,
    schema: &str,
    version: i64,
    migrations: &[(i64, &str)],
) -> Result<()> {
    conn::retry_busy(busy_timeout, || Ok(conn.execute_batch("BEGIN IMMEDIATE")?))?;
    let result = (|| {
        let p = probe(conn)?;
        check_probe(&p, path, version)?;
        if p.user_version == version {
            return Ok(());
        }
        if p.user_version == 0 {
            conn.execute_batch(schema).map_err(|e| clash(e, path))?;
        } else {
            for (to, sql) in migrations.iter().filter(|(to, _)| *to > p.user_version) {
                log::info!("migrating {} to reflexr schema {to}", path.display());
                conn.execute_batch(sql)?;
            }
        }
        let now: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if now != version {
            return Err(Error::Storage {
                code: None,
                message: format!(
                    "schema migration ended at version {now}, expected {version} \
                     (a migration step does not set user_version)"
                ),
            });
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            conn.execute_batch("COMMIT")?;
            Ok(())
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// A table or index of reflexr's that the application already has under the
/// same name.
fn clash(e: rusqlite::Error, path: &Path) -> Error {
    let message = e.to_string();
    if message.contains("already exists") {
        Error::ForeignDatabase {
            path: path.to_path_buf(),
            detail: message,
        }
    } else {
        e.into()
    }
}

/// The errors of the first reads of a file, said about the file.
fn at_path(e: Error, path: &Path) -> Error {
    match e {
        Error::NotADatabase { .. } => Error::NotADatabase {
            path: path.to_path_buf(),
        },
        Error::Corrupt { detail } => Error::Corrupt {
            detail: format!("{}: {detail}", path.display()),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_sql_declares_the_library_version() {
        let last = SCHEMA_SQL
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap();
        assert_eq!(
            last.trim(),
            format!("PRAGMA user_version = {SCHEMA_VERSION};")
        );
    }

    /// The tables whose inserts are rare enough that a temporary b-tree
    /// per insert costs nothing worth a rebuild: a row per consumer (made
    /// at its first move; every later move is an update), per dead letter,
    /// per pause.
    const WRITTEN_RARELY: &[&str] = &["reflexr_cursors", "reflexr_dead_letters", "reflexr_paused"];

    fn opcodes(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(1))
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn writing_a_row_builds_no_temporary_table_for_its_checks() {
        // What a firing, an enqueue, a claim, a settlement, a step or a log
        // line writes is checked against the schema's CHECKs and partial
        // indexes at every statement: one that builds a temporary b-tree
        // (SQLite does for an IN list of more than two values) costs more
        // than the row's own write. No insert into a table written per
        // event, run, step or log line, and no change of a run's state,
        // builds one.
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("t.db")).unwrap();
        conn.execute_batch(SCHEMA_SQL).unwrap();
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(tables.len() > 20, "{tables:?}");
        for table in tables
            .iter()
            .filter(|t| !WRITTEN_RARELY.contains(&t.as_str()))
        {
            let columns: Vec<String> = conn
                .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            let insert = format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                columns.join(", "),
                vec!["?"; columns.len()].join(", ")
            );
            let ops = opcodes(&conn, &insert);
            assert!(
                !ops.iter().any(|o| o == "OpenEphemeral"),
                "{table}: {ops:?}"
            );
        }
        for set in ["state = ?1", "state = ?1, unique_mode = ?2", "kind = ?1"] {
            let ops = opcodes(
                &conn,
                &format!("UPDATE reflexr_runs SET {set} WHERE ord = ?9"),
            );
            assert!(!ops.iter().any(|o| o == "OpenEphemeral"), "{set}: {ops:?}");
        }
        // Nor do the statements that write them once per batch or firing:
        // a cursor's move, a fresh run claimed for an idle executor, the
        // look at whether its action is limited.
        for sql in [
            crate::store::sqlite::cursors::ADVANCE.to_string(),
            crate::store::sqlite::runs::claim_ord_sql(),
            crate::store::sqlite::runs::claim_fresh_sql(),
            crate::store::sqlite::control::limited_one_sql(),
        ] {
            let ops = opcodes(&conn, &sql);
            assert!(!ops.iter().any(|o| o == "OpenEphemeral"), "{sql}: {ops:?}");
        }
        // The rare ones do build one: the list above says why they may.
        for table in WRITTEN_RARELY {
            let ops = opcodes(&conn, &format!("INSERT INTO {table} (kind) VALUES (?)"));
            assert!(ops.iter().any(|o| o == "OpenEphemeral"), "{table}: {ops:?}");
        }
    }

    #[test]
    fn migrations_take_a_file_forward_step_by_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        let conn = Connection::open(&path).unwrap();
        let v1 = "CREATE TABLE reflexr_events (seq INTEGER PRIMARY KEY); PRAGMA user_version = 1;";
        let steps: &[(i64, &str)] = &[
            (
                2,
                "ALTER TABLE reflexr_events ADD COLUMN a TEXT; PRAGMA user_version = 2;",
            ),
            (
                3,
                "ALTER TABLE reflexr_events ADD COLUMN b TEXT; PRAGMA user_version = 3;",
            ),
        ];
        let t = Duration::from_secs(1);
        migrate_with(&conn, &path, t, v1, 1, steps).unwrap();
        migrate_with(&conn, &path, t, v1, 3, steps).unwrap();
        let cols: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('reflexr_events')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(cols, 3);
        // A step that forgets to set the version is caught and rolled back.
        let bad: &[(i64, &str)] = &[(4, "ALTER TABLE reflexr_events ADD COLUMN c TEXT;")];
        let err = migrate_with(&conn, &path, t, v1, 4, bad).unwrap_err();
        assert!(err.to_string().contains("ended at version 3"), "{err}");
        let cols: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('reflexr_events')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(cols, 3, "the failed step was rolled back");
    }
}
