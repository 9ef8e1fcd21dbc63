//! The namespace side of network mode `proxy`: the jail's 127.0.0.1:3128 is corral's proxy,
//! `host_ports` reach the host's loopback port, and the jail cannot take those listeners over.

mod jail_support;

use std::io::{Read, Write};
use std::net::TcpListener;

use jail_support::*;

#[test]
fn the_proxy_listener_inside_the_jail_is_corrals_proxy() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "proxy",
        "--",
        "python3",
        "-c",
        r#"
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"GET http://denied.invalid/ HTTP/1.1\r\nHost: denied.invalid\r\nConnection: close\r\n\r\n")
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
print("STATUS", data.split(b"\r\n")[0].decode())
t = socket.socket()
try:
    t.bind(("127.0.0.1", 3128))
    t.listen()
    print("TOOK-OVER-3128")
except OSError as e:
    print("bind 3128:", e)
print("END")
"#,
    ]);
    let out = run(c);
    ran(&out, "END");
    assert!(out.stdout.contains("STATUS HTTP/1.1 403"), "{}", out.both());
    assert!(!out.stdout.contains("TOOK-OVER-3128"), "{}", out.both());
}

#[test]
fn host_ports_reach_the_hosts_loopback_port() {
    let w = World::new();
    let service = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = service.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = service.accept().unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(b"HOST-SERVICE-SAYS-HI ").unwrap();
        conn.write_all(&buf).unwrap();
    });
    let policy = w.outside.join("net.toml");
    write(
        &policy,
        &format!(
            "[network]\nmode = \"proxy\"\nhost_ports = [{port}]\n[limits]\nenforce = \"best-effort\"\n"
        ),
    );
    let mut c = w.corral();
    c.arg("run").arg("--policy").arg(&policy).args([
        "--",
        "python3",
        "-c",
        &format!(
            "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n\
                 s.sendall(b'PING!')\ndata = b''\nwhile len(data) < 26:\n    c = s.recv(100)\n    \
                 if not c: break\n    data += c\nprint(data.decode())\nprint('END')\n"
        ),
    ]);
    let out = run(c);
    ran(&out, "END");
    assert!(
        out.stdout.contains("HOST-SERVICE-SAYS-HI PING!"),
        "{}",
        out.both()
    );
    server.join().unwrap();
}

#[test]
fn network_host_shares_the_hosts_network_namespace() {
    let w = World::new();
    let service = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = service.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = service.accept().unwrap();
        conn.write_all(b"HOST-NETWORK").unwrap();
    });
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "host",
        "--",
        "python3",
        "-c",
        &format!(
            "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n\
             print(s.recv(100).decode())\nprint('END')\n"
        ),
    ]);
    let out = run(c);
    ran(&out, "END");
    assert!(out.stdout.contains("HOST-NETWORK"), "{}", out.both());
    server.join().unwrap();
}
