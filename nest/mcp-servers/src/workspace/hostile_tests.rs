//! Attack tests of the workspace server: writes into `.git` (config, hooks, through a symlink,
//! nested repositories), and catastrophic `grep` patterns bounded in time and stopped on cancel.

use std::fs;
use std::os::unix::fs::symlink;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{WorkspaceOptions, WorkspaceServer, GREP_DEADLINE};

fn server(root: &std::path::Path, allow_git_writes: bool) -> WorkspaceServer {
    WorkspaceServer::new(&WorkspaceOptions {
        root: root.to_path_buf(),
        no_run: true,
        run_timeout: Duration::from_secs(10),
        allow_git_writes,
    })
    .expect("server opens the root")
}

fn call(
    server: &WorkspaceServer,
    tool: &str,
    args: Value,
    cancel: CancellationToken,
) -> Result<String, String> {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(server.call(tool, args, cancel))
        .map_err(|e| e.to_string())
}

/// A folder with a git repository's `.git`, a nested one, and a symlink to `.git`.
fn repo() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = tmp.path();
    for dir in [".git/hooks", "vendor/lib/.git", "src"] {
        fs::create_dir_all(root.join(dir)).expect("mkdir");
    }
    fs::write(root.join(".git/config"), "[core]\n\tbare = false\n").expect("config");
    fs::write(root.join("src/main.rs"), "fn main() {}\n").expect("main");
    symlink(".git", root.join("docs")).expect("symlink");
    tmp
}

#[test]
#[rustfmt::skip] // one attack per line reads as a table
fn writes_and_edits_under_dot_git_are_refused_unless_allowed() {
    let tmp = repo();
    let s = server(tmp.path(), false);
    let cancel = CancellationToken::new;
    let attacks = [
        ("write", json!({"path": ".git/config", "content": "[core]\n\tfsmonitor = touch /tmp/pwned\n"})),
        ("write", json!({"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\ntouch /tmp/pwned\n"})),
        ("write", json!({"path": ".git/hooks/new/deeper", "content": "x"})),
        ("write", json!({"path": "./src/../.git/config", "content": "x"})),
        ("write", json!({"path": ".GIT/config", "content": "x"})),
        ("write", json!({"path": "docs/config", "content": "x"})),
        ("write", json!({"path": "docs/hooks/post-checkout", "content": "x"})),
        ("write", json!({"path": "vendor/lib/.git/config", "content": "x"})),
        ("write", json!({"path": format!("{}/.git/config", tmp.path().display()), "content": "x"})),
        ("edit", json!({"path": ".git/config", "old_string": "bare = false", "new_string": "fsmonitor = touch /tmp/pwned"})),
        ("edit", json!({"path": "docs/config", "old_string": "bare = false", "new_string": "x"})),
    ];
    let mut written = Vec::new();
    for (tool, args) in &attacks {
        match call(&s, tool, args.clone(), cancel()) {
            Err(e) if e.contains("is inside a `.git` folder; writes and edits there are refused") => {}
            other => written.push(format!("{tool} {args}: {other:?}")),
        }
    }
    assert_eq!(written, Vec::<String>::new());
    assert_eq!(fs::read_to_string(tmp.path().join(".git/config")).unwrap(), "[core]\n\tbare = false\n");
    assert!(!tmp.path().join(".git/hooks/pre-commit").exists());
    // Files beside it are fine: `.gitignore`, `.github/`, a folder named `git`.
    for path in [".gitignore", ".github/workflows/ci.yml", "git/notes.txt", "src/.git-keep"] {
        call(&s, "write", json!({"path": path, "content": "ok"}), cancel()).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    // The descriptions say so.
    for tool in s.tools().iter().filter(|t| t.name == "write" || t.name == "edit") {
        assert!(tool.description.as_deref().unwrap_or_default().contains("inside a `.git` folder cannot be written"), "{}", tool.name);
    }
    // With --allow-git-writes the operator has chosen otherwise.
    let allowed = server(tmp.path(), true);
    call(&allowed, "write", json!({"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\n"}), cancel()).unwrap();
    assert!(tmp.path().join(".git/hooks/pre-commit").exists());
}

#[test]
fn writes_cannot_plant_a_git_repository_at_any_depth() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let s = server(tmp.path(), false);
    let cancel = CancellationToken::new;
    let write = |path: &str, content: &str| {
        call(
            &s,
            "write",
            json!({"path": path, "content": content}),
            cancel(),
        )
    };
    let refused = |r: &Result<String, String>| {
        r.as_ref()
            .err()
            .is_some_and(|e| e.contains("a git repository (HEAD, objects/ and refs/)"))
    };
    // The attack of issue 41, in every order of the three parts, at depth 2 and at the root.
    let mut planted = Vec::new();
    for (i, order) in [
        ["HEAD", "objects/pack/x", "refs/heads/main"],
        ["refs/heads/main", "HEAD", "objects/x"],
        ["objects/x", "refs/tags/v", "HEAD"],
    ]
    .iter()
    .enumerate()
    {
        for base in [format!("vendor/lib{i}"), String::new()] {
            let at = |p: &str| {
                if base.is_empty() {
                    p.to_string()
                } else {
                    format!("{base}/{p}")
                }
            };
            let results: Vec<_> = order
                .iter()
                .map(|p| write(&at(p), "ref: refs/heads/main\n"))
                .collect();
            let config = write(&at("config"), "[core]\n\tfsmonitor = touch /tmp/pwned\n");
            let dir = tmp.path().join(&base);
            let is_repo = dir.join("HEAD").is_file()
                && dir.join("objects").is_dir()
                && dir.join("refs").is_dir();
            if is_repo || !refused(&results[2]) || results[..2].iter().any(|r| r.is_err()) {
                planted.push(format!("{base:?} {order:?}: {results:?} config {config:?}"));
            }
            // Clean up so the next order starts from nothing.
            for p in ["HEAD", "objects", "refs", "config"] {
                let _ = fs::remove_dir_all(dir.join(p));
                let _ = fs::remove_file(dir.join(p));
            }
        }
    }
    assert_eq!(planted, Vec::<String>::new(), "repositories planted");
    // An existing one (made by someone else) cannot be edited into running commands either.
    fs::create_dir_all(tmp.path().join("third/objects")).expect("objects");
    fs::create_dir_all(tmp.path().join("third/refs")).expect("refs");
    fs::write(tmp.path().join("third/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    fs::write(tmp.path().join("third/config"), "[core]\n").expect("config");
    assert!(refused(&write(
        "third/config",
        "[core]\n\tpager = touch /tmp/pwned\n"
    )));
    assert!(refused(&call(
        &s,
        "edit",
        json!({"path": "third/config", "old_string": "[core]", "new_string": "[alias]"}),
        cancel()
    )));
    // Ordinary folders named objects or refs are fine.
    write("docs/objects/list.md", "ok").expect("docs/objects");
    write("docs/refs/list.md", "ok").expect("docs/refs");
    write("docs/README", "ok").expect("docs/README");
    // With --allow-git-writes the operator has chosen otherwise.
    let allowed = server(tmp.path(), true);
    for p in ["x/HEAD", "x/objects/o", "x/refs/r"] {
        call(
            &allowed,
            "write",
            json!({"path": p, "content": "ok"}),
            cancel(),
        )
        .unwrap();
    }
}

/// A 10 MB file (32 KiB lines) of word characters with no non-word character: the worst case for `\w{300}\W`.
fn big_word_file() -> tempfile::TempDir {
    big_word_files(1)
}

/// A folder with `n` files of 300 lines of 32 KiB of `a` each (under grep's 20 MB file limit).
fn big_word_files(n: usize) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("temp dir");
    let line = "a".repeat(32 * 1024 - 1) + "\n";
    for i in 0..n {
        let name = if i == 0 {
            "big.txt".to_string()
        } else {
            format!("big-{i}.txt")
        };
        fs::write(tmp.path().join(name), line.repeat(300)).expect("big file");
    }
    tmp
}

#[test]
fn a_catastrophic_grep_pattern_is_refused_or_stopped_at_its_deadline() {
    let tmp = big_word_file();
    let s = server(tmp.path(), false);
    let mut slow = Vec::new();
    for pattern in [
        r"\w{300}\W",
        r"(\w+\s?){1,40}\W",
        r"(a|aa|aaa){1,100}b",
        r"[\p{L}\p{N}]{200}\W",
    ] {
        let started = Instant::now();
        let out = call(
            &s,
            "grep",
            json!({"pattern": pattern}),
            CancellationToken::new(),
        );
        let took = started.elapsed();
        let bounded = match &out {
            Err(e) => e.contains("too large once compiled"),
            Ok(text) => text.contains("no matches") || text.contains("search incomplete"),
        };
        if took > GREP_DEADLINE + Duration::from_secs(3) || !bounded {
            slow.push(format!("{pattern}: {took:?}: {out:.200?}"));
        }
    }
    assert_eq!(slow, Vec::<String>::new());
}

#[test]
fn a_cancelled_grep_stops_searching() {
    // Big enough that the search is still going when the cancel comes, even on an idle
    // machine (one such file was once searched inside 300 ms).
    let tmp = big_word_files(8);
    let s = server(tmp.path(), false);
    let cancel = CancellationToken::new();
    let canceller = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            cancel.cancel();
            Instant::now()
        })
    };
    // A pattern that compiles and is slow on every line.
    let out = call(
        &s,
        "grep",
        json!({"pattern": r"(a|aa|aaa){1,100}b"}),
        cancel,
    );
    let returned = Instant::now();
    let cancelled_at = canceller.join().expect("canceller");
    let late = returned.saturating_duration_since(cancelled_at);
    assert!(
        late < Duration::from_secs(2),
        "grep went on for {late:?} after the cancel: {out:.200?}"
    );
    let out = out.expect("a stopped grep is an answer");
    assert!(
        out.contains("(search incomplete: the call was cancelled)"),
        "{out:.300}"
    );
}
