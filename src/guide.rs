//! The guides: the manual, a chapter a page. Each is a page of
//! `docs/guide/` included here, so `cargo doc --open` shows it beside the
//! API it describes and every Rust block in it is a doctest that `cargo test`
//! compiles and runs (a block marked `no_run` needs a server and says so).
//!
//! | guide | what it covers |
//! | --- | --- |
//! | [`log`] | the change log and cursors: workspaces, events, appends with the application's rows, reads, leases, the writer, settings |
//! | [`rules`] | rules and runs: deciding exactly once, acting at least once, retries, scopes, replays, threads and tests |
//! | [`event_store`] | the log as an event store: expected versions, conditional appends, a subject's stream, upcasters, rule versions in shadow |
//! | [`jobs`] | the jobs loop: reactions, deliveries on channels, scheduled jobs, pruning |
//! | [`control`] | control of the work: enqueue, pause, cancel, unique runs, priorities, limits, operators' interventions |
//! | [`flow_control`] | flow control by key: fair shares across keys, per-key limits and weights, debounce, batch actions |
//! | [`workflows`] | durable workflows: steps recorded once, durable sleeps, waits on the log, child runs, changing code while runs sleep |
//! | [`followers`] | followers: one workspace into another, of this file or another, with the same ids |
//! | [`operating`] | operating: the `reflexr` CLI, the administration server over HTTP, the web console, MCP |
//! | [`observability`] | observability: what a run logged and how far it got, OpenTelemetry traces and metrics (features `otel`, `otlp`) |
//! | [`postgres`] | PostgreSQL and scaling out: the same engine on a server database, an edge relaying into a hub |
//! | [`file`](mod@file) | the file and its schema: pragmas, what opening refuses, the views to read it with `sqlite3` |
//! | [`performance`] | performance: the bench, its stages and ratios, what profiling changed |
//! | [`guarantees`] | guarantees and the tests that prove them; failures and what each leaves |

// Each page's links to the others, as rustdoc resolves them: a reference
// definition that comes first wins, so these stand in for the pages' own
// `[rules]: rules.md` (which GitHub follows).
macro_rules! guide {
    ($(#[$meta:meta])* $name:ident, $file:literal) => {
        #[doc = "[log]: crate::guide::log\n[rules]: crate::guide::rules\n\
                 [jobs]: crate::guide::jobs\n[control]: crate::guide::control\n\
                 [followers]: crate::guide::followers\n[workflows]: crate::guide::workflows\n[operating]: crate::guide::operating\n\
                 [postgres]: crate::guide::postgres\n[file]: mod@crate::guide::file\n\
                 [event-store]: crate::guide::event_store\n[flow-control]: crate::guide::flow_control\n\
                 [performance]: crate::guide::performance\n[guarantees]: crate::guide::guarantees\n\
                 [observability]: crate::guide::observability\n"]
        #[doc = include_str!(concat!("../docs/guide/", $file))]
        $(#[$meta])*
        pub mod $name {}
    };
}

guide!(log, "log.md");
guide!(rules, "rules.md");
guide!(event_store, "event-store.md");
guide!(jobs, "jobs.md");
guide!(control, "control.md");
guide!(flow_control, "flow-control.md");
guide!(workflows, "workflows.md");
guide!(followers, "followers.md");
guide!(operating, "operating.md");
guide!(observability, "observability.md");
guide!(postgres, "postgres.md");
guide!(file, "file.md");
guide!(performance, "performance.md");
guide!(guarantees, "guarantees.md");
