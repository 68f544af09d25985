//! The `agen.v1` gRPC API, generated at build time from `proto/agen/v1/*.proto`.
//!
//! This crate owns only generated code. Domain types live in `agen-shared`; conversion between
//! the two lives at each gRPC edge (`hub/src/server`, `nest/src/hub_link`, `agen-cli`).

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("agen.v1");
}

/// Encoded `FileDescriptorSet` of every `agen.v1` proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/agen_descriptor.bin"));
