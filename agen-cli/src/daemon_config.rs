//! The configuration of the daemons `agen hub` and `agen nest` from three places besides their
//! flags, for every flag without listing any: an environment variable per flag and a TOML file
//! (`--config FILE`), with the precedence flag > variable > file > built-in default.
//!
//! How, all inside clap: before argv is parsed, [`command`] gives each long flag of the two
//! daemons that has no variable yet the variable `AGEN_HUB_<FLAG>` / `AGEN_NEST_<FLAG>` (dashes
//! become underscores; names the flags already had, such as `AGEN_HUB` for `agen nest --hub`,
//! `AGEN_HUB_STORE` or `AGEN_SNAPSHOT_KEY_FILE`, stay). When `--config FILE` (or
//! `AGEN_HUB_CONFIG`/`AGEN_NEST_CONFIG`) names a file, a first lenient parse finds it, and each
//! key of the file becomes the **default value** of the flag of the same long name: clap then
//! applies its usual precedence (a flag on the command line, then its variable, then the
//! default), and parses the file's values with the flag's own parser. A key no flag has, a
//! value of the wrong shape, or a value the flag's parser refuses is an error naming the file
//! and the key (the daemons exit 64).
//!
//! Keys are the long flag names: `nest-ttl = "10s"`, `insecure-plaintext = true`, a repeatable
//! flag takes a list (`label = ["zone=eu-1"]`). Numbers and booleans may be written bare.
//!
//! [`Effective`] is what was parsed, flag by flag with its source: `agen hub config` prints it
//! (secrets as "set", never their value) and a SIGHUP compares the old one with a new parse
//! ([`reparse`]) to apply what can change live.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use crate::{Cli, Command};

/// The daemons that take a config file, with the prefix of their flags' variables.
pub const DAEMONS: [(&str, &str); 2] = [("hub", "AGEN_HUB_"), ("nest", "AGEN_NEST_")];

/// The flag that names the file; it is no key of the file itself.
const CONFIG_KEY: &str = "config";

/// Why argv could not be parsed.
#[derive(Debug)]
pub enum Failure {
    /// A bad flag or variable: clap's own message and exit code.
    Clap(clap::Error),
    /// The config file is unreadable or wrong (exit 64).
    File(String),
}

/// Where a flag's value in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File,
    Default,
    Unset,
}

impl Source {
    fn word(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Env => "environment",
            Source::File => "file",
            Source::Default => "default",
            Source::Unset => "not set",
        }
    }
}

/// One flag of a daemon with its value in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The flag's long name, also its key in the file.
    pub key: String,
    pub values: Vec<String>,
    pub source: Source,
    /// The variable that sets it.
    pub env: Option<String>,
    /// Never printed (a database URL with its password, a token).
    pub secret: bool,
    /// A switch (`--insecure-plaintext`): written as a bare boolean.
    pub switch: bool,
    /// Repeatable: written as a list.
    pub many: bool,
}

/// The configuration a daemon runs with: every flag, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    /// `hub` or `nest`.
    pub daemon: String,
    /// The config file read, if any.
    pub file: Option<PathBuf>,
    pub settings: Vec<Setting>,
}

impl Effective {
    /// The setting of `key`.
    pub fn get(&self, key: &str) -> Option<&Setting> {
        self.settings.iter().find(|s| s.key == key)
    }

    /// The keys whose values differ between `self` and `new`.
    pub fn changed(&self, new: &Effective) -> Vec<String> {
        let mut keys: BTreeSet<&str> = BTreeSet::new();
        for s in self.settings.iter().chain(new.settings.iter()) {
            if self.get(&s.key).map(|a| &a.values) != new.get(&s.key).map(|b| &b.values) {
                keys.insert(&s.key);
            }
        }
        keys.into_iter().map(str::to_string).collect()
    }

    /// The value of `key` for a log line (`(secret)` for a secret).
    pub fn shown(&self, key: &str) -> String {
        match self.get(key) {
            Some(s) if s.secret => "(secret)".into(),
            Some(s) if s.values.is_empty() => "(not set)".into(),
            Some(s) => s.values.join(","),
            None => "(not set)".into(),
        }
    }

    /// The configuration as TOML that `--config` reads back: one key per flag, its source in
    /// a comment; unset flags and secrets are comments (a secret says only that it is set).
    pub fn to_toml(&self) -> String {
        let mut out = format!(
            "# agen {}: the configuration in force (flag > environment > file > default)\n",
            self.daemon
        );
        if let Some(f) = &self.file {
            out.push_str(&format!("# file: {}\n", f.display()));
        }
        out.push_str(&format!(
            "# a SIGHUP applies {}; a change of any other key needs a restart\n",
            live_keys(&self.daemon).join(", ")
        ));
        for s in &self.settings {
            let env = s
                .env
                .as_deref()
                .map(|e| format!(", {e}"))
                .unwrap_or_default();
            if s.source == Source::Unset || (s.values.is_empty() && !s.many) {
                out.push_str(&format!("# {} is not set{env}\n", s.key));
            } else if s.secret {
                out.push_str(&format!(
                    "# {} is set ({}{env}); a secret, not shown\n",
                    s.key,
                    s.source.word()
                ));
            } else {
                out.push_str(&format!(
                    "{} = {}  # {}{env}\n",
                    s.key,
                    toml_of(s),
                    s.source.word()
                ));
            }
        }
        out
    }
}

fn toml_of(s: &Setting) -> String {
    let one = |v: &str| -> String {
        if s.switch || v == "true" || v == "false" || v.parse::<i64>().is_ok() {
            v.to_string()
        } else {
            toml::Value::String(v.to_string()).to_string()
        }
    };
    if s.many {
        let items: Vec<String> = s
            .values
            .iter()
            .map(|v| toml::Value::String(v.clone()).to_string())
            .collect();
        format!("[{}]", items.join(", "))
    } else {
        s.values.first().map(|v| one(v)).unwrap_or_default()
    }
}

/// The keys a SIGHUP applies to a running `agen hub` / `agen nest`; a change of any other key
/// is logged as needing a restart (and `agen hub config` says so).
pub fn live_keys(daemon: &str) -> &'static [&'static str] {
    match daemon {
        "hub" => &["log-level", "task-retention", "audit-retention"],
        "nest" => &["log-level", "label", "cordon"],
        _ => &[],
    }
}

/// `AGEN_HUB_NEST_TTL` for `--nest-ttl` of `agen hub`.
pub fn env_name(prefix: &str, long: &str) -> String {
    format!("{prefix}{}", long.replace('-', "_").to_uppercase())
}

/// The CLI's command with a variable for every flag of the daemons.
pub fn command() -> clap::Command {
    let mut cmd = Cli::command();
    for (daemon, prefix) in DAEMONS {
        cmd = cmd.mut_subcommand(daemon, |sub| {
            sub.mut_args(|a| match a.get_long() {
                Some(long) if a.get_env().is_none() => {
                    let name = env_name(prefix, long);
                    a.env(name)
                }
                _ => a,
            })
        });
    }
    cmd
}

/// Parses argv (the process's, by [`std::env::args_os`]) with variables and config file
/// applied; clap's errors exit as clap does, a bad config file exits 64.
pub fn parse() -> Cli {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match try_parse(&argv) {
        Ok(cli) => cli,
        Err(Failure::Clap(e)) => e.exit(),
        Err(Failure::File(msg)) => {
            eprintln!("error: {msg}");
            std::process::exit(64)
        }
    }
}

/// [`parse`] again, for a SIGHUP: the same argv and environment, the file read anew.
pub fn reparse() -> Result<Cli, String> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    try_parse(&argv).map_err(|f| match f {
        Failure::Clap(e) => first_line(&e.to_string()),
        Failure::File(msg) => msg,
    })
}

/// Parses `argv` into the CLI, the daemons' config file and variables applied.
pub fn try_parse(argv: &[OsString]) -> Result<Cli, Failure> {
    let mut cmd = command();
    let mut from_file: Option<(&str, PathBuf, BTreeSet<String>)> = None;
    if let Some((daemon, path)) = config_file(&cmd, argv) {
        let (with_file, keys) = apply_file(cmd, daemon, &path)?;
        cmd = with_file;
        from_file = Some((daemon, path, keys));
    }
    let matches = cmd
        .clone()
        .try_get_matches_from(argv)
        .map_err(Failure::Clap)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(|e| Failure::Clap(e.format(&mut cmd)))?;
    let effective = |daemon: &str| -> Effective {
        let file = from_file.as_ref().filter(|(d, _, _)| *d == daemon);
        effective(
            &cmd,
            &matches,
            daemon,
            file.map(|(_, p, k)| (p.as_path(), k)),
        )
    };
    match &mut cli.command {
        Command::Hub(a) => a.effective = effective("hub"),
        Command::Nest(a) => a.effective = effective("nest"),
        _ => {}
    }
    Ok(cli)
}

/// The daemon and the config file argv names (a lenient parse: a flag the file will supply
/// may be missing yet).
fn config_file(cmd: &clap::Command, argv: &[OsString]) -> Option<(&'static str, PathBuf)> {
    let m = cmd
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(argv)
        .ok()?;
    let (name, sm) = m.subcommand()?;
    let daemon = DAEMONS.iter().find(|(d, _)| *d == name)?.0;
    let raw = sm.get_raw(CONFIG_KEY)?.next()?;
    Some((daemon, PathBuf::from(raw)))
}

/// `cmd` with the file's values as the defaults of `daemon`'s flags, and the keys it set.
fn apply_file(
    cmd: clap::Command,
    daemon: &str,
    path: &Path,
) -> Result<(clap::Command, BTreeSet<String>), Failure> {
    let at = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::File(format!(
            "config file {at}: cannot read it: {e}; give --config a readable TOML file"
        ))
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| Failure::File(format!("config file {at}: not valid TOML: {e}")))?;
    let sub = cmd
        .find_subcommand(daemon)
        .expect("the daemons are subcommands of agen")
        .clone();
    let probe = sub
        .clone()
        .no_binary_name(true)
        .subcommand_required(false)
        .mut_args(|a| a.required(false));
    let mut defaults: Vec<(String, Vec<String>)> = Vec::new();
    let mut keys = BTreeSet::new();
    for (key, value) in &table {
        let arg = sub
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && key != CONFIG_KEY)
            .ok_or_else(|| {
                Failure::File(format!(
                    "config file {at}: unknown key `{key}`; the keys are the long flags of `agen {daemon}` without their dashes (see agen {daemon} --help), e.g. {}",
                    if daemon == "hub" { "nest-ttl = \"10s\"" } else { "capacity = 8" }
                ))
            })?;
        let bad = |what: &str| Failure::File(format!("config file {at}: key `{key}`: {what}"));
        let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        let many = matches!(arg.get_action(), ArgAction::Append);
        let values = match value {
            toml::Value::Array(items) if many => items
                .iter()
                .map(scalar)
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| bad("expected a list of strings"))?,
            toml::Value::Array(_) => return Err(bad("takes one value, not a list")),
            toml::Value::Boolean(b) if switch => vec![b.to_string()],
            _ if switch => return Err(bad("expected true or false")),
            v => vec![scalar(v).ok_or_else(|| bad("expected a string, a number or a boolean"))?],
        };
        if !switch {
            let args: Vec<String> = values.iter().map(|v| format!("--{key}={v}")).collect();
            if let Err(e) = probe.clone().try_get_matches_from(&args) {
                return Err(bad(&first_line(&e.to_string())));
            }
        }
        keys.insert(key.clone());
        defaults.push((arg.get_id().to_string(), values));
    }
    let cmd = cmd.mut_subcommand(daemon, move |mut sub| {
        for (id, values) in defaults {
            sub = sub.mut_arg(id, |a| a.default_values(values).required(false));
        }
        sub
    });
    Ok((cmd, keys))
}

/// A TOML scalar as the text a flag would take.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Datetime(d) => Some(d.to_string()),
        _ => None,
    }
}

/// The first line of a clap error without its `error: `.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// Every flag of `daemon` with its value in force and where it came from.
fn effective(
    cmd: &clap::Command,
    matches: &ArgMatches,
    daemon: &str,
    file: Option<(&Path, &BTreeSet<String>)>,
) -> Effective {
    let Some(sub) = cmd.find_subcommand(daemon) else {
        return Effective::default();
    };
    let Some(sm) = matches.subcommand_matches(daemon) else {
        return Effective::default();
    };
    let mut settings = Vec::new();
    for arg in sub.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == CONFIG_KEY {
            continue;
        }
        let id = arg.get_id().as_str();
        let values: Vec<String> = sm
            .get_raw(id)
            .map(|vals| vals.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let source = match sm.value_source(id) {
            Some(ValueSource::CommandLine) => Source::Flag,
            Some(ValueSource::EnvVariable) => Source::Env,
            Some(ValueSource::DefaultValue) if file.is_some_and(|(_, k)| k.contains(long)) => {
                Source::File
            }
            Some(_) => Source::Default,
            None => Source::Unset,
        };
        settings.push(Setting {
            key: long.to_string(),
            values,
            source,
            env: arg.get_env().map(|e| e.to_string_lossy().into_owned()),
            secret: arg.is_hide_env_values_set(),
            switch: matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse),
            many: matches!(arg.get_action(), ArgAction::Append),
        });
    }
    settings.sort_by(|a, b| a.key.cmp(&b.key));
    Effective {
        daemon: daemon.to_string(),
        file: file.map(|(p, _)| p.to_path_buf()),
        settings,
    }
}

#[cfg(test)]
mod tests;
