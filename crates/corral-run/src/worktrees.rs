//! Agents side by side on one repository: `corral run --worktree NAME`.
//!
//! Each agent gets its own git worktree of the repository, on its own branch NAME, created by
//! corral on the host (`git worktree add`) under the state directory,
//! `$XDG_STATE_HOME/corral/worktrees/<project-key>/NAME` (project-key as for the audit log:
//! the main repository's base name and a hash of its path), and reused by later runs. The jail
//! gets that worktree as its project, read-write, and of the main repository only what git
//! needs to work in a linked worktree:
//!
//! - the main repository's `.git`, read-only (history, config, hooks, other worktrees' admin
//!   directories, `packed-refs`, the main worktree's index and HEAD); the main worktree's
//!   files and the other worktrees are not in the jail at all;
//! - its own admin directory `.git/worktrees/ID/` read-write (index, HEAD, logs, ORIG_HEAD),
//!   its `commondir`, `gitdir` and `config.worktree` read-only, and the worktree's own `.git`
//!   file read-only (it says where git finds the repository);
//! - a private object directory (`GIT_OBJECT_DIRECTORY`; the repository's objects are its
//!   alternate, read-only): the jail cannot rewrite an object the user's branches use;
//! - a private copy of `refs/heads/` and `logs/refs/heads/` bound over the repository's: the
//!   jail's commits move its copy of the branch; other branches it moves stay in the copy.
//!
//! When the jail has ended, corral brings the branch NAME of the private copy back into the
//! repository: `git fetch` (objects checked with `transfer.fsckObjects`) into
//! `refs/corral/import/NAME`, then `git update-ref refs/heads/NAME NEW OLD`, which refuses when
//! the branch moved on the host meanwhile (the commits stay at the import ref, and corral says
//! so). Every git command corral runs here has `core.hooksPath=/dev/null` and
//! `core.fsmonitor=false`: nothing of a repository runs as corral.
//!
//! A run holds an exclusive `flock` on `.corral/NAME.lock` next to the worktrees: it is the
//! "agent running" marker of `corral worktree ls`, and `corral worktree rm` refuses while it is
//! held.

use std::fs::{self, File};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use corral_policy::plan::{Access, Mount, MountKind, Plan};
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

use crate::trust::Trusted;

/// Where the worktree NAME of one repository and its private state live.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The main worktree's top level (canonical).
    pub main: PathBuf,
    /// Its git directory, `main/.git`.
    pub gitdir: PathBuf,
    pub name: String,
    /// The worktree.
    pub path: PathBuf,
    /// corral's own directory beside the worktrees (never in a jail).
    state: PathBuf,
}

impl Layout {
    /// The layout of worktree `name` of the repository that holds `cwd`.
    pub fn new(cwd: &Path, name: &str) -> anyhow::Result<Layout> {
        check_name(name)?;
        let main = main_repository(cwd)?;
        Ok(Layout::at(main, name))
    }

    fn at(main: PathBuf, name: &str) -> Layout {
        let base = base_dir(&main);
        Layout {
            gitdir: main.join(".git"),
            name: name.to_string(),
            path: base.join(name),
            state: base.join(".corral"),
            main,
        }
    }

    /// The main worktree's `corral.toml`: the one whose trusted content the worktree's may
    /// match. `main` comes from the repository's common git directory, and `prepare` checked
    /// that the worktree's admin directory is one of that repository's.
    pub fn policy_file_of_main(&self) -> PathBuf {
        self.main.join("corral.toml")
    }

    /// The private repository: its `objects/` and `refs/heads/` are the jail's.
    fn private(&self) -> PathBuf {
        self.state.join(format!("{}.git", self.name))
    }

    fn lock_path(&self) -> PathBuf {
        self.state.join(format!("{}.lock", self.name))
    }

    fn branch_ref(&self) -> String {
        format!("refs/heads/{}", self.name)
    }

    fn import_ref(&self) -> String {
        format!("refs/corral/import/{}", self.name)
    }
}

/// `$XDG_STATE_HOME/corral/worktrees/<project-key>` of the repository `main`.
fn base_dir(main: &Path) -> PathBuf {
    let state = corral_audit::state_dir().unwrap_or_else(|_| PathBuf::from("/nonexistent"));
    state
        .join("worktrees")
        .join(corral_audit::project_key(main))
}

/// A worktree name is a branch name and a directory name: letters, digits, `.`, `_`, `-`,
/// starting with a letter or digit, at most 100 characters, and a valid git branch name.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    let ok = !name.is_empty()
        && name.len() <= 100
        && ok_chars
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && !name.ends_with(".lock")
        && !name.ends_with('.')
        && !name.contains("..");
    if !ok {
        bail!(
            "worktree name {name:?}: use letters, digits, '.', '_' and '-', starting with a \
             letter or digit (it names the branch and the directory)"
        );
    }
    Ok(())
}

/// A git command on the host: no hooks, no fsmonitor, no git variables of the caller's.
fn git(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ])
        .stdin(Stdio::null());
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
    ] {
        c.env_remove(var);
    }
    c
}

/// Run `cmd`; its standard output (trimmed), or an error naming `step` with git's message.
fn output(mut cmd: Command, step: &str) -> anyhow::Result<String> {
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("{step}: cannot run git"))?;
    if !out.status.success() {
        bail!(
            "{step}: git failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The main worktree of the repository holding `cwd` (from a linked worktree too).
fn main_repository(cwd: &Path) -> anyhow::Result<PathBuf> {
    let mut c = git(cwd);
    c.args(["rev-parse", "--path-format=absolute", "--git-common-dir"]);
    let common = output(c, &format!("find the git repository of {}", cwd.display()))
        .context("corral's worktrees belong to a git repository: run this in one")?;
    let common = PathBuf::from(common);
    let main = match (common.file_name(), common.parent()) {
        (Some(n), Some(parent)) if n == ".git" => parent.to_path_buf(),
        _ => bail!(
            "the repository of {} keeps its git directory at {}, not in a work tree's .git: \
             --worktree needs a repository with a main work tree",
            cwd.display(),
            common.display()
        ),
    };
    main.canonicalize()
        .with_context(|| format!("cannot resolve {}", main.display()))
}

/// The exclusive lock of one worktree's run: held while an agent runs in it.
pub struct RunLock {
    _lock: Flock<File>,
}

/// Take the lock of `l`'s runs; an error when another run holds it.
pub fn lock(l: &Layout) -> anyhow::Result<RunLock> {
    create_private_dir(&l.state)?;
    let path = l.lock_path();
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open the worktree lock {}", path.display()))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((mut file, _)) => {
            let mut pid = String::new();
            let _ = std::io::Read::read_to_string(&mut file, &mut pid);
            bail!(
                "an agent already runs in worktree {} (corral pid {}): one jail per worktree",
                l.name,
                pid.trim()
            );
        }
    };
    lock.set_len(0)
        .and_then(|()| writeln!(&mut *lock, "{}", std::process::id()))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(RunLock { _lock: lock })
}

/// The repository-wide lock of corral's git commands that add, remove or list worktrees or
/// move a branch: `git worktree add` is not safe beside another one, nor beside a command that
/// reads every worktree's admin directory (a fetch checks that no worktree has the branch it
/// updates checked out). Held for the command only; blocking.
fn repo_lock(state: &Path) -> anyhow::Result<Flock<File>> {
    create_private_dir(state)?;
    let path = state.join("repository.lock");
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("cannot lock {}: {e}", path.display()))
}

/// Whether a run holds `l`'s lock now.
fn running(l: &Layout) -> bool {
    let Ok(file) = File::open(l.lock_path()) else {
        return false;
    };
    Flock::lock(file, FlockArg::LockSharedNonblock).is_err()
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

/// Make sure the worktree exists: reuse it, or `git worktree add` it (on branch NAME, made from
/// the main worktree's HEAD when it does not exist). True when it was created.
pub fn ensure(l: &Layout) -> anyhow::Result<bool> {
    if admin_dir(l).is_ok() {
        return Ok(false);
    }
    if fs::symlink_metadata(&l.path).is_ok() {
        bail!(
            "{} exists but is no worktree of {}: remove it, or pick another name",
            l.path.display(),
            l.main.display()
        );
    }
    if let Some(parent) = l.path.parent() {
        create_private_dir(parent)?;
    }
    let mut c = git(&l.main);
    c.args(["worktree", "add", "--quiet"]);
    if branch_tip(l)?.is_some() {
        c.arg("--end-of-options").arg(&l.path).arg(&l.name);
    } else {
        c.args(["-b", &l.name, "--end-of-options"])
            .arg(&l.path)
            .arg("HEAD");
    }
    let _repo = repo_lock(&l.state)?;
    output(c, &format!("create the worktree {}", l.path.display()))?;
    admin_dir(l)?;
    Ok(true)
}

/// The branch NAME's commit in the repository, if the branch exists.
fn branch_tip(l: &Layout) -> anyhow::Result<Option<String>> {
    let mut c = git(&l.main);
    c.args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
        .arg(format!("{}^{{commit}}", l.branch_ref()));
    let out = c
        .stderr(Stdio::null())
        .output()
        .context("cannot run git rev-parse")?;
    let tip = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !tip.is_empty()).then_some(tip))
}

/// The worktree's admin directory `main/.git/worktrees/ID`, checked: the worktree's `.git`
/// file names it, it is a real directory right below `.git/worktrees`, and its `gitdir` names
/// the worktree back.
fn admin_dir(l: &Layout) -> anyhow::Result<PathBuf> {
    let dot_git = l.path.join(".git");
    let text = read_small(&dot_git)?;
    let target = text
        .strip_prefix("gitdir:")
        .map(str::trim)
        .with_context(|| format!("{} is not a worktree's .git file", dot_git.display()))?;
    let admin = PathBuf::from(target);
    let worktrees = l.gitdir.join("worktrees");
    if admin.parent() != Some(worktrees.as_path()) {
        bail!(
            "{} names {}, not a directory of {}",
            dot_git.display(),
            admin.display(),
            worktrees.display()
        );
    }
    real_dirs(&[&l.gitdir, &worktrees, &admin])?;
    let back = read_small(&admin.join("gitdir"))?;
    if Path::new(back.trim()) != dot_git {
        bail!(
            "{} names {}, not {}",
            admin.join("gitdir").display(),
            back.trim(),
            dot_git.display()
        );
    }
    Ok(admin)
}

/// A regular file of at most 4 KiB, not through a link.
fn read_small(path: &Path) -> anyhow::Result<String> {
    let m =
        fs::symlink_metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !m.is_file() || m.len() > 4096 {
        bail!("{} is not a small regular file", path.display());
    }
    fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Each path is a directory itself, not a link to one.
fn real_dirs(paths: &[&Path]) -> anyhow::Result<()> {
    for p in paths {
        let m = fs::symlink_metadata(p).with_context(|| format!("cannot find {}", p.display()))?;
        if !m.is_dir() {
            bail!(
                "{} is not a directory (a link there is refused): check it",
                p.display()
            );
        }
    }
    Ok(())
}

/// One run's session in a worktree: the branch's commit when it started, and what the jail
/// gets.
pub struct Session {
    layout: Layout,
    admin: PathBuf,
    /// The branch's commit when the run started (the old value the update is checked against).
    base: Option<String>,
}

/// Get the private repository ready for a run: made on first use, its branch copies reset to
/// the repository's, its reflogs emptied. Commits of an earlier run that corral could not bring
/// back (it was killed) are brought back first.
pub fn prepare(l: &Layout) -> anyhow::Result<Session> {
    let admin = admin_dir(l)?;
    let mut c = git(&l.main);
    c.args(["rev-parse", "--show-ref-format"]);
    let refs = output(c, "read the repository's ref storage")?;
    if refs != "files" {
        bail!(
            "{} keeps its refs in {refs:?}, and --worktree works with the files ref storage only",
            l.main.display()
        );
    }
    let private = l.private();
    if fs::symlink_metadata(&private).is_err() {
        init_private(l, &private)?;
    } else if let Some(base) = read_base(l) {
        // A run that ended without bringing its branch back (corral was killed).
        for line in sync(
            &Session {
                layout: l.clone(),
                admin: admin.clone(),
                base: Some(base),
            },
            "an earlier run",
        ) {
            eprintln!("corral: {line}");
        }
    }
    let gitdir = &l.gitdir;
    for d in ["refs", "refs/heads", "objects"] {
        real_dirs(&[&gitdir.join(d)])?;
    }
    let logs_heads = gitdir.join("logs/refs/heads");
    if fs::symlink_metadata(&logs_heads).is_err() {
        fs::create_dir_all(&logs_heads)
            .with_context(|| format!("cannot create {}", logs_heads.display()))?;
    }
    real_dirs(&[&gitdir.join("logs"), &gitdir.join("logs/refs"), &logs_heads])?;
    let heads = private.join("refs/heads");
    let logs = private.join("logs/refs/heads");
    for dir in [&heads, &logs] {
        if fs::symlink_metadata(dir).is_ok() {
            fs::remove_dir_all(dir).with_context(|| format!("cannot empty {}", dir.display()))?;
        }
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    copy_refs(&gitdir.join("refs/heads"), &heads)?;
    let base = branch_tip(l)?;
    if let Some(tip) = &base {
        fs::write(heads.join(&l.name), format!("{tip}\n"))
            .with_context(|| format!("cannot write {}", heads.join(&l.name).display()))?;
    }
    write_base(l, base.as_deref())?;
    Ok(Session {
        layout: l.clone(),
        admin,
        base,
    })
}

/// `git init --bare` the private repository, in the repository's object format, its objects'
/// alternate the repository's.
fn init_private(l: &Layout, private: &Path) -> anyhow::Result<()> {
    let mut c = git(&l.main);
    c.args(["rev-parse", "--show-object-format"]);
    let format = output(c, "read the repository's object format")?;
    let mut c = git(&l.state);
    c.args(["init", "--quiet", "--bare", "--template="])
        .arg(format!("--object-format={format}"))
        .arg(private);
    output(c, &format!("create {}", private.display()))?;
    let info = private.join("objects/info");
    fs::create_dir_all(&info).with_context(|| format!("cannot create {}", info.display()))?;
    let alternates = info.join("alternates");
    fs::write(
        &alternates,
        format!("{}\n", l.gitdir.join("objects").display()),
    )
    .with_context(|| format!("cannot write {}", alternates.display()))
}

fn base_path(l: &Layout) -> PathBuf {
    l.state.join(format!("{}.base", l.name))
}

/// The branch's commit when the last run started, while that run's branch is not brought back.
fn read_base(l: &Layout) -> Option<String> {
    read_small(&base_path(l))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn write_base(l: &Layout, base: Option<&str>) -> anyhow::Result<()> {
    let path = base_path(l);
    match base {
        Some(b) => fs::write(&path, format!("{b}\n")),
        None => match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    }
    .with_context(|| format!("cannot write {}", path.display()))
}

/// Copy the loose refs under `from` to `to`: regular files only, no link followed.
fn copy_refs(from: &Path, to: &Path) -> anyhow::Result<()> {
    let rd = fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?;
    for e in rd.flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        match e.file_type() {
            Ok(t) if t.is_dir() => {
                fs::create_dir_all(&dst)
                    .with_context(|| format!("cannot create {}", dst.display()))?;
                copy_refs(&src, &dst)?;
            }
            Ok(t) if t.is_file() => {
                if let Ok(text) = read_small(&src) {
                    fs::write(&dst, text)
                        .with_context(|| format!("cannot write {}", dst.display()))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

impl Session {
    /// `plan` with the worktree's jail: the repository's `.git` read-only, the admin
    /// directory, the private objects and branch copies writable, the files that say where git
    /// finds its repository and config read-only. Trusted as `plan` is: corral adds these.
    pub fn confine(&self, plan: &Trusted<Plan>) -> Trusted<Plan> {
        plan.clone().map(|p| self.confined(&p))
    }

    fn confined(&self, plan: &Plan) -> Plan {
        let l = &self.layout;
        let private = l.private();
        let mut plan = plan.clone();
        let bind = |source: PathBuf, target: PathBuf, access| Mount {
            source,
            target,
            kind: MountKind::Bind(access),
            optional: false,
        };
        plan.mounts.extend([
            bind(l.gitdir.clone(), l.gitdir.clone(), Access::Ro),
            bind(self.admin.clone(), self.admin.clone(), Access::Rw),
            bind(private.join("objects"), private.join("objects"), Access::Rw),
            bind(
                private.join("refs/heads"),
                l.gitdir.join("refs/heads"),
                Access::Rw,
            ),
            bind(
                private.join("logs/refs/heads"),
                l.gitdir.join("logs/refs/heads"),
                Access::Rw,
            ),
        ]);
        plan.env.insert(
            "GIT_OBJECT_DIRECTORY".into(),
            private.join("objects").display().to_string(),
        );
        // `packed-refs` is read-only here: no automatic `gc`/`pack-refs` after a commit (it
        // would fail, noisily). Only when the caller passes no git config of its own.
        if !plan.env.contains_key("GIT_CONFIG_COUNT") {
            for (k, v) in [
                ("GIT_CONFIG_COUNT", "2"),
                ("GIT_CONFIG_KEY_0", "maintenance.auto"),
                ("GIT_CONFIG_VALUE_0", "false"),
                ("GIT_CONFIG_KEY_1", "gc.auto"),
                ("GIT_CONFIG_VALUE_1", "0"),
            ] {
                plan.env.insert(k.into(), v.into());
            }
        }
        plan.protected.extend([
            l.path.join(".git"),
            self.admin.join("commondir"),
            self.admin.join("gitdir"),
            self.admin.join("config.worktree"),
            private.join("objects/info/alternates"),
        ]);
        plan.protected.sort();
        plan.protected.dedup();
        plan
    }
}

/// After the run: bring the jail's commits on the branch back into the repository. The lines
/// to print.
pub fn finish(s: &Session) -> Vec<String> {
    sync(s, "the run")
}

fn sync(s: &Session, what: &str) -> Vec<String> {
    let l = &s.layout;
    let tip_path = l.private().join("refs/heads").join(&l.name);
    let tip = match read_small(&tip_path) {
        Ok(t) => t.trim().to_string(),
        Err(_) => {
            let _ = write_base(l, None);
            return vec![format!(
                "worktree {}: {what} left no branch {} (deleted, or made a link): the \
                 repository's branch is unchanged",
                l.name, l.name
            )];
        }
    };
    if !tip.bytes().all(|b| b.is_ascii_hexdigit()) || !matches!(tip.len(), 40 | 64) {
        let _ = write_base(l, None);
        return vec![format!(
            "worktree {}: {what} left branch {} at {tip:?}, not a commit: the repository's \
             branch is unchanged",
            l.name, l.name
        )];
    }
    if s.base.as_deref() == Some(tip.as_str()) {
        let _ = write_base(l, None);
        return Vec::new();
    }
    let lines = match import(s, &tip) {
        Ok(line) => vec![line],
        Err(e) => vec![format!("worktree {}: {e:#}", l.name)],
    };
    let _ = write_base(l, None);
    lines
}

/// Fetch the private branch into the import ref, then move the branch to it when it still is
/// where the run started.
fn import(s: &Session, tip: &str) -> anyhow::Result<String> {
    let l = &s.layout;
    let _repo = repo_lock(&l.state)?;
    let mut c = git(&l.main);
    c.args([
        "-c",
        "transfer.fsckObjects=true",
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        "--no-recurse-submodules",
        "--no-auto-gc",
        "--end-of-options",
    ])
    .arg(l.private())
    .arg(format!("+{}:{}", l.branch_ref(), l.import_ref()));
    output(c, "bring the jail's commits into the repository")?;
    let mut c = git(&l.main);
    c.args(["update-ref", "-m"])
        .arg(format!("corral: worktree {}", l.name))
        .args(["--end-of-options", &l.branch_ref(), tip])
        .arg(s.base.as_deref().unwrap_or(""));
    if let Err(e) = output(c, "move the branch") {
        bail!(
            "branch {} moved in the repository while the jail ran, so corral left it: the \
             jail's commits are at {} ({e:#})",
            l.name,
            l.import_ref()
        );
    }
    let mut c = git(&l.main);
    c.args(["update-ref", "-d", "--end-of-options", &l.import_ref()]);
    output(c, "remove the import ref")?;
    Ok(format!(
        "worktree {}: branch {} is now at {} ({})",
        l.name,
        l.name,
        &tip[..12],
        l.path.display()
    ))
}

/// One worktree, as `corral worktree ls` lists it.
#[derive(Debug, Serialize)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
    /// The branch checked out there (`None`: a detached HEAD).
    pub branch: Option<String>,
    /// An agent runs in it now.
    pub running: bool,
    /// Commits on the branch that the main worktree's HEAD lacks, and the other way round.
    pub ahead: u64,
    pub behind: u64,
    /// Files the branch changed since it forked from the main worktree's HEAD.
    pub changed: u64,
    /// Files changed in the worktree and not committed.
    pub uncommitted: u64,
}

/// The worktrees corral made for the repository holding `cwd`.
pub fn list(cwd: &Path) -> anyhow::Result<(PathBuf, Vec<Entry>)> {
    let main = main_repository(cwd)?;
    let base = base_dir(&main);
    let mut c = git(&main);
    c.args(["worktree", "list", "--porcelain"]);
    let text = {
        let _repo = repo_lock(&base.join(".corral"))?;
        output(c, "list the repository's worktrees")?
    };
    let mut entries = Vec::new();
    for block in text.split("\n\n") {
        let mut path = None;
        let mut branch = None;
        for line in block.lines() {
            if let Some(p) = line.strip_prefix("worktree ") {
                path = Some(PathBuf::from(p));
            } else if let Some(b) = line.strip_prefix("branch refs/heads/") {
                branch = Some(b.to_string());
            }
        }
        let Some(path) = path.filter(|p| p.parent() == Some(base.as_path())) else {
            continue;
        };
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let l = Layout::at(main.clone(), &name);
        entries.push(entry(&l, branch)?);
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((base, entries))
}

fn entry(l: &Layout, branch: Option<String>) -> anyhow::Result<Entry> {
    let (mut ahead, mut behind, mut changed) = (0, 0, 0);
    if let Some(b) = &branch {
        let range = format!("HEAD...refs/heads/{b}");
        let mut c = git(&l.main);
        c.args(["rev-list", "--left-right", "--count", &range, "--"]);
        let counts = output(c, "count the branch's commits")?;
        let mut it = counts
            .split_whitespace()
            .map(|n| n.parse::<u64>().unwrap_or(0));
        behind = it.next().unwrap_or(0);
        ahead = it.next().unwrap_or(0);
        let mut c = git(&l.main);
        c.args([
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--name-only",
            &range,
            "--",
        ]);
        changed = output(c, "list the branch's changed files")?
            .lines()
            .count() as u64;
    }
    let mut c = git(&l.path);
    c.env("GIT_OPTIONAL_LOCKS", "0")
        .args(["status", "--porcelain", "--untracked-files=all"]);
    let uncommitted = output(c, &format!("read the status of {}", l.path.display()))?
        .lines()
        .count() as u64;
    Ok(Entry {
        name: l.name.clone(),
        path: l.path.clone(),
        branch,
        running: running(l),
        ahead,
        behind,
        changed,
        uncommitted,
    })
}

/// `corral worktree rm NAME`: refused while an agent runs there; `git worktree remove`
/// (`force`: with uncommitted changes), corral's private state of it, and the branch when
/// `delete_branch`. The lines to print.
pub fn remove(
    cwd: &Path,
    name: &str,
    force: bool,
    delete_branch: bool,
) -> anyhow::Result<Vec<String>> {
    let l = Layout::new(cwd, name)?;
    if admin_dir(&l).is_err() {
        bail!(
            "no worktree {name} of {} (corral worktree ls lists them)",
            l.main.display()
        );
    }
    let _lock = lock(&l).map_err(|e| anyhow::anyhow!("{e:#}: stop it first"))?;
    let _repo = repo_lock(&l.state)?;
    let mut c = git(&l.main);
    c.args(["worktree", "remove"]);
    if force {
        c.arg("--force");
    }
    c.arg("--end-of-options").arg(&l.path);
    output(c, &format!("remove the worktree {}", l.path.display())).map_err(|e| {
        anyhow::anyhow!("{e:#} (uncommitted changes are kept unless you add --force)")
    })?;
    let mut lines = vec![format!("removed worktree {name} ({})", l.path.display())];
    let private = l.private();
    if fs::symlink_metadata(&private).is_ok() {
        fs::remove_dir_all(&private)
            .with_context(|| format!("cannot remove {}", private.display()))?;
    }
    for p in [base_path(&l), l.lock_path()] {
        let _ = fs::remove_file(p);
    }
    if delete_branch {
        let mut c = git(&l.main);
        c.args(["branch", "-D", "--end-of-options", name]);
        output(c, &format!("delete the branch {name}"))?;
        lines.push(format!("deleted branch {name}"));
    } else {
        lines.push(format!(
            "kept branch {name} (corral worktree rm --delete-branch {name} deletes it)"
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_plain_branch_and_directory_names_are_refused() {
        for bad in [
            "", ".x", "-x", "a/b", "a..b", "a.lock", "a.", "a b", "a:b", "ä", "../x",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["w1", "fix-login", "agent_2", "v1.2"] {
            check_name(good).unwrap();
        }
        assert!(check_name(&"a".repeat(101)).is_err());
    }
}
