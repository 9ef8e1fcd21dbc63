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

/// The sandbox: no ingress at all; egress only to the proxy Pods' port (when there is a proxy),
/// nothing else: no DNS, no other Pod, no address.
pub fn sandbox_policy(opts: &Options, proxied: bool) -> NetworkPolicy {
    let egress = if proxied {
        vec![NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(pods(selector(opts, "proxy"))),
                ..Default::default()
            }]),
            ports: Some(vec![port("TCP", PROXY_PORT)]),
        }]
    } else {
        Vec::new()
    };
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
pub fn proxy_policy(plan: &Plan, opts: &Options) -> NetworkPolicy {
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
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(pods(selector(opts, "sandbox"))),
                    ..Default::default()
                }]),
                ports: Some(vec![port("TCP", PROXY_PORT)]),
            }]),
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
