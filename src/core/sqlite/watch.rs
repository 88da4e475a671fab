//! SQLite's wake-ups (see `core::wake`): the heartbeat's `PRAGMA
//! data_version` on the writer's connection, and the WAL watch (feature
//! `watch`) that polls it at once when the operating system says the file's
//! WAL was written.
//!
//! The number is read on the writer's connection because there it changes
//! only when *another* connection committed: this process's own commits,
//! which nudge their waiters themselves (for what they made), do not read
//! as news. Read on a connection of its own, every commit of the writer
//! changed it, and the watch — which sees this process's WAL writes too —
//! woke every waiting thread a few hundred microseconds after each of
//! them, beside the handler its commit had just handed a run to.

use std::sync::{Arc, Mutex, TryLockError};
#[cfg(feature = "watch")]
use std::time::Duration;

#[cfg(feature = "watch")]
use crossbeam_channel::{RecvTimeoutError, bounded};
use rusqlite::Connection;

use crate::core::wake::{Look, Notifier};

impl Notifier {
    /// A notifier that reads `data_version` on `writer`, the writer's
    /// connection, when the writer is not in a transaction (a look that
    /// would wait for it is [`Look::Busy`]).
    pub(crate) fn sqlite(writer: Arc<Mutex<Connection>>) -> Notifier {
        Notifier::polling(Box::new(move || {
            let conn = match writer.try_lock() {
                Ok(c) => c,
                Err(TryLockError::WouldBlock) => return Look::Busy,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
            };
            match conn.query_row("PRAGMA data_version", [], |r| r.get(0)) {
                Ok(v) => Look::Version(v),
                Err(_) => Look::Failed,
            }
        }))
    }
}

/// The pauses between the WAL watch's polls after a write, in µs: dense at
/// first (a commit's fsync, between its last WAL write and its being seen,
/// is usually a few hundred microseconds), then backing off for a slow
/// disk.
#[cfg(feature = "watch")]
const POLL_PAUSES_US: [u64; 12] = [
    100, 100, 100, 200, 200, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000,
];

/// How many of [`POLL_PAUSES_US`] are the dense ones: a write seen past
/// them starts the pauses over.
#[cfg(feature = "watch")]
const DENSE_POLLS: usize = 5;

/// The WAL watch of one open file (feature `watch`): dropped with the file,
/// which ends its thread.
#[cfg(feature = "watch")]
pub(crate) struct FileWatch {
    watcher: Option<notify::RecommendedWatcher>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "watch")]
impl Drop for FileWatch {
    /// Stops the watch and joins its thread, so a dropped engine leaves no
    /// connection to the file behind.
    fn drop(&mut self) {
        drop(self.watcher.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(not(feature = "watch"))]
pub(crate) struct FileWatch;

impl Notifier {
    /// Watches `db`'s WAL for writes (feature `watch`). None, with a log
    /// line, when the operating system will not watch it: the heartbeat
    /// alone then notices other processes' commits.
    #[cfg(feature = "watch")]
    pub(crate) fn watch_file(self: &Arc<Self>, db: &std::path::Path) -> Option<FileWatch> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let dir = match db.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        let dir = dir.canonicalize().ok()?;
        let mut wal_name = db.file_name()?.to_os_string();
        wal_name.push("-wal");
        let (tx, rx) = bounded::<()>(1);
        let wal = wal_name.clone();
        let handler = move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            let ours = matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_))
                && event
                    .paths
                    .iter()
                    .any(|p| p.file_name().is_some_and(|n| n == wal.as_os_str()));
            if ours {
                // Full: a poll is pending already.
                let _ = tx.try_send(());
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(e) => {
                log::info!(
                    "no file watch ({e}): other processes' commits are noticed by the heartbeat"
                );
                return None;
            }
        };
        if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            log::info!(
                "no file watch on {} ({e}): the heartbeat notices other processes' commits",
                dir.display()
            );
            return None;
        }
        let notifier = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("reflexr-watch".into())
            .spawn(move || {
                // Ends when the watcher (and with it the sender) is dropped.
                'events: while rx.recv().is_ok() {
                    let mut step = 0;
                    loop {
                        if notifier.poll_soon() {
                            break;
                        }
                        let Some(&pause) = POLL_PAUSES_US.get(step) else {
                            break;
                        };
                        step += 1;
                        match rx.recv_timeout(Duration::from_micros(pause)) {
                            // A new write: dense again (this process's own
                            // writes, which are no news, come too; a
                            // commit of another process's after a while of
                            // them is still seen within a pause or two).
                            Ok(()) => {
                                if step > DENSE_POLLS {
                                    step = 0;
                                }
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => break 'events,
                        }
                    }
                }
            });
        match spawned {
            Ok(thread) => Some(FileWatch {
                watcher: Some(watcher),
                thread: Some(thread),
            }),
            Err(_) => None,
        }
    }

    #[cfg(not(feature = "watch"))]
    pub(crate) fn watch_file(self: &Arc<Self>, _db: &std::path::Path) -> Option<FileWatch> {
        None
    }
}
