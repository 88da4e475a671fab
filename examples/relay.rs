//! An edge device's file relayed into a hub's file with the same ids
//! (ADR-0015): a follower reads the edge's log, its projection keeps the
//! readings and drops the debug chatter, and the hub appends each reading once
//! — however often the edge restarts or reads an envelope again.
//!
//! ```text
//! cargo run --example relay
//! ```

use reflexr::{Engine, Follow, NewEvent, Query};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let dir = tempfile::tempdir()?;
    let edge_path = dir.path().join("edge-7.db");
    let hub_path = dir.path().join("hub.db");

    let hub = Engine::open(&hub_path)?;
    hub.ensure_workspace("fleet", &["reading"])?;

    let edge = Engine::open(&edge_path)?;
    edge.ensure_workspace("edge-log", &["reading", "debug"])?;
    edge.register_projection("readings-only", |event| {
        if event.event_type != "reading" {
            return Ok(None); // bridge nothing
        }
        let mut out = reflexr::inspect::same_event(event);
        let reading: serde_json::Value = event.payload()?;
        out = out.payload(&json!({ "device": "edge-7", "reading": reading }));
        Ok(Some(out))
    })?;
    let name = edge.follow(
        Follow::new("edge-log", "fleet")
            .name("edge-7-to-hub")
            .to_file(&hub_path)
            .projection("readings-only"),
    )?;

    edge.write(|tx| {
        for i in 0..5 {
            let at = tx.now_ms();
            tx.append(
                "edge-log",
                &NewEvent::new("reading", "sensor/t1", "edge-7", at)
                    .payload(&json!({ "celsius": 20 + i })),
            )?;
            tx.append(
                "edge-log",
                &NewEvent::new("debug", "sensor/t1", "edge-7", at).payload(&json!({ "i": i })),
            )?;
        }
        Ok(())
    })?;
    let idle = edge.run_until_idle()?;
    println!(
        "edge: follower {name} moved past {} envelopes",
        idle.followed
    );

    // A restart that reads everything again publishes nothing twice.
    edge.operator("demo", "show that re-reading is harmless")?
        .reset_cursor("edge-log", reflexr::ConsumerKind::Follower, &name, 0)?;
    edge.run_until_idle()?;

    let edge_ids: Vec<String> = edge
        .read(&Query::new("edge-log").types(["reading"]))?
        .into_iter()
        .map(|e| e.id)
        .collect();
    for e in hub.read(&Query::new("fleet"))? {
        println!(
            "hub:  seq {} id {} {} {}",
            e.seq,
            e.id,
            e.event_type,
            e.payload_json()
        );
        assert!(edge_ids.contains(&e.id), "the same ids");
    }
    let f = &edge.followers()?[0];
    println!(
        "ledger: {} {} -> {} ({}), cursor {}, published {} (the re-read included), dead letters {}, stops {}",
        f.name,
        f.source,
        f.target,
        f.target_file.as_deref().unwrap_or("this file"),
        f.cursor,
        f.published,
        f.dead_letters,
        f.stops
    );
    Ok(())
}
