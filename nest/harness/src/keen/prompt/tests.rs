//! Prompt golden test: the whole tools section for the spec's two timestamp tools and one MCP
//! tool, and the schema summary of native tools.

use super::*;
use pretty_assertions::assert_eq;
use serde_json::json;

const GOLDEN: &str = r#"<SYSTEM>
**You will be given a set of tools to use for operation.**

When you need to use the tool, please output it between `<SYSTEM CALL>` and `</SYSTEM CALL>` markers.

Your tools are: ToolTimestamp, ToolTimestampScript, time_get_current_time

Use the following format for tools that are descriped as a pipe:
<SYSTEM CALL>
!*action
use tool flow
!*tool
ToolTimestamp
!*context
</SYSTEM CALL>


Use the following format for tools that are descriped as a script:
<SYSTEM CALL>
!*action
use tool
!*tool
ToolTimestampScript
!*context
</SYSTEM CALL>

**Important:**

- Place `<SYSTEM CALL>` and `</SYSTEM CALL>` at the **start of the line**.
- Each `!*` marker must be at the **start of the line**.
- The content for each parameter can include any text, including special characters.
- **Do not indent** the markers.
- Do not include any extra text inside the `<SYSTEM CALL>` block.
- Outside the `<SYSTEM CALL>` block, you can provide explanations or continue the conversation as needed.

- If the tool returns attempts it means that we can recall it again. If the tool returns attempts 0 it means no need to recall it. Usually attempt can be greater than 0 in case of error.

---

**ERRORS:**

- `<SYSTEM TECHNICAL ERROR>` and `</SYSTEM TECHNICAL ERROR>` means the system throws an error and the tool is unreachable. In most cases we don't need to retry the call.
In this case is better to return appropriate message that the system can't execute the tool.

- `<SYSTEM SCRIPT ERROR>` and `</SYSTEM SCRIPT ERROR>` means we tried to execute a script tool but it throws an error. In this case we receive an error message. We have to check it.
Sometimes the error could be due to inappropriate tool input parameters. In this case retry the call else just inform with appropriate message.

- `<SYSTEM FLOW ERROR>` and `</SYSTEM FLOW ERROR>` means we tried to execute a flow/pipe tool but it throws an error. In this case we receive an error message. We have to check it.
Sometimes the error could be due to inappropriate tool input parameters but some script is executed inside and throws error. Check the error. In this case retry the call else just inform with appropriate message.

**Here are the available tools:**

### 1. ToolTimestamp
- **Description**: This tool is a pipe. Returns the current timestamp as text in `dictionary.result`.
- attempts: 5

### 2. ToolTimestampScript
- **Description**: This tool is a script. Returns the current timestamp as text in `dictionary.result`. accepts context
- attempts: 0

### 3. time_get_current_time
- **Description**: This tool is a script. Get current time in a specific timezone. Pass a JSON object of arguments in !*context: {"timezone": string (required)}.
</SYSTEM>
"#;

#[test]
fn the_tools_section_matches_the_golden_text() {
    let tools = vec![
        KeenToolSpec {
            name: "ToolTimestamp".into(),
            kind: KeenToolKind::Flow,
            description: "Returns the current timestamp as text in `dictionary.result`.".into(),
            context_hint: String::new(),
            attempts: Some(5),
        },
        KeenToolSpec {
            name: "ToolTimestampScript".into(),
            kind: KeenToolKind::Script,
            description: "Returns the current timestamp\n   as text in `dictionary.result`.".into(),
            context_hint: "accepts context".into(),
            attempts: Some(0),
        },
        KeenToolSpec {
            name: "time_get_current_time".into(),
            kind: KeenToolKind::Native,
            description: "Get current time in a specific timezone.".into(),
            context_hint: native_context_hint(&json!({
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"]
            })),
            attempts: None,
        },
    ];
    assert_eq!(tools_section(&tools), GOLDEN);
}

#[test]
fn examples_fall_back_to_the_first_tool_and_no_tools_means_no_section() {
    assert_eq!(tools_section(&[]), "");
    let only_script = [KeenToolSpec {
        name: "Sensor".into(),
        kind: KeenToolKind::Script,
        description: String::new(),
        context_hint: String::new(),
        attempts: None,
    }];
    let text = tools_section(&only_script);
    assert!(
        text.contains("as a pipe:\n<SYSTEM CALL>\n!*action\nuse tool flow\n!*tool\nSensor\n"),
        "{text}"
    );
    assert!(
        text.ends_with("### 1. Sensor\n- **Description**: This tool is a script.\n</SYSTEM>\n"),
        "{text}"
    );
}

#[test]
fn native_context_hints_summarise_the_schema() {
    #[track_caller]
    fn check(schema: serde_json::Value, expected: &str) {
        assert_eq!(native_context_hint(&schema), expected);
    }
    check(
        json!({"type": "object"}),
        "Pass a JSON object of arguments in !*context: {} (no arguments).",
    );
    check(
        json!({"type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}, "x": {}, "y": {"type": ["string", "null"]}}, "required": ["path"]}),
        r#"Pass a JSON object of arguments in !*context: {"path": string (required), "offset": integer, "x": any, "y": string|null}."#,
    );
}
