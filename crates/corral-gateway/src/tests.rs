//! Tests that need the CA's private parts: the key is in no file, and the name constraints hold
//! for leaves the CA itself signs for other names.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

fn secret(name: &str, hosts: &[&str]) -> SecretPlan {
    SecretPlan {
        name: name.into(),
        from_env: format!("HOST_{name}"),
        hosts: hosts
            .iter()
            .map(|h| DomainPattern::parse(h).unwrap())
            .collect(),
    }
}

fn gateway(dir: &Path) -> (Gateway, JailTrust) {
    Gateway::new(
        vec![(
            secret("API_KEY", &["api.bound.test", "*.wild.test"]),
            "sk-ant-api03-realrealrealrealrealreal".into(),
        )],
        GatewayConfig {
            upstream_roots: Some(RootCertStore::empty()),
            trust_dir: dir.join("trust"),
            system_bundle: None,
            audit: None,
        },
    )
    .unwrap()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn ca_key_is_in_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (gw, trust) = gateway(tmp.path());
    let key = gw.inner.ca.key_der_for_test();
    let key_b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    // Any 48-character run of the PEM body would betray the key.
    let probe = &key_b64[16..64];
    let mut files = Vec::new();
    walk(tmp.path(), &mut files);
    assert!(files.len() >= 2, "{files:?}");
    for f in &files {
        let data = std::fs::read(f).unwrap();
        assert!(
            !contains(&data, &key),
            "CA key (DER) found in {}",
            f.display()
        );
        assert!(
            !contains(&data, probe.as_bytes()),
            "CA key (PEM) found in {}",
            f.display()
        );
        assert!(
            !contains(&data, b"PRIVATE KEY"),
            "a private key in {}",
            f.display()
        );
    }
    assert!(!trust.ca_pem.contains("PRIVATE"));
    for v in trust.env.values() {
        assert!(!v.contains(probe));
    }
    // The bundle is the system roots plus the run CA.
    let bundle = std::fs::read_to_string(&trust.bundle_file).unwrap();
    assert!(bundle.ends_with(&trust.ca_pem));
    assert_eq!(
        std::fs::read_to_string(&trust.ca_file).unwrap(),
        trust.ca_pem
    );
}

fn verifier(bundle: &Path) -> Arc<rustls::client::WebPkiServerVerifier> {
    let pem = std::fs::read_to_string(bundle).unwrap();
    let mut roots = RootCertStore::empty();
    for block in pem.split("-----END CERTIFICATE-----") {
        let Some(start) = block.find("-----BEGIN CERTIFICATE-----") else {
            continue;
        };
        let b64: String = block[start + 27..]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let _ = roots.add(CertificateDer::from(der));
    }
    rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap()
}

fn verify(v: &rustls::client::WebPkiServerVerifier, leaf: &CertificateDer<'_>, name: &str) -> bool {
    v.verify_server_cert(
        leaf,
        &[],
        &ServerName::try_from(name.to_string()).unwrap(),
        &[],
        UnixTime::now(),
    )
    .is_ok()
}

#[test]
fn ca_cannot_sign_for_other_hosts() {
    let tmp = tempfile::tempdir().unwrap();
    let (gw, trust) = gateway(tmp.path());
    let v = verifier(&trust.bundle_file);
    let ca = &gw.inner.ca;
    // Bound names verify.
    let good = ca.issue_unchecked_for_test("api.bound.test").unwrap();
    assert!(verify(&v, &good, "api.bound.test"));
    let sub = ca.issue_unchecked_for_test("eu.wild.test").unwrap();
    assert!(verify(&v, &sub, "eu.wild.test"));
    // The CA itself signing for other names: webpki rejects them (name constraints).
    for other in [
        "evil.example.com",
        "bound.test",
        "api.bound.test.evil.com",
        "xwild.test",
    ] {
        let leaf = ca.issue_unchecked_for_test(other).unwrap();
        assert!(!verify(&v, &leaf, other), "leaf for {other} verified");
    }
    // And the gateway refuses to issue them at all.
    assert!(ca.server_config("evil.example.com").is_err());
    assert!(ca.server_config("api.bound.test").is_ok());

    // OpenSSL (what curl, python, git use in the jail) enforces the same constraints.
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        eprintln!("skipping the openssl half: no openssl binary");
        return;
    }
    let pem = |der: &CertificateDer<'_>| {
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            base64::engine::general_purpose::STANDARD.encode(der.as_ref())
        )
    };
    let check = |leaf: &CertificateDer<'_>, name: &str| {
        let f = tmp.path().join(format!("leaf-{name}.pem"));
        std::fs::write(&f, pem(leaf)).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(&trust.ca_file)
            .args(["-verify_hostname", name])
            .arg(&f)
            .output()
            .unwrap();
        out.status.success()
    };
    assert!(check(&good, "api.bound.test"));
    let evil = ca.issue_unchecked_for_test("evil.example.com").unwrap();
    assert!(
        !check(&evil, "evil.example.com"),
        "openssl accepted a leaf outside the constraints"
    );
    let text = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&trust.ca_file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("CA:TRUE, pathlen:0"), "{text}");
}

#[test]
fn ip_literals_and_unbound_names_are_never_intercepted() {
    let tmp = tempfile::tempdir().unwrap();
    let (gw, _) = gateway(tmp.path());
    assert!(gw.binds(&Host::Name("api.bound.test".into()), 443));
    assert!(gw.binds(&Host::Name("x.wild.test".into()), 443));
    assert!(!gw.binds(&Host::Name("wild.test".into()), 443));
    assert!(!gw.binds(&Host::Name("other.test".into()), 443));
    assert!(!gw.binds(&Host::Ip("127.0.0.1".parse().unwrap()), 443));
}

#[test]
fn secrets_that_cannot_work_are_refused_with_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = GatewayConfig {
        upstream_roots: Some(RootCertStore::empty()),
        trust_dir: tmp.path().join("t"),
        system_bundle: None,
        audit: None,
    };
    let err = Gateway::new(vec![(secret("K", &["a.test"]), String::new())], cfg.clone())
        .unwrap_err()
        .to_string();
    assert!(err.contains("$HOST_K is empty"), "{err}");
    let err = Gateway::new(
        vec![(secret("K", &["127.0.0.1"]), "v".repeat(30))],
        cfg.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("IP address"), "{err}");
    let err = Gateway::new(vec![(secret("K", &["a.test"]), "a b\r\n".into())], cfg)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot go into an HTTP header"), "{err}");
}

#[test]
fn debug_output_redacts_values() {
    let tmp = tempfile::tempdir().unwrap();
    let (gw, _) = gateway(tmp.path());
    let dbg = format!("{gw:?}");
    assert!(!dbg.contains("realreal"), "{dbg}");
    assert!(!dbg.contains(gw.placeholder("API_KEY").unwrap()), "{dbg}");
}

fn config(dir: &Path) -> GatewayConfig {
    GatewayConfig {
        upstream_roots: Some(RootCertStore::empty()),
        trust_dir: dir.join("trust"),
        system_bundle: None,
        audit: None,
    }
}

/// A CA made before the gateway (`corral kube render`) is the one the gateway serves: the
/// jail's files hold exactly its certificate, leaves verify under it, the name constraints
/// still hold, and the given placeholder is the one swapped.
#[test]
fn a_ca_made_before_is_served_with_the_given_placeholder() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = secret("API_KEY", &["api.bound.test", "*.wild.test"]);
    let ca = new_ca(std::slice::from_ref(&plan)).unwrap();
    assert!(ca.key.contains("PRIVATE KEY") && !ca.cert.contains("PRIVATE"));
    assert!(
        !format!("{ca:?}").contains("PRIVATE KEY"),
        "Debug shows the key"
    );
    let real = "sk-ant-api03-realrealrealrealrealreal";
    let ph = placeholder_for(real).unwrap();
    let placeholders = BTreeMap::from([("API_KEY".to_string(), ph.clone())]);
    let (gw, trust) = Gateway::with_ca(
        vec![(plan, real.into())],
        &placeholders,
        &ca,
        config(tmp.path()),
    )
    .unwrap();
    assert_eq!(trust.ca_pem, ca.cert);
    assert_eq!(std::fs::read_to_string(&trust.ca_file).unwrap(), ca.cert);
    assert_eq!(gw.placeholder("API_KEY"), Some(ph.as_str()));
    assert_eq!(trust.env.get("API_KEY"), Some(&ph));
    let v = verifier(&trust.ca_file);
    let cfg_leaf = gw
        .inner
        .ca
        .issue_unchecked_for_test("api.bound.test")
        .unwrap();
    assert!(verify(&v, &cfg_leaf, "api.bound.test"));
    let evil = gw
        .inner
        .ca
        .issue_unchecked_for_test("evil.example.com")
        .unwrap();
    assert!(!verify(&v, &evil, "evil.example.com"), "constraints lost");
    assert!(gw.inner.ca.server_config("evil.example.com").is_err());
}

/// A CA that is not the pair made for these secrets is refused, saying why.
#[test]
fn a_given_ca_must_match_its_key_and_cover_the_hosts() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = secret("API_KEY", &["api.bound.test"]);
    let real = "sk-ant-api03-realrealrealrealrealreal";
    let try_ca = |ca: &CaPem, plan: &SecretPlan| {
        Gateway::with_ca(
            vec![(plan.clone(), real.into())],
            &BTreeMap::new(),
            ca,
            config(tmp.path()),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let a = new_ca(std::slice::from_ref(&plan)).unwrap();
    let b = new_ca(std::slice::from_ref(&plan)).unwrap();
    // A's certificate with B's key: same names, another key.
    let swapped = CaPem {
        cert: a.cert.clone(),
        key: b.key.clone(),
    };
    let e = try_ca(&swapped, &plan);
    assert!(e.contains("does not belong to its certificate"), "{e}");
    // A CA made for other hosts does not cover this secret's.
    let other = new_ca(&[secret("API_KEY", &["other.test"])]).unwrap();
    let e = try_ca(&other, &plan);
    assert!(e.contains("does not cover api.bound.test"), "{e}");
    // Not PEM at all.
    let junk = CaPem {
        cert: "junk".into(),
        key: a.key.clone(),
    };
    let e = try_ca(&junk, &plan);
    assert!(e.contains("certificate cannot be read"), "{e}");
    // A placeholder equal to the real value is refused.
    let e = Gateway::with_ca(
        vec![(plan.clone(), real.into())],
        &BTreeMap::from([("API_KEY".to_string(), real.to_string())]),
        &a,
        config(tmp.path()),
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(e.contains("the real value itself"), "{e}");
    // And the matching pair works.
    Gateway::with_ca(
        vec![(plan.clone(), real.into())],
        &BTreeMap::new(),
        &a,
        config(tmp.path()),
    )
    .unwrap();
}
