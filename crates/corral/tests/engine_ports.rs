//! `network.publish` and `network.host_ports` on the container backends for real, podman and
//! docker alike: the relay container in the harness's network namespace and corral on the host,
//! joined by the run's socket directory (crates/corral-engine/src/ports.rs). Each test runs once
//! per engine (`podman::NAME`, `docker::NAME`).
//!
//! Needs the image `localhost/corral-ci-harness:latest` (ci/podman-setup.sh,
//! ci/docker-setup.sh). As root (CI). With `CORRAL_TEST_ROOTLESS=1` an unprivileged user runs
//! the podman tests on rootless podman (the image in that user's storage, slirp4netns,
//! a usable /dev/net/tun, `XDG_RUNTIME_DIR` set: without it podman falls back to `$TMPDIR`,
//! which the harness's `podman run` gets from the plan).

mod engine_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use engine_support::{Engine, IMAGE, World, on_every_engine, text};

on_every_engine!(
    published_and_host_ports_cross_and_no_other_port_does,
    sigterm_to_corral_removes_the_relay_and_its_sockets,
    corral_down_removes_what_a_killed_run_with_ports_left,
);

/// Whether this test can run here: the engine's `ready`, or, rootless, podman with the image.
fn ready(e: Engine) -> bool {
    if std::env::var_os("CORRAL_TEST_ROOTLESS").is_some() && !engine_support::is_root() {
        if e == Engine::Docker {
            eprintln!("skipping: docker is not rootless here");
            return false;
        }
        let image = e.cli(&["image", "exists", IMAGE]);
        assert!(image.status.success(), "rootless podman has no {IMAGE}");
        return true;
    }
    e.ready(&[])
}

/// Removes the run's relay containers before `World` removes the rest: podman keeps a
/// container whose network namespace another one still shares.
struct RelaysFirst<'a>(&'a World);

impl Drop for RelaysFirst<'_> {
    fn drop(&mut self) {
        for c in self.0.containers() {
            if c.ends_with("-ports") {
                self.0.engine.rm_force(&[&c]);
            }
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A host server on 127.0.0.1:PORT answering `line` to each connection.
fn host_server(line: &'static str) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(line.as_bytes());
        }
    });
    port
}

fn trust_ports(w: &World, host_port: u16, published: u16) {
    std::fs::write(
        w.project.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n\
             host_ports = [{host_port}]\npublish = [{published}]\n"
        ),
    )
    .unwrap();
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{}", text(&out));
}

fn run_python(w: &World, script: &str) -> std::process::Command {
    let mut c = w.command(&[
        "run",
        "--engine",
        w.engine.name(),
        "--",
        "/usr/bin/python3",
        "-c",
        script,
    ]);
    c.env("CORRAL_CONTAINER_BIN", env!("CARGO_BIN_EXE_corral"));
    c
}

/// What the host reads from a connection to its 127.0.0.1:PORT ("" when refused or closed
/// without a byte).
fn read_from(port: u16) -> String {
    let mut got = String::new();
    if let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) {
        let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = c.read_to_string(&mut got);
    }
    got
}

/// The first answer on the host's 127.0.0.1:PORT, asked again while `running` (the relay
/// starts a moment after the harness; rootless podman takes seconds). "" after five minutes.
fn answer_on(port: u16, mut running: impl FnMut() -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while std::time::Instant::now() < deadline && running() {
        let got = read_from(port);
        if !got.is_empty() {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    String::new()
}

/// The attack both ways: the harness tries a host port the policy does not list (a host server
/// listens there: the control shows the host reaches it), and the run's Unix sockets; the host
/// tries a harness port not published (the harness listens there).
fn published_and_host_ports_cross_and_no_other_port_does(e: Engine) {
    if !ready(e) {
        return;
    }
    let w = World::new(e, "p");
    let _relays = RelaysFirst(&w);
    let host_port = host_server("from-the-host\n");
    let unlisted_host = host_server("UNLISTED-HOST-PORT\n");
    assert_eq!(read_from(unlisted_host), "UNLISTED-HOST-PORT\n", "control");
    let (published, unpublished) = (free_port(), free_port());
    trust_ports(&w, host_port, published);
    let script = format!(
        r#"
import socket, time
for attempt in range(1200):  # the relay starts a moment after the harness
    try:
        print(socket.create_connection(("127.0.0.1", {host_port}), timeout=5).recv(100).decode().strip())
        break
    except OSError:
        time.sleep(0.1)
try:
    got = socket.create_connection(("127.0.0.1", {unlisted_host}), timeout=5).recv(100)
    print("UNLISTED-REACHED" if got else "unlisted-closed")
except OSError as e:
    print("unlisted-refused")
for name in ("h{host_port}", "p{published}", "h{unlisted_host}"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/run/corral-ports/" + name)
        print("SOCKET-REACHED", name)
    except OSError:
        print("no-socket", name)
srvs = []
for port in ({published}, {unpublished}):
    srv = socket.socket()
    srv.bind(("127.0.0.1", port))
    srv.listen()
    srvs.append(srv)
# First connection: the answer; second: the host is done (after trying the unpublished port).
for i in range(2):
    c, _ = srvs[0].accept()
    c.sendall(b"from-the-harness\n")
    c.close()
print("served")
"#
    );
    let child = run_python(&w, &script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let got = answer_on(published, || true);
    let unpublished_got = read_from(unpublished);
    let done = read_from(published);
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert_eq!(got, "from-the-harness\n", "{t}");
    assert_eq!(
        unpublished_got, "",
        "an unpublished port reached the harness: {t}"
    );
    assert_eq!(done, "from-the-harness\n", "{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "from-the-host\nunlisted-refused\nno-socket h{host_port}\nno-socket p{published}\n\
             no-socket h{unlisted_host}\nserved\n"
        ),
        "{t}"
    );
    assert_no_relay_left(&w);
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
}

/// The project's ports directory on the host (its runs' socket directories).
fn ports_dir(w: &World) -> PathBuf {
    w.state
        .join("corral")
        .join("engine")
        .join(w.key())
        .join("ports")
}

fn socket_dirs(w: &World) -> Vec<String> {
    std::fs::read_dir(ports_dir(w))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Only the project's shared proxy is left: no relay, no harness; no socket directory.
fn assert_no_relay_left(w: &World) {
    let containers = w.containers();
    assert!(
        containers.iter().all(|c| c.ends_with("-proxy")),
        "{containers:?}"
    );
    assert!(socket_dirs(w).is_empty(), "{:?}", socket_dirs(w));
}

/// A run whose harness sleeps once its relay answers on the published port; returns when the
/// relay runs.
fn start_relayed_sleeper(w: &World) -> Child {
    let host_port = host_server("from-the-host\n");
    let published = free_port();
    trust_ports(w, host_port, published);
    let script = format!(
        r#"
import socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", {published}))
srv.listen()
while True:
    c, _ = srv.accept()
    c.sendall(b"up\n")
    c.close()
"#
    );
    // No pipes: the engine client corral started may outlive it and would hold them open.
    let mut child = run_python(w, &script)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let got = answer_on(published, || child.try_wait().unwrap().is_none());
    assert_eq!(got, "up\n", "the relay never answered");
    assert!(
        w.containers().iter().any(|c| c.ends_with("-ports")),
        "{:?}",
        w.containers()
    );
    assert_eq!(
        socket_dirs(w).len(),
        1,
        "control: the run's socket directory"
    );
    child
}

fn sigterm_to_corral_removes_the_relay_and_its_sockets(e: Engine) {
    if !ready(e) {
        return;
    }
    let w = World::new(e, "q");
    let _relays = RelaysFirst(&w);
    let mut child = start_relayed_sleeper(&w);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    assert_no_relay_left(&w);
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
}

fn corral_down_removes_what_a_killed_run_with_ports_left(e: Engine) {
    if !ready(e) {
        return;
    }
    let w = World::new(e, "k");
    let _relays = RelaysFirst(&w);
    let mut child = start_relayed_sleeper(&w);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        w.containers().iter().any(|c| c.ends_with("-ports")),
        "control: a killed run leaves its relay"
    );
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(w.containers().is_empty(), "{:?}", w.containers());
    assert!(!ports_dir(&w).exists(), "{:?}", socket_dirs(&w));
}
