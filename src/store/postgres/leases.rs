//! PostgreSQL: leases (the seam's `store::leases`).

use postgres::Row;
use postgres::types::Type;

use super::{PgConn, col};
use crate::base::error::Result;
use crate::store::Leases;
use crate::store::leases::LeaseRow;

pub(super) const LEASE_COLUMNS: &str =
    "name, holder, generation, acquired_at, renewed_at, expires_at";

pub(super) fn lease_from(r: &Row) -> Result<LeaseRow> {
    Ok(LeaseRow {
        name: col(r, 0)?,
        holder: col(r, 1)?,
        generation: col(r, 2)?,
        acquired_at: col(r, 3)?,
        renewed_at: col(r, 4)?,
        expires_at: col(r, 5)?,
    })
}

impl Leases for PgConn {
    fn acquire(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<Option<LeaseRow>> {
        // The same statement as SQLite's (see store::leases::acquire).
        self.query_opt(
            &format!(
                "INSERT INTO reflexr_leases \
                   (name, holder, generation, acquired_at, renewed_at, expires_at) \
                 VALUES ($1, $2, 1, $3, $3, $3 + $4) \
                 ON CONFLICT (name) DO UPDATE SET \
                   generation = CASE WHEN reflexr_leases.expires_at <= excluded.acquired_at \
                                THEN reflexr_leases.generation + 1 \
                                ELSE reflexr_leases.generation END, \
                   acquired_at = CASE WHEN reflexr_leases.expires_at <= excluded.acquired_at \
                                 THEN excluded.acquired_at \
                                 ELSE reflexr_leases.acquired_at END, \
                   holder = excluded.holder, \
                   renewed_at = excluded.renewed_at, \
                   expires_at = greatest(reflexr_leases.expires_at, excluded.expires_at) \
                 WHERE reflexr_leases.expires_at <= excluded.acquired_at \
                    OR reflexr_leases.holder = excluded.holder \
                 RETURNING {LEASE_COLUMNS}"
            ),
            &[
                (&name, Type::TEXT),
                (&holder, Type::TEXT),
                (&now, Type::INT8),
                (&ttl_ms, Type::INT8),
            ],
        )?
        .as_ref()
        .map(lease_from)
        .transpose()
    }

    fn renew(
        &self,
        name: &str,
        holder: &str,
        generation: i64,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<LeaseRow>> {
        self.query_opt(
            &format!(
                "UPDATE reflexr_leases \
                 SET renewed_at = $4, expires_at = greatest(expires_at, $4 + $5) \
                 WHERE name = $1 AND holder = $2 AND generation = $3 AND expires_at > $4 \
                 RETURNING {LEASE_COLUMNS}"
            ),
            &[
                (&name, Type::TEXT),
                (&holder, Type::TEXT),
                (&generation, Type::INT8),
                (&now, Type::INT8),
                (&ttl_ms, Type::INT8),
            ],
        )?
        .as_ref()
        .map(lease_from)
        .transpose()
    }

    fn release(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        let released = self.query_opt(
            "UPDATE reflexr_leases SET expires_at = 0, renewed_at = $4 \
             WHERE name = $1 AND holder = $2 AND generation = $3 AND expires_at > $4 \
             RETURNING 1",
            &[
                (&name, Type::TEXT),
                (&holder, Type::TEXT),
                (&generation, Type::INT8),
                (&now, Type::INT8),
            ],
        )?;
        Ok(released.is_some())
    }

    fn is_held(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        Ok(self
            .query_opt(
                // FOR SHARE: a takeover (which updates the row) waits for
                // this write to end, so the fenced write and the new
                // holder's first read never overlap.
                "SELECT 1 FROM reflexr_leases \
                 WHERE name = $1 AND holder = $2 AND generation = $3 AND expires_at > $4 \
                 FOR SHARE",
                &[
                    (&name, Type::TEXT),
                    (&holder, Type::TEXT),
                    (&generation, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
            .is_some())
    }

    fn get(&self, name: &str) -> Result<Option<LeaseRow>> {
        self.query_opt(
            &format!("SELECT {LEASE_COLUMNS} FROM reflexr_leases WHERE name = $1"),
            &[(&name, Type::TEXT)],
        )?
        .as_ref()
        .map(lease_from)
        .transpose()
    }

    fn list(&self) -> Result<Vec<LeaseRow>> {
        self.query(
            &format!("SELECT {LEASE_COLUMNS} FROM reflexr_leases ORDER BY name"),
            &[],
        )?
        .iter()
        .map(lease_from)
        .collect()
    }
}
