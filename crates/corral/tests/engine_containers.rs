//! The container backends for real, podman and docker alike: a harness container built from the
//! plan, corral's proxy in its own container, the compose executor, and `corral down`. Every test
//! runs once per engine (`podman::NAME`, `docker::NAME`).
//!
//! Needs root and the image `localhost/corral-ci-harness:latest` (a Debian minbase rootfs with
//! bash, curl and python3) in each engine: podman (runc, cgroupfs, netavark) and podman-compose
//! from `ci/podman-setup.sh`, dockerd and docker-compose from `ci/docker-setup.sh`, which `.ci/run`
//! calls. Origins are containers the test starts on its own network; nothing leaves the machine.
//! Every object carries a per-test prefix and is removed at the end.

mod engine_support;

use std::path::Path;
use std::process::Command;

use engine_support::{Engine, IMAGE, World, on_every_engine, on_path, text};

on_every_engine!(
    harness_container_sees_the_project_only_and_reaches_only_allowed_origins,
    compose_executor_answers_corral_exec_from_the_harness,
    an_absent_policy_file_cannot_be_created_from_inside,
    sigterm_to_corral_stops_the_container_and_the_run_is_audited,
    two_projects_never_see_each_others_containers,
    a_proxy_that_cannot_start_is_an_error_that_quotes_its_log,
    the_native_escape_suite_fails_in_the_harness_container,
    publish_and_host_ports_cross_the_internal_network,
    no_repository_planted_during_the_run_is_seen_by_host_git,
    the_containers_terminal_follows_stdin_and_stdout,
    a_name_filesystem_hide_matches_cannot_be_made_in_the_project,
);

/// An HTTP origin on the external network: a container answering `body` on port 8000.
fn start_origin(e: Engine, name: &str, network: &str, body: &str) {
    e.ok(&[
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        network,
        "--pull",
        "never",
        IMAGE,
        "bash",
        "-c",
        &format!(
            "mkdir -p /tmp/w && echo {body} > /tmp/w/index.html && cd /tmp/w && exec python3 -m http.server 8000"
        ),
    ]);
}

fn harness_container_sees_the_project_only_and_reaches_only_allowed_origins(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "h");
    let p = &w.project;
    std::fs::write(p.join("input.txt"), "hello-from-host\n").unwrap();
    std::fs::write(p.join(".env"), "TOPSECRET=1\n").unwrap();
    let secret = w.dir.path().join("host-secret.txt");
    std::fs::write(&secret, "HOSTSECRET\n").unwrap();

    // The shared external network, made first so the test knows its subnet: the origins live
    // there, on private addresses the proxy refuses unless allow_cidrs lists them.
    let external = format!("{}-external", w.prefix);
    e.ok(&["network", "create", &external]);
    let subnet = e.subnet(&external);
    let ok = format!("{}-ok", w.prefix);
    let no = format!("{}-no", w.prefix);
    start_origin(e, &ok, &external, "origin-ok-body");
    start_origin(e, &no, &external, "origin-no-body");
    std::fs::write(
        p.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\n\n[filesystem]\nhide = [\".env\"]\n\n\
             [network]\nmode = \"proxy\"\nallow = [\"{ok}:8000\"]\nallow_cidrs = [\"{}\"]\n",
            subnet
        ),
    )
    .unwrap();
    // It opens destinations: the user trusts it, as after reviewing it.
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{}", text(&out));

    let script = format!(
        r#"
cat input.txt
echo written-in-jail > output.txt
cat {secret} 2>/dev/null && echo SECRET-READ || echo secret-unreadable
grep -q TOPSECRET .env 2>/dev/null && echo ENV-READ || echo env-hidden
echo widened >> corral.toml 2>/dev/null && echo POLICY-WRITTEN || echo policy-read-only
for i in $(seq 150); do curl -sf -o /dev/null http://{ok}:8000/ && break; sleep 0.2; done
curl -sS -m 10 http://{ok}:8000/
curl -sS -m 10 -o /dev/null -w 'denied-status=%{{http_code}}\n' http://{no}:8000/
curl -sS -m 5 --noproxy '*' http://{ok}:8000/ 2>/dev/null && echo DIRECT-REACHED || echo direct-blocked
curl -sS -m 5 --noproxy '*' http://{no}:8000/ 2>/dev/null && echo DIRECT-REACHED || echo direct-blocked
python3 - {dns_names} <<'PY'
# Ask every resolver the container is given for each name, as a program ignoring the proxy
# would (a DNS answer is also a way out: names carry data to whoever resolves them).
import socket, struct, sys
servers = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
for name in sys.argv[1:]:
    query = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    query += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    query += struct.pack(">HH", 1, 1)
    answered = False
    for ns in servers:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        try:
            s.sendto(query, (ns, 53))
            answered |= struct.unpack(">H", s.recv(512)[6:8])[0] > 0
        except OSError:
            pass
    print(("DNS-ANSWERED-" if answered else "no-dns-answer-") + name.split("-")[-1])
PY
"#,
        secret = secret.display(),
        // podman's internal network has no resolver at all; docker's embedded one cannot be
        // turned off and answers the internal network's container names (`proxy`), nothing else.
        dns_names = match e {
            Engine::Podman => format!("proxy {no}"),
            Engine::Docker => no.clone(),
        },
    );
    let out = w.corral(&[
        "run",
        "--engine",
        e.name(),
        "--",
        "/bin/bash",
        "-c",
        &script,
    ]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "hello-from-host",
            "secret-unreadable",
            "env-hidden",
            "policy-read-only",
            "origin-ok-body",
            "denied-status=403",
            "direct-blocked",
            "direct-blocked",
        ]
        .into_iter()
        .chain((e == Engine::Podman).then_some("no-dns-answer-proxy"))
        .chain(["no-dns-answer-no"])
        .collect::<Vec<_>>(),
        "{t}"
    );
    assert_eq!(
        std::fs::read_to_string(p.join("output.txt")).unwrap(),
        "written-in-jail\n"
    );
    assert!(
        !std::fs::read_to_string(p.join("corral.toml"))
            .unwrap()
            .contains("widened")
    );

    // The proxy container's decisions are in the project's audit log, next to the run's own.
    let audit = w.audit();
    let records: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit lines are JSON"))
        .collect();
    let net = |host: &str, decision: &str| {
        records
            .iter()
            .any(|r| r["kind"] == "net" && r["host"] == host && r["decision"] == decision)
    };
    assert!(net(&ok, "allow"), "no allow record for {ok}:\n{audit}");
    assert!(net(&no, "deny"), "no deny record for {no}:\n{audit}");
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "jail" && r["event"] == "exit" && r["exit_code"] == 0),
        "{audit}"
    );

    // A second run reuses the networks and the proxy.
    let out = w.corral(&["run", "--engine", e.name(), "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The command's own exit code comes back.
    let out = w.corral(&[
        "run",
        "--engine",
        e.name(),
        "--",
        "/bin/bash",
        "-c",
        "exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));

    assert!(e.rm_force(&[&ok, &no]).status.success());
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(w.leftovers(), (vec![], vec![]), "{}", text(&out));
}

fn compose_executor_answers_corral_exec_from_the_harness(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "x");
    let p = &w.project;
    // The project's image has an ENTRYPOINT of its own: the service's gate replaces it (were
    // it kept, it would be PID 1 in front of the gate, which then refuses to start).
    std::fs::write(
        p.join("Dockerfile"),
        format!("FROM {IMAGE}\nENTRYPOINT [\"/bin/false\"]\n"),
    )
    .unwrap();
    std::fs::write(
        p.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\nengine = \"{}\"\n\n[network]\nmode = \"proxy\"\n\n[executor]\ntarget = \"compose:executor\"\n",
            e.name()
        ),
    )
    .unwrap();
    // A compose executor runs the agent's commands elsewhere: the user trusts the file.
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{}", text(&out));
    // The project's own compose files, as the jail could leave them: an `executor` service
    // that mounts the host's `/`, and a `.env` whose COMPOSE_FILE names one more such file. The
    // executor is started with corral's file list only, so none of them is read.
    let hostile = "services:\n  executor:\n    image: {IMAGE}\n    volumes: [\"/:/hostroot:ro\"]\n";
    std::fs::write(
        p.join("docker-compose.yml"),
        format!(
            "services:\n  app:\n    image: {IMAGE}\n    command: [\"true\"]\n    network_mode: none\n  executor:\n    volumes: [\"/:/hostroot:ro\"]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        p.join("evil-compose.yml"),
        hostile.replace("{IMAGE}", IMAGE),
    )
    .unwrap();
    std::fs::write(
        p.join(".env"),
        "COMPOSE_FILE=docker-compose.yml:evil-compose.yml\n",
    )
    .unwrap();
    std::fs::write(
        p.join("docker-compose.override.yml"),
        "# mine\nx-note: kept\n",
    )
    .unwrap();

    let out = w.corral(&["init", "--compose"]);
    assert!(out.status.success(), "{}", text(&out));
    // corral writes nothing in the project's compose files.
    assert_eq!(
        std::fs::read_to_string(p.join("docker-compose.override.yml")).unwrap(),
        "# mine\nx-note: kept\n"
    );
    // The command init prints, run as printed (the compose program as this machine has it).
    let stderr = String::from_utf8_lossy(&out.stderr);
    let printed = stderr
        .lines()
        .skip_while(|l| !l.contains("start it with exactly this file"))
        .nth(1)
        .expect(&stderr)
        .trim()
        .to_string();
    let mut argv: Vec<&str> = printed.split_whitespace().collect();
    assert!(
        argv.len() == 10 && argv[1] == "-p" && argv[3] == "-f" && argv[5] == "--env-file",
        "{printed}"
    );
    assert!(!argv[4].starts_with(p.to_str().unwrap()), "{printed}");
    argv.remove(0);
    let up = Command::new(e.compose())
        .args(&argv)
        .current_dir(p)
        .output()
        .unwrap();
    assert!(up.status.success(), "{} up: {}", e.name(), text(&up));

    let script = r#"
for i in $(seq 150); do corral exec -- true 2>/dev/null && break; sleep 0.2; done
echo "harness=$(hostname)"
corral exec -- sh -c 'echo "executor=$(hostname)"; echo from-executor > made-by-executor.txt; exit 3'
echo "exec-exit=$?"
corral exec -- sh -c 'mkdir -p sub/.git && echo "executor planted" || echo "executor refused"; mkdir -p /tmp/r/.git && echo "executor tmp ok"'
corral exec -- sh -c 'test -e /hostroot && echo "executor sees the host root" || echo "executor has no host root"'
echo 'x-evil: 1' >> docker-compose.override.yml 2>/dev/null && echo "harness wrote the override" || echo "harness refused"
corral exec -- sh -c 'echo "x-evil: 1" >> docker-compose.override.yml 2>/dev/null && echo "executor wrote the override" || echo "executor refused the override"'
"#;
    let out = w.corral(&["run", "--engine", e.name(), "--", "/bin/bash", "-c", script]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let harness = stdout
        .lines()
        .find_map(|l| l.strip_prefix("harness="))
        .expect(&t);
    let executor = stdout
        .lines()
        .find_map(|l| l.strip_prefix("executor="))
        .expect(&t);
    assert_ne!(harness, executor, "{t}");
    assert!(stdout.contains("exec-exit=3\n"), "{t}");
    assert_eq!(
        std::fs::read_to_string(p.join("made-by-executor.txt")).unwrap(),
        "from-executor\n"
    );
    // The executor's commands run under the name gate too (the service's PID 1): no git
    // repository in the project, one in the container's /tmp.
    assert!(
        stdout.contains("executor refused\nexecutor tmp ok\n"),
        "{t}"
    );
    assert!(!p.join("sub/.git").exists(), "{t}");
    // The project's hostile compose files were not read.
    assert!(stdout.contains("executor has no host root\n"), "{t}");
    // The project's override file stays read-only to both too (defence in depth).
    assert!(
        stdout.contains("harness refused\nexecutor refused the override\n"),
        "{t}"
    );
    let file = std::fs::read_to_string(p.join("docker-compose.override.yml")).unwrap();
    assert!(!file.contains("x-evil"), "{file}");

    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
    // The shared external network belongs to this test's prefix only: down removed it too.
    assert_eq!(w.leftovers(), (vec![], vec![]), "{}", text(&out));
}

fn an_absent_policy_file_cannot_be_created_from_inside(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "p");
    // No corral.toml: the policy comes from a file outside the project.
    let policy = w.dir.path().join("outside.toml");
    std::fs::write(
        &policy,
        format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"none\"\n"),
    )
    .unwrap();
    let out = w.corral(&[
        "run",
        "--engine",
        e.name(),
        "--policy",
        policy.to_str().unwrap(),
        "--",
        "/bin/bash",
        "-c",
        "echo 'network = { mode = \"host\" }' > corral.toml && echo WROTE || echo refused; echo x > other.txt && echo other-ok",
    ]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "refused\nother-ok\n",
        "{t}"
    );
    // And no empty mount point is left in the project afterwards.
    assert!(!w.project.join("corral.toml").exists(), "{t}");
    assert!(w.project.join("other.txt").exists());
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
}

fn sigterm_to_corral_stops_the_container_and_the_run_is_audited(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "s");
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"none\"\n"),
    )
    .unwrap();
    let mut child = w
        .command(&["run", "--engine", e.name(), "--", "/bin/sleep", "60"])
        .spawn()
        .unwrap();
    let label = format!("label=corral.project={}", w.key());
    let started = std::time::Instant::now();
    while e
        .ok(&["ps", "--filter", &label, "--format", "{{.Names}}"])
        .trim()
        .is_empty()
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the harness container never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    // sleep dies of the forwarded SIGTERM: 128 + 15, as the engine reports it.
    assert_eq!(status.code(), Some(143));
    assert!(
        w.audit()
            .lines()
            .any(|l| l.contains("\"event\":\"exit\"") && l.contains("\"exit_code\":143")),
        "{}",
        w.audit()
    );
    assert_eq!(w.leftovers(), (vec![], vec![]));
}

fn two_projects_never_see_each_others_containers(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    // Same prefix (so the same shared external network), two projects.
    let w = World::new(e, "t");
    let other = w.dir.path().join(format!("{}-other", w.prefix));
    std::fs::create_dir_all(&other).unwrap();
    let toml = format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n");
    std::fs::write(w.project.join("corral.toml"), &toml).unwrap();
    std::fs::write(other.join("corral.toml"), &toml).unwrap();
    let run_in = |dir: &Path, script: &str| {
        w.command_in(
            dir,
            &["run", "--engine", e.name(), "--", "/bin/bash", "-c", script],
        )
        .output()
        .unwrap()
    };
    // The other project's proxy exists and listens.
    let out = run_in(&other, "true");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let other_key = corral_audit::project_key(&other);
    let other_proxy = format!("{}-{other_key}-proxy", w.prefix);
    let other_ip = e.ok(&[
        "container",
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        &other_proxy,
    ]);
    let mut script = format!(
        "curl -sS -m 5 --noproxy '*' http://{other_proxy}:3128/ >/dev/null 2>&1 && echo REACHED-BY-NAME || echo unreachable-by-name\n"
    );
    for ip in other_ip.split_whitespace() {
        script.push_str(&format!(
            "curl -sS -m 5 --noproxy '*' http://{ip}:3128/ >/dev/null 2>&1 && echo REACHED-{ip} || echo unreachable\n"
        ));
    }
    let out = run_in(&w.project, &script);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut want = vec!["unreachable-by-name"];
    want.extend(other_ip.split_whitespace().map(|_| "unreachable"));
    assert_eq!(stdout.lines().collect::<Vec<_>>(), want, "{t}");
    assert_eq!(other_ip.split_whitespace().count(), 2, "{other_ip}");

    for dir in [&w.project, &other] {
        let out = w
            .command_in(dir, &["down", "--engine", e.name()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
    }
    assert_eq!(w.leftovers(), (vec![], vec![]));
    assert!(!e.container_exists(&other_proxy));
}

fn a_proxy_that_cannot_start_is_an_error_that_quotes_its_log(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let Some(busybox) = on_path("busybox").filter(|_| Path::new("/bin/busybox").exists()) else {
        panic!("busybox is missing: .ci/run installs busybox-static");
    };
    let w = World::new(e, "f");
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n"),
    )
    .unwrap();
    // A static binary that is not corral: `busybox proxy ...` exits at once.
    let out = w
        .command(&["run", "--engine", e.name(), "--", "/bin/true"])
        .env("CORRAL_CONTAINER_BIN", &busybox)
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(125), "{t}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("the proxy container {}-", w.prefix)),
        "{t}"
    );
    assert!(
        stderr.contains("exited instead of listening: ") && stderr.contains("applet not found"),
        "{t}"
    );
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(w.leftovers(), (vec![], vec![]));
}

/// The native jail's escape suite (jail_attacks.rs, harden_seccomp.rs) in the harness
/// container, in proxy mode: host files, host processes, host services (loopback, the bridge
/// gateways, abstract sockets), namespaces and mounts, devices, /proc and /sys, TIOCSTI on a
/// controlling terminal, raw and unusual sockets, set-id files, ptrace and the kernel's large
/// surfaces. The seccomp attacks expect the errno corral's filter answers (EPERM,
/// EAFNOSUPPORT), which neither engine's default profile gives for all of them (podman's lets
/// `unshare -U` and a set-uid chmod through): the container runs corral's filter.
fn the_native_escape_suite_fails_in_the_harness_container(e: Engine) {
    use std::os::unix::fs::PermissionsExt;
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "x");
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n"),
    )
    .unwrap();
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{}", text(&out));
    let secret = w.dir.path().join("host-secret.txt");
    std::fs::write(&secret, "HOSTSECRET\n").unwrap();
    let outside = w.dir.path().join("created-from-inside");
    let marker = format!("HOSTENV-{}", w.prefix);
    let mut host = Command::new("sleep")
        .arg("300")
        .env("HOST_ONLY_SECRET", &marker)
        .spawn()
        .unwrap();
    let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // Every address, IPv4 and IPv6 (a dual-stack socket), and the host's addresses to try.
    let any = std::net::TcpListener::bind("[::]:0").unwrap();
    let addrs = Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .unwrap();
    let host_addrs: Vec<String> = String::from_utf8_lossy(&addrs.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .nth(3)?
                .split('/')
                .next()
                .map(String::from)
        })
        .filter(|a| a != "127.0.0.1" && a != "::1")
        .collect();
    let abstract_name = format!("corral-engine-test-{}", w.prefix);
    let abs = {
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    for l in [&lo, &any] {
        l.set_nonblocking(true).unwrap();
    }
    abs.set_nonblocking(true).unwrap();

    let out = w.corral(&[
        "run",
        "--engine",
        e.name(),
        "--",
        "/usr/bin/python3",
        "-c",
        include_str!("engine_escape/suite.py"),
        secret.to_str().unwrap(),
        outside.to_str().unwrap(),
        &host.id().to_string(),
        &marker,
        &lo.local_addr().unwrap().port().to_string(),
        &any.local_addr().unwrap().port().to_string(),
        &abstract_name,
        &host_addrs.join(","),
    ]);
    let alive = host.try_wait().unwrap().is_none();
    let _ = host.kill();
    let _ = host.wait();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.ends_with("END\n"), "the suite did not finish:\n{t}");
    let escapes: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("ok:")).collect();
    assert_eq!(escapes, ["END"], "{t}");
    // Every attack of the suite ran (a refactoring that drops some would pass silently).
    assert!(stdout.lines().count() > 50 + host_addrs.len(), "{t}");
    for name in [
        "read-host-secret",
        "write-policy",
        "host-environment",
        "host-loopback-tcp",
        "userns",
        "seccomp-unshare",
        "tiocsti",
        "af-packet",
        "chmod-setuid",
        "seccomp-fchmodat2",
        "seccomp-ptrace",
        "seccomp-io_uring_setup",
    ] {
        let line = format!("ok:{name}");
        assert!(
            stdout
                .lines()
                .any(|l| l.split(' ').next() == Some(line.as_str())),
            "{name} did not run:\n{t}"
        );
    }
    assert!(alive, "the container killed a host process");
    assert!(
        lo.accept().is_err(),
        "the host loopback service got a connection"
    );
    assert!(any.accept().is_err(), "a host service got a connection");
    assert!(
        abs.accept().is_err(),
        "the host abstract socket got a connection"
    );
    assert!(!outside.exists(), "{t}");
    let mode = std::fs::metadata(w.project.join("setid.bin"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "a set-id file reached the host: {mode:o}");
    assert!(!w.project.join("setid2.bin").exists(), "{t}");
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
}

/// `publish`: the host's 127.0.0.1:PORT reaches the harness's PORT; `host_ports`: the harness's
/// 127.0.0.1:PORT reaches the host's. Neither engine forwards ports on an internal network:
/// corral relays them from the container's network namespace (corral_engine::ports).
fn publish_and_host_ports_cross_the_internal_network(e: Engine) {
    use std::io::{Read, Write};
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "n");
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    let published = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    std::thread::spawn(move || {
        for mut c in host.incoming().flatten() {
            let _ = c.write_all(b"from-the-host\n");
        }
    });
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
    let script = format!(
        r#"
import socket, time
for attempt in range(300):  # the relay starts with the container
    try:
        print(socket.create_connection(("127.0.0.1", {host_port}), timeout=5).recv(100).decode().strip())
        break
    except OSError:
        time.sleep(0.1)
srv = socket.socket()
srv.bind(("127.0.0.1", {published}))
srv.listen()
c, _ = srv.accept()
c.sendall(b"from-the-harness\n")
c.close()
print("served")
"#
    );
    let mut c = w.command(&[
        "run",
        "--engine",
        e.name(),
        "--",
        "/usr/bin/python3",
        "-c",
        &script,
    ]);
    c.env("CORRAL_CONTAINER_BIN", env!("CARGO_BIN_EXE_corral"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    // The host's side of publish: connect until the harness answers (before it listens, the
    // relay's connection inside is refused and ours is closed without a byte).
    let mut got = String::new();
    for _ in 0..600 {
        if let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", published)) {
            got.clear();
            let _ = conn.read_to_string(&mut got);
            if !got.is_empty() {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert_eq!(got, "from-the-harness\n", "{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from-the-host\nserved\n",
        "{t}"
    );
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
}

/// What the harness tries while it runs, each a way to leave a git repository in the project
/// for the host's git to find (and run a planted `core.fsmonitor` from); then it tells the test
/// it is done (`attempted`) and waits for `release`, so the test looks while the run goes on,
/// as a shell prompt would. A repository built in the container's own /tmp works.
const PLANT: &str = r#"
set -u
cd "$PROJECT"
hook='[core]
	repositoryformatversion = 0
	fsmonitor = "touch '$PROJECT'/PWNED; false"'
plant() { # a complete git directory at $1, or a line saying where it stopped
    mkdir -p "$1" 2>/dev/null && mkdir "$1/objects" "$1/refs" 2>/dev/null \
      && echo 'ref: refs/heads/main' > "$1/HEAD" && printf '%s\n' "$hook" > "$1/config" \
      && echo "planted $1" || echo "refused $1"
}
mkdir -p a b c d e f
plant a/.git
plant b                                   # an implicit bare repository
plant /tmp/r/.git                         # the container's own /tmp: works
ln -s /tmp/r/.git c/.git 2>/dev/null && echo "planted symlink" || echo "refused symlink"
mkdir d/plain && python3 -c 'import os; os.rename("d/plain", "d/.git")' 2>/dev/null \
  && echo "planted rename" || echo "refused rename"
python3 - <<'PY' && echo "planted python" || echo "refused python"
import os
os.mkdir("e/.git")
PY
mv /tmp/r/.git f/.git 2>/dev/null && echo "planted move" || echo "refused move"
plant g/.git                              # g: a host tmpfs mounted inside the project
python3 -c 'open("/proc/1/mem", "r+b")' 2>/dev/null \
  && echo "pid 1 memory writable" || echo "pid 1 memory refused"
touch attempted
# The host replaces .git/config by rename (`git config`), which detaches the container's
# read-only bind of it: the gate keeps it read-only all the same.
for i in $(seq 600); do [ -e renamed ] && break; sleep 0.1; done
grep -q HOSTNEW .git/config && echo "config detached"
line='[core]\n\tfsmonitor = "touch '$PROJECT'/PWNED; false"\n'
printf "$line" >> .git/config 2>/dev/null && echo "config appended" || echo "config append refused"
python3 -c 'import os; os.write(os.open(".git/config", os.O_RDWR), b"x")' 2>/dev/null \
  && echo "config rdwr" || echo "config rdwr refused"
python3 -c 'import os; r=os.open(".git/config", os.O_RDONLY); os.write(os.open("/proc/self/fd/%d" % r, os.O_WRONLY), b"x")' 2>/dev/null \
  && echo "config reopened" || echo "config reopen refused"
printf "$line" > c.new && mv -f c.new .git/config 2>/dev/null && echo "config renamed" || echo "config rename refused"
touch attempted2
for i in $(seq 600); do [ -e release ] && exit 0; sleep 0.1; done
exit 3
"#;

fn no_repository_planted_during_the_run_is_seen_by_host_git(e: Engine) {
    if !e.ready(&["git"]) {
        return;
    }
    // With the gate, then without it (`--allow-new-repositories`: the control, where the
    // same plants work and host git does find them during the run).
    for gated in [true, false] {
        let w = World::new(e, "g");
        let p = &w.project;
        let git = |dir: &Path, args: &[&str]| {
            Command::new("git")
                .args(["-c", "safe.directory=*"])
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                // g is a mount of its own: look up across it, to the project's repository.
                .env("GIT_DISCOVERY_ACROSS_FILESYSTEM", "1")
                .env("HOME", w.dir.path())
                .output()
                .unwrap()
        };
        assert!(git(p, &["init", "-q", "-b", "main"]).status.success());
        // A host file system mounted inside the project: the engines bind recursively, so it
        // is a mount of its own in the container, and the host's all the same.
        let _nested = TmpfsMount::at(&p.join("g"));
        std::fs::write(
            p.join("corral.toml"),
            format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"none\"\n"),
        )
        .unwrap();
        let project = p.to_str().unwrap();
        let mut args = vec!["run", "--engine", e.name()];
        if !gated {
            args.push("--allow-new-repositories");
        }
        let cmd = format!("PROJECT={project}; {PLANT}");
        args.extend(["--", "/bin/bash", "-c", &cmd]);
        let child = w
            .command(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !p.join("attempted").exists() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "the harness never got to the end of its attempts"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        // What a shell prompt runs in each directory, while the container still runs.
        let mut found = Vec::new();
        for dir in ["a", "b", "c", "d", "e", "f", "g"] {
            let out = git(&p.join(dir), &["rev-parse", "--absolute-git-dir"]);
            let gitdir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let _ = git(&p.join(dir), &["status", "--short"]);
            if gitdir != p.join(".git").to_str().unwrap() {
                found.push(format!("{dir}: {gitdir}"));
            }
        }
        // The user runs `git config` on the host meanwhile (a rename over .git/config).
        assert!(
            git(p, &["config", "corral.test", "HOSTNEW"])
                .status
                .success()
        );
        let host_config = std::fs::read_to_string(p.join(".git/config")).unwrap();
        std::fs::write(p.join("renamed"), "").unwrap();
        while !p.join("attempted2").exists() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(120),
                "the harness never got to the end of its writes"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = git(p, &["status", "--short"]);
        let config_kept = std::fs::read_to_string(p.join(".git/config")).unwrap() == host_config;
        let pwned = p.join("PWNED").exists();
        std::fs::write(p.join("release"), "").unwrap();
        let out = child.wait_with_output().unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(0), "{t}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if gated {
            assert_eq!(
                stdout,
                "refused a/.git\nrefused b\nplanted /tmp/r/.git\nrefused symlink\n\
                 refused rename\nrefused python\nrefused move\nrefused g/.git\n\
                 pid 1 memory refused\nconfig detached\nconfig append refused\n\
                 config rdwr refused\nconfig reopen refused\nconfig rename refused\n",
                "{t}"
            );
            assert!(config_kept, "{t}");
            assert_eq!(found, Vec::<String>::new(), "{t}");
            assert!(!pwned, "{t}");
            assert!(t.contains("corral: refused creating a `.git` at"), "{t}");
        } else {
            // The control: the plants work and host git takes them for repositories (and
            // runs the planted fsmonitor) while the run goes on.
            assert!(stdout.contains("planted a/.git\nplanted b\n"), "{t}");
            assert!(stdout.contains("planted g/.git\n"), "{t}");
            // The engine's init is PID 1 then: a process of the jail's uid, dumpable, whose
            // memory the command can write where Yama lets a process trace its descendants'
            // ancestors (absent, or scope 0 or 1: it is the command's ancestor).
            let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope");
            if scope.as_deref().map_or(true, |v| v.trim() <= "1") {
                assert!(stdout.contains("pid 1 memory writable\n"), "{t}");
            }
            assert!(found.iter().any(|f| f.starts_with("g: ")), "{found:?} {t}");
            assert!(found.iter().any(|f| f.starts_with("a: ")), "{found:?} {t}");
            assert!(found.iter().any(|f| f.starts_with("b: ")), "{found:?} {t}");
            assert!(pwned, "{found:?} {t}");
            // Without the gate the host's rename leaves .git/config writable to the container.
            assert!(
                stdout.contains("config detached\nconfig appended\nconfig rdwr\n"),
                "{t}"
            );
            assert!(!config_kept, "{t}");
        }
        let out = w.corral(&["down", "--engine", e.name()]);
        assert!(out.status.success(), "{}", text(&out));
    }
}

/// A tmpfs mounted on the host for the test's life (the directory is made first).
struct TmpfsMount(std::path::PathBuf);

impl TmpfsMount {
    fn at(dir: &Path) -> TmpfsMount {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        TmpfsMount(dir.to_path_buf())
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("--lazy").arg(&self.0).status();
    }
}

/// `corral run --engine E -- sh -c SCRIPT` with a pty of the test's as stdin and controlling
/// terminal, stdout the pty too (`to_file` false) or a file; what stdout got (the pty's output
/// or the file), once corral ended.
fn run_at_a_terminal(w: &World, script: &str, to_file: bool) -> String {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let out_file = w.dir.path().join("stdout.txt");
    let mut c = w.command(&["run", "--engine", w.engine.name(), "--", "sh", "-c", script]);
    c.stdin(slave.try_clone().unwrap())
        .stderr(std::process::Stdio::null());
    match to_file {
        true => c.stdout(std::fs::File::create(&out_file).unwrap()),
        false => c.stdout(slave.try_clone().unwrap()),
    };
    // SAFETY: setsid and TIOCSCTTY on fd 0 are async-signal-safe syscalls.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    drop(slave);
    drop(c);
    // The pty's output until every slave is closed (EIO), read while corral runs.
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = master.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    });
    let status = child.wait().unwrap();
    let shown = reader.join().unwrap();
    assert!(
        status.success(),
        "{status:?}: {}",
        String::from_utf8_lossy(&shown)
    );
    match to_file {
        true => std::fs::read_to_string(&out_file).unwrap(),
        false => String::from_utf8_lossy(&shown).into_owned(),
    }
}

/// The engines give a container one terminal for all of its stdio or none: stdin and stdout
/// terminals are one inside; stdout redirected to a file gets no terminal (no CR/LF in the
/// file) and the container's stdin is empty (a command reading it does not wait).
fn the_containers_terminal_follows_stdin_and_stdout(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "t");
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"none\"\n"),
    )
    .unwrap();
    let script = "test -t 0 && echo IN-TTY || echo IN-NOT-TTY; \
                  test -t 1 && echo OUT-TTY || echo OUT-NOT-TTY; \
                  printf 'a\\nb\\n'; test -t 0 || cat; echo END";
    let file = run_at_a_terminal(&w, script, true);
    assert_eq!(file, "IN-NOT-TTY\nOUT-NOT-TTY\na\nb\nEND\n");
    let shown = run_at_a_terminal(&w, script, false);
    assert!(
        shown.contains("IN-TTY\r\nOUT-TTY\r\na\r\nb\r\nEND"),
        "{shown:?}"
    );
}

/// The container's name gate refuses a new name that `filesystem.hide` matches in the project
/// (a `.env.local` the jail made would be readable to it once the user filled it), as the
/// native jail's does; the container's own /tmp and other names are not its concern. Control:
/// without the gate (`allow_new_repositories`) the same names are made.
fn a_name_filesystem_hide_matches_cannot_be_made_in_the_project(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "h");
    let script = "echo x > .env.local && echo MADE-ENV || echo refused-env; \
                  echo x > tmpf; mv tmpf key.pem && echo MADE-PEM || echo refused-pem; \
                  python3 -c 'import os; os.open(\"app.key\", os.O_CREAT | os.O_WRONLY, 0o600); print(\"MADE-KEY\")' 2>/dev/null || echo refused-key; \
                  echo x > /tmp/.env.local && echo tmp-ok; echo x > notes.txt && echo other-ok";
    let policy = w.dir.path().join("outside.toml");
    std::fs::write(
        &policy,
        format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"none\"\n"),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--engine",
            e.name(),
            "--policy",
            policy.to_str().unwrap(),
        ];
        args.extend(extra);
        args.extend(["--", "/bin/bash", "-c", script]);
        let out = w.corral(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        out
    };
    let out = run(&[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "refused-env\nrefused-pem\nrefused-key\ntmp-ok\nother-ok\n",
        "{}",
        text(&out)
    );
    for name in [".env.local", "key.pem", "app.key"] {
        assert!(!w.project.join(name).exists(), "{name} was made");
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("filesystem.hide"));
    // Control: without the gate the jail makes them.
    let out = run(&["--allow-new-repositories"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("MADE-ENV") && stdout.contains("MADE-PEM"),
        "{}",
        text(&out)
    );
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{}", text(&out));
}
