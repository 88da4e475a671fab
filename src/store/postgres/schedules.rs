//! Scheduled jobs on PostgreSQL, as `store::schedules` has them on SQLite.

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Schedules;
use crate::store::schedules::ScheduleRow;

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
