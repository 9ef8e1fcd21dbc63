//! The run lifecycle: [`Session::begin`], [`StartingSession::ready`], [`Session::run`].

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

/// A backend runs a Plan's command: the native jail, or a container engine.
pub trait Backend {
    /// The `start` record's detail for `plan`: the Plan itself, and what the backend adds.
    fn describe(&self, plan: &Plan) -> serde_json::Value {
        serde_json::to_value(plan).unwrap_or_default()
    }

    /// Run the command of `plan` to its end and return its exit code. When this returns,
    /// nothing the run started can write any more: the session's checks see the final state.
    fn run(&mut self, plan: &Plan, session: &Session) -> anyhow::Result<i32>;

    /// The backend's own end-of-run lines and records (limits hit, the network's summary),
    /// after the session's checks. None by default.
    fn report(&mut self, _session: &Session) {}

    /// Connections the run refused before any decision, by reason, for the `exit` record;
    /// read after [`Backend::report`]. None by default.
    fn refused(&self) -> std::collections::BTreeMap<String, u64> {
        Default::default()
    }
}

/// A session whose snapshots are being taken (on threads of their own) while the backend
/// prepares the jail.
pub struct StartingSession {
    jail_id: String,
    scope: Scope,
    audit: AuditLog,
    baseline: changes::Pending,
    git: Option<std::thread::JoinHandle<gitguard::Snapshot>>,
}

/// A session ready to run: the git snapshot is taken; the change baseline is taken, or (after
/// [`StartingSession::ready_for_mounts`]) still being taken until [`Session::await_baseline`].
pub struct Session {
    jail_id: String,
    scope: Scope,
    audit: AuditLog,
    baseline: std::sync::Mutex<Baseline>,
    git: Option<gitguard::Snapshot>,
    /// Paths corral itself made in the project for the run (placeholders): not listed as
    /// changes.
    own: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

/// The change baseline of a session: on its thread, or taken (`None`: no summary this run).
enum Baseline {
    Pending(changes::Pending),
    Taken(Option<Box<changes::Baseline>>),
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
        let audit = AuditLog::for_project(&plan.project.root).with_context(|| {
            format!(
                "cannot open the audit log of {}",
                plan.project.root.display()
            )
        })?;
        if scope != Scope::ExecutorCommand {
            // The terminal's settings, put back at the end if the run changed them (endlines.rs).
            endlines::save_terminal();
        }
        let (baseline, git) = match scope {
            Scope::ExecutorCommand | Scope::Remote => (changes::Pending::none(), None),
            Scope::Run => {
                // What the agent changes in the project, listed when it ends (changes.rs).
                let baseline = changes::start(plan, &jail_id);
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

    /// Wait until the change baseline is taken (at once when it is). What the jail's command
    /// writes must come after it: a backend that started the jail with its exec held
    /// ([`StartingSession::ready_for_mounts`]) calls this before it lets the command run.
    pub fn await_baseline(&self) {
        let mut slot = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*slot, Baseline::Taken(_)) {
            return;
        }
        if let Baseline::Pending(pending) = std::mem::replace(&mut *slot, Baseline::Taken(None)) {
            *slot = Baseline::Taken(changes::ready(pending).map(Box::new));
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

    /// The baseline, taken (waiting for it if need be).
    fn take_baseline(&self) -> Option<changes::Baseline> {
        self.await_baseline();
        let mut slot = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *slot, Baseline::Taken(None)) {
            Baseline::Taken(b) => b.map(|b| *b),
            Baseline::Pending(_) => None,
        }
    }

    /// Write a `Jail` event of this session to the audit log (a failure is said on stderr).
    pub fn record(&self, event: JailEvent) {
        record(&self.audit, &self.jail_id, event);
    }

    /// Run `plan` on `backend` and finish: the start record, the set-id watch, the run, then
    /// the checks (git, set-id), the backend's own
    /// report, the change summary, and the exit record (or the error record, exit 125).
    pub fn run(self, plan: &Plan, backend: &mut dyn Backend) -> anyhow::Result<i32> {
        if !self.audit.path().exists() {
            eprintln!("{}", first_run_line(plan, self.audit.path()));
        }
        self.record(JailEvent::Start {
            detail: backend.describe(plan),
        });
        // Set-id files that appear where the jail can write from now on (setid.rs).
        let set_id = setid::watch(plan);
        // The hidden files, to tell whether the host replaced one meanwhile (replaced.rs).
        let hidden = replaced::snapshot(plan);
        // What the checks need, written down until they are done: if corral dies during the
        // run, the next corral command in this project does them (journal.rs).
        let journal = match self.scope {
            Scope::Run => match journal::begin(
                &plan.project.root,
                &self.jail_id,
                self.git.as_ref(),
                &set_id,
            ) {
                Ok(j) => Some(j),
                Err(e) => {
                    self.record(JailEvent::Error {
                        exit_code: 125,
                        detail: format!("{e:#}"),
                    });
                    return Err(e);
                }
            },
            Scope::ExecutorCommand | Scope::Remote => None,
        };
        let result = backend.run(plan, &self);
        // The jail is gone: what it left on the terminal is undone before corral says anything
        // (endlines.rs). Not for an executor command: its run's jail is still on the terminal.
        if self.scope != Scope::ExecutorCommand {
            endlines::restore_terminal();
        }
        let baseline = self.take_baseline();
        let Session {
            jail_id,
            scope,
            audit,
            git,
            own,
            ..
        } = self;
        let own = own.into_inner().unwrap_or_else(|p| p.into_inner());
        let set_id = setid::check(set_id);
        let git_lines = git
            .map(|g| gitguard::check(g, &jail_id))
            .unwrap_or_default();
        for line in git_lines {
            endlines::say(&format!("corral: {}", printable(&line)));
            record(&audit, &jail_id, JailEvent::Quarantine { detail: line });
        }
        let session = Session {
            jail_id,
            scope,
            audit,
            baseline: std::sync::Mutex::new(Baseline::Taken(None)),
            git: None,
            own: Default::default(),
        };
        for line in replaced::check(hidden)
            .into_iter()
            .chain(replaced::appeared(plan))
        {
            endlines::say(&format!("corral: {line}"));
            session.record(JailEvent::Exposed { detail: line });
        }
        backend.report(&session);
        changes::finish(baseline, &own, &session.audit, &session.jail_id);
        setid::report(set_id, &session.audit, &session.jail_id);
        if let Some(journal) = journal {
            journal.done();
        }
        match &result {
            Ok(code) => session.record(JailEvent::Exit {
                exit_code: *code,
                refused: backend.refused(),
            }),
            Err(e) => session.record(JailEvent::Error {
                exit_code: 125,
                detail: format!("{e:#}"),
            }),
        }
        result
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
            baseline: std::sync::Mutex::new(Baseline::Pending(self.baseline)),
            git,
            own: Default::default(),
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
