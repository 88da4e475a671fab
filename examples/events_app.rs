//! ADR 0011's story, end to end: an events app whose session edits notify
//! the guests who RSVPed, by email and push, from one jobs loop.
//!
//! - Sessions, RSVPs and devices live in the application's own tables.
//! - Editing a session logs `session.changed` (before and after) in the same
//!   transaction as the edit; an edit that fails leaves neither.
//! - A reaction fans each change out: one email per RSVP, one push per device.
//!   Its deliveries commit with its cursor, so they are enqueued once.
//! - Email is retried (a failed send is tried again); push is best effort,
//!   sent once and not retried.
//! - Deleting a session notifies those who had RSVPed (the event carries them:
//!   they are gone from the tables afterwards).
//! - An attendee-count reminder runs on its schedule, at most once per
//!   occurrence.
//!
//! ```text
//! cargo run --example events_app            # a temp-file database
//! cargo run --example events_app -- app.db  # keep it, to look with the reflexr CLI
//! cargo run --example events_app -- app.db --expired-tablets 3   # 3 more guests whose
//!                                           # push fails: more dead letters to look at
//! ```

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use reflexr::{
    ChannelPolicy, Delivery, Engine, Guarantee, Job, NewEvent, Reaction, RetryPolicy, RunState, Tx,
};
use serde_json::json;

const WS: &str = "events-app";

/// The session repository: every logged mutation takes the actor and the time
/// from its caller, and appends its change in its own transaction.
fn edit_session(engine: &Engine, actor: &str, id: i64, room: &str) -> reflexr::Result<()> {
    engine.write(|tx| {
        let before = session(tx, id)?;
        if room.is_empty() {
            return Err(reflexr::Error::Invalid {
                field: "room",
                reason: "a session needs a room".into(),
            });
        }
        tx.execute("UPDATE sessions SET room = ?2 WHERE id = ?1", (id, room))?;
        let after = session(tx, id)?;
        let at = tx.now_ms();
        tx.append(
            WS,
            &NewEvent::new("session.changed", format!("session/{id}"), actor, at)
                .payload(&json!({ "id": id, "before": before, "after": after })),
        )?;
        Ok(())
    })
}

fn delete_session(engine: &Engine, actor: &str, id: i64) -> reflexr::Result<()> {
    engine.write(|tx| {
        let deleted = session(tx, id)?;
        let mut stmt = tx
            .conn()
            .prepare("SELECT guest, email FROM rsvps WHERE session_id = ?1")?;
        let guests: Vec<serde_json::Value> = stmt
            .query_map([id], |r| {
                Ok(json!({ "guest": r.get::<_, String>(0)?, "email": r.get::<_, String>(1)? }))
            })?
            .collect::<Result<_, _>>()?;
        tx.execute("DELETE FROM rsvps WHERE session_id = ?1", [id])?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", [id])?;
        let at = tx.now_ms();
        tx.append(
            WS,
            &NewEvent::new("session.deleted", format!("session/{id}"), actor, at)
                .payload(&json!({ "session": deleted, "guests": guests })),
        )?;
        Ok(())
    })
}

fn session(tx: &Tx<'_>, id: i64) -> reflexr::Result<serde_json::Value> {
    Ok(tx.conn().query_row(
        "SELECT title, room FROM sessions WHERE id = ?1",
        [id],
        |r| Ok(json!({ "title": r.get::<_, String>(0)?, "room": r.get::<_, String>(1)? })),
    )?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let dir = tempfile::tempdir()?;
    let mut args = std::env::args().skip(1);
    let mut path = dir.path().join("events.db");
    let mut expired_tablets = 0usize;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--expired-tablets" => {
                expired_tablets = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--expired-tablets takes a number")?;
            }
            p => path = std::path::PathBuf::from(p),
        }
    }
    let engine = Engine::builder(&path).open()?;
    let t0 = Instant::now();
    let log = move |what: String| println!("{:>5} ms  {what}", t0.elapsed().as_millis());

    engine.ensure_workspace(WS, &["session.changed", "session.deleted"])?;
    engine.write(|tx| {
        tx.conn().execute_batch(
            "CREATE TABLE sessions (id INTEGER PRIMARY KEY, title TEXT NOT NULL, room TEXT NOT NULL);
             CREATE TABLE rsvps (session_id INTEGER NOT NULL, guest TEXT NOT NULL, email TEXT NOT NULL);
             CREATE TABLE devices (guest TEXT NOT NULL, token TEXT NOT NULL);
             INSERT INTO sessions VALUES (1, 'Rust in anger', 'Room A'), (2, 'SQLite at the edge', 'Room C');
             INSERT INTO rsvps VALUES (1, 'ada', 'ada@example.com'), (1, 'grace', 'grace@example.com'),
                                      (2, 'alan', 'alan@example.com');
             INSERT INTO devices VALUES ('ada', 'phone-ada'), ('grace', 'phone-grace'),
                                        ('grace', 'tablet-grace-expired');",
        )?;
        // More guests of the first session, each with an expired tablet.
        for i in 1..=expired_tablets {
            tx.execute(
                "INSERT INTO rsvps VALUES (1, ?1, ?2)",
                (format!("guest{i}"), format!("guest{i}@example.com")),
            )?;
            tx.execute(
                "INSERT INTO devices VALUES (?1, ?2)",
                (format!("guest{i}"), format!("tablet-guest{i}-expired")),
            )?;
        }
        Ok(())
    })?;

    // Email: retried. grace's mail server refuses the first attempt.
    let (sent_tx, sent) = mpsc::channel::<String>();
    let failed_once = Mutex::new(HashSet::new());
    let mail_log = log;
    let mail_sent = Mutex::new(sent_tx.clone());
    engine.register_channel(
        "email",
        ChannelPolicy::Retried(RetryPolicy::attempts(3).fixed(Duration::from_millis(200))),
        move |msg, _ctx| {
            let to = msg.to.clone().unwrap_or_default();
            if to.starts_with("grace") && failed_once.lock().unwrap().insert(msg.id.clone()) {
                mail_log(format!(
                    "email  {} to {to}: SMTP 451, try later",
                    msg.template
                ));
                return Err("SMTP 451".into());
            }
            mail_log(format!(
                "email  {} to {to} (attempt {})",
                msg.template, msg.attempt
            ));
            mail_sent.lock().unwrap().send(msg.id.clone()).unwrap();
            Ok(())
        },
    )?;
    // Push: best effort. An expired token fails, and is not retried.
    let push_log = log;
    let push_sent = Mutex::new(sent_tx);
    engine.register_channel("push", ChannelPolicy::BestEffort, move |msg, _ctx| {
        let to = msg.to.clone().unwrap_or_default();
        push_sent.lock().unwrap().send(msg.id.clone()).unwrap();
        if to.ends_with("expired") {
            push_log(format!(
                "push   {} to {to}: token expired (not retried)",
                msg.template
            ));
            return Err("token expired".into());
        }
        push_log(format!("push   {} to {to}", msg.template));
        Ok(())
    })?;

    // The reaction: whoever has RSVPed when it runs hears of an edit; the
    // deletion's guests come from the event.
    engine.register_reaction(
        Reaction::new("notifier", WS)
            .on(["session.changed", "session.deleted"])
            .handle(|event, tx| {
                let p: serde_json::Value = event.payload()?;
                if event.event_type == "session.deleted" {
                    for g in p["guests"].as_array().into_iter().flatten() {
                        tx.deliver(
                            &Delivery::new("email", "session-cancelled")
                                .to(g["email"].as_str().unwrap_or_default())
                                .props(&json!({ "title": p["session"]["title"] }))
                                .caused_by(event),
                        )?;
                    }
                    return Ok(());
                }
                let mut stmt = tx.conn().prepare(
                    "SELECT r.guest, r.email, d.token FROM rsvps r \
                     LEFT JOIN devices d ON d.guest = r.guest WHERE r.session_id = ?1",
                )?;
                let rows: Vec<(String, String, Option<String>)> = stmt
                    .query_map([p["id"].as_i64()], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })?
                    .collect::<Result<_, _>>()?;
                let mut mailed = HashSet::new();
                for (guest, email, token) in rows {
                    let props = json!({ "title": p["after"]["title"], "room": p["after"]["room"] });
                    if mailed.insert(guest) {
                        tx.deliver(
                            &Delivery::new("email", "session-moved")
                                .to(email)
                                .props(&props)
                                .caused_by(event),
                        )?;
                    }
                    if let Some(token) = token {
                        tx.deliver(
                            &Delivery::new("push", "session-moved")
                                .to(token)
                                .props(&props)
                                .caused_by(event),
                        )?;
                    }
                }
                Ok(())
            }),
    )?;

    // The attendee-count reminder: every 400 ms here (every few minutes in
    // the app), at most once per occurrence.
    let reminders = Arc::new(AtomicUsize::new(0));
    let (remind_tx, reminded) = mpsc::channel();
    let remind_tx = Mutex::new(remind_tx);
    let r = Arc::clone(&reminders);
    let job_log = log;
    engine.register_job(
        Job::every("attendee-reminders", Duration::from_millis(400))
            .guarantee(Guarantee::AtMostOnce)
            .handler(move |occurrence, ctx| {
                let counts: Vec<(String, i64)> = ctx.with_reader(|c| {
                    let mut s = c.prepare(
                        "SELECT s.title, count(r.guest) FROM sessions s \
                         LEFT JOIN rsvps r ON r.session_id = s.id GROUP BY s.id ORDER BY s.id",
                    )?;
                    let rows = s
                        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect::<Result<_, _>>()?;
                    Ok(rows)
                })?;
                job_log(format!(
                    "job    attendee reminder #{} (due {}): {counts:?}",
                    r.fetch_add(1, Ordering::SeqCst) + 1,
                    occurrence.run_id
                ));
                remind_tx.lock().unwrap().send(()).unwrap();
                Ok(())
            }),
    )?;

    engine.start()?;

    log("admin moves 'Rust in anger' to Hall B".into());
    edit_session(&engine, "admin", 1, "Hall B")?;
    // ada: 1 email, 1 push; grace: 1 email (refused once, then sent) and 2
    // pushes (one to an expired token, tried once): 5 sends in all; each
    // extra guest adds an email and a failed push.
    for _ in 0..5 + 2 * expired_tablets {
        sent.recv_timeout(Duration::from_secs(30))?;
    }

    log("an edit with no room is refused: nothing changes, nobody is told".into());
    let refused = edit_session(&engine, "admin", 2, "");
    log(format!("  -> {}", refused.unwrap_err()));

    log("admin deletes 'SQLite at the edge'".into());
    delete_session(&engine, "admin", 2)?;
    sent.recv_timeout(Duration::from_secs(30))?;

    reminded.recv_timeout(Duration::from_secs(30))?;
    reminded.recv_timeout(Duration::from_secs(30))?;
    engine.shutdown();

    let runs = engine.runs(None, 100)?;
    let count = |s: RunState| runs.iter().filter(|r| r.state == s).count();
    println!(
        "\nruns: {} succeeded, {} dead; retried email attempts: {}; dead letters: {}",
        count(RunState::Succeeded),
        count(RunState::Dead),
        runs.iter()
            .filter(|r| r.kind == reflexr::inspect::RunKind::Delivery && r.attempt > 1)
            .count(),
        engine.dead_letters(false, 100)?.len()
    );
    for d in engine.dead_letters(false, 100)? {
        println!("dead letter: {} {} ({})", d.consumer, d.reason, d.error);
    }
    Ok(())
}
