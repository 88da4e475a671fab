//! How durable a commit is: [`Synchronous`].

/// How hard a commit waits for the disk. See [`crate::Builder::synchronous`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `PRAGMA synchronous=FULL`: a commit returns after its WAL frames are
    /// on disk, so a committed event survives power loss. The default.
    #[default]
    Full,
    /// `PRAGMA synchronous=NORMAL`: in WAL mode a commit survives a crash of
    /// the process but the last commits may be lost on power loss. About ten
    /// times the single-commit rate on the machines we measured.
    Normal,
}

impl Synchronous {
    /// The value `PRAGMA synchronous` takes and reads back.
    pub(crate) fn pragma_value(self) -> i64 {
        match self {
            Synchronous::Full => 2,
            Synchronous::Normal => 1,
        }
    }

    /// The pragma's name for this level: "FULL" or "NORMAL".
    pub fn as_str(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}
