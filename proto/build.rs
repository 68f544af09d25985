//! Compiles `agen/v1/*.proto` with protox (pure Rust, no system `protoc`) and generates the
//! tonic client/server code plus a file descriptor set for gRPC server reflection.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["agen/v1/agen.proto", "agen/v1/nest.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("agen_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // `NestService/Connect` would clash with the generated `connect` constructor; clients
        // build a `Channel` themselves and call `new(channel)`.
        .build_transport(false)
        // Messages that carry secret values get a `Debug` that prints names only (src/lib.rs).
        .skip_debug([".agen.v1.SetSecretRequest", ".agen.v1.PlaceInstance"])
        .compile_fds(fds)?;
    Ok(())
}
