//! Secrets out of everything a run, a log or a status shows: a [`Redactor`] knows every value
//! the instance resolved and the forms each takes once quoted — JSON-escaped (also ASCII-only,
//! HTML-safe, `\/`, and escaped twice), URL-encoded (RFC 3986, `encodeURIComponent`, Python
//! `quote`, form `+`, either hex case) and shell-quoted (`'\''`, `'"'"'`, double quotes,
//! backslashes) and base64 (standard and URL-safe, padded or not, at any alignment inside a longer
//! encoded text) — and replaces each with `[redacted]`. Used for tool results and errors, traced
//! tool arguments, the stderr lines and failure reasons of tool servers, and (under
//! `storeToolArguments: "redacted"`) the model's tool calls as the run log keeps them; the values of a
//! bundle's `sensitiveFields` are replaced likewise ([`without_fields`]).
//!
//! Invariant: a value shorter than 4 characters is not redacted (it would redact ordinary
//! words); longer forms are replaced first, so no part of a quoted value is left behind.

use std::collections::BTreeMap;
use std::sync::Arc;

use agen_contract::run::{Message, ToolCall};
use serde_json::Value;

/// The text a secret is replaced with.
pub const REDACTED: &str = "[redacted]";
/// Shorter values are left alone.
const MIN_LEN: usize = 4;

/// Replaces every form of every secret value with `[redacted]`. Cheap to clone; its `Debug`
/// never shows a value.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Every form of every value, longest first, no duplicates.
    forms: Arc<Vec<String>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} forms)", self.forms.len())
    }
}

impl Redactor {
    /// A redactor of `values` (and all their escaped forms).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut forms: Vec<String> = values
            .into_iter()
            .filter(|v| v.len() >= MIN_LEN)
            .flat_map(escaped_forms)
            .filter(|f| f.len() >= MIN_LEN)
            .collect();
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Redactor {
            forms: Arc::new(forms),
        }
    }

    /// A redactor of the values of resolved secrets (name → value).
    pub fn of_secrets(secrets: &BTreeMap<String, String>) -> Redactor {
        Redactor::new(secrets.values().map(String::as_str))
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// `text` with every form of every value replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for f in self.forms.iter() {
            if out.contains(f.as_str()) {
                out = out.replace(f.as_str(), REDACTED);
            }
        }
        out
    }

    /// `value` with every string in it (keys included) redacted.
    pub fn redact_json(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.redact(s)),
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.redact_json(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (self.redact(k), self.redact_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// `value` as it appears raw, JSON-escaped, URL-encoded and shell-quoted (duplicates possible).
pub fn escaped_forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_string()];
    for opts in [
        JsonStyle::default(),
        JsonStyle {
            ascii: true,
            ..JsonStyle::default()
        },
        JsonStyle {
            ascii: true,
            html: true,
            ..JsonStyle::default()
        },
        JsonStyle {
            slash: true,
            ..JsonStyle::default()
        },
    ] {
        let once = json_escape(value, opts);
        forms.push(json_escape(&once, opts));
        forms.push(once);
    }
    for safe in [URL_SAFE_STRICT, URL_SAFE_JS, URL_SAFE_PYTHON] {
        for upper in [true, false] {
            for plus in [false, true] {
                forms.push(url_encode(value, safe, upper, plus));
            }
        }
    }
    forms.push(value.replace('\'', r"'\''"));
    forms.push(value.replace('\'', r#"'"'"'"#));
    forms.push(shell_escape_with(value, |c| {
        matches!(c, '\\' | '"' | '$' | '`')
    }));
    forms.push(shell_escape_with(value, |c| {
        !(c.is_alphanumeric() || "_-./,:=@%+^".contains(c))
    }));
    forms.extend(base64_forms(value));
    forms
}

/// The shortest base64 run kept as a form: shorter ones would match ordinary text.
const MIN_BASE64: usize = 8;

/// `value` base64-encoded, standard and URL-safe, with and without padding, alone and inside a
/// longer encoded text at each of the three alignments: the characters of the encoding that
/// depend on `value`'s bytes alone (a group shared with bytes around it is left out).
fn base64_forms(value: &str) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    use base64::Engine;
    let bytes = value.as_bytes();
    let mut forms = Vec::new();
    for (padded, unpadded) in [(&STANDARD, &STANDARD_NO_PAD), (&URL_SAFE, &URL_SAFE_NO_PAD)] {
        forms.push(padded.encode(bytes));
        forms.push(unpadded.encode(bytes));
        for offset in 0..3usize {
            let mut shifted = vec![0u8; offset];
            shifted.extend_from_slice(bytes);
            let encoded = unpadded.encode(&shifted);
            let start = if offset == 0 { 0 } else { 4 };
            let end = 4 * (shifted.len() / 3);
            if end > start && end - start >= MIN_BASE64 {
                forms.push(encoded[start..end].to_string());
            }
        }
    }
    forms
}

#[derive(Debug, Clone, Copy, Default)]
struct JsonStyle {
    /// Non-ASCII as `\uXXXX` (Python's `json.dumps` default).
    ascii: bool,
    /// `<`, `>`, `&` as `\u003c`… (Go's `encoding/json`).
    html: bool,
    /// `/` as `\/` (PHP, some Java encoders).
    slash: bool,
}

fn json_escape(s: &str, style: JsonStyle) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '/' if style.slash => out.push_str("\\/"),
            '<' | '>' | '&' if style.html => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if style.ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Left as they are besides ASCII letters and digits: RFC 3986 unreserved (Python `quote(safe='')`).
const URL_SAFE_STRICT: &str = "-._~";
/// `encodeURIComponent`.
const URL_SAFE_JS: &str = "-._~!'()*";
/// Python's `quote` default (`safe='/'`).
const URL_SAFE_PYTHON: &str = "-._~/";

fn url_encode(s: &str, safe: &str, upper: bool, plus_for_space: bool) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        let c = b as char;
        if b.is_ascii_alphanumeric() || (b.is_ascii() && safe.contains(c)) {
            out.push(c);
        } else if b == b' ' && plus_for_space {
            out.push('+');
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

fn shell_escape_with(s: &str, needs: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `value` with the value of every key named in `fields` (at any depth, ASCII case ignored)
/// replaced by `[redacted]`.
pub fn without_fields(value: &Value, fields: &[String]) -> Value {
    if fields.is_empty() {
        return value.clone();
    }
    match value {
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| without_fields(v, fields)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    if fields.iter().any(|f| f.eq_ignore_ascii_case(k)) {
                        (k.clone(), Value::String(REDACTED.into()))
                    } else {
                        (k.clone(), without_fields(v, fields))
                    }
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A message as a run log keeps it under `storeToolArguments: "redacted"`: in an assistant
/// message, the text and every call's arguments without secret values, and the arguments
/// without the values of `fields`; other messages as they are.
pub fn stored_message(message: &Message, redactor: &Redactor, fields: &[String]) -> Message {
    match message {
        Message::Assistant {
            content,
            tool_calls,
        } => Message::Assistant {
            content: redactor.redact(content),
            tool_calls: tool_calls
                .iter()
                .map(|c| ToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: without_fields(&redactor.redact_json(&c.arguments), fields),
                })
                .collect(),
        },
        other => other.clone(),
    }
}

/// Tool arguments as traces record them: secret values and the values of `fields` replaced by
/// `[redacted]`, cut at 4 KiB.
pub(crate) fn traced_arguments(arguments: &Value, redactor: &Redactor, fields: &[String]) -> Value {
    match without_fields(&redactor.redact_json(arguments), fields) {
        // Each argument is capped by itself: one long text does not hide the others.
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, cap(v))).collect()),
        other => cap(other),
    }
}

/// `v` when its JSON is at most 4 KiB, else its JSON cut there (on a character boundary).
fn cap(v: Value) -> Value {
    const MAX: usize = 4096;
    let text = match &v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.len() <= MAX {
        return v;
    }
    let mut cut = MAX;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Value::String(format!("{}… (cut at 4 KiB)", &text[..cut]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A value with every character that quoting changes.
    const NASTY: &str = "p@ss \"w/rd\" 'x' <&> $HOME `id` \\ é";

    fn redactor() -> Redactor {
        Redactor::new([NASTY, "postgres://app:pw@db/app", "abc"])
    }

    #[test]
    fn tool_results_never_carry_a_secret_value() {
        assert_eq!(
            redactor().redact("connected to postgres://app:pw@db/app as abc"),
            "connected to [redacted] as abc"
        );
    }

    #[test]
    fn json_escaped_forms_are_redacted() {
        let r = redactor();
        // serde_json / JavaScript JSON.stringify.
        let text = json!({"dsn": NASTY}).to_string();
        assert_eq!(r.redact(&text), r#"{"dsn":"[redacted]"}"#);
        // Python json.dumps (ASCII only), Go (HTML-safe), PHP (`\/`), and JSON inside JSON.
        for style in [
            JsonStyle {
                ascii: true,
                ..JsonStyle::default()
            },
            JsonStyle {
                ascii: true,
                html: true,
                ..JsonStyle::default()
            },
            JsonStyle {
                slash: true,
                ..JsonStyle::default()
            },
        ] {
            let text = format!("{{\"dsn\": \"{}\"}}", json_escape(NASTY, style));
            assert_eq!(r.redact(&text), r#"{"dsn": "[redacted]"}"#, "{style:?}");
        }
        assert!(json_escape(
            NASTY,
            JsonStyle {
                ascii: true,
                ..JsonStyle::default()
            }
        )
        .contains("\\u00e9"));
        let inner = json!({"dsn": NASTY}).to_string();
        let twice = json!({ "body": inner }).to_string();
        assert_eq!(r.redact(&twice), r#"{"body":"{\"dsn\":\"[redacted]\"}"}"#);
    }

    #[test]
    fn base64_of_a_secret_is_redacted_in_every_alphabet_padding_and_alignment() {
        use base64::engine::general_purpose::{
            STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
        };
        use base64::Engine;
        let secret = "s3cr3t?>~value-with-bytes\u{e9}";
        let r = Redactor::new([secret]);
        let mut leaked = Vec::new();
        for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
            for prefix in ["", "a", "ab", "user:"] {
                for suffix in ["", "x", "@host:5432"] {
                    let text = engine.encode(format!("{prefix}{secret}{suffix}"));
                    let shown = r.redact(&format!("Authorization: Basic {text}"));
                    if !shown.contains(REDACTED) || shown.contains(&text) {
                        leaked.push(format!("{prefix:?}+{suffix:?}: {shown}"));
                    }
                }
            }
        }
        assert_eq!(leaked, Vec::<String>::new());
        // Ordinary base64 is left alone.
        assert_eq!(r.redact("aGVsbG8gd29ybGQ="), "aGVsbG8gd29ybGQ=");
    }

    #[test]
    fn url_encoded_forms_are_redacted() {
        let r = redactor();
        let strict = url_encode(NASTY, URL_SAFE_STRICT, true, false);
        assert!(strict.starts_with("p%40ss%20%22w%2Frd%22"), "{strict}");
        for text in [
            strict,
            url_encode(NASTY, URL_SAFE_STRICT, false, false),
            url_encode(NASTY, URL_SAFE_JS, true, false),
            url_encode(NASTY, URL_SAFE_PYTHON, true, true),
        ] {
            assert_eq!(
                r.redact(&format!("GET /?key={text}&x=1")),
                "GET /?key=[redacted]&x=1"
            );
        }
        // The DSN as a query parameter.
        assert_eq!(
            r.redact("dsn=postgres%3A%2F%2Fapp%3Apw%40db%2Fapp"),
            "dsn=[redacted]"
        );
    }

    #[test]
    fn shell_quoted_forms_are_redacted() {
        let r = redactor();
        // POSIX single quotes (`printf %q`-free shells, Rust shell-escape), Python shlex.quote,
        // double quotes, and backslash escapes (bash printf %q).
        let single = format!("'{}'", NASTY.replace('\'', r"'\''"));
        let shlex = format!("'{}'", NASTY.replace('\'', r#"'"'"'"#));
        let double = format!(
            "\"{}\"",
            shell_escape_with(NASTY, |c| matches!(c, '\\' | '"' | '$' | '`'))
        );
        let backslashed = shell_escape_with(NASTY, |c| {
            !(c.is_alphanumeric() || "_-./,:=@%+^".contains(c))
        });
        for (quoted, expected) in [
            (single, "psql '[redacted]'"),
            (shlex, "psql '[redacted]'"),
            (double, "psql \"[redacted]\""),
        ] {
            assert_eq!(r.redact(&format!("psql {quoted}")), expected, "{quoted}");
        }
        assert_eq!(r.redact(&format!("psql {backslashed}")), "psql [redacted]");
    }

    #[test]
    fn short_values_are_left_alone_and_debug_shows_no_value() {
        let r = redactor();
        assert_eq!(r.redact("abc is fine"), "abc is fine");
        assert!(!format!("{r:?}").contains("pw@db"));
        assert!(Redactor::new(["abc"]).is_empty());
    }

    #[test]
    fn traced_arguments_are_redacted_and_capped() {
        let r = Redactor::new(["s3cr3t-token", NASTY]);
        assert_eq!(
            traced_arguments(
                &json!({"auth": "Bearer s3cr3t-token", "n": 1, "q": [NASTY]}),
                &r,
                &[]
            ),
            json!({"auth": "Bearer [redacted]", "n": 1, "q": ["[redacted]"]})
        );
        let long = traced_arguments(&json!({"text": "é".repeat(5000), "path": "/a"}), &r, &[]);
        assert_eq!(
            long["path"], "/a",
            "each argument is capped by itself: {long}"
        );
        let text = long["text"].as_str().expect("a cut argument is a string");
        assert!(
            text.ends_with("… (cut at 4 KiB)") && text.len() < 4200,
            "{}",
            text.len()
        );
    }

    #[test]
    fn sensitive_fields_are_redacted_at_any_depth_and_stored_messages_lose_them() {
        let fields = vec!["Password".to_string(), "card".to_string()];
        let args = json!({"user": "ann", "password": "hunter22", "nested": [{"CARD": {"n": 4111}}], "note": "pw s3cr3t-token"});
        let r = Redactor::new(["s3cr3t-token"]);
        let want = json!({"user": "ann", "password": "[redacted]", "nested": [{"CARD": "[redacted]"}], "note": "pw [redacted]"});
        assert_eq!(traced_arguments(&args, &r, &fields), want);
        let m = Message::Assistant {
            content: "using s3cr3t-token".into(),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "db_login".into(),
                arguments: args.clone(),
            }],
        };
        let Message::Assistant {
            content,
            tool_calls,
        } = stored_message(&m, &r, &fields)
        else {
            panic!("an assistant message stays one");
        };
        assert_eq!(content, "using [redacted]");
        assert_eq!(tool_calls[0].arguments, want);
        assert_eq!(
            (tool_calls[0].id.as_str(), tool_calls[0].name.as_str()),
            ("call_1", "db_login")
        );
        let user = Message::user("password hunter22");
        assert_eq!(
            stored_message(&user, &r, &fields),
            user,
            "only the model's calls"
        );
        assert_eq!(without_fields(&args, &[]), args);
    }
}
