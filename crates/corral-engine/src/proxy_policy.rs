//! The policy file the proxy container reads: the plan's `[network]` rules written back in
//! `corral.toml`'s own schema, so `corral proxy --policy` parses it with the one policy parser.
//!
//! It is generated from the resolved Plan (command-line `--allow` included), never copied from
//! the project's corral.toml, and it lives outside the project, so the jail can never edit it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use corral_policy::plan::{NetworkMode, NetworkPlan};
use serde::Serialize;

use crate::{EngineError, Result};

/// Where the proxy container sees its policy directory and file.
pub const CONTAINER_DIR: &str = "/etc/corral";
pub const CONTAINER_FILE: &str = "/etc/corral/policy.toml";

#[derive(Serialize)]
struct File<'a> {
    network: Network<'a>,
}

#[derive(Serialize)]
struct Network<'a> {
    mode: &'static str,
    allow: Vec<String>,
    deny: Vec<String>,
    allow_cidrs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_proxy: Option<&'a str>,
}

/// The file's text.
pub fn render(network: &NetworkPlan) -> String {
    let mode = match network.mode {
        NetworkMode::None => "none",
        NetworkMode::Proxy => "proxy",
        NetworkMode::Host => "host",
    };
    let file = File {
        network: Network {
            mode,
            allow: network.allow.iter().map(|p| p.to_string()).collect(),
            deny: network.deny.iter().map(|p| p.to_string()).collect(),
            allow_cidrs: network.allow_cidrs.iter().map(|c| c.to_string()).collect(),
            upstream_proxy: network.upstream_proxy.as_deref(),
        },
    };
    let body = toml::to_string(&file).expect("plain strings always serialize to TOML");
    format!(
        "# Written by corral for the proxy container from the resolved plan; rewritten on every run.\n\
         # Edit corral.toml (or use `corral allow`), not this file.\n{body}"
    )
}

/// Write the policy into `dir/policy.toml` atomically (a rename, so the proxy never reads half a
/// file). Returns whether its content changed, in which case a running proxy container must be
/// replaced to pick it up.
pub fn write(dir: &Path, network: &NetworkPlan) -> Result<bool> {
    let text = render(network);
    let path = dir.join("policy.toml");
    let io = |path: &Path| {
        let path: PathBuf = path.to_path_buf();
        move |source| EngineError::Io { path, source }
    };
    if fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
        return Ok(false);
    }
    fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = dir.join(".policy.toml.tmp");
    let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(text.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_policy::domain::DomainPattern;

    #[test]
    fn renders_the_network_section_whole() {
        let net = NetworkPlan {
            mode: NetworkMode::Proxy,
            allow_paths: Vec::new(),
            allow: vec![
                DomainPattern::parse("api.anthropic.com").unwrap(),
                DomainPattern::parse("*.github.com").unwrap(),
                DomainPattern::parse("registry.example.com:443").unwrap(),
            ],
            deny: vec![DomainPattern::parse("gist.github.com").unwrap()],
            allow_cidrs: vec!["10.89.0.0/16".parse().unwrap()],
            host_ports: vec![],
            publish: vec![],
            upstream_proxy: Some("http://proxy.corp:3128".into()),
            dns: Default::default(),
            on_deny: Default::default(),
        };
        similar_asserts::assert_eq!(
            render(&net),
            r#"# Written by corral for the proxy container from the resolved plan; rewritten on every run.
# Edit corral.toml (or use `corral allow`), not this file.
[network]
mode = "proxy"
allow = ["api.anthropic.com", "*.github.com", "registry.example.com:443"]
deny = ["gist.github.com"]
allow_cidrs = ["10.89.0.0/16"]
upstream_proxy = "http://proxy.corp:3128"
"#
        );
    }

    #[test]
    fn write_reports_changes_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut net = corral_policy::plan::Plan::minimal(dir.path(), dir.path(), vec![]).network;
        net.mode = NetworkMode::Proxy;
        let d = dir.path().join("proxy");
        assert!(write(&d, &net).unwrap());
        assert!(!write(&d, &net).unwrap());
        net.allow.push(DomainPattern::parse("example.org").unwrap());
        assert!(write(&d, &net).unwrap());
        assert!(
            fs::read_to_string(d.join("policy.toml"))
                .unwrap()
                .contains("allow = [\"example.org\"]")
        );
    }
}
