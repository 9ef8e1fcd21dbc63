//! One module per command. Each returns the process exit code, or an error printed as
//! `corral: ...` with exit 125.

use std::process::ExitCode;

use corral_sandbox::PreparedJail;

use crate::cli::{Cli, Command};

mod doctor;
mod down;
mod exec;
mod generate;
mod image;
pub mod init;
mod jail;
mod kube;
mod kube_run;
pub mod log;
pub mod plan;
mod profile_arg;
mod proxy;
mod review;
pub mod rules;
mod serve;
mod shell;
mod shim;
mod skill;
mod state;
pub mod trust;
mod undo;
mod watch;
mod worktree;

/// `corral exec ...`, parsed without the rest of the command line's parser (main.rs): the
/// process's exit code.
pub fn exec_main() -> ExitCode {
    use clap::CommandFactory;
    let mut args = std::env::args_os();
    let program = args.next().unwrap_or_else(|| "corral".into());
    let name = std::path::Path::new(&program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "corral".into());
    // Past "exec": its own arguments, under the name its usage lines give.
    args.next();
    let rest: Vec<std::ffi::OsString> = args.collect();
    if let Some(args) = plain_exec(&rest) {
        return exec_with(args);
    }
    let parser = crate::cli::ExecCli::command().bin_name(format!("{name} exec"));
    let cli: crate::cli::ExecCli = match crate::usage::parse_from(
        parser,
        std::iter::once(std::ffi::OsString::from("exec")).chain(rest),
    ) {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    exec_with(cli.args)
}

/// `corral exec`'s arguments when they are `-- CMD ARGS...` and nothing else, all UTF-8: the
/// form agents use, read without building clap's parser (what clap gives for it: everything
/// after `--` is the command, every option unset). Anything else: `None`, for clap.
pub fn plain_exec(args: &[std::ffi::OsString]) -> Option<crate::cli::ExecArgs> {
    let (first, command) = args.split_first()?;
    if first != "--" || command.is_empty() {
        return None;
    }
    let command = command
        .iter()
        .map(|a| a.to_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()?;
    Some(crate::cli::ExecArgs {
        timeout: None,
        cwd: None,
        stdin: false,
        env: Vec::new(),
        command,
    })
}

fn exec_with(args: crate::cli::ExecArgs) -> ExitCode {
    match exec::run(args) {
        Ok(code) => code,
        Err(err) if crate::usage::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("corral: {err:#}");
            ExitCode::from(crate::EXIT_CORRAL_ERROR)
        }
    }
}

/// Whether the command line `args` (program name first) is one that runs a native jail from
/// this process: `run`, `shell`, and the executor's `serve --jail-helper`. Read before the
/// command line is parsed (main.rs); a wrong guess costs one fork, or one exec later.
pub fn starts_a_jail(mut args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    match args.nth(1) {
        Some(cmd) if cmd == "run" || cmd == "shell" => true,
        Some(cmd) if cmd == "serve" => args.any(|a| a == "--jail-helper"),
        _ => false,
    }
}

/// Whether the command line runs a jail with corral's proxy in this process (`run`, `shell`):
/// corral raises its open-file limit for it at start.
pub fn serves_a_proxy(mut args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.nth(1)
        .is_some_and(|cmd| cmd == "run" || cmd == "shell")
}

/// Run the command `cli`. `early`: the jail's set-up process main() forked for a command that
/// [`starts_a_jail`], for the run that starts it (dropped, so ended, by any other).
pub fn dispatch(cli: Cli, early: Option<PreparedJail>) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => {
            profile_arg::check("run", args.profile.as_deref(), &args.extra)?;
            jail::run(args, early)
        }
        Command::Shell(args) => {
            profile_arg::check("shell", args.profile.as_deref(), &args.extra)?;
            shell::shell(args, early)
        }
        Command::Exec(args) => exec::run(args),
        Command::Serve(args) => serve::run(args, early),
        Command::Proxy(args) => proxy::run(args),
        Command::Plan(args) => {
            profile_arg::check("plan", args.profile.as_deref(), &args.extra)?;
            plan::run(args)
        }
        Command::Init(args) => init::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Log(args) if args.runs => undo::log_runs(args.json),
        Command::Log(args) => log::run(args),
        Command::Diff(args) => review::diff(args),
        Command::Accept(args) => review::accept(args),
        Command::Discard(args) => review::discard(args),
        Command::Undo(args) => undo::run(args),
        Command::Image(cmd) => image::run(cmd),
        Command::Down(args) => down::run(args),
        Command::PortRelay(args) => {
            corral_engine::ports::serve_relay(&args.dir, &args.publish, &args.host_port)
                .map_err(|e| anyhow::anyhow!("corral port-relay: {e}"))?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Kube(cmd) => kube::run(cmd),
        Command::Shim(cmd) => shim::run(cmd),
        Command::Allow(args) => rules::run(rules::Rule::Allow, args),
        Command::Deny(args) => rules::run(rules::Rule::Deny, args),
        Command::Skill(args) => skill::run(args),
        Command::Trust(args) => trust::run(args),
        Command::Watch(args) => watch::run(args),
        Command::Generate(cmd) => generate::run(cmd),
        Command::State(cmd) => state::run(cmd),
        Command::Worktrees(args) => {
            eprintln!("corral: `corral worktrees` is now `corral worktree ls`");
            worktree::list(args)
        }
        Command::Worktree(cmd) => worktree::run_command(cmd),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use crate::cli::{Cli, Command, ExecCli};

    /// `corral exec` parsed alone (main.rs) answers as the whole command line's parser does:
    /// the same help, the same usage errors, the same arguments.
    #[test]
    fn exec_parsed_alone_is_exec_under_corral() {
        let mut whole = Cli::command().bin_name("corral");
        whole.build();
        let mut under = whole.find_subcommand_mut("exec").unwrap().clone();
        let mut alone = ExecCli::command().bin_name("corral exec");
        assert_eq!(
            under.render_long_help().to_string(),
            alone.render_long_help().to_string()
        );
        assert_eq!(
            under.render_help().to_string(),
            alone.render_help().to_string()
        );
        for args in [
            &[][..],
            &["--bogus", "--", "x"],
            &["--timeout"],
            &["true"],
            &["--help"],
            &["-h"],
            &["--version"],
        ] {
            let whole = Cli::try_parse_from(["corral", "exec"].iter().chain(args));
            let alone = ExecCli::command()
                .bin_name("corral exec")
                .try_get_matches_from(["exec"].iter().chain(args));
            match (whole, alone) {
                (Err(w), Err(a)) => {
                    assert_eq!(w.kind(), a.kind(), "{args:?}");
                    assert_eq!(w.render().to_string(), a.render().to_string(), "{args:?}");
                }
                (w, a) => panic!("{args:?}: {w:?} / {a:?}"),
            }
        }
        let args = [
            "--timeout",
            "5s",
            "--cwd",
            "sub",
            "--stdin",
            "--env",
            "TERM=x",
            "--",
            "ls",
            "-l",
        ];
        let Command::Exec(whole) = Cli::try_parse_from(["corral", "exec"].iter().chain(&args))
            .unwrap()
            .command
        else {
            panic!("not exec")
        };
        let mut m = ExecCli::command()
            .try_get_matches_from(["exec"].iter().chain(&args))
            .unwrap();
        let alone = ExecCli::from_arg_matches_mut(&mut m).unwrap().args;
        assert_eq!(format!("{whole:?}"), format!("{alone:?}"));
    }

    /// build.rs links GCC's unwinder into corral's executables (this test's too): none maps
    /// libgcc_s.so.1, and a panic still unwinds to the code that catches it.
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        not(target_feature = "crt-static")
    ))]
    #[test]
    fn the_unwinder_is_linked_in() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(!maps.contains("libgcc_s"), "{maps}");
        let caught = std::panic::catch_unwind(|| {
            if maps.len() > 1 {
                panic!("a panic that unwinds");
            }
        });
        assert!(caught.is_err());
    }

    /// `-- CMD ARGS...` read without clap gives what clap gives; every other form is left to
    /// clap (options, a missing command, no `--`, arguments that are not UTF-8).
    #[test]
    fn plain_exec_is_what_clap_parses() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        for args in [
            &["--", "true"][..],
            &["--", "ls", "-l", "--help", "--", "--timeout", "5s"],
            &["--", "--version"],
            &["--", ""],
        ] {
            let fast = super::plain_exec(&os(args)).expect("the plain form");
            let mut m = ExecCli::command()
                .try_get_matches_from(["exec"].iter().chain(args))
                .unwrap();
            let clap = ExecCli::from_arg_matches_mut(&mut m).unwrap().args;
            assert_eq!(format!("{fast:?}"), format!("{clap:?}"), "{args:?}");
        }
        for args in [
            &[][..],
            &["--"],
            &["true"],
            &["--timeout", "5s", "--", "true"],
            &["--stdin", "--", "true"],
            &["--help"],
        ] {
            assert!(super::plain_exec(&os(args)).is_none(), "{args:?}");
        }
        let not_utf8 = vec![OsString::from("--"), OsString::from_vec(vec![0xff, b'x'])];
        assert!(super::plain_exec(&not_utf8).is_none());
    }
}
