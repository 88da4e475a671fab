//! Statements on `reflexr_rules` and `reflexr_rule_state`.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

use crate::store::Rules;
use crate::store::rules::*;

const COLUMNS: &str = "name, workspace, version, definition, registered_at, updated_at, \
                       shadow_of, promote_at, shadow_fired, shadow_errored";

fn from_row(r: &Row<'_>) -> rusqlite::Result<RuleRow> {
    Ok(RuleRow {
        name: r.get(0)?,
        workspace: r.get(1)?,
        version: r.get(2)?,
        definition: r.get(3)?,
        registered_at: r.get(4)?,
        updated_at: r.get(5)?,
        shadow_of: r.get(6)?,
        promote_at: r.get(7)?,
        shadow_fired: r.get(8)?,
        shadow_errored: r.get(9)?,
    })
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

impl Rules for Connection {
    fn rule(&self, name: &str) -> Result<Option<RuleRow>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM reflexr_rules WHERE name = ?1"
            ))?
            .query_row([name], from_row)
            .optional()?)
    }

    fn rule_rows(&self) -> Result<Vec<RuleRow>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_rules ORDER BY name"
        ))?;
        let rows = stmt
            .query_map([], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn upsert_rule(
        &self,
        name: &str,
        workspace: &str,
        version: i64,
        definition: &str,
        now: i64,
    ) -> Result<()> {
        upsert(self, name, workspace, version, definition, now)
    }

    fn upsert_shadow(
        &self,
        name: &str,
        workspace: &str,
        version: i64,
        definition: &str,
        shadow_of: &str,
        now: i64,
    ) -> Result<()> {
        self.prepare_cached(
            "INSERT INTO reflexr_rules (name, workspace, version, definition, registered_at, \
               updated_at, shadow_of) VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6) \
             ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, \
               updated_at = excluded.updated_at",
        )?
        .execute(params![
            name, workspace, version, definition, now, shadow_of
        ])?;
        Ok(())
    }

    fn set_promote_at(&self, name: &str, at: i64, now: i64) -> Result<()> {
        self.prepare_cached(
            "UPDATE reflexr_rules SET promote_at = ?2, updated_at = ?3 WHERE name = ?1",
        )?
        .execute(params![name, at, now])?;
        Ok(())
    }

    fn count_shadow(&self, name: &str, fired: i64, errored: i64) -> Result<()> {
        self.prepare_cached(
            "UPDATE reflexr_rules SET shadow_fired = shadow_fired + ?2, \
               shadow_errored = shadow_errored + ?3 WHERE name = ?1",
        )?
        .execute(params![name, fired, errored])?;
        Ok(())
    }

    fn move_states(&self, from: &str, to: &str) -> Result<usize> {
        Ok(self
            .prepare_cached("UPDATE reflexr_rule_state SET rule = ?2 WHERE rule = ?1")?
            .execute(params![from, to])?)
    }

    /// The stored states of `scopes` (those that have one).
    fn states(&self, rule: &str, scopes: &[&str]) -> Result<Vec<(String, String)>> {
        let conn = self;
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

    fn state(&self, rule: &str, scope: &str) -> Result<Option<String>> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT state FROM reflexr_rule_state WHERE rule = ?1 AND scope = ?2")?
            .query_row([rule, scope], |r| r.get(0))
            .optional()?)
    }

    fn save_states(&self, rule: &str, states: &[(&str, &str, i64)], now: i64) -> Result<()> {
        // A statement a scope: one statement taking the batch as a JSON
        // array cost SQLite more instructions than the calls it saved
        // (there is no round trip to save here). An update first, as a
        // scope's state is mostly there already: an upsert that meets its
        // row checks the new state's JSON twice (the insert's CHECK, then
        // the update's) and builds the insert's record for nothing.
        let mut update = self.prepare_cached(
            "UPDATE reflexr_rule_state SET state = ?3, updated_seq = ?4, updated_at = ?5 \
             WHERE rule = ?1 AND scope = ?2",
        )?;
        let mut insert = self.prepare_cached(
            "INSERT INTO reflexr_rule_state (rule, scope, state, updated_seq, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for (scope, state, seq) in states {
            let p = params![rule, scope, state, seq, now];
            if update.execute(p)? == 0 {
                insert.execute(p)?;
            }
        }
        Ok(())
    }

    /// Forgets every scope's state; returns how many there were.
    fn clear_states(&self, rule: &str) -> Result<usize> {
        let conn = self;
        Ok(conn
            .prepare_cached("DELETE FROM reflexr_rule_state WHERE rule = ?1")?
            .execute([rule])?)
    }

    fn delete_rule(&self, name: &str) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached("DELETE FROM reflexr_rules WHERE name = ?1")?
            .execute([name])?
            == 1)
    }
}
