//! Dead letters: what a consumer or an executor gave up on, with the
//! reason, the error and the attempts (DESIGN.md, "dead letter"). Never
//! silent; an operator retries or discards them ([`crate::Engine::dead_letters`],
//! [`crate::Engine::retry_dead_letter`], [`crate::Engine::discard_dead_letter`]).
//! They are written by the consumer that gives up, in the transaction that
//! moves its cursor or settles its run (`store::dead_letters::insert`).

/// A dead letter as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id (for [`crate::Engine::retry_dead_letter`] and friends).
    pub id: i64,
    /// Whose: `rule` (an evaluation error), `run` (a run gave up: a rule's
    /// action, a scheduled job or a delivery), `reaction` or `follower`.
    pub kind: String,
    /// The rule, reaction, follower or action that gave up.
    pub consumer: String,
    /// The workspace of the event concerned.
    pub workspace: Option<String>,
    /// The event concerned.
    pub event_seq: Option<i64>,
    /// Its id.
    pub event_id: Option<String>,
    /// The run, for `run` dead letters.
    pub run_id: Option<String>,
    /// Why, in one word: `decision_error`, `decision_panic`,
    /// `missing_scope`, `state_unreadable`, `attempts_exhausted`,
    /// `depth_limit`, …
    pub reason: String,
    /// The error's text.
    pub error: String,
    /// Attempts made.
    pub attempts: i64,
    /// When.
    pub created_at: i64,
    /// When an operator resolved it.
    pub resolved_at: Option<i64>,
    /// `retried` or `discarded`.
    pub resolution: Option<String>,
}
