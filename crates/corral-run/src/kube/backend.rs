//! The Kubernetes backend of one run: apply, wait for the proxy and the sandbox, attach (or
//! stream), read the exit code, and delete the run's objects however it ended.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use corral_policy::plan::Plan;
use corral_session::{Backend, Baselined, Ended, Session};

use super::kubectl::{Kubectl, Signals, StepEnd, brief, delete, kubectl};
use super::rundir::RunDir;

/// How often the sandbox's phase is asked for while it starts or ends.
const POLL: Duration = Duration::from_millis(500);

/// The Kubernetes backend of one run.
pub(super) struct Kube {
    pub(super) kubectl: Kubectl,
    pub(super) dir: RunDir,
    pub(super) name: String,
    pub(super) proxied: bool,
    pub(super) timeout: Duration,
    pub(super) tty: bool,
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
