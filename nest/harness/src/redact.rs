//! Secrets out of what a run records and shows: tool results and errors (every value the
//! instance resolved), and traced tool arguments (also cut to 4 KiB).

use serde_json::Value;

/// `text` with every secret value of the instance replaced by `[redacted]`. Values shorter than
/// 4 characters are left alone: they would redact ordinary words.
pub(super) fn redact_secrets(text: String, secrets: &[String]) -> String {
    let mut text = text;
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "[redacted]");
        }
    }
    text
}

/// Tool arguments as traces record them: secret values replaced by `[redacted]`, cut at 4 KiB.
pub(super) fn traced_arguments(arguments: &Value, secrets: &[String]) -> Value {
    const MAX: usize = 4096;
    let mut text = arguments.to_string();
    for s in secrets {
        text = text.replace(s.as_str(), "[redacted]");
    }
    if text.len() <= MAX {
        return serde_json::from_str(&text).unwrap_or(Value::String(text));
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

    #[test]
    fn tool_results_never_carry_a_secret_value() {
        let secrets = vec!["postgres://app:pw@db/app".to_string(), "abc".to_string()];
        assert_eq!(
            redact_secrets(
                "connected to postgres://app:pw@db/app as abc".into(),
                &secrets
            ),
            "connected to [redacted] as abc"
        );
    }

    #[test]
    fn traced_arguments_are_redacted_and_capped() {
        let secrets = vec!["s3cr3t-token".to_string()];
        assert_eq!(
            traced_arguments(&json!({"auth": "Bearer s3cr3t-token", "n": 1}), &secrets),
            json!({"auth": "Bearer [redacted]", "n": 1})
        );
        let long = traced_arguments(&json!({"text": "é".repeat(5000)}), &secrets);
        let text = long.as_str().expect("cut arguments are a string");
        assert!(
            text.ends_with("… (cut at 4 KiB)") && text.len() < 4200,
            "{}",
            text.len()
        );
    }
}
