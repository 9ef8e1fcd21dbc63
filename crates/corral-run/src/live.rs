//! A running jail's network rules follow its policy files: `corral allow`/`deny`
//! and any edit of a policy file take effect in the project's running jails without restarting
//! them, and `corral watch` can allow a destination for one run.
//!
//! The native `corral run` checks its policy files (every layer it read, the project's
//! `corral.toml` even when absent, and the trust store) four times a second; when one changed
//! (or a `reload` arrives on the control socket) it resolves the policy again from the same
//! request, passes the same trust gate as at start, and swaps the proxy's rules (the DNS stub
//! decides with them too). What the proxy decides with changes; anything else the new files say
//! (binds, limits, the network mode, ...) is recorded as taking effect at the next run.
//!
//! A container run (`--engine podman|docker`, engine.rs) follows them with the same
//! watcher and trust gate; what applies the new rules is its [`Enforcer`]: the native backend
//! swaps the proxy's rules in memory, the container backend rewrites the project's generated
//! proxy policy file atomically and signals the proxy containers to reload it. The project's
//! proxy container is shared by the project's container runs, so it cannot hold an allow for
//! one run: a container run refuses run-only allows (the control request answers why).
//!
//! Invariants:
//! - an edit of the project's `corral.toml` that grants what the user has not trusted changes
//!   nothing (`live-policy-refused`), exactly as `corral run` would refuse it; an edit by the
//!   user's own `corral allow`/`deny` keeps the file trusted (cmd/trust.rs `carry_over`);
//! - a run-only allow (`corral watch`) comes only from the control socket, which the jail cannot
//!   reach (control.rs); deny rules still win over it;
//! - every change is one audit record: `live-policy` (what was added and removed, from which
//!   files), `live-policy-refused`, `live-policy-failed`, `live-allow`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_audit::{AuditLog, Event, JailEvent, LiveDetail, Record};
use corral_net::{Proxy, Rules};
use corral_policy::Plan;
use corral_policy::plan::NetworkPlan;
use corral_policy::resolve::{Request, resolve};

use crate::target::Target;
use crate::trust::Trusted;

/// How often the policy files are checked.
const POLL: Duration = Duration::from_millis(250);

/// What enforces a run's network rules: the native proxy in corral's memory, or a container
/// backend's proxy containers reading a policy file.
pub trait Enforcer: Send {
    /// The rules enforced when the run started.
    fn initial(&self) -> Rules;
    /// Enforce `rules` (the plan's `network`, whose lists `rules` hold with the run-only allows
    /// added, for a backend that writes the section out); an error names the step that failed.
    fn apply(&self, rules: &Rules, network: &NetworkPlan) -> Result<(), String>;
    /// Why this run cannot take run-only allows, when it cannot.
    fn run_only_refused(&self) -> Option<String> {
        None
    }
    /// The proxy in corral's memory, for what only it can do (`network.on_deny = "ask"`).
    fn proxy(&self) -> Option<&Arc<Proxy>> {
        None
    }
}

impl Enforcer for Arc<Proxy> {
    fn initial(&self) -> Rules {
        self.rules().as_ref().clone()
    }

    fn apply(&self, rules: &Rules, _network: &NetworkPlan) -> Result<(), String> {
        self.set_rules(rules.clone());
        Ok(())
    }

    fn proxy(&self) -> Option<&Arc<Proxy>> {
        Some(self)
    }
}

/// The live policy of one run; stopped when dropped.
pub struct Live {
    /// Dropped to stop the watcher at once (it waits on it between checks).
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _control: Option<crate::control::Server>,
}

impl Drop for Live {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The state the watcher and the control socket share.
struct LiveState {
    req: Request,
    /// The plan the run started from, as resolved (before run-time additions).
    started: Plan,
    /// The rules of the policy files as last accepted.
    base: Rules,
    /// What `corral watch` allowed for this run.
    run_only: Vec<Target>,
    files: Vec<PathBuf>,
    seen: Vec<Option<Stamp>>,
    /// New stamps seen once: applied when the next check sees them again (a file being written
    /// is not read half-way: an in-place rewrite is an empty file for a moment).
    pending: Option<Vec<Option<Stamp>>>,
    /// The sections the last record said take effect at the next run.
    next_run: Vec<String>,
    /// The `network` section of the plan last accepted (the run's plan at start).
    network: NetworkPlan,
    enforcer: Box<dyn Enforcer>,
    audit: AuditLog,
    jail: String,
    /// Whether questions can be answered (the control socket serves): `network.on_deny`
    /// follows the policy files then.
    asking: std::sync::atomic::AtomicBool,
}

/// Start following the policy files of a run whose network rules `enforcer` enforces, and
/// serve its control socket. `plan` is the plan as resolved from `req`, `jail_plan` the one
/// the jail runs; `engine` names a container engine's run in its registration.
pub fn start(
    req: &Request,
    plan: &Trusted<Plan>,
    jail_plan: &Plan,
    enforcer: Box<dyn Enforcer>,
    audit: &AuditLog,
    jail: &str,
    engine: Option<&str>,
) -> anyhow::Result<Live> {
    let files = watched_files(req, plan);
    let seen = files.iter().map(|f| stamp(f)).collect();
    let state = Arc::new(Mutex::new(LiveState {
        req: req.clone(),
        started: Plan::clone(plan),
        base: enforcer.initial(),
        run_only: Vec::new(),
        files,
        seen,
        pending: None,
        next_run: Vec::new(),
        network: jail_plan.network.clone(),
        enforcer,
        audit: audit.clone(),
        jail: jail.to_string(),
        asking: std::sync::atomic::AtomicBool::new(false),
    }));
    let control = control_server(&state, plan, jail_plan, jail, engine);
    ask_through(&state, control.is_some(), plan);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let st = state.clone();
    let thread = std::thread::Builder::new()
        .name("corral-live".into())
        .spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(POLL) {
                let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
                if st.changed() {
                    st.reload();
                }
            }
        })
        .map_err(|e| anyhow::anyhow!("cannot start the policy watcher thread: {e}"))?;
    Ok(Live {
        stop: Some(stop),
        thread: Some(thread),
        _control: control,
    })
}

/// The control socket, unless it would be visible in the jail or cannot be made (said once on
/// stderr: the run goes on without `corral watch`'s run-only allows).
fn control_server(
    state: &Arc<Mutex<LiveState>>,
    plan: &Plan,
    jail_plan: &Plan,
    jail: &str,
    engine: Option<&str>,
) -> Option<crate::control::Server> {
    let dir = match crate::control::dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("corral: no control socket for corral watch: {e:#}");
            return None;
        }
    };
    if crate::control::visible_in(jail_plan, &dir) {
        eprintln!(
            "corral: no control socket for corral watch: {} is visible in the jail (a bind \
             covers it); set XDG_RUNTIME_DIR or TMPDIR to a directory the jail does not see",
            dir.display()
        );
        return None;
    }
    let st = state.clone();
    let handler: crate::control::Handler = Arc::new(move |line: &str| {
        let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
        st.request(line)
    });
    match crate::control::Server::start(&dir, jail, &plan.project.root, engine, handler) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("corral: no control socket for corral watch: {e:#}");
            None
        }
    }
}

/// `network.on_deny = "ask"` needs the control socket (it is how `corral watch` answers):
/// without one, denials are refused at once, said once on stderr.
fn ask_through(state: &Arc<Mutex<LiveState>>, control: bool, plan: &Plan) {
    let st = state.lock().unwrap_or_else(|e| e.into_inner());
    match (plan.network.on_deny, control) {
        (corral_policy::plan::OnDeny::Ask { .. }, false) => eprintln!(
            "corral: network.on_deny = \"ask\" needs the control socket: denials are refused at once"
        ),
        (on, true) => match st.enforcer.proxy() {
            Some(proxy) => proxy.set_on_deny(on),
            None if !on.is_refuse() => eprintln!(
                "corral: network.on_deny = \"ask\" is for native runs: this run's denials are refused at once"
            ),
            None => {}
        },
        _ => {}
    }
    st.asking
        .store(control, std::sync::atomic::Ordering::Relaxed);
}

/// The files whose change can change the plan: every layer read, the project's `corral.toml`
/// (even when absent: creating it is a change), the user config and the trust store.
fn watched_files(req: &Request, plan: &Plan) -> Vec<PathBuf> {
    let mut files = plan.sources.clone();
    if req.flags.policy.is_none() && !plan.project.scratch {
        files.push(plan.project.root.join("corral.toml"));
    }
    files.extend(req.user_config.clone());
    files.push(corral_policy::trust::store_path(&req.env, &req.home));
    files.sort();
    files.dedup();
    files
}

/// What tells a file's versions apart: an atomic replace changes the inode, an edit in place
/// the modification time or size.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

impl LiveState {
    fn stamps(&self) -> Vec<Option<Stamp>> {
        self.files.iter().map(|f| stamp(f)).collect()
    }

    /// Whether a watched file changed since last seen and has stayed so since the previous
    /// check (the new stamps are kept then).
    fn changed(&mut self) -> bool {
        let now = self.stamps();
        if now == self.seen {
            self.pending = None;
            return false;
        }
        if self.pending.as_ref() == Some(&now) {
            self.seen = now;
            self.pending = None;
            return true;
        }
        self.pending = Some(now);
        false
    }

    /// One control request.
    fn request(&mut self, line: &str) -> Result<String, String> {
        match line.split_once(' ') {
            Some(("allow", host)) => self.allow_for_run(host.trim()),
            Some(("refuse", host)) => self.refuse_question(host.trim()),
            None if line == "asks" => {
                let asks = self.enforcer.proxy().map(|p| p.asks().list());
                serde_json::to_string(&asks.unwrap_or_default())
                    .map_err(|e| format!("cannot list the questions: {e}"))
            }
            None if line == "reload" => {
                self.seen = self.stamps();
                Ok(self.reload())
            }
            _ => Err(format!(
                "unknown request {:?}: expected `allow HOST[:PORT]`, `refuse HOST[:PORT]`, \
                 `asks` or `reload`",
                corral_audit::printable(line)
            )),
        }
    }

    fn allow_for_run(&mut self, host: &str) -> Result<String, String> {
        let target = Target::parse(host).map_err(|e| format!("{e:#}"))?;
        if let Some(why) = self.enforcer.run_only_refused() {
            return Err(why);
        }
        if !self.run_only.contains(&target) {
            self.run_only.push(target.clone());
        }
        if let Err(e) = self.swap() {
            self.run_only.retain(|t| *t != target);
            return Err(self.failed(&format!("cannot apply the allow: {e}")));
        }
        let summary = format!("{host} allowed for this run (corral watch)");
        self.record(
            |detail| JailEvent::LiveAllow { detail },
            serde_json::json!({ "summary": summary, "allow": host }),
        );
        Ok(summary)
    }

    /// Refuse the pending questions about `host` (`network.on_deny = "ask"`).
    fn refuse_question(&mut self, host: &str) -> Result<String, String> {
        let Some(proxy) = self.enforcer.proxy() else {
            return Err("this run's proxy does not ask (container runs refuse at once)".into());
        };
        match proxy.asks().refuse(host) {
            0 => Err(format!(
                "no question about {} is pending",
                corral_audit::printable(host)
            )),
            _ => Ok(format!("{host} refused for this run (corral watch)")),
        }
    }

    /// Enforce the files' rules plus the run-only allows; the questions they now answer are
    /// woken (their connections decide again with these rules).
    fn swap(&self) -> Result<(), String> {
        let mut rules = self.base.clone();
        for t in &self.run_only {
            if let Some(p) = &t.pattern
                && !rules.allow.contains(p)
            {
                rules.allow.push(p.clone());
            }
            if let Some(c) = t.cidr
                && !rules.allow_cidrs.contains(&c)
            {
                rules.allow_cidrs.push(c);
            }
            if let Some(r) = &t.rule
                && !rules.allow_paths.contains(r)
            {
                rules.allow_paths.push(r.clone());
            }
        }
        self.enforcer.apply(&rules, &self.network)?;
        if let Some(proxy) = self.enforcer.proxy() {
            proxy.asks().settle(&proxy.rules());
        }
        Ok(())
    }

    /// Resolve the policy again and apply its network rules when the trust gate passes; the
    /// one-line summary of what happened.
    fn reload(&mut self) -> String {
        let plan = resolve(&self.req);
        if let Ok(plan) = &plan
            && plan.project.scratch
            && plan.project.root != self.started.project.root
        {
            // resolve made a scratch directory of its own: only the run's one is used.
            let _ = std::fs::remove_dir_all(&plan.project.root);
        }
        if self.stamps() != self.seen {
            // Written while it was read: the next checks read it again once it is still.
            self.seen.clear();
            return "the policy files changed while they were read: read again".into();
        }
        let plan = match plan {
            Ok(p) => p,
            Err(e) => return self.failed(&format!("{e}")),
        };
        // The reload passes the gate as the run did, without asking: only a trusted plan is
        // applied.
        let plan = match crate::trust::trusted_without_asking(plan) {
            Ok(Ok(trusted)) => trusted,
            Ok(Err(plan)) => {
                let t = plan.project_trust.as_ref();
                let file = t.map(|t| t.file.display().to_string()).unwrap_or_default();
                let summary = format!(
                    "{file} changed and grants what you have not trusted: the running jail keeps \
                     its rules; review it and run `corral trust` to apply it"
                );
                let grants = t.map(|t| t.grants.clone()).unwrap_or_default();
                self.record(
                    |detail| JailEvent::LivePolicyRefused { detail },
                    serde_json::json!({ "summary": summary, "file": file, "grants": grants }),
                );
                return summary;
            }
            Err(e) => return self.failed(&format!("{e:#}")),
        };
        self.apply(&plan)
    }

    /// Enforce the network rules of `plan`, the policy resolved again and passed through the
    /// gate, and record what changed; the one-line summary.
    fn apply(&mut self, plan: &Trusted<Plan>) -> String {
        let rules = match Rules::from_plan(&plan.network) {
            Ok(r) => r,
            Err(e) => return self.failed(&e.to_string()),
        };
        if self.asking.load(std::sync::atomic::Ordering::Relaxed)
            && let Some(proxy) = self.enforcer.proxy()
        {
            proxy.set_on_deny(plan.network.on_deny);
        }
        let diff = Diff::between(&self.base, &rules);
        let next_run = next_run_sections(&self.started, plan);
        let (old_base, old_network) = (self.base.clone(), self.network.clone());
        self.base = rules;
        self.network.allow = plan.network.allow.clone();
        self.network.deny = plan.network.deny.clone();
        self.network.allow_cidrs = plan.network.allow_cidrs.clone();
        self.network.allow_paths = plan.network.allow_paths.clone();
        self.network.upstream_proxy = plan.network.upstream_proxy.clone();
        if let Err(e) = self.swap() {
            // Not enforced: the next edit is compared with what still is.
            (self.base, self.network) = (old_base, old_network);
            return self.failed(&format!("cannot apply the new rules: {e}"));
        }
        let summary = diff.summary(&next_run);
        if diff.lists.is_empty() && next_run == self.next_run {
            // A file was touched, or another project's trust changed: nothing to record.
            return summary;
        }
        self.next_run = next_run.clone();
        let mut detail = diff.json();
        detail["summary"] = summary.clone().into();
        detail["files"] = serde_json::json!(self.files);
        detail["next_run"] = serde_json::json!(next_run);
        self.record(|detail| JailEvent::LivePolicy { detail }, detail);
        summary
    }

    fn failed(&self, why: &str) -> String {
        let summary = format!("the policy change is not applied, the jail keeps its rules: {why}");
        self.record(
            |detail| JailEvent::LivePolicyFailed { detail },
            serde_json::json!({ "summary": summary }),
        );
        summary
    }

    fn record(&self, make: fn(LiveDetail) -> JailEvent, detail: serde_json::Value) {
        let serde_json::Value::Object(mut fields) = detail else {
            unreachable!("live policy details are JSON objects");
        };
        let summary = match fields.remove("summary") {
            Some(serde_json::Value::String(s)) => s,
            _ => String::new(),
        };
        let r = Record::now(
            &self.jail,
            Event::Jail(make(LiveDetail { summary, fields })),
        );
        // The jail's terminal belongs to its command: a failed write shows in the end-of-run
        // summary (AuditLog::failures).
        let _ = self.audit.write(&r);
    }
}

/// What a reload added to and removed from each list of the proxy's rules.
#[derive(Debug, Default, PartialEq, Eq)]
struct Diff {
    lists: BTreeMap<&'static str, (Vec<String>, Vec<String>)>,
}

impl Diff {
    fn between(old: &Rules, new: &Rules) -> Diff {
        fn strings<T: ToString>(v: &[T]) -> Vec<String> {
            v.iter().map(ToString::to_string).collect()
        }
        let mut lists = BTreeMap::new();
        let pairs = [
            // Path rules are `network.allow` entries too.
            (
                "network.allow",
                [strings(&old.allow), strings(&old.allow_paths)].concat(),
                [strings(&new.allow), strings(&new.allow_paths)].concat(),
            ),
            ("network.deny", strings(&old.deny), strings(&new.deny)),
            (
                "network.allow_cidrs",
                strings(&old.allow_cidrs),
                strings(&new.allow_cidrs),
            ),
            (
                "network.upstream_proxy",
                old.upstream.iter().map(|u| format!("{u:?}")).collect(),
                new.upstream.iter().map(|u| format!("{u:?}")).collect(),
            ),
        ];
        for (name, old, new) in pairs {
            let added: Vec<String> = new.iter().filter(|x| !old.contains(x)).cloned().collect();
            let removed: Vec<String> = old.iter().filter(|x| !new.contains(x)).cloned().collect();
            if !added.is_empty() || !removed.is_empty() {
                lists.insert(name, (added, removed));
            }
        }
        Diff { lists }
    }

    fn summary(&self, next_run: &[String]) -> String {
        let mut parts: Vec<String> = Vec::new();
        for (name, (added, removed)) in &self.lists {
            for a in added {
                parts.push(format!("{name} +{a}"));
            }
            for r in removed {
                parts.push(format!("{name} -{r}"));
            }
        }
        if parts.is_empty() {
            parts.push("network rules unchanged".into());
        }
        if !next_run.is_empty() {
            parts.push(format!(
                "changes to {} take effect at the next run",
                next_run.join(", ")
            ));
        }
        parts.join("; ")
    }

    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::Map::new();
        for (name, (added, removed)) in &self.lists {
            v.insert(
                (*name).to_string(),
                serde_json::json!({ "added": added, "removed": removed }),
            );
        }
        serde_json::Value::Object(v)
    }
}

/// The parts of the plan other than the proxy's rules that differ: they apply at the next run.
fn next_run_sections(old: &Plan, new: &Plan) -> Vec<String> {
    let strip = |p: &Plan| {
        let mut v = serde_json::to_value(p).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            for k in ["sources", "project_grants", "project_trust"] {
                o.remove(k);
            }
            if let Some(n) = o.get_mut("network").and_then(|n| n.as_object_mut()) {
                for k in ["allow", "deny", "allow_cidrs", "upstream_proxy", "on_deny"] {
                    n.remove(k);
                }
            }
        }
        v
    };
    let (a, b) = (strip(old), strip(new));
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return Vec::new();
    };
    let mut keys: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_policy::domain::DomainPattern;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        Rules {
            allow: allow
                .iter()
                .map(|a| DomainPattern::parse(a).unwrap())
                .collect(),
            deny: deny
                .iter()
                .map(|a| DomainPattern::parse(a).unwrap())
                .collect(),
            ..Rules::default()
        }
    }

    #[test]
    fn a_diff_names_what_was_added_and_removed() {
        let d = Diff::between(
            &rules(&["a.com", "b.com"], &[]),
            &rules(&["b.com", "c.com:8443"], &["a.com"]),
        );
        assert_eq!(
            d.summary(&["limits".into()]),
            "network.allow +c.com:8443; network.allow -a.com; network.deny +a.com; \
             changes to limits take effect at the next run"
        );
        assert_eq!(
            d.json(),
            serde_json::json!({
                "network.allow": {"added": ["c.com:8443"], "removed": ["a.com"]},
                "network.deny": {"added": ["a.com"], "removed": []},
            })
        );
        assert_eq!(
            Diff::between(&rules(&["a.com"], &[]), &rules(&["a.com"], &[])).summary(&[]),
            "network rules unchanged"
        );
    }
}
