//! Traces over OTLP, for the embedded mode and anyone off AWS (the Lambda functions trace through
//! X-Ray and never build this). Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; then every span at info or above goes out as an
//! OTLP span over HTTP/protobuf, in batches on tokio, configured by the SDK's own `OTEL_*`
//! variables (headers, timeout, resource attributes). A collector that cannot be reached costs a
//! warning on stderr, once, and never the command's output or exit status.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::fail::Failure;

/// Either turns exporting on; the traces-only one wins where both are set, as the SDK reads them.
const ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];
/// The protocol variables, the traces-only one first: only `http/protobuf` is built in.
const PROTOCOLS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];
/// The service's name unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` gives another.
const SERVICE: &str = "countersign";
/// The longest a command waits on exit for its last spans to reach the collector: a slow or
/// silent one loses them rather than hold up the command.
const LAST_FLUSH: Duration = Duration::from_secs(3);

/// The exporting tracer provider of this process, while traces are on.
pub struct Traces {
    provider: SdkTracerProvider,
}

/// Whether an OTLP endpoint is set, so traces go out.
pub fn on() -> bool {
    ENDPOINTS
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

impl Traces {
    /// The exporter the environment asks for, or none when no endpoint is set. A variable the
    /// SDK cannot use (an endpoint that is no URL, a protocol other than `http/protobuf`) is a
    /// usage error, before the command does anything.
    pub fn from_env() -> Result<Option<Self>, Failure> {
        if !on() {
            return Ok(None);
        }
        let protocol = PROTOCOLS.iter().find_map(|name| {
            let protocol = std::env::var(name).ok().filter(|p| !p.is_empty());
            protocol.map(|protocol| (name, protocol))
        });
        if let Some((name, protocol)) = protocol
            && protocol != "http/protobuf"
        {
            return Err(Failure::usage(format!(
                "{name}={protocol}: countersign exports traces over http/protobuf only"
            )));
        }
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|e| Failure::usage(format!("cannot export traces over OTLP: {e}")))?;
        let exporter = WarnOnce {
            exporter,
            warned: AtomicBool::new(false),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter, Tokio).build())
            .with_resource(resource())
            .build();
        Ok(Some(Self { provider }))
    }

    /// The layer that turns this process's spans into OTLP spans.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer(SERVICE))
    }

    /// Sends the spans not sent yet and stops the exporter, waiting at most [`LAST_FLUSH`].
    pub async fn shut_down(self) {
        // The SDK blocks its thread until the exporter's task answers: a thread of its own,
        // not the runtime's blocking pool, which the runtime would wait for on exit.
        let (done, shut) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || done.send(self.provider.shutdown()));
        match tokio::time::timeout(LAST_FLUSH, shut).await {
            // An export that failed was said by the exporter, once.
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => tracing::warn!(
                "the last traces were not exported within {}s",
                LAST_FLUSH.as_secs()
            ),
        }
    }
}

/// The span a one-shot command runs in, named as the command (`countersign review`): the
/// root of its trace.
pub fn command_span(name: &str) -> tracing::Span {
    tracing::info_span!("command", otel.name = %format!("countersign {name}"), command = name)
}

/// The SDK's resource from `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, named
/// [`SERVICE`] where neither names the service.
fn resource() -> Resource {
    let resource = Resource::builder().build();
    let named = resource
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    match named {
        true => resource,
        false => Resource::builder().with_service_name(SERVICE).build(),
    }
}

/// Continues the caller's trace where a request carries a W3C `traceparent`: its span becomes
/// the parent of the request's.
pub async fn continue_trace(request: Request, next: Next) -> Response {
    let parent = TraceContextPropagator::new()
        .extract(&opentelemetry_http::HeaderExtractor(request.headers()));
    next.run(request).with_context(parent).await
}

/// An exporter that says on stderr, once, that the collector refused or could not be reached,
/// rather than once per batch (or, as the SDK does without its internal logs, never).
#[derive(Debug)]
struct WarnOnce {
    exporter: SpanExporter,
    warned: AtomicBool,
}

impl opentelemetry_sdk::trace::SpanExporter for WarnOnce {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let exported = self.exporter.export(batch).await;
        if let Err(error) = &exported
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                %error,
                "cannot export traces over OTLP; spans are dropped until the collector answers \
                 (said once)"
            );
        }
        exported
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.exporter.set_resource(resource);
    }
}
