//! `corral run --engine kube`: the manifests `corral kube render` prints for this run, applied
//! with kubectl, the harness's terminal attached (or its output streamed), its exit code
//! returned, and every object deleted again however the run ends (normal exit, error, SIGINT,
//! SIGTERM, SIGHUP). What a killed corral left, `corral down` removes ([`down_leftovers`]).
//!
//! kubectl is the cluster's stable interface, as the podman CLI is the container backend's
//! (`kubectl.rs`). `render.rs`: what the manifests are rendered with, shared with `corral kube
//! render`; `rundir.rs`: the run's directory and `corral down`; `backend.rs`: the run itself.

mod backend;
mod kubectl;
mod render;
mod rundir;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use corral_kube::{Seccomp, Target};
use corral_policy::plan::{Engine, NetworkMode, Plan};
use corral_session::{Scope, Session};

pub use kubectl::KUBECTL_ENV;
pub use render::{DEFAULT_PROXY_IMAGE, RenderOptions, options, run_secrets, write_private};
pub use rundir::down_leftovers;

use crate::trust::Trusted;
use backend::Kube;
use kubectl::Kubectl;
use rundir::RunDir;

/// How long the proxy and the sandbox get to start, without [`RunOptions::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a kube run goes and what it is rendered with: the options of `corral kube render` a
/// run needs (the jail's name is made from the run's id), kubectl's context and namespace,
/// and how long to wait.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// kubectl's context (default: kubectl's current one, from KUBECONFIG).
    pub context: Option<String>,
    /// Namespace of every object (default: the context's).
    pub namespace: Option<String>,
    /// The proxy Service's ClusterIP (network mode proxy).
    pub proxy_ip: Option<String>,
    /// Image holding /usr/local/bin/corral-proxy (default: [`DEFAULT_PROXY_IMAGE`]).
    pub proxy_image: Option<String>,
    /// Harness image (default: the plan's run.image, else localhost/corral-PROFILE:latest).
    pub image: Option<String>,
    /// Also run the executor as its own Pod, its Service at this ClusterIP.
    pub executor_ip: Option<String>,
    /// Seccomp profile of the sandbox (default: corral's, `Localhost`).
    pub seccomp: Option<Seccomp>,
    /// PersistentVolumeClaim holding the project (default: corral-PROJECT-project).
    pub project_claim: Option<String>,
    /// Mount the project from its own path on the node.
    pub project_hostpath: bool,
    /// The nodes' kubelet limits processes per Pod (podPidsLimit).
    pub pids_by_node: bool,
    /// For `podman kube play`: masked and empty files from this directory on the node, which
    /// must be this host (made here).
    pub node_files: Option<PathBuf>,
    /// How long to wait for the proxy to be available and the sandbox to start (default
    /// [`DEFAULT_TIMEOUT`]).
    pub timeout: Option<Duration>,
}

/// Run `plan` (engine kube) on the cluster `opts` names; the harness's exit code.
pub fn run(plan: &Trusted<Plan>, opts: &RunOptions) -> anyhow::Result<i32> {
    let plan: &Plan = plan;
    debug_assert_eq!(plan.engine, Engine::Kube);
    crate::review::native_only(plan)?;
    let kubectl = Kubectl::new(opts.context.clone(), opts.namespace.clone())?;
    let timeout = opts.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let session = Session::begin(plan, Scope::Remote)?.ready()?;
    let name = run_name(&plan.project.root, session.jail_id());
    let render = render_options(opts, &name, &plan.project.root);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdin())
        && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut kube_opts = options(&render, plan)?;
    // A terminal and stdin for `kubectl attach -it` at a terminal; else none (a harness
    // reading its terminal would wait for input nobody sends), its output read by `logs -f`.
    kube_opts.tty = tty;
    // `[secrets]` as `corral kube render` makes them: the run CA, the real values (from corral's
    // environment) and the placeholders; the manifests holding them are written 0600 and
    // deleted with the run.
    let secrets = run_secrets(plan)?;
    let objects = corral_kube::render_with_secrets(plan, &kube_opts, secrets.as_ref())?;
    let yaml = corral_kube::to_yaml(&objects)?;
    say_what_runs(plan, &kube_opts);
    if let Some(node) = &opts.node_files {
        write_node_files(node, kube_opts.seccomp)?;
    }
    let dir = RunDir::create(&plan.project.root, &name, &kubectl, &yaml)?;
    let mut backend = Kube {
        kubectl,
        dir,
        name,
        proxied: plan.network.mode == NetworkMode::Proxy,
        timeout,
        tty,
    };
    session.run(plan, &mut backend)
}

/// The jail's name: the project's (`corral kube render`'s default, cut) and the run's id, so
/// two runs never share an object and `corral down` finds each run's by its label.
fn run_name(project_root: &Path, jail_id: &str) -> String {
    let id: String = jail_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .to_ascii_lowercase();
    let mut base = corral_kube::default_name(project_root);
    base.truncate(40 - id.len() - 1);
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{id}")
}

/// `corral kube render`'s options for this run: the same options, the same render.
/// The project's claim is the project's, not the run's: `corral kube render`'s default name
/// for it (corral-PROJECT-project), so every run of the project mounts the same one.
fn render_options(opts: &RunOptions, name: &str, project_root: &Path) -> RenderOptions {
    let claim = opts
        .project_claim
        .clone()
        .unwrap_or_else(|| format!("{}-project", corral_kube::default_name(project_root)));
    RenderOptions {
        name: Some(name.to_string()),
        namespace: opts.namespace.clone(),
        proxy_ip: opts.proxy_ip.clone(),
        proxy_image: opts
            .proxy_image
            .clone()
            .unwrap_or_else(|| DEFAULT_PROXY_IMAGE.to_string()),
        image: opts.image.clone(),
        executor_ip: opts.executor_ip.clone(),
        executor_image: None,
        target: Target::Pod,
        seccomp: opts.seccomp.unwrap_or(Seccomp::Localhost),
        project_claim: Some(claim),
        project_hostpath: opts.project_hostpath,
        pids_by_node: opts.pids_by_node,
        node_files: opts.node_files.clone(),
    }
}

/// What the sandbox gets that the user must know: where its project comes from, what is not
/// carried, and which of a run's host-side checks cannot be made.
fn say_what_runs(plan: &Plan, opts: &corral_kube::Options) {
    let root = plan.project.root.display();
    match &opts.project {
        corral_kube::ProjectSource::Claim(claim) => eprintln!(
            "corral: kube: the sandbox mounts PersistentVolumeClaim {claim} at {root}: the claim \
             must hold the project (corral copies nothing into it)"
        ),
        corral_kube::ProjectSource::HostPath => {
            eprintln!("corral: kube: the sandbox mounts the node's {root} (hostPath) at {root}")
        }
    }
    if let Some(dir) = &opts.node_files {
        eprintln!(
            "corral: kube: masked files, the policy file's stand-in and the seccomp profile come \
             from {} on the node (podman kube play --seccomp-profile-root {0}); written here",
            dir.display()
        );
    } else if opts.seccomp == corral_kube::Seccomp::Localhost {
        eprintln!(
            "corral: kube: the sandbox runs under seccomp profile Localhost {}: every node needs \
             it (corral kube render -o DIR writes it; or pass --seccomp runtime-default)",
            corral_kube::SECCOMP_LOCALHOST
        );
    }
    let left_out = corral_kube::not_carried(plan, opts);
    if !left_out.is_empty() {
        eprintln!("corral: kube: not carried: {}", left_out.join("; "));
    }
    eprintln!(
        "corral: kube: the change summary, the git check and the harness-config guard look at \
         the host's files, not the cluster's volume: not made for this run"
    );
}

/// `--node-files DIR`, the node being this host (`podman kube play`): the unreadable file, the
/// empty one, and corral's seccomp profile (`podman kube play --seccomp-profile-root DIR`),
/// as the podman backend writes its own.
fn write_node_files(dir: &Path, seccomp: Seccomp) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, mode) in [("masked", 0o000), ("empty", 0o444)] {
        let path = dir.join(name);
        if !path.exists() {
            std::fs::write(&path, b"")
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    }
    if seccomp == Seccomp::Localhost {
        let profile = corral_sandbox::seccomp::oci_profile()
            .context("cannot build corral's seccomp profile for this architecture")?;
        let path = dir.join(corral_kube::NODE_SECCOMP);
        let text =
            serde_json::to_string_pretty(&profile).context("cannot encode the seccomp profile")?;
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_are_labels_that_fit_every_suffix() {
        let root = Path::new("/home/u/A Very_Long.Project-Name-That-Goes-On-And-On");
        let name = run_name(root, "674c3a1b-a1b2c3");
        assert_eq!(name, "corral-a-very-long-proje-674c3a1b-a1b2c3");
        assert!(name.len() <= 40, "{name}");
        let short = run_name(Path::new("/p/app"), "674c3a1b-a1b2c3");
        assert_eq!(short, "corral-app-674c3a1b-a1b2c3");
    }
}
