//! Process groups and descendants: the one place Agen starts children in their own group, ties
//! them to their parent's life, signals groups, and kills every descendant of a process (those
//! that `setsid` or double-fork away included, once their parent is a subreaper).
//!
//! Used by the Nest's supervisor (instances), the harness (stdio tool servers) and the
//! workspace server's `run` tool.
//!
//! Invariants: a pgid or pid of 0 or 1 is never signalled (that would be our own group or
//! init); [`kill_tree`] is given only a process that is not yet reaped (a zombie keeps its pid,
//! so the pid cannot have been reused); it freezes (SIGSTOP) every descendant before it kills
//! them, so none can fork a new one in between, and repeats until none is left (bounded).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// How many freeze-and-kill rounds [`kill_tree`] makes at most.
const KILL_ROUNDS: usize = 50;

/// Children this process spawned and waits for itself, as `(pid, start time)`: the
/// [`reap_adopted`] reaper leaves them to their owner. The start time tells a reused pid apart.
static MANAGED: Mutex<Vec<(u32, u64)>> = Mutex::new(Vec::new());

/// Puts the command's child in a process group of its own and has the kernel SIGKILL it when
/// the thread that spawned it exits (`PR_SET_PDEATHSIG`). With `parent`, the spawn fails when
/// the parent died between fork and prctl (no signal would ever come).
pub fn own_group_dying_with_parent(cmd: &mut std::process::Command, parent: Option<u32>) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[allow(unsafe_code)]
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid); it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if let Some(parent) = parent {
                let now = u32::try_from(nix::unistd::getppid().as_raw()).ok();
                if now != Some(parent) {
                    return Err(std::io::Error::other(
                        "the parent exited while starting the child",
                    ));
                }
            }
            Ok(())
        });
    }
}

/// The uid and gid a child runs as (kept in `privileged.rs`, which this module's kills go
/// through).
pub use crate::privileged::RunIdentity;

/// Has the command's child drop to `id` before exec: setgid, `setgroups([])`, setuid (std does
/// the three in that order, before any `pre_exec` closure, so the death signal set by
/// [`own_group_dying_with_parent`] survives the change of credentials), then clears its
/// ambient capabilities: a parent that is not root but holds capabilities (a systemd unit's
/// `AmbientCapabilities`) would otherwise hand them on through exec, and the child, no longer
/// uid 0 and running a binary without file capabilities, ends up with none.
pub fn run_as(cmd: &mut std::process::Command, id: RunIdentity) {
    use std::os::unix::process::CommandExt;
    // With a uid and no explicit groups, std calls setgroups(0) before setuid.
    cmd.gid(id.gid).uid(id.uid);
    no_ambient_capabilities(cmd);
}

/// Clears the child's ambient capabilities before exec (see [`run_as`]): a child of a Nest that
/// holds the unit's capabilities gets none of them, separated or not.
pub fn no_ambient_capabilities(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: the closure runs between fork and exec and calls only prctl (async-signal-safe);
    // it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(|| {
            let rc = libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            );
            // EINVAL: a kernel without ambient capabilities (before 4.3) has none to clear.
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
            }
            Ok(())
        });
    }
}

/// The real uid of a live (non-zombie) process, from `/proc/<pid>/status`.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The real uids of every live process.
pub fn uids_in_use() -> HashSet<u32> {
    let mut out = HashSet::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if !is_dead(pid) {
                out.extend(uid_of(pid));
            }
        }
    }
    out
}

/// Every live process whose real uid is `uid` (never for uid 0).
pub fn processes_of_uid(uid: u32) -> Vec<u32> {
    if uid == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if pid > 1 && !is_dead(pid) && uid_of(pid) == Some(uid) {
                out.push(pid);
            }
        }
    }
    out
}

/// Kills every process running as `uid` (never uid 0): freeze all, kill all, until none is
/// left (bounded). A uid handed to one instance alone is free again only after this.
pub fn kill_uid(uid: u32) -> Vec<u32> {
    let mut killed = HashSet::new();
    for _ in 0..KILL_ROUNDS {
        let procs = processes_of_uid(uid);
        if procs.is_empty() {
            break;
        }
        for &p in &procs {
            let _ = send(p, Signal::SIGSTOP);
        }
        for &p in &procs {
            if send(p, Signal::SIGKILL) {
                killed.insert(p);
            }
        }
    }
    killed.into_iter().collect()
}

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`), so
/// one that `setsid`s and double-forks still has this process as an ancestor.
pub fn become_subreaper() -> std::io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)
}

/// Sends `sig` to the group `pgid`; false when no member is left (or the pgid is 0 or 1).
pub fn signal_group(pgid: i32, sig: Signal) -> bool {
    pgid > 1 && crate::privileged::on_privileged(move || killpg(Pid::from_raw(pgid), sig).is_ok())
}

/// Sends `sig` to `pid` (from the privileged thread when there is one, see
/// [`crate::privileged`]); whether it was delivered.
fn send(pid: u32, sig: Signal) -> bool {
    crate::privileged::on_privileged(move || kill(Pid::from_raw(pid as i32), sig).is_ok())
}

/// Whether the group `pgid` still has a member (zombies count until reaped).
pub fn group_alive(pgid: i32) -> bool {
    pgid > 1 && crate::privileged::on_privileged(move || killpg(Pid::from_raw(pgid), None).is_ok())
}

/// The start time field of `/proc/<pid>/stat` (clock ticks since boot).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; after the ')' the fields start at field 3.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Spawns a child its caller will wait for itself (a tokio or std `Child`), holding off
/// [`reap_adopted`] until it is registered, so the reaper never takes its exit status.
pub fn spawn_managed<T>(
    spawn: impl FnOnce() -> std::io::Result<T>,
    pid_of: impl FnOnce(&T) -> Option<u32>,
) -> std::io::Result<T> {
    let mut managed = MANAGED.lock().unwrap_or_else(|p| p.into_inner());
    let child = spawn()?;
    if let Some(pid) = pid_of(&child) {
        if let Some(t) = start_time(pid) {
            managed.push((pid, t));
        }
    }
    Ok(child)
}

/// Reaps the exited children this process adopted as a subreaper (orphans of its
/// descendants), never one spawned through [`spawn_managed`]. Returns how many it reaped.
pub fn reap_adopted() -> usize {
    let me = std::process::id();
    let mut managed = MANAGED.lock().unwrap_or_else(|p| p.into_inner());
    // An owner reaped its child: the entry is stale once the pid is gone or reused.
    managed.retain(|(pid, t)| start_time(*pid) == Some(*t));
    let mut zombies = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, 'Z')) = stat_of(pid) {
                if ppid == me && !managed.iter().any(|(p, _)| *p == pid) {
                    zombies.push(pid);
                }
            }
        }
    }
    let mut reaped = 0;
    for pid in zombies {
        let flags = Some(nix::sys::wait::WaitPidFlag::WNOHANG);
        if nix::sys::wait::waitpid(Pid::from_raw(pid as i32), flags).is_ok() {
            reaped += 1;
        }
    }
    reaped
}

/// One line of `/proc/<pid>/stat`: `(ppid, state)`.
fn stat_of(pid: u32) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Every live (non-zombie) descendant of `root`, parents before children.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, state)) = stat_of(pid) {
                if state != 'Z' && state != 'X' {
                    children.entry(ppid).or_default().push(pid);
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::from([root]);
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if seen.insert(c) {
                out.push(c);
                queue.push(c);
            }
        }
    }
    out
}

/// Kills every descendant of `root` (not `root` itself): freeze all, kill all, until none is
/// left. `root` must not have been reaped yet (see the module invariants). Returns the pids
/// that were sent SIGKILL.
pub fn kill_tree(root: u32) -> Vec<u32> {
    if root <= 1 {
        return Vec::new();
    }
    let mut killed = HashSet::new();
    for _ in 0..KILL_ROUNDS {
        let tree = descendants(root);
        if tree.is_empty() {
            break;
        }
        for &p in &tree {
            let _ = send(p, Signal::SIGSTOP);
        }
        for &p in &tree {
            if send(p, Signal::SIGKILL) {
                killed.insert(p);
            }
        }
    }
    killed.into_iter().collect()
}

/// Whether `pid` is gone (no such process, or a zombie: dead, only not reaped yet).
pub fn is_dead(pid: u32) -> bool {
    !matches!(stat_of(pid), Some((_, s)) if s != 'Z' && s != 'X')
}

/// A child's process group, SIGKILLed (with every descendant of the leader while the leader is
/// not reaped) when dropped or [`GroupGuard::kill`]ed.
#[derive(Debug)]
pub struct GroupGuard {
    pgid: i32,
    leader_reaped: AtomicBool,
    killed: AtomicBool,
}

impl GroupGuard {
    /// Guards the group led by `leader` (spawned with its own group: pgid = pid).
    pub fn new(leader: u32) -> GroupGuard {
        GroupGuard {
            pgid: i32::try_from(leader).unwrap_or(0),
            leader_reaped: AtomicBool::new(false),
            killed: AtomicBool::new(false),
        }
    }

    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// The leader was waited for: its pid may be reused, so its tree is no longer ours to walk.
    pub fn leader_reaped(&self) {
        self.leader_reaped.store(true, Ordering::SeqCst);
    }

    /// Sends `sig` to the group (unless it was killed already).
    pub fn signal(&self, sig: Signal) -> bool {
        !self.killed.load(Ordering::SeqCst) && signal_group(self.pgid, sig)
    }

    /// Kills the leader's descendants (while it is not reaped) and the group, once. Returns
    /// the descendants that were sent SIGKILL.
    pub fn kill(&self) -> Vec<u32> {
        if self.killed.swap(true, Ordering::SeqCst) || self.pgid <= 1 {
            return Vec::new();
        }
        let tree = if self.leader_reaped.load(Ordering::SeqCst) {
            Vec::new()
        } else {
            kill_tree(self.pgid.unsigned_abs())
        };
        signal_group(self.pgid, Signal::SIGKILL);
        tree
    }

    /// Forgets the group without killing it.
    pub fn disarm(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[track_caller]
    fn wait_gone(pid: u32) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !is_dead(pid) {
            assert!(Instant::now() < deadline, "process {pid} survived");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_tree_dies_whole_even_the_children_that_left_the_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("escapee.pid");
        // The leader starts a `setsid` child (new session and group) and waits on it.
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c").arg(format!(
            "setsid sh -c 'echo $$ > {}; exec sleep 300' & wait",
            pidfile.display()
        ));
        own_group_dying_with_parent(&mut cmd, None);
        // Managed: the reaper test in this binary must leave it to us.
        let mut child = spawn_managed(|| cmd.spawn(), |c| Some(c.id())).expect("spawn sh");
        let deadline = Instant::now() + Duration::from_secs(10);
        let escapee = loop {
            if let Some(p) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                break p;
            }
            assert!(Instant::now() < deadline, "the escapee never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(descendants(child.id()).contains(&escapee));
        // Its group is not the leader's: a group kill alone would miss it.
        let pgrp = std::fs::read_to_string(format!("/proc/{escapee}/stat")).expect("stat");
        let pgrp: u32 = pgrp
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(2))
            .and_then(|f| f.parse().ok())
            .expect("pgrp field");
        assert_eq!(pgrp, escapee, "setsid made it a group leader of its own");
        let guard = GroupGuard::new(child.id());
        assert!(guard.kill().contains(&escapee));
        let _ = child.wait();
        wait_gone(escapee);
        assert!(descendants(child.id()).is_empty());
    }

    #[test]
    fn the_reaper_takes_adopted_orphans_but_never_a_managed_child() {
        // This test process becomes a subreaper: only this test's children are affected.
        become_subreaper().expect("subreaper");
        let mut managed = spawn_managed(
            || std::process::Command::new("true").spawn(),
            |c| Some(c.id()),
        )
        .expect("spawn true");
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("orphan.pid");
        // A double fork: the orphan is re-parented to us and exits at once.
        let mut sh = std::process::Command::new("sh");
        sh.arg("-c").arg(format!(
            "(sh -c 'echo $$ > {}; exit 0' &)",
            pidfile.display()
        ));
        let mut sh = spawn_managed(|| sh.spawn(), |c| Some(c.id())).expect("sh");
        assert!(sh.wait().expect("sh").success());
        let deadline = Instant::now() + Duration::from_secs(10);
        let orphan = loop {
            let pid = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok());
            if let Some(p) = pid.filter(|p| matches!(stat_of(*p), Some((_, 'Z')) | None)) {
                break p;
            }
            assert!(Instant::now() < deadline, "no orphan zombie appeared");
            std::thread::sleep(Duration::from_millis(20));
        };
        // The managed child is a zombie too by now; its owner still gets its status.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !matches!(stat_of(managed.id()), Some((_, 'Z'))) {
            assert!(Instant::now() < deadline, "`true` never exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while stat_of(orphan).is_some() {
            reap_adopted();
            assert!(
                Instant::now() < deadline,
                "orphan {orphan} was never reaped"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(managed
            .wait()
            .expect("the owner reaps its own child")
            .success());
    }

    #[test]
    fn init_and_our_own_group_are_never_signalled() {
        assert!(!signal_group(0, Signal::SIGCONT));
        assert!(!signal_group(1, Signal::SIGCONT));
        assert!(kill_tree(1).is_empty());
        assert!(kill_tree(0).is_empty());
    }
}
