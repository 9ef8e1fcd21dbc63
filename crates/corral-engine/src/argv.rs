//! Plan -> engine command lines. Pure: everything this module needs about the host is in
//! [`Context`], so tests compare whole argvs for podman and docker.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use corral_policy::plan::{
    Access, Enforce, ExecutorTarget, MountKind, NetworkMode, Plan, system_mounts,
};

use crate::names::{EXECUTOR_PORT, Names, PROXY_ALIAS, PROXY_PORT};
use crate::{Command, EngineError, EngineKind, Result, proxy_policy};

/// Where the corral binary is mounted in every container corral starts.
pub const CONTAINER_BIN: &str = "/usr/local/bin/corral";
/// Where the lean proxy executable (`corral-proxy`) is mounted in the proxy container.
pub const CONTAINER_PROXY_BIN: &str = "/usr/local/bin/corral-proxy";
/// Where the proxy container sees the project's audit directory.
pub const CONTAINER_AUDIT_DIR: &str = "/var/log/corral";
/// The audit log file as the proxy and executor containers see it (`--audit-log`).
pub const CONTAINER_AUDIT_LOG: &str = "/var/log/corral/audit.jsonl";
/// Seconds the engine waits after SIGTERM before SIGKILL (seed 003's `--stop-timeout 5`).
pub const STOP_TIMEOUT: u32 = 5;
/// The proxy container's own limits (seed 003's squid container).
pub const PROXY_CPUS: &str = "1";
pub const PROXY_MEMORY: &str = "512m";
pub const PROXY_PIDS: &str = "64";
/// The user the proxy runs as when the caller is root: `nobody`.
pub const PROXY_FALLBACK_USER: &str = "65534:65534";
/// Stands in a harness argv (podman) for the proxy container's address on the internal
/// network, known once the proxy runs; the runner puts it in ([`crate::runner`]), `corral plan`
/// prints the engine command that finds it.
pub const PROXY_ADDRESS: &str = "{proxy-address}";
/// Likewise for the compose executor's address on the internal network.
pub const EXECUTOR_ADDRESS: &str = "{executor-address}";
/// The resolver a podman harness is given: its own loopback, where nothing answers, so a name
/// lookup fails at once instead of waiting on a server the internal network cannot reach.
pub const NO_RESOLVER: &str = "127.0.0.1";
/// Where a run's gateway proxy container sees its gateway directory ([`Context::gateway_dir`]):
/// it writes the jail's CA files under `trust/` and the jail's side in `jail.json` there. The
/// harness binds `trust/` read-only at the same path, so the CA variables name the same files.
pub const CONTAINER_GATEWAY_DIR: &str = "/run/corral-gateway";
/// Where the gateway proxy container reads the real values (a file bound read-only into that
/// container only).
pub const CONTAINER_SECRETS_FILE: &str = "/run/corral-secrets.json";
/// Where the gateway proxy container reads the extra CA that verifies the real hosts
/// ([`Context::upstream_ca`]), as its `SSL_CERT_FILE`.
pub const CONTAINER_UPSTREAM_CA: &str = "/run/corral-upstream-ca.pem";

/// What the argv depends on besides the Plan: the engine, this host, this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub engine: EngineKind,
    /// The engine runs without root (rootless podman): the caller's uid is kept with
    /// `--userns keep-id`. Otherwise (rootful podman, docker) with `--user UID:GID`.
    pub rootless: bool,
    /// Prefix of every object name (default `corral`; tests use a unique one).
    pub prefix: String,
    /// The corral binary on the host, mounted read-only into the proxy and harness containers.
    /// Statically linked, so any image runs it.
    pub corral_bin: PathBuf,
    /// The lean proxy executable (`corral-proxy`, built with corral), when it is there: the
    /// proxy container runs it instead of `corral proxy` (the same proxy in a smaller process).
    /// `None`: the proxy container runs `corral proxy` from `corral_bin`.
    pub proxy_bin: Option<PathBuf>,
    /// Host directory of this project's engine files (proxy policy, the masking file).
    pub state_dir: PathBuf,
    /// Host directory of this project's audit log, shared with the proxy container.
    pub audit_dir: PathBuf,
    pub jail_id: String,
    /// What the harness container's stdin, stdout and stderr are ([`Stdio::for_ends`]).
    pub stdio: Stdio,
    /// Image the proxy container runs (the binary is mounted, so any image with a root
    /// filesystem will do); `None`: the harness image.
    pub proxy_image: Option<String>,
    /// Memory/cpu/pids limits really take effect with this engine here (rootless podman on
    /// cgroup v1 ignores them with a warning).
    pub limits_enforceable: bool,
    /// Host directory holding SKILL.md for `plan.skill`, mounted read-only at its dir.
    pub skill_source: Option<PathBuf>,
    /// CA certificates (PEM) the gateway trusts for the real hosts instead of the proxy
    /// image's system store: corral's own `SSL_CERT_FILE` (a corporate CA), as the native
    /// gateway honours it. Used only by runs with `[secrets]`.
    pub upstream_ca: Option<PathBuf>,
    /// Each served sign-in's credential file with symlinks resolved, by sign-in name, where
    /// that differs from the plan's path: a bind whose source names the real location would
    /// show the file there too, so the placeholder covers it there as well.
    pub signin_real: BTreeMap<String, PathBuf>,
}

impl Context {
    pub fn names(&self, plan: &Plan) -> Names {
        Names::new(&self.prefix, &plan.project.root)
    }

    pub fn harness_container(&self, plan: &Plan) -> String {
        self.names(plan)
            .harness_container(&self.prefix, &self.jail_id)
    }

    /// The empty, mode-000 file bound over masked files.
    pub fn masked_file(&self) -> PathBuf {
        self.state_dir.join("masked")
    }

    /// The empty read-only file bound where a policy file does not exist, so the jail cannot
    /// create one.
    pub fn empty_file(&self) -> PathBuf {
        self.state_dir.join("empty")
    }

    /// corral's seccomp filter as an OCI profile, given to the harness and proxy containers.
    pub fn seccomp_file(&self) -> PathBuf {
        self.state_dir.join("seccomp.json")
    }

    /// The profile of a harness container whose command the name gate starts
    /// (`corral_sandbox::seccomp::oci_profile_gated`: the gate installs the whole filter on
    /// the command itself).
    pub fn seccomp_gated_file(&self) -> PathBuf {
        self.state_dir.join("seccomp-gated.json")
    }

    /// The proxy's policy directory on the host.
    pub fn proxy_dir(&self) -> PathBuf {
        self.state_dir.join("proxy")
    }

    /// This run's gateway directory on the host (`[secrets]`): the real values' file until the
    /// gateway proxy has read it, and what the gateway writes for the jail (mode 0700, owned
    /// by the proxy's user; removed when the run ends).
    pub fn gateway_dir(&self) -> PathBuf {
        self.state_dir.join("gateway").join(&self.jail_id)
    }

    /// The file holding the real values, bound read-only into the gateway proxy only.
    pub fn secrets_file(&self) -> PathBuf {
        self.gateway_dir().join("secrets.json")
    }

    /// The gateway's output directory, bound writable into the gateway proxy only.
    pub fn gateway_out_dir(&self) -> PathBuf {
        self.gateway_dir().join("out")
    }

    /// This run's placeholder sign-in files on the host (mode 0700, the caller's; removed when
    /// the run ends): each bound read-write over its credential file in the harness.
    pub fn signin_dir(&self) -> PathBuf {
        self.state_dir.join("signin").join(&self.jail_id)
    }

    /// Sign-in `name`'s placeholder file in [`Context::signin_dir`].
    pub fn signin_placeholder(&self, name: &str) -> PathBuf {
        self.signin_dir().join(format!("{name}.json"))
    }

    /// The socket on which corral serves the user's sign-in files to the gateway proxy (in its
    /// gateway directory, which only that container has).
    pub fn signin_socket(&self) -> PathBuf {
        self.gateway_out_dir()
            .join(corral_net::standalone::GATEWAY_SIGNIN_SOCKET)
    }

    /// This run's gateway proxy container (runs with `[secrets]` get a proxy of their own: the
    /// run CA and the real values live in one run's process, never in the project's shared
    /// proxy).
    pub fn gateway_container(&self, plan: &Plan) -> String {
        format!("{}-gateway", self.harness_container(plan))
    }

    /// The gateway proxy's alias on the internal network, unique to the run (a DNS label).
    pub fn gateway_alias(&self) -> String {
        format!("{PROXY_ALIAS}-{}", self.jail_id)
    }

    /// Whether this plan's proxy is the run's own gateway proxy: `[secrets]` or sign-ins (the
    /// plan's `signin` holds the served ones only: the caller drops those whose file does not
    /// exist) with the proxy.
    pub fn has_gateway(plan: &Plan) -> bool {
        (!plan.secrets.is_empty() || !plan.signin.is_empty())
            && plan.network.mode == NetworkMode::Proxy
    }

    /// The container the harness sends its traffic to, and the name it knows it by.
    pub fn proxy_for(&self, plan: &Plan) -> (String, String) {
        if Self::has_gateway(plan) {
            (self.gateway_container(plan), self.gateway_alias())
        } else {
            (self.names(plan).proxy_container, PROXY_ALIAS.to_string())
        }
    }
}

/// One step of bringing a jail up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Run `create` unless `check` succeeds (the object exists and is reused).
    Ensure {
        what: String,
        check: Command,
        create: Vec<Command>,
    },
    /// The harness container, in the foreground; its exit code is the run's.
    Run(Command),
}

/// Everything one run executes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    pub steps: Vec<Step>,
}

impl Setup {
    /// The harness command (the last step).
    pub fn run_command(&self) -> Option<&Command> {
        self.steps.iter().rev().find_map(|s| match s {
            Step::Run(c) => Some(c),
            Step::Ensure { .. } => None,
        })
    }
}

/// The commands of a plan as the shell would read them: `check || create` for objects that
/// are reused, then the harness run. This is what `corral plan --engine podman` prints.
pub fn commands(setup: &Setup) -> String {
    let mut out = String::new();
    for step in &setup.steps {
        match step {
            Step::Ensure {
                what,
                check,
                create,
            } => {
                out.push_str(&format!(
                    "# {what}: created unless it exists, then reused\n"
                ));
                let create: Vec<String> = create.iter().map(|c| c.to_string()).collect();
                out.push_str(&format!(
                    "{check} >/dev/null 2>&1 || {{ {}; }}\n",
                    create.join("; ")
                ));
            }
            Step::Run(cmd) => {
                out.push_str("# the harness container\n");
                out.push_str(&cmd.to_string());
                out.push('\n');
                if cmd.args.iter().any(|a| a.contains(PROXY_ADDRESS)) {
                    out.push_str(&format!(
                        "# where {PROXY_ADDRESS} is the proxy container's address on the internal network and \
                         {EXECUTOR_ADDRESS} the compose executor's (the internal network has no DNS)\n"
                    ));
                }
                if cmd.args.iter().any(|a| a.contains(CONTAINER_GATEWAY_DIR)) {
                    out.push_str(
                        "# and, once this run's gateway proxy has started, what it wrote: each secret's \
                         placeholder and the CA variables (--env NAME), the CA bundle bound over the image's \
                         system bundles\n",
                    );
                }
                if !cmd.env.is_empty() {
                    out.push_str("# with these variables passed by name (--env NAME):\n");
                    for (k, v) in &cmd.env {
                        out.push_str(&format!("#   {k}={}\n", crate::shell_quote(v)));
                    }
                }
            }
        }
    }
    out
}

/// The whole sequence for a plan.
pub fn setup(plan: &Plan, ctx: &Context) -> Result<Setup> {
    check_supported(plan, ctx)?;
    let names = ctx.names(plan);
    let mut steps = Vec::new();
    if plan.network.mode == NetworkMode::Proxy {
        steps.extend(network_steps(ctx, &names));
        let (container, _) = ctx.proxy_for(plan);
        let what = if Context::has_gateway(plan) {
            format!("gateway proxy container {container} (this run's [secrets] and sign-ins only)")
        } else {
            format!("proxy container {container}")
        };
        steps.push(Step::Ensure {
            what,
            check: exists(ctx.engine, "container", &container),
            create: proxy_create(plan, ctx, &names)?,
        });
    }
    steps.push(Step::Run(harness_run(plan, ctx, &names)?));
    Ok(Setup { steps })
}

/// What the container backend cannot do yet: refused, never silently dropped.
fn check_supported(plan: &Plan, ctx: &Context) -> Result<()> {
    let unsupported = |what: &str| {
        Err(EngineError::Unsupported {
            engine: ctx.engine,
            what: what.to_string(),
        })
    };
    if !plan.secrets.is_empty() && plan.network.mode == NetworkMode::Host {
        // As the native backend: with the host's network the gateway cannot put the real value
        // into requests.
        return unsupported("[secrets] with network.mode = \"host\" (use --network proxy)");
    }
    if let Some(s) = plan.signin.first()
        && plan.network.mode == NetworkMode::Host
    {
        // With the host's network nothing can swap the placeholders: the harness would need
        // the real tokens.
        return unsupported(&format!(
            "signin.{} ({}) with network.mode = \"host\" (use --network proxy)",
            s.name,
            s.file.display()
        ));
    }
    if plan.network.mode == NetworkMode::Proxy && !plan.network.allow_paths.is_empty() {
        // The engines' proxies have no run CA to decide each request with: never drop the
        // rules (the host would stay closed, or be opened whole).
        return unsupported("network.allow rules by method and path (native backend only)");
    }
    if plan.network.dns != corral_policy::plan::Dns::None {
        return unsupported("network.dns = \"stub\"");
    }
    if plan.command.is_empty() {
        return Err(EngineError::NoCommand);
    }
    Ok(())
}

fn exists(engine: EngineKind, kind: &str, name: &str) -> Command {
    match engine {
        EngineKind::Podman => Command::new("podman").args([kind, "exists", name]),
        EngineKind::Docker => {
            Command::new("docker").args([kind, "inspect", "--format", "{{.Name}}", name])
        }
    }
}

/// The per-project internal network and the shared external one. podman's internal network
/// has no DNS server (`--disable-dns`): aardvark-dns runs in the host's network namespace and
/// forwards names it does not know to the host's resolvers, a way out for a harness that has
/// no route out (names reach the harness through `--add-host` instead). docker's embedded
/// resolver cannot be turned off; on an internal network it answers the names of the network's
/// containers and forwards nothing (there is no route to a resolver). docker gives an internal
/// network's bridge an address on the host and its containers a default route to it, so a
/// harness reached every host service listening on all addresses (the bridge's, docker0's, the
/// host's own); without an address on the bridge (`inhibit_ipv4`) that route leads nowhere.
/// podman's internal bridge has no such route.
fn network_steps(ctx: &Context, names: &Names) -> Vec<Step> {
    let p = ctx.engine.program();
    let mut internal = vec!["network", "create", "--internal"];
    match ctx.engine {
        EngineKind::Podman => internal.push("--disable-dns"),
        EngineKind::Docker => {
            internal.extend(["--opt", "com.docker.network.bridge.inhibit_ipv4=true"])
        }
    }
    let label = names.label();
    internal.extend(["--label", &label, &names.internal_network]);
    vec![
        Step::Ensure {
            what: format!("internal network {}", names.internal_network),
            check: exists(ctx.engine, "network", &names.internal_network),
            create: vec![Command::new(p).args(internal)],
        },
        Step::Ensure {
            what: format!("external network {}", names.external_network),
            check: exists(ctx.engine, "network", &names.external_network),
            create: vec![Command::new(p).args([
                "network",
                "create",
                "--label",
                "corral.role=external",
                &names.external_network,
            ])],
        },
    ]
}

/// The options every container corral starts carries: a read-only root with private tmpfs
/// scratch space, no capabilities, no new privileges, and corral's seccomp filter (the native
/// jail's rules as an OCI profile, [`Context::seccomp_file`]) instead of the engine's default.
pub(crate) fn hardening(ctx: &Context) -> Vec<String> {
    hardening_with(ctx, &ctx.seccomp_file())
}

/// [`hardening`] with the seccomp profile `seccomp`.
fn hardening_with(ctx: &Context, seccomp: &Path) -> Vec<String> {
    let mut a: Vec<String> = vec!["--read-only".into()];
    match ctx.engine {
        EngineKind::Podman => a.push("--read-only-tmpfs".into()),
        // docker has no --read-only-tmpfs: the same three tmpfs podman mounts.
        EngineKind::Docker => {
            for (dir, mode) in [("/tmp", "1777"), ("/var/tmp", "1777"), ("/run", "0755")] {
                a.push("--tmpfs".into());
                a.push(format!("{dir}:rw,nosuid,nodev,mode={mode}"));
            }
        }
    }
    a.extend(
        ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
            .into_iter()
            .map(String::from),
    );
    a.push("--security-opt".into());
    a.push(format!("seccomp={}", seccomp.display()));
    a
}

/// How a container keeps the caller's identity.
pub(crate) fn user_args(ctx: &Context, uid: u32, gid: u32) -> Vec<String> {
    match (ctx.engine, ctx.rootless) {
        (EngineKind::Podman, true) => vec!["--userns".into(), "keep-id".into()],
        _ => vec!["--user".into(), format!("{uid}:{gid}")],
    }
}

/// `SRC:DST:OPTS` for `--volume`, refusing paths the syntax cannot carry.
pub(crate) fn volume(engine: EngineKind, src: &Path, dst: &Path, access: Access) -> Result<String> {
    for p in [src, dst] {
        let s = p.to_string_lossy();
        if let Some(ch) = s.chars().find(|c| *c == ':' || *c == ',') {
            return Err(EngineError::BadPath {
                engine,
                path: p.to_path_buf(),
                ch,
            });
        }
    }
    let access = match access {
        Access::Ro => "ro",
        Access::Rw => "rw",
    };
    // podman: `z` relabels for SELinux (shared between containers, as seed 003 does); a no-op
    // where SELinux is off. docker relabels only on request too, but its rootful daemon usually
    // runs without SELinux enforcement of binds; keep its argv plain.
    let opts = match engine {
        EngineKind::Podman => format!("{access},z"),
        EngineKind::Docker => access.to_string(),
    };
    Ok(format!("{}:{}:{opts}", src.display(), dst.display()))
}

/// A harness state directory as podman's overlay volume (`HOST:DST:O,upperdir=U,workdir=W`):
/// the host's directory read-only below, corral's layer above. docker has no overlay volume
/// (the plan gives it corral's copy instead), and a plan with more than one layer above the
/// host's is the native backend's only: both are refused rather than bound read-write.
fn overlay_volume(
    engine: EngineKind,
    m: &corral_policy::plan::Mount,
    upper: &Path,
    work: &Path,
    above: &[PathBuf],
) -> Result<String> {
    if engine == EngineKind::Docker || !above.is_empty() {
        return Err(EngineError::Unsupported {
            engine,
            what: format!(
                "an overlay of the harness state {} (build the plan with --engine {engine}, which \
                 gives docker corral's copy of the state)",
                m.target.display()
            ),
        });
    }
    for p in [&m.source, &m.target, upper, work] {
        let s = p.to_string_lossy();
        if let Some(ch) = s.chars().find(|c| *c == ':' || *c == ',') {
            return Err(EngineError::BadPath {
                engine,
                path: p.to_path_buf(),
                ch,
            });
        }
    }
    Ok(format!(
        "{}:{}:O,upperdir={},workdir={}",
        m.source.display(),
        m.target.display(),
        upper.display(),
        work.display()
    ))
}

fn limit_args(plan: &Plan, ctx: &Context) -> Result<Vec<String>> {
    let l = &plan.limits;
    let mut a = Vec::new();
    if let Some(m) = l.memory {
        a.push("--memory".into());
        a.push(corral_policy::config::size_text(m));
    }
    if let Some(c) = l.cpus {
        a.push("--cpus".into());
        a.push(format!("{c}"));
    }
    if let Some(p) = l.pids {
        a.push("--pids-limit".into());
        a.push(p.to_string());
    }
    if !a.is_empty() && !ctx.limits_enforceable {
        // corral's own built-in defaults never stop a run (`Limits::built_in`); only limits
        // someone set follow `enforce`.
        let b = l.built_in;
        let set = (l.memory.is_some() && !b.memory)
            || (l.cpus.is_some() && !b.cpus)
            || (l.pids.is_some() && !b.pids);
        match l.enforce {
            Enforce::Strict if set => {
                return Err(EngineError::Unsupported {
                    engine: ctx.engine,
                    what: "[limits] here (rootless podman on cgroup v1 ignores resource limits; \
                           use cgroup v2 with delegation, rootful podman, or limits.enforce = \"best-effort\")"
                        .into(),
                });
            }
            Enforce::Strict | Enforce::BestEffort => return Ok(Vec::new()),
        }
    }
    Ok(a)
}

/// The proxy container: on the internal network as `proxy` and on the external one, running
/// the mounted static `corral-proxy` (else `corral proxy` from the mounted static corral) with
/// the plan's rules.
///
/// A run with `[secrets]` gets its own such container ([`Context::gateway_container`], alias
/// [`Context::gateway_alias`]) that also serves the credential gateway: the real values' file
/// bound read-only into it alone, its gateway directory writable, `--secrets` and
/// `--gateway-dir`.
fn proxy_create(plan: &Plan, ctx: &Context, names: &Names) -> Result<Vec<Command>> {
    let e = ctx.engine;
    let gateway = Context::has_gateway(plan);
    let (container, alias) = ctx.proxy_for(plan);
    let image = ctx
        .proxy_image
        .clone()
        .unwrap_or_else(|| harness_image(plan));
    let mut a: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        "--name".into(),
        container.clone(),
        "--label".into(),
        names.label(),
        "--label".into(),
    ];
    if gateway {
        a.extend([
            "corral.role=gateway".into(),
            "--label".into(),
            format!("corral.jail={}", ctx.jail_id),
        ]);
    } else {
        a.push("corral.role=proxy".into());
    }
    a.extend(["--pull".into(), "never".into(), "--init".into()]);
    a.extend(hardening(ctx));
    // Its own non-root user: the caller's (so the audit lines it writes are the caller's), or
    // nobody when the caller is root.
    if plan.uid == 0 {
        a.extend(["--user".into(), PROXY_FALLBACK_USER.into()]);
    } else {
        a.extend(user_args(ctx, plan.uid, plan.gid));
    }
    a.extend(
        [
            "--cpus",
            PROXY_CPUS,
            "--memory",
            PROXY_MEMORY,
            "--pids-limit",
            PROXY_PIDS,
            "--stop-timeout",
        ]
        .into_iter()
        .map(String::from),
    );
    a.push(STOP_TIMEOUT.to_string());
    a.extend(proxy_networks(e, names, &alias));
    // The lean proxy executable when there is one; `corral proxy` otherwise.
    let (bin, container_bin, subcommand) = match &ctx.proxy_bin {
        Some(p) => (p, CONTAINER_PROXY_BIN, None),
        None => (&ctx.corral_bin, CONTAINER_BIN, Some("proxy")),
    };
    a.push("--volume".into());
    a.push(volume(e, bin, Path::new(container_bin), Access::Ro)?);
    a.push("--volume".into());
    a.push(volume(
        e,
        &ctx.proxy_dir(),
        Path::new(proxy_policy::CONTAINER_DIR),
        Access::Ro,
    )?);
    a.push("--volume".into());
    a.push(volume(
        e,
        &ctx.audit_dir,
        Path::new(CONTAINER_AUDIT_DIR),
        Access::Rw,
    )?);
    let mut env = BTreeMap::new();
    if gateway {
        a.extend(gateway_volumes(ctx, &mut env)?);
    }
    a.extend(["--entrypoint".into(), container_bin.into(), image]);
    a.extend(subcommand.map(String::from));
    a.extend([
        "--listen".into(),
        format!("0.0.0.0:{PROXY_PORT}"),
        "--policy".into(),
        proxy_policy::CONTAINER_FILE.into(),
        "--audit-log".into(),
        CONTAINER_AUDIT_LOG.into(),
    ]);
    if gateway {
        a.extend([
            "--jail".into(),
            ctx.jail_id.clone(),
            "--secrets".into(),
            CONTAINER_SECRETS_FILE.into(),
            "--gateway-dir".into(),
            CONTAINER_GATEWAY_DIR.into(),
        ]);
    }
    let mut run = Command::new(e.program()).args(a);
    run.env = env;
    let mut cmds = vec![run];
    if e == EngineKind::Docker {
        cmds.push(Command::new("docker").args([
            "network",
            "connect",
            &names.external_network,
            &container,
        ]));
    }
    Ok(cmds)
}

/// The proxy's networks: the internal one under `alias`, and the external one (docker attaches
/// one network at run time; the external one is connected by a second command).
fn proxy_networks(e: EngineKind, names: &Names, alias: &str) -> Vec<String> {
    match e {
        EngineKind::Podman => vec![
            "--network".into(),
            format!("{}:alias={alias}", names.internal_network),
            "--network".into(),
            names.external_network.clone(),
        ],
        EngineKind::Docker => vec![
            "--network".into(),
            names.internal_network.clone(),
            "--network-alias".into(),
            alias.to_string(),
        ],
    }
}

/// The gateway proxy's own binds: the real values (read-only, this container only), its
/// gateway directory (writable), and the extra upstream CA as its `SSL_CERT_FILE`.
fn gateway_volumes(ctx: &Context, env: &mut BTreeMap<String, String>) -> Result<Vec<String>> {
    let e = ctx.engine;
    let mut a = vec![
        "--volume".into(),
        volume(
            e,
            &ctx.secrets_file(),
            Path::new(CONTAINER_SECRETS_FILE),
            Access::Ro,
        )?,
        "--volume".into(),
        volume(
            e,
            &ctx.gateway_out_dir(),
            Path::new(CONTAINER_GATEWAY_DIR),
            Access::Rw,
        )?,
    ];
    if let Some(ca) = &ctx.upstream_ca {
        a.push("--volume".into());
        a.push(volume(e, ca, Path::new(CONTAINER_UPSTREAM_CA), Access::Ro)?);
        a.extend(["--env".into(), "SSL_CERT_FILE".into()]);
        env.insert("SSL_CERT_FILE".into(), CONTAINER_UPSTREAM_CA.into());
    }
    Ok(a)
}

/// The gateway's trust directory (CA certificate and bundle) as the proxy and harness see it.
pub fn container_trust_dir() -> PathBuf {
    Path::new(CONTAINER_GATEWAY_DIR).join(corral_net::standalone::GATEWAY_TRUST_DIR)
}

/// The harness image: the plan's, else the profile's default tag.
pub fn harness_image(plan: &Plan) -> String {
    plan.image
        .clone()
        .unwrap_or_else(|| crate::image::default_tag(&plan.profile))
}

/// The proxy variables a harness gets, pointing at the proxy container.
pub fn proxy_env(no_proxy: &str) -> BTreeMap<String, String> {
    proxy_env_at(PROXY_ALIAS, no_proxy)
}

/// The proxy variables pointing at the proxy known as `host`.
pub fn proxy_env_at(host: &str, no_proxy: &str) -> BTreeMap<String, String> {
    let url = format!("http://{host}:{PROXY_PORT}");
    let mut env = BTreeMap::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.insert(name.to_string(), url.clone());
        env.insert(name.to_ascii_lowercase(), url.clone());
    }
    env.insert("NO_PROXY".into(), no_proxy.to_string());
    env.insert("no_proxy".into(), no_proxy.to_string());
    env.insert("NODE_USE_ENV_PROXY".into(), "1".into());
    env
}

/// The harness container's stdio. The engines give a container one terminal for all of
/// stdin, stdout and stderr (`--tty`) or none, so the native rule (each end that is a terminal
/// outside is one inside) is followed as far as that allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// `--interactive --tty`: stdin and stdout are the user's terminal (stderr goes to the
    /// container's terminal too, even when redirected outside).
    Terminal,
    /// `--interactive`: corral's stdin (a pipe or a file) is the container's; its output is
    /// not a terminal.
    Piped,
    /// Neither: stdin is a terminal but stdout is not (`corral run ... > out.md`). A terminal
    /// would put CR/LF and the terminal's echo into the file, and a terminal's bytes handed over
    /// as a pipe would keep a harness that reads piped input waiting for its end: the
    /// container's stdin is empty.
    Closed,
}

impl Stdio {
    /// For corral's stdin and stdout being terminals.
    pub fn for_ends(stdin_tty: bool, stdout_tty: bool) -> Stdio {
        match (stdin_tty, stdout_tty) {
            (true, true) => Stdio::Terminal,
            (true, false) => Stdio::Closed,
            (false, _) => Stdio::Piped,
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Stdio::Terminal => &["--interactive", "--tty"],
            Stdio::Piped => &["--interactive"],
            Stdio::Closed => &[],
        }
    }
}

/// The harness container.
fn harness_run(plan: &Plan, ctx: &Context, names: &Names) -> Result<Command> {
    let e = ctx.engine;
    let mut a: Vec<String> = vec![
        "run".into(),
        "--rm".into(),
        "--name".into(),
        ctx.harness_container(plan),
        "--label".into(),
        names.label(),
        "--label".into(),
        format!("corral.jail={}", ctx.jail_id),
        "--pull".into(),
        "never".into(),
    ];
    a.extend(ctx.stdio.args().iter().map(|s| s.to_string()));
    // The name gate (corral_sandbox gatexec.rs) is PID 1 and starts the command, unless the
    // user lets the jail create repositories: no git repository appears where the host's git
    // finds it. It reaps and passes signals on as an init does; without it, a small init is
    // PID 1 (podman: catatonit, docker: tini), which a harness running as PID 1 would not be.
    // Never both: an engine init is a process of the jail's uid outside the command's filters.
    let gated = !plan.git.new_repositories;
    // Said either way: an engine configured to add its init by default must not.
    a.push(if gated { "--init=false" } else { "--init" }.into());
    a.extend(match gated {
        true => hardening_with(ctx, &ctx.seccomp_gated_file()),
        false => hardening(ctx),
    });
    a.extend(user_args(ctx, plan.uid, plan.gid));
    a.push("--network".into());
    a.push(match plan.network.mode {
        NetworkMode::None => "none".into(),
        NetworkMode::Proxy => names.internal_network.clone(),
        NetworkMode::Host => "host".into(),
    });
    let (_, proxy_host) = ctx.proxy_for(plan);
    if plan.network.mode == NetworkMode::Proxy && e == EngineKind::Podman {
        a.extend(["--dns".into(), NO_RESOLVER.into()]);
        a.extend(["--add-host".into(), format!("{proxy_host}:{PROXY_ADDRESS}")]);
        if matches!(plan.executor.target, ExecutorTarget::Compose(_)) {
            a.extend([
                "--add-host".into(),
                format!("{}:{EXECUTOR_ADDRESS}", names.executor_alias),
            ]);
        }
    }
    a.extend(limit_args(plan, ctx)?);
    a.extend(["--stop-timeout".into(), STOP_TIMEOUT.to_string()]);
    a.extend(["--workdir".into(), plan.cwd.display().to_string()]);
    a.extend(mount_args(plan, ctx)?);
    a.extend(signin_args(plan, ctx)?);
    if Context::has_gateway(plan) {
        // The run CA's certificate and bundle (never the key), written by the gateway proxy.
        let trust = container_trust_dir();
        a.push("--volume".into());
        a.push(volume(
            e,
            &ctx.gateway_out_dir()
                .join(corral_net::standalone::GATEWAY_TRUST_DIR),
            &trust,
            Access::Ro,
        )?);
    }

    // The environment: exactly the plan's, with the proxy variables pointing at the proxy
    // container and the executor at its compose alias. Values travel in the engine's own
    // environment, never in its argv.
    let mut env: BTreeMap<String, String> = plan
        .env
        .iter()
        .filter(|(k, _)| !k.starts_with("CORRAL_EXECUTOR"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let executor = match &plan.executor.target {
        ExecutorTarget::Compose(_) => Some(names.executor_alias.clone()),
        ExecutorTarget::Sandbox | ExecutorTarget::Host => None,
    };
    if plan.network.mode == NetworkMode::Proxy {
        let mut no_proxy = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        no_proxy.extend(executor.clone());
        env.extend(proxy_env_at(&proxy_host, &no_proxy.join(",")));
    }
    if let Some(alias) = &executor {
        env.insert(
            "CORRAL_EXECUTOR".into(),
            format!("http://{alias}:{EXECUTOR_PORT}"),
        );
    }
    for name in env.keys() {
        a.push("--env".into());
        a.push(name.clone());
    }
    // Gated, the program follows the gate's arguments (which list the volumes above).
    let gate = gated.then(|| gate_args(plan, &a));
    let entrypoint = match gate {
        Some(_) => CONTAINER_BIN.into(),
        None => container_program(plan),
    };
    a.extend(["--entrypoint".into(), entrypoint, harness_image(plan)]);
    if let Some(gate) = gate {
        a.extend(gate);
        a.push(container_program(plan));
    }
    a.extend(plan.command[1..].iter().cloned());
    let mut cmd = Command::new(e.program()).args(a);
    cmd.env = env;
    Ok(cmd)
}

/// The name gate's arguments before the command: the run's git directories, and where the
/// host's file systems are (every `--volume` of `run`, the container's options so far,
/// read-only ones too: a host mount nested in one is writable where the engine binds
/// recursively and read-only only on top), ending with `--`.
fn gate_args(plan: &Plan, run: &[String]) -> Vec<String> {
    let mut targets = BTreeSet::new();
    for pair in run.windows(2) {
        if pair[0] == "--volume" {
            // SRC:DST:OPTS, with no `:` in either path (`volume` refuses them).
            if let Some(dst) = pair[1].split(':').nth(1) {
                targets.insert(dst.to_string());
            }
        }
    }
    gate_command(&[], plan, targets)
}

/// `__corral-gate-exec --init [FLAGS] --git-dir D... [--project ROOT --hide PATTERN...]
/// --host-path P... --`: the name gate's arguments before a container's command
/// (corral_sandbox `gatexec.rs`; `--init`: it must be the container's PID 1): the run's git
/// directories, and the `filesystem.hide` patterns refused as new names in the project (which
/// a container sees at its own path).
pub(crate) fn gate_command(
    flags: &[&str],
    plan: &Plan,
    host_paths: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut a = vec![corral_sandbox::GATE_EXEC_ARG.to_string(), "--init".into()];
    a.extend(flags.iter().map(|f| f.to_string()));
    for d in &plan.git.dirs {
        a.extend(["--git-dir".into(), d.display().to_string()]);
    }
    if !plan.hide.is_empty() {
        a.extend(["--project".into(), plan.project.root.display().to_string()]);
        for pattern in &plan.hide {
            a.extend(["--hide".into(), pattern.clone()]);
        }
    }
    for p in host_paths {
        a.extend(["--host-path".into(), p]);
    }
    a.push("--".into());
    a
}

/// Every path at which the harness container would see sign-in `s`'s credential file: its own
/// path, and wherever a bind of one of its parent directories (by the plan's path or the
/// resolved one, [`Context::signin_real`]) puts it. The placeholder is bound at each.
pub fn signin_targets(
    plan: &Plan,
    ctx: &Context,
    s: &corral_policy::signin::SigninPlan,
) -> Vec<PathBuf> {
    let system: BTreeSet<PathBuf> = system_mounts().into_iter().map(|m| m.target).collect();
    let mut files = vec![s.file.clone()];
    files.extend(ctx.signin_real.get(&s.name).cloned());
    let mut out = vec![s.file.clone()];
    let binds = plan.mounts.iter().filter_map(|m| match m.kind {
        MountKind::Bind(_) if !(system.contains(&m.target) && m.source == m.target) => {
            Some((&m.source, &m.target))
        }
        // A state directory's overlay holds the host's credential file below corral's layer.
        MountKind::Overlay { .. } => Some((&m.source, &m.target)),
        MountKind::Bind(_) | MountKind::Tmpfs => None,
    });
    let protected = plan.protected.iter().map(|p| (p, p));
    for (source, target) in binds.chain(protected) {
        for f in &files {
            if let Ok(rel) = f.strip_prefix(source) {
                out.push(if rel.as_os_str().is_empty() {
                    target.clone()
                } else {
                    target.join(rel)
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Each served sign-in's placeholder file, bound read-write at every path where the harness
/// would otherwise see the user's credential file ([`signin_targets`]); after the plan's binds,
/// so it lies over the state directory's.
fn signin_args(plan: &Plan, ctx: &Context) -> Result<Vec<String>> {
    let mut a = Vec::new();
    for s in &plan.signin {
        let source = ctx.signin_placeholder(&s.name);
        for target in signin_targets(plan, ctx, s) {
            a.push("--volume".into());
            a.push(volume(ctx.engine, &source, &target, Access::Rw)?);
        }
    }
    Ok(a)
}

/// The program the container runs. The plan resolved it on the host's PATH; a path under the
/// system directories names the host's layout, not the image's (`/usr/bin/pi` on the host is
/// `/usr/local/bin/pi` in a node image), so such a program is looked up on the image's PATH by
/// name. A program the plan binds in (a harness under a user prefix) keeps its path.
pub fn container_program(plan: &Plan) -> String {
    let program = Path::new(&plan.command[0]);
    if !program.is_absolute() {
        return plan.command[0].clone();
    }
    let system: BTreeSet<PathBuf> = system_mounts().into_iter().map(|m| m.target).collect();
    let bound = plan.mounts.iter().any(|m| {
        matches!(m.kind, MountKind::Bind(_))
            && !system.contains(&m.target)
            && program.starts_with(&m.target)
    });
    match program.file_name() {
        Some(name) if !bound => name.to_string_lossy().into_owned(),
        _ => plan.command[0].clone(),
    }
}

/// The plan's filesystem as engine mounts. The system directories come from the image, not the
/// host; everything else the plan binds is bound, masked files are covered with an empty
/// unreadable file, protected paths are bound read-only over the project.
fn mount_args(plan: &Plan, ctx: &Context) -> Result<Vec<String>> {
    let e = ctx.engine;
    let system: BTreeSet<PathBuf> = system_mounts().into_iter().map(|m| m.target).collect();
    // A sign-in's placeholder takes the place of any bind of the credential file itself.
    let covered: BTreeSet<PathBuf> = plan
        .signin
        .iter()
        .flat_map(|s| signin_targets(plan, ctx, s))
        .collect();
    let mut a = Vec::new();
    for m in &plan.mounts {
        if covered.contains(&m.target) {
            continue;
        }
        match &m.kind {
            MountKind::Tmpfs => {
                // Owned by the jail's user: podman chowns with `U`; docker passes the kernel's
                // tmpfs uid/gid options through.
                let owner = match e {
                    EngineKind::Podman => "U".to_string(),
                    EngineKind::Docker => format!("uid={},gid={}", plan.uid, plan.gid),
                };
                a.push("--tmpfs".into());
                a.push(format!(
                    "{}:rw,nosuid,nodev,exec,mode=0700,{owner}",
                    m.target.display()
                ));
            }
            MountKind::Bind(access) => {
                if system.contains(&m.target) && m.source == m.target {
                    continue;
                }
                if m.optional && !m.source.exists() {
                    continue;
                }
                a.push("--volume".into());
                a.push(volume(e, &m.source, &m.target, *access)?);
            }
            MountKind::Overlay { upper, work, above } => {
                a.push("--volume".into());
                a.push(overlay_volume(e, m, upper, work, above)?);
            }
        }
    }
    for p in &plan.masked {
        if p.is_dir() {
            a.push("--tmpfs".into());
            a.push(format!("{}:ro,nosuid,nodev,noexec,mode=0000", p.display()));
        } else {
            a.push("--volume".into());
            a.push(volume(e, &ctx.masked_file(), p, Access::Ro)?);
        }
    }
    for p in &plan.protected {
        if p.exists() {
            a.push("--volume".into());
            a.push(volume(e, p, p, Access::Ro)?);
        } else if *p == plan.project.policy_file {
            // A policy file that does not exist yet must not be creatable from inside.
            a.push("--volume".into());
            a.push(volume(e, &ctx.empty_file(), p, Access::Ro)?);
        }
    }
    if let (Some(skill), Some(src)) = (&plan.skill, &ctx.skill_source) {
        a.push("--volume".into());
        a.push(volume(e, src, &skill.dir, Access::Ro)?);
    }
    a.push("--volume".into());
    a.push(volume(
        e,
        &ctx.corral_bin,
        Path::new(CONTAINER_BIN),
        Access::Ro,
    )?);
    Ok(a)
}

#[cfg(test)]
mod tests;
