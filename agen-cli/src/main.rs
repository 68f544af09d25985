//! `agen`: the command line of Agen. Thin: parses arguments and calls the libraries.

use clap::Parser;

fn main() {
    let cli = agen_cli::Cli::parse();
    let code = agen_cli::main(cli);
    std::process::exit(code);
}
