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

/// A schema's shape: (table, column, type, nullable) of the engine's
/// tables, and the indexes' definitions.
type Shape = (Vec<(String, String, String, String)>, Vec<String>);

/// The shape of the engine's tables in a schema.
fn shape(client: &mut Client, schema: &str) -> Shape {
    let columns = client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text \
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
