//! `corral undo`: put the project back as it was before a run, from the run's record.
//!
//! Nothing is written unless every path the run changed is still what the run left (a file by
//! its SHA-256), no later run that is not undone touched the same paths, and every directory
//! to remove holds only names the run made. Then, deepest first, what must go is removed;
//! shallowest first, what was there is made again; deepest first, directories get their modes
//! back. Every step works on a directory opened beneath the project with no symlink on the
//! way (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), on one name that is never followed:
//! a symlink planted where a file was is removed, never written through. The undo keeps a
//! record of its own (a run whose `undoes` names the run), so it can be undone in turn.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::path;
use crate::record::{Place, RunRecord};
use crate::state::{self, State};
use crate::store::{Retention, RunInfo, Store, bytes_path};
use crate::sys;
use crate::{ChangesError, Result};

/// How to undo.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Put back even paths changed on the host since the run (their current content is
    /// kept in the undo's own record, so `corral undo` of the undo brings it back).
    pub force: bool,
    /// Retention for the undo's own record.
    pub retention: Retention,
}

/// One reason the undo cannot go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The project-relative path (escaped as the record writes it).
    pub path: String,
    pub why: String,
}

/// What [`undo`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The undo's own record (a run id): `corral undo ID` redoes the run.
    pub record: String,
    pub removed: usize,
    pub restored: usize,
}

/// Why [`undo`] refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    #[error("run {run} cannot be undone: {why}")]
    Refused { run: String, why: String },
    #[error(transparent)]
    Store(#[from] ChangesError),
    #[error(
        "undo stopped at {path}: {cause} (the project is partly put back; the undo's own record {record} holds what it changed)"
    )]
    Midway {
        path: String,
        record: String,
        cause: std::io::Error,
    },
}

fn conflicts_message(c: &[Conflict]) -> String {
    let mut s = format!(
        "undo refused: {} path(s) would lose changes made after the run:",
        c.len()
    );
    for c in c.iter().take(50) {
        s.push_str(&format!("\n  {}: {}", c.path, c.why));
    }
    if c.len() > 50 {
        s.push_str(&format!("\n  ... and {} more", c.len() - 50));
    }
    s
}

/// Put `project` (its root, as the run's record names it) back as it was before the run
/// `id`. See the module's doc for what is checked first.
pub fn undo(
    store: &Store,
    id: &str,
    project: &Path,
    opts: Options,
) -> std::result::Result<Report, UndoError> {
    let info = store.run(id)?;
    refuse_unless_undoable(&info)?;
    let before = store.manifest(id)?;
    let after = store.after(id)?.ok_or_else(|| UndoError::Refused {
        run: id.into(),
        why: "it has not finished (its record has no end state)".into(),
    })?;
    let after: HashMap<Vec<u8>, State> = after
        .paths
        .into_iter()
        .map(|l| (l.path.0, l.after))
        .collect();
    let plan: BTreeMap<Vec<u8>, (State, State)> = before
        .into_iter()
        .map(|l| {
            let a = after.get(&l.path.0).cloned().unwrap_or(State::Absent);
            (l.path.0, (l.before, a))
        })
        .collect();
    let mut conflicts = later_runs(store, &info, &plan)?;
    let root = fs::File::open(project)
        .map(OwnedFd::from)
        .map_err(|e| ChangesError::io("open the project", project, e))?;
    if !opts.force {
        conflicts.extend(host_changes(root.as_fd(), &plan)?);
    }
    conflicts.extend(foreign_entries(root.as_fd(), &plan)?);
    if !conflicts.is_empty() {
        return Err(UndoError::Conflicts(conflicts));
    }
    let command = vec!["corral".into(), "undo".into(), id.to_string()];
    let record = store.begin_with(&command, project, opts.retention, Some(id.to_string()))?;
    let mut undo = Putting {
        store,
        run: id,
        root: root.as_fd(),
        record: &record,
        removed: 0,
        restored: 0,
    };
    let done = undo.put_back(&plan);
    let (removed, restored) = (undo.removed, undo.restored);
    // Marked first: the finish below may prune this run (the oldest) to make room.
    if done.is_ok() {
        store.mark_undone(id, record.id())?;
    }
    store.finish(record.id(), root.as_fd(), opts.retention)?;
    done?;
    if let Some(undid) = &info.meta.undoes {
        // Undoing an undo redoes that run: it may be undone again (unless it was pruned).
        match store.run(undid) {
            Ok(_) => store.clear_undone(undid)?,
            Err(ChangesError::NoRun(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Report {
        record: record.id().to_string(),
        removed,
        restored,
    })
}

fn refuse_unless_undoable(info: &RunInfo) -> std::result::Result<(), UndoError> {
    let refuse = |why: String| {
        Err(UndoError::Refused {
            run: info.meta.id.clone(),
            why,
        })
    };
    if let Some(by) = &info.undone_by {
        return refuse(format!("it was already undone (by {by})"));
    }
    if let Some(why) = &info.incomplete {
        return refuse(format!("its record is incomplete ({why})"));
    }
    Ok(())
}

/// Later runs, not undone, that touched a path of this one.
fn later_runs(
    store: &Store,
    info: &RunInfo,
    plan: &BTreeMap<Vec<u8>, (State, State)>,
) -> Result<Vec<Conflict>> {
    let mut out = Vec::new();
    for later in store.runs()? {
        let key = (later.meta.started_ms, &later.meta.id);
        if key <= (info.meta.started_ms, &info.meta.id)
            || later.undone_by.is_some()
            || undid_a_later_run(store, info, &later)?
        {
            continue;
        }
        let mut touched: Vec<Vec<u8>> = store
            .manifest(&later.meta.id)?
            .into_iter()
            .map(|l| l.path.0)
            .filter(|p| plan.contains_key(p))
            .collect();
        touched.sort();
        for p in touched.into_iter().take(20) {
            out.push(Conflict {
                path: bytes_path(&p),
                why: format!(
                    "changed again by the later run {} (undo that one first)",
                    later.meta.id
                ),
            });
        }
    }
    Ok(out)
}

/// Is `later` the undo of a run after `info` that it undid (and is still undone by it)? The
/// two cancel out: what the undo changed is back as that run found it.
fn undid_a_later_run(store: &Store, info: &RunInfo, later: &RunInfo) -> Result<bool> {
    let Some(undid) = &later.meta.undoes else {
        return Ok(false);
    };
    let Ok(undid) = store.run(undid) else {
        // Pruned: it was older than everything kept, so older than `info` too.
        return Ok(false);
    };
    Ok(undid.undone_by.as_deref() == Some(later.meta.id.as_str())
        && (undid.meta.started_ms, &undid.meta.id) > (info.meta.started_ms, &info.meta.id))
}

/// Paths that are no longer what the run left.
fn host_changes(
    root: BorrowedFd,
    plan: &BTreeMap<Vec<u8>, (State, State)>,
) -> Result<Vec<Conflict>> {
    let mut out = Vec::new();
    for (rel, (_, after)) in plan {
        let now = state::at_path(root, rel)
            .map_err(|e| ChangesError::io("inspect", Path::new(&bytes_path(rel)), e))?;
        if !now.same_as_after(after) {
            out.push(Conflict {
                path: bytes_path(rel),
                why: format!(
                    "changed since the run (the run left a {}, it is now a {}{})",
                    after.kind(),
                    now.kind(),
                    if now.kind() == after.kind() {
                        " with other content or mode"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    Ok(out)
}

/// Directories to remove (absent, or not directories, before the run) holding a name the
/// run's record does not have: something made since, or by another run. Refused, not lost.
fn foreign_entries(
    root: BorrowedFd,
    plan: &BTreeMap<Vec<u8>, (State, State)>,
) -> Result<Vec<Conflict>> {
    let mut out = Vec::new();
    for (rel, (before, after)) in plan {
        if before.is_dir() || !after.is_dir() {
            continue;
        }
        let Ok(dir) = sys::open_beneath(root, rel, libc::O_RDONLY | libc::O_DIRECTORY) else {
            continue;
        };
        let names = sys::list(dir.as_fd())
            .map_err(|e| ChangesError::io("list", Path::new(&bytes_path(rel)), e))?;
        for name in names {
            let child = path::join(rel, &name);
            if !plan.contains_key(&child) {
                out.push(Conflict {
                    path: bytes_path(&child),
                    why: format!(
                        "is not in the run's record, and undo would remove the directory {} \
                         that holds it",
                        bytes_path(rel)
                    ),
                });
            }
        }
    }
    Ok(out)
}

struct Putting<'a> {
    store: &'a Store,
    run: &'a str,
    root: BorrowedFd<'a>,
    record: &'a RunRecord,
    removed: usize,
    restored: usize,
}

impl Putting<'_> {
    fn put_back(
        &mut self,
        plan: &BTreeMap<Vec<u8>, (State, State)>,
    ) -> std::result::Result<(), UndoError> {
        let mut deepest_first: Vec<&Vec<u8>> = plan.keys().collect();
        deepest_first.sort_by_key(|p| std::cmp::Reverse(path::depth(p)));
        let mut shallowest_first = deepest_first.clone();
        shallowest_first.reverse();
        // What is there and must not stay: removed, deepest first.
        let mut removed_dirs = HashSet::new();
        for rel in &deepest_first {
            let before = &plan[*rel].0;
            if rel.is_empty() {
                continue;
            }
            let now = self.at(rel)?;
            let keep = matches!(
                (before, &now),
                (_, State::Absent) | (State::Dir { .. }, State::Dir { .. })
            );
            if !keep {
                self.remove(rel, now.is_dir())?;
                if now.is_dir() {
                    removed_dirs.insert(*rel);
                }
            }
        }
        // What was there: made again, shallowest first.
        for rel in &shallowest_first {
            let before = &plan[*rel].0;
            if rel.is_empty() || before.is_absent() {
                continue;
            }
            if self.at(rel)?.is_absent() {
                self.make(rel, before)?;
            }
        }
        // Directory modes last, deepest first (a directory made read-only after its content).
        for rel in &deepest_first {
            if let State::Dir { mode } = &plan[*rel].0 {
                self.chmod_dir(rel, *mode)?;
            }
        }
        Ok(())
    }

    fn at(&self, rel: &[u8]) -> std::result::Result<State, UndoError> {
        state::at_path(self.root, rel).map_err(|e| self.midway(rel, e))
    }

    fn midway(&self, rel: &[u8], cause: std::io::Error) -> UndoError {
        UndoError::Midway {
            path: bytes_path(rel),
            record: self.record.id().to_string(),
            cause,
        }
    }

    /// The directory holding `rel`, opened beneath the project with no symlink on the way, and
    /// the last name; the name is kept in the undo's record before it changes.
    fn parent(&self, rel: &[u8]) -> std::result::Result<(OwnedFd, Vec<u8>), UndoError> {
        let (dir, name) = path::split(rel);
        let fd = sys::open_beneath(self.root, dir, libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| self.midway(rel, e))?;
        self.record
            .before_change(Place {
                dir: fd.as_fd(),
                rel_dir: dir,
                name,
            })
            .map_err(|e| self.midway(rel, e))?;
        Ok((fd, name.to_vec()))
    }

    fn remove(&mut self, rel: &[u8], dir: bool) -> std::result::Result<(), UndoError> {
        let (parent, name) = self.parent(rel)?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        sys::unlinkat(parent.as_fd(), &name, flags).map_err(|e| self.midway(rel, e))?;
        self.removed += 1;
        Ok(())
    }

    fn make(&mut self, rel: &[u8], before: &State) -> std::result::Result<(), UndoError> {
        let (parent, name) = self.parent(rel)?;
        let p = parent.as_fd();
        let made = match before {
            State::Absent => Ok(()),
            State::Dir { .. } => sys::mkdirat(p, &name, 0o700),
            State::Symlink { target } => sys::symlinkat(&target.0, p, &name),
            State::Fifo { mode } => sys::mkfifoat(p, &name, *mode & 0o777),
            State::File { mode, blob, .. } => {
                let blob = blob.as_deref().ok_or_else(|| UndoError::Refused {
                    run: self.run.into(),
                    why: format!("the record kept no content for {}", bytes_path(rel)),
                })?;
                let from = self.store.blob(self.run, blob)?;
                sys::openat(
                    p,
                    &name,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                )
                .and_then(|to| {
                    sys::copy_all(from.as_fd(), to.as_fd())?;
                    sys::fchmod(to.as_fd(), *mode)
                })
            }
            State::Other { .. } => {
                return Err(UndoError::Refused {
                    run: self.run.into(),
                    why: format!(
                        "{} was a socket or device node, which undo does not make",
                        bytes_path(rel)
                    ),
                });
            }
        };
        made.map_err(|e| self.midway(rel, e))?;
        self.restored += 1;
        Ok(())
    }

    fn chmod_dir(&mut self, rel: &[u8], mode: u32) -> std::result::Result<(), UndoError> {
        let fd = sys::open_beneath(self.root, rel, libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| self.midway(rel, e))?;
        if state::perm(&sys::fstat(fd.as_fd()).map_err(|e| self.midway(rel, e))?) == mode {
            return Ok(());
        }
        if !rel.is_empty() {
            self.parent(rel)?;
        } else {
            self.record
                .before_change(Place {
                    dir: fd.as_fd(),
                    rel_dir: b"",
                    name: b"",
                })
                .map_err(|e| self.midway(rel, e))?;
        }
        sys::fchmod(fd.as_fd(), mode).map_err(|e| self.midway(rel, e))
    }
}
