//! Rules: what decides, per event and per scope, whether to act.
//!
//! A rule watches some event types of one workspace. For each such event it
//! computes a **scope** (a session id, the subject, …), loads the rule's state
//! for that scope, and calls the rule's **decision**, which may change the
//! state and either fires — with a JSON input for the rule's action — or
//! does not. Deciding is exact (DESIGN.md, invariant 4): the state, the
//! cursor, the `RuleFired`/`RuleErrored` events, the dead letters and the new
//! runs of a batch commit in one transaction. Acting is the executors' job
//! ([`crate::Run`]), at least once.
//!
//! ```
//! use reflexr::{Decision, Rule, Scope};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Clone, Default, Serialize, Deserialize)]
//! struct Rsvps { count: u32, announced: bool }
//!
//! let rule = Rule::new("session-full", "events-app")
//!     .on(["rsvp.added", "rsvp.cancelled"])
//!     .scope(Scope::payload("session_id"))
//!     .action("notify-organiser")
//!     .decide_with_state(Rsvps::default(), |event, state| {
//!         if event.event_type == "rsvp.added" { state.count += 1 } else { state.count -= 1 }
//!         if state.count >= 100 && !state.announced {
//!             state.announced = true;
//!             return Ok(Decision::fire(&serde_json::json!({ "rsvps": state.count })));
//!         }
//!         Ok(Decision::Skip)
//!     });
//! ```

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::base::error::{Error, HandlerError, Result};
use crate::base::event::{Event, RESERVED_TYPES};
use crate::base::limits;
use crate::base::retry::RetryPolicy;
use crate::core::cursor::ConsumerKind;
use crate::work::consumer::Consumer;

/// A decision's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Do nothing for this event.
    Skip,
    /// Fire: create a run of the rule's action with this input.
    Fire(serde_json::Value),
}

impl Decision {
    /// Fires with `input` encoded as JSON. A value serde cannot encode fires
    /// with `null`; use [`Decision::Fire`] with a value you built to avoid
    /// that.
    pub fn fire<T: Serialize + ?Sized>(input: &T) -> Decision {
        Decision::Fire(serde_json::to_value(input).unwrap_or(serde_json::Value::Null))
    }
}

/// A function computing an event's scope.
pub type ScopeFn = dyn Fn(&Event) -> Option<String> + Send + Sync;

/// How a rule computes an event's scope: the key its state and its run order
/// are kept by. An event whose scope cannot be computed is an evaluation
/// error for the rule (recorded as `RuleErrored` and dead-lettered).
#[derive(Clone)]
pub enum Scope {
    /// The event's subject.
    Subject,
    /// A field of the payload: a top-level key, or a JSON pointer starting
    /// with `/` (e.g. `/session/id`). Strings are used as they are; numbers
    /// and booleans as their JSON text. Missing, `null`, arrays and objects
    /// are a missing scope.
    Payload(String),
    /// One scope for every event (the rule's state is global).
    Global,
    /// Computed by a function of the application's; `None` is a missing scope.
    /// The rules that share one function (clones of one `Scope`) have it
    /// called once an event of a batch for them all; an event decided again
    /// (a replay, a batch read again) calls it again: keep it pure.
    Custom(Arc<ScopeFn>),
}

impl Scope {
    /// [`Scope::Subject`].
    pub fn subject() -> Scope {
        Scope::Subject
    }

    /// [`Scope::Payload`] of `field` (a key, or a JSON pointer).
    pub fn payload(field: impl Into<String>) -> Scope {
        Scope::Payload(field.into())
    }

    /// [`Scope::Global`].
    pub fn global() -> Scope {
        Scope::Global
    }

    /// [`Scope::Custom`].
    pub fn with(f: impl Fn(&Event) -> Option<String> + Send + Sync + 'static) -> Scope {
        Scope::Custom(Arc::new(f))
    }

    /// The scope of `event`, or a description of why there is none. A
    /// top-level payload field decodes that field alone ([`Event::field`]),
    /// a JSON pointer reads the event's one parse ([`Event::json`]).
    /// Borrowed from the event where it can be (the subject, a plain
    /// field's text), so that a batch's scopes cost no allocation each.
    pub(crate) fn of<'e>(&self, event: &'e Event) -> std::result::Result<Cow<'e, str>, String> {
        match self {
            Scope::Subject => Ok(Cow::Borrowed(&event.subject)),
            Scope::Global => Ok(Cow::Borrowed("")),
            Scope::Payload(field) => {
                let mut field_only;
                let found = if field.starts_with('/') {
                    let value = event.json().map_err(|_| "the payload is not JSON")?;
                    value.pointer(field)
                } else {
                    // The field's own text when it is plain (the common
                    // scope: an id, a number); else its value, decoded.
                    match event.plain_field_text(field) {
                        Some(Some(text)) => return Ok(Cow::Borrowed(text)),
                        Some(None) => return Err(format!("payload has no field {field}")),
                        None => {}
                    }
                    field_only = event.field(field).map_err(|()| "the payload is not JSON")?;
                    // A string read alone is the scope as it is.
                    if let Some(serde_json::Value::String(s)) = &mut field_only {
                        return Ok(Cow::Owned(std::mem::take(s)));
                    }
                    field_only.as_ref()
                };
                let text = match found {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    // As the value prints: an integer by the integer's own
                    // `to_string`, any other number by `Number`'s own
                    // formatting (the same text, for less).
                    Some(serde_json::Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
                        (Some(u), _) => u.to_string(),
                        (None, Some(i)) => i.to_string(),
                        (None, None) => n.to_string(),
                    },
                    Some(serde_json::Value::Bool(b)) => b.to_string(),
                    Some(other) => {
                        return Err(format!("payload field {field} is {other}, not a scope"));
                    }
                    None => return Err(format!("payload has no field {field}")),
                };
                Ok(Cow::Owned(text))
            }
            Scope::Custom(f) => f(event)
                .map(Cow::Owned)
                .ok_or_else(|| "the scope function returned None".into()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Scope::Subject => "subject".into(),
            Scope::Payload(f) => format!("payload:{f}"),
            Scope::Global => "global".into(),
            Scope::Custom(_) => "custom".into(),
        }
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Whether a rule's runs of one scope wait for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunOrder {
    /// Runs of one rule and scope start in firing order, each after the
    /// previous one ended; a run waiting to retry holds back only its own
    /// scope. The default.
    #[default]
    Scope,
    /// Runs start as soon as an executor is free, in parallel.
    None,
}

/// What happens to the later runs of a scope after one is dead-lettered
/// (with [`RunOrder::Scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDeadLetter {
    /// The next run of the scope starts. The default.
    #[default]
    Continue,
    /// The scope waits until an operator retries, discards or unblocks.
    Block,
}

impl OnDeadLetter {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OnDeadLetter::Continue => "continue",
            OnDeadLetter::Block => "block",
        }
    }
}

/// Where a rule that the file has never seen starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// At the start of the log: the rule catches up on everything. The default.
    #[default]
    Beginning,
    /// At the head: only events appended after the rule was first registered.
    Head,
}

/// What happens when a rule is registered with a higher version than the file
/// has for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnNewVersion {
    /// Keep the cursor and the state: the new code decides from where the old
    /// one stopped. The default.
    #[default]
    Continue,
    /// Keep the cursor, forget the per-scope state.
    ResetState,
    /// Forget the state and decide every event again from the rule's start
    /// position (a replay; runs already created stay).
    Replay,
}

/// The type-erased decision: states travel as `Box<dyn Any>` between calls
/// within a batch, and as JSON to and from the file.
pub(crate) trait Decide: Send + Sync {
    fn initial(&self) -> Box<dyn Any + Send>;
    fn load(&self, json: &str) -> std::result::Result<Box<dyn Any + Send>, String>;
    fn save(&self, state: &(dyn Any + Send)) -> std::result::Result<String, String>;
    fn copy(&self, state: &(dyn Any + Send)) -> Box<dyn Any + Send>;
    /// [`Decide::copy`] into `into`, a box of this rule's state type
    /// already (a spare one, kept between decisions: a decision then
    /// allocates no box for its copy).
    fn copy_into(&self, state: &(dyn Any + Send), into: &mut (dyn Any + Send));
    fn decide(
        &self,
        event: &Event,
        state: &mut (dyn Any + Send),
    ) -> std::result::Result<Decision, HandlerError>;
}

type DecideFn<S> =
    dyn Fn(&Event, &mut S) -> std::result::Result<Decision, HandlerError> + Send + Sync;

struct Typed<S> {
    initial: S,
    f: Box<DecideFn<S>>,
}

impl<S> Decide for Typed<S>
where
    S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    fn initial(&self) -> Box<dyn Any + Send> {
        Box::new(self.initial.clone())
    }

    fn load(&self, json: &str) -> std::result::Result<Box<dyn Any + Send>, String> {
        serde_json::from_str::<S>(json)
            .map(|s| Box::new(s) as Box<dyn Any + Send>)
            .map_err(|e| format!("stored state does not decode: {e}"))
    }

    fn save(&self, state: &(dyn Any + Send)) -> std::result::Result<String, String> {
        let s = state
            .downcast_ref::<S>()
            .expect("the state is this rule's type");
        serde_json::to_string(s).map_err(|e| format!("state does not encode: {e}"))
    }

    fn copy(&self, state: &(dyn Any + Send)) -> Box<dyn Any + Send> {
        Box::new(state.downcast_ref::<S>().expect("the rule's type").clone())
    }

    fn copy_into(&self, state: &(dyn Any + Send), into: &mut (dyn Any + Send)) {
        into.downcast_mut::<S>()
            .expect("the rule's type")
            .clone_from(state.downcast_ref::<S>().expect("the rule's type"));
    }

    fn decide(
        &self,
        event: &Event,
        state: &mut (dyn Any + Send),
    ) -> std::result::Result<Decision, HandlerError> {
        let s = state
            .downcast_mut::<S>()
            .expect("the state is this rule's type");
        (self.f)(event, s)
    }
}

/// A rule, as built by the application and registered with
/// [`crate::Engine::register_rule`].
///
/// # Defaults
///
/// Scope [`Scope::Subject`]; [`RunOrder::Scope`]; [`OnDeadLetter::Continue`];
/// [`RetryPolicy::default`]; [`Start::Beginning`]; version 1 with
/// [`OnNewVersion::Continue`]. The types, the action and the decision have no
/// default.
#[derive(Clone)]
pub struct Rule {
    pub(crate) name: String,
    pub(crate) workspace: String,
    pub(crate) types: Vec<String>,
    pub(crate) scope: Scope,
    pub(crate) action: Option<String>,
    pub(crate) retry: RetryPolicy,
    pub(crate) ordering: RunOrder,
    pub(crate) on_dead_letter: OnDeadLetter,
    pub(crate) start: Start,
    pub(crate) version: u32,
    pub(crate) on_new_version: OnNewVersion,
    pub(crate) decide: Option<Arc<dyn Decide>>,
    /// Registered as a shadow, deciding from this seq ([`Rule::shadow`]).
    pub(crate) shadow: Option<i64>,
    /// On the engine's copy of a shadow (named `<rule>@v<version>`): the
    /// live rule's name.
    pub(crate) shadow_of: Option<String>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("workspace", &self.workspace)
            .field("types", &self.types)
            .field("scope", &self.scope)
            .field("action", &self.action)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Rule {
    /// A rule named `name` over `workspace`'s log.
    pub fn new(name: impl Into<String>, workspace: impl Into<String>) -> Rule {
        Rule {
            name: name.into(),
            workspace: workspace.into(),
            types: Vec::new(),
            scope: Scope::Subject,
            action: None,
            retry: RetryPolicy::default(),
            ordering: RunOrder::Scope,
            on_dead_letter: OnDeadLetter::Continue,
            start: Start::Beginning,
            version: 1,
            on_new_version: OnNewVersion::Continue,
            decide: None,
            shadow: None,
            shadow_of: None,
        }
    }

    /// Registers this version as a **shadow** of the live rule of the same
    /// name, deciding from `from` (a seq: 0 is the start of the log): it
    /// decides every event the rule watches and keeps its own state and
    /// cursor, but fires nothing — no runs, no `RuleFired` or
    /// `RuleErrored`, no dead letters; what it would have fired and the
    /// decisions that failed are counted for operators
    /// ([`crate::inspect::RuleInfo`]). The live version goes on as before.
    ///
    /// Its version must be higher than the live one's. An operator's
    /// [`crate::Operator::promote_rule`] then hands over at one position:
    /// the live version decides and fires up to it, the shadow after it —
    /// no event is decided by both, none by neither — and the old version
    /// retires, its state replaced by the shadow's. Register the same
    /// shadow in every process that evaluates the workspace (the handover
    /// happens in whichever holds the evaluator's lease); after it, code
    /// that registers the new version as a plain rule continues from there.
    ///
    /// ```
    /// # use reflexr::{Decision, Rule};
    /// let v2 = Rule::new("big-orders", "shop")
    ///     .on(["order.placed"])
    ///     .action("review")
    ///     .version(2, reflexr::OnNewVersion::Continue)
    ///     .shadow(0)
    ///     .decide(|e| {
    ///         let big = e.json()?["total"].as_f64().unwrap_or(0.0) > 500.0;
    ///         Ok(if big { Decision::Fire(e.json()?.clone()) } else { Decision::Skip })
    ///     });
    /// ```
    pub fn shadow(mut self, from: i64) -> Rule {
        self.shadow = Some(from);
        self
    }

    /// The name of the row and cursor of version `version` of `rule` in
    /// shadow.
    pub(crate) fn shadow_name(rule: &str, version: u32) -> String {
        format!("{rule}@v{version}")
    }

    /// The engine's copy of a rule registered with [`Rule::shadow`]: its
    /// own name, the live rule's beside it.
    pub(crate) fn as_shadow(&self) -> Rule {
        let mut copy = self.clone();
        copy.name = Rule::shadow_name(&self.name, self.version);
        copy.shadow_of = Some(self.name.clone());
        copy
    }

    /// A promoted shadow's code, as the live rule it became.
    pub(crate) fn as_live(&self) -> Rule {
        let mut copy = self.clone();
        if let Some(live) = copy.shadow_of.take() {
            copy.name = live;
        }
        copy.shadow = None;
        copy
    }

    /// The name firings are derived from and runs' lanes kept by: the live
    /// rule's, for a shadow too.
    pub(crate) fn firing_name(&self) -> &str {
        self.shadow_of.as_deref().unwrap_or(&self.name)
    }

    /// The event types the rule decides on; it skips every other type.
    pub fn on<I, S>(mut self, types: I) -> Rule
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.types = types.into_iter().map(Into::into).collect();
        self
    }

    /// How an event's scope is computed.
    pub fn scope(mut self, scope: Scope) -> Rule {
        self.scope = scope;
        self
    }

    /// The action a firing runs (registered with
    /// [`crate::Engine::register_action`]).
    pub fn action(mut self, action: impl Into<String>) -> Rule {
        self.action = Some(action.into());
        self
    }

    /// How the action's runs are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Rule {
        self.retry = policy;
        self
    }

    /// Whether the runs of one scope wait for each other.
    pub fn ordering(mut self, ordering: RunOrder) -> Rule {
        self.ordering = ordering;
        self
    }

    /// What the later runs of a scope do after one is dead-lettered.
    pub fn on_dead_letter(mut self, policy: OnDeadLetter) -> Rule {
        self.on_dead_letter = policy;
        self
    }

    /// Where a rule new to the file starts reading.
    pub fn start(mut self, start: Start) -> Rule {
        self.start = start;
        self
    }

    /// The rule's version, and what a higher version than the file's does.
    pub fn version(mut self, version: u32, on_new: OnNewVersion) -> Rule {
        self.version = version;
        self.on_new_version = on_new;
        self
    }

    /// A decision that keeps no state.
    pub fn decide<F>(self, f: F) -> Rule
    where
        F: Fn(&Event) -> std::result::Result<Decision, HandlerError> + Send + Sync + 'static,
    {
        self.decide_with_state((), move |event, _: &mut ()| f(event))
    }

    /// A decision with state of type `S` per scope, starting from `initial`.
    /// The decision may change the state; if it returns an error or panics,
    /// its changes are dropped. States are stored as JSON: adding a field
    /// with `#[serde(default)]` keeps old states readable.
    pub fn decide_with_state<S, F>(mut self, initial: S, f: F) -> Rule
    where
        S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        F: Fn(&Event, &mut S) -> std::result::Result<Decision, HandlerError>
            + Send
            + Sync
            + 'static,
    {
        self.decide = Some(Arc::new(Typed {
            initial,
            f: Box::new(f),
        }));
        self
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule as a consumer of its workspace (its cursor).
    pub(crate) fn consumer(&self) -> Consumer<'_> {
        Consumer {
            workspace: &self.workspace,
            kind: ConsumerKind::Rule,
            name: &self.name,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        limits::check_name("rule", &self.name)?;
        if self.name.starts_with(limits::TASK_LANE_PREFIX) {
            // A rule's lanes are `<rule> <scope>`: this one's could be an
            // enqueued action's scope lane.
            return Err(Error::invalid(
                "rule",
                format!(
                    "{}: names starting with {:?} are kept for the scope lanes of enqueued work",
                    self.name,
                    limits::TASK_LANE_PREFIX
                ),
            ));
        }
        limits::check_name("workspace", &self.workspace)?;
        if self.types.is_empty() {
            return Err(Error::invalid(
                "rule",
                format!("{}: watches no event types (Rule::on)", self.name),
            ));
        }
        for t in &self.types {
            limits::check_name("event type", t)?;
            if RESERVED_TYPES.contains(&t.as_str()) {
                return Err(Error::invalid(
                    "rule",
                    format!("{}: may not watch the engine's own {t} events", self.name),
                ));
            }
        }
        match &self.action {
            Some(a) => limits::check_name("action", a)?,
            None => {
                return Err(Error::invalid(
                    "rule",
                    format!("{}: has no action (Rule::action)", self.name),
                ));
            }
        }
        if self.decide.is_none() {
            return Err(Error::invalid(
                "rule",
                format!("{}: has no decision (Rule::decide)", self.name),
            ));
        }
        if self.version == 0 {
            return Err(Error::invalid("rule", "versions start at 1"));
        }
        if let Some((_, v)) = self.name.rsplit_once("@v")
            && !v.is_empty()
            && v.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(Error::invalid(
                "rule",
                format!(
                    "{}: names ending in @v<n> are kept for versions in shadow",
                    self.name
                ),
            ));
        }
        if let Some(from) = self.shadow
            && from < 0
        {
            return Err(Error::invalid("shadow", "a seq is never negative"));
        }
        if let Scope::Payload(f) = &self.scope
            && f.is_empty()
        {
            return Err(Error::invalid("rule", "an empty payload field as scope"));
        }
        self.retry.validate()
    }

    /// The rule as stored in `reflexr_rules.definition`, for operators.
    pub(crate) fn definition(&self) -> String {
        serde_json::json!({
            "types": self.types,
            "scope": self.scope.describe(),
            "action": self.action,
            "ordering": match self.ordering { RunOrder::Scope => "scope", RunOrder::None => "none" },
            "on_dead_letter": self.on_dead_letter.as_str(),
            "retry": {
                "max_attempts": self.retry.max_attempts,
                "initial_ms": self.retry.initial.as_millis() as u64,
                "factor": self.retry.factor,
                "max_delay_ms": self.retry.max_delay.as_millis() as u64,
                "jitter": self.retry.jitter,
            },
            "start": match self.start { Start::Beginning => "beginning", Start::Head => "head" },
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_number_scope_is_the_text_the_value_prints() {
        // Invariant 4 (exact decisions: a scope's state is found again): a
        // number's scope is its JSON text, as the value printed it before.
        for text in [
            "0",
            "7",
            "-3",
            "18446744073709551615",
            "-9223372036854775808",
            "1.5",
            "0.1",
            "1e300",
            "-2.5e-10",
            "100.0",
        ] {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            let event = crate::base::event::event_for_test(&format!(r#"{{"k": {text}}}"#));
            // The field read alone, and read from the parsed payload.
            assert_eq!(
                super::Scope::payload("k")
                    .of(&event)
                    .map(std::borrow::Cow::into_owned),
                Ok(v.to_string()),
                "{text}"
            );
            event.json().unwrap();
            assert_eq!(
                super::Scope::payload("k")
                    .of(&event)
                    .map(std::borrow::Cow::into_owned),
                Ok(v.to_string()),
                "{text}"
            );
            assert_eq!(
                super::Scope::payload("/k")
                    .of(&event)
                    .map(std::borrow::Cow::into_owned),
                Ok(v.to_string()),
                "{text}"
            );
        }
    }
}
