//! The native backend of `corral run`: a trusted Plan run in the native jail, its network
//! served, the audit records written; the command's exit code.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

use anyhow::Context;
use corral_audit::{AuditLog, JailEvent};
use corral_policy::plan::{Engine, NetworkMode, Plan};
use corral_policy::resolve::ensure_state_paths;
use corral_sandbox::PreparedJail;
use corral_session::endlines::say;
use corral_session::{Backend, Baselined, Checked, Ended, RunInputs, RunPlan, Scope, Session};

use crate::trust::Trusted;

/// Resolve `req` and pass the trust gate, then run the plan (with the set-up process `early`
/// when main() forked one); the command's exit code. `discard_pending`: a review run drops a
/// pending review of the project first (without it, one refuses).
pub fn run_jail(
    req: &corral_policy::Request,
    discard_pending: bool,
    early: Option<PreparedJail>,
) -> anyhow::Result<i32> {
    // What the project's own corral.toml grants needs the user's trust (corral-run's gate).
    let plan = crate::trust::resolve_trusted(req)?;
    // A first run of a harness: its state directories do not exist yet, and binds need them.
    ensure_state_paths(&plan.profile, &req.home)?;
    // Review mode (docs/review.md): native only; its directories made and held for the run.
    crate::review::native_only(&plan)?;
    if discard_pending && plan.project.review.is_none() {
        anyhow::bail!(
            "--discard-pending drops a pending review before a review run; this run is none \
             (add --review, or filesystem.review = true)"
        );
    }
    // corral's layer over the harness's state, held for the run.
    let (held, state_plan) = hold_state(&plan)?;
    let state_secrets = held.as_ref().map(|h| h.secrets.as_slice()).unwrap_or(&[]);
    let review = corral_session::review::begin(&plan, discard_pending)?;
    let code = run_plan_with(
        state_plan.as_ref().unwrap_or(&plan),
        Some(req),
        Scope::Run,
        early,
        state_secrets,
    );
    if let Some(review) = review {
        for line in review.finish() {
            say(&line);
        }
    }
    if plan.project.scratch
        && let Err(e) = std::fs::remove_dir_all(&plan.project.root)
    {
        say(&format!(
            "corral: cannot remove the scratch directory {}: {e}",
            plan.project.root.display()
        ));
    }
    code
}

/// corral's layer over the harness's state made ready and locked for a run of `plan`
/// (corral-session `hstate`): the handle to keep until the run ends, and the Plan to run instead
/// when this run gets a layer of its own (another run of the profile holds the shared one).
pub fn hold_state(
    plan: &Trusted<Plan>,
) -> anyhow::Result<(Option<corral_session::hstate::Held>, Option<Trusted<Plan>>)> {
    let held = corral_session::hstate::prepare(plan, &corral_audit::new_jail_id())?;
    let Some(mut held) = held else {
        return Ok((None, None));
    };
    for note in &held.notes {
        say(&format!("corral: {note}"));
    }
    // The same trusted Plan with corral's own state mounts in place of the harness's: nothing
    // the project's policy file grants changes.
    let run_plan = held.plan.take().map(|p| plan.clone().map(|_| p));
    Ok((Some(held), run_plan))
}

/// Run `plan` in the native jail (or the container engine it names) in a session of `scope`,
/// with the set-up process `early` when main() forked one; the command's exit code.
pub fn run_plan(
    plan: &Trusted<Plan>,
    scope: Scope,
    early: Option<PreparedJail>,
) -> anyhow::Result<i32> {
    run_plan_with(plan, None, scope, early, &[])
}

/// [`run_plan`] with the credentials of the harness's state files ([`hold_state`]) for the
/// gateway.
pub fn run_plan_in_state(
    plan: &Trusted<Plan>,
    scope: Scope,
    early: Option<PreparedJail>,
    held: Option<&corral_session::hstate::Held>,
) -> anyhow::Result<i32> {
    let state = held.map(|h| h.secrets.as_slice()).unwrap_or(&[]);
    run_plan_with(plan, None, scope, early, state)
}

/// [`run_plan`] of a Plan resolved from `req` when given: the native jail's network rules then
/// follow the policy files while it runs (live.rs).
fn run_plan_with(
    plan: &Trusted<Plan>,
    req: Option<&corral_policy::Request>,
    scope: Scope,
    early: Option<PreparedJail>,
    state_secrets: &[corral_session::hstate::StateSecret],
) -> anyhow::Result<i32> {
    // A run in this project whose corral was killed: its checks first (journal.rs). Not from
    // an executor command's session, which runs while its run's jail does.
    if scope == Scope::Run {
        corral_session::journal::finish_unended(corral_session::journal::Which::Project(
            &plan.project.root,
        ));
    }
    // `early`, the set-up process main() forked for this run if it did, is dropped (so ended)
    // when the run goes to a container engine.
    match plan.engine {
        // auto: native where it runs here, else podman, else docker (engine.rs).
        Engine::Auto if !corral_sandbox::probe::run().native_backend => {
            return crate::engine::run_plan(plan, req, scope);
        }
        Engine::Native | Engine::Auto => {}
        // The container engines: engine.rs.
        Engine::Podman | Engine::Docker => {
            return crate::engine::run_plan(plan, req, scope);
        }
        Engine::Kube => anyhow::bail!(
            "--engine kube runs from `corral run` only (not `corral shell`, `--worktree` or the \
             executor's commands): use `corral run --engine kube [PROFILE] [-- CMD]`"
        ),
    }
    // Processes the run started whose parent died (an executor command jail whose server was
    // killed) come back to corral, which ends them all before the git check (`end_run`).
    let _ = nix::sys::prctl::set_child_subreaper(true);
    // --publish: the host's 127.0.0.1:PORT, bound before the jail starts so a taken port fails
    // the run at once.
    let published = publish_listeners(plan)?;
    // The jail's set-up process: the one main() forked, else corral re-executed now (it loads
    // while corral prepares the rest). It waits for the final plan; a dropped PreparedJail is
    // killed.
    let mut opts = corral_sandbox::SpawnOptions::new()?;
    // main() raised corral's open-file limit for the proxy: the command gets the caller's.
    opts.nofile_soft = corral_net::bounds::original_nofile_soft();
    let mut prepared = match early {
        Some(prepared) => prepared,
        None => corral_sandbox::prepare(&opts.init_exe)?,
    };
    // The jail's cgroup (as root, or with delegation: a few directories and limit files) is
    // made on a thread of its own meanwhile; it needs only the id and the limits. It starts
    // first: a new thread can wait a while for a CPU (about 0.2 ms on a small VM).
    let jail_id = corral_audit::new_jail_id();
    // The change record (record.rs): kept by the jail's name gate, finished in `Native::run`.
    // A review run writes nothing of the host's (accept keeps its own record). An executor
    // command's jail records into its run's record, when the run keeps one.
    // It is begun on a thread too (its directory and files: a few hundred microseconds each
    // on a VM's disk); the summary's source counts on it when the run wants one, and falls
    // back to a listing below if it could not be begun after all.
    let recorded = scope == Scope::Run && plan.project.review.is_none();
    if scope == Scope::ExecutorCommand {
        opts.record = crate::record::join_run()?;
    }
    // Where the change summary comes from: the record, when it sees every change the run's
    // processes can make; else a listing of the project from the start.
    let source = summary_source(plan, recorded && crate::record::wanted(plan));
    let (limits, mut record, (beginning, mut run, secrets, stub_files)) =
        std::thread::scope(|s| {
            let limits = s.spawn(|| corral_sandbox::cgroup::setup(&jail_id, &plan.limits));
            let record = recorded.then(|| s.spawn(|| crate::record::begin(plan)));
            let rest = (|| {
                // The session's snapshots (change baseline, git) are taken on threads while the
                // rest is set up, and complete before the jail starts.
                let beginning = Session::begin_with(plan, scope, jail_id.clone(), source)?;
                // The Plan the jail gets: `plan` with what the run attaches (runplan.rs), computed
                // in one place; what follows creates those attachments on the host, where the
                // RunPlan names them.
                let (values, signins) = crate::secrets::read(plan)?;
                let mut inputs = RunInputs::on_host(beginning.jail_id());
                inputs.placeholders = crate::secrets::placeholders(&values)?;
                inputs.signins = signins.iter().map(|s| s.plan().name.clone()).collect();
                inputs.state_secrets = state_secrets.iter().any(|s| s.for_gateway().is_some());
                let run = RunPlan::new(plan, &inputs);
                let secrets = crate::secrets::prepare(
                    values,
                    signins,
                    state_secrets,
                    &run,
                    beginning.jail_id(),
                    beginning.audit(),
                )?;
                let stub_files = stub_files(&run)?;
                Ok::<_, anyhow::Error>((beginning, run, secrets, stub_files))
            })();
            let limits = limits.join().expect("the cgroup set-up thread panicked");
            let record = record.and_then(|r| r.join().expect("the change record thread panicked"));
            // Either failing fails the run; a cgroup that was made is removed (its drop) when the
            // rest failed, a record that was begun (its drop) too.
            let rest = rest?;
            Ok::<_, anyhow::Error>((limits?, record, rest))
        })?;
    for note in &limits.notes {
        eprintln!("corral: {note}");
    }
    if let Some(cg) = &limits.cgroup {
        // cgroup v1: the set-up process moves itself by writing 0 to `tasks`, which moves the
        // calling thread alone. It is a fork of corral's main thread taken before any thread
        // started (or a fresh exec of corral) and starts no thread, so that is the whole
        // process, and the kernel skips the global write lock a `cgroup.procs` write takes (an
        // RCU grace period: 8-20 ms here). Its children are born inside.
        let file = match cg.version() {
            corral_sandbox::cgroup::Version::V1 => "tasks",
            corral_sandbox::cgroup::Version::V2 => "cgroup.procs",
        };
        opts.cgroup_procs = cg.paths().iter().map(|p| p.join(file)).collect();
    }
    opts.rlimits = limits.fallback.clone();
    // The ids, the network rules and the cgroup are final: the set-up process builds the
    // namespaces while corral waits for the session's snapshots.
    prepared.enter_namespaces(&run.plan, &opts.cgroup_procs)?;
    // The jail's mounts wait for the git snapshot (what it protects); the command's exec waits
    // for the change baseline too (held by `Native::start`, released by `Native::run`).
    let session = beginning.ready_for_mounts()?;
    // What the run makes on the host (executor socket, resolver files, gateway CA): its
    // journal entry names them, for the next corral command if this one is killed.
    session.made_on_host(run.attachments.host_dirs());
    // The git files the snapshot found are read-only in the jail and the executor's jail.
    run.protect(&session.protected());
    // Where the jail may create a `HEAD` while it runs (the name gate).
    if let Some(git_dirs) = session.git_dirs(&run.plan) {
        run.git_dirs(&git_dirs);
    }
    // The record was begun with the resolved Plan: the jail's (with what the run attached)
    // may not reach it either; if it does, the summary lists the project from now on (the
    // command has not started).
    match record.take() {
        Some(r) => match r.check_unreachable(&run.plan) {
            Ok(r) => record = Some(r),
            Err(why) => session.fall_back(&run.plan, why),
        },
        // Counted on, but it could not be begun (said on stderr).
        None if session.summary_from_record() => {
            session.fall_back(&run.plan, "the run keeps no change record".to_string())
        }
        None => {}
    }
    if let Some(r) = &record {
        opts.record = Some(r.dir_fd()?);
    }
    // The executor is attached last: its jail's Plan is final now. Its command jails record
    // into the run's record (a jail executor only: a host or compose one makes the summary
    // list the project instead).
    let record_dir = record
        .as_ref()
        .filter(|_| run.plan.executor.target == corral_policy::plan::ExecutorTarget::Sandbox)
        .map(|r| r.dir_path());
    let executor = crate::executor::attach_executor(&run, session.audit(), record_dir)?;
    let mut native = Native {
        req,
        resolved: plan,
        prepared: Some(prepared),
        opts,
        ending: None,
        limits,
        secrets,
        executor,
        _stub_files: stub_files,
        published,
        proxy: None,
        netcap: None,
        terminal: None,
        record,
    };
    session.run(&run.plan, &mut native)
}

/// The native backend: the jail's set-up process and what the run serves it (cgroup, secrets'
/// gateway, executor, network, published ports). Dropped after the session finished.
struct Native<'a> {
    /// The request `resolved` came from, when the run has one: the proxy's rules then follow
    /// the policy files while the jail runs (live.rs).
    req: Option<&'a corral_policy::Request>,
    resolved: &'a Trusted<Plan>,
    prepared: Option<corral_sandbox::PreparedJail>,
    opts: corral_sandbox::SpawnOptions,
    /// The jail's set-up process once the jail is empty, exiting: reaped when this is dropped
    /// (see its `Drop`), before `limits` (its cgroup can go only once it has left it).
    ending: Option<corral_sandbox::Ending>,
    limits: corral_sandbox::cgroup::LimitsSetup,
    secrets: crate::secrets::Secrets,
    executor: Option<crate::executor::RunExecutor>,
    _stub_files: Option<StubFiles>,
    published: Vec<(u16, std::net::TcpListener)>,
    proxy: Option<corral_net::ProxyHandle>,
    netcap: Option<corral_net::netcap::NetcapHandle>,
    terminal: Option<corral_sandbox::termfilter::Dropped>,
    /// The run's change record, finished once nothing the run started can write.
    record: Option<crate::record::Recording>,
}

impl Drop for Native<'_> {
    /// The jail's set-up process is exiting (the jail is empty). With a cgroup it is reaped
    /// now, before the cgroup goes (its directory can be removed only once the process left
    /// it); without one, on a thread of its own, so corral's exit does not wait for the kernel
    /// to take down the jail's namespaces (if corral exits first, the process is re-parented
    /// and reaped by the system, as bwrap's is).
    fn drop(&mut self) {
        if self.limits.cgroup.is_none()
            && let Some(ending) = self.ending.take()
        {
            std::thread::spawn(move || drop(ending));
        }
    }
}

/// The native jail between [`Backend::start`] and [`Backend::run`]: built, its listeners
/// served, its command's exec held. Dropped on an error (the fields in this order, the jail
/// last): the jail is then killed.
struct StartedJail {
    placeholders: corral_sandbox::PlaceholderHold,
    held: Option<crate::held::HeldNotice>,
    live: Option<crate::live::Live>,
    jail: corral_sandbox::RunningJail,
}

impl Backend for Native<'_> {
    type Started = StartedJail;

    fn start(&mut self, plan: &Plan, session: &Session) -> anyhow::Result<StartedJail> {
        let prepared = self
            .prepared
            .take()
            .context("the native jail was already started")?;
        // The session may still be taking the change baseline: the command's exec waits for
        // `Backend::run`, which gets the `Baselined`.
        self.opts.hold_exec = true;
        let mut jail = prepared
            .start(plan, &self.opts)
            .context("cannot start the jail")?;
        // The placeholders it made may be in the baseline, taken meanwhile: not changes.
        session.made_by_corral(jail.placeholders_made());
        let (audit, jail_id) = (session.audit(), session.jail_id());
        let mut net = jail.take_net();
        let stub_sockets = (net.dns.take(), std::mem::take(&mut net.capture));
        self.proxy = serve_network(plan, net, audit, jail_id, self.secrets.gateway())?;
        self.netcap = serve_netcap(
            std::mem::take(&mut self.published),
            stub_sockets,
            self.proxy.as_ref(),
            &mut jail,
            audit,
            jail_id,
        )?;
        let live = live_policy(
            self.req,
            self.resolved,
            plan,
            self.proxy.as_ref(),
            audit,
            jail_id,
        );
        // A request held for `corral watch` (on_deny = "ask") is said where the user looks:
        // the title of the jail's terminal, else stderr, and the desktop (held.rs).
        let held = self.proxy.as_ref().map(|p| {
            crate::held::HeldNotice::start(p.proxy().asks().clone(), jail.terminal_status())
        });
        let placeholders = jail.keep_placeholders();
        Ok(StartedJail {
            placeholders,
            held,
            live,
            jail,
        })
    }

    fn run(
        &mut self,
        _plan: &Plan,
        mut started: StartedJail,
        baselined: Baselined,
        session: &Session,
    ) -> anyhow::Result<Ended> {
        // The command's first write must come after the change baseline (changes.rs): its exec
        // was held while the root was built; it goes now that the baseline is complete.
        started
            .jail
            .release_exec()
            .context("cannot let the jail's command start")?;
        // Back once the jail is empty; its set-up process exits meanwhile (reaped before the
        // cgroup goes: `Native::ending`).
        let (exit, ending) = started.jail.wait_ending();
        drop(started.held);
        drop(started.live);
        end_run(self.executor.take(), ending.pid());
        if let Some(record) = self.record.take() {
            let changed = record.finish();
            session.recorded(changed.map(|c| c.into_iter().map(recorded).collect()));
        }
        self.ending = Some(ending);
        // No jail of the run binds them any more: the placeholders this run made go.
        drop(started.placeholders);
        self.terminal = Some(exit.terminal);
        Ok(baselined.ended(exit.code))
    }

    fn report(&mut self, session: &Checked) {
        if let Some(cg) = &self.limits.cgroup {
            let events = cg.events();
            let detail = serde_json::to_value(events).unwrap_or_default();
            if events.oom_kills > 0 || events.memory_limit_hits > 0 {
                session.record(JailEvent::Oom {
                    detail: detail.clone(),
                });
            }
            if events.pids_limit_hits > 0 {
                session.record(JailEvent::Pids { detail });
            }
            for line in events.summary() {
                say(&format!("corral: {line}"));
            }
        }
        // Every open tunnel ended and its close record written, and every refusal recorded,
        // before the summary and the exit record.
        if let Some(proxy) = self.proxy.as_mut() {
            proxy.shutdown();
        }
        if let Some(netcap) = self.netcap.as_mut() {
            netcap.shutdown();
        }
        network_summary(self.proxy.as_ref(), session.audit());
        if let Some(terminal) = self.terminal.take() {
            report_terminal(terminal, session);
        }
    }

    fn refused(&self) -> std::collections::BTreeMap<String, u64> {
        let proxy = self.proxy.as_ref().map(|p| p.proxy().refusals().totals());
        let netcap = self.netcap.as_ref().map(|n| n.refusals().totals());
        let mut all = std::collections::BTreeMap::new();
        for (reason, n) in proxy.into_iter().chain(netcap).flatten() {
            *all.entry(reason).or_insert(0) += n;
        }
        all
    }
}

/// Where the change summary of a run of `plan` comes from: its change record (`recorded`: the
/// run keeps one) when that sees every change the run's processes could make in the project;
/// else a listing from the start, with the reason (the audit's `note`).
fn summary_source(plan: &Plan, recorded: bool) -> corral_session::changes::Source {
    use corral_policy::plan::ExecutorTarget;
    use corral_session::changes::Source;
    let why = if !recorded {
        Some("the run keeps no change record".to_string())
    } else if plan.executor.target == ExecutorTarget::Host {
        Some("the executor runs on the host, outside any name gate".to_string())
    } else if matches!(plan.executor.target, ExecutorTarget::Compose(_)) {
        Some("the executor runs in a compose service, outside any name gate".to_string())
    } else if plan
        .executor
        .jail
        .as_ref()
        .is_some_and(|j| j.git.new_repositories)
    {
        Some("the executor's jail has no name gate (allow_new_repositories)".to_string())
    } else if !gate_kernel() {
        Some("this kernel has no name gate (Linux 5.19)".to_string())
    } else if let Some(m) = project_bound_elsewhere(plan) {
        // The record names what the jail changes by its path in the project: a write
        // through another path of the same files (or into another directory mounted in the
        // project) is not one it can name.
        Some(format!(
            "{} is bound read-write at {}, another path than its own, and the project is one \
             of them",
            m.source.display(),
            m.target.display()
        ))
    } else {
        corral_session::changes::inherited_writer(&plan.project.root)
    };
    match why {
        None => Source::Record,
        why => Source::Walk { why },
    }
}

/// A read-write bind of `plan` whose source or target lies in the project (or holds it) and
/// whose target is not its source's own path: the project's files reachable by another path,
/// or another directory's files by a path in the project.
fn project_bound_elsewhere(plan: &Plan) -> Option<&corral_policy::plan::Mount> {
    use corral_policy::plan::{Access, MountKind};
    let root = &plan.project.root;
    let related = |p: &std::path::Path| p.starts_with(root) || root.starts_with(p);
    plan.mounts.iter().find(|m| {
        m.kind == MountKind::Bind(Access::Rw)
            && m.source != m.target
            && (related(&m.source) || related(&m.target))
    })
}

/// Whether the kernel can hold the name gate's listener (Linux 5.19: a killable wait), which
/// performs and records every change of the jail; without it the record stays empty.
fn gate_kernel() -> bool {
    let Ok(u) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = u.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (5, 19)
}

/// A changed path of the record, as the change summary takes it.
fn recorded(c: corral_changes::Change) -> corral_session::changes::Recorded {
    use corral_changes::State;
    use corral_session::changes::Kind;
    let kind = |s: &State| match s {
        State::Absent => Kind::Absent,
        State::Dir { .. } => Kind::Dir,
        _ => Kind::Other,
    };
    corral_session::changes::Recorded {
        before: kind(&c.before),
        after: kind(&c.after),
        path: c.path,
    }
}

/// After the jail's command ended, before anything is checked or reported: stop the executor
/// (its server ends every command jail it started, SIGTERM then SIGKILL, and waits for them),
/// then end whatever else the run started is still running (a command jail whose server died
/// was re-parented to corral). When this returns, nothing the run started can write any more.
fn end_run(executor: Option<crate::executor::RunExecutor>, ending: Option<u32>) {
    drop(executor);
    corral_exec::end_children(&Vec::from_iter(ending));
}

/// The network's end-of-run lines: blocked destinations, bounds that were hit, and audit
/// records that could not be written (the requests they recorded were refused).
fn network_summary(proxy: Option<&corral_net::ProxyHandle>, audit: &AuditLog) {
    if let Some(proxy) = proxy {
        for line in proxy.summary() {
            say(&line);
        }
        for line in proxy.proxy().bounds_summary() {
            say(&line);
        }
    }
    if let Some(f) = audit.failures() {
        say(&f.summary_line());
    }
}

/// Network mode `proxy`: corral's proxy accepts on the jail's 127.0.0.1:3128, and each
/// `host_ports` listener is bridged to the host's 127.0.0.1:PORT.
fn serve_network(
    plan: &Plan,
    net: corral_sandbox::JailNet,
    audit: &AuditLog,
    jail_id: &str,
    gateway: Option<corral_gateway::Gateway>,
) -> anyhow::Result<Option<corral_net::ProxyHandle>> {
    let mut listeners = Vec::new();
    if let Some(l) = net.proxy {
        listeners.push(corral_net::Listener::Proxy(l));
    }
    for (port, listener) in net.host_ports {
        listeners.push(corral_net::Listener::Forward {
            listener,
            target: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
        });
    }
    if listeners.is_empty() {
        return Ok(None);
    }
    let rules = corral_net::Rules::from_plan(&plan.network)?;
    // What the jail can make the proxy hold in partial request heads is a share of the memory
    // its policy allows (ProxyConfig::buffer_budget_for).
    let config = corral_net::ProxyConfig {
        buffer_budget: corral_net::ProxyConfig::buffer_budget_for(plan.limits.memory),
        ..corral_net::ProxyConfig::default()
    };
    let mut proxy = corral_net::Proxy::new(rules, audit.clone(), jail_id).with_config(config);
    if let Some(gw) = gateway {
        proxy = proxy.with_gateway(gw);
    }
    let proxy = Arc::new(proxy);
    Ok(Some(corral_net::spawn(proxy, listeners)?))
}

/// With corral's proxy and the request the plan came from: the proxy's rules follow the policy
/// files, and `corral watch` can reach the run (live.rs). Without, a note on stderr.
fn live_policy(
    req: Option<&corral_policy::Request>,
    resolved: &Trusted<Plan>,
    jail_plan: &Plan,
    proxy: Option<&corral_net::ProxyHandle>,
    audit: &AuditLog,
    jail_id: &str,
) -> Option<crate::live::Live> {
    let (req, proxy) = (req?, proxy?);
    if resolved.network.mode != NetworkMode::Proxy {
        return None;
    }
    crate::live::start(
        req,
        resolved,
        jail_plan,
        Box::new(proxy.proxy().clone()),
        audit,
        jail_id,
        None,
    )
    .map_err(|e| eprintln!("corral: the policy files are not followed during this run: {e:#}"))
    .ok()
}

/// The host listeners of `network.publish`. With `network.mode = "host"` the jail already
/// shares the host's loopback: nothing to bind (it would take the port from the jail).
fn publish_listeners(plan: &Plan) -> anyhow::Result<Vec<(u16, std::net::TcpListener)>> {
    match plan.network.mode {
        NetworkMode::Host => {
            if !plan.network.publish.is_empty() {
                eprintln!(
                    "corral: network.publish {:?}: with network.mode = \"host\" the jail's ports are the host's already",
                    plan.network.publish
                );
            }
            Ok(Vec::new())
        }
        NetworkMode::None | NetworkMode::Proxy => plan
            .network
            .publish
            .iter()
            .map(|&port| Ok((port, corral_net::netcap::bind_published(port)?)))
            .collect(),
    }
}

/// The stub's sockets made in the jail: its 127.0.0.1:53 (UDP, TCP) and the capture listeners.
type StubSockets = (
    Option<(std::net::UdpSocket, std::net::TcpListener)>,
    Vec<(u16, std::net::TcpListener)>,
);

/// `--publish PORT`: each connection to the host's 127.0.0.1:PORT is bridged to the jail's
/// 127.0.0.1:PORT over a socket the jail's set-up process makes in the jail's namespace.
/// `network.dns = "stub"`: the stub resolver and its capture listeners, decided by `proxy`.
fn serve_netcap(
    published: Vec<(u16, std::net::TcpListener)>,
    stub: StubSockets,
    proxy: Option<&corral_net::ProxyHandle>,
    jail: &mut corral_sandbox::RunningJail,
    audit: &AuditLog,
    jail_id: &str,
) -> anyhow::Result<Option<corral_net::netcap::NetcapHandle>> {
    use corral_net::netcap::{JailSocket, StubPool, Task};
    let mut tasks = Vec::new();
    if !published.is_empty() {
        let factory = jail
            .take_socket_factory()
            .context("the jail has no socket factory for --publish")?;
        let factory = Arc::new(factory);
        let make: JailSocket = Arc::new(move || factory.tcp4());
        tasks.extend(published.into_iter().map(|(port, listener)| Task::Publish {
            listener,
            port,
            make: make.clone(),
        }));
    }
    if let ((Some((udp, tcp)), capture), Some(proxy)) = (stub, proxy) {
        let (network, prefix) = corral_sandbox::STUB_POOL;
        tasks.push(Task::Stub {
            udp,
            tcp,
            capture,
            proxy: proxy.proxy().clone(),
            pool: Arc::new(StubPool::new(
                network,
                prefix,
                corral_sandbox::STUB_LO_ADDRESS,
            )),
        });
    }
    if tasks.is_empty() {
        return Ok(None);
    }
    Ok(Some(corral_net::netcap::spawn(
        tasks,
        audit.clone(),
        jail_id,
    )?))
}

/// The stub resolver's files `run` attached (`network.dns = "stub"`), written into their private
/// directory (0700). Removed when the guard drops.
fn stub_files(run: &RunPlan) -> anyhow::Result<Option<StubFiles>> {
    let Some(dns) = &run.attachments.dns else {
        return Ok(None);
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dns.dir)
            .with_context(|| format!("cannot create {}", dns.dir.display()))?;
    }
    let guard = StubFiles {
        dir: dns.dir.clone(),
    };
    for (name, text) in &dns.files {
        let path = dns.dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(Some(guard))
}

struct StubFiles {
    dir: std::path::PathBuf,
}

impl Drop for StubFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the output filter kept from the user's terminal (clipboard writes, host-acting escape
/// sequences), with the fix, on stderr and as a `terminal` audit event.
fn report_terminal(dropped: corral_sandbox::termfilter::Dropped, session: &Checked) {
    let lines = dropped.summary();
    if lines.is_empty() {
        return;
    }
    for line in &lines {
        say(&format!("corral: {line}"));
    }
    session.record(JailEvent::Terminal {
        detail: serde_json::to_value(dropped).unwrap_or_default(),
    });
}
