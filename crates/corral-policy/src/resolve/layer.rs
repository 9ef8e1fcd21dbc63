//! The policy as layers: each value validated and located ([`Loc`]), merged lowest first
//! (built-in defaults, profile, user config, project file, flags). The built-in defaults are
//! here and nowhere else.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use ipnet::IpNet;

use crate::config::SecretSpec;
use crate::domain::DomainPattern;
use crate::error::{PolicyError, line_col};
use crate::plan::{Access, Dns, Enforce, Engine, ExecutorTarget, NetworkMode};
use crate::profile::Profile;

/// The built-in scalars: [`defaults`] sets them, and the builder falls back to them (a merged
/// policy always starts from `defaults`, so the fallback is never taken in practice).
pub(super) const DEFAULT_ENGINE: Engine = Engine::Native;
pub(super) const DEFAULT_PROJECT_ACCESS: Access = Access::Rw;
pub(super) const DEFAULT_NETWORK: NetworkMode = NetworkMode::Proxy;
pub(super) const DEFAULT_EXEC_NETWORK: NetworkMode = NetworkMode::None;
pub(super) const DEFAULT_ENFORCE: Enforce = Enforce::Strict;
pub(super) const DEFAULT_EXEC_TIMEOUT_MS: u64 = 600_000;
pub(super) const DEFAULT_EXEC_MAX_OUTPUT: u64 = 64 << 20;
pub(super) const DEFAULT_EXEC_MAX_CONCURRENT: usize = 8;
/// Where the built-in defaults' values are said to come from.
pub(super) const BUILTIN: &str = "built-in defaults";

/// Where a rule came from: a position in a policy file, a flag, or built-in data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Loc {
    File {
        file: PathBuf,
        line: usize,
        col: usize,
    },
    Flag(&'static str),
    Builtin(String),
}

impl Loc {
    pub(super) fn in_file(file: &Path, text: &str, span: std::ops::Range<usize>) -> Loc {
        let (line, col) = line_col(text, span.start);
        Loc::File {
            file: file.to_path_buf(),
            line,
            col,
        }
    }

    pub(super) fn error(&self, message: String) -> PolicyError {
        match self {
            Loc::File { file, line, col } => PolicyError::At {
                file: file.clone(),
                line: *line,
                col: *col,
                message,
            },
            Loc::Flag(flag) => PolicyError::Invalid(format!("{flag}: {message}")),
            Loc::Builtin(what) => PolicyError::Invalid(format!("{what}: {message}")),
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::File { file, line, col } => write!(f, "{}:{line}:{col}", file.display()),
            Loc::Flag(flag) => f.write_str(flag),
            Loc::Builtin(what) => f.write_str(what),
        }
    }
}

/// Which layer a policy comes from; decides what it may grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trust {
    /// The user's own config and command-line flags: may opt in to anything.
    User,
    /// The project's `corral.toml` or a `--policy` file: may be hostile.
    Project,
}

#[derive(Debug, Clone, Default)]
pub(super) struct NetLayer {
    pub(super) mode: Option<(NetworkMode, Loc)>,
    pub(super) allow: Vec<(DomainPattern, Loc)>,
    pub(super) allow_paths: Vec<(crate::pathrule::PathRule, Loc)>,
    pub(super) deny: Vec<DomainPattern>,
    pub(super) allow_cidrs: Vec<(IpNet, Loc)>,
    pub(super) host_ports: Vec<(u16, Loc)>,
    pub(super) upstream_proxy: Option<(String, Loc)>,
    pub(super) publish: Vec<(u16, Loc)>,
    pub(super) dns: Option<(Dns, Loc)>,
    pub(super) on_deny: Option<(crate::config::OnDenyMode, Loc)>,
    pub(super) ask_timeout: Option<(u32, Loc)>,
}

impl NetLayer {
    pub(super) fn merge(&mut self, o: NetLayer) {
        if o.mode.is_some() {
            self.mode = o.mode;
        }
        self.allow.extend(o.allow);
        self.allow_paths.extend(o.allow_paths);
        self.deny.extend(o.deny);
        self.allow_cidrs.extend(o.allow_cidrs);
        self.host_ports.extend(o.host_ports);
        if o.upstream_proxy.is_some() {
            self.upstream_proxy = o.upstream_proxy;
        }
        self.publish.extend(o.publish);
        if o.dns.is_some() {
            self.dns = o.dns;
        }
        if o.on_deny.is_some() {
            self.on_deny = o.on_deny;
        }
        if o.ask_timeout.is_some() {
            self.ask_timeout = o.ask_timeout;
        }
    }
}

/// One layer of policy, every value validated and located. Lists accumulate across layers;
/// scalars of a higher layer replace those of a lower one.
#[derive(Debug, Clone, Default)]
pub(super) struct Layer {
    pub(super) profile: Option<(String, Loc)>,
    pub(super) command: Option<Vec<String>>,
    pub(super) engine: Option<Engine>,
    pub(super) image: Option<String>,
    pub(super) project_access: Option<Access>,
    pub(super) read_only: Vec<(PathBuf, Loc)>,
    pub(super) read_write: Vec<(PathBuf, Loc)>,
    pub(super) hide: Vec<(String, Loc)>,
    pub(super) protect: Vec<(PathBuf, Loc)>,
    pub(super) env_pass: Vec<(String, Loc)>,
    pub(super) env_set: BTreeMap<String, (String, Loc)>,
    pub(super) net: NetLayer,
    pub(super) secrets: BTreeMap<String, (SecretSpec, Loc)>,
    pub(super) signin: BTreeMap<String, (crate::signin::SigninSpec, Loc)>,
    pub(super) memory: Option<u64>,
    pub(super) cpus: Option<f64>,
    pub(super) pids: Option<u64>,
    pub(super) enforce: Option<Enforce>,
    pub(super) exec_target: Option<(ExecutorTarget, Loc)>,
    pub(super) exec_allow_host: bool,
    /// The harness may change its code in its state directories (user config or flag only).
    pub(super) allow_harness_config: bool,
    /// New git repositories outside the jail's own file systems (user config or flag only).
    pub(super) allow_new_repositories: bool,
    /// Review mode (`--review`, `filesystem.review`): on when any layer turns it on.
    pub(super) review: bool,
    pub(super) exec_allow: Option<Vec<String>>,
    pub(super) exec_timeout_ms: Option<u64>,
    pub(super) exec_max_output: Option<u64>,
    pub(super) exec_max_concurrent: Option<usize>,
    pub(super) exec_read_only: Vec<(PathBuf, Loc)>,
    pub(super) exec_read_write: Vec<(PathBuf, Loc)>,
    pub(super) exec_net: NetLayer,
    pub(super) clipboard: Option<bool>,
}

impl Layer {
    pub(super) fn merge(&mut self, o: Layer) {
        macro_rules! replace {
            ($($f:ident),*) => { $( if o.$f.is_some() { self.$f = o.$f; } )* };
        }
        replace!(
            profile,
            command,
            engine,
            image,
            project_access,
            memory,
            cpus,
            pids,
            enforce,
            exec_target,
            exec_allow,
            exec_timeout_ms,
            exec_max_output,
            exec_max_concurrent,
            clipboard
        );
        self.read_only.extend(o.read_only);
        self.read_write.extend(o.read_write);
        self.hide.extend(o.hide);
        self.protect.extend(o.protect);
        self.env_pass.extend(o.env_pass);
        self.env_set.extend(o.env_set);
        self.net.merge(o.net);
        self.secrets.extend(o.secrets);
        self.signin.extend(o.signin);
        self.exec_allow_host |= o.exec_allow_host;
        self.allow_harness_config |= o.allow_harness_config;
        self.allow_new_repositories |= o.allow_new_repositories;
        self.review |= o.review;
        self.exec_read_only.extend(o.exec_read_only);
        self.exec_read_write.extend(o.exec_read_write);
        self.exec_net.merge(o.exec_net);
    }
}

/// The built-in defaults: the lowest layer.
pub(super) fn defaults() -> Layer {
    let at = || Loc::Builtin(BUILTIN.into());
    Layer {
        engine: Some(DEFAULT_ENGINE),
        project_access: Some(DEFAULT_PROJECT_ACCESS),
        hide: [".env", ".env.*", "*.pem", "*.key"]
            .iter()
            .map(|h| (h.to_string(), at()))
            .collect(),
        protect: [".git/hooks", ".git/config"]
            .iter()
            .map(|p| (PathBuf::from(p), at()))
            .collect(),
        net: NetLayer {
            mode: Some((DEFAULT_NETWORK, at())),
            ..NetLayer::default()
        },
        // Sized for Node harnesses plus builds: 512m kills them.
        memory: Some(4 << 30),
        cpus: Some(2.0),
        pids: Some(1024),
        enforce: Some(DEFAULT_ENFORCE),
        exec_target: Some((ExecutorTarget::Sandbox, at())),
        exec_allow: Some(Vec::new()),
        exec_timeout_ms: Some(DEFAULT_EXEC_TIMEOUT_MS),
        exec_max_output: Some(DEFAULT_EXEC_MAX_OUTPUT),
        exec_max_concurrent: Some(DEFAULT_EXEC_MAX_CONCURRENT),
        exec_net: NetLayer {
            mode: Some((DEFAULT_EXEC_NETWORK, at())),
            ..NetLayer::default()
        },
        ..Layer::default()
    }
}

/// Context for turning policy paths into absolute ones.
pub(super) struct PathCtx<'a> {
    pub(super) home: &'a Path,
    pub(super) project: &'a Path,
    /// corral's own config and state directories (user config, trust store, audit logs).
    pub(super) corral_dirs: &'a [PathBuf],
}

impl PathCtx<'_> {
    /// `~` and `~/x` are the home; absolute paths stay; relative paths are project-relative and
    /// may not leave the project. The result is lexically normalized.
    pub(super) fn expand(&self, raw: &str, key: &str, at: &Loc) -> Result<PathBuf, PolicyError> {
        if raw.is_empty() {
            return Err(at.error(format!("{key}: empty path")));
        }
        let p = if raw == "~" {
            self.home.to_path_buf()
        } else if let Some(rest) = raw.strip_prefix("~/") {
            self.home.join(rest)
        } else if raw.starts_with('~') {
            return Err(at.error(format!(
                "{key}: {raw:?}: only ~ and ~/... are supported (write the absolute path)"
            )));
        } else if raw.starts_with('/') {
            PathBuf::from(raw)
        } else {
            let joined = normalize(&self.project.join(raw));
            if !joined.starts_with(self.project) {
                return Err(at.error(format!(
                    "{key}: relative path {raw:?} leaves the project ({}); relative paths are \
                     relative to the project root: write an absolute path or ~/... for a path \
                     outside it",
                    self.project.display()
                )));
            }
            return Ok(joined);
        };
        Ok(normalize(&p))
    }

    /// A path inside the project (`hide`, `protect`): relative, or absolute under the project.
    pub(super) fn in_project(
        &self,
        raw: &str,
        key: &str,
        at: &Loc,
    ) -> Result<PathBuf, PolicyError> {
        let p = normalize(&self.project.join(raw.trim_start_matches('/')));
        if raw.is_empty() || !p.starts_with(self.project) || p == self.project {
            return Err(at.error(format!(
                "{key}: {raw:?} is not a path inside the project: expected a path relative to \
                 the project root such as \".git/hooks\""
            )));
        }
        Ok(p.strip_prefix(self.project).unwrap_or(&p).to_path_buf())
    }
}

/// Remove `.` and resolve `..` lexically (no filesystem access).
pub(super) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// The layer of a harness profile.
pub(super) fn profile_layer(p: &Profile, home: &Path) -> Layer {
    let at = || Loc::Builtin(format!("profile {}", p.name));
    Layer {
        env_pass: p.env_pass.iter().map(|n| (n.clone(), at())).collect(),
        env_set: p
            .env_set
            .iter()
            .map(|(k, v)| (k.clone(), (expand_home_value(v, home), at())))
            .collect(),
        net: NetLayer {
            allow: p.allow.iter().map(|a| (a.clone(), at())).collect(),
            ..NetLayer::default()
        },
        image: Some(p.image.clone()),
        ..Layer::default()
    }
}

pub(super) fn expand_home_value(v: &str, home: &Path) -> String {
    match v.strip_prefix("~/") {
        Some(rest) => home.join(rest).display().to_string(),
        None if v == "~" => home.display().to_string(),
        None => v.to_string(),
    }
}
