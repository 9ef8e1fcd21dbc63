//! The executor as its own Pod (`[executor] target = "sandbox"`): `corral serve` in a Pod hardened
//! like the sandbox and built from the plan's executor jail (its environment, mounts, limits),
//! reached only from the sandbox, at a fixed ClusterIP (the sandbox has no DNS), with a bearer
//! token from a Secret both Pods mount read-only.

use std::collections::BTreeMap;

use corral_policy::plan::{NetworkMode, Plan};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodSpec, Secret, SecretVolumeSource, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::sandbox::{FALLBACK_USER, container_security, env, pod_security, resources, volumes};
use crate::{KubeError, Options, Result, meta, selector};

/// The executor's port (the container backend's).
pub const EXECUTOR_PORT: u16 = corral_engine::names::EXECUTOR_PORT;
/// The name the sandbox reaches the executor by (`hostAliases`, no DNS).
pub const EXECUTOR_HOST: &str = "executor";
/// Where both Pods see the token.
pub const TOKEN_DIR: &str = "/var/run/corral/executor";
pub const TOKEN_FILE: &str = "/var/run/corral/executor/token";
/// The volume holding the token, in both Pods.
pub const TOKEN_VOLUME: &str = "executor-token";

/// The executor's jail, when the plan has one and `--executor-ip` asks for it to be rendered.
pub fn jail<'a>(plan: &'a Plan, opts: &Options) -> Option<&'a Plan> {
    opts.executor.as_ref()?;
    plan.executor.jail.as_deref()
}

fn token_secret_name(opts: &Options) -> String {
    format!("{}-executor-token", opts.name)
}

/// The token, as a Secret.
pub fn secret(opts: &Options, token: &str) -> Secret {
    Secret {
        metadata: meta(opts, token_secret_name(opts), "executor"),
        string_data: Some(BTreeMap::from([("token".into(), token.into())])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The token's volume and mount (both Pods).
pub fn token_volume(opts: &Options) -> (Volume, VolumeMount) {
    (
        Volume {
            name: TOKEN_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(token_secret_name(opts)),
                default_mode: Some(0o444),
                ..Default::default()
            }),
            ..Default::default()
        },
        VolumeMount {
            name: TOKEN_VOLUME.into(),
            mount_path: TOKEN_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
    )
}

/// `corral serve` with the plan's executor settings, already resolved (no policy file read).
fn serve_args(plan: &Plan) -> Vec<String> {
    let e = &plan.executor;
    let mut a: Vec<String> = vec![
        "serve".into(),
        "--listen".into(),
        format!("0.0.0.0:{EXECUTOR_PORT}"),
        "--token-file".into(),
        TOKEN_FILE.into(),
        "--root".into(),
        plan.project.root.display().to_string(),
        "--timeout".into(),
        format!("{}ms", e.timeout_ms.max(1)),
        "--max-output".into(),
        e.max_output.max(1).to_string(),
        "--max-concurrent".into(),
        e.max_concurrent.max(1).to_string(),
        "--policy".into(),
        "/dev/null".into(),
        "--audit-log".into(),
        "-".into(),
    ];
    for p in &e.allow {
        a.push("--allow".into());
        a.push(p.clone());
    }
    a
}

/// The executor Pod: the executor jail's environment, mounts and limits, hardened like the
/// sandbox; its commands run in it directly (the Pod is their jail).
pub fn pod(plan: &Plan, jail: &Plan, opts: &Options) -> Result<Pod> {
    let exec = opts.executor.as_ref().ok_or(KubeError::NoExecutorIp)?;
    let (mut vols, mut mounts) = volumes(jail, opts)?;
    let (v, m) = token_volume(opts);
    vols.push(v);
    mounts.push(m);
    let uid = if jail.uid == 0 {
        FALLBACK_USER
    } else {
        jail.uid.into()
    };
    let gid = if jail.uid == 0 {
        FALLBACK_USER
    } else {
        jail.gid.into()
    };
    let container = Container {
        name: "executor".into(),
        image: Some(exec.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["corral".into()]),
        args: Some(serve_args(plan)),
        working_dir: Some(jail.project.root.display().to_string()),
        env: Some(env(jail, false)),
        ports: Some(vec![ContainerPort {
            name: Some("executor".into()),
            container_port: EXECUTOR_PORT.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(resources(jail)),
        security_context: Some(container_security()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let spec = PodSpec {
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        dns_policy: Some("None".into()),
        dns_config: Some(crate::sandbox::no_dns()),
        host_aliases: crate::sandbox::host_aliases(jail, opts, false),
        restart_policy: Some("Never".into()),
        termination_grace_period_seconds: Some(5),
        security_context: Some(pod_security(uid, gid, opts.seccomp)),
        containers: vec![container],
        volumes: Some(vols),
        ..Default::default()
    };
    Ok(Pod {
        metadata: meta(opts, format!("{}-executor", opts.name), "executor"),
        spec: Some(spec),
        ..Default::default()
    })
}

/// The executor's Service at the fixed ClusterIP the sandbox is given.
pub fn service(opts: &Options) -> Result<Service> {
    let exec = opts.executor.as_ref().ok_or(KubeError::NoExecutorIp)?;
    crate::proxy::check_ip("--executor-ip", &exec.ip)?;
    Ok(Service {
        metadata: meta(opts, format!("{}-executor", opts.name), "executor"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(exec.ip.clone()),
            selector: Some(selector(opts, "executor")),
            ports: Some(vec![ServicePort {
                name: Some("executor".into()),
                port: EXECUTOR_PORT.into(),
                target_port: Some(IntOrString::Int(EXECUTOR_PORT.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The executor's network: none, or the same proxy as the sandbox when its rules are the same
/// (one proxy per jail; different rules would need a second one).
pub fn check_network(plan: &Plan, jail: &Plan) -> Result<bool> {
    match jail.network.mode {
        NetworkMode::None => Ok(false),
        NetworkMode::Proxy
            if plan.network.mode == NetworkMode::Proxy
                && jail.network.allow == plan.network.allow
                && jail.network.deny == plan.network.deny
                && jail.network.allow_cidrs == plan.network.allow_cidrs =>
        {
            Ok(true)
        }
        NetworkMode::Proxy | NetworkMode::Host => Err(KubeError::Unsupported {
            what: "[executor.sandbox] network rules other than none or the jail's own".into(),
        }),
    }
}
