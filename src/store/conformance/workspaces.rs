//! The conformance suite for workspaces and their types.

use super::*;

/// Invariant 10 (an unregistered type is `NotFound`): workspaces and their
/// types list the same on both backends.
#[test]
fn workspaces_list_their_application_types() {
    on_every_backend(|db| {
        setup(db, "shop");
        db.tx(|c| {
            assert!(!workspace::create(c, NOW, "shop")?);
            workspace::register_types(c, NOW, "shop", &["Opened", "Paid"])?;
            let e = workspace::register_types(c, NOW, "nowhere", &["Opened"]).unwrap_err();
            assert!(matches!(e, Error::NotFound { .. }));
            let listed = workspace::list(c)?;
            assert_eq!(listed.len(), 1);
            assert_eq!(listed[0].event_types, ["Closed", "Opened", "Paid"]);
            Ok(())
        })
        .unwrap();
    });
}
