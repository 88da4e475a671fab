//! An edge's file relayed into a hub on PostgreSQL (feature `postgres`):
//! the edge works on its own file, a follower publishes its readings into
//! the hub with the same ids, and a consumer on the hub follows the fleet's
//! log with a cursor — the hub's own application rows committed with it.
//!
//! ```text
//! cargo run --example pg_hub --features postgres -- "host=127.0.0.1 user=app dbname=fleet"
//! ```
//!
//! The connection string defaults to `REFLEXR_PG_URL` (`eval "$(bash
//! tests/pg/cluster.sh start /tmp/reflexr-pg)"` starts a throwaway server).
//! The engine's tables go in the first schema of the connection's
//! `search_path`; the example creates a schema of its own and drops it.

use reflexr::postgres::{Client, NoTls};
use reflexr::{Engine, Follow, NewEvent, Query};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("REFLEXR_PG_URL").ok())
        .ok_or("give a PostgreSQL connection string, or set REFLEXR_PG_URL")?;
    let schema = format!("reflexr_hub_example_{}", std::process::id());
    Client::connect(&url, NoTls)?.batch_execute(&format!("CREATE SCHEMA {schema}"))?;
    let hub_config = format!("{url} options='-c search_path={schema}'");
    let outcome = run(&hub_config);
    Client::connect(&url, NoTls)?.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))?;
    outcome
}

fn run(hub_config: &str) -> Result<(), Box<dyn std::error::Error>> {
    let hub = Engine::open_postgres(hub_config)?;
    hub.ensure_workspace("fleet", &["reading"])?;
    hub.write(|tx| {
        tx.execute(
            "CREATE TABLE IF NOT EXISTS latest (sensor text PRIMARY KEY, celsius int NOT NULL)",
            &[],
        )
    })?;

    let dir = tempfile::tempdir()?;
    let edge = Engine::open(dir.path().join("edge-7.db"))?;
    edge.ensure_workspace("devices", &["reading"])?;
    edge.register_postgres_target("hub", hub_config)?;
    let name = edge.follow(Follow::new("devices", "fleet").to_postgres("hub"))?;
    for i in 0..5 {
        let at = edge.now_ms();
        edge.append(
            "devices",
            &NewEvent::new("reading", format!("sensor/t{}", i % 2), "edge-7", at)
                .payload(&json!({ "celsius": 20 + i })),
        )?;
    }
    let idle = edge.run_until_idle()?;
    println!("edge: follower {name} relayed {} envelopes", idle.followed);
    // Again from the start: the hub appends nothing twice.
    edge.operator("example", "show that a replay appends nothing")?
        .reset_cursor("devices", reflexr::ConsumerKind::Follower, &name, 0)?;
    edge.run_until_idle()?;
    println!(
        "edge: replayed from 0; the hub's head is still {}",
        hub.head_seq()?
    );

    // A consumer on the hub: its rows and its cursor commit together.
    let after = hub.cursor("dashboard", "fleet")?;
    let page = hub.read(&Query::new("fleet").after(after))?;
    let last = page.last().map(|e| e.seq).unwrap_or(after);
    hub.write(|tx| {
        for e in &page {
            let celsius = e.payload_value()?["celsius"].as_i64().unwrap_or(0) as i32;
            tx.execute(
                "INSERT INTO latest (sensor, celsius) VALUES ($1, $2) \
                 ON CONFLICT (sensor) DO UPDATE SET celsius = excluded.celsius",
                &[&e.subject, &celsius],
            )?;
        }
        tx.save_cursor("dashboard", "fleet", last)
    })?;
    for e in &page {
        println!(
            "hub: seq {} {} {} (id {})",
            e.seq, e.event_type, e.subject, e.id
        );
    }
    let latest =
        hub.write(|tx| tx.query("SELECT sensor, celsius FROM latest ORDER BY sensor", &[]))?;
    for row in latest {
        let (sensor, celsius): (String, i32) = (row.get(0), row.get(1));
        println!("hub: latest {sensor} = {celsius} °C");
    }
    println!(
        "hub: dashboard's cursor at {}",
        hub.cursor("dashboard", "fleet")?
    );
    Ok(())
}
