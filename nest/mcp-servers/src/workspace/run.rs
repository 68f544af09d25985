//! The `run` tool: `sh -c COMMAND` in the workspace root, in its own process group.
//!
//! Invariants:
//! - stdout and stderr go to one pipe (so their order is kept); only the last
//!   [`OUTPUT_TAIL_CHARS`] characters are kept in memory, however much is printed.
//! - On a timeout, a cancelled call or a dropped call, the whole process group and every
//!   descendant of the shell (ones that `setsid` into a group of their own included) get SIGKILL
//!   (children that trap or ignore SIGTERM included) and are reaped before the reply is built:
//!   the reply never races the kill. Groups and trees are killed by `agen_shared::process`.
//! - When the shell exits by itself, background processes it left behind are not killed; the
//!   output is read until they close it or for [`DRAIN_GRACE`] at most, and their group is
//!   reported ([`RunOutcome::leftover_group`]) so the server can kill it when it exits.
//! - `run` confines only the working directory: the command is a real shell as this user.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use agen_shared::process::{self as procs, GroupGuard};
use nix::sys::signal::Signal;
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::error::{Result, WorkspaceError};

/// How many characters of output `run` returns: the last ones.
pub const OUTPUT_TAIL_CHARS: usize = 20_000;
/// The longest timeout a call may ask for.
pub const MAX_RUN_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// How long output is still read after the shell exited (background processes may hold it).
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Bytes kept for the tail: enough for OUTPUT_TAIL_CHARS characters of 4-byte UTF-8.
const TAIL_BYTES: usize = OUTPUT_TAIL_CHARS * 4;

/// Arguments of `run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// Shell command, run with `sh -c` in the workspace root.
    pub command: String,
    /// Seconds before the command and everything it started are killed (default: the server's --run-timeout, 2 minutes unless set; at most 900).
    #[serde(default)]
    #[schemars(range(min = 1, max = 900))]
    pub timeout: Option<u64>,
}

/// How a `run` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// The shell exited with this code.
    Exited(i32),
    /// The shell was killed by this signal (not by us).
    Signalled(i32),
    /// The timeout passed; the process group was killed.
    TimedOut(Duration),
    /// The call was cancelled by the client; the process group was killed.
    Cancelled,
}

/// The outcome of a `run`.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub end: RunEnd,
    /// The last [`OUTPUT_TAIL_CHARS`] characters of combined stdout and stderr.
    pub output: String,
    /// Characters printed in total.
    pub total_chars: usize,
    /// Background processes still held the output when the reply was made.
    pub output_left_open: bool,
    /// The process group of background processes still running after the shell exited.
    pub leftover_group: Option<i32>,
}

impl RunOutcome {
    /// The tool result text.
    pub fn render(&self) -> String {
        let mut text = match &self.end {
            RunEnd::Exited(code) => format!("exit code: {code}"),
            RunEnd::Signalled(sig) => format!("exit code: none (killed by signal {sig})"),
            RunEnd::TimedOut(after) => format!(
                "timed out after {}: the command and every process it started were killed (exit code: none)",
                humantime::format_duration(*after)
            ),
            RunEnd::Cancelled => "cancelled: the command and every process it started were killed".to_string(),
        };
        if self.output.is_empty() {
            text.push_str("\n(no output)");
        } else if self.total_chars > OUTPUT_TAIL_CHARS {
            text.push_str(&format!(
                "\noutput (the last {OUTPUT_TAIL_CHARS} of {} characters; earlier output was cut):\n",
                self.total_chars
            ));
            text.push_str(&self.output);
        } else {
            text.push_str("\noutput:\n");
            text.push_str(&self.output);
        }
        if let Some(pgid) = self.leftover_group {
            text.push_str(&format!(
                "\n(background processes it started are still running in process group {pgid}; they are stopped when the workspace server exits)"
            ));
        }
        if self.output_left_open {
            text.push_str(&format!(
                "\n(background processes still hold the output; anything they print after {} is not shown)",
                humantime::format_duration(DRAIN_GRACE)
            ));
        }
        text
    }

    /// Whether the result is an error for the model (the command did not finish by itself).
    pub fn is_error(&self) -> bool {
        matches!(self.end, RunEnd::TimedOut(_) | RunEnd::Cancelled)
    }
}

/// The timeout a call gets: its own (seconds, at most 15 minutes) or the server default.
pub fn effective_timeout(requested: Option<u64>, default: Duration) -> Result<Duration> {
    match requested {
        None => Ok(default.min(MAX_RUN_TIMEOUT)),
        Some(0) => Err(WorkspaceError::Invalid("timeout must be at least 1 second".into())),
        Some(secs) if Duration::from_secs(secs) > MAX_RUN_TIMEOUT => Err(WorkspaceError::Invalid(format!(
            "timeout {secs} seconds is too long; a call may ask for at most {} seconds (15 minutes)",
            MAX_RUN_TIMEOUT.as_secs()
        ))),
        Some(secs) => Ok(Duration::from_secs(secs)),
    }
}

/// Keeps the last bytes of a stream and counts the characters that went by.
struct Tail {
    bytes: std::collections::VecDeque<u8>,
    total_chars: usize,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        // UTF-8 continuation bytes do not start a character.
        self.total_chars += chunk.iter().filter(|b| (**b & 0xC0) != 0x80).count();
        self.bytes.extend(chunk);
        let excess = self.bytes.len().saturating_sub(TAIL_BYTES);
        self.bytes.drain(..excess);
    }

    fn text(self) -> String {
        let bytes: Vec<u8> = self.bytes.into_iter().collect();
        // The tail may start in the middle of a character: skip to the next character start.
        let start = bytes
            .iter()
            .position(|b| (b & 0xC0) != 0x80)
            .unwrap_or(bytes.len());
        let text = String::from_utf8_lossy(&bytes[start..]).into_owned();
        let chars = text.chars().count();
        if chars > OUTPUT_TAIL_CHARS {
            text.chars().skip(chars - OUTPUT_TAIL_CHARS).collect()
        } else {
            text
        }
    }
}

/// Runs `command` with `sh -c` in `root` until it exits, `timeout` passes or `cancel` fires.
pub async fn run(
    root: &Path,
    command: &str,
    timeout: Duration,
    cancel: CancellationToken,
) -> Result<RunOutcome> {
    if command.trim().is_empty() {
        return Err(WorkspaceError::Invalid(
            "command is empty; give a shell command such as `ls -la`".into(),
        ));
    }
    let (writer, mut reader) = tokio::net::unix::pipe::pipe()
        .map_err(|e| WorkspaceError::io("creating the output pipe for", command, e))?;
    let writer = writer
        .into_blocking_fd()
        .map_err(|e| WorkspaceError::io("creating the output pipe for", command, e))?;
    let writer_err = writer
        .try_clone()
        .map_err(|e| WorkspaceError::io("creating the output pipe for", command, e))?;

    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(writer_err))
        .process_group(0)
        .kill_on_drop(true);
    let spawned = procs::spawn_managed(|| cmd.spawn(), |c| c.id());
    // Close our copies of the pipe's write end so the reader sees EOF when the group is done.
    drop(cmd);
    let mut child = spawned.map_err(|e| WorkspaceError::io("starting `sh -c` for", command, e))?;
    let group = child.id().map(GroupGuard::new);

    let mut tail = Tail {
        bytes: std::collections::VecDeque::new(),
        total_chars: 0,
    };
    let mut buf = vec![0u8; 16 * 1024];
    let started = Instant::now();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut reader_open = true;

    // Phase 1: until the shell exits, the timeout passes or the call is cancelled.
    let end = loop {
        tokio::select! {
            status = child.wait() => {
                if let Some(g) = &group {
                    g.leader_reaped();
                }
                let status = status.map_err(|e| WorkspaceError::io("waiting for", command, e))?;
                break exit_end(status);
            }
            read = reader.read(&mut buf), if reader_open => match read {
                Ok(0) | Err(_) => reader_open = false,
                Ok(n) => tail.push(&buf[..n]),
            },
            () = &mut deadline => {
                kill_group(group.as_ref(), &mut child).await;
                break RunEnd::TimedOut(timeout);
            }
            () = cancel.cancelled() => {
                kill_group(group.as_ref(), &mut child).await;
                break RunEnd::Cancelled;
            }
        }
    };
    tracing::debug!(command, elapsed = ?started.elapsed(), end = ?end, "workspace run finished");

    // Phase 2: read what is left; after a kill the pipe closes at once.
    let mut output_left_open = false;
    if reader_open {
        let drain = async {
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => tail.push(&buf[..n]),
                }
            }
        };
        if tokio::time::timeout(DRAIN_GRACE, drain).await.is_err() {
            output_left_open = true;
        }
    }
    let mut leftover_group = None;
    if matches!(end, RunEnd::Exited(_) | RunEnd::Signalled(_)) {
        // The shell ended by itself: its background processes are left alone for now.
        if let Some(g) = &group {
            g.disarm();
            if procs::group_alive(g.pgid()) {
                leftover_group = Some(g.pgid());
            }
        }
    }
    let total_chars = tail.total_chars;
    Ok(RunOutcome {
        end,
        output: tail.text(),
        total_chars,
        output_left_open,
        leftover_group,
    })
}

fn exit_end(status: ExitStatus) -> RunEnd {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => RunEnd::Exited(code),
        (None, Some(sig)) => RunEnd::Signalled(sig),
        (None, None) => RunEnd::Exited(-1),
    }
}

/// SIGKILLs process groups left running by earlier calls (when the server exits).
pub fn kill_groups(groups: &[i32]) {
    for &pgid in groups {
        if procs::signal_group(pgid, Signal::SIGKILL) {
            tracing::debug!(pgid, "killed background processes of an earlier run");
        }
    }
}

/// SIGKILLs the shell's descendants and its group, reaps the shell and waits (bounded) until no
/// member is left.
async fn kill_group(group: Option<&GroupGuard>, child: &mut tokio::process::Child) {
    // The shell is not reaped yet: its tree (setsid children included) is still under it.
    let tree = group.map(GroupGuard::kill).unwrap_or_default();
    let _ = child.wait().await;
    if let Some(g) = group {
        g.leader_reaped();
        let deadline = Instant::now() + Duration::from_secs(2);
        // Members re-parented to a reaper are reaped by it; poll until all are dead.
        while (procs::group_alive(g.pgid()) || !tree.iter().all(|p| procs::is_dead(*p)))
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
