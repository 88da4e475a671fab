//! A durable workflow, end to end, in an events app: when a session moves,
//! tell its speaker, wait up to 24 hours for the speaker's confirmation in
//! the log (with a reminder after the first hour), then notify every
//! attendee — one child run each — and record that the move is done.
//!
//! - The workflow is the handler of the action `reschedule`, which a rule
//!   fires once per `session.moved`. It re-runs from the top on every
//!   attempt; each step it recorded returns its output instead of running
//!   again, so the speaker is told once, and the attendees are notified once.
//! - Waiting costs nothing: the run is suspended (no thread, no claim) until
//!   `speaker.confirmed` for that session is appended, or its timeout.
//! - The clock is a manual one, so the day passes in a second. With
//!   `Engine::start` and the system clock the same code waits for real.
//!
//! ```text
//! cargo run --example workflow            # a temp-file database
//! cargo run --example workflow -- app.db  # keep it: reflexr runs steps <id> --db app.db
//! ```

use std::time::Duration;

use reflexr::{
    Decision, Engine, Enqueue, EventMatch, ManualClock, NewEvent, RetryPolicy, Rule, RunState,
};
use serde_json::{Value, json};

const WS: &str = "events";
const HOUR: Duration = Duration::from_secs(3600);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let dir = tempfile::tempdir()?;
    let path = std::env::args()
        .nth(1)
        .map_or_else(|| dir.path().join("events.db"), Into::into);
    let clock = ManualClock::new(1_800_000_000_000);
    let engine = Engine::builder(&path).clock(clock.clone()).open()?;
    engine.ensure_workspace(WS, &["session.moved", "speaker.confirmed"])?;
    engine.write(|tx| {
        tx.execute(
            "CREATE TABLE IF NOT EXISTS moves (session TEXT PRIMARY KEY, confirmed INTEGER, notified INTEGER)",
            [],
        )
    })?;

    // Once per move, a workflow run.
    engine.register_rule(
        Rule::new("session-moved", WS)
            .on(["session.moved"])
            .action("reschedule")
            .retry(RetryPolicy::attempts(5))
            .decide(|event| Ok(Decision::Fire(event.json()?.clone()))),
    )?;

    // The workflow.
    engine.register_action("reschedule", |run, ctx| {
        let moved: Value = run.input()?;
        let session = moved["session"].as_str().unwrap_or_default().to_string();
        let speaker = moved["speaker"].as_str().unwrap_or_default().to_string();

        // Outside the file, at least once: the mail carries the step's key,
        // so a mail service can drop a repeat.
        ctx.step("tell-speaker", |step| {
            println!(
                "  mail to {speaker}: {session} moved to {} (key {})",
                moved["room"],
                step.idempotency_key()
            );
            Ok::<_, std::io::Error>(())
        })?;

        // The log is the mailbox: the confirmation is found whenever it was
        // appended after the run began.
        let confirmed = EventMatch::new(WS, "speaker.confirmed").subject(&session);
        let mut answer = ctx.wait_for_event("confirmed-within-1h", &confirmed, Some(HOUR))?;
        if answer.is_none() {
            ctx.step("remind-speaker", |_| {
                println!("  reminder to {speaker}: please confirm {session}");
                Ok::<_, std::io::Error>(())
            })?;
            answer = ctx.wait_for_event("confirmed-within-24h", &confirmed, Some(23 * HOUR))?;
        }
        let Some(answer) = answer else {
            ctx.step_tx("record-unconfirmed", |tx| {
                tx.execute(
                    "INSERT INTO moves (session, confirmed, notified) VALUES (?1, 0, 0)",
                    [&session],
                )?;
                Ok(())
            })?;
            return Ok(());
        };
        // Code between steps runs again on every attempt (this line prints
        // once per wake from here on); what must happen once is a step.
        println!(
            "  this attempt sees {speaker}'s confirmation, #{}",
            answer.seq
        );

        // One child run per attendee, spawned once; the join waits for them
        // all without holding a thread.
        let attendees: Vec<String> = serde_json::from_value(moved["attendees"].clone())?;
        let mut children = Vec::new();
        for (i, attendee) in attendees.iter().enumerate() {
            let notify = Enqueue::new(
                "notify-attendee",
                &json!({ "to": attendee, "session": session }),
            );
            children.push(ctx.spawn(("notify", i), notify)?);
        }
        let ends = ctx.join("attendees-notified", &children)?;
        let notified = ends.iter().filter(|end| end.succeeded()).count() as i64;

        // The application's row and the step's record commit together.
        ctx.step_tx("record-done", |tx| {
            tx.execute(
                "INSERT INTO moves (session, confirmed, notified) VALUES (?1, 1, ?2)",
                rusqlite::params![session, notified],
            )?;
            Ok(())
        })?;
        ctx.set_output(&json!({ "session": session, "notified": notified }))?;
        Ok(())
    })?;

    engine.register_action("notify-attendee", |run, ctx| {
        let input: Value = run.input()?;
        println!("  push to {}: {} has moved", input["to"], input["session"]);
        ctx.set_output(&input["to"])?;
        Ok(())
    })?;

    println!("09:00 the organiser moves session/42");
    engine.write(|tx| {
        let moved = NewEvent::new("session.moved", "session/42", "organiser", tx.now_ms()).payload(
            &json!({
                "session": "session/42", "room": "B2", "speaker": "ada@example.org",
                "attendees": ["bo@example.org", "cy@example.org", "di@example.org"],
            }),
        );
        tx.append(WS, &moved)
    })?;
    engine.run_until_idle()?;
    let run = engine.runs(Some(RunState::Ready), 10)?.remove(0);
    println!(
        "  the workflow {} is suspended: no thread, no claim",
        run.id
    );

    println!("10:00 an hour without an answer");
    clock.advance(HOUR);
    engine.run_until_idle()?;

    println!("10:30 the speaker confirms");
    clock.advance(HOUR / 2);
    engine.append(
        WS,
        &NewEvent::new(
            "speaker.confirmed",
            "session/42",
            "ada@example.org",
            engine.now_ms(),
        ),
    )?;
    engine.run_until_idle()?;

    let done = engine.run(&run.id)?.expect("the run");
    println!(
        "the workflow {}: {}",
        done.state,
        done.output.unwrap_or_default()
    );
    println!("its timeline:");
    for step in engine.run_steps(&run.id)? {
        println!(
            "  {:>2} {:<22} {:<6} {:<7} attempt {} {} bytes",
            step.position,
            step.name,
            step.kind.as_str(),
            step.state.as_str(),
            step.attempt,
            step.output_bytes
        );
    }
    Ok(())
}
