//! What a jail can make the proxy spend, bounded, and said when a bound is hit:
//! a decision the audit log cannot record is refused, a SOCKS5 handshake has one deadline,
//! partial request heads are bounded per proxy, and a proxy out of descriptors answers 503
//! with one stderr line instead of hanging.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use corral_net::netcap::StubPool;
use corral_net::{Proxy, ProxyConfig};

/// The log replaced by a directory while the proxy holds the old file open: no record can be
/// written from then on.
fn break_log(h: &Harness) {
    let path = h.log.path().to_path_buf();
    std::fs::rename(&path, h.dir.path().join("moved.jsonl")).unwrap();
    std::fs::create_dir(&path).unwrap();
}

fn socks_connect(addr: SocketAddr, host: &[u8], port: u16) -> u8 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut greet = [0u8; 2];
    s.read_exact(&mut greet).unwrap();
    let mut req = vec![5, 1, 0, 3, host.len() as u8];
    req.extend_from_slice(host);
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).unwrap();
    rep[1]
}

/// Fail closed: once the log cannot be written, an allowed plain-HTTP request, CONNECT and
/// SOCKS5 are all refused (503, 503, REP=1), the origin never sees the request, and the
/// failures are counted for the end-of-run summary. Before, every one is served (control).
#[test]
fn an_allowed_request_that_cannot_be_recorded_is_refused() {
    let origin = Origin::start();
    let port = origin.port();
    let h = start_default(port);
    let get = format!(
        "GET http://origin.test:{port}/before HTTP/1.1\r\nHost: origin.test:{port}\r\nConnection: close\r\n\r\n"
    );
    let connect =
        format!("CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n");
    assert_eq!(h.client().request(&get).unwrap().status, 200);
    let mut c = h.client();
    c.send(connect.as_bytes());
    let mut head = [0u8; 12];
    c.s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert_eq!(socks_connect(h.addr, b"origin.test", port), 0);
    assert_eq!(h.log.failures(), None);

    break_log(&h);
    let seen = origin.seen().len();
    let r = h
        .client()
        .request(&get.replace("/before", "/after"))
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("audit log cannot be written"),
        "{}",
        r.text()
    );
    let r = h.client().request(&connect).unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(socks_connect(h.addr, b"origin.test", port), 1);
    assert_eq!(
        origin.seen().len(),
        seen,
        "the origin got an unrecorded request"
    );
    assert!(!origin.seen().iter().any(|r| r.contains("/after")));
    let f = h.log.failures().unwrap();
    assert!(f.count >= 3, "{f:?}");
    assert!(f.reason.contains("directory"), "{f:?}");
}

fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for l in name.split('.') {
        q.push(l.len() as u8);
        q.extend_from_slice(l.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// The stub resolver fails closed too: an allowed name whose query cannot be recorded gets
/// SERVFAIL, never an address the log does not show.
#[test]
fn the_stub_resolver_answers_no_name_it_cannot_record() {
    let h = start(rules(&["*.stub.test"], &[]), ProxyConfig::default());
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let stub = udp.local_addr().unwrap();
    let proxy = h.handle.proxy().clone();
    let pool = Arc::new(StubPool::new(
        "198.18.0.0".parse().unwrap(),
        15,
        "198.18.0.1".parse().unwrap(),
    ));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.spawn(corral_net::netcap::serve_dns_udp(udp, proxy, pool));
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let ask = |name: &str| {
        client.send_to(&dns_query(name), stub).unwrap();
        let mut buf = [0u8; 512];
        let n = client.recv(&mut buf).unwrap();
        let rcode = buf[3] & 0xf;
        let answers = u16::from_be_bytes([buf[6], buf[7]]);
        assert!(n >= 12);
        (rcode, answers)
    };
    assert_eq!(
        ask("a.stub.test"),
        (0, 1),
        "control: an allowed name resolves"
    );
    break_log(&h);
    assert_eq!(ask("b.stub.test"), (2, 0), "SERVFAIL, no address");
    assert_eq!(h.log.failures().unwrap().count, 1);
}

/// A SOCKS5 client that sends its handshake one byte at a time, each well within the head
/// timeout, is cut when the whole handshake's deadline passes (before, each read had its own
/// timeout, so a dribbling client held its slot for as long as it liked).
#[test]
fn a_dribbling_socks5_handshake_has_one_deadline() {
    let origin = Origin::start();
    let port = origin.port();
    let config = ProxyConfig {
        header_timeout: Duration::from_secs(1),
        ..ProxyConfig::default()
    };
    let h = start(
        rules(&[&format!("origin.test:{port}")], &["127.0.0.0/8"]),
        config,
    );
    let mut handshake = vec![5, 1, 0];
    let name = b"origin.test";
    handshake.extend_from_slice(&[5, 1, 0, 3, name.len() as u8]);
    handshake.extend_from_slice(name);
    handshake.extend_from_slice(&port.to_be_bytes());
    // Control: sent at once, the handshake succeeds.
    {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&handshake).unwrap();
        let mut rep = [0u8; 12];
        s.read_exact(&mut rep).unwrap();
        assert_eq!(&rep[..4], &[5, 0, 5, 0], "greeting answered, then success");
    }
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut cut = false;
    for b in &handshake {
        // 300 ms a byte: each read is quick, the whole takes ~6 s against a 1 s deadline.
        if s.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    // At most the greeting's answer; never a success reply for the request.
    assert!(cut || got.len() <= 2, "the handshake completed: {got:?}");
    let allowed = h
        .decisions()
        .iter()
        .filter(|d| d.0 == "SOCKS5" && d.3 == "allow")
        .count();
    assert_eq!(allowed, 1, "only the control was decided");
}

/// Many clients each holding a partial head of ~31 KiB (never finishing it): the bytes the
/// proxy holds for them stay within its head budget, and the clients past it get 503. The
/// control, with no budget, shows what they would hold.
#[test]
fn partial_heads_are_bounded_per_proxy() {
    raise_own_nofile();
    let held = |budget: usize, clients: usize| {
        let h = start(
            rules(&["origin.test"], &[]),
            ProxyConfig {
                buffer_budget: budget,
                header_timeout: Duration::from_secs(60),
                ..ProxyConfig::default()
            },
        );
        let partial = format!(
            "GET http://origin.test/ HTTP/1.1\r\nX-Pad: {}\r\n",
            "a".repeat(31 * 1024)
        );
        let mut conns = Vec::new();
        let mut refused = 0;
        for _ in 0..clients {
            let mut s = TcpStream::connect(h.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let _ = s.write_all(partial.as_bytes());
            conns.push(s);
        }
        // Wait until the proxy has read what it will read: the held bytes stay the same for a
        // second (or 30 s pass).
        let proxy = h.handle.proxy().clone();
        let (mut last, mut same) = (usize::MAX, 0);
        for _ in 0..300 {
            std::thread::sleep(Duration::from_millis(100));
            let now = proxy.buffered_bytes();
            same = if now == last { same + 1 } else { 0 };
            last = now;
            if same == 10 {
                break;
            }
        }
        let mut buf = [0u8; 12];
        for s in &mut conns {
            // A refusal was sent at once: it is there to read, or it is not.
            s.set_nonblocking(true).unwrap();
            if matches!(s.read(&mut buf), Ok(12) if &buf == b"HTTP/1.1 503") {
                refused += 1;
            }
        }
        (last, refused)
    };
    const MIB: usize = 1024 * 1024;
    let clients = 1024;
    let (unbounded, none_refused) = held(usize::MAX, clients);
    assert_eq!(none_refused, 0);
    assert!(
        unbounded > 30 * MIB,
        "control: {clients} partial heads should hold over 30 MiB, held {unbounded}"
    );
    let (bounded, refused) = held(4 * MIB, clients);
    assert!(
        bounded <= 4 * MIB,
        "held {bounded} bytes over a 4 MiB budget"
    );
    assert!(refused > clients / 2, "only {refused} refused");
}

/// Raise this test process's soft descriptor limit (it holds both ends of many connections).
fn raise_own_nofile() {
    corral_net::bounds::raise_nofile_limit().unwrap();
}

/// The proxy of [`out_of_descriptors_the_proxy_answers_503_and_says_so_once`], in a process of
/// its own (its descriptor limit is set by the parent). Not a test by itself.
#[test]
#[ignore = "run by out_of_descriptors_the_proxy_answers_503_and_says_so_once"]
fn fd_child() {
    let Ok(mode) = std::env::var("CORRAL_TEST_FD_CHILD") else {
        return;
    };
    if mode == "raise" {
        raise_own_nofile();
    }
    let port: u16 = std::env::var("CORRAL_TEST_ORIGIN_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = corral_audit::AuditLog::at(dir.path().join("audit.jsonl"));
    let proxy = Proxy::new(
        rules(&[&format!("origin.test:{port}")], &["127.0.0.0/8"]),
        log.clone(),
        "fdjail",
    )
    .with_resolver(Arc::new(resolver()));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("{}", l.local_addr().unwrap());
    let handle = corral_net::spawn(Arc::new(proxy), vec![corral_net::Listener::Proxy(l)]).unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    for l in handle.proxy().bounds_summary() {
        eprintln!("{l}");
    }
    if let Some(f) = log.failures() {
        eprintln!("{}", f.summary_line());
    }
}

/// Runs [`fd_child`] with a soft descriptor limit of 1,024 and opens `tunnels` CONNECT tunnels
/// through it to a loopback origin; the status of each (200, 503), and the child's stderr.
fn tunnels_through_child(hard: u64, raise: bool, tunnels: usize) -> (usize, usize, String) {
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    // The origin only accepts and holds: a tunnel needs nothing more.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in origin.incoming() {
            match s {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
    });
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["fd_child", "--exact", "--ignored", "--nocapture", "--quiet"])
        .env("CORRAL_TEST_FD_CHILD", if raise { "raise" } else { "keep" })
        .env("CORRAL_TEST_ORIGIN_PORT", port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr: SocketAddr = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        if let Ok(a) = line.trim().parse() {
            break a;
        }
    };
    let (mut ok, mut refused, mut conns) = (0, 0, Vec::new());
    let connect =
        format!("CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n");
    for _ in 0..tunnels {
        let mut s = TcpStream::connect(addr).unwrap();
        // Bounded: a hang fails the test instead of stalling it.
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(connect.as_bytes()).unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head)
            .expect("no answer: the proxy hung instead of refusing");
        match &head {
            b"HTTP/1.1 200" => ok += 1,
            b"HTTP/1.1 503" => refused += 1,
            other => panic!("unexpected answer {:?}", String::from_utf8_lossy(other)),
        }
        conns.push(s);
    }
    drop(child.stdin.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    (ok, refused, err)
}

/// With a soft and hard limit of 1,024 descriptors, 3,000 tunnels: those past the limit get a
/// 503 at once (none hangs), and stderr has a line or two, not one per connection. With a
/// higher hard limit, the proxy raises its soft limit and serves them all.
#[test]
fn out_of_descriptors_the_proxy_answers_503_and_says_so_once() {
    raise_own_nofile();
    let tunnels = 3000;
    let (ok, refused, err) = tunnels_through_child(1024, true, tunnels);
    eprintln!("{ok} tunnels served, {refused} refused; the proxy said:\n{err}");
    assert_eq!(ok + refused, tunnels);
    assert!(ok > 300 && ok < 1024, "{ok} tunnels at 1,024 descriptors");
    assert!(refused > 1500, "{refused} refused");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() <= 8,
        "{} stderr lines:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        lines.iter().any(
            |l| l.contains("out of file descriptors") && l.contains("refused in the last 10 s")
        ),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("connection(s) refused: corral was out of file descriptors")),
        "the summary line is missing: {err}"
    );
    let hard = rlimit_hard();
    if hard < 8192 {
        eprintln!("skipping the raised-limit half: this process's hard limit is {hard}");
        return;
    }
    let (ok, refused, err) = tunnels_through_child(8192, true, tunnels);
    assert_eq!((ok, refused), (tunnels, 0), "{err}");
}

fn rlimit_hard() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct, which we provide.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_max
}

/// The end-of-run summary escapes what the jail chose as `corral log` does: control,
/// invisible and look-alike characters cannot forge a line or pass for another name.
#[test]
fn the_summary_escapes_invisible_and_lookalike_characters() {
    let b = corral_net::Blocked {
        method: "DNS".into(),
        target: "git\u{ad}hub\u{ff0e}com\u{200b}\u{1b}[2K".into(),
        rule: "not in network.allow\u{202e}".into(),
        fix: "allow with: corral run --allow git\u{feff}hub.com".into(),
        count: 2,
    };
    assert_eq!(
        b.summary_line(),
        "corral: blocked DNS git\\u{ad}hub\\u{ff0e}com\\u{200b}\\u{1b}[2K ×2 (not in network.allow\\u{202e}) — allow with: corral run --allow git\\u{feff}hub.com"
    );
}

/// Tunnels whose client stops reading while the origin keeps sending: the data the proxy has
/// read but cannot pass on is counted in its buffer budget, and past it tunnels read 1 KiB at a
/// time, so what the jail makes corral hold stays near the budget. The control, with no
/// budget, holds up to 64 KiB a tunnel.
#[test]
fn tunnel_data_a_jail_does_not_read_is_bounded() {
    raise_own_nofile();
    // An origin that sends without end.
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in origin.incoming() {
            let Ok(mut s) = s else { break };
            std::thread::spawn(move || {
                let chunk = vec![b'x'; 64 * 1024];
                while s.write_all(&chunk).is_ok() {}
            });
        }
    });
    let tunnels = 64;
    let held = |budget: usize| {
        let h = start(
            rules(&[&format!("origin.test:{port}")], &["127.0.0.0/8"]),
            ProxyConfig {
                buffer_budget: budget,
                ..ProxyConfig::default()
            },
        );
        let connect =
            format!("CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n");
        let mut conns = Vec::new();
        for _ in 0..tunnels {
            let mut s = TcpStream::connect(h.addr).unwrap();
            s.write_all(connect.as_bytes()).unwrap();
            let mut head = [0u8; 39];
            s.read_exact(&mut head).unwrap();
            assert!(
                head.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
            conns.push(s); // never read again
        }
        let proxy = h.handle.proxy().clone();
        let (mut last, mut same, mut most) = (usize::MAX, 0, 0);
        for _ in 0..300 {
            std::thread::sleep(Duration::from_millis(100));
            let now = proxy.buffered_bytes();
            most = most.max(now);
            same = if now == last { same + 1 } else { 0 };
            last = now;
            if same == 10 {
                break;
            }
        }
        most
    };
    const KIB: usize = 1024;
    let unbounded = held(usize::MAX);
    assert!(
        unbounded > tunnels * 16 * KIB,
        "control: {tunnels} stalled tunnels held only {unbounded} bytes"
    );
    let budget = 256 * KIB;
    let bounded = held(budget);
    assert!(
        bounded <= budget + 2 * 64 * KIB + tunnels * 2 * KIB,
        "{tunnels} stalled tunnels held {bounded} bytes over a {budget}-byte budget"
    );
}

/// A `host_ports` bridge refuses a connection it cannot record: closed before a byte is relayed
/// to the host's port (the control, before the log breaks, is echoed).
#[test]
fn a_host_port_connection_that_cannot_be_recorded_is_closed() {
    let target = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = corral_audit::AuditLog::at(&path);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.spawn(corral_net::forward_port(
        l,
        target,
        log.clone(),
        "j".into(),
        Duration::from_secs(30),
    ));
    let echo = |msg: &[u8]| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(msg);
        let mut got = vec![0u8; msg.len()];
        match s.read_exact(&mut got) {
            Ok(()) => got,
            Err(_) => Vec::new(),
        }
    };
    assert_eq!(echo(b"before"), b"before");
    std::fs::rename(&path, dir.path().join("moved.jsonl")).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert_eq!(echo(b"after"), b"", "an unrecorded connection was bridged");
    assert!(log.failures().is_some());
}
