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
    let text = merge(None, Path::new("x.yml"), &p, &c).unwrap();
    let key = &n.key;
    let alias = &n.executor_alias;
    assert_eq!(
        text,
        format!(
            r#"volumes:
  corral-bin:
    external: true
networks:
  corral-{key}-internal:
    external: true
services:
  executor:
    build: .
    labels:
    - corral.project={key}
    userns_mode: keep-id
    volumes:
    - /src/test-project:/src/test-project:z
    - corral-bin:/opt/corral:z,ro
    - /src/test-project/docker-compose.override.yml:/src/test-project/docker-compose.override.yml:z,ro
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
    - --host-path
    - /src/test-project/docker-compose.override.yml
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
            format!("{r}/docker-compose.override.yml:{r}/docker-compose.override.yml:z,ro"),
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

#[test]
fn merge_keeps_the_rest_and_replaces_only_the_executor() {
    let p = plan();
    let c = ctx(EngineKind::Podman, true);
    let existing = "services:\n  app:\n    build: .\n    command: [\"/bin/true\"]\n  executor:\n    image: old\nvolumes:\n  data: {}\nx-custom: 1\n";
    let text = merge(Some(existing), Path::new("x.yml"), &p, &c).unwrap();
    let v: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(
        v["services"]["app"]["command"][0].as_str(),
        Some("/bin/true")
    );
    assert!(v["services"]["executor"].get("image").is_none());
    assert_eq!(v["services"]["executor"]["build"].as_str(), Some("."));
    assert!(v["volumes"]["data"].is_mapping());
    assert_eq!(v["volumes"]["corral-bin"]["external"].as_bool(), Some(true));
    assert_eq!(v["x-custom"].as_u64(), Some(1));
    // Idempotent.
    assert_eq!(
        merge(Some(&text), Path::new("x.yml"), &p, &c).unwrap(),
        text
    );

    let err = merge(Some("- a\n- b\n"), Path::new("/p/x.yml"), &p, &c).unwrap_err();
    assert!(err.to_string().contains("/p/x.yml"), "{err}");
    let err = merge(Some("services: [1]\n"), Path::new("/p/x.yml"), &p, &c).unwrap_err();
    assert!(
        err.to_string().contains("`services` is not a mapping"),
        "{err}"
    );
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
