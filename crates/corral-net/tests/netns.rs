//! The proxy against an origin in a network namespace the test creates (root only): a veth pair
//! with unique names, the origin on the namespace's side. Allowed by name + allow_cidrs it works
//! (GET on the default port 80, CONNECT to 443, keep-alive); without the CIDR the same name is
//! denied as a private address; names not allowed never produce a packet to it.

mod common;

use std::net::{IpAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use corral_net::{Listener, Proxy, ProxyConfig, StaticResolver};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

struct Netns {
    name: String,
    host_if: String,
    ns_ip: IpAddr,
    server: Option<Child>,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Netns {
    /// `None` (with the reason printed) when not root or `ip netns` is unavailable.
    fn create() -> Option<Netns> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: creating a network namespace needs root");
            return None;
        }
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let name = format!("cnet{pid}-{n}");
        let host_if = format!("cvh{}{n}", pid % 100_000);
        let ns_if = format!("cvn{}{n}", pid % 100_000);
        let (a, b) = ((pid % 250) as u8, ((n % 60) * 4) as u8);
        let host_ip = format!("10.213.{a}.{}", b + 1);
        let ns_ip = format!("10.213.{a}.{}", b + 2);
        if !ip(&["netns", "add", &name]) {
            eprintln!("skipping: `ip netns add` failed (no iproute2 or no netns support)");
            return None;
        }
        let ns = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            ns_ip: ns_ip.parse().unwrap(),
            server: None,
        };
        let ok = ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ]) && ip(&["link", "set", &ns_if, "netns", &name])
            && ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if])
            && ip(&["link", "set", &host_if, "up"])
            && ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{ns_ip}/30"),
                "dev",
                &ns_if,
            ])
            && ip(&["-n", &name, "link", "set", &ns_if, "up"])
            && ip(&["-n", &name, "link", "set", "lo", "up"]);
        assert!(
            ok,
            "setting up veth {host_if}/{ns_if} for netns {name} failed"
        );
        Some(ns)
    }

    /// An HTTP/1.1 server on port 80 and a TLS-less echo on 443, inside the namespace.
    fn start_servers(&mut self) {
        let code = format!(
            r#"
import socket, threading, http.server, socketserver
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = ("hello from netns " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
def echo():
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("{ip}", 443)); l.listen(16)
    while True:
        c, _ = l.accept()
        def run(c):
            while True:
                d = c.recv(65536)
                if not d: break
                c.sendall(d)
            c.close()
        threading.Thread(target=run, args=(c,), daemon=True).start()
threading.Thread(target=echo, daemon=True).start()
S(("{ip}", 80), H).serve_forever()
"#,
            ip = self.ns_ip
        );
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name, "python3", "-c", &code])
            .stdin(Stdio::null())
            .spawn()
            .expect("start the namespace's servers");
        self.server = Some(child);
        // Wait until both ports answer (from the host side, over the veth).
        for _ in 0..100 {
            let up = |port| {
                TcpStream::connect_timeout(&(self.ns_ip, port).into(), Duration::from_millis(100))
                    .is_ok()
            };
            if up(80) && up(443) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the servers in netns {} did not come up", self.name);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        ip(&["link", "del", &self.host_if]);
        ip(&["netns", "del", &self.name]);
    }
}

fn proxy_for(
    ns: &Netns,
    cidrs: &[&str],
) -> (
    std::net::SocketAddr,
    corral_net::ProxyHandle,
    corral_audit::AuditLog,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let log = corral_audit::AuditLog::at(dir.path().join("audit.jsonl"));
    let resolver = StaticResolver::new()
        .with("ns-origin.test", &[ns.ns_ip])
        .with("elsewhere.test", &[ns.ns_ip]);
    let proxy = Proxy::new(rules(&["ns-origin.test"], cidrs), log.clone(), "netns")
        .with_resolver(Arc::new(resolver))
        .with_config(ProxyConfig::default());
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = corral_net::spawn(Arc::new(proxy), vec![Listener::Proxy(l)]).unwrap();
    (addr, h, log, dir)
}

#[test]
fn origin_in_a_test_namespace_reached_only_when_allowed() {
    let Some(mut ns) = Netns::create() else {
        return;
    };
    ns.start_servers();
    let cidr = format!("{}/32", ns.ns_ip);
    let (addr, _h, log, _d) = proxy_for(&ns, &[&cidr]);

    // GET on the default port, twice on one kept-alive connection.
    let mut c = Client::connect(addr);
    for path in ["/a", "/b"] {
        let r = c
            .request(&format!(
                "GET http://ns-origin.test{path} HTTP/1.1\r\nHost: ns-origin.test\r\n\r\n"
            ))
            .unwrap();
        assert_eq!(
            (r.status, r.text()),
            (200, format!("hello from netns {path}"))
        );
    }
    drop(c);
    // CONNECT to 443 (the default), bytes both ways.
    let mut c = Client::connect(addr);
    let r = c
        .request("CONNECT ns-origin.test:443 HTTP/1.1\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 200);
    use std::io::{Read, Write};
    c.s.write_all(b"through the tunnel").unwrap();
    let mut b = [0u8; 18];
    c.s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"through the tunnel");
    drop(c);
    // Not allowed by name (same address behind it): denied before any connection.
    let resp = exchange(addr, b"GET http://elsewhere.test/ HTTP/1.1\r\n\r\n");
    assert_eq!(status_of(&resp), 403);
    // The IP literal is not a name in the allow list either.
    let resp = exchange(
        addr,
        format!("CONNECT {}:443 HTTP/1.1\r\n\r\n", ns.ns_ip).as_bytes(),
    );
    assert_eq!(status_of(&resp), 403);

    // Without the CIDR the allowed name is refused as a private address.
    let (addr2, _h2, _log2, _d2) = proxy_for(&ns, &[]);
    let resp = exchange(addr2, b"GET http://ns-origin.test/ HTTP/1.1\r\n\r\n");
    assert_eq!(status_of(&resp), 403, "{resp}");
    assert!(
        resp.contains("(private), not in network.allow_cidrs"),
        "{resp}"
    );

    let (records, _) = log.read_all().unwrap();
    let addrs: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.event {
            corral_audit::Event::Net(n) if n.decision == Some(corral_audit::Decision::Allow) => {
                n.address.clone()
            }
            _ => None,
        })
        .collect();
    assert_eq!(addrs, vec![ns.ns_ip.to_string(); 3]);
}
