//! `/metrics`: the engine's counters and gauges in Prometheus's text format
//! (0.0.4), named by its conventions — units in names, `_total` for
//! counters. The totals are read from the file, so every process that
//! serves them reports the same numbers; the writer's are this process's.

use std::fmt::Write;

use reflexr::Engine;
use reflexr::Result;
use reflexr::RunState;
use reflexr::inspect::Counter;
use reflexr::inspect::DeadLetterKind;

/// A counter's metric name and help.
fn counter_metric(c: Counter) -> (&'static str, &'static str) {
    match c {
        Counter::Decisions => (
            "reflexr_rule_decisions_total",
            "Events of a watched type rules decided on.",
        ),
        Counter::Fired => ("reflexr_rule_firings_total", "Decisions that fired a run."),
        Counter::Errored => (
            "reflexr_rule_errors_total",
            "Decisions that failed (RuleErrored).",
        ),
        Counter::ReplayExisting => (
            "reflexr_rule_replay_existing_total",
            "Firings a replay found made before and did not make again.",
        ),
        Counter::ReplayKept => (
            "reflexr_rule_replay_kept_total",
            "Firings made before that a replay no longer makes, kept.",
        ),
        Counter::RunsSucceeded => ("reflexr_runs_succeeded_total", "Runs that succeeded."),
        Counter::RunsRetried => (
            "reflexr_runs_retried_total",
            "Failed attempts that will be retried.",
        ),
        Counter::RunsDead => ("reflexr_runs_dead_total", "Runs dead-lettered."),
        Counter::ClaimsRescued => (
            "reflexr_claims_rescued_total",
            "Claims whose executor stopped renewing them, made claimable again.",
        ),
        Counter::Reacted => (
            "reflexr_reactions_handled_total",
            "Events reactions handled.",
        ),
        Counter::ReactionErrors => (
            "reflexr_reaction_errors_total",
            "Events whose reaction handler failed.",
        ),
        Counter::Deliveries => ("reflexr_deliveries_enqueued_total", "Deliveries enqueued."),
        Counter::Occurrences => (
            "reflexr_scheduled_occurrences_total",
            "Scheduled occurrences created.",
        ),
        Counter::ConsumerFailures => (
            "reflexr_consumer_failures_total",
            "Commits of rules, reactions and followers that failed.",
        ),
    }
}

/// A label value, escaped as the format wants.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let list: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
                .collect();
            let _ = write!(self.0, "{{{}}}", list.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }
}

/// The metrics, now.
pub(crate) fn render<B: reflexr::Backend>(e: &Engine<B>) -> Result<String> {
    let stats = e.stats()?;
    let leases = e.leases()?;
    let now = e.now_ms();
    let mut o = Out(String::new());

    o.head(
        "reflexr_events_appended_total",
        "counter",
        "Events appended to the file (the highest seq ever assigned).",
    );
    o.sample("reflexr_events_appended_total", &[], stats.events_appended);
    for &c in Counter::ALL {
        let (name, help) = counter_metric(c);
        o.head(name, "counter", help);
        o.sample(name, &[], stats.counter(c));
    }

    o.head("reflexr_runs", "gauge", "Runs in each state.");
    for &s in RunState::ALL {
        let n = stats.runs.get(&s).copied().unwrap_or(0);
        o.sample("reflexr_runs", &[("state", s.as_str())], n);
    }
    o.head(
        "reflexr_oldest_ready_run_age_seconds",
        "gauge",
        "How long the oldest ready run has waited since it became due (0: none waits).",
    );
    let age = stats
        .oldest_ready_due_at
        .map_or(0.0, |due| (now - due).max(0) as f64 / 1000.0);
    o.sample("reflexr_oldest_ready_run_age_seconds", &[], age);

    o.head(
        "reflexr_dead_letters_open",
        "gauge",
        "Dead letters not yet retried or discarded, by kind.",
    );
    for &k in DeadLetterKind::ALL {
        let n = stats.dead_letters.get(&k).copied().unwrap_or(0);
        o.sample("reflexr_dead_letters_open", &[("kind", k.as_str())], n);
    }

    o.head(
        "reflexr_lanes_blocked",
        "gauge",
        "Scopes held behind a dead run until an operator acts.",
    );
    o.sample("reflexr_lanes_blocked", &[], stats.blocked_lanes);

    o.head(
        "reflexr_cursor_lag_events",
        "gauge",
        "Events of its workspace after each consumer's cursor.",
    );
    for c in &stats.cursors {
        let labels = [
            ("workspace", c.workspace.as_str()),
            ("kind", c.kind.as_str()),
            ("name", c.name.as_str()),
        ];
        o.sample("reflexr_cursor_lag_events", &labels, c.lag);
    }
    o.head(
        "reflexr_cursor_failures",
        "gauge",
        "Commits that failed at each consumer's position (3 or more: stuck).",
    );
    for c in &stats.cursors {
        let labels = [
            ("workspace", c.workspace.as_str()),
            ("kind", c.kind.as_str()),
            ("name", c.name.as_str()),
        ];
        o.sample("reflexr_cursor_failures", &labels, c.failures);
    }

    o.head(
        "reflexr_lease_generation",
        "gauge",
        "Each lease's generation (its fencing token).",
    );
    for l in &leases {
        o.sample(
            "reflexr_lease_generation",
            &[("name", l.name.as_str())],
            l.generation,
        );
    }
    o.head(
        "reflexr_lease_held",
        "gauge",
        "1 while a lease is held (by its holder), 0 once it lapsed or was released.",
    );
    for l in &leases {
        let held = u8::from(l.expires_at > now);
        let labels = [("name", l.name.as_str()), ("holder", l.holder.as_str())];
        o.sample("reflexr_lease_held", &labels, held);
    }

    for (name, help) in [
        (
            "reflexr_follower_published_total",
            "Envelopes each follower published.",
        ),
        (
            "reflexr_follower_dead_letters_total",
            "Envelopes each follower dead-lettered.",
        ),
        (
            "reflexr_follower_stops_total",
            "Times each follower stopped.",
        ),
    ] {
        o.head(name, "counter", help);
        for f in &stats.followers {
            let v = match name {
                "reflexr_follower_published_total" => f.published,
                "reflexr_follower_dead_letters_total" => f.dead_letters,
                _ => f.stops,
            };
            o.sample(name, &[("follower", f.name.as_str())], v);
        }
    }

    let w = stats.writer;
    for (name, help, v) in [
        (
            "reflexr_writer_commits_total",
            "Transactions this process's writer committed.",
            w.commits,
        ),
        (
            "reflexr_writer_writes_total",
            "Callers' writes those transactions held (writes / commits: the mean batch).",
            w.writes,
        ),
        (
            "reflexr_writer_aborts_total",
            "Transactions this process's writer rolled back.",
            w.aborts,
        ),
    ] {
        o.head(name, "counter", help);
        o.sample(name, &[], v);
    }
    Ok(o.0)
}
