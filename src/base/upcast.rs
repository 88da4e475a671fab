//! Versioned event types and the upcasters that bring an old version's
//! payload to the current shape when the engine hands an event out.
//!
//! The convention: a type's first version is its plain name
//! (`session.changed`); version *n* ≥ 2 is the name with `.v<n>` after it
//! (`session.changed.v2`). A payload may gain a field within a version;
//! renaming or removing one makes a new version, a new type name, as the
//! change log's contract says. An upcaster turns version *n*'s payload into
//! version *n + 1*'s; registered for every version from 1 up, they chain,
//! and every reader is handed the newest version only: its type name and
//! its payload's shape. What is stored stays as it was written (the
//! `sqlite3` view and the operators' pages show it so).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::base::limits;

/// What an upcaster does: version *n*'s payload in, version *n + 1*'s out.
type UpcastFn = dyn Fn(serde_json::Value) -> serde_json::Value + Send + Sync;

/// The upcasters an engine applies, by the stored type each reads.
#[derive(Clone, Default)]
pub struct Upcasters {
    /// A type name to the next version's name and the upcaster to it.
    next: BTreeMap<String, (String, Arc<UpcastFn>)>,
    /// The first registration that was refused (reported when the engine
    /// opens: a builder's methods chain).
    refused: Option<Error>,
}

impl std::fmt::Debug for Upcasters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.next.iter().map(|(from, (to, _))| (from, to)))
            .finish()
    }
}

/// The name of version `version` of `base` (`base` itself for version 1).
pub fn versioned_type(base: &str, version: u32) -> String {
    if version <= 1 {
        base.to_string()
    } else {
        format!("{base}.v{version}")
    }
}

/// A type name's base and version: `("session.changed", 2)` for
/// `session.changed.v2`, version 1 for a name without the suffix.
pub fn type_version(event_type: &str) -> (&str, u32) {
    if let Some((base, v)) = event_type.rsplit_once(".v")
        && !base.is_empty()
        && !v.starts_with('0')
        && let Ok(n) = v.parse::<u32>()
        && n >= 2
    {
        return (base, n);
    }
    (event_type, 1)
}

impl Upcasters {
    /// Registers `f`, turning version `from` of `base` into version
    /// `from + 1`. Version 1's upcaster first, then each next: a chain with
    /// a gap is refused, as a second upcaster for the same version.
    pub(crate) fn register(&mut self, base: &str, from: u32, f: Arc<UpcastFn>) {
        if self.refused.is_some() {
            return;
        }
        if let Err(e) = self.try_register(base, from, f) {
            self.refused = Some(e);
        }
    }

    fn try_register(&mut self, base: &str, from: u32, f: Arc<UpcastFn>) -> Result<()> {
        limits::check_name("event type", base)?;
        if type_version(base).1 != 1 {
            return Err(Error::invalid(
                "upcaster",
                format!("{base:?}: name the type's first version (without .v<n>)"),
            ));
        }
        if from == 0 || from == u32::MAX {
            return Err(Error::invalid(
                "upcaster",
                format!("{base} version {from}: versions count from 1"),
            ));
        }
        let stored = versioned_type(base, from);
        let to = versioned_type(base, from + 1);
        limits::check_name("event type", &to)?;
        if self.next.contains_key(&stored) {
            return Err(Error::AlreadyExists {
                kind: "upcaster",
                name: format!("{stored} -> {to}"),
            });
        }
        if from > 1 && !self.next.contains_key(&versioned_type(base, from - 1)) {
            return Err(Error::invalid(
                "upcaster",
                format!(
                    "{stored} -> {to}: register {} -> {stored} first",
                    versioned_type(base, from - 1)
                ),
            ));
        }
        self.next.insert(stored, (to, f));
        Ok(())
    }

    /// The registration refused, if any.
    pub(crate) fn refused(&self) -> Option<&Error> {
        self.refused.as_ref()
    }

    /// True when no upcaster is registered (every read skips the work).
    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    /// The newest version's name for a stored type (the type itself when no
    /// upcaster reads it).
    pub fn current(&self, event_type: &str) -> String {
        let mut at = event_type;
        while let Some((to, _)) = self.next.get(at) {
            at = to;
        }
        at.to_string()
    }

    /// `event` as readers get it: upcast through the chain to the newest
    /// version of its type, its payload in that version's shape. Never
    /// written back.
    pub fn apply(&self, event: &mut Event) {
        if self.next.is_empty() || !self.next.contains_key(&event.event_type) {
            return;
        }
        let mut value: serde_json::Value = match serde_json::from_str(&event.payload) {
            Ok(v) => v,
            // The engine never stored one; an upcaster has nothing to read.
            Err(_) => return,
        };
        while let Some((to, f)) = self.next.get(&event.event_type) {
            value = f(value);
            event.event_type.clone_from(to);
        }
        event.payload = value.to_string();
        event.parsed = Default::default();
    }

    /// [`Upcasters::apply`] to each event.
    pub fn apply_all(&self, events: &mut [Event]) {
        if self.next.is_empty() {
            return;
        }
        for e in events {
            self.apply(e);
        }
    }

    /// The stored types a filter on `types` (as readers see them) must read:
    /// each type and every older version that upcasts to it. A type that is
    /// itself upcast on read is never handed out, so it matches nothing.
    /// `None` when nothing can match (so the empty list, which means every
    /// type, is not what is read).
    pub fn stored_types(&self, types: &[String]) -> Option<Vec<String>> {
        if self.next.is_empty() || types.is_empty() {
            return Some(types.to_vec());
        }
        let mut stored: Vec<String> = Vec::new();
        for t in types {
            if !self.next.contains_key(t) {
                stored.push(t.clone());
            }
            for from in self.next.keys() {
                if self.current(from) == *t {
                    stored.push(from.clone());
                }
            }
        }
        stored.sort();
        stored.dedup();
        (!stored.is_empty()).then_some(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_suffixes_parse() {
        assert_eq!(type_version("session.changed"), ("session.changed", 1));
        assert_eq!(type_version("session.changed.v2"), ("session.changed", 2));
        assert_eq!(type_version("session.changed.v12"), ("session.changed", 12));
        assert_eq!(type_version("a.v1"), ("a.v1", 1));
        assert_eq!(type_version("a.v02"), ("a.v02", 1));
        assert_eq!(type_version("a.video"), ("a.video", 1));
        assert_eq!(versioned_type("x", 1), "x");
        assert_eq!(versioned_type("x", 3), "x.v3");
    }

    #[test]
    fn a_chain_registers_in_order_and_maps_old_names_to_the_newest() {
        let id: Arc<UpcastFn> = Arc::new(|v| v);
        let mut u = Upcasters::default();
        u.register("t", 2, id.clone());
        assert!(u.refused().is_some(), "a gap is refused");
        let mut u = Upcasters::default();
        u.register("t", 1, id.clone());
        u.register("t", 2, id.clone());
        assert!(u.refused().is_none());
        assert_eq!(u.current("t"), "t.v3");
        assert_eq!(u.current("t.v2"), "t.v3");
        assert_eq!(
            u.stored_types(&["t.v3".into()]),
            Some(vec!["t".into(), "t.v2".into(), "t.v3".into()])
        );
        assert_eq!(u.stored_types(&["t.v2".into()]), None);
        u.register("t", 1, id);
        assert!(
            u.refused()
                .is_some_and(|e| e.to_string().contains("already"))
        );
    }
}
