//! `agen`: the command line of Agen. Thin: parses arguments and calls the libraries.

/// Every Agen process (Hub, Nest, instance, tool servers) is this binary; glibc's allocator
/// was a fifth of the CPU of a loaded fleet (`perf`, BENCHMARKS.md), mimalloc is cheaper.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // clap, with the daemons' AGEN_HUB_*/AGEN_NEST_* variables and --config file applied.
    let cli = agen_cli::daemon_config::parse();
    let code = agen_cli::main(cli);
    std::process::exit(code);
}
