//! The names of a project's engine objects. Every name carries the project key (the audit log's
//! own: base name plus a hash of the full path), so two projects never share a network, a proxy
//! or an executor alias.

use std::path::Path;

/// Default prefix of every object corral creates.
pub const DEFAULT_PREFIX: &str = "corral";

/// The label every container and network corral creates carries: `corral.project=<key>`.
pub const PROJECT_LABEL: &str = "corral.project";

/// The alias of the proxy container on the project's internal network.
pub const PROXY_ALIAS: &str = "proxy";

/// The port the proxy container listens on.
pub const PROXY_PORT: u16 = corral_policy::consts::PROXY_PORT;

/// The port the compose executor service listens on (seed 003's).
pub const EXECUTOR_PORT: u16 = 8080;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The project key (`corral_audit::project_key`).
    pub key: String,
    /// `<prefix>-<key>-internal`: the per-project `--internal` network.
    pub internal_network: String,
    /// `<prefix>-external`: the shared network with a route out; only proxies join it.
    pub external_network: String,
    /// `<prefix>-<key>-proxy`.
    pub proxy_container: String,
    /// The executor service's unique alias on the internal network (a DNS label).
    pub executor_alias: String,
    /// The read-only volume holding the corral binary for compose services.
    pub bin_volume: String,
}

impl Names {
    pub fn new(prefix: &str, project_root: &Path) -> Self {
        let key = corral_audit::project_key(project_root);
        let dns: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        Self {
            internal_network: format!("{prefix}-{key}-internal"),
            external_network: format!("{prefix}-external"),
            proxy_container: format!("{prefix}-{key}-proxy"),
            executor_alias: format!("{prefix}-exec-{dns}"),
            bin_volume: format!("{prefix}-bin"),
            key,
        }
    }

    /// The name of one run's harness container.
    pub fn harness_container(&self, prefix: &str, jail_id: &str) -> String {
        format!("{prefix}-{}-{jail_id}", self.key)
    }

    /// `corral.project=<key>`.
    pub fn label(&self) -> String {
        format!("{PROJECT_LABEL}={}", self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_project() {
        let a = Names::new("corral", Path::new("/home/u/src/My App"));
        let b = Names::new("corral", Path::new("/home/u/other/My App"));
        assert_ne!(a.internal_network, b.internal_network);
        assert_ne!(a.proxy_container, b.proxy_container);
        assert_ne!(a.executor_alias, b.executor_alias);
        assert_eq!(a.external_network, b.external_network);
        assert!(a.internal_network.starts_with("corral-My_App-"));
        assert!(
            a.executor_alias
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{}",
            a.executor_alias
        );
    }
}
