//! The OpenTelemetry export (feature `otlp`), read back by a receiver that
//! decodes it with the official protobuf definitions (tests/otel/receiver.py,
//! PyPI's opentelemetry-proto; `.ci/run` installs it and names its Python in
//! `REFLEXR_OTLP_PYTHON`, else `python3` is tried). It checks the spans of
//! one change through the engine — an append, the rule's decision, a run
//! whose first attempt fails and whose retry emits an event, a follower's
//! relay into another file — their parents and links, and the messaging
//! semantic conventions' attributes, and the metrics.
//!
//! DESIGN.md invariant 5 for the traces: an attempt's span is its own (a
//! retry is a new trace linked to the run's), and what the attempt emitted
//! is its child; invariant 3: the relayed event keeps its id.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider};
use reflexr::otlp::Otlp;
use reflexr::{Decision, Engine, Follow, ManualClock, NewEvent, Query, RetryPolicy, Rule};
use serde_json::{Value, json};

/// The receiver, stopped when dropped (its stdin closes, and it is killed).
struct Receiver {
    child: Child,
    port: u16,
}

impl Receiver {
    fn start() -> Receiver {
        let python = std::env::var("REFLEXR_OTLP_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otel/receiver.py");
        let mut child = Command::new(&python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {python}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| {
            panic!(
                "the OTLP receiver did not start under {python}: it needs PyPI's \
                 opentelemetry-proto (pip install -r tests/otel/requirements.txt, then \
                 REFLEXR_OTLP_PYTHON=<that python>; bash tests/otel/run.sh does both)"
            )
        });
        Receiver { child, port }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn get(&self, what: &str) -> Value {
        ureq::get(format!("{}/{what}", self.endpoint()))
            .call()
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap()
    }
}

impl Receiver {
    /// The spans it decoded so far.
    fn spans(&self) -> Vec<Span> {
        self.get("spans")
            .as_array()
            .unwrap()
            .iter()
            .map(Span::from)
            .collect()
    }
}

/// A receiver, an export to it, and an engine in a new file exporting
/// there (its directory kept while the test holds it).
fn exporting() -> (Receiver, Otlp, tempfile::TempDir, Engine) {
    let receiver = Receiver::start();
    let otlp = Otlp::builder(receiver.endpoint()).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::builder(dir.path().join("app.db"))
        .opentelemetry(otlp.tracer_provider(), otlp.meter_provider())
        .open()
        .unwrap();
    (receiver, otlp, dir, e)
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A decoded span, as the receiver gives it.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    kind: i64,
    trace: String,
    id: String,
    parent: String,
    links: Vec<(String, String)>,
    attrs: HashMap<String, Value>,
    status: (i64, String),
}

impl Span {
    fn from(v: &Value) -> Span {
        Span {
            name: v["name"].as_str().unwrap().into(),
            kind: v["kind"].as_i64().unwrap(),
            trace: v["trace_id"].as_str().unwrap().into(),
            id: v["span_id"].as_str().unwrap().into(),
            parent: v["parent_span_id"].as_str().unwrap().into(),
            links: v["links"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    (
                        l["trace_id"].as_str().unwrap().into(),
                        l["span_id"].as_str().unwrap().into(),
                    )
                })
                .collect(),
            attrs: v["attributes"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            status: (
                v["status"]["code"].as_i64().unwrap(),
                v["status"]["message"].as_str().unwrap().into(),
            ),
        }
    }

    fn attr(&self, key: &str) -> &Value {
        self.attrs.get(key).unwrap_or(&Value::Null)
    }

    fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace, self.id)
    }

    /// Checks the attributes every reflexr span has.
    fn is_messaging(&self, op_type: &str, op_name: &str, destination: &str) {
        assert_eq!(self.attr("messaging.system"), "reflexr", "{self:?}");
        assert_eq!(self.attr("messaging.operation.type"), op_type, "{self:?}");
        assert_eq!(self.attr("messaging.operation.name"), op_name, "{self:?}");
        assert_eq!(
            self.attr("messaging.destination.name"),
            destination,
            "{self:?}"
        );
        assert_eq!(self.name, format!("{op_name} {destination}"));
    }
}

// The protobuf's SpanKind and StatusCode values.
const CONSUMER: i64 = 5;
const PRODUCER: i64 = 4;
const INTERNAL: i64 = 1;
const STATUS_ERROR: i64 = 2;
const STATUS_UNSET: i64 = 0;

#[test]
fn a_change_is_traced_from_its_append_through_a_retried_run_to_a_relay_into_another_file() {
    let receiver = Receiver::start();
    let otlp = Otlp::builder(receiver.endpoint())
        .service_name("reflexr-test")
        // Exported when flushed, not on a timer.
        .metrics_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let hub_path = dir.path().join("hub.db");
    let hub = Engine::builder(&hub_path)
        .clock(clock.clone())
        .open()
        .unwrap();
    hub.ensure_workspace("audit", &["order.placed", "order.confirmed"])
        .unwrap();
    let e = Engine::builder(dir.path().join("edge.db"))
        .clock(clock.clone())
        .opentelemetry(otlp.tracer_provider(), otlp.meter_provider())
        .open()
        .unwrap();
    e.ensure_workspace("shop", &["order.placed", "order.confirmed"])
        .unwrap();
    e.register_rule(
        Rule::new("confirm", "shop")
            .on(["order.placed"])
            .action("confirm")
            .retry(RetryPolicy::attempts(2).fixed(Duration::ZERO))
            .decide(|_| Ok(Decision::Fire(json!({})))),
    )
    .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    e.register_action("confirm", move |_, ctx| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err("the payment service timed out".into());
        }
        ctx.emit(
            "ok",
            NewEvent::new("order.confirmed", "order/7", "engine", 0),
        )?;
        Ok(())
    })
    .unwrap();
    e.follow(Follow::new("shop", "audit").to_file(&hub_path))
        .unwrap();

    // The application's own span is current when it appends.
    let app = otlp.tracer_provider().tracer("shop-app");
    let placed = {
        let cx = opentelemetry::Context::current_with_span(app.start("POST /orders"));
        let _in = cx.clone().attach();
        e.append(
            "shop",
            &NewEvent::new("order.placed", "order/7", "web", 1).id("order-7-placed"),
        )
        .unwrap()
    };
    e.run_until_idle().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    drop(e);
    otlp.flush().unwrap();

    let spans = receiver.spans();
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let one = |name: &str| -> &Span {
        let found = named(name);
        assert_eq!(found.len(), 1, "one {name:?} span in {spans:#?}");
        found[0]
    };
    let child_of = |parent: &Span, name: &str| -> &Span {
        let found: Vec<&Span> = named(name)
            .into_iter()
            .filter(|s| s.parent == parent.id)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one {name:?} under {parent:?} in {spans:#?}"
        );
        assert_eq!(found[0].trace, parent.trace);
        found[0]
    };

    // The application's span, and the append under it.
    let request = one("POST /orders");
    assert_eq!(request.kind, INTERNAL);
    let append = child_of(request, "append shop");
    assert_eq!(append.kind, PRODUCER);
    append.is_messaging("create", "append", "shop");
    assert_eq!(append.attr("messaging.message.id"), "order-7-placed");
    assert_eq!(append.attr("reflexr.event.type"), "order.placed");
    assert_eq!(append.attr("reflexr.event.seq"), placed.seq);
    // The file keeps the append's span on the event.
    let hub_event = |id: &str| {
        hub.read(&Query::new("audit"))
            .unwrap()
            .into_iter()
            .find(|ev| ev.id == id)
            .unwrap_or_else(|| panic!("{id} relayed"))
    };
    let edge = Engine::open(dir.path().join("edge.db")).unwrap();
    let stored = edge.event(placed.seq).unwrap().unwrap();
    assert_eq!(stored.traceparent, Some(append.traceparent()));

    // The rule's decision, a child of the append.
    let decide = child_of(append, "decide shop");
    assert_eq!(decide.kind, CONSUMER);
    decide.is_messaging("process", "decide", "shop");
    assert_eq!(decide.attr("messaging.consumer.group.name"), "confirm");
    assert_eq!(decide.attr("messaging.message.id"), "order-7-placed");
    let run_id = decide.attr("reflexr.run.id").as_str().unwrap().to_string();
    // As a `sqlite3` user reads it.
    let file = rusqlite::Connection::open(dir.path().join("edge.db")).unwrap();
    let stored: Option<String> = file
        .query_row(
            "SELECT traceparent FROM reflexr_runs WHERE id = ?1",
            [&run_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, Some(decide.traceparent()));

    // The first attempt is the decision's child, and failed.
    let first = child_of(decide, "process confirm");
    assert_eq!(first.kind, CONSUMER);
    first.is_messaging("process", "process", "confirm");
    assert_eq!(first.attr("messaging.message.id"), run_id.as_str());
    assert_eq!(first.attr("reflexr.run.attempt"), 1);
    assert_eq!(first.attr("error.type"), "handler_error");
    assert_eq!(
        first.status,
        (STATUS_ERROR, "the payment service timed out".to_string())
    );
    // The retry is a trace of its own, linked to the run's context.
    let attempts = named("process confirm");
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let retry = attempts.iter().find(|s| s.id != first.id).unwrap();
    assert_eq!(retry.attr("reflexr.run.attempt"), 2);
    assert_ne!(retry.trace, decide.trace);
    assert_eq!(retry.parent, "");
    assert_eq!(retry.links, [(decide.trace.clone(), decide.id.clone())]);
    assert_eq!(retry.status.0, STATUS_UNSET);
    assert_eq!(retry.attr("error.type"), &Value::Null);

    // What the retry emitted is its child.
    let emitted = child_of(retry, "append shop");
    emitted.is_messaging("create", "append", "shop");
    let confirmed_id = format!("{run_id}/ok");
    assert_eq!(emitted.attr("messaging.message.id"), confirmed_id.as_str());

    // Each event's relay is its append's child, and the append into the
    // other file the relay's; the relayed event keeps its id and carries
    // the target's append.
    for (source, id) in [(append, "order-7-placed"), (emitted, confirmed_id.as_str())] {
        let relay = child_of(source, "relay shop");
        assert_eq!(relay.kind, CONSUMER);
        relay.is_messaging("process", "relay", "shop");
        assert_eq!(relay.attr("messaging.consumer.group.name"), "shop-to-audit");
        assert_eq!(relay.attr("messaging.message.id"), id);
        let target = child_of(relay, "append audit");
        target.is_messaging("create", "append", "audit");
        assert_eq!(target.attr("messaging.message.id"), id);
        assert_eq!(hub_event(id).traceparent, Some(target.traceparent()));
    }

    // The engine's own bookkeeping (RuleFired) makes no span: these are all.
    assert_eq!(spans.len(), 10, "{spans:#?}");
    assert!(
        spans
            .iter()
            .all(|s| s.name == "POST /orders" || (s.attr("messaging.system") == "reflexr"))
    );

    // The metrics, named per the conventions.
    let metrics = receiver.get("metrics");
    let points = |name: &str| -> Vec<Value> {
        metrics
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["name"] == name)
            .flat_map(|m| m["points"].as_array().unwrap().clone())
            .collect()
    };
    let sum_for = |name: &str, destination: &str, field: &str| -> i64 {
        points(name)
            .iter()
            .filter(|p| p["attributes"]["messaging.destination.name"] == destination)
            .map(|p| p[field].as_i64().unwrap())
            .sum()
    };
    assert_eq!(
        sum_for("messaging.client.sent.messages", "shop", "value"),
        2
    );
    assert_eq!(
        sum_for("messaging.client.sent.messages", "audit", "value"),
        2
    );
    assert_eq!(
        sum_for("messaging.client.consumed.messages", "confirm", "value"),
        2
    );
    assert_eq!(sum_for("messaging.process.duration", "confirm", "count"), 2);
    let failed: i64 = points("messaging.process.duration")
        .iter()
        .filter(|p| p["attributes"]["error.type"] == "handler_error")
        .map(|p| p["count"].as_i64().unwrap())
        .sum();
    assert_eq!(failed, 1);
    let duration = metrics
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "messaging.process.duration")
        .unwrap();
    assert_eq!(duration["unit"], "s");
    assert_eq!(duration["scope"], "reflexr");
    // In seconds, the conventions' buckets.
    let bounds = &duration["points"][0]["bounds"];
    assert_eq!(bounds[0], 0.005, "{bounds}");
    assert_eq!(bounds.as_array().unwrap().last().unwrap(), 10.0);
    otlp.shutdown().unwrap();
}

/// An endpoint that is not an address is refused when built.
#[test]
fn an_otlp_endpoint_that_is_not_http_is_a_typed_error() {
    let err = Otlp::builder("127.0.0.1:4318").build().unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    let err = Otlp::builder("http://127.0.0.1:4318")
        .timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(err.is_bad_input(), "{err}");
}

/// An explicit traceparent is the append span's parent, whatever span is
/// current.
#[test]
fn an_events_own_traceparent_is_its_append_spans_parent() {
    let (receiver, otlp, _dir, e) = exporting();
    e.ensure_workspace("shop", &["order.placed"]).unwrap();
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let seq = e
        .append(
            "shop",
            &NewEvent::new("order.placed", "order/1", "web", 1).traceparent(TP),
        )
        .unwrap()
        .seq;
    otlp.flush().unwrap();
    let spans = receiver.spans();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let append = &spans[0];
    assert_eq!(append.trace, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(append.parent, "00f067aa0ba902b7");
    assert_eq!(
        e.event(seq).unwrap().unwrap().traceparent,
        Some(append.traceparent())
    );
    otlp.shutdown().unwrap();
}

/// An application's enqueue and delivery are children of its current span,
/// and their runs' first attempts children of those.
#[test]
fn an_enqueue_and_a_delivery_are_the_callers_spans_children_and_their_attempts_theirs() {
    let (receiver, otlp, _dir, e) = exporting();
    e.register_action("resize", |_, _| Ok(())).unwrap();
    e.register_channel("mail", reflexr::ChannelPolicy::BestEffort, |_, _| Ok(()))
        .unwrap();
    let app = otlp.tracer_provider().tracer("app");
    let (task, mail) = {
        let cx = opentelemetry::Context::current_with_span(app.start("POST /photos"));
        let _in = cx.clone().attach();
        let task = e
            .enqueue(&reflexr::Enqueue::new("resize", &json!({ "photo": 1 })))
            .unwrap()
            .id;
        let mail = e
            .deliver(&reflexr::Delivery::new("mail", "uploaded").to("ann@example.com"))
            .unwrap()
            .id;
        (task, mail)
    };
    e.run_until_idle().unwrap();
    otlp.flush().unwrap();
    let spans = receiver.spans();
    let request = spans.iter().find(|s| s.name == "POST /photos").unwrap();
    for (action, id) in [("resize", &task), ("delivery/mail", &mail)] {
        let enqueue = spans
            .iter()
            .find(|s| s.name == format!("enqueue {action}"))
            .unwrap_or_else(|| panic!("enqueue {action} in {spans:#?}"));
        assert_eq!(enqueue.kind, PRODUCER);
        assert_eq!(
            (&enqueue.trace, &enqueue.parent),
            (&request.trace, &request.id)
        );
        enqueue.is_messaging("create", "enqueue", action);
        assert_eq!(enqueue.attr("messaging.message.id"), id.as_str());
        let attempt = spans
            .iter()
            .find(|s| s.name == format!("process {action}"))
            .unwrap_or_else(|| panic!("process {action} in {spans:#?}"));
        assert_eq!(
            (&attempt.trace, &attempt.parent),
            (&enqueue.trace, &enqueue.id)
        );
        assert_eq!(attempt.attr("messaging.message.id"), id.as_str());
    }
    otlp.shutdown().unwrap();
}
