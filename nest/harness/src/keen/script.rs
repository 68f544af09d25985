//! Sandboxed JavaScript script tools on QuickJS (rquickjs): module shape, `props`, the
//! `dictionary`, limits and outcomes.
//!
//! Invariants:
//! - every call runs in a fresh `Runtime` + `Context`, so nothing survives between calls;
//! - a script has no IO: no modules can be loaded, `require` is a stub that throws, and the
//!   context has no `std`/`os`/`fetch`/timers; `console.log|info|debug|warn|error` go to
//!   `tracing` (the instance log) under target `keen::script`;
//! - limits: wall-clock deadline via the interrupt handler (default 5 s), heap via
//!   `set_memory_limit` (default 64 MiB), native stack via `set_max_stack_size`;
//! - [`run_script`] runs in a child process killed at the deadline when the `agen` binary set a
//!   runner (see `script_child`: native loops, regex backtracking and engine crashes stay in
//!   the child), else on a blocking thread so the async runtime keeps serving;
//! - values read back from `dictionary` are at most 64 deep, 200,000 values and 4 Mi
//!   characters, checked without recursion before they are serialised;
//! - the entry path is checked again here with [`validate_script_entry`] and must resolve
//!   beneath the script root (symlinks included).
//!
//! Module shape (`docs/keen.md`): `module.exports = { exec(props, dictionary) {…} }` or
//! `exports.exec = …` (or `module.exports = function (props, dictionary) {…}`); `exec` may be
//! async (the job queue is driven until its promise settles). `dictionary` is also a global.
//! `props.context` and `dictionary.context` are the raw `!*context` (`""` when empty); when the
//! context is a JSON object, or `key=value; key=value` (`;` or newlines between pairs), its keys
//! are also set on `props` (JSON values keep their types, `key=value` values are strings;
//! `props.context` stays the raw string). The answer is `dictionary.result` (a non-string is
//! sent as JSON text); `dictionary.toolStatus === 'error'` marks a logical failure.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rquickjs::{Context, Ctx, Function, Promise, Runtime, Value};
use serde_json::{Map, Value as Json};

use super::registry::validate_script_entry;

/// Limits for one script run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptLimits {
    /// Wall-clock limit (`limits.scriptTimeout`, default 5 s).
    pub timeout: Duration,
    /// Heap limit of the QuickJS runtime (default 64 MiB).
    pub memory_bytes: usize,
    /// Native stack limit of the QuickJS runtime (default 512 KiB).
    pub max_stack_bytes: usize,
}

impl Default for ScriptLimits {
    fn default() -> Self {
        ScriptLimits {
            timeout: Duration::from_secs(5),
            memory_bytes: 64 * 1024 * 1024,
            max_stack_bytes: 512 * 1024,
        }
    }
}

/// How a script run ended (also the answer of a script child process, see `script_child`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ScriptOutcome {
    /// `exec` returned (or its promise resolved).
    Ok {
        /// `dictionary.result`: `None` when unset/null/undefined; non-strings as JSON text.
        result: Option<String>,
        /// `dictionary.toolStatus === 'error'`.
        tool_status_error: bool,
        /// The final dictionary (JSON-serialisable parts; `{}` if it could not be serialised).
        dictionary: Json,
    },
    /// The script threw (or its promise rejected): `Name: message`.
    Threw(String),
    /// The script ran past its time limit.
    TimedOut,
    /// The script exceeded its memory limit.
    OutOfMemory,
    /// The entry is invalid, unreadable, or does not export `exec`.
    BadEntry(String),
}

/// Builds `props` for a context string: `{...keys, context}` (see the module doc).
pub fn props_for_context(context: &str) -> Map<String, Json> {
    let mut props = Map::new();
    let trimmed = context.trim();
    if trimmed.starts_with('{') {
        if let Ok(Json::Object(obj)) = serde_json::from_str::<Json>(trimmed) {
            props.extend(obj);
        }
    } else if let Some(pairs) = key_value_pairs(trimmed) {
        for (k, v) in pairs {
            props.insert(k.to_string(), Json::String(v.to_string()));
        }
    }
    props.insert("context".into(), Json::String(context.to_string()));
    props
}

/// `key=value; key=value` (or one pair per line); `None` unless every non-empty part is a pair
/// whose key has no spaces.
fn key_value_pairs(text: &str) -> Option<Vec<(&str, &str)>> {
    let mut pairs = Vec::new();
    for part in text.split([';', '\n']) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (k, v) = part.split_once('=')?;
        let k = k.trim();
        if k.is_empty() || k.contains(char::is_whitespace) {
            return None;
        }
        pairs.push((k, v.trim()));
    }
    (!pairs.is_empty()).then_some(pairs)
}

/// Runs a script tool call: validates `entry`, reads it beneath `script_root`, and runs it with
/// a fresh dictionary `{context}`.
pub async fn run_script_tool(
    script_root: &Path,
    entry: &str,
    context: &str,
    limits: &ScriptLimits,
) -> ScriptOutcome {
    let mut dictionary = Map::new();
    dictionary.insert("context".into(), Json::String(context.to_string()));
    run_entry(script_root, entry, Json::Object(dictionary), limits).await
}

/// Runs the script at `entry` against an existing dictionary (a flow's shared one); `props`
/// come from `dictionary.context`.
pub async fn run_entry(
    script_root: &Path,
    entry: &str,
    dictionary: Json,
    limits: &ScriptLimits,
) -> ScriptOutcome {
    match load_entry(script_root, entry).await {
        Ok(source) => run_script(source, entry.to_string(), dictionary, limits.clone()).await,
        Err(why) => ScriptOutcome::BadEntry(why),
    }
}

async fn load_entry(script_root: &Path, entry: &str) -> Result<String, String> {
    validate_script_entry(entry).map_err(|e| e.to_string())?;
    let root = tokio::fs::canonicalize(script_root)
        .await
        .map_err(|e| format!("script root {}: {e}", script_root.display()))?;
    let path = tokio::fs::canonicalize(root.join(entry))
        .await
        .map_err(|e| format!("script {entry}: {e}"))?;
    if !path.starts_with(&root) {
        return Err(format!("script {entry} resolves outside the script root"));
    }
    tokio::fs::read_to_string(&path)
        .await
        .map_err(|e| format!("script {entry}: {e}"))
}

/// Runs `source` in a script child process when the `agen` binary set a runner (see
/// `script_child`), else on a blocking thread. `label` names the script in logs and messages.
pub async fn run_script(
    source: String,
    label: String,
    dictionary: Json,
    limits: ScriptLimits,
) -> ScriptOutcome {
    if let Some(runner) = super::script_child::runner() {
        return super::script_child::run_in_child(runner, source, label, dictionary, &limits).await;
    }
    let task = tokio::task::spawn_blocking(move || {
        run_script_blocking(&source, &label, dictionary, &limits)
    });
    match task.await {
        Ok(outcome) => outcome,
        Err(e) => ScriptOutcome::Threw(format!("script engine failed: {e}")),
    }
}

/// Runs `source` on the current thread (blocks for up to the time limit).
pub fn run_script_blocking(
    source: &str,
    label: &str,
    dictionary: Json,
    limits: &ScriptLimits,
) -> ScriptOutcome {
    let context_text = match dictionary.get("context") {
        Some(Json::String(s)) => s.clone(),
        _ => String::new(),
    };
    let mut dictionary = match dictionary {
        Json::Object(map) => map,
        _ => Map::new(),
    };
    dictionary.insert("context".into(), Json::String(context_text.clone()));
    let props = Json::Object(props_for_context(&context_text));

    let runtime = match Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return ScriptOutcome::Threw(format!("cannot start the script engine: {e}")),
    };
    runtime.set_memory_limit(limits.memory_bytes);
    runtime.set_max_stack_size(limits.max_stack_bytes);
    let deadline = Instant::now() + limits.timeout;
    let timed_out = Arc::new(AtomicBool::new(false));
    let flag = timed_out.clone();
    runtime.set_interrupt_handler(Some(Box::new(move || {
        if Instant::now() >= deadline {
            flag.store(true, Ordering::SeqCst);
            true
        } else {
            false
        }
    })));
    let context = match Context::full(&runtime) {
        Ok(c) => c,
        Err(e) => return ScriptOutcome::Threw(format!("cannot start the script engine: {e}")),
    };
    let outcome = context.with(|ctx| {
        run_in_context(
            &ctx,
            source,
            label,
            &Json::Object(dictionary),
            &props,
            deadline,
        )
    });
    // When QuickJS runs out of memory it sometimes cannot even allocate the error and throws
    // `null`; a script whose source never names `null` cannot have thrown it itself.
    let null_is_oom = !source.contains("null");
    drop(context);
    drop(runtime);
    match outcome {
        Step::TimedOut => ScriptOutcome::TimedOut,
        _ if timed_out.load(Ordering::SeqCst) => ScriptOutcome::TimedOut,
        Step::Done(o) => o,
        Step::Failed(msg) if is_oom(&msg) => ScriptOutcome::OutOfMemory,
        Step::Failed(msg) if null_is_oom && msg == "uncaught null" => ScriptOutcome::OutOfMemory,
        Step::Failed(msg) => ScriptOutcome::Threw(msg),
    }
}

enum Step {
    Done(ScriptOutcome),
    TimedOut,
    Failed(String),
}

fn is_oom(msg: &str) -> bool {
    msg.contains("out of memory")
}

const PRELUDE: &str = r#"(function (log) {
  const fmt = (args) => args.map((a) => {
    if (typeof a === 'string') return a;
    try { const s = JSON.stringify(a); return s === undefined ? String(a) : s; } catch (e) { return String(a); }
  }).join(' ');
  const console = {
    log: (...a) => log('info', fmt(a)),
    info: (...a) => log('info', fmt(a)),
    debug: (...a) => log('debug', fmt(a)),
    warn: (...a) => log('warn', fmt(a)),
    error: (...a) => log('error', fmt(a)),
  };
  Object.defineProperty(globalThis, 'console', { value: console, writable: false, configurable: false });
  const require = function (name) {
    throw new Error('require(' + JSON.stringify(String(name)) + ') is not available: script tools have no modules, file system or network');
  };
  Object.defineProperty(globalThis, 'require', { value: require, writable: false, configurable: false });
})"#;

const DRIVER: &str = r#"(function (factory, props, dictionary) {
  Object.defineProperty(globalThis, 'dictionary', { value: dictionary, writable: false, configurable: false, enumerable: true });
  const module = { exports: {} };
  factory.call(module.exports, module, module.exports, globalThis.require);
  const exp = module.exports;
  const exec = typeof exp === 'function' ? exp : (exp && typeof exp.exec === 'function' ? exp.exec : null);
  if (exec === null) return null;
  return Promise.resolve(exec.call(exp, props, dictionary));
})"#;

/// Reads the answer back. Values are checked first, without recursion, to be at most
/// `MAX_DEPTH` deep and `MAX_NODES` values large, so serialising them can overflow no stack;
/// a dictionary that is not is an error naming the limit.
const COLLECT: &str = r#"(function (d) {
  const MAX_DEPTH = 64, MAX_NODES = 200000, MAX_CHARS = 4194304;
  const stack = [[d, 1]];
  const seen = new Set();
  let nodes = 0;
  while (stack.length > 0) {
    const [v, depth] = stack.pop();
    if (v === null || typeof v !== 'object') continue;
    if (seen.has(v)) continue;
    seen.add(v);
    if (depth > MAX_DEPTH) throw new RangeError('dictionary holds a value nested deeper than ' + MAX_DEPTH + ' levels; keep values in dictionary shallow (flatten them, or store them as strings)');
    const keys = Object.keys(v);
    nodes += keys.length;
    if (nodes > MAX_NODES) throw new RangeError('dictionary holds more than ' + MAX_NODES + ' values; keep only what the next step needs');
    for (const k of keys) stack.push([v[k], depth + 1]);
  }
  let result = null;
  const r = d.result;
  if (typeof r === 'string') result = r;
  else if (r !== undefined && r !== null) {
    try { result = JSON.stringify(r); } catch (e) { result = undefined; }
    if (result === undefined) result = String(r);
  }
  let dict = null;
  try { dict = JSON.stringify(d); } catch (e) { dict = null; }
  if ((typeof result === 'string' && result.length > MAX_CHARS) || (typeof dict === 'string' && dict.length > MAX_CHARS)) {
    throw new RangeError('dictionary.result or dictionary is larger than ' + MAX_CHARS + ' characters; return a summary instead');
  }
  return JSON.stringify({ result: result, toolError: d.toolStatus === 'error', dictionary: dict === undefined ? null : dict });
})"#;

fn run_in_context(
    ctx: &Ctx<'_>,
    source: &str,
    label: &str,
    dictionary: &Json,
    props: &Json,
    deadline: Instant,
) -> Step {
    match run_steps(ctx, source, label, dictionary, props, deadline) {
        Ok(step) => step,
        Err(e) => Step::Failed(describe_error(ctx, e)),
    }
}

fn run_steps(
    ctx: &Ctx<'_>,
    source: &str,
    label: &str,
    dictionary: &Json,
    props: &Json,
    deadline: Instant,
) -> rquickjs::Result<Step> {
    let script = label.to_string();
    let log = Function::new(
        ctx.clone(),
        move |level: String, text: String| match level.as_str() {
            "error" => tracing::error!(target: "keen::script", script = %script, "{text}"),
            "warn" => tracing::warn!(target: "keen::script", script = %script, "{text}"),
            "debug" => tracing::debug!(target: "keen::script", script = %script, "{text}"),
            _ => tracing::info!(target: "keen::script", script = %script, "{text}"),
        },
    )?;
    let prelude: Function = ctx.eval(PRELUDE)?;
    prelude.call::<_, ()>((log,))?;

    // The Node-style wrapper keeps the script's line numbers (the source starts on line 1).
    let wrapped = format!("(function (module, exports, require) {{{source}\n}})");
    let factory: Function = ctx.eval(wrapped)?;
    let driver: Function = ctx.eval(DRIVER)?;
    let props_js = ctx.json_parse(props.to_string())?;
    let dict_js = ctx.json_parse(dictionary.to_string())?;
    let returned: Value = driver.call((factory, props_js, dict_js.clone()))?;
    if returned.is_null() {
        return Ok(Step::Done(ScriptOutcome::BadEntry(format!(
            "{label} does not export exec(props, dictionary)"
        ))));
    }
    let promise = Promise::from_value(returned)?;
    // Drive the job queue until exec's promise settles, then drain what is left.
    loop {
        if Instant::now() >= deadline {
            return Ok(Step::TimedOut);
        }
        match promise.result::<Value>() {
            Some(Ok(_)) => break,
            Some(Err(e)) => return Err(e),
            None => {
                if !ctx.execute_pending_job() {
                    return Ok(Step::Failed(
                        "exec returned a promise that never settles (no timers or IO exist in script tools)"
                            .into(),
                    ));
                }
            }
        }
    }
    // Jobs still queued at the deadline mean the script is still running.
    while ctx.execute_pending_job() {
        if Instant::now() >= deadline {
            return Ok(Step::TimedOut);
        }
    }

    let collect: Function = ctx.eval(COLLECT)?;
    let collected: String = collect.call((dict_js,))?;
    Ok(Step::Done(parse_collected(&collected)))
}

fn parse_collected(text: &str) -> ScriptOutcome {
    let parsed: Json = serde_json::from_str(text).unwrap_or(Json::Null);
    let result = parsed
        .get("result")
        .and_then(Json::as_str)
        .map(str::to_string);
    let tool_status_error = parsed
        .get("toolError")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    let dictionary = parsed
        .get("dictionary")
        .and_then(Json::as_str)
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or_else(|| Json::Object(Map::new()));
    ScriptOutcome::Ok {
        result,
        tool_status_error,
        dictionary,
    }
}

/// `Name: message` for a thrown value; the raw text for a thrown non-error.
fn describe_error(ctx: &Ctx<'_>, error: rquickjs::Error) -> String {
    match error {
        rquickjs::Error::Exception => describe_value(ctx.catch()),
        rquickjs::Error::Allocation => "out of memory".into(),
        other => other.to_string(),
    }
}

fn describe_value(value: Value<'_>) -> String {
    if let Some(obj) = value.as_object() {
        let message: Option<String> = obj.get("message").ok();
        let name: Option<String> = obj.get("name").ok();
        if let Some(message) = message {
            let name = name.unwrap_or_else(|| "Error".into());
            return if message.is_empty() {
                name
            } else {
                format!("{name}: {message}")
            };
        }
    }
    if let Some(s) = value.as_string().and_then(|s| s.to_string().ok()) {
        return s;
    }
    if value.is_null() {
        return "uncaught null".into();
    }
    if value.is_undefined() {
        return "uncaught undefined".into();
    }
    if let Some(n) = value.as_number() {
        return format!("uncaught {n}");
    }
    format!("uncaught {}", value.type_name())
}

#[cfg(test)]
mod tests;
