//! `reflexr_rules` and `reflexr_rule_state`: the rules a database knows and their state per scope.
//!
//! The table group every backend implements (`store::sqlite::rules`,
//! `store::postgres::rules`), and the rows it speaks in.

use crate::base::error::Result;

/// A rule's row.
pub struct RuleRow {
    pub name: String,
    pub workspace: String,
    pub version: i64,
    pub definition: String,
    pub registered_at: i64,
    pub updated_at: i64,
    /// A shadow's live rule (the row is named `<rule>@v<version>`).
    pub shadow_of: Option<String>,
    /// A shadow's handover position, once an operator promoted it.
    pub promote_at: Option<i64>,
    /// What a shadow would have fired, and the decisions that failed.
    pub shadow_fired: i64,
    pub shadow_errored: i64,
}

/// `reflexr_rules` and `reflexr_rule_state`: the rules a database knows
/// and their state per scope.
pub trait Rules {
    fn rule(&self, name: &str) -> Result<Option<RuleRow>>;
    fn rule_rows(&self) -> Result<Vec<RuleRow>>;
    /// Inserts or replaces the rule's row.
    fn upsert_rule(
        &self,
        name: &str,
        workspace: &str,
        version: i64,
        definition: &str,
        now: i64,
    ) -> Result<()>;
    /// Inserts the row of a shadow of `shadow_of`, or updates its
    /// definition if it has one.
    fn upsert_shadow(
        &self,
        name: &str,
        workspace: &str,
        version: i64,
        definition: &str,
        shadow_of: &str,
        now: i64,
    ) -> Result<()>;
    /// Sets a shadow's handover position.
    fn set_promote_at(&self, name: &str, at: i64, now: i64) -> Result<()>;
    /// Adds to what a shadow would have fired and the decisions it failed.
    fn count_shadow(&self, name: &str, fired: i64, errored: i64) -> Result<()>;
    /// Gives `from`'s scope states to `to` (whose own must be cleared
    /// first); how many.
    fn move_states(&self, from: &str, to: &str) -> Result<usize>;
    /// The stored states of `scopes` (those that have one).
    fn states(&self, rule: &str, scopes: &[&str]) -> Result<Vec<(String, String)>>;
    fn state(&self, rule: &str, scope: &str) -> Result<Option<String>>;
    /// Writes the states of a batch's scopes: each `(scope, state, seq)`
    /// inserted or put in place of the stored one. The scopes are distinct
    /// (a batch's map has each once). PostgreSQL takes them in one
    /// statement, one round trip for the batch.
    fn save_states(&self, rule: &str, states: &[(&str, &str, i64)], now: i64) -> Result<()>;
    /// Forgets every scope's state; how many there were.
    fn clear_states(&self, rule: &str) -> Result<usize>;
    /// Deletes the rule's row; false if there was none.
    fn delete_rule(&self, name: &str) -> Result<bool>;
}
