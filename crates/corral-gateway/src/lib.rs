//! corral's credential gateway: real secrets never enter the jail.
//!
//! The jail's environment holds a random per-run *placeholder* for each `[secrets]` entry. For
//! the hosts a secret names, corral's proxy hands the CONNECT stream to this gateway instead of
//! tunnelling it: the gateway terminates TLS with a certificate from a per-run CA that only the
//! jail trusts, parses each HTTP/1.1 request strictly, replaces the placeholder with the real
//! value in credential headers, and re-encrypts to the real host with normal certificate
//! verification. Every other host stays an opaque tunnel in the proxy.
//!
//! # Invariants
//!
//! - **The secret is chosen by the CONNECT host the proxy resolved and dialled**, never by a name
//!   the client controls. The TLS SNI must equal that host (else the handshake is refused) and
//!   every request's `Host` must equal it (else `421`); the upstream connection goes to the
//!   address the proxy checked, with the CONNECT host as the verified server name. IP-literal
//!   CONNECTs are never intercepted. Redirects are relayed to the client, never followed.
//! - **The CA key never leaves this process's memory**: it is never serialised, written, or put
//!   into the jail. The jail gets the CA *certificate* only. The CA has path length 0 and is
//!   name-constrained to the secret-bound host names (every IP excluded), so even a stolen leaf
//!   key cannot impersonate any other host.
//! - **Real values go only into request headers towards a bound host**: `Authorization`
//!   (`Bearer`, `token`, raw, and `Basic` decoded and re-encoded), `Proxy-Authorization` is
//!   never touched, and the API-key headers in [`CREDENTIAL_HEADERS`]. Never into the URL or the
//!   body, never into a response. A placeholder seen anywhere else (another header, the URL, a
//!   host the secret is not bound to) is left as it is (useless upstream) and audited.
//! - **The real value never comes back**: every answer from a bound host is scrubbed
//!   ([`Gateway::scrubber`]: the value raw, percent-encoded, JSON-escaped and base64, and the
//!   encodings the gateway produced, in the status line, the headers and the decoded body,
//!   streamed), asked for whole (no `Range`, `If-Range`) with `Accept-Encoding: identity` and
//!   refused (502) when compressed anyway; `TRACE` is refused. A token endpoint's answer is
//!   parsed and rewritten in full, or refused (502): never relayed as it came.
//! - **One connection layer with the proxy**: requests and bodies go through
//!   `corral_http1::io` (the proxy's framing, limits and deadlines; trailers dropped, chunk
//!   sizes re-declared); an injection is audited only once the head was written upstream.
//! - **The real value is never logged**: audit records name the secret, host, method and path
//!   without query; `Debug` of every type here redacts values.
//! - The jail side speaks HTTP/1.1 only (ALPN offers `http/1.1`), so one connection has one
//!   `Host`; websocket upgrades get their headers swapped, then the two streams are spliced,
//!   the origin's side scrubbed message by message, across its frames (`ws.rs`); other upgrades are not forwarded.
//! - **Hosts the proxy decides by method and path** (`network.allow = ["GET host/path/**"]`)
//!   are terminated the same way ([`Gateway::intercept_gated`], the CA's names include them):
//!   after the checks above, each request goes to the proxy's [`RequestGate`], and is sent
//!   with the target the gate decided on, or answered with its refusal and the connection
//!   closed; a secret-bound host among them gets its swap after the gate.
//!
//! # The seam with the proxy (corral-net)
//!
//! ```text
//! let (gateway, trust) = Gateway::new(secrets, GatewayConfig { .. })?;
//! // corral run: add trust.env to the jail's environment (placeholders + CA variables),
//! //             add trust.mounts to its mounts (the CA files, read-only).
//! // proxy, CONNECT host:port allowed, dialled to the checked address `addr` as stream `up`
//! // (direct, or through the upstream proxy):
//! if gateway.binds(&host, port) {
//!     reply "HTTP/1.1 200 Connection established\r\n\r\n";
//!     let client = Prefixed::new(bytes_already_read_after_the_connect, client_stream);
//!     let stats = gateway.intercept_over(client, up, &host, port, addr, &client_label).await;
//!     // (or `gateway.intercept(client, &host, port, addr, ..)` to let the gateway dial `addr`
//!     //  itself, only when the first request passed its checks)
//! } else { tunnel as usual }
//! // proxy, plain-HTTP request to host:port (absolute-form URL), before forwarding the head:
//! match gateway.rewrite_plain(&mut head, &host, port, &client_label) {
//!     Ok(_) => forward the (rewritten) head,
//!     Err(refusal) => answer refusal.status with refusal.message,
//! }
//! ```
//!
//! Plain HTTP carries the real value in clear on the wire: it is served for harnesses
//! configured with an `http://` base URL (a local or test model server), and only when one of
//! the secret's host patterns names the port (`hosts = ["models.lan:8080"]`), so a secret for
//! `api.example.com` is never swapped into a clear-text request to port 80.
//!
//! Limits: a placeholder inside TLS to a host that is *not* bound to any secret cannot be seen
//! (that tunnel stays opaque, by design); it reaches that host as the useless placeholder.
//! Chaining to `network.upstream_proxy` is the proxy's: with [`Gateway::intercept_over`] the
//! gateway runs its TLS over whatever stream the proxy opened.

mod ca;
mod encodings;
mod placeholder;
#[doc(hidden)]
pub mod scrub_check;
pub mod secret_like;
mod serve;
pub mod signin;
pub mod signin_remote;
mod signin_serve;
mod ws;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use corral_audit::{AuditLog, Decision, Event, NetEvent, NetPhase, Record};
use corral_policy::domain::{DomainPattern, Host, parse_authority};
use corral_policy::plan::{Access, Mount, MountKind, SecretPlan};
use rustls::RootCertStore;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

pub use ca::{CA_VALIDITY, CaPem, LEAF_VALIDITY};
pub use corral_http1::io::Replacer;
pub use corral_http1::io::{Budget, Timeouts};
pub use corral_http1::{Header, RequestHead};
pub use placeholder::{placeholder_for, vendor_prefix};

/// Request headers whose placeholder is replaced by the real value on a bound host
/// (compared case-insensitively). `authorization` also gets `Basic` credentials decoded,
/// swapped and re-encoded.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "api-key",
    "x-auth-token",
    "private-token",
];

/// How long the TLS handshakes and the upstream connect may take.
const HANDSHAKE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("secret {name}: {reason}")]
    Secret { name: String, reason: String },
    #[error("credential gateway CA: {0}")]
    Ca(String),
    #[error("credential gateway TLS configuration: {0}")]
    Tls(String),
    #[error("reading random bytes for the credential gateway: {0}")]
    Random(String),
    #[error("writing the jail's CA file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{host}:{port} is not bound to any secret: the proxy must tunnel it, not hand it to the gateway"
    )]
    NotBound { host: String, port: u16 },
    #[error("refused {host}:{port}: {reason}")]
    Refused {
        host: String,
        port: u16,
        reason: String,
    },
    #[error("TLS with the jail's client for {host}: {source}")]
    ClientTls {
        host: String,
        source: std::io::Error,
    },
    #[error("connecting to {host} at {addr}: {source}")]
    Upstream {
        host: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("relaying {host}: {source}")]
    Relay {
        host: String,
        source: std::io::Error,
    },
}

/// Where the gateway writes its audit records.
#[derive(Debug, Clone)]
pub struct AuditSink {
    pub log: AuditLog,
    pub jail: String,
}

/// How to build a gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Roots that verify the real upstream hosts; `None` is the system store
    /// (rustls-native-certs). Tests pass their mock upstream's own test CA.
    pub upstream_roots: Option<RootCertStore>,
    /// A directory (host path) for the jail's CA files, created if missing; bound read-only into
    /// the jail at the same path through [`JailTrust::mounts`].
    pub trust_dir: PathBuf,
    /// The system CA bundle B is built from; `None` is the first of the usual paths.
    pub system_bundle: Option<PathBuf>,
    pub audit: Option<AuditSink>,
}

/// What the jail needs to trust the gateway and use the secrets.
#[derive(Debug, Clone)]
pub struct JailTrust {
    /// The run CA certificate (PEM). Never the key.
    pub ca_pem: String,
    /// C: the run CA alone.
    pub ca_file: PathBuf,
    /// B: the system roots plus the run CA.
    pub bundle_file: PathBuf,
    /// Set in the jail: each secret's name with its placeholder, and the CA variables
    /// (`SSL_CERT_FILE`=B, `NODE_EXTRA_CA_CERTS`=C, `REQUESTS_CA_BUNDLE`=B, ...).
    pub env: BTreeMap<String, String>,
    /// Read-only bind of the trust directory at its own path (the files the variables name).
    pub mounts: Vec<Mount>,
    /// Read-only binds of B over the system bundle paths that exist on this host
    /// (`/etc/ssl/certs/ca-certificates.crt`, ...), so programs that read the system store
    /// directly, ignoring the variables, trust the run CA too. A backend applies them after
    /// the system directories; the native backend does not yet (it would need to bind over a
    /// file inside a read-only bind), so `corral run` relies on the variables.
    pub system_overlays: Vec<Mount>,
}

/// The files, variables and binds of [`trust_layout`].
#[derive(Debug, Clone, PartialEq)]
pub struct TrustLayout {
    /// C: the run CA alone.
    pub ca_file: PathBuf,
    /// B: the system roots plus the run CA.
    pub bundle_file: PathBuf,
    /// The CA variables (`SSL_CERT_FILE`=B, `NODE_EXTRA_CA_CERTS`=C, ...).
    pub env: BTreeMap<String, String>,
    /// Read-only bind of the trust directory at its own path.
    pub mounts: Vec<Mount>,
    /// Read-only binds of B over the system bundle paths that exist on this host.
    pub system_overlays: Vec<Mount>,
}

/// The proxy's decision of each request inside an intercepted connection to a host it decides
/// per request ([`Gateway::intercept_gated`]).
pub trait RequestGate: Send + Sync {
    /// `Ok(target)`: forward the request with this origin-form target (the normalised form
    /// that was decided on). `Err`: answer with the refusal and close; the gate audits both.
    fn decide(&self, method: &str, target: &str) -> Result<String, Refusal>;
}

/// Why a request was refused, and what the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
}

/// What [`Gateway::rewrite_plain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RewriteReport {
    /// Secrets whose placeholder was replaced, with the header it was in.
    pub injected: Vec<(String, String)>,
    /// Secrets whose placeholder was seen but left alone, with why.
    pub left: Vec<(String, String)>,
}

/// Totals of one intercepted connection, for the proxy's `close` record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterceptStats {
    pub requests: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

struct Secret {
    name: String,
    hosts: Vec<DomainPattern>,
    real: String,
    placeholder: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("real", &"<redacted>")
            .field("placeholder", &"<redacted>")
            .finish()
    }
}

/// Where a request or connection goes, for audit records.
struct Dest<'a> {
    client: &'a str,
    host: &'a Host,
    port: u16,
    addr: Option<SocketAddr>,
}

struct Inner {
    ca: ca::RunCa,
    secrets: Vec<Secret>,
    upstream: Arc<rustls::ClientConfig>,
    audit: Option<AuditSink>,
    /// Encodings of real values the gateway put into requests (a `Basic` credential's base64),
    /// each with what the jail had sent instead: scrubbed from responses like the values.
    produced: std::sync::Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Sign-in credential files served in this run ([`signin`]).
    signin: Vec<signin::Signin>,
}

/// How many produced encodings are remembered for scrubbing (one per distinct `Basic` user).
const PRODUCED_KEPT: usize = 64;

/// The credential gateway of one run. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
    /// The connection deadlines: the proxy's own ([`Gateway::with_timeouts`]).
    timeouts: Timeouts,
    /// Where the request heads read inside intercepted tunnels are counted: the proxy's own
    /// budget for its jail's partial heads ([`Gateway::with_budget`]); unlimited otherwise.
    budget: Arc<Budget>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("secrets", &self.inner.secrets)
            .finish_non_exhaustive()
    }
}

const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

fn valid_header_value(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

impl Gateway {
    /// A gateway for `secrets` (each plan with its real value, read by the caller from its own
    /// environment), with a fresh CA, and the files and variables the jail needs.
    pub fn new(
        secrets: Vec<(SecretPlan, String)>,
        config: GatewayConfig,
    ) -> Result<(Gateway, JailTrust), GatewayError> {
        Self::with_run(secrets, &BTreeMap::new(), Vec::new(), &[], config)
    }

    /// [`Gateway::new`] with the placeholders the run already chose (by secret name, each from
    /// [`placeholder_for`] of the real value; a secret not in `placeholders` gets a fresh one)
    /// and the sign-in credential files it serves ([`signin`]). The run CA may also sign for
    /// the names of `decided`: the hosts the proxy decides by method and path
    /// ([`Gateway::intercept_gated`]).
    pub fn with_run(
        secrets: Vec<(SecretPlan, String)>,
        placeholders: &BTreeMap<String, String>,
        signins: Vec<signin::Signin>,
        decided: &[DomainPattern],
        config: GatewayConfig,
    ) -> Result<(Gateway, JailTrust), GatewayError> {
        Self::build(secrets, placeholders, signins, decided, None, config)
    }

    /// [`Gateway::with_run`] with a run CA made before (by [`new_ca`], for a jail that had to
    /// trust it before the gateway ran: `corral kube render`) instead of a fresh one; refused
    /// unless it is such a CA, covering every secret's hosts, its key matching its certificate.
    /// The jail's CA files hold that certificate.
    pub fn with_ca(
        secrets: Vec<(SecretPlan, String)>,
        placeholders: &BTreeMap<String, String>,
        ca: &CaPem,
        config: GatewayConfig,
    ) -> Result<(Gateway, JailTrust), GatewayError> {
        Self::build(secrets, placeholders, Vec::new(), &[], Some(ca), config)
    }

    fn build(
        secrets: Vec<(SecretPlan, String)>,
        placeholders: &BTreeMap<String, String>,
        signins: Vec<signin::Signin>,
        decided: &[DomainPattern],
        given_ca: Option<&CaPem>,
        config: GatewayConfig,
    ) -> Result<(Gateway, JailTrust), GatewayError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (list, mut permitted) = checked_secrets(secrets, placeholders)?;
        for name in decided.iter().filter_map(|p| p.name()) {
            if !permitted.iter().any(|p| p == name) {
                permitted.push(name.to_string());
            }
        }
        for name in signins.iter().flat_map(signin::Signin::names) {
            if !permitted.contains(&name) {
                permitted.push(name);
            }
        }
        let ca = match given_ca {
            Some(pem) => ca::RunCa::load(pem, permitted, provider.clone())?,
            None => ca::RunCa::generate(permitted, provider.clone())?,
        };

        let roots = match config.upstream_roots {
            Some(r) => r,
            None => {
                let mut r = RootCertStore::empty();
                let loaded = rustls_native_certs::load_native_certs();
                r.add_parsable_certificates(loaded.certs);
                if r.is_empty() {
                    return Err(GatewayError::Tls(
                        "no system CA certificates found to verify the real hosts: install ca-certificates".into(),
                    ));
                }
                r
            }
        };
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| GatewayError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];

        let trust = write_trust(&config.trust_dir, config.system_bundle.as_deref(), &ca)?;
        let mut trust = trust;
        for s in &list {
            trust.env.insert(s.name.clone(), s.placeholder.clone());
        }
        let gw = Gateway {
            inner: Arc::new(Inner {
                ca,
                secrets: list,
                upstream: Arc::new(client),
                audit: config.audit,
                produced: std::sync::Mutex::new(Vec::new()),
                signin: signins,
            }),
            timeouts: Timeouts::default(),
            budget: Arc::new(Budget::unlimited()),
        };
        Ok((gw, trust))
    }

    /// The same gateway with the connection deadlines `timeouts` (the proxy passes its own, so
    /// an intercepted connection has the same bounds as a proxied one).
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// The same gateway counting the request heads (and response heads) it reads in `budget`:
    /// the proxy passes the budget of its jail's partial heads, so what a jail makes corral hold
    /// inside an intercepted tunnel is bounded with the rest (503 past it).
    pub fn with_budget(mut self, budget: Arc<Budget>) -> Self {
        self.budget = budget;
        self
    }

    /// The placeholder the jail sees for secret `name`.
    pub fn placeholder(&self, name: &str) -> Option<&str> {
        self.inner
            .secrets
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.placeholder.as_str())
    }

    /// Whether a CONNECT to `host:port` must be handed to [`Gateway::intercept`]: a name (never
    /// an IP literal) that some secret is bound to.
    pub fn binds(&self, host: &Host, port: u16) -> bool {
        let secret = || {
            self.inner
                .secrets
                .iter()
                .any(|s| s.hosts.iter().any(|p| p.matches(host, port)))
        };
        let signin = || self.inner.signin.iter().any(|s| s.binds(host, port));
        matches!(host, Host::Name(_)) && (secret() || signin())
    }

    fn audit(&self, ev: NetEvent) {
        if let Some(a) = &self.inner.audit {
            // An audit failure must not break the agent's request; the proxy's own records
            // still cover the connection.
            let _ = a.log.write(&Record::now(&a.jail, Event::Net(ev)));
        }
    }

    /// Write one gateway record for a request or connection to `d`.
    fn record(
        &self,
        d: &Dest<'_>,
        method: &str,
        decision: Decision,
        rule: String,
        secret: Option<String>,
    ) {
        self.audit(NetEvent {
            phase: NetPhase::Gateway,
            client: d.client.to_string(),
            method: method.to_string(),
            host: d.host.to_string(),
            port: d.port,
            address: d.addr.map(|a| a.to_string()),
            decision: Some(decision),
            rule,
            secret,
            ..NetEvent::default()
        });
    }

    /// Swap placeholders in `head`'s headers for a request going to `host:port`; returns what
    /// was done. Never touches the target or the body.
    /// `plain`: the request travels unencrypted after the proxy; a secret is swapped into it
    /// only when one of its host patterns names the port explicitly (`host:8080`), so that
    /// `hosts = ["api.example.com"]` never sends the real value in clear text to port 80.
    fn rewrite_headers(
        &self,
        target: &str,
        headers: &mut [Header],
        host: &Host,
        port: u16,
        plain: bool,
    ) -> RewriteReport {
        let mut report = RewriteReport::default();
        for s in &self.inner.secrets {
            let matching = |p: &&DomainPattern| p.matches(host, port);
            let named = matches!(host, Host::Name(_)) && s.hosts.iter().any(|p| matching(&p));
            let bound =
                named && (!plain || s.hosts.iter().filter(matching).any(|p| p.port().is_some()));
            let ph = s.placeholder.as_bytes();
            for h in headers.iter_mut() {
                let lname = h.name.to_ascii_lowercase();
                let credential = CREDENTIAL_HEADERS.contains(&lname.as_str());
                let is_basic = lname == "authorization"
                    && h.value.len() > 6
                    && h.value[..6].eq_ignore_ascii_case(b"basic ");
                let sent_basic = if is_basic {
                    h.value[6..].trim_ascii().to_vec()
                } else {
                    Vec::new()
                };
                let decoded = if is_basic {
                    base64::engine::general_purpose::STANDARD
                        .decode(h.value[6..].trim_ascii())
                        .ok()
                } else {
                    None
                };
                let in_plain = contains(&h.value, ph);
                let in_basic = decoded.as_deref().is_some_and(|d| contains(d, ph));
                if !in_plain && !in_basic {
                    continue;
                }
                if named && !bound {
                    report.left.push((
                        s.name.clone(),
                        format!(
                            "placeholder over plain HTTP not replaced (header {lname}; name the port in the secret's hosts, `{host}:{port}`, to allow it)"
                        ),
                    ));
                } else if !bound {
                    report.left.push((
                        s.name.clone(),
                        format!("placeholder sent to unbound host (header {lname})"),
                    ));
                } else if !credential {
                    report.left.push((
                        s.name.clone(),
                        format!("placeholder in non-credential header {lname} not replaced"),
                    ));
                } else {
                    if in_plain {
                        h.value = replace(&h.value, ph, s.real.as_bytes());
                    }
                    if let (true, Some(d)) = (in_basic, decoded) {
                        let swapped = replace(&d, ph, s.real.as_bytes());
                        let encoded = base64::engine::general_purpose::STANDARD.encode(swapped);
                        self.remember_produced(encoded.as_bytes(), &sent_basic);
                        let mut v = b"Basic ".to_vec();
                        v.extend_from_slice(encoded.as_bytes());
                        h.value = v;
                    }
                    report.injected.push((s.name.clone(), lname));
                }
            }
            if contains(target.as_bytes(), ph) {
                report.left.push((
                    s.name.clone(),
                    if bound {
                        "placeholder in the URL not replaced (headers only)".into()
                    } else {
                        "placeholder sent to unbound host (in the URL)".into()
                    },
                ));
            }
        }
        signin::swap_access(
            &self.inner.signin,
            headers,
            (host, port),
            plain,
            &mut report,
        );
        report
    }

    /// Remember an encoding of a real value the gateway produced, with what the jail sent in
    /// its place, so responses reflecting it are scrubbed too.
    fn remember_produced(&self, real: &[u8], sent: &[u8]) {
        let mut p = self
            .inner
            .produced
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if real.is_empty() || p.iter().any(|(r, _)| r == real) {
            return;
        }
        if p.len() >= PRODUCED_KEPT {
            p.remove(0);
        }
        p.push((real.to_vec(), sent.to_vec()));
    }

    /// Audit what a rewrite did: the placeholders left alone, and (`sent`: the head was written
    /// upstream) the injections. An injection is audited only once it was really sent.
    fn audit_report(
        &self,
        report: &RewriteReport,
        client: &str,
        (method, target): (&str, &str),
        host: &Host,
        port: u16,
        addr: Option<SocketAddr>,
    ) {
        self.audit_left(report, client, (method, target), host, port, addr);
        self.audit_injected(report, client, (method, target), host, port, addr);
    }

    fn audit_injected(
        &self,
        report: &RewriteReport,
        client: &str,
        (method, target): (&str, &str),
        host: &Host,
        port: u16,
        addr: Option<SocketAddr>,
    ) {
        let path = path_without_query(target);
        for (name, header) in &report.injected {
            self.record(
                &Dest {
                    client,
                    host,
                    port,
                    addr,
                },
                method,
                Decision::Allow,
                format!("secrets.{name}: injected into {header} for {method} {path}"),
                Some(name.clone()),
            );
        }
    }

    fn audit_left(
        &self,
        report: &RewriteReport,
        client: &str,
        (method, target): (&str, &str),
        host: &Host,
        port: u16,
        addr: Option<SocketAddr>,
    ) {
        let path = path_without_query(target);
        for (name, why) in &report.left {
            self.record(
                &Dest {
                    client,
                    host,
                    port,
                    addr,
                },
                method,
                Decision::Deny,
                format!("secrets.{name}: {why}; {method} {path}"),
                Some(name.clone()),
            );
        }
    }

    /// Check `Host` against the host the proxy dialled.
    /// `required`: inside a tunnel the `Host` header is the only name a request carries; a
    /// plain-HTTP request names its host in the absolute-form target, so there `Host` may be
    /// absent (HTTP/1.0), but when present it must agree.
    fn check_host(
        headers: &[Header],
        host: &Host,
        port: u16,
        required: bool,
    ) -> Result<(), Refusal> {
        let mut hosts = headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("host"))
            .map(|h| h.value.as_slice());
        let first = hosts.next();
        if first.is_none() && !required {
            return Ok(());
        }
        let (Some(value), None) = (first, hosts.next()) else {
            return Err(Refusal {
                status: 400,
                message: "corral credential gateway: exactly one Host header is required".into(),
            });
        };
        let ok = std::str::from_utf8(value)
            .ok()
            .and_then(|v| parse_authority(v).ok())
            .is_some_and(|(h, p)| h == *host && p.is_none_or(|p| p == port));
        if ok {
            Ok(())
        } else {
            Err(Refusal {
                status: 421,
                message: format!(
                    "corral credential gateway: Host {:?} does not match the destination {host}:{port}",
                    String::from_utf8_lossy(value)
                ),
            })
        }
    }

    /// Rewrite a plain-HTTP request head going to `host:port` (the host of its absolute-form URL,
    /// which the proxy resolved and dials). Call it for every plain-HTTP request, bound or not:
    /// placeholders going to unbound hosts are audited. Over plain HTTP a secret is swapped only
    /// when one of its host patterns names this port (`hosts = ["models.lan:8080"]`): the real
    /// value then crosses the network in clear text, which the policy must say explicitly. Refuses when `Host` disagrees with
    /// `host` (the proxy answers `refusal.status`).
    pub fn rewrite_plain(
        &self,
        head: &mut RequestHead,
        host: &Host,
        port: u16,
        client: &str,
    ) -> Result<RewriteReport, Refusal> {
        self.rewrite_plain_headers(
            &head.method,
            &head.target,
            &mut head.headers,
            host,
            port,
            client,
        )
    }

    /// [`Gateway::rewrite_plain`] for a head parsed elsewhere (the proxy's own parser): the
    /// request's method and target, and its header fields, rewritten in place. Placeholders
    /// left alone are audited here; the injections once the head is sent
    /// ([`Gateway::plain_sent`]). A `TRACE` that would carry a real value is refused (405).
    pub fn rewrite_plain_headers(
        &self,
        method: &str,
        target: &str,
        headers: &mut [Header],
        host: &Host,
        port: u16,
        client: &str,
    ) -> Result<RewriteReport, Refusal> {
        // A refusal is audited before it is answered.
        let refuse = |r: Refusal| {
            let dest = Dest {
                client,
                host,
                port,
                addr: None,
            };
            let rule = format!("credential gateway: {}", r.message);
            self.record(&dest, method, Decision::Deny, rule, None);
            Err(r)
        };
        if let Err(r) = Self::check_host(headers, host, port, false) {
            return refuse(r);
        }
        let report = self.rewrite_headers(target, headers, host, port, true);
        self.audit_left(&report, client, (method, target), host, port, None);
        if method.eq_ignore_ascii_case("TRACE") && !report.injected.is_empty() {
            return refuse(Refusal {
                status: 405,
                message: "corral credential gateway: TRACE with a credential is not allowed (the origin would echo the real value back)".into(),
            });
        }
        Ok(report)
    }

    /// Audit the injections of a plain-HTTP rewrite once its head was written to `addr`.
    pub fn plain_sent(
        &self,
        report: &RewriteReport,
        (method, target): (&str, &str),
        (host, port): (&Host, u16),
        client: &str,
        addr: SocketAddr,
    ) {
        self.audit_injected(report, client, (method, target), host, port, Some(addr));
    }

    /// Serve one CONNECT to a secret-bound `host:port` whose `200` the proxy has already sent:
    /// terminate the jail's TLS (SNI must be `host`), then relay requests one by one to the real
    /// host at `addr` (the address the proxy checked), swapping placeholders in credential
    /// headers. Returns when either side closes.
    pub async fn intercept<S>(
        &self,
        client: S,
        host: &Host,
        port: u16,
        addr: SocketAddr,
        client_label: &str,
    ) -> Result<InterceptStats, GatewayError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let name = host.to_string();
        let dial = move || async move {
            let up_err = |source| GatewayError::Upstream {
                host: name.clone(),
                addr,
                source,
            };
            let tcp = tokio::time::timeout(HANDSHAKE, TcpStream::connect(addr))
                .await
                .map_err(|_| up_err(std::io::ErrorKind::TimedOut.into()))?
                .map_err(up_err)?;
            let _ = tcp.set_nodelay(true);
            Ok(tcp)
        };
        self.serve(client, (host, port, addr), client_label, None, dial)
            .await
    }

    /// [`Gateway::intercept`] over an upstream byte stream the proxy already opened to `addr`
    /// (directly, or through its upstream proxy's CONNECT): the gateway runs TLS to the real
    /// host over it. Wrap the client in [`Prefixed`] when the proxy has already read bytes of
    /// the client's TLS handshake.
    pub async fn intercept_over<S, U>(
        &self,
        client: S,
        upstream: U,
        host: &Host,
        port: u16,
        addr: SocketAddr,
        client_label: &str,
    ) -> Result<InterceptStats, GatewayError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
        U: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let ready = move || async move { Ok(upstream) };
        self.serve(client, (host, port, addr), client_label, None, ready)
            .await
    }

    /// [`Gateway::intercept_over`] for a host the proxy decides request by request (network
    /// rules by method and path): each request, once checked as every intercepted one is
    /// (origin-form, `Host` naming the destination), goes to `gate`; it is forwarded with the
    /// target the gate returns, or answered with the gate's refusal and the connection closed.
    /// The host need not be bound to a secret, only inside the run CA's names
    /// ([`Gateway::can_intercept`]); a secret-bound one still gets its swap after the gate.
    #[allow(clippy::too_many_arguments)]
    pub async fn intercept_gated<S, U>(
        &self,
        client: S,
        upstream: U,
        host: &Host,
        port: u16,
        addr: SocketAddr,
        client_label: &str,
        gate: &dyn RequestGate,
    ) -> Result<InterceptStats, GatewayError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
        U: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let ready = move || async move { Ok(upstream) };
        self.serve(client, (host, port, addr), client_label, Some(gate), ready)
            .await
    }

    /// Whether the run CA may sign for `host` (a name inside its constraints): what
    /// [`Gateway::intercept_gated`] needs.
    pub fn can_intercept(&self, host: &Host) -> bool {
        host.as_name().is_some_and(|n| self.inner.ca.permits(n))
    }

    /// [`Gateway::serve_inner`], with every failure the gateway did not already record
    /// (refusals are) written to the audit log.
    async fn serve<S, U, F, Fut>(
        &self,
        client: S,
        (host, port, addr): (&Host, u16, SocketAddr),
        client_label: &str,
        gate: Option<&dyn RequestGate>,
        connect: F,
    ) -> Result<InterceptStats, GatewayError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
        U: AsyncRead + AsyncWrite + Unpin + Send,
        F: FnOnce() -> Fut + Send,
        Fut: std::future::Future<Output = Result<U, GatewayError>> + Send,
    {
        let r = self
            .serve_inner(client, (host, port, addr), client_label, gate, connect)
            .await;
        if let Err(e) = &r
            && !matches!(
                e,
                GatewayError::Refused { .. } | GatewayError::NotBound { .. }
            )
        {
            self.record(
                &Dest {
                    client: client_label,
                    host,
                    port,
                    addr: Some(addr),
                },
                "CONNECT",
                Decision::Deny,
                format!("credential gateway: {e}"),
                None,
            );
        }
        r
    }

    async fn tls_upstream<U>(
        &self,
        name: &str,
        addr: SocketAddr,
        raw: U,
    ) -> Result<tokio_rustls::client::TlsStream<U>, GatewayError>
    where
        U: AsyncRead + AsyncWrite + Unpin,
    {
        let up_err = |source| GatewayError::Upstream {
            host: name.to_string(),
            addr,
            source,
        };
        let server_name = ServerName::try_from(name.to_string())
            .map_err(|e| up_err(std::io::Error::other(e.to_string())))?;
        let connector = tokio_rustls::TlsConnector::from(self.inner.upstream.clone());
        tokio::time::timeout(HANDSHAKE, connector.connect(server_name, raw))
            .await
            .map_err(|_| up_err(std::io::ErrorKind::TimedOut.into()))?
            .map_err(up_err)
    }
}

/// A stream that first yields `prefix` (bytes a caller already read from `inner`), then reads
/// from `inner`; writes go to `inner`.
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn path_without_query(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or(target)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn replace(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len() + with.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), GatewayError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| GatewayError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)
        .map_err(io)?;
    f.write_all(data).map_err(io)
}

/// Each secret checked (a real value usable in a header, names for hosts, a usable placeholder:
/// the one given in `placeholders`, else a fresh one), and the host names they are bound to
/// (the run CA's permitted names), each once.
fn checked_secrets(
    secrets: Vec<(SecretPlan, String)>,
    placeholders: &BTreeMap<String, String>,
) -> Result<(Vec<Secret>, Vec<String>), GatewayError> {
    let mut permitted: Vec<String> = Vec::new();
    let mut list = Vec::new();
    for (plan, real) in secrets {
        let bad = |reason: &str| GatewayError::Secret {
            name: plan.name.clone(),
            reason: reason.to_string(),
        };
        if real.is_empty() {
            return Err(bad(&format!(
                "${} is empty or unset in corral's environment: set it, or remove the secret from [secrets]",
                plan.from_env
            )));
        }
        if !valid_header_value(&real) {
            return Err(bad(&format!(
                "${} holds characters that cannot go into an HTTP header (spaces, control or non-ASCII bytes)",
                plan.from_env
            )));
        }
        for name in host_names(&plan)? {
            if !permitted.contains(&name) {
                permitted.push(name);
            }
        }
        let placeholder = match placeholders.get(&plan.name) {
            Some(p) if p.is_empty() || *p == real || !valid_header_value(p) => {
                return Err(bad(
                    "the placeholder given is empty, not usable in a header, or the real value itself",
                ));
            }
            Some(p) => p.clone(),
            None => placeholder_for(&real)?,
        };
        list.push(Secret {
            name: plan.name,
            hosts: plan.hosts,
            real,
            placeholder,
        });
    }
    Ok((list, permitted))
}

/// The host names a secret is bound to (the run CA's permitted subtrees): refused when it
/// names none, or an IP address (the gateway serves names only).
fn host_names(plan: &SecretPlan) -> Result<Vec<String>, GatewayError> {
    let bad = |reason: String| GatewayError::Secret {
        name: plan.name.clone(),
        reason,
    };
    if plan.hosts.is_empty() {
        return Err(bad(
            "`hosts` is empty: name the hosts the secret is for".into()
        ));
    }
    plan.hosts
        .iter()
        .map(|h| match h.name() {
            Some(name) => Ok(name.to_string()),
            None => Err(bad(format!(
                "host {h} is an IP address: the gateway only serves names (an IP-literal CONNECT is never intercepted)"
            ))),
        })
        .collect()
}

/// A run CA for `secrets`, made before the gateway runs, for a jail that must trust it first
/// (`corral kube render`: the certificate goes into the sandbox's ConfigMap, the key into the
/// proxy's Secret, the one place a run CA's key is written). Constrained, like every run CA, to
/// the secrets' host names; [`Gateway::with_ca`] takes it back.
pub fn new_ca(secrets: &[SecretPlan]) -> Result<CaPem, GatewayError> {
    let mut permitted: Vec<String> = Vec::new();
    for plan in secrets {
        for name in host_names(plan)? {
            if !permitted.contains(&name) {
                permitted.push(name);
            }
        }
    }
    ca::new_ca_pem(
        permitted,
        Arc::new(rustls::crypto::ring::default_provider()),
    )
}

fn write_trust(
    dir: &Path,
    system_bundle: Option<&Path>,
    ca: &ca::RunCa,
) -> Result<JailTrust, GatewayError> {
    std::fs::create_dir_all(dir).map_err(|source| GatewayError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let ca_pem = ca.cert_pem();
    let layout = trust_layout(dir);
    let (ca_file, bundle_file) = (layout.ca_file.clone(), layout.bundle_file.clone());
    write_file(&ca_file, ca_pem.as_bytes())?;
    let system = match system_bundle {
        Some(p) => Some(std::fs::read(p).map_err(|source| GatewayError::Io {
            path: p.to_path_buf(),
            source,
        })?),
        None => SYSTEM_BUNDLES.iter().find_map(|p| std::fs::read(p).ok()),
    };
    let mut bundle = system.unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca_pem.as_bytes());
    write_file(&bundle_file, &bundle)?;
    debug_assert!(!ca.cert_der().is_empty());
    Ok(JailTrust {
        ca_pem,
        ca_file,
        bundle_file,
        env: layout.env,
        mounts: layout.mounts,
        system_overlays: layout.system_overlays,
    })
}

/// Where a run's trust files go in the directory `dir`, and what names them in the jail: the
/// CA variables, the read-only bind of `dir`, and the binds of the bundle over the system
/// bundle paths that exist on this host. Pure: nothing is written ([`Gateway::new`] writes
/// the files), so `corral plan` shows what a run attaches.
pub fn trust_layout(dir: &Path) -> TrustLayout {
    let ca_file = dir.join("corral-run-ca.pem");
    let bundle_file = dir.join("ca-bundle.pem");
    let b = bundle_file.display().to_string();
    let c = ca_file.display().to_string();
    let mut env = BTreeMap::new();
    for (k, v) in [
        ("SSL_CERT_FILE", &b),
        ("NODE_EXTRA_CA_CERTS", &c),
        ("REQUESTS_CA_BUNDLE", &b),
        ("CURL_CA_BUNDLE", &b),
        ("GIT_SSL_CAINFO", &b),
        ("PIP_CERT", &b),
        ("NPM_CONFIG_CAFILE", &b),
        ("CARGO_HTTP_CAINFO", &b),
        ("DENO_CERT", &c),
        ("CODEX_CA_CERTIFICATE", &b),
        ("AWS_CA_BUNDLE", &b),
        ("BUN_CA_BUNDLE_PATH", &b),
    ] {
        env.insert(k.to_string(), v.clone());
    }
    let mounts = vec![Mount {
        source: dir.to_path_buf(),
        target: dir.to_path_buf(),
        kind: MountKind::Bind(Access::Ro),
        optional: false,
    }];
    let mut system_overlays = Vec::new();
    for p in SYSTEM_BUNDLES {
        if Path::new(p).is_file() {
            system_overlays.push(Mount {
                source: bundle_file.clone(),
                target: PathBuf::from(p),
                kind: MountKind::Bind(Access::Ro),
                optional: false,
            });
        }
    }
    TrustLayout {
        ca_file,
        bundle_file,
        env,
        mounts,
        system_overlays,
    }
}

#[cfg(test)]
mod tests;
