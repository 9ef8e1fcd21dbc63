//! The git files that `protect` cannot cover with a read-only placeholder, checked after a
//! native run.
//!
//! - The project's own `.git/commondir` makes git read another directory's config and hooks (a
//!   bare repository the jail wrote, whose `core.fsmonitor` runs on the user's next `git status`
//!   on the host); `.git/config.worktree` adds config. Git refuses to work when `commondir`
//!   exists in any form, so it cannot be held by an empty placeholder during the run; instead,
//!   one the jail created or changed is moved aside when the jail has ended (every process of it
//!   is gone by then) and reported.
//! - Every other git directory in the project, which git on the host uses when the user (or an
//!   IDE, which runs `git status` in each repository it finds) runs git there: a nested
//!   repository's `sub/.git/` and a submodule's `.git/modules/NAME/` (nested modules too). A
//!   `config` (or `config.worktree`) the run created or changed is moved aside when it sets a
//!   key that runs a command ([`dangerous_config`]); a hook the run created or changed is moved
//!   aside (a regular `*.sample` file excepted: git runs a hook by its exact name only); so is a
//!   `commondir`, a symbolic link put where a hooks or modules directory was, and a gitlink
//!   (`sub/.git` as a file `gitdir: PATH`, or as a link) whose target was not a git directory
//!   before the run. These are found by one walk of the project that only reads directory
//!   entries (no `stat` per file) and does not enter any `.git`, before and after the run.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use corral_policy::tree::Tree;

const WATCHED: &[&str] = &[".git/commondir", ".git/config.worktree"];

/// Files read whole at most (bigger ones are compared by metadata, and a bigger config is
/// treated as dangerous).
const READ_MAX: u64 = 256 * 1024;

/// How deep `.git/modules` nests (a module named `a/b/c`, modules of modules) at most.
const MODULES_DEPTH_MAX: usize = 32;

/// What a watched path held: absent, a regular file's bytes, a link's target, or another kind
/// of file (or a file too big to read), by its metadata.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum WatchedContent {
    Absent,
    File {
        bytes: Vec<u8>,
        mode: u32,
    },
    Link(#[serde(with = "crate::journal::path_bytes")] PathBuf),
    Other {
        mode: u32,
        size: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
        ino: u64,
    },
}

fn state(path: &Path) -> WatchedContent {
    match fs::symlink_metadata(path) {
        Err(_) => WatchedContent::Absent,
        Ok(m) if m.file_type().is_symlink() => {
            WatchedContent::Link(fs::read_link(path).unwrap_or_default())
        }
        Ok(m) if m.is_file() && m.len() <= READ_MAX => match fs::read(path) {
            Ok(bytes) => WatchedContent::File {
                bytes,
                mode: m.mode(),
            },
            Err(_) => other(&m),
        },
        Ok(m) => other(&m),
    }
}

fn other(m: &fs::Metadata) -> WatchedContent {
    WatchedContent::Other {
        mode: m.mode(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        ino: m.ino(),
    }
}

/// What a file found in or beside a git directory is to git.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Role {
    /// `config` or `config.worktree` of a git directory.
    Config,
    /// A file under a git directory's `hooks/`.
    Hook,
    /// A git directory's `commondir`.
    Commondir,
    /// A `.git` that is a file or a link: where git finds the repository.
    Gitlink,
    /// A link where git expects a directory of a git directory (`hooks`, `modules`, a module,
    /// `worktrees`, a worktree's administrative directory).
    Link,
    /// `commondir` of a linked worktree's administrative directory (`worktrees/NAME/`): kept
    /// when it leads back to the repository that holds that directory.
    AdminCommondir,
}

/// The git files of a project at one time, and (before the run) its git directories.
#[derive(Default)]
struct Scan {
    files: HashMap<PathBuf, (Role, WatchedContent)>,
    /// Canonical paths of the git directories found.
    gitdirs: HashSet<PathBuf>,
    /// What the jail gets read-only ([`protect`]): the files and hooks directories found that
    /// make git run a command or read another repository.
    protect: Vec<PathBuf>,
    /// Each repository's git directory and the directory its relative `core.hooksPath` is
    /// taken from (the work tree's top, or a bare repository itself).
    repos: Vec<(PathBuf, PathBuf)>,
}

impl Scan {
    fn add(&mut self, path: PathBuf, role: Role) {
        let s = state(&path);
        if s != WatchedContent::Absent {
            self.files.insert(path, (role, s));
        }
    }

    fn gitdir(&mut self, dir: &Path, depth: usize) {
        if let Ok(c) = dir.canonicalize() {
            self.gitdirs.insert(c);
        }
        self.add(dir.join("config"), Role::Config);
        self.add(dir.join("config.worktree"), Role::Config);
        self.add(dir.join("commondir"), Role::Commondir);
        for name in ["config", "config.worktree", "commondir"] {
            self.protect_file(dir.join(name));
        }
        // An absent config or config.worktree: an empty read-only placeholder (git reads it as
        // empty), so the jail cannot give this repository one while the run lasts.
        for name in ["config", "config.worktree"] {
            self.hold_absent(dir, name);
        }
        let hooks = dir.join("hooks");
        match fs::symlink_metadata(&hooks) {
            Ok(m) if m.is_dir() => {
                self.protect.push(hooks.clone());
                self.hooks(&hooks, 0)
            }
            Ok(_) => self.add(hooks, Role::Link),
            // Absent: an empty read-only placeholder, where corral can make one.
            Err(_) if nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok() => {
                self.protect.push(hooks)
            }
            Err(_) => {}
        }
        self.worktrees(dir);
        self.modules(&dir.join("modules"), depth);
    }

    /// An absent `dir/name`: held by an empty read-only placeholder, where corral can make one.
    fn hold_absent(&mut self, dir: &Path, name: &str) {
        let path = dir.join(name);
        if fs::symlink_metadata(&path).is_err()
            && nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
        {
            self.protect.push(path);
        }
    }

    /// Protect `path` when it is a regular file (a link there is left to the check after the
    /// run: the jail refuses to bind through links below the project).
    fn protect_file(&mut self, path: PathBuf) {
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            self.protect.push(path);
        }
    }

    /// `worktrees/NAME/` of a git directory: each linked worktree's administrative directory.
    /// Its `commondir` names the repository whose config and hooks that worktree uses, and its
    /// `config.worktree` adds config; its `gitdir` says where the worktree is (git reads it to
    /// list, move, repair or prune worktrees, never for config or hooks). HEAD, index and logs
    /// stay writable, so the jail can still commit in a linked worktree.
    fn worktrees(&mut self, dir: &Path) {
        let wt = dir.join("worktrees");
        match fs::symlink_metadata(&wt) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return self.add(wt, Role::Link),
            Err(_) => return,
        }
        let Ok(rd) = fs::read_dir(&wt) else { return };
        for e in rd.flatten() {
            let admin = e.path();
            match e.file_type() {
                Ok(t) if t.is_symlink() => self.add(admin, Role::Link),
                Ok(t) if t.is_dir() => {
                    if let Ok(c) = admin.canonicalize() {
                        self.gitdirs.insert(c);
                    }
                    self.add(admin.join("commondir"), Role::AdminCommondir);
                    self.add(admin.join("config.worktree"), Role::Config);
                    for name in ["commondir", "config.worktree", "gitdir"] {
                        self.protect_file(admin.join(name));
                    }
                    self.hold_absent(&admin, "config.worktree");
                }
                _ => {}
            }
        }
    }

    /// Every file under a hooks directory (git runs only its top level, but a link or
    /// `core.hooksPath` can point lower).
    fn hooks(&mut self, dir: &Path, depth: usize) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() && depth < MODULES_DEPTH_MAX => self.hooks(&p, depth + 1),
                _ => self.add(p, Role::Hook),
            }
        }
    }

    /// `modules/`: each directory holding a `HEAD` or a `config` is a module's git directory;
    /// any other directory is part of a module's name (`a/b`).
    fn modules(&mut self, dir: &Path, depth: usize) {
        if depth > MODULES_DEPTH_MAX {
            return;
        }
        match fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return self.add(dir.to_path_buf(), Role::Link),
            Err(_) => return,
        }
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_symlink() => self.add(p, Role::Link),
                Ok(t) if t.is_dir() => {
                    if p.join("HEAD").symlink_metadata().is_ok()
                        || p.join("config").symlink_metadata().is_ok()
                    {
                        self.gitdir(&p, depth + 1)
                    } else {
                        self.modules(&p, depth + 1)
                    }
                }
                _ => {}
            }
        }
    }
}

/// What the walk of a project finds: every `.git` entry below the root, and every directory
/// that git itself takes for a (bare) git directory.
#[derive(Default)]
struct ProjectGitEntries {
    dot_git: Vec<PathBuf>,
    /// Directories holding `HEAD`, `objects/` and `refs/`: git's discovery uses such a
    /// directory as a bare repository when it is run in it or below, no `.git` needed (unless
    /// the user's git has `safe.bareRepository=explicit`).
    bare: Vec<PathBuf>,
    /// `HEAD` files in directories that are not (yet) git directories: read-only in the jail,
    /// or writing one and adding `objects/` and `refs/` would make a repository the name gate
    /// never saw created.
    stray_heads: Vec<PathBuf>,
}

/// Every `.git` under the tree's root except `root/.git`, and every directory shaped like a
/// bare repository, not entering any of them, links not followed: a query over the project's
/// tree index (corral_policy::tree), which reads only the directories changed since it was
/// last updated. No limit on the number of entries: one would let the jail hide a repository
/// behind enough files. An unreadable directory is skipped (git on the host cannot be made to
/// use a repository the user cannot read); of one whose listing failed partway, the entries
/// read are looked at.
fn find_git_dirs(tree: &Tree) -> ProjectGitEntries {
    let root = tree.root();
    let mut found = ProjectGitEntries::default();
    let mut stack = vec![PathBuf::new()];
    let mut subdirs = Vec::new();
    while let Some(rel) = stack.pop() {
        let Some(listing) = tree.listing(&rel) else {
            continue;
        };
        let dir = root.join(&rel);
        // git asks only access(X_OK) of `objects` and `refs`: a socket or an executable file
        // passes as well as a directory.
        let names = listing.git_names();
        let (head, objects, refs) = (names.head_file, names.objects, names.refs);
        if names.dot_git && !rel.as_os_str().is_empty() {
            found.dot_git.push(dir.join(".git"));
        }
        for name in listing.subdirs() {
            if name != ".git" {
                subdirs.push(rel.join(name));
            }
        }
        if head && objects && refs && !rel.as_os_str().is_empty() {
            found.bare.push(dir);
            subdirs.clear();
        } else {
            if head {
                found.stray_heads.push(dir.join("HEAD"));
            }
            stack.append(&mut subdirs);
        }
    }
    found.dot_git.sort();
    found.bare.sort();
    found
}

/// [`find_git_dirs`] by a plain walk of `root` (what the tree index must agree with).
#[cfg(test)]
fn walk_git_dirs(root: &Path) -> ProjectGitEntries {
    let mut found = ProjectGitEntries::default();
    let mut stack = vec![root.to_path_buf()];
    let mut subdirs = Vec::new();
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        let (mut head, mut objects, mut refs) = (false, false, false);
        for e in rd.flatten() {
            let name = e.file_name();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if name == ".git" {
                if dir != root {
                    found.dot_git.push(e.path());
                }
                continue;
            }
            // git asks only access(X_OK) of `objects` and `refs`: a socket or an executable
            // file passes as well as a directory.
            match name.as_encoded_bytes() {
                b"HEAD" => head = !is_dir,
                b"objects" => objects = true,
                b"refs" => refs = true,
                _ => {}
            }
            if is_dir {
                subdirs.push(e.path());
            }
        }
        if head && objects && refs && dir != root {
            found.bare.push(dir);
            subdirs.clear();
        } else {
            if head {
                found.stray_heads.push(dir.join("HEAD"));
            }
            stack.append(&mut subdirs);
        }
    }
    found.dot_git.sort();
    found.bare.sort();
    found
}

fn scan(root: &Path, tree: &Tree) -> Scan {
    let mut s = Scan::default();
    let own = root.join(".git");
    if let Ok(c) = own.canonicalize() {
        s.gitdirs.insert(c);
    }
    // The project's own config and hooks are protected read-only (the default `protect`);
    // its modules and linked worktrees' administrative directories are not.
    if fs::symlink_metadata(&own).is_ok_and(|m| m.is_dir()) {
        for name in ["config.worktree", "commondir"] {
            s.protect_file(own.join(name));
        }
        s.hold_absent(&own, "config.worktree");
        s.worktrees(&own);
        s.repos.push((own.clone(), root.to_path_buf()));
    }
    s.modules(&own.join("modules"), 0);
    let found = find_git_dirs(tree);
    for head in found.stray_heads {
        s.protect_file(head);
    }
    for dir in &found.bare {
        s.gitdir(dir, 0);
        s.repos.push((dir.clone(), dir.clone()));
    }
    for p in found.dot_git {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {
                s.gitdir(&p, 0);
                if let Some(base) = p.parent() {
                    s.repos.push((p.clone(), base.to_path_buf()));
                }
            }
            Ok(_) => {
                // A gitlink that was there before the run: its target is a git directory.
                if let Some(t) = gitlink_target(&p)
                    && let Ok(c) = t.canonicalize()
                {
                    s.gitdirs.insert(c);
                }
                s.add(p, Role::Gitlink)
            }
            Err(_) => {}
        }
    }
    s
}

/// Where a `.git` file or link sends git: `gitdir: PATH` (relative to the file's directory), or
/// the link's target.
fn gitlink_target(path: &Path) -> Option<PathBuf> {
    let parent = path.parent()?;
    let m = fs::symlink_metadata(path).ok()?;
    if m.file_type().is_symlink() {
        return Some(parent.join(fs::read_link(path).ok()?));
    }
    if !m.is_file() || m.len() > READ_MAX {
        return None;
    }
    let text = fs::read(path).ok()?;
    let text = String::from_utf8(text).ok()?;
    let rest = text.strip_prefix("gitdir:")?;
    let rest = rest.trim_end_matches(['\n', '\r']).trim();
    if rest.is_empty() {
        return None;
    }
    Some(parent.join(rest))
}

/// The watched paths of a project before its jail starts.
pub struct Snapshot {
    fixed: Vec<(PathBuf, WatchedContent)>,
    root: PathBuf,
    /// The other git directories (`None`: the project is not writable in the jail).
    nested: Option<Scan>,
}

/// What [`check`] needs of a [`Snapshot`], in a form that can be written down (the journal of a
/// run in progress, journal.rs): paths as bytes, whatever their encoding.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Saved {
    fixed: Vec<(std::ffi::OsString, WatchedContent)>,
    root: std::ffi::OsString,
    nested: Option<SavedScan>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedScan {
    files: Vec<(std::ffi::OsString, Role, WatchedContent)>,
    gitdirs: Vec<std::ffi::OsString>,
}

impl Snapshot {
    /// What [`check`] needs of this snapshot, to be written down.
    pub fn saved(&self) -> Saved {
        Saved {
            fixed: (self.fixed.iter())
                .map(|(p, s)| (p.clone().into_os_string(), s.clone()))
                .collect(),
            root: self.root.clone().into_os_string(),
            nested: self.nested.as_ref().map(|scan| SavedScan {
                files: (scan.files.iter())
                    .map(|(p, (r, s))| (p.clone().into_os_string(), *r, s.clone()))
                    .collect(),
                gitdirs: (scan.gitdirs.iter())
                    .map(|p| p.clone().into_os_string())
                    .collect(),
            }),
        }
    }
}

impl From<Saved> for Snapshot {
    /// A snapshot read back, for [`check`] only (what it protected is not kept).
    fn from(saved: Saved) -> Snapshot {
        Snapshot {
            fixed: (saved.fixed.into_iter())
                .map(|(p, s)| (PathBuf::from(p), s))
                .collect(),
            root: PathBuf::from(saved.root),
            nested: saved.nested.map(|scan| Scan {
                files: (scan.files.into_iter())
                    .map(|(p, r, s)| (PathBuf::from(p), (r, s)))
                    .collect(),
                gitdirs: scan.gitdirs.into_iter().map(PathBuf::from).collect(),
                ..Scan::default()
            }),
        }
    }
}

/// `plan` with the dangerous parts of the git directories `snapshot` found read-only in the
/// jail: in every git directory of the project other than its own `.git` (nested repositories,
/// submodules' directories under `.git/modules`, directories shaped like bare repositories)
/// `config`, `config.worktree`, `commondir` and `hooks/` (an absent one held by an empty
/// placeholder); in every one, the project's own included, `config.worktree`, `commondir` and
/// each linked worktree's `worktrees/NAME/{commondir,gitdir,config.worktree}`. Objects, refs,
/// the index, HEAD and logs stay writable, so commits work. What exists only after the run
/// started (a new repository, a new `commondir`) is the check's ([`check`]).
pub fn protect(plan: &corral_policy::Plan, snapshot: &Snapshot) -> corral_policy::Plan {
    let mut plan = plan.clone();
    if let Some(scan) = &snapshot.nested {
        plan.protected.extend(scan.protect.iter().cloned());
        plan.protected.sort();
        plan.protected.dedup();
    }
    plan
}

/// The paths [`protect`] adds to a Plan's `protected`.
pub fn protected_paths(snapshot: &Snapshot) -> Vec<PathBuf> {
    snapshot
        .nested
        .as_ref()
        .map(|scan| scan.protect.clone())
        .unwrap_or_default()
}

/// The git directories that exist now, for the name gate (`Plan::git`, corral-namegate
/// `namegate.rs`): the only places outside the jail's own file systems where the jail may
/// create a `HEAD` while it runs. Every git directory the snapshot found (the project's, nested
/// repositories', submodules', linked worktrees' administrative directories), where the
/// project's own `.git` file leads (a linked worktree: its administrative directory and the
/// repository's), and the `.git` directory of each of `rw_binds`.
pub fn git_dirs(snapshot: &Snapshot, rw_binds: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = snapshot
        .nested
        .as_ref()
        .map(|scan| scan.gitdirs.iter().cloned().collect())
        .unwrap_or_default();
    let own = snapshot.root.join(".git");
    let mut linked = Vec::new();
    match fs::symlink_metadata(&own) {
        Ok(m) if m.is_dir() => linked.push(own),
        Ok(_) => {
            if let Some(admin) = gitlink_target(&own) {
                if let Ok(common) = fs::read_to_string(admin.join("commondir")) {
                    linked.push(admin.join(common.trim_end_matches(['\n', '\r'])));
                }
                linked.push(admin);
            }
        }
        Err(_) => {}
    }
    linked.extend(rw_binds.iter().map(|b| b.join(".git")));
    dirs.extend(
        linked
            .into_iter()
            .filter(|d| d.is_dir())
            .filter_map(|d| d.canonicalize().ok()),
    );
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Take the snapshot: `nested` also scans every other git directory of the project (a query
/// of its tree index: the one made when the Plan was made in this process, else an update).
pub fn snapshot(project_root: &Path, nested: bool, home: &Path) -> Snapshot {
    Snapshot {
        fixed: WATCHED
            .iter()
            .map(|rel| {
                let path = project_root.join(rel);
                let s = state(&path);
                (path, s)
            })
            .collect(),
        root: project_root.to_path_buf(),
        nested: nested.then(|| {
            let tree = corral_policy::tree::take_or_update(project_root);
            let mut s = scan(project_root, &tree);
            hooks_paths(&mut s, project_root, home);
            s
        }),
    }
}

/// `core.hooksPath`: git runs hooks from that directory instead of `hooks/`. Inside the project
/// it is usually a tracked directory (husky's `.husky/`, a `.githooks/`) that the jail could
/// otherwise write, so each repository's (its own config's, else the user's global one's) is
/// protected like `hooks/`, an absent one by a placeholder. Read from the files themselves
/// (`config`, `~/.gitconfig`, `$XDG_CONFIG_HOME/git/config`), not through git: the system
/// config and `include`d files are not followed.
fn hooks_paths(s: &mut Scan, root: &Path, home: &Path) {
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| home.join(".config"));
    let global = [xdg.join("git/config"), home.join(".gitconfig")]
        .iter()
        .find_map(|f| hooks_path_of(f));
    for (gitdir, base) in s.repos.clone() {
        let Some(value) = hooks_path_of(&gitdir.join("config")).or_else(|| global.clone()) else {
            continue;
        };
        let path = match value.strip_prefix("~/") {
            Some(rest) => home.join(rest),
            None => base.join(&value),
        };
        let path = lexical(&path);
        if path.starts_with(root) && path != root && no_link_on_the_way(root, &path) {
            s.protect.push(path);
        }
    }
}

/// The last `core.hooksPath` a config file sets.
fn hooks_path_of(file: &Path) -> Option<String> {
    let m = fs::metadata(file).ok()?;
    if !m.is_file() || m.len() > READ_MAX {
        return None;
    }
    let entries = parse_config(&fs::read(file).ok()?).ok()?;
    entries
        .into_iter()
        .rev()
        .filter(|(sec, sub, key, _)| sec == "core" && sub.is_none() && key == "hookspath")
        .find_map(|(_, _, _, v)| v.filter(|v| !v.is_empty()))
}

/// `path` with `.` and `..` resolved by name.
fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether no existing component of `path` below `root` is a link (the jail refuses to bind
/// through one; such a layout is left unprotected rather than refusing the run).
fn no_link_on_the_way(root: &Path, path: &Path) -> bool {
    let Ok(rel) = path.strip_prefix(root) else {
        return false;
    };
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => return false,
            Ok(_) => {}
            Err(_) => return true,
        }
    }
    true
}

fn aside_of(path: &Path, jail_id: &str) -> PathBuf {
    let mut aside = path.as_os_str().to_os_string();
    aside.push(format!(".corral-quarantine-{jail_id}"));
    PathBuf::from(aside)
}

/// Move `path` aside and say why (`what` completes "the jail wrote PATH, ...").
fn quarantine(path: &Path, jail_id: &str, what: &str) -> String {
    let aside = aside_of(path, jail_id);
    match fs::rename(path, &aside) {
        Ok(()) => format!(
            "the jail wrote {}, {what}; moved aside to {} (restore it only if you made it)",
            path.display(),
            aside.display()
        ),
        Err(e) => format!(
            "the jail wrote {}, {what}, and it could not be moved aside ({e}): remove it before \
             you run git in this project",
            path.display()
        ),
    }
}

impl Snapshot {
    /// Whether [`check`] looks at the project's other git directories (it then needs the
    /// project's tree index updated).
    pub fn nested(&self) -> bool {
        self.nested.is_some()
    }
}

/// After the jail has ended: move aside each watched path the run created or changed that
/// could make git on the host run a command. One message per path, for stderr and the audit
/// log.
pub fn check(snapshot: Snapshot, jail_id: &str) -> Vec<String> {
    check_in(snapshot, jail_id, None)
}

/// [`check`] with the project's tree index as updated after the jail ended (`None`: updated
/// here).
pub fn check_in(snapshot: Snapshot, jail_id: &str, tree: Option<&Tree>) -> Vec<String> {
    let mut out = Vec::new();
    for (path, before) in &snapshot.fixed {
        let now = state(path);
        if now == WatchedContent::Absent || now == *before {
            continue;
        }
        let what = match path.file_name().and_then(|n| n.to_str()) {
            Some("config.worktree") => {
                "a per-worktree config your next git command would read (it can name commands \
                 git runs: core.fsmonitor, core.pager, core.hooksPath)"
            }
            _ => {
                "which would make your next git command read another repository's config and hooks"
            }
        };
        out.push(quarantine(path, jail_id, what));
    }
    let Some(before) = snapshot.nested else {
        return out;
    };
    let after = match tree {
        Some(tree) if tree.root() == snapshot.root => scan(&snapshot.root, tree),
        _ => {
            let root = &snapshot.root;
            scan(
                root,
                &corral_policy::tree::update(root, std::slice::from_ref(root), &[]),
            )
        }
    };
    let mut changed: Vec<(&PathBuf, &(Role, WatchedContent))> = after
        .files
        .iter()
        .filter(|(p, now)| before.files.get(*p).is_none_or(|b| b.1 != now.1))
        .collect();
    // Deeper first: a hook inside a hooks directory before that directory's link, say.
    changed.sort_by(|a, b| b.0.cmp(a.0));
    for (path, (role, now)) in changed {
        if let Some(why) = danger(path, *role, now, &before.gitdirs) {
            out.push(quarantine(path, jail_id, &why));
        }
    }
    out
}

/// Why a git file the run created or changed is dangerous on the host, or `None` to keep it.
fn danger(
    path: &Path,
    role: Role,
    now: &WatchedContent,
    gitdirs: &HashSet<PathBuf>,
) -> Option<String> {
    match role {
        Role::Hook => {
            let sample = path.extension().is_some_and(|e| e == "sample");
            if sample && matches!(now, WatchedContent::File { .. }) {
                return None;
            }
            let exec = match now {
                WatchedContent::File { mode, .. } | WatchedContent::Other { mode, .. } => {
                    fs::Permissions::from_mode(*mode).mode() & 0o111 != 0
                }
                _ => true,
            };
            Some(if exec {
                "a git hook that your next git command in that repository would run".into()
            } else {
                "a git hook (git runs it once it is made executable)".into()
            })
        }
        Role::Config => match now {
            WatchedContent::File { bytes, .. } => dangerous_config(bytes).map(|k| {
                format!("a git config that sets {k}, which makes git on the host run a command")
            }),
            _ => Some("a git config that is not a regular file corral could read".into()),
        },
        Role::Commondir => Some(
            "which would make git in that repository read another repository's config and hooks"
                .into(),
        ),
        Role::Link => Some(
            "a link where git expects a directory of a repository (its hooks, modules or \
             worktrees)"
                .into(),
        ),
        Role::AdminCommondir => {
            // worktrees/NAME/commondir: git worktree add writes `../..`.
            let home = path.parent()?.parent()?.parent()?.canonicalize().ok();
            let to = match now {
                WatchedContent::File { bytes, .. } => String::from_utf8(bytes.clone())
                    .ok()
                    .map(|t| t.trim_end_matches(['\n', '\r']).to_string())
                    .and_then(|t| path.parent()?.join(t).canonicalize().ok()),
                _ => None,
            };
            (home.is_none() || to != home).then(|| {
                "which would make git in that linked worktree read another repository's config \
                 and hooks"
                    .into()
            })
        }
        Role::Gitlink => {
            let target = gitlink_target(path).and_then(|t| t.canonicalize().ok());
            let ok = target.is_some_and(|t| gitdirs.contains(&t) || new_worktree_of(&t, gitdirs));
            (!ok).then(|| {
                "a gitlink pointing git at a directory that was not a repository before the run"
                    .into()
            })
        }
    }
}

/// Whether `admin` is a linked worktree's administrative directory that `git worktree add`
/// made in the run: `REPO/worktrees/NAME` of a repository that was there before, its
/// `commondir` leading back to that repository (so git there uses that repository's protected
/// config and hooks).
fn new_worktree_of(admin: &Path, gitdirs: &HashSet<PathBuf>) -> bool {
    let Some(repo) = admin
        .parent()
        .filter(|w| w.ends_with("worktrees"))
        .and_then(Path::parent)
    else {
        return false;
    };
    if !gitdirs.contains(repo) {
        return false;
    }
    let Ok(text) = fs::read_to_string(admin.join("commondir")) else {
        return false;
    };
    let to = admin.join(text.trim_end_matches(['\n', '\r']));
    to.canonicalize().is_ok_and(|c| c == repo)
}

/// Key names (the last part, lower case) that make git run a command, in any section.
const COMMAND_KEYS: &[&str] = &[
    "fsmonitor",
    "hookspath",
    "sshcommand",
    "pager",
    "editor",
    "askpass",
    "gitproxy",
    "external",
    "textconv",
    "clean",
    "smudge",
    "process",
    "helper",
    "driver",
    "difffilter",
    "browser",
    "uploadpack",
    "receivepack",
];

/// Key name endings that make git run a command (`alternateRefsCommand`,
/// `gpg.ssh.defaultKeyCommand`, `difftool.X.cmd`, `gpg.program`, `packObjectsHook`).
const COMMAND_SUFFIXES: &[&str] = &["command", "cmd", "program", "hook"];

/// Whether a git config sets a key that makes git run a command: the first such key as
/// `section.key`, else `None`. Parsed like git's own reader (sections, subsections, quoting,
/// escapes, continued lines, comments); anything it cannot parse counts as dangerous.
pub fn dangerous_config(bytes: &[u8]) -> Option<String> {
    let entries = match parse_config(bytes) {
        Ok(e) => e,
        Err(e) => return Some(format!("something corral cannot parse ({e})")),
    };
    for (section, sub, key, value) in entries {
        let name = match &sub {
            Some(s) => format!("{section}.{s}.{key}"),
            None => format!("{section}.{key}"),
        };
        let value = value.unwrap_or_default();
        let bad = section.starts_with("include")
            || section == "pager"
            || (section == "alias" && value.contains('!'))
            || (key == "update" && value.contains('!'))
            || (section == "protocol" && key == "allow")
            || value.trim_start().to_ascii_lowercase().starts_with("ext::")
            || COMMAND_KEYS.contains(&key.as_str())
            || COMMAND_SUFFIXES.iter().any(|s| key.ends_with(s));
        if bad {
            return Some(name);
        }
    }
    None
}

/// One `section[.subsection].key[=value]` of a config: section and key in lower case.
type Entry = (String, Option<String>, String, Option<String>);

/// git's config syntax (config.c): returns every entry, or what is wrong.
fn parse_config(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let mut p = Parser { b: bytes, i: 0 };
    let mut out = Vec::new();
    let mut section: Option<(String, Option<String>)> = None;
    loop {
        let Some(c) = p.next() else { return Ok(out) };
        match c {
            b'\n' | b' ' | b'\t' | b'\r' | b'\x0b' | b'\x0c' => {}
            b'#' | b';' => p.skip_line(),
            b'[' => section = Some(p.section()?),
            c if c.is_ascii_alphabetic() => {
                let Some((s, sub)) = &section else {
                    return Err(format!("a key before any section, at byte {}", p.i));
                };
                let mut key = String::from((c as char).to_ascii_lowercase());
                while let Some(&c) = p.b.get(p.i)
                    && (c.is_ascii_alphanumeric() || c == b'-')
                {
                    key.push((c as char).to_ascii_lowercase());
                    p.i += 1;
                }
                p.skip_blanks();
                let value = match p.b.get(p.i) {
                    None | Some(b'\n') => None,
                    Some(b'\r') if p.b.get(p.i + 1) == Some(&b'\n') => None,
                    Some(b'#') | Some(b';') => None,
                    Some(b'=') => {
                        p.i += 1;
                        Some(p.value()?)
                    }
                    Some(_) => return Err(format!("a bad character after key {key}")),
                };
                out.push((s.clone(), sub.clone(), key, value));
            }
            _ => return Err(format!("a bad character at byte {}", p.i - 1)),
        }
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn next(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.next() {
            if c == b'\n' {
                return;
            }
        }
    }

    fn skip_blanks(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    /// After `[`: `name]`, `name.sub]` (old style, sub lower-cased by git) or `name "sub"]`.
    fn section(&mut self) -> Result<(String, Option<String>), String> {
        let mut name = String::new();
        loop {
            match self.next() {
                Some(b']') => break,
                Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'.' => {
                    name.push((c as char).to_ascii_lowercase())
                }
                Some(b' ' | b'\t') => {
                    self.skip_blanks();
                    if self.next() != Some(b'"') {
                        return Err(format!("a bad section header [{name}"));
                    }
                    let mut sub = Vec::new();
                    loop {
                        match self.next() {
                            None | Some(b'\n') => {
                                return Err(format!("an unterminated section header [{name}"));
                            }
                            Some(b'"') => break,
                            Some(b'\\') => match self.next() {
                                None | Some(b'\n') => {
                                    return Err(format!("a bad section header [{name}"));
                                }
                                Some(c) => sub.push(c),
                            },
                            Some(c) => sub.push(c),
                        }
                    }
                    if self.next() != Some(b']') {
                        return Err(format!("a bad section header [{name}"));
                    }
                    let sub = String::from_utf8_lossy(&sub).into_owned();
                    return Ok((name, Some(sub)));
                }
                _ => return Err(format!("a bad section header [{name}")),
            }
        }
        if name.is_empty() {
            return Err("an empty section header".into());
        }
        // `[a.b]` is section a, subsection b.
        Ok(match name.split_once('.') {
            Some((s, sub)) => (s.to_string(), Some(sub.to_string())),
            None => (name, None),
        })
    }

    /// After `=`: the value up to the end of the line (continued by `\` at the end),
    /// unquoted and unescaped, with surrounding blanks outside quotes trimmed.
    fn value(&mut self) -> Result<String, String> {
        let mut v: Vec<u8> = Vec::new();
        let mut quoted = false;
        // Length of `v` up to its last character that was not a blank outside quotes.
        let mut kept = 0usize;
        while let Some(c) = self.next() {
            match c {
                b'\n' => {
                    if quoted {
                        return Err("a quoted value that runs past the end of its line".into());
                    }
                    break;
                }
                b'\r' if self.b.get(self.i) == Some(&b'\n') => {}
                b'#' | b';' if !quoted => {
                    self.skip_line();
                    break;
                }
                b'"' => quoted = !quoted,
                b'\\' => match self.next() {
                    Some(b'\n') => {}
                    Some(b'\r') if self.b.get(self.i) == Some(&b'\n') => self.i += 1,
                    Some(b'n') => {
                        v.push(b'\n');
                        kept = v.len();
                    }
                    Some(b't') => {
                        v.push(b'\t');
                        kept = v.len();
                    }
                    Some(b'b') => {
                        v.pop();
                        kept = kept.min(v.len());
                    }
                    Some(c @ (b'\\' | b'"')) => {
                        v.push(c);
                        kept = v.len();
                    }
                    _ => return Err("a bad escape in a value".into()),
                },
                b' ' | b'\t' if !quoted => {
                    if !v.is_empty() {
                        v.push(c)
                    }
                }
                c => {
                    v.push(c);
                    kept = v.len();
                }
            }
        }
        if quoted {
            return Err("an unterminated quote in a value".into());
        }
        v.truncate(kept);
        Ok(String::from_utf8_lossy(&v).into_owned())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_run_created_or_changed_is_moved_aside_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        fs::create_dir(&git).unwrap();
        fs::write(git.join("config.worktree"), "[core]\n").unwrap();
        let s = snapshot(dir.path(), true, Path::new("/nonexistent"));
        // Unchanged: kept. New: moved aside.
        fs::write(git.join("commondir"), "../evil\n").unwrap();
        let msgs = check(s, "j1");
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(!git.join("commondir").exists());
        assert_eq!(
            fs::read_to_string(git.join("commondir.corral-quarantine-j1")).unwrap(),
            "../evil\n"
        );
        assert!(git.join("config.worktree").exists());
        // Changed, and replaced by a link: moved aside too.
        let s = snapshot(dir.path(), true, Path::new("/nonexistent"));
        fs::remove_file(git.join("config.worktree")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", git.join("config.worktree")).unwrap();
        let msgs = check(s, "j2");
        assert_eq!(msgs.len(), 1);
        assert!(fs::symlink_metadata(git.join("config.worktree")).is_err());
        // Each message names the file it moved for what it is.
        assert!(
            msgs[0].contains("config.worktree, a per-worktree config"),
            "{msgs:?}"
        );
        assert!(!msgs[0].contains("another repository"), "{msgs:?}");
    }

    fn bad(text: &str) -> Option<String> {
        dangerous_config(text.as_bytes())
    }

    #[test]
    fn config_keys_that_run_commands_are_found_whatever_the_spelling() {
        assert_eq!(
            bad("[core]\n\tfsmonitor = touch /tmp/x\n").as_deref(),
            Some("core.fsmonitor")
        );
        // Case, odd spacing, a key on the header's line, no value.
        assert_eq!(
            bad("[CoRe]  HooksPath=/x").as_deref(),
            Some("core.hookspath")
        );
        assert_eq!(
            bad("  [core] sshCommand\t=\tssh").as_deref(),
            Some("core.sshcommand")
        );
        assert_eq!(bad("[core]\npager\n").as_deref(), Some("core.pager"));
        // Subsections, old style and quoted (with escapes).
        assert_eq!(
            bad("[filter \"lfs\"]\n  clean = x\n").as_deref(),
            Some("filter.lfs.clean")
        );
        assert_eq!(
            bad("[diff.foo]\ntextconv=x").as_deref(),
            Some("diff.foo.textconv")
        );
        assert_eq!(
            bad("[includeIf \"gitdir:/a \\\"b\\\"/\"]\npath = evil").as_deref(),
            Some("includeif.gitdir:/a \"b\"/.path")
        );
        assert_eq!(bad("[include]\npath=x").as_deref(), Some("include.path"));
        assert_eq!(
            bad("[credential]\nhelper = !evil").as_deref(),
            Some("credential.helper")
        );
        assert_eq!(
            bad("[gpg \"ssh\"]\ndefaultKeyCommand = x").as_deref(),
            Some("gpg.ssh.defaultkeycommand")
        );
        assert_eq!(
            bad("[alias]\n\tst = \"!sh -c x\"").as_deref(),
            Some("alias.st")
        );
        assert_eq!(
            bad("[remote \"o\"]\nurl = ext::sh -c x").as_deref(),
            Some("remote.o.url")
        );
        assert_eq!(
            bad("[submodule \"m\"]\nupdate = !x").as_deref(),
            Some("submodule.m.update")
        );
        // A continued line is one value: the key after it is still in [core].
        assert_eq!(
            bad("[core]\na = b\\\n[alias]\nfsmonitor = x").as_deref(),
            Some("core.fsmonitor")
        );
        // Comment characters inside quotes are part of the value; after them, a comment.
        assert_eq!(
            bad("[x]\na = \"#\" ; c\n[core]\neditor=vi").as_deref(),
            Some("core.editor")
        );
        // CRLF and a byte-order mark.
        assert_eq!(
            bad("\u{feff}[core]\r\n\tfsmonitor = x\r\n").as_deref(),
            Some("core.fsmonitor")
        );
        // What git cannot parse counts as dangerous.
        assert!(bad("[core\nfsmonitor = x").is_some());
        assert!(bad("fsmonitor = x").is_some());
        assert!(bad("[core]\na = \"unterminated\n").is_some());
        assert!(bad("[core]\na = \\q\n").is_some());
    }

    #[test]
    fn what_git_init_and_submodule_init_write_is_kept() {
        let init = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\
                    \tlogallrefupdates = true\n";
        assert_eq!(bad(init), None);
        let module = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\
                      \tlogallrefupdates = true\n\tworktree = ../../../m\n\
                      [remote \"origin\"]\n\turl = https://example.com/m.git\n\
                      \tfetch = +refs/heads/*:refs/remotes/origin/*\n\
                      [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n\
                      [submodule \"m\"]\n\tactive = true\n\turl = ../m ; comment\n\
                      [alias]\n\tco = checkout\n# [core] fsmonitor = x\n";
        assert_eq!(bad(module), None);
        assert_eq!(bad(""), None);
    }

    #[test]
    fn nested_repositories_modules_and_gitlinks_the_run_planted_are_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, text).unwrap();
            p
        };
        let exec = |p: &Path| fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
        w(".git/HEAD", "ref: refs/heads/main\n");
        // Before: one nested repository with a sample hook, one module, one gitlink to it.
        w("old/.git/config", "[core]\n\tbare = false\n");
        exec(&w("old/.git/hooks/pre-commit.sample", "#!/bin/sh\n"));
        w(".git/modules/a/b/HEAD", "ref: refs/heads/main\n");
        w(".git/modules/a/b/config", "[core]\n");
        w("a/b/.git", "gitdir: ../../.git/modules/a/b\n");
        let s = snapshot(root, true, Path::new("/nonexistent"));
        // Kept: a benign change, a new sample hook, a new benign repository, a gitlink to a
        // repository that was there.
        w(
            "old/.git/config",
            "[core]\n\tbare = false\n\tworktree = ..\n",
        );
        exec(&w("new/.git/hooks/pre-push.sample", "#!/bin/sh\n"));
        w("new/.git/config", "[core]\n\tbare = false\n");
        w("x/y/.git", "gitdir: ../../.git/modules/a/b\n");
        // Moved aside.
        exec(&w(
            "old/.git/hooks/post-checkout",
            "#!/bin/sh\ntouch /tmp/x\n",
        ));
        w(".git/modules/a/b/config", "[core]\n\thooksPath = /tmp\n");
        w("deep/er/.git/config", "[Core]\nFSMonitor = \"touch x\"\n");
        w(".git/modules/m/config", "[core]\n");
        w("m/.git", "gitdir: ../.git/modules/m\n");
        w("n/.git", "gitdir: /nonexistent\n");
        w("old/.git/commondir", "../../evil\n");
        fs::create_dir_all(root.join("l")).unwrap();
        std::os::unix::fs::symlink("../m", root.join("l/.git")).unwrap();
        let msgs = check(s, "j3");
        let gone = [
            "old/.git/hooks/post-checkout",
            ".git/modules/a/b/config",
            "deep/er/.git/config",
            "m/.git",
            "n/.git",
            "old/.git/commondir",
            "l/.git",
        ];
        assert_eq!(msgs.len(), gone.len(), "{msgs:#?}");
        for rel in gone {
            assert!(
                fs::symlink_metadata(root.join(rel)).is_err(),
                "{rel}: {msgs:#?}"
            );
            assert!(
                fs::symlink_metadata(aside_of(&root.join(rel), "j3")).is_ok(),
                "{rel}: {msgs:#?}"
            );
            assert!(msgs.iter().any(|m| m.contains(rel)), "{rel}: {msgs:#?}");
        }
        for rel in [
            "old/.git/config",
            "new/.git/hooks/pre-push.sample",
            "new/.git/config",
            "x/y/.git",
            ".git/modules/m/config",
        ] {
            assert!(root.join(rel).exists(), "{rel}: {msgs:#?}");
        }
        // A second run that changes nothing moves nothing.
        assert!(check(snapshot(root, true, Path::new("/nonexistent")), "j4").is_empty());
    }

    /// Every entry below `root` (a directory with a `/`), for a failure's message.
    fn listing_of(root: &Path) -> Vec<String> {
        let (mut v, _) = corral_policy::resolve::walk_tree(root, |seen, out: &mut Vec<String>| {
            let corral_policy::resolve::Seen::Entry(e) = seen else {
                return corral_policy::resolve::Step::Next;
            };
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(rel + "/");
                corral_policy::resolve::Step::Enter
            } else {
                out.push(rel);
                corral_policy::resolve::Step::Next
            }
        });
        v.sort();
        v
    }

    #[test]
    fn the_tree_index_answers_what_a_full_walk_does_as_the_tree_changes() {
        use corral_policy::tree;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let hide: Vec<String> = [".env", "secret*", "keys/"].map(String::from).to_vec();
        let names = [
            ".env", "HEAD", "objects", "refs", ".git", "config", "secret1", "keys", "a", "b", "c",
            "d", "e",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let dirs_now = |root: &Path| -> Vec<PathBuf> {
            let mut v = vec![root.to_path_buf()];
            v.extend(
                listing_of(root)
                    .into_iter()
                    .filter_map(|r| r.strip_suffix('/').map(|r| root.join(r))),
            );
            v
        };
        let files_now = |root: &Path| -> Vec<PathBuf> {
            (listing_of(root).into_iter())
                .filter(|r| !r.ends_with('/'))
                .map(|r| root.join(r))
                .collect()
        };
        let mut prev = tree::scan(&root, None);
        let (mut relisted, mut held) = (0, 0);
        for round in 0..40 {
            for _ in 0..1 + rand(4) {
                let dirs = dirs_now(&root);
                let at = &dirs[rand(dirs.len())];
                let name = names[rand(names.len())];
                let _ = match rand(9) {
                    0 | 1 => fs::write(at.join(name), "x"),
                    2 | 3 => fs::create_dir(at.join(name)),
                    4 => {
                        let files = files_now(&root);
                        match files.is_empty() {
                            true => Ok(()),
                            false => fs::remove_file(&files[rand(files.len())]),
                        }
                    }
                    5 if at != &root => fs::remove_dir_all(at),
                    6 => {
                        // A file or directory moved elsewhere, under a new name.
                        let all = listing_of(&root);
                        if all.is_empty() {
                            continue;
                        }
                        let from = root.join(all[rand(all.len())].trim_end_matches('/'));
                        let to = dirs[rand(dirs.len())].join(names[rand(names.len())]);
                        fs::rename(from, to)
                    }
                    7 => {
                        // A directory shaped like a bare repository, or a nested one.
                        fs::create_dir_all(at.join("objects"))
                            .and_then(|_| fs::create_dir_all(at.join("refs")))
                            .and_then(|_| fs::write(at.join("HEAD"), "ref: x\n"))
                            .and_then(|_| fs::create_dir_all(at.join("n/.git/hooks")))
                    }
                    _ if at != &root => {
                        let mode = if rand(2) == 0 { 0 } else { 0o755 };
                        fs::set_permissions(at, fs::Permissions::from_mode(mode))
                    }
                    _ => Ok(()),
                };
            }
            // Past the racy window: the next round's changes are the only ones.
            std::thread::sleep(std::time::Duration::from_millis(60));
            let mut now = tree::scan(&root, Some(&prev));
            // Every other round with the matches noted (and carried over where unchanged).
            if round % 2 == 0 {
                now.match_entries(&hide);
            }
            relisted += now.relisted();
            held += now.len() - now.relisted();
            let walked = corral_policy::resolve::find_masked(&root, &hide).unwrap();
            assert_eq!(
                now.masked(&hide).unwrap(),
                walked,
                "round {round}: {:#?}",
                listing_of(&root)
            );
            let (a, b) = (find_git_dirs(&now), walk_git_dirs(&root));
            let mut heads = (a.stray_heads.clone(), b.stray_heads.clone());
            heads.0.sort();
            heads.1.sort();
            assert_eq!(
                (a.dot_git, a.bare, heads.0),
                (b.dot_git, b.bare, heads.1),
                "round {round}: {:#?}",
                listing_of(&root)
            );
            prev = now;
        }
        // Most directories were known unchanged: the index did spare their listings.
        eprintln!("directories kept {held}, listed {relisted}");
        assert!(held > relisted, "held {held}, relisted {relisted}");
        for d in dirs_now(&root) {
            let _ = fs::set_permissions(d, fs::Permissions::from_mode(0o755));
        }
    }

    #[test]
    fn bare_repositories_and_worktree_admin_files_are_protected_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, text).unwrap();
        };
        let d = |rel: &str| fs::create_dir_all(root.join(rel)).unwrap();
        w(".git/HEAD", "ref: refs/heads/main\n");
        w(".git/worktrees/wt/commondir", "../..\n");
        w(".git/worktrees/wt/gitdir", "/elsewhere/wt/.git\n");
        w(".git/worktrees/wt/HEAD", "ref: refs/heads/wt\n");
        // A bare repository in the project, and one inside a plain tree it must not enter.
        w("lib.git/HEAD", "ref: refs/heads/main\n");
        w(
            "lib.git/config",
            "[core]\n\tbare = true\n\thooksPath = ../tools/./hooks\n",
        );
        d("lib.git/objects");
        d("lib.git/refs/heads");
        d("lib.git/hooks");
        w("lib.git/objects/x/HEAD", "not a repository of its own\n");
        d("lib.git/objects/x/objects");
        d("lib.git/objects/x/refs");
        d("plain/deeper");
        let s = snapshot(root, true, Path::new("/nonexistent"));
        let mut protected = s.nested.as_ref().unwrap().protect.clone();
        protected.sort();
        let rel: Vec<String> = protected
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(
            rel,
            [
                // Absent ones: placeholders (git reads one if extensions.worktreeConfig is set).
                ".git/config.worktree",
                ".git/worktrees/wt/commondir",
                ".git/worktrees/wt/config.worktree",
                ".git/worktrees/wt/gitdir",
                "lib.git/config",
                "lib.git/config.worktree",
                "lib.git/hooks",
                "tools/hooks",
            ]
        );
        // The run: a worktree made and another re-pointed, a plain directory armed as a bare
        // repository, a benign bare repository.
        w(".git/worktrees/new/commondir", "../..\n");
        w(
            "new/.git",
            &format!("gitdir: {}\n", root.join(".git/worktrees/new").display()),
        );
        w(".git/worktrees/wt/commondir", "/evil\n");
        d("plain/objects");
        d("plain/refs");
        w("plain/HEAD", "ref: refs/heads/main\n");
        w("plain/config", "[core]\n\tpager = touch x\n");
        d("ok/objects");
        d("ok/refs");
        w("ok/HEAD", "ref: refs/heads/main\n");
        w("ok/config", "[core]\n\tbare = true\n");
        let msgs = check(s, "j5");
        assert_eq!(msgs.len(), 2, "{msgs:#?}");
        assert!(!root.join(".git/worktrees/wt/commondir").exists());
        assert!(!root.join("plain/config").exists());
        assert!(root.join(".git/worktrees/new/commondir").exists());
        assert!(root.join("new/.git").exists(), "{msgs:#?}");
        assert!(root.join("ok/config").exists());
        assert!(msgs.iter().any(|m| m.contains("core.pager")), "{msgs:#?}");
    }
}
