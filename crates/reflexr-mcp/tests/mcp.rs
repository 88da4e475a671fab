//! MCP's protocol edges: both revisions' handshakes, version mismatch, each
//! JSON-RPC error code, read-only mode, the HTTP transport with and without
//! the token, and random input that must neither crash the server nor
//! change the file (DESIGN.md "Surfaces"; invariant 10: bad input is a
//! typed error and changes nothing).

use reflexr_testkit as common;

use common::http::Api;
use common::{Arrange, Scene};
use proptest::prelude::*;
use reflexr::Engine;
use reflexr_admin::AdminConfig;
use reflexr_mcp::{Mcp, McpConfig};
use serde_json::{Value, json};

const MODERN: &str = "2026-07-28";

/// A shop whose charge fails for customers named `bad*`: two dead runs,
/// two dead letters, one blocked lane.
fn shop(s: &Scene) -> Engine {
    let e = s.open("test").workspace("shop", &["order"]);
    common::shop::stock(&e);
    e
}

fn ask(mcp: &Mcp, msg: Value) -> Value {
    let line = mcp.handle_line(&msg.to_string()).expect("an answer");
    serde_json::from_str(&line).unwrap()
}

fn request(id: i64, method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

fn code(answer: &Value) -> i64 {
    answer["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {answer}"))
}

/// What the file says, for "nothing changed".
fn fingerprint(e: &Engine) -> Value {
    json!({
        "stats": e.stats().unwrap().counters,
        "runs": e.runs(None, 1000).unwrap().iter().map(|r| (r.id.clone(), r.state.as_str())).collect::<Vec<_>>(),
        "dead_letters": e.dead_letters(true, 1000).unwrap().iter().map(|d| (d.id, d.resolution.map(|r| r.as_str()))).collect::<Vec<_>>(),
        "audit": e.audit_log(1000).unwrap().len(),
        "cursors": e.cursors().unwrap().iter().map(|c| c.position).collect::<Vec<_>>(),
        "blocked": e.blocked_lanes(100).unwrap().len(),
    })
}

#[test]
fn initialize_negotiates_the_clients_version_or_offers_the_newest_it_has() {
    let s = Scene::new();
    let mcp = Mcp::new(shop(&s), McpConfig::new());
    for (asked, answered) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2024-11-05", "2024-11-05"),
        ("1999-01-01", "2025-11-25"),
    ] {
        let a = ask(
            &mcp,
            request(
                1,
                "initialize",
                json!({ "protocolVersion": asked, "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } }),
            ),
        );
        assert_eq!(a["result"]["protocolVersion"], answered, "{asked}");
        assert_eq!(a["result"]["serverInfo"]["name"], "reflexr");
        assert!(a["result"]["capabilities"]["tools"].is_object());
        assert!(a["result"]["capabilities"]["resources"].is_object());
        assert!(a["result"].get("resultType").is_none(), "the old shape");
    }
    // Notifications are never answered.
    assert!(
        mcp.handle_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .is_none()
    );
    assert_eq!(
        ask(&mcp, request(2, "ping", json!({})))["result"],
        json!({})
    );
}

#[test]
fn the_stateless_revision_discovers_and_answers_in_its_own_shape() {
    let s = Scene::new();
    let mcp = Mcp::new(shop(&s), McpConfig::new());
    let d = ask(
        &mcp,
        request(1, "server/discover", json!({ "_meta": meta() })),
    );
    let r = &d["result"];
    assert_eq!(r["resultType"], "complete");
    assert_eq!(r["supportedVersions"][0], MODERN);
    assert!(
        r["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("2025-11-25"))
    );
    assert!(r["ttlMs"].is_u64() && r["cacheScope"].is_string());
    assert_eq!(
        r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "reflexr"
    );
    // Without initialize: every request carries its version.
    let list = ask(&mcp, request(2, "tools/list", json!({ "_meta": meta() })));
    assert_eq!(list["result"]["resultType"], "complete");
    assert!(list["result"]["ttlMs"].is_u64());
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 25);
    let call = ask(
        &mcp,
        request(
            3,
            "tools/call",
            json!({ "_meta": meta(), "name": "status", "arguments": {} }),
        ),
    );
    assert_eq!(call["result"]["resultType"], "complete");
    assert_eq!(call["result"]["structuredContent"]["runs"]["dead"], 2);
    // Gone in this revision.
    assert_eq!(
        code(&ask(&mcp, request(4, "ping", json!({ "_meta": meta() })))),
        -32601
    );
    // A resource that is not there: -32602 with the uri in this revision.
    let missing = ask(
        &mcp,
        request(
            5,
            "resources/read",
            json!({ "_meta": meta(), "uri": "reflexr://runs/nope" }),
        ),
    );
    assert_eq!(code(&missing), -32602);
    assert_eq!(missing["error"]["data"]["uri"], "reflexr://runs/nope");
}

#[test]
fn an_unsupported_version_gets_the_supported_list_and_a_missing_meta_key_is_invalid_params() {
    let s = Scene::new();
    let mcp = Mcp::new(shop(&s), McpConfig::new());
    let a = ask(
        &mcp,
        request(
            1,
            "tools/list",
            json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "2030-01-01", "io.modelcontextprotocol/clientCapabilities": {} } }),
        ),
    );
    assert_eq!(code(&a), -32022);
    assert_eq!(a["error"]["data"]["requested"], "2030-01-01");
    assert_eq!(a["error"]["data"]["supported"][0], MODERN);
    let b = ask(
        &mcp,
        request(
            2,
            "tools/list",
            json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": MODERN } }),
        ),
    );
    assert_eq!(code(&b), -32602, "clientCapabilities is required");
}

#[test]
fn each_json_rpc_error_has_its_code() {
    let s = Scene::new();
    let mcp = Mcp::new(shop(&s), McpConfig::new());
    let line =
        |text: &str| -> Value { serde_json::from_str(&mcp.handle_line(text).unwrap()).unwrap() };
    let parse = line("{not json");
    assert_eq!((code(&parse), &parse["id"]), (-32700, &Value::Null));
    assert_eq!(code(&line("[]")), -32600, "a batch");
    assert_eq!(code(&line("42")), -32600);
    assert_eq!(
        code(&line(r#"{"id":1,"method":"ping"}"#)),
        -32600,
        "no jsonrpc"
    );
    assert_eq!(
        code(&line(r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#)),
        -32600,
        "an object id"
    );
    assert_eq!(
        code(&line(r#"{"jsonrpc":"2.0","id":1,"method":7}"#)),
        -32600
    );
    assert_eq!(
        code(&line(r#"{"jsonrpc":"2.0","id":1,"method":"nope/nope"}"#)),
        -32601
    );
    assert_eq!(
        code(&line(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[1]}"#
        )),
        -32602
    );
    assert_eq!(
        code(&line(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"x"}}"#
        )),
        -32602
    );
    let unknown = ask(
        &mcp,
        request(1, "tools/call", json!({ "name": "drop_tables" })),
    );
    assert_eq!(code(&unknown), -32602);
    assert_eq!(
        code(&ask(&mcp, request(1, "tools/call", json!({})))),
        -32602
    );
    assert_eq!(
        code(&ask(
            &mcp,
            request(1, "resources/read", json!({ "uri": "reflexr://nope" }))
        )),
        -32002
    );
    // A string id comes back as it went.
    let a = ask(
        &mcp,
        json!({ "jsonrpc": "2.0", "id": "abc", "method": "ping" }),
    );
    assert_eq!(a["id"], "abc");
    // A response (we never ask anything) is not answered.
    assert!(
        mcp.handle_line(r#"{"jsonrpc":"2.0","id":9,"result":{}}"#)
            .is_none()
    );
}

#[test]
fn a_tool_that_fails_says_why_in_its_result_and_changes_nothing() {
    let s = Scene::new();
    let e = shop(&s);
    let mcp = Mcp::new(e.clone(), McpConfig::new());
    let before = fingerprint(&e);
    let tool = |name: &str, args: Value| {
        ask(
            &mcp,
            request(1, "tools/call", json!({ "name": name, "arguments": args })),
        )
    };
    for (name, args, says) in [
        ("get_run", json!({ "id": "nope" }), "no run"),
        (
            "list_events",
            json!({ "workspace": "nowhere" }),
            "workspace",
        ),
        (
            "list_events",
            json!({ "workspace": "shop", "limit": 0 }),
            "limit",
        ),
        ("list_runs", json!({ "state": "sleepy" }), "state"),
        ("list_runs", json!({ "colour": "red" }), "unknown field"),
        ("retry", json!({ "target": "runs", "ids": ["x"] }), "reason"),
        (
            "retry",
            json!({ "target": "runs", "ids": ["x"], "filter": {}, "reason": "r" }),
            "either ids or a filter",
        ),
        (
            "discard",
            json!({ "target": "dead_letters", "ids": [1], "reason": "r" }),
            "confirm: true",
        ),
        (
            "reset_cursor",
            json!({ "workspace": "shop", "kind": "rule", "name": "charge", "to": 0, "confirm": false, "reason": "r" }),
            "confirm: true",
        ),
        (
            "unblock",
            json!({ "rule": "charge", "scope": "nobody", "reason": "r" }),
            "not found",
        ),
        (
            "reset_run_to_step",
            json!({ "id": "nope", "step": "mail", "confirm": true, "reason": "r" }),
            "not found",
        ),
        (
            "reset_run_to_step",
            json!({ "id": "nope", "step": "mail", "reason": "r" }),
            "not found",
        ),
        (
            "reset_run_to_step",
            json!({ "id": "nope", "step": "mail", "confirm": true, "reason": " " }),
            "reason",
        ),
    ] {
        let a = tool(name, args);
        assert_eq!(a["result"]["isError"], true, "{name}: {a}");
        let text = a["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(says), "{name}: {text:?} should say {says:?}");
    }
    assert_eq!(fingerprint(&e), before);
}

#[test]
fn a_retry_is_a_dry_run_until_told_and_every_change_is_audited_with_the_reason() {
    let s = Scene::new();
    let e = shop(&s);
    let mcp = Mcp::new(e.clone(), McpConfig::new().operator("assistant"));
    let tool = |args: Value| {
        ask(
            &mcp,
            request(
                1,
                "tools/call",
                json!({ "name": "retry", "arguments": args }),
            ),
        )["result"]["structuredContent"]
            .clone()
    };
    let before = fingerprint(&e);
    let dry =
        tool(json!({ "target": "runs", "filter": { "action": "charge" }, "reason": "card fixed" }));
    assert_eq!(
        (dry["dry_run"].clone(), dry["matched"].clone()),
        (json!(true), json!(2))
    );
    assert_eq!(fingerprint(&e), before, "a dry run changes nothing");
    let done = tool(
        json!({ "target": "runs", "filter": { "action": "charge" }, "reason": "card fixed", "dry_run": false }),
    );
    assert_eq!(done["done"].as_array().unwrap().len(), 2);
    assert!(
        e.runs(Some(reflexr::RunState::Dead), 10)
            .unwrap()
            .is_empty()
    );
    let audit = e.audit_log(10).unwrap();
    assert_eq!(audit.len(), 2);
    assert!(
        audit
            .iter()
            .all(|a| a.operator == "assistant" && a.reason == "card fixed")
    );
}

#[test]
fn get_run_gives_a_workflows_steps_and_a_reset_to_a_step_needs_confirm_and_is_audited() {
    let s = Scene::new();
    let e = shop(&s);
    let b = common::workflow::stock(&e);
    let mcp = Mcp::new(e.clone(), McpConfig::new().operator("assistant"));
    let tool = |name: &str, args: Value| {
        ask(
            &mcp,
            request(1, "tools/call", json!({ "name": name, "arguments": args })),
        )["result"]
            .clone()
    };
    let list = ask(&mcp, request(1, "tools/list", json!({})));
    let tools = list["result"]["tools"].as_array().unwrap();
    let find = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap();
    let reset = find("reset_run_to_step");
    assert_eq!(
        (
            &reset["annotations"]["readOnlyHint"],
            &reset["annotations"]["destructiveHint"]
        ),
        (&json!(false), &json!(true))
    );
    assert!(
        find("get_run")["outputSchema"]["required"]
            .as_array()
            .unwrap()
            .contains(&json!("steps"))
    );

    // get_run and the run's resource hold the timeline Engine::run_steps gives.
    let timeline = serde_json::to_value(e.run_steps(&b.waiting).unwrap()).unwrap();
    let got = tool("get_run", json!({ "id": b.waiting }));
    assert_eq!(got["structuredContent"]["steps"], timeline);
    assert_eq!(timeline[2]["state"], "waiting");
    assert_eq!(timeline[2]["detail"]["subject"], "session/2");
    let read = ask(
        &mcp,
        request(
            2,
            "resources/read",
            json!({ "uri": format!("reflexr://runs/{}", b.waiting) }),
        ),
    );
    let text: Value =
        serde_json::from_str(read["result"]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["steps"], timeline);

    // Without confirm it says what it would forget; refusals say why. None
    // changes anything.
    let before = (fingerprint(&e), b.mailed());
    let charge = e.runs(Some(reflexr::RunState::Dead), 1).unwrap()[0]
        .id
        .clone();
    let asked = |args: Value| {
        let a = tool("reset_run_to_step", args);
        assert_eq!(a["isError"], true, "{a}");
        a["content"][0]["text"].as_str().unwrap().to_string()
    };
    let dry = asked(json!({ "id": b.done, "step": "confirmed", "reason": "resend" }));
    assert!(
        dry.contains("confirm: true")
            && dry.contains(r#"["confirmed", "mail"]"#)
            && dry.contains("may happen again"),
        "{dry}"
    );
    let begin = asked(json!({ "id": b.done, "step": "begin", "reason": "resend" }));
    assert!(begin.contains("has no step"), "{begin}");
    let begin =
        asked(json!({ "id": b.done, "step": "begin", "confirm": true, "reason": "resend" }));
    assert!(begin.contains("not found"), "{begin}");
    let ordered =
        asked(json!({ "id": charge, "step": "mail", "confirm": true, "reason": "resend" }));
    assert!(ordered.contains("ordered scope"), "{ordered}");
    assert_eq!((fingerprint(&e), b.mailed()), before);

    // Confirmed: audited as the assistant, with the reason; the mail runs
    // again, and only it.
    let done = tool(
        "reset_run_to_step",
        json!({ "id": b.done, "step": "mail", "confirm": true, "reason": "the mail bounced" }),
    );
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(
        done["structuredContent"],
        json!({ "reset": b.done, "step": "mail" })
    );
    assert_eq!(
        e.run(&b.done).unwrap().unwrap().state,
        reflexr::RunState::Ready
    );
    let entry = &e.audit_log(1).unwrap()[0];
    assert_eq!(
        (
            entry.action.as_str(),
            entry.operator.as_str(),
            entry.reason.as_str()
        ),
        ("reset_run_to_step", "assistant", "the mail bounced")
    );
    e.run_until_idle().unwrap();
    assert_eq!(b.mailed(), 2);
    assert_eq!(
        e.run(&b.done).unwrap().unwrap().state,
        reflexr::RunState::Succeeded
    );
}

#[test]
fn get_run_gives_its_progress_and_the_last_hundred_lines_of_its_log() {
    let s = Scene::new();
    let e = shop(&s);
    e.register_action("import", |run, ctx| {
        let lines: u64 = run.input::<Value>()?["lines"].as_u64().unwrap();
        for i in 1..=lines {
            ctx.log(log::Level::Info, format!("row {i}"), json!({ "row": i }))?;
            ctx.progress(i, lines)?;
        }
        Ok(())
    })
    .unwrap();
    let long = e
        .enqueue(&reflexr::Enqueue::new("import", &json!({ "lines": 130 })))
        .unwrap();
    let short = e
        .enqueue(&reflexr::Enqueue::new("import", &json!({ "lines": 2 })))
        .unwrap();
    e.run_until_idle().unwrap();
    let quiet = e
        .enqueue(
            &reflexr::Enqueue::new("import", &json!({ "lines": 1 }))
                .after(std::time::Duration::from_secs(3_600)),
        )
        .unwrap();
    let mcp = Mcp::new(e.clone(), McpConfig::new().operator("assistant"));
    let tool = |args: Value| {
        let a = ask(
            &mcp,
            request(
                1,
                "tools/call",
                json!({ "name": "get_run", "arguments": args }),
            ),
        )["result"]
            .clone();
        assert_eq!(a["isError"], false, "{a}");
        a["structuredContent"].clone()
    };
    let list = ask(&mcp, request(1, "tools/list", json!({})));
    let get_run = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "get_run")
        .unwrap()
        .clone();
    let required = get_run["outputSchema"]["required"].as_array().unwrap();
    assert!(
        required.contains(&json!("progress")) && required.contains(&json!("logs")),
        "{get_run}"
    );

    // More than a hundred lines: the last hundred, and a note of how many.
    let got = tool(json!({ "id": long.id }));
    let logs = got["logs"].as_array().unwrap();
    assert_eq!(logs.len(), 100);
    assert_eq!(
        (logs[0]["n"].clone(), logs[99]["n"].clone()),
        (json!(31), json!(130))
    );
    assert_eq!(
        serde_json::to_value(e.run_logs(&long.id, 30, 1000).unwrap()).unwrap(),
        got["logs"]
    );
    assert_eq!(logs[99]["fields"], json!({ "row": 130 }));
    let note = got["logs_note"].as_str().unwrap();
    assert!(note.contains("130") && note.contains("100"), "{note}");
    assert_eq!(
        got["progress"],
        serde_json::to_value(e.run_progress(&long.id).unwrap()).unwrap()
    );
    assert_eq!(
        (
            got["progress"]["done"].clone(),
            got["progress"]["total"].clone()
        ),
        (json!(130), json!(130))
    );
    assert_eq!(got["run"]["id"], long.id.as_str());

    // Fewer: all of them, no note; a run that has not started: none.
    let got = tool(json!({ "id": short.id }));
    assert_eq!(got["logs"].as_array().unwrap().len(), 2);
    assert!(got.get("logs_note").is_none(), "{got}");
    let got = tool(json!({ "id": quiet.id }));
    assert_eq!(
        (got["logs"].clone(), got["progress"].clone()),
        (json!([]), Value::Null)
    );
    assert!(got.get("logs_note").is_none(), "{got}");

    // The run's resource holds the same.
    let read = ask(
        &mcp,
        request(
            2,
            "resources/read",
            json!({ "uri": format!("reflexr://runs/{}", long.id) }),
        ),
    );
    let text: Value =
        serde_json::from_str(read["result"]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["logs"].as_array().unwrap().len(), 100);
    assert_eq!(text["progress"]["done"], 130);
}

#[test]
fn promote_rule_hands_a_rule_over_to_its_shadow_once_and_is_audited() {
    let s = Scene::new();
    let e = shop(&s);
    e.register_rule(
        reflexr::Rule::new("charge", "shop")
            .on(["order"])
            .scope(reflexr::Scope::payload("customer"))
            .action("charge")
            .version(2, reflexr::OnNewVersion::Continue)
            .shadow(0)
            .decide(|ev| Ok(reflexr::Decision::Fire(ev.payload()?))),
    )
    .unwrap();
    e.run_until_idle().unwrap();
    let mcp = Mcp::new(e.clone(), McpConfig::new().operator("assistant"));
    let tool = |args: Value| {
        ask(
            &mcp,
            request(
                1,
                "tools/call",
                json!({ "name": "promote_rule", "arguments": args }),
            ),
        )["result"]
            .clone()
    };
    let list = ask(&mcp, request(1, "tools/list", json!({})));
    let promote = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "promote_rule")
        .unwrap()
        .clone();
    assert_eq!(
        (
            &promote["annotations"]["readOnlyHint"],
            &promote["annotations"]["destructiveHint"]
        ),
        (&json!(false), &json!(false))
    );
    assert_eq!(
        promote["inputSchema"]["required"],
        json!(["name", "reason"])
    );

    // The rules with their versions: the live one and its shadow.
    let rules = ask(
        &mcp,
        request(
            1,
            "tools/call",
            json!({ "name": "list_rules", "arguments": {} }),
        ),
    )["result"]["structuredContent"]["rules"]
        .clone();
    let rows: Vec<(String, i64, Value)> = rules
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["version"].as_i64().unwrap(),
                r["shadow_of"].clone(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("charge".to_string(), 1, Value::Null),
            ("charge@v2".to_string(), 2, json!("charge"))
        ],
        "{rules}"
    );

    // Refusals say why and change nothing.
    let before = fingerprint(&e);
    for (args, says) in [
        (json!({ "name": "charge" }), "reason"),
        (json!({ "name": "charge", "reason": " " }), "reason"),
        (json!({ "name": "nope", "reason": "r" }), "not found"),
        (
            json!({ "name": "charge@v2", "reason": "r" }),
            "promote the live rule",
        ),
        (
            json!({ "name": "charge", "reason": "r", "at": 3 }),
            "unknown field",
        ),
    ] {
        let a = tool(args.clone());
        assert_eq!(a["isError"], true, "{args}: {a}");
        let text = a["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(says), "{args}: {text:?} should say {says:?}");
    }
    assert_eq!(fingerprint(&e), before);

    // The promote: the further of the two cursors, audited as the
    // assistant; a second one while it is under way is refused.
    let cursor = |name: &str| {
        e.rules()
            .unwrap()
            .into_iter()
            .find(|r| r.name == name)
            .unwrap()
            .cursor
    };
    let at = cursor("charge").max(cursor("charge@v2"));
    let done = tool(json!({ "name": "charge", "reason": "v2 decides as v1 did" }));
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(
        done["structuredContent"],
        json!({ "promoted": "charge", "at": at })
    );
    let entry = &e.audit_log(1).unwrap()[0];
    assert_eq!(
        (
            entry.action.as_str(),
            entry.operator.as_str(),
            entry.reason.as_str()
        ),
        ("promote_rule", "assistant", "v2 decides as v1 did")
    );
    let again = tool(json!({ "name": "charge", "reason": "again" }));
    assert_eq!(again["isError"], true, "{again}");
    assert!(
        again["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("promoted already"),
        "{again}"
    );
    e.run_until_idle().unwrap();
    let rules = e.rules().unwrap();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!((rules[0].name.as_str(), rules[0].version), ("charge", 2));
}

/// A fair action partitioned by tenant, with runs of two tenants.
fn keyed(e: &Engine) {
    e.configure_action(
        &reflexr::ActionConfig::new("mail")
            .fair()
            .partition_by("tenant")
            .max_running(4),
    )
    .unwrap();
    for tenant in ["acme", "acme", "globex"] {
        e.enqueue(&reflexr::Enqueue::new("mail", &json!({ "tenant": tenant })))
            .unwrap();
    }
}

#[test]
fn list_action_keys_gives_each_keys_runs_and_the_limits_that_hold_for_it() {
    let s = Scene::new();
    let e = shop(&s);
    keyed(&e);
    e.set_key_limits("mail", &reflexr::KeyLimits::new("acme").weight(3))
        .unwrap();
    let mcp = Mcp::new(e.clone(), McpConfig::new().read_only(true));
    let list = ask(&mcp, request(1, "tools/list", json!({})));
    let tool = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "list_action_keys")
        .expect("a read-only server lists it")
        .clone();
    assert_eq!(tool["annotations"]["readOnlyHint"], true);
    assert_eq!(tool["inputSchema"]["required"], json!(["action"]));
    let call = |args: Value| {
        ask(
            &mcp,
            request(
                2,
                "tools/call",
                json!({ "name": "list_action_keys", "arguments": args }),
            ),
        )["result"]
            .clone()
    };
    let before = fingerprint(&e);
    let answer = call(json!({ "action": "mail" }));
    assert_eq!(answer["isError"], false, "{answer}");
    assert_eq!(
        answer["structuredContent"],
        json!({
            "action": "mail",
            "keys": [
                { "key": "acme", "waiting": 0, "ready": 2, "running": 0, "max_running": 4,
                  "rate": null, "weight": 3, "overridden": true },
                { "key": "globex", "waiting": 0, "ready": 1, "running": 0, "max_running": 4,
                  "rate": null, "weight": 1, "overridden": false },
            ],
            "limits": [{ "key": "acme", "max_running": null, "rate": null, "weight": 3 }],
        })
    );
    let unkeyed = call(json!({ "action": "charge" }));
    assert_eq!(unkeyed["structuredContent"]["keys"], json!([]));
    let wrong = call(json!({ "action": "mail", "key": "acme" }));
    assert_eq!(wrong["isError"], true);
    assert!(
        wrong["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("unknown field")
    );
    assert_eq!(fingerprint(&e), before, "a read changes nothing");
}

#[test]
fn set_key_limits_replaces_a_keys_limits_and_is_audited_and_is_refused_for_an_action_without_keys()
{
    let s = Scene::new();
    let e = shop(&s);
    keyed(&e);
    let mcp = Mcp::new(e.clone(), McpConfig::new().operator("assistant"));
    let list = ask(&mcp, request(1, "tools/list", json!({})));
    let tool = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "set_key_limits")
        .unwrap()
        .clone();
    assert_eq!(
        (
            &tool["annotations"]["readOnlyHint"],
            &tool["annotations"]["destructiveHint"]
        ),
        (&json!(false), &json!(false))
    );
    assert_eq!(
        tool["inputSchema"]["required"],
        json!(["action", "key", "reason"])
    );
    let call = |args: Value| {
        ask(
            &mcp,
            request(
                2,
                "tools/call",
                json!({ "name": "set_key_limits", "arguments": args }),
            ),
        )["result"]
            .clone()
    };
    let answer = call(json!({
        "action": "mail", "key": "acme", "max_running": 20, "rate_count": 100,
        "rate_period_ms": 60_000, "weight": 5, "reason": "acme pays for more",
    }));
    assert_eq!(answer["isError"], false, "{answer}");
    assert_eq!(
        answer["structuredContent"],
        json!({ "action": "mail", "set": { "key": "acme", "max_running": 20, "rate": [100, 60_000], "weight": 5 } })
    );
    assert_eq!(
        e.key_limits("mail").unwrap(),
        [reflexr::KeyLimits::new("acme")
            .max_running(20)
            .rate(100, std::time::Duration::from_secs(60))
            .weight(5)]
    );
    // A second call replaces what the key had.
    let again = call(json!({ "action": "mail", "key": "acme", "weight": 2, "reason": "less" }));
    assert_eq!(again["isError"], false, "{again}");
    assert_eq!(
        e.key_limits("mail").unwrap(),
        [reflexr::KeyLimits::new("acme").weight(2)]
    );
    let audit = e.audit_log(10).unwrap();
    let entries: Vec<(&str, &str, &str, &str)> = audit
        .iter()
        .map(|a| {
            (
                a.action.as_str(),
                a.operator.as_str(),
                a.target.as_str(),
                a.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("set_key_limits", "assistant", "mail key acme", "less"),
            (
                "set_key_limits",
                "assistant",
                "mail key acme",
                "acme pays for more"
            ),
        ]
    );

    // Refusals say why and change nothing.
    let before = fingerprint(&e);
    for (args, says) in [
        (
            json!({ "action": "charge", "key": "ada", "max_running": 1, "reason": "r" }),
            "has no keys",
        ),
        (
            json!({ "action": "mail", "key": "acme", "rate_count": 1, "reason": "r" }),
            "go together",
        ),
        (
            json!({ "action": "mail", "key": "acme", "weight": 0, "reason": "r" }),
            "weight",
        ),
        (
            json!({ "action": "mail", "key": "acme", "weight": 1, "reason": " " }),
            "reason",
        ),
        (
            json!({ "action": "mail", "key": "acme", "weight": 1 }),
            "reason",
        ),
    ] {
        let a = call(args.clone());
        assert_eq!(a["isError"], true, "{args}: {a}");
        let text = a["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(says), "{args}: {text:?} should say {says:?}");
    }
    assert_eq!(fingerprint(&e), before);
    assert_eq!(
        e.key_limits("mail").unwrap(),
        [reflexr::KeyLimits::new("acme").weight(2)]
    );
}

#[test]
fn read_only_lists_no_mutating_tool_and_refuses_one_called_anyway() {
    let s = Scene::new();
    let e = shop(&s);
    let mcp = Mcp::new(e.clone(), McpConfig::new().read_only(true));
    let list = ask(&mcp, request(1, "tools/list", json!({})));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 14);
    for t in list["result"]["tools"].as_array().unwrap() {
        assert_eq!(t["annotations"]["readOnlyHint"], true, "{}", t["name"]);
    }
    let before = fingerprint(&e);
    for name in [
        "retry",
        "discard",
        "unblock",
        "reset_cursor",
        "restart_follower",
        "cancel_run",
        "reset_run_to_step",
        "promote_rule",
        "set_key_limits",
    ] {
        assert!(!names.contains(&name));
        let a = ask(
            &mcp,
            request(
                1,
                "tools/call",
                json!({ "name": name, "arguments": { "target": "runs", "ids": [], "reason": "r", "confirm": true } }),
            ),
        );
        assert_eq!(code(&a), -32602, "{name}");
        assert!(
            a["error"]["message"]
                .as_str()
                .unwrap()
                .contains("read-only")
        );
    }
    assert_eq!(fingerprint(&e), before);
}

#[test]
fn stdio_answers_line_by_line_and_survives_what_is_not_a_message() {
    let s = Scene::new();
    let mcp = Mcp::new(shop(&s), McpConfig::new());
    let huge = "x".repeat(reflexr_mcp::MAX_LINE_BYTES + 10);
    let input = format!(
        "{}\n\n\u{1}\u{2}\n{huge}\n{}\r\n",
        request(1, "ping", json!({})),
        request(2, "tools/list", json!({})),
    );
    let mut bytes = input.into_bytes();
    bytes.extend_from_slice(b"\xff\xfe\n");
    let mut out = Vec::new();
    mcp.serve_stdio(&bytes[..], &mut out).unwrap();
    let answers: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let codes: Vec<Option<i64>> = answers
        .iter()
        .map(|a| a["error"]["code"].as_i64())
        .collect();
    // ping, control bytes (not JSON), the huge line, tools/list, not UTF-8.
    assert_eq!(
        codes,
        [None, Some(-32700), Some(-32600), None, Some(-32700)]
    );
    assert_eq!(answers[3]["id"], 2);
}

fn serve(e: &Engine, config: AdminConfig) -> (reflexr_admin::AdminServer, Api) {
    let server =
        reflexr_admin::AdminServer::start(e, config.listen("127.0.0.1:0".parse().unwrap()))
            .unwrap();
    let api = Api::new(server.local_addr(), Some(TOKEN));
    (server, api)
}

const TOKEN: &str = "correct-horse-battery-staple";

#[test]
fn over_http_it_wants_the_token_checks_its_headers_and_answers_notifications_with_202() {
    let s = Scene::new();
    let e = shop(&s);
    let (_server, api) = serve(&e, AdminConfig::new().token(TOKEN));
    let json_headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let post = |body: &Value, extra: &[(&str, &str)]| {
        let mut h = json_headers.to_vec();
        h.extend_from_slice(extra);
        api.post_with("/api/v1/mcp", &h, &body.to_string())
    };
    // Legacy: initialize, then a tool call.
    let (st, init) = post(
        &request(
            1,
            "initialize",
            json!({ "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } }),
        ),
        &[],
    );
    assert_eq!(
        (st, &init["result"]["protocolVersion"]),
        (200, &json!("2025-11-25"))
    );
    let (st, _) = post(
        &json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
        &[],
    );
    assert_eq!(st, 202);
    let (st, status) = post(
        &request(
            2,
            "tools/call",
            json!({ "name": "status", "arguments": {} }),
        ),
        &[("MCP-Protocol-Version", "2025-11-25")],
    );
    assert_eq!(
        (st, &status["result"]["structuredContent"]["runs"]["dead"]),
        (200, &json!(2))
    );
    // Without the token.
    let anonymous = Api::new(api.addr, None);
    let (st, _) = anonymous.post_with(
        "/api/v1/mcp",
        &json_headers,
        &request(3, "ping", json!({})).to_string(),
    );
    assert_eq!(st, 401);
    // Another site's page.
    let (st, _) = post(
        &request(4, "ping", json!({})),
        &[("Origin", "https://evil.example")],
    );
    assert_eq!(st, 403);
    // Not JSON.
    let (st, _) = api.post_with("/api/v1/mcp", &[("Content-Type", "text/plain")], "{}");
    assert_eq!(st, 415);
    let (st, bad) = post(&json!("[nonsense"), &[]);
    assert_eq!((st, code(&bad)), (400, -32600));
    // 2026-07-28: the headers must say what the body says.
    let modern = request(
        5,
        "tools/call",
        json!({ "_meta": meta(), "name": "status", "arguments": {} }),
    );
    let (st, ok) = post(
        &modern,
        &[
            ("MCP-Protocol-Version", MODERN),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "status"),
        ],
    );
    assert_eq!((st, &ok["result"]["resultType"]), (200, &json!("complete")));
    let (st, mismatch) = post(
        &modern,
        &[
            ("MCP-Protocol-Version", MODERN),
            ("Mcp-Method", "tools/list"),
            ("Mcp-Name", "status"),
        ],
    );
    assert_eq!((st, code(&mismatch)), (400, -32020));
    let (st, missing) = post(
        &modern,
        &[
            ("MCP-Protocol-Version", MODERN),
            ("Mcp-Method", "tools/call"),
        ],
    );
    assert_eq!(
        (st, code(&missing)),
        (400, -32020),
        "Mcp-Name is required for tools/call"
    );
    let (st, unknown) = post(
        &request(6, "nope/nope", json!({ "_meta": meta() })),
        &[
            ("MCP-Protocol-Version", MODERN),
            ("Mcp-Method", "nope/nope"),
        ],
    );
    assert_eq!((st, code(&unknown)), (404, -32601));
    let (st, unsupported) = post(
        &request(7, "ping", json!({})),
        &[("MCP-Protocol-Version", "1999-01-01")],
    );
    assert_eq!((st, code(&unsupported)), (400, -32022));
    // No stream here: GET is 405.
    let (st, _) = api.get("/api/v1/mcp");
    assert_eq!(st, 405);
}

#[test]
fn over_http_a_read_only_server_hides_the_mutating_tools() {
    let s = Scene::new();
    let e = shop(&s);
    let (_server, api) = serve(&e, AdminConfig::new().token(TOKEN).read_only(true));
    let h = [("Content-Type", "application/json")];
    let (st, list) = api.post_with(
        "/api/v1/mcp",
        &h,
        &request(1, "tools/list", json!({})).to_string(),
    );
    assert_eq!(st, 200);
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 14);
    let before = fingerprint(&e);
    let (_, refused) = api.post_with(
        "/api/v1/mcp",
        &h,
        &request(2, "tools/call", json!({ "name": "retry", "arguments": { "target": "runs", "ids": [], "reason": "r", "dry_run": false } })).to_string(),
    );
    assert_eq!(code(&refused), -32602);
    assert_eq!(fingerprint(&e), before);
}

/// A JSON value of some depth, for random params.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("name".to_string()),
                    Just("arguments".to_string()),
                    Just("uri".to_string()),
                    Just("target".to_string()),
                    Just("ids".to_string()),
                    Just("dry_run".to_string()),
                    Just("_meta".to_string()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("initialize".to_string()),
        Just("tools/list".to_string()),
        Just("tools/call".to_string()),
        Just("resources/read".to_string()),
        Just("resources/list".to_string()),
        Just("server/discover".to_string()),
        Just("ping".to_string()),
        ".{0,16}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_lines_neither_crash_the_server_nor_change_the_file(
        lines in prop::collection::vec(prop_oneof![
            any::<Vec<u8>>().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            (any::<i64>(), method(), any_json()).prop_map(|(id, m, p)| {
                json!({ "jsonrpc": "2.0", "id": id, "method": m, "params": p }).to_string()
            }),
            (method(), any_json()).prop_map(|(m, args)| {
                json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": { "name": m.replace('/', "_"), "arguments": args } }).to_string()
            }),
        ], 1..8)
    ) {
        // Invariant 10: whatever comes in, an answer (or none, for what is
        // not a request) and the file as it was. The server is read-only so
        // that a random call cannot be a valid, audited change.
        let s = Scene::new();
        let e = shop(&s);
        let before = fingerprint(&e);
        let mcp = Mcp::new(e.clone(), McpConfig::new().read_only(true));
        let mut out = Vec::new();
        let input = lines.join("\n");
        mcp.serve_stdio(input.as_bytes(), &mut out).unwrap();
        for answer in String::from_utf8(out).unwrap().lines() {
            let v: Value = serde_json::from_str(answer).unwrap();
            prop_assert_eq!(&v["jsonrpc"], "2.0");
            prop_assert!(v.get("result").is_some() != v.get("error").is_some());
        }
        prop_assert_eq!(fingerprint(&e), before);
    }
}
