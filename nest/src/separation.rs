//! Who instances run as: a uid of their own from a range (`--run-uids`, the default when the
//! Nest may change uids), one pinned user (`--run-as USER`), or the Nest's own user
//! (`--run-as-self`, or a Nest without the privilege to change uids). Also each separated
//! instance's run dir, `<run root>/<instance>/{bundle,home,tmp}`, owned by its uid, where the
//! run root is a runtime folder outside the data dir (`/run/agen/nest-<hash of the data dir>`,
//! else under the system temp dir) holding the Nest's socket too.
//!
//! Invariants: with a range, a uid is handed to one instance at a time: the allocation is
//! persisted in `<data-dir>/run-uids.json` before the instance starts, and a uid is free again
//! only once no process runs under it (every process of the uid is killed when its instance is
//! gone, and at start for the uids a previous run of this Nest left); a uid that some other
//! process on the host runs as is never handed out; uid and gid 0 are never handed out; the
//! Nest's data dir stays 0700 (a separated instance never reaches it): the run root is 0711 (no
//! listing) in folders everyone may pass, so a separated instance reaches only its own run dir
//! and the socket; an `agen` binary other users cannot run (under a 0700 home) is copied into
//! the run root for them.

mod run_root;
pub use run_root::runtime_root;
use run_root::separated_run_root;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use agen_shared::process::{self as group, RunIdentity};
use serde::{Deserialize, Serialize};

/// The default `--run-uids` range.
pub const DEFAULT_UIDS: (u32, u32) = (61000, 61999);

/// What the options ask for (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAs {
    /// A uid (and the same gid) of its own per instance, from `first..=last`.
    Uids { first: u32, last: u32 },
    /// Every instance as this user (looked up by name).
    User(String),
    /// No separation: instances run as the Nest's user.
    Myself,
}

impl Default for RunAs {
    fn default() -> Self {
        RunAs::Uids {
            first: DEFAULT_UIDS.0,
            last: DEFAULT_UIDS.1,
        }
    }
}

impl RunAs {
    /// Slice `i` of `n` of a range (several Nests of one `agen up` never share a uid); a user
    /// or `Myself` is kept. A range too small for `n` is kept whole (the live-process check
    /// still keeps one uid to one instance).
    pub fn slice(&self, i: u32, n: u32) -> RunAs {
        match self {
            RunAs::Uids { first, last } if n > 1 && last - first + 1 >= n => {
                let per = (last - first + 1) / n;
                let start = first + i * per;
                let end = if i + 1 == n { *last } else { start + per - 1 };
                RunAs::Uids {
                    first: start,
                    last: end,
                }
            }
            other => other.clone(),
        }
    }
}

/// Parses `--run-uids FIRST-LAST`; the error names the value and the form.
pub fn parse_uid_range(s: &str) -> Result<RunAs, String> {
    let bad =
        || format!("--run-uids {s}: expected FIRST-LAST with 0 < FIRST <= LAST, e.g. 61000-61999");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let first: u32 = a.trim().parse().map_err(|_| bad())?;
    let last: u32 = b.trim().parse().map_err(|_| bad())?;
    if first == 0 || first > last {
        return Err(bad());
    }
    Ok(RunAs::Uids { first, last })
}

/// Why instances run as the Nest's own user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffReason {
    /// `--run-as-self`.
    RunAsSelf,
    /// The Nest cannot change uids (not root, no CAP_SETUID/CAP_SETGID/CAP_CHOWN).
    NotPrivileged,
}

/// The resolved mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Range { first: u32, last: u32 },
    User { name: String, id: RunIdentity },
    Off(OffReason),
}

/// Errors resolving or applying the separation.
#[derive(Debug, thiserror::Error)]
pub enum SeparationError {
    #[error("--run-as {name}: {reason}")]
    User { name: String, reason: String },
    #[error("no free uid in {first}-{last} (--run-uids): the instance needs {need} (one for itself, one per tool server) and every other one is held by an instance or a running process; widen the range or stop an instance")]
    Exhausted { first: u32, last: u32, need: usize },
    #[error("{path}: {action}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Unreachable(String),
    #[error("{0}")]
    RunRoot(String),
}

type Result<T, E = SeparationError> = std::result::Result<T, E>;

fn io(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> SeparationError {
    let path = path.to_path_buf();
    move |source| SeparationError::Io {
        path,
        action,
        source,
    }
}

/// The persisted allocation: instance id → uid.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Allocations {
    #[serde(default)]
    instances: BTreeMap<String, u32>,
    /// Each instance's tool servers' uids (one per command server).
    #[serde(default)]
    servers: BTreeMap<String, Vec<u32>>,
}

impl Allocations {
    fn all_of(&self, id: &str) -> Vec<u32> {
        let mut v: Vec<u32> = self.instances.get(id).copied().into_iter().collect();
        v.extend(self.servers.get(id).into_iter().flatten().copied());
        v
    }
}

/// The uids of one instance: its own, and one per command server (empty unless the Nest hands
/// out a range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uids {
    pub instance: RunIdentity,
    pub servers: Vec<u32>,
}

/// A command server of a bundle as the run dir sees it: its name and, for `agen mcp workspace
/// --root R` with R inside the bundle, that folder (relative), which its uid gets to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPlan {
    pub name: String,
    pub writable: Option<PathBuf>,
}

/// The command servers of `bundle`, in `mcp.json` order (by name).
pub fn server_plan(bundle: &agen_shared::bundle::Bundle) -> Vec<ServerPlan> {
    use agen_shared::bundle::ServerSpec;
    bundle
        .mcp
        .servers
        .iter()
        .filter_map(|(name, spec)| match spec {
            ServerSpec::Command { command, args, .. } => Some(ServerPlan {
                name: name.clone(),
                writable: (command == "agen")
                    .then(|| workspace_root_arg(args))
                    .flatten(),
            }),
            ServerSpec::Url { .. } => None,
        })
        .collect()
}

/// `mcp workspace --root R` (or `--root=R`) with R relative and never above the bundle.
fn workspace_root_arg(args: &[String]) -> Option<PathBuf> {
    if args.first().map(String::as_str) != Some("mcp")
        || args.get(1).map(String::as_str) != Some("workspace")
    {
        return None;
    }
    let mut it = args.iter().skip(2);
    let mut root = None;
    while let Some(a) = it.next() {
        if a == "--root" {
            root = it.next().cloned();
        } else if let Some(v) = a.strip_prefix("--root=") {
            root = Some(v.to_string());
        }
    }
    let root = PathBuf::from(root?);
    let inside = root.components().all(|c| {
        matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    inside.then_some(root)
}

/// The resolved separation of one Nest (see the module doc).
#[derive(Debug)]
pub struct Separation {
    mode: Mode,
    data_dir: PathBuf,
    /// Where run dirs and the socket live while separating (see the module doc).
    run_root: PathBuf,
    allocated: Mutex<Allocations>,
}

/// Whether this process may change uids and chown: root, or CAP_SETUID + CAP_SETGID +
/// CAP_CHOWN in its effective set (a systemd unit's ambient capabilities).
pub fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    // CAP_CHOWN 0, CAP_SETGID 6, CAP_SETUID 7.
    let need = (1 << 0) | (1 << 6) | (1 << 7);
    eff & need == need
}

impl Separation {
    /// Resolves `run_as` for a Nest whose data dir is `data_dir` (already prepared). With a
    /// range, kills whatever still runs under the uids a previous run of this Nest handed out
    /// and clears the run dirs it left. Logs the mode once.
    pub fn resolve(run_as: &RunAs, data_dir: &Path) -> Result<Separation> {
        Separation::resolve_in(run_as, data_dir, None)
    }

    /// [`Separation::resolve`] with the `--run-root` folder (`None`: `/run/agen`, and a
    /// separating Nest without a writable `/run` refuses to start).
    pub fn resolve_in(
        run_as: &RunAs,
        data_dir: &Path,
        run_root: Option<&Path>,
    ) -> Result<Separation> {
        let mode = match run_as {
            RunAs::Myself => Mode::Off(OffReason::RunAsSelf),
            _ if !privileged() => Mode::Off(OffReason::NotPrivileged),
            RunAs::Uids { first, last } => Mode::Range {
                first: *first,
                last: *last,
            },
            RunAs::User(name) => {
                let user = nix::unistd::User::from_name(name)
                    .map_err(|e| SeparationError::User {
                        name: name.clone(),
                        reason: format!("cannot look the user up: {e}"),
                    })?
                    .ok_or_else(|| SeparationError::User {
                        name: name.clone(),
                        reason: "no such user on this host; create it or pick another".into(),
                    })?;
                if user.uid.is_root() || user.gid.as_raw() == 0 {
                    return Err(SeparationError::User {
                        name: name.clone(),
                        reason: "is uid or gid 0: that is no separation; use --run-as-self".into(),
                    });
                }
                Mode::User {
                    name: name.clone(),
                    id: RunIdentity {
                        uid: user.uid.as_raw(),
                        gid: user.gid.as_raw(),
                    },
                }
            }
        };
        let on = !matches!(mode, Mode::Off(_));
        let sep = Separation {
            run_root: if on {
                separated_run_root(run_root, data_dir)?
            } else {
                runtime_root(data_dir)
            },
            mode,
            data_dir: data_dir.to_path_buf(),
            allocated: Mutex::new(Allocations::default()),
        };
        if sep.is_on() {
            sep.open_up()?;
            sep.clear_leftovers()?;
        }
        match &sep.mode {
            Mode::Off(OffReason::RunAsSelf) => tracing::warn!(
                "instance separation is off (--run-as-self): instances and tool servers run as the nest's own user"
            ),
            Mode::Off(OffReason::NotPrivileged) => tracing::warn!(
                "instance separation is off: this nest is not root (nor has CAP_SETUID, CAP_SETGID, CAP_CHOWN), so instances and tool servers run as its own user"
            ),
            _ => tracing::info!(separation = %sep.describe(), "instances run under their own uid"),
        }
        Ok(sep)
    }

    /// No separation (tests of the supervisor alone).
    pub fn off() -> Separation {
        Separation {
            mode: Mode::Off(OffReason::RunAsSelf),
            data_dir: PathBuf::new(),
            run_root: PathBuf::new(),
            allocated: Mutex::new(Allocations::default()),
        }
    }

    /// The uids this Nest's instances and tool servers run as (none when it does not
    /// separate: they are its own).
    pub fn instance_uids(&self) -> Option<std::ops::RangeInclusive<u32>> {
        match &self.mode {
            Mode::Range { first, last } => Some(*first..=*last),
            Mode::User { id, .. } => Some(id.uid..=id.uid),
            Mode::Off(_) => None,
        }
    }

    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    pub fn is_on(&self) -> bool {
        !matches!(self.mode, Mode::Off(_))
    }

    /// For `agen nests`: `uid range 61000-61999`, `user agent (uid 1001)`, `off (run-as-self)`,
    /// `off (not root)`.
    pub fn describe(&self) -> String {
        match &self.mode {
            Mode::Range { first, last } => format!("uid range {first}-{last}"),
            Mode::User { name, id } => format!("user {name} (uid {})", id.uid),
            Mode::Off(OffReason::RunAsSelf) => "off (run-as-self)".into(),
            Mode::Off(OffReason::NotPrivileged) => "off (not root)".into(),
        }
    }

    fn allocations_file(&self) -> PathBuf {
        self.data_dir.join("run-uids.json")
    }

    /// Where the instances' run dirs (and, while separating, the socket) live.
    pub fn run_root(&self) -> PathBuf {
        self.run_root.clone()
    }

    /// The folder of the Nest's socket: the run root while separating, else the data dir.
    pub fn socket_dir(&self) -> PathBuf {
        if self.is_on() {
            self.run_root.clone()
        } else {
            self.data_dir.clone()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Allocations> {
        self.allocated.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save(&self, a: &Allocations) -> Result<()> {
        let path = self.allocations_file();
        let body = serde_json::to_vec_pretty(a).map_err(|e| SeparationError::Io {
            path: path.clone(),
            action: "cannot encode",
            source: std::io::Error::other(e),
        })?;
        // Atomically: a crash mid-write must not lose which uids are handed out.
        let tmp = self.data_dir.join(".run-uids.json.tmp");
        agen_shared::private::write_file(&tmp, &body).map_err(io(&tmp, "cannot write"))?;
        std::fs::rename(&tmp, &path).map_err(io(&path, "cannot write"))
    }

    /// The run root is made (0711: others pass, never list, in folders of 0711 up to a
    /// folder everyone may pass), so a separated uid reaches its run dir and the socket and
    /// nothing else; the data dir stays 0700.
    fn open_up(&self) -> Result<()> {
        let run = self.run_root();
        std::fs::create_dir_all(&run).map_err(io(&run, "cannot create"))?;
        let mut dir = Some(run.as_path());
        // The run root and the folders made for it (`/run/agen`, `agen-run`) are 0711.
        for _ in 0..2 {
            let Some(d) = dir else { break };
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))
                .map_err(io(d, "cannot make traversable (0711)"))?;
            dir = d.parent();
        }
        self.passable_up_to(&run, "reach the nest's socket in")
    }

    /// Every folder above `path` must let other users through (o+x); else an error names the
    /// first that does not.
    fn passable_up_to(&self, path: &Path, what: &str) -> Result<()> {
        let mut at = path.parent();
        while let Some(dir) = at {
            let mode = std::fs::metadata(dir)
                .map_err(io(dir, "cannot inspect"))?
                .permissions()
                .mode();
            if mode & 0o001 == 0 {
                return Err(SeparationError::Unreachable(format!(
                    "{} (mode {:o}) does not let other users through, so instances under their own uid cannot {what} {}; chmod o+x {} (listing stays off) or pass --run-as-self",
                    dir.display(),
                    mode & 0o7777,
                    path.display(),
                    dir.display()
                )));
            }
            at = dir.parent();
        }
        Ok(())
    }

    /// The `agen` binary separated instances run: `agen_bin` when other users can run it
    /// (it and every folder above it let them through), else a copy of it in the run root
    /// (0755), made at every start.
    pub fn runnable_bin(&self, agen_bin: &Path) -> Result<PathBuf> {
        if !self.is_on() {
            return Ok(agen_bin.to_path_buf());
        }
        let mut at = Some(agen_bin);
        let mut runnable = true;
        while let Some(p) = at {
            let mode = std::fs::metadata(p)
                .map_err(io(p, "cannot inspect"))?
                .permissions()
                .mode();
            if mode & 0o001 == 0 {
                runnable = false;
                break;
            }
            at = p.parent();
        }
        if runnable {
            return Ok(agen_bin.to_path_buf());
        }
        let bin_dir = self.run_root.join("bin");
        std::fs::create_dir_all(&bin_dir).map_err(io(&bin_dir, "cannot create"))?;
        std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o711))
            .map_err(io(&bin_dir, "cannot make traversable (0711)"))?;
        let copy = bin_dir.join("agen");
        let tmp = bin_dir.join(".agen.tmp");
        std::fs::copy(agen_bin, &tmp).map_err(io(&tmp, "cannot copy the agen binary to"))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(io(&tmp, "cannot make runnable"))?;
        std::fs::rename(&tmp, &copy).map_err(io(&copy, "cannot write"))?;
        tracing::info!(from = %agen_bin.display(), to = %copy.display(), "other users cannot run the agen binary where it is: separated instances run a copy");
        Ok(copy)
    }

    /// Kills every process under a uid a previous run of this Nest handed out, frees those
    /// uids and removes the run dirs left behind.
    fn clear_leftovers(&self) -> Result<()> {
        let path = self.allocations_file();
        let old: Allocations = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Allocations::default(),
            Err(e) => return Err(io(&path, "cannot read")(e)),
        };
        if matches!(self.mode, Mode::Range { .. }) {
            for instance in old.instances.keys().chain(old.servers.keys()) {
                for uid in old.all_of(instance) {
                    let killed = group::kill_uid(uid);
                    if !killed.is_empty() {
                        tracing::warn!(instance = %instance, uid, killed = killed.len(), "killed leftovers of a previous run of this nest under the instance's uid");
                    }
                }
            }
        }
        self.save(&Allocations::default())?;
        let run = self.run_root();
        if let Ok(rd) = std::fs::read_dir(&run) {
            for e in rd.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(())
    }

    /// The uids instance `id` and its `servers` command servers run as (`None`: the Nest's
    /// own), allocated and persisted before they are returned. The same instance keeps them
    /// until [`Separation::release`]. With a pinned user the servers share it (no uids).
    pub fn acquire(&self, id: &str, servers: usize) -> Result<Option<Uids>> {
        let (first, last) = match &self.mode {
            Mode::Off(_) => return Ok(None),
            Mode::User { id, .. } => {
                return Ok(Some(Uids {
                    instance: *id,
                    servers: Vec::new(),
                }))
            }
            Mode::Range { first, last } => (*first, *last),
        };
        let mut a = self.lock();
        if let Some(uid) = a.instances.get(id).copied() {
            let have = a.servers.get(id).cloned().unwrap_or_default();
            if have.len() == servers {
                return Ok(Some(Uids {
                    instance: RunIdentity { uid, gid: uid },
                    servers: have,
                }));
            }
        }
        let mut taken = group::uids_in_use();
        for (other, uid) in &a.instances {
            if other != id {
                taken.insert(*uid);
            }
        }
        for (other, uids) in &a.servers {
            if other != id {
                taken.extend(uids.iter().copied());
            }
        }
        let need = 1 + servers;
        let free: Vec<u32> = (first..=last)
            .filter(|u| !taken.contains(u))
            .take(need)
            .collect();
        if free.len() < need {
            return Err(SeparationError::Exhausted { first, last, need });
        }
        a.instances.insert(id.to_string(), free[0]);
        a.servers.insert(id.to_string(), free[1..].to_vec());
        self.save(&a)?;
        Ok(Some(Uids {
            instance: RunIdentity {
                uid: free[0],
                gid: free[0],
            },
            servers: free[1..].to_vec(),
        }))
    }

    /// Instance `id`'s process ended (it may start again): whatever still runs under its tool
    /// servers' uids (a double-forked child of a server that its instance, killed, could not
    /// reap) is killed; those uids are its alone.
    pub fn kill_servers(&self, id: &str) {
        let uids = self.lock().servers.get(id).cloned().unwrap_or_default();
        for uid in uids {
            let killed = group::kill_uid(uid);
            if !killed.is_empty() {
                tracing::info!(instance = %id, uid, killed = killed.len(), "killed what a tool server of the instance left behind");
            }
        }
    }

    /// Instance `id` is gone: with a range, every process still under its uids is killed and
    /// the uids freed; its run dir is removed.
    pub fn release(&self, id: &str) {
        if !self.is_on() {
            return;
        }
        if matches!(self.mode, Mode::Range { .. }) {
            let mut a = self.lock();
            for uid in a.all_of(id) {
                let killed = group::kill_uid(uid);
                if !killed.is_empty() {
                    tracing::info!(instance = %id, uid, killed = killed.len(), "killed what was left under the uid of a stopped instance");
                }
            }
            if a.instances.remove(id).is_some() | a.servers.remove(id).is_some() {
                if let Err(e) = self.save(&a) {
                    tracing::warn!(instance = %id, "{e}");
                }
            }
        }
        let dir = self.run_root().join(id);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(instance = %id, dir = %dir.display(), "cannot remove the run dir: {e}");
            }
        }
    }

    /// Makes `<run>/<id>/{bundle,home,tmp}` owned by `who` (0700): `bundle` a copy of
    /// `bundle_dir` (made again at every spawn, see [`Separation::fresh_bundle`]). With server
    /// uids, each command server of `plan` gets `<run>/<id>/servers/<n>/{home,tmp}` owned by
    /// its uid (0700), the run dir and the bundle copy become passable and readable by the
    /// instance's group (0710, 0750/0640), and a workspace server's `--root` inside the
    /// bundle becomes its uid's. Returns the dirs.
    pub fn prepare_run_dir(
        &self,
        id: &str,
        uids: &Uids,
        bundle_dir: &Path,
        plan: &[ServerPlan],
    ) -> Result<RunDirs> {
        let who = uids.instance;
        let root = self.run_root().join(id);
        if root.exists() {
            std::fs::remove_dir_all(&root).map_err(io(&root, "cannot clear"))?;
        }
        let mut dirs = RunDirs {
            bundle: root.join("bundle"),
            home: root.join("home"),
            tmp: root.join("tmp"),
            seats: BTreeMap::new(),
            writable: Vec::new(),
        };
        for d in [&root, &dirs.home, &dirs.tmp] {
            agen_shared::private::create_dir_all(d).map_err(io(d, "cannot create"))?;
        }
        for d in [&dirs.home, &dirs.tmp] {
            chown(d, who)?;
        }
        chown(&root, who)?;
        let seated = !uids.servers.is_empty() && uids.servers.len() == plan.len();
        if seated {
            set_mode(&root, 0o710)?;
            let servers = root.join("servers");
            agen_shared::private::create_dir_all(&servers)
                .map_err(io(&servers, "cannot create"))?;
            chown(&servers, who)?;
            set_mode(&servers, 0o710)?;
            for (n, (p, uid)) in plan.iter().zip(&uids.servers).enumerate() {
                let own = RunIdentity {
                    uid: *uid,
                    gid: *uid,
                };
                let base = servers.join(n.to_string());
                let (home, tmp) = (base.join("home"), base.join("tmp"));
                for d in [&base, &home, &tmp] {
                    agen_shared::private::create_dir_all(d).map_err(io(d, "cannot create"))?;
                    chown(d, own)?;
                }
                dirs.seats.insert(
                    p.name.clone(),
                    agen_harness::mcp::ServerSeat {
                        uid: *uid,
                        gid: *uid,
                        group: who.gid,
                        home,
                        tmp,
                    },
                );
                if let Some(w) = &p.writable {
                    dirs.writable.push((w.clone(), *uid));
                }
            }
        }
        self.fresh_bundle(&dirs, who, bundle_dir)?;
        Ok(dirs)
    }

    /// Replaces the instance's bundle copy with a fresh one of the verified `bundle_dir`, owned
    /// by `who`: what a previous spawn (or its model, through `run`) changed in it, its
    /// permissions included, never reaches the next start.
    pub fn fresh_bundle(&self, dirs: &RunDirs, who: RunIdentity, bundle_dir: &Path) -> Result<()> {
        match std::fs::remove_dir_all(&dirs.bundle) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&dirs.bundle, "cannot clear")(e)),
        }
        copy_tree(bundle_dir, &dirs.bundle)?;
        chown_tree(&dirs.bundle, who, who.gid)?;
        if dirs.seats.is_empty() {
            return Ok(());
        }
        share_with_group(&dirs.bundle)?;
        for (rel, uid) in &dirs.writable {
            let at = dirs.bundle.join(rel);
            if !at.exists() {
                agen_shared::private::create_dir_all(&at).map_err(io(&at, "cannot create"))?;
                set_mode(&at, 0o750)?;
            }
            let server = RunIdentity {
                uid: *uid,
                gid: *uid,
            };
            chown_tree(&at, server, who.gid)?;
        }
        Ok(())
    }
}

/// A separated instance's own dirs, and who its command servers run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDirs {
    pub bundle: PathBuf,
    pub home: PathBuf,
    pub tmp: PathBuf,
    /// Each command server's uid and dirs (empty: they run as the instance).
    pub seats: BTreeMap<String, agen_harness::mcp::ServerSeat>,
    /// Folders of the bundle copy (relative) a workspace server's uid writes.
    writable: Vec<(PathBuf, u32)>,
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io(path, "cannot set the mode of"))
}

/// The bundle copy readable by the instance's group (its tool servers): folders 0750, files
/// 0640 (0750 when executable); symlinks are left alone (a verified bundle has none).
fn share_with_group(root: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(root).map_err(io(root, "cannot inspect"))?;
    if meta.is_dir() {
        set_mode(root, 0o750)?;
        for entry in std::fs::read_dir(root).map_err(io(root, "cannot read"))? {
            let entry = entry.map_err(io(root, "cannot read"))?;
            share_with_group(&entry.path())?;
        }
    } else if meta.is_file() {
        let exec = meta.permissions().mode() & 0o100 != 0;
        set_mode(root, if exec { 0o750 } else { 0o640 })?;
    }
    Ok(())
}

fn chown(path: &Path, who: RunIdentity) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(who.uid), Some(who.gid))
        .map_err(io(path, "cannot chown to the instance's uid"))
}

/// Copies `from` into `to` (created): folders 0700, files with their owner bits (0600, or 0700
/// for an executable); symlinks are not followed (a verified bundle has none).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    agen_shared::private::create_dir_all(to).map_err(io(to, "cannot create"))?;
    for entry in std::fs::read_dir(from).map_err(io(from, "cannot read"))? {
        let entry = entry.map_err(io(from, "cannot read"))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ft = entry.file_type().map_err(io(&src, "cannot inspect"))?;
        if ft.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ft.is_file() {
            std::fs::copy(&src, &dst).map_err(io(&src, "cannot copy"))?;
            let mode = std::fs::metadata(&src)
                .map_err(io(&src, "cannot inspect"))?
                .permissions()
                .mode();
            let mode = if mode & 0o111 != 0 { 0o700 } else { 0o600 };
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode))
                .map_err(io(&dst, "cannot set the mode of"))?;
        }
    }
    Ok(())
}

fn chown_tree(root: &Path, who: RunIdentity, gid: u32) -> Result<()> {
    chown(root, RunIdentity { uid: who.uid, gid })?;
    if std::fs::symlink_metadata(root)
        .map_err(io(root, "cannot inspect"))?
        .is_dir()
    {
        for entry in std::fs::read_dir(root).map_err(io(root, "cannot read"))? {
            let entry = entry.map_err(io(root, "cannot read"))?;
            chown_tree(&entry.path(), who, gid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_are_parsed_and_bad_ones_named() {
        assert_eq!(
            parse_uid_range("61000-61999"),
            Ok(RunAs::Uids {
                first: 61000,
                last: 61999
            })
        );
        assert_eq!(
            parse_uid_range("5-5"),
            Ok(RunAs::Uids { first: 5, last: 5 })
        );
        for bad in ["0-10", "10-5", "abc", "61000", "-1-5"] {
            let e = parse_uid_range(bad).expect_err(bad);
            assert!(e.starts_with(&format!("--run-uids {bad}:")), "{e}");
        }
    }

    #[test]
    fn an_agen_binary_other_uids_cannot_run_is_copied_where_they_can() {
        let runtime = tempfile::tempdir().expect("tempdir");
        let sep = Separation {
            mode: Mode::Range { first: 1, last: 2 },
            data_dir: PathBuf::new(),
            run_root: runtime.path().join("nest-x"),
            allocated: Mutex::new(Allocations::default()),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let bin = dir.path().join("agen");
        std::fs::write(&bin, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // /tmp and / let others through: the binary is used where it is.
        assert_eq!(sep.runnable_bin(&bin).expect("0755"), bin);
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let copy = sep.runnable_bin(&bin).expect("copied");
        assert_eq!(copy, runtime.path().join("nest-x/bin/agen"));
        let mode = std::fs::metadata(&copy).expect("copy").permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(std::fs::read(&copy).expect("read"), b"#!/bin/sh\n");
        assert_eq!(
            Separation::off()
                .runnable_bin(Path::new("/nonexistent"))
                .expect("off"),
            PathBuf::from("/nonexistent")
        );
    }

    #[test]
    fn the_run_root_is_outside_the_data_dir_and_one_per_data_dir() {
        let a = runtime_root(Path::new("/var/lib/agen/nest-a"));
        let b = runtime_root(Path::new("/var/lib/agen/nest-b"));
        assert_ne!(a, b);
        assert!(!a.starts_with("/var/lib/agen"), "{}", a.display());
        assert_eq!(a, runtime_root(Path::new("/var/lib/agen/nest-a")));
    }

    #[test]
    fn the_nests_of_one_up_get_disjoint_slices() {
        let r = RunAs::Uids {
            first: 61000,
            last: 61999,
        };
        let slices: Vec<RunAs> = (0..3).map(|i| r.slice(i, 3)).collect();
        assert_eq!(
            slices,
            vec![
                RunAs::Uids {
                    first: 61000,
                    last: 61332
                },
                RunAs::Uids {
                    first: 61333,
                    last: 61665
                },
                RunAs::Uids {
                    first: 61666,
                    last: 61999
                },
            ]
        );
        assert_eq!(r.slice(0, 1), r);
        assert_eq!(RunAs::Myself.slice(1, 2), RunAs::Myself);
    }

    #[test]
    fn a_range_hands_each_instance_its_own_uid_and_frees_it_when_released() {
        if !privileged() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        let data = dir.path().join("nest");
        agen_shared::private::create_dir_all(&data).expect("mkdir");
        let run_as = RunAs::Uids {
            first: 62990,
            last: 62991,
        };
        let sep = Separation::resolve(&run_as, &data).expect("resolve");
        let a = sep
            .acquire("a", 0)
            .expect("a")
            .expect("an identity")
            .instance;
        let b = sep
            .acquire("b", 0)
            .expect("b")
            .expect("an identity")
            .instance;
        assert_ne!(a.uid, b.uid);
        assert_eq!(
            sep.acquire("a", 0).expect("again").map(|i| i.instance.uid),
            Some(a.uid)
        );
        assert!(matches!(
            sep.acquire("c", 0),
            Err(SeparationError::Exhausted { .. })
        ));
        // Persisted: a restart knows which uids were handed out.
        let saved = std::fs::read_to_string(data.join("run-uids.json")).expect("saved");
        assert!(saved.contains(&a.uid.to_string()), "{saved}");
        sep.release("a");
        assert_eq!(
            sep.acquire("c", 0).expect("c").map(|i| i.instance.uid),
            Some(a.uid)
        );
    }

    #[test]
    fn an_instance_and_each_of_its_servers_get_uids_of_their_own_or_it_waits_for_them() {
        if !privileged() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        let data = dir.path().join("nest");
        agen_shared::private::create_dir_all(&data).expect("mkdir");
        let run_as = RunAs::Uids {
            first: 62980,
            last: 62984,
        };
        let sep = Separation::resolve(&run_as, &data).expect("resolve");
        let a = sep.acquire("a", 2).expect("a").expect("uids");
        let mut all: Vec<u32> = a.servers.clone();
        all.push(a.instance.uid);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 3, "{a:?}");
        // Two left: an instance with two servers needs three.
        let e = sep.acquire("b", 2).expect_err("exhausted");
        assert!(
            e.to_string().starts_with("no free uid in 62980-62984"),
            "{e}"
        );
        let b = sep.acquire("b", 1).expect("b").expect("uids");
        assert!(!all.contains(&b.instance.uid) && !all.contains(&b.servers[0]));
        sep.release("a");
        assert!(sep.acquire("c", 2).is_ok());
    }

    #[test]
    fn a_workspace_root_inside_the_bundle_is_found_and_one_above_it_is_not() {
        let check = |args: &[&str], expected: Option<&str>| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            assert_eq!(
                workspace_root_arg(&args),
                expected.map(PathBuf::from),
                "{args:?}"
            );
        };
        check(&["mcp", "workspace", "--root", "."], Some("."));
        check(
            &["mcp", "workspace", "--root=./notes", "--no-run"],
            Some("./notes"),
        );
        check(&["mcp", "workspace", "--root", "../x"], None);
        check(&["mcp", "workspace", "--root", "/srv/repo"], None);
        check(&["mcp", "sql"], None);
    }
}
