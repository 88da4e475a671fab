//! `reflexr`: the operator's tool over a reflexr file.
//!
//! Read commands (`status`, `events`, `tail`, `runs`, `runs show`, `runs steps`,
//! `dead-letters`, `stats`) read through WAL snapshots and never block the
//! application's writer. Write commands (`retry`, `discard`, `unblock`,
//! `reset-cursor`, `runs reset`, `prune`) go through the library's own checked, recorded operations, so
//! they hold to the same claims and leases as the application.
//!
//! Tables by default; `--json` for scripts (`tail --json` prints one JSON
//! object per line). Exit status: 0 on success, 1 when the operation failed or
//! was refused, 2 for a usage error. The file must exist: the tool never
//! creates one.
//!
//! # Cargo features
//!
#![doc = document_features::document_features!()]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use comfy_table::{Table, presets};
use reflexr::{Backend, ConsumerKind, Engine, Event, NewEvent, Query, Retention, RunState};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    name = "reflexr",
    version,
    about = "Inspect and operate a reflexr file (its log, cursors, leases, runs, dead letters)"
)]
struct Cli {
    /// The reflexr database file (it must exist); with the feature
    /// `postgres`, a PostgreSQL database instead: a `postgresql://` URL or
    /// a libpq string (`host=… dbname=…`).
    db: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug, Clone)]
struct Who {
    /// Who is acting, for the audit record (default: $USER).
    #[arg(long)]
    operator: Option<String>,
    /// Why, for the audit record.
    #[arg(long, default_value = "via the reflexr CLI")]
    reason: String,
}

impl Who {
    fn operator(&self) -> String {
        self.operator
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "reflexr-cli".into())
    }

    /// The engine's operator view, as this operator, for this reason.
    fn on<'e, B: Backend>(
        &self,
        engine: &'e Engine<B>,
    ) -> reflexr::Result<reflexr::Operator<'e, B>> {
        engine.operator(self.operator(), self.reason.clone())
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Workspaces, consumers with cursor and lag, leases, runs by state,
    /// dead letters by kind.
    Status,
    /// A workspace's events after a seq.
    Events {
        /// The workspace.
        #[arg(short, long)]
        workspace: String,
        /// Only events after this seq.
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Only events of these types.
        #[arg(short = 't', long = "type")]
        types: Vec<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Follows new events of a workspace as they are committed (by any
    /// process). Ctrl-C to stop.
    Tail {
        /// The workspace.
        #[arg(short, long)]
        workspace: String,
        /// Only events of these types.
        #[arg(short = 't', long = "type")]
        types: Vec<String>,
        /// Start from the beginning of the log instead of its head.
        #[arg(long)]
        from_start: bool,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Appends one event, as an application would (a correction, a
    /// script, a test); prints its seq and its subject version. An id
    /// already in the workspace appends nothing and says so. With
    /// --expect-version, appends only if the subject is at that version
    /// and otherwise fails with the actual one.
    Append {
        /// The workspace.
        #[arg(short, long)]
        workspace: String,
        /// The event's type (registered for the workspace).
        #[arg(short = 't', long = "type")]
        event_type: String,
        /// What it is about (e.g. session/42).
        #[arg(long)]
        subject: String,
        /// Who made the change (default: $USER).
        #[arg(long)]
        actor: Option<String>,
        /// The payload, as JSON.
        #[arg(long, default_value = "{}")]
        payload: String,
        /// The event's id (default: a new one).
        #[arg(long)]
        id: Option<String>,
        /// The id of the event that caused it.
        #[arg(long)]
        causation_id: Option<String>,
        /// The id shared by its conversation or workflow.
        #[arg(long)]
        correlation_id: Option<String>,
        /// Append only if the subject is at this version (0: it has no
        /// events yet); otherwise fail, appending nothing.
        #[arg(long, value_name = "N")]
        expect_version: Option<i64>,
    },
    /// Enqueues a run of an action (any process that registered the action
    /// runs it); prints its id.
    Enqueue {
        /// The action.
        action: String,
        /// Its arguments, as JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        /// Not before this long from now (e.g. 10m).
        #[arg(long = "in", value_parser = humantime::parse_duration)]
        delay: Option<std::time::Duration>,
        /// Its priority: higher is claimed first (default: the action's).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i64>,
        /// Runs of the action with the same scope run one at a time, in order.
        #[arg(long)]
        scope: Option<String>,
        /// A uniqueness key: no second run of the action with it while it holds.
        #[arg(long)]
        unique: Option<String>,
        /// How long the key holds: pending, active, or a period (e.g. 1h).
        #[arg(long, default_value = "active", requires = "unique")]
        unique_while: String,
    },
    /// Pauses an action, a channel, a scheduled job, a rule or a reaction,
    /// in every process on the file (recorded).
    Pause {
        /// action, channel, job, rule or reaction.
        kind: String,
        /// Its name.
        name: String,
        #[command(flatten)]
        who: Who,
    },
    /// Resumes what was paused (recorded).
    Resume {
        /// action, channel, job, rule or reaction.
        kind: String,
        /// Its name.
        name: String,
        #[command(flatten)]
        who: Who,
    },
    /// Cancels a run: a pending one at once; a running one is asked to stop
    /// and its completion refused (recorded).
    Cancel {
        /// The run id.
        run: String,
        #[command(flatten)]
        who: Who,
    },
    /// Sets an action's priority, limits and fairness, or with --key one
    /// key's limits and weight, kept in the file for every process
    /// (recorded). With an action and no option, lists its settings and its
    /// keys; without an action, every action's settings and what is paused.
    Limits {
        /// The action (none: list every action).
        action: Option<String>,
        /// Its runs' default priority.
        #[arg(long, allow_negative_numbers = true, requires = "action")]
        priority: Option<i64>,
        /// At most this many running at once, across every process (with
        /// --key: of the key's runs).
        #[arg(long, requires = "action")]
        max_running: Option<u32>,
        /// At most N starts per period, as N/PERIOD (e.g. 100/1m; with
        /// --key: of the key's runs).
        #[arg(long, requires = "action")]
        rate: Option<String>,
        /// Each limit counts per value of this input field (the run's key).
        #[arg(long, requires = "action")]
        partition_by: Option<String>,
        /// Claims serve the action's keys in turn, by weight, so a key with
        /// a large backlog does not hold back the others.
        #[arg(long, requires = "action")]
        fair: bool,
        /// Sets this key's own limits and weight instead of the action's
        /// (the action must be fair or partitioned); what is not given
        /// stays as the key had it.
        #[arg(long, requires = "action", conflicts_with_all = ["priority", "partition_by", "fair"])]
        key: Option<String>,
        /// The key's share in a fair claim: served W runs to a weight-1
        /// key's one (default 1).
        #[arg(long, requires = "key")]
        weight: Option<u32>,
        /// Clears the key's own limits and weight: it has the action's again.
        #[arg(long, requires = "key", conflicts_with_all = ["max_running", "rate", "weight"])]
        clear: bool,
        #[command(flatten)]
        who: Who,
    },
    /// Runs of the work queue, oldest first; `runs show` for one run with
    /// its progress and log, `runs steps` and `runs reset` for a workflow
    /// run's steps.
    #[command(args_conflicts_with_subcommands = true)]
    Runs {
        #[command(subcommand)]
        command: Option<RunsCommand>,
        /// Only runs in this state (waiting, ready, running, succeeded, dead, discarded).
        #[arg(long)]
        state: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// The rules the file knows: each version live or in shadow, its
    /// cursor and lag, what a shadow would have fired; `rules promote` hands
    /// a rule over to its version in shadow.
    #[command(args_conflicts_with_subcommands = true)]
    Rules {
        #[command(subcommand)]
        command: Option<RulesCommand>,
    },
    /// Dead letters not yet resolved (all with --all), oldest first.
    DeadLetters {
        /// Resolved ones too.
        #[arg(long)]
        all: bool,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Retries a dead run (or what a dead letter gave up on), recorded.
    Retry {
        /// The run id.
        #[arg(required_unless_present = "dead_letter")]
        run: Option<String>,
        /// A dead letter's id instead.
        #[arg(long, conflicts_with = "run")]
        dead_letter: Option<i64>,
        #[command(flatten)]
        who: Who,
    },
    /// Discards a dead run (or resolves a dead letter without retrying), recorded.
    Discard {
        /// The run id.
        #[arg(required_unless_present = "dead_letter")]
        run: Option<String>,
        /// A dead letter's id instead.
        #[arg(long, conflicts_with = "run")]
        dead_letter: Option<i64>,
        #[command(flatten)]
        who: Who,
    },
    /// Lets a rule's scope blocked behind a dead run go on, recorded.
    Unblock {
        /// The rule.
        rule: String,
        /// The scope.
        scope: String,
        #[command(flatten)]
        who: Who,
    },
    /// Moves a consumer's cursor (backwards too), recorded. Asks first.
    ResetCursor {
        /// The workspace the cursor reads.
        #[arg(short, long)]
        workspace: String,
        /// The consumer's kind: app, rule, reaction, follower.
        #[arg(long, default_value = "app")]
        kind: String,
        /// The consumer.
        #[arg(long)]
        name: String,
        /// The seq to move it to.
        #[arg(long)]
        to: i64,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        who: Who,
    },
    /// Deletes events every cursor passed and finished work, older than given.
    Prune {
        /// Events recorded longer ago than this (e.g. 30d, 12h).
        #[arg(long, value_parser = humantime::parse_duration)]
        events_older_than: Option<Duration>,
        /// Finished runs and resolved dead letters older than this.
        #[arg(long, value_parser = humantime::parse_duration)]
        work_older_than: Option<Duration>,
        /// Rows per transaction.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        #[command(flatten)]
        who: Who,
    },
    /// Counters and gauges (the same as Engine::stats).
    Stats,
    /// Serves MCP over stdio (newline-delimited JSON-RPC) for an AI
    /// assistant: the operators' tools on this file. Nothing but protocol
    /// messages on stdout; logs on stderr.
    #[cfg(feature = "mcp")]
    Mcp {
        /// Leave out (and refuse) every tool that changes the file.
        #[arg(long)]
        read_only: bool,
        /// Who the audit log says made the changes.
        #[arg(long, default_value = "mcp")]
        operator: String,
    },
    /// Serves the administration API — REST, WebSocket streams, Prometheus
    /// metrics — on the file, beside the application, until interrupted.
    #[cfg(feature = "admin")]
    Serve {
        /// Where to listen (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: std::net::SocketAddr,
        /// A file holding the bearer token (its first line); or set
        /// REFLEXR_ADMIN_TOKEN. Required to listen off loopback.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Refuse every change (403); reads and streams only.
        #[arg(long)]
        read_only: bool,
        /// Also answer to this Host (a reverse proxy's name; `name` for any
        /// port, `name:port` for one). May be given several times. Without
        /// it, only localhost and the server's own addresses are answered.
        #[arg(long = "allow-host", value_name = "NAME")]
        allow_hosts: Vec<String>,
    },
    /// Asks a stopped follower to start again at its cursor, whichever
    /// process runs it (after its configuration was mended).
    RestartFollower {
        /// The follower's name.
        name: String,
        #[command(flatten)]
        who: Who,
    },
}

/// What `rules` does besides listing.
#[derive(Subcommand, Debug)]
enum RulesCommand {
    /// Promotes a rule's version in shadow, recorded: sets the handover
    /// position (printed), the further of the two versions' cursors. The
    /// live version decides up to it, the shadow after it; the process
    /// evaluating the workspace hands over once both reached it.
    Promote {
        /// The live rule's name.
        name: String,
        #[command(flatten)]
        who: Who,
    },
}

/// What `runs` does besides listing: one run, a workflow run's steps.
#[derive(Subcommand, Debug)]
enum RunsCommand {
    /// One run: its fields (state, action, attempt, due, last error, key…),
    /// how far its handler said it got, and the lines it logged, oldest
    /// first, across its attempts.
    Show {
        /// The run id.
        run: String,
    },
    /// A workflow run's timeline: its steps in the order its handler
    /// reached them, each with its kind, state, attempt, time and output
    /// size, and what a waiting step waits for and when it wakes.
    Steps {
        /// The run id.
        run: String,
    },
    /// Resets a workflow run to one of its steps, recorded: that step and
    /// every step after it are forgotten, and the run is ready to run them
    /// again with fresh attempts — what they did outside the file (a charge,
    /// a mail) may happen again. Asks first.
    Reset {
        /// The run id.
        run: String,
        /// The step to reset to, as `runs steps` names it.
        #[arg(long)]
        step: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        who: Who,
    },
}

fn main() -> ExitCode {
    env_logger::init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if reader_left(e.as_ref()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Fallible<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Writes a line on standard output, an error if it cannot: a reader that
/// went away (`reflexr … | head`) ends the command, quietly (see
/// [`reader_left`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*)
    };
}

/// Whether `e` says standard output's reader went away: the end a closed
/// pipe gives a C program by SIGPIPE, here met as an error and ended
/// quietly, after the engine shut down.
fn reader_left(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        let broken = match (
            e.downcast_ref::<std::io::Error>(),
            e.downcast_ref::<reflexr::Error>(),
        ) {
            (Some(io), _) => io.kind() == std::io::ErrorKind::BrokenPipe,
            (_, Some(reflexr::Error::Io { kind, .. })) => *kind == std::io::ErrorKind::BrokenPipe,
            _ => false,
        };
        if broken {
            return true;
        }
        at = e.source();
    }
    false
}

/// Whether `db` names a PostgreSQL database rather than a file.
fn is_postgres(db: &std::path::Path) -> bool {
    let text = db.to_string_lossy();
    text.starts_with("postgresql://") || text.starts_with("postgres://") || text.contains('=')
}

fn run(cli: &Cli) -> Fallible {
    let holder = format!("reflexr-cli-{}", std::process::id());
    if is_postgres(&cli.db) {
        #[cfg(feature = "postgres")]
        {
            let engine = Engine::builder_postgres(cli.db.to_string_lossy())
                .holder_id(holder)
                .open()?;
            return run_on(&engine, cli);
        }
        #[cfg(not(feature = "postgres"))]
        return Err("a PostgreSQL database needs reflexr built with the feature postgres".into());
    }
    let engine = Engine::builder(&cli.db)
        .create_if_missing(false)
        .holder_id(holder)
        .open()?;
    run_on(&engine, cli)
}

fn run_on<B: Backend>(engine: &Engine<B>, cli: &Cli) -> Fallible {
    let engine = engine.clone();
    match &cli.command {
        Command::Status => status(&engine, cli.json),
        Command::Events {
            workspace,
            after,
            types,
            limit,
        } => {
            let q = Query::new(workspace)
                .after(*after)
                .types(types)
                .limit(*limit);
            print_events(&engine.read(&q)?, cli.json)
        }
        Command::Tail {
            workspace,
            types,
            from_start,
            count,
        } => tail(&engine, workspace, types, *from_start, *count, cli.json),
        Command::Runs {
            command: Some(RunsCommand::Show { run }),
            ..
        } => show_run(&engine, run, cli.json),
        Command::Runs {
            command: Some(RunsCommand::Steps { run }),
            ..
        } => steps(&engine, run, cli.json),
        Command::Runs {
            command:
                Some(RunsCommand::Reset {
                    run,
                    step,
                    yes,
                    who,
                }),
            ..
        } => reset_run(&engine, run, step, *yes, who, cli.json),
        Command::Runs {
            command: None,
            state,
            limit,
        } => {
            let state = state.as_deref().map(str::parse::<RunState>).transpose()?;
            runs(&engine, state, *limit, cli.json)
        }
        Command::DeadLetters { all, limit } => dead_letters(&engine, *all, *limit, cli.json),
        Command::Rules { command: None } => rules(&engine, cli.json),
        Command::Rules {
            command: Some(RulesCommand::Promote { name, who }),
        } => {
            let at = who.on(&engine)?.promote_rule(name)?;
            if cli.json {
                outln!("{}", json!({ "ok": true, "action": "promoted", "at": at }))?;
            } else {
                outln!("promoting {name}: its version in shadow takes over after seq {at}")?;
            }
            Ok(())
        }
        Command::Retry {
            run,
            dead_letter,
            who,
        } => {
            match (run, dead_letter) {
                (Some(run), _) => who.on(&engine)?.retry_run(run)?,
                (None, Some(id)) => who.on(&engine)?.retry_dead_letter(*id)?,
                (None, None) => unreachable!("clap requires one"),
            }
            done(cli.json, "retried")
        }
        Command::Discard {
            run,
            dead_letter,
            who,
        } => {
            match (run, dead_letter) {
                (Some(run), _) => who.on(&engine)?.discard_run(run)?,
                (None, Some(id)) => who.on(&engine)?.discard_dead_letter(*id)?,
                (None, None) => unreachable!("clap requires one"),
            }
            done(cli.json, "discarded")
        }
        Command::Append {
            workspace,
            event_type,
            subject,
            actor,
            payload,
            id,
            causation_id,
            correlation_id,
            expect_version,
        } => {
            let actor = actor
                .clone()
                .or_else(|| std::env::var("USER").ok())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "reflexr-cli".into());
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let mut ev = NewEvent::new(event_type, subject, actor, now).payload_json(payload);
            if let Some(id) = id {
                ev = ev.id(id);
            }
            if let Some(c) = causation_id {
                ev = ev.causation_id(c);
            }
            if let Some(c) = correlation_id {
                ev = ev.correlation_id(c);
            }
            if let Some(v) = expect_version {
                ev = ev.expect_version(*v);
            }
            let appended = engine.append(workspace, &ev)?;
            if cli.json {
                outln!("{}", serde_json::to_string_pretty(&appended)?)?;
            } else if appended.existing {
                outln!(
                    "already appended: {} is seq {} (version {} of {subject})",
                    appended.id,
                    appended.seq,
                    appended.version
                )?;
            } else {
                outln!(
                    "appended seq {} ({}), version {} of {subject}",
                    appended.seq,
                    appended.id,
                    appended.version
                )?;
            }
            Ok(())
        }
        Command::Enqueue {
            action,
            input,
            delay,
            priority,
            scope,
            unique,
            unique_while,
        } => {
            let input: serde_json::Value =
                serde_json::from_str(input).map_err(|e| format!("--input is not JSON: {e}"))?;
            let mut e = reflexr::Enqueue::new(action.clone(), &input);
            if let Some(d) = delay {
                e = e.after(*d);
            }
            if let Some(p) = priority {
                e = e.priority(*p);
            }
            if let Some(s) = scope {
                e = e.scope(s.clone());
            }
            if let Some(key) = unique {
                let how = match unique_while.as_str() {
                    "pending" => reflexr::Unique::WhilePending,
                    "active" => reflexr::Unique::WhileActive,
                    period => {
                        reflexr::Unique::For(humantime::parse_duration(period).map_err(|e| {
                            format!("--unique-while {period:?}: pending, active or a period ({e})")
                        })?)
                    }
                };
                e = e.unique(key.clone(), how);
            }
            let done = engine.enqueue(&e)?;
            if cli.json {
                outln!("{}", serde_json::to_string_pretty(&done)?)?;
            } else if done.deduplicated {
                outln!("deduplicated: {} holds the key", done.id)?;
            } else {
                outln!("enqueued {}", done.id)?;
            }
            Ok(())
        }
        Command::Pause { kind, name, who } => {
            let what = pausable(kind, name)?;
            let fresh = who.on(&engine)?.pause(&what)?;
            done(cli.json, if fresh { "paused" } else { "paused already" })
        }
        Command::Resume { kind, name, who } => {
            who.on(&engine)?.resume(&pausable(kind, name)?)?;
            done(cli.json, "resumed")
        }
        Command::Cancel { run, who } => {
            let was = who.on(&engine)?.cancel_run(run)?;
            done(
                cli.json,
                if was == RunState::Running {
                    "asked to stop: its completion will be refused"
                } else {
                    "cancelled"
                },
            )
        }
        Command::Limits {
            action,
            priority,
            max_running,
            rate,
            partition_by,
            fair,
            key,
            weight,
            clear,
            who,
        } => {
            let Some(action) = action else {
                return limits(&engine, cli.json);
            };
            let rate = rate.as_deref().map(parse_rate).transpose()?;
            if let Some(key) = key {
                if *clear {
                    who.on(&engine)?.clear_key_limits(action, key)?;
                    return done(cli.json, "cleared");
                }
                if max_running.is_none() && rate.is_none() && weight.is_none() {
                    return Err(format!(
                        "say what to set for key {key:?}: --max-running, --rate and/or --weight \
                         (or --clear)"
                    )
                    .into());
                }
                let mut k = engine
                    .key_limits(action)?
                    .into_iter()
                    .find(|k| &k.key == key)
                    .unwrap_or_else(|| reflexr::KeyLimits::new(key.clone()));
                if let Some(n) = max_running {
                    k = k.max_running(*n);
                }
                if let Some((n, period)) = rate {
                    k = k.rate(n, period);
                }
                if let Some(w) = weight {
                    k = k.weight(*w);
                }
                who.on(&engine)?.set_key_limits(action, &k)?;
                return done(cli.json, "set");
            }
            if priority.is_none()
                && max_running.is_none()
                && rate.is_none()
                && partition_by.is_none()
                && !*fair
            {
                return action_limits(&engine, action, cli.json);
            }
            let mut c = engine
                .action_configs()?
                .into_iter()
                .find(|c| &c.action == action)
                .unwrap_or_else(|| reflexr::ActionConfig::new(action.clone()));
            if let Some(p) = priority {
                c = c.priority(*p);
            }
            if let Some(n) = max_running {
                c = c.max_running(*n);
            }
            if let Some((n, period)) = rate {
                c = c.rate(n, period);
            }
            if let Some(f) = partition_by {
                c = c.partition_by(f.clone());
            }
            if *fair {
                c = c.fair();
            }
            who.on(&engine)?.configure_action(&c)?;
            done(cli.json, "set")
        }
        Command::Unblock { rule, scope, who } => {
            who.on(&engine)?.unblock(rule, scope)?;
            done(cli.json, "unblocked")
        }
        Command::ResetCursor {
            workspace,
            kind,
            name,
            to,
            yes,
            who,
        } => reset_cursor(&engine, workspace, kind, name, *to, *yes, who, cli.json),
        Command::Prune {
            events_older_than,
            work_older_than,
            batch,
            who,
        } => prune(
            &engine,
            *events_older_than,
            *work_older_than,
            *batch,
            who,
            cli.json,
        ),
        #[cfg(feature = "admin")]
        #[cfg(feature = "mcp")]
        Command::Mcp {
            read_only,
            operator,
        } => {
            let mcp = reflexr_mcp::Mcp::new(
                engine.clone(),
                reflexr_mcp::McpConfig::new()
                    .read_only(*read_only)
                    .operator(operator.clone()),
            );
            log::info!("serving MCP over stdio on {}", engine.location());
            mcp.serve_stdio(std::io::stdin().lock(), std::io::stdout().lock())?;
            Ok(())
        }
        Command::Serve {
            listen,
            token_file,
            read_only,
            allow_hosts,
        } => serve(
            &engine,
            *listen,
            token_file.as_deref(),
            *read_only,
            allow_hosts,
        ),
        Command::RestartFollower { name, who } => {
            who.on(&engine)?.restart_follower(name)?;
            done(cli.json, "restart requested")
        }
        Command::Stats => {
            let stats = engine.stats()?;
            if cli.json {
                outln!("{}", serde_json::to_string_pretty(&stats)?)?;
            } else {
                let mut t = table(&["counter", "value"]);
                t.add_row(vec![
                    "events_appended".to_string(),
                    stats.events_appended.to_string(),
                ]);
                for (k, v) in &stats.counters {
                    t.add_row(vec![k.to_string(), v.to_string()]);
                }
                for (k, v) in &stats.runs {
                    t.add_row(vec![format!("runs {k}"), v.to_string()]);
                }
                for (k, v) in &stats.dead_letters {
                    t.add_row(vec![format!("dead letters open ({k})"), v.to_string()]);
                }
                for f in &stats.followers {
                    t.add_row(vec![
                        format!("follower {} stops", f.name),
                        f.stops.to_string(),
                    ]);
                    t.add_row(vec![
                        format!("follower {} dead letters", f.name),
                        f.dead_letters.to_string(),
                    ]);
                }
                for c in &stats.cursors {
                    t.add_row(vec![
                        format!("lag {}/{}@{}", c.kind, c.name, c.workspace),
                        c.lag.to_string(),
                    ]);
                }
                outln!("{t}")?;
            }
            Ok(())
        }
    }
}

/// Serves until SIGINT or SIGTERM, then stops the server (its threads
/// joined) and returns.
#[cfg(feature = "admin")]
fn serve<B: Backend>(
    engine: &Engine<B>,
    listen: std::net::SocketAddr,
    token_file: Option<&std::path::Path>,
    read_only: bool,
    allow_hosts: &[String],
) -> Fallible {
    let mut config = reflexr_admin::AdminConfig::new()
        .listen(listen)
        .read_only(read_only);
    for name in allow_hosts {
        config = config.allow_host(name);
    }
    if let Some(path) = token_file {
        config = config.token_file(path)?;
    } else if let Ok(token) = std::env::var("REFLEXR_ADMIN_TOKEN") {
        config = config.token(token);
    }
    let server = reflexr_admin::AdminServer::start(engine, config)?;
    outln!(
        "serving {} on http://{}{}",
        engine.location(),
        server.local_addr(),
        if read_only { " (read-only)" } else { "" }
    )?;
    std::io::stdout().flush()?;
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })?;
    let _ = rx.recv();
    eprintln!("stopping");
    server.shutdown();
    Ok(())
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(header.to_vec());
    t
}

fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

fn opt_time(ms: Option<i64>) -> String {
    ms.map(time).unwrap_or_default()
}

fn done(json: bool, what: &str) -> Fallible {
    if json {
        outln!("{}", json!({ "ok": true, "action": what }))?;
    } else {
        outln!("{what}")?;
    }
    Ok(())
}

/// Prints `value` as indented JSON.
fn print_json(value: &impl serde::Serialize) -> Fallible {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

fn print_events(events: &[Event], json: bool) -> Fallible {
    if json {
        return print_json(&events);
    }
    let mut t = table(&["seq", "type", "subject", "actor", "recorded", "payload"]);
    for e in events {
        t.add_row(vec![
            e.seq.to_string(),
            e.event_type.clone(),
            e.subject.clone(),
            e.actor.clone(),
            time(e.recorded_at),
            e.payload_json().to_string(),
        ]);
    }
    outln!("{t}")?;
    Ok(())
}

fn tail<B: Backend>(
    engine: &Engine<B>,
    workspace: &str,
    types: &[String],
    from_start: bool,
    count: Option<usize>,
    json: bool,
) -> Fallible {
    let mut after = if from_start { 0 } else { engine.head_seq()? };
    let mut printed = 0;
    let mut out = std::io::stdout().lock();
    loop {
        if count.is_some_and(|c| printed >= c) {
            return Ok(());
        }
        let q = Query::new(workspace).after(after).types(types);
        for e in engine.wait_for_events(&q, Duration::from_secs(1))? {
            after = e.seq;
            if json {
                writeln!(out, "{}", serde_json::to_string(&e)?)?;
            } else {
                writeln!(
                    out,
                    "{:>8}  {}  {:<24} {:<24} {}",
                    e.seq,
                    time(e.recorded_at),
                    e.event_type,
                    e.subject,
                    e.payload_json()
                )?;
            }
            out.flush()?;
            printed += 1;
            if count.is_some_and(|c| printed >= c) {
                return Ok(());
            }
        }
    }
}

fn pausable(kind: &str, name: &str) -> reflexr::Result<reflexr::Pausable> {
    reflexr::Pausable::parse(kind, name)
}

/// What is paused, as a table.
fn paused_table(paused: &[reflexr::inspect::PausedInfo]) -> Table {
    let mut t = table(&["kind", "name", "since", "by", "why"]);
    for p in paused {
        t.add_row(vec![
            p.kind.clone(),
            p.name.clone(),
            time(p.since),
            p.operator.clone(),
            p.reason.clone(),
        ]);
    }
    t
}

/// A `--rate` of N/PERIOD (e.g. 100/1m): the count and the period.
fn parse_rate(r: &str) -> Result<(u32, Duration), String> {
    let (n, period) = r
        .split_once('/')
        .ok_or_else(|| format!("--rate {r:?}: N/PERIOD, e.g. 100/1m"))?;
    let n: u32 = n
        .parse()
        .map_err(|_| format!("--rate {r:?}: N is a count"))?;
    let period = humantime::parse_duration(period).map_err(|e| format!("--rate {r:?}: {e}"))?;
    Ok((n, period))
}

/// A rate as `--rate` takes it (`100/1m`), or `-` for none.
fn rate_text(rate: Option<(u32, i64)>) -> String {
    rate.map_or("-".into(), |(n, ms)| {
        format!(
            "{n}/{}",
            humantime::format_duration(Duration::from_millis(ms.max(0) as u64))
        )
    })
}

/// Actions' settings, as a table.
fn configs_table(configs: &[reflexr::ActionConfig]) -> Table {
    let mut t = table(&[
        "action",
        "priority",
        "max running",
        "rate",
        "partition by",
        "fair",
    ]);
    for c in configs {
        t.add_row(vec![
            c.action.clone(),
            c.priority.to_string(),
            c.max_running.map_or("-".into(), |n| n.to_string()),
            rate_text(c.rate),
            c.partition_by.clone().unwrap_or_else(|| "-".into()),
            if c.fair { "yes" } else { "no" }.to_string(),
        ]);
    }
    t
}

/// Every action's settings and what is paused.
fn limits<B: Backend>(engine: &Engine<B>, json: bool) -> Fallible {
    let configs = engine.action_configs()?;
    let paused = engine.paused()?;
    if json {
        return print_json(&json!({ "actions": configs, "paused": paused }));
    }
    outln!("actions")?;
    outln!("{}\n", configs_table(&configs))?;
    outln!("paused")?;
    outln!("{}", paused_table(&paused))?;
    Ok(())
}

/// One action's settings (`null` when none are kept for it), its keys with
/// their runs and the limits that hold for each, and the keys' own
/// overrides.
fn action_limits<B: Backend>(engine: &Engine<B>, action: &str, json: bool) -> Fallible {
    let config = engine
        .action_configs()?
        .into_iter()
        .find(|c| c.action == action);
    let keys = engine.action_keys(action)?;
    let overrides = engine.key_limits(action)?;
    if json {
        return print_json(&json!({ "config": config, "keys": keys, "limits": overrides }));
    }
    outln!("settings")?;
    match &config {
        Some(c) => outln!("{}\n", configs_table(std::slice::from_ref(c)))?,
        None => outln!("{action} has no settings kept in the file: no priority, no limits\n")?,
    }
    outln!("keys")?;
    if keys.is_empty() {
        outln!(
            "{}",
            if config.as_ref().is_some_and(|c| c.keyed()) {
                "none with unfinished runs or overrides"
            } else {
                "none: the action is not fair or partitioned"
            }
        )?;
        return Ok(());
    }
    let mut t = table(&[
        "key",
        "waiting",
        "ready",
        "running",
        "max running",
        "rate",
        "weight",
        "overridden",
    ]);
    for k in &keys {
        t.add_row(vec![
            // Runs without the partition field share the key "".
            if k.key.is_empty() {
                "\"\"".to_string()
            } else {
                k.key.clone()
            },
            k.waiting.to_string(),
            k.ready.to_string(),
            k.running.to_string(),
            k.max_running.map_or("-".into(), |n| n.to_string()),
            rate_text(k.rate),
            k.weight.to_string(),
            if k.overridden { "yes" } else { "no" }.to_string(),
        ]);
    }
    outln!("{t}")?;
    Ok(())
}

fn status<B: Backend>(engine: &Engine<B>, json: bool) -> Fallible {
    let workspaces = engine.workspaces()?;
    let cursors = engine.cursors()?;
    let leases = engine.leases()?;
    let stats = engine.stats()?;
    let now = engine.now_ms();
    if json {
        let mut leases_json = Vec::new();
        for l in &leases {
            let mut v = serde_json::to_value(l)?;
            v["state"] = json!(lease_state(l.expires_at, now));
            leases_json.push(v);
        }
        return print_json(&json!({
            "workspaces": workspaces,
            "consumers": cursors,
            "stuck": cursors.iter().filter(|c| c.is_stuck()).collect::<Vec<_>>(),
            "leases": leases_json,
            "runs": stats.runs,
            "dead_letters": stats.dead_letters,
            "blocked_lanes": stats.blocked_lanes,
            "paused": engine.paused()?,
        }));
    }
    outln!("workspaces")?;
    let mut t = table(&["name", "types"]);
    for w in &workspaces {
        t.add_row(vec![w.name.clone(), w.event_types.join(", ")]);
    }
    outln!("{t}\n")?;
    outln!("consumers")?;
    let mut t = table(&["workspace", "kind", "name", "cursor", "lag", "updated"]);
    for c in &cursors {
        t.add_row(vec![
            c.workspace.clone(),
            c.kind.as_str().to_string(),
            c.name.clone(),
            c.position.to_string(),
            c.lag.to_string(),
            time(c.updated_at),
        ]);
    }
    outln!("{t}\n")?;
    let stuck: Vec<_> = cursors.iter().filter(|c| c.is_stuck()).collect();
    if !stuck.is_empty() {
        outln!("stuck consumers (their commit keeps failing)")?;
        let mut t = table(&[
            "workspace",
            "kind",
            "name",
            "cursor",
            "failures",
            "last error",
        ]);
        for c in stuck {
            t.add_row(vec![
                c.workspace.clone(),
                c.kind.as_str().to_string(),
                c.name.clone(),
                c.position.to_string(),
                c.failures.to_string(),
                c.last_error.clone().unwrap_or_default(),
            ]);
        }
        outln!("{t}\n")?;
    }
    outln!("leases")?;
    let mut t = table(&["name", "holder", "generation", "expires", "state"]);
    for l in &leases {
        t.add_row(vec![
            l.name.clone(),
            l.holder.clone(),
            l.generation.to_string(),
            if l.expires_at == 0 {
                "-".into()
            } else {
                time(l.expires_at)
            },
            lease_state(l.expires_at, now).to_string(),
        ]);
    }
    outln!("{t}\n")?;
    outln!("runs")?;
    let mut t = table(&["state", "runs"]);
    for (s, n) in &stats.runs {
        t.add_row(vec![s.as_str().to_string(), n.to_string()]);
    }
    outln!("{t}\n")?;
    outln!("dead letters (open)")?;
    let mut t = table(&["kind", "open"]);
    for (k, n) in &stats.dead_letters {
        t.add_row(vec![k.to_string(), n.to_string()]);
    }
    outln!("{t}")?;
    let paused = engine.paused()?;
    if !paused.is_empty() {
        outln!("\npaused")?;
        outln!("{}", paused_table(&paused))?;
    }
    Ok(())
}

/// A lease is held until it expires; a released one expires at 0.
fn lease_state(expires_at: i64, now: i64) -> &'static str {
    match expires_at {
        0 => "released",
        t if t > now => "held",
        _ => "lapsed",
    }
}

fn runs<B: Backend>(
    engine: &Engine<B>,
    state: Option<RunState>,
    limit: usize,
    json: bool,
) -> Fallible {
    let runs = engine.runs(state, limit)?;
    if json {
        return print_json(&runs);
    }
    let mut t = table(&[
        "id",
        "action",
        "scope",
        "state",
        "attempt",
        "due",
        "last error",
    ]);
    for r in &runs {
        t.add_row(vec![
            r.id.clone(),
            r.action.clone(),
            r.scope.clone().unwrap_or_default(),
            r.state.as_str().to_string(),
            format!("{}/{}", r.attempt, r.max_attempts),
            time(r.due_at),
            r.last_error.clone().unwrap_or_default(),
        ]);
    }
    outln!("{t}")?;
    Ok(())
}

/// Every line of a run's log, oldest first, read a page at a time.
fn all_run_logs<B: Backend>(
    engine: &Engine<B>,
    run: &str,
) -> reflexr::Result<Vec<reflexr::RunLog>> {
    let mut logs: Vec<reflexr::RunLog> = Vec::new();
    loop {
        let after = logs.last().map_or(0, |l| l.n);
        let page = engine.run_logs(run, after, reflexr::limits::MAX_PAGE)?;
        let full = page.len() == reflexr::limits::MAX_PAGE;
        logs.extend(page);
        if !full {
            return Ok(logs);
        }
    }
}

fn show_run<B: Backend>(engine: &Engine<B>, id: &str, json: bool) -> Fallible {
    let Some(r) = engine.run(id)? else {
        return Err(format!("run not found: {id:?}").into());
    };
    let progress = engine.run_progress(id)?;
    let logs = all_run_logs(engine, id)?;
    if json {
        return print_json(&json!({ "run": r, "progress": progress, "logs": logs }));
    }
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut fields = Table::new();
    fields.load_style(presets::NOTHING);
    for (k, v) in [
        ("id", r.id.clone()),
        ("state", r.state.as_str().to_string()),
        ("kind", r.kind.as_str().to_string()),
        ("action", r.action.clone()),
        ("rule", or_dash(r.rule.clone())),
        ("workspace", or_dash(r.workspace.clone())),
        ("scope", or_dash(r.scope.clone())),
        ("key", or_dash(r.key.clone())),
        ("attempt", format!("{}/{}", r.attempt, r.max_attempts)),
        ("priority", r.priority.to_string()),
        ("due", time(r.due_at)),
        ("claimed by", or_dash(r.claimed_by.clone())),
        ("last error", or_dash(r.last_error.clone())),
        ("created", time(r.created_at)),
        ("updated", time(r.updated_at)),
        ("finished", or_dash(r.finished_at.map(time))),
        ("parent", or_dash(r.parent.clone())),
        ("trace", or_dash(r.traceparent.clone())),
        (
            "progress",
            progress.map_or_else(
                || "-".into(),
                |p| {
                    format!(
                        "{}/{} (attempt {}, at {})",
                        p.done,
                        p.total,
                        p.attempt,
                        time(p.at)
                    )
                },
            ),
        ),
    ] {
        fields.add_row(vec![format!("{k}:"), v]);
    }
    outln!("{fields}")?;
    outln!()?;
    if logs.is_empty() {
        outln!("no log lines")?;
        return Ok(());
    }
    let mut t = table(&["#", "attempt", "at", "level", "message", "fields"]);
    for l in &logs {
        t.add_row(vec![
            l.n.to_string(),
            l.attempt.to_string(),
            time(l.at),
            l.level.clone(),
            l.message.clone(),
            l.fields.clone().unwrap_or_default(),
        ]);
    }
    outln!("{t}")?;
    Ok(())
}

fn rules<B: Backend>(engine: &Engine<B>, json: bool) -> Fallible {
    let rules = engine.rules()?;
    if json {
        return print_json(&rules);
    }
    let mut t = table(&[
        "rule",
        "workspace",
        "version",
        "as",
        "cursor",
        "lag",
        "fired in shadow",
    ]);
    for r in &rules {
        let role = match (&r.shadow_of, r.promote_at) {
            (None, _) => "live".to_string(),
            (Some(of), None) => format!("shadow of {of}"),
            (Some(of), Some(at)) => format!("shadow of {of}, taking over after seq {at}"),
        };
        t.add_row(vec![
            r.name.clone(),
            r.workspace.clone(),
            r.version.to_string(),
            role,
            r.cursor.to_string(),
            r.lag.to_string(),
            if r.shadow_of.is_some() {
                format!("{} ({} errors)", r.shadow_fired, r.shadow_errored)
            } else {
                String::new()
            },
        ]);
    }
    outln!("{t}")?;
    Ok(())
}

/// What a step waits (or waited) for, in words: a sleep's time, a wait's
/// event and timeout, a join's runs.
fn waits_for(step: &reflexr::inspect::StepInfo) -> String {
    use reflexr::inspect::StepKind;
    let d: serde_json::Value = serde_json::from_str(&step.detail).unwrap_or_default();
    let at = |v: &serde_json::Value| v.as_i64().map(time);
    match step.kind {
        StepKind::Sleep => at(&d["until"]).map_or_else(String::new, |t| format!("until {t}")),
        StepKind::Wait => {
            let mut what = format!(
                "{} in {}",
                d["type"].as_str().unwrap_or("?"),
                d["workspace"].as_str().unwrap_or("?")
            );
            if let Some(subject) = d["subject"].as_str() {
                what.push_str(&format!(" about {subject}"));
            }
            if let Some(field) = d["field"].as_str() {
                what.push_str(&format!(" with {field} = {}", d["value"]));
            }
            match at(&d["timeout_at"]) {
                Some(t) => format!("{what}, until {t}"),
                None => format!("{what}, for as long as it takes"),
            }
        }
        StepKind::Join => {
            let runs: Vec<&str> = d["runs"]
                .as_array()
                .map(|r| r.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            format!("runs {}", runs.join(", "))
        }
        _ => String::new(),
    }
}

fn steps<B: Backend>(engine: &Engine<B>, run: &str, json: bool) -> Fallible {
    let steps = engine.run_steps(run)?;
    if json {
        return print_json(&steps);
    }
    let mut t = table(&[
        "#",
        "step",
        "kind",
        "state",
        "attempt",
        "recorded",
        "output",
        "waits for",
        "wakes",
    ]);
    for s in &steps {
        let waiting = s.state == reflexr::inspect::StepState::Waiting;
        t.add_row(vec![
            s.position.to_string(),
            s.name.clone(),
            s.kind.as_str().to_string(),
            s.state.as_str().to_string(),
            s.attempt.to_string(),
            time(s.recorded_at),
            if s.output.is_some() {
                format!("{} B", s.output_bytes)
            } else {
                "-".into()
            },
            waits_for(s),
            if waiting {
                s.wake_at.map_or_else(|| "-".into(), time)
            } else {
                "-".into()
            },
        ]);
    }
    outln!("{t}")?;
    Ok(())
}

fn reset_run<B: Backend>(
    engine: &Engine<B>,
    run: &str,
    step: &str,
    yes: bool,
    who: &Who,
    json: bool,
) -> Fallible {
    if !yes {
        let steps = engine.run_steps(run)?;
        let Some(at) = steps
            .iter()
            .find(|s| s.name == step && s.kind != reflexr::inspect::StepKind::Begin)
        else {
            return Err(format!(
                "run {run} has no step {step:?} to reset to (reflexr <DB> runs steps {run} lists them)"
            )
            .into());
        };
        let forgotten: Vec<&str> = steps
            .iter()
            .filter(|s| s.position >= at.position)
            .map(|s| s.name.as_str())
            .collect();
        eprint!(
            "Reset run {run} to step {step:?}? The steps {} are forgotten and run again: \
             what they did outside the file may happen again. [y/N] ",
            forgotten.join(", ")
        );
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            return Err("not confirmed; nothing changed (pass --yes to skip the question)".into());
        }
    }
    who.on(engine)?.reset_run_to_step(run, step)?;
    if json {
        outln!(
            "{}",
            json!({ "ok": true, "action": "reset", "run": run, "step": step })
        )?;
    } else {
        outln!("reset to step {step}: the run is ready to run it again")?;
    }
    Ok(())
}

fn dead_letters<B: Backend>(engine: &Engine<B>, all: bool, limit: usize, json: bool) -> Fallible {
    let letters = engine.dead_letters(all, limit)?;
    if json {
        return print_json(&letters);
    }
    let mut t = table(&[
        "id", "kind", "consumer", "seq", "run", "reason", "error", "when", "resolved",
    ]);
    for d in &letters {
        t.add_row(vec![
            d.id.to_string(),
            d.kind.to_string(),
            d.consumer.clone(),
            d.event_seq.map(|s| s.to_string()).unwrap_or_default(),
            d.run_id.clone().unwrap_or_default(),
            d.reason.to_string(),
            d.error.clone(),
            time(d.created_at),
            d.resolution
                .map(|r| format!("{r} {}", opt_time(d.resolved_at)))
                .unwrap_or_default(),
        ]);
    }
    outln!("{t}")?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn reset_cursor<B: Backend>(
    engine: &Engine<B>,
    workspace: &str,
    kind: &str,
    name: &str,
    to: i64,
    yes: bool,
    who: &Who,
    json: bool,
) -> Fallible {
    let kind: ConsumerKind = kind.parse()?;
    let current = engine
        .cursors()?
        .into_iter()
        .find(|c| c.workspace == workspace && c.kind == kind && c.name == name)
        .map(|c| c.position);
    if !yes {
        eprint!(
            "Move the {} cursor {name:?} on {workspace:?} from {} to {to}? [y/N] ",
            kind.as_str(),
            current.map_or("(none)".to_string(), |p| p.to_string())
        );
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            return Err("not confirmed; nothing changed (pass --yes to skip the question)".into());
        }
    }
    let reset = who.on(engine)?.reset_cursor(workspace, kind, name, to)?;
    if json {
        outln!(
            "{}",
            json!({ "ok": true, "from": reset.from, "to": reset.to })
        )?;
    } else {
        outln!(
            "cursor moved from {} to {}",
            reset.from.map_or("(none)".to_string(), |p| p.to_string()),
            reset.to
        )?;
    }
    Ok(())
}

fn prune<B: Backend>(
    engine: &Engine<B>,
    events: Option<Duration>,
    work: Option<Duration>,
    batch: usize,
    who: &Who,
    json: bool,
) -> Fallible {
    if events.is_none() && work.is_none() {
        return Err("say what to prune: --events-older-than and/or --work-older-than".into());
    }
    let retention = Retention {
        events,
        finished_work: work,
        batch,
    };
    let bar = if std::io::stderr().is_terminal() && !json {
        indicatif::ProgressBar::new_spinner()
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.enable_steady_tick(Duration::from_millis(120));
    let pruned = who.on(engine)?.prune_with_progress(&retention, |p| {
        bar.set_message(format!(
            "deleted {} events, {} runs, {} dead letters",
            p.events, p.runs, p.dead_letters
        ));
    })?;
    bar.finish_and_clear();
    if json {
        outln!(
            "{}",
            json!({ "events": pruned.events, "runs": pruned.runs, "dead_letters": pruned.dead_letters })
        )?;
    } else {
        outln!(
            "pruned {} events, {} finished runs, {} resolved dead letters",
            pruned.events,
            pruned.runs,
            pruned.dead_letters
        )?;
    }
    Ok(())
}
