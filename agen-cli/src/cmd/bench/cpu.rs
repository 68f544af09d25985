//! The CPU time the measured fleet spent, as `agen bench` sees it: user + system time of this
//! process (Hub, Nest, fake model, clients) and of every process below it (the instances and
//! their tool servers), read from `/proc` before and after the measured phase. CPU per tool
//! call moves less with the scheduler than calls per second do, so two builds compare better on
//! it (both still move with the host's clock speed).
//!
//! Invariants: Linux only; where `/proc` cannot be read the figure is `None` (reported as
//! "n/a"), never zero. A process that ends inside the window takes its time with it (the
//! fleet's processes live through the phase, so nothing measured is lost that way).

use std::collections::HashMap;
use std::time::Duration;

/// CPU time of a process tree at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sample {
    /// User + system time of every process in the tree.
    pub cpu: Duration,
    /// How many processes the tree had.
    pub processes: usize,
}

impl Sample {
    /// This process and everything below it, now; `None` when `/proc` cannot be read.
    pub fn now() -> Option<Sample> {
        let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)?;
        let mut table = HashMap::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // A process may end between the listing and the read: skip it.
            if let Some(stat) = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|s| Stat::parse(&s))
            {
                table.insert(pid, stat);
            }
        }
        let (ticks, processes) = tree_ticks(&table, std::process::id());
        Some(Sample {
            cpu: Duration::from_secs_f64(ticks as f64 / ticks_per_s as f64),
            processes,
        })
    }

    /// The CPU spent from `before` to `self`, by the processes the tree has now.
    pub fn since(&self, before: &Sample) -> Sample {
        Sample {
            cpu: self.cpu.saturating_sub(before.cpu),
            processes: self.processes,
        }
    }
}

/// What one `/proc/<pid>/stat` line says that matters here.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    ppid: u32,
    /// utime + stime, in clock ticks.
    ticks: u64,
}

impl Stat {
    /// Reads `pid (comm) state ppid … utime stime …`; the command may hold spaces and
    /// parentheses, so the fields are counted from the last `)`.
    fn parse(line: &str) -> Option<Stat> {
        let rest = &line[line.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the command: state (field 3 of the line), ppid (4), … utime (14), stime (15).
        let ppid = fields.get(1)?.parse().ok()?;
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(Stat {
            ppid,
            ticks: utime + stime,
        })
    }
}

/// Ticks of `root` and of every process below it, and how many processes that is.
fn tree_ticks(table: &HashMap<u32, Stat>, root: u32) -> (u64, usize) {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, stat) in table {
        children.entry(stat.ppid).or_default().push(*pid);
    }
    let (mut ticks, mut count) = (0, 0);
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        let Some(stat) = table.get(&pid) else {
            continue;
        };
        ticks += stat.ticks;
        count += 1;
        todo.extend(children.get(&pid).into_iter().flatten());
    }
    (ticks, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_from_after_its_command_even_when_the_command_has_parentheses() {
        let line =
            "4242 (tokio (rt) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 3 0 1 1 1";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                ppid: 17,
                ticks: 281
            })
        );
        assert_eq!(Stat::parse("4242 (cut short) S 17"), None);
        assert_eq!(Stat::parse("no command at all"), None);
    }

    #[test]
    fn a_tree_counts_its_root_and_everything_below_it_and_nothing_else() {
        let table = HashMap::from([
            (
                1,
                Stat {
                    ppid: 0,
                    ticks: 1000,
                },
            ),
            (10, Stat { ppid: 1, ticks: 5 }),
            (11, Stat { ppid: 10, ticks: 7 }),
            (
                12,
                Stat {
                    ppid: 11,
                    ticks: 11,
                },
            ),
            (20, Stat { ppid: 1, ticks: 13 }),
        ]);
        assert_eq!(tree_ticks(&table, 10), (23, 3));
        assert_eq!(tree_ticks(&table, 99), (0, 0));
    }

    #[test]
    fn this_process_is_seen_spending_cpu() {
        let Some(before) = Sample::now() else {
            return; // no /proc here
        };
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = Sample::now().expect("read /proc twice");
        assert!(after.processes >= 1);
        assert!(
            after.since(&before).cpu >= Duration::from_millis(100),
            "300 ms of busy work showed as {:?}",
            after.since(&before).cpu
        );
    }
}
