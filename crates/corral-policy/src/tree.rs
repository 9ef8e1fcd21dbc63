//! The tree index: one listing of the project's directory tree, kept between runs, so that the
//! searches every native run makes (the `hide` search for the masks, the git guard's search for
//! other repositories, both at the start and again at the end) cost a `stat` per directory
//! instead of a listing of every entry.
//!
//! Each directory is kept with its key (device, inode, mode, mtime and ctime in ns), taken
//! *before* it is listed, and its entries (name, whether a directory). An update walks the
//! directories the index knows from the root, by descriptor (each one opened `O_NOFOLLOW |
//! O_DIRECTORY` from its parent's descriptor, so no link is followed below the root), and lists
//! again only a directory whose key differs, or that is still in its racy window (below).
//! New directories are listed; gone ones are dropped. A tree with enough directories on one
//! level is walked by two threads from there, each taking every other subtree (a directory's
//! listing depends on it and its previous listing alone; the halves are merged).
//!
//! **Why a directory whose key is unchanged has the entries it had.** On Linux, adding,
//! removing or renaming an entry of a directory (create, mkdir, link, symlink, mknod, unlink,
//! rmdir, rename in or out) sets that directory's ctime to the kernel's clock, and no system
//! call sets a ctime to a chosen value (`utimensat` sets mtime and atime; setting either sets
//! ctime to now as well). A change of mode or owner (`chmod 000`, which makes a directory
//! unreadable) sets it too. So a directory whose ctime is the one it had before it was listed
//! has not been changed since, with one exception: the kernel stamps ctime with a coarse clock
//! (up to a tick, a few ms, behind the fine clock), so a change in the same tick as the key was
//! taken keeps the same ctime. The index therefore notes the fine clock before taking each
//! key (`listed_ns`), and trusts a directory only when its ctime is older than that by more
//! than [`CLOCK_SLACK_NS`] (50 ms, far above any tick): any change after the key was taken
//! carries a ctime at least the clock reading less a tick, so it differs from a ctime older
//! than the reading less the slack. A directory still inside that window is listed again on
//! every update until it is old enough (git's "racy index" has the same rule). The rule holds
//! on local file systems whose ctime the kernel keeps ([`trusted_fs`]: ext2/3/4, xfs, btrfs,
//! tmpfs, f2fs); on any other (fuse, nfs, 9p, cifs, overlayfs...), including a mount of one
//! inside the project, every directory is listed on every update. A system clock set back
//! by root could make a later change carry an old ctime: that is root's to do, not the jail's.
//!
//! The index is kept per project in corral's state directory (`STATE/PROJECT_KEY/tree-index`,
//! next to the audit log), written whole to a temporary file and renamed (mode 0600). It is
//! used only when that directory is outside everything the run's jail sees (checked like the
//! change record's: neither holds the other), its owner is the caller and nobody else may
//! write it; a file another user or the jail could have written, that is damaged, of another
//! version or of another project or caller is a miss: a full walk, never an error.
//!
//! The update made when the Plan is made (for its `hide` search) is stashed, and the git
//! guard's snapshot at the start of the run takes it ([`update_and_stash`],
//! [`take_or_update`]); the end of the run makes one more update, from the start's tree in
//! memory, serving both the search for hidden files that appeared and the git guard's check.
//! Each listing also keeps which of its entries the `hide` patterns match (for the patterns'
//! hash) and which of git's names it holds, so the searches look at directories and matches
//! only. A kept index whose directory the run's jail sees is removed. The file is written back
//! only when an entry changed: a directory listed again with the same entries keeps the old
//! key in the file and is listed again next time.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::PolicyError;

/// The kernel stamps ctime with its coarse clock, up to a tick behind a fine clock reading.
pub const CLOCK_SLACK_NS: i64 = 50_000_000;

/// The index's file name in a project's state directory.
pub const FILE_NAME: &str = "tree-index";

const MAGIC: &[u8] = b"corral tree index\n";
const VERSION: u32 = 2;

/// A directory's identity and change times, as `stat` gives them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Key {
    dev: u64,
    ino: u64,
    mode: u32,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Key {
    fn of(st: &libc::stat) -> Key {
        Key {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        }
    }
}

/// The directories of a tree by path relative to the root. Hashed with foldhash (seeded per
/// process), by the path's bytes (a `Path` hashes and compares component by component): every
/// walk looks each directory up in the previous tree and puts it in the new one.
type Dirs = HashMap<OsString, Listing, foldhash::fast::RandomState>;

/// Why a directory has no (complete) listing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Failed {
    /// It was gone (or no longer a directory) when it was opened.
    Gone,
    /// It could not be opened or read to the end (the entries read before the error are kept).
    Unreadable,
}

/// One directory of the index.
#[derive(Clone, Debug)]
pub struct Listing {
    key: Option<Key>,
    /// The fine clock (ns since the epoch) read before the key was taken.
    listed_ns: i64,
    /// Each entry: a byte 1 (a directory) or 2 (anything else), its name, a NUL; the
    /// directories first.
    entries: Arc<[u8]>,
    /// Where the entries that are not directories start in `entries`.
    dirs_len: u32,
    /// Which of the names git's discovery looks at it holds ([`GitNames`]).
    git: u8,
    failed: Option<Failed>,
    /// Which entries (by offset in `entries`) the `hide` patterns of the given hash match, when known:
    /// carried over with the listing, so an unchanged directory is not matched again.
    hits: Option<(u64, Arc<[u32]>)>,
}

impl Listing {
    /// A directory with no entries read: opening or taking it failed with errno `e`.
    fn failed_with(key: Option<Key>, listed_ns: i64, e: i32) -> Listing {
        Listing {
            key,
            listed_ns,
            entries: Arc::new([]),
            dirs_len: 0,
            git: 0,
            failed: Some(failure(e)),
            hits: None,
        }
    }

    /// The entries read: each name and whether it is a directory (the type the listing gave,
    /// a link being no directory).
    pub fn entries(&self) -> impl Iterator<Item = (&OsStr, bool)> {
        entries_in(&self.entries, 0).map(|(_, n, d)| (n, d))
    }

    /// The names of the entries that are directories.
    pub fn subdirs(&self) -> impl Iterator<Item = &OsStr> {
        entries_in(&self.entries[..self.dirs_len as usize], 0).map(|(_, n, _)| n)
    }

    /// Which of the names git looks at this directory holds.
    pub fn git_names(&self) -> GitNames {
        GitNames {
            dot_git: self.git & 1 != 0,
            head_file: self.git & 2 != 0,
            objects: self.git & 4 != 0,
            refs: self.git & 8 != 0,
        }
    }

    pub fn failed(&self) -> Option<Failed> {
        self.failed
    }

    fn has_subdirs(&self) -> bool {
        self.dirs_len > 0
    }

    /// Whether this listing still stands for a directory whose key is `key` now.
    fn holds_for(&self, key: &Key) -> bool {
        self.failed.is_none()
            && self.key.as_ref() == Some(key)
            && key.ctime_ns < self.listed_ns.saturating_sub(CLOCK_SLACK_NS)
    }
}

/// Of the names git's discovery looks at, the ones a directory holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GitNames {
    /// An entry `.git`, of any type.
    pub dot_git: bool,
    /// An entry `HEAD` that is not a directory.
    pub head_file: bool,
    /// An entry `objects`, of any type.
    pub objects: bool,
    /// An entry `refs`, of any type.
    pub refs: bool,
}

/// The entries encoded in `b` (which starts at offset `base` of its listing): offset, name,
/// whether a directory.
fn entries_in(b: &[u8], base: u32) -> impl Iterator<Item = (u32, &OsStr, bool)> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let rest = b.get(at..)?;
        let (&kind, after) = rest.split_first()?;
        let len = after.iter().position(|c| *c == 0)?;
        let off = at;
        at += len + 2;
        Some((
            base + off as u32,
            OsStr::from_bytes(&after[..len]),
            kind == 1,
        ))
    })
}

/// The directories under a project's root, each listed or known unchanged since it was.
/// `.git/objects` of the root is not listed (no search enters it).
#[derive(Clone, Debug)]
pub struct Tree {
    root: PathBuf,
    /// By path relative to the root (the root itself: the empty path).
    dirs: Dirs,
    /// Directories listed by the update that made this tree (the rest were known unchanged).
    relisted: usize,
    /// Of those, the ones whose entries differ from the previous tree's (or that it had not).
    changed: usize,
    /// Whether the kept file holds these listings (keys aside): read from it, or written.
    stored: bool,
}

impl Tree {
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The listing of the directory `rel` (relative to the root; the root: the empty path).
    pub fn listing(&self, rel: &Path) -> Option<&Listing> {
        self.dirs.get(rel.as_os_str())
    }

    /// How many directories the update that made this tree listed.
    pub fn relisted(&self) -> usize {
        self.relisted
    }

    /// How many directories the tree holds.
    pub fn len(&self) -> usize {
        self.dirs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// What [`crate::resolve::find_masked`] finds, from the index: every entry matched by one
    /// of the `hide` patterns, not below `.git/objects` or a matched directory, a directory
    /// below the root that could not be read masked whole. Sorted.
    pub fn masked(&self, patterns: &[String]) -> Result<Vec<PathBuf>, PolicyError> {
        if patterns.is_empty() {
            return Ok(Vec::new());
        }
        let mut set = Compiled::new(patterns);
        let hash = patterns_hash(patterns);
        let mut found = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let Some(l) = self.dirs.get(rel.as_os_str()) else {
                continue;
            };
            match l.failed {
                Some(Failed::Gone) => continue,
                // The jail runs as the directory's owner, who could make it readable.
                Some(Failed::Unreadable) if !rel.as_os_str().is_empty() => {
                    found.push(self.root.join(&rel))
                }
                _ => {}
            }
            let in_git = rel.as_os_str() == ".git";
            let memo = l.hits.as_ref().filter(|(h, _)| *h == hash).map(|(_, v)| v);
            let Some(memo) = memo else {
                let set = set.get()?;
                for (name, is_dir) in l.entries() {
                    if in_git && name == "objects" {
                        continue;
                    }
                    let child = rel.join(name);
                    if set.is_match(&child) {
                        found.push(self.root.join(&child));
                    } else if is_dir {
                        stack.push(child);
                    }
                }
                continue;
            };
            // The matches noted, then the directories that are not among them: no name
            // matched again, no other entry looked at.
            for &off in memo.iter() {
                let Some((_, name, _)) = entries_in(&l.entries[off as usize..], off).next() else {
                    continue;
                };
                if !(in_git && name == "objects") {
                    found.push(self.root.join(&rel).join(name));
                }
            }
            let mut hits = memo.iter().copied().peekable();
            for (off, name, _) in entries_in(&l.entries[..l.dirs_len as usize], 0) {
                while hits.next_if(|h| *h < off).is_some() {}
                if hits.next_if_eq(&off).is_some() || (in_git && name == "objects") {
                    continue;
                }
                stack.push(rel.join(name));
            }
        }
        found.sort();
        found.dedup_by(|below, dir| below.starts_with(dir));
        Ok(found)
    }
}

/// The `hide` patterns, compiled when a first name has to be matched: the listings of an
/// unchanged tree carry their matches, so a run in a project nobody changed compiles none
/// (a regex set costs about 0.1 ms the first time in a process, and its first match as much).
/// The patterns were checked one by one when the policy was read.
struct Compiled<'a> {
    patterns: &'a [String],
    set: Option<crate::hide::HideSet>,
}

impl<'a> Compiled<'a> {
    fn new(patterns: &'a [String]) -> Compiled<'a> {
        Compiled {
            patterns,
            set: None,
        }
    }

    fn get(&mut self) -> Result<&crate::hide::HideSet, PolicyError> {
        if self.set.is_none() {
            self.set = Some(crate::hide::HideSet::new(self.patterns)?);
        }
        Ok(self.set.as_ref().expect("compiled just now"))
    }
}

/// What the `hide` patterns are known by in a listing's memo of its matches.
fn patterns_hash(patterns: &[String]) -> u64 {
    let mut b = Vec::new();
    for p in patterns {
        b.extend_from_slice(p.as_bytes());
        b.push(0);
    }
    checksum(&b)
}

impl Tree {
    /// Note in each listing without them which of its entries `patterns` match (a listing
    /// carried over from the previous tree keeps its own).
    pub fn match_entries(&mut self, patterns: &[String]) {
        if patterns.is_empty() {
            return;
        }
        let mut set = Compiled::new(patterns);
        let hash = patterns_hash(patterns);
        for (rel, l) in self.dirs.iter_mut() {
            if l.hits.as_ref().is_some_and(|(h, _)| *h == hash) {
                continue;
            }
            let Ok(set) = set.get() else {
                return;
            };
            let hits: Vec<u32> = entries_in(&l.entries, 0)
                .filter(|(_, name, _)| set.is_match(&Path::new(rel).join(name)))
                .map(|(off, _, _)| off)
                .collect();
            l.hits = Some((hash, hits.into()));
        }
    }
}

/// The file systems whose directories' ctimes the index may trust (`statfs` f_type).
fn trusted_fs(f_type: i64) -> bool {
    const EXT: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    const TMPFS: i64 = 0x0102_1994;
    const F2FS: i64 = 0xF2F5_2010;
    matches!(f_type, EXT | XFS | BTRFS | TMPFS | F2FS)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn failure(e: i32) -> Failed {
    match e {
        libc::ENOENT | libc::ENOTDIR | libc::ELOOP => Failed::Gone,
        _ => Failed::Unreadable,
    }
}

fn cstr(name: &OsStr) -> Option<CString> {
    CString::new(name.as_bytes()).ok()
}

fn fstat(fd: RawFd) -> Option<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-buffer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

fn fstatat(dir: RawFd, name: &CString) -> Result<libc::stat, i32> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated, `st` a valid out-buffer.
    match unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } {
        0 => Ok(st),
        _ => Err(errno()),
    }
}

fn open_dir(dir: RawFd, name: &CString, nofollow: bool) -> Result<OwnedFd, i32> {
    let mut flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: `name` is NUL-terminated; the descriptor returned is ours.
    match unsafe { libc::openat(dir, name.as_ptr(), flags) } {
        fd if fd >= 0 => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        _ => Err(errno()),
    }
}

/// Read the entries of the directory open at `fd`: the encoded entries and whether the
/// listing failed partway.
fn list(fd: RawFd) -> (Listed, Option<Failed>) {
    // SAFETY: the duplicate is handed to fdopendir, which owns it until closedir.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return (Listed::default(), Some(Failed::Unreadable));
    }
    let dirp = unsafe { libc::fdopendir(dup) };
    if dirp.is_null() {
        unsafe { libc::close(dup) };
        return (Listed::default(), Some(Failed::Unreadable));
    }
    let (mut dirs, mut others, mut git) = (Vec::new(), Vec::new(), 0u8);
    let mut failed = None;
    loop {
        // SAFETY: errno is reset to tell an error from the end of the directory.
        unsafe { *libc::__errno_location() = 0 };
        let ent = unsafe { libc::readdir64(dirp) };
        if ent.is_null() {
            if errno() != 0 {
                failed = Some(Failed::Unreadable);
            }
            break;
        }
        // SAFETY: readdir's entry is valid until the next call.
        let (name, d_type) = unsafe {
            (
                std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()),
                (*ent).d_type,
            )
        };
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let is_dir = match d_type {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => fstatat(fd, &name.to_owned())
                .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
            _ => false,
        };
        git |= match bytes {
            b".git" => 1,
            b"HEAD" if !is_dir => 2,
            b"objects" => 4,
            b"refs" => 8,
            _ => 0,
        };
        let out = if is_dir { &mut dirs } else { &mut others };
        out.push(if is_dir { 1 } else { 2 });
        out.extend_from_slice(bytes);
        out.push(0);
    }
    // SAFETY: closes `dup` too.
    unsafe { libc::closedir(dirp) };
    let dirs_len = dirs.len() as u32;
    dirs.extend_from_slice(&others);
    let listed = Listed {
        entries: dirs,
        dirs_len,
        git,
    };
    (listed, failed)
}

/// A directory's entries as [`Listing`] keeps them.
#[derive(Default)]
struct Listed {
    entries: Vec<u8>,
    dirs_len: u32,
    git: u8,
}

/// The fine clock, in ns since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// One update of the index: `prev`'s directories whose key is unchanged (and out of the racy
/// window) are kept, every other one is listed. With no `prev`, a full walk. Reads the fine
/// clock with `clock` (a test fixes it).
pub fn scan_at(root: &Path, prev: Option<&Tree>, clock: &(dyn Fn() -> i64 + Sync)) -> Tree {
    let prev = prev.filter(|p| p.root == root);
    let mut tree = Tree::empty(root, prev.map_or(0, Tree::len));
    let mut fs_ok: HashMap<u64, bool> = HashMap::new();
    let Some(root_c) = cstr(root.as_os_str()) else {
        return tree;
    };
    let listed_ns = clock();
    // The root as named (a link to it is followed, as `read_dir` of it would).
    let fd = match open_dir(libc::AT_FDCWD, &root_c, false) {
        Ok(fd) => fd,
        Err(e) => {
            tree.dirs
                .insert(OsString::new(), Listing::failed_with(None, listed_ns, e));
            return tree;
        }
    };
    let fd = Arc::new(fd);
    let key = fstat(fd.as_raw_fd()).map(|st| Key::of(&st));
    // Directories to visit below the root: (relative path, the parent's descriptor).
    let mut stack: Vec<(PathBuf, Arc<OwnedFd>)> = Vec::new();
    visit_open(
        &mut tree,
        prev,
        &mut fs_ok,
        PathBuf::new(),
        fd,
        key,
        listed_ns,
        &mut stack,
    );
    // Level by level until there are enough directories to share between two walkers (each
    // directory's listing depends on it and its previous listing alone, so any order gives
    // the same tree); a small tree is walked here alone.
    while !stack.is_empty() && stack.len() < SHARED_FROM {
        let mut next = Vec::new();
        for (rel, parent) in stack {
            visit(&mut tree, prev, &mut fs_ok, rel, &parent, clock, &mut next);
        }
        stack = next;
    }
    if stack.len() < SHARED_FROM {
        walk(&mut tree, prev, &mut fs_ok, stack, clock);
        return tree;
    }
    // Every other subtree to a second thread: its own half of the tree, merged after. One
    // that cannot be started leaves its half to this one.
    let (mine, theirs): (Vec<_>, Vec<_>) =
        stack.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let mine: Vec<_> = mine.into_iter().map(|(_, d)| d).collect();
    let theirs: Vec<_> = theirs.into_iter().map(|(_, d)| d).collect();
    let mut other_fs = fs_ok.clone();
    let shared = std::sync::Mutex::new(Some(theirs));
    // Taken by the second thread, or by this one if it could not be started.
    let take_theirs = || {
        shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default()
    };
    std::thread::scope(|s| {
        let other = std::thread::Builder::new()
            .name("corral-tree".into())
            .spawn_scoped(s, || {
                let mut half = Tree::empty(root, prev.map_or(0, |p| p.len() / 2));
                walk(&mut half, prev, &mut other_fs, take_theirs(), clock);
                half
            });
        walk(&mut tree, prev, &mut fs_ok, mine, clock);
        match other {
            Ok(other) => {
                let half = other
                    .join()
                    .expect("the tree walk's second thread panicked");
                tree.merge(half);
            }
            Err(_) => walk(&mut tree, prev, &mut fs_ok, take_theirs(), clock),
        }
    });
    tree
}

/// Directories a walk shares with a second thread from: below that, a thread costs more than
/// it saves.
const SHARED_FROM: usize = 16;

impl Tree {
    /// A tree with room for `capacity` directories (the previous tree's count: most trees
    /// keep theirs).
    fn empty(root: &Path, capacity: usize) -> Tree {
        Tree {
            root: root.to_path_buf(),
            dirs: Dirs::with_capacity_and_hasher(capacity, Default::default()),
            relisted: 0,
            changed: 0,
            stored: false,
        }
    }

    /// The directories of `other`, the other half of the same walk (no directory in both).
    fn merge(&mut self, other: Tree) {
        self.relisted += other.relisted;
        self.changed += other.changed;
        self.dirs.extend(other.dirs);
    }
}

/// Visit every directory on `stack` and below it.
fn walk(
    tree: &mut Tree,
    prev: Option<&Tree>,
    fs_ok: &mut HashMap<u64, bool>,
    mut stack: Vec<(PathBuf, Arc<OwnedFd>)>,
    clock: &(dyn Fn() -> i64 + Sync),
) {
    while let Some((rel, parent)) = stack.pop() {
        visit(tree, prev, fs_ok, rel, &parent, clock, &mut stack);
    }
}

/// Visit the directory `rel`, named by its last component in `parent`: its previous listing
/// when it holds (not even opened when it has no subdirectory), else a new one; its
/// subdirectories go on `stack`.
fn visit(
    tree: &mut Tree,
    prev: Option<&Tree>,
    fs_ok: &mut HashMap<u64, bool>,
    rel: PathBuf,
    parent: &OwnedFd,
    clock: &(dyn Fn() -> i64 + Sync),
    stack: &mut Vec<(PathBuf, Arc<OwnedFd>)>,
) {
    let name = rel.file_name().and_then(cstr);
    let Some(name) = name else { return };
    let listed_ns = clock();
    let gone = |tree: &mut Tree, key: Option<Key>, e: i32| {
        tree.dirs.insert(
            rel.clone().into_os_string(),
            Listing::failed_with(key, listed_ns, e),
        );
    };
    let st = match fstatat(parent.as_raw_fd(), &name) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => st,
        Ok(_) => {
            gone(tree, None, libc::ENOTDIR);
            return;
        }
        Err(e) => {
            gone(tree, None, e);
            return;
        }
    };
    let key = Key::of(&st);
    let before = prev.and_then(|p| p.dirs.get(rel.as_os_str()));
    // Known unchanged, on a trusted file system, with no directory to enter: no need to
    // open it.
    if let Some(before) = before
        && before.holds_for(&key)
        && fs_ok.get(&key.dev) == Some(&true)
        && !before.has_subdirs()
    {
        tree.dirs.insert(rel.into_os_string(), before.clone());
        return;
    }
    let fd = match open_dir(parent.as_raw_fd(), &name, true) {
        Ok(fd) => fd,
        Err(e) => {
            gone(tree, Some(key), e);
            return;
        }
    };
    // The key of what was opened (the entry may have been replaced since the `fstatat`).
    let key = fstat(fd.as_raw_fd()).map(|st| Key::of(&st));
    visit_open(tree, prev, fs_ok, rel, Arc::new(fd), key, listed_ns, stack);
}

/// Record the directory `rel` open at `fd` (its key taken after `listed_ns` was read): its
/// previous listing when it holds, else a new one; its subdirectories go on `stack`.
#[allow(clippy::too_many_arguments)]
fn visit_open(
    tree: &mut Tree,
    prev: Option<&Tree>,
    fs_ok: &mut HashMap<u64, bool>,
    rel: PathBuf,
    fd: Arc<OwnedFd>,
    key: Option<Key>,
    listed_ns: i64,
    stack: &mut Vec<(PathBuf, Arc<OwnedFd>)>,
) {
    let trusted = key.is_some_and(|k| {
        *fs_ok.entry(k.dev).or_insert_with(|| {
            let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: `sfs` is a valid out-buffer.
            let ok = unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } == 0;
            ok && trusted_fs(sfs.f_type as i64)
        })
    });
    let before = prev.and_then(|p| p.dirs.get(rel.as_os_str()));
    let listing = match (before, key) {
        (Some(before), Some(key)) if trusted && before.holds_for(&key) => before.clone(),
        _ => {
            tree.relisted += 1;
            let (listed, failed) = list(fd.as_raw_fd());
            match before {
                // The same entries: the memo of their matches still holds.
                Some(b) if *b.entries == *listed.entries && b.failed == failed => Listing {
                    key,
                    listed_ns,
                    failed,
                    ..b.clone()
                },
                _ => {
                    tree.changed += 1;
                    Listing {
                        key,
                        listed_ns,
                        entries: listed.entries.into(),
                        dirs_len: listed.dirs_len,
                        git: listed.git,
                        failed,
                        hits: None,
                    }
                }
            }
        }
    };
    let in_git = rel.as_os_str() == ".git";
    for name in listing.subdirs() {
        if !(in_git && name == "objects") {
            stack.push((rel.join(name), fd.clone()));
        }
    }
    tree.dirs.insert(rel.into_os_string(), listing);
}

/// [`scan_at`] with the fine clock.
pub fn scan(root: &Path, prev: Option<&Tree>) -> Tree {
    scan_at(root, prev, &now_ns)
}

// ---- Kept between runs ----

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A hash of `b`, eight bytes at a time: a damaged file is told from a whole one (what the
/// jail could forge is kept out by where the file is and who owns it, not by this).
fn checksum(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ b.len() as u64;
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let x = u64::from_le_bytes(w.try_into().unwrap_or_default());
        h = (h ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
    for x in words.remainder() {
        h = (h ^ u64::from(*x)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Who lists: another user (or group) may read what this one cannot.
fn caller() -> (u32, u32) {
    // SAFETY: no arguments, cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

impl Tree {
    /// The index as its file holds it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        put_u32(&mut out, VERSION);
        let (uid, gid) = caller();
        put_u32(&mut out, uid);
        put_u32(&mut out, gid);
        put_bytes(&mut out, self.root.as_os_str().as_bytes());
        put_u64(&mut out, self.dirs.len() as u64);
        for (rel, l) in &self.dirs {
            put_bytes(&mut out, rel.as_os_str().as_bytes());
            match l.key {
                Some(k) => {
                    out.push(1);
                    put_u64(&mut out, k.dev);
                    put_u64(&mut out, k.ino);
                    put_u32(&mut out, k.mode);
                    put_u64(&mut out, k.mtime_ns as u64);
                    put_u64(&mut out, k.ctime_ns as u64);
                }
                None => out.push(0),
            }
            put_u64(&mut out, l.listed_ns as u64);
            out.push(match l.failed {
                None => 0,
                Some(Failed::Gone) => 1,
                Some(Failed::Unreadable) => 2,
            });
            put_bytes(&mut out, &l.entries);
            put_u32(&mut out, l.dirs_len);
            out.push(l.git);
            match &l.hits {
                Some((h, hits)) => {
                    out.push(1);
                    put_u64(&mut out, *h);
                    put_u64(&mut out, hits.len() as u64);
                    for i in hits.iter() {
                        put_u32(&mut out, *i);
                    }
                }
                None => out.push(0),
            }
        }
        let sum = checksum(&out);
        put_u64(&mut out, sum);
        out
    }

    /// An index read back, or `None` when `b` is not a whole index of `root` of this version,
    /// written by this caller.
    pub fn decode(b: &[u8], root: &Path) -> Option<Tree> {
        let (body, sum) = b.split_at_checked(b.len().checked_sub(8)?)?;
        if checksum(body) != u64::from_le_bytes(sum.try_into().ok()?) {
            return None;
        }
        let mut r = Reader { b: body };
        if r.take(MAGIC.len())? != MAGIC || r.u32()? != VERSION {
            return None;
        }
        if (r.u32()?, r.u32()?) != caller() || r.bytes()? != root.as_os_str().as_bytes() {
            return None;
        }
        let n = r.u64()?;
        // Room for what the file says it holds, within what its bytes could hold.
        let room = usize::try_from(n).unwrap_or(0).min(r.b.len() / 16);
        let mut dirs = Dirs::with_capacity_and_hasher(room, Default::default());
        for _ in 0..n {
            let rel = PathBuf::from(OsStr::from_bytes(r.bytes()?));
            let key = match r.take(1)?[0] {
                0 => None,
                1 => Some(Key {
                    dev: r.u64()?,
                    ino: r.u64()?,
                    mode: r.u32()?,
                    mtime_ns: r.u64()? as i64,
                    ctime_ns: r.u64()? as i64,
                }),
                _ => return None,
            };
            let listed_ns = r.u64()? as i64;
            let failed = match r.take(1)?[0] {
                0 => None,
                1 => Some(Failed::Gone),
                2 => Some(Failed::Unreadable),
                _ => return None,
            };
            let entries: Arc<[u8]> = r.bytes()?.into();
            let dirs_len = r.u32()?;
            let git = r.take(1)?[0];
            let cut = dirs_len as usize;
            if entries.last().is_some_and(|b| *b != 0)
                || rel.is_absolute()
                || cut > entries.len()
                || (cut > 0 && entries[cut - 1] != 0)
            {
                return None;
            }
            let hits = match r.take(1)?[0] {
                0 => None,
                1 => {
                    let h = r.u64()?;
                    let n = usize::try_from(r.u64()?).ok()?;
                    let mut v = Vec::with_capacity(n.min(r.b.len() / 4));
                    for _ in 0..n {
                        v.push(r.u32()?);
                    }
                    if !v.is_sorted_by(|a, b| a < b)
                        || v.last()
                            .is_some_and(|o| *o as usize >= cut.max(entries.len()))
                    {
                        return None;
                    }
                    Some((h, v.into()))
                }
                _ => return None,
            };
            let l = Listing {
                key,
                listed_ns,
                entries,
                dirs_len,
                git,
                failed,
                hits,
            };
            dirs.insert(rel.into_os_string(), l);
        }
        if !r.b.is_empty() || !dirs.contains_key(OsStr::new("")) {
            return None;
        }
        Some(Tree {
            root: root.to_path_buf(),
            dirs,
            relisted: 0,
            changed: 0,
            stored: true,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.b.split_at_checked(n)?;
        self.b = rest;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
}

/// Where `root`'s index is kept: `STATE/PROJECT_KEY/tree-index`.
pub fn index_file(root: &Path) -> Option<PathBuf> {
    let state = corral_audit::state_dir().ok()?;
    Some(state.join(corral_audit::project_key(root)).join(FILE_NAME))
}

/// Whether the jail sees the directory `dir` (existing): it is inside one of `reach` (the
/// paths the run's jail sees), or holds one. One that cannot be resolved counts as seen.
fn reached(dir: &Path, reach: &[PathBuf]) -> bool {
    let Ok(real) = dir.canonicalize() else {
        return true;
    };
    reach
        .iter()
        .filter(|p| !p.as_os_str().is_empty())
        .any(|src| {
            let src_real = src.canonicalize().unwrap_or_else(|_| src.clone());
            [src, &src_real]
                .iter()
                .any(|s| real.starts_with(s) || s.starts_with(&real))
        })
}

/// Whether the directory `dir` is the caller's and nobody else may write it.
fn owned(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == caller().0 && m.mode() & 0o022 == 0)
}

/// Whether the directory `dir` (existing) may hold the index: the jail does not see it
/// ([`reached`]) and it is the caller's alone ([`owned`]), as [`update`] checks it.
#[cfg(test)]
fn usable_dir(dir: &Path, reach: &[PathBuf]) -> bool {
    !reached(dir, reach) && owned(dir)
}

/// The index kept in `file`, if it is a regular file of the caller's that nobody else may
/// write, and a whole index of `root`.
pub fn load(file: &Path, root: &Path) -> Option<Tree> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(file)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.uid() != caller().0 || m.mode() & 0o077 != 0 {
        return None;
    }
    let mut b = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut b).ok()?;
    Tree::decode(&b, root)
}

/// Write `tree` to `file`: a temporary file (0600) renamed over it.
pub fn save(tree: &Tree, file: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = file.as_os_str().to_os_string();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(&tree.encode())?;
        std::fs::rename(&tmp, file)
    };
    let r = write();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Update the index of `root`: the one kept in corral's state directory when it may be used
/// (`reach`: every path the run's jail sees, the project's root among them), else a full walk.
/// Writes it back when an entry changed. A kept index the jail could have written (its
/// directory is in `reach`) is removed, never used.
pub fn update(root: &Path, reach: &[PathBuf], hide: &[String]) -> Arc<Tree> {
    let file = index_file(root);
    let dir = file.as_deref().and_then(Path::parent);
    // Resolved once (each of `reach` is resolved: a few hundred `readlink`s).
    let seen = dir.filter(|d| d.is_dir()).map(|d| reached(d, reach));
    let usable = dir.is_some_and(|d| seen == Some(false) && owned(d));
    // One this run's jail could write is never used again (another user's is left alone).
    if let (Some(f), Some(true)) = (&file, seen) {
        let _ = std::fs::remove_file(f);
    }
    let file = file.filter(|_| usable);
    // This process's last tree of `root` (the start's, at the end of a run) before the file:
    // nothing but this process made it.
    let last = LAST.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let prev = match last {
        Some(t) if t.root == root => Some(t),
        _ => file.as_deref().and_then(|f| load(f, root)).map(Arc::new),
    };
    let tree = scan(root, prev.as_deref());
    // Written back when an entry changed, or a directory came or went. A directory listed
    // again with the same entries (corral's own placeholders come and go in the project's root
    // and `.git` on every run) is not worth a write: the next update lists it again.
    let grew = tree.dirs.len() != prev.as_ref().map_or(0, |p| p.len());
    let mut tree = tree;
    tree.match_entries(hide);
    if let Some(f) = &file {
        let kept = prev.is_some_and(|p| p.stored) && tree.changed == 0 && !grew;
        tree.stored = kept || save(&tree, f).is_ok();
    }
    let tree = Arc::new(tree);
    *LAST.lock().unwrap_or_else(|p| p.into_inner()) = Some(tree.clone());
    tree
}

/// The last tree [`update`] made in this process.
static LAST: Mutex<Option<Arc<Tree>>> = Mutex::new(None);

/// The update made when a Plan is made, for the git guard's snapshot at the start of the run.
static STASH: Mutex<Option<Arc<Tree>>> = Mutex::new(None);

/// [`update`], the tree kept for the next [`take_or_update`] of this process.
pub fn update_and_stash(root: &Path, reach: &[PathBuf], hide: &[String]) -> Arc<Tree> {
    let tree = update(root, reach, hide);
    *STASH.lock().unwrap_or_else(|p| p.into_inner()) = Some(tree.clone());
    tree
}

/// The tree [`update_and_stash`] last made in this process when it is `root`'s, taken (once:
/// a second call updates), else a new update (the jail's reach taken to be the project).
pub fn take_or_update(root: &Path) -> Arc<Tree> {
    let stashed = STASH.lock().unwrap_or_else(|p| p.into_inner()).take();
    match stashed {
        Some(t) if t.root == root => t,
        _ => update(root, &[root.to_path_buf()], &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn names(t: &Tree, rel: &str) -> Vec<String> {
        let mut v: Vec<String> = t
            .listing(Path::new(rel))
            .unwrap()
            .entries()
            .map(|(n, d)| format!("{}{}", n.to_string_lossy(), if d { "/" } else { "" }))
            .collect();
        v.sort();
        v
    }

    /// `tree` as if the directory `rel` had been listed with the key it has now: a change made
    /// after its listing in the same clock tick (which keeps the ctime) looks like this.
    fn same_tick(tree: &mut Tree, rel: &str) {
        let c = cstr(tree.root.join(rel).as_os_str()).unwrap();
        let st = fstatat(libc::AT_FDCWD, &c).unwrap();
        tree.dirs.get_mut(OsStr::new(rel)).unwrap().key = Some(Key::of(&st));
    }

    #[test]
    fn a_change_in_the_listings_tick_is_found_and_an_old_directory_is_not_relisted() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/f"), "").unwrap();
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(root.join("a")).unwrap();
        // The clock fixed at the tick `a` was last changed in: its listing is in the window.
        let at = m.ctime() * 1_000_000_000 + m.ctime_nsec();
        let mut first = scan_at(root, None, &move || at);
        assert_eq!(names(&first, "a"), ["b/", "f"]);
        std::fs::write(root.join("a/g"), "").unwrap();
        same_tick(&mut first, "a");
        // The key is the one listed, but the listing was in the ctime's window: listed again.
        let second = scan_at(root, Some(&first), &move || at);
        assert_eq!(names(&second, "a"), ["b/", "f", "g"]);
        // The control: had the listing been taken well after that tick, the same key would be
        // trusted (so the window is what finds the change).
        let late = move || at + 10 * CLOCK_SLACK_NS;
        let mut first = scan_at(root, None, &late);
        std::fs::write(root.join("a/h"), "").unwrap();
        same_tick(&mut first, "a");
        let second = scan_at(root, Some(&first), &late);
        assert_eq!(names(&second, "a"), ["b/", "f", "g"], "the control");
        // Out of the window, an unchanged tree is not listed at all, and a changed directory is.
        let far = move || now_ns() + 10 * CLOCK_SLACK_NS;
        let third = scan_at(root, None, &far);
        let fourth = scan_at(root, Some(&third), &far);
        assert_eq!(fourth.relisted(), 0);
        std::thread::sleep(std::time::Duration::from_millis(30));
        std::fs::remove_file(root.join("a/f")).unwrap();
        let fifth = scan_at(root, Some(&fourth), &far);
        assert_eq!(fifth.relisted(), 1);
        assert_eq!(names(&fifth, "a"), ["b/", "g", "h"]);
    }

    #[test]
    fn a_damaged_foreign_or_writable_index_is_a_miss() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("p");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/.env"), "").unwrap();
        let hide = vec![".env".to_string()];
        let mut tree = scan(&root, None);
        tree.match_entries(&hide);
        let file = t.path().join("idx");
        save(&tree, &file).unwrap();
        let back = load(&file, &root).expect("a whole index reads back");
        assert_eq!(back.len(), tree.len());
        assert_eq!(names(&back, ""), ["d/"]);
        let memo = back.listing(Path::new("d")).unwrap().hits.clone();
        assert_eq!(
            memo.map(|(_, v)| v.to_vec()),
            Some(vec![0]),
            "the offset of `.env`"
        );
        assert_eq!(back.masked(&hide).unwrap(), [root.join("d/.env")]);
        // Another project's.
        assert!(load(&file, &t.path().join("q")).is_none());
        // Damaged: a byte changed, cut short.
        let mut b = std::fs::read(&file).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 1;
        std::fs::write(&file, &b).unwrap();
        assert!(load(&file, &root).is_none());
        let good = tree.encode();
        std::fs::write(&file, &good[..good.len() - 3]).unwrap();
        assert!(load(&file, &root).is_none());
        // Of another version.
        let mut other = good.clone();
        other[MAGIC.len()] = 9;
        let body = other.len() - 8;
        let sum = checksum(&other[..body]);
        other[body..].copy_from_slice(&sum.to_le_bytes());
        std::fs::write(&file, &other).unwrap();
        assert!(load(&file, &root).is_none());
        // Writable by others, or a link to a whole one.
        std::fs::write(&file, &good).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(load(&file, &root).is_none());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&file, &root).is_some());
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(load(&link, &root).is_none());
    }

    #[test]
    fn a_directory_the_jail_sees_cannot_hold_the_index() {
        let t = tempfile::tempdir().unwrap();
        let project = t.path().join("p");
        let state = project.join(".state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(!usable_dir(&state, std::slice::from_ref(&project)));
        let outside = t.path().join("state");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(usable_dir(&outside, std::slice::from_ref(&project)));
        // A bind of a directory holding it, or held by it.
        assert!(!usable_dir(&outside, &[project.clone(), t.path().into()]));
        assert!(!usable_dir(&outside, &[outside.join("x")]));
        // Writable by the group.
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(!usable_dir(&outside, std::slice::from_ref(&project)));
    }

    /// A tree wide enough for the walk to be shared with a second thread: every directory is
    /// in it once, and what it masks is what the plain walk masks, fresh, unchanged, and
    /// after changes in subtrees either thread walks.
    #[test]
    fn a_shared_walk_finds_every_directory_once_and_masks_what_the_walk_masks() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let mut dirs = 1; // the root
        for a in 0..5 {
            for b in 0..(SHARED_FROM + 3) {
                let d = root.join(format!("m{a}/s{b}/deep"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("f.rs"), "").unwrap();
                if b % 4 == a % 4 {
                    std::fs::write(d.join(".env"), "").unwrap();
                }
                dirs += 2;
            }
            dirs += 1;
        }
        let hide = vec![".env".to_string()];
        let first = scan(root, None);
        assert_eq!(first.len(), dirs);
        assert_eq!(
            first.masked(&hide).unwrap(),
            crate::resolve::find_masked(root, &hide).unwrap()
        );
        let again = scan(root, Some(&first));
        assert_eq!(again.len(), dirs);
        assert_eq!(again.masked(&hide).unwrap(), first.masked(&hide).unwrap());
        // Changes in many subtrees (both halves of the walk).
        for a in 0..5 {
            std::fs::write(root.join(format!("m{a}/s{a}/.env")), "").unwrap();
            std::fs::remove_dir_all(root.join(format!("m{a}/s{}", a + 6))).unwrap();
        }
        std::fs::create_dir_all(root.join("m4/new/deeper")).unwrap();
        std::fs::write(root.join("m4/new/deeper/.env"), "").unwrap();
        let changed = scan(root, Some(&again));
        assert_eq!(changed.len(), dirs - 5 * 2 + 2);
        assert_eq!(
            changed.masked(&hide).unwrap(),
            crate::resolve::find_masked(root, &hide).unwrap()
        );
        assert!(
            changed
                .masked(&hide)
                .unwrap()
                .contains(&root.join("m4/new/deeper/.env"))
        );
    }

    #[test]
    fn the_index_masks_what_the_walk_masks() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for d in [
            "a/.git/objects/x",
            ".git/objects/aa",
            "secrets.d/in",
            "locked",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            ".env",
            "a/.env",
            "a/.git/objects/x/.env",
            ".git/objects/aa/.env",
            "secrets.d/in/.env",
        ] {
            std::fs::write(root.join(f), "").unwrap();
        }
        std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let hide = vec![".env".to_string(), "secrets.d".to_string()];
        let tree = scan(root, None);
        assert_eq!(
            tree.masked(&hide).unwrap(),
            crate::resolve::find_masked(root, &hide).unwrap()
        );
        std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
}
