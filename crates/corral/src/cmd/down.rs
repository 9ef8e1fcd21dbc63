//! `corral down`: remove this project's containers and networks (container engines), and the
//! Kubernetes objects its killed `--engine kube` runs left (corral-run's `kube::down_leftovers`).

use std::process::ExitCode;

use anyhow::Context as _;
use corral_engine::runner;
use corral_engine::{EngineKind, Names};

use crate::cli::{DownArgs, EngineArg};

pub fn run(args: DownArgs) -> anyhow::Result<ExitCode> {
    let req =
        corral_policy::Request::from_process().context("cannot describe the calling process")?;
    let plan = corral_policy::resolve(&req)?;
    // Each part is tried even when the other failed (a cluster out of reach does not keep the
    // containers, nor the reverse).
    let mut failed = Vec::new();
    if args.engine != Some(EngineArg::Kube)
        && let Err(e) = engines(&args, &plan)
    {
        failed.push(e);
    }
    if matches!(args.engine, None | Some(EngineArg::Kube | EngineArg::Auto))
        && let Err(e) = kube(&plan, args.engine == Some(EngineArg::Kube))
    {
        failed.push(e);
    }
    match failed.len() {
        0 => Ok(ExitCode::SUCCESS),
        1 => Err(failed.remove(0)),
        _ => {
            for e in &failed {
                eprintln!("corral: {e:#}");
            }
            anyhow::bail!(
                "corral down: {} parts failed; see the messages above",
                failed.len()
            )
        }
    }
}

/// The objects of this project's kube runs whose corral was killed (each run's record names
/// its context, namespace and jail; deleted by manifest, else by the jail's label).
fn kube(plan: &corral_policy::plan::Plan, explicit: bool) -> anyhow::Result<()> {
    let removed = corral_run::kube::down_leftovers(&plan.project.root)
        .context("cannot delete what this project's kube runs left")?;
    for name in &removed {
        eprintln!("corral: kube: deleted the objects of jail {name} (left by a killed run)");
    }
    if removed.is_empty() && explicit {
        eprintln!("corral: kube: no run of this project left objects behind");
    }
    Ok(())
}

/// podman's and docker's containers and networks of the project.
fn engines(args: &DownArgs, plan: &corral_policy::plan::Plan) -> anyhow::Result<()> {
    let explicit = matches!(args.engine, Some(EngineArg::Podman | EngineArg::Docker));
    let kinds: Vec<EngineKind> = match args.engine {
        Some(EngineArg::Podman) => vec![EngineKind::Podman],
        Some(EngineArg::Docker) => vec![EngineKind::Docker],
        // Both, when present: a project may have used either.
        Some(EngineArg::Auto) | Some(EngineArg::Native) | Some(EngineArg::Kube) | None => {
            [EngineKind::Podman, EngineKind::Docker]
                .into_iter()
                .filter(|k| runner::on_path(k.program()))
                .collect()
        }
    };
    if kinds.is_empty() {
        eprintln!("corral: neither podman nor docker is on PATH: nothing to remove");
        return Ok(());
    }
    let prefix = std::env::var("CORRAL_ENGINE_PREFIX")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| corral_engine::names::DEFAULT_PREFIX.to_string());
    let names = Names::new(&prefix, &plan.project.root);
    let mut failures = Vec::new();
    let tried = kinds.len();
    for kind in kinds {
        let removed = match runner::down(kind, &names) {
            Ok(r) => r,
            // Without --engine, an engine whose client is installed but cannot reach its
            // daemon (docker without dockerd) holds nothing of ours: say so and go on.
            Err(e) if !explicit => {
                eprintln!("corral: {kind}: skipped: {e}");
                failures.push(e);
                continue;
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot remove the project's {kind} objects"));
            }
        };
        for c in &removed.containers {
            eprintln!("corral: {kind}: removed container {c}");
        }
        for n in &removed.networks {
            eprintln!("corral: {kind}: removed network {n}");
        }
        if removed.containers.is_empty() && removed.networks.is_empty() {
            eprintln!("corral: {kind}: nothing of project {} to remove", names.key);
        }
    }
    if failures.len() == tried {
        anyhow::bail!("no container engine could be reached; see the messages above");
    }
    // The gateway and sign-in files of runs with [secrets] or sign-ins whose corral was killed
    // (their containers are gone with the project's above).
    for dir in runner::remove_gateway_leftovers(&plan.project.root)? {
        eprintln!("corral: removed {} (left by a killed run)", dir.display());
    }
    // The socket directories of runs with publish/host_ports whose corral was killed.
    let state = runner::project_state_dir(&plan.project.root)?;
    if let Some(dir) = corral_engine::ports::remove_leftovers(&state)? {
        eprintln!("corral: removed {} (left by a killed run)", dir.display());
    }
    Ok(())
}
