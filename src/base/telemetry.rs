//! The engine's one seam to OpenTelemetry (feature `otel`): the spans and
//! metrics of an append, a rule's decision, a run's enqueue and each of its
//! attempts, and a follower's relay, named and attributed per the messaging
//! semantic conventions. Without the feature every item here is empty and
//! every call does nothing, so the layers call it without `cfg`s and
//! nothing of OpenTelemetry is compiled.
//!
//! What ties the spans together is the W3C `traceparent` the file keeps
//! (`reflexr_events.traceparent`, `reflexr_runs.traceparent`): an append
//! stores its span's context on the event, a decision or an enqueue its
//! span's on the run, an attempt gives its span's to the events it emits,
//! a relay its span's to the event it publishes. The first attempt is a
//! child of the run's context; a retry starts a trace of its own with a
//! link back to it (awa's ADR-039, `opentelemetry_oban`), so an event that
//! fans out into retried runs does not make one trace of them all.

/// The engine's instruments: none without the feature, or when the
/// providers are no-ops (the global ones when the application installed
/// none).
#[derive(Clone, Default)]
pub(crate) struct Telemetry {
    #[cfg(feature = "otel")]
    inner: Option<std::sync::Arc<otel::Instruments>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.on() {
            "Telemetry(on)"
        } else {
            "Telemetry(off)"
        })
    }
}

/// One span under way: ended when dropped. Empty without the feature.
#[derive(Default)]
pub(crate) struct Span {
    #[cfg(feature = "otel")]
    inner: Option<otel::Live>,
}

/// What a span's operation was about, for its name and attributes.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) enum Op<'a> {
    /// An application's or a run's append to `workspace`; `parent` the
    /// traceparent the event was given (else the caller's current span).
    Append {
        workspace: &'a str,
        event_type: &'a str,
        parent: Option<&'a str>,
    },
    /// A rule's firing for an event: the run it makes carries this span.
    Decide {
        workspace: &'a str,
        rule: &'a str,
        event_id: &'a str,
        run_id: &'a str,
        action: &'a str,
        parent: Option<&'a str>,
    },
    /// An application's enqueue of a task.
    Enqueue {
        action: &'a str,
        run_id: &'a str,
        parent: Option<&'a str>,
    },
    /// One attempt of a run: the first a child of the run's context, a
    /// retry a new trace linked to it.
    Attempt {
        action: &'a str,
        run_id: &'a str,
        attempt: u32,
        parent: Option<&'a str>,
    },
    /// A follower's publish of one source event into its target.
    Relay {
        follower: &'a str,
        source: &'a str,
        target: &'a str,
        event_id: &'a str,
        parent: Option<&'a str>,
    },
}

impl Telemetry {
    /// Whether spans are made at all.
    pub(crate) fn on(&self) -> bool {
        #[cfg(feature = "otel")]
        {
            self.inner.is_some()
        }
        #[cfg(not(feature = "otel"))]
        {
            false
        }
    }

    /// Starts the span of `op`.
    #[cfg_attr(not(feature = "otel"), allow(unused_variables))]
    pub(crate) fn start(&self, op: Op<'_>) -> Span {
        #[cfg(feature = "otel")]
        {
            Span {
                inner: self.inner.as_ref().map(|i| i.start(op)),
            }
        }
        #[cfg(not(feature = "otel"))]
        {
            Span::default()
        }
    }

    /// Counts an event appended to `workspace` (not one re-appended).
    #[cfg_attr(not(feature = "otel"), allow(unused_variables))]
    pub(crate) fn appended(&self, workspace: &str) {
        #[cfg(feature = "otel")]
        if let Some(i) = &self.inner {
            i.appended(workspace);
        }
    }
}

impl Span {
    /// The span's context as a W3C traceparent, if it has a valid one (a
    /// no-op provider's span has none, and keeps its parent's).
    pub(crate) fn traceparent(&self) -> Option<String> {
        #[cfg(feature = "otel")]
        {
            self.inner.as_ref().and_then(otel::Live::traceparent)
        }
        #[cfg(not(feature = "otel"))]
        {
            None
        }
    }

    /// Adds what the operation learned once done: the event's id and seq
    /// after an append, whether it was there already.
    #[cfg_attr(not(feature = "otel"), allow(unused_variables))]
    pub(crate) fn appended(&mut self, id: &str, seq: i64, existing: bool) {
        #[cfg(feature = "otel")]
        if let Some(l) = &mut self.inner {
            l.appended(id, seq, existing);
        }
    }

    /// Marks the operation failed with `why`; `kind` is the
    /// `error.type` (a low-cardinality word: `"handler_error"`,
    /// `"panic"`, an error's kind).
    #[cfg_attr(not(feature = "otel"), allow(unused_variables))]
    pub(crate) fn fail(&mut self, kind: &'static str, why: &str) {
        #[cfg(feature = "otel")]
        if let Some(l) = &mut self.inner {
            l.fail(kind, why);
        }
    }

    /// Makes the span the thread's current one until the guard drops: what
    /// a handler's own spans and appends take as their parent.
    pub(crate) fn enter(&self) -> Entered {
        #[cfg(feature = "otel")]
        {
            Entered {
                _guard: self.inner.as_ref().map(otel::Live::enter),
            }
        }
        #[cfg(not(feature = "otel"))]
        {
            Entered {}
        }
    }
}

/// The span entered, until dropped.
pub(crate) struct Entered {
    #[cfg(feature = "otel")]
    _guard: Option<opentelemetry::ContextGuard>,
}

#[cfg(feature = "otel")]
pub(crate) use otel::from_providers;

/// An engine error's `error.type`: a word of few values.
pub(crate) fn error_type(e: &crate::base::error::Error) -> &'static str {
    if e.is_append_conflict() {
        "append_conflict"
    } else if e.is_conflict() {
        "conflict"
    } else if e.is_not_found() {
        "not_found"
    } else if e.is_bad_input() {
        "invalid"
    } else if e.is_lease_lost() {
        "lease_lost"
    } else if e.is_busy() {
        "busy"
    } else if e.is_storage_fault() {
        "storage"
    } else {
        "_OTHER"
    }
}

#[cfg(feature = "otel")]
mod otel {
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::Instant;

    use opentelemetry::global::{BoxedSpan, BoxedTracer};
    use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider};
    use opentelemetry::trace::{
        Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags,
        TraceId, TraceState, Tracer as _, TracerProvider,
    };
    use opentelemetry::{Context, InstrumentationScope, KeyValue};

    use super::{Op, Telemetry};

    /// What the messaging conventions call this system.
    const SYSTEM: &str = "reflexr";

    pub(crate) struct Instruments {
        tracer: BoxedTracer,
        /// `messaging.client.sent.messages`: events appended.
        sent: Counter<u64>,
        /// `messaging.client.consumed.messages`: attempts started.
        consumed: Counter<u64>,
        /// `messaging.process.duration`: an attempt's handler, in seconds.
        process: Histogram<f64>,
    }

    fn scope() -> InstrumentationScope {
        InstrumentationScope::builder("reflexr")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build()
    }

    /// The instruments of `traces` and `metrics`.
    pub(crate) fn from_providers<P, M>(traces: &P, metrics: &M) -> Telemetry
    where
        P: TracerProvider,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as opentelemetry::trace::Tracer>::Span: Send + Sync + 'static,
        M: MeterProvider + ?Sized,
    {
        let tracer = BoxedTracer::new(Box::new(traces.tracer_with_scope(scope())));
        let meter = metrics.meter_with_scope(scope());
        Telemetry {
            inner: Some(Arc::new(Instruments::new(tracer, &meter))),
        }
    }

    impl Telemetry {
        /// The global providers' instruments, as they are when the engine
        /// opens (no-ops if the application installed none).
        pub(crate) fn global() -> Telemetry {
            let tracer = opentelemetry::global::tracer_with_scope(scope());
            let meter = opentelemetry::global::meter_with_scope(scope());
            Telemetry {
                inner: Some(Arc::new(Instruments::new(tracer, &meter))),
            }
        }
    }

    impl Instruments {
        fn new(tracer: BoxedTracer, meter: &Meter) -> Instruments {
            Instruments {
                tracer,
                sent: meter
                    .u64_counter("messaging.client.sent.messages")
                    .with_unit("{message}")
                    .with_description("Events appended to a workspace's log")
                    .build(),
                consumed: meter
                    .u64_counter("messaging.client.consumed.messages")
                    .with_unit("{message}")
                    .with_description("Attempts of runs started")
                    .build(),
                process: meter
                    .f64_histogram("messaging.process.duration")
                    .with_unit("s")
                    .with_description("How long an attempt's handler ran")
                    // The conventions' boundaries for a duration in seconds
                    // (the SDK's defaults are for milliseconds).
                    .with_boundaries(vec![
                        0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                        10.0,
                    ])
                    .build(),
            }
        }

        pub(crate) fn appended(&self, workspace: &str) {
            self.sent.add(
                1,
                &[
                    KeyValue::new("messaging.system", SYSTEM),
                    KeyValue::new("messaging.operation.name", "append"),
                    KeyValue::new("messaging.destination.name", workspace.to_string()),
                ],
            );
        }

        pub(crate) fn start(&self, op: Op<'_>) -> Live {
            let mut attrs = Vec::with_capacity(9);
            attrs.push(KeyValue::new("messaging.system", SYSTEM));
            let mut links = Vec::new();
            let (name, kind, op_type, op_name, destination, parent) = match op {
                Op::Append {
                    workspace,
                    event_type,
                    parent,
                } => {
                    attrs.push(KeyValue::new("reflexr.event.type", event_type.to_string()));
                    let cx = given_or_current(parent);
                    (
                        "append",
                        SpanKind::Producer,
                        "create",
                        "append",
                        workspace,
                        cx,
                    )
                }
                Op::Decide {
                    workspace,
                    rule,
                    event_id,
                    run_id,
                    action,
                    parent,
                } => {
                    attrs.push(KeyValue::new(
                        "messaging.consumer.group.name",
                        rule.to_string(),
                    ));
                    attrs.push(KeyValue::new("messaging.message.id", event_id.to_string()));
                    attrs.push(KeyValue::new("reflexr.run.id", run_id.to_string()));
                    attrs.push(KeyValue::new("reflexr.action", action.to_string()));
                    (
                        "decide",
                        SpanKind::Consumer,
                        "process",
                        "decide",
                        workspace,
                        remote(parent),
                    )
                }
                Op::Enqueue {
                    action,
                    run_id,
                    parent,
                } => {
                    attrs.push(KeyValue::new("messaging.message.id", run_id.to_string()));
                    let cx = given_or_current(parent);
                    (
                        "enqueue",
                        SpanKind::Producer,
                        "create",
                        "enqueue",
                        action,
                        cx,
                    )
                }
                Op::Attempt {
                    action,
                    run_id,
                    attempt,
                    parent,
                } => {
                    attrs.push(KeyValue::new("messaging.message.id", run_id.to_string()));
                    attrs.push(KeyValue::new("reflexr.run.attempt", i64::from(attempt)));
                    let cx = if attempt <= 1 {
                        remote(parent)
                    } else {
                        // A retry: a trace of its own, linked to the run's.
                        if let Some(sc) = parent.and_then(parse) {
                            links.push(Link::with_context(sc));
                        }
                        Context::new()
                    };
                    self.consumed.add(
                        1,
                        &[
                            KeyValue::new("messaging.system", SYSTEM),
                            KeyValue::new("messaging.operation.name", "process"),
                            KeyValue::new("messaging.destination.name", action.to_string()),
                        ],
                    );
                    (
                        "process",
                        SpanKind::Consumer,
                        "process",
                        "process",
                        action,
                        cx,
                    )
                }
                Op::Relay {
                    follower,
                    source,
                    target,
                    event_id,
                    parent,
                } => {
                    attrs.push(KeyValue::new(
                        "messaging.consumer.group.name",
                        follower.to_string(),
                    ));
                    attrs.push(KeyValue::new("messaging.message.id", event_id.to_string()));
                    attrs.push(KeyValue::new("reflexr.relay.target", target.to_string()));
                    (
                        "relay",
                        SpanKind::Consumer,
                        "process",
                        "relay",
                        source,
                        remote(parent),
                    )
                }
            };
            attrs.push(KeyValue::new("messaging.operation.type", op_type));
            attrs.push(KeyValue::new("messaging.operation.name", op_name));
            attrs.push(KeyValue::new(
                "messaging.destination.name",
                destination.to_string(),
            ));
            let span = self
                .tracer
                .span_builder(Cow::Owned(format!("{name} {destination}")))
                .with_kind(kind)
                .with_attributes(attrs)
                .with_links(links)
                .start_with_context(&self.tracer, &parent);
            let attempt = match op {
                Op::Attempt { action, .. } => Some((self.process.clone(), action.to_string())),
                _ => None,
            };
            Live {
                span: Some(span),
                started: Instant::now(),
                attempt,
                error: None,
            }
        }
    }

    /// A span under way, and what its end records.
    pub(crate) struct Live {
        /// Taken into a context while entered.
        span: Option<BoxedSpan>,
        started: Instant,
        /// An attempt's duration histogram and action.
        attempt: Option<(Histogram<f64>, String)>,
        error: Option<&'static str>,
    }

    impl Live {
        pub(crate) fn traceparent(&self) -> Option<String> {
            let sc = self.span.as_ref()?.span_context();
            sc.is_valid().then(|| {
                format!(
                    "00-{}-{}-{:02x}",
                    sc.trace_id(),
                    sc.span_id(),
                    sc.trace_flags().to_u8()
                )
            })
        }

        pub(crate) fn appended(&mut self, id: &str, seq: i64, existing: bool) {
            if let Some(span) = &mut self.span {
                span.set_attribute(KeyValue::new("messaging.message.id", id.to_string()));
                span.set_attribute(KeyValue::new("reflexr.event.seq", seq));
                if existing {
                    span.set_attribute(KeyValue::new("reflexr.event.existing", true));
                }
            }
        }

        pub(crate) fn fail(&mut self, kind: &'static str, why: &str) {
            self.error = Some(kind);
            if let Some(span) = &mut self.span {
                span.set_attribute(KeyValue::new("error.type", kind));
                span.set_status(Status::error(why.to_string()));
            }
        }

        pub(crate) fn enter(&self) -> opentelemetry::ContextGuard {
            let cx = match self.span.as_ref() {
                Some(s) => Context::new().with_remote_span_context(s.span_context().clone()),
                None => Context::new(),
            };
            cx.attach()
        }
    }

    impl Drop for Live {
        fn drop(&mut self) {
            if let Some((histogram, action)) = self.attempt.take() {
                let mut attrs = vec![
                    KeyValue::new("messaging.system", SYSTEM),
                    KeyValue::new("messaging.operation.name", "process"),
                    KeyValue::new("messaging.destination.name", action),
                ];
                if let Some(kind) = self.error {
                    attrs.push(KeyValue::new("error.type", kind));
                }
                histogram.record(self.started.elapsed().as_secs_f64(), &attrs);
            }
            if let Some(mut span) = self.span.take() {
                span.end();
            }
        }
    }

    /// The context of the traceparent a caller gave, else the caller's
    /// current one.
    fn given_or_current(tp: Option<&str>) -> Context {
        match tp.and_then(parse) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::current(),
        }
    }

    /// The context of a stored traceparent, or none (a new trace).
    fn remote(tp: Option<&str>) -> Context {
        match tp.and_then(parse) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        }
    }

    /// A stored traceparent's span context (the engine checked its form
    /// when it was stored).
    fn parse(tp: &str) -> Option<SpanContext> {
        let mut parts = tp.split('-');
        let (_, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let sc = SpanContext::new(
            TraceId::from_hex(trace).ok()?,
            SpanId::from_hex(span).ok()?,
            TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
            true,
            TraceState::default(),
        );
        sc.is_valid().then_some(sc)
    }
}
