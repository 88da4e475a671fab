//! A stateful rule: tell the organiser when a session reaches 100 RSVPs.
//!
//! The rule keeps a count per session (its scope), fires once when the count
//! reaches 100, and fires again only if the session drops below 100 and comes
//! back. The decision is exact — the count, the rule's cursor and the firing
//! commit together — and the action runs at least once, under the firing id.
//!
//! ```text
//! cargo run --example rules
//! ```

use reflexr::{Decision, Engine, NewEvent, Rule, Scope};
use serde::{Deserialize, Serialize};

#[derive(Clone, Default, Serialize, Deserialize)]
struct Attendance {
    rsvps: u32,
    announced: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let dir = tempfile::tempdir()?;
    let engine = Engine::open(dir.path().join("rules.db"))?;
    engine.ensure_workspace("events-app", &["rsvp.added", "rsvp.cancelled"])?;

    engine.register_rule(
        Rule::new("session-full", "events-app")
            .on(["rsvp.added", "rsvp.cancelled"])
            .scope(Scope::payload("session"))
            .action("notify-organiser")
            .decide_with_state(Attendance::default(), |event, state| {
                match event.event_type.as_str() {
                    "rsvp.added" => state.rsvps += 1,
                    _ => state.rsvps = state.rsvps.saturating_sub(1),
                }
                if state.rsvps < 100 {
                    state.announced = false;
                } else if !state.announced {
                    state.announced = true;
                    return Ok(Decision::fire(&serde_json::json!({ "rsvps": state.rsvps })));
                }
                Ok(Decision::Skip)
            }),
    )?;
    engine.register_action("notify-organiser", |run, _ctx| {
        let input: serde_json::Value = run.input()?;
        println!(
            "  run {} (attempt {}): session {} is full with {} RSVPs",
            run.id,
            run.attempt,
            run.scope.as_deref().unwrap_or("?"),
            input["rsvps"]
        );
        Ok(())
    })?;

    // 120 guests RSVP to session 7, 30 to session 9; then 25 cancel on 7
    // and 10 more come back.
    let rsvp = |kind: &str, session: u32, guest: u32| {
        NewEvent::new(kind, format!("guest/{guest}"), format!("guest/{guest}"), 0)
            .payload(&serde_json::json!({ "session": session, "guest": guest }))
    };
    engine.write(|tx| {
        for g in 0..120 {
            tx.append("events-app", &rsvp("rsvp.added", 7, g))?;
        }
        for g in 0..30 {
            tx.append("events-app", &rsvp("rsvp.added", 9, 1000 + g))?;
        }
        Ok(())
    })?;
    println!("150 RSVPs appended; evaluating:");
    let idle = engine.run_until_idle()?;
    println!(
        "decided {} events, fired {}, ran {} run(s)",
        idle.decided, idle.fired, idle.succeeded
    );

    engine.write(|tx| {
        for g in 0..25 {
            tx.append("events-app", &rsvp("rsvp.cancelled", 7, g))?;
        }
        for g in 200..210 {
            tx.append("events-app", &rsvp("rsvp.added", 7, g))?;
        }
        Ok(())
    })?;
    println!("25 cancellations and 10 new RSVPs on session 7; evaluating:");
    let idle = engine.run_until_idle()?;
    println!(
        "decided {} events, fired {}, ran {} run(s)",
        idle.decided, idle.fired, idle.succeeded
    );

    let state: Option<serde_json::Value> = engine.rule_state("session-full", "7")?;
    println!("state of session 7: {}", state.unwrap_or_default());
    let state: Option<serde_json::Value> = engine.rule_state("session-full", "9")?;
    println!("state of session 9: {}", state.unwrap_or_default());
    Ok(())
}
