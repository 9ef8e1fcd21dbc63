//! `corral kube render`: the manifests of one jail, from the same plan `corral plan` prints.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use corral_kube::{Seccomp, Target};
use corral_run::kube::RenderOptions;

use crate::cli::{KubeCommand, KubeRenderArgs, KubeTarget, SeccompArg};

pub fn run(cmd: KubeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KubeCommand::Render(args) => render(*args),
    }
}

fn render(args: KubeRenderArgs) -> anyhow::Result<ExitCode> {
    let req = super::plan::request(args.profile.clone(), &args.jail, args.command.clone())?;
    // Rendering runs nothing: a scratch run's directory is named, not made.
    let plan = corral_policy::resolve::preview(&req)?;
    let opts = corral_run::kube::options(&render_options(&args), &plan)?;
    if args.check {
        print!("{}", corral_kube::check_text(&opts));
        return Ok(ExitCode::SUCCESS);
    }
    let run = corral_run::kube::run_secrets(&plan)?;
    let objects = corral_kube::render_with_secrets(&plan, &opts, run.as_ref())?;
    let yaml = corral_kube::to_yaml(&objects)?;
    let holds_secrets = objects
        .iter()
        .any(|o| matches!(o, corral_kube::Object::Secret(_)));
    let left_out = corral_kube::not_carried(&plan, &opts);
    if !left_out.is_empty() {
        eprintln!(
            "corral kube: not carried into the manifests: {}",
            left_out.join("; ")
        );
    }
    match &args.output {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let path = dir.join("jail.yaml");
            corral_run::kube::write_private(&path, &yaml)?;
            eprintln!("corral kube: wrote {}", path.display());
            if holds_secrets {
                eprintln!(
                    "corral kube: {} is readable by you only: its Secrets hold credentials (the proxy's: the real [secrets] values and the run CA's key)",
                    path.display()
                );
            }
            if opts.seccomp == Seccomp::Localhost {
                write_seccomp_profile(dir, opts.node_files.as_deref())?;
            }
        }
        None => {
            if holds_secrets {
                eprintln!(
                    "corral kube: the manifests hold credentials in Secrets (the proxy's: the real [secrets] values and the run CA's key): pipe them to kubectl apply -f -, or write them with -o DIR (mode 0600)"
                );
            }
            print!("{yaml}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// corral's seccomp filter as the OCI profile the sandbox Pod names (`Localhost`), generated
/// from the same rules as the native jail's BPF (`corral_sandbox::seccomp::oci_profile`): the
/// nodes need it at `/var/lib/kubelet/seccomp/` + [`corral_kube::SECCOMP_LOCALHOST`].
fn write_seccomp_profile(dir: &Path, node_files: Option<&Path>) -> anyhow::Result<()> {
    let profile = corral_sandbox::seccomp::oci_profile()
        .context("cannot build corral's seccomp profile for this architecture")?;
    let path = dir.join("seccomp.json");
    let text =
        serde_json::to_string_pretty(&profile).context("cannot encode the seccomp profile")?;
    std::fs::write(&path, text + "\n")
        .with_context(|| format!("cannot write {}", path.display()))?;
    match node_files {
        // --node-files: the Pod names `seccomp.json` directly under the seccomp root.
        Some(node) => eprintln!(
            "corral kube: wrote {}: put it, with an empty mode-0000 `masked` and an empty \
             mode-0444 `empty`, in {} on the node, and play with --seccomp-profile-root {}",
            path.display(),
            node.display(),
            node.display()
        ),
        None => eprintln!(
            "corral kube: wrote {}: install it on every node as /var/lib/kubelet/seccomp/{} (or render with --seccomp runtime-default)",
            path.display(),
            corral_kube::SECCOMP_LOCALHOST
        ),
    }
    Ok(())
}

/// `corral kube render`'s rendering options from its flags.
fn render_options(args: &KubeRenderArgs) -> RenderOptions {
    RenderOptions {
        name: args.name.clone(),
        namespace: args.namespace.clone(),
        proxy_ip: args.proxy_ip.clone(),
        proxy_image: args.proxy_image.clone(),
        image: args.image.clone(),
        executor_ip: args.executor_ip.clone(),
        executor_image: args.executor_image.clone(),
        target: match args.target {
            KubeTarget::Pod => Target::Pod,
            KubeTarget::AgentSandbox => Target::SandboxTemplate,
        },
        seccomp: seccomp(args.seccomp),
        project_claim: args.project_claim.clone(),
        project_hostpath: args.project_hostpath,
        pids_by_node: args.pids_by_node,
        node_files: args.node_files.clone(),
    }
}

/// `--seccomp`'s value as corral-kube's.
pub(super) fn seccomp(arg: SeccompArg) -> Seccomp {
    match arg {
        SeccompArg::Localhost => Seccomp::Localhost,
        SeccompArg::RuntimeDefault => Seccomp::RuntimeDefault,
    }
}
