//! The one table of input limits ([`Limits`]) and the checks that enforce it where data enters
//! the Hub: a field over its limit is `INVALID_ARGUMENT` with the exact text
//! `<field>: N bytes is over the limit of M bytes` (or the count, for labels); a quota is
//! `RESOURCE_EXHAUSTED` naming it. Error texts never echo more than [`ECHO_BYTES`] of what was
//! sent ([`prefix`]).
//!
//! Invariant: every limit here is below [`MAX_MESSAGE_BYTES`], the gRPC message limit of every
//! link, so that Agen refuses an over-limit field itself, with a message, before any transport
//! limit could break a stream.

use std::collections::BTreeMap;

use crate::error::{HubError, Result};

/// The gRPC message limit on every link, both ends (Hub, Nest, CLI).
pub const MAX_MESSAGE_BYTES: usize = agen_proto::MAX_MESSAGE_BYTES;
/// Names (namespaces, deployments, secrets): the existing name rule.
pub const MAX_NAME_BYTES: usize = 63;
/// A label key (labels of tasks and Nests, deployment selectors).
pub const MAX_LABEL_KEY_BYTES: usize = 128;
/// An id sent back to the Hub (task ids, run ids, artifact ids, client request ids).
pub const MAX_ID_BYTES: usize = 256;
/// A free-text reason (cancel).
pub const MAX_REASON_BYTES: usize = 4096;
/// A secret's value.
pub const MAX_SECRET_VALUE_BYTES: usize = 64 * 1024;
/// The edited arguments of an approval (`DecideApprovalRequest.arguments_json`), as big as the
/// arguments an approval shows.
pub const MAX_APPROVAL_ARGUMENTS_BYTES: usize = 64 * 1024;
/// How much of a sent value an error message may echo.
pub const ECHO_BYTES: usize = 64;
/// The longest status message the Hub sends (kept beside the one place a Hub error becomes a
/// status, `error.rs`, which may not import this table: the table's checks return its errors).
pub use crate::error::MAX_STATUS_MESSAGE_BYTES;

/// The stream limits (`agen hub` flags; rows of the limits table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Open streams of one kind per token (`--max-streams-per-token`).
    pub per_token: usize,
    /// Open streams of one kind in all (`--max-streams`).
    pub total: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            per_token: 256,
            total: 8192,
        }
    }
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// The configurable limits (Hub flags); `Default` is the documented table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A task's input text.
    pub input_bytes: usize,
    /// Labels per task (and per Nest, and selector pairs per deployment).
    pub labels: usize,
    /// One label value.
    pub label_value_bytes: usize,
    /// A conversation key.
    pub conversation_key_bytes: usize,
    /// The stored message history of one conversation (a quota: a submit to a conversation
    /// already over it is `RESOURCE_EXHAUSTED`).
    pub history_bytes: usize,
    /// Bytes queued at the Hub for one Nest before the Nest counts as not reading its stream
    /// and is disconnected (its runs handed over).
    pub nest_queue_bytes: usize,
    /// Artifact bytes stored per namespace (distinct contents).
    pub artifact_namespace_bytes: u64,
    /// Artifact bytes stored in all namespaces together.
    pub artifact_total_bytes: u64,
    /// Connections before and after authentication (`crate::conn_gate`).
    pub conn: crate::conn_gate::ConnLimits,
    /// Open server streams per kind (enforced by `core/streams.rs`).
    pub streams: StreamLimits,
    /// The deepest delegation tree any bundle may ask for (its `limits.maxDelegationDepth` is
    /// capped at this).
    pub max_delegation_depth: u32,
    /// Nests connected to this Hub at once; one more is refused at `Register`.
    pub max_nests: usize,
    /// Instances the Hub places on one Nest, whatever capacity the Nest declares.
    pub max_instances_per_nest: u32,
    /// Tasks waiting in state `Queued` per deployment; a submit past it is refused.
    pub max_queued_tasks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            input_bytes: MIB,
            labels: 64,
            label_value_bytes: KIB,
            conversation_key_bytes: 256,
            history_bytes: 32 * MIB,
            nest_queue_bytes: 64 * MIB,
            artifact_namespace_bytes: 500 * 1000 * 1000,
            artifact_total_bytes: 10 * 1000 * 1000 * 1000,
            conn: crate::conn_gate::ConnLimits::default(),
            streams: StreamLimits::default(),
            max_delegation_depth: 5,
            max_nests: 10_000,
            max_instances_per_nest: 1000,
            max_queued_tasks: 10_000,
        }
    }
}

impl Limits {
    /// Checks that the limits leave room below the gRPC message limit (a run assignment carries
    /// the input and the whole history).
    pub fn validate(&self) -> Result<()> {
        if self.max_delegation_depth == 0 {
            return Err(HubError::Config(
                "--max-delegation-depth 0: expected at least 1 (default 5)".into(),
            ));
        }
        for (flag, value, default) in [
            ("--max-nests", self.max_nests, 10_000),
            (
                "--max-instances-per-nest",
                self.max_instances_per_nest as usize,
                1000,
            ),
            ("--max-queued-tasks", self.max_queued_tasks, 10_000),
        ] {
            if value == 0 {
                return Err(HubError::Config(format!(
                    "{flag} 0: expected at least 1 (default {default})"
                )));
            }
        }
        let room = MAX_MESSAGE_BYTES - 4 * MIB;
        let fields = [
            ("--max-input-bytes", self.input_bytes),
            ("--max-label-value-bytes", self.label_value_bytes),
            ("--max-conversation-key-bytes", self.conversation_key_bytes),
            ("--max-history-bytes", self.history_bytes),
        ];
        for (flag, value) in fields {
            if value == 0 || value > room {
                return Err(HubError::Config(format!(
                    "{flag} {value} must be between 1 and {room} bytes (below the {MAX_MESSAGE_BYTES}-byte gRPC message limit)"
                )));
            }
        }
        if self.input_bytes + self.history_bytes > room {
            return Err(HubError::Config(format!(
                "--max-input-bytes {} plus --max-history-bytes {} must stay below {room} bytes: a run assignment carries both",
                self.input_bytes, self.history_bytes
            )));
        }
        if self.labels == 0 || self.labels > 10_000 {
            return Err(HubError::Config(format!(
                "--max-labels {} must be between 1 and 10000",
                self.labels
            )));
        }
        if self.nest_queue_bytes < MAX_MESSAGE_BYTES / 8 {
            return Err(HubError::Config(format!(
                "--nest-queue-bytes {} must be at least {} bytes",
                self.nest_queue_bytes,
                MAX_MESSAGE_BYTES / 8
            )));
        }
        Ok(())
    }

    /// Labels (or a selector): count, key syntax and length, value length.
    pub fn check_labels(&self, field: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        if labels.len() > self.labels {
            return Err(HubError::invalid(format!(
                "{field}: {} labels is over the limit of {} labels",
                labels.len(),
                self.labels
            )));
        }
        for (k, v) in labels {
            check_label_key(field, k)?;
            check_bytes(
                &format!("{field}[{}]", prefix(k)),
                v,
                self.label_value_bytes,
            )?;
            if let Some(why) = agen_shared::text::display_name_problem(v) {
                return Err(HubError::invalid(format!("{field}[{}]: {why}", prefix(k))));
            }
        }
        Ok(())
    }

    /// A task's input.
    pub fn check_input(&self, input: &str) -> Result<()> {
        check_bytes("input", input, self.input_bytes)
    }

    /// A conversation key (may be empty: no conversation).
    pub fn check_conversation_key(&self, key: &str) -> Result<()> {
        check_bytes("conversation_key", key, self.conversation_key_bytes)
    }

    /// The history quota of a conversation about to get another task.
    pub fn check_history(&self, conversation_key: &str, history_bytes: usize) -> Result<()> {
        if history_bytes > self.history_bytes {
            return Err(HubError::ResourceExhausted(format!(
                "history: conversation `{}` holds {history_bytes} bytes of messages, over the quota of {} bytes per conversation; continue in a new conversation (another conversation_key)",
                prefix(conversation_key),
                self.history_bytes
            )));
        }
        Ok(())
    }

    /// One more queued task for a deployment that already has `queued` waiting.
    pub fn check_queued_tasks(
        &self,
        namespace: &str,
        deployment: &str,
        queued: usize,
    ) -> Result<()> {
        if queued >= self.max_queued_tasks {
            return Err(HubError::ResourceExhausted(format!(
                "queued tasks: deployment {namespace}/{deployment} has {queued} tasks queued, the limit is {} per deployment (agen hub --max-queued-tasks); submit again once some have started, or scale the deployment up",
                self.max_queued_tasks
            )));
        }
        Ok(())
    }

    /// One more Nest connecting while `connected` are.
    pub fn check_nests(&self, nest: &str, connected: usize) -> Result<()> {
        if connected >= self.max_nests {
            return Err(HubError::ResourceExhausted(format!(
                "nests: nest `{}` cannot register: this hub has {connected} nests connected, the limit is {} (agen hub --max-nests); raise the flag, or point this nest at another hub",
                prefix(nest),
                self.max_nests
            )));
        }
        Ok(())
    }
}

/// Refusals by the scale limits, read by `/metrics` (`agen_hub_limit_refused_total{limit}`).
#[derive(Debug, Default)]
pub struct Refusals {
    nests: std::sync::atomic::AtomicU64,
    queued_tasks: std::sync::atomic::AtomicU64,
}

impl Refusals {
    /// Counts a refusal when `r` is one (any error of the check it wraps is one).
    pub fn count<T>(&self, limit: &str, r: Result<T>) -> Result<T> {
        if r.is_err() {
            let c = match limit {
                "nests" => &self.nests,
                _ => &self.queued_tasks,
            };
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// `(limit, refusals)` for each scale limit counted here.
    pub fn snapshot(&self) -> [(&'static str, u64); 2] {
        use std::sync::atomic::Ordering::Relaxed;
        [
            ("nests", self.nests.load(Relaxed)),
            ("queued_tasks", self.queued_tasks.load(Relaxed)),
        ]
    }
}

/// `<field>: N bytes is over the limit of M bytes` when `value` is longer than `max` bytes.
pub fn check_bytes(field: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(over_limit(field, value.len(), max));
    }
    Ok(())
}

/// The contract text of a field over its limit.
pub fn over_limit(field: &str, len: usize, max: usize) -> HubError {
    HubError::invalid(format!(
        "{field}: {len} bytes is over the limit of {max} bytes"
    ))
}

/// An id field (task id, artifact id, client request id): at most [`MAX_ID_BYTES`].
pub fn check_id(field: &str, value: &str) -> Result<()> {
    check_bytes(field, value, MAX_ID_BYTES)
}

/// A label key: at most [`MAX_LABEL_KEY_BYTES`], matching
/// `[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?`.
pub fn check_label_key(field: &str, key: &str) -> Result<()> {
    if key.len() > MAX_LABEL_KEY_BYTES {
        return Err(HubError::invalid(format!(
            "{field}: key `{}`: {} bytes is over the limit of {MAX_LABEL_KEY_BYTES} bytes",
            prefix(key),
            key.len()
        )));
    }
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    let bytes = key.as_bytes();
    let ok = match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first)
                && alnum(last)
                && bytes
                    .iter()
                    .all(|&c| alnum(c) || matches!(c, b'.' | b'_' | b'/' | b'-'))
        }
        _ => false,
    };
    if !ok {
        return Err(HubError::invalid(format!(
            "{field}: key `{}` is not a label key; expected letters, digits, `.`, `_`, `/` or `-`, starting and ending with a letter or digit",
            prefix(key)
        )));
    }
    Ok(())
}

/// A name (namespace, deployment, secret): up to 63 lowercase letters, digits, `-`, `_` or `.`,
/// starting with a letter or digit.
pub fn validate_name(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(HubError::invalid(format!(
            "{field}: expected a name, got an empty string"
        )));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(HubError::invalid(format!(
            "{field}: {} bytes is over the limit of {MAX_NAME_BYTES} bytes; expected up to 63 lowercase letters, digits, `-`, `_` or `.`",
            value.len()
        )));
    }
    let ok = value
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' || c == '.')
        && value
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok {
        return Err(HubError::invalid(format!(
            "{field}: `{}` is not a valid name; expected up to 63 lowercase letters, digits, `-`, `_` or `.`, starting with a letter or digit",
            prefix(value)
        )));
    }
    Ok(())
}

/// At most [`ECHO_BYTES`] of `s` (cut at a character boundary, `…` when cut), for error texts.
pub fn prefix(s: &str) -> String {
    cut(s, ECHO_BYTES)
}

pub use crate::error::cut;

/// A size flag: bytes, or a number with `KiB`, `MiB` or `GiB`.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: usize = num.parse().map_err(|_| {
        format!(
            "`{}` is not a size; expected e.g. 1048576, 1MiB or 64KiB",
            cut(s, 32)
        )
    })?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => KIB,
        "MiB" | "M" => MIB,
        "GiB" | "G" => 1024 * MIB,
        "KB" => 1000,
        "MB" => 1000 * 1000,
        "GB" => 1000 * 1000 * 1000,
        other => {
            return Err(format!(
                "`{}` is not a size unit; expected B, KiB, MiB, GiB, KB, MB or GB",
                cut(other, 16)
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{}` is too large", cut(s, 32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(got: Result<()>, expected: Result<(), &str>) {
        match (got.map_err(|e| e.to_string()), expected) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(text)) => assert_eq!(e, text),
            (got, expected) => panic!("got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn names_are_short_lowercase_words() {
        #[track_caller]
        fn name(n: &str, expected: Result<(), &str>) {
            let got = validate_name("name", n).map_err(|e| e.to_string());
            match (got, expected) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(part)) => assert!(e.contains(part), "{n}: {e}"),
                (got, expected) => panic!("{n}: got {got:?}, expected {expected:?}"),
            }
        }
        name("hello", Ok(()));
        name("a-b_c.d9", Ok(()));
        name("9lives", Ok(()));
        name(&"x".repeat(63), Ok(()));
        name("", Err("name: expected a name, got an empty string"));
        name("Hello", Err("`Hello` is not a valid name"));
        name("-x", Err("starting with a letter or digit"));
        name("a b", Err("not a valid name"));
        name(
            &"x".repeat(64),
            Err("name: 64 bytes is over the limit of 63 bytes"),
        );
        let long_bad = "X".repeat(5000);
        let e = validate_name("name", &long_bad).expect_err("too long");
        assert!(e.to_string().len() < 200, "{e}");
    }

    #[test]
    fn label_keys_follow_the_rule_and_values_their_limit() {
        let l = Limits::default();
        let one = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        check(l.check_labels("labels", &one("team", "a")), Ok(()));
        check(l.check_labels("labels", &one("a.b/c-d_e9", "")), Ok(()));
        check(l.check_labels("labels", &one("x", "")), Ok(()));
        check(
            l.check_labels("labels", &one("bad key!", "v")),
            Err("labels: key `bad key!` is not a label key; expected letters, digits, `.`, `_`, `/` or `-`, starting and ending with a letter or digit"),
        );
        check(
            l.check_labels("labels", &one("", "v")),
            Err("labels: key `` is not a label key; expected letters, digits, `.`, `_`, `/` or `-`, starting and ending with a letter or digit"),
        );
        check(l.check_labels("labels", &one("-x", "v")).map(|_| ()), Err("labels: key `-x` is not a label key; expected letters, digits, `.`, `_`, `/` or `-`, starting and ending with a letter or digit"));
        check(
            l.check_labels("labels", &one(&"k".repeat(128), "v")),
            Ok(()),
        );
        let long = "k".repeat(129);
        check(
            l.check_labels("labels", &one(&long, "v")),
            Err(&format!(
                "labels: key `{}…`: 129 bytes is over the limit of 128 bytes",
                "k".repeat(64)
            )),
        );
        check(
            l.check_labels("labels", &one("k", &"v".repeat(1024))),
            Ok(()),
        );
        check(
            l.check_labels("labels", &one("k", &"v".repeat(1025))),
            Err("labels[k]: 1025 bytes is over the limit of 1024 bytes"),
        );
        let many = |n: usize| -> BTreeMap<String, String> {
            (0..n).map(|i| (format!("k{i}"), String::new())).collect()
        };
        check(l.check_labels("labels", &many(64)), Ok(()));
        check(
            l.check_labels("labels", &many(65)),
            Err("labels: 65 labels is over the limit of 64 labels"),
        );
    }

    #[test]
    fn inputs_keys_and_histories_at_and_past_their_limits() {
        let l = Limits::default();
        check(l.check_input(&"a".repeat(1 << 20)), Ok(()));
        check(
            l.check_input(&"a".repeat((1 << 20) + 1)),
            Err("input: 1048577 bytes is over the limit of 1048576 bytes"),
        );
        check(l.check_conversation_key(&"c".repeat(256)), Ok(()));
        check(
            l.check_conversation_key(&"c".repeat(257)),
            Err("conversation_key: 257 bytes is over the limit of 256 bytes"),
        );
        check(l.check_history("c", 32 << 20), Ok(()));
        let e = l.check_history("c", (32 << 20) + 1).expect_err("quota");
        assert!(matches!(e, HubError::ResourceExhausted(_)), "{e:?}");
        assert!(e.to_string().contains("quota of 33554432 bytes"), "{e}");
    }

    #[test]
    fn prefixes_cut_at_character_boundaries() {
        assert_eq!(cut("héllo", 2), "h…");
        assert_eq!(cut("héllo", 3), "hé…");
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(prefix(&"x".repeat(1000)).len(), ECHO_BYTES + "…".len());
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("1PB").is_err());
    }

    #[test]
    fn the_default_table_is_valid_and_leaves_room_below_the_message_limit() {
        assert_eq!(Limits::default().validate().ok(), Some(()));
        let too_big = Limits {
            history_bytes: MAX_MESSAGE_BYTES,
            ..Limits::default()
        };
        assert!(too_big.validate().is_err());
    }
}
