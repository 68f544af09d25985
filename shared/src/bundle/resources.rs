//! `resources` in `x-agen/config.json` (`{"cpu": 0.5, "memory": "512Mi", "pids": 256}`) and
//! `agen deploy --cpu --memory --pids`: what one instance, its tool servers included, may use
//! and what placement reserves for it on a Nest.
//!
//! Invariants: a declared value is both the limit the Nest enforces and what the Hub reserves;
//! a key nobody declared reserves its default ([`DEFAULT_CPU_MILLIS`], [`DEFAULT_MEMORY_BYTES`])
//! and is not a limit, except `pids`, which is always a limit (default [`DEFAULT_PIDS`]);
//! `agen deploy` flags win over the bundle key by key. Every value is checked against its
//! bounds here, once, with a message naming the key and the fix.

use serde::{Deserialize, Serialize};

/// What a deployment that declares no `cpu` reserves: 0.1 CPU.
pub const DEFAULT_CPU_MILLIS: u32 = 100;
/// What a deployment that declares no `memory` reserves: 256 MiB.
pub const DEFAULT_MEMORY_BYTES: u64 = 256 << 20;
/// The process limit of an instance whose deployment declares no `pids`.
pub const DEFAULT_PIDS: u32 = 1024;
/// Bounds of a declared `cpu` (in thousandths of a CPU): 0.01 to 256 CPUs.
pub const MIN_CPU_MILLIS: u32 = 10;
pub const MAX_CPU_MILLIS: u32 = 256_000;
/// Bounds of a declared `memory`: 16Mi to 1Ti.
pub const MIN_MEMORY_BYTES: u64 = 16 << 20;
pub const MAX_MEMORY_BYTES: u64 = 1 << 40;
/// Bounds of a declared `pids`: 8 to 65536.
pub const MIN_PIDS: u32 = 8;
pub const MAX_PIDS: u32 = 65_536;

/// Resources as declared: each key is `None` when not said (by the bundle or the flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
}

impl ResourceSpec {
    /// `self`, each key it leaves unset taken from `under` (flags over the bundle).
    pub fn or(self, under: ResourceSpec) -> ResourceSpec {
        ResourceSpec {
            cpu_millis: self.cpu_millis.or(under.cpu_millis),
            memory_bytes: self.memory_bytes.or(under.memory_bytes),
            pids: self.pids.or(under.pids),
        }
    }

    /// What placement reserves: the declared values, the defaults for the rest.
    pub fn reservation(&self) -> (u32, u64) {
        (
            self.cpu_millis.unwrap_or(DEFAULT_CPU_MILLIS),
            self.memory_bytes.unwrap_or(DEFAULT_MEMORY_BYTES),
        )
    }

    /// The process limit the Nest sets.
    pub fn pids_limit(&self) -> u32 {
        self.pids.unwrap_or(DEFAULT_PIDS)
    }

    /// Checks every declared value against its bounds; the error names the key (as `key`
    /// formats it: `resources.cpu` for the bundle, `--cpu` for a flag) and the fix.
    pub fn check(&self, key: impl Fn(&str) -> String) -> Result<(), String> {
        if let Some(c) = self.cpu_millis {
            if !(MIN_CPU_MILLIS..=MAX_CPU_MILLIS).contains(&c) {
                return Err(format!(
                    "{}: {} is out of range; expected 0.01 to 256 CPUs (such as 0.5)",
                    key("cpu"),
                    format_cpu(c)
                ));
            }
        }
        if let Some(m) = self.memory_bytes {
            if !(MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(&m) {
                return Err(format!(
                    "{}: {m} bytes is out of range; expected 16Mi to 1Ti (such as \"512Mi\")",
                    key("memory"),
                ));
            }
        }
        if let Some(p) = self.pids {
            if !(MIN_PIDS..=MAX_PIDS).contains(&p) {
                return Err(format!(
                    "{}: {p} is out of range; expected {MIN_PIDS} to {MAX_PIDS} processes",
                    key("pids")
                ));
            }
        }
        Ok(())
    }

    /// `cpu 0.5, memory 512Mi, pids 256` (defaults marked), for messages and `agen get`.
    pub fn describe(&self) -> String {
        let (cpu, mem) = self.reservation();
        let mark = |set: bool| if set { "" } else { " (default)" };
        format!(
            "cpu {}{}, memory {}{}, pids {}{}",
            format_cpu(cpu),
            mark(self.cpu_millis.is_some()),
            format_bytes(mem),
            mark(self.memory_bytes.is_some()),
            self.pids_limit(),
            mark(self.pids.is_some()),
        )
    }
}

/// A CPU amount as written: `0.5`, `2`, `1.25` or `500m`.
pub fn parse_cpu(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let bad = || format!("expected a number of CPUs such as 0.5 or 2 (or 500m), got `{s}`");
    let millis = if let Some(m) = s.strip_suffix('m') {
        m.parse::<u64>().map_err(|_| bad())? as f64
    } else {
        s.parse::<f64>().map_err(|_| bad())? * 1000.0
    };
    if !millis.is_finite() || millis < 0.0 || millis > f64::from(u32::MAX) {
        return Err(bad());
    }
    Ok(millis.round() as u32)
}

/// A byte amount as written: `512Mi`, `1Gi`, `100M`, `1048576`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let bad = || {
        format!("expected a size such as \"512Mi\" or \"2Gi\" (Ki, Mi, Gi, Ti, or K, M, G, T), got `{s}`")
    };
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// `0.5`, `2`, `0.01` (thousandths dropped when zero).
pub fn format_cpu(millis: u32) -> String {
    let s = format!("{}.{:03}", millis / 1000, millis % 1000);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `512Mi`, `1.5Gi`, `900Ki`, `12B`: binary units, one decimal at most.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if b >= size {
            let tenths = (b as u128 * 10 / size as u128) as u64;
            return if tenths.is_multiple_of(10) {
                format!("{}{unit}", tenths / 10)
            } else {
                format!("{}.{}{unit}", tenths / 10, tenths % 10)
            };
        }
    }
    format!("{b}B")
}

/// The `resources` object of `x-agen/config.json`.
pub(crate) fn parse(o: &super::json::Obj) -> super::Result<ResourceSpec> {
    use serde_json::Value;
    o.only_keys(&["cpu", "memory", "pids"])?;
    let cpu = match o.get("cpu") {
        None => None,
        Some(Value::Number(n)) => Some(parse_cpu(&n.to_string()).map_err(|m| o.err("cpu", m))?),
        Some(Value::String(s)) => Some(parse_cpu(s).map_err(|m| o.err("cpu", m))?),
        Some(other) => {
            return Err(o.err(
                "cpu",
                format!(
                    "expected a number of CPUs such as 0.5, got {}",
                    super::json::kind(other)
                ),
            ))
        }
    };
    let memory = match o.get("memory") {
        None => None,
        Some(Value::String(s)) => Some(parse_bytes(s).map_err(|m| o.err("memory", m))?),
        Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
            o.err(
                "memory",
                "expected a size such as \"512Mi\" (or whole bytes)",
            )
        })?),
        Some(other) => {
            return Err(o.err(
                "memory",
                format!(
                    "expected a size such as \"512Mi\", got {}",
                    super::json::kind(other)
                ),
            ))
        }
    };
    let spec = ResourceSpec {
        cpu_millis: cpu,
        memory_bytes: memory,
        pids: o.opt_u32("pids")?,
    };
    spec.check(|k| o.field(k)).map_err(|m| {
        let (field, msg) = m.split_once(": ").unwrap_or(("resources", m.as_str()));
        super::BundleError::invalid(super::CONFIG_FILE, field, msg.to_string())
    })?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_cpu(s: &str, want: Result<u32, ()>) {
        assert_eq!(parse_cpu(s).map_err(|_| ()), want, "{s}");
    }

    #[test]
    fn cpu_amounts_parse_as_written() {
        check_cpu("0.5", Ok(500));
        check_cpu("2", Ok(2000));
        check_cpu("250m", Ok(250));
        check_cpu("1.25", Ok(1250));
        check_cpu("half", Err(()));
        check_cpu("-1", Err(()));
        assert_eq!(format_cpu(500), "0.5");
        assert_eq!(format_cpu(2000), "2");
        assert_eq!(format_cpu(10), "0.01");
    }

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("100M"), Ok(100_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("5 GB").is_err());
        assert!(parse_bytes("99999999999Ti").is_err());
        assert_eq!(format_bytes(512 << 20), "512Mi");
        assert_eq!(format_bytes(3 << 29), "1.5Gi");
        assert_eq!(format_bytes(12), "12B");
    }

    #[test]
    fn flags_win_key_by_key_and_defaults_fill_the_rest() {
        let bundle = ResourceSpec {
            cpu_millis: Some(500),
            memory_bytes: Some(512 << 20),
            pids: None,
        };
        let flags = ResourceSpec {
            memory_bytes: Some(1 << 30),
            ..ResourceSpec::default()
        };
        let got = flags.or(bundle);
        assert_eq!(got.reservation(), (500, 1 << 30));
        assert_eq!(got.pids_limit(), DEFAULT_PIDS);
        assert_eq!(
            ResourceSpec::default().reservation(),
            (DEFAULT_CPU_MILLIS, DEFAULT_MEMORY_BYTES)
        );
        let err = ResourceSpec {
            pids: Some(2),
            ..ResourceSpec::default()
        }
        .check(|k| format!("--{k}"))
        .unwrap_err();
        assert_eq!(
            err,
            "--pids: 2 is out of range; expected 8 to 65536 processes"
        );
    }
}
