//! `x-agen/harness.json`: how the harness runs the agent (parallel tool calls, tracing of
//! arguments, tool protocol, limits).
//!
//! Invariants: every key is optional and has a default (`parallelToolCalls` true,
//! `traceToolArguments` false, `storeToolArguments` full, `sensitiveFields` none, `toolProtocol`
//! native, `limits` as in `docs/limits.md`); an unknown key is
//! refused with the list of known keys (a typo must not silently fall back to a default).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::Result;
use super::json::Obj;
use crate::duration::{format_duration, parse_duration};

pub const HARNESS_FILE: &str = "x-agen/harness.json";

/// Harness settings of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarnessConfig {
    /// `parallelToolCalls` (default true): run the calls of one turn at the same time.
    pub parallel_tool_calls: bool,
    /// `traceToolArguments` (default false): record tool arguments in traces (redacted, 4 KiB).
    pub trace_tool_arguments: bool,
    /// `storeToolArguments` (default full): what the run log keeps of the model's tool-call
    /// arguments (in its turns and the conversation).
    #[serde(default)]
    pub store_tool_arguments: StoreToolArguments,
    /// `sensitiveFields` (default none): argument names (at any depth, any case) whose values
    /// are replaced by `[redacted]` in traced arguments and, with `storeToolArguments:
    /// "redacted"`, in what the run log keeps.
    #[serde(default)]
    pub sensitive_fields: Vec<String>,
    /// `toolProtocol` (default native).
    pub tool_protocol: ToolProtocol,
    pub limits: Limits,
}

/// `storeToolArguments`: what the run log keeps of tool-call arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreToolArguments {
    /// As the model wrote them (a resume shows the model its own calls).
    #[default]
    Full,
    /// Secret values and `sensitiveFields` replaced by `[redacted]` before they are stored: a
    /// resumed run and the conversation's later tasks see the redacted form.
    Redacted,
}

/// How the model calls tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolProtocol {
    /// The provider's native tool calling.
    #[default]
    Native,
    /// Keen's text protocol (`<SYSTEM CALL>` blocks).
    Keen,
}

/// `limits` in `x-agen/harness.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// `toolTimeout` (default 10m): each tool call.
    pub tool_timeout: Duration,
    /// `maxTurns` (default 50): model turns per run.
    pub max_turns: u32,
    /// `maxToolCalls` (default 200): tool calls per run, all tools together.
    pub max_tool_calls: u32,
    /// `scriptTimeout` (default 5s): one Keen script tool call.
    pub script_timeout: Duration,
    /// `scriptMemoryMb` (default 64): memory limit of one Keen script tool call, in MiB.
    pub script_memory_mb: u32,
    /// `maxAttempts` (default 5): attempts a run may lose to its own instance failing (process
    /// or tool-server death, start deadline) before its task fails; the Hub enforces it.
    pub max_attempts: u32,
    /// `maxDelegationDepth` (default 5): how deep a tree of `call_agent`/`start_agent` children
    /// under this agent's runs may grow; a call past it is a tool error.
    pub max_delegation_depth: u32,
    /// `approvalTimeout` (default 24h): how long an `ask` call waits for a person before it is
    /// denied with a reason saying so.
    pub approval_timeout: Duration,
    /// `taskTimeout` (default none): a task of this bundle fails with "deadline exceeded" this
    /// long after its submission; `agen submit --timeout` wins over it. The Hub enforces it.
    pub task_timeout: Option<Duration>,
    /// `maxTokens` (default none): model input + output tokens over all turns and attempts of a
    /// task; the run stops before a turn that would exceed it. `agen submit --max-tokens` wins.
    pub max_tokens: Option<u64>,
    /// `outputRetries` (default 2, at most 10): how often a final answer that does not match
    /// the output schema is sent back to the model with the schema error before the run fails.
    pub output_retries: u32,
}

/// The most `limits.outputRetries`.
pub const MAX_OUTPUT_RETRIES: u32 = 10;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            tool_timeout: Duration::from_secs(600),
            max_turns: 50,
            max_tool_calls: 200,
            script_timeout: Duration::from_secs(5),
            script_memory_mb: 64,
            max_attempts: 5,
            max_delegation_depth: 5,
            approval_timeout: Duration::from_secs(24 * 3600),
            task_timeout: None,
            max_tokens: None,
            output_retries: 2,
        }
    }
}

impl Default for HarnessConfig {
    fn default() -> Self {
        HarnessConfig {
            parallel_tool_calls: true,
            trace_tool_arguments: false,
            store_tool_arguments: StoreToolArguments::Full,
            sensitive_fields: Vec::new(),
            tool_protocol: ToolProtocol::Native,
            limits: Limits::default(),
        }
    }
}

impl Limits {
    /// The limits as they would be written in harness.json (for `agen` output and docs).
    pub fn describe(&self) -> String {
        format!(
            "toolTimeout {}, maxTurns {}, maxToolCalls {}, scriptTimeout {}, scriptMemoryMb {}",
            format_duration(self.tool_timeout),
            self.max_turns,
            self.max_tool_calls,
            format_duration(self.script_timeout),
            self.script_memory_mb
        )
    }
}

pub(crate) fn parse(v: &Value) -> Result<HarnessConfig> {
    let top = Obj::new(HARNESS_FILE, "", v, "an object")?;
    top.only_keys(&[
        "parallelToolCalls",
        "traceToolArguments",
        "storeToolArguments",
        "sensitiveFields",
        "toolProtocol",
        "limits",
    ])?;
    let mut h = HarnessConfig::default();
    if let Some(b) = top.opt_bool("parallelToolCalls")? {
        h.parallel_tool_calls = b;
    }
    if let Some(b) = top.opt_bool("traceToolArguments")? {
        h.trace_tool_arguments = b;
    }
    match top.opt_str("storeToolArguments")?.as_deref() {
        None | Some("full") => {}
        Some("redacted") => h.store_tool_arguments = StoreToolArguments::Redacted,
        Some(other) => {
            return Err(top.err(
                "storeToolArguments",
                format!("expected \"full\" or \"redacted\", got \"{other}\""),
            ))
        }
    }
    if let Some(v) = top.get("sensitiveFields") {
        let names = v.as_array().filter(|a| {
            a.iter()
                .all(|n| n.as_str().is_some_and(|s| !s.trim().is_empty()))
        });
        let Some(names) = names else {
            return Err(top.err(
                "sensitiveFields",
                "expected a list of argument names such as [\"password\", \"card_number\"]",
            ));
        };
        h.sensitive_fields = names
            .iter()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
    }
    match top.opt_str("toolProtocol")?.as_deref() {
        None | Some("native") => {}
        Some("keen") => h.tool_protocol = ToolProtocol::Keen,
        Some(other) => {
            return Err(top.err(
                "toolProtocol",
                format!("expected \"native\" or \"keen\", got \"{other}\""),
            ))
        }
    }
    if let Some(limits_v) = top.get("limits") {
        let l = Obj::new(
            HARNESS_FILE,
            "limits",
            limits_v,
            "an object such as {\"toolTimeout\": \"10m\"}",
        )?;
        l.only_keys(&[
            "toolTimeout",
            "maxTurns",
            "maxToolCalls",
            "scriptTimeout",
            "scriptMemoryMb",
            "maxAttempts",
            "maxDelegationDepth",
            "approvalTimeout",
            "taskTimeout",
            "maxTokens",
            "outputRetries",
        ])?;
        let duration = |key: &str| -> Result<Option<Duration>> {
            match l.opt_str(key)? {
                None => Ok(None),
                Some(s) => {
                    let d = parse_duration(&s).map_err(|e| l.err(key, e.to_string()))?;
                    if d.is_zero() {
                        return Err(l.err(
                            key,
                            format!("expected a duration above zero, such as `90s`, got `{s}`"),
                        ));
                    }
                    Ok(Some(d))
                }
            }
        };
        let positive = |key: &str| -> Result<Option<u32>> {
            match l.opt_u32(key)? {
                Some(0) => Err(l.err(key, "expected a whole number of at least 1, got 0")),
                other => Ok(other),
            }
        };
        let limits = &mut h.limits;
        if let Some(d) = duration("toolTimeout")? {
            limits.tool_timeout = d;
        }
        if let Some(d) = duration("scriptTimeout")? {
            limits.script_timeout = d;
        }
        if let Some(n) = positive("maxTurns")? {
            limits.max_turns = n;
        }
        if let Some(n) = positive("maxToolCalls")? {
            limits.max_tool_calls = n;
        }
        if let Some(n) = positive("scriptMemoryMb")? {
            limits.script_memory_mb = n;
        }
        if let Some(n) = positive("maxAttempts")? {
            limits.max_attempts = n;
        }
        if let Some(n) = positive("maxDelegationDepth")? {
            limits.max_delegation_depth = n;
        }
        if let Some(d) = duration("approvalTimeout")? {
            limits.approval_timeout = d;
        }
        if let Some(d) = duration("taskTimeout")? {
            limits.task_timeout = Some(d);
        }
        if let Some(n) = l.opt_u64("maxTokens")? {
            if n == 0 {
                return Err(l.err("maxTokens", "expected a whole number of at least 1, got 0"));
            }
            limits.max_tokens = Some(n);
        }
        if let Some(n) = l.opt_u32("outputRetries")? {
            if n > MAX_OUTPUT_RETRIES {
                return Err(l.err(
                    "outputRetries",
                    format!("{n} is over the limit of {MAX_OUTPUT_RETRIES}"),
                ));
            }
            limits.output_retries = n;
        }
    }
    Ok(h)
}
