//! Enqueueing a run directly ([`Enqueue`], [`crate::Tx::enqueue`]): a run
//! of an action with JSON arguments, now or at a time, in the caller's
//! transaction, with a priority, a scope it keeps order in, and a
//! uniqueness key ([`Unique`]: no second run with the key while one is
//! pending, active, or within a period — partial unique indexes, and a
//! keyed table for periods, hold it). The producer need not register the
//! action: any process whose executors have it runs it.

use std::time::Duration;

use serde::Serialize;

use crate::base::error::{Error, Result};
use crate::base::limits;
use crate::base::retry::RetryPolicy;
use crate::base::telemetry::Op;
use crate::core::db::{Backend, CoreDb, Tx};
use crate::core::settings::Settings;
use crate::store::Runs;
use crate::store::runs::{Inserted, NewRun, Uniq};
use crate::work::queue::handoff::{Hand, insert_alone_handed};

/// How long a uniqueness key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unique {
    /// While a run with the key waits (waiting or ready): a second is not
    /// made; once it started, another may be enqueued.
    WhilePending,
    /// While a run with the key waits or runs.
    WhileActive,
    /// For this long after the first was enqueued, whatever became of it.
    For(Duration),
}

impl Unique {
    fn mode(self) -> &'static str {
        match self {
            Unique::WhilePending => "pending",
            Unique::WhileActive => "active",
            Unique::For(_) => "period",
        }
    }
}

/// A run to enqueue directly: an action and its arguments.
///
/// ```
/// # use reflexr::{Enqueue, Unique};
/// # use std::time::Duration;
/// let job = Enqueue::new("send-invoice", &serde_json::json!({ "invoice": 42 }))
///     .priority(5)
///     .scope("customer/7")              // one at a time per customer, in order
///     .unique("invoice/42", Unique::WhileActive)
///     .after(Duration::from_secs(60));
/// ```
#[derive(Debug, Clone)]
pub struct Enqueue {
    pub(crate) action: String,
    pub(crate) input: std::result::Result<String, String>,
    pub(crate) at: Option<i64>,
    pub(crate) after: Option<Duration>,
    pub(crate) priority: Option<i64>,
    pub(crate) scope: Option<String>,
    pub(crate) unique: Option<(String, Unique)>,
    pub(crate) retry: RetryPolicy,
    pub(crate) id: Option<String>,
    /// The workflow run that spawns it ([`crate::RunContext::spawn`]).
    pub(crate) parent: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) debounce: Option<Debounce>,
    pub(crate) traceparent: Option<String>,
}

/// Many enqueues of one key within a window become one run
/// ([`Enqueue::debounce`]): while the key's run has not started, the next
/// enqueue with the key changes it instead of making another — its input
/// becomes the new one (or what the action's merge makes of both:
/// [`crate::Builder::merge_debounced`]), and it is due `window` after this
/// enqueue, but never later than `max_wait` after the first. Once the run
/// started, the next enqueue makes a new run: no enqueue is lost at the
/// window's edge. The coalescing happens in the enqueue's transaction.
///
/// ```
/// # use reflexr::{Debounce, Enqueue};
/// # use std::time::Duration;
/// // One reindex a user's edits settle into: 2 s after the last edit, and
/// // at most 30 s after the first.
/// let job = Enqueue::new("reindex", &serde_json::json!({ "user": 7 })).debounce(
///     Debounce::new("user/7", Duration::from_secs(2)).max_wait(Duration::from_secs(30)),
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debounce {
    pub(crate) key: String,
    pub(crate) window: Duration,
    pub(crate) max_wait: Option<Duration>,
}

impl Debounce {
    /// Enqueues of `key` within `window` of each other become one run, due
    /// `window` after the last.
    pub fn new(key: impl Into<String>, window: Duration) -> Debounce {
        Debounce {
            key: key.into(),
            window,
            max_wait: None,
        }
    }

    /// The run is due at most this long after the first enqueue of the
    /// window, however many follow.
    pub fn max_wait(mut self, d: Duration) -> Debounce {
        self.max_wait = Some(d);
        self
    }
}

impl Enqueue {
    /// A run of `action` with `input` as its arguments (any JSON value).
    pub fn new<T: Serialize + ?Sized>(action: impl Into<String>, input: &T) -> Enqueue {
        Enqueue {
            action: action.into(),
            input: serde_json::to_string(input).map_err(|e| e.to_string()),
            at: None,
            after: None,
            priority: None,
            scope: None,
            unique: None,
            retry: RetryPolicy::default(),
            id: None,
            parent: None,
            key: None,
            debounce: None,
            traceparent: None,
        }
    }

    /// Not before this time (ms since the epoch, by the engine's clock).
    pub fn at(mut self, ms: i64) -> Enqueue {
        self.at = Some(ms);
        self
    }

    /// Not before this long from now.
    pub fn after(mut self, delay: Duration) -> Enqueue {
        self.after = Some(delay);
        self
    }

    /// Its priority: higher is claimed first (default: the action's, see
    /// [`crate::ActionConfig::priority`], else 0).
    pub fn priority(mut self, priority: i64) -> Enqueue {
        self.priority = Some(priority);
        self
    }

    /// Runs of the action with the same scope run one at a time, in the
    /// order they were enqueued.
    pub fn scope(mut self, scope: impl Into<String>) -> Enqueue {
        self.scope = Some(scope.into());
        self
    }

    /// No second run of the action with `key` while `unique` holds: the
    /// enqueue returns the existing run's id, marked deduplicated.
    pub fn unique(mut self, key: impl Into<String>, unique: Unique) -> Enqueue {
        self.unique = Some((key.into(), unique));
        self
    }

    /// How failed attempts are retried (default [`RetryPolicy::default`]).
    pub fn retry(mut self, retry: RetryPolicy) -> Enqueue {
        self.retry = retry;
        self
    }

    /// The run's key, for its action's per-key limits and fair claims
    /// ([`crate::ActionConfig::fair`], [`crate::KeyLimits`]): default, its
    /// input's `partition_by` field when the action has one, else `""`.
    pub fn key(mut self, key: impl Into<String>) -> Enqueue {
        self.key = Some(key.into());
        self
    }

    /// Coalesces this enqueue with the others of the debounce's key into
    /// one run ([`Debounce`]); the run's due time is the debounce's (so
    /// neither [`Enqueue::at`] nor [`Enqueue::after`] may be given), and it
    /// holds the key as a [`Unique::WhilePending`] key (so
    /// [`Enqueue::unique`] may not be given either).
    pub fn debounce(mut self, d: Debounce) -> Enqueue {
        self.debounce = Some(d);
        self
    }

    /// The W3C trace context of the work that enqueues it (a `traceparent`
    /// header's value; [`crate::NewEvent::traceparent`] says the format):
    /// kept with the run ([`crate::Run::traceparent`]), and carried by the
    /// events it emits.
    pub fn traceparent(mut self, tp: impl Into<String>) -> Enqueue {
        self.traceparent = Some(tp.into());
        self
    }

    /// The run's id (default: a new one); enqueueing an id that exists
    /// enqueues nothing.
    pub fn id(mut self, id: impl Into<String>) -> Enqueue {
        self.id = Some(id.into());
        self
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Enqueued {
    /// The run's id: the new one, or the one that held the key (or the id).
    pub id: String,
    /// True when nothing new was made: the key was held, or the id existed.
    pub deduplicated: bool,
}

/// A checked uniqueness key.
pub(crate) fn uniq(key: &str, u: Unique) -> Result<Uniq<'_>> {
    limits::check_text("unique key", key, limits::MAX_ID_BYTES)?;
    let period_ms = match u {
        Unique::For(d) if d.is_zero() => {
            return Err(Error::invalid("unique", "a period must be more than zero"));
        }
        Unique::For(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        _ => 0,
    };
    Ok(Uniq {
        key,
        mode: u.mode(),
        period_ms,
    })
}

/// What an enqueue made of its [`Enqueue`] before anything is written:
/// its fields checked, its id, due time and lane, and its span (a child of
/// the given traceparent, else of the caller's current span), which lasts
/// as long as this does.
struct Prepared<'e> {
    e: &'e Enqueue,
    input: &'e str,
    unique: Option<Uniq<'e>>,
    id: String,
    now: i64,
    due_at: i64,
    lane: Option<String>,
    traceparent: Option<String>,
    _span: crate::base::telemetry::Span,
}

impl Prepared<'_> {
    /// The run to insert.
    fn new_run(&self) -> NewRun<'_> {
        let e = self.e;
        NewRun {
            id: &self.id,
            kind: "task",
            action: &e.action,
            workspace: None,
            rule: None,
            scope: e.scope.as_deref(),
            lane: self.lane.as_deref(),
            on_dead_letter: "continue",
            input: self.input,
            event_seq: None,
            event_id: None,
            depth: 0,
            retry: &e.retry,
            due_at: self.due_at,
            now: self.now,
            dead: None,
            priority: e.priority,
            unique: self.unique,
            parent: e.parent.as_deref(),
            key: e.key.as_deref(),
            traceparent: self.traceparent.as_deref(),
        }
    }
}

/// Checks `e` and makes what its insert needs, at `now`.
fn prepare<'e>(settings: &Settings, now: i64, e: &'e Enqueue) -> Result<Prepared<'e>> {
    limits::check_name("action", &e.action)?;
    let input = e
        .input
        .as_ref()
        .map_err(|m| Error::Encode { message: m.clone() })?;
    crate::core::changelog::check_json("input", input, settings.limits.max_payload_bytes)?;
    e.retry.validate()?;
    if let Some(s) = &e.scope {
        limits::check_text("scope", s, limits::MAX_SUBJECT_BYTES)?;
    }
    if let Some(k) = &e.key {
        limits::check_text("key", k, limits::MAX_SUBJECT_BYTES)?;
    }
    if let Some(tp) = &e.traceparent {
        limits::check_traceparent("traceparent", tp)?;
    }
    if let Some(d) = &e.debounce {
        if e.unique.is_some() || e.at.is_some() || e.after.is_some() {
            return Err(Error::invalid(
                "debounce",
                "a debounced run's due time and key are the debounce's: \
                 no unique, at or after with it",
            ));
        }
        if d.window.is_zero() || d.max_wait.is_some_and(|m| m.is_zero()) {
            return Err(Error::invalid(
                "debounce",
                "the window and the maximum wait must be more than zero",
            ));
        }
    }
    let unique = match (&e.unique, &e.debounce) {
        (Some((key, u)), _) => Some(uniq(key, *u)?),
        (None, Some(d)) => Some(uniq(&d.key, Unique::WhilePending)?),
        (None, None) => None,
    };
    let id = match &e.id {
        Some(id) => {
            limits::check_text("id", id, limits::MAX_ID_BYTES)?;
            id.clone()
        }
        None => crate::core::changelog::new_id(),
    };
    let after = |d: Duration| now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let due_at = match (e.at, e.after, &e.debounce) {
        (_, _, Some(d)) => after(d.window).min(d.max_wait.map_or(i64::MAX, after)),
        (Some(at), _, _) => at,
        (None, Some(d), _) => after(d),
        (None, None, None) => now,
    };
    let lane = e
        .scope
        .as_ref()
        .map(|s| format!("{}{} {s}", limits::TASK_LANE_PREFIX, e.action));
    let span = settings.telemetry.start(Op::Enqueue {
        action: &e.action,
        run_id: &id,
        parent: e.traceparent.as_deref(),
    });
    let traceparent = span.traceparent().or_else(|| e.traceparent.clone());
    Ok(Prepared {
        e,
        input,
        unique,
        id,
        now,
        due_at,
        lane,
        traceparent,
        _span: span,
    })
}

/// [`crate::Engine::enqueue`]: an enqueue that one statement makes — no
/// scope, no key to hold, no debounce — as a write of its own
/// ([`CoreDb::insert_run_alone`]: on PostgreSQL, one round trip that is
/// its own commit), its run, when due at once, handed over at its insert
/// to a parked executor of this process if `hand` has one
/// ([`insert_alone_handed`]); any other in a quiet shared write.
pub(crate) fn enqueue_alone<B: Backend>(
    db: &B::Db,
    e: &Enqueue,
    hand: Option<&Hand<'_>>,
) -> Result<Enqueued> {
    if e.scope.is_some() || e.unique.is_some() || e.debounce.is_some() || e.parent.is_some() {
        return db.write_quiet(|tx| tx.enqueue(e));
    }
    let p = prepare(db.settings(), db.now_ms(), e)?;
    let inserted = match hand {
        Some(hand) if p.due_at <= p.now => insert_alone_handed::<B>(db, hand, &p.new_run())?,
        _ => db.insert_run_alone(&p.new_run())?,
    };
    Ok(match inserted {
        Inserted::New => Enqueued {
            id: p.id,
            deduplicated: false,
        },
        // An id this call made, which nothing else has: the run is this
        // call's, made by a try whose commit's answer a broken connection
        // lost (see `PgDb::insert_run_alone`).
        Inserted::Existed if e.id.is_none() => Enqueued {
            id: p.id,
            deduplicated: false,
        },
        Inserted::Existed => Enqueued {
            id: p.id,
            deduplicated: true,
        },
        Inserted::Duplicate(other) => Enqueued {
            id: other,
            deduplicated: true,
        },
    })
}

/// Inserts an enqueued run in `tx` (or finds the one that holds its key).
pub(crate) fn enqueue<B: Backend>(tx: &Tx<'_, B>, e: &Enqueue) -> Result<Enqueued> {
    let p = prepare(tx.settings(), tx.now_ms(), e)?;
    let (id, input, now) = (&p.id, p.input, p.now);
    let new_run = || p.new_run();
    let mut inserted = Runs::insert(tx.core(), &new_run())?;
    if let Some(d) = &e.debounce {
        // The key's holder may start, end or give the key up between two
        // statements (another process's claim, on a backend where one can
        // run beside this transaction): a few more tries, then a clear
        // error rather than an enqueue lost.
        let mut tries = 0;
        loop {
            match &inserted {
                Inserted::New => break,
                Inserted::Duplicate(other) => {
                    if coalesce(tx, &e.action, other, input, d, now)? {
                        return Ok(Enqueued {
                            id: other.clone(),
                            deduplicated: true,
                        });
                    }
                }
                Inserted::Existed if Runs::get(tx.core(), id)?.is_some() => break,
                Inserted::Existed => {}
            }
            tries += 1;
            if tries > 3 {
                return Err(Error::Conflict {
                    kind: "debounce",
                    reason: format!(
                        "the run holding {:?} kept changing while this enqueue looked: try again",
                        d.key
                    ),
                });
            }
            inserted = Runs::insert(tx.core(), &new_run())?;
        }
    }
    Ok(match inserted {
        Inserted::New => Enqueued {
            id: id.clone(),
            deduplicated: false,
        },
        Inserted::Existed => Enqueued {
            id: id.clone(),
            deduplicated: true,
        },
        Inserted::Duplicate(other) => Enqueued {
            id: other,
            deduplicated: true,
        },
    })
}

/// The longest window or maximum wait a debounce counts with: a century.
const MAX_WAIT_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// Folds an enqueue into the debounce key's pending run `id`: its input
/// becomes the new one, or the action's merge of both, and it is due a
/// window from now, at most `max_wait` after it was first enqueued. False
/// when it no longer takes input: it started (and gave the key up) or
/// ended meanwhile.
fn coalesce<B: Backend>(
    tx: &Tx<'_, B>,
    action: &str,
    id: &str,
    input: &str,
    d: &Debounce,
    now: i64,
) -> Result<bool> {
    let conn = tx.core();
    Runs::lock_runs(conn, &[id.to_string()])?;
    let merged = match tx.settings().mergers.0.get(action) {
        Some(merge) => {
            let Some(run) = Runs::get(conn, id)? else {
                return Ok(false);
            };
            let decode = |e: serde_json::Error| Error::Encode {
                message: e.to_string(),
            };
            let old: serde_json::Value = serde_json::from_str(&run.input).map_err(decode)?;
            let new: serde_json::Value = serde_json::from_str(input).map_err(decode)?;
            let merged = serde_json::to_string(&merge(old, new)).map_err(decode)?;
            crate::core::changelog::check_json("input", &merged, tx.limits().max_payload_bytes)?;
            Some(merged)
        }
        None => None,
    };
    // Capped so that a creation time plus it fits in 64 bits on every
    // backend (a century is far past any window).
    let ms = |d: Duration| i64::try_from(d.as_millis()).map_or(MAX_WAIT_MS, |m| m.min(MAX_WAIT_MS));
    Ok(Runs::debounce(
        conn,
        id,
        merged.as_deref().unwrap_or(input),
        now.saturating_add(ms(d.window)),
        d.max_wait.map(ms),
        now,
    )? == crate::store::runs::Debounced::Folded)
}

impl<B: Backend> Tx<'_, B> {
    /// Enqueues a run of an action ([`Enqueue`]) in this transaction: it
    /// exists if and only if the transaction commits. No handler need be
    /// registered here: the executors of any process that registered the
    /// action run it.
    ///
    /// # Errors
    /// [`Error::Invalid`] / [`Error::Encode`] for bad fields (nothing is
    /// enqueued).
    pub fn enqueue(&mut self, e: &Enqueue) -> Result<Enqueued> {
        let done = enqueue(self, e)?;
        if !done.deduplicated {
            self.mark_runs();
        }
        Ok(done)
    }
}
