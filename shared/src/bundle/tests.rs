//! Tests of the bundle model: a good bundle parsed into its whole value, a table of broken
//! bundles each with its specific error, and the archive's determinism and safety.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use pretty_assertions::assert_eq;

use super::*;

const AGENT_MD: &str = "---\nmodel: openai/gpt-4.1-mini\n---\nYou are helpful.\n";

/// Writes `files` (path, contents) into a fresh folder named `bundle`; a `None` content
/// removes a file the base set would write.
fn write_bundle(files: &[(&str, Option<&str>)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bundle");
    let mut all: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    all.insert(AGENT_FILE, Some(AGENT_MD));
    for (path, content) in files {
        all.insert(path, *content);
    }
    for (path, content) in all {
        if let Some(content) = content {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }
    std::fs::create_dir_all(&dir).unwrap();
    tmp
}

fn load(files: &[(&str, Option<&str>)]) -> (tempfile::TempDir, Result<Bundle>) {
    let tmp = write_bundle(files);
    let result = Bundle::load(&tmp.path().join("bundle"));
    (tmp, result)
}

/// The bundle made of the base agent.md plus `files` fails with an error containing `expected`.
fn check(files: &[(&str, &str)], expected: &str) {
    let files: Vec<(&str, Option<&str>)> = files.iter().map(|(p, c)| (*p, Some(*c))).collect();
    let (_tmp, result) = load(&files);
    match result {
        Ok(_) => {
            panic!("expected an error containing {expected:?} for {files:?}, but the bundle loaded")
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(expected),
                "for {files:?}\n  expected error containing: {expected}\n  got: {msg}"
            );
        }
    }
}

fn ok(files: &[(&str, &str)]) -> Bundle {
    let files: Vec<(&str, Option<&str>)> = files.iter().map(|(p, c)| (*p, Some(*c))).collect();
    let (_tmp, result) = load(&files);
    result.unwrap_or_else(|e| panic!("expected {files:?} to load, got: {e}"))
}

#[test]
fn a_complete_bundle_parses_into_its_whole_value() {
    let tmp = write_bundle(&[
        (
            MCP_FILE,
            Some(
                r#"{"mcpServers": {
                "time": {"command": "python3", "args": ["-m", "mcp_server_time"], "env": {"TZ": "UTC", "KEY": "${TIME_KEY}"}},
                "crm": {"url": "https://crm.example/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}
            }}"#,
            ),
        ),
        (
            AGENT_FILE,
            Some("---\nname: helper\nmodel: anthropic/claude-sonnet-4-5\nbaseUrl: http://127.0.0.1:8080/v1\napiKey: ${API_KEY}\npreloadSkills: [pricing]\ntemperature: 0.2\n---\n\nYou are a helper.\n"),
        ),
        (
            CONFIG_FILE,
            Some(r#"{"delegates": ["researcher", {"deployment": "writer", "namespace": "docs", "description": "writes"}],
                 "tools": {"crm.upsert_contact": {"idempotent": true}, "time_get_current_time": {"sideEffect": false}},
                 "permissions": {"allow": ["time.*", "crm_*"], "ask": ["crm.upsert_contact"], "deny": ["crm.delete"]}}"#),
        ),
        (
            SECRETS_FILE,
            Some(r#"{"CRM_TOKEN": {"source": "platform"}, "TIME_KEY": {"source": "env", "var": "HOST_TIME_KEY"}, "API_KEY": {"source": "env"}}"#),
        ),
        (
            HARNESS_FILE,
            Some(r#"{"parallelToolCalls": false, "traceToolArguments": true, "toolProtocol": "keen",
                 "limits": {"toolTimeout": "90s", "maxTurns": 7, "maxToolCalls": 20, "scriptTimeout": "500ms", "scriptMemoryMb": 32}}"#),
        ),
        ("skills/pricing/SKILL.md", Some("---\nname: pricing\ndescription: How we price things\n---\nCharge more.\n")),
        ("skills/README.md", Some("not a skill")),
        ("src/scripts/tools/stamp.js", Some("module.exports = { exec() {} }")),
        ("flows/Next.json", Some(r#"{"nodes": {"ToolCall": {"type": "start", "next": "done"}, "done": {"type": "end"}}}"#)),
        (
            KEEN_TOOLS_FILE,
            Some(r#"[{"name": "Stamp", "type": "script", "entry": "tools/stamp.js", "attempts": 2},
                    {"name": "ToolTimestamp", "type": "flow", "entry": "Next-ToolCall", "description": "a flow"}]"#),
        ),
    ]);
    let dir = std::fs::canonicalize(tmp.path().join("bundle")).unwrap();
    let b = Bundle::load(&dir).unwrap();

    let mut servers = BTreeMap::new();
    servers.insert(
        "time".to_string(),
        ServerSpec::Command {
            command: "python3".into(),
            args: vec!["-m".into(), "mcp_server_time".into()],
            env: [
                ("KEY".to_string(), "${TIME_KEY}".to_string()),
                ("TZ".to_string(), "UTC".to_string()),
            ]
            .into(),
        },
    );
    servers.insert(
        "crm".to_string(),
        ServerSpec::Url {
            url: "https://crm.example/mcp".into(),
            headers: [(
                "Authorization".to_string(),
                "Bearer ${CRM_TOKEN}".to_string(),
            )]
            .into(),
        },
    );
    let mut extra = serde_json::Map::new();
    extra.insert("temperature".into(), serde_json::json!(0.2));
    let expected = Bundle {
        dir: dir.clone(),
        mcp: McpConfig { servers },
        agent: AgentSpec {
            name: "helper".into(),
            model: Some(ModelRef {
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-5".into(),
            }),
            base_url: Some("http://127.0.0.1:8080/v1".into()),
            api_key: Some("${API_KEY}".into()),
            preload_skills: vec!["pricing".into()],
            system_prompt: "You are a helper.".into(),
            extra,
        },
        config: AgentConfig {
            delegates: vec![
                Delegate {
                    deployment: "researcher".into(),
                    namespace: None,
                    description: None,
                    bundle: None,
                    a2a: None,
                },
                Delegate {
                    deployment: "writer".into(),
                    namespace: Some("docs".into()),
                    description: Some("writes".into()),
                    bundle: None,
                    a2a: None,
                },
            ],
            tools: [
                (
                    "crm.upsert_contact".to_string(),
                    ToolOverride {
                        side_effect: None,
                        idempotent: Some(true),
                        ..ToolOverride::default()
                    },
                ),
                (
                    "time_get_current_time".to_string(),
                    ToolOverride {
                        side_effect: Some(false),
                        idempotent: None,
                        ..ToolOverride::default()
                    },
                ),
            ]
            .into(),
            permissions: Permissions {
                allow: vec!["time.*".into(), "crm_*".into()],
                ask: vec!["crm.upsert_contact".into()],
                deny: vec!["crm.delete".into()],
            },
            double_texting: Default::default(),
            resources: Default::default(),
            network: None,
        },
        secrets: SecretDecls(
            [
                (
                    "API_KEY".to_string(),
                    SecretSource::Env {
                        var: "API_KEY".into(),
                    },
                ),
                ("CRM_TOKEN".to_string(), SecretSource::Platform),
                (
                    "TIME_KEY".to_string(),
                    SecretSource::Env {
                        var: "HOST_TIME_KEY".into(),
                    },
                ),
            ]
            .into(),
        ),
        harness: HarnessConfig {
            parallel_tool_calls: false,
            trace_tool_arguments: true,
            store_tool_arguments: Default::default(),
            sensitive_fields: Vec::new(),
            tool_protocol: ToolProtocol::Keen,
            limits: Limits {
                tool_timeout: Duration::from_secs(90),
                max_turns: 7,
                max_tool_calls: 20,
                script_timeout: Duration::from_millis(500),
                script_memory_mb: 32,
                max_attempts: 5,
                max_delegation_depth: 5,
                approval_timeout: Duration::from_secs(24 * 3600),
                task_timeout: None,
                max_tokens: None,
                output_retries: 2,
            },
        },
        skills: vec![Skill {
            name: "pricing".into(),
            description: "How we price things".into(),
            body: "Charge more.".into(),
            dir: dir.join("skills/pricing"),
        }],
        has_keen_tools: true,
        keen_tools: vec![
            KeenTool {
                name: "Stamp".into(),
                kind: KeenToolKind::Script {
                    path: dir.join("src/scripts/tools/stamp.js"),
                },
                entry: "tools/stamp.js".into(),
                attempts: Some(2),
                description: None,
            },
            KeenTool {
                name: "ToolTimestamp".into(),
                kind: KeenToolKind::Flow {
                    controller: "Next".into(),
                    start_node: "ToolCall".into(),
                },
                entry: "Next-ToolCall".into(),
                attempts: None,
                description: Some("a flow".into()),
            },
        ],
        output_schema: None,
        system_prompts: Vec::new(),
    };
    assert_eq!(b, expected);

    assert_eq!(
        referenced_secrets(&b),
        vec![
            (
                "CRM_TOKEN".to_string(),
                "mcp.json mcpServers.crm.headers.Authorization".to_string()
            ),
            (
                "TIME_KEY".to_string(),
                "mcp.json mcpServers.time.env.KEY".to_string()
            ),
            ("API_KEY".to_string(), "x-agen/agent.md apiKey".to_string()),
        ]
    );
    assert_eq!(
        b.config.permissions.decide("crm.upsert_contact"),
        Permission::Ask
    );
    assert_eq!(b.config.permissions.decide("crm.delete"), Permission::Deny);
    assert_eq!(
        b.config.permissions.decide("time.get_current_time"),
        Permission::Allow
    );
    assert_eq!(b.config.permissions.decide("files.read"), Permission::Deny);
    assert_eq!(
        b.config
            .tool_override("time.get_current_time")
            .and_then(|o| o.side_effect),
        Some(false)
    );
}

#[test]
fn a_minimal_bundle_gets_the_documented_defaults() {
    let b = ok(&[]);
    assert_eq!(b.agent.name, "bundle", "name defaults to the folder name");
    assert_eq!(
        b.agent.model,
        Some(ModelRef {
            provider: Provider::OpenAi,
            model: "gpt-4.1-mini".into()
        })
    );
    assert_eq!(b.agent.system_prompt, "You are helpful.");
    assert_eq!(b.mcp, McpConfig::default());
    assert_eq!(b.config, AgentConfig::default());
    assert_eq!(b.secrets, SecretDecls::default());
    assert_eq!(b.skills, vec![]);
    assert!(!b.has_keen_tools);
    let h = b.harness;
    assert_eq!(
        (
            h.parallel_tool_calls,
            h.trace_tool_arguments,
            h.tool_protocol
        ),
        (true, false, ToolProtocol::Native)
    );
    assert_eq!(h.limits, Limits::default());
    assert_eq!(h.limits.tool_timeout, Duration::from_secs(600));
    assert_eq!(h.limits.max_turns, 50);
    assert_eq!(h.limits.script_timeout, Duration::from_secs(5));
}

#[test]
fn accepted_variations() {
    // Front matter may be empty, model absent, CRLF line endings, a BOM.
    ok(&[(AGENT_FILE, "---\n---\nPrompt")]);
    ok(&[(
        AGENT_FILE,
        "\u{feff}---\r\nmodel: openai/llama3.1:8b\r\n---\r\nPrompt\r\n",
    )]);
    // Model names may contain slashes.
    let b = ok(&[(
        AGENT_FILE,
        "---\nmodel: openai/meta-llama/Llama-3.1-8B\n---\n",
    )]);
    assert_eq!(b.agent.model.unwrap().model, "meta-llama/Llama-3.1-8B");
    // An explicit transport type, an empty server map, http URLs with ports and IPv6.
    ok(&[(
        MCP_FILE,
        r#"{"mcpServers": {"a": {"type": "stdio", "command": "x"}, "b": {"type": "http", "url": "http://[::1]:8080/mcp"}}}"#,
    )]);
    ok(&[(MCP_FILE, r#"{"mcpServers": {}}"#)]);
    ok(&[(MCP_FILE, r#"{}"#)]);
    // A `$` that is not `${` is literal.
    ok(&[(
        MCP_FILE,
        r#"{"mcpServers": {"a": {"command": "x", "env": {"P": "$HOME/x"}}}}"#,
    )]);
    // Keen script root is the bundle root without src/scripts/.
    ok(&[
        ("tools/a.js", ""),
        (
            KEEN_TOOLS_FILE,
            r#"[{"name": "A", "type": "script", "entry": "tools/a.js"}]"#,
        ),
    ]);
}

#[test]
#[rustfmt::skip] // one broken bundle per line reads as a table
fn broken_bundles_each_yield_their_specific_error() {
    // Bad JSON, in every JSON file, with line and column.
    check(&[(MCP_FILE, "{\"mcpServers\": {\n  \"a\": {\"command\": \"x\",}\n}}")], "mcp.json: invalid JSON at line 2 column");
    check(&[(CONFIG_FILE, "{")], "x-agen/config.json: invalid JSON at line 1 column 1");
    check(&[(SECRETS_FILE, "[1,]")], "x-agen/secrets.json: invalid JSON at line 1 column");
    check(&[(HARNESS_FILE, "nope")], "x-agen/harness.json: invalid JSON at line 1 column 2: expected ident");
    check(&[(KEEN_TOOLS_FILE, "[{]")], "keen-tools.json: invalid JSON at line 1 column");

    // mcp.json shapes.
    check(&[(MCP_FILE, r#"{"servers": {}}"#)], "mcp.json: servers: unknown key; expected one of: mcpServers");
    check(&[(MCP_FILE, r#"[]"#)], "mcp.json: (top level): expected an object");
    check(&[(MCP_FILE, r#"{"mcpServers": []}"#)], "mcp.json: mcpServers: expected an object of servers by name, got an array");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"cmd": "x"}}}"#)], "mcp.json: mcpServers.a: unknown server shape; expected {\"command\"");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}"#)], "mcp.json: mcpServers.a: has both \"command\" and \"url\"");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": " "}}}"#)], "mcp.json: mcpServers.a.command: is empty");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": ["x"]}}}"#)], "mcp.json: mcpServers.a.command: expected a string (the program to run), got an array");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "args": "-v"}}}"#)], "mcp.json: mcpServers.a.args: expected an array of strings, got a string");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#)], "mcp.json: mcpServers.a.args[0]: expected a string, got a number");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "env": {"N": 1}}}}"#)], "mcp.json: mcpServers.a.env.N: expected a string, got a number");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "cwd": "/"}}}"#)], "mcp.json: mcpServers.a.cwd: unknown key; expected one of: command, args, env, type");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "type": "sse"}}}"#)], "mcp.json: mcpServers.a.type: expected \"stdio\"");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"url": "http://h", "type": "sse"}}}"#)], "mcp.json: mcpServers.a.type: expected \"http\"");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"url": "crm.example/mcp"}}}"#)], "mcp.json: mcpServers.a.url: expected an http:// or https:// URL such as `https://crm.example/mcp`, got `crm.example/mcp`");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"url": "https://"}}}"#)], "mcp.json: mcpServers.a.url: expected an http:// or https:// URL");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"url": "http://h:port/x"}}}"#)], "mcp.json: mcpServers.a.url: expected an http:// or https:// URL such as `https://crm.example/mcp` (the port must be a number)");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"url": 5}}}"#)], "mcp.json: mcpServers.a.url: expected a string, got a number");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"url": "http://h", "headers": []}}}"#)], "mcp.json: mcpServers.a.headers: expected an object of strings, got an array");
    check(&[(MCP_FILE, r#"{"mcpServers": {"my.crm": {"url": "http://h"}}}"#)], "mcp.json: mcpServers.my.crm: bad server name; expected 1-64 letters, digits, `_` or `-` (no dots");
    check(&[(MCP_FILE, r#"{"mcpServers": {"": {"url": "http://h"}}}"#)], "mcp.json: mcpServers.: bad server name");

    // Secrets: undeclared, malformed, bad sources.
    check(
        &[(MCP_FILE, r#"{"mcpServers": {"crm": {"url": "https://crm.example/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}}}"#)],
        "x-agen/secrets.json: secret CRM_TOKEN used in mcp.json mcpServers.crm.headers.Authorization is not declared",
    );
    check(
        &[(MCP_FILE, r#"{"mcpServers": {"sql": {"command": "agen", "env": {"DATABASE_URL": "${DATABASE_URL}"}}}}"#), (SECRETS_FILE, r#"{"OTHER": {"source": "platform"}}"#)],
        "x-agen/secrets.json: secret DATABASE_URL used in mcp.json mcpServers.sql.env.DATABASE_URL is not declared",
    );
    check(&[(AGENT_FILE, "---\napiKey: ${OPENAI_API_KEY}\n---\n")], "x-agen/secrets.json: secret OPENAI_API_KEY used in x-agen/agent.md apiKey is not declared");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "env": {"K": "${BROKEN"}}}}"#)], "mcp.json: mcpServers.a.env.K: `${` without a closing `}`");
    check(&[(MCP_FILE, r#"{"mcpServers": {"a": {"command": "x", "env": {"K": "${a-b}"}}}}"#)], "mcp.json: mcpServers.a.env.K: bad secret reference `${a-b}`");
    check(&[(SECRETS_FILE, r#"{"T": {"source": "vault"}}"#)], "x-agen/secrets.json: T.source: expected \"platform\" (the Hub's secret store) or \"env\" (with \"var\"), got \"vault\"");
    check(&[(SECRETS_FILE, r#"{"T": {}}"#)], "x-agen/secrets.json: T.source: missing; expected \"platform\"");
    check(&[(SECRETS_FILE, r#"{"T": "platform"}"#)], "x-agen/secrets.json: T: expected an object such as {\"source\": \"platform\"}");
    check(&[(SECRETS_FILE, r#"{"T": {"source": "platform", "var": "X"}}"#)], "x-agen/secrets.json: T.var: unknown key; expected one of: source");
    check(&[(SECRETS_FILE, r#"{"T": {"source": "env", "var": "NOT VALID"}}"#)], "x-agen/secrets.json: T.var: expected an environment variable name, got `NOT VALID`");
    check(&[(SECRETS_FILE, r#"{"9T": {"source": "platform"}}"#)], "x-agen/secrets.json: 9T: bad secret name");
    check(&[(SECRETS_FILE, r#"[]"#)], "x-agen/secrets.json: (top level): expected an object of secrets by name");

    // agent.md.
    let missing: &[(&str, Option<&str>)] = &[(AGENT_FILE, None)];
    let err = load(missing).1.unwrap_err().to_string();
    assert!(err.starts_with("x-agen/agent.md: missing; a bundle needs x-agen/agent.md"), "{err}");
    check(&[(AGENT_FILE, "You are helpful, no front matter.")], "x-agen/agent.md: front matter: expected the file to start with a `---` line");
    check(&[(AGENT_FILE, "---\nmodel: openai/gpt-4.1\nYou are helpful.")], "x-agen/agent.md: front matter: no closing `---` line");
    check(&[(AGENT_FILE, "---\nmodel: [unclosed\n---\n")], "x-agen/agent.md: front matter: invalid YAML at line 3 column 1: did not find expected ',' or ']'");
    check(&[(AGENT_FILE, "---\n- a list\n---\n")], "x-agen/agent.md: front matter: expected `key: value` fields");
    check(&[(AGENT_FILE, "---\nmodel: gpt-4.1-mini\n---\n")], "x-agen/agent.md: model: expected `<provider>/<model>` such as `openai/gpt-4.1-mini` or `anthropic/claude-sonnet-4-5`, got `gpt-4.1-mini`");
    check(&[(AGENT_FILE, "---\nmodel: openai/\n---\n")], "x-agen/agent.md: model: expected `<provider>/<model>`");
    check(&[(AGENT_FILE, "---\nmodel: gemini/pro\n---\n")], "x-agen/agent.md: model: unknown provider `gemini` in `gemini/pro`; expected one of: openai (any OpenAI-compatible API), anthropic");
    check(&[(AGENT_FILE, "---\nmodel: 5\n---\n")], "x-agen/agent.md: model: expected `<provider>/<model>` such as `openai/gpt-4.1-mini`, got a number");
    check(&[(AGENT_FILE, "---\nbaseUrl: localhost:8080\n---\n")], "x-agen/agent.md: baseUrl: expected an http:// or https:// URL");
    check(&[(AGENT_FILE, "---\nname: ''\n---\n")], "x-agen/agent.md: name: is empty");
    check(&[(AGENT_FILE, "---\npreloadSkills: pricing\n---\n")], "x-agen/agent.md: preloadSkills: expected an array of strings, got a string");
    check(&[(AGENT_FILE, "---\npreloadSkills: [pricing]\n---\n")], "x-agen/agent.md: preloadSkills[0]: skill `pricing` not found; expected a folder skills/pricing/ with a SKILL.md (skills in this bundle: none)");

    // harness.json.
    check(&[(HARNESS_FILE, r#"{"limits": {"toolTimeout": "ten minutes"}}"#)], "x-agen/harness.json: limits.toolTimeout: expected a duration such as `90s`, `10m` or `1h30m`, got `ten minutes`");
    check(&[(HARNESS_FILE, r#"{"limits": {"toolTimeout": 600}}"#)], "x-agen/harness.json: limits.toolTimeout: expected a string, got a number");
    check(&[(HARNESS_FILE, r#"{"limits": {"scriptTimeout": "0s"}}"#)], "x-agen/harness.json: limits.scriptTimeout: expected a duration above zero");
    check(&[(HARNESS_FILE, r#"{"limits": {"maxTurns": -1}}"#)], "x-agen/harness.json: limits.maxTurns: expected a whole number from 0 to 4294967295, got -1");
    check(&[(HARNESS_FILE, r#"{"limits": {"maxTurns": 0}}"#)], "x-agen/harness.json: limits.maxTurns: expected a whole number of at least 1, got 0");
    check(&[(HARNESS_FILE, r#"{"limits": {"taskTimeout": "0s"}}"#)], "x-agen/harness.json: limits.taskTimeout: expected a duration above zero");
    check(&[(HARNESS_FILE, r#"{"limits": {"maxTokens": 0}}"#)], "x-agen/harness.json: limits.maxTokens: expected a whole number of at least 1, got 0");
    check(&[(HARNESS_FILE, r#"{"limits": {"maxTokens": "1k"}}"#)], "x-agen/harness.json: limits.maxTokens: expected a whole number, got a string");
    check(&[(HARNESS_FILE, r#"{"limits": {"maxturns": 5}}"#)], "x-agen/harness.json: limits.maxturns: unknown key; expected one of: toolTimeout, maxTurns, maxToolCalls, scriptTimeout, scriptMemoryMb, maxAttempts, maxDelegationDepth");
    check(&[(HARNESS_FILE, r#"{"parallelToolcalls": false}"#)], "x-agen/harness.json: parallelToolcalls: unknown key; expected one of: parallelToolCalls, traceToolArguments, storeToolArguments, sensitiveFields, toolProtocol, limits");
    check(&[(HARNESS_FILE, r#"{"parallelToolCalls": "no"}"#)], "x-agen/harness.json: parallelToolCalls: expected true or false, got a string");
    check(&[(HARNESS_FILE, r#"{"toolProtocol": "xml"}"#)], "x-agen/harness.json: toolProtocol: expected \"native\" or \"keen\", got \"xml\"");
    check(&[(HARNESS_FILE, r#"{"storeToolArguments": "none"}"#)], "x-agen/harness.json: storeToolArguments: expected \"full\" or \"redacted\", got \"none\"");
    check(&[(HARNESS_FILE, r#"{"sensitiveFields": "password"}"#)], "x-agen/harness.json: sensitiveFields: expected a list of argument names");
    check(&[(HARNESS_FILE, r#"{"sensitiveFields": ["password", ""]}"#)], "x-agen/harness.json: sensitiveFields: expected a list of argument names");

    // config.json.
    check(&[(CONFIG_FILE, r#"{"permission": {}}"#)], "x-agen/config.json: permission: unknown key; expected one of: delegates, tools, permissions, doubleTexting, network");
    check(&[(CONFIG_FILE, r#"{"doubleTexting": "later"}"#)], "x-agen/config.json: doubleTexting: expected one of reject, enqueue, interrupt, rollback, got \"later\"");
    check(&[(CONFIG_FILE, r#"{"permissions": {"allow": "fs.*"}}"#)], "x-agen/config.json: permissions.allow: expected an array of strings, got a string");
    check(&[(CONFIG_FILE, r#"{"permissions": {"deny": [""]}}"#)], "x-agen/config.json: permissions.deny[0]: is empty; expected a tool name");
    check(&[(CONFIG_FILE, r#"{"permissions": {"ask": ["fs.run(rm *)"]}}"#)], "x-agen/config.json: permissions.ask[0]: expected a tool name such as `crm.upsert_contact`, `crm_upsert_contact` or a pattern such as `crm.*`, got `fs.run(rm *)` (`(` is not supported; only `*` is a wildcard)");
    check(&[(CONFIG_FILE, r#"{"permissions": {"ask": [" fs.run"]}}"#)], "x-agen/config.json: permissions.ask[0]: expected a tool name");
    check(&[(CONFIG_FILE, r#"{"permissions": {"block": []}}"#)], "x-agen/config.json: permissions.block: unknown key; expected one of: allow, ask, deny");
    check(&[(CONFIG_FILE, r#"{"tools": {"crm.upsert": {"sideEffects": false}}}"#)], "x-agen/config.json: tools.crm.upsert.sideEffects: unknown key; expected one of: sideEffect, idempotent, timeout, retries, backoff");
    check(&[(CONFIG_FILE, r#"{"tools": {"crm.upsert": {"idempotent": "yes"}}}"#)], "x-agen/config.json: tools.crm.upsert.idempotent: expected true or false, got a string");
    check(&[(CONFIG_FILE, r#"{"tools": {"crm.up*": {"idempotent": true}}}"#)], "x-agen/config.json: tools.crm.up*: expected a tool name such as `ws.run` or a whole server such as `ws.*`, not another pattern");
    check(&[(CONFIG_FILE, r#"{"tools": {"crm.*": {"retries": 11}}}"#)], "x-agen/config.json: tools.crm.*.retries: 11 is over the limit of 10 retries");
    check(&[(CONFIG_FILE, r#"{"tools": {"crm.a": {"retries": 1, "idempotent": false}}}"#)], "x-agen/config.json: tools.crm.a.retries: only a read-only or idempotent tool may be retried; this entry says \"idempotent\": false");
    check(&[(CONFIG_FILE, r#"{"tools": {"crm.a": {"timeout": "0s"}}}"#)], "x-agen/config.json: tools.crm.a.timeout: expected a duration above zero, such as `90s`, got `0s`");
    check(&[(CONFIG_FILE, r#"{"tools": {"crm.a": {"backoff": "2h"}}}"#)], "x-agen/config.json: tools.crm.a.backoff: `2h` is over the limit of 10m");
    check(&[(CONFIG_FILE, r#"{"delegates": "researcher"}"#)], "x-agen/config.json: delegates: expected an array of deployment names, got a string");
    check(&[(CONFIG_FILE, r#"{"delegates": [5]}"#)], "x-agen/config.json: delegates[0]: expected a deployment name, ");
    check(&[(CONFIG_FILE, r#"{"delegates": ["two words"]}"#)], "x-agen/config.json: delegates[0]: expected a deployment name without spaces, got `two words`");
    check(&[(CONFIG_FILE, r#"{"delegates": [{"namespace": "x"}]}"#)], "x-agen/config.json: delegates[0].deployment: missing; expected the deployment's name");

    // Skills.
    check(&[("skills/pricing/notes.md", "x")], "skills/pricing/SKILL.md: missing; every folder under skills/ needs a SKILL.md with front matter `name: pricing`");
    check(&[("skills/pricing/SKILL.md", "Charge more.")], "skills/pricing/SKILL.md: front matter: expected the file to start with a `---` line");
    check(&[("skills/pricing/SKILL.md", "---\nname: pricing\n---\nbody")], "skills/pricing/SKILL.md: description: missing; a SKILL.md needs front matter `name: pricing` and `description: <when to use it>`");
    check(&[("skills/pricing/SKILL.md", "---\ndescription: d\n---\nbody")], "skills/pricing/SKILL.md: name: missing");
    check(&[("skills/pricing/SKILL.md", "---\nname: prices\ndescription: d\n---\n")], "skills/pricing/SKILL.md: name: is `prices` but the folder is `pricing`; expected them to be equal");

    // keen-tools.json.
    check(&[(KEEN_TOOLS_FILE, r#"{"name": "A"}"#)], "keen-tools.json: expected a JSON array of tools");
    check(&[(KEEN_TOOLS_FILE, r#"[{"name": "A", "type": "js", "entry": "tools/a.js"}]"#)], "keen-tools.json: [0].type: expected \"script\" or \"flow\", got \"js\"");
    check(&[(KEEN_TOOLS_FILE, r#"[{"type": "flow", "entry": "A-B"}]"#)], "keen-tools.json: [0].name: missing; expected the tool's name");
    check(&[("tools/a.js", ""), (KEEN_TOOLS_FILE, r#"[{"name": "A", "type": "script", "entry": "tools/a.js"}, {"name": "A", "type": "script", "entry": "tools/a.js"}]"#)], "keen-tools.json: [1].name: duplicate tool name \"A\"; names must be unique");
    check(&[("tools/a.js", ""), (KEEN_TOOLS_FILE, r#"[{"name": "A", "type": "script", "entry": "tools/a.js", "attempts": "5"}]"#)], "keen-tools.json: [0].attempts: expected a whole number >= 0");
    check(&[(KEEN_TOOLS_FILE, r#"[{"name": "A", "type": "flow", "entry": "NextToolCall"}]"#)], "keen-tools.json: [0].entry: flow entry \"NextToolCall\" must be <Controller>-<StartNode>");
    check(&[("flows/Next.json", r#"{"nodes": "#), (KEEN_TOOLS_FILE, r#"[{"name": "A", "type": "flow", "entry": "Next-ToolCall"}]"#)], "keen-tools.json: [0].entry: flows/Next.json: invalid JSON at line 1");
    check(&[(KEEN_TOOLS_FILE, r#"[{"name": "A", "type": "flow", "entry": "Next-ToolCall", "retries": 1}]"#)], "keen-tools.json: [0].retries: unknown field; expected name, type, entry, attempts or description");
}

#[test]
fn a_missing_or_non_folder_bundle_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Bundle::load(&tmp.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope: not a bundle folder"), "{err}");
}

#[test]
fn keen_entry_rules_follow_the_spec() {
    let check = |entry: &str, ok: bool| {
        assert_eq!(validate_keen_script_entry(entry).is_ok(), ok, "{entry}")
    };
    check("tools/a.js", true);
    check("tools/sub/a.js", true);
    check("", false);
    check("a.js", false);
    check("/tools/a.js", false);
    check("tools/../x.js", false);
    check("tools/..x.js", false); // the spec refuses any `..`
    assert_eq!(
        split_flow_entry("Next-Tool-Call"),
        Ok(("Next", "Tool-Call"))
    );
    assert!(split_flow_entry("-ToolCall").is_err());
    assert!(split_flow_entry("Next-").is_err());
    assert!(split_flow_entry("../x-y").is_err());
}

#[test]
fn model_refs_parse_and_print() {
    let m = ModelRef::parse("openai/gpt-4.1-mini").unwrap();
    assert_eq!(
        m,
        ModelRef {
            provider: Provider::OpenAi,
            model: "gpt-4.1-mini".into()
        }
    );
    assert_eq!(m.to_string(), "openai/gpt-4.1-mini");
    assert_eq!(
        ModelRef::parse("Anthropic/claude").unwrap().provider,
        Provider::Anthropic
    );
    assert!(ModelRef::parse("gpt-4").is_err());
}

// ---- archive ----

fn write_files(root: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
#[cfg(unix)]
fn pack_is_deterministic_skips_build_folders_and_round_trips() {
    use std::os::unix::fs::PermissionsExt;
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let files = [
        ("x-agen/agent.md", AGENT_MD),
        ("mcp.json", "{}"),
        ("server.py", "print()"),
        ("skills/s/SKILL.md", "---\nname: s\ndescription: d\n---\n"),
        (".git/HEAD", "ref"),
        ("node_modules/m/index.js", "m"),
        ("sub/target/debug/big", "b"),
        ("sub/__pycache__/x.pyc", "p"),
        (".venv/bin/python", "p"),
    ];
    // Same files written in different orders give the same bytes.
    write_files(a.path(), &files);
    let mut reversed = files;
    reversed.reverse();
    write_files(b.path(), &reversed);
    for root in [a.path(), b.path()] {
        std::fs::set_permissions(
            root.join("server.py"),
            std::fs::Permissions::from_mode(0o750),
        )
        .unwrap();
        std::os::unix::fs::symlink("../../server.py", root.join("skills/s/link.py")).unwrap();
    }
    let bytes = pack(a.path()).unwrap();
    assert_eq!(bytes, pack(b.path()).unwrap());
    assert_eq!(digest(&bytes), digest(&pack(b.path()).unwrap()));
    assert!(digest(&bytes).starts_with("sha256:") && digest(&bytes).len() == 7 + 64);

    let paths: Vec<String> = decode(&bytes)
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(
        paths,
        vec![
            "mcp.json",
            "server.py",
            "skills/s/SKILL.md",
            "skills/s/link.py",
            "x-agen/agent.md"
        ]
    );

    let out = tempfile::tempdir().unwrap();
    let into = out.path().join("cache/sha256-abc");
    unpack_verified(&bytes, &digest(&bytes), &into).unwrap();
    assert_eq!(
        std::fs::read_to_string(into.join("x-agen/agent.md")).unwrap(),
        AGENT_MD
    );
    assert_eq!(mode(&into.join("server.py")), 0o755);
    assert_eq!(mode(&into.join("mcp.json")), 0o644);
    assert_eq!(
        std::fs::read_link(into.join("skills/s/link.py")).unwrap(),
        Path::new("../../server.py")
    );
    // The unpacked folder packs to the same bytes, and nothing temporary is left beside it.
    assert_eq!(pack(&into).unwrap(), bytes);
    let siblings: Vec<_> = std::fs::read_dir(out.path().join("cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(siblings, vec![std::ffi::OsString::from("sha256-abc")]);
    // And it loads as a bundle.
    Bundle::load(&into).unwrap();
}

#[test]
#[rustfmt::skip] // one unsafe archive per line reads as a table
fn unpack_refuses_unsafe_or_corrupt_archives() {
    let entry = |path: &str, kind: EntryKind, data: &str| ArchiveEntry { path: path.into(), kind, data: data.as_bytes().to_vec() };
    let check = |entries: Vec<ArchiveEntry>, expected: &str| {
        let bytes = encode(&entries).unwrap();
        let out = tempfile::tempdir().unwrap();
        let into = out.path().join("b");
        let err = unpack(&bytes, &into).unwrap_err().to_string();
        assert!(err.contains(expected), "expected {expected:?}, got {err}");
        assert!(!into.exists(), "nothing may be left at the destination");
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "no temp folder left");
    };
    check(vec![entry("/etc/passwd", EntryKind::File, "x")], "bundle archive: absolute path `/etc/passwd` refused");
    check(vec![entry("../x", EntryKind::File, "x")], "bundle archive: path `../x` refused");
    check(vec![entry("a/../../x", EntryKind::File, "x")], "path `a/../../x` refused");
    check(vec![entry("a//x", EntryKind::File, "x")], "path `a//x` refused");
    check(vec![entry("a\\x", EntryKind::File, "x")], "bad path");
    check(vec![entry("a", EntryKind::File, "x"), entry("a", EntryKind::File, "y")], "path `a` appears twice");
    check(vec![entry("l", EntryKind::Symlink, "/etc")], "symlink l -> /etc points outside the bundle");
    check(vec![entry("d/l", EntryKind::Symlink, "../../etc")], "symlink d/l -> ../../etc points outside the bundle");
    check(vec![entry("l", EntryKind::Symlink, "sub"), entry("l/x", EntryKind::File, "x")], "path `l/x` is beneath the file or symlink `l`");

    let out = tempfile::tempdir().unwrap();
    let fail = |bytes: &[u8], expected: &str| {
        let err = unpack(bytes, &out.path().join("b")).unwrap_err().to_string();
        assert!(err.contains(expected), "expected {expected:?}, got {err}");
    };
    fail(b"PK\x03\x04 a zip", "not an agen bundle archive");
    let good = encode(&[entry("a", EntryKind::File, "hello")]).unwrap();
    fail(&good[..good.len() - 2], "corrupt archive: truncated data of `a`");
    let mut trailing = good.clone();
    trailing.push(0);
    fail(&trailing, "corrupt archive: trailing bytes");
    fail(&vec![0u8; MAX_BUNDLE_BYTES + 1], "the archive is larger than 64 MiB");
    let err = unpack_verified(&good, "sha256:00", &out.path().join("b")).unwrap_err().to_string();
    assert!(err.contains("digest mismatch: expected sha256:00"), "{err}");

    // An existing destination is never overwritten.
    std::fs::create_dir(out.path().join("exists")).unwrap();
    let err = unpack(&good, &out.path().join("exists")).unwrap_err().to_string();
    assert!(err.contains("it already exists"), "{err}");
}

#[test]
#[cfg(unix)]
fn pack_refuses_symlinks_leaving_the_bundle_and_oversize_bundles() {
    let tmp = tempfile::tempdir().unwrap();
    write_files(tmp.path(), &[("x-agen/agent.md", AGENT_MD)]);
    std::os::unix::fs::symlink("/etc/hostname", tmp.path().join("host")).unwrap();
    let err = pack(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("symlink host -> /etc/hostname points outside the bundle; copy the file into the bundle instead"), "{err}");

    let big = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(big.path().join("data.bin")).unwrap();
    f.set_len(MAX_BUNDLE_BYTES as u64 + 1).unwrap();
    let err = pack(big.path()).unwrap_err().to_string();
    assert!(
        err.contains("the bundle (at data.bin) is larger than 64 MiB"),
        "{err}"
    );
}

#[test]
fn secrets_resolve_from_their_sources_and_fill_the_places_they_are_used() {
    let b = ok(&[
        (
            MCP_FILE,
            r#"{"mcpServers": {"crm": {"url": "https://crm.example/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}},
                                      "sql": {"command": "agen", "args": ["$NOT_SUBSTITUTED"], "env": {"DATABASE_URL": "${DB}", "MODE": "ro"}}}}"#,
        ),
        (AGENT_FILE, "---\napiKey: ${DB}-${CRM_TOKEN}\n---\n"),
        (
            SECRETS_FILE,
            r#"{"CRM_TOKEN": {"source": "platform"}, "DB": {"source": "env", "var": "HOST_DB"}}"#,
        ),
    ]);
    let env = |var: &str| (var == "HOST_DB").then(|| "postgres://x".to_string());
    let platform = |name: &str| (name == "CRM_TOKEN").then(|| "t0k".to_string());
    let values = b.secret_values(env, platform).unwrap();
    assert_eq!(
        values,
        [
            ("CRM_TOKEN".to_string(), "t0k".to_string()),
            ("DB".to_string(), "postgres://x".to_string())
        ]
        .into()
    );

    let mcp = b.mcp_with_secrets(&values).unwrap();
    assert_eq!(
        mcp.servers["crm"],
        ServerSpec::Url {
            url: "https://crm.example/mcp".into(),
            headers: [("Authorization".to_string(), "Bearer t0k".to_string())].into()
        }
    );
    assert_eq!(
        mcp.servers["sql"],
        ServerSpec::Command {
            command: "agen".into(),
            args: vec!["$NOT_SUBSTITUTED".into()],
            env: [
                ("DATABASE_URL".to_string(), "postgres://x".to_string()),
                ("MODE".to_string(), "ro".to_string())
            ]
            .into(),
        }
    );
    assert_eq!(
        b.api_key_with_secrets(&values).unwrap().as_deref(),
        Some("postgres://x-t0k")
    );

    let err = b.secret_values(|_| None, platform).unwrap_err().to_string();
    assert_eq!(
        err,
        "secret DB used in mcp.json mcpServers.sql.env.DATABASE_URL has no value: environment variable HOST_DB is not set (x-agen/secrets.json declares source env)"
    );
    let err = b.secret_values(env, |_| None).unwrap_err().to_string();
    assert!(err.starts_with("secret CRM_TOKEN used in mcp.json mcpServers.crm.headers.Authorization has no value: it is not in the Hub's secret store"), "{err}");
    let err = b
        .mcp_with_secrets(&BTreeMap::new())
        .unwrap_err()
        .to_string();
    assert_eq!(err, "secret CRM_TOKEN used in mcp.json mcpServers.crm.headers.Authorization has no value: no value was supplied");
}

#[test]
fn remote_a2a_delegates_parse_and_their_mistakes_name_the_delegate_and_the_fix() {
    let b = ok(&[
        (
            CONFIG_FILE,
            r#"{"delegates": ["local", {"name": "pricing", "a2a": "https://agents.example.com/.well-known/agent-card.json", "description": "prices", "token": "${PRICING_TOKEN}"},
                {"a2a": "http://127.0.0.1:8080/a2a/team/researcher/.well-known/agent-card.json"}]}"#,
        ),
        (SECRETS_FILE, r#"{"PRICING_TOKEN": {"source": "platform"}}"#),
    ]);
    assert_eq!(
        b.config.delegates[1],
        Delegate {
            deployment: "pricing".into(),
            namespace: None,
            description: Some("prices".into()),
            bundle: None,
            a2a: Some(RemoteAgent {
                card_url: "https://agents.example.com/.well-known/agent-card.json".into(),
                token: Some("${PRICING_TOKEN}".into()),
            }),
        }
    );
    assert_eq!(b.config.delegates[2].deployment, "researcher");
    assert!(!b.config.delegates[0].is_remote() && b.config.delegates[2].is_remote());
    let values = BTreeMap::from([("PRICING_TOKEN".to_string(), "t0k".to_string())]);
    assert_eq!(
        delegate_token_with_secrets(&b.config.delegates[1], &values)
            .ok()
            .flatten(),
        Some("t0k".to_string())
    );
    assert_eq!(
        referenced_secrets(&b),
        vec![(
            "PRICING_TOKEN".to_string(),
            "x-agen/config.json delegates[1].token (delegate pricing)".to_string()
        )]
    );

    let remote = |d: &str| format!(r#"{{"delegates": [{d}]}}"#);
    let c = |d: &str, expected: &str| check(&[(CONFIG_FILE, &remote(d))], expected);
    c(
        r#"{"name": "p", "a2a": "https://h/.well-known/agent-card.json", "token": "${P_TOKEN}"}"#,
        "x-agen/secrets.json: secret P_TOKEN used in x-agen/config.json delegates[0].token (delegate p) is not declared; add \"P_TOKEN\": {\"source\": \"platform\"}",
    );
    c(
        r#"{"name": "p", "a2a": "http://agents.example.com/.well-known/agent-card.json"}"#,
        "x-agen/config.json: delegates[0].a2a: delegate `p`: expected the https:// URL of its agent card",
    );
    c(
        r#"{"name": "p", "a2a": "http://agents.example.com/card.json"}"#,
        "plain http would send the token in the clear to agents.example.com",
    );
    c(
        r#"{"name": "p", "a2a": "ftp://h/card"}"#,
        "x-agen/config.json: delegates[0].a2a: delegate `p`: expected the https:// URL of its agent card, e.g. https://agents.example.com/.well-known/agent-card.json (http:// is accepted only for 127.0.0.1 and localhost), got scheme `ftp`",
    );
    c(
        r#"{"name": "p", "a2a": "https://user:pw@h/card"}"#,
        "got a URL with credentials in it",
    );
    c(
        r#"{"name": "p", "a2a": "https://h/card", "token": "s3cr3t"}"#,
        "x-agen/config.json: delegates[0].token: delegate `p`: expected a secret reference such as \"${P_TOKEN}\" (declared in x-agen/secrets.json), not the token itself",
    );
    c(
        r#"{"a2a": "https://h/card.json"}"#,
        "x-agen/config.json: delegates[0].name: missing; expected the name the agent calls this remote agent by",
    );
    c(
        r#"{"name": "p", "a2a": "https://h/card", "namespace": "x"}"#,
        "x-agen/config.json: delegates[0].namespace: unknown key; expected one of: name, a2a, description, token",
    );
    c(
        r#"{"name": "p", "a2a": 5}"#,
        "x-agen/config.json: delegates[0].a2a: expected a string",
    );
    for good in ["http://localhost:9/c", "http://[::1]:9/c", "HTTPS://H/c"] {
        assert_eq!(check_card_url(good), Ok(()), "{good}");
    }
}

#[test]
fn a_secret_reference_in_args_and_a_secret_header_over_plain_http_are_refused() {
    check(
        &[(
            MCP_FILE,
            r#"{"mcpServers": {"crm": {"command": "crm-server", "args": ["--token", "${CRM_TOKEN}"]}}}"#,
        )],
        "mcp.json: mcpServers.crm.args[1]: holds `${CRM_TOKEN}`, which is not replaced in args",
    );
    check(
        &[(
            MCP_FILE,
            r#"{"mcpServers": {"crm": {"command": "crm-server", "args": ["x=${CRM_TOKEN}"]}}}"#,
        )],
        r#"pass it in "env" instead, e.g. "env": {"CRM_TOKEN": "${CRM_TOKEN}"}"#,
    );
    check(
        &[
            (
                MCP_FILE,
                r#"{"mcpServers": {"crm": {"url": "http://crm.example/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}}}"#,
            ),
            (SECRETS_FILE, r#"{"CRM_TOKEN": {"source": "platform"}}"#),
        ],
        "mcp.json: mcpServers.crm.url: `http://crm.example/mcp` is plain http to crm.example, which would send the secret in header Authorization in the clear; use an https:// URL",
    );
    // Plain http is fine to this machine, or with no secret in the headers; `$NAME` in args
    // (a shell variable) is an ordinary argument.
    for mcp in [
        r#"{"mcpServers": {"crm": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}}}"#,
        r#"{"mcpServers": {"crm": {"url": "http://[::1]:9000/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}}}"#,
        r#"{"mcpServers": {"crm": {"url": "http://crm.example/mcp", "headers": {"X-Team": "blue"}}, "sh": {"command": "sh", "args": ["-c", "echo $HOME"], "env": {"K": "${CRM_TOKEN}"}}}}"#,
    ] {
        ok(&[
            (MCP_FILE, mcp),
            (SECRETS_FILE, r#"{"CRM_TOKEN": {"source": "platform"}}"#),
        ]);
    }
}

#[test]
fn servers_fetched_at_start_without_a_version_are_named() {
    let b = ok(&[(
        MCP_FILE,
        r#"{"mcpServers": {
            "a": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "./data"]},
            "b": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem@2025.8.21", "./data"]},
            "c": {"command": "uvx", "args": ["mcp-server-fetch"]},
            "d": {"command": "uvx", "args": ["mcp-server-fetch==2026.8.18"]},
            "e": {"command": "/usr/bin/npx", "args": ["--yes", "left-pad"]},
            "f": {"command": "uvx", "args": ["--from", "mcp-server-git@1.0", "mcp-server-git"]},
            "g": {"command": "node", "args": ["server.js"]}}}"#,
    )]);
    let advice = unpinned_servers(&b.mcp);
    assert_eq!(advice.len(), 3, "{advice:?}");
    assert!(advice[0].starts_with("mcp.json: mcpServers.a: `npx @modelcontextprotocol/server-filesystem` fetches whatever release is newest at each start; pin a version (e.g. `@modelcontextprotocol/server-filesystem@1.2.3`)"), "{advice:?}");
    assert!(
        advice[1].starts_with("mcp.json: mcpServers.c: `uvx mcp-server-fetch`"),
        "{advice:?}"
    );
    assert!(
        advice[2].starts_with("mcp.json: mcpServers.e: `npx left-pad`"),
        "{advice:?}"
    );
}

#[test]
fn keen_tools_that_cannot_run_as_registered_still_load() {
    // The Keen guide: an invalid script path or a missing flow is answered at run time with
    // the general recall; the Keen engine's load lists them as warnings for deploy.
    for registry in [
        r#"[{"name": "A", "type": "script", "entry": "scripts/a.js"}]"#,
        r#"[{"name": "A", "type": "script", "entry": "tools/../a.js"}]"#,
        r#"[{"name": "A", "type": "script", "entry": "tools/a.js"}]"#,
        r#"[{"name": "A", "type": "flow", "entry": "Next-ToolCall"}]"#,
    ] {
        let b = ok(&[(KEEN_TOOLS_FILE, registry)]);
        assert_eq!(b.keen_tools.len(), 1, "{registry}");
    }
}
