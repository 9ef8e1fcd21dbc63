//! `[secrets]` in the manifests. The sandbox must trust the credential gateway's run CA before
//! the proxy's Pod runs, so the CA is made at render time (by the caller: [`RunSecrets`]) and
//! split:
//!
//! - the sandbox gets the CA *certificate* (ConfigMap `NAME-run-ca`: the CA alone and the bundle
//!   of system roots plus the CA, mounted read-only at [`TRUST_DIR`] and over the system bundle
//!   paths), the CA variables the other backends set (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`,
//!   ...: `corral_gateway::trust_layout`), and each secret's *placeholder* in its environment;
//! - the proxy gets the real values, the placeholders, the certificate and the CA *key* in the
//!   Secret `NAME-proxy-secrets`, mounted only in its Deployment (`corral-proxy --secrets
//!   --ca-cert --ca-key --placeholders`): the one place a run CA's key is written, inherent to
//!   a CA the sandbox trusts before the proxy runs.
//!
//! With no network the sandbox gets the placeholders only (nothing could use a real value), as
//! on the container backends; no CA, no Secret.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use corral_gateway::CaPem;
use corral_net::standalone::SecretsFile;
use corral_policy::plan::Plan;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, EmptyDirVolumeSource, EnvVar, PodSpec, Secret,
    SecretVolumeSource, Volume, VolumeMount,
};

use crate::proxy::PROXY_USER;
use crate::{KubeError, Options, Result, meta};

/// Where the sandbox finds the run CA's files (the CA variables name them).
pub const TRUST_DIR: &str = "/var/run/corral/trust";
/// Where the proxy finds its Secret's files.
pub const SECRETS_DIR: &str = "/var/run/corral/secrets";
/// The proxy's `--gateway-dir` (an emptyDir: the root filesystem is read-only).
pub const GATEWAY_DIR: &str = "/var/run/corral/gateway";
/// The keys of the proxy's Secret (each a file under [`SECRETS_DIR`]).
pub const KEY_VALUES: &str = "secrets.json";
pub const KEY_PLACEHOLDERS: &str = "placeholders.json";
pub const KEY_CA_CERT: &str = "ca.pem";
pub const KEY_CA_KEY: &str = "ca-key.pem";
const CA_VOLUME: &str = "run-ca";
const SECRETS_VOLUME: &str = "proxy-secrets";
const GATEWAY_VOLUME: &str = "gateway";

/// What the caller made for one rendering with `[secrets]`: the run CA, the real values and
/// the placeholders. `Debug` shows neither the key nor a value.
#[derive(Debug, Clone)]
pub struct RunSecrets {
    /// The run CA (`corral_gateway::new_ca` for the plan's secrets).
    pub ca: CaPem,
    /// Each secret with its real value: the proxy's `--secrets` file.
    pub values: SecretsFile,
    /// Each secret's placeholder by name (`corral_gateway::placeholder_for`).
    pub placeholders: BTreeMap<String, String>,
    /// The system roots (PEM) the sandbox's bundle starts from; empty: the run CA alone.
    pub system_bundle: String,
    /// System bundle paths the bundle is mounted over in the sandbox, for programs that read
    /// the system store and ignore the CA variables.
    pub system_paths: Vec<PathBuf>,
}

/// What of `[secrets]` the objects carry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Carried<'a> {
    /// The plan has no secrets.
    None,
    /// No network: placeholders in the sandbox's environment only.
    Placeholders(&'a RunSecrets),
    /// Through the proxy: the gateway, its Secret and the CA ConfigMap too.
    Gateway(&'a RunSecrets),
}

impl<'a> Carried<'a> {
    /// What the plan's secrets need, checked against what was given: every secret of the
    /// plan has its value and placeholder, and nothing else is given.
    pub(crate) fn of(plan: &Plan, given: Option<&'a RunSecrets>, proxied: bool) -> Result<Self> {
        let bad = |message: String| KubeError::Bad {
            what: "[secrets]".into(),
            message,
        };
        let Some(s) = given else {
            if plan.secrets.is_empty() {
                return Ok(Carried::None);
            }
            return Err(bad(
                "the run CA, the real values and the placeholders were not given (corral kube render makes them)".into(),
            ));
        };
        let mut want: Vec<&str> = plan.secrets.iter().map(|p| p.name.as_str()).collect();
        want.sort_unstable();
        let mut values: Vec<&str> = s
            .values
            .secrets
            .iter()
            .map(|v| v.plan.name.as_str())
            .collect();
        values.sort_unstable();
        let placeholders: Vec<&str> = s.placeholders.keys().map(String::as_str).collect();
        if want != values || want != placeholders {
            return Err(bad(format!(
                "the plan's secrets {want:?}, the values given {values:?} and the placeholders {placeholders:?} differ"
            )));
        }
        if want.is_empty() {
            return Ok(Carried::None);
        }
        Ok(if proxied {
            Carried::Gateway(s)
        } else {
            Carried::Placeholders(s)
        })
    }
}

fn ca_config_map_name(opts: &Options) -> String {
    format!("{}-run-ca", opts.name)
}

fn secret_name(opts: &Options) -> String {
    format!("{}-proxy-secrets", opts.name)
}

/// The trust files' names in [`TRUST_DIR`] and the CA variables, as every backend has them.
fn layout() -> corral_gateway::TrustLayout {
    corral_gateway::trust_layout(Path::new(TRUST_DIR))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The sandbox's ConfigMap of the run CA: its certificate alone, and the bundle (system roots
/// plus the CA). No key.
pub fn ca_config_map(opts: &Options, s: &RunSecrets) -> ConfigMap {
    let l = layout();
    let mut bundle = s.system_bundle.clone();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(&s.ca.cert);
    ConfigMap {
        metadata: meta(opts, ca_config_map_name(opts), "sandbox"),
        data: Some(BTreeMap::from([
            (file_name(&l.ca_file), s.ca.cert.clone()),
            (file_name(&l.bundle_file), bundle),
        ])),
        ..Default::default()
    }
}

/// The proxy's Secret: the real values, the placeholders, the CA certificate and its key.
pub fn proxy_secret(opts: &Options, s: &RunSecrets) -> Result<Secret> {
    let json = |what: &str, r: serde_json::Result<String>| {
        r.map_err(|e| KubeError::Bad {
            what: format!("serializing the {what}"),
            message: e.to_string(),
        })
    };
    Ok(Secret {
        metadata: meta(opts, secret_name(opts), "proxy"),
        string_data: Some(BTreeMap::from([
            (
                KEY_VALUES.into(),
                json("secrets' values", serde_json::to_string(&s.values))?,
            ),
            (
                KEY_PLACEHOLDERS.into(),
                json("placeholders", serde_json::to_string(&s.placeholders))?,
            ),
            (KEY_CA_CERT.into(), s.ca.cert.clone()),
            (KEY_CA_KEY.into(), s.ca.key.clone()),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    })
}

/// The sandbox's side: the placeholders in the harness's environment and, with the gateway,
/// the CA variables and the CA's files.
pub(crate) fn attach_sandbox(spec: &mut PodSpec, opts: &Options, carried: Carried<'_>) {
    let (s, gateway) = match carried {
        Carried::None => return,
        Carried::Placeholders(s) => (s, false),
        Carried::Gateway(s) => (s, true),
    };
    let mut add: BTreeMap<String, String> = s.placeholders.clone();
    if gateway {
        add.extend(layout().env);
    }
    let Some(c) = spec.containers.first_mut() else {
        return;
    };
    let env = c.env.get_or_insert_with(Vec::new);
    env.retain(|e| !add.contains_key(&e.name));
    env.extend(add.into_iter().map(|(name, value)| EnvVar {
        name,
        value: Some(value),
        value_from: None,
    }));
    env.sort_by(|a, b| a.name.cmp(&b.name));
    if !gateway {
        return;
    }
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    mounts.push(VolumeMount {
        name: CA_VOLUME.into(),
        mount_path: TRUST_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    });
    let bundle = file_name(&layout().bundle_file);
    for p in &s.system_paths {
        mounts.push(VolumeMount {
            name: CA_VOLUME.into(),
            mount_path: p.display().to_string(),
            sub_path: Some(bundle.clone()),
            read_only: Some(true),
            ..Default::default()
        });
    }
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: CA_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: ca_config_map_name(opts),
            default_mode: Some(0o444),
            ..Default::default()
        }),
        ..Default::default()
    });
}

/// The proxy's side: the gateway's flags, its Secret (readable by the proxy's group only) and
/// an emptyDir for the gateway's own files.
pub(crate) fn attach_proxy(d: &mut Deployment, opts: &Options) {
    let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) else {
        return;
    };
    if let Some(sc) = spec.security_context.as_mut() {
        // Secret files belong to root and this group: the proxy (nobody) reads them by it.
        sc.fs_group = Some(PROXY_USER);
    }
    let Some(c) = spec.containers.first_mut() else {
        return;
    };
    let file = |key: &str| format!("{SECRETS_DIR}/{key}");
    c.args.get_or_insert_with(Vec::new).extend([
        "--secrets".into(),
        file(KEY_VALUES),
        "--gateway-dir".into(),
        GATEWAY_DIR.into(),
        "--ca-cert".into(),
        file(KEY_CA_CERT),
        "--ca-key".into(),
        file(KEY_CA_KEY),
        "--placeholders".into(),
        file(KEY_PLACEHOLDERS),
    ]);
    c.volume_mounts.get_or_insert_with(Vec::new).extend([
        VolumeMount {
            name: SECRETS_VOLUME.into(),
            mount_path: SECRETS_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount {
            name: GATEWAY_VOLUME.into(),
            mount_path: GATEWAY_DIR.into(),
            ..Default::default()
        },
    ]);
    spec.volumes.get_or_insert_with(Vec::new).extend([
        Volume {
            name: SECRETS_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name(opts)),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: GATEWAY_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]);
}
