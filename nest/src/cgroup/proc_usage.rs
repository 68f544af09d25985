//! Usage of process groups from `/proc/<pid>/stat`: each tool server is a process group of
//! its own (and an instance under rlimits has no cgroup to read), so CPU time and resident
//! memory are summed over the processes of a group.

use std::collections::HashMap;

/// CPU seconds, resident bytes and processes of one process group.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcSample {
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    pub pids: u32,
}

/// The use of each process group in `pgids`, in one pass over `/proc`.
pub fn group_usage(pgids: &[i32]) -> HashMap<i32, ProcSample> {
    let mut out: HashMap<i32, ProcSample> = HashMap::new();
    if pgids.is_empty() {
        return out;
    }
    // SAFETY: sysconf reads a constant.
    #[allow(unsafe_code)]
    let (tick, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
            libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
        )
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((pgid, ticks, rss)) = parse_stat(&stat) else {
            continue;
        };
        if !pgids.contains(&pgid) {
            continue;
        }
        let s = out.entry(pgid).or_default();
        s.cpu_seconds += ticks as f64 / tick;
        s.memory_bytes += rss * page;
        s.pids += 1;
    }
    out
}

/// (process group, utime + stime in ticks, rss in pages) from one `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Option<(i32, u64, u64)> {
    // The command name may hold spaces and parentheses: fields start after the last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // rest[0] is field 3 (state): pgrp is field 5, utime 14, stime 15, rss 24.
    let pgid = f.get(2)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let rss: i64 = f.get(21)?.parse().ok()?;
    Some((pgid, utime + stime, u64::try_from(rss).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (my (odd) srv) S 1 4240 4240 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 555 1000000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(line), Some((4240, 10, 250)));
    }

    #[test]
    fn this_process_group_is_measured() {
        let me = nix::unistd::getpgrp().as_raw();
        let got = group_usage(&[me]);
        let s = got.get(&me).copied().unwrap_or_default();
        assert!(s.pids >= 1 && s.memory_bytes > 0, "{s:?}");
    }
}
