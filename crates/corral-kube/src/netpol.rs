//! The NetworkPolicies: the sandbox reaches only the proxy's port; only the sandbox reaches the
//! proxy; the proxy reaches kube-dns and public addresses (the classifier's ranges as
//! `ipBlock` excepts), plus the policy's `allow_cidrs`.

use std::collections::BTreeMap;

use corral_policy::addr::public_prefixes;
use corral_policy::plan::Plan;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::executor::EXECUTOR_PORT;
use crate::{Options, PROXY_PORT, meta, selector};

fn pods(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    }
}

fn port(protocol: &str, port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(port.into())),
        ..Default::default()
    }
}

fn both_types() -> Option<Vec<String>> {
    Some(vec!["Ingress".into(), "Egress".into()])
}

/// Which of corral's Pods a jail has: the proxy (network mode proxy), the executor (`None`:
/// not rendered; `Some(proxied)`: rendered, reaching the proxy or nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub proxied: bool,
    pub executor: Option<bool>,
}

fn to_role(opts: &Options, role: &str, p: u16) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(pods(selector(opts, role))),
            ..Default::default()
        }]),
        ports: Some(vec![port("TCP", p)]),
    }
}

fn from_roles(opts: &Options, roles: &[&str], p: u16) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(
            roles
                .iter()
                .map(|role| NetworkPolicyPeer {
                    pod_selector: Some(pods(selector(opts, role))),
                    ..Default::default()
                })
                .collect(),
        ),
        ports: Some(vec![port("TCP", p)]),
    }
}

/// The sandbox: no ingress at all; egress only to the proxy Pods' port (when there is a proxy)
/// and the executor's (when it is rendered), nothing else: no DNS, no other Pod, no address.
pub fn sandbox_policy(opts: &Options, fence: Fence) -> NetworkPolicy {
    let mut egress = Vec::new();
    if fence.proxied {
        egress.push(to_role(opts, "proxy", PROXY_PORT));
    }
    if fence.executor.is_some() {
        egress.push(to_role(opts, "executor", EXECUTOR_PORT));
    }
    NetworkPolicy {
        metadata: meta(opts, format!("{}-sandbox", opts.name), "sandbox"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pods(selector(opts, "sandbox"))),
            policy_types: both_types(),
            ingress: Some(Vec::new()),
            egress: Some(egress),
        }),
    }
}

/// The cluster's DNS servers (kube-dns / CoreDNS in kube-system), which the proxy needs to
/// resolve destinations.
pub fn dns_peer() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(pods(BTreeMap::from([(
            "kubernetes.io/metadata.name".into(),
            "kube-system".into(),
        )]))),
        pod_selector: Some(pods(BTreeMap::from([(
            "k8s-app".into(),
            "kube-dns".into(),
        )]))),
        ..Default::default()
    }
}

/// The proxy: ingress only from this jail's sandbox on the proxy's port; egress to the
/// cluster's DNS, to public addresses (IPv4 and IPv6) on any port, and to the plan's
/// `allow_cidrs`. Private ranges, metadata addresses and the cluster's own (private) Pod and
/// Service ranges are excepted.
pub fn proxy_policy(plan: &Plan, opts: &Options, fence: Fence) -> NetworkPolicy {
    let clients: &[&str] = match fence.executor {
        Some(true) => &["sandbox", "executor"],
        Some(false) | None => &["sandbox"],
    };
    let prefixes = public_prefixes();
    let mut peers: Vec<NetworkPolicyPeer> = prefixes
        .within
        .iter()
        .map(|within| NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: within.to_string(),
                except: Some(
                    prefixes
                        .except
                        .iter()
                        .filter(|e| within.contains(*e))
                        .map(|e| e.to_string())
                        .collect(),
                ),
            }),
            ..Default::default()
        })
        .collect();
    // allow_cidrs: their own peers, so no except of the public block takes them away (peers
    // of a rule are a union).
    peers.extend(plan.network.allow_cidrs.iter().map(|c| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: c.trunc().to_string(),
            except: None,
        }),
        ..Default::default()
    }));
    NetworkPolicy {
        metadata: meta(opts, format!("{}-proxy", opts.name), "proxy"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pods(selector(opts, "proxy"))),
            policy_types: both_types(),
            ingress: Some(vec![from_roles(opts, clients, PROXY_PORT)]),
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![dns_peer()]),
                    ports: Some(vec![port("UDP", 53), port("TCP", 53)]),
                },
                NetworkPolicyEgressRule {
                    to: Some(peers),
                    ports: None,
                },
            ]),
        }),
    }
}

/// The executor: ingress only from this jail's sandbox on the executor's port; egress only to
/// the proxy's port when its network is the proxy, else none.
pub fn executor_policy(opts: &Options, fence: Fence) -> NetworkPolicy {
    let egress = match fence.executor {
        Some(true) => vec![to_role(opts, "proxy", PROXY_PORT)],
        Some(false) | None => Vec::new(),
    };
    NetworkPolicy {
        metadata: meta(opts, format!("{}-executor", opts.name), "executor"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pods(selector(opts, "executor"))),
            policy_types: both_types(),
            ingress: Some(vec![from_roles(opts, &["sandbox"], EXECUTOR_PORT)]),
            egress: Some(egress),
        }),
    }
}
