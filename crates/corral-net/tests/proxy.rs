//! The proxy against real loopback origins: what is allowed works, every bypass is denied and
//! logged, bad clients cannot take it down.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use corral_net::ProxyConfig;

#[test]
fn get_through_keepalive_connection_works_and_is_logged() {
    let origin = Origin::start();
    let h = start_default(origin.port());
    let p = origin.port();
    let mut c = h.client();
    for i in 0..3 {
        let r = c
            .request(&format!(
                "GET http://origin.test:{p}/r{i} HTTP/1.1\r\nHost: origin.test:{p}\r\nProxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\n\r\n"
            ))
            .expect("response");
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(r.text(), format!("hello /r{i}"));
    }
    let r = c
        .request(&format!(
            "GET http://origin.test:{p}/chunked HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n"
        ))
        .unwrap();
    assert_eq!(r.text(), "hello world");
    drop(c);
    // One origin connection served all four requests, re-serialized in origin-form with the
    // proxy's own headers stripped.
    assert_eq!(
        origin.connections.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(
        origin.seen(),
        vec![
            format!("GET /r0 host=origin.test:{p} headers=host"),
            format!("GET /r1 host=origin.test:{p} headers=host"),
            format!("GET /r2 host=origin.test:{p} headers=host"),
            format!("GET /chunked host=origin.test:{p} headers=host"),
        ]
    );
    let ev = h.wait_events(5);
    let decisions = h.decisions();
    assert_eq!(decisions.len(), 4);
    for d in &decisions {
        assert_eq!(
            d,
            &(
                "GET".to_string(),
                "origin.test".to_string(),
                p,
                "allow".to_string(),
                format!("network.allow: origin.test:{p}")
            )
        );
    }
    let close: Vec<_> = ev
        .iter()
        .filter(|e| e.phase == corral_audit::NetPhase::Close)
        .collect();
    assert_eq!(close.len(), 1, "{ev:?}");
    assert_eq!(close[0].address.as_deref(), Some("127.0.0.1"));
    assert!(
        close[0].bytes_down > 40 && close[0].bytes_up > 40,
        "{:?}",
        close[0]
    );
}

#[test]
fn large_bodies_stream_both_ways() {
    let origin = Origin::start();
    let h = start_default(origin.port());
    let p = origin.port();
    let mut c = h.client();
    let n = 64 * 1024 * 1024;
    let r = c
        .request(&format!(
            "GET http://origin.test:{p}/big?{n} HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n"
        ))
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), n);
    // A chunked upload of 8 MiB in 1 MiB chunks, on the same connection.
    c.send(format!("POST http://origin.test:{p}/up HTTP/1.1\r\nHost: origin.test:{p}\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes());
    let chunk = vec![b'y'; 1 << 20];
    for _ in 0..8 {
        c.send(format!("{:x}\r\n", chunk.len()).as_bytes());
        c.send(&chunk);
        c.send(b"\r\n");
    }
    c.send(b"0\r\n\r\n");
    let r = c.response().unwrap();
    assert_eq!(r.text(), format!("got {} bytes", 8 << 20));
    // And a Content-Length upload with Expect: 100-continue.
    c.send(format!("PUT http://origin.test:{p}/up HTTP/1.1\r\nHost: origin.test:{p}\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n").as_bytes());
    let cont = c.response().unwrap();
    assert_eq!(cont.status, 100);
    c.send(b"abcde");
    assert_eq!(c.response().unwrap().text(), "got 5 bytes");
}

#[test]
fn connect_tunnel_to_a_named_port_works() {
    let echo = echo_server();
    let h = start(
        rules(&[&format!("origin.test:{}", echo.port())], &["127.0.0.0/8"]),
        ProxyConfig::default(),
    );
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Pipelined: the first tunnel bytes arrive with the CONNECT head.
    s.write_all(
        format!(
            "CONNECT origin.test:{0} HTTP/1.1\r\nHost: origin.test:{0}\r\n\r\nping",
            echo.port()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut buf = vec![0u8; 43];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf[..], b"HTTP/1.1 200 Connection established\r\n\r\nping");
    s.write_all(b"pong").unwrap();
    let mut pong = [0u8; 4];
    s.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"pong");
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut tail = Vec::new();
    s.read_to_end(&mut tail).unwrap();
    let ev = h.wait_events(2);
    let close = ev
        .iter()
        .find(|e| e.phase == corral_audit::NetPhase::Close)
        .expect("close event");
    assert_eq!((close.bytes_up, close.bytes_down), (8, 8));
    assert_eq!(close.method, "CONNECT");
}

#[test]
fn connect_to_a_port_no_pattern_names_is_denied() {
    let echo = echo_server();
    let h = start(
        rules(&["origin.test"], &["127.0.0.0/8"]),
        ProxyConfig::default(),
    );
    let resp = exchange(
        h.addr,
        format!("CONNECT origin.test:{} HTTP/1.1\r\n\r\n", echo.port()).as_bytes(),
    );
    assert_eq!(status_of(&resp), 403, "{resp}");
    assert!(
        resp.contains(&format!("corral run --allow origin.test:{}", echo.port())),
        "{resp}"
    );
    // Plain HTTP to a non-80 port is the same rule.
    let resp = exchange(
        h.addr,
        format!("GET http://origin.test:{}/ HTTP/1.1\r\n\r\n", echo.port()).as_bytes(),
    );
    assert_eq!(status_of(&resp), 403, "{resp}");
    let d = h.decisions();
    assert_eq!(d.len(), 2);
    assert!(
        d.iter()
            .all(|d| d.3 == "deny" && d.4 == format!("port {} not in network.allow", echo.port())),
        "{d:?}"
    );
}

#[test]
fn host_not_allowed_is_denied_with_a_hint_logged_and_summarized() {
    let h = start(
        rules(&["origin.test"], &["127.0.0.0/8"]),
        ProxyConfig::default(),
    );
    for _ in 0..3 {
        let resp = exchange(
            h.addr,
            b"CONNECT github.com:443 HTTP/1.1\r\nHost: github.com:443\r\n\r\n",
        );
        assert_eq!(status_of(&resp), 403);
        assert!(resp.contains("not in network.allow"), "{resp}");
        assert!(
            resp.contains("allow with: corral run --allow github.com"),
            "{resp}"
        );
    }
    assert_eq!(
        h.decisions(),
        vec![
            (
                "CONNECT".into(),
                "github.com".into(),
                443,
                "deny".into(),
                "not in network.allow".into()
            );
            3
        ]
    );
    assert_eq!(
        h.handle.summary(),
        vec!["corral: blocked CONNECT github.com:443 ×3 (not in network.allow) — allow with: corral run --allow github.com".to_string()]
    );
}

#[test]
fn subdomain_of_an_exact_pattern_and_lookalikes_are_denied() {
    let origin = Origin::start();
    let h = start_default(origin.port());
    for host in ["a.origin.test", "notorigin.test", "origin.test.evil.test"] {
        let resp = exchange(
            h.addr,
            format!("CONNECT {host}:443 HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 403, "{host}: {resp}");
    }
    // A deny entry wins over an allow entry.
    let mut r = rules(&["*.origin.test"], &["127.0.0.0/8"]);
    r.deny = vec!["a.origin.test".parse().unwrap()];
    let h2 = start(r, ProxyConfig::default());
    let resp = exchange(h2.addr, b"CONNECT a.origin.test:443 HTTP/1.1\r\n\r\n");
    assert_eq!(status_of(&resp), 403);
    assert!(resp.contains("network.deny: a.origin.test"), "{resp}");
    assert_eq!(
        origin.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[test]
fn ip_literals_in_every_spelling_are_denied() {
    let origin = Origin::start();
    let p = origin.port();
    // Not in the allow list at all.
    let h = start_default(p);
    let spellings = [
        "127.0.0.1",
        "127.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "0x7f.1",
        "127.0.0.1.",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
    ];
    for s in spellings {
        let resp = exchange(
            h.addr,
            format!("GET http://{s}:{p}/ HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 403, "{s}: {resp}");
        let resp = exchange(
            h.addr,
            format!("CONNECT {s}:{p} HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 403, "{s}: {resp}");
    }
    // Zone ids and userinfo are malformed.
    for s in ["[fe80::1%25lo]", "[fe80::1%lo]", "user@origin.test"] {
        let resp = exchange(
            h.addr,
            format!("GET http://{s}:{p}/ HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 400, "{s}: {resp}");
    }
    // Allowed by pattern but not by allow_cidrs: the address check still denies.
    let h2 = start(
        rules(&[&format!("127.0.0.1:{p}")], &[]),
        ProxyConfig::default(),
    );
    for s in ["127.0.0.1", "127.1", "2130706433", "0x7f000001"] {
        let resp = exchange(
            h2.addr,
            format!("GET http://{s}:{p}/ HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 403, "{s}: {resp}");
        assert!(
            resp.contains("(loopback), not in network.allow_cidrs"),
            "{resp}"
        );
    }
    assert_eq!(
        origin.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    let d = h.decisions();
    assert!(
        d.len() >= 2 * spellings.len() && d.iter().all(|d| d.3 == "deny"),
        "{d:?}"
    );
}

#[test]
fn allowed_names_resolving_to_special_addresses_are_denied() {
    let origin = Origin::start();
    let p = origin.port();
    // No allow_cidrs: loopback is closed even for an allowed name.
    let pats: Vec<String> = [
        "origin.test",
        "ten.test",
        "meta.test",
        "mixed.test",
        "v6lo.test",
        "mapped.test",
    ]
    .iter()
    .map(|n| format!("{n}:{p}"))
    .collect();
    let pats: Vec<&str> = pats.iter().map(String::as_str).collect();
    let h = start(rules(&pats, &[]), ProxyConfig::default());
    for (name, class) in [
        ("origin.test", "loopback"),
        ("ten.test", "private"),
        ("meta.test", "metadata"),
        ("mixed.test", "loopback"),
        ("v6lo.test", "loopback"),
        ("mapped.test", "loopback"),
    ] {
        let resp = exchange(
            h.addr,
            format!("GET http://{name}:{p}/ HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 403, "{name}: {resp}");
        assert!(
            resp.contains(&format!("({class}), not in network.allow_cidrs")),
            "{name}: {resp}"
        );
        let resp = exchange(
            h.addr,
            format!("CONNECT {name}:{p} HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 403, "{name}: {resp}");
    }
    assert_eq!(
        origin.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(h.decisions().iter().filter(|d| d.3 == "deny").count(), 12);
}

#[test]
fn kept_alive_connection_stays_pinned_to_its_first_host() {
    let origin = Origin::start();
    let p = origin.port();
    let h = start(
        rules(
            &[&format!("origin.test:{p}"), &format!("other.test:{p}")],
            &["127.0.0.0/8"],
        ),
        ProxyConfig::default(),
    );
    let mut c = h.client();
    let r = c
        .request(&format!(
            "GET http://origin.test:{p}/1 HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n"
        ))
        .unwrap();
    assert_eq!(r.status, 200);
    let r = c
        .request(&format!(
            "GET http://other.test:{p}/2 HTTP/1.1\r\nHost: other.test:{p}\r\n\r\n"
        ))
        .unwrap();
    assert_eq!(r.status, 403);
    assert!(
        r.text()
            .contains(&format!("connection pinned to origin.test:{p}")),
        "{}",
        r.text()
    );
    assert!(c.closed());
    // A Host header that disagrees with the target is refused too.
    let resp = exchange(
        h.addr,
        format!("GET http://origin.test:{p}/ HTTP/1.1\r\nHost: other.test:{p}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&resp), 400, "{resp}");
    let resp = exchange(
        h.addr,
        format!("GET http://origin.test:{p}/ HTTP/1.1\r\nHost: origin.test\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&resp), 400, "{resp}");
    let resp = exchange(h.addr, format!("GET http://origin.test:{p}/ HTTP/1.1\r\nHost: origin.test:{p}\r\nHost: origin.test:{p}\r\n\r\n").as_bytes());
    assert_eq!(status_of(&resp), 400, "{resp}");
    // CONNECT after plain HTTP on one connection.
    let mut c = h.client();
    c.request(&format!("GET http://origin.test:{p}/1 HTTP/1.1\r\n\r\n"))
        .unwrap();
    let r = c
        .request(&format!("CONNECT other.test:{p} HTTP/1.1\r\n\r\n"))
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        origin
            .seen()
            .iter()
            .filter(|s| s.contains("other.test"))
            .count(),
        0
    );
    let d = h.decisions();
    assert!(
        d.iter().any(|d| d.1 == "other.test"
            && d.3 == "deny"
            && d.4 == format!("connection pinned to origin.test:{p}")),
        "{d:?}"
    );
    assert!(
        d.iter()
            .any(|d| d.3 == "deny" && d.4.starts_with("Host header names other.test")),
        "{d:?}"
    );
}

#[test]
fn request_smuggling_forms_are_rejected_and_never_reach_the_origin() {
    let origin = Origin::start();
    let p = origin.port();
    let h = start_default(p);
    let t = format!("http://origin.test:{p}/");
    let cases = [
        format!(
            "POST {t} HTTP/1.1\r\nHost: origin.test:{p}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"
        ),
        format!("POST {t} HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n"),
        format!(
            "POST {t} HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n"
        ),
        format!("POST {t} HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"),
        format!("POST {t} HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"),
        format!("POST {t} HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\nabc"),
        format!("POST {t} HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc"),
        format!("POST {t} HTTP/1.1\r\nContent-Length:  3 \r\nContent-Length: 3\r\n\r\nabc"),
        format!("POST {t} HTTP/1.1\r\nX: a\r\n Transfer-Encoding: chunked\r\n\r\n"),
        format!("POST {t} HTTP/1.1\r\nTransfer-Encoding\t: chunked\r\n\r\n"),
        format!("GET {t} HTTP/1.1\nHost: origin.test\n\n"),
    ];
    for raw in &cases {
        let resp = exchange(h.addr, raw.as_bytes());
        assert_eq!(status_of(&resp), 400, "{raw:?}: {resp}");
    }
    assert_eq!(
        origin.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // Body errors are found while streaming: the origin gets an incomplete request and the
    // connection to it is dropped, so nothing completes there.
    for body in [
        "fffffffffffffffff1\r\nabc\r\n0\r\n\r\n",
        "3\r\nabcX\r\n0\r\n\r\n",
        "-3\r\nabc\r\n0\r\n\r\n",
        "3 \r\nabc\r\n0\r\n\r\n",
        "3\nabc\r\n0\r\n\r\n",
    ] {
        let resp = exchange(
            h.addr,
            format!("POST {t} HTTP/1.1\r\nHost: origin.test:{p}\r\nTransfer-Encoding: chunked\r\n\r\n{body}GET /smuggled HTTP/1.1\r\nHost: origin.test\r\n\r\n").as_bytes(),
        );
        assert_eq!(status_of(&resp), 400, "{body:?}: {resp}");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(origin.seen(), Vec::<String>::new());
}

#[test]
fn socks5_follows_the_same_rules() {
    let echo = echo_server();
    let port = echo.port();
    let h = start(
        rules(&[&format!("origin.test:{port}")], &["127.0.0.0/8"]),
        ProxyConfig::default(),
    );
    let socks = |host: &[u8], port: u16| -> (u8, TcpStream) {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let mut m = [0u8; 2];
        s.read_exact(&mut m).unwrap();
        assert_eq!(m, [5, 0]);
        let mut req = vec![5, 1, 0, 3, host.len() as u8];
        req.extend_from_slice(host);
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).unwrap();
        let mut rep = [0u8; 10];
        s.read_exact(&mut rep).unwrap();
        (rep[1], s)
    };
    let (code, mut s) = socks(b"origin.test", port);
    assert_eq!(code, 0);
    s.write_all(b"over socks").unwrap();
    let mut b = [0u8; 10];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"over socks");
    drop(s);
    assert_eq!(socks(b"github.com", 443).0, 2);
    assert_eq!(socks(b"origin.test", 443).0, 2);
    assert_eq!(socks(b"2130706433", port).0, 2);
    // IP-literal requests (ATYP 1) are checked the same way.
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut m = [0u8; 2];
    s.read_exact(&mut m).unwrap();
    let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1];
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(rep[1], 2);
    let d = h.decisions();
    assert!(
        d.iter()
            .any(|d| d.0 == "SOCKS5" && d.1 == "github.com" && d.3 == "deny"),
        "{d:?}"
    );
    assert!(
        d.iter()
            .any(|d| d.0 == "SOCKS5" && d.1 == "origin.test" && d.3 == "allow"),
        "{d:?}"
    );
    assert_eq!(d.iter().filter(|d| d.3 == "deny").count(), 4, "{d:?}");
}

#[test]
fn malformed_oversized_and_slow_clients_do_not_take_the_proxy_down() {
    let origin = Origin::start();
    let p = origin.port();
    let h = start(
        rules(&[&format!("origin.test:{p}")], &["127.0.0.0/8"]),
        ProxyConfig {
            header_timeout: Duration::from_millis(500),
            ..ProxyConfig::default()
        },
    );
    assert_eq!(
        status_of(&exchange(h.addr, b"\x16\x03\x01garbage\r\n\r\n")),
        400
    );
    assert_eq!(status_of(&exchange(h.addr, b"GET / HTTP/1.1\r\n\r\n")), 400);
    assert_eq!(
        status_of(&exchange(
            h.addr,
            b"GET https://origin.test/ HTTP/1.1\r\n\r\n"
        )),
        400
    );
    assert_eq!(
        status_of(&exchange(
            h.addr,
            b"GET http://origin.test/ HTTP/2.0\r\n\r\n"
        )),
        400
    );
    assert_eq!(
        status_of(&exchange(
            h.addr,
            b"GET http://origin.test/ HTTP/1.1\r\nX: \x00\r\n\r\n"
        )),
        400
    );
    let mut big = format!("GET http://origin.test:{p}/ HTTP/1.1\r\n").into_bytes();
    while big.len() < 40 * 1024 {
        big.extend_from_slice(
            b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
        );
    }
    big.extend_from_slice(b"\r\n");
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(&big);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert_eq!(status_of(&String::from_utf8_lossy(&out)), 431);
    // Slow loris: a head that never completes is cut after header_timeout.
    let mut slow = TcpStream::connect(h.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    slow.write_all(b"GET http://origin.test/ HTTP/1.1\r\nX-A: 1\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = slow.read_to_end(&mut out);
    assert_eq!(status_of(&String::from_utf8_lossy(&out)), 408);
    // Silent connections and half-sent SOCKS greetings are closed too.
    let mut silent = TcpStream::connect(h.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(silent.read_to_end(&mut out).unwrap(), 0);
    let mut half = TcpStream::connect(h.addr).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    half.write_all(&[5, 3, 0]).unwrap();
    let mut out = Vec::new();
    let _ = half.read_to_end(&mut out);
    // Random bytes.
    let mut seed = 0x1234_5678_u32;
    for _ in 0..50 {
        let junk: Vec<u8> = (0..200)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                seed as u8
            })
            .collect();
        let _ = exchange(h.addr, &junk);
    }
    // Still serving.
    let mut c = h.client();
    let r = c
        .request(&format!("GET http://origin.test:{p}/ok HTTP/1.1\r\n\r\n"))
        .unwrap();
    assert_eq!((r.status, r.text()), (200, "hello /ok".to_string()));
}

#[test]
fn reload_changes_decisions_without_dropping_tunnels() {
    let echo = echo_server();
    let port = echo.port();
    let h = start(
        rules(&[&format!("origin.test:{port}")], &["127.0.0.0/8"]),
        ProxyConfig::default(),
    );
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = [0u8; 39];
    s.read_exact(&mut head).unwrap();
    // Reload: origin.test is no longer allowed, other.test is.
    h.handle
        .proxy()
        .set_rules(rules(&[&format!("other.test:{port}")], &["127.0.0.0/8"]));
    s.write_all(b"still up").unwrap();
    let mut b = [0u8; 8];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still up");
    let resp = exchange(
        h.addr,
        format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&resp), 403);
    let mut c = TcpStream::connect(h.addr).unwrap();
    c.write_all(format!("CONNECT other.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
}

#[test]
fn connections_beyond_the_cap_are_refused() {
    let echo = echo_server();
    let port = echo.port();
    let h = start(
        rules(&[&format!("origin.test:{port}")], &["127.0.0.0/8"]),
        ProxyConfig {
            max_connections: 2,
            ..ProxyConfig::default()
        },
    );
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .unwrap();
        let mut head = [0u8; 39];
        s.read_exact(&mut head).unwrap();
        held.push(s);
    }
    let resp = exchange(
        h.addr,
        format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&resp), 503, "{resp}");
    drop(held);
    // Slots come back when tunnels close.
    let mut ok = false;
    for _ in 0..50 {
        let resp = exchange(
            h.addr,
            format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
        );
        if status_of(&resp) == 200 {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ok);
}

#[test]
fn upstream_proxy_chaining_decides_locally_and_tunnels_through_the_upstream() {
    let origin = Origin::start();
    let p = origin.port();
    let upstream = start_default(p);
    let mut r = rules(&[&format!("origin.test:{p}")], &["127.0.0.0/8"]);
    r.upstream = Some(
        corral_net::Upstream::parse(&format!("http://127.0.0.1:{}", upstream.addr.port())).unwrap(),
    );
    let front = start(r, ProxyConfig::default());
    let mut c = front.client();
    let resp = c
        .request(&format!("GET http://origin.test:{p}/via HTTP/1.1\r\n\r\n"))
        .unwrap();
    assert_eq!((resp.status, resp.text()), (200, "hello /via".to_string()));
    // A denied host never reaches the upstream.
    let resp = exchange(front.addr, b"CONNECT github.com:443 HTTP/1.1\r\n\r\n");
    assert_eq!(status_of(&resp), 403);
    let up = upstream.decisions();
    assert_eq!(
        up,
        vec![(
            "CONNECT".into(),
            "origin.test".into(),
            p,
            "allow".into(),
            format!("network.allow: origin.test:{p}")
        )]
    );
    let f = front.decisions();
    assert_eq!(f.len(), 2);
    assert_eq!(f[0].0, "GET");
    assert_eq!(f[1].3, "deny");
}

#[test]
fn host_port_forward_reaches_only_its_port() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let log = corral_audit::AuditLog::at(dir.path().join("a.jsonl"));
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.spawn(corral_net::forward_port(
        l,
        origin.addr,
        log.clone(),
        "j".into(),
        Duration::from_secs(60),
    ));
    let mut c = Client::connect(addr);
    let r = c
        .request("GET /direct HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(r.text(), "hello /direct");
    drop(c);
    std::thread::sleep(Duration::from_millis(200));
    let (records, _) = log.read_all().unwrap();
    assert_eq!(records.len(), 2);
}
