//! Statements on `reflexr_rules` and `reflexr_rule_state`.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

/// A rule's row.
pub struct RuleRow {
    pub name: String,
    pub workspace: String,
    pub version: i64,
    pub definition: String,
    pub registered_at: i64,
    pub updated_at: i64,
}

const COLUMNS: &str = "name, workspace, version, definition, registered_at, updated_at";

fn from_row(r: &Row<'_>) -> rusqlite::Result<RuleRow> {
    Ok(RuleRow {
        name: r.get(0)?,
        workspace: r.get(1)?,
        version: r.get(2)?,
        definition: r.get(3)?,
        registered_at: r.get(4)?,
        updated_at: r.get(5)?,
    })
}

pub(crate) fn get(conn: &Connection, name: &str) -> Result<Option<RuleRow>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_rules WHERE name = ?1"
        ))?
        .query_row([name], from_row)
        .optional()?)
}

pub(crate) fn list(conn: &Connection) -> Result<Vec<RuleRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM reflexr_rules ORDER BY name"
    ))?;
    let rows = stmt
        .query_map([], from_row)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

pub(crate) fn upsert(
    conn: &Connection,
    name: &str,
    workspace: &str,
    version: i64,
    definition: &str,
    now: i64,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO reflexr_rules (name, workspace, version, definition, registered_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?5) \
         ON CONFLICT (name) DO UPDATE SET workspace = excluded.workspace, \
           version = excluded.version, definition = excluded.definition, \
           updated_at = excluded.updated_at",
    )?
    .execute(params![name, workspace, version, definition, now])?;
    Ok(())
}

pub(crate) fn delete(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("DELETE FROM reflexr_rules WHERE name = ?1")?
        .execute([name])?
        == 1)
}

/// The stored states of `scopes` (those that have one).
pub(crate) fn states(
    conn: &Connection,
    rule: &str,
    scopes: &[&str],
) -> Result<Vec<(String, String)>> {
    let scopes = serde_json::to_string(scopes).expect("strings encode");
    let mut stmt = conn.prepare_cached(
        "SELECT scope, state FROM reflexr_rule_state \
         WHERE rule = ?1 AND scope IN (SELECT value FROM json_each(?2))",
    )?;
    let rows = stmt
        .query_map(params![rule, scopes], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

pub(crate) fn state(conn: &Connection, rule: &str, scope: &str) -> Result<Option<String>> {
    Ok(conn
        .prepare_cached("SELECT state FROM reflexr_rule_state WHERE rule = ?1 AND scope = ?2")?
        .query_row([rule, scope], |r| r.get(0))
        .optional()?)
}

pub(crate) fn save_state(
    conn: &Connection,
    rule: &str,
    scope: &str,
    state: &str,
    seq: i64,
    now: i64,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO reflexr_rule_state (rule, scope, state, updated_seq, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (rule, scope) DO UPDATE SET state = excluded.state, \
           updated_seq = excluded.updated_seq, updated_at = excluded.updated_at",
    )?
    .execute(params![rule, scope, state, seq, now])?;
    Ok(())
}

/// Forgets every scope's state; returns how many there were.
pub(crate) fn clear_states(conn: &Connection, rule: &str) -> Result<usize> {
    Ok(conn
        .prepare_cached("DELETE FROM reflexr_rule_state WHERE rule = ?1")?
        .execute([rule])?)
}
