//! The few syscalls the record and undo need, on descriptors: nothing here follows a symlink
//! or leaves the directory it starts from unless its name says so.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

pub(crate) fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name.to_vec()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn fresh(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `openat(dir, name, flags | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, mode)`: one entry, its final
/// symlink never followed.
pub(crate) fn openat(
    dir: BorrowedFd,
    name: &[u8],
    flags: i32,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    let flags = flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NOCTTY;
    // SAFETY: our own path and descriptor; the result is a new descriptor.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) };
    fresh(fd as libc::c_long)
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`:
/// `path` below `dir`, no symlink anywhere on the way (ELOOP), never above `dir` (EXDEV).
pub(crate) fn open_beneath(dir: BorrowedFd, path: &[u8], flags: i32) -> io::Result<OwnedFd> {
    let c = cstr(if path.is_empty() { b"." } else { path })?;
    // SAFETY: open_how is plain data.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `how` and the path outlive the call; the result is a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    fresh(fd)
}

pub(crate) fn fstat(fd: BorrowedFd) -> io::Result<libc::stat> {
    fstatat(fd, b"", libc::AT_EMPTY_PATH)
}

/// `fstatat(dir, name, flags | AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn fstatat(dir: BorrowedFd, name: &[u8], flags: i32) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: stat is plain data, filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our own path and descriptor.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            flags | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

pub(crate) fn readlinkat(dir: BorrowedFd, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: the buffer is as long as passed.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub(crate) fn check(rc: libc::c_int) -> io::Result<()> {
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn unlinkat(dir: BorrowedFd, name: &[u8], flags: i32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: our own path and descriptor.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) })
}

pub(crate) fn mkdirat(dir: BorrowedFd, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: our own path and descriptor.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode) })
}

pub(crate) fn symlinkat(target: &[u8], dir: BorrowedFd, name: &[u8]) -> io::Result<()> {
    let (t, c) = (cstr(target)?, cstr(name)?);
    // SAFETY: our own paths and descriptor.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) })
}

pub(crate) fn mkfifoat(dir: BorrowedFd, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: our own path and descriptor.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), c.as_ptr(), libc::S_IFIFO | mode, 0) })
}

pub(crate) fn fchmod(fd: BorrowedFd, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: our own descriptor.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })
}

/// Copy all of `from` into `to` (both at offset 0): a reflink (FICLONE) where the file system
/// shares blocks between them, else `copy_file_range` (the kernel copies, or shares blocks
/// where it can), else read and write. Returns the bytes copied.
pub(crate) fn copy_all(from: BorrowedFd, to: BorrowedFd) -> io::Result<u64> {
    let size = fstat(from)?.st_size as u64;
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: FICLONE takes the source descriptor by value.
    if unsafe { libc::ioctl(to.as_raw_fd(), FICLONE as _, from.as_raw_fd()) } == 0 {
        return Ok(size);
    }
    let mut done: u64 = 0;
    loop {
        // SAFETY: both descriptors ours; NULL offsets use and advance each file's own.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                to.as_raw_fd(),
                std::ptr::null_mut(),
                1 << 30,
                0,
            )
        };
        match n {
            0 => return Ok(done),
            n if n > 0 => done += n as u64,
            _ => {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                        if done == 0 =>
                    {
                        return read_write(from, to);
                    }
                    Some(libc::EINTR) => continue,
                    _ => return Err(e),
                }
            }
        }
    }
}

fn read_write(from: BorrowedFd, to: BorrowedFd) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 16];
    let mut done = 0u64;
    loop {
        // SAFETY: the buffer is as long as passed.
        let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(done);
        }
        let mut off = 0usize;
        while off < n as usize {
            // SAFETY: writes bytes of `buf` that were read.
            let w = unsafe {
                libc::write(
                    to.as_raw_fd(),
                    buf[off..n as usize].as_ptr().cast(),
                    n as usize - off,
                )
            };
            if w < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e);
            }
            off += w as usize;
        }
        done += n as u64;
    }
}

/// The SHA-256 of what `fd` reads from its current offset, hex.
pub(crate) fn sha256(fd: BorrowedFd) -> io::Result<String> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: the buffer is as long as passed.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n as usize]);
    }
    Ok(ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The names in the directory `dir` (without `.` and `..`).
pub(crate) fn list(dir: BorrowedFd) -> io::Result<Vec<Vec<u8>>> {
    let own = openat(dir, b".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let raw = std::os::fd::IntoRawFd::into_raw_fd(own);
    // SAFETY: fdopendir takes ownership of `raw` (closed by closedir).
    let d = unsafe { libc::fdopendir(raw) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, `raw` is still ours.
        unsafe { libc::close(raw) };
        return Err(e);
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: errno is thread-local; cleared to tell the end from an error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is an open DIR*.
        let ent = unsafe { libc::readdir(d) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: `d` is an open DIR*, closed once.
            unsafe { libc::closedir(d) };
            if e.raw_os_error().unwrap_or(0) != 0 {
                return Err(e);
            }
            break;
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    Ok(names)
}
