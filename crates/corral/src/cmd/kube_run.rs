//! `corral run --engine kube`: the command line made into a trusted plan and corral-run's
//! `kube::RunOptions`, run by corral-run's Kubernetes backend (`corral-run/src/kube/`); its
//! exit code.

use std::process::ExitCode;

use anyhow::{Context as _, bail};

use crate::cli::{EngineArg, JailOptions, KubeRunArgs};

/// `corral run --engine kube [PROFILE] [-- CMD]`.
pub fn run(
    profile: Option<String>,
    jail: &JailOptions,
    kube: &KubeRunArgs,
    command: Vec<String>,
    early: Option<corral_sandbox::PreparedJail>,
) -> anyhow::Result<ExitCode> {
    // main() forked the native jail's set-up process for `run`: not used here, so ended.
    drop(early);
    if jail.engine != Some(EngineArg::Kube) {
        bail!(
            "{} apply to --engine kube only (add --engine kube, or leave them out)",
            kube.given().join(", ")
        );
    }
    if jail.scratch {
        bail!(
            "--scratch cannot run on Kubernetes: the sandbox's project is a volume of the \
             cluster (--project-claim, or --project-hostpath on a single node), not a \
             directory corral makes"
        );
    }
    let req = super::plan::request(profile, jail, command)?;
    // What the project's own corral.toml grants needs the user's trust (corral-run's gate).
    let plan = corral_run::trust::resolve_trusted(&req)?;
    let opts = run_options(kube)?;
    let code = corral_run::kube::run(&plan, &opts)?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The run's options from its flags.
fn run_options(kube: &KubeRunArgs) -> anyhow::Result<corral_run::kube::RunOptions> {
    let timeout = match &kube.kube_timeout {
        Some(t) => Some(
            humantime::parse_duration(t)
                .with_context(|| format!("--kube-timeout {t:?}: not a duration (30s, 2m, 1h)"))?,
        ),
        None => None,
    };
    Ok(corral_run::kube::RunOptions {
        context: kube.kube_context.clone(),
        namespace: kube.kube_namespace.clone(),
        proxy_ip: kube.proxy_ip.clone(),
        proxy_image: kube.proxy_image.clone(),
        image: kube.image.clone(),
        executor_ip: kube.executor_ip.clone(),
        seccomp: kube.seccomp.map(super::kube::seccomp),
        project_claim: kube.project_claim.clone(),
        project_hostpath: kube.project_hostpath,
        pids_by_node: kube.pids_by_node,
        node_files: kube.node_files.clone(),
        timeout,
    })
}
