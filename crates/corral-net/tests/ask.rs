//! `network.on_deny = "ask"` in the proxy: a CONNECT or SOCKS5 request only the allow list
//! refuses is held until the rules allow it (the run-only allow of `corral watch`) or the
//! question is refused; a deny rule, an address literal the address checks refuse and a
//! question refused earlier are refused at once; a client that goes away while held leaves
//! nothing behind (question, hold, budget).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use corral_net::ProxyConfig;
use corral_net::ask::{HELD_BYTES, Question};
use corral_policy::domain::DomainPattern;
use corral_policy::plan::OnDeny;

const DEADLINE: Duration = Duration::from_secs(60);

fn asking(h: &Harness) {
    h.handle.proxy().set_on_deny(OnDeny::Ask { timeout: 300 });
}

/// The questions once `pred` holds for them.
#[track_caller]
fn wait_asks(h: &Harness, pred: impl Fn(&[Question]) -> bool) -> Vec<Question> {
    let start = Instant::now();
    loop {
        let asks = h.handle.proxy().asks().list();
        if pred(&asks) {
            return asks;
        }
        assert!(start.elapsed() < DEADLINE, "questions now: {asks:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connect(h: &Harness, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    s
}

fn status(s: &mut TcpStream) -> u16 {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    status_of(&String::from_utf8_lossy(&head))
}

/// Allow `pattern` for the run as the control socket does: new rules, then the questions
/// they answer woken.
fn allow(h: &Harness, pattern: &str) {
    let p = h.handle.proxy();
    let mut r = p.rules().as_ref().clone();
    r.allow.push(DomainPattern::parse(pattern).unwrap());
    p.set_rules(r);
    p.asks().settle(&p.rules());
}

#[test]
fn a_held_connect_proceeds_once_allowed_and_its_hold_is_counted() {
    let echo = echo_server();
    let h = start(rules(&[], &["127.0.0.0/8"]), ProxyConfig::default());
    asking(&h);
    let target = format!("origin.test:{}", echo.port());
    let mut s = connect(&h, &target);
    let mut other = connect(&h, &target);
    let asks = wait_asks(&h, |a| a.first().is_some_and(|q| q.held == 2));
    assert_eq!(asks.len(), 1, "one question per destination: {asks:?}");
    assert_eq!(
        (asks[0].method.as_str(), asks[0].host.as_str()),
        ("CONNECT", "origin.test")
    );
    assert!(h.handle.proxy().buffered_bytes() >= 2 * HELD_BYTES);
    allow(&h, &target);
    assert_eq!(status(&mut s), 200);
    assert_eq!(status(&mut other), 200);
    s.write_all(b"through").unwrap();
    let mut b = [0u8; 7];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"through");
    assert!(h.handle.proxy().asks().list().is_empty());
    let asked = h.net_events();
    assert_eq!(
        asked
            .iter()
            .filter(|e| e.phase == corral_audit::NetPhase::Ask)
            .count(),
        1,
        "{asked:?}"
    );
}

#[test]
fn a_refused_socks_request_is_refused_and_not_asked_again() {
    let echo = echo_server();
    let h = start(rules(&[], &["127.0.0.0/8"]), ProxyConfig::default());
    asking(&h);
    let socks = |host: &[u8], port: u16| -> u8 {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let mut m = [0u8; 2];
        s.read_exact(&mut m).unwrap();
        let mut req = vec![5, 1, 0, 3, host.len() as u8];
        req.extend_from_slice(host);
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).unwrap();
        let mut rep = [0u8; 10];
        s.read_exact(&mut rep).unwrap();
        rep[1]
    };
    let port = echo.port();
    let held = std::thread::scope(|sc| {
        let t = sc.spawn(|| socks(b"origin.test", port));
        wait_asks(&h, |a| !a.is_empty());
        assert_eq!(
            h.handle
                .proxy()
                .asks()
                .refuse(&format!("origin.test:{port}")),
            1
        );
        t.join().unwrap()
    });
    assert_eq!(held, 2, "refused: not allowed by ruleset");
    // Refused in corral watch: refused at once for the rest of the run.
    assert_eq!(socks(b"origin.test", port), 2);
    assert!(h.handle.proxy().asks().list().is_empty());
    let rules: Vec<String> = h.decisions().into_iter().map(|d| d.4).collect();
    assert_eq!(
        rules,
        vec!["not in network.allow; refused in corral watch"; 2],
        "{rules:?}"
    );
}

#[test]
fn deny_rules_and_refused_addresses_are_not_asked() {
    let mut r = rules(&[], &[]);
    r.deny.push(DomainPattern::parse("origin.test").unwrap());
    let h = start(r, ProxyConfig::default());
    asking(&h);
    for target in [
        "origin.test:443",
        "10.1.2.3:443",
        "169.254.169.254:80",
        "127.0.0.1:443",
    ] {
        let mut s = connect(&h, target);
        assert_eq!(status(&mut s), 403, "{target}");
    }
    // The control: a public name the allow list does not name is asked.
    let _held = connect(&h, "other.test:443");
    wait_asks(&h, |a| a.len() == 1 && a[0].host == "other.test");
    let asked: Vec<String> = h
        .net_events()
        .into_iter()
        .filter(|e| e.phase == corral_audit::NetPhase::Ask)
        .map(|e| e.host)
        .collect();
    assert_eq!(asked, vec!["other.test"]);
}

#[test]
fn a_client_that_goes_away_while_held_leaves_nothing() {
    let h = start(rules(&[], &[]), ProxyConfig::default());
    asking(&h);
    let s = connect(&h, "other.test:443");
    wait_asks(&h, |a| !a.is_empty());
    drop(s);
    wait_asks(&h, |a| a.is_empty());
    let start = Instant::now();
    while h.handle.proxy().asks().held() != 0 || h.handle.proxy().buffered_bytes() != 0 {
        assert!(start.elapsed() < DEADLINE, "the hold was not released");
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone = h.wait_events(2);
    assert!(
        gone.iter()
            .any(|e| e.rule == "not in network.allow; the client went away while asked"),
        "{gone:?}"
    );
}
