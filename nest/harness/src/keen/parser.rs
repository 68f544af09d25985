//! The strict `<SYSTEM CALL>` parser: turns one model reply into "no call", "a call" or "an
//! attempted call that is malformed".
//!
//! Invariants: never panics on any input (a proptest checks it); only the FIRST call attempt of
//! a reply decides the outcome (later blocks are ignored, as the spec's "one call per turn");
//! the parser knows nothing of the registry (a wrong action for a tool's type is found by
//! [`check_action`] at dispatch).
//!
//! # The rules (spec "Strict formatting rules", settled here where the spec is silent)
//! - Lines end in `\n` or `\r\n`; a leading byte-order mark is ignored. Trailing spaces/tabs
//!   on a tag or marker line are ignored; leading ones are not (an indented tag or marker is
//!   the "indented markers" mistake).
//! - A block opens with a line that is exactly `<SYSTEM CALL>` and closes with the first later
//!   line that is exactly `</SYSTEM CALL>`, both at column 0.
//! - Inside, the three markers `!*action`, `!*tool`, `!*context` each stand alone on a line at
//!   column 0, each exactly once, `!*action` first; any order of the other two is accepted.
//!   The action value is one line, exactly `use tool` or `use tool flow`; the tool value is one
//!   line (the registered name, spaces allowed). Blank lines around a value are ignored.
//! - The context is every line after `!*context` up to the next marker or the closing tag,
//!   trimmed of leading/trailing whitespace; it may be empty or span many lines and hold any
//!   text, except a line that is at column 0 exactly a tag or a marker (those are structure).
//!   Indented marker-like text and marker text in the middle of a line are plain context.
//! - Text outside the block is narration.
//!
//! # What counts as an attempted call
//! The first line (outside or inside a code fence) whose trimmed text starts with
//! `<SYSTEM CALL>`, `</SYSTEM CALL>`, `!*action`, `!*tool` or `!*context`, or ends with
//! `<SYSTEM CALL>`, is the call attempt. If it is a well-formed block at column 0 outside a
//! fence, the result is [`ParsedReply::Call`]; otherwise [`ParsedReply::Malformed`] with the
//! [`Mistake`] (fenced block, indented tag, text on the tag line, markers without a block,
//! closing tag without an opening one, unterminated block, commentary inside the block, two
//! calls in one block, missing/empty markers, unknown action). A tag mentioned in the middle of
//! a sentence ("put it between `<SYSTEM CALL>` and …") is narration, not an attempt.

use std::fmt;

/// The opening tag line.
pub const OPEN_TAG: &str = "<SYSTEM CALL>";
/// The closing tag line.
pub const CLOSE_TAG: &str = "</SYSTEM CALL>";

/// One of the three `!*` markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    Action,
    Tool,
    Context,
}

impl Marker {
    const ALL: [Marker; 3] = [Marker::Action, Marker::Tool, Marker::Context];

    /// The marker as written on its line.
    pub fn as_str(self) -> &'static str {
        match self {
            Marker::Action => "!*action",
            Marker::Tool => "!*tool",
            Marker::Context => "!*context",
        }
    }
}

impl fmt::Display for Marker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which wire-format variant the model used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeenAction {
    /// `use tool`: a script tool (and MCP tools/built-ins offered as scripts).
    Script,
    /// `use tool flow`: a flow ("pipe") tool.
    Flow,
}

impl KeenAction {
    /// The literal action phrase.
    pub fn as_str(self) -> &'static str {
        match self {
            KeenAction::Script => "use tool",
            KeenAction::Flow => "use tool flow",
        }
    }
}

/// A well-formed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeenCall {
    pub action: KeenAction,
    /// The `!*tool` value, trimmed (case-sensitive registry name).
    pub tool: String,
    /// The `!*context` value, trimmed; `""` when empty.
    pub context: String,
    /// Text outside the block (before and after, each trimmed, joined by a blank line).
    pub narration: String,
}

/// What went wrong in an attempted call. `Display` is a lowercase sentence for the instance
/// log; it may quote the model's text, so it must never be sent back to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mistake {
    /// The attempt sits inside a ``` (or ~~~) code fence.
    Fenced,
    /// `<SYSTEM CALL>` or `</SYSTEM CALL>` is indented.
    IndentedTag,
    /// A tag shares its line with other text.
    TextOnTagLine,
    /// `</SYSTEM CALL>` with no block open.
    CloseWithoutOpen,
    /// A `!*` marker appears with no `<SYSTEM CALL>` before it.
    MarkerOutsideBlock(Marker),
    /// No `</SYSTEM CALL>` line after the opening tag.
    Unterminated,
    /// A second `<SYSTEM CALL>` line inside an open block.
    NestedOpen,
    /// Text between `<SYSTEM CALL>` and the first marker.
    TextBeforeFirstMarker,
    /// The block does not start with `!*action`.
    ActionNotFirst,
    /// A marker is indented (e.g. as a bullet item).
    IndentedMarker(Marker),
    /// A marker has text on its own line (`!*tool ToolTimestamp`).
    TextOnMarkerLine(Marker),
    /// A marker appears twice: two calls in one block.
    RepeatedMarker(Marker),
    /// A marker is missing.
    MissingMarker(Marker),
    /// `!*action` or `!*tool` has no value.
    EmptyValue(Marker),
    /// More than one line of text in the `!*action` or `!*tool` value (commentary).
    ExtraText(Marker),
    /// The action is neither `use tool` nor `use tool flow`.
    UnknownAction(String),
}

impl fmt::Display for Mistake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mistake::Fenced => write!(f, "the <SYSTEM CALL> block is inside a code fence; write it without ``` around it"),
            Mistake::IndentedTag => write!(f, "a <SYSTEM CALL> tag is indented; tags must start at column 0"),
            Mistake::TextOnTagLine => write!(f, "a <SYSTEM CALL> tag shares its line with other text; tags must be alone on their line"),
            Mistake::CloseWithoutOpen => write!(f, "</SYSTEM CALL> appears before any <SYSTEM CALL>"),
            Mistake::MarkerOutsideBlock(m) => write!(f, "{m} appears outside a <SYSTEM CALL> block"),
            Mistake::Unterminated => write!(f, "the <SYSTEM CALL> block has no </SYSTEM CALL> line"),
            Mistake::NestedOpen => write!(f, "a second <SYSTEM CALL> opens inside a block; one block = one call"),
            Mistake::TextBeforeFirstMarker => write!(f, "text between <SYSTEM CALL> and !*action; no extra text inside the block"),
            Mistake::ActionNotFirst => write!(f, "the block must start with !*action"),
            Mistake::IndentedMarker(m) => write!(f, "{m} is indented; markers must start at column 0"),
            Mistake::TextOnMarkerLine(m) => write!(f, "{m} has text on its line; put the value on the next line"),
            Mistake::RepeatedMarker(m) => write!(f, "{m} appears twice; one block = one tool call"),
            Mistake::MissingMarker(m) => write!(f, "the block has no {m} marker"),
            Mistake::EmptyValue(m) => write!(f, "{m} has no value"),
            Mistake::ExtraText(m) => write!(f, "{m} has more than one line of text; no commentary inside the block"),
            Mistake::UnknownAction(a) => write!(f, "unknown action {a:?}; expected \"use tool\" or \"use tool flow\""),
        }
    }
}

/// The parse of one model reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedReply {
    /// No call attempt: the reply is a plain answer.
    NoCall,
    /// The first block is a well-formed call.
    Call(KeenCall),
    /// The first call attempt is malformed: recall with the general failure sentence.
    Malformed {
        mistake: Mistake,
        /// 1-based line of the reply where the problem was found.
        line: usize,
    },
}

/// Parses one reply by the strict rules (see the module doc).
pub fn parse_reply(text: &str) -> ParsedReply {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let mut in_fence = false;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if is_fence(trimmed) {
            in_fence = !in_fence;
            continue;
        }
        let Some(kind) = attempt_kind(trimmed) else {
            continue;
        };
        let malformed = |mistake| ParsedReply::Malformed {
            mistake,
            line: i + 1,
        };
        if in_fence {
            return malformed(Mistake::Fenced);
        }
        let exact = line.trim_end();
        return match kind {
            Attempt::Open if exact == OPEN_TAG => match parse_block(&lines, i) {
                Ok(call) => ParsedReply::Call(call),
                Err((mistake, line)) => ParsedReply::Malformed { mistake, line },
            },
            Attempt::Open | Attempt::Close if trimmed == OPEN_TAG || trimmed == CLOSE_TAG => {
                if kind == Attempt::Close && exact == CLOSE_TAG {
                    malformed(Mistake::CloseWithoutOpen)
                } else {
                    malformed(Mistake::IndentedTag)
                }
            }
            Attempt::Open | Attempt::Close => malformed(Mistake::TextOnTagLine),
            Attempt::Marker(m) => malformed(Mistake::MarkerOutsideBlock(m)),
        };
    }
    ParsedReply::NoCall
}

/// Why an action does not fit the tool's type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool {tool:?} is a {kind} tool and is called with {expected:?}, not {used:?}")]
pub struct WrongAction {
    pub tool: String,
    pub kind: &'static str,
    pub expected: &'static str,
    pub used: &'static str,
}

/// Checks the call's action against the tool's kind: flow tools take `use tool flow`; script
/// tools and native (MCP/built-in) tools take `use tool`.
pub fn check_action(call: &KeenCall, kind: super::KeenToolKind) -> Result<(), WrongAction> {
    let expected = kind.action();
    if call.action == expected {
        return Ok(());
    }
    Err(WrongAction {
        tool: call.tool.clone(),
        kind: kind.as_str(),
        expected: expected.as_str(),
        used: call.action.as_str(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    Open,
    Close,
    Marker(Marker),
}

fn is_fence(trimmed: &str) -> bool {
    trimmed.starts_with("```") || trimmed.starts_with("~~~")
}

/// Whether a trimmed line is a call attempt, and of which kind.
fn attempt_kind(trimmed: &str) -> Option<Attempt> {
    if trimmed.starts_with(OPEN_TAG) || trimmed.ends_with(OPEN_TAG) {
        return Some(Attempt::Open);
    }
    if trimmed.starts_with(CLOSE_TAG) {
        return Some(Attempt::Close);
    }
    Marker::ALL
        .into_iter()
        .find(|m| trimmed.starts_with(m.as_str()))
        .map(Attempt::Marker)
}

/// A column-0 marker line inside a block.
enum BodyLine<'a> {
    Marker(Marker),
    Text(&'a str),
}

fn classify_body_line(line: &str) -> Result<BodyLine<'_>, Mistake> {
    for m in Marker::ALL {
        if let Some(rest) = line.strip_prefix(m.as_str()) {
            if rest.trim().is_empty() {
                return Ok(BodyLine::Marker(m));
            }
            // `!*tools` or `!*contextual` are not markers; `!*tool X` or `!*tool: X` are.
            if rest.starts_with(|c: char| c.is_whitespace() || c == ':' || c == '=') {
                return Err(Mistake::TextOnMarkerLine(m));
            }
        }
    }
    Ok(BodyLine::Text(line))
}

/// Parses the block whose opening tag is at `open` (0-based). Errors carry 1-based lines.
fn parse_block(lines: &[&str], open: usize) -> Result<KeenCall, (Mistake, usize)> {
    // Find the closing tag; a second opening tag before it is a nested block.
    let mut close = None;
    for (j, line) in lines.iter().enumerate().skip(open + 1) {
        let exact = line.trim_end();
        if exact == CLOSE_TAG {
            close = Some(j);
            break;
        }
        if exact == OPEN_TAG {
            return Err((Mistake::NestedOpen, j + 1));
        }
    }
    let Some(close) = close else {
        // An indented closing tag is the likelier mistake than a missing one.
        let indented = lines
            .iter()
            .enumerate()
            .skip(open + 1)
            .find(|(_, l)| l.trim() == CLOSE_TAG);
        return Err(match indented {
            Some((j, _)) => (Mistake::IndentedTag, j + 1),
            None => (Mistake::Unterminated, open + 1),
        });
    };

    // Per marker: its 1-based line and its value lines (1-based line, text).
    type Value<'a> = (usize, Vec<(usize, &'a str)>);
    let mut values: [Option<Value<'_>>; 3] = [None, None, None];
    let mut current: Option<Marker> = None;
    for (j, line) in lines.iter().enumerate().take(close).skip(open + 1) {
        let at = |mistake| (mistake, j + 1);
        match classify_body_line(line).map_err(at)? {
            BodyLine::Marker(m) => {
                if current.is_none() && m != Marker::Action {
                    return Err(at(Mistake::ActionNotFirst));
                }
                let slot = &mut values[m as usize];
                if slot.is_some() {
                    return Err(at(Mistake::RepeatedMarker(m)));
                }
                *slot = Some((j + 1, Vec::new()));
                current = Some(m);
            }
            BodyLine::Text(text) => match current {
                None if text.trim().is_empty() => {}
                None => {
                    let trimmed = text.trim();
                    if let Some(Attempt::Marker(m)) = attempt_kind(trimmed) {
                        return Err(at(Mistake::IndentedMarker(m)));
                    }
                    return Err(at(Mistake::TextBeforeFirstMarker));
                }
                Some(m) => {
                    // An indented marker in the action or tool value is the bullet mistake;
                    // in the context it is ordinary text.
                    if m != Marker::Context && text.starts_with(char::is_whitespace) {
                        if let Some(Attempt::Marker(inner)) = attempt_kind(text.trim()) {
                            return Err(at(Mistake::IndentedMarker(inner)));
                        }
                    }
                    if let Some((_, v)) = values[m as usize].as_mut() {
                        v.push((j + 1, text));
                    }
                }
            },
        }
    }
    let close_line = close + 1;
    let [action, tool, context] = values;
    let action = action.ok_or((Mistake::MissingMarker(Marker::Action), close_line))?;
    let tool = tool.ok_or((Mistake::MissingMarker(Marker::Tool), close_line))?;
    let context = context.ok_or((Mistake::MissingMarker(Marker::Context), close_line))?;

    let (action_line, action) = single_line(&action, Marker::Action)?;
    let action = match action {
        "use tool" => KeenAction::Script,
        "use tool flow" => KeenAction::Flow,
        other => return Err((Mistake::UnknownAction(other.to_string()), action_line)),
    };
    let (_, tool) = single_line(&tool, Marker::Tool)?;
    let context = context
        .1
        .iter()
        .map(|(_, l)| *l)
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string();

    let before = lines[..open].join("\n");
    let after = lines
        .get(close + 1..)
        .map(|l| l.join("\n"))
        .unwrap_or_default();
    let narration = [before.trim(), after.trim()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    Ok(KeenCall {
        action,
        tool: tool.to_string(),
        context,
        narration,
    })
}

/// The one non-blank line of a value, trimmed, with its 1-based line.
fn single_line<'a>(
    (marker_line, value): &(usize, Vec<(usize, &'a str)>),
    marker: Marker,
) -> Result<(usize, &'a str), (Mistake, usize)> {
    let mut non_blank = value
        .iter()
        .map(|(n, l)| (*n, l.trim()))
        .filter(|(_, l)| !l.is_empty());
    let first = non_blank
        .next()
        .ok_or((Mistake::EmptyValue(marker), *marker_line))?;
    if let Some((extra, _)) = non_blank.next() {
        return Err((Mistake::ExtraText(marker), extra));
    }
    Ok(first)
}

#[cfg(test)]
mod tests;
