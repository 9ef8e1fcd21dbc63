//! `corral run --engine podman|docker|auto`: the plan run by a container engine (SPEC section 4),
//! and the engine half of `corral plan --engine ...` and `corral init --compose`.

use std::path::PathBuf;

use crate::trust::Trusted;
use anyhow::{Context as _, bail};
use corral_engine::runner;
use corral_engine::{Context, EngineKind};
use corral_policy::plan::{Engine, Plan};
use corral_session::{Backend, Baselined, Ended, RunPlan, Scope, Session};

/// The container engine a plan asks for: podman or docker by name; `auto` (when the native
/// backend cannot run here) podman, else docker.
pub fn engine_of(plan: &Plan) -> anyhow::Result<EngineKind> {
    let kind = match plan.engine {
        Engine::Podman => EngineKind::Podman,
        Engine::Docker => EngineKind::Docker,
        Engine::Auto => runner::detect().context(
            "--engine auto: the native backend cannot run here and neither podman nor docker is \
             on PATH; install podman (apt-get install podman) or fix what `corral doctor` reports",
        )?,
        Engine::Native | Engine::Kube => {
            bail!("engine {:?} is not a container engine", plan.engine)
        }
    };
    if !runner::on_path(kind.program()) {
        bail!("--engine {kind}: `{kind}` is not on PATH; install it, or run with --engine native",);
    }
    Ok(kind)
}

/// The host context of a plan, with a warning when the binary mounted into containers is not
/// statically linked (it then runs only in images whose C library matches this host's).
pub fn context(kind: EngineKind, plan: &Plan, jail_id: &str) -> anyhow::Result<Context> {
    let ctx = runner::host_context(kind, plan, jail_id)?;
    match runner::is_static(&ctx.corral_bin) {
        Ok(true) => {}
        Ok(false) => eprintln!(
            "corral: {} is dynamically linked; containers run it (the harness container's \
             entrypoint is corral's name gate, the proxy container runs corral's proxy) only if \
             their image has a compatible C library. Build a static one (RUSTFLAGS='-C target-feature=+crt-static' \
             cargo build --release --target x86_64-unknown-linux-gnu) and point {} at it",
            ctx.corral_bin.display(),
            runner::BIN_ENV
        ),
        Err(e) => eprintln!("corral: cannot inspect {}: {e}", ctx.corral_bin.display()),
    }
    Ok(ctx)
}

/// The commands `corral plan --engine podman|docker` prints: exactly what `corral run` runs.
pub fn print_commands(plan: &Plan) -> anyhow::Result<String> {
    let kind = match plan.engine {
        Engine::Podman => EngineKind::Podman,
        Engine::Docker => EngineKind::Docker,
        Engine::Auto => runner::detect().unwrap_or(EngineKind::Podman),
        Engine::Native | Engine::Kube => {
            bail!("engine {:?} runs no container engine commands", plan.engine)
        }
    };
    // The sign-ins a run would serve: those whose file exists.
    let mut plan = plan.clone();
    plan.signin.retain(|s| s.file.is_file());
    let ctx = runner::host_context(kind, &plan, "JAILID")?;
    let setup = corral_engine::setup(&plan, &ctx)?;
    Ok(corral_engine::commands(&setup))
}

/// Run the harness command to its end. corral stays alive through the signals a terminal sends
/// its whole foreground group (SIGINT, SIGQUIT: the engine gets them too, and with `--tty` the
/// container's terminal does), so the run's exit is still audited; SIGTERM and SIGHUP sent to
/// corral alone are passed on to the engine, which stops the container.
fn wait_harness(cmd: &corral_engine::Command) -> std::io::Result<std::process::ExitStatus> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut int = signal(SignalKind::interrupt())?;
        let mut quit = signal(SignalKind::quit())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        let mut child = tokio::process::Command::from(cmd.to_std()).spawn()?;
        let pid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
        let forward = |sig: nix::sys::signal::Signal| {
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(pid, sig);
            }
        };
        loop {
            tokio::select! {
                status = child.wait() => return status,
                _ = int.recv() => {}
                _ = quit.recv() => {}
                _ = term.recv() => forward(nix::sys::signal::Signal::SIGTERM),
                _ = hup.recv() => forward(nix::sys::signal::Signal::SIGHUP),
            }
        }
    })
}

/// The plan's sign-ins whose credential file exists (the only ones a run serves), in the plan
/// the engine runs, and each one loaded: its real tokens and the jail's placeholder file.
fn served_signins(plan: &Plan) -> anyhow::Result<(Plan, Vec<corral_gateway::signin::Signin>)> {
    let signins = crate::signin::load(plan)?;
    let mut served = plan.clone();
    served.signin = signins.iter().map(|s| s.plan().clone()).collect();
    Ok((served, signins))
}

/// What the engine run needs for its sign-ins: each placeholder file, and (with the proxy) the
/// tokens for the gateway proxy. With the host's network the engine's setup refuses them.
fn signin_credentials(
    plan: &Plan,
    signins: Vec<corral_gateway::signin::Signin>,
    creds: &mut corral_engine::gateway::Credentials,
) -> anyhow::Result<()> {
    for s in signins {
        let name = s.plan().name.clone();
        creds.signin_files.insert(name, s.placeholder_file()?);
        if plan.network.mode == corral_policy::plan::NetworkMode::Proxy {
            creds
                .gateway
                .signins
                .push(corral_net::standalone::SigninValue {
                    plan: s.plan().clone(),
                    tokens: s.tokens(),
                });
        }
    }
    Ok(())
}

/// Rules by method and path need the run's CA in the proxy, which only the native backend's
/// proxy has: a container run refuses them rather than drop them or open the host whole.
fn refuse_path_rules(plan: &Plan) -> anyhow::Result<()> {
    if plan.network.mode != corral_policy::plan::NetworkMode::Proxy
        || plan.network.allow_paths.is_empty()
    {
        return Ok(());
    }
    let rules: Vec<String> = plan
        .network
        .allow_paths
        .iter()
        .map(|r| r.to_string())
        .collect();
    anyhow::bail!(
        "network.allow rules by method and path ({}) work with the native backend only (a container engine's proxy cannot decide each request yet); run with --engine native, or allow the hosts whole",
        rules.join(", ")
    )
}

/// Run `plan` with its container engine in a session of `scope`; the harness's exit code. The
/// project is bind-mounted into the container, so the session's host-side checks (git,
/// set-id, change summary) apply as after a native run. With the request `plan` was
/// resolved from, the proxy's rules follow the policy files while it runs (live.rs).
pub fn run_plan(
    plan: &Trusted<Plan>,
    req: Option<&corral_policy::Request>,
    scope: Scope,
) -> anyhow::Result<i32> {
    refuse_path_rules(plan)?;
    let kind = engine_of(plan)?;
    let resolved = plan;
    // [signin]: the sign-ins served (their files exist), each placeholder file for the harness
    // and the tokens for the run's gateway proxy.
    let (served, signins) = served_signins(plan)?;
    // [secrets]: the real values for the run's gateway proxy, or placeholders without network.
    let (placeholders, gateway) = crate::secrets::for_engine(&served)?;
    let plan = placeholders.as_ref().unwrap_or(&served);
    let mut secrets = corral_engine::gateway::Credentials {
        gateway,
        ..Default::default()
    };
    signin_credentials(plan, signins, &mut secrets)?;
    let session = Session::begin(plan, scope)?.ready()?;
    // The engine attaches the rest itself; the git files the snapshot found are read-only in
    // the container as in a native jail.
    let mut run = RunPlan::container(plan);
    run.protect(&session.protected());
    // Where the jail may create a `HEAD` while it runs (the name gate).
    if let Some(git_dirs) = session.git_dirs(&run.plan) {
        run.git_dirs(&git_dirs);
    }
    let plan = run.plan;
    let mut ctx = context(kind, &plan, session.jail_id())?;
    if plan.skill.is_some() {
        let dir = ctx.state_dir.join("skill").join(session.jail_id());
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(dir.join("SKILL.md"), corral_exec::SKILL_MD)
            .with_context(|| format!("cannot write {}/SKILL.md", dir.display()))?;
        ctx.skill_source = Some(dir);
    }
    let setup = corral_engine::setup(&plan, &ctx)?;
    let mut container = Container {
        kind,
        ctx,
        setup,
        secrets,
        req: req.cloned(),
        resolved: resolved.clone(),
    };
    session.run(&plan, &mut container)
}

/// The container backend: the engine, the host context and the set-up steps of one run.
struct Container {
    kind: EngineKind,
    ctx: Context,
    setup: corral_engine::Setup,
    /// `[secrets]` and `[signin]`: the real values and tokens the run's gateway proxy container
    /// gets (none without), and the harness's placeholder sign-in files.
    secrets: corral_engine::gateway::Credentials,
    /// The request and the plan resolved from it, for following the policy files (live.rs).
    req: Option<corral_policy::Request>,
    resolved: Trusted<Plan>,
}

impl Container {
    /// With corral's proxy and the request the plan came from: the proxy containers' policy
    /// follows the policy files and `corral watch` lists the run. Started once the proxy
    /// containers run (just before the harness), so the run's own policy write comes first.
    fn live_policy(&self, plan: &Plan, session: &Session) -> Option<crate::live::Live> {
        let req = self.req.as_ref()?;
        if plan.network.mode != corral_policy::plan::NetworkMode::Proxy {
            return None;
        }
        let started = ProxyContainers::new(self.kind, &self.ctx, plan).and_then(|enforcer| {
            crate::live::start(
                req,
                &self.resolved,
                plan,
                Box::new(enforcer),
                session.audit(),
                session.jail_id(),
                Some(self.kind.program()),
            )
        });
        started
            .map_err(|e| {
                eprintln!("corral: the policy files are not followed during this run: {e:#}")
            })
            .ok()
    }
}

/// The container backend's [`crate::live::Enforcer`]: the project's generated proxy policy
/// file, rewritten atomically, and the proxy containers that read it (the project's shared
/// proxy, and the run's gateway proxy with `[secrets]`/sign-ins), signalled to reload it.
struct ProxyContainers {
    kind: EngineKind,
    /// The directory of the generated `policy.toml` (`Context::proxy_dir`).
    dir: PathBuf,
    containers: Vec<String>,
    initial: corral_net::Rules,
}

impl ProxyContainers {
    fn new(kind: EngineKind, ctx: &Context, plan: &Plan) -> anyhow::Result<Self> {
        let mut containers = vec![ctx.names(plan).proxy_container];
        if Context::has_gateway(plan) {
            containers.push(ctx.gateway_container(plan));
        }
        Ok(ProxyContainers {
            kind,
            dir: ctx.proxy_dir(),
            containers,
            initial: corral_net::Rules::from_plan(&plan.network)
                .context("cannot read the run's network rules")?,
        })
    }
}

impl crate::live::Enforcer for ProxyContainers {
    fn initial(&self) -> corral_net::Rules {
        self.initial.clone()
    }

    fn apply(
        &self,
        rules: &corral_net::Rules,
        network: &corral_policy::plan::NetworkPlan,
    ) -> Result<(), String> {
        if !rules.allow_paths.is_empty() {
            // As at the start of a container run (`refuse_path_rules`).
            return Err(format!(
                "network.allow rules by method and path ({}) work with the native backend only",
                rules
                    .allow_paths
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let mut net = network.clone();
        net.allow = rules.allow.clone();
        net.deny = rules.deny.clone();
        net.allow_cidrs = rules.allow_cidrs.clone();
        let changed = corral_engine::proxy_policy::write(&self.dir, &net)
            .map_err(|e| format!("cannot write the proxy containers' policy: {e}"))?;
        if changed {
            for c in &self.containers {
                // Only quicker: a proxy that misses the signal (stopped, restarting) reads the
                // file when it starts or sees its modification time change within a second.
                let hup = corral_engine::Command::new(self.kind.program()).args([
                    "kill",
                    "--signal",
                    "HUP",
                    c.as_str(),
                ]);
                let _ = runner::output(&hup);
            }
        }
        Ok(())
    }

    fn run_only_refused(&self) -> Option<String> {
        Some(format!(
            "allow for this run only is not available in a {} run: the project's proxy \
             container is shared by all of the project's container runs and would allow it for \
             every one; add it to corral.toml instead (`p` in corral watch, or `corral allow \
             HOST`)",
            self.kind
        ))
    }
}

impl Backend for Container {
    fn describe(&self, plan: &Plan) -> serde_json::Value {
        serde_json::json!({ "engine": self.kind.program(), "plan": plan })
    }

    /// The container is started and waited for in [`Backend::run`]: its engine cannot hold its
    /// command, so it starts after the change baseline (the session was made `ready`).
    type Started = ();

    fn start(&mut self, _plan: &Plan, _session: &Session) -> anyhow::Result<()> {
        Ok(())
    }

    /// Set up, run and remove the containers (`runner::run_with`): when it returns, the
    /// harness's container and the run's own are gone.
    fn run(
        &mut self,
        plan: &Plan,
        (): (),
        baselined: Baselined,
        session: &Session,
    ) -> anyhow::Result<Ended> {
        let kind = self.kind;
        let wait = |cmd: &corral_engine::Command| {
            let live = self.live_policy(plan, session);
            let status = wait_harness(cmd);
            drop(live);
            status
        };
        let result = runner::run_with(plan, &self.ctx, &self.setup, &self.secrets, wait);
        if let Some(src) = &self.ctx.skill_source {
            let _ = std::fs::remove_dir_all(src);
        }
        // The engine's own failure (125, or an error setting up) on a first run is usually the
        // harness image not built yet, said in the engine's words (a failed pull of
        // localhost/...): looked up only then, so a working run pays nothing for it.
        match result {
            Ok(125) | Err(_) if !image_present(kind, plan) => Err(anyhow::anyhow!(
                "the harness image {} is not in {kind}'s image store: build it with:  corral \
                 image build {} --engine {kind}",
                corral_engine::argv::harness_image(plan),
                plan.profile
            )),
            other => other.map_err(anyhow::Error::from),
        }
        .with_context(|| format!("cannot run the jail with {kind}"))
        .map(|code| baselined.ended(code))
    }
}

/// Whether the plan's harness image is in the engine's store (`image inspect` answers for both
/// podman and docker).
fn image_present(kind: EngineKind, plan: &Plan) -> bool {
    let image = corral_engine::argv::harness_image(plan);
    std::process::Command::new(kind.program())
        .args(["image", "inspect", &image])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `corral init [PROFILE] --compose`, from the calling process's plan.
pub fn init_compose_for(profile: Option<String>) -> anyhow::Result<PathBuf> {
    let mut req =
        corral_policy::Request::from_process().context("cannot describe the calling process")?;
    req.profile = profile;
    let plan = corral_policy::resolve(&req)?;
    init_compose(&plan)
}

/// `corral init --compose`: the executor service in corral's own compose file (in the engine
/// state directory, out of the jail's reach), the networks it joins, and the corral binary in
/// its volume.
pub fn init_compose(plan: &Plan) -> anyhow::Result<PathBuf> {
    let kind = match plan.engine {
        Engine::Docker => EngineKind::Docker,
        Engine::Podman => EngineKind::Podman,
        Engine::Native | Engine::Auto | Engine::Kube => runner::detect().context(
            "`corral init --compose` needs podman or docker on PATH to create the binary volume",
        )?,
    };
    let jail_id = corral_audit::new_jail_id();
    let ctx = context(kind, plan, &jail_id)?;
    // The service's name gate lets a `HEAD` be written in the git directories of now.
    let mut service_plan = plan.clone();
    let snapshot = corral_session::gitguard::snapshot(&plan.project.root, true, &plan.home);
    service_plan.git.dirs = corral_session::gitguard::git_dirs(&snapshot, &[]);
    runner::write_seccomp_profile(&ctx)?;
    let path = corral_engine::compose::write_compose(&service_plan, &ctx)?;
    runner::prepare_audit_dir(plan, &ctx)?;
    // The networks the service joins (declared external in the file).
    let mut net_plan = plan.clone();
    net_plan.network.mode = corral_policy::plan::NetworkMode::Proxy;
    net_plan.network.host_ports.clear();
    net_plan.network.publish.clear();
    net_plan.secrets.clear();
    net_plan.signin.clear();
    if net_plan.command.is_empty() {
        net_plan.command = vec!["true".into()];
    }
    let setup = corral_engine::setup(&net_plan, &ctx)?;
    let names = ctx.names(plan);
    let mut only_networks = corral_engine::Setup {
        steps: setup
            .steps
            .into_iter()
            .filter(|s| matches!(s, corral_engine::Step::Ensure { what, .. } if what.contains("network")))
            .collect(),
    };
    only_networks
        .steps
        .push(corral_engine::compose::volume_step(&ctx, plan));
    runner::ensure(&only_networks, &ctx, false, &names)?;
    // The binary, into its volume.
    let data = std::fs::read(&ctx.corral_bin)
        .with_context(|| format!("cannot read {}", ctx.corral_bin.display()))?;
    let tarball = ctx.state_dir.join("corral-bin.tar");
    corral_engine::compose::write_atomic(
        &tarball,
        &corral_engine::compose::tar_one_file("corral", &data),
    )?;
    let image = corral_engine::argv::harness_image(plan);
    for cmd in corral_engine::compose::install_binary(&ctx, plan, &tarball, &image) {
        runner::output(&cmd)?;
    }
    let _ = std::fs::remove_file(&tarball);
    let up = corral_engine::compose::up_command(plan, &ctx)
        .argv()
        .join(" ");
    eprintln!(
        "corral: wrote the `executor` service into {} and installed {} into volume {}; \
         start it with exactly this file (nothing in the project is read):\n  {up}\n\
         (`docker compose` takes the same arguments as `docker-compose`); \
         the harness reaches it at http://{}:{}",
        path.display(),
        ctx.corral_bin.display(),
        names.bin_volume,
        names.executor_alias,
        corral_engine::names::EXECUTOR_PORT
    );
    Ok(path)
}
