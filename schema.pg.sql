-- reflexr schema on PostgreSQL (feature `postgres`): version 1, the start.
--
-- The same tables, names and meanings as schema.sql, in PostgreSQL's types.
-- Embedded in the library with include_str! and applied, in one
-- transaction under an advisory lock (so two processes opening a new
-- database at once do not both apply it), to a database without
-- reflexr_schema_version; older versions are migrated forward step by step
-- (src/store/postgres/schema.rs); a newer one is refused. The tables go in the
-- first schema of the connection's search_path (`public` unless the
-- connection's options say otherwise), beside the application's own.
--
-- Times are bigint milliseconds since the Unix epoch, taken from the
-- engine's clock (never the server's). Payloads are JSON text, kept as the
-- application wrote them (the engine checks them before they are stored;
-- cast to jsonb to query them).
--
-- What this file holds: the core — workspaces, the change log, cursors and
-- leases. The other tables come as migrations (src/store/postgres/schema.rs),
-- applied after this file to a new database as to an old one: version 2,
-- the work queue (runs, lanes, per-action settings, unique periods);
-- version 3, the audit of operators' interventions; version 4, pauses,
-- rate-limit starts, counters and dead letters; version 5, rules and their
-- state; version 6, scheduled jobs; version 7, an index on event ids by
-- prefix; version 8, the followers' ledger; version 9, runs' changes stamped
-- with their transaction (the feed of run changes in commit order);
-- version 10, durable workflows; version 11, subject versions; version 12,
-- rule versions in shadow.

CREATE TABLE reflexr_schema_version (
    version    integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO reflexr_schema_version (version) VALUES (1);

-- A named log: a tenant, an app, an edge device.
CREATE TABLE reflexr_workspaces (
    name       text PRIMARY KEY,
    created_at bigint NOT NULL
);

-- The event types a workspace accepts; the reserved ones (RuleFired,
-- RuleErrored) are registered for every workspace, and only the engine
-- appends them.
CREATE TABLE reflexr_event_types (
    workspace     text NOT NULL REFERENCES reflexr_workspaces (name),
    type          text NOT NULL,
    reserved      boolean NOT NULL DEFAULT false,
    registered_at bigint NOT NULL,
    PRIMARY KEY (workspace, type)
);

-- The highest seq ever committed, one row. An append locks this row (FOR
-- UPDATE) and takes the seq after it (or after the transaction's own last
-- one); the commit moves the row to the transaction's last seq. So an
-- appending transaction holds the lock from its first append to its
-- commit: appending transactions take their seqs one after another, in the
-- order they commit, and a reader that sees seq n sees every seq below it
-- that will ever exist. (A sequence would hand out numbers before commit
-- and let them become visible out of order: a cursor moving to the highest
-- seq it sees would skip a slower transaction's event for good.) A
-- rolled-back transaction takes no seq, so seqs are dense (a savepoint the
-- application rolls back may leave a gap, never a skip). Transactions that
-- append nothing never touch the row. Pruning never lowers it.
CREATE TABLE reflexr_head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    seq bigint NOT NULL CHECK (seq >= 0)
);
INSERT INTO reflexr_head (seq) VALUES (0);

-- The change log. seq is database-wide, dense, increasing in commit order.
CREATE TABLE reflexr_events (
    seq            bigint PRIMARY KEY,
    workspace      text NOT NULL,
    id             text NOT NULL,
    type           text NOT NULL,
    subject        text NOT NULL,
    actor          text NOT NULL,
    occurred_at    bigint NOT NULL,
    recorded_at    bigint NOT NULL,
    payload        text NOT NULL,
    causation_id   text,
    correlation_id text,
    depth          integer NOT NULL DEFAULT 0 CHECK (depth >= 0),
    FOREIGN KEY (workspace, type) REFERENCES reflexr_event_types (workspace, type)
);
-- Once per id (invariant 3), and the lookup that makes re-appending a no-op.
CREATE UNIQUE INDEX reflexr_events_by_id ON reflexr_events (workspace, id);
-- Every consumer's read: a workspace after its cursor, in seq order.
CREATE INDEX reflexr_events_by_workspace ON reflexr_events (workspace, seq);

-- A consumer's last handled seq in one workspace (see schema.sql).
CREATE TABLE reflexr_cursors (
    workspace  text NOT NULL REFERENCES reflexr_workspaces (name),
    kind       text NOT NULL CHECK (kind IN ('app', 'rule', 'reaction', 'follower')),
    name       text NOT NULL,
    position   bigint NOT NULL CHECK (position >= 0),
    updated_at bigint NOT NULL,
    high_water bigint NOT NULL DEFAULT 0 CHECK (high_water >= 0),
    failures   integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    last_error text,
    failed_at  bigint,
    PRIMARY KEY (workspace, kind, name)
);

-- Leases: one holder at a time; generation is the fencing token, never
-- reused (a released lease keeps its row).
CREATE TABLE reflexr_leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    generation  bigint NOT NULL CHECK (generation >= 1),
    acquired_at bigint NOT NULL,
    renewed_at  bigint NOT NULL,
    expires_at  bigint NOT NULL
);

-- What the sqlite3 shell's views show, for psql.
CREATE VIEW reflexr_event_log AS
SELECT e.seq, e.workspace, e.id, e.type, e.subject, e.actor,
       to_timestamp(e.occurred_at / 1000.0) AS occurred,
       to_timestamp(e.recorded_at / 1000.0) AS recorded,
       e.causation_id, e.correlation_id, e.depth, e.payload
FROM reflexr_events e;

CREATE VIEW reflexr_cursor_lag AS
SELECT c.workspace, c.kind, c.name, c.position,
       (SELECT count(*) FROM reflexr_events e
         WHERE e.workspace = c.workspace AND e.seq > c.position) AS lag,
       to_timestamp(c.updated_at / 1000.0) AS updated
FROM reflexr_cursors c;
