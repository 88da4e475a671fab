//! Helpers shared by the integration tests: temp-file databases, a manual
//! clock, and child processes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reflexr::{Engine, ManualClock};

/// A fresh database path in its own temp directory (kept alive by the guard).
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("test.db");
    (dir, path)
}

/// A clock at a round, recognisable time.
pub fn clock() -> ManualClock {
    ManualClock::new(1_800_000_000_000)
}

/// An engine on `path` driven by `clock`, with a short busy timeout so a bug
/// shows as an error rather than a long hang.
pub fn engine_with(path: &Path, clock: &ManualClock, holder: &str) -> Engine {
    Engine::builder(path)
        .clock(clock.clone())
        .holder_id(holder)
        .busy_timeout(Duration::from_secs(20))
        .open()
        .expect("open engine")
}

/// Counts rows of a query's single integer column.
pub fn count(engine: &Engine, sql: &str) -> i64 {
    engine
        .with_reader(|c| Ok(c.query_row(sql, [], |r| r.get(0))?))
        .expect("count")
}

/// Starts this test binary again as a child process that runs only the test
/// `entry`, with `vars` in its environment. The entry test does its child's
/// work when it finds `REFLEXR_CHILD` set, and nothing otherwise.
pub fn spawn_child(entry: &str, vars: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([entry, "--exact", "--nocapture", "--test-threads=1"])
        .env("REFLEXR_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// True inside a child started by [`spawn_child`].
pub fn is_child() -> bool {
    std::env::var_os("REFLEXR_CHILD").is_some()
}

/// A file's bytes, to prove a refused open left it unchanged.
pub fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read file")
}
