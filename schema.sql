-- reflexr schema.
--
-- Embedded in the library with include_str! and applied, in one transaction,
-- to a file whose user_version is 0. Older files are migrated forward step by
-- step (src/store/schema.rs); a file whose user_version is newer than the
-- library's is refused. Loads in any sqlite3 shell from 3.38 on (STRICT
-- tables, unixepoch()); nothing here needs a newer one.
--
-- Conventions: every table is named reflexr_*, so the engine can share a file
-- with the application's own tables. Times are integer milliseconds since the
-- Unix epoch (the views show them as ISO-8601 text). Payloads are JSON text,
-- readable with json_extract(). A CHECK that a column holds one of a set of
-- values, in a table written per run, step or log line, spells the set as
-- `=` terms joined by OR: SQLite builds a temporary b-tree for an IN list of
-- more than two values each time a statement checks it (half of what
-- inserting a run cost).

-- A named log inside the file: a tenant, an app, an edge device.
CREATE TABLE reflexr_workspaces (
    name       TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- The event types a workspace accepts. The reserved types (RuleFired,
-- RuleErrored) are registered for every workspace when it is created, and only
-- the engine appends them.
CREATE TABLE reflexr_event_types (
    workspace     TEXT NOT NULL REFERENCES reflexr_workspaces (name),
    type          TEXT NOT NULL,
    reserved      INTEGER NOT NULL DEFAULT 0 CHECK (reserved IN (0, 1)),
    registered_at INTEGER NOT NULL,
    PRIMARY KEY (workspace, type)
) STRICT, WITHOUT ROWID;

-- The change log. seq is file-wide, assigned at append, strictly increasing in
-- commit order; AUTOINCREMENT keeps a pruned number from ever coming back.
-- depth is the event's place in a chain of causes (0 for an application's own
-- event; a run's emitted event is one deeper than the event that fired it).
CREATE TABLE reflexr_events (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace      TEXT NOT NULL,
    id             TEXT NOT NULL,
    type           TEXT NOT NULL,
    subject        TEXT NOT NULL,
    actor          TEXT NOT NULL,
    occurred_at    INTEGER NOT NULL,
    recorded_at    INTEGER NOT NULL,
    payload        TEXT NOT NULL CHECK (json_valid(payload)),
    causation_id   TEXT,
    correlation_id TEXT,
    depth          INTEGER NOT NULL DEFAULT 0 CHECK (depth >= 0),
    -- The subject version: the event's 1-based place among its subject's
    -- events in the workspace (what an append may expect).
    version        INTEGER NOT NULL DEFAULT 0 CHECK (version >= 0),
    -- The W3C trace context of the work that appended it, if any.
    traceparent    TEXT,
    FOREIGN KEY (workspace, type) REFERENCES reflexr_event_types (workspace, type)
) STRICT;

-- Once per id (invariant 3), and the lookup that makes re-appending a no-op.
-- The id first: a file's few workspaces make the workspace the same text in
-- nearly every key, and SQLite compares a key's first text column fastest.
CREATE UNIQUE INDEX reflexr_events_by_id ON reflexr_events (id, workspace);
-- Every consumer's read: a workspace after its cursor, in seq order.
CREATE INDEX reflexr_events_by_workspace ON reflexr_events (workspace, seq);
-- A subject's stream: its version at append, and its events in order, at a
-- cost that does not grow with the log. Unique: one event per version. The
-- subject first, as the id above.
CREATE UNIQUE INDEX reflexr_events_by_subject ON reflexr_events (subject, workspace, version);

-- The version a subject had reached when pruning deleted its events, so its
-- next event goes on from there rather than from 1.
CREATE TABLE reflexr_subject_floors (
    workspace TEXT NOT NULL,
    subject   TEXT NOT NULL,
    version   INTEGER NOT NULL CHECK (version >= 1),
    PRIMARY KEY (workspace, subject)
) STRICT, WITHOUT ROWID;

-- A consumer's last handled seq in one workspace. Moves only forward, except
-- by an operator's reset, which reflexr_audit records. high_water is the
-- furthest it has ever been (a rule below it is replaying). failures counts
-- the commits that failed at this position (reset when it moves): a
-- consumer whose commit keeps failing is stuck, and shows in
-- reflexr_stuck_consumers with its last error.
CREATE TABLE reflexr_cursors (
    workspace  TEXT NOT NULL REFERENCES reflexr_workspaces (name),
    kind       TEXT NOT NULL CHECK (kind IN ('app', 'rule', 'reaction', 'follower')),
    name       TEXT NOT NULL,
    position   INTEGER NOT NULL CHECK (position >= 0),
    updated_at INTEGER NOT NULL,
    high_water INTEGER NOT NULL DEFAULT 0 CHECK (high_water >= 0),
    failures   INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
    last_error TEXT,
    failed_at  INTEGER,
    PRIMARY KEY (workspace, kind, name)
) STRICT, WITHOUT ROWID;

-- Leases keep one holder at a time on a piece of work. generation is the
-- fencing token: it goes up whenever an expired lease is taken, and is never
-- reused, because a released lease keeps its row.
CREATE TABLE reflexr_leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    generation  INTEGER NOT NULL CHECK (generation >= 1),
    acquired_at INTEGER NOT NULL,
    renewed_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- What operators did: cursor resets and every other manual intervention.
CREATE TABLE reflexr_audit (
    id       INTEGER PRIMARY KEY,
    at       INTEGER NOT NULL,
    operator TEXT NOT NULL,
    action   TEXT NOT NULL,
    target   TEXT NOT NULL,
    reason   TEXT NOT NULL,
    detail   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail))
) STRICT;

-- Rules the file has seen, as their code last registered them. A rule that
-- disappears from code keeps its rows (cursor, state, runs) until an operator
-- deletes it.
CREATE TABLE reflexr_rules (
    name          TEXT PRIMARY KEY,
    workspace     TEXT NOT NULL REFERENCES reflexr_workspaces (name),
    version       INTEGER NOT NULL CHECK (version >= 1),
    definition    TEXT NOT NULL CHECK (json_valid(definition)),
    registered_at INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    -- A version warmed up in shadow: the live rule it will take over from
    -- (its row is named <rule>@v<version>). It decides and keeps its own
    -- state and cursor but fires nothing; what it would have done is
    -- counted. promote_at is the handover position an operator's promote
    -- set: the live version decides up to it, this one after it.
    shadow_of      TEXT,
    promote_at     INTEGER,
    shadow_fired   INTEGER NOT NULL DEFAULT 0,
    shadow_errored INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

-- A rule's state per scope, as JSON. Written in the same transaction as the
-- rule's cursor, so state and cursor never disagree (invariant 4).
CREATE TABLE reflexr_rule_state (
    rule        TEXT NOT NULL,
    scope       TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (json_valid(state)),
    updated_seq INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (rule, scope)
) STRICT, WITHOUT ROWID;

-- The work queue: every at-least-once action (rule runs; deliveries and
-- scheduled occurrences use it too). id is the firing id = run id =
-- idempotency key. ord gives firing order within a lane.
--
-- state: waiting (behind an earlier run of its lane), ready (claimable once
-- due_at has passed; a retry waits here), running (claimed by claimed_by at
-- attempt; claimable again once claim_expires_at has passed), succeeded,
-- dead (gave up; see reflexr_dead_letters), discarded (an operator dropped it),
-- cancelled (an operator cancelled it before it ended: cancelled_by and
-- cancel_reason say who and why). kind: rule (a firing), delivery, job (a
-- scheduled occurrence), task (enqueued directly). priority: higher first.
-- unique_key / unique_mode: no second run of the action with the key while
-- one is pending ('pending'), pending or running ('active'), or within a
-- period ('period', kept in reflexr_unique_periods). started_at: when the
-- current (or last) attempt was claimed. cancel_requested_at: a running run
-- asked to stop; its completion is refused.
CREATE TABLE reflexr_runs (
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

-- Claims: the ready runs by priority, then due time. Only ready runs are
-- in it, so a claim's cost does not grow with waiting, running or ended
-- runs, and claiming or settling a run moves one entry, not two.
CREATE INDEX reflexr_runs_due ON reflexr_runs (priority DESC, due_at)
    WHERE state = 'ready';
-- What runs now, by when its claim expires: a claim whose executor stopped
-- renewing it (lapsed) is a seek; concurrency limits count an action's
-- running runs (by key) from it without reading the rows. Only running
-- runs are in it.
CREATE INDEX reflexr_runs_running ON reflexr_runs (claim_expires_at, action, flow_key)
    WHERE state = 'running';
-- The runs neither ready nor running (waiting behind their lane, or ended),
-- by state and due time: listings by state, counts and pruning.
CREATE INDEX reflexr_runs_at_rest ON reflexr_runs (state, due_at)
    WHERE state NOT IN ('ready', 'running');
-- The next run of a lane, when its head ends.
CREATE INDEX reflexr_runs_waiting ON reflexr_runs (lane, ord)
    WHERE state = 'waiting';
-- Runs in the order they last changed: the feed of run changes operators
-- watch live (the admin stream's runs topic).
CREATE INDEX reflexr_runs_by_change ON reflexr_runs (updated_at, ord);
-- The ready runs of keyed actions, per key: a fair claim finds each key's
-- oldest due run with one seek, however long the key's backlog. Runs of
-- actions without keys (flow_key NULL) are not in it and cost it nothing.
CREATE INDEX reflexr_runs_keyed ON reflexr_runs (action, priority, flow_key, due_at)
    WHERE state = 'ready' AND flow_key IS NOT NULL;
-- Unique runs: one per (action, key) while pending, or while pending or
-- running. The database refuses a second; nobody checks-then-inserts.
CREATE UNIQUE INDEX reflexr_runs_unique_pending ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'pending' AND state IN ('waiting', 'ready');
CREATE UNIQUE INDEX reflexr_runs_unique_active ON reflexr_runs (action, unique_key)
    WHERE unique_mode = 'active' AND (state = 'waiting' OR state = 'ready' OR state = 'running');

-- A workflow's children: the runs it spawned (id `<parent>/<step>`), for the
-- cascade of a cancel and a parent's join.
CREATE INDEX reflexr_runs_by_parent ON reflexr_runs (parent) WHERE parent IS NOT NULL;


-- Lanes with ordering = scope: the run at the head of each (rule, scope),
-- and whether the lane is blocked behind a dead run (on_dead_letter = block)
-- until an operator unblocks it.
CREATE TABLE reflexr_lanes (
    lane       TEXT PRIMARY KEY,
    head       TEXT NOT NULL,
    blocked    INTEGER NOT NULL DEFAULT 0 CHECK (blocked IN (0, 1)),
    updated_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
-- The blocked lanes, newest first, for operators (only blocked rows are in it).
CREATE INDEX reflexr_lanes_blocked ON reflexr_lanes (updated_at) WHERE blocked = 1;

-- What a consumer or an executor gave up on, never silently. kind says
-- whose: a rule's evaluation (rule), a run (run), and later reactions,
-- followers and deliveries. resolution is set when an operator retried or
-- discarded it.
CREATE TABLE reflexr_dead_letters (
    id          INTEGER PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('rule', 'run', 'reaction', 'follower')),
    consumer    TEXT NOT NULL,
    workspace   TEXT,
    event_seq   INTEGER,
    event_id    TEXT,
    run_id      TEXT,
    reason      TEXT NOT NULL,
    error       TEXT NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    resolved_at INTEGER,
    resolution  TEXT CHECK (resolution IN ('retried', 'discarded'))
) STRICT;
-- Once per (consumer, event) for what is dead-lettered per event, once per
-- run for what is dead-lettered per run.
CREATE UNIQUE INDEX reflexr_dead_letters_per_event
    ON reflexr_dead_letters (kind, consumer, workspace, event_seq) WHERE run_id IS NULL;
CREATE UNIQUE INDEX reflexr_dead_letters_per_run
    ON reflexr_dead_letters (run_id) WHERE run_id IS NOT NULL AND resolved_at IS NULL;
CREATE INDEX reflexr_dead_letters_open ON reflexr_dead_letters (kind, id)
    WHERE resolved_at IS NULL;

-- Scheduled jobs: when each is next due. The loop creates a due occurrence as
-- a run whose id is <job>@<due time>, so each occurrence exists once however
-- many processes schedule it. next_due_at is NULL while a job is switched off.
CREATE TABLE reflexr_schedules (
    name        TEXT PRIMARY KEY,
    spec        TEXT NOT NULL,
    guarantee   TEXT NOT NULL CHECK (guarantee IN ('at_least_once', 'at_most_once')),
    missed      TEXT NOT NULL CHECK (missed IN ('run_once', 'skip')),
    next_due_at INTEGER,
    last_due_at INTEGER,
    updated_at  INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- The followers' ledger: one row per follower, bridging a source workspace
-- of this file into a target workspace (of this file, or of target_file) with
-- the same ids. Its cursor is in reflexr_cursors (kind follower, on the
-- source), its lease is follower/<name> in reflexr_leases, its dead letters
-- are kind follower. projection names the application function that selects
-- and shapes what is published; an engine resumes every row whose projection
-- it has registered. restart_requests counts operators' requests, from any
-- process, that a stopped follower start again at its cursor: the process
-- running it sees the count move.
CREATE TABLE reflexr_followers (
    name         TEXT PRIMARY KEY,
    source       TEXT NOT NULL REFERENCES reflexr_workspaces (name),
    target       TEXT NOT NULL,
    target_file  TEXT,
    projection   TEXT NOT NULL,
    published    INTEGER NOT NULL DEFAULT 0,
    dead_letters INTEGER NOT NULL DEFAULT 0,
    stops        INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    stopped_at   INTEGER,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    restart_requests INTEGER NOT NULL DEFAULT 0 CHECK (restart_requests >= 0),
    -- The PostgreSQL target it publishes into, by the name a process
    -- registered it under (Engine::register_postgres_target; the
    -- connection string, and its password, stay in the process).
    target_postgres TEXT
) STRICT, WITHOUT ROWID;

-- Counters of what the engines did to this file, across processes and
-- restarts: bumped in the transactions that do the work (decisions, firings,
-- evaluation errors, runs' outcomes, reactions' events).
CREATE TABLE reflexr_counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

-- Views for operators, readable from the sqlite3 shell without the library.

-- Control of the work (see the README's "Control of the work").
-- What is paused: an action (channels and scheduled jobs are paused as
-- their actions, delivery/<channel> and job/<name>), a rule, a reaction.
CREATE TABLE reflexr_paused (
    kind     TEXT NOT NULL CHECK (kind IN ('action', 'rule', 'reaction')),
    name     TEXT NOT NULL,
    since    INTEGER NOT NULL,
    operator TEXT NOT NULL,
    reason   TEXT NOT NULL,
    PRIMARY KEY (kind, name)
) STRICT, WITHOUT ROWID;

-- Per action: the default priority of its runs, at most max_running at once
-- across every process, at most rate_count starts per rate_period_ms; with
-- partition_by (a key or $.path of the input), each limit counts per value.
-- A keyed action (partition_by, or fair) gives each run a key (its
-- flow_key: the one its enqueue named, else the input's value at key_path,
-- else ''), and its limits count per key. fair = 1: claims serve its keys
-- in turn, by weight (start-time fair queuing); fair_clock is the virtual
-- time its claims reached (a key not in reflexr_key_passes, or behind it,
-- starts from it).
CREATE TABLE reflexr_actions (
    action         TEXT PRIMARY KEY,
    priority       INTEGER NOT NULL DEFAULT 0,
    max_running    INTEGER CHECK (max_running IS NULL OR max_running >= 1),
    rate_count     INTEGER CHECK (rate_count IS NULL OR rate_count >= 1),
    rate_period_ms INTEGER CHECK (rate_period_ms IS NULL OR rate_period_ms >= 1),
    partition_by   TEXT,
    updated_at     INTEGER NOT NULL,
    fair           INTEGER NOT NULL DEFAULT 0 CHECK (fair IN (0, 1)),
    key_path       TEXT,
    fair_clock     REAL NOT NULL DEFAULT 0,
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
) STRICT, WITHOUT ROWID;

-- Per key of a keyed action: what differs from the action's settings (a
-- NULL keeps the action's): at most max_running of the key at once, at most
-- rate_count starts per rate_period_ms, and its weight in a fair claim
-- (default 1). Set by operators (audited); read by every claim.
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

-- A fair action's keys that are ahead of its fair_clock: the virtual time
-- each key's next run starts at (each run served adds 1 / weight). A key
-- behind the clock needs no row, and claims delete the rows the clock
-- passed.
CREATE TABLE reflexr_key_passes (
    action TEXT NOT NULL,
    key    TEXT NOT NULL,
    pass   REAL NOT NULL,
    PRIMARY KEY (action, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX reflexr_key_passes_by_pass ON reflexr_key_passes (action, pass);

-- Starts of rate-limited actions within their period (a sliding window):
-- n runs of the partition claimed at `at` (one row per claim).
CREATE TABLE reflexr_starts (
    action TEXT NOT NULL,
    part   TEXT NOT NULL,
    at     INTEGER NOT NULL,
    n      INTEGER NOT NULL CHECK (n >= 1)
) STRICT;
CREATE INDEX reflexr_starts_window ON reflexr_starts (action, part, at);

-- Unique runs 'period': the key is taken until `until`.
CREATE TABLE reflexr_unique_periods (
    action TEXT NOT NULL,
    key    TEXT NOT NULL,
    until  INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (action, key)
) STRICT, WITHOUT ROWID;


-- What a run's handler logged during its attempts (RunContext::log), each
-- line committed as it was logged: n counts the run's lines across its
-- attempts; level is error, warn, info, debug or trace; fields a JSON value.
-- Deleted with the run.
CREATE TABLE reflexr_run_logs (
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

-- How far a run's handler last said it got (RunContext::progress): done of
-- total, in which attempt, when. Deleted with the run.
CREATE TABLE reflexr_run_progress (
    run     TEXT PRIMARY KEY,
    attempt INTEGER NOT NULL,
    done    INTEGER NOT NULL CHECK (done >= 0),
    total   INTEGER NOT NULL CHECK (total >= 0),
    at      INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- A workflow's steps: what each step of a run recorded, once. A handler
-- re-runs from the top on every attempt, and a step found here returns its
-- output instead of running again. position is the order the run reached
-- its steps in (0: where the run began, with the log's head then); a name
-- reached at another position is refused. kind: begin, step (a closure's
-- output), tx (written in the transaction of the application's rows), sleep,
-- wait (an event of the log), spawn (a child run), join (children ended),
-- patch (a code path taken). state: done, or waiting (a sleep, a wait or a
-- join not over yet; wake_at is when it times out). detail: what it waits
-- for, as JSON. Kept until the run is pruned; an operator's reset to a step
-- deletes the rows from its position on.
CREATE TABLE reflexr_steps (
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
CREATE UNIQUE INDEX reflexr_steps_by_position ON reflexr_steps (run, position);

-- Runs suspended until an event of the log: a wait matches the first event
-- of workspace and type after after_seq whose subject (by = 'subject'), or
-- payload field (by = its path, '$.a.b', key its JSON), is key; by = ''
-- matches any event of the type. Matched by what it waits for, so an append
-- costs nothing more however many runs wait.
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

-- How far the waits of each workspace have been matched: the seq up to
-- which every event was looked at.
CREATE TABLE reflexr_wait_positions (
    workspace TEXT PRIMARY KEY,
    position  INTEGER NOT NULL CHECK (position >= 0)
) STRICT, WITHOUT ROWID;

-- Runs suspended until other runs end (a join): the run and step that wait
-- for child.
CREATE TABLE reflexr_run_waits (
    child TEXT NOT NULL,
    run   TEXT NOT NULL,
    step  TEXT NOT NULL,
    PRIMARY KEY (child, run, step)
) STRICT, WITHOUT ROWID;
CREATE INDEX reflexr_run_waits_by_run ON reflexr_run_waits (run);

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

-- Each cursor with how many events of its workspace are still after it.
CREATE VIEW reflexr_cursor_lag AS
SELECT c.workspace,
       c.kind,
       c.name,
       c.position,
       (SELECT count(*) FROM reflexr_events e
         WHERE e.workspace = c.workspace AND e.seq > c.position) AS lag,
       strftime('%Y-%m-%dT%H:%M:%fZ', c.updated_at / 1000.0, 'unixepoch') AS updated
FROM reflexr_cursors c;

CREATE VIEW reflexr_lease_status AS
SELECT name,
       holder,
       generation,
       strftime('%Y-%m-%dT%H:%M:%fZ', renewed_at / 1000.0, 'unixepoch') AS renewed,
       strftime('%Y-%m-%dT%H:%M:%fZ', expires_at / 1000.0, 'unixepoch') AS expires,
       CASE WHEN expires_at = 0 THEN 'released'
            WHEN expires_at > CAST(unixepoch('now') AS INTEGER) * 1000 THEN 'held'
            ELSE 'lapsed' END AS state
FROM reflexr_leases;

CREATE VIEW reflexr_runs_by_state AS
SELECT kind, action, state, count(*) AS runs,
       strftime('%Y-%m-%dT%H:%M:%fZ', min(due_at) / 1000.0, 'unixepoch') AS earliest_due
FROM reflexr_runs
GROUP BY kind, action, state;

-- Runs of keyed actions by key and state: each key's backlog and what runs.
CREATE VIEW reflexr_runs_by_key AS
SELECT action, flow_key AS key, state, count(*) AS runs
FROM reflexr_runs
WHERE flow_key IS NOT NULL
GROUP BY action, flow_key, state;

CREATE VIEW reflexr_open_dead_letters AS
SELECT id, kind, consumer, workspace, event_seq, run_id, reason, error, attempts,
       strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch') AS created
FROM reflexr_dead_letters
WHERE resolved_at IS NULL;

CREATE VIEW reflexr_schedule_status AS
SELECT name, spec, guarantee, missed,
       CASE WHEN next_due_at IS NULL THEN 'off'
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', next_due_at / 1000.0, 'unixepoch') END AS next_due,
       strftime('%Y-%m-%dT%H:%M:%fZ', last_due_at / 1000.0, 'unixepoch') AS last_due
FROM reflexr_schedules;

CREATE VIEW reflexr_dead_letters_by_kind AS
SELECT kind, reason,
       sum(resolved_at IS NULL) AS open,
       count(*) AS total
FROM reflexr_dead_letters
GROUP BY kind, reason;

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

CREATE VIEW reflexr_blocked_lanes AS
SELECT l.lane, l.head, r.rule, r.scope, r.last_error,
       strftime('%Y-%m-%dT%H:%M:%fZ', l.updated_at / 1000.0, 'unixepoch') AS since
FROM reflexr_lanes l JOIN reflexr_runs r ON r.id = l.head
WHERE l.blocked = 1;

-- Consumers (rules, reactions, followers) whose commit failed three times or
-- more at the same position: they are not moving, and last_error says why.
CREATE VIEW reflexr_stuck_consumers AS
SELECT workspace, kind, name, position, failures, last_error,
       strftime('%Y-%m-%dT%H:%M:%fZ', failed_at / 1000.0, 'unixepoch') AS last_failed
FROM reflexr_cursors
WHERE failures >= 3;

PRAGMA user_version = 14;
