//! Review mode (`corral run --review`, `filesystem.review`): the run's writes to the project
//! are held in an overlay's upper directory in corral's state directory
//! (`STATE/review/PROJECT_KEY/`, `corral_policy::plan::ReviewPlan`), the host's project its
//! read-only lower layer; `corral diff` shows them ([`show`]), `corral accept` applies them
//! ([`accept`]), `corral discard` drops them. docs/review.md.
//!
//! The directory holds `meta.json` (what the run started from: the project, the start time,
//! the hide patterns and protected paths, the git refs), `upper/` and `work/` (the overlay's),
//! `started` (its ctime is the run's start on the kernel's clock), `manifest.json` (what the
//! last `corral diff` showed) and `lock` (a run holds it exclusively while it runs; accept and
//! discard take it, so neither runs while a jail can still write the upper directory).

pub mod accept;
mod hostfs;
pub mod show;
pub mod upper;

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use corral_policy::plan::{Plan, ReviewPlan};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// The files of one project's review.
#[derive(Debug, Clone)]
pub struct Paths {
    pub root: PathBuf,
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

impl Paths {
    pub fn of(root: &Path, review: &ReviewPlan) -> Paths {
        Paths {
            root: root.to_path_buf(),
            dir: review.dir.clone(),
            upper: review.upper.clone(),
            work: review.work.clone(),
        }
    }

    /// The review directory of the project at `root` in this environment's state directory.
    pub fn for_project(root: &Path) -> anyhow::Result<Paths> {
        let state = corral_audit::state_dir().context("no state directory for reviews")?;
        Ok(Paths::of(root, &ReviewPlan::for_project(&state, root)))
    }

    fn meta(&self) -> PathBuf {
        self.dir.join("meta.json")
    }
    fn manifest(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }
    fn lock(&self) -> PathBuf {
        self.dir.join("lock")
    }
    fn started(&self) -> PathBuf {
        self.dir.join("started")
    }
    fn start_names(&self) -> PathBuf {
        self.dir.join("start-names")
    }

    /// A review of this project is pending: a run made its directories.
    pub fn pending(&self) -> bool {
        self.meta().exists()
    }
}

/// What a review run started from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    /// The host's project.
    pub root: PathBuf,
    /// The run's start on the kernel's clock (the ctime of `started`, in ns): a host entry
    /// whose ctime is not before it changed since the run started.
    pub started_ns: i128,
    /// The Plan's `filesystem.hide` patterns and protected paths: accept refuses to touch them.
    pub hide: Vec<String>,
    pub protected: Vec<PathBuf>,
    /// The host's git refs when the run started (`.git/HEAD`, `packed-refs`, `refs/**`), a hash.
    pub refs: Option<String>,
}

/// A review run's hold on its directory: released when the run has ended.
pub struct Running {
    _lock: Flock<File>,
    pub paths: Paths,
}

/// Before a review run of `plan` starts: refuse over a pending review (unless
/// `discard_pending`), make the directories, record where the run starts from, and hold the
/// lock for the run. `None` when `plan` is no review run.
pub fn begin(plan: &Plan, discard_pending: bool) -> anyhow::Result<Option<Running>> {
    let Some(review) = &plan.project.review else {
        return Ok(None);
    };
    let paths = Paths::of(&plan.project.root, review);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&paths.dir)
        .with_context(|| format!("cannot create {}", paths.dir.display()))?;
    let lock = lock(&paths)?;
    if paths.pending() {
        if !discard_pending {
            let n = upper::changes(&paths, &[]).map(|c| c.len()).unwrap_or(0);
            bail!(
                "a review of {} is pending ({n} change{}): see it with `corral diff`, then \
                 `corral accept` or `corral discard`; or drop it and start over with \
                 `corral run --review --discard-pending`",
                plan.project.root.display(),
                if n == 1 { "" } else { "s" }
            );
        }
        remove_change_set(&paths)?;
    } else {
        // Left by a start that failed before its record was written: no jail ran over it.
        remove_change_set(&paths)?;
    }
    for d in [&paths.upper, &paths.work] {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(d)
            .with_context(|| format!("cannot create {}", d.display()))?;
    }
    let started = paths.started();
    let _ = fs::remove_file(&started);
    File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&started)
        .with_context(|| format!("cannot create {}", started.display()))?;
    let m = fs::symlink_metadata(&started)?;
    // The names the host's project had when the run started: a file the jail changed that the
    // host deleted meanwhile is not brought back by accept (accept.rs).
    let mut names = Vec::new();
    list_names(&plan.project.root, Path::new(""), &mut names)
        .with_context(|| format!("cannot list {}", plan.project.root.display()))?;
    write_new(&paths.start_names(), &names)?;
    let meta = Meta {
        root: plan.project.root.clone(),
        started_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        hide: plan.hide.clone(),
        protected: plan.protected.clone(),
        refs: git_refs(&plan.project.root)?,
    };
    write_new(&paths.meta(), &serde_json::to_vec_pretty(&meta)?)?;
    Ok(Some(Running { _lock: lock, paths }))
}

/// The lock of a review directory, exclusively, or an error saying a run holds it.
fn lock(paths: &Paths) -> anyhow::Result<Flock<File>> {
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(paths.lock())
        .with_context(|| format!("cannot open {}", paths.lock().display()))?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        anyhow::anyhow!(
            "a review run of {} is in progress ({e}): wait for it to end",
            paths.root.display()
        )
    })
}

/// A pending review, locked: no run can write its upper directory while this is held.
pub struct Pending {
    _lock: Flock<File>,
    pub paths: Paths,
    pub meta: Meta,
}

impl Pending {
    /// The pending review of the project at `root`, or an error saying there is none.
    pub fn open(root: &Path) -> anyhow::Result<Pending> {
        let paths = Paths::for_project(root)?;
        if !paths.pending() {
            bail!("no review of {} is pending", root.display());
        }
        let lock = lock(&paths)?;
        let meta = read_meta(&paths)?;
        Ok(Pending {
            _lock: lock,
            paths,
            meta,
        })
    }

    /// Drop the change set.
    pub fn discard(self) -> anyhow::Result<()> {
        remove_change_set(&self.paths)
    }

    pub(crate) fn save_meta(&self) -> anyhow::Result<()> {
        let tmp = self.paths.dir.join("meta.json.new");
        let _ = fs::remove_file(&tmp);
        write_new(&tmp, &serde_json::to_vec_pretty(&self.meta)?)?;
        fs::rename(&tmp, self.paths.meta())?;
        Ok(())
    }
}

pub fn read_meta(paths: &Paths) -> anyhow::Result<Meta> {
    let bytes = fs::read(paths.meta())
        .with_context(|| format!("cannot read {}", paths.meta().display()))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a review's record", paths.meta().display()))
}

/// Remove the change set (upper, work, records); the lock file stays (a run may wait on it).
fn remove_change_set(paths: &Paths) -> anyhow::Result<()> {
    for f in [
        paths.meta(),
        paths.manifest(),
        paths.started(),
        paths.start_names(),
    ] {
        match fs::remove_file(&f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", f.display())),
        }
    }
    for d in [&paths.upper, &paths.work] {
        remove_tree(d).with_context(|| format!("cannot remove {}", d.display()))?;
    }
    Ok(())
}

/// `rm -rf` of corral's own directory, making each directory writable first (the overlay's
/// work directory leaves mode-000 directories behind).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let m = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !m.is_dir() {
        return fs::remove_file(path);
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))?;
    for e in fs::read_dir(path)? {
        remove_tree(&e?.path())?;
    }
    fs::remove_dir(path)
}

fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A hash of the project's git refs (`HEAD`, `packed-refs`, every file below `refs/`), or
/// `None` when the project has no `.git` directory.
pub fn git_refs(root: &Path) -> anyhow::Result<Option<String>> {
    let git = root.join(".git");
    match fs::symlink_metadata(&git) {
        Ok(m) if m.is_dir() => {}
        _ => return Ok(None),
    }
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut files = Vec::new();
    for name in ["HEAD", "packed-refs"] {
        files.push(PathBuf::from(name));
    }
    collect_files(&git, Path::new("refs"), &mut files)?;
    files.sort();
    for rel in files {
        let bytes = match fs::read(git.join(&rel)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", git.join(&rel).display()));
            }
        };
        ctx.update(rel.as_os_str().as_encoded_bytes());
        ctx.update(&[0]);
        ctx.update(&(bytes.len() as u64).to_le_bytes());
        ctx.update(&bytes);
    }
    Ok(Some(hex(ctx.finish().as_ref())))
}

fn collect_files(base: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let dir = base.join(rel);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    for e in entries {
        let e = e?;
        let r = rel.join(e.file_name());
        if e.file_type()?.is_dir() {
            collect_files(base, &r, out)?;
        } else {
            out.push(r);
        }
    }
    Ok(())
}

/// Every path below `root/rel`, NUL-terminated, links not followed.
fn list_names(root: &Path, rel: &Path, out: &mut Vec<u8>) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    for e in fs::read_dir(root.join(rel))? {
        let e = e?;
        let path = rel.join(e.file_name());
        out.extend_from_slice(path.as_os_str().as_bytes());
        out.push(0);
        if e.file_type()?.is_dir() {
            list_names(root, &path, out)?;
        }
    }
    Ok(())
}

/// The names [`list_names`] recorded when the run started.
pub(crate) fn start_names(paths: &Paths) -> anyhow::Result<std::collections::HashSet<PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = fs::read(paths.start_names())
        .with_context(|| format!("cannot read {}", paths.start_names().display()))?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| PathBuf::from(std::ffi::OsStr::from_bytes(n)))
        .collect())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Running {
    /// The run has ended (every process of it): the lines that say what is held and how to
    /// see, apply or drop it. A run that changed nothing leaves no review behind.
    pub fn finish(self) -> Vec<String> {
        let changes = match upper::changes(&self.paths, &[]) {
            Ok(c) => c,
            Err(e) => {
                return vec![format!(
                    "corral: review: cannot read the change set: {e:#}; `corral discard` drops it"
                )];
            }
        };
        if changes.is_empty() {
            return match remove_change_set(&self.paths) {
                Ok(()) => vec!["corral: review: the run changed nothing in the project".into()],
                Err(e) => vec![format!(
                    "corral: review: the run changed nothing, but its review could not be \
                     removed ({e:#}): `corral discard` drops it"
                )],
            };
        }
        summary(&changes)
    }
}

/// The end-of-run lines of a review run that changed something.
fn summary(changes: &[upper::Change]) -> Vec<String> {
    let mut lines = vec![format!(
        "corral: review: {} change{} held, the project is unchanged:",
        changes.len(),
        if changes.len() == 1 { "" } else { "s" }
    )];
    lines.extend(
        show::stat_lines(changes, 20)
            .into_iter()
            .map(|l| format!("  {l}")),
    );
    lines.push(
        "corral: `corral diff` shows them, `corral accept [PATH...]` applies them (`corral \
         undo` then puts the project back), `corral discard` drops them"
            .into(),
    );
    lines
}
