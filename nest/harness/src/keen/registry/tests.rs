//! Registry tables: `keen-tools.json` parsing, the script path rule, and whole-bundle loading.

use super::*;
use pretty_assertions::assert_eq;

/// The bundle format's split, as the engine reads it.
fn split_flow_entry(entry: &str) -> Option<(&str, &str)> {
    agen_shared::bundle::split_flow_entry(entry).ok()
}

#[track_caller]
fn check_entry(entry: &str, expected: std::result::Result<(), &str>) {
    assert_eq!(
        validate_script_entry(entry).map_err(|e| e.0),
        expected.map_err(str::to_string),
        "entry {entry:?}"
    );
}

#[test]
fn script_entry_rule_is_the_specs() {
    check_entry("tools/test-tool.js", Ok(()));
    check_entry("tools/sub/dir/x.js", Ok(()));
    check_entry(
        "",
        Err("script entry is empty; expected a path such as `tools/my-tool.js`"),
    );
    for bad in ["test-tool.js", "/tools/x.js", "./tools/x.js"] {
        let msg =
            format!("script entry `{bad}` must start with `tools/` (e.g. `tools/my-tool.js`)");
        check_entry(bad, Err(&msg));
    }
    for bad in ["tools/../x.js", "tools/a..b.js"] {
        let msg = format!("script entry `{bad}` must not contain `..`");
        check_entry(bad, Err(&msg));
    }
    for bad in ["tools/a\\x.js", "tools/x\0.js"] {
        let msg = format!("script entry `{bad}` must use `/` separators and no NUL");
        check_entry(bad, Err(&msg));
    }
}

#[test]
fn flow_entries_split_at_the_first_dash() {
    assert_eq!(
        split_flow_entry("Next-ToolCall"),
        Some(("Next", "ToolCall"))
    );
    assert_eq!(
        split_flow_entry("Tool-Agent-Two"),
        Some(("Tool", "Agent-Two"))
    );
    assert_eq!(split_flow_entry("NoDash"), None);
    assert_eq!(split_flow_entry("-Start"), None);
    assert_eq!(split_flow_entry("Ctl-"), None);
}

#[test]
fn the_specs_example_registration_parses() {
    let text = r#"[
        {"name": "Test Tool", "type": "script", "entry": "tools/test-tool.js"},
        {"name": "Tool Agent", "type": "flow", "entry": "Tool-Agent"},
        {"name": "Set Question", "type": "script", "entry": "tools/set-question-tool.js"},
        {"name": "ToolTimestamp", "type": "flow", "entry": "Next-ToolCall", "attempts": 5},
        {"name": "ToolTimestampScript", "type": "script", "entry": "tools/re-tool-call-test-script.js", "attempts": 20}
    ]"#;
    let tools = parse_registry("keen-tools.json", text).expect("valid registry");
    let summary: Vec<(&str, KeenToolKind, Option<u32>)> = tools
        .iter()
        .map(|t| (t.name.as_str(), t.kind, t.attempts))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("Test Tool", KeenToolKind::Script, None),
            ("Tool Agent", KeenToolKind::Flow, None),
            ("Set Question", KeenToolKind::Script, None),
            ("ToolTimestamp", KeenToolKind::Flow, Some(5)),
            ("ToolTimestampScript", KeenToolKind::Script, Some(20)),
        ]
    );
    assert_eq!(
        tools[3].entry,
        ToolEntry::Flow {
            controller: "Next".into(),
            start_node: "ToolCall".into()
        }
    );
    assert_eq!(
        tools[0].entry,
        ToolEntry::Script {
            path: "tools/test-tool.js".into()
        }
    );
}

#[track_caller]
fn check_problems(text: &str, expected: &[&str]) {
    match parse_registry("keen-tools.json", text) {
        Err(KeenError::Invalid(problems)) => assert_eq!(problems, expected, "registry {text}"),
        other => panic!("expected problems for {text}, got {other:?}"),
    }
}

#[test]
fn registry_problems_name_the_index_field_and_expectation() {
    check_problems(
        "{",
        &["keen-tools.json: not valid JSON: EOF while parsing an object at line 1 column 1"],
    );
    check_problems(
        r#"{"name": "x"}"#,
        &[
            r#"keen-tools.json: expected a JSON array of tools like [{"name": "ToolTimestamp", "type": "script", "entry": "tools/stamp.js"}]"#,
        ],
    );
    check_problems(
        r#"[{"name": "A", "type": "script", "entry": "tools/a.js"}, {"name": "A", "type": "script", "entry": "tools/b.js"}]"#,
        &[r#"keen-tools.json: [1].name: duplicate tool name "A"; names must be unique"#],
    );
    // A script path the rule refuses is registered (issue 43, the Keen guide): the bundle's
    // load warns and dispatch answers a call with the general recall.
    for registry in [
        r#"[{"name": "A", "type": "script", "entry": "scripts/a.js"}]"#,
        r#"[{"name": "A", "type": "script", "entry": "tools/../a.js"}]"#,
        r#"[{"name": "A", "type": "script", "entry": ""}]"#,
    ] {
        assert_eq!(
            parse_registry("keen-tools.json", registry)
                .map(|t| t.len())
                .ok(),
            Some(1)
        );
    }
    check_problems(
        r#"[{"name": "A", "type": "flow", "entry": "NoDash"}]"#,
        &[
            r#"keen-tools.json: [0].entry: flow entry "NoDash" must be <Controller>-<StartNode>, e.g. "Next-ToolCall" (a controller name without / or .)"#,
        ],
    );
    check_problems(
        r#"[{"name": "A", "type": "flow", "entry": "../x-Start"}]"#,
        &[
            r#"keen-tools.json: [0].entry: flow entry "../x-Start" must be <Controller>-<StartNode>, e.g. "Next-ToolCall" (a controller name without / or .)"#,
        ],
    );
    check_problems(
        r#"[{"name": "A", "type": "pipe", "entry": "tools/a.js", "attempts": -1, "atempts": 2}]"#,
        &[
            "keen-tools.json: [0].atempts: unknown field; expected name, type, entry, attempts or description",
            "keen-tools.json: [0].type: expected \"script\" or \"flow\", got \"pipe\"",
            "keen-tools.json: [0].attempts: expected a whole number >= 0",
        ],
    );
    check_problems(
        r#"[{"type": "script"}, 3, {"name": " padded ", "type": "script", "entry": "tools/a.js"}]"#,
        &[
            "keen-tools.json: [0].name: missing; expected the tool's name",
            "keen-tools.json: [0].entry: missing; expected tools/<file>.js for a script or <Controller>-<StartNode> for a flow",
            "keen-tools.json: [1]: expected an object with name, type and entry",
            "keen-tools.json: [2].name: must be a non-empty single line without surrounding spaces",
        ],
    );
}

const NEXT_FLOW: &str = r#"{"nodes": {
  "ToolCall":      {"type": "start", "next": "compute-stamp"},
  "compute-stamp": {"type": "script", "entry": "tools/stamp.js", "next": "done"},
  "done":          {"type": "end"}
}}"#;

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create dir");
    }
    std::fs::write(path, text).expect("write file");
}

#[test]
fn a_bundle_without_keen_tools_has_no_keen_bundle() {
    let dir = tempfile::tempdir().expect("temp dir");
    assert!(KeenBundle::load(dir.path()).expect("loads").is_none());
}

#[test]
fn a_valid_bundle_loads_with_the_bundle_root_as_script_root() {
    let dir = tempfile::tempdir().expect("temp dir");
    write(
        dir.path(),
        "keen-tools.json",
        r#"[{"name": "ToolTimestamp", "type": "flow", "entry": "Next-ToolCall", "attempts": 5},
            {"name": "ToolTimestampScript", "type": "script", "entry": "tools/stamp.js", "description": "Returns the time."}]"#,
    );
    write(
        dir.path(),
        "tools/stamp.js",
        "exports.exec = (p, d) => { d.result = 'now'; };",
    );
    write(dir.path(), "flows/Next.json", NEXT_FLOW);
    let bundle = KeenBundle::load(dir.path())
        .expect("valid")
        .expect("has keen tools");
    assert_eq!(bundle.script_root, dir.path());
    assert_eq!(bundle.flows.keys().collect::<Vec<_>>(), vec!["Next"]);
    assert_eq!(
        bundle
            .tool("ToolTimestampScript")
            .and_then(|t| t.description.as_deref()),
        Some("Returns the time.")
    );
    assert!(
        bundle.tool("tooltimestamp").is_none(),
        "names are case-sensitive"
    );
}

#[test]
fn src_scripts_is_the_script_root_when_present() {
    let dir = tempfile::tempdir().expect("temp dir");
    write(
        dir.path(),
        "keen-tools.json",
        r#"[{"name": "T", "type": "script", "entry": "tools/stamp.js"}]"#,
    );
    write(
        dir.path(),
        "src/scripts/tools/stamp.js",
        "exports.exec = () => {};",
    );
    let bundle = KeenBundle::load(dir.path())
        .expect("valid")
        .expect("has keen tools");
    assert_eq!(bundle.script_root, dir.path().join("src/scripts"));

    // With src/scripts/ present, a script at the bundle root is not found.
    let dir = tempfile::tempdir().expect("temp dir");
    write(
        dir.path(),
        "keen-tools.json",
        r#"[{"name": "T", "type": "script", "entry": "tools/stamp.js"}]"#,
    );
    write(dir.path(), "src/scripts/README", "");
    write(dir.path(), "tools/stamp.js", "exports.exec = () => {};");
    let bundle = KeenBundle::load(dir.path())
        .expect("a missing script is a warning")
        .expect("has keen tools");
    assert_eq!(
        bundle.warnings,
        vec!["keen-tools.json: [0].entry: script src/scripts/tools/stamp.js does not exist"]
    );
}

#[test]
fn bundle_problems_are_all_reported_with_file_and_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    write(
        dir.path(),
        "keen-tools.json",
        r#"[{"name": "A", "type": "script", "entry": "tools/missing.js"},
            {"name": "B", "type": "flow", "entry": "Nope-Start"},
            {"name": "C", "type": "flow", "entry": "Next-Missing"},
            {"name": "D", "type": "flow", "entry": "Next-compute-stamp"},
            {"name": "E", "type": "flow", "entry": "Broken-Start"}]"#,
    );
    write(
        dir.path(),
        "flows/Next.json",
        &NEXT_FLOW.replace("tools/stamp.js", "tools/gone.js"),
    );
    write(
        dir.path(),
        "flows/Broken.json",
        r#"{"nodes": {"Start": {"type": "start", "next": "nowhere"}}}"#,
    );
    let err = KeenBundle::load(dir.path())
        .expect_err("invalid bundle")
        .to_string();
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        vec![
            r#"flows/Broken.json: node "Start": next: unknown node "nowhere""#,
            r#"flows/Next.json: node "compute-stamp": script tools/gone.js does not exist"#,
        ]
    );
    // What the Keen guide answers at run time with the general recall is a warning (issue 43).
    std::fs::remove_file(dir.path().join("flows/Broken.json")).expect("remove");
    write(dir.path(), "tools/gone.js", "exports.exec = () => {};");
    let bundle = KeenBundle::load(dir.path())
        .expect("loads with warnings")
        .expect("has keen tools");
    assert_eq!(
        bundle.warnings,
        vec![
            "keen-tools.json: [0].entry: script tools/missing.js does not exist",
            "keen-tools.json: [1].entry: flow file flows/Nope.json does not exist",
            r#"keen-tools.json: [2].entry: flows/Next.json has no node "Missing""#,
            r#"keen-tools.json: [3].entry: node "compute-stamp" in flows/Next.json is not a start node"#,
            "keen-tools.json: [4].entry: flow file flows/Broken.json does not exist",
        ]
    );
}
