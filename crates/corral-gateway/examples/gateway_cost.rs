//! What the credential gateway costs per request and per streamed chunk (docs/BENCHMARKS.md,
//! "Credential gateway: cost per request and per streamed chunk"). An in-process TLS origin
//! (its own test CA) on loopback; a client on one kept-alive TLS connection, either straight to
//! the origin or through `Gateway::intercept_over` (TLS terminated, placeholder swapped,
//! answer scrubbed, TLS again):
//!
//! - 2,000 sequential small requests (`Authorization: Bearer ...`, 6-byte answer);
//! - one SSE answer of 2,000 small events, each its own chunk, flushed one by one.
//!
//! Each is run 7 times; the median is printed. `cargo run --release -p corral-gateway
//! --example gateway_cost`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_gateway::{Gateway, GatewayConfig};
use corral_http1::io::{BufConn, relay_body};
use corral_http1::{Framing, parse_response_head, response_framing};
use corral_policy::domain::{DomainPattern, Host};
use corral_policy::plan::SecretPlan;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncWriteExt, duplex};
use tokio::net::{TcpListener, TcpStream};

const HOST: &str = "api.bench.test";
const REAL: &str = "sk-ant-api03-BENCHrealBENCHrealBENCHrealBENCHreal0123";
const REQUESTS: usize = 2000;
const EVENTS: usize = 2000;
const RUNS: usize = 7;
const T: Duration = Duration::from_secs(30);

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The origin: `/sse` streams EVENTS chunks, anything else answers `hello\n`.
async fn origin() -> (SocketAddr, RootCertStore) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![HOST.into()])
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
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let _ = tcp.set_nodelay(true);
            let a = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = a.accept(tcp).await else {
                    return;
                };
                serve(BufConn::new(tls)).await;
            });
        }
    });
    (addr, roots)
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut c: BufConn<S>) {
    while let Ok(Some(head)) = c.read_head(T, T).await {
        let sse = head.starts_with(b"GET /sse ");
        if !sse {
            if c.io
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n")
                .await
                .is_err()
            {
                return;
            }
            let _ = c.io.flush().await;
            continue;
        }
        let _ = c
            .io
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await;
        for i in 0..EVENTS {
            let ev = format!("data: {{\"i\":{i},\"delta\":\"tok\"}}\n\n");
            let chunk = format!("{:x}\r\n{ev}\r\n", ev.len());
            if c.io.write_all(chunk.as_bytes()).await.is_err() || c.io.flush().await.is_err() {
                return;
            }
        }
        let _ = c.io.write_all(b"0\r\n\r\n").await;
        let _ = c.io.flush().await;
    }
}

fn client_config(roots: RootCertStore) -> Arc<rustls::ClientConfig> {
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

async fn connect(to: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> BufConn<Tls> {
    let tcp = TcpStream::connect(to).await.unwrap();
    let _ = tcp.set_nodelay(true);
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(ServerName::try_from(HOST.to_string()).unwrap(), tcp)
        .await
        .unwrap();
    BufConn::new(tls)
}

/// Send `req`, read the whole answer; returns the body length.
async fn exchange(c: &mut BufConn<Tls>, req: &[u8]) -> usize {
    c.io.write_all(req).await.unwrap();
    c.io.flush().await.unwrap();
    let head = c.read_head(T, T).await.unwrap().unwrap();
    let resp = parse_response_head(&head).unwrap();
    let f = response_framing(&resp, "GET").unwrap();
    let (mut sink, mut drain) = duplex(1 << 20);
    let reader = tokio::spawn(async move {
        let mut n = 0;
        let mut b = vec![0u8; 1 << 16];
        loop {
            match tokio::io::AsyncReadExt::read(&mut drain, &mut b).await {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k,
            }
        }
    });
    relay_body(c, &mut sink, (f, Framing::UntilClose), T, None)
        .await
        .unwrap();
    drop(sink);
    reader.await.unwrap()
}

/// (median per-request time, median SSE stream time) for a client connecting to `to`.
async fn measure(
    to: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    auth: &str,
) -> (Duration, Duration) {
    let small =
        format!("GET /small HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {auth}\r\n\r\n");
    let sse = format!("GET /sse HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {auth}\r\n\r\n");
    let (mut reqs, mut streams) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let mut c = connect(to, cfg.clone()).await;
        exchange(&mut c, small.as_bytes()).await;
        let t = Instant::now();
        for _ in 0..REQUESTS {
            assert_eq!(exchange(&mut c, small.as_bytes()).await, 6);
        }
        reqs.push(t.elapsed() / REQUESTS as u32);
        let t = Instant::now();
        let n = exchange(&mut c, sse.as_bytes()).await;
        streams.push(t.elapsed());
        assert!(n > EVENTS * 20);
    }
    reqs.sort();
    streams.sort();
    (reqs[RUNS / 2], streams[RUNS / 2])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (oaddr, roots) = origin().await;
    let dir = tempfile::tempdir().unwrap();
    let (gw, trust) = Gateway::new(
        vec![(
            SecretPlan {
                name: "KEY".into(),
                from_env: "KEY".into(),
                hosts: vec![DomainPattern::parse(HOST).unwrap()],
            },
            REAL.into(),
        )],
        GatewayConfig {
            upstream_roots: Some(roots.clone()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: None,
        },
    )
    .unwrap();
    let ph = trust.env["KEY"].clone();
    // The gateway's listener: each connection intercepted over a fresh one to the origin.
    let gl = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gaddr = gl.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = gl.accept().await {
            let _ = tcp.set_nodelay(true);
            let gw = gw.clone();
            tokio::spawn(async move {
                let up = TcpStream::connect(oaddr).await.unwrap();
                let _ = up.set_nodelay(true);
                let host = Host::Name(HOST.into());
                let _ = gw.intercept_over(tcp, up, &host, 443, oaddr, "bench").await;
            });
        }
    });
    let mut jail_roots = RootCertStore::empty();
    let b64: String = trust
        .ca_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    use base64::Engine as _;
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    jail_roots.add(CertificateDer::from(der)).unwrap();

    let (d_req, d_sse) = measure(oaddr, client_config(roots), REAL).await;
    let (g_req, g_sse) = measure(gaddr, client_config(jail_roots), &ph).await;
    let per_chunk = |d: Duration| d.as_secs_f64() * 1e6 / EVENTS as f64;
    println!("| path | per request [µs] | SSE, {EVENTS} events [ms] | per event [µs] |");
    println!("|:---|---:|---:|---:|");
    for (name, r, s) in [("direct", d_req, d_sse), ("gateway", g_req, g_sse)] {
        println!(
            "| {name} | {:.1} | {:.1} | {:.2} |",
            r.as_secs_f64() * 1e6,
            s.as_secs_f64() * 1e3,
            per_chunk(s)
        );
    }
    println!(
        "gateway adds {:.1} µs per request, {:.2} µs per streamed event (medians of {RUNS} runs)",
        (g_req.as_secs_f64() - d_req.as_secs_f64()) * 1e6,
        per_chunk(g_sse) - per_chunk(d_sse)
    );
}
