//! The operators' surfaces on an engine on PostgreSQL (feature
//! `postgres`): the administration API (REST and metrics), the MCP tools
//! and the `reflexr` CLI answer from the server's tables, and their
//! interventions change them on the record (DESIGN.md, "Surfaces"; invariants 5 and 8 through
//! the API). The routes and tools themselves are tested at length on
//! SQLite (`crates/reflexr-admin/tests/admin.rs`, `crates/reflexr-mcp/tests/mcp.rs`); this proves the same code
//! serves the other backend.
#![cfg(all(feature = "postgres", feature = "admin", feature = "mcp"))]

use reflexr_testkit as common;

use common::backend::{PgSchema, TestBackend};
use common::http::Api;
use reflexr::{Engine, ManualClock, Postgres, RunState};
use reflexr_admin::AdminConfig;
use reflexr_mcp::{Mcp, McpConfig};
use serde_json::{Value, json};

/// The shop of the surface tests (`common::shop`), on PostgreSQL.
fn shop(place: &PgSchema) -> Engine<Postgres> {
    let e = Postgres::open(place, &ManualClock::new(1_800_000_000_000), "shop");
    e.ensure_workspace("shop", &["order"]).unwrap();
    common::shop::stock(&e);
    e
}

fn who(reason: &str) -> Value {
    json!({ "operator": "ops@example", "reason": reason })
}

/// Reads answer what the engine says; a retry and an unblock through the
/// API change the runs and lanes, and are in the audit log.
#[test]
fn the_admin_api_serves_an_engine_on_postgres() {
    let place = PgSchema::new();
    let e = shop(&place);
    let server = reflexr_admin::AdminServer::start(
        &e,
        AdminConfig::new().listen("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    let api = Api::new(server.local_addr(), None);

    let (st, status) = api.get("/api/v1/status");
    assert_eq!(st, 200, "{status}");
    assert_eq!(status["runs"]["dead"], 2);
    assert_eq!(status["blocked_lanes"], 2);
    let (_, stats) = api.get("/api/v1/stats");
    assert_eq!(stats["counters"]["runs_succeeded"], 2);
    let (_, dead) = api.get("/api/v1/runs?state=dead");
    let dead = dead["runs"].as_array().unwrap().clone();
    assert_eq!(dead.len(), 2);
    let (_, rules) = api.get("/api/v1/rules");
    assert_eq!(rules[0]["name"], "charge");
    let (st, _) = api.get("/api/v1/followers");
    assert_eq!(st, 200);
    let (st, metrics) = api.get_text("/metrics");
    assert_eq!(st, 200);
    assert!(metrics.contains("reflexr_runs"), "{metrics}");

    let id = dead[0]["id"].as_str().unwrap();
    let (st, body) = api.post(&format!("/api/v1/runs/{id}/retry"), who("card fixed"));
    assert_eq!(st, 200, "{body}");
    assert_eq!(e.run(id).unwrap().unwrap().state, RunState::Ready);
    let (_, lanes) = api.get("/api/v1/lanes");
    let blocked = lanes["blocked"].as_array().unwrap().clone();
    assert_eq!(
        blocked.len(),
        1,
        "the retried run's scope is no longer blocked"
    );
    let lane = &blocked[0];
    let (st, _) = api.post(
        "/api/v1/lanes/unblock",
        json!({ "rule": lane["rule"], "scope": lane["scope"],
                "operator": "ops@example", "reason": "go on" }),
    );
    assert_eq!(st, 200);
    assert!(e.blocked_lanes(10).unwrap().is_empty());
    let actions: Vec<String> = e
        .audit_log(10)
        .unwrap()
        .iter()
        .map(|a| a.action.to_string())
        .collect();
    assert_eq!(actions, ["unblock", "retry_run"]);
    let (st, _) = api.post("/api/v1/followers/nope/restart", who("x"));
    assert_eq!(st, 404, "no such follower");
    server.shutdown();
}

/// The MCP tools read and act on an engine on PostgreSQL as on a file.
#[test]
fn the_mcp_tools_serve_an_engine_on_postgres() {
    let place = PgSchema::new();
    let e = shop(&place);
    let mcp = Mcp::new(e.clone(), McpConfig::new());
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let ask = |id: i64, method: &str, params: Value| -> Value {
        let msg = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        serde_json::from_str(&mcp.handle_line(&msg.to_string()).expect("an answer")).unwrap()
    };
    let list = ask(1, "tools/list", json!({ "_meta": meta }));
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 25);
    let status = ask(
        2,
        "tools/call",
        json!({ "_meta": meta, "name": "status", "arguments": {} }),
    );
    assert_eq!(
        status["result"]["structuredContent"]["runs"]["dead"], 2,
        "{status}"
    );
    let retry = |id: i64, dry_run: bool| {
        ask(
            id,
            "tools/call",
            json!({ "_meta": meta, "name": "retry",
                    "arguments": { "target": "runs", "filter": { "action": "charge" },
                                   "reason": "card fixed", "dry_run": dry_run } }),
        )["result"]["structuredContent"]
            .clone()
    };
    let dry = retry(3, true);
    assert_eq!(
        (&dry["dry_run"], &dry["matched"]),
        (&json!(true), &json!(2))
    );
    assert_eq!(e.runs(Some(RunState::Dead), 10).unwrap().len(), 2);
    let done = retry(4, false);
    assert_eq!(done["done"].as_array().unwrap().len(), 2, "{done}");
    assert!(e.runs(Some(RunState::Dead), 10).unwrap().is_empty());
    assert_eq!(
        e.audit_log(10).unwrap().len(),
        2,
        "each retry on the record"
    );
}

/// The `reflexr` CLI opens a PostgreSQL database by its connection string:
/// `status` reads it, `retry` changes it on the record.
#[test]
fn the_cli_operates_a_database_on_postgres() {
    let place = PgSchema::new();
    let e = shop(&place);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_reflexr"))
            .arg(place.config())
            .args(args)
            .output()
            .expect("run the CLI");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let status: Value = serde_json::from_str(&cli(&["--json", "status"])).unwrap();
    assert_eq!(status["runs"]["dead"], 2, "{status}");
    let dead = e.runs(Some(RunState::Dead), 10).unwrap();
    cli(&[
        "retry",
        &dead[0].id,
        "--operator",
        "ops",
        "--reason",
        "card fixed",
    ]);
    assert_eq!(e.run(&dead[0].id).unwrap().unwrap().state, RunState::Ready);
    assert_eq!(e.audit_log(5).unwrap()[0].operator, "ops");
}
