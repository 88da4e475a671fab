//! `bookings <FILE>`: a new file holding the booking workflow's two runs
//! ([`reflexr_testkit::workflow::stock`]: one succeeded, one suspended at
//! its wait), for the tests that drive the surfaces from outside (the
//! console's browser tests). Prints `{"done": id, "waiting": id}`.

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
    engine.shutdown();
    println!(
        "{}",
        serde_json::json!({ "done": b.done, "waiting": b.waiting })
    );
}
