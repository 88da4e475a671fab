//! Power-cut torture: the crash test's mixed workload runs in a child
//! process whose every file goes through a VFS that keeps unsynced writes
//! in memory, as an operating system's cache does (`crates/reflexr-testkit/src/power.rs`
//! says what it models). At a random moment the child "loses power": of the
//! writes not yet synced, each 512-byte sector survives, is lost or is torn
//! at random, never-synced new files may vanish, and the process ends.
//! The parent then opens what a disk would hold and checks:
//!
//! - `Synchronous::Full`: every commit the child was told succeeded (sent
//!   through a pipe, which the cut does not touch) is there; `PRAGMA
//!   integrity_check` is ok; every invariant of the crash test holds, cursors
//!   never moved back across cuts (DESIGN.md 1–5, 8);
//! - `Synchronous::Normal`: the last commits may be missing, but the file
//!   is never corrupt and the invariants hold for what is there.
//!
//! `POWER_CUTS` sets the number of cuts (default 16, half in each mode).

use reflexr_testkit as common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::torture::{
    Later, append_orders_until_stopped, check_file, child_engine, prepare, rounds, strings,
    workflows, workload,
};
use common::{Scene, is_child, parent_file, power};
use reflexr::{Engine, Follow, Synchronous};
use rusqlite::Connection;

/// The child: the workload through the power-cut VFS, appending orders and
/// printing each acknowledged one, until its power is cut.
#[test]
fn child_process_loses_power() {
    if !is_child() {
        return; // Only a child started by the torture test does this work.
    }
    power::register();
    let hours: i64 = std::env::var("REFLEXR_HOURS").unwrap().parse().unwrap();
    let cut_after: u64 = std::env::var("REFLEXR_CUT_MS").unwrap().parse().unwrap();
    let sync = match std::env::var("REFLEXR_SYNC").unwrap().as_str() {
        "full" => Synchronous::Full,
        _ => Synchronous::Normal,
    };
    let e = child_engine(
        Engine::builder(parent_file())
            .vfs(power::NAME)
            .synchronous(sync),
        hours,
    );
    e.follow(
        Follow::new("app", "hub")
            .name("hub")
            .to_file(std::env::var("REFLEXR_HUB").unwrap()),
    )
    .unwrap();
    e.start().unwrap();
    println!("\nstarted");
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(cut_after));
        let (report, held) = power::cut();
        println!("\ncut {report:?}");
        // The power is gone: no I/O follows (the lock is never let go).
        std::mem::forget(held);
        std::process::exit(0);
    });
    append_orders_until_stopped(&e, hours);
}

#[test]
fn power_cuts_lose_no_acknowledged_commit_and_never_corrupt_the_file() {
    let s = Scene::new();
    let cuts = rounds("POWER_CUTS", 16);
    prepare(&s.path);
    // One file per mode: NORMAL may lose acknowledged commits, FULL may not.
    let normal = s.file("normal.db");
    std::fs::copy(&s.path, &normal).unwrap();
    // And one hub per mode, which a cross-file follower relays the orders
    // into: two files whose writes are ordered (publish, then the cursor).
    let hubs = [s.file("hub-full.db"), s.file("hub-normal.db")];
    for hub in &hubs {
        Engine::open(hub)
            .unwrap()
            .ensure_workspace("hub", &["order"])
            .unwrap();
    }
    let mut full_committed = HashSet::new();
    let mut full_cursors = BTreeMap::new();
    let (mut torn, mut lost, mut survived) = (0, 0, 0);
    let (mut normal_acknowledged, mut normal_lost) = (0, 0);
    for i in 0..cuts {
        let full = i % 2 == 0;
        let path = if full { s.path.clone() } else { normal.clone() };
        let hub = &hubs[usize::from(!full)];
        let mut child = common::Watched::new(common::spawn_child(
            "child_process_loses_power",
            &[
                ("REFLEXR_DB", path.to_string_lossy().into_owned()),
                ("REFLEXR_HUB", hub.to_string_lossy().into_owned()),
                ("REFLEXR_HOURS", (i + 1).to_string()),
                ("REFLEXR_CUT_MS", (5 + fastrand::u64(..145)).to_string()),
                ("REFLEXR_SYNC", if full { "full" } else { "normal" }.into()),
            ],
        ));
        assert!(child.past("started"), "cut {i}: the child started");
        let ended = child.finish();
        let mut acknowledged = HashSet::new();
        let mut report = None;
        for l in &ended.rest {
            if let Some(id) = l.strip_prefix("committed ") {
                acknowledged.insert(id.to_string());
            }
            if let Some(r) = l.strip_prefix("cut ") {
                report = Some(r.to_string());
            }
        }
        let report = report.unwrap_or_else(|| panic!("cut {i}: no cut: {:?}", ended.rest));
        for (word, n) in [
            ("torn", &mut torn),
            ("lost", &mut lost),
            ("survived", &mut survived),
        ] {
            *n += report
                .split(&format!("{word}: "))
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|d| d.parse::<u64>().ok())
                .unwrap_or(0);
        }
        for file in [&path, hub] {
            power::forget_shared_memory(file);
            let conn = Connection::open(file).unwrap();
            let integrity: String = conn
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(
                integrity, "ok",
                "cut {i} ({report}): {file:?} is not corrupt"
            );
        }
        relayed_up_to_the_cursor(&path, hub, i);
        if full {
            full_committed.extend(acknowledged);
            full_cursors = check_file(&path, &full_committed, &full_cursors);
        } else {
            // What is there is consistent; what was acknowledged last may
            // be gone, and cursors may be back where their last durable
            // commit left them.
            check_file(&path, &HashSet::new(), &BTreeMap::new());
            let conn = Connection::open(&path).unwrap();
            let kept: HashSet<String> = strings(&conn, "SELECT id FROM orders")
                .into_iter()
                .collect();
            normal_acknowledged += acknowledged.len();
            normal_lost += acknowledged.difference(&kept).count();
        }
    }
    // Each file finishes its work once power is back for good.
    for path in [&s.path, &normal] {
        let e = Engine::builder(path)
            .clock(Later(cuts as i64 + 10))
            .holder_id("finisher")
            .open()
            .unwrap();
        workload(&e);
        let _outside = workflows(&e);
        // The workflows' sleeps (5 ms) and waits' timeouts (20 ms) pass on
        // the system clock: a few rounds until nothing is pending.
        for _ in 0..200 {
            e.run_until_idle().unwrap();
            let pending = e.runs(Some(reflexr::RunState::Ready), 1).unwrap().len()
                + e.runs(Some(reflexr::RunState::Running), 1).unwrap().len();
            if pending == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    check_file(&s.path, &full_committed, &full_cursors);
    assert!(
        full_committed.len() as u64 > cuts / 2,
        "the children committed work ({} orders)",
        full_committed.len()
    );
    // The model does lose what was not synced (else the FULL check above
    // would prove nothing).
    assert!(
        lost > 0 && torn > 0,
        "the cuts lost ({lost}) and tore ({torn}) sectors"
    );
    println!(
        "power: {cuts} cuts; unsynced sectors at the cuts: {survived} survived, {lost} lost, {torn} torn; \
         {} acknowledged commits under FULL all kept; under NORMAL {normal_lost} of \
         {normal_acknowledged} acknowledged commits lost",
        full_committed.len()
    );
}

/// The cross-file follower's cursor, in the source, never passes what the
/// hub holds: every order at or below it is in the hub, in either mode.
fn relayed_up_to_the_cursor(source: &std::path::Path, hub: &std::path::Path, cut: u64) {
    let conn = Connection::open(source).unwrap();
    let cursor: i64 = conn
        .query_row(
            "SELECT coalesce(max(position), 0) FROM reflexr_cursors \
             WHERE kind = 'follower' AND name = 'hub' AND workspace = 'app'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let below: Vec<String> = strings(
        &conn,
        &format!(
            "SELECT id FROM reflexr_events WHERE workspace = 'app' AND type = 'order' AND seq <= {cursor}"
        ),
    );
    let hub = Connection::open(hub).unwrap();
    let relayed: HashSet<String> = strings(
        &hub,
        "SELECT id FROM reflexr_events WHERE workspace = 'hub'",
    )
    .into_iter()
    .collect();
    let missing: Vec<&String> = below.iter().filter(|id| !relayed.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "cut {cut}: the follower's cursor ({cursor}) is past {} orders the hub lost: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

#[test]
fn the_vfs_keeps_unsynced_writes_off_the_disk_until_a_sync() {
    // The model itself: what is not synced is in memory only (readers see
    // it; the disk does not hold it), and a sync puts it on the disk.
    power::register();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.db");
    let conn = Connection::open_with_flags_and_vfs(
        &path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_CREATE,
        power::NAME,
    )
    .unwrap();
    let _: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    conn.execute_batch("PRAGMA synchronous = OFF; CREATE TABLE t (x TEXT);")
        .unwrap();
    conn.execute("INSERT INTO t VALUES ('marker-one')", [])
        .unwrap();
    let seen: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 1, "the cache is read");
    let on_disk = |marker: &str| {
        let mut bytes = std::fs::read(&path).unwrap_or_default();
        bytes.extend(std::fs::read(dir.path().join("v.db-wal")).unwrap_or_default());
        bytes.windows(marker.len()).any(|w| w == marker.as_bytes())
    };
    assert!(!on_disk("marker-one"), "never synced: not on the disk");
    conn.execute_batch("PRAGMA synchronous = FULL").unwrap();
    conn.execute("INSERT INTO t VALUES ('marker-two')", [])
        .unwrap();
    assert!(
        on_disk("marker-one") && on_disk("marker-two"),
        "a FULL commit syncs the WAL"
    );
}
