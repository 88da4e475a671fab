//! Followers bridge one workspace into another with the same ids, following
//! ADR-0015 point by point (DESIGN.md invariants 3, 7, 8).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Arrange, Scene, is_child, later, parent_file};
use reflexr::{ConsumerKind, Engine, Follow, NewEvent, Query, same_event};

/// The types of `edge`, the workspace followed in every test.
const EDGE: &[&str] = &["reading", "debug", "alarm"];

/// `fleet`, where the readings go, in the hub file or beside `edge`.
const FLEET: &[&str] = &["reading"];

/// `edge` and, in the same file, `fleet`.
const EDGE_AND_FLEET: &[(&str, &[&str])] = &[("edge", EDGE), ("fleet", FLEET)];

/// The hub's file, beside the edge's.
const HUB: &str = "hub.db";

/// Follows `edge` into `fleet` in the scene's hub file, with the `readings`
/// projection.
fn to_hub(s: &Scene) -> Follow {
    Follow::new("edge", "fleet")
        .to_file(s.file(HUB))
        .projection("readings")
}

fn readings_only(e: &Engine) {
    e.register_projection("readings", |ev| {
        Ok((ev.event_type == "reading").then(|| same_event(ev)))
    })
    .unwrap();
}

fn append(e: &Engine, kind: &str, n: usize) -> Vec<String> {
    e.write(|tx| {
        let mut ids = Vec::new();
        for i in 0..n {
            let ev = NewEvent::new(kind, format!("sensor/{i}"), "edge", i as i64)
                .payload(&serde_json::json!({ "i": i }));
            ids.push(tx.append("edge", &ev)?.id);
        }
        Ok(ids)
    })
    .unwrap()
}

fn ids(e: &Engine, workspace: &str) -> Vec<String> {
    e.read(&Query::new(workspace).limit(10_000))
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

#[test]
fn a_follower_publishes_what_its_projection_selects_with_the_same_ids() {
    let s = Scene::new();
    let e = s.open("test").each_workspace(EDGE_AND_FLEET);
    readings_only(&e);
    e.follow(Follow::new("edge", "fleet").projection("readings"))
        .unwrap();
    let mut want = Vec::new();
    for _ in 0..3 {
        want.extend(append(&e, "reading", 2));
        append(&e, "debug", 3);
    }
    e.run_until_idle().unwrap();
    assert_eq!(ids(&e, "fleet"), want);
    let f = &e.followed().unwrap()[0];
    assert_eq!((f.published, f.cursor, f.lag), (6, 15, 0));
}

#[test]
fn a_follower_relays_an_edge_file_into_a_hub_file() {
    let s = Scene::new();
    let hub_path = s.file(HUB);
    let h = s.open_at(&hub_path, "hub").workspace("fleet", FLEET);
    let e = s.open("edge").workspace("edge", EDGE);
    readings_only(&e);
    e.follow(to_hub(&s).name("edge-to-hub")).unwrap();
    let want = append(&e, "reading", 250);
    append(&e, "debug", 10);
    e.run_until_idle().unwrap();
    assert_eq!(ids(&h, "fleet"), want);
    let f = &e.followed().unwrap()[0];
    assert_eq!(f.target_file.as_deref(), Some(hub_path.to_str().unwrap()));
    assert_eq!(f.cursor, 260);
}

#[test]
fn a_follower_killed_between_publish_and_cursor_save_publishes_no_duplicate() {
    // Exactly once comes from ids: the state a crash between the target's
    // commit and the source's cursor save leaves — published, cursor behind —
    // is read again, and nothing is published twice.
    let s = Scene::new();
    let h = s.open_at(&s.file(HUB), "hub").workspace("fleet", FLEET);
    let e = s.open("edge").workspace("edge", EDGE);
    readings_only(&e);
    e.follow(to_hub(&s)).unwrap();
    let want = append(&e, "reading", 30);
    // The crash's leftovers: the first 20 published, the cursor still at 0.
    for ev in e.read(&Query::new("edge").limit(20)).unwrap() {
        h.append("fleet", &same_event(&ev).id(ev.id.clone()))
            .unwrap();
    }
    assert_eq!(e.followed().unwrap()[0].cursor, 0);
    e.run_until_idle().unwrap();
    assert_eq!(ids(&h, "fleet"), want, "each once, in order");
}

/// The child's side of the kill test: relays slowly until killed.
#[test]
fn child_process_relays() {
    if !is_child() {
        return; // Only a child started by the kill test does this work.
    }
    let hours: i64 = std::env::var("REFLEXR_HOURS").unwrap().parse().unwrap();
    let e = Engine::builder(parent_file())
        .clock(later(hours))
        .holder_id(format!("child-{hours}"))
        .busy_timeout(Duration::from_secs(20))
        .open()
        .unwrap();
    e.register_projection("readings", |ev| {
        println!("\nsaw {}", ev.seq);
        std::thread::sleep(Duration::from_micros(200));
        Ok((ev.event_type == "reading").then(|| same_event(ev)))
    })
    .unwrap();
    println!("\nrelaying");
    e.run_until_idle().unwrap();
    println!("\ndone");
}

#[test]
fn kills_at_any_moment_publish_nothing_twice_and_a_restart_rereads_at_most_a_batch() {
    let s = Scene::new();
    let h = s.open_at(&s.file(HUB), "hub").workspace("fleet", FLEET);
    let want = {
        let e = s.open("setup").workspace("edge", EDGE);
        e.follow(to_hub(&s)).unwrap();
        let mut want = Vec::new();
        for _ in 0..8 {
            want.extend(append(&e, "reading", 60));
            append(&e, "debug", 40);
        }
        want
    };
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut kills = 0;
    for i in 0..10u64 {
        let mut child = s.child(
            "child_process_relays",
            &[("REFLEXR_HOURS", (i + 1).to_string())],
        );
        child.past("relaying");
        std::thread::sleep(Duration::from_millis(5 + (i * 13) % 40));
        let ended = child.kill();
        let (done, out) = (ended.success, ended.rest);
        for l in &out {
            if let Some(seq) = l.strip_prefix("saw ") {
                *seen.entry(seq.parse().unwrap()).or_default() += 1;
            }
        }
        if done && out.iter().any(|l| l.ends_with("done")) {
            break;
        }
        kills += 1;
    }
    // A last relay, later than every child, finishes.
    let e = s.builder("finisher").clock(later(1_000)).open().unwrap();
    readings_only(&e);
    e.run_until_idle().unwrap();

    assert!(kills > 0);
    assert_eq!(
        ids(&h, "fleet"),
        want,
        "each reading once, in order ({kills} kills)"
    );
    // Re-reads: every seq read more than once was read again after a kill,
    // and a kill costs at most one page of envelopes read again.
    let reread = seen.values().filter(|n| **n > 1).count();
    assert!(
        reread <= kills * reflexr::SKIP_SAVE_EVERY,
        "{reread} envelopes read again after {kills} kills"
    );
}

#[test]
fn two_followers_of_one_source_one_relays_and_the_other_takes_over_when_its_lease_lapses() {
    // ADR-0015: one process at a time follows a workspace (its lease); a
    // workspace whose follower died is followed again once the lease lapses.
    let s = Scene::new();
    let a = s.open("proc-a").each_workspace(EDGE_AND_FLEET);
    let b = s.open("proc-b").workspace("edge", EDGE);
    for e in [&a, &b] {
        readings_only(e);
    }
    a.follow(Follow::new("edge", "fleet").projection("readings"))
        .unwrap();
    append(&a, "reading", 5);
    assert_eq!(a.run_until_idle().unwrap().followed, 5);
    append(&a, "reading", 5);
    assert_eq!(b.run_until_idle().unwrap().followed, 0, "a holds the lease");
    assert_eq!(a.run_until_idle().unwrap().followed, 5);
    // a dies; b tries again every third of the lease, and takes over once it
    // lapsed.
    append(&a, "reading", 5);
    s.clock.advance(Duration::from_secs(10));
    assert_eq!(b.run_until_idle().unwrap().followed, 0, "not lapsed yet");
    s.clock.advance(Duration::from_secs(21));
    assert_eq!(b.run_until_idle().unwrap().followed, 5);
    let lease = b
        .leases()
        .unwrap()
        .into_iter()
        .find(|l| l.name.starts_with("follower/"))
        .unwrap();
    assert_eq!((lease.holder.as_str(), lease.generation), ("proc-b", 2));
    assert_eq!(ids(&a, "fleet").len(), 15);
}

#[test]
fn a_type_the_target_does_not_accept_stops_the_follower_until_the_configuration_is_fixed() {
    // ADR-0015: NotFound is the application's configuration, not the
    // envelope's fault: stop (logged and counted), and the envelopes after
    // it wait; once fixed, they all arrive.
    let s = Scene::new();
    let e = s.open("test").each_workspace(EDGE_AND_FLEET);
    e.follow(Follow::new("edge", "fleet")).unwrap(); // "same": every envelope
    let mut want = append(&e, "reading", 3);
    want.extend(append(&e, "alarm", 1));
    want.extend(append(&e, "reading", 3));
    e.run_until_idle().unwrap();
    assert_eq!(ids(&e, "fleet"), want[..3], "relayed up to the alarm");
    let f = &e.followed().unwrap()[0];
    assert_eq!((f.stops, f.cursor, f.stopped_here), (1, 3, true));
    assert!(f.last_error.as_deref().unwrap().contains("alarm"), "{f:?}");
    assert!(
        e.dead_letters(false, 10).unwrap().is_empty(),
        "not dead-lettered"
    );
    // Still stopped: nothing moves until it is restarted.
    e.run_until_idle().unwrap();
    assert_eq!(ids(&e, "fleet").len(), 3);

    // Restarted by an operator in another process (the CLI, say) before the
    // configuration is mended: it stops again at the same envelope, and
    // after the third time it shows as stuck, with the reason.
    let ops = s.open("ops");
    for _ in 0..2 {
        ops.operator("ops", "try again")
            .restart_follower("edge-to-fleet")
            .unwrap();
        e.run_until_idle().unwrap();
    }
    let cursor = |e: &Engine| {
        e.cursors()
            .unwrap()
            .into_iter()
            .find(|c| c.kind == ConsumerKind::Follower)
            .unwrap()
    };
    let stuck = cursor(&ops);
    assert!(stuck.is_stuck(), "{stuck:?}");
    assert_eq!((stuck.position, stuck.failures), (3, 3));
    assert!(stuck.last_error.as_deref().unwrap().contains("alarm"));
    assert_eq!(e.followed().unwrap()[0].stops, 3);

    e.register_types("fleet", &["alarm"]).unwrap();
    ops.operator("ops", "fixed")
        .restart_follower("edge-to-fleet")
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(ids(&e, "fleet"), want, "then all arrive, in order");
    assert!(!e.followed().unwrap()[0].stopped_here);
    assert_eq!(cursor(&e).failures, 0, "moving on clears the failures");
    assert!(
        ops.operator("ops", "typo")
            .restart_follower("nobody")
            .unwrap_err()
            .is_not_found()
    );
}

#[test]
fn the_same_projection_bridges_the_applications_events_and_skips_the_engines_own() {
    // ADR-0015 with reflexr's reserved types: no workspace takes RuleFired
    // or RuleErrored from anyone, so "same" bridges nothing for them (not a
    // dead letter apiece).
    let s = Scene::new();
    let e = s
        .open("test")
        .workspace("edge", EDGE)
        .workspace("fleet", EDGE)
        .noop("noop");
    e.register_rule(
        reflexr::Rule::new("every-reading", "edge")
            .on(["reading"])
            .action("noop")
            .decide(|ev| {
                if ev.subject == "sensor/1" {
                    return Err("sensor 1 is broken".into());
                }
                Ok(reflexr::Decision::fire(&serde_json::json!({})))
            }),
    )
    .unwrap();
    e.follow(Follow::new("edge", "fleet")).unwrap();
    let want = append(&e, "reading", 3);
    e.run_until_idle().unwrap();
    assert_eq!(
        e.read(&Query::new("edge").types(["RuleFired", "RuleErrored"]))
            .unwrap()
            .len(),
        3
    );
    assert_eq!(ids(&e, "fleet"), want);
    let dead: Vec<_> = e
        .dead_letters(false, 10)
        .unwrap()
        .into_iter()
        .filter(|d| d.kind.as_str() == "follower")
        .collect();
    assert!(dead.is_empty(), "{dead:?}");
    let f = &e.followed().unwrap()[0];
    assert_eq!((f.lag, f.dead_letters, f.stops), (0, 0, 0));
}

#[test]
fn bad_envelopes_are_dead_lettered_once_per_seq_and_the_follower_moves_on() {
    // ADR-0015: a projection that errors or panics, an invalid event, or one
    // of reflexr's own types: dead letter, once per seq, and move on.
    let s = Scene::new();
    let e = s.open("test").each_workspace(EDGE_AND_FLEET);
    e.register_projection("picky", |ev| {
        let p: serde_json::Value = ev.payload()?;
        Ok(Some(match p["i"].as_i64().unwrap() {
            1 => return Err("cannot map reading 1".into()),
            2 => panic!("a bug in the projection"),
            3 => same_event(ev).payload_json("{not json"),
            4 => NewEvent::new("RuleFired", "x", "edge", 0),
            _ => same_event(ev),
        }))
    })
    .unwrap();
    let name = e
        .follow(Follow::new("edge", "fleet").projection("picky"))
        .unwrap();
    append(&e, "reading", 6);
    e.run_until_idle().unwrap();
    assert_eq!(ids(&e, "fleet").len(), 2, "readings 0 and 5");
    let mut reasons: Vec<String> = e
        .dead_letters(false, 10)
        .unwrap()
        .into_iter()
        .map(|d| format!("{}:{}", d.event_seq.unwrap(), d.reason))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "2:projection_error",
            "3:projection_panic",
            "4:invalid_event",
            "5:reserved_type"
        ]
    );
    // Read again from the start: nothing is dead-lettered twice, nothing
    // published twice.
    e.operator("ops", "replay")
        .reset_cursor("edge", ConsumerKind::Follower, &name, 0)
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(e.dead_letters(false, 10).unwrap().len(), 4);
    assert_eq!(ids(&e, "fleet").len(), 2);
    let f = &e.followed().unwrap()[0];
    assert_eq!(
        (f.dead_letters, f.stops),
        (4, 0),
        "counters readable through the API"
    );
}

/// The child's side of the save-policy test: reads envelopes that bridge
/// nothing, slowly, printing each seq, until killed.
#[test]
fn child_process_bridges_nothing() {
    if !is_child() {
        return; // Only a child started by the test below does this work.
    }
    let e = Engine::open(parent_file()).unwrap();
    e.register_projection("nothing", |ev| {
        println!("\nsaw {}", ev.seq);
        std::thread::sleep(Duration::from_micros(100));
        Ok(None)
    })
    .unwrap();
    e.run_until_idle().unwrap();
}

#[test]
fn the_cursor_is_saved_at_least_every_500_envelopes_that_bridge_nothing() {
    // ADR-0015: so a restart reads at most 500 again. A child reading
    // envelopes that bridge nothing is killed once it has read 800; its saved
    // cursor is within 500 of what it read.
    let s = Scene::starting_now();
    {
        let e = s.open("setup").each_workspace(EDGE_AND_FLEET);
        e.follow(Follow::new("edge", "fleet").projection("nothing"))
            .unwrap();
        append(&e, "debug", 2_000);
    }
    let mut child = s.child("child_process_bridges_nothing", &[]);
    let read = child
        .until(|l| {
            let seq = l.strip_prefix("saw ")?.parse::<i64>().unwrap();
            (seq >= 800).then_some(seq)
        })
        .expect("the child read 800 envelopes");
    child.kill();
    let e = Engine::open(&s.path).unwrap();
    let cursor = e.followed().unwrap()[0].cursor;
    assert!(
        read - cursor <= reflexr::SKIP_SAVE_EVERY as i64 && cursor <= read,
        "read {read}, cursor saved at {cursor}"
    );
}

#[test]
fn the_ledger_lists_followers_and_an_engine_resumes_every_one_at_start() {
    let s = Scene::starting_now();
    let h = s.open_at(&s.file(HUB), "hub").workspace("fleet", FLEET);
    {
        let e = s
            .open("first-run")
            .workspace("edge", EDGE)
            .workspace("local", &["reading"]);
        e.follow(to_hub(&s)).unwrap();
        e.follow(Follow::new("edge", "local").projection("readings"))
            .unwrap();
    }
    // A new process: it registers its projections and starts; the ledger
    // tells it what to follow.
    let e = s.open("second-run");
    readings_only(&e);
    let listed: Vec<(String, Option<String>)> = e
        .followed()
        .unwrap()
        .into_iter()
        .map(|f| (f.name, f.target_file))
        .collect();
    assert_eq!(listed.len(), 2);
    let want = append(&e, "reading", 4);
    e.start().unwrap();
    wait_for(&h, "fleet", 4);
    wait_for(&e, "local", 4);
    e.shutdown();
    assert_eq!(ids(&h, "fleet"), want);
    assert_eq!(ids(&e, "local"), want);
}

/// Waits (woken by commits, not by time) until `workspace` holds `n` events.
fn wait_for(e: &Engine, workspace: &str, n: usize) {
    let mut seen = 0;
    let mut after = 0;
    while seen < n {
        let page = e
            .wait_for_events(&Query::new(workspace).after(after), Duration::from_secs(60))
            .unwrap();
        assert!(!page.is_empty(), "{workspace}: only {seen} of {n} arrived");
        seen += page.len();
        after = page.last().unwrap().seq;
    }
}
