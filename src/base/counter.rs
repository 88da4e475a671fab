//! [`Counter`]: the totals the engine keeps in the file.

use crate::base::text::text_enum;

text_enum! {
    /// A total kept in the file (`reflexr_counters`), bumped in the
    /// transaction that does the work, so every process reads the same.
    pub enum Counter ("counter") {
        /// Rules' decisions: events of a type a rule watches.
        Decisions = "decisions",
        /// Decisions that fired (new firings).
        Fired = "fired",
        /// Decisions that failed (`RuleErrored`).
        Errored = "errored",
        /// Firings a replay found made before, and did not make again.
        ReplayExisting = "replay_existing",
        /// Firings made before that a replay no longer makes, kept as they were.
        ReplayKept = "replay_kept",
        /// Runs that succeeded.
        RunsSucceeded = "runs_succeeded",
        /// Failed attempts that will be retried.
        RunsRetried = "runs_retried",
        /// Runs dead-lettered.
        RunsDead = "runs_dead",
        /// Claims whose executor stopped renewing them, made claimable
        /// again.
        ClaimsRescued = "claims_rescued",
        /// Events reactions handled.
        Reacted = "reacted",
        /// Events whose reaction handler failed (dead-lettered).
        ReactionErrors = "reaction_errors",
        /// Deliveries enqueued.
        Deliveries = "deliveries",
        /// Scheduled occurrences created.
        Occurrences = "occurrences",
        /// Commits of rules, reactions and followers that failed (see stuck
        /// consumers).
        ConsumerFailures = "consumer_failures",
    }
}
