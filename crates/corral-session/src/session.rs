//! The run lifecycle, as one value per phase. Each phase's value is made only by the method of
//! the phase before it, so the order between the run's concurrent actors (the snapshot threads,
//! the jail's held exec, the backend's processes, the checks) is held by the types:
//!
//! ```text
//! Session::begin ─> StartingSession        change baseline (none when the summary comes from
//!                                            the run's change record) and git snapshot on threads
//!   ─ready_for_mounts─> Session            git snapshot taken (the jail's mounts need it)
//!   ─Session::run(plan, backend):
//!       `start` record, set-id watch, hidden files, journal entry
//!       Backend::start ─> B::Started       the jail built, its command's exec held
//!       Session::await_baseline ─> Baselined   the change baseline is complete (and the
//!                                            journal entry on disk)
//!       Backend::run(started, Baselined) ─> Ended   command released; every process ended
//!                                            (the record's changes handed over: `recorded`)
//!       Ended ─check─> Checked             terminal, git, hidden files
//!       Backend::report(&Checked), Checked::finish   change summary, set-id, journal, `exit`
//! ```

use anyhow::Context as _;
use corral_audit::{AuditLog, Event, JailEvent, Record, printable};
use corral_policy::plan::{Access, NetworkMode, Plan};

use crate::{changes, endlines, gitguard, journal, replaced, setid};

/// Which checks a session takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A run of its own (`corral run`, `corral shell`, a container run): every check.
    Run,
    /// One command of a run's executor, in a jail of its own (`corral serve --jail-helper`).
    /// The run's session holds the project's change baseline and git snapshot, and checks them
    /// once its executor (and so this command) has ended: this session takes neither.
    ExecutorCommand,
    /// A run whose project is a volume elsewhere (`corral run --engine kube`: a
    /// PersistentVolumeClaim, or a hostPath on some node): the host's copy of the project is not
    /// what the jail writes, so neither the change baseline nor the git snapshot is taken, and
    /// no change summary or git check is made. The set-id watch looks at host binds only,
    /// which such a run does not carry: it finds nothing.
    Remote,
}

/// A backend runs a Plan's command: the native jail, or a container engine. The session calls
/// it in this order, and each call needs the value of the phase before it: [`Backend::start`],
/// then (once the change baseline is complete) [`Backend::run`] with the [`Baselined`], whose
/// [`Ended`] the checks need, then [`Backend::report`] with the [`Checked`].
pub trait Backend {
    /// What the backend holds between [`Backend::start`] and [`Backend::run`]: the started jail
    /// whose command waits to be let go, and what serves it.
    type Started;

    /// The `start` record's detail for `plan`: the Plan itself, and what the backend adds.
    fn describe(&self, plan: &Plan) -> serde_json::Value {
        serde_json::to_value(plan).unwrap_or_default()
    }

    /// Start what the run needs, up to the command's exec, which waits: the change baseline may
    /// still be being taken ([`StartingSession::ready_for_mounts`]), and nothing the command
    /// writes may come before it. A backend that cannot hold its command's exec starts nothing
    /// here (its session was made [`StartingSession::ready`]: the baseline is taken already).
    fn start(&mut self, plan: &Plan, session: &Session) -> anyhow::Result<Self::Started>;

    /// Let the command run (`baselined`: the change baseline is complete) and wait until every
    /// process the run started has ended: the jail reaped, the containers removed, the executor
    /// ended. The [`Ended`] it returns ([`Baselined::ended`]) says so, with the exit code: the
    /// session's checks need it, and then see the final state. An error must likewise come
    /// after what the run started ended or was killed (a dropped jail is).
    fn run(
        &mut self,
        plan: &Plan,
        started: Self::Started,
        baselined: Baselined,
        session: &Session,
    ) -> anyhow::Result<Ended>;

    /// The backend's own end-of-run lines and records (limits hit, the network's summary),
    /// after the session's checks. None by default.
    fn report(&mut self, _checked: &Checked) {}

    /// Connections the run refused before any decision, by reason, for the `exit` record;
    /// read after [`Backend::report`]. None by default.
    fn refused(&self) -> std::collections::BTreeMap<String, u64> {
        Default::default()
    }
}

/// Proof that the session's change baseline is complete (or that the session takes none): the
/// only way to get one is [`Session::await_baseline`], and [`Backend::run`], which lets the
/// command run, needs one.
///
/// ```compile_fail
/// // Not made outside the session.
/// let _ = corral_session::Baselined { _by_the_session: () };
/// ```
#[derive(Debug)]
pub struct Baselined {
    _by_the_session: (),
}

impl Baselined {
    /// Every process the run started has ended, the command with `exit_code`: the backend's
    /// last word ([`Backend::run`]).
    pub fn ended(self, exit_code: i32) -> Ended {
        Ended {
            result: Ok(exit_code),
        }
    }
}

/// Every process the run started has ended (or the backend failed, and what it started was
/// ended with it): the session's checks may look. Made by [`Baselined::ended`] only (and by
/// the session on a backend's error).
///
/// ```compile_fail
/// // Not made without a `Baselined`.
/// let _ = corral_session::Ended { result: Ok(0) };
/// ```
#[derive(Debug)]
pub struct Ended {
    /// The command's exit code, or the backend's error.
    result: anyhow::Result<i32>,
}

impl Ended {
    /// The backend failed: what it started was dropped (and so ended) with its error.
    fn by_failure(error: anyhow::Error) -> Ended {
        Ended { result: Err(error) }
    }
}

/// A session whose checks are done: what the backend reports and the end records come now.
/// Made by the session's `check` from an [`Ended`] only.
pub struct Checked {
    jail_id: String,
    audit: AuditLog,
    /// The command's exit code, or the run's error.
    result: anyhow::Result<i32>,
    baseline: Option<changes::Baseline>,
    /// Paths corral made in the project for the run: not changes.
    own: Vec<std::path::PathBuf>,
    set_id: setid::Pending,
    journal: Option<journal::Running>,
}

/// A session whose snapshots are being taken (on threads of their own) while the backend
/// prepares the jail.
pub struct StartingSession {
    jail_id: String,
    scope: Scope,
    audit: AuditLog,
    /// corral's state directory: the audit log's and the journal's.
    state: std::path::PathBuf,
    baseline: changes::Pending,
    git: Option<std::thread::JoinHandle<gitguard::Snapshot>>,
}

/// A session ready to run: the git snapshot is taken; the change baseline is taken, or (after
/// [`StartingSession::ready_for_mounts`]) still being taken until [`Session::await_baseline`].
pub struct Session {
    jail_id: String,
    scope: Scope,
    audit: AuditLog,
    state: std::path::PathBuf,
    baseline: std::sync::Mutex<Baseline>,
    git: Option<gitguard::Snapshot>,
    /// Paths corral itself made in the project for the run (placeholders): not listed as
    /// changes.
    own: std::sync::Mutex<Vec<std::path::PathBuf>>,
    /// Directories corral makes on the host for the run (`Attachments::host_dirs`): the
    /// journal entry names them.
    host_dirs: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

/// The change baseline of a session: on its thread, or taken (`None`: no summary this run).
enum Baseline {
    Pending(changes::Pending),
    Taken(Option<Box<changes::Baseline>>),
}

/// What the session watches from the `start` record until the checks: taken before the
/// backend starts anything.
struct Watches {
    /// Set-id files that appear where the run can write (setid.rs).
    set_id: setid::Watch,
    /// The hidden files, to tell whether the host replaced one meanwhile (replaced.rs).
    hidden: replaced::Watch,
    /// What the checks need, written down until they are done (journal.rs).
    journal: Option<journal::Running>,
}

impl Session {
    /// Begin the session of `plan`: a fresh jail id, the project's audit log, and (with
    /// [`Scope::Run`]) the change baseline and the git snapshot, taken on threads meanwhile.
    pub fn begin(plan: &Plan, scope: Scope) -> anyhow::Result<StartingSession> {
        Session::begin_as(plan, scope, corral_audit::new_jail_id())
    }

    /// [`Session::begin`] for the jail `jail_id` (a `corral_audit::new_jail_id`), for a caller
    /// that needs the id before the session begins.
    pub fn begin_as(plan: &Plan, scope: Scope, jail_id: String) -> anyhow::Result<StartingSession> {
        Session::begin_with(plan, scope, jail_id, changes::Source::Walk { why: None })
    }

    /// [`Session::begin_as`] whose change summary comes from `source`: with
    /// [`changes::Source::Record`] nothing lists the project, and the backend hands the run's
    /// record over ([`Session::recorded`]) once nothing the run started can write.
    pub fn begin_with(
        plan: &Plan,
        scope: Scope,
        jail_id: String,
        source: changes::Source,
    ) -> anyhow::Result<StartingSession> {
        let state = corral_audit::state_dir().with_context(|| {
            format!(
                "cannot open the audit log of {}",
                plan.project.root.display()
            )
        })?;
        Session::begin_in(plan, scope, jail_id, state, source)
    }

    /// [`Session::begin_as`] with corral's state directory `state` (the audit log's and the
    /// journal's).
    fn begin_in(
        plan: &Plan,
        scope: Scope,
        jail_id: String,
        state: std::path::PathBuf,
        source: changes::Source,
    ) -> anyhow::Result<StartingSession> {
        let audit = AuditLog::at(
            state
                .join(corral_audit::project_key(&plan.project.root))
                .join("audit.jsonl"),
        );
        if scope != Scope::ExecutorCommand {
            // The terminal's settings, put back at the end if the run changed them (endlines.rs).
            endlines::save_terminal();
        }
        let (baseline, git) = match scope {
            Scope::ExecutorCommand | Scope::Remote => (changes::Pending::none(), None),
            Scope::Run => {
                // What the agent changes in the project, listed when it ends (changes.rs).
                let baseline = changes::start(plan, &jail_id, source);
                // The git files the jail could plant (gitguard.rs): the other git directories
                // of the project only when the jail can write it.
                let root = plan.project.root.clone();
                let home = plan.home.clone();
                let nested = writes_project(plan);
                let git = std::thread::spawn(move || gitguard::snapshot(&root, nested, &home));
                (baseline, Some(git))
            }
        };
        Ok(StartingSession {
            jail_id,
            scope,
            audit,
            state,
            baseline,
            git,
        })
    }

    pub fn jail_id(&self) -> &str {
        &self.jail_id
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// The git files the jail must get read-only: the dangerous parts of the project's other
    /// git directories the snapshot found (gitguard.rs `protect`). None without a snapshot.
    pub fn protected(&self) -> Vec<std::path::PathBuf> {
        self.git
            .as_ref()
            .map(gitguard::protected_paths)
            .unwrap_or_default()
    }

    /// The git directories that existed when the session began (gitguard.rs `git_dirs`): where
    /// the name gate lets the jail create a `HEAD`. `None` without a snapshot (an executor
    /// command's session: its Plan already has its run's).
    pub fn git_dirs(&self, plan: &Plan) -> Option<Vec<std::path::PathBuf>> {
        self.git
            .as_ref()
            .map(|g| gitguard::git_dirs(g, &rw_bind_sources(plan)))
    }

    /// Wait until the change baseline is taken (at once when it is): what the jail's command
    /// writes must come after it. The [`Baselined`] returned says it is, and lets the command
    /// go ([`Backend::run`]).
    pub fn await_baseline(&self) -> Baselined {
        let mut slot = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        if let Baseline::Pending(_) = *slot
            && let Baseline::Pending(pending) = std::mem::replace(&mut *slot, Baseline::Taken(None))
        {
            *slot = Baseline::Taken(changes::ready(pending).map(Box::new));
        }
        Baselined {
            _by_the_session: (),
        }
    }

    /// The run's change record cannot stand for the summary after all (`why`): the project
    /// is listed now, as the other method does. Call before the backend starts (its command
    /// must not have run yet). Nothing when the summary was not to come from a record.
    pub fn fall_back(&self, plan: &Plan, why: String) {
        let mut slot = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        if let Baseline::Pending(p) = &*slot
            && p.is_record()
        {
            *slot = Baseline::Pending(changes::start(
                plan,
                &self.jail_id,
                changes::Source::Walk { why: Some(why) },
            ));
        }
    }

    /// Whether the change summary comes from the run's change record.
    pub fn summary_from_record(&self) -> bool {
        match &*self.baseline.lock().unwrap_or_else(|p| p.into_inner()) {
            Baseline::Pending(p) => p.is_record(),
            Baseline::Taken(b) => b.as_ref().is_some_and(|b| b.is_record()),
        }
    }

    /// What the run's change record names as changed, for the summary: the backend's, once
    /// nothing the run started can write (after [`Session::await_baseline`]).
    pub fn recorded(&self, paths: anyhow::Result<Vec<changes::Recorded>>) {
        if let Baseline::Taken(Some(b)) =
            &mut *self.baseline.lock().unwrap_or_else(|p| p.into_inner())
        {
            b.recorded(paths);
        }
    }

    /// Paths corral made in the project for this run and removes after it (the jail's
    /// placeholders): the change summary leaves them out. The baseline may be taken while they
    /// are made (`ready_for_mounts`).
    pub fn made_by_corral(&self, paths: Vec<std::path::PathBuf>) {
        self.own
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(paths);
    }

    /// Directories corral makes on the host for this run (a native run's executor socket,
    /// resolver files, gateway CA: `Attachments::host_dirs`). Call before [`Session::run`]: the
    /// run's journal entry names them, so that the next corral command removes them when this
    /// one was killed (journal.rs).
    pub fn made_on_host(&self, dirs: Vec<std::path::PathBuf>) {
        self.host_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(dirs);
    }

    /// Write a `Jail` event of this session to the audit log (a failure is said on stderr).
    pub fn record(&self, event: JailEvent) {
        record(&self.audit, &self.jail_id, event);
    }

    /// Run `plan` on `backend` and finish, phase by phase (the module's doc): the start record
    /// and the watches, the backend's start, the baseline, the backend's run to its end, the
    /// checks (git, hidden files), the backend's own report, then the change
    /// summary, the set-id report and the exit record (or the error record, exit 125).
    pub fn run<B: Backend>(self, plan: &Plan, backend: &mut B) -> anyhow::Result<i32> {
        let mut watches = self.watch(plan, backend)?;
        let ended = self.run_backend(plan, backend, watches.journal.as_mut());
        let checked = self.check(plan, watches, ended);
        backend.report(&checked);
        checked.finish(backend)
    }

    /// The `start` record, then what the checks compare with, taken before the backend starts
    /// anything; with [`Scope::Run`], the run's journal entry, so that if corral dies during the
    /// run, the next corral command in this project does the checks (journal.rs). An entry that
    /// cannot be written fails the run (the error record).
    fn watch<B: Backend>(&self, plan: &Plan, backend: &B) -> anyhow::Result<Watches> {
        if !self.audit.path().exists() {
            eprintln!("{}", first_run_line(plan, self.audit.path()));
        }
        self.record(JailEvent::Start {
            detail: backend.describe(plan),
        });
        let set_id = setid::watch(plan);
        // The hidden files, to tell whether the host replaced one meanwhile (replaced.rs).
        let hidden = replaced::snapshot(plan);
        let journal = match self.scope {
            Scope::Run => {
                let entry = journal::begin(
                    &self.state,
                    &plan.project.root,
                    &self.jail_id,
                    self.git.as_ref(),
                    &set_id,
                    self.host_dirs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone(),
                );
                match entry {
                    Ok(j) => Some(j),
                    Err(e) => {
                        self.record(JailEvent::Error {
                            exit_code: 125,
                            detail: format!("{e:#}"),
                        });
                        return Err(e);
                    }
                }
            }
            Scope::ExecutorCommand | Scope::Remote => None,
        };
        Ok(Watches {
            set_id,
            hidden,
            journal,
        })
    }

    /// The backend's start, the change baseline and the journal entry on disk, the backend's
    /// run to its end.
    fn run_backend<B: Backend>(
        &self,
        plan: &Plan,
        backend: &mut B,
        journal: Option<&mut journal::Running>,
    ) -> Ended {
        let started = match backend.start(plan, self) {
            Ok(started) => started,
            Err(e) => return Ended::by_failure(e),
        };
        let baselined = self.await_baseline();
        // Before the command is released (the jail, dropped, is killed).
        if let Some(Err(e)) = journal.map(journal::Running::synced) {
            return Ended::by_failure(e);
        }
        backend
            .run(plan, started, baselined, self)
            .unwrap_or_else(Ended::by_failure)
    }

    /// The run has ended: the terminal is put back, then the checks that need the final state
    /// (git, set-id, hidden files), each finding said and recorded.
    fn check(self, plan: &Plan, watches: Watches, ended: Ended) -> Checked {
        // What the jail left on the terminal is undone before corral says anything
        // (endlines.rs). Not for an executor command: its run's jail is still on the terminal.
        if self.scope != Scope::ExecutorCommand {
            endlines::restore_terminal();
        }
        let baseline = self.take_baseline();
        let Session {
            jail_id,
            audit,
            git,
            own,
            ..
        } = self;
        let Watches {
            set_id,
            hidden,
            journal,
        } = watches;
        let own = own.into_inner().unwrap_or_else(|p| p.into_inner());
        let set_id = setid::check(set_id);
        // One update of the project's tree index serves the git guard's check and the search
        // for hidden files that appeared (corral_policy::tree).
        let root = &plan.project.root;
        let tree = (git.as_ref().is_some_and(gitguard::Snapshot::nested) || !plan.hide.is_empty())
            .then(|| corral_policy::tree::update(root, &jail_reach(plan), &plan.hide));
        let git_lines = git
            .map(|g| gitguard::check_in(g, &jail_id, tree.as_deref()))
            .unwrap_or_default();
        for line in git_lines {
            endlines::say(&format!("corral: {}", printable(&line)));
            record(&audit, &jail_id, JailEvent::Quarantine { detail: line });
        }
        let appeared = match &tree {
            Some(tree) => replaced::appeared_in(plan, tree),
            None => Vec::new(),
        };
        for line in replaced::check(hidden).into_iter().chain(appeared) {
            endlines::say(&format!("corral: {line}"));
            record(&audit, &jail_id, JailEvent::Exposed { detail: line });
        }
        Checked {
            jail_id,
            audit,
            result: ended.result,
            baseline,
            own,
            set_id,
            journal,
        }
    }

    /// The baseline, taken (waiting for it if need be).
    fn take_baseline(&self) -> Option<changes::Baseline> {
        self.await_baseline();
        let mut slot = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *slot, Baseline::Taken(None)) {
            Baseline::Taken(b) => b.map(|b| *b),
            Baseline::Pending(_) => None,
        }
    }
}

impl Checked {
    pub fn jail_id(&self) -> &str {
        &self.jail_id
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Write a `Jail` event of this session to the audit log (a failure is said on stderr).
    pub fn record(&self, event: JailEvent) {
        record(&self.audit, &self.jail_id, event);
    }

    /// The end of the run, after the backend's report: the change summary, the set-id report,
    /// the journal entry removed (the checks are done), then the `exit` record (with the
    /// refusals `backend` counted) or the `error` record. The command's exit code.
    fn finish<B: Backend>(self, backend: &B) -> anyhow::Result<i32> {
        changes::finish(self.baseline, &self.own, &self.audit, &self.jail_id);
        setid::report(self.set_id, &self.audit, &self.jail_id);
        if let Some(journal) = self.journal {
            journal.done();
        }
        match &self.result {
            Ok(code) => record(
                &self.audit,
                &self.jail_id,
                JailEvent::Exit {
                    exit_code: *code,
                    refused: backend.refused(),
                },
            ),
            Err(e) => record(
                &self.audit,
                &self.jail_id,
                JailEvent::Error {
                    exit_code: 125,
                    detail: format!("{e:#}"),
                },
            ),
        }
        self.result
    }
}

impl StartingSession {
    pub fn jail_id(&self) -> &str {
        &self.jail_id
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Wait for the snapshots; call before the jail starts. The jail must then get the git
    /// files [`Session::protected`] names read-only ([`crate::runplan::RunPlan::protect`]).
    pub fn ready(self) -> anyhow::Result<Session> {
        let session = self.ready_for_mounts()?;
        session.await_baseline();
        Ok(session)
    }

    /// Wait for the git snapshot only (the jail's mounts need what it protects); the change
    /// baseline goes on being taken. The backend must hold the command's exec until
    /// [`Session::await_baseline`] returned (the native jail: `SpawnOptions::hold_exec`, then
    /// `RunningJail::release_exec`), so nothing the command writes is in the baseline.
    pub fn ready_for_mounts(self) -> anyhow::Result<Session> {
        let git = match self.git {
            Some(handle) => Some(
                handle
                    .join()
                    .map_err(|_| anyhow::anyhow!("the git snapshot thread panicked"))?,
            ),
            None => None,
        };
        Ok(Session {
            jail_id: self.jail_id,
            scope: self.scope,
            audit: self.audit,
            state: self.state,
            baseline: std::sync::Mutex::new(Baseline::Pending(self.baseline)),
            git,
            own: Default::default(),
            host_dirs: Default::default(),
        })
    }
}

/// Whether the jail can write the project (not `--scratch`, not read-only): the git snapshot
/// then also covers the project's other git directories.
pub(crate) fn writes_project(plan: &Plan) -> bool {
    !plan.project.scratch && plan.project.access == Access::Rw
}

fn record(audit: &AuditLog, jail_id: &str, event: JailEvent) {
    if let Err(e) = audit.write(&Record::now(jail_id, Event::Jail(event))) {
        endlines::say(&format!("corral: cannot write the audit log: {e}"));
    }
}

/// The one line a project's first jailed run prints: what the jail allows and where the audit
/// log is, so nobody has to guess what `corral run` did (`corral plan` shows all of it).
pub fn first_run_line(plan: &Plan, audit: &std::path::Path) -> String {
    let access = match plan.project.access {
        Access::Rw => "read-write",
        Access::Ro => "read-only",
    };
    let network = match plan.network.mode {
        NetworkMode::None => "no network".to_string(),
        NetworkMode::Host => "the host's network, unfiltered".to_string(),
        NetworkMode::Proxy
            if plan.network.allow.is_empty() && plan.network.allow_paths.is_empty() =>
        {
            "no destination allowed through the proxy".to_string()
        }
        NetworkMode::Proxy => {
            let hosts: Vec<String> = (plan.network.allow.iter().map(|p| p.to_string()))
                .chain(plan.network.allow_paths.iter().map(|r| r.to_string()))
                .collect();
            format!("only {} through the proxy", hosts.join(", "))
        }
    };
    format!(
        "corral: first jailed run here: {} {access}, {network}; audit log {} (details: corral plan, corral log)",
        plan.project.root.display(),
        audit.display()
    )
}

/// The host directories `plan` binds read-write: their `.git` is one of the run's git
/// directories (gitguard.rs `git_dirs`).
pub(crate) fn rw_bind_sources(plan: &Plan) -> Vec<std::path::PathBuf> {
    plan.mounts
        .iter()
        .filter(|m| matches!(m.kind, corral_policy::plan::MountKind::Bind(Access::Rw)))
        .map(|m| m.source.clone())
        .collect()
}

/// Every host path the jail of `plan` sees: the project and each mount's source (where the
/// project's tree index must not be kept).
fn jail_reach(plan: &Plan) -> Vec<std::path::PathBuf> {
    std::iter::once(plan.project.root.clone())
        .chain(plan.mounts.iter().map(|m| m.source.clone()))
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

#[cfg(test)]
mod tests;
