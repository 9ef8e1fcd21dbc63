//! The native jail's network capabilities beyond the proxy: `--publish PORT` (the host's
//! 127.0.0.1:PORT reaches the jail's loopback PORT, and no other jail port is reachable).

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
    let published = free_port();
    let other = free_port();
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
            panic!("the jail ended before its servers were ready: {seen}{err}");
        }
        seen.push_str(&line);
    }

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

    let reply = reply.unwrap_or_else(|e| panic!("published port {published}: {e}\n{o}"));
    assert!(
        reply.contains(&format!("JAIL-DEV-SERVER {published} /hello")),
        "{reply}\n{o}"
    );
    // The jail's other dev server listens on its own loopback only: nothing on the host.
    let e = unpublished.expect_err("an unpublished jail port answered on the host");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");

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
