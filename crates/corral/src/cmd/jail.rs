//! `corral run [PROFILE] [-- CMD]` and `corral shell`: the command line made into a policy
//! request, run by corral-run (resolved, gated, run on its backend); the command's exit code.

use std::process::ExitCode;

use corral_sandbox::PreparedJail;

use crate::cli::{EngineArg, JailOptions, RunArgs};

/// `corral run`. `early`: the jail's set-up process main() forked, if it did.
pub fn run(args: RunArgs, early: Option<PreparedJail>) -> anyhow::Result<ExitCode> {
    if let Some(name) = &args.worktree {
        // `--worktree NAME`: the run in an agent's own git worktree (cmd/worktree.rs).
        return super::worktree::run(name, args.profile, &args.jail, args.command, early);
    }
    if args.jail.engine == Some(EngineArg::Kube) || !args.kube.given().is_empty() {
        // `--engine kube`: cmd/kube_run.rs, into corral-run's `kube::run` (it refuses its
        // options on any other engine).
        return super::kube_run::run(args.profile, &args.jail, &args.kube, args.command, early);
    }
    run_jail(args.profile, &args.jail, args.command, early)
}

/// Resolve the plan for `profile`/`command` with the command-line layer `opts`, and run it
/// (with the set-up process `early` when main() forked one).
pub fn run_jail(
    profile: Option<String>,
    opts: &JailOptions,
    command: Vec<String>,
    early: Option<PreparedJail>,
) -> anyhow::Result<ExitCode> {
    let req = super::plan::request(profile, opts, command)?;
    let code = corral_run::native::run_jail(&req, opts.discard_pending, early)?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}
