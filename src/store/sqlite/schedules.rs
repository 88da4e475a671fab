//! Statements on `reflexr_schedules`.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

use crate::store::Schedules;
use crate::store::schedules::*;

const COLUMNS: &str = "name, spec, guarantee, missed, next_due_at, last_due_at, updated_at";

fn from_row(r: &Row<'_>) -> rusqlite::Result<ScheduleRow> {
    Ok(ScheduleRow {
        name: r.get(0)?,
        spec: r.get(1)?,
        guarantee: r.get(2)?,
        missed: r.get(3)?,
        next_due_at: r.get(4)?,
        last_due_at: r.get(5)?,
        updated_at: r.get(6)?,
    })
}

impl Schedules for Connection {
    fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM reflexr_schedules WHERE name = ?1"
            ))?
            .query_row([name], from_row)
            .optional()?)
    }

    fn schedule_rows(&self) -> Result<Vec<ScheduleRow>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_schedules ORDER BY name"
        ))?;
        let rows = stmt
            .query_map([], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Writes the schedule as registered; `next_due_at` as given.
    fn upsert_schedule(&self, row: &ScheduleRow) -> Result<()> {
        let conn = self;
        conn.prepare_cached(
            "INSERT INTO reflexr_schedules \
               (name, spec, guarantee, missed, next_due_at, last_due_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, \
               guarantee = excluded.guarantee, missed = excluded.missed, \
               next_due_at = excluded.next_due_at, updated_at = excluded.updated_at",
        )?
        .execute(params![
            row.name,
            row.spec,
            row.guarantee,
            row.missed,
            row.next_due_at,
            row.last_due_at,
            row.updated_at
        ])?;
        Ok(())
    }

    /// Moves a schedule on from the occurrence due at `expected_next` (only if
    /// nobody moved it first); false if it had moved.
    fn advance_schedule(
        &self,
        name: &str,
        expected_next: i64,
        next: Option<i64>,
        last: Option<i64>,
        now: i64,
    ) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "UPDATE reflexr_schedules SET next_due_at = ?3, \
                   last_due_at = coalesce(?4, last_due_at), updated_at = ?5 \
                 WHERE name = ?1 AND next_due_at = ?2",
            )?
            .execute(params![name, expected_next, next, last, now])?
            == 1)
    }
}
