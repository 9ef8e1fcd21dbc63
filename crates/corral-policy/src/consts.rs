//! What every crate agrees on about corral's proxy, defined once: its port, the URL the jail
//! is given, the default listen address of `corral proxy`, and the one parser of
//! `network.upstream_proxy`.

/// The port corral's proxy listens on: the jail's loopback listener (network mode `proxy`),
/// the proxy container of the podman and Kubernetes backends, and `corral proxy` by default.
pub const PROXY_PORT: u16 = 3128;

/// The proxy URL a jail's variables name in network mode `proxy` (`127.0.0.1:`[`PROXY_PORT`]).
pub const JAIL_PROXY_URL: &str = "http://127.0.0.1:3128";

/// `corral proxy`'s default listen address (`127.0.0.1:`[`PROXY_PORT`]).
pub const PROXY_LISTEN: &str = "127.0.0.1:3128";

/// An upstream proxy to chain through (`network.upstream_proxy = "http://HOST:PORT"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamProxy {
    /// A name or an IP address (an IPv6 one without its brackets).
    pub host: String,
    pub port: u16,
}

impl UpstreamProxy {
    /// Parse `http://HOST:PORT` (a trailing `/` allowed; IPv6 in brackets). The port is
    /// required and not 0; no path, query, fragment, credentials or spaces. The error says why.
    pub fn parse(raw: &str) -> Result<UpstreamProxy, String> {
        let bad = |why: &str| {
            format!(
                "invalid upstream proxy {raw:?}: {why}; expected http://HOST:PORT (e.g. http://proxy.corp:{PROXY_PORT})"
            )
        };
        let rest = raw
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// upstream proxies are supported"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '@', '?', '#']) || rest.contains(char::is_whitespace) {
            return Err(bad("no path, credentials or spaces"));
        }
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("the port is required"))?;
        let host = match host.strip_prefix('[') {
            Some(v6) => v6
                .strip_suffix(']')
                .filter(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
                .ok_or_else(|| bad("invalid IPv6 address"))?,
            // An IPv6 address needs its brackets (`[::1]:3128`), so the port is unambiguous.
            None if host.contains([':', '[', ']']) => return Err(bad("IPv6 needs brackets")),
            None => host,
        };
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let port = match port.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(bad("invalid port")),
        };
        Ok(UpstreamProxy {
            host: host.to_string(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_addresses_name_the_proxy_port() {
        assert_eq!(JAIL_PROXY_URL, format!("http://127.0.0.1:{PROXY_PORT}"));
        assert_eq!(PROXY_LISTEN, format!("127.0.0.1:{PROXY_PORT}"));
    }

    #[test]
    fn upstream_proxy_urls() {
        let ok = |raw: &str, host: &str, port| {
            let want = UpstreamProxy {
                host: host.into(),
                port,
            };
            assert_eq!(UpstreamProxy::parse(raw), Ok(want), "{raw}");
        };
        ok("http://proxy.corp:3128", "proxy.corp", 3128);
        ok("http://proxy.corp:8080/", "proxy.corp", 8080);
        ok("http://10.0.0.1:3128", "10.0.0.1", 3128);
        ok("http://[::1]:3128", "::1", 3128);
        for bad in [
            "proxy.corp:3128",
            "https://proxy.corp:3128",
            "http://proxy.corp",
            "http://proxy.corp:0",
            "http://proxy.corp:99999",
            "http://:3128",
            "http://user:pw@proxy.corp:3128",
            "http://proxy.corp:3128/path",
            "http://proxy.corp:3128?x",
            "http://proxy corp:3128",
            "http://::1:3128",
            "http://[nothost]:3128",
            "http://[::1]",
        ] {
            let e = UpstreamProxy::parse(bad).expect_err(bad);
            assert!(e.contains("expected http://HOST:PORT"), "{e}");
        }
    }
}
