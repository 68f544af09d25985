//! Property-based fuzzing of the Keen parsers that take outside input: flow files and
//! `keen-tools.json` (the reply parser has its own in `parser/tests.rs`). Bounded for CI (64
//! cases unless `PROPTEST_CASES` says otherwise); failures are kept under
//! `proptest-regressions/`.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::flow::parse_flow;
use super::registry::parse_registry;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

/// JSON shaped like flows and registries: their keys and node types mixed with noise.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("nodes".to_string()),
        Just("type".to_string()),
        Just("next".to_string()),
        Just("entry".to_string()),
        Just("name".to_string()),
        Just("attempts".to_string()),
        Just("start".to_string()),
        Just("end".to_string()),
        Just("a".to_string()),
        "[a-zA-Z_ -]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just("start"),
            Just("end"),
            Just("script"),
            Just("flow"),
            Just("tools/x.js"),
            Just("a"),
            Just("Next-a"),
        ]
        .prop_map(|s| Value::String(s.into())),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn flow_files_never_panic(v in json_value(), nodes in json_value(), text in any::<String>()) {
        let _ = parse_flow("flows/F.json", &v.to_string());
        let _ = parse_flow("flows/F.json", &json!({"nodes": nodes}).to_string());
        let _ = parse_flow("flows/F.json", &text);
    }

    #[test]
    fn keen_tools_json_never_panics(items in prop::collection::vec(json_value(), 0..5), text in any::<String>()) {
        let _ = parse_registry("keen-tools.json", &Value::Array(items).to_string());
        let _ = parse_registry("keen-tools.json", &text);
    }
}
