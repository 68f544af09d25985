//! Text that came from someone else (a model, a tool, a bundle, another user) on its way to a
//! terminal or a log: [`escape_controls`] shows control and format characters as escapes
//! instead of letting them act, and [`display_name_problem`] is the rule for names people
//! give (token names, label values): letters, marks, numbers, punctuation, symbols and the
//! plain space; no control or format characters, no line or paragraph separators, no other
//! spaces.
//!
//! Invariant: the output of [`escape_controls`] holds no character that a terminal acts on
//! (C0 and C1 controls, DEL, bidirectional and other format characters), except `\n` and
//! `\t` when asked to keep them.

use std::borrow::Cow;

/// Whether `c` is a Unicode format character (general category Cf) or a line or paragraph
/// separator: invisible, and able to reorder or hide what is shown around it.
pub fn is_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}'
        | '\u{0600}'..='\u{0605}'
        | '\u{061C}'
        | '\u{06DD}'
        | '\u{070F}'
        | '\u{0890}'..='\u{0891}'
        | '\u{08E2}'
        | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206F}'
        | '\u{FEFF}'
        | '\u{FFF9}'..='\u{FFFB}'
        | '\u{110BD}'
        | '\u{110CD}'
        | '\u{13430}'..='\u{1343F}'
        | '\u{1BCA0}'..='\u{1BCA3}'
        | '\u{1D173}'..='\u{1D17A}'
        | '\u{E0001}'
        | '\u{E0020}'..='\u{E007F}')
}

/// `text` with every control and format character written as an escape (`\e`, `\r`, `\x07`,
/// `\u{202e}`); `\n` and `\t` kept as they are when `keep_lines` (a multi-line result), else
/// escaped too (a table cell, a log field).
pub fn escape_controls(text: &str, keep_lines: bool) -> Cow<'_, str> {
    let acts =
        |c: char| (c.is_control() && !(keep_lines && (c == '\n' || c == '\t'))) || is_format(c);
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !acts(c) {
            out.push(c);
            continue;
        }
        match c {
            '\u{1b}' => out.push_str("\\e"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// Why `name` is not a name people may give (control, format or separator characters other
/// than the plain space), or `None`.
pub fn display_name_problem(name: &str) -> Option<String> {
    let bad = name
        .chars()
        .find(|&c| c.is_control() || is_format(c) || (c.is_whitespace() && c != ' '))?;
    Some(format!(
        "holds the character {:?} (U+{:04X}); expected letters, marks, numbers, punctuation, symbols and plain spaces, with no control or format characters or line breaks",
        bad, bad as u32
    ))
}

/// A field of a log line that someone else chose (a token name, a target): shown as it is when
/// it is a plain word (letters, digits, `.`, `_`, `-`, `/`, `:`, `@`), else quoted with its
/// control characters escaped (Rust's `Debug`), so it can neither end the line nor pass for
/// another field.
pub struct LogField<'a>(pub &'a str);

impl std::fmt::Display for LogField<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plain = !self.0.is_empty()
            && self
                .0
                .chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@'))
            && !self.0.chars().any(is_format);
        if plain {
            f.write_str(self.0)
        } else {
            write!(f, "{:?}", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(input: &str, keep_lines: bool, expected: &str) {
        assert_eq!(escape_controls(input, keep_lines), expected);
    }

    #[test]
    fn controls_are_shown_as_escapes() {
        check(
            "plain text, ünïcödé 日本",
            false,
            "plain text, ünïcödé 日本",
        );
        check(
            "\u{1b}[31mred\u{1b}]0;title\u{7}",
            false,
            "\\e[31mred\\e]0;title\\x07",
        );
        check("a\r\nb\tc", false, "a\\r\\nb\\tc");
        check("a\r\nb\tc", true, "a\\r\nb\tc");
        check("evil\u{202e}txt.exe", true, "evil\\u{202e}txt.exe");
        check("\u{9b}31m", true, "\\x9b31m");
    }

    #[test]
    fn log_fields_are_plain_or_quoted() {
        assert_eq!(LogField("ci-bot").to_string(), "ci-bot");
        assert_eq!(
            LogField("x\n2026 INFO audit record token_name=admin").to_string(),
            "\"x\\n2026 INFO audit record token_name=admin\""
        );
        assert_eq!(LogField("a b").to_string(), "\"a b\"");
    }

    #[test]
    fn names_are_letters_marks_numbers_punctuation_and_spaces() {
        assert_eq!(display_name_problem("Release bot (CI) ñ 日本 v2.0"), None);
        for bad in [
            "two\nlines",
            "ansi\u{1b}[2J",
            "rtl\u{202e}",
            "tab\there",
            "nbsp\u{a0}x",
            "zw\u{200b}j",
        ] {
            assert!(display_name_problem(bad).is_some(), "{bad:?} passed");
        }
    }
}
