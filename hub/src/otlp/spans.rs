//! A task's spans (the ones [`crate::trace`] builds, with GetTrace's ids) as OTLP spans named
//! and attributed per the OpenTelemetry GenAI semantic conventions: the run is
//! `invoke_agent {deployment}`, a model turn `chat {model}` (client span, with
//! `gen_ai.request.model`, `gen_ai.response.{model,id,finish_reasons}`, usage and
//! `server.address`/`server.port` of the model endpoint), a tool call `execute_tool {tool}`, an
//! approval's wait `approval {tool}`; a failed span has status error and `error.type`. Every
//! span also carries `agen.namespace`, `agen.deployment`, `agen.task_id` and `agen.attempt`.

use agen_shared::bundle::ModelRef;

use super::pb;
use crate::model::TaskRec;
use crate::trace::SpanRec;

/// The model a task's bundle names and the host and port of its endpoint.
#[derive(Debug, Clone, Default)]
pub struct ModelInfo {
    pub model: Option<ModelRef>,
    /// `server.address` and `server.port`: the `baseUrl`'s, else the provider's default.
    pub server: Option<(String, u16)>,
}

impl ModelInfo {
    /// What the bundle `digest` says about its model (`None` fields when it cannot be read).
    pub fn of_bundle(core: &crate::core::Core, digest: &str) -> ModelInfo {
        if digest.is_empty() {
            return ModelInfo::default();
        }
        let Some(bundle) = load_bundle(core, digest) else {
            return ModelInfo::default();
        };
        let model = bundle.agent.model;
        let url = bundle.agent.base_url.or_else(|| {
            model.as_ref().map(|m| {
                match m.provider {
                    agen_shared::bundle::Provider::OpenAi => "https://api.openai.com/v1",
                    agen_shared::bundle::Provider::Anthropic => "https://api.anthropic.com",
                }
                .to_string()
            })
        });
        ModelInfo {
            model,
            server: url.as_deref().and_then(server_of),
        }
    }
}

fn load_bundle(core: &crate::core::Core, digest: &str) -> Option<agen_shared::bundle::Bundle> {
    let bytes = core.bundle_bytes(digest).ok()??;
    let tmp = tempfile::tempdir().ok()?;
    let dir = tmp.path().join("bundle");
    agen_shared::bundle::unpack(&bytes, &dir).ok()?;
    agen_shared::bundle::Bundle::load(&dir).ok()
}

/// The host and port of an endpoint URL (the scheme's port when it names none).
fn server_of(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Some((host.to_string(), port))
}

/// The resource of a task's spans: the Hub process and the task's namespace.
#[derive(Debug, Clone)]
pub struct HubResource {
    /// `service.instance.id`: this Hub process.
    pub instance_id: String,
    /// `host.name`.
    pub host: String,
}

impl HubResource {
    pub fn current() -> HubResource {
        HubResource {
            instance_id: uuid::Uuid::new_v4().to_string(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
        }
    }

    fn attributes(&self, namespace: &str) -> Vec<pb::KeyValue> {
        let mut a = vec![
            pb::KeyValue::string("service.name", "agen-hub"),
            pb::KeyValue::string("service.version", env!("CARGO_PKG_VERSION")),
            pb::KeyValue::string("service.instance.id", self.instance_id.clone()),
            pb::KeyValue::string("service.namespace", namespace),
            pb::KeyValue::string("agen.namespace", namespace),
        ];
        if !self.host.is_empty() {
            a.push(pb::KeyValue::string("host.name", self.host.clone()));
        }
        a
    }
}

/// One request carrying `spans`, grouped by namespace (one `ResourceSpans` each).
pub fn request(
    resource: &HubResource,
    spans: Vec<(String, pb::Span)>,
) -> pb::ExportTraceServiceRequest {
    let mut by_namespace: std::collections::BTreeMap<String, Vec<pb::Span>> = Default::default();
    for (namespace, span) in spans {
        by_namespace.entry(namespace).or_default().push(span);
    }
    pb::ExportTraceServiceRequest {
        resource_spans: by_namespace
            .into_iter()
            .map(|(namespace, spans)| pb::ResourceSpans {
                resource: Some(pb::Resource {
                    attributes: resource.attributes(&namespace),
                }),
                scope_spans: vec![pb::ScopeSpans {
                    scope: Some(pb::InstrumentationScope {
                        name: "agen-hub".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans,
                }],
            })
            .collect(),
    }
}

/// The OTLP span of `s`, one of `task`'s spans (its trace id already decoded).
pub fn span(task: &TaskRec, trace_id: &[u8], s: &SpanRec, model: &ModelInfo) -> pb::Span {
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
    let mut error_type = None;
    let (name, kind) = if crate::trace::is_approval(s) {
        let tool = attr("tool");
        attributes.push(pb::KeyValue::string("gen_ai.tool.name", tool.clone()));
        attributes.push(pb::KeyValue::string("gen_ai.tool.call.id", attr("call_id")));
        for key in ["approved", "by", "reason"] {
            if let Some(v) = s.attributes.get(key) {
                attributes.push(pb::KeyValue::string(
                    &format!("agen.approval.{key}"),
                    v.clone(),
                ));
            }
        }
        (format!("approval {tool}"), pb::SPAN_KIND_INTERNAL)
    } else if s.attributes.contains_key("call_id") {
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
        // A result marked isError, or why the call failed (denied, timeout, unknown_tool, …).
        error_type = Some(
            s.attributes
                .get("reason")
                .cloned()
                .unwrap_or_else(|| "tool_error".into()),
        );
        (format!("execute_tool {tool}"), pb::SPAN_KIND_INTERNAL)
    } else if s.parent_span_id.is_empty() || s.attributes.contains_key("task_id") {
        let agent = crate::trace::root_deployment(s)
            .unwrap_or(&task.deployment)
            .to_string();
        attributes.push(pb::KeyValue::string(
            "gen_ai.operation.name",
            "invoke_agent",
        ));
        attributes.push(pb::KeyValue::string("gen_ai.agent.name", agent.clone()));
        attributes.push(pb::KeyValue::string("agen.run_id", attr("run_id")));
        if s.attributes.get("task_id") == Some(&task.task_id) && !task.conversation_id.is_empty() {
            attributes.push(pb::KeyValue::string(
                "gen_ai.conversation.id",
                task.conversation_id.clone(),
            ));
        }
        if let Some(m) = &model.model {
            attributes.push(pb::KeyValue::string(
                "gen_ai.provider.name",
                m.provider.as_str(),
            ));
            attributes.push(pb::KeyValue::string(
                "gen_ai.request.model",
                m.model.clone(),
            ));
        }
        error_type = Some(match s.status.as_str() {
            "failed" => task
                .outcome
                .as_ref()
                .map(|o| o.response_type.clone())
                .filter(|t| !t.is_empty() && t != "text")
                .unwrap_or_else(|| "failed".into()),
            other => other.to_string(),
        });
        (format!("invoke_agent {agent}"), pb::SPAN_KIND_INTERNAL)
    } else {
        attributes.push(pb::KeyValue::string("gen_ai.operation.name", "chat"));
        if let Some(m) = &model.model {
            attributes.push(pb::KeyValue::string(
                "gen_ai.provider.name",
                m.provider.as_str(),
            ));
            attributes.push(pb::KeyValue::string(
                "gen_ai.request.model",
                m.model.clone(),
            ));
        }
        if let Some((host, port)) = &model.server {
            attributes.push(pb::KeyValue::string("server.address", host.clone()));
            attributes.push(pb::KeyValue::int("server.port", i64::from(*port)));
        }
        for (ours, theirs) in [
            ("response_model", "gen_ai.response.model"),
            ("response_id", "gen_ai.response.id"),
        ] {
            if let Some(v) = s.attributes.get(ours) {
                attributes.push(pb::KeyValue::string(theirs, v.clone()));
            }
        }
        if let Some(f) = s.attributes.get("finish_reason") {
            attributes.push(pb::KeyValue::strings(
                "gen_ai.response.finish_reasons",
                std::slice::from_ref(f),
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
        error_type = Some("model_error".into());
        let name = match &model.model {
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
        "error" | "failed" | "unfinished" | "denied" => {
            let error_type = match s.status.as_str() {
                // The attempt that ran it ended first, or the approval said no.
                "unfinished" | "denied" => s.status.clone(),
                _ => error_type.unwrap_or_else(|| "_OTHER".into()),
            };
            attributes.push(pb::KeyValue::string("error.type", error_type));
            pb::Status {
                message: if s.parent_span_id.is_empty() {
                    task.outcome
                        .as_ref()
                        .map(|o| o.error.clone())
                        .unwrap_or_default()
                } else {
                    s.status.clone()
                },
                code: pb::STATUS_ERROR,
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_is_the_endpoints_host_and_port() {
        assert_eq!(
            server_of("http://127.0.0.1:8080/v1"),
            Some(("127.0.0.1".into(), 8080))
        );
        assert_eq!(
            server_of("https://api.openai.com/v1"),
            Some(("api.openai.com".into(), 443))
        );
        assert_eq!(server_of("http://[::1]/v1"), Some(("::1".into(), 80)));
        assert_eq!(server_of("not a url"), None);
    }
}
