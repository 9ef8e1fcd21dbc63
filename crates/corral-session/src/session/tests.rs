//! The run's order, tested without root: a recording backend (after youki's recording
//! `Syscall` double) notes each call the session makes, with what it could see then (the change
//! baseline, the journal entry, the audit records so far), and plays the part of a jail's
//! command by writing in the project when it is let run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use corral_audit::{AuditLog, Event, JailEvent};
use corral_policy::plan::Plan;

use super::{Backend, Baseline, Baselined, Checked, Ended, Scope, Session};

/// A call the session made to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Start,
    Run,
    Report,
}

/// The change baseline as a call saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BaselineSeen {
    /// Still on its thread (or not waited for).
    Pending,
    /// Complete (or the session takes none).
    Taken,
    /// Moved to the checks (the report's view).
    Checked,
}

/// One call and what the backend saw when it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    call: Call,
    baseline: BaselineSeen,
    /// Whether the run's journal entry exists.
    journal: bool,
    /// The session's audit records so far, by event name.
    records: Vec<&'static str>,
}

/// How the recording backend's start and run go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Script {
    /// The command ends with this exit code.
    Exits(i32),
    /// `start` fails (the jail could not be built).
    StartFails,
    /// `run` fails after the command was let go.
    RunFails,
}

/// The recording fake backend.
struct Recording {
    script: Script,
    /// corral's state directory of the session (its audit log, its journal).
    state: PathBuf,
    project: PathBuf,
    /// Written by `start` and given to [`Session::made_by_corral`]: a placeholder.
    placeholder: Option<&'static str>,
    /// Written in the project by `run`, after the command is let go: what the command writes.
    writes: Vec<&'static str>,
    refused: BTreeMap<String, u64>,
    calls: Vec<Seen>,
}

impl Recording {
    fn new(script: Script, fixture: &Fixture) -> Recording {
        Recording {
            script,
            state: fixture.state(),
            project: fixture.project(),
            placeholder: None,
            writes: Vec::new(),
            refused: BTreeMap::new(),
            calls: Vec::new(),
        }
    }

    fn note(&mut self, call: Call, baseline: BaselineSeen) {
        let journal = journal_exists(&self.state, &self.project);
        let records = names(&self.state, &self.project);
        self.calls.push(Seen {
            call,
            baseline,
            journal,
            records,
        });
    }

    /// The calls alone, in order.
    fn calls(&self) -> Vec<Call> {
        self.calls.iter().map(|s| s.call).collect()
    }

    fn seen(&self, call: Call) -> &Seen {
        self.calls
            .iter()
            .find(|s| s.call == call)
            .unwrap_or_else(|| panic!("no {call:?} call in {:?}", self.calls()))
    }
}

fn baseline_of(session: &Session) -> BaselineSeen {
    match *session.baseline.lock().unwrap() {
        Baseline::Pending(_) => BaselineSeen::Pending,
        Baseline::Taken(_) => BaselineSeen::Taken,
    }
}

impl Backend for Recording {
    type Started = &'static str;

    fn describe(&self, plan: &Plan) -> serde_json::Value {
        // Seen in the `start` record.
        serde_json::json!({ "fake": plan.command })
    }

    fn start(&mut self, _plan: &Plan, session: &Session) -> anyhow::Result<&'static str> {
        self.note(Call::Start, baseline_of(session));
        if let Some(name) = self.placeholder {
            let path = self.project.join(name);
            std::fs::write(&path, "")?;
            session.made_by_corral(vec![path]);
        }
        match self.script {
            Script::StartFails => anyhow::bail!("the fake jail could not be built"),
            Script::Exits(_) | Script::RunFails => Ok("held"),
        }
    }

    fn run(
        &mut self,
        _plan: &Plan,
        started: &'static str,
        baselined: Baselined,
        session: &Session,
    ) -> anyhow::Result<Ended> {
        assert_eq!(started, "held", "run gets what start returned");
        self.note(Call::Run, baseline_of(session));
        for name in &self.writes {
            std::fs::write(self.project.join(name), "written by the command")?;
        }
        match self.script {
            Script::Exits(code) => Ok(baselined.ended(code)),
            Script::RunFails => anyhow::bail!("the fake command could not be waited for"),
            Script::StartFails => unreachable!("run after a failed start"),
        }
    }

    fn report(&mut self, checked: &Checked) {
        assert_eq!(
            checked.audit().path(),
            audit_path(&self.state, &self.project)
        );
        self.note(Call::Report, BaselineSeen::Checked);
    }

    fn refused(&self) -> BTreeMap<String, u64> {
        // `refused` takes `&self`: its call is noted through a cell.
        REFUSED_CALLS.with(|n| n.set(n.get() + 1));
        self.refused.clone()
    }
}

thread_local! {
    /// How many times `refused` was called on this test's thread.
    static REFUSED_CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A project, a home and corral's state directory, each a directory of its own.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for d in ["project", "home", "state"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("project/README"), "a project\n").unwrap();
        Fixture { dir }
    }

    fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn plan(&self) -> Plan {
        let mut plan = Plan::minimal(
            &self.project(),
            &self.dir.path().join("home"),
            vec!["agent".into()],
        );
        plan.hide = vec![".env".into()];
        plan
    }

    /// A session of `scope` begun and made ready for the jail's mounts (the native backend's
    /// way: the baseline goes on being taken).
    fn session(&self, plan: &Plan, scope: Scope) -> Session {
        Session::begin_in(
            plan,
            scope,
            "fake-1".into(),
            self.state(),
            crate::changes::Source::Walk { why: None },
        )
        .unwrap()
        .ready_for_mounts()
        .unwrap()
    }

    /// Run `backend` in a session of `scope`; the session's result.
    fn run(&self, scope: Scope, backend: &mut Recording) -> anyhow::Result<i32> {
        let plan = self.plan();
        REFUSED_CALLS.with(|n| n.set(0));
        self.session(&plan, scope).run(&plan, backend)
    }

    fn records(&self) -> Vec<JailEvent> {
        let (records, _) = AuditLog::at(audit_path(&self.state(), &self.project()))
            .read_all()
            .unwrap();
        records
            .into_iter()
            .map(|r| {
                assert_eq!(r.jail, "fake-1");
                match r.event {
                    Event::Jail(e) => e,
                    other => panic!("not a jail event: {other:?}"),
                }
            })
            .collect()
    }

    fn names(&self) -> Vec<&'static str> {
        names(&self.state(), &self.project())
    }

    /// The `changes` record's created paths (none without one).
    fn created(&self) -> Vec<String> {
        self.records()
            .into_iter()
            .find_map(|e| match e {
                JailEvent::Changes { detail } => Some(detail),
                _ => None,
            })
            .map(|d| serde_json::from_value(d["created"].clone()).unwrap())
            .unwrap_or_default()
    }
}

fn audit_path(state: &Path, project: &Path) -> PathBuf {
    state
        .join(corral_audit::project_key(project))
        .join("audit.jsonl")
}

/// The audit records so far, by event name.
fn names(state: &Path, project: &Path) -> Vec<&'static str> {
    let log = AuditLog::at(audit_path(state, project));
    if !log.path().exists() {
        return Vec::new();
    }
    let (records, _) = log.read_all().unwrap();
    records
        .iter()
        .map(|r| match &r.event {
            Event::Jail(e) => e.name(),
            _ => "other",
        })
        .collect()
}

/// Whether the project's journal holds an entry.
fn journal_exists(state: &Path, project: &Path) -> bool {
    let dir = state
        .join(corral_audit::project_key(project))
        .join("journal");
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

fn seen(call: Call, baseline: BaselineSeen, journal: bool, records: &[&'static str]) -> Seen {
    Seen {
        call,
        baseline,
        journal,
        records: records.to_vec(),
    }
}

/// The whole run as the backend sees it: started while the baseline is still pending, let run
/// once it is complete, reported after the checks; the journal entry there throughout; the
/// `start` record first, the `exit` record last.
#[test]
fn a_run_calls_the_backend_in_the_order_of_its_phases() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    assert_eq!(fx.run(Scope::Run, &mut backend).unwrap(), 0);
    assert_eq!(
        backend.calls,
        [
            seen(Call::Start, BaselineSeen::Pending, true, &["start"]),
            seen(Call::Run, BaselineSeen::Taken, true, &["start"]),
            seen(Call::Report, BaselineSeen::Checked, true, &["start"]),
        ]
    );
    assert_eq!(REFUSED_CALLS.with(|n| n.get()), 1);
    assert_eq!(fx.names(), ["start", "exit"]);
    assert!(!journal_exists(&fx.state(), &fx.project()));
}

/// The command is let go only once the change baseline is complete, so what it writes is a
/// change of the run: listed.
#[test]
fn what_the_command_writes_after_its_release_is_in_the_change_summary() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    backend.writes = vec!["made-by-agent.txt"];
    fx.run(Scope::Run, &mut backend).unwrap();
    assert_eq!(backend.seen(Call::Run).baseline, BaselineSeen::Taken);
    assert_eq!(fx.created(), ["made-by-agent.txt"]);
    assert_eq!(fx.names(), ["start", "changes", "exit"]);
}

/// A placeholder corral makes while the baseline is being taken (the jail's start) is not a
/// change, whether the baseline saw it or not; the command's own file beside it is.
#[test]
fn placeholders_corral_made_at_the_start_are_not_changes() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    backend.placeholder = Some("placeholder");
    backend.writes = vec!["agent.txt"];
    fx.run(Scope::Run, &mut backend).unwrap();
    assert_eq!(fx.created(), ["agent.txt"]);
}

/// A session made `ready` (the container engines', which cannot hold a command) has the
/// baseline complete before the backend starts anything.
#[test]
fn a_ready_session_has_its_baseline_before_the_backend_starts() {
    let fx = Fixture::new();
    let plan = fx.plan();
    let session = Session::begin_in(
        &plan,
        Scope::Run,
        "fake-1".into(),
        fx.state(),
        crate::changes::Source::Walk { why: None },
    )
    .unwrap()
    .ready()
    .unwrap();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    session.run(&plan, &mut backend).unwrap();
    assert_eq!(backend.seen(Call::Start).baseline, BaselineSeen::Taken);
}

/// The checks look at the final state, after the backend's end and before its report: a
/// hidden name the command made during the run is said (`exposed`) between the two.
#[test]
fn the_checks_come_after_the_end_and_before_the_report() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    backend.writes = vec![".env"];
    fx.run(Scope::Run, &mut backend).unwrap();
    assert_eq!(backend.seen(Call::Run).records, ["start"]);
    assert_eq!(backend.seen(Call::Report).records, ["start", "exposed"]);
    assert_eq!(fx.names(), ["start", "exposed", "changes", "exit"]);
}

/// The exit record carries the command's code (a killed command's 128+N) and the refusals the
/// backend counted, read after its report.
#[test]
fn the_exit_record_has_the_code_and_the_refusals_after_the_report() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(137), &fx);
    backend.refused = BTreeMap::from([("not-http".to_string(), 2)]);
    assert_eq!(fx.run(Scope::Run, &mut backend).unwrap(), 137);
    assert_eq!(
        fx.records().last(),
        Some(&JailEvent::Exit {
            exit_code: 137,
            refused: backend.refused.clone(),
        })
    );
    assert_eq!(REFUSED_CALLS.with(|n| n.get()), 1);
}

/// A jail that cannot be built: no run, but the checks and the report still come, then the
/// error record (exit 125), and the journal entry goes.
#[test]
fn a_failed_start_still_ends_in_checks_report_and_error_record() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::StartFails, &fx);
    let err = fx.run(Scope::Run, &mut backend).unwrap_err();
    assert_eq!(err.to_string(), "the fake jail could not be built");
    assert_eq!(backend.calls(), [Call::Start, Call::Report]);
    assert_eq!(
        fx.records().last(),
        Some(&JailEvent::Error {
            exit_code: 125,
            detail: "the fake jail could not be built".into(),
        })
    );
    assert_eq!(REFUSED_CALLS.with(|n| n.get()), 0);
    assert!(!journal_exists(&fx.state(), &fx.project()));
}

/// A backend that fails after the command was let go: the checks still see what the command
/// did (the change summary, a hidden name), then the report and the error record.
#[test]
fn a_failed_run_still_ends_in_checks_report_and_error_record() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::RunFails, &fx);
    backend.writes = vec![".env", "half.txt"];
    let err = fx.run(Scope::Run, &mut backend).unwrap_err();
    assert_eq!(err.to_string(), "the fake command could not be waited for");
    assert_eq!(backend.calls(), [Call::Start, Call::Run, Call::Report]);
    assert_eq!(backend.seen(Call::Report).records, ["start", "exposed"]);
    assert_eq!(fx.names(), ["start", "exposed", "changes", "error"]);
    assert_eq!(fx.created(), [".env", "half.txt"]);
    assert!(!journal_exists(&fx.state(), &fx.project()));
}

/// The journal entry is written before the backend starts and stays until the report is done;
/// it goes before the exit record.
#[test]
fn the_journal_entry_spans_the_backend_and_the_report() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(3), &fx);
    fx.run(Scope::Run, &mut backend).unwrap();
    assert!(
        backend.calls.iter().all(|s| s.journal),
        "{:?}",
        backend.calls
    );
    assert!(!journal_exists(&fx.state(), &fx.project()));
}

/// Without a journal entry a killed corral would leave the run unchecked: an entry that cannot
/// be written fails the run before the backend starts anything.
#[test]
fn a_journal_that_cannot_be_written_fails_the_run_before_the_backend_starts() {
    let fx = Fixture::new();
    let key = fx.state().join(corral_audit::project_key(&fx.project()));
    std::fs::create_dir_all(&key).unwrap();
    // A file where the journal's directory goes.
    std::fs::write(key.join("journal"), "").unwrap();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    let err = fx.run(Scope::Run, &mut backend).unwrap_err();
    assert!(
        format!("{err:#}").contains("cannot create the journal directory"),
        "{err:#}"
    );
    assert_eq!(backend.calls(), []);
    assert_eq!(fx.names(), ["start", "error"]);
}

/// The control of the test above: the same fixture without the obstacle runs the backend.
#[test]
fn a_writable_journal_lets_the_backend_start() {
    let fx = Fixture::new();
    let key = fx.state().join(corral_audit::project_key(&fx.project()));
    std::fs::create_dir_all(&key).unwrap();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    fx.run(Scope::Run, &mut backend).unwrap();
    assert_eq!(backend.calls(), [Call::Start, Call::Run, Call::Report]);
}

/// An executor command's session: no baseline, no journal entry (its run's session checks once
/// the executor ended); the backend is still called in order.
#[test]
fn an_executor_command_session_takes_no_baseline_and_writes_no_journal() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    backend.writes = vec!["by-command.txt"];
    fx.run(Scope::ExecutorCommand, &mut backend).unwrap();
    assert_eq!(
        backend.calls,
        [
            seen(Call::Start, BaselineSeen::Pending, false, &["start"]),
            seen(Call::Run, BaselineSeen::Taken, false, &["start"]),
            seen(Call::Report, BaselineSeen::Checked, false, &["start"]),
        ]
    );
    assert_eq!(fx.names(), ["start", "exit"]);
}

/// A run whose project is a volume elsewhere (Kubernetes): no journal entry, no change summary.
#[test]
fn a_remote_session_writes_no_journal_and_lists_no_changes() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    backend.writes = vec!["remote.txt"];
    fx.run(Scope::Remote, &mut backend).unwrap();
    assert!(backend.calls.iter().all(|s| !s.journal));
    assert_eq!(fx.names(), ["start", "exit"]);
}

/// The `start` record holds what the backend describes.
#[test]
fn the_start_record_is_the_backends_description() {
    let fx = Fixture::new();
    let mut backend = Recording::new(Script::Exits(0), &fx);
    fx.run(Scope::Run, &mut backend).unwrap();
    assert_eq!(
        fx.records().first(),
        Some(&JailEvent::Start {
            detail: serde_json::json!({ "fake": ["agent"] }),
        })
    );
}

/// The phases' values are the session's to make: [`Baselined`] only from
/// [`Session::await_baseline`], which waits for the baseline it proves.
#[test]
fn await_baseline_takes_the_baseline_it_proves() {
    let fx = Fixture::new();
    let plan = fx.plan();
    let session = fx.session(&plan, Scope::Run);
    assert_eq!(baseline_of(&session), BaselineSeen::Pending);
    let _baselined: Baselined = session.await_baseline();
    assert_eq!(baseline_of(&session), BaselineSeen::Taken);
    assert!(session.take_baseline().is_some());
}
