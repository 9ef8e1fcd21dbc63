//! The git method's listing cache: what git listed at a run's start (the dirty paths, the
//! ignored entries), kept for the next run's start when the run changed nothing, so that a
//! project nobody changed in between is not listed by git again (two `git ls-files`
//! processes: 2-3 ms of the jail's start here, and CPU the jail's set-up needs).
//!
//! The listing is kept with everything it was computed from:
//! - the index (its bytes), the repository's `info/exclude` and the user's global excludes
//!   and attributes files (`$XDG_CONFIG_HOME/git/ignore` and `attributes`, which git reads
//!   even with `GIT_CONFIG_GLOBAL` off), the object format, the git executable's identity and
//!   the run's protected paths;
//! - the shortcut's metadata walk ([`Quick`]) of every entry git looks at: type, mode, size,
//!   mtime, ctime and inode, and the ignored directories git did not enter.
//!
//! A later start reuses it only when all of that is as it was: the same bytes, and the walk
//! taken again finding every entry as it was. ctime cannot be set from user space, so a file
//! written since has another ctime. It is kept only when every entry's times lie at least the
//! racy window ([`super::QUICK_RACY_NS`]) before git began listing (a write in the same clock
//! tick as git's read could otherwise leave the metadata as it was), and only by a run whose
//! end found the project as its start did: then corral's placeholders of that run are known,
//! and left out (of the walk and the listing); the next start leaves out the same names while
//! they are absent or a placeholder's shape (an empty file or directory, which the jail binds
//! read-only), and a real file there is a miss.
//!
//! The file lives in corral's state directory, outside every jail, and is used only when that
//! directory does not lie inside the project (`--project` with the state in it), where the
//! jail could write it. It must be a regular file of this user, not writable by others, and
//! its SHA-256 must match: anything else is a miss, never an error.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{DirtyKind, Meta, PrivateGitDir, Quick, changes_dir, not_own};

/// The file's first line: a format change makes every older file a miss.
pub(super) const MAGIC: &[u8] = b"corral change listing 1\n";
/// Its last bytes, after the SHA-256 of what lies between: a file cut short or damaged is a
/// miss.
const END: &[u8] = b"\nend\n";
/// A file larger than this is not read.
const FILE_MAX: u64 = 64 << 20;

/// What a listing was computed from, apart from the walk: encoded, to compare as bytes.
pub(super) struct Key(pub(super) Vec<u8>);

impl Key {
    /// The inputs of git's listing of `root` with `repo` now, the run's protected paths
    /// `protected` among them (corral's placeholders are made for those); `None` when one
    /// cannot be read or the listing is not one to keep (then nothing is cached).
    pub(super) fn of(root: &Path, repo: &PrivateGitDir, protected: &[PathBuf]) -> Option<Key> {
        // A large index is not held in memory (and its listing is too large for the walk); a
        // submodule's state lies in the repository's own directory, which the walk skips.
        if repo.index_file.is_some() || repo.submodules {
            return None;
        }
        let mut e = Encoder::default();
        e.bytes(root.as_os_str().as_bytes());
        e.opt(repo.index.as_deref());
        e.opt(repo.exclude.as_deref());
        // The user's global excludes and attributes files, which git reads even with
        // `GIT_CONFIG_GLOBAL` off (`-m` compares content after the conversions attributes
        // select; the system's are off: `GIT_ATTR_NOSYSTEM`).
        for file in [config_file("ignore"), config_file("attributes")] {
            e.opt(read_optional(file.as_deref())?.as_deref());
        }
        e.u64(u64::from(repo.sha256));
        for n in git_identity()? {
            e.u64(n);
        }
        let mut protected: Vec<&PathBuf> = protected.iter().collect();
        protected.sort();
        e.list(&protected, |e, p| e.bytes(p.as_os_str().as_bytes()));
        Some(Key(e.0))
    }
}

/// A listing served from the cache.
pub(super) struct Hit {
    pub dirty: BTreeMap<OsString, DirtyKind>,
    pub ignored: BTreeSet<OsString>,
    /// The walk taken now (equal to the cached one), for the end's shortcut.
    pub quick: Quick,
}

/// The cache file of the project at `root`, given corral's state directory `state`: `None`
/// when the state directory lies inside the project (the jail could write the file there).
pub(super) fn file_for(root: &Path, state: &Path) -> Option<PathBuf> {
    let real_state = state.canonicalize().unwrap_or_else(|_| state.to_path_buf());
    let real_root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    if real_state.starts_with(&real_root) || state.starts_with(root) {
        return None;
    }
    Some(changes_dir(state, root).join("listing"))
}

/// The cached listing of `root` in `file`, when it was computed from `key` and the walk finds
/// every entry as it was; `None` otherwise (any doubt is a miss: git lists the project).
/// `racy_ns`: the racy window of the walk taken now, for the end's shortcut.
pub(super) fn lookup(file: &Path, key: &Key, root: &Path, racy_ns: i128) -> Option<Hit> {
    let bytes = read_own(file)?;
    let body = bytes.strip_prefix(MAGIC)?.strip_suffix(END)?;
    let (body, sum) = body.split_at_checked(body.len().checked_sub(32)?)?;
    if ring::digest::digest(&ring::digest::SHA256, body).as_ref() != sum {
        return None;
    }
    let mut d = Decoder(body);
    if d.bytes()? != key.0.as_slice() {
        return None;
    }
    let racy_from = d.i128()?;
    let own: Vec<OsString> = d.list(|d| d.os())?;
    let pruned: Vec<OsString> = d.list(|d| d.os())?;
    let walk: HashMap<OsString, Meta> = d
        .list(|d| Some((d.os()?, d.meta()?)))?
        .into_iter()
        .collect();
    let dirty: BTreeMap<OsString, DirtyKind> = d
        .list(|d| {
            let path = d.os()?;
            let dirt = match d.u64()? {
                0 => DirtyKind::Tracked,
                1 => DirtyKind::Untracked,
                _ => return None,
            };
            Some((path, dirt))
        })?
        .into_iter()
        .collect();
    let ignored: BTreeSet<OsString> = d.list(|d| d.os())?.into_iter().collect();
    if !d.0.is_empty() || walk.values().any(|m| m.changed_since(racy_from)) {
        return None;
    }
    // The window of the walk taken now starts before it.
    let quick_racy_from = super::now_ns() - racy_ns;
    let now = Quick::walk(root, &pruned)?;
    // The storing run's placeholders, left out of its walk, are left out of this one while
    // they are absent or a placeholder's shape (an empty file or directory: the jail binds
    // them read-only); a real file there now is a miss.
    for name in &own {
        let path = root.join(name);
        match path.symlink_metadata() {
            Err(_) => {}
            Ok(m) if m.is_file() && m.len() == 0 => {}
            Ok(m) if m.is_dir() && std::fs::read_dir(&path).ok()?.next().is_none() => {}
            Ok(_) => return None,
        }
    }
    let compared: HashMap<&OsString, &Meta> =
        now.iter().filter(|(k, _)| not_own(k, &own)).collect();
    if compared.len() != walk.len() || walk.iter().any(|(k, m)| compared.get(k) != Some(&m)) {
        return None;
    }
    Some(Hit {
        dirty,
        ignored,
        quick: Quick {
            entries: now,
            pruned,
            racy_from: quick_racy_from,
        },
    })
}

/// A start's listing, to keep in the cache if its run changes nothing.
pub(super) struct Store {
    /// The cache file.
    pub file: PathBuf,
    pub key: Key,
    /// The paths git listed as dirty.
    pub dirty: BTreeMap<OsString, DirtyKind>,
    /// The start of the racy window before git began listing: an entry changed at or after it
    /// may have changed after git read it.
    pub racy_from: i128,
    /// Names the copy written beside the file (the run's id).
    pub tag: String,
}

impl Store {
    /// Keep the listing (this, and `ignored`) of the project `quick` walked at the start and
    /// found unchanged at the end, corral's placeholders `own` (relative paths) left out: a
    /// later start leaves out the same names while they are placeholders. Nothing is kept
    /// when an entry changed within the racy window. Written beside the file and renamed over
    /// it, so a reader sees a whole file, the old or the new; a failure only means no cache.
    pub(super) fn keep(&self, quick: &Quick, ignored: &BTreeSet<OsString>, own: &[OsString]) {
        let mut walk: Vec<(&OsString, &Meta)> = quick
            .entries
            .iter()
            .filter(|(k, _)| not_own(k, own))
            .collect();
        if walk.iter().any(|(_, m)| m.changed_since(self.racy_from)) {
            return;
        }
        walk.sort_by(|a, b| a.0.cmp(b.0));
        let mut e = Encoder::default();
        e.bytes(&self.key.0);
        e.i128(self.racy_from);
        e.list(own, |e, p| e.bytes(p.as_bytes()));
        e.list(&quick.pruned, |e, p| e.bytes(p.as_bytes()));
        e.list(&walk, |e, (p, m)| {
            e.bytes(p.as_bytes());
            e.meta(m);
        });
        let dirty: Vec<_> = self.dirty.iter().filter(|(p, _)| not_own(p, own)).collect();
        e.list(&dirty, |e, (p, dirt)| {
            e.bytes(p.as_bytes());
            e.u64(match dirt {
                DirtyKind::Tracked => 0,
                DirtyKind::Untracked => 1,
            });
        });
        let ignored: Vec<_> = ignored.iter().filter(|p| not_own(p, own)).collect();
        e.list(&ignored, |e, p| e.bytes(p.as_bytes()));
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&e.0);
        bytes.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, &e.0).as_ref());
        bytes.extend_from_slice(END);
        let _ = write_replacing(&self.file, &bytes, &self.tag);
    }
}

fn write_replacing(file: &Path, bytes: &[u8], tmp_tag: &str) -> std::io::Result<()> {
    let dir = file.parent().ok_or(std::io::ErrorKind::InvalidInput)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{tmp_tag}.tmp"));
    let tmp = dir.join(name);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes));
    match written.and_then(|()| std::fs::rename(&tmp, file)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The content of `file` if it is a regular file of this user that nobody else can write (not
/// following a symlink), of a sane size.
fn read_own(file: &Path) -> Option<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)
        .ok()?;
    let m = f.metadata().ok()?;
    // SAFETY: geteuid has no failure mode and touches no memory.
    let me = unsafe { libc::geteuid() };
    if !m.is_file() || m.uid() != me || m.mode() & 0o022 != 0 || m.len() > FILE_MAX {
        return None;
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The user's global git file `name` (`ignore`, `attributes`) where git finds it when the
/// configuration names none: `$XDG_CONFIG_HOME/git/NAME`, else `$HOME/.config/git/NAME`.
fn config_file(name: &str) -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    match (nonempty("XDG_CONFIG_HOME"), nonempty("HOME")) {
        (Some(x), _) => Some(PathBuf::from(x).join("git").join(name)),
        (None, Some(h)) => Some(PathBuf::from(h).join(".config/git").join(name)),
        (None, None) => None,
    }
}

/// The content of `path` (following symlinks, as git does): `Some(None)` when there is no
/// such file, `None` when it cannot be read.
fn read_optional(path: Option<&Path>) -> Option<Option<Vec<u8>>> {
    let Some(path) = path else {
        return Some(None);
    };
    match std::fs::read(path) {
        Ok(b) => Some(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(None),
        Err(_) => None,
    }
}

/// The git executable the listing runs (the first `git` on PATH, as `Command` finds it): its
/// device, inode, size, mtime and ctime, so an upgrade of git makes a miss. `None`: no git.
fn git_identity() -> Option<[u64; 7]> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|dir| {
        let m = std::fs::metadata(dir.join("git")).ok()?;
        (m.is_file() && m.mode() & 0o111 != 0).then(|| {
            [
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime() as u64,
                m.mtime_nsec() as u64,
                m.ctime() as u64,
                m.ctime_nsec() as u64,
            ]
        })
    })
}

/// Length-prefixed little-endian encoding.
#[derive(Default)]
struct Encoder(Vec<u8>);

impl Encoder {
    fn u64(&mut self, n: u64) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }
    fn i128(&mut self, n: i128) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn opt(&mut self, b: Option<&[u8]>) {
        match b {
            None => self.u64(0),
            Some(b) => {
                self.u64(1);
                self.bytes(b);
            }
        }
    }
    fn meta(&mut self, m: &Meta) {
        self.u64(u64::from(m.kind));
        self.u64(u64::from(m.perm));
        self.u64(m.size);
        self.i128(m.mtime_ns);
        self.i128(m.ctime_ns);
        self.u64(m.ino);
    }
    fn list<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Encoder, &T)) {
        self.u64(items.len() as u64);
        for item in items {
            each(self, item);
        }
    }
}

/// The reading side of [`Encoder`]: `None` on anything malformed.
struct Decoder<'a>(&'a [u8]);

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i128(&mut self) -> Option<i128> {
        Some(i128::from_le_bytes(self.take(16)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
    fn os(&mut self) -> Option<OsString> {
        Some(OsString::from_vec(self.bytes()?.to_vec()))
    }
    fn meta(&mut self) -> Option<Meta> {
        Some(Meta {
            kind: u32::try_from(self.u64()?).ok()?,
            perm: u32::try_from(self.u64()?).ok()?,
            size: self.u64()?,
            mtime_ns: self.i128()?,
            ctime_ns: self.i128()?,
            ino: self.u64()?,
        })
    }
    fn list<T>(&mut self, mut each: impl FnMut(&mut Decoder<'a>) -> Option<T>) -> Option<Vec<T>> {
        let n = usize::try_from(self.u64()?).ok()?;
        // Each item takes at least 8 bytes: a count beyond that is malformed, not an
        // allocation to make.
        if n > self.0.len() / 8 {
            return None;
        }
        (0..n).map(|_| each(self)).collect()
    }
}
