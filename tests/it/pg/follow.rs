//! Followers from an edge's SQLite file into a hub on PostgreSQL (feature
//! `postgres`): the same ids, exactly once (invariant 3), in the source's
//! order; a hub out of reach delays the relay without stopping it; a type
//! the hub does not accept stops the follower at its cursor until an
//! operator restarts it. `bash .ci/run` runs them against a throwaway
//! server (`tests/pg/cluster.sh`).
#![cfg(feature = "postgres")]

use reflexr_testkit as common;

use std::time::Duration;

use common::Scene;
use common::backend::PgSchema;
use reflexr::{Engine, Follow, NewEvent, Postgres, Query};

const TYPES: &[&str] = &["reading.taken", "alarm.raised"];

fn reading(n: usize) -> NewEvent {
    NewEvent::new(
        "reading.taken",
        format!("sensor/{}", n % 3),
        "edge-7",
        1_000,
    )
    .payload(&serde_json::json!({ "n": n }))
}

fn hub(place: &PgSchema) -> Engine<Postgres> {
    let hub = Engine::open_postgres(&place.config()).expect("open the hub");
    hub.ensure_workspace("fleet", TYPES).unwrap();
    hub
}

fn hub_ids(hub: &Engine<Postgres>) -> Vec<String> {
    hub.read(&Query::new("fleet").limit(10_000))
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// Invariant 3: the hub appends each id once, in the source's order, a replay
/// included.
#[test]
fn an_edge_relays_into_a_hub_on_postgres_once_by_id_in_order() {
    let place = PgSchema::new();
    let hub = hub(&place);
    let s = Scene::new();
    let edge = s.open("edge-7");
    edge.ensure_workspace("devices", TYPES).unwrap();
    edge.register_postgres_target("hub", &place.config())
        .unwrap();
    let name = edge
        .follow(Follow::new("devices", "fleet").to_postgres("hub"))
        .unwrap();

    let mut appended = Vec::new();
    for n in 0..1_200 {
        appended.push(edge.append("devices", &reading(n)).unwrap().id);
    }
    edge.run_until_idle().unwrap();
    assert_eq!(
        hub_ids(&hub),
        appended,
        "the same ids, in the source's order"
    );

    // An operator sends the follower back to the start: everything is
    // published again, and the hub appends nothing twice.
    edge.operator("ops", "replay to the hub")
        .unwrap()
        .reset_cursor("devices", reflexr::ConsumerKind::Follower, &name, 0)
        .unwrap();
    let head = hub.head_seq().unwrap();
    edge.run_until_idle().unwrap();
    assert_eq!(
        hub.head_seq().unwrap(),
        head,
        "no seq taken for a re-publish"
    );
    assert_eq!(hub_ids(&hub), appended);

    let info = &edge.followers().unwrap()[0];
    assert_eq!(info.target_postgres.as_deref(), Some("hub"));
    assert_eq!(info.lag, 0);
    assert_eq!(info.published, 2_400);
}

/// Invariant 10: a follower to a target this process has not registered, or a
/// config that does not parse, is a typed error.
#[test]
fn a_follower_to_an_unregistered_target_is_refused() {
    let s = Scene::new();
    let edge = s.open("edge-7");
    edge.ensure_workspace("devices", TYPES).unwrap();
    let e = edge
        .follow(Follow::new("devices", "fleet").to_postgres("nowhere"))
        .unwrap_err();
    assert!(matches!(e, reflexr::Error::NotFound { .. }), "{e}");
    let e = edge
        .register_postgres_target("hub", "host=127.0.0.1 port=notaport")
        .unwrap_err();
    assert!(matches!(e, reflexr::Error::Invalid { .. }), "{e}");
}

/// Invariant 8 and 3: while the hub is out of reach the cursor waits (no
/// envelope is skipped); the relay goes on by itself, driven by the manual
/// clock past the retry delay.
#[test]
fn a_hub_out_of_reach_delays_the_relay_and_never_stops_it() {
    let place = PgSchema::new();
    let hub = hub(&place);
    let s = Scene::new();
    let edge = s.open("edge-7");
    edge.ensure_workspace("devices", TYPES).unwrap();
    // A port nothing listens on: the hub is out of reach.
    let unreachable = "host=127.0.0.1 port=1 user=reflexr dbname=reflexr_test connect_timeout=2";
    edge.register_postgres_target("hub", unreachable).unwrap();
    edge.follow(Follow::new("devices", "fleet").to_postgres("hub"))
        .unwrap();
    let id = edge.append("devices", &reading(1)).unwrap().id;
    edge.run_until_idle().unwrap();
    let info = &edge.followers().unwrap()[0];
    assert_eq!((info.cursor, info.lag), (0, 1), "the cursor waits");
    assert!(!info.stopped_here, "out of reach is not a stop");

    // The network comes back (here: the right address), and after the
    // retry delay the relay goes on by itself.
    edge.register_postgres_target("hub", &place.config())
        .unwrap();
    s.clock.advance(Duration::from_secs(11));
    edge.run_until_idle().unwrap();
    assert_eq!(hub_ids(&hub), [id]);
    assert_eq!(edge.followers().unwrap()[0].lag, 0);
}

/// Invariant 3 and 8: a configuration error stops the follower at its cursor;
/// after the operator's restart the refused envelope is relayed, not skipped.
#[test]
fn a_type_the_hub_does_not_accept_stops_the_follower_until_restarted() {
    let place = PgSchema::new();
    let hub = Engine::open_postgres(&place.config()).unwrap();
    hub.ensure_workspace("fleet", &["reading.taken"]).unwrap();
    let s = Scene::new();
    let edge = s.open("edge-7");
    edge.ensure_workspace("devices", TYPES).unwrap();
    edge.register_postgres_target("hub", &place.config())
        .unwrap();
    edge.follow(Follow::new("devices", "fleet").to_postgres("hub"))
        .unwrap();
    let first = edge.append("devices", &reading(1)).unwrap().id;
    let alarm = edge
        .append(
            "devices",
            &NewEvent::new("alarm.raised", "sensor/1", "edge-7", 1_000),
        )
        .unwrap()
        .id;
    edge.run_until_idle().unwrap();
    let info = &edge.followers().unwrap()[0];
    assert!(info.stopped_here, "a configuration error stops it");
    assert_eq!(info.stops, 1);
    assert!(
        info.last_error
            .as_deref()
            .unwrap_or("")
            .contains("alarm.raised"),
        "{:?}",
        info.last_error
    );
    // What came before the refused type was published, and the cursor
    // stands just past it: the alarm is relayed, not skipped, later.
    assert_eq!(info.cursor, 1);
    assert_eq!(hub_ids(&hub), std::slice::from_ref(&first));

    hub.register_types("fleet", &["alarm.raised"]).unwrap();
    edge.operator("ops", "the hub accepts alarms now")
        .unwrap()
        .restart_follower(&info.name)
        .unwrap();
    edge.run_until_idle().unwrap();
    assert_eq!(hub_ids(&hub), [first, alarm]);
    assert!(!edge.followers().unwrap()[0].stopped_here);
}
