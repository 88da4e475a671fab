//! OpenTelemetry export over OTLP/HTTP with no async runtime (feature
//! `otlp`): the SDK's batch span processor and periodic metric reader, each
//! on a thread of its own, send protobuf over a blocking HTTP client
//! ([`BlockingClient`], ureq). What the engine's spans and metrics are is in
//! the observability guide ([`crate::guide::observability`]).
//!
//! ```no_run
//! # fn main() -> reflexr::Result<()> {
//! // An OTLP/HTTP receiver: the OpenTelemetry Collector, Jaeger, Tempo…
//! let otlp = reflexr::otlp::Otlp::builder("http://127.0.0.1:4318")
//!     .service_name("shop")
//!     .build()?;
//! otlp.install_global(); // the application's own spans go there too
//! let engine = reflexr::Engine::builder("app.db")
//!     .opentelemetry(otlp.tracer_provider(), otlp.meter_provider())
//!     .open()?;
//! // … run the application …
//! drop(engine);
//! otlp.shutdown()?; // sends what is still buffered
//! # Ok(()) }
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::base::error::{Error, Result};

/// An HTTP client for the SDK's exporters that blocks: each export is one
/// request made on the exporting thread (the batch processor's, the
/// metric reader's), through [`ureq`]. Give it to an exporter of your own
/// with `WithHttpConfig::with_http_client`.
#[derive(Debug, Clone)]
pub struct BlockingClient {
    agent: ureq::Agent,
}

impl BlockingClient {
    /// A client whose requests give up after `timeout` (connecting,
    /// sending and reading the answer).
    pub fn new(timeout: Duration) -> BlockingClient {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            // The exporter reads the status itself (a 4xx is not retried,
            // a 429 or 503 is).
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        BlockingClient { agent }
    }
}

#[async_trait::async_trait]
impl HttpClient for BlockingClient {
    async fn send_bytes(
        &self,
        request: Request<Bytes>,
    ) -> std::result::Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, body.to_vec());
        let response = self.agent.run(request)?;
        let (parts, mut body) = response.into_parts();
        // Receivers answer with a small status message; 4 MiB is the
        // SDK's own clients' bound.
        let bytes = body.with_config().limit(4 << 20).read_to_vec()?;
        Ok(Response::from_parts(parts, Bytes::from(bytes)))
    }
}

/// The SDK's tracer and meter providers exporting to one OTLP/HTTP
/// endpoint (`{endpoint}/v1/traces`, `{endpoint}/v1/metrics`).
#[derive(Debug, Clone)]
pub struct Otlp {
    traces: SdkTracerProvider,
    metrics: SdkMeterProvider,
}

/// How [`Otlp`] exports, made by [`Otlp::builder`].
#[derive(Debug, Clone)]
pub struct OtlpBuilder {
    endpoint: String,
    service_name: Option<String>,
    timeout: Duration,
    metrics_interval: Duration,
    headers: Vec<(String, String)>,
}

impl Otlp {
    /// Exports to the OTLP/HTTP receiver at `endpoint`, its base address
    /// (`http://127.0.0.1:4318`, the conventional port). Defaults: the
    /// service name the SDK finds (`OTEL_SERVICE_NAME`, else
    /// `unknown_service`), a 10 s timeout per export, metrics every 60 s.
    pub fn builder(endpoint: impl Into<String>) -> OtlpBuilder {
        OtlpBuilder {
            endpoint: endpoint.into(),
            service_name: None,
            timeout: Duration::from_secs(10),
            metrics_interval: Duration::from_secs(60),
            headers: Vec::new(),
        }
    }

    /// The tracer provider: give it to [`crate::Builder::opentelemetry`].
    pub fn tracer_provider(&self) -> &SdkTracerProvider {
        &self.traces
    }

    /// The meter provider: give it to [`crate::Builder::opentelemetry`].
    pub fn meter_provider(&self) -> &SdkMeterProvider {
        &self.metrics
    }

    /// Makes both providers the global ones, for the application's own
    /// spans and metrics (and for engines opened without
    /// [`crate::Builder::opentelemetry`]).
    pub fn install_global(&self) {
        opentelemetry::global::set_tracer_provider(self.traces.clone());
        opentelemetry::global::set_meter_provider(self.metrics.clone());
    }

    /// Sends every span ended and every metric recorded so far, and waits
    /// for the receiver's answers.
    ///
    /// # Errors
    /// [`Error::Io`] when an export failed or timed out.
    pub fn flush(&self) -> Result<()> {
        self.traces.force_flush().map_err(export_error)?;
        self.metrics.force_flush().map_err(export_error)
    }

    /// Flushes, then stops the exporting threads; spans and metrics after
    /// it are dropped.
    ///
    /// # Errors
    /// [`Error::Io`] when the last exports failed, or the providers were
    /// shut down already.
    pub fn shutdown(&self) -> Result<()> {
        let traces = self.traces.shutdown().map_err(export_error);
        let metrics = self.metrics.shutdown().map_err(export_error);
        traces.and(metrics)
    }
}

impl OtlpBuilder {
    /// The `service.name` of the resource every span and metric carries.
    pub fn service_name(mut self, name: impl Into<String>) -> OtlpBuilder {
        self.service_name = Some(name.into());
        self
    }

    /// How long one export may take.
    pub fn timeout(mut self, timeout: Duration) -> OtlpBuilder {
        self.timeout = timeout;
        self
    }

    /// How often the metrics are exported.
    pub fn metrics_interval(mut self, every: Duration) -> OtlpBuilder {
        self.metrics_interval = every;
        self
    }

    /// A header every export carries (`authorization`, say).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> OtlpBuilder {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Builds the exporters and starts their threads.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an endpoint that is not an `http://` or
    /// `https://` address, or a zero timeout or interval.
    pub fn build(self) -> Result<Otlp> {
        let base = self.endpoint.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::invalid(
                "otlp endpoint",
                format!("{:?} is not an http:// or https:// address", self.endpoint),
            ));
        }
        if self.timeout.is_zero() || self.metrics_interval.is_zero() {
            return Err(Error::invalid(
                "otlp",
                "the timeout and the metrics interval must be more than zero",
            ));
        }
        let headers: std::collections::HashMap<String, String> = self.headers.into_iter().collect();
        let client = BlockingClient::new(self.timeout);
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(self.timeout)
            .with_headers(headers.clone())
            .build()
            .map_err(|e| Error::invalid("otlp", e.to_string()))?;
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/metrics"))
            .with_timeout(self.timeout)
            .with_headers(headers)
            .build()
            .map_err(|e| Error::invalid("otlp", e.to_string()))?;
        let mut resource = Resource::builder();
        if let Some(name) = self.service_name {
            resource = resource.with_service_name(name);
        }
        let resource = resource.build();
        let traces = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();
        let reader = PeriodicReader::builder(metrics)
            .with_interval(self.metrics_interval)
            .build();
        let metrics = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource)
            .build();
        Ok(Otlp { traces, metrics })
    }
}

fn export_error(e: opentelemetry_sdk::error::OTelSdkError) -> Error {
    Error::Io {
        kind: std::io::ErrorKind::Other,
        message: format!("OpenTelemetry export: {e}"),
    }
}
