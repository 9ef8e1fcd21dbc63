//! Rules by method and path at the proxy, against real loopback origins (the TLS side, through
//! the gateway, is in crates/corral/tests/jail_pathrules.rs): plain HTTP decided per request on
//! the normalised path it forwards, and a host named by path rules that the run's CA cannot
//! sign for is refused, never an opaque tunnel.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use corral_net::{ProxyConfig, Rules};
use corral_policy::pathrule::PathRule;

fn with_paths(mut r: Rules, paths: &[&str]) -> Rules {
    r.allow_paths = paths.iter().map(|p| PathRule::parse(p).unwrap()).collect();
    r
}

#[test]
fn plain_http_is_decided_on_the_normalised_path_it_forwards() {
    let origin = Origin::start();
    let p = origin.port();
    let h = start(
        with_paths(
            rules(&[], &["127.0.0.0/8"]),
            &[&format!("GET origin.test:{p}/a/**")],
        ),
        ProxyConfig::default(),
    );
    let get = |target: &str| {
        exchange(
            h.addr,
            format!("GET http://origin.test:{p}{target} HTTP/1.1\r\nHost: origin.test:{p}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
    };
    let ok = get("/a/x");
    assert_eq!(status_of(&ok), 200, "{ok}");
    let norm = get("/a/./y//z");
    assert_eq!(status_of(&norm), 200, "{norm}");
    for (target, status) in [
        ("/a/../b", 403),
        ("/a/%2e%2e/b", 403),
        ("/b", 403),
        ("/a%2f..%2fb", 400),
        ("/a/..;/b", 400),
        ("/a/%c0%ae%c0%ae/b", 400),
    ] {
        let r = get(target);
        assert_eq!(status_of(&r), status, "{target}: {r}");
    }
    let post = exchange(
        h.addr,
        format!("POST http://origin.test:{p}/a/x HTTP/1.1\r\nHost: origin.test:{p}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(status_of(&post), 403, "{post}");
    assert!(
        post.contains(&format!("corral allow 'POST origin.test:{p}/a/x'")),
        "{post}"
    );
    // The origin got the allowed requests only, each in the form that was decided on.
    assert_eq!(
        origin.seen(),
        vec![
            format!("GET /a/x host=origin.test:{p} headers=host"),
            format!("GET /a/y/z host=origin.test:{p} headers=host"),
        ]
    );
    let paths: Vec<(String, Option<String>, String)> = h
        .wait_events(9)
        .into_iter()
        .filter(|e| e.path.is_some())
        .map(|e| {
            let d = format!("{:?}", e.decision.unwrap());
            (e.method, e.path, d)
        })
        .collect();
    let want = |m: &str, path: &str, d: &str| (m.to_string(), Some(path.to_string()), d.into());
    assert_eq!(
        paths,
        vec![
            want("GET", "/a/x", "Allow"),
            want("GET", "/a/y/z", "Allow"),
            want("GET", "/a/../b", "Deny"),
            want("GET", "/a/%2e%2e/b", "Deny"),
            want("GET", "/b", "Deny"),
            want("GET", "/a%2f..%2fb", "Deny"),
            want("GET", "/a/..;/b", "Deny"),
            want("GET", "/a/%c0%ae%c0%ae/b", "Deny"),
            want("POST", "/a/x", "Deny"),
        ]
    );
}

#[test]
fn a_path_ruled_host_without_the_run_ca_is_refused_not_tunnelled() {
    let origin = Origin::start();
    let p = origin.port();
    // No gateway (no run CA): CONNECT and SOCKS5 to the path-ruled host are refused.
    let h = start(
        with_paths(
            rules(&[], &["127.0.0.0/8"]),
            &[&format!("origin.test:{p}/a/**")],
        ),
        ProxyConfig::default(),
    );
    let resp = exchange(
        h.addr,
        format!("CONNECT origin.test:{p} HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&resp), 403, "{resp}");
    assert!(resp.contains("run's CA cannot sign"), "{resp}");
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut hello = [0u8; 2];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(hello, [5, 0]);
    let mut req = vec![5, 1, 0, 3, b"origin.test".len() as u8];
    req.extend_from_slice(b"origin.test");
    req.extend_from_slice(&p.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply, [5, 2], "SOCKS5 to a path-ruled host was not refused");
    // The control: the same host allowed plainly is tunnelled.
    let h = start(
        rules(&[&format!("origin.test:{p}")], &["127.0.0.0/8"]),
        ProxyConfig::default(),
    );
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        format!("CONNECT origin.test:{p} HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut head = vec![0u8; 39];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
    // The origin accepts in order: once the control's connection is counted, any the refused
    // CONNECT or SOCKS5 had opened would be too.
    let count = || origin.connections.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..500 {
        if count() > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(count(), 1, "the refused requests reached the origin");
}
