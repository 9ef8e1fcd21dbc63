//! Reading the policy's layers: a policy file (its trust level decides what it may grant) and
//! the command-line flags, each value validated and located.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{
    EnvName, EnvSection, ExecutorSection, FilesystemSection, MemorySize, NetworkSection,
    PolicyFile, RunSection, SecretEntry, Spanned, pattern_at,
};
use crate::error::PolicyError;
use crate::pathrule::AllowEntry;
use crate::plan::{ExecutorTarget, NetworkMode};

use super::grants::{
    CLIPBOARD_GRANT, allow_text, bind_text, cidr_text, compose_text, env_pass_text, host_port_text,
    publish_text, secret_text, upstream_text,
};
use super::layer::{Layer, Loc, NetLayer, PathCtx, Trust, normalize};
use super::{Flags, real_path};

pub(super) fn span_loc<T>(file: &Path, text: &str, s: &Spanned<T>) -> Loc {
    Loc::in_file(file, text, s.span())
}

pub(super) fn net_layer(
    file: &Path,
    text: &str,
    n: NetworkSection,
) -> Result<NetLayer, PolicyError> {
    let mut allow = Vec::new();
    let mut allow_paths = Vec::new();
    for a in &n.allow {
        let at = span_loc(file, text, a);
        match AllowEntry::parse(a.get_ref()) {
            Ok(AllowEntry::Host(p)) => allow.push((p, at)),
            Ok(AllowEntry::Path(r)) => allow_paths.push((r, at)),
            Err(e) => return Err(PolicyError::at(file, text, a.span().start, e.to_string())),
        }
    }
    for d in &n.deny {
        if d.get_ref().contains(['/', ' ']) {
            return Err(PolicyError::at(
                file,
                text,
                d.span().start,
                format!(
                    "network.deny entry {:?}: deny takes hosts only; to refuse some paths of a host, allow only the paths it may use (`network.allow = [\"GET host/path/**\"]`)",
                    d.get_ref()
                ),
            ));
        }
    }
    let ask_timeout = match &n.ask_timeout {
        None => None,
        Some(t) => {
            let max = crate::config::MAX_ASK_TIMEOUT;
            let secs = u32::try_from(*t.get_ref())
                .ok()
                .filter(|s| (1..=max).contains(s))
                .ok_or_else(|| {
                    PolicyError::at(
                        file,
                        text,
                        t.span().start,
                        format!(
                            "network.ask_timeout = {}: seconds a held connection waits for an answer, from 1 to {max}",
                            t.get_ref()
                        ),
                    )
                })?;
            Some((secs, span_loc(file, text, t)))
        }
    };
    Ok(NetLayer {
        mode: n.mode.map(|m| {
            let at = span_loc(file, text, &m);
            (m.into_inner(), at)
        }),
        allow,
        allow_paths,
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
        on_deny: n.on_deny.map(|d| {
            let at = span_loc(file, text, &d);
            (d.into_inner(), at)
        }),
        ask_timeout,
    })
}

/// Credential and start-up locations a project file may not bind at all, and those it may not
/// bind read-write (relative to the home).
pub(super) const NEVER_FROM_PROJECT: &[&str] = &[
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
pub(super) const NEVER_RW_FROM_PROJECT: &[&str] = &[
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
pub(super) const NEVER_SYSTEM_FROM_PROJECT: &[&str] = &[
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
pub(super) fn check_project_bind(
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

/// Turn one parsed policy file into a layer: expand and check paths, locate every value, and
/// apply the rules of its trust level. What a project's file grants is appended to `grants`.
pub(super) fn file_layer(
    file: &Path,
    text: &str,
    pf: PolicyFile,
    trust: Trust,
    ctx: &PathCtx,
    user_config: Option<&Path>,
    grants: &mut Vec<String>,
) -> Result<Layer, PolicyError> {
    let mut r = Reader {
        file,
        text,
        project: trust == Trust::Project,
        ctx,
        user_config,
        grants,
    };
    let mut l = Layer::default();
    if let Some(p) = pf.profile {
        let at = r.at(&p);
        let name = p.into_inner();
        crate::profile::profile(&name).map_err(|e| at.error(e.to_string()))?;
        l.profile = Some((name, at));
    }
    if let Some(run) = pf.run {
        r.run(&mut l, run)?;
    }
    if let Some(fs) = pf.filesystem {
        r.filesystem(&mut l, fs)?;
    }
    if let Some(env) = pf.env {
        r.env(&mut l, env)?;
    }
    if let Some(n) = pf.network {
        l.net = r.network(n, "network")?;
    }
    if let Some(secrets) = pf.secrets {
        r.secrets(&mut l, secrets)?;
    }
    for (name, entry) in pf.signin.unwrap_or_default() {
        let at = key_loc(file, text, &["signin", name.as_str()]);
        let spec = entry.resolve(file, text)?;
        if r.project {
            r.grants.push(format!("{at}: {}", spec.grant_text(&name)));
        }
        l.signin.insert(name, (spec, at));
    }
    if let Some(c) = pf.terminal.and_then(|t| t.clipboard) {
        if r.project && *c.get_ref() {
            // At the key, as the trust list says it (one line in `corral plan`).
            let at = key_loc(file, text, &["terminal", "clipboard"]);
            r.grants.push(format!("{at}: {CLIPBOARD_GRANT}"));
        }
        l.clipboard = Some(c.into_inner());
    }
    if pf.undo.is_some() && r.project {
        let at = key_loc(file, text, &["undo"]);
        return Err(at.error(
            "[undo] may only be set in your user config ($XDG_CONFIG_HOME/corral/config.toml), \
             never in a project's policy file (the repository could turn off its own undo)"
                .into(),
        ));
    }
    if let Some(lim) = pf.limits {
        l.memory = lim.memory.map(|s| s.0);
        l.cpus = lim.cpus.map(|c| c.0);
        l.pids = lim.pids;
        l.enforce = lim.enforce;
    }
    if let Some(ex) = pf.executor {
        r.executor(&mut l, ex)?;
    }
    Ok(l)
}

/// One policy file being read into a layer: where its values are, how far it is trusted, and
/// the grants it makes so far.
struct Reader<'a> {
    file: &'a Path,
    text: &'a str,
    /// A project's file (may be hostile): its grants are listed, some keys refused.
    project: bool,
    ctx: &'a PathCtx<'a>,
    user_config: Option<&'a Path>,
    grants: &'a mut Vec<String>,
}

impl Reader<'_> {
    fn at<T>(&self, s: &Spanned<T>) -> Loc {
        span_loc(self.file, self.text, s)
    }

    fn grant(&mut self, at: &Loc, what: String) {
        if self.project {
            self.grants.push(format!("{at}: {what}"));
        }
    }

    /// A key only the user may set (`executor.allow_host`, `filesystem.allow_harness_config`).
    fn user_only(&self, s: &Spanned<bool>, key: &str, flag: &str) -> Result<bool, PolicyError> {
        if self.project {
            return Err(self.at(s).error(format!(
                "{key} may only be set in your user config ($XDG_CONFIG_HOME/corral/config.toml) \
                 or with {flag}, never in a project's policy file (the repository could be hostile)"
            )));
        }
        Ok(*s.get_ref())
    }

    fn run(&mut self, l: &mut Layer, run: RunSection) -> Result<(), PolicyError> {
        if let Some(c) = run.command {
            let at = self.at(&c);
            let c = c.into_inner();
            if c.is_empty() {
                return Err(
                    at.error("run.command: expected a non-empty list such as [\"pi\"]".into())
                );
            }
            self.grant(
                &at,
                format!("run.command replaces the harness command with {c:?}"),
            );
            l.command = Some(c);
        }
        if let Some(i) = run.image {
            let at = self.at(&i);
            self.grant(
                &at,
                format!("run.image runs the harness in image {:?}", i.get_ref()),
            );
            l.image = Some(i.into_inner());
        }
        l.engine = run.engine;
        Ok(())
    }

    fn filesystem(&mut self, l: &mut Layer, fs: FilesystemSection) -> Result<(), PolicyError> {
        l.project_access = fs.project;
        if let Some(a) = fs.allow_harness_config {
            l.allow_harness_config = self.user_only(
                &a,
                "filesystem.allow_harness_config",
                "--allow-harness-config",
            )?;
        }
        if let Some(a) = fs.allow_new_repositories {
            l.allow_new_repositories = self.user_only(
                &a,
                "filesystem.allow_new_repositories",
                "--allow-new-repositories",
            )?;
        }
        if let Some(r) = fs.review {
            l.review = r.into_inner();
        }
        l.read_only = self.binds(fs.read_only, "filesystem.read_only", false)?;
        l.read_write = self.binds(fs.read_write, "filesystem.read_write", true)?;
        for raw in fs.hide {
            let at = self.at(&raw);
            let g = raw.into_inner();
            crate::hide::glob(&g).map_err(|e| at.error(e))?;
            l.hide.push((g, at));
        }
        for raw in fs.protect {
            let at = self.at(&raw);
            let p = self
                .ctx
                .in_project(raw.get_ref(), "filesystem.protect", &at)?;
            l.protect.push((p, at));
        }
        Ok(())
    }

    fn env(&mut self, l: &mut Layer, env: EnvSection) -> Result<(), PolicyError> {
        for n in env.pass {
            let at = self.at(&n);
            let name = EnvName::parse(n.get_ref()).map_err(|e| at.error(e))?.0;
            self.grant(&at, env_pass_text(&name));
            l.env_pass.push((name, at));
        }
        for (k, v) in env.set {
            let at = self.at(&v);
            EnvName::parse(&k).map_err(|e| at.error(format!("env.set: {e}")))?;
            l.env_set.insert(k, (v.into_inner(), at));
        }
        Ok(())
    }

    fn network(&mut self, n: NetworkSection, key: &str) -> Result<NetLayer, PolicyError> {
        let net = net_layer(self.file, self.text, n)?;
        if self.project {
            check_project_network(&net, key, self.grants)?;
        }
        Ok(net)
    }

    fn secrets(
        &mut self,
        l: &mut Layer,
        secrets: BTreeMap<String, Spanned<SecretEntry>>,
    ) -> Result<(), PolicyError> {
        for (name, spec) in secrets {
            let at = self.at(&spec);
            EnvName::parse(&name).map_err(|e| at.error(format!("secrets: {e}")))?;
            let spec = spec.get_ref().resolve(self.file, self.text)?;
            self.grant(&at, secret_text(&name, &spec));
            l.secrets.insert(name, (spec, at));
        }
        Ok(())
    }

    fn executor(&mut self, l: &mut Layer, ex: ExecutorSection) -> Result<(), PolicyError> {
        if let Some(ah) = ex.allow_host {
            l.exec_allow_host =
                self.user_only(&ah, "executor.allow_host", "--allow-host-executor")?;
        }
        if let Some(t) = ex.target {
            let at = self.at(&t);
            let t = t.into_inner().0;
            if let ExecutorTarget::Compose(svc) = &t {
                self.grant(&at, compose_text(svc));
            }
            l.exec_target = Some((t, at));
        }
        l.exec_allow = ex.allow;
        l.exec_timeout_ms = ex.timeout.map(|d| d.0);
        l.exec_max_output = ex.max_output.map(|s| s.0);
        l.exec_max_concurrent = ex.max_concurrent;
        if let Some(sb) = ex.sandbox {
            l.exec_read_only = self.binds(sb.read_only, "executor.sandbox.read_only", false)?;
            l.exec_read_write = self.binds(sb.read_write, "executor.sandbox.read_write", true)?;
            if let Some(n) = sb.network {
                l.exec_net = self.network(n, "executor.sandbox.network")?;
            }
        }
        Ok(())
    }

    /// Expand a list of bind paths. For a project's file, a path is judged by where it really
    /// leads (symlinks resolved, as the backends bind it): a repository can commit `evil -> ..`,
    /// and `evil/.ssh` is then the home's `.ssh`, not a path inside the project.
    fn binds(
        &mut self,
        list: Vec<Spanned<String>>,
        key: &'static str,
        rw: bool,
    ) -> Result<Vec<(PathBuf, Loc)>, PolicyError> {
        let mut out = Vec::new();
        for raw in list {
            let at = self.at(&raw);
            let p = self.ctx.expand(raw.get_ref(), key, &at)?;
            if self.project {
                let project = self.ctx.project;
                let real = real_path(&p);
                if !p.starts_with(project) || !real.starts_with(project) {
                    check_project_bind(&p, rw, key, &at, self.ctx, self.user_config)?;
                    if real != p {
                        check_project_bind(&real, rw, key, &at, self.ctx, self.user_config)?;
                    }
                    self.grant(&at, bind_text(key, &p, &real, rw));
                }
            }
            out.push((p, at));
        }
        Ok(out)
    }
}

/// What a project file's network section grants, and the one thing it may not do alone.
pub(super) fn check_project_network(
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
    for (r, at) in &n.allow_paths {
        grants.push(format!("{at}: {}", allow_text(key, r)));
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
pub(super) fn key_loc(file: &Path, text: &str, keys: &[&str]) -> Loc {
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

/// The command-line layer.
pub(super) fn flags_layer(f: &Flags, cwd: &Path, home: &Path) -> Result<Layer, PolicyError> {
    let mut l = Layer {
        engine: f.engine,
        exec_allow_host: f.allow_host_executor,
        allow_harness_config: f.allow_harness_config,
        allow_new_repositories: f.allow_new_repositories,
        review: f.review,
        cpus: f.cpus,
        pids: f.pids,
        enforce: f.enforce,
        ..Layer::default()
    };
    if let Some(m) = f.network {
        l.net.mode = Some((m, Loc::Flag("--network")));
    }
    for a in &f.allow {
        match AllowEntry::parse(a)
            .map_err(|e| PolicyError::Invalid(format!("--allow {a:?}: {e}")))?
        {
            AllowEntry::Host(p) => l.net.allow.push((p, Loc::Flag("--allow"))),
            AllowEntry::Path(r) => l.net.allow_paths.push((r, Loc::Flag("--allow"))),
        }
    }
    l.read_write = flag_binds("--rw", &f.rw, cwd, home)?;
    l.read_only = flag_binds("--ro", &f.ro, cwd, home)?;
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

/// The paths of `--rw` or `--ro`: `~` is the home, relative paths are the caller's cwd's. A
/// path named on the command line must exist (a typo is not silently skipped); those of policy
/// files stay optional (`~/.gitconfig` is not on every machine).
fn flag_binds(
    flag: &'static str,
    paths: &[PathBuf],
    cwd: &Path,
    home: &Path,
) -> Result<Vec<(PathBuf, Loc)>, PolicyError> {
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
    paths
        .iter()
        .map(|p| {
            let a = abs(p);
            match std::fs::metadata(&a) {
                Ok(_) => Ok((a, Loc::Flag(flag))),
                Err(e) => Err(PolicyError::Invalid(format!(
                    "{flag} {}: cannot bind {}: {e}",
                    p.display(),
                    a.display()
                ))),
            }
        })
        .collect()
}
