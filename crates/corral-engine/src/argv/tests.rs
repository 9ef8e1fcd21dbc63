//! Whole-argv tests: every command the podman and docker backends run for a plan.

use std::path::{Path, PathBuf};

use corral_policy::domain::DomainPattern;
use corral_policy::plan::{Access, Enforce, ExecutorTarget, Mount, MountKind, NetworkMode, Plan};
use similar_asserts::assert_eq;

use super::*;

struct Fixture {
    _dir: tempfile::TempDir,
    root: String,
    plan: Plan,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("proj");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join(".env"), "SECRET=1").unwrap();
    let mut plan = Plan::minimal(
        &root,
        Path::new("/home/u"),
        vec!["/usr/bin/pi".into(), "--x".into()],
    );
    plan.profile = "pi".into();
    plan.uid = 1000;
    plan.gid = 1000;
    plan.image = Some("localhost/corral-pi:latest".into());
    plan.network.mode = NetworkMode::Proxy;
    plan.network.allow = vec![DomainPattern::parse("api.anthropic.com").unwrap()];
    plan.limits.memory = Some(4 << 30);
    plan.limits.cpus = Some(2.0);
    plan.limits.pids = Some(1024);
    plan.env.insert("TERM".into(), "xterm".into());
    // The plan's own proxy variables (the native bridge's) are replaced.
    plan.env
        .insert("HTTP_PROXY".into(), "http://127.0.0.1:9".into());
    plan.env
        .insert("CORRAL_EXECUTOR".into(), "unix:/run/x".into());
    plan.masked = vec![root.join(".env")];
    plan.hide = vec![".env".into(), "*.pem".into()];
    plan.mounts.insert(
        plan.mounts.len() - 1,
        Mount {
            source: dir.path().join("gitconfig-missing"),
            target: PathBuf::from("/home/u/.gitconfig"),
            kind: MountKind::Bind(Access::Ro),
            optional: true,
        },
    );
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    plan.mounts.insert(
        plan.mounts.len() - 1,
        Mount {
            source: state.clone(),
            target: PathBuf::from("/home/u/.pi/agent"),
            kind: MountKind::Bind(Access::Rw),
            optional: false,
        },
    );
    Fixture {
        root: root.display().to_string(),
        _dir: dir,
        plan,
    }
}

fn ctx(engine: EngineKind, rootless: bool) -> Context {
    Context {
        engine,
        rootless,
        prefix: "corral".into(),
        corral_bin: PathBuf::from("/opt/c/corral"),
        proxy_bin: None,
        state_dir: PathBuf::from("/s/engine"),
        audit_dir: PathBuf::from("/s/log"),
        jail_id: "j1".into(),
        stdio: Stdio::Piped,
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

#[test]
fn podman_rootless_whole_setup() {
    let mut f = fixture();
    f.plan.git.dirs = vec![PathBuf::from(format!("{}/.git", f.root))];
    let c = ctx(EngineKind::Podman, true);
    let n = c.names(&f.plan);
    let key = n.key.clone();
    let root = &f.root;
    let state = format!("{}/state", Path::new(root).parent().unwrap().display());
    let setup = setup(&f.plan, &c).unwrap();
    let internal = format!("corral-{key}-internal");
    let proxy = format!("corral-{key}-proxy");
    let label = format!("corral.project={key}");
    let expected_steps = vec![
        Step::Ensure {
            what: format!("internal network {internal}"),
            check: Command::new("podman").args(["network", "exists", &internal]),
            create: vec![Command::new("podman").args([
                "network",
                "create",
                "--internal",
                "--disable-dns",
                "--label",
                &label,
                &internal,
            ])],
        },
        Step::Ensure {
            what: "external network corral-external".into(),
            check: Command::new("podman").args(["network", "exists", "corral-external"]),
            create: vec![Command::new("podman").args([
                "network",
                "create",
                "--label",
                "corral.role=external",
                "corral-external",
            ])],
        },
        Step::Ensure {
            what: format!("proxy container {proxy}"),
            check: Command::new("podman").args(["container", "exists", &proxy]),
            create: vec![Command::new("podman").args(strings(&[
                "run",
                "--detach",
                "--name",
                &proxy,
                "--label",
                &label,
                "--label",
                "corral.role=proxy",
                "--pull",
                "never",
                "--init",
                "--read-only",
                "--read-only-tmpfs",
                "--cap-drop",
                "ALL",
                "--security-opt",
                "no-new-privileges",
                "--security-opt",
                "seccomp=/s/engine/seccomp.json",
                "--userns",
                "keep-id",
                "--cpus",
                "1",
                "--memory",
                "512m",
                "--pids-limit",
                "64",
                "--stop-timeout",
                "5",
                "--network",
                &format!("{internal}:alias=proxy"),
                "--network",
                "corral-external",
                "--volume",
                "/opt/c/corral:/usr/local/bin/corral:ro,z",
                "--volume",
                "/s/engine/proxy:/etc/corral:ro,z",
                "--volume",
                "/s/log:/var/log/corral:rw,z",
                "--entrypoint",
                "/usr/local/bin/corral",
                "localhost/corral-pi:latest",
                "proxy",
                "--listen",
                "0.0.0.0:3128",
                "--policy",
                "/etc/corral/policy.toml",
                "--audit-log",
                "/var/log/corral/audit.jsonl",
            ]))],
        },
    ];
    assert_eq!(setup.steps[..3].to_vec(), expected_steps);
    let run = setup.run_command().unwrap();
    let expected_run = strings(&[
        "podman",
        "run",
        "--rm",
        "--name",
        &format!("corral-{key}-j1"),
        "--label",
        &label,
        "--label",
        "corral.jail=j1",
        "--pull",
        "never",
        "--interactive",
        "--init=false",
        "--read-only",
        "--read-only-tmpfs",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        "seccomp=/s/engine/seccomp-gated.json",
        "--userns",
        "keep-id",
        "--network",
        &internal,
        "--dns",
        "127.0.0.1",
        "--add-host",
        "proxy:{proxy-address}",
        "--memory",
        "4g",
        "--cpus",
        "2",
        "--pids-limit",
        "1024",
        "--stop-timeout",
        "5",
        "--workdir",
        root,
        "--tmpfs",
        "/home/u:rw,nosuid,nodev,exec,mode=0700,U",
        "--volume",
        &format!("{state}:/home/u/.pi/agent:rw,z"),
        "--volume",
        &format!("{root}:{root}:rw,z"),
        "--volume",
        &format!("/s/engine/masked:{root}/.env:ro,z"),
        "--volume",
        &format!("/s/engine/empty:{root}/corral.toml:ro,z"),
        "--volume",
        "/opt/c/corral:/usr/local/bin/corral:ro,z",
        "--env",
        "ALL_PROXY",
        "--env",
        "HOME",
        "--env",
        "HTTPS_PROXY",
        "--env",
        "HTTP_PROXY",
        "--env",
        "LANG",
        "--env",
        "NODE_USE_ENV_PROXY",
        "--env",
        "NO_PROXY",
        "--env",
        "PATH",
        "--env",
        "TERM",
        "--env",
        "TMPDIR",
        "--env",
        "all_proxy",
        "--env",
        "http_proxy",
        "--env",
        "https_proxy",
        "--env",
        "no_proxy",
        "--entrypoint",
        "/usr/local/bin/corral",
        "localhost/corral-pi:latest",
        "__corral-gate-exec",
        "--init",
        "--git-dir",
        &format!("{root}/.git"),
        "--project",
        root,
        "--hide",
        ".env",
        "--hide",
        "*.pem",
        "--host-path",
        "/home/u/.pi/agent",
        "--host-path",
        root,
        "--host-path",
        &format!("{root}/.env"),
        "--host-path",
        &format!("{root}/corral.toml"),
        "--host-path",
        "/usr/local/bin/corral",
        "--",
        "pi",
        "--x",
    ]);
    assert_eq!(run.argv(), expected_run);
    let env: Vec<(String, String)> = run.env.clone().into_iter().collect();
    let p = "http://proxy:3128";
    let np = "localhost,127.0.0.1,::1";
    let expected_env: Vec<(String, String)> = [
        ("ALL_PROXY", p),
        ("HOME", "/home/u"),
        ("HTTPS_PROXY", p),
        ("HTTP_PROXY", p),
        ("LANG", "C.UTF-8"),
        ("NODE_USE_ENV_PROXY", "1"),
        ("NO_PROXY", np),
        (
            "PATH",
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
        ),
        ("TERM", "xterm"),
        ("TMPDIR", "/tmp"),
        ("all_proxy", p),
        ("http_proxy", p),
        ("https_proxy", p),
        ("no_proxy", np),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(env, expected_env);
}

#[test]
fn docker_whole_setup() {
    let mut f = fixture();
    f.plan.executor.target = ExecutorTarget::Compose("executor".into());
    let mut c = ctx(EngineKind::Docker, false);
    c.stdio = Stdio::Terminal;
    c.proxy_image = Some("localhost/corral-proxy:1".into());
    let n = c.names(&f.plan);
    let key = n.key.clone();
    let root = &f.root;
    let state = format!("{}/state", Path::new(root).parent().unwrap().display());
    let setup = setup(&f.plan, &c).unwrap();
    let internal = format!("corral-{key}-internal");
    let proxy = format!("corral-{key}-proxy");
    let label = format!("corral.project={key}");
    let tmpfs = [
        "--tmpfs",
        "/tmp:rw,nosuid,nodev,mode=1777",
        "--tmpfs",
        "/var/tmp:rw,nosuid,nodev,mode=1777",
        "--tmpfs",
        "/run:rw,nosuid,nodev,mode=0755",
    ];
    let mut proxy_argv = strings(&[
        "run",
        "--detach",
        "--name",
        &proxy,
        "--label",
        &label,
        "--label",
        "corral.role=proxy",
        "--pull",
        "never",
        "--init",
        "--read-only",
    ]);
    proxy_argv.extend(strings(&tmpfs));
    proxy_argv.extend(strings(&[
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        "seccomp=/s/engine/seccomp.json",
        "--user",
        "1000:1000",
        "--cpus",
        "1",
        "--memory",
        "512m",
        "--pids-limit",
        "64",
        "--stop-timeout",
        "5",
        "--network",
        &internal,
        "--network-alias",
        "proxy",
        "--volume",
        "/opt/c/corral:/usr/local/bin/corral:ro",
        "--volume",
        "/s/engine/proxy:/etc/corral:ro",
        "--volume",
        "/s/log:/var/log/corral:rw",
        "--entrypoint",
        "/usr/local/bin/corral",
        "localhost/corral-proxy:1",
        "proxy",
        "--listen",
        "0.0.0.0:3128",
        "--policy",
        "/etc/corral/policy.toml",
        "--audit-log",
        "/var/log/corral/audit.jsonl",
    ]));
    let expected_steps = vec![
        Step::Ensure {
            what: format!("internal network {internal}"),
            check: Command::new("docker").args([
                "network",
                "inspect",
                "--format",
                "{{.Name}}",
                &internal,
            ]),
            create: vec![Command::new("docker").args([
                "network",
                "create",
                "--internal",
                "--opt",
                "com.docker.network.bridge.inhibit_ipv4=true",
                "--label",
                &label,
                &internal,
            ])],
        },
        Step::Ensure {
            what: "external network corral-external".into(),
            check: Command::new("docker").args([
                "network",
                "inspect",
                "--format",
                "{{.Name}}",
                "corral-external",
            ]),
            create: vec![Command::new("docker").args([
                "network",
                "create",
                "--label",
                "corral.role=external",
                "corral-external",
            ])],
        },
        Step::Ensure {
            what: format!("proxy container {proxy}"),
            check: Command::new("docker").args([
                "container",
                "inspect",
                "--format",
                "{{.Name}}",
                &proxy,
            ]),
            create: vec![
                Command::new("docker").args(proxy_argv),
                Command::new("docker").args(["network", "connect", "corral-external", &proxy]),
            ],
        },
    ];
    assert_eq!(setup.steps[..3].to_vec(), expected_steps);
    let mut expected_run = strings(&[
        "docker",
        "run",
        "--rm",
        "--name",
        &format!("corral-{key}-j1"),
        "--label",
        &label,
        "--label",
        "corral.jail=j1",
        "--pull",
        "never",
        "--interactive",
        "--tty",
        "--init=false",
        "--read-only",
    ]);
    expected_run.extend(strings(&tmpfs));
    expected_run.extend(strings(&[
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        "seccomp=/s/engine/seccomp-gated.json",
        "--user",
        "1000:1000",
        "--network",
        &internal,
        "--memory",
        "4g",
        "--cpus",
        "2",
        "--pids-limit",
        "1024",
        "--stop-timeout",
        "5",
        "--workdir",
        root,
        "--tmpfs",
        "/home/u:rw,nosuid,nodev,exec,mode=0700,uid=1000,gid=1000",
        "--volume",
        &format!("{state}:/home/u/.pi/agent:rw"),
        "--volume",
        &format!("{root}:{root}:rw"),
        "--volume",
        &format!("/s/engine/masked:{root}/.env:ro"),
        "--volume",
        &format!("/s/engine/empty:{root}/corral.toml:ro"),
        "--volume",
        "/opt/c/corral:/usr/local/bin/corral:ro",
        "--env",
        "ALL_PROXY",
        "--env",
        "CORRAL_EXECUTOR",
        "--env",
        "HOME",
        "--env",
        "HTTPS_PROXY",
        "--env",
        "HTTP_PROXY",
        "--env",
        "LANG",
        "--env",
        "NODE_USE_ENV_PROXY",
        "--env",
        "NO_PROXY",
        "--env",
        "PATH",
        "--env",
        "TERM",
        "--env",
        "TMPDIR",
        "--env",
        "all_proxy",
        "--env",
        "http_proxy",
        "--env",
        "https_proxy",
        "--env",
        "no_proxy",
        "--entrypoint",
        "/usr/local/bin/corral",
        "localhost/corral-pi:latest",
        "__corral-gate-exec",
        "--init",
        "--project",
        root,
        "--hide",
        ".env",
        "--hide",
        "*.pem",
        "--host-path",
        "/home/u/.pi/agent",
        "--host-path",
        root,
        "--host-path",
        &format!("{root}/.env"),
        "--host-path",
        &format!("{root}/corral.toml"),
        "--host-path",
        "/usr/local/bin/corral",
        "--",
        "pi",
        "--x",
    ]));
    let run = setup.run_command().unwrap();
    assert_eq!(run.argv(), expected_run);
    assert_eq!(
        run.env.get("CORRAL_EXECUTOR").map(String::as_str),
        Some(format!("http://{}:8080", n.executor_alias).as_str())
    );
    assert_eq!(
        run.env.get("NO_PROXY").cloned(),
        Some(format!("localhost,127.0.0.1,::1,{}", n.executor_alias))
    );
}

/// Each combination of terminal ends: the harness argv whole, the podman run of
/// `podman_rootless_whole_setup` with its stdio options as the ends make them.
#[test]
fn the_containers_terminal_follows_stdin_and_stdout() {
    let f = fixture();
    let piped = setup(&f.plan, &ctx(EngineKind::Podman, true))
        .unwrap()
        .run_command()
        .unwrap()
        .argv();
    let at = piped.iter().position(|a| a == "--interactive").unwrap();
    assert_eq!(piped[at - 1], "never", "after --pull never");
    let with = |opts: &[&str]| {
        let mut argv = piped.clone();
        argv.splice(at..at + 1, strings(opts));
        argv
    };
    // (stdin, stdout) terminals: the container's stdio options.
    let table: [((bool, bool), Stdio, &[&str]); 4] = [
        ((true, true), Stdio::Terminal, &["--interactive", "--tty"]),
        // `corral run ... > out.md` at a terminal: no terminal, no CR/LF in the file, and no
        // terminal handed over as a pipe whose end never comes.
        ((true, false), Stdio::Closed, &[]),
        ((false, true), Stdio::Piped, &["--interactive"]),
        ((false, false), Stdio::Piped, &["--interactive"]),
    ];
    for ((stdin, stdout), stdio, opts) in table {
        assert_eq!(Stdio::for_ends(stdin, stdout), stdio, "{stdin} {stdout}");
        let mut c = ctx(EngineKind::Podman, true);
        c.stdio = stdio;
        let argv = setup(&f.plan, &c).unwrap().run_command().unwrap().argv();
        assert_eq!(argv, with(opts), "{stdio:?}");
    }
}

#[test]
fn rootful_podman_keeps_the_uid_with_user_and_root_gets_a_nobody_proxy() {
    let mut f = fixture();
    f.plan.uid = 0;
    f.plan.gid = 0;
    let c = ctx(EngineKind::Podman, false);
    let s = setup(&f.plan, &c).unwrap();
    let Step::Ensure { create, .. } = &s.steps[2] else {
        panic!("proxy step")
    };
    let a = &create[0].args;
    let i = a.iter().position(|x| x == "--user").unwrap();
    assert_eq!(a[i + 1], "65534:65534");
    assert!(!a.contains(&"--userns".to_string()));
    let r = &s.run_command().unwrap().args;
    let i = r.iter().position(|x| x == "--user").unwrap();
    assert_eq!(r[i + 1], "0:0");
}

#[test]
fn network_none_and_host_have_no_proxy() {
    let mut f = fixture();
    for (mode, net) in [(NetworkMode::None, "none"), (NetworkMode::Host, "host")] {
        f.plan.network.mode = mode;
        let s = setup(&f.plan, &ctx(EngineKind::Podman, true)).unwrap();
        assert_eq!(s.steps.len(), 1, "{mode:?}");
        let run = s.run_command().unwrap();
        let i = run.args.iter().position(|x| x == "--network").unwrap();
        assert_eq!(run.args[i + 1], net);
        assert!(!run.env.contains_key("HTTPS_PROXY"));
        // The plan's own (native) proxy variable is kept as the plan says in these modes.
        assert_eq!(run.env.get("HTTP_PROXY").unwrap(), "http://127.0.0.1:9");
    }
}

#[test]
fn what_cannot_be_enforced_is_refused() {
    let f = fixture();
    let mut c = ctx(EngineKind::Podman, true);
    c.limits_enforceable = false;
    let err = setup(&f.plan, &c).unwrap_err().to_string();
    assert!(err.contains("limits"), "{err}");
    let mut p = f.plan.clone();
    p.limits.enforce = Enforce::BestEffort;
    let run = setup(&p, &c).unwrap();
    assert!(
        !run.run_command()
            .unwrap()
            .args
            .contains(&"--memory".to_string())
    );
    // corral's built-in defaults do not stop a run either; one limit set by someone does.
    let mut p = f.plan.clone();
    p.limits.built_in = corral_policy::plan::LimitKinds {
        memory: true,
        cpus: true,
        pids: true,
    };
    assert!(setup(&p, &c).is_ok());
    p.limits.built_in.pids = false;
    assert!(setup(&p, &c).is_err());

    let c = ctx(EngineKind::Podman, true);
    // host_ports and publish go through a relay container, for any caller (crate::ports).
    let mut p = f.plan.clone();
    p.network.host_ports = vec![11434];
    p.network.publish = vec![3000];
    assert!(setup(&p, &c).is_ok());
    p.uid = 0;
    p.gid = 0;
    assert!(setup(&p, &ctx(EngineKind::Podman, false)).is_ok());
    let mut p = f.plan.clone();
    p.network
        .allow_paths
        .push("GET api.github.com/repos/myorg/**".parse().unwrap());
    assert!(
        setup(&p, &c)
            .unwrap_err()
            .to_string()
            .contains("by method and path")
    );
    let mut p = f.plan.clone();
    p.network.dns = corral_policy::plan::Dns::Stub;
    assert!(
        setup(&p, &c)
            .unwrap_err()
            .to_string()
            .contains("network.dns = \"stub\"")
    );
    let mut p = f.plan.clone();
    p.command.clear();
    assert!(setup(&p, &c).is_err());
    let mut p = f.plan.clone();
    p.mounts.push(Mount {
        source: PathBuf::from("/tmp/a:b"),
        target: PathBuf::from("/x"),
        kind: MountKind::Bind(Access::Ro),
        optional: false,
    });
    let err = setup(&p, &c).unwrap_err().to_string();
    assert!(err.contains("/tmp/a:b"), "{err}");
}

#[test]
fn printed_commands_are_shell_words() {
    let f = fixture();
    let s = setup(&f.plan, &ctx(EngineKind::Podman, true)).unwrap();
    let text = commands(&s);
    let first = text.lines().nth(1).unwrap();
    assert!(
        first.starts_with("podman network exists corral-"),
        "{first}"
    );
    assert!(
        first.contains(" >/dev/null 2>&1 || { podman network create --internal"),
        "{first}"
    );
    assert!(
        text.contains("# the harness container\npodman run --rm"),
        "{text}"
    );
    assert!(
        text.contains("#   HTTPS_PROXY=http://proxy:3128\n"),
        "{text}"
    );
}

#[test]
fn host_system_paths_are_looked_up_in_the_image_and_bound_programs_keep_theirs() {
    let mut f = fixture();
    let c = ctx(EngineKind::Podman, true);
    // The program the name gate starts, after its `--`.
    let entry = |p: &Plan| {
        let s = setup(p, &c).unwrap();
        let a = s.run_command().unwrap().args.clone();
        let i = a.iter().position(|x| x == "--").unwrap();
        a[i + 1].clone()
    };
    assert_eq!(entry(&f.plan), "pi");
    // Under a bind of the plan (the state directory stands in for a user prefix).
    f.plan.command[0] = "/home/u/.pi/agent/bin/pi".into();
    assert_eq!(entry(&f.plan), "/home/u/.pi/agent/bin/pi");
    f.plan.command[0] = "pi".into();
    assert_eq!(entry(&f.plan), "pi");
}

#[test]
fn with_new_repositories_allowed_the_program_is_the_entrypoint_under_the_whole_profile() {
    let mut f = fixture();
    f.plan.git.new_repositories = true;
    let s = setup(&f.plan, &ctx(EngineKind::Podman, true)).unwrap();
    let a = s.run_command().unwrap().args.clone();
    let i = a.iter().position(|x| x == "--entrypoint").unwrap();
    assert_eq!(
        a[i..].to_vec(),
        strings(&["--entrypoint", "pi", "localhost/corral-pi:latest", "--x"])
    );
    assert!(a.contains(&"seccomp=/s/engine/seccomp.json".to_string()));
    assert!(!a.iter().any(|x| x.contains("gate")), "{a:?}");
    // The engine's init reaps and forwards then (the gate does when there is one).
    assert!(a.contains(&"--init".to_string()), "{a:?}");
}

#[test]
fn the_proxy_container_runs_the_lean_proxy_when_there_is_one() {
    let f = fixture();
    let mut c = ctx(EngineKind::Podman, true);
    c.proxy_bin = Some(PathBuf::from("/opt/c/corral-proxy"));
    let setup = setup(&f.plan, &c).unwrap();
    let proxy_run = setup
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Ensure { what, create, .. } if what.contains("proxy container") => {
                Some(create[0].args.clone())
            }
            _ => None,
        })
        .expect("a proxy container step");
    let i = proxy_run.iter().position(|a| a == "--entrypoint").unwrap();
    assert_eq!(
        proxy_run[i..i + 3].to_vec(),
        strings(&[
            "--entrypoint",
            "/usr/local/bin/corral-proxy",
            "localhost/corral-pi:latest"
        ])
    );
    assert_eq!(
        proxy_run[i + 3..].to_vec(),
        strings(&[
            "--listen",
            "0.0.0.0:3128",
            "--policy",
            "/etc/corral/policy.toml",
            "--audit-log",
            "/var/log/corral/audit.jsonl",
        ])
    );
    assert!(
        proxy_run.contains(&"/opt/c/corral-proxy:/usr/local/bin/corral-proxy:ro,z".to_string()),
        "the lean binary is mounted read-only: {proxy_run:?}"
    );
    assert!(
        !proxy_run.iter().any(|a| a.starts_with("/opt/c/corral:")),
        "corral itself is not mounted into the proxy container: {proxy_run:?}"
    );
}

#[test]
fn a_signin_placeholder_covers_the_credential_file_wherever_the_harness_would_see_it() {
    use corral_policy::signin::{SigninFormat, SigninPlan};
    let mut f = fixture();
    let state = f
        .plan
        .mounts
        .iter()
        .find(|m| m.target == Path::new("/home/u/.pi/agent"))
        .unwrap()
        .source
        .clone();
    // The state directory also bound at a second path, and the credential file bound by itself
    // (as a harness's state file would be).
    let file = PathBuf::from("/home/u/.pi/agent/auth.json");
    for (source, target) in [
        (state.clone(), PathBuf::from("/home/u/other")),
        (file.clone(), file.clone()),
    ] {
        f.plan.mounts.push(Mount {
            source,
            target,
            kind: MountKind::Bind(Access::Rw),
            optional: false,
        });
    }
    f.plan.signin = vec![SigninPlan {
        name: "pi".into(),
        format: SigninFormat::Claude,
        file: file.clone(),
        api_hosts: vec![DomainPattern::parse("api.example.com").unwrap()],
        token_host: Some(DomainPattern::parse("auth.example.com").unwrap()),
        token_path: Some("/token".into()),
        api_key_hosts: vec![],
        providers: vec![],
    }];
    let mut c = ctx(EngineKind::Docker, false);
    // The plan's path is a link to the file in the state directory.
    c.signin_real.insert("pi".into(), state.join("auth.json"));
    assert_eq!(
        signin_targets(&f.plan, &c, &f.plan.signin[0]),
        vec![file.clone(), PathBuf::from("/home/u/other/auth.json")]
    );
    let s = setup(&f.plan, &c).unwrap();
    let run = s.run_command().unwrap().argv();
    let volumes: Vec<&String> = run
        .windows(2)
        .filter(|w| w[0] == "--volume" && w[1].contains("auth.json"))
        .map(|w| &w[1])
        .collect();
    assert_eq!(
        volumes,
        vec![
            "/s/engine/signin/j1/pi.json:/home/u/.pi/agent/auth.json:rw",
            "/s/engine/signin/j1/pi.json:/home/u/other/auth.json:rw",
        ]
    );
    // A sign-in gets the run's own gateway proxy, as [secrets] do.
    assert!(
        s.steps
            .iter()
            .any(|st| matches!(st, Step::Ensure { what, .. }
        if what.starts_with("gateway proxy container")))
    );
    // With the host's network nothing could swap its placeholders: refused.
    f.plan.network.mode = NetworkMode::Host;
    let e = setup(&f.plan, &c).unwrap_err().to_string();
    assert!(
        e.contains("signin.pi") && e.contains("--network proxy"),
        "{e}"
    );
}

#[test]
fn a_state_overlay_is_podmans_overlay_volume_and_docker_refuses_it() {
    let mut f = fixture();
    let m = f
        .plan
        .mounts
        .iter_mut()
        .find(|m| m.target == Path::new("/home/u/.pi/agent"))
        .unwrap();
    m.kind = MountKind::Overlay {
        upper: PathBuf::from("/s/harness/pi/dirs/.pi%2Fagent/upper"),
        work: PathBuf::from("/s/harness/pi/dirs/.pi%2Fagent/work"),
        above: vec![],
    };
    let source = m.source.display().to_string();
    let run = setup(&f.plan, &ctx(EngineKind::Podman, true))
        .unwrap()
        .run_command()
        .unwrap()
        .argv();
    let volumes: Vec<&String> = run
        .windows(2)
        .filter(|w| w[0] == "--volume" && w[1].contains("/home/u/.pi/agent"))
        .map(|w| &w[1])
        .collect();
    assert_eq!(
        volumes,
        vec![&format!(
            "{source}:/home/u/.pi/agent:O,upperdir=/s/harness/pi/dirs/.pi%2Fagent/upper,\
             workdir=/s/harness/pi/dirs/.pi%2Fagent/work"
        )]
    );
    // docker has no overlay volume: never bound read-write instead.
    let e = setup(&f.plan, &ctx(EngineKind::Docker, false))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("an overlay of the harness state /home/u/.pi/agent"),
        "{e}"
    );
    // Nor a layer stacked above another (a concurrent native run's).
    if let Some(m) = f
        .plan
        .mounts
        .iter_mut()
        .find(|m| m.target == Path::new("/home/u/.pi/agent"))
    {
        m.kind = MountKind::Overlay {
            upper: PathBuf::from("/u"),
            work: PathBuf::from("/w"),
            above: vec![PathBuf::from("/a")],
        };
    }
    assert!(setup(&f.plan, &ctx(EngineKind::Podman, true)).is_err());
}
