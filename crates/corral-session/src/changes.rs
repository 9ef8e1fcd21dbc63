//! The change summary of a native `corral run`: what the agent created, modified and deleted
//! in the project, printed on stderr when the run ends and recorded in the audit log (a `Jail`
//! event `changes` with the full lists, the `method`, and a `note` saying why a method other
//! than `record` ran).
//!
//! Three methods:
//! - **record**, wherever the run's change record (corral-changes, docs/undo.md) sees every
//!   change the run's processes could make in the project: the jail's name gate notes each
//!   name it creates, opens for writing, truncates, renames, links, removes or chmods, with
//!   what it was before, and the executor's command jails note theirs into the same record.
//!   Nothing lists the project at the start or at the end: the summary is the record's paths
//!   whose state at the end differs from the one before (a file by content, or beyond the
//!   record's budget by size, mode, inode, mtime and ctime; a directory by mode; a symlink by
//!   target). A directory the run created is one `dir/` entry; what lies inside a `.git`
//!   directory is not listed. Ignored files are listed (the record sees them). Not listed:
//!   what the host changed during the run (the record sees only the jail's changes); owners,
//!   times and extended attributes (`chown`, `utimensat`, `setxattr` pass no gate; the git
//!   method never listed them either, it compares content); a file that had several names
//!   before the run and was written through one: that name is listed, not the others.
//!   The record cannot stand for the summary, and one of the two listings below is taken from
//!   the start as before, when no record is kept (a read-only or scratch project,
//!   `undo.keep_runs = 0`, `allow_new_repositories`, a store that cannot be used), the executor
//!   runs on the host or in a compose service, the executor's jail has no name gate, the kernel
//!   has none (Linux 5.19), a read-write bind reaches the project by another path (or another
//!   directory by a path in the project), or a standard descriptor the jail inherits is a
//!   directory or a file
//!   open for writing on the project's file system (`corral run -- cmd > out.txt`, written
//!   with no gate in the way).
//! - **git**, where the project root holds a git repository: the files git reports as modified,
//!   deleted or untracked (not ignored) relative to the index *as it was at the start*, at the
//!   start and at the end, plus a fingerprint (metadata and, within a budget, a SHA-256 of the
//!   content) of every file already dirty at the start, so a further edit of an
//!   already-modified file is still noticed. Ignored untracked entries (a wholly ignored
//!   directory as one `dir/`) that appear or go are listed too; a file changed or created inside
//!   a directory ignored at the start (`node_modules/`, `target/`), or a changed ignored file
//!   (`.env`), is not seen by this method. A small project that the run left as it was skips
//!   the end's git processes ([`Quick`]).
//! - **metadata**, everywhere else (and whenever git cannot be used): one parallel walk of the
//!   whole tree (except `.git`) at each end, comparing type, mode, size, mtime, ctime and inode.
//!   ctime cannot be set from user space, so a write whose mtime was put back is still seen.
//!
//! How git is run, given that the repository may be hostile (a `.git/config` that came with a
//! tarball, or one the user never read): the repository's own configuration is never read.
//! corral copies the index into a private git directory of its own under the state directory
//! (outside the jail), with a `config` corral writes, no hooks, and no objects, and runs
//! `git ls-files` with `GIT_DIR` pointing there and `GIT_WORK_TREE` at the project. So no
//! `core.fsmonitor` command, filter driver (`filter.*.clean`), hook (`post-index-change`),
//! `core.worktree`, `include.path` or `safe.directory` setting of the repository applies;
//! system and global configuration are off too (`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL`),
//! and the few settings that matter are forced with `-c`. `.gitattributes` in the tree still
//! apply, but without a driver configured they only select git's built-in conversions.
//! Comparing against the start's copy of the index also means a change the agent committed
//! (or staged) is still listed. Entries marked assume-unchanged or skip-worktree in the copy
//! are unmarked first, so such a bit cannot hide a change. Anything unusual (a split or sparse
//! index, a SHA-256 repository git rejects, no git) falls back to the metadata method.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use corral_audit::printable;
use serde::Serialize;

/// Files larger than this are compared by metadata only.
const HASH_MAX_FILE: u64 = 8 << 20;
/// Bytes hashed at the start at most; dirty files beyond it are compared by metadata only.
const HASH_BUDGET: u64 = 256 << 20;
/// Entries of a metadata walk at most: beyond, the run has no change summary (a home
/// directory run as a project, say) rather than seconds of walking at both ends.
const WALK_MAX: usize = 1_000_000;
/// Files named one by one in the printed summary before "and N more".
const SHOW_MAX: usize = 50;
/// Up to this many changes fit on the one-line form of the summary.
const ONE_LINE_MAX: usize = 6;

/// What `lstat` says about a path, as far as a change is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    /// `st_mode & S_IFMT`.
    kind: u32,
    /// Permission bits.
    perm: u32,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
}

impl Meta {
    fn of(m: &std::fs::Metadata) -> Meta {
        Meta {
            kind: m.mode() & libc::S_IFMT,
            perm: m.mode() & 0o7777,
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
            ino: m.ino(),
        }
    }

    fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    /// Whether its mtime or ctime is `t` or later (within a racy window that starts at `t`).
    fn changed_since(&self, t: i128) -> bool {
        self.mtime_ns.max(self.ctime_ns) >= t
    }
}

/// Whether the relative path `rel` is not one of `own` (corral's placeholders) nor below one.
fn not_own(rel: &OsString, own: &[OsString]) -> bool {
    !own.iter().any(|o| Path::new(rel).starts_with(o))
}

/// Where the change summary keeps its files for the project at `root`, under corral's state
/// directory `state` (outside the jail): each run's private git directory.
fn changes_dir(state: &Path, root: &Path) -> PathBuf {
    state.join(corral_audit::project_key(root)).join("changes")
}

/// A file of the git method: its metadata, and its content's SHA-256 (regular files within the
/// budget) or link target (symlinks).
#[derive(Debug, Clone)]
struct Fingerprint {
    meta: Meta,
    sha256: Option<Vec<u8>>,
    link: Option<PathBuf>,
}

/// The state of the project when the jail started.
pub struct Baseline {
    root: PathBuf,
    kind: BaselineKind,
    /// Why the git method was not used in a git project.
    note: Option<String>,
}

enum BaselineKind {
    Git {
        /// The shortcut for a run that changed nothing: `None` when it cannot be trusted.
        quick: Option<Quick>,
        repo: Box<PrivateGitDir>,
        /// Every path dirty at the start (relative, as git prints it): `None` when absent.
        start: BTreeMap<OsString, Option<Fingerprint>>,
        /// The ignored untracked entries at the start, a wholly ignored directory as one `dir/`.
        ignored: BTreeSet<OsString>,
    },
    Metadata(HashMap<OsString, Meta>),
    /// The run's change record stands for the summary (nothing was listed at the start):
    /// what it names, once the run's record is finished (`None`: never handed over, the run
    /// did not start).
    Record(Option<anyhow::Result<Vec<Recorded>>>),
}

/// A path the run's change record names as changed (corral-changes `Change`), as the summary
/// needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Relative to the project's root.
    pub path: Vec<u8>,
    pub before: Kind,
    pub after: Kind,
}

/// What a recorded path was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Absent,
    Dir,
    /// A file, a symlink or anything else.
    Other,
}

/// What changed, relative to the project root. Each list sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    pub root: PathBuf,
    /// `record` (the run's change record), `git` or `metadata`.
    pub method: String,
    pub created: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
    /// Why the method is not `record` (the record could not stand for the summary), and why
    /// a git project was compared by metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// corral's own directories (state: audit logs and the change summary's private git
/// directory; config: the trust store) where they lie inside `root`, relative to it: with
/// `--project` they may, and what corral writes there is not the agent's doing.
fn own_dirs(root: &Path) -> Vec<String> {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let home = PathBuf::from(env.get("HOME").cloned().unwrap_or_default());
    let dirs = [
        corral_audit::state_dir().ok(),
        Some(corral_policy::trust::config_dir(&env, &home)),
    ];
    let mut out = Vec::new();
    for d in dirs.into_iter().flatten() {
        let real = d.canonicalize().unwrap_or_else(|_| d.clone());
        for p in [d, real] {
            if let Ok(rel) = p.strip_prefix(root)
                && !rel.as_os_str().is_empty()
            {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}

impl Changes {
    /// These changes without any path inside one of `dirs` (relative to the root), nor a
    /// directory entry (`dir/`, git's form of a wholly ignored directory) that holds one.
    fn without(mut self, dirs: &[String]) -> Changes {
        let keep = |entry: &String| {
            let e = entry.trim_end_matches('/');
            !dirs.iter().any(|d| {
                Path::new(e).starts_with(d) || (entry.ends_with('/') && Path::new(d).starts_with(e))
            })
        };
        self.created.retain(keep);
        self.modified.retain(keep);
        self.deleted.retain(keep);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.modified.is_empty() && self.deleted.is_empty()
    }

    fn total(&self) -> usize {
        self.created.len() + self.modified.len() + self.deleted.len()
    }

    /// The stderr summary: nothing when nothing changed; one line for a few changes; else a
    /// header and one line per file, then "and N more". Names that run code on the host
    /// (hostcode.rs) come first, each named, whatever their number; the others fill up to
    /// [`SHOW_MAX`] lines. Names are escaped (`corral_audit::printable`): a file name cannot
    /// write control sequences to the user's terminal, nor read as another name (bidirectional
    /// and zero-width characters).
    pub fn summary(&self) -> Vec<String> {
        if self.is_empty() {
            return Vec::new();
        }
        let root = printable(&self.root.to_string_lossy());
        let (host, rest): (Vec<_>, Vec<_>) = self
            .items()
            .into_iter()
            .partition(|(_, name)| crate::hostcode::is_host_code(name));
        let mark = |name: &str| {
            if crate::hostcode::is_host_code(name) {
                format!("{} {HOST_CODE_MARK}", printable(name))
            } else {
                printable(name)
            }
        };
        if host.len() + rest.len() <= ONE_LINE_MAX {
            let list: Vec<String> = host
                .iter()
                .chain(&rest)
                .map(|(verb, name)| format!("{verb} {}", mark(name)))
                .collect();
            return vec![format!("corral: changed in {root}: {}", list.join(", "))];
        }
        let mut head = format!(
            "corral: changed in {root}: {} created, {} modified, {} deleted",
            self.created.len(),
            self.modified.len(),
            self.deleted.len()
        );
        if !host.is_empty() {
            head.push_str(&format!(
                "; {} that can run code on the host, listed first",
                host.len()
            ));
        }
        let mut out = vec![head];
        let others = SHOW_MAX.saturating_sub(host.len()).min(rest.len());
        for (verb, name) in host.iter().chain(&rest[..others]) {
            out.push(format!("corral:   {verb:<8} {}", mark(name)));
        }
        if rest.len() > others {
            out.push(format!(
                "corral:   and {} more (corral log --json has the full list)",
                rest.len() - others
            ));
        }
        out
    }

    fn items(&self) -> Vec<(&'static str, &str)> {
        let mut v = Vec::with_capacity(self.total());
        v.extend(self.created.iter().map(|n| ("created", n.as_str())));
        v.extend(self.modified.iter().map(|n| ("modified", n.as_str())));
        v.extend(self.deleted.iter().map(|n| ("deleted", n.as_str())));
        v
    }
}

/// What follows a name in the summary that runs code on the host (hostcode.rs).
pub const HOST_CODE_MARK: &str = "(runs code on the host: check it)";

impl Baseline {
    /// The state of the project at `root` now. `jail_id` names the private git directory.
    /// `git`: the project had a `.git` when the session began (looked at then: corral may
    /// put a placeholder `.git` there for the jail while this runs on its thread).
    /// `why`: why the run's change record does not stand for the summary (the audit's note).
    pub fn take(
        root: &Path,
        jail_id: &str,
        git: bool,
        why: Option<String>,
    ) -> anyhow::Result<Baseline> {
        let root = root.to_path_buf();
        let mut note = why.clone();
        if git {
            match git_baseline(&root, jail_id) {
                Ok(kind) => {
                    return Ok(Baseline {
                        root,
                        kind,
                        note: why,
                    });
                }
                // Not fatal: the metadata method works everywhere. The reason is audited.
                Err(e) => {
                    let git = format!("git not usable: {e:#}");
                    note = Some(match why {
                        Some(w) => format!("{w}; {git}"),
                        None => git,
                    })
                }
            }
        }
        let snap = walk(&root).with_context(|| {
            format!(
                "cannot list the files of {} for the change summary",
                root.display()
            )
        })?;
        Ok(Baseline {
            root,
            kind: BaselineKind::Metadata(snap),
            note,
        })
    }

    /// Compare the project now with the baseline. `own`: paths relative to the root that
    /// corral made for the run (left out of the shortcut's comparison; the caller leaves them
    /// out of the lists).
    pub fn compare(self, own: &[OsString]) -> anyhow::Result<Changes> {
        let mut ch = Changes {
            root: self.root.clone(),
            note: self.note.clone(),
            ..Changes::default()
        };
        match self.kind {
            BaselineKind::Git {
                quick,
                repo,
                start,
                ignored,
            } => {
                ch.method = "git".into();
                let mut quick = quick;
                if let Some(q) = quick.as_mut()
                    && q.unchanged(&self.root, own)
                {
                    // The start's listing holds for the project as it is now.
                    return Ok(ch);
                }
                // The two listings run side by side.
                let (end, ignored_now) = std::thread::scope(|sc| {
                    let ig = sc.spawn(|| repo.ignored());
                    let end = repo.dirty();
                    (end, join(ig))
                });
                let (end, ignored_now) = match (end, ignored_now, quick) {
                    (Ok(end), Ok(ignored_now), _) => (end, ignored_now),
                    // git cannot run now (a full disk, say): the shortcut's walk at the start is
                    // compared by metadata, as the metadata method does.
                    (Err(e), _, Some(q)) | (_, Err(e), Some(q)) => {
                        ch.method = "metadata".into();
                        ch.note = Some(format!(
                            "git not usable at the end ({e:#}): the files git looks at \
                             compared by metadata"
                        ));
                        let mut after = walk_skipping(&self.root, &q.pruned, WALK_MAX, false)
                            .with_context(|| {
                                format!("cannot list the files of {}", self.root.display())
                            })?;
                        // The directories git did not enter, by their own metadata (as the
                        // shortcut's walk has them): one removed or replaced is listed.
                        for dir in &q.pruned {
                            if let Ok(m) = self.root.join(dir).symlink_metadata() {
                                after.insert(dir.clone(), Meta::of(&m));
                            }
                        }
                        let after: HashMap<OsString, Meta> =
                            after.into_iter().filter(|(k, _)| not_own(k, own)).collect();
                        let before: HashMap<OsString, Meta> = q
                            .entries
                            .into_iter()
                            .filter(|(k, _)| not_own(k, own))
                            .collect();
                        diff_metadata(&before, &after, &mut ch);
                        ch.sort();
                        return Ok(ch);
                    }
                    (Err(e), _, None) | (_, Err(e), None) => return Err(e),
                };
                // An ignored entry that appeared or went: a new directory whose own
                // `.gitignore` ignores everything in it is listed, not hidden; a new file in a
                // directory already ignored at the start (`node_modules/`) is not seen.
                for rel in ignored_now.symmetric_difference(&ignored) {
                    let name = String::from_utf8_lossy(rel.as_bytes()).into_owned();
                    let exists = self.root.join(Path::new(rel)).symlink_metadata().is_ok();
                    match (ignored.contains(rel), exists) {
                        (false, true) => ch.created.push(name),
                        (true, false) => ch.deleted.push(name),
                        _ => {}
                    }
                }
                let mut paths: BTreeSet<&OsString> = start.keys().collect();
                paths.extend(end.keys());
                for rel in paths {
                    let now = fingerprint(&self.root.join(Path::new(rel)), None);
                    let name = String::from_utf8_lossy(rel.as_bytes()).into_owned();
                    match start.get(rel) {
                        // Dirty at the start: compare the fingerprints.
                        Some(before) => match (before, &now) {
                            (None, None) => {}
                            (None, Some(_)) => ch.created.push(name),
                            (Some(_), None) => ch.deleted.push(name),
                            (Some(a), Some(b)) => {
                                if !same(a, b, &self.root.join(Path::new(rel))) {
                                    ch.modified.push(name)
                                }
                            }
                        },
                        // Clean (tracked and as in the index) or absent (untracked) at the start.
                        None => match (end[rel], now) {
                            (_, None) => ch.deleted.push(name),
                            (DirtyKind::Untracked, Some(_)) => ch.created.push(name),
                            (DirtyKind::Tracked, Some(_)) => ch.modified.push(name),
                        },
                    }
                }
            }
            BaselineKind::Record(recorded) => {
                ch.method = "record".into();
                match recorded {
                    Some(Ok(paths)) => from_record(&paths, &mut ch),
                    Some(Err(e)) => return Err(e),
                    None => {}
                }
            }
            BaselineKind::Metadata(before) => {
                ch.method = "metadata".into();
                let after = walk(&self.root)
                    .with_context(|| format!("cannot list the files of {}", self.root.display()))?;
                diff_metadata(&before, &after, &mut ch);
            }
        }
        ch.sort();
        Ok(ch)
    }
}

impl Changes {
    fn sort(&mut self) {
        self.created.sort();
        self.modified.sort();
        self.deleted.sort();
    }
}

/// The metadata method's comparison of two walks, into `ch`.
fn diff_metadata(
    before: &HashMap<OsString, Meta>,
    after: &HashMap<OsString, Meta>,
    ch: &mut Changes,
) {
    let label = |rel: &OsString, m: &Meta| {
        let mut s = String::from_utf8_lossy(rel.as_bytes()).into_owned();
        if m.is_dir() {
            s.push('/');
        }
        s
    };
    for (rel, m) in after {
        match before.get(rel) {
            None => ch.created.push(label(rel, m)),
            Some(old) if old.kind != m.kind => ch.modified.push(label(rel, m)),
            // A directory's times and size change with its entries: those are listed
            // themselves.
            Some(old) if m.is_dir() => {
                if old.perm != m.perm {
                    ch.modified.push(label(rel, m))
                }
            }
            Some(old) if old != m => ch.modified.push(label(rel, m)),
            Some(_) => {}
        }
    }
    for (rel, m) in before {
        if !after.contains_key(rel) {
            ch.deleted.push(label(rel, m));
        }
    }
}

/// Whether two fingerprints of one path are the same file content, type and mode. Equal
/// metadata (ctime and inode included) means unwritten; else the content decides where the
/// start has a hash.
fn same(a: &Fingerprint, b: &Fingerprint, path: &Path) -> bool {
    if a.meta == b.meta {
        return true;
    }
    if a.meta.kind != b.meta.kind || a.meta.perm != b.meta.perm {
        return false;
    }
    if a.link.is_some() || b.link.is_some() {
        return a.link == b.link;
    }
    match &a.sha256 {
        Some(h) if a.meta.size == b.meta.size => sha256(path).is_ok_and(|now| &now == h),
        _ => false,
    }
}

/// The fingerprint of `path` (not following a final symlink); `None` when it does not exist.
/// A regular file's content is hashed while `budget` (bytes) allows.
fn fingerprint(path: &Path, budget: Option<&mut u64>) -> Option<Fingerprint> {
    let m = path.symlink_metadata().ok()?;
    let meta = Meta::of(&m);
    let mut fp = Fingerprint {
        meta,
        sha256: None,
        link: None,
    };
    if m.file_type().is_symlink() {
        fp.link = std::fs::read_link(path).ok();
    } else if m.file_type().is_file()
        && let Some(budget) = budget
        && m.size() <= HASH_MAX_FILE
        && m.size() <= *budget
    {
        *budget -= m.size();
        fp.sha256 = sha256(path).ok();
    }
    Some(fp)
}

fn sha256(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(ctx.finish().as_ref().to_vec())
}

/// Every entry under `root` except `root/.git` (relative path → metadata), with every ignore
/// filter off, not following symlinks (`corral_policy::resolve::walk_tree`, as the `hide`
/// search).
fn walk(root: &Path) -> anyhow::Result<HashMap<OsString, Meta>> {
    walk_skipping(root, &[], WALK_MAX, false)
}

/// [`walk`], not entering (nor listing) the directories `skip` (relative to `root`), failing
/// beyond `max` entries.
fn walk_skipping(
    root: &Path,
    skip: &[OsString],
    max: usize,
    every_directory: bool,
) -> anyhow::Result<HashMap<OsString, Meta>> {
    use corral_policy::resolve::{Seen, Step};
    let mut skipped: BTreeSet<PathBuf> = skip.iter().map(|s| root.join(s)).collect();
    skipped.insert(root.join(".git"));
    let count = std::sync::atomic::AtomicUsize::new(0);
    let unreadable = std::sync::atomic::AtomicBool::new(false);
    let (entries, over) = corral_policy::resolve::walk_tree(root, |seen, out| {
        // An unreadable directory is unreadable at both ends: the rest is compared (the
        // metadata method), or the walk fails (`every_directory`: the shortcut, which would
        // take a file changed below it for unchanged; git, which stats tracked paths
        // directly, still sees it).
        let Seen::Entry(entry) = seen else {
            if every_directory {
                unreadable.store(true, std::sync::atomic::Ordering::Relaxed);
                return Step::Stop;
            }
            return Step::Next;
        };
        let path = entry.path();
        if skipped.contains(&path) {
            return Step::Next;
        }
        // Gone since the directory was read: not there at this end.
        let Ok(m) = entry.metadata() else {
            return Step::Next;
        };
        if count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= max {
            return Step::Stop;
        }
        let Ok(rel) = path.strip_prefix(root) else {
            return Step::Next;
        };
        out.push((rel.as_os_str().to_os_string(), Meta::of(&m)));
        if m.is_dir() { Step::Enter } else { Step::Next }
    });
    if unreadable.into_inner() {
        bail!("a directory under {} cannot be read", root.display());
    }
    if over {
        bail!(
            "more than {max} files under {} (CORRAL_CHANGES=off skips this walk)",
            root.display()
        );
    }
    Ok(entries.into_iter().collect())
}

/// How git lists a dirty path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirtyKind {
    /// Modified or deleted relative to the index.
    Tracked,
    /// Not in the index, not ignored.
    Untracked,
}

fn git_baseline(root: &Path, jail_id: &str) -> anyhow::Result<BaselineKind> {
    let state = corral_audit::state_dir()?;
    let private = changes_dir(&state, root).join(jail_id);
    git_baseline_with(root, private, QUICK_RACY_NS)
}

/// [`git_baseline`] with the private git directory at `private` (made when git first runs)
/// and the racy window `racy_ns` of the shortcut.
fn git_baseline_with(root: &Path, private: PathBuf, racy_ns: i128) -> anyhow::Result<BaselineKind> {
    let repo = Box::new(PrivateGitDir::new(root, private)?);
    // The ignored entries are listed beside the rest, then the shortcut's walk is taken.
    let (listed, ignored) = std::thread::scope(|sc| {
        let ig = sc.spawn(|| repo.ignored());
        let listed = repo.ls_files(&["-c", "-m", "-d", "-o"]);
        (listed, join(ig))
    });
    let (listed, ignored) = (listed?, ignored?);
    // The shortcut for small projects only (beyond, its walks cost more than git's listings),
    // and without submodules (whose state lies in the repository's directory, not walked).
    let quick = (listed.len() <= QUICK_LISTED_MAX && !repo.submodules)
        .then(|| Quick::take(root, &ignored, now_ns() - racy_ns))
        .flatten()
        .filter(|q| !q.prunes_any_of(&listed));
    // Bits that make git skip an entry: cleared in the private copy, then listed again.
    // `-v` tags an assume-unchanged entry in lower case, a skip-worktree one `S`/`s`.
    // update-index applies one of these options per call, so one call each.
    let assume: Vec<&OsString> = listed
        .iter()
        .filter(|(tag, _)| tag.is_ascii_lowercase())
        .map(|(_, p)| p)
        .collect();
    let skip: Vec<&OsString> = listed
        .iter()
        .filter(|(tag, _)| tag.eq_ignore_ascii_case(&b'S'))
        .map(|(_, p)| p)
        .collect();
    let unmarked = assume.is_empty() && skip.is_empty();
    let listed = if unmarked {
        listed
    } else {
        for (flag, paths) in [
            ("--no-assume-unchanged", &assume),
            ("--no-skip-worktree", &skip),
        ] {
            if paths.is_empty() {
                continue;
            }
            let mut stdin = Vec::new();
            for p in paths.iter() {
                stdin.extend_from_slice(p.as_bytes());
                stdin.push(0);
            }
            repo.git(&["update-index", flag, "-z", "--stdin"], Some(&stdin))?;
        }
        repo.refresh();
        repo.ls_files(&["-m", "-d", "-o"])?
    };
    let dirty = dirty_paths(listed);
    let start = fingerprints(root, &dirty);
    Ok(BaselineKind::Git {
        quick,
        start,
        repo,
        ignored,
    })
}

/// The fingerprints of the paths dirty at the start (`None`: absent), hashing within
/// [`HASH_BUDGET`].
fn fingerprints(
    root: &Path,
    dirty: &BTreeMap<OsString, DirtyKind>,
) -> BTreeMap<OsString, Option<Fingerprint>> {
    let mut budget = HASH_BUDGET;
    dirty
        .keys()
        .map(|rel| {
            let fp = fingerprint(&root.join(Path::new(rel)), Some(&mut budget));
            (rel.clone(), fp)
        })
        .collect()
}

/// An index larger than this is copied into the private git directory at the start rather than
/// held in memory for the run.
const INDEX_HELD_MAX: u64 = 4 << 20;

/// Files git lists at the start (tracked, and untracked not ignored) at most for the shortcut:
/// on a larger project its two walks cost more CPU than the end's two `git ls-files` (measured:
/// docs/BENCHMARKS.md "In a git project").
const QUICK_LISTED_MAX: usize = 1000;
/// Entries the shortcut's walk takes at most: beyond, the end runs git.
const QUICK_MAX: usize = corral_policy::resolve::SEQUENTIAL_WALK_MAX;
/// A file changed this recently before the start could be changed again by the run within the
/// same timestamp tick (mtime and ctime come from a coarse clock; some file systems keep
/// seconds): the shortcut is then not trusted.
const QUICK_RACY_NS: i128 = 5_000_000_000;

/// The git method's shortcut for a run that changed nothing: a metadata walk (type, mode,
/// size, mtime, ctime, inode) of every entry git looks at, taken at the start once git listed
/// the project. If the same walk at the end finds every entry as it was, then every file git
/// reads is as it was (ctime cannot be set back), so git would list exactly what it listed at
/// the start against the start's copy of the index: no change, and git is not run again. Any
/// difference, however small (a directory's times), and the end runs git as usual.
struct Quick {
    entries: HashMap<OsString, Meta>,
    /// Directories git listed as ignored (`dir/`) without listing anything under them: it did
    /// not enter them (an excluded directory cannot re-include anything below it), so neither
    /// does the walk; their own metadata is compared, times included.
    pruned: Vec<OsString>,
    /// An entry whose mtime or ctime is this or later voids the shortcut ([`QUICK_RACY_NS`]).
    racy_from: i128,
}

impl Quick {
    /// The walk of `root` now, given git's listing of its ignored entries. `None` when it is
    /// too large or fails. An entry whose mtime or ctime is `racy_from` or later voids it at
    /// the end (a change by the run could not be told apart from it: [`QUICK_RACY_NS`]; checked
    /// there, once corral's own placeholders, made meanwhile, are left out).
    fn take(root: &Path, ignored: &BTreeSet<OsString>, racy_from: i128) -> Option<Quick> {
        let pruned: Vec<OsString> = ignored
            .iter()
            .filter(|e| e.as_bytes().ends_with(b"/"))
            .filter(|e| {
                ignored
                    .range::<OsString, _>((
                        std::ops::Bound::Excluded(*e),
                        std::ops::Bound::Unbounded,
                    ))
                    .next()
                    .is_none_or(|next| !next.as_bytes().starts_with(e.as_bytes()))
            })
            .map(|e| OsString::from_vec(e.as_bytes()[..e.len() - 1].to_vec()))
            .collect();
        Some(Quick {
            entries: Quick::walk(root, &pruned)?,
            pruned,
            racy_from,
        })
    }

    fn walk(root: &Path, pruned: &[OsString]) -> Option<HashMap<OsString, Meta>> {
        let mut entries = walk_skipping(root, pruned, QUICK_MAX, true).ok()?;
        for dir in pruned {
            let m = root.join(dir).symlink_metadata().ok()?;
            entries.insert(dir.clone(), Meta::of(&m));
        }
        Some(entries)
    }

    /// Whether a tracked path of `listed` (`ls-files -v` records) lies under a pruned
    /// directory (git lists no such directory as ignored as a whole; if it did, the walk would
    /// miss a change to that file).
    fn prunes_any_of(&self, listed: &[(u8, OsString)]) -> bool {
        if self.pruned.is_empty() {
            return false;
        }
        let tracked: BTreeSet<&[u8]> = listed
            .iter()
            .filter(|(tag, _)| *tag != b'?')
            .map(|(_, p)| p.as_bytes())
            .collect();
        self.pruned.iter().any(|d| {
            let mut below = d.as_bytes().to_vec();
            below.push(b'/');
            tracked
                .range::<[u8], _>((
                    std::ops::Bound::Included(&below[..]),
                    std::ops::Bound::Unbounded,
                ))
                .next()
                .is_some_and(|p| p.starts_with(&below))
        })
    }

    /// Whether the project at `root` is, entry for entry, as the walk found it at the start;
    /// the paths `own` (corral's placeholders, made while the start's walk ran) and what lies
    /// below them left out (of the start's walk too, from here on). False when an entry was
    /// racy at the start.
    fn unchanged(&mut self, root: &Path, own: &[OsString]) -> bool {
        let racy = self
            .entries
            .iter()
            .any(|(k, m)| m.changed_since(self.racy_from) && not_own(k, own));
        if racy {
            return false;
        }
        let Some(mut now) = Quick::walk(root, &self.pruned) else {
            return false;
        };
        for map in [&mut self.entries, &mut now] {
            map.retain(|k, _| not_own(k, own));
        }
        now == self.entries
    }
}

/// The time now, in nanoseconds since the epoch (as `Meta`'s times).
fn now_ns() -> i128 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX)
}

/// The result of a listing thread.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, anyhow::Result<T>>) -> anyhow::Result<T> {
    h.join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("a git listing thread panicked")))
}

/// The dirty paths among `ls-files -v` records (cached entries left out).
fn dirty_paths(listed: Vec<(u8, OsString)>) -> BTreeMap<OsString, DirtyKind> {
    let mut out = BTreeMap::new();
    for (tag, path) in listed {
        match tag.to_ascii_uppercase() {
            b'C' | b'R' => {
                out.insert(path, DirtyKind::Tracked);
            }
            b'?' => {
                out.entry(path).or_insert(DirtyKind::Untracked);
            }
            _ => {}
        }
    }
    out
}

/// corral's own git directory for one run: a copy of the project's index, a config corral
/// wrote, nothing else of the repository's. What it is made of is read when the baseline is
/// taken; the directory itself is made the first time git runs, and removed when dropped.
struct PrivateGitDir {
    dir: PathBuf,
    root: PathBuf,
    /// The project's index at the start (`None`: it had none, or it is large).
    index: Option<Vec<u8>>,
    /// A large index, copied as the directory is made, which is then at once.
    index_file: Option<PathBuf>,
    /// The repository's `info/exclude` at the start.
    exclude: Option<Vec<u8>>,
    /// The repository uses SHA-256 object names.
    sha256: bool,
    /// The project has submodules (`.gitmodules`, or the repository's `modules/`).
    submodules: bool,
    /// Whether the directory was made: the error, as text, when it could not be.
    made: std::sync::OnceLock<Result<(), String>>,
}

impl PrivateGitDir {
    /// The project's index and excludes now, for a directory at `dir`; nothing is written yet.
    fn new(root: &Path, dir: PathBuf) -> anyhow::Result<PrivateGitDir> {
        let gitdir = real_git_dir(root)?;
        // A worktree's own directory holds its index; excludes and config live in the common one.
        let common = match std::fs::read(gitdir.join("commondir")) {
            Ok(c) => gitdir.join(OsString::from_vec(trim(c))),
            Err(_) => gitdir.clone(),
        };
        // The object format is the one thing of the repository's config that the index's
        // layout depends on; nothing else is taken from it.
        let sha256 = std::fs::read(common.join("config")).is_ok_and(|c| {
            let c = String::from_utf8_lossy(&c).to_ascii_lowercase();
            c.lines().any(|l| {
                let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
                l == "objectformat=sha256"
            })
        });
        let index = gitdir.join("index");
        let large = index
            .symlink_metadata()
            .is_ok_and(|m| m.is_file() && m.len() > INDEX_HELD_MAX);
        let repo = PrivateGitDir {
            dir,
            root: root.to_path_buf(),
            index: match large {
                true => None,
                false => read_regular(&index)?,
            },
            index_file: large.then_some(index),
            exclude: read_regular(&common.join("info/exclude"))?,
            sha256,
            submodules: root.join(".gitmodules").symlink_metadata().is_ok()
                || common.join("modules").symlink_metadata().is_ok(),
            made: std::sync::OnceLock::new(),
        };
        if large {
            repo.ensure()?;
        }
        Ok(repo)
    }

    /// Make the directory, once.
    fn ensure(&self) -> anyhow::Result<()> {
        self.made
            .get_or_init(|| self.make().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    /// Make the directory; what it made of it is removed again when a later step fails.
    fn make(&self) -> anyhow::Result<()> {
        let base = self
            .dir
            .parent()
            .context("the private git directory has no parent")?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)
            .with_context(|| format!("cannot create {}", base.display()))?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        self.fill().inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&self.dir);
        })
    }

    /// The directory's content.
    fn fill(&self) -> anyhow::Result<()> {
        for d in ["objects", "refs", "info"] {
            std::fs::create_dir(self.dir.join(d))?;
        }
        std::fs::write(self.dir.join("HEAD"), "ref: refs/heads/corral-changes\n")?;
        let config = if self.sha256 {
            "[core]\n\trepositoryformatversion = 1\n\tbare = false\n[extensions]\n\tobjectformat = sha256\n"
        } else {
            "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        };
        std::fs::write(self.dir.join("config"), config)?;
        if let Some(index) = &self.index_file {
            copy_regular(index, &self.dir.join("index"))?;
        }
        for (name, bytes) in [("index", &self.index), ("info/exclude", &self.exclude)] {
            if let Some(bytes) = bytes {
                std::fs::write(self.dir.join(name), bytes)
                    .with_context(|| format!("cannot write {}", self.dir.join(name).display()))?;
            }
        }
        // No `update-index --refresh` here: it costs a stat of every tracked file and a write
        // of the index, on every run, to spare re-reading files whose stat data the user's
        // index had out of date (normally none: git status keeps it fresh).
        Ok(())
    }

    /// Record the current stat data of clean entries in the private index, so the comparison
    /// at the end does not re-read every file whose stat data the index had out of date.
    fn refresh(&self) {
        let _ = self.git(
            &["update-index", "-q", "--refresh", "--ignore-submodules"],
            None,
        );
    }

    /// `git ls-files -z -v --exclude-standard ARGS`: (tag, path) records.
    fn ls_files(&self, args: &[&str]) -> anyhow::Result<Vec<(u8, OsString)>> {
        let mut all = vec!["ls-files", "-z", "-v", "--exclude-standard"];
        all.extend_from_slice(args);
        let out = self.git(&all, None)?;
        let mut records = Vec::new();
        for rec in out.split(|b| *b == 0) {
            if rec.len() < 3 || rec[1] != b' ' {
                continue;
            }
            records.push((rec[0], OsString::from_vec(rec[2..].to_vec())));
        }
        Ok(records)
    }

    /// The paths dirty now relative to the private index.
    /// `git ls-files --others --ignored --exclude-standard --directory`.
    fn ignored(&self) -> anyhow::Result<BTreeSet<OsString>> {
        let out = self.git(
            &[
                "ls-files",
                "-z",
                "--others",
                "--ignored",
                "--exclude-standard",
                "--directory",
            ],
            None,
        )?;
        Ok(out
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .map(|r| OsString::from_vec(r.to_vec()))
            .collect())
    }

    fn dirty(&self) -> anyhow::Result<BTreeMap<OsString, DirtyKind>> {
        Ok(dirty_paths(self.ls_files(&["-m", "-d", "-o"])?))
    }

    /// Run git on the private directory and the project's work tree; its stdout.
    fn git(&self, args: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<Vec<u8>> {
        self.ensure()?;
        let mut c = Command::new("git");
        for (k, _) in std::env::vars_os() {
            if k.as_bytes().starts_with(b"GIT_") {
                c.env_remove(k);
            }
        }
        c.env("GIT_DIR", &self.dir)
            .env("GIT_WORK_TREE", &self.root)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            // Nor the system's attributes file (it lies under git's own prefix).
            .env("GIT_ATTR_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("LC_ALL", "C")
            .current_dir(&self.root)
            .args([
                "-c",
                "core.fsmonitor=false",
                "-c",
                "core.hooksPath=/dev/null",
                "-c",
                "core.untrackedCache=false",
                "-c",
                "core.splitIndex=false",
                "-c",
                "core.trustctime=true",
                "-c",
                "core.checkStat=default",
                "-c",
                "safe.directory=*",
            ])
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().context("cannot run git")?;
        if let Some(input) = stdin
            && let Some(mut w) = child.stdin.take()
        {
            w.write_all(input).context("cannot write to git")?;
        }
        let out = child.wait_with_output().context("cannot run git")?;
        if !out.status.success() {
            bail!(
                "git {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    }
}

impl Drop for PrivateGitDir {
    fn drop(&mut self) {
        // Only a directory this made (not one that was there: `make` failed then).
        if let Some(Ok(())) = self.made.get() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The repository directory of the work tree `root`: `root/.git`, or where a `.git` file
/// (`gitdir: PATH`, a worktree or submodule) points.
fn real_git_dir(root: &Path) -> anyhow::Result<PathBuf> {
    let dotgit = root.join(".git");
    let m = dotgit.symlink_metadata()?;
    if m.is_dir() {
        return Ok(dotgit);
    }
    if !m.is_file() {
        bail!("{} is neither a directory nor a file", dotgit.display());
    }
    let text = std::fs::read(&dotgit)?;
    let Some(rest) = text.strip_prefix(b"gitdir:") else {
        bail!("{} does not start with gitdir:", dotgit.display());
    };
    let target = PathBuf::from(OsString::from_vec(trim(rest.to_vec())));
    Ok(root.join(target))
}

fn trim(mut v: Vec<u8>) -> Vec<u8> {
    while v.last().is_some_and(|b| b.is_ascii_whitespace()) {
        v.pop();
    }
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    v.split_off(start)
}

/// Copy `from` to `to` when `from` is a regular file (not a symlink); nothing when absent.
fn copy_regular(from: &Path, to: &Path) -> anyhow::Result<()> {
    match from.symlink_metadata() {
        Ok(m) if m.is_file() => {
            std::fs::copy(from, to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
            Ok(())
        }
        Ok(_) => bail!("{} is not a regular file", from.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", from.display())),
    }
}

/// The content of `path` when it is a regular file (not a symlink); `None` when absent.
fn read_regular(path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    match path.symlink_metadata() {
        Ok(m) if m.is_file() => std::fs::read(path)
            .map(Some)
            .with_context(|| format!("cannot read {}", path.display())),
        Ok(_) => bail!("{} is not a regular file", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Where the change summary of a run comes from (decided before anything of the run starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The run's change record (corral-changes, kept by the jail's name gate): nothing lists
    /// the project at the start or the end. The record's names are handed over once it is
    /// finished ([`Baseline::recorded`]).
    Record,
    /// A listing of the project taken before the jail's command starts and compared at the
    /// end (git or metadata); `why`: why the record cannot stand for the summary, if a record
    /// was considered.
    Walk { why: Option<String> },
}

/// Take the baseline of a native run's project, where the jail can change it (not with
/// `--scratch`, not a read-only project, not with `CORRAL_CHANGES=off` in corral's
/// environment). A failure is reported and the run goes on.
///
/// With [`Source::Walk`] the baseline is taken on a thread, so it overlaps the rest of the
/// set-up; [`ready`] waits for it and must be called before the jail starts. With
/// [`Source::Record`] nothing is taken.
pub fn start(plan: &corral_policy::Plan, jail_id: &str, source: Source) -> Pending {
    if plan.project.scratch
        || plan.project.access != corral_policy::plan::Access::Rw
        || std::env::var_os("CORRAL_CHANGES").is_some_and(|v| v == "off")
    {
        return Pending(PendingKind::None);
    }
    let root = plan.project.root.clone();
    let why = match source {
        Source::Record => {
            return Pending(PendingKind::Record(Baseline {
                root,
                kind: BaselineKind::Record(None),
                note: None,
            }));
        }
        Source::Walk { why } => why,
    };
    let jail_id = jail_id.to_string();
    let git = root.join(".git").symlink_metadata().is_ok();
    Pending(PendingKind::Thread(std::thread::spawn(move || {
        Baseline::take(&root, &jail_id, git, why)
    })))
}

/// A baseline being taken.
pub struct Pending(PendingKind);

enum PendingKind {
    None,
    Thread(std::thread::JoinHandle<anyhow::Result<Baseline>>),
    Record(Baseline),
}

impl Pending {
    /// No baseline: a session that lists no changes.
    pub fn none() -> Pending {
        Pending(PendingKind::None)
    }

    /// Whether the summary is to come from the run's change record.
    pub fn is_record(&self) -> bool {
        matches!(self.0, PendingKind::Record(_))
    }
}

/// Wait for the baseline. Call before the jail starts.
pub fn ready(pending: Pending) -> Option<Baseline> {
    let result = match pending.0 {
        PendingKind::None => return None,
        PendingKind::Record(b) => return Some(b),
        PendingKind::Thread(t) => match t.join() {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!("the snapshot thread panicked")),
        },
    };
    match result {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("corral: no change summary for this run: {e:#}");
            None
        }
    }
}

impl Baseline {
    /// Whether this baseline waits for the run's change record.
    pub fn is_record(&self) -> bool {
        matches!(self.kind, BaselineKind::Record(_))
    }

    /// Hand over what the run's change record names as changed (or why it could not be
    /// finished), once nothing the run started can write.
    pub fn recorded(&mut self, paths: anyhow::Result<Vec<Recorded>>) {
        if let BaselineKind::Record(slot) = &mut self.kind {
            *slot = Some(paths);
        }
    }
}

/// Whether a standard descriptor corral hands the jail (0, 1, 2) could write the project
/// without passing the jail's name gate: a directory on the project's file system, or a
/// regular file open for writing that is (or may be) one of the project's (`corral run -- cmd >
/// project/out.txt`: the shell opened it, not the jail). The reason, if one could.
pub fn inherited_writer(root: &Path) -> Option<String> {
    let dev = std::fs::metadata(root).ok()?.dev();
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    [
        std::io::stdin().as_fd(),
        std::io::stdout().as_fd(),
        std::io::stderr().as_fd(),
    ]
    .into_iter()
    .find_map(|fd| writes_into(&root, dev, fd))
}

/// [`inherited_writer`] for one descriptor `fd`; `root` is the project's canonical path, `dev`
/// its device.
fn writes_into(root: &Path, dev: u64, fd: std::os::fd::BorrowedFd) -> Option<String> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let n = fd.as_raw_fd();
    // A closed descriptor fails: nothing to write through.
    let st = nix::sys::stat::fstat(fd).ok()?;
    if st.st_dev != dev {
        return None;
    }
    let writable = fcntl(fd, FcntlArg::F_GETFL)
        .map(|f| OFlag::from_bits_truncate(f) & OFlag::O_ACCMODE != OFlag::O_RDONLY)
        .unwrap_or(true);
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Some(format!(
            "descriptor {n} is a directory on the project's file system"
        )),
        libc::S_IFREG if writable && may_be_in(root, n, &st) => Some(format!(
            "descriptor {n} is a file of the project, open for writing outside the jail's \
             name gate"
        )),
        _ => None,
    }
}

/// Whether the regular file open as descriptor `n` (`st` its fstat) may have a name in the
/// project at `root`: unless its one name (the kernel's `/proc/self/fd/N`) is outside the
/// project and still leads to this very file, or it has no name at all, it may.
fn may_be_in(root: &Path, n: i32, st: &nix::sys::stat::FileStat) -> bool {
    if st.st_nlink == 0 {
        // Removed: no name of the project's (nor any other) leads to it.
        return false;
    }
    if st.st_nlink > 1 {
        // Another name may be in the project.
        return true;
    }
    let Ok(name) = std::fs::read_link(format!("/proc/self/fd/{n}")) else {
        return true;
    };
    if name.starts_with(root) {
        return true;
    }
    // The name the kernel keeps may be stale (moved since): trusted only if it leads here.
    !std::fs::symlink_metadata(&name).is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino)
}

/// The names the record lists: created, modified and deleted. A directory the run created is
/// one `dir/` entry (what it holds is not listed one by one, as git's `--directory`); what
/// lies inside a `.git` directory (the project's own repository's files) is not listed.
fn from_record(paths: &[Recorded], ch: &mut Changes) {
    let inside_git = |p: &[u8]| {
        p == b".git"
            || p.split(|&b| b == b'/')
                .rev()
                .skip(1)
                .any(|part| part == b".git")
    };
    let created_dirs: BTreeSet<&[u8]> = paths
        .iter()
        .filter(|r| r.before == Kind::Absent && r.after == Kind::Dir)
        .map(|r| r.path.as_slice())
        .collect();
    let in_created_dir = |p: &[u8]| {
        p.iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .any(|(i, _)| created_dirs.contains(&p[..i]))
    };
    let label = |p: &[u8], dir: bool| {
        let mut s = String::from_utf8_lossy(p).into_owned();
        if dir {
            s.push('/');
        }
        s
    };
    for r in paths {
        if inside_git(&r.path) || in_created_dir(&r.path) {
            continue;
        }
        match (r.before, r.after) {
            (Kind::Absent, Kind::Absent) => {}
            (Kind::Absent, after) => ch.created.push(label(&r.path, after == Kind::Dir)),
            (before, Kind::Absent) => ch.deleted.push(label(&r.path, before == Kind::Dir)),
            (_, after) => ch.modified.push(label(&r.path, after == Kind::Dir)),
        }
    }
}

/// Compare the project with `baseline`, print the summary on stderr and record it in the
/// audit log (a `Jail` event `changes`, only when something changed).
/// `own`: paths corral made for the run (the jail's placeholders), never listed.
pub fn finish(
    baseline: Option<Baseline>,
    own: &[PathBuf],
    audit: &corral_audit::AuditLog,
    jail_id: &str,
) {
    let Some(baseline) = baseline else { return };
    let baseline_root = baseline.root.clone();
    let own: Vec<OsString> = own
        .iter()
        .filter_map(|p| p.strip_prefix(&baseline_root).ok())
        .filter(|rel| !rel.as_os_str().is_empty())
        .map(|rel| rel.as_os_str().to_os_string())
        .collect();
    let changes = match baseline.compare(&own) {
        Ok(c) => c,
        Err(e) => {
            crate::endlines::say(&format!(
                "corral: cannot list what changed in the project: {}",
                printable(&format!("{e:#}"))
            ));
            return;
        }
    };
    let mut skip = own_dirs(&baseline_root);
    skip.extend(own.iter().map(|o| o.to_string_lossy().into_owned()));
    let changes = changes.without(&skip);
    if changes.is_empty() {
        return;
    }
    for line in changes.summary() {
        crate::endlines::say(&line);
    }
    let record = corral_audit::Record::now(
        jail_id,
        corral_audit::Event::Jail(corral_audit::JailEvent::Changes {
            detail: serde_json::to_value(&changes).unwrap_or_default(),
        }),
    );
    if let Err(e) = audit.write(&record) {
        crate::endlines::say(&format!("corral: cannot write the audit log: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_written_file_with_a_name_in_the_project_makes_the_summary_list_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("project");
        std::fs::create_dir(&root).unwrap();
        let root = root.canonicalize().unwrap();
        let dev = std::fs::metadata(&root).unwrap().dev();
        let open = |p: &Path, write: bool| {
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .create(write)
                .truncate(false)
                .open(p)
                .unwrap()
        };
        let inside = open(&root.join("out.txt"), true);
        assert!(writes_into(&root, dev, inside.as_fd()).is_some());
        // Read-only: nothing written through it.
        assert!(writes_into(&root, dev, open(&root.join("out.txt"), false).as_fd()).is_none());
        // Beside the project, on its file system: not the project's.
        let outside = open(&t.path().join("log.txt"), true);
        assert!(writes_into(&root, dev, outside.as_fd()).is_none());
        // ... unless another name of it is in the project.
        std::fs::hard_link(t.path().join("log.txt"), root.join("linked")).unwrap();
        assert!(writes_into(&root, dev, outside.as_fd()).is_some());
        // Moved into the project after it was opened: the kernel's name follows it.
        let moved = open(&t.path().join("moved.txt"), true);
        std::fs::rename(t.path().join("moved.txt"), root.join("moved.txt")).unwrap();
        assert!(writes_into(&root, dev, moved.as_fd()).is_some());
        // A directory on the project's file system: the jail could make names through it.
        let dir = std::fs::File::open(t.path()).unwrap();
        assert!(writes_into(&root, dev, dir.as_fd()).is_some());
    }

    fn changes(c: &[&str], m: &[&str], d: &[&str]) -> Changes {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        Changes {
            root: PathBuf::from("/p"),
            method: "git".into(),
            created: v(c),
            modified: v(m),
            deleted: v(d),
            note: None,
        }
    }

    #[test]
    fn corrals_own_directories_are_not_the_agents_changes() {
        let c = changes(
            &["a.txt", "state/corral/p/audit.jsonl", "state/", "statex"],
            &["cfg/corral/trusted.json"],
            &["state/corral/p/changes/x/index"],
        );
        let dirs = ["state/corral".to_string(), "cfg/corral".to_string()];
        assert_eq!(c.without(&dirs), changes(&["a.txt", "statex"], &[], &[]));
    }

    /// The walk lists every entry but `.git`, whether it fits the walk on the calling thread or
    /// goes on in threads, and a walk beyond its limit fails.
    #[test]
    fn walk_lists_every_entry_small_or_large() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join(".git/objects")).unwrap();
        std::fs::write(root.join(".git/HEAD"), "x").unwrap();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/c"), "x").unwrap();
        let mut names: Vec<String> = walk(root)
            .unwrap()
            .keys()
            .map(|k| k.to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "a/b", "a/b/c"]);
        for d in 0..50 {
            let sub = root.join(format!("many/d{d}"));
            std::fs::create_dir_all(&sub).unwrap();
            for i in 0..100 {
                std::fs::write(sub.join(format!("f{i}")), "").unwrap();
            }
        }
        let large = walk(root).unwrap();
        // a, a/b, a/b/c, many, 50 directories, 5,000 files.
        assert_eq!(large.len(), 3 + 1 + 50 + 5000);
        assert!(large.contains_key(std::ffi::OsStr::new("many/d49/f99")));
        assert!(
            large
                .keys()
                .all(|k| !k.to_string_lossy().starts_with(".git"))
        );
        let skipped = walk_skipping(root, &["many".into()], 100, false).unwrap();
        assert_eq!(skipped.len(), 3, "`many` neither listed nor entered");
        let over = walk_skipping(root, &[], 5000, false)
            .unwrap_err()
            .to_string();
        assert!(over.contains("more than 5000 files"), "{over}");
    }

    /// A project for the shortcut: files, a directory, and `target/`, which git listed as
    /// ignored without entering it.
    fn quick_project() -> (tempfile::TempDir, BTreeSet<OsString>) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join("src/sub")).unwrap();
        std::fs::create_dir_all(root.join("target/debug")).unwrap();
        for f in ["a.txt", "src/lib.rs", "src/sub/m.rs", "target/debug/o"] {
            std::fs::write(root.join(f), "text\n").unwrap();
        }
        // Dated in the past, so a change now gets another mtime whatever the clock's tick.
        let past = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        for e in [
            "a.txt",
            "src/lib.rs",
            "src/sub/m.rs",
            "src/sub",
            "src",
            "target",
        ] {
            std::fs::File::open(root.join(e))
                .unwrap()
                .set_modified(past)
                .unwrap();
        }
        let ignored = [OsString::from("target/")].into_iter().collect();
        (dir, ignored)
    }

    /// Every change git could see makes the shortcut fall through to git; a run that changed
    /// nothing (or only inside a directory git does not enter) takes it.
    #[test]
    fn the_shortcut_holds_only_for_an_unchanged_project() {
        type Change = fn(&Path);
        let changes: [(&str, Change); 8] = [
            ("append", |r| {
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(r.join("a.txt"))
                    .unwrap();
                f.write_all(b"more").unwrap();
            }),
            ("create", |r| {
                std::fs::write(r.join("src/sub/new.rs"), "").unwrap()
            }),
            ("delete", |r| {
                std::fs::remove_file(r.join("src/lib.rs")).unwrap()
            }),
            ("chmod", |r| {
                use std::os::unix::fs::PermissionsExt;
                let p = std::fs::Permissions::from_mode(0o755);
                std::fs::set_permissions(r.join("a.txt"), p).unwrap();
            }),
            ("replace by rename", |r| {
                std::fs::write(r.join("tmp"), "text\n").unwrap();
                std::fs::rename(r.join("tmp"), r.join("a.txt")).unwrap();
            }),
            ("mkdir", |r| std::fs::create_dir(r.join("src/new")).unwrap()),
            ("entry in an ignored directory", |r| {
                std::fs::write(r.join("target/.gitignore"), "!x\n").unwrap()
            }),
            ("ignored directory replaced", |r| {
                std::fs::remove_dir_all(r.join("target")).unwrap();
                std::fs::create_dir(r.join("target")).unwrap();
            }),
        ];
        for (what, change) in changes {
            let (dir, ignored) = quick_project();
            let mut quick = Quick::take(dir.path(), &ignored, i128::MAX).expect("walk");
            assert_eq!(quick.pruned, [OsString::from("target")]);
            change(dir.path());
            assert!(!quick.unchanged(dir.path(), &[]), "{what} went unnoticed");
        }
        let (dir, ignored) = quick_project();
        let mut quick = Quick::take(dir.path(), &ignored, i128::MAX).expect("walk");
        std::fs::write(dir.path().join(".git/index"), "x").unwrap();
        std::fs::write(dir.path().join("target/debug/new.o"), "x").unwrap();
        assert!(quick.unchanged(dir.path(), &[]), "no change git sees");
    }

    /// An entry changed at or after the racy mark voids the shortcut, unless it is one of
    /// corral's own placeholders.
    #[test]
    fn a_recent_change_voids_the_shortcut() {
        let (dir, ignored) = quick_project();
        let mut quick = Quick::take(dir.path(), &ignored, now_ns() - QUICK_RACY_NS).unwrap();
        assert!(!quick.unchanged(dir.path(), &[]));
        let (dir, ignored) = quick_project();
        let mut quick = Quick::take(dir.path(), &ignored, i128::MAX).unwrap();
        assert!(quick.unchanged(dir.path(), &[]));
        // Every recent entry corral's own (quick_project just wrote them all: ctime now): the
        // shortcut holds.
        let (dir, ignored) = quick_project();
        let mut quick = Quick::take(dir.path(), &ignored, now_ns() - QUICK_RACY_NS).unwrap();
        let own = ["a.txt", "src", "target"].map(OsString::from);
        assert!(quick.unchanged(dir.path(), &own));
        // One left that is not: void.
        let (dir, ignored) = quick_project();
        let mut quick = Quick::take(dir.path(), &ignored, now_ns() - QUICK_RACY_NS).unwrap();
        let own = ["a.txt", "target"].map(OsString::from);
        assert!(!quick.unchanged(dir.path(), &own));
    }

    /// Only directories git did not enter are pruned, and none that holds a tracked file.
    #[test]
    fn only_unentered_ignored_directories_are_pruned() {
        let (dir, _) = quick_project();
        let ignored: BTreeSet<OsString> = ["a/", "b/", "b/.gitignore", "b/sub/", "c.log"]
            .into_iter()
            .map(OsString::from)
            .collect();
        for d in ["a", "b/sub"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let quick = Quick::take(dir.path(), &ignored, i128::MAX).unwrap();
        assert_eq!(quick.pruned, [OsString::from("a"), OsString::from("b/sub")]);
        let rec = |t: u8, p: &str| (t, OsString::from(p));
        assert!(!quick.prunes_any_of(&[rec(b'H', "ab"), rec(b'?', "a/x"), rec(b'H', "b/y")]));
        assert!(quick.prunes_any_of(&[rec(b'H', "b/sub/x")]));
    }

    #[test]
    fn nothing_changed_prints_nothing() {
        assert!(changes(&[], &[], &[]).summary().is_empty());
    }

    #[test]
    fn few_changes_fit_one_line() {
        let s = changes(&["a.txt"], &["src/lib.rs"], &["old.md"]).summary();
        assert_eq!(
            s,
            vec!["corral: changed in /p: created a.txt, modified src/lib.rs, deleted old.md"]
        );
    }

    #[test]
    fn many_changes_are_a_capped_table() {
        let names: Vec<String> = (0..120).map(|i| format!("f{i:03}")).collect();
        let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let s = changes(&refs[..100], &refs[100..110], &refs[110..]).summary();
        assert_eq!(
            s[0],
            "corral: changed in /p: 100 created, 10 modified, 10 deleted"
        );
        assert_eq!(s.len(), 1 + SHOW_MAX + 1);
        assert_eq!(s[1], "corral:   created  f000");
        assert!(s.last().unwrap().contains("and 70 more"), "{s:?}");
    }

    #[test]
    fn control_characters_in_names_are_escaped() {
        let s = changes(&["evil\u{1b}[2Jname\n"], &[], &[]).summary();
        assert_eq!(s.len(), 1);
        assert!(!s[0].contains('\u{1b}') && !s[0].contains('\n'), "{s:?}");
        assert!(s[0].contains("evil\\u{1b}[2Jname\\n"), "{s:?}");
    }

    /// Names that run code on the host come first, whatever their verb, and none is folded
    /// into "and N more", however many other files changed.
    #[test]
    fn host_code_names_come_first_and_are_never_counted_away() {
        let names: Vec<String> = (0..200).map(|i| format!("f{i:03}")).collect();
        let mut created: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        created.push(".envrc");
        created.push("z/.vscode/tasks.json");
        created.sort();
        let s = changes(&created, &["web/package.json"], &["Makefile"]).summary();
        let shown: Vec<String> = [".envrc", "z/.vscode/tasks.json"]
            .iter()
            .map(|n| format!("corral:   created  {n} {HOST_CODE_MARK}"))
            .chain([
                format!("corral:   modified web/package.json {HOST_CODE_MARK}"),
                format!("corral:   deleted  Makefile {HOST_CODE_MARK}"),
            ])
            .collect();
        assert_eq!(
            s[0],
            "corral: changed in /p: 202 created, 1 modified, 1 deleted; 4 that can run code on \
             the host, listed first"
        );
        assert_eq!(s[1..5], shown[..], "{s:#?}");
        assert_eq!(s[5], "corral:   created  f000");
        assert_eq!(s.len(), 1 + SHOW_MAX + 1, "{s:#?}");
        assert_eq!(
            s.last().unwrap(),
            &format!(
                "corral:   and {} more (corral log --json has the full list)",
                200 - (SHOW_MAX - 4)
            )
        );

        // More of them than the table holds: every one is listed, the rest is counted.
        let many: Vec<String> = (0..SHOW_MAX + 10)
            .map(|i| format!("d{i:03}/.envrc"))
            .collect();
        let mut created: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
        created.extend(["a", "b"]);
        let s = changes(&created, &[], &[]).summary();
        assert_eq!(s.len(), 1 + SHOW_MAX + 10 + 1, "{s:#?}");
        assert!(
            s[1..=SHOW_MAX + 10]
                .iter()
                .all(|l| l.ends_with(HOST_CODE_MARK))
        );
        assert_eq!(
            s.last().unwrap(),
            "corral:   and 2 more (corral log --json has the full list)"
        );
    }

    #[test]
    fn host_code_names_come_first_on_one_line_too() {
        let s = changes(&["a.txt", ".envrc"], &[], &[]).summary();
        assert_eq!(
            s,
            vec![format!(
                "corral: changed in /p: created .envrc {HOST_CODE_MARK}, created a.txt"
            )]
        );
    }

    /// Bidirectional controls, zero-width characters and C1 controls in a name are escaped:
    /// `evil\u{202e}txt.sh` cannot show as `evilhs.txt`.
    #[test]
    fn bidi_and_invisible_characters_in_names_are_escaped() {
        let s = changes(
            &[
                "evil\u{202e}txt.sh",
                "a\u{200b}b",
                "c\u{85}d",
                "e\u{2066}f",
                "\u{feff}g",
            ],
            &[],
            &[],
        )
        .summary();
        assert_eq!(
            s,
            vec![
                "corral: changed in /p: created evil\\u{202e}txt.sh, created a\\u{200b}b, \
                 created c\\u{85}d, created e\\u{2066}f, created \\u{feff}g"
            ]
        );
    }

    #[test]
    fn dirty_paths_keeps_modified_deleted_and_untracked() {
        let rec = |t: u8, p: &str| (t, OsString::from(p));
        let d = dirty_paths(vec![
            rec(b'H', "clean"),
            rec(b'C', "mod"),
            rec(b'C', "gone"),
            rec(b'R', "gone"),
            rec(b'?', "new"),
            rec(b'c', "lower"),
        ]);
        let got: Vec<(String, DirtyKind)> = d
            .into_iter()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v))
            .collect();
        assert_eq!(
            got,
            vec![
                ("gone".into(), DirtyKind::Tracked),
                ("lower".into(), DirtyKind::Tracked),
                ("mod".into(), DirtyKind::Tracked),
                ("new".into(), DirtyKind::Untracked),
            ]
        );
    }

    #[test]
    fn the_record_lists_a_created_directory_once_and_nothing_inside_git() {
        let r = |p: &str, before: Kind, after: Kind| Recorded {
            path: p.as_bytes().to_vec(),
            before,
            after,
        };
        use Kind::{Absent, Dir, Other};
        let paths = vec![
            r("node_modules", Absent, Dir),
            r("node_modules/a", Absent, Dir),
            r("node_modules/a/index.js", Absent, Other),
            r("src/lib.rs", Other, Other),
            r("src/new.rs", Absent, Other),
            r("old", Dir, Absent),
            r("old/f", Other, Absent),
            r("tmp", Absent, Absent),
            r(".git", Dir, Dir),
            r(".git/index", Other, Other),
            r(".git/objects/ab", Absent, Dir),
            r("sub/.git/HEAD", Other, Other),
            r("src", Dir, Dir),
        ];
        let mut ch = Changes::default();
        from_record(&paths, &mut ch);
        ch.sort();
        assert_eq!(ch.created, ["node_modules/", "src/new.rs"]);
        assert_eq!(ch.modified, ["src/", "src/lib.rs"]);
        assert_eq!(ch.deleted, ["old/", "old/f"]);
    }
}
