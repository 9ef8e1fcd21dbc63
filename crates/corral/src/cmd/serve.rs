//! `corral serve`: the executor server.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use corral_audit::AuditLog;
use corral_exec::{
    HostSpawner, ListenAddr, Server, ServerConfig, SpawnError, SpawnSpec, Spawned, Spawner,
};
use corral_policy::Plan;
use corral_policy::config::{HumanDuration, Size, load_policy};
use corral_policy::plan::{Access, ExecutorTarget, Mount, MountKind};

use crate::cli::ServeArgs;

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    if args.jail_helper {
        return jail_helper();
    }
    let root = match &args.root {
        Some(r) => r.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let root =
        std::fs::canonicalize(&root).with_context(|| format!("project root {}", root.display()))?;
    let mut cfg = ServerConfig::new(&root);

    // The executor's settings: the policy file (--policy, else the project's corral.toml),
    // then the flags.
    let policy = args
        .policy
        .clone()
        .or_else(|| Some(root.join("corral.toml")).filter(|p| p.is_file()));
    if let Some(p) = &policy {
        apply_policy(&mut cfg, p)?;
    }
    cfg.allow.extend(args.allow.iter().cloned());
    if let Some(t) = &args.timeout {
        cfg.timeout = Duration::from_millis(
            HumanDuration::parse(t)
                .map_err(anyhow::Error::msg)
                .context("--timeout")?
                .0,
        );
    }
    if let Some(s) = &args.max_output {
        cfg.max_output = Size::parse(s)
            .map_err(anyhow::Error::msg)
            .context("--max-output")?
            .0;
    }
    if let Some(n) = args.max_concurrent {
        if n == 0 {
            bail!("--max-concurrent must be at least 1");
        }
        cfg.max_concurrent = n;
    }

    cfg.token = if args.no_auth {
        None
    } else {
        let file = args
            .token_file
            .clone()
            .or_else(|| std::env::var_os("CORRAL_EXECUTOR_TOKEN_FILE").map(PathBuf::from))
            .context(
                "corral serve needs --token-file F (clients send its content as a bearer token) \
                 or an explicit --no-auth (only when nothing untrusted can reach the address)",
            )?;
        Some(read_token(&file)?)
    };
    cfg.audit = Some(match &args.audit_log {
        Some(f) => AuditLog::at(f),
        None => AuditLog::for_project(&root)
            .context("cannot place the audit log; pass --audit-log FILE")?,
    });
    if let Some(id) = std::env::var("CORRAL_JAIL_ID")
        .ok()
        .filter(|v| !v.is_empty())
    {
        cfg.jail_id = id;
    }
    let listen = ListenAddr::parse(&args.listen)?;
    let host = HostSpawner {
        base_env: None,
        remove_env: vec![
            "CORRAL_EXECUTOR".into(),
            "CORRAL_EXECUTOR_TOKEN_FILE".into(),
            JAIL_PLAN_ENV.into(),
        ],
    };
    let spawner: Arc<dyn Spawner> = match &args.jail_plan {
        None => Arc::new(host),
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the jail plan {}", file.display()))?;
            let plan: Plan = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a corral Plan (JSON)", file.display()))?;
            Arc::new(JailSpawner::new(plan, host)?)
        }
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let auth = if cfg.token.is_some() {
            "bearer token"
        } else {
            "none (--no-auth)"
        };
        let summary = format!(
            "root {}, auth {auth}, max {} concurrent, timeout {}s",
            root.display(),
            cfg.max_concurrent,
            cfg.timeout.as_secs_f64()
        );
        let server = Server::bind(&listen, cfg, spawner).await?;
        eprintln!(
            "corral serve: listening on {} ({summary})",
            server.local_addr()
        );
        server.run(stop_signal()).await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn apply_policy(cfg: &mut ServerConfig, path: &Path) -> anyhow::Result<()> {
    let (policy, _) = load_policy(path)?;
    if let Some(ex) = policy.executor {
        if let Some(allow) = ex.allow {
            cfg.allow = allow;
        }
        if let Some(t) = ex.timeout {
            cfg.timeout = Duration::from_millis(t.0);
        }
        if let Some(s) = ex.max_output {
            cfg.max_output = s.0;
        }
        if let Some(n) = ex.max_concurrent {
            cfg.max_concurrent = n.max(1);
        }
    }
    Ok(())
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token)
}

/// Resolves on SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("corral serve: shutting down; killing running commands");
}

/// The variable that carries a command's jail Plan (JSON) to the helper process.
const JAIL_PLAN_ENV: &str = "CORRAL_EXEC_JAIL_PLAN";

/// Runs each command in a jail of its own, built from the executor's jail Plan (the policy's
/// `[executor.sandbox]`, `plan.executor.jail`).
///
/// The command's process group is led by a helper process, `corral serve --jail-helper`, which
/// starts the jail with the native backend (cgroups, its own proxy for `[executor.sandbox]
/// network`, audit) and waits for it. A separate process because the backend takes over
/// SIGCHLD and the terminal of the process that runs it, which the server's async runtime
/// cannot share. SIGTERM to the group is forwarded into the jail; SIGKILL kills the helper, and
/// the jail dies with it (its set-up process and PID 1 have PR_SET_PDEATHSIG).
pub struct JailSpawner {
    plan: Plan,
    exe: PathBuf,
    host: HostSpawner,
}

impl JailSpawner {
    pub fn new(plan: Plan, host: HostSpawner) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find corral's own binary")?;
        Ok(Self { plan, exe, host })
    }
}

impl Spawner for JailSpawner {
    fn spawn(&self, spec: SpawnSpec<'_>) -> Result<Spawned, SpawnError> {
        let mut plan = self.plan.clone();
        plan.command = spec.argv.to_vec();
        // The project is mounted at its own path in the jail, so the confined directory's real
        // path is the same place inside.
        plan.cwd = spec.workdir.path.clone();
        plan.env
            .extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let json = serde_json::to_string(&plan).map_err(|e| SpawnError::Other {
            program: spec.argv[0].clone(),
            source: std::io::Error::other(e),
        })?;
        let argv = vec![
            self.exe.display().to_string(),
            "serve".to_string(),
            "--jail-helper".to_string(),
        ];
        let mut env = std::collections::BTreeMap::new();
        env.insert(JAIL_PLAN_ENV.to_string(), json);
        self.host
            .spawn(SpawnSpec {
                argv: &argv,
                workdir: spec.workdir,
                env: &env,
                stdin: spec.stdin,
                merge_output: spec.merge_output,
            })
            .map_err(|e| match e {
                SpawnError::Other { source, .. } => SpawnError::Other {
                    program: spec.argv[0].clone(),
                    source,
                },
                other => other,
            })
    }
}

/// `corral serve --jail-helper`: run the one command of the Plan in `CORRAL_EXEC_JAIL_PLAN` in
/// its jail; exit with its code.
fn jail_helper() -> anyhow::Result<ExitCode> {
    let json = std::env::var(JAIL_PLAN_ENV)
        .with_context(|| format!("--jail-helper needs the command's Plan in {JAIL_PLAN_ENV}"))?;
    let plan: Plan = serde_json::from_str(&json).context("the jail helper's Plan is malformed")?;
    let code = super::run::run_plan(&plan)?;
    Ok(ExitCode::from((code & 0xff) as u8))
}

/// Where the executor's socket and token appear inside the agent's jail.
pub const JAIL_EXECUTOR_DIR: &str = "/run/corral/executor";

/// The executor of a native `corral run`: a `corral serve` child on a unix socket in a private
/// directory (0700) with a fresh token (0600), and the skill file. Dropping it stops the server,
/// which kills every command still running, and removes the directory.
pub struct RunExecutor {
    child: Option<std::process::Child>,
    dir: PathBuf,
}

/// Start the executor `plan` asks for and give the jail access to it: a directory holding only
/// the socket and the token, bound read-only at [`JAIL_EXECUTOR_DIR`], and `CORRAL_EXECUTOR`,
/// `CORRAL_EXECUTOR_TOKEN_FILE`, `CORRAL_PROJECT_ROOT` set. When the plan has a skill
/// (`plan.skill`), SKILL.md is bound read-only at its directory and its arguments (pi:
/// `--skill DIR`) are added to the command. `None` when there is neither (`compose:SERVICE`
/// without a skill, or a plan that is itself an executor's jail).
pub fn attach_executor(plan: &mut Plan) -> anyhow::Result<Option<RunExecutor>> {
    let (start, jail_plan) = match (&plan.executor.target, &plan.executor.jail) {
        (ExecutorTarget::Sandbox, Some(jail)) => (true, Some(jail.clone())),
        (ExecutorTarget::Sandbox, None) | (ExecutorTarget::Compose(_), _) => (false, None),
        (ExecutorTarget::Host, _) => (true, None),
    };
    if !start && plan.skill.is_none() {
        return Ok(None);
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| Path::new(d).is_dir())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    // 16 random bytes for the token and 4 more for the directory's name: the name is in the
    // server's command line (`ps`) and in the jail's mountinfo, so it holds no token bits.
    let mut rnd = [0u8; 20];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd))
        .context("cannot read /dev/urandom for the executor token")?;
    let to_hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let hex = to_hex(&rnd[..16]);
    let dir = base.join(format!(
        "corral-exec-{}-{}",
        std::process::id(),
        to_hex(&rnd[16..])
    ));
    let shared = dir.join("jail");
    for d in [&dir, &shared] {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(d)
            .with_context(|| format!("cannot create {}", d.display()))?;
    }
    let mut handle = RunExecutor {
        child: None,
        dir: dir.clone(),
    };
    if let Some(skill) = plan.skill.clone() {
        let skill_dir = dir.join("skill");
        std::fs::create_dir(&skill_dir)
            .and_then(|_| std::fs::write(skill_dir.join("SKILL.md"), corral_exec::SKILL_MD))
            .with_context(|| format!("cannot write {}/SKILL.md", skill_dir.display()))?;
        plan.mounts.push(Mount {
            source: skill_dir,
            target: skill.dir.clone(),
            kind: MountKind::Bind(Access::Ro),
            optional: false,
        });
        plan.command.extend(skill.args.iter().cloned());
    }
    if !start {
        return Ok(Some(handle));
    }
    let token = shared.join("token");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token)
            .with_context(|| format!("cannot create {}", token.display()))?;
        std::io::Write::write_all(&mut f, hex.as_bytes())?;
    }
    let sock = shared.join("exec.sock");
    let exe = std::env::current_exe().context("cannot find corral's own binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--token-file")
        .arg(&token)
        .arg("--root")
        .arg(&plan.project.root)
        .arg("--timeout")
        .arg(format!("{}ms", plan.executor.timeout_ms.max(1)))
        .arg("--max-output")
        .arg(plan.executor.max_output.max(1).to_string())
        .arg("--max-concurrent")
        .arg(plan.executor.max_concurrent.max(1).to_string())
        // The policy is already resolved into these flags and the jail plan.
        .arg("--policy")
        .arg("/dev/null");
    for a in &plan.executor.allow {
        cmd.arg("--allow").arg(a);
    }
    if let Some(jail) = &jail_plan {
        let file = dir.join("jail.json");
        std::fs::write(&file, serde_json::to_vec(jail)?)
            .with_context(|| format!("cannot write {}", file.display()))?;
        cmd.arg("--jail-plan").arg(file);
    }
    // Real secret values stay in corral alone: the gateway holds them, and no executor
    // (least of all the unjailed host one, which inherits this environment) may hand them out.
    for s in &plan.secrets {
        cmd.env_remove(&s.from_env);
    }
    let log = dir.join("serve.log");
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log_file);
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe; it makes the server die (and
        // kill its commands) when corral does.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    handle.child = Some(
        cmd.spawn()
            .context("cannot start the executor (corral serve)")?,
    );
    // Not waited for: the socket appears in the directory already bound into the jail, and
    // `corral exec` waits briefly for a socket that is not there yet. Its messages go to a log
    // beside the socket, not into the harness's terminal; the log is shown if it fails.

    plan.mounts.push(Mount {
        source: shared,
        target: PathBuf::from(JAIL_EXECUTOR_DIR),
        kind: MountKind::Bind(Access::Ro),
        optional: false,
    });
    plan.env.insert(
        "CORRAL_EXECUTOR".into(),
        format!("unix:{JAIL_EXECUTOR_DIR}/exec.sock"),
    );
    plan.env.insert(
        "CORRAL_EXECUTOR_TOKEN_FILE".into(),
        format!("{JAIL_EXECUTOR_DIR}/token"),
    );
    plan.env.insert(
        "CORRAL_PROJECT_ROOT".into(),
        plan.project.root.display().to_string(),
    );
    Ok(Some(handle))
}

impl Drop for RunExecutor {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            if let Ok(Some(status)) = child.try_wait()
                && !status.success()
            {
                let log = std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default();
                eprintln!("corral: the executor (corral serve) failed: {}", log.trim());
            }
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
