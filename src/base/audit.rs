//! What operators did: [`AuditEntry`], read back from `reflexr_audit`.

use crate::base::text::open_text_enum;

open_text_enum! {
    /// What an operator (or the engine, on a rule's new version) did.
    pub enum AuditAction {
        /// Moved a consumer's cursor.
        ResetCursor = "reset_cursor",
        /// Reset a rule's cursor and/or state.
        ResetRule = "reset_rule",
        /// Deleted a rule's rows.
        DeleteRule = "delete_rule",
        /// Retried a dead run.
        RetryRun = "retry_run",
        /// Discarded a dead run.
        DiscardRun = "discard_run",
        /// Let a blocked scope go on.
        Unblock = "unblock",
        /// Resolved a dead letter without retrying it.
        DiscardDeadLetter = "discard_dead_letter",
        /// Removed a follower.
        Unfollow = "unfollow",
        /// Asked a stopped follower to go on.
        RestartFollower = "restart_follower",
        /// Pruned events and finished work.
        Prune = "prune",
        /// A rule's new version reset its state.
        RuleVersionResetState = "rule_version_reset_state",
        /// A rule's new version replays the log.
        RuleVersionReplay = "rule_version_replay",
        /// Paused an action, a rule or a reaction.
        Pause = "pause",
        /// Resumed one.
        Resume = "resume",
        /// Cancelled a run.
        Cancel = "cancel",
        /// Changed an action's priority or limits.
        ConfigureAction = "configure_action",
        /// Set one key's limits or weight.
        SetKeyLimits = "set_key_limits",
        /// Cleared one key's limits and weight.
        ClearKeyLimits = "clear_key_limits",
        /// A workflow run reset to one of its steps.
        ResetRunToStep = "reset_run_to_step",
        /// Set the position where a rule's shadow version takes over.
        PromoteRule = "promote_rule",
        /// A rule's shadow version took over at its handover position (the
        /// evaluator's record, once both versions reached it).
        RulePromoted = "rule_promoted",
    }
}

/// A recorded action, as read back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// When, in ms since the epoch.
    pub at: i64,
    /// Who (as they named themselves).
    pub operator: String,
    /// What.
    pub action: AuditAction,
    /// On what, e.g. `cursor app/billing@shop`.
    pub target: String,
    /// Why, as the operator said.
    pub reason: String,
    /// The particulars, as JSON text (e.g. `{"from":120,"to":0}`;
    /// serialised as the JSON it holds).
    #[serde(serialize_with = "crate::base::text::raw_json")]
    pub detail: String,
}
