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
