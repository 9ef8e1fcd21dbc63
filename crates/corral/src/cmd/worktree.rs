//! `corral run --worktree NAME`, `corral worktree ls [--json]`, `corral worktree rm NAME`: agents
//! side by side on one repository, each in its own git worktree and jail (worktrees.rs).

use std::process::ExitCode;

use anyhow::{Context, bail};
use corral_policy::plan::{Engine, Plan};
use corral_policy::resolve::ensure_state_paths;

use crate::cli::{EngineArg, JailOptions, WorktreeCommand, WorktreesArgs};
use corral_run::worktrees;

/// Run `profile`/`command` jailed in the worktree `name` of the repository holding the current
/// directory: made or reused, locked for this run, its branch brought back when the jail ends.
pub fn run(
    name: &str,
    profile: Option<String>,
    opts: &JailOptions,
    command: Vec<String>,
    early: Option<corral_sandbox::PreparedJail>,
) -> anyhow::Result<ExitCode> {
    // `--engine podman|docker` is refused before any worktree is made (a policy file's engine
    // after the plan is resolved: `native_only`).
    if let Some(e @ (EngineArg::Podman | EngineArg::Docker | EngineArg::Kube)) = opts.engine {
        bail!("{}", container_refused(&format!("{e:?}")));
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let layout = worktrees::Layout::new(&cwd, name)?;
    // Held until the branch is back: the "agent running" marker, one run per worktree.
    let _lock = worktrees::lock(&layout)?;
    let verb = if worktrees::ensure(&layout)? {
        "created"
    } else {
        "reusing"
    };
    eprintln!(
        "corral: {verb} worktree {name} (branch {name}) at {}",
        layout.path.display()
    );
    let session = worktrees::prepare(&layout)?;
    let mut opts = opts.clone();
    opts.project = Some(layout.path.clone());
    let mut req = super::plan::request(profile, &opts, command)?;
    // The same place in the worktree as the caller's in the repository, when it exists there.
    req.cwd = cwd
        .strip_prefix(&layout.main)
        .ok()
        .map(|rel| layout.path.join(rel))
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| layout.path.clone());
    let resolved = corral_run::trust::resolve(&req)?;
    native_only(resolved.plan())?;
    if resolved.plan().project.review.is_some() {
        anyhow::bail!(
            "--review and --worktree: a worktree run is already held apart from the checkout \
             (its branch comes back when it ends); use one or the other"
        );
    }
    let plan = resolved.gate_in_worktree(&layout.path, &layout.policy_file_of_main())?;
    ensure_state_paths(&plan.profile, &req.home)?;
    let (held, state_plan) = corral_run::native::hold_state(&plan)?;
    let plan = session.confine(state_plan.as_ref().unwrap_or(&plan));
    let code = corral_run::native::run_plan_in_state(
        &plan,
        corral_session::Scope::Run,
        early,
        held.as_ref(),
    );
    for line in worktrees::finish(&session) {
        eprintln!("corral: {line}");
    }
    let code = code?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The worktree's jail is built from mounts the container engines do not make (a read-only
/// `.git` with writable parts bound over it from elsewhere).
fn native_only(plan: &Plan) -> anyhow::Result<()> {
    let native = match plan.engine {
        Engine::Native => true,
        Engine::Auto => corral_sandbox::probe::run().native_backend,
        Engine::Podman | Engine::Docker | Engine::Kube => false,
    };
    if !native {
        bail!("{}", container_refused(&format!("{:?}", plan.engine)));
    }
    Ok(())
}

fn container_refused(engine: &str) -> String {
    format!(
        "--worktree runs on the native backend only, and this run would use a container engine \
         (engine {engine}): run it with --engine native on a host where `corral doctor` shows \
         the native backend"
    )
}

/// `corral worktree ls [--json]` (and its old spelling `corral worktrees`).
pub fn list(args: WorktreesArgs) -> anyhow::Result<ExitCode> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let (base, entries) = worktrees::list(&cwd)?;
    if args.json {
        let text = serde_json::to_string_pretty(&entries).context("cannot serialize the list")?;
        outln!("{text}")?;
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        outln!(
            "no worktrees yet (corral run --worktree NAME makes one under {})",
            base.display()
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!("NAME\tAGENT\tBRANCH\tAHEAD\tBEHIND\tCHANGED\tUNCOMMITTED\tPATH")?;
    for e in &entries {
        outln!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            e.name,
            if e.running { "running" } else { "-" },
            e.branch.as_deref().unwrap_or("(detached)"),
            e.ahead,
            e.behind,
            e.changed,
            e.uncommitted,
            e.path.display()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `corral worktree ls|rm`.
pub fn run_command(cmd: WorktreeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        WorktreeCommand::Ls(args) => list(args),
        WorktreeCommand::Rm(args) => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            for line in worktrees::remove(&cwd, &args.name, args.force, args.delete_branch)? {
                outln!("{line}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
