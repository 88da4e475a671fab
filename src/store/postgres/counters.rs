//! PostgreSQL: counters: the sum of a counter's rows (the seam's `store::counters`).

use postgres::types::Type;

use super::{Begun, PgConn, col};
use crate::base::counter::Counter;
use crate::base::error::Result;
use crate::store::Counters;

/// One bump in this many folds its counter's rows into one.
const FOLD_EVERY: u32 = 256;

/// The advisory lock a fold holds ("rfxc" in ASCII), so folds never wait
/// for each other.
const FOLD_LOCK: i64 = 0x7266_7863;

impl Counters for PgConn {
    fn bump(&self, name: Counter, by: usize) -> Result<()> {
        self.bump_all(&[(name, by)])
    }

    fn bump_all(&self, bumps: &[(Counter, usize)]) -> Result<()> {
        let nonzero = bumps
            .iter()
            .filter(|(_, by)| *by > 0)
            .map(|&(name, by)| (name, i64::try_from(by).unwrap_or(i64::MAX)));
        if self.begun.get() == Begun::Yes {
            self.bumps.borrow_mut().extend(nonzero);
            return Ok(());
        }
        // Not inside the transaction yet (a deferred or owed connection
        // before its first statement, which this insert then is), or
        // outside any: sent now, in a statement of its own.
        let (names, values): (Vec<&str>, Vec<i64>) =
            nonzero.map(|(name, by)| (name.as_str(), by)).unzip();
        if names.is_empty() {
            return Ok(());
        }
        self.query(
            "INSERT INTO reflexr_counters (name, value) \
             SELECT * FROM unnest($1::text[], $2::int8[])",
            &[(&names, Type::TEXT_ARRAY), (&values, Type::INT8_ARRAY)],
        )?;
        for name in names {
            if fastrand::u32(..FOLD_EVERY) == 0 {
                self.query(
                    &fold_sql("$1", "$2"),
                    &[(&name, Type::TEXT), (&FOLD_LOCK, Type::INT8)],
                )?;
            }
        }
        Ok(())
    }

    fn all(&self) -> Result<Vec<(Counter, i64)>> {
        // This transaction's own bumps count too.
        if !self.bumps.borrow().is_empty() {
            self.send_owed()?;
        }
        let rows = self.query(
            "SELECT name, sum(value)::bigint FROM reflexr_counters GROUP BY name ORDER BY name",
            &[],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = col(r, 0)?;
            // Another version's counters are left out.
            if let Ok(counter) = name.parse() {
                out.push((counter, col(r, 1)?));
            }
        }
        Ok(out)
    }
}

impl PgConn {
    /// The counters' bumps this transaction owes, as statements for its
    /// commit's round trip (see `PgConn::finish`), no longer owed: one
    /// insert of all their rows, and now and then a counter's fold (one
    /// bump in [`FOLD_EVERY`] folds its counter's rows into one). A bump in
    /// a transaction costs no round trip of its own: on the way from an
    /// append to its handler, a rule's firing bumps its counters, and each
    /// run's settlement its own. The counters' names are the engine's own
    /// words ([`Counter`]) and the values numbers, written into the SQL as
    /// they are.
    pub(super) fn take_bumps_into(&self, sql: &mut String) {
        self.take_bumps_folding(sql, &mut || fastrand::u32(..FOLD_EVERY) == 0);
    }

    /// [`PgConn::take_bumps_into`], `fold` saying for each bump whether its
    /// counter is folded.
    fn take_bumps_folding(&self, sql: &mut String, fold: &mut dyn FnMut() -> bool) {
        let bumps = std::mem::take(&mut *self.bumps.borrow_mut());
        if bumps.is_empty() {
            return;
        }
        sql.push_str("INSERT INTO reflexr_counters (name, value) VALUES ");
        for (i, (name, by)) in bumps.iter().enumerate() {
            debug_assert!(super::is_plain(name.as_str()));
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("('{}', {by})", name.as_str()));
        }
        sql.push_str("; ");
        for (name, _) in &bumps {
            if fold() {
                sql.push_str(&fold_sql(
                    &format!("'{}'", name.as_str()),
                    &FOLD_LOCK.to_string(),
                ));
                sql.push_str("; ");
            }
        }
    }
}

/// Folds a counter's rows into one, if no other transaction is folding
/// one (a try-lock: a bump never waits), `name` and `lock` as SQL (a
/// parameter, or a literal). The rows deleted are those committed when the
/// statement began, and the transaction's own; bumps made meanwhile stay
/// beside the sum, so nothing is counted twice or lost.
fn fold_sql(name: &str, lock: &str) -> String {
    format!(
        "WITH mine AS (SELECT pg_try_advisory_xact_lock({lock}) AS locked), \
              gone AS (DELETE FROM reflexr_counters \
                       WHERE name = {name} AND (SELECT locked FROM mine) RETURNING value) \
         INSERT INTO reflexr_counters (name, value) \
         SELECT {name}, sum(value)::bigint FROM gone HAVING count(*) > 0"
    )
}

#[cfg(test)]
mod tests {
    use super::PgConn;
    use crate::base::counter::Counter::{Decisions, Fired};
    use crate::store::Counters;
    use crate::store::conformance::PgSchema;

    /// The totals beside invariant 4 survive a fold written into the SQL
    /// that carries the bumps owed (the counter's names and the advisory
    /// lock as literals, as a commit's round trip sends them): every bump
    /// is counted once, and a folded counter is one row.
    #[test]
    fn a_fold_written_with_the_bumps_owed_keeps_every_bump_in_one_row() {
        let schema = PgSchema::new();
        let pool = schema.pool(1);
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        Counters::bump(&conn, Fired, 2).unwrap();
        conn.commit().unwrap();
        let conn = PgConn::begin_as(pool.get().unwrap(), false).unwrap();
        Counters::bump_all(&conn, &[(Fired, 3), (Decisions, 4)]).unwrap();
        let mut sql = String::new();
        conn.take_bumps_folding(&mut sql, &mut || true);
        assert!(conn.bumps.borrow().is_empty());
        conn.control(&sql).unwrap();
        conn.commit().unwrap();
        let conn = PgConn::begin_as(pool.get().unwrap(), true).unwrap();
        let rows: Vec<(String, i64)> = conn
            .query_untyped(
                "SELECT name, value FROM reflexr_counters ORDER BY name",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            rows,
            [("decisions".to_string(), 4), ("fired".to_string(), 5)]
        );
    }
}
