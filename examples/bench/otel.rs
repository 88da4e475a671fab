//! The cost of OpenTelemetry (feature `otlp`): `runs_4executors` with the
//! engine's spans and metrics exported over OTLP/HTTP to a sink on
//! loopback, against the same stage without, measured side by side.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use reflexr::otlp::Otlp;

use super::stages::{run_rate, run_rate_with};
use super::{Ctx, Figure};

/// An OTLP/HTTP receiver that keeps each export's body and answers 200
/// with an empty response, as a collector does; the bodies are decoded
/// after the stage ([`Sink::spans`]), so decoding takes no CPU from the
/// engine while it is timed (a collector runs elsewhere).
struct Sink {
    port: u16,
    traces: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Sink {
    fn start() -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let traces = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&traces);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let kept = Arc::clone(&kept);
                std::thread::spawn(move || serve(conn, &kept));
            }
        });
        Sink { port, traces }
    }

    /// The spans of every export received so far, decoded with the
    /// protobuf definitions.
    fn spans(&self) -> usize {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        self.traces
            .lock()
            .unwrap()
            .iter()
            .map(|body| {
                ExportTraceServiceRequest::decode(&body[..])
                    .expect("an export decodes")
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .map(|s| s.spans.len())
                    .sum::<usize>()
            })
            .sum()
    }
}

/// Serves one keep-alive connection until the client closes it.
fn serve(mut conn: TcpStream, traces: &Mutex<Vec<Vec<u8>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        // The head, then the body its Content-Length says.
        let (head_len, path, body_len) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                let len = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                    .unwrap_or(0usize);
                break (n, req.path.unwrap_or("").to_string(), len);
            }
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        };
        while buf.len() < head_len + body_len {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        }
        let body = &buf[head_len..head_len + body_len];
        if path == "/v1/traces" {
            traces.lock().unwrap().push(body.to_vec());
        }
        buf.drain(..head_len + body_len);
        let answer =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if conn.write_all(answer).is_err() {
            return;
        }
    }
}

/// No-op runs of four executors with every attempt's span and metrics
/// exported (the SDK's batch span processor and periodic reader with their
/// defaults, metrics every second), against the same without the feature's
/// providers, alternated five times each: medians. Baseline: the runs
/// without. What the sink decoded of the spans made is printed: the SDK
/// drops spans when its queue is full, and a figure bought by dropping
/// them would say so.
pub(crate) fn runs_4executors_otel(ctx: &Ctx) -> Vec<Figure> {
    let n = ctx.n(5_000, 40_000);
    let sink = Sink::start();
    let mut off = Vec::new();
    let mut on = Vec::new();
    let mut made = 0;
    let runs = if ctx.quick { 1 } else { 5 };
    for r in 0..runs {
        off.push(run_rate(
            ctx,
            &format!("runs_4executors_otel_off{r}"),
            4,
            n,
            |_| {},
        ));
        let otlp = Otlp::builder(format!("http://127.0.0.1:{}", sink.port))
            .service_name("reflexr-bench")
            .metrics_interval(Duration::from_secs(1))
            .build()
            .unwrap();
        let value = run_rate_with(
            ctx,
            &format!("runs_4executors_otel_on{r}"),
            4,
            n,
            |_| {},
            |b| b.opentelemetry(otlp.tracer_provider(), otlp.meter_provider()),
        );
        otlp.shutdown().unwrap();
        on.push(value);
        // Each run: its decision's span and its attempt's (and the
        // appends', made before the clock starts).
        made += 3 * n;
    }
    let received = sink.spans();
    eprintln!("  runs_4executors_otel: the sink decoded {received} of {made} spans");
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let off = mid(off);
    let on = mid(on);
    vec![
        Figure::new("runs_4executors_otel_off", off, "runs/s", off),
        Figure::new("runs_4executors_otel", on, "runs/s", off),
    ]
}
