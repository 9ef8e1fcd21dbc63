//! `corral generate completions SHELL` and `corral generate man`: shell completions and the man
//! page, generated from the clap definition in `cli.rs` so they cannot drift from the CLI.
//!
//! Installed with (see the README):
//!
//! ```sh
//! corral generate completions bash > ~/.local/share/bash-completion/completions/corral
//! corral generate completions zsh  > ~/.zfunc/_corral        # with fpath+=(~/.zfunc)
//! corral generate completions fish > ~/.config/fish/completions/corral.fish
//! corral generate man --dir ~/.local/share/man/man1           # corral.1, corral-run.1, ...
//! ```

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, GenerateCommand};

pub fn run(cmd: GenerateCommand) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    write(cmd, &mut out)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn write(cmd: GenerateCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut command = Cli::command();
    match cmd {
        GenerateCommand::Completions { shell } => {
            // clap_complete panics on a failed write; a closed pipe (`| head -1`) is an error
            // main ends on quietly.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "corral", &mut script);
            out.write_all(&script)?;
        }
        GenerateCommand::Man { dir: None } => {
            clap_mangen::Man::new(command)
                .render(out)
                .context("cannot render the man page")?;
        }
        GenerateCommand::Man { dir: Some(dir) } => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
            writeln!(out, "wrote the corral man pages into {}", dir.display())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap_complete::Shell;

    fn generate(cmd: GenerateCommand) -> String {
        let mut out = Vec::new();
        write(cmd, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn subcommands() -> Vec<String> {
        // Not the hidden internal ones (`port-relay`): no page, no completion.
        Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_string())
            .collect()
    }

    /// The shell's own syntax check, when that shell is installed.
    fn syntax_ok(shell: &str, script: &str) -> Option<bool> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("completion");
        std::fs::write(&file, script).unwrap();
        let status = std::process::Command::new(shell)
            .arg("-n")
            .arg(&file)
            .status()
            .ok()?;
        Some(status.success())
    }

    #[test]
    fn bash_completion_parses_and_knows_every_command() {
        let script = generate(GenerateCommand::Completions { shell: Shell::Bash });
        assert!(script.contains("complete -F _corral"), "{script}");
        for sub in subcommands() {
            assert!(script.contains(&format!("corral__subcmd__{sub}")), "{sub}");
        }
        assert_eq!(syntax_ok("bash", &script), Some(true));
    }

    #[test]
    fn zsh_and_fish_completions() {
        let zsh = generate(GenerateCommand::Completions { shell: Shell::Zsh });
        assert!(zsh.starts_with("#compdef corral"), "{zsh}");
        match syntax_ok("zsh", &zsh) {
            Some(ok) => assert!(ok, "zsh -n failed"),
            None => eprintln!("skipping zsh -n: zsh is not installed"),
        }
        let fish = generate(GenerateCommand::Completions { shell: Shell::Fish });
        for sub in subcommands() {
            assert!(fish.contains(&format!("-a \"{sub}\"")), "{sub}: {fish}");
        }
        match syntax_ok("fish", &fish) {
            Some(ok) => assert!(ok, "fish -n failed"),
            None => eprintln!("skipping fish -n: fish is not installed"),
        }
    }

    #[test]
    fn man_page_names_every_command() {
        let man = generate(GenerateCommand::Man { dir: None });
        assert!(man.starts_with(".ie \\n(.g .ds Aq"), "{man}");
        assert!(man.contains(".TH corral 1"), "{man}");
        for sub in subcommands() {
            assert!(man.contains(&format!("corral\\-{sub}(1)")), "{sub}");
        }
    }

    #[test]
    fn man_dir_has_a_page_for_every_command_it_refers_to() {
        let dir = tempfile::tempdir().unwrap();
        let said = generate(GenerateCommand::Man {
            dir: Some(dir.path().to_path_buf()),
        });
        assert_eq!(
            said,
            format!("wrote the corral man pages into {}\n", dir.path().display())
        );
        assert!(dir.path().join("corral.1").is_file());
        for sub in subcommands() {
            let page = std::fs::read_to_string(dir.path().join(format!("corral-{sub}.1"))).unwrap();
            assert!(page.contains(&format!(".TH corral-{sub} 1")), "{page}");
        }
        let run = std::fs::read_to_string(dir.path().join("corral-run.1")).unwrap();
        assert!(run.contains("\\-\\-scratch"), "{run}");
    }
}
