//! OpenTelemetry export: when a top-level task reaches a terminal state the Hub sends its trace
//! (the spans [`crate::trace`] builds, with the ids `GetTrace` shows) to an OTLP collector, over
//! gRPC (`TraceService/Export`) or HTTP (`POST …/v1/traces`), as one `ResourceSpans` of
//! `service.name=agen-hub` with the GenAI semantic-convention attributes; an `https://`
//! endpoint is verified with the system roots or the CA file [`roots`] loads. Export runs in the
//! background behind a bounded queue: it never blocks a task, and a failed or dropped export
//! is logged at warn.

mod pb;
mod roots;

use std::sync::Arc;
use std::time::Duration;

use agen_shared::bundle::ModelRef;
use prost::Message;
use tokio::sync::mpsc;

use crate::config::{OtlpOptions, OtlpProtocol};
use crate::core::Core;
use crate::error::{HubError, Result};
use crate::model::TaskRec;
use crate::trace::SpanRec;

pub use pb::ExportTraceServiceRequest;

/// Traces waiting to be exported; more are dropped (with a warning) instead of waiting.
const QUEUE: usize = 256;
/// The longest one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Starts exporting the trace of every top-level task that finishes from now on.
pub fn follow(opts: OtlpOptions, core: Arc<Core>) -> Result<()> {
    let exporter = Exporter::new(&opts)?;
    let (tx, mut rx) = mpsc::channel::<(String, String)>(QUEUE);
    let mut updates = core.subscribe();
    let watch = core.clone();
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                n = updates.recv() => n,
                _ = watch.stopping.cancelled() => return,
            };
            match next {
                Ok(u) => {
                    let t = &u.task;
                    if u.event.kind != "task.state"
                        || !t.state.is_terminal()
                        || !t.parent_task_id.is_empty()
                    {
                        continue;
                    }
                    if tx
                        .try_send((t.namespace.clone(), t.task_id.clone()))
                        .is_err()
                    {
                        tracing::warn!(task = %t.task_id, "the OTLP export queue is full ({QUEUE} traces); the trace of task {} is not exported", t.task_id);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "OTLP export fell behind the task updates; traces of tasks finishing among {n} updates may not be exported"
                    );
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    tokio::spawn(async move {
        while let Some((namespace, task_id)) = rx.recv().await {
            let request = match core.trace(&namespace, &task_id) {
                Ok((task, spans)) => {
                    let model = bundle_model(&core, &task.bundle_digest);
                    export_request(&task, &spans, model.as_ref())
                }
                Err(e) => {
                    tracing::warn!(task = %task_id, "cannot build the trace of task {task_id} for OTLP export: {e}");
                    continue;
                }
            };
            match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(request)).await {
                Ok(Ok(())) => tracing::debug!(task = %task_id, "trace exported over OTLP"),
                Ok(Err(e)) => {
                    let tls = if exporter.endpoint.starts_with("https://") {
                        " (and that OTEL_EXPORTER_OTLP_CERTIFICATE names its CA when the system roots do not trust it)"
                    } else {
                        ""
                    };
                    tracing::warn!(task = %task_id, endpoint = %exporter.endpoint, "OTLP export of task {task_id} to {} failed: {e}; check --otlp-endpoint and that the collector is up{tls}", exporter.endpoint)
                }
                Err(_) => {
                    tracing::warn!(task = %task_id, endpoint = %exporter.endpoint, "OTLP export of task {task_id} to {} timed out after {EXPORT_TIMEOUT:?}", exporter.endpoint)
                }
            }
        }
    });
    tracing::info!(endpoint = %opts.endpoint, protocol = ?opts.protocol, "exporting task traces over OTLP");
    Ok(())
}

fn bundle_model(core: &Core, digest: &str) -> Option<ModelRef> {
    if digest.is_empty() {
        return None;
    }
    crate::metrics::bundle_model(core, digest)
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

/// The OTLP request carrying `task`'s trace: every span of `spans` (the run span first, as
/// [`crate::trace::build_spans`] orders them) with its GetTrace ids.
pub fn export_request(
    task: &TaskRec,
    spans: &[SpanRec],
    model: Option<&ModelRef>,
) -> ExportTraceServiceRequest {
    let trace_id = hex::decode(crate::trace::trace_id(task)).unwrap_or_default();
    let resource = pb::Resource {
        attributes: vec![
            pb::KeyValue::string("service.name", "agen-hub"),
            pb::KeyValue::string("service.version", env!("CARGO_PKG_VERSION")),
        ],
    };
    ExportTraceServiceRequest {
        resource_spans: vec![pb::ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![pb::ScopeSpans {
                scope: Some(pb::InstrumentationScope {
                    name: "agen-hub".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans: spans
                    .iter()
                    .map(|s| span(task, &trace_id, s, model))
                    .collect(),
            }],
        }],
    }
}

fn span(task: &TaskRec, trace_id: &[u8], s: &SpanRec, model: Option<&ModelRef>) -> pb::Span {
    let attr = |k: &str| s.attributes.get(k).cloned().unwrap_or_default();
    let mut attributes = vec![
        pb::KeyValue::string("agen.namespace", task.namespace.clone()),
        pb::KeyValue::string("agen.deployment", task.deployment.clone()),
        pb::KeyValue::string(
            "agen.task_id",
            s.attributes
                .get("task_id")
                .cloned()
                .unwrap_or_else(|| task.task_id.clone()),
        ),
    ];
    if let Some(a) = s.attributes.get("attempt").and_then(|a| a.parse().ok()) {
        attributes.push(pb::KeyValue::int("agen.attempt", a));
    }
    let (name, kind) = if s.attributes.contains_key("call_id") {
        let tool = attr("tool");
        attributes.push(pb::KeyValue::string(
            "gen_ai.operation.name",
            "execute_tool",
        ));
        attributes.push(pb::KeyValue::string("gen_ai.tool.name", tool.clone()));
        attributes.push(pb::KeyValue::string("gen_ai.tool.call.id", attr("call_id")));
        if let Some(args) = s.attributes.get("arguments") {
            attributes.push(pb::KeyValue::string(
                "gen_ai.tool.call.arguments",
                args.clone(),
            ));
        }
        (format!("execute_tool {tool}"), pb::SPAN_KIND_INTERNAL)
    } else if s.parent_span_id.is_empty() || s.attributes.contains_key("task_id") {
        attributes.push(pb::KeyValue::string(
            "gen_ai.operation.name",
            "invoke_agent",
        ));
        attributes.push(pb::KeyValue::string(
            "gen_ai.agent.name",
            task.deployment.clone(),
        ));
        attributes.push(pb::KeyValue::string("agen.run_id", attr("run_id")));
        (s.name.clone(), pb::SPAN_KIND_INTERNAL)
    } else {
        attributes.push(pb::KeyValue::string("gen_ai.operation.name", "chat"));
        if let Some(m) = model {
            attributes.push(pb::KeyValue::string(
                "gen_ai.provider.name",
                m.provider.as_str(),
            ));
            attributes.push(pb::KeyValue::string(
                "gen_ai.request.model",
                m.model.clone(),
            ));
        }
        for (ours, theirs) in [
            ("input_tokens", "gen_ai.usage.input_tokens"),
            ("output_tokens", "gen_ai.usage.output_tokens"),
        ] {
            if let Some(n) = s.attributes.get(ours).and_then(|n| n.parse().ok()) {
                attributes.push(pb::KeyValue::int(theirs, n));
            }
        }
        let name = match model {
            Some(m) => format!("chat {}", m.model),
            None => "chat".to_string(),
        };
        (name, pb::SPAN_KIND_CLIENT)
    };
    attributes.push(pb::KeyValue::string("agen.status", s.status.clone()));
    let status = match s.status.as_str() {
        "ok" | "succeeded" => pb::Status {
            message: String::new(),
            code: pb::STATUS_OK,
        },
        "error" | "failed" | "unfinished" | "denied" => pb::Status {
            message: if s.parent_span_id.is_empty() {
                task.outcome
                    .as_ref()
                    .map(|o| o.error.clone())
                    .unwrap_or_default()
            } else {
                s.status.clone()
            },
            code: pb::STATUS_ERROR,
        },
        _ => pb::Status::default(),
    };
    let nanos = |ms: i64| (ms.max(0) as u64).saturating_mul(1_000_000);
    pb::Span {
        trace_id: trace_id.to_vec(),
        span_id: hex::decode(&s.span_id).unwrap_or_default(),
        parent_span_id: hex::decode(&s.parent_span_id).unwrap_or_default(),
        name,
        kind,
        start_time_unix_nano: nanos(s.start_ms),
        end_time_unix_nano: nanos(s.end_ms.max(s.start_ms)),
        attributes,
        status: Some(status),
    }
}
