//! corral's container backend: podman and docker command lines generated from a Plan.
//!
//! The same [`Plan`](corral_policy::plan::Plan) the native backend runs becomes the seeds'
//! container setup, as typed engine command lines ([`Command`]: a program and its argv, never
//! a shell string):
//!
//! - a per-project `--internal` network (its name carries the project key, so two projects never
//!   see each other) and one shared external network;
//! - the proxy container on both, alias `proxy`, running `corral proxy` from a static corral
//!   binary mounted read-only, with the project's network rules, hardened like seed 003's squid;
//! - the harness container on the internal network only, with the plan's mounts, environment
//!   and limits, `--read-only --read-only-tmpfs --cap-drop ALL --security-opt no-new-privileges`
//!   and corral's own seccomp filter (`--security-opt seccomp=FILE`, the native jail's rules as
//!   an OCI profile).
//!
//! [`setup`] builds the whole sequence ([`Setup`]), [`runner`] executes it, [`down`] removes a
//! project's containers and networks, [`image`] builds harness images and [`compose`] writes the
//! executor service in corral's own compose file (seed 003's shape).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

pub mod argv;
pub mod compose;
pub mod gateway;
pub mod image;
pub mod names;
pub mod ports;
pub mod proxy_policy;
pub mod runner;

pub use argv::{Context, Setup, Stdio, Step, commands, setup};
pub use names::Names;

/// Which container engine's CLI to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Podman,
    Docker,
}

impl EngineKind {
    /// The program name looked up on PATH.
    pub fn program(self) -> &'static str {
        match self {
            EngineKind::Podman => "podman",
            EngineKind::Docker => "docker",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.program())
    }
}

/// One engine invocation: a program, its arguments, and variables set in the engine's own
/// environment (values of `--env NAME` arguments, so that they never appear in an argv that
/// other users of the host can read in /proc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub program: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl Command {
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The argv as a list of strings, program first.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.clone())
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// A `std::process::Command` for this invocation (stdio left to the caller).
    pub fn to_std(&self) -> std::process::Command {
        let mut c = std::process::Command::new(&self.program);
        c.args(&self.args);
        c.envs(&self.env);
        c
    }
}

impl fmt::Display for Command {
    /// POSIX-shell quoted, so a printed command can be pasted. Variables passed by name are not
    /// shown (their values are the jail's environment, printed separately by `corral plan`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<String> = self.argv().iter().map(|w| shell_quote(w)).collect();
        f.write_str(&words.join(" "))
    }
}

/// Quote one word for a POSIX shell: bare when it has only safe characters, else in single
/// quotes with embedded single quotes spelled `'\''`.
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '-' | '_' | '.' | '/' | ':' | '=' | ',' | '+' | '@' | '%')
        });
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "the {engine} backend cannot enforce {what} yet; run with --engine native, or remove it from the policy"
    )]
    Unsupported { engine: EngineKind, what: String },
    #[error(
        "path {path} contains {ch:?}, which the {engine} --volume syntax cannot carry; move or rename it"
    )]
    BadPath {
        engine: EngineKind,
        path: PathBuf,
        ch: char,
    },
    #[error("the plan has no command to run")]
    NoCommand,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Compose(String),
    #[error("the run's credential gateway: {0}")]
    Gateway(String),
    #[error("writing the containers' seccomp profile: {0}")]
    Seccomp(#[from] corral_sandbox::seccomp::SeccompError),
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(
        "the proxy container {container} exited instead of listening: {log}; see `{engine} logs {container}`"
    )]
    ProxyExited {
        engine: EngineKind,
        container: String,
        log: String,
    },
    #[error("cannot start `{program}`: {source}; is {program} installed and on PATH?")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips_through_sh() {
        assert_eq!(shell_quote("abc/d:e=f"), "abc/d:e=f");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let words = ["plain", "with space", "it's", "$HOME", "a\nb", ""];
        let cmd = Command::new("printf").arg("%s\\0").args(words);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd.to_string())
            .output()
            .expect("sh runs");
        let got: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        let mut want: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        want.push(String::new());
        assert_eq!(got, want);
    }
}
