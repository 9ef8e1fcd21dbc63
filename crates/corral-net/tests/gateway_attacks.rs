//! The proxy's paths to a secret-bound host, attacked: SOCKS5 goes through the credential
//! gateway as a CONNECT does (the client's TLS terminated with the run CA, the placeholder
//! swapped), never an opaque tunnel that would skip it; a plain-HTTP origin that reflects the
//! request gets its answer scrubbed, and TRACE with a credential is refused.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use corral_audit::{AuditLog, Decision, Event};
use corral_gateway::{AuditSink, Gateway, GatewayConfig};
use corral_net::{Listener, Proxy, Rules, StaticResolver};
use corral_policy::domain::DomainPattern;
use corral_policy::plan::SecretPlan;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HOST: &str = "api.socks.test";
const REAL: &str = "sk-proj-SOCKSrealSOCKSrealSOCKSreal012345";

/// Read one request head on `s`, record it in `seen`, answer what `response` makes of the head
/// and its Authorization value (a reflecting origin), and close.
async fn reflect<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    seen: Arc<Mutex<String>>,
    response: impl FnOnce(&str, &str) -> String,
) {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    seen.lock().unwrap().push_str(&head);
    let auth = head
        .lines()
        .find_map(|l| l.strip_prefix("Authorization: "))
        .unwrap_or("");
    let _ = s.write_all(response(&head, auth).as_bytes()).await;
    let _ = s.shutdown().await;
}

/// A TLS origin for HOST (its own CA): records each request head, answers with the
/// Authorization it got (a reflecting origin) and closes.
async fn origin() -> (SocketAddr, rustls::RootCertStore, Arc<Mutex<String>>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![HOST.into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((t, _)) = l.accept().await {
            let (a, seen) = (acceptor.clone(), seen2.clone());
            tokio::spawn(async move {
                let Ok(s) = a.accept(t).await else {
                    return;
                };
                reflect(s, seen, |_, auth| {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{auth}",
                        auth.len()
                    )
                })
                .await;
            });
        }
    });
    (addr, roots, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_to_a_secret_bound_host_goes_through_the_gateway() {
    let (oaddr, roots, seen) = origin().await;
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::at(dir.path().join("audit.jsonl"));
    let (gw, trust) = Gateway::new(
        vec![(
            SecretPlan {
                name: "OPENAI_API_KEY".into(),
                from_env: "OPENAI_API_KEY".into(),
                hosts: vec![DomainPattern::parse(&format!("{HOST}:{}", oaddr.port())).unwrap()],
            },
            REAL.into(),
        )],
        GatewayConfig {
            upstream_roots: Some(roots),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: Some(AuditSink {
                log: log.clone(),
                jail: "testjail".into(),
            }),
        },
    )
    .unwrap();
    let ph = trust.env["OPENAI_API_KEY"].clone();
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let rules = Rules {
        allow: vec![DomainPattern::parse(&format!("{HOST}:{}", oaddr.port())).unwrap()],
        allow_paths: Vec::new(),
        deny: Vec::new(),
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        upstream: None,
    };
    let proxy = Proxy::new(rules, log.clone(), "testjail")
        .with_resolver(Arc::new(StaticResolver::new().with(HOST, &[lo])))
        .with_gateway(gw);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = l.local_addr().unwrap();
    let _handle = corral_net::spawn(Arc::new(proxy), vec![Listener::Proxy(l)]).unwrap();

    // SOCKS5: no authentication, CONNECT to HOST (a name) at the origin's port.
    let mut tcp = tokio::net::TcpStream::connect(paddr).await.unwrap();
    tcp.write_all(&[5, 1, 0]).await.unwrap();
    let mut hello = [0u8; 2];
    tcp.read_exact(&mut hello).await.unwrap();
    assert_eq!(hello, [5, 0]);
    let mut req = vec![5, 1, 0, 3, HOST.len() as u8];
    req.extend_from_slice(HOST.as_bytes());
    req.extend_from_slice(&oaddr.port().to_be_bytes());
    tcp.write_all(&req).await.unwrap();
    let mut reply = [0u8; 10];
    tcp.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[1], 0, "SOCKS5 refused: {reply:?}");

    // TLS trusting the jail's CA only: it verifies only if the gateway answers, not the origin.
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(&trust.ca_pem) {
        roots.add(cert).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from(HOST.to_string()).unwrap(),
            tcp,
        )
        .await
        .expect("TLS with the run CA: the SOCKS5 connection reached the gateway");
    let port = oaddr.port();
    tls.write_all(
        format!("GET /via-socks HTTP/1.1\r\nHost: {HOST}:{port}\r\nAuthorization: Bearer {ph}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut resp = Vec::new();
    let _ = tls.read_to_end(&mut resp).await;
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // The origin reflected the real value; the jail sees its placeholder.
    assert!(resp.ends_with(&format!("Bearer {ph}")), "{resp}");
    assert!(!resp.contains(REAL), "{resp}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains(&format!("Authorization: Bearer {REAL}")),
        "{seen}"
    );

    let (records, _) = log.read_all().unwrap();
    let net: Vec<_> = records
        .into_iter()
        .filter_map(|r| match r.event {
            Event::Net(n) => Some(n),
            _ => None,
        })
        .collect();
    assert!(
        net.iter().any(|n| n.method == "SOCKS5"
            && n.phase == corral_audit::NetPhase::Decision
            && n.decision == Some(Decision::Allow)),
        "{net:?}"
    );
    assert!(
        net.iter()
            .any(|n| n.secret.as_deref() == Some("OPENAI_API_KEY")
                && n.rule
                    .contains("injected into authorization for GET /via-socks")),
        "{net:?}"
    );
    let raw = std::fs::read_to_string(log.path()).unwrap();
    assert!(!raw.contains(REAL), "real value in the audit log");
}

/// The DER certificates of a PEM text.
fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    pem.split("-----END CERTIFICATE-----")
        .filter_map(|block| {
            let start = block.find("-----BEGIN CERTIFICATE-----")?;
            let b64: String = block[start + 27..]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            Some(rustls::pki_types::CertificateDer::from(b64_decode(&b64)))
        })
        .collect()
}

/// Standard base64 decoding (the test crate has no base64 dependency).
fn b64_decode(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = A.iter().position(|a| *a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// A plain-HTTP origin that answers every request with its head reflected: the Authorization in
/// a header, the whole head in a Content-Length body.
async fn plain_echo() -> (SocketAddr, Arc<Mutex<String>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let seen = seen2.clone();
            tokio::spawn(async move {
                reflect(s, seen, |head, auth| {
                    format!(
                        "HTTP/1.1 200 OK\r\nX-Echo: {auth}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{head}",
                        head.len()
                    )
                })
                .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_reflection_is_scrubbed_and_trace_refused() {
    let (oaddr, seen) = plain_echo().await;
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::at(dir.path().join("audit.jsonl"));
    let bound = format!("{HOST}:{}", oaddr.port());
    let (gw, trust) = Gateway::new(
        vec![(
            SecretPlan {
                name: "OPENAI_API_KEY".into(),
                from_env: "OPENAI_API_KEY".into(),
                hosts: vec![DomainPattern::parse(&bound).unwrap()],
            },
            REAL.into(),
        )],
        GatewayConfig {
            upstream_roots: Some(rustls::RootCertStore::empty()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: Some(AuditSink {
                log: log.clone(),
                jail: "testjail".into(),
            }),
        },
    )
    .unwrap();
    let ph = trust.env["OPENAI_API_KEY"].clone();
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let rules = Rules {
        allow: vec![DomainPattern::parse(&bound).unwrap()],
        allow_paths: Vec::new(),
        deny: Vec::new(),
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        upstream: None,
    };
    let proxy = Proxy::new(rules, log.clone(), "testjail")
        .with_resolver(Arc::new(StaticResolver::new().with(HOST, &[lo])))
        .with_gateway(gw);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = l.local_addr().unwrap();
    let _handle = corral_net::spawn(Arc::new(proxy), vec![Listener::Proxy(l)]).unwrap();

    let ask = |method: &str| {
        format!(
            "{method} http://{bound}/echo HTTP/1.1\r\nHost: {bound}\r\nAuthorization: Bearer {ph}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        )
    };
    let mut tcp = tokio::net::TcpStream::connect(paddr).await.unwrap();
    tcp.write_all(ask("GET").as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    let _ = tcp.read_to_end(&mut resp).await;
    let resp = String::from_utf8_lossy(&resp).into_owned();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(!resp.contains(REAL), "the real value came back: {resp}");
    assert!(resp.contains(&format!("X-Echo: Bearer {ph}")), "{resp}");
    assert!(
        resp.contains(&format!("Authorization: Bearer {ph}")),
        "{resp}"
    );
    {
        let seen = seen.lock().unwrap();
        assert!(
            seen.contains(&format!("Authorization: Bearer {REAL}")),
            "{seen}"
        );
        assert!(seen.contains("accept-encoding: identity"), "{seen}");
    }

    let mut tcp = tokio::net::TcpStream::connect(paddr).await.unwrap();
    tcp.write_all(ask("TRACE").as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    let _ = tcp.read_to_end(&mut resp).await;
    let resp = String::from_utf8_lossy(&resp).into_owned();
    assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
    assert!(!resp.contains(REAL), "{resp}");
    assert!(
        !seen.lock().unwrap().contains("TRACE"),
        "TRACE reached the origin"
    );
    let raw = std::fs::read_to_string(log.path()).unwrap();
    assert!(!raw.contains(REAL), "real value in the audit log");
}
