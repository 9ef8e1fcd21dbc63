//! corral's proxy as its own Deployment and Service: the plan's `[network]` rules in a
//! ConfigMap (the container backend's policy file, the same text), its audit log on standard
//! output as JSON lines for the cluster's log stack.

use std::collections::BTreeMap;

use corral_engine::proxy_policy;
use corral_policy::plan::Plan;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, PodSpec, PodTemplateSpec,
    ResourceRequirements, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::sandbox::{container_security, pod_security};
use crate::{KubeError, Options, PROXY_PORT, Result, Seccomp, labels, meta, selector};

/// The uid and gid the proxy runs as: nobody.
pub const PROXY_USER: i64 = 65534;

fn policy_name(opts: &Options) -> String {
    format!("{}-proxy-policy", opts.name)
}

/// The proxy's rules: `policy.toml` as the container backend writes it.
pub fn policy_config_map(plan: &Plan, opts: &Options) -> ConfigMap {
    ConfigMap {
        metadata: meta(opts, policy_name(opts), "proxy"),
        data: Some(BTreeMap::from([(
            "policy.toml".into(),
            proxy_policy::render(&plan.network),
        )])),
        ..Default::default()
    }
}

/// One proxy replica: hardened like the sandbox (under the runtime's default seccomp profile),
/// no service account token, the policy read-only.
pub fn deployment(opts: &Options) -> Deployment {
    let container = Container {
        name: "proxy".into(),
        image: Some(opts.proxy_image.clone()),
        command: Some(vec!["corral-proxy".into()]),
        args: Some(vec![
            "--listen".into(),
            format!("0.0.0.0:{PROXY_PORT}"),
            "--policy".into(),
            proxy_policy::CONTAINER_FILE.into(),
            "--audit-log".into(),
            "-".into(),
            "--jail".into(),
            opts.name.clone(),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("proxy".into()),
            container_port: PROXY_PORT.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            limits: Some(quantities("1", "512Mi")),
            requests: Some(quantities("100m", "64Mi")),
            ..Default::default()
        }),
        security_context: Some(container_security()),
        volume_mounts: Some(vec![VolumeMount {
            name: "policy".into(),
            mount_path: proxy_policy::CONTAINER_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let spec = PodSpec {
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(pod_security(
            PROXY_USER,
            PROXY_USER,
            Seccomp::RuntimeDefault,
        )),
        containers: vec![container],
        volumes: Some(vec![Volume {
            name: "policy".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: policy_name(opts),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    Deployment {
        metadata: meta(opts, format!("{}-proxy", opts.name), "proxy"),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(selector(opts, "proxy")),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(opts, "proxy")),
                    ..Default::default()
                }),
                spec: Some(spec),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".into(), Quantity(cpu.into())),
        ("memory".into(), Quantity(memory.into())),
    ])
}

/// The proxy's Service at the fixed ClusterIP the sandbox is given (it has no DNS).
pub fn service(opts: &Options) -> Result<Service> {
    let ip = opts.proxy_ip.clone().ok_or(KubeError::NoProxyIp)?;
    check_ip("--proxy-ip", &ip)?;
    Ok(Service {
        metadata: meta(opts, format!("{}-proxy", opts.name), "proxy"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip),
            selector: Some(selector(opts, "proxy")),
            ports: Some(vec![ServicePort {
                name: Some("proxy".into()),
                port: PROXY_PORT.into(),
                target_port: Some(IntOrString::Int(PROXY_PORT.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A fixed ClusterIP must be an address.
pub fn check_ip(flag: &str, ip: &str) -> Result<()> {
    match ip.parse::<std::net::IpAddr>() {
        Ok(_) => Ok(()),
        Err(_) => Err(KubeError::Bad {
            what: format!("{flag} {ip}"),
            message: "not an IP address".into(),
        }),
    }
}
