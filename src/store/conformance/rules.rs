//! The conformance suite for rules' scope states: a batch's states written
//! together are the states read back.

use super::*;

/// Invariant 4 (a rule decides exactly once, from the state its last
/// decision left): a batch's states are stored as given — new scopes
/// inserted, stored ones replaced, other rules' and other scopes' left as
/// they were — whatever characters the scopes and states hold.
#[test]
fn a_batchs_states_are_stored_as_given() {
    on_every_backend(|db| {
        // PostgreSQL's text holds no NUL; SQLite's does, and keeps it.
        let odd = if db.name() == "sqlite" {
            "quote \" backslash \\ tab \t nul \u{0} é ☃ 𝄞"
        } else {
            "quote \" backslash \\ tab \t é ☃ 𝄞"
        };
        let state_odd = r#"{"text":"a \"quoted\" \\ line\nand \u0000 é"}"#;
        db.tx(|c| {
            c.save_states(
                "r",
                &[("a", r#"{"n":1}"#, 10), ("b", r#"{"n":2}"#, 11)],
                NOW,
            )?;
            c.save_states("other", &[("a", r#"{"n":9}"#, 12)], NOW)
        })
        .unwrap();
        db.tx(|c| {
            c.save_states(
                "r",
                &[
                    ("b", r#"{"n":3}"#, 20),
                    ("", "null", 21),
                    (odd, state_odd, 22),
                ],
                NOW + 1,
            )?;
            // An empty batch writes nothing.
            c.save_states("r", &[], NOW + 2)
        })
        .unwrap();
        let name = db.name();
        db.tx(|c| {
            let mut got = c.states("r", &["a", "b", "", odd, "missing"])?;
            got.sort();
            let mut want = vec![
                ("".to_string(), "null".to_string()),
                ("a".to_string(), r#"{"n":1}"#.to_string()),
                ("b".to_string(), r#"{"n":3}"#.to_string()),
                (odd.to_string(), state_odd.to_string()),
            ];
            want.sort();
            assert_eq!(got, want, "{name}");
            assert_eq!(c.state("other", "a")?.as_deref(), Some(r#"{"n":9}"#));
            Ok(())
        })
        .unwrap();
    });
}
