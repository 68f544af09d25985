//! `agen version`: the crate version, the commit this binary was built from and the protocol
//! version (`MAJOR.MINOR`) its Hub and Nest speak, one per line (`-o json` for scripts).

use agen_shared::version::{Protocol, CRATE_VERSION};

use crate::client::Output;

/// The commit this binary was built from (`unknown` when built outside git).
pub const COMMIT: &str = env!("AGEN_COMMIT");

/// Arguments of `agen version`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
}

/// What `agen version -o json` prints.
#[derive(Debug, serde::Serialize)]
struct Versions<'a> {
    version: &'a str,
    commit: &'a str,
    protocol: String,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let protocol = Protocol::spoken();
    match args.output {
        Output::Table => {
            crate::outln!("agen {CRATE_VERSION}");
            crate::outln!("commit {COMMIT}");
            crate::outln!("protocol {protocol}");
        }
        output => {
            let v = Versions {
                version: CRATE_VERSION,
                commit: COMMIT,
                protocol: protocol.to_string(),
            };
            crate::view::print_value(output, &serde_json::to_value(v)?)
        }
    }
    Ok(0)
}
