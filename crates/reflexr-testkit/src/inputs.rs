//! Random input for the property tests (`tests/it/bad_input.rs`,
//! `tests/it/log.rs`): names, ids, types, subjects and payloads that are
//! sometimes fine and often not.

use proptest::prelude::*;

/// Strings that are sometimes fine and often not.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z]{1,12}",
        "[a-zA-Z0-9._:/@+-]{1,140}",
        ".{0,40}",
        "[\\x00-\\x1f]{1,4}",
        "\\PC{200,300}",
        Just("RuleFired".to_string()),
        Just("x".repeat(2_000)),
    ]
}

/// Payload text: JSON, nearly JSON, and not JSON at all.
pub fn payload() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{}".to_string()),
        "\\{\"[a-z]{1,5}\":[0-9]{1,5}\\}",
        ".{0,30}",
        (1usize..2_000).prop_map(|d| format!("{}1{}", "[".repeat(d), "]".repeat(d))),
        Just(format!("\"{}\"", "y".repeat(1_100_000))),
        Just("{\"a\":".to_string()),
    ]
}
