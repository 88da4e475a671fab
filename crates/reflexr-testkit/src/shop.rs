//! The shop the surface tests share (`crates/reflexr-mcp/tests/mcp.rs`,
//! `crates/reflexr-cli/tests/pg_surfaces.rs`): `order` events fire a charge per customer,
//! which fails for customers whose name starts with `bad` (their scope
//! blocks). Generic over the backend.

use reflexr::{Backend, Decision, Engine, NewEvent, OnDeadLetter, RetryPolicy, Rule, Scope};
use serde_json::{Value, json};

/// Registers the charge rule and action on `e` (whose workspace `shop`
/// accepts `order`), appends four orders — two of them bad — and drains.
pub fn stock<B: Backend>(e: &Engine<B>) {
    e.register_rule(
        Rule::new("charge", "shop")
            .on(["order"])
            .scope(Scope::payload("customer"))
            .action("charge")
            .retry(RetryPolicy::never())
            .on_dead_letter(OnDeadLetter::Block)
            .decide(|ev| Ok(Decision::Fire(ev.payload()?))),
    )
    .unwrap();
    e.register_action("charge", |run, _| {
        let input: Value = run.input()?;
        if input["customer"].as_str().unwrap().starts_with("bad") {
            return Err("card declined".into());
        }
        Ok(())
    })
    .unwrap();
    for c in ["ada", "bad-1", "grace", "bad-2"] {
        e.append(
            "shop",
            &NewEvent::new("order", format!("customer/{c}"), c, 0)
                .payload(&json!({ "customer": c })),
        )
        .unwrap();
    }
    e.run_until_idle().unwrap();
}
