//! `corral generate completions SHELL` and `corral generate man`: shell completions and the man
//! page, generated from the clap definition in `cli.rs` so they cannot drift from the CLI.
//!
//! Installed with (see the README):
//!
//! ```sh
//! corral generate completions bash > ~/.local/share/bash-completion/completions/corral
//! corral generate completions zsh  > ~/.zfunc/_corral        # with fpath+=(~/.zfunc)
//! corral generate completions fish > ~/.config/fish/completions/corral.fish
//! corral generate man > ~/.local/share/man/man1/corral.1
//! ```

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, GenerateCommand};

pub fn run(cmd: GenerateCommand) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    write(cmd, &mut out)?;
    out.flush().context("cannot write to standard output")?;
    Ok(ExitCode::SUCCESS)
}

pub fn write(cmd: GenerateCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut command = Cli::command();
    match cmd {
        GenerateCommand::Completions { shell } => {
            clap_complete::generate(shell, &mut command, "corral", out);
        }
        GenerateCommand::Man => {
            clap_mangen::Man::new(command)
                .render(out)
                .context("cannot render the man page")?;
        }
    }
    Ok(())
}
