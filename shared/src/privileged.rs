//! Capabilities on one thread. A separated instance starts its tool servers under uids of their
//! own (each server one of its own, never the instance's) and must stop them, so its Nest
//! starts it with CAP_SETUID, CAP_SETGID and CAP_KILL as ambient capabilities
//! ([`run_instance_as`]). The first thing the instance does, while it has one thread, is
//! [`keep_on_privileged_thread`]: a thread is started that keeps them, and the calling thread
//! (from which every later thread is made) drops them all. Spawning a tool server
//! ([`run_server_as`] in the child) and signalling processes ([`on_privileged`], used by
//! `process` for every kill) happen on that thread; nothing else does.
//!
//! Invariants: capabilities are per thread in Linux, so only the privileged thread holds any
//! (it runs only the jobs sent to it: fork/exec and kill); a tool server drops every capability
//! before exec (capset to nothing, ambient cleared), so it runs with none, under its own uid
//! and gid and the instance's gid as its one supplementary group (to read the bundle copy);
//! credentials change before the parent-death signal is set (a change of credentials clears
//! it), so callers register [`run_server_as`] before `own_group_dying_with_parent`.

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// The uid and gid a child runs as (its supplementary groups are dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunIdentity {
    pub uid: u32,
    pub gid: u32,
}

const CAP_KILL: u32 = 5;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;
/// What a separated instance's privileged thread keeps.
const INSTANCE_CAPS: [u32; 3] = [CAP_KILL, CAP_SETGID, CAP_SETUID];
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// This thread's capability sets (the low 32 capabilities, where every one we use is).
fn capget() -> std::io::Result<CapData> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    #[allow(unsafe_code)]
    // SAFETY: the header and a two-element data array are what version 3 reads and writes;
    // async-signal-safe (a raw syscall), so callable between fork and exec.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(data[0])
}

/// Sets this thread's capability sets (the high 32 to none).
fn capset(d: CapData) -> std::io::Result<()> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [d, CapData::default()];
    #[allow(unsafe_code)]
    // SAFETY: as in `capget`; the kernel only reads the data.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn mask(caps: &[u32]) -> u32 {
    caps.iter().fold(0, |m, c| m | (1 << c))
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Clears this thread's ambient set (EINVAL: a kernel without ambient capabilities).
fn clear_ambient() -> std::io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
    }
    Ok(())
}

/// Has the command's child (a separated instance) change to `id` (no supplementary groups)
/// keeping CAP_SETUID, CAP_SETGID and CAP_KILL of the Nest as ambient capabilities, so the
/// instance holds those three after exec and nothing else. Register it before
/// `own_group_dying_with_parent` (see the module invariants); do not also set `uid`/`gid` on the
/// command.
pub fn run_instance_as(cmd: &mut std::process::Command, id: RunIdentity) {
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: the closure runs between fork and exec and makes only raw system calls
    // (prctl, setgroups, setresgid, setresuid, capget, capset); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            check(libc::prctl(
                libc::PR_SET_KEEPCAPS,
                1 as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(id.gid, id.gid, id.gid))?;
            check(libc::setresuid(id.uid, id.uid, id.uid))?;
            let mut d = capget()?;
            let want = mask(&INSTANCE_CAPS) & d.permitted;
            if d.inheritable & want != want {
                // A root Nest's inheritable set is empty; a unit's holds its ambient set.
                d.inheritable |= want;
                d.effective = d.permitted;
                capset(d)?;
            }
            clear_ambient()?;
            for c in INSTANCE_CAPS {
                if want & (1 << c) != 0 {
                    check(libc::prctl(
                        libc::PR_CAP_AMBIENT,
                        libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                        c as libc::c_ulong,
                        0 as libc::c_ulong,
                        0 as libc::c_ulong,
                    ))?;
                }
            }
            check(libc::prctl(
                libc::PR_SET_KEEPCAPS,
                0 as libc::c_ulong,
                0,
                0,
                0,
            ))
        });
    }
}

/// Has the command's child (a tool server) change to `id` with `group` (its instance's gid) as
/// its one supplementary group and drop every capability before exec. Register it before
/// `own_group_dying_with_parent`; spawn on the privileged thread ([`on_privileged`]).
pub fn run_server_as(cmd: &mut std::process::Command, id: RunIdentity, group: u32) {
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: as in `run_instance_as`; `groups` lives on the child's stack.
    unsafe {
        cmd.pre_exec(move || {
            let groups = [group];
            check(libc::setgroups(1, groups.as_ptr()))?;
            check(libc::setresgid(id.gid, id.gid, id.gid))?;
            check(libc::setresuid(id.uid, id.uid, id.uid))?;
            clear_ambient()?;
            capset(CapData::default())
        });
    }
}

type Job = Box<dyn FnOnce() + Send>;

static PRIVILEGED: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();

thread_local! {
    static ON_PRIVILEGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Errors of [`keep_on_privileged_thread`].
#[derive(Debug, thiserror::Error)]
pub enum PrivilegedError {
    #[error(
        "the process already runs {0} threads: the capabilities can only be split while it has one"
    )]
    Threads(usize),
    #[error("cannot {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0: no ptrace, no `/proc/<pid>/mem`, no
/// `pidfd_getfd` by its own uid either) and, when it holds capabilities, starts the privileged
/// thread and drops every capability on the calling thread. Call it first, while the process
/// has one thread. Returns whether a privileged thread runs (never for root, which keeps
/// what it has: a Nest that does not separate).
pub fn keep_on_privileged_thread() -> Result<bool, PrivilegedError> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| PrivilegedError::Io {
        what: "make the process non-dumpable",
        source: e.into(),
    })?;
    let caps = capget().map_err(|source| PrivilegedError::Io {
        what: "read the capabilities",
        source,
    })?;
    // Root (a Nest that does not separate) keeps what root has; a process without
    // capabilities has nothing to split.
    if nix::unistd::geteuid().is_root() || caps.permitted == 0 {
        return Ok(false);
    }
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|rd| rd.count())
        .unwrap_or(0);
    if threads != 1 {
        return Err(PrivilegedError::Threads(threads));
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("agen-privileged".into())
        .spawn(move || {
            ON_PRIVILEGED.with(|f| f.set(true));
            for job in rx {
                // A job that panics loses its answer, never the thread.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        })
        .map_err(|source| PrivilegedError::Io {
            what: "start the privileged thread",
            source,
        })?;
    let _ = PRIVILEGED.set(Mutex::new(tx));
    clear_ambient().map_err(|source| PrivilegedError::Io {
        what: "clear the ambient capabilities",
        source,
    })?;
    capset(CapData::default()).map_err(|source| PrivilegedError::Io {
        what: "drop the capabilities of the main thread",
        source,
    })?;
    Ok(true)
}

/// Whether a privileged thread runs in this process.
pub fn has_privileged_thread() -> bool {
    PRIVILEGED.get().is_some()
}

/// Runs `f` on the privileged thread and returns its result; inline when there is none (or
/// when called from it).
pub fn on_privileged<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let Some(tx) = PRIVILEGED.get() else {
        return f();
    };
    if ON_PRIVILEGED.with(|v| v.get()) {
        return f();
    }
    let (rtx, rrx) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        let _ = rtx.send(f());
    });
    let sent = tx.lock().unwrap_or_else(|p| p.into_inner()).send(job);
    assert!(
        sent.is_ok(),
        "the privileged thread runs as long as the process"
    );
    rrx.recv().expect("a job on the privileged thread panicked")
}
