//! `agen completions bash|zsh|fish`: prints the shell completion script for `agen`.

use clap::CommandFactory;

/// Arguments of `agen completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The shells `agen completions` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut cmd = crate::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "agen", &mut script);
    crate::out::line(String::from_utf8_lossy(&script).trim_end());
    Ok(0)
}
