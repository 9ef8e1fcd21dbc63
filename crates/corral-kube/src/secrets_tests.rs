//! `[secrets]` in the manifests: the whole YAML, and where the real value and the CA key are
//! (the proxy's Secret, nowhere else).

use std::collections::BTreeMap;
use std::path::PathBuf;

use corral_gateway::CaPem;
use corral_net::standalone::{SecretValue, SecretsFile};
use corral_policy::domain::DomainPattern;
use corral_policy::plan::{NetworkMode, Plan, SecretPlan};

use super::*;
use crate::tests::{opts, plan};

const REAL: &str = "sk-ant-api03-REALREALREALREALREALREAL0123";
const PLACEHOLDER: &str = "sk-ant-api03-PLACEHOLDERPLACEHOLDER0000";
const CA_CERT: &str = "-----BEGIN CERTIFICATE-----\nRUNCACERT\n-----END CERTIFICATE-----\n";
const CA_KEY: &str = "-----BEGIN PRIVATE KEY-----\nRUNCAKEY\n-----END PRIVATE KEY-----\n";

fn secret_plan() -> SecretPlan {
    SecretPlan {
        name: "ANTHROPIC_API_KEY".into(),
        from_env: "CALLER_KEY".into(),
        hosts: vec![DomainPattern::parse("api.anthropic.com").unwrap()],
    }
}

fn plan_with_secret() -> Plan {
    let mut p = plan();
    p.secrets = vec![secret_plan()];
    p
}

fn run() -> RunSecrets {
    RunSecrets {
        ca: CaPem {
            cert: CA_CERT.into(),
            key: CA_KEY.into(),
        },
        values: SecretsFile {
            secrets: vec![SecretValue {
                plan: secret_plan(),
                value: REAL.into(),
            }],
            signins: Vec::new(),
        },
        placeholders: BTreeMap::from([("ANTHROPIC_API_KEY".into(), PLACEHOLDER.into())]),
        system_bundle: "SYSTEM-ROOTS\n".into(),
        system_paths: vec![PathBuf::from("/etc/ssl/certs/ca-certificates.crt")],
    }
}

fn is_proxy_secret(o: &Object) -> bool {
    matches!(o, Object::Secret(s) if s.metadata.name.as_deref() == Some("corral-demo-proxy-secrets"))
}

#[test]
fn renders_the_whole_jail_with_secrets() {
    let objects = render_with_secrets(&plan_with_secret(), &opts(), Some(&run())).unwrap();
    let yaml = to_yaml(&objects).unwrap();
    if std::env::var_os("CORRAL_BLESS").is_some() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/src/tests/jail-secrets.yaml"),
            &yaml,
        )
        .unwrap();
    }
    similar_asserts::assert_eq!(yaml, include_str!("tests/jail-secrets.yaml"));
}

/// Every object but the proxy's Secret is free of the real value and of the CA key; the
/// Secret holds both; the sandbox holds the placeholder and the CA certificate.
#[test]
fn real_value_and_ca_key_only_in_the_proxy_secret() {
    for target in [Target::Pod, Target::SandboxTemplate] {
        let mut o = opts();
        o.target = target;
        let objects = render_with_secrets(&plan_with_secret(), &o, Some(&run())).unwrap();
        let (secret, rest): (Vec<&Object>, Vec<&Object>) =
            objects.iter().partition(|o| is_proxy_secret(o));
        assert_eq!(secret.len(), 1);
        let rest: Vec<Object> = rest.into_iter().cloned().collect();
        let others = to_yaml(&rest).unwrap();
        for leak in [REAL, "REALREAL", "RUNCAKEY", "PRIVATE KEY"] {
            assert!(!others.contains(leak), "{leak} outside the proxy's Secret");
        }
        assert!(others.contains(PLACEHOLDER) && others.contains("RUNCACERT"));
        let secret = to_yaml(&[secret[0].clone()]).unwrap();
        assert!(
            secret.contains(REAL) && secret.contains("RUNCAKEY"),
            "{secret}"
        );
    }
}

/// Only the proxy's Pod mounts the Secret; the sandbox mounts the CA ConfigMap.
#[test]
fn only_the_proxy_mounts_the_secret() {
    let objects = render_with_secrets(&plan_with_secret(), &opts(), Some(&run())).unwrap();
    let secret_volumes = |spec: &k8s_openapi::api::core::v1::PodSpec| -> Vec<String> {
        spec.volumes
            .iter()
            .flatten()
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect()
    };
    for o in &objects {
        match o {
            Object::Deployment(d) => {
                let spec = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
                assert_eq!(secret_volumes(spec), ["corral-demo-proxy-secrets"]);
            }
            Object::Pod(p) => {
                let spec = p.spec.as_ref().unwrap();
                assert!(secret_volumes(spec).is_empty(), "{:?}", spec.volumes);
            }
            _ => {}
        }
    }
}

/// Without network the sandbox gets the placeholder only: no CA, no Secret, no real value.
#[test]
fn no_network_gets_placeholders_only() {
    let mut p = plan_with_secret();
    p.network.mode = NetworkMode::None;
    let objects = render_with_secrets(&p, &opts(), Some(&run())).unwrap();
    let yaml = to_yaml(&objects).unwrap();
    assert!(yaml.contains(PLACEHOLDER));
    for absent in [
        REAL,
        "RUNCAKEY",
        "RUNCACERT",
        "SSL_CERT_FILE",
        "kind: Secret",
    ] {
        assert!(!yaml.contains(absent), "{absent}:\n{yaml}");
    }
}

/// A plan with secrets and nothing given, or given for other secrets, is refused.
#[test]
fn secrets_not_given_or_not_matching_are_refused() {
    let e = render(&plan_with_secret(), &opts())
        .unwrap_err()
        .to_string();
    assert!(e.contains("were not given"), "{e}");
    let mut r = run();
    r.placeholders = BTreeMap::from([("OTHER".into(), PLACEHOLDER.into())]);
    let e = render_with_secrets(&plan_with_secret(), &opts(), Some(&r))
        .unwrap_err()
        .to_string();
    assert!(e.contains("differ"), "{e}");
    // Values given for a plan without secrets are refused too (they would be written for
    // nothing).
    let e = render_with_secrets(&plan(), &opts(), Some(&run()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("differ"), "{e}");
}
