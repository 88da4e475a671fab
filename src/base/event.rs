//! Events: what an application appends ([`NewEvent`]), what a reader gets back
//! ([`Event`]), and the question a reader asks ([`Query`]).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::base::error::{Error, Result};

/// The types only the engine appends. An application's append of one is
/// refused with [`Error::ReservedType`].
pub const RESERVED_TYPES: [&str; 2] = ["RuleFired", "RuleErrored"];

/// An event as stored in the log (the envelope). Serialises with its type
/// as `type` and its payload as the JSON it holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Event {
    /// The file-wide position, assigned at append, strictly increasing in
    /// commit order, never reused.
    pub seq: i64,
    /// The event's id, unique within its workspace.
    pub id: String,
    /// The workspace (log) the event belongs to.
    pub workspace: String,
    /// The event's type, registered for the workspace.
    #[serde(rename = "type")]
    pub event_type: String,
    /// What the event is about (e.g. `session/42`).
    pub subject: String,
    /// The event's place among its subject's events in its workspace:
    /// 1 for the subject's first event, one more for each after it, never
    /// reused (pruning does not lower it). What an append may expect
    /// ([`NewEvent::expect`]).
    pub version: i64,
    /// Who made the change.
    pub actor: String,
    /// When it happened, by the actor's clock (ms since the epoch).
    pub occurred_at: i64,
    /// When the engine recorded it, by the engine's clock (ms since the epoch).
    pub recorded_at: i64,
    /// The id of the event that caused this one, if any.
    pub causation_id: Option<String>,
    /// An id shared by the events of one conversation or workflow, if any.
    pub correlation_id: Option<String>,
    /// How many causes deep the event is in a chain: 0 for an application's
    /// own event, one more than its cause otherwise.
    pub depth: i64,
    /// The W3C trace context (`traceparent`) of the work that appended it,
    /// if it had one ([`NewEvent::traceparent`]): a run a rule fires for
    /// it, and the events that run emits, carry it on. Serialised only when
    /// present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(serialize_with = "crate::base::text::raw_json")]
    pub(crate) payload: String,
    /// The payload parsed, once, by the first [`Event::json`].
    #[serde(skip)]
    pub(crate) parsed: Parsed,
}

/// A payload's parse, kept beside its text: not part of the event's value
/// (equal events are equal whether or not either was parsed).
#[derive(Clone, Default)]
pub(crate) struct Parsed(std::sync::OnceLock<std::result::Result<serde_json::Value, String>>);

impl PartialEq for Parsed {
    fn eq(&self, _: &Parsed) -> bool {
        true
    }
}

impl Eq for Parsed {}

impl Parsed {
    /// Whether the payload was parsed (the parse is kept).
    #[cfg(test)]
    pub(crate) fn is_kept(&self) -> bool {
        self.0.get().is_some()
    }
}

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("..")
    }
}

impl Event {
    /// The payload decoded into `T`.
    ///
    /// # Errors
    /// [`Error::Decode`] when the payload does not fit `T`; the event itself
    /// is fine and stays readable as JSON.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.payload).map_err(|e| Error::Decode {
            what: format!("payload of event {} ({})", self.seq, self.event_type),
            seq: Some(self.seq),
            message: e.to_string(),
        })
    }

    /// An event as [`Event`]'s serialisation wrote it (a workflow's wait
    /// records the event it received so).
    pub(crate) fn from_json(json: &str) -> Result<Event> {
        let v: serde_json::Value = serde_json::from_str(json).map_err(|e| Error::Decode {
            what: "a recorded event".into(),
            seq: None,
            message: e.to_string(),
        })?;
        let bad = |field: &str| Error::Decode {
            what: "a recorded event".into(),
            seq: v["seq"].as_i64(),
            message: format!("no {field}"),
        };
        let text = |field: &str| -> Result<String> {
            v[field]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(field))
        };
        let int = |field: &str| v[field].as_i64().ok_or_else(|| bad(field));
        Ok(Event {
            seq: int("seq")?,
            id: text("id")?,
            workspace: text("workspace")?,
            event_type: text("type")?,
            subject: text("subject")?,
            // A wait recorded before events had versions: 0.
            version: v["version"].as_i64().unwrap_or(0),
            actor: text("actor")?,
            occurred_at: int("occurred_at")?,
            recorded_at: int("recorded_at")?,
            causation_id: v["causation_id"].as_str().map(str::to_string),
            correlation_id: v["correlation_id"].as_str().map(str::to_string),
            depth: int("depth")?,
            traceparent: v["traceparent"].as_str().map(str::to_string),
            payload: v["payload"].to_string(),
            parsed: Parsed::default(),
        })
    }

    /// The payload as JSON text, exactly as stored.
    pub fn payload_json(&self) -> &str {
        &self.payload
    }

    /// The payload as a JSON value.
    pub fn payload_value(&self) -> Result<serde_json::Value> {
        self.payload()
    }

    /// The payload as JSON, parsed once and kept with the event: every rule
    /// that looks at this event in a batch shares one parse (and
    /// `Scope::payload` uses it too). The cheapest way to read a few fields.
    ///
    /// ```
    /// # use reflexr::{Decision, Rule};
    /// let rule = Rule::new("big-orders", "shop")
    ///     .on(["order.placed"])
    ///     .action("review")
    ///     .decide(|e| {
    ///         let big = e.json()?["total"].as_f64().unwrap_or(0.0) > 1000.0;
    ///         Ok(if big { Decision::Fire(e.json()?.clone()) } else { Decision::Skip })
    ///     });
    /// ```
    ///
    /// # Errors
    /// [`Error::Decode`] when the stored text is not JSON (it always is in a
    /// file the engine wrote).
    pub fn json(&self) -> Result<&serde_json::Value> {
        self.parsed
            .0
            .get_or_init(|| serde_json::from_str(&self.payload).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| Error::Decode {
                what: format!("payload of event {} ({})", self.seq, self.event_type),
                seq: Some(self.seq),
                message: e.clone(),
            })
    }

    /// The payload's top-level field `name`: `Ok(None)` when the payload is
    /// not an object or has no such field (the last, if it has it twice, as
    /// [`Event::json`] keeps it), `Err` when the payload is not JSON. Read
    /// from the payload's one parse if [`Event::json`] made it; else the
    /// text is scanned for the field, the rest checked and skipped (a rule
    /// scoped by a field pays for no map of the whole payload), and parsed
    /// whole only where the scan cannot be sure of what the parse says.
    pub(crate) fn field(&self, name: &str) -> std::result::Result<Option<serde_json::Value>, ()> {
        if let Some(parsed) = self.parsed.0.get() {
            return parsed
                .as_ref()
                .map(|v| v.get(name).cloned())
                .map_err(|_| ());
        }
        // The common payload — an object of plain keys and values — by a
        // scan of its text; anything the scan is not sure of, by the full
        // parse (not kept: `Event::json` keeps its own).
        let value = match scan::field(&self.payload, name) {
            scan::Found::Missing => return Ok(None),
            scan::Found::Value(raw) => match scan::plain(raw) {
                Some(v) => Some(v),
                None => serde_json::from_str(raw).ok(),
            },
            scan::Found::Unsure => None,
        };
        match value {
            Some(v) => Ok(Some(v)),
            None => serde_json::from_str::<serde_json::Value>(&self.payload)
                .map(|v| v.get(name).cloned())
                .map_err(|_| ()),
        }
    }

    /// The payload's top-level field `name` as its text prints, when the
    /// scan is sure of it and the value is plain: a string without escapes
    /// (its text), an integer (its digits, as `u64`'s or `i64`'s
    /// `to_string` prints them) or a boolean. `Some(None)`: the payload is
    /// an object without the field. `None`: anything else, which
    /// [`Event::field`] reads. A rule scoped by a field takes its scope this
    /// way, with no JSON value made and printed again, whether or not the
    /// payload was parsed (a number read from the parse would be printed
    /// into a new string).
    pub(crate) fn plain_field_text(&self, name: &str) -> Option<Option<&str>> {
        match scan::field(&self.payload, name) {
            scan::Found::Missing => Some(None),
            scan::Found::Value(raw) => scan::plain_text(raw).map(Some),
            scan::Found::Unsure => None,
        }
    }
}

/// [`Event::field`]'s reader: a scan of the payload's text for one
/// top-level field of an object, checking the rest as it skips it (JSON's
/// grammar, RFC 8259, and what serde's parse adds: a number it reads as
/// finite). Where the text leaves it unsure of what the full parse would
/// say — an escape in a key, a `\u` escape of a surrogate, a control
/// character in a string, a document nested deeper than it follows, or text
/// that is not JSON at all — it says so, and the full parse decides. A rule
/// scoped by a field read its scope through serde's reader at 880
/// instructions an event, a fifth of the rule's evaluation.
mod scan {
    /// What the scan found of the field.
    #[derive(Debug, PartialEq)]
    pub(super) enum Found<'a> {
        /// The payload is an object without the field.
        Missing,
        /// The text of its value (its last, if it has it twice).
        Value(&'a str),
        /// Serde decides.
        Unsure,
    }

    /// Deeper than this, serde decides (its own limit is 128).
    const MAX_DEPTH: usize = 64;

    /// `name`'s value in the object `text` is.
    pub(super) fn field<'a>(text: &'a str, name: &str) -> Found<'a> {
        let b = text.as_bytes();
        let mut s = Scanner { b, i: 0 };
        let found = s.object_field(name.as_bytes());
        s.ws();
        match found {
            Some(found) if s.i == b.len() => match found {
                // The bytes around a value are ASCII: a char boundary.
                Some((from, to)) => Found::Value(&text[from..to]),
                None => Found::Missing,
            },
            _ => Found::Unsure,
        }
    }

    /// A value's text made a JSON value without serde, when it is plain
    /// ([`plain_text`]).
    pub(super) fn plain(raw: &str) -> Option<serde_json::Value> {
        let text = plain_text(raw)?;
        Some(match raw.as_bytes()[0] {
            b'"' => serde_json::Value::String(text.to_owned()),
            b't' => serde_json::Value::Bool(true),
            b'f' => serde_json::Value::Bool(false),
            _ => match text.parse::<u64>() {
                Ok(u) => u.into(),
                Err(_) => text.parse::<i64>().ok()?.into(),
            },
        })
    }

    /// The text a plain value prints as (a scope's text): a string without
    /// escapes (between its quotes), an integer serde reads as one — `u64`
    /// or `i64`, but `-0`, which serde reads as the float — (its digits,
    /// which are what the integer's `to_string` prints: the scan let no
    /// leading zero through), `true` or `false`. `raw` is a value the
    /// scan checked.
    pub(super) fn plain_text(raw: &str) -> Option<&str> {
        match raw.as_bytes().first()? {
            b'"' => {
                let inner = &raw[1..raw.len() - 1];
                (!inner.contains('\\')).then_some(inner)
            }
            b't' | b'f' => Some(raw),
            b'-' | b'0'..=b'9' if raw.bytes().skip(1).all(|c| c.is_ascii_digit()) => {
                let integer =
                    raw.parse::<u64>().is_ok() || raw.parse::<i64>().is_ok_and(|i| i != 0);
                integer.then_some(raw)
            }
            _ => None,
        }
    }

    struct Scanner<'b> {
        b: &'b [u8],
        i: usize,
    }

    impl Scanner<'_> {
        fn peek(&self) -> Option<u8> {
            self.b.get(self.i).copied()
        }

        fn ws(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }

        fn eat(&mut self, c: u8) -> Option<()> {
            (self.peek()? == c).then(|| self.i += 1)
        }

        /// The top-level object's `name`: `Some(None)` when it has no such
        /// key, `None` when unsure.
        fn object_field(&mut self, name: &[u8]) -> Option<Option<(usize, usize)>> {
            self.ws();
            let mut found = None;
            self.object(0, false, |key, value| {
                if key == name {
                    found = Some(value);
                }
            })?;
            Some(found)
        }

        /// Skips an object at `depth`, checked, telling `member` each key
        /// (between its quotes) and its value's bounds. With `escapes`
        /// false, a key with an escape is unsure.
        fn object(
            &mut self,
            depth: usize,
            escapes: bool,
            mut member: impl FnMut(&[u8], (usize, usize)),
        ) -> Option<()> {
            self.eat(b'{')?;
            self.ws();
            if self.eat(b'}').is_some() {
                return Some(());
            }
            loop {
                self.ws();
                let (k0, k1) = self.string(escapes)?;
                self.ws();
                self.eat(b':')?;
                self.ws();
                let from = self.i;
                self.value(depth + 1)?;
                member(&self.b[k0 + 1..k1 - 1], (from, self.i));
                self.ws();
                match self.peek()? {
                    b',' => self.i += 1,
                    b'}' => {
                        self.i += 1;
                        return Some(());
                    }
                    _ => return None,
                }
            }
        }

        /// Skips one value, checked.
        fn value(&mut self, depth: usize) -> Option<()> {
            if depth > MAX_DEPTH {
                return None;
            }
            match self.peek()? {
                b'"' => self.string(true).map(|_| ()),
                b'{' => self.object(depth, true, |_, _| {}),
                b'[' => {
                    self.i += 1;
                    self.ws();
                    if self.eat(b']').is_some() {
                        return Some(());
                    }
                    loop {
                        self.ws();
                        self.value(depth + 1)?;
                        self.ws();
                        match self.peek()? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                return Some(());
                            }
                            _ => return None,
                        }
                    }
                }
                b't' => self.literal(b"true"),
                b'f' => self.literal(b"false"),
                b'n' => self.literal(b"null"),
                b'-' | b'0'..=b'9' => self.number(),
                _ => None,
            }
        }

        fn literal(&mut self, word: &[u8]) -> Option<()> {
            self.b[self.i..]
                .starts_with(word)
                .then(|| self.i += word.len())
        }

        /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, and finite as
        /// a float when it is not a plain integer (serde refuses one that
        /// overflows).
        fn number(&mut self) -> Option<()> {
            let (b, from) = (self.b, self.i);
            let mut i = from;
            if b.get(i) == Some(&b'-') {
                i += 1;
            }
            match b.get(i)? {
                b'0' => i += 1,
                b'1'..=b'9' => i = digits(b, i + 1),
                _ => return None,
            }
            let mut plain = true;
            if b.get(i) == Some(&b'.') {
                plain = false;
                b.get(i + 1).filter(|c| c.is_ascii_digit())?;
                i = digits(b, i + 1);
            }
            if matches!(b.get(i), Some(b'e' | b'E')) {
                plain = false;
                i += 1;
                if matches!(b.get(i), Some(b'+' | b'-')) {
                    i += 1;
                }
                b.get(i).filter(|c| c.is_ascii_digit())?;
                i = digits(b, i);
            }
            self.i = i;
            if plain && i - from <= 18 {
                return Some(());
            }
            let text = std::str::from_utf8(&b[from..i]).ok()?;
            text.parse::<f64>().is_ok_and(f64::is_finite).then_some(())
        }

        /// Skips a string, checked: its bounds, quotes included. With
        /// `escapes` false, a string with an escape is unsure (a key that
        /// would have to be unescaped to compare); a `\\u` escape of a
        /// surrogate is unsure either way (serde checks their pairing).
        fn string(&mut self, escapes: bool) -> Option<(usize, usize)> {
            let (b, from) = (self.b, self.i);
            if b.get(from) != Some(&b'"') {
                return None;
            }
            let mut i = from + 1;
            loop {
                match *b.get(i)? {
                    b'"' => {
                        self.i = i + 1;
                        return Some((from, i + 1));
                    }
                    b'\\' if escapes => match *b.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' => {
                            let hex = b.get(i + 2..i + 6)?;
                            let mut code = 0u32;
                            for c in hex {
                                code = code * 16 + char::from(*c).to_digit(16)?;
                            }
                            if (0xD800..=0xDFFF).contains(&code) {
                                return None;
                            }
                            i += 6;
                        }
                        _ => return None,
                    },
                    0..=0x1F | b'\\' => return None,
                    _ => i += 1,
                }
            }
        }
    }

    /// The index past the ASCII digits of `b` from `i`.
    fn digits(b: &[u8], mut i: usize) -> usize {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    }
}

/// An event to append. The type, the subject, the actor and the time (by the
/// actor's clock) are required, so a call site cannot leave out who made the
/// change or when.
///
/// ```
/// # use reflexr::NewEvent;
/// # #[derive(serde::Serialize)] struct Changed { title: &'static str }
/// let event = NewEvent::new("session.changed", "session/42", "admin", 1_764_000_000_000)
///     .payload(&Changed { title: "Rust in anger" })
///     .correlation_id("req-7");
/// ```
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub(crate) event_type: String,
    pub(crate) subject: String,
    pub(crate) actor: String,
    pub(crate) occurred_at: i64,
    /// The payload as JSON text, or the reason it could not be encoded; the
    /// reason is reported by the append, so building an event can chain.
    pub(crate) payload: std::result::Result<String, String>,
    pub(crate) id: Option<String>,
    pub(crate) causation_id: Option<String>,
    pub(crate) correlation_id: Option<String>,
    pub(crate) traceparent: Option<String>,
    pub(crate) expected: Expected,
}

/// What an append expects of its event's subject before it (optimistic
/// concurrency, DESIGN.md invariant 13). An expectation that does not hold
/// fails the append with [`Error::AppendConflict`], which carries the
/// subject's actual version, and nothing of the write commits.
///
/// The usual loop: read the subject ([`crate::Engine::read_subject`]),
/// decide, append expecting the version read, and on a conflict read again.
///
/// ```
/// # use reflexr::{Expected, NewEvent};
/// let ev = NewEvent::new("cart.item_added", "cart/7", "web", 1_764_000_000_000)
///     .expect(Expected::Version(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "expect", content = "version")]
pub enum Expected {
    /// Whatever the subject's version (the default).
    #[default]
    Any,
    /// The subject has no events yet (its version is 0).
    NoEvents,
    /// The subject has at least one event.
    Exists,
    /// The subject is exactly at this version: its last event is the
    /// `n`th (0 is the same as [`Expected::NoEvents`]).
    Version(i64),
}

impl Expected {
    /// Whether a subject at `version` meets the expectation.
    pub fn holds(self, version: i64) -> bool {
        match self {
            Expected::Any => true,
            Expected::NoEvents => version == 0,
            Expected::Exists => version > 0,
            Expected::Version(n) => version == n,
        }
    }
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expected::Any => f.write_str("any version"),
            Expected::NoEvents => f.write_str("no events yet"),
            Expected::Exists => f.write_str("at least one event"),
            Expected::Version(n) => write!(f, "version {n}"),
        }
    }
}

impl NewEvent {
    /// An event of `event_type` about `subject`, made by `actor` at
    /// `occurred_at` (ms since the epoch, by the actor's clock), with an empty
    /// object as its payload.
    pub fn new(
        event_type: impl Into<String>,
        subject: impl Into<String>,
        actor: impl Into<String>,
        occurred_at: i64,
    ) -> NewEvent {
        NewEvent {
            event_type: event_type.into(),
            subject: subject.into(),
            actor: actor.into(),
            occurred_at,
            payload: Ok("{}".into()),
            id: None,
            causation_id: None,
            correlation_id: None,
            traceparent: None,
            expected: Expected::Any,
        }
    }

    /// Appends only if the subject meets `expected` in the append's own
    /// transaction; otherwise the append fails with
    /// [`Error::AppendConflict`] and the whole write rolls back. Checked
    /// after the id: re-appending an id the workspace has already is a
    /// no-op that reports it, whatever the expectation (so a retried
    /// append that did commit is not a conflict).
    pub fn expect(mut self, expected: Expected) -> NewEvent {
        self.expected = expected;
        self
    }

    /// Shorthand for [`NewEvent::expect`] with [`Expected::Version`]:
    /// appends only if the subject is at `version` (0: no events yet).
    pub fn expect_version(self, version: i64) -> NewEvent {
        self.expect(Expected::Version(version))
    }

    /// Sets the payload to `value` encoded as JSON. A value serde cannot
    /// encode makes the append fail with [`Error::Encode`].
    pub fn payload<T: Serialize + ?Sized>(mut self, value: &T) -> NewEvent {
        self.payload = serde_json::to_string(value).map_err(|e| e.to_string());
        self
    }

    /// Sets the payload to JSON text. Text that is not JSON makes the append
    /// fail with [`Error::Invalid`].
    pub fn payload_json(mut self, json: impl Into<String>) -> NewEvent {
        self.payload = Ok(json.into());
        self
    }

    /// Sets the event's id. Without one, the append generates a time-ordered
    /// UUIDv7. Appending an id the workspace already has is a no-op that
    /// reports the existing event's seq.
    pub fn id(mut self, id: impl Into<String>) -> NewEvent {
        self.id = Some(id.into());
        self
    }

    /// Sets the id of the event that caused this one. When that event is in
    /// the same workspace, this one's depth is one more than its depth.
    pub fn causation_id(mut self, id: impl Into<String>) -> NewEvent {
        self.causation_id = Some(id.into());
        self
    }

    /// Sets the correlation id.
    pub fn correlation_id(mut self, id: impl Into<String>) -> NewEvent {
        self.correlation_id = Some(id.into());
        self
    }

    /// Records the W3C trace context of the work that appends this event
    /// (a `traceparent` header's value: `00-<32 hex trace id>-<16 hex
    /// parent id>-<2 hex flags>`, lowercase; checked at the append:
    /// [`crate::Error::Invalid`] otherwise). Kept with the event
    /// ([`Event::traceparent`], the `sqlite3` column
    /// `reflexr_events.traceparent`); a run a rule fires for the event
    /// carries it ([`crate::Run::traceparent`]), and so do the events that
    /// run emits and a follower relays.
    ///
    /// ```
    /// # use reflexr::NewEvent;
    /// let ev = NewEvent::new("order.placed", "order/7", "web", 1_764_000_000_000)
    ///     .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    /// ```
    pub fn traceparent(mut self, tp: impl Into<String>) -> NewEvent {
        self.traceparent = Some(tp.into());
        self
    }

    /// The event's type.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Appended {
    /// The event's seq: the new one, or the existing event's when the id was
    /// already in the workspace.
    pub seq: i64,
    /// The event's id (generated when the event had none).
    pub id: String,
    /// True when the workspace already had an event with this id and nothing
    /// was appended.
    pub existing: bool,
    /// The event's subject version ([`Event::version`]): the new one, or the
    /// existing event's.
    pub version: i64,
}

/// A condition across subjects for a write's appends: the write fails with
/// [`Error::AppendConflict`] if an event that matches came after `after`,
/// the position the caller decided from (what the "dynamic consistency
/// boundary" designs call an append condition). Checked with
/// [`crate::Tx::check`] inside the write, whose appends then commit only if
/// no such event was appended meanwhile.
///
/// ```
/// # use reflexr::AppendCondition;
/// // No seat of flight LH-400 was booked after seq 1200.
/// let cond = AppendCondition::new("booking")
///     .types(["seat.booked"])
///     .field("flight", "LH-400")
///     .after(1200);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AppendCondition {
    pub(crate) workspace: String,
    pub(crate) types: Vec<String>,
    pub(crate) subject: Option<String>,
    /// A payload path (`$.a.b`) and the value's JSON, or why it did not
    /// encode.
    pub(crate) field: Option<(String, std::result::Result<String, String>)>,
    pub(crate) after: i64,
}

impl AppendCondition {
    /// Any event of `workspace` after seq 0 (narrow it with the methods
    /// below).
    pub fn new(workspace: impl Into<String>) -> AppendCondition {
        AppendCondition {
            workspace: workspace.into(),
            types: Vec::new(),
            subject: None,
            field: None,
            after: 0,
        }
    }

    /// Only events of these types. Empty means every type.
    pub fn types<I, S>(mut self, types: I) -> AppendCondition
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.types = types.into_iter().map(Into::into).collect();
        self
    }

    /// Only events about `subject`.
    pub fn subject(mut self, subject: impl Into<String>) -> AppendCondition {
        self.subject = Some(subject.into());
        self
    }

    /// Only events whose payload holds `value` at `field` (a top-level key
    /// or a dotted path, compared as JSON, as [`crate::EventMatch::field`]).
    pub fn field<T: Serialize>(mut self, field: &str, value: T) -> AppendCondition {
        self.field = Some((
            format!("$.{field}"),
            serde_json::to_string(&value).map_err(|e| e.to_string()),
        ));
        self
    }

    /// Only events with a seq after `seq`: the position the caller's
    /// decision read up to (a read's last seq, or the head).
    pub fn after(mut self, seq: i64) -> AppendCondition {
        self.after = seq;
        self
    }

    /// The workspace it looks in.
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// The condition in words, for an error.
    pub(crate) fn describe(&self) -> String {
        let mut what = String::from("no event");
        if !self.types.is_empty() {
            what.push_str(&format!(" of type {}", self.types.join(" or ")));
        }
        if let Some(s) = &self.subject {
            what.push_str(&format!(" about {s:?}"));
        }
        if let Some((path, Ok(value))) = &self.field {
            what.push_str(&format!(" with {} = {value}", &path[2..]));
        }
        what.push_str(&format!(" after seq {}", self.after));
        what
    }
}

/// Which events to read: one workspace's, after a seq, optionally of some
/// types only, at most `limit` of them, in seq order.
///
/// ```
/// # use reflexr::Query;
/// let q = Query::new("shop").after(1200).types(["order.placed"]).limit(100);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub(crate) workspace: String,
    pub(crate) after: i64,
    pub(crate) types: Vec<String>,
    pub(crate) subject: Option<String>,
    pub(crate) limit: usize,
}

impl Query {
    /// The default page size.
    pub const DEFAULT_LIMIT: usize = 500;
    /// The largest page a read returns.
    pub const MAX_LIMIT: usize = 10_000;

    /// All of `workspace`'s events from the start, a page of
    /// [`Query::DEFAULT_LIMIT`] at a time.
    pub fn new(workspace: impl Into<String>) -> Query {
        Query {
            workspace: workspace.into(),
            after: 0,
            types: Vec::new(),
            subject: None,
            limit: Self::DEFAULT_LIMIT,
        }
    }

    /// Only events with `seq > after` (a cursor's position).
    pub fn after(mut self, seq: i64) -> Query {
        self.after = seq;
        self
    }

    /// Only events of these types. Empty means every type.
    pub fn types<I, S>(mut self, types: I) -> Query
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.types = types.into_iter().map(Into::into).collect();
        self
    }

    /// Only events about `subject`. [`crate::Engine::read`] looks through
    /// the workspace after `after` until the page is full; for a rare
    /// subject in a long log, [`crate::Engine::events_page`] looks through a
    /// bounded stretch at a time.
    pub fn subject(mut self, subject: impl Into<String>) -> Query {
        self.subject = Some(subject.into());
        self
    }

    /// At most `limit` events (1 to [`Query::MAX_LIMIT`]).
    pub fn limit(mut self, limit: usize) -> Query {
        self.limit = limit;
        self
    }

    /// The workspace read.
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    pub(crate) fn validate(&self) -> Result<()> {
        crate::base::limits::check_name("workspace", &self.workspace)?;
        if self.after < 0 {
            return Err(Error::invalid("after", "a seq is never negative"));
        }
        if self.limit == 0 || self.limit > Self::MAX_LIMIT {
            return Err(Error::invalid(
                "limit",
                format!("must be 1 to {}, got {}", Self::MAX_LIMIT, self.limit),
            ));
        }
        for t in &self.types {
            crate::base::limits::check_name("event type", t)?;
        }
        if let Some(s) = &self.subject {
            crate::base::limits::check_text("subject", s, crate::base::limits::MAX_SUBJECT_BYTES)?;
        }
        Ok(())
    }
}

/// For the crate's tests: an event of seq 1 with `payload` (not checked).
#[cfg(test)]
pub(crate) fn event_for_test(payload: &str) -> Event {
    Event {
        seq: 1,
        id: "e".into(),
        workspace: "w".into(),
        event_type: "t".into(),
        subject: "s".into(),
        version: 1,
        actor: "a".into(),
        occurred_at: 0,
        recorded_at: 0,
        causation_id: None,
        correlation_id: None,
        depth: 0,
        traceparent: None,
        payload: payload.into(),
        parsed: Parsed::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(payload: &str) -> Event {
        event_for_test(payload)
    }

    /// What `field` must say: what the full parse says.
    fn by_parse(payload: &str, name: &str) -> std::result::Result<Option<serde_json::Value>, ()> {
        serde_json::from_str::<serde_json::Value>(payload)
            .map(|v| v.get(name).cloned())
            .map_err(|_| ())
    }

    /// What `plain_field_text` must say when it answers: the full parse's
    /// value as a scope prints it (a string's text, an integer's digits, a
    /// boolean), or that the payload is an object without the field.
    fn plain_agrees(payload: &str, name: &str) -> bool {
        let e = event(payload);
        let Some(found) = e.plain_field_text(name) else {
            return true;
        };
        let parsed = by_parse(payload, name);
        match (found, parsed) {
            (None, Ok(None)) => {
                serde_json::from_str::<serde_json::Value>(payload).is_ok_and(|v| v.is_object())
            }
            (Some(text), Ok(Some(v))) => match v {
                serde_json::Value::String(s) => s == text,
                serde_json::Value::Bool(b) => b.to_string() == text,
                serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => u.to_string() == text,
                    (None, Some(i)) => i.to_string() == text,
                    (None, None) => false,
                },
                _ => false,
            },
            _ => false,
        }
    }

    #[test]
    fn a_field_read_alone_is_what_the_whole_parse_finds() {
        // Invariant 4 (exact decisions): a rule's scope read from one field
        // is the scope the payload's full parse gives, for every shape of
        // payload, without the parse.
        for payload in [
            r#"{"session": 7, "n": 1}"#,
            r#"{"n": {"session": 1}, "session": "x"}"#,
            r#"{"session": 1, "session": 2}"#,
            r#"{"se\u0073sion": true}"#,
            r#"{"other": [1, {"session": 3}]}"#,
            r#"[{"session": 1}]"#,
            r#""session""#,
            "12",
            "null",
            r#"{"session": 1} trailing"#,
            r#"{"session": 1, "n": }"#,
            "",
            // What the scan reads itself, and what it leaves to serde.
            " {\t\"session\" :\r\n\"a b\" } ",
            r#"{"session": "a\"b", "n": "\u00e9\n"}"#,
            r#"{"session": "\ud83d\ude00"}"#,
            r#"{"session": "\ud83d"}"#,
            r#"{"n": "\udc00", "session": 1}"#,
            r#"{"session": -0, "n": 01}"#,
            r#"{"session": -0}"#,
            r#"{"session": 1.50, "n": 1e3}"#,
            r#"{"session": 1E+2}"#,
            r#"{"session": 18446744073709551615}"#,
            r#"{"session": 18446744073709551616}"#,
            r#"{"session": -9223372036854775808}"#,
            r#"{"session": -9223372036854775809}"#,
            r#"{"session": 1., "n": 2}"#,
            r#"{"session": .5}"#,
            r#"{"session": tru}"#,
            r#"{"session": null}"#,
            r#"{"session": false, "n": [true, null, {}, []]}"#,
            r#"{"session": [1, 2], "n": {"a": {"b": [{}]}}}"#,
            r#"{"session": 1,}"#,
            r#"{"session": 1 "n": 2}"#,
            r#"{,"session": 1}"#,
            r#"{"session" 1}"#,
            r#"{"session": "tab	inside"}"#,
            r#"{"session": "\x"}"#,
            r#"{"session": "\u12"}"#,
            r#"{"session": "unterminated}"#,
            r#"{"session": 1"#,
            "{}",
            "{ }",
            &format!(
                r#"{{"n": {}1{}, "session": 2}}"#,
                "[".repeat(100),
                "]".repeat(100)
            ),
            &format!(
                r#"{{"n": {}1{}, "session": 2}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
        ] {
            let e = event(payload);
            assert_eq!(
                e.field("session"),
                by_parse(payload, "session"),
                "{payload}"
            );
            assert!(plain_agrees(payload, "session"), "{payload}: plain text");
            assert!(e.parsed.0.get().is_none(), "{payload}: parsed whole");
            // Once parsed, the parse answers.
            let _ = e.json();
            assert_eq!(
                e.field("session"),
                by_parse(payload, "session"),
                "{payload}"
            );
        }
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            "[a-c\\\"é]{0,4}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::vec(("[a-c]{1,2}", inner), 0..4)
                    .prop_map(|kv| { serde_json::Value::Object(kv.into_iter().collect()) }),
            ]
        })
    }

    proptest! {
        /// Invariant 4 (exact decisions), by property: for any JSON value and
        /// key, the field read alone is what the full parse finds.
        #[test]
        fn any_payload_gives_the_same_field_read_alone_or_parsed(v in json(), name in "[a-c]{1,2}") {
            let payload = v.to_string();
            let e = event(&payload);
            prop_assert_eq!(e.field(&name), by_parse(&payload, &name));
            prop_assert!(plain_agrees(&payload, &name), "plain text of {}", payload);
        }

        /// The same for text that is JSON laid out otherwise, or not quite
        /// JSON: a serialised value with a character put in, taken out or
        /// replaced somewhere (whitespace, a quote, a backslash, a digit,
        /// a bracket, a letter, an escape) — what the scan reads itself and
        /// what it leaves to serde both agree with the full parse.
        #[test]
        fn any_text_near_json_gives_the_same_field_read_alone_or_parsed(
            v in json(),
            name in "[a-c]{1,2}",
            at in any::<prop::sample::Index>(),
            edit in 0..3u8,
            with in prop::sample::select(vec![
                " ", "\n", "\"", "\\", "0", "-", ".", "e", "[", "]", "{", "}", ",", ":",
                "a", "\\u00e9", "\\ud800", "\u{1}", "é",
            ]),
        ) {
            let mut payload = v.to_string();
            let mut at = at.index(payload.len() + 1);
            while !payload.is_char_boundary(at) {
                at -= 1;
            }
            match edit {
                0 => payload.insert_str(at, with),
                1 if at < payload.len() => {
                    payload.remove(at);
                }
                _ => {
                    if at < payload.len() {
                        payload.remove(at);
                    }
                    payload.insert_str(at, with);
                }
            }
            let e = event(&payload);
            prop_assert_eq!(e.field(&name), by_parse(&payload, &name), "{}", payload);
            prop_assert!(plain_agrees(&payload, &name), "plain text of {}", payload);
        }
    }
}
