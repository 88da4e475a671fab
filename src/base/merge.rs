//! The merges of debounced runs' inputs ([`crate::Builder::merge_debounced`]):
//! what an enqueue with a debounce key makes of the pending run's input and
//! its own, by action (without one, the last input wins).

use std::collections::BTreeMap;
use std::sync::Arc;

/// A debounced action's merge of a pending run's input with the next
/// enqueue's.
pub(crate) type MergeFn =
    dyn Fn(serde_json::Value, serde_json::Value) -> serde_json::Value + Send + Sync;

/// The merges registered, by action.
#[derive(Clone, Default)]
pub(crate) struct Mergers(pub(crate) BTreeMap<String, Arc<MergeFn>>);

impl std::fmt::Debug for Mergers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}
