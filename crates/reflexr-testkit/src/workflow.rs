//! The workflow the surface tests share (`crates/reflexr-admin/tests/admin.rs`,
//! `crates/reflexr-mcp/tests/mcp.rs`, `crates/reflexr-cli/tests/cli.rs`):
//! `book` reserves a seat (a step), waits for its speaker's confirmation
//! (an event of the log, for at most a day) and mails the speaker (a step
//! whose calls are counted: what a reset runs again). Generic over the
//! backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reflexr::{Backend, Engine, Enqueue, Error, EventMatch, NewEvent};
use serde_json::{Value, json};

/// The workspace the speakers' confirmations are appended to.
pub const WORKSPACE: &str = "talks";

/// How long a booking waits for its confirmation.
pub const TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Two bookings, as [`stock`] leaves them.
pub struct Bookings {
    /// Session 1's run: confirmed and mailed, succeeded (steps: begin,
    /// reserve, confirmed, mail).
    pub done: String,
    /// Session 2's run: suspended at its wait (steps: begin, reserve, and
    /// confirmed, waiting).
    pub waiting: String,
    /// How many times the mail step ran, over every run.
    pub mails: Arc<AtomicUsize>,
}

impl Bookings {
    /// How many mails were sent so far.
    pub fn mailed(&self) -> usize {
        self.mails.load(Ordering::SeqCst)
    }
}

/// Registers `book` on `e` (and its workspace, [`WORKSPACE`]), enqueues a
/// booking for sessions 1 and 2, confirms session 1's speaker and drains:
/// one run succeeded, one suspended at its wait.
pub fn stock<B: Backend>(e: &Engine<B>) -> Bookings {
    e.ensure_workspace(WORKSPACE, &["speaker.confirmed"])
        .unwrap();
    let mails = Arc::new(AtomicUsize::new(0));
    let sent = mails.clone();
    e.register_action("book", move |run, ctx| {
        let input: Value = run.input()?;
        let session = input["session"].as_i64().unwrap_or(0);
        let seat: Value = ctx.step("reserve", |_| {
            Ok::<_, Error>(json!({ "session": session, "seat": 12 }))
        })?;
        let wanted =
            EventMatch::new(WORKSPACE, "speaker.confirmed").subject(format!("session/{session}"));
        let confirmed = ctx.wait_for_event("confirmed", &wanted, Some(TIMEOUT))?;
        let sent = sent.clone();
        ctx.step("mail", move |_| {
            sent.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(format!("mailed seat {}", seat["seat"]))
        })?;
        ctx.set_output(&json!({ "confirmed": confirmed.is_some() }))?;
        Ok(())
    })
    .unwrap();
    let book = |session: i64| {
        e.enqueue(&Enqueue::new("book", &json!({ "session": session })))
            .unwrap()
            .id
    };
    let (done, waiting) = (book(1), book(2));
    e.run_until_idle().unwrap();
    e.append(
        WORKSPACE,
        &NewEvent::new("speaker.confirmed", "session/1", "speaker", 0),
    )
    .unwrap();
    e.run_until_idle().unwrap();
    Bookings {
        done,
        waiting,
        mails,
    }
}
