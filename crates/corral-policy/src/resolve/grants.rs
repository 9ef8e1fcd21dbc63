//! What a project's policy file grants, in plain words: the list `corral plan` shows and the
//! part of it that needs the user's trust before a jail starts.

use std::fmt;
use std::path::Path;

use ipnet::IpNet;

use crate::config::SecretSpec;
use crate::plan::{Access, Enforce, ExecutorTarget, NetworkMode};
use crate::profile::Profile;

use super::RealPaths;
use super::layer::{DEFAULT_EXEC_NETWORK, DEFAULT_NETWORK, Layer, Loc, NetLayer};
use super::policy_file::key_loc;

/// A project file's `terminal.clipboard = true`.
pub(super) const CLIPBOARD_GRANT: &str =
    "terminal.clipboard lets the jail write to your clipboard (OSC 52 escape sequences)";

/// The plain words of each grant a project file can make (shared by `Plan::project_grants` and
/// the list that needs the user's trust, so both say the same).
pub(super) fn env_pass_text(name: &str) -> String {
    format!("env.pass hands your {name} to the jail")
}

pub(super) fn secret_text(name: &str, spec: &SecretSpec) -> String {
    format!(
        "secrets.{name} sends your {} to {}",
        spec.from_env.0,
        join(&spec.hosts)
    )
}

pub(super) fn compose_text(svc: &str) -> String {
    format!("executor.target runs the agent's commands in compose service {svc:?}")
}

/// A bind outside the project, judged by where it really leads.
pub(super) fn bind_text(key: &str, p: &Path, real: &Path, rw: bool) -> String {
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

pub(super) fn allow_text(key: &str, a: &dyn std::fmt::Display) -> String {
    format!("{key}.allow lets the jail reach {a}")
}

pub(super) fn cidr_text(key: &str, c: &IpNet) -> String {
    format!("{key}.allow_cidrs opens the non-public range {c}")
}

pub(super) fn host_port_text(key: &str, p: u16) -> String {
    format!("{key}.host_ports connects the jail to your 127.0.0.1:{p}")
}

pub(super) fn upstream_text(key: &str, u: &str) -> String {
    format!("{key}.upstream_proxy sends all traffic through {u}")
}

pub(super) fn publish_text(key: &str, p: u16) -> String {
    format!("{key}.publish exposes the jail's port {p} on your 127.0.0.1:{p}")
}

/// How far a network mode opens: none < proxy < host.
pub(super) fn mode_rank(m: NetworkMode) -> u8 {
    match m {
        NetworkMode::None => 0,
        NetworkMode::Proxy => 1,
        NetworkMode::Host => 2,
    }
}

/// A value of a project's layer that is in force (no higher layer replaced it).
pub(super) fn in_force<T: PartialEq>(project: &Option<T>, merged: &Option<T>) -> bool {
    project.is_some() && project == merged
}

/// The network grants of a project's layer beyond the user's own (`without`).
pub(super) fn net_trust(
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
    for (r, at) in &project.allow_paths {
        if !without.allow_paths.iter().any(|(w, _)| w == r) {
            out.push((at.clone(), allow_text(key, r)));
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

pub(super) fn mode_name(m: NetworkMode) -> &'static str {
    match m {
        NetworkMode::None => "none",
        NetworkMode::Proxy => "proxy",
        NetworkMode::Host => "host",
    }
}

pub(super) fn profile_switch_text(at: &Loc, profile: &Profile, users: &str) -> String {
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

/// A project's own policy file against the user's own layers, to list what it grants.
pub(super) struct TrustInput<'a> {
    pub(super) file: &'a Path,
    pub(super) text: &'a str,
    /// The project file's layer alone.
    pub(super) project: &'a Layer,
    /// The merged policy with the project's layer.
    pub(super) with: &'a Layer,
    /// The same layers without it: what the user's own word gives.
    pub(super) without: &'a Layer,
    /// The project directory.
    pub(super) root: &'a Path,
    /// Where the project's bind paths really lead.
    pub(super) real: &'a RealPaths,
}

/// Everything a project's own policy file grants beyond the user's own layers (defaults,
/// profile, user config, flags): what needs the user's trust before a jail starts. What only
/// narrows (deny rules, lower limits, `ro`, hide, protect) or stays inside the jail (profile,
/// command, image, engine, env.set) is not here. Sorted by position in the file.
pub(super) fn trust_grants(t: &TrustInput) -> Vec<(Loc, String)> {
    let mut out: Vec<(Loc, String)> = Vec::new();
    project_access_grant(t, &mut out);
    bind_grants(t, &mut out);
    for (name, loc) in &t.project.env_pass {
        if !t.without.env_pass.iter().any(|(w, _)| w == name) {
            out.push((loc.clone(), env_pass_text(name)));
        }
    }
    let (p, with, without) = (t.project, t.with, t.without);
    net_trust(
        "network",
        &p.net,
        &with.net,
        &without.net,
        DEFAULT_NETWORK,
        &mut out,
    );
    for (name, (spec, loc)) in &p.secrets {
        if without.secrets.get(name).map(|(w, _)| w) != Some(spec) {
            out.push((loc.clone(), secret_text(name, spec)));
        }
    }
    for (name, (spec, loc)) in &p.signin {
        if without.signin.get(name).map(|(w, _)| w) != Some(spec) {
            out.push((loc.clone(), spec.grant_text(name)));
        }
    }
    limit_grants(t, &mut out);
    if p.clipboard == Some(true) && with.clipboard == Some(true) && without.clipboard != Some(true)
    {
        out.push((t.at(&["terminal", "clipboard"]), CLIPBOARD_GRANT.into()));
    }
    executor_grants(t, &mut out);
    net_trust(
        "executor.sandbox.network",
        &p.exec_net,
        &with.exec_net,
        &without.exec_net,
        DEFAULT_EXEC_NETWORK,
        &mut out,
    );
    out.sort_by_key(|(loc, _)| match loc {
        Loc::File { line, col, .. } => (*line, *col),
        _ => (0, 0),
    });
    out
}

impl TrustInput<'_> {
    /// The place of a key in the project's file.
    fn at(&self, keys: &[&str]) -> Loc {
        key_loc(self.file, self.text, keys)
    }

    /// The user's own layers make the project read-only.
    fn ro_project(&self) -> bool {
        self.without.project_access == Some(Access::Ro)
    }
}

fn project_access_grant(t: &TrustInput, out: &mut Vec<(Loc, String)>) {
    if t.ro_project() && in_force(&t.project.project_access, &t.with.project_access) {
        out.push((
            t.at(&["filesystem", "project"]),
            "filesystem.project = \"rw\" makes the project writable (your settings say \"ro\")"
                .into(),
        ));
    }
}

/// Binds the user's layers do not already give: outside the project (judged by where they
/// really lead), or writable in a project the user made read-only.
fn bind_grants(t: &TrustInput, out: &mut Vec<(Loc, String)>) {
    let (p, w) = (t.project, t.without);
    let binds = [
        (&p.read_only, "filesystem.read_only", false),
        (&p.read_write, "filesystem.read_write", true),
        (&p.exec_read_only, "executor.sandbox.read_only", false),
        (&p.exec_read_write, "executor.sandbox.read_write", true),
    ];
    for (list, key, rw) in binds {
        let (w_ro, w_rw) = if key.starts_with("executor") {
            (&w.exec_read_only, &w.exec_read_write)
        } else {
            (&w.read_only, &w.read_write)
        };
        for (path, loc) in list {
            let given =
                w_rw.iter().any(|(q, _)| q == path) || (!rw && w_ro.iter().any(|(q, _)| q == path));
            if given {
                continue;
            }
            let real = t.real.of(path);
            if !path.starts_with(t.root) || !real.starts_with(t.root) {
                out.push((loc.clone(), bind_text(key, path, &real, rw)));
            } else if rw && t.ro_project() {
                out.push((
                    loc.clone(),
                    format!(
                        "{key} makes {} writable in a project your settings make read-only",
                        path.display()
                    ),
                ));
            }
        }
    }
}

/// `key raises the limit from W to P` when the project's value is higher than the user's and
/// in force.
fn raised(
    key: &str,
    (p, w, merged): (Option<u64>, Option<u64>, Option<u64>),
    show: &dyn Fn(u64) -> String,
) -> Option<String> {
    match (p, w) {
        (Some(p), Some(w)) if p > w && merged == Some(p) => Some(format!(
            "{key} raises the limit from {} to {}",
            show(w),
            show(p)
        )),
        _ => None,
    }
}

/// Limits higher than the user's layers give, or best-effort instead of strict.
fn limit_grants(t: &TrustInput, out: &mut Vec<(Loc, String)>) {
    let (p, with, w) = (t.project, t.with, t.without);
    let num = |n: u64| n.to_string();
    let ms = |n: u64| humantime::format_duration(std::time::Duration::from_millis(n)).to_string();
    let size = &crate::config::size_text;
    let conc = |l: &Layer| l.exec_max_concurrent.map(|n| n as u64);
    let cpus = match (p.cpus, w.cpus) {
        (Some(pc), Some(wc)) if pc > wc && with.cpus == Some(pc) => {
            Some(format!("limits.cpus raises the limit from {wc} to {pc}"))
        }
        _ => None,
    };
    let lims: [(&[&str], Option<String>); 6] = [
        (
            &["limits", "memory"],
            raised("limits.memory", (p.memory, w.memory, with.memory), size),
        ),
        (
            &["limits", "pids"],
            raised("limits.pids", (p.pids, w.pids, with.pids), &num),
        ),
        (
            &["executor", "timeout"],
            raised(
                "executor.timeout",
                (p.exec_timeout_ms, w.exec_timeout_ms, with.exec_timeout_ms),
                &ms,
            ),
        ),
        (
            &["executor", "max_output"],
            raised(
                "executor.max_output",
                (p.exec_max_output, w.exec_max_output, with.exec_max_output),
                size,
            ),
        ),
        (
            &["executor", "max_concurrent"],
            raised(
                "executor.max_concurrent",
                (conc(p), conc(w), conc(with)),
                &num,
            ),
        ),
        (&["limits", "cpus"], cpus),
    ];
    for (keys, text) in lims {
        if let Some(text) = text {
            out.push((t.at(keys), text));
        }
    }
    if p.enforce == Some(Enforce::BestEffort)
        && with.enforce == Some(Enforce::BestEffort)
        && w.enforce == Some(Enforce::Strict)
    {
        out.push((
            t.at(&["limits", "enforce"]),
            "limits.enforce = \"best-effort\" runs the jail even where a limit cannot be \
             enforced (your settings say \"strict\": refuse)"
                .into(),
        ));
    }
}

/// The executor: programs beyond the user's allowlist, and where its commands run.
fn executor_grants(t: &TrustInput, out: &mut Vec<(Loc, String)>) {
    let (p, with, without) = (t.project, t.with, t.without);
    if let (Some(pa), Some(w)) = (&p.exec_allow, &without.exec_allow)
        && in_force(&p.exec_allow, &with.exec_allow)
        && !w.is_empty()
    {
        let extra: Vec<&str> = pa
            .iter()
            .filter(|x| !w.contains(x))
            .map(String::as_str)
            .collect();
        let text = if pa.is_empty() {
            Some(format!(
                "executor.allow = [] lets the executor run any program (your settings allow only {})",
                w.join(", ")
            ))
        } else if !extra.is_empty() {
            Some(format!(
                "executor.allow adds {} to the programs the executor may run",
                extra.join(", ")
            ))
        } else {
            None
        };
        if let Some(text) = text {
            out.push((t.at(&["executor", "allow"]), text));
        }
    }
    if let Some((target, loc)) = &p.exec_target
        && with.exec_target.as_ref().map(|(w, _)| w) == Some(target)
        && without.exec_target.as_ref().map(|(w, _)| w) != Some(target)
    {
        match target {
            ExecutorTarget::Sandbox => {}
            ExecutorTarget::Compose(svc) => out.push((loc.clone(), compose_text(svc))),
            ExecutorTarget::Host => out.push((
                loc.clone(),
                "executor.target = \"host\" runs the agent's commands unsandboxed on your machine"
                    .into(),
            )),
        }
    }
}

pub(super) fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
