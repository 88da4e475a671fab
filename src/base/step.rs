//! A workflow's words: what a step is called ([`StepName`]), what kind it
//! is and where it stands ([`StepKind`], [`StepState`]), a run's timeline
//! as operators read it ([`StepInfo`]), and what a wait for an event of
//! the log matches ([`EventMatch`]).

use serde::Serialize;

use crate::base::error::{Error, Result};
use crate::base::limits;
use crate::base::text::text_enum;

/// The most steps one run records (begin and patch markers included): a
/// loop that names a step per turn cannot grow a run without bound.
pub const MAX_STEPS_PER_RUN: usize = 10_000;

/// A step's name, unique within its run: a name as workspaces and actions
/// have them (1 to 128 bytes of ASCII letters, digits and `. _ - : / @ +`).
/// A loop names its steps by turn: `("send", i)` is the name `send/<i>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StepName(pub(crate) String);

impl StepName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn check(&self) -> Result<()> {
        limits::check_name("step name", &self.0)
    }
}

impl std::fmt::Display for StepName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for StepName {
    fn from(name: &str) -> StepName {
        StepName(name.to_string())
    }
}

impl From<String> for StepName {
    fn from(name: String) -> StepName {
        StepName(name)
    }
}

impl From<&String> for StepName {
    fn from(name: &String) -> StepName {
        StepName(name.clone())
    }
}

macro_rules! step_name_of_turn {
    ($($t:ty),*) => {$(
        impl From<(&str, $t)> for StepName {
            fn from((name, turn): (&str, $t)) -> StepName {
                StepName(format!("{name}/{turn}"))
            }
        }
    )*};
}
step_name_of_turn!(u8, u16, u32, u64, usize, i32, i64);

impl From<(&str, &str)> for StepName {
    fn from((name, part): (&str, &str)) -> StepName {
        StepName(format!("{name}/{part}"))
    }
}

text_enum! {
    /// What a recorded step is.
    pub enum StepKind ("step kind") {
        /// Where the run began: the log's head when it was first claimed
        /// (a wait finds events after it).
        Begin = "begin",
        /// A closure's output ([`crate::RunContext::step`]).
        Step = "step",
        /// Written in the transaction of the application's rows
        /// ([`crate::RunContext::step_tx`]).
        Tx = "tx",
        /// A durable sleep ([`crate::RunContext::sleep`]).
        Sleep = "sleep",
        /// A wait for an event of the log
        /// ([`crate::RunContext::wait_for_event`]).
        Wait = "wait",
        /// A child run spawned ([`crate::RunContext::spawn`]).
        Spawn = "spawn",
        /// Children waited for ([`crate::RunContext::join`]).
        Join = "join",
        /// A code path taken or not ([`crate::RunContext::patched`]).
        Patch = "patch",
    }
}

text_enum! {
    /// Where a recorded step stands.
    pub enum StepState ("step state") {
        /// Over: its output is recorded.
        Done = "done",
        /// A sleep, a wait or a join not over yet: the run is suspended.
        Waiting = "waiting",
    }
}

/// One entry of a run's timeline ([`crate::Engine::run_steps`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StepInfo {
    /// The run.
    pub run: String,
    /// The step's name.
    pub name: String,
    /// Its place in the run: the order the handler reached its steps in
    /// (0: where the run began).
    pub position: i64,
    /// What it is.
    pub kind: StepKind,
    /// Over, or waiting.
    pub state: StepState,
    /// The attempt that recorded it.
    pub attempt: u32,
    /// When it was recorded (ms since the epoch); for a step that waited,
    /// when it was over.
    pub recorded_at: i64,
    /// The size of its output, in bytes of JSON.
    pub output_bytes: usize,
    /// Its output, as JSON text (serialised as the JSON it holds): a step's
    /// value, the event a wait received (`null`: it timed out), a spawned
    /// child's id, the children's ends of a join.
    #[serde(serialize_with = "crate::base::text::raw_json_opt")]
    pub output: Option<String>,
    /// What it waits (or waited) for, as JSON text: a sleep's `until`, a
    /// wait's match and `timeout_at`, a join's runs.
    #[serde(serialize_with = "crate::base::text::raw_json")]
    pub detail: String,
    /// When a waiting step times out (a sleep: when it wakes); none for a
    /// wait without a timeout.
    pub wake_at: Option<i64>,
}

/// What [`crate::RunContext::wait_for_event`] waits for: the first event of
/// `workspace` of type `event_type` — with this subject, or this value at a
/// payload field, or any — appended after the run began (and after the
/// event its previous wait received).
///
/// ```
/// use reflexr::EventMatch;
/// let confirmed = EventMatch::new("events", "speaker.confirmed").subject("session/42");
/// let paid = EventMatch::new("shop", "payment.received").field("order", 1017);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct EventMatch {
    pub(crate) workspace: String,
    pub(crate) event_type: String,
    /// `''` (any), `subject`, or a payload path (`$.a.b`).
    pub(crate) by: String,
    /// The subject, or the field's value as JSON; `''` for any.
    pub(crate) key: std::result::Result<String, String>,
}

/// Checks a payload path as [`EventMatch::field`] and
/// [`crate::AppendCondition::field`] make it (`$.` and a key, or keys
/// joined by dots).
pub(crate) fn check_field_path(path: &str) -> Result<()> {
    let keys = path.strip_prefix("$.").unwrap_or(path);
    if keys.is_empty() || keys.split('.').any(str::is_empty) {
        return Err(Error::invalid(
            "field",
            format!("{keys:?}: a key, or keys joined by dots"),
        ));
    }
    limits::check_json_path("field", path)
}

impl EventMatch {
    /// Any event of this type in this workspace.
    pub fn new(workspace: impl Into<String>, event_type: impl Into<String>) -> EventMatch {
        EventMatch {
            workspace: workspace.into(),
            event_type: event_type.into(),
            by: String::new(),
            key: Ok(String::new()),
        }
    }

    /// Only events with this subject.
    pub fn subject(mut self, subject: impl Into<String>) -> EventMatch {
        self.by = "subject".into();
        self.key = Ok(subject.into());
        self
    }

    /// Only events whose payload holds `value` at `field`: a key of the
    /// payload's top object, or a dotted path into nested objects
    /// (`"session.id"`). Values compare as JSON: a string, a number written
    /// the same way, a boolean.
    pub fn field<T: Serialize>(mut self, field: &str, value: T) -> EventMatch {
        self.by = format!("$.{field}");
        self.key = serde_json::to_string(&value).map_err(|e| e.to_string());
        self
    }

    /// The workspace it looks in.
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// The event type it waits for.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    pub(crate) fn check(&self) -> Result<&str> {
        limits::check_name("workspace", &self.workspace)?;
        limits::check_name("event type", &self.event_type)?;
        let key = self
            .key
            .as_deref()
            .map_err(|m| Error::Encode { message: m.clone() })?;
        if self.by == "subject" {
            limits::check_text("subject", key, limits::MAX_SUBJECT_BYTES)?;
        } else if self.by.starts_with("$.") {
            check_field_path(&self.by)?;
            if key.len() > limits::MAX_SUBJECT_BYTES {
                return Err(Error::invalid(
                    "field value",
                    format!(
                        "{} bytes of JSON, longer than {}",
                        key.len(),
                        limits::MAX_SUBJECT_BYTES
                    ),
                ));
            }
        }
        Ok(key)
    }

    /// The key an event (subject, payload) holds for a match by `by`: what
    /// a wait of its workspace and type must hold to match it.
    pub(crate) fn key_of(by: &str, subject: &str, payload: &serde_json::Value) -> Option<String> {
        if by.is_empty() {
            return Some(String::new());
        }
        if by == "subject" {
            return Some(subject.to_string());
        }
        let mut at = payload;
        for key in by.strip_prefix("$.")?.split('.') {
            at = at.get(key)?;
        }
        serde_json::to_string(at).ok()
    }

    /// What it waits for, as operators read it.
    pub(crate) fn describe(&self) -> serde_json::Value {
        let mut d = serde_json::json!({
            "workspace": self.workspace,
            "type": self.event_type,
        });
        match (self.by.as_str(), &self.key) {
            ("", _) => {}
            ("subject", Ok(s)) => d["subject"] = s.clone().into(),
            (path, Ok(k)) => {
                d["field"] = path.trim_start_matches("$.").into();
                d["value"] = serde_json::from_str(k).unwrap_or(serde_json::Value::Null);
            }
            _ => {}
        }
        d
    }
}
