//! Connection set-up: pragmas set on every connection and read back, and the
//! busy handler.

use std::cell::Cell;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

pub(crate) use crate::base::durability::Synchronous;
use crate::base::error::{Error, Result};

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The one connection a process writes through.
    Writer,
    /// Pooled readers: `query_only`, so a read can never write.
    Reader,
}

pub(crate) fn open_flags(create: bool) -> OpenFlags {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    flags
}

/// What SQLite is asked to open: the path, or — with a VFS of the
/// application's (`EngineBuilder::vfs`) — a `file:` URI naming it, with the
/// URI flag. A URI is text, so with a VFS the path must be UTF-8.
pub(crate) fn target(
    path: &Path,
    vfs: Option<&str>,
    create: bool,
) -> Result<(std::path::PathBuf, OpenFlags)> {
    let flags = open_flags(create);
    let Some(vfs) = vfs else {
        return Ok((path.to_path_buf(), flags));
    };
    let text = path
        .to_str()
        .ok_or_else(|| Error::invalid("path", "must be UTF-8 to open through a VFS"))?;
    let mut uri = String::from("file:");
    for c in text.chars() {
        match c {
            '%' => uri.push_str("%25"),
            '?' => uri.push_str("%3F"),
            '#' => uri.push_str("%23"),
            c => uri.push(c),
        }
    }
    uri.push_str("?vfs=");
    uri.push_str(vfs);
    Ok((uri.into(), flags | OpenFlags::SQLITE_OPEN_URI))
}

/// Opens a connection to an existing file without touching it: no pragma that
/// writes is set here. A VFS that SQLite does not know is refused as bad
/// input.
pub(crate) fn open_raw(path: &Path, create: bool, vfs: Option<&str>) -> Result<Connection> {
    let (target, flags) = target(path, vfs, create)?;
    let conn = Connection::open_with_flags(target, flags).map_err(|e| match vfs {
        Some(name) if e.to_string().contains("no such vfs") => Error::invalid(
            "vfs",
            format!("no VFS named {name:?} is registered with SQLite"),
        ),
        _ => e.into(),
    })?;
    conn.busy_handler(Some(busy_handler))?;
    Ok(conn)
}

/// Sets the per-connection pragmas and reads every one back. A pragma SQLite
/// ignores (a typo, an unsupported value) is an error here, not a silent
/// downgrade of durability.
pub(crate) fn configure(conn: &Connection, sync: Synchronous, role: Role) -> Result<()> {
    conn.busy_handler(Some(busy_handler))?;
    conn.set_prepared_statement_cache_capacity(64);

    let journal: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !journal.eq_ignore_ascii_case("wal") {
        return Err(Error::Pragma {
            name: "journal_mode",
            expected: "wal".into(),
            found: journal,
        });
    }
    set_and_check(conn, "foreign_keys", 1)?;
    set_and_check(conn, "synchronous", sync.pragma_value())?;
    // Each caller's work runs in a savepoint, for which SQLite keeps a
    // statement journal; in memory it costs no file writes (2 = MEMORY).
    set_and_check(conn, "temp_store", 2)?;
    match role {
        Role::Reader => set_and_check(conn, "query_only", 1)?,
        Role::Writer => super::events::add_functions(conn)?,
    }
    Ok(())
}

fn set_and_check(conn: &Connection, name: &'static str, value: i64) -> Result<()> {
    conn.pragma_update(None, name, value)?;
    let found: i64 = conn.pragma_query_value(None, name, |r| r.get(0))?;
    if found != value {
        return Err(Error::Pragma {
            name,
            expected: value.to_string(),
            found: found.to_string(),
        });
    }
    Ok(())
}

/// Switches the file to WAL mode (persistent in the file) and reads it back.
pub(crate) fn enable_wal(conn: &Connection) -> Result<()> {
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Pragma {
            name: "journal_mode",
            expected: "wal".into(),
            found: mode,
        });
    }
    Ok(())
}

/// How long one statement waits inside the busy handler before SQLite returns
/// `SQLITE_BUSY` to reflexr, which then retries the whole step until the
/// engine's busy timeout ([`retry_busy`]). Short, so the engine's own timeout
/// is what a caller sees.
const HANDLER_LIMIT: Duration = Duration::from_millis(250);

thread_local! {
    static BUSY_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// SQLite's default handler backs off to 100 ms sleeps, under which a waiting
/// connection keeps losing the lock to one that happened to sleep less (DESIGN.md
/// measured waits of seconds). This one sleeps 50–500 µs, jittered, so waiting
/// connections take turns at about the rate the lock changes hands.
fn busy_handler(count: i32) -> bool {
    let now = Instant::now();
    let since = BUSY_SINCE.with(|s| {
        if count == 0 || s.get().is_none() {
            s.set(Some(now));
        }
        s.get().unwrap_or(now)
    });
    if now.duration_since(since) >= HANDLER_LIMIT {
        BUSY_SINCE.with(|s| s.set(None));
        return false;
    }
    let ceiling = if count < 20 { 200 } else { 500 };
    std::thread::sleep(Duration::from_micros(fastrand::u64(50..=ceiling)));
    true
}

/// Runs `step` until it succeeds, fails with something other than
/// [`Error::Busy`], or `timeout` has passed. Only for steps that are safe to
/// repeat: a read, or a `BEGIN` that did not start.
pub(crate) fn retry_busy<T>(timeout: Duration, mut step: impl FnMut() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        match step() {
            Err(e) if e.is_busy() && start.elapsed() < timeout => {
                std::thread::sleep(Duration::from_micros(fastrand::u64(100..=1_000)));
            }
            other => return other,
        }
    }
}

/// The writer connection's guard: SQLite's authorizer, consulted as each
/// statement is prepared, refuses the statements that would end or change
/// the engine's transaction while a closure of the application's (or any
/// code that is not the writer's own bookkeeping) is running. The writer
/// runs its own `BEGIN`, `SAVEPOINT`, `RELEASE`, `ROLLBACK TO` and `COMMIT`
/// through [`Guard::control`], which lets them through.
///
/// Refused (the statement fails to prepare with `SQLITE_AUTH`, which reaches
/// the caller as [`Error::StatementRefused`]):
/// - `BEGIN`, `COMMIT`/`END`, `ROLLBACK` (not `ROLLBACK TO`);
/// - `SAVEPOINT`, `RELEASE` and `ROLLBACK TO` of a savepoint named
///   `reflexr_*` (the writer's and the engine's own);
/// - `ATTACH` and `DETACH`;
/// - setting one of [`GUARDED_PRAGMAS`] (reading them is fine).
///
/// `VACUUM` needs no rule: SQLite refuses it inside a transaction.
///
/// The control statements are prepared once and cached, under SQL text that
/// ends in a comment holding a random number drawn when the guard is
/// installed: a closure cannot name them, so whatever it prepares — even
/// the same statement — goes through the authorizer.
pub struct Guard {
    /// True while the writer runs a statement of its own.
    control: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Each control statement's SQL, with the guard's secret comment.
    texts: [String; Control::COUNT],
}

/// The writer's own transaction-control statements.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Control {
    Begin,
    Commit,
    Rollback,
    /// A caller's savepoint in the batch.
    Call,
    RollbackCall,
    ReleaseCall,
    /// The engine's savepoint inside a caller's work.
    Nested,
    RollbackNested,
    ReleaseNested,
}

impl Control {
    const COUNT: usize = 9;

    fn sql(self) -> &'static str {
        match self {
            Control::Begin => "BEGIN IMMEDIATE",
            Control::Commit => "COMMIT",
            Control::Rollback => "ROLLBACK",
            Control::Call => "SAVEPOINT reflexr_call",
            Control::RollbackCall => "ROLLBACK TO reflexr_call",
            Control::ReleaseCall => "RELEASE reflexr_call",
            Control::Nested => "SAVEPOINT reflexr_nested",
            Control::RollbackNested => "ROLLBACK TO reflexr_nested",
            Control::ReleaseNested => "RELEASE reflexr_nested",
        }
    }
}

/// Pragmas a write closure may read but not set: durability, the journal,
/// the engine's own settings and version, and checks other callers' work
/// relies on (an immediate foreign-key error is how an append to a missing
/// type becomes `NotFound`).
pub(crate) const GUARDED_PRAGMAS: &[&str] = &[
    "journal_mode",
    "synchronous",
    "foreign_keys",
    "defer_foreign_keys",
    "query_only",
    "locking_mode",
    "temp_store",
    "writable_schema",
    "user_version",
    "schema_version",
    "ignore_check_constraints",
    "busy_timeout",
];

impl Guard {
    /// Installs the authorizer on `conn`.
    pub(crate) fn install(conn: &Connection) -> Result<Guard> {
        use std::sync::atomic::Ordering;
        let secret = fastrand::u64(..);
        let all = [
            Control::Begin,
            Control::Commit,
            Control::Rollback,
            Control::Call,
            Control::RollbackCall,
            Control::ReleaseCall,
            Control::Nested,
            Control::RollbackNested,
            Control::ReleaseNested,
        ];
        let guard = Guard {
            control: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            texts: all.map(|c| format!("{} /* reflexr {secret:016x} */", c.sql())),
        };
        let control = std::sync::Arc::clone(&guard.control);
        conn.authorizer(Some(move |ctx: rusqlite::hooks::AuthContext<'_>| {
            if control.load(Ordering::Relaxed) || allowed(&ctx.action) {
                rusqlite::hooks::Authorization::Allow
            } else {
                rusqlite::hooks::Authorization::Deny
            }
        }))?;
        Ok(guard)
    }

    /// Runs one of the writer's own transaction-control statements (prepared
    /// and, if need be, prepared again while the guard lets it through).
    pub(crate) fn control(&self, conn: &Connection, what: Control) -> Result<()> {
        use std::sync::atomic::Ordering;
        self.control.store(true, Ordering::Relaxed);
        let result = conn
            .prepare_cached(&self.texts[what as usize])
            .and_then(|mut s| s.execute([]));
        self.control.store(false, Ordering::Relaxed);
        result?;
        Ok(())
    }
}

/// True when the guard lets `action` through outside the writer's own
/// statements.
fn allowed(action: &rusqlite::hooks::AuthAction<'_>) -> bool {
    use rusqlite::hooks::AuthAction;
    match action {
        AuthAction::Transaction { .. } | AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
            false
        }
        AuthAction::Savepoint { savepoint_name, .. } => !savepoint_name
            .get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("reflexr_")),
        AuthAction::Pragma {
            pragma_name,
            pragma_value: Some(_),
        } => !GUARDED_PRAGMAS
            .iter()
            .any(|p| p.eq_ignore_ascii_case(pragma_name)),
        _ => true,
    }
}
