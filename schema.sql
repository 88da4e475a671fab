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
-- readable with json_extract().

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
    FOREIGN KEY (workspace, type) REFERENCES reflexr_event_types (workspace, type)
) STRICT;

-- Once per id (invariant 3), and the lookup that makes re-appending a no-op.
CREATE UNIQUE INDEX reflexr_events_by_id ON reflexr_events (workspace, id);
-- Every consumer's read: a workspace after its cursor, in seq order.
CREATE INDEX reflexr_events_by_workspace ON reflexr_events (workspace, seq);

-- A consumer's last handled seq in one workspace. Moves only forward, except
-- by an operator's reset, which reflexr_audit records.
CREATE TABLE reflexr_cursors (
    workspace  TEXT NOT NULL REFERENCES reflexr_workspaces (name),
    kind       TEXT NOT NULL CHECK (kind IN ('app', 'rule', 'reaction', 'follower')),
    name       TEXT NOT NULL,
    position   INTEGER NOT NULL CHECK (position >= 0),
    updated_at INTEGER NOT NULL,
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

-- Views for operators, readable from the sqlite3 shell without the library.

CREATE VIEW reflexr_event_log AS
SELECT seq,
       workspace,
       id,
       type,
       subject,
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
       CASE WHEN expires_at > CAST(unixepoch('now') AS INTEGER) * 1000
            THEN 'held' ELSE 'lapsed' END AS state
FROM reflexr_leases;

PRAGMA user_version = 1;
