//! The conformance suite for cursors: forward only, never past the head.

use super::*;

/// Invariant 8: a cursor moves only forward, never past the head.
#[test]
fn a_cursor_moves_only_forward_and_never_past_the_head() {
    on_every_backend(|db| {
        setup(db, "shop");
        let at = ("shop", ConsumerKind::App, "mailer");
        db.tx(|c| {
            for i in 0..3 {
                append(c, "shop", &event("Opened", &format!("s-{i}")))?;
            }
            assert_eq!(cursor::load(c, "shop", ConsumerKind::App, "mailer")?, 0);
            cursor::save(c, NOW, at, 2)
        })
        .unwrap();
        let back = db.tx(|c| cursor::save(c, NOW, at, 1)).unwrap_err();
        assert!(
            matches!(
                back,
                Error::CursorBackwards {
                    current: 2,
                    requested: 1,
                    ..
                }
            ),
            "{}: {back}",
            db.name()
        );
        let ahead = db.tx(|c| cursor::save(c, NOW, at, 4)).unwrap_err();
        assert!(
            matches!(ahead, Error::CursorAhead { head: 3, .. }),
            "{ahead}"
        );
        let unknown = db
            .tx(|c| cursor::save(c, NOW, ("elsewhere", ConsumerKind::App, "m"), 0))
            .unwrap_err();
        assert!(matches!(unknown, Error::NotFound { .. }), "{unknown}");
        db.tx(|c| cursor::save(c, NOW + 1, at, 2)).unwrap();
        db.tx(|c| cursor::save(c, NOW + 2, at, 3)).unwrap();
        let pos = db
            .tx(|c| cursor::load(c, "shop", ConsumerKind::App, "mailer"))
            .unwrap();
        assert_eq!(pos, 3);
    });
}
