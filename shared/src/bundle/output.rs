//! Structured output: `x-agen/agent.md` front matter `outputSchema: schema.json` names a JSON
//! schema (a file of the bundle, relative to its root) that the run's final answer must match.
//!
//! Invariants: a schema that does not compile is refused when the bundle is read, naming the
//! file; [`OutputSchema::check`] accepts an answer only when it is JSON (a fenced ```json block
//! is unwrapped) that the schema validates, and its error names the schema and the first
//! violation with its place in the answer.

use serde_json::Value;

use super::error::{BundleError, Result};
use super::AGENT_FILE;

/// A compiled output schema.
#[derive(Debug, Clone)]
pub struct OutputSchema {
    /// Where it came from (`schema.json`, or `--output-schema` for a task's own).
    pub source: String,
    /// The schema as written.
    pub schema: Value,
    validator: std::sync::Arc<jsonschema::Validator>,
}

impl PartialEq for OutputSchema {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && self.schema == other.schema
    }
}

impl OutputSchema {
    /// Compiles `schema`; the error says why it is not a usable JSON schema.
    pub fn new(source: &str, schema: Value) -> std::result::Result<OutputSchema, String> {
        if !schema.is_object() {
            return Err("expected a JSON schema object, such as {\"type\": \"object\", \"properties\": {...}}".into());
        }
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| format!("not a valid JSON schema: {e}"))?;
        Ok(OutputSchema {
            source: source.to_string(),
            schema,
            validator: std::sync::Arc::new(validator),
        })
    }

    /// The answer as JSON when it matches the schema; else what is wrong, for the model and
    /// for the run's failure.
    pub fn check(&self, answer: &str) -> std::result::Result<Value, String> {
        let text = unfence(answer);
        let value: Value = serde_json::from_str(text).map_err(|e| {
            format!(
                "the answer is not JSON ({e}); outputSchema {} asks for a JSON value",
                self.source
            )
        })?;
        if let Some(e) = self.validator.iter_errors(&value).next() {
            let at = e.instance_path.to_string();
            let at = if at.is_empty() { "/".to_string() } else { at };
            return Err(format!(
                "the answer does not match outputSchema {}: at {at}: {e}",
                self.source
            ));
        }
        Ok(value)
    }
}

/// The JSON inside a ```json … ``` (or ``` … ```) fence, else the text trimmed.
fn unfence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// Reads the schema `agent.md` names (`outputSchema`), if any.
pub(crate) fn load(dir: &std::path::Path, named: Option<&Value>) -> Result<Option<OutputSchema>> {
    let rel = match named {
        None => return Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(_) => {
            return Err(BundleError::invalid(
                AGENT_FILE,
                "outputSchema",
                "expected the path of a JSON schema file in the bundle, such as `schema.json`",
            ))
        }
    };
    let bytes = super::read::read_bounded(dir, &rel)?.ok_or_else(|| {
        BundleError::invalid(
            AGENT_FILE,
            "outputSchema",
            format!("`{rel}` not found; expected a JSON schema file at that path, relative to the bundle folder"),
        )
    })?;
    let schema: Value = serde_json::from_slice(&bytes)
        .map_err(|e| BundleError::file(&rel, format!("is not valid JSON: {e}")))?;
    OutputSchema::new(&rel, schema)
        .map(Some)
        .map_err(|m| BundleError::invalid(AGENT_FILE, "outputSchema", format!("`{rel}`: {m}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_must_be_json_that_the_schema_validates() {
        let s = OutputSchema::new(
            "schema.json",
            json!({"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "number"}}, "required": ["city", "temp"]}),
        )
        .expect("compiles");
        assert_eq!(
            s.check("```json\n{\"city\": \"Oslo\", \"temp\": 3}\n```"),
            Ok(json!({"city": "Oslo", "temp": 3}))
        );
        let e = s.check(r#"{"city": "Oslo", "temp": "cold"}"#).unwrap_err();
        assert!(
            e.starts_with("the answer does not match outputSchema schema.json: at /temp:"),
            "{e}"
        );
        assert!(s
            .check("Oslo, 3 degrees")
            .unwrap_err()
            .contains("is not JSON"));
        assert!(OutputSchema::new("x", json!({"type": 7})).is_err());
    }
}
