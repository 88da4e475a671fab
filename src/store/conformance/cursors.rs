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

/// Invariants 4 and 7, as a consumer's commit checks them: under a lease
/// still held, where the cursor stands (and its stamp) and whether the
/// consumer is paused, in one look (one round trip on PostgreSQL); nothing
/// under a lease that lapsed or went to another holder.
#[test]
fn a_consumers_commit_reads_its_lease_its_stand_and_its_pause_in_one_look() {
    on_every_backend(|db| {
        setup(db, "shop");
        let ttl = Duration::from_secs(30);
        let held = db
            .tx(|c| lease::acquire(c, NOW, "evaluator/shop", "proc-a", ttl))
            .unwrap();
        let look = |db: &mut Db, now: i64, generation: i64, pausable: bool| {
            db.tx(|c| {
                Control::fenced_stand(
                    c,
                    ("evaluator/shop", "proc-a", generation),
                    now,
                    "shop",
                    "rule",
                    "mailer",
                    pausable,
                )
            })
            .unwrap()
        };
        let first = look(db, NOW + 1, held.generation, true).expect("held");
        assert_eq!((first.stand, first.paused), (None, false), "{}", db.name());
        db.tx(|c| {
            append(c, "shop", &event("Opened", "s-1"))?;
            append(c, "shop", &event("Opened", "s-2"))?;
            cursor::save(c, NOW + 2, ("shop", ConsumerKind::Rule, "mailer"), 2)?;
            Control::pause(c, "rule", "mailer", NOW + 2, "ops", "a test")?;
            Ok(())
        })
        .unwrap();
        let stamped = db
            .tx(|c| Cursors::get_stamped(c, "shop", "rule", "mailer"))
            .unwrap();
        let after = look(db, NOW + 3, held.generation, true).expect("held");
        assert_eq!(after.stand.map(|s| s.0), Some(2), "{}", db.name());
        assert_eq!(after.stand, stamped);
        assert!(after.paused);
        // Not asked, not looked at.
        assert!(
            !look(db, NOW + 3, held.generation, false)
                .expect("held")
                .paused
        );
        // Another generation, or past the expiry: not held.
        assert_eq!(look(db, NOW + 3, held.generation + 1, true), None);
        assert_eq!(look(db, NOW + 30_000, held.generation, true), None);
    });
}

/// Invariant 4's first read, where a pass over rules begins: each rule's
/// stand (position, stamp and high water, as one read of its cursor reads
/// them), or that it is paused, in the order asked (one round trip on
/// PostgreSQL for all of them); a rule never saved stands at 0, and a
/// consumer of another kind paused under the same name is not.
#[test]
fn a_pass_reads_every_rules_stand_and_pause_at_once_in_the_order_asked() {
    on_every_backend(|db| {
        let name = db.name();
        setup(db, "shop");
        db.tx(|c| {
            for s in ["s-1", "s-2", "s-3"] {
                append(c, "shop", &event("Opened", s))?;
            }
            cursor::save(c, NOW, ("shop", ConsumerKind::Rule, "ahead"), 3)?;
            cursor::save(c, NOW + 1, ("shop", ConsumerKind::Rule, "paused"), 2)?;
            Control::pause(c, "rule", "paused", NOW + 1, "ops", "a test")?;
            // Same name, another kind: no pause of the rule's.
            Control::pause(c, "reaction", "fresh", NOW + 1, "ops", "a test")?;
            Ok(())
        })
        .unwrap();
        let (stands, one_by_one) = db
            .tx(|c| {
                let names = ["fresh", "paused", "ahead"];
                let stands = Control::stands(c, "shop", "rule", &names)?;
                let one_by_one = names
                    .iter()
                    .map(|n| Cursors::stamped_and_high_water(c, "shop", "rule", n))
                    .collect::<Result<Vec<_>>>()?;
                Ok((stands, one_by_one))
            })
            .unwrap();
        assert_eq!(stands.len(), 3, "{name}");
        assert_eq!(stands[0], Some((None, 0)), "{name}");
        assert_eq!(stands[1], None, "{name}: paused");
        assert_eq!(stands[2], Some(one_by_one[2]), "{name}");
        assert_eq!(one_by_one[2].0.map(|s| s.0), Some(3), "{name}");
        assert_eq!(one_by_one[2].1, 3, "{name}");
    });
}
