//! Deliveries: messages the application enqueues — a template name and JSON
//! props on a channel — sent by the sender registered for the channel.
//!
//! A delivery is a run of the work queue (kind `delivery`, action
//! `delivery/<channel>`), enqueued in the caller's transaction
//! ([`crate::Tx::deliver`]): a reaction's deliveries commit with its cursor,
//! so a change's notices are enqueued exactly once. They are sent at least
//! once (ADR 0011: a crash between sending and marking sent repeats that one
//! message), with the run id as the idempotency key. A channel's policy says
//! what a failure does:
//!
//! - [`ChannelPolicy::Retried`] (email-like): retried with backoff, then given
//!   up as a dead letter.
//! - [`ChannelPolicy::BestEffort`] (push-like): one attempt, never retried; a
//!   failure is recorded as a dead letter (reason `attempts_exhausted`,
//!   attempts 1) and nothing more.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::base::counter::Counter;
use crate::base::error::{Error, HandlerError, Result};
use crate::base::event::Event;
use crate::base::limits;
use crate::base::retry::RetryPolicy;
use crate::base::telemetry::Op;
use crate::core::db::Backend;
use crate::core::db::Tx;
use crate::store::runs::{self, NewRun};
use crate::store::{Counters, Runs, Sqlite};
use crate::work::queue::run::{Run, RunContext};

/// What a channel does when a send fails.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ChannelPolicy {
    /// Retry with this policy, then dead-letter.
    Retried(RetryPolicy),
    /// Send once; never retry.
    BestEffort,
}

impl ChannelPolicy {
    pub(crate) fn retry(&self) -> RetryPolicy {
        match self {
            ChannelPolicy::Retried(p) => *p,
            ChannelPolicy::BestEffort => RetryPolicy::never(),
        }
    }
}

/// A message to enqueue.
///
/// ```
/// # use reflexr::Delivery;
/// let d = Delivery::new("email", "session-moved")
///     .to("ada@example.com")
///     .props(&serde_json::json!({ "session": 42, "room": "Hall B" }));
/// ```
#[derive(Debug, Clone)]
pub struct Delivery {
    pub(crate) channel: String,
    pub(crate) template: String,
    pub(crate) to: Option<String>,
    pub(crate) props: std::result::Result<String, String>,
    pub(crate) id: Option<String>,
    pub(crate) cause: Option<(String, i64, String, i64)>,
    pub(crate) unique: Option<(String, crate::work::queue::enqueue::Unique)>,
}

impl Delivery {
    /// A message on `channel`, built from `template`, with empty props.
    pub fn new(channel: impl Into<String>, template: impl Into<String>) -> Delivery {
        Delivery {
            channel: channel.into(),
            template: template.into(),
            to: None,
            props: Ok("{}".into()),
            id: None,
            cause: None,
            unique: None,
        }
    }

    /// No second delivery on this channel with `key` while `unique` holds
    /// (e.g. one reminder per user and day): the enqueue returns the
    /// existing delivery's id, marked deduplicated.
    pub fn unique(
        mut self,
        key: impl Into<String>,
        unique: crate::work::queue::enqueue::Unique,
    ) -> Delivery {
        self.unique = Some((key.into(), unique));
        self
    }

    /// The recipient (an address, a device token), for the sender and for
    /// operators.
    pub fn to(mut self, recipient: impl Into<String>) -> Delivery {
        self.to = Some(recipient.into());
        self
    }

    /// The template's props, as JSON. A props field may be added later;
    /// anything else needs a new template name (ADR 0011).
    pub fn props<T: Serialize + ?Sized>(mut self, props: &T) -> Delivery {
        self.props = serde_json::to_string(props).map_err(|e| e.to_string());
        self
    }

    /// The delivery's id (the idempotency key). Enqueuing an id that exists
    /// already enqueues nothing. Without one, a UUIDv7 is generated.
    pub fn id(mut self, id: impl Into<String>) -> Delivery {
        self.id = Some(id.into());
        self
    }

    /// Records the event the delivery is about (for operators; the run shows
    /// it).
    pub fn caused_by(mut self, event: &Event) -> Delivery {
        self.cause = Some((
            event.workspace.clone(),
            event.seq,
            event.id.clone(),
            event.depth,
        ));
        self
    }
}

/// A message as its sender gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// The delivery's id: the idempotency key for the mail or push service.
    pub id: String,
    /// The channel.
    pub channel: String,
    /// The template to build the message from.
    pub template: String,
    /// The recipient, if given.
    pub to: Option<String>,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// Attempts it gets in all (1 on a best-effort channel).
    pub max_attempts: u32,
    pub(crate) props: String,
}

impl Message {
    pub(crate) fn from_run(run: &Run) -> Result<Message> {
        let v: serde_json::Value = run.input()?;
        let text = |k: &str| v[k].as_str().map(str::to_owned);
        Ok(Message {
            id: run.id.clone(),
            channel: text("channel").unwrap_or_default(),
            template: text("template").unwrap_or_default(),
            to: text("to"),
            attempt: run.attempt,
            max_attempts: run.max_attempts,
            props: v["props"].to_string(),
        })
    }

    /// The props, decoded.
    pub fn props<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.props).map_err(|e| Error::Decode {
            what: format!("props of delivery {}", self.id),
            seq: None,
            message: e.to_string(),
        })
    }

    /// The props as JSON text.
    pub fn props_json(&self) -> &str {
        &self.props
    }
}

/// A channel's sender: sends one message. An error (or a panic) fails the
/// attempt.
pub type SenderFn<B = Sqlite> =
    dyn Fn(&Message, &mut RunContext<'_, B>) -> std::result::Result<(), HandlerError> + Send + Sync;

/// The action name of a channel's deliveries.
pub(crate) fn action_of(channel: &str) -> String {
    limits::channel_action(channel)
}

/// The action handler that decodes the message and calls the sender.
pub(crate) fn action<B: Backend>(
    sender: Arc<SenderFn<B>>,
) -> Arc<crate::work::queue::run::ActionFn<B>> {
    Arc::new(move |run: &Run, ctx: &mut RunContext<'_, B>| {
        let message = Message::from_run(run)?;
        sender(&message, ctx)
    })
}

impl<B: Backend> Tx<'_, B> {
    /// Enqueues `delivery` on its channel, in this transaction: it is sent
    /// (at least once) only if the transaction commits. Returns the
    /// delivery's id. Enqueuing an id that exists already enqueues nothing.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a channel this engine has not registered
    /// ([`crate::Engine::register_channel`]: its policy decides the retries);
    /// [`Error::Invalid`] / [`Error::Encode`] for bad fields.
    pub fn deliver(
        &mut self,
        delivery: &Delivery,
    ) -> Result<crate::work::queue::enqueue::Enqueued> {
        let done = enqueue(self, delivery)?;
        if !done.deduplicated {
            self.mark_runs();
        }
        Ok(done)
    }
}

/// Inserts the delivery's run; returns its id (or the one holding its key).
fn enqueue<B: Backend>(
    tx: &Tx<'_, B>,
    d: &Delivery,
) -> Result<crate::work::queue::enqueue::Enqueued> {
    limits::check_name("channel", &d.channel)?;
    limits::check_name("template", &d.template)?;
    if let Some(to) = &d.to {
        limits::check_text("recipient", to, limits::MAX_SUBJECT_BYTES)?;
    }
    let retry = tx
        .env()
        .channels
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&d.channel)
        .copied()
        .ok_or_else(|| Error::not_found("channel", &d.channel))?;
    let props = match &d.props {
        Ok(p) => p,
        Err(message) => {
            return Err(Error::Encode {
                message: message.clone(),
            });
        }
    };
    crate::core::changelog::check_json("props", props, tx.limits().max_payload_bytes)?;
    let props: serde_json::Value = serde_json::from_str(props)
        .map_err(|e| Error::invalid("props", format!("not JSON: {e}")))?;
    let id = match &d.id {
        Some(id) => {
            limits::check_text("delivery id", id, limits::MAX_ID_BYTES)?;
            id.clone()
        }
        None => crate::core::changelog::new_id(),
    };
    let input = serde_json::json!({
        "channel": d.channel,
        "template": d.template,
        "to": d.to,
        "props": props,
    })
    .to_string();
    let now = tx.now_ms();
    let action = action_of(&d.channel);
    let unique = match &d.unique {
        Some((key, u)) => Some(crate::work::queue::enqueue::uniq(key, *u)?),
        None => None,
    };
    let cause = d.cause.as_ref();
    // Its enqueue's span (feature `otel`), a child of the caller's current
    // span: the delivery's attempts are its.
    let span = tx.settings().telemetry.start(Op::Enqueue {
        action: &action,
        run_id: &id,
        parent: None,
    });
    let traceparent = span.traceparent();
    let new = Runs::insert(
        tx.core(),
        &NewRun {
            id: &id,
            kind: "delivery",
            action: &action,
            workspace: cause.map(|c| c.0.as_str()),
            rule: None,
            scope: d.to.as_deref(),
            lane: None,
            on_dead_letter: "continue",
            input: &input,
            event_seq: cause.map(|c| c.1),
            event_id: cause.map(|c| c.2.as_str()),
            depth: cause.map_or(0, |c| c.3),
            retry: &retry,
            due_at: now,
            now,
            dead: None,
            priority: None,
            unique,
            parent: None,
            key: None,
            traceparent: traceparent.as_deref(),
        },
    )?;
    Counters::bump(
        tx.core(),
        Counter::Deliveries,
        usize::from(new == runs::Inserted::New),
    )?;
    Ok(match new {
        runs::Inserted::New => crate::work::queue::enqueue::Enqueued {
            id,
            deduplicated: false,
        },
        runs::Inserted::Existed => crate::work::queue::enqueue::Enqueued {
            id,
            deduplicated: true,
        },
        runs::Inserted::Duplicate(other) => crate::work::queue::enqueue::Enqueued {
            id: other,
            deduplicated: true,
        },
    })
}
