//! Dead letters: what a consumer or an executor gave up on, with the
//! reason, the error and the attempts (DESIGN.md, "dead letter"). Never
//! silent; an operator retries or discards them ([`crate::Engine::dead_letters`],
//! [`crate::Operator::retry_dead_letter`], [`crate::Operator::discard_dead_letter`]).
//! They are written by the consumer that gives up, in the transaction that
//! moves its cursor or settles its run (`store::dead_letters::insert`).

use crate::base::text::{open_text_enum, text_enum};

text_enum! {
    /// Whose dead letter it is.
    pub enum DeadLetterKind ("dead letter kind") {
        /// A rule's evaluation of one event.
        Rule = "rule",
        /// A run: a rule's action, a delivery or a scheduled occurrence.
        Run = "run",
        /// A reaction's handling of one event.
        Reaction = "reaction",
        /// A follower's bridging of one envelope.
        Follower = "follower",
    }
}

text_enum! {
    /// How an operator settled a dead letter.
    pub enum Resolution ("resolution") {
        /// Tried again (a run revived; a rule's event decided again).
        Retried = "retried",
        /// Marked handled without trying again.
        Discarded = "discarded",
    }
}

open_text_enum! {
    /// Why something was dead-lettered.
    pub enum Reason {
        /// A rule's decision returned an error.
        DecisionError = "decision_error",
        /// A rule's decision panicked.
        DecisionPanic = "decision_panic",
        /// The rule's scope could not be computed for the event.
        MissingScope = "missing_scope",
        /// The scope was longer than 1,024 bytes.
        ScopeTooLong = "scope_too_long",
        /// The scope's stored state did not decode.
        StateUnreadable = "state_unreadable",
        /// The scope's new state could not be stored.
        StateRefused = "state_refused",
        /// The firing's input was over the payload limit or too deep.
        InputRefused = "input_refused",
        /// The firing could not be recorded.
        FiringRefused = "firing_refused",
        /// A run used every attempt its policy gives.
        AttemptsExhausted = "attempts_exhausted",
        /// A run would have emitted events past the chain depth limit.
        DepthLimit = "depth_limit",
        /// A reaction's handler returned an error.
        HandlerError = "handler_error",
        /// A reaction's handler panicked.
        HandlerPanic = "handler_panic",
        /// A follower's projection returned an error.
        ProjectionError = "projection_error",
        /// A follower's projection panicked.
        ProjectionPanic = "projection_panic",
        /// A projection returned one of the engine's own types.
        ReservedType = "reserved_type",
        /// A projection returned an event the target refused as invalid.
        InvalidEvent = "invalid_event",
    }
}

/// A dead letter as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id (for [`crate::Operator::retry_dead_letter`] and friends).
    pub id: i64,
    /// Whose it is.
    pub kind: DeadLetterKind,
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
    /// Why.
    pub reason: Reason,
    /// The error's text.
    pub error: String,
    /// Attempts made.
    pub attempts: i64,
    /// When.
    pub created_at: i64,
    /// When an operator resolved it.
    pub resolved_at: Option<i64>,
    /// How.
    pub resolution: Option<Resolution>,
}
