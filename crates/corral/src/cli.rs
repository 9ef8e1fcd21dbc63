//! The command-line surface (SPEC section 2). Definitions only: each command's behaviour lives in
//! `cmd/<command>.rs`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[path = "proxy_args.rs"]
mod proxy_args;
pub use proxy_args::ProxyArgs;

#[derive(Debug, Parser)]
#[command(
    name = "corral",
    version,
    about = "Run AI coding agents in a least-privilege jail",
    long_about = "corral runs a coding-agent harness (pi, claude, codex, gemini, opencode, aider, or any \
                  command) in a jail that sees only the project, reaches only the hosts the policy \
                  allows, and leaves an audit log of what it tried."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a harness profile or any command jailed; exit code is the command's
    Run(RunArgs),
    /// An interactive shell inside the same jail a profile would get
    Shell(ShellArgs),
    #[command(about = EXEC_ABOUT)]
    Exec(ExecArgs),
    /// The executor server
    Serve(ServeArgs),
    /// The egress proxy alone (the squid replacement in the container setup)
    #[command(
        long_about = "The egress proxy alone (the squid replacement in the container setup): \
                      the [network] rules of a policy file, reloaded on SIGHUP and when the file \
                      changes, every decision in the audit log. When the lean executable \
                      `corral-proxy` (built with corral) is in the same directory as this one, \
                      `corral proxy` executes it with the same options (the same proxy in a \
                      smaller process); otherwise it runs the proxy itself."
    )]
    Proxy(ProxyArgs),
    /// Print the fully resolved plan without running anything
    Plan(PlanArgs),
    /// Write a commented corral.toml for this project
    Init(InitArgs),
    /// What this host supports and what each missing piece disables
    Doctor(DoctorArgs),
    /// The audit log: network decisions, executor commands, sandbox lifecycle (`--runs`: the recorded runs)
    Log(LogArgs),
    /// A review run's changes (`corral run --review`): a git-style diff, or one line each
    Diff(DiffArgs),
    /// Apply a review run's changes (what `corral diff` showed) to the project
    Accept(AcceptArgs),
    /// Drop a review run's changes; the project stays as it is
    Discard(DiscardArgs),
    /// Put the project back as it was before a run (the last one by default)
    #[command(
        long_about = "Put the project back as it was before a run (the last one by default; \
                      `corral log --runs` lists them): files created, modified, deleted or \
                      renamed, modes, symlinks and directories, tracked, untracked and ignored \
                      alike, from the change record corral keeps outside the project. A path \
                      changed since the run (on the host or by a later run) is never \
                      overwritten: undo refuses and names it. The undo keeps a record of its \
                      own: `corral undo ID` of it redoes the run. See docs/undo.md."
    )]
    Undo(UndoArgs),
    /// Live view of this project's running jails: allow or deny what they are refused
    #[command(
        long_about = "A terminal view of this project's running jails (native and \
                      podman/docker) and their audit log: every network decision as it \
                      happens, denials in red \
                      with the rule that denied them. On a denial (the selected row, else the \
                      latest one):\n\n  \
                      a        allow it for this run only (the jail that asked; not written \
                      anywhere; not for podman/docker runs, whose proxy container the \
                      project's runs share)\n  \
                      p        allow it permanently: added to the project's corral.toml \
                      (comments kept, as `corral allow` does); every running jail of the \
                      project applies it\n  \
                      d        deny it permanently: added to corral.toml's network.deny\n  \
                      up/down  (or k/j) select a row; Esc follows the latest again\n  \
                      q        quit (also Ctrl-C)\n\n\
                      With network.on_deny = \"ask\", a request the allow list does not name \
                      is held and shown highlighted at the top with its time left; while one \
                      is, a allows it for this run, p adds it to corral.toml and allows it, \
                      d or r refuses it now (the held request proceeds or gets 403).\n\n\
                      A destination too long for the screen shows its start, a … marker, and \
                      its registrable domain and port; a and p do not allow a name the screen \
                      could not show whole (widen the terminal, or use `corral allow`).\n\n\
                      Edits of corral.toml go through the same trust rule as `corral allow`: a \
                      trusted file stays trusted; one never trusted is not applied to running \
                      jails until you run `corral trust`."
    )]
    Watch(WatchArgs),
    /// Container images for the podman/docker backends
    #[command(subcommand)]
    Image(ImageCommand),
    /// Remove this project's containers and networks (container engines), and the Kubernetes
    /// objects of its killed `--engine kube` runs
    Down(DownArgs),
    /// Kubernetes: the manifests of one jailed agent
    #[command(subcommand)]
    Kube(KubeCommand),
    /// Wrappers on PATH so that `pi`, `claude`, ... run jailed by their usual names
    #[command(subcommand)]
    Shim(ShimCommand),
    /// Add an allow rule to the project's corral.toml (or the user config)
    Allow(RuleArgs),
    /// Add a deny rule to the project's corral.toml (or the user config)
    Deny(RuleArgs),
    /// Print the agent-facing instructions (SKILL.md) for `corral exec`
    Skill(SkillArgs),
    /// Trust this project's corral.toml: show what it grants and record its SHA-256
    #[command(
        long_about = "A project's corral.toml comes with the repository, which may be hostile. \
                      What it grants beyond your own settings (secrets, passed variables, hosts, \
                      host ports, binds outside the project, relaxed limits, ...) is used by \
                      `corral run`/`shell` only after you trusted exactly that content. `corral \
                      trust` shows those grants and records the file's path and SHA-256 in \
                      $XDG_CONFIG_HOME/corral/trusted.json; an edited file must be trusted again."
    )]
    Trust(TrustArgs),
    /// Print shell completions or the man page
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// corral's layer over a harness's state: what jailed runs changed, copy it to the host
    #[command(
        subcommand,
        long_about = "A jailed harness never writes the host's state directories and files \
                      (~/.claude, ~/.claude.json, ~/.codex, ...): it writes corral's layer over \
                      them, per user and profile, which later jailed runs see again. `corral \
                      state diff PROFILE` shows what jailed runs changed against the host's \
                      state, code-bearing files and keys called out; `corral state apply \
                      PROFILE PATH...` copies what you pick to the host; `corral state reset \
                      PROFILE` drops the layer."
    )]
    State(StateCommand),
    /// The agents' git worktrees of this repository (`corral run --worktree NAME`): `corral
    /// worktree ls`, `corral worktree rm NAME`
    #[command(subcommand)]
    Worktree(WorktreeCommand),
    /// The old spelling of `corral worktree ls` (kept for a while; says so on stderr)
    #[command(hide = true)]
    Worktrees(WorktreesArgs),
    /// Inside a run's relay container: its published ports and host ports (internal)
    #[command(hide = true)]
    PortRelay(PortRelayArgs),
}

/// `corral port-relay`: run by corral in a container beside the harness, never by hand.
#[derive(Debug, Args)]
pub struct PortRelayArgs {
    /// The run's socket directory, bound in from the host
    #[arg(long, value_name = "DIR")]
    pub dir: std::path::PathBuf,
    /// A published port: the socket p<PORT> reaches 127.0.0.1:PORT here
    #[arg(long, value_name = "PORT")]
    pub publish: Vec<u16>,
    /// A host port: 127.0.0.1:PORT here reaches the socket h<PORT>
    #[arg(long, value_name = "PORT")]
    pub host_port: Vec<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineArg {
    Native,
    Podman,
    Docker,
    Auto,
    /// A Kubernetes cluster, through kubectl (`corral run` and `corral down` only)
    Kube,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EnforceArg {
    Strict,
    BestEffort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    None,
    Proxy,
    Host,
}

/// Options shared by `run`, `shell` and `plan`: the command-line layer of the policy.
#[derive(Debug, Clone, Default, Args)]
pub struct JailOptions {
    /// Use this policy file instead of the project's corral.toml
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Backend that runs the jail
    #[arg(long, value_enum)]
    pub engine: Option<EngineArg>,
    /// Network mode
    #[arg(long, value_enum)]
    pub network: Option<NetworkArg>,
    /// Allow a destination (DOMAIN, *.DOMAIN, optionally :PORT); repeatable
    #[arg(long = "allow", value_name = "DOMAIN")]
    pub allow: Vec<String>,
    /// Bind a host path read-write (it must exist); repeatable
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<PathBuf>,
    /// Bind a host path read-only (it must exist); repeatable
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// Pass a variable by name, or set NAME=VALUE; repeatable
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Memory limit, as docker writes it (4g, 4gb, 4GiB, 512m; at least 6m)
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU limit (e.g. 2, 0.5; at most this machine's CPUs)
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,
    /// Process limit
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// When a limit cannot be enforced here: refuse to run (strict), or fall back to rlimits
    /// and say so (best-effort)
    #[arg(long, value_enum, value_name = "MODE")]
    pub enforce: Option<EnforceArg>,
    /// Make the jail's loopback PORT reachable from the host's 127.0.0.1:PORT; repeatable
    #[arg(long = "publish", value_name = "PORT")]
    pub publish: Vec<u16>,
    /// Work in a fresh temporary directory instead of the project; nothing is kept
    #[arg(long, conflicts_with = "project")]
    pub scratch: bool,
    /// The project directory, exactly (default: the enclosing git repository's top level, else
    /// the current directory; never the home, / or a system directory unless named here)
    #[arg(long, value_name = "DIR")]
    pub project: Option<PathBuf>,
    /// Opt in to `executor.target = "host"` (commands run unsandboxed); a project's policy file cannot
    #[arg(long)]
    pub allow_host_executor: bool,
    /// Bind the host's harness state (~/.claude, ~/.codex, ...) read-write this run instead of
    /// corral's layer over it: what the jail writes there, the host's harness then loads
    /// (settings, hooks, plugins, MCP servers); a project's policy file cannot
    #[arg(long)]
    pub allow_harness_config: bool,
    /// Let the jail create git repositories outside its own /tmp and home (`git init`, `git
    /// clone`, `git worktree add` in the project); they are checked when the run ends instead
    /// of refused while it runs; a project's policy file cannot
    #[arg(long)]
    pub allow_new_repositories: bool,
    /// Hold the run's writes to the project for review: the host's project is unchanged until
    /// `corral accept`; `corral diff` shows the changes, `corral discard` drops them
    #[arg(long)]
    pub review: bool,
    /// A review run (--review, filesystem.review): drop a pending review of this project
    /// instead of refusing to start
    #[arg(long)]
    pub discard_pending: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Harness profile (pi, claude, codex, gemini, opencode, aider, shell)
    pub profile: Option<String>,
    /// Words after the profile that are not options: a command written without `--`
    /// (`corral run make test`), refused with the line that means it (cmd/profile_arg.rs)
    #[arg(hide = true, value_name = "ARGS")]
    pub extra: Vec<String>,
    #[command(flatten)]
    pub jail: JailOptions,
    /// Run in this repository's git worktree NAME, on branch NAME (made on first use under
    /// $XDG_STATE_HOME/corral/worktrees, reused after): the jail writes that worktree and
    /// branch only (native backend)
    #[arg(long, value_name = "NAME", conflicts_with_all = ["project", "scratch"])]
    pub worktree: Option<String>,
    /// The command to run instead of the profile's
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
    // Last: its help heading applies to every argument after it.
    #[command(flatten)]
    pub kube: Box<KubeRunArgs>,
}

/// `corral run --engine kube`: where the jail goes and what it is rendered with (the options
/// of `corral kube render` that a run needs; the jail's name is made from the run's id).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Kubernetes (--engine kube)")]
pub struct KubeRunArgs {
    /// kubectl's context (default: kubectl's current one, from KUBECONFIG)
    #[arg(long = "context", value_name = "CONTEXT")]
    pub kube_context: Option<String>,
    /// Namespace of every object (default: the context's)
    #[arg(long = "namespace", value_name = "NS")]
    pub kube_namespace: Option<String>,
    /// The proxy Service's ClusterIP, a free address in the cluster's service range (network
    /// mode proxy)
    #[arg(long, value_name = "IP")]
    pub proxy_ip: Option<String>,
    /// Image holding /usr/local/bin/corral-proxy
    #[arg(long, value_name = "IMAGE")]
    pub proxy_image: Option<String>,
    /// Harness image (default: the plan's run.image, else localhost/corral-PROFILE:latest)
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Also run the executor as its own Pod, its Service at this ClusterIP
    #[arg(long, value_name = "IP")]
    pub executor_ip: Option<String>,
    /// Seccomp profile of the sandbox (localhost: corral's, installed on every node)
    #[arg(long, value_enum, value_name = "PROFILE")]
    pub seccomp: Option<SeccompArg>,
    /// PersistentVolumeClaim holding the project (default: corral-PROJECT-project)
    #[arg(long, value_name = "CLAIM", conflicts_with = "project_hostpath")]
    pub project_claim: Option<String>,
    /// Mount the project from its own path on the node (single-node clusters, podman kube play)
    #[arg(long)]
    pub project_hostpath: bool,
    /// The nodes' kubelet limits processes per Pod (podPidsLimit)
    #[arg(long)]
    pub pids_by_node: bool,
    /// For `podman kube play` (ignores subPath): masked and empty files from DIR on the node,
    /// which must be this host (made here), protected paths hostPath binds of themselves
    #[arg(long, value_name = "DIR", requires = "project_hostpath")]
    pub node_files: Option<PathBuf>,
    /// How long to wait for the proxy to be available and the sandbox to start (default 2m)
    #[arg(long, value_name = "DURATION")]
    pub kube_timeout: Option<String>,
}

impl KubeRunArgs {
    /// The options given, by flag name: refused on any engine but kube.
    pub fn given(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let opts: [(&'static str, bool); 12] = [
            ("--context", self.kube_context.is_some()),
            ("--namespace", self.kube_namespace.is_some()),
            ("--proxy-ip", self.proxy_ip.is_some()),
            ("--proxy-image", self.proxy_image.is_some()),
            ("--image", self.image.is_some()),
            ("--executor-ip", self.executor_ip.is_some()),
            ("--seccomp", self.seccomp.is_some()),
            ("--project-claim", self.project_claim.is_some()),
            ("--project-hostpath", self.project_hostpath),
            ("--pids-by-node", self.pids_by_node),
            ("--node-files", self.node_files.is_some()),
            ("--kube-timeout", self.kube_timeout.is_some()),
        ];
        for (name, set) in opts {
            if set {
                out.push(name);
            }
        }
        out
    }
}

#[derive(Debug, Args)]
pub struct ShellArgs {
    pub profile: Option<String>,
    /// Words after the profile that are not options: a command written without `--`
    /// (`corral run make test`), refused with the line that means it (cmd/profile_arg.rs)
    #[arg(hide = true, value_name = "ARGS")]
    pub extra: Vec<String>,
    #[command(flatten)]
    pub jail: JailOptions,
}

/// `corral exec` parsed on its own (main.rs): the command an agent runs most, whose start is
/// most of its cost, without building the parser of every other command first. The same
/// arguments, help and errors as `corral exec` in [`Cli`] (a test compares them).
#[derive(Debug, Parser)]
#[command(name = "exec", about = EXEC_ABOUT)]
pub struct ExecCli {
    #[command(flatten)]
    pub args: ExecArgs,
}

/// What `corral exec` does, in `corral --help` and `corral exec --help`.
pub const EXEC_ABOUT: &str = "From inside a jail: run a command through the executor";

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Kill the command after this long (e.g. 30s, 10m)
    #[arg(long, value_name = "D")]
    pub timeout: Option<String>,
    /// Working directory, relative to the project root (default: the current directory's place in it)
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Send this process's standard input to the command (read to the end first; else /dev/null)
    #[arg(long)]
    pub stdin: bool,
    /// Set a variable for the command (repeatable; only output and locale variables such as
    /// TERM, LANG, LC_*, TZ, CI, NO_COLOR, RUST_LOG, CARGO_TERM_*: the executor refuses others)
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on: HOST:PORT, unix:PATH, or fd:N (a listening socket inherited open)
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// File holding the bearer token clients must present
    #[arg(long, value_name = "F")]
    pub token_file: Option<PathBuf>,
    /// Accept requests without a token (seed 003's trust model: only the internal network reaches the server)
    #[arg(long, conflicts_with = "token_file")]
    pub no_auth: bool,
    /// Project root: commands run here and may not leave it
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Policy file for the executor's settings
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Only these programs may run (repeatable; adds to the policy's executor.allow)
    #[arg(long = "allow", value_name = "PROGRAM")]
    pub allow: Vec<String>,
    /// Longest a command may run, and the default when a request names none (e.g. 10m)
    #[arg(long, value_name = "D")]
    pub timeout: Option<String>,
    /// Output kept per command; beyond it the output is cut with a marker (e.g. 64m)
    #[arg(long, value_name = "SIZE")]
    pub max_output: Option<String>,
    /// Commands running at once; beyond it requests get 429
    #[arg(long, value_name = "N")]
    pub max_concurrent: Option<usize>,
    /// Audit log file (default: the project's log under $XDG_STATE_HOME/corral/)
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Run each command in a jail built from this Plan (JSON: a plan's executor.jail), not on the host
    #[arg(long, value_name = "FILE")]
    pub jail_plan: Option<PathBuf>,
    /// Internal: run one command's jail (started by the server for --jail-plan)
    #[arg(long, hide = true)]
    pub jail_helper: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    pub profile: Option<String>,
    /// Words after the profile that are not options: a command written without `--`
    /// (`corral run make test`), refused with the line that means it (cmd/profile_arg.rs)
    #[arg(hide = true, value_name = "ARGS")]
    pub extra: Vec<String>,
    #[command(flatten)]
    pub jail: JailOptions,
    /// Print the plan as JSON
    #[arg(long)]
    pub json: bool,
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    pub profile: Option<String>,
    /// Also write the executor service into corral's own compose file (outside the project)
    #[arg(long)]
    pub compose: bool,
    /// Overwrite an existing corral.toml
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// How many audit records to show from before `corral watch` started
    #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 200)]
    pub lines: usize,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// One line per change (A added, M modified, D deleted) instead of the diff
    #[arg(long)]
    pub stat: bool,
    /// Only the changes below these paths
    #[arg(value_name = "PATH")]
    pub paths: Vec<std::path::PathBuf>,
    /// The project (default: the git root, else the current directory)
    #[arg(long, value_name = "DIR")]
    pub project: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct AcceptArgs {
    /// Only the changes below these paths (the rest stays pending)
    #[arg(value_name = "PATH")]
    pub paths: Vec<std::path::PathBuf>,
    /// The project (default: the git root, else the current directory)
    #[arg(long, value_name = "DIR")]
    pub project: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// The project (default: the git root, else the current directory)
    #[arg(long, value_name = "DIR")]
    pub project: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Keep printing new entries as they are written
    #[arg(long, short)]
    pub follow: bool,
    /// Only denied requests and refused commands
    #[arg(long)]
    pub blocked: bool,
    /// JSON lines, as stored
    #[arg(long)]
    pub json: bool,
    /// Only entries from this time on: a duration ago (10m, 2h, 1day) or a UTC time
    /// (2026-11-29, "2026-11-29 21:40", 2026-11-29T21:40:01Z)
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only the last N entries (with --follow: then every new one)
    #[arg(short = 'n', long = "lines", value_name = "N")]
    pub lines: Option<usize>,
    /// The runs this project's change record holds (what `corral undo` can undo), not the audit log
    #[arg(long, conflicts_with_all = ["follow", "blocked", "since", "lines"])]
    pub runs: bool,
}

#[derive(Debug, Args)]
pub struct UndoArgs {
    /// The run to undo (`corral log --runs`); the last one when omitted
    pub run: Option<String>,
    /// Put back even paths changed since the run (their current state goes in the undo's own record)
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build the harness image for the container engines
    Build {
        profile: Option<String>,
        #[arg(long, value_enum)]
        engine: Option<EngineArg>,
        /// Base image (default: the profile's, e.g. docker.io/library/node:22-bookworm-slim; or $CORRAL_BASE_IMAGE)
        #[arg(long, value_name = "IMAGE")]
        base: Option<String>,
        /// Tag of the image built (default: run.image, else localhost/corral-PROFILE:latest)
        #[arg(long, value_name = "TAG")]
        tag: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum KubeCommand {
    /// Print (or write) the manifests of one jail: the sandbox Pod, the proxy, the NetworkPolicies
    #[command(
        long_about = "The manifests of one jail, from the same plan `corral plan` prints: the sandbox \
                      Pod (no capabilities, non-root, read-only root, corral's seccomp profile, no \
                      service account token, no DNS), corral's proxy as its own Deployment and \
                      Service with the policy as a ConfigMap, and NetworkPolicies that let the \
                      sandbox reach only the proxy's port and the proxy only public addresses. \
                      NetworkPolicies are void where the cluster's CNI does not enforce them: \
                      `--check` says how to test that."
    )]
    Render(Box<KubeRenderArgs>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KubeTarget {
    /// A plain Pod
    Pod,
    /// A kubernetes-sigs/agent-sandbox SandboxTemplate (extensions.agents.x-k8s.io/v1beta1)
    AgentSandbox,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SeccompArg {
    /// corral's profile, installed on each node as /var/lib/kubelet/seccomp/corral/seccomp.json
    Localhost,
    /// The container runtime's default profile (when the nodes lack corral's)
    RuntimeDefault,
}

#[derive(Debug, Args)]
pub struct KubeRenderArgs {
    pub profile: Option<String>,
    #[command(flatten)]
    pub jail: JailOptions,
    /// What the sandbox is rendered as
    #[arg(long, value_enum, default_value = "pod")]
    pub target: KubeTarget,
    /// Write DIR/jail.yaml instead of printing the manifests
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Print how to test that the cluster enforces the NetworkPolicies, and render nothing
    #[arg(long)]
    pub check: bool,
    /// The jail's name, prefix of every object's (default: corral-PROJECT)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Namespace of every object (default: none set, kubectl's current one)
    #[arg(long, short = 'n', value_name = "NS")]
    pub namespace: Option<String>,
    /// The proxy Service's ClusterIP, a free address in the cluster's service range: the sandbox
    /// has no DNS and reaches the proxy by it (network mode proxy)
    #[arg(long, value_name = "IP")]
    pub proxy_ip: Option<String>,
    /// Image holding /usr/local/bin/corral-proxy (on PATH)
    #[arg(long, value_name = "IMAGE", default_value = corral_run::kube::DEFAULT_PROXY_IMAGE)]
    pub proxy_image: String,
    /// Harness image (default: the plan's run.image, else localhost/corral-PROFILE:latest)
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Also render the executor as its own Pod, its Service at this ClusterIP ([executor]
    /// target = "sandbox"; a random token in a Secret)
    #[arg(long, value_name = "IP")]
    pub executor_ip: Option<String>,
    /// Image of the executor Pod, holding corral and the project's toolchain (default: the harness image)
    #[arg(long, value_name = "IMAGE", requires = "executor_ip")]
    pub executor_image: Option<String>,
    /// Seccomp profile of the sandbox
    #[arg(long, value_enum, default_value = "localhost")]
    pub seccomp: SeccompArg,
    /// PersistentVolumeClaim holding the project (default: NAME-project)
    #[arg(long, value_name = "CLAIM", conflicts_with = "project_hostpath")]
    pub project_claim: Option<String>,
    /// Mount the project from its own path on the node (podman kube play, single-node clusters)
    #[arg(long)]
    pub project_hostpath: bool,
    /// The nodes' kubelet limits processes per Pod (podPidsLimit): limits.pids is then not refused
    #[arg(long)]
    pub pids_by_node: bool,
    /// For `podman kube play`, which ignores subPath: masked files are the node's DIR/masked
    /// (mode 0000), a missing policy file DIR/empty (0444), protected paths hostPath binds of
    /// themselves (needs --project-hostpath)
    #[arg(long, value_name = "DIR", requires = "project_hostpath")]
    pub node_files: Option<PathBuf>,
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    #[arg(long, value_enum)]
    pub engine: Option<EngineArg>,
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// What jailed runs of PROFILE changed against the host's state
    Diff {
        profile: String,
        /// JSON: one object per change
        #[arg(long)]
        json: bool,
    },
    /// Copy these paths (as `diff` shows them) from corral's layer to the host
    Apply {
        profile: String,
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Copy code-bearing files and keys without asking
        #[arg(long)]
        yes: bool,
    },
    /// Drop corral's layer of PROFILE: the next jailed run starts from the host's state
    Reset { profile: String },
}

#[derive(Debug, Subcommand)]
pub enum ShimCommand {
    /// Write wrappers for these profiles
    Install {
        profiles: Vec<String>,
        /// Directory to write the wrappers into
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Also write NAME-ns wrappers that run with --scratch
        #[arg(long)]
        scratch: bool,
    },
    /// List installed wrappers
    List {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// JSON: one object per wrapper
        #[arg(long)]
        json: bool,
    },
    /// Remove wrappers
    Remove {
        profiles: Vec<String>,
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct RuleArgs {
    /// HOST, *.HOST, optionally :PORT; an IP address (also put into network.allow_cidrs), or a
    /// CIDR (network.allow_cidrs alone)
    #[arg(required = true, value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Edit the user config instead of the project's corral.toml
    #[arg(long)]
    pub user: bool,
}

#[derive(Debug, Args)]
pub struct TrustArgs {
    /// The project directory or its corral.toml (default: the current directory's project)
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// List the trusted files and whether each still has the content you trusted
    #[arg(long, conflicts_with_all = ["revoke", "path"])]
    pub list: bool,
    /// Forget the trust of the project's corral.toml
    #[arg(long)]
    pub revoke: bool,
    /// With --list: JSON (path, sha256, trusted_at, state: current | changed | missing)
    #[arg(long, requires = "list")]
    pub json: bool,
    /// The options you run with (`--allow-host-executor`, `--env`, ...): the grants are
    /// measured against your own settings as `corral run` would have them
    #[command(
        flatten,
        next_help_heading = "Run options (grants are measured as `corral run` with these would)"
    )]
    pub jail: JailOptions,
}

#[derive(Debug, Args)]
pub struct SkillArgs {
    pub profile: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// Shell completions
    Completions { shell: clap_complete::Shell },
    /// The man page (roff) on standard output; with --dir, one page per command written there
    Man {
        /// Write corral.1 and corral-COMMAND.1 for every command into DIR (e.g. ~/.local/share/man/man1)
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct WorktreesArgs {
    /// One JSON array: name, path, branch, running, ahead, behind, changed, uncommitted
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum WorktreeCommand {
    /// List them: agent running or not, branch, ahead/behind, changed and uncommitted files
    #[command(visible_alias = "list")]
    Ls(WorktreesArgs),
    /// Remove the worktree NAME (refused while an agent runs in it); its branch is kept
    #[command(visible_alias = "remove")]
    Rm(WorktreeRmArgs),
}

#[derive(Debug, Args)]
pub struct WorktreeRmArgs {
    pub name: String,
    /// Also delete the branch NAME
    #[arg(long)]
    pub delete_branch: bool,
    /// Remove it even with uncommitted changes (they are lost)
    #[arg(long)]
    pub force: bool,
}
