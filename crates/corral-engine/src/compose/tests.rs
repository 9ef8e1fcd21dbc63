use std::path::{Path, PathBuf};

use corral_policy::plan::Plan;
use similar_asserts::assert_eq;

use super::*;

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
        stdio: crate::argv::Stdio::Piped,
        proxy_image: None,
        limits_enforceable: true,
        skill_source: None,
        upstream_ca: None,
        signin_real: Default::default(),
    }
}

fn plan() -> Plan {
    let mut p = Plan::minimal(
        Path::new("/src/test-project"),
        Path::new("/home/u"),
        vec!["pi".into()],
    );
    p.uid = 1000;
    p.gid = 1000;
    p.limits.memory = Some(2048 << 20);
    p.limits.cpus = Some(2.0);
    p.limits.pids = Some(128);
    p
}

#[test]
fn seed_003_shape_for_podman() {
    let mut p = plan();
    p.git.dirs = vec![PathBuf::from("/src/test-project/.git")];
    let c = ctx(EngineKind::Podman, true);
    let n = c.names(&p);
    let text = compose_text(&p, &c);
    let key = &n.key;
    let alias = &n.executor_alias;
    assert_eq!(
        text,
        format!(
            r#"# The `executor` service of /src/test-project, written by `corral init --compose` (running it again
# rewrites this file). Start it with: podman-compose -p {alias} -f /s/engine/executor-compose.yml --env-file /s/engine/executor-compose.env up -d executor
volumes:
  corral-bin:
    external: true
networks:
  corral-{key}-internal:
    external: true
services:
  executor:
    build: /src/test-project
    labels:
    - corral.project={key}
    userns_mode: keep-id
    volumes:
    - /src/test-project:/src/test-project:z
    - corral-bin:/opt/corral:z,ro
    working_dir: /src/test-project
    entrypoint:
    - /opt/corral/corral
    - __corral-gate-exec
    - --init
    - --require-gate
    - --git-dir
    - /src/test-project/.git
    - --host-path
    - /src/test-project
    - --host-path
    - /opt/corral
    - --
    command:
    - /opt/corral/corral
    - serve
    - --no-auth
    - --listen
    - 0.0.0.0:8080
    - --root
    - /src/test-project
    - --audit-log
    - /tmp/corral-executor-audit.jsonl
    init: false
    cap_drop:
    - ALL
    security_opt:
    - no-new-privileges:true
    - seccomp=/s/engine/seccomp-gated.json
    read_only: true
    cpus: 2.0
    mem_limit: 2048m
    pids_limit: 128
    stop_grace_period: 5s
    environment:
      ALL_PROXY: http://proxy:3128
      HTTPS_PROXY: http://proxy:3128
      HTTP_PROXY: http://proxy:3128
      NODE_USE_ENV_PROXY: '1'
      NO_PROXY: localhost,127.0.0.1,::1,{alias}
      all_proxy: http://proxy:3128
      http_proxy: http://proxy:3128
      https_proxy: http://proxy:3128
      no_proxy: localhost,127.0.0.1,::1,{alias}
    networks:
      corral-{key}-internal:
        aliases:
        - {alias}
x-podman:
  in_pod: false
"#
        )
    );
}

#[test]
fn protected_paths_are_read_only_in_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
    std::fs::write(root.join("corral.toml"), "").unwrap();
    let mut p = Plan::minimal(&root, Path::new("/home/u"), vec![]);
    p.protected = vec![
        root.join("corral.toml"),
        root.join(".git/hooks"),
        root.join(".git/config"),
    ];
    let v = executor_service(&p, &ctx(EngineKind::Podman, true));
    let r = root.display();
    let vols: Vec<&str> = v["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        vols,
        vec![
            format!("{r}:{r}:z"),
            "corral-bin:/opt/corral:z,ro".to_string(),
            format!("{r}/corral.toml:{r}/corral.toml:z,ro"),
            format!("{r}/.git/hooks:{r}/.git/hooks:z,ro"),
        ]
    );
}

#[test]
fn docker_uses_user_and_tmpfs() {
    let p = plan();
    let v = executor_service(&p, &ctx(EngineKind::Docker, false));
    assert_eq!(v["user"].as_str(), Some("1000:1000"));
    assert!(v.get("userns_mode").is_none());
    assert_eq!(v["tmpfs"][0].as_str(), Some("/tmp"));
    assert_eq!(v["volumes"][1].as_str(), Some("corral-bin:/opt/corral:ro"));
}

/// Compose is started with corral's file, corral's empty variables file and corral's project
/// name, so no file of the project (`docker-compose.yml`, `compose.yaml`, an override, `.env`
/// with `COMPOSE_FILE`) is read: the whole argv, for both engines.
#[test]
fn compose_runs_with_corrals_file_list_only() {
    let p = plan();
    let c = ctx(EngineKind::Docker, false);
    let alias = c.names(&p).executor_alias;
    assert_eq!(
        up_command(&p, &c).argv(),
        vec![
            "docker-compose",
            "-p",
            &alias,
            "-f",
            "/s/engine/executor-compose.yml",
            "--env-file",
            "/s/engine/executor-compose.env",
            "up",
            "-d",
            "executor",
        ]
    );
    let c = ctx(EngineKind::Podman, true);
    assert_eq!(up_command(&p, &c).argv()[0], "podman-compose");
    assert_eq!(up_command(&p, &c).argv()[1..], {
        let mut a = compose_args(&p, &c);
        a.extend(["up".into(), "-d".into(), "executor".into()]);
        a
    });
}

/// The file is written into the state directory, whatever compose files the project holds, and
/// names no file compose would read besides itself: no `include`, `extends`, `env_file`, and the
/// build context is the project by absolute path. The project's own compose files are left as
/// they are (corral does not write there any more).
#[test]
fn the_compose_file_lies_outside_the_project_and_includes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    std::fs::create_dir_all(&root).unwrap();
    let hostile = "services:\n  executor:\n    volumes: [\"/:/host\"]\n";
    for f in [
        "docker-compose.yml",
        "compose.yaml",
        "docker-compose.override.yml",
    ] {
        std::fs::write(root.join(f), hostile).unwrap();
    }
    std::fs::write(root.join(".env"), "COMPOSE_FILE=compose.yaml\n").unwrap();
    let p = Plan::minimal(&root, Path::new("/home/u"), vec![]);
    let mut c = ctx(EngineKind::Docker, false);
    c.state_dir = dir.path().join("state/engine");
    let path = write_compose(&p, &c).unwrap();
    assert_eq!(path, c.state_dir.join("executor-compose.yml"));
    assert_eq!(
        std::fs::read(c.state_dir.join("executor-compose.env")).unwrap(),
        b""
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let v: Value = serde_yaml_ng::from_str(&text).unwrap();
    let top: Vec<&str> = v
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(top, ["volumes", "networks", "services"]);
    let services: Vec<&str> = v["services"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(services, ["executor"]);
    let svc = &v["services"]["executor"];
    for key in ["extends", "env_file", "include"] {
        assert!(svc.get(key).is_none(), "{key}");
    }
    assert_eq!(svc["build"].as_str(), Some(root.to_str().unwrap()));
    assert!(!text.contains("/:/host"), "{text}");
    // The project's files are untouched.
    for f in [
        "docker-compose.yml",
        "compose.yaml",
        "docker-compose.override.yml",
    ] {
        assert_eq!(std::fs::read_to_string(root.join(f)).unwrap(), hostile);
    }
    // Every path on the command line is the state directory's.
    let argv = up_command(&p, &c).argv();
    let paths: Vec<&String> = argv.iter().filter(|a| a.starts_with('/')).collect();
    assert_eq!(paths.len(), 2, "{argv:?}");
    assert!(paths.iter().all(|a| Path::new(a).starts_with(&c.state_dir)));
}

/// A state directory inside the project would let the jail rewrite the file: refused.
#[test]
fn a_state_directory_inside_the_project_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    std::fs::create_dir_all(&root).unwrap();
    let p = Plan::minimal(&root, Path::new("/home/u"), vec![]);
    let mut c = ctx(EngineKind::Podman, true);
    c.state_dir = root.join(".state/engine");
    let err = write_compose(&p, &c).unwrap_err().to_string();
    assert!(err.contains("lies inside the project"), "{err}");
    assert!(!c.state_dir.join(COMPOSE_FILE).exists());
    // Through a link into the project as well.
    std::os::unix::fs::symlink(&root, dir.path().join("link")).unwrap();
    c.state_dir = dir.path().join("link/.state2");
    let err = write_compose(&p, &c).unwrap_err().to_string();
    assert!(err.contains("lies inside the project"), "{err}");
    assert!(!root.join(".state2").join(COMPOSE_FILE).exists());
}

#[test]
fn tarball_extracts_with_tar() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"#!/bin/sh\necho hi\n".repeat(100);
    let t = dir.path().join("a.tar");
    std::fs::write(&t, tar_one_file("corral", &data)).unwrap();
    let out = std::process::Command::new("tar")
        .args([
            "-xf",
            t.to_str().unwrap(),
            "-C",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = dir.path().join("corral");
    assert_eq!(std::fs::read(&f).unwrap(), data);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o755
    );
}

#[test]
fn volume_step_whole() {
    let p = plan();
    assert_eq!(
        volume_step(&ctx(EngineKind::Podman, true), &p),
        crate::Step::Ensure {
            what: "volume corral-bin".into(),
            check: Command::new("podman").args(["volume", "exists", "corral-bin"]),
            create: vec![Command::new("podman").args(["volume", "create", "corral-bin"])],
        }
    );
}

#[test]
fn install_argv_whole() {
    let p = plan();
    let c = ctx(EngineKind::Podman, true);
    let cmds: Vec<Vec<String>> = install_binary(&c, &p, Path::new("/s/bin.tar"), "img")
        .iter()
        .map(|c| c.argv())
        .collect();
    assert_eq!(
        cmds,
        vec![vec![
            "podman",
            "volume",
            "import",
            "corral-bin",
            "/s/bin.tar"
        ]]
    );
    let c = ctx(EngineKind::Docker, false);
    let cmds: Vec<Vec<String>> = install_binary(&c, &p, Path::new("/s/bin.tar"), "img")
        .iter()
        .map(|c| c.argv())
        .collect();
    assert_eq!(
        cmds,
        vec![
            vec![
                "docker",
                "container",
                "create",
                "--name",
                "corral-bin-install-j1",
                "--volume",
                "corral-bin:/opt/corral",
                "img"
            ],
            vec![
                "docker",
                "cp",
                "/opt/c/corral",
                "corral-bin-install-j1:/opt/corral/corral"
            ],
            vec!["docker", "rm", "corral-bin-install-j1"],
        ]
    );
}

#[test]
fn with_new_repositories_allowed_the_service_runs_serve_under_the_engines_profile() {
    let mut p = plan();
    p.git.new_repositories = true;
    let v = executor_service(&p, &ctx(EngineKind::Podman, true));
    assert_eq!(v["command"][1].as_str(), Some("serve"));
    assert!(
        v.get("entrypoint").is_none() && v.get("init").is_none(),
        "{v:?}"
    );
    assert_eq!(
        v["security_opt"].as_sequence().unwrap().len(),
        1,
        "{:?}",
        v["security_opt"]
    );
}

/// podman-compose, when this machine has it (`CORRAL_CI_PODMAN_COMPOSE`, else on PATH).
fn podman_compose() -> Option<PathBuf> {
    std::env::var_os("CORRAL_CI_PODMAN_COMPOSE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join("podman-compose"))
                .find(|p| p.is_file())
        })
}

/// The real podman-compose (`--dry-run config`, which needs no engine) in a project holding a
/// `docker-compose.yml`, `compose.yaml`, override and `.env` (with `COMPOSE_FILE` and
/// `COMPOSE_PROJECT_NAME`) that each give `executor` the host's `/`: with corral's arguments it
/// reads corral's file only. Control: run plainly in the project, it merges the hostile files.
#[test]
fn podman_compose_with_corrals_arguments_reads_no_project_file() {
    let Some(pc) = podman_compose() else {
        eprintln!("skipping: podman-compose is not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    std::fs::create_dir_all(&root).unwrap();
    let hostile = "services:\n  executor:\n    image: x\n    volumes: [\"/:/hostroot:ro\"]\n";
    for f in [
        "docker-compose.yml",
        "compose.yaml",
        "docker-compose.override.yml",
        "evil.yml",
    ] {
        std::fs::write(root.join(f), hostile).unwrap();
    }
    std::fs::write(
        root.join(".env"),
        "COMPOSE_FILE=evil.yml\nCOMPOSE_PROJECT_NAME=evil\n",
    )
    .unwrap();
    let p = Plan::minimal(&root, Path::new("/home/u"), vec![]);
    let mut c = ctx(EngineKind::Podman, true);
    c.state_dir = dir.path().join("state/engine");
    write_compose(&p, &c).unwrap();
    let config = |args: &[String]| {
        let out = std::process::Command::new(&pc)
            .arg("--dry-run")
            .args(args)
            .arg("config")
            .current_dir(&root)
            .env_remove("COMPOSE_FILE")
            .env_remove("COMPOSE_PROJECT_DIR")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let ours = config(&compose_args(&p, &c));
    let v: Value = serde_yaml_ng::from_str(&ours).unwrap();
    let vols: Vec<&str> = v["services"]["executor"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let r = root.display();
    assert_eq!(
        vols,
        [format!("{r}:{r}:z"), "corral-bin:/opt/corral:z,ro".into()],
        "{ours}"
    );
    assert!(!ours.contains("hostroot"), "{ours}");
    // Control: a plain `podman-compose config` in the project reads the jail's files.
    let plain = config(&[]);
    assert!(plain.contains("/:/hostroot:ro"), "{plain}");
}
