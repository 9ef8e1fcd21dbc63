//! The executor of a run (`[executor]`): the socket-activated `corral serve` a native run
//! attaches ([`attach_executor`]), and the jail of each command it runs in its own jail
//! ([`JailSpawner`], [`jail_helper`]).

use std::path::{Path, PathBuf};

use anyhow::Context;
use corral_audit::AuditLog;
use corral_exec::{HostSpawner, SpawnError, SpawnSpec, Spawned, Spawner};
use corral_policy::Plan;
use corral_session::RunPlan;

use crate::trust::Trusted;

/// The variable that carries a command's jail Plan (JSON) to the helper process.
pub const JAIL_PLAN_ENV: &str = "CORRAL_EXEC_JAIL_PLAN";

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
/// its jail; its exit code. The Plan is trusted as the one it was made from: the executor
/// server that started this helper wrote it ([`JailSpawner`]) from its `--jail-plan`, which a
/// `corral run` wrote from its own trusted plan ([`attach_executor`]) or the user gave
/// `corral serve` themselves.
pub fn jail_helper(early: Option<corral_sandbox::PreparedJail>) -> anyhow::Result<i32> {
    let json = std::env::var(JAIL_PLAN_ENV)
        .with_context(|| format!("--jail-helper needs the command's Plan in {JAIL_PLAN_ENV}"))?;
    let plan: Plan = serde_json::from_str(&json).context("the jail helper's Plan is malformed")?;
    let plan = Trusted::handed_down(plan);
    // The command runs inside its run's session, which checks the project after the executor
    // has ended: no change baseline or git snapshot of its own.
    crate::native::run_plan(&plan, corral_session::Scope::ExecutorCommand, early)
}

/// The executor of a native `corral run`, socket-activated: corral binds the unix socket itself
/// in a private directory (0700) beside a fresh token (0600), and a thread of corral's starts
/// `corral serve --listen fd:N` with that listener only when the first client connects (the
/// connection waits in the backlog meanwhile). A run that never calls the executor never starts
/// it. Dropping the handle stops the server, if one started (which kills every command still
/// running), reports a server that failed, and removes the directory.
pub struct RunExecutor {
    dir: PathBuf,
    activator: Option<Activator>,
}

/// The thread that waits for the executor's first client, and the pipe that stops it.
struct Activator {
    /// Closing this (the pipe's write end) tells the thread the run is over.
    stop: Option<std::os::fd::OwnedFd>,
    /// Whether the run is over, and whether the thread started the server (each decided under
    /// the lock, so the server never starts once the run is over).
    state: std::sync::Arc<std::sync::Mutex<Activation>>,
    /// A message (or the sender's drop) once `activate` returned: the server it started, if
    /// any, has stopped.
    done: std::sync::mpsc::Receiver<()>,
}

#[derive(Default)]
struct Activation {
    over: bool,
    started: bool,
}

/// Create what `run` attached for the executor (runplan.rs `ExecutorAttachment`, which also
/// put its binds, variables and skill arguments into the Plan): the private directory, the
/// skill's SKILL.md, and when corral serves an executor the token and the listening socket;
/// the server behind it starts on the first connection ([`RunExecutor`]). `None` when nothing
/// is attached. `record`: the run's change record directory, which the executor's command jails
/// record into (record.rs `join_run`).
pub fn attach_executor(
    run: &RunPlan,
    audit: &AuditLog,
    record: Option<PathBuf>,
) -> anyhow::Result<Option<RunExecutor>> {
    let Some(attached) = &run.attachments.executor else {
        return Ok(None);
    };
    let plan = &run.plan;
    let start = attached.serve;
    // The executor's own jail (`[executor.sandbox]`), for the sandbox target.
    let jail_plan = match plan.executor.target {
        corral_policy::plan::ExecutorTarget::Sandbox => plan.executor.jail.clone(),
        _ => None,
    };
    let jail_plan_present = jail_plan.is_some();
    let dir = attached.dir.clone();
    let shared = attached.shared();
    for d in [&dir, &shared] {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(d)
            .with_context(|| format!("cannot create {}", d.display()))?;
    }
    let mut handle = RunExecutor {
        dir: dir.clone(),
        activator: None,
    };
    if let Some(skill_dir) = &attached.skill {
        std::fs::create_dir(skill_dir)
            .and_then(|_| std::fs::write(skill_dir.join("SKILL.md"), corral_exec::SKILL_MD))
            .with_context(|| format!("cannot write {}/SKILL.md", skill_dir.display()))?;
    }
    if !start {
        return Ok(Some(handle));
    }
    // 16 random bytes for the token.
    let mut rnd = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd))
        .context("cannot read /dev/urandom for the executor token")?;
    let hex: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
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
    let listener = std::os::unix::net::UnixListener::bind(&sock)
        .with_context(|| format!("cannot listen on the executor's socket {}", sock.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot make {} private", sock.display()))?;
    }
    let mut args: Vec<std::ffi::OsString> = vec![
        "serve".into(),
        "--token-file".into(),
        token.into(),
        "--root".into(),
        plan.project.root.clone().into(),
        "--timeout".into(),
        format!("{}ms", plan.executor.timeout_ms.max(1)).into(),
        "--max-output".into(),
        format!("{}b", plan.executor.max_output.max(1)).into(),
        "--max-concurrent".into(),
        plan.executor.max_concurrent.max(1).to_string().into(),
        // The policy is already resolved into these flags and the jail plan.
        "--policy".into(),
        "/dev/null".into(),
    ];
    for a in &plan.executor.allow {
        args.push("--allow".into());
        args.push(a.into());
    }
    let launch = Launch {
        exe: std::env::current_exe().context("cannot find corral's own binary")?,
        args,
        jail_plan,
        // Real secret values stay in corral alone: the gateway holds them, and no executor
        // (least of all the unjailed host one, which inherits this environment) may hand them
        // out.
        env_remove: plan.secrets.iter().map(|s| s.from_env.clone()).collect(),
        dir: dir.clone(),
        audit: audit.clone(),
        // Only for command jails (whose PID 1 records): never handed to a host executor.
        record: record.filter(|_| jail_plan_present),
    };
    let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .context("cannot create the executor's stop pipe")?;
    let (done_w, done) = std::sync::mpsc::channel();
    let state = std::sync::Arc::new(std::sync::Mutex::new(Activation::default()));
    let shared = state.clone();
    std::thread::Builder::new()
        .name("corral-executor".into())
        .spawn(move || {
            activate(listener, launch, stop_r, &shared);
            let _ = done_w.send(());
        })
        .context("cannot start the executor's activation thread")?;
    handle.activator = Some(Activator {
        stop: Some(stop_w),
        state,
        done,
    });
    Ok(Some(handle))
}

/// How to start the executor's server once a client connects.
struct Launch {
    exe: PathBuf,
    /// Every argument but `--listen` and `--jail-plan`.
    args: Vec<std::ffi::OsString>,
    /// The executor's jail (`[executor.sandbox]`), written beside the socket when it starts.
    jail_plan: Option<Box<Plan>>,
    /// Variables the server must not inherit (the real values of secrets).
    env_remove: Vec<String>,
    /// The private directory: `jail.json` and `serve.log` go here.
    dir: PathBuf,
    /// The run's audit log (the server writes the same file): the records the server could not
    /// write are added to its count when the server has stopped.
    audit: AuditLog,
    /// The run's change record directory, for the command jails ([`crate::record::RECORD_ENV`]).
    record: Option<PathBuf>,
}

/// Whether `fd` has an event, waiting for one on `fds` (retrying on EINTR). An error of poll
/// itself counts as an event on every descriptor, so the caller stops waiting.
fn wait_readable(fds: &[std::os::fd::BorrowedFd<'_>]) -> Vec<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut pfds: Vec<PollFd> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    loop {
        match poll(&mut pfds, PollTimeout::NONE) {
            Ok(_) => {
                return pfds
                    .iter()
                    .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
                    .collect();
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return vec![true; fds.len()],
        }
    }
}

/// The activation thread: wait until the jail's first client connects or the run ends (`stop`
/// reaches EOF); on a connection, start `corral serve` with the listener, then wait for the end
/// of the run, report a server that failed, and stop it. The server is this thread's child
/// with PR_SET_PDEATHSIG, so it dies with corral; this thread lives as long as the run.
fn activate(
    listener: std::os::unix::net::UnixListener,
    launch: Launch,
    stop: std::os::fd::OwnedFd,
    state: &std::sync::Mutex<Activation>,
) {
    use std::os::fd::{AsFd, AsRawFd};
    let ready = wait_readable(&[listener.as_fd(), stop.as_fd()]);
    if ready[1] || !ready[0] {
        // The run ended and nothing ever called the executor.
        return;
    }
    let log = launch.dir.join("serve.log");
    let fail = |what: String| {
        eprintln!("corral: the executor (corral serve) failed: {what}");
    };
    let child = {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        if state.over {
            // The run ended as the first client came.
            return;
        }
        state.started = true;
        match server_command(&launch, listener.as_raw_fd(), &log) {
            Ok(mut cmd) => cmd.spawn().context("cannot start corral serve"),
            Err(e) => Err(e),
        }
    };
    // The server holds the listener now; without corral's copy, a server that dies leaves a
    // socket that refuses connections instead of one where clients wait forever. On failure the
    // waiting clients are reset the same way.
    drop(listener);
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            wait_readable(&[stop.as_fd()]);
            fail(format!("{e:#}"));
            return;
        }
    };
    wait_readable(&[stop.as_fd()]);
    if let Ok(Some(status)) = child.try_wait()
        && !status.success()
    {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        fail(text.trim().to_string());
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    report_refusals(&text);
    // The server's records that could not be written count in the run's summary.
    for f in text
        .lines()
        .filter_map(corral_audit::WriteFailures::parse_summary_line)
    {
        launch.audit.add_failures(&f);
    }
}

/// The end-of-run lines for the requests the executor refused by `executor.allow` (at most
/// ten; every one is in the audit log), from the server's stderr `text`.
fn report_refusals(text: &str) {
    const SHOWN: usize = 10;
    let refused: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(corral_exec::server::REFUSED_PREFIX))
        .collect();
    for line in refused.iter().take(SHOWN) {
        eprintln!("corral: the executor refused {line}");
    }
    if refused.len() > SHOWN {
        eprintln!(
            "corral: the executor refused {} more requests (corral log --blocked)",
            refused.len() - SHOWN
        );
    }
}

/// `corral serve --listen fd:N ...` with the listener at `fd` (inherited: its close-on-exec
/// flag is cleared in the child alone), its messages going to `log`.
fn server_command(
    launch: &Launch,
    fd: std::os::fd::RawFd,
    log: &Path,
) -> anyhow::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(&launch.exe);
    cmd.args(&launch.args)
        .arg("--listen")
        .arg(format!("fd:{fd}"));
    if let Some(jail) = &launch.jail_plan {
        let file = launch.dir.join("jail.json");
        std::fs::write(&file, serde_json::to_vec(jail)?)
            .with_context(|| format!("cannot write {}", file.display()))?;
        cmd.arg("--jail-plan").arg(file);
    }
    for name in &launch.env_remove {
        cmd.env_remove(name);
    }
    // The server passes it on to each command's jail helper (not into any jail: a jail's
    // environment is its Plan's).
    match &launch.record {
        Some(dir) => cmd.env(crate::record::RECORD_ENV, dir),
        None => cmd.env_remove(crate::record::RECORD_ENV),
    };
    let log_file =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log_file);
    use std::os::unix::process::CommandExt;
    // The open-file limit corral started with (`corral run` raised its own for the proxy): the
    // executor and its commands get it back.
    let nofile = corral_net::bounds::original_nofile_soft();
    // SAFETY: fcntl, prctl, getrlimit and setrlimit are async-signal-safe and allocate nothing.
    // The listener is close-on-exec in corral (no other child inherits it); here, in the
    // server's process alone, the flag is cleared so the server receives it. PR_SET_PDEATHSIG
    // makes the server die (and kill its commands) when corral's activation thread, and so
    // corral, does.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(soft) = nofile {
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                    lim.rlim_cur = soft.min(lim.rlim_max);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                }
            }
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

impl Drop for RunExecutor {
    fn drop(&mut self) {
        if let Some(a) = &mut self.activator {
            // The run is over: a server the thread started is stopped (EOF on the stop pipe)
            // and waited for; one it did not start never starts, and the thread, which holds
            // nothing else, ends on its own.
            let started = {
                let mut state = a.state.lock().unwrap_or_else(|p| p.into_inner());
                state.over = true;
                state.started
            };
            drop(a.stop.take());
            if started {
                let _ = a.done.recv();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
