//! Per-instance resource limits (`resources` of a deployment): one control group per instance,
//! holding the instance process and, by inheritance, every tool server it starts (under any
//! uid), with its memory, CPU and process limits; read back for usage and OOM kills.
//!
//! Backends, chosen once at start and logged ([`Cgroups::describe`]): cgroup v2 (the unified
//! hierarchy, delegated to the Nest by systemd's `Delegate=yes`: the Nest moves itself into a
//! leaf `nest-<pid>` and puts instances under `instances-<pid>/<id>`), cgroup v1 (each of the
//! `memory`, `cpu`, `cpuacct`, `pids` hierarchies that is mounted, a group
//! `agen-nest-<pid>/<id>` under the Nest's own group in each), or rlimits when neither can be
//! written (`RLIMIT_AS` for memory, `RLIMIT_NPROC` for processes, no CPU limit).
//!
//! Invariants: a process joins its group between fork and exec ([`InstanceCgroup::join_on_exec`]
//! writes to `cgroup.procs` from the child, allocating nothing), so nothing of an instance
//! ever runs outside it; a group is removed only after every process in it is gone; a
//! deployment that declares no `cpu`/`memory` gets no such limit (it only reserves the
//! default on the Hub), `pids` is always limited.

mod proc_usage;
mod v1;
mod v2;

pub use proc_usage::{group_usage, ProcSample};

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use agen_shared::bundle::ResourceSpec;

/// How this Nest enforces limits.
#[derive(Debug)]
pub enum Cgroups {
    V2(v2::Root),
    V1(v1::Roots),
    /// Neither can be used: why.
    Rlimits(String),
}

/// Usage of one group at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    /// CPU time used since the group was made.
    pub cpu_seconds: f64,
    /// Memory in use, page cache that can be dropped left out.
    pub memory_bytes: u64,
    pub pids: u32,
}

impl Cgroups {
    /// Finds what the host offers and makes the Nest's own groups; never fails (rlimits are
    /// the last resort, with the reason).
    pub fn detect() -> Cgroups {
        let pid = std::process::id();
        let v2_err = match v2::Root::setup(pid) {
            Ok(r) => return Cgroups::V2(r),
            Err(e) => e,
        };
        match v1::Roots::setup(pid) {
            Ok(r) => Cgroups::V1(r),
            Err(v1_err) => Cgroups::Rlimits(format!("cgroup v2: {v2_err}; cgroup v1: {v1_err}")),
        }
    }

    /// The line for the start log and `agen nests`.
    pub fn describe(&self) -> String {
        match self {
            Cgroups::V2(r) => format!("cgroup v2 ({})", r.describe()),
            Cgroups::V1(r) => format!("cgroup v1 ({})", r.describe()),
            Cgroups::Rlimits(why) => {
                format!("rlimits (memory as address space, pids; no cpu limit): {why}")
            }
        }
    }

    /// Makes the group of instance `id` with its limits (`uid`: the instance's, for a separated
    /// instance, which owns nothing in it but must be able to start its servers there).
    pub fn create(&self, id: &str, limits: &ResourceSpec) -> Result<InstanceCgroup, String> {
        let dirs = match self {
            Cgroups::V2(r) => r.create(id, limits)?,
            Cgroups::V1(r) => r.create(id, limits)?,
            Cgroups::Rlimits(_) => Vec::new(),
        };
        let procs = dirs
            .iter()
            .map(|d| {
                CString::new(d.join("cgroup.procs").as_os_str().as_bytes())
                    .map_err(|e| format!("{}: {e}", d.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InstanceCgroup {
            v2: matches!(self, Cgroups::V2(_)),
            dirs,
            procs,
            limits: *limits,
        })
    }

    /// Removes the Nest's own groups (at shutdown; what is left of instances first).
    pub fn cleanup(&self) {
        match self {
            Cgroups::V2(r) => r.cleanup(),
            Cgroups::V1(r) => r.cleanup(),
            Cgroups::Rlimits(_) => {}
        }
    }
}

/// One instance's group (in each v1 hierarchy, or the one v2 group; none under rlimits).
#[derive(Debug)]
pub struct InstanceCgroup {
    v2: bool,
    dirs: Vec<PathBuf>,
    procs: Vec<CString>,
    limits: ResourceSpec,
}

impl InstanceCgroup {
    /// Puts the child of `cmd` into this group before it execs (and, with no group, sets the
    /// rlimits instead).
    #[allow(unsafe_code)]
    pub fn join_on_exec(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let procs = self.procs.clone();
        let rlimits = procs.is_empty();
        let memory = self.limits.memory_bytes;
        let pids = u64::from(self.limits.pids_limit());
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (open, write, close, setrlimit) on memory made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                for path in &procs {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if n != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if rlimits {
                    if let Some(m) = memory {
                        let lim = libc::rlimit {
                            rlim_cur: m,
                            rlim_max: m,
                        };
                        libc::setrlimit(libc::RLIMIT_AS, &lim);
                    }
                    let lim = libc::rlimit {
                        rlim_cur: pids,
                        rlim_max: pids,
                    };
                    libc::setrlimit(libc::RLIMIT_NPROC, &lim);
                }
                Ok(())
            });
        }
    }

    /// Lets `uid` (a separated instance's) move itself into the group: it owns the group's
    /// `cgroup.procs` (and nothing else of it; the limits stay root's).
    pub fn allow_join(&self, uid: u32) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        for d in &self.dirs {
            // The uid joins after its credentials changed (std sets them before `pre_exec`), so
            // it must be able to reach the file: the group and the Nest's group above it are
            // made under the Nest's umask 077; traverse only (0711), nothing to list or write.
            for dir in [Some(d.as_path()), d.parent()].into_iter().flatten() {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
                    .map_err(|e| format!("cannot open {} to uid {uid}: {e}", dir.display()))?;
            }
            let procs = d.join("cgroup.procs");
            std::os::unix::fs::chown(&procs, Some(uid), None)
                .map_err(|e| format!("cannot hand {} to uid {uid}: {e}", procs.display()))?;
        }
        Ok(())
    }

    /// Whether limits are enforced by a group (not rlimits).
    pub fn is_group(&self) -> bool {
        !self.dirs.is_empty()
    }

    /// Times the kernel killed a process of this group for its memory limit.
    pub fn oom_kills(&self) -> u64 {
        self.dirs
            .iter()
            .find_map(|d| {
                let file = if self.v2 {
                    "memory.events"
                } else {
                    "memory.oom_control"
                };
                let text = std::fs::read_to_string(d.join(file)).ok()?;
                counter(&text, "oom_kill")
            })
            .unwrap_or(0)
    }

    /// The group's use now (`None` under rlimits: the caller reads /proc).
    pub fn read(&self) -> Option<Reading> {
        if self.dirs.is_empty() {
            return None;
        }
        Some(if self.v2 {
            v2::read(&self.dirs[0])
        } else {
            v1::read(&self.dirs)
        })
    }

    /// The pids in the group.
    pub fn pids(&self) -> Vec<i32> {
        self.dirs
            .first()
            .and_then(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// SIGKILL to every process in the group (a fork loop included: repeated until empty,
    /// bounded).
    pub fn kill_all(&self) {
        for _ in 0..50 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Removes the group once empty (kills what is left first).
    pub fn remove(&self) {
        self.kill_all();
        for d in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// What this host offers placement: its CPUs (thousandths) and its memory (bytes,
/// `MemTotal`).
pub fn host_capacity() -> (u32, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    (u32::try_from(cpus * 1000).unwrap_or(u32::MAX), mem)
}

/// The value of `key N` in a flat-keyed cgroup file (`memory.events`, `memory.oom_control`).
pub(crate) fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Reads a small cgroup file as a number.
pub(crate) fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Removes the empty child groups of `dir` and then `dir`.
pub(crate) fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Groups `prefix<pid>` under `parent` left by a Nest that is gone (its pid is no process).
pub(crate) fn remove_stale(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_tree(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keyed_counters_are_read_by_name() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(counter(v1, "oom_kill"), Some(3));
        let v2 = "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(counter(v2, "oom_kill"), Some(2));
        assert_eq!(counter(v2, "missing"), None);
    }
}
