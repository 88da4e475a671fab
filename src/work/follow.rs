//! Followers: bridging one workspace's log into another with the same ids
//! (ADR-0015).
//!
//! A follower reads one source workspace of this file in seq order and
//! publishes what its **projection** (an application function, registered by
//! name) selects into a target workspace — of this file, of another file
//! (an edge device's file into a hub's), or of a PostgreSQL database a
//! process registered by name (feature `postgres`: a hub out of reach is
//! tried again, not a stop) — with the **same ids**.
//!
//! - **The ledger** — a row per follower in `reflexr_followers`; its cursor
//!   (kind `follower`, on the source), its lease (`follower/<name>`) and its
//!   dead letters (kind `follower`) in the engine's tables. [`crate::Engine::followers`]
//!   lists them, and an engine resumes every follower whose projection it has
//!   registered.
//! - **Exactly once comes from ids**, not from the lease: a re-read envelope
//!   is published again with the same id, which the target's log appends once
//!   (invariant 3). The lease only keeps a second process from doing the same
//!   work.
//! - **Lease timing** — the engine's lease TTL (30 s), renewed every third; a
//!   follower that cannot take its lease tries again every third; it relays
//!   only while it holds the lease (checked before every batch, and fenced
//!   with the cursor's save).
//! - **Cursor** — it moves after the publish, only forward, and is saved
//!   after every batch of envelopes published or dead-lettered, and after at
//!   most 500 that bridge nothing. In the same file a batch's publishes and
//!   its cursor commit in one transaction; across files the publishes commit
//!   in the target first, then the cursor in the source, so a crash between
//!   the two re-reads at most one batch ([`PUBLISH_BATCH`] envelopes, a
//!   page: each envelope is read once) and publishes nothing twice. The target is written with `synchronous=FULL`
//!   whatever the source's mode, so its publishes are on the disk before the
//!   cursor can be: a power cut never leaves the cursor past what the target
//!   lost (`tests/it/power.rs`).
//! - **Dead letters, once per seq** — when the projection errors or panics,
//!   returns an invalid event, or returns one of the engine's own types
//!   (which reflexr refuses to anyone): the envelope is dead-lettered and the
//!   follower moves on. The built-in `"same"` projection skips the engine's
//!   own types instead (they bridge nothing).
//! - **Stop** on anything else — a refused publish, a storage failure, a type
//!   the target does not accept (`NotFound`): that is the application's
//!   configuration, not the envelope's fault, and dead-lettering it would skip
//!   every later envelope of the type. The stop is logged as an error and
//!   counted, and recorded on its cursor (a follower stopped again and again
//!   at one position shows as stuck); the follower starts again at its
//!   cursor when the engine is opened again or an operator restarts it from
//!   any process ([`crate::Operator::restart_follower`], `reflexr
//!   restart-follower`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;

use crate::base::counter::Counter;
use crate::base::dead_letter::{DeadLetterKind, Reason};
use crate::base::error::{Error, HandlerError, Result, panic_text};
use crate::base::event::{Event, NewEvent};
use crate::base::limits;
use crate::base::telemetry::Op;
use crate::core::cursor::ConsumerKind;
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::core::lease::Lease;
use crate::store::dead_letters::NewDeadLetter;
use crate::store::followers::{self, FollowerRow};
use crate::store::{Counters, Cursors, DeadLetters, Events, Followers, Work};
use crate::work::consumer::{self, Consumer};

/// A projection: what a follower publishes for one source envelope, or
/// `None` to bridge nothing. The published event gets the envelope's id
/// whatever the projection sets.
pub type ProjectionFn =
    dyn Fn(&Event) -> std::result::Result<Option<NewEvent>, HandlerError> + Send + Sync;

/// Envelopes a follower publishes per batch (and so, across files, at most
/// what a crash between publish and cursor save makes it read again): a
/// page, so each envelope is read once.
pub const PUBLISH_BATCH: usize = SKIP_SAVE_EVERY;
/// Envelopes that bridge nothing after which the cursor is saved at the
/// latest (ADR-0015): a restart reads at most this many again.
pub const SKIP_SAVE_EVERY: usize = 500;

/// The event a follower publishes to copy an envelope as it is: same type,
/// subject, actor, time, payload, causation and correlation (and, once
/// published, the same id).
pub fn same_event(event: &Event) -> NewEvent {
    let mut e = NewEvent::new(
        &event.event_type,
        &event.subject,
        &event.actor,
        event.occurred_at,
    )
    .payload_json(event.payload_json());
    e.causation_id.clone_from(&event.causation_id);
    e.traceparent.clone_from(&event.traceparent);
    e.correlation_id.clone_from(&event.correlation_id);
    e
}

/// A follower to create, with [`crate::Engine::follow`].
///
/// ```
/// # use reflexr::Follow;
/// let f = Follow::new("edge-log", "devices")
///     .name("edge-7-to-hub")
///     .to_file("/var/lib/hub/hub.db")
///     .projection("edge-to-hub");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Follow {
    pub(crate) name: Option<String>,
    pub(crate) source: String,
    pub(crate) target: String,
    pub(crate) target_file: Option<PathBuf>,
    pub(crate) target_postgres: Option<String>,
    pub(crate) projection: String,
}

impl Follow {
    /// Follow `source` (a workspace of this file) into `target`. By default
    /// the target is in this file, the projection is `"same"` (every
    /// application envelope as it is, see [`same_event`]; reflexr's own
    /// `RuleFired` and `RuleErrored` bridge nothing; registered by every
    /// engine), and the name is `<source>-to-<target>`.
    pub fn new(source: impl Into<String>, target: impl Into<String>) -> Follow {
        Follow {
            name: None,
            source: source.into(),
            target: target.into(),
            target_file: None,
            target_postgres: None,
            projection: "same".into(),
        }
    }

    /// The follower's name (its ledger row, cursor and lease).
    pub fn name(mut self, name: impl Into<String>) -> Follow {
        self.name = Some(name.into());
        self
    }

    /// Publish into the workspace of another reflexr file.
    pub fn to_file(mut self, path: impl Into<PathBuf>) -> Follow {
        self.target_file = Some(path.into());
        self.target_postgres = None;
        self
    }

    /// Publish into the workspace of a PostgreSQL database (feature
    /// `postgres`): the target this process registered as `name` with
    /// [`crate::Engine::register_postgres_target`] — an edge's file into a
    /// hub over the network. Only the name is kept in the ledger; a process
    /// relays for the follower when it registered the target (and the
    /// projection).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn to_postgres(mut self, name: impl Into<String>) -> Follow {
        self.target_postgres = Some(name.into());
        self.target_file = None;
        self
    }

    /// The projection, by the name it was registered under
    /// ([`crate::Engine::register_projection`]).
    pub fn projection(mut self, name: impl Into<String>) -> Follow {
        self.projection = name.into();
        self
    }

    pub(crate) fn resolved_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{}-to-{}", self.source, self.target))
    }
}

/// A follower as the ledger knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct FollowerInfo {
    /// Its name.
    pub name: String,
    /// The workspace it reads.
    pub source: String,
    /// The workspace it publishes into.
    pub target: String,
    /// The target's file (None: this file, or PostgreSQL).
    pub target_file: Option<String>,
    /// The PostgreSQL target's registered name (None: a file).
    pub target_postgres: Option<String>,
    /// The projection's name.
    pub projection: String,
    /// Its cursor on the source.
    pub cursor: i64,
    /// Source events after the cursor.
    pub lag: i64,
    /// Envelopes it published (re-publications of an existing id included).
    pub published: i64,
    /// Envelopes it dead-lettered.
    pub dead_letters: i64,
    /// Times it stopped.
    pub stops: i64,
    /// The error of its last stop.
    pub last_error: Option<String>,
    /// Stopped in this engine until restarted (or the engine reopened).
    pub stopped_here: bool,
}

pub(crate) fn lease_name(follower: &str) -> String {
    format!("follower/{follower}")
}

/// Creates (or updates) the follower's ledger row and, for a new one, its
/// cursor at the start of the source.
pub(crate) fn register<B: Backend>(tx: &mut Tx<'_, B>, f: &Follow) -> Result<String> {
    let name = f.resolved_name();
    limits::check_name("follower", &name)?;
    limits::check_name("workspace", &f.source)?;
    limits::check_name("workspace", &f.target)?;
    limits::check_name("projection", &f.projection)?;
    let conn = tx.core();
    let now = tx.now_ms();
    if !crate::store::Workspaces::exists(conn, &f.source)? {
        return Err(Error::not_found("workspace", &f.source));
    }
    if f.target_file.is_none() && f.target_postgres.is_none() && f.target == f.source {
        return Err(Error::invalid(
            "follower",
            "a workspace cannot follow itself into the same file",
        ));
    }
    let file = f
        .target_file
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned());
    if let Some(pg) = &f.target_postgres {
        limits::check_name("postgres target", pg)?;
    }
    let target = followers::Target {
        workspace: &f.target,
        file: file.as_deref(),
        postgres: f.target_postgres.as_deref(),
    };
    Followers::upsert_follower(conn, &name, &f.source, &target, &f.projection, now)?;
    let kind = ConsumerKind::Follower.as_str();
    if Cursors::get(conn, &f.source, kind, &name)?.is_none() {
        Cursors::set(conn, &f.source, kind, &name, 0, now)?;
    }
    Ok(name)
}

pub(crate) fn infos<C: Work + ?Sized>(
    conn: &C,
    stopped: &std::collections::HashMap<String, i64>,
) -> Result<Vec<FollowerInfo>> {
    let kind = ConsumerKind::Follower.as_str();
    Followers::follower_rows(conn)?
        .into_iter()
        .map(|r| {
            let cursor = Cursors::get(conn, &r.source, kind, &r.name)?.unwrap_or(0);
            Ok(FollowerInfo {
                lag: Events::count_after(conn, &r.source, cursor)?,
                stopped_here: stopped.contains_key(&r.name),
                cursor,
                name: r.name,
                source: r.source,
                target: r.target,
                target_file: r.target_file,
                target_postgres: r.target_postgres,
                projection: r.projection,
                published: r.published,
                dead_letters: r.dead_letters,
                stops: r.stops,
                last_error: r.last_error,
            })
        })
        .collect()
}

/// What one batch did.
#[derive(Debug, Default, Clone)]
pub(crate) struct Relayed {
    /// Source envelopes the cursor moved past.
    pub moved: usize,
    pub published: usize,
    pub dead: usize,
    /// The error that stopped the follower.
    pub stopped: Option<Error>,
    /// Where the cursor stands after the batch.
    pub at: i64,
}

/// What the projection said of one envelope.
pub(crate) enum Item {
    Publish(NewEvent),
    Dead(Reason, String),
    Skip,
}

/// How a publish went.
pub(crate) enum Published {
    Ok,
    /// The envelope's fault: dead-letter it and move on.
    Dead(Reason, String),
    /// Not the envelope's fault: stop.
    Stop(Error),
}

fn publish<B: Backend>(tx: &mut Tx<'_, B>, target: &str, event: &NewEvent) -> Published {
    match tx.append(target, event) {
        Ok(_) => Published::Ok,
        Err(e @ Error::ReservedType { .. }) => Published::Dead(Reason::ReservedType, e.to_string()),
        Err(e @ (Error::Invalid { .. } | Error::Encode { .. })) => {
            Published::Dead(Reason::InvalidEvent, e.to_string())
        }
        Err(e) => Published::Stop(e),
    }
}

/// A follower's way into another database (another file, a PostgreSQL
/// hub): the batch's events appended into the target workspace in one
/// transaction of its, and what each publish did, in order, up to a stop.
/// Made by [`publisher`] for the database's backend, whichever it is.
pub(crate) type Publish = dyn Fn(&str, &[(&Event, Item)]) -> Vec<Option<Published>> + Send + Sync;

/// [`Publish`] into `db`, an open database of any backend.
pub(crate) fn publisher<B: Backend>(db: Arc<B::Db>) -> Arc<Publish> {
    Arc::new(move |target: &str, items: &[(&Event, Item)]| {
        publish_elsewhere::<B>(&*db, target, items)
    })
}

/// Publishes the batch's events into `target` of another database, in one
/// transaction of its: what each publish did, in order, up to a stop.
fn publish_elsewhere<B: Backend>(
    db: &impl CoreDb<B>,
    target: &str,
    items: &[(&Event, Item)],
) -> Vec<Option<Published>> {
    // A batch that publishes nothing (its envelopes skipped or
    // dead-lettered) makes no transaction in the target: none to wait for
    // on a busy file, no round trips to a hub.
    let Some(first) = items
        .iter()
        .position(|(_, item)| matches!(item, Item::Publish(_)))
    else {
        return items.iter().map(|_| None).collect();
    };
    let result = db.write_with(|ttx| {
        let mut out = Vec::with_capacity(items.len());
        for (_, item) in items {
            match item {
                Item::Publish(e) => {
                    let p = publish(ttx, target, e);
                    // An error that ends the transaction (a busy or cut
                    // database, a deadlock on PostgreSQL) fails the batch
                    // with that error, a stop at its first publish: a
                    // PostgreSQL target out of reach or busy is tried
                    // again, anything else stops the follower until it is
                    // restarted (`runtime::follow_turn`).
                    if let Published::Stop(err) = &p
                        && err.dooms_transaction()
                    {
                        return Err(err.clone());
                    }
                    let stop = matches!(p, Published::Stop(_));
                    out.push(Some(p));
                    if stop {
                        break;
                    }
                }
                _ => out.push(None),
            }
        }
        Ok::<_, Error>(out)
    });
    match result {
        Ok(out) => out,
        // The target's transaction failed as a whole: the items before the
        // first publish made nothing there (a skip, a dead letter: their
        // outcome is the source's), and that publish stops the batch, so
        // `step` records the stop with the items before it rather than
        // passing them and meeting no outcome at the publish.
        Err(e) => {
            let mut out: Vec<Option<Published>> = (0..first).map(|_| None).collect();
            out.push(Some(Published::Stop(e)));
            out
        }
    }
}

/// Relays one batch of `row`'s source under `lease`, into `target` (None:
/// this file).
pub(crate) fn step<B: Backend>(
    db: &B::Db,
    lease: &Lease,
    row: &FollowerRow,
    projection: &ProjectionFn,
    target: Option<&Publish>,
) -> Result<Relayed> {
    let c = Consumer {
        workspace: &row.source,
        kind: ConsumerKind::Follower,
        name: &row.name,
    };
    let (stand, mut page) = consumer::read(db, c, SKIP_SAVE_EVERY)?;
    // A projection of the application's reads events as the application
    // does, upcast; "same" relays what is stored, byte for byte.
    if row.projection != "same" {
        db.settings().upcasters.apply_all(&mut page);
    }
    if page.is_empty() {
        return Ok(Relayed::default());
    }
    // Project, in order, up to a batch of publishes.
    let mut items: Vec<(&Event, Item)> = Vec::new();
    let mut publishes = 0;
    // Each publish's span (feature `otel`), a child of its source event's,
    // lives until the batch is done; the published event carries it.
    let telemetry = &db.settings().telemetry;
    let mut spans = Vec::new();
    for event in page.iter() {
        if publishes == PUBLISH_BATCH {
            break;
        }
        let item = match catch_unwind(AssertUnwindSafe(|| projection(event))) {
            Ok(Ok(None)) => Item::Skip,
            Ok(Ok(Some(mut e))) => {
                publishes += 1;
                if telemetry.on() {
                    let span = telemetry.start(Op::Relay {
                        follower: &row.name,
                        source: &row.source,
                        target: &row.target,
                        event_id: &event.id,
                        parent: event.traceparent.as_deref(),
                    });
                    if let Some(tp) = span.traceparent() {
                        e.traceparent = Some(tp);
                    }
                    spans.push(span);
                }
                Item::Publish(e.id(event.id.clone()))
            }
            Ok(Err(e)) => Item::Dead(Reason::ProjectionError, e.to_string()),
            Err(p) => Item::Dead(Reason::ProjectionPanic, panic_text(&*p)),
        };
        items.push((event, item));
    }

    // Across databases, publish first, in the target's own transaction.
    let mut outcomes: Vec<Option<Published>> = match target {
        None => Vec::new(),
        Some(p) => p(&row.target, &items),
    };

    let outcome = db.write_with(|tx| -> Result<Option<Relayed>> {
        let relayed = consumer::advance(tx, c, lease, stand, |tx| -> Result<_> {
            let now = tx.now_ms();
            let mut r = Relayed::default();
            let mut last = None;
            for (i, (event, item)) in items.iter().enumerate() {
                let dead = match item {
                    Item::Skip => None,
                    Item::Dead(reason, error) => Some((reason.clone(), error.clone())),
                    Item::Publish(e) => {
                        let result = match target {
                            None => publish(tx, &row.target, e),
                            Some(_) => match outcomes.get_mut(i).and_then(Option::take) {
                                Some(p) => p,
                                // After a stop the rest were not published.
                                None => break,
                            },
                        };
                        match result {
                            Published::Ok => {
                                r.published += 1;
                                None
                            }
                            Published::Dead(reason, error) => Some((reason, error)),
                            Published::Stop(e) => {
                                r.stopped = Some(e);
                                break;
                            }
                        }
                    }
                };
                if let Some((reason, error)) = dead {
                    let new = DeadLetters::insert(
                        tx.core(),
                        &NewDeadLetter {
                            kind: DeadLetterKind::Follower,
                            consumer: &row.name,
                            workspace: Some(&row.source),
                            event_seq: Some(event.seq),
                            event_id: Some(&event.id),
                            run_id: None,
                            reason,
                            error: &error,
                            attempts: 1,
                            now,
                        },
                    )?;
                    r.dead += usize::from(new);
                }
                last = Some(event.seq);
                r.moved += 1;
            }
            Followers::count_follower(
                tx.core(),
                &row.name,
                r.published as i64,
                r.dead as i64,
                now,
            )?;
            let to = last.unwrap_or(stand.position);
            r.at = to;
            Ok((r, to))
        })?;
        // A stop is recorded with the advance, on the ledger and the cursor.
        if let Some(Relayed {
            stopped: Some(e),
            at,
            ..
        }) = &relayed
        {
            let (error, now) = (e.to_string(), tx.now_ms());
            Followers::follower_stopped(tx.core(), &row.name, &error, now)?;
            let kind = ConsumerKind::Follower.as_str();
            let n =
                Cursors::record_failure(tx.core(), &row.source, kind, &row.name, *at, &error, now)?;
            Counters::bump(
                tx.core(),
                Counter::ConsumerFailures,
                usize::from(n.is_some()),
            )?;
        }
        Ok(relayed)
    });
    match outcome {
        Ok(Some(r)) => Ok(r),
        // An operator moved the cursor: read again next turn.
        Ok(None) => Ok(Relayed::default()),
        // Writing the source failed: the follower stops at its cursor (what
        // was published in another file is published again, to no effect).
        Err(e) if !e.is_lease_lost() => {
            let detail = e.to_string();
            let _ = db.write_with(|tx| {
                Followers::follower_stopped(tx.core(), &row.name, &detail, tx.now_ms())
            });
            consumer::failed(db, c, stand.position, &e);
            Ok(Relayed {
                stopped: Some(e),
                ..Relayed::default()
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::sqlite::db::Db;
    use crate::store::Sqlite;

    fn envelope(seq: i64) -> Event {
        Event::from_json(&format!(
            r#"{{"seq": {seq}, "id": "e{seq}", "workspace": "edge", "type": "reading",
                "subject": "s", "actor": "a", "occurred_at": 0, "recorded_at": 0,
                "depth": 0, "payload": {{}}}}"#
        ))
        .unwrap()
    }

    /// ADR-0015 (the cursor's save policy): an envelope that bridges
    /// nothing writes nothing in the target; a batch of them makes no
    /// transaction there (none committed, and none waiting while another
    /// connection holds the hub's write lock), and one with a publish does.
    #[test]
    fn a_batch_that_publishes_nothing_makes_no_transaction_in_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        let hub = Db::open_for_test(&path);
        let (a, b) = (envelope(1), envelope(2));
        let nothing = [
            (&a, Item::Skip),
            (&b, Item::Dead(Reason::ProjectionError, "no".into())),
        ];
        let out = publish_elsewhere::<Sqlite>(&hub, "fleet", &nothing);
        assert!(out.iter().all(Option::is_none), "no outcome in the target");
        let stats = hub.writer_stats();
        assert_eq!((stats.commits, stats.aborts), (0, 0), "{stats:?}");

        // Behind another connection's write: not held up (a transaction
        // would wait out the busy timeout and fail busy).
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let out = publish_elsewhere::<Sqlite>(&hub, "fleet", &nothing);
        assert!(out.iter().all(Option::is_none), "{}", out.len());
        holder.execute_batch("ROLLBACK").unwrap();

        // A publish (into a workspace the hub lacks: a stop, not the
        // envelope's fault) is tried there, in one transaction.
        let one = [(&a, Item::Skip), (&b, Item::Publish(same_event(&b)))];
        let out = publish_elsewhere::<Sqlite>(&hub, "fleet", &one);
        assert!(out[0].is_none());
        assert!(matches!(&out[1], Some(Published::Stop(e)) if e.is_not_found()));
        assert_eq!(hub.writer_stats().commits, 1);
    }
}
