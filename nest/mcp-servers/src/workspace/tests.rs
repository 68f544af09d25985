//! Unit tests of the workspace server: the escape table (every known way out of the root, for
//! every file tool), legitimate paths, read paging, edit uniqueness, list/grep behaviour and
//! `run` basics. Calls go through [`WorkspaceServer::call`], so argument parsing is covered too.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{WorkspaceOptions, WorkspaceServer};

/// A temp folder holding `root/` (the workspace) and things outside it.
struct Fixture {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    server: WorkspaceServer,
}

impl Fixture {
    /// root/ with files, inside links and every kind of escaping link; outside/ and root_evil/
    /// beside it hold `SECRET`.
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().expect("temp dir");
        let base = fs::canonicalize(tmp.path()).expect("canonical temp dir");
        let root = base.join("root");
        for dir in [
            "root/src/nested",
            "root/.git",
            "root/node_modules/pkg",
            "root/target",
            "outside",
            "root_evil",
        ] {
            fs::create_dir_all(base.join(dir)).expect("mkdir");
        }
        let files = [
            ("root/inside.txt", "inside\n"),
            ("root/src/a.rs", "fn a() {}\n// needle in a\n"),
            ("root/src/nested/b.rs", "fn b() {}\n"),
            ("root/src/notes.md", "needle in notes\n"),
            ("root/.git/config", "needle in git\n"),
            ("root/node_modules/pkg/index.js", "needle in node_modules\n"),
            ("root/target/out.rs", "needle in target\n"),
            ("outside/secret.txt", "SECRET outside\n"),
            ("root_evil/secret.txt", "SECRET evil\n"),
        ];
        for (path, content) in files {
            fs::write(base.join(path), content).expect("write fixture");
        }
        let links: [(&str, PathBuf); 11] = [
            ("root/link_in", "src".into()),
            ("root/file_link_in", "src/a.rs".into()),
            ("root/abs_link_in", root.join("src/a.rs")),
            ("root/link_out", "../outside".into()),
            ("root/link_out_abs", base.join("outside")),
            ("root/file_link_out", "../outside/secret.txt".into()),
            ("root/dangling_out", "../outside/nothing.txt".into()),
            ("root/sneaky", "../root_evil".into()),
            ("root/loop_a", "loop_b".into()),
            ("root/loop_b", "loop_a".into()),
            ("root/src/up", "..".into()),
        ];
        for (link, target) in links {
            symlink(target, base.join(link)).expect("symlink");
        }
        let server = WorkspaceServer::new(&WorkspaceOptions {
            root: root.clone(),
            no_run: false,
            run_timeout: Duration::from_secs(120),
            allow_git_writes: false,
        })
        .expect("server opens the root");
        Fixture {
            _tmp: tmp,
            base,
            server,
        }
    }

    fn root(&self) -> PathBuf {
        self.base.join("root")
    }

    /// An absolute path in the temp folder, as text.
    fn abs(&self, rel: &str) -> String {
        self.base.join(rel).display().to_string()
    }

    fn call(&self, tool: &str, args: Value) -> Result<String, String> {
        let Value::Object(args) = args else {
            panic!("arguments must be an object")
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime
            .block_on(self.server.call(tool, args, CancellationToken::new()))
            .map_err(|e| e.to_string())
    }

    /// Everything outside the root, to prove nothing there changed.
    fn outside_snapshot(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for dir in ["outside", "root_evil"] {
            let mut entries: Vec<_> = fs::read_dir(self.base.join(dir))
                .expect("read_dir")
                .flatten()
                .collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let content =
                    fs::read_to_string(entry.path()).unwrap_or_else(|_| "<not a file>".into());
                out.push((
                    format!("{dir}/{}", entry.file_name().to_string_lossy()),
                    content,
                ));
            }
        }
        out
    }

    /// Every symlink in the root with its target, to prove no link was replaced.
    fn links_snapshot(&self) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        let mut stack = vec![self.root()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).expect("read_dir").flatten() {
                let ft = entry.file_type().expect("file type");
                if ft.is_symlink() {
                    out.push((
                        entry.path().display().to_string(),
                        fs::read_link(entry.path()).expect("readlink"),
                    ));
                } else if ft.is_dir() {
                    stack.push(entry.path());
                }
            }
        }
        out.sort();
        out
    }
}

/// The ways out of the root, as `(path, what the error must say)`, for every file tool.
fn escape_paths(f: &Fixture) -> Vec<(String, &'static str)> {
    vec![
        ("../outside/secret.txt".into(), "outside the workspace root"),
        (
            "src/../../outside/secret.txt".into(),
            "outside the workspace root",
        ),
        (
            "./../root_evil/secret.txt".into(),
            "outside the workspace root",
        ),
        (f.abs("outside/secret.txt"), "outside the workspace root"),
        // a sibling whose name starts with the root's name is not inside the root
        (f.abs("root_evil/secret.txt"), "outside the workspace root"),
        (
            format!("{}/../outside/secret.txt", f.abs("root")),
            "outside the workspace root",
        ),
        ("/etc/passwd".into(), "outside the workspace root"),
        (
            "link_out/secret.txt".into(),
            "symbolic link `link_out`, which leads outside",
        ),
        (
            "link_out_abs/secret.txt".into(),
            "symbolic link `link_out_abs`, which leads outside",
        ),
        (
            "file_link_out".into(),
            "symbolic link `file_link_out`, which leads outside",
        ),
        (
            "sneaky/secret.txt".into(),
            "symbolic link `sneaky`, which leads outside",
        ),
        (
            "link_in/../link_out/secret.txt".into(),
            "symbolic link `link_out`, which leads outside",
        ),
        ("src/up/link_out/secret.txt".into(), "which leads outside"),
        ("loop_a".into(), "symbolic link loop"),
    ]
}

fn assert_refused(result: Result<String, String>, tool: &str, path: &str, expected: &str) {
    match result {
        Ok(text) => panic!("{tool} `{path}` should be refused, got: {text}"),
        Err(message) => assert!(
            message.contains(expected),
            "{tool} `{path}`: error should contain {expected:?}, got: {message}"
        ),
    }
}

#[test]
fn every_escape_is_refused_by_every_file_tool_and_nothing_outside_changes() {
    let f = Fixture::new();
    let outside_before = f.outside_snapshot();
    let links_before = f.links_snapshot();
    for (path, expected) in escape_paths(&f) {
        assert_refused(
            f.call("read", json!({"path": path})),
            "read",
            &path,
            expected,
        );
        assert_refused(
            f.call("write", json!({"path": path, "content": "pwned"})),
            "write",
            &path,
            expected,
        );
        assert_refused(
            f.call(
                "edit",
                json!({"path": path, "old_string": "SECRET", "new_string": "pwned"}),
            ),
            "edit",
            &path,
            expected,
        );
        assert_refused(
            f.call("grep", json!({"pattern": "SECRET", "path": path})),
            "grep",
            &path,
            expected,
        );
    }
    assert_eq!(f.outside_snapshot(), outside_before);
    assert_eq!(f.links_snapshot(), links_before);
}

#[test]
fn writes_through_an_escaping_parent_or_dangling_link_are_refused() {
    let f = Fixture::new();
    let outside_before = f.outside_snapshot();
    let links_before = f.links_snapshot();
    let cases = [
        // a symlinked parent of a file that does not exist yet
        (
            "link_out/new.txt",
            "symbolic link `link_out`, which leads outside",
        ),
        (
            "link_out_abs/new.txt",
            "symbolic link `link_out_abs`, which leads outside",
        ),
        (
            "sneaky/new.txt",
            "symbolic link `sneaky`, which leads outside",
        ),
        // missing folders are never created through a link that leaves the root
        (
            "link_out/sub/dir/new.txt",
            "symbolic link `link_out`, which leads outside",
        ),
        // a dangling link pointing outside is not created through
        (
            "dangling_out",
            "symbolic link `dangling_out`, which leads outside",
        ),
    ];
    for (path, expected) in cases {
        assert_refused(
            f.call("write", json!({"path": path, "content": "pwned"})),
            "write",
            path,
            expected,
        );
        assert_refused(
            f.call(
                "edit",
                json!({"path": path, "old_string": "a", "new_string": "b"}),
            ),
            "edit",
            path,
            "",
        );
    }
    assert_eq!(f.outside_snapshot(), outside_before);
    assert!(
        !f.base.join("outside/sub").exists(),
        "no folder may be created outside"
    );
    assert!(
        !f.base.join("outside/nothing.txt").exists(),
        "the dangling link's target may not be created"
    );
    assert_eq!(f.links_snapshot(), links_before);
}

#[test]
fn list_and_grep_refuse_patterns_and_paths_outside_the_root() {
    let f = Fixture::new();
    let list_cases = [
        ("../outside/*".to_string(), "outside the workspace root"),
        (
            format!("{}/*", f.abs("outside")),
            "outside the workspace root",
        ),
        (
            format!("{}/*", f.abs("root_evil")),
            "outside the workspace root",
        ),
        (
            "link_out/*".to_string(),
            "symbolic link `link_out`, which leads outside",
        ),
        (
            "link_out_abs/**".to_string(),
            "symbolic link `link_out_abs`, which leads outside",
        ),
        (
            "sneaky/*".to_string(),
            "symbolic link `sneaky`, which leads outside",
        ),
    ];
    for (pattern, expected) in list_cases {
        assert_refused(
            f.call("list", json!({"pattern": pattern})),
            "list",
            &pattern,
            expected,
        );
    }
}

#[test]
fn list_and_grep_skip_escaping_links_and_say_so() {
    let f = Fixture::new();
    let listed = f.call("list", json!({"pattern": "**"})).expect("list **");
    assert!(
        !listed.contains("secret.txt"),
        "nothing outside may be listed: {listed}"
    );
    for note in [
        "skipped `link_out`: symbolic link leading outside the workspace root (not followed)",
        "skipped `link_out_abs`: symbolic link leading outside the workspace root (not followed)",
        "skipped `file_link_out`: symbolic link leading outside the workspace root (not followed)",
        "skipped `sneaky`: symbolic link leading outside the workspace root (not followed)",
        "skipped `dangling_out`: symbolic link leading outside the workspace root (not followed)",
        "skipped `loop_a`: symbolic link loop",
        "not followed: `link_in` is a symbolic link to the folder `src` inside the root",
        "not followed: `src/up` is a symbolic link to the folder `.` inside the root",
    ] {
        assert!(listed.contains(note), "list should say {note:?}:\n{listed}");
    }
    let grepped = f
        .call("grep", json!({"pattern": "SECRET"}))
        .expect("grep SECRET");
    assert!(
        grepped.starts_with("no matches for `SECRET` in `.`"),
        "{grepped}"
    );
    assert!(
        grepped.contains("skipped `link_out`: symbolic link leading outside"),
        "{grepped}"
    );
    assert!(
        grepped.contains("skipped `file_link_out`: symbolic link leading outside"),
        "{grepped}"
    );
}

#[test]
fn legitimate_paths_work_including_links_that_stay_inside() {
    let f = Fixture::new();
    let cases = [
        ("inside.txt".to_string(), "inside"),
        ("./inside.txt".to_string(), "inside"),
        ("src/../inside.txt".to_string(), "inside"),
        (f.abs("root/inside.txt"), "inside"),
        ("link_in/a.rs".to_string(), "fn a() {}"),
        ("file_link_in".to_string(), "fn a() {}"),
        // an absolute symlink that points back inside the root
        ("abs_link_in".to_string(), "fn a() {}"),
        ("src/up/inside.txt".to_string(), "inside"),
    ];
    for (path, expected) in cases {
        let text = f
            .call("read", json!({"path": path}))
            .unwrap_or_else(|e| panic!("read `{path}`: {e}"));
        assert!(
            text.contains(expected),
            "read `{path}` should show {expected:?}: {text}"
        );
    }
    // writing through a link that stays inside writes its target and keeps the link
    f.call(
        "write",
        json!({"path": "file_link_in", "content": "fn a2() {}\n"}),
    )
    .expect("write through inside link");
    assert_eq!(
        fs::read_to_string(f.root().join("src/a.rs")).expect("a.rs"),
        "fn a2() {}\n"
    );
    assert!(fs::symlink_metadata(f.root().join("file_link_in"))
        .expect("link")
        .file_type()
        .is_symlink());
    f.call(
        "edit",
        json!({"path": "link_in/a.rs", "old_string": "a2", "new_string": "a3"}),
    )
    .expect("edit via link");
    assert_eq!(
        fs::read_to_string(f.root().join("src/a.rs")).expect("a.rs"),
        "fn a3() {}\n"
    );
    f.call(
        "write",
        json!({"path": f.abs("root/new/deep/file.txt"), "content": "x"}),
    )
    .expect("absolute inside");
    assert_eq!(
        fs::read_to_string(f.root().join("new/deep/file.txt")).expect("created"),
        "x"
    );
    let grepped = f
        .call("grep", json!({"pattern": "fn", "path": "link_in"}))
        .expect("grep via link");
    assert!(grepped.contains("link_in/a.rs:1: fn a3() {}"), "{grepped}");
}

#[test]
fn a_folder_swapped_for_a_symlink_never_leads_outside() {
    let f = Fixture::new();
    let root = f.root();
    fs::create_dir(root.join("swap")).expect("mkdir swap");
    fs::write(root.join("swap/secret.txt"), "harmless\n").expect("write");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (root, stop) = (root.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut swaps = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && swaps < 20_000 {
                let _ = fs::rename(root.join("swap"), root.join("swap_real"));
                let _ = symlink("../outside", root.join("swap"));
                let _ = fs::remove_file(root.join("swap"));
                let _ = fs::rename(root.join("swap_real"), root.join("swap"));
                swaps += 1;
            }
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    let mut reads = 0;
    while std::time::Instant::now() < deadline {
        if let Ok(text) = f.call("read", json!({"path": "swap/secret.txt"})) {
            assert!(
                !text.contains("SECRET"),
                "a read escaped through the swapped folder: {text}"
            );
        }
        let _ = f.call("write", json!({"path": "swap/dropped.txt", "content": "x"}));
        if let Ok(text) = f.call("grep", json!({"pattern": "SECRET", "path": "swap"})) {
            assert!(
                !text.contains("SECRET outside"),
                "a grep escaped through the swapped folder: {text}"
            );
        }
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().expect("swapper");
    assert!(reads > 10, "the race ran only {reads} rounds");
    assert!(
        !f.base.join("outside/dropped.txt").exists(),
        "a write escaped through the swapped folder"
    );
}

#[test]
fn read_pages_400_lines_at_a_time_and_says_the_next_offset() {
    let f = Fixture::new();
    let text: String = (1..=1000).map(|i| format!("line {i}\n")).collect();
    fs::write(f.root().join("long.txt"), text).expect("write");

    let first = f.call("read", json!({"path": "long.txt"})).expect("read");
    assert!(
        first.starts_with("     1\tline 1\n     2\tline 2\n"),
        "{first}"
    );
    assert!(first.contains("   400\tline 400\n"));
    assert!(!first.contains("line 401"));
    assert!(
        first.ends_with("(lines 1-400 of 1000; call read with offset 401 to see more)"),
        "{first}"
    );

    let page = f
        .call(
            "read",
            json!({"path": "long.txt", "offset": 401, "limit": 3}),
        )
        .expect("read page");
    assert_eq!(
        page,
        "   401\tline 401\n   402\tline 402\n   403\tline 403\n(lines 401-403 of 1000; call read with offset 404 to see more)"
    );
    let last = f
        .call("read", json!({"path": "long.txt", "offset": 999}))
        .expect("read end");
    assert_eq!(
        last,
        "   999\tline 999\n  1000\tline 1000\n(lines 999-1000 of 1000; end of file)"
    );

    let whole = f
        .call("read", json!({"path": "inside.txt"}))
        .expect("small file");
    assert_eq!(whole, "     1\tinside\n");

    let past = f
        .call("read", json!({"path": "long.txt", "offset": 1001}))
        .expect_err("past the end");
    assert!(
        past.contains("offset 1001 is past the end of `long.txt`, which has 1000 lines"),
        "{past}"
    );
}

#[test]
fn read_cuts_long_lines_and_refuses_what_is_not_a_text_file() {
    let f = Fixture::new();
    fs::write(
        f.root().join("wide.txt"),
        format!("{}\nshort\n", "x".repeat(5000)),
    )
    .expect("write");
    let text = f.call("read", json!({"path": "wide.txt"})).expect("read");
    assert!(
        text.contains(&format!(
            "{} … [line cut: 5000 characters in total]",
            "x".repeat(2000)
        )),
        "{text}"
    );
    assert!(text.contains("     2\tshort"));

    fs::write(f.root().join("blob.bin"), [0u8, 1, 2, 3]).expect("write");
    nix::unistd::mkfifo(
        &f.root().join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .expect("mkfifo");
    let cases = [
        ("blob.bin", "`blob.bin` looks like a binary file (4 bytes)"),
        (
            "src",
            "`src` is a folder; use `list` with a pattern such as `src/**`",
        ),
        (
            "missing.rs",
            "`missing.rs` does not exist; `list` shows what does",
        ),
        (
            "inside.txt/x",
            "`inside.txt/x`: a part of this path is a file, not a folder",
        ),
        ("fifo", "`fifo` is not a regular file"),
        ("", "the path is empty"),
    ];
    for (path, expected) in cases {
        assert_refused(
            f.call("read", json!({"path": path})),
            "read",
            path,
            expected,
        );
    }
    let bad_args = f
        .call("read", json!({"file_path": "inside.txt"}))
        .expect_err("unknown argument");
    assert!(
        bad_args.contains("invalid arguments for `read`: unknown field `file_path`"),
        "{bad_args}"
    );
}

#[test]
fn edit_replaces_exactly_one_occurrence_unless_replace_all() {
    let f = Fixture::new();
    fs::write(f.root().join("e.txt"), "alpha\nbeta\nalpha\n").expect("write");
    let cases: [(Value, Result<&str, &str>); 5] = [
        (
            json!({"path": "e.txt", "old_string": "alpha", "new_string": "x"}),
            Err("old_string occurs 2 times in `e.txt` (at lines 1, 3); include more of the surrounding text"),
        ),
        (
            json!({"path": "e.txt", "old_string": "gamma\nzeta", "new_string": "x"}),
            Err("old_string was not found in `e.txt`; read the file and copy the exact text"),
        ),
        (json!({"path": "e.txt", "old_string": "", "new_string": "x"}), Err("old_string is empty")),
        (json!({"path": "e.txt", "old_string": "beta", "new_string": "beta"}), Err("there is nothing to change")),
        (json!({"path": "nope.txt", "old_string": "a", "new_string": "b"}), Err("`nope.txt` does not exist")),
    ];
    for (args, expected) in cases {
        let got = f.call("edit", args.clone());
        match (got, expected) {
            (Err(message), Err(want)) => assert!(message.contains(want), "{args}: {message}"),
            (got, want) => panic!("{args}: got {got:?}, want {want:?}"),
        }
    }
    assert_eq!(
        fs::read_to_string(f.root().join("e.txt")).expect("read"),
        "alpha\nbeta\nalpha\n"
    );

    let one = f.call(
        "edit",
        json!({"path": "e.txt", "old_string": "alpha\nbeta", "new_string": "ALPHA\nbeta"}),
    );
    assert_eq!(
        one.as_deref(),
        Ok("edited `e.txt`: replaced 1 occurrence (at line 1)")
    );
    let all = f.call(
        "edit",
        json!({"path": "e.txt", "old_string": "a", "new_string": "4", "replace_all": true}),
    );
    assert_eq!(
        all.as_deref(),
        Ok("edited `e.txt`: replaced 3 occurrences (at lines 2, 3, 3)")
    );
    assert_eq!(
        fs::read_to_string(f.root().join("e.txt")).expect("read"),
        "ALPHA\nbet4\n4lph4\n"
    );
}

#[test]
fn write_creates_folders_and_replaces_whole_files() {
    let f = Fixture::new();
    assert_eq!(
        f.call(
            "write",
            json!({"path": "docs/guide/intro.md", "content": "# Intro\n\nHello\n"})
        )
        .as_deref(),
        Ok("created `docs/guide/intro.md` (3 lines, 15 bytes)")
    );
    assert_eq!(
        f.call(
            "write",
            json!({"path": "docs/guide/intro.md", "content": "short"})
        )
        .as_deref(),
        Ok("replaced `docs/guide/intro.md` (1 lines, 5 bytes)")
    );
    assert_eq!(
        fs::read_to_string(f.root().join("docs/guide/intro.md")).expect("read"),
        "short"
    );
    // Replaced in place: a longer text after a shorter one, then the same length again.
    for content in ["a longer text than before\n", "the same length as before\n"] {
        f.call(
            "write",
            json!({"path": "docs/guide/intro.md", "content": content}),
        )
        .expect("write");
        assert_eq!(
            fs::read_to_string(f.root().join("docs/guide/intro.md")).expect("read"),
            content
        );
    }
    assert_refused(
        f.call("write", json!({"path": "src", "content": "x"})),
        "write",
        "src",
        "`src` is a folder",
    );
    assert_refused(
        f.call("write", json!({"path": ".", "content": "x"})),
        "write",
        ".",
        "not the workspace root",
    );
    assert_refused(
        f.call(
            "write",
            json!({"path": "inside.txt/sub.txt", "content": "x"}),
        ),
        "write",
        "inside.txt/sub.txt",
        "a part of this path is a file",
    );
}

#[test]
fn list_matches_globs_sorted_and_skips_build_and_vcs_folders() {
    let f = Fixture::new();
    let cases = [
        ("src/**/*.rs", "src/a.rs\nsrc/nested/b.rs"),
        ("src/*.rs", "src/a.rs"),
        ("**/*.md", "src/notes.md"),
        ("*.txt", "inside.txt"),
        ("src/a.rs", "src/a.rs"),
        ("./src/*.md", "src/notes.md"),
        // named explicitly, skipped folders are searched
        ("target/**", "target/out.rs"),
        ("node_modules/**/*.js", "node_modules/pkg/index.js"),
        ("**/*.go", "no files match `**/*.go`"),
        (
            "src",
            "no files match `src` (`src` is a folder: list `src/*` or `src/**`)",
        ),
        (
            "nothere/**",
            "no files match `nothere/**` (`nothere` does not exist)",
        ),
    ];
    for (pattern, expected) in cases {
        let got = f
            .call("list", json!({"pattern": pattern}))
            .unwrap_or_else(|e| panic!("list {pattern}: {e}"));
        assert_eq!(without_notes(&got), expected, "list {pattern}");
    }
    let everything = f.call("list", json!({"pattern": "**"})).expect("list **");
    for hidden in [".git/config", "node_modules/pkg/index.js", "target/out.rs"] {
        assert!(
            !everything.contains(hidden),
            "{hidden} should be skipped:\n{everything}"
        );
    }
    assert!(
        everything.contains("abs_link_in\n"),
        "links to files inside are listed:\n{everything}"
    );
    let bad = f
        .call("list", json!({"pattern": "src/[a"}))
        .expect_err("bad glob");
    assert!(
        bad.contains("pattern `src/[a` is not a valid glob"),
        "{bad}"
    );
}

#[test]
fn grep_prints_path_line_text_with_path_and_glob_filters() {
    let f = Fixture::new();
    let cases = [
        (
            json!({"pattern": "needle"}),
            "src/a.rs:2: // needle in a\nsrc/notes.md:1: needle in notes",
        ),
        (
            json!({"pattern": "needle", "glob": "*.md"}),
            "src/notes.md:1: needle in notes",
        ),
        (
            json!({"pattern": "needle", "glob": "src/**/*.rs"}),
            "src/a.rs:2: // needle in a",
        ),
        (
            json!({"pattern": "^fn \\w+", "path": "src/nested"}),
            "src/nested/b.rs:1: fn b() {}",
        ),
        (
            json!({"pattern": "needle", "path": "src/a.rs"}),
            "src/a.rs:2: // needle in a",
        ),
        (
            json!({"pattern": "needle", "path": "target"}),
            "target/out.rs:1: needle in target",
        ),
        (
            json!({"pattern": "zzz", "path": "src"}),
            "no matches for `zzz` in `src`",
        ),
    ];
    for (args, expected) in cases {
        let got = f
            .call("grep", args.clone())
            .unwrap_or_else(|e| panic!("grep {args}: {e}"));
        assert_eq!(without_notes(&got), expected, "grep {args}");
    }
    let bad = f
        .call("grep", json!({"pattern": "("}))
        .expect_err("bad regex");
    assert!(
        bad.contains("`(` is not a valid regular expression"),
        "{bad}"
    );
    assert_refused(
        f.call("grep", json!({"pattern": "x", "path": "missing"})),
        "grep",
        "missing",
        "does not exist",
    );
}

#[test]
fn grep_searches_a_linked_file_once() {
    let f = Fixture::new();
    symlink("../inside.txt", f.root().join("src/ref.txt")).expect("symlink");
    // from the root, the target is met under its real path: reported once, there
    let whole = f.call("grep", json!({"pattern": "^inside"})).expect("grep");
    assert_eq!(without_notes(&whole), "inside.txt:1: inside");
    // from src, the target is outside the searched folder: reported under the link
    let sub = f
        .call("grep", json!({"pattern": "^inside", "path": "src"}))
        .expect("grep src");
    assert_eq!(without_notes(&sub), "src/ref.txt:1: inside");
}

/// An output without its notes about skipped entries.
fn without_notes(output: &str) -> String {
    let kept: Vec<&str> = output
        .lines()
        .filter(|l| !l.starts_with("skipped `") && !l.starts_with("not followed: "))
        .collect();
    kept.join("\n")
}

#[test]
fn grep_output_is_bounded() {
    let f = Fixture::new();
    let many: String = (0..1000).map(|i| format!("hit {i}\n")).collect();
    fs::write(f.root().join("many.txt"), many).expect("write");
    let got = f
        .call("grep", json!({"pattern": "hit", "path": "many.txt"}))
        .expect("grep");
    assert_eq!(
        got.lines().filter(|l| l.starts_with("many.txt:")).count(),
        super::search::MAX_GREP_MATCHES
    );
    assert!(got.ends_with("(output cut at 300 matching lines; narrow the search with `path`, `glob` or a more specific pattern)"));
}

#[test]
fn run_reports_exit_codes_and_keeps_the_output_tail() {
    let f = Fixture::new();
    let ok = f
        .call("run", json!({"command": "echo hello; echo oops >&2; pwd"}))
        .expect("run");
    assert_eq!(
        ok,
        format!(
            "exit code: 0\noutput:\nhello\noops\n{}\n",
            f.root().display()
        )
    );
    let failed = f.call("run", json!({"command": "exit 3"})).expect("run");
    assert_eq!(failed, "exit code: 3\n(no output)");
    let long = f
        .call(
            "run",
            json!({"command": "head -c 30000 /dev/zero | tr '\\0' a; printf END"}),
        )
        .expect("run");
    assert!(long.starts_with(
        "exit code: 0\noutput (the last 20000 of 30003 characters; earlier output was cut):\n"
    ));
    assert!(
        long.ends_with(&format!("{}END", "a".repeat(19_997))),
        "tail kept"
    );
    let too_long = f
        .call("run", json!({"command": "true", "timeout": 901}))
        .expect_err("timeout cap");
    assert!(too_long.contains("at most 900 seconds"), "{too_long}");
}

#[test]
fn run_timeout_kills_the_whole_group_before_replying() {
    let f = Fixture::new();
    let script =
        "trap '' TERM; (trap '' TERM; echo $$ > child.pid; exec sleep 300) & echo started; wait";
    let got = f
        .call("run", json!({"command": script, "timeout": 1}))
        .expect_err("timed out");
    assert!(
        got.starts_with("timed out after 1s: the command and every process it started were killed"),
        "{got}"
    );
    assert!(got.contains("started"), "{got}");
    let pid: i32 = fs::read_to_string(f.root().join("child.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    assert!(process_is_gone(pid), "child {pid} survived the timeout");
}

#[test]
fn run_timeout_kills_a_child_that_setsid_out_of_the_group() {
    let f = Fixture::new();
    let script = "setsid sh -c 'echo $$ > esc.pid; exec sleep 300' & sleep 60";
    let got = f
        .call("run", json!({"command": script, "timeout": 1}))
        .expect_err("timed out");
    assert!(got.starts_with("timed out after 1s"), "{got}");
    let pid: i32 = fs::read_to_string(f.root().join("esc.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    assert!(
        process_is_gone(pid),
        "setsid child {pid} survived the timeout"
    );
}

#[test]
fn background_processes_left_by_run_are_stopped_with_the_server() {
    let f = Fixture::new();
    let got = f
        .call(
            "run",
            json!({"command": "sleep 300 >/dev/null 2>&1 & echo $! > bg.pid"}),
        )
        .expect("run");
    assert!(got.starts_with("exit code: 0\n(no output)\n(background processes it started are still running in process group "), "{got}");
    let pid: i32 = fs::read_to_string(f.root().join("bg.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    assert!(
        !process_is_gone(pid),
        "the background process runs on after the call"
    );
    f.server.stop_background_processes();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !process_is_gone(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        process_is_gone(pid),
        "background process {pid} outlived the server"
    );
}

#[test]
fn a_cancelled_run_kills_its_group() {
    let f = Fixture::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cancel = CancellationToken::new();
    let args = serde_json::Map::from_iter([(
        "command".to_string(),
        json!("(trap '' TERM; echo $$ > sub.pid; sleep 300) & wait"),
    )]);
    let got = runtime.block_on(async {
        let canceller = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            canceller.cancel();
        });
        f.server.call("run", args, cancel).await
    });
    let message = got.expect_err("a cancelled run is an error").to_string();
    assert!(
        message.starts_with("cancelled: the command and every process it started were killed"),
        "{message}"
    );
    let pid: i32 = fs::read_to_string(f.root().join("sub.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    assert!(
        process_is_gone(pid),
        "subshell {pid} survived the cancellation"
    );
}

/// Gone, or a zombie waiting for its new parent to reap it (it can no longer run).
pub(crate) fn process_is_gone(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn no_run_leaves_run_out() {
    let tmp = tempfile::tempdir().expect("tmp");
    let server = WorkspaceServer::new(&WorkspaceOptions {
        root: tmp.path().to_path_buf(),
        no_run: true,
        run_timeout: Duration::from_secs(120),
        allow_git_writes: false,
    })
    .expect("server");
    let names: Vec<&str> = server.tools().iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["read", "list", "grep", "edit", "write"]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let refused = runtime
        .block_on(server.call(
            "run",
            serde_json::Map::from_iter([("command".into(), json!("true"))]),
            CancellationToken::new(),
        ))
        .expect_err("run is disabled");
    assert!(refused.to_string().contains("--no-run"));
}

#[test]
fn tools_carry_schemas_and_read_only_annotations() {
    let tmp = tempfile::tempdir().expect("tmp");
    let server = WorkspaceServer::new(&WorkspaceOptions {
        root: tmp.path().to_path_buf(),
        no_run: false,
        run_timeout: Duration::from_secs(120),
        allow_git_writes: false,
    })
    .expect("server");
    /// (name, argument names, required arguments, readOnlyHint)
    type ToolSummary = (String, Vec<String>, Vec<String>, Option<bool>);
    let summary: Vec<ToolSummary> = server
        .tools()
        .iter()
        .map(|t| {
            let schema = Value::Object(t.input_schema.as_ref().clone());
            let mut props: Vec<String> = schema["properties"]
                .as_object()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            props.sort();
            let mut required: Vec<String> = schema["required"]
                .as_array()
                .map(|r| {
                    r.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            required.sort();
            (
                t.name.to_string(),
                props,
                required,
                t.annotations.as_ref().and_then(|a| a.read_only_hint),
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        summary,
        vec![
            (
                "read".into(),
                s(&["limit", "offset", "path"]),
                s(&["path"]),
                Some(true)
            ),
            ("list".into(), s(&["pattern"]), s(&["pattern"]), Some(true)),
            (
                "grep".into(),
                s(&["glob", "path", "pattern"]),
                s(&["pattern"]),
                Some(true)
            ),
            (
                "edit".into(),
                s(&["new_string", "old_string", "path", "replace_all"]),
                s(&["new_string", "old_string", "path"]),
                Some(false)
            ),
            (
                "write".into(),
                s(&["content", "path"]),
                s(&["content", "path"]),
                Some(false)
            ),
            (
                "run".into(),
                s(&["command", "timeout"]),
                s(&["command"]),
                Some(false)
            ),
        ]
    );
}

#[test]
fn a_missing_root_is_a_clear_startup_error() {
    let err = WorkspaceServer::new(&WorkspaceOptions {
        root: Path::new("/definitely/not/here").to_path_buf(),
        no_run: false,
        run_timeout: Duration::from_secs(120),
        allow_git_writes: false,
    })
    .err()
    .expect("missing root fails");
    assert!(
        err.to_string()
            .contains("workspace root `/definitely/not/here` cannot be opened"),
        "{err}"
    );
}

#[test]
fn lines_are_read_with_a_memory_cap_and_their_full_length() {
    fn check(input: &str, cap: usize, expected: &[(&str, usize)]) {
        let mut reader = std::io::BufReader::with_capacity(4, input.as_bytes());
        let mut line = Vec::new();
        let mut got = Vec::new();
        while let Some(chars) =
            super::files::read_line_capped(&mut reader, &mut line, cap).expect("read")
        {
            got.push((String::from_utf8_lossy(&line).into_owned(), chars));
        }
        let expected: Vec<(String, usize)> =
            expected.iter().map(|(t, n)| (t.to_string(), *n)).collect();
        assert_eq!(got, expected, "input {input:?} cap {cap}");
    }
    check("", 10, &[]);
    check("a\nbc\n", 10, &[("a", 1), ("bc", 2)]);
    check("no newline", 100, &[("no newline", 10)]);
    check("dos\r\nline\r\n", 100, &[("dos", 3), ("line", 4)]);
    check("\n\n", 10, &[("", 0), ("", 0)]);
    check("abcdefghij\nxy", 4, &[("abcd", 10), ("xy", 2)]);
    check("héllo wörld\n", 100, &[("héllo wörld", 11)]);
    check("long\r\n", 2, &[("lo", 4)]);
}
