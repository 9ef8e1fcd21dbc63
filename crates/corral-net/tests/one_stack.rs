//! One HTTP/1 stack: the proxy's plain-HTTP path and the credential
//! gateway's TLS-terminated path run the same request loop (`corral_http1::exchange`), so a
//! malformed, oversized or slow request head gets the same answer on both; and the heads a jail
//! sends inside a gateway-intercepted tunnel are counted in the proxy's one budget for partial
//! heads, so the jail cannot make corral hold more by sending them there.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use corral_audit::AuditLog;
use corral_gateway::{Gateway, GatewayConfig};
use corral_net::{Listener, Proxy, ProxyConfig, ProxyHandle, Rules, StaticResolver};
use corral_policy::domain::DomainPattern;
use corral_policy::plan::SecretPlan;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const HOST: &str = "api.onestack.test";
const REAL: &str = "sk-proj-ONESTACKrealONESTACKreal0123456789";

/// A proxy whose gateway binds a secret to `HOST:port`, `HOST` resolving to a TCP listener
/// that accepts and holds (no request here ever reaches an origin).
struct Setup {
    handle: ProxyHandle,
    addr: SocketAddr,
    port: u16,
    client_tls: tokio_rustls::TlsConnector,
    origin: std::net::TcpListener,
    log: AuditLog,
    _dir: tempfile::TempDir,
}

fn setup(config: ProxyConfig) -> Setup {
    let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::at(dir.path().join("audit.jsonl"));
    let bound = DomainPattern::parse(&format!("{HOST}:{port}")).unwrap();
    let (gw, trust) = Gateway::new(
        vec![(
            SecretPlan {
                name: "OPENAI_API_KEY".into(),
                from_env: "OPENAI_API_KEY".into(),
                hosts: vec![bound.clone()],
            },
            REAL.into(),
        )],
        GatewayConfig {
            upstream_roots: Some(rustls::RootCertStore::empty()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: None,
        },
    )
    .unwrap();
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let rules = Rules {
        allow: vec![bound],
        allow_paths: Vec::new(),
        deny: Vec::new(),
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        upstream: None,
    };
    let proxy = Proxy::new(rules, log.clone(), "onestack")
        .with_config(config)
        .with_resolver(Arc::new(StaticResolver::new().with(HOST, &[lo])))
        .with_gateway(gw);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let handle = corral_net::spawn(Arc::new(proxy), vec![Listener::Proxy(l)]).unwrap();
    // The jail's client: trusts the run CA only, so a handshake proves the gateway answers.
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(trust.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Setup {
        handle,
        addr,
        port,
        client_tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
        origin,
        log,
        _dir: dir,
    }
}

/// A TLS connection through the gateway: CONNECT answered 200, then TLS with the run CA.
async fn tunnel(s: &Setup) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let port = s.port;
    let connect = format!("CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n");
    tcp.write_all(connect.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(tcp.read(&mut b).await.unwrap(), 1, "CONNECT answer cut");
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    let name = rustls::pki_types::ServerName::try_from(HOST.to_string()).unwrap();
    s.client_tls
        .connect(name, tcp)
        .await
        .expect("TLS with the run CA: the tunnel reached the gateway")
}

/// Write `data`, then read until the peer closes (or `wait` passes): the status answered, or 0
/// when the connection closed without an answer.
async fn status_after<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    data: &[u8],
    wait: Duration,
) -> u16 {
    let _ = s.write_all(data).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The same bad heads, sent to the proxy as plain-HTTP requests and inside a gateway tunnel,
/// get the same status from the one request loop: too large 431, malformed 400, smuggling
/// (Content-Length with Transfer-Encoding) 400, too many fields 431, unfinished 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_heads_get_the_same_answer_on_the_plain_and_the_gateway_path() {
    let s = setup(ProxyConfig {
        header_timeout: Duration::from_secs(2),
        ..ProxyConfig::default()
    });
    let port = s.port;
    let big = format!("X-Pad: {}\r\n", "a".repeat(40 * 1024));
    let many: String = (0..200).map(|i| format!("X-F{i}: v\r\n")).collect();
    let cases: Vec<(&str, String, u16)> = vec![
        ("too large", format!("{big}\r\n"), 431),
        ("obs-fold", "X-A: 1\r\n  folded\r\n\r\n".into(), 400),
        (
            "CL and TE",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
            400,
        ),
        ("too many fields", format!("{many}\r\n"), 431),
        ("unfinished", "X-A: 1\r\n".into(), 408),
    ];
    for (what, rest, want) in cases {
        let plain = format!("GET http://{HOST}:{port}/p HTTP/1.1\r\nHost: {HOST}:{port}\r\n{rest}");
        let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let wait = Duration::from_secs(20);
        let got_plain = status_after(tcp, plain.as_bytes(), wait).await;
        let inside = format!("GET /p HTTP/1.1\r\nHost: {HOST}:{port}\r\n{rest}");
        let got_tunnel = status_after(tunnel(&s).await, inside.as_bytes(), wait).await;
        assert_eq!(
            (got_plain, got_tunnel),
            (want, want),
            "{what}: plain HTTP answered {got_plain}, the gateway tunnel {got_tunnel}"
        );
    }
    // Idle before a first byte: both close quietly once the head timeout passes.
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let wait = Duration::from_secs(20);
    let idle_plain = status_after(tcp, b"", wait).await;
    let idle_tunnel = status_after(tunnel(&s).await, b"", wait).await;
    assert_eq!((idle_plain, idle_tunnel), (0, 0));
}

/// Many tunnels through the gateway each holding a partial request head of ~31 KiB (never
/// finished): the proxy counts them in its one budget for partial heads, so what it holds stays
/// within it and the tunnels past it get 503 inside TLS. The control, with no budget, shows the
/// heads are really held (and counted) there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_heads_inside_gateway_tunnels_are_counted_in_the_proxy_budget() {
    const KIB: usize = 1024;
    let tunnels = 48;
    let held = |budget: usize| async move {
        let s = setup(ProxyConfig {
            buffer_budget: budget,
            header_timeout: Duration::from_secs(60),
            ..ProxyConfig::default()
        });
        let partial = format!(
            "GET /p HTTP/1.1\r\nHost: {HOST}:{}\r\nX-Pad: {}\r\n",
            s.port,
            "a".repeat(31 * KIB)
        );
        let mut conns = Vec::new();
        for _ in 0..tunnels {
            let mut t = tunnel(&s).await;
            t.write_all(partial.as_bytes()).await.unwrap();
            t.flush().await.unwrap();
            conns.push(t);
        }
        // Wait until the proxy has read what it will read: the held bytes stay the same for a
        // second (or 30 s pass).
        let proxy = s.handle.proxy().clone();
        let (mut last, mut same) = (usize::MAX, 0);
        for _ in 0..300 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = proxy.buffered_bytes();
            same = if now == last { same + 1 } else { 0 };
            last = now;
            if same == 10 {
                break;
            }
        }
        let mut refused = 0;
        for t in &mut conns {
            let mut buf = [0u8; 12];
            // A refusal was sent at once: it is there to read, or nothing comes.
            let r = tokio::time::timeout(Duration::from_millis(200), t.read_exact(&mut buf)).await;
            if matches!(r, Ok(Ok(_))) && &buf == b"HTTP/1.1 503" {
                refused += 1;
            }
        }
        (last, refused)
    };
    let (unbounded, none_refused) = held(usize::MAX).await;
    assert_eq!(none_refused, 0);
    assert!(
        unbounded > tunnels * 31 * KIB,
        "control: {tunnels} partial heads in gateway tunnels should be counted (over {} bytes), counted {unbounded}",
        tunnels * 31 * KIB
    );
    let budget = 512 * KIB;
    let (bounded, refused) = held(budget).await;
    assert!(
        bounded <= budget,
        "held {bounded} bytes over a {budget}-byte budget"
    );
    assert!(
        refused >= tunnels / 2,
        "only {refused} of {tunnels} refused"
    );
}

/// A gateway-intercepted connection still open when the proxy shuts down gets its close
/// record, with the bytes on the wire to the destination (the gateway's own counts come only
/// when it returns). Control: none before the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intercepted_connection_open_at_shutdown_is_recorded_with_its_bytes() {
    use corral_audit::{Event, NetPhase};
    let mut s = setup(ProxyConfig::default());
    let mut tls = tunnel(&s).await;
    let req = format!("GET /x HTTP/1.1\r\nHost: {HOST}:{}\r\n\r\n", s.port);
    tls.write_all(req.as_bytes()).await.unwrap();
    // The gateway dials the origin's TLS for the request: its hello arrives, never answered.
    let origin = s.origin.try_clone().unwrap();
    let (held, hello) = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let (mut c, _) = origin.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut b = [0u8; 4096];
        let n = c.read(&mut b).unwrap();
        (c, n as u64)
    })
    .await
    .unwrap();
    assert!(hello > 0);
    let closes = |log: &AuditLog| {
        let (records, _) = log.read_all().unwrap();
        records
            .into_iter()
            .filter_map(|r| match r.event {
                Event::Net(n) if n.phase == NetPhase::Close => Some(n),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert!(closes(&s.log).is_empty(), "control: the connection is open");
    tokio::task::block_in_place(|| s.handle.shutdown());
    let got = closes(&s.log);
    assert_eq!(got.len(), 1, "{got:?}");
    let c = &got[0];
    assert_eq!(c.method, "CONNECT");
    assert_eq!(c.rule, "closed by corral: the proxy shut down");
    assert!(c.bytes_up >= hello, "{c:?}: the origin read {hello} bytes");
    assert_eq!(c.bytes_down, 0, "{c:?}");
    drop(held);
}
