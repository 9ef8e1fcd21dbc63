//! The sandbox Pod: the harness with no capabilities, no privilege escalation, a read-only root,
//! corral's seccomp profile, no service account token, no service links, no DNS, the project as
//! a volume, the plan's environment and limits.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use corral_engine::argv::{container_program, harness_image, proxy_env};
use corral_policy::plan::{MountKind, NetworkMode, Plan, system_mounts};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar,
    HostAlias, HostPathVolumeSource, KeyToPath, PersistentVolumeClaimVolumeSource, Pod,
    PodDNSConfig, PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::{
    KubeError, Options, PROXY_HOST, ProjectSource, Result, SECCOMP_LOCALHOST, Seccomp, meta,
    read_only, tmpfs_targets,
};

/// The uid and gid the sandbox runs as when the caller is root (a Pod may not run as root).
pub const FALLBACK_USER: i64 = 65534;
/// The resolver the sandbox is given: its own loopback, where nothing answers, so a lookup
/// fails at once (as in the podman backend).
pub const NO_RESOLVER: &str = "127.0.0.1";
/// ConfigMap keys: an empty file unreadable by anyone (over masked files) and an empty
/// read-only file (where a policy file does not exist, so the jail cannot create one).
const MASKED_KEY: &str = "masked";
const EMPTY_KEY: &str = "empty";
const FILES: &str = "corral-files";
const PROJECT: &str = "project";

fn files_name(opts: &Options) -> String {
    format!("{}-files", opts.name)
}

/// The small files the sandbox's mounts need.
pub fn files_config_map(opts: &Options) -> ConfigMap {
    ConfigMap {
        metadata: meta(opts, files_name(opts), "sandbox"),
        data: Some(BTreeMap::from([
            (MASKED_KEY.into(), String::new()),
            (EMPTY_KEY.into(), String::new()),
        ])),
        ..Default::default()
    }
}

/// A Pod's security settings: non-root as `uid:gid`, under `seccomp`.
pub fn pod_security(uid: i64, gid: i64, seccomp: Seccomp) -> PodSecurityContext {
    let profile = match seccomp {
        Seccomp::Localhost => SeccompProfile {
            type_: "Localhost".into(),
            localhost_profile: Some(SECCOMP_LOCALHOST.into()),
        },
        Seccomp::RuntimeDefault => SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        },
    };
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(gid),
        seccomp_profile: Some(profile),
        ..Default::default()
    }
}

/// Every container corral renders: no capabilities, no privilege escalation, a read-only root.
pub fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        ..Default::default()
    }
}

/// The sandbox Pod.
pub fn pod(plan: &Plan, opts: &Options) -> Result<Pod> {
    let mut meta = meta(opts, opts.name.clone(), "sandbox");
    meta.annotations = annotations(plan, opts);
    Ok(Pod {
        metadata: meta,
        spec: Some(pod_spec(plan, opts)?),
        ..Default::default()
    })
}

/// What the sandbox's metadata says beyond its labels: the pids limit the nodes' kubelet is
/// trusted to hold (`podPidsLimit`; a Pod cannot carry one). Short values: podman's `kube play`
/// refuses annotation values over 63 characters.
pub fn annotations(plan: &Plan, opts: &Options) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if let (Some(p), true) = (plan.limits.pids, opts.pids_by_node) {
        out.insert("corral.dev/pids-limit-by-node".into(), p.to_string());
    }
    if opts.node_files.is_some() {
        // `podman kube play` (4.3) reads the seccomp profile from this annotation only, and
        // takes a profile's file name only (no directory): the node's DIR/seccomp.json, with
        // `--seccomp-profile-root DIR`. The field says the same, as a cluster requires.
        let value = match opts.seccomp {
            Seccomp::Localhost => format!("localhost/{NODE_SECCOMP}"),
            Seccomp::RuntimeDefault => "runtime/default".into(),
        };
        out.insert(SECCOMP_ANNOTATION.into(), value);
    }
    (!out.is_empty()).then_some(out)
}

/// The annotation `podman kube play` takes a Pod's seccomp profile from.
const SECCOMP_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// The profile's name under the seccomp root with [`Options::node_files`].
pub const NODE_SECCOMP: &str = "seccomp.json";

/// The sandbox's security settings; with [`Options::node_files`] its Localhost profile is
/// `seccomp.json` directly under the node's seccomp root.
fn sandbox_security(uid: i64, gid: i64, opts: &Options) -> PodSecurityContext {
    let mut security = pod_security(uid, gid, opts.seccomp);
    if let (Some(_), Some(profile)) = (&opts.node_files, security.seccomp_profile.as_mut())
        && profile.localhost_profile.is_some()
    {
        profile.localhost_profile = Some(NODE_SECCOMP.into());
    }
    security
}

/// The sandbox's Pod spec (the Pod's, or the SandboxTemplate's pod template).
pub fn pod_spec(plan: &Plan, opts: &Options) -> Result<PodSpec> {
    let (mut volumes, mut mounts) = volumes(plan, opts)?;
    let with_executor = crate::executor::jail(plan, opts).is_some();
    if with_executor {
        let (v, m) = crate::executor::token_volume(opts);
        volumes.push(v);
        mounts.push(m);
    }
    let uid = if plan.uid == 0 {
        FALLBACK_USER
    } else {
        plan.uid.into()
    };
    let gid = if plan.uid == 0 {
        FALLBACK_USER
    } else {
        plan.gid.into()
    };
    let container = Container {
        name: "harness".into(),
        image: Some(opts.image.clone().unwrap_or_else(|| harness_image(plan))),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![container_program(plan)]),
        args: Some(plan.command[1..].to_vec()),
        working_dir: Some(plan.cwd.display().to_string()),
        env: Some(env(plan, with_executor)),
        resources: Some(resources(plan)),
        security_context: Some(container_security()),
        stdin: Some(opts.tty),
        tty: Some(opts.tty),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    Ok(PodSpec {
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        dns_policy: Some("None".into()),
        dns_config: Some(no_dns()),
        host_aliases: host_aliases(plan, opts, with_executor),
        restart_policy: Some("Never".into()),
        termination_grace_period_seconds: Some(5),
        security_context: Some(sandbox_security(uid, gid, opts)),
        containers: vec![container],
        volumes: Some(volumes),
        ..Default::default()
    })
}

/// No name resolution: a resolver on the Pod's own loopback, where nothing answers.
pub fn no_dns() -> PodDNSConfig {
    PodDNSConfig {
        nameservers: Some(vec![NO_RESOLVER.into()]),
        ..Default::default()
    }
}

/// The names the Pod reaches corral's Services by (it has no DNS): the proxy when the plan
/// uses it, the executor when it is rendered and `with_executor`.
pub fn host_aliases(plan: &Plan, opts: &Options, with_executor: bool) -> Option<Vec<HostAlias>> {
    let mut out = Vec::new();
    if let (NetworkMode::Proxy, Some(ip)) = (plan.network.mode, &opts.proxy_ip) {
        out.push(HostAlias {
            ip: ip.clone(),
            hostnames: Some(vec![PROXY_HOST.into()]),
        });
    }
    if let (true, Some(exec)) = (with_executor, &opts.executor) {
        out.push(HostAlias {
            ip: exec.ip.clone(),
            hostnames: Some(vec![crate::executor::EXECUTOR_HOST.into()]),
        });
    }
    (!out.is_empty()).then_some(out)
}

/// Exactly the plan's environment, the executor's variables left out, the proxy variables
/// pointing at the proxy by its host alias; with the executor, the variables `corral exec`
/// finds it by.
pub fn env(plan: &Plan, with_executor: bool) -> Vec<EnvVar> {
    let mut env: BTreeMap<String, String> = plan
        .env
        .iter()
        .filter(|(k, _)| !k.starts_with("CORRAL_EXECUTOR"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if plan.network.mode == NetworkMode::Proxy {
        let mut no_proxy = "localhost,127.0.0.1,::1".to_string();
        if with_executor {
            no_proxy.push(',');
            no_proxy.push_str(crate::executor::EXECUTOR_HOST);
        }
        env.extend(proxy_env(&no_proxy));
    }
    if with_executor {
        env.insert(
            "CORRAL_EXECUTOR".into(),
            format!(
                "http://{}:{}",
                crate::executor::EXECUTOR_HOST,
                crate::executor::EXECUTOR_PORT
            ),
        );
        env.insert(
            "CORRAL_EXECUTOR_TOKEN_FILE".into(),
            crate::executor::TOKEN_FILE.into(),
        );
    }
    env.into_iter()
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            value_from: None,
        })
        .collect()
}

/// `[limits]` as requests equal to limits (the Guaranteed class: what is asked is what is held).
pub fn resources(plan: &Plan) -> ResourceRequirements {
    let mut q = BTreeMap::new();
    if let Some(m) = plan.limits.memory {
        q.insert("memory".to_string(), Quantity(memory(m)));
    }
    if let Some(c) = plan.limits.cpus {
        q.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", (c * 1000.0).round() as u64)),
        );
    }
    ResourceRequirements {
        limits: (!q.is_empty()).then(|| q.clone()),
        requests: (!q.is_empty()).then_some(q),
        ..Default::default()
    }
}

fn memory(bytes: u64) -> String {
    const K: u64 = 1024;
    for (unit, size) in [("Gi", K * K * K), ("Mi", K * K), ("Ki", K)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// The host binds of the plan a cluster cannot have: everything but the project and the system
/// directories (which come from the image).
pub fn host_binds(plan: &Plan) -> Vec<PathBuf> {
    let system: BTreeSet<PathBuf> = system_mounts().into_iter().map(|m| m.target).collect();
    plan.mounts
        .iter()
        .filter(|m| matches!(m.kind, MountKind::Bind(_)))
        .filter(|m| !(system.contains(&m.target) && m.source == m.target))
        .filter(|m| m.target != plan.project.root)
        .map(|m| m.target.clone())
        .collect()
}

fn mount(name: &str, path: &Path, read_only: bool, sub_path: Option<String>) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.display().to_string(),
        read_only: Some(read_only),
        sub_path,
        ..Default::default()
    }
}

/// A volume's name: as given, or with the jail's name first for `podman kube play`, which
/// makes a named volume of each emptyDir by its name (two Pods' `tmp` would be one volume).
fn local_name(opts: &Options, base: &str) -> String {
    match opts.node_files {
        Some(_) => format!("{}-{base}", opts.name),
        None => base.to_string(),
    }
}

/// The volumes the unreadable and the empty file come from: the ConfigMap's, or the node's
/// files ([`Options::node_files`]).
fn file_volumes(opts: &Options) -> Vec<Volume> {
    let Some(dir) = &opts.node_files else {
        return vec![Volume {
            name: FILES.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: files_name(opts),
                default_mode: Some(0o444),
                items: Some(vec![
                    KeyToPath {
                        key: MASKED_KEY.into(),
                        path: MASKED_KEY.into(),
                        mode: Some(0),
                    },
                    KeyToPath {
                        key: EMPTY_KEY.into(),
                        path: EMPTY_KEY.into(),
                        mode: Some(0o444),
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }];
    };
    [MASKED_KEY, EMPTY_KEY]
        .iter()
        .map(|key| host_path(local_name(opts, key), &dir.join(key), "File"))
        .collect()
}

/// The mount of the unreadable (`MASKED_KEY`) or the empty (`EMPTY_KEY`) file at `path`.
fn file_mount(opts: &Options, path: &Path, key: &str) -> VolumeMount {
    match opts.node_files {
        Some(_) => mount(&local_name(opts, key), path, true, None),
        None => mount(FILES, path, true, Some(key.into())),
    }
}

fn host_path(name: String, path: &Path, kind: &str) -> Volume {
    Volume {
        name,
        host_path: Some(HostPathVolumeSource {
            path: path.display().to_string(),
            type_: Some(kind.into()),
        }),
        ..Default::default()
    }
}

fn empty_dir(name: String) -> Volume {
    Volume {
        name,
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

/// The project, /tmp and the plan's private directories, masked and protected paths.
pub fn volumes(plan: &Plan, opts: &Options) -> Result<(Vec<Volume>, Vec<VolumeMount>)> {
    let root = &plan.project.root;
    let ro = read_only(plan.project.access);
    let project = match &opts.project {
        ProjectSource::Claim(claim) => Volume {
            name: PROJECT.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(ro),
            }),
            ..Default::default()
        },
        ProjectSource::HostPath => Volume {
            name: PROJECT.into(),
            host_path: Some(HostPathVolumeSource {
                path: root.display().to_string(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        },
    };
    let mut vols = vec![project];
    vols.extend(file_volumes(opts));
    let tmp = local_name(opts, "tmp");
    vols.push(empty_dir(tmp.clone()));
    let mut mounts = vec![
        mount(PROJECT, root, ro, None),
        mount(&tmp, Path::new("/tmp"), false, None),
    ];
    for (i, target) in tmpfs_targets(plan).iter().enumerate() {
        let name = local_name(opts, &format!("private-{i}"));
        mounts.push(mount(&name, target, false, None));
        vols.push(empty_dir(name));
    }
    for (i, p) in plan.masked.iter().enumerate() {
        if opts.dirs.contains(p) {
            let name = local_name(opts, &format!("masked-{i}"));
            mounts.push(mount(&name, p, true, None));
            vols.push(empty_dir(name));
        } else {
            mounts.push(file_mount(opts, p, MASKED_KEY));
        }
    }
    for (i, p) in plan.protected.iter().enumerate() {
        let rel = p
            .strip_prefix(root)
            .map_err(|_| KubeError::OutsideProject {
                path: p.clone(),
                root: root.clone(),
            })?;
        if !opts.existing.contains(p) {
            if *p == plan.project.policy_file {
                mounts.push(file_mount(opts, p, EMPTY_KEY));
            }
            continue;
        }
        if opts.node_files.is_none() {
            mounts.push(mount(PROJECT, p, true, Some(rel.display().to_string())));
            continue;
        }
        // The node's own path, as the podman backend binds it.
        let name = local_name(opts, &format!("protected-{i}"));
        let kind = if opts.dirs.contains(p) {
            "Directory"
        } else {
            "File"
        };
        vols.push(host_path(name.clone(), p, kind));
        mounts.push(mount(&name, p, true, None));
    }
    Ok((vols, mounts))
}
