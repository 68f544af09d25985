//! Records the commit this binary is built from as `AGEN_COMMIT` (`agen version`, and the Nest's
//! `Register`): `AGEN_COMMIT` from the build's environment when set (a build without git),
//! else `git rev-parse --short=12 HEAD`, else `unknown`. Only this crate reruns when HEAD moves.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=AGEN_COMMIT");
    let commit = std::env::var("AGEN_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Rebuild when HEAD moves: HEAD itself, the branch it names, and packed refs.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rustc-env=AGEN_COMMIT={commit}");
}
