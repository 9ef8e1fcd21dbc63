//! The Plan a run's backend consumes ([`RunPlan`]): the resolved Plan with what the run attaches
//! to it (the secrets' placeholders and the gateway's CA files, the executor's socket, token and
//! skill, the DNS stub's /etc files, the git directories held read-only), computed in this one
//! place from the Plan and the run's inputs, with no side effect. `corral plan --json` prints it;
//! `corral run` creates what it names (directories, the socket, the files) at the paths it names
//! and hands the backend [`RunPlan::plan`], nothing else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use corral_policy::plan::{Access, Dns, ExecutorTarget, Mount, MountKind, NetworkMode, Plan};
use serde::Serialize;

/// Where the executor's socket and token appear inside the agent's jail.
pub const JAIL_EXECUTOR_DIR: &str = "/run/corral/executor";

/// The jail id `corral plan` shows in the paths a run names by its jail id.
pub const PLAN_JAIL_ID: &str = "JAILID";

/// What a run's attachments depend on besides the Plan.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInputs {
    /// The run's jail id: it names the run's private directories.
    pub jail_id: String,
    /// Where the executor's and the DNS stub's private directories go.
    pub runtime_dir: PathBuf,
    /// Where the gateway's CA files go (bound into the jail at their own path).
    pub temp_dir: PathBuf,
    /// Each secret's placeholder, by secret name (made from its real value at run time).
    pub placeholders: BTreeMap<String, String>,
    /// The sign-ins (`[signin.NAME]`) whose credential file exists on the host: the jail gets
    /// a placeholder file over each.
    pub signins: Vec<String>,
    /// The harness's state files hold credentials the gateway swaps (corral-session
    /// `hstate/creds.rs`): the run needs the gateway and its CA even with no `[secrets]`.
    pub state_secrets: bool,
}

impl RunInputs {
    /// The inputs on this host: `$XDG_RUNTIME_DIR` when it is a directory (else /dev/shm when
    /// it is a tmpfs, else the temporary directory) for the private directories, the temporary
    /// directory for the CA files.
    pub fn on_host(jail_id: &str) -> RunInputs {
        RunInputs {
            jail_id: jail_id.to_string(),
            runtime_dir: runtime_dir(
                std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
                std::env::temp_dir(),
            ),
            temp_dir: std::env::temp_dir(),
            placeholders: BTreeMap::new(),
            signins: Vec::new(),
            state_secrets: false,
        }
    }

    fn executor_dir(&self) -> PathBuf {
        self.runtime_dir
            .join(format!("corral-exec-{}", self.jail_id))
    }

    fn dns_dir(&self) -> PathBuf {
        self.runtime_dir
            .join(format!("corral-dns-{}", self.jail_id))
    }

    fn trust_dir(&self) -> PathBuf {
        self.temp_dir.join(format!("corral-trust-{}", self.jail_id))
    }

    /// The inputs `corral plan` shows: the jail id [`PLAN_JAIL_ID`], and for each secret the
    /// text `<placeholder of $VAR>` (a run makes a fresh one from the real value).
    pub fn for_plan(plan: &Plan) -> RunInputs {
        let mut inputs = RunInputs::on_host(PLAN_JAIL_ID);
        inputs.placeholders = plan
            .secrets
            .iter()
            .map(|s| (s.name.clone(), format!("<placeholder of ${}>", s.from_env)))
            .collect();
        inputs.signins = plan
            .signin
            .iter()
            .filter(|s| s.file.is_file())
            .map(|s| s.name.clone())
            .collect();
        inputs
    }
}

/// The Plan the backend runs, with what the run attached to it (already applied to `plan`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunPlan {
    #[serde(flatten)]
    pub plan: Plan,
    pub attachments: Attachments,
}

/// What a run attaches to its Plan, each item what the run creates on the host.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Attachments {
    pub secrets: Option<SecretsAttachment>,
    pub executor: Option<ExecutorAttachment>,
    pub dns: Option<DnsAttachment>,
    /// The git directories' files held read-only (added to `protected`, in the jail and in the
    /// executor's jail): what the session's git snapshot found (gitguard.rs).
    pub git_protected: Vec<PathBuf>,
}

impl Attachments {
    /// The directories the run makes on the host for these attachments, each removed when the
    /// run ends: the executor's socket and skill ([`ExecutorAttachment`]), the stub
    /// resolver's files ([`DnsAttachment`]), the gateway's CA files and the sign-ins'
    /// placeholder files ([`SecretsAttachment`]). The run's journal entry names them
    /// (`Session::made_on_host`), so that the next corral command removes them when this one
    /// was killed (journal.rs).
    pub fn host_dirs(&self) -> Vec<PathBuf> {
        let executor = self.executor.as_ref().map(|e| e.dir.clone());
        let dns = self.dns.as_ref().map(|d| d.dir.clone());
        let trust = self.secrets.as_ref().and_then(|s| s.trust_dir.clone());
        [executor, dns, trust].into_iter().flatten().collect()
    }
}

/// `[secrets]`: placeholders in the jail's environment; with network mode `proxy`, the
/// gateway's CA files, which the gateway writes into `trust_dir` (mode 0700, removed at the end).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SecretsAttachment {
    pub placeholders: BTreeMap<String, String>,
    /// The sign-ins served: each one's placeholder file ([`signin_file`]) is bound read-write
    /// over the real credential file's path.
    pub signins: Vec<String>,
    pub trust_dir: Option<PathBuf>,
}

/// Where the run writes sign-in `name`'s placeholder file in its `trust_dir`.
pub fn signin_file(trust_dir: &Path, name: &str) -> PathBuf {
    trust_dir.join(format!("signin-{name}.json"))
}

/// The executor and the skill: a private directory (mode 0700) holding `jail/` (the socket
/// `exec.sock` and the `token`, bound read-only at [`JAIL_EXECUTOR_DIR`]) when corral serves an
/// executor, and `skill/SKILL.md` (bound read-only at the skill's directory) with a skill.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutorAttachment {
    pub dir: PathBuf,
    pub serve: bool,
    pub skill: Option<PathBuf>,
}

impl ExecutorAttachment {
    /// The directory bound at [`JAIL_EXECUTOR_DIR`].
    pub fn shared(&self) -> PathBuf {
        self.dir.join("jail")
    }
}

/// `network.dns = "stub"`: files bound over the jail's /etc (resolv.conf naming the stub on
/// 127.0.0.1, a hosts file with localhost and the jail's hostname only), written into `dir`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DnsAttachment {
    pub dir: PathBuf,
    pub files: BTreeMap<String, String>,
}

impl RunPlan {
    /// `base` with every attachment of a native run with `inputs`. Writes nothing.
    pub fn new(base: &Plan, inputs: &RunInputs) -> RunPlan {
        let mut plan = base.clone();
        let attachments = Attachments {
            secrets: secrets(&mut plan, inputs),
            executor: executor(&mut plan, inputs),
            dns: dns(&mut plan, inputs),
            git_protected: Vec::new(),
        };
        RunPlan { plan, attachments }
    }

    /// `base` as a container engine runs it: the engine attaches the rest itself (its commands
    /// are in `corral plan --engine E`).
    pub fn container(base: &Plan) -> RunPlan {
        RunPlan {
            plan: base.clone(),
            attachments: Attachments::default(),
        }
    }

    /// The git directories where the jail (and the executor's jail) may create a `HEAD` while
    /// it runs ([`crate::Session::git_dirs`]; the name gate, crate `corral-namegate`).
    pub fn git_dirs(&mut self, dirs: &[PathBuf]) {
        self.plan.git.dirs = dirs.to_vec();
        if let Some(jail) = self.plan.executor.jail.as_mut() {
            jail.git.dirs = dirs.to_vec();
        }
    }

    /// Hold `paths` read-only in the jail and in the executor's jail (the git files the
    /// session's snapshot found, [`crate::Session::protected`]).
    pub fn protect(&mut self, paths: &[PathBuf]) {
        if paths.is_empty() {
            return;
        }
        let add = |protected: &mut Vec<PathBuf>| {
            protected.extend(paths.iter().cloned());
            protected.sort();
            protected.dedup();
        };
        add(&mut self.plan.protected);
        // The executor's jail runs in the same project: the same files are read-only there.
        if let Some(jail) = self.plan.executor.jail.as_mut() {
            add(&mut jail.protected);
        }
        add(&mut self.attachments.git_protected);
    }
}

/// What `corral plan --json` prints for `plan`: the RunPlan a run would hand its backend, with
/// the jail id [`PLAN_JAIL_ID`] and each secret's placeholder described, and the git files a
/// snapshot taken now holds read-only. Reads the project; writes nothing.
pub fn planned(plan: &Plan) -> RunPlan {
    planned_with(plan, &RunInputs::for_plan(plan))
}

/// [`planned`] with the run's inputs given: what `corral plan --json` prints for a caller
/// whose environment names these directories.
pub fn planned_with(plan: &Plan, inputs: &RunInputs) -> RunPlan {
    use corral_policy::plan::Engine;
    let mut run = match plan.engine {
        Engine::Podman | Engine::Docker | Engine::Kube => RunPlan::container(plan),
        Engine::Native | Engine::Auto => RunPlan::new(plan, inputs),
    };
    let snapshot = crate::gitguard::snapshot(
        &plan.project.root,
        crate::session::writes_project(plan),
        &plan.home,
    );
    run.protect(&crate::gitguard::protected_paths(&snapshot));
    run.git_dirs(&crate::gitguard::git_dirs(
        &snapshot,
        &crate::session::rw_bind_sources(&run.plan),
    ));
    run
}

fn ro_bind(source: PathBuf, target: PathBuf) -> Mount {
    Mount {
        source,
        target,
        kind: MountKind::Bind(Access::Ro),
        optional: false,
    }
}

/// The placeholders, and with the proxy the gateway's CA variables and binds. None with no
/// secret, sign-in or rule by method and path (`network.allow = ["GET host/path/**"]`: the
/// gateway terminates those hosts' TLS with the run's CA too), and with network mode `host` (a
/// run refuses secrets there: the gateway cannot act).
fn secrets(plan: &mut Plan, inputs: &RunInputs) -> Option<SecretsAttachment> {
    let signins: Vec<&corral_policy::signin::SigninPlan> = plan
        .signin
        .iter()
        .filter(|s| inputs.signins.contains(&s.name))
        .collect();
    let path_rules =
        plan.network.mode == NetworkMode::Proxy && !plan.network.allow_paths.is_empty();
    if (plan.secrets.is_empty() && signins.is_empty() && !path_rules && !inputs.state_secrets)
        || plan.network.mode == NetworkMode::Host
    {
        return None;
    }
    let signin_mounts: Vec<(String, PathBuf)> = signins
        .iter()
        .map(|s| (s.name.clone(), s.file.clone()))
        .collect();
    let placeholders: BTreeMap<String, String> = plan
        .secrets
        .iter()
        .filter_map(|s| Some((s.name.clone(), inputs.placeholders.get(&s.name)?.clone())))
        .collect();
    let proxy = plan.network.mode == NetworkMode::Proxy;
    // Without the proxy a sign-in's placeholder file still needs a home (no gateway, no CA).
    let trust_dir = (proxy || !signin_mounts.is_empty()).then(|| inputs.trust_dir());
    if let Some(dir) = trust_dir.as_deref().filter(|_| proxy) {
        let layout = corral_gateway::trust_layout(dir);
        plan.env.extend(layout.env);
        plan.mounts.extend(layout.mounts);
        // The system bundles themselves (system roots + run CA), for programs that read only
        // /etc/ssl and ignore every CA variable.
        plan.mounts.extend(layout.system_overlays);
    }
    if let Some(dir) = &trust_dir {
        // After the state directories: each sign-in file over the real one.
        for (name, file) in &signin_mounts {
            plan.mounts.push(Mount {
                source: signin_file(dir, name),
                target: file.clone(),
                kind: MountKind::Bind(Access::Rw),
                optional: false,
            });
        }
    }
    plan.env.extend(placeholders.clone());
    Some(SecretsAttachment {
        placeholders,
        signins: signin_mounts.into_iter().map(|(n, _)| n).collect(),
        trust_dir,
    })
}

/// Where a run's private directories go: `xdg` (`$XDG_RUNTIME_DIR`) when it is a directory, else
/// /dev/shm when it is a tmpfs anyone may create in ([`shm`]), else `temp` (the temporary
/// directory).
pub fn runtime_dir(xdg: Option<PathBuf>, temp: PathBuf) -> PathBuf {
    xdg.filter(|d| d.is_dir()).or_else(shm).unwrap_or(temp)
}

/// /dev/shm when it is a tmpfs that anyone may create in (sticky, as /tmp is): the run's
/// private directories are made and removed in memory, not on the disk /tmp may be on (a
/// directory made and removed on a VM's ext4 takes 0.3-4 ms).
fn shm() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dir = Path::new("/dev/shm");
    let meta = std::fs::symlink_metadata(dir).ok()?;
    let open = meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o7777 == 0o1777;
    let tmpfs = nix::sys::statfs::statfs(dir)
        .is_ok_and(|st| st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    (open && tmpfs).then(|| dir.to_path_buf())
}

/// The executor (SPEC section 6) and the skill: `None` when there is neither
/// (`compose:SERVICE` without a skill, or a plan that is itself an executor's jail).
fn executor(plan: &mut Plan, inputs: &RunInputs) -> Option<ExecutorAttachment> {
    let serve = match (&plan.executor.target, &plan.executor.jail) {
        (ExecutorTarget::Sandbox, Some(_)) | (ExecutorTarget::Host, _) => true,
        (ExecutorTarget::Sandbox, None) | (ExecutorTarget::Compose(_), _) => false,
    };
    if !serve && plan.skill.is_none() {
        return None;
    }
    let dir = inputs.executor_dir();
    let mut attachment = ExecutorAttachment {
        dir: dir.clone(),
        serve,
        skill: None,
    };
    if let Some(skill) = plan.skill.clone() {
        let skill_dir = dir.join("skill");
        plan.mounts
            .push(ro_bind(skill_dir.clone(), skill.dir.clone()));
        plan.command.extend(skill.args.iter().cloned());
        attachment.skill = Some(skill_dir);
    }
    if serve {
        plan.mounts.push(ro_bind(
            attachment.shared(),
            PathBuf::from(JAIL_EXECUTOR_DIR),
        ));
        plan.env.insert(
            "CORRAL_EXECUTOR".into(),
            format!("unix:{JAIL_EXECUTOR_DIR}/exec.sock"),
        );
        plan.env.insert(
            "CORRAL_EXECUTOR_TOKEN_FILE".into(),
            format!("{JAIL_EXECUTOR_DIR}/token"),
        );
        plan.env.insert(
            "CORRAL_PROJECT_ROOT".into(),
            plan.project.root.display().to_string(),
        );
    }
    Some(attachment)
}

/// The stub resolver's /etc files, with network mode `proxy` and `dns = "stub"`.
fn dns(plan: &mut Plan, inputs: &RunInputs) -> Option<DnsAttachment> {
    match (plan.network.mode, plan.network.dns) {
        (NetworkMode::Proxy, Dns::Stub) => {}
        (_, Dns::None) | (NetworkMode::None | NetworkMode::Host, Dns::Stub) => return None,
    }
    let dir = inputs.dns_dir();
    let files: BTreeMap<String, String> = [
        (
            "resolv.conf",
            "# corral: the jail's stub resolver (allowlisted names only)\nnameserver 127.0.0.1\n",
        ),
        (
            "hosts",
            "127.0.0.1\tlocalhost corral\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        ),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t.to_string()))
    .collect();
    // resolv.conf first, then hosts, as the files were always bound.
    for name in ["resolv.conf", "hosts"] {
        plan.mounts
            .push(ro_bind(dir.join(name), Path::new("/etc").join(name)));
    }
    Some(DnsAttachment { dir, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The journal names what the run makes on the host: each attachment's directory that is
    /// there, nothing for one that is not (a container run attaches none).
    #[test]
    fn host_dirs_are_the_attachments_directories() {
        assert!(Attachments::default().host_dirs().is_empty());
        let secrets = |trust_dir: Option<&str>| SecretsAttachment {
            placeholders: BTreeMap::new(),
            signins: Vec::new(),
            trust_dir: trust_dir.map(PathBuf::from),
        };
        let all = Attachments {
            secrets: Some(secrets(Some("/tmp/corral-trust-j"))),
            executor: Some(ExecutorAttachment {
                dir: PathBuf::from("/run/user/1/corral-exec-j"),
                serve: true,
                skill: None,
            }),
            dns: Some(DnsAttachment {
                dir: PathBuf::from("/run/user/1/corral-dns-j"),
                files: BTreeMap::new(),
            }),
            git_protected: vec![PathBuf::from("/p/.git/hooks")],
        };
        assert_eq!(
            all.host_dirs(),
            [
                "/run/user/1/corral-exec-j",
                "/run/user/1/corral-dns-j",
                "/tmp/corral-trust-j"
            ]
            .map(PathBuf::from)
        );
        // Placeholders in the environment only (no proxy, no sign-in): no directory.
        let env_only = Attachments {
            secrets: Some(secrets(None)),
            ..Attachments::default()
        };
        assert!(env_only.host_dirs().is_empty());
    }
}
