//! The conformance suite for the schema: applied once, migrated forward, a newer one refused (PostgreSQL's; SQLite's are `tests/it/open.rs`).

use super::*;

/// Invariant 10 (nothing committed is changed): the schema is applied once, by
/// one of several openers at once; a database with a newer schema is refused
/// and left as it is.
#[test]
fn the_schema_is_applied_once_and_a_newer_one_is_refused() {
    let schema = Arc::new(PgSchema::new());
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let schema = Arc::clone(&schema);
            std::thread::spawn(move || drop(schema.client()))
        })
        .collect();
    for o in openers {
        o.join().unwrap();
    }
    let mut client = schema.client();
    let versions: i64 = client
        .query_one("SELECT count(*) FROM reflexr_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        versions,
        i64::from(pg::schema::SCHEMA_VERSION),
        "each version once"
    );
    client
        .batch_execute("INSERT INTO reflexr_schema_version (version) VALUES (99)")
        .unwrap();
    let e = pg::schema::apply(&mut client, "test").unwrap_err();
    assert!(
        matches!(
            e,
            Error::SchemaTooNew {
                found: 99,
                supported,
                ..
            } if supported == i64::from(pg::schema::SCHEMA_VERSION)
        ),
        "{e}"
    );
}

/// A schema's shape: (table, column, type and domain, nullable) of the
/// engine's tables, and the indexes' definitions.
type Shape = (Vec<(String, String, String, String)>, Vec<String>);

/// The shape of the engine's tables in a schema.
fn shape(client: &mut Client, schema: &str) -> Shape {
    let columns = client
        .query(
            "SELECT table_name::text, column_name::text, \
                    data_type::text || coalesce(' ' || domain_name::text, ''), is_nullable::text \
             FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name LIKE 'reflexr%' \
             ORDER BY table_name, column_name",
            &[&schema],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let indexes = client
        .query(
            "SELECT replace(indexdef, $1 || '.', '') FROM pg_indexes \
             WHERE schemaname = $1 ORDER BY indexname",
            &[&schema],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    (columns, indexes)
}

/// Invariant 10 (nothing committed is lost): a database at version 1 (what the
/// first release wrote) migrates to the current version, and ends the same
/// shape as a new one.
#[test]
fn a_version_1_database_migrates_to_the_shape_of_a_new_one() {
    let old = PgSchema::new();
    let mut client = Client::connect(&old.url(), NoTls).unwrap();
    client.batch_execute(pg::schema::SCHEMA_SQL).unwrap();
    let v: i32 = client
        .query_one("SELECT max(version) FROM reflexr_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, 1);
    pg::schema::apply(&mut client, "old").unwrap();
    let new = PgSchema::new();
    let mut fresh = new.client();
    assert_eq!(shape(&mut client, &old.name), shape(&mut fresh, &new.name));
    let v: i32 = client
        .query_one("SELECT max(version) FROM reflexr_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, pg::schema::SCHEMA_VERSION);
}

/// Invariant 10 (nothing committed is changed): a database at version 15
/// holding runs migrates to the runs' domains with its rows as they were,
/// and the domains then refuse what the table's checks refused.
#[test]
fn a_version_15_database_with_runs_keeps_them_through_the_domains() {
    let old = PgSchema::new();
    let mut client = Client::connect(&old.url(), NoTls).unwrap();
    client.batch_execute(pg::schema::SCHEMA_SQL).unwrap();
    for (to, sql) in pg::schema::MIGRATIONS {
        if *to <= 15 {
            client.batch_execute(sql).unwrap();
        }
    }
    let row = "SELECT id, kind::text, on_dead_letter::text, state::text, \
               coalesce(unique_mode::text, '-'), max_attempts::bigint, backoff_ms::bigint, \
               backoff_max_ms::bigint, backoff_factor::float8, jitter::float8 \
               FROM reflexr_runs ORDER BY id";
    client
        .batch_execute(
            "INSERT INTO reflexr_runs (id, kind, action, input, state, unique_mode, unique_key, \
               max_attempts, backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, \
               created_at, updated_at) VALUES \
             ('a', 'rule', 'x', '{}', 'succeeded', NULL, NULL, 1, 0, 0, 1.0, 0.0, 0, 0, 0), \
             ('b', 'task', 'x', '{}', 'waiting', 'active', 'k', 9, 5, 50, 3.5, 1.0, 0, 0, 0)",
        )
        .unwrap();
    type Row = (
        String,
        String,
        String,
        String,
        String,
        i64,
        i64,
        i64,
        f64,
        f64,
    );
    let read = |client: &mut Client| -> Vec<Row> {
        client
            .query(row, &[])
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    r.get(1),
                    r.get(2),
                    r.get(3),
                    r.get(4),
                    r.get(5),
                    r.get(6),
                    r.get(7),
                    r.get(8),
                    r.get(9),
                )
            })
            .collect()
    };
    let before = read(&mut client);
    pg::schema::apply(&mut client, "old").unwrap();
    assert_eq!(read(&mut client), before, "the runs as they were");
    let e = client
        .batch_execute("UPDATE reflexr_runs SET jitter = 2.0 WHERE id = 'a'")
        .expect_err("a jitter past 1");
    assert_eq!(e.code(), Some(&postgres::error::SqlState::CHECK_VIOLATION));
    let by_key: i64 = client
        .query_one("SELECT count(*) FROM reflexr_runs_by_key", &[])
        .unwrap()
        .get(0);
    assert_eq!(by_key, 0, "the view made again");
}

/// Invariant 10 (bad input changes nothing): the runs' sets of values and
/// bounds, their columns' domains since version 16, refuse what the
/// table's checks refused — in an insert and in an update — and let a good
/// row through.
#[test]
fn the_runs_columns_refuse_values_outside_their_sets_and_bounds() {
    let schema = PgSchema::new();
    let mut client = schema.client();
    let insert = |client: &mut Client, column: &str, value: &str| {
        let mut row = vec![
            ("kind", "'job'"),
            ("on_dead_letter", "'continue'"),
            ("state", "'ready'"),
            ("unique_mode", "NULL"),
            ("max_attempts", "3"),
            ("backoff_ms", "100"),
            ("backoff_max_ms", "1000"),
            ("backoff_factor", "2.0"),
            ("jitter", "0.1"),
        ];
        for (c, v) in &mut row {
            if *c == column {
                *v = value;
            }
        }
        let (names, values): (Vec<&str>, Vec<&str>) = row.into_iter().unzip();
        client.batch_execute(&format!(
            "INSERT INTO reflexr_runs (id, action, input, due_at, created_at, updated_at, {}) \
             VALUES ('r-{column}-{}', 'a', '{{}}', 0, 0, 0, {})",
            names.join(", "),
            value.len(),
            values.join(", ")
        ))
    };
    let refused = [
        ("kind", "'chore'"),
        ("on_dead_letter", "'drop'"),
        ("state", "'sleeping'"),
        ("unique_mode", "'always'"),
        ("max_attempts", "0"),
        ("backoff_ms", "-1"),
        ("backoff_max_ms", "-1"),
        ("backoff_factor", "0.5"),
        ("jitter", "1.5"),
        ("jitter", "-0.1"),
    ];
    for (column, value) in refused {
        let e = insert(&mut client, column, value).expect_err(column);
        assert_eq!(
            e.code(),
            Some(&postgres::error::SqlState::CHECK_VIOLATION),
            "{column} = {value}: {e}"
        );
    }
    insert(&mut client, "unique_mode", "'active'").expect("a good row");
    let e = client
        .batch_execute("UPDATE reflexr_runs SET state = 'sleeping'")
        .expect_err("an update out of the set");
    assert_eq!(e.code(), Some(&postgres::error::SqlState::CHECK_VIOLATION));
    let states: Vec<String> = client
        .query("SELECT state FROM reflexr_runs", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(states, ["ready"], "the good row, unchanged");
}

/// Invariant 14 (a cancel stops what has not started), at the cost of what
/// a batch holds: the look for the runs asked to stop, among a batch's 255
/// ids, reads the index of such runs, not every run of the table — in the
/// plan made for these ids and in the generic one the server keeps for
/// the statement after five executions.
#[test]
fn the_look_for_cancelled_runs_does_not_read_the_whole_table() {
    let schema = PgSchema::new();
    let mut client = schema.client();
    runs_then(
        &mut client,
        "UPDATE reflexr_runs SET cancel_requested_at = 1 WHERE id = 'run-7'; \
         ANALYZE reflexr_runs;",
    );
    let ids: Vec<String> = (1..=255).map(|i| format!("run-{i}")).collect();
    let asked: Vec<String> = client
        .query(pg::runs::CANCEL_REQUESTED, &[&ids])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(asked, ["run-7"]);
    client
        .batch_execute(&format!(
            "PREPARE look(text[]) AS {}",
            pg::runs::CANCEL_REQUESTED
        ))
        .unwrap();
    let literal = format!("'{{{}}}'", ids.join(","));
    for mode in PLAN_MODES {
        let plan = plan_of(&mut client, mode, &format!("look({literal})"));
        assert!(plan.contains("reflexr_runs_cancelling"), "{mode}: {plan}");
        assert!(!plan.contains("Seq Scan"), "{mode}: {plan}");
    }
}

/// 20,000 ready runs, `run-1` to `run-20000` at positions 1 to 20,000,
/// then `then`.
fn runs_then(client: &mut Client, then: &str) {
    ready_runs(client, "run", 20_000);
    client.batch_execute(then).unwrap();
}

/// `n` ready runs of action `x`, `{prefix}-1` to `{prefix}-{n}`, due at 1
/// to `n`.
fn ready_runs(client: &mut Client, prefix: &str, n: i32) {
    client
        .batch_execute(&format!(
            "INSERT INTO reflexr_runs (id, kind, action, input, state, max_attempts, \
               backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, created_at, \
               updated_at) \
             SELECT '{prefix}-' || i, 'task', 'x', '{{}}', 'ready', 1, 0, 0, 1.0, 0.0, i, 0, 0 \
             FROM generate_series(1, {n}) AS i"
        ))
        .unwrap();
}

/// Invariant 3 (an id is appended once), at the cost of a batch: the one
/// statement of a rule's envelopes finds the ids there already through the
/// ids' index, and each subject's last version through the subjects' — in
/// a plan made for the values given as in the generic one — on a log of
/// 20,000 events whose statistics were never gathered (a new database).
#[test]
fn appends_made_together_read_the_log_by_its_indexes_whatever_the_statistics() {
    let schema = PgSchema::new();
    let mut client = schema.client();
    client
        .batch_execute(&format!(
            "INSERT INTO reflexr_workspaces (name, created_at) VALUES ('w', 0); \
             INSERT INTO reflexr_event_types (workspace, type, registered_at) \
               VALUES ('w', 'tick', 0); \
             INSERT INTO reflexr_events (seq, workspace, id, type, subject, actor, \
               occurred_at, recorded_at, payload, version) \
             SELECT i, 'w', 'e-' || i, 'tick', 's-' || i, 'a', 0, 0, '{{}}', 1 \
             FROM generate_series(1, 20000) AS i; \
             UPDATE reflexr_head SET seq = 20000; \
             PREPARE batch AS {}",
            pg::events::INSERT_ALL
        ))
        .unwrap();
    let texts = |v: &[&str]| format!("'{{{}}}'", v.join(","));
    let call = format!(
        "batch('w', 0, {ids}, {types}, {subjects}, {texts}, '{{0,0}}', '{{0,0}}', {payloads}, \
         '{{NULL,NULL}}', '{{NULL,NULL}}', '{{0,0}}', '{{NULL,NULL}}')",
        ids = texts(&["e-7", "f-1"]),
        types = texts(&["tick", "tick"]),
        subjects = texts(&["s-7", "s-9"]),
        texts = texts(&["a", "a"]),
        payloads = "'{\"{}\",\"{}\"}'",
    );
    for mode in PLAN_MODES {
        let plan = plan_of(&mut client, mode, &call);
        assert!(plan.contains("reflexr_events_by_id"), "{mode}: {plan}");
        assert!(plan.contains("reflexr_events_by_subject"), "{mode}: {plan}");
        assert!(
            !plan.contains("Seq Scan on reflexr_events"),
            "{mode}: {plan}"
        );
    }
    // And it does its work: `e-7` found, `f-1` appended after the head.
    let rows: Vec<(String, i64, Option<i64>)> = client
        .query(&format!("EXECUTE {call}"), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        [
            ("f-1".to_string(), 20_001, Some(2)),
            ("e-7".to_string(), 7, None)
        ]
    );
}

/// Invariant 6 (scope order), at the cost of a batch: the one statement of
/// a rule's runs finds the ids there already through the ids' index — in
/// a plan made for the values given as in the generic one — on a table of
/// 20,000 runs whose statistics were never gathered (a new database).
#[test]
fn runs_made_together_look_for_their_ids_by_index_whatever_the_statistics() {
    let schema = PgSchema::new();
    let mut client = schema.client();
    ready_runs(&mut client, "run", 20_000);
    client
        .batch_execute(&format!("PREPARE batch AS {}", pg::runs::INSERT_RUNS))
        .unwrap();
    let pair = |a: &str, b: &str| format!("'{{{a},{b}}}'");
    let nulls = pair("NULL", "NULL");
    let call = format!(
        "batch({ids}, {kinds}, {actions}, {nulls}, {nulls}, {nulls}, {lanes}, {odl}, {inputs}, \
         {nulls}, {nulls}, {zeros}, {ones}, {zeros}, {zeros}, {ones}, {zeros}, {zeros}, \
         {zeros}, {nulls}, {nulls}, {nulls}, {nulls})",
        ids = pair("run-7", "new-1"),
        kinds = pair("task", "task"),
        actions = pair("x", "x"),
        lanes = pair("l", "l"),
        odl = pair("continue", "continue"),
        inputs = "'{\"{}\",\"{}\"}'",
        zeros = pair("0", "0"),
        ones = pair("1", "1"),
    );
    for mode in PLAN_MODES {
        let plan = plan_of(&mut client, mode, &call);
        assert!(plan.contains("reflexr_runs_id_key"), "{mode}: {plan}");
        assert!(
            !plan.contains("Seq Scan on reflexr_runs "),
            "{mode}: {plan}"
        );
    }
    // And it does its work: `run-7` found, `new-1` made, the head of `l`.
    let mut rows: Vec<(String, String, Option<String>)> = client
        .query(&format!("EXECUTE {call}"), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("gone".into(), "run-7".into(), None),
            ("lane".into(), "new-1".into(), Some("l".into())),
            ("new".into(), "new-1".into(), None),
        ]
    );
}

/// The server's two ways of planning a prepared statement: for the values
/// given (its first five executions on a connection, and later ones while
/// the generic plan costs more), and once for any values.
const PLAN_MODES: [&str; 2] = ["force_custom_plan", "force_generic_plan"];

/// The plan the server makes, in `mode` (one of [`PLAN_MODES`]), for the
/// execution `call` of a prepared statement (`name(args)`).
fn plan_of(client: &mut Client, mode: &str, call: &str) -> String {
    client
        .batch_execute(&format!("SET plan_cache_mode = {mode}"))
        .unwrap();
    let lines: Vec<String> = client
        .query(&format!("EXPLAIN EXECUTE {call}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    lines.join("\n")
}

/// Invariant 5 (a run is executed until it succeeds), at the cost of what a
/// batch holds: a batch's settlement, and the claim of runs picked by
/// position, read their runs through the primary key — in a plan made for
/// the positions given (the server's first executions of a statement on a
/// connection) as in the generic one — on a table of 20,000 runs whose
/// statistics were never gathered, where a plan that counted the 256
/// positions read the whole table.
#[test]
fn a_batch_reads_its_runs_by_position_whatever_the_statistics() {
    let schema = PgSchema::new();
    let mut client = schema.client();
    runs_then(
        &mut client,
        "UPDATE reflexr_runs SET state = 'succeeded' WHERE ord <= 5000; \
         UPDATE reflexr_runs SET state = 'running', claimed_by = 'h', attempt = 1 \
           WHERE ord > 5000 AND ord <= 5256;",
    );
    let list = |from: i64| {
        let ords: Vec<String> = (from..from + 256).map(|o| o.to_string()).collect();
        format!("'{{{}}}'", ords.join(","))
    };
    let ones = format!("'{{{}}}'", vec!["1"; 256].join(","));
    client
        .batch_execute(&format!(
            "PREPARE settle AS {}; PREPARE pick AS {}",
            pg::runs::SUCCEED_MANY,
            *pg::runs::CLAIM_PICKED_SQL
        ))
        .unwrap();
    for mode in PLAN_MODES {
        for call in [
            format!("settle('h', {}, {ones}, 9)", list(5001)),
            format!("pick('h', 9, 99, {})", list(6001)),
        ] {
            let plan = plan_of(&mut client, mode, &call);
            assert!(plan.contains("reflexr_runs_pkey"), "{mode}: {plan}");
            assert!(!plan.contains("Seq Scan"), "{mode}: {plan}");
        }
    }
    // And they do their work: the settlement succeeds the 256 claims.
    let settled = client
        .query(
            &format!("EXECUTE settle('h', {}, {ones}, 9)", list(5001)),
            &[],
        )
        .unwrap();
    assert_eq!(settled.len(), 256);
}

/// Invariant 5 (a run is executed until it succeeds), at the cost of one
/// run: on a new database, the plan the server keeps for the claim of a
/// run by its id — made after the statement's first five executions, while
/// the table held a handful of runs — still reads that run by the ids'
/// index once the table holds 20,000 (a table known to be empty got a plan
/// that read every run).
#[test]
fn a_new_database_claims_a_run_by_its_id_after_the_table_grew() {
    let schema = PgSchema::new();
    let mut client = schema.client();
    let analysed: f32 = client
        .query_one(
            "SELECT reltuples FROM pg_class WHERE oid = 'reflexr_runs'::regclass",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(analysed, -1.0, "a new table is left as never analysed");
    ready_runs(&mut client, "run", 6);
    client
        .batch_execute(&format!("PREPARE claim AS {}", *pg::runs::CLAIM_FRESH_SQL))
        .unwrap();
    for i in 1..=6 {
        let claimed = client
            .query(&format!("EXECUTE claim('h', 1, 2, 'run-{i}')"), &[])
            .unwrap();
        assert_eq!(claimed.len(), 1);
    }
    ready_runs(&mut client, "more", 20_000);
    // The server's own choice between the kept plan and a new one.
    let plan = plan_of(&mut client, "auto", "claim('h', 1, 2, 'more-19000')");
    assert!(plan.contains("reflexr_runs_id_key"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

/// Invariant 14 (claims match the work), at no cost an idle engine pays for
/// its history: an idle executor's look for due work reads the partial
/// indexes of ready and running runs, not the finished ones — on a new
/// database's table of 20,000 runs, 19,999 of them finished, whose
/// statistics were never gathered, in the plan kept after the look's first
/// executions as in one made anew. Both forms of the look: its runs' part
/// alone, and the whole look in one statement (which also reads the small
/// tables of pauses and waits).
#[test]
fn an_idle_look_for_work_reads_only_ready_and_running_runs() {
    let schema = PgSchema::new();
    let mut client = schema.client();
    client
        .batch_execute(&format!(
            "PREPARE look AS {}; PREPARE whole AS {}",
            pg::control::WORK_DUE,
            pg::control::IDLE_LOOK
        ))
        .unwrap();
    for _ in 0..6 {
        client.query("EXECUTE look(1, '{x}')", &[]).unwrap();
        client.query("EXECUTE whole(1, '{x}')", &[]).unwrap();
    }
    runs_then(
        &mut client,
        "UPDATE reflexr_runs SET state = 'succeeded' WHERE ord < 20000;",
    );
    for look in ["look", "whole"] {
        let due: bool = client
            .query_one(&format!("EXECUTE {look}(20000, '{{x}}')"), &[])
            .unwrap()
            .get(0);
        assert!(due, "{look}: the one ready run is found");
        for mode in ["auto", PLAN_MODES[0]] {
            let plan = plan_of(&mut client, mode, &format!("{look}(20000, '{{x}}')"));
            assert!(plan.contains("reflexr_runs_due"), "{look} {mode}: {plan}");
            assert!(
                plan.contains("reflexr_runs_running"),
                "{look} {mode}: {plan}"
            );
            assert!(
                !plan.contains("Seq Scan on reflexr_runs"),
                "{look} {mode}: {plan}"
            );
        }
    }
}
