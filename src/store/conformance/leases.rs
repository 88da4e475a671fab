//! The conformance suite for leases: one holder, fencing.

use super::*;

/// Invariant 7: one holder at a time; taking a lapsed lease bumps the
/// generation, and the old holder's fence fails.
#[test]
fn a_lease_has_one_holder_and_fences_the_one_that_lost_it() {
    on_every_backend(|db| {
        let ttl = Duration::from_secs(30);
        let a = db
            .tx(|c| lease::acquire(c, NOW, "evaluator/shop", "proc-a", ttl))
            .unwrap();
        assert_eq!(a.generation, 1);
        let held = db
            .tx(|c| lease::acquire(c, NOW + 1, "evaluator/shop", "proc-b", ttl))
            .unwrap_err();
        assert!(
            matches!(&held, Error::LeaseHeld { holder, .. } if holder == "proc-a"),
            "{}: {held}",
            db.name()
        );
        let a = db.tx(|c| lease::renew(c, NOW + 10_000, &a)).unwrap();
        assert_eq!(a.expires_at, NOW + 40_000);
        db.tx(|c| lease::fence(c, NOW + 39_999, &a)).unwrap();
        // A pauses past its expiry; B takes over.
        let b = db
            .tx(|c| lease::acquire(c, NOW + 40_000, "evaluator/shop", "proc-b", ttl))
            .unwrap();
        assert_eq!(b.generation, 2);
        let lost = db.tx(|c| lease::fence(c, NOW + 40_001, &a)).unwrap_err();
        assert!(
            matches!(lost, Error::LeaseLost { generation: 1, .. }),
            "{lost}"
        );
        assert!(db.tx(|c| lease::renew(c, NOW + 40_001, &a)).is_err());
        assert!(!db.tx(|c| lease::release(c, NOW + 40_001, &a)).unwrap());
        assert!(db.tx(|c| lease::release(c, NOW + 40_001, &b)).unwrap());
        // Released: free at once, and the generation is not reused.
        let c2 = db
            .tx(|c| lease::acquire(c, NOW + 40_002, "evaluator/shop", "proc-c", ttl))
            .unwrap();
        assert_eq!(c2.generation, 3);
        let listed = db.tx(|c| lease::list(c)).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].holder, "proc-c");
    });
}
