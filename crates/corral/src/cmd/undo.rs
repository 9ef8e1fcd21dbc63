//! The change record of a run (corral-changes; docs/undo.md): started before the jail, kept by
//! its name gate, finished once nothing the run started can write; `corral undo [RUN]` and
//! `corral log --runs`.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use corral_audit::printable;
use corral_changes::{Retention, RunRecord, Store};
use corral_policy::plan::{Access, Plan};
use corral_session::endlines::say;

use crate::cli::UndoArgs;

/// A run's record while the run goes on.
pub struct Recording {
    store: Store,
    record: RunRecord,
    project: PathBuf,
    retention: Retention,
}

impl Recording {
    /// The descriptor of the run's record for the jail's PID 1.
    pub fn dir_fd(&self) -> anyhow::Result<Arc<OwnedFd>> {
        let fd = self
            .record
            .dir_fd()
            .try_clone_to_owned()
            .context("cannot pass the change record to the jail")?;
        Ok(Arc::new(fd))
    }

    /// Once nothing the run started can write: what each recorded path is now, and a line
    /// saying how to undo the run.
    pub fn finish(self) {
        let done = std::fs::File::open(&self.project)
            .map(OwnedFd::from)
            .map_err(anyhow::Error::from)
            .and_then(|root| {
                Ok(self
                    .store
                    .finish(self.record.id(), root.as_fd(), self.retention)?)
            });
        match done {
            Ok(info) if info.created + info.modified + info.deleted > 0 => say(&format!(
                "corral: run {}: {} created, {} modified, {} deleted in the project; \
                 `corral undo` puts them back, `corral log --runs` lists runs.",
                info.meta.id, info.created, info.modified, info.deleted
            )),
            Ok(_) => {}
            Err(e) => say(&format!(
                "corral: the run's change record could not be finished ({e:#}): it cannot be \
                 undone"
            )),
        }
    }
}

/// The record of `corral accept` (cmd/review.rs) applying a review to `project`: what each
/// entry was before accept changed it, so that `corral undo` undoes the accept. None when the
/// user keeps no record (`undo.keep_runs = 0`).
pub fn begin_accept(command: &[String], project: &Path) -> anyhow::Result<Option<Recording>> {
    let retention = retention();
    if retention.runs == 0 {
        return Ok(None);
    }
    let state = corral_audit::state_dir()?;
    let store = Store::open(&state, &corral_audit::project_key(project))?;
    let record = store.begin(command, project, retention)?;
    Ok(Some(Recording {
        store,
        record,
        project: project.to_path_buf(),
        retention,
    }))
}

impl Recording {
    /// Keep `name` in `dir` (whose path relative to the project is `rel_dir`) before it changes.
    pub fn keep(
        &self,
        dir: std::os::fd::BorrowedFd,
        rel_dir: &Path,
        name: &std::ffi::OsStr,
    ) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        self.record.before_change(corral_changes::Place {
            dir,
            rel_dir: rel_dir.as_os_str().as_bytes(),
            name: name.as_bytes(),
        })
    }
}

/// The record for a run of `plan`, when it can keep one: a native run whose project is
/// writable and whose name gate runs (it performs every change it records). A store that
/// cannot be opened, or that the jail could reach (beneath the project or a bind), is said
/// and the run goes on unrecorded.
pub fn begin(plan: &Plan) -> Option<Recording> {
    if plan.project.access != Access::Rw || plan.project.scratch || retention().runs == 0 {
        // Nothing of the host's to undo, or the user keeps no record (`undo.keep_runs = 0`).
        return None;
    }
    if plan.git.new_repositories {
        say(
            "corral: this run keeps no change record (`filesystem.allow_new_repositories` \
             turns off the name gate that records changes): `corral undo` cannot undo it",
        );
        return None;
    }
    match try_begin(plan) {
        Ok(r) => Some(r),
        Err(e) => {
            say(&format!(
                "corral: this run keeps no change record ({e:#}): `corral undo` cannot undo it"
            ));
            None
        }
    }
}

fn try_begin(plan: &Plan) -> anyhow::Result<Recording> {
    let state = corral_audit::state_dir()?;
    let store = Store::open(&state, &corral_audit::project_key(&plan.project.root))?;
    // The store as the Plan's sources name paths (symlinks resolved): neither inside what the
    // jail sees, nor holding something it sees.
    let changes = std::fs::canonicalize(store.root().parent().unwrap_or(store.root()))
        .context("cannot resolve the change record's directory")?;
    let reachable = std::iter::once(plan.project.root.as_path())
        .chain(plan.mounts.iter().map(|m| m.source.as_path()))
        .find(|src| {
            !src.as_os_str().is_empty() && (changes.starts_with(src) || src.starts_with(&changes))
        });
    if let Some(src) = reachable {
        // Left as it was: the empty directories just made go.
        let _ = std::fs::remove_dir(store.root());
        let _ = std::fs::remove_dir(&changes);
        anyhow::bail!(
            "the change record {} and {}, which the jail sees, hold one another",
            changes.display(),
            src.display()
        );
    }
    let retention = retention();
    let record = store.begin(&plan.command, &plan.project.root, retention)?;
    Ok(Recording {
        store,
        record,
        project: plan.project.root.clone(),
        retention,
    })
}

/// The record's bounds: the user config's `[undo]` (`keep_runs`, `max_size`) where it sets
/// them, else the defaults (20 runs, 2 GiB). A user config that cannot be read was already
/// refused by the run's policy resolution; here it means the defaults.
pub fn retention() -> Retention {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
        return Retention::default();
    };
    let path = corral_policy::resolve::default_user_config(&env, Path::new(&home));
    let undo = match path.exists() {
        true => corral_policy::config::load_policy(&path)
            .ok()
            .and_then(|(pf, _)| pf.undo),
        false => None,
    };
    let d = Retention::default();
    match undo {
        Some(u) => Retention {
            runs: u.keep_runs.unwrap_or(d.runs),
            bytes: u.max_size.map_or(d.bytes, |s| s.0),
        },
        None => d,
    }
}

/// This project's store (not made when absent: it then holds no run).
fn store_here() -> anyhow::Result<(Store, PathBuf)> {
    let root = super::log::project_root()?;
    let state = corral_audit::state_dir()?;
    let store = Store::at(&state, &corral_audit::project_key(&root))?;
    Ok((store, root))
}

/// `corral undo [RUN] [--force]`.
pub fn run(args: UndoArgs) -> anyhow::Result<ExitCode> {
    let (store, root) = store_here()?;
    let id = match args.run {
        Some(id) => id,
        None => last_undoable(&store)?,
    };
    let info = store.run(&id)?;
    if Path::new(&info.meta.project) != root {
        anyhow::bail!(
            "run {id} was recorded for {}, not {}",
            info.meta.project,
            root.display()
        );
    }
    let opts = corral_changes::Options {
        force: args.force,
        retention: retention(),
    };
    let report = corral_changes::undo(&store, &id, &root, opts)?;
    println!(
        "corral: undid run {id}: {} removed, {} put back. `corral undo {}` redoes it.",
        report.removed, report.restored, report.record
    );
    Ok(ExitCode::SUCCESS)
}

/// The newest run that is not undone and is not itself an undo.
fn last_undoable(store: &Store) -> anyhow::Result<String> {
    store
        .runs()?
        .into_iter()
        .rev()
        .find(|r| r.undone_by.is_none() && r.meta.undoes.is_none())
        .map(|r| r.meta.id)
        .context("this project has no recorded run to undo (`corral log --runs` lists runs)")
}

/// `corral log --runs`: the recorded runs, oldest first, and the store's use of its bounds.
pub fn log_runs(json: bool) -> anyhow::Result<ExitCode> {
    let (store, _) = store_here()?;
    let runs = store.runs()?;
    if json {
        for r in &runs {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<20} {:<20} {:>7} {:>8} {:>7} {:>9}  COMMAND",
        "RUN", "STARTED", "CREATED", "MODIFIED", "DELETED", "RECORD"
    );
    for r in &runs {
        let mut command = printable(&r.meta.command.join(" "));
        if let Some(by) = &r.undone_by {
            command.push_str(&format!("  (undone by {by})"));
        }
        if r.incomplete.is_some() {
            command.push_str("  (incomplete: cannot be undone)");
        }
        if r.finished.is_none() {
            command.push_str("  (not finished)");
        }
        println!(
            "{:<20} {:<20} {:>7} {:>8} {:>7} {:>9}  {command}",
            r.meta.id,
            r.meta.started,
            r.created,
            r.modified,
            r.deleted,
            size(r.bytes)
        );
    }
    println!("{}", usage_line(&store)?);
    Ok(ExitCode::SUCCESS)
}

/// "N runs, SIZE kept (at most R runs, B)": for `corral log --runs` and `corral doctor`.
pub fn usage_line(store: &Store) -> anyhow::Result<String> {
    let (runs, bytes) = store.usage()?;
    let keep = retention();
    Ok(format!(
        "change record: {runs} run(s), {} kept in {} (at most {} runs and {}; oldest removed first)",
        size(bytes),
        store.root().display(),
        keep.runs,
        size(keep.bytes)
    ))
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{v:.1} {}", UNITS[unit]),
    }
}

/// `corral doctor`'s line on the change record: this project's use of it and the bounds.
pub fn doctor_check() -> corral_sandbox::probe::Check {
    let (status, detail) = match store_here().and_then(|(store, _)| usage_line(&store)) {
        Ok(line) => (corral_sandbox::probe::Status::Info, line),
        Err(e) => (
            corral_sandbox::probe::Status::Info,
            format!("change record: cannot be read here ({e:#}); runs keep none"),
        ),
    };
    corral_sandbox::probe::Check {
        id: "change_record",
        status,
        detail,
        disables: None,
        fix: None,
    }
}
