//! PostgreSQL's wake-ups (feature `postgres`, see `core::wake`): the
//! heartbeat reads the head seq on a connection of its own, and a thread
//! `LISTEN`s for the `NOTIFY` a commit that appended sends.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::core::wake::{Look, Notifier, Wake};

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

    /// Listens on `channel` for other processes' commits, on a connection
    /// of its own, and nudges at each notification: a waiter hears of a
    /// commit at once instead of at the next heartbeat (which stays the
    /// correctness path).
    pub(crate) fn listen_postgres(
        self: &Arc<Self>,
        config: &postgres::Config,
        channel: Arc<str>,
    ) -> std::io::Result<PgListen> {
        let config = with_timeout(config);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (notifier, stop) = (Arc::clone(self), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("reflexr-listen".into())
                .spawn(move || listen_for_commits(&config, &channel, &notifier, &stop))?
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
/// every notification, for what its payload says the commit made (the
/// nudge coalesces a burst), reconnecting half a
/// second after the connection broke, until `stop`.
fn listen_for_commits(
    config: &postgres::Config,
    channel: &str,
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
                // waiter one wake-up.
                Ok(Some(n)) => match Wake::from_payload(n.payload()) {
                    Some(made) => notifier.nudge_for(made),
                    None => notifier.nudge_for(Wake::ALL),
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
