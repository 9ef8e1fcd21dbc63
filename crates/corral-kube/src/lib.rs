//! Plan -> Kubernetes objects. Pure: everything besides the Plan is in [`Options`], so tests
//! compare the whole rendered YAML, and a small NetworkPolicy evaluator (tests) checks what the
//! policies let through.
//!
//! One jail is: the sandbox Pod (the harness), corral's proxy as its own Deployment and Service
//! (a sidecar in the sandbox's Pod could not be fenced: NetworkPolicy applies per Pod), the
//! proxy's policy as a ConfigMap, and two NetworkPolicies: the sandbox reaches only the proxy's
//! port, only the sandbox reaches the proxy, and the proxy reaches public addresses only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use corral_policy::plan::{Access, Enforce, ExecutorTarget, MountKind, NetworkMode, Plan};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde::Serialize;

pub mod agent_sandbox;
pub mod executor;
mod netpol;
mod proxy;
mod sandbox;
pub mod secrets;
pub mod skill;

#[cfg(test)]
pub(crate) mod eval;
#[cfg(test)]
mod secrets_tests;
#[cfg(test)]
mod tests;

pub use netpol::{dns_peer, proxy_policy, sandbox_policy};
pub use sandbox::NODE_SECCOMP;
pub use secrets::RunSecrets;

/// The proxy's port (the container backend's).
pub const PROXY_PORT: u16 = corral_engine::names::PROXY_PORT;
/// The name the sandbox reaches the proxy by (`hostAliases`, no DNS).
pub const PROXY_HOST: &str = corral_engine::names::PROXY_ALIAS;
/// The label naming the jail every object belongs to.
pub const LABEL_JAIL: &str = "corral.dev/jail";
/// The label naming an object's role (`sandbox`, `proxy`).
pub const LABEL_ROLE: &str = "corral.dev/role";
/// Where the seccomp profile sits under the kubelet's seccomp directory
/// (`/var/lib/kubelet/seccomp/corral/seccomp.json` on each node).
pub const SECCOMP_LOCALHOST: &str = "corral/seccomp.json";

/// Errors of rendering: a plan that cannot be carried into a cluster, or a bad option.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kube: {what} is not supported on Kubernetes yet")]
    Unsupported { what: String },
    #[error("kube: the plan has no command to run")]
    NoCommand,
    #[error(
        "kube: name {name:?} is not usable: lower-case letters, digits and '-', starting with a letter, at most 40 characters (pass --name)"
    )]
    BadName { name: String },
    #[error(
        "kube: network mode proxy needs the proxy Service's address, chosen by you inside the cluster's service range (pass --proxy-ip IP): the sandbox has no DNS, it reaches the proxy by that address"
    )]
    NoProxyIp,
    #[error("kube: the executor needs its Service's address (pass --executor-ip IP)")]
    NoExecutorIp,
    #[error(
        "kube: {path} is not inside the project {root}: it cannot be placed on the project volume"
    )]
    OutsideProject { path: PathBuf, root: PathBuf },
    #[error(
        "kube: limits.pids cannot be set per Pod (the kubelet's podPidsLimit is node-wide): pass --pids-by-node when your nodes set it, or set limits.enforce = \"best-effort\""
    )]
    PidsLimit,
    #[error("kube: {what}: {message}")]
    Bad { what: String, message: String },
}

pub type Result<T> = std::result::Result<T, KubeError>;

/// The seccomp profile the sandbox runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seccomp {
    /// corral's own filter, installed on each node at [`SECCOMP_LOCALHOST`].
    Localhost,
    /// The container runtime's default profile: the fallback when the nodes lack corral's.
    RuntimeDefault,
}

/// What the sandbox is rendered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A plain Pod.
    Pod,
    /// A kubernetes-sigs/agent-sandbox `SandboxTemplate` whose Pods the controller makes.
    SandboxTemplate,
}

/// Where the project's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectSource {
    /// A PersistentVolumeClaim of this name holding the project (made by the user).
    Claim(String),
    /// The project's own path on the node (`podman kube play`, single-node clusters).
    HostPath,
}

/// The executor's own Pod: rendered when the plan has an executor jail and this is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorOptions {
    /// Its Service's fixed ClusterIP (the sandbox has no DNS).
    pub ip: String,
    /// An image holding `corral` (on PATH) and the project's toolchain.
    pub image: String,
    /// The bearer token (random, made at the edge), in a Secret both Pods mount.
    pub token: String,
}

/// What the objects depend on besides the Plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The jail's name: every object's name starts with it (a DNS label, at most 40 characters).
    pub name: String,
    /// The namespace every object is rendered in; `None`: none set (kubectl's current one).
    pub namespace: Option<String>,
    /// The proxy Service's fixed ClusterIP (network mode `proxy`).
    pub proxy_ip: Option<String>,
    /// The image running `corral-proxy`.
    pub proxy_image: String,
    /// The harness image; `None`: the plan's, else the profile's default tag.
    pub image: Option<String>,
    pub target: Target,
    pub executor: Option<ExecutorOptions>,
    pub seccomp: Seccomp,
    pub project: ProjectSource,
    /// The nodes' kubelet limits pids per Pod (podPidsLimit): `limits.pids` is not refused.
    pub pids_by_node: bool,
    /// Protected and masked paths that exist on the host (gathered at the edge), and which of
    /// them are directories.
    pub existing: BTreeSet<PathBuf>,
    pub dirs: BTreeSet<PathBuf>,
    /// `podman kube play`, which ignores `subPath`: the unreadable and the empty file are the
    /// node's `DIR/masked` (mode 0000) and `DIR/empty` (0444), and protected paths hostPath
    /// binds of themselves, read-only (what the podman backend binds); volume names carry the
    /// jail's name (podman makes a named volume of each emptyDir, by its name). Needs the
    /// project as a hostPath. `None`: ConfigMap files and `subPath`s, as a cluster runs them.
    pub node_files: Option<PathBuf>,
    /// The harness gets a terminal and an open stdin (`kubectl attach -it`); without, its
    /// output is its log and it reads nothing (a run whose caller has no terminal).
    pub tty: bool,
}

/// One rendered object.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Object {
    ConfigMap(Box<ConfigMap>),
    Secret(Box<Secret>),
    Deployment(Box<Deployment>),
    Service(Box<Service>),
    Pod(Box<Pod>),
    SandboxTemplate(Box<agent_sandbox::SandboxTemplate>),
    NetworkPolicy(Box<NetworkPolicy>),
}

/// Every object of one jail, in the order `kubectl apply` should see them: ConfigMaps (and
/// Secrets), the NetworkPolicies (so no Pod runs unfenced), the proxy, then the sandbox (a Pod,
/// or a SandboxTemplate whose Pods carry the same labels, so the same policies fence them).
/// A plan with `[secrets]` is refused here: [`render_with_secrets`].
pub fn render(plan: &Plan, opts: &Options) -> Result<Vec<Object>> {
    render_with_secrets(plan, opts, None)
}

/// [`render`] for a plan with `[secrets]`, given the run CA, the real values and the
/// placeholders made for it ([`secrets`]): the CA's ConfigMap for the sandbox, the proxy's
/// Secret, the gateway's flags on the proxy and the placeholders in the sandbox.
pub fn render_with_secrets(
    plan: &Plan,
    opts: &Options,
    run: Option<&RunSecrets>,
) -> Result<Vec<Object>> {
    check_supported(plan, opts)?;
    let proxied = plan.network.mode == NetworkMode::Proxy;
    let carried = secrets::Carried::of(plan, run, proxied)?;
    let mut out = vec![Object::ConfigMap(Box::new(sandbox::files_config_map(opts)))];
    if proxied {
        out.push(Object::ConfigMap(Box::new(proxy::policy_config_map(
            plan, opts,
        ))));
    }
    if skill::carried(plan, opts) {
        out.push(Object::ConfigMap(Box::new(skill::config_map(opts))));
    }
    if let secrets::Carried::Gateway(s) = carried {
        out.push(Object::ConfigMap(Box::new(secrets::ca_config_map(opts, s))));
        out.push(Object::Secret(Box::new(secrets::proxy_secret(opts, s)?)));
    }
    let exec_jail = executor::jail(plan, opts);
    let exec_proxied = match exec_jail {
        Some(jail) => Some(executor::check_network(plan, jail)?),
        None => None,
    };
    if let (Some(exec), Some(_)) = (&opts.executor, exec_jail) {
        out.push(Object::Secret(Box::new(executor::secret(
            opts,
            &exec.token,
        ))));
    }
    let fence = netpol::Fence {
        proxied,
        executor: exec_proxied,
    };
    out.push(Object::NetworkPolicy(Box::new(sandbox_policy(opts, fence))));
    if proxied {
        out.push(Object::NetworkPolicy(Box::new(proxy_policy(
            plan, opts, fence,
        ))));
    }
    if exec_proxied.is_some() {
        out.push(Object::NetworkPolicy(Box::new(netpol::executor_policy(
            opts, fence,
        ))));
    }
    if proxied {
        let mut deployment = proxy::deployment(opts);
        if let secrets::Carried::Gateway(_) = carried {
            secrets::attach_proxy(&mut deployment, opts);
        }
        out.push(Object::Deployment(Box::new(deployment)));
        out.push(Object::Service(Box::new(proxy::service(opts)?)));
    }
    if let Some(jail) = exec_jail {
        out.push(Object::Service(Box::new(executor::service(opts)?)));
        out.push(Object::Pod(Box::new(executor::pod(plan, jail, opts)?)));
    }
    out.push(sandbox_object(plan, opts, carried)?);
    Ok(out)
}

/// The sandbox: a Pod or a SandboxTemplate, with what of `[secrets]` and of the executor's
/// skill it carries.
fn sandbox_object(plan: &Plan, opts: &Options, carried: secrets::Carried<'_>) -> Result<Object> {
    let attach = |spec: &mut k8s_openapi::api::core::v1::PodSpec| {
        secrets::attach_sandbox(spec, opts, carried);
        if skill::carried(plan, opts) {
            skill::attach_sandbox(spec, plan, opts);
        }
    };
    Ok(match opts.target {
        Target::Pod => {
            let mut pod = sandbox::pod(plan, opts)?;
            if let Some(spec) = pod.spec.as_mut() {
                attach(spec);
            }
            Object::Pod(Box::new(pod))
        }
        Target::SandboxTemplate => {
            let mut t = agent_sandbox::template(plan, opts)?;
            attach(&mut t.spec.pod_template.spec);
            Object::SandboxTemplate(Box::new(t))
        }
    })
}

/// The objects as one multi-document YAML stream.
pub fn to_yaml(objects: &[Object]) -> Result<String> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(o).map_err(|e| KubeError::Bad {
            what: "serializing an object".into(),
            message: e.to_string(),
        })?);
    }
    Ok(out)
}

/// What cannot be carried into a cluster yet: refused, never silently dropped.
fn check_supported(plan: &Plan, opts: &Options) -> Result<()> {
    let unsupported = |what: &str| {
        Err(KubeError::Unsupported {
            what: what.to_string(),
        })
    };
    if !valid_name(&opts.name) {
        return Err(KubeError::BadName {
            name: opts.name.clone(),
        });
    }
    if plan.command.is_empty() {
        return Err(KubeError::NoCommand);
    }
    let n = &plan.network;
    match n.mode {
        NetworkMode::Host => return unsupported("network mode host"),
        NetworkMode::Proxy if opts.proxy_ip.is_none() => return Err(KubeError::NoProxyIp),
        NetworkMode::Proxy | NetworkMode::None => {}
    }
    if n.mode == NetworkMode::Proxy && !n.allow_paths.is_empty() {
        return unsupported(
            "network.allow rules by method and path (the cluster's proxy cannot decide each request yet; \
             corral run --engine native does)",
        );
    }
    if !n.host_ports.is_empty() {
        return unsupported("network.host_ports");
    }
    if !n.publish.is_empty() {
        return unsupported("network.publish / --publish");
    }
    if n.dns != corral_policy::plan::Dns::None {
        return unsupported("network.dns = \"stub\"");
    }
    match &plan.executor.target {
        // Not rendered yet, as with the podman backend: see [`not_carried`].
        ExecutorTarget::Sandbox => {}
        ExecutorTarget::Compose(_) => return unsupported("executor.target = \"compose:...\""),
        ExecutorTarget::Host => return unsupported("the host executor"),
    }
    if opts.node_files.is_some() && opts.project != ProjectSource::HostPath {
        return Err(KubeError::Bad {
            what: "--node-files".into(),
            message: "the protected paths are bound from the node's project: it needs \
                      --project-hostpath"
                .into(),
        });
    }
    if opts.node_files.is_some() && opts.executor.is_some() {
        return Err(KubeError::Bad {
            what: "--node-files".into(),
            message: "not with --executor-ip (the executor's Pod is rendered for a cluster)".into(),
        });
    }
    // corral's built-in default is not the user's demand: it is left to the nodes (and said so
    // by `not_carried`); a limit someone set under `strict` is refused.
    if plan.limits.pids.is_some()
        && !plan.limits.built_in.pids
        && !opts.pids_by_node
        && plan.limits.enforce == Enforce::Strict
    {
        return Err(KubeError::PidsLimit);
    }
    Ok(())
}

/// What of the plan the objects leave out, one line each: host binds a cluster does not have
/// (a harness's configuration under the caller's home, `--rw`/`--ro` paths; the Pod then has
/// less, never more), the executor's sandbox (not rendered yet: `corral exec` in the Pod
/// finds no executor) and a pids limit the nodes are not said to hold (`--pids-by-node`).
pub fn not_carried(plan: &Plan, opts: &Options) -> Vec<String> {
    let mut out: Vec<String> = sandbox::host_binds(plan)
        .iter()
        .map(|p| format!("host path {}", p.display()))
        .collect();
    if let (Some(skill), false) = (&plan.skill, skill::carried(plan, opts)) {
        out.push(format!(
            "the executor's instructions (SKILL.md at {}): rendered only with the executor",
            skill.dir.display()
        ));
    }
    if plan.executor.jail.is_some() && opts.executor.is_none() {
        out.push(
            "the executor ([executor] target = \"sandbox\"): rendered only with --executor-ip"
                .into(),
        );
    }
    if let (Some(pids), false) = (plan.limits.pids, opts.pids_by_node) {
        let whose = if plan.limits.built_in.pids {
            "corral's default"
        } else {
            "limits.enforce = \"best-effort\""
        };
        out.push(format!(
            "limits.pids = {pids} ({whose}): a Pod cannot carry a pids limit, so on the \
             cluster processes are bounded only by the nodes' kubelet podPidsLimit (pass \
             --pids-by-node when your nodes set it)"
        ));
    }
    out
}

/// A DNS label short enough for every suffix corral adds (`-proxy-policy`).
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 40
        && b[0].is_ascii_lowercase()
        && b.last().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A project name usable as a jail name: lower-cased, other characters as '-', prefixed
/// `corral-`, cut to fit.
pub fn default_name(project_root: &Path) -> String {
    let base = project_root
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let mut s: String = format!("corral-{base}")
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(40);
    while s.ends_with('-') {
        s.pop();
    }
    s
}

/// The labels of one role of a jail (also its selector).
pub fn labels(opts: &Options, role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/managed-by".into(), "corral".into()),
        (LABEL_JAIL.into(), opts.name.clone()),
        (LABEL_ROLE.into(), role.into()),
    ])
}

/// The selector of one role of a jail.
pub fn selector(opts: &Options, role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_JAIL.into(), opts.name.clone()),
        (LABEL_ROLE.into(), role.into()),
    ])
}

fn meta(
    opts: &Options,
    name: String,
    role: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name),
        namespace: opts.namespace.clone(),
        labels: Some(labels(opts, role)),
        ..Default::default()
    }
}

/// The plan's read-write or read-only project access.
fn read_only(access: Access) -> bool {
    access == Access::Ro
}

/// Tmpfs targets of the plan (home and other private scratch directories).
fn tmpfs_targets(plan: &Plan) -> Vec<PathBuf> {
    plan.mounts
        .iter()
        .filter(|m| m.kind == MountKind::Tmpfs)
        .map(|m| m.target.clone())
        .collect()
}

/// The command-line text of `corral kube render --check`: how to find out whether the cluster
/// enforces the NetworkPolicies at all.
pub fn check_text(opts: &Options) -> String {
    let ns = opts
        .namespace
        .as_deref()
        .map(|n| format!(" -n {n}"))
        .unwrap_or_default();
    let name = &opts.name;
    format!(
        "The NetworkPolicies are the fence around the sandbox, and they are void where the cluster's CNI \
does not enforce NetworkPolicy (flannel alone, older kindnet releases, podman kube play): the Pods \
then reach anything. Test it once per cluster, after `kubectl apply`:

  # 1. a direct connection from the sandbox, around the proxy: it must FAIL (time out or be refused)
  kubectl{ns} exec {name} -- curl --noproxy '*' -sS -m 5 -o /dev/null http://1.1.1.1/ && echo 'REACHED: NetworkPolicy is NOT enforced'
  # 2. the same through the proxy: it must succeed for an allowed host and be refused (403) for others
  kubectl{ns} exec {name} -- curl -sS -o /dev/null -w '%{{http_code}}\\n' https://example.com
  # 3. another Pod must not reach the proxy: it must FAIL
  kubectl{ns} run corral-probe --rm -i --restart=Never --image=busybox -- nc -w 3 {name}-proxy {PROXY_PORT}

If 1 or 3 connects, this cluster does not enforce NetworkPolicy: do not rely on the fence (use a \
CNI that enforces it: Calico, Cilium, Antrea, kube-router).
"
    )
}
