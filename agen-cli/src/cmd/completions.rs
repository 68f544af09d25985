//! `agen completions bash|zsh|fish`: prints the shell completion script for `agen`: clap's
//! static script (subcommands, flags) and a hook that asks `agen __complete` for the
//! deployment, task and Nest names where a command takes one, falling back to the static
//! completions when it offers none (see `cmd::complete`).

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
    crate::out::line(hook(args.shell));
    Ok(0)
}

/// The part of the script that completes names by `agen __complete`.
fn hook(shell: Shell) -> &'static str {
    match shell {
        Shell::Bash => {
            r#"
# Deployment, task and Nest names, asked of the Hub (agen __complete); else the above.
_agen_names() {
    local cur="${COMP_WORDS[COMP_CWORD]}" names
    names=$("${COMP_WORDS[0]}" __complete -- "${COMP_WORDS[@]:1:COMP_CWORD-1}" 2>/dev/null)
    if [[ -n "$names" ]]; then
        COMPREPLY=($(compgen -W "$names" -- "$cur"))
        return 0
    fi
    _agen "$@"
}
complete -F _agen_names -o nosort -o bashdefault -o default agen"#
        }
        Shell::Zsh => {
            r#"
# Deployment, task and Nest names, asked of the Hub (agen __complete); else the above.
_agen_names() {
    local -a names
    names=(${(f)"$(agen __complete -- ${words[2,CURRENT-1]} 2>/dev/null)"})
    if (( ${#names} )); then
        compadd -a names
    else
        _agen "$@"
    fi
}
compdef _agen_names agen"#
        }
        Shell::Fish => {
            r#"
# Deployment, task and Nest names, asked of the Hub (agen __complete).
complete -c agen -f -a '(agen __complete -- (commandline -opc)[2..-1] 2>/dev/null)'"#
        }
    }
}
