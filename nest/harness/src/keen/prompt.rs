//! The canonical Keen tools section appended to the agent's system prompt.
//!
//! Invariants: the wording follows the spec's template ("The system prompt template"), typos
//! included ("descriped"): the `<SYSTEM>` intro, "Your tools are:", both wire-format variants
//! (always both, so the model can pick), the Important block and the attempts sentence, the
//! ERRORS block, then "**Here are the available tools:**" with one `### N. Name` section per
//! tool saying "This tool is a pipe." or "This tool is a script.", its purpose and its context
//! shape, and "- attempts: N" when the tool has attempts. Settled here: the section is closed
//! with `</SYSTEM>`; descriptions are folded onto one line; with no tools the section is empty.

use serde_json::Value;

use super::KeenToolKind;

/// One tool as the prompt describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeenToolSpec {
    /// The exact name the model writes in `!*tool`.
    pub name: String,
    pub kind: KeenToolKind,
    /// One-line purpose (may be empty).
    pub description: String,
    /// The context shape, e.g. "Pass `sensorID=<number>` in `!*context`." (may be empty).
    pub context_hint: String,
    /// Shown as "- attempts: N" when set.
    pub attempts: Option<u32>,
}

const INTRO: &str = "<SYSTEM>
**You will be given a set of tools to use for operation.**

When you need to use the tool, please output it between `<SYSTEM CALL>` and `</SYSTEM CALL>` markers.
";

const IMPORTANT: &str = "**Important:**

- Place `<SYSTEM CALL>` and `</SYSTEM CALL>` at the **start of the line**.
- Each `!*` marker must be at the **start of the line**.
- The content for each parameter can include any text, including special characters.
- **Do not indent** the markers.
- Do not include any extra text inside the `<SYSTEM CALL>` block.
- Outside the `<SYSTEM CALL>` block, you can provide explanations or continue the conversation as needed.

- If the tool returns attempts it means that we can recall it again. If the tool returns attempts 0 it means no need to recall it. Usually attempt can be greater than 0 in case of error.

---

";

const ERRORS: &str = "**ERRORS:**

- `<SYSTEM TECHNICAL ERROR>` and `</SYSTEM TECHNICAL ERROR>` means the system throws an error and the tool is unreachable. In most cases we don't need to retry the call.
In this case is better to return appropriate message that the system can't execute the tool.

- `<SYSTEM SCRIPT ERROR>` and `</SYSTEM SCRIPT ERROR>` means we tried to execute a script tool but it throws an error. In this case we receive an error message. We have to check it.
Sometimes the error could be due to inappropriate tool input parameters. In this case retry the call else just inform with appropriate message.

- `<SYSTEM FLOW ERROR>` and `</SYSTEM FLOW ERROR>` means we tried to execute a flow/pipe tool but it throws an error. In this case we receive an error message. We have to check it.
Sometimes the error could be due to inappropriate tool input parameters but some script is executed inside and throws error. Check the error. In this case retry the call else just inform with appropriate message.

";

/// The tools section for these tools (empty when there are none).
pub fn tools_section(tools: &[KeenToolSpec]) -> String {
    if tools.is_empty() {
        return String::new();
    }
    let example = |pipe: bool| {
        tools
            .iter()
            .find(|t| (t.kind == KeenToolKind::Flow) == pipe)
            .unwrap_or(&tools[0])
            .name
            .as_str()
    };
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    let mut out = String::new();
    out.push_str(INTRO);
    out.push_str(&format!("\nYour tools are: {}\n\n", names.join(", ")));
    out.push_str(&format!(
        "Use the following format for tools that are descriped as a pipe:\n<SYSTEM CALL>\n!*action\nuse tool flow\n!*tool\n{}\n!*context\n</SYSTEM CALL>\n\n\n",
        example(true)
    ));
    out.push_str(&format!(
        "Use the following format for tools that are descriped as a script:\n<SYSTEM CALL>\n!*action\nuse tool\n!*tool\n{}\n!*context\n</SYSTEM CALL>\n\n",
        example(false)
    ));
    out.push_str(IMPORTANT);
    out.push_str(ERRORS);
    out.push_str("**Here are the available tools:**\n");
    for (i, tool) in tools.iter().enumerate() {
        let kind = match tool.kind {
            KeenToolKind::Flow => "This tool is a pipe.",
            KeenToolKind::Script | KeenToolKind::Native => "This tool is a script.",
        };
        let description = [
            kind,
            &one_line(&tool.description),
            &one_line(&tool.context_hint),
        ]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
        out.push_str(&format!(
            "\n### {}. {}\n- **Description**: {description}\n",
            i + 1,
            tool.name
        ));
        if let Some(n) = tool.attempts {
            out.push_str(&format!("- attempts: {n}\n"));
        }
    }
    out.push_str("</SYSTEM>\n");
    out
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The context hint of an MCP tool or built-in from its JSON Schema `inputSchema`:
/// "Pass a JSON object of arguments in !*context: {"path": string (required), …}".
pub fn native_context_hint(input_schema: &Value) -> String {
    let props = input_schema.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let fields: Vec<String> = props
        .into_iter()
        .flatten()
        .map(|(name, schema)| {
            let ty = match schema.get("type") {
                Some(Value::String(t)) => t.clone(),
                Some(Value::Array(ts)) => ts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("|"),
                _ => "any".to_string(),
            };
            let req = if required.contains(&name.as_str()) {
                " (required)"
            } else {
                ""
            };
            format!("\"{name}\": {ty}{req}")
        })
        .collect();
    if fields.is_empty() {
        "Pass a JSON object of arguments in !*context: {} (no arguments).".to_string()
    } else {
        format!(
            "Pass a JSON object of arguments in !*context: {{{}}}.",
            fields.join(", ")
        )
    }
}

#[cfg(test)]
mod tests;
