//! The per-run certificate authority: generated in memory, never serialised to disk, except
//! when a backend must give the jail the CA before the gateway runs (`corral kube render`: the
//! sandbox's ConfigMap holds the certificate, the proxy's Secret the key): then [`new_ca_pem`]
//! makes it and [`RunCa::load`] takes it back, checking it is such a CA and that key and
//! certificate belong together.
//!
//! - ECDSA P-256 key made by `ring`, held only in this process's memory;
//! - basic constraints CA with path length 0 (it can sign leaves, never another CA);
//! - name constraints: permitted DNS subtrees are exactly the secret-bound host names and the hosts
//!   decided by path rules (a
//!   `*.example.org` pattern permits `example.org`'s subtree), every IPv4 and IPv6 address is
//!   excluded; a leaf for any other name fails verification in webpki, OpenSSL, Node, Go;
//! - valid from 5 minutes ago for [`CA_VALIDITY`]; leaves for [`LEAF_VALIDITY`], one DNS SAN each,
//!   re-issued when close to expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::ServerConfig;
use time::{Duration, OffsetDateTime};

use crate::GatewayError;

/// How long the run CA is valid. A run longer than this needs a restart.
pub const CA_VALIDITY: Duration = Duration::days(7);
/// How long a leaf is valid; leaves are re-issued an hour before they expire.
pub const LEAF_VALIDITY: Duration = Duration::hours(24);
const BACKDATE: Duration = Duration::minutes(5);

/// A run CA made before its gateway runs, for a backend whose jail must trust it first
/// (`corral kube render`): the certificate and the key, PEM. The key is as secret as the real
/// values (it lets its holder read the jail's TLS to the bound hosts): `Debug` redacts it.
#[derive(Clone, PartialEq, Eq)]
pub struct CaPem {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for CaPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaPem")
            .field("cert", &self.cert)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A fresh run CA for the names `permitted` (see [`crate::ca_names`]), as PEM: what
/// [`crate::Gateway::with_ca`] takes back.
pub(crate) fn new_ca_pem(
    permitted: Vec<String>,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<CaPem, GatewayError> {
    Ok(RunCa::generate(permitted, provider)?.to_pem())
}

/// The parameters of a run CA for `permitted` DNS subtrees, valid from now on.
fn ca_params(permitted: &[String]) -> Result<CertificateParams, GatewayError> {
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "corral credential gateway (per-run CA)");
    dn.push(DnType::OrganizationName, "corral");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: permitted
            .iter()
            .map(|h| GeneralSubtree::DnsName(h.clone()))
            .collect(),
        excluded_subtrees: ip_exclusions(),
    });
    params.not_before = now - BACKDATE;
    params.not_after = now + CA_VALIDITY;
    params.serial_number = Some(serial()?);
    Ok(params)
}

/// Every IPv4 and every IPv6 address, excluded from the CA's names.
fn ip_exclusions() -> Vec<GeneralSubtree> {
    vec![
        GeneralSubtree::IpAddress(rcgen::CidrSubnet::V4([0; 4], [0; 4])),
        GeneralSubtree::IpAddress(rcgen::CidrSubnet::V6([0; 16], [0; 16])),
    ]
}

pub(crate) struct RunCa {
    /// The issuer of the leaves: the CA's parameters signed by its key.
    cert: rcgen::Certificate,
    /// The certificate the jail trusts, PEM (a loaded CA's own text: re-signing it would give
    /// other bytes, with the same name and key).
    pem: String,
    key: KeyPair,
    /// The DNS subtrees the CA is constrained to.
    permitted: Vec<String>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    leaves: Mutex<HashMap<String, (OffsetDateTime, Arc<ServerConfig>)>>,
}

fn serial() -> Result<SerialNumber, GatewayError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| GatewayError::Random(e.to_string()))?;
    b[0] &= 0x7f; // positive
    Ok(SerialNumber::from_slice(&b))
}

fn ca_err(e: rcgen::Error) -> GatewayError {
    GatewayError::Ca(e.to_string())
}

impl RunCa {
    /// A fresh CA constrained to `permitted` DNS subtrees (non-empty, lower-case names).
    pub(crate) fn generate(
        permitted: Vec<String>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Self, GatewayError> {
        if permitted.is_empty() {
            return Err(GatewayError::Ca(
                "no host names to constrain the run CA to".into(),
            ));
        }
        let key = KeyPair::generate().map_err(ca_err)?;
        let cert = ca_params(&permitted)?.self_signed(&key).map_err(ca_err)?;
        Ok(Self {
            pem: cert.pem(),
            cert,
            key,
            permitted,
            provider,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA of `ca` (made by [`new_ca_pem`]), serving `permitted` names: refused unless it
    /// is a CA of path length 0, name-constrained as [`RunCa::generate`] makes them to subtrees
    /// covering every name in `permitted`, not expired, and its key signs leaves its
    /// certificate verifies.
    pub(crate) fn load(
        ca: &CaPem,
        permitted: Vec<String>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Self, GatewayError> {
        let bad = |why: String| GatewayError::Ca(format!("the given run CA {why}"));
        if permitted.is_empty() {
            return Err(GatewayError::Ca(
                "no host names to constrain the run CA to".into(),
            ));
        }
        let key = KeyPair::from_pem(&ca.key)
            .map_err(|e| bad(format!("key is not a PEM private key: {e}")))?;
        let params = CertificateParams::from_ca_cert_pem(&ca.cert)
            .map_err(|e| bad(format!("certificate cannot be read: {e}")))?;
        if params.is_ca != IsCa::Ca(BasicConstraints::Constrained(0)) {
            return Err(bad("is not a CA of path length 0".into()));
        }
        if params.not_after <= OffsetDateTime::now_utc() {
            return Err(bad(format!(
                "expired at {}: render the manifests again",
                params.not_after
            )));
        }
        let subtrees = match &params.name_constraints {
            Some(nc) if nc.excluded_subtrees == ip_exclusions() => &nc.permitted_subtrees,
            _ => {
                return Err(bad(
                    "is not name-constrained to host names with every IP address excluded".into(),
                ));
            }
        };
        for name in &permitted {
            let covered = subtrees.iter().any(|t| match t {
                GeneralSubtree::DnsName(d) => name == d || name.ends_with(&format!(".{d}")),
                _ => false,
            });
            if !covered {
                return Err(bad(format!(
                    "does not cover {name}: the secrets changed since it was made; render the manifests again"
                )));
            }
        }
        let cert = params.self_signed(&key).map_err(ca_err)?;
        let loaded = Self {
            pem: ca.cert.clone(),
            cert,
            key,
            permitted,
            provider,
            leaves: Mutex::new(HashMap::new()),
        };
        loaded.check_key_matches()?;
        Ok(loaded)
    }

    /// A leaf this CA issues verifies under the certificate the jail trusts: else key and
    /// certificate are not a pair, and every intercepted connection would fail.
    fn check_key_matches(&self) -> Result<(), GatewayError> {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        let name = &self.permitted[0];
        let der = CertificateDer::from_pem_slice(self.pem.as_bytes()).map_err(|e| {
            GatewayError::Ca(format!("the given run CA certificate is not PEM: {e}"))
        })?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(der)
            .map_err(|e| GatewayError::Ca(format!("the given run CA certificate: {e}")))?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| GatewayError::Tls(e.to_string()))?;
        let (leaf, _, _) = self.issue(name)?;
        let server = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| GatewayError::Ca(format!("{name}: {e}")))?;
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &server,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .map_err(|e| {
                GatewayError::Ca(format!(
                    "the given run CA key does not belong to its certificate (a leaf for {name} it signs does not verify: {e})"
                ))
            })?;
        Ok(())
    }

    /// The CA as PEM, key included: for [`new_ca_pem`] only.
    fn to_pem(&self) -> CaPem {
        CaPem {
            cert: self.pem.clone(),
            key: self.key.serialize_pem(),
        }
    }

    pub(crate) fn cert_der(&self) -> &CertificateDer<'static> {
        self.cert.der()
    }

    pub(crate) fn cert_pem(&self) -> String {
        self.pem.clone()
    }

    /// Whether `name` lies inside one of the permitted subtrees.
    pub(crate) fn permits(&self, name: &str) -> bool {
        self.permitted
            .iter()
            .any(|p| name == p || name.ends_with(&format!(".{p}")))
    }

    /// A leaf certificate for `name` and its key (PKCS#8 DER). Unconstrained on our side: the
    /// caller checks `permits` first; tests use it to prove the name constraints hold.
    fn issue(
        &self,
        name: &str,
    ) -> Result<(CertificateDer<'static>, Vec<u8>, OffsetDateTime), GatewayError> {
        let key = KeyPair::generate().map_err(ca_err)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::new(vec![name.to_string()]).map_err(ca_err)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BACKDATE;
        let not_after = (now + LEAF_VALIDITY).min(self.cert.params().not_after);
        params.not_after = not_after;
        params.serial_number = Some(serial()?);
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(ca_err)?;
        Ok((cert.der().clone(), key.serialize_der(), not_after))
    }

    /// The TLS server configuration presenting a leaf for `name` (cached; one SAN; ALPN
    /// `http/1.1` only, so the jail never speaks HTTP/2 through the gateway).
    pub(crate) fn server_config(&self, name: &str) -> Result<Arc<ServerConfig>, GatewayError> {
        if !self.permits(name) {
            return Err(GatewayError::Ca(format!(
                "refusing to issue a certificate for {name}: not a secret-bound host"
            )));
        }
        let now = OffsetDateTime::now_utc();
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((expiry, cfg)) = leaves.get(name)
            && *expiry - now > Duration::hours(1)
        {
            return Ok(cfg.clone());
        }
        let (der, key, expiry) = self.issue(name)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key));
        let mut cfg = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| GatewayError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![der], key)
            .map_err(|e| GatewayError::Tls(e.to_string()))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        leaves.insert(name.to_string(), (expiry, cfg.clone()));
        Ok(cfg)
    }

    #[cfg(test)]
    pub(crate) fn key_der_for_test(&self) -> Vec<u8> {
        self.key.serialize_der()
    }

    #[cfg(test)]
    pub(crate) fn issue_unchecked_for_test(
        &self,
        name: &str,
    ) -> Result<CertificateDer<'static>, GatewayError> {
        Ok(self.issue(name)?.0)
    }
}
