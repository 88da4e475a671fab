//! Runs: the at-least-once execution of an action.
//!
//! A rule's firing creates a run whose id is the firing id; that id is the
//! idempotency key a handler gives to the outside world. Executors claim
//! runs under a lease they renew while the handler works, and complete, retry
//! (with backoff) or dead-letter them under a holder check (DESIGN.md,
//! invariant 5).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::base::error::{Error, HandlerError, Result};
use crate::base::event::{Event, NewEvent, Query};
use crate::base::text::text_enum;
use crate::core::changelog::{self, Origin};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::store::runs::RunRow;
use crate::store::{Lanes, Runs, Sqlite};

/// A run as its handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Run {
    /// The run id = the firing id: the idempotency key for the outside world.
    pub id: String,
    /// The action being run.
    pub action: String,
    /// The rule that fired it (rule runs).
    pub rule: Option<String>,
    /// The workspace of the event that fired it.
    pub workspace: Option<String>,
    /// The scope it fired for.
    pub scope: Option<String>,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// How many attempts the run gets in all.
    pub max_attempts: u32,
    /// The seq of the event that fired it.
    pub event_seq: Option<i64>,
    /// The id of the event that fired it.
    pub event_id: Option<String>,
    /// The chain depth of the event that fired it.
    pub depth: i64,
    /// Its key, for its action's per-key limits and fair claims (see
    /// [`crate::Enqueue::key`]); `None` for an action without keys.
    pub key: Option<String>,
    /// The W3C trace context it carries: its event's
    /// ([`crate::NewEvent::traceparent`]) or its enqueue's
    /// ([`crate::Enqueue::traceparent`]). The events it emits carry it
    /// unless they set their own.
    pub traceparent: Option<String>,
    pub(crate) input: String,
    pub(crate) checkpoint: Option<String>,
    pub(crate) holder: String,
    pub(crate) claim_expires_at: i64,
    pub(crate) lane: Option<String>,
    /// Its position in the queue (`reflexr_runs.ord`).
    pub(crate) ord: i64,
    /// The workflow run that spawned it.
    pub(crate) parent: Option<String>,
    /// The log's head when the run was first claimed: a workflow's waits
    /// look at the events after it.
    pub(crate) began_seq: i64,
    /// This claim's token in the executors' tracking (0: not tracked).
    pub(crate) token: u64,
}

impl Run {
    /// The run a claimed row stands for, its text moved, not copied.
    pub(crate) fn from_row(r: RunRow) -> Run {
        Run {
            id: r.id,
            action: r.action,
            rule: r.rule,
            workspace: r.workspace,
            scope: r.scope,
            attempt: u32::try_from(r.attempt).unwrap_or(u32::MAX),
            max_attempts: u32::try_from(r.max_attempts).unwrap_or(u32::MAX),
            event_seq: r.event_seq,
            event_id: r.event_id,
            depth: r.depth,
            key: r.flow_key,
            traceparent: r.traceparent,
            input: r.input,
            checkpoint: r.checkpoint,
            holder: r.claimed_by.unwrap_or_default(),
            claim_expires_at: r.claim_expires_at.unwrap_or(0),
            lane: r.lane,
            ord: r.ord,
            parent: r.parent,
            began_seq: r.began_seq.unwrap_or(0),
            token: 0,
        }
    }

    /// The input the firing gave, decoded.
    pub fn input<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.input).map_err(|e| Error::Decode {
            what: format!("input of run {}", self.id),
            seq: None,
            message: e.to_string(),
        })
    }

    /// The input as JSON text.
    pub fn input_json(&self) -> &str {
        &self.input
    }

    /// What an earlier attempt saved with [`RunContext::checkpoint`], decoded.
    pub fn checkpoint<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.checkpoint
            .as_deref()
            .map(|c| {
                serde_json::from_str(c).map_err(|e| Error::Decode {
                    what: format!("checkpoint of run {}", self.id),
                    seq: None,
                    message: e.to_string(),
                })
            })
            .transpose()
    }
}

text_enum! {
    /// The state of a run in the work queue.
    pub enum RunState ("run state") {
        /// Behind an earlier run of its rule and scope.
        Waiting = "waiting",
        /// Claimable once due (a retry waits here for its backoff).
        Ready = "ready",
        /// Claimed by an executor.
        Running = "running",
        /// Done.
        Succeeded = "succeeded",
        /// Given up on; see its dead letter.
        Dead = "dead",
        /// An operator dropped it after it died.
        Discarded = "discarded",
        /// An operator cancelled it before it ended (see
        /// [`crate::Operator::cancel_run`]).
        Cancelled = "cancelled",
    }
}

text_enum! {
    /// What made a run.
    pub enum RunKind ("run kind") {
        /// A rule's firing.
        Rule = "rule",
        /// A delivery on a channel.
        Delivery = "delivery",
        /// A scheduled job's occurrence.
        Job = "job",
        /// Work enqueued directly ([`crate::Engine::enqueue`]).
        Task = "task",
    }
}

/// A line a run's handler logged ([`RunContext::log`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RunLog {
    /// Its place in the run's log, from 1, across attempts (a cursor for
    /// [`crate::Engine::run_logs`]).
    pub n: i64,
    /// The attempt that logged it.
    pub attempt: u32,
    /// When (ms since the epoch, by the engine's clock).
    pub at: i64,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub level: String,
    /// The message.
    pub message: String,
    /// Its fields, as JSON text (serialised as the JSON it holds), if any.
    #[serde(serialize_with = "crate::base::text::raw_json_opt")]
    pub fields: Option<String>,
}

impl From<crate::store::steps::LogRow> for RunLog {
    fn from(l: crate::store::steps::LogRow) -> RunLog {
        RunLog {
            n: l.n,
            attempt: u32::try_from(l.attempt).unwrap_or(0),
            at: l.at,
            level: l.level,
            message: l.message,
            fields: l.fields,
        }
    }
}

/// How far a run's handler last said it got ([`RunContext::progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RunProgress {
    /// The attempt that said it.
    pub attempt: u32,
    /// How much is done.
    pub done: u64,
    /// Of how much.
    pub total: u64,
    /// When it was said (ms since the epoch, by the engine's clock).
    pub at: i64,
}

impl From<crate::store::steps::ProgressRow> for RunProgress {
    fn from(p: crate::store::steps::ProgressRow) -> RunProgress {
        RunProgress {
            attempt: u32::try_from(p.attempt).unwrap_or(0),
            done: u64::try_from(p.done).unwrap_or(0),
            total: u64::try_from(p.total).unwrap_or(0),
            at: p.at,
        }
    }
}

/// A run as an operator sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct RunInfo {
    /// The run id.
    pub id: String,
    /// Its place in the queue, in creation order (a [`crate::inspect::RunFilter`]
    /// cursor).
    pub position: i64,
    /// What made it.
    pub kind: RunKind,
    /// The action.
    pub action: String,
    /// The rule that fired it.
    pub rule: Option<String>,
    /// The workspace of the event that fired it.
    pub workspace: Option<String>,
    /// Its scope.
    pub scope: Option<String>,
    /// Where it is.
    pub state: RunState,
    /// Attempts made so far.
    pub attempt: u32,
    /// Attempts it gets in all.
    pub max_attempts: u32,
    /// When it is (or was) claimable.
    pub due_at: i64,
    /// Who holds its claim, while running.
    pub claimed_by: Option<String>,
    /// When its claim lapses unless renewed, while running.
    pub claim_expires_at: Option<i64>,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// The seq of the event that fired it.
    pub event_seq: Option<i64>,
    /// Its input, as JSON text (serialised as the JSON it holds).
    #[serde(serialize_with = "crate::base::text::raw_json")]
    pub input: String,
    /// What its last attempt saved with [`RunContext::checkpoint`], as JSON
    /// text (serialised as the JSON it holds).
    #[serde(serialize_with = "crate::base::text::raw_json_opt")]
    pub checkpoint: Option<String>,
    /// Its priority: higher is claimed first.
    pub priority: i64,
    /// Its uniqueness key, if it has one.
    pub unique_key: Option<String>,
    /// How long its key holds: `pending`, `active` or `period`.
    pub unique_mode: Option<String>,
    /// When its current (or last) attempt was claimed.
    pub started_at: Option<i64>,
    /// When an operator asked it to stop while it ran (its completion is
    /// refused; it ends cancelled).
    pub cancel_requested_at: Option<i64>,
    /// Who cancelled it, and why.
    pub cancelled_by: Option<String>,
    /// Why it was cancelled.
    pub cancel_reason: Option<String>,
    /// When it was created.
    pub created_at: i64,
    /// When it last changed.
    pub updated_at: i64,
    /// When it ended.
    pub finished_at: Option<i64>,
    /// What it returned ([`RunContext::set_output`]), as JSON text
    /// (serialised as the JSON it holds), once it succeeded with one.
    #[serde(serialize_with = "crate::base::text::raw_json_opt")]
    pub output: Option<String>,
    /// The workflow run that spawned it ([`RunContext::spawn`]).
    pub parent: Option<String>,
    /// Its key, for its action's per-key limits and fair claims
    /// ([`crate::Enqueue::key`]); `None` for an action without keys.
    pub key: Option<String>,
    /// The W3C trace context it carries ([`Run::traceparent`]): its
    /// trace id is the second part. Serialised only when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl RunInfo {
    pub(crate) fn from_row(r: RunRow) -> Result<RunInfo> {
        Ok(RunInfo {
            state: r.state.parse()?,
            kind: r.kind.parse()?,
            position: r.ord,
            id: r.id,
            action: r.action,
            rule: r.rule,
            workspace: r.workspace,
            scope: r.scope,
            attempt: u32::try_from(r.attempt).unwrap_or(0),
            max_attempts: u32::try_from(r.max_attempts).unwrap_or(0),
            due_at: r.due_at,
            claimed_by: r.claimed_by,
            claim_expires_at: r.claim_expires_at,
            last_error: r.last_error,
            event_seq: r.event_seq,
            input: r.input,
            checkpoint: r.checkpoint,
            priority: r.priority,
            unique_key: r.unique_key,
            unique_mode: r.unique_mode,
            started_at: r.started_at,
            cancel_requested_at: r.cancel_requested_at,
            cancelled_by: r.cancelled_by,
            cancel_reason: r.cancel_reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
            finished_at: r.finished_at,
            output: r.output,
            parent: r.parent,
            key: r.flow_key,
            traceparent: r.traceparent,
        })
    }
}

/// An action handler: runs one attempt of a run. Return `Ok` to complete
/// the run (unless it was completed with [`RunContext::complete`] already),
/// an error — or panic — to fail the attempt.
pub type ActionFn<B = Sqlite> =
    dyn Fn(&Run, &mut RunContext<'_, B>) -> std::result::Result<(), HandlerError> + Send + Sync;

/// A batch action's handler ([`crate::Engine::register_batch_action`]):
/// runs one attempt of each of up to its `max` runs at once, each with its
/// own context ([`RunContext::run`] is the run), and says how each went —
/// one outcome per run, in their order. A run whose outcome is an error
/// fails alone (retried or dead-lettered by its policy); the others settle
/// as their outcomes say. A panic, or a number of outcomes other than the
/// number of runs, fails the attempt of every run of the call.
pub type BatchFn<B = Sqlite> =
    dyn Fn(&mut [RunContext<'_, B>]) -> Vec<std::result::Result<(), HandlerError>> + Send + Sync;

/// The handlers this process runs, by action name — rules' actions,
/// `delivery/<channel>` senders, `job/<name>` jobs, batch actions — and
/// their names as the claim takes them (a JSON array). Rebuilt whenever one
/// is registered, so an executor takes the whole set with one `Arc` clone.
pub(crate) struct Actions<B: Backend = Sqlite> {
    pub handlers: BTreeMap<String, Arc<ActionFn<B>>>,
    /// Batch actions: the most runs a call takes, and the handler.
    pub batches: BTreeMap<String, (usize, Arc<BatchFn<B>>)>,
    /// The names, for the claim.
    pub names: Vec<String>,
}

impl<B: Backend> Default for Actions<B> {
    fn default() -> Self {
        Actions {
            handlers: BTreeMap::new(),
            batches: BTreeMap::new(),
            names: Vec::new(),
        }
    }
}

impl<B: Backend> Actions<B> {
    /// These actions and `name`'s handler (replacing a batch handler of
    /// the name).
    pub(crate) fn with(&self, name: &str, handler: Arc<ActionFn<B>>) -> Actions<B> {
        let mut handlers = self.handlers.clone();
        let mut batches = self.batches.clone();
        handlers.insert(name.to_string(), handler);
        batches.remove(name);
        Self::of(handlers, batches)
    }

    /// These actions and `name`'s batch handler (replacing a one-run
    /// handler of the name).
    pub(crate) fn with_batch(
        &self,
        name: &str,
        max: usize,
        handler: Arc<BatchFn<B>>,
    ) -> Actions<B> {
        let mut handlers = self.handlers.clone();
        let mut batches = self.batches.clone();
        handlers.remove(name);
        batches.insert(name.to_string(), (max, handler));
        Self::of(handlers, batches)
    }

    fn of(
        handlers: BTreeMap<String, Arc<ActionFn<B>>>,
        batches: BTreeMap<String, (usize, Arc<BatchFn<B>>)>,
    ) -> Actions<B> {
        let mut names: Vec<String> = handlers.keys().chain(batches.keys()).cloned().collect();
        names.sort();
        Actions {
            handlers,
            batches,
            names,
        }
    }

    /// Whether no handler is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.handlers.is_empty() && self.batches.is_empty()
    }
}

/// What an attempt knows of its run's recorded steps: loaded at the first
/// step it reaches, kept up to date with what it records.
pub(crate) struct Flow {
    pub(crate) recorded: std::collections::HashMap<String, crate::store::steps::StepRow>,
    pub(crate) by_position: std::collections::BTreeMap<i64, String>,
    /// The position the next step reached takes.
    pub(crate) next: i64,
    pub(crate) reached: std::collections::HashSet<String>,
    /// The log's head where the run began, once recorded.
    pub(crate) began: Option<i64>,
    /// The head read at this attempt's first step, recorded with the first
    /// step this attempt records if the run has not begun yet.
    pub(crate) pending_begin: Option<i64>,
    /// The seq of the last event a wait of this run received.
    pub(crate) received: i64,
}

/// An event a run asked to emit, appended when the run completes.
pub(crate) struct Emitted {
    pub workspace: String,
    pub key: String,
    pub event: NewEvent,
}

/// What a handler can do besides its own work.
pub struct RunContext<'a, B: Backend = Sqlite> {
    pub(crate) db: &'a B::Db,
    stopping: &'a AtomicBool,
    cancelled: std::sync::Arc<AtomicBool>,
    pub(crate) run: &'a Run,
    pub(crate) emitted: Vec<Emitted>,
    pub(crate) completed: bool,
    /// The run suspended (a workflow's sleep, wait or join): recorded
    /// already, nothing to settle.
    pub(crate) suspended: bool,
    /// What the run returns when it succeeds ([`RunContext::set_output`]).
    pub(crate) output: Option<String>,
    /// The workflow's recorded steps, once a step was reached.
    pub(crate) flow: Option<Flow>,
    /// Lines this attempt logged (kept or dropped), against
    /// [`crate::limits::MAX_LOG_LINES_PER_ATTEMPT`]: read from the file at
    /// the first line (a workflow resumed after a suspension goes on in the
    /// attempt it suspended in).
    logged: Option<usize>,
    /// The attempt's span (feature `otel`): what the events it emits
    /// carry unless they set their own traceparent.
    pub(crate) span: Option<String>,
    /// Steps recorded and not written yet: written with the next step's
    /// record, or with the run's settlement.
    pub(crate) pending: Vec<crate::store::steps::StepRow>,
}

impl<'a, B: Backend> RunContext<'a, B> {
    /// `stopping` is the engine's shutdown flag; `cancelled` the run's own.
    pub(crate) fn new(
        db: &'a B::Db,
        stopping: &'a AtomicBool,
        cancelled: std::sync::Arc<AtomicBool>,
        run: &'a Run,
    ) -> RunContext<'a, B> {
        RunContext {
            db,
            stopping,
            cancelled,
            run,
            emitted: Vec::new(),
            completed: false,
            suspended: false,
            output: None,
            flow: None,
            pending: Vec::new(),
            logged: None,
            span: None,
        }
    }

    /// The run this context is for.
    pub fn run(&self) -> &Run {
        self.run
    }

    /// Adds a line to the run's log, kept with the run under this attempt
    /// and committed before this returns, so a crash later in the attempt
    /// keeps it: operators read it with [`crate::Engine::run_logs`] (the
    /// CLI, the HTTP API, the console and MCP show it with the run). `fields`
    /// is any JSON value (`serde_json::Value::Null` for none). An attempt
    /// keeps at most [`crate::limits::MAX_LOG_LINES_PER_ATTEMPT`] lines (then
    /// one saying the rest were dropped); a message longer than
    /// [`crate::limits::MAX_LOG_MESSAGE_BYTES`] is cut. Lines go to the
    /// `log` crate too, under the target `reflexr::run`.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db")).unwrap();
    /// engine.register_action("import", |run, ctx| {
    ///     ctx.log(log::Level::Info, "fetched the file", serde_json::json!({ "rows": 120 }))?;
    ///     Ok(())
    /// }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`Error::Invalid`] for fields larger than
    /// [`crate::limits::MAX_LOG_FIELDS_BYTES`]; [`Error::LeaseLost`] when
    /// the run's claim is no longer this attempt's (nothing is written).
    pub fn log(
        &mut self,
        level: log::Level,
        message: impl AsRef<str>,
        fields: serde_json::Value,
    ) -> Result<()> {
        use crate::base::limits::{
            MAX_LOG_FIELDS_BYTES, MAX_LOG_LINES_PER_ATTEMPT, MAX_LOG_MESSAGE_BYTES,
        };
        let fields = match fields {
            serde_json::Value::Null => None,
            f => {
                let text = f.to_string();
                if text.len() > MAX_LOG_FIELDS_BYTES {
                    return Err(Error::invalid(
                        "fields",
                        format!("{} bytes, more than {MAX_LOG_FIELDS_BYTES}", text.len()),
                    ));
                }
                Some(text)
            }
        };
        let message = crate::base::limits::clip_text(message.as_ref(), MAX_LOG_MESSAGE_BYTES);
        let run = self.run;
        log::log!(target: "reflexr::run", level, "run {}: {message}", run.id);
        let logged = match self.logged {
            Some(n) => n,
            None => {
                let attempt = i64::from(run.attempt);
                let n = self
                    .db
                    .read_with(&mut |c| crate::store::Steps::count_logs(c, &run.id, attempt))?;
                usize::try_from(n).unwrap_or(usize::MAX)
            }
        };
        if logged > MAX_LOG_LINES_PER_ATTEMPT {
            self.logged = Some(logged);
            return Ok(());
        }
        let logged = logged + 1;
        self.logged = Some(logged);
        let (level, message, fields) = if logged > MAX_LOG_LINES_PER_ATTEMPT {
            (
                log::Level::Warn,
                format!(
                    "more than {MAX_LOG_LINES_PER_ATTEMPT} lines in this attempt: the rest are dropped"
                ),
                None,
            )
        } else {
            (level, message.into_owned(), fields)
        };
        self.db.write_with(|tx| {
            let line = crate::store::steps::LogRow {
                run: run.id.clone(),
                n: 0,
                attempt: i64::from(run.attempt),
                at: tx.now_ms(),
                level: level.as_str().to_ascii_lowercase(),
                message: message.clone(),
                fields: fields.clone(),
            };
            if crate::store::Steps::append_log(tx.core(), &line, &run.holder)? {
                Ok(())
            } else {
                Err(claim_lost(run))
            }
        })
    }

    /// Says how far the attempt got: `done` of `total` (any units: rows,
    /// files, percent), kept with the run — the last said wins — and
    /// committed before this returns; operators see it with the run
    /// ([`crate::Engine::run_progress`]). Call it at steps a person would
    /// want to see, not per item of a tight loop: each call is a commit.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `done` is more than `total`;
    /// [`Error::LeaseLost`] when the run's claim is no longer this
    /// attempt's (nothing is written).
    pub fn progress(&mut self, done: u64, total: u64) -> Result<()> {
        if done > total {
            return Err(Error::invalid(
                "progress",
                format!("{done} done of {total}: done must not be more than total"),
            ));
        }
        let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let run = self.run;
        self.db.write_with(|tx| {
            let p = crate::store::steps::ProgressRow {
                attempt: i64::from(run.attempt),
                done: big(done),
                total: big(total),
                at: tx.now_ms(),
            };
            if crate::store::Steps::set_progress(tx.core(), &run.id, &run.holder, &p)? {
                Ok(())
            } else {
                Err(claim_lost(run))
            }
        })
    }

    /// The engine clock's time, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.db.now_ms()
    }

    /// True once the engine is shutting down. Shutdown waits for the handler
    /// it is in; a long handler can check this, save a checkpoint and return
    /// an error, to be retried (by this process later or by another) from
    /// where it stopped.
    pub fn is_shutting_down(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// True once an operator cancelled the run
    /// ([`crate::Operator::cancel_run`]): seen at once when the cancel was
    /// made in this process, at the next claim renewal otherwise. A handler
    /// that can stop early should; whatever it returns, the run ends
    /// `cancelled` and its completion is refused.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Emits `event` into the run's workspace when the run completes, with
    /// the id `<run id>/<key>`: a retry that emits the same key appends
    /// nothing twice. The event's causation is the event that fired the run
    /// and its depth one more than that event's.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a run with no workspace or a bad key.
    pub fn emit(&mut self, key: &str, event: NewEvent) -> Result<()> {
        let workspace = self
            .run
            .workspace
            .clone()
            .ok_or_else(|| Error::invalid("emit", "this run has no workspace; use emit_to"))?;
        self.emit_to(&workspace, key, event)
    }

    /// [`RunContext::emit`] into another workspace.
    pub fn emit_to(&mut self, workspace: &str, key: &str, event: NewEvent) -> Result<()> {
        crate::base::limits::check_name("emit key", key)?;
        crate::base::limits::check_name("workspace", workspace)?;
        let mut event = event;
        if event.traceparent.is_none() {
            event.traceparent.clone_from(&self.span);
        }
        self.emitted.push(Emitted {
            workspace: workspace.into(),
            key: key.into(),
            event,
        });
        Ok(())
    }

    /// Saves `value` for the attempts after this one (read it with
    /// [`Run::checkpoint`]), at once, under the run's claim.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the claim lapsed and another executor took the
    /// run: stop working on it. [`Error::Suspended`] once a workflow's step
    /// suspended the run. [`Error::Invalid`] for a value over the
    /// payload limit ([`crate::Builder::max_payload_bytes`]) or nested
    /// deeper than [`crate::limits::MAX_JSON_DEPTH`] (nothing is saved).
    pub fn checkpoint<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        let json = serde_json::to_string(value).map_err(|e| Error::Encode {
            message: e.to_string(),
        })?;
        let max = self.db.settings().limits.max_payload_bytes;
        changelog::check_json("checkpoint", &json, max)?;
        if self.suspended {
            // The run is no longer this attempt's to write to.
            return Err(Error::Suspended {
                run: self.run.id.clone(),
                step: String::new(),
            });
        }
        self.flush()?;
        let run = self.run;
        self.db.write_with(|tx| {
            let now = tx.now_ms();
            if Runs::save_checkpoint(
                tx.core(),
                &run.id,
                &run.holder,
                run.attempt as i64,
                &json,
                now,
            )? {
                Ok(())
            } else {
                Err(claim_lost(run))
            }
        })
    }

    /// Completes the run now, in one transaction with `f`'s writes (the
    /// application's own rows) and the events emitted so far. Nothing of it
    /// commits unless the run is still this executor's.
    ///
    /// A handler may end with it; `?` turns its error into the handler's:
    ///
    /// ```
    /// # fn main() -> reflexr::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db"))?;
    /// engine.register_action("charge", |run, ctx| {
    ///     Ok(ctx.complete(|tx| {
    ///         tx.execute("INSERT INTO charges (run) VALUES (?1)", [&run.id])?;
    ///         Ok(())
    ///     })?)
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `f`'s error (nothing committed, the run stays claimed; return an
    /// error from the handler to retry it), or [`Error::LeaseLost`].
    pub fn complete<T: Send>(
        &mut self,
        f: impl FnOnce(&mut Tx<'_, B>) -> Result<T> + Send,
    ) -> Result<T> {
        if self.suspended {
            return Err(Error::Suspended {
                run: self.run.id.clone(),
                step: String::new(),
            });
        }
        let run = self.run;
        let emitted = std::mem::take(&mut self.emitted);
        let output = self.output.clone();
        let pending = self.pending.clone();
        let value = self.db.write_with(|tx| {
            let value = f(tx)?;
            finish_success(tx, run, &emitted, output.as_deref())?;
            insert_rows(tx, &pending)?;
            Ok(value)
        });
        match value {
            Ok(v) => {
                self.pending.clear();
                self.completed = true;
                Ok(v)
            }
            Err(e) => {
                // Nothing committed: the events wait for the next completion.
                self.emitted = emitted;
                Err(e)
            }
        }
    }

    /// Writes the workflow steps recorded and not written yet, in a
    /// transaction of their own, under the run's claim.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let rows = self.pending.clone();
        let run = self.run;
        self.db.write_with(move |tx| {
            let now = tx.now_ms();
            hold(tx, run, now)?;
            insert_rows(tx, &rows)
        })?;
        self.pending.clear();
        Ok(())
    }

    /// Reads events, as [`crate::Engine::read`].
    pub fn read(&self, query: &Query) -> Result<Vec<Event>> {
        let up = &self.db.settings().upcasters;
        self.db
            .read_with(&mut |c| changelog::read_upcast(c, query, up))
    }
}

impl RunContext<'_, Sqlite> {
    /// Runs `f` on a read connection, as [`crate::Engine::with_reader`].
    pub fn with_reader<T>(&self, f: impl FnMut(&rusqlite::Connection) -> Result<T>) -> Result<T> {
        self.db.read(f)
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl RunContext<'_, crate::store::Postgres> {
    /// Runs `f` in a read-only transaction of its own, as
    /// `Engine::<Postgres>::with_reader`.
    pub fn with_reader<T>(
        &self,
        f: impl FnMut(&Tx<'_, crate::store::Postgres>) -> Result<T>,
    ) -> Result<T> {
        self.db.with_reader(f)
    }
}

/// The run's claim still holds (and no cancellation was asked for), or
/// [`Error::LeaseLost`]: the check a workflow step's record makes in its
/// transaction.
pub(crate) fn hold<B: Backend>(tx: &mut Tx<'_, B>, run: &Run, now: i64) -> Result<()> {
    if crate::store::Runs::hold_claim(tx.core(), &run.id, &run.holder, i64::from(run.attempt), now)?
    {
        Ok(())
    } else {
        Err(claim_lost(run))
    }
}

/// Writes workflow steps an attempt recorded and had not written yet, in
/// the caller's transaction (which checks the claim).
pub(crate) fn insert_rows<B: Backend>(
    tx: &mut Tx<'_, B>,
    rows: &[crate::store::steps::StepRow],
) -> Result<()> {
    for row in rows {
        crate::store::Steps::insert_step(tx.core(), row)?;
    }
    Ok(())
}

pub(crate) fn claim_lost(run: &Run) -> Error {
    Error::LeaseLost {
        name: format!("run/{}", run.id),
        holder: run.holder.clone(),
        generation: i64::from(run.attempt),
    }
}

/// In the caller's transaction: marks the run succeeded (which checks the
/// claim), appends the emitted events and moves the run's lane on. If the
/// claim is no longer ours, nothing is written and the error is
/// [`Error::LeaseLost`].
pub(crate) fn finish_success<B: Backend>(
    tx: &mut Tx<'_, B>,
    run: &Run,
    emitted: &[Emitted],
    output: Option<&str>,
) -> Result<()> {
    let now = tx.now_ms();
    if let Some(output) = output
        && !crate::store::Runs::set_output(
            tx.core(),
            &run.id,
            &run.holder,
            i64::from(run.attempt),
            output,
        )?
    {
        return Err(claim_lost(run));
    }
    // The update is the claim check: it changes the row only while the claim
    // (holder and attempt) is ours, and runs first, so a lost claim has
    // written nothing when it returns.
    if !Runs::succeed(tx.core(), &run.id, &run.holder, i64::from(run.attempt), now)? {
        return Err(claim_lost(run));
    }
    for e in emitted {
        let mut event = e.event.clone().id(format!("{}/{}", run.id, e.key));
        if event.traceparent.is_none() {
            event.traceparent.clone_from(&run.traceparent);
        }
        if event.causation_id.is_none() {
            event.causation_id.clone_from(&run.event_id);
        }
        tx.append_as(
            &e.workspace,
            &event,
            Origin::Run {
                depth: run.depth + 1,
            },
        )?;
    }
    if let Some(lane) = &run.lane {
        Lanes::advance_lane(tx.core(), lane, &run.id, now)?;
    }
    crate::work::queue::waits::child_ended(tx, &run.id, run.parent.as_deref())?;
    Ok(())
}
