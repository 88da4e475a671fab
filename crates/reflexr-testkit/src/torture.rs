//! The mixed workload and the invariant checker of the crash and power-cut
//! tortures (`tests/it/crash.rs` on every backend, `tests/it/power.rs` on
//! SQLite's files): appends with application rows, a stateful rule firing
//! runs, executors with failing handlers, a follower, a reaction enqueueing
//! deliveries, a durable workflow per order (a `step_tx`, a step with an
//! outside effect, a sleep, a wait for the customer's next order, two
//! children and their join); and a check of DESIGN.md's invariants from
//! what the database holds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use reflexr::rusqlite::Connection;
use reflexr::{
    Builder, ChannelPolicy, Clock, ConsumerKind, Decision, Delivery, Engine, Enqueue, EventMatch,
    Follow, ManualClock, NewEvent, Query, RetryPolicy, Rule, Scope, Sqlite, SystemClock,
};

use super::backend::{Opts, TestBackend};

/// The system clock moved `hours` ahead: each child runs an hour after the
/// one killed before it, so the leases that one held have lapsed.
pub struct Later(pub i64);

impl Clock for Later {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.0 * 3_600_000
    }
}

pub const EVERY: i64 = 3;

/// What a child's engine is opened with: an hour after the one before it
/// (`hours`), its own lease holder, two executors claiming small batches.
pub fn child_opts(hours: i64) -> Opts {
    Opts::new(&super::later(hours), &format!("child-{hours}"))
        .executors(2)
        .claim_batch(4)
}

/// A child's engine on the file `builder` opens, as [`child_opts`] says but
/// on the system clock moved `hours` ahead, the workload registered: the
/// power-cut torture's, whose builder has a VFS of its own. The child keeps
/// the engine to its end, so the workflows' [`Outside`] is kept too.
pub fn child_engine(builder: Builder, hours: i64) -> Engine {
    let e = builder
        .clock(Later(hours))
        .holder_id(format!("child-{hours}"))
        .executors(2)
        .claim_batch(4)
        .open()
        .unwrap();
    workload(&e);
    std::mem::forget(workflows(&e));
    e
}

/// Everything the workload registers, for the child and for the finisher.
pub fn workload<B: TestBackend>(e: &Engine<B>) {
    e.ensure_workspace("app", &["order"]).unwrap();
    e.ensure_workspace("mirror", &["order"]).unwrap();
    e.ensure_workspace("effects", &["effect"]).unwrap();
    for table in [
        "orders (id TEXT PRIMARY KEY, customer INTEGER NOT NULL)",
        "charges (run TEXT PRIMARY KEY)",
        "sent (delivery TEXT PRIMARY KEY)",
        // The workflows' rows: no key, so a second write would show.
        "reserved (run TEXT NOT NULL)",
        "shipped (run TEXT NOT NULL)",
        "fulfilled (run TEXT NOT NULL)",
    ] {
        B::sql(e, &format!("CREATE TABLE IF NOT EXISTS {table}"));
    }
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
            B::run_sql(
                tx,
                &format!("INSERT INTO charges (run) VALUES ('{}')", run.id),
            )
        })?;
        Ok(())
    })
    .unwrap();
    e.register_channel(
        "email",
        ChannelPolicy::Retried(RetryPolicy::attempts(50).fixed(Duration::ZERO)),
        |msg, ctx| {
            ctx.complete(|tx| {
                B::run_sql(
                    tx,
                    &format!("INSERT INTO sent (delivery) VALUES ('{}')", msg.id),
                )
            })?;
            Ok(())
        },
    )
    .unwrap();
    e.register_reaction(
        B::reaction("receipts", "app")
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

/// The engine a workflow's outside effect is written through, kept for the
/// handlers while this lives: dropping it lets the engine go (the handlers
/// would otherwise keep the engine that keeps them).
pub struct Outside<B: reflexr::Backend>(std::sync::Arc<std::sync::Mutex<Option<Engine<B>>>>);

impl<B: reflexr::Backend> Drop for Outside<B> {
    fn drop(&mut self) {
        self.0.lock().unwrap().take();
    }
}

/// The workflows' handlers, in a process that runs them (a child, a
/// finisher): `fulfil`, one run per order, and its children `ship`. A step's
/// outside effect is an event appended in a write of its own to the
/// workspace `effects`, through the engine the returned [`Outside`] keeps.
#[must_use = "the handlers write their outside effects while it lives"]
pub fn workflows<B: TestBackend>(e: &Engine<B>) -> Outside<B> {
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(e.clone())));
    let outside = Outside(slot.clone());
    e.register_action("fulfil", move |run, ctx| {
        if fastrand::u8(..8) == 0 {
            return Err("the warehouse did not answer".into());
        }
        let input: serde_json::Value = run.input()?;
        let customer = input["customer"].as_i64().unwrap_or(0);
        let id = run.id.clone();
        ctx.step_tx("reserve", |tx| {
            B::run_sql(tx, &format!("INSERT INTO reserved (run) VALUES ('{id}')"))
        })?;
        let nonce: u64 = ctx.step("effect", |_| {
            let nonce = fastrand::u64(..1 << 52);
            let outside = slot
                .lock()
                .unwrap()
                .clone()
                .ok_or_else(|| reflexr::Error::invalid("effect", "the engine is closing"))?;
            let at = outside.now_ms();
            outside.append(
                "effects",
                &NewEvent::new("effect", run.id.clone(), "torture", at)
                    .payload(&serde_json::json!({ "nonce": nonce })),
            )?;
            Ok::<_, reflexr::Error>(nonce)
        })?;
        if fastrand::u8(..8) == 0 {
            return Err(format!("failed after the effect {nonce}").into());
        }
        ctx.sleep("cool", Duration::from_millis(5))?;
        let next = EventMatch::new("app", "order").field("customer", customer);
        ctx.wait_for_event("next-order", &next, Some(Duration::from_millis(20)))?;
        let mut children = Vec::new();
        for i in 0..2_u64 {
            let ship = Enqueue::new("ship", &serde_json::json!({ "i": i }))
                .retry(RetryPolicy::attempts(50).fixed(Duration::ZERO));
            children.push(ctx.spawn(("ship", i), ship)?);
        }
        let ends = ctx.join("shipped", &children)?;
        if !ends.iter().all(|end| end.succeeded()) {
            return Err("a child did not succeed".into());
        }
        let id = run.id.clone();
        ctx.step_tx("done", |tx| {
            B::run_sql(tx, &format!("INSERT INTO fulfilled (run) VALUES ('{id}')"))
        })?;
        Ok(())
    })
    .unwrap();
    e.register_action("ship", |run, ctx| {
        if fastrand::u8(..4) == 0 {
            return Err("the courier timed out".into());
        }
        let id = run.id.clone();
        ctx.step_tx("ship", |tx| {
            B::run_sql(tx, &format!("INSERT INTO shipped (run) VALUES ('{id}')"))
        })?;
        Ok(())
    })
    .unwrap();
    outside
}

/// Appends one order with its application row, in one transaction; the
/// caller prints `committed <id>` once it returns.
pub fn append_order<B: TestBackend>(e: &Engine<B>, id: &str) {
    e.write(|tx| {
        let customer = fastrand::i64(0..5);
        B::run_sql(
            tx,
            &format!("INSERT INTO orders (id, customer) VALUES ('{id}', {customer})"),
        )?;
        let at = tx.now_ms();
        tx.append(
            "app",
            &NewEvent::new("order", format!("customer/{customer}"), "shop", at)
                .id(id.to_string())
                .payload(&serde_json::json!({ "customer": customer })),
        )?;
        tx.enqueue(
            &Enqueue::new(
                "fulfil",
                &serde_json::json!({ "order": id, "customer": customer }),
            )
            .id(format!("fulfil-{id}"))
            .retry(RetryPolicy::attempts(50).fixed(Duration::ZERO)),
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

/// Checks every invariant on the file at `path`, with an engine of its own
/// (see [`check`]).
pub fn check_file(
    path: &Path,
    committed: &HashSet<String>,
    before: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    let e = Engine::builder(path).holder_id("checker").open().unwrap();
    check::<Sqlite>(&e, committed, before)
}

/// Every event of `workspace` of one of `types`, in seq order.
fn events<B: TestBackend>(e: &Engine<B>, workspace: &str, types: &[&str]) -> Vec<reflexr::Event> {
    let mut all: Vec<reflexr::Event> = Vec::new();
    loop {
        let after = all.last().map_or(0, |ev| ev.seq);
        let page = e
            .read(
                &Query::new(workspace)
                    .types(types.iter().copied())
                    .after(after)
                    .limit(1_000),
            )
            .unwrap();
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// Checks every invariant on what the database holds, read through `e` (an
/// engine that runs nothing); returns the cursors' positions.
pub fn check<B: TestBackend>(
    e: &Engine<B>,
    committed: &HashSet<String>,
    before: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    let orders_logged = events(e, "app", &["order"]);
    // 2: every committed event is there, with its row, and no event without
    // its row or row without its event.
    let logged: HashSet<String> = orders_logged.iter().map(|ev| ev.id.clone()).collect();
    let orders: HashSet<String> = B::strings(e, "SELECT id FROM orders").into_iter().collect();
    for id in committed {
        assert!(logged.contains(id), "committed event {id} lost");
    }
    assert_eq!(logged, orders, "events and their rows commit together");
    // 3: ids unique per workspace.
    assert_eq!(
        B::count(e, "SELECT count(*) FROM reflexr_events"),
        B::count(
            e,
            "SELECT count(*) FROM (SELECT DISTINCT workspace, id FROM reflexr_events) AS d"
        )
    );
    // 13's ground: each subject's versions are its events' places, in seq
    // order, with no gap and no repeat, whatever was killed mid-append.
    assert_eq!(
        B::count(
            e,
            "SELECT count(*) FROM (SELECT version, lag(version) OVER \
               (PARTITION BY workspace, subject ORDER BY seq) AS prev \
               FROM reflexr_events) AS v \
             WHERE prev IS NOT NULL AND version <> prev + 1"
        ),
        0,
        "subject versions in seq order, without a gap or a repeat"
    );

    // 8: no cursor moved back.
    let mut cursors = BTreeMap::new();
    for c in e.cursors().unwrap() {
        let k = format!("{}/{}@{}", c.kind.as_str(), c.name, c.workspace);
        if let Some(old) = before.get(&k) {
            assert!(
                c.position >= *old,
                "cursor {k} moved back from {old} to {}",
                c.position
            );
        }
        cursors.insert(k, c.position);
    }
    let cursor = |kind: ConsumerKind, name: &str| {
        cursors
            .get(&format!("{}/{name}@app", kind.as_str()))
            .copied()
            .unwrap_or(0)
    };

    // 4: the rule's firings are exactly the fold's, up to its cursor.
    let rule_cursor = cursor(ConsumerKind::Rule, "every-third");
    let mut counts: HashMap<i64, i64> = HashMap::new();
    let mut want = BTreeMap::new();
    for ev in orders_logged.iter().take_while(|ev| ev.seq <= rule_cursor) {
        let p: serde_json::Value = ev.payload().unwrap();
        let c = counts.entry(p["customer"].as_i64().unwrap()).or_default();
        *c += 1;
        if *c % EVERY == 0 {
            want.insert(ev.seq, 1);
        }
    }
    let firings: Vec<serde_json::Value> = events(e, "app", &["RuleFired"])
        .iter()
        .map(|ev| ev.payload().unwrap())
        .collect();
    let mut got: BTreeMap<i64, i64> = BTreeMap::new();
    for f in &firings {
        *got.entry(f["event_seq"].as_i64().unwrap()).or_default() += 1;
    }
    assert_eq!(
        got, want,
        "each (rule, event) decided exactly once, up to the cursor"
    );

    // 5: every firing has its run; a run completed at most once, and its
    // charge row exists exactly when it succeeded.
    let fired: HashSet<String> = firings
        .iter()
        .map(|f| f["firing_id"].as_str().unwrap().to_string())
        .collect();
    let runs: HashSet<String> = B::strings(e, "SELECT id FROM reflexr_runs WHERE kind = 'rule'")
        .into_iter()
        .collect();
    assert_eq!(
        fired, runs,
        "every firing has its run, and no run lacks a firing"
    );
    let succeeded: HashSet<String> = B::strings(
        e,
        "SELECT id FROM reflexr_runs WHERE kind = 'rule' AND state = 'succeeded'",
    )
    .into_iter()
    .collect();
    let charged: HashSet<String> = B::strings(e, "SELECT run FROM charges")
        .into_iter()
        .collect();
    assert_eq!(
        charged, succeeded,
        "a charge exactly for each completed run"
    );

    // The reaction's deliveries: exactly one per order it passed.
    let reaction = cursor(ConsumerKind::Reaction, "receipts");
    assert_eq!(
        B::count(
            e,
            &format!(
                "SELECT count(*) FROM reflexr_runs WHERE kind = 'delivery' AND event_seq <= {reaction}"
            )
        ),
        orders_logged.iter().filter(|ev| ev.seq <= reaction).count() as i64,
        "one delivery per handled order"
    );
    assert_eq!(
        B::count(
            e,
            "SELECT count(*) FROM reflexr_runs WHERE kind = 'delivery'"
        ),
        B::count(
            e,
            "SELECT count(DISTINCT event_seq) FROM reflexr_runs WHERE kind = 'delivery'"
        ),
        "no order's delivery enqueued twice"
    );
    let sent: HashSet<String> = B::strings(e, "SELECT delivery FROM sent")
        .into_iter()
        .collect();
    let delivered: HashSet<String> = B::strings(
        e,
        "SELECT id FROM reflexr_runs WHERE kind = 'delivery' AND state = 'succeeded'",
    )
    .into_iter()
    .collect();
    assert_eq!(sent, delivered);

    // The follower: the mirror holds exactly the orders up to its cursor.
    let follower = cursor(ConsumerKind::Follower, "mirror");
    let mirrored: Vec<String> = events(e, "mirror", &["order"])
        .into_iter()
        .map(|ev| ev.id)
        .collect();
    let mirrored_set: HashSet<String> = mirrored.iter().cloned().collect();
    assert_eq!(
        mirrored.len(),
        mirrored_set.len(),
        "nothing published twice"
    );
    let upto: HashSet<String> = orders_logged
        .iter()
        .filter(|ev| ev.seq <= follower)
        .map(|ev| ev.id.clone())
        .collect();
    assert!(
        upto.is_subset(&mirrored_set),
        "every order up to the follower's cursor is mirrored"
    );
    assert!(mirrored_set.is_subset(&logged), "only orders are mirrored");
    check_workflows(e, &orders, before, &mut cursors);
    cursors
}

/// The runs whose step `step` is recorded (done).
fn recorded<B: TestBackend>(e: &Engine<B>, step: &str) -> HashSet<String> {
    B::strings(
        e,
        &format!("SELECT run FROM reflexr_steps WHERE name = '{step}' AND state = 'done'"),
    )
    .into_iter()
    .collect()
}

/// The rows of an application table of the workflows, each once.
fn once<B: TestBackend>(e: &Engine<B>, table: &str) -> HashSet<String> {
    let rows = B::strings(e, &format!("SELECT run FROM {table}"));
    let set: HashSet<String> = rows.iter().cloned().collect();
    assert_eq!(
        rows.len(),
        set.len(),
        "a step_tx's row in {table} written twice"
    );
    set
}

/// The workflows' invariants: one run per order; a `step_tx`'s row exactly
/// when its step is recorded; a recorded step's outside effect done, and
/// never again once recorded (the count of effects per run is kept in the
/// map under `effects/<run>`, checked against the check before); children
/// made once, under their parent's ids; a join over only when its children
/// ended; waits only of suspended runs.
fn check_workflows<B: TestBackend>(
    e: &Engine<B>,
    orders: &HashSet<String>,
    before: &BTreeMap<String, i64>,
    seen: &mut BTreeMap<String, i64>,
) {
    let fulfil: HashSet<String> =
        B::strings(e, "SELECT id FROM reflexr_runs WHERE action = 'fulfil'")
            .into_iter()
            .collect();
    let want: HashSet<String> = orders.iter().map(|o| format!("fulfil-{o}")).collect();
    assert_eq!(fulfil, want, "one workflow per order, enqueued with it");
    assert_eq!(
        once(e, "reserved"),
        recorded(e, "reserve"),
        "reserve: rows exactly when recorded"
    );
    assert_eq!(
        once(e, "shipped"),
        recorded(e, "ship"),
        "ship: rows exactly when recorded"
    );
    let fulfilled = once(e, "fulfilled");
    assert_eq!(
        fulfilled,
        recorded(e, "done"),
        "done: rows exactly when recorded"
    );
    let succeeded: HashSet<String> = B::strings(
        e,
        "SELECT id FROM reflexr_runs WHERE action = 'fulfil' AND state = 'succeeded'",
    )
    .into_iter()
    .collect();
    // Its last step commits before its success (a kill between the two
    // leaves the step, and the next attempt returns it).
    assert!(
        succeeded.is_subset(&fulfilled),
        "a workflow succeeds after its last step"
    );

    // Effects: the recorded nonce was an effect of the run, and no effect
    // ran after the record.
    let mut effects: HashMap<String, Vec<u64>> = HashMap::new();
    for ev in events(e, "effects", &["effect"]) {
        let p: serde_json::Value = ev.payload().unwrap();
        effects
            .entry(ev.subject.clone())
            .or_default()
            .push(p["nonce"].as_u64().unwrap());
    }
    let outputs: Vec<String> = B::strings(
        e,
        "SELECT run || ' ' || output FROM reflexr_steps WHERE name = 'effect'",
    );
    for line in outputs {
        let (run, nonce) = line.split_once(' ').unwrap();
        let nonce: u64 = nonce.parse().unwrap();
        let done = effects.get(run).cloned().unwrap_or_default();
        assert!(
            done.contains(&nonce),
            "{run}: the recorded effect {nonce} happened"
        );
        let key = format!("effects/{run}");
        if let Some(n) = before.get(&key) {
            assert_eq!(
                done.len() as i64,
                *n,
                "{run}: an effect ran again after its record"
            );
        }
        seen.insert(key, done.len() as i64);
    }

    // Children: once each, under the parent's ids; a join over only when
    // every child ended.
    let spawned: [HashSet<String>; 2] = [recorded(e, "ship/0"), recorded(e, "ship/1")];
    let mut children: HashMap<String, String> = HashMap::new();
    for line in B::strings(
        e,
        "SELECT id || ' ' || parent || ' ' || state FROM reflexr_runs WHERE parent IS NOT NULL",
    ) {
        let mut parts = line.splitn(3, ' ');
        let (child, parent, state) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let i = usize::from(child.ends_with("/ship/1"));
        assert_eq!(
            child,
            format!("{parent}/ship/{i}"),
            "{child} is a child of {parent}"
        );
        assert!(
            spawned[i].contains(parent),
            "{child} exists only with its spawn step"
        );
        children.insert(child.to_string(), state.to_string());
    }
    for parent in recorded(e, "shipped") {
        for i in 0..2 {
            assert_eq!(
                children
                    .get(&format!("{parent}/ship/{i}"))
                    .map(String::as_str),
                Some("succeeded"),
                "{parent}: joined before its child ended"
            );
        }
    }
    // Waits belong to runs that have not ended.
    assert_eq!(
        B::count(
            e,
            "SELECT count(*) FROM reflexr_event_waits w JOIN reflexr_runs r ON r.id = w.run \
             WHERE r.state NOT IN ('ready', 'running')"
        ),
        0,
        "a wait of a run that ended"
    );
}

/// The child's endless work: appends an order a little after another and
/// prints `committed <id>` for each acknowledged one, until it is killed or
/// its power is cut.
pub fn append_orders_until_stopped<B: TestBackend>(e: &Engine<B>, hours: i64) -> ! {
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

/// A new database at `place` with the workload's tables and registrations.
pub fn prepare_place<B: TestBackend>(place: &B::Place) {
    let e = B::open(place, &ManualClock::new(0), "prepare");
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
