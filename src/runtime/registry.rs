//! What this process knows how to do: its registered rules, actions,
//! reactions, jobs and projections.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::base::event::{Event, RESERVED_TYPES};
use crate::core::db::Backend;
use crate::store::Sqlite;
use crate::work::follow::{ProjectionFn, same_event};
use crate::work::queue::run::{ActionFn, Actions, BatchFn};
use crate::work::reaction::Reaction;
use crate::work::rule::Rule;
use crate::work::schedule::Job;

/// The handlers of actions, reactions and jobs are the backend's (their
/// reads and writes are); projections are SQLite's for now (followers
/// relay from a file), and stay unused on another backend.
pub(crate) struct Registry<B: Backend = Sqlite> {
    pub rules: BTreeMap<String, Arc<Rule>>,
    /// Every handler executors run (see [`Actions`]); replaced whole when
    /// one is added, so executors take it with one `Arc` clone.
    pub actions: Arc<Actions<B>>,
    pub reactions: BTreeMap<String, Arc<Reaction<B>>>,
    pub jobs: BTreeMap<String, Arc<Job<B>>>,
    pub projections: BTreeMap<String, Arc<ProjectionFn>>,
}

impl<B: Backend> Default for Registry<B> {
    fn default() -> Self {
        let mut projections: BTreeMap<String, Arc<ProjectionFn>> = BTreeMap::new();
        // Every application envelope as it is; reflexr's own RuleFired and
        // RuleErrored bridge nothing (no workspace would take them).
        projections.insert(
            "same".into(),
            Arc::new(|e: &Event| {
                Ok((!RESERVED_TYPES.contains(&e.event_type.as_str())).then(|| same_event(e)))
            }),
        );
        Registry {
            rules: BTreeMap::new(),
            actions: Arc::default(),
            reactions: BTreeMap::new(),
            jobs: BTreeMap::new(),
            projections,
        }
    }
}

impl<B: Backend> Registry<B> {
    /// The workspaces some registered rule reads, by name.
    pub fn workspaces_with_rules(&self) -> Vec<String> {
        let mut v: Vec<String> = self.rules.values().map(|r| r.workspace.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// The registered rules of one workspace, by name.
    pub fn rules_of(&self, workspace: &str) -> Vec<Arc<Rule>> {
        self.rules
            .values()
            .filter(|r| r.workspace == workspace)
            .cloned()
            .collect()
    }

    /// Adds (or replaces) the handler of an action.
    pub fn add_action(&mut self, name: &str, handler: Arc<ActionFn<B>>) {
        self.actions = Arc::new(self.actions.with(name, handler));
    }

    /// Adds (or replaces) the handler of a batch action.
    pub fn add_batch_action(&mut self, name: &str, max: usize, handler: Arc<BatchFn<B>>) {
        self.actions = Arc::new(self.actions.with_batch(name, max, handler));
    }
}
