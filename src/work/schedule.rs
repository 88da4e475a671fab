//! Scheduled work: jobs by fixed interval or cron expression.
//!
//! The loop (under the file's `loop` lease) claims each job's occurrences by
//! due time: when a job is due, one transaction creates the occurrence — a run
//! whose id is `<job>@<due time in ms>`, so each due occurrence exists once
//! whatever the number of processes — and moves the job's next due time on.
//! Executors in any process then run it.
//!
//! Each job states its guarantee:
//!
//! - [`Guarantee::AtLeastOnce`]: a crash mid-run runs the occurrence again
//!   (retried by the job's [`RetryPolicy`]).
//! - [`Guarantee::AtMostOnce`]: one attempt; the claim that marks it taken
//!   commits before the handler runs, so a crash loses the occurrence rather
//!   than repeating it (ADR 0011 keeps this for its reminders, where a
//!   duplicate was the outcome their spec forbade).
//!
//! Occurrences missed while no process ran the loop follow the job's
//! [`Missed`] policy. An interval of zero switches a job off (as
//! `REMINDER_DISPATCH_INTERVAL_MS=0` did).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::base::counter::Counter;
use crate::base::error::{Error, HandlerError, Result};
use crate::base::limits;
use crate::base::retry::RetryPolicy;
use crate::base::text::text_enum;
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::lease::{self, Lease};
use crate::store::runs::{self, NewRun};
use crate::store::schedules::ScheduleRow;
use crate::store::{Counters, Runs, Schedules, Sqlite};
use crate::work::queue::run::{Run, RunContext};

text_enum! {
    /// What a job promises about each occurrence.
    #[derive(Default)]
    pub enum Guarantee ("guarantee") {
        /// Run until it succeeds (or its retries are spent): a crash repeats
        /// it. The default.
        #[default]
        AtLeastOnce = "at_least_once",
        /// One attempt, never repeated: a crash loses it.
        AtMostOnce = "at_most_once",
    }
}

text_enum! {
    /// What happens to occurrences that fell due while no process ran the
    /// loop (more than one due at once).
    #[derive(Default)]
    pub enum Missed ("missed") {
        /// Run one occurrence for all of them (for the latest), then carry
        /// on. The default.
        #[default]
        RunOnce = "run_once",
        /// Run none of them; carry on from the next due time.
        Skip = "skip",
    }
}

#[derive(Clone)]
enum Spec {
    Every(Duration),
    Cron(String, Box<cron::Schedule>),
}

/// One occurrence of a job, as its handler gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Occurrence {
    /// The job.
    pub job: String,
    /// When it was due (ms since the epoch).
    pub due_at: i64,
    /// How many earlier occurrences were missed and folded into this one
    /// ([`Missed::RunOnce`] after downtime).
    pub missed: u64,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The run id (`<job>@<due_at>`): the idempotency key.
    pub run_id: String,
}

/// A job's handler: runs one occurrence.
pub type JobFn<B = Sqlite> = dyn Fn(&Occurrence, &mut RunContext<'_, B>) -> std::result::Result<(), HandlerError>
    + Send
    + Sync;

/// A scheduled job, registered with [`crate::Engine::register_job`].
///
/// ```
/// use reflexr::{Guarantee, Job};
/// use std::time::Duration;
///
/// let reminders = Job::every("attendee-reminders", Duration::from_secs(60))
///     .guarantee(Guarantee::AtMostOnce)
///     .handler(|occurrence, _ctx| {
///         println!("reminders due at {}", occurrence.due_at);
///         Ok(())
///     });
/// let digest = Job::cron("daily-digest", "0 8 * * *").unwrap(); // 08:00 UTC
/// ```
///
/// # Defaults
/// [`Guarantee::AtLeastOnce`] with [`RetryPolicy::default`];
/// [`Missed::RunOnce`]. An interval job is first due one interval after it is
/// first registered; a cron job at its next matching time (UTC).
///
/// On PostgreSQL (feature `postgres`), make it with the same constructors
/// and turn it into one of PostgreSQL's with `Job::postgres` before giving
/// it its handler (whose [`RunContext`] is PostgreSQL's).
pub struct Job<B: Backend = Sqlite> {
    pub(crate) name: String,
    spec: Spec,
    pub(crate) guarantee: Guarantee,
    pub(crate) missed: Missed,
    pub(crate) retry: RetryPolicy,
    pub(crate) handler: Option<Arc<JobFn<B>>>,
}

impl<B: Backend> Clone for Job<B> {
    fn clone(&self) -> Self {
        Job {
            name: self.name.clone(),
            spec: self.spec.clone(),
            guarantee: self.guarantee,
            missed: self.missed,
            retry: self.retry,
            handler: self.handler.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for Job<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("spec", &self.spec_text())
            .field("guarantee", &self.guarantee)
            .field("missed", &self.missed)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// A job due every `interval`. An interval of zero switches it off.
    pub fn every(name: impl Into<String>, interval: Duration) -> Job {
        Job::with(name, Spec::Every(interval))
    }

    /// A job due whenever the cron expression matches, in UTC: standard
    /// five fields (`min hour day month weekday`), or six or seven with
    /// seconds first and a year last.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an expression the cron parser refuses.
    pub fn cron(name: impl Into<String>, expression: &str) -> Result<Job> {
        let fields = expression.split_whitespace().count();
        let full = if fields == 5 {
            format!("0 {expression}")
        } else {
            expression.to_string()
        };
        let schedule = cron::Schedule::from_str(&full)
            .map_err(|e| Error::invalid("cron expression", format!("{expression:?}: {e}")))?;
        Ok(Job::with(
            name,
            Spec::Cron(expression.trim().to_string(), Box::new(schedule)),
        ))
    }

    fn with(name: impl Into<String>, spec: Spec) -> Job {
        Job {
            name: name.into(),
            spec,
            guarantee: Guarantee::AtLeastOnce,
            missed: Missed::RunOnce,
            retry: RetryPolicy::default(),
            handler: None,
        }
    }

    /// The same job for an engine on PostgreSQL (feature `postgres`), to be
    /// given its handler after: a handler set before is dropped.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(self) -> Job<crate::store::Postgres> {
        Job {
            name: self.name,
            spec: self.spec,
            guarantee: self.guarantee,
            missed: self.missed,
            retry: self.retry,
            handler: None,
        }
    }
}

impl<B: Backend> Job<B> {
    /// At least once (the default) or at most once.
    pub fn guarantee(mut self, guarantee: Guarantee) -> Self {
        self.guarantee = guarantee;
        self
    }

    /// What to do with occurrences missed during downtime.
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// How an at-least-once occurrence is retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// What runs at each occurrence.
    pub fn handler<F>(mut self, f: F) -> Self
    where
        F: Fn(&Occurrence, &mut RunContext<'_, B>) -> std::result::Result<(), HandlerError>
            + Send
            + Sync
            + 'static,
    {
        self.handler = Some(Arc::new(f));
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        limits::check_name("job", &self.name)?;
        if self.handler.is_none() {
            return Err(Error::invalid(
                "job",
                format!("{}: has no handler (Job::handler)", self.name),
            ));
        }
        self.retry.validate()
    }

    /// True when the job is switched off (an interval of zero).
    pub fn is_off(&self) -> bool {
        matches!(self.spec, Spec::Every(d) if d.is_zero())
    }

    /// The schedule as stored, e.g. `every 60000ms`, `cron 0 8 * * *`, `off`.
    pub(crate) fn spec_text(&self) -> String {
        match &self.spec {
            Spec::Every(d) if d.is_zero() => "off".into(),
            Spec::Every(d) => format!("every {}ms", d.as_millis()),
            Spec::Cron(expr, _) => format!("cron {expr}"),
        }
    }

    pub(crate) fn guarantee_text(&self) -> &'static str {
        self.guarantee.as_str()
    }

    pub(crate) fn missed_text(&self) -> &'static str {
        self.missed.as_str()
    }

    /// The first due time strictly after `t` (None when off, or when a cron
    /// expression matches no later time).
    pub(crate) fn next_after(&self, t: i64) -> Option<i64> {
        match &self.spec {
            Spec::Every(d) if d.is_zero() => None,
            Spec::Every(d) => Some(t + i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)),
            Spec::Cron(_, schedule) => {
                let at = chrono::DateTime::from_timestamp_millis(t)?;
                schedule.after(&at).next().map(|d| d.timestamp_millis())
            }
        }
    }

    /// The due times from `first` (due) up to `now`: how many there are and
    /// the latest. Intervals are counted arithmetically; cron times are
    /// walked, up to a bound, past which the rest count as one more.
    pub(crate) fn due_through(&self, first: i64, now: i64) -> (u64, i64) {
        match &self.spec {
            Spec::Every(d) if !d.is_zero() => {
                let step = i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2).max(1);
                let k = (now - first) / step;
                (k as u64 + 1, first + k * step)
            }
            _ => {
                let (mut count, mut latest) = (1u64, first);
                while count < 100_000 {
                    match self.next_after(latest) {
                        Some(t) if t <= now => {
                            count += 1;
                            latest = t;
                        }
                        _ => break,
                    }
                }
                (count, latest)
            }
        }
    }
}

/// The action name of a job's occurrences.
pub(crate) fn action_of(job: &str) -> String {
    crate::base::limits::job_action(job)
}

/// The action handler that decodes the occurrence and calls the job.
pub(crate) fn action<B: Backend>(job: Arc<JobFn<B>>) -> Arc<crate::work::queue::run::ActionFn<B>> {
    Arc::new(move |run: &Run, ctx: &mut RunContext<'_, B>| {
        let input: serde_json::Value = run.input()?;
        let occurrence = Occurrence {
            job: input["job"].as_str().unwrap_or_default().to_string(),
            due_at: input["due_at"].as_i64().unwrap_or_default(),
            missed: input["missed"].as_u64().unwrap_or_default(),
            attempt: run.attempt,
            run_id: run.id.clone(),
        };
        job(&occurrence, ctx)
    })
}

/// Records a job being registered. A job the file knows with the same
/// schedule keeps its next due time (a restart neither repeats nor skips
/// an occurrence); a new or changed job is next due from now; a job switched
/// off has none.
pub(crate) fn register<B: Backend, C: Schedules + ?Sized>(
    conn: &C,
    now: i64,
    job: &Job<B>,
) -> Result<()> {
    let stored = Schedules::schedule(conn, &job.name)?;
    let same = stored.as_ref().is_some_and(|r| {
        r.spec == job.spec_text()
            && r.guarantee == job.guarantee_text()
            && r.missed == job.missed_text()
            && r.next_due_at.is_some()
    });
    let next_due_at = if same {
        stored.as_ref().and_then(|r| r.next_due_at)
    } else {
        job.next_after(now)
    };
    Schedules::upsert_schedule(
        conn,
        &ScheduleRow {
            name: job.name.clone(),
            spec: job.spec_text(),
            guarantee: job.guarantee_text().into(),
            missed: job.missed_text().into(),
            next_due_at,
            last_due_at: stored.and_then(|r| r.last_due_at),
            updated_at: now,
        },
    )
}

/// Creates the job's due occurrence, if one is due, and moves its schedule
/// on, in one transaction fenced by the loop lease. True if it did.
pub(crate) fn step<B: Backend>(db: &B::Db, lease: &Lease, job: &Job<B>) -> Result<bool> {
    let now = db.now_ms();
    let Some(next) = db
        .read_with(&mut |c| Schedules::schedule(c, &job.name))?
        .and_then(|r| r.next_due_at)
    else {
        return Ok(false);
    };
    if next > now {
        return Ok(false);
    }
    let (count, latest) = job.due_through(next, now);
    let due = match (count, job.missed) {
        (1, _) => Some(next),
        (_, Missed::RunOnce) => Some(latest),
        (_, Missed::Skip) => None,
    };
    let mut following = job.next_after(latest);
    while let Some(t) = following
        && t <= now
    {
        following = job.next_after(t);
    }
    let retry = match job.guarantee {
        Guarantee::AtLeastOnce => job.retry,
        Guarantee::AtMostOnce => RetryPolicy::never(),
    };
    db.write_with(|tx| {
        let now = tx.now_ms();
        lease::fence(tx.core(), now, lease)?;
        if !Schedules::advance_schedule(tx.core(), &job.name, next, following, due, now)? {
            return Ok(false); // moved on by someone else already
        }
        if count > 1 {
            ::log::info!(
                "job {}: {} occurrence(s) missed while the loop was not running; {}",
                job.name,
                count - 1,
                match job.missed {
                    Missed::RunOnce => "running one for them",
                    Missed::Skip => "skipping them",
                }
            );
        }
        if let Some(due) = due {
            let id = format!("{}@{due}", job.name);
            let input = serde_json::json!({ "job": job.name, "due_at": due, "missed": count - 1 })
                .to_string();
            let action = action_of(&job.name);
            let new = Runs::insert(
                tx.core(),
                &NewRun {
                    id: &id,
                    kind: "job",
                    action: &action,
                    workspace: None,
                    rule: None,
                    scope: None,
                    lane: None,
                    on_dead_letter: "continue",
                    input: &input,
                    event_seq: None,
                    event_id: None,
                    depth: 0,
                    retry: &retry,
                    due_at: now,
                    now,
                    dead: None,
                    priority: None,
                    unique: None,
                    parent: None,
                    key: None,
                    traceparent: None,
                },
            )?;
            let new = new == runs::Inserted::New;
            Counters::bump(tx.core(), Counter::Occurrences, usize::from(new))?;
            tx.mark_runs();
        }
        Ok(true)
    })
}

/// A schedule as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The job.
    pub name: String,
    /// `every <ms>ms`, `cron <expression>` or `off`.
    pub spec: String,
    /// What it promises about each occurrence.
    pub guarantee: Guarantee,
    /// What it does with occurrences missed during downtime.
    pub missed: Missed,
    /// When it is next due (None: off).
    pub next_due_at: Option<i64>,
    /// When its last occurrence was due.
    pub last_due_at: Option<i64>,
}

impl ScheduleInfo {
    pub(crate) fn from_row(r: ScheduleRow) -> Result<ScheduleInfo> {
        Ok(ScheduleInfo {
            guarantee: r.guarantee.parse()?,
            missed: r.missed.parse()?,
            name: r.name,
            spec: r.spec,
            next_due_at: r.next_due_at,
            last_due_at: r.last_due_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_count_the_due_times_they_missed() {
        let job = Job::every("j", Duration::from_secs(10));
        assert_eq!(job.next_after(1_000), Some(11_000));
        assert_eq!(job.due_through(11_000, 11_050), (1, 11_000));
        assert_eq!(job.due_through(11_000, 45_000), (4, 41_000));
        assert!(Job::every("off", Duration::ZERO).is_off());
        assert_eq!(Job::every("off", Duration::ZERO).next_after(0), None);
    }

    #[test]
    fn cron_accepts_five_fields_and_refuses_nonsense() {
        let job = Job::cron("daily", "0 8 * * *").unwrap();
        let midnight = 1_764_374_400_000; // 2025-11-29T00:00:00Z
        assert_eq!(job.next_after(midnight), Some(midnight + 8 * 3_600_000));
        let (count, latest) = job.due_through(midnight + 8 * 3_600_000, midnight + 3 * 86_400_000);
        assert_eq!(
            (count, latest),
            (3, midnight + 2 * 86_400_000 + 8 * 3_600_000)
        );
        assert!(
            Job::cron("bad", "every tuesday")
                .unwrap_err()
                .is_bad_input()
        );
        assert!(Job::cron("seconds", "*/30 * * * * *").is_ok());
    }
}
