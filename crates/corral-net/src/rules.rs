//! The network rules the proxy decides with, and the name-level decision.
//!
//! Order: deny list, allow list (with the default port of the request kind unless the matching
//! pattern names a port). The address check after resolution is in `proxy/dial.rs`; both use
//! `corral_policy`'s one matcher and one classifier.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

use corral_policy::domain::{DomainPattern, Host};
use corral_policy::pathrule::{AllowEntry, PathRule};
use corral_policy::plan::NetworkPlan;
use corral_policy::reqpath::{self, Normalized};
use ipnet::IpNet;

use crate::NetError;

/// What a client asked for: the default port differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A CONNECT tunnel (default port 443).
    Connect,
    /// Plain HTTP forwarding (default port 80).
    Http,
    /// A SOCKS5 CONNECT (default port 443, as CONNECT).
    Socks,
}

impl Kind {
    pub fn default_port(self) -> u16 {
        match self {
            Kind::Connect | Kind::Socks => 443,
            Kind::Http => 80,
        }
    }
}

/// An upstream proxy to chain through (`network.upstream_proxy = "http://HOST:PORT"`), parsed
/// by the policy crate's one parser.
pub use corral_policy::consts::UpstreamProxy as Upstream;

/// [`Upstream::parse`], its error as the network rules report it.
fn parse_upstream(raw: &str) -> Result<Upstream, NetError> {
    Upstream::parse(raw).map_err(|why| NetError::Config(format!("network.upstream_proxy: {why}")))
}

/// The proxy's rules: built from a [`NetworkPlan`], replaced whole on reload.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub allow: Vec<DomainPattern>,
    /// Rules by method and path: a host they name is decided request by request.
    pub allow_paths: Vec<PathRule>,
    pub deny: Vec<DomainPattern>,
    pub allow_cidrs: Vec<IpNet>,
    pub upstream: Option<Upstream>,
}

/// How a host passed the name-level decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// The whole host: an opaque tunnel or plain forwarding. The rule that allowed it.
    Host(String),
    /// Only some requests: each is decided by [`Rules::check_request`], so a CONNECT must be
    /// terminated with the run's CA (never an opaque tunnel) and SOCKS refused. The rule set.
    Paths(String),
}

/// Why a request was denied, and how to allow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The rule that decided (`not in network.allow`, `network.deny: gist.github.com`, ...).
    pub rule: String,
    /// What the user can do about it, short (`allow with: corral run --allow github.com`).
    pub fix: String,
    /// The HTTP status answered.
    pub status: u16,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.rule)
    }
}

/// How a host is written in rules and hints: names as is, IPv6 in brackets.
pub fn host_display(host: &Host) -> String {
    match host {
        Host::Name(n) => n.clone(),
        Host::Ip(IpAddr::V4(v4)) => v4.to_string(),
        Host::Ip(IpAddr::V6(v6)) => format!("[{v6}]"),
    }
}

impl Rules {
    pub fn from_plan(net: &NetworkPlan) -> Result<Self, NetError> {
        let upstream = net
            .upstream_proxy
            .as_deref()
            .filter(|u| !u.is_empty())
            .map(parse_upstream)
            .transpose()?;
        Ok(Rules {
            allow: net.allow.clone(),
            allow_paths: net.allow_paths.clone(),
            deny: net.deny.clone(),
            allow_cidrs: net.allow_cidrs.clone(),
            upstream,
        })
    }

    /// The `[network]` rules of one policy file (`corral proxy --policy FILE`), validated by the
    /// policy crate's schema (unknown keys, bad patterns and CIDRs are errors with file:line:col).
    /// A file without a `[network]` table allows nothing.
    pub fn from_policy_file(path: &std::path::Path) -> Result<Self, NetError> {
        let (file, text) = corral_policy::config::load_policy(path)?;
        let net = file.network.unwrap_or_default();
        let pattern = |p: &corral_policy::config::Spanned<String>| {
            DomainPattern::parse(p.get_ref()).map_err(|e| {
                let before = &text[..p.span().start.min(text.len())];
                corral_policy::PolicyError::At {
                    file: path.to_path_buf(),
                    line: before.matches('\n').count() + 1,
                    col: before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1,
                    message: e.to_string(),
                }
            })
        };
        let upstream = net
            .upstream_proxy
            .map(|u| parse_upstream(&u.into_inner().0))
            .transpose()?;
        let (mut allow, mut allow_paths) = (Vec::new(), Vec::new());
        for a in &net.allow {
            match AllowEntry::parse(a.get_ref()) {
                Ok(AllowEntry::Host(_)) => allow.push(pattern(a)?),
                Ok(AllowEntry::Path(r)) => allow_paths.push(r),
                Err(e) => return Err(NetError::Config(format!("network.allow: {e}"))),
            }
        }
        Ok(Rules {
            allow,
            allow_paths,
            deny: net.deny.iter().map(pattern).collect::<Result<_, _>>()?,
            allow_cidrs: net
                .allow_cidrs
                .into_iter()
                .map(|c| c.into_inner())
                .collect(),
            upstream,
        })
    }

    /// The name-level decision: the whole host (naming the allow pattern), only the requests
    /// its path rules allow, or the denial. Deny wins; a host that path rules name is decided
    /// per request unless a plain pattern names it exactly (not through `*.`): the plainly
    /// listed host is trusted whole, a wildcard does not undo a narrower path rule.
    pub fn check_name(&self, host: &Host, port: u16, kind: Kind) -> Result<Allowed, Denial> {
        if let Some(p) = self.deny.iter().find(|p| p.matches(host, port)) {
            return Err(Denial {
                rule: format!("network.deny: {p}"),
                fix: format!("remove {p} from network.deny to allow it"),
                status: 403,
            });
        }
        let paths = self.paths_for(host, port, kind);
        if paths.is_empty() {
            return self.check_plain(host, port, kind).map(Allowed::Host);
        }
        if let Some(p) = self
            .allow
            .iter()
            .find(|p| !p.is_wildcard() && p.matches(host, port) && port_ok(p.port(), port, kind))
        {
            return Ok(Allowed::Host(format!("network.allow: {p}")));
        }
        Ok(Allowed::Paths(rule_set(&paths)))
    }

    /// The path rules for `host:port` (a rule without a port names the default port of `kind`).
    pub fn paths_for(&self, host: &Host, port: u16, kind: Kind) -> Vec<&PathRule> {
        self.allow_paths
            .iter()
            .filter(|r| r.names_host(host, port) && port_ok(r.host().port(), port, kind))
            .collect()
    }

    /// The decision of one request to `host:port` (`target` origin-form as received): the
    /// normalised target to forward, the one that was decided on, with the rule that allowed
    /// it; or the denial (`400` for a target that cannot be decided unambiguously, `403` for a
    /// request no rule allows, naming the host's rules and the entry that would allow it).
    pub fn check_request(
        &self,
        (host, port, kind): (&Host, u16, Kind),
        method: &str,
        target: &str,
    ) -> Result<(Normalized, String), Denial> {
        let n = reqpath::normalize(target).map_err(|e| Denial {
            rule: e.to_string(),
            fix: "send the path in plain form (no encoded `/`, `\\`, `;` or `%`, no `..` above the root)".into(),
            status: 400,
        })?;
        let set = match self.check_name(host, port, kind)? {
            Allowed::Host(rule) => return Ok((n, rule)),
            Allowed::Paths(set) => set,
        };
        let paths = self.paths_for(host, port, kind);
        if let Some(r) = paths.iter().find(|r| r.allows(method, &n.segments)) {
            return Ok((n, format!("network.allow: {r}")));
        }
        let authority = match port == kind.default_port() {
            true => host_display(host),
            false => format!("{}:{port}", host_display(host)),
        };
        let path = n.path();
        let entry = format!("{method} {authority}{path}");
        Err(Denial {
            rule: format!("{method} {path} is not in network.allow for {authority} ({set})"),
            fix: format!(
                "allow with: corral run --allow '{entry}', or in the project's corral.toml: corral allow '{entry}'"
            ),
            status: 403,
        })
    }

    /// The plain allow list's decision (deny already checked).
    fn check_plain(&self, host: &Host, port: u16, kind: Kind) -> Result<String, Denial> {
        let shown = host_display(host);
        let mut port_blocked = false;
        for p in &self.allow {
            if !p.matches(host, port) {
                continue;
            }
            match p.port() {
                Some(pp) if pp == port => return Ok(format!("network.allow: {p}")),
                Some(_) => {}
                None if port == kind.default_port() => return Ok(format!("network.allow: {p}")),
                None => port_blocked = true,
            }
        }
        if port_blocked {
            let what = match kind {
                Kind::Connect => "CONNECT is allowed only to port 443",
                Kind::Socks => "SOCKS is allowed only to port 443",
                Kind::Http => "plain HTTP is allowed only to port 80",
            };
            return Err(Denial {
                rule: format!("port {port} not in network.allow"),
                fix: format!(
                    "{what} unless a pattern names the port; allow with: corral run --allow {shown}:{port}"
                ),
                status: 403,
            });
        }
        Err(Denial {
            rule: "not in network.allow".into(),
            fix: if port == kind.default_port() {
                format!("allow with: corral run --allow {shown}")
            } else {
                format!("allow with: corral run --allow {shown}:{port}")
            },
            status: 403,
        })
    }
}

/// Whether a pattern's port (or, without one, the default port of `kind`) is `port`.
fn port_ok(pattern_port: Option<u16>, port: u16, kind: Kind) -> bool {
    pattern_port.map_or(port == kind.default_port(), |p| p == port)
}

/// `path rules: GET github.com/myorg/**, github.com/docs/**`.
fn rule_set(paths: &[&PathRule]) -> String {
    let list: Vec<String> = paths.iter().map(|r| r.to_string()).collect();
    format!("path rules: {}", list.join(", "))
}

/// A boxed future, so that [`Resolver`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Name resolution, done by the proxy only. Production uses the system resolver; tests give a
/// static map so that a name can point at a loopback or namespace origin.
pub trait Resolver: Send + Sync {
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The system resolver (getaddrinfo via tokio).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, port)).await?.collect();
            let mut ips: Vec<IpAddr> = Vec::with_capacity(addrs.len());
            for a in addrs {
                if !ips.contains(&a.ip()) {
                    ips.push(a.ip());
                }
            }
            Ok(ips)
        })
    }
}

/// A fixed name-to-addresses map; unknown names fail to resolve.
#[derive(Debug, Default, Clone)]
pub struct StaticResolver {
    pub map: std::collections::HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with(mut self, name: &str, ips: &[IpAddr]) -> Self {
        self.map.insert(name.to_string(), ips.to_vec());
        self
    }
}

impl Resolver for StaticResolver {
    fn resolve<'a>(&'a self, name: &'a str, _port: u16) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        let r = self.map.get(name).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such host"))
        });
        Box::pin(async move { r })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_policy::domain::normalize_host;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        let mut r = Rules::default();
        for a in allow {
            match AllowEntry::parse(a).unwrap() {
                AllowEntry::Host(p) => r.allow.push(p),
                AllowEntry::Path(p) => r.allow_paths.push(p),
            }
        }
        r.deny = deny
            .iter()
            .map(|d| DomainPattern::parse(d).unwrap())
            .collect();
        r
    }

    fn h(s: &str) -> Host {
        normalize_host(s).unwrap()
    }

    fn name(r: &Rules, host: &str, port: u16, kind: Kind) -> Result<Allowed, String> {
        r.check_name(&h(host), port, kind).map_err(|d| d.rule)
    }

    #[test]
    fn a_host_named_by_path_rules_is_decided_per_request() {
        let r = rules(&["github.com/myorg/**", "example.org"], &[]);
        assert_eq!(
            name(&r, "github.com", 443, Kind::Connect),
            Ok(Allowed::Paths("path rules: github.com/myorg/**".into()))
        );
        // SOCKS and plain HTTP on the default ports: the same.
        assert!(matches!(
            name(&r, "github.com", 443, Kind::Socks),
            Ok(Allowed::Paths(_))
        ));
        assert!(matches!(
            name(&r, "github.com", 80, Kind::Http),
            Ok(Allowed::Paths(_))
        ));
        // Another port is not named by a rule without one.
        assert_eq!(
            name(&r, "github.com", 8443, Kind::Connect),
            Err("not in network.allow".into())
        );
        assert_eq!(
            name(&r, "example.org", 443, Kind::Connect),
            Ok(Allowed::Host("network.allow: example.org".into()))
        );
    }

    #[test]
    fn only_an_exact_plain_entry_opens_a_path_ruled_host_whole() {
        let wild = rules(&["*.github.com", "GET api.github.com/repos/**"], &[]);
        assert!(matches!(
            name(&wild, "api.github.com", 443, Kind::Connect),
            Ok(Allowed::Paths(_))
        ));
        assert!(matches!(
            name(&wild, "raw.github.com", 443, Kind::Connect),
            Ok(Allowed::Host(_))
        ));
        let exact = rules(&["api.github.com", "GET api.github.com/repos/**"], &[]);
        assert_eq!(
            name(&exact, "api.github.com", 443, Kind::Connect),
            Ok(Allowed::Host("network.allow: api.github.com".into()))
        );
        // An exact entry for another port does not open this one.
        let other_port = rules(&["api.github.com:8443", "api.github.com/repos/**"], &[]);
        assert!(matches!(
            name(&other_port, "api.github.com", 443, Kind::Connect),
            Ok(Allowed::Paths(_))
        ));
    }

    #[test]
    fn deny_wins_over_path_rules() {
        let r = rules(&["gist.github.com/myorg/**"], &["*.github.com"]);
        assert_eq!(
            name(&r, "gist.github.com", 443, Kind::Connect),
            Err("network.deny: *.github.com".into())
        );
        let req = r.check_request(
            (&h("gist.github.com"), 443, Kind::Connect),
            "GET",
            "/myorg/x",
        );
        assert_eq!(req.unwrap_err().rule, "network.deny: *.github.com");
    }

    #[test]
    fn each_request_is_decided_on_the_normalised_path_it_forwards() {
        let r = rules(
            &["GET github.com/myorg/**", "POST github.com/myorg/upload"],
            &[],
        );
        let dest = (&h("github.com"), 443, Kind::Connect);
        let (n, rule) = r
            .check_request(dest, "GET", "/myorg/./a//b?q=/../x")
            .unwrap();
        assert_eq!(n.target(), "/myorg/a/b?q=/../x");
        assert_eq!(rule, "network.allow: GET github.com/myorg/**");
        let (n, _) = r.check_request(dest, "POST", "/myorg/upload").unwrap();
        assert_eq!(n.target(), "/myorg/upload");
        let d = r
            .check_request(dest, "POST", "/myorg/a/../other")
            .unwrap_err();
        assert_eq!(d.status, 403);
        assert_eq!(
            d.rule,
            "POST /myorg/other is not in network.allow for github.com (path rules: GET github.com/myorg/**, POST github.com/myorg/upload)"
        );
        assert_eq!(
            d.fix,
            "allow with: corral run --allow 'POST github.com/myorg/other', or in the project's corral.toml: corral allow 'POST github.com/myorg/other'"
        );
        let d = r.check_request(dest, "GET", "/myorg/..%2f..").unwrap_err();
        assert_eq!(d.status, 400);
        let d = r.check_request(dest, "GET", "/myorg/../other").unwrap_err();
        assert!(d.rule.starts_with("GET /other is not"), "{}", d.rule);
        // A port other than the default is named in the suggested entry.
        let r = rules(&["github.com:8443/a/**"], &[]);
        let d = r
            .check_request((&h("github.com"), 8443, Kind::Connect), "GET", "/b")
            .unwrap_err();
        assert!(d.fix.contains("'GET github.com:8443/b'"), "{}", d.fix);
    }

    #[test]
    fn a_host_opened_whole_on_reload_is_still_normalised() {
        let r = rules(&["github.com"], &[]);
        let dest = (&h("github.com"), 443, Kind::Connect);
        let (n, rule) = r.check_request(dest, "GET", "/a/../b").unwrap();
        assert_eq!(
            (n.target().as_str(), rule.as_str()),
            ("/b", "network.allow: github.com")
        );
        let r = rules(&[], &[]);
        assert_eq!(
            r.check_request(dest, "GET", "/b").unwrap_err().rule,
            "not in network.allow"
        );
    }
}
