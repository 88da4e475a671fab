//! The one loop every consumer runs — rules ([`crate::work::evaluate`]),
//! reactions ([`crate::work::reaction`]) and followers ([`crate::work::follow`]):
//!
//! 1. [`read`] a page of the workspace after the consumer's cursor, with the
//!    cursor's stamp;
//! 2. decide or handle it (the consumer's own code, outside any lock);
//! 3. [`advance`]: in one savepoint of the write transaction, check the
//!    consumer's lease (holder, generation, expiry) and that the cursor is
//!    as step 1 read it, write what step 2 produced, and move the cursor —
//!    or write nothing at all. A cursor an operator moved (or whose state
//!    they reset) since step 1 makes the consumer read again.
//!
//! A commit that fails anyway is recorded against the cursor with
//! [`failed`].

use crate::base::counter::Counter;
use crate::base::error::{Error, Result};
use crate::base::event::Event;
use crate::core::cursor::ConsumerKind;
use crate::core::db::Backend;
use crate::core::db::CoreDb;
use crate::core::db::Tx;
use crate::core::lease::{self, Lease};
use crate::store::{Control, Counters, Cursors, Events};

/// Which consumer's cursor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Consumer<'a> {
    pub workspace: &'a str,
    pub kind: ConsumerKind,
    pub name: &'a str,
}

/// Where a consumer's cursor stood when its page was read: the position and
/// the stamp of its last change (an operator's reset changes the stamp even
/// when it sets the same position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stand {
    pub position: i64,
    stamp: i64,
}

impl Stand {
    /// The stand of a cursor read as `Cursors::get_stamped` reads it
    /// (position 0 for a cursor never saved).
    pub(crate) fn from_stamped(stamped: Option<(i64, i64)>) -> Stand {
        let (position, stamp) = stamped.unwrap_or((0, 0));
        Stand { position, stamp }
    }
}

/// The cursor's stand (position 0 for a cursor never saved).
pub(crate) fn stand<C: Cursors + ?Sized>(conn: &C, c: Consumer<'_>) -> Result<Stand> {
    Ok(Stand::from_stamped(Cursors::get_stamped(
        conn,
        c.workspace,
        c.kind.as_str(),
        c.name,
    )?))
}

/// Step 1: the consumer's stand and up to `limit` events after it, read
/// into this thread's page for the consumer's kind ([`PageBuffer`]).
pub(crate) fn read<B: Backend>(
    db: &impl CoreDb<B>,
    c: Consumer<'_>,
    limit: usize,
) -> Result<(Stand, PageBuffer)> {
    let mut page = PageBuffer::take(c.kind);
    let stand = db.read_with(&mut |conn| {
        let stand = stand(conn, c)?;
        Events::page_into(conn, c.workspace, stand.position, limit, &mut page)?;
        Ok(stand)
    })?;
    Ok((stand, page))
}

thread_local! {
    /// The pages of events each thread reads into, one for each kind of
    /// consumer (pages of different sizes in one slot would free and
    /// allocate the difference at every turn, as `run_until_idle` reads
    /// for all of them in the caller's thread). Kept between pages so that
    /// their events' strings are allocated once, not once a page
    /// (`Events::page_into` on SQLite; on PostgreSQL a page is read anew):
    /// allocating and freeing them was a quarter of what one rule's
    /// evaluation cost, and a twentieth of a follower's relay.
    static PAGES: [std::cell::RefCell<Vec<Event>>; 3] = const {
        [const { std::cell::RefCell::new(Vec::new()) }; 3]
    };
}

/// This thread's page of events for one kind of consumer, taken for one
/// pass and put back when dropped (a pass inside a pass — a rule's or a
/// handler's code that drains the engine — takes an empty one).
pub(crate) struct PageBuffer {
    page: Vec<Event>,
    slot: usize,
}

impl PageBuffer {
    pub(crate) fn take(kind: ConsumerKind) -> PageBuffer {
        let slot = match kind {
            ConsumerKind::Rule => 0,
            ConsumerKind::Reaction => 1,
            // The engine reads for no application consumer; one would
            // share the followers' page.
            ConsumerKind::Follower | ConsumerKind::App => 2,
        };
        let page = PAGES.with(|p| std::mem::take(&mut *p[slot].borrow_mut()));
        PageBuffer { page, slot }
    }
}

/// The payloads' room a page keeps between passes, at most: past it, the
/// payloads of the page's later events are freed (the events and their
/// other strings kept), so a burst of large events does not hold its
/// memory for the thread's life.
const KEEP_PAYLOAD_BYTES: usize = 16 << 20;

impl Drop for PageBuffer {
    fn drop(&mut self) {
        let mut page = std::mem::take(&mut self.page);
        let mut kept = 0;
        for e in &mut page {
            kept += e.payload.capacity();
            if kept > KEEP_PAYLOAD_BYTES {
                kept -= e.payload.capacity();
                e.payload = String::new();
            }
            // A payload's parse is made again from the next page's text:
            // not kept while the thread waits.
            e.parsed = Default::default();
        }
        let _ = PAGES.try_with(|p| *p[self.slot].borrow_mut() = page);
    }
}

impl std::ops::Deref for PageBuffer {
    type Target = Vec<Event>;
    fn deref(&self) -> &Vec<Event> {
        &self.page
    }
}

impl std::ops::DerefMut for PageBuffer {
    fn deref_mut(&mut self) -> &mut Vec<Event> {
        &mut self.page
    }
}

/// Why a savepoint ends without committing.
enum Halt<E> {
    /// The cursor moved since it was read: nothing is written.
    Moved,
    Failed(E),
}

impl<E: From<Error>> From<Error> for Halt<E> {
    fn from(e: Error) -> Halt<E> {
        Halt::Failed(E::from(e))
    }
}

/// Step 3, in the caller's transaction: under `lease`, if the cursor still
/// stands at `stand`, runs `write` — which returns its value and the seq the
/// cursor moves to — and moves the cursor there, all in one savepoint.
/// `Ok(None)` when the cursor had moved (nothing written: read again); an
/// error rolls the savepoint back.
pub(crate) fn advance<B: Backend, T, E: From<Error>>(
    tx: &mut Tx<'_, B>,
    c: Consumer<'_>,
    lease: &Lease,
    at: Stand,
    write: impl FnOnce(&mut Tx<'_, B>) -> std::result::Result<(T, i64), E>,
) -> std::result::Result<Option<T>, E> {
    let done = tx.nested(|tx| -> std::result::Result<T, Halt<E>> {
        // Under the lease, the cursor where the batch was read from, and
        // (a rule or reaction paused while its batch was decided writes
        // nothing: once a pause commits, its cursor stays, and the next
        // turn skips it) not paused: one look.
        let Some(seen) = Control::fenced_stand(
            tx.core(),
            (&lease.name, &lease.holder, lease.generation),
            tx.now_ms(),
            c.workspace,
            c.kind.as_str(),
            c.name,
            matches!(c.kind, ConsumerKind::Rule | ConsumerKind::Reaction),
        )?
        else {
            return Err(Halt::Failed(lease::lost(lease).into()));
        };
        if Stand::from_stamped(seen.stand) != at || seen.paused {
            return Err(Halt::Moved);
        }
        let (value, to) = write(tx).map_err(Halt::Failed)?;
        let now = tx.now_ms();
        match Cursors::advance(tx.core(), c.workspace, c.kind.as_str(), c.name, to, now)? {
            Ok(()) => Ok(value),
            // Behind where it stands: moved under us after all.
            Err(_) => Err(Halt::Moved),
        }
    });
    match done {
        Ok(v) => Ok(Some(v)),
        Err(Halt::Moved) => Ok(None),
        Err(Halt::Failed(e)) => Err(e),
    }
}

/// A consumer's commit failed while its cursor stood at `position`:
/// logged, counted (`consumer_failures`) and recorded on the cursor, in a
/// transaction of its own, so a consumer that keeps failing at one position
/// shows as stuck ([`crate::inspect::CursorInfo::is_stuck`],
/// `reflexr_stuck_consumers`) instead of only in a log line.
pub(crate) fn failed<B: Backend>(
    db: &impl CoreDb<B>,
    c: Consumer<'_>,
    position: i64,
    error: &Error,
) {
    let (kind, name) = (c.kind.as_str(), c.name);
    log::error!(
        "{kind} {name} at seq {position} of {}: {error}; it tries again",
        c.workspace
    );
    let text = error.to_string();
    let recorded = db.write_with(|tx| -> Result<()> {
        let now = tx.now_ms();
        let n = Cursors::record_failure(tx.core(), c.workspace, kind, name, position, &text, now)?;
        Counters::bump(
            tx.core(),
            Counter::ConsumerFailures,
            usize::from(n.is_some()),
        )
    });
    if let Err(e) = recorded {
        log::error!("{kind} {name}: the failure could not be recorded: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event_with_payload(bytes: usize) -> Event {
        let mut e = Event::from_json(
            r#"{"seq": 1, "id": "e1", "workspace": "w", "type": "t", "subject": "s",
                "actor": "a", "occurred_at": 0, "recorded_at": 0, "depth": 0, "payload": {}}"#,
        )
        .unwrap();
        e.payload.reserve(bytes);
        e
    }

    /// A thread's page is kept between passes (its strings' room reused),
    /// one for each kind of consumer, with no payload's parse; past
    /// `KEEP_PAYLOAD_BYTES` of payloads, the later events' payloads are
    /// freed: the memory a burst of large events took is given back, not
    /// held for the thread's life. Each test runs in a thread of its own,
    /// so the pages taken first are this test's.
    #[test]
    fn a_page_is_kept_between_passes_with_its_payloads_bounded() {
        let mut page = PageBuffer::take(ConsumerKind::Follower);
        assert!(page.is_empty());
        page.push(event_with_payload(1_000));
        page[0].json().unwrap();
        assert!(page[0].parsed.is_kept());
        drop(page);
        // Another kind's page is its own.
        assert!(PageBuffer::take(ConsumerKind::Rule).is_empty());
        let mut page = PageBuffer::take(ConsumerKind::Follower);
        assert_eq!(page.len(), 1, "a page is kept");
        assert!(
            page[0].payload.capacity() >= 1_000,
            "with its payload's room"
        );
        assert!(!page[0].parsed.is_kept(), "and no parse");
        // A pass inside a pass takes an empty page of its own.
        assert!(PageBuffer::take(ConsumerKind::Follower).is_empty());
        page.push(event_with_payload(KEEP_PAYLOAD_BYTES));
        page.push(event_with_payload(1_000));
        drop(page);
        let page = PageBuffer::take(ConsumerKind::Follower);
        assert_eq!(page.len(), 3, "the events are kept");
        let room: Vec<usize> = page.iter().map(|e| e.payload.capacity()).collect();
        assert!(room[0] >= 1_000 && room[2] >= 1_000, "{room:?}");
        assert_eq!(room[1], 0, "the payload past the bound is freed");
    }
}
