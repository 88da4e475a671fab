//! [`Operator`]: what an operator does to the file, on the record.

use crate::base::error::{Error, Result};
use crate::core::cursor::{self, ConsumerKind, CursorReset};
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::engine::Engine;
use crate::store::Sqlite;
use crate::work::control::{self, ActionConfig, Pausable};
use crate::work::inspect::{DeadLetterFilter, RunFilter};
use crate::work::operate::{self, Bulk, MAX_BULK, Matches, RuleReset};
use crate::work::prune::{Pruned, Retention};

/// An operator acting on the file, from [`Engine::operator`]: every
/// intervention is checked (a typed error for what cannot be done: only a
/// dead run is retried or discarded, only a blocked scope unblocked) and
/// recorded in `reflexr_audit` with the operator and the reason, in the same
/// transaction as the change it makes.
///
/// ```
/// # fn main() -> reflexr::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = reflexr::Engine::open(dir.path().join("app.db"))?;
/// let ops = engine.operator("ops@example", "the mail server is back")?;
/// for run in engine.runs(Some(reflexr::RunState::Dead), 100)? {
///     ops.retry_run(&run.id)?;
/// }
/// # Ok(()) }
/// ```
///
/// Every intervention works on every backend.
#[derive(Clone)]
pub struct Operator<'e, B: Backend = Sqlite> {
    engine: &'e Engine<B>,
    operator: String,
    reason: String,
}

impl<B: Backend> std::fmt::Debug for Operator<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("operator", &self.operator)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Engine<B> {
    /// The operator view: interventions by `operator` (who, as they name
    /// themselves), for `reason` (why), each checked and audited.
    ///
    /// # Errors
    /// [`Error::Invalid`] unless the operator is 1 to 256 bytes and the
    /// reason 1 to 4,096, neither with control characters: checked here,
    /// once, so that every intervention of the view records who and why.
    pub fn operator(
        &self,
        operator: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<Operator<'_, B>> {
        let (operator, reason) = (operator.into(), reason.into());
        operate::check_operator(&operator, &reason)?;
        Ok(Operator {
            engine: self,
            operator,
            reason,
        })
    }
}

impl<B: Backend> Operator<'_, B> {
    /// The dead runs `filter` matches, at most `max`: what a bulk retry or
    /// discard ([`crate::Operator::retry_runs`]) would act on — its dry run.
    pub fn matching_dead_runs(&self, filter: &RunFilter, max: usize) -> Result<Matches<String>> {
        self.engine
            .db()
            .read_with(&mut |c| operate::matching_dead_runs(c, filter, max.min(MAX_BULK)))
    }

    /// The open dead letters `filter` matches, at most `max`: what
    /// [`Operator::retry_dead_letters`] would act on (the dry run).
    pub fn matching_dead_letters(
        &self,
        filter: &DeadLetterFilter,
        max: usize,
    ) -> Result<Matches<i64>> {
        self.engine
            .db()
            .read_with(&mut |c| operate::matching_dead_letters(c, filter, max.min(MAX_BULK)))
    }

    fn who(&self) -> (&str, &str) {
        (&self.operator, &self.reason)
    }

    /// Sets any consumer's cursor to `position`, backwards if need be: the one
    /// way a cursor moves back (invariant 8).
    pub fn reset_cursor(
        &self,
        workspace: &str,
        kind: ConsumerKind,
        name: &str,
        position: i64,
    ) -> Result<CursorReset> {
        let (op, why) = self.who();
        self.engine.write(|tx| {
            let now = tx.now_ms();
            cursor::reset(tx.core(), now, (workspace, kind, name), position, op, why)
        })
    }

    /// Pauses an action, a channel, a scheduled job, a rule or a reaction
    /// (see [`Pausable`]), in every process on the file. False when it was
    /// paused already. Once this returns, no handler of a paused action
    /// starts in this process, nor later than a heartbeat after in another;
    /// its runs claimed and not started go back to ready, unattempted.
    pub fn pause(&self, what: &Pausable) -> Result<bool> {
        let (op, why) = self.who();
        let paused = self
            .engine
            .write(|tx| control::pause(tx.core(), what, tx.now_ms(), op, why))?;
        // This process's executors start nothing more of it from now on.
        self.engine.tell_paused();
        Ok(paused)
    }

    /// Resumes what was paused: it goes on from where it stood.
    ///
    /// # Errors
    /// [`Error::NotFound`] when it was not paused.
    pub fn resume(&self, what: &Pausable) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| control::resume(tx.core(), what, tx.now_ms(), op, why))?;
        self.engine.nudge_all();
        Ok(())
    }

    /// Cancels a run: a pending one ends `cancelled` at once (it never
    /// starts, nor does one an executor claimed and had not started: here
    /// from when this returns, in another process within a heartbeat); a
    /// running one is asked to stop — its handler sees
    /// [`crate::RunContext::is_cancelled`] (at once in this process, at its
    /// next claim renewal in another) and its completion is refused: it ends
    /// `cancelled`. Returns the state it was in.
    ///
    /// A suspended workflow (sleeping, waiting for an event or for its
    /// children) is pending: it ends at once. The cancel cascades: the
    /// runs it spawned ([`crate::RunContext::spawn`]) that have not ended
    /// are cancelled with it, and theirs, each as above (the audit entry
    /// lists them). A parent that waits for a cancelled child is woken, and
    /// its join returns the child's end (`cancelled`).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Conflict`] for a run that has ended.
    pub fn cancel_run(&self, id: &str) -> Result<crate::work::queue::run::RunState> {
        let (op, why) = self.who();
        let (was, children) = self
            .engine
            .write(|tx| control::cancel(tx.core(), id, tx.now_ms(), op, why))?;
        self.engine.tell_cancelled(id);
        for child in &children {
            self.engine.tell_cancelled(child);
        }
        was.parse()
    }

    /// Resets a workflow run to one of its steps: `step` and every step the
    /// run recorded after it are forgotten, and the run is ready now with
    /// fresh attempts, so its handler runs them again from there (the
    /// steps before it return what they recorded). For a run that ended —
    /// succeeded, dead (its dead letter is resolved `retried`), discarded,
    /// cancelled — or one suspended. Audited, with how many steps were
    /// forgotten.
    ///
    /// **What the forgotten steps did outside the file may happen again**:
    /// a charge, a mail. Their `step_tx` rows stay as they are (the
    /// application's tables are its own), and run again too. A forgotten
    /// `spawn` finds its child again if the child is still there (a join
    /// returns how it ended), and enqueues it anew only once it was pruned.
    ///
    /// # Errors
    /// [`Error::NotFound`] for no such run, or no such step of it;
    /// [`Error::Conflict`] for a running run (cancel it, or wait until it
    /// ends or suspends), one waiting behind its scope, or a run of an
    /// ordered scope (`Enqueue::scope`, a rule's order), whose scope moved
    /// on.
    pub fn reset_run_to_step(&self, id: &str, step: &str) -> Result<()> {
        let (op, why) = self.who();
        self.engine.write(|tx| {
            operate::reset_run_to_step(tx.core(), tx.now_ms(), id, step, op, why)?;
            tx.mark_runs();
            Ok(())
        })
    }

    /// Sets an action's priority and limits (as
    /// [`Engine::configure_action`]), on the record.
    pub fn configure_action(&self, config: &ActionConfig) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| control::configure_audited(tx.core(), config, tx.now_ms(), op, why))
    }

    /// Sets one key's limits and weight for a keyed action (as
    /// [`crate::Engine::set_key_limits`]), on the record.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad key or limit, or an action without keys.
    pub fn set_key_limits(&self, action: &str, limits: &crate::KeyLimits) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| control::set_key_limits(tx.core(), action, limits, tx.now_ms(), op, why))
    }

    /// Clears one key's limits and weight: it has its action's again, on the
    /// record.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the key had none.
    pub fn clear_key_limits(&self, action: &str, key: &str) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| control::clear_key_limits(tx.core(), action, key, tx.now_ms(), op, why))
    }

    /// Retries a dead run: ready again with a fresh set of attempts (behind
    /// its scope's head, if its lane moved on).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Invalid`] for a run that is not dead.
    pub fn retry_run(&self, id: &str) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| operate::retry_run(tx.core(), tx.now_ms(), id, op, why))
    }

    /// Discards a dead run: it stays as it was, marked discarded, and its
    /// scope moves on.
    pub fn discard_run(&self, id: &str) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| operate::discard_run(tx.core(), tx.now_ms(), id, op, why))
    }

    /// Lets a scope blocked behind a dead run (`OnDeadLetter::Block`) go on;
    /// the dead run stays dead.
    pub fn unblock(&self, rule: &str, scope: &str) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| operate::unblock(tx.core(), tx.now_ms(), rule, scope, op, why))
    }

    /// Retries what a dead letter gave up on (a run's: the run, as
    /// [`Operator::retry_run`]). A rule's evaluation error is replayed with
    /// [`Operator::reset_rule`] instead.
    pub fn retry_dead_letter(&self, id: i64) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| operate::retry_dead_letter(tx.core(), tx.now_ms(), id, op, why))
    }

    /// Marks a dead letter handled without retrying it (a run's: the run is
    /// discarded, as [`Operator::discard_run`]).
    pub fn discard_dead_letter(&self, id: i64) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| operate::discard_dead_letter(tx.core(), tx.now_ms(), id, op, why))
    }

    /// Resets a rule's cursor and/or state (see [`RuleReset`]; a replay
    /// derives the same firing ids, so nothing is made twice).
    pub fn reset_rule(&self, name: &str, what: RuleReset) -> Result<()> {
        let (op, why) = self.who();
        self.engine
            .write(|tx| operate::reset_rule(tx.core(), tx.now_ms(), name, what, op, why))
    }

    /// Promotes the version in shadow of the rule `name`
    /// ([`crate::Rule::shadow`]): sets the handover position — the further
    /// of the two versions' cursors — and returns it. The live version
    /// decides and fires up to it and no further; the shadow decides up to
    /// it without firing, and after it as the live rule. Once both reached
    /// it, the evaluator hands over in one transaction (audited as
    /// `rule_promoted`): the shadow's state and cursor become the rule's,
    /// at its version, and the old version retires. No event is decided by
    /// both versions or by neither.
    ///
    /// # Errors
    /// [`Error::NotFound`] for no such rule; [`Error::Conflict`] when it has
    /// no version in shadow, or one being promoted already;
    /// [`Error::Invalid`] for the name of the shadow itself.
    pub fn promote_rule(&self, name: &str) -> Result<i64> {
        let (op, why) = self.who();
        let at = self
            .engine
            .write(|tx| operate::promote_rule(tx.core(), tx.now_ms(), name, op, why))?;
        self.engine.nudge_all();
        Ok(at)
    }

    /// Deletes a rule's row, cursor and state (its runs and dead letters
    /// stay), for rules the code no longer has.
    ///
    /// # Errors
    /// [`Error::Invalid`] while this process registers the rule.
    pub fn delete_rule(&self, name: &str) -> Result<()> {
        if self.engine.registers_rule(name) {
            return Err(Error::invalid(
                "rule",
                format!("{name} is registered by this process; remove it from the code first"),
            ));
        }
        let (op, why) = self.who();
        self.engine
            .write(|tx| operate::delete_rule(tx.core(), tx.now_ms(), name, op, why))
    }

    /// Retries these dead runs, each as [`Operator::retry_run`], in one
    /// transaction; an id that is not a dead run is skipped and said why.
    /// Find them with [`Operator::matching_dead_runs`] (the dry run).
    ///
    /// # Errors
    /// [`Error::Invalid`] for more than [`crate::limits::MAX_BULK`] ids.
    pub fn retry_runs(&self, ids: &[String]) -> Result<Bulk> {
        let (op, why) = self.who();
        self.engine.write(|tx| {
            operate::bulk(tx, ids, |c, now, id| {
                operate::retry_run(c, now, id, op, why)
            })
        })
    }

    /// Discards these dead runs, as [`Operator::retry_runs`] retries them.
    pub fn discard_runs(&self, ids: &[String]) -> Result<Bulk> {
        let (op, why) = self.who();
        self.engine.write(|tx| {
            operate::bulk(tx, ids, |c, now, id| {
                operate::discard_run(c, now, id, op, why)
            })
        })
    }

    /// Retries what these open dead letters gave up on, each as
    /// [`Operator::retry_dead_letter`], in one transaction; one that cannot
    /// be retried is skipped and said why. Find them with
    /// [`Operator::matching_dead_letters`].
    pub fn retry_dead_letters(&self, ids: &[i64]) -> Result<Bulk> {
        let (op, why) = self.who();
        self.engine.write(|tx| {
            operate::bulk(tx, ids, |c, now, id| {
                operate::retry_dead_letter(c, now, *id, op, why)
            })
        })
    }

    /// Discards these open dead letters, as [`Operator::retry_dead_letters`]
    /// retries them.
    pub fn discard_dead_letters(&self, ids: &[i64]) -> Result<Bulk> {
        let (op, why) = self.who();
        self.engine.write(|tx| {
            operate::bulk(tx, ids, |c, now, id| {
                operate::discard_dead_letter(c, now, *id, op, why)
            })
        })
    }

    /// Removes a follower from the ledger, with its cursor (its dead letters
    /// stay).
    pub fn unfollow(&self, name: &str) -> Result<()> {
        let (op, why) = self.who();
        crate::runtime::unfollow(self.engine.context(), name, op, why)
    }

    /// Lets a stopped follower start again at its cursor (after the
    /// configuration that stopped it was mended), whichever process runs it:
    /// the request is recorded in the ledger, and the engine relaying for the
    /// follower picks it up at its next turn (this one at once).
    ///
    /// # Errors
    /// [`Error::NotFound`] for a follower the ledger does not have.
    pub fn restart_follower(&self, name: &str) -> Result<()> {
        let (op, why) = self.who();
        crate::runtime::restart_follower(self.engine.context(), name, op, why)
    }

    /// Prunes as [`Engine::prune`] does, and records it (what was asked and
    /// what was removed).
    pub fn prune(&self, retention: &Retention) -> Result<Pruned> {
        self.prune_with_progress(retention, |_| {})
    }

    /// [`Operator::prune`], calling `progress` with the running totals after
    /// every batch (for a progress bar).
    pub fn prune_with_progress(
        &self,
        retention: &Retention,
        progress: impl FnMut(Pruned),
    ) -> Result<Pruned> {
        let (op, why) = self.who();
        operate::check_operator(op, why)?;
        let pruned = self.engine.prune_with_progress(retention, progress)?;
        self.engine.write(|tx| {
            operate::record_prune(tx.core(), tx.now_ms(), retention, &pruned, op, why)
        })?;
        Ok(pruned)
    }
}
