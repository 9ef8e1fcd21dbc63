//! The gate's seam to the kernel: the system calls its rules read (a name beside a directory,
//! a file's type and device, the file system's type and a directory's flags, the way up to
//! the root, a descriptor's path), the ones it resolves a caller's path and reads a caller
//! with, and the ones it performs for the caller. [`Real`] makes them; the tests' fake
//! (namegate.rs, `mod fake`) answers them from a table and records what would be done, so every
//! rule is checked without a jail, and the jail tests (crates/corral/tests/jail_*.rs) attack
//! the real thing.
//!
//! The gate is generic over it ([`Gate<S>`](super::Gate), `Real` by default): no dynamic
//! dispatch and no allocation on the path of a call beyond what the calls themselves made.
//! Errors are errnos, as the kernel gives them: the rules decide what each one means (only
//! ENOENT is absence).

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use super::{Caller, errno};

/// What the gate asks of the kernel. Descriptors are the gate's own (`OwnedFd`); a name is one
/// path component as the caller wrote it (trailing slashes included where the kernel reads
/// them), a path is bytes without NUL.
pub trait Sys: Sized {
    // ---- what the rules read ----

    /// fstat(2) of `fd` (`fstatat(fd, "", AT_EMPTY_PATH)`).
    fn fstat(&self, fd: &OwnedFd) -> Result<libc::stat, i32>;
    /// fstatat(2) of `name` in `dir` with `flags` (`AT_SYMLINK_NOFOLLOW`: the entry itself).
    fn fstatat(&self, dir: &OwnedFd, name: &[u8], flags: i32) -> Result<libc::stat, i32>;
    /// The type of the file system `fd` is on (fstatfs(2)'s `f_type`).
    fn fstatfs_type(&self, fd: &OwnedFd) -> Result<i64, i32>;
    /// The inode flags of the directory `dir` (`FS_IOC_GETFLAGS`; the casefold flag).
    fn inode_flags(&self, dir: &OwnedFd) -> Result<libc::c_long, i32>;
    /// readlinkat(2) of `name` in `dir`.
    fn readlinkat(&self, dir: &OwnedFd, name: &[u8]) -> Result<Vec<u8>, i32>;
    /// The path of what `fd` is open on, as the kernel names it now (`/proc/self/fd/N`);
    /// `None` when it cannot be read.
    fn fd_path(&self, fd: &OwnedFd) -> Option<Vec<u8>>;

    // ---- resolving a caller's path ----

    /// `openat(base, path, O_PATH | extra)`, links followed, /proc's magic links too (only for
    /// paths the gate built itself: `/`, `..`, `/proc/TID/...`).
    fn open_path(&self, base: RawFd, path: &[u8], extra: i32) -> Result<OwnedFd, i32>;
    /// `openat2(base, path, O_PATH | extra, RESOLVE_NO_MAGICLINKS)`: a caller's path, resolved
    /// as the kernel would for the caller except that no /proc magic link is followed.
    fn openat2_path(&self, base: &OwnedFd, path: &[u8], extra: i32) -> Result<OwnedFd, i32>;
    /// An exclusive flock of the directory `dir` (a descriptor of its own, the lock held until
    /// it is dropped); EAGAIN when another holds it too long.
    fn lock_dir(&self, dir: &OwnedFd) -> Result<OwnedFd, i32>;

    // ---- the caller ----

    /// process_vm_readv(2) of `buf.len()` bytes at `addr` in task `tid`: the bytes read.
    fn read_mem(&self, tid: libc::pid_t, addr: u64, buf: &mut [u8]) -> Result<usize, i32>;
    /// Is the notification `id` of `listener` still pending (`SECCOMP_IOCTL_NOTIF_ID_VALID`)?
    fn notification_valid(&self, listener: &OwnedFd, id: u64) -> bool;
    /// The caller's descriptor `fd`, duplicated into this process (pidfd_getfd(2)).
    fn caller_fd(&self, tid: libc::pid_t, fd: i32) -> Result<OwnedFd, i32>;
    /// The file status flags of `fd` (`F_GETFL`: its access mode, `O_PATH`, ...).
    fn fd_flags(&self, fd: &OwnedFd) -> Result<i32, i32>;
    /// The family of the socket `sock` (`SO_DOMAIN`).
    fn socket_domain(&self, sock: &OwnedFd) -> Result<libc::c_int, i32>;
    /// Take the caller's umask on this thread for the creation about to be performed.
    fn take_umask(&self, caller: &Caller<'_, Self>) -> Result<(), i32>;

    // ---- what the gate performs for the caller ----

    /// `openat(dir, name, flags | O_NOCTTY | O_CLOEXEC, mode)`.
    fn openat(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        flags: i32,
        mode: libc::mode_t,
    ) -> Result<OwnedFd, i32>;
    fn mkdirat(&self, dir: &OwnedFd, name: &[u8], mode: libc::mode_t) -> Result<(), i32>;
    fn mknodat(&self, dir: &OwnedFd, name: &[u8], mode: libc::mode_t, dev: u64) -> Result<(), i32>;
    fn symlinkat(&self, target: &[u8], dir: &OwnedFd, name: &[u8]) -> Result<(), i32>;
    /// A new name `name` in `dir` for the file `source` is open on (linkat(2) of
    /// `/proc/self/fd/N` with `AT_SYMLINK_FOLLOW`: no path of the caller's is followed).
    fn link_fd(&self, source: &OwnedFd, dir: &OwnedFd, name: &[u8]) -> Result<(), i32>;
    fn renameat2(
        &self,
        from_dir: &OwnedFd,
        from: &[u8],
        to_dir: &OwnedFd,
        to: &[u8],
        flags: u32,
    ) -> Result<(), i32>;
    /// bind(2) of `sock` to the first `len` bytes of `addr`.
    fn bind(
        &self,
        sock: &OwnedFd,
        addr: &libc::sockaddr_storage,
        len: libc::socklen_t,
    ) -> Result<(), i32>;
    fn ftruncate(&self, fd: &OwnedFd, len: i64) -> Result<(), i32>;
    /// truncate(2) to 0 of the file `fd` is open on, by its `/proc/self/fd/N` path (an
    /// `O_RDONLY | O_TRUNC` open: the permission is checked on the file, as the open would).
    fn truncate_through(&self, fd: &OwnedFd) -> Result<(), i32>;
    /// unlinkat(2) of `name` in `dir` (`AT_REMOVEDIR`: a directory). Only while the run keeps
    /// a change record is a removal stopped and performed here.
    fn unlinkat(&self, dir: &OwnedFd, name: &[u8], flags: i32) -> Result<(), i32>;
    /// chmod(2) of the file `fd` (an `O_PATH` descriptor) is open on, by its `/proc/self/fd/N`
    /// path (that inode and no other). Only while the run keeps a change record.
    fn chmod_fd(&self, fd: &OwnedFd, mode: libc::mode_t) -> Result<(), i32>;
    /// fchmod(2) of `fd`, the gate's duplicate of a caller's descriptor (the same open file).
    /// Only while the run keeps a change record.
    fn fchmod(&self, fd: &OwnedFd, mode: libc::mode_t) -> Result<(), i32>;
}

/// The kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct Real;

fn c(bytes: &[u8]) -> Result<CString, i32> {
    CString::new(bytes).map_err(|_| libc::EINVAL)
}

fn rc(rc: libc::c_long) -> Result<(), i32> {
    if rc != 0 {
        return Err(errno());
    }
    Ok(())
}

impl Sys for Real {
    fn fstat(&self, fd: &OwnedFd) -> Result<libc::stat, i32> {
        super::fstat(fd)
    }
    fn fstatat(&self, dir: &OwnedFd, name: &[u8], flags: i32) -> Result<libc::stat, i32> {
        super::fstatat(dir, OsStr::from_bytes(name), flags)
    }
    fn fstatfs_type(&self, fd: &OwnedFd) -> Result<i64, i32> {
        super::fstatfs_type(fd)
    }
    fn inode_flags(&self, dir: &OwnedFd) -> Result<libc::c_long, i32> {
        // FS_IOC_GETFLAGS needs a descriptor that is not O_PATH.
        let d = super::openat_entry_raw(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY)?;
        let mut flags: libc::c_long = 0;
        // SAFETY: FS_IOC_GETFLAGS writes one long.
        let r = unsafe { libc::ioctl(d.as_raw_fd(), super::FS_IOC_GETFLAGS as _, &mut flags) };
        if r != 0 {
            return Err(errno());
        }
        Ok(flags)
    }
    fn readlinkat(&self, dir: &OwnedFd, name: &[u8]) -> Result<Vec<u8>, i32> {
        super::readlinkat(dir, name)
    }
    fn fd_path(&self, fd: &OwnedFd) -> Option<Vec<u8>> {
        use std::os::unix::ffi::OsStringExt;
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .ok()
            .map(|p| p.into_os_string().into_vec())
    }

    fn open_path(&self, base: RawFd, path: &[u8], extra: i32) -> Result<OwnedFd, i32> {
        super::open_path(base, OsStr::from_bytes(path), extra)
    }
    fn openat2_path(&self, base: &OwnedFd, path: &[u8], extra: i32) -> Result<OwnedFd, i32> {
        super::openat2_path(base, path, extra)
    }
    fn lock_dir(&self, dir: &OwnedFd) -> Result<OwnedFd, i32> {
        super::lock_dir(dir)
    }

    fn read_mem(&self, tid: libc::pid_t, addr: u64, buf: &mut [u8]) -> Result<usize, i32> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: the local iovec points at `buf`, exactly as long; the remote one is only read
        // by the kernel, in the caller's address space.
        let n = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
        match n {
            n if n < 0 => Err(errno()),
            n => Ok(n as usize),
        }
    }
    fn notification_valid(&self, listener: &OwnedFd, id: u64) -> bool {
        // SAFETY: ID_VALID reads the u64 id.
        let r = unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ID_VALID as _,
                &id,
            )
        };
        r == 0
    }
    fn caller_fd(&self, tid: libc::pid_t, fd: i32) -> Result<OwnedFd, i32> {
        let pidfd = super::pidfd_open(tid).ok_or(libc::ESRCH)?;
        // SAFETY: pidfd_getfd returns a new descriptor (a duplicate of the caller's) or -1.
        let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        if got < 0 {
            return Err(match errno() {
                libc::EBADF => libc::EBADF,
                _ => libc::EPERM,
            });
        }
        // SAFETY: fresh descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(got as i32) })
    }
    fn fd_flags(&self, fd: &OwnedFd) -> Result<i32, i32> {
        // SAFETY: F_GETFL on our own descriptor takes no argument.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(errno());
        }
        Ok(flags)
    }
    fn socket_domain(&self, sock: &OwnedFd) -> Result<libc::c_int, i32> {
        let mut domain: libc::c_int = 0;
        let mut dlen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: SO_DOMAIN writes one int.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_DOMAIN,
                (&mut domain as *mut libc::c_int).cast(),
                &mut dlen,
            )
        };
        if r != 0 {
            // Not a socket (or an O_PATH descriptor): the kernel's answers.
            return Err(match errno() {
                libc::EBADF => libc::EBADF,
                _ => libc::ENOTSOCK,
            });
        }
        Ok(domain)
    }
    fn take_umask(&self, caller: &Caller<'_, Self>) -> Result<(), i32> {
        thread_local! {
            /// The umask this thread set last (nothing else sets this thread's).
            static SET: std::cell::Cell<Option<libc::mode_t>> = const { std::cell::Cell::new(None) };
        }
        let mask = caller.gate.umasks.of(caller)?;
        if SET.get() != Some(mask) {
            // SAFETY: umask of this thread (its fs attributes are its own: CLONE_FS unshared).
            unsafe { libc::umask(mask) };
            SET.set(Some(mask));
        }
        Ok(())
    }

    fn openat(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        flags: i32,
        mode: libc::mode_t,
    ) -> Result<OwnedFd, i32> {
        let flags = flags | libc::O_NOCTTY | libc::O_CLOEXEC;
        let name = c(name)?;
        // SAFETY: a path we own, on a directory descriptor we own; the result is a new
        // descriptor.
        let fd =
            unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: fresh descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
    fn mkdirat(&self, dir: &OwnedFd, name: &[u8], mode: libc::mode_t) -> Result<(), i32> {
        let name = c(name)?;
        // SAFETY: our own path and descriptor.
        rc(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }.into())
    }
    fn mknodat(&self, dir: &OwnedFd, name: &[u8], mode: libc::mode_t, dev: u64) -> Result<(), i32> {
        let name = c(name)?;
        // SAFETY: as mkdirat.
        rc(
            unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev as libc::dev_t) }
                .into(),
        )
    }
    fn symlinkat(&self, target: &[u8], dir: &OwnedFd, name: &[u8]) -> Result<(), i32> {
        let (target, name) = (c(target)?, c(name)?);
        // SAFETY: as mkdirat.
        rc(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }.into())
    }
    fn link_fd(&self, source: &OwnedFd, dir: &OwnedFd, name: &[u8]) -> Result<(), i32> {
        let via = c(format!("/proc/self/fd/{}", source.as_raw_fd()).as_bytes())?;
        let name = c(name)?;
        // SAFETY: our own paths and descriptors.
        rc(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                via.as_ptr(),
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        }
        .into())
    }
    fn renameat2(
        &self,
        from_dir: &OwnedFd,
        from: &[u8],
        to_dir: &OwnedFd,
        to: &[u8],
        flags: u32,
    ) -> Result<(), i32> {
        let (from, to) = (c(from)?, c(to)?);
        // SAFETY: our own paths and descriptors.
        rc(unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                from_dir.as_raw_fd(),
                from.as_ptr(),
                to_dir.as_raw_fd(),
                to.as_ptr(),
                flags,
            )
        })
    }
    fn bind(
        &self,
        sock: &OwnedFd,
        addr: &libc::sockaddr_storage,
        len: libc::socklen_t,
    ) -> Result<(), i32> {
        // SAFETY: `addr` holds at least `len` bytes of socket address; `sock` is our own.
        rc(unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (addr as *const libc::sockaddr_storage).cast(),
                len,
            )
        }
        .into())
    }
    fn ftruncate(&self, fd: &OwnedFd, len: i64) -> Result<(), i32> {
        // SAFETY: our own descriptor.
        rc(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }.into())
    }
    fn truncate_through(&self, fd: &OwnedFd) -> Result<(), i32> {
        // SAFETY: a path naming our own descriptor.
        rc(unsafe { libc::truncate(super::protected::truncate_path(fd).as_ptr(), 0) }.into())
    }
    fn unlinkat(&self, dir: &OwnedFd, name: &[u8], flags: i32) -> Result<(), i32> {
        let name = c(name)?;
        // SAFETY: our own path and descriptor.
        rc(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }.into())
    }
    fn chmod_fd(&self, fd: &OwnedFd, mode: libc::mode_t) -> Result<(), i32> {
        let via = c(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes())?;
        // SAFETY: our own path (the descriptor's magic link, which names exactly that inode).
        rc(unsafe { libc::chmod(via.as_ptr(), mode) }.into())
    }
    fn fchmod(&self, fd: &OwnedFd, mode: libc::mode_t) -> Result<(), i32> {
        // SAFETY: our own descriptor.
        rc(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }.into())
    }
}
