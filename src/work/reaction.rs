//! Reactions: application handlers with a cursor of their own (ADR 0011).
//!
//! A reaction reads its workspace after its cursor. Its handler gets one
//! event and the transaction in which the reaction's cursor advances past it:
//! whatever the handler writes there — deliveries it enqueues, rows of the
//! application's — commits **with** the advance. A change's notices are
//! therefore enqueued exactly once, whatever crashes (the gap ADR 0011 left
//! open "until a change's notices are written in one transaction"). Sending
//! happens later, in the deliveries' senders, at least once.
//!
//! A reaction skips the types it does not handle. A handler that returns an
//! error or panics has its writes for that event rolled back; the (reaction,
//! seq) is dead-lettered with the reason, and the reaction moves on.
//!
//! Reactions run under the file's `loop` lease: one process at a time
//! handles them. Several events share a transaction (each in a savepoint of
//! its own); handlers run inside it, so they should do database work only —
//! enqueue, write — and leave slow work to senders and actions.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::counter::Counter;
use crate::base::dead_letter::{DeadLetterKind, Reason};
use crate::base::error::{Error, HandlerError, Result, panic_text};
use crate::base::event::{Event, RESERVED_TYPES};
use crate::base::limits;
use crate::core::cursor::ConsumerKind;
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::core::lease::Lease;
use crate::store::dead_letters::NewDeadLetter;
use crate::store::{Core, Counters, Cursors, DeadLetters, Events, Sqlite, Workspaces};
use crate::work::consumer::{self, Consumer};
use crate::work::rule::Start;

/// A reaction's handler: one event, in the transaction that moves the
/// reaction's cursor past it.
pub type ReactionFn<B = Sqlite> =
    dyn Fn(&Event, &mut Tx<'_, B>) -> std::result::Result<(), HandlerError> + Send + Sync;

/// How many events one reaction transaction holds at most.
const BATCH: usize = 100;
/// How long one reaction transaction runs handlers before it commits.
const BUDGET: Duration = Duration::from_millis(20);

/// A reaction, registered with [`crate::Engine::register_reaction`].
///
/// ```
/// use reflexr::{Delivery, Reaction};
///
/// let mailer = Reaction::new("session-mailer", "events-app")
///     .on(["session.changed"])
///     .handle(|event, tx| {
///         tx.deliver(&Delivery::new("email", "session-changed").caused_by(event))?;
///         Ok(())
///     });
/// ```
///
/// # Defaults
/// [`Start::Beginning`]: a reaction new to the file handles the whole log.
/// Use [`Start::Head`] for one that should only see what comes after it.
///
/// On PostgreSQL (feature `postgres`), turn it into one of PostgreSQL's with
/// `Reaction::postgres` before giving it its handler (whose [`Tx`] is
/// PostgreSQL's).
pub struct Reaction<B: Backend = Sqlite> {
    pub(crate) name: String,
    pub(crate) workspace: String,
    pub(crate) types: Vec<String>,
    pub(crate) start: Start,
    pub(crate) handler: Option<Arc<ReactionFn<B>>>,
}

impl<B: Backend> Clone for Reaction<B> {
    fn clone(&self) -> Self {
        Reaction {
            name: self.name.clone(),
            workspace: self.workspace.clone(),
            types: self.types.clone(),
            start: self.start,
            handler: self.handler.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Reaction<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaction")
            .field("name", &self.name)
            .field("workspace", &self.workspace)
            .field("types", &self.types)
            .finish_non_exhaustive()
    }
}

impl Reaction {
    /// A reaction named `name` over `workspace`'s log.
    pub fn new(name: impl Into<String>, workspace: impl Into<String>) -> Reaction {
        Reaction {
            name: name.into(),
            workspace: workspace.into(),
            types: Vec::new(),
            start: Start::Beginning,
            handler: None,
        }
    }

    /// The same reaction for an engine on PostgreSQL (feature `postgres`),
    /// to be given its handler after: a handler set before is dropped.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(self) -> Reaction<crate::store::Postgres> {
        Reaction {
            name: self.name,
            workspace: self.workspace,
            types: self.types,
            start: self.start,
            handler: None,
        }
    }
}

impl<B: Backend> Reaction<B> {
    /// The types it handles; it skips the others.
    pub fn on<I, S>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.types = types.into_iter().map(Into::into).collect();
        self
    }

    /// Where a reaction new to the file starts reading.
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// The handler.
    pub fn handle<F>(mut self, f: F) -> Self
    where
        F: Fn(&Event, &mut Tx<'_, B>) -> std::result::Result<(), HandlerError>
            + Send
            + Sync
            + 'static,
    {
        self.handler = Some(Arc::new(f));
        self
    }

    /// The reaction as a consumer of its workspace (its cursor).
    pub(crate) fn consumer(&self) -> Consumer<'_> {
        Consumer {
            workspace: &self.workspace,
            kind: ConsumerKind::Reaction,
            name: &self.name,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        limits::check_name("reaction", &self.name)?;
        limits::check_name("workspace", &self.workspace)?;
        if self.types.is_empty() {
            return Err(Error::invalid(
                "reaction",
                format!("{}: handles no event types (Reaction::on)", self.name),
            ));
        }
        for t in &self.types {
            limits::check_name("event type", t)?;
            if RESERVED_TYPES.contains(&t.as_str()) {
                return Err(Error::invalid(
                    "reaction",
                    format!("{}: may not handle the engine's own {t} events", self.name),
                ));
            }
        }
        if self.handler.is_none() {
            return Err(Error::invalid(
                "reaction",
                format!("{}: has no handler (Reaction::handle)", self.name),
            ));
        }
        Ok(())
    }
}

/// Gives a reaction new to the file its cursor at its start position.
pub(crate) fn register<B: Backend, C: Core + ?Sized>(
    conn: &C,
    now: i64,
    r: &Reaction<B>,
) -> Result<()> {
    if !Workspaces::exists(conn, &r.workspace)? {
        return Err(Error::not_found("workspace", &r.workspace));
    }
    let kind = ConsumerKind::Reaction.as_str();
    if Cursors::get(conn, &r.workspace, kind, &r.name)?.is_none() {
        let at = match r.start {
            Start::Beginning => 0,
            Start::Head => Events::head(conn)?,
        };
        Cursors::set(conn, &r.workspace, kind, &r.name, at, now)?;
    }
    Ok(())
}

/// Why a handler's event was dead-lettered.
struct Failure {
    reason: Reason,
    error: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            reason: Reason::HandlerError,
            error: e.to_string(),
        }
    }
}

/// Handles one batch of `r`'s events under the loop lease. Returns how many
/// events the cursor moved past.
pub(crate) fn step<B: Backend>(
    db: &impl CoreDb<B>,
    lease: &Lease,
    r: &Reaction<B>,
) -> Result<usize> {
    let c = r.consumer();
    let (stand, mut page) = consumer::read(db, c, BATCH)?;
    db.settings().upcasters.apply_all(&mut page);
    if page.is_empty() {
        return Ok(0);
    }
    let handler = r
        .handler
        .as_ref()
        .expect("a registered reaction has a handler");
    let committed = db.write_with(|tx| {
        consumer::advance(tx, c, lease, stand, |tx| -> Result<_> {
            let now = tx.now_ms();
            let started = Instant::now();
            let mut last = None;
            let (mut handled, mut failed) = (0, 0);
            for event in page.iter() {
                if last.is_some() && started.elapsed() >= BUDGET {
                    break;
                }
                last = Some(event.seq);
                if !r.types.contains(&event.event_type) {
                    continue;
                }
                let outcome = tx.nested(|tx: &mut Tx<'_, B>| -> std::result::Result<(), Failure> {
                    match catch_unwind(AssertUnwindSafe(|| handler(event, tx))) {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(Failure {
                            reason: Reason::HandlerError,
                            error: e.to_string(),
                        }),
                        Err(p) => Err(Failure {
                            reason: Reason::HandlerPanic,
                            error: panic_text(&*p),
                        }),
                    }
                });
                handled += 1;
                if let Err(f) = outcome {
                    failed += 1;
                    DeadLetters::insert(
                        tx.core(),
                        &NewDeadLetter {
                            kind: DeadLetterKind::Reaction,
                            consumer: &r.name,
                            workspace: Some(&r.workspace),
                            event_seq: Some(event.seq),
                            event_id: Some(&event.id),
                            run_id: None,
                            reason: f.reason,
                            error: &f.error,
                            attempts: 1,
                            now,
                        },
                    )?;
                }
            }
            let last = last.expect("the page is not empty");
            Counters::bump(tx.core(), Counter::Reacted, handled)?;
            Counters::bump(tx.core(), Counter::ReactionErrors, failed)?;
            Ok((page.iter().take_while(|e| e.seq <= last).count(), last))
        })
    });
    match committed {
        Ok(Some(moved)) => Ok(moved),
        // An operator moved the cursor: read again next turn.
        Ok(None) => Ok(0),
        Err(e) if !e.is_lease_lost() => {
            // The batch commits nothing; it is handled again next turn, and
            // a reaction that keeps failing here shows as stuck.
            consumer::failed(db, c, stand.position, &e);
            Ok(0)
        }
        Err(e) => Err(e),
    }
}
