//! What operators did: [`AuditEntry`], read back from `reflexr_audit`.

/// A recorded action, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditEntry {
    /// When, in ms since the epoch.
    pub at: i64,
    /// Who (as they named themselves).
    pub operator: String,
    /// What: `reset_cursor`, …
    pub action: String,
    /// On what, e.g. `cursor app/billing@shop`.
    pub target: String,
    /// Why, as the operator said.
    pub reason: String,
    /// The particulars, as JSON text (e.g. `{"from":120,"to":0}`).
    pub detail: String,
}
