//! The resolved plan of one jail: plain data, every path absolute, every rule parsed.
//!
//! A `Plan` is what `corral plan --json` prints and what every backend consumes. Backends never
//! read policy files or the caller's environment again: everything they need is here. Tests build
//! Plans and compare them whole.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::domain::DomainPattern;

/// Which backend runs the jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Native,
    Podman,
    Docker,
    Auto,
    /// A Kubernetes cluster (`corral run --engine kube`). Only from the command line: a policy
    /// file cannot send runs to whatever cluster the caller's kubectl points at.
    #[serde(skip_deserializing)]
    Kube,
}

/// Read-only or read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Ro,
    Rw,
}

/// How the jail reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Loopback only.
    None,
    /// Loopback only, plus corral's proxy bridged in; the proxy decides every destination.
    Proxy,
    /// The host's network namespace, unfiltered (explicit opt-in).
    Host,
}

/// What the jail gets for name resolution (network mode `proxy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dns {
    /// No DNS at all: names are resolved by the proxy only.
    #[default]
    None,
    /// A stub resolver on the jail's 127.0.0.1:53 that answers only names the proxy's rules
    /// allow, each with a synthetic address whose connections corral captures and decides as
    /// proxy requests (for programs that ignore the proxy variables).
    Stub,
}

impl Dns {
    pub fn is_none(&self) -> bool {
        *self == Dns::None
    }
}

/// `network.on_deny`: what the proxy does with a request the allow list does not name (deny
/// rules and the address checks always refuse at once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDeny {
    /// Refuse at once (403).
    #[default]
    Refuse,
    /// Hold the connection up to `timeout` seconds while `corral watch` asks the user.
    Ask { timeout: u32 },
}

impl OnDeny {
    pub fn is_refuse(&self) -> bool {
        *self == OnDeny::Refuse
    }
}

/// Whether a limit that cannot be enforced stops the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Enforce {
    Strict,
    BestEffort,
}

/// The compose file `corral init --compose` writes the executor service into, at the project
/// root (corral-engine `compose.rs`).
pub const COMPOSE_OVERRIDE_FILE: &str = "docker-compose.override.yml";

/// Where executor commands run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "service")]
pub enum ExecutorTarget {
    /// A second jail built from `[executor.sandbox]` (`Plan::executor.jail`).
    Sandbox,
    /// An executor running in a compose service, reached at its network alias.
    Compose(String),
    /// The bare host, unjailed: only with the explicit opt-in.
    Host,
}

/// One filesystem entry of the jail, applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Host path (absolute, symlinks resolved). Empty for a tmpfs.
    pub source: PathBuf,
    /// Path inside the jail (absolute).
    pub target: PathBuf,
    pub kind: MountKind,
    /// When true a missing source is skipped; when false it is an error at jail set-up.
    pub optional: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "type", content = "access")]
pub enum MountKind {
    /// A bind of the host path.
    Bind(Access),
    /// A fresh, empty, private tmpfs.
    Tmpfs,
    /// An overlay: the host path (`source`) read-only at the bottom, `above` (read-only,
    /// topmost first) over it, and `upper`, corral's directory, where everything the jail
    /// writes there goes. The host path itself is never written.
    Overlay {
        upper: PathBuf,
        work: PathBuf,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        above: Vec<PathBuf>,
    },
}

impl MountKind {
    /// Whether the jail can write at the mount's target.
    pub fn writable(&self) -> bool {
        match self {
            MountKind::Bind(a) => *a == Access::Rw,
            MountKind::Tmpfs | MountKind::Overlay { .. } => true,
        }
    }
}

/// Which rule chose the project directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProjectSource {
    /// The top level of the git repository enclosing the working directory.
    GitTopLevel,
    /// The working directory itself (no enclosing repository).
    #[default]
    CurrentDirectory,
    /// Named with `--project DIR`.
    ProjectFlag,
    /// `--scratch`: a fresh temporary directory.
    Scratch,
}

impl ProjectSource {
    /// The rule in words, for `corral plan` and error messages.
    pub fn describe(self) -> &'static str {
        match self {
            ProjectSource::GitTopLevel => "the top level of the enclosing git repository",
            ProjectSource::CurrentDirectory => {
                "the current directory; no git repository encloses it"
            }
            ProjectSource::ProjectFlag => "named with --project",
            ProjectSource::Scratch => "--scratch: a fresh directory, removed afterwards",
        }
    }
}

/// The project the jail works on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectPlan {
    /// Absolute path (git root, else cwd; a temporary directory with `--scratch`), mounted at itself.
    pub root: PathBuf,
    pub access: Access,
    /// `--scratch`: `root` is a fresh temporary directory, removed when the run ends.
    pub scratch: bool,
    /// Which rule chose `root`.
    #[serde(default)]
    pub source: ProjectSource,
    /// The project's `corral.toml` (whether or not it exists): always read-only inside the jail.
    pub policy_file: PathBuf,
    /// `--review` / `filesystem.review`: the jail sees the project as an overlay whose writes
    /// go to corral's directories below, never to the host's project (docs/review.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<ReviewPlan>,
}

/// Where a review run's writes go: an overlay's upper and work directories in corral's state
/// directory (`review/PROJECT_KEY/`), the host's project its read-only lower layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewPlan {
    /// `STATE/review/PROJECT_KEY`: the change set's directory (its `meta.json`, `upper`, `work`).
    pub dir: PathBuf,
    /// The overlay's upper directory: the change set itself.
    pub upper: PathBuf,
    /// The overlay's work directory (same file system as `upper`).
    pub work: PathBuf,
}

impl ReviewPlan {
    /// The review directories of the project at `root` in corral's state directory `state`.
    pub fn for_project(state: &std::path::Path, root: &std::path::Path) -> ReviewPlan {
        let dir = state.join("review").join(corral_audit::project_key(root));
        ReviewPlan {
            upper: dir.join("upper"),
            work: dir.join("work"),
            dir,
        }
    }
}

/// The network rules of a jail (or of the executor's jail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPlan {
    pub mode: NetworkMode,
    /// Destinations allowed through the proxy. Deny wins over allow.
    pub allow: Vec<DomainPattern>,
    /// `network.allow` entries with a method or a path: their hosts' requests are decided one
    /// by one (TLS terminated with the run's CA), unless the host is also allowed plainly by
    /// its exact name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_paths: Vec<crate::pathrule::PathRule>,
    pub deny: Vec<DomainPattern>,
    /// Non-public ranges (loopback, private, link-local, ...) opened explicitly.
    pub allow_cidrs: Vec<IpNet>,
    /// The jail's 127.0.0.1:PORT reaches the host's 127.0.0.1:PORT.
    pub host_ports: Vec<u16>,
    /// Host 127.0.0.1:PORT reaches the jail's loopback PORT.
    pub publish: Vec<u16>,
    /// Chain every allowed request through this proxy (`http://host:port`).
    pub upstream_proxy: Option<String>,
    /// `network.dns`: none (the default) or the stub resolver with transparent capture.
    #[serde(default, skip_serializing_if = "Dns::is_none")]
    pub dns: Dns,
    /// `network.on_deny`: what the proxy does with a destination the allow list does not name.
    #[serde(default, skip_serializing_if = "OnDeny::is_refuse")]
    pub on_deny: OnDeny,
}

/// A secret served by the credential gateway: the jail sees a placeholder, the named hosts get
/// the real value. The value itself is never part of a Plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretPlan {
    /// The variable name inside the jail.
    pub name: String,
    /// The caller's variable holding the real value.
    pub from_env: String,
    pub hosts: Vec<DomainPattern>,
}

/// Resource limits. `None` means no limit of that kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Bytes.
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub enforce: Enforce,
    /// The limits that are corral's built-in defaults: no policy file or flag set them, nor
    /// `limits.enforce`. These never stop a run: what no cgroup can enforce here falls back as
    /// with `best-effort`, said in one line. Limits someone set follow `enforce`.
    #[serde(default, skip_serializing_if = "LimitKinds::is_empty")]
    pub built_in: LimitKinds,
}

/// One flag per kind of limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitKinds {
    pub memory: bool,
    pub cpus: bool,
    pub pids: bool,
}

impl LimitKinds {
    pub fn is_empty(&self) -> bool {
        *self == LimitKinds::default()
    }
}

/// The executor a jail gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorPlan {
    pub target: ExecutorTarget,
    /// Program allowlist (names or absolute paths); empty means any program.
    pub allow: Vec<String>,
    pub timeout_ms: u64,
    /// Bytes of output kept per command; beyond it the output is cut with a marker.
    pub max_output: u64,
    /// Commands running at once; beyond it requests get 429.
    pub max_concurrent: usize,
    /// The jail each command runs in when `target` is `Sandbox`: a Plan whose `command` is empty
    /// (each request supplies one) and whose `executor.jail` is `None`.
    pub jail: Option<Box<Plan>>,
}

/// How the harness is taught to use `corral exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillPlan {
    /// Directory inside the jail where corral writes SKILL.md (read-only inside).
    pub dir: PathBuf,
    /// Arguments that make the harness load it (pi: `--skill DIR`). Not part of
    /// `Plan::command`: the runner that writes SKILL.md into `dir` appends them, so a harness is
    /// never pointed at a skill directory that was not provided. Only set when the profile's own
    /// command runs (not for `-- CMD` or `run.command`).
    pub args: Vec<String>,
}

/// What the jail may do to the user's terminal beyond its own screen (`[terminal]`). corral's
/// relay drops the escape sequences that act outside the screen (clipboard, files, fonts,
/// keys, the window); this says which of them the user let through.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalPlan {
    /// `terminal.clipboard`: OSC 52 clipboard writes reach the user's terminal. Clipboard
    /// reads never do.
    pub clipboard: bool,
}

impl TerminalPlan {
    pub fn is_default(&self) -> bool {
        *self == TerminalPlan::default()
    }
}

/// Everything one jail is, fully resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The harness profile the plan was built from (`shell` for any command).
    pub profile: String,
    pub engine: Engine,
    /// The command and its arguments, as executed (argv[0] resolved to an absolute path when it
    /// was found on the caller's PATH).
    pub command: Vec<String>,
    /// Working directory inside the jail.
    pub cwd: PathBuf,
    pub project: ProjectPlan,
    /// `$HOME` inside the jail: the caller's home path, a private tmpfs there.
    pub home: PathBuf,
    /// The caller's uid and gid, kept inside the jail.
    pub uid: u32,
    pub gid: u32,
    /// Filesystem entries in the order they are applied (system directories, home, state
    /// directories, policy binds, the project). /dev, /proc and /tmp are the backend's own.
    pub mounts: Vec<Mount>,
    /// Existing project files matched by `filesystem.hide`: present, empty and unreadable.
    pub masked: Vec<PathBuf>,
    /// The `filesystem.hide` patterns (`corral_policy::hide::HideSet`), relative to the
    /// project root: what `masked` was found with, and the names the jail may not create in
    /// the project during the run (the name gate refuses them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide: Vec<String>,
    /// Paths made read-only inside the jail, present or not: `filesystem.protect` in the
    /// project, and every policy file a read-write bind would expose.
    pub protected: Vec<PathBuf>,
    /// corral's layer over the harness's state (the agent's jail only; `None` with
    /// `--allow-harness-config`, which binds the host's state read-write, or with no state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness_state: Option<HarnessState>,
    /// The jail's exact environment: nothing else of the caller's enters.
    pub env: BTreeMap<String, String>,
    pub network: NetworkPlan,
    pub secrets: Vec<SecretPlan>,
    /// Sign-in credential files served by the gateway (placeholder file in the jail).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signin: Vec<crate::signin::SigninPlan>,
    pub limits: Limits,
    pub executor: ExecutorPlan,
    pub skill: Option<SkillPlan>,
    /// What the jail may do to the user's terminal (`[terminal]`).
    #[serde(default, skip_serializing_if = "TerminalPlan::is_default")]
    pub terminal: TerminalPlan,
    /// Harness image for the container engines.
    pub image: Option<String>,
    /// The policy files layered into this plan, lowest precedence first.
    pub sources: Vec<PathBuf>,
    /// What the project's own policy file (or a `--policy` file) grants beyond the defaults,
    /// the profile and the user config, one `FILE:LINE:COL: what` line each. A repository may be
    /// hostile: `corral plan` shows these so the user sees what the project asks for.
    #[serde(default)]
    pub project_grants: Vec<String>,
    /// The project's own `corral.toml` as read for this plan (auto-discovered, not a
    /// `--policy` file), and what in it needs the user's trust before a jail starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_trust: Option<ProjectTrust>,
    /// Language toolchains found under the home (rustup, pyenv, nvm, uv, go): bound read-only
    /// (they are code the host runs later), their programs on PATH. Their binds are in `mounts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub toolchains: Vec<Toolchain>,
    /// Git directories, and whether the jail may create repositories while it runs.
    #[serde(default, skip_serializing_if = "GitPlan::is_default")]
    pub git: GitPlan,
}

/// What the name gate (crate `corral-namegate`) needs: while a native jail runs, no name
/// that would make a git repository discoverable on the host (`.git`, `HEAD`, `commondir`) can
/// be created outside the jail's own file systems.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitPlan {
    /// The git directories that existed when the run started (the project's, nested
    /// repositories', submodules', linked worktrees' administrative directories, those of
    /// read-write binds): the only places outside the jail's own file systems where a `HEAD`
    /// may be created (commits and checkouts replace it). Filled from the session's snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<PathBuf>,
    /// `filesystem.allow_new_repositories` (user config only): no name gate; what the run
    /// creates is checked when it ends instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_repositories: bool,
}

impl GitPlan {
    pub fn is_default(&self) -> bool {
        self == &GitPlan::default()
    }
}

/// A language toolchain the jail can use, read-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toolchain {
    /// `rust`, `pyenv`, `nvm`, `uv`, `go`.
    pub name: String,
    /// Host paths bound read-only at their own path.
    pub binds: Vec<PathBuf>,
    /// Directories put on the jail's PATH (before the system's).
    pub path: Vec<PathBuf>,
    /// Variables the toolchain needs to find itself (`RUSTUP_HOME`, `PYENV_ROOT`).
    pub env: BTreeMap<String, String>,
}

/// The harness's state as the jail sees it: the host's state directories and files below, a
/// layer corral owns (per host user and profile) above, where everything the jail writes
/// there goes. Nothing the jail writes reaches the host's state; `corral state diff|apply`
/// shows it and copies what the user picks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarnessState {
    /// `harness/PROFILE` in corral's state directory (0700), made by the run.
    pub layer: PathBuf,
    pub dirs: Vec<StateDir>,
    pub files: Vec<StateFile>,
    /// Paths the harness runs or loads as code (the profile's `state_code`): called out in
    /// `corral state diff` and asked about by `apply` (advice, not enforcement).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code_paths: Vec<PathBuf>,
    /// Configuration files some of whose keys are code (the profile's `[[guard]]`): called out
    /// the same way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code_keys: Vec<CodeKeys>,
    /// The profile's sign-in files (`[signin.NAME] file`): the host's own, served to the jail
    /// as placeholders; never kept in corral's copy of a state directory, never listed by
    /// `corral state diff`, never written by `apply`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signin_files: Vec<PathBuf>,
}

/// One state directory of the harness and corral's layer over it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDir {
    /// The host's directory (never written by a jail).
    pub host: PathBuf,
    /// Its name in the layer: the path relative to the home, `%` and `/` escaped.
    pub key: String,
    pub layer: StateLayer,
}

/// How the jail's view of a state directory is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum StateLayer {
    /// An overlay (native, podman): the host's directory below, `upper` above.
    Overlay { upper: PathBuf, work: PathBuf },
    /// A copy of the host's directory (docker, which has no overlay volume), seeded once.
    Copy { dir: PathBuf },
}

/// One state file of the harness (`~/.claude.json`): the jail gets corral's copy, seeded from
/// the host's file the first time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    pub host: PathBuf,
    pub copy: PathBuf,
}

/// A harness configuration file of which some keys are code: the commands of MCP servers and
/// hooks, plugins, extension paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeKeys {
    /// Absolute path on the host: a state file, or a file directly in a state directory.
    pub path: PathBuf,
    pub format: ConfigFormat,
    /// Which keys are code. A key path is dot-separated names, `*` standing for any one name
    /// (`projects.*.mcpServers`).
    pub keys: GuardedKeys,
    /// Key paths whose string values the harness runs as a shell command when they start with
    /// `!` (pi's `auth.json` `"key": "!op read ..."`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
}

/// The syntax of a configuration file with code keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigFormat {
    Json,
    Toml,
}

/// Which keys of a configuration file are code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mode", content = "keys")]
pub enum GuardedKeys {
    /// These key paths (and everything below them) are code; the rest is data.
    Code(Vec<String>),
    /// Every key is code except these key paths (and everything below them): for files whose
    /// data keys are few and known.
    AllBut(Vec<String>),
}

/// What a project's own policy file asks for that only the user may give. A repository may be
/// hostile, so `corral run`/`shell` start a jail from such a file only after the user trusted
/// exactly this content (`corral trust`, recorded by path and SHA-256).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectTrust {
    /// The file (absolute): the project's `corral.toml`.
    pub file: PathBuf,
    /// SHA-256 of the exact bytes that were parsed, lower-case hex.
    pub sha256: String,
    /// What it grants beyond the user's own layers (defaults, profile, user config, flags), one
    /// `FILE:LINE:COL: what` line each, in file order. Empty when the file only narrows or sets
    /// harmless things (profile, command, image, env.set, hide, protect, deny rules).
    pub grants: Vec<String>,
}

/// System directories bound read-only into every jail: the programs and libraries, and a
/// curated /etc (identity, TLS roots, the dynamic loader's cache, alternatives, locale and
/// terminal data). Entries missing on this host are skipped.
///
/// The curated /etc holds nothing secret: when corral runs as root the jail's uid 0 owns the
/// host's root files, so a root-only file bound here would be readable. TLS comes as its public
/// parts only (certificates, bundles, `openssl.cnf`), never `/etc/ssl` or `/etc/pki` whole,
/// whose `private/` directories hold the host's private keys (Debian's
/// `/etc/ssl/private`, RHEL's `/etc/pki/tls/private`).
pub fn system_mounts() -> Vec<Mount> {
    const DIRS: &[&str] = &[
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
    ];
    const ETC: &[&str] = &[
        "/etc/alternatives",
        "/etc/bash.bashrc",
        "/etc/ca-certificates",
        "/etc/ca-certificates.conf",
        "/etc/environment",
        "/etc/gitconfig",
        "/etc/group",
        "/etc/host.conf",
        "/etc/hostname",
        "/etc/hosts",
        "/etc/inputrc",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/locale.alias",
        "/etc/locale.conf",
        "/etc/localtime",
        "/etc/login.defs",
        "/etc/mime.types",
        "/etc/nsswitch.conf",
        "/etc/os-release",
        "/etc/passwd",
        "/etc/pki/ca-trust",
        "/etc/pki/java",
        "/etc/pki/tls/cert.pem",
        "/etc/pki/tls/certs",
        "/etc/pki/tls/ct_log_list.cnf",
        "/etc/pki/tls/openssl.cnf",
        "/etc/profile",
        "/etc/profile.d",
        "/etc/protocols",
        "/etc/python3",
        "/etc/services",
        "/etc/ssl/ca-bundle.pem",
        "/etc/ssl/cert.pem",
        "/etc/ssl/certs",
        "/etc/ssl/ct_log_list.cnf",
        "/etc/ssl/openssl.cnf",
        "/etc/terminfo",
        "/etc/timezone",
        "/etc/vim",
        "/etc/xdg",
    ];
    DIRS.iter()
        .chain(ETC)
        .map(|p| Mount {
            source: PathBuf::from(p),
            target: PathBuf::from(p),
            kind: MountKind::Bind(Access::Ro),
            optional: true,
        })
        .collect()
}

impl Plan {
    /// The smallest useful plan: `command` in `project_root` (read-write), the system
    /// directories read-only, a private home at `home`, no network, no limits, no executor.
    /// The policy resolver builds real plans; this is the base that tests and backends' own
    /// unit tests start from and adjust.
    pub fn minimal(
        project_root: &std::path::Path,
        home: &std::path::Path,
        command: Vec<String>,
    ) -> Plan {
        let (uid, gid) = current_ids();
        let mut mounts = system_mounts();
        mounts.push(Mount {
            source: PathBuf::new(),
            target: home.to_path_buf(),
            kind: MountKind::Tmpfs,
            optional: false,
        });
        mounts.push(Mount {
            source: project_root.to_path_buf(),
            target: project_root.to_path_buf(),
            kind: MountKind::Bind(Access::Rw),
            optional: false,
        });
        let mut env = BTreeMap::new();
        env.insert("HOME".into(), home.display().to_string());
        env.insert(
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
        );
        env.insert("TMPDIR".into(), "/tmp".into());
        env.insert("LANG".into(), "C.UTF-8".into());
        Plan {
            profile: "shell".into(),
            engine: Engine::Native,
            command,
            cwd: project_root.to_path_buf(),
            project: ProjectPlan {
                root: project_root.to_path_buf(),
                access: Access::Rw,
                scratch: false,
                source: ProjectSource::CurrentDirectory,
                policy_file: project_root.join("corral.toml"),
                review: None,
            },
            home: home.to_path_buf(),
            uid,
            gid,
            mounts,
            masked: Vec::new(),
            hide: Vec::new(),
            protected: vec![project_root.join("corral.toml")],
            harness_state: None,
            env,
            network: NetworkPlan {
                mode: NetworkMode::None,
                allow: Vec::new(),
                allow_paths: Vec::new(),
                deny: Vec::new(),
                allow_cidrs: Vec::new(),
                host_ports: Vec::new(),
                publish: Vec::new(),
                dns: Dns::None,
                on_deny: OnDeny::Refuse,
                upstream_proxy: None,
            },
            secrets: Vec::new(),
            signin: Vec::new(),
            limits: Limits {
                memory: None,
                cpus: None,
                pids: None,
                enforce: Enforce::Strict,
                built_in: LimitKinds::default(),
            },
            executor: ExecutorPlan {
                target: ExecutorTarget::Sandbox,
                allow: Vec::new(),
                timeout_ms: 600_000,
                max_output: 64 * 1024 * 1024,
                max_concurrent: 8,
                jail: None,
            },
            skill: None,
            terminal: TerminalPlan::default(),
            image: None,
            sources: Vec::new(),
            project_grants: Vec::new(),
            project_trust: None,
            git: Default::default(),
            toolchains: Vec::new(),
        }
    }
}

fn current_ids() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    // The owner of /proc/self is this process's effective uid and gid; no libc needed.
    match std::fs::metadata("/proc/self") {
        Ok(m) => (m.uid(), m.gid()),
        Err(_) => (0, 0),
    }
}
