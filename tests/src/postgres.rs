//! A throwaway PostgreSQL 15 server for the tests (Debian's packages, run as the `postgres`
//! user, in a temp data dir, on a free loopback port), and one shared by every test of a test
//! process that needs only a database of its own ([`shared`], [`Cluster::database`]).
//!
//! Invariants: PostgreSQL missing is a failure, never a skip; a server is stopped
//! (`-m immediate`) when its [`Cluster`] drops, and the shared one when the process exits.

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::free_port;

pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A running server; stopped on drop.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// The server's options (`pg_ctl -o`), for [`Cluster::crash_and_restart`].
    opts: String,
}

impl Cluster {
    /// Starts a server (`fsync` on, as in production: durability tests kill it). `prepare` runs
    /// on the new folder first (owned by `postgres`, with `data` and `sock` in it) and returns
    /// more server options (` -c name=value …`).
    pub fn start(prepare: impl FnOnce(&Path, u32, u32) -> String) -> Cluster {
        let initdb = Path::new(PG_BIN).join("initdb");
        assert!(
            initdb.exists(),
            "{} is missing: PostgreSQL 15 must be installed for these tests (apt-get install -y postgresql; \
             tests/run.sh does it)",
            initdb.display()
        );
        let user = nix::unistd::User::from_name("postgres")
            .expect("look up the postgres user")
            .expect("the postgres user exists (Debian's postgresql package creates it)");
        let dir = tempfile::tempdir().expect("temp dir");
        for sub in ["data", "sock"] {
            std::fs::create_dir(dir.path().join(sub)).expect("create dir");
        }
        for path in [
            dir.path().to_path_buf(),
            dir.path().join("data"),
            dir.path().join("sock"),
        ] {
            chown(&path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .expect("chown to postgres");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        }
        let data = dir.path().join("data");
        let more = prepare(dir.path(), user.uid.as_raw(), user.gid.as_raw());
        as_postgres(&[
            &Path::new(PG_BIN).join("initdb").to_string_lossy(),
            "-D",
            &data.to_string_lossy(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]);
        // A free port can be taken between the probe and the bind: try a few.
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let opts = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300{more}",
                dir.path().join("sock").display()
            );
            let out = runuser(&[
                &Path::new(PG_BIN).join("pg_ctl").to_string_lossy(),
                "-D",
                &data.to_string_lossy(),
                "-l",
                &dir.path().join("server.log").to_string_lossy(),
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ]);
            if out.status.success() {
                return Cluster { dir, port, opts };
            }
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            last.push_str(
                &std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default(),
            );
        }
        panic!("postgres did not start: {last}");
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB?sslmode=disable`.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// Creates a new, empty database named after `stem` (unique in this process) and returns
    /// its name.
    pub fn database(&self, stem: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let name = format!(
            "{stem}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        name
    }

    /// Runs SQL through `psql` (not through the code under test) and returns its unaligned
    /// output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = runuser(&[
            &Path::new(PG_BIN).join("psql").to_string_lossy(),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            db,
            "-c",
            sql,
        ]);
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Stops the server as a crash does (`-m immediate`: no checkpoint, what sat in its WAL
    /// buffers is gone) and starts it again on the same port; it replays its WAL.
    pub fn crash_and_restart(&self) {
        self.crash_and_restart_after(std::time::Duration::ZERO);
    }

    /// [`Cluster::crash_and_restart`], the server down for `down` in between.
    pub fn crash_and_restart_after(&self, down: std::time::Duration) {
        let data = self.dir.path().join("data");
        Self::stop(&data);
        std::thread::sleep(down);
        as_postgres(&[
            &Path::new(PG_BIN).join("pg_ctl").to_string_lossy(),
            "-D",
            &data.to_string_lossy(),
            "-l",
            &self.dir.path().join("server.log").to_string_lossy(),
            "-o",
            &self.opts,
            "-w",
            "-t",
            "60",
            "start",
        ]);
    }

    fn stop(data: &Path) {
        let _ = runuser(&[
            &Path::new(PG_BIN).join("pg_ctl").to_string_lossy(),
            "-D",
            &data.to_string_lossy(),
            "-m",
            "immediate",
            "-w",
            "stop",
        ]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        Self::stop(&self.dir.path().join("data"));
    }
}

/// The server every test of this process shares (a database per test): started on first use,
/// stopped and removed when the process exits.
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Cluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        let cluster = Cluster::start(|_, _, _| String::new());
        extern "C" fn stop_shared() {
            if let Some(c) = SHARED.get() {
                Cluster::stop(&c.dir.path().join("data"));
                let _ = std::fs::remove_dir_all(c.dir.path());
            }
        }
        // SAFETY: registers a plain function with no arguments, run once at exit.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(stop_shared);
        }
        cluster
    })
}

pub fn runuser(args: &[&str]) -> std::process::Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run runuser (util-linux)")
}

pub fn as_postgres(args: &[&str]) {
    let out = runuser(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
