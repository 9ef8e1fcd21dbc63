//! One host argument of `corral allow`/`deny` or a run-only allow (`corral watch`), parsed.

use anyhow::bail;
use corral_policy::domain::DomainPattern;
use corral_policy::pathrule::PathRule;
use ipnet::IpNet;

/// One host argument, parsed: a pattern for `network.allow`/`deny`, and the address range for
/// `network.allow_cidrs` (an IP literal's own address, or a CIDR alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub pattern: Option<DomainPattern>,
    pub cidr: Option<IpNet>,
    /// A rule by method and path (`corral allow 'GET api.github.com/repos/myorg/**'`): into
    /// `network.allow` as written in canonical form; never a deny entry.
    pub rule: Option<PathRule>,
}

impl Target {
    pub fn parse(raw: &str) -> anyhow::Result<Target> {
        if let Some((_, rest)) = raw.split_once("://") {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            let authority = authority.rsplit('@').next().unwrap_or(authority);
            if authority.is_empty() {
                bail!("{raw:?}: a scheme is not a host: write the host alone (e.g. example.org)");
            }
            bail!("{raw:?}: a scheme is not a host: write {authority}");
        }
        if let Ok(cidr) = raw.parse::<IpNet>() {
            return Ok(Target {
                pattern: None,
                cidr: Some(cidr.trunc()),
                rule: None,
            });
        }
        if raw.contains(['/', ' ']) {
            let rule = PathRule::parse(raw)?;
            return Ok(Target {
                pattern: None,
                cidr: None,
                rule: Some(rule),
            });
        }
        let pattern = DomainPattern::parse(raw)?;
        let cidr = pattern.ip().map(IpNet::from);
        Ok(Target {
            pattern: Some(pattern),
            cidr,
            rule: None,
        })
    }
}
