//! `agen`: the command line of Agen. Thin: parses arguments and calls the libraries.

use clap::Parser;

/// Every Agen process (Hub, Nest, instance, tool servers) is this binary; glibc's allocator
/// was a fifth of the CPU of a loaded fleet (`perf`, BENCHMARKS.md), mimalloc is cheaper.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = agen_cli::Cli::parse();
    let code = agen_cli::main(cli);
    std::process::exit(code);
}
