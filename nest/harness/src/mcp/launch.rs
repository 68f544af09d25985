//! How a command server is started, exactly as the spec says: the environment (cleared, then
//! the allowlist, the server's own `env` with `${NAME}` secrets, `PYTHONUTF8`,
//! `PYTHONIOENCODING`, `AGEN_BIN`), the program (`agen` = the agen binary, a relative command
//! found in the bundle runs from there, anything else from the allowlisted `PATH`), and the
//! process (cwd = bundle dir, own process group, `kill_on_drop`, `PR_SET_PDEATHSIG`).
//!
//! Invariants: nothing of the host environment outside [`ALLOWED_ENV`] (and `LC_*`) reaches a
//! server; a reason never holds a secret value; [`ProcessGroup`] kills the whole group when it
//! is dropped, so no server outlives its host.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use agen_shared::bundle::{substitute_secrets, SubstituteError};
use agen_shared::process::GroupGuard;
use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::LaunchContext;

/// Host variables a command server may see (plus every `LC_*`).
pub const ALLOWED_ENV: &[&str] = &[
    "PATH", "HOME", "TMPDIR", "TEMP", "TMP", "LANG", "TZ", "USER", "LOGNAME", "SHELL", "TERM",
];

/// Whether the host variable `name` passes the allowlist.
pub(crate) fn allowed(name: &str) -> bool {
    ALLOWED_ENV.contains(&name) || name.starts_with("LC_")
}

/// Replaces `${NAME}` in `value` with the secret, or says which secret is missing and where.
pub(crate) fn substitute(
    value: &str,
    secrets: &BTreeMap<String, String>,
    place: &str,
) -> Result<String, String> {
    substitute_secrets(value, |name| secrets.get(name).cloned()).map_err(|e| match e {
        SubstituteError::Unresolved(name) => format!(
            "{place}: secret {name} has no value; set it where x-agen/secrets.json says it comes from \
             (the Hub's secret store or the Nest's environment)"
        ),
        other => format!("{place}: {other}"),
    })
}

/// The complete environment of a command server, in the order it is applied (later wins).
pub(crate) fn server_env(
    host_env: &[(String, String)],
    own_env: &BTreeMap<String, String>,
    ctx: &LaunchContext,
) -> Result<Vec<(String, String)>, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in host_env {
        if allowed(k) {
            env.insert(k.clone(), v.clone());
        }
    }
    env.insert("PYTHONUTF8".into(), "1".into());
    env.insert("PYTHONIOENCODING".into(), "utf-8".into());
    for (k, v) in own_env {
        env.insert(k.clone(), substitute(v, &ctx.secrets, &format!("env {k}"))?);
    }
    env.insert(
        "AGEN_BIN".into(),
        ctx.agen_bin.to_string_lossy().into_owned(),
    );
    Ok(env.into_iter().collect())
}

/// The program to run for `command`: the agen binary for `agen`, a file of the bundle for a
/// relative command found there, else a lookup on `path` (the server's `PATH`).
pub(crate) fn resolve_program(
    command: &str,
    bundle_dir: &Path,
    path: Option<&str>,
    agen_bin: &Path,
    seat: Option<&super::ServerSeat>,
) -> Result<PathBuf, String> {
    if command == "agen" {
        return Ok(agen_bin.to_path_buf());
    }
    let as_path = Path::new(command);
    if as_path.is_absolute() {
        return match std::fs::metadata(as_path) {
            Ok(m) if m.is_file() => Ok(as_path.to_path_buf()),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(permission_denied(command, as_path, seat))
            }
            _ => Err(format!(
                "command {command} does not exist; expected an executable file"
            )),
        };
    }
    let in_bundle = bundle_dir.join(as_path);
    if in_bundle.is_file() {
        return Ok(in_bundle);
    }
    if command.contains('/') {
        return Err(format!(
            "command {command} not found in the bundle folder {}; expected a file there",
            bundle_dir.display()
        ));
    }
    let mut denied = None;
    for dir in path.unwrap_or("").split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(command);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
        if denied.is_none()
            && std::fs::metadata(&candidate)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
        {
            denied = Some(candidate);
        }
    }
    if let Some(candidate) = denied {
        return Err(permission_denied(command, &candidate, seat));
    }
    Err(format!(
        "command {command} not found in the bundle or on PATH ({}); install it on the Nest or use an absolute path",
        path.unwrap_or("<PATH is not set>")
    ))
}

/// What to say when `path` (the program of `command`) exists for the Nest but this process's
/// uid may not reach it: the uid, the first folder on the way it cannot enter (or the file
/// itself), and the fixes.
pub(crate) fn permission_denied(
    command: &str,
    path: &Path,
    seat: Option<&super::ServerSeat>,
) -> String {
    // The server runs as its seat's uid (its gid and the instance's as groups), not as this
    // process: the folders are checked by their modes for that uid.
    let (uid, gids, whose) = match seat {
        Some(s) => (s.uid, vec![s.gid, s.group], "the server's own uid"),
        None => (
            nix::unistd::getuid().as_raw(),
            vec![nix::unistd::getgid().as_raw()],
            "the instance's user",
        ),
    };
    let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    ancestors.reverse();
    let blocked = ancestors
        .into_iter()
        .find(|d| !allows(d, uid, &gids, 0o1))
        .map(|d| format!("folder {} is not passable (x) for it", d.display()))
        .unwrap_or_else(|| format!("{} is not readable and executable for it", path.display()));
    format!(
        "command {command}: permission denied: uid {uid} ({whose}) cannot reach {}: {blocked}; \
         install the program where that uid can read it, make the folder passable (chmod o+x), \
         or start the Nest with --run-as USER (a user who can) or --run-as-self",
        path.display()
    )
}

/// Whether `path`'s mode grants `bits` (of r=4, w=2, x=1) to `uid` with groups `gids` (root
/// passes everything); a path that cannot be read is not granted.
fn allows(path: &Path, uid: u32, gids: &[u32], bits: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    if uid == 0 {
        return true;
    }
    let mode = m.mode();
    let granted = if m.uid() == uid {
        mode >> 6
    } else if gids.contains(&m.gid()) {
        mode >> 3
    } else {
        mode
    };
    granted & bits == bits
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A seated server's own HOME and TMPDIR replace the instance's; USER and LOGNAME (the
/// instance's) go.
pub(crate) fn seat_env(env: &mut Vec<(String, String)>, seat: &super::ServerSeat) {
    let tmp = seat.tmp.to_string_lossy().into_owned();
    env.retain(|(k, _)| {
        !matches!(
            k.as_str(),
            "HOME" | "TMPDIR" | "TMP" | "TEMP" | "USER" | "LOGNAME"
        )
    });
    env.push(("HOME".into(), seat.home.to_string_lossy().into_owned()));
    for k in ["TMPDIR", "TMP", "TEMP"] {
        env.push((k.into(), tmp.clone()));
    }
    env.sort();
}

/// Spawns `cmd` (on the privileged thread when the process has one: a seated server changes
/// uid) and records it as a child its owner waits for.
pub(crate) fn spawn(cmd: Command) -> std::io::Result<Child> {
    let handle = tokio::runtime::Handle::current();
    let mut cmd = cmd;
    agen_shared::privileged::on_privileged(move || {
        let _rt = handle.enter();
        agen_shared::process::spawn_managed(|| cmd.spawn(), |c| c.id())
    })
}

/// Builds the command: cwd = bundle dir, cleared environment, piped stdio, own process group,
/// killed on drop and when this thread dies; with a seat, under the seat's uid (set first: a
/// change of credentials clears the parent-death signal).
pub(crate) fn command(
    program: &Path,
    args: &[String],
    cwd: &Path,
    env: &[(String, String)],
    seat: Option<&super::ServerSeat>,
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(s) = seat {
        let id = agen_shared::process::RunIdentity {
            uid: s.uid,
            gid: s.gid,
        };
        agen_shared::privileged::run_server_as(cmd.as_std_mut(), id, s.group);
    }
    // The kernel SIGKILLs the server when the thread that spawned it exits, so a server never
    // outlives a crashed host. The host spawns from async tasks on runtime threads.
    agen_shared::process::own_group_dying_with_parent(cmd.as_std_mut(), None);
    cmd
}

/// A spawned server's process group: its leader's exit status as it becomes known, and
/// SIGTERM/SIGKILL of the whole group (and of every descendant while the leader is not reaped).
/// Dropping it SIGKILLs them.
pub(crate) struct ProcessGroup {
    pgid: i32,
    exit: watch::Receiver<Option<ExitStatus>>,
    /// Kills once (a later kill could hit a reused process group id).
    guard: Arc<GroupGuard>,
}

impl ProcessGroup {
    /// Takes over `child` (spawned with `process_group(0)`); a task reaps it.
    pub(crate) fn watch(child: Child) -> Option<ProcessGroup> {
        let pid = child.id()?;
        let pgid = i32::try_from(pid).ok()?;
        let (tx, rx) = watch::channel(None);
        let guard = Arc::new(GroupGuard::new(pid));
        let mut child = child;
        let reaper_guard = guard.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            reaper_guard.leader_reaped();
            match status {
                Ok(status) => {
                    let _ = tx.send(Some(status));
                }
                Err(e) => tracing::warn!(pid = pgid, "could not wait for tool server process: {e}"),
            }
        });
        Some(ProcessGroup {
            pgid,
            exit: rx,
            guard,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pgid.unsigned_abs()
    }

    /// Resolves with the leader's exit status once it exits.
    pub(crate) async fn exited(&self) -> ExitStatus {
        let mut rx = self.exit.clone();
        let status = match rx.wait_for(|s| s.is_some()).await {
            Ok(s) => *s,
            // The reaper ended without a status (wait failed): never known.
            Err(_) => None,
        };
        match status {
            Some(status) => status,
            None => std::future::pending().await,
        }
    }

    /// The exit status if the leader has exited.
    pub(crate) fn status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// SIGTERM to the group, up to `grace` for the leader to exit, then SIGKILL to the group.
    pub(crate) async fn terminate(&self, grace: Duration) {
        if self.status().is_none() {
            self.signal(Signal::SIGTERM);
            let _ = tokio::time::timeout(grace, self.exited()).await;
        }
        // Also reaches children the server left behind after its leader exited.
        self.kill();
    }

    /// SIGKILL to the leader's descendants (while it is not reaped) and the group, now.
    pub(crate) fn kill(&self) {
        let _ = self.guard.kill();
    }

    fn signal(&self, sig: Signal) {
        // A group with no members left: nothing to stop.
        self.guard.signal(sig);
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// "exited with status 1", "was killed by signal 9 (SIGKILL)".
pub(crate) fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map(|s| format!(" ({})", s.as_str()))
                .unwrap_or_default();
            format!("was killed by signal {sig}{name}")
        }
        None => format!("exited ({status})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_program_is_named_with_the_servers_own_uid_and_the_folder_that_blocks_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).expect("mkdir");
        let program = closed.join("tool");
        std::fs::write(&program, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let seat = super::super::ServerSeat {
            uid: 62999,
            gid: 62999,
            group: 62998,
            home: dir.path().into(),
            tmp: dir.path().into(),
        };
        let msg = permission_denied("tool", &program, Some(&seat));
        assert!(msg.contains("uid 62999 (the server's own uid)"), "{msg}");
        assert!(
            msg.contains(&format!("folder {} is not passable", closed.display())),
            "{msg}"
        );
    }
    use pretty_assertions::assert_eq;

    fn ctx(secrets: &[(&str, &str)]) -> LaunchContext {
        let mut c = LaunchContext::new("/opt/agen/bin/agen");
        c.secrets = secrets
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        c
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn environment_is_the_allowlist_plus_own_env_plus_fixed_variables() {
        let host = pairs(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/n"),
            ("LC_ALL", "C.UTF-8"),
            ("AWS_SECRET_ACCESS_KEY", "hunter2"),
            ("AGEN_TOKEN", "t"),
            ("PYTHONPATH", "/x"),
        ]);
        let own: BTreeMap<String, String> = pairs(&[("TOKEN", "Bearer ${CRM}"), ("PLAIN", "v")])
            .into_iter()
            .collect();
        let got = server_env(&host, &own, &ctx(&[("CRM", "s3cr3t")])).unwrap();
        assert_eq!(
            got,
            pairs(&[
                ("AGEN_BIN", "/opt/agen/bin/agen"),
                ("HOME", "/home/n"),
                ("LC_ALL", "C.UTF-8"),
                ("PATH", "/usr/bin"),
                ("PLAIN", "v"),
                ("PYTHONIOENCODING", "utf-8"),
                ("PYTHONUTF8", "1"),
                ("TOKEN", "Bearer s3cr3t"),
            ])
        );
    }

    #[test]
    fn missing_secret_names_the_variable_and_the_secret_but_no_value() {
        let own: BTreeMap<String, String> =
            pairs(&[("DATABASE_URL", "${DB}")]).into_iter().collect();
        let err = server_env(&[], &own, &ctx(&[("OTHER", "v")])).unwrap_err();
        assert!(
            err.starts_with("env DATABASE_URL: secret DB has no value"),
            "{err}"
        );
    }

    #[test]
    fn allowlist_table() {
        for (name, expected) in [
            ("PATH", true),
            ("LC_CTYPE", true),
            ("TMPDIR", true),
            ("TERM", true),
            ("LD_PRELOAD", false),
            ("SSH_AUTH_SOCK", false),
            ("AGEN_TOKEN", false),
            ("path", false),
        ] {
            assert_eq!(allowed(name), expected, "{name}");
        }
    }

    #[test]
    fn program_resolution() {
        let bundle = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        std::fs::write(bundle.path().join("server.py"), "").unwrap();
        std::fs::create_dir(bundle.path().join("bin")).unwrap();
        std::fs::write(bundle.path().join("bin/run.sh"), "").unwrap();
        let tool = bin.path().join("mytool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("/nonexistent:{}", bin.path().display());
        let agen = Path::new("/opt/agen");
        let check = |cmd: &str, expected: Result<PathBuf, &str>| {
            let got = resolve_program(cmd, bundle.path(), Some(&path), agen, None);
            match (&got, &expected) {
                (Ok(g), Ok(e)) => assert_eq!(g, e, "{cmd}"),
                (Err(g), Err(e)) => assert!(g.starts_with(e), "{cmd}: {g}"),
                _ => panic!("{cmd}: got {got:?}, expected {expected:?}"),
            }
        };
        check("agen", Ok(PathBuf::from("/opt/agen")));
        check("server.py", Ok(bundle.path().join("server.py")));
        check("./bin/run.sh", Ok(bundle.path().join("./bin/run.sh")));
        check("mytool", Ok(tool.clone()));
        check(
            "./missing.sh",
            Err("command ./missing.sh not found in the bundle folder"),
        );
        check(
            "nosuchtool",
            Err("command nosuchtool not found in the bundle or on PATH"),
        );
        check(
            "/nonexistent/x",
            Err("command /nonexistent/x does not exist"),
        );
    }
}
