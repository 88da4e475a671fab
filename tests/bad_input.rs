//! Bad input: property tests of the public API with random names, ids,
//! types, subjects, actors and payloads — empty, huge, deeply nested, with
//! control characters, not JSON. Every call returns a value or a typed error,
//! never panics, and a refused call leaves what is committed exactly as it
//! was (DESIGN.md, invariant 10). The API takes `&str`, so non-UTF-8 bytes
//! cannot reach it; text that is not JSON is the closest case, and covered.

mod common;

use common::inputs::{payload, text};
use common::{Arrange, Scene};
use proptest::prelude::*;
use reflexr::{ConsumerKind, Engine, Error, NewEvent, Query};

/// Everything a reader can see of the file, to prove a refused call changed
/// nothing.
fn snapshot(e: &Engine) -> (i64, usize, usize, usize) {
    (
        e.head_seq().unwrap(),
        e.read(&Query::new("app").limit(10_000)).unwrap().len(),
        e.cursors().unwrap().len(),
        e.workspaces().unwrap().len(),
    )
}

fn typed(err: &Error) -> bool {
    err.is_bad_input()
        || matches!(
            err,
            Error::NotFound { .. } | Error::Encode { .. } | Error::Decode { .. }
        )
}

/// The types of `app`, the workspace every test starts with.
const OK: &[&str] = &["ok"];

/// The one event `app` holds when a test starts.
fn ok() -> NewEvent {
    NewEvent::new("ok", "s", "a", 0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn appends_of_random_events_are_typed_errors_or_appends(
        workspace in text(), event_type in text(), id in text(), subject in text(),
        actor in text(), body in payload(),
    ) {
        let s = Scene::new();
        let e = s.open("test").workspace("app", OK).events("app", [ok()]);
        let before = snapshot(&e);
        let ev = NewEvent::new(&event_type, &subject, &actor, 0).id(&id).payload_json(&body);
        match e.append(&workspace, &ev) {
            Ok(a) => {
                prop_assert_eq!((workspace.as_str(), event_type.as_str()), ("app", "ok"));
                let stored = e.event(a.seq).unwrap().unwrap();
                prop_assert_eq!(&stored.id, &id);
                prop_assert_eq!(stored.payload_json(), body.as_str());
            }
            Err(err) => {
                prop_assert!(typed(&err), "untyped: {err:?}");
                prop_assert_eq!(snapshot(&e), before);
            }
        }
    }

    #[test]
    fn names_everywhere_are_checked_before_anything_is_written(
        name in text(), other in text(), seq in -5i64..50,
    ) {
        let s = Scene::new();
        let e = s.open("test").workspace("app", OK).events("app", [ok()]);
        let before = snapshot(&e);
        let results: Vec<reflexr::Result<()>> = vec![
            e.create_workspace(&name),
            e.register_types("app", &[name.as_str()]),
            e.save_cursor(&name, "app", seq),
            e.save_cursor("c", &name, 1),
            e.operator(&other, "test").reset_cursor("app", ConsumerKind::App, &name, seq).map(|_| ()),
            e.acquire_lease(&name, None).map(|_| ()),
            e.read(&Query::new(&name).after(seq)).map(|_| ()),
            e.operator(&other, "x").retry_run(&name),
            e.operator("ops", "x").unblock(&name, &other),
            e.operator("ops", "x").delete_rule(&name),
            e.operator("ops", "x").restart_follower(&name),
        ];
        for r in results {
            if let Err(err) = r {
                prop_assert!(typed(&err) || matches!(err, Error::LeaseHeld { .. }), "untyped: {err:?}");
            }
        }
        // What did succeed is only what the names allowed; with a valid
        // name, the calls above may have created a workspace, registered a
        // type, saved a cursor or taken a lease: all readable, none broken.
        let after = snapshot(&e);
        prop_assert!(after.0 >= before.0 && after.1 == before.1);
        e.check_integrity().unwrap();
    }

    #[test]
    fn a_refused_append_in_a_transaction_leaves_the_rest_of_it_intact(
        event_type in text(), body in payload(),
    ) {
        // The application may carry on after a refused append inside its
        // transaction: only that append is undone.
        let s = Scene::new();
        let e = s.open("test").workspace("app", OK).events("app", [ok()]);
        let (first, second) = e.write(|tx| {
            let first = tx.append("app", &NewEvent::new("ok", "s", "a", 1))?;
            let second = tx.append("app", &NewEvent::new(&event_type, "s", "a", 2).payload_json(&body));
            Ok((first, second))
        }).unwrap();
        let stored = e.read(&Query::new("app")).unwrap();
        prop_assert!(stored.iter().any(|ev| ev.seq == first.seq));
        match second {
            Ok(a) => prop_assert!(stored.iter().any(|ev| ev.seq == a.seq)),
            Err(err) => {
                prop_assert!(typed(&err), "untyped: {err:?}");
                prop_assert_eq!(stored.len(), 2);
            }
        }
    }
}

#[test]
fn a_payload_nested_deeper_than_the_parser_allows_is_refused_without_overflowing() {
    let s = Scene::new();
    let e = s.open("test").workspace("app", OK).events("app", [ok()]);
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = e
        .append("app", &NewEvent::new("ok", "s", "a", 0).payload_json(deep))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Invalid {
                field: "payload",
                ..
            }
        ),
        "{err}"
    );
}
