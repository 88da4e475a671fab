//! What this process knows how to do: its registered rules and actions.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::delivery::ChannelPolicy;
use crate::follow::ProjectionFn;
use crate::reaction::Reaction;
use crate::rule::Rule;
use crate::run::ActionFn;
use crate::schedule::Job;

pub(crate) struct Registry {
    pub rules: BTreeMap<String, Arc<Rule>>,
    /// Every handler executors run, by action name: rules' actions,
    /// `delivery/<channel>` senders, `job/<name>` jobs.
    pub actions: BTreeMap<String, Arc<ActionFn>>,
    pub reactions: BTreeMap<String, Arc<Reaction>>,
    pub jobs: BTreeMap<String, Arc<Job>>,
    pub channels: BTreeMap<String, ChannelPolicy>,
    pub projections: BTreeMap<String, Arc<ProjectionFn>>,
}

impl Default for Registry {
    fn default() -> Self {
        let mut projections: BTreeMap<String, Arc<ProjectionFn>> = BTreeMap::new();
        // Every application envelope as it is; reflexr's own RuleFired and
        // RuleErrored bridge nothing (no workspace would take them).
        projections.insert(
            "same".into(),
            Arc::new(|e: &crate::event::Event| {
                Ok(
                    (!crate::event::RESERVED_TYPES.contains(&e.event_type.as_str()))
                        .then(|| crate::follow::same_event(e)),
                )
            }),
        );
        Registry {
            rules: BTreeMap::new(),
            actions: BTreeMap::new(),
            reactions: BTreeMap::new(),
            jobs: BTreeMap::new(),
            channels: BTreeMap::new(),
            projections,
        }
    }
}

impl Registry {
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

    /// The registered action names as a JSON array, the form the claim takes.
    pub fn action_names_json(&self) -> String {
        let names: Vec<&String> = self.actions.keys().collect();
        serde_json::to_string(&names).expect("strings encode")
    }
}
