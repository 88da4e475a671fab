//! Cursors: durable, per consumer and workspace, forward only but for a
//! recorded operator reset (DESIGN.md, invariant 8).

mod common;

use common::{Arrange, Scene};
use reflexr::{ConsumerKind, Error, NewEvent, Query};

/// The workspaces every test starts with: `app`, where the ticks are, and
/// `other`.
const SPACES: &[(&str, &[&str])] = &[("app", &["tick"]), ("other", &["tick"])];

/// The log of `app` when a test starts: ten ticks, seqs 1 to 10.
fn ticks() -> impl Iterator<Item = NewEvent> {
    (0..10).map(|i| NewEvent::new("tick", format!("t/{i}"), "clock", i))
}

#[test]
fn a_cursor_starts_at_zero_moves_forward_and_survives_a_reopen() {
    // Invariant 8: durable and forward.
    let s = Scene::new();
    {
        let engine = s.open("test").each_workspace(SPACES).events("app", ticks());
        assert_eq!(engine.cursor("mailer", "app").unwrap(), 0);
        engine.save_cursor("mailer", "app", 4).unwrap();
        engine.save_cursor("mailer", "app", 4).unwrap(); // the same again: fine
        engine.save_cursor("mailer", "app", 7).unwrap();
        // Another consumer, and the same consumer on another workspace, are
        // separate cursors.
        engine.save_cursor("audit", "app", 2).unwrap();
        engine.save_cursor("mailer", "other", 1).unwrap();
    }
    let engine = s.open("test");
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 7);
    assert_eq!(engine.cursor("audit", "app").unwrap(), 2);
    assert_eq!(engine.cursor("mailer", "other").unwrap(), 1);
    let listed = engine.cursors().unwrap();
    let mailer = listed
        .iter()
        .find(|c| c.name == "mailer" && c.workspace == "app")
        .unwrap();
    assert_eq!(
        (mailer.kind, mailer.position, mailer.lag),
        (ConsumerKind::App, 7, 3)
    );
}

#[test]
fn saving_an_older_position_is_refused_and_changes_nothing() {
    // Invariant 8: a cursor never moves backwards by a save.
    let s = Scene::new();
    let engine = s.open("test").each_workspace(SPACES).events("app", ticks());
    engine.save_cursor("mailer", "app", 6).unwrap();
    match engine.save_cursor("mailer", "app", 5) {
        Err(Error::CursorBackwards {
            current, requested, ..
        }) => assert_eq!((current, requested), (6, 5)),
        other => panic!("expected CursorBackwards, got {other:?}"),
    }
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 6);
}

#[test]
fn a_position_past_the_head_or_negative_or_on_a_missing_workspace_is_refused() {
    // Invariant 10: bad input gets a typed error.
    let s = Scene::new();
    let engine = s.open("test").each_workspace(SPACES).events("app", ticks());
    let e = engine.save_cursor("mailer", "app", 11).unwrap_err();
    assert!(matches!(e, Error::CursorAhead { head: 10, .. }), "{e}");
    let e = engine.save_cursor("mailer", "app", -1).unwrap_err();
    assert!(e.is_bad_input(), "{e}");
    let e = engine.save_cursor("mailer", "nowhere", 1).unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let e = engine.save_cursor("bad name", "app", 1).unwrap_err();
    assert!(e.is_bad_input(), "{e}");
    assert!(engine.cursors().unwrap().is_empty());
}

#[test]
fn a_cursor_saved_in_the_consumers_transaction_commits_with_its_rows() {
    // Invariants 2 and 8: what a consumer wrote for the events it handled
    // commits with the cursor's advance, or neither does.
    let s = Scene::new();
    let engine = s.open("test").each_workspace(SPACES).events("app", ticks());
    engine
        .write(|tx| tx.execute("CREATE TABLE handled (seq INTEGER PRIMARY KEY)", []))
        .unwrap();

    let handle = |fail: bool| {
        engine.write(|tx| {
            let after = tx.cursor("projector", "app")?;
            let page = engine.read(&Query::new("app").after(after).limit(3))?;
            for e in &page {
                tx.execute("INSERT INTO handled (seq) VALUES (?1)", [e.seq])?;
            }
            if let Some(last) = page.last() {
                tx.save_cursor("projector", "app", last.seq)?;
            }
            if fail {
                return Err(Error::Invalid {
                    field: "projection",
                    reason: "failed after writing".into(),
                });
            }
            Ok(page.len())
        })
    };
    assert_eq!(handle(false).unwrap(), 3);
    assert!(handle(true).is_err());
    assert_eq!(engine.cursor("projector", "app").unwrap(), 3);
    assert_eq!(common::count(&engine, "SELECT count(*) FROM handled"), 3);
    assert_eq!(handle(false).unwrap(), 3);
    assert_eq!(engine.cursor("projector", "app").unwrap(), 6);
    assert_eq!(common::count(&engine, "SELECT max(seq) FROM handled"), 6);
}

#[test]
fn an_operator_reset_moves_a_cursor_back_and_is_recorded() {
    // Invariant 8: the one way back, recorded.
    let s = Scene::new();
    let engine = s.open("test").each_workspace(SPACES).events("app", ticks());
    engine.save_cursor("mailer", "app", 9).unwrap();
    let reset = engine
        .operator("ops@example", "replay after fix")
        .reset_cursor("app", ConsumerKind::App, "mailer", 2)
        .unwrap();
    assert_eq!((reset.from, reset.to), (Some(9), 2));
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 2);
    // And forward saves continue from there.
    engine.save_cursor("mailer", "app", 3).unwrap();

    let log = engine.audit_log(10).unwrap();
    assert_eq!(log.len(), 1);
    let entry = &log[0];
    assert_eq!(entry.action.as_str(), "reset_cursor");
    assert_eq!(entry.operator, "ops@example");
    assert_eq!(entry.reason, "replay after fix");
    assert_eq!(entry.target, "cursor app/mailer@app");
    let detail: serde_json::Value = serde_json::from_str(&entry.detail).unwrap();
    assert_eq!(detail, serde_json::json!({ "from": 9, "to": 2 }));

    // A reset still refuses what no save could mean, and records nothing then.
    let e = engine
        .operator("ops", "typo")
        .reset_cursor("app", ConsumerKind::App, "mailer", 99)
        .unwrap_err();
    assert!(matches!(e, Error::CursorAhead { .. }), "{e}");
    let e = engine
        .operator("", "no operator")
        .reset_cursor("app", ConsumerKind::App, "mailer", 1)
        .unwrap_err();
    assert!(e.is_bad_input(), "{e}");
    assert_eq!(engine.audit_log(10).unwrap().len(), 1);
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 3);
}
