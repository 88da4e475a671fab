//! `bookings <FILE>`: a new file holding the booking workflow's two runs
//! ([`reflexr_testkit::workflow::stock`]: one succeeded, one suspended at
//! its wait), for the tests that drive the surfaces from outside (the
//! console's browser tests), and a run of the action `import` that logged
//! two lines and said it got 3 of 4 done. Prints `{"done": id, "waiting":
//! id, "logged": id}`.

fn main() {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: bookings <FILE>");
        std::process::exit(2);
    };
    let engine = reflexr::Engine::open(path).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1);
    });
    let b = reflexr_testkit::workflow::stock(&engine);
    let logged = import(&engine).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1);
    });
    engine.shutdown();
    println!(
        "{}",
        serde_json::json!({ "done": b.done, "waiting": b.waiting, "logged": logged })
    );
}

/// A run that logs two lines and its progress, run to its end, with the
/// trace context of the request that enqueued it: its id.
fn import(engine: &reflexr::Engine) -> reflexr::Result<String> {
    engine.register_action("import", |_, ctx| {
        ctx.log(
            log::Level::Info,
            "fetched the file",
            serde_json::json!({ "rows": 4 }),
        )?;
        ctx.progress(3, 4)?;
        ctx.log(log::Level::Warn, "row 4 is odd", serde_json::Value::Null)?;
        Ok(())
    })?;
    let run = engine.enqueue(
        &reflexr::Enqueue::new("import", &serde_json::json!({ "file": "talks.csv" }))
            .traceparent(IMPORT_TRACEPARENT),
    )?;
    engine.run_until_idle()?;
    Ok(run.id)
}

/// The trace context the import run carries (the browser tests look for it
/// on the run's page).
const IMPORT_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
