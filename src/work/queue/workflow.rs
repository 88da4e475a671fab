//! Durable workflows: a run's handler as plain blocking code that re-runs
//! from the top on every attempt, where each step it reached and recorded
//! before returns its recorded output instead of running again.
//!
//! How it is kept:
//!
//! - **Steps** (`reflexr_steps`) are keyed by (run, name) and carry the
//!   position the handler reached them at. A handler reaches its steps in
//!   order; a recorded name met at another position, or a new name where
//!   the run recorded another, is [`Error::StepMoved`]: never a silent
//!   reuse. Each record is a write transaction that checks the run's claim
//!   first, so an executor whose claim lapsed records nothing.
//! - **A suspension** (a sleep, a wait, a join not over) is recorded in the
//!   same transaction as the step that waits: the run goes back `ready`,
//!   unclaimed, due when it wakes, its attempt not counted. A suspended run
//!   holds no claim and no thread; the claim reads ready runs that are due,
//!   so runs due later cost it nothing.
//! - **Waits on the log** (`reflexr_event_waits`) are indexed by what they
//!   wait for (workspace, type, subject or a payload field). A wait first
//!   looks through the log after the run began, in the transaction that
//!   records it, which on PostgreSQL takes the log's head first as appends
//!   do: an event committed before the wait is found there, and one
//!   committed after it finds the wait. Executors match the events appended
//!   since the last match ([`match_waits`], the first thing of each claim's
//!   transaction): each event costs an index look per kind of wait on its
//!   type, whatever the number of runs waiting, and an append itself costs
//!   nothing more. A matched wait records the event as the step's output
//!   and makes the run due; a timeout records `null`. Whichever commits
//!   first is the one (the step's `waiting → done` is the check).
//! - **Children** have the id `<parent>/<step>` and the parent's id in
//!   `parent`; a join records the children it waits for
//!   (`reflexr_run_waits`), and a child's end makes its waiting parent due
//!   in the transaction that ends it ([`child_ended`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::base::error::{Error, HandlerError, Result};
use crate::base::event::Event;
use crate::base::step::{EventMatch, MAX_STEPS_PER_RUN, StepInfo, StepKind, StepName, StepState};
use crate::base::upcast::Upcasters;
use crate::core::changelog;
use crate::core::db::{Backend, CoreDb, Tx};
use crate::core::wake::Wake;
use crate::store::runs::Requeued;
use crate::store::steps::{EventWait, StepRow};
use crate::store::{Events, Runs, Steps, Workspaces};
use crate::work::queue::enqueue::{self, Enqueue};
use crate::work::queue::run::{Flow, Run, RunContext, RunState, claim_lost, hold, insert_rows};

/// When a wait without a timeout is due: never (the last millisecond of
/// the year 9999, a time every JSON reader can hold).
pub const NEVER: i64 = 253_402_300_799_999;

/// How a run ended, as a join gives it to the parent.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RunEnd {
    /// The run.
    pub id: String,
    /// How it ended: succeeded, dead, discarded or cancelled.
    pub state: RunState,
    /// Its output, as JSON text ([`RunContext::set_output`]), if it
    /// succeeded with one.
    pub output: Option<String>,
    /// Its last error, if it did not succeed.
    pub error: Option<String>,
}

impl RunEnd {
    /// True when it succeeded.
    pub fn succeeded(&self) -> bool {
        self.state == RunState::Succeeded
    }

    /// Its output decoded; none when it has none.
    pub fn output<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.output
            .as_deref()
            .map(|o| {
                serde_json::from_str(o).map_err(|e| Error::Decode {
                    what: format!("output of run {}", self.id),
                    seq: None,
                    message: e.to_string(),
                })
            })
            .transpose()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "state": self.state.as_str(),
            "output": self.output.as_deref().map(|o| serde_json::from_str::<serde_json::Value>(o).unwrap_or_default()),
            "error": self.error,
        })
    }

    fn from_json(v: &serde_json::Value) -> Result<RunEnd> {
        let bad = || Error::Decode {
            what: "a join's recorded output".into(),
            seq: None,
            message: format!("not a run's end: {v}"),
        };
        Ok(RunEnd {
            id: v["id"].as_str().ok_or_else(bad)?.to_string(),
            state: v["state"].as_str().ok_or_else(bad)?.parse()?,
            output: match &v["output"] {
                serde_json::Value::Null => None,
                o => Some(o.to_string()),
            },
            error: v["error"].as_str().map(str::to_string),
        })
    }
}

/// What a step's closure is given: its name, its idempotency key and the
/// attempt it runs in.
#[derive(Debug, Clone)]
pub struct Step<'a> {
    name: &'a str,
    key: String,
    attempt: u32,
}

impl Step<'_> {
    /// The step's name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// `<run id>/<step name>`: the same on every attempt of this step, so
    /// the outside world can drop a repeat of what the closure asked for.
    pub fn idempotency_key(&self) -> &str {
        &self.key
    }

    /// The attempt running it, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

enum Reached {
    Recorded(StepRow),
    New(i64),
}

/// What a suspending step's transaction decided.
enum Waited<T> {
    Over(T),
    Suspended,
}

fn decode<T: DeserializeOwned>(run: &Run, step: &str, json: Option<&str>) -> Result<T> {
    serde_json::from_str(json.unwrap_or("null")).map_err(|e| Error::Decode {
        what: format!("recorded output of step {step:?} of run {}", run.id),
        seq: None,
        message: e.to_string(),
    })
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Encode {
        message: e.to_string(),
    })
}

fn seq_of(json: &str) -> Option<i64> {
    serde_json::from_str::<serde_json::Value>(json).ok()?["seq"].as_i64()
}

impl<'a, B: Backend> RunContext<'a, B> {
    /// Refuses a workflow step after the run suspended or completed.
    fn usable(&self, step: &StepName) -> Result<()> {
        if self.suspended {
            return Err(Error::Suspended {
                run: self.run.id.clone(),
                step: step.to_string(),
            });
        }
        if self.completed {
            return Err(Error::Conflict {
                kind: "run",
                reason: format!("{} completed already: no step after it", self.run.id),
            });
        }
        Ok(())
    }

    fn flow(&mut self) -> Result<&mut Flow> {
        if self.flow.is_none() {
            let id = self.run.id.clone();
            let rows = self.db.read_with(&mut |c| Steps::steps(c, &id))?;
            let mut flow = Flow {
                recorded: HashMap::new(),
                by_position: BTreeMap::new(),
                next: 1,
                reached: HashSet::new(),
                began: None,
                pending_begin: None,
                received: 0,
            };
            for row in rows {
                if row.kind == StepKind::Begin.as_str() {
                    flow.began = row.output.as_deref().and_then(seq_of);
                }
                if row.kind == StepKind::Wait.as_str()
                    && let Some(seq) = row.output.as_deref().and_then(seq_of)
                {
                    flow.received = flow.received.max(seq);
                }
                flow.by_position.insert(row.position, row.name.clone());
                flow.recorded.insert(row.name.clone(), row);
            }
            if flow.began.is_none() {
                // The head when the run was first claimed, recorded with its
                // first step for the timeline.
                flow.pending_begin = Some(self.run.began_seq);
            }
            self.flow = Some(flow);
        }
        Ok(self.flow.as_mut().expect("loaded above"))
    }

    /// Takes the next position for `name`, of `kind`.
    fn reach(&mut self, name: &StepName, kind: StepKind) -> Result<Reached> {
        name.check()?;
        self.usable(name)?;
        let run = self.run.id.clone();
        let flow = self.flow()?;
        let moved = |reason: String| Error::StepMoved {
            run: run.clone(),
            step: name.to_string(),
            reason,
        };
        if !flow.reached.insert(name.0.clone()) {
            return Err(moved(
                "the name was reached already in this attempt; name a loop's steps by turn, \
                 (\"send\", i)"
                    .into(),
            ));
        }
        let position = flow.next;
        flow.next += 1;
        if let Some(row) = flow.recorded.get(&name.0) {
            if row.position != position {
                return Err(moved(format!(
                    "recorded at position {}, reached at {position}",
                    row.position
                )));
            }
            if row.kind != kind.as_str() {
                return Err(moved(format!(
                    "recorded as a {} step, reached as a {kind} step",
                    row.kind
                )));
            }
            return Ok(Reached::Recorded(row.clone()));
        }
        if let Some(other) = flow.by_position.get(&position) {
            return Err(moved(format!(
                "the run recorded step {other:?} at position {position}; code changed under a \
                 run that had passed here takes a new path behind RunContext::patched"
            )));
        }
        if flow.recorded.len() >= MAX_STEPS_PER_RUN {
            return Err(Error::invalid(
                "steps",
                format!("run {run} has {MAX_STEPS_PER_RUN} steps, the most one run records"),
            ));
        }
        Ok(Reached::New(position))
    }

    /// Gives back the position a step took when it recorded nothing.
    fn unreach(&mut self, name: &StepName) {
        if let Some(flow) = self.flow.as_mut() {
            flow.next -= 1;
            flow.reached.remove(&name.0);
        }
    }

    fn new_row(&self, name: &StepName, position: i64, kind: StepKind, now: i64) -> StepRow {
        StepRow {
            run: self.run.id.clone(),
            name: name.0.clone(),
            position,
            kind: kind.as_str().into(),
            state: StepState::Done.as_str().into(),
            attempt: i64::from(self.run.attempt),
            output: None,
            detail: "{}".into(),
            wake_at: None,
            recorded_at: now,
        }
    }

    /// Notes what this attempt recorded, once its transaction committed.
    fn recorded(&mut self, row: StepRow) {
        if let Some(flow) = self.flow.as_mut() {
            if flow.began.is_none() {
                flow.began = flow.pending_begin.take();
            }
            if let Some(seq) = row.output.as_deref().and_then(seq_of)
                && row.kind == StepKind::Wait.as_str()
            {
                flow.received = flow.received.max(seq);
            }
            flow.by_position.insert(row.position, row.name.clone());
            flow.recorded.insert(row.name.clone(), row);
        }
    }

    fn pending_begin(&self) -> Option<i64> {
        self.flow.as_ref().and_then(|f| f.pending_begin)
    }

    fn suspended_at(&mut self, name: &StepName) -> Error {
        self.suspended = true;
        Error::Suspended {
            run: self.run.id.clone(),
            step: name.to_string(),
        }
    }

    /// Runs `f` once and records its output: every later attempt of the run
    /// returns the recorded output instead of running `f` again.
    ///
    /// The record is durable before anything after it acts: it commits
    /// before the next step's closure runs, or in the transaction of what
    /// comes next (a `step_tx`, a sleep, a wait, a spawn, a join, or the
    /// run's settlement, whatever the handler returns) — so the last step
    /// of a workflow costs no commit of its own.
    ///
    /// `f` is what the run does outside the file — a charge, a mail, a call —
    /// and runs at least once: if the process dies between `f`'s effect and
    /// the record, the next attempt runs this step again (and only this
    /// step). [`Step::idempotency_key`], `<run id>/<step name>`, is the same
    /// on every attempt; give it to the outside world so that it can drop a
    /// repeat. The output is recorded as JSON: what `T` serialises to, and
    /// decodes from on later attempts. Steps are reached in order; name a
    /// loop's steps by turn (`("send", i)`).
    ///
    /// ```
    /// # fn main() -> reflexr::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = reflexr::Engine::open(dir.path().join("app.db"))?;
    /// engine.register_action("checkout", |_run, ctx| {
    ///     let charge: String = ctx.step("charge", |step| {
    ///         // payments.charge(99, step.idempotency_key())
    ///         Ok::<_, std::io::Error>(format!("ch_{}", step.idempotency_key()))
    ///     })?;
    ///     ctx.step("receipt", |_| Ok::<_, std::io::Error>(println!("receipt for {charge}")))?;
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::StepFailed`] when `f` fails (nothing recorded: the attempt
    /// fails and the run's retry policy applies); [`Error::StepMoved`];
    /// [`Error::Invalid`] for a bad name, an output over the payload limit
    /// ([`crate::Builder::max_payload_bytes`]) or a run at
    /// [`crate::limits::MAX_STEPS_PER_RUN`]; [`Error::LeaseLost`] when the
    /// run's claim lapsed, or its cancellation was asked for.
    pub fn step<T, E>(
        &mut self,
        name: impl Into<StepName>,
        f: impl FnOnce(&Step<'_>) -> std::result::Result<T, E>,
    ) -> Result<T>
    where
        T: Serialize + DeserializeOwned,
        E: Into<HandlerError>,
    {
        let name = name.into();
        let position = match self.reach(&name, StepKind::Step)? {
            Reached::Recorded(row) => return decode(self.run, &name.0, row.output.as_deref()),
            Reached::New(p) => p,
        };
        // What the step before recorded is durable before this one acts;
        // a run asked to stop here acts no more.
        let ready = if self.is_cancelled() {
            Err(claim_lost(self.run))
        } else {
            self.flush()
        };
        if let Err(e) = ready {
            self.unreach(&name);
            return Err(e);
        }
        let step = Step {
            name: &name.0,
            key: format!("{}/{}", self.run.id, name),
            attempt: self.run.attempt,
        };
        let value = match f(&step) {
            Ok(v) => v,
            Err(e) => {
                self.unreach(&name);
                return Err(Error::StepFailed {
                    step: name.0.clone(),
                    message: e.into().to_string(),
                });
            }
        };
        let json = match self.check_output(&value) {
            Ok(json) => json,
            Err(e) => {
                self.unreach(&name);
                return Err(e);
            }
        };
        let mut row = self.new_row(&name, position, StepKind::Step, self.db.now_ms());
        row.output = Some(json);
        // Written with what comes next: the next step's record, or the
        // run's settlement, in their transaction.
        if let Some(begin) = self.begin_row(row.recorded_at) {
            self.pending.push(begin);
        }
        self.pending.push(row.clone());
        self.recorded(row);
        Ok(value)
    }

    /// The row of where the run began, if this attempt records it first.
    fn begin_row(&self, now: i64) -> Option<StepRow> {
        self.pending_begin()
            .map(|seq| begin_row(self.run, seq, now))
    }

    /// Runs `f` inside the write transaction that records the step: the
    /// application's rows `f` writes and the step's record commit together,
    /// or neither does — **exactly once** for what it writes to the file.
    /// Later attempts return the recorded output and do not call `f`.
    ///
    /// # Errors
    /// `f`'s error (nothing of it committed, nothing recorded), and those of
    /// [`RunContext::step`].
    pub fn step_tx<T>(
        &mut self,
        name: impl Into<StepName>,
        f: impl FnOnce(&mut Tx<'_, B>) -> Result<T> + Send,
    ) -> Result<T>
    where
        T: Serialize + DeserializeOwned + Send,
    {
        let name = name.into();
        let position = match self.reach(&name, StepKind::Tx)? {
            Reached::Recorded(row) => return decode(self.run, &name.0, row.output.as_deref()),
            Reached::New(p) => p,
        };
        let max = self.db.settings().limits.max_payload_bytes;
        let row = self.new_row(&name, position, StepKind::Tx, self.db.now_ms());
        let written = self.record_with(&row, move |tx, row| {
            let value = f(tx)?;
            let json = encode(&value)?;
            changelog::check_json("step output", &json, max)?;
            row.output = Some(json);
            Ok(value)
        });
        match written {
            Ok((value, row)) => {
                self.recorded(row);
                Ok(value)
            }
            Err(e) => {
                self.unreach(&name);
                Err(e)
            }
        }
    }

    fn check_output<T: Serialize + ?Sized>(&self, value: &T) -> Result<String> {
        let json = encode(value)?;
        changelog::check_json(
            "step output",
            &json,
            self.db.settings().limits.max_payload_bytes,
        )?;
        Ok(json)
    }

    /// Records `row` (and where the run began, if it had not) in one
    /// transaction with `f`'s writes, under the run's claim.
    fn record(
        &mut self,
        row: &StepRow,
        f: impl FnOnce(&mut Tx<'_, B>) -> Result<()> + Send,
    ) -> Result<()> {
        self.record_with(row, |tx, _| f(tx)).map(|_| ())
    }

    /// [`RunContext::record`], where `f` may fill the row in (a step_tx's
    /// output): the row as recorded comes back with `f`'s value.
    fn record_with<T: Send>(
        &mut self,
        row: &StepRow,
        f: impl FnOnce(&mut Tx<'_, B>, &mut StepRow) -> Result<T> + Send,
    ) -> Result<(T, StepRow)> {
        let run = self.run;
        let begin = self.pending_begin();
        let mut row = row.clone();
        let pending = self.pending.clone();
        let written = self.db.write_with(move |tx| {
            let now = tx.now_ms();
            hold(tx, run, now)?;
            insert_rows(tx, &pending)?;
            let value = f(tx, &mut row)?;
            row.recorded_at = now;
            insert_with_begin(tx, run, begin, &row, now)?;
            Ok((value, row))
        });
        if written.is_ok() {
            // The steps not written yet committed with it.
            self.pending.clear();
        }
        written
    }

    /// Sleeps durably until `d` from when this step is first reached: the
    /// run suspends — no executor thread, no claim held — and continues,
    /// from the top, once the time has come (by the engine's clock: a
    /// [`crate::ManualClock`] drives it in tests). On the attempts after,
    /// the step returns at once once its time has passed.
    ///
    /// # Errors
    /// [`Error::Suspended`] when the run suspended: return it from the
    /// handler (`?` does). [`Error::StepMoved`], [`Error::Invalid`],
    /// [`Error::LeaseLost`] as [`RunContext::step`].
    pub fn sleep(&mut self, name: impl Into<StepName>, d: Duration) -> Result<()> {
        // A recorded sleep keeps the time it recorded: `at` counts only
        // when the step is first reached.
        let at = self
            .db
            .now_ms()
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.sleep_until(name, at)
    }

    /// [`RunContext::sleep`] until a time (ms since the epoch, by the
    /// engine's clock).
    ///
    /// # Errors
    /// As [`RunContext::sleep`].
    pub fn sleep_until(&mut self, name: impl Into<StepName>, at_ms: i64) -> Result<()> {
        let name = name.into();
        let position = match self.reach(&name, StepKind::Sleep)? {
            Reached::Recorded(row) => return self.sleep_recorded(&name, &row),
            Reached::New(p) => p,
        };
        let now = self.db.now_ms();
        let mut row = self.new_row(&name, position, StepKind::Sleep, now);
        row.detail = serde_json::json!({ "until": at_ms }).to_string();
        row.wake_at = Some(at_ms);
        if at_ms <= now {
            let written = self.record(&row, |_| Ok(()));
            return self.noted(&name, row, written);
        }
        row.state = StepState::Waiting.as_str().into();
        let run = self.run;
        let suspended = self.record(&row, move |tx| suspend(tx, run, at_ms));
        self.noted(&name, row, suspended)?;
        Err(self.suspended_at(&name))
    }

    /// What a step's record came to: noted once it committed, its position
    /// given back when it did not.
    fn noted(&mut self, name: &StepName, row: StepRow, written: Result<()>) -> Result<()> {
        match written {
            Ok(()) => {
                self.recorded(row);
                Ok(())
            }
            Err(e) => {
                self.unreach(name);
                Err(e)
            }
        }
    }

    fn sleep_recorded(&mut self, name: &StepName, row: &StepRow) -> Result<()> {
        if row.state == StepState::Done.as_str() {
            return Ok(());
        }
        let wake = row.wake_at.unwrap_or(0);
        let run = self.run;
        let step = name.0.clone();
        let pending = self.pending.clone();
        let over = self.db.write_with(move |tx| {
            let now = tx.now_ms();
            insert_rows(tx, &pending)?;
            if now >= wake {
                hold(tx, run, now)?;
                Steps::resolve_step(tx.core(), &run.id, &step, "null", now)?;
                Ok(Waited::Over(()))
            } else {
                suspend(tx, run, wake)?;
                Ok::<_, Error>(Waited::Suspended)
            }
        })?;
        self.pending.clear();
        match over {
            Waited::Over(()) => {
                self.mark_done(name, Some("null".into()));
                Ok(())
            }
            Waited::Suspended => Err(self.suspended_at(name)),
        }
    }

    fn mark_done(&mut self, name: &StepName, output: Option<String>) {
        if let Some(flow) = self.flow.as_mut()
            && let Some(row) = flow.recorded.get_mut(&name.0)
        {
            row.state = StepState::Done.as_str().into();
            if row.kind == StepKind::Wait.as_str()
                && let Some(seq) = output.as_deref().and_then(seq_of)
            {
                flow.received = flow.received.max(seq);
            }
            row.output = output;
        }
    }

    /// Waits durably for the first event of the log that matches `what`
    /// appended after the run began — after the log's head when it was
    /// first claimed — and after the event this run's previous wait
    /// received, for up to `timeout` (none: for as long as it takes).
    /// Returns the event, or `None` once the timeout passed.
    ///
    /// The log is the mailbox: an event appended before this step was
    /// reached — while the run slept, or while no process ran — is found
    /// all the same, when the step is first reached. Otherwise the run
    /// suspends, holding no claim and no thread, and continues from the
    /// top once a matching event is appended or the timeout passes; the
    /// step then returns the event (or `None`) on every attempt after. A
    /// wait wakes once: on the first matching event, or on its timeout,
    /// whichever is recorded first.
    ///
    /// # Errors
    /// [`Error::Suspended`] when the run suspended: return it from the
    /// handler (`?` does). [`Error::NotFound`] for a workspace or an event
    /// type the workspace does not accept; the errors of
    /// [`RunContext::step`].
    pub fn wait_for_event(
        &mut self,
        name: impl Into<StepName>,
        what: &EventMatch,
        timeout: Option<Duration>,
    ) -> Result<Option<Event>> {
        let name = name.into();
        let key = what.check()?.to_string();
        let position = match self.reach(&name, StepKind::Wait)? {
            Reached::Recorded(row) => return self.wait_recorded(&name, &row),
            Reached::New(p) => p,
        };
        let now = self.db.now_ms();
        let deadline = timeout.map(|t| {
            now.saturating_add(i64::try_from(t.as_millis()).unwrap_or(i64::MAX))
                .min(NEVER)
        });
        let mut row = self.new_row(&name, position, StepKind::Wait, now);
        let mut detail = what.describe();
        detail["timeout_at"] = deadline.into();
        row.detail = detail.to_string();
        row.wake_at = deadline;
        let flow = self.flow.as_ref().expect("reached");
        let after = flow
            .began
            .or(flow.pending_begin)
            .unwrap_or(0)
            .max(flow.received);
        let run = self.run;
        let begin = self.pending_begin();
        let what = what.clone();
        let step = name.0.clone();
        let pending = self.pending.clone();
        let result = self.db.write_with(move |tx| {
            let now = tx.now_ms();
            insert_rows(tx, &pending)?;
            // As an append does: matches and appends never pass each other.
            Events::lock_head(tx.core())?;
            hold(tx, run, now)?;
            if !Workspaces::exists(tx.core(), &what.workspace)? {
                return Err(Error::not_found("workspace", &what.workspace));
            }
            let types = Workspaces::app_types(tx.core(), &what.workspace)?;
            if !types.contains(&what.event_type) {
                return Err(Error::not_found(
                    "event type",
                    format!("{} in workspace {}", what.event_type, what.workspace),
                ));
            }
            row.recorded_at = now;
            let up = &tx.env().settings.upcasters;
            if let Some(event) = find_in_log(tx.core(), &what, &key, after, up)? {
                row.output = Some(encode(&event)?);
                insert_with_begin(tx, run, begin, &row, now)?;
                return Ok((Waited::Over(Some(event)), row));
            }
            if deadline.is_some_and(|d| d <= now) {
                row.output = Some("null".into());
                insert_with_begin(tx, run, begin, &row, now)?;
                return Ok((Waited::Over(None), row));
            }
            row.state = StepState::Waiting.as_str().into();
            insert_with_begin(tx, run, begin, &row, now)?;
            let head = Events::head(tx.core())?;
            Steps::insert_event_wait(
                tx.core(),
                &EventWait {
                    run: &run.id,
                    step: &step,
                    workspace: &what.workspace,
                    event_type: &what.event_type,
                    by: &what.by,
                    key: &key,
                    after_seq: head,
                },
            )?;
            suspend(tx, run, deadline.unwrap_or(NEVER))?;
            Ok((Waited::Suspended, row))
        });
        match result {
            Ok((waited, row)) => {
                self.pending.clear();
                self.recorded(row);
                match waited {
                    Waited::Over(event) => Ok(event),
                    Waited::Suspended => {
                        // Appends wake this process's executors from now
                        // on, and this one wakes them for what came since
                        // the commit (`core::wake::WaitsHint`).
                        self.db.waits_hint().recorded();
                        self.db.nudge_for(Wake::RUNS);
                        Err(self.suspended_at(&name))
                    }
                }
            }
            Err(e) => {
                self.unreach(&name);
                Err(e)
            }
        }
    }

    fn wait_recorded(&mut self, name: &StepName, row: &StepRow) -> Result<Option<Event>> {
        if row.state == StepState::Done.as_str() {
            return self.received_event(row.output.as_deref());
        }
        let wake = row.wake_at.unwrap_or(NEVER);
        let run = self.run;
        let step = name.0.clone();
        let pending = self.pending.clone();
        let over = self.db.write_with(move |tx| {
            let now = tx.now_ms();
            insert_rows(tx, &pending)?;
            if now < wake {
                suspend(tx, run, wake)?;
                return Ok::<_, Error>(Waited::Suspended);
            }
            hold(tx, run, now)?;
            if Steps::resolve_step(tx.core(), &run.id, &step, "null", now)? {
                Steps::delete_event_wait(tx.core(), &run.id, &step)?;
                return Ok(Waited::Over(None));
            }
            // The event came first: it is the output.
            let output = Steps::steps(tx.core(), &run.id)?
                .into_iter()
                .find(|s| s.name == step)
                .and_then(|s| s.output);
            Ok(Waited::Over(output))
        })?;
        self.pending.clear();
        match over {
            Waited::Over(output) => {
                let output = output.unwrap_or_else(|| "null".into());
                self.mark_done(name, Some(output.clone()));
                self.received_event(Some(&output))
            }
            Waited::Suspended => Err(self.suspended_at(name)),
        }
    }

    /// The event a wait recorded: read again from the log (as it was
    /// appended), or from the record if the log was pruned since.
    fn received_event(&self, output: Option<&str>) -> Result<Option<Event>> {
        let Some(json) = output.filter(|o| *o != "null") else {
            return Ok(None);
        };
        let Some(seq) = seq_of(json) else {
            return Ok(None);
        };
        let mut event = match self.db.read_with(&mut |c| Events::get(c, seq))? {
            Some(event) => event,
            None => Event::from_json(json)?,
        };
        self.db.settings().upcasters.apply(&mut event);
        Ok(Some(event))
    }

    /// Enqueues `child` as a child of this run, once: its id is `<run
    /// id>/<step name>`, and later attempts return that id without
    /// enqueueing again. The child runs as any run of its action does; a
    /// [`RunContext::join`] waits for it to end, and a cancel of this run
    /// cancels it too ([`crate::Operator::cancel_run`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a child with a uniqueness key or an id of its
    /// own (a child's id is its parent's and step's), or a run id and step
    /// name longer together than [`crate::limits::MAX_ID_BYTES`]; the
    /// errors of [`RunContext::step`].
    pub fn spawn(&mut self, name: impl Into<StepName>, child: Enqueue) -> Result<String> {
        let name = name.into();
        if child.unique.is_some() || child.id.is_some() {
            return Err(Error::invalid(
                "spawn",
                "a child run's id is its parent's and step's: no id or uniqueness key of its own",
            ));
        }
        let position = match self.reach(&name, StepKind::Spawn)? {
            Reached::Recorded(row) => {
                let v: serde_json::Value = decode(self.run, &name.0, row.output.as_deref())?;
                return Ok(v["id"].as_str().unwrap_or_default().to_string());
            }
            Reached::New(p) => p,
        };
        let id = format!("{}/{}", self.run.id, name);
        let mut child = child;
        child.id = Some(id.clone());
        child.parent = Some(self.run.id.clone());
        let mut row = self.new_row(&name, position, StepKind::Spawn, self.db.now_ms());
        row.output = Some(serde_json::json!({ "id": id }).to_string());
        let run = self.run;
        let written = self.record(&row, move |tx| {
            let made = enqueue::enqueue(tx, &child)?;
            if made.deduplicated
                && Runs::get(tx.core(), &made.id)?
                    .and_then(|r| r.parent)
                    .as_deref()
                    != Some(run.id.as_str())
            {
                return Err(Error::invalid(
                    "spawn",
                    format!(
                        "the id {} is another run's; name the step otherwise",
                        made.id
                    ),
                ));
            }
            tx.mark_runs();
            Ok(())
        });
        self.noted(&name, row, written).map(|()| id)
    }

    /// Waits durably until every run of `children` (this run's, from
    /// [`RunContext::spawn`]) has ended, and returns how each ended, in the
    /// order given. The run suspends, holding no claim and no thread, until
    /// the last of them ends; later attempts return the recorded ends.
    ///
    /// # Errors
    /// [`Error::Suspended`] when the run suspended: return it from the
    /// handler (`?` does). [`Error::Invalid`] for a run that is not a child
    /// of this one; the errors of [`RunContext::step`].
    pub fn join<S: AsRef<str>>(
        &mut self,
        name: impl Into<StepName>,
        children: &[S],
    ) -> Result<Vec<RunEnd>> {
        let name = name.into();
        let ids: Vec<String> = children.iter().map(|c| c.as_ref().to_string()).collect();
        let (position, recorded) = match self.reach(&name, StepKind::Join)? {
            Reached::Recorded(row) if row.state == StepState::Done.as_str() => {
                let v: Vec<serde_json::Value> = decode(self.run, &name.0, row.output.as_deref())?;
                return v.iter().map(RunEnd::from_json).collect();
            }
            Reached::Recorded(row) => (row.position, true),
            Reached::New(p) => (p, false),
        };
        let now = self.db.now_ms();
        let mut row = self.new_row(&name, position, StepKind::Join, now);
        row.detail = serde_json::json!({ "runs": ids }).to_string();
        let run = self.run;
        let begin = self.pending_begin();
        let step = name.0.clone();
        let pending = self.pending.clone();
        let result = self.db.write_with(move |tx| {
            let now = tx.now_ms();
            // The children's rows before this run's, as a child's end
            // takes them (its own, then its parent's): the two never wait
            // for each other in a circle.
            let mut in_order = ids.clone();
            in_order.sort();
            Runs::lock_runs(tx.core(), &in_order)?;
            insert_rows(tx, &pending)?;
            hold(tx, run, now)?;
            let mut ends = Vec::with_capacity(ids.len());
            let mut open = Vec::new();
            for id in &ids {
                let child = Runs::get(tx.core(), id)?
                    .filter(|c| c.parent.as_deref() == Some(run.id.as_str()))
                    .ok_or_else(|| {
                        Error::invalid("join", format!("{id} is not a child of run {}", run.id))
                    })?;
                let state: RunState = child.state.parse()?;
                if ended(state) {
                    ends.push(RunEnd {
                        id: child.id,
                        state,
                        output: child.output,
                        error: if state == RunState::Succeeded {
                            None
                        } else {
                            child.last_error
                        },
                    });
                } else {
                    open.push(child.id);
                }
            }
            row.recorded_at = now;
            if open.is_empty() {
                let value = serde_json::Value::Array(ends.iter().map(RunEnd::to_json).collect());
                // What later attempts decode, so every attempt sees the same.
                let ends = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(RunEnd::from_json)
                    .collect::<Result<Vec<_>>>()?;
                let json = value.to_string();
                if recorded {
                    Steps::resolve_step(tx.core(), &run.id, &step, &json, now)?;
                    Steps::delete_waits_of(tx.core(), &run.id)?;
                } else {
                    row.output = Some(json);
                    insert_with_begin(tx, run, begin, &row, now)?;
                }
                return Ok((Waited::Over(ends), row));
            }
            if !recorded {
                row.state = StepState::Waiting.as_str().into();
                insert_with_begin(tx, run, begin, &row, now)?;
            }
            for child in &open {
                Steps::insert_run_wait(tx.core(), child, &run.id, &step)?;
            }
            suspend(tx, run, NEVER)?;
            Ok((Waited::Suspended, row))
        });
        match result {
            Ok((waited, row)) => {
                self.pending.clear();
                if recorded {
                    if let Waited::Over(ends) = &waited {
                        let json =
                            serde_json::Value::Array(ends.iter().map(RunEnd::to_json).collect())
                                .to_string();
                        self.mark_done(&name, Some(json));
                    }
                } else {
                    self.recorded(row);
                }
                match waited {
                    Waited::Over(ends) => Ok(ends),
                    Waited::Suspended => Err(self.suspended_at(&name)),
                }
            }
            Err(e) => {
                if !recorded {
                    self.unreach(&name);
                }
                Err(e)
            }
        }
    }

    /// [`RunContext::join`] on one child.
    ///
    /// # Errors
    /// As [`RunContext::join`].
    pub fn wait_for_run(&mut self, name: impl Into<StepName>, child: &str) -> Result<RunEnd> {
        let mut ends = self.join(name, &[child])?;
        Ok(ends.remove(0))
    }

    /// True when this run takes the code path named `name`: every run that
    /// reaches this point for the first time does (and records that it
    /// did, as the step `patch:<name>`), while a run that had passed this point before the code changed
    /// — it recorded steps from here on, on the old code — does not.
    ///
    /// Change a workflow while runs sleep in it by putting the new code
    /// behind `if ctx.patched("name")? { new } else { old }`: old runs keep
    /// the steps they recorded, new runs take the new ones. Once no run of
    /// the old code is left, the old branch can go (keep the `patched`
    /// call, or remove both together when no run that took it is left).
    ///
    /// # Errors
    /// The errors of [`RunContext::step`].
    pub fn patched(&mut self, name: impl Into<StepName>) -> Result<bool> {
        // Recorded as `patch:<name>`, beside the steps (which may take the
        // same name).
        let name = StepName(format!("patch:{}", name.into()));
        name.check()?;
        self.usable(&name)?;
        let flow = self.flow()?;
        let passed = !flow.recorded.contains_key(&name.0)
            && flow.by_position.range(flow.next..).next().is_some();
        if passed {
            return Ok(false);
        }
        let position = match self.reach(&name, StepKind::Patch)? {
            Reached::Recorded(_) => return Ok(true),
            Reached::New(p) => p,
        };
        let mut row = self.new_row(&name, position, StepKind::Patch, self.db.now_ms());
        row.output = Some("true".into());
        let written = self.record(&row, |_| Ok(()));
        self.noted(&name, row, written).map(|()| true)
    }

    /// Sets what the run returns when it succeeds: recorded with its
    /// success, read by [`crate::Engine::run_output`],
    /// [`crate::Engine::wait_for_run`]'s `RunInfo::output`, and a parent's
    /// [`RunContext::join`]. The last value set before the run succeeds is
    /// the one.
    ///
    /// # Errors
    /// [`Error::Encode`]; [`Error::Invalid`] for a value over the payload
    /// limit.
    pub fn set_output<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        let json = self.check_output(value)?;
        self.output = Some(json);
        Ok(())
    }
}

fn suspend<B: Backend>(tx: &mut Tx<'_, B>, run: &Run, due_at: i64) -> Result<()> {
    let now = tx.now_ms();
    match Runs::suspend(
        tx.core(),
        &run.id,
        &run.holder,
        i64::from(run.attempt),
        due_at,
        now,
    )? {
        Requeued::No | Requeued::Cancelled => Err(claim_lost(run)),
        Requeued::Ready => {
            // Threads waiting for runs, and executors, look again.
            tx.mark_runs();
            Ok(())
        }
    }
}

fn begin_row(run: &Run, seq: i64, now: i64) -> StepRow {
    StepRow {
        run: run.id.clone(),
        name: "begin".into(),
        position: 0,
        kind: StepKind::Begin.as_str().into(),
        state: StepState::Done.as_str().into(),
        attempt: i64::from(run.attempt),
        output: Some(serde_json::json!({ "seq": seq }).to_string()),
        detail: "{}".into(),
        wake_at: None,
        recorded_at: now,
    }
}

fn insert_with_begin<B: Backend>(
    tx: &mut Tx<'_, B>,
    run: &Run,
    begin: Option<i64>,
    row: &StepRow,
    now: i64,
) -> Result<()> {
    if let Some(seq) = begin {
        Steps::insert_step(tx.core(), &begin_row(run, seq, now))?;
    }
    Steps::insert_step(tx.core(), row)
}

/// Whether a run in `state` has ended.
pub(crate) fn ended(state: RunState) -> bool {
    matches!(
        state,
        RunState::Succeeded | RunState::Dead | RunState::Discarded | RunState::Cancelled
    )
}

/// The first event of the log after `after` that `what` matches.
fn find_in_log<C: Events + ?Sized>(
    conn: &C,
    what: &EventMatch,
    key: &str,
    after: i64,
    up: &Upcasters,
) -> Result<Option<Event>> {
    // As the workflow reads events: by the newest version, upcast.
    let Some(types) = up.stored_types(std::slice::from_ref(&what.event_type)) else {
        return Ok(None);
    };
    let mut after = after;
    loop {
        let mut page = if what.by == "subject" {
            Events::by_subject(conn, &what.workspace, after, &types, key, 500)?
        } else {
            Events::page(conn, &what.workspace, after, &types, 500)?
        };
        let Some(last) = page.last() else {
            return Ok(None);
        };
        after = last.seq;
        up.apply_all(&mut page);
        for event in page {
            if what.by.is_empty() || what.by == "subject" {
                return Ok(Some(event));
            }
            if EventMatch::key_of(&what.by, &event.subject, event.json()?).as_deref() == Some(key) {
                return Ok(Some(event));
            }
        }
    }
}

/// A run's timeline: its recorded steps, in the order it reached them.
pub(crate) fn timeline<C: Runs + Steps + ?Sized>(conn: &C, id: &str) -> Result<Vec<StepInfo>> {
    if Runs::get(conn, id)?.is_none() {
        return Err(Error::not_found("run", id));
    }
    Steps::steps(conn, id)?
        .into_iter()
        .map(|s| {
            Ok(StepInfo {
                kind: s.kind.parse()?,
                state: s.state.parse()?,
                output_bytes: s.output.as_ref().map_or(0, String::len),
                run: s.run,
                name: s.name,
                position: s.position,
                attempt: u32::try_from(s.attempt).unwrap_or(0),
                recorded_at: s.recorded_at,
                output: s.output,
                detail: s.detail,
                wake_at: s.wake_at,
            })
        })
        .collect()
}
