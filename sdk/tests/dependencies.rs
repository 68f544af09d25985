//! The `agen` crate builds without the Nest daemon, the Hub or tonic (issue 19): its normal
//! dependency tree, as `cargo tree` resolves it from the workspace's lock file, holds none of
//! them. A failure names the path from `agen` to the offending crate.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

/// Crates an embedding program must not pull in through `agen`.
const FORBIDDEN: &[&str] = &["tonic", "agen-hub", "agen-nest", "agen-proto"];

fn forbidden(name: &str) -> bool {
    FORBIDDEN.contains(&name) || name.starts_with("tonic-")
}

/// Every path from the root of `tree` (`cargo tree --prefix depth` output) to a forbidden crate.
fn offending_paths(tree: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut found = Vec::new();
    for line in tree.lines() {
        let digits = line.chars().take_while(char::is_ascii_digit).count();
        let Ok(depth) = line[..digits].parse::<usize>() else {
            continue;
        };
        let Some(name) = line[digits..].split_whitespace().next() else {
            continue;
        };
        stack.truncate(depth);
        stack.push(name.to_string());
        if forbidden(name) {
            found.push(stack.join(" -> "));
        }
    }
    found
}

#[test]
fn the_agen_crate_depends_on_neither_tonic_nor_the_hub_nest_or_proto_crates() {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = sdk.parent().expect("sdk/ is in the workspace");
    let out = Command::new(env!("CARGO"))
        .current_dir(workspace)
        .args([
            "tree",
            "-p",
            "agen",
            "-e",
            "normal",
            "--prefix",
            "depth",
            "--locked",
            "--offline",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        tree.lines().next().is_some_and(|l| l.starts_with("0agen ")),
        "unexpected cargo tree output: {tree}"
    );
    assert!(
        tree.lines().any(|l| l.contains("agen-harness")),
        "the tree lists agen's dependencies: {tree}"
    );
    let paths = offending_paths(&tree);
    assert!(
        paths.is_empty(),
        "the agen crate must build without the Hub, the Nest, agen-proto or tonic; found:\n{}",
        paths.join("\n")
    );
}

#[test]
fn an_offending_dependency_is_reported_with_its_path() {
    let tree = "0agen v0.1.0 (/w/sdk)\n1agen-harness v0.1.0 (/w/nest/harness)\n2agen-proto v0.1.0 (/w/proto)\n3tonic v0.14.0\n1futures v0.3.31\n";
    assert_eq!(
        offending_paths(tree),
        vec![
            "agen -> agen-harness -> agen-proto".to_string(),
            "agen -> agen-harness -> agen-proto -> tonic".to_string(),
        ]
    );
}
