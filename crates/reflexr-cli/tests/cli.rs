//! The `reflexr` binary, run against temp files prepared with the library:
//! each command, its `--json` form, and its errors and exit codes.

use reflexr_testkit as common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::Scene;
use reflexr::{Decision, Engine, NewEvent, OnDeadLetter, RetryPolicy, Rule, RunState, Scope};
use serde_json::{Value, json};

fn cli(db: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reflexr"))
        .arg(db)
        .args(args)
        .output()
        .expect("run reflexr")
}

fn cli_with_input(db: &Path, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_reflexr"))
        .arg(db)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// A shop: orders over 100 fire a charge run per customer scope; the charge
/// fails for customer "bad", which blocks that scope.
fn prepare(path: &Path) -> Engine {
    prepare_with(Engine::open(path).unwrap())
}

fn prepare_with(e: Engine) -> Engine {
    e.ensure_workspace("shop", &["order.placed", "order.cancelled"])
        .unwrap();
    e.register_rule(
        Rule::new("big-order", "shop")
            .on(["order.placed"])
            .scope(Scope::payload("customer"))
            .action("charge")
            .retry(RetryPolicy::never())
            .on_dead_letter(OnDeadLetter::Block)
            .decide(|ev| {
                let p: Value = ev.payload()?;
                Ok(if p["amount"].as_i64().unwrap_or(0) > 100 {
                    Decision::Fire(p)
                } else {
                    Decision::Skip
                })
            }),
    )
    .unwrap();
    e.register_action("charge", |run, _| {
        let p: Value = run.input()?;
        if p["customer"] == "bad" {
            Err("card declined".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    for (customer, amount) in [("ada", 150), ("bad", 500), ("bad", 300), ("grace", 20)] {
        e.append(
            "shop",
            &NewEvent::new("order.placed", format!("customer/{customer}"), customer, 0)
                .payload(&serde_json::json!({ "customer": customer, "amount": amount })),
        )
        .unwrap();
    }
    e.save_cursor("mailer", "shop", 2).unwrap();
    e.run_until_idle().unwrap();
    e
}

#[test]
fn a_missing_file_is_an_error_and_nothing_is_created() {
    let s = Scene::new();
    let out = cli(&s.path, &["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    assert!(!s.path.exists());
}

#[test]
fn usage_errors_exit_2() {
    let s = Scene::new();
    prepare(&s.path);
    for args in [&["frobnicate"][..], &["events"], &["runs", "--limit", "x"]] {
        let out = cli(&s.path, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn a_reader_that_goes_away_ends_every_command_quietly() {
    // Nothing lost to bad input (the CLI's share): `reflexr … | head` ends
    // as a closed pipe ends any CLI, with no panic and no error, for every
    // command that prints; and it changed nothing it was not asked to.
    let s = Scene::new();
    prepare(&s.path);
    let reads: &[&[&str]] = &[
        &["status"],
        &["status", "--json"],
        &["events", "--workspace", "shop"],
        &["--json", "events", "--workspace", "shop"],
        &["runs"],
        &["--json", "runs"],
        &["dead-letters"],
        &["--json", "dead-letters"],
        &["stats"],
        &["limits"],
        &[
            "tail",
            "--workspace",
            "shop",
            "--from-start",
            "--count",
            "3",
        ],
        &["--help"],
        &["runs", "--help"],
        &["runs", "steps", "--help"],
    ];
    for args in reads {
        let mut child = Command::new(env!("CARGO_BIN_EXE_reflexr"))
            .arg(&s.path)
            .args(*args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader leaves before the first line.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
    let v = json(&cli(&s.path, &["--json", "runs"]));
    assert_eq!(v.as_array().map(Vec::len), Some(3), "{v}");
}

#[test]
fn status_shows_workspaces_consumers_leases_runs_and_dead_letters() {
    let s = Scene::new();
    prepare(&s.path);
    let out = cli(&s.path, &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for want in [
        "workspaces",
        "shop",
        "consumers",
        "mailer",
        "big-order",
        "leases",
        "evaluator/shop",
        "runs",
        "dead",
        "succeeded",
        "dead letters (open)",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let v = json(&cli(&s.path, &["status", "--json"]));
    assert_eq!(v["workspaces"][0]["name"], "shop");
    let mailer = v["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "mailer")
        .unwrap();
    // 4 orders and 3 RuleFired in the log; the mailer saw 2.
    assert_eq!(
        (mailer["position"].as_i64(), mailer["lag"].as_i64()),
        (Some(2), Some(5))
    );
    assert_eq!(v["runs"]["dead"], 1);
    assert_eq!(v["runs"]["waiting"], 1, "the blocked scope's second run");
    assert_eq!(v["dead_letters"]["run"], 1);
    assert_eq!(v["leases"][0]["name"], "evaluator/shop");
}

#[test]
fn events_lists_a_workspace_after_a_seq_by_type() {
    let s = Scene::new();
    prepare(&s.path);
    let v = json(&cli(
        &s.path,
        &[
            "events",
            "-w",
            "shop",
            "--after",
            "1",
            "-t",
            "order.placed",
            "--json",
        ],
    ));
    let seqs: Vec<i64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [2, 3, 4]);
    assert_eq!(v[0]["payload"]["customer"], "bad");
    let text = stdout(&cli(&s.path, &["events", "-w", "shop", "--limit", "1"]));
    assert!(
        text.contains("order.placed") && text.contains("customer/ada"),
        "{text}"
    );
    let out = cli(&s.path, &["events", "-w", "nope nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("invalid workspace"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn tail_follows_events_committed_after_it_started() {
    let s = Scene::new();
    let e = prepare(&s.path);
    let existing = e.read(&reflexr::Query::new("shop")).unwrap().len();
    // It must wait for one more event than there is.
    let count = (existing + 1).to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_reflexr"))
        .arg(&s.path)
        .args([
            "tail",
            "-w",
            "shop",
            "--from-start",
            "--count",
            &count,
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    e.append(
        "shop",
        &NewEvent::new("order.cancelled", "customer/ada", "ada", 0),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), existing + 1);
    assert_eq!(lines.last().unwrap()["type"], "order.cancelled");
}

#[test]
fn runs_and_dead_letters_list_by_state_and_retry_and_discard_are_recorded() {
    let s = Scene::new();
    let e = prepare(&s.path);
    let dead = json(&cli(&s.path, &["runs", "--state", "dead", "--json"]));
    assert_eq!(dead.as_array().unwrap().len(), 1);
    let run_id = dead[0]["id"].as_str().unwrap().to_string();
    assert_eq!(dead[0]["last_error"], "card declined");
    let text = stdout(&cli(&s.path, &["runs"]));
    assert!(
        text.contains("charge") && text.contains("card declined"),
        "{text}"
    );

    let letters = json(&cli(&s.path, &["dead-letters", "--json"]));
    assert_eq!(letters[0]["reason"], "attempts_exhausted");
    assert_eq!(letters[0]["run_id"], run_id.as_str());
    assert!(stdout(&cli(&s.path, &["dead-letters"])).contains("card declined"));

    // Only a dead run can be retried: a succeeded one is refused, exit 1.
    let ok = e.runs(Some(RunState::Succeeded), 1).unwrap()[0].id.clone();
    let out = cli(&s.path, &["retry", &ok]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not dead"), "{}", stderr(&out));

    let out = cli(
        &s.path,
        &[
            "retry",
            &run_id,
            "--operator",
            "ops",
            "--reason",
            "card updated",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(e.run(&run_id).unwrap().unwrap().state, RunState::Ready);
    let audit = &e.audit_log(1).unwrap()[0];
    assert_eq!(
        (
            audit.action.as_str(),
            audit.operator.as_str(),
            audit.reason.as_str()
        ),
        ("retry_run", "ops", "card updated")
    );
    // It fails again; discard it through its dead letter this time.
    e.run_until_idle().unwrap();
    let letter = json(&cli(&s.path, &["dead-letters", "--json"]))[0]["id"]
        .as_i64()
        .unwrap();
    let v = json(&cli(
        &s.path,
        &["discard", "--dead-letter", &letter.to_string(), "--json"],
    ));
    assert_eq!(v["ok"], true);
    assert_eq!(e.run(&run_id).unwrap().unwrap().state, RunState::Discarded);
    assert!(
        json(&cli(&s.path, &["dead-letters", "--json"]))
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        json(&cli(&s.path, &["dead-letters", "--all", "--json"]))
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let out = cli(&s.path, &["retry", "no-such-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not found"));
}

#[test]
fn runs_steps_shows_a_workflows_timeline_and_runs_reset_asks_first_and_is_recorded() {
    let s = Scene::new();
    let e = Engine::open(&s.path).unwrap();
    let b = common::workflow::stock(&e);
    // The timeline: --json is Engine::run_steps; the table says what the
    // waiting step waits for, and until when.
    let v = json(&cli(&s.path, &["runs", "steps", &b.waiting, "--json"]));
    assert_eq!(
        v,
        serde_json::to_value(e.run_steps(&b.waiting).unwrap()).unwrap()
    );
    let text = stdout(&cli(&s.path, &["runs", "steps", &b.waiting]));
    assert_eq!(text.lines().count(), 4, "a header and three steps: {text}");
    assert!(
        text.contains("speaker.confirmed in talks about session/2, until "),
        "{text}"
    );
    assert!(
        stdout(&cli(&s.path, &["runs", "steps", &b.done])).contains("mail"),
        "the run that ended has its mail step"
    );
    let out = cli(&s.path, &["runs", "steps", "no-such-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    // `runs` lists as before; a filter and a subcommand do not mix.
    assert_eq!(
        json(&cli(&s.path, &["runs", "--json"]))
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let out = cli(&s.path, &["runs", "--state", "ready", "steps", &b.done]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // A reset asks first, naming what it forgets and what may happen
    // again; anything but yes changes nothing.
    let out = cli_with_input(
        &s.path,
        &["runs", "reset", &b.done, "--step", "confirmed"],
        "n\n",
    );
    assert_eq!(out.status.code(), Some(1));
    let asked = stderr(&out);
    assert!(
        asked.contains("confirmed, mail")
            && asked.contains("may happen again")
            && asked.contains("not confirmed"),
        "{asked}"
    );
    let out = cli(&s.path, &["runs", "reset", &b.done, "--step", "begin"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no step \"begin\""),
        "{}",
        stderr(&out)
    );
    let out = cli(
        &s.path,
        &["runs", "reset", &b.done, "--step", "nope", "--yes"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    assert!(e.audit_log(10).unwrap().is_empty());
    assert_eq!(e.run(&b.done).unwrap().unwrap().state, RunState::Succeeded);

    // Answered yes: the suspended run forgets its wait.
    let out = cli_with_input(
        &s.path,
        &["runs", "reset", &b.waiting, "--step", "confirmed"],
        "y\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(e.run_steps(&b.waiting).unwrap().len(), 2);
    // --yes, for a script: recorded with who and why; the mail step runs
    // again, and only it.
    let v = json(&cli(
        &s.path,
        &[
            "runs",
            "reset",
            &b.done,
            "--step",
            "mail",
            "--yes",
            "--operator",
            "ops",
            "--reason",
            "the mail bounced",
            "--json",
        ],
    ));
    assert_eq!(
        v,
        json!({ "ok": true, "action": "reset", "run": b.done, "step": "mail" })
    );
    assert_eq!(e.run(&b.done).unwrap().unwrap().state, RunState::Ready);
    let audit = &e.audit_log(1).unwrap()[0];
    assert_eq!(
        (
            audit.action.as_str(),
            audit.operator.as_str(),
            audit.reason.as_str()
        ),
        ("reset_run_to_step", "ops", "the mail bounced")
    );
    e.run_until_idle().unwrap();
    assert_eq!(e.run(&b.done).unwrap().unwrap().state, RunState::Succeeded);
    assert_eq!(b.mailed(), 2);
}

#[test]
fn runs_show_prints_a_run_with_its_progress_and_log_lines() {
    // `runs show`: --json is Engine::run, run_progress and run_logs
    // together; the text names the fields, the progress and each line.
    let s = Scene::new();
    let e = Engine::open(&s.path).unwrap();
    e.register_action("import", |_, ctx| {
        ctx.log(log::Level::Info, "fetched the file", json!({ "rows": 120 }))?;
        ctx.progress(3, 10)?;
        ctx.log(log::Level::Warn, "row 7 is odd", Value::Null)?;
        Ok(())
    })
    .unwrap();
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ran = e
        .enqueue(&reflexr::Enqueue::new("import", &json!({ "file": "a.csv" })).traceparent(TP))
        .unwrap();
    e.run_until_idle().unwrap();
    let later = e
        .enqueue(
            &reflexr::Enqueue::new("import", &json!({ "file": "b.csv" }))
                .after(std::time::Duration::from_secs(3_600)),
        )
        .unwrap();

    let v = json(&cli(&s.path, &["runs", "show", &ran.id, "--json"]));
    assert_eq!(
        v,
        json!({
            "run": e.run(&ran.id).unwrap().unwrap(),
            "progress": e.run_progress(&ran.id).unwrap(),
            "logs": e.run_logs(&ran.id, 0, 100).unwrap(),
        })
    );
    assert_eq!(v["run"]["state"], "succeeded");
    assert_eq!(
        (
            v["progress"]["done"].clone(),
            v["progress"]["total"].clone()
        ),
        (json!(3), json!(10))
    );
    let lines: Vec<(i64, &str, &str)> = v["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["n"].as_i64().unwrap(),
                l["level"].as_str().unwrap(),
                l["message"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        lines,
        [(1, "info", "fetched the file"), (2, "warn", "row 7 is odd")]
    );
    assert_eq!(v["logs"][0]["fields"], json!({ "rows": 120 }));
    assert_eq!(v["logs"][1]["fields"], Value::Null);

    let out = cli(&s.path, &["runs", "show", &ran.id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for want in [
        "state:",
        "succeeded",
        "import",
        "attempt:",
        "1/",
        "due:",
        "last error:",
        "key:",
        "3/10 (attempt 1, at ",
        "fetched the file",
        r#"{"rows":120}"#,
        "row 7 is odd",
        "warn",
        "trace:",
        TP,
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }

    // A run that has not started: no progress, no lines.
    let v = json(&cli(&s.path, &["runs", "show", &later.id, "--json"]));
    assert_eq!(
        (
            v["run"]["state"].clone(),
            v["progress"].clone(),
            v["logs"].clone()
        ),
        (json!("ready"), Value::Null, json!([]))
    );
    let text = stdout(&cli(&s.path, &["runs", "show", &later.id]));
    assert!(text.contains("no log lines"), "{text}");

    let out = cli(&s.path, &["runs", "show", "no-such-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    let out = cli(&s.path, &["runs", "show", "no-such-run", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let out = cli(&s.path, &["runs", "show"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn append_adds_one_event_as_an_application_would_and_an_id_once() {
    // Invariants 3 and 10 through the CLI: an id is appended once; a type
    // the workspace does not have is a typed error that changes nothing.
    let s = Scene::new();
    let e = prepare(&s.path);
    let head = e.head_seq().unwrap();
    let version = e.subject_version("shop", "customer/ada").unwrap();
    let args = [
        "append",
        "-w",
        "shop",
        "-t",
        "order.cancelled",
        "--subject",
        "customer/ada",
        "--actor",
        "ops",
        "--payload",
        r#"{"why":"duplicate"}"#,
        "--id",
        "fix-1",
    ];
    let out = cli(&s.path, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        format!(
            "appended seq {} (fix-1), version {} of customer/ada",
            head + 1,
            version + 1
        )
    );
    let ev = e.event(head + 1).unwrap().unwrap();
    assert_eq!((ev.id.as_str(), ev.actor.as_str()), ("fix-1", "ops"));
    assert_eq!(ev.payload_value().unwrap()["why"], "duplicate");
    let again = json(&cli(&s.path, &[&args[..], &["--json"]].concat()));
    assert_eq!(again["existing"], true);
    assert_eq!(again["seq"], head + 1);
    assert_eq!(again["version"], version + 1);
    // Invariant 13: an expected version that does not hold appends
    // nothing and says what the subject is at.
    let expecting = |v: i64| {
        cli(
            &s.path,
            &[
                "append",
                "-w",
                "shop",
                "-t",
                "order.cancelled",
                "--subject",
                "customer/ada",
                "--expect-version",
                &v.to_string(),
            ],
        )
    };
    let out = expecting(version);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("it is at version {}", version + 1)),
        "{}",
        stderr(&out)
    );
    assert_eq!(e.head_seq().unwrap(), head + 1);
    let out = expecting(version + 1);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("version {} of customer/ada", version + 2)),
        "{}",
        stdout(&out)
    );
    let out = cli(
        &s.path,
        &["append", "-w", "shop", "-t", "nope", "--subject", "x"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("nope"), "{}", stderr(&out));
    let out = cli(
        &s.path,
        &[
            "append",
            "-w",
            "shop",
            "-t",
            "order.cancelled",
            "--subject",
            "x",
            "--payload",
            "{oops",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(e.head_seq().unwrap(), head + 2, "nothing else was appended");
}

#[test]
fn unblock_lets_a_blocked_scope_go_on() {
    let s = Scene::new();
    let e = prepare(&s.path);
    assert_eq!(e.runs(Some(RunState::Waiting), 10).unwrap().len(), 1);
    let out = cli(
        &s.path,
        &["unblock", "big-order", "bad", "--reason", "skip"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(e.runs(Some(RunState::Ready), 10).unwrap().len(), 1);
    let out = cli(&s.path, &["unblock", "big-order", "bad"]);
    assert_eq!(out.status.code(), Some(1), "not blocked any more");
}

#[test]
fn reset_cursor_asks_first_unless_told_yes() {
    let s = Scene::new();
    let e = prepare(&s.path);
    let args = [
        "reset-cursor",
        "-w",
        "shop",
        "--name",
        "mailer",
        "--to",
        "0",
    ];
    let out = cli_with_input(&s.path, &args, "n\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("from 2 to 0?"), "{}", stderr(&out));
    assert_eq!(e.cursor("mailer", "shop").unwrap(), 2, "unchanged");

    let out = cli_with_input(&s.path, &args, "y\n");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(e.cursor("mailer", "shop").unwrap(), 0);

    let mut yes = args.to_vec();
    yes[6] = "1";
    yes.extend(["--yes", "--json"]);
    let v = json(&cli(&s.path, &yes));
    assert_eq!((v["from"].as_i64(), v["to"].as_i64()), (Some(0), Some(1)));
    let resets = e
        .audit_log(10)
        .unwrap()
        .into_iter()
        .filter(|a| a.action.as_str() == "reset_cursor")
        .count();
    assert_eq!(resets, 2);
    let out = cli(
        &s.path,
        &[
            "reset-cursor",
            "-w",
            "shop",
            "--kind",
            "nope",
            "--name",
            "x",
            "--to",
            "0",
            "--yes",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn prune_reports_what_it_removed_and_refuses_to_guess() {
    let s = Scene::new();
    let e = prepare(&s.path);
    e.save_cursor("mailer", "shop", 4).unwrap();
    let out = cli(&s.path, &["prune"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("say what to prune"));
    // Nothing is old enough yet.
    let v = json(&cli(
        &s.path,
        &["prune", "--events-older-than", "1h", "--json"],
    ));
    assert_eq!(v["events"], 0);
    std::thread::sleep(std::time::Duration::from_millis(5)); // the CLI runs on the wall clock
    let v = json(&cli(
        &s.path,
        &[
            "prune",
            "--events-older-than",
            "1ms",
            "--work-older-than",
            "1ms",
            "--json",
        ],
    ));
    assert!(v["events"].as_u64().unwrap() >= 4, "{v}");
    assert!(v["runs"].as_u64().unwrap() >= 1, "{v}");
    let text = stdout(&cli(&s.path, &["prune", "--events-older-than", "1ms"]));
    assert!(text.starts_with("pruned 0 events"), "{text}");
}

#[test]
fn stats_reports_counters_and_gauges() {
    let s = Scene::new();
    prepare(&s.path);
    let v = json(&cli(&s.path, &["stats", "--json"]));
    assert!(v["events_appended"].as_i64().unwrap() >= 4);
    assert_eq!(v["counters"]["decisions"], 4);
    assert_eq!(v["counters"]["fired"], 3);
    assert_eq!(v["counters"]["runs_succeeded"], 1);
    assert_eq!(v["counters"]["runs_dead"], 1);
    assert_eq!(v["runs"]["dead"], 1);
    assert_eq!(v["dead_letters"]["run"], 1);
    let text = stdout(&cli(&s.path, &["stats"]));
    assert!(
        text.contains("decisions") && text.contains("lag app/mailer@shop"),
        "{text}"
    );
}

#[test]
fn restart_follower_asks_the_process_running_a_stopped_follower_to_go_on() {
    // ADR-0015's stop, restarted from the operator's shell: the request is
    // in the file, and the engine that stopped the follower picks it up.
    let s = Scene::new();
    let e = Engine::open(&s.path).unwrap();
    e.ensure_workspace("edge", &["reading", "alarm"]).unwrap();
    e.ensure_workspace("fleet", &["reading"]).unwrap();
    e.follow(reflexr::Follow::new("edge", "fleet")).unwrap();
    e.append("edge", &NewEvent::new("alarm", "s", "edge", 0))
        .unwrap();
    e.run_until_idle().unwrap();
    assert!(e.followers().unwrap()[0].stopped_here);

    e.register_types("fleet", &["alarm"]).unwrap();
    let out = json(&cli(
        &s.path,
        &["--json", "restart-follower", "edge-to-fleet"],
    ));
    assert_eq!(out["action"], "restart requested");
    e.run_until_idle().unwrap();
    let f = &e.followers().unwrap()[0];
    assert_eq!((f.stopped_here, f.lag), (false, 0));

    let out = cli(&s.path, &["restart-follower", "nobody"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("follower not found"),
        "{}",
        stderr(&out)
    );
}

#[cfg(feature = "admin")]
#[test]
fn serve_answers_over_http_until_sigterm_and_refuses_changes_read_only() {
    // Surfaces: `serve` prints where it listens, answers the API on the
    // file beside the application, keeps a read-only promise, and stops
    // cleanly (exit 0) on SIGTERM.
    use common::http::Api;
    use std::io::BufRead;
    let s = Scene::new();
    let _e = prepare(&s.path);
    let mut child = Command::new(env!("CARGO_BIN_EXE_reflexr"))
        .arg(&s.path)
        .args(["serve", "--listen", "127.0.0.1:0", "--read-only"])
        .env_remove("REFLEXR_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_suffix(" (read-only)")
        .and_then(|l| l.rsplit_once("http://"))
        .map(|(_, a)| a.parse().unwrap())
        .unwrap_or_else(|| panic!("where it listens: {first:?}"));
    let api = Api::new(addr, None);
    let (status, body) = api.get("/api/v1/status");
    assert_eq!(status, 200);
    assert!(body["workspaces"].to_string().contains("shop"), "{body}");
    let (status, body) = api.post(
        "/api/v1/lanes/unblock",
        serde_json::json!({ "rule": "charge", "scope": "customer/bad", "operator": "ops", "reason": "test" }),
    );
    assert_eq!(status, 403, "{body}");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("stopping"));
}

#[cfg(feature = "admin")]
#[test]
fn serve_refuses_to_listen_off_loopback_without_a_token() {
    // Surfaces, security defaults: no token, no listening beyond loopback.
    let s = Scene::new();
    let _e = prepare(&s.path);
    let out = Command::new(env!("CARGO_BIN_EXE_reflexr"))
        .arg(&s.path)
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env_remove("REFLEXR_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("token"), "{}", stderr(&out));
}

#[test]
fn enqueue_pause_resume_cancel_and_limits_from_the_cli_are_recorded() {
    // Control of the work through the CLI: each change lands in the file and
    // the audit log; a uniqueness key deduplicates.
    let s = Scene::new();
    let e = prepare(&s.path);
    let first = json(&cli(
        &s.path,
        &[
            "enqueue",
            "send-invoice",
            "--input",
            r#"{"invoice":42}"#,
            "--unique",
            "inv/42",
            "--in",
            "1h",
            "--json",
        ],
    ));
    assert_eq!(first["deduplicated"], false);
    let again = json(&cli(
        &s.path,
        &[
            "enqueue",
            "send-invoice",
            "--input",
            r#"{"invoice":42}"#,
            "--unique",
            "inv/42",
            "--json",
        ],
    ));
    assert_eq!(
        (again["deduplicated"].clone(), again["id"].clone()),
        (json!(true), first["id"].clone())
    );
    let id = first["id"].as_str().unwrap();
    assert!(
        cli(
            &s.path,
            &[
                "limits",
                "send-invoice",
                "--max-running",
                "2",
                "--rate",
                "10/1m",
                "--reason",
                "provider"
            ]
        )
        .status
        .success()
    );
    assert!(
        cli(
            &s.path,
            &["pause", "action", "send-invoice", "--reason", "maintenance"]
        )
        .status
        .success()
    );
    let listed = json(&cli(&s.path, &["limits", "--json"]));
    assert_eq!(listed["actions"][0]["max_running"], 2);
    assert_eq!(listed["actions"][0]["rate"], json!([10, 60_000]));
    assert_eq!(listed["paused"][0]["name"], "send-invoice");
    assert!(
        cli(&s.path, &["resume", "action", "send-invoice"])
            .status
            .success()
    );
    let out = cli(&s.path, &["resume", "action", "send-invoice"]);
    assert_eq!(out.status.code(), Some(1), "not paused any more");
    assert!(
        cli(&s.path, &["cancel", id, "--reason", "withdrawn"])
            .status
            .success()
    );
    assert_eq!(e.run(id).unwrap().unwrap().state, RunState::Cancelled);
    let out = cli(&s.path, &["pause", "gadget", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("action, channel, job, rule or reaction"));
    let actions: Vec<String> = e
        .audit_log(10)
        .unwrap()
        .iter()
        .map(|a| a.action.to_string())
        .collect();
    for a in ["configure_action", "pause", "resume", "cancel"] {
        assert!(actions.contains(&a.to_string()), "{a} in {actions:?}");
    }
}

/// `limits ACTION --json`, the listing of one action and its keys.
fn action_limits(path: &Path, action: &str) -> Value {
    json(&cli(path, &["--json", "limits", action]))
}

#[test]
fn limits_by_key_sets_lists_and_clears_a_keys_overrides_each_recorded() {
    // Flow control by key through the CLI: an action made fair and
    // partitioned, one key's overrides set field by field (what is not
    // given stays), listed with each key's runs, cleared; every change in
    // the audit log with who and why.
    let s = Scene::new();
    let e = prepare(&s.path);
    let out = cli(
        &s.path,
        &[
            "limits",
            "send-mail",
            "--fair",
            "--partition-by",
            "tenant",
            "--reason",
            "one tenant floods the queue",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let config = e
        .action_configs()
        .unwrap()
        .into_iter()
        .find(|c| c.action == "send-mail")
        .unwrap();
    assert!(config.fair && config.keyed(), "{config:?}");
    for tenant in ["acme", "acme", "acme", "globex"] {
        e.enqueue(&reflexr::Enqueue::new(
            "send-mail",
            &json!({ "tenant": tenant }),
        ))
        .unwrap();
    }

    // The issue's example, verbatim.
    let out = cli(
        &s.path,
        &[
            "limits",
            "send-mail",
            "--key",
            "acme",
            "--max-running",
            "20",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "set");
    let out = cli(
        &s.path,
        &[
            "limits",
            "send-mail",
            "--key",
            "acme",
            "--weight",
            "5",
            "--rate",
            "100/1m",
            "--operator",
            "ops",
            "--reason",
            "acme pays for more",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        e.key_limits("send-mail").unwrap(),
        [reflexr::KeyLimits::new("acme")
            .max_running(20)
            .rate(100, std::time::Duration::from_secs(60))
            .weight(5)],
        "the second change kept the first's max running"
    );
    assert_eq!(
        config.max_running, None,
        "the action's own limits are untouched"
    );

    let listed = action_limits(&s.path, "send-mail");
    assert_eq!(listed["config"]["fair"], true);
    assert_eq!(listed["config"]["partition_by"], "tenant");
    let keys: Vec<(String, i64, Value, Value, i64, bool)> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap().to_string(),
                k["ready"].as_i64().unwrap(),
                k["max_running"].clone(),
                k["rate"].clone(),
                k["weight"].as_i64().unwrap(),
                k["overridden"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            (
                "acme".to_string(),
                3,
                json!(20),
                json!([100, 60_000]),
                5,
                true
            ),
            ("globex".to_string(), 1, Value::Null, Value::Null, 1, false),
        ]
    );
    assert_eq!(listed["limits"][0]["key"], "acme");
    assert_eq!(listed["limits"][0]["weight"], 5);
    let table = cli(&s.path, &["limits", "send-mail"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    for shown in ["overridden", "acme", "globex", "100/1m", "tenant"] {
        assert!(text.contains(shown), "{shown} in:\n{text}");
    }
    let runs = json(&cli(&s.path, &["--json", "runs", "--state", "ready"]));
    let mut run_keys: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "send-mail")
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    run_keys.sort();
    assert_eq!(run_keys, ["acme", "acme", "acme", "globex"]);

    let out = cli(
        &s.path,
        &[
            "limits",
            "send-mail",
            "--key",
            "acme",
            "--clear",
            "--operator",
            "ops",
            "--reason",
            "back to normal",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "cleared");
    assert!(e.key_limits("send-mail").unwrap().is_empty());
    let listed = action_limits(&s.path, "send-mail");
    assert_eq!(listed["keys"][0]["overridden"], false);
    assert_eq!(listed["keys"][0]["weight"], 1);
    let recorded = e.audit_log(100).unwrap().len();
    let again = cli(
        &s.path,
        &["limits", "send-mail", "--key", "acme", "--clear"],
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("not found"), "{}", stderr(&again));
    assert_eq!(e.audit_log(100).unwrap().len(), recorded);

    let audit = e.audit_log(10).unwrap();
    let entries: Vec<(&str, &str, &str, &str)> = audit
        .iter()
        .filter(|a| a.target == "send-mail key acme")
        .map(|a| {
            (
                a.action.as_str(),
                a.operator.as_str(),
                a.reason.as_str(),
                a.target.as_str(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            (
                "clear_key_limits",
                "ops",
                "back to normal",
                "send-mail key acme"
            ),
            (
                "set_key_limits",
                "ops",
                "acme pays for more",
                "send-mail key acme"
            ),
            (
                "set_key_limits",
                entries[2].1,
                "via the reflexr CLI",
                "send-mail key acme"
            ),
        ],
        "newest first"
    );
    assert!(
        audit
            .iter()
            .any(|a| a.action.as_str() == "configure_action" && a.target == "send-mail")
    );
}

#[test]
fn limits_by_key_of_an_action_without_keys_is_refused_and_changes_nothing() {
    // Only a fair or partitioned action has keys: a key's limits for any
    // other are a typed error that records nothing; options that do not go
    // together are usage errors.
    let s = Scene::new();
    let e = prepare(&s.path);
    let out = cli(&s.path, &["limits", "charge", "--max-running", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let configs = e.action_configs().unwrap();
    let recorded = e.audit_log(100).unwrap().len();
    for action in ["charge", "never-configured"] {
        let out = cli(
            &s.path,
            &["limits", action, "--key", "acme", "--max-running", "20"],
        );
        assert_eq!(out.status.code(), Some(1), "{action}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("invalid action") && stderr(&out).contains("has no keys"),
            "{action}: {}",
            stderr(&out)
        );
    }
    for args in [
        &["limits", "charge", "--key", "acme"][..],
        &["limits", "send-mail", "--key", "acme", "--weight", "0"],
    ] {
        let out = cli(&s.path, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
    }
    for args in [
        &["limits", "charge", "--weight", "2"][..],
        &["limits", "charge", "--clear"],
        &["limits", "--key", "acme", "--max-running", "2"],
        &["limits", "charge", "--key", "acme", "--priority", "3"],
        &["limits", "charge", "--key", "acme", "--fair"],
        &[
            "limits",
            "charge",
            "--key",
            "acme",
            "--clear",
            "--max-running",
            "2",
        ],
    ] {
        let out = cli(&s.path, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(e.key_limits("charge").unwrap().is_empty());
    assert_eq!(e.action_configs().unwrap(), configs);
    assert_eq!(
        e.audit_log(100).unwrap().len(),
        recorded,
        "nothing recorded"
    );

    // Its listing says it has no keys, and changes nothing either.
    let listed = action_limits(&s.path, "charge");
    assert_eq!(listed["config"]["max_running"], 2);
    assert_eq!(listed["config"]["fair"], false);
    assert_eq!(listed["keys"], json!([]));
    let table = cli(&s.path, &["limits", "charge"]);
    assert!(
        stdout(&table).contains("not fair or partitioned"),
        "{}",
        stdout(&table)
    );
    let unknown = action_limits(&s.path, "never-configured");
    assert_eq!(unknown["config"], Value::Null);
    assert_eq!(e.audit_log(100).unwrap().len(), recorded);
}

#[test]
fn rules_lists_each_version_live_or_in_shadow_and_promote_hands_over_recorded() {
    // A rule version in shadow through the CLI: listed beside the live one,
    // promoted with a recorded intervention; a rule without a shadow, or a
    // second promote, is refused and changes nothing.
    let s = Scene::new();
    let e = prepare(&s.path);
    let v2 = Rule::new("big-order", "shop")
        .on(["order.placed"])
        .scope(Scope::payload("customer"))
        .action("charge")
        .version(2, reflexr::OnNewVersion::Continue)
        .shadow(0)
        .decide(|ev| Ok(Decision::Fire(ev.payload()?)));
    e.register_rule(v2).unwrap();
    e.run_until_idle().unwrap();

    let listed = json(&cli(&s.path, &["--json", "rules"]));
    let rows: Vec<(String, i64, Value)> = listed
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
            ("big-order".to_string(), 1, Value::Null),
            ("big-order@v2".to_string(), 2, Value::from("big-order"))
        ]
    );
    assert_eq!(listed[1]["shadow_fired"], 4, "v2 would fire every order");
    let table = cli(&s.path, &["rules"]);
    assert!(table.status.success(), "{}", stderr(&table));
    assert!(
        stdout(&table).contains("shadow of big-order"),
        "{}",
        stdout(&table)
    );

    let promote = |name: &str| {
        cli(
            &s.path,
            &[
                "rules",
                "promote",
                name,
                "--operator",
                "ops",
                "--reason",
                "v2 reviews every order",
            ],
        )
    };
    let out = promote("big-order");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("takes over after seq"),
        "{}",
        stdout(&out)
    );
    let audit = e.audit_log(5).unwrap();
    let recorded = e.audit_log(100).unwrap().len();
    assert_eq!(audit[0].action.as_str(), "promote_rule");
    assert_eq!(audit[0].operator, "ops");
    let again = promote("big-order");
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("promoted already"),
        "{}",
        stderr(&again)
    );
    let none = promote("nope");
    assert_eq!(none.status.code(), Some(1));
    assert_eq!(
        e.audit_log(100).unwrap().len(),
        recorded,
        "nothing more recorded"
    );

    // The process that registers both versions hands over.
    e.run_until_idle().unwrap();
    let listed = json(&cli(&s.path, &["--json", "rules"]));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["version"], 2);
}
