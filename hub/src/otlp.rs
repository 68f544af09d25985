//! OpenTelemetry export: the Hub sends each task's spans (the ones [`crate::trace`] builds,
//! with the ids `GetTrace` shows) to an OTLP collector as they end ([`live`]: batched, behind a
//! bounded queue that drops and counts instead of waiting), over gRPC
//! (`TraceService/Export`) or HTTP (`POST …/v1/traces`), named and attributed per the GenAI
//! semantic conventions ([`spans`]); an `https://` endpoint is verified with the system roots
//! or the CA file [`roots`] loads. Export never blocks a task; a failed export is logged at
//! warn and its spans counted as dropped.

mod live;
mod pb;
mod roots;
mod spans;

use std::sync::Arc;
use std::time::Duration;

use prost::Message;

use crate::config::{OtlpOptions, OtlpProtocol};
use crate::core::Core;
use crate::error::{HubError, Result};

pub use live::{QUEUE, SPANS_DROPPED, SPANS_EXPORTED};
pub use pb::ExportTraceServiceRequest;

/// The longest one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Starts exporting every task's spans as they end, from now on.
pub fn follow(opts: OtlpOptions, core: Arc<Core>) -> Result<()> {
    let exporter = Exporter::new(&opts)?;
    live::start(core, exporter);
    tracing::info!(endpoint = %opts.endpoint, protocol = ?opts.protocol, "exporting task spans over OTLP as they end");
    Ok(())
}

/// One OTLP client (gRPC channel or HTTP client) with its headers.
struct Exporter {
    endpoint: String,
    headers: Vec<(String, String)>,
    transport: Transport,
}

enum Transport {
    Grpc(tonic::transport::Channel),
    Http(reqwest::Client),
}

impl Exporter {
    /// Logs a failed export of `n` spans of the tasks `what` names: what failed and what to check.
    fn warn_failed(&self, what: &str, n: u64, e: &str) {
        let tls = if self.endpoint.starts_with("https://") {
            " (and that OTEL_EXPORTER_OTLP_CERTIFICATE names its CA when the system roots do not trust it)"
        } else {
            ""
        };
        tracing::warn!(endpoint = %self.endpoint, spans = n, "OTLP export of {what} ({n} spans) to {} failed: {e}; check --otlp-endpoint and that the collector is up{tls}", self.endpoint);
    }

    fn new(opts: &OtlpOptions) -> Result<Exporter> {
        let roots = if opts.endpoint.starts_with("https://") {
            Some(roots::load(opts.certificate.as_deref())?)
        } else {
            if let Some(c) = &opts.certificate {
                tracing::warn!(certificate = %c.display(), "OTEL_EXPORTER_OTLP_CERTIFICATE is set but the OTLP endpoint {} is plain http://; the certificate is not used (use https:// to verify the collector)", opts.endpoint);
            }
            None
        };
        let transport = match opts.protocol {
            OtlpProtocol::Grpc => {
                let mut endpoint = tonic::transport::Endpoint::from_shared(opts.endpoint.clone())
                    .map_err(|e| {
                        HubError::Config(format!(
                            "OTLP endpoint {:?}: {e}; expected a URL such as http://127.0.0.1:4317",
                            opts.endpoint
                        ))
                    })?
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(EXPORT_TIMEOUT);
                if let Some(roots) = &roots {
                    let tls = tonic::transport::ClientTlsConfig::new().ca_certificates(
                        roots.iter().map(|der| {
                            tonic::transport::Certificate::from_pem(agen_shared::tls::der_to_pem(
                                der,
                            ))
                        }),
                    );
                    endpoint = endpoint.tls_config(tls).map_err(|e| {
                        HubError::Config(format!(
                            "OTLP endpoint {:?}: TLS settings: {e}",
                            opts.endpoint
                        ))
                    })?;
                }
                Transport::Grpc(endpoint.connect_lazy())
            }
            OtlpProtocol::HttpProtobuf => {
                let mut builder = reqwest::Client::builder().timeout(EXPORT_TIMEOUT);
                if let Some(roots) = &roots {
                    // The same roots as gRPC, not reqwest's bundled ones.
                    builder = builder.tls_built_in_root_certs(false);
                    for der in roots {
                        match reqwest::Certificate::from_der(der) {
                            Ok(c) => builder = builder.add_root_certificate(c),
                            Err(e) => tracing::debug!("an OTLP root certificate is skipped: {e}"),
                        }
                    }
                }
                Transport::Http(
                    builder
                        .build()
                        .map_err(|e| HubError::Config(format!("OTLP HTTP client: {e}")))?,
                )
            }
        };
        Ok(Exporter {
            endpoint: opts.endpoint.clone(),
            headers: opts.headers.clone(),
            transport,
        })
    }

    async fn export(&self, request: ExportTraceServiceRequest) -> std::result::Result<(), String> {
        match &self.transport {
            Transport::Grpc(channel) => {
                let mut client = tonic::client::Grpc::new(channel.clone());
                client
                    .ready()
                    .await
                    .map_err(|e| format!("cannot connect: {e}"))?;
                let mut req = tonic::Request::new(request);
                for (k, v) in &self.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(k.as_bytes())
                        .map_err(|e| format!("header {k:?}: {e}"))?;
                    let value = v.parse().map_err(|e| format!("header {k:?} value: {e}"))?;
                    req.metadata_mut().insert(key, value);
                }
                let codec = tonic_prost::ProstCodec::<
                    ExportTraceServiceRequest,
                    pb::ExportTraceServiceResponse,
                >::default();
                let resp = client
                    .unary(
                        req,
                        http::uri::PathAndQuery::from_static(EXPORT_PATH),
                        codec,
                    )
                    .await
                    .map_err(|s| format!("{}: {}", s.code(), s.message()))?;
                partial(resp.into_inner())
            }
            Transport::Http(client) => {
                let mut req = client
                    .post(&self.endpoint)
                    .header("content-type", "application/x-protobuf")
                    .body(request.encode_to_vec());
                for (k, v) in &self.headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let resp = req.send().await.map_err(|e| e.to_string())?;
                let status = resp.status();
                let body = resp.bytes().await.map_err(|e| e.to_string())?;
                if !status.is_success() {
                    return Err(format!("HTTP {status}"));
                }
                match pb::ExportTraceServiceResponse::decode(body) {
                    Ok(r) => partial(r),
                    Err(_) => Ok(()),
                }
            }
        }
    }
}

fn partial(r: pb::ExportTraceServiceResponse) -> std::result::Result<(), String> {
    match r.partial_success {
        Some(p) if p.rejected_spans > 0 => Err(format!(
            "the collector rejected {} spans: {}",
            p.rejected_spans, p.error_message
        )),
        _ => Ok(()),
    }
}
