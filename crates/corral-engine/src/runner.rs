//! Executing a [`Setup`] against the real engine, and the host-side preparation it needs.

use std::fs;
use std::io::IsTerminal;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use corral_policy::plan::{NetworkMode, Plan};

use crate::argv::{EXECUTOR_ADDRESS, PROXY_ADDRESS, PROXY_FALLBACK_USER};
use crate::gateway::{Credentials, GatewayRun, SigninFiles};
use crate::names::{DEFAULT_PREFIX, Names};
use crate::{Command, Context, EngineError, EngineKind, Result, Setup, Step, proxy_policy};

/// The variable naming the corral binary to mount into containers (default: this executable).
pub const BIN_ENV: &str = "CORRAL_CONTAINER_BIN";
/// The lean proxy executable's file name, next to the corral binary.
pub const PROXY_BIN_NAME: &str = "corral-proxy";

/// Whether `program` is on PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
    })
}

/// `auto` for the container engines: podman, else docker.
pub fn detect() -> Option<EngineKind> {
    [EngineKind::Podman, EngineKind::Docker]
        .into_iter()
        .find(|e| on_path(e.program()))
}

fn euid() -> u32 {
    fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0)
}

/// Whether an ELF executable is statically linked (has no program interpreter).
pub fn is_static(path: &Path) -> Result<bool> {
    let data = fs::read(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = || EngineError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a 64-bit ELF executable",
        ),
    };
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
        return Err(bad());
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(data[0x20..0x28].try_into().map_err(|_| bad())?) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let ty = data.get(o..o + 4).ok_or_else(bad)?;
        if u32::from_le_bytes(ty.try_into().map_err(|_| bad())?) == 3 {
            return Ok(false); // PT_INTERP
        }
    }
    Ok(true)
}

/// The binary mounted into containers: `$CORRAL_CONTAINER_BIN`, else this executable.
pub fn corral_bin() -> Result<PathBuf> {
    let path = match std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe().map_err(|source| EngineError::Io {
            path: PathBuf::from("/proc/self/exe"),
            source,
        })?,
    };
    fs::canonicalize(&path).map_err(|source| EngineError::Io { path, source })
}

/// The lean proxy executable next to `corral_bin` (`corral-proxy`, built with it), if it is
/// there and linked the same way (a static corral with a dynamic `corral-proxy` beside it would
/// not run in every image): the proxy container then runs it instead of `corral proxy`.
pub fn proxy_bin(corral_bin: &Path) -> Option<PathBuf> {
    let path = corral_bin.parent()?.join(PROXY_BIN_NAME);
    let linked_alike = path.is_file() && is_static(&path).ok()? == is_static(corral_bin).ok()?;
    linked_alike.then_some(path)
}

fn state_root() -> Result<PathBuf> {
    corral_audit::state_dir().map_err(|e| EngineError::Io {
        path: PathBuf::from("$XDG_STATE_HOME"),
        source: std::io::Error::other(e.to_string()),
    })
}

/// This project's engine files on the host: `$XDG_STATE_HOME/corral/engine/<key>`.
pub fn project_state_dir(project_root: &Path) -> Result<PathBuf> {
    Ok(state_root()?
        .join("engine")
        .join(corral_audit::project_key(project_root)))
}

/// What runs with `[secrets]` or sign-ins left in the project's state directory when corral
/// was killed (their gateway directories and placeholder sign-in files; a run removes its own
/// when it ends). `corral down` calls it after removing the containers.
pub fn remove_gateway_leftovers(project_root: &Path) -> Result<Vec<PathBuf>> {
    let state = project_state_dir(project_root)?;
    let mut removed = Vec::new();
    for dir in [state.join("gateway"), state.join("signin")] {
        if !dir.exists() {
            continue;
        }
        fs::remove_dir_all(&dir).map_err(|source| EngineError::Io {
            path: dir.clone(),
            source,
        })?;
        removed.push(dir);
    }
    Ok(removed)
}

/// The context of a run on this host.
pub fn host_context(engine: EngineKind, plan: &Plan, jail_id: &str) -> Result<Context> {
    let state = state_root()?;
    let audit =
        corral_audit::AuditLog::for_project(&plan.project.root).map_err(|e| EngineError::Io {
            path: PathBuf::from("$XDG_STATE_HOME"),
            source: std::io::Error::other(e.to_string()),
        })?;
    let audit_dir = audit
        .path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| state.clone());
    let rootless = euid() != 0;
    let limits_enforceable = match (engine, rootless) {
        (EngineKind::Podman, true) => Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        _ => true,
    };
    let corral_bin = corral_bin()?;
    let prefix = std::env::var("CORRAL_ENGINE_PREFIX")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PREFIX.to_string());
    Ok(Context {
        engine,
        rootless: rootless && engine == EngineKind::Podman,
        // Not under the audit directory: that one is mounted writable into the proxy.
        state_dir: project_state_dir(&plan.project.root)?,
        audit_dir,
        proxy_bin: proxy_bin(&corral_bin),
        corral_bin,
        jail_id: jail_id.to_string(),
        stdio: crate::argv::Stdio::for_ends(
            std::io::stdin().is_terminal(),
            std::io::stdout().is_terminal(),
        ),
        proxy_image: std::env::var("CORRAL_PROXY_IMAGE")
            .ok()
            .filter(|v| !v.is_empty()),
        limits_enforceable,
        skill_source: None,
        // The native gateway honours corral's SSL_CERT_FILE for the real hosts; the gateway
        // proxy container is given the same file.
        upstream_ca: std::env::var_os("SSL_CERT_FILE")
            .filter(|_| Context::has_gateway(plan))
            .map(PathBuf::from)
            .filter(|p| p.is_file()),
        signin_real: plan
            .signin
            .iter()
            .filter_map(|s| {
                let real = fs::canonicalize(&s.file).ok()?;
                (real != s.file).then(|| (s.name.clone(), real))
            })
            .collect(),
        prefix,
    })
}

/// The host files a setup refers to: the masking file, the empty policy stand-in, the audit
/// directory, and the proxy policy. Returns whether the proxy policy changed (a running proxy
/// container must then reload it).
pub fn prepare_host(plan: &Plan, ctx: &Context) -> Result<bool> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EngineError::Io { path, source }
    };
    fs::create_dir_all(&ctx.state_dir).map_err(io(&ctx.state_dir))?;
    for (path, mode) in [(ctx.masked_file(), 0o000), (ctx.empty_file(), 0o444)] {
        if !path.exists() {
            fs::write(&path, b"").map_err(io(&path))?;
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io(&path))?;
    }
    write_seccomp_profile(ctx)?;
    if plan.network.mode != NetworkMode::Proxy {
        return Ok(false);
    }
    prepare_audit_dir(plan, ctx)?;
    let dir = ctx.proxy_dir();
    let changed = proxy_policy::write(&dir, &plan.network)?;
    // The engine user (nobody, or a keep-id uid) must read it.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(io(&dir))?;
    Ok(changed)
}

/// corral's seccomp rules as the OCI profile the containers get (rewritten when corral's
/// rules changed; the engine reads it when it creates a container).
pub fn write_seccomp_profile(ctx: &Context) -> Result<()> {
    use corral_sandbox::seccomp::{oci_profile, oci_profile_gated};
    fs::create_dir_all(&ctx.state_dir).map_err(|source| EngineError::Io {
        path: ctx.state_dir.clone(),
        source,
    })?;
    for (path, profile) in [
        (ctx.seccomp_file(), oci_profile()?),
        (ctx.seccomp_gated_file(), oci_profile_gated()?),
    ] {
        let text = serde_json::to_string_pretty(&profile).expect("a JSON value serializes");
        if fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        // Whole or not at all: another run of the project may be starting a container on it.
        let io = |source| EngineError::Io {
            path: path.clone(),
            source,
        };
        let tmp = path.with_extension(format!("json.{}", std::process::id()));
        fs::write(&tmp, text).map_err(io)?;
        fs::rename(&tmp, &path).map_err(io)?;
    }
    Ok(())
}

/// The project's audit directory, shared with the proxy and executor containers. When the
/// caller is root, the proxy runs as nobody and the executor as root without capabilities (so
/// without CAP_DAC_OVERRIDE): the directory and log are owned by root with group nobody,
/// group-writable, so both can append and neither needs a capability.
pub fn prepare_audit_dir(plan: &Plan, ctx: &Context) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EngineError::Io { path, source }
    };
    fs::create_dir_all(&ctx.audit_dir).map_err(io(&ctx.audit_dir))?;
    if plan.uid != 0 {
        return Ok(());
    }
    // The log and the lock file every writer takes (corral-audit): both must be openable by
    // the proxy's user, whoever created them first.
    let (_, g) = PROXY_FALLBACK_USER.split_once(':').expect("uid:gid");
    let g: u32 = g.parse().expect("gid");
    let dir = &ctx.audit_dir;
    std::os::unix::fs::chown(dir, Some(0), Some(g)).map_err(io(dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o770)).map_err(io(dir))?;
    // The proxy's user can write this directory: each file is opened without following a link
    // it may have planted, and changed through the descriptor, never by path.
    for name in ["audit.jsonl", "audit.jsonl.lock"] {
        use std::os::unix::fs::OpenOptionsExt;
        let f = dir.join(name);
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o660)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&f)
            .map_err(io(&f))?;
        std::os::unix::fs::fchown(&file, Some(0), Some(g)).map_err(io(&f))?;
        file.set_permissions(fs::Permissions::from_mode(0o660))
            .map_err(io(&f))?;
    }
    Ok(())
}

/// Run a command to completion, capturing its output; an error names the command and quotes
/// its stderr.
pub fn output(cmd: &Command) -> Result<String> {
    let out = cmd
        .to_std()
        .stdin(Stdio::null())
        .output()
        .map_err(|source| EngineError::Spawn {
            program: cmd.program.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(EngineError::Failed {
            command: cmd.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn succeeds(cmd: &Command) -> Result<bool> {
    let status = cmd
        .to_std()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|source| EngineError::Spawn {
            program: cmd.program.clone(),
            source,
        })?;
    Ok(status.success())
}

/// Bring up everything but the harness: networks and the proxy container, created when missing,
/// reused otherwise. A running proxy whose policy file changed is told to reload it (SIGHUP;
/// it also notices the change by itself within a second).
pub fn ensure(setup: &Setup, ctx: &Context, policy_changed: bool, names: &Names) -> Result<()> {
    let is_proxy = |create: &[Command]| {
        create.first().is_some_and(|c| {
            c.args.first().map(String::as_str) == Some("run")
                && c.args.contains(&names.proxy_container)
        })
    };
    // The warm path, one engine call: a running proxy is attached to both networks, so they
    // exist too and nothing needs checking.
    let has_proxy = setup
        .steps
        .iter()
        .any(|s| matches!(s, Step::Ensure { create, .. } if is_proxy(create)));
    if has_proxy && proxy_running(ctx, &names.proxy_container) {
        if policy_changed {
            let p = ctx.engine.program();
            output(&Command::new(p).args(["kill", "--signal", "HUP", &names.proxy_container]))?;
        }
        return Ok(());
    }
    for step in &setup.steps {
        if let Step::Ensure { check, create, .. } = step {
            if succeeds(check)? {
                if is_proxy(create) {
                    start_or_reload(ctx, names, policy_changed)?;
                }
                continue;
            }
            for c in create {
                output(c)?;
            }
            if is_proxy(create) {
                wait_proxy_ready(ctx, &names.proxy_container, SHARED_PROXY_TRIES)?;
            } else if let Some(gateway) = gateway_container(create) {
                // The harness cannot start without what the gateway writes: not listening
                // after the wait is an error, not a race.
                if !wait_proxy_ready(ctx, gateway, GATEWAY_PROXY_TRIES)? {
                    return Err(EngineError::Gateway(format!(
                        "the gateway proxy container {gateway} did not say it listens within {} s; see `{} logs {gateway}`",
                        GATEWAY_PROXY_TRIES / 10,
                        ctx.engine.program()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The container a step's `create` starts when it is a run's gateway proxy.
fn gateway_container(create: &[Command]) -> Option<&str> {
    let run = create.first()?;
    if run.args.first().map(String::as_str) != Some("run")
        || !run.args.iter().any(|a| a == "corral.role=gateway")
    {
        return None;
    }
    let at = run.args.iter().position(|a| a == "--name")?;
    run.args.get(at + 1).map(String::as_str)
}

/// How many times (every 100 ms) a new shared proxy's log is read for its `listening on` line.
const SHARED_PROXY_TRIES: u32 = 50;
/// The same for a run's gateway proxy, which the harness cannot start without.
const GATEWAY_PROXY_TRIES: u32 = 600;

/// Wait until a new proxy container says it listens (its log's `listening on` line), so the
/// harness's first request does not race it; whether it did within `tries` reads. A proxy that
/// exits instead (a policy it cannot load, a binary the image cannot run) is an error quoting
/// its log.
fn wait_proxy_ready(ctx: &Context, container: &str, tries: u32) -> Result<bool> {
    let p = ctx.engine.program();
    let logs = Command::new(p).args(["logs", container]);
    for _ in 0..tries {
        let out = logs
            .to_std()
            .stdin(Stdio::null())
            .output()
            .map_err(|source| EngineError::Spawn {
                program: p.to_string(),
                source,
            })?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if text.contains("listening on") {
            return Ok(true);
        }
        if !proxy_running(ctx, container) {
            return Err(EngineError::ProxyExited {
                engine: ctx.engine,
                container: container.to_string(),
                log: text.trim().to_string(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(false)
}

/// An existing proxy container: started if it stopped (it then reads the current policy),
/// else signalled to reload when the policy changed.
fn proxy_running(ctx: &Context, container: &str) -> bool {
    output(&Command::new(ctx.engine.program()).args([
        "container",
        "inspect",
        "--format",
        "{{.State.Running}}",
        container,
    ]))
    .is_ok_and(|out| out.trim() == "true")
}

fn start_or_reload(ctx: &Context, names: &Names, policy_changed: bool) -> Result<()> {
    let p = ctx.engine.program();
    if !proxy_running(ctx, &names.proxy_container) {
        output(&Command::new(p).args(["start", &names.proxy_container]))?;
    } else if policy_changed {
        output(&Command::new(p).args(["kill", "--signal", "HUP", &names.proxy_container]))?;
    }
    Ok(())
}

/// The whole run: prepare the host, ensure the shared objects, run the harness in the
/// foreground and return its exit code (the engine's own errors are 125, as `podman run`'s).
/// `wait` runs the harness command and returns its status (the CLI passes one that keeps corral
/// alive through the terminal's signals and forwards SIGTERM/SIGHUP). `secrets` are the real
/// values of the plan's `[secrets]` (read by the caller from its environment) and the tokens of
/// its sign-ins, given to the run's gateway proxy only, and the sign-ins' placeholder files for
/// the harness ([`crate::gateway`]).
pub fn run_with(
    plan: &Plan,
    ctx: &Context,
    setup: &Setup,
    secrets: &Credentials,
    wait: impl FnOnce(&Command) -> std::io::Result<std::process::ExitStatus>,
) -> Result<i32> {
    let relays = crate::ports::Relays::bind(plan, ctx)?;
    let changed = prepare_host(plan, ctx)?;
    let names = ctx.names(plan);
    // Dropped at the end of the run, or on any error from here on: the gateway proxy and its
    // files are removed.
    let signin_files = SigninFiles::write(plan, ctx, secrets)?;
    let gateway = GatewayRun::prepare(plan, ctx, &secrets.gateway)?;
    ensure(setup, ctx, changed, &names)?;
    let cmd = setup.run_command().ok_or(EngineError::NoCommand)?;
    let (proxy, _) = ctx.proxy_for(plan);
    let mut cmd = with_addresses(cmd, ctx, &names, &proxy)?;
    if let Some(g) = &gateway {
        cmd = crate::gateway::with_gateway(&cmd, &g.started()?, ctx)?;
    }
    let cmd = &cmd;
    // An absent policy file is covered by an empty read-only one; the runtime leaves an empty
    // mount point behind on the host, removed again below.
    let policy = &plan.project.policy_file;
    let policy_existed = policy.symlink_metadata().is_ok();
    let relaying = relays.start(ctx, plan)?;
    let status = wait(cmd);
    // The relays first: they share the harness container's network namespace (crate::ports).
    drop(relaying);
    // `--rm` leaves the container's removal to the engine, which can finish it after its
    // client returned (podman's cleanup process, late on a loaded machine, when the run was
    // stopped by a signal): removed here too, so that nothing of the run is left once corral
    // exits. A container already gone is no error.
    let _ = crate::ports::remove_container(ctx.engine, &ctx.harness_container(plan));
    drop(gateway);
    drop(signin_files);
    if !policy_existed && fs::metadata(policy).is_ok_and(|m| m.is_file() && m.len() == 0) {
        let _ = fs::remove_file(policy);
    }
    let status = status.map_err(|source| EngineError::Spawn {
        program: cmd.program.clone(),
        source,
    })?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 125,
    })
}

/// The harness command with the internal network's addresses put in where the argv holds
/// [`PROXY_ADDRESS`] or [`EXECUTOR_ADDRESS`] (podman's internal network has no DNS). A compose
/// executor that is not running gets no host entry, and a line saying so: `corral exec` in
/// the harness then fails until it runs.
fn with_addresses(
    cmd: &Command,
    ctx: &Context,
    names: &Names,
    proxy_container: &str,
) -> Result<Command> {
    let holds = |token: &str| cmd.args.iter().any(|a| a.contains(token));
    if !holds(PROXY_ADDRESS) && !holds(EXECUTOR_ADDRESS) {
        return Ok(cmd.clone());
    }
    let proxy = address_on(ctx, proxy_container, &names.internal_network)?.ok_or_else(|| {
        EngineError::Failed {
            command: format!(
                "{} container inspect {proxy_container}",
                ctx.engine.program(),
            ),
            status: "no address".into(),
            stderr: format!(
                "the proxy container has no address on {}; `corral down` and run again",
                names.internal_network
            ),
        }
    })?;
    let executor = if holds(EXECUTOR_ADDRESS) {
        let found = executor_address(ctx, names)?;
        if found.is_none() {
            eprintln!(
                "corral: the compose executor ({}) is not running, so `corral exec` will fail in this run: \
                 start it first (`{}`, as `corral init --compose` printed it)",
                names.executor_alias,
                crate::compose::up_command_for(ctx, names).argv().join(" ")
            );
        }
        found
    } else {
        None
    };
    let mut out = cmd.clone();
    out.args.clear();
    let mut args = cmd.args.iter();
    while let Some(a) = args.next() {
        if a == "--add-host" {
            let Some(entry) = args.next() else { break };
            let entry = entry.replace(PROXY_ADDRESS, &proxy);
            match (&executor, entry.contains(EXECUTOR_ADDRESS)) {
                (Some(addr), true) => out
                    .args
                    .extend([a.clone(), entry.replace(EXECUTOR_ADDRESS, addr)]),
                (None, true) => {}
                (_, false) => out.args.extend([a.clone(), entry]),
            }
        } else {
            out.args.push(a.clone());
        }
    }
    Ok(out)
}

/// A container's IPv4 address on a network, if it is attached there.
fn address_on(ctx: &Context, container: &str, network: &str) -> Result<Option<String>> {
    let format = format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}");
    let out = output(&Command::new(ctx.engine.program()).args([
        "container",
        "inspect",
        "--format",
        &format,
        container,
    ]))?;
    let addr = out.trim();
    Ok(addr
        .parse::<std::net::Ipv4Addr>()
        .ok()
        .map(|a| a.to_string()))
}

/// The address of the running container that answers as the compose executor's alias on the
/// project's internal network.
fn executor_address(ctx: &Context, names: &Names) -> Result<Option<String>> {
    let p = ctx.engine.program();
    let label = format!("label={}", names.label());
    let listed =
        output(&Command::new(p).args(["ps", "--filter", &label, "--format", "{{.Names}}"]))?;
    let aliases = format!(
        "{{{{(index .NetworkSettings.Networks \"{}\").Aliases}}}}",
        names.internal_network
    );
    for name in listed.lines().map(str::trim).filter(|n| !n.is_empty()) {
        if name == names.proxy_container {
            continue;
        }
        let Ok(found) =
            output(&Command::new(p).args(["container", "inspect", "--format", &aliases, name]))
        else {
            continue; // gone meanwhile
        };
        if found
            .split([' ', '[', ']'])
            .any(|a| a == names.executor_alias)
        {
            return address_on(ctx, name, &names.internal_network);
        }
    }
    Ok(None)
}

/// [`run_with`] waiting plainly.
pub fn run(plan: &Plan, ctx: &Context, setup: &Setup) -> Result<i32> {
    let none = Credentials::default();
    run_with(plan, ctx, setup, &none, |cmd| cmd.to_std().status())
}

/// What `corral down` removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub containers: Vec<String>,
    pub networks: Vec<String>,
}

/// Remove every container labelled with the project, its internal network, and the shared
/// external network when nothing else uses it.
pub fn down(engine: EngineKind, names: &Names) -> Result<Removed> {
    let p = engine.program();
    let list = output(&Command::new(p).args([
        "ps",
        "--all",
        "--filter",
        &format!("label={}", names.label()),
        "--format",
        "{{.Names}}",
    ]))?;
    let mut removed = Removed::default();
    let containers: Vec<String> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    // Relay containers first: podman does not remove a container whose network namespace
    // another one shares (crate::ports).
    let (relays, others): (Vec<&String>, Vec<&String>) = containers
        .iter()
        .partition(|c| c.ends_with(crate::ports::RELAY_SUFFIX));
    for batch in [relays, others].into_iter().filter(|b| !b.is_empty()) {
        let mut rm = Command::new(p).args(["rm", "--force"]);
        if engine == EngineKind::Podman {
            rm = rm.args(["--time", "5"]);
        }
        output(&rm.args(batch.into_iter().cloned()))?;
    }
    removed.containers = containers;
    let exists = |n: &str| match engine {
        EngineKind::Podman => Command::new(p).args(["network", "exists", n]),
        EngineKind::Docker => Command::new(p).args(["network", "inspect", n]),
    };
    if succeeds(&exists(&names.internal_network))? {
        output(&Command::new(p).args(["network", "rm", &names.internal_network]))?;
        removed.networks.push(names.internal_network.clone());
    }
    // Shared: removed only when no other project's proxy is attached (the engine refuses then).
    if succeeds(&exists(&names.external_network))?
        && succeeds(&Command::new(p).args(["network", "rm", &names.external_network]))?
    {
        removed.networks.push(names.external_network.clone());
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_detection_reads_the_program_headers() {
        // /bin/sh on any Linux host is dynamically linked.
        assert!(!is_static(Path::new("/bin/sh")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        fs::write(&f, b"#!/bin/sh\n").unwrap();
        assert!(is_static(&f).is_err());
    }

    #[test]
    fn the_lean_proxy_is_used_only_when_it_is_there_and_linked_like_corral() {
        let dir = tempfile::tempdir().unwrap();
        let corral = dir.path().join("corral");
        let lean = dir.path().join(PROXY_BIN_NAME);
        // Two dynamically linked executables (/bin/sh) stand in for the two binaries.
        fs::copy("/bin/sh", &corral).unwrap();
        assert_eq!(proxy_bin(&corral), None, "no corral-proxy next to corral");
        fs::copy("/bin/sh", &lean).unwrap();
        assert_eq!(proxy_bin(&corral), Some(lean.clone()));
        // ldconfig is statically linked on Debian: a static corral-proxy beside a dynamic corral
        // (or the other way round) is not used.
        let ldconfig = Path::new("/sbin/ldconfig");
        if is_static(ldconfig).unwrap_or(false) {
            fs::copy(ldconfig, &lean).unwrap();
            assert_eq!(proxy_bin(&corral), None, "linked differently");
            fs::copy(ldconfig, &corral).unwrap();
            assert_eq!(proxy_bin(&corral), Some(lean));
        } else {
            eprintln!("skipping the static half: /sbin/ldconfig is not a static executable here");
        }
    }
}
