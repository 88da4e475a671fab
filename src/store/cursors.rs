//! `reflexr_cursors`: where each consumer stands.
//!
//! The table group every backend implements (`store::sqlite::cursors`,
//! `store::postgres::cursors`), and the rows it speaks in.

use crate::base::error::Result;

/// A cursor row with its lag.
pub struct Listed {
    pub workspace: String,
    pub kind: String,
    pub name: String,
    pub position: i64,
    pub lag: i64,
    pub updated_at: i64,
    pub failures: i64,
    pub last_error: Option<String>,
}

/// `reflexr_cursors`.
pub trait Cursors {
    /// The cursor's position, if it was ever saved.
    fn get(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<i64>>;
    /// Moves the cursor to `position` unless that is behind it; returns
    /// `Err(current)` when it would have moved backwards (nothing written).
    fn advance(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<std::result::Result<(), i64>>;
    /// Every cursor, with the number of its workspace's events after it.
    fn list(&self) -> Result<Vec<Listed>>;
    /// The lowest position of any cursor on the workspace (None: none).
    fn min_position(&self, workspace: &str) -> Result<Option<i64>>;
    /// Sets the cursor to `position`, forwards or backwards (an operator's
    /// reset), and returns where it was; its stamp moves past any value
    /// read before.
    fn set(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        now: i64,
    ) -> Result<Option<i64>>;
    /// The position and the stamp of its last change (see
    /// `store::cursors::get_stamped`).
    fn get_stamped(&self, workspace: &str, kind: &str, name: &str) -> Result<Option<(i64, i64)>>;
    /// Marks the cursor changed without moving it.
    fn touch(&self, workspace: &str, kind: &str, name: &str, now: i64) -> Result<()>;
    /// The furthest the cursor has ever been (0: never saved).
    fn high_water(&self, workspace: &str, kind: &str, name: &str) -> Result<i64>;
    /// [`Cursors::get_stamped`] and [`Cursors::high_water`] in one read
    /// of the cursor's row.
    fn stamped_and_high_water(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
    ) -> Result<(Option<(i64, i64)>, i64)>;
    /// Deletes the cursor; false if there was none.
    fn delete(&self, workspace: &str, kind: &str, name: &str) -> Result<bool>;
    /// Records that the consumer's commit failed at `position` (nothing if
    /// the cursor moved since); the failures so far.
    #[allow(clippy::too_many_arguments)]
    fn record_failure(
        &self,
        workspace: &str,
        kind: &str,
        name: &str,
        position: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>>;
}
