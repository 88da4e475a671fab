//! Statements on `reflexr_leases`.
//!
//! Every statement that acts under a lease says `holder = ? AND generation = ?`
//! and checks the expiry against the caller's clock, so a holder whose lease
//! lapsed or was taken over changes nothing.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::base::error::Result;

use crate::store::Leases;
use crate::store::leases::*;

fn from_row(r: &Row<'_>) -> rusqlite::Result<LeaseRow> {
    Ok(LeaseRow {
        name: r.get(0)?,
        holder: r.get(1)?,
        generation: r.get(2)?,
        acquired_at: r.get(3)?,
        renewed_at: r.get(4)?,
        expires_at: r.get(5)?,
    })
}

const RETURNING: &str = "RETURNING name, holder, generation, acquired_at, renewed_at, expires_at";

impl Leases for Connection {
    /// Takes the lease for `holder` until `now + ttl_ms` if it is free (never
    /// taken, released, or expired) or already `holder`'s. Taking an expired or
    /// released lease bumps the generation; extending one's own live lease keeps
    /// it. Returns `None` when someone else holds it.
    fn acquire(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<Option<LeaseRow>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "INSERT INTO reflexr_leases \
                   (name, holder, generation, acquired_at, renewed_at, expires_at) \
                 VALUES (?1, ?2, 1, ?3, ?3, ?3 + ?4) \
                 ON CONFLICT (name) DO UPDATE SET \
                   generation = CASE WHEN reflexr_leases.expires_at <= excluded.acquired_at \
                                THEN reflexr_leases.generation + 1 \
                                ELSE reflexr_leases.generation END, \
                   acquired_at = CASE WHEN reflexr_leases.expires_at <= excluded.acquired_at \
                                 THEN excluded.acquired_at \
                                 ELSE reflexr_leases.acquired_at END, \
                   holder = excluded.holder, \
                   renewed_at = excluded.renewed_at, \
                   expires_at = max(reflexr_leases.expires_at, excluded.expires_at) \
                 WHERE reflexr_leases.expires_at <= excluded.acquired_at \
                    OR reflexr_leases.holder = excluded.holder \
                 {RETURNING}"
            ))?
            .query_row(params![name, holder, now, ttl_ms], from_row)
            .optional()?)
    }

    /// Extends a live lease held by `holder` at `generation`. The expiry only
    /// moves forward. `None` when the lease is no longer theirs or has expired.
    fn renew(
        &self,
        name: &str,
        holder: &str,
        generation: i64,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<LeaseRow>> {
        let conn = self;
        Ok(conn
            .prepare_cached(&format!(
                "UPDATE reflexr_leases \
                 SET renewed_at = ?4, expires_at = max(expires_at, ?4 + ?5) \
                 WHERE name = ?1 AND holder = ?2 AND generation = ?3 AND expires_at > ?4 \
                 {RETURNING}"
            ))?
            .query_row(params![name, holder, generation, now, ttl_ms], from_row)
            .optional()?)
    }

    /// Gives a live lease up at once, so the next taker need not wait for it to
    /// lapse. The row stays, so the generation is never reused. False when it was
    /// not the caller's to give.
    fn release(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        let conn = self;
        let n = conn
            .prepare_cached(
                "UPDATE reflexr_leases SET expires_at = 0, renewed_at = ?4 \
                 WHERE name = ?1 AND holder = ?2 AND generation = ?3 AND expires_at > ?4",
            )?
            .execute(params![name, holder, generation, now])?;
        Ok(n == 1)
    }

    /// True when `holder` holds the lease at `generation` and it has not expired
    /// at `now`: the fencing check, run in the transaction of the fenced write.
    fn is_held(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT 1 FROM reflexr_leases \
                 WHERE name = ?1 AND holder = ?2 AND generation = ?3 AND expires_at > ?4",
            )?
            .query_row(params![name, holder, generation, now], |_| Ok(()))
            .optional()?
            .is_some())
    }

    fn get(&self, name: &str) -> Result<Option<LeaseRow>> {
        let conn = self;
        Ok(conn
            .prepare_cached(
                "SELECT name, holder, generation, acquired_at, renewed_at, expires_at \
                 FROM reflexr_leases WHERE name = ?1",
            )?
            .query_row([name], from_row)
            .optional()?)
    }

    fn list(&self) -> Result<Vec<LeaseRow>> {
        let conn = self;
        let mut stmt = conn.prepare_cached(
            "SELECT name, holder, generation, acquired_at, renewed_at, expires_at \
             FROM reflexr_leases ORDER BY name",
        )?;
        let rows = stmt
            .query_map([], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }
}
