//! SQLite's wake-ups (see `core::wake`): the heartbeat's `PRAGMA
//! data_version` on the writer's connection, and the WAL watch (feature
//! `watch`) that polls it at once when the operating system says the file's
//! WAL was written.
//!
//! On Linux the watch stops listening while it polls densely (for the
//! first ~700 µs after a write): inotify reports every `write` in the
//! file's directory — a dozen a commit to the WAL — and woke the watch's
//! reader for each, on the path of the thread that wrote, most of them this
//! process's own commits or a neighbouring file's. Any event there starts
//! the polls. What it measured is in the performance guide ("The WAL watch
//! stops listening while it polls densely").
//!
//! It stays deaf for as long as this process goes on committing (to any of
//! its files: `OWN_COMMITS`), since listening again would only hear those
//! commits and start the polls over. Meanwhile the writer looks for other
//! processes' commits at the start of its transactions
//! (`Notifier::writer_looks`), and the watch polls once a millisecond, for
//! a writer of this file that is quiet while another file is written. It
//! listens again after a millisecond without a commit of the process's
//! (the performance guide: "The WAL watch stays deaf while the process
//! commits").
//!
//! The number is read on the writer's connection because there it changes
//! only when *another* connection committed: this process's own commits,
//! which nudge their waiters themselves (for what they made), do not read
//! as news. Read on a connection of its own, every commit of the writer
//! changed it, and the watch — which sees this process's WAL writes too —
//! woke every waiting thread a few hundred microseconds after each of
//! them, beside the handler its commit had just handed a run to.

#[cfg(feature = "watch")]
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
#[cfg(feature = "watch")]
use std::time::Duration;

#[cfg(feature = "watch")]
use crossbeam_channel::{Receiver, RecvTimeoutError, bounded};
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

/// Commits of this process's writers, whatever their file: while they go
/// on, a watch polling densely stays deaf ([`watch_loop`]).
static OWN_COMMITS: AtomicU64 = AtomicU64::new(0);

/// Counts a commit of this process's (the writer, after each).
pub(crate) fn own_commit() {
    OWN_COMMITS.fetch_add(1, Ordering::Relaxed);
}

#[cfg(feature = "watch")]
fn own_commits() -> u64 {
    OWN_COMMITS.load(Ordering::Relaxed)
}

/// The pauses between the WAL watch's polls after a write, in µs: dense at
/// first (a commit's fsync, between its last WAL write and its being seen,
/// is usually a few hundred microseconds), then backing off for a slow
/// disk.
#[cfg(feature = "watch")]
const POLL_PAUSES_US: [u64; 12] = [
    100, 100, 100, 200, 200, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000,
];

/// The pause between the polls of a deaf watch while this process goes on
/// committing, in µs.
#[cfg(feature = "watch")]
const BUSY_POLL_US: u64 = 1_000;

/// How many of [`POLL_PAUSES_US`] are the dense ones: a write seen past
/// them starts the pauses over.
#[cfg(feature = "watch")]
const DENSE_POLLS: usize = 5;

/// The WAL watch of one open file (feature `watch`): dropped with the file,
/// which ends its thread.
#[cfg(feature = "watch")]
pub(crate) struct FileWatch {
    /// Shared with the thread, which stops listening while it polls
    /// densely ([`Ears`]); taken out and dropped to end it.
    watcher: Arc<Mutex<Option<notify::RecommendedWatcher>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "watch")]
impl Drop for FileWatch {
    /// Stops the watch and joins its thread, so a dropped engine leaves no
    /// connection to the file behind.
    fn drop(&mut self) {
        let watcher = self
            .watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(watcher);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(not(feature = "watch"))]
pub(crate) struct FileWatch;

impl Notifier {
    /// Watches `db`'s directory for writes to its WAL (on Linux, for any
    /// event there: see `DEAF_WHILE_DENSE`; feature `watch`). None, with a log
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
        let mut wal = db.file_name()?.to_os_string();
        wal.push("-wal");
        let (tx, rx) = bounded::<()>(1);
        let handler = move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            // On Linux any event of the directory, whatever file it
            // names, starts the polls and with them the watch's deaf spell
            // (`DEAF_WHILE_DENSE`): a busy neighbour — another reflexr
            // file, the application's own — would otherwise wake the
            // reader at each of its writes too. A poll costs a
            // `data_version` read.
            let wanted = DEAF_WHILE_DENSE
                || matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_))
                    && event
                        .paths
                        .iter()
                        .any(|p| p.file_name().is_some_and(|n| n == wal.as_os_str()));
            if wanted {
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
        let watcher = Arc::new(Mutex::new(Some(watcher)));
        let ears = Ears {
            watcher: Arc::clone(&watcher),
            dir,
        };
        let spawned = std::thread::Builder::new()
            .name("reflexr-watch".into())
            .spawn(move || watch_loop(&notifier, &rx, &ears));
        match spawned {
            Ok(thread) => Some(FileWatch {
                watcher,
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

/// Whether the watch stops listening while it polls densely: inotify (Linux)
/// queues an event for every write to the directory's files and wakes its
/// reader for each — a dozen a commit, most of them this process's own,
/// every one a wake-up on the path of the thread that writes. The other
/// platforms' watches (FSEvents, kqueue, Windows) report fewer, and set
/// up a watch at a higher price.
#[cfg(feature = "watch")]
const DEAF_WHILE_DENSE: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// What the watch's thread listens with: the watcher, shared with its
/// [`FileWatch`], and the directory it watches.
#[cfg(feature = "watch")]
struct Ears {
    watcher: Arc<Mutex<Option<notify::RecommendedWatcher>>>,
    dir: std::path::PathBuf,
}

#[cfg(feature = "watch")]
impl Ears {
    /// Stops (`false`) or starts (`true`) listening. False when the file's
    /// watch is gone (dropped) or the operating system refused: the thread
    /// ends, and the heartbeat notices other processes' commits.
    fn listen(&self, on: bool) -> bool {
        use notify::{RecursiveMode, Watcher};
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(w) = w.as_mut() else { return false };
        let done = if on {
            w.watch(&self.dir, RecursiveMode::NonRecursive)
        } else {
            w.unwatch(&self.dir)
        };
        match done {
            Ok(()) => true,
            Err(e) => {
                log::info!(
                    "the file watch on {} stopped ({e}): the heartbeat notices other processes' commits",
                    self.dir.display()
                );
                false
            }
        }
    }
}

/// The watch's thread: waits for a write to the WAL, then polls
/// `data_version` at [`POLL_PAUSES_US`]. On Linux it stops listening for
/// the dense polls ([`DEAF_WHILE_DENSE`]): they come every 100–200 µs
/// whatever was written, so another process's commit meanwhile is seen by
/// the next of them, and this process's own writes — a burst of events a
/// commit — wake no one. If the process committed meanwhile, it stays
/// deaf until a millisecond passes without a commit of the process's,
/// polling once a millisecond, while the writer looks at the start of its
/// transactions. It listens again before the last looks, so a commit after
/// them is an event again. Ends when the file's watch is dropped (the
/// events' sender goes with the watcher).
#[cfg(feature = "watch")]
fn watch_loop(notifier: &Notifier, rx: &Receiver<()>, ears: &Ears) {
    // Wait for a pause, or an event: false when the watch is gone.
    let pause = |us: u64| -> Result<bool, ()> {
        match rx.recv_timeout(Duration::from_micros(us)) {
            Ok(()) => Ok(true),
            Err(RecvTimeoutError::Timeout) => Ok(false),
            Err(RecvTimeoutError::Disconnected) => Err(()),
        }
    };
    'events: while rx.recv().is_ok() {
        loop {
            if DEAF_WHILE_DENSE {
                if !ears.listen(false) {
                    return;
                }
                // Events queued before the watch stopped: no news beyond
                // the one that began these polls.
                while rx.try_recv().is_ok() {}
                // The dense polls, and again while this process goes on
                // committing: listening again would only hear its own
                // writes, and start the polls over.
                let mut before = own_commits();
                for &us in &POLL_PAUSES_US[..DENSE_POLLS] {
                    notifier.poll_soon();
                    if pause(us).is_err() {
                        return;
                    }
                }
                if own_commits() != before {
                    // This process commits on: its writer looks for other
                    // processes' commits as its transactions begin (a poll
                    // here would mostly find it busy), and a slow poll
                    // covers a writer of this file that is quiet while
                    // another file of the process is written.
                    notifier.set_writer_looks(true);
                    while own_commits() != before {
                        before = own_commits();
                        notifier.poll_soon();
                        if pause(BUSY_POLL_US).is_err() {
                            notifier.set_writer_looks(false);
                            return;
                        }
                    }
                    notifier.set_writer_looks(false);
                }
                if !ears.listen(true) {
                    return;
                }
            }
            // From here on the watch listens: a poll that finds the news
            // ends the polls until the next write; a write meanwhile starts
            // the dense polls over (this process's own writes, which are no
            // news, come too; another process's commit after a while of
            // them is still seen within a pause or two). After a deaf
            // spell the news found may be an older commit's, while a
            // commit whose writes came unheard is still in its fsync: the
            // backing-off polls then run to their end.
            let first = if DEAF_WHILE_DENSE { DENSE_POLLS } else { 0 };
            let mut step = first;
            loop {
                if notifier.poll_soon() && !DEAF_WHILE_DENSE {
                    continue 'events;
                }
                let Some(&us) = POLL_PAUSES_US.get(step) else {
                    continue 'events;
                };
                step += 1;
                match pause(us) {
                    Ok(true) if step > DENSE_POLLS => break,
                    Ok(_) => {}
                    Err(()) => return,
                }
            }
            // A write after the dense polls: start them over.
        }
    }
}
