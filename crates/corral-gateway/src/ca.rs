//! The per-run certificate authority: generated in memory, never serialised to disk.
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

pub(crate) struct RunCa {
    cert: rcgen::Certificate,
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
            excluded_subtrees: vec![
                GeneralSubtree::IpAddress(rcgen::CidrSubnet::V4([0; 4], [0; 4])),
                GeneralSubtree::IpAddress(rcgen::CidrSubnet::V6([0; 16], [0; 16])),
            ],
        });
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        params.serial_number = Some(serial()?);
        let cert = params.self_signed(&key).map_err(ca_err)?;
        Ok(Self {
            cert,
            key,
            permitted,
            provider,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn cert_der(&self) -> &CertificateDer<'static> {
        self.cert.der()
    }

    pub(crate) fn cert_pem(&self) -> String {
        self.cert.pem()
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
