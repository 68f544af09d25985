//! Script engine tests: the spec's examples (timestamp, sensor with soft validation,
//! toolStatus error), module shapes, async exec, the sandbox limits and the absence of IO.

use super::*;
use pretty_assertions::assert_eq;
use serde_json::json;

fn run(source: &str, context: &str) -> ScriptOutcome {
    run_with(source, context, &ScriptLimits::default())
}

fn run_with(source: &str, context: &str, limits: &ScriptLimits) -> ScriptOutcome {
    run_script_blocking(
        source,
        "tools/test.js",
        json!({ "context": context }),
        limits,
    )
}

fn answer(outcome: ScriptOutcome) -> String {
    match outcome {
        ScriptOutcome::Ok {
            result: Some(r),
            tool_status_error: false,
            ..
        } => r,
        other => panic!("expected an answer, got {other:?}"),
    }
}

fn short(timeout_ms: u64) -> ScriptLimits {
    ScriptLimits {
        timeout: Duration::from_millis(timeout_ms),
        ..ScriptLimits::default()
    }
}

const TIMESTAMP: &str = r#"
module.exports = {
    exec(props, dictionary) {
        dictionary.result = 'The current timestamp is ' + new Date().toISOString();
    }
};
"#;

const SENSOR: &str = r#"
const readings = { '100': 21, '200': 19, '300': 23 };
function isValidSensor(id) { return Object.prototype.hasOwnProperty.call(readings, String(id)); }
function getSensorReading(id) { return readings[String(id)]; }
exports.exec = function (props, dictionary) {
    if (!props.sensorID) {
        dictionary.result = 'You did not provide a sensorID. Please call again with !*context containing sensorID=<number>.';
        return;
    }
    if (!isValidSensor(props.sensorID)) {
        dictionary.result = `Sensor ${props.sensorID} does not exist. Available sensors: 100, 200, 300. Please call again with one of these.`;
        return;
    }
    dictionary.result = `Sensor ${props.sensorID} reads ${getSensorReading(props.sensorID)} degrees.`;
};
"#;

#[test]
fn the_spec_timestamp_tool_answers() {
    let result = answer(run(TIMESTAMP, ""));
    assert!(
        result.starts_with("The current timestamp is 20"),
        "{result}"
    );
    assert!(result.ends_with('Z'), "{result}");
}

#[test]
fn the_spec_sensor_tool_coaches_then_answers() {
    assert_eq!(
        answer(run(SENSOR, "")),
        "You did not provide a sensorID. Please call again with !*context containing sensorID=<number>."
    );
    assert_eq!(
        answer(run(SENSOR, "sensorID=999")),
        "Sensor 999 does not exist. Available sensors: 100, 200, 300. Please call again with one of these."
    );
    assert_eq!(
        answer(run(SENSOR, "sensorID=300")),
        "Sensor 300 reads 23 degrees."
    );
    assert_eq!(
        answer(run(SENSOR, "unit=C; sensorID = 100")),
        "Sensor 100 reads 21 degrees."
    );
    assert_eq!(
        answer(run(SENSOR, r#"{"sensorID": 200}"#)),
        "Sensor 200 reads 19 degrees."
    );
    // Prose is not key=value: no keys on props.
    assert_eq!(
        answer(run(SENSOR, "the sensor id is 300")),
        "You did not provide a sensorID. Please call again with !*context containing sensorID=<number>."
    );
}

#[test]
fn tool_status_error_marks_a_logical_failure() {
    let outcome = run(
        "exports.exec = (props, dictionary) => { dictionary.result = 'Could not connect to sensor 300'; dictionary.toolStatus = 'error'; };",
        "",
    );
    assert_eq!(
        outcome,
        ScriptOutcome::Ok {
            result: Some("Could not connect to sensor 300".into()),
            tool_status_error: true,
            dictionary: json!({"context": "", "result": "Could not connect to sensor 300", "toolStatus": "error"}),
        }
    );
}

#[test]
fn props_and_dictionary_carry_the_raw_context() {
    let source = "module.exports = { exec(props, d) { d.result = { props, global: dictionary === d, ctx: d.context }; } };";
    let result = answer(run(source, "a=1; b = two words"));
    let parsed: Json = serde_json::from_str(&result).expect("result is JSON text");
    assert_eq!(
        parsed,
        json!({"props": {"a": "1", "b": "two words", "context": "a=1; b = two words"}, "global": true, "ctx": "a=1; b = two words"})
    );
    // A JSON object keeps its types; `context` stays the raw string.
    let result = answer(run(source, r#"{"n": 2, "ok": true, "context": "x"}"#));
    let parsed: Json = serde_json::from_str(&result).expect("result is JSON text");
    assert_eq!(
        parsed["props"],
        json!({"n": 2, "ok": true, "context": r#"{"n": 2, "ok": true, "context": "x"}"#})
    );
}

#[test]
fn props_for_context_table() {
    #[track_caller]
    fn check(context: &str, expected: Json) {
        assert_eq!(
            Json::Object(props_for_context(context)),
            expected,
            "context: {context:?}"
        );
    }
    check("", json!({"context": ""}));
    check(
        "sensorID=300",
        json!({"sensorID": "300", "context": "sensorID=300"}),
    );
    check(
        "to=a@b.c; subject=Hi; body=x=y",
        json!({"to": "a@b.c", "subject": "Hi", "body": "x=y", "context": "to=a@b.c; subject=Hi; body=x=y"}),
    );
    check(
        "a=1\nb=2\n",
        json!({"a": "1", "b": "2", "context": "a=1\nb=2\n"}),
    );
    check("what is 2+2=4?", json!({"context": "what is 2+2=4?"}));
    check("a=1; just text", json!({"context": "a=1; just text"}));
    check("[1,2]", json!({"context": "[1,2]"}));
    check("{not json", json!({"context": "{not json"}));
}

#[test]
fn module_shapes_and_result_types() {
    assert_eq!(
        answer(run(
            "exports.exec = function (p, d) { d.result = 'a'; };",
            ""
        )),
        "a"
    );
    assert_eq!(
        answer(run(
            "module.exports = function (p, d) { d.result = 'b'; };",
            ""
        )),
        "b"
    );
    assert_eq!(
        answer(run(
            "module.exports = { exec: (p, d) => { dictionary.result = 'c'; } };",
            ""
        )),
        "c"
    );
    // A non-string result is sent as JSON text.
    assert_eq!(
        answer(run(
            "exports.exec = (p, d) => { d.result = {a: [1, 'x']}; };",
            ""
        )),
        r#"{"a":[1,"x"]}"#
    );
    assert_eq!(
        answer(run("exports.exec = (p, d) => { d.result = 42; };", "")),
        "42"
    );
    // No result.
    assert_eq!(
        run("exports.exec = (p, d) => { d.other = 1; };", ""),
        ScriptOutcome::Ok {
            result: None,
            tool_status_error: false,
            dictionary: json!({"context": "", "other": 1})
        }
    );
    // No exec.
    assert_eq!(
        run("module.exports = { run() {} };", ""),
        ScriptOutcome::BadEntry("tools/test.js does not export exec(props, dictionary)".into())
    );
}

#[test]
fn async_exec_is_awaited() {
    let source = r#"
        async function lookup(x) { await null; return x + 1; }
        module.exports = { async exec(props, dictionary) {
            const v = await lookup(41);
            dictionary.result = `answer ${v}`;
        } };
    "#;
    assert_eq!(answer(run(source, "")), "answer 42");
    let rejected =
        "module.exports = { async exec() { await null; throw new TypeError('bad input'); } };";
    assert_eq!(
        run(rejected, ""),
        ScriptOutcome::Threw("TypeError: bad input".into())
    );
    let never = "module.exports = { exec() { return new Promise(() => {}); } };";
    assert!(matches!(run(never, ""), ScriptOutcome::Threw(m) if m.contains("never settles")));
}

#[test]
fn thrown_errors_are_reported_as_name_and_message() {
    assert_eq!(
        run("exports.exec = () => { return now(); };", ""),
        ScriptOutcome::Threw("ReferenceError: now is not defined".into())
    );
    assert_eq!(
        run("exports.exec = () => { throw 'boom'; };", ""),
        ScriptOutcome::Threw("boom".into())
    );
    assert!(
        matches!(run("exports.exec = (", ""), ScriptOutcome::Threw(m) if m.starts_with("SyntaxError"))
    );
    assert!(matches!(
        run(
            "function f() { return f() + 1; } exports.exec = () => { f(); };",
            ""
        ),
        ScriptOutcome::Threw(_)
    ));
}

#[test]
fn an_endless_loop_is_stopped_at_the_time_limit() {
    for source in [
        "exports.exec = () => { while (true) {} };",
        "while (true) {}",
        "module.exports = { async exec() { await null; for (;;) {} } };",
        "exports.exec = () => { function f() { Promise.resolve().then(f); } f(); };",
    ] {
        let started = Instant::now();
        assert_eq!(
            run_with(source, "", &short(300)),
            ScriptOutcome::TimedOut,
            "{source}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{source} took {:?}",
            started.elapsed()
        );
    }
    // An endless loop that catches every exception cannot catch the interrupt.
    let sneaky = "exports.exec = () => { for (;;) { try { while (true) {} } catch (e) {} } };";
    assert_eq!(run_with(sneaky, "", &short(300)), ScriptOutcome::TimedOut);
    assert_eq!(
        answer(run(TIMESTAMP, "")).is_empty(),
        false,
        "the engine still works"
    );
}

#[test]
fn unbounded_allocation_is_stopped_at_the_memory_limit() {
    let limits = ScriptLimits {
        memory_bytes: 16 * 1024 * 1024,
        ..ScriptLimits::default()
    };
    for source in [
        "exports.exec = () => { const a = []; for (;;) a.push('x'.repeat(1 << 16) + a.length); };",
        "exports.exec = () => { let s = 'ab'; for (;;) s = s + s; };",
        "exports.exec = () => { const a = []; for (;;) a.push(new Array(1 << 16).fill(1.5)); };",
    ] {
        let started = Instant::now();
        assert_eq!(
            run_with(source, "", &limits),
            ScriptOutcome::OutOfMemory,
            "{source}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{source} took {:?}",
            started.elapsed()
        );
    }
    assert!(
        answer(run(TIMESTAMP, "")).starts_with("The current timestamp"),
        "the engine still works"
    );
}

#[test]
fn scripts_cannot_reach_files_modules_or_the_network() {
    #[track_caller]
    fn threw(source: &str, needle: &str) {
        match run(source, "") {
            ScriptOutcome::Threw(msg) => assert!(msg.contains(needle), "{source}: {msg}"),
            other => panic!("{source}: expected a throw, got {other:?}"),
        }
    }
    threw(
        "const fs = require('fs'); exports.exec = () => {};",
        "require(\"fs\") is not available",
    );
    threw(
        "exports.exec = () => { require('child_process').execSync('id'); };",
        "is not available",
    );
    threw(
        "exports.exec = async () => { await fetch('http://127.0.0.1:1/'); };",
        "fetch is not defined",
    );
    threw(
        "exports.exec = () => { std.open('/etc/passwd', 'r'); };",
        "std is not defined",
    );
    threw(
        "exports.exec = () => { os.exec(['id']); };",
        "os is not defined",
    );
    threw(
        "exports.exec = () => { new XMLHttpRequest(); };",
        "XMLHttpRequest is not defined",
    );
    threw(
        "exports.exec = () => { setTimeout(() => {}, 1); };",
        "setTimeout is not defined",
    );
    threw("exports.exec = async () => { await import('fs'); };", "");
    // The stub cannot be replaced.
    threw(
        "exports.exec = () => { globalThis.require = null; require('x'); };",
        "require",
    );
    // The engine keeps working after all of that.
    assert!(answer(run(TIMESTAMP, "")).starts_with("The current timestamp"));
}

#[test]
fn every_call_gets_a_fresh_dictionary_and_global_scope() {
    let source = r#"
        var counter = (globalThis.counter || 0) + 1;
        globalThis.counter = counter;
        exports.exec = (p, d) => { d.seen = d.leak === undefined; d.leak = 1; d.result = String(counter); };
    "#;
    assert_eq!(answer(run(source, "")), "1");
    assert_eq!(answer(run(source, "")), "1");
}

#[test]
fn console_goes_to_the_log_and_does_not_break_the_script() {
    let source = "exports.exec = (p, d) => { console.log('hello', {a: 1}); console.warn('w'); console.error(new Error('e')); d.result = 'ok'; };";
    assert_eq!(answer(run(source, "")), "ok");
}

#[test]
fn a_flow_dictionary_flows_through() {
    let outcome = run_script_blocking(
        "exports.exec = (p, d) => { d.count = (d.count || 0) + 1; d.seenContext = p.context; };",
        "tools/count.js",
        json!({"context": "x=1", "count": 2, "keep": [1, 2]}),
        &ScriptLimits::default(),
    );
    assert_eq!(
        outcome,
        ScriptOutcome::Ok {
            result: None,
            tool_status_error: false,
            dictionary: json!({"context": "x=1", "count": 3, "keep": [1, 2], "seenContext": "x=1"}),
        }
    );
}

#[tokio::test]
async fn script_tools_load_beneath_the_script_root() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("tools")).expect("tools dir");
    std::fs::write(dir.path().join("tools/stamp.js"), TIMESTAMP).expect("write script");
    std::fs::write(dir.path().join("secret.js"), TIMESTAMP).expect("write script");
    let limits = ScriptLimits::default();
    assert!(
        answer(run_script_tool(dir.path(), "tools/stamp.js", "", &limits).await)
            .starts_with("The current")
    );
    for (entry, why) in [
        (
            "",
            "script entry is empty; expected a path like tools/my-tool.js",
        ),
        (
            "secret.js",
            "script entry \"secret.js\" must start with tools/",
        ),
        (
            "tools/../secret.js",
            "script entry \"tools/../secret.js\" must not contain ..",
        ),
    ] {
        assert_eq!(
            run_script_tool(dir.path(), entry, "", &limits).await,
            ScriptOutcome::BadEntry(why.into())
        );
    }
    assert!(matches!(
        run_script_tool(dir.path(), "tools/missing.js", "", &limits).await,
        ScriptOutcome::BadEntry(m) if m.starts_with("script tools/missing.js:")
    ));
    #[cfg(unix)]
    {
        let outside = tempfile::tempdir().expect("temp dir");
        std::fs::write(outside.path().join("secret.js"), TIMESTAMP).expect("write script");
        std::os::unix::fs::symlink(
            outside.path().join("secret.js"),
            dir.path().join("tools/link.js"),
        )
        .expect("symlink");
        assert_eq!(
            run_script_tool(dir.path(), "tools/link.js", "", &limits).await,
            ScriptOutcome::BadEntry("script tools/link.js resolves outside the script root".into())
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_async_runtime_keeps_serving_while_a_script_runs() {
    let looping = run_script(
        "exports.exec = () => { for (;;) {} };".into(),
        "tools/loop.js".into(),
        json!({"context": ""}),
        short(1000),
    );
    let started = Instant::now();
    let ticker = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        started.elapsed()
    };
    let (outcome, ticked_after) = tokio::join!(looping, ticker);
    assert_eq!(outcome, ScriptOutcome::TimedOut);
    assert!(
        ticked_after < Duration::from_millis(800),
        "timer fired only after {ticked_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_are_isolated() {
    let calls = (0..8).map(|i| {
        run_script(
            "exports.exec = (p, d) => { globalThis.mine = p.n; let x = 0; for (let i = 0; i < 20000; i++) x += i; d.result = `${p.n}:${globalThis.mine}`; };".into(),
            format!("tools/c{i}.js"),
            json!({"context": format!("n={i}")}),
            ScriptLimits::default(),
        )
    });
    let results = futures::future::join_all(calls).await;
    let answers: Vec<String> = results.into_iter().map(answer).collect();
    let expected: Vec<String> = (0..8).map(|i| format!("{i}:{i}")).collect();
    assert_eq!(answers, expected);
}
