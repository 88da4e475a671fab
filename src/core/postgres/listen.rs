//! PostgreSQL's wake-ups (feature `postgres`, see `core::wake`): the
//! heartbeat reads the head seq on a connection of its own, and a thread
//! `LISTEN`s for the `NOTIFY` a commit that appended or made runs
//! claimable sends.
//!
//! A notification's payload says what the commit made and which database
//! handle made it ([`Notices`]). The listener hears every commit on its
//! channel, its own process's too; those its own handle made were nudged
//! for at their commit, so it passes them over. Heard again a few hundred
//! microseconds later, each woke this process's waiters a second time, and
//! each executor that woke ran a claim for nothing. Two exceptions wake
//! through the heartbeat or at once instead: a `COMMIT` whose answer the
//! connection lost (the caller sees an error; the next heartbeat wakes the
//! threads), and a lone statement sent again after such a cut, which wakes
//! its engine's threads whatever it answers (`PgConn::was_resent`), unless
//! it fails (then the heartbeat does).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::core::wake::{Look, Notifier, Wake};

/// The payloads one database handle's commits notify with: what the commit
/// made (`Wake::payload`: `e`, `r` or `er`), then `_` and a token drawn at
/// random when the handle opened, e.g. `r_5f0c9a1e2b7d4c38`. Every engine
/// of every process on the schema hears them; the one whose token it is
/// knows the commit was its own.
#[derive(Debug, Clone)]
pub(crate) struct Notices {
    token: Arc<str>,
    events: Arc<str>,
    runs: Arc<str>,
    both: Arc<str>,
}

/// What a notification's payload says, as a listener reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A commit of this handle's own: already nudged for at its commit.
    Own,
    /// Another's commit, which made this.
    Made(Wake),
}

impl Notices {
    /// The payloads of a newly opened handle, with a fresh token.
    pub(crate) fn new() -> Notices {
        Notices::with_token(&format!("{:016x}", fastrand::u64(..)))
    }

    fn with_token(token: &str) -> Notices {
        let of = |w: Wake| -> Arc<str> { format!("{}_{token}", w.payload()).into() };
        Notices {
            token: token.into(),
            events: of(Wake::EVENTS),
            runs: of(Wake::RUNS),
            both: of(Wake::ALL),
        }
    }

    /// The payload of a commit that made `made`; `None` when other
    /// processes have nothing to wake for (see `Wake::notified`).
    pub(crate) fn of(&self, made: Wake) -> Option<Arc<str>> {
        made.notified().map(|kinds| match kinds {
            "e" => Arc::clone(&self.events),
            "r" => Arc::clone(&self.runs),
            _ => Arc::clone(&self.both),
        })
    }

    /// What `payload` says to this handle's listener. A payload it cannot
    /// read (an older engine's, which says only what was made, or nothing)
    /// is another's commit, which made what its kinds say, or anything.
    pub(crate) fn heard(&self, payload: &str) -> Heard {
        let (kinds, token) = match payload.split_once('_') {
            Some((kinds, token)) => (kinds, Some(token)),
            None => (payload, None),
        };
        if token == Some(&*self.token) {
            return Heard::Own;
        }
        Heard::Made(Wake::from_payload(kinds).unwrap_or(Wake::ALL))
    }
}

/// A connection string for the notifier's own connections: the
/// application's, with a connect timeout when it has none, so a server out
/// of reach holds a heartbeat (or the listener's stop) a few seconds at
/// most.
fn with_timeout(config: &postgres::Config) -> postgres::Config {
    let mut config = config.clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(3));
    }
    config
}

impl Notifier {
    /// A notifier for a PostgreSQL database: its heartbeat reads the head
    /// seq on `first`, a connection of its own, connected again through
    /// `config` when the server cut it.
    pub(crate) fn postgres(first: postgres::Client, config: &postgres::Config) -> Notifier {
        let config = with_timeout(config);
        let slot = Mutex::new(Some(first));
        Notifier::polling(Box::new(move || {
            let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.as_ref().is_none_or(postgres::Client::is_closed) {
                *slot = config.connect(postgres::NoTls).ok();
            }
            let Some(client) = slot.as_mut() else {
                return Look::Failed;
            };
            match crate::store::postgres::committed_head(client) {
                Ok(seq) => Look::Version(seq),
                Err(_) => {
                    *slot = None;
                    Look::Failed
                }
            }
        }))
    }

    /// Listens on `channel` for other engines' commits, on a connection
    /// of its own, and nudges at each notification: a waiter hears of a
    /// commit at once instead of at the next heartbeat (which stays the
    /// correctness path).
    pub(crate) fn listen_postgres(
        self: &Arc<Self>,
        config: &postgres::Config,
        channel: Arc<str>,
        notices: Notices,
    ) -> std::io::Result<PgListen> {
        let config = with_timeout(config);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (notifier, stop) = (Arc::clone(self), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("reflexr-listen".into())
                .spawn(move || listen_for_commits(&config, &channel, &notices, &notifier, &stop))?
        };
        Ok(PgListen {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }
}

/// The listener of one open PostgreSQL database: stopped (and its thread
/// joined) by [`PgListen::stop`] or when dropped.
pub(crate) struct PgListen {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl PgListen {
    /// Stops the listener and waits for its thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for PgListen {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The listener: `LISTEN` on `channel` on a connection of its own, a nudge for
/// every notification of another handle's commit, for what its payload
/// says the commit made (the nudge coalesces a burst), reconnecting half a
/// second after the connection broke, until `stop`.
fn listen_for_commits(
    config: &postgres::Config,
    channel: &str,
    notices: &Notices,
    notifier: &Notifier,
    stop: &std::sync::atomic::AtomicBool,
) {
    // How long one wait for a notification lasts: the stop is seen this soon.
    const TURN: Duration = Duration::from_millis(100);
    // How long after a failed connection the listener tries again.
    const RECONNECT: Duration = Duration::from_millis(500);
    while !stop.load(Ordering::SeqCst) {
        let mut client: postgres::Client = match config.connect(postgres::NoTls) {
            Ok(c) => c,
            Err(e) => {
                log::debug!("reflexr: the PostgreSQL listener cannot connect: {e}");
                std::thread::sleep(RECONNECT);
                continue;
            }
        };
        if let Err(e) = crate::store::postgres::listen(&mut client, channel) {
            log::debug!("reflexr: LISTEN failed: {e}");
            std::thread::sleep(RECONNECT);
            continue;
        }
        // Whatever committed while no one listened is found by the next
        // heartbeat; nudge now so waiters read at once.
        notifier.nudge();
        while !stop.load(Ordering::SeqCst) {
            let next = {
                use postgres::fallible_iterator::FallibleIterator;
                client.notifications().timeout_iter(TURN).next()
            };
            match next {
                // Nudged at once, for what the commit made; a burst costs a
                // waiter one wake-up. This handle's own commits nudged as
                // they committed.
                Ok(Some(n)) => match notices.heard(n.payload()) {
                    Heard::Made(made) => notifier.nudge_for(made),
                    Heard::Own => {}
                },
                Ok(None) => {}
                Err(e) => {
                    log::debug!("reflexr: the PostgreSQL listener lost its connection: {e}");
                    break;
                }
            }
            if client.is_closed() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No invariant of its own: the wake-ups' economy. A handle knows its
    /// own commits' notifications and reads another's for what it made,
    /// an older engine's payload (kinds alone, or nothing) included.
    #[test]
    fn a_handle_passes_over_its_own_notifications_and_reads_anothers() {
        let (mine, theirs) = (Notices::with_token("aa11"), Notices::with_token("bb22"));
        assert_eq!(&*mine.of(Wake::RUNS).unwrap(), "r_aa11");
        assert_eq!(&*mine.of(Wake::EVENTS).unwrap(), "e_aa11");
        assert_eq!(&*mine.of(Wake::ALL).unwrap(), "er_aa11");
        assert_eq!(mine.of(Wake::COMMITS), None);
        assert_eq!(mine.of(Wake::NONE), None);
        for made in [Wake::RUNS, Wake::EVENTS, Wake::ALL] {
            let payload = mine.of(made).unwrap();
            assert_eq!(mine.heard(&payload), Heard::Own);
            assert_eq!(theirs.heard(&payload), Heard::Made(made));
        }
        // Older engines' payloads.
        assert_eq!(mine.heard("r"), Heard::Made(Wake::RUNS));
        assert_eq!(mine.heard("e"), Heard::Made(Wake::EVENTS));
        assert_eq!(mine.heard(""), Heard::Made(Wake::ALL));
        // A token is the whole rest of the payload, not a prefix of it.
        assert_eq!(mine.heard("r_aa1"), Heard::Made(Wake::RUNS));
        assert_eq!(mine.heard("r_aa11x"), Heard::Made(Wake::RUNS));
        // Fresh tokens differ, and every payload is written into NOTIFY as
        // it is.
        let (a, b) = (Notices::new(), Notices::new());
        assert_ne!(a.token, b.token);
        assert!(
            a.of(Wake::ALL)
                .unwrap()
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
        );
    }
}
