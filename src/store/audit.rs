//! `reflexr_audit`: what operators did.
//!
//! The table group every backend implements (`store::sqlite::audit`,
//! `store::postgres::audit`), and the rows it speaks in.

use crate::base::audit::AuditAction;
use crate::base::error::Result;

/// One operator action to record.
pub struct Entry<'a> {
    pub at: i64,
    pub operator: &'a str,
    pub action: AuditAction,
    pub target: &'a str,
    pub reason: &'a str,
    /// JSON text.
    pub detail: &'a str,
}

/// `reflexr_audit`, the record of what operators did.
pub trait Audit {
    fn record(&self, entry: &Entry<'_>) -> Result<()>;
    /// The most recent `limit` entries, newest first.
    fn recent(&self, limit: i64) -> Result<Vec<crate::base::audit::AuditEntry>>;
}
