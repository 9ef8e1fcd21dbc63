//! The native jail's network capabilities beyond the proxy:
//! - `--publish PORT`: the host's 127.0.0.1:PORT reaches the jail's loopback PORT, and no other
//!   jail port is reachable;
//! - `network.dns = "stub"`: allowlisted names resolve (to the stub's synthetic addresses), and
//!   programs that ignore the proxy variables reach an allowed origin through the proxy's
//!   decision while denied names do not resolve and other direct connections fail; without it
//!   (the default) the jail has no DNS at all.
//!
//! The allowed origin is this machine's loopback name (the proxy resolves it itself) opened with
//! `allow_cidrs`, as in jail_net_proxy.rs.

mod e2e_support;
mod jail_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::time::Duration;

use jail_support::*;

/// A port free on the host's loopback right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An HTTP GET to the host's 127.0.0.1:`port`; the response, or the connection error.
fn get(port: u16) -> Result<String, std::io::Error> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(b"GET /hello HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Dev servers in the jail on 127.0.0.1:`ports`, answering `JAIL-DEV-SERVER PORT PATH`; prints
/// READY, then waits until the project's `.done` file appears.
fn dev_servers(ports: &[u16]) -> String {
    let list = ports
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
import http.server, os, threading, time
# The socket factory (corral's control socket) is nowhere in the jail: no socket among this
# process's descriptors, and PID 1's cannot be read.
def links(d):
    out = []
    for f in os.listdir(d):
        try:
            out.append(os.readlink(d + "/" + f))
        except OSError:
            pass
    return out
print("SOCKETS", [l for l in links("/proc/self/fd") if l.startswith("socket:")], flush=True)
try:
    print("PID1-FDS", links("/proc/1/fd"), flush=True)
except OSError as e:
    print("PID1-FDS", type(e).__name__, flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("JAIL-DEV-SERVER %d %s" % (self.server.server_address[1], self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
for p in [{list}]:
    s = http.server.HTTPServer(("127.0.0.1", p), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("READY", flush=True)
deadline = time.time() + 120
while not os.path.exists(".done") and time.time() < deadline:
    time.sleep(0.05)
print("END", flush=True)
"#
    )
}

#[test]
fn a_published_port_reaches_the_jails_dev_server_and_no_other_port_does() {
    let w = World::new();
    // The host's 127.0.0.1:other is the test's own for the whole test: whatever answers there
    // must be this listener, never the jail's dev server on the same port number.
    let host_other = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = host_other.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in host_other.incoming().flatten() {
            // Read the request before answering: closing with unread data resets the
            // connection.
            let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
            let mut s = BufReader::new(s);
            let mut line = String::new();
            while s.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = s
                .get_mut()
                .write_all(b"HTTP/1.0 200 OK\r\n\r\nTEST-HOST-LISTENER");
        }
    });
    // The published port is free when picked but corral binds it later: another process may
    // take it meanwhile, so a run that finds it in use is retried with a fresh port.
    let mut attempt = 0;
    let (published, mut child, mut stdout, seen) = loop {
        attempt += 1;
        let published = free_port();
        let mut c = w.corral();
        c.args(["run", "--publish", &published.to_string(), "--"])
            .args(["python3", "-c", &dev_servers(&[published, other])])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("run corral");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut seen = String::new();
        let mut ended = None;
        while !seen.contains("READY") {
            line.clear();
            if stdout.read_line(&mut line).unwrap() == 0 {
                let mut err = String::new();
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                let _ = child.wait();
                ended = Some(err);
                break;
            }
            seen.push_str(&line);
        }
        match ended {
            None => break (published, child, stdout, seen),
            Some(err)
                if attempt < 3
                    && err.contains(&format!(
                        "127.0.0.1:{published} is already in use on this host"
                    )) =>
            {
                eprintln!("port {published} was taken before corral bound it: retrying");
            }
            Some(err) => panic!("the jail ended before its servers were ready: {seen}{err}"),
        }
    };

    let reply = get(published);
    let unpublished = get(other);
    // The jail goes on to its end marker once the test is done with it.
    write(&w.project.join(".done"), "");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    let o = format!("{seen}{rest}{err}");
    assert!(rest.contains("END") && status.success(), "{status:?} {o}");

    assert!(seen.contains("SOCKETS []"), "{o}");
    // PID 1 is non-dumpable: its descriptors cannot be read (and hold no socket either).
    let pid1 = seen
        .lines()
        .find(|l| l.starts_with("PID1-FDS"))
        .unwrap_or_default();
    assert!(
        pid1 == "PID1-FDS []" || pid1 == "PID1-FDS PermissionError",
        "{o}"
    );

    let reply = reply.unwrap_or_else(|e| panic!("published port {published}: {e}\n{o}"));
    assert!(
        reply.contains(&format!("JAIL-DEV-SERVER {published} /hello")),
        "{reply}\n{o}"
    );
    // The jail's other dev server listens on its own loopback only: on the host the same port
    // is the test's listener.
    let unpublished = unpublished.unwrap_or_else(|e| panic!("the test's own port {other}: {e}"));
    assert!(
        unpublished.contains("TEST-HOST-LISTENER") && !unpublished.contains("JAIL-DEV-SERVER"),
        "{unpublished}\n{o}"
    );

    // The published connection is audited: the decision, then the close with its bytes.
    let records: Vec<_> = w
        .audit_records()
        .into_iter()
        .filter(|r| r["kind"] == "net" && r["method"] == "PUBLISH")
        .collect();
    assert!(
        records.iter().any(|r| r["phase"] == "decision"
            && r["decision"] == "allow"
            && r["port"] == published
            && r["rule"] == format!("network.publish: {published}")),
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| r["phase"] == "close"
            && r["port"] == published
            && r["bytes_down"].as_u64().unwrap_or(0) > 0),
        "{records:?}"
    );
    assert!(
        records.iter().all(|r| r["port"] == published),
        "{records:?}"
    );
}

#[test]
fn publishing_a_port_the_host_already_uses_fails_before_the_jail_starts() {
    let w = World::new();
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let mut c = w.corral();
    c.args(["run", "--publish", &port.to_string(), "--"])
        .args(["sh", "-c", "echo JAIL-RAN"]);
    let out = run(c);
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(!out.stdout.contains("JAIL-RAN"), "{}", out.both());
    assert!(
        out.stderr
            .contains(&format!("127.0.0.1:{port} is already in use on this host")),
        "{}",
        out.both()
    );
    drop(held);
}

fn in_pool(addr: &str) -> bool {
    addr.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.octets()[0] == 198 && (a.octets()[1] & 0xfe) == 18)
}

#[test]
fn with_the_stub_resolver_allowed_names_resolve_and_direct_connections_go_through_the_proxy() {
    let Some(name) = e2e_support::loopback_name() else {
        eprintln!(
            "skipping: this machine's host name does not resolve to loopback only, so there is \
             no name the proxy can resolve to a test origin"
        );
        return;
    };
    let w = World::new();
    let port = origin();
    // A second port some pattern names (so the stub captures it) that the allowed name's own
    // pattern does not: the proxy's decision, not the capture, must refuse it.
    let other = free_port();
    let policy = w.outside.join("net.toml");
    write(
        &policy,
        &format!(
            "[network]\nmode = \"proxy\"\ndns = \"stub\"\n\
             allow = [\"{name}:{port}\", \"unused.invalid:{other}\"]\n\
             deny = [\"denied-by-rule.{name}\"]\n\
             allow_cidrs = [\"127.0.0.1/32\"]\n[limits]\nenforce = \"best-effort\"\n"
        ),
    );
    let script = format!(
        r#"
echo "RESOLV $(grep -v '^#' /etc/resolv.conf)"
echo "GETENT-ALLOWED $(getent hosts {name})"
getent hosts denied.example >/dev/null; echo "GETENT-DENIED rc=$?"
# Programs that ignore the proxy variables: curl told so, and a raw Python socket.
echo "CURL-ALLOWED $(curl -s --max-time 20 --noproxy '*' http://{name}:{port}/captured)"
curl -s --max-time 20 --noproxy '*' http://denied.example:{port}/x >/dev/null; echo "CURL-DENIED rc=$?"
python3 - <<'PY'
import socket
def get(host, port):
    try:
        s = socket.create_connection((host, port), timeout=20)
        s.sendall(b"GET /raw HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            c = s.recv(4096)
            if not c:
                break
            data += c
        return data.decode(errors="replace").split("\r\n\r\n")[-1] or "closed"
    except OSError as e:
        return "failed %s" % type(e).__name__
print("PY-ALLOWED", get("{name}", {port}))
print("PY-OTHER-PORT", get("{name}", {other}))
print("PY-UNASSIGNED", get("198.19.255.1", {port}))
print("PY-EXTERNAL", get("192.0.2.1", {port}))
def tcp_dns(qname):
    q = b"\x00\x07\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    q += b"".join(bytes([len(l)]) + l.encode() for l in qname.split(".")) + b"\x00\x00\x01\x00\x01"
    s = socket.create_connection(("127.0.0.1", 53), timeout=20)
    s.sendall(len(q).to_bytes(2, "big") + q)
    data = b""
    while len(data) < 2 or len(data) < 2 + int.from_bytes(data[:2], "big"):
        c = s.recv(4096)
        if not c:
            break
        data += c
    r = data[2:]
    an = int.from_bytes(r[6:8], "big")
    return "rcode=%d %s" % (r[3] & 0xf, socket.inet_ntoa(r[-4:]) if an else "-")
print("TCP-DNS-ALLOWED", tcp_dns("{name}"))
print("TCP-DNS-DENIED", tcp_dns("denied.example"))
try:
    socket.getaddrinfo("denied-by-rule.{name}", 443)
    print("PY-DENY-RULE resolved")
except OSError as e:
    print("PY-DENY-RULE failed")
PY
echo END
"#
    );
    let out = w.sh_policy(&policy, &script);
    let o = out.both();
    let line = |prefix: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in\n{o}"))
            .trim()
            .to_string()
    };
    assert_eq!(line("RESOLV "), "nameserver 127.0.0.1", "{o}");
    let resolved = line("GETENT-ALLOWED ");
    let addr = resolved.split_whitespace().next().unwrap_or("");
    assert!(
        in_pool(addr) && resolved.ends_with(&name),
        "{resolved}\n{o}"
    );
    assert_eq!(line("GETENT-DENIED "), "rc=2", "{o}");
    // Over TCP too, with the same (stable) address.
    assert_eq!(line("TCP-DNS-ALLOWED "), format!("rcode=0 {addr}"), "{o}");
    assert_eq!(line("TCP-DNS-DENIED "), "rcode=3 -", "{o}");
    assert_eq!(line("CURL-ALLOWED "), "ORIGIN-OK /captured", "{o}");
    // curl: (6) could not resolve host.
    assert_eq!(line("CURL-DENIED "), "rc=6", "{o}");
    assert_eq!(line("PY-ALLOWED "), "ORIGIN-OK /raw", "{o}");
    // Captured, then closed unanswered (a reset when the request was already in): by the
    // proxy's rules (the name is allowed on {port} only), and for an address nobody resolved.
    let closed = |s: String| s == "closed" || s == "failed ConnectionResetError";
    assert!(closed(line("PY-OTHER-PORT ")), "{o}");
    assert!(closed(line("PY-UNASSIGNED ")), "{o}");
    assert!(line("PY-EXTERNAL ").starts_with("failed"), "{o}");
    assert_eq!(line("PY-DENY-RULE "), "failed", "{o}");

    let net: Vec<_> = w
        .audit_records()
        .into_iter()
        .filter(|r| r["kind"] == "net" && r["phase"] == "decision")
        .collect();
    let has = |f: &dyn Fn(&serde_json::Value) -> bool| net.iter().any(f);
    assert!(
        has(&|r| r["method"] == "DNS A"
            && r["host"] == name.as_str()
            && r["decision"] == "allow"
            && r["address"].as_str().is_some_and(in_pool)),
        "{net:#?}"
    );
    assert!(
        has(&|r| r["method"] == "DNS A"
            && r["host"] == "denied.example"
            && r["decision"] == "deny"
            && r["rule"] == "not in network.allow"),
        "{net:#?}"
    );
    assert!(
        has(&|r| r["method"] == "DNS A"
            && r["host"] == format!("denied-by-rule.{name}")
            && r["decision"] == "deny"
            && r["rule"] == format!("network.deny: denied-by-rule.{name}")),
        "{net:#?}"
    );
    assert_eq!(
        net.iter()
            .filter(|r| r["method"] == "CAPTURE"
                && r["host"] == name.as_str()
                && r["port"] == port
                && r["decision"] == "allow"
                && r["address"] == "127.0.0.1")
            .count(),
        2,
        "{net:#?}"
    );
    assert!(
        has(&|r| r["method"] == "CAPTURE"
            && r["host"] == name.as_str()
            && r["port"] == other
            && r["decision"] == "deny"),
        "{net:#?}"
    );
    assert!(
        has(&|r| r["method"] == "CAPTURE"
            && r["host"] == "198.19.255.1"
            && r["decision"] == "deny"),
        "{net:#?}"
    );
    // The end-of-run summary lists the refused names and captures with them, each with what
    // to do about it.
    for want in [
        "corral: blocked DNS denied.example ×".to_string(),
        "allow with: corral run --allow denied.example".to_string(),
        format!("blocked DNS denied-by-rule.{name} ×"),
        format!("blocked CAPTURE 198.19.255.1:{port} ×"),
    ] {
        assert!(out.stderr.contains(&want), "{want}:\n{o}");
    }
    // Nothing else was allowed: every allow is the name's, on its port.
    assert!(
        net.iter()
            .filter(|r| r["decision"] == "allow")
            .all(|r| r["host"] == name.as_str()),
        "{net:#?}"
    );
}

#[test]
fn without_the_stub_the_jail_has_no_dns_at_all() {
    let w = World::new();
    let policy = w.outside.join("net.toml");
    write(
        &policy,
        "[network]\nmode = \"proxy\"\nallow = [\"example.org\"]\n[limits]\nenforce = \"best-effort\"\n",
    );
    let script = r#"
test -e /etc/resolv.conf && echo "RESOLV present" || echo "RESOLV absent"
getent hosts example.org >/dev/null; echo "GETENT rc=$?"
python3 - <<'PY'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect(("127.0.0.1", 53))
# A well-formed query for example.org A to the jail's 127.0.0.1:53.
q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03org\x00\x00\x01\x00\x01"
try:
    s.send(q)
    s.recv(512)
    print("UDP53 answered")
except OSError as e:
    print("UDP53 failed", type(e).__name__)
PY
echo END
"#;
    let mut c = w.corral();
    c.arg("run")
        .arg("--policy")
        .arg(&policy)
        .args(["--", "sh", "-c", script]);
    let out = run(c);
    ran(&out, "END");
    let o = out.both();
    assert!(out.stdout.contains("RESOLV absent"), "{o}");
    assert!(out.stdout.contains("GETENT rc=2"), "{o}");
    assert!(
        out.stdout.contains("UDP53 failed ConnectionRefusedError"),
        "{o}"
    );
    assert!(
        !w.audit_records()
            .iter()
            .any(|r| r["method"].as_str().is_some_and(|m| m.starts_with("DNS"))),
        "{o}"
    );
}
