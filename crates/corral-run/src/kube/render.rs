//! What the manifests of one jail are rendered with, for `corral kube render` and a kube run
//! alike: the options given, the few facts about this host the plan does not carry, and the
//! `[secrets]` the proxy's Secret holds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use corral_kube::{ExecutorOptions, Options, ProjectSource, Seccomp, Target};
use corral_policy::plan::Plan;

/// The proxy image the manifests name by default (`corral kube render --proxy-image`).
pub const DEFAULT_PROXY_IMAGE: &str = concat!("localhost/corral-proxy:", env!("CARGO_PKG_VERSION"));

/// How one jail's manifests are rendered: `corral kube render`'s options, which a kube run
/// fills in for itself.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// The jail's name, prefix of every object's (default: corral-PROJECT).
    pub name: Option<String>,
    /// Namespace of every object (default: none set, kubectl's current one).
    pub namespace: Option<String>,
    /// The proxy Service's ClusterIP (network mode proxy).
    pub proxy_ip: Option<String>,
    /// Image holding /usr/local/bin/corral-proxy.
    pub proxy_image: String,
    /// Harness image (default: the plan's run.image, else localhost/corral-PROFILE:latest).
    pub image: Option<String>,
    /// Also render the executor as its own Pod, its Service at this ClusterIP.
    pub executor_ip: Option<String>,
    /// Image of the executor Pod (default: the harness image).
    pub executor_image: Option<String>,
    /// What the sandbox is rendered as.
    pub target: Target,
    /// Seccomp profile of the sandbox.
    pub seccomp: Seccomp,
    /// PersistentVolumeClaim holding the project (default: NAME-project).
    pub project_claim: Option<String>,
    /// Mount the project from its own path on the node.
    pub project_hostpath: bool,
    /// The nodes' kubelet limits processes per Pod (podPidsLimit).
    pub pids_by_node: bool,
    /// For `podman kube play`: masked and empty files from this directory on the node.
    pub node_files: Option<PathBuf>,
}

/// The rendering options, with the few facts about the host the plan does not carry (which
/// protected and masked paths exist, which are directories) gathered here.
pub fn options(args: &RenderOptions, plan: &Plan) -> anyhow::Result<Options> {
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
        target: args.target,
        seccomp: args.seccomp,
        project,
        pids_by_node: args.pids_by_node,
        existing,
        dirs,
        executor,
        node_files: args.node_files.clone(),
        // `kubectl attach -it` finds a terminal (a kube run decides per run).
        tty: true,
    })
}

/// A new executor token: 16 random bytes, hex.
fn new_token() -> anyhow::Result<String> {
    let mut rnd = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd))
        .context("cannot read /dev/urandom for the executor token")?;
    Ok(rnd.iter().map(|b| format!("{b:02x}")).collect())
}

/// For a plan with `[secrets]`: the real values (from corral's environment, as `corral run`
/// reads them), a placeholder for each, a run CA for their hosts (the sandbox must trust it
/// before the proxy runs), and this host's system roots, which the sandbox's bundle starts from.
pub fn run_secrets(plan: &Plan) -> anyhow::Result<Option<corral_kube::RunSecrets>> {
    if plan.secrets.is_empty() {
        return Ok(None);
    }
    let values = crate::secrets::real_values(plan)?;
    let placeholders = crate::secrets::placeholders(&values)?;
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

/// Write the manifests readable by their owner only: they may hold the executor's token.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
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
