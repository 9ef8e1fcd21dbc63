//! File operations on corral's harness state layer and the host's state that never follow a
//! symbolic link: every path is opened beneath a directory descriptor with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, every entry is looked at with `AT_SYMLINK_NOFOLLOW`
//! and replaced by `renameat` of a fresh file made with `O_EXCL | O_NOFOLLOW`. The layer holds
//! what jailed runs wrote, so a link there (or one planted on the host's side by an earlier
//! corral) is never a way to read or write elsewhere.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat, mkdirat};

/// What an entry is, looked at without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Link,
    /// A character device 0:0: an overlay's whiteout (the entry was deleted above).
    Whiteout,
    Other,
}

pub fn kind_of(st: &FileStat) -> Kind {
    let fmt = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    if fmt == SFlag::S_IFDIR {
        Kind::Dir
    } else if fmt == SFlag::S_IFREG {
        Kind::File
    } else if fmt == SFlag::S_IFLNK {
        Kind::Link
    } else if fmt == SFlag::S_IFCHR && st.st_rdev == 0 {
        Kind::Whiteout
    } else {
        Kind::Other
    }
}

fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// A directory named by an absolute path the user or corral chose (the state directory, the
/// layer), opened as it resolves.
pub fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(openat(
        AT_FDCWD,
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// `rel` beneath `dir`, opened with `flags`, no symbolic link followed on the way or at the end
/// (an empty `rel` is `dir` itself).
pub fn open_beneath(dir: &OwnedFd, rel: &Path, flags: OFlag) -> std::io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(beneath());
    Ok(openat2(dir.as_fd(), rel, how)?)
}

/// The entry `name` of `dir`, not followed; `None` when absent.
pub fn stat_at(dir: &OwnedFd, name: &OsStr) -> std::io::Result<Option<FileStat>> {
    match fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The names in `dir` (sorted), `.` and `..` left out.
pub fn list(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    let fd = open_beneath(dir, Path::new("."), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for e in d.iter() {
        let e = e?;
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_os_string());
        }
    }
    names.sort();
    Ok(names)
}

/// The parent directory of `rel` beneath `root` (made when `create`, mode 0700) and the last
/// name. `rel` must be a plain relative path of normal names.
pub fn parent_beneath<'r>(
    root: &OwnedFd,
    rel: &'r Path,
    create: bool,
) -> std::io::Result<(OwnedFd, &'r OsStr)> {
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => names.push(n),
            _ => {
                return Err(std::io::Error::other(format!(
                    "{} is not a plain relative path",
                    rel.display()
                )));
            }
        }
    }
    let Some((last, parents)) = names.split_last() else {
        return Err(std::io::Error::other("an empty path"));
    };
    let mut dir = open_beneath(root, Path::new("."), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    for n in parents {
        if create {
            match mkdirat(dir.as_fd(), *n, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        dir = open_beneath(&dir, Path::new(n), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    }
    Ok((dir, last))
}

/// Read the regular file `name` in `dir` (not followed), at most `max` bytes.
pub fn read_file(dir: &OwnedFd, name: &OsStr, max: u64) -> std::io::Result<Vec<u8>> {
    let fd = open_beneath(dir, Path::new(name), OFlag::O_RDONLY)?;
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    if kind_of(&st) != Kind::File {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut f = std::fs::File::from(fd);
    let mut out = Vec::new();
    Read::by_ref(&mut f)
        .take(max.saturating_add(1))
        .read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(out)
}

/// Replace the entry `name` of `dir` with a regular file holding `bytes` (mode `mode`): a fresh
/// file made beside it, then renamed over it, so whatever stood there (a link, a whiteout) is
/// replaced, never written through.
pub fn replace_file(dir: &OwnedFd, name: &OsStr, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = tmp_name(name);
    let fd = openat(
        dir.as_fd(),
        tmp.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode & 0o777),
    )?;
    let mut f = std::fs::File::from(fd);
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = nix::unistd::unlinkat(
            dir.as_fd(),
            tmp.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        return Err(e);
    }
    nix::fcntl::renameat(dir.as_fd(), tmp.as_os_str(), dir.as_fd(), name).map_err(|e| {
        let _ = nix::unistd::unlinkat(
            dir.as_fd(),
            tmp.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        std::io::Error::from(e)
    })
}

/// Remove the entry `name` of `dir` (a directory with everything in it), not followed.
pub fn remove_at(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    let Some(st) = stat_at(dir, name)? else {
        return Ok(());
    };
    if kind_of(&st) == Kind::Dir {
        let sub = open_beneath(dir, Path::new(name), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        for n in list(&sub)? {
            remove_at(&sub, &n)?;
        }
        nix::unistd::unlinkat(dir.as_fd(), name, nix::unistd::UnlinkatFlags::RemoveDir)?;
    } else {
        nix::unistd::unlinkat(dir.as_fd(), name, nix::unistd::UnlinkatFlags::NoRemoveDir)?;
    }
    Ok(())
}

fn tmp_name(name: &OsStr) -> OsString {
    let mut t = OsString::from(format!(".corral-{}-", std::process::id()));
    t.push(name);
    t
}

/// How a tree copy treats what it meets.
#[derive(Debug, Clone, Copy)]
pub struct CopyRules {
    /// Copy symbolic links as links (into corral's own layer); else leave them out.
    pub links: bool,
    /// Bytes copied at most; beyond, the copy stops with an error.
    pub max_bytes: u64,
}

/// What a tree copy did.
#[derive(Debug, Default)]
pub struct Copied {
    pub bytes: u64,
    /// Entries left out (links, whiteouts, devices), relative to the tree copied.
    pub skipped: Vec<std::path::PathBuf>,
}

/// Copy the tree in `src` into `dst` (both directories), entry by entry, without following any
/// link on either side: directories are made (or entered), files and links replace what
/// stands at their name in `dst`. Whiteouts and devices are left out (a deletion is not
/// carried).
pub fn copy_tree(
    src: &OwnedFd,
    dst: &OwnedFd,
    rules: CopyRules,
    done: &mut Copied,
) -> std::io::Result<()> {
    copy_tree_at(src, dst, Path::new(""), rules, done)
}

fn copy_tree_at(
    src: &OwnedFd,
    dst: &OwnedFd,
    at: &Path,
    rules: CopyRules,
    done: &mut Copied,
) -> std::io::Result<()> {
    for name in list(src)? {
        let Some(st) = stat_at(src, &name)? else {
            continue;
        };
        let shown = at.join(&name);
        match kind_of(&st) {
            Kind::Dir => {
                if let Some(d) = stat_at(dst, &name)?
                    && kind_of(&d) != Kind::Dir
                {
                    remove_at(dst, &name)?;
                }
                match mkdirat(
                    dst.as_fd(),
                    name.as_os_str(),
                    // The owner can always enter what is copied (a jail may make a mode-000 one).
                    Mode::from_bits_truncate((st.st_mode & 0o777) | 0o700),
                ) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let s = open_beneath(src, Path::new(&name), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
                let d = open_beneath(dst, Path::new(&name), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
                copy_tree_at(&s, &d, &shown, rules, done)?;
            }
            _ => copy_entry(src, dst, &name, &st, &shown, rules, done)?,
        }
    }
    Ok(())
}

/// Carry an overlay's upper directory `upper` into `dst`, a copy of the host's directory it
/// was above, so `dst` holds what the jail saw through the overlay: files and links replace
/// what stands at their name, a whiteout removes the entry, an opaque directory replaces the
/// directory whole. No link is followed on either side.
pub fn carry_upper(
    upper: &OwnedFd,
    dst: &OwnedFd,
    rules: CopyRules,
    done: &mut Copied,
) -> std::io::Result<()> {
    carry_upper_at(upper, dst, Path::new(""), rules, done)
}

fn carry_upper_at(
    upper: &OwnedFd,
    dst: &OwnedFd,
    at: &Path,
    rules: CopyRules,
    done: &mut Copied,
) -> std::io::Result<()> {
    for name in list(upper)? {
        let Some(st) = stat_at(upper, &name)? else {
            continue;
        };
        let shown = at.join(&name);
        match kind_of(&st) {
            Kind::Whiteout => remove_at(dst, &name)?,
            Kind::Dir => {
                let s = open_beneath(
                    upper,
                    Path::new(&name),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                )?;
                let below = stat_at(dst, &name)?.map(|d| kind_of(&d));
                if below.is_some() && (below != Some(Kind::Dir) || is_opaque(&s)) {
                    remove_at(dst, &name)?;
                }
                match mkdirat(
                    dst.as_fd(),
                    name.as_os_str(),
                    Mode::from_bits_truncate((st.st_mode & 0o777) | 0o700),
                ) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let d = open_beneath(dst, Path::new(&name), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
                carry_upper_at(&s, &d, &shown, rules, done)?;
            }
            Kind::File | Kind::Link | Kind::Other => {
                copy_entry(upper, dst, &name, &st, &shown, rules, done)?
            }
        }
    }
    Ok(())
}

/// Copy the entry `name` of `src` (not a directory) to `dst` under the rules.
fn copy_entry(
    src: &OwnedFd,
    dst: &OwnedFd,
    name: &OsStr,
    st: &FileStat,
    shown: &Path,
    rules: CopyRules,
    done: &mut Copied,
) -> std::io::Result<()> {
    match kind_of(st) {
        Kind::File => {
            done.bytes += st.st_size as u64;
            if done.bytes > rules.max_bytes {
                return Err(std::io::Error::other(format!(
                    "more than {} MiB to copy (at {})",
                    rules.max_bytes >> 20,
                    shown.display()
                )));
            }
            let bytes = read_file(src, name, rules.max_bytes)?;
            if let Some(d) = stat_at(dst, name)?
                && kind_of(&d) == Kind::Dir
            {
                remove_at(dst, name)?;
            }
            replace_file(dst, name, &bytes, st.st_mode & 0o777)?;
        }
        Kind::Link if rules.links => {
            let to = nix::fcntl::readlinkat(src.as_fd(), name)?;
            let tmp = tmp_name(name);
            nix::unistd::symlinkat(to.as_os_str(), dst.as_fd(), tmp.as_os_str())?;
            if let Some(d) = stat_at(dst, name)?
                && kind_of(&d) == Kind::Dir
            {
                remove_at(dst, name)?;
            }
            nix::fcntl::renameat(dst.as_fd(), tmp.as_os_str(), dst.as_fd(), name)?;
        }
        Kind::Link | Kind::Whiteout | Kind::Other => done.skipped.push(shown.to_path_buf()),
        Kind::Dir => unreachable!("directories are walked by the caller"),
    }
    Ok(())
}

/// Whether the directory `dir` is an overlay's opaque directory (what is below it in the
/// host's directory is hidden): `user.overlay.opaque` as the native jail's overlay
/// (`userxattr`) marks it, `trusted.overlay.opaque` as a root podman's does.
pub fn is_opaque(dir: &OwnedFd) -> bool {
    [c"user.overlay.opaque", c"trusted.overlay.opaque"]
        .iter()
        .any(|name| {
            let mut buf = [0u8; 4];
            // SAFETY: `dir` is an open descriptor, `name` NUL-terminated and `buf` writable for
            // its length; fgetxattr writes at most that many bytes.
            let n = unsafe {
                libc::fgetxattr(
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            n > 0 && buf[0] == b'y'
        })
}
