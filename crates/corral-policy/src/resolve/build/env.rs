//! The jail's environment: the basics, passed and set variables, the proxy variables; never a
//! secret's real value (the gateway sets placeholders at run time).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::config::SecretSpec;
use crate::plan::{NetworkMode, NetworkPlan, SecretPlan};

use super::super::gather::Gathered;
use super::super::layer::{Layer, Loc};
use super::super::{BASIC_PASS, JAIL_BIN_DIR, JAIL_PROXY_URL, SYSTEM_PATH};
use super::Side;

/// The environment of one jail. The executor's has no command's interpreter on PATH and none of
/// the harness profile's own variables: they are not the project environment's.
pub(super) fn env(
    g: &Gathered,
    m: &Layer,
    side: Side,
    network: &NetworkPlan,
    secrets: &BTreeMap<String, SecretPlan>,
) -> BTreeMap<String, String> {
    let command_dirs = match side {
        Side::Agent => g.disk.command.path_dirs.as_slice(),
        Side::Executor => &[],
    };
    let path_dirs: Vec<PathBuf> = command_dirs
        .iter()
        .chain(&g.disk.toolchain_path)
        .cloned()
        .collect();
    let mut env = base_env(g, &path_dirs);
    env.extend(g.disk.toolchains.iter().flat_map(|t| t.env.clone()));
    for (name, _) in &m.env_pass {
        if let Some(v) = g.env.get(name) {
            env.insert(name.clone(), v.clone());
        }
    }
    for (k, (v, at)) in &m.env_set {
        if side == Side::Agent || !matches!(at, Loc::Builtin(_)) {
            env.insert(k.clone(), v.clone());
        }
    }
    if network.mode == NetworkMode::Proxy {
        env.extend(proxy_env(JAIL_PROXY_URL));
    }
    for (name, s) in secrets {
        env.remove(name);
        env.remove(&s.from_env);
    }
    env
}

/// The secrets the gateway serves: the profile's when the caller has them, the policy's always.
pub(super) fn secrets(g: &Gathered, m: &Layer) -> BTreeMap<String, SecretPlan> {
    let mut secrets = BTreeMap::new();
    for (name, spec) in &g.profile.secrets {
        if g.env.contains_key(&spec.from_env.0) {
            secrets.insert(name.clone(), secret_plan(name, spec));
        }
    }
    for (name, (spec, _)) in &m.secrets {
        secrets.insert(name.clone(), secret_plan(name, spec));
    }
    secrets
}

/// The proxy variables of a jail in proxy mode.
pub fn proxy_env(url: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        env.insert(k.to_string(), url.to_string());
    }
    for k in ["NO_PROXY", "no_proxy"] {
        env.insert(k.to_string(), "localhost,127.0.0.1,::1".to_string());
    }
    env.insert("NODE_USE_ENV_PROXY".into(), "1".into());
    env
}

/// The base environment of every jail: home, PATH (corral first), TMPDIR, and the caller's
/// terminal and locale variables.
fn base_env(g: &Gathered, extra_path: &[PathBuf]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for k in BASIC_PASS {
        if let Some(v) = g.env.get(*k) {
            env.insert(k.to_string(), v.clone());
        }
    }
    env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
    env.insert("HOME".into(), g.home.display().to_string());
    env.insert("TMPDIR".into(), "/tmp".into());
    let mut path = vec![JAIL_BIN_DIR.to_string()];
    for p in extra_path {
        let p = p.display().to_string();
        if !path.contains(&p) {
            path.push(p);
        }
    }
    path.push(SYSTEM_PATH.to_string());
    env.insert("PATH".into(), path.join(":"));
    env
}

fn secret_plan(name: &str, spec: &SecretSpec) -> SecretPlan {
    SecretPlan {
        name: name.to_string(),
        from_env: spec.from_env.0.clone(),
        hosts: spec.hosts.clone(),
    }
}

/// Sign-in entries: the profile's, each replaced by a policy entry of the same name.
pub(super) fn signin(g: &Gathered, m: &Layer) -> Vec<crate::signin::SigninPlan> {
    let mut all: BTreeMap<&str, &crate::signin::SigninSpec> = g
        .profile
        .signin
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    for (name, (spec, _)) in &m.signin {
        all.insert(name, spec);
    }
    all.into_iter()
        .map(|(name, s)| s.plan(name, &g.home))
        .collect()
}
