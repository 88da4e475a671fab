//! reflexr in one page: an application writes its own rows and the events
//! that describe them in one transaction, then a consumer reads the log after
//! its cursor.
//!
//! ```text
//! cargo run --example quickstart            # a temp-file database
//! cargo run --example quickstart -- app.db  # keep the file, to open it with sqlite3
//! ```

use reflexr::{Engine, NewEvent, Query};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct SessionChanged {
    id: i64,
    before: Option<String>,
    after: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let dir = tempfile::tempdir()?;
    let path = match std::env::args().nth(1) {
        Some(p) => std::path::PathBuf::from(p),
        None => dir.path().join("quickstart.db"),
    };
    let engine = Engine::open(&path)?;
    println!(
        "opened {} (synchronous={})",
        path.display(),
        engine.synchronous().as_str()
    );

    // A workspace is a named log; it accepts the event types registered for it.
    engine.ensure_workspace("events-app", &["session.changed", "session.deleted"])?;
    engine.write(|tx| {
        tx.execute(
            "CREATE TABLE IF NOT EXISTS sessions (id INTEGER PRIMARY KEY, title TEXT NOT NULL)",
            [],
        )
    })?;

    // The application's rows and their events commit together, or not at all.
    for (id, title) in [(1, "Opening keynote"), (2, "SQLite at the edge")] {
        let appended = engine.write(|tx| {
            let before: Option<String> = tx
                .conn()
                .query_row("SELECT title FROM sessions WHERE id = ?1", [id], |r| {
                    r.get(0)
                })
                .ok();
            tx.execute(
                "INSERT INTO sessions (id, title) VALUES (?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET title = excluded.title",
                (id, title),
            )?;
            let change = SessionChanged {
                id,
                before,
                after: title.to_string(),
            };
            let at = tx.now_ms();
            let event = NewEvent::new("session.changed", format!("session/{id}"), "admin", at)
                .payload(&change);
            tx.append("events-app", &event)
        })?;
        println!("saved session {id} and appended event seq {}", appended.seq);
    }

    // A failed transaction leaves neither the row nor the event behind.
    let failed = engine.write(|tx| {
        tx.execute("UPDATE sessions SET title = 'never saved' WHERE id = 1", [])?;
        let at = tx.now_ms();
        tx.append(
            "events-app",
            &NewEvent::new("session.changed", "session/1", "admin", at),
        )?;
        Err::<(), _>(reflexr::Error::Invalid {
            field: "title",
            reason: "refused by the application, after the append".into(),
        })
    });
    println!(
        "a write that failed after its append: {}",
        failed.unwrap_err()
    );

    // A consumer reads after its cursor, handles, and saves the cursor.
    let cursor = engine.cursor("mailer", "events-app")?;
    let page = engine.read(&Query::new("events-app").after(cursor))?;
    for event in &page {
        let change: SessionChanged = event.payload()?;
        println!(
            "mailer sees seq {} {} by {}: {:?} -> {:?}",
            event.seq, event.event_type, event.actor, change.before, change.after
        );
    }
    if let Some(last) = page.last() {
        engine.save_cursor("mailer", "events-app", last.seq)?;
    }
    let title: String = engine.with_reader(|conn| {
        Ok(conn.query_row("SELECT title FROM sessions WHERE id = 1", [], |r| r.get(0))?)
    })?;
    println!(
        "session 1 is still {title:?}; mailer's cursor is at {}; {} events in the log",
        engine.cursor("mailer", "events-app")?,
        engine.head_seq()?
    );
    Ok(())
}
