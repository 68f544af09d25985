//! Spawning one instance process and killing its process group and every descendant (through
//! the one process module, `agen_shared::process`).
//!
//! Invariants: every instance runs in its own process group (`process_group(0)`) with
//! `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the Nest even on `kill -9`; an instance is a
//! subreaper, so on a stop that needs SIGKILL every descendant (`setsid`/double-forked ones
//! included) is killed while the instance still holds them; the spawn happens on
//! the calling (async worker) thread, never in `spawn_blocking` (PDEATHSIG fires when the
//! spawning *thread* exits); the instance gets a cleared environment (allowlist only), so it
//! never sees Hub credentials; a separated instance runs under its own uid and gid (no
//! supplementary groups) with its own HOME and TMPDIR (see `separation`), set before exec; its
//! stderr (JSON lines, `AGEN_LOG_FORMAT=json`) goes to the
//! instance's log files ([`crate::logs`]: its own lines and each tool server's apart) and to
//! `tracing`, tagged once with the instance id (and the server's name for a server's line); its
//! command line is `agen instance` alone: the socket path, its id, its bundle dir and its
//! per-spawn secret come through the bootstrap pipe on fd [`BOOTSTRAP_FD`], written and closed
//! by the Nest before the spawn (so it never blocks and the instance reads it to EOF).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agen_shared::process as group;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::socket::{Bootstrap, BOOTSTRAP_FD, BOOTSTRAP_FD_ENV};

/// Variables an instance inherits from the Nest (the tool-server allowlist plus logging).
pub const ENV_ALLOWLIST: [&str; 13] = [
    "PATH",
    "HOME",
    "TMPDIR",
    "TEMP",
    "TMP",
    "LANG",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "RUST_LOG",
    "RUST_BACKTRACE",
];

fn allowed(name: &str) -> bool {
    ENV_ALLOWLIST.contains(&name) || name.starts_with("LC_")
}

/// Who a separated instance runs as and its own dirs.
#[derive(Debug, Clone, Copy)]
pub struct RunAs<'a> {
    pub id: group::RunIdentity,
    pub dirs: &'a crate::separation::RunDirs,
}

/// Starts `<agen_bin> instance` with `boot` on its bootstrap fd (as `run_as` when given).
pub fn spawn_instance(
    agen_bin: &Path,
    boot: &Bootstrap,
    env: &[(String, String)],
    run_as: Option<RunAs<'_>>,
    logs: crate::logs::LogStore,
    netns: Option<&std::fs::File>,
    cgroup: Option<&crate::cgroup::InstanceCgroup>,
) -> std::io::Result<Child> {
    let line = serde_json::to_vec(boot).map_err(std::io::Error::other)?;
    // Both ends are close-on-exec; only the dup2 below puts the read end into the instance.
    let (reader, mut writer) = std::io::pipe()?;
    // A bootstrap is a few hundred bytes, far below the pipe's buffer: this never blocks.
    writer.write_all(&line)?;
    drop(writer);
    let instance_id = boot.instance_id.as_str();
    let mut cmd = Command::new(agen_bin);
    cmd.arg("instance")
        .current_dir(&boot.bundle_dir)
        .env_clear()
        .envs(
            env.iter()
                .filter(|(k, _)| allowed(k))
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .env("NO_COLOR", "1")
        .env(agen_shared::telemetry::LOG_FORMAT_ENV, "json")
        .env(BOOTSTRAP_FD_ENV, BOOTSTRAP_FD.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Into its resource group before it runs anything: registered first, so a separated
    // instance that keeps capabilities joins before it changes credentials (one that does not
    // joins as its uid, which owns the group's `cgroup.procs`).
    if let Some(cg) = cgroup {
        cg.join_on_exec(cmd.as_std_mut());
    }
    if let Some(r) = run_as {
        let tmp = r.dirs.tmp.as_os_str();
        cmd.env("HOME", &r.dirs.home)
            .env("TMPDIR", tmp)
            .env("TMP", tmp)
            .env("TEMP", tmp)
            // Not the Nest's user any more; there is no passwd entry to name.
            .env_remove("USER")
            .env_remove("LOGNAME");
        if boot.seats.is_empty() {
            group::run_as(cmd.as_std_mut(), r.id);
        } else {
            // It starts its tool servers under their own uids and stops them: CAP_SETUID,
            // CAP_SETGID and CAP_KILL, which it keeps on one thread (`agen_shared::privileged`).
            agen_shared::privileged::run_instance_as(cmd.as_std_mut(), r.id);
        }
    } else {
        // Not separated: still none of the Nest's own capabilities (a unit's ambient set).
        group::no_ambient_capabilities(cmd.as_std_mut());
    }
    group::own_group_dying_with_parent(cmd.as_std_mut(), Some(std::process::id()));
    put_on_fd(&mut cmd, reader.as_raw_fd(), BOOTSTRAP_FD);

    // In its own network namespace when it has one: this thread enters it for the fork only.
    let mut child = match netns {
        Some(ns) => {
            crate::netns::spawn_in(ns, || group::spawn_managed(|| cmd.spawn(), |c| c.id()))?
        }
        None => group::spawn_managed(|| cmd.spawn(), |c| c.id())?,
    };
    drop(reader);
    if let Some(stderr) = child.stderr.take() {
        let id = instance_id.to_string();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                relay_line(&logs, &id, &line);
            }
        });
    }
    Ok(child)
}

/// One stderr line of instance `id`: into its log file (the server's, for a tool server's
/// line) and re-logged at its level, with the instance id once.
fn relay_line(logs: &crate::logs::LogStore, id: &str, line: &str) {
    let parsed = crate::logs::parse_instance_line(line);
    let (level, text) = if parsed.level.is_empty() {
        let (level, text) = split_log_line(line);
        (level.to_string(), text.to_string())
    } else {
        (parsed.level.clone(), parsed.text.clone())
    };
    let source = match &parsed.server {
        Some(s) => crate::logs::Source::Server(s.clone()),
        None => crate::logs::Source::Instance,
    };
    logs.append(id, &source, &level, &text);
    let server = parsed.server.as_deref().unwrap_or("");
    macro_rules! relog {
        ($lvl:ident) => {
            if server.is_empty() {
                tracing::$lvl!(instance = %id, "{text}")
            } else {
                tracing::$lvl!(instance = %id, server = %server, "{text}")
            }
        };
    }
    match level.as_str() {
        "ERROR" => relog!(error),
        "WARN" => relog!(warn),
        "DEBUG" | "TRACE" => relog!(debug),
        _ => relog!(info),
    }
}

/// `2026-11-30T04:45:42.476957Z  WARN text` (an instance's own tracing line) → `("WARN", "text")`,
/// so the Nest re-logs it at its level without a second timestamp; other lines are kept whole.
fn split_log_line(line: &str) -> (&str, &str) {
    let mut parts = line.trim_start().splitn(2, char::is_whitespace);
    let (Some(ts), Some(rest)) = (parts.next(), parts.next()) else {
        return ("", line);
    };
    if !(ts.ends_with('Z') && ts.contains('T') && ts.starts_with(|c: char| c.is_ascii_digit())) {
        return ("", line);
    }
    let rest = rest.trim_start();
    let mut parts = rest.splitn(2, char::is_whitespace);
    match (parts.next(), parts.next()) {
        (Some(level @ ("ERROR" | "WARN" | "INFO" | "DEBUG" | "TRACE")), text) => {
            (level, text.unwrap_or("").trim_start())
        }
        _ => ("", line),
    }
}

/// Makes `fd` (close-on-exec in the Nest) the child's `target` fd, inherited by exec.
#[allow(unsafe_code)]
fn put_on_fd(cmd: &mut Command, fd: i32, target: i32) {
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (dup2, fcntl); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if fd == target {
                // dup2 onto itself keeps close-on-exec: clear it instead.
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, target) != target {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends `sig` to the group `pgid`; a group that is already gone is not an error.
pub fn signal_group(pgid: i32, sig: Signal) {
    group::signal_group(pgid, sig);
}

/// Stops the group: SIGTERM (the instance then stops its tool servers and kills what is left
/// of its descendants itself), then after `grace` every descendant of the still-unreaped leader
/// and the group get SIGKILL, and the leader is reaped. Returns whether it exited within the
/// grace.
pub async fn stop_group(child: &mut Child, pgid: i32, grace: Duration) -> bool {
    signal_group(pgid, Signal::SIGTERM);
    let graceful = tokio::time::timeout(grace, child.wait()).await.is_ok();
    if !graceful {
        // Not reaped yet, so its pid is still its own and its orphans are still under it.
        if let Ok(pid) = u32::try_from(pgid) {
            let n = group::kill_tree(pid).len();
            if n > 0 {
                tracing::info!(
                    pid,
                    killed = n,
                    "killed the descendants of an instance that ignored SIGTERM"
                );
            }
        }
    }
    // Whatever is left in the group (a tool server that ignored SIGTERM) goes now.
    signal_group(pgid, Signal::SIGKILL);
    if !graceful {
        let _ = child.wait().await;
    }
    graceful
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_log_lines_keep_their_level_but_not_their_timestamp() {
        let check = |line: &str, expected: (&str, &str)| {
            assert_eq!(split_log_line(line), expected, "{line}")
        };
        check(
            "2026-11-30T04:45:42.476957Z  WARN runs will fail: no model",
            ("WARN", "runs will fail: no model"),
        );
        check(
            "2026-11-30T04:45:42.476957Z ERROR boom x=1",
            ("ERROR", "boom x=1"),
        );
        check("2026-11-30T04:45:42.476957Z  INFO", ("INFO", ""));
        check(
            "Traceback (most recent call last):",
            ("", "Traceback (most recent call last):"),
        );
        check(
            "2026-11-30T04:45:42Z NOTALEVEL x",
            ("", "2026-11-30T04:45:42Z NOTALEVEL x"),
        );
        check("", ("", ""));
    }

    #[test]
    fn only_allowlisted_variables_reach_an_instance() {
        for (name, ok) in [
            ("PATH", true),
            ("LC_ALL", true),
            ("RUST_LOG", true),
            ("AGEN_TOKEN", false),
            ("AWS_SECRET_ACCESS_KEY", false),
        ] {
            assert_eq!(allowed(name), ok, "{name}");
        }
    }

    #[tokio::test]
    async fn stopping_a_group_kills_its_grandchildren_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("grandchild.pid");
        // The leader traps SIGTERM (ignores it) and has a grandchild in the same group.
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "trap '' TERM; sleep 300 & echo $! > {}; wait",
                pidfile.display()
            ))
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn sh");
        let pgid = i32::try_from(child.id().expect("pid")).expect("fits");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let grandchild = loop {
            if let Ok(s) = std::fs::read_to_string(&pidfile) {
                if let Ok(p) = s.trim().parse::<i32>() {
                    break p;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "grandchild never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let graceful = stop_group(&mut child, pgid, Duration::from_millis(300)).await;
        assert!(
            !graceful,
            "the leader ignores SIGTERM, so SIGKILL was needed"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while nix::sys::signal::kill(nix::unistd::Pid::from_raw(grandchild), None).is_ok() {
            // A zombie until init reaps it; /proc shows state Z.
            let stat =
                std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
            if stat.contains(") Z") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "grandchild {grandchild} survived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
