//! The proxy with the credential gateway in front of secret-bound hosts: curl, trusting only the
//! jail's CA bundle, goes through a real `Proxy` to a TLS mock upstream (its own test CA) and a
//! plain-HTTP mock; the upstreams see the real value, never the placeholder.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use corral_audit::{AuditLog, Decision, Event};
use corral_gateway::{AuditSink, Gateway, GatewayConfig};
use corral_net::{Listener, Proxy, Rules, StaticResolver};
use corral_policy::domain::DomainPattern;
use corral_policy::plan::SecretPlan;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HOST: &str = "api.model.test";
const REAL: &str = "sk-proj-REALrealREALrealREALreal0123456789";

/// Reads one request head, records it, answers 200 and closes.
async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    seen: Arc<Mutex<String>>,
) {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    seen.lock()
        .unwrap()
        .push_str(&String::from_utf8_lossy(&buf));
    let _ = s
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        .await;
    let _ = s.shutdown().await;
}

struct Mocks {
    tls: SocketAddr,
    plain: SocketAddr,
    roots: rustls::RootCertStore,
    seen: Arc<Mutex<String>>,
}

async fn mocks() -> Mocks {
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
    let seen = Arc::new(Mutex::new(String::new()));
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (tls_addr, plain_addr) = (tls.local_addr().unwrap(), plain.local_addr().unwrap());
    let s1 = seen.clone();
    tokio::spawn(async move {
        while let Ok((t, _)) = tls.accept().await {
            let (a, s) = (acceptor.clone(), s1.clone());
            tokio::spawn(async move {
                if let Ok(t) = a.accept(t).await {
                    answer(t, s).await;
                }
            });
        }
    });
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((t, _)) = plain.accept().await {
            tokio::spawn(answer(t, s2.clone()));
        }
    });
    Mocks {
        tls: tls_addr,
        plain: plain_addr,
        roots,
        seen,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_bound_connect_and_plain_http_carry_the_real_value() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: no curl binary");
        return;
    }
    let m = mocks().await;
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::at(dir.path().join("audit.jsonl"));
    let (gw, trust) = Gateway::new(
        vec![(
            SecretPlan {
                name: "OPENAI_API_KEY".into(),
                from_env: "OPENAI_API_KEY".into(),
                // The name for TLS; plain HTTP only on the port named explicitly.
                hosts: vec![
                    DomainPattern::parse(HOST).unwrap(),
                    DomainPattern::parse(&format!("{HOST}:{}", m.plain.port())).unwrap(),
                ],
            },
            REAL.into(),
        )],
        GatewayConfig {
            upstream_roots: Some(m.roots.clone()),
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
        allow: vec![
            DomainPattern::parse(&format!("{HOST}:{}", m.tls.port())).unwrap(),
            DomainPattern::parse(&format!("{HOST}:{}", m.plain.port())).unwrap(),
            DomainPattern::parse(&format!("other.test:{}", m.plain.port())).unwrap(),
        ],
        allow_paths: Vec::new(),
        deny: Vec::new(),
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        upstream: None,
    };
    let proxy = Proxy::new(rules, log.clone(), "testjail")
        .with_resolver(Arc::new(
            StaticResolver::new()
                .with(HOST, &[lo])
                .with("other.test", &[lo]),
        ))
        .with_gateway(gw);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = l.local_addr().unwrap();
    let _handle = corral_net::spawn(Arc::new(proxy), vec![Listener::Proxy(l)]).unwrap();

    let curl = |url: String| {
        let bundle = trust.bundle_file.clone();
        let ph = ph.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-sS", "--noproxy", "", "--proxy"])
                .arg(format!("http://{paddr}"))
                .arg("--cacert")
                .arg(bundle)
                .args(["-H", &format!("Authorization: Bearer {ph}")])
                .arg(url)
                .env_remove("HTTPS_PROXY")
                .env_remove("https_proxy")
                .env_remove("HTTP_PROXY")
                .env_remove("http_proxy")
                .output()
                .unwrap()
        })
    };
    let tls_port = m.tls.port();
    let out = curl(format!("https://{HOST}:{tls_port}/v1/chat"))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"ok");
    let seen = m.seen.lock().unwrap().clone();
    assert!(
        seen.contains(&format!("Authorization: Bearer {REAL}\r\n")),
        "{seen}"
    );
    assert!(!seen.contains(&ph), "{seen}");

    // Plain HTTP to the bound host: swapped. To another host: the placeholder, audited.
    let plain_port = m.plain.port();
    let out = curl(format!("http://{HOST}:{plain_port}/plain"))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = curl(format!("http://other.test:{plain_port}/elsewhere"))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = m.seen.lock().unwrap().clone();
    let plain_req = seen.split("GET /plain").nth(1).expect("plain request seen");
    assert!(plain_req.contains(&format!("Bearer {REAL}")), "{seen}");
    let elsewhere = seen
        .split("GET /elsewhere")
        .nth(1)
        .expect("second request seen");
    assert!(
        elsewhere.contains(&format!("Bearer {ph}")) && !elsewhere.contains(REAL),
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
        net.iter()
            .any(|n| n.secret.as_deref() == Some("OPENAI_API_KEY")
                && n.host == "other.test"
                && n.decision == Some(Decision::Deny)
                && n.rule.contains("placeholder sent to unbound host")),
        "{net:?}"
    );
    assert_eq!(
        net.iter()
            .filter(|n| n.secret.is_some() && n.decision == Some(Decision::Allow))
            .count(),
        2,
        "{net:?}"
    );
    let raw = std::fs::read_to_string(log.path()).unwrap();
    assert!(!raw.contains(REAL), "real value in the audit log");
}

/// A client stream that hides the proxy's `200` answer from the TLS layer: lets a test send its
/// ClientHello right behind the CONNECT head, before the answer arrives (pipelined).
struct AfterConnect {
    inner: tokio::net::TcpStream,
    skipped: usize,
}

const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

impl tokio::io::AsyncRead for AfterConnect {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        while self.skipped < ESTABLISHED.len() {
            let mut b = [0u8; 64];
            let want = ESTABLISHED.len() - self.skipped;
            let mut rb = tokio::io::ReadBuf::new(&mut b[..want]);
            match std::pin::Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
                std::task::Poll::Ready(Ok(())) => {
                    let got = rb.filled();
                    if got.is_empty() {
                        return std::task::Poll::Ready(Ok(()));
                    }
                    let at = self.skipped;
                    assert_eq!(got, &ESTABLISHED[at..at + got.len()]);
                    self.skipped += got.len();
                }
                other => return other,
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for AfterConnect {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hello_pipelined_behind_the_connect_is_not_lost() {
    let m = mocks().await;
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::at(dir.path().join("audit.jsonl"));
    let (gw, trust) = Gateway::new(
        vec![(
            SecretPlan {
                name: "OPENAI_API_KEY".into(),
                from_env: "OPENAI_API_KEY".into(),
                hosts: vec![DomainPattern::parse(HOST).unwrap()],
            },
            REAL.into(),
        )],
        GatewayConfig {
            upstream_roots: Some(m.roots.clone()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: None,
        },
    )
    .unwrap();
    let ph = trust.env["OPENAI_API_KEY"].clone();
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let rules = Rules {
        allow: vec![DomainPattern::parse(&format!("{HOST}:{}", m.tls.port())).unwrap()],
        allow_paths: Vec::new(),
        deny: Vec::new(),
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        upstream: None,
    };
    let proxy = Proxy::new(rules, log, "testjail")
        .with_resolver(Arc::new(StaticResolver::new().with(HOST, &[lo])))
        .with_gateway(gw);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = l.local_addr().unwrap();
    let _handle = corral_net::spawn(Arc::new(proxy), vec![Listener::Proxy(l)]).unwrap();

    // The CONNECT head, then at once the TLS handshake, without waiting for the 200.
    let mut tcp = tokio::net::TcpStream::connect(paddr).await.unwrap();
    let port = m.tls.port();
    tcp.write_all(
        format!("CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    let pem = trust
        .ca_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<String>();
    roots
        .add(rustls::pki_types::CertificateDer::from(b64(&pem)))
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let stream = AfterConnect {
        inner: tcp,
        skipped: 0,
    };
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from(HOST.to_string()).unwrap(),
            stream,
        )
        .await
        .expect("TLS through the gateway with a pipelined ClientHello");
    tls.write_all(
        format!(
            "GET /pipelined HTTP/1.1\r\nHost: {HOST}:{port}\r\nAuthorization: Bearer {ph}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut resp = Vec::new();
    let _ = tls.read_to_end(&mut resp).await;
    assert!(resp.ends_with(b"ok"), "{}", String::from_utf8_lossy(&resp));
    let seen = m.seen.lock().unwrap().clone();
    assert!(
        seen.contains("GET /pipelined") && seen.contains(&format!("Bearer {REAL}")),
        "{seen}"
    );
}

/// Standard base64 decoding (the test crate has no base64 dependency).
fn b64(s: &str) -> Vec<u8> {
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
