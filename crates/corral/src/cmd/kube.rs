//! `corral kube render`: the manifests of one jail, from the same plan `corral plan` prints.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use corral_kube::{ExecutorOptions, Options, ProjectSource, Seccomp, Target};
use corral_policy::plan::Plan;

use crate::cli::{KubeCommand, KubeRenderArgs, KubeTarget, SeccompArg};

/// The proxy image `corral kube render` names by default (its `--proxy-image`).
pub(super) const DEFAULT_PROXY_IMAGE: &str =
    concat!("localhost/corral-proxy:", env!("CARGO_PKG_VERSION"));

pub fn run(cmd: KubeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KubeCommand::Render(args) => render(*args),
    }
}

fn render(args: KubeRenderArgs) -> anyhow::Result<ExitCode> {
    let req = super::plan::request(args.profile.clone(), &args.jail, args.command.clone())?;
    // Rendering runs nothing: a scratch run's directory is named, not made.
    let plan = corral_policy::resolve::preview(&req)?;
    let opts = options(&args, &plan)?;
    if args.check {
        print!("{}", corral_kube::check_text(&opts));
        return Ok(ExitCode::SUCCESS);
    }
    let run = run_secrets(&plan)?;
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
            write_private(&path, &yaml)?;
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

/// For a plan with `[secrets]`: the real values (from corral's environment, as `corral run`
/// reads them), a placeholder for each, a run CA for their hosts (the sandbox must trust it
/// before the proxy runs), and this host's system roots, which the sandbox's bundle starts from.
pub(super) fn run_secrets(plan: &Plan) -> anyhow::Result<Option<corral_kube::RunSecrets>> {
    if plan.secrets.is_empty() {
        return Ok(None);
    }
    let values = corral_run::secrets::real_values(plan)?;
    let placeholders = corral_run::secrets::placeholders(&values)?;
    let ca =
        corral_gateway::new_ca(&plan.secrets).context("cannot make the run CA for [secrets]")?;
    let layout = corral_gateway::trust_layout(Path::new(corral_kube::secrets::TRUST_DIR));
    let system_paths: Vec<PathBuf> = layout
        .system_overlays
        .into_iter()
        .map(|m| m.target)
        .collect();
    let system_bundle = match system_paths.first() {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read the system CA bundle {}", p.display()))?,
        None => String::new(),
    };
    Ok(Some(corral_kube::RunSecrets {
        ca,
        values: corral_net::standalone::SecretsFile {
            secrets: values
                .into_iter()
                .map(|(plan, value)| corral_net::standalone::SecretValue { plan, value })
                .collect(),
            // Sign-ins are not carried into a cluster (the home's credential files are not).
            signins: Vec::new(),
        },
        placeholders,
        system_bundle,
        system_paths,
    }))
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

/// Write the manifests readable by their owner only: they may hold the executor's token.
pub(super) fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // A new file, so an existing one's wider mode is not kept.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot replace {}", path.display())),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// A new executor token: 16 random bytes, hex.
fn new_token() -> anyhow::Result<String> {
    let mut rnd = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd))
        .context("cannot read /dev/urandom for the executor token")?;
    Ok(rnd.iter().map(|b| format!("{b:02x}")).collect())
}

/// The rendering options, with the few facts about the host the plan does not carry (which
/// protected and masked paths exist, which are directories) gathered here.
pub(super) fn options(args: &KubeRenderArgs, plan: &Plan) -> anyhow::Result<Options> {
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| corral_kube::default_name(&plan.project.root));
    let exec_jail = plan.executor.jail.as_deref();
    let paths: Vec<&PathBuf> = plan
        .protected
        .iter()
        .chain(&plan.masked)
        .chain(
            exec_jail
                .into_iter()
                .flat_map(|j| j.protected.iter().chain(&j.masked)),
        )
        .collect();
    let existing: BTreeSet<PathBuf> = paths
        .iter()
        .filter(|p| p.exists())
        .map(|p| (*p).clone())
        .collect();
    let dirs: BTreeSet<PathBuf> = paths
        .iter()
        .filter(|p| p.is_dir())
        .map(|p| (*p).clone())
        .collect();
    let project = if args.project_hostpath {
        ProjectSource::HostPath
    } else {
        ProjectSource::Claim(
            args.project_claim
                .clone()
                .unwrap_or_else(|| format!("{name}-project")),
        )
    };
    let executor = match (&args.executor_ip, exec_jail) {
        (Some(ip), Some(jail)) => Some(ExecutorOptions {
            ip: ip.clone(),
            image: args
                .executor_image
                .clone()
                .or_else(|| args.image.clone())
                .unwrap_or_else(|| corral_engine::argv::harness_image(jail)),
            token: new_token()?,
        }),
        (Some(_), None) => anyhow::bail!(
            "--executor-ip: this plan has no executor sandbox ([executor] target = \"sandbox\")"
        ),
        (None, _) => None,
    };
    Ok(Options {
        name,
        namespace: args.namespace.clone(),
        proxy_ip: args.proxy_ip.clone(),
        proxy_image: args.proxy_image.clone(),
        image: args.image.clone(),
        target: match args.target {
            KubeTarget::Pod => Target::Pod,
            KubeTarget::AgentSandbox => Target::SandboxTemplate,
        },
        seccomp: match args.seccomp {
            SeccompArg::Localhost => Seccomp::Localhost,
            SeccompArg::RuntimeDefault => Seccomp::RuntimeDefault,
        },
        project,
        pids_by_node: args.pids_by_node,
        existing,
        dirs,
        executor,
        node_files: args.node_files.clone(),
        // `kubectl attach -it` finds a terminal (`corral run --engine kube` decides per run).
        tty: true,
    })
}
