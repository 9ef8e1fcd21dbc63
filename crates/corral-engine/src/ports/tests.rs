use std::os::unix::fs::MetadataExt;

use similar_asserts::assert_eq;

use super::*;

fn plan(root: &Path, uid: u32) -> Plan {
    let mut plan = Plan::minimal(root, Path::new("/root"), vec!["/bin/sh".into()]);
    plan.image = Some("img".into());
    plan.network.mode = NetworkMode::Proxy;
    plan.network.publish = vec![3000];
    plan.network.host_ports = vec![11434, 5432];
    plan.uid = uid;
    plan.gid = uid;
    plan
}

fn ctx(engine: EngineKind, rootless: bool, state: &Path) -> Context {
    Context {
        engine,
        rootless,
        prefix: "corral".into(),
        corral_bin: PathBuf::from("/opt/c/corral"),
        proxy_bin: Some(PathBuf::from("/opt/c/corral-proxy")),
        state_dir: state.to_path_buf(),
        audit_dir: PathBuf::from("/s/log"),
        jail_id: "j1".into(),
        stdio: crate::argv::Stdio::Piped,
        proxy_image: None,
        limits_enforceable: true,
        skill_source: None,
        upstream_ca: None,
        signin_real: Default::default(),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The whole relay argv: hardened, in the harness's network only, the socket directory its
/// only writable bind; `user` is how it gets its identity.
fn expected(engine: &str, key: &str, hardening: &[&str], user: &[&str]) -> Vec<String> {
    let harness = format!("corral-{key}-j1");
    let mut v = strings(&[
        engine,
        "run",
        "--detach",
        "--name",
        &format!("{harness}-ports"),
        "--label",
        &format!("corral.project={key}"),
        "--label",
        "corral.role=ports",
        "--label",
        "corral.jail=j1",
        "--pull",
        "never",
        "--init",
    ]);
    v.extend(strings(hardening));
    v.extend(strings(&[
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        "seccomp=/s/engine/seccomp.json",
    ]));
    v.extend(strings(user));
    let z = if engine == "podman" { ",z" } else { "" };
    v.extend(strings(&[
        "--cpus",
        "1",
        "--memory",
        "256m",
        "--pids-limit",
        "256",
        "--stop-timeout",
        "5",
        "--network",
        &format!("container:{harness}"),
        "--volume",
        &format!("/opt/c/corral:/usr/local/bin/corral:ro{z}"),
        "--volume",
        &format!("/s/engine/ports/j1:/run/corral-ports:rw{z}"),
        "--entrypoint",
        "/usr/local/bin/corral",
        "img",
        "port-relay",
        "--dir",
        "/run/corral-ports",
        "--publish",
        "3000",
        "--host-port",
        "11434",
        "--host-port",
        "5432",
    ]));
    v
}

#[test]
fn the_relay_container_argv_for_each_engine_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let state = Path::new("/s/engine");
    let podman_tmpfs = ["--read-only", "--read-only-tmpfs"];
    let docker_tmpfs = [
        "--read-only",
        "--tmpfs",
        "/tmp:rw,nosuid,nodev,mode=1777",
        "--tmpfs",
        "/var/tmp:rw,nosuid,nodev,mode=1777",
        "--tmpfs",
        "/run:rw,nosuid,nodev,mode=0755",
    ];
    // Root: the relay runs as nobody (the socket directory is chowned to it).
    let p = plan(dir.path(), 0);
    let c = ctx(EngineKind::Podman, false, state);
    let key = c.names(&p).key;
    assert_eq!(
        relay_run(&p, &c).unwrap().argv(),
        expected("podman", &key, &podman_tmpfs, &["--user", "65534:65534"])
    );
    let c = ctx(EngineKind::Docker, false, state);
    assert_eq!(
        relay_run(&p, &c).unwrap().argv(),
        expected("docker", &key, &docker_tmpfs, &["--user", "65534:65534"])
    );
    // Rootless podman: the caller's uid, kept; a docker-group user: the caller's uid.
    let p = plan(dir.path(), 1000);
    let c = ctx(EngineKind::Podman, true, state);
    assert_eq!(
        relay_run(&p, &c).unwrap().argv(),
        expected(
            "podman",
            &key,
            &podman_tmpfs,
            &[
                "--userns",
                &format!("container:corral-{key}-j1"),
                "--user",
                "1000:1000"
            ]
        )
    );
    let c = ctx(EngineKind::Docker, false, state);
    assert_eq!(
        relay_run(&p, &c).unwrap().argv(),
        expected("docker", &key, &docker_tmpfs, &["--user", "1000:1000"])
    );
}

#[test]
fn no_relay_without_ports_or_with_the_hosts_network() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let c = ctx(EngineKind::Podman, true, &state);
    let mut p = plan(dir.path(), 1000);
    p.network.mode = NetworkMode::Host;
    let r = Relays::bind(&p, &c).unwrap();
    assert!(r.dir.is_none() && r.published.is_empty() && r.host_ports.is_empty());
    assert!(!c.ports_dir().exists());
    let mut p = plan(dir.path(), 1000);
    p.network.publish.clear();
    p.network.host_ports.clear();
    assert!(Relays::bind(&p, &c).unwrap().dir.is_none());
    assert!(!c.ports_dir().exists());
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn bind_makes_a_private_directory_with_the_host_ports_sockets_and_refuses_a_taken_port() {
    let dir = tempfile::tempdir().unwrap();
    // A long state path: the sockets are reached through the directory's descriptor.
    let state = dir.path().join("s".repeat(100));
    let c = ctx(EngineKind::Podman, true, &state);
    let mut p = plan(dir.path(), 1000);
    // A port free when picked may be taken by a test running beside this one before the bind
    // (which fails then, before it makes the directory): picked again.
    let (published, host, r) = (0..20)
        .find_map(|_| {
            let (published, host) = (free_port(), free_port());
            p.network.publish = vec![published];
            p.network.host_ports = vec![host];
            match Relays::bind(&p, &c) {
                Ok(r) => Some((published, host, r)),
                Err(e)
                    if e.to_string()
                        .contains(&format!("binding 127.0.0.1:{published}")) =>
                {
                    None
                }
                Err(e) => panic!("{e}"),
            }
        })
        .expect("no free port in 20 tries");
    let d = c.ports_dir();
    let m = fs::metadata(&d).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o700);
    let sock = fs::symlink_metadata(d.join(host_socket(host))).unwrap();
    assert_eq!(sock.mode() & 0o777, 0o600);
    assert!(TcpStream::connect(("127.0.0.1", published)).is_ok());
    // The same jail id again: its directory exists, which is refused.
    drop(r);
    let mut again = plan(dir.path(), 1000);
    again.network.publish.clear();
    assert!(Relays::bind(&again, &c).is_err());
    // A published port in use is an error naming it.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    again.network.publish = vec![port];
    let err = Relays::bind(&again, &c).err().unwrap().to_string();
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}

/// The relay's two directions with the sockets it shares with corral, in this process's
/// network namespace (the container only changes which loopback it is).
#[test]
fn the_relay_connects_its_sockets_to_the_listed_loopback_ports_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    // publish: a server on 127.0.0.1:P is reached through the socket p<P>.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let published = server.local_addr().unwrap().port();
    thread::spawn(move || {
        for mut c in server.incoming().flatten() {
            let _ = c.write_all(b"from-the-harness\n");
        }
    });
    // host_ports: 127.0.0.1:H is a listener of the relay, each connection sent to h<H>.
    let host = free_port();
    let host_side = UnixListener::bind(d.join(host_socket(host))).unwrap();
    thread::spawn(move || {
        for mut c in host_side.incoming().flatten() {
            let _ = c.write_all(b"from-the-host\n");
        }
    });
    let (dd, p) = (d.clone(), [published]);
    thread::spawn(move || serve_relay(&dd, &p, &[host]));
    let read_all = |mut s: UnixStream| {
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        got
    };
    let mut got = String::new();
    for _ in 0..200 {
        if let Ok(s) = UnixStream::connect(d.join(publish_socket(published))) {
            got = read_all(s);
            break;
        }
        thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(got, "from-the-harness\n");
    let mut got = String::new();
    for _ in 0..200 {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", host)) {
            s.read_to_string(&mut got).unwrap();
            break;
        }
        thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(got, "from-the-host\n");
    // No socket for a port not listed.
    assert!(UnixStream::connect(d.join(publish_socket(host))).is_err());
}

#[test]
fn leftovers_are_the_ports_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(remove_leftovers(dir.path()).unwrap(), None);
    fs::create_dir_all(dir.path().join("ports/j1")).unwrap();
    assert_eq!(
        remove_leftovers(dir.path()).unwrap(),
        Some(dir.path().join("ports"))
    );
    assert!(!dir.path().join("ports").exists());
}
