//! From the policy layers and the caller's situation to one [`Plan`].
//!
//! `resolve` is the only place that reads policy files, the caller's environment and the
//! project tree; every backend consumes the `Plan` it returns.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use ipnet::IpNet;

use crate::config::{
    EnvName, MemorySize, NetworkSection, PolicyFile, SecretSpec, Spanned, load_policy, pattern_at,
};
use crate::domain::DomainPattern;
use crate::error::{PolicyError, line_col};
use crate::plan::{
    Access, ConfigFormat, Dns, Enforce, Engine, ExecutorPlan, ExecutorTarget, GuardedFile,
    LimitKinds, Limits, Mount, MountKind, NetworkMode, NetworkPlan, Plan, ProjectPlan,
    ProjectSource, ProjectTrust, SecretPlan, SkillPlan, TerminalPlan, system_mounts,
};
use crate::profile::Profile;

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
    /// Let this run change the harness's code in its state directories (extensions, hooks,
    /// plugins, MCP servers: the profile's `state_code` and `guard`), `--allow-harness-config`.
    pub allow_harness_config: bool,
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

/// Where a rule came from: a position in a policy file, a flag, or built-in data.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Loc {
    File {
        file: PathBuf,
        line: usize,
        col: usize,
    },
    Flag(&'static str),
    Builtin(String),
}

impl Loc {
    fn in_file(file: &Path, text: &str, span: std::ops::Range<usize>) -> Loc {
        let (line, col) = line_col(text, span.start);
        Loc::File {
            file: file.to_path_buf(),
            line,
            col,
        }
    }

    fn error(&self, message: String) -> PolicyError {
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
enum Trust {
    /// The user's own config and command-line flags: may opt in to anything.
    User,
    /// The project's `corral.toml` or a `--policy` file: may be hostile.
    Project,
}

#[derive(Debug, Clone, Default)]
struct NetLayer {
    mode: Option<(NetworkMode, Loc)>,
    allow: Vec<(DomainPattern, Loc)>,
    deny: Vec<DomainPattern>,
    allow_cidrs: Vec<(IpNet, Loc)>,
    host_ports: Vec<(u16, Loc)>,
    upstream_proxy: Option<(String, Loc)>,
    publish: Vec<(u16, Loc)>,
    dns: Option<(Dns, Loc)>,
}

impl NetLayer {
    fn merge(&mut self, o: NetLayer) {
        if o.mode.is_some() {
            self.mode = o.mode;
        }
        self.allow.extend(o.allow);
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
    }
}

/// One layer of policy, every value validated and located. Lists accumulate across layers;
/// scalars of a higher layer replace those of a lower one.
#[derive(Debug, Clone, Default)]
struct Layer {
    profile: Option<(String, Loc)>,
    command: Option<Vec<String>>,
    engine: Option<Engine>,
    image: Option<String>,
    project_access: Option<Access>,
    read_only: Vec<(PathBuf, Loc)>,
    read_write: Vec<(PathBuf, Loc)>,
    hide: Vec<(String, Loc)>,
    protect: Vec<(PathBuf, Loc)>,
    env_pass: Vec<(String, Loc)>,
    env_set: BTreeMap<String, (String, Loc)>,
    net: NetLayer,
    secrets: BTreeMap<String, (SecretSpec, Loc)>,
    memory: Option<u64>,
    cpus: Option<f64>,
    pids: Option<u64>,
    enforce: Option<Enforce>,
    exec_target: Option<(ExecutorTarget, Loc)>,
    exec_allow_host: bool,
    /// The harness may change its code in its state directories (user config or flag only).
    allow_harness_config: bool,
    exec_allow: Option<Vec<String>>,
    exec_timeout_ms: Option<u64>,
    exec_max_output: Option<u64>,
    exec_max_concurrent: Option<usize>,
    exec_read_only: Vec<(PathBuf, Loc)>,
    exec_read_write: Vec<(PathBuf, Loc)>,
    exec_net: NetLayer,
    clipboard: Option<bool>,
}

impl Layer {
    fn merge(&mut self, o: Layer) {
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
        self.exec_allow_host |= o.exec_allow_host;
        self.allow_harness_config |= o.allow_harness_config;
        self.exec_read_only.extend(o.exec_read_only);
        self.exec_read_write.extend(o.exec_read_write);
        self.exec_net.merge(o.exec_net);
    }
}

/// The built-in defaults: the lowest layer.
fn defaults() -> Layer {
    let at = || Loc::Builtin("built-in defaults".into());
    Layer {
        engine: Some(Engine::Native),
        project_access: Some(Access::Rw),
        hide: [".env", ".env.*", "*.pem", "*.key"]
            .iter()
            .map(|h| (h.to_string(), at()))
            .collect(),
        protect: [".git/hooks", ".git/config"]
            .iter()
            .map(|p| (PathBuf::from(p), at()))
            .collect(),
        net: NetLayer {
            mode: Some((NetworkMode::Proxy, at())),
            ..NetLayer::default()
        },
        // Sized for Node harnesses plus builds: 512m kills them.
        memory: Some(4 << 30),
        cpus: Some(2.0),
        pids: Some(1024),
        enforce: Some(Enforce::Strict),
        exec_target: Some((ExecutorTarget::Sandbox, at())),
        exec_allow: Some(Vec::new()),
        exec_timeout_ms: Some(600_000),
        exec_max_output: Some(64 << 20),
        exec_max_concurrent: Some(8),
        exec_net: NetLayer {
            mode: Some((NetworkMode::None, at())),
            ..NetLayer::default()
        },
        ..Layer::default()
    }
}

/// Context for turning policy paths into absolute ones.
struct PathCtx<'a> {
    home: &'a Path,
    project: &'a Path,
    /// corral's own config and state directories (user config, trust store, audit logs).
    corral_dirs: &'a [PathBuf],
}

impl PathCtx<'_> {
    /// `~` and `~/x` are the home; absolute paths stay; relative paths are project-relative and
    /// may not leave the project. The result is lexically normalized.
    fn expand(&self, raw: &str, key: &str, at: &Loc) -> Result<PathBuf, PolicyError> {
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
    fn in_project(&self, raw: &str, key: &str, at: &Loc) -> Result<PathBuf, PolicyError> {
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
fn normalize(p: &Path) -> PathBuf {
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

fn span_loc<T>(file: &Path, text: &str, s: &Spanned<T>) -> Loc {
    Loc::in_file(file, text, s.span())
}

fn net_layer(file: &Path, text: &str, n: NetworkSection) -> Result<NetLayer, PolicyError> {
    Ok(NetLayer {
        mode: n.mode.map(|m| {
            let at = span_loc(file, text, &m);
            (m.into_inner(), at)
        }),
        allow: n
            .allow
            .iter()
            .map(|a| Ok((pattern_at(file, text, a)?, span_loc(file, text, a))))
            .collect::<Result<_, PolicyError>>()?,
        deny: n
            .deny
            .iter()
            .map(|a| pattern_at(file, text, a))
            .collect::<Result<_, _>>()?,
        allow_cidrs: n
            .allow_cidrs
            .into_iter()
            .map(|a| {
                let at = span_loc(file, text, &a);
                (a.into_inner(), at)
            })
            .collect(),
        host_ports: n
            .host_ports
            .into_iter()
            .map(|a| {
                let at = span_loc(file, text, &a);
                (a.into_inner(), at)
            })
            .collect(),
        upstream_proxy: n.upstream_proxy.map(|u| {
            let at = span_loc(file, text, &u);
            (u.into_inner().0, at)
        }),
        publish: n
            .publish
            .into_iter()
            .map(|a| {
                let at = span_loc(file, text, &a);
                (a.into_inner(), at)
            })
            .collect(),
        dns: n.dns.map(|d| {
            let at = span_loc(file, text, &d);
            (d.into_inner(), at)
        }),
    })
}

/// Credential and start-up locations a project file may not bind at all, and those it may not
/// bind read-write (relative to the home).
const NEVER_FROM_PROJECT: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".config/gcloud",
    ".config/gh",
    ".config/corral",
    ".password-store",
    ".local/share/keyrings",
];
const NEVER_RW_FROM_PROJECT: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".config",
    ".local/bin",
    ".config/fish",
    ".config/systemd",
    ".config/autostart",
    ".gitconfig",
];

/// Host places a project file may not bind at all, nor any ancestor of them: runtime
/// directories full of unix sockets (systemd, D-Bus, the docker and podman sockets, X11: each a
/// way out of the jail; SPEC section 1 says no host unix sockets), and the kernel's own trees.
const NEVER_SYSTEM_FROM_PROJECT: &[&str] = &[
    "/run",
    "/var/run",
    "/tmp/.X11-unix",
    "/tmp/.ICE-unix",
    "/proc",
    "/sys",
    "/dev",
    "/var/lib/docker",
    "/var/lib/containers",
];

/// Refuse binds a repository's policy file must never make (it may be hostile): the home or any
/// ancestor of it, the credential stores, runtime socket directories and kernel trees, and
/// read-write binds of shell start-up files.
fn check_project_bind(
    path: &Path,
    rw: bool,
    key: &str,
    at: &Loc,
    ctx: &PathCtx,
    user_config: Option<&Path>,
) -> Result<(), PolicyError> {
    let refuse = |what: String| {
        Err(at.error(format!(
            "{key}: {} would give the jail {} {what}; a project's policy file may not grant \
             this (the repository could be hostile): put it in your user config or pass --{} \
             on the command line",
            path.display(),
            if rw { "write access to" } else { "access to" },
            if rw { "rw" } else { "ro" }
        )))
    };
    // The home as given and as it really is (HOME=/home/u with /home -> var/home): a path
    // spelled either way is the same directory.
    let real_home = real_path(ctx.home);
    let homes = [ctx.home, real_home.as_path()];
    if homes.iter().any(|h| h.starts_with(path)) {
        return refuse("your whole home directory".into());
    }
    if let Some(uc) = user_config
        && (uc.starts_with(path) || real_path(uc).starts_with(path))
    {
        return refuse(format!("your corral user config {}", uc.display()));
    }
    // corral's own directories: the user config, the trust store, the audit logs.
    for dir in ctx.corral_dirs {
        if dir.starts_with(path) || path.starts_with(dir) || real_path(dir).starts_with(path) {
            return refuse(format!(
                "corral's own directory {} (your trust store, config or audit logs)",
                dir.display()
            ));
        }
    }
    for sensitive in NEVER_SYSTEM_FROM_PROJECT {
        let s = Path::new(sensitive);
        if s.starts_with(path) || path.starts_with(s) {
            return refuse(format!("the host's {sensitive}"));
        }
    }
    let list: Vec<&&str> = if rw {
        NEVER_FROM_PROJECT
            .iter()
            .chain(NEVER_RW_FROM_PROJECT)
            .collect()
    } else {
        NEVER_FROM_PROJECT.iter().collect()
    };
    for sensitive in list {
        for home in homes {
            let s = home.join(sensitive);
            if s.starts_with(path) || path.starts_with(&s) {
                return refuse(format!("~/{sensitive}"));
            }
        }
    }
    Ok(())
}

/// A project file's `terminal.clipboard = true`.
const CLIPBOARD_GRANT: &str =
    "terminal.clipboard lets the jail write to your clipboard (OSC 52 escape sequences)";

/// The plain words of each grant a project file can make (shared by `Plan::project_grants` and
/// the list that needs the user's trust, so both say the same).
fn env_pass_text(name: &str) -> String {
    format!("env.pass hands your {name} to the jail")
}

fn secret_text(name: &str, spec: &SecretSpec) -> String {
    format!(
        "secrets.{name} sends your {} to {}",
        spec.from_env.0,
        join(&spec.hosts)
    )
}

fn compose_text(svc: &str) -> String {
    format!("executor.target runs the agent's commands in compose service {svc:?}")
}

/// A bind outside the project, judged by where it really leads.
fn bind_text(key: &str, p: &Path, rw: bool) -> String {
    let real = real_path(p);
    let shown = if real == p {
        p.display().to_string()
    } else {
        format!("{} (really {})", p.display(), real.display())
    };
    format!(
        "{key} binds {shown} {} (outside the project)",
        if rw { "read-write" } else { "read-only" }
    )
}

fn allow_text(key: &str, a: &DomainPattern) -> String {
    format!("{key}.allow lets the jail reach {a}")
}

fn cidr_text(key: &str, c: &IpNet) -> String {
    format!("{key}.allow_cidrs opens the non-public range {c}")
}

fn host_port_text(key: &str, p: u16) -> String {
    format!("{key}.host_ports connects the jail to your 127.0.0.1:{p}")
}

fn upstream_text(key: &str, u: &str) -> String {
    format!("{key}.upstream_proxy sends all traffic through {u}")
}

fn publish_text(key: &str, p: u16) -> String {
    format!("{key}.publish exposes the jail's port {p} on your 127.0.0.1:{p}")
}

/// The limits still at their built-in values once `layers` (the user config, the project's
/// file, the flags) are merged over the defaults. None when one of them sets `limits.enforce`:
/// then every limit follows it.
fn built_in_limits(layers: &[&Layer]) -> LimitKinds {
    if layers.iter().any(|l| l.enforce.is_some()) {
        return LimitKinds::default();
    }
    let defaults = defaults();
    LimitKinds {
        memory: defaults.memory.is_some() && layers.iter().all(|l| l.memory.is_none()),
        cpus: defaults.cpus.is_some() && layers.iter().all(|l| l.cpus.is_none()),
        pids: defaults.pids.is_some() && layers.iter().all(|l| l.pids.is_none()),
    }
}

/// Turn one parsed policy file into a layer: expand and check paths, locate every value, and
/// apply the rules of its trust level.
fn file_layer(
    file: &Path,
    text: &str,
    pf: PolicyFile,
    trust: Trust,
    ctx: &PathCtx,
    user_config: Option<&Path>,
    grants: &mut Vec<String>,
) -> Result<Layer, PolicyError> {
    let mut l = Layer::default();
    let project = trust == Trust::Project;
    if let Some(p) = pf.profile {
        let at = span_loc(file, text, &p);
        let name = p.into_inner();
        crate::profile::profile(&name).map_err(|e| at.error(e.to_string()))?;
        l.profile = Some((name, at));
    }
    if let Some(run) = pf.run {
        if let Some(c) = run.command {
            let at = span_loc(file, text, &c);
            let c = c.into_inner();
            if c.is_empty() {
                return Err(
                    at.error("run.command: expected a non-empty list such as [\"pi\"]".into())
                );
            }
            if project {
                grants.push(format!(
                    "{at}: run.command replaces the harness command with {c:?}"
                ));
            }
            l.command = Some(c);
        }
        if let Some(i) = run.image {
            let at = span_loc(file, text, &i);
            if project {
                grants.push(format!(
                    "{at}: run.image runs the harness in image {:?}",
                    i.get_ref()
                ));
            }
            l.image = Some(i.into_inner());
        }
        l.engine = run.engine;
    }
    if let Some(fs) = pf.filesystem {
        l.project_access = fs.project;
        if let Some(a) = fs.allow_harness_config {
            if project {
                return Err(span_loc(file, text, &a).error(
                    "filesystem.allow_harness_config may only be set in your user config \
                     ($XDG_CONFIG_HOME/corral/config.toml) or with --allow-harness-config, never \
                     in a project's policy file (the repository could be hostile)"
                        .into(),
                ));
            }
            l.allow_harness_config = *a.get_ref();
        }
        for (list, out, rw, key) in [
            (
                fs.read_only,
                &mut l.read_only,
                false,
                "filesystem.read_only",
            ),
            (
                fs.read_write,
                &mut l.read_write,
                true,
                "filesystem.read_write",
            ),
        ] {
            let site = BindSite {
                file,
                text,
                key,
                rw,
                project,
            };
            out.extend(bind_paths(list, &site, ctx, user_config, grants)?);
        }
        for raw in fs.hide {
            let at = span_loc(file, text, &raw);
            let g = raw.into_inner();
            hide_glob(&g).map_err(|e| at.error(e))?;
            l.hide.push((g, at));
        }
        for raw in fs.protect {
            let at = span_loc(file, text, &raw);
            let p = ctx.in_project(raw.get_ref(), "filesystem.protect", &at)?;
            l.protect.push((p, at));
        }
    }
    if let Some(env) = pf.env {
        for n in env.pass {
            let at = span_loc(file, text, &n);
            let name = EnvName::parse(n.get_ref()).map_err(|e| at.error(e))?.0;
            if project {
                grants.push(format!("{at}: {}", env_pass_text(&name)));
            }
            l.env_pass.push((name, at));
        }
        for (k, v) in env.set {
            let at = span_loc(file, text, &v);
            EnvName::parse(&k).map_err(|e| at.error(format!("env.set: {e}")))?;
            l.env_set.insert(k, (v.into_inner(), at));
        }
    }
    if let Some(n) = pf.network {
        l.net = net_layer(file, text, n)?;
        if project {
            check_project_network(&l.net, "network", grants)?;
        }
    }
    if let Some(secrets) = pf.secrets {
        for (name, spec) in secrets {
            let at = span_loc(file, text, &spec);
            EnvName::parse(&name).map_err(|e| at.error(format!("secrets: {e}")))?;
            let spec = spec.get_ref().resolve(file, text)?;
            if project {
                grants.push(format!("{at}: {}", secret_text(&name, &spec)));
            }
            l.secrets.insert(name, (spec, at));
        }
    }
    if let Some(c) = pf.terminal.and_then(|t| t.clipboard) {
        if project && *c.get_ref() {
            // At the key, as the trust list says it (one line in `corral plan`).
            let at = key_loc(file, text, &["terminal", "clipboard"]);
            grants.push(format!("{at}: {CLIPBOARD_GRANT}"));
        }
        l.clipboard = Some(c.into_inner());
    }
    if let Some(lim) = pf.limits {
        l.memory = lim.memory.map(|s| s.0);
        l.cpus = lim.cpus.map(|c| c.0);
        l.pids = lim.pids;
        l.enforce = lim.enforce;
    }
    if let Some(ex) = pf.executor {
        if let Some(ah) = ex.allow_host {
            let at = span_loc(file, text, &ah);
            if project {
                return Err(at.error(
                    "executor.allow_host may only be set in your user config \
                     ($XDG_CONFIG_HOME/corral/config.toml) or with --allow-host-executor, never \
                     in a project's policy file (the repository could be hostile)"
                        .into(),
                ));
            }
            l.exec_allow_host = *ah.get_ref();
        }
        if let Some(t) = ex.target {
            let at = span_loc(file, text, &t);
            let t = t.into_inner().0;
            if project && let ExecutorTarget::Compose(svc) = &t {
                grants.push(format!("{at}: {}", compose_text(svc)));
            }
            l.exec_target = Some((t, at));
        }
        l.exec_allow = ex.allow;
        l.exec_timeout_ms = ex.timeout.map(|d| d.0);
        l.exec_max_output = ex.max_output.map(|s| s.0);
        l.exec_max_concurrent = ex.max_concurrent;
        if let Some(sb) = ex.sandbox {
            for (list, out, rw, key) in [
                (
                    sb.read_only,
                    &mut l.exec_read_only,
                    false,
                    "executor.sandbox.read_only",
                ),
                (
                    sb.read_write,
                    &mut l.exec_read_write,
                    true,
                    "executor.sandbox.read_write",
                ),
            ] {
                let site = BindSite {
                    file,
                    text,
                    key,
                    rw,
                    project,
                };
                out.extend(bind_paths(list, &site, ctx, user_config, grants)?);
            }
            if let Some(n) = sb.network {
                l.exec_net = net_layer(file, text, n)?;
                if project {
                    check_project_network(&l.exec_net, "executor.sandbox.network", grants)?;
                }
            }
        }
    }
    Ok(l)
}

/// Where a list of bind paths comes from: its file, key, access and trust.
struct BindSite<'a> {
    file: &'a Path,
    text: &'a str,
    key: &'static str,
    rw: bool,
    project: bool,
}

/// Expand a list of bind paths. For a project's file, a path is judged by where it really
/// leads (symlinks resolved, as the backends bind it): a repository can commit `evil -> ..`,
/// and `evil/.ssh` is then the home's `.ssh`, not a path inside the project.
fn bind_paths(
    list: Vec<Spanned<String>>,
    site: &BindSite,
    ctx: &PathCtx,
    user_config: Option<&Path>,
    grants: &mut Vec<String>,
) -> Result<Vec<(PathBuf, Loc)>, PolicyError> {
    let BindSite {
        file,
        text,
        key,
        rw,
        project,
    } = *site;
    let mut out = Vec::new();
    for raw in list {
        let at = span_loc(file, text, &raw);
        let p = ctx.expand(raw.get_ref(), key, &at)?;
        if project {
            let real = real_path(&p);
            if !p.starts_with(ctx.project) || !real.starts_with(ctx.project) {
                check_project_bind(&p, rw, key, &at, ctx, user_config)?;
                if real != p {
                    check_project_bind(&real, rw, key, &at, ctx, user_config)?;
                }
                grants.push(format!("{at}: {}", bind_text(key, &p, rw)));
            }
        }
        out.push((p, at));
    }
    Ok(out)
}

/// Where the jail sees the host path `p` inside a read-write bind of `rw_roots` (binds keep
/// their path): `p` itself when written below one, and its real location, spelled below the
/// root that really holds it, when a symlink on the way leads into one.
fn rw_views(p: &Path, rw_roots: &[&PathBuf]) -> Vec<PathBuf> {
    let real = real_path(p);
    let mut out = Vec::new();
    for r in rw_roots {
        if p.starts_with(r) {
            out.push(p.to_path_buf());
        }
        if let Ok(rel) = real.strip_prefix(real_path(r)) {
            out.push(if rel.as_os_str().is_empty() {
                r.to_path_buf()
            } else {
                r.join(rel)
            });
        }
    }
    out.sort();
    out.dedup();
    out
}

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

/// What a project file's network section grants, and the one thing it may not do alone.
fn check_project_network(
    n: &NetLayer,
    key: &str,
    grants: &mut Vec<String>,
) -> Result<(), PolicyError> {
    if let Some((NetworkMode::Host, at)) = &n.mode {
        return Err(at.error(format!(
            "{key}.mode = \"host\" gives the jail your unfiltered network; a project's policy \
             file may not enable that by itself (the repository could be hostile): set it in \
             your user config or pass --network host"
        )));
    }
    for (a, at) in &n.allow {
        grants.push(format!("{at}: {}", allow_text(key, a)));
    }
    for (c, at) in &n.allow_cidrs {
        grants.push(format!("{at}: {}", cidr_text(key, c)));
    }
    for (p, at) in &n.host_ports {
        grants.push(format!("{at}: {}", host_port_text(key, *p)));
    }
    if let Some((u, at)) = &n.upstream_proxy {
        grants.push(format!("{at}: {}", upstream_text(key, u)));
    }
    for (p, at) in &n.publish {
        grants.push(format!("{at}: {}", publish_text(key, *p)));
    }
    Ok(())
}

/// The location of a key in a policy file's text (`keys` is its path of table names), for
/// values the schema does not keep spans of; the start of the file when it cannot be found.
fn key_loc(file: &Path, text: &str, keys: &[&str]) -> Loc {
    let found = toml_edit::Document::parse(text).ok().and_then(|doc| {
        let mut item = doc.as_item();
        let mut span = None;
        for k in keys {
            let (key, next) = item.as_table_like()?.get_key_value(k)?;
            span = key.span();
            item = next;
        }
        span
    });
    Loc::in_file(file, text, found.unwrap_or(0..0))
}

/// How far a network mode opens: none < proxy < host.
fn mode_rank(m: NetworkMode) -> u8 {
    match m {
        NetworkMode::None => 0,
        NetworkMode::Proxy => 1,
        NetworkMode::Host => 2,
    }
}

/// A value of a project's layer that is in force (no higher layer replaced it).
fn in_force<T: PartialEq>(project: &Option<T>, merged: &Option<T>) -> bool {
    project.is_some() && project == merged
}

/// The network grants of a project's layer beyond the user's own (`without`).
fn net_trust(
    key: &str,
    project: &NetLayer,
    with: &NetLayer,
    without: &NetLayer,
    default_mode: NetworkMode,
    out: &mut Vec<(Loc, String)>,
) {
    if let Some((m, at)) = &project.mode {
        let in_force = with.mode.as_ref().map(|(w, _)| w) == Some(m);
        let before = without
            .mode
            .as_ref()
            .map(|(w, _)| *w)
            .unwrap_or(default_mode);
        if in_force && mode_rank(*m) > mode_rank(before) {
            out.push((
                at.clone(),
                format!(
                    "{key}.mode = {:?} opens the network (your settings say {:?})",
                    mode_name(*m),
                    mode_name(before)
                ),
            ));
        }
    }
    for (a, at) in &project.allow {
        if !without.allow.iter().any(|(w, _)| w == a) {
            out.push((at.clone(), allow_text(key, a)));
        }
    }
    for (c, at) in &project.allow_cidrs {
        if !without.allow_cidrs.iter().any(|(w, _)| w.contains(c)) {
            out.push((at.clone(), cidr_text(key, c)));
        }
    }
    for (p, at) in &project.host_ports {
        if !without.host_ports.iter().any(|(w, _)| w == p) {
            out.push((at.clone(), host_port_text(key, *p)));
        }
    }
    if let Some((u, at)) = &project.upstream_proxy
        && with.upstream_proxy.as_ref().map(|(w, _)| w) == Some(u)
        && without.upstream_proxy.as_ref().map(|(w, _)| w) != Some(u)
    {
        out.push((at.clone(), upstream_text(key, u)));
    }
    for (p, at) in &project.publish {
        if !without.publish.iter().any(|(w, _)| w == p) {
            out.push((at.clone(), publish_text(key, *p)));
        }
    }
}

fn mode_name(m: NetworkMode) -> &'static str {
    match m {
        NetworkMode::None => "none",
        NetworkMode::Proxy => "proxy",
        NetworkMode::Host => "host",
    }
}

fn profile_switch_text(at: &Loc, profile: &Profile, users: &str) -> String {
    let mut parts = Vec::new();
    let state: Vec<&str> = profile
        .state_dirs
        .iter()
        .chain(&profile.state_files)
        .map(String::as_str)
        .collect();
    if !state.is_empty() {
        parts.push(format!("binds {} read-write", state.join(", ")));
    }
    if !profile.env_pass.is_empty() {
        parts.push(format!("passes {}", profile.env_pass.join(", ")));
    }
    if !profile.secrets.is_empty() {
        let names: Vec<&str> = profile.secrets.keys().map(String::as_str).collect();
        parts.push(format!("serves the secrets {}", names.join(", ")));
    }
    if !profile.allow.is_empty() {
        let hosts: Vec<String> = profile.allow.iter().map(|d| d.to_string()).collect();
        parts.push(format!("reaches {}", hosts.join(", ")));
    }
    let what = if parts.is_empty() {
        String::new()
    } else {
        format!(": it {}", parts.join("; "))
    };
    format!(
        "{at}: profile = {:?} replaces your profile {users:?}{what}",
        profile.name
    )
}

/// Everything a project's own policy file grants beyond the user's own layers (defaults,
/// profile, user config, flags): what needs the user's trust before a jail starts. `with` is
/// the merged policy with the project's layer, `without` the same layers without it. What only
/// narrows (deny rules, lower limits, `ro`, hide, protect) or stays inside the jail (profile,
/// command, image, engine, env.set) is not here.
fn trust_grants(
    file: &Path,
    text: &str,
    project: &Layer,
    with: &Layer,
    without: &Layer,
    ctx: &PathCtx,
) -> Vec<(Loc, String)> {
    let mut out: Vec<(Loc, String)> = Vec::new();
    let at = |keys: &[&str]| key_loc(file, text, keys);
    let ro_project = without.project_access == Some(Access::Ro);
    if ro_project && in_force(&project.project_access, &with.project_access) {
        out.push((
            at(&["filesystem", "project"]),
            "filesystem.project = \"rw\" makes the project writable (your settings say \"ro\")"
                .into(),
        ));
    }
    let binds = [
        (&project.read_only, "filesystem.read_only", false),
        (&project.read_write, "filesystem.read_write", true),
        (&project.exec_read_only, "executor.sandbox.read_only", false),
        (
            &project.exec_read_write,
            "executor.sandbox.read_write",
            true,
        ),
    ];
    for (list, key, rw) in binds {
        let exec = key.starts_with("executor");
        let (w_ro, w_rw) = if exec {
            (&without.exec_read_only, &without.exec_read_write)
        } else {
            (&without.read_only, &without.read_write)
        };
        for (p, loc) in list {
            let given =
                w_rw.iter().any(|(q, _)| q == p) || (!rw && w_ro.iter().any(|(q, _)| q == p));
            if given {
                continue;
            }
            let outside = !p.starts_with(ctx.project) || !real_path(p).starts_with(ctx.project);
            if outside {
                out.push((loc.clone(), bind_text(key, p, rw)));
            } else if rw && ro_project {
                out.push((
                    loc.clone(),
                    format!(
                        "{key} makes {} writable in a project your settings make read-only",
                        p.display()
                    ),
                ));
            }
        }
    }
    for (name, loc) in &project.env_pass {
        if !without.env_pass.iter().any(|(w, _)| w == name) {
            out.push((loc.clone(), env_pass_text(name)));
        }
    }
    net_trust(
        "network",
        &project.net,
        &with.net,
        &without.net,
        NetworkMode::Proxy,
        &mut out,
    );
    for (name, (spec, loc)) in &project.secrets {
        if without.secrets.get(name).map(|(w, _)| w) != Some(spec) {
            out.push((loc.clone(), secret_text(name, spec)));
        }
    }
    // Limits: a higher value than the user's layers give, or best-effort instead of strict.
    let raised = |key: &str,
                  p: Option<u64>,
                  w: Option<u64>,
                  merged: Option<u64>,
                  show: &dyn Fn(u64) -> String| {
        match (p, w) {
            (Some(p), Some(w)) if p > w && merged == Some(p) => Some(format!(
                "{key} raises the limit from {} to {}",
                show(w),
                show(p)
            )),
            _ => None,
        }
    };
    let num = |n: u64| n.to_string();
    let ms = |n: u64| humantime::format_duration(std::time::Duration::from_millis(n)).to_string();
    let lims: [(&[&str], Option<String>); 6] = [
        (
            &["limits", "memory"],
            raised(
                "limits.memory",
                project.memory,
                without.memory,
                with.memory,
                &crate::config::size_text,
            ),
        ),
        (
            &["limits", "pids"],
            raised("limits.pids", project.pids, without.pids, with.pids, &num),
        ),
        (
            &["executor", "timeout"],
            raised(
                "executor.timeout",
                project.exec_timeout_ms,
                without.exec_timeout_ms,
                with.exec_timeout_ms,
                &ms,
            ),
        ),
        (
            &["executor", "max_output"],
            raised(
                "executor.max_output",
                project.exec_max_output,
                without.exec_max_output,
                with.exec_max_output,
                &crate::config::size_text,
            ),
        ),
        (
            &["executor", "max_concurrent"],
            raised(
                "executor.max_concurrent",
                project.exec_max_concurrent.map(|n| n as u64),
                without.exec_max_concurrent.map(|n| n as u64),
                with.exec_max_concurrent.map(|n| n as u64),
                &num,
            ),
        ),
        (
            &["limits", "cpus"],
            match (project.cpus, without.cpus) {
                (Some(p), Some(w)) if p > w && with.cpus == Some(p) => {
                    Some(format!("limits.cpus raises the limit from {w} to {p}"))
                }
                _ => None,
            },
        ),
    ];
    for (keys, text) in lims {
        if let Some(t) = text {
            out.push((at(keys), t));
        }
    }
    if project.clipboard == Some(true)
        && with.clipboard == Some(true)
        && without.clipboard != Some(true)
    {
        out.push((at(&["terminal", "clipboard"]), CLIPBOARD_GRANT.into()));
    }
    if project.enforce == Some(Enforce::BestEffort)
        && with.enforce == Some(Enforce::BestEffort)
        && without.enforce == Some(Enforce::Strict)
    {
        out.push((
            at(&["limits", "enforce"]),
            "limits.enforce = \"best-effort\" runs the jail even where a limit cannot be \
             enforced (your settings say \"strict\": refuse)"
                .into(),
        ));
    }
    // The executor: programs beyond the user's allowlist, where its commands run, its jail.
    if let (Some(p), Some(w)) = (&project.exec_allow, &without.exec_allow)
        && in_force(&project.exec_allow, &with.exec_allow)
        && !w.is_empty()
    {
        let extra: Vec<&String> = p.iter().filter(|x| !w.contains(x)).collect();
        let text = if p.is_empty() {
            Some(format!(
                "executor.allow = [] lets the executor run any program (your settings allow only {})",
                w.join(", ")
            ))
        } else if !extra.is_empty() {
            Some(format!(
                "executor.allow adds {} to the programs the executor may run",
                extra
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        } else {
            None
        };
        if let Some(t) = text {
            out.push((at(&["executor", "allow"]), t));
        }
    }
    if let Some((t, loc)) = &project.exec_target
        && with.exec_target.as_ref().map(|(w, _)| w) == Some(t)
        && without.exec_target.as_ref().map(|(w, _)| w) != Some(t)
    {
        match t {
            ExecutorTarget::Sandbox => {}
            ExecutorTarget::Compose(svc) => out.push((loc.clone(), compose_text(svc))),
            ExecutorTarget::Host => out.push((
                loc.clone(),
                "executor.target = \"host\" runs the agent's commands unsandboxed on your machine"
                    .into(),
            )),
        }
    }
    net_trust(
        "executor.sandbox.network",
        &project.exec_net,
        &with.exec_net,
        &without.exec_net,
        NetworkMode::None,
        &mut out,
    );
    out.sort_by_key(|(loc, _)| match loc {
        Loc::File { line, col, .. } => (*line, *col),
        _ => (0, 0),
    });
    out
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The layer of a harness profile.
fn profile_layer(p: &Profile, home: &Path) -> Layer {
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

fn expand_home_value(v: &str, home: &Path) -> String {
    match v.strip_prefix("~/") {
        Some(rest) => home.join(rest).display().to_string(),
        None if v == "~" => home.display().to_string(),
        None => v.to_string(),
    }
}

/// The command-line layer.
fn flags_layer(f: &Flags, cwd: &Path, home: &Path) -> Result<Layer, PolicyError> {
    let mut l = Layer {
        engine: f.engine,
        exec_allow_host: f.allow_host_executor,
        allow_harness_config: f.allow_harness_config,
        cpus: f.cpus,
        pids: f.pids,
        enforce: f.enforce,
        ..Layer::default()
    };
    if let Some(m) = f.network {
        l.net.mode = Some((m, Loc::Flag("--network")));
    }
    for a in &f.allow {
        let p = DomainPattern::parse(a)
            .map_err(|e| PolicyError::Invalid(format!("--allow {a:?}: {e}")))?;
        l.net.allow.push((p, Loc::Flag("--allow")));
    }
    let abs = |p: &Path| {
        let s = p.to_string_lossy();
        let p = if s == "~" {
            home.to_path_buf()
        } else if let Some(rest) = s.strip_prefix("~/") {
            home.join(rest)
        } else {
            cwd.join(p)
        };
        normalize(&p)
    };
    // A path named on the command line must exist (a typo is not silently skipped); those of
    // policy files stay optional (`~/.gitconfig` is not on every machine).
    let named = |flag: &'static str, p: &PathBuf| {
        let a = abs(p);
        match std::fs::metadata(&a) {
            Ok(_) => Ok((a, Loc::Flag(flag))),
            Err(e) => Err(PolicyError::Invalid(format!(
                "{flag} {}: cannot bind {}: {e}",
                p.display(),
                a.display()
            ))),
        }
    };
    l.read_write =
        f.rw.iter()
            .map(|p| named("--rw", p))
            .collect::<Result<_, _>>()?;
    l.read_only =
        f.ro.iter()
            .map(|p| named("--ro", p))
            .collect::<Result<_, _>>()?;
    for e in &f.env {
        match e.split_once('=') {
            Some((k, v)) => {
                EnvName::parse(k).map_err(|m| PolicyError::Invalid(format!("--env {e:?}: {m}")))?;
                l.env_set
                    .insert(k.to_string(), (v.to_string(), Loc::Flag("--env")));
            }
            None => {
                EnvName::parse(e).map_err(|m| PolicyError::Invalid(format!("--env {e:?}: {m}")))?;
                l.env_pass.push((e.clone(), Loc::Flag("--env")));
            }
        }
    }
    if let Some(m) = &f.memory {
        l.memory = Some(
            MemorySize::parse(m)
                .map_err(|e| PolicyError::Invalid(format!("--memory: {e}")))?
                .0,
        );
    }
    if let Some(c) = f.cpus
        && !(c.is_finite() && c > 0.0)
    {
        return Err(PolicyError::Invalid(format!(
            "--cpus {c}: expected a positive number such as 2 or 0.5"
        )));
    }
    if let Some(c) = f.cpus {
        crate::config::check_cpus_here(c)
            .map_err(|e| PolicyError::Invalid(format!("--cpus {c}: {e}")))?;
    }
    l.net.publish = f
        .publish
        .iter()
        .map(|p| (*p, Loc::Flag("--publish")))
        .collect();
    Ok(l)
}

/// The git root of `dir` (the nearest ancestor holding `.git`, a directory or a worktree's
/// file), else `dir` itself.
pub fn project_root(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| d.join(".git").symlink_metadata().is_ok())
        .unwrap_or(dir)
        .to_path_buf()
}

/// Directories that are never a project unless named with `--project`, nor any directory that
/// contains one: the system's own trees, other users' homes, and shared places full of other
/// programs' files and sockets.
const NEVER_A_PROJECT: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/local",
    "/var",
    "/var/lib",
    "/var/tmp",
];

/// Choose the project directory: `--scratch`, `--project DIR`, else the enclosing git
/// repository's top level, else `cwd`. A directory chosen by the last two rules is refused when
/// it is not a sensible project ([`why_not_a_project`]).
fn choose_project(
    req: &Request,
    cwd: &Path,
    home: &Path,
    corral_dirs: &[PathBuf],
) -> Result<(PathBuf, ProjectSource), PolicyError> {
    match (&req.flags.project, req.flags.scratch) {
        (Some(_), true) => Err(PolicyError::Invalid(
            "--project and --scratch name two different projects: pass one of them".into(),
        )),
        (None, true) => Ok((scratch_dir(&req.env)?, ProjectSource::Scratch)),
        (Some(dir), false) => {
            let dir = cwd.join(dir);
            let real = dir.canonicalize().map_err(|source| PolicyError::Io {
                what: "--project: cannot resolve the directory",
                path: dir.clone(),
                source,
            })?;
            if !real.is_dir() {
                return Err(PolicyError::Invalid(format!(
                    "--project {}: not a directory",
                    dir.display()
                )));
            }
            Ok((real, ProjectSource::ProjectFlag))
        }
        (None, false) => {
            let top = project_root(cwd);
            let source = if top.join(".git").symlink_metadata().is_ok() {
                ProjectSource::GitTopLevel
            } else {
                ProjectSource::CurrentDirectory
            };
            if let Some(why) = why_not_a_project(&top, home, corral_dirs, &req.env) {
                return Err(PolicyError::Invalid(format!(
                    "refusing to make {} the project: it {why}, and the project is mounted read-write \
                     into the jail (chosen as {}). Run corral from your project's directory, or \
                     name the directory the agent may work on: --project DIR (exactly that \
                     directory), or --scratch (a fresh empty directory, removed afterwards)",
                    top.display(),
                    source.describe()
                )));
            }
            Ok((top, source))
        }
    }
}

/// Why `dir` (absolute, symlinks resolved) is not a sensible project, if it is not: it is or
/// contains the user's home, corral's own config or state directory, a system directory, or
/// the user's runtime directory (sockets).
pub fn why_not_a_project(
    dir: &Path,
    home: &Path,
    corral_dirs: &[PathBuf],
    env: &BTreeMap<String, String>,
) -> Option<String> {
    // Each place as written and as it really is (HOME=/home/u with /home -> /var/home).
    let holds = |p: &Path| p.starts_with(dir) || real_path(p).starts_with(dir);
    if dir == Path::new("/") {
        return Some("is the root of the filesystem".into());
    }
    if holds(home) {
        return Some(if home == dir || real_path(home) == dir {
            "is your home directory (your keys, tokens and shell start-up files)".into()
        } else {
            format!("contains your home directory {}", home.display())
        });
    }
    for d in corral_dirs {
        if holds(d) {
            return Some(format!(
                "contains corral's own directory {} (your trust store, config or audit logs)",
                d.display()
            ));
        }
    }
    // As written first (/usr holds /usr, even where /bin really is /usr/bin).
    let system = NEVER_A_PROJECT
        .iter()
        .find(|sys| Path::new(sys).starts_with(dir))
        .or_else(|| NEVER_A_PROJECT.iter().find(|sys| holds(Path::new(sys))));
    if let Some(sys) = system {
        return Some(format!("is or contains the system directory {sys}"));
    }
    if let Some(run) = env.get("XDG_RUNTIME_DIR").filter(|r| r.starts_with('/'))
        && holds(Path::new(run))
    {
        return Some(format!(
            "contains your runtime directory {run} (the sockets of your session's services)"
        ));
    }
    None
}

/// Create a fresh scratch directory for `--scratch` under `TMPDIR` (or /tmp).
fn scratch_dir(env: &BTreeMap<String, String>) -> Result<PathBuf, PolicyError> {
    let base = env
        .get("TMPDIR")
        .filter(|t| t.starts_with('/'))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let mut buf = [0u8; 8];
    getrandom_fill(&mut buf);
    let name: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    let dir = base.join(format!("corral-scratch-{name}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|source| PolicyError::Io {
            what: "cannot create the scratch directory",
            path: dir.clone(),
            source,
        })?;
    dir.canonicalize().map_err(|source| PolicyError::Io {
        what: "cannot resolve the scratch directory",
        path: dir.clone(),
        source,
    })
}

/// Unpredictable bytes from the kernel (/dev/urandom), for names only.
fn getrandom_fill(buf: &mut [u8]) {
    use std::io::Read;
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok();
    if !filled {
        // Names only need to be unique: fall back to time and pid.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ u128::from(std::process::id());
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (t >> (8 * (i % 16))) as u8;
        }
    }
}

fn is_system_path(p: &Path) -> bool {
    SYSTEM_DIRS.iter().any(|d| p.starts_with(d))
}

/// The marker every `corral shim` wrapper carries in its first bytes (cmd/shim.rs).
pub const SHIM_MARKER: &str = "# corral-shim v1";

/// Whether the file at `path` is a corral shim (carries [`SHIM_MARKER`] in its first 512 bytes).
pub fn is_shim(path: &Path) -> bool {
    use std::io::Read;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = Vec::with_capacity(512);
    if f.take(512).read_to_end(&mut head).is_err() {
        return false;
    }
    head.windows(SHIM_MARKER.len())
        .any(|w| w == SHIM_MARKER.as_bytes())
}

/// Look `name` up on `path_var` the way a shell does: the first executable regular file,
/// skipping corral's own shims (`pi` on PATH may be the shim that runs `corral run pi`; the
/// jail runs the real one).
pub fn which(name: &str, path_var: &str, cwd: &Path) -> Option<PathBuf> {
    if name.contains('/') {
        let p = normalize(&cwd.join(name));
        return is_executable(&p).then_some(p);
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| cwd.join(d).join(name))
        .find(|p| is_executable(p) && !is_shim(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The directory a program outside the system directories lives in, to bind read-only: the
/// nearest ancestor that is a package (`package.json`, a Python venv's `pyvenv.cfg`), or an
/// installation prefix (`PREFIX/bin/PROG` beside `PREFIX/lib` and `PREFIX/include`, as nvm
/// lays node out); else the program file alone. Never the home or `/` itself.
pub fn package_dir(exe: &Path, home: &Path) -> PathBuf {
    // The installation prefix first: nvm's own checkout (~/.nvm) holds a package.json that must
    // not turn one node binary into every version nvm has.
    if let Some(bin) = exe
        .parent()
        .filter(|b| b.file_name() == Some("bin".as_ref()))
        && let Some(prefix) = bin.parent()
        && prefix != home
        && !home.starts_with(prefix)
        && prefix.join("lib").is_dir()
        && prefix.join("include").is_dir()
    {
        return prefix.to_path_buf();
    }
    for dir in exe.ancestors().skip(1) {
        if dir == home || dir.parent().is_none() || home.starts_with(dir) {
            break;
        }
        if dir.join("package.json").is_file() || dir.join("pyvenv.cfg").is_file() {
            return dir.to_path_buf();
        }
    }
    exe.to_path_buf()
}

/// The interpreter named by a script's `#!` line (`#!/usr/bin/env node` gives `node`).
fn shebang(exe: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(exe).ok()?.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let rest = line.strip_prefix("#!")?.trim();
    let mut words = rest.split_whitespace();
    let first = words.next()?;
    if first.ends_with("/env") {
        words.find(|w| !w.starts_with('-')).map(str::to_string)
    } else {
        Some(first.to_string())
    }
}

/// The resolved command, the binds it needs and the directories to put on PATH.
struct ResolvedCommand {
    argv: Vec<String>,
    binds: Vec<PathBuf>,
    path_dirs: Vec<PathBuf>,
}

fn resolve_command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
    home: &Path,
    toolchains: &[crate::plan::Toolchain],
) -> ResolvedCommand {
    let mut out = ResolvedCommand {
        argv: argv.to_vec(),
        binds: Vec::new(),
        path_dirs: Vec::new(),
    };
    let path_var = env.get("PATH").map(String::as_str).unwrap_or(SYSTEM_PATH);
    let Some(found) = argv.first().and_then(|a| which(a, path_var, cwd)) else {
        return out;
    };
    let canonical = found.canonicalize().unwrap_or_else(|_| found.clone());
    // A toolchain's program that is no script runs by the name it was found under (a rustup
    // proxy is one binary that dispatches on that name), from the toolchain's own bind.
    let multi_call = found.file_name() != canonical.file_name() && shebang(&canonical).is_none();
    if is_system_path(&found) && is_system_path(&canonical)
        || multi_call
            && crate::toolchain::covers(toolchains, &found)
            && crate::toolchain::covers(toolchains, &canonical)
    {
        out.argv[0] = found.display().to_string();
        return out;
    }
    out.argv[0] = canonical.display().to_string();
    out.binds.push(package_dir(&canonical, home));
    // A script's interpreter outside the system directories (node under nvm) comes along.
    if let Some(interp) = shebang(&canonical)
        && let Some(ip) = which(&interp, path_var, cwd)
    {
        let ic = ip.canonicalize().unwrap_or_else(|_| ip.clone());
        if !is_system_path(&ic) {
            out.binds.push(package_dir(&ic, home));
            if let Some(d) = ic.parent() {
                out.path_dirs.push(d.to_path_buf());
            }
        }
    }
    out
}

/// The `hide` glob of one pattern: without a slash it matches at any depth; with one it is
/// anchored at the project root.
fn hide_glob(pattern: &str) -> Result<globset::Glob, String> {
    let p = pattern.trim_end_matches('/');
    if p.is_empty() || p == "/" {
        return Err(format!("filesystem.hide: empty pattern {pattern:?}"));
    }
    let g = if let Some(anchored) = p.strip_prefix('/') {
        anchored.to_string()
    } else if p.contains('/') {
        p.to_string()
    } else {
        format!("**/{p}")
    };
    globset::GlobBuilder::new(&g)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("filesystem.hide: invalid pattern {pattern:?}: {e}"))
}

/// Entries a project walk ([`find_masked`], the change summary's) visits on the calling thread
/// before it starts over in parallel: a small project is listed without starting (and waiting
/// for) walker threads, which on a busy machine costs more than the walk itself.
pub const SEQUENTIAL_WALK_MAX: usize = 4096;

/// A walker over the whole of `root` as it is on disk: every ignore filter off (a `.gitignore`
/// must not hide a file from corral), links not followed, and `skip` not entered.
pub fn raw_walker(root: &Path, skip: PathBuf) -> ignore::WalkBuilder {
    let mut builder = ignore::WalkBuilder::new(root);
    builder
        .standard_filters(false)
        .hidden(false)
        .parents(false)
        .ignore(false)
        .git_ignore(false)
        .git_global(false)
        .git_exclude(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(move |e| e.path() != skip);
    builder
}

/// Every entry under `root` matched by one of the `hide` patterns, found with every ignore
/// filter off (a `.gitignore` must not hide `.env` from this search), not descending into
/// `.git/objects` or into a matched directory: on this thread for a tree of at most
/// [`SEQUENTIAL_WALK_MAX`] entries, else in one parallel walk. Sorted.
pub fn find_masked(root: &Path, patterns: &[String]) -> Result<Vec<PathBuf>, PolicyError> {
    let mut b = globset::GlobSetBuilder::new();
    for p in patterns {
        b.add(hide_glob(p).map_err(PolicyError::Invalid)?);
    }
    let set = b
        .build()
        .map_err(|e| PolicyError::Invalid(format!("filesystem.hide: {e}")))?;
    if patterns.is_empty() {
        return Ok(Vec::new());
    }
    let builder = raw_walker(root, root.join(".git/objects"));
    // A small project is walked on this thread: starting the walker's threads (and waiting for
    // every one of them to be scheduled and go idle) costs more than the walk on a busy
    // machine, and this walk is on the path of every `corral run`. Beyond
    // SEQUENTIAL_WALK_MAX entries, start over in parallel.
    let mut small = Vec::new();
    // Matched directories: what lies below them is not listed (their mount covers it).
    let mut covered: Vec<PathBuf> = Vec::new();
    let mut complete = true;
    for (seen, entry) in builder.build().enumerate() {
        if seen >= SEQUENTIAL_WALK_MAX {
            complete = false;
            break;
        }
        // An unreadable directory cannot be listed by the jail's user either.
        let Ok(entry) = entry else { continue };
        let Ok(rel) = entry.path().strip_prefix(root) else {
            continue;
        };
        if rel.as_os_str().is_empty()
            || !set.is_match(rel)
            || covered.iter().any(|d| entry.path().starts_with(d))
        {
            continue;
        }
        if entry.file_type().is_some_and(|t| t.is_dir()) {
            covered.push(entry.path().to_path_buf());
        }
        small.push(entry.path().to_path_buf());
    }
    if complete {
        small.sort();
        return Ok(small);
    }
    let found = std::sync::Mutex::new(Vec::new());
    let errors = std::sync::Mutex::new(None);
    builder.build_parallel().run(|| {
        let set = &set;
        let found = &found;
        let errors = &errors;
        Box::new(move |entry| {
            use ignore::WalkState;
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    // An unreadable directory cannot be listed by the jail's user either;
                    // remember the first error for the report and keep walking.
                    let mut slot = errors.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert_with(|| e.to_string());
                    return WalkState::Continue;
                }
            };
            let Ok(rel) = entry.path().strip_prefix(root) else {
                return WalkState::Continue;
            };
            if rel.as_os_str().is_empty() || !set.is_match(rel) {
                return WalkState::Continue;
            }
            found
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(entry.path().to_path_buf());
            if entry.file_type().is_some_and(|t| t.is_dir()) {
                WalkState::Skip
            } else {
                WalkState::Continue
            }
        })
    });
    let mut found = found.into_inner().unwrap_or_else(|p| p.into_inner());
    found.sort();
    Ok(found)
}

fn dedup<T: PartialEq + Clone>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

fn bind(source: &Path, target: &Path, access: Access, optional: bool) -> Mount {
    Mount {
        source: source
            .canonicalize()
            .unwrap_or_else(|_| source.to_path_buf()),
        target: target.to_path_buf(),
        kind: MountKind::Bind(access),
        optional,
    }
}

/// `dns = "stub"` answers for the proxy's rules and hands its connections to the proxy: it needs
/// network mode `proxy`.
fn check_dns(n: &NetLayer, plan: &NetworkPlan, key: &str) -> Result<(), PolicyError> {
    let mode = match plan.mode {
        NetworkMode::None => "none",
        NetworkMode::Host => "host",
        NetworkMode::Proxy => return Ok(()),
    };
    match &n.dns {
        Some((Dns::Stub, at)) => Err(at.error(format!(
            "{key}.dns = \"stub\" needs {key}.mode = \"proxy\" (the stub answers only names the \
             proxy allows, and the proxy takes their connections); the mode here is \"{mode}\""
        ))),
        _ => Ok(()),
    }
}

/// The jail's loopback port of corral's proxy (network mode `proxy`).
const JAIL_PROXY_PORT: u16 = 3128;
/// The jail's loopback port of the stub resolver (`dns = "stub"`).
const JAIL_DNS_PORT: u16 = 53;

/// `publish` and `host_ports` may not take the jail's loopback ports corral itself listens on:
/// 3128 (the proxy) in mode `proxy`, 53 with `dns = "stub"`. Published, they would hand the
/// host's 127.0.0.1:PORT to corral's own listener; as `host_ports`, they would take it from
/// the jail.
fn check_own_ports(n: &NetLayer, plan: &NetworkPlan, key: &str) -> Result<(), PolicyError> {
    if plan.mode != NetworkMode::Proxy {
        return Ok(());
    }
    let own = |p: u16| match p {
        JAIL_PROXY_PORT => Some("corral's proxy"),
        JAIL_DNS_PORT if plan.dns == Dns::Stub => Some("the stub resolver"),
        _ => None,
    };
    let entries = n
        .publish
        .iter()
        .map(|e| ("publish", e))
        .chain(n.host_ports.iter().map(|e| ("host_ports", e)));
    for (field, (port, at)) in entries {
        if let Some(what) = own(*port) {
            return Err(at.error(format!(
                "{key}.{field} {port}: the jail's 127.0.0.1:{port} is {what} (corral's own \
                 port in network mode \"proxy\"); use another port"
            )));
        }
    }
    Ok(())
}

fn network_plan(n: &NetLayer, default_mode: NetworkMode) -> NetworkPlan {
    NetworkPlan {
        mode: n.mode.as_ref().map(|(m, _)| *m).unwrap_or(default_mode),
        allow: dedup(n.allow.iter().map(|(a, _)| a.clone())),
        deny: dedup(n.deny.iter().cloned()),
        allow_cidrs: dedup(n.allow_cidrs.iter().map(|(c, _)| *c)),
        host_ports: dedup(n.host_ports.iter().map(|(p, _)| *p)),
        publish: dedup(n.publish.iter().map(|(p, _)| *p)),
        upstream_proxy: n.upstream_proxy.as_ref().map(|(u, _)| u.clone()),
        dns: n.dns.as_ref().map(|(d, _)| *d).unwrap_or_default(),
    }
}

/// The proxy variables of a jail in proxy mode.
pub fn proxy_env(url: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        env.insert(k.to_string(), url.to_string());
    }
    for k in ["NO_PROXY", "no_proxy"] {
        env.insert(k.to_string(), "localhost,127.0.0.1,::1".to_string());
    }
    env.insert("NODE_USE_ENV_PROXY".into(), "1".into());
    env
}

/// The base environment of every jail: home, PATH (corral first), TMPDIR, and the caller's
/// terminal and locale variables.
fn base_env(req: &Request, extra_path: &[PathBuf]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for k in BASIC_PASS {
        if let Some(v) = req.env.get(*k) {
            env.insert(k.to_string(), v.clone());
        }
    }
    env.entry("LANG".into()).or_insert_with(|| "C.UTF-8".into());
    env.insert("HOME".into(), req.home.display().to_string());
    env.insert("TMPDIR".into(), "/tmp".into());
    let mut path = vec![JAIL_BIN_DIR.to_string()];
    for p in extra_path {
        let p = p.display().to_string();
        if !path.contains(&p) {
            path.push(p);
        }
    }
    path.push(SYSTEM_PATH.to_string());
    env.insert("PATH".into(), path.join(":"));
    env
}

/// Resolve the policy layers for `req` into a [`Plan`].
///
/// Layers, lowest first: built-in defaults, the harness profile, the user config, the project's
/// `corral.toml` (or `--policy FILE`), the command-line flags. Lists accumulate; scalars of a
/// higher layer win. With `--scratch` the project is a fresh directory (created here; the
/// caller removes it when the run ends) and no project policy is read unless `--policy` names
/// one.
pub fn resolve(req: &Request) -> Result<Plan, PolicyError> {
    let cwd = req.cwd.canonicalize().map_err(|source| PolicyError::Io {
        what: "cannot resolve the working directory",
        path: req.cwd.clone(),
        source,
    })?;
    let home = normalize(&req.home);
    let corral_dirs = [
        crate::trust::config_dir(&req.env, &home),
        crate::trust::state_dir(&req.env, &home),
    ];
    let (root, project_source) = choose_project(req, &cwd, &home, &corral_dirs)?;
    let scratch = project_source == ProjectSource::Scratch;
    let ctx = PathCtx {
        home: &home,
        project: &root,
        corral_dirs: &corral_dirs,
    };
    let project_policy_path = root.join("corral.toml");
    let user_config = req.user_config.as_deref();
    let mut grants = Vec::new();
    let mut sources = Vec::new();

    let mut user = Layer::default();
    if let Some(uc) = user_config.filter(|p| p.exists()) {
        let (pf, text) = load_policy(uc)?;
        user = file_layer(uc, &text, pf, Trust::User, &ctx, user_config, &mut grants)?;
        sources.push(uc.to_path_buf());
    }
    let project_file = match &req.flags.policy {
        Some(p) => Some(normalize(&cwd.join(p))),
        None if !scratch && project_policy_path.exists() => Some(project_policy_path.clone()),
        None => None,
    };
    let mut project = Layer::default();
    let mut project_text = String::new();
    if let Some(pf_path) = &project_file {
        let (pf, text) = load_policy(pf_path)?;
        project_text = text.clone();
        project = file_layer(
            pf_path,
            &text,
            pf,
            Trust::Project,
            &ctx,
            user_config,
            &mut grants,
        )?;
        sources.push(pf_path.clone());
    }
    let flags = flags_layer(&req.flags, &cwd, &home)?;

    let profile_name = req
        .profile
        .clone()
        .or_else(|| project.profile.as_ref().map(|(n, _)| n.clone()))
        .or_else(|| user.profile.as_ref().map(|(n, _)| n.clone()))
        .unwrap_or_else(|| "shell".to_string());
    let profile = crate::profile::profile(&profile_name)?;
    // The profile the user's own word (flags, user config, the default) would give.
    let users_profile = req
        .profile
        .clone()
        .or_else(|| user.profile.as_ref().map(|(n, _)| n.clone()))
        .unwrap_or_else(|| "shell".to_string());
    // The same layers without the project's file: what the user's own word gives, against
    // which the project's grants are measured.
    let mut without = defaults();
    without.merge(profile_layer(&profile, &home));
    without.merge(user.clone());
    without.merge(flags.clone());
    let project_layer = project.clone();

    let built_in = built_in_limits(&[&user, &project, &flags]);
    let mut m = defaults();
    m.merge(profile_layer(&profile, &home));
    m.merge(user);
    m.merge(project);
    m.merge(flags);

    // What the project's file grants that needs the user's trust; `corral plan` lists those not
    // already in the grants list too (relaxed limits, modes and allowlists).
    let mut project_trust = None;
    if let Some(pf_path) = &project_file {
        let gated = trust_grants(pf_path, &project_text, &project_layer, &m, &without, &ctx);
        let mut gated: Vec<String> = gated
            .into_iter()
            .map(|(at, text)| format!("{at}: {text}"))
            .collect();
        // A profile the project file switches to brings that harness's state directories
        // (read-write: its settings, hooks and credentials), its variables, secrets and hosts.
        if let Some((name, at)) = &project_layer.profile
            && *name != users_profile
            && req.profile.is_none()
        {
            gated.insert(0, profile_switch_text(at, &profile, &users_profile));
        }
        for g in &gated {
            if !grants.contains(g) {
                grants.push(g.clone());
            }
        }
        // Only the project's own corral.toml is gated: a `--policy` file is one the user named.
        if req.flags.policy.is_none() {
            project_trust = Some(ProjectTrust {
                file: pf_path.clone(),
                sha256: crate::trust::sha256_hex(project_text.as_bytes()),
                grants: gated,
            });
        }
    }

    // The executor's opt-in comes from the user config or a flag only (project layers refuse
    // `allow_host` above).
    let (target, target_at) = m.exec_target.clone().unwrap_or((
        ExecutorTarget::Sandbox,
        Loc::Builtin("built-in defaults".into()),
    ));
    if target == ExecutorTarget::Host && !m.exec_allow_host {
        let from_project =
            matches!(&target_at, Loc::File { file, .. } if Some(file) == project_file.as_ref());
        return Err(target_at.error(format!(
            "executor.target = \"host\" runs the agent's commands unsandboxed on your machine and \
             needs an explicit opt-in{}: set `allow_host = true` under [executor] in your user \
             config ({}) or pass --allow-host-executor",
            if from_project {
                "; a project's policy file cannot give it (the repository could be hostile)"
            } else {
                ""
            },
            user_config
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "$XDG_CONFIG_HOME/corral/config.toml".into())
        )));
    }

    // The command: `-- CMD`, else the policy's run.command, else the profile's. `-- CMD` that
    // runs the profile's own program (`corral run pi -- pi ARGS`, as a shim does) is the
    // profile's command with arguments: it keeps the skill.
    let own_program = |c: &[String]| {
        let name = |s: &String| Path::new(s).file_name().map(|n| n.to_os_string());
        matches!((c.first().and_then(name), profile.command.first().and_then(name)),
                 (Some(a), Some(b)) if a == b)
    };
    let custom_command =
        m.command.is_some() || !(req.command.is_empty() || own_program(&req.command));
    let argv = if !req.command.is_empty() {
        req.command.clone()
    } else {
        m.command.clone().unwrap_or_else(|| profile.command.clone())
    };
    // Toolchains under the home, bound read-only into both jails, their programs on PATH. Not
    // into a container: its image brings its own (built for its own libc).
    let toolchains = match m.engine.unwrap_or(Engine::Native) {
        Engine::Native | Engine::Auto => crate::toolchain::find(&home, &req.env),
        Engine::Podman | Engine::Docker => Vec::new(),
    };
    let toolchain_binds: Vec<Mount> = toolchains
        .iter()
        .flat_map(|t| &t.binds)
        .map(|b| bind(b, b, Access::Ro, true))
        .collect();
    let toolchain_path = crate::toolchain::path_dirs(&toolchains, &req.env);
    let cmd = resolve_command(&argv, &req.env, &cwd, &home, &toolchains);

    // Mounts, in the order they are applied.
    let access = m.project_access.unwrap_or(Access::Rw);
    let mut mounts = system_mounts();
    mounts.push(Mount {
        source: PathBuf::new(),
        target: home.clone(),
        kind: MountKind::Tmpfs,
        optional: false,
    });
    for d in profile.state_dirs.iter().chain(&profile.state_files) {
        let p = PathBuf::from(expand_home_value(d, &home));
        mounts.push(bind(&p, &p, Access::Rw, false));
    }
    for d in &profile.read_only {
        let p = PathBuf::from(expand_home_value(d, &home));
        mounts.push(bind(&p, &p, Access::Ro, true));
    }
    for b in &cmd.binds {
        mounts.push(bind(b, b, Access::Ro, false));
    }
    mounts.extend(toolchain_binds.iter().cloned());
    // Policy binds, split into those outside the project and those inside it. Mounts apply in
    // order, so a bind inside the project (`--ro vendor`) must come after the project's own
    // mount, which would otherwise cover it (and the jail would run without it).
    let policy_binds = |ro: &[(PathBuf, Loc)], rw: &[(PathBuf, Loc)]| {
        let mut out = Vec::new();
        for (p, _) in dedup(ro.iter().cloned()) {
            out.push(bind(&p, &p, Access::Ro, true));
        }
        for (p, _) in dedup(rw.iter().cloned()) {
            out.push(bind(&p, &p, Access::Rw, true));
        }
        let (inside, outside): (Vec<Mount>, Vec<Mount>) = out
            .into_iter()
            .partition(|b: &Mount| b.target.starts_with(&root) && b.target != root);
        (outside, inside)
    };
    let (outside, inside) = policy_binds(&m.read_only, &m.read_write);
    mounts.extend(outside);
    let project_mount = bind(&root, &root, access, false);
    let corral_mount = bind(
        &req.corral_exe,
        &Path::new(JAIL_BIN_DIR).join("corral"),
        Access::Ro,
        false,
    );
    mounts.push(project_mount.clone());
    mounts.push(corral_mount.clone());
    mounts.extend(inside);

    // Masked and protected files of the project.
    let hide: Vec<String> = dedup(m.hide.iter().map(|(h, _)| h.clone()));
    let masked = find_masked(&root, &hide)?;
    // Absent ones too: the native jail creates a read-only placeholder so the jail cannot
    // create them (a fresh repository's `.git/hooks`).
    let mut protected: Vec<PathBuf> = dedup(m.protect.iter().map(|(p, _)| root.join(p)));
    // Every policy file that the jail could otherwise see writable: the project's corral.toml
    // always (even when absent, so its creation is blocked too), and the user config or
    // --policy file when a read-write bind covers it.
    protected.push(project_policy_path.clone());
    let rw_roots: Vec<&PathBuf> = std::iter::once(&root)
        .chain(m.read_write.iter().map(|(p, _)| p))
        .chain(m.exec_read_write.iter().map(|(p, _)| p))
        .collect();
    // Each is compared as written and as it really is: `~/.config/corral` may be a symlink
    // into a dotfiles repository that is the project or a `--rw` bind, and then the jail
    // reaches the real files through that bind.
    for f in user_config.into_iter().chain(project_file.as_deref()) {
        protected.extend(rw_views(f, &rw_roots));
    }
    // corral's own directories (user config, trust store, audit logs) when a read-write bind
    // the user asked for covers them: the agent must not trust a policy for itself, plant a
    // user config or rewrite the audit log. A directory that holds the project is left alone
    // (covering it would make the project read-only); the trust store alone is protected then.
    for dir in &corral_dirs {
        for seen in rw_views(dir, &rw_roots) {
            if root.starts_with(&seen) {
                protected.push(seen.join(crate::trust::STORE_FILE));
            } else {
                protected.push(seen);
            }
        }
    }
    protected.sort();
    protected.dedup();

    // Secrets: the profile's when the caller has them; the policy's always.
    let mut secrets: BTreeMap<String, SecretPlan> = BTreeMap::new();
    for (name, spec) in &profile.secrets {
        if req.env.contains_key(&spec.from_env.0) {
            secrets.insert(name.clone(), secret_plan(name, spec));
        }
    }
    for (name, (spec, _)) in &m.secrets {
        secrets.insert(name.clone(), secret_plan(name, spec));
    }

    // Environment: the basics, passed names, set values, proxy variables; never a secret's
    // real value (the gateway sets placeholders at run time).
    let network = network_plan(&m.net, NetworkMode::Proxy);
    check_dns(&m.net, &network, "network")?;
    check_own_ports(&m.net, &network, "network")?;
    let path_dirs: Vec<PathBuf> = cmd
        .path_dirs
        .iter()
        .chain(&toolchain_path)
        .cloned()
        .collect();
    let mut env = base_env(req, &path_dirs);
    env.extend(toolchains.iter().flat_map(|t| t.env.clone()));
    for (name, _) in &m.env_pass {
        if let Some(v) = req.env.get(name) {
            env.insert(name.clone(), v.clone());
        }
    }
    for (k, (v, _)) in &m.env_set {
        env.insert(k.clone(), v.clone());
    }
    if network.mode == NetworkMode::Proxy {
        env.extend(proxy_env(JAIL_PROXY_URL));
    }
    for (name, s) in &secrets {
        env.remove(name);
        env.remove(&s.from_env);
    }

    let limits = Limits {
        memory: m.memory,
        cpus: m.cpus,
        pids: m.pids,
        enforce: m.enforce.unwrap_or(Enforce::Strict),
        built_in,
    };
    let project_plan = ProjectPlan {
        root: root.clone(),
        access,
        scratch,
        source: project_source,
        policy_file: project_policy_path,
    };
    let jail_cwd = if cwd.starts_with(&root) {
        cwd.clone()
    } else {
        root.clone()
    };
    let exec_allow = m.exec_allow.clone().unwrap_or_default();
    let timeout_ms = m.exec_timeout_ms.unwrap_or(600_000);
    let max_output = m.exec_max_output.unwrap_or(64 << 20);
    let max_concurrent = m.exec_max_concurrent.unwrap_or(8);

    // The executor's own jail: the project read-write, its caches, its network, no secrets,
    // no executor, the same masked and protected files (it runs what the agent asks).
    let exec_jail = match target {
        ExecutorTarget::Sandbox => {
            let exec_net = network_plan(&m.exec_net, NetworkMode::None);
            if let Some((Dns::Stub, at)) = &m.exec_net.dns {
                return Err(at.error(
                    "executor.sandbox.network.dns = \"stub\" is not supported for the executor's \
                     jail; remove it (the executor's commands use the proxy variables)"
                        .into(),
                ));
            }
            let mut exec_mounts = system_mounts();
            exec_mounts.push(Mount {
                source: PathBuf::new(),
                target: home.clone(),
                kind: MountKind::Tmpfs,
                optional: false,
            });
            exec_mounts.extend(toolchain_binds.iter().cloned());
            let (outside, inside) = policy_binds(&m.exec_read_only, &m.exec_read_write);
            exec_mounts.extend(outside);
            exec_mounts.push(project_mount.clone());
            exec_mounts.push(corral_mount.clone());
            exec_mounts.extend(inside);
            let mut exec_env = base_env(req, &toolchain_path);
            exec_env.extend(toolchains.iter().flat_map(|t| t.env.clone()));
            for (name, _) in &m.env_pass {
                if let Some(v) = req.env.get(name) {
                    exec_env.insert(name.clone(), v.clone());
                }
            }
            for (k, (v, at)) in &m.env_set {
                // The harness profile's own variables are not the project environment's.
                if !matches!(at, Loc::Builtin(_)) {
                    exec_env.insert(k.clone(), v.clone());
                }
            }
            if exec_net.mode == NetworkMode::Proxy {
                exec_env.extend(proxy_env(JAIL_PROXY_URL));
            }
            for (name, s) in &secrets {
                exec_env.remove(name);
                exec_env.remove(&s.from_env);
            }
            Some(Box::new(Plan {
                profile: profile.name.clone(),
                engine: m.engine.unwrap_or(Engine::Native),
                command: Vec::new(),
                cwd: root.clone(),
                project: project_plan.clone(),
                home: home.clone(),
                uid: req.uid,
                gid: req.gid,
                mounts: exec_mounts,
                masked: masked.clone(),
                protected: protected.clone(),
                guarded: Vec::new(),
                env: exec_env,
                network: exec_net,
                secrets: Vec::new(),
                limits: limits.clone(),
                executor: ExecutorPlan {
                    target: ExecutorTarget::Sandbox,
                    allow: exec_allow.clone(),
                    timeout_ms,
                    max_output,
                    max_concurrent,
                    jail: None,
                },
                skill: None,
                terminal: TerminalPlan::default(),
                image: None,
                sources: sources.clone(),
                project_grants: Vec::new(),
                project_trust: None,
                toolchains: toolchains.clone(),
            }))
        }
        ExecutorTarget::Compose(_) | ExecutorTarget::Host => None,
    };

    // The harness's code in its state directories: read-only, or its keys put back after the
    // run, unless the user lets this run change it. The executor's jail has no state
    // directories, so its plan needs none of it.
    let (code_paths, guarded) = harness_code(&profile, &home, m.allow_harness_config);
    protected.extend(code_paths);
    protected.sort();
    protected.dedup();

    let skill = match (&profile.skill_args, custom_command) {
        (Some(args), false) => Some(SkillPlan {
            dir: PathBuf::from(SKILL_DIR),
            args: args.iter().map(|a| a.replace("{dir}", SKILL_DIR)).collect(),
        }),
        _ => None,
    };

    Ok(Plan {
        profile: profile.name.clone(),
        engine: m.engine.unwrap_or(Engine::Native),
        command: cmd.argv,
        cwd: jail_cwd,
        project: project_plan,
        home,
        uid: req.uid,
        gid: req.gid,
        mounts,
        masked,
        protected,
        guarded,
        env,
        network,
        secrets: secrets.into_values().collect(),
        limits,
        executor: ExecutorPlan {
            target,
            allow: exec_allow,
            timeout_ms,
            max_output,
            max_concurrent,
            jail: exec_jail,
        },
        skill,
        terminal: TerminalPlan {
            clipboard: m.clipboard.unwrap_or(false),
        },
        image: m.image.clone(),
        sources,
        project_grants: grants,
        project_trust,
        toolchains,
    })
}

fn secret_plan(name: &str, spec: &SecretSpec) -> SecretPlan {
    SecretPlan {
        name: name.to_string(),
        from_env: spec.from_env.0.clone(),
        hosts: spec.hosts.clone(),
    }
}

/// The profile's code paths in its state directories (read-only in the jail) and its guarded
/// configuration files, `~/` expanded; nothing when the run may change the harness's code.
fn harness_code(
    profile: &Profile,
    home: &Path,
    writable: bool,
) -> (Vec<PathBuf>, Vec<GuardedFile>) {
    if writable {
        return (Vec::new(), Vec::new());
    }
    let mut paths: Vec<PathBuf> = profile
        .state_code
        .iter()
        .map(|c| PathBuf::from(expand_home_value(c, home)))
        .collect();
    let guarded: Vec<GuardedFile> = profile
        .guard
        .iter()
        .map(|g| GuardedFile {
            path: PathBuf::from(expand_home_value(&g.file, home)),
            format: g.format,
            keys: g.keys.clone(),
            commands: g.commands.clone(),
        })
        .collect();
    // Scripts those settings name in the state directories (a statusLine script) are code too.
    let settings: Vec<(PathBuf, ConfigFormat)> = paths
        .iter()
        .filter_map(|p| match p.extension().and_then(|e| e.to_str()) {
            Some("json") => Some((p.clone(), ConfigFormat::Json)),
            Some("toml") => Some((p.clone(), ConfigFormat::Toml)),
            _ => None,
        })
        .chain(guarded.iter().map(|g| (g.path.clone(), g.format)))
        .collect();
    let state_dirs: Vec<PathBuf> = profile
        .state_dirs
        .iter()
        .map(|d| PathBuf::from(expand_home_value(d, home)))
        .collect();
    paths.extend(crate::harness::named_files(&settings, &state_dirs, home));
    (paths, guarded)
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
