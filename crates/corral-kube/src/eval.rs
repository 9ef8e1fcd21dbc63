//! A NetworkPolicy evaluator with Kubernetes' semantics, for tests: a Pod selected by no policy
//! of a direction is open in that direction; a Pod selected by some is closed but for the union
//! of their rules; a connection between Pods needs the source's egress and the destination's
//! ingress. An `ipBlock` is taken to match Pod addresses too (implementations may), which can
//! only make this evaluator allow more than a cluster does, never less.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A Pod (with labels) or an address outside the cluster (without).
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub name: &'static str,
    pub ip: IpAddr,
    pub pod: Option<PodInfo>,
}

#[derive(Debug, Clone)]
pub struct PodInfo {
    pub namespace: String,
    pub namespace_labels: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    assert!(
        sel.match_expressions.as_ref().is_none_or(|e| e.is_empty()),
        "the evaluator knows matchLabels only"
    );
    sel.match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

fn namespace(p: &NetworkPolicy) -> &str {
    p.metadata.namespace.as_deref().unwrap_or("default")
}

fn peer_matches(peer: &NetworkPolicyPeer, policy_ns: &str, ep: &Endpoint) -> bool {
    if let Some(block) = &peer.ip_block {
        let cidr: IpNet = block.cidr.parse().expect("ipBlock cidr");
        let excepted = block.except.iter().flatten().any(|e| {
            let e: IpNet = e.parse().expect("ipBlock except");
            e.contains(&ep.ip)
        });
        return cidr.contains(&ep.ip) && !excepted;
    }
    let Some(pod) = &ep.pod else {
        return false;
    };
    let ns_ok = match &peer.namespace_selector {
        None => pod.namespace == policy_ns,
        Some(sel) => selects(sel, &pod.namespace_labels),
    };
    let pod_ok = peer
        .pod_selector
        .as_ref()
        .is_none_or(|sel| selects(sel, &pod.labels));
    ns_ok && pod_ok
}

fn port_matches(ports: &Option<Vec<NetworkPolicyPort>>, proto: &str, port: u16) -> bool {
    let Some(ports) = ports.as_ref().filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|p| {
        assert!(
            p.end_port.is_none(),
            "the evaluator knows single ports only"
        );
        p.protocol.as_deref().unwrap_or("TCP") == proto
            && match &p.port {
                None => true,
                Some(IntOrString::Int(n)) => *n == i32::from(port),
                Some(IntOrString::String(_)) => panic!("the evaluator knows numeric ports only"),
            }
    })
}

fn peers_match(peers: &Option<Vec<NetworkPolicyPeer>>, ns: &str, ep: &Endpoint) -> bool {
    match peers.as_ref().filter(|p| !p.is_empty()) {
        None => true,
        Some(peers) => peers.iter().any(|peer| peer_matches(peer, ns, ep)),
    }
}

/// The policies of `kind` (`Ingress`/`Egress`) selecting `pod`.
fn selecting<'a>(
    policies: &'a [NetworkPolicy],
    pod: &'a PodInfo,
    kind: &'a str,
) -> impl Iterator<Item = &'a NetworkPolicy> {
    policies.iter().filter(move |p| {
        let spec = p.spec.as_ref().expect("policy spec");
        let types = spec.policy_types.clone().unwrap_or_else(|| {
            let mut t = vec!["Ingress".to_string()];
            if spec.egress.is_some() {
                t.push("Egress".into());
            }
            t
        });
        namespace(p) == pod.namespace
            && types.iter().any(|t| t == kind)
            && spec
                .pod_selector
                .as_ref()
                .is_none_or(|s| selects(s, &pod.labels))
    })
}

/// Whether `src` may open a `proto` connection to `dst:port`.
pub fn allowed(
    policies: &[NetworkPolicy],
    src: &Endpoint,
    dst: &Endpoint,
    proto: &str,
    port: u16,
) -> bool {
    let egress = match &src.pod {
        None => true,
        Some(pod) => {
            let mut sel = selecting(policies, pod, "Egress").peekable();
            sel.peek().is_none()
                || sel.any(|p| {
                    p.spec.as_ref().unwrap().egress.iter().flatten().any(|r| {
                        peers_match(&r.to, namespace(p), dst) && port_matches(&r.ports, proto, port)
                    })
                })
        }
    };
    let ingress = match &dst.pod {
        None => true,
        Some(pod) => {
            let mut sel = selecting(policies, pod, "Ingress").peekable();
            sel.peek().is_none()
                || sel.any(|p| {
                    p.spec.as_ref().unwrap().ingress.iter().flatten().any(|r| {
                        peers_match(&r.from, namespace(p), src)
                            && port_matches(&r.ports, proto, port)
                    })
                })
        }
    };
    egress && ingress
}
