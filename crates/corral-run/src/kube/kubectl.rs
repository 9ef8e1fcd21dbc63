//! kubectl, the cluster's stable interface: `$CORRAL_KUBECTL`, else `kubectl` on PATH, with
//! `--context`/`--namespace` passed through (else kubectl's own defaults from KUBECONFIG). One
//! call at a time, stopped by the signals that end a run; the deletion of a run's objects.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The program run instead of `kubectl` from PATH.
pub const KUBECTL_ENV: &str = "CORRAL_KUBECTL";
/// The kinds a jail is made of, for the deletion by label.
const KINDS: &str = "pod,deployment,service,configmap,secret,networkpolicy";

/// How kubectl is run: the program and the flags every call gets.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Kubectl {
    pub(super) program: PathBuf,
    pub(super) context: Option<String>,
    pub(super) namespace: Option<String>,
}

impl Kubectl {
    pub(super) fn new(
        context: Option<String>,
        namespace: Option<String>,
    ) -> anyhow::Result<Kubectl> {
        Ok(Kubectl {
            program: kubectl_program()?,
            context,
            namespace,
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

/// How a step ended: by itself, or by a signal to corral (whose number).
pub(super) enum StepEnd<T> {
    Done(T),
    Signal(i32),
}

/// The signals that end a run: SIGINT, SIGTERM, SIGHUP.
pub(super) struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub(super) fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    pub(super) async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

/// What a kubectl call printed (when captured) and how it ended.
pub(super) struct Output {
    pub(super) success: bool,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// Run one kubectl call to its end, or until a signal comes (the call is then stopped with
/// SIGTERM, so an attached kubectl gives the terminal back). `capture`: its output is returned,
/// else it goes to corral's own stdio (the harness's terminal, its logs).
pub(super) async fn kubectl(
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

/// What kubectl said, in brief: its last line (client-side logging comes first, one line per
/// retry; the message that says what failed is last).
pub(super) fn brief(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(kubectl said nothing)")
}

/// Delete a run's objects: by its manifests (`kubectl delete -f`), and by its label when that
/// fails or the manifests are gone. Signals are not waited for here: this is what they lead to.
pub(super) async fn delete(k: &Kubectl, manifests: &Path, name: &str) -> anyhow::Result<()> {
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
