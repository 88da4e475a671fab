//! SQLite's wake-ups (see `core::wake`): the heartbeat's `PRAGMA
//! data_version` on a connection kept for it, and the WAL watch (feature
//! `watch`) that polls it at once when the operating system says the file's
//! WAL was written.

use std::sync::Arc;
#[cfg(feature = "watch")]
use std::time::Duration;

#[cfg(feature = "watch")]
use crossbeam_channel::{RecvTimeoutError, bounded};
use rusqlite::Connection;

use crate::core::wake::Notifier;

impl Notifier {
    /// `conn` is a dedicated read connection on the file, used only to poll
    /// `data_version`.
    pub(crate) fn sqlite(conn: Connection) -> Notifier {
        Notifier::polling(Box::new(move || {
            conn.query_row("PRAGMA data_version", [], |r| r.get(0)).ok()
        }))
    }
}

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
                    // µs: dense at first (a commit's fsync is usually under
                    // a millisecond), then backing off; a new write starts
                    // over.
                    for pause in [
                        0u64, 200, 300, 500, 1_000, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000,
                    ] {
                        if pause > 0 {
                            match rx.recv_timeout(Duration::from_micros(pause)) {
                                Ok(()) => {}
                                Err(RecvTimeoutError::Timeout) => {}
                                Err(RecvTimeoutError::Disconnected) => break 'events,
                            }
                        }
                        if notifier.poll() {
                            break;
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
