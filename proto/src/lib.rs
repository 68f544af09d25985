//! The `agen.v1` gRPC API, generated at build time from `proto/agen/v1/*.proto`.
//!
//! This crate owns the generated code and, in [`convert`], the conversions between it and the
//! cross-process contract (`agen-contract`) that both the Hub and the Nest speak, written once.
//! Other domain types live in `agen-shared` and the daemons; their conversions live at each gRPC
//! edge (`hub/src/server`, `nest/src/hub_client`, `agen-cli`).

pub mod convert;

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("agen.v1");

    // Secret values never show in `Debug` (logs, panics, test failures): names only.
    impl std::fmt::Debug for SetSecretRequest {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SetSecretRequest")
                .field("namespace", &self.namespace)
                .field("name", &self.name)
                .field(
                    "value",
                    &format_args!("[redacted; {} bytes]", self.value.len()),
                )
                .finish()
        }
    }

    impl std::fmt::Debug for PlaceInstance {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let mut secrets: Vec<&String> = self.platform_secrets.keys().collect();
            secrets.sort();
            f.debug_struct("PlaceInstance")
                .field("instance_id", &self.instance_id)
                .field("namespace", &self.namespace)
                .field("deployment", &self.deployment)
                .field("bundle_digest", &self.bundle_digest)
                .field("generation", &self.generation)
                .field("concurrency", &self.concurrency)
                .field("platform_secrets", &secrets)
                .finish()
        }
    }
}

/// The gRPC message limit on every Agen link, at both ends (Hub server, Nest client, CLI): above
/// every field limit of the Hub's limit table, so that an over-limit field is refused by Agen with
/// a message instead of breaking a stream.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Encoded `FileDescriptorSet` of every `agen.v1` proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agen_descriptor.bin"));
