//! `reflexr_leases`: who holds what, with generations.
//!
//! The table group every backend implements (`store::sqlite::leases`,
//! `store::postgres::leases`), and the rows it speaks in.

use crate::base::error::Result;

/// A lease row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub name: String,
    pub holder: String,
    pub generation: i64,
    pub acquired_at: i64,
    pub renewed_at: i64,
    pub expires_at: i64,
}

/// `reflexr_leases`. Every statement that acts under a lease checks holder,
/// generation and expiry (by the caller's clock) in the statement itself.
pub trait Leases {
    /// Takes the lease if it is free or already `holder`'s (see
    /// `store::leases::acquire`); `None` when someone else holds it.
    fn acquire(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<Option<LeaseRow>>;
    /// Extends a live lease held at `generation`; `None` when it is not.
    fn renew(
        &self,
        name: &str,
        holder: &str,
        generation: i64,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<LeaseRow>>;
    /// Gives a live lease up at once; false when it was not the caller's.
    fn release(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool>;
    /// The fencing check, in the transaction of the fenced write.
    fn is_held(&self, name: &str, holder: &str, generation: i64, now: i64) -> Result<bool>;
    fn get(&self, name: &str) -> Result<Option<LeaseRow>>;
    fn list(&self) -> Result<Vec<LeaseRow>>;
}
