//! `corral init --compose`: the executor service of seed 003, in a compose file of corral's own
//! in the project's engine state directory (never in the project), started with exactly that
//! file ([`up_command`]).
//!
//! Everything compose reads to decide what to run is corral's: the file list is given with `-f`
//! (so no `docker-compose.yml`, `compose.yaml`, override or `COMPOSE_FILE` of the project is
//! merged in), the variables file with `--env-file` is an empty file beside it (so no project
//! `.env` is read), the project name with `-p`, and the file names no other file (no `include`,
//! `extends` or `env_file`). The jail can write the project, not the state directory.
//!
//! The service builds the project's own image (`build: ROOT`), runs `corral serve --no-auth` from a
//! read-only volume holding the static corral binary, under corral's name gate as PID 1 (as the
//! harness container does), with the harness's hardening (read-only root, no capabilities, no
//! new privileges, corral's seccomp profile, limits, the proxy variables), on the project's
//! internal network under a unique alias: the harness's `corral exec` reaches it at
//! `http://<alias>:8080`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use corral_policy::plan::{Limits, Plan};
use serde::Serialize;
use serde_yaml_ng::{Mapping, Value};

use crate::argv::{STOP_TIMEOUT, proxy_env};
use crate::names::EXECUTOR_PORT;
use crate::{Command, Context, EngineError, EngineKind, Result};

/// The executor's compose file, in the project's engine state directory.
pub const COMPOSE_FILE: &str = "executor-compose.yml";
/// The (empty) variables file compose is given instead of the project's `.env`.
pub const ENV_FILE: &str = "executor-compose.env";
/// The service's name in it.
pub const SERVICE: &str = "executor";
/// The executor's own audit log, on its private tmpfs.
pub const EXECUTOR_AUDIT_LOG: &str = "/tmp/corral-executor-audit.jsonl";
/// Where the service sees the corral binary volume.
pub const BIN_DIR: &str = "/opt/corral";

#[derive(Debug, Serialize)]
struct Service {
    build: String,
    labels: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    userns_mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    volumes: Vec<String>,
    working_dir: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    entrypoint: Option<Vec<String>>,
    command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    init: Option<bool>,
    cap_drop: Vec<String>,
    security_opt: Vec<String>,
    read_only: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tmpfs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pids_limit: Option<u64>,
    stop_grace_period: String,
    environment: BTreeMap<String, String>,
    networks: BTreeMap<String, Aliases>,
}

#[derive(Debug, Serialize)]
struct Aliases {
    aliases: Vec<String>,
}

fn bytes_to_compose(bytes: u64) -> String {
    const M: u64 = 1024 * 1024;
    if bytes.is_multiple_of(M) {
        format!("{}m", bytes / M)
    } else {
        format!("{bytes}b")
    }
}

/// The executor service for `plan`, as a YAML value.
pub fn executor_service(plan: &Plan, ctx: &Context) -> Value {
    let names = ctx.names(plan);
    let root = plan.project.root.display().to_string();
    let limits: &Limits = plan
        .executor
        .jail
        .as_ref()
        .map(|j| &j.limits)
        .unwrap_or(&plan.limits);
    let (userns_mode, user) = match (ctx.engine, ctx.rootless) {
        (EngineKind::Podman, true) => (Some("keep-id".to_string()), None),
        _ => (None, Some(format!("{}:{}", plan.uid, plan.gid))),
    };
    let (project_opts, bin_opts) = match ctx.engine {
        EngineKind::Podman => ("z", "z,ro"),
        EngineKind::Docker => ("rw", "ro"),
    };
    let environment = proxy_env(&format!("localhost,127.0.0.1,::1,{}", names.executor_alias));
    // The project, then what the plan protects inside it (the policy file, .git/hooks, ...)
    // read-only over it: the agent's commands run here and must not widen the next run's policy.
    let mut volumes = vec![
        format!("{root}:{root}:{project_opts}"),
        format!("{}:{BIN_DIR}:{bin_opts}", names.bin_volume),
    ];
    let ro = match ctx.engine {
        EngineKind::Podman => "z,ro",
        EngineKind::Docker => "ro",
    };
    let mut host_paths = vec![root.clone(), BIN_DIR.to_string()];
    for p in plan.protected.iter().filter(|p| p.exists()) {
        volumes.push(format!("{0}:{0}:{ro}", p.display()));
        host_paths.push(p.display().to_string());
    }
    let serve = vec![
        format!("{BIN_DIR}/corral"),
        "serve".into(),
        "--no-auth".into(),
        "--listen".into(),
        format!("0.0.0.0:{EXECUTOR_PORT}"),
        "--root".into(),
        root.clone(),
        // The project's audit log is not mounted here: the agent's commands run in this
        // container and could forge or truncate it. The executor's records stay inside.
        "--audit-log".into(),
        EXECUTOR_AUDIT_LOG.into(),
    ];
    let mut security_opt = vec!["no-new-privileges:true".to_string()];
    // The name gate as the service's PID 1 (corral_sandbox gatexec.rs): the executor's
    // commands create no git repository where the host's git finds it, as in the harness
    // container; under corral's seccomp profile less what the gate itself calls, the commands
    // under all of it. The entrypoint is the gate's, whatever the project's image says (an
    // ENTRYPOINT there would be PID 1 instead, outside the filters; the gate refuses to start
    // unless it is PID 1), no engine init, and a kernel without the gate is an error: the
    // service has no run end at which to check. The git directories are the project's when
    // this file is written.
    let (entrypoint, init) = if plan.git.new_repositories {
        (None, None)
    } else {
        security_opt.push(format!("seccomp={}", ctx.seccomp_gated_file().display()));
        let mut e = vec![format!("{BIN_DIR}/corral")];
        e.extend(crate::argv::gate_command(
            &["--require-gate"],
            plan,
            host_paths,
        ));
        (Some(e), Some(false))
    };
    let service = Service {
        // The project's Dockerfile, by absolute path: the file itself lies elsewhere.
        build: root.clone(),
        // `corral down` removes what carries the project's label.
        labels: vec![names.label()],
        userns_mode,
        user,
        volumes,
        working_dir: root,
        entrypoint,
        command: serve,
        init,
        cap_drop: vec!["ALL".into()],
        security_opt,
        read_only: true,
        // podman's --read-only already mounts tmpfs on /tmp, /var/tmp and /run.
        tmpfs: match ctx.engine {
            EngineKind::Podman => vec![],
            EngineKind::Docker => vec!["/tmp".into(), "/var/tmp".into(), "/run".into()],
        },
        cpus: limits.cpus,
        mem_limit: limits.memory.map(bytes_to_compose),
        pids_limit: limits.pids,
        stop_grace_period: format!("{STOP_TIMEOUT}s"),
        environment,
        networks: BTreeMap::from([(
            names.internal_network.clone(),
            Aliases {
                aliases: vec![names.executor_alias.clone()],
            },
        )]),
    };
    serde_yaml_ng::to_value(service).expect("the service always serializes")
}

fn external() -> Value {
    let mut m = Mapping::new();
    m.insert("external".into(), Value::Bool(true));
    Value::Mapping(m)
}

/// The whole compose file: the `executor` service, the binary volume and the internal network
/// (both external).
pub fn compose_text(plan: &Plan, ctx: &Context) -> String {
    let names = ctx.names(plan);
    let mut top = Mapping::new();
    let one = |k: &str, v: Value| {
        let mut m = Mapping::new();
        m.insert(k.into(), v);
        Value::Mapping(m)
    };
    top.insert("volumes".into(), one(&names.bin_volume, external()));
    top.insert("networks".into(), one(&names.internal_network, external()));
    top.insert("services".into(), one(SERVICE, executor_service(plan, ctx)));
    if ctx.engine == EngineKind::Podman {
        // podman-compose would otherwise wrap the service in a pod that `corral down` (which
        // removes what carries the project's label) cannot see; docker compose ignores `x-` keys.
        top.insert("x-podman".into(), one("in_pod", Value::Bool(false)));
    }
    let body = serde_yaml_ng::to_string(&Value::Mapping(top)).expect("a mapping always serializes");
    format!(
        "# The `executor` service of {root}, written by `corral init --compose` (running it again\n\
         # rewrites this file). Start it with: {up}\n{body}",
        root = plan.project.root.display(),
        up = up_command(plan, ctx).argv().join(" "),
        body = body.trim_start_matches("---\n")
    )
}

/// The compose program of the engine: `podman-compose`, or `docker-compose` (whose arguments
/// `docker compose` takes as they are).
pub fn compose_program(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Podman => "podman-compose",
        EngineKind::Docker => "docker-compose",
    }
}

/// The arguments every compose command on the executor starts with: corral's project name (the
/// executor alias, already lower case and DNS-safe), its file and its empty variables file,
/// nothing from the project.
pub fn compose_args(plan: &Plan, ctx: &Context) -> Vec<String> {
    compose_args_for(ctx, &ctx.names(plan))
}

fn compose_args_for(ctx: &Context, names: &crate::names::Names) -> Vec<String> {
    vec![
        "-p".into(),
        names.executor_alias.clone(),
        "-f".into(),
        ctx.state_dir.join(COMPOSE_FILE).display().to_string(),
        "--env-file".into(),
        ctx.state_dir.join(ENV_FILE).display().to_string(),
    ]
}

/// `compose ... up -d executor`: what the user runs to start (or rebuild) the executor.
pub fn up_command(plan: &Plan, ctx: &Context) -> Command {
    up_command_for(ctx, &ctx.names(plan))
}

/// [`up_command`] from the project's names.
pub fn up_command_for(ctx: &Context, names: &crate::names::Names) -> Command {
    Command::new(compose_program(ctx.engine))
        .args(compose_args_for(ctx, names))
        .args(["up", "-d", SERVICE])
}

/// Write the compose file and its empty variables file into the engine state directory.
/// Refused when that directory lies in the project (the jail could then write the file).
/// Returns the compose file's path.
pub fn write_compose(plan: &Plan, ctx: &Context) -> Result<PathBuf> {
    // Compared as the kernel resolves them (a link into the project is in the project); a path
    // that cannot be resolved is an error, not a pass.
    let real = |p: &Path| {
        fs::canonicalize(p).map_err(|source| EngineError::Io {
            path: p.to_path_buf(),
            source,
        })
    };
    fs::create_dir_all(&ctx.state_dir).map_err(|source| EngineError::Io {
        path: ctx.state_dir.clone(),
        source,
    })?;
    if real(&ctx.state_dir)?.starts_with(real(&plan.project.root)?) {
        return Err(EngineError::Compose(format!(
            "corral's state directory {} lies inside the project {}, where the jail could rewrite \
             the executor's compose file; set XDG_STATE_HOME to a directory outside the project",
            ctx.state_dir.display(),
            plan.project.root.display()
        )));
    }
    let path = ctx.state_dir.join(COMPOSE_FILE);
    write_atomic(&ctx.state_dir.join(ENV_FILE), b"")?;
    write_atomic(&path, compose_text(plan, ctx).as_bytes())?;
    Ok(path)
}

/// A one-file ustar archive holding `name` (mode 0755) with `data`.
pub fn tar_one_file(name: &str, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let mut field = |off: usize, value: &str| {
        h[off..off + value.len()].copy_from_slice(value.as_bytes());
    };
    field(100, "0000755\0"); // mode
    field(108, "0000000\0"); // uid
    field(116, "0000000\0"); // gid
    field(124, &format!("{:011o}\0", data.len())); // size
    field(136, "00000000000\0"); // mtime
    field(156, "0"); // regular file
    field(257, "ustar\x0000"); // magic and version
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// The binary volume, created unless it exists.
pub fn volume_step(ctx: &Context, plan: &Plan) -> crate::Step {
    let vol = ctx.names(plan).bin_volume;
    let p = ctx.engine.program();
    crate::Step::Ensure {
        what: format!("volume {vol}"),
        check: match ctx.engine {
            EngineKind::Podman => Command::new(p).args(["volume", "exists", &vol]),
            EngineKind::Docker => Command::new(p).args(["volume", "inspect", &vol]),
        },
        create: vec![Command::new(p).args(["volume", "create", &vol])],
    }
}

/// The commands that put `bin` into the binary volume (see [`volume_step`]) as `corral`. podman imports a tarball
/// (`tarball` must hold [`tar_one_file`] of the binary); docker copies through a created, never
/// started, container of `image`.
pub fn install_binary(ctx: &Context, plan: &Plan, tarball: &Path, image: &str) -> Vec<Command> {
    let names = ctx.names(plan);
    let vol = names.bin_volume.as_str();
    match ctx.engine {
        EngineKind::Podman => vec![Command::new("podman").args([
            "volume",
            "import",
            vol,
            &tarball.display().to_string(),
        ])],
        EngineKind::Docker => {
            let tmp = format!("{}-install-{}", names.bin_volume, ctx.jail_id);
            vec![
                Command::new("docker").args([
                    "container",
                    "create",
                    "--name",
                    &tmp,
                    "--volume",
                    &format!("{vol}:{BIN_DIR}"),
                    image,
                ]),
                Command::new("docker").args([
                    "cp",
                    &ctx.corral_bin.display().to_string(),
                    &format!("{tmp}:{BIN_DIR}/corral"),
                ]),
                Command::new("docker").args(["rm", &tmp]),
            ]
        }
    }
}

/// Write `data` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let io = |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(io)?;
    f.write_all(data).map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests;
