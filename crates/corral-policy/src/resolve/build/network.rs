//! The jail's network: its mode and rules, and the settings that cannot work together.

use crate::error::PolicyError;
use crate::plan::{Dns, NetworkMode, NetworkPlan};

use super::super::layer::{DEFAULT_EXEC_NETWORK, DEFAULT_NETWORK, Layer, NetLayer};
use super::{Side, dedup};

/// The network of one jail: the agent's `[network]`, the executor's
/// `[executor.sandbox.network]`.
pub(super) fn network(m: &Layer, side: Side) -> Result<NetworkPlan, PolicyError> {
    match side {
        Side::Agent => {
            let plan = network_plan(&m.net, DEFAULT_NETWORK);
            check_dns(&m.net, &plan, "network")?;
            check_own_ports(&m.net, &plan, "network")?;
            Ok(plan)
        }
        Side::Executor => {
            if let Some((Dns::Stub, at)) = &m.exec_net.dns {
                return Err(at.error(
                    "executor.sandbox.network.dns = \"stub\" is not supported for the executor's \
                     jail; remove it (the executor's commands use the proxy variables)"
                        .into(),
                ));
            }
            Ok(network_plan(&m.exec_net, DEFAULT_EXEC_NETWORK))
        }
    }
}
/// `dns = "stub"` answers for the proxy's rules and hands its connections to the proxy: it needs
/// network mode `proxy`.
fn check_dns(n: &NetLayer, plan: &NetworkPlan, key: &str) -> Result<(), PolicyError> {
    let mode = match plan.mode {
        NetworkMode::None => "none",
        NetworkMode::Host => "host",
        NetworkMode::Proxy => return Ok(()),
    };
    match &n.dns {
        Some((Dns::Stub, at)) => Err(at.error(format!(
            "{key}.dns = \"stub\" needs {key}.mode = \"proxy\" (the stub answers only names the \
             proxy allows, and the proxy takes their connections); the mode here is \"{mode}\""
        ))),
        _ => Ok(()),
    }
}

/// The jail's loopback port of the stub resolver (`dns = "stub"`).
const JAIL_DNS_PORT: u16 = 53;

/// `publish` and `host_ports` may not take the jail's loopback ports corral itself listens on:
/// 3128 (the proxy) in mode `proxy`, 53 with `dns = "stub"`. Published, they would hand the
/// host's 127.0.0.1:PORT to corral's own listener; as `host_ports`, they would take it from
/// the jail.
fn check_own_ports(n: &NetLayer, plan: &NetworkPlan, key: &str) -> Result<(), PolicyError> {
    if plan.mode != NetworkMode::Proxy {
        return Ok(());
    }
    let own = |p: u16| match p {
        crate::consts::PROXY_PORT => Some("corral's proxy"),
        JAIL_DNS_PORT if plan.dns == Dns::Stub => Some("the stub resolver"),
        _ => None,
    };
    let entries = n
        .publish
        .iter()
        .map(|e| ("publish", e))
        .chain(n.host_ports.iter().map(|e| ("host_ports", e)));
    for (field, (port, at)) in entries {
        if let Some(what) = own(*port) {
            return Err(at.error(format!(
                "{key}.{field} {port}: the jail's 127.0.0.1:{port} is {what} (corral's own \
                 port in network mode \"proxy\"); use another port"
            )));
        }
    }
    Ok(())
}

fn network_plan(n: &NetLayer, default_mode: NetworkMode) -> NetworkPlan {
    NetworkPlan {
        mode: n.mode.as_ref().map(|(m, _)| *m).unwrap_or(default_mode),
        allow: dedup(n.allow.iter().map(|(a, _)| a.clone())),
        allow_paths: dedup(n.allow_paths.iter().map(|(a, _)| a.clone())),
        deny: dedup(n.deny.iter().cloned()),
        allow_cidrs: dedup(n.allow_cidrs.iter().map(|(c, _)| *c)),
        host_ports: dedup(n.host_ports.iter().map(|(p, _)| *p)),
        publish: dedup(n.publish.iter().map(|(p, _)| *p)),
        upstream_proxy: n.upstream_proxy.as_ref().map(|(u, _)| u.clone()),
        dns: n.dns.as_ref().map(|(d, _)| *d).unwrap_or_default(),
        on_deny: match n.on_deny.as_ref().map(|(d, _)| *d) {
            Some(crate::config::OnDenyMode::Ask) => crate::plan::OnDeny::Ask {
                timeout: n
                    .ask_timeout
                    .as_ref()
                    .map_or(crate::config::DEFAULT_ASK_TIMEOUT, |(t, _)| *t),
            },
            Some(crate::config::OnDenyMode::Refuse) | None => crate::plan::OnDeny::Refuse,
        },
    }
}
