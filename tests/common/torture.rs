//! The mixed workload and the invariant checker of the crash and power-cut
//! tortures (`tests/crash.rs`, `tests/power.rs`): appends with application
//! rows, a stateful rule firing runs, executors with failing handlers, a
//! follower, a reaction enqueueing deliveries; and a check of DESIGN.md's
//! invariants from the file alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use reflexr::{
    ChannelPolicy, Clock, Decision, Delivery, Engine, EngineBuilder, Follow, NewEvent, Reaction,
    RetryPolicy, Rule, Scope, SystemClock,
};
use rusqlite::Connection;

/// The system clock moved `hours` ahead: each child runs an hour after the
/// one killed before it, so the leases that one held have lapsed.
pub struct Later(pub i64);

impl Clock for Later {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.0 * 3_600_000
    }
}

pub const EVERY: i64 = 3;

/// A child's engine on the file `builder` opens: an hour after the one
/// before it (`hours`), its own lease holder, two executors claiming small
/// batches, the workload registered.
pub fn child_engine(builder: EngineBuilder, hours: i64) -> Engine {
    let e = builder
        .clock(Later(hours))
        .holder_id(format!("child-{hours}"))
        .executors(2)
        .claim_batch(4)
        .open()
        .unwrap();
    workload(&e);
    e
}

/// Everything the workload registers, for the child and for the finisher.
pub fn workload(e: &Engine) {
    e.ensure_workspace("app", &["order"]).unwrap();
    e.ensure_workspace("mirror", &["order"]).unwrap();
    e.write(|tx| {
        tx.conn().execute_batch(
            "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS charges (run TEXT PRIMARY KEY);
             CREATE TABLE IF NOT EXISTS sent (delivery TEXT PRIMARY KEY);",
        )?;
        Ok(())
    })
    .unwrap();
    #[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
    struct Count {
        n: i64,
    }
    e.register_rule(
        Rule::new("every-third", "app")
            .on(["order"])
            .scope(Scope::payload("customer"))
            .action("charge")
            .retry(RetryPolicy::attempts(50).fixed(Duration::ZERO))
            .decide_with_state(Count::default(), |_, c| {
                c.n += 1;
                Ok(if c.n % EVERY == 0 {
                    Decision::Fire(serde_json::json!({ "n": c.n }))
                } else {
                    Decision::Skip
                })
            }),
    )
    .unwrap();
    e.register_action("charge", |run, ctx| {
        if fastrand::u8(..4) == 0 {
            return Err("the payment service timed out".into());
        }
        ctx.complete(|tx| {
            tx.execute("INSERT INTO charges (run) VALUES (?1)", [&run.id])?;
            Ok(())
        })?;
        Ok(())
    })
    .unwrap();
    e.register_channel(
        "email",
        ChannelPolicy::Retried(RetryPolicy::attempts(50).fixed(Duration::ZERO)),
        |msg, ctx| {
            ctx.complete(|tx| {
                tx.execute("INSERT INTO sent (delivery) VALUES (?1)", [&msg.id])?;
                Ok(())
            })?;
            Ok(())
        },
    )
    .unwrap();
    e.register_reaction(
        Reaction::new("receipts", "app")
            .on(["order"])
            .handle(|event, tx| {
                tx.deliver(&Delivery::new("email", "receipt").caused_by(event))?;
                Ok(())
            }),
    )
    .unwrap();
    e.follow(Follow::new("app", "mirror").name("mirror"))
        .unwrap();
}

/// Appends one order with its application row, in one transaction; the
/// caller prints `committed <id>` once it returns.
pub fn append_order(e: &Engine, id: &str) {
    e.write(|tx| {
        let customer = fastrand::i64(0..5);
        tx.execute(
            "INSERT INTO orders (id, customer) VALUES (?1, ?2)",
            rusqlite::params![id, customer],
        )?;
        let at = tx.now_ms();
        tx.append(
            "app",
            &NewEvent::new("order", format!("customer/{customer}"), "shop", at)
                .id(id.to_string())
                .payload(&serde_json::json!({ "customer": customer })),
        )?;
        Ok(())
    })
    .unwrap();
}

pub fn strings(conn: &Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

pub fn int(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Checks every invariant on the file; returns the cursors' positions.
pub fn check(
    path: &Path,
    committed: &HashSet<String>,
    before: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    let conn = Connection::open(path).unwrap();
    // 2: every committed event is there, with its row, and no event without
    // its row or row without its event.
    let events: HashSet<String> = strings(
        &conn,
        "SELECT id FROM reflexr_events WHERE workspace = 'app' AND type = 'order'",
    )
    .into_iter()
    .collect();
    let orders: HashSet<String> = strings(&conn, "SELECT id FROM orders")
        .into_iter()
        .collect();
    for id in committed {
        assert!(events.contains(id), "committed event {id} lost");
    }
    assert_eq!(events, orders, "events and their rows commit together");
    // 3: ids unique per workspace.
    assert_eq!(
        int(&conn, "SELECT count(*) FROM reflexr_events"),
        int(
            &conn,
            "SELECT count(*) FROM (SELECT DISTINCT workspace, id FROM reflexr_events)"
        )
    );

    // 8: no cursor moved back.
    let mut cursors = BTreeMap::new();
    let mut stmt = conn
        .prepare("SELECT kind || '/' || name || '@' || workspace, position FROM reflexr_cursors")
        .unwrap();
    for row in stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
    {
        let (k, p) = row.unwrap();
        if let Some(old) = before.get(&k) {
            assert!(p >= *old, "cursor {k} moved back from {old} to {p}");
        }
        cursors.insert(k, p);
    }
    let cursor = |k: &str| cursors.get(k).copied().unwrap_or(0);

    // 4: the rule's firings are exactly the fold's, up to its cursor.
    let rule_cursor = cursor("rule/every-third@app");
    let mut counts: HashMap<i64, i64> = HashMap::new();
    let mut want = BTreeMap::new();
    let mut stmt = conn
        .prepare(
            "SELECT seq, json_extract(payload, '$.customer') FROM reflexr_events \
             WHERE workspace = 'app' AND type = 'order' ORDER BY seq",
        )
        .unwrap();
    for row in stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
    {
        let (seq, customer) = row.unwrap();
        if seq > rule_cursor {
            break;
        }
        let c = counts.entry(customer).or_default();
        *c += 1;
        if *c % EVERY == 0 {
            want.insert(seq, 1);
        }
    }
    let mut got: BTreeMap<i64, i64> = BTreeMap::new();
    let mut stmt = conn
        .prepare(
            "SELECT json_extract(payload, '$.event_seq') FROM reflexr_events \
             WHERE workspace = 'app' AND type = 'RuleFired'",
        )
        .unwrap();
    for seq in stmt.query_map([], |r| r.get::<_, i64>(0)).unwrap() {
        *got.entry(seq.unwrap()).or_default() += 1;
    }
    assert_eq!(
        got, want,
        "each (rule, event) decided exactly once, up to the cursor"
    );

    // 5: every firing has its run; a run completed at most once, and its
    // charge row exists exactly when it succeeded.
    let fired: HashSet<String> = strings(
        &conn,
        "SELECT json_extract(payload, '$.firing_id') FROM reflexr_events WHERE type = 'RuleFired'",
    )
    .into_iter()
    .collect();
    let runs: HashSet<String> = strings(&conn, "SELECT id FROM reflexr_runs WHERE kind = 'rule'")
        .into_iter()
        .collect();
    assert_eq!(
        fired, runs,
        "every firing has its run, and no run lacks a firing"
    );
    let succeeded: HashSet<String> = strings(
        &conn,
        "SELECT id FROM reflexr_runs WHERE kind = 'rule' AND state = 'succeeded'",
    )
    .into_iter()
    .collect();
    let charged: HashSet<String> = strings(&conn, "SELECT run FROM charges")
        .into_iter()
        .collect();
    assert_eq!(
        charged, succeeded,
        "a charge exactly for each completed run"
    );

    // The reaction's deliveries: exactly one per order it passed.
    let reaction = cursor("reaction/receipts@app");
    assert_eq!(
        int(
            &conn,
            &format!(
                "SELECT count(*) FROM reflexr_runs WHERE kind = 'delivery' AND event_seq <= {reaction}"
            )
        ),
        int(
            &conn,
            &format!(
                "SELECT count(*) FROM reflexr_events \
             WHERE workspace = 'app' AND type = 'order' AND seq <= {reaction}"
            )
        ),
        "one delivery per handled order"
    );
    assert_eq!(
        int(
            &conn,
            "SELECT count(*) FROM reflexr_runs WHERE kind = 'delivery'"
        ),
        int(
            &conn,
            "SELECT count(DISTINCT event_seq) FROM reflexr_runs WHERE kind = 'delivery'"
        ),
        "no order's delivery enqueued twice"
    );
    let sent: HashSet<String> = strings(&conn, "SELECT delivery FROM sent")
        .into_iter()
        .collect();
    let delivered: HashSet<String> = strings(
        &conn,
        "SELECT id FROM reflexr_runs WHERE kind = 'delivery' AND state = 'succeeded'",
    )
    .into_iter()
    .collect();
    assert_eq!(sent, delivered);

    // The follower: the mirror holds exactly the orders up to its cursor.
    let follower = cursor("follower/mirror@app");
    let mirrored: Vec<String> = strings(
        &conn,
        "SELECT id FROM reflexr_events WHERE workspace = 'mirror'",
    );
    let mirrored_set: HashSet<String> = mirrored.iter().cloned().collect();
    assert_eq!(
        mirrored.len(),
        mirrored_set.len(),
        "nothing published twice"
    );
    let upto: HashSet<String> = strings(
        &conn,
        &format!("SELECT id FROM reflexr_events WHERE workspace = 'app' AND type = 'order' AND seq <= {follower}"),
    )
    .into_iter()
    .collect();
    assert!(
        upto.is_subset(&mirrored_set),
        "every order up to the follower's cursor is mirrored"
    );
    assert!(mirrored_set.is_subset(&events), "only orders are mirrored");
    cursors
}

/// The child's endless work: appends an order a little after another and
/// prints `committed <id>` for each acknowledged one, until it is killed or
/// its power is cut.
pub fn append_orders_until_stopped(e: &Engine, hours: i64) -> ! {
    use std::io::Write;
    for i in 0.. {
        let id = format!("order-{hours}-{i}");
        append_order(e, &id);
        // The whole line in one write (a pipe takes up to 4 KiB at once):
        // `println!` writes its parts one by one, and a process that ends
        // between them (a power cut's exit, a kill) would leave half a line,
        // an id cut short, for the parent to read.
        let mut out = std::io::stdout().lock();
        out.write_all(format!("\ncommitted {id}\n").as_bytes())
            .unwrap();
        out.flush().unwrap();
        drop(out);
        std::thread::sleep(Duration::from_micros(300));
    }
    unreachable!("the loop ends with the process")
}

/// A new file at `path` with the workload's tables and registrations.
pub fn prepare(path: &Path) {
    let e = Engine::open(path).unwrap();
    workload(&e);
}

/// The number of rounds the environment variable `var` asks for (`default`
/// when unset).
pub fn rounds(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
