//! Criterion benchmarks of the bundle archive hot paths: `pack` (walk + encode), `digest`
//! (sha256), `decode` and `unpack` (decode + checked write + rename) on a realistic bundle of
//! 100 files and 2 MiB, each reported in bytes/s of archive.
//!
//! Invariants: runs only under `cargo bench` (never in `cargo test`); every file it writes is
//! under a temporary folder removed at the end; unpack targets are removed between iterations,
//! outside the timed section, so the disk use stays at one bundle.

use std::path::Path;
use std::time::{Duration, Instant};

use agen_shared::bundle::{decode, digest, pack, unpack};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Number of files in the benchmark bundle.
const FILES: usize = 100;
/// Total bytes of file content in the benchmark bundle.
const TOTAL_BYTES: usize = 2 * 1024 * 1024;

/// Writes a bundle-shaped folder: the agent files, a few skills, and data files whose sizes add
/// up to [`TOTAL_BYTES`] (a mix of text and incompressible bytes, as real bundles have).
fn write_bundle(dir: &Path) {
    let write = |rel: &str, data: &[u8]| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().expect("a bundle path has a parent"))
            .expect("create the benchmark bundle folder");
        std::fs::write(&path, data).expect("write a benchmark bundle file");
    };
    let agent = b"---\nname: bench\nmodel: openai/fake\n---\nYou are a benchmark agent.\n";
    let mcp = br#"{"mcpServers": {"ws": {"command": "agen", "args": ["mcp", "workspace", "--root", "."]}}}"#;
    write("x-agen/agent.md", agent);
    write("mcp.json", mcp);
    let fixed = agent.len() + mcp.len();
    let per_file = (TOTAL_BYTES - fixed) / (FILES - 2);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..FILES - 2 {
        let data: Vec<u8> = if i % 2 == 0 {
            // Text: a skill or a doc.
            "Lorem ipsum dolor sit amet, consectetur adipiscing elit.\n"
                .bytes()
                .cycle()
                .take(per_file)
                .collect()
        } else {
            // Incompressible bytes (xorshift), like images or models shipped with a bundle.
            (0..per_file)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect()
        };
        let rel = if i % 2 == 0 {
            format!("skills/skill-{i:03}/SKILL.md")
        } else {
            format!("data/blob-{i:03}.bin")
        };
        write(&rel, &data);
    }
}

fn bundle_benches(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("create a temporary folder for the benchmark");
    let src = tmp.path().join("bundle");
    write_bundle(&src);
    let archive = pack(&src).expect("pack the benchmark bundle");
    let bytes = archive.len() as u64;

    let mut group = c.benchmark_group("bundle");
    group.throughput(Throughput::Bytes(bytes));
    let label = format!("{FILES}files_{}KiB", bytes / 1024);

    group.bench_function(BenchmarkId::new("pack", &label), |b| {
        b.iter(|| pack(&src).expect("pack"))
    });
    group.bench_function(BenchmarkId::new("digest", &label), |b| {
        b.iter(|| digest(&archive))
    });
    group.bench_function(BenchmarkId::new("decode", &label), |b| {
        b.iter(|| decode(&archive).expect("decode"))
    });
    // Unpacking writes 100 files; fewer samples keep the run to a few seconds.
    group.sample_size(30);
    let mut n = 0u64;
    group.bench_function(BenchmarkId::new("unpack", &label), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let into = tmp.path().join(format!("out-{n}"));
                let start = Instant::now();
                unpack(&archive, &into).expect("unpack");
                total += start.elapsed();
                std::fs::remove_dir_all(&into).expect("remove the unpacked bundle");
            }
            total
        })
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bundle_benches
}
criterion_main!(benches);
