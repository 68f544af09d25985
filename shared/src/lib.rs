//! Agen's shared vocabulary: ids, the bundle model and its validation, durations, client
//! config, TLS helpers and telemetry setup. Used by every other crate; knows no gRPC.

pub mod bundle;
pub mod client_config;
pub mod duration;
pub mod private;
#[cfg(target_os = "linux")]
pub mod privileged;
#[cfg(target_os = "linux")]
pub mod process;
pub mod systemd;
pub mod telemetry;
pub mod text;
pub mod tls;
pub mod version;
