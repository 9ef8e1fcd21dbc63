//! Protected files and directories the host replaces by rename during the run. A protected file
//! (`.git/config`, `corral.toml`, a harness's `settings.json`, a hidden file's placeholder) is a
//! read-only bind of one file. When the host
//! replaces that file by rename (`git config`, an editor saving, the host's harness refreshing
//! its state), the kernel detaches every other mount namespace's mount on the old file: the
//! jail then sees the new file through the read-write directory around it. The gate keeps the
//! name read-only for the rest of the run. It takes the read-only binds of one file or
//! directory from the jail's mountinfo when the jail starts, knows each by its directory (the
//! (device, inode) it had, or the directory now at its path) and its name, and refuses what
//! would write through it, with the errno the bind gave:
//! - a write open (O_WRONLY, O_RDWR, O_TRUNC) of the name: EROFS;
//! - a write open of the file now at the name by any other path (`/proc/self/fd/N` of a
//!   read-only descriptor, a symlink, a link): EROFS, checked on the opened file;
//! - creating the name (O_CREAT after an unlink, mkdir, mknod, symlink, link, bind): EEXIST
//!   where something is there, EROFS where not;
//! - renaming onto it or away from it: EBUSY, as for a mount point;
//! - linking the file now at the name elsewhere: EXDEV, as across mounts;
//! - truncate(2) of it: EROFS;
//! - in a git directory, the same for `NAME.lock`, which git renames onto the name.
//!
//! A protected directory (`.git/hooks`, a harness's `extensions/` or `plugins/`) is a read-only
//! bind too, and the host removing it and putting another in its place detaches it the same
//! way: from then on, changing anything in the directory now at its name, or below it (found
//! by walking up `..` from where the change is made; for a file reopened through `/proc`, by
//! its path), is refused with EROFS.
//!
//! Where the gate cannot tell (a name it cannot look up because the jail took the search
//! permission off a directory, a symlink the host put there that leads nowhere), it refuses
//! for files on that file system: fail closed. The jail's own file systems are never checked.
//!
//! Reading it is not held: a read-open is not stopped by the gate's filter (every open would
//! be), so what the host writes there is readable for the rest of the run (docs/host-safety.md,
//! "Known limits"). Unlink is not stopped either (every `rm` would be): the jail can remove the
//! host's new file, not put one of its own in its place.
use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use super::{Entry, fstat, fstatat, fstatfs_type, open_path};

const SYSFS_MAGIC: i64 = 0x6265_6572;
/// Directories walked up at most, looking for a replaced protected one.
const PATH_DEPTH_MAX: usize = 2048;

/// One protected file: where it is, and the file its bind showed when the jail started.
struct File {
    /// Its directory as it was when the jail started, held for the run (an inode number is not
    /// reused while it is open).
    _dir: OwnedFd,
    /// Its directory's path, as the jail sees it: the host may replace the directory too (a
    /// checkout that removes and makes it again), and the name is looked up there each time.
    dir_path: Vec<u8>,
    name: CString,
    /// The directory's (device, inode), as [`Entry`]s are compared.
    at: (u64, u64),
    /// `NAME.lock` is held too: the file is in a git directory, where git writes
    /// `NAME.lock` and renames it onto the name.
    git_lock: bool,
    /// The bound file's (device, inode): another one at the name means the bind is gone.
    bound: (u64, u64),
    /// The bound file itself, held for the run: once the host removed it, its inode number
    /// could otherwise be given to the file or directory the host makes in its place, which
    /// would then look like the bound one.
    _bound: OwnedFd,
    /// The path, for the report.
    path: Vec<u8>,
    /// A directory (`.git/hooks`, a harness's `extensions/`): what is below it is held too.
    is_dir: bool,
}

#[derive(Default)]
pub(super) struct Protected {
    files: Vec<File>,
    names: HashSet<((u64, u64), Vec<u8>)>,
}

impl Protected {
    /// The read-only binds of one file or directory in `mountinfo` (this process's), whose
    /// directory is a file system the host sees: not one of `private` (the jail's own: a bind
    /// over a file of its tmpfs root cannot be replaced from outside), not /proc or /sys. One
    /// that is there but cannot be held is an error (it would go unprotected); one this
    /// process cannot reach (ENOENT, EACCES) the jail cannot reach either.
    pub(super) fn from_mountinfo(
        mountinfo: &[u8],
        private: &HashSet<u64>,
        git_dirs: &HashSet<(u64, u64)>,
    ) -> std::io::Result<Protected> {
        let mut p = Protected::default();
        let fail = |what: &str, point: &[u8], errno: i32| {
            std::io::Error::new(
                std::io::Error::from_raw_os_error(errno).kind(),
                format!(
                    "{what} {}: {}",
                    String::from_utf8_lossy(point),
                    std::io::Error::from_raw_os_error(errno)
                ),
            )
        };
        let unreachable = |e: i32| matches!(e, libc::ENOENT | libc::EACCES);
        for line in mountinfo.split(|&b| b == b'\n') {
            let Some(m) = crate::mountinfo::Mount::parse(line) else {
                continue;
            };
            if !m.read_only {
                continue;
            }
            let point = std::path::Path::new(OsStr::from_bytes(&m.point));
            let (Some(dir), Some(name)) = (point.parent(), point.file_name()) else {
                continue;
            };
            let dir_fd = match open_path(libc::AT_FDCWD, dir.as_os_str(), libc::O_DIRECTORY) {
                Ok(fd) => fd,
                Err(e) if unreachable(e) => continue,
                Err(e) => return Err(fail("open the directory of", &m.point, e)),
            };
            let Ok(cname) = CString::new(name.as_bytes()) else {
                continue;
            };
            let bound_fd =
                match super::openat_entry_raw(&dir_fd, &cname, libc::O_PATH | libc::O_NOFOLLOW) {
                    Ok(fd) => fd,
                    Err(e) if unreachable(e) => continue,
                    Err(e) => return Err(fail("hold", &m.point, e)),
                };
            let dir_st = fstat(&dir_fd).map_err(|e| fail("look at", &m.point, e))?;
            let st = fstat(&bound_fd).map_err(|e| fail("look at", &m.point, e))?;
            let on_host = !private.contains(&dir_st.st_dev)
                && !matches!(
                    fstatfs_type(&dir_fd),
                    Ok(super::PROC_SUPER_MAGIC | SYSFS_MAGIC)
                );
            // Regular files and directories: a device node on a read-only mount is still
            // written to.
            let kind = st.st_mode & libc::S_IFMT;
            if !matches!(kind, libc::S_IFREG | libc::S_IFDIR) || !on_host {
                continue;
            }
            let at = (dir_st.st_dev, dir_st.st_ino);
            // Binds stacked on one name are one protected file.
            if p.names.insert((at, name.as_bytes().to_vec())) {
                p.files.push(File {
                    _dir: dir_fd,
                    dir_path: dir.as_os_str().as_bytes().to_vec(),
                    name: cname,
                    at,
                    git_lock: kind == libc::S_IFREG && git_dirs.contains(&at),
                    bound: (st.st_dev, st.st_ino),
                    _bound: bound_fd,
                    path: m.point,
                    is_dir: kind == libc::S_IFDIR,
                });
            }
        }
        Ok(p)
    }

    /// The protected file `entry` names, if it names one: its own name, or `NAME.lock` for a
    /// file in a git directory (git writes that file and renames it onto the name: writing it
    /// before the host's git renames it would write the protected file). The directory is the
    /// protected file's own (device, inode), or the directory now at its path (the host may
    /// have made it anew). In a directory that folds names, a variant spelling (`CONFIG`,
    /// `config.`) is the same name.
    fn named(&self, entry: &Entry) -> Option<&File> {
        if self.files.is_empty() {
            return None;
        }
        let name = entry.name();
        if !self
            .files
            .iter()
            .any(|f| spelled(f, name, false) || spelled(f, name, true))
        {
            // No protected file is called so, in any spelling: which directory this is does
            // not matter (most names: no lookup).
            return None;
        }
        let Ok(st) = fstat(&entry.parent) else {
            // Which directory this is cannot be told: any protected file may be its.
            return self.files.iter().find(|f| spelled(f, name, true));
        };
        let at = (st.st_dev, st.st_ino);
        let mut path: Option<Option<Vec<u8>>> = None;
        // The directory's path that cannot be read counts as the protected file's.
        let mut here = |f: &File| {
            f.at == at
                || path
                    .get_or_insert_with(|| fd_path(&entry.parent))
                    .as_deref()
                    .is_none_or(|p| p == f.dir_path.as_slice())
        };
        if let Some(f) = self
            .files
            .iter()
            .find(|f| spelled(f, name, false) && here(f))
        {
            return Some(f);
        }
        if !self.files.iter().any(|f| f.at == at)
            || !super::folds_names(&super::Real, &entry.parent)
        {
            return None;
        }
        self.files
            .iter()
            .find(|f| f.at == at && spelled(f, name, true))
    }

    /// The protected file whose name (or `NAME.lock`) `fd`'s file is now at, if any. A name
    /// that cannot be looked up (the jail took the search permission off a directory on its
    /// path, so that the gate cannot tell which file is there), or a symlink there that leads
    /// nowhere, counts as holding it when `fd`'s file is on the same file system: the gate
    /// cannot tell, so it refuses.
    fn holding(&self, fd: &OwnedFd) -> Option<&File> {
        if self.files.is_empty() {
            return None;
        }
        let Ok(st) = fstat(fd) else {
            // Which file this is cannot be told: it may be a protected one.
            return self.files.iter().find(|f| !f.is_dir);
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        let id = (st.st_dev, st.st_ino);
        self.files.iter().filter(|f| !f.is_dir).find(|f| {
            let lock = [f.name.as_bytes(), b".lock"].concat();
            let names: &[&[u8]] = if f.git_lock {
                &[f.name.as_bytes(), &lock]
            } else {
                &[f.name.as_bytes()]
            };
            names.iter().any(|name| match now(f, name) {
                CurrentEntry::Absent => false,
                CurrentEntry::At(_, Some(t)) => t.id == id,
                CurrentEntry::At(_, None) | CurrentEntry::Unknown => f.same_fs(st.st_dev),
            })
        })
    }

    /// The protected directories the host replaced, with the (device, inode) of the directory
    /// at their path now (through a symlink the host put there). While a directory's bind is
    /// there the kernel holds what is below it (read-only); once it is gone, the gate does.
    /// `Err` names one whose replacement cannot be looked at (a directory on its path not
    /// searchable, a symlink at its name that leads nowhere): the gate cannot tell what is
    /// below it.
    fn replaced_dirs(&self) -> Result<Replaced<'_>, &File> {
        let mut out = Vec::new();
        for f in self.files.iter().filter(|f| f.is_dir) {
            match now(f, f.name.as_bytes()) {
                CurrentEntry::Absent => {}
                CurrentEntry::At(at, _) if at.id == f.bound => {}
                CurrentEntry::At(_, Some(t)) if t.kind == libc::S_IFDIR => out.push((f, t.id)),
                // A file where the directory was: nothing below it.
                CurrentEntry::At(_, Some(_)) => {}
                CurrentEntry::At(_, None) | CurrentEntry::Unknown => return Err(f),
            }
        }
        Ok(out)
    }

    /// The replaced protected directory `dir` is (or is below), if any: found by walking up
    /// `..` from `dir` to the root. Where the gate cannot tell (a step of the walk fails, a
    /// replacement it cannot look at), a directory on the same file system counts as below.
    fn containing(&self, dir: &OwnedFd) -> Option<&File> {
        // While no protected directory is replaced, their binds hold what is below them: no
        // lookup of `dir` (most calls).
        let replaced = self.replaced_dirs();
        if replaced.as_ref().is_ok_and(|r| r.is_empty()) {
            return None;
        }
        let Ok(mut st) = fstat(dir) else {
            return self.files.iter().find(|f| f.is_dir);
        };
        let replaced = match replaced {
            Ok(r) => r,
            Err(f) => return f.same_fs(st.st_dev).then_some(f),
        };
        let unknown = Some(replaced[0].0);
        let mut up: Option<OwnedFd> = None;
        for _ in 0..PATH_DEPTH_MAX {
            let id = (st.st_dev, st.st_ino);
            if let Some((f, _)) = replaced.iter().find(|(_, now)| *now == id) {
                return Some(f);
            }
            let from = up.as_ref().unwrap_or(dir);
            let Ok(parent) = super::openat_entry_raw(from, c"..", libc::O_PATH | libc::O_DIRECTORY)
            else {
                return unknown;
            };
            let Ok(pst) = fstat(&parent) else {
                return unknown;
            };
            if (pst.st_dev, pst.st_ino) == id {
                return None;
            }
            st = pst;
            up = Some(parent);
        }
        unknown
    }

    /// The replaced protected directory the file open on `fd` is below, if any (a file
    /// reopened through `/proc/self/fd/N` has no directory to walk up from: its path, as the
    /// kernel names it, is compared with the directory's, and with the path its symlink
    /// leads to). Where the gate cannot tell, a file on the same file system counts as below.
    fn containing_file(&self, fd: &OwnedFd) -> Option<&File> {
        let replaced = self.replaced_dirs();
        if replaced.as_ref().is_ok_and(|r| r.is_empty()) {
            return None;
        }
        // A device that cannot be told counts as the protected directory's.
        let dev = fstat(fd).ok().map(|st| st.st_dev);
        let same_fs = |f: &File| dev.is_none_or(|d| f.same_fs(d));
        let replaced = match replaced {
            Ok(r) => r,
            Err(f) => return same_fs(f).then_some(f),
        };
        let Some(path) = fd_path(fd) else {
            return Some(replaced[0].0);
        };
        let below = |dir: &[u8]| path.strip_prefix(dir).is_some_and(|r| r.starts_with(b"/"));
        replaced.into_iter().map(|(f, _)| f).find(|f| {
            below(f.path.as_slice())
                || match std::fs::canonicalize(OsStr::from_bytes(&f.path)) {
                    Ok(real) => below(real.as_os_str().as_bytes()),
                    Err(_) => same_fs(f),
                }
        })
    }

    /// Is the bind of `f` gone (another file at its name, or none)?
    fn replaced(f: &File) -> bool {
        !matches!(now(f, f.name.as_bytes()), CurrentEntry::At(at, _) if at.id == f.bound)
    }
}

impl File {
    /// Is a file on device `dev` on the file system of this protected file or its directory?
    fn same_fs(&self, dev: u64) -> bool {
        dev == self.at.0 || dev == self.bound.0
    }
}

/// Is `name` this protected file's name (or its `NAME.lock`), spelled exactly, or (`fold`) as
/// a directory that folds names takes it?
fn spelled(f: &File, name: &[u8], fold: bool) -> bool {
    let folded = |n: &[u8]| {
        let end = n
            .iter()
            .rposition(|&b| b != b'.' && b != b' ')
            .map_or(0, |i| i + 1);
        n[..end].to_ascii_lowercase()
    };
    let (name, own) = if fold {
        (folded(name), folded(f.name.as_bytes()))
    } else {
        (name.to_vec(), f.name.as_bytes().to_vec())
    };
    name == own || (f.git_lock && name.strip_suffix(b".lock") == Some(own.as_slice()))
}

/// The path of what `fd` is open on, as the kernel names it (`/proc/self/fd/N`).
fn fd_path(fd: &OwnedFd) -> Option<Vec<u8>> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .ok()
        .map(|p| p.into_os_string().into_vec())
}

/// A file's (device, inode) and type.
#[derive(Clone, Copy)]
struct Ident {
    id: (u64, u64),
    kind: libc::mode_t,
}

impl Ident {
    fn of(st: libc::stat) -> Ident {
        Ident {
            id: (st.st_dev, st.st_ino),
            kind: st.st_mode & libc::S_IFMT,
        }
    }
}

/// What is at a name in a protected file's directory now.
enum CurrentEntry {
    Absent,
    /// The entry itself, and what it leads to (itself, or a symlink's target: `None` when
    /// the link dangles).
    At(Ident, Option<Ident>),
    /// It could not be looked up.
    Unknown,
}

/// What is at `name` in `f`'s directory now, looked up by its path (the directory there
/// now, if the host made it anew).
fn now(f: &File, name: &[u8]) -> CurrentEntry {
    let path = [f.dir_path.as_slice(), b"/", name].concat();
    let path = OsStr::from_bytes(&path);
    let root = libc::AT_FDCWD;
    match fstatat_path(root, path, libc::AT_SYMLINK_NOFOLLOW).map(Ident::of) {
        Ok(at) if at.kind == libc::S_IFLNK => {
            CurrentEntry::At(at, fstatat_path(root, path, 0).ok().map(Ident::of))
        }
        Ok(at) => CurrentEntry::At(at, Some(at)),
        // Only ENOENT is absence (ENOTDIR, EACCES, ELOOP, ...: the gate cannot tell).
        Err(e) => now_of_error(e),
    }
}

/// What a failed lookup of a protected name says: absent only for ENOENT.
fn now_of_error(errno: i32) -> CurrentEntry {
    match super::Seen::of(Err::<(), _>(errno)) {
        super::Seen::Absent => CurrentEntry::Absent,
        super::Seen::Present => CurrentEntry::Unknown,
    }
}

/// fstatat on a path relative to `dir` (a raw descriptor, `AT_FDCWD` for an absolute path).
fn fstatat_path(dir: i32, path: &OsStr, flags: i32) -> Result<libc::stat, i32> {
    let c = CString::new(path.as_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: stat is plain data the kernel fills in; `c` is a valid C string.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, flags) } != 0 {
        return Err(super::errno());
    }
    Ok(st)
}

/// The protected directories the host replaced, each with the (device, inode) of the
/// directory at its name now.
type Replaced<'a> = Vec<(&'a File, (u64, u64))>;

/// What the gate does with a protected file.
#[derive(Debug, Clone, Copy)]
pub(super) enum Use {
    /// Opened for writing, or truncated.
    Write,
    /// A new entry made at its name.
    Create,
    /// Renamed onto or away from.
    Rename,
    /// Linked elsewhere.
    Link,
    /// A socket bound to its name.
    Bind,
    /// Anything changed in a replaced protected directory, or below it.
    Below,
}

impl<S: super::Sys> super::Gate<S> {
    /// Refuse `what` on `entry`: in a protected directory the host replaced (or below it), or
    /// on the protected file it names.
    pub(super) fn protected_entry(&self, entry: &Entry, what: Use) -> Result<(), i32> {
        // On the jail's own file systems nothing is protected (as `on_private` says, read
        // once when the entry was resolved).
        if entry.private {
            return Ok(());
        }
        // In a protected directory the host replaced, or below it: nothing changes (EROFS,
        // as its bind said).
        if let Some(f) = self.protected.containing(&entry.parent) {
            return Err(self.refuse_protected(f, Use::Below, true));
        }
        self.protected_name(entry, what)
    }

    /// Refuse `what` on the protected file `entry` (not on the jail's own file systems)
    /// names (the errno the bind gave while it was there).
    fn protected_name(&self, entry: &Entry, what: Use) -> Result<(), i32> {
        let Some(f) = self.protected.named(entry) else {
            return Ok(());
        };
        // Refused either way; whether something is there only picks the errno.
        let exists = fstatat(
            &entry.parent,
            OsStr::from_bytes(entry.name()),
            libc::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok();
        Err(self.refuse_protected(f, what, exists))
    }

    /// Refuse `what` on `fd` when its file is the one at a protected name now, or below a
    /// protected directory the host replaced.
    pub(super) fn protected_file(&self, fd: &OwnedFd, what: Use) -> Result<(), i32> {
        if self.on_private(fd) {
            return Ok(());
        }
        if let Some(f) = self.protected.holding(fd) {
            return Err(self.refuse_protected(f, what, true));
        }
        match self.protected.containing_file(fd) {
            Some(f) => Err(self.refuse_protected(f, Use::Below, true)),
            None => Ok(()),
        }
    }

    /// Is `fd` on one of the jail's own file systems (its tmpfs /tmp, home): nothing there is
    /// the host's, so nothing there is protected.
    fn on_private(&self, fd: &OwnedFd) -> bool {
        fstat(fd).is_ok_and(|st| self.private_devs.contains(&st.st_dev))
    }

    fn refuse_protected(&self, f: &File, what: Use, exists: bool) -> i32 {
        let errno = refusal_errno(what, f.is_dir, exists);
        // While the bind is there the jail gets what it always got, silently; once the host
        // replaced the file, the refusal is the gate's and is said once.
        if Protected::replaced(f) {
            let path = String::from_utf8_lossy(&f.path);
            let (what, it) = if f.is_dir {
                ("in ", "what is in it")
            } else {
                ("", "the new file")
            };
            self.reports.send(
                f.path.clone(),
                format!(
                    "corral: refused writing {what}{path}: it is protected (read-only in the \
                     jail). The host replaced it during the run, which detached the jail's \
                     read-only bind; the name gate keeps it read-only (the jail can read {it}).",
                ),
            );
        }
        errno
    }
}

/// The errno `what` on a protected file or directory (`is_dir`) gets: the one its read-only
/// bind gave while it was there (`exists`: something is at the name now).
pub(super) fn refusal_errno(what: Use, is_dir: bool, exists: bool) -> i32 {
    match what {
        Use::Write if is_dir => libc::EISDIR,
        Use::Write | Use::Below => libc::EROFS,
        Use::Bind if exists => libc::EADDRINUSE,
        Use::Bind => libc::EROFS,
        Use::Create if exists => libc::EEXIST,
        Use::Create => libc::EROFS,
        Use::Rename => libc::EBUSY,
        Use::Link => libc::EXDEV,
    }
}

/// `fd`'s descriptor number, for the `/proc/self/fd/N` path of a truncate.
pub(super) fn truncate_path(fd: &OwnedFd) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// The protection of `path` as a read-only bind of its own (no git directory, nothing
    /// private).
    /// A read-only descriptor of `path`.
    fn open(path: &std::path::Path) -> OwnedFd {
        std::fs::File::open(path).unwrap().into()
    }

    fn protect(path: &std::path::Path) -> Protected {
        Protected::from_mountinfo(
            line(path, "ro").as_bytes(),
            &HashSet::new(),
            &HashSet::new(),
        )
        .unwrap()
    }

    fn line(point: &std::path::Path, opts: &str) -> String {
        format!(
            "58 40 254:0 /x {} {opts} shared:1 - ext4 /dev/vda rw\n",
            point.display()
        )
    }

    /// A protected name that cannot be looked up is not absent: only ENOENT is.
    #[test]
    fn only_enoent_leaves_a_protected_name_absent() {
        assert!(matches!(now_of_error(libc::ENOENT), CurrentEntry::Absent));
        for e in [
            libc::ENOTDIR,
            libc::EACCES,
            libc::ELOOP,
            libc::EIO,
            libc::ENOMEM,
            libc::ENAMETOOLONG,
        ] {
            assert!(
                matches!(now_of_error(e), CurrentEntry::Unknown),
                "errno {e}"
            );
        }
    }

    #[test]
    fn read_only_binds_of_one_file_on_a_host_file_system_are_protected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        let sub = dir.path().join("hooks");
        std::fs::write(&file, "x").unwrap();
        std::fs::create_dir(&sub).unwrap();
        let info = [
            line(&file, "ro,nosuid"),
            line(&file, "ro"), // stacked: one file
            line(&sub, "ro"),  // a directory: protected too
            line(&dir.path().join("absent"), "ro"),
            line(std::path::Path::new("/proc/kcore"), "ro"), // /proc
            line(std::path::Path::new("/dev/null"), "ro"),   // a device node
        ]
        .concat();
        let p =
            Protected::from_mountinfo(info.as_bytes(), &HashSet::new(), &HashSet::new()).unwrap();
        assert_eq!(p.files.len(), 2);
        assert_eq!(p.files[0].name.as_bytes(), b"config");
        assert_eq!(p.files[1].name.as_bytes(), b"hooks");
        let ino = std::fs::metadata(&file).unwrap().ino();
        assert_eq!(p.files[0].bound.1, ino);
        // Read-write, or in the jail's own file systems: not protected.
        let rw = Protected::from_mountinfo(
            line(&file, "rw").as_bytes(),
            &HashSet::new(),
            &HashSet::new(),
        )
        .unwrap();
        assert!(rw.files.is_empty());
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        let own = Protected::from_mountinfo(
            line(&file, "ro").as_bytes(),
            &HashSet::from([dev]),
            &HashSet::new(),
        )
        .unwrap();
        assert!(own.files.is_empty());
    }

    #[test]
    fn the_name_and_in_a_git_directory_its_lock_are_protected_a_folded_spelling_only_where_names_fold()
     {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, "x").unwrap();
        let st = std::fs::metadata(dir.path()).unwrap();
        let git = HashSet::from([(st.dev(), st.ino())]);
        let info = line(&file, "ro");
        let p = Protected::from_mountinfo(info.as_bytes(), &HashSet::new(), &git).unwrap();
        let plain =
            Protected::from_mountinfo(info.as_bytes(), &HashSet::new(), &HashSet::new()).unwrap();
        let entry = |name: &str| Entry {
            parent: open_path(libc::AT_FDCWD, dir.path().as_os_str(), libc::O_DIRECTORY).unwrap(),
            last: name.as_bytes().to_vec(),
            private: false,
        };
        for name in ["config", "config.lock", "config/"] {
            assert!(p.named(&entry(name)).is_some(), "{name}");
        }
        // Outside a git directory, NAME.lock is another file (a protected Gemfile leaves
        // Gemfile.lock writable).
        assert!(plain.named(&entry("config")).is_some());
        assert!(plain.named(&entry("config.lock")).is_none());
        // This directory does not fold names: another spelling is another file.
        for name in ["CONFIG", "config.", "config.lock.lock", "configx", "x.lock"] {
            assert!(p.named(&entry(name)).is_none(), "{name}");
        }
        // A file written as config.lock is the protected one, for a write through any path.
        std::fs::write(dir.path().join("config.lock"), "y").unwrap();
        let lock = open(&dir.path().join("config.lock"));
        assert!(p.holding(&lock).is_some());
        assert!(plain.holding(&lock).is_none());
    }

    #[test]
    fn a_protected_file_is_found_in_the_directory_the_host_made_anew_at_its_path() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("wf");
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("ci.yml");
        std::fs::write(&file, "x").unwrap();
        let p = protect(&file);
        // A checkout removes the directory and makes it again.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let entry = Entry {
            parent: open_path(libc::AT_FDCWD, dir.as_os_str(), libc::O_DIRECTORY).unwrap(),
            last: b"ci.yml".to_vec(),
            private: false,
        };
        assert!(p.named(&entry).is_some());
        std::fs::write(&file, "y").unwrap();
        let fd = open(&file);
        assert!(p.holding(&fd).is_some());
    }

    #[test]
    fn below_a_replaced_protected_directory_is_found_by_walking_up_and_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let hooks = dir.path().join("hooks");
        std::fs::create_dir(&hooks).unwrap();
        let p = protect(&hooks);
        assert!(p.files[0].is_dir);
        // Its bind is there: the kernel holds it, nothing is looked up.
        assert!(p.replaced_dirs().map_err(|_| ()).unwrap().is_empty());
        assert!(p.containing(&open(&hooks)).is_none());
        // The host removes it and makes another.
        std::fs::remove_dir(&hooks).unwrap();
        std::fs::create_dir_all(hooks.join("a/b")).unwrap();
        std::fs::write(hooks.join("a/b/f"), "x").unwrap();
        assert_eq!(p.replaced_dirs().map_err(|_| ()).unwrap().len(), 1);
        for d in [hooks.clone(), hooks.join("a"), hooks.join("a/b")] {
            assert!(p.containing(&open(&d)).is_some(), "{}", d.display());
        }
        assert!(p.containing(&open(dir.path())).is_none());
        assert!(p.containing_file(&open(&hooks.join("a/b/f"))).is_some());
        std::fs::write(dir.path().join("hooks-not"), "x").unwrap();
        assert!(
            p.containing_file(&open(&dir.path().join("hooks-not")))
                .is_none()
        );
    }

    #[test]
    fn the_file_now_at_a_protected_name_is_found_by_descriptor_and_a_replacement_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, "x").unwrap();
        let p = protect(&file);
        assert!(p.holding(&open(&file)).is_some());
        assert!(!Protected::replaced(&p.files[0]));
        // The host replaces it by rename: the new file is the protected one, the old is not.
        let old = open(&file);
        let new = dir.path().join("config.lock");
        std::fs::write(&new, "y").unwrap();
        std::fs::rename(&new, &file).unwrap();
        assert!(Protected::replaced(&p.files[0]));
        assert!(p.holding(&open(&file)).is_some());
        assert!(p.holding(&old).is_none());
        let other = dir.path().join("other");
        std::fs::write(&other, "z").unwrap();
        assert!(p.holding(&open(&other)).is_none());
    }
}
