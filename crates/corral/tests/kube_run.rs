//! `corral run --engine kube` without a cluster: a test `kubectl` (a script in the test's
//! directory, named by `CORRAL_KUBECTL`) records every call and the manifests it is given, and
//! answers `apply`, `wait`, `get`, `logs`, `attach` and `delete` as a cluster would. The tests
//! check that what is applied is exactly what `corral kube render` prints for the run (and
//! validates strictly when kubernetes-validate is installed), that the harness's exit code
//! comes back, and that the run's objects are deleted on exit, on SIGTERM and SIGINT to corral,
//! after a failed apply or wait, and by `corral down` after corral was killed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The Kubernetes release the manifests are built for (k8s-openapi's `v1_35`).
const KUBERNETES_VERSION: &str = "1.35.0";

/// The test kubectl. Global flags first (`--context`, `--namespace`), as corral passes them.
/// `SHIM_FAIL=apply|wait|delete-f` makes that call fail; `SHIM_PHASE` is the sandbox's phase;
/// `SHIM_EXIT` its exit code; `SHIM_HANG=1` keeps the harness's output streaming (the shim
/// becomes `sleep`, its pid in `streaming`) until corral stops it.
const SHIM: &str = r#"#!/bin/bash
d="$SHIM_DIR"
printf '%s\n' "$*" >> "$d/calls"
while [[ "$1" == --context || "$1" == --namespace ]]; do shift 2; done
case "$1" in
  apply)
    if [[ "$SHIM_FAIL" == apply ]]; then
      echo 'error: resource mapping not found for name: "x": no matches for kind "Pod"' >&2; exit 1
    fi
    n=$(ls "$d" | grep -c '^applied-')
    cp "$3" "$d/applied-$n.yaml"; echo applied >> "$d/state"; echo "pod/x created";;
  wait)
    if [[ "$SHIM_FAIL" == wait ]]; then
      echo 'error: timed out waiting for the condition on deployments/x' >&2; exit 1
    fi
    echo "deployment.apps/x condition met";;
  get)
    case "$3" in
      *phase*) printf '%s' "${SHIM_PHASE:-Running}";;
      *exitCode*) printf '%s' "${SHIM_EXIT:-0}";;
      *) echo "unexpected get: $*" >&2; exit 1;;
    esac;;
  logs|attach)
    echo "output of the harness"
    if [[ -n "$SHIM_HANG" ]]; then echo $$ > "$d/streaming.tmp"; mv "$d/streaming.tmp" "$d/streaming"; exec sleep 600; fi;;
  delete)
    if [[ "$SHIM_FAIL" == delete-f && "$2" == -f ]]; then
      echo 'error: the server is currently unable to handle the request' >&2; exit 1
    fi
    echo "deleted" >> "$d/state";;
  *) echo "unexpected call: $*" >&2; exit 1;;
esac
"#;

fn corral_bin() -> PathBuf {
    std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")))
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A project (a git root, with a masked file), a home, and the test kubectl; removed on drop.
struct Fixture {
    root: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!("corral-kuberun-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proj/.git")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        std::fs::create_dir_all(root.join("shim")).unwrap();
        std::fs::write(root.join("proj/.env"), "TOKEN=x\n").unwrap();
        let shim = root.join("kubectl");
        std::fs::write(&shim, SHIM).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        Fixture { root }
    }

    fn shim_dir(&self) -> PathBuf {
        self.root.join("shim")
    }

    fn corral(&self, args: &[&str]) -> Command {
        let mut c = Command::new(corral_bin());
        c.args(args)
            .current_dir(self.root.join("proj"))
            .env("HOME", self.root.join("home"))
            .env("XDG_CONFIG_HOME", self.root.join("home/.config"))
            .env("XDG_STATE_HOME", self.root.join("home/.state"))
            .env("CORRAL_KUBECTL", self.root.join("kubectl"))
            .env("SHIM_DIR", self.shim_dir())
            .stdin(Stdio::null());
        c
    }

    /// `corral run --engine kube` with the proxy and the options every test uses.
    fn run(&self, extra: &[&str], cmd: &[&str]) -> Command {
        let mut args = vec![
            "run",
            "--engine",
            "kube",
            "--network",
            "proxy",
            "--allow",
            "api.example.com",
            "--proxy-ip",
            "10.96.0.50",
            "--pids-by-node",
            "--context",
            "ctx-a",
            "--namespace",
            "agents",
        ];
        args.extend(extra);
        args.push("--");
        args.extend(cmd);
        self.corral(&args)
    }

    /// Every kubectl call, one line each, the jail's name as NAME and the run's directory as
    /// RUNDIR.
    fn calls(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.shim_dir().join("calls")).unwrap_or_default();
        let (Some(name), Some(dir)) = (self.jail_name(), self.applied_dir()) else {
            return text.lines().map(String::from).collect();
        };
        text.lines()
            .map(|l| {
                l.replace(&dir.display().to_string(), "RUNDIR")
                    .replace(&name, "NAME")
            })
            .collect()
    }

    /// The manifests the test kubectl was given to apply.
    fn applied(&self) -> String {
        std::fs::read_to_string(self.shim_dir().join("applied-0.yaml"))
            .expect("nothing was applied")
    }

    /// The jail's name, read from the first `apply -f .../NAME/jail.yaml`.
    fn jail_name(&self) -> Option<String> {
        let dir = self.applied_dir()?;
        Some(dir.file_name()?.to_string_lossy().into_owned())
    }

    /// The run's directory (`kube/<project key>/<name>` under the state directory), read from
    /// the first `apply -f`.
    fn applied_dir(&self) -> Option<PathBuf> {
        let text = std::fs::read_to_string(self.shim_dir().join("calls")).ok()?;
        let line = text.lines().find(|l| l.contains("apply -f "))?;
        Some(Path::new(line.rsplit(' ').next()?).parent()?.to_path_buf())
    }

    fn run_dir(&self, name: &str) -> PathBuf {
        let dir = self.applied_dir().expect("nothing was applied");
        assert!(dir.ends_with(name));
        assert!(dir.starts_with(self.root.join("home/.state/corral/kube")));
        dir
    }

    fn state(&self) -> String {
        std::fs::read_to_string(self.shim_dir().join("state")).unwrap_or_default()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // A harness `sleep` a killed corral left.
        if let Ok(pid) = std::fs::read_to_string(self.shim_dir().join("streaming")) {
            let _ = Command::new("kill")
                .arg(pid.trim())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The calls of a whole run in network mode proxy, after `head` (the apply and what follows).
fn whole_run(delete: &[&str]) -> Vec<String> {
    let g = "--context ctx-a --namespace agents";
    let mut v = vec![
        format!("{g} apply -f RUNDIR/jail.yaml"),
        format!("{g} wait --for=condition=Available deployment/NAME-proxy --timeout=120s"),
        format!(
            "{g} get pod/NAME -o=jsonpath={{.status.phase}} {{.status.containerStatuses[0].state.waiting.reason}}"
        ),
        format!("{g} logs NAME -c harness -f"),
        format!(
            "{g} get pod/NAME -o=jsonpath={{.status.containerStatuses[0].state.terminated.exitCode}}"
        ),
    ];
    v.extend(delete.iter().map(|d| format!("{g} {d}")));
    v
}

const DELETE_F: &str = "delete -f RUNDIR/jail.yaml --wait=false --ignore-not-found";
const DELETE_L: &str = "delete pod,deployment,service,configmap,secret,networkpolicy -l corral.dev/jail=NAME --wait=false --ignore-not-found";

#[test]
fn a_run_applies_the_rendered_jail_returns_the_exit_code_and_deletes_it() {
    let f = Fixture::new();
    let out = f
        .run(&["--kube-timeout", "120s"], &["sh", "-c", "exit 7"])
        .env("SHIM_EXIT", "7")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert_eq!(f.calls(), whole_run(&[DELETE_F]), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("output of the harness"),
        "{}",
        text(&out)
    );
    let name = f.jail_name().unwrap();
    assert!(
        !f.run_dir(&name).exists(),
        "the run's directory stayed after its objects were deleted"
    );
    // Exactly what `corral kube render` prints for the same options and name (the plan of
    // engine kube: the host's toolchains are not on the Pod's PATH).
    let rendered = f
        .corral(&[
            "kube",
            "render",
            "--engine",
            "kube",
            "--network",
            "proxy",
            "--allow",
            "api.example.com",
            "--proxy-ip",
            "10.96.0.50",
            "--pids-by-node",
            "-n",
            "agents",
            "--name",
            &name,
            "--project-claim",
            "corral-proj-project",
            "--",
            "sh",
            "-c",
            "exit 7",
        ])
        .output()
        .unwrap();
    assert!(rendered.status.success(), "{}", text(&rendered));
    // Without a terminal (stdin is /dev/null here) the harness gets none and no stdin: render's
    // defaults are for `kubectl attach -it`.
    let rendered = String::from_utf8(rendered.stdout).unwrap();
    let interactive = "    stdin: true\n    tty: true\n";
    assert_eq!(rendered.matches(interactive).count(), 1, "{rendered}");
    let rendered = rendered.replace(interactive, "    stdin: false\n    tty: false\n");
    similar_asserts::assert_eq!(f.applied(), rendered);
    // The project is said to come from its claim, the checks that cannot be made said so.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PersistentVolumeClaim corral-proj-project"),
        "{err}"
    );
    assert!(err.contains("not made for this run"), "{err}");
    if let Some(bin) = validator() {
        let file = f.root.join("applied.yaml");
        std::fs::write(&file, f.applied()).unwrap();
        let (ok, text) = validate(&bin, &file);
        assert!(ok, "kubernetes-validate --strict refused:\n{text}");
        for kind in [
            "pod/",
            "networkpolicy/",
            "configmap/",
            "deployment/",
            "service/",
        ] {
            assert!(text.contains(kind), "no {kind} validated:\n{text}");
        }
    } else {
        eprintln!("kubernetes-validate not found: the applied manifests were not validated");
    }
}

#[test]
fn each_run_has_its_own_names() {
    let f = Fixture::new();
    let g = Fixture::new();
    for fx in [&f, &g] {
        let out = fx.run(&[], &["true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let (a, b) = (f.jail_name().unwrap(), g.jail_name().unwrap());
    assert_ne!(a, b);
    for name in [&a, &b] {
        assert!(
            name.starts_with("corral-proj-") && name.len() <= 40,
            "{name}"
        );
    }
}

#[test]
fn a_failed_apply_is_an_error_and_deletes_what_it_may_have_made() {
    let f = Fixture::new();
    let out = f
        .run(&[], &["true"])
        .env("SHIM_FAIL", "apply")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kubectl apply -f") && err.contains("no matches for kind"),
        "{err}"
    );
    let calls = f.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[1].ends_with(DELETE_F), "{calls:?}");
}

#[test]
fn a_proxy_that_never_becomes_available_is_an_error_and_the_jail_is_deleted() {
    let f = Fixture::new();
    let out = f
        .run(&[], &["true"])
        .env("SHIM_FAIL", "wait")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("was not available within") && err.contains("timed out waiting"),
        "{err}"
    );
    let calls = f.calls();
    assert_eq!(
        calls.last().map(|c| c.ends_with(DELETE_F)),
        Some(true),
        "{calls:?}"
    );
    assert!(f.state().contains("deleted"), "{calls:?}");
}

#[test]
fn a_sandbox_that_cannot_pull_its_image_fails_at_once_and_is_deleted() {
    let f = Fixture::new();
    let out = f
        .run(&[], &["true"])
        .env("SHIM_PHASE", "Pending ErrImagePull")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot start: ErrImagePull"), "{err}");
    assert!(f.calls().last().unwrap().ends_with(DELETE_F));
}

#[test]
fn a_sandbox_that_stays_pending_times_out_with_a_clear_error() {
    let f = Fixture::new();
    let out = f
        .run(&["--kube-timeout", "1s"], &["true"])
        .env("SHIM_PHASE", "Pending ContainerCreating")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("did not start within 1s") && err.contains("ContainerCreating"),
        "{err}"
    );
    assert!(f.calls().last().unwrap().ends_with(DELETE_F));
}

/// Start a run whose harness keeps streaming; return once it streams.
fn streaming_run(f: &Fixture) -> Child {
    let mut child = f
        .run(&[], &["sleep", "600"])
        .env("SHIM_HANG", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let marker = f.shim_dir().join("streaming");
    let give_up = Instant::now() + Duration::from_secs(120);
    while !marker.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("corral ended before the harness streamed: {status:?}\n{err}");
        }
        assert!(Instant::now() < give_up, "the harness never streamed");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn signal_deletes_the_jail(sig: i32) {
    let f = Fixture::new();
    let mut child = streaming_run(&f);
    let streamer: i32 = std::fs::read_to_string(f.shim_dir().join("streaming"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(128 + sig), "{err}");
    let calls = f.calls();
    assert!(
        calls.last().unwrap().ends_with(DELETE_F),
        "no delete after signal {sig}: {calls:?}\n{err}"
    );
    // The streaming kubectl was stopped, not left behind.
    assert!(
        !Path::new(&format!("/proc/{streamer}")).exists(),
        "kubectl (pid {streamer}) still runs after corral ended"
    );
    let name = f.jail_name().unwrap();
    assert!(!f.run_dir(&name).exists(), "{err}");
}

#[test]
fn sigterm_to_corral_deletes_the_jail() {
    signal_deletes_the_jail(libc::SIGTERM);
}

#[test]
fn sigint_to_corral_deletes_the_jail() {
    signal_deletes_the_jail(libc::SIGINT);
}

#[test]
fn sighup_to_corral_deletes_the_jail() {
    signal_deletes_the_jail(libc::SIGHUP);
}

#[test]
fn corral_down_deletes_what_a_killed_run_left_by_label_when_the_manifests_fail() {
    let f = Fixture::new();
    let mut child = streaming_run(&f);
    child.kill().unwrap();
    child.wait().unwrap();
    let name = f.jail_name().unwrap();
    assert!(f.run_dir(&name).join("jail.yaml").exists());
    assert!(!f.state().contains("deleted"), "{:?}", f.calls());
    let before = f.calls().len();
    // The manifests' deletion fails (an API server hiccup): the label's deletion follows.
    let out = f
        .corral(&["down", "--engine", "kube"])
        .env("SHIM_FAIL", "delete-f")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let g = "--context ctx-a --namespace agents";
    assert_eq!(
        f.calls()[before..],
        [format!("{g} {DELETE_F}"), format!("{g} {DELETE_L}")],
        "{}",
        text(&out)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(&name));
    assert!(!f.run_dir(&name).exists(), "{}", text(&out));
    // Nothing left: a second `down` calls nothing.
    let out = f.corral(&["down", "--engine", "kube"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(f.calls().len(), before + 2);
}

#[test]
fn kube_options_without_the_kube_engine_and_scratch_are_refused() {
    let f = Fixture::new();
    let out = f
        .corral(&["run", "--proxy-ip", "10.96.0.50", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--proxy-ip apply to --engine kube only"),
        "{}",
        text(&out)
    );
    let out = f
        .corral(&["run", "--engine", "kube", "--scratch", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--scratch cannot run on Kubernetes"),
        "{}",
        text(&out)
    );
    let out = f.corral(&["shell", "--engine", "kube"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("runs from `corral run` only"),
        "{}",
        text(&out)
    );
    // A policy file cannot send runs to a cluster.
    std::fs::write(
        f.root.join("proj/corral.toml"),
        "[run]\nengine = \"kube\"\n",
    )
    .unwrap();
    let out = f.corral(&["run", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown variant `kube`"),
        "{}",
        text(&out)
    );
    assert!(!f.shim_dir().join("calls").exists(), "kubectl was called");
}

/// `kubernetes-validate`: $CORRAL_KUBERNETES_VALIDATE, the CI's venv, else PATH; one this user
/// can run (the CI's venv is root's).
fn validator() -> Option<PathBuf> {
    let found = if let Some(p) = std::env::var_os("CORRAL_KUBERNETES_VALIDATE") {
        Some(PathBuf::from(p))
    } else if Path::new("/opt/corral-ci-kube/bin/kubernetes-validate").exists() {
        Some(PathBuf::from("/opt/corral-ci-kube/bin/kubernetes-validate"))
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("kubernetes-validate"))
                .find(|p| p.exists())
        })
    }?;
    let runs = Command::new(&found)
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        eprintln!("{} does not run for this user", found.display());
    }
    runs.then_some(found)
}

fn validate(bin: &Path, file: &Path) -> (bool, String) {
    let out = Command::new(bin)
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .arg(file)
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

// ---- podman kube play as the cluster ------------------------------------------------------------

/// A kubectl that plays the manifests with `podman kube play` (which ignores NetworkPolicy and
/// Services; the runs below use network mode none, so there is no proxy to play). `SHIM_NODE`
/// is the node-files directory (its seccomp.json is the Localhost profile).
const PODMAN_SHIM: &str = r#"#!/bin/bash
d="$SHIM_DIR"
printf '%s\n' "$*" >> "$d/calls"
while [[ "$1" == --context || "$1" == --namespace ]]; do shift 2; done
state() { podman inspect "$1-harness" --format '{{.State.Status}} {{.State.ExitCode}}' 2>/dev/null; }
case "$1" in
  apply)
    cp "$3" "$d/applied-0.yaml"
    exec podman kube play --network none --seccomp-profile-root "$SHIM_NODE" "$3";;
  get)
    name="${2#pod/}"; read -r status code <<< "$(state "$name")"
    case "$3" in
      *phase*)
        case "$status" in
          running) printf Running;;
          exited|stopped) if [[ "$code" == 0 ]]; then printf Succeeded; else printf Failed; fi;;
          *) printf Pending;;
        esac;;
      *exitCode*) [[ "$status" == exited || "$status" == stopped ]] && printf '%s' "$code";;
    esac;;
  logs)
    # `logs NAME -c harness [-f]`: followed while the harness runs, else what it wrote.
    if [[ "$5" == -f ]]; then exec podman logs -f "$2-harness"; fi
    exec podman logs "$2-harness";;
  delete)
    if [[ "$2" == -f ]]; then name=$(basename "$(dirname "$3")"); else name="${4#corral.dev/jail=}"; fi
    podman pod rm -f "$name" >/dev/null || exit 1
    podman volume ls -q | grep "^$name-" | xargs -r podman volume rm >/dev/null
    echo "deleted" >> "$d/state";;
  *) echo "unexpected call: $*" >&2; exit 1;;
esac
"#;

/// What the escape suite needs on the host: a secret file outside the project, a process with
/// a marker in its environment, services on loopback, on every address and on an abstract
/// socket. Each must be out of the sandbox's reach.
struct HostTargets {
    secret: PathBuf,
    outside: PathBuf,
    marker: String,
    process: Child,
    lo: std::net::TcpListener,
    any: std::net::TcpListener,
    abs: std::os::unix::net::UnixListener,
    abstract_name: String,
}

impl HostTargets {
    fn new(f: &Fixture) -> HostTargets {
        let secret = f.root.join("host-secret.txt");
        std::fs::write(&secret, "HOSTSECRET\n").unwrap();
        let marker = format!("HOSTENV-{}", f.root.file_name().unwrap().to_string_lossy());
        let process = Command::new("sleep")
            .arg("300")
            .env("HOST_ONLY_SECRET", &marker)
            .spawn()
            .unwrap();
        let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let any = std::net::TcpListener::bind("[::]:0").unwrap();
        let abstract_name = format!("corral-kuberun-{}", marker);
        let abs = {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
                .unwrap();
            std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
        };
        lo.set_nonblocking(true).unwrap();
        any.set_nonblocking(true).unwrap();
        abs.set_nonblocking(true).unwrap();
        HostTargets {
            secret,
            outside: f.root.join("created-from-inside"),
            marker,
            process,
            lo,
            any,
            abs,
            abstract_name,
        }
    }

    /// The suite's arguments (no host addresses: the Pod has no network to reach them by).
    fn args(&self) -> Vec<String> {
        vec![
            self.secret.display().to_string(),
            self.outside.display().to_string(),
            self.process.id().to_string(),
            self.marker.clone(),
            self.lo.local_addr().unwrap().port().to_string(),
            self.any.local_addr().unwrap().port().to_string(),
            self.abstract_name.clone(),
            "127.0.0.2".into(),
        ]
    }

    /// Nothing reached the host: the process lives, no service got a connection, no file.
    fn untouched(mut self) {
        assert!(
            self.process.try_wait().unwrap().is_none(),
            "the sandbox killed a host process"
        );
        let _ = self.process.kill();
        let _ = self.process.wait();
        assert!(
            self.lo.accept().is_err(),
            "the host loopback service got a connection"
        );
        assert!(
            self.any.accept().is_err(),
            "a host service got a connection"
        );
        assert!(
            self.abs.accept().is_err(),
            "the host abstract socket got a connection"
        );
        assert!(!self.outside.exists(), "the sandbox created a host file");
    }
}

impl Drop for HostTargets {
    /// The host process ends with the test, whether or not `untouched` was reached.
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Whether podman and the CI harness image are here (as root: the Pod runs as uid 65534 on the
/// host's files).
fn podman_ready() -> bool {
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if !root {
        eprintln!("SKIP: podman kube play runs as root in CI (the Pod's uid must own the project)");
        return false;
    }
    let ok = Command::new("podman")
        .args(["image", "exists", HARNESS_IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: podman or {HARNESS_IMAGE} is missing (ci/podman-setup.sh makes it)");
    }
    ok
}

const HARNESS_IMAGE: &str = "localhost/corral-ci-harness:latest";

/// The rendered sandbox Pod, played by `podman kube play` (`--node-files`: podman ignores
/// subPath), runs the native jail's escape suite (tests/engine_escape/suite.py, as the podman
/// backend's test runs it): every attack fails as it does in the podman backend's harness
/// container. The suite's network attacks meet podman's network none here, standing in for the
/// NetworkPolicies podman does not enforce: they say nothing about the policies.
/// Run the escape suite in the sandbox Pod played by podman, with `extra` options; corral's
/// output, and the manifests applied. Nothing of the jail is left in podman afterwards.
fn escape_suite_in_a_played_pod(
    f: &Fixture,
    host: &HostTargets,
    extra: &[&str],
) -> (Output, String) {
    std::fs::write(f.root.join("kubectl"), PODMAN_SHIM).unwrap();
    let node = f.root.join("node");
    let suite = include_str!("engine_escape/suite.py");
    let mut args = vec![
        "run",
        "--engine",
        "kube",
        "--network",
        "none",
        "--pids-by-node",
        "--project-hostpath",
        "--node-files",
        node.to_str().unwrap(),
        "--image",
        HARNESS_IMAGE,
    ];
    args.extend(extra);
    args.extend(["--", "/usr/bin/python3", "-c", suite]);
    let suite_args = host.args();
    args.extend(suite_args.iter().map(String::as_str));
    let out = f.corral(&args).env("SHIM_NODE", &node).output().unwrap();
    let t = text(&out);
    let name = f
        .jail_name()
        .unwrap_or_else(|| panic!("nothing was applied: {t}"));
    let pods = Command::new("podman")
        .args(["pod", "exists", &name])
        .status()
        .unwrap();
    assert!(!pods.success(), "the Pod {name} is left: {t}");
    let vols = Command::new("podman")
        .args(["volume", "ls", "-q"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&vols.stdout)
            .lines()
            .any(|v| v.starts_with(&name)),
        "volumes of {name} are left"
    );
    let applied = f.applied();
    std::fs::remove_file(f.shim_dir().join("calls")).unwrap();
    (out, applied)
}

/// The rendered sandbox Pod, played by `podman kube play` (`--node-files`: podman ignores
/// subPath), runs the native jail's escape suite (tests/engine_escape/suite.py, as the podman
/// backend's test runs it): every attack fails as it does in the podman backend's harness
/// container. The suite's network attacks meet podman's network none here, standing in for the
/// NetworkPolicies podman does not enforce: they say nothing about the policies. Control: under
/// the runtime's default seccomp profile instead of corral's, the suite sees the attacks work
/// that corral's filter stops (podman's profile lets `unshare` through).
#[test]
fn the_escape_suite_fails_in_the_sandbox_pod_played_by_podman() {
    if !podman_ready() {
        return;
    }
    let f = Fixture::new();
    let proj = f.root.join("proj");
    // The Pod runs as 65534 (the caller is root): the project is its to write.
    std::os::unix::fs::chown(&proj, Some(65534), Some(65534)).unwrap();
    let host = HostTargets::new(&f);
    let (out, applied) = escape_suite_in_a_played_pod(&f, &host, &[]);
    let t = text(&out);
    assert!(!applied.contains("subPath"), "{applied}");
    if let Some(bin) = validator() {
        let file = f.root.join("played.yaml");
        std::fs::write(&file, &applied).unwrap();
        let (ok, text) = validate(&bin, &file);
        assert!(ok, "kubernetes-validate --strict refused:\n{text}");
    }
    assert_eq!(out.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert!(stdout.ends_with("END\n"), "the suite did not finish:\n{t}");
    let escapes: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("ok:")).collect();
    assert_eq!(escapes, ["END"], "{t}");
    assert!(stdout.lines().count() > 50, "{t}");
    for name in [
        "read-host-secret",
        "write-policy",
        "host-environment",
        "userns",
        "seccomp-unshare",
        "tiocsti",
        "af-packet",
        "chmod-setuid",
        "seccomp-fchmodat2",
        "seccomp-ptrace",
        "seccomp-io_uring_setup",
    ] {
        let line = format!("ok:{name}");
        assert!(
            stdout
                .lines()
                .any(|l| l.split(' ').next() == Some(line.as_str())),
            "{name} did not run:\n{t}"
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(proj.join("setid.bin"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "a set-id file reached the host: {mode:o}");
    assert!(!proj.join("setid2.bin").exists(), "{t}");
    // Control: the same Pod under the runtime's default profile.
    let (out, _) = escape_suite_in_a_played_pod(&f, &host, &["--seccomp", "runtime-default"]);
    let stdout = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("ESCAPE:seccomp-unshare")),
        "the control found nothing: the suite cannot tell\n{}",
        text(&out)
    );
    host.untouched();
}

/// At a terminal the harness gets one (the Pod's `tty`/`stdin`) and corral attaches to it
/// (`kubectl attach -it`) instead of reading its log.
#[test]
fn at_a_terminal_corral_attaches_to_the_harness() {
    let f = Fixture::new();
    let corral = corral_bin();
    let line = format!(
        "{} run --engine kube --network none --pids-by-node -- sh -c true",
        corral.display()
    );
    let cmd = f.corral(&[]);
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(f.root.join("proj"))
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let calls = f.calls();
    assert!(
        calls.iter().any(|c| c == "attach -it pod/NAME -c harness"),
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c.starts_with("logs")), "{calls:?}");
    assert!(f.applied().contains("    stdin: true\n    tty: true\n"));
}

/// `--node-files` manifests are valid Kubernetes too (hostPath files, the seccomp annotation
/// agreeing with the field), and name no subPath; without `--project-hostpath` it is refused.
#[test]
fn node_files_manifests_validate_strictly() {
    let f = Fixture::new();
    let node = f.root.join("node");
    let render = |extra: &[&str]| {
        let mut args = vec![
            "kube",
            "render",
            "--engine",
            "kube",
            "--network",
            "none",
            "--pids-by-node",
            "--node-files",
            node.to_str().unwrap(),
        ];
        args.extend(extra);
        args.extend(["--", "sh", "-c", "true"]);
        f.corral(&args).output().unwrap()
    };
    let out = render(&[]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--project-hostpath"),
        "{}",
        text(&out)
    );
    let out = render(&["--project-hostpath"]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(!yaml.contains("subPath"), "{yaml}");
    assert!(
        yaml.contains("seccomp.security.alpha.kubernetes.io/pod: localhost/seccomp.json"),
        "{yaml}"
    );
    let Some(bin) = validator() else {
        eprintln!("SKIP: kubernetes-validate not found");
        return;
    };
    let file = f.root.join("node.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let (ok, text) = validate(&bin, &file);
    assert!(ok, "kubernetes-validate --strict refused:\n{text}\n{yaml}");
}

/// `[secrets]` in a kube run: the applied manifests are render's with the run CA, the real value
/// only in the proxy's Secret (no other object holds it or the CA's key), the sandbox a
/// placeholder; the Secret goes with the rest when the run ends, and so does the run's 0600
/// copy of the manifests.
#[test]
fn a_run_with_secrets_applies_them_only_in_the_proxys_secret_and_deletes_them() {
    const REAL: &str = "sk-test-REALkeyREALkeyREALkey0123456789abc";
    let f = Fixture::new();
    std::fs::write(
        f.root.join("proj/corral.toml"),
        "[network]\nmode = \"proxy\"\n\n[secrets]\n\
         API_TOKEN = { from_env = \"CALLER_TOKEN\", hosts = [\"api.example.com\"] }\n",
    )
    .unwrap();
    let out = f.corral(&["trust"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = f
        .run(&[], &["sh", "-c", "exit 0"])
        .env("CALLER_TOKEN", REAL)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("REALkeyREALkey"), "{}", text(&out));
    assert_eq!(f.calls(), whole_run(&[DELETE_F]), "{}", text(&out));
    let name = f.jail_name().unwrap();
    assert!(!f.run_dir(&name).exists(), "the run's manifests stayed");
    let applied = f.applied();
    let mut secrets = 0;
    for doc in serde_yaml_ng::Deserializer::from_str(&applied) {
        let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(doc).unwrap();
        let doc_text = serde_yaml_ng::to_string(&v).unwrap();
        if v["kind"] == "Secret"
            && v["metadata"]["name"] == format!("{name}-proxy-secrets").as_str()
        {
            secrets += 1;
            assert!(doc_text.contains(REAL) && doc_text.contains("PRIVATE KEY"));
            continue;
        }
        assert!(
            !doc_text.contains("REALkeyREALkey") && !doc_text.contains("PRIVATE KEY"),
            "outside the proxy's Secret:\n{doc_text}"
        );
    }
    assert_eq!(secrets, 1, "{applied}");
    assert!(
        applied.contains("name: API_TOKEN"),
        "no placeholder:\n{applied}"
    );
}
