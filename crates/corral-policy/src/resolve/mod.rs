//! From the policy layers and the caller's situation to one [`Plan`], in two steps:
//! [`gather`](gather::gather) does every read of the file system and the environment (the
//! project chosen, the policy files read and checked, the command found, the project walked,
//! symlinks resolved) and returns plain data; [`build`](build::build) is a pure function of
//! that data, called once for the agent's jail and once for the executor's sandbox. Every
//! backend consumes the `Plan` it returns.

mod build;
mod command;
mod gather;
mod grants;
mod layer;
mod policy_file;
mod project;
#[cfg(test)]
mod tests;
mod walk;

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::PolicyError;
use crate::plan::{Enforce, Engine, NetworkMode, Plan};

use layer::expand_home_value;

pub use build::proxy_env;
pub use command::{SHIM_MARKER, is_shim, package_dir, which};
pub use project::{project_root, why_not_a_project};
pub use walk::{SEQUENTIAL_WALK_MAX, Seen, Step, find_masked, walk_tree};

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
    /// `--enforce strict|best-effort`: what happens when a limit cannot be enforced here.
    pub enforce: Option<Enforce>,
    pub publish: Vec<u16>,
    /// A fresh temporary directory instead of the project.
    pub scratch: bool,
    /// `--project DIR`: this directory is the project, exactly (no git top-level search, and
    /// no refusal of the home or a system directory: the user named it).
    pub project: Option<PathBuf>,
    /// The explicit opt-in for `executor.target = "host"` (`--allow-host-executor`).
    pub allow_host_executor: bool,
    /// Bind the host's harness state read-write, as it is, instead of corral's layer over it
    /// (`--allow-harness-config`): what the jail writes there, the host's harness reads.
    pub allow_harness_config: bool,
    /// Let the jail create git repositories where the host can see them; checked when the run
    /// ends instead (`--allow-new-repositories`).
    pub allow_new_repositories: bool,
    /// `--review`: the run's writes to the project are held for `corral diff`/`accept`.
    pub review: bool,
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

/// This process's environment (the variables that are valid UTF-8) and its home, as a
/// [`Request`] takes them: HOME must be an absolute path.
pub fn caller_env_and_home() -> Result<(BTreeMap<String, String>, PathBuf), PolicyError> {
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
    Ok((env, home))
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
        let (env, home) = caller_env_and_home()?;
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

/// Where the jail finds corral itself (so `corral exec` works inside).
pub const JAIL_BIN_DIR: &str = "/run/corral/bin";
/// Where corral writes the executor skill inside the jail.
pub const SKILL_DIR: &str = "/run/corral/skill";
/// The proxy address inside the native jail (its in-namespace listener). The container engine
/// uses `http://proxy:3128` and rewrites the proxy variables.
pub use crate::consts::JAIL_PROXY_URL;
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
/// Directories whose programs every jail sees read-only (`plan::system_mounts`).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
];
/// Terminal and locale variables passed from the caller when set.
const BASIC_PASS: &[&str] = &[
    "TERM",
    "COLORTERM",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "USER",
    "LOGNAME",
];

/// `p` with every symlink in its existing part resolved; the part that does not exist yet is
/// appended as written (`p` is absolute and lexically normalized).
fn real_path(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut existing = p;
    loop {
        if let Ok(mut real) = existing.canonicalize() {
            real.extend(rest.iter().rev());
            return real;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// `real_path` of some paths, gathered for the builder (a path not gathered stands as written).
#[derive(Debug, Clone, Default, PartialEq)]
struct RealPaths(BTreeMap<PathBuf, PathBuf>);

impl RealPaths {
    fn record(&mut self, p: &Path) {
        self.0.insert(p.to_path_buf(), real_path(p));
    }

    fn of(&self, p: &Path) -> PathBuf {
        self.0.get(p).cloned().unwrap_or_else(|| p.to_path_buf())
    }
}

/// Resolve the policy layers for `req` into a [`Plan`]: gather, then build.
///
/// Layers, lowest first: built-in defaults, the harness profile, the user config, the project's
/// `corral.toml` (or `--policy FILE`), the command-line flags. Lists accumulate; scalars of a
/// higher layer win. With `--scratch` the project is a fresh directory (created here; the
/// caller removes it when the run ends) and no project policy is read unless `--policy` names
/// one.
pub fn resolve(req: &Request) -> Result<Plan, PolicyError> {
    build::build(&gather::gather(req, project::Scratch::Create)?)
}

/// [`resolve`] for showing the plan only (`corral plan`): it writes nothing. A `--scratch`
/// project is named, not created (a run would make a fresh one anyway).
pub fn preview(req: &Request) -> Result<Plan, PolicyError> {
    build::build(&gather::gather(req, project::Scratch::NameOnly)?)
}

/// A profile's `~/`-relative path with the home put in.
pub fn expand_home(v: &str, home: &Path) -> PathBuf {
    PathBuf::from(expand_home_value(v, home))
}

/// Create the profile's state directories and files that do not exist yet (mode 0700 / 0600),
/// so `corral run` can bind them. Call before starting the jail; `corral plan` does not.
pub fn ensure_state_paths(profile: &str, home: &Path) -> Result<(), PolicyError> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = crate::profile::profile(profile)?;
    for d in &p.state_dirs {
        let path = PathBuf::from(expand_home_value(d, home));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)
            .map_err(|source| PolicyError::Io {
                what: "cannot create the harness state directory",
                path,
                source,
            })?;
    }
    for f in &p.state_files {
        let path = PathBuf::from(expand_home_value(f, home));
        if path.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| PolicyError::Io {
                what: "cannot create the directory of",
                path: path.clone(),
                source,
            })?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| PolicyError::Io {
                what: "cannot create the harness state file",
                path: path.clone(),
                source,
            })?;
    }
    Ok(())
}
