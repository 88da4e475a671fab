//! Faults, each with its documented behaviour: a clear error, nothing
//! committed lost, and the work resumes when the fault ends (DESIGN.md,
//! invariant 10). A slow handler and a jumping clock run on every backend
//! (`on_backends!`); a full disk and a read-only file are SQLite's file's
//! (PostgreSQL's server restart is `tests/it/pg/restart.rs`).

use reflexr_testkit as common;

use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use common::backend::{Opts, TestBackend};
use common::{Arrange, Scene, on_backends};
use reflexr::{
    Decision, Engine, Error, ManualClock, NewEvent, Query, RetryPolicy, Rule, RunOrder, RunState,
};

on_backends!(
    a_handler_slower_than_its_lease_keeps_its_claim_while_the_renewer_runs,
    a_clock_that_jumps_forward_or_back_stops_nothing,
);

fn tick(i: usize) -> NewEvent {
    NewEvent::new("tick", format!("t/{i}"), "test", 0)
        .payload(&serde_json::json!({ "i": i, "pad": "x".repeat(200) }))
}

#[test]
fn a_full_disk_is_a_clear_error_loses_nothing_and_appends_resume_when_there_is_room() {
    let s = Scene::new();
    let e = s.open("test").workspace("app", &["tick"]);
    for i in 0..50 {
        e.append("app", &tick(i)).unwrap();
    }
    // The writer's connection may grow the file no further (as a full disk
    // or quota would have it).
    let pages: i64 = e
        .write(|tx| {
            let pages: i64 = tx.conn().query_row("PRAGMA page_count", [], |r| r.get(0))?;
            tx.conn().pragma_update(None, "max_page_count", pages)?;
            Ok(pages)
        })
        .unwrap();
    let mut refused = None;
    for i in 50..5_000 {
        if let Err(err) = e.write(|tx| {
            for k in 0..20 {
                tx.append("app", &tick(i * 100 + k))?;
            }
            Ok(())
        }) {
            refused = Some(err);
            break;
        }
    }
    let err = refused.expect("the file filled up");
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    assert!(err.is_storage_fault());
    let kept = e.read(&Query::new("app").limit(10_000)).unwrap().len();
    assert!(kept >= 50, "nothing committed is lost ({kept})");
    let head = e.head_seq().unwrap();
    // Room again: work resumes, and the refused write left no trace.
    e.write(|tx| {
        tx.conn()
            .pragma_update(None, "max_page_count", pages * 100)?;
        Ok(())
    })
    .unwrap();
    let next = e.append("app", &tick(999_999)).unwrap();
    assert!(next.seq > head);
    assert_eq!(
        e.read(&Query::new("app").limit(10_000)).unwrap().len(),
        kept + 1
    );
    e.check_integrity().unwrap();
}

/// Makes `path` unwritable — for root too (`chattr +i`), or by permission
/// for other users — and returns how to undo it; `None` where neither can be
/// done (root on a file system without the immutable flag).
fn make_read_only(path: &Path) -> Option<Box<dyn FnOnce()>> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    if root {
        let ok = Command::new("chattr")
            .arg("+i")
            .arg(path)
            .status()
            .map(|s| s.success());
        if !matches!(ok, Ok(true)) {
            return None;
        }
        let p = path.to_path_buf();
        Some(Box::new(move || {
            Command::new("chattr").arg("-i").arg(&p).status().unwrap();
        }))
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).unwrap();
        let p = path.to_path_buf();
        Some(Box::new(move || {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }))
    }
}

#[test]
fn a_read_only_file_is_refused_clearly_and_unchanged_and_opens_again_once_writable() {
    let s = Scene::new();
    {
        let e = Engine::open(&s.path).unwrap();
        e.ensure_workspace("app", &["tick"]).unwrap();
        e.append("app", &tick(1)).unwrap();
    }
    let before = common::bytes(&s.path);
    let Some(undo) = make_read_only(&s.path) else {
        eprintln!(
            "SKIPPED: this file system cannot make a file read-only for root (chattr +i failed)"
        );
        return;
    };
    let result = Engine::open(&s.path);
    let after = common::bytes(&s.path);
    undo();
    let err = result.unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
    assert!(err.is_storage_fault());
    assert_eq!(before, after, "left unchanged");
    let e = Engine::open(&s.path).unwrap();
    assert_eq!(e.read(&Query::new("app")).unwrap().len(), 1);
    e.append("app", &tick(2)).unwrap();
}

/// Invariant 5 under a slow handler: the claim's lease is 3 s on the
/// engine's clock; the handler works for 6 s of it. The renewer extends the
/// claim every third of the TTL, so the run is neither taken by another
/// executor nor run twice.
fn a_handler_slower_than_its_lease_keeps_its_claim_while_the_renewer_runs<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(1_800_000_000_000);
    let e = B::open_opts(
        &place,
        &Opts::new(&clock, "test")
            .lease_ttl(Duration::from_secs(3))
            .executors(1)
            .heartbeat(Duration::from_millis(5)),
    );
    e.ensure_workspace("app", &["tick"]).unwrap();
    e.register_rule(
        Rule::new("slow", "app")
            .on(["tick"])
            .ordering(RunOrder::None)
            .action("slow")
            .decide(|_| Ok(Decision::Fire(serde_json::Value::Null))),
    )
    .unwrap();
    let (started_tx, started) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let (started_tx, release) = (Mutex::new(started_tx), Mutex::new(release));
    e.register_action("slow", move |run, _| {
        started_tx.lock().unwrap().send(run.id.clone()).unwrap();
        release.lock().unwrap().recv().unwrap();
        Ok(())
    })
    .unwrap();
    e.start().unwrap();
    e.append("app", &tick(1)).unwrap();
    let id = started.recv_timeout(Duration::from_secs(60)).unwrap();
    let expiry = || e.run(&id).unwrap().unwrap().claim_expires_at.unwrap();
    for _ in 0..6 {
        let was = expiry();
        clock.advance(Duration::from_secs(1));
        // Wait for the renewer (it runs every heartbeat) to extend the claim.
        let deadline = Instant::now() + Duration::from_secs(60);
        while expiry() <= was {
            assert!(Instant::now() < deadline, "the claim was never renewed");
            std::thread::yield_now();
        }
    }
    release_tx.send(()).unwrap();
    // The handler's one attempt completes the run.
    let deadline = Instant::now() + Duration::from_secs(60);
    while e.run(&id).unwrap().unwrap().state != RunState::Succeeded {
        assert!(Instant::now() < deadline, "the run never completed");
        std::thread::yield_now();
    }
    e.shutdown();
    assert_eq!(e.run(&id).unwrap().unwrap().attempt, 1, "run once");
}

/// Invariants 7 and 1 under a jumping clock. Forward: leases the engine
/// held have lapsed by its own clock; it takes them again (a new
/// generation) and goes on. Back: recorded_at goes back with the clock
/// (seq, not time, orders the log); leases keep their expiry (it only moves
/// forward); runs come due by the clock as it is.
fn a_clock_that_jumps_forward_or_back_stops_nothing<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(1_800_000_000_000);
    let e = B::open(&place, &clock, "test");
    e.ensure_workspace("app", &["tick"]).unwrap();
    B::sql(&e, "CREATE TABLE IF NOT EXISTS done (run TEXT PRIMARY KEY)");
    e.register_rule(
        Rule::new("each", "app")
            .on(["tick"])
            .ordering(RunOrder::None)
            .action("count")
            .retry(RetryPolicy::attempts(3).fixed(Duration::from_secs(60)))
            .decide(|_| Ok(Decision::Fire(serde_json::Value::Null))),
    )
    .unwrap();
    e.register_action("count", |run, ctx| {
        ctx.complete(|tx| B::run_sql(tx, &format!("INSERT INTO done VALUES ('{}')", run.id)))?;
        Ok(())
    })
    .unwrap();
    e.append("app", &tick(1)).unwrap();
    assert_eq!(e.run_until_idle().unwrap().succeeded, 1);

    clock.advance(Duration::from_secs(86_400));
    e.append("app", &tick(2)).unwrap();
    assert_eq!(
        e.run_until_idle().unwrap().succeeded,
        1,
        "after a jump forward"
    );
    let gen_after_forward = e
        .leases()
        .unwrap()
        .into_iter()
        .find(|l| l.name == "evaluator/app")
        .unwrap()
        .generation;
    assert_eq!(gen_after_forward, 2, "taken again, not assumed");

    clock.set(clock_now(&clock) - 2 * 86_400_000);
    e.append("app", &tick(3)).unwrap();
    assert_eq!(
        e.run_until_idle().unwrap().succeeded,
        1,
        "after a jump back"
    );
    assert_eq!(B::count(&e, "SELECT count(*) FROM done"), 3);
    let page = e.read(&Query::new("app").types(["tick"])).unwrap();
    assert!(
        page[2].recorded_at < page[1].recorded_at,
        "recorded_at follows the clock"
    );
    assert!(page[2].seq > page[1].seq, "seq keeps the order");
}

fn clock_now(clock: &ManualClock) -> i64 {
    reflexr::Clock::now_ms(clock)
}
