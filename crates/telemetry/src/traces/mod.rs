//! OpenTelemetry traces over OTLP/HTTP (protobuf), off unless an OTLP endpoint
//! is configured with the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, with `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_SERVICE_NAME`, `OTEL_BSP_*`).
//!
//! Spans are made from the audit log as it is written ([`spans`]), by a
//! service of their own that follows it: every door is traced, the router's
//! process included, nothing is traced that has no record, each span names
//! its record's hash, and the signed checkpoints are exported too. The hot
//! paths pay nothing for it.

pub mod spans;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;

use airlock_core::error::{Error, ErrorCode, Result};
use airlock_state::audit::follow::Follower;

/// How often the audit log is looked at for new records.
const TICK: Duration = Duration::from_millis(500);

/// Whether the environment asks for traces.
pub fn configured() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none");
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The OTLP client: hyper, its requests run on the daemon's runtime (the
/// SDK's batch processor exports from a thread of its own, outside it).
#[derive(Debug)]
struct OnRuntime {
    client: Arc<opentelemetry_http::hyper::HyperClient>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> std::result::Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| Box::new(e) as HttpError)?
    }
}

/// The running exporter; flushes what it holds when shut down.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Exports what is left, waiting a few seconds at most.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(error = %e, "the last spans may not have been exported");
        }
    }
}

/// Starts exporting spans of the records written from `follower` on, and of
/// the checkpoints signed from now on; `None` when traces are not configured.
pub fn spawn(audit: PathBuf, follower: Follower) -> Result<Option<Exporter>> {
    if !configured() {
        return Ok(None);
    }
    if let Ok(protocol) = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL") {
        if !matches!(protocol.trim(), "" | "http/protobuf") {
            return Err(Error::new(
                ErrorCode::InvalidRequest,
                format!("OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported"),
                "Airlock exports traces over OTLP/HTTP with protobuf: set it to http/protobuf or leave it unset",
            ));
        }
    }
    let timeout = Duration::from_secs(10);
    let client = OnRuntime {
        client: Arc::new(opentelemetry_http::hyper::HyperClient::with_default_connector(timeout, None)),
        runtime: tokio::runtime::Handle::current(),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(timeout)
        .with_http_client(client)
        .build()
        .map_err(|e| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("the OTLP trace exporter cannot be set up: {e}"),
                "check OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4318) and OTEL_EXPORTER_OTLP_HEADERS",
            )
        })?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "airlock".into());
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("airlock");
    // Checkpoints signed from now on; those before were exported before.
    let from = std::fs::metadata(audit.join(airlock_state::audit::checkpoint::CHECKPOINTS_FILE))
        .map_or(0, |m| m.len());
    tokio::spawn(async move {
        let (mut follower, mut checkpoints_at) = (follower, from);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (tracer, dir, mut moved, at) = (tracer.clone(), audit.clone(), follower, checkpoints_at);
            let pass = tokio::task::spawn_blocking(move || {
                for sealed in moved.next_batch(8 << 20) {
                    spans::emit(&tracer, &sealed);
                }
                let (signed, next) = airlock_state::audit::read::checkpoints_after(&dir, at);
                for c in &signed {
                    spans::emit_checkpoint(&tracer, c);
                }
                (moved, next)
            })
            .await;
            match pass {
                Ok((f, next)) => (follower, checkpoints_at) = (f, next),
                Err(e) => {
                    tracing::error!(error = %e, "tracing the audit log failed; following it from its end");
                    follower = Follower::at_end(&audit);
                }
            }
        }
    });
    tracing::info!("exporting traces over OTLP/HTTP");
    Ok(Some(Exporter { provider }))
}
