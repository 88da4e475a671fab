//! The engine's transaction, guarded on PostgreSQL: what SQLite's
//! authorizer does (`store::conn::Guard`), done by reading the first words
//! of the application's statements before they are sent — it may not end or
//! replace the engine's transaction, touch the engine's savepoints, or
//! change the pooled connection's session.

use crate::base::error::{Error, Result};

/// Refuses a statement that would end or replace the engine's transaction,
/// touch its savepoints, or change the pooled connection's session for the
/// writes after it (see `Tx<'_, Postgres>`): judged by its first words,
/// after spaces, comments (nested ones too) and empty statements.
pub(crate) fn refuse_transaction_control(sql: &str) -> Result<()> {
    let words: Vec<String> = sql_words(sql, 5);
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    // The engine's own savepoints (each caller's, in a shared transaction).
    let engines_savepoint = matches!(w(0), "SAVEPOINT" | "RELEASE" | "ROLLBACK")
        && words.iter().any(|w| w.starts_with("REFLEXR_"));
    let refused = engines_savepoint
        || match w(0) {
            "BEGIN" | "COMMIT" | "END" | "ABORT" => true,
            "START" => w(1) == "TRANSACTION",
            // A session setting outlives the write on a pooled connection:
            // `SET LOCAL` (and `SET CONSTRAINTS`) end with the transaction.
            "SET" => !matches!(w(1), "LOCAL" | "CONSTRAINTS"),
            "ROLLBACK" => {
                !(w(1) == "TO" || (w(1) == "WORK" || w(1) == "TRANSACTION") && w(2) == "TO")
            }
            "PREPARE" => w(1) == "TRANSACTION",
            // The engine's statements, prepared on the connection.
            "DEALLOCATE" | "DISCARD" => true,
            _ => false,
        };
    if refused {
        return Err(Error::StatementRefused {
            detail: "a write closure may not end or replace the engine's transaction \
                     (BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK, ABORT, PREPARE \
                     TRANSACTION, SET TRANSACTION, the engine's reflexr_* savepoints), nor \
                     change the pooled connection's session (SET without LOCAL, DEALLOCATE, \
                     DISCARD: the engine's statements are prepared on it); savepoints \
                     of your own and SET LOCAL are fine"
                .into(),
        });
    }
    Ok(())
}

/// The first `n` words of `sql`, upper-cased, skipping spaces, comments
/// (`--`, and `/* */` nested as PostgreSQL nests them) and the `;` of empty
/// statements; a quoted identifier is a word (its quotes dropped). Stops at
/// anything else.
fn sql_words(sql: &str, n: usize) -> Vec<String> {
    let mut words = Vec::new();
    let mut rest = sql;
    while words.len() < n {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.find('\n').map_or("", |i| &r[i + 1..]);
        } else if rest.starts_with("/*") {
            rest = after_comment(rest);
        } else if let Some(r) = rest.strip_prefix(';') {
            rest = r;
        } else if let Some(r) = rest.strip_prefix('"') {
            let end = r.find('"').unwrap_or(r.len());
            words.push(r[..end].to_ascii_uppercase());
            rest = r.get(end + 1..).unwrap_or("");
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if end == 0 {
                break;
            }
            words.push(rest[..end].to_ascii_uppercase());
            rest = &rest[end..];
        }
    }
    words
}

/// What follows the `/* … */` comment `text` starts with, nested comments
/// included ("" if it never closes).
fn after_comment(text: &str) -> &str {
    let (mut depth, mut i) = (0usize, 0usize);
    let b = text.as_bytes();
    while i + 1 < b.len() {
        match (b[i], b[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return &text[i..];
                }
            }
            _ => i += 1,
        }
    }
    ""
}

#[cfg(test)]
mod tests {
    use super::refuse_transaction_control as judge;

    /// Invariant 2: the application cannot end the engine's transaction,
    /// however it writes the statement.
    #[test]
    fn transaction_control_is_refused_however_it_is_written() {
        for sql in [
            "COMMIT",
            ";COMMIT",
            " ; ; commit",
            "/* a /* nested */ comment */ COMMIT",
            "-- a line\nEND",
            "RELEASE SAVEPOINT \"reflexr_call\"",
            "ROLLBACK TO \"reflexr_call\"",
            "rollback",
            "START TRANSACTION",
            "SET search_path TO app",
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
            "set transaction isolation level serializable",
            "DEALLOCATE ALL",
            "deallocate prepare s1",
            "DISCARD PLANS",
        ] {
            assert!(judge(sql).is_err(), "{sql:?} passed");
        }
        for sql in [
            "INSERT INTO t VALUES ($1)",
            "SAVEPOINT mine",
            "ROLLBACK TO SAVEPOINT mine",
            "RELEASE SAVEPOINT mine",
            "SET LOCAL statement_timeout = '1s'",
            "SET CONSTRAINTS ALL DEFERRED",
            "(SELECT 1)",
            "/* COMMIT */ SELECT 1",
        ] {
            assert!(judge(sql).is_ok(), "{sql:?} refused");
        }
    }
}
