//! Parser tables: every example block of the spec, every common mistake, context edge cases,
//! CRLF and unicode, plus proptests that the parser never panics.

use super::*;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

fn call(action: KeenAction, tool: &str, context: &str, narration: &str) -> ParsedReply {
    ParsedReply::Call(KeenCall {
        action,
        tool: tool.to_string(),
        context: context.to_string(),
        narration: narration.to_string(),
    })
}

fn bad(mistake: Mistake, line: usize) -> ParsedReply {
    ParsedReply::Malformed { mistake, line }
}

#[track_caller]
fn check(input: &str, expected: ParsedReply) {
    assert_eq!(parse_reply(input), expected, "input:\n{input}");
}

use KeenAction::{Flow, Script};
use Marker::{Action, Context, Tool};

#[test]
fn spec_example_blocks_parse() {
    // "For script tools — use tool"
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nToolTimestampScript\n!*context\n</SYSTEM CALL>",
        call(Script, "ToolTimestampScript", "", ""),
    );
    // "For flow tools — use tool flow"
    check(
        "<SYSTEM CALL>\n!*action\nuse tool flow\n!*tool\nToolTimestamp\n!*context\n</SYSTEM CALL>\n",
        call(Flow, "ToolTimestamp", "", ""),
    );
    // The end-to-end example: narration before the block.
    check(
        "I'll fetch the current timestamp for you.\n\n<SYSTEM CALL>\n!*action\nuse tool flow\n!*tool\nToolTimestamp\n!*context\n</SYSTEM CALL>",
        call(Flow, "ToolTimestamp", "", "I'll fetch the current timestamp for you."),
    );
    // Tool names with spaces, as in the spec's registration example.
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nTest Tool\n!*context\n</SYSTEM CALL>",
        call(Script, "Test Tool", "", ""),
    );
}

#[test]
fn contexts_empty_single_multi_line_and_marker_like() {
    let block = |ctx: &str| {
        format!(
            "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nSensor\n!*context\n{ctx}\n</SYSTEM CALL>"
        )
    };
    check(&block(""), call(Script, "Sensor", "", ""));
    check(&block("   \n\n"), call(Script, "Sensor", "", ""));
    check(
        &block("sensorID=300"),
        call(Script, "Sensor", "sensorID=300", ""),
    );
    check(
        &block("to=a@b.c; subject=Hi; body=line one"),
        call(Script, "Sensor", "to=a@b.c; subject=Hi; body=line one", ""),
    );
    check(
        &block("{\n  \"path\": \"a.txt\",\n  \"n\": 2\n}"),
        call(
            Script,
            "Sensor",
            "{\n  \"path\": \"a.txt\",\n  \"n\": 2\n}",
            "",
        ),
    );
    // Special characters, marker text mid-line, indented markers and tags: plain context.
    check(
        &block("quote the rule: !*action comes first\n  !*tool indented\n\t<SYSTEM CALL>\n  </SYSTEM CALL>\n`<>&\"'$\\{}`"),
        call(
            Script,
            "Sensor",
            "quote the rule: !*action comes first\n  !*tool indented\n\t<SYSTEM CALL>\n  </SYSTEM CALL>\n`<>&\"'$\\{}`",
            "",
        ),
    );
    // `!*` text that is not one of the markers is context.
    check(
        &block("!*important\n!*tools"),
        call(Script, "Sensor", "!*important\n!*tools", ""),
    );
}

#[test]
fn marker_order_blank_lines_and_trailing_spaces_are_tolerated() {
    check(
        "<SYSTEM CALL>  \n!*action \n\nuse tool flow \n\n!*context\nx=1\n!*tool\n ToolTimestamp\n</SYSTEM CALL>\t",
        call(Flow, "ToolTimestamp", "x=1", ""),
    );
}

#[test]
fn crlf_and_unicode() {
    check(
        "Voilà — je regarde 🕒\r\n<SYSTEM CALL>\r\n!*action\r\nuse tool\r\n!*tool\r\nHorloge Ünïcode\r\n!*context\r\nville=Zürich; note=日本語\r\n</SYSTEM CALL>\r\nMerci !\r\n",
        call(Script, "Horloge Ünïcode", "ville=Zürich; note=日本語", "Voilà — je regarde 🕒\n\nMerci !"),
    );
}

#[test]
fn a_leading_byte_order_mark_is_ignored() {
    check(
        "\u{feff}<SYSTEM CALL>\r\n!*action\r\nuse tool\r\n!*tool\r\nT\r\n!*context\r\n</SYSTEM CALL>",
        call(Script, "T", "", ""),
    );
}

#[test]
fn only_the_first_block_is_acted_on() {
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nA\n!*context\n</SYSTEM CALL>\nthen\n<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nB\n!*context\n</SYSTEM CALL>",
        call(
            Script,
            "A",
            "",
            "then\n<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nB\n!*context\n</SYSTEM CALL>",
        ),
    );
}

#[test]
fn plain_answers_are_not_calls() {
    check("", ParsedReply::NoCall);
    check("The time is 10:42.", ParsedReply::NoCall);
    // A tag mentioned mid-sentence is narration.
    check(
        "I would put it between `<SYSTEM CALL>` and `</SYSTEM CALL>` markers, but no tool is needed.",
        ParsedReply::NoCall,
    );
    check("Use !*action to pick the action.", ParsedReply::NoCall);
    check("```rust\nfn main() {}\n```", ParsedReply::NoCall);
}

#[test]
fn common_mistakes_are_malformed() {
    // Wrapping the block in triple backticks.
    check(
        "Here:\n```\n<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nToolTimestamp\n!*context\n</SYSTEM CALL>\n```",
        bad(Mistake::Fenced, 3),
    );
    check(
        "~~~xml\n<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nT\n!*context\n</SYSTEM CALL>\n~~~",
        bad(Mistake::Fenced, 2),
    );
    // Commentary like "I will use ToolTimestamp:" before !*tool.
    check(
        "<SYSTEM CALL>\n!*action\nuse tool flow\nI will use ToolTimestamp:\n!*tool\nToolTimestamp\n!*context\n</SYSTEM CALL>",
        bad(Mistake::ExtraText(Action), 4),
    );
    check(
        "<SYSTEM CALL>\nI will use ToolTimestamp:\n!*action\nuse tool flow\n!*tool\nToolTimestamp\n!*context\n</SYSTEM CALL>",
        bad(Mistake::TextBeforeFirstMarker, 2),
    );
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nToolTimestamp\nbecause the user asked\n!*context\n</SYSTEM CALL>",
        bad(Mistake::ExtraText(Tool), 6),
    );
    // Indenting markers as if they were a bulleted list item.
    check(
        "<SYSTEM CALL>\n- !*action\n  use tool\n- !*tool\n  T\n- !*context\n</SYSTEM CALL>",
        bad(Mistake::TextBeforeFirstMarker, 2),
    );
    check(
        "<SYSTEM CALL>\n  !*action\n  use tool\n  !*tool\n  T\n  !*context\n</SYSTEM CALL>",
        bad(Mistake::IndentedMarker(Action), 2),
    );
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n  !*tool\n  T\n  !*context\n</SYSTEM CALL>",
        bad(Mistake::IndentedMarker(Tool), 4),
    );
    check(
        "  <SYSTEM CALL>\n  !*action\n  use tool\n  !*tool\n  T\n  !*context\n  </SYSTEM CALL>",
        bad(Mistake::IndentedTag, 1),
    );
    check(
        "- <SYSTEM CALL>\n!*action\nuse tool\n!*tool\nT\n!*context\n</SYSTEM CALL>",
        bad(Mistake::TextOnTagLine, 1),
    );
    // Two tool calls in a single block.
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nA\n!*context\nx\n!*action\nuse tool\n!*tool\nB\n!*context\n</SYSTEM CALL>",
        bad(Mistake::RepeatedMarker(Action), 8),
    );
    // A second block opened before the first was closed.
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nA\n!*context\n<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nB\n!*context\n</SYSTEM CALL>",
        bad(Mistake::NestedOpen, 7),
    );
}

#[test]
fn structural_errors_are_malformed() {
    // Unterminated block.
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nT\n!*context\nx",
        bad(Mistake::Unterminated, 1),
    );
    // Indented closing tag, no other.
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nT\n!*context\n  </SYSTEM CALL>",
        bad(Mistake::IndentedTag, 7),
    );
    // Text on the tag lines.
    check(
        "<SYSTEM CALL> !*action use tool\n</SYSTEM CALL>",
        bad(Mistake::TextOnTagLine, 1),
    );
    check(
        "Calling now: <SYSTEM CALL>\n!*action\nuse tool\n!*tool\nT\n!*context\n</SYSTEM CALL>",
        bad(Mistake::TextOnTagLine, 1),
    );
    // Closing tag first; markers without tags.
    check("</SYSTEM CALL>", bad(Mistake::CloseWithoutOpen, 1));
    check(
        "ok\n!*action\nuse tool\n!*tool\nT\n!*context\n",
        bad(Mistake::MarkerOutsideBlock(Action), 2),
    );
    // Missing markers and values.
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nT\n</SYSTEM CALL>",
        bad(Mistake::MissingMarker(Context), 6),
    );
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*context\n</SYSTEM CALL>",
        bad(Mistake::MissingMarker(Tool), 5),
    );
    check(
        "<SYSTEM CALL>\n!*tool\nT\n!*context\n</SYSTEM CALL>",
        bad(Mistake::ActionNotFirst, 2),
    );
    check(
        "<SYSTEM CALL>\n</SYSTEM CALL>",
        bad(Mistake::MissingMarker(Action), 2),
    );
    check(
        "<SYSTEM CALL>\n!*action\n!*tool\nT\n!*context\n</SYSTEM CALL>",
        bad(Mistake::EmptyValue(Action), 2),
    );
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\n\n!*context\n</SYSTEM CALL>",
        bad(Mistake::EmptyValue(Tool), 4),
    );
    // Value on the marker line.
    check(
        "<SYSTEM CALL>\n!*action use tool\n!*tool\nT\n!*context\n</SYSTEM CALL>",
        bad(Mistake::TextOnMarkerLine(Action), 2),
    );
    check(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool: T\n!*context\n</SYSTEM CALL>",
        bad(Mistake::TextOnMarkerLine(Tool), 4),
    );
    // Unknown action phrases (case and wording are exact).
    check(
        "<SYSTEM CALL>\n!*action\nUse Tool\n!*tool\nT\n!*context\n</SYSTEM CALL>",
        bad(Mistake::UnknownAction("Use Tool".into()), 3),
    );
    check(
        "<SYSTEM CALL>\n!*action\nuse pipe\n!*tool\nT\n!*context\n</SYSTEM CALL>",
        bad(Mistake::UnknownAction("use pipe".into()), 3),
    );
}

#[test]
fn malformed_reasons_read_as_log_lines() {
    assert_eq!(
        Mistake::RepeatedMarker(Action).to_string(),
        "!*action appears twice; one block = one tool call"
    );
    assert_eq!(
        Mistake::Fenced.to_string(),
        "the <SYSTEM CALL> block is inside a code fence; write it without ``` around it"
    );
}

#[test]
fn wrong_action_for_the_tools_type_is_found_at_dispatch() {
    use crate::keen::KeenToolKind;
    let flow_call = KeenCall {
        action: Flow,
        tool: "T".into(),
        context: String::new(),
        narration: String::new(),
    };
    let script_call = KeenCall {
        action: Script,
        ..flow_call.clone()
    };
    assert_eq!(check_action(&flow_call, KeenToolKind::Flow), Ok(()));
    assert_eq!(check_action(&script_call, KeenToolKind::Script), Ok(()));
    assert_eq!(check_action(&script_call, KeenToolKind::Native), Ok(()));
    assert_eq!(
        check_action(&script_call, KeenToolKind::Flow).map_err(|e| e.to_string()),
        Err(
            "tool \"T\" is a flow tool and is called with \"use tool flow\", not \"use tool\""
                .to_string()
        )
    );
    assert!(check_action(&flow_call, KeenToolKind::Script).is_err());
    assert!(check_action(&flow_call, KeenToolKind::Native).is_err());
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<SYSTEM CALL>".to_string()),
        Just("</SYSTEM CALL>".to_string()),
        Just("!*action".to_string()),
        Just("!*tool".to_string()),
        Just("!*context".to_string()),
        Just("use tool".to_string()),
        Just("use tool flow".to_string()),
        Just("```".to_string()),
        Just("\n".to_string()),
        Just("\r\n".to_string()),
        Just("\r".to_string()),
        Just(" ".to_string()),
        Just("\t".to_string()),
        Just("é🕒".to_string()),
        "[a-zA-Z =;:{}\"]{0,8}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_on_arbitrary_text(input in any::<String>()) {
        let _ = parse_reply(&input);
    }

    #[test]
    fn parser_never_panics_on_marker_fragments(parts in prop::collection::vec(fragment(), 0..40)) {
        let input = parts.concat();
        let parsed = parse_reply(&input);
        // A call's tool name is always one trimmed, non-empty line.
        if let ParsedReply::Call(c) = parsed {
            prop_assert!(!c.tool.is_empty() && !c.tool.contains('\n') && c.tool.trim() == c.tool);
            prop_assert_eq!(c.context.trim(), c.context.as_str());
        }
    }

    #[test]
    fn any_single_line_context_round_trips(ctx in "[^\r\n]{0,60}") {
        let input = format!("<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nT\n!*context\n{ctx}\n</SYSTEM CALL>");
        let expected_ok = !matches!(attempt_kind_exact(&ctx), Some(()));
        if expected_ok {
            prop_assert_eq!(parse_reply(&input), call(Script, "T", ctx.trim(), ""));
        }
    }
}

/// Whether a context line would be structure (a column-0 marker/tag), which the round-trip
/// property excludes.
fn attempt_kind_exact(line: &str) -> Option<()> {
    let exact = line.trim_end();
    if exact == OPEN_TAG || exact == CLOSE_TAG {
        return Some(());
    }
    Marker::ALL
        .into_iter()
        .any(|m| {
            line.strip_prefix(m.as_str()).is_some_and(|rest| {
                rest.trim().is_empty()
                    || rest.starts_with(|c: char| c.is_whitespace() || c == ':' || c == '=')
            })
        })
        .then_some(())
}
