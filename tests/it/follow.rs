//! Followers bridge one workspace into another with the same ids, following
//! ADR-0015 point by point (DESIGN.md invariants 3, 7, 8). Each test runs
//! on every backend (`on_backends!`): the hub is a second SQLite file, or a
//! second schema on the PostgreSQL server, registered as a target.

use reflexr_testkit as common;

use std::collections::HashMap;
use std::time::Duration;

use common::backend::{Opts, TestBackend, child, parent_engine};
use common::{children_on_backends, later, on_backends};
use reflexr::inspect::{FollowerInfo, same_event};
use reflexr::{ConsumerKind, Engine, Follow, ManualClock, NewEvent, Query};

on_backends!(
    a_follower_publishes_what_its_projection_selects_with_the_same_ids,
    a_follower_relays_an_edge_database_into_a_hub,
    a_follower_killed_between_publish_and_cursor_save_publishes_no_duplicate,
    kills_at_any_moment_publish_nothing_twice_and_a_restart_rereads_at_most_a_batch,
    two_followers_of_one_source_one_relays_and_the_other_takes_over_when_its_lease_lapses,
    a_type_the_target_does_not_accept_stops_the_follower_until_the_configuration_is_fixed,
    the_same_projection_bridges_the_applications_events_and_skips_the_engines_own,
    bad_envelopes_are_dead_lettered_once_per_seq_and_the_follower_moves_on,
    the_cursor_is_saved_at_least_every_500_envelopes_that_bridge_nothing,
    the_ledger_lists_followers_and_an_engine_resumes_every_one_at_start,
);

children_on_backends!(child_process_relays, child_process_bridges_nothing);

/// The types of `edge`, the workspace followed in every test.
const EDGE: &[&str] = &["reading", "debug", "alarm"];

/// `fleet`, where the readings go, in the hub or beside `edge`.
const FLEET: &[&str] = &["reading"];

const START_MS: i64 = 1_800_000_000_000;

/// A hub in another database of the backend: a follower's target there.
trait Hub: TestBackend {
    /// `follow` pointed at the hub at `hub` (registered with `e` first, if
    /// the backend's targets are registered by name).
    fn to(e: &Engine<Self>, hub: &Self::Place, follow: Follow) -> Follow;
    /// What a process does again at every start for a follower into the hub
    /// at `hub` (a locator): registers its PostgreSQL target (the ledger
    /// keeps only its name); nothing for a file, whose path is in the ledger.
    fn again(e: &Engine<Self>, hub: &str);
    /// Where a follower's ledger row says it publishes: the hub's locator.
    fn target(f: &FollowerInfo) -> Option<String>;
}

impl Hub for reflexr::Sqlite {
    fn to(_: &Engine, hub: &common::Scene, follow: Follow) -> Follow {
        follow.to_file(Self::locator(hub))
    }
    fn again(_: &Engine, _: &str) {}
    fn target(f: &FollowerInfo) -> Option<String> {
        f.target_file.clone()
    }
}

#[cfg(feature = "postgres")]
impl Hub for reflexr::Postgres {
    fn to(e: &Engine<Self>, hub: &common::backend::PgSchema, follow: Follow) -> Follow {
        Self::again(e, &hub.config());
        follow.to_postgres("hub")
    }
    fn again(e: &Engine<Self>, hub: &str) {
        e.register_postgres_target("hub", hub).unwrap();
    }
    fn target(f: &FollowerInfo) -> Option<String> {
        f.target_postgres.clone()
    }
}

/// An engine on `place` with the workspaces of `list`.
fn open<B: TestBackend>(
    place: &B::Place,
    clock: &ManualClock,
    holder: &str,
    list: &[(&str, &[&str])],
) -> Engine<B> {
    let e = B::open(place, clock, holder);
    for (name, types) in list {
        e.ensure_workspace(name, types).unwrap();
    }
    e
}

/// A hub: its own database, with `fleet`.
fn hub<B: TestBackend>(clock: &ManualClock) -> (B::Place, Engine<B>) {
    let place = B::place();
    let h = open(&place, clock, "hub", &[("fleet", FLEET)]);
    (place, h)
}

/// Follows `edge` into `fleet` in the hub, with the `readings` projection.
fn to_hub<B: Hub>(e: &Engine<B>, hub: &B::Place) -> Follow {
    B::to(e, hub, Follow::new("edge", "fleet").projection("readings"))
}

fn readings_only<B: TestBackend>(e: &Engine<B>) {
    e.register_projection("readings", |ev| {
        Ok((ev.event_type == "reading").then(|| same_event(ev)))
    })
    .unwrap();
}

fn append<B: TestBackend>(e: &Engine<B>, kind: &str, n: usize) -> Vec<String> {
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

fn ids<B: TestBackend>(e: &Engine<B>, workspace: &str) -> Vec<String> {
    e.read(&Query::new(workspace).limit(10_000))
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// ADR-0015: the projection selects; what it selects arrives under the
/// source's ids (invariant 3).
fn a_follower_publishes_what_its_projection_selects_with_the_same_ids<B: TestBackend>() {
    let (place, clock) = (B::place(), ManualClock::new(START_MS));
    let e = open::<B>(&place, &clock, "test", &[("edge", EDGE), ("fleet", FLEET)]);
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
    let f = &e.followers().unwrap()[0];
    assert_eq!((f.published, f.cursor, f.lag), (6, 15, 0));
}

/// Invariant 3 across databases: an edge's workspace relayed into a hub's,
/// the same ids in the same order; the ledger names the hub.
fn a_follower_relays_an_edge_database_into_a_hub<B: Hub>() {
    let clock = ManualClock::new(START_MS);
    let (hub_place, h) = hub::<B>(&clock);
    let place = B::place();
    let e = open::<B>(&place, &clock, "edge", &[("edge", EDGE)]);
    readings_only(&e);
    e.follow(to_hub(&e, &hub_place).name("edge-to-hub"))
        .unwrap();
    let want = append(&e, "reading", 250);
    append(&e, "debug", 10);
    e.run_until_idle().unwrap();
    assert_eq!(ids(&h, "fleet"), want);
    let f = &e.followers().unwrap()[0];
    let named = B::target(f).unwrap();
    assert!(
        named == B::locator(&hub_place) || named == "hub",
        "the ledger names the hub: {f:?}"
    );
    assert_eq!(f.cursor, 260);
}

/// Exactly once comes from ids (invariant 3): the state a crash between the
/// target's commit and the source's cursor save leaves — published, cursor
/// behind — is read again, and nothing is published twice.
fn a_follower_killed_between_publish_and_cursor_save_publishes_no_duplicate<B: Hub>() {
    let clock = ManualClock::new(START_MS);
    let (hub_place, h) = hub::<B>(&clock);
    let place = B::place();
    let e = open::<B>(&place, &clock, "edge", &[("edge", EDGE)]);
    readings_only(&e);
    e.follow(to_hub(&e, &hub_place)).unwrap();
    let want = append(&e, "reading", 30);
    // The crash's leftovers: the first 20 published, the cursor still at 0.
    for ev in e.read(&Query::new("edge").limit(20)).unwrap() {
        h.append("fleet", &same_event(&ev).id(ev.id.clone()))
            .unwrap();
    }
    assert_eq!(e.followers().unwrap()[0].cursor, 0);
    e.run_until_idle().unwrap();
    assert_eq!(ids(&h, "fleet"), want, "each once, in order");
}

/// The child's side of the kill test: relays slowly into the hub (its
/// locator in `REFLEXR_HUB`) until killed.
fn child_process_relays<B: Hub>() {
    let hours: i64 = std::env::var("REFLEXR_HOURS").unwrap().parse().unwrap();
    let e = parent_engine::<B>(&Opts::new(&later(hours), &format!("child-{hours}")));
    B::again(&e, &std::env::var("REFLEXR_HUB").expect("REFLEXR_HUB"));
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

/// Invariants 3 and 8 across SIGKILLs: children relaying are killed at
/// varying moments; the hub ends with each reading once, in order, and a
/// kill costs at most one page of envelopes read again.
fn kills_at_any_moment_publish_nothing_twice_and_a_restart_rereads_at_most_a_batch<B: Hub>() {
    let clock = ManualClock::new(START_MS);
    let (hub_place, h) = hub::<B>(&clock);
    let place = B::place();
    let want = {
        let e = open::<B>(&place, &clock, "setup", &[("edge", EDGE)]);
        e.follow(to_hub(&e, &hub_place)).unwrap();
        let mut want = Vec::new();
        for _ in 0..8 {
            want.extend(append(&e, "reading", 60));
            append(&e, "debug", 40);
        }
        want
    };
    let hub_locator = B::locator(&hub_place);
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut kills = 0;
    for i in 0..10u64 {
        let mut child = child::<B>(
            &place,
            "child_process_relays",
            &[
                ("REFLEXR_HOURS", (i + 1).to_string()),
                ("REFLEXR_HUB", hub_locator.clone()),
            ],
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
    let e = B::open(&place, &later(1_000), "finisher");
    B::again(&e, &hub_locator);
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
        reread <= kills * reflexr::limits::SKIP_SAVE_EVERY,
        "{reread} envelopes read again after {kills} kills"
    );
}

/// ADR-0015 and invariant 7: one process at a time follows a workspace (its
/// lease); a workspace whose follower died is followed again once the lease
/// lapses.
fn two_followers_of_one_source_one_relays_and_the_other_takes_over_when_its_lease_lapses<
    B: TestBackend,
>() {
    let (place, clock) = (B::place(), ManualClock::new(START_MS));
    let a = open::<B>(
        &place,
        &clock,
        "proc-a",
        &[("edge", EDGE), ("fleet", FLEET)],
    );
    let b = open::<B>(&place, &clock, "proc-b", &[("edge", EDGE)]);
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
    clock.advance(Duration::from_secs(10));
    assert_eq!(b.run_until_idle().unwrap().followed, 0, "not lapsed yet");
    clock.advance(Duration::from_secs(21));
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

/// ADR-0015: NotFound is the application's configuration, not the
/// envelope's fault: stop (logged and counted), and the envelopes after it
/// wait; once fixed, they all arrive (invariant 8: the cursor never skips).
fn a_type_the_target_does_not_accept_stops_the_follower_until_the_configuration_is_fixed<
    B: TestBackend,
>() {
    let (place, clock) = (B::place(), ManualClock::new(START_MS));
    let e = open::<B>(&place, &clock, "test", &[("edge", EDGE), ("fleet", FLEET)]);
    e.follow(Follow::new("edge", "fleet")).unwrap(); // "same": every envelope
    let mut want = append(&e, "reading", 3);
    want.extend(append(&e, "alarm", 1));
    want.extend(append(&e, "reading", 3));
    e.run_until_idle().unwrap();
    assert_eq!(ids(&e, "fleet"), want[..3], "relayed up to the alarm");
    let f = &e.followers().unwrap()[0];
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
    let ops = B::open(&place, &clock, "ops");
    for _ in 0..2 {
        ops.operator("ops", "try again")
            .unwrap()
            .restart_follower("edge-to-fleet")
            .unwrap();
        e.run_until_idle().unwrap();
    }
    let cursor = |e: &Engine<B>| {
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
    assert_eq!(e.followers().unwrap()[0].stops, 3);

    e.register_types("fleet", &["alarm"]).unwrap();
    ops.operator("ops", "fixed")
        .unwrap()
        .restart_follower("edge-to-fleet")
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(ids(&e, "fleet"), want, "then all arrive, in order");
    assert!(!e.followers().unwrap()[0].stopped_here);
    assert_eq!(cursor(&e).failures, 0, "moving on clears the failures");
    assert!(
        ops.operator("ops", "typo")
            .unwrap()
            .restart_follower("nobody")
            .unwrap_err()
            .is_not_found()
    );
}

/// ADR-0015 with reflexr's reserved types: no workspace takes RuleFired or
/// RuleErrored from anyone, so "same" bridges nothing for them (not a dead
/// letter apiece).
fn the_same_projection_bridges_the_applications_events_and_skips_the_engines_own<B: TestBackend>() {
    let (place, clock) = (B::place(), ManualClock::new(START_MS));
    let e = open::<B>(&place, &clock, "test", &[("edge", EDGE), ("fleet", EDGE)]);
    e.register_action("noop", |_, _| Ok(())).unwrap();
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
    let f = &e.followers().unwrap()[0];
    assert_eq!((f.lag, f.dead_letters, f.stops), (0, 0, 0));
}

/// ADR-0015: a projection that errors or panics, an invalid event, or one of
/// reflexr's own types: dead letter, once per seq, and move on.
fn bad_envelopes_are_dead_lettered_once_per_seq_and_the_follower_moves_on<B: TestBackend>() {
    let (place, clock) = (B::place(), ManualClock::new(START_MS));
    let e = open::<B>(&place, &clock, "test", &[("edge", EDGE), ("fleet", FLEET)]);
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
        .unwrap()
        .reset_cursor("edge", ConsumerKind::Follower, &name, 0)
        .unwrap();
    e.run_until_idle().unwrap();
    assert_eq!(e.dead_letters(false, 10).unwrap().len(), 4);
    assert_eq!(ids(&e, "fleet").len(), 2);
    let f = &e.followers().unwrap()[0];
    assert_eq!(
        (f.dead_letters, f.stops),
        (4, 0),
        "counters readable through the API"
    );
}

/// The child's side of the save-policy test: reads envelopes that bridge
/// nothing, slowly, printing each seq, until killed.
fn child_process_bridges_nothing<B: TestBackend>() {
    let e = parent_engine::<B>(&Opts::new(&ManualClock::starting_now(), "child"));
    e.register_projection("nothing", |ev| {
        println!("\nsaw {}", ev.seq);
        std::thread::sleep(Duration::from_micros(100));
        Ok(None)
    })
    .unwrap();
    e.run_until_idle().unwrap();
}

/// ADR-0015 and invariant 8: the cursor is saved at least every 500
/// envelopes, so a restart reads at most 500 again. A child reading
/// envelopes that bridge nothing is killed once it has read 800; its saved
/// cursor is within 500 of what it read.
fn the_cursor_is_saved_at_least_every_500_envelopes_that_bridge_nothing<B: TestBackend>() {
    let (place, clock) = (B::place(), ManualClock::starting_now());
    {
        let e = open::<B>(&place, &clock, "setup", &[("edge", EDGE), ("fleet", FLEET)]);
        e.follow(Follow::new("edge", "fleet").projection("nothing"))
            .unwrap();
        append(&e, "debug", 2_000);
    }
    let mut child = child::<B>(&place, "child_process_bridges_nothing", &[]);
    let read = child
        .until(|l| {
            let seq = l.strip_prefix("saw ")?.parse::<i64>().unwrap();
            (seq >= 800).then_some(seq)
        })
        .expect("the child read 800 envelopes");
    child.kill();
    let e = B::open(&place, &clock, "after");
    let cursor = e.followers().unwrap()[0].cursor;
    assert!(
        read - cursor <= reflexr::limits::SKIP_SAVE_EVERY as i64 && cursor <= read,
        "read {read}, cursor saved at {cursor}"
    );
}

/// ADR-0015: the ledger in the database lists the followers; a new process
/// that registers its projections (and targets) resumes every one at start.
fn the_ledger_lists_followers_and_an_engine_resumes_every_one_at_start<B: Hub>() {
    let clock = ManualClock::starting_now();
    let (hub_place, h) = hub::<B>(&clock);
    let place = B::place();
    {
        let e = open::<B>(
            &place,
            &clock,
            "first-run",
            &[("edge", EDGE), ("local", &["reading"])],
        );
        e.follow(to_hub(&e, &hub_place)).unwrap();
        e.follow(Follow::new("edge", "local").projection("readings"))
            .unwrap();
    }
    // A new process: it registers its projections (and its PostgreSQL
    // targets) and starts; the ledger tells it what to follow.
    let e = B::open(&place, &clock, "second-run");
    readings_only(&e);
    let listed = e.followers().unwrap();
    assert_eq!(listed.len(), 2);
    B::again(&e, &B::locator(&hub_place));
    let want = append(&e, "reading", 4);
    e.start().unwrap();
    wait_for(&h, "fleet", 4);
    wait_for(&e, "local", 4);
    e.shutdown();
    assert_eq!(ids(&h, "fleet"), want);
    assert_eq!(ids(&e, "local"), want);
}

/// Waits (woken by commits, not by time) until `workspace` holds `n` events.
fn wait_for<B: TestBackend>(e: &Engine<B>, workspace: &str, n: usize) {
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

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use reflexr::{Follow, Query};
    use reflexr_testkit as common;
    use std::time::Duration;

    on_backends!(a_follower_bridges_a_workspace_into_another_once_by_ids,);

    /// Followers: a workspace bridged into another of the same database with
    /// the same ids, exactly once (invariant 3), across a second engine taking
    /// over; a projection that fails dead-letters its envelope and the
    /// follower moves on; an operator's restart and unfollow are on the record.
    fn a_follower_bridges_a_workspace_into_another_once_by_ids<B: TestBackend>() {
        let (place, clock, e) = setup::<B>();
        e.ensure_workspace("mirror", TYPES).unwrap();
        e.register_projection("picky", |ev: &reflexr::Event| {
            if ev.subject == "thing/bad" {
                return Err("cannot project it".into());
            }
            Ok(Some(reflexr::inspect::same_event(ev)))
        })
        .unwrap();
        let name = e
            .follow(Follow::new("app", "mirror").projection("picky"))
            .unwrap();
        for id in ["a", "bad", "b"] {
            e.append("app", &made(id)).unwrap();
        }
        assert_eq!(e.run_until_idle().unwrap().followed, 3);
        let mirrored = e.read(&Query::new("mirror")).unwrap();
        let source = e.read(&Query::new("app")).unwrap();
        let ids = |v: &[reflexr::Event]| v.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&mirrored), [source[0].id.clone(), source[2].id.clone()]);
        let letters = e.dead_letters(false, 10).unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].reason.as_str(), "projection_error");
        // Another engine with the projection takes over once the lease lapses,
        // from the cursor: nothing twice.
        e.append("app", &made("c")).unwrap();
        let other = B::open(&place, &clock, "other");
        other
            .register_projection("picky", |ev: &reflexr::Event| {
                Ok(Some(reflexr::inspect::same_event(ev)))
            })
            .unwrap();
        clock.advance(Duration::from_secs(31));
        assert_eq!(other.run_until_idle().unwrap().followed, 1);
        assert_eq!(e.read(&Query::new("mirror")).unwrap().len(), 3);
        let info = &other.followers().unwrap()[0];
        assert_eq!((info.published, info.dead_letters, info.lag), (3, 1, 0));
        let ops = other.operator("ops", "done with it").unwrap();
        ops.restart_follower(&name).unwrap();
        ops.unfollow(&name).unwrap();
        assert!(other.followers().unwrap().is_empty());
        assert!(ops.unfollow(&name).unwrap_err().is_not_found());
    }
}
