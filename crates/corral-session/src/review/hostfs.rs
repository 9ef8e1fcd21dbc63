//! Opening entries by descriptor, below a directory, never through a symlink: the host's
//! project for accept and diff (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), and the upper
//! directory (each component `O_NOFOLLOW`).

use std::ffi::{CString, OsStr};
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

/// `path` (relative, "" for `dir` itself) below `dir`, with `flags`, no symlink followed on
/// any component, nothing outside `dir` reached.
pub(crate) fn open_beneath(dir: BorrowedFd, path: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(Mode::empty())
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    openat2(dir, path, how)
}

/// The directory `path` below `dir` (O_DIRECTORY, readable), none when absent.
pub(crate) fn open_dir(dir: BorrowedFd, path: &Path) -> nix::Result<Option<OwnedFd>> {
    match open_beneath(dir, path, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
        Ok(fd) => Ok(Some(fd)),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// lstat of `name` in `dir`; none when absent.
pub(crate) fn stat_at(dir: BorrowedFd, name: &OsStr) -> nix::Result<Option<FileStat>> {
    match fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn file_type(st: &FileStat) -> u32 {
    st.st_mode & libc::S_IFMT
}

/// The regular file `name` in `dir`, read whole (at most `max` bytes; more is an error), with
/// its stat; never blocks on a FIFO put in its place, never follows a link.
pub(crate) fn read_file(
    dir: BorrowedFd,
    name: &OsStr,
    max: u64,
) -> std::io::Result<(Vec<u8>, FileStat)> {
    let fd = open_beneath(
        dir,
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
    )?;
    let st = fstat(&fd)?;
    if file_type(&st) != libc::S_IFREG {
        return Err(std::io::Error::other(format!(
            "{} is no longer a regular file",
            Path::new(name).display()
        )));
    }
    let mut f = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    (&mut f).take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "{} is larger than {max} bytes",
            Path::new(name).display()
        )));
    }
    Ok((bytes, st))
}

/// The regular file `name` in `dir`, opened for reading as [`read_file`] opens it (no link
/// followed, no FIFO blocked on), with its stat.
pub(crate) fn open_file(
    dir: BorrowedFd,
    name: &OsStr,
) -> std::io::Result<(std::fs::File, FileStat)> {
    let fd = open_beneath(
        dir,
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
    )?;
    let st = fstat(&fd)?;
    if file_type(&st) != libc::S_IFREG {
        return Err(std::io::Error::other(format!(
            "{} is no longer a regular file",
            Path::new(name).display()
        )));
    }
    Ok((std::fs::File::from(fd), st))
}

/// Read `from` to its end, each chunk to `to` (when given); its SHA-256 and length.
pub(crate) fn hash_copy(
    mut from: impl Read,
    mut to: Option<&mut dyn std::io::Write>,
) -> std::io::Result<(String, u64)> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    let mut len = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        ctx.update(&buf[..n]);
        if let Some(to) = to.as_mut() {
            to.write_all(&buf[..n])?;
        }
        len += n as u64;
    }
    Ok((super::hex(ctx.finish().as_ref()), len))
}

/// The target of the symlink `name` in `dir`.
pub(crate) fn read_link(dir: BorrowedFd, name: &OsStr) -> nix::Result<std::ffi::OsString> {
    nix::fcntl::readlinkat(dir, name)
}

/// The `user.overlay.*` attribute names of `name` in `dir` (without following a link), and
/// the value of each.
pub(crate) fn overlay_xattrs(
    dir: BorrowedFd,
    name: &OsStr,
) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let path = proc_path(dir, name)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: `path` is NUL-terminated and `buf` is writable for its length.
    let n = unsafe {
        libc::llistxattr(
            path.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOTSUP) {
            return Ok(Vec::new());
        }
        return Err(e);
    }
    buf.truncate(n as usize);
    let mut out = Vec::new();
    for attr in buf.split(|b| *b == 0).filter(|a| !a.is_empty()) {
        let attr = String::from_utf8_lossy(attr).into_owned();
        if !attr.starts_with("user.overlay.") {
            continue;
        }
        let cname = CString::new(attr.clone()).map_err(std::io::Error::other)?;
        let mut value = vec![0u8; 4096];
        // SAFETY: both strings are NUL-terminated and `value` is writable for its length.
        let n = unsafe {
            libc::lgetxattr(
                path.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr() as *mut libc::c_void,
                value.len(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        value.truncate(n as usize);
        out.push((attr, value));
    }
    Ok(out)
}

/// `/proc/self/fd/DIR/NAME`: `name` in the directory of descriptor `dir`, for the calls that
/// take a path only (the `l` calls do not follow its last component).
fn proc_path(dir: BorrowedFd, name: &OsStr) -> std::io::Result<CString> {
    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    p.extend_from_slice(name.as_bytes());
    CString::new(p).map_err(std::io::Error::other)
}

pub(crate) fn ctime_ns(st: &FileStat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}
