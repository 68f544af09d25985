//! `agen init DIR --template basic|coder|ci-fixer`: writes a complete, deployable bundle with a
//! README, its agent named after DIR (`--name` to choose); `agen init --list` lists the
//! templates. Templates declare no secret they do not use.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Arguments of `agen init`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The folder to create (must not exist or be empty)
    #[arg(required_unless_present = "list")]
    pub dir: Option<PathBuf>,
    /// basic, coder or ci-fixer
    #[arg(long, default_value = "basic")]
    pub template: String,
    /// The workspace root of coder and ci-fixer, relative to the bundle (or absolute)
    #[arg(long, default_value = "workspace")]
    pub root: String,
    /// The agent's name (default: DIR's folder name, lowercased, other characters as `-`)
    #[arg(long)]
    pub name: Option<String>,
    /// The model, `<provider>/<model>`
    #[arg(long, default_value = "openai/gpt-4.1-mini")]
    pub model: String,
    /// The provider endpoint (an OpenAI-compatible server: vLLM, Ollama, llama.cpp, ...)
    #[arg(long)]
    pub base_url: Option<String>,
    /// List the templates
    #[arg(long)]
    pub list: bool,
}

/// The templates, with what each makes.
pub const TEMPLATES: [(&str, &str); 3] = [
    ("basic", "a minimal agent: a system prompt and the built-in tools"),
    ("coder", "a coding agent on `agen mcp workspace`: read, list, grep, edit, write; `run` asks first; skills for making and checking a change"),
    ("ci-fixer", "reads a failing build's output, finds the cause and proposes a fix; write/edit allowed, `run` asks first"),
];

pub async fn run(args: Args) -> anyhow::Result<i32> {
    if args.list {
        for (name, what) in TEMPLATES {
            println!("{name:<9} {what}");
        }
        return Ok(0);
    }
    let Some(dir) = args.dir.clone() else {
        eprintln!("error: agen init needs DIR (or --list)");
        return Ok(2);
    };
    let name = match &args.name {
        Some(n) if valid_name(n) => n.clone(),
        Some(n) => {
            eprintln!("error: --name {n}: not a valid agent name; expected up to 63 lowercase letters, digits, `-`, `_` or `.`, starting with a letter or digit");
            return Ok(2);
        }
        None => name_for(&dir, &args.template),
    };
    let Some(files) = files(&args, &name) else {
        let names: Vec<&str> = TEMPLATES.iter().map(|(n, _)| *n).collect();
        eprintln!(
            "error: --template {}: unknown template; expected one of {}",
            args.template,
            names.join(", ")
        );
        return Ok(2);
    };
    if dir.exists()
        && std::fs::read_dir(&dir)
            .with_context(|| format!("while reading {}", dir.display()))?
            .next()
            .is_some()
    {
        eprintln!(
            "error: {}: the folder is not empty; pick a new folder for the bundle",
            dir.display()
        );
        return Ok(2);
    }
    for (rel, text) in &files {
        write(&dir, rel, text)?;
    }
    println!("{}", dir.display());
    eprintln!(
        "wrote a {} bundle for agent {name} to {}; see its README.md, then `agen deploy {}` (deployment {name})",
        args.template,
        dir.display(),
        dir.display()
    );
    Ok(0)
}

/// Whether `n` is a name deployments accept (the Hub's rule): 1 to 63 lowercase letters,
/// digits, `-`, `_` or `.`, starting with a letter or digit.
fn valid_name(n: &str) -> bool {
    n.len() <= 63
        && n.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
}

/// The agent name `agen init DIR` gives: DIR's folder name lowercased, every other character
/// as `-`, trimmed to a valid name; the template's name when nothing is left.
fn name_for(dir: &Path, template: &str) -> String {
    let base = std::path::absolute(dir)
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let mut n: String = base
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    n = n
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    n.truncate(63);
    if valid_name(&n) {
        n
    } else {
        template.to_string()
    }
}

fn write(dir: &Path, rel: &str, text: &str) -> anyhow::Result<()> {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("while creating {}", parent.display()))?;
    }
    std::fs::write(&p, text).with_context(|| format!("while writing {}", p.display()))
}

fn agent_md(args: &Args, name: &str, prompt: &str) -> String {
    let base = args
        .base_url
        .as_deref()
        .map(|u| format!("baseUrl: {u}\n"))
        .unwrap_or_default();
    format!(
        "---\nname: {name}\nmodel: {}\n{base}---\n{prompt}\n",
        args.model
    )
}

fn workspace_files(args: &Args, allow: &[&str]) -> Vec<(String, String)> {
    let mcp = serde_json::json!({"mcpServers": {"workspace": {
        "command": "agen", "args": ["mcp", "workspace", "--root", args.root]
    }}});
    let config = serde_json::json!({"permissions": {"allow": allow, "ask": ["workspace.run"]}});
    let mut out = vec![
        ("mcp.json".to_string(), pretty(&mcp)),
        ("x-agen/config.json".to_string(), pretty(&config)),
    ];
    if !Path::new(&args.root).is_absolute() {
        out.push((
            format!("{}/README.md", args.root.trim_end_matches('/')),
            "The workspace the agent works in. Put the project here, or re-create the bundle with `agen init --root /path/to/project`.\n".into(),
        ));
    }
    out
}

fn pretty(v: &serde_json::Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(v).expect("a JSON value serialises")
    )
}

fn readme(title: &str, what: &str, args: &Args, name: &str) -> String {
    format!(
        "# {title}\n\n{what}\n\nMade by `agen init --template {}`.\n\n## Run it\n\n```sh\nagen run . \"your request\"          # standalone; asks on this terminal before `ask` tools\nagen deploy . --wait                # on a fleet: deployment `{}`\n```\n\n## Model\n\n`x-agen/agent.md` uses `{}`. For a hosted provider add `apiKey: ${{OPENAI_API_KEY}}` to the\nfront matter and declare it in `x-agen/secrets.json`: `{{\"OPENAI_API_KEY\": {{\"source\": \"platform\"}}}}`\n(then `agen secrets set OPENAI_API_KEY`), or `{{\"source\": \"env\", \"var\": \"OPENAI_API_KEY\"}}` for\n`agen run`. A local OpenAI-compatible server needs only `baseUrl`.\n",
        args.template, name, args.model
    )
}

/// The files of the template `args.template`, or `None` for an unknown one.
fn files(args: &Args, name: &str) -> Option<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    match args.template.as_str() {
        "basic" => {
            out.push((
                "x-agen/agent.md".into(),
                agent_md(
                    args,
                    name,
                    "You are a helpful assistant. Answer briefly and say when you do not know.",
                ),
            ));
            out.push(("README.md".into(), readme("basic", "A minimal agent: a system prompt and the built-in tools (`finish`, artifacts).", args, name)));
        }
        "coder" => {
            out.push(("x-agen/agent.md".into(), agent_md(args, name, "You are a careful coding agent working in a workspace (the `workspace_*` tools). Read the code before you change it, make the smallest change that does the job, and check it. `workspace_run` needs a person's approval: say why you run a command. Load the skills `make-a-change` and `check-a-change` when you start.")));
            out.extend(workspace_files(
                args,
                &[
                    "workspace.read",
                    "workspace.list",
                    "workspace.grep",
                    "workspace.edit",
                    "workspace.write",
                    "workspace.run",
                ],
            ));
            out.push(("skills/make-a-change/SKILL.md".into(), "---\nname: make-a-change\ndescription: how to make a change to the code in the workspace\n---\n1. Find the code: `workspace_grep` for names, `workspace_list` for files, `workspace_read` to read them.\n2. Change as little as you can with `workspace_edit` (exact `old_string`), or `workspace_write` for a new file.\n3. Keep the project's style; do not reformat code you did not change.\n4. Say what you changed and why, file by file.\n".into()));
            out.push(("skills/check-a-change/SKILL.md".into(), "---\nname: check-a-change\ndescription: \"how to check a change: build, tests, the diff\"\n---\n1. Read back every file you changed.\n2. Run the project's build and tests with `workspace_run` (a person approves each command): e.g. `cargo test`, `npm test`, `pytest -q`.\n3. If a check fails, read its output, fix the cause and check again.\n4. Finish with what you checked and its result.\n".into()));
            out.push(("README.md".into(), readme("coder", "A coding agent on `agen mcp workspace`: it may read, list, grep, edit and write files in the workspace; every `run` (a shell command) asks a person first. Skills: `make-a-change`, `check-a-change`.", args, name)));
        }
        "ci-fixer" => {
            out.push(("x-agen/agent.md".into(), agent_md(args, name, "You fix failing builds. The task is a failing build's output (or says where it is in the workspace). Read it, find the first real error, read the code it points to, find the cause and propose a fix: make it with `workspace_edit`, and say in your answer what failed, why, and what you changed. `workspace_run` needs a person's approval: use it only to re-run the failing step. Load the skill `read-a-build-log` first.")));
            out.extend(workspace_files(
                args,
                &[
                    "workspace.read",
                    "workspace.list",
                    "workspace.grep",
                    "workspace.edit",
                    "workspace.write",
                    "workspace.run",
                ],
            ));
            out.push(("skills/read-a-build-log/SKILL.md".into(), "---\nname: read-a-build-log\ndescription: how to find the cause in a failing build's output\n---\n1. Skip to the first error: compilers and test runners print `error`, `FAILED`, `panicked`, `Traceback` or `AssertionError`; later errors often follow from the first.\n2. Note the file and line it names and read that code with `workspace_read`.\n3. Tell a broken test from broken code: read the test's expectation before changing either.\n4. Propose the smallest fix, make it, and say how to check it (the command that failed).\n".into()));
            out.push(("README.md".into(), readme("ci-fixer", "Reads a failing build's output, finds the cause and proposes a fix. `write` and `edit` are allowed in the workspace; `run` asks a person first. Submit the build's output as the task input.", args, name)));
        }
        _ => return None,
    }
    Some(out)
}
