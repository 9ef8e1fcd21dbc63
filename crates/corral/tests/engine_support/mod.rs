//! Shared by the container-backend tests (engine_containers.rs, engine_secrets.rs,
//! session_lifecycle.rs): the engine a test runs on and where podman's and docker's CLIs differ,
//! `on_every_engine!`, and one test's world of engine objects and files.
//!
//! Needs root and the image `localhost/corral-ci-harness:latest` in each engine
//! (ci/podman-setup.sh, ci/docker-setup.sh); `Engine::ready` says when a machine cannot run them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

pub const IMAGE: &str = "localhost/corral-ci-harness:latest";

pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// An output's exit code, stdout and stderr, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The engine a test runs on, and where the two CLIs differ.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Engine {
    Podman,
    Docker,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Podman => "podman",
            Engine::Docker => "docker",
        }
    }

    pub fn cli(self, args: &[&str]) -> Output {
        Command::new(self.name())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{} runs: {e}", self.name()))
    }

    pub fn ok(self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "{} {args:?} failed: {}",
            self.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether this machine can run the test on this engine (installed, with the host `tools`
    /// the test also needs, as root, with the image); prints why not. An installed engine
    /// without the image is a setup error, not a skip.
    pub fn ready(self, tools: &[&str]) -> bool {
        let setup = match self {
            Engine::Podman => "ci/podman-setup.sh",
            Engine::Docker => "ci/docker-setup.sh",
        };
        if on_path(self.name()).is_none() {
            eprintln!(
                "skipping: {} is not installed ({setup} installs it)",
                self.name()
            );
            return false;
        }
        if let Some(tool) = tools.iter().find(|t| on_path(t).is_none()) {
            eprintln!("skipping: {tool} is not installed");
            return false;
        }
        if !is_root() {
            eprintln!(
                "skipping: run as root (CI does); a rootless engine on this host's cgroup v1 cannot enforce the plan's limits"
            );
            return false;
        }
        let image = match self {
            Engine::Podman => self.cli(&["image", "exists", IMAGE]),
            Engine::Docker => self.cli(&["image", "inspect", IMAGE]),
        };
        assert!(
            image.status.success(),
            "{} is installed but {IMAGE} is missing (or its daemon is down): run {setup} first: {}",
            self.name(),
            String::from_utf8_lossy(&image.stderr)
        );
        true
    }

    /// Removes containers at once (podman's `--time 0`; docker's `--force` kills).
    pub fn rm_force(self, names: &[&str]) -> Output {
        let mut args = vec!["rm", "--force"];
        if self == Engine::Podman {
            args.extend(["--time", "0"]);
        }
        args.extend(names);
        self.cli(&args)
    }

    pub fn container_exists(self, name: &str) -> bool {
        self.cli(&["container", "inspect", name]).status.success()
    }

    /// The subnet of a network, as `network inspect` formats it on this engine.
    pub fn subnet(self, network: &str) -> String {
        let format = match self {
            Engine::Podman => "{{range .Subnets}}{{.Subnet}}{{end}}",
            Engine::Docker => "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
        };
        self.ok(&["network", "inspect", "--format", format, network])
            .trim()
            .to_string()
    }

    /// podman-compose or docker-compose.
    pub fn compose(self) -> PathBuf {
        match self {
            Engine::Podman => std::env::var_os("CORRAL_CI_PODMAN_COMPOSE")
                .map(PathBuf::from)
                .or_else(|| {
                    let venv = Path::new("/opt/corral-ci-venv/bin/podman-compose");
                    venv.exists().then(|| venv.to_path_buf())
                })
                .or_else(|| on_path("podman-compose"))
                .expect("podman-compose is missing: run ci/podman-setup.sh"),
            Engine::Docker => on_path("docker-compose")
                .expect("docker-compose is missing: run ci/docker-setup.sh"),
        }
    }
}

/// Each test once per engine: `podman::NAME` and `docker::NAME` call `NAME(Engine)` of the
/// test file (which has `Engine` in scope).
macro_rules! on_every_engine {
    ($($test:ident),* $(,)?) => {
        mod podman {
            $(#[test]
            fn $test() {
                super::$test(super::Engine::Podman)
            })*
        }
        mod docker {
            $(#[test]
            fn $test() {
                super::$test(super::Engine::Docker)
            })*
        }
    };
}
pub(crate) use on_every_engine;

/// One test's world: a unique prefix for every engine object, a project, a state directory;
/// whatever the test leaves on the engine is removed on drop (passed or not).
pub struct World {
    pub engine: Engine,
    pub dir: tempfile::TempDir,
    pub prefix: String,
    pub project: PathBuf,
    pub state: PathBuf,
}

impl World {
    /// `tag` tells the tests of a file apart in the prefix (`c` + engine initial + tag + pid +
    /// a counter).
    pub fn new(engine: Engine, tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let prefix = format!(
            "c{}{}{}{}",
            &engine.name()[..1],
            tag,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new()
            .prefix("corral-engine-test-")
            .tempdir()
            .unwrap();
        let project = dir.path().join(format!("{prefix}-proj"));
        std::fs::create_dir_all(&project).unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        World {
            engine,
            dir,
            prefix,
            project,
            state,
        }
    }

    /// corral with `args` in `dir`, with the world's state, config and prefix, stdin closed.
    pub fn command_in(&self, dir: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_corral"));
        c.args(args)
            .current_dir(dir)
            .env("XDG_STATE_HOME", &self.state)
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("CORRAL_ENGINE_PREFIX", &self.prefix)
            .stdin(Stdio::null());
        if std::env::var_os("CORRAL_CONTAINER_BIN").is_none() {
            // The test binary is dynamically linked; the CI image has this host's glibc.
            c.env("CORRAL_CONTAINER_BIN", env!("CARGO_BIN_EXE_corral"));
        }
        c
    }

    /// corral with `args` in the project.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_in(&self.project, args)
    }

    /// corral with `args` in the project, run to its end.
    pub fn corral(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("corral runs")
    }

    pub fn key(&self) -> String {
        corral_audit::project_key(&self.project)
    }

    pub fn audit(&self) -> String {
        std::fs::read_to_string(
            self.state
                .join("corral")
                .join(self.key())
                .join("audit.jsonl"),
        )
        .unwrap_or_default()
    }

    /// The names of the project's containers (every one corral made carries its label).
    pub fn containers(&self) -> Vec<String> {
        let label = format!("label=corral.project={}", self.key());
        self.engine
            .ok(&["ps", "--all", "--filter", &label, "--format", "{{.Names}}"])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }

    /// Names of this test's containers (and pods) and networks still present.
    pub fn leftovers(&self) -> (Vec<String>, Vec<String>) {
        let e = self.engine;
        let pods = match e {
            Engine::Podman => e.ok(&["pod", "ls", "--format", "{{.Name}}"]),
            Engine::Docker => String::new(),
        };
        let networks = e.ok(&["network", "ls", "--format", "{{.Name}}"]);
        (
            self.containers()
                .into_iter()
                .chain(
                    pods.lines()
                        .filter(|p| p.contains(&self.prefix))
                        .map(String::from),
                )
                .collect(),
            networks
                .lines()
                .filter(|n| n.starts_with(&self.prefix))
                .map(String::from)
                .collect(),
        )
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Whatever a failed assertion left behind: containers, networks, volumes, images.
        let e = self.engine;
        let label = format!("label=corral.project={}", self.key());
        let names = e.cli(&["ps", "--all", "--format", "{{.Names}}"]);
        let labelled = e.cli(&["ps", "--all", "--filter", &label, "--format", "{{.Names}}"]);
        for n in String::from_utf8_lossy(&names.stdout)
            .lines()
            .filter(|n| n.starts_with(&self.prefix) || n.contains(&self.key()))
            .chain(String::from_utf8_lossy(&labelled.stdout).lines())
        {
            e.rm_force(&[n]);
        }
        if e == Engine::Podman {
            let pods = e.cli(&["pod", "ls", "--format", "{{.Name}}"]);
            for n in String::from_utf8_lossy(&pods.stdout).lines() {
                if n.contains(&self.prefix) {
                    e.cli(&["pod", "rm", "--force", n]);
                }
            }
        }
        let nets = e.cli(&["network", "ls", "--format", "{{.Name}}"]);
        for n in String::from_utf8_lossy(&nets.stdout).lines() {
            if n.starts_with(&self.prefix) {
                e.cli(&["network", "rm", n]);
            }
        }
        e.cli(&["volume", "rm", "--force", &format!("{}-bin", self.prefix)]);
        let images = e.cli(&["images", "--format", "{{.Repository}}"]);
        for i in String::from_utf8_lossy(&images.stdout).lines() {
            if i.contains(&self.prefix) {
                e.cli(&["rmi", "--force", i]);
            }
        }
    }
}
