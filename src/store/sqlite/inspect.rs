//! SQLite: what operators look for.

use rusqlite::Connection;

use crate::base::dead_letter::DeadLetter;
use crate::base::error::Result;
use crate::base::event::Event;
use crate::store::dead_letters;
use crate::store::inspect::*;
use crate::store::runs::{BlockedRow, RunRow};
use rusqlite::params;

/// Events in any workspace whose id is in `[?1, ?2)`, in seq order: a range
/// of the id index (whose keys begin with the id), named so the planner
/// does not walk a workspace's events instead.
pub(super) fn id_prefix_sql(limit: usize) -> String {
    use super::events::COLUMNS;
    format!(
        "SELECT {COLUMNS} FROM reflexr_events INDEXED BY reflexr_events_by_id \
         WHERE id >= ?1 AND id < ?2 ORDER BY seq LIMIT {limit}"
    )
}

impl Inspect for Connection {
    fn scan_events(
        &self,
        workspace: &str,
        after: i64,
        types: &[String],
        subject: Option<&str>,
        limit: usize,
        window: usize,
    ) -> Result<(Vec<Event>, Option<i64>)> {
        super::events::scan(self, workspace, after, types, subject, limit, window)
    }

    /// Events in any workspace whose id starts with `prefix` (a run's emitted
    /// events: `<run id>/<key>`), through one range of the id index.
    fn events_with_id_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<Event>> {
        use super::events::from_row;
        let conn = self;
        // Every id with the prefix sorts between the prefix and the prefix with
        // its last byte raised by one ('/' + 1 = '0').
        let mut upper = prefix.to_string();
        let last = upper.pop().map_or(0, |c| c as u32 + 1);
        upper.push(char::from_u32(last).unwrap_or(char::MAX));
        let mut stmt = conn.prepare_cached(&id_prefix_sql(limit))?;
        let events = stmt
            .query_map(params![prefix, upper], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(events)
    }

    /// One past the newest run's position.
    fn runs_end(&self) -> Result<i64> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT coalesce(max(ord), 0) + 1 FROM reflexr_runs")?
            .query_row([], |r| r.get(0))?)
    }

    fn find_runs(&self, f: &RunFind<'_>) -> Result<(Vec<RunRow>, Option<i64>)> {
        super::runs::find(
            self,
            &super::runs::Find {
                state: f.state,
                action: f.action,
                rule: f.rule,
                workspace: f.workspace,
                scope: f.scope,
                input: f.input.map(|(p, v)| (p, super::runs::sql_value(v))),
                before: f.before,
                limit: f.limit,
                window: f.window,
            },
        )
    }

    /// Runs changed after `(updated_at, ord)`, in that order: at most `limit`.
    fn runs_changed_after(&self, after: (i64, i64), limit: usize) -> Result<Vec<RunRow>> {
        use super::runs::from_row;
        use crate::store::runs::COLUMNS;
        let conn = self;
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM reflexr_runs INDEXED BY reflexr_runs_by_change \
             WHERE (updated_at, ord) > (?1, ?2) ORDER BY updated_at, ord LIMIT {limit}"
        ))?;
        let rows = stmt
            .query_map(params![after.0, after.1], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn blocked_lanes(&self, limit: usize) -> Result<Vec<BlockedRow>> {
        super::runs::blocked_lanes(self, limit)
    }

    /// One past the newest dead letter's id.
    fn dead_letters_end(&self) -> Result<i64> {
        let conn = self;
        Ok(conn
            .prepare_cached("SELECT coalesce(max(id), 0) + 1 FROM reflexr_dead_letters")?
            .query_row([], |r| r.get(0))?)
    }

    fn find_dead_letters(
        &self,
        f: &dead_letters::Find<'_>,
    ) -> Result<(Vec<DeadLetter>, Option<i64>)> {
        super::dead_letters::find(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::sqlite::plans::{plan, schema_file};

    /// The ids of a run's emitted events (`<run id>/<key>`) are one range
    /// of the id index, whatever the workspaces: a run's detail does not
    /// walk a workspace's events, so its cost does not grow with the log.
    #[test]
    fn a_run_s_emitted_events_are_one_range_of_the_id_index() {
        let (_dir, conn) = schema_file();
        let p = plan(&conn, &id_prefix_sql(100));
        assert!(p.contains("reflexr_events_by_id (id>? AND id<?)"), "{p}");
        assert!(!p.contains("reflexr_events_by_workspace"), "{p}");
    }
}
