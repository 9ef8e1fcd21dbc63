//! Protected files and directories the host replaces during the run (#12: "a protected file
//! the host replaces by rename"). A protected file (`.git/config`, `corral.toml`, a harness's `settings.json`, a
//! hidden file's placeholder) is a read-only bind of one file. When the host replaces that file
//! by rename (`git config`, an editor saving, the host's harness refreshing its state), the
//! kernel detaches every other mount namespace's mount on the old file: the jail then sees the
//! new file through the read-write directory around it. The gate keeps the name read-only for
//! the rest of the run: it knows each protected file by its directory (device, inode) and its
//! name, taken from the read-only binds of one file in the jail's mountinfo when the jail
//! starts, and refuses what would write through it:
//! - a write open (O_WRONLY, O_RDWR, O_TRUNC) of the name: EROFS, as the bind said;
//! - a write open of the file now at the name by any other path (`/proc/self/fd/N` of a
//!   read-only descriptor, a link): EROFS, checked on the opened file;
//! - creating the name (O_CREAT after an unlink, mkdir, mknod, symlink, link, bind): EEXIST
//!   where something is there, EROFS where not;
//! - renaming onto it or away from it: EBUSY, as for a mount point;
//! - linking the file now at the name elsewhere: EXDEV, as across mounts;
//! - truncate(2) of it: EROFS.
//!
//! A protected directory (`.git/hooks`, a harness's `extensions/` or `plugins/`) is a read-only
//! bind too, and the host removing it and putting another in its place detaches it the same
//! way: from then on, changing anything in the directory now at its name, or below it (found
//! by walking up `..` from where the change is made; for a file reopened through `/proc`, by
//! its path), is refused with EROFS.
//!
//! Reading it is not held: a read-open is not stopped by the gate's filter (every open would
//! be), so what the host writes there is readable for the rest of the run (docs/host-safety.md,
//! "Known limits"). Unlink is not stopped either (every `rm` would be): the jail can remove the
//! host's new file, not put one of its own in its place.
use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use super::{Entry, fstat, fstatat, fstatfs_type, open_path};

const SYSFS_MAGIC: i64 = 0x6265_6572;
/// Directories walked up at most, looking for a replaced protected one.
const PATH_DEPTH_MAX: usize = 2048;

/// One protected file: where it is, and the file its bind showed when the jail started.
struct File {
    /// Its directory, held for the run (an inode number is not reused while it is open).
    dir: OwnedFd,
    name: CString,
    /// The directory's (device, inode), as [`Entry`]s are compared.
    at: (u64, u64),
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
    /// The read-only binds of one file in `mountinfo` (this process's), whose directory is a
    /// file system the host sees: not one of `private` (the jail's own: a bind over a file of
    /// its tmpfs root cannot be replaced from outside), not /proc or /sys.
    pub(super) fn from_mountinfo(mountinfo: &[u8], private: &HashSet<u64>) -> Protected {
        let mut p = Protected::default();
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
            let Ok(dir_fd) = open_path(libc::AT_FDCWD, dir.as_os_str(), libc::O_DIRECTORY) else {
                continue;
            };
            let Ok(cname) = CString::new(name.as_bytes()) else {
                continue;
            };
            let Ok(bound_fd) =
                super::openat_entry_raw(&dir_fd, &cname, libc::O_PATH | libc::O_NOFOLLOW)
            else {
                continue;
            };
            let (Ok(dir_st), Ok(st)) = (fstat(&dir_fd), fstat(&bound_fd)) else {
                continue;
            };
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
                    dir: dir_fd,
                    name: cname,
                    at,
                    bound: (st.st_dev, st.st_ino),
                    _bound: bound_fd,
                    path: m.point,
                    is_dir: kind == libc::S_IFDIR,
                });
            }
        }
        p
    }

    /// The protected file `entry` names, if it names one.
    fn named(&self, entry: &Entry) -> Option<&File> {
        if self.files.is_empty() {
            return None;
        }
        let st = fstat(&entry.parent).ok()?;
        let at = (st.st_dev, st.st_ino);
        let name = entry.name();
        self.files
            .iter()
            .find(|f| f.at == at && f.name.as_bytes() == name)
    }

    /// The protected file whose name `fd`'s file is now at, if any.
    fn holding(&self, fd: &OwnedFd) -> Option<&File> {
        if self.files.is_empty() {
            return None;
        }
        let st = fstat(fd).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        self.files.iter().find(|f| {
            !f.is_dir
                && fstatat(
                    &f.dir,
                    OsStr::from_bytes(f.name.as_bytes()),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
                .is_ok_and(|now| (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino))
        })
    }

    /// The protected directories the host replaced, with the (device, inode) of the directory
    /// at their name now. While a directory's bind is there the kernel holds what is below it
    /// (read-only); once it is gone, the gate does.
    fn replaced_dirs(&self) -> Vec<(&File, (u64, u64))> {
        self.files
            .iter()
            .filter(|f| f.is_dir)
            .filter_map(|f| {
                let now = fstatat(
                    &f.dir,
                    OsStr::from_bytes(f.name.as_bytes()),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
                .ok()?;
                let id = (now.st_dev, now.st_ino);
                (now.st_mode & libc::S_IFMT == libc::S_IFDIR && id != f.bound).then_some((f, id))
            })
            .collect()
    }

    /// The replaced protected directory `dir` is (or is below), if any: found by walking up
    /// `..` from `dir` to the root.
    fn containing(&self, dir: &OwnedFd) -> Option<&File> {
        let replaced = self.replaced_dirs();
        if replaced.is_empty() {
            return None;
        }
        let mut st = fstat(dir).ok()?;
        let mut up: Option<OwnedFd> = None;
        for _ in 0..PATH_DEPTH_MAX {
            let id = (st.st_dev, st.st_ino);
            if let Some((f, _)) = replaced.iter().find(|(_, now)| *now == id) {
                return Some(f);
            }
            let from = up.as_ref().unwrap_or(dir);
            let parent =
                super::openat_entry_raw(from, c"..", libc::O_PATH | libc::O_DIRECTORY).ok()?;
            let pst = fstat(&parent).ok()?;
            if (pst.st_dev, pst.st_ino) == id {
                return None;
            }
            st = pst;
            up = Some(parent);
        }
        None
    }

    /// The replaced protected directory the file open on `fd` is below, if any (a file
    /// reopened through `/proc/self/fd/N` has no directory to walk up from: its path, as the
    /// kernel names it, is compared).
    fn containing_file(&self, fd: &OwnedFd) -> Option<&File> {
        let replaced = self.replaced_dirs();
        if replaced.is_empty() {
            return None;
        }
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        let path = path.as_os_str().as_bytes();
        replaced.into_iter().map(|(f, _)| f).find(|f| {
            path.strip_prefix(f.path.as_slice())
                .is_some_and(|r| r.starts_with(b"/"))
        })
    }

    /// Is the bind of `f` gone (another file at its name, or none)?
    fn replaced(f: &File) -> bool {
        fstatat(
            &f.dir,
            OsStr::from_bytes(f.name.as_bytes()),
            libc::AT_SYMLINK_NOFOLLOW,
        )
        .map_or(true, |now| (now.st_dev, now.st_ino) != f.bound)
    }
}

/// What the gate does with a protected file.
#[derive(Clone, Copy)]
pub(super) enum Use {
    /// Opened for writing, or truncated.
    Write,
    /// A new entry made at its name.
    Create,
    /// Renamed onto or away from.
    Rename,
    /// Linked elsewhere.
    Link,
}

impl super::Gate {
    /// Refuse `what` on the protected file `entry` names (the errno the bind gave while it
    /// was there).
    pub(super) fn protected_name(&self, entry: &Entry, what: Use) -> Result<(), i32> {
        let Some(f) = self.protected.named(entry) else {
            return Ok(());
        };
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
        if let Some(f) = self.protected.holding(fd) {
            return Err(self.refuse_protected(f, what, true));
        }
        match self.protected.containing_file(fd) {
            Some(f) => Err(self.refuse_protected(f, Use::Write, true)),
            None => Ok(()),
        }
    }

    /// Refuse changing anything in `dir` when it is, or is below, a protected directory the
    /// host replaced (EROFS, as its bind said).
    pub(super) fn protected_dir(&self, dir: &OwnedFd) -> Result<(), i32> {
        match self.protected.containing(dir) {
            Some(f) => Err(self.refuse_protected(f, Use::Write, true)),
            None => Ok(()),
        }
    }

    fn refuse_protected(&self, f: &File, what: Use, exists: bool) -> i32 {
        let errno = match what {
            Use::Write => libc::EROFS,
            Use::Create if exists => libc::EEXIST,
            Use::Create => libc::EROFS,
            Use::Rename => libc::EBUSY,
            Use::Link => libc::EXDEV,
        };
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

/// `fd`'s descriptor number, for the `/proc/self/fd/N` path of a truncate.
pub(super) fn truncate_path(fd: &OwnedFd) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn line(point: &std::path::Path, opts: &str) -> String {
        format!(
            "58 40 254:0 /x {} {opts} shared:1 - ext4 /dev/vda rw\n",
            point.display()
        )
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
        let p = Protected::from_mountinfo(info.as_bytes(), &HashSet::new());
        assert_eq!(p.files.len(), 2);
        assert_eq!(p.files[0].name.as_bytes(), b"config");
        assert_eq!(p.files[1].name.as_bytes(), b"hooks");
        let ino = std::fs::metadata(&file).unwrap().ino();
        assert_eq!(p.files[0].bound.1, ino);
        // Read-write, or in the jail's own file systems: not protected.
        let rw = Protected::from_mountinfo(line(&file, "rw").as_bytes(), &HashSet::new());
        assert!(rw.files.is_empty());
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        let own = Protected::from_mountinfo(line(&file, "ro").as_bytes(), &HashSet::from([dev]));
        assert!(own.files.is_empty());
    }

    #[test]
    fn below_a_replaced_protected_directory_is_found_by_walking_up_and_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let hooks = dir.path().join("hooks");
        std::fs::create_dir(&hooks).unwrap();
        let p = Protected::from_mountinfo(line(&hooks, "ro").as_bytes(), &HashSet::new());
        assert!(p.files[0].is_dir);
        let open =
            |path: &std::path::Path| -> OwnedFd { std::fs::File::open(path).unwrap().into() };
        // Its bind is there: the kernel holds it, nothing is looked up.
        assert!(p.replaced_dirs().is_empty());
        assert!(p.containing(&open(&hooks)).is_none());
        // The host removes it and makes another.
        std::fs::remove_dir(&hooks).unwrap();
        std::fs::create_dir_all(hooks.join("a/b")).unwrap();
        std::fs::write(hooks.join("a/b/f"), "x").unwrap();
        assert_eq!(p.replaced_dirs().len(), 1);
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
        let p = Protected::from_mountinfo(line(&file, "ro").as_bytes(), &HashSet::new());
        let open =
            |path: &std::path::Path| -> OwnedFd { std::fs::File::open(path).unwrap().into() };
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
