//! Writes alone on PostgreSQL (feature `postgres`): a plain
//! `Engine::enqueue`, and an `Engine::append` with no other caller
//! waiting, are each one statement outside any transaction block — its
//! own commit, with the notification that wakes other processes in it.
//! The engine's own reads go outside a transaction block too.
#![cfg(feature = "postgres")]

use reflexr_testkit as common;

use std::time::{Duration, Instant};

use common::backend::{PgSchema, TestBackend};
use reflexr::postgres::fallible_iterator::FallibleIterator;
use reflexr::postgres::{Client, NoTls};
use reflexr::{Enqueue, ManualClock, NewEvent, Postgres, Query};

/// The notifications `listener` hears until the `end` that the session
/// `end_from` sent, in order, as (session, channel, payload). Waits for
/// the server's own delivery (at most a minute), not for a time.
fn heard_until(listener: &mut Client, end_from: i32) -> Vec<(i32, String, String)> {
    let mut heard = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no end after {heard:?}");
        let mut notes = listener.notifications();
        let mut iter = notes.timeout_iter(Duration::from_secs(1));
        while let Some(n) = iter.next().expect("the listener's connection") {
            if n.process_id() == end_from && n.payload() == "end" {
                return heard;
            }
            heard.push((
                n.process_id(),
                n.channel().to_string(),
                n.payload().to_string(),
            ));
        }
    }
}

/// What a notification's payload says was made (`e`, `r` or `er`), checked
/// to carry its engine's token after it: `r_` and 16 hex digits.
fn kinds(payload: &str) -> String {
    let (kinds, token) = payload
        .split_once('_')
        .unwrap_or_else(|| panic!("no token in {payload:?}"));
    assert!(
        token.len() == 16 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{payload:?}"
    );
    kinds.to_string()
}

/// What the notifications `listener` hears from the sessions `from` until
/// the `end` that the session `end_from` sent say was made, in order
/// (see [`kinds`]): only the engine's own sessions count, whatever else
/// the channel carries. They all carry one token, the engine's.
fn heard_until_end(listener: &mut Client, from: &[i32], end_from: i32) -> Vec<String> {
    let payloads: Vec<String> = heard_until(listener, end_from)
        .into_iter()
        .filter(|(session, _, _)| from.contains(session))
        .map(|(_, _, payload)| payload)
        .collect();
    let tokens: std::collections::BTreeSet<&str> = payloads
        .iter()
        .filter_map(|p| p.split_once('_').map(|(_, token)| token))
        .collect();
    assert!(tokens.len() <= 1, "{payloads:?}");
    payloads.iter().map(|p| kinds(p)).collect()
}

/// Sends the mark [`heard_until_end`] waits for, after what was committed
/// so far (notifications come in commit order); returns its session's id.
fn send_end(place: &PgSchema) -> i32 {
    let mut c = Client::connect(&place.config(), NoTls).unwrap();
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    c.batch_execute(&format!("NOTIFY {}, 'end'", channel(place)))
        .unwrap();
    pid
}

/// The channel an engine of `place` announces its commits on, as the
/// PostgreSQL chapter names it: `reflexr_<schema>` for a schema named in
/// lower-case letters, digits and underscores (a test's schema is).
fn channel(place: &PgSchema) -> String {
    format!("reflexr_{}", place.name)
}

/// The server's ids of the sessions tagged `tag` (an engine's, opened by
/// [`tagged_engine`]: its pool keeps them open).
fn sessions_of(place: &PgSchema, tag: &str) -> Vec<i32> {
    Client::connect(&place.config(), NoTls)
        .unwrap()
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&tag],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Invariant 5's start (a run exists once its enqueue returns, and wakes
/// the executors that may run it): a plain enqueue's commit carries one
/// notification to other processes, and an enqueue that made nothing (its
/// id there already) carries none.
#[test]
fn a_plain_enqueue_notifies_other_processes_in_its_own_commit() {
    let place = PgSchema::new();
    let clock = ManualClock::new(1_800_000_000_000);
    let tag = format!("enqueue-notify-{}", std::process::id());
    let e = tagged_engine(&place, &clock, &tag);
    let mut listener = Client::connect(&place.config(), NoTls).unwrap();
    listener
        .batch_execute(&format!("LISTEN {}", channel(&place)))
        .unwrap();
    let first = e
        .enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 1 })).id("mail-1"))
        .unwrap();
    assert!(!first.deduplicated);
    let again = e
        .enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 1 })).id("mail-1"))
        .unwrap();
    assert!(again.deduplicated && again.id == "mail-1", "{again:?}");
    let second = e
        .enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 2 })))
        .unwrap();
    assert!(!second.deduplicated);
    // A mark after the three: notifications come in commit order.
    let engine = sessions_of(&place, &tag);
    let end = send_end(&place);
    assert_eq!(heard_until_end(&mut listener, &engine, end), ["r", "r"]);
    assert_eq!(e.runs(None, 10).unwrap().len(), 2);
}

/// Cuts every session of the server tagged `tag` (an engine opened on
/// `Postgres::tagged`), and waits until they are gone.
fn cut_sessions(place: &PgSchema, tag: &str) {
    let mut admin = Client::connect(&place.config(), NoTls).unwrap();
    let cut: Vec<i32> = admin
        .query(
            // The engine's sessions first, then each cut: a filter beside
            // the cut could be run after it, on every session.
            "WITH mine AS MATERIALIZED \
               (SELECT pid FROM pg_stat_activity WHERE application_name = $1) \
             SELECT pid FROM mine WHERE pg_terminate_backend(pid)",
            &[&tag],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!cut.is_empty(), "no connection of the engine's to cut");
    // Gone from the server (the engine's listener may connect again).
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
            &[&cut],
        )
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        assert!(Instant::now() < deadline, "the cut sessions stayed");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// An engine whose sessions carry `tag`.
fn tagged_engine(place: &PgSchema, clock: &ManualClock, tag: &str) -> reflexr::Engine<Postgres> {
    <Postgres as TestBackend>::open_at(
        &Postgres::tagged(&place.config(), tag),
        &common::backend::Opts::new(clock, "test"),
    )
}

/// Invariant 10 (a failure loses nothing and makes nothing twice) for the
/// connection under a plain enqueue: one the server cut while it sat in
/// the pool fails the statement, which is sent again on another; the run
/// is made once, and the call says it made it.
#[test]
fn a_plain_enqueue_on_a_connection_the_server_cut_is_sent_again() {
    let place = PgSchema::new();
    let clock = ManualClock::new(1_800_000_000_000);
    let tag = format!("enqueue-cut-{}", std::process::id());
    let e = tagged_engine(&place, &clock, &tag);
    // A pooled connection that has served an enqueue.
    e.enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 1 })))
        .unwrap();
    cut_sessions(&place, &tag);
    let made = e
        .enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 2 })))
        .expect("sent again on a new connection");
    assert!(!made.deduplicated);
    let runs = e.runs(None, 10).unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().any(|r| r.id == made.id));
}

fn tick(subject: &str) -> NewEvent {
    NewEvent::new("tick", subject, "test", 0)
}

/// Invariants 1 and 3 for a single append alone: its statement locks the
/// head, takes the next seq, moves the head and notifies in one commit;
/// the next append goes on from it, and an id there already appends
/// nothing and notifies nothing.
#[test]
fn a_lone_append_moves_the_head_and_notifies_in_its_own_commit() {
    let place = PgSchema::new();
    let clock = ManualClock::new(1_800_000_000_000);
    let tag = format!("append-notify-{}", std::process::id());
    let e = tagged_engine(&place, &clock, &tag);
    e.ensure_workspace("app", &["tick"]).unwrap();
    let mut listener = Client::connect(&place.config(), NoTls).unwrap();
    listener
        .batch_execute(&format!("LISTEN {}", channel(&place)))
        .unwrap();
    let first = e.append("app", &tick("a").id("one")).unwrap();
    let again = e.append("app", &tick("a").id("one")).unwrap();
    assert!(again.existing && again.seq == first.seq, "{again:?}");
    let second = e.append("app", &tick("a")).unwrap();
    assert_eq!((second.seq, second.version), (first.seq + 1, 2));
    assert_eq!(e.head_seq().unwrap(), second.seq);
    let engine = sessions_of(&place, &tag);
    let end = send_end(&place);
    assert_eq!(heard_until_end(&mut listener, &engine, end), ["e", "e"]);
}

/// Invariant 10 for the connection under a lone append: one the server cut
/// while it sat in the pool fails the statement, which is sent again on
/// another; the event is appended once.
#[test]
fn a_lone_append_on_a_connection_the_server_cut_is_sent_again() {
    let (place, clock) = (PgSchema::new(), ManualClock::new(1_800_000_000_000));
    let tag = format!("append-cut-{}", std::process::id());
    let e = with_a_tick(&place, &clock, &tag);
    cut_sessions(&place, &tag);
    let made = e
        .append("app", &tick("b"))
        .expect("sent again on a new connection");
    assert!(!made.existing);
    assert_eq!(subjects(&e).unwrap(), ["a", "b"]);
}

/// An engine whose sessions carry `tag`, with one tick appended (subject
/// `a`): a pooled connection that has served a write.
fn with_a_tick(place: &PgSchema, clock: &ManualClock, tag: &str) -> reflexr::Engine<Postgres> {
    let e = tagged_engine(place, clock, tag);
    e.ensure_workspace("app", &["tick"]).unwrap();
    e.append("app", &tick("a")).unwrap();
    e
}

/// The subjects of the workspace `app`'s events, in order.
fn subjects(e: &reflexr::Engine<Postgres>) -> reflexr::Result<Vec<String>> {
    Ok(e.read(&Query::new("app"))?
        .into_iter()
        .map(|ev| ev.subject)
        .collect())
}

/// Invariant 10 for the engine's reads, each statement sent outside any
/// transaction block: a connection the server cut while it sat in the pool
/// fails the read, which is made again on another.
#[test]
fn a_read_on_a_connection_the_server_cut_is_made_again() {
    let (place, clock) = (PgSchema::new(), ManualClock::new(1_800_000_000_000));
    let tag = format!("read-cut-{}", std::process::id());
    let e = with_a_tick(&place, &clock, &tag);
    // A pooled connection that has served a read too.
    assert_eq!(subjects(&e).unwrap(), ["a"]);
    cut_sessions(&place, &tag);
    assert_eq!(subjects(&e).expect("made again on a new connection"), ["a"]);
}

/// An engine on `place` through sessions that default to read-only
/// SERIALIZABLE transactions (as a role or database can be set).
fn open_read_only_by_default(place: &PgSchema, clock: &ManualClock) -> reflexr::Engine<Postgres> {
    let config = place.config();
    let config = format!(
        "{} -c default_transaction_isolation=serializable -c default_transaction_read_only=on'",
        config.strip_suffix('\'').expect("options in quotes")
    );
    <Postgres as TestBackend>::open_at(&config, &common::backend::Opts::new(clock, "test"))
}

/// Invariant 10 for a database or role whose defaults differ: a session
/// that defaults to read-only SERIALIZABLE transactions still makes a lone
/// append and a plain enqueue (the pool's sessions default to READ
/// COMMITTED, READ WRITE, as the engine's transactions say in their BEGIN).
#[test]
fn statements_sent_as_their_own_transactions_ignore_the_sessions_defaults() {
    let place = PgSchema::new();
    let clock = ManualClock::new(1_800_000_000_000);
    // The schema made first (its migration is not the point here).
    Postgres::open(&place, &clock, "maker")
        .ensure_workspace("app", &["tick"])
        .unwrap();
    let e = open_read_only_by_default(&place, &clock);
    let a = e.append("app", &tick("a")).expect("a lone append");
    let b = e.append("app", &tick("a")).expect("another");
    assert_eq!((b.seq, b.version), (a.seq + 1, 2));
    e.enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 1 })))
        .expect("a plain enqueue");
    assert_eq!(e.runs(None, 10).unwrap().len(), 1);
}

/// Invariant 10 from the first open: an engine opened where sessions
/// default to read-only SERIALIZABLE transactions makes its schema (the
/// migration's transaction), then writes and notifies as anywhere else.
#[test]
fn an_engine_makes_its_schema_where_sessions_default_to_read_only() {
    let place = PgSchema::new();
    let clock = ManualClock::new(1_800_000_000_000);
    let e = open_read_only_by_default(&place, &clock);
    e.ensure_workspace("app", &["tick"]).unwrap();
    e.write(|tx| {
        tx.append("app", &tick("a"))?;
        tx.append("app", &tick("b"))
    })
    .expect("a write of two appends");
    e.enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 1 })))
        .expect("a plain enqueue");
    assert_eq!(e.read(&Query::new("app")).unwrap().len(), 2);
    assert_eq!(e.runs(None, 10).unwrap().len(), 1);
}

/// DESIGN.md, Threads (a commit wakes the waiting workers; across
/// processes, by a PostgreSQL notification): wake-ups stay in their
/// schema. Engines of two schemas of one database announce their commits
/// on channels of their own, so a process listening for one schema's
/// commits hears none of the other's (a wasted wake for every commit of
/// every other schema, before).
#[test]
fn engines_of_two_schemas_announce_their_commits_on_channels_of_their_own() {
    let (a, b) = (PgSchema::new(), PgSchema::new());
    assert_ne!(channel(&a), channel(&b));
    let clock = ManualClock::new(1_800_000_000_000);
    let tags = [
        format!("schema-a-{}", std::process::id()),
        format!("schema-b-{}", std::process::id()),
    ];
    let ea = tagged_engine(&a, &clock, &tags[0]);
    let eb = tagged_engine(&b, &clock, &tags[1]);
    ea.ensure_workspace("app", &["tick"]).unwrap();
    let mut listener = Client::connect(&a.config(), NoTls).unwrap();
    listener
        .batch_execute(&format!("LISTEN {}; LISTEN {}", channel(&a), channel(&b)))
        .unwrap();
    ea.append("app", &tick("a")).unwrap();
    eb.enqueue(&Enqueue::new("mail", &serde_json::json!({ "n": 1 })))
        .unwrap();
    let (sessions_a, sessions_b) = (sessions_of(&a, &tags[0]), sessions_of(&b, &tags[1]));
    let end = send_end(&b);
    // (schema, channel, payload) of each engine's notifications, in commit
    // order, until the end mark on b's channel.
    let heard: Vec<(&str, String, String)> = heard_until(&mut listener, end)
        .into_iter()
        .filter_map(|(session, channel, payload)| {
            let from = if sessions_a.contains(&session) {
                "a"
            } else if sessions_b.contains(&session) {
                "b"
            } else {
                return None;
            };
            Some((from, channel, kinds(&payload)))
        })
        .collect();
    assert_eq!(
        heard,
        [
            ("a", channel(&a), "e".to_string()),
            ("b", channel(&b), "r".to_string()),
        ]
    );
}

/// DESIGN.md, Threads, as above: wake-ups follow the tables. An engine
/// whose `search_path` names first a schema without them uses the tables
/// further along the path, as every statement finds them, and announces
/// its commits on that schema's channel, where the engines of that schema
/// listen (not on the channel of the path's first schema,
/// `current_schema()`).
#[test]
fn an_engine_announces_on_the_channel_of_the_schema_its_tables_are_in() {
    let url = std::env::var("REFLEXR_PG_URL").expect("the test server");
    let (place, empty) = (PgSchema::new(), PgSchema::new());
    let clock = ManualClock::new(1_800_000_000_000);
    // The tables, made in `place` by an engine of its own.
    tagged_engine(
        &place,
        &clock,
        &format!("path-setup-{}", std::process::id()),
    )
    .ensure_workspace("app", &["tick"])
    .unwrap();
    let tag = format!("path-{}", std::process::id());
    let config = format!(
        "{url} options='-c search_path={},{}'",
        empty.name, place.name
    );
    let e = <Postgres as TestBackend>::open_at(
        &Postgres::tagged(&config, &tag),
        &common::backend::Opts::new(&clock, "test"),
    );
    let mut listener = Client::connect(&place.config(), NoTls).unwrap();
    listener
        .batch_execute(&format!("LISTEN {}", channel(&place)))
        .unwrap();
    e.append("app", &tick("a")).unwrap();
    // The engine's rows are the place's: the event is there.
    let read = tagged_engine(&place, &clock, &format!("path-read-{}", std::process::id()));
    assert_eq!(read.head_seq().unwrap(), 1);
    let engine = sessions_of(&place, &tag);
    let end = send_end(&place);
    assert_eq!(heard_until_end(&mut listener, &engine, end), ["e"]);
}
