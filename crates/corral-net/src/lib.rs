//! corral's egress proxy, the jail's network bridge, and the network audit.
//!
//! - [`http`]: the strict HTTP/1.1 head parser and framing rules (fuzzed): the `corral-http1`
//!   crate, shared with the credential gateway.
//! - [`rules`]: the rules a proxy decides with, built from a `NetworkPlan`; the resolver seam.
//! - [`proxy`]: the proxy itself (plain HTTP, CONNECT, SOCKS5 on one listener).
//! - [`forward`]: `host_ports` (a listener bridged to one host loopback port).
//! - [`run`]: running a proxy on a background thread for the native jail.
//! - [`standalone`]: the proxy as a process of its own (`corral proxy`, `corral-proxy`).
//! - [`netcap`]: `--publish` (the host's loopback port to the jail's) through sockets made in
//!   the jail's network namespace.

pub mod ask;
pub mod bounds;
pub mod forward;
pub mod netcap;
mod open;
pub mod proxy;
pub mod rules;
pub mod run;
pub mod standalone;

pub use corral_http1 as http;
pub use forward::forward_port;
pub use proxy::{Blocked, Proxy, ProxyConfig};
pub use rules::{Denial, Kind, Resolver, Rules, StaticResolver, SystemResolver, Upstream};
pub use run::{Listener, ProxyHandle, runtime, spawn};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Policy(#[from] corral_policy::PolicyError),
    #[error("network policy: {0}")]
    Config(String),
    #[error("cannot load the network rules of {}", path.display())]
    Rules {
        path: std::path::PathBuf,
        #[source]
        source: Box<NetError>,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}
