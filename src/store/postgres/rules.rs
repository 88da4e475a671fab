//! Rules and their state per scope on PostgreSQL, as `store::rules` has
//! them on SQLite.

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Rules;
use crate::store::rules::RuleRow;

const COLUMNS: &str = "name, workspace, version, definition, registered_at, updated_at, \
                       shadow_of, promote_at, shadow_fired, shadow_errored";

fn rule_from(r: &Row) -> Result<RuleRow> {
    Ok(RuleRow {
        name: col(r, 0)?,
        workspace: col(r, 1)?,
        version: col(r, 2)?,
        definition: col(r, 3)?,
        registered_at: col(r, 4)?,
        updated_at: col(r, 5)?,
        shadow_of: col(r, 6)?,
        promote_at: col(r, 7)?,
        shadow_fired: col(r, 8)?,
        shadow_errored: col(r, 9)?,
    })
}

impl Rules for PgConn {
    fn rule(&self, name: &str) -> Result<Option<RuleRow>> {
        self.query_opt(
            &format!("SELECT {COLUMNS} FROM reflexr_rules WHERE name = $1"),
            &[(&name, Type::TEXT)],
        )?
        .as_ref()
        .map(rule_from)
        .transpose()
    }

    fn rule_rows(&self) -> Result<Vec<RuleRow>> {
        self.query(
            &format!("SELECT {COLUMNS} FROM reflexr_rules ORDER BY name"),
            &[],
        )?
        .iter()
        .map(rule_from)
        .collect()
    }

    fn upsert_rule(
        &self,
        name: &str,
        workspace: &str,
        version: i64,
        definition: &str,
        now: i64,
    ) -> Result<()> {
        self.query(
            "INSERT INTO reflexr_rules (name, workspace, version, definition, registered_at, \
               updated_at) VALUES ($1, $2, $3, $4, $5, $5) \
             ON CONFLICT (name) DO UPDATE SET workspace = excluded.workspace, \
               version = excluded.version, definition = excluded.definition, \
               updated_at = excluded.updated_at",
            &[
                (&name, Type::TEXT),
                (&workspace, Type::TEXT),
                (&version, Type::INT8),
                (&definition, Type::TEXT),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn states(&self, rule: &str, scopes: &[&str]) -> Result<Vec<(String, String)>> {
        self.query(
            "SELECT scope, state FROM reflexr_rule_state WHERE rule = $1 AND scope = ANY ($2)",
            &[(&rule, Type::TEXT), (&scopes, Type::TEXT_ARRAY)],
        )?
        .iter()
        .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
        .collect()
    }

    fn state(&self, rule: &str, scope: &str) -> Result<Option<String>> {
        self.query_opt(
            "SELECT state FROM reflexr_rule_state WHERE rule = $1 AND scope = $2",
            &[(&rule, Type::TEXT), (&scope, Type::TEXT)],
        )?
        .map(|r| col(&r, 0))
        .transpose()
    }

    fn save_states(&self, rule: &str, states: &[(&str, &str, i64)], now: i64) -> Result<()> {
        if states.is_empty() {
            return Ok(());
        }
        // One round trip for the batch: the columns travel as arrays.
        let scopes: Vec<&str> = states.iter().map(|s| s.0).collect();
        let values: Vec<&str> = states.iter().map(|s| s.1).collect();
        let seqs: Vec<i64> = states.iter().map(|s| s.2).collect();
        self.query(
            "INSERT INTO reflexr_rule_state (rule, scope, state, updated_seq, updated_at) \
             SELECT $1, t.scope, t.state, t.seq, $5 \
             FROM unnest($2::text[], $3::text[], $4::int8[]) AS t (scope, state, seq) \
             ON CONFLICT (rule, scope) DO UPDATE SET state = excluded.state, \
               updated_seq = excluded.updated_seq, updated_at = excluded.updated_at",
            &[
                (&rule, Type::TEXT),
                (&scopes, Type::TEXT_ARRAY),
                (&values, Type::TEXT_ARRAY),
                (&seqs, Type::INT8_ARRAY),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
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
        self.query(
            "INSERT INTO reflexr_rules (name, workspace, version, definition, registered_at, \
               updated_at, shadow_of) VALUES ($1, $2, $3, $4, $5, $5, $6) \
             ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, \
               updated_at = excluded.updated_at",
            &[
                (&name, Type::TEXT),
                (&workspace, Type::TEXT),
                (&version, Type::INT8),
                (&definition, Type::TEXT),
                (&now, Type::INT8),
                (&shadow_of, Type::TEXT),
            ],
        )?;
        Ok(())
    }

    fn set_promote_at(&self, name: &str, at: i64, now: i64) -> Result<()> {
        self.query(
            "UPDATE reflexr_rules SET promote_at = $2, updated_at = $3 WHERE name = $1",
            &[(&name, Type::TEXT), (&at, Type::INT8), (&now, Type::INT8)],
        )?;
        Ok(())
    }

    fn count_shadow(&self, name: &str, fired: i64, errored: i64) -> Result<()> {
        self.query(
            "UPDATE reflexr_rules SET shadow_fired = shadow_fired + $2, \
               shadow_errored = shadow_errored + $3 WHERE name = $1",
            &[
                (&name, Type::TEXT),
                (&fired, Type::INT8),
                (&errored, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn move_states(&self, from: &str, to: &str) -> Result<usize> {
        Ok(self
            .query(
                "UPDATE reflexr_rule_state SET rule = $2 WHERE rule = $1 RETURNING 1",
                &[(&from, Type::TEXT), (&to, Type::TEXT)],
            )?
            .len())
    }

    fn delete_rule(&self, name: &str) -> Result<bool> {
        Ok(self
            .query_opt(
                "DELETE FROM reflexr_rules WHERE name = $1 RETURNING 1",
                &[(&name, Type::TEXT)],
            )?
            .is_some())
    }

    fn clear_states(&self, rule: &str) -> Result<usize> {
        Ok(self
            .query(
                "DELETE FROM reflexr_rule_state WHERE rule = $1 RETURNING 1",
                &[(&rule, Type::TEXT)],
            )?
            .len())
    }
}
