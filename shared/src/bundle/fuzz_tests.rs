//! Property-based fuzzing of every bundle parser that takes outside input: the archive,
//! `mcp.json`, `x-agen/agent.md` front matter, `config.json`, `secrets.json`, `harness.json`
//! and `keen-tools.json`. Bounded for CI (64 cases each unless `PROPTEST_CASES` says
//! otherwise); failures proptest finds are kept under `proptest-regressions/` and replayed.

use proptest::prelude::*;
use serde_json::Value;

use super::*;

const AGENT_MD: &str = "---\nmodel: openai/gpt-4.1-mini\n---\nYou are helpful.\n";

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

/// Any JSON value, a few levels deep, with keys the parsers know mixed in.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("mcpServers".to_string()),
        Just("command".to_string()),
        Just("args".to_string()),
        Just("env".to_string()),
        Just("url".to_string()),
        Just("headers".to_string()),
        Just("limits".to_string()),
        Just("toolTimeout".to_string()),
        Just("permissions".to_string()),
        Just("allow".to_string()),
        Just("source".to_string()),
        Just("name".to_string()),
        Just("type".to_string()),
        Just("entry".to_string()),
        "[a-zA-Z${}_.*/ -]{0,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-z0-9${}_./:* -]{0,20}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Archive paths and link targets built from a few components, `..` and `.` included.
fn component() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("a"),
        Just("b"),
        Just("x-agen"),
        Just("agent.md"),
        Just(".."),
        Just("."),
        Just(""),
    ]
}

fn rel_path() -> impl Strategy<Value = String> {
    prop::collection::vec(component(), 1..4).prop_map(|c| c.join("/"))
}

fn entry() -> impl Strategy<Value = ArchiveEntry> {
    (rel_path(), 0u8..3, rel_path(), any::<bool>()).prop_map(|(path, kind, target, absolute)| {
        let kind = match kind {
            0 => EntryKind::File,
            1 => EntryKind::Executable,
            _ => EntryKind::Symlink,
        };
        let data = match kind {
            EntryKind::Symlink if absolute => format!("/{target}").into_bytes(),
            EntryKind::Symlink => target.into_bytes(),
            _ => AGENT_MD.as_bytes().to_vec(),
        };
        ArchiveEntry { path, kind, data }
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
        let mut prefixed = b"AGENBNDL\x01".to_vec();
        prefixed.extend_from_slice(&bytes);
        let _ = decode(&prefixed);
    }

    #[test]
    fn a_flipped_byte_in_a_good_archive_never_panics(at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let good = encode(&[
            ArchiveEntry { path: "x-agen/agent.md".into(), kind: EntryKind::File, data: AGENT_MD.into() },
            ArchiveEntry { path: "y".into(), kind: EntryKind::Symlink, data: b"x-agen".to_vec() },
        ]).expect("encode");
        let mut bad = good.clone();
        let i = at.index(bad.len());
        bad[i] = byte;
        let _ = decode(&bad);
    }

    /// Whatever `decode` accepts unpacks to a tree where every link resolves inside it, and
    /// loading it never reads outside.
    #[test]
    fn accepted_archives_only_hold_links_that_resolve_inside(entries in prop::collection::vec(entry(), 1..8)) {
        let mut entries = entries;
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        entries.dedup_by(|a, b| a.path == b.path);
        let bytes = encode(&entries).expect("encode");
        if decode(&bytes).is_ok() {
            let tmp = tempfile::tempdir().expect("temp dir");
            let into = tmp.path().join("b");
            unpack(&bytes, &into).expect("an accepted archive unpacks");
            let root = std::fs::canonicalize(&into).expect("root");
            for e in entries.iter().filter(|e| e.kind == EntryKind::Symlink) {
                let real = std::fs::canonicalize(into.join(&e.path));
                prop_assert!(real.is_ok(), "accepted link {} -> {:?} does not resolve", e.path, String::from_utf8_lossy(&e.data));
                let real = real.expect("checked");
                prop_assert!(real.starts_with(&root), "accepted link {} resolves to {}", e.path, real.display());
                let meta = std::fs::metadata(&real).expect("target");
                prop_assert!(meta.is_file() || meta.is_dir());
            }
            let _ = Bundle::load(&into);
        }
    }

    #[test]
    fn json_file_parsers_never_panic(v in json_value()) {
        let _ = mcp::parse(&v);
        let _ = config::parse(&v);
        let _ = secrets::parse(&v);
        let _ = harness::parse(&v);
        let wrapped = serde_json::json!({"mcpServers": v.clone(), "limits": v.clone(), "permissions": v.clone()});
        let _ = mcp::parse(&wrapped);
        let _ = harness::parse(&wrapped);
        let _ = config::parse(&wrapped);
    }

    #[test]
    fn json_text_never_panics(text in any::<String>()) {
        let _ = json::parse(MCP_FILE, &text);
    }

    #[test]
    fn agent_front_matter_never_panics(
        fields in prop::collection::vec(("[a-zA-Z]{1,12}", "[ -~]{0,30}"), 0..6),
        body in any::<String>(),
        raw in any::<String>(),
    ) {
        let yaml: String = fields.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
        let _ = agent::parse(&format!("---\n{yaml}---\n{body}"), "agent");
        let _ = agent::parse(&raw, "agent");
        let _ = agent::parse(&format!("---\n{raw}\n---\n"), "agent");
    }

    #[test]
    fn keen_tools_json_never_panics(v in json_value(), tools in prop::collection::vec(json_value(), 0..4)) {
        let tmp = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(tmp.path().join("tools")).expect("tools");
        std::fs::write(tmp.path().join("tools/x.js"), "exports.exec = () => {};").expect("script");
        for doc in [v, Value::Array(tools)] {
            std::fs::write(tmp.path().join(KEEN_TOOLS_FILE), doc.to_string()).expect("write");
            let _ = keen::load(tmp.path());
        }
    }
}

/// Regressions found by fuzzing, kept as plain cases.
#[test]
fn fuzz_regressions() {
    // A link to `.` beside a file (the root itself is a folder inside the bundle).
    let bytes = encode(&[
        ArchiveEntry {
            path: "a".into(),
            kind: EntryKind::File,
            data: vec![],
        },
        ArchiveEntry {
            path: "b".into(),
            kind: EntryKind::Symlink,
            data: b".".to_vec(),
        },
    ])
    .expect("encode");
    assert!(decode(&bytes).is_ok());
}
