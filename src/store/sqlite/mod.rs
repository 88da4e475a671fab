//! SQLite's statements, one file per table group of the seam, each
//! implementing its group on [`rusqlite::Connection`] in place; its
//! connections (`conn`: pragmas set and read back, the writer's guard) and
//! its schema (`schema`: `schema.sql` and its migrations).

pub(crate) mod audit;
pub(crate) mod conn;
pub(crate) mod control;
pub(crate) mod counters;
pub(crate) mod cursors;
pub(crate) mod dead_letters;
pub(crate) mod events;
pub(crate) mod followers;
pub(crate) mod inspect;
pub(crate) mod leases;
pub(crate) mod rules;
pub(crate) mod runs;
pub(crate) mod schedules;
pub(crate) mod schema;
pub(crate) mod steps;
pub(crate) mod workspaces;

/// Helpers of the statements' plan tests.
#[cfg(test)]
pub(crate) mod plans {
    use rusqlite::Connection;

    /// A new file with the schema, and its directory (kept while it is used).
    pub(crate) fn schema_file() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("p.db")).unwrap();
        conn.execute_batch(super::schema::SCHEMA_SQL).unwrap();
        super::events::add_functions(&conn).unwrap();
        (dir, conn)
    }

    /// `sql`'s query plan, a line a step, its parameters bound to NULL.
    pub(crate) fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        let rows: Vec<String> = stmt
            .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        rows.join("\n")
    }
}
