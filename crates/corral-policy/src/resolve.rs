//! From the policy layers and the caller's situation to one [`Plan`].
//!
//! `resolve` is the only place that reads policy files, the caller's environment and the
//! project tree; every backend consumes the `Plan` it returns.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::PolicyError;
use crate::plan::{Engine, NetworkMode, Plan};

/// The command-line layer of the policy (`--policy`, `--engine`, `--network`, `--allow`, ...),
/// the highest-precedence layer. Values are as the user typed them; `resolve` validates them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags {
    /// Use this policy file instead of the project's `corral.toml`.
    pub policy: Option<PathBuf>,
    pub engine: Option<Engine>,
    pub network: Option<NetworkMode>,
    /// Domain patterns added to `network.allow`.
    pub allow: Vec<String>,
    /// Host paths bound read-write (`~` expanded, relative to the caller's cwd).
    pub rw: Vec<PathBuf>,
    /// Host paths bound read-only.
    pub ro: Vec<PathBuf>,
    /// `NAME` (pass the caller's value) or `NAME=VALUE` (set).
    pub env: Vec<String>,
    /// Memory limit as typed (`4g`, `512m`, bytes).
    pub memory: Option<String>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub publish: Vec<u16>,
    /// A fresh temporary directory instead of the project.
    pub scratch: bool,
    /// The explicit opt-in for `executor.target = "host"` (`--allow-host-executor`).
    pub allow_host_executor: bool,
}

/// Everything `resolve` needs to know about the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The caller's working directory (absolute).
    pub cwd: PathBuf,
    /// The harness profile named on the command line (`corral run pi`), if any.
    pub profile: Option<String>,
    /// The command after `--`, replacing the profile's.
    pub command: Vec<String>,
    pub flags: Flags,
    /// The caller's environment snapshot: the only source of passed variables and of `PATH`
    /// for command lookup.
    pub env: BTreeMap<String, String>,
    /// The caller's home directory (absolute).
    pub home: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// The running corral binary, bound read-only at `/run/corral/bin/corral` in the jail.
    pub corral_exe: PathBuf,
    /// The user config file (`$XDG_CONFIG_HOME/corral/config.toml`); `None` for no user layer.
    pub user_config: Option<PathBuf>,
}

impl Request {
    /// A request for the current process: cwd, environment, home, ids, executable and the
    /// default user config location. The caller fills in `profile`, `command` and `flags`.
    pub fn from_process() -> Result<Request, PolicyError> {
        let cwd = std::env::current_dir().map_err(|source| PolicyError::Io {
            what: "cannot read the current directory",
            path: PathBuf::from("."),
            source,
        })?;
        let env: BTreeMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        let home = env
            .get("HOME")
            .filter(|h| h.starts_with('/'))
            .map(PathBuf::from)
            .ok_or_else(|| {
                PolicyError::Invalid(
                    "HOME is not set to an absolute path; set HOME to your home directory".into(),
                )
            })?;
        let user_config = Some(default_user_config(&env, &home));
        let (uid, gid) = current_ids();
        let corral_exe = std::env::current_exe().map_err(|source| PolicyError::Io {
            what: "cannot find the running corral executable",
            path: PathBuf::from("/proc/self/exe"),
            source,
        })?;
        Ok(Request {
            cwd,
            profile: None,
            command: Vec::new(),
            flags: Flags::default(),
            env,
            home,
            uid,
            gid,
            corral_exe,
            user_config,
        })
    }
}

/// `$XDG_CONFIG_HOME/corral/config.toml`, `~/.config/corral/config.toml` when unset or relative.
pub fn default_user_config(env: &BTreeMap<String, String>, home: &std::path::Path) -> PathBuf {
    match env.get("XDG_CONFIG_HOME") {
        Some(x) if x.starts_with('/') => PathBuf::from(x).join("corral/config.toml"),
        _ => home.join(".config/corral/config.toml"),
    }
}

fn current_ids() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self") {
        Ok(m) => (m.uid(), m.gid()),
        Err(_) => (0, 0),
    }
}

/// Resolve the policy layers for `req` into a [`Plan`].
pub fn resolve(req: &Request) -> Result<Plan, PolicyError> {
    let _ = req;
    Err(PolicyError::Invalid("the policy resolver is not implemented yet".into()))
}
