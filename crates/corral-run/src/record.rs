//! The change record of a run (corral-changes; docs/undo.md): started before the jail, kept by
//! its name gate, finished once nothing the run started can write. The CLI that reads it
//! (`corral undo`, `corral log --runs`) is the binary's.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use corral_changes::{Change, Retention, RunRecord, Store};
use corral_policy::plan::{Access, Plan};
use corral_session::endlines::say;

/// A run's record while the run goes on. Dropped unfinished (the run failed before its
/// command could start), its directory is removed.
pub struct Recording {
    store: Store,
    record: RunRecord,
    project: PathBuf,
    retention: Retention,
    /// `finish` ran: the record is the run's, kept.
    finished: bool,
}

impl Drop for Recording {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_dir_all(self.dir_path());
            // The project's store too when that was its only run.
            let _ = std::fs::remove_dir(self.store.root());
        }
    }
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

    /// The run's directory in the store, for the executor's command jails, which record
    /// into it too ([`join_run`]).
    pub fn dir_path(&self) -> PathBuf {
        self.store.root().join(self.record.id())
    }

    /// Once nothing the run started can write: what each recorded path is now, and a line
    /// saying how to undo the run. The paths that changed (for the change summary).
    pub fn finish(mut self) -> anyhow::Result<Vec<Change>> {
        self.finished = true;
        let done = std::fs::File::open(&self.project)
            .map(OwnedFd::from)
            .map_err(anyhow::Error::from)
            .and_then(|root| {
                Ok(self
                    .store
                    .finish_listed(self.record.id(), root.as_fd(), self.retention)?)
            });
        match done {
            Ok((info, changes)) => {
                if info.created + info.modified + info.deleted > 0 {
                    say(&format!(
                        "corral: run {}: {} created, {} modified, {} deleted in the project; \
                         `corral undo` puts them back, `corral log --runs` lists runs.",
                        info.meta.id, info.created, info.modified, info.deleted
                    ));
                }
                Ok(changes)
            }
            Err(e) => {
                say(&format!(
                    "corral: the run's change record could not be finished ({e:#}): it cannot \
                     be undone"
                ));
                Err(e.context("the run's change record could not be finished"))
            }
        }
    }

    /// That the jail cannot reach the record (`plan`: the Plan the jail gets, with what the
    /// run attached). If it can after all, the record is dropped (its directory removed) and
    /// the reason given.
    pub fn check_unreachable(self, plan: &Plan) -> Result<Recording, String> {
        match unreachable(plan, &self.store) {
            Ok(()) => Ok(self),
            Err(e) => {
                // Dropped: its directory goes.
                let why = format!("this run keeps no change record ({e:#})");
                say(&format!("corral: {why}: `corral undo` cannot undo it"));
                Err(why)
            }
        }
    }
}

/// The variable that names the run's record directory to the executor's commands (their
/// jails' PID 1 record into it: the run's summary and `corral undo` cover them).
pub const RECORD_ENV: &str = "CORRAL_RUN_RECORD";

/// For an executor command's jail: the run's record directory named by [`RECORD_ENV`], when
/// its run keeps one. One that cannot be opened fails the command (its changes would be
/// missing from the run's record).
pub fn join_run() -> anyhow::Result<Option<Arc<OwnedFd>>> {
    let Some(dir) = std::env::var_os(RECORD_ENV).filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&dir)
        .with_context(|| {
            format!(
                "cannot open the run's change record {}",
                Path::new(&dir).display()
            )
        })?;
    Ok(Some(Arc::new(OwnedFd::from(f))))
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
        finished: false,
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
    if !kept(plan) {
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

/// Whether a run of `plan` means to keep a record ([`begin`] tries to, and says why not when it
/// cannot).
pub fn wanted(plan: &Plan) -> bool {
    kept(plan) && !plan.git.new_repositories
}

/// A writable project, and a user who keeps records.
fn kept(plan: &Plan) -> bool {
    plan.project.access == Access::Rw && !plan.project.scratch && retention().runs > 0
}

fn try_begin(plan: &Plan) -> anyhow::Result<Recording> {
    let state = corral_audit::state_dir()?;
    let store = Store::open(&state, &corral_audit::project_key(&plan.project.root))?;
    unreachable(plan, &store)?;
    let retention = retention();
    let record = store.begin(&plan.command, &plan.project.root, retention)?;
    Ok(Recording {
        store,
        record,
        project: plan.project.root.clone(),
        retention,
        finished: false,
    })
}

/// That the jail of `plan` cannot reach the store (an error when it can).
fn unreachable(plan: &Plan, store: &Store) -> anyhow::Result<()> {
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
    Ok(())
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
