//! What names, ids and texts reflexr accepts. Checked before anything is
//! written, so bad input is a typed error and never a half-done write.

use crate::base::error::{Error, Result};

/// Longest name (workspace, event type, consumer, lease), in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest event id, actor or lease holder, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Longest subject, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 1024;

/// The start of an enqueued run's scope lane, `task:<action> <scope>` (no
/// rule may take a name that starts so: a rule's lanes are
/// `<rule> <scope>`).
pub(crate) const TASK_LANE_PREFIX: &str = "task:";

/// A name: 1 to [`MAX_NAME_BYTES`] bytes of ASCII letters, digits and
/// `. _ - : / @ +`. Names appear in views, in the CLI and in lease names, so
/// they are kept to characters that need no quoting in a shell.
pub(crate) fn check_name(field: &'static str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(
            field,
            format!("{} bytes, longer than {MAX_NAME_BYTES}", name.len()),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-:/@+".contains(*c)))
    {
        return Err(Error::invalid(
            field,
            format!("{name:?} has {c:?}; use letters, digits and . _ - : / @ +"),
        ));
    }
    Ok(())
}

/// A JSON path in the part of SQLite's grammar reflexr takes: `$`, then any
/// number of `.key` (any characters but `.`, `[`, `]` and `"`), `."key"`
/// (any but `"`), `[N]` and `[#-N]`. SQLite reads a path only as far as the
/// document goes, so a bad path can pass on one document and fail on the
/// next: it is checked whole here instead.
pub(crate) fn check_json_path(field: &'static str, path: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid(
            field,
            format!("{path:?} is not a JSON path: {why}"),
        ))
    };
    let Some(mut rest) = path.strip_prefix('$') else {
        return bad("it must start with $");
    };
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix(".\"") {
            let Some(end) = r.find('"') else {
                return bad("a quoted key is not closed");
            };
            rest = &r[end + 1..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if key.is_empty() || key.contains([']', '"']) {
                return bad("a key must be 1 or more characters other than . [ ] \"");
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return bad("a [ is not closed");
            };
            let index = r[..end].strip_prefix("#-").unwrap_or(&r[..end]);
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return bad("an index must be [N] or [#-N]");
            }
            rest = &r[end + 1..];
        } else {
            return bad("expected . or [ after a step");
        }
    }
    Ok(())
}

/// A W3C trace context (`traceparent`) as version 00 writes it:
/// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, with a trace id and a parent
/// id that are not all zeros.
pub(crate) fn check_traceparent(field: &'static str, tp: &str) -> Result<()> {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let ok = parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
        && parts[1].bytes().any(|b| b != b'0')
        && parts[2].bytes().any(|b| b != b'0');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!(
                "{tp:?} is not a W3C traceparent: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, lowercase, ids not all zeros"
            ),
        ))
    }
}

/// A free text that must be present: 1 to `max` bytes of UTF-8 with no
/// control characters (ids, actors, holders).
pub(crate) fn check_text(field: &'static str, text: &str, max: usize) -> Result<()> {
    if text.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if text.len() > max {
        return Err(Error::invalid(
            field,
            format!("{} bytes, longer than {max}", text.len()),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// The most lines one attempt of a run keeps in its log
/// ([`crate::RunContext::log`]): the next is replaced by one line saying
/// the rest were dropped, and those after it are dropped.
pub const MAX_LOG_LINES_PER_ATTEMPT: usize = 1_000;
/// Longest message of a log line, in bytes; a longer one is cut (at a
/// character boundary, with a note of how much).
pub const MAX_LOG_MESSAGE_BYTES: usize = 4 * 1024;
/// Largest fields of a log line, as JSON, in bytes; larger ones are
/// refused with [`crate::Error::Invalid`].
pub const MAX_LOG_FIELDS_BYTES: usize = 8 * 1024;

/// Longest error text the engine records (a run's last error, a dead
/// letter's, a `RuleErrored` event's, a stuck consumer's); longer texts are
/// cut, so that no error message, however long, can make the record of it
/// fail.
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// `text` cut to at most [`MAX_ERROR_BYTES`] (at a character boundary), with
/// a note of how much was cut; a NUL character (which PostgreSQL's text
/// cannot hold) becomes U+FFFD, so no error message can make the record of
/// it fail.
pub(crate) fn clip_error(text: &str) -> std::borrow::Cow<'_, str> {
    clip_text(text, MAX_ERROR_BYTES)
}

/// `text` cut to at most `max` bytes (at least 128; at a character
/// boundary), with a note of how much was cut; a NUL character becomes
/// U+FFFD.
pub(crate) fn clip_text(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        return std::borrow::Cow::Owned(
            clip_text(&text.replace('\0', "\u{FFFD}"), max).into_owned(),
        );
    }
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max.max(128) - 64;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… ({} more bytes cut)",
        &text[..end],
        text.len() - end
    ))
}

/// The action name of a channel's deliveries.
pub(crate) fn channel_action(channel: &str) -> String {
    format!("delivery/{channel}")
}

/// The action name of a scheduled job's occurrences.
pub(crate) fn job_action(job: &str) -> String {
    format!("job/{job}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_accept_the_documented_alphabet_only() {
        assert!(check_name("workspace", "tenant/acme-1.eu:prod@x+y_z").is_ok());
        for bad in ["", "a b", "naïve", "tab\t", "semi;colon", &"x".repeat(129)] {
            let err = check_name("workspace", bad).unwrap_err();
            assert!(err.is_bad_input(), "{bad:?}: {err}");
        }
    }

    /// Invariant 10: no error text, however long or with a NUL, can make the
    /// record of it fail.
    #[test]
    fn an_error_text_is_clipped_and_holds_no_nul() {
        assert_eq!(clip_error("short"), "short");
        assert_eq!(clip_error("a\0b"), "a\u{FFFD}b");
        let long = format!("{}\0", "x".repeat(MAX_ERROR_BYTES * 2));
        let clipped = clip_error(&long);
        assert!(clipped.len() <= MAX_ERROR_BYTES && !clipped.contains('\0'));
    }

    #[test]
    fn json_paths_are_checked_whole_and_what_passes_sqlite_takes() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let doc = r#"{"a": {"b c": [1, {"d.e": 2}], "x": 3}, "k": [[4]]}"#;
        for good in [
            "$",
            "$.a",
            "$.a.x",
            "$.a.\"b c\"[1].\"d.e\"",
            "$.k[0][#-1]",
            "$.\"\"",
        ] {
            assert!(check_json_path("path", good).is_ok(), "{good}");
            let r: rusqlite::Result<Option<String>> =
                conn.query_row("SELECT json_type(?1, ?2)", [doc, good], |r| r.get(0));
            assert!(r.is_ok(), "SQLite takes {good}: {r:?}");
        }
        for bad in [
            "",
            "customer",
            "$customer",
            "$.a[",
            "$.a[x]",
            "$.",
            "$..a",
            "$.\"open",
            "$.a]",
            "$[#]",
        ] {
            let err = check_json_path("path", bad).unwrap_err();
            assert!(err.is_bad_input(), "{bad:?}: {err}");
        }
    }

    #[test]
    fn long_errors_are_clipped_at_a_character_boundary() {
        assert_eq!(clip_error("short"), "short");
        let long = "é".repeat(10_000);
        let clipped = clip_error(&long);
        assert!(clipped.len() <= MAX_ERROR_BYTES);
        assert!(clipped.ends_with("more bytes cut)"), "{clipped}");
    }

    #[test]
    fn texts_refuse_empty_long_and_control() {
        assert!(check_text("actor", "Ada Lovelace <ada@example>", 256).is_ok());
        assert!(check_text("actor", "", 256).is_err());
        assert!(check_text("actor", "a\u{0}b", 256).is_err());
        assert!(check_text("actor", &"é".repeat(200), 256).is_err());
    }
}
