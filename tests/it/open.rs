//! Opening a file: the pragmas, the schema and its version, and every kind of
//! file that must be refused without being changed (DESIGN.md, "The file";
//! invariant 10).

use reflexr_testkit as common;

use std::path::Path;

use common::{Scene, bytes};
use reflexr::limits::SCHEMA_VERSION;
use reflexr::{Engine, Error, NewEvent, Query, RunState, Synchronous};
use rusqlite::Connection;

fn pragma_i64(conn: &Connection, name: &str) -> i64 {
    conn.pragma_query_value(None, name, |r| r.get(0)).unwrap()
}

/// A reflexr file with some events, closed (so its WAL is checkpointed into
/// the main file and the bytes on disk are the whole database).
fn closed_reflexr_file(path: &Path, events: usize) {
    let engine = Engine::open(path).unwrap();
    engine.ensure_workspace("app", &["tick"]).unwrap();
    engine
        .write(|tx| {
            for i in 0..events {
                let ev = NewEvent::new("tick", format!("t/{i}"), "clock", i as i64)
                    .payload(&serde_json::json!({ "i": i, "pad": "x".repeat(100) }));
                tx.append("app", &ev)?;
            }
            Ok(())
        })
        .unwrap();
    drop(engine);
    // Closing checkpoints the WAL, but a connection another thread of the
    // engine still holds for a moment would leave it: checkpointed here
    // too, so what follows reads the main file alone.
    let conn = Connection::open(path).unwrap();
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(busy, 0, "the WAL is checkpointed and empty");
}

#[test]
fn a_new_file_is_wal_with_the_current_schema_and_every_pragma_read_back() {
    let s = Scene::new();
    let engine = Engine::open(&s.path).unwrap();
    assert_eq!(engine.synchronous(), Synchronous::Full);

    let raw = Connection::open(&s.path).unwrap();
    let mode: String = raw
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(pragma_i64(&raw, "user_version"), SCHEMA_VERSION);

    // The writer's connection: FULL and foreign keys on.
    let (sync, fk) = engine
        .write(|tx| {
            let c = tx.conn();
            Ok((pragma_i64(c, "synchronous"), pragma_i64(c, "foreign_keys")))
        })
        .unwrap();
    assert_eq!((sync, fk), (2, 1));
    // Every reader: the same, and query_only, so a read cannot write.
    for _ in 0..8 {
        let (sync, fk, q) = engine
            .with_reader(|c| {
                Ok((
                    pragma_i64(c, "synchronous"),
                    pragma_i64(c, "foreign_keys"),
                    pragma_i64(c, "query_only"),
                ))
            })
            .unwrap();
        assert_eq!((sync, fk, q), (2, 1, 1));
    }
    let e = engine
        .with_reader(|c| Ok(c.execute("DELETE FROM reflexr_events", [])?))
        .unwrap_err();
    assert!(
        matches!(e, Error::ReadOnly { .. } | Error::Storage { .. }),
        "{e}"
    );

    drop(engine);
    let normal = Engine::builder(&s.path)
        .synchronous(Synchronous::Normal)
        .open()
        .unwrap();
    let sync = normal
        .with_reader(|c| Ok(pragma_i64(c, "synchronous")))
        .unwrap();
    assert_eq!(sync, 1);
}

#[test]
fn reopening_keeps_everything() {
    let s = Scene::new();
    closed_reflexr_file(&s.path, 5);
    let engine = Engine::open(&s.path).unwrap();
    assert_eq!(engine.read(&Query::new("app")).unwrap().len(), 5);
    assert_eq!(engine.workspaces().unwrap()[0].event_types, ["tick"]);
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_and_left_unchanged() {
    // Invariant 10: never a panic, never an overwrite.
    let s = Scene::new();
    std::fs::write(
        &s.path,
        "name,seq\nthis is a CSV file, not a database\n".repeat(200),
    )
    .unwrap();
    let before = bytes(&s.path);
    match Engine::open(&s.path) {
        Err(Error::NotADatabase { path: p }) => assert_eq!(p, s.path),
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    assert_eq!(bytes(&s.path), before);
}

#[test]
fn a_file_with_a_damaged_schema_page_is_refused_and_left_unchanged() {
    let s = Scene::new();
    closed_reflexr_file(&s.path, 20);
    let mut b = bytes(&s.path);
    // Page 1 after the 100-byte header holds the b-tree of sqlite_schema.
    for x in &mut b[100..1024] {
        *x = 0xA5;
    }
    std::fs::write(&s.path, &b).unwrap();
    match Engine::open(&s.path) {
        Err(Error::Corrupt { detail }) => assert!(detail.contains("test.db"), "{detail}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(bytes(&s.path), b);
}

#[test]
fn a_damaged_data_page_is_found_on_open_when_verifying_and_reported_by_reads() {
    let s = Scene::new();
    closed_reflexr_file(&s.path, 2_000);
    let (root, page_size): (i64, i64) = {
        let raw = Connection::open(&s.path).unwrap();
        let root = raw
            .query_row(
                "SELECT rootpage FROM sqlite_schema WHERE name = 'reflexr_events'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (root, pragma_i64(&raw, "page_size"))
    };
    let mut b = bytes(&s.path);
    let start = ((root - 1) * page_size) as usize;
    for x in &mut b[start..start + page_size as usize] {
        *x = 0x5A;
    }
    std::fs::write(&s.path, &b).unwrap();

    let e = Engine::builder(&s.path)
        .verify_on_open(true)
        .open()
        .unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert_eq!(bytes(&s.path), b, "refused unchanged");

    // Without the check the file opens (only its schema was read), and the
    // damage is a typed error where it is met — not a panic.
    let engine = Engine::open(&s.path).unwrap();
    let e = engine.read(&Query::new("app")).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(matches!(
        engine.check_integrity(),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn a_file_from_a_newer_reflexr_is_refused_and_left_unchanged() {
    let s = Scene::new();
    closed_reflexr_file(&s.path, 3);
    {
        let raw = Connection::open(&s.path).unwrap();
        raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    let before = bytes(&s.path);
    match Engine::open(&s.path) {
        Err(Error::SchemaTooNew {
            found, supported, ..
        }) => assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION)),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(bytes(&s.path), before);
}

#[test]
fn another_programs_versioned_database_is_refused_and_left_unchanged() {
    let s = Scene::new();
    {
        let raw = Connection::open(&s.path).unwrap();
        raw.execute_batch("CREATE TABLE notes (body TEXT); PRAGMA user_version = 7;")
            .unwrap();
    }
    let before = bytes(&s.path);
    let e = Engine::open(&s.path).unwrap_err();
    assert!(matches!(e, Error::ForeignDatabase { .. }), "{e}");
    assert_eq!(bytes(&s.path), before);
}

#[test]
fn a_name_clash_with_the_applications_tables_is_refused_and_left_unchanged() {
    let s = Scene::new();
    {
        let raw = Connection::open(&s.path).unwrap();
        raw.execute_batch("CREATE TABLE reflexr_audit (mine TEXT);")
            .unwrap();
    }
    let before = bytes(&s.path);
    let e = Engine::open(&s.path).unwrap_err();
    assert!(matches!(e, Error::ForeignDatabase { .. }), "{e}");
    assert_eq!(bytes(&s.path), before);
}

#[test]
fn an_application_database_gains_reflexr_tables_and_keeps_its_own() {
    let s = Scene::new();
    {
        let raw = Connection::open(&s.path).unwrap();
        raw.execute_batch(
            "CREATE TABLE sessions (id INTEGER PRIMARY KEY, title TEXT);
             INSERT INTO sessions VALUES (1, 'keynote');",
        )
        .unwrap();
    }
    let engine = Engine::open(&s.path).unwrap();
    let title: String = engine
        .with_reader(|c| Ok(c.query_row("SELECT title FROM sessions", [], |r| r.get(0))?))
        .unwrap();
    assert_eq!(title, "keynote");
    assert_eq!(engine.head_seq().unwrap(), 0);
}

/// Every table's and view's columns, in order, and every index: the shape
/// of a file's schema, whatever text created it.
fn shape(conn: &Connection) -> Vec<String> {
    let mut out = Vec::new();
    let objects: Vec<(String, String)> = conn
        .prepare("SELECT type, name FROM sqlite_schema WHERE name LIKE 'reflexr%' ORDER BY name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (kind, name) in objects {
        // An index's columns, in its order; a table's or a view's with
        // their types.
        let sql = if kind == "index" {
            format!(
                "SELECT coalesce(name, '<expr>'), '', 0, NULL FROM pragma_index_info('{name}') \
                 ORDER BY seqno"
            )
        } else {
            format!("SELECT name, type, \"notnull\", dflt_value FROM pragma_table_info('{name}')")
        };
        let columns: Vec<String> = conn
            .prepare(&sql)
            .unwrap()
            .query_map([], |r| {
                Ok(format!(
                    "{}:{}:{}:{:?}",
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<String>>(3)?
                ))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        // An index's kind too: unique or not, partial or not.
        let flags: String = if kind == "index" {
            conn.query_row(
                &format!(
                    "SELECT \"unique\" || '/' || partial FROM pragma_index_list( \
                       (SELECT tbl_name FROM sqlite_schema WHERE name = '{name}')) \
                     WHERE name = '{name}'"
                ),
                [],
                |r| r.get(0),
            )
            .unwrap()
        } else {
            String::new()
        };
        out.push(format!("{kind} {name} ({}) {flags}", columns.join(", ")));
    }
    out
}

#[test]
fn a_version_1_file_is_migrated_forward_keeping_its_rows_and_gets_the_new_shape() {
    // "The file": older files are migrated forward on open, in one
    // transaction; the result is shaped like a new file.
    let s = Scene::new();
    let old = s.path.clone();
    {
        let raw = Connection::open(&old).unwrap();
        raw.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        raw.execute_batch(include_str!("fixtures/schema_v1.sql"))
            .unwrap();
        raw.execute_batch(
            "INSERT INTO reflexr_workspaces VALUES ('app', 1);
             INSERT INTO reflexr_event_types VALUES ('app', 'tick', 0, 1);
             INSERT INTO reflexr_events (workspace, id, type, subject, actor, occurred_at,
               recorded_at, payload) VALUES ('app', 'e1', 'tick', 's', 'a', 1, 1, '{}');
             INSERT INTO reflexr_cursors VALUES ('app', 'app', 'mailer', 1, 1);
             INSERT INTO reflexr_followers (name, source, target, projection, created_at,
               updated_at) VALUES ('f', 'app', 'other', 'same', 1, 1);
             INSERT INTO reflexr_runs (id, kind, action, input, state, max_attempts,
               backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, created_at,
               updated_at) VALUES ('r1', 'rule', 'act', '{\"n\":1}', 'ready', 3, 1000, 60000,
               2.0, 0.1, 1, 1, 1);
             -- The application's own view of reflexr's runs: the rebuilds
             -- of the runs table must leave it working.
             CREATE VIEW app_runs AS SELECT id, state FROM reflexr_runs;",
        )
        .unwrap();
        assert_eq!(pragma_i64(&raw, "user_version"), 1);
    }
    let engine = Engine::open(&old).unwrap();
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 1);
    assert_eq!(engine.read(&Query::new("app")).unwrap().len(), 1);
    assert_eq!(engine.followers().unwrap().len(), 1);
    // The log's id and subject indexes, built again by version 14, answer
    // as before: an id the log has is found (nothing appended), and the
    // subject's next event takes the next version (its first was numbered
    // by version 8).
    let again = engine
        .append("app", &NewEvent::new("tick", "s", "a", 2).id("e1"))
        .unwrap();
    assert_eq!((again.seq, again.existing, again.version), (1, true, 1));
    let next = engine
        .append("app", &NewEvent::new("tick", "s", "a", 3))
        .unwrap();
    assert_eq!((next.existing, next.version), (false, 2));
    assert_eq!(engine.read_subject("app", "s", 1, 10).unwrap().len(), 2);
    // The runs table was rebuilt (versions 5 and 13): its rows came along.
    let run = engine
        .run("r1")
        .unwrap()
        .expect("the run survived the rebuild");
    assert_eq!(
        (run.state, run.action.as_str(), run.priority),
        (RunState::Ready, "act", 0)
    );
    let high_water: i64 = engine
        .with_reader(|c| {
            Ok(c.query_row(
                "SELECT high_water FROM reflexr_cursors WHERE name = 'mailer'",
                [],
                |r| r.get(0),
            )?)
        })
        .unwrap();
    assert_eq!(
        high_water, 1,
        "a cursor's high water starts at its position"
    );
    drop(engine);

    let new = s.file("new.db");
    drop(Engine::open(&new).unwrap());
    let (old, new) = (
        Connection::open(&old).unwrap(),
        Connection::open(&new).unwrap(),
    );
    assert_eq!(pragma_i64(&old, "user_version"), SCHEMA_VERSION);
    assert_eq!(shape(&old), shape(&new));
    let through_view: (String, String) = old
        .query_row("SELECT id, state FROM app_runs", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(through_view, ("r1".to_string(), "ready".to_string()));
    // The tables rebuilt to respell their CHECKs (version 13) still refuse
    // what the CHECKs refused, on both files.
    for file in [&old, &new] {
        let run = |kind: &str, state: &str, mode: &str| {
            format!(
                "INSERT INTO reflexr_runs (id, kind, action, input, state, max_attempts, \
                   backoff_ms, backoff_max_ms, backoff_factor, jitter, due_at, created_at, \
                   updated_at, unique_mode) \
                 VALUES ('bad', '{kind}', 'act', '{{}}', '{state}', 3, 1000, 60000, 2.0, 0.1, \
                   1, 1, 1, '{mode}')"
            )
        };
        assert_eq!(
            file.execute(&run("task", "ready", "active"), []).unwrap(),
            1
        );
        file.execute("DELETE FROM reflexr_runs WHERE id = 'bad'", [])
            .unwrap();
        for bad in [
            run("task", "lost", "active"),
            run("chore", "ready", "active"),
            run("task", "ready", "forever"),
            "INSERT INTO reflexr_run_logs (run, n, attempt, at, level, message) \
             VALUES ('r1', 1, 1, 1, 'loud', 'm')"
                .to_string(),
            "INSERT INTO reflexr_steps (run, name, position, kind, state, attempt, recorded_at) \
             VALUES ('r1', 's', 0, 'hop', 'done', 1, 1)"
                .to_string(),
        ] {
            let err = file.execute(&bad, []).unwrap_err();
            assert!(
                err.to_string().contains("CHECK constraint failed"),
                "{bad}: {err}"
            );
        }
    }
}

#[test]
fn a_missing_file_is_an_error_unless_creating_was_asked_for() {
    let s = Scene::new();
    let e = Engine::builder(&s.path)
        .create_if_missing(false)
        .open()
        .unwrap_err();
    assert!(matches!(e, Error::Missing { .. }), "{e}");
    assert!(!s.path.exists(), "nothing was created");
    let e = Engine::open(s.path.parent().unwrap()).unwrap_err();
    assert!(e.is_bad_input(), "a directory: {e}");
}

#[test]
fn bad_settings_are_refused_before_the_file_is_touched() {
    let s = Scene::new();
    for b in [
        Engine::builder(&s.path).pool_size(0),
        Engine::builder(&s.path).max_payload_bytes(0),
        Engine::builder(&s.path).heartbeat(std::time::Duration::ZERO),
        Engine::builder(&s.path).holder_id(""),
        Engine::builder(&s.path).lease_ttl(std::time::Duration::from_millis(2)),
    ] {
        assert!(b.open().unwrap_err().is_bad_input());
    }
    assert!(!s.path.exists());
}

#[test]
fn a_vfs_sqlite_does_not_know_is_refused_before_the_file_is_touched() {
    // Invariant 10: bad input is a typed error and changes nothing.
    let s = Scene::new();
    let e = Engine::builder(&s.path)
        .vfs("no-such-vfs")
        .open()
        .unwrap_err();
    assert!(
        matches!(e, Error::Invalid { field: "vfs", .. }),
        "a typed error: {e}"
    );
    assert!(!s.path.exists(), "nothing was created");
    let e = Engine::builder(&s.path).vfs("a vfs?").open().unwrap_err();
    assert!(e.is_bad_input(), "{e}");
    // The default VFS, named, opens the file as usual.
    let e = Engine::builder(&s.path).vfs("unix").open().unwrap();
    assert_eq!(e.synchronous(), Synchronous::Full);
}

#[test]
fn several_engines_opening_one_new_file_at_once_all_succeed() {
    let s = Scene::new();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let path = s.path.clone();
            std::thread::spawn(move || {
                let e = Engine::open(&path).unwrap();
                e.ensure_workspace("app", &["tick"]).unwrap();
                e.append("app", &NewEvent::new("tick", format!("t/{i}"), "c", 0))
                    .unwrap()
                    .seq
            })
        })
        .collect();
    let mut seqs: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [1, 2, 3, 4]);
}

#[test]
fn schema_sql_loads_in_the_sqlite3_shell_and_the_library_opens_the_result() {
    // schema.sql must need nothing newer than the system sqlite3 (3.40 here).
    // CI installs sqlite3; set REFLEXR_SKIP_SQLITE3=1 to skip where it is absent.
    if std::env::var_os("REFLEXR_SKIP_SQLITE3").is_some() {
        return;
    }
    let s = Scene::new();
    let schema = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/schema.sql")).unwrap();
    let mut child = std::process::Command::new("sqlite3")
        .arg(&s.path)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the sqlite3 shell (apt-get install sqlite3, or set REFLEXR_SKIP_SQLITE3=1)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &schema).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "sqlite3: {stderr}"
    );

    let engine = Engine::open(&s.path).unwrap();
    engine.ensure_workspace("app", &["tick"]).unwrap();
    engine
        .append("app", &NewEvent::new("tick", "t", "c", 0))
        .unwrap();
    let views = std::process::Command::new("sqlite3")
        .arg(&s.path)
        .arg("SELECT workspace, type FROM reflexr_event_log; SELECT count(*) FROM reflexr_cursor_lag;")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&views.stdout), "app|tick\n0\n");
}
