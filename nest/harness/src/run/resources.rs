//! The resource built-ins: `list_resources` and `read_resource`, offered when a tool server
//! listed at least one MCP resource at its start. They are host tools of the harness itself
//! (see [`super::host`]), so permissions judge them by these names like any tool
//! (`permissions.deny: ["read_resource"]`, `ask`), approvals and the effect ledger apply, and
//! both are read-only.
//!
//! Invariant: a read names a server and a URI; it goes only to that server, and the answer is
//! text cut at [`crate::mcp::MAX_RESOURCE_CHARS`] characters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::host::{HostTool, HostToolSpec, Registered, ToolContext, ToolError};
use super::ToolBackend;

pub const BUILTIN_LIST_RESOURCES: &str = "list_resources";
pub const BUILTIN_READ_RESOURCE: &str = "read_resource";

/// How long one `resources/read` may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The resource built-ins for `tools`, by name; none when no server listed a resource.
pub(super) fn builtins(tools: &Arc<dyn ToolBackend>) -> BTreeMap<String, Registered> {
    if tools.resources().is_empty() {
        return BTreeMap::new();
    }
    let list: Arc<dyn HostTool> = Arc::new(ListResources(tools.clone()));
    let read: Arc<dyn HostTool> = Arc::new(ReadResource(tools.clone()));
    [list, read]
        .into_iter()
        .map(|tool| {
            let spec = tool.spec();
            (spec.name.clone(), Registered { spec, tool })
        })
        .collect()
}

struct ListResources(Arc<dyn ToolBackend>);

#[async_trait::async_trait]
impl HostTool for ListResources {
    fn spec(&self) -> HostToolSpec {
        HostToolSpec {
            name: BUILTIN_LIST_RESOURCES.into(),
            description: "List the resources (documents, files, records) your tool servers offer: one JSON object per line with server, uri, name, description and mimeType. Read one with read_resource.".into(),
            input_schema: json!({"type": "object", "properties": {
                "server": {"type": "string", "description": "only this server's resources (default: all)"}
            }}),
            read_only: true,
            idempotent: true,
        }
    }

    async fn call(&self, arguments: Value, _cx: ToolContext) -> Result<String, ToolError> {
        let only = arguments.get("server").and_then(Value::as_str);
        let lines: Vec<String> = self
            .0
            .resources()
            .into_iter()
            .filter(|r| only.is_none_or(|s| s == r.server))
            .map(|r| {
                json!({"server": r.server, "uri": r.uri, "name": r.name, "description": r.description, "mimeType": r.mime_type})
                    .to_string()
            })
            .collect();
        if lines.is_empty() {
            return Ok(match only {
                Some(s) => format!("tool server {s} lists no resources"),
                None => "no resources".into(),
            });
        }
        Ok(lines.join("\n"))
    }
}

struct ReadResource(Arc<dyn ToolBackend>);

#[async_trait::async_trait]
impl HostTool for ReadResource {
    fn spec(&self) -> HostToolSpec {
        HostToolSpec {
            name: BUILTIN_READ_RESOURCE.into(),
            description: "Read a resource of a tool server (see list_resources) as text.".into(),
            input_schema: json!({"type": "object", "properties": {
                "server": {"type": "string", "description": "the server that lists it"},
                "uri": {"type": "string", "description": "the resource's uri"}
            }, "required": ["server", "uri"]}),
            read_only: true,
            idempotent: true,
        }
    }

    async fn call(&self, arguments: Value, _cx: ToolContext) -> Result<String, ToolError> {
        let field = |k: &str| {
            arguments
                .get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| ToolError::new(format!("read_resource: `{k}` is missing; give the server and the uri list_resources shows")))
        };
        let (server, uri) = (field("server")?, field("uri")?);
        self.0
            .read_resource(server, uri, READ_TIMEOUT)
            .await
            .map_err(ToolError::new)
    }
}
