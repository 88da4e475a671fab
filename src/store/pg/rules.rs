//! Rules and their state per scope, and scheduled jobs, on PostgreSQL, as
//! `store::rules` and `store::schedules` have them on SQLite.

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::error::Result;
use crate::store::backend::{Rules, Schedules};
use crate::store::rules::RuleRow;
use crate::store::schedules::ScheduleRow;

const COLUMNS: &str = "name, workspace, version, definition, registered_at, updated_at";

fn rule_from(r: &Row) -> Result<RuleRow> {
    Ok(RuleRow {
        name: col(r, 0)?,
        workspace: col(r, 1)?,
        version: col(r, 2)?,
        definition: col(r, 3)?,
        registered_at: col(r, 4)?,
        updated_at: col(r, 5)?,
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

    fn save_state(&self, rule: &str, scope: &str, state: &str, seq: i64, now: i64) -> Result<()> {
        self.query(
            "INSERT INTO reflexr_rule_state (rule, scope, state, updated_seq, updated_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (rule, scope) DO UPDATE SET state = excluded.state, \
               updated_seq = excluded.updated_seq, updated_at = excluded.updated_at",
            &[
                (&rule, Type::TEXT),
                (&scope, Type::TEXT),
                (&state, Type::TEXT),
                (&seq, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(())
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

const SCHEDULE_COLUMNS: &str =
    "name, spec, guarantee, missed, next_due_at, last_due_at, updated_at";

fn schedule_from(r: &Row) -> Result<ScheduleRow> {
    Ok(ScheduleRow {
        name: col(r, 0)?,
        spec: col(r, 1)?,
        guarantee: col(r, 2)?,
        missed: col(r, 3)?,
        next_due_at: col(r, 4)?,
        last_due_at: col(r, 5)?,
        updated_at: col(r, 6)?,
    })
}

impl Schedules for PgConn {
    fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>> {
        self.query_opt(
            &format!("SELECT {SCHEDULE_COLUMNS} FROM reflexr_schedules WHERE name = $1"),
            &[(&name, Type::TEXT)],
        )?
        .as_ref()
        .map(schedule_from)
        .transpose()
    }

    fn schedule_rows(&self) -> Result<Vec<ScheduleRow>> {
        self.query(
            &format!("SELECT {SCHEDULE_COLUMNS} FROM reflexr_schedules ORDER BY name"),
            &[],
        )?
        .iter()
        .map(schedule_from)
        .collect()
    }

    fn upsert_schedule(&self, row: &ScheduleRow) -> Result<()> {
        self.query(
            "INSERT INTO reflexr_schedules \
               (name, spec, guarantee, missed, next_due_at, last_due_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, \
               guarantee = excluded.guarantee, missed = excluded.missed, \
               next_due_at = excluded.next_due_at, updated_at = excluded.updated_at",
            &[
                (&row.name, Type::TEXT),
                (&row.spec, Type::TEXT),
                (&row.guarantee, Type::TEXT),
                (&row.missed, Type::TEXT),
                (&row.next_due_at, Type::INT8),
                (&row.last_due_at, Type::INT8),
                (&row.updated_at, Type::INT8),
            ],
        )?;
        Ok(())
    }

    fn advance_schedule(
        &self,
        name: &str,
        expected_next: i64,
        next: Option<i64>,
        last: Option<i64>,
        now: i64,
    ) -> Result<bool> {
        Ok(self
            .query_opt(
                "UPDATE reflexr_schedules SET next_due_at = $3, \
                   last_due_at = coalesce($4, last_due_at), updated_at = $5 \
                 WHERE name = $1 AND next_due_at = $2 RETURNING 1",
                &[
                    (&name, Type::TEXT),
                    (&expected_next, Type::INT8),
                    (&next, Type::INT8),
                    (&last, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }
}
