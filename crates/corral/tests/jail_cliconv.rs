//! The command line's conventions that need a jail: a destination the policy allows but the proxy
//! could not reach is in the end-of-run summary with its reason (the jail only saw a 502), and
//! `corral allow ADDRESS` gives the one answer that lets the jail reach that address (the
//! pattern and the address range), where the pattern alone is still refused.

mod jail_support;

use std::io::Write;
use std::net::TcpListener;

use jail_support::*;

/// A script that asks the jail's proxy for a tunnel to 127.0.0.1:PORT and prints the status
/// line it answered.
fn connect_script(port: u16) -> String {
    format!(
        "python3 -c '\n\
import os, socket\n\
h, p = os.environ[\"HTTP_PROXY\"].split(\"//\")[1].rstrip(\"/\").rsplit(\":\", 1)\n\
s = socket.create_connection((h, int(p)))\n\
s.sendall(b\"CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n\")\n\
print(\"STATUS\", s.recv(200).split(b\"\\r\\n\")[0].decode())\n\
'; echo END"
    )
}

fn run_connect(w: &World, port: u16) -> Out {
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "proxy",
        "--",
        "sh",
        "-c",
        &connect_script(port),
    ]);
    let out = run(c);
    ran(&out, "END");
    out
}

/// A loopback port nobody listens on (bound, then closed: the kernel does not hand it out again
/// at once).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn an_allowed_destination_the_proxy_could_not_reach_is_in_the_summary_with_its_reason() {
    let w = World::new();
    let port = closed_port();
    // `corral allow` of an address: the pattern and the address range, in a file the user's own
    // command created (trusted).
    let mut c = w.corral();
    c.args(["allow", &format!("127.0.0.1:{port}")]);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());

    let out = run_connect(&w, port);
    assert!(
        out.stdout.contains("STATUS HTTP/1.1 502"),
        "the proxy did not answer 502:\n{}",
        out.both()
    );
    let want = format!(
        "corral: failed CONNECT 127.0.0.1:{port} ×1 (connect to 127.0.0.1:{port}: Connection \
         refused (os error 111))"
    );
    assert!(
        out.stderr.lines().any(|l| l == want),
        "no line {want:?} in the summary:\n{}",
        out.stderr
    );
    assert!(!out.stderr.contains("corral: blocked"), "{}", out.stderr);
}

#[test]
fn allow_of_an_address_lets_the_jail_reach_it_where_the_pattern_alone_does_not() {
    let w = World::new();
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    // Accept and close every connection (the tunnel's far end), until the test ends.
    std::thread::spawn(move || {
        for s in origin.incoming().flatten() {
            let _ = (&s).write_all(b"");
        }
    });

    // Control: the pattern alone, as `corral allow` wrote it before. The name check passes, the
    // address check refuses loopback.
    let pattern_only = w.root.join("pattern-only.toml");
    write(
        &pattern_only,
        &format!("[network]\nallow = [\"127.0.0.1:{port}\"]\n"),
    );
    let mut c = w.corral();
    c.arg("run")
        .arg("--policy")
        .arg(&pattern_only)
        .args(["--", "sh", "-c", &connect_script(port)]);
    let out = run(c);
    ran(&out, "END");
    assert!(
        out.stdout.contains("STATUS HTTP/1.1 403"),
        "the control was not refused:\n{}",
        out.both()
    );
    assert!(
        out.stderr.contains("not in network.allow_cidrs"),
        "{}",
        out.stderr
    );

    // `corral allow 127.0.0.1:PORT`: both halves, and the tunnel opens.
    let mut c = w.corral();
    c.args(["allow", &format!("127.0.0.1:{port}")]);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());
    let out = run_connect(&w, port);
    assert!(
        out.stdout.contains("STATUS HTTP/1.1 200"),
        "the address allowed by `corral allow` was not reached:\n{}",
        out.both()
    );
    assert!(!out.stderr.contains("corral: blocked"), "{}", out.stderr);
    assert!(!out.stderr.contains("corral: failed"), "{}", out.stderr);
}

/// `corral run -- yes | head -1`: the jailed command dies of SIGPIPE as it would outside (exit
/// 128+13, no message), instead of inheriting the SIGPIPE corral ignores and printing "Broken
/// pipe". Standard output is a pipe whose reader is gone before the jail starts.
#[test]
fn a_jailed_command_writing_to_a_closed_pipe_ends_quietly_as_outside() {
    let w = World::new();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--", "yes"])
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(std::process::Stdio::piped());
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 13), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

/// The smallest memory limit corral accepts starts a jail and a command in it (as root with a
/// cgroup; unprivileged, through the world's best-effort fallback).
#[test]
fn the_memory_floor_starts_a_jail() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--memory",
        "6m",
        "--",
        "sh",
        "-c",
        "echo END",
    ]);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());
    ran(&out, "END");
}
