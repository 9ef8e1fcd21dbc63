//! `corral run --engine kube`: the manifests `corral kube render` prints for this run, applied
//! with kubectl, the harness's terminal attached (or its output streamed), its exit code
//! returned, and every object deleted again however the run ends (normal exit, error, SIGINT,
//! SIGTERM, SIGHUP). What a killed corral left, `corral down` removes (`down_leftovers`).
//!
//! kubectl is the cluster's stable interface, as the podman CLI is the container backend's:
//! `$CORRAL_KUBECTL`, else `kubectl` on PATH, with `--context`/`--namespace` passed through
//! (else kubectl's own defaults from KUBECONFIG).

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use corral_policy::plan::{Engine, NetworkMode, Plan};
use corral_session::{Backend, Baselined, Ended, Scope, Session};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::cli::{EngineArg, JailOptions, KubeRenderArgs, KubeRunArgs, KubeTarget, SeccompArg};

/// The program run instead of `kubectl` from PATH.
pub const KUBECTL_ENV: &str = "CORRAL_KUBECTL";
/// How long the proxy and the sandbox get to start, without `--kube-timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the sandbox's phase is asked for while it starts or ends.
const POLL: Duration = Duration::from_millis(500);
/// The kinds a jail is made of, for the deletion by label.
const KINDS: &str = "pod,deployment,service,configmap,secret,networkpolicy";
/// What a run records next to its manifests, for `corral down`.
const RECORD: &str = "run.json";
const MANIFESTS: &str = "jail.yaml";

/// `corral run --engine kube [PROFILE] [-- CMD]`.
pub fn run(
    profile: Option<String>,
    jail: &JailOptions,
    kube: &KubeRunArgs,
    command: Vec<String>,
    early: Option<corral_sandbox::PreparedJail>,
) -> anyhow::Result<ExitCode> {
    // main() forked the native jail's set-up process for `run`: not used here, so ended.
    drop(early);
    if jail.engine != Some(EngineArg::Kube) {
        bail!(
            "{} apply to --engine kube only (add --engine kube, or leave them out)",
            kube.given().join(", ")
        );
    }
    if jail.scratch {
        bail!(
            "--scratch cannot run on Kubernetes: the sandbox's project is a volume of the \
             cluster (--project-claim, or --project-hostpath on a single node), not a \
             directory corral makes"
        );
    }
    let req = super::plan::request(profile, jail, command)?;
    // What the project's own corral.toml grants needs the user's trust (corral-run's gate).
    let plan = corral_run::trust::resolve_trusted(&req)?;
    debug_assert_eq!(plan.engine, Engine::Kube);
    corral_run::review::native_only(&plan)?;
    let kubectl = Kubectl::new(kube)?;
    let timeout = match &kube.kube_timeout {
        Some(t) => humantime::parse_duration(t)
            .with_context(|| format!("--kube-timeout {t:?}: not a duration (30s, 2m, 1h)"))?,
        None => DEFAULT_TIMEOUT,
    };
    let session = Session::begin(&plan, Scope::Remote)?.ready()?;
    let name = run_name(&plan.project.root, session.jail_id());
    let render_args = render_args(kube, &name, &plan.project.root);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdin())
        && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut opts = super::kube::options(&render_args, &plan)?;
    // A terminal and stdin for `kubectl attach -it` at a terminal; else none (a harness
    // reading its terminal would wait for input nobody sends), its output read by `logs -f`.
    opts.tty = tty;
    // `[secrets]` as `corral kube render` makes them: the run CA, the real values (from corral's
    // environment) and the placeholders; the manifests holding them are written 0600 and
    // deleted with the run.
    let secrets = super::kube::run_secrets(&plan)?;
    let objects = corral_kube::render_with_secrets(&plan, &opts, secrets.as_ref())?;
    let yaml = corral_kube::to_yaml(&objects)?;
    say_what_runs(&plan, &opts);
    if let Some(node) = &kube.node_files {
        write_node_files(node, opts.seccomp)?;
    }
    let dir = RunDir::create(&plan.project.root, &name, &kubectl, &yaml)?;
    let mut backend = Kube {
        kubectl,
        dir,
        name,
        proxied: plan.network.mode == NetworkMode::Proxy,
        timeout,
        tty,
    };
    let code = session.run(&plan, &mut backend)?;
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The jail's name: the project's (`corral kube render`'s default, cut) and the run's id, so
/// two runs never share an object and `corral down` finds each run's by its label.
fn run_name(project_root: &Path, jail_id: &str) -> String {
    let id: String = jail_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .to_ascii_lowercase();
    let mut base = corral_kube::default_name(project_root);
    base.truncate(40 - id.len() - 1);
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{id}")
}

/// `corral kube render`'s arguments for this run: the same options, the same render.
/// The project's claim is the project's, not the run's: `corral kube render`'s default name
/// for it (corral-PROJECT-project), so every run of the project mounts the same one.
fn render_args(kube: &KubeRunArgs, name: &str, project_root: &Path) -> KubeRenderArgs {
    let claim = kube
        .project_claim
        .clone()
        .unwrap_or_else(|| format!("{}-project", corral_kube::default_name(project_root)));
    KubeRenderArgs {
        profile: None,
        jail: JailOptions::default(),
        target: KubeTarget::Pod,
        output: None,
        check: false,
        name: Some(name.to_string()),
        namespace: kube.kube_namespace.clone(),
        proxy_ip: kube.proxy_ip.clone(),
        proxy_image: kube
            .proxy_image
            .clone()
            .unwrap_or_else(|| super::kube::DEFAULT_PROXY_IMAGE.to_string()),
        image: kube.image.clone(),
        executor_ip: kube.executor_ip.clone(),
        executor_image: None,
        seccomp: kube.seccomp.unwrap_or(SeccompArg::Localhost),
        project_claim: Some(claim),
        project_hostpath: kube.project_hostpath,
        pids_by_node: kube.pids_by_node,
        node_files: kube.node_files.clone(),
        command: Vec::new(),
    }
}

/// What the sandbox gets that the user must know: where its project comes from, what is not
/// carried, and which of a run's host-side checks cannot be made.
fn say_what_runs(plan: &Plan, opts: &corral_kube::Options) {
    let root = plan.project.root.display();
    match &opts.project {
        corral_kube::ProjectSource::Claim(claim) => eprintln!(
            "corral: kube: the sandbox mounts PersistentVolumeClaim {claim} at {root}: the claim \
             must hold the project (corral copies nothing into it)"
        ),
        corral_kube::ProjectSource::HostPath => {
            eprintln!("corral: kube: the sandbox mounts the node's {root} (hostPath) at {root}")
        }
    }
    if let Some(dir) = &opts.node_files {
        eprintln!(
            "corral: kube: masked files, the policy file's stand-in and the seccomp profile come \
             from {} on the node (podman kube play --seccomp-profile-root {0}); written here",
            dir.display()
        );
    } else if opts.seccomp == corral_kube::Seccomp::Localhost {
        eprintln!(
            "corral: kube: the sandbox runs under seccomp profile Localhost {}: every node needs \
             it (corral kube render -o DIR writes it; or pass --seccomp runtime-default)",
            corral_kube::SECCOMP_LOCALHOST
        );
    }
    let left_out = corral_kube::not_carried(plan, opts);
    if !left_out.is_empty() {
        eprintln!("corral: kube: not carried: {}", left_out.join("; "));
    }
    eprintln!(
        "corral: kube: the change summary, the git check and the harness-config guard look at \
         the host's files, not the cluster's volume: not made for this run"
    );
}

/// `--node-files DIR`, the node being this host (`podman kube play`): the unreadable file, the
/// empty one, and corral's seccomp profile (`podman kube play --seccomp-profile-root DIR`),
/// as the podman backend writes its own.
fn write_node_files(dir: &Path, seccomp: corral_kube::Seccomp) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, mode) in [("masked", 0o000), ("empty", 0o444)] {
        let path = dir.join(name);
        if !path.exists() {
            std::fs::write(&path, b"")
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    }
    if seccomp == corral_kube::Seccomp::Localhost {
        let profile = corral_sandbox::seccomp::oci_profile()
            .context("cannot build corral's seccomp profile for this architecture")?;
        let path = dir.join(corral_kube::NODE_SECCOMP);
        let text =
            serde_json::to_string_pretty(&profile).context("cannot encode the seccomp profile")?;
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// How kubectl is run: the program and the flags every call gets.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kubectl {
    program: PathBuf,
    context: Option<String>,
    namespace: Option<String>,
}

impl Kubectl {
    fn new(kube: &KubeRunArgs) -> anyhow::Result<Kubectl> {
        Ok(Kubectl {
            program: kubectl_program()?,
            context: kube.kube_context.clone(),
            namespace: kube.kube_namespace.clone(),
        })
    }

    /// `kubectl [--context C] [--namespace NS] ARGS...`.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        if let Some(c) = &self.context {
            cmd.arg("--context").arg(c);
        }
        if let Some(n) = &self.namespace {
            cmd.arg("--namespace").arg(n);
        }
        cmd.args(args).kill_on_drop(true);
        cmd
    }
}

/// `$CORRAL_KUBECTL`, else `kubectl` on PATH.
fn kubectl_program() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(KUBECTL_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("kubectl"))
                .find(|p| p.is_file())
        })
        .context(
            "--engine kube: `kubectl` is not on PATH (install it, or point CORRAL_KUBECTL at it)",
        )
}

/// A run's directory: its manifests and what `corral down` needs to delete them
/// (`$XDG_STATE_HOME/corral/kube/<project key>/<name>/`). Made before anything is applied, so a
/// killed run leaves it behind; removed once the run's objects are deleted.
struct RunDir {
    path: PathBuf,
}

/// What `corral down` reads back.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    name: String,
    kubectl: Kubectl,
}

/// The directory of every kube run of the project at `root`.
fn project_runs_dir(root: &Path) -> anyhow::Result<PathBuf> {
    let state = corral_audit::state_dir().context("cannot find corral's state directory")?;
    Ok(state.join("kube").join(corral_audit::project_key(root)))
}

impl RunDir {
    fn create(root: &Path, name: &str, kubectl: &Kubectl, yaml: &str) -> anyhow::Result<RunDir> {
        let path = project_runs_dir(root)?.join(name);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        // The manifests may hold the executor's token: the owner's only.
        super::kube::write_private(&path.join(MANIFESTS), yaml)?;
        let record = Record {
            name: name.to_string(),
            kubectl: kubectl.clone(),
        };
        let text = serde_json::to_string_pretty(&record).context("cannot encode the run record")?;
        std::fs::write(path.join(RECORD), text + "\n")
            .with_context(|| format!("cannot write {}", path.join(RECORD).display()))?;
        Ok(RunDir { path })
    }

    /// The run's directory, and the project's when it was the last run in it.
    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(parent) = self.path.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }

    fn manifests(&self) -> PathBuf {
        self.path.join(MANIFESTS)
    }
}

/// The Kubernetes backend of one run.
struct Kube {
    kubectl: Kubectl,
    dir: RunDir,
    name: String,
    proxied: bool,
    timeout: Duration,
    tty: bool,
}

impl Backend for Kube {
    fn describe(&self, plan: &Plan) -> serde_json::Value {
        serde_json::json!({
            "engine": "kube",
            "name": self.name,
            "context": self.kubectl.context,
            "namespace": self.kubectl.namespace,
            "plan": plan,
        })
    }

    /// The objects are applied and waited for in [`Backend::run`] (the session is `ready`).
    type Started = ();

    fn start(&mut self, _plan: &Plan, _session: &Session) -> anyhow::Result<()> {
        Ok(())
    }

    /// Apply, attach or follow, then delete the run's objects however it ended.
    fn run(
        &mut self,
        _plan: &Plan,
        (): (),
        baselined: Baselined,
        _session: &Session,
    ) -> anyhow::Result<Ended> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime that drives kubectl")?;
        rt.block_on(async {
            let mut signals = Signals::new().context("cannot watch for signals")?;
            let result = self.drive(&mut signals).await;
            // Always, however the run ended; signals that come meanwhile do not stop it.
            let cleaned = delete(&self.kubectl, &self.dir.manifests(), &self.name).await;
            match &cleaned {
                Ok(()) => self.dir.remove(),
                Err(e) => eprintln!(
                    "corral: kube: {e:#}; `corral down --engine kube` deletes them (its record \
                     is {})",
                    self.dir.path.display()
                ),
            }
            match result? {
                StepEnd::Done(code) => Ok(code),
                StepEnd::Signal(sig) => {
                    eprintln!("corral: kube: signal {sig}: the run's objects were deleted");
                    Ok(128 + sig)
                }
            }
        })
        .map(|code| baselined.ended(code))
    }
}

/// How a step ended: by itself, or by a signal to corral (whose number).
enum StepEnd<T> {
    Done(T),
    Signal(i32),
}

/// The signals that end a run: SIGINT, SIGTERM, SIGHUP.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

/// What a kubectl call printed (when captured) and how it ended.
struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Run one kubectl call to its end, or until a signal comes (the call is then stopped with
/// SIGTERM, so an attached kubectl gives the terminal back). `capture`: its output is returned,
/// else it goes to corral's own stdio (the harness's terminal, its logs).
async fn kubectl(
    k: &Kubectl,
    args: &[&str],
    capture: bool,
    signals: &mut Signals,
) -> anyhow::Result<StepEnd<Output>> {
    let mut cmd = k.command(args);
    if capture {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    let shown = format!("{} {}", k.program.display(), args.join(" "));
    let mut child = cmd.spawn().with_context(|| format!("cannot run {shown}"))?;
    let out = child.stdout.take().map(|s| tokio::spawn(read_all(s)));
    let err = child.stderr.take().map(|s| tokio::spawn(read_all(s)));
    let status = tokio::select! {
        status = child.wait() => status.with_context(|| format!("cannot wait for {shown}"))?,
        sig = signals.next() => {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = child.wait().await;
            return Ok(StepEnd::Signal(sig));
        }
    };
    let joined = |h: Option<tokio::task::JoinHandle<String>>| async move {
        match h {
            Some(h) => h.await.unwrap_or_default(),
            None => String::new(),
        }
    };
    Ok(StepEnd::Done(Output {
        success: status.success(),
        stdout: joined(out).await,
        stderr: joined(err).await,
    }))
}

async fn read_all(mut r: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Stop at a signal: `step!(expr)` is the value of a step that ended by itself.
macro_rules! step {
    ($e:expr) => {
        match $e {
            StepEnd::Done(v) => v,
            StepEnd::Signal(s) => return Ok(StepEnd::Signal(s)),
        }
    };
}

impl Kube {
    /// Apply, wait for the proxy and the sandbox, attach (or stream), and read the exit code.
    async fn drive(&self, signals: &mut Signals) -> anyhow::Result<StepEnd<i32>> {
        let manifests = self.dir.manifests();
        let file = manifests.to_string_lossy();
        let applied = step!(kubectl(&self.kubectl, &["apply", "-f", &file], true, signals).await?);
        if !applied.success {
            bail!("kubectl apply -f {file} failed: {}", brief(&applied.stderr));
        }
        eprint!("{}", applied.stdout);
        let deadline = Instant::now() + self.timeout;
        if self.proxied {
            step!(self.wait_proxy(deadline, signals).await?);
        }
        let phase = step!(self.wait_sandbox(deadline, signals).await?);
        if phase == "Running" {
            step!(self.stream(signals).await?);
        } else {
            // Ended before corral looked: its output is in its log.
            step!(kubectl(&self.kubectl, &self.logs_args(false), false, signals).await?);
        }
        self.exit_code(signals).await
    }

    /// `kubectl wait` until the proxy's Deployment is Available.
    async fn wait_proxy(
        &self,
        deadline: Instant,
        signals: &mut Signals,
    ) -> anyhow::Result<StepEnd<()>> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
            .ceil()
            .max(1.0);
        let deployment = format!("deployment/{}-proxy", self.name);
        let timeout = format!("--timeout={left}s");
        let args = ["wait", "--for=condition=Available", &deployment, &timeout];
        let out = step!(kubectl(&self.kubectl, &args, true, signals).await?);
        if !out.success {
            bail!(
                "the proxy ({deployment}) was not available within {}: {} (kubectl describe \
                 {deployment} says why: the image localhost/corral-proxy must be pullable by \
                 the nodes, or pass --proxy-image)",
                humantime::format_duration(self.timeout),
                brief(&out.stderr)
            );
        }
        Ok(StepEnd::Done(()))
    }

    /// Ask for the sandbox Pod's phase until it runs or has ended; its phase then. A container
    /// that cannot start (image pull, configuration) fails at once with the reason.
    async fn wait_sandbox(
        &self,
        deadline: Instant,
        signals: &mut Signals,
    ) -> anyhow::Result<StepEnd<String>> {
        let pod = format!("pod/{}", self.name);
        let jsonpath =
            "-o=jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason}";
        loop {
            let out = step!(kubectl(&self.kubectl, &["get", &pod, jsonpath], true, signals).await?);
            let text = out.stdout.trim().to_string();
            let (phase, reason) = text.split_once(' ').unwrap_or((&text, ""));
            match phase {
                "Running" | "Succeeded" | "Failed" if out.success => {
                    return Ok(StepEnd::Done(phase.to_string()));
                }
                _ => {}
            }
            if is_fatal_wait_reason(reason) {
                bail!(
                    "the sandbox {pod} cannot start: {reason} (kubectl describe {pod} says more)"
                );
            }
            if Instant::now() >= deadline {
                let why = if out.success {
                    format!("phase {phase:?} {reason}")
                } else {
                    brief(&out.stderr).to_string()
                };
                bail!(
                    "the sandbox {pod} did not start within {}: {} (kubectl describe {pod} says \
                     why; --kube-timeout waits longer)",
                    humantime::format_duration(self.timeout),
                    why.trim()
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                sig = signals.next() => return Ok(StepEnd::Signal(sig)),
            }
        }
    }

    /// The harness's terminal (`kubectl attach -it`) at a terminal, else its output as it comes
    /// (`kubectl logs -f`, from its start).
    async fn stream(&self, signals: &mut Signals) -> anyhow::Result<StepEnd<()>> {
        if self.tty {
            let pod = format!("pod/{}", self.name);
            let args = ["attach", "-it", &pod, "-c", "harness"];
            step!(kubectl(&self.kubectl, &args, false, signals).await?);
        } else {
            step!(kubectl(&self.kubectl, &self.logs_args(true), false, signals).await?);
        }
        Ok(StepEnd::Done(()))
    }

    fn logs_args(&self, follow: bool) -> Vec<&str> {
        let mut args = vec!["logs", self.name.as_str(), "-c", "harness"];
        if follow {
            args.push("-f");
        }
        args
    }

    /// The harness's exit code, once the Pod says it ended.
    async fn exit_code(&self, signals: &mut Signals) -> anyhow::Result<StepEnd<i32>> {
        let pod = format!("pod/{}", self.name);
        let jsonpath = "-o=jsonpath={.status.containerStatuses[0].state.terminated.exitCode}";
        let deadline = Instant::now() + self.timeout;
        loop {
            let out = step!(kubectl(&self.kubectl, &["get", &pod, jsonpath], true, signals).await?);
            if let (true, Ok(code)) = (out.success, out.stdout.trim().parse::<i32>()) {
                return Ok(StepEnd::Done(code));
            }
            if Instant::now() >= deadline {
                bail!(
                    "the sandbox {pod} gave no exit code within {} after its output ended: {}",
                    humantime::format_duration(self.timeout),
                    brief(&out.stderr)
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                sig = signals.next() => return Ok(StepEnd::Signal(sig)),
            }
        }
    }
}

/// What kubectl said, in brief: its last line (client-side logging comes first, one line per
/// retry; the message that says what failed is last).
fn brief(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(kubectl said nothing)")
}

/// Waiting reasons a container does not recover from by itself.
fn is_fatal_wait_reason(reason: &str) -> bool {
    matches!(
        reason,
        "ErrImagePull"
            | "ImagePullBackOff"
            | "InvalidImageName"
            | "ErrImageNeverPull"
            | "CreateContainerConfigError"
            | "CreateContainerError"
            | "RunContainerError"
    )
}

/// Delete a run's objects: by its manifests (`kubectl delete -f`), and by its label when that
/// fails or the manifests are gone. Signals are not waited for here: this is what they lead to.
async fn delete(k: &Kubectl, manifests: &Path, name: &str) -> anyhow::Result<()> {
    let file = manifests.to_string_lossy();
    let label = format!("{}={name}", corral_kube::LABEL_JAIL);
    let by_file = ["delete", "-f", &file, "--wait=false", "--ignore-not-found"];
    let by_label = [
        "delete",
        KINDS,
        "-l",
        &label,
        "--wait=false",
        "--ignore-not-found",
    ];
    let mut failed = Vec::new();
    if manifests.exists() {
        match delete_call(k, &by_file).await? {
            None => return Ok(()),
            Some(e) => failed.push(e),
        }
    }
    match delete_call(k, &by_label).await? {
        None => Ok(()),
        Some(e) => {
            failed.push(e);
            bail!(
                "cannot delete the objects of jail {name}: {}",
                failed.join("; ")
            )
        }
    }
}

/// One `kubectl delete`: `None` when it worked, else what it said.
async fn delete_call(k: &Kubectl, args: &[&str]) -> anyhow::Result<Option<String>> {
    let out = k
        .command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("cannot run {} {}", k.program.display(), args.join(" ")))?;
    Ok((!out.status.success()).then(|| {
        format!(
            "kubectl {}: {}",
            args.join(" "),
            brief(&String::from_utf8_lossy(&out.stderr))
        )
    }))
}

/// `corral down`: delete the objects of this project's kube runs that a killed corral left
/// (each run's directory names its context, namespace and name), and their directories. The
/// names of the jails removed.
pub fn down_leftovers(root: &Path) -> anyhow::Result<Vec<String>> {
    let dir = project_runs_dir(root)?;
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime that drives kubectl")?;
    let mut removed = Vec::new();
    let mut failed = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot read {}", dir.display()))?
            .path();
        // Each run on its own: a cluster out of reach keeps its runs' records, not the others'.
        match down_one(&rt, &path) {
            Ok(name) => removed.push(name),
            Err(e) => {
                eprintln!("corral: kube: {e:#}");
                failed.push(path);
            }
        }
    }
    let _ = std::fs::remove_dir(&dir);
    if !failed.is_empty() {
        bail!(
            "{} run(s) kept their objects and records (see above); run `corral down` again once \
             their cluster answers",
            failed.len()
        );
    }
    Ok(removed)
}

/// Delete the objects of the run recorded in `path`, then the record; the jail's name.
fn down_one(rt: &tokio::runtime::Runtime, path: &Path) -> anyhow::Result<String> {
    let record_path = path.join(RECORD);
    let text = std::fs::read_to_string(&record_path)
        .with_context(|| format!("cannot read {}", record_path.display()))?;
    let record: Record = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a kube run record", record_path.display()))?;
    rt.block_on(delete(&record.kubectl, &path.join(MANIFESTS), &record.name))?;
    std::fs::remove_dir_all(path).with_context(|| format!("cannot remove {}", path.display()))?;
    Ok(record.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_are_labels_that_fit_every_suffix() {
        let root = Path::new("/home/u/A Very_Long.Project-Name-That-Goes-On-And-On");
        let name = run_name(root, "674c3a1b-a1b2c3");
        assert_eq!(name, "corral-a-very-long-proje-674c3a1b-a1b2c3");
        assert!(name.len() <= 40, "{name}");
        let short = run_name(Path::new("/p/app"), "674c3a1b-a1b2c3");
        assert_eq!(short, "corral-app-674c3a1b-a1b2c3");
    }
}
