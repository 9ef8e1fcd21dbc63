//! Attacks on "the real secret never comes back to the jail", tried for real: a jail-side client
//! (trusting only the jail's CA) talks through the gateway to a TLS mock origin on loopback that
//! is lenient the way real servers are (bare LF line ends, 32-bit chunk sizes) or that reflects
//! what it receives (headers and body echoed back, chunked or Content-Length framed).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use corral_audit::{AuditLog, Decision, Event};
use corral_gateway::{AuditSink, Gateway, GatewayConfig, JailTrust, Prefixed, Timeouts};
use corral_http1::io::{BufConn, relay_body};
use corral_http1::{
    Framing, ResponseHead, parse_request_head, parse_response_head, response_framing,
};
use corral_policy::domain::{DomainPattern, Host};
use corral_policy::plan::SecretPlan;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BOUND: &str = "api.model.test";
const REAL: &str = "sk-ant-api03-REALvalueREALvalueREALvalue0123456789";
/// Guard for every wait in these tests: a gateway that hangs fails the test instead of hanging
/// it (no assertion is about how long anything took).
const GUARD: Duration = Duration::from_secs(20);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How the mock origin treats what it receives.
#[derive(Clone, Copy)]
enum Origin {
    /// Bare LF ends a line, chunk sizes are read into 32 bits; each request is answered with
    /// the Authorization it carried and its body.
    Lenient,
    /// Strict parsing; the answer reflects the whole request (head and body) in its body and its
    /// Authorization in a response header. `/chunked` answers in 7-byte chunks (every value is
    /// split across chunks), `/gzip` claims `Content-Encoding: gzip`, `/ws` switches protocols
    /// and reflects the request in the upgraded stream, anything else is Content-Length
    /// framed.
    Echo,
}

/// The mock origin: TLS for BOUND with its own CA; records every byte it receives and every
/// request target it parsed.
struct Mock {
    addr: SocketAddr,
    roots: RootCertStore,
    raw: Arc<Mutex<Vec<u8>>>,
    targets: Arc<Mutex<Vec<String>>>,
}

impl Mock {
    fn raw(&self) -> String {
        String::from_utf8_lossy(&self.raw.lock().unwrap()).into_owned()
    }
    fn targets(&self) -> Vec<String> {
        self.targets.lock().unwrap().clone()
    }
}

async fn mock(kind: Origin) -> Mock {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![BOUND.into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let raw = Arc::new(Mutex::new(Vec::new()));
    let targets = Arc::new(Mutex::new(Vec::new()));
    let (raw2, targets2) = (raw.clone(), targets.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let (raw, targets) = (raw2.clone(), targets2.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let io = Recording { inner: tls, raw };
                match kind {
                    Origin::Lenient => lenient(io, targets).await,
                    Origin::Echo => echo(io, targets).await,
                }
            });
        }
    });
    Mock {
        addr,
        roots,
        raw,
        targets,
    }
}

/// A stream that appends everything read from it to `raw`.
struct Recording<S> {
    inner: S,
    raw: Arc<Mutex<Vec<u8>>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Recording<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let new = buf.filled()[before..].to_vec();
        self.raw.lock().unwrap().extend_from_slice(&new);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Recording<S> {
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

/// One line ended by LF (a CR before it dropped), as lenient servers read them.
async fn lf_line<S: AsyncRead + Unpin>(io: &mut S, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = buf.drain(..=i).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Some(String::from_utf8_lossy(&line).into_owned());
        }
        let mut b = [0u8; 4096];
        match io.read(&mut b).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
}

async fn take<S: AsyncRead + Unpin>(io: &mut S, buf: &mut Vec<u8>, n: usize) -> Option<Vec<u8>> {
    while buf.len() < n {
        let mut b = [0u8; 4096];
        match io.read(&mut b).await {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&b[..k]),
        }
    }
    Some(buf.drain(..n).collect())
}

/// The lenient origin's loop.
async fn lenient<S: AsyncRead + AsyncWrite + Unpin>(mut io: S, targets: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(line) = lf_line(&mut io, &mut buf).await else {
            return;
        };
        if line.is_empty() {
            continue;
        }
        let target = line.split(' ').nth(1).unwrap_or("").to_string();
        targets.lock().unwrap().push(target);
        let (mut auth, mut cl, mut chunked) = (String::new(), 0usize, false);
        loop {
            let Some(h) = lf_line(&mut io, &mut buf).await else {
                return;
            };
            if h.is_empty() {
                break;
            }
            let (n, v) = h.split_once(':').unwrap_or((&h, ""));
            match n.trim().to_ascii_lowercase().as_str() {
                "authorization" => auth = v.trim().to_string(),
                "content-length" => cl = v.trim().parse().unwrap_or(0),
                "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let Some(size) = lf_line(&mut io, &mut buf).await else {
                    return;
                };
                // A 32-bit size: the low 8 hex digits.
                let hex = size.split(';').next().unwrap_or("").trim();
                let low = &hex[hex.len().saturating_sub(8)..];
                let n = u32::from_str_radix(low, 16).unwrap_or(0) as usize;
                if n == 0 {
                    // Trailer lines up to an empty one.
                    while let Some(t) = lf_line(&mut io, &mut buf).await {
                        if t.is_empty() {
                            break;
                        }
                    }
                    break;
                }
                let Some(data) = take(&mut io, &mut buf, n).await else {
                    return;
                };
                body.extend_from_slice(&data);
                let _ = lf_line(&mut io, &mut buf).await;
            }
        } else if cl > 0 {
            let Some(data) = take(&mut io, &mut buf, cl).await else {
                return;
            };
            body = data;
        }
        let text = format!("auth={auth}\nbody={}", String::from_utf8_lossy(&body));
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if io.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The reflecting origin's loop.
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(io: S, targets: Arc<Mutex<Vec<String>>>) {
    let mut conn = BufConn::new(io);
    loop {
        let Ok(Some(head)) = conn.read_head(GUARD, GUARD).await else {
            return;
        };
        let Ok(req) = parse_request_head(&head) else {
            return;
        };
        targets.lock().unwrap().push(req.target.clone());
        let mut reflected = head.to_vec();
        if relay_body(
            &mut conn,
            &mut reflected,
            (req.framing, Framing::UntilClose),
            GUARD,
            None,
        )
        .await
        .is_err()
        {
            return;
        }
        let auth = corral_http1::header_values(&req.headers, "authorization")
            .next()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        if req.target == "/ws" {
            // A websocket-style upgrade: 101, then the request reflected in the stream.
            let mut resp =
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                    .to_vec();
            resp.extend_from_slice(&reflected);
            let _ = conn.io.write_all(&resp).await;
            let _ = conn.io.flush().await;
            let _ = conn.io.shutdown().await;
            return;
        }
        let mut resp = format!("HTTP/1.1 200 OK\r\nX-Echo-Authorization: {auth}\r\n").into_bytes();
        if req.target == "/chunked" {
            resp.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            for piece in reflected.chunks(7) {
                resp.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                resp.extend_from_slice(piece);
                resp.extend_from_slice(b"\r\n");
            }
            resp.extend_from_slice(b"0\r\n\r\n");
        } else {
            if req.target == "/gzip" {
                resp.extend_from_slice(b"Content-Encoding: gzip\r\n");
            }
            resp.extend_from_slice(
                format!("Content-Length: {}\r\n\r\n", reflected.len()).as_bytes(),
            );
            resp.extend_from_slice(&reflected);
        }
        if conn.io.write_all(&resp).await.is_err() {
            return;
        }
        let _ = conn.io.flush().await;
    }
}

struct Setup {
    gw: Gateway,
    trust: JailTrust,
    audit: AuditLog,
    _dir: tempfile::TempDir,
}

fn setup(roots: &RootCertStore, secrets: &[(&str, &str)]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let audit = AuditLog::at(dir.path().join("audit.jsonl"));
    let plans = secrets
        .iter()
        .map(|(name, real)| {
            (
                SecretPlan {
                    name: (*name).into(),
                    from_env: format!("CALLER_{name}"),
                    hosts: vec![DomainPattern::parse(BOUND).unwrap()],
                },
                (*real).to_string(),
            )
        })
        .collect();
    let (gw, trust) = Gateway::new(
        plans,
        GatewayConfig {
            upstream_roots: Some(roots.clone()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: Some(AuditSink {
                log: audit.clone(),
                jail: "attack-jail".into(),
            }),
        },
    )
    .unwrap();
    Setup {
        gw,
        trust,
        audit,
        _dir: dir,
    }
}

/// Short deadlines for the tests that wait on them.
const SHORT: Timeouts = Timeouts {
    head: Duration::from_millis(300),
    idle: Duration::from_millis(600),
};

/// A stand-in for the proxy: answers `CONNECT`, then hands the stream to the gateway with
/// `upstream` as the checked address (dialled by the proxy and passed over, as corral-net does).
async fn proxy(gw: Gateway, upstream: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, peer)) = listener.accept().await {
            let gw = gw.clone();
            tokio::spawn(async move {
                let mut conn = BufConn::new(tcp);
                let Ok(Some(head)) = conn.read_head(GUARD, GUARD).await else {
                    return;
                };
                let req = parse_request_head(&head).unwrap();
                let (host, port) = req.target.rsplit_once(':').unwrap();
                let host = Host::Name(host.to_string());
                let port: u16 = port.parse().unwrap();
                conn.io
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let client = Prefixed::new(conn.buf.to_vec(), conn.io);
                match TcpStream::connect(upstream).await {
                    Ok(up) => {
                        let _ = gw
                            .intercept_over(client, up, &host, port, upstream, &peer.to_string())
                            .await;
                    }
                    // Nothing listens there: let the gateway try (and fail) itself.
                    Err(_) => {
                        let _ = gw
                            .intercept(client, &host, port, upstream, &peer.to_string())
                            .await;
                    }
                }
            });
        }
    });
    addr
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// A jail-side TLS client through the proxy stand-in, trusting the jail's CA only.
async fn client(trust: &JailTrust, proxy: SocketAddr) -> BufConn<Tls> {
    let b64: String = trust
        .ca_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from(der)).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(format!("CONNECT {BOUND}:443 HTTP/1.1\r\nHost: {BOUND}:443\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 39];
    tcp.read_exact(&mut buf).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(BOUND.to_string()).unwrap(), tcp)
        .await
        .unwrap();
    BufConn::new(tls)
}

/// Send raw bytes, read one response (head and decoded body); `None` if the gateway closed
/// without answering.
async fn send(c: &mut BufConn<Tls>, req: &[u8]) -> Option<(ResponseHead, Vec<u8>)> {
    c.io.write_all(req).await.unwrap();
    c.io.flush().await.unwrap();
    tokio::time::timeout(GUARD, async {
        let head = c.read_head(GUARD, GUARD).await.ok()??;
        let resp = parse_response_head(&head).ok()?;
        let f = response_framing(&resp, "GET").ok()?;
        let mut body = Vec::new();
        relay_body(c, &mut body, (f, Framing::UntilClose), GUARD, None)
            .await
            .ok()?;
        Some((resp, body))
    })
    .await
    .expect("the gateway neither answered nor closed")
}

/// Everything the client got, as text.
fn text((resp, body): &(ResponseHead, Vec<u8>)) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&resp.to_bytes()),
        String::from_utf8_lossy(body)
    )
}

fn basic_of(v: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("user:{v}"))
}

/// Wait (bounded) until the origin has parsed `n` requests or a little while has passed.
async fn settle(m: &Mock, n: usize) {
    for _ in 0..50 {
        if m.targets().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_request_smuggled_in_chunk_trailers_never_reaches_the_origin() {
    let m = mock(Origin::Lenient).await;
    let s = setup(&m.roots, &[("API_KEY", REAL)]);
    let ph = s.trust.env["API_KEY"].clone();
    let p = proxy(s.gw.clone(), m.addr).await;
    let mut c = client(&s.trust, p).await;
    // The trailer "line" holds, behind bare LFs, the head of a request whose body is the next
    // 400 bytes the gateway sends on this upstream connection: the next request, with the real
    // value injected. A lenient origin echoes it back as the answer to that next request.
    let smuggle = format!(
        "POST /first HTTP/1.1\r\nHost: {BOUND}\r\nTransfer-Encoding: chunked\r\n\r\n\
         0\r\nX: a\n\nPOST /smuggled HTTP/1.1\nHost: {BOUND}\nContent-Length: 400\n\r\n\r\n"
    );
    let first = send(&mut c, smuggle.as_bytes()).await;
    let second = if first.as_ref().is_some_and(|(r, _)| r.status == 200) {
        let pad = "p".repeat(400);
        let next = format!(
            "POST /next HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer {ph}\r\nContent-Length: 400\r\n\r\n{pad}"
        );
        send(&mut c, next.as_bytes()).await
    } else {
        None
    };
    let got: String = [first.as_ref(), second.as_ref()]
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    assert!(!got.contains(REAL), "the real value came back: {got}");
    let (resp, body) = first.expect("an answer to the smuggling request");
    assert_eq!(resp.status, 400, "{}", String::from_utf8_lossy(&body));
    assert!(
        String::from_utf8_lossy(&body).contains("bare LF"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    settle(&m, 2).await;
    assert!(
        !m.targets().iter().any(|t| t == "/smuggled"),
        "the origin parsed the smuggled request: {:?}",
        m.targets()
    );
    assert!(!m.raw().contains("/smuggled"), "{}", m.raw());
}

#[tokio::test]
async fn an_oversized_chunk_size_is_rechunked_not_forwarded() {
    let m = mock(Origin::Lenient).await;
    let s = setup(&m.roots, &[("API_KEY", REAL)]);
    let p = proxy(s.gw.clone(), m.addr).await;
    let mut c = client(&s.trust, p).await;
    // 0x1_0000_0028 bytes announced; a 32-bit origin reads 0x28 (40) and takes what follows
    // those 40 bytes as a second request.
    let inner = format!("\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: {BOUND}\r\n\r\n");
    let data = format!("{}{inner}", "d".repeat(40));
    let req = format!(
        "POST /first HTTP/1.1\r\nHost: {BOUND}\r\nTransfer-Encoding: chunked\r\n\r\n100000028\r\n{data}"
    );
    c.io.write_all(req.as_bytes()).await.unwrap();
    c.io.flush().await.unwrap();
    // The client stops there (its chunk never completes) and goes away.
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.io.shutdown().await.unwrap();
    drop(c);
    settle(&m, 2).await;
    let raw = m.raw();
    assert!(
        !m.targets().iter().any(|t| t == "/smuggled"),
        "the origin parsed a second request: {:?} in {raw:?}",
        m.targets()
    );
    assert!(
        !raw.contains("100000028"),
        "the chunk size was forwarded verbatim: {raw:?}"
    );
}

#[tokio::test]
async fn a_slow_client_is_cut_off() {
    let m = mock(Origin::Echo).await;
    let s = setup(&m.roots, &[("API_KEY", REAL)]);
    let p = proxy(s.gw.clone().with_timeouts(SHORT), m.addr).await;
    // A head that never ends: 408, then the connection closes.
    let mut c = client(&s.trust, p).await;
    let (resp, _) = send(
        &mut c,
        format!("GET /a HTTP/1.1\r\nHost: {BOUND}\r\n").as_bytes(),
    )
    .await
    .expect("a 408");
    assert_eq!(resp.status, 408);
    // A body that never completes: 408 as well, and the origin's request is abandoned.
    let mut c = client(&s.trust, p).await;
    let req = format!("POST /b HTTP/1.1\r\nHost: {BOUND}\r\nContent-Length: 10\r\n\r\nabc");
    let (resp, _) = send(&mut c, req.as_bytes()).await.expect("a 408");
    assert_eq!(resp.status, 408);
    // And the connection is closed after it.
    let mut rest = Vec::new();
    let n = tokio::time::timeout(GUARD, c.io.read_to_end(&mut rest))
        .await
        .expect("the gateway kept the connection open");
    assert!(n.is_ok() || rest.is_empty());
}

#[tokio::test]
async fn reflected_credentials_come_back_as_placeholders() {
    let m = mock(Origin::Echo).await;
    let s = setup(&m.roots, &[("API_KEY", REAL)]);
    let ph = s.trust.env["API_KEY"].clone();
    assert_eq!(ph.len(), REAL.len());
    let p = proxy(s.gw.clone(), m.addr).await;
    let mut c = client(&s.trust, p).await;
    let bearer = format!("Bearer {ph}");
    let basic = format!("Basic {}", basic_of(&ph));
    // Content-Length and chunked answers, Bearer and Basic, on one kept-alive connection.
    for (path, auth) in [
        ("/cl", &bearer),
        ("/chunked", &bearer),
        ("/cl", &basic),
        ("/chunked", &basic),
    ] {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: {auth}\r\nAccept-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"
        );
        let got = send(&mut c, req.as_bytes()).await.expect("an answer");
        let all = text(&got);
        assert_eq!(got.0.status, 200, "{all}");
        assert!(
            !all.contains(REAL),
            "{path}: the real value came back: {all}"
        );
        assert!(
            !all.contains(&basic_of(REAL)),
            "{path}: the real Basic credential came back: {all}"
        );
        // What the jail sent is what it sees reflected.
        assert_eq!(
            corral_http1::header_values(&got.0.headers, "x-echo-authorization").next(),
            Some(auth.as_bytes()),
            "{all}"
        );
        assert!(
            String::from_utf8_lossy(&got.1).contains(&format!("Authorization: {auth}\r\n")),
            "{all}"
        );
    }
    // The origin did get the real values, uncompressed answers asked for.
    let raw = m.raw();
    assert!(raw.contains(&format!("Bearer {REAL}")), "{raw}");
    assert!(raw.contains(&basic_of(REAL)), "{raw}");
    assert!(raw.contains("accept-encoding: identity"), "{raw}");
    assert!(!raw.contains("gzip"), "{raw}");
}

#[tokio::test]
async fn a_placeholder_longer_than_the_value_reframes_the_answer() {
    // A value with fewer than 20 random characters gets a longer placeholder: scrubbing then
    // changes lengths, so a Content-Length answer is re-framed chunked.
    let short = "shortreal9";
    let m = mock(Origin::Echo).await;
    let s = setup(&m.roots, &[("SHORT", short)]);
    let ph = s.trust.env["SHORT"].clone();
    assert!(ph.len() > short.len());
    let p = proxy(s.gw.clone(), m.addr).await;
    let mut c = client(&s.trust, p).await;
    for _ in 0..2 {
        let req = format!("GET /cl HTTP/1.1\r\nHost: {BOUND}\r\nx-api-key: {ph}\r\n\r\n");
        let got = send(&mut c, req.as_bytes()).await.expect("an answer");
        let all = text(&got);
        assert!(!all.contains(short), "{all}");
        assert!(all.contains(&format!("x-api-key: {ph}")), "{all}");
        assert_eq!(
            corral_http1::header_values(&got.0.headers, "transfer-encoding").next(),
            Some(&b"chunked"[..]),
            "{all}"
        );
    }
    assert!(m.raw().contains(&format!("x-api-key: {short}")));
}

#[tokio::test]
async fn trace_and_compressed_answers_are_refused() {
    let m = mock(Origin::Echo).await;
    let s = setup(&m.roots, &[("API_KEY", REAL)]);
    let ph = s.trust.env["API_KEY"].clone();
    let p = proxy(s.gw.clone(), m.addr).await;
    let mut c = client(&s.trust, p).await;
    let req = format!("TRACE /t HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer {ph}\r\n\r\n");
    let got = send(&mut c, req.as_bytes()).await.expect("an answer");
    assert_eq!(got.0.status, 405, "{}", text(&got));
    assert!(text(&got).contains("TRACE"), "{}", text(&got));
    // An origin that compresses although asked not to: its answer cannot be checked.
    let mut c = client(&s.trust, p).await;
    let req = format!("GET /gzip HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer {ph}\r\n\r\n");
    let got = send(&mut c, req.as_bytes()).await.expect("an answer");
    assert_eq!(got.0.status, 502, "{}", text(&got));
    assert!(!text(&got).contains(REAL));
    settle(&m, 1).await;
    assert_eq!(
        m.targets(),
        vec!["/gzip".to_string()],
        "TRACE reached the origin"
    );
    let (recs, _) = s.audit.read_all().unwrap();
    assert!(
        recs.iter().any(|r| matches!(&r.event, Event::Net(n)
            if n.decision == Some(Decision::Deny) && n.method == "TRACE")),
        "{recs:?}"
    );
}

#[tokio::test]
async fn injected_is_audited_only_when_the_request_was_sent() {
    // Nothing listens at the checked address: the gateway's own dial fails.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let m = mock(Origin::Echo).await;
    let s = setup(&m.roots, &[("API_KEY", REAL)]);
    let ph = s.trust.env["API_KEY"].clone();
    let p = proxy(s.gw.clone(), dead).await;
    let mut c = client(&s.trust, p).await;
    let req = format!("GET /x HTTP/1.1\r\nHost: {BOUND}\r\nAuthorization: Bearer {ph}\r\n\r\n");
    let _ = send(&mut c, req.as_bytes()).await;
    // The gateway's connection ends with its error record; wait for it.
    let mut recs = Vec::new();
    for _ in 0..100 {
        recs = s.audit.read_all().unwrap().0;
        if !recs.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!recs.is_empty(), "the failed dial was not audited");
    assert!(
        !recs.iter().any(|r| matches!(&r.event, Event::Net(n)
            if n.decision == Some(Decision::Allow) && n.rule.contains("injected"))),
        "injected audited for a request never sent: {recs:?}"
    );
}

#[tokio::test]
async fn reflection_in_an_upgraded_stream_is_scrubbed() {
    let m = mock(Origin::Echo).await;
    let s = setup(&m.roots, &[("API_KEY", REAL)]);
    let ph = s.trust.env["API_KEY"].clone();
    let p = proxy(s.gw.clone(), m.addr).await;
    let mut c = client(&s.trust, p).await;
    let req = format!(
        "GET /ws HTTP/1.1\r\nHost: {BOUND}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Extensions: permessage-deflate\r\nAuthorization: Bearer {ph}\r\n\r\n"
    );
    c.io.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(GUARD, c.io.read_to_end(&mut got))
        .await
        .expect("the gateway kept the upgraded stream open")
        .ok();
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 101"), "{got}");
    assert!(!got.contains(REAL), "the real value came back: {got}");
    assert!(
        got.contains(&format!("Authorization: Bearer {ph}")),
        "{got}"
    );
    let raw = m.raw();
    assert!(raw.contains(&format!("Bearer {REAL}")), "{raw}");
    assert!(
        !raw.to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "{raw}"
    );
}
