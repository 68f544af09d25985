//! Tidy checks over the whole source tree (rust-analyzer's convention): what `ARCHITECTURE.md`
//! states and code can check. Every `.rs` file starts with a `//!` line saying what it owns; no
//! production file grows past 800 lines before its tests; the crate arrows run one way and
//! protobuf stays at the edges that ARCHITECTURE.md names; no file cites a document outside the
//! repository; every link to a document of the repository resolves; no module of a crate
//! imports itself through others (`tidy/cycles.rs`). (That every RPC of
//! `AgenService` has a row in the authorization table is checked beside the table,
//! `hub/src/server/auth_table.rs`, which reads the RPCs from the proto descriptor.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "tidy/cycles.rs"]
mod cycles;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repo")
        .to_path_buf()
}

fn rel(root: &Path, f: &Path) -> String {
    f.strip_prefix(root).unwrap_or(f).display().to_string()
}

/// Every file of the workspace whose name ends with one of `exts`, outside build output.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name == "target" || name.starts_with('.') || name == "node_modules" {
                continue;
            }
            files(&path, exts, out);
        } else if exts.iter().any(|x| name.ends_with(x)) {
            out.push(path);
        }
    }
}

fn rust_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    files(&repo(), &[".rs"], &mut out);
    assert!(out.len() > 50, "found only {} files", out.len());
    out
}

fn read(f: &Path) -> String {
    std::fs::read_to_string(f).unwrap_or_default()
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let root = repo();
    let missing: Vec<String> = rust_files()
        .iter()
        .filter(|f| !read(f).trim_start().starts_with("//!"))
        .map(|f| rel(&root, f))
        .collect();
    assert!(
        missing.is_empty(),
        "these files do not start with a `//!` line saying what they own:\n{}",
        missing.join("\n")
    );
}

/// The most lines a production file may have before its first `#[cfg(test)]`.
const MAX_LINES: usize = 800;

/// Production files allowed over [`MAX_LINES`] for now, each with its reason. The list only
/// shrinks: an entry whose file is back under the limit must be removed.
const OVERSIZED: &[(&str, &str)] = &[];

/// A file of production code: not a test, a bench, an example or the end-to-end harness.
fn is_production(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    !(parts[0] == "tests"
        || parts[0] == "examples"
        || parts
            .iter()
            .any(|p| *p == "tests" || *p == "benches" || *p == "examples")
        || rel.ends_with("/tests.rs")
        || rel.ends_with("_tests.rs"))
}

/// Lines before the first `#[cfg(test)]` (the whole file when there is none).
fn production_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| !l.contains("#[cfg(test)]"))
        .count()
}

#[test]
fn production_files_stay_under_800_lines_before_their_tests() {
    let root = repo();
    let mut over = BTreeMap::new();
    for f in rust_files() {
        let r = rel(&root, &f);
        if is_production(&r) {
            let n = production_lines(&read(&f));
            if n > MAX_LINES {
                over.insert(r, n);
            }
        }
    }
    let allowed: BTreeMap<&str, &str> = OVERSIZED.iter().copied().collect();
    let new: Vec<String> = over
        .iter()
        .filter(|(f, _)| !allowed.contains_key(f.as_str()))
        .map(|(f, n)| format!("{f}: {n} lines"))
        .collect();
    assert!(
        new.is_empty(),
        "these files have more than {MAX_LINES} lines before their tests; split them by concern:\n{}",
        new.join("\n")
    );
    let stale: Vec<&str> = allowed
        .keys()
        .filter(|f| !over.contains_key(**f))
        .copied()
        .collect();
    assert!(
        stale.is_empty(),
        "these files are back under {MAX_LINES} lines: remove them from OVERSIZED: {stale:?}"
    );
}

#[test]
fn line_counting_stops_at_the_tests() {
    assert_eq!(production_lines("a\nb\n#[cfg(test)]\nmod tests {}\n"), 2);
    assert_eq!(production_lines("a\nb\n"), 2);
    assert!(is_production("hub/src/core/mod.rs"));
    assert!(!is_production("hub/src/core/tests.rs"));
    assert!(!is_production("hub/tests/store_crash.rs"));
    assert!(!is_production("hub/benches/store.rs"));
    assert!(!is_production("tests/e2e/main.rs"));
    assert!(!is_production("sdk/examples/x.rs"));
}

/// The workspace crates by name, each with the workspace crates it depends on (normal and
/// target-specific dependencies) and its other dependencies.
struct Crate {
    dir: String,
    internal: BTreeSet<String>,
    external: BTreeSet<String>,
}

fn workspace() -> BTreeMap<String, Crate> {
    let root = repo();
    let top: toml::Table = toml::from_str(&read(&root.join("Cargo.toml"))).expect("Cargo.toml");
    let members = top["workspace"]["members"]
        .as_array()
        .expect("workspace members");
    let mut out = BTreeMap::new();
    for m in members {
        let dir = m.as_str().expect("member path").to_string();
        let manifest: toml::Table =
            toml::from_str(&read(&root.join(&dir).join("Cargo.toml"))).expect("member manifest");
        let name = manifest["package"]["name"]
            .as_str()
            .expect("package name")
            .to_string();
        let mut deps: Vec<String> = Vec::new();
        if let Some(t) = manifest.get("dependencies").and_then(|d| d.as_table()) {
            deps.extend(t.keys().cloned());
        }
        if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
            for t in targets.values() {
                if let Some(d) = t.get("dependencies").and_then(|d| d.as_table()) {
                    deps.extend(d.keys().cloned());
                }
            }
        }
        out.insert(
            name,
            Crate {
                dir,
                internal: BTreeSet::new(),
                external: deps.into_iter().collect(),
            },
        );
    }
    let names: BTreeSet<String> = out.keys().cloned().collect();
    for c in out.values_mut() {
        let (internal, external): (BTreeSet<String>, BTreeSet<String>) =
            c.external.iter().cloned().partition(|d| names.contains(d));
        c.internal = internal;
        c.external = external;
    }
    out
}

/// The layers of ARCHITECTURE.md, bottom first: a crate depends only on crates of lower layers.
const LAYERS: &[&[&str]] = &[
    &["agen-shared", "agen-fake-model"],
    &["agen-contract"],
    &["agen-proto", "agen-net", "agen-harness", "agen-mcp-servers"],
    &["agen-hub", "agen-nest", "agen"],
    &["agen-cli"],
    &["agen-python", "agen-tests"],
];

fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&name))
}

/// Every crate a crate reaches through workspace crates, and every outside crate they name.
fn reach(ws: &BTreeMap<String, Crate>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(n) = todo.pop() {
        if let Some(c) = ws.get(&n) {
            for d in c.internal.iter().chain(c.external.iter()) {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
    }
    seen
}

#[test]
fn crate_arrows_run_one_way() {
    let ws = workspace();
    let mut problems = Vec::new();
    for (name, c) in &ws {
        let Some(mine) = layer_of(name) else {
            problems.push(format!(
                "{name} ({}) has no layer in tidy.rs LAYERS: place it in ARCHITECTURE.md's map and there",
                c.dir
            ));
            continue;
        };
        for d in &c.internal {
            match layer_of(d) {
                Some(theirs) if theirs < mine => {}
                _ => problems.push(format!(
                    "{name} depends on {d}, which is not below it (ARCHITECTURE.md: arrows run down)"
                )),
            }
        }
    }
    // What ARCHITECTURE.md states crate by crate.
    let never: &[(&str, &[&str], &str)] = &[
        (
            "agen-shared",
            &["tokio", "tonic", "prost", "agen-proto"],
            "shared has no network IO, no async runtime and knows no gRPC",
        ),
        (
            "agen-harness",
            &["tonic", "prost", "agen-proto", "agen-hub", "agen-nest"],
            "the harness knows no gRPC, no Hub and no Nest",
        ),
        (
            "agen",
            &["tonic", "agen-hub", "agen-nest", "agen-proto"],
            "the SDK depends on neither agen-hub, agen-nest nor tonic",
        ),
        (
            "agen-hub",
            &["agen-nest", "agen-harness"],
            "the Hub never runs agents",
        ),
        (
            "agen-nest",
            &["agen-hub"],
            "the Nest never opens the Hub's store",
        ),
    ];
    for (name, forbidden, why) in never {
        let reached = reach(&ws, name);
        for f in *forbidden {
            if reached.contains(*f) {
                problems.push(format!("{name} reaches {f}: {why}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The `.rs` files under `dir` (repo-relative) with their repo-relative paths.
fn sources_under(dir: &str) -> Vec<(String, String)> {
    let root = repo();
    let mut out = Vec::new();
    files(&root.join(dir), &[".rs"], &mut out);
    out.into_iter()
        .map(|f| (rel(&root, &f), read(&f)))
        .collect()
}

#[test]
fn protobuf_stays_at_the_edges() {
    let mut problems = Vec::new();
    // Hub: "only `server/` knows protobuf"; the rest works on the domain types of model.rs.
    for (f, text) in sources_under("hub/src") {
        if f.starts_with("hub/src/server/") {
            continue;
        }
        if text.contains("agen_proto::v1") || text.contains("v1 as pb") {
            problems.push(format!("{f} uses the gRPC types: only hub/src/server/ may"));
        }
    }
    // Nest: "only `hub_link` and `hub_client/` know protobuf".
    for (f, text) in sources_under("nest/src") {
        if f == "nest/src/hub_link.rs" || f.starts_with("nest/src/hub_client/") {
            continue;
        }
        if text.contains("agen_proto") {
            problems.push(format!(
                "{f} uses agen_proto: only nest/src/hub_link.rs and nest/src/hub_client/ may"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn module_arrows_run_one_way() {
    let mut problems = Vec::new();
    let mut check = |dir: &str, skip: &dyn Fn(&str) -> bool, needles: &[&str], rule: &str| {
        for (f, text) in sources_under(dir) {
            if skip(&f) {
                continue;
            }
            for n in needles {
                if text.contains(n) {
                    problems.push(format!("{f} mentions `{n}`: {rule}"));
                }
            }
        }
    };
    // Hub: server/ → core/ → scheduler, store, nodes, model; nothing below core imports it.
    for below in ["hub/src/scheduler", "hub/src/store"] {
        check(
            below,
            &|_| false,
            &["crate::core", "crate::server"],
            "nothing below hub core imports it",
        );
    }
    check(
        "hub/src",
        &|f| f != "hub/src/nodes.rs" && f != "hub/src/model.rs",
        &["crate::core", "crate::server"],
        "nothing below hub core imports it",
    );
    check(
        "hub/src",
        &|f| f.starts_with("hub/src/server/") || f == "hub/src/lib.rs",
        &["crate::server", "super::server"],
        "only the Hub's lib.rs wires the gRPC edge; nothing else imports it",
    );
    // The scheduler decides; it does no IO.
    check(
        "hub/src/scheduler",
        &|_| false,
        &[
            "std::fs",
            "std::net",
            "std::process",
            "tokio::",
            "crate::store",
        ],
        "the scheduler is pure placement decisions: no IO",
    );
    // Nest: daemon → hub_link → …; nothing below hub_link imports it.
    check(
        "nest/src",
        &|f| f == "nest/src/hub_link.rs" || f == "nest/src/daemon.rs" || f == "nest/src/lib.rs",
        &["crate::hub_link", "crate::daemon"],
        "nothing below the Nest's hub_link imports it (or the daemon)",
    );
    // Harness run/: the loops use state/turn/tools/replay; nothing imports a loop.
    check(
        "nest/harness/src/run",
        &|f| {
            f.ends_with("/run/mod.rs")
                || f.ends_with("/run/native.rs")
                || f.ends_with("/run/keen_loop.rs")
        },
        &["native::", "keen_loop::"],
        "nothing in the harness's run/ imports a loop (native.rs, keen_loop.rs)",
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Text files of the repository that may cite other files.
fn text_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    files(
        &repo(),
        &[
            ".rs", ".md", ".toml", ".proto", ".sh", ".py", ".json", ".txt", ".yml", ".yaml",
            ".service", ".js", ".env",
        ],
        &mut out,
    );
    out
}

#[test]
fn no_file_cites_a_document_outside_the_repository() {
    let root = repo();
    // Spelled in pieces so that this file does not cite them itself.
    let design = ["DESIGN", ".md"].concat();
    let outside: Vec<String> = vec![
        design.clone(),
        ["/work", "/shared"].concat(),
        ["/work", "/wt"].concat(),
        ["keen-tooling", ".txt"].concat(),
        ["agen-giving-agents-tools", ".txt"].concat(),
        ["/tmp", "/iss"].concat(),
    ];
    let has_design = root.join(&design).exists() || root.join("docs").join(&design).exists();
    let mut problems = Vec::new();
    for f in text_files() {
        let text = read(&f);
        for o in &outside {
            if *o == design && has_design {
                continue;
            }
            if text.contains(o.as_str()) {
                problems.push(format!(
                    "{} cites `{o}`, which is not in the repository: write what it says into docs/ and link that",
                    rel(&root, &f)
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(md: &str) -> BTreeSet<String> {
    md.lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_link_to_a_document_of_the_repository_resolves() {
    let root = repo();
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").expect("link pattern");
    let mention = regex::Regex::new(r"\bdocs/[A-Za-z0-9_-]+\.md").expect("mention pattern");
    let mut problems = Vec::new();
    let mut checked = 0;
    let code_span = regex::Regex::new(r"`[^`]*`").expect("code span pattern");
    for f in text_files() {
        let text = read(&f);
        let here = f.parent().unwrap_or(&root);
        let markdown = f.extension().is_some_and(|e| e == "md");
        if markdown {
            // Links outside code: fenced blocks and code spans hold no links.
            let mut fenced = false;
            let mut prose = String::new();
            for line in text.lines() {
                if line.trim_start().starts_with("```") {
                    fenced = !fenced;
                } else if !fenced {
                    prose.push_str(&code_span.replace_all(line, "``"));
                    prose.push('\n');
                }
            }
            for c in link.captures_iter(&prose) {
                let target = &c[1];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target, None),
                };
                let file = if path.is_empty() {
                    f.clone()
                } else {
                    here.join(path)
                };
                checked += 1;
                if !file.exists() {
                    problems.push(format!("{}: link `{target}` leads nowhere", rel(&root, &f)));
                    continue;
                }
                if let Some(a) = anchor {
                    if file.is_file() && !anchors(&read(&file)).contains(a) {
                        problems.push(format!(
                            "{}: link `{target}`: no heading `#{a}` there",
                            rel(&root, &f)
                        ));
                    }
                }
            }
        }
        // Where prose names a page of docs/: all of a Markdown file, the comments of code.
        let prose: String = if markdown {
            text.clone()
        } else {
            text.lines()
                .filter(|l| l.trim_start().starts_with("//") || l.trim_start().starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n")
        };
        for m in mention.find_iter(&prose) {
            checked += 1;
            if !root.join(m.as_str()).exists() {
                problems.push(format!(
                    "{} names `{}`, which does not exist",
                    rel(&root, &f),
                    m.as_str()
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "found only {checked} links: is the walk broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(slug(" Limits a bundle sets"), "limits-a-bundle-sets");
    assert_eq!(slug("Decided, not built yet"), "decided-not-built-yet");
    assert_eq!(slug("`ListTasks` page"), "listtasks-page");
}

/// What the protocol version covers: the gRPC contract (`proto/`) and the Nest⇄instance socket
/// contract (`shared/contract/src/run/`, its tests and fixtures aside), each as a SHA-256 over its files
/// in name order with comment and blank lines left out (a changed doc comment is not a protocol
/// change; a changed field is).
fn contract_digests(root: &Path) -> (String, String) {
    use sha2::{Digest, Sha256};
    let digest = |dir: &str, ext: &str, skip: &[&str]| {
        let mut found = Vec::new();
        files(&root.join(dir), &[ext], &mut found);
        found.retain(|f| !skip.iter().any(|s| rel(root, f).contains(s)));
        found.sort();
        let mut h = Sha256::new();
        for f in &found {
            h.update(rel(root, f).as_bytes());
            h.update([0]);
            for line in read(f).lines().map(str::trim) {
                if line.is_empty() || line.starts_with("//") {
                    continue;
                }
                h.update(line.as_bytes());
                h.update([b'\n']);
            }
        }
        assert!(!found.is_empty(), "no {ext} files under {dir}");
        format!("{:x}", h.finalize())
    };
    (
        digest("proto", ".proto", &[]),
        digest("shared/contract/src/run", ".rs", &["tests.rs", "fixtures"]),
    )
}

/// `proto/CONTRACT` records the protocol version and the digests of what it covers. A change to
/// either contract without a protocol-minor bump fails here; after the bump,
/// `AGEN_TIDY_RECORD=1 cargo test -p agen-tests --test tidy` records the new digests.
#[test]
fn a_changed_contract_bumps_the_protocol_minor() {
    let root = repo();
    let file = root.join("proto/CONTRACT");
    let current = agen_shared::version::Protocol::CURRENT.to_string();
    let (proto, socket) = contract_digests(&root);
    let text = read(&file);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let (recorded, rec_proto, rec_socket) = (field("protocol"), field("proto"), field("socket"));
    let same = rec_proto == proto && rec_socket == socket;
    if same && recorded == current {
        return;
    }
    if std::env::var_os("AGEN_TIDY_RECORD").is_some() && recorded != current {
        let body = format!(
            "# The protocol version and the digests of the contracts it covers, checked by\n\
             # tests/tidy.rs: when proto/ or the Nest-instance socket contract (shared/contract/src/run/)\n\
             # changes, bump the minor of Protocol::CURRENT (shared/src/version.rs), then run\n\
             # AGEN_TIDY_RECORD=1 cargo test -p agen-tests --test tidy to record the new digests.\n\
             protocol {current}\nproto {proto}\nsocket {socket}\n"
        );
        std::fs::write(&file, body).expect("write proto/CONTRACT");
        return;
    }
    assert!(
        recorded != current,
        "proto/ or the socket contract (shared/contract/src/run/) changed since protocol {recorded} was \
         recorded in proto/CONTRACT: bump the minor of Protocol::CURRENT in \
         shared/src/version.rs (a Hub accepts Nests of its minor and the one before), then run \
         AGEN_TIDY_RECORD=1 cargo test -p agen-tests --test tidy"
    );
    panic!(
        "the protocol is {current} but proto/CONTRACT records {recorded}: run \
         AGEN_TIDY_RECORD=1 cargo test -p agen-tests --test tidy to record the digests of {current}"
    );
}
