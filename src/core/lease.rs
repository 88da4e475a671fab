//! Leases: one holder at a time on a piece of work, fenced by a generation.
//!
//! A lease is `(name, holder, generation, expires_at)`. Taking a lease that
//! has expired (or was released) bumps its generation, the fencing token: a
//! write made under a lease checks holder and generation in its own
//! transaction ([`crate::Tx::fence`]), so a holder that lost its lease —
//! paused past the expiry while another process took over — commits nothing
//! (DESIGN.md, invariant 7).
//!
//! Timing follows ADR-0015: 30 seconds by default, renewed every third of
//! that ([`Lease::renew_due_at`]). Expiry is judged by the engine's
//! [`crate::Clock`]; an expiry only moves forward, except by an explicit
//! release.

use std::time::Duration;

use crate::base::error::{Error, Result};
use crate::base::limits::{self, MAX_ID_BYTES};
use crate::store::Leases;
use crate::store::leases::LeaseRow;

/// How long a lease lasts unless renewed, by default (ADR-0015).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// A lease the caller holds (or held: check with [`crate::Engine::renew_lease`]
/// or fence a write with it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Lease {
    /// The lease's name (e.g. `evaluator/shop`).
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// The fencing token: bumped on every takeover, never reused.
    pub generation: i64,
    /// When this holder took it (ms since the epoch).
    pub acquired_at: i64,
    /// When it was last renewed.
    pub renewed_at: i64,
    /// When it lapses unless renewed.
    pub expires_at: i64,
    /// How long each renewal extends it, in ms.
    pub ttl_ms: i64,
}

impl Lease {
    fn from_row(row: LeaseRow, ttl_ms: i64) -> Lease {
        Lease {
            name: row.name,
            holder: row.holder,
            generation: row.generation,
            acquired_at: row.acquired_at,
            renewed_at: row.renewed_at,
            expires_at: row.expires_at,
            ttl_ms,
        }
    }

    /// When the holder should renew: a third of the TTL after the last
    /// renewal, so two renewals can fail before the lease lapses.
    pub fn renew_due_at(&self) -> i64 {
        self.renewed_at + self.ttl_ms / 3
    }

    /// True while the lease has not expired at `now_ms`. Being live by the
    /// holder's own record is not proof of holding it; only a fenced write
    /// checks that.
    pub fn is_live_at(&self, now_ms: i64) -> bool {
        now_ms < self.expires_at
    }
}

/// A lease as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The lease's name.
    pub name: String,
    /// Its last holder.
    pub holder: String,
    /// Its generation.
    pub generation: i64,
    /// When the last holder took it.
    pub acquired_at: i64,
    /// When it was last renewed (or released).
    pub renewed_at: i64,
    /// When it lapses; 0 once released.
    pub expires_at: i64,
}

impl From<LeaseRow> for LeaseInfo {
    fn from(r: LeaseRow) -> LeaseInfo {
        LeaseInfo {
            name: r.name,
            holder: r.holder,
            generation: r.generation,
            acquired_at: r.acquired_at,
            renewed_at: r.renewed_at,
            expires_at: r.expires_at,
        }
    }
}

pub(crate) fn ttl_ms(ttl: Duration) -> Result<i64> {
    let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    if ms < 3 {
        return Err(Error::invalid(
            "lease ttl",
            "must be at least 3 ms (it is renewed every third)",
        ));
    }
    if ms > 366 * 24 * 3_600_000 {
        return Err(Error::invalid("lease ttl", "must be at most a year"));
    }
    Ok(ms)
}

fn check(name: &str, holder: &str) -> Result<()> {
    limits::check_name("lease", name)?;
    limits::check_text("holder", holder, MAX_ID_BYTES)
}

pub(crate) fn acquire<C: Leases + ?Sized>(
    conn: &C,
    now: i64,
    name: &str,
    holder: &str,
    ttl: Duration,
) -> Result<Lease> {
    check(name, holder)?;
    let ttl = ttl_ms(ttl)?;
    match Leases::acquire(conn, name, holder, now, ttl)? {
        Some(row) => Ok(Lease::from_row(row, ttl)),
        None => {
            let row = Leases::get(conn, name)?.expect("a conflicting lease row exists");
            Err(Error::LeaseHeld {
                name: row.name,
                holder: row.holder,
                expires_at: row.expires_at,
            })
        }
    }
}

pub(crate) fn renew<C: Leases + ?Sized>(conn: &C, now: i64, lease: &Lease) -> Result<Lease> {
    check(&lease.name, &lease.holder)?;
    match Leases::renew(
        conn,
        &lease.name,
        &lease.holder,
        lease.generation,
        now,
        lease.ttl_ms,
    )? {
        Some(row) => Ok(Lease::from_row(row, lease.ttl_ms)),
        None => Err(lost(lease)),
    }
}

pub(crate) fn release<C: Leases + ?Sized>(conn: &C, now: i64, lease: &Lease) -> Result<bool> {
    check(&lease.name, &lease.holder)?;
    Leases::release(conn, &lease.name, &lease.holder, lease.generation, now)
}

/// The fencing check, in the caller's transaction.
pub(crate) fn fence<C: Leases + ?Sized>(conn: &C, now: i64, lease: &Lease) -> Result<()> {
    if Leases::is_held(conn, &lease.name, &lease.holder, lease.generation, now)? {
        Ok(())
    } else {
        Err(lost(lease))
    }
}

/// Every lease, by name.
pub(crate) fn list<C: Leases + ?Sized>(conn: &C) -> Result<Vec<LeaseInfo>> {
    Ok(Leases::list(conn)?.into_iter().map(Into::into).collect())
}

/// What a write fenced by `lease` says when the lease is no longer held.
pub(crate) fn lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        name: lease.name.clone(),
        holder: lease.holder.clone(),
        generation: lease.generation,
    }
}
