//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;

use rusqlite::ErrorCode;

/// The result type of every fallible reflexr call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error a decision, a scope function, a projection or a handler
/// returns: any error, boxed. `?` converts most errors into it, reflexr's
/// own [`Error`] included, and so does `"text".into()`.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The message of a caught panic.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

/// Everything that can go wrong in reflexr.
///
/// Bad input is refused with a typed error before anything is written, and a
/// refused call leaves what is already committed untouched (DESIGN.md,
/// invariant 10). Errors from SQLite are mapped to the variants a caller can act
/// on (a full disk, a read-only file, a busy database, a corrupt file); the
/// rest arrive as [`Error::Storage`] with SQLite's code and message.
///
/// Match on the helpers ([`Error::is_not_found`], [`Error::is_lease_lost`], …)
/// rather than on fields where you can: new variants may be added.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A named thing does not exist: a workspace, an event type the workspace
    /// has not registered, a lease, a consumer.
    NotFound {
        /// What kind of thing was looked for ("workspace", "event type", …).
        kind: &'static str,
        /// The name that was looked for.
        name: String,
    },
    /// A named thing exists already and the call asked to create it.
    AlreadyExists {
        /// What kind of thing ("workspace", …).
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// An application tried to append a type only the engine may write
    /// (`RuleFired`, `RuleErrored`).
    ReservedType {
        /// The refused type.
        event_type: String,
    },
    /// An argument is malformed: an empty name, an over-long id, a payload over
    /// the size limit, a control character where none is allowed.
    Invalid {
        /// The argument that was refused.
        field: &'static str,
        /// Why, in words.
        reason: String,
    },
    /// What was asked cannot be done to the thing in the state it is in:
    /// retrying a run that is not dead, resolving a dead letter already
    /// resolved. Nothing was changed.
    Conflict {
        /// What kind of thing ("run", "dead letter", …).
        kind: &'static str,
        /// Why, in words.
        reason: String,
    },
    /// An append's expectation did not hold: its subject was not at the
    /// version it expected ([`crate::NewEvent::expect`]), or an event that
    /// matches its condition came after the condition's position
    /// ([`crate::Tx::check`]). Nothing of the write committed (DESIGN.md,
    /// invariant 13): read again, decide again, and retry if it still
    /// makes sense.
    AppendConflict {
        /// The workspace appended to.
        workspace: String,
        /// The subject whose version was expected, or the condition's
        /// subject if it names one.
        subject: Option<String>,
        /// What was expected, in words (`version 7`, `no events yet`, `no
        /// event of type seat.booked after seq 1200`).
        expected: String,
        /// The subject's version when the append looked (an expected
        /// version); `None` for a condition.
        actual_version: Option<i64>,
        /// The seq of the event that made the conflict: the subject's last
        /// event, or the first event that matches the condition; `None`
        /// when the subject has no events.
        seq: Option<i64>,
    },
    /// A cursor save asked to move a cursor backwards. Only an operator reset
    /// ([`crate::Operator::reset_cursor`]) may do that.
    CursorBackwards {
        /// The consumer whose cursor it is.
        consumer: String,
        /// The workspace the cursor reads.
        workspace: String,
        /// The cursor's stored position.
        current: i64,
        /// The position that was refused.
        requested: i64,
    },
    /// A cursor save named a position past the last seq ever assigned.
    CursorAhead {
        /// The consumer whose cursor it is.
        consumer: String,
        /// The workspace the cursor reads.
        workspace: String,
        /// The position that was refused.
        requested: i64,
        /// The highest seq ever assigned in the file.
        head: i64,
    },
    /// The lease is held by someone else and has not expired.
    LeaseHeld {
        /// The lease's name.
        name: String,
        /// Who holds it.
        holder: String,
        /// When it expires, in ms since the epoch, unless renewed.
        expires_at: i64,
    },
    /// The caller no longer holds the lease it acted under: it expired, or
    /// another holder took it over (and bumped the generation). A write fenced
    /// by it was rolled back.
    LeaseLost {
        /// The lease's name.
        name: String,
        /// The holder the caller claimed to be.
        holder: String,
        /// The generation the caller held.
        generation: i64,
    },
    /// A workflow's run suspended: a sleep, a wait for an event or a join
    /// that is not over yet ([`crate::RunContext::sleep`],
    /// [`crate::RunContext::wait_for_event`], [`crate::RunContext::join`]).
    /// The suspension is recorded already; return this error from the
    /// handler (`?` does) and the run continues, from the top, when it
    /// wakes. Not a failure: no attempt is counted, nothing is retried.
    Suspended {
        /// The run.
        run: String,
        /// The step it waits at.
        step: String,
    },
    /// A workflow step's closure failed ([`crate::RunContext::step`]): the
    /// attempt fails, and the run's retry policy applies. The steps
    /// recorded before it stay recorded.
    StepFailed {
        /// The step.
        step: String,
        /// The closure's error, in words.
        message: String,
    },
    /// A workflow reached a step somewhere else than where its run recorded
    /// it: a step name reached twice in one attempt, a recorded name met at
    /// another position or as another kind of step, or a new step where the
    /// run recorded a different one. The workflow's code changed under a
    /// run that had passed there (keep such runs on the old path with
    /// [`crate::RunContext::patched`]), or a loop reuses a name (name its
    /// steps by turn: `("send", i)`). Nothing was recorded.
    StepMoved {
        /// The run.
        run: String,
        /// The step reached.
        step: String,
        /// What was recorded instead, in words.
        reason: String,
    },
    /// Stored JSON (an event's payload, a run's input or checkpoint, a
    /// delivery's props, a rule's state) could not be decoded into the
    /// requested type. What is stored is fine and stays readable as JSON.
    Decode {
        /// What was decoded, e.g. `payload of event 42 (order.placed)`.
        what: String,
        /// The event's seq, when it was an event's payload.
        seq: Option<i64>,
        /// serde's message.
        message: String,
    },
    /// A value could not be encoded as JSON.
    Encode {
        /// serde's message.
        message: String,
    },
    /// The file exists but is not an SQLite database. It was not modified.
    NotADatabase {
        /// The file (empty when the damage was noticed after opening).
        path: PathBuf,
    },
    /// SQLite found the file damaged. Nothing was written to it.
    Corrupt {
        /// SQLite's message, and where it was noticed.
        detail: String,
    },
    /// The file was written by a newer reflexr (its schema version is higher
    /// than this library's). It was not modified; upgrade the library.
    SchemaTooNew {
        /// The file.
        path: PathBuf,
        /// The file's schema version (`PRAGMA user_version`).
        found: i64,
        /// The newest version this library knows.
        supported: i64,
    },
    /// The file is an SQLite database that reflexr cannot take over: another
    /// program uses its `user_version`, or its tables clash with reflexr's.
    ForeignDatabase {
        /// The file.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// The file to open does not exist and creating it was not allowed.
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// A pragma did not take the value reflexr set (read back after setting).
    Pragma {
        /// The pragma.
        name: &'static str,
        /// What was set.
        expected: String,
        /// What SQLite reported.
        found: String,
    },
    /// The database stayed locked by another connection for longer than the
    /// busy timeout.
    Busy {
        /// SQLite's message.
        detail: String,
    },
    /// The disk (or `max_page_count`) is full. The transaction was rolled back.
    DiskFull {
        /// SQLite's message.
        detail: String,
    },
    /// The file or its directory cannot be written. The transaction was rolled
    /// back.
    ReadOnly {
        /// SQLite's message.
        detail: String,
    },
    /// SQLite rolled the write transaction back itself (after an I/O error, or
    /// when the disk filled mid-statement), or the writer could not finish
    /// it. The whole transaction was abandoned: nothing of it committed, and
    /// every caller that shared it is told so.
    TransactionAborted {
        /// What happened.
        detail: String,
    },
    /// A write closure ran a statement that would end or change the engine's
    /// transaction — `BEGIN`, `COMMIT`/`END`, `ROLLBACK` (but not `ROLLBACK
    /// TO` a savepoint of its own), a `RELEASE` or `ROLLBACK TO` of the
    /// engine's `reflexr_*` savepoints, `ATTACH`/`DETACH`, or setting a
    /// pragma the engine relies on (`journal_mode`, `synchronous`,
    /// `foreign_keys`, …). It was refused before it ran: the transaction is
    /// intact, and returning the error rolls the closure's work back as for
    /// any error.
    StatementRefused {
        /// What was refused, in words.
        detail: String,
    },
    /// Any other error of the database, including errors of the
    /// application's own SQL run inside a write.
    Storage {
        /// SQLite's extended result code, when there is one (None on
        /// PostgreSQL, whose SQLSTATE opens the message).
        code: Option<i32>,
        /// The database's message: SQLite's, or `PostgreSQL <SQLSTATE>:
        /// <message>`.
        message: String,
    },
    /// An operating-system error outside SQLite (creating a directory,
    /// spawning a thread), or, on PostgreSQL, a connection to the server
    /// that broke or that the server ended (a restart, a failover).
    Io {
        /// The error's kind.
        kind: std::io::ErrorKind,
        /// The operating system's message.
        message: String,
    },
}

impl Error {
    /// True for [`Error::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// True for [`Error::LeaseLost`]: the caller must stop acting under the
    /// lease.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// True for [`Error::Conflict`]: the thing is not in a state that allows
    /// it (a run that is not dead cannot be retried).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    /// True for [`Error::AppendConflict`]: an append's expected version or
    /// condition did not hold, and nothing of the write committed.
    pub fn is_append_conflict(&self) -> bool {
        matches!(self, Error::AppendConflict { .. })
    }

    /// The subject's actual version an [`Error::AppendConflict`] reports
    /// (None for any other error, and for a condition's conflict).
    pub fn actual_version(&self) -> Option<i64> {
        match self {
            Error::AppendConflict { actual_version, .. } => *actual_version,
            _ => None,
        }
    }

    /// True for [`Error::Suspended`]: a workflow's run suspended; the
    /// handler returns it and the run continues when it wakes.
    pub fn is_suspended(&self) -> bool {
        matches!(self, Error::Suspended { .. })
    }

    /// True for [`Error::Busy`]: another process kept the file locked past the
    /// busy timeout. Trying again later is safe.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// True for errors caused by the caller's arguments: retrying the same
    /// call cannot succeed.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::Invalid { .. }
                | Error::ReservedType { .. }
                | Error::NotFound { .. }
                | Error::AlreadyExists { .. }
                | Error::CursorBackwards { .. }
                | Error::CursorAhead { .. }
                | Error::Encode { .. }
                | Error::StatementRefused { .. }
                | Error::Conflict { .. }
        )
    }

    /// True for a full disk or a read-only file: the storage refused to take
    /// more, and the work can resume once the fault is mended.
    pub fn is_storage_fault(&self) -> bool {
        matches!(self, Error::DiskFull { .. } | Error::ReadOnly { .. })
    }

    /// True for errors after which the write transaction cannot go on: the
    /// storage failed (full, read-only, busy, damaged, an I/O error) or
    /// SQLite ended the transaction. Anything else that goes wrong while the
    /// engine records one unit of work (a run's settlement, a rule's
    /// firing) is that unit's own failure, and is recorded against it.
    pub(crate) fn dooms_transaction(&self) -> bool {
        match self {
            Error::DiskFull { .. }
            | Error::ReadOnly { .. }
            | Error::Busy { .. }
            | Error::Corrupt { .. }
            | Error::NotADatabase { .. }
            | Error::TransactionAborted { .. }
            | Error::Io { .. } => true,
            Error::Storage { code: Some(c), .. } => matches!(
                c & 0xff,
                rusqlite::ffi::SQLITE_IOERR
                    | rusqlite::ffi::SQLITE_NOMEM
                    | rusqlite::ffi::SQLITE_CANTOPEN
                    | rusqlite::ffi::SQLITE_PROTOCOL
                    | rusqlite::ffi::SQLITE_INTERRUPT
                    | rusqlite::ffi::SQLITE_ABORT
            ),
            _ => false,
        }
    }

    /// [`Error::Invalid`]: `field` holds bad input, for `reason`. For code
    /// built on the engine that checks input of its own (a surface's
    /// settings) and reports it as the engine does.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
        Error::Invalid {
            field,
            reason: reason.into(),
        }
    }

    pub(crate) fn not_found(kind: &'static str, name: impl Into<String>) -> Error {
        Error::NotFound {
            kind,
            name: name.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound { kind, name } => write!(f, "{kind} not found: {name:?}"),
            Error::AlreadyExists { kind, name } => write!(f, "{kind} already exists: {name:?}"),
            Error::ReservedType { event_type } => write!(
                f,
                "event type {event_type:?} is reserved: only the engine appends it"
            ),
            Error::Invalid { field, reason } => write!(f, "invalid {field}: {reason}"),
            Error::Conflict { kind, reason } => write!(f, "{kind} conflict: {reason}"),
            Error::AppendConflict {
                workspace,
                subject,
                expected,
                actual_version,
                seq,
            } => {
                write!(f, "append conflict in workspace {workspace:?}")?;
                if let Some(s) = subject {
                    write!(f, " on subject {s:?}")?;
                }
                write!(f, ": expected {expected}")?;
                match (actual_version, seq) {
                    (Some(v), _) => write!(f, ", but it is at version {v}")?,
                    (None, Some(seq)) => write!(f, ", but seq {seq} matches")?,
                    (None, None) => {}
                }
                f.write_str("; nothing of the write was committed")
            }
            Error::CursorBackwards {
                consumer,
                workspace,
                current,
                requested,
            } => write!(
                f,
                "cursor {consumer:?} on workspace {workspace:?} is at {current}; \
                 refusing to move it back to {requested} (an operator reset can)"
            ),
            Error::CursorAhead {
                consumer,
                workspace,
                requested,
                head,
            } => write!(
                f,
                "cursor {consumer:?} on workspace {workspace:?}: position {requested} \
                 is past the last seq ever assigned ({head})"
            ),
            Error::LeaseHeld {
                name,
                holder,
                expires_at,
            } => write!(
                f,
                "lease {name:?} is held by {holder:?} until {expires_at} (ms since epoch)"
            ),
            Error::LeaseLost {
                name,
                holder,
                generation,
            } => write!(
                f,
                "lease {name:?} lost: {holder:?} no longer holds generation {generation}"
            ),
            Error::Decode { what, message, .. } => write!(f, "cannot decode the {what}: {message}"),
            Error::Encode { message } => write!(f, "cannot encode as JSON: {message}"),
            Error::NotADatabase { path } if path.as_os_str().is_empty() => {
                write!(f, "the database file is not an SQLite database")
            }
            Error::NotADatabase { path } => write!(
                f,
                "{} is not an SQLite database (left unchanged)",
                path.display()
            ),
            Error::Corrupt { detail } => write!(f, "the database file is corrupt: {detail}"),
            Error::SchemaTooNew {
                path,
                found,
                supported,
            } => write!(
                f,
                "{} has reflexr schema version {found}, newer than this library's {supported}; \
                 upgrade reflexr to open it (the file was left unchanged)",
                path.display()
            ),
            Error::ForeignDatabase { path, detail } => write!(
                f,
                "{} is not a reflexr database and cannot become one: {detail}",
                path.display()
            ),
            Error::Missing { path } => write!(
                f,
                "{} does not exist (and creating it was not asked for)",
                path.display()
            ),
            Error::Pragma {
                name,
                expected,
                found,
            } => write!(
                f,
                "PRAGMA {name} did not take: set {expected}, read back {found}"
            ),
            Error::Busy { detail } => write!(
                f,
                "the database stayed locked past the busy timeout: {detail}"
            ),
            Error::DiskFull { detail } => write!(f, "the disk is full: {detail}"),
            Error::ReadOnly { detail } => {
                write!(f, "the database cannot be written: {detail}")
            }
            Error::TransactionAborted { detail } => {
                write!(f, "the transaction was abandoned: {detail}")
            }
            Error::StatementRefused { detail } => write!(f, "statement refused: {detail}"),
            Error::Storage { code, message } => match code {
                Some(c) => write!(f, "SQLite error {c}: {message}"),
                None if message.starts_with("PostgreSQL") => write!(f, "{message}"),
                None => write!(f, "SQLite error: {message}"),
            },
            Error::Io { message, .. } => write!(f, "I/O error: {message}"),
            Error::Suspended { run, step } => write!(
                f,
                "run {run} suspended at step {step:?}: return this from the handler; the run \
                 continues when it wakes"
            ),
            Error::StepFailed { step, message } => write!(f, "step {step:?} failed: {message}"),
            Error::StepMoved { run, step, reason } => {
                write!(f, "run {run}: step {step:?} reached out of place: {reason}")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        let message = e.to_string();
        match &e {
            rusqlite::Error::SqliteFailure(f, _) => match f.code {
                ErrorCode::DatabaseCorrupt => Error::Corrupt { detail: message },
                // The path is filled in by the open that noticed it.
                ErrorCode::NotADatabase => Error::NotADatabase {
                    path: PathBuf::new(),
                },
                ErrorCode::DiskFull => Error::DiskFull { detail: message },
                ErrorCode::ReadOnly => Error::ReadOnly { detail: message },
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                    Error::Busy { detail: message }
                }
                // Only the writer's guard installs an authorizer.
                ErrorCode::AuthorizationForStatementDenied => Error::StatementRefused {
                    detail: "a write closure may not end or change the engine's transaction \
                             (BEGIN, COMMIT, END, ROLLBACK, the engine's reflexr_* savepoints, \
                             ATTACH, DETACH, or setting journal_mode, synchronous, foreign_keys \
                             and the other pragmas the engine relies on)"
                        .into(),
                },
                _ => Error::Storage {
                    code: Some(f.extended_code),
                    message,
                },
            },
            _ => Error::Storage {
                code: None,
                message,
            },
        }
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Self {
        use postgres::error::SqlState;
        let message = match e.as_db_error() {
            Some(db) => format!("PostgreSQL {}: {}", db.code().code(), db.message()),
            None => format!("PostgreSQL: {e}"),
        };
        match e.code() {
            Some(c) if *c == SqlState::DISK_FULL => Error::DiskFull { detail: message },
            Some(c) if *c == SqlState::READ_ONLY_SQL_TRANSACTION => {
                Error::ReadOnly { detail: message }
            }
            // Conflicts, and a statement cancelled (statement_timeout, a
            // cancel request) on a live connection: try again.
            Some(c)
                if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED
                    || *c == SqlState::LOCK_NOT_AVAILABLE
                    || *c == SqlState::QUERY_CANCELED =>
            {
                Error::Busy { detail: message }
            }
            // A parameter PostgreSQL's text cannot hold (a NUL byte, which
            // SQLite stores): the caller's input, refused before anything
            // was written. (Not 22P05, untranslatable_character: that one
            // also comes from stored data, a `\u0000` read as jsonb.)
            Some(c) if *c == SqlState::CHARACTER_NOT_IN_REPERTOIRE => Error::Invalid {
                field: "text",
                reason: format!("PostgreSQL cannot store it ({message})"),
            },
            Some(c) if *c == SqlState::DATA_CORRUPTED || *c == SqlState::INDEX_CORRUPTED => {
                Error::Corrupt { detail: message }
            }
            // Class 08 (connection exception) and 57 (operator
            // intervention: the server shutting down or restarting, a
            // cancelled backend): the connection is gone, not the data.
            Some(c) if c.code().starts_with("08") || c.code().starts_with("57") => Error::Io {
                kind: std::io::ErrorKind::ConnectionAborted,
                message,
            },
            Some(_) => Error::Storage {
                code: None,
                message,
            },
            // No SQLSTATE: the connection broke (or the server went away)...
            None if e.is_closed()
                || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()) =>
            {
                Error::Io {
                    kind: std::io::ErrorKind::ConnectionAborted,
                    message,
                }
            }
            // ...or the client refused something on its side (a value that
            // does not convert, a parameter count that does not match).
            None => Error::Storage {
                code: None,
                message,
            },
        }
    }
}

impl From<r2d2::Error> for Error {
    fn from(e: r2d2::Error) -> Self {
        // r2d2 reports a connection it could not open, or a pool that stayed
        // empty past its timeout; both read as a busy database to a caller.
        Error::Busy {
            detail: format!("no pooled connection: {e}"),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}
