//! One module per subcommand. Each exposes `Args` (clap) and `run(args) -> anyhow::Result<i32>`
//! returning the exit code.

pub mod fake_model;
pub mod hub;
pub mod instance;
pub mod mcp;
pub mod nest;
pub mod run;
pub mod up;
