//! `corral plan --engine podman|docker` prints the exact engine commands `corral run` runs,
//! without running any (so it works with docker's client alone, or no engine at all).

use std::process::Command;

fn plan(engine: &str) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("proj");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("corral.toml"),
        "[run]\nimage = \"localhost/img:1\"\n\n[network]\nmode = \"proxy\"\nallow = [\"example.org\"]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["plan", "--engine", engine, "--", "/bin/echo", "hi there"])
        .current_dir(&project)
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("CORRAL_ENGINE_PREFIX", "corral")
        .env("CORRAL_CONTAINER_BIN", env!("CARGO_BIN_EXE_corral"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (String::from_utf8(out.stdout).unwrap(), dir)
}

#[test]
fn podman_plan_prints_every_command() {
    let (out, dir) = plan("podman");
    let project = dir.path().join("proj");
    let key = corral_audit::project_key(&project);
    // Cargo builds the lean corral-proxy next to corral: the proxy container runs it.
    let lean = std::fs::canonicalize(env!("CARGO_BIN_EXE_corral-proxy")).unwrap();
    let state = dir.path().join("state/corral");
    let cmds: Vec<&str> = out
        .split("engine commands\n")
        .nth(1)
        .expect("an engine commands section")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert_eq!(cmds.len(), 4, "{out}");
    similar_asserts::assert_eq!(
        cmds[0],
        format!(
            "podman network exists corral-{key}-internal >/dev/null 2>&1 || {{ podman network create --internal --disable-dns --label corral.project={key} corral-{key}-internal; }}"
        )
    );
    similar_asserts::assert_eq!(
        cmds[1],
        "podman network exists corral-external >/dev/null 2>&1 || { podman network create --label corral.role=external corral-external; }"
    );
    let user = if std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
    {
        "--user 65534:65534".to_string()
    } else {
        "--userns keep-id".to_string()
    };
    similar_asserts::assert_eq!(
        cmds[2],
        format!(
            "podman container exists corral-{key}-proxy >/dev/null 2>&1 || {{ podman run --detach --name corral-{key}-proxy \
             --label corral.project={key} --label corral.role=proxy --pull never --init --read-only --read-only-tmpfs \
             --cap-drop ALL --security-opt no-new-privileges --security-opt seccomp={state}/engine/{key}/seccomp.json {user} --cpus 1 --memory 512m --pids-limit 64 \
             --stop-timeout 5 --network corral-{key}-internal:alias=proxy --network corral-external \
             --volume {lean}:/usr/local/bin/corral-proxy:ro,z --volume {state}/engine/{key}/proxy:/etc/corral:ro,z \
             --volume {state}/{key}:/var/log/corral:rw,z --entrypoint /usr/local/bin/corral-proxy localhost/img:1 \
             --listen 0.0.0.0:3128 --policy /etc/corral/policy.toml --audit-log /var/log/corral/audit.jsonl; }}",
            lean = lean.display(),
            state = state.display(),
        )
    );
    let run = cmds[3];
    let project = project.display();
    for part in [
        format!("podman run --rm --name corral-{key}-JAILID --label corral.project={key} "),
        "--pull never --interactive --init=false --read-only --read-only-tmpfs --cap-drop ALL --security-opt no-new-privileges ".into(),
        format!(
            "--network corral-{key}-internal --dns 127.0.0.1 --add-host 'proxy:{{proxy-address}}' "
        ),
        format!(
            "--security-opt seccomp={}/engine/{key}/seccomp-gated.json ",
            state.display()
        ),
        "--stop-timeout 5 ".into(),
        format!("--workdir {project} "),
        format!("--volume {project}:{project}:rw,z "),
        format!("--volume {project}/corral.toml:{project}/corral.toml:ro,z "),
        "--env HTTPS_PROXY ".into(),
    ] {
        assert!(run.contains(&part), "{part:?} not in\n{run}");
    }
    // The name gate starts the command: the project is a read-write bind the host sees.
    assert!(
        run.contains(
            " --entrypoint /usr/local/bin/corral localhost/img:1 __corral-gate-exec --init "
        ),
        "{run}"
    );
    assert!(run.contains(&format!(" --host-path {project} ")), "{run}");
    assert!(run.ends_with(" -- echo 'hi there'"), "{run}");
    assert!(out.contains("#   HTTPS_PROXY=http://proxy:3128\n"), "{out}");
    assert!(
        out.contains(
            "# where {proxy-address} is the proxy container's address on the internal network"
        ),
        "{out}"
    );
}

#[test]
fn docker_plan_needs_no_daemon() {
    let (out, dir) = plan("docker");
    let key = corral_audit::project_key(&dir.path().join("proj"));
    assert!(
        out.contains(&format!(
            "docker network inspect --format '{{{{.Name}}}}' corral-{key}-internal >/dev/null 2>&1 || {{ docker network create --internal"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "; docker network connect corral-external corral-{key}-proxy; }}"
        )),
        "{out}"
    );
    assert!(
        out.contains("--tmpfs /tmp:rw,nosuid,nodev,mode=1777"),
        "{out}"
    );
    assert!(!out.contains("--userns keep-id"), "{out}");
}
