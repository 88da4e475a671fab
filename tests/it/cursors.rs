//! Cursors, on every backend: durable, per consumer and workspace, forward
//! only but for a recorded operator reset (DESIGN.md, invariant 8). Each
//! test is written once, generic over the backend, and `on_backends!` runs
//! it on an SQLite temp file and — with the feature `postgres` — on a
//! PostgreSQL schema of its own.

use reflexr_testkit as common;

use common::backend::TestBackend;
use common::on_backends;
use reflexr::{ConsumerKind, Engine, Error, ManualClock, NewEvent, Query};

on_backends!(
    a_cursor_starts_at_zero_moves_forward_and_survives_a_reopen,
    a_position_past_the_head_or_negative_or_on_a_missing_workspace_is_refused,
    a_cursor_saved_in_the_consumers_transaction_commits_with_its_rows,
    an_operator_reset_moves_a_cursor_back_and_is_recorded,
);

/// The workspaces every test starts with: `app`, where the ticks are, and
/// `other`.
const SPACES: &[(&str, &[&str])] = &[("app", &["tick"]), ("other", &["tick"])];

const START_MS: i64 = 1_800_000_000_000;

/// A place, its clock, and an engine on it with the workspaces of
/// [`SPACES`], whose `app` holds ten ticks, seqs 1 to 10.
fn setup<B: TestBackend>() -> (B::Place, ManualClock, Engine<B>) {
    let place = B::place();
    let clock = ManualClock::new(START_MS);
    let engine = B::open(&place, &clock, "test");
    for (name, types) in SPACES {
        engine.ensure_workspace(name, types).unwrap();
    }
    for i in 0..10 {
        engine
            .append("app", &NewEvent::new("tick", format!("t/{i}"), "clock", i))
            .unwrap();
    }
    (place, clock, engine)
}

/// Invariant 8: durable and forward — a cursor starts at 0, moves forward
/// (saving the same position again is fine), is kept per consumer and
/// workspace, and is where it was after a reopen.
fn a_cursor_starts_at_zero_moves_forward_and_survives_a_reopen<B: TestBackend>() {
    let (place, clock, engine) = setup::<B>();
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 0);
    engine.save_cursor("mailer", "app", 4).unwrap();
    engine.save_cursor("mailer", "app", 4).unwrap(); // the same again: fine
    engine.save_cursor("mailer", "app", 7).unwrap();
    // Another consumer, and the same consumer on another workspace, are
    // separate cursors.
    engine.save_cursor("audit", "app", 2).unwrap();
    engine.save_cursor("mailer", "other", 1).unwrap();
    drop(engine);

    let engine = B::open(&place, &clock, "test");
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

/// Invariant 10: bad input gets a typed error — a position past the head,
/// a negative one, a missing workspace, a bad consumer name — and no cursor
/// is made (and so none moves: invariant 8).
fn a_position_past_the_head_or_negative_or_on_a_missing_workspace_is_refused<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
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

/// Invariants 2 and 8: what a consumer wrote for the events it handled
/// commits with the cursor's advance, or neither does — and a consumer that
/// failed handles the same page again, from where its cursor stands.
fn a_cursor_saved_in_the_consumers_transaction_commits_with_its_rows<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    // BIGINT: a seq on every backend (`max` of it is read as an i64).
    B::sql(&engine, "CREATE TABLE handled (seq BIGINT PRIMARY KEY)");

    let handle = |fail: bool| {
        engine.write(|tx| {
            let after = tx.cursor("projector", "app")?;
            let page = engine.read(&Query::new("app").after(after).limit(3))?;
            for e in &page {
                B::run_sql(tx, &format!("INSERT INTO handled (seq) VALUES ({})", e.seq))?;
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
    assert_eq!(B::count(&engine, "SELECT count(*) FROM handled"), 3);
    assert_eq!(handle(false).unwrap(), 3);
    assert_eq!(engine.cursor("projector", "app").unwrap(), 6);
    assert_eq!(B::count(&engine, "SELECT max(seq) FROM handled"), 6);
}

/// Invariant 8: the one way back — an operator's reset — is recorded (who,
/// why, which cursor, from and to), forward saves go on from there, and a
/// reset no save could mean is refused and records nothing.
fn an_operator_reset_moves_a_cursor_back_and_is_recorded<B: TestBackend>() {
    let (_place, _clock, engine) = setup::<B>();
    engine.save_cursor("mailer", "app", 9).unwrap();
    let reset = engine
        .operator("ops@example", "replay after fix")
        .unwrap()
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
        .unwrap()
        .reset_cursor("app", ConsumerKind::App, "mailer", 99)
        .unwrap_err();
    assert!(matches!(e, Error::CursorAhead { .. }), "{e}");
    // Who asks is checked when the operator view is made.
    let e = engine.operator("", "no operator").unwrap_err();
    assert!(e.is_bad_input(), "{e}");
    assert_eq!(engine.audit_log(10).unwrap().len(), 1);
    assert_eq!(engine.cursor("mailer", "app").unwrap(), 3);
}

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use reflexr::Error;
    use reflexr_testkit as common;

    on_backends!(a_cursor_moves_only_forward_and_saves_with_the_consumers_rows,);

    /// Invariant 8: a cursor only moves forward, never past the head, and saves in
    /// the transaction of the consumer's own rows.
    fn a_cursor_moves_only_forward_and_saves_with_the_consumers_rows<B: TestBackend>() {
        let (_place, _clock, engine) = setup::<B>();
        for i in 0..3 {
            engine.append("app", &made(&i.to_string())).unwrap();
        }
        assert_eq!(engine.cursor("mailer", "app").unwrap(), 0);
        engine
            .write(|tx| {
                B::insert_thing(tx, "mailed-1")?;
                tx.save_cursor("mailer", "app", 1)
            })
            .unwrap();
        let failed: reflexr::Result<()> = engine.write(|tx| {
            B::insert_thing(tx, "mailed-2")?;
            tx.save_cursor("mailer", "app", 2)?;
            Err(Error::Invalid {
                field: "test",
                reason: "the mail server said no".into(),
            })
        });
        assert!(failed.is_err());
        assert_eq!(engine.cursor("mailer", "app").unwrap(), 1);
        assert_eq!(B::things(&engine), ["mailed-1"]);
        engine.save_cursor("mailer", "app", 3).unwrap();
        let back = engine.save_cursor("mailer", "app", 2).unwrap_err();
        assert!(
            matches!(
                back,
                Error::CursorBackwards {
                    current: 3,
                    requested: 2,
                    ..
                }
            ),
            "{back}"
        );
        let ahead = engine.save_cursor("mailer", "app", 4).unwrap_err();
        assert!(
            matches!(ahead, Error::CursorAhead { head: 3, .. }),
            "{ahead}"
        );
        let in_tx = engine.write(|tx| tx.cursor("mailer", "app")).unwrap();
        assert_eq!(in_tx, 3);
        engine.append("app", &made("later")).unwrap();
        let listed = engine.cursors().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].name.as_str(), listed[0].position, listed[0].lag),
            ("mailer", 3, 1)
        );
    }
}
