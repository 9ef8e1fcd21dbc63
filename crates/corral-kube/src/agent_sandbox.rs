//! The sandbox as a kubernetes-sigs/agent-sandbox `SandboxTemplate`
//! (`extensions.agents.x-k8s.io/v1beta1`): the same Pod spec as a pod template, for clusters
//! where the agent-sandbox controller makes the Pods (from `SandboxClaim`s or a warm pool).
//!
//! `k8s-openapi` has no type for a custom resource: these structs carry the fields corral sets,
//! named as in the project's CRD (`spec.podTemplate.{metadata,spec}`,
//! `spec.networkPolicyManagement`), and embed `k8s-openapi`'s `PodSpec` and `ObjectMeta`.

use std::collections::BTreeMap;

use corral_policy::plan::Plan;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::sandbox::{annotations, pod_spec};
use crate::{Options, Result, labels, meta};

pub const API_VERSION: &str = "extensions.agents.x-k8s.io/v1beta1";

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplate {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: SandboxTemplateSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    pub pod_template: PodTemplate,
    /// `Unmanaged`: the controller creates no NetworkPolicy of its own. Its default ("Managed"
    /// without rules) lets the sandbox reach the public internet directly, and NetworkPolicies
    /// are a union: it would open what corral's policy closes.
    pub network_policy_management: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodTemplate {
    pub metadata: PodMetadata,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodMetadata {
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The template: the sandbox Pod's labels (which corral's NetworkPolicies select) and spec.
pub fn template(plan: &Plan, opts: &Options) -> Result<SandboxTemplate> {
    Ok(SandboxTemplate {
        api_version: API_VERSION,
        kind: "SandboxTemplate",
        metadata: meta(opts, opts.name.clone(), "sandbox"),
        spec: SandboxTemplateSpec {
            pod_template: PodTemplate {
                metadata: PodMetadata {
                    labels: labels(opts, "sandbox"),
                    annotations: annotations(plan, opts),
                },
                spec: pod_spec(plan, opts)?,
            },
            network_policy_management: "Unmanaged",
        },
    })
}
