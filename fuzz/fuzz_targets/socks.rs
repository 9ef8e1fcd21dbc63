//! Fuzz the egress proxy's SOCKS5 handshake (and, for a first byte other than 5, its HTTP
//! request phase) end to end: the fuzzer's bytes are the client's side of an in-memory stream
//! handed to `Proxy::handshake`, against static rules and a static resolver, so nothing is ever
//! dialled (every allowed name resolves to a private address, to nothing, or not at all).
//!
//! Properties: nothing panics and the handshake ends (tokio's clock is paused, so a stalled
//! read meets its timeout at once); no input gets a tunnel; the SOCKS5 replies are exactly
//! what RFC 1928 and the rules say, computed here independently: no acceptable method gives
//! `05 FF`; otherwise `05 00`, then nothing for a bad version or reserved byte or a request cut
//! short, REP 8 for an unknown address type, REP 1 for a bad host name, REP 7 for a command
//! other than CONNECT, REP 4 for an allowed name that does not resolve, REP 2 for everything
//! else (denied, or resolving to a private address), never REP 0; an HTTP answer is an
//! HTTP/1.1 response.
#![no_main]

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use corral_audit::AuditLog;
use corral_net::{Proxy, ProxyConfig, Rules, StaticResolver};
use corral_policy::domain::{DomainPattern, Host, normalize_host};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn proxy() -> Arc<Proxy> {
    static P: OnceLock<Arc<Proxy>> = OnceLock::new();
    P.get_or_init(|| {
        let p = |v: &[&str]| v.iter().map(|s| DomainPattern::parse(s).unwrap()).collect();
        let rules = Rules {
            allow: p(&[
                "example.org",
                "*.example.com",
                "a.b",
                "10.1.2.3",
                "[fd00::1]",
            ]),
            deny: p(&["bad.example.com"]),
            ..Default::default()
        };
        let resolver = StaticResolver::new()
            .with("example.org", &["10.0.0.1".parse::<IpAddr>().unwrap()])
            .with("a.b", &[]);
        let dir = std::env::temp_dir().join(format!("corral-fuzz-socks-{}", std::process::id()));
        let audit = AuditLog::at(dir.join("audit.jsonl")).with_max_bytes(1 << 20);
        let config = ProxyConfig {
            header_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..ProxyConfig::default()
        };
        Arc::new(
            Proxy::new(rules, audit, "fuzz")
                .with_resolver(Arc::new(resolver))
                .with_config(config),
        )
    })
    .clone()
}

/// What the client reads back, and whether a tunnel was established.
fn run(data: &[u8]) -> (Vec<u8>, bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let (ours, theirs) = tokio::io::duplex(4096);
        let (mut rd, mut wr) = tokio::io::split(ours);
        let client = async {
            // The proxy may stop reading early (and drop its end): a failed write is fine.
            let _ = wr.write_all(data).await;
            let _ = wr.shutdown().await;
        };
        let mut out = Vec::new();
        let (tunnel, _, _) = tokio::join!(
            proxy().handshake(theirs, "fuzz"),
            client,
            rd.read_to_end(&mut out)
        );
        (out, tunnel)
    })
}

/// The REP the proxy must answer for a complete request, `None` for no reply at all.
fn expected(data: &[u8]) -> Option<Vec<u8>> {
    let n = usize::from(*data.get(1)?);
    let methods = data.get(2..2 + n)?;
    if !methods.contains(&0) {
        return Some(vec![5, 0xff]);
    }
    let mut out = vec![5, 0];
    let rep = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
    let rest = &data[2 + n..];
    let Some(req) = rest.get(..4) else {
        return Some(out);
    };
    if req[0] != 5 || req[2] != 0 {
        return Some(out);
    }
    let (host, rest) = match req[3] {
        1 => match rest.get(4..8) {
            Some(b) => (
                Ok(Host::Ip(IpAddr::from([b[0], b[1], b[2], b[3]]))),
                &rest[8..],
            ),
            None => return Some(out),
        },
        4 => match rest.get(4..20) {
            Some(b) => {
                let a: [u8; 16] = b.try_into().unwrap();
                (Ok(Host::Ip(IpAddr::from(a))), &rest[20..])
            }
            None => return Some(out),
        },
        3 => {
            let Some(&len) = rest.get(4) else {
                return Some(out);
            };
            let Some(name) = rest.get(5..5 + usize::from(len)) else {
                return Some(out);
            };
            let host = match std::str::from_utf8(name) {
                Ok(s) if !s.contains(['%', '@', '/', ':', '[', ']']) => normalize_host(s).ok(),
                _ => None,
            };
            (host.ok_or(()), &rest[5 + usize::from(len)..])
        }
        _ => {
            out.extend_from_slice(&rep(8));
            return Some(out);
        }
    };
    let Some(port) = rest.get(..2) else {
        return Some(out);
    };
    let port = u16::from_be_bytes([port[0], port[1]]);
    let code = match host {
        Err(()) => 1,
        Ok(_) if req[1] != 1 => 7,
        Ok(Host::Name(n)) if port == 443 && (n == "a.b" || unresolved_sub(&n)) => 4,
        Ok(_) => 2,
    };
    out.extend_from_slice(&rep(code));
    Some(out)
}

/// A name `*.example.com` allows that the resolver does not know.
fn unresolved_sub(n: &str) -> bool {
    n.ends_with(".example.com") && n != "bad.example.com"
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let (out, tunnel) = run(data);
    assert!(!tunnel, "a tunnel was established");
    if data[0] == 5 {
        let want = expected(data).unwrap_or_default();
        assert_eq!(out, want, "SOCKS5 replies");
    } else if !out.is_empty() {
        assert!(out.starts_with(b"HTTP/1.1 "), "not an HTTP response");
    }
});
