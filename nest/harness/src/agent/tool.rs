//! [`Tool`]: a host tool from an async closure, with its argument schema derived from a Rust
//! type by `schemars` (or given by hand), and its `read_only` / `idempotent` hints.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::run::{HostTool, HostToolSpec, ToolContext, ToolError};

type Handler = dyn Fn(Value, ToolContext) -> Pin<Box<dyn Future<Output = Result<String, ToolError>> + Send>>
    + Send
    + Sync;

/// A host tool made of a name, a description, a schema, hints and an async closure.
#[derive(Clone)]
pub struct Tool {
    spec: HostToolSpec,
    handler: Arc<Handler>,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("spec", &self.spec).finish()
    }
}

impl Tool {
    /// Starts a tool (a [`ToolBuilder`], finished by its handler): side-effecting and not idempotent until told otherwise (the safe side
    /// for the ledger).
    #[allow(clippy::new_ret_no_self)] // `Tool::new(..).handler(f)` reads as what it makes
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> ToolBuilder {
        ToolBuilder {
            spec: HostToolSpec {
                name: name.into(),
                description: description.into(),
                input_schema: Value::Null,
                read_only: false,
                idempotent: false,
            },
        }
    }
}

/// A [`Tool`] being described; finish it with [`ToolBuilder::handler`] (typed arguments) or
/// [`ToolBuilder::json_handler`] (raw JSON arguments and a hand-written schema).
#[derive(Debug, Clone)]
pub struct ToolBuilder {
    spec: HostToolSpec,
}

impl ToolBuilder {
    /// The tool only reads: the ledger never counts it as a side effect and a resume simply
    /// calls it again; a turn may run it beside other calls.
    pub fn read_only(mut self) -> ToolBuilder {
        self.spec.read_only = true;
        self
    }

    /// Calling it twice does no more than once: a call a crash interrupted is sent again.
    pub fn idempotent(mut self) -> ToolBuilder {
        self.spec.idempotent = true;
        self
    }

    /// The JSON Schema of the arguments, by hand (overrides the derived one).
    pub fn schema(mut self, schema: Value) -> ToolBuilder {
        self.spec.input_schema = schema;
        self
    }

    /// Finishes the tool with a closure over typed arguments: `A`'s JSON Schema (from
    /// `#[derive(JsonSchema)]`) is what the model is shown, unless [`ToolBuilder::schema`] gave
    /// one; arguments that do not fit `A` are an error result and the closure is not called.
    /// `Ok(text)` is the result the model sees; `Err(e)` an error result saying `e`.
    pub fn handler<A, F, Fut, E>(mut self, f: F) -> Tool
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, E>> + Send + 'static,
        E: std::fmt::Display + 'static,
    {
        if self.spec.input_schema.is_null() {
            self.spec.input_schema = schema_of::<A>();
        }
        let name = self.spec.name.clone();
        let f = Arc::new(f);
        let handler = move |args: Value, cx: ToolContext| {
            let f = f.clone();
            let name = name.clone();
            let fut: Pin<Box<dyn Future<Output = Result<String, ToolError>> + Send>> = Box::pin(
                async move {
                    let typed: A = serde_json::from_value(args).map_err(|e| {
                        ToolError::new(format!(
                            "the arguments of {name} do not fit its schema: {e}; call it again with arguments that do"
                        ))
                    })?;
                    f(typed, cx)
                        .await
                        .map_err(|e| ToolError::new(e.to_string()))
                },
            );
            fut
        };
        Tool {
            spec: self.spec,
            handler: Arc::new(handler),
        }
    }

    /// Finishes the tool with a closure over the raw JSON arguments (give the schema with
    /// [`ToolBuilder::schema`]; without one the model is shown an object with no properties).
    pub fn json_handler<F, Fut, E>(self, f: F) -> Tool
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, E>> + Send + 'static,
        E: std::fmt::Display + 'static,
    {
        let f = Arc::new(f);
        let handler = move |args: Value, cx: ToolContext| {
            let f = f.clone();
            let fut: Pin<Box<dyn Future<Output = Result<String, ToolError>> + Send>> = Box::pin(
                async move { f(args, cx).await.map_err(|e| ToolError::new(e.to_string())) },
            );
            fut
        };
        Tool {
            spec: self.spec,
            handler: Arc::new(handler),
        }
    }
}

/// The JSON Schema of `A` as a tool's parameters (without the `$schema` key).
pub fn schema_of<A: JsonSchema>() -> Value {
    let schema = schemars::schema_for!(A);
    match serde_json::to_value(schema) {
        Ok(Value::Object(mut o)) => {
            o.remove("$schema");
            Value::Object(o)
        }
        _ => Value::Null,
    }
}

#[async_trait::async_trait]
impl HostTool for Tool {
    fn spec(&self) -> HostToolSpec {
        self.spec.clone()
    }

    async fn call(&self, arguments: Value, cx: ToolContext) -> Result<String, ToolError> {
        (self.handler)(arguments, cx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Args {
        /// The city.
        city: String,
        days: Option<u32>,
    }

    #[test]
    fn a_derived_schema_is_an_object_schema_with_the_fields() {
        let tool = Tool::new("forecast", "the weather")
            .read_only()
            .handler(|_a: Args, _cx| async { Ok::<_, ToolError>(String::new()) });
        let spec = tool.spec();
        assert_eq!(spec.input_schema["type"], "object");
        assert_eq!(spec.input_schema["properties"]["city"]["type"], "string");
        assert_eq!(spec.input_schema["required"], serde_json::json!(["city"]));
        assert!(spec.input_schema.get("$schema").is_none());
        assert!(spec.read_only && !spec.idempotent);
    }
}
