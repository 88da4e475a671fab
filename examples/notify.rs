//! A rule whose action sends a notification, run by the engine's own
//! threads: the first attempt fails, the retry (after its backoff) succeeds.
//! The run id is the idempotency key a real mail service would get.
//!
//! ```text
//! cargo run --example notify
//! ```

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reflexr::{Decision, Engine, NewEvent, RetryPolicy, Rule, RunState, Scope};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let dir = tempfile::tempdir()?;
    let engine = Engine::builder(dir.path().join("notify.db"))
        .executors(2)
        .open()?;
    engine.ensure_workspace("events-app", &["session.changed"])?;

    engine.register_rule(
        Rule::new("tell-attendees", "events-app")
            .on(["session.changed"])
            .scope(Scope::subject())
            .action("send-email")
            // Three attempts, 300 ms apart, so the demo is quick.
            .retry(RetryPolicy::attempts(3).fixed(Duration::from_millis(300)))
            .decide(|event| {
                let change: serde_json::Value = event.payload()?;
                Ok(Decision::fire(&serde_json::json!({
                    "to": "attendees-of-".to_string() + &event.subject,
                    "subject": format!("Moved to {}", change["room"].as_str().unwrap_or("?")),
                })))
            }),
    )?;

    let started = Instant::now();
    let smtp_calls = AtomicU32::new(0);
    let (sent_tx, sent) = mpsc::channel();
    let sent_tx = Mutex::new(sent_tx);
    engine.register_action("send-email", move |run, _ctx| {
        let mail: serde_json::Value = run.input()?;
        let call = smtp_calls.fetch_add(1, Ordering::SeqCst) + 1;
        let at = started.elapsed().as_millis();
        if call == 1 {
            println!(
                "{at:>5} ms  attempt {} of run {}: SMTP timed out",
                run.attempt, run.id
            );
            return Err("SMTP timeout".into());
        }
        println!(
            "{at:>5} ms  attempt {} of run {}: sent {:?} to {} (idempotency key: the run id)",
            run.attempt,
            run.id,
            mail["subject"].as_str().unwrap_or_default(),
            mail["to"].as_str().unwrap_or_default()
        );
        sent_tx.lock().unwrap().send(()).unwrap();
        Ok(())
    })?;

    engine.start()?;
    engine.write(|tx| {
        let at = tx.now_ms();
        tx.append(
            "events-app",
            &NewEvent::new("session.changed", "session/42", "admin", at)
                .payload(&serde_json::json!({ "room": "Hall B" })),
        )
    })?;
    println!("    0 ms  session/42 moved to Hall B (the request returns at once)");
    sent.recv_timeout(Duration::from_secs(30))?;
    engine.shutdown();

    let run = &engine.runs(None, 1)?[0];
    assert_eq!(run.state, RunState::Succeeded);
    println!(
        "run {} {} after {} attempts; last error: {:?}",
        run.id, run.state, run.attempt, run.last_error
    );
    Ok(())
}
