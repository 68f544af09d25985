//! Tidy: no module of a crate imports itself through others (ARCHITECTURE.md, "arrows run one
//! way"). The graph is one node per production `.rs` file; an arrow is a `crate::…` or
//! `super::…` path (in a `use` or written out) resolved to the file of the deepest module it
//! names. A module's arrows to its own submodules are not counted (a parent owns its children;
//! children reach up with `super::`), nor are tests (`#[cfg(test)]` and on, `tests.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::LazyLock;

/// A module path below the crate root (`["store", "event_log"]`).
type Module = Vec<String>;

/// The production files of the crate whose sources are `src` (repo-relative), by module.
fn module_files(root: &Path, src: &str) -> BTreeMap<Module, String> {
    let mut found = Vec::new();
    super::files(&root.join(src), &[".rs"], &mut found);
    let has_lib = root.join(src).join("lib.rs").exists();
    let mut out = BTreeMap::new();
    for f in found {
        let r = super::rel(root, &f);
        let inner = r[src.len()..]
            .trim_start_matches('/')
            .trim_end_matches(".rs");
        if !super::is_production(&r) || (has_lib && inner == "main") || inner.starts_with("bin/") {
            continue;
        }
        let mut m: Module = inner.split('/').map(str::to_string).collect();
        if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            m.pop();
        }
        out.insert(m, r);
    }
    out
}

/// `text` up to its tests, without comments, strings or char literals.
fn code_only(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let next = b.get(i + 1).copied();
        match b[i] {
            b'/' if next == Some(b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if next == Some(b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'r' if (next == Some(b'"') || next == Some(b'#')) && (i == 0 || !ident(b[i - 1])) => {
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    out.push(b[i]);
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                i += 2 + hashes;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
                out.extend_from_slice(b"\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.extend_from_slice(b"\"\"");
            }
            b'\'' => {
                // A char literal ('x', '\n', '…'), else a lifetime.
                let len = if next == Some(b'\\') {
                    b[i + 1..].iter().position(|c| *c == b'\'').map(|p| p + 2)
                } else {
                    text.get(i + 1..)
                        .and_then(|t| t.chars().next())
                        .map(char::len_utf8)
                        .filter(|l| b.get(i + 1 + l) == Some(&b'\''))
                        .map(|l| l + 2)
                };
                match len {
                    Some(l) => i += l,
                    None => {
                        out.push(b'\'');
                        i += 1;
                    }
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The paths a `use` tree names: `crate::{a, b::{c, d as e}}` → `crate::a`, `crate::b::c`, ….
fn expand(tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or_default();
        out.push(
            path.split("::")
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty() && s != "self" && s != "*")
                .collect(),
        );
        return;
    };
    let prefix: Vec<String> = tree[..open]
        .split("::")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    let mut parts = Vec::new();
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    for p in parts.into_iter().filter(|p| !p.trim().is_empty()) {
        let mut sub = Vec::new();
        expand(p, &mut sub);
        out.extend(
            sub.into_iter()
                .map(|s| prefix.iter().cloned().chain(s).collect()),
        );
    }
}

/// The files `m`'s code reaches with `crate::` and `super::` paths, its own submodules left out.
fn arrows(m: &Module, code: &str, files: &BTreeMap<Module, String>) -> BTreeSet<Module> {
    static USES: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"\buse\s+([^;]+);").expect("use pattern"));
    static WRITTEN: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"\b(?:crate|super)(?:::\w+)+").expect("path pattern"));
    let (uses, written) = (&*USES, &*WRITTEN);
    let mut paths = Vec::new();
    for u in uses.captures_iter(code) {
        expand(&u[1], &mut paths);
    }
    let rest = uses.replace_all(code, "");
    for p in written.find_iter(&rest) {
        paths.push(p.as_str().split("::").map(str::to_string).collect());
    }
    let mut out = BTreeSet::new();
    for p in paths {
        let mut base = match p.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super") => m.clone(),
            _ => continue,
        };
        let mut rest = &p[1..];
        if p[0] == "super" {
            base.pop();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        let full: Module = base.into_iter().chain(rest.iter().cloned()).collect();
        let target = (0..=full.len())
            .rev()
            .map(|k| full[..k].to_vec())
            .find(|k| files.contains_key(k));
        if let Some(t) = target {
            if !t.starts_with(m) {
                out.insert(t);
            }
        }
    }
    out
}

/// The strongly connected components of more than one file (Tarjan).
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, (n, n));
            self.stack.push(v);
            self.on.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let low = if !self.index.contains_key(w) {
                    self.visit(w);
                    self.index[w].1
                } else if self.on.contains(w) {
                    self.index[w].0
                } else {
                    continue;
                };
                let e = self.index.get_mut(v).expect("visited");
                e.1 = e.1.min(low);
            }
            if self.index[v].0 == self.index[v].1 {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out
}

/// Every circle of every workspace crate: its files, and the arrows between them.
fn all_circles() -> Vec<(Vec<String>, Vec<String>)> {
    let root = super::repo();
    let mut out = Vec::new();
    for c in super::workspace().values() {
        let src = format!("{}/src", c.dir);
        let files = module_files(&root, &src);
        let graph: BTreeMap<Module, BTreeSet<Module>> = files
            .iter()
            .map(|(m, f)| {
                let code = code_only(&super::read(&root.join(f)));
                (m.clone(), arrows(m, &code, &files))
            })
            .collect();
        for comp in circles(&graph) {
            let members: BTreeSet<&Module> = comp.iter().collect();
            let names = comp.iter().map(|m| files[m].clone()).collect();
            let edges = comp
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|t| members.contains(t))
                        .map(|t| format!("{} → {}", files[m], files[t]))
                        .collect::<Vec<_>>()
                })
                .collect();
            out.push((names, edges));
        }
    }
    out
}

/// Circles not yet untied, each the files it holds (a circle found must lie within one of them).
/// The list only shrinks: an entry that no longer holds a circle must be removed.
const KNOWN_CIRCLES: &[&[&str]] = &[
    // The Keen engine: a flow runs scripts and registry tools; a script calls back into the
    // registry; the script child serves what script.rs defines.
    &[
        "nest/harness/src/keen/flow.rs",
        "nest/harness/src/keen/registry.rs",
        "nest/harness/src/keen/script.rs",
        "nest/harness/src/keen/script_child.rs",
    ],
    // The harness's run: `Run` (state.rs) holds the `Harness`, whose tools, built-ins and
    // delegates take the `Run`. Untied by giving the run a context of its own (issue 36).
    &[
        "nest/harness/src/run/approval.rs",
        "nest/harness/src/run/builtins.rs",
        "nest/harness/src/run/delegate.rs",
        "nest/harness/src/run/harness.rs",
        "nest/harness/src/run/remote.rs",
        "nest/harness/src/run/state.rs",
        "nest/harness/src/run/tool_limits.rs",
        "nest/harness/src/run/tools.rs",
    ],
];

#[test]
fn no_module_imports_itself_through_others() {
    let circles = all_circles();
    let within =
        |files: &[String], known: &[&str]| files.iter().all(|f| known.contains(&f.as_str()));
    let stale: Vec<String> = KNOWN_CIRCLES
        .iter()
        .filter(|k| {
            !circles
                .iter()
                .any(|(files, _)| files.len() == k.len() && within(files, k))
        })
        .map(|k| k.join(", "))
        .collect();
    assert!(
        stale.is_empty(),
        "these circles of KNOWN_CIRCLES are gone or smaller: remove or shrink them:\n{}",
        stale.join("\n")
    );
    let problems: Vec<String> = circles
        .into_iter()
        .filter(|(files, _)| !KNOWN_CIRCLES.iter().any(|k| within(files, k)))
        .map(|(files, edges)| {
            format!(
                "{} files import each other in a circle:\n  {}\n  (move what both need into a module below them, or pass it down as a trait or a channel)",
                files.len(),
                edges.join("\n  ")
            )
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn circles_are_found_through_uses_and_written_paths() {
    let code = code_only(
        "use crate::{a::{b, c as d}, e};\nuse super::f::*; // crate::x\nlet s = \"crate::y\"; crate::g::h(); '\"'; 'a;\n#[cfg(test)]\nuse crate::z;",
    );
    let mut paths = Vec::new();
    expand("crate::{a::{b, c as d}, e}", &mut paths);
    assert_eq!(
        paths,
        [
            vec!["crate", "a", "b"],
            vec!["crate", "a", "c"],
            vec!["crate", "e"]
        ]
    );
    let m = |s: &str| -> Module {
        s.split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let files: BTreeMap<Module, String> =
        ["", "a", "a/b", "e", "p", "p/f", "p/q", "g", "x", "y", "z"]
            .iter()
            .map(|s| (m(s), format!("{s}.rs")))
            .collect();
    let got = arrows(&m("p/q"), &code, &files);
    let want: BTreeSet<Module> = ["a/b", "a", "e", "p/f", "g"].iter().map(|s| m(s)).collect();
    assert_eq!(got, want);
    // A parent's arrows to its children do not count.
    assert!(arrows(&m("a"), "use crate::a::b::X;", &files).is_empty());
    let graph: BTreeMap<Module, BTreeSet<Module>> = [
        (m("a"), [m("e")].into()),
        (m("e"), [m("g")].into()),
        (m("g"), [m("a")].into()),
        (m("x"), [m("a")].into()),
    ]
    .into();
    assert_eq!(circles(&graph), vec![vec![m("a"), m("e"), m("g")]]);
}
