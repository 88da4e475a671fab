//! `reflexr_followers`, the followers' ledger.
//!
//! The table group every backend implements (`store::sqlite::followers`,
//! `store::postgres::followers`), and the rows it speaks in.

use crate::base::error::Result;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerRow {
    pub name: String,
    pub source: String,
    pub target: String,
    pub target_file: Option<String>,
    pub projection: String,
    pub published: i64,
    pub dead_letters: i64,
    pub stops: i64,
    pub last_error: Option<String>,
    pub stopped_at: Option<i64>,
    pub restart_requests: i64,
    /// The registered PostgreSQL target's name (feature `postgres`).
    pub target_postgres: Option<String>,
}

/// Where a follower publishes: the target workspace, in this file, another
/// file, or a registered PostgreSQL target.
pub struct Target<'a> {
    pub workspace: &'a str,
    pub file: Option<&'a str>,
    pub postgres: Option<&'a str>,
}

/// `reflexr_followers`, the followers' ledger.
pub trait Followers {
    fn follower(&self, name: &str) -> Result<Option<FollowerRow>>;
    fn follower_rows(&self) -> Result<Vec<FollowerRow>>;
    /// Creates the follower's row, or updates its target and projection.
    #[allow(clippy::too_many_arguments)]
    fn upsert_follower(
        &self,
        name: &str,
        source: &str,
        target: &Target<'_>,
        projection: &str,
        now: i64,
    ) -> Result<()>;
    fn delete_follower(&self, name: &str) -> Result<bool>;
    /// Adds a batch's publishes and dead letters to the follower's counters.
    fn count_follower(&self, name: &str, published: i64, dead_letters: i64, now: i64)
    -> Result<()>;
    /// Records a stop.
    fn follower_stopped(&self, name: &str, error: &str, now: i64) -> Result<()>;
    /// Records an operator's request to restart; false: no such follower.
    fn request_restart(&self, name: &str, now: i64) -> Result<bool>;
}
