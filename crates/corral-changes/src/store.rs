//! The store: `STATE_DIR/changes/PROJECT_KEY/RUN_ID/`, one directory per run, outside the
//! project (no ref, object or index of the user's repository is touched):
//! - `meta.json`: the run's id, start, command, budget (and, for an undo, the run it undid);
//! - `manifest.jsonl`: one line per path the run changed, with what it was before;
//! - `bN`: the content of a file before the run changed it (a reflink or a copy);
//! - `after.json`: once the run ended, what each path was then (a file with its SHA-256);
//! - `incomplete`: the run changed more than the budget keeps (it cannot be undone);
//! - `undone`: `corral undo` put the project back from it.

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::bytes::Bytes;
use crate::path;
use crate::record::{Line, RunRecord};
use crate::state::{self, State};
use crate::sys;
use crate::{ChangesError, Result};

pub(crate) const META: &str = "meta.json";
pub(crate) const MANIFEST: &str = "manifest.jsonl";
pub(crate) const AFTER: &str = "after.json";
pub(crate) const INCOMPLETE: &str = "incomplete";
pub(crate) const UNDONE: &str = "undone";
/// The bytes a finished run's record takes (written once it is complete: pruning reads this,
/// not every blob's size).
pub(crate) const SIZE: &str = "size";

/// How much the store keeps per project: the newest `runs` runs within `bytes` bytes (older
/// runs are removed first). The defaults: 20 runs, 2 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub runs: usize,
    pub bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            runs: 20,
            bytes: 2 << 30,
        }
    }
}

/// What a run directory says about its run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunMeta {
    pub id: String,
    /// RFC 3339, UTC.
    pub started: String,
    /// Milliseconds since the epoch (runs sort by it).
    pub started_ms: u64,
    pub command: Vec<String>,
    /// The project's root as the host names it.
    pub project: String,
    /// Bytes of file content the record keeps at most for this run.
    pub budget: u64,
    /// For the record of an undo: the run it put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undoes: Option<String>,
}

/// `after.json`: the project once the run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct After {
    pub finished: String,
    pub paths: Vec<AfterLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AfterLine {
    pub path: Bytes,
    pub after: State,
    /// Whether it differs from what it was before the run.
    pub changed: bool,
}

/// A path the run changed: what it was before the run, and what it is at its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: Vec<u8>,
    pub before: State,
    pub after: State,
}

/// `undone`: which record put the project back, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Undone {
    pub by: String,
    pub at: String,
}

/// One run as `corral log --runs` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunInfo {
    pub meta: RunMeta,
    /// `None` while the run goes on (or if corral died before its end).
    pub finished: Option<String>,
    pub created: usize,
    pub modified: usize,
    pub deleted: usize,
    /// Bytes the record takes in the store.
    pub bytes: u64,
    /// Why the run cannot be undone from its record, if it cannot (over budget).
    pub incomplete: Option<String>,
    /// The id of the undo that put the project back from this run.
    pub undone_by: Option<String>,
}

/// The change records of one project.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store of the project `project_key` (corral_audit::project_key) under `state_dir`,
    /// made (mode 0700) when absent.
    pub fn open(state_dir: &Path, project_key: &str) -> Result<Store> {
        if project_key.is_empty() || project_key.contains('/') || project_key.starts_with('.') {
            return Err(ChangesError::Damaged {
                path: project_key.into(),
                why: "not a project key".into(),
            });
        }
        let root = state_dir.join("changes").join(project_key);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(|e| ChangesError::io("create the change record", &root, e))?;
        Ok(Store { root })
    }

    /// The store of `project_key` as it is: no directory is made (`corral log --runs`,
    /// `corral doctor`). A store never written to has no runs.
    pub fn at(state_dir: &Path, project_key: &str) -> Result<Store> {
        let store = Store {
            root: state_dir.join("changes").join(project_key),
        };
        if project_key.is_empty() || project_key.contains('/') || project_key.starts_with('.') {
            return Err(ChangesError::Damaged {
                path: project_key.into(),
                why: "not a project key".into(),
            });
        }
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Start the record of a run of `command` in `project`, first pruning older runs so that
    /// this one fits `retention`. The run may keep up to `retention.bytes` of file content.
    pub fn begin(
        &self,
        command: &[String],
        project: &Path,
        retention: Retention,
    ) -> Result<RunRecord> {
        self.begin_with(command, project, retention, None)
    }

    pub(crate) fn begin_with(
        &self,
        command: &[String],
        project: &Path,
        retention: Retention,
        undoes: Option<String>,
    ) -> Result<RunRecord> {
        // Room for this run; never the run an undo is about to read.
        self.prune(
            Retention {
                runs: retention.runs.saturating_sub(1),
                ..retention
            },
            undoes.as_deref(),
        )?;
        let now = std::time::SystemTime::now();
        let started_ms = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let stamp = humantime::format_rfc3339_seconds(now).to_string();
        // YYYYMMDD-HHMMSS-mmm: sorts as the runs started; typed by people (`corral undo ID`).
        let digits: String = stamp.chars().filter(|c| c.is_ascii_digit()).collect();
        let (day, time) = digits.split_at(8.min(digits.len()));
        let base = format!("{day}-{time}-{:03}", started_ms % 1000);
        // Made again if the last run's end removed it meanwhile.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(|e| ChangesError::io("create the change record", &self.root, e))?;
        let (id, dir) = (0..1000)
            .find_map(|n| {
                let id = match n {
                    0 => base.clone(),
                    n => format!("{base}.{n}"),
                };
                let dir = self.root.join(&id);
                match fs::DirBuilder::new().mode(0o700).create(&dir) {
                    Ok(()) => Some(Ok((id, dir))),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => None,
                    Err(e) => Some(Err(ChangesError::io("create the run's record", &dir, e))),
                }
            })
            .unwrap_or_else(|| {
                Err(ChangesError::Damaged {
                    path: self.root.display().to_string(),
                    why: "no free run id".into(),
                })
            })?;
        let meta = RunMeta {
            id,
            started: stamp,
            started_ms,
            command: command.to_vec(),
            project: project.display().to_string(),
            budget: retention.bytes,
            undoes,
        };
        write_json(&dir.join(META), &meta)?;
        fs::File::create(dir.join(MANIFEST))
            .map_err(|e| ChangesError::io("create the manifest", &dir, e))?;
        let fd = open_dir(&dir)?;
        RunRecord::from_dir_fd(fd).map_err(|e| ChangesError::io("open the run's record", &dir, e))
    }

    /// Record what each path the run changed is now (`project`: the project's root), so
    /// that undo can tell a later change on the host; then prune to `retention`.
    pub fn finish(&self, id: &str, project: BorrowedFd, retention: Retention) -> Result<RunInfo> {
        self.finish_listed(id, project, retention)
            .map(|(info, _)| info)
    }

    /// [`Self::finish`], with every path that differs from what it was before the run (what
    /// the change summary lists), in the manifest's order.
    pub fn finish_listed(
        &self,
        id: &str,
        project: BorrowedFd,
        retention: Retention,
    ) -> Result<(RunInfo, Vec<Change>)> {
        let dir = self.run_dir(id)?;
        let lines = self.manifest(id)?;
        let mut paths = Vec::with_capacity(lines.len());
        let mut changes = Vec::new();
        for line in lines {
            let after = state::at_path(project, &line.path.0).map_err(|e| {
                ChangesError::io("inspect", Path::new(&bytes_path(&line.path.0)), e)
            })?;
            let changed = self.changed(&dir, &line.before, &after)?;
            if changed {
                changes.push(Change {
                    path: line.path.0.clone(),
                    before: line.before,
                    after: after.clone(),
                });
            }
            paths.push(AfterLine {
                path: line.path,
                after,
                changed,
            });
        }
        let finished = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        if paths.iter().all(|l| !l.changed) {
            let meta: RunMeta = read_json(&dir.join(META))?;
            let (incomplete, undone_by) = marks(&dir);
            if meta.undoes.is_none() && incomplete.is_none() {
                // Nothing to undo: no record kept (`corral undo` then means the last run that
                // changed something), and nothing written to say so (its `after.json` and
                // `size` would be removed at once).
                let info = RunInfo {
                    finished: Some(finished),
                    meta,
                    created: 0,
                    modified: 0,
                    deleted: 0,
                    bytes: dir_bytes_path(&dir)?,
                    incomplete,
                    undone_by,
                };
                fs::remove_dir_all(&dir)
                    .map_err(|e| ChangesError::io("remove an empty run's record", &dir, e))?;
                return Ok((info, changes));
            }
        }
        let after = After { finished, paths };
        write_json(&dir.join(AFTER), &after)?;
        let bytes = dir_bytes_path(&dir)?;
        fs::write(dir.join(SIZE), bytes.to_string())
            .map_err(|e| ChangesError::io("write", &dir.join(SIZE), e))?;
        let info = self.run(id)?;
        self.prune(retention, Some(id))?;
        Ok((info, changes))
    }

    /// Does `after` differ from `before` (a file: by content, the blob hashed)?
    fn changed(&self, dir: &Path, before: &State, after: &State) -> Result<bool> {
        Ok(match (before, after) {
            (
                State::File {
                    mode: m1,
                    blob: Some(blob),
                    ..
                },
                State::File {
                    mode: m2,
                    sha256: Some(h2),
                    ..
                },
            ) => {
                let f = fs::File::open(dir.join(blob))
                    .map_err(|e| ChangesError::io("read the kept file", &dir.join(blob), e))?;
                let h1 = sys::sha256(f.as_fd())
                    .map_err(|e| ChangesError::io("read the kept file", &dir.join(blob), e))?;
                m1 != m2 || &h1 != h2
            }
            // No content kept (over the record's budget): by metadata. The same inode with
            // the same size, mtime and ctime (which no one can set back) is unwritten.
            (
                State::File {
                    mode: m1,
                    size: s1,
                    blob: None,
                    stat: Some(b),
                    ..
                },
                State::File {
                    mode: m2,
                    size: s2,
                    stat: Some(a),
                    ..
                },
            ) => m1 != m2 || s1 != s2 || !b.same_file_times(a),
            (State::File { blob: None, .. }, _) => true,
            (b, a) => b != a,
        })
    }

    /// Every run recorded, oldest first.
    pub fn runs(&self) -> Result<Vec<RunInfo>> {
        let mut out = Vec::new();
        for id in self.ids()? {
            out.push(self.run(&id)?);
        }
        out.sort_by(|a, b| (a.meta.started_ms, &a.meta.id).cmp(&(b.meta.started_ms, &b.meta.id)));
        Ok(out)
    }

    /// The run `id`.
    pub fn run(&self, id: &str) -> Result<RunInfo> {
        let dir = self.run_dir(id)?;
        let meta: RunMeta = read_json(&dir.join(META))?;
        let after = self.after(id)?;
        let (mut created, mut modified, mut deleted) = (0, 0, 0);
        if let Some(after) = &after {
            let before: std::collections::HashMap<Vec<u8>, State> = self
                .manifest(id)?
                .into_iter()
                .map(|l| (l.path.0, l.before))
                .collect();
            for line in after.paths.iter().filter(|l| l.changed) {
                match (before.get(&line.path.0), &line.after) {
                    (Some(State::Absent), State::Absent) => {}
                    (Some(State::Absent), _) => created += 1,
                    (Some(_), State::Absent) => deleted += 1,
                    _ => modified += 1,
                }
            }
        }
        let (incomplete, undone_by) = marks(&dir);
        let bytes = run_bytes(&dir)?;
        Ok(RunInfo {
            finished: after.map(|a| a.finished),
            meta,
            created,
            modified,
            deleted,
            bytes,
            incomplete,
            undone_by,
        })
    }

    /// Runs and bytes the store holds now.
    pub fn usage(&self) -> Result<(usize, u64)> {
        let runs = self.runs()?;
        Ok((runs.len(), runs.iter().map(|r| r.bytes).sum()))
    }

    /// Remove the oldest runs (never `keep`) until at most `retention.runs` remain within
    /// `retention.bytes`. Returns the ids removed.
    pub fn prune(&self, retention: Retention, keep: Option<&str>) -> Result<Vec<String>> {
        // Each run's meta and size only (not its manifest): this runs before every run.
        let mut runs = Vec::new();
        for id in self.ids()? {
            let dir = self.root.join(&id);
            let meta: RunMeta = read_json(&dir.join(META))?;
            runs.push((meta, run_bytes(&dir)?));
        }
        runs.sort_by(|(a, _), (b, _)| (a.started_ms, &a.id).cmp(&(b.started_ms, &b.id)));
        let mut count = runs.len();
        let mut total: u64 = runs.iter().map(|(_, b)| b).sum();
        let mut removed = Vec::new();
        for (meta, bytes) in &runs {
            if count <= retention.runs && total <= retention.bytes {
                break;
            }
            if Some(meta.id.as_str()) == keep {
                continue;
            }
            let dir = self.root.join(&meta.id);
            fs::remove_dir_all(&dir)
                .map_err(|e| ChangesError::io("remove an old run's record", &dir, e))?;
            count -= 1;
            total -= (*bytes).min(total);
            removed.push(meta.id.clone());
        }
        Ok(removed)
    }

    /// The ids of the runs recorded (directories with a `meta.json`), in no order.
    fn ids(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(ChangesError::io("list the change record", &self.root, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| ChangesError::io("list", &self.root, e))?;
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if id.starts_with('.') || !entry.path().join(META).exists() {
                continue;
            }
            out.push(id.to_string());
        }
        Ok(out)
    }

    pub(crate) fn run_dir(&self, id: &str) -> Result<PathBuf> {
        let ok = !id.is_empty()
            && !id.starts_with('.')
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        let dir = self.root.join(id);
        if !ok || !dir.join(META).exists() {
            return Err(ChangesError::NoRun(id.to_string()));
        }
        Ok(dir)
    }

    pub(crate) fn manifest(&self, id: &str) -> Result<Vec<Line>> {
        let dir = self.run_dir(id)?;
        let fd = open_dir(&dir)?;
        read_manifest_at(fd.as_fd()).map_err(|e| ChangesError::io("read the manifest", &dir, e))
    }

    pub(crate) fn after(&self, id: &str) -> Result<Option<After>> {
        let path = self.run_dir(id)?.join(AFTER);
        match path.exists() {
            true => read_json(&path).map(Some),
            false => Ok(None),
        }
    }

    pub(crate) fn mark_undone(&self, id: &str, by: &str) -> Result<()> {
        let undone = Undone {
            by: by.to_string(),
            at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        };
        write_json(&self.run_dir(id)?.join(UNDONE), &undone)
    }

    pub(crate) fn clear_undone(&self, id: &str) -> Result<()> {
        let path = self.run_dir(id)?.join(UNDONE);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ChangesError::io("clear the undone mark", &path, e)),
        }
    }

    pub(crate) fn blob(&self, id: &str, blob: &str) -> Result<fs::File> {
        if !blob.starts_with('b') || !blob[1..].chars().all(|c| c.is_ascii_digit()) {
            return Err(ChangesError::Damaged {
                path: blob.into(),
                why: "not a blob name".into(),
            });
        }
        let path = self.run_dir(id)?.join(blob);
        fs::File::open(&path).map_err(|e| ChangesError::io("read the kept file", &path, e))
    }
}

/// The run directory `dir`'s marks: why it is incomplete, and the undo that put it back.
/// Marks that cannot be read count as set: an incomplete run, an undone one (undo refuses
/// either way).
fn marks(dir: &Path) -> (Option<String>, Option<String>) {
    let incomplete = match fs::read_to_string(dir.join(INCOMPLETE)) {
        Ok(s) => Some(s.trim().to_string()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("its incomplete mark cannot be read: {e}")),
    };
    let undone_by = match fs::read(dir.join(UNDONE)) {
        Ok(b) => Some(
            serde_json::from_slice::<Undone>(&b)
                .map(|u| u.by)
                .unwrap_or_else(|_| "?".into()),
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(_) => Some("?".into()),
    };
    (incomplete, undone_by)
}

/// `rel` for a message.
pub(crate) fn bytes_path(rel: &[u8]) -> String {
    crate::bytes::encode(rel)
}

pub(crate) fn open_dir(dir: &Path) -> Result<OwnedFd> {
    fs::File::open(dir)
        .map(OwnedFd::from)
        .map_err(|e| ChangesError::io("open", dir, e))
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let body = serde_json::to_vec_pretty(value).map_err(|e| ChangesError::Damaged {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, body).map_err(|e| ChangesError::io("write", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| ChangesError::io("write", path, e))
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let body = fs::read(path).map_err(|e| ChangesError::io("read", path, e))?;
    serde_json::from_slice(&body).map_err(|e| ChangesError::Damaged {
        path: path.display().to_string(),
        why: e.to_string(),
    })
}

pub(crate) fn read_json_at<T: DeserializeOwned>(dir: BorrowedFd, name: &str) -> io::Result<T> {
    let f = fs::File::from(sys::openat(dir, name.as_bytes(), libc::O_RDONLY, 0)?);
    serde_json::from_reader(io::BufReader::new(f)).map_err(io::Error::other)
}

/// The manifest's lines; a last line cut short (the run died mid-write) is damage too: any
/// line that does not parse, or names a path the record could not have written, is an error.
pub(crate) fn read_manifest_at(dir: BorrowedFd) -> io::Result<Vec<Line>> {
    read_manifest_with(dir, false)
}

/// [`read_manifest_at`] of a record other writers may be appending to (an executor command's
/// jail joining its run's record while the run's jail writes): a last line with no newline yet
/// is one being written, left out (it is read whole at the end).
pub(crate) fn read_manifest_growing(dir: BorrowedFd) -> io::Result<Vec<Line>> {
    read_manifest_with(dir, true)
}

fn read_manifest_with(dir: BorrowedFd, growing: bool) -> io::Result<Vec<Line>> {
    let mut f = fs::File::from(sys::openat(dir, MANIFEST.as_bytes(), libc::O_RDONLY, 0)?);
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut f, &mut bytes)?;
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // After the last newline: nothing when every line is whole.
    if lines.last().is_some_and(|l| l.is_empty() || growing) {
        lines.pop();
    }
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for line in lines {
        let parsed: Line = serde_json::from_slice(line).map_err(io::Error::other)?;
        if !path::valid(&parsed.path.0) {
            return Err(io::Error::other(format!(
                "the manifest names a path outside the project: {}",
                bytes_path(&parsed.path.0)
            )));
        }
        // Several writers (the run's jail, its executor commands' jails) may each note a
        // path: each appends its line before it changes the path, so the first line is what
        // the path was before the run.
        if seen.insert(parsed.path.0.clone()) {
            out.push(parsed);
        }
    }
    Ok(out)
}

/// Bytes the files of the run directory `dir` take.
pub(crate) fn dir_bytes(dir: BorrowedFd) -> io::Result<u64> {
    let mut total = 0;
    for name in sys::list(dir)? {
        if let Ok(st) = sys::fstatat(dir, &name, 0) {
            total += st.st_size as u64;
        }
    }
    Ok(total)
}

/// The bytes the run directory `dir` takes: as its `size` says once finished, else measured.
fn run_bytes(dir: &Path) -> Result<u64> {
    match fs::read_to_string(dir.join(SIZE)) {
        Ok(s) => s.trim().parse().map_err(|_| ChangesError::Damaged {
            path: dir.join(SIZE).display().to_string(),
            why: "not a size".into(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => dir_bytes_path(dir),
        Err(e) => Err(ChangesError::io("read", &dir.join(SIZE), e)),
    }
}

fn dir_bytes_path(dir: &Path) -> Result<u64> {
    let fd = open_dir(dir)?;
    dir_bytes(fd.as_fd()).map_err(|e| ChangesError::io("measure", dir, e))
}
