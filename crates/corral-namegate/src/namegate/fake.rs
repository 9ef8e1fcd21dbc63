//! A table-driven [`Sys`] for the gate's tests: a small file tree held as data (each entry
//! with its device, inode, file system type and directory flags), lookups that fail with the
//! errno a row asks for, a caller whose memory and descriptors are given, and a record of
//! every call the gate performs (which also changes the tree, so a second creation sees the
//! first).
//!
//! Its directory handles are real descriptors used as tokens (duplicates of one `O_PATH`
//! descriptor): each handle's number names the path the fake opened it for. The gate's own
//! code that is not behind the seam (the protected files, empty in these tests) sees them as
//! the test machine's `/`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::{Caller, Sys};

pub(super) const EXT4: i64 = 0xef53;
pub(super) const TMPFS: i64 = 0x0102_1994;
pub(super) const VFAT: i64 = 0x4d44;
pub(super) const PROC: i64 = super::PROC_SUPER_MAGIC;

/// One entry of the tree.
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// `S_IFDIR`, `S_IFREG`, `S_IFLNK`, `S_IFSOCK`, `S_IFIFO`, ...
    pub kind: libc::mode_t,
    pub dev: u64,
    pub ino: u64,
    /// The file system's type (fstatfs).
    pub fs: i64,
    /// The directory's inode flags (`FS_IOC_GETFLAGS`).
    pub flags: Result<libc::c_long, i32>,
    /// A symlink's target.
    pub target: Vec<u8>,
}

/// The first address of the caller's memory the fake hands out; regions are a page apart
/// (with an unmapped page between), as a string read stops at a page's end.
const MEMORY_BASE: u64 = 0x10_0000;

pub(super) struct Fake {
    pub nodes: RefCell<BTreeMap<Vec<u8>, Node>>,
    /// Lookups of a path (fstatat, and each step of a resolution) that fail with an errno.
    pub lookup_fails: HashMap<Vec<u8>, i32>,
    /// fstat of a directory handle of this path fails.
    pub fstat_fails: HashMap<Vec<u8>, i32>,
    /// fstatfs of a handle of this path fails.
    pub statfs_fails: HashMap<Vec<u8>, i32>,
    /// Paths whose handles cannot be named (`/proc/self/fd/N` unreadable).
    pub unnamed: HashSet<Vec<u8>>,
    /// The caller: its tid, cwd, directory descriptors and sockets (family), its memory.
    pub tid: libc::pid_t,
    pub cwd: Vec<u8>,
    pub caller_dirs: HashMap<i32, Vec<u8>>,
    pub caller_sockets: HashMap<i32, libc::c_int>,
    /// The caller's other descriptors: what each is open on, and its status flags (`O_PATH`).
    pub caller_files: HashMap<i32, (Vec<u8>, i32)>,
    memory: Vec<(u64, Vec<u8>)>,
    /// Whether the caller's notification is still pending (false: it died after the read).
    pub waiting: Cell<bool>,
    /// Every call performed, as `op path [detail]`.
    pub done: RefCell<Vec<String>>,
    handles: RefCell<HashMap<RawFd, Vec<u8>>>,
    /// The status flags of the handles taken from the caller's `caller_files`.
    handle_flags: RefCell<HashMap<RawFd, i32>>,
    token: OwnedFd,
    next_ino: Cell<u64>,
}

impl Fake {
    pub fn new() -> Fake {
        let token = super::open_path(libc::AT_FDCWD, std::ffi::OsStr::new("/"), libc::O_DIRECTORY)
            .expect("an O_PATH descriptor of /");
        let fake = Fake {
            nodes: RefCell::default(),
            lookup_fails: HashMap::new(),
            fstat_fails: HashMap::new(),
            statfs_fails: HashMap::new(),
            unnamed: HashSet::new(),
            tid: 4242,
            cwd: b"/".to_vec(),
            caller_dirs: HashMap::new(),
            caller_sockets: HashMap::new(),
            caller_files: HashMap::new(),
            memory: Vec::new(),
            waiting: Cell::new(true),
            done: RefCell::default(),
            handles: RefCell::default(),
            handle_flags: RefCell::default(),
            token,
            next_ino: Cell::new(100),
        };
        fake.add(b"/", libc::S_IFDIR, 1, EXT4);
        fake
    }

    /// Add an entry (its inode a new one).
    pub fn add(&self, path: &[u8], kind: libc::mode_t, dev: u64, fs: i64) -> u64 {
        let ino = self.next_ino.get();
        self.next_ino.set(ino + 1);
        self.nodes.borrow_mut().insert(
            path.to_vec(),
            Node {
                kind,
                dev,
                ino,
                fs,
                flags: Ok(0),
                target: Vec::new(),
            },
        );
        ino
    }

    pub fn node(&self, path: &[u8]) -> Option<Node> {
        self.nodes.borrow().get(path).cloned()
    }

    /// `bytes` in the caller's memory: its address.
    pub fn put(&mut self, bytes: &[u8]) -> u64 {
        let at = MEMORY_BASE + 0x2000 * self.memory.len() as u64;
        assert!(bytes.len() <= 4096, "one page per region");
        self.memory.push((at, bytes.to_vec()));
        at
    }

    /// A NUL-terminated string in the caller's memory.
    pub fn put_str(&mut self, s: &[u8]) -> u64 {
        self.put(&[s, b"\0"].concat())
    }

    /// A handle of the fake's own for `path`.
    pub fn handle(&self, path: &[u8]) -> OwnedFd {
        let fd = self.token.try_clone().expect("dup");
        self.handles
            .borrow_mut()
            .insert(fd.as_raw_fd(), path.to_vec());
        // A number reused from a dropped handle: not that one's flags.
        self.handle_flags.borrow_mut().remove(&fd.as_raw_fd());
        fd
    }

    fn path_of(&self, fd: &OwnedFd) -> Result<Vec<u8>, i32> {
        self.handles
            .borrow()
            .get(&fd.as_raw_fd())
            .cloned()
            .ok_or(libc::EBADF)
    }

    fn did(&self, line: String) {
        self.done.borrow_mut().push(line);
    }

    /// Walk `rel` from `base` (an absolute path) as a lookup would: each step must be there
    /// (or its lookup fails as the table says) and a directory before the last. Links are not
    /// followed (the rows that need one follow it through the gate's own loop).
    fn walk(&self, base: &[u8], rel: &[u8], want_dir: bool) -> Result<Vec<u8>, i32> {
        let mut at: Vec<Vec<u8>> = if rel.starts_with(b"/") {
            Vec::new()
        } else {
            split(base)
        };
        let comps: Vec<&[u8]> = rel
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        for c in comps {
            if c == b".." {
                at.pop();
                continue;
            }
            let here = join_parts(&at);
            match self.node(&here) {
                Some(n) if n.kind == libc::S_IFDIR => {}
                Some(_) => return Err(libc::ENOTDIR),
                None => return Err(libc::ENOENT),
            }
            at.push(c.to_vec());
            let path = join_parts(&at);
            if let Some(&e) = self.lookup_fails.get(&path) {
                return Err(e);
            }
        }
        let path = join_parts(&at);
        match self.node(&path) {
            None => Err(libc::ENOENT),
            Some(n) if want_dir && n.kind != libc::S_IFDIR => Err(libc::ENOTDIR),
            Some(_) => Ok(path),
        }
    }

    /// A new entry at `name` in `dir`, like `dir`'s file system's others.
    fn make(&self, dir: &OwnedFd, name: &[u8], kind: libc::mode_t) -> Result<Vec<u8>, i32> {
        let parent = self.path_of(dir)?;
        let pnode = self.node(&parent).ok_or(libc::ENOENT)?;
        let path = child(&parent, trim(name));
        if self.node(&path).is_some() {
            return Err(libc::EEXIST);
        }
        let ino = self.add(&path, kind, pnode.dev, pnode.fs);
        let _ = ino;
        Ok(path)
    }

    fn stat_of(node: &Node) -> libc::stat {
        // SAFETY: stat is plain data.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_mode = node.kind | 0o755;
        st.st_dev = node.dev;
        st.st_ino = node.ino;
        st.st_uid = 1000;
        st
    }
}

fn split(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

fn join_parts(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.push(b'/');
        out.extend_from_slice(p);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

pub(super) fn child(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut parts = split(dir);
    parts.push(name.to_vec());
    join_parts(&parts)
}

/// A name without its trailing slashes.
fn trim(name: &[u8]) -> &[u8] {
    let end = name.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
    &name[..end]
}

impl Sys for Fake {
    fn fstat(&self, fd: &OwnedFd) -> Result<libc::stat, i32> {
        let path = self.path_of(fd)?;
        if let Some(&e) = self.fstat_fails.get(&path) {
            return Err(e);
        }
        self.node(&path)
            .map(|n| Fake::stat_of(&n))
            .ok_or(libc::ENOENT)
    }
    fn fstatat(&self, dir: &OwnedFd, name: &[u8], _flags: i32) -> Result<libc::stat, i32> {
        let base = self.path_of(dir)?;
        let path = self.walk(&base, name, false)?;
        Ok(Fake::stat_of(&self.node(&path).ok_or(libc::ENOENT)?))
    }
    fn fstatfs_type(&self, fd: &OwnedFd) -> Result<i64, i32> {
        let path = self.path_of(fd)?;
        if let Some(&e) = self.statfs_fails.get(&path) {
            return Err(e);
        }
        self.node(&path).map(|n| n.fs).ok_or(libc::ENOENT)
    }
    fn inode_flags(&self, dir: &OwnedFd) -> Result<libc::c_long, i32> {
        let path = self.path_of(dir)?;
        self.node(&path).ok_or(libc::ENOENT)?.flags
    }
    fn readlinkat(&self, dir: &OwnedFd, name: &[u8]) -> Result<Vec<u8>, i32> {
        let base = self.path_of(dir)?;
        let path = self.walk(&base, name, false)?;
        match self.node(&path) {
            Some(n) if n.kind == libc::S_IFLNK => Ok(n.target),
            _ => Err(libc::EINVAL),
        }
    }
    fn fd_path(&self, fd: &OwnedFd) -> Option<Vec<u8>> {
        let path = self.path_of(fd).ok()?;
        (!self.unnamed.contains(&path)).then_some(path)
    }

    fn open_path(&self, base: RawFd, path: &[u8], extra: i32) -> Result<OwnedFd, i32> {
        let want_dir = extra & libc::O_DIRECTORY != 0;
        let own = format!("/proc/{}/", self.tid).into_bytes();
        if base == libc::AT_FDCWD
            && let Some(rest) = path.strip_prefix(own.as_slice())
        {
            // The caller's magic links: its cwd and its directory descriptors.
            let target = match rest {
                b"cwd" => self.cwd.clone(),
                _ => {
                    let n: i32 = rest
                        .strip_prefix(b"fd/")
                        .and_then(|n| std::str::from_utf8(n).ok())
                        .and_then(|n| n.parse().ok())
                        .ok_or(libc::ENOENT)?;
                    self.caller_dirs.get(&n).cloned().ok_or(libc::ENOENT)?
                }
            };
            return Ok(self.handle(&target));
        }
        let from = if base == libc::AT_FDCWD {
            b"/".to_vec()
        } else {
            let handles = self.handles.borrow();
            handles.get(&base).cloned().ok_or(libc::EBADF)?
        };
        let path = self.walk(&from, path, want_dir)?;
        Ok(self.handle(&path))
    }
    fn openat2_path(&self, base: &OwnedFd, path: &[u8], extra: i32) -> Result<OwnedFd, i32> {
        let from = self.path_of(base)?;
        let path = self.walk(&from, path, extra & libc::O_DIRECTORY != 0)?;
        Ok(self.handle(&path))
    }
    fn lock_dir(&self, dir: &OwnedFd) -> Result<OwnedFd, i32> {
        let path = self.path_of(dir)?;
        self.did(format!("lock {}", String::from_utf8_lossy(&path)));
        Ok(self.handle(&path))
    }

    fn read_mem(&self, _tid: libc::pid_t, addr: u64, buf: &mut [u8]) -> Result<usize, i32> {
        for (start, bytes) in &self.memory {
            let end = start + bytes.len() as u64;
            if (*start..end).contains(&addr) {
                let from = (addr - start) as usize;
                let n = buf.len().min(bytes.len() - from);
                buf[..n].copy_from_slice(&bytes[from..from + n]);
                return Ok(n);
            }
        }
        Err(libc::EFAULT)
    }
    fn notification_valid(&self, _listener: &OwnedFd, _id: u64) -> bool {
        self.waiting.get()
    }
    fn caller_fd(&self, _tid: libc::pid_t, fd: i32) -> Result<OwnedFd, i32> {
        if let Some((path, flags)) = self.caller_files.get(&fd) {
            let got = self.handle(path);
            self.handle_flags
                .borrow_mut()
                .insert(got.as_raw_fd(), *flags);
            return Ok(got);
        }
        if !self.caller_sockets.contains_key(&fd) {
            return Err(libc::EBADF);
        }
        Ok(self.handle(format!("socket:{fd}").as_bytes()))
    }
    fn fd_flags(&self, fd: &OwnedFd) -> Result<i32, i32> {
        self.path_of(fd)?;
        // The fake's own handles are O_PATH descriptors; a caller's socket is open read-write.
        let flags = self.handle_flags.borrow().get(&fd.as_raw_fd()).copied();
        Ok(flags.unwrap_or(if self.socket_domain(fd).is_ok() {
            libc::O_RDWR
        } else {
            libc::O_PATH
        }))
    }
    fn socket_domain(&self, sock: &OwnedFd) -> Result<libc::c_int, i32> {
        let path = self.path_of(sock)?;
        let n: i32 = std::str::from_utf8(&path)
            .ok()
            .and_then(|p| p.strip_prefix("socket:"))
            .and_then(|n| n.parse().ok())
            .ok_or(libc::ENOTSOCK)?;
        self.caller_sockets.get(&n).copied().ok_or(libc::ENOTSOCK)
    }
    fn take_umask(&self, _caller: &Caller<'_, Self>) -> Result<(), i32> {
        self.did("umask".into());
        Ok(())
    }

    fn openat(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        flags: i32,
        _mode: libc::mode_t,
    ) -> Result<OwnedFd, i32> {
        let base = self.path_of(dir)?;
        let path = match self.walk(&base, name, false) {
            Ok(_) if flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT | libc::O_EXCL => {
                return Err(libc::EEXIST);
            }
            Ok(path) => path,
            Err(libc::ENOENT) if flags & libc::O_CREAT != 0 => {
                let path = self.make(dir, name, libc::S_IFREG)?;
                self.did(format!("create {}", String::from_utf8_lossy(&path)));
                path
            }
            Err(e) => return Err(e),
        };
        self.did(format!("open {}", String::from_utf8_lossy(&path)));
        Ok(self.handle(&path))
    }
    fn mkdirat(&self, dir: &OwnedFd, name: &[u8], _mode: libc::mode_t) -> Result<(), i32> {
        let path = self.make(dir, name, libc::S_IFDIR)?;
        self.did(format!("mkdir {}", String::from_utf8_lossy(&path)));
        Ok(())
    }
    fn mknodat(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        mode: libc::mode_t,
        _dev: u64,
    ) -> Result<(), i32> {
        let path = self.make(dir, name, mode & libc::S_IFMT)?;
        self.did(format!("mknod {}", String::from_utf8_lossy(&path)));
        Ok(())
    }
    fn symlinkat(&self, target: &[u8], dir: &OwnedFd, name: &[u8]) -> Result<(), i32> {
        let path = self.make(dir, name, libc::S_IFLNK)?;
        if let Some(n) = self.nodes.borrow_mut().get_mut(&path) {
            n.target = target.to_vec();
        }
        self.did(format!("symlink {}", String::from_utf8_lossy(&path)));
        Ok(())
    }
    fn link_fd(&self, source: &OwnedFd, dir: &OwnedFd, name: &[u8]) -> Result<(), i32> {
        let from = self.path_of(source)?;
        let kind = self.node(&from).ok_or(libc::ENOENT)?.kind;
        let path = self.make(dir, name, kind)?;
        self.did(format!(
            "link {} -> {}",
            String::from_utf8_lossy(&from),
            String::from_utf8_lossy(&path)
        ));
        Ok(())
    }
    fn renameat2(
        &self,
        from_dir: &OwnedFd,
        from: &[u8],
        to_dir: &OwnedFd,
        to: &[u8],
        flags: u32,
    ) -> Result<(), i32> {
        let from = child(&self.path_of(from_dir)?, trim(from));
        let to = child(&self.path_of(to_dir)?, trim(to));
        let mut nodes = self.nodes.borrow_mut();
        let moved = nodes.remove(&from).ok_or(libc::ENOENT)?;
        if flags & libc::RENAME_EXCHANGE != 0 {
            let Some(other) = nodes.remove(&to) else {
                nodes.insert(from, moved);
                return Err(libc::ENOENT);
            };
            nodes.insert(from.clone(), other);
        }
        nodes.insert(to.clone(), moved);
        drop(nodes);
        self.did(format!(
            "rename {} -> {}",
            String::from_utf8_lossy(&from),
            String::from_utf8_lossy(&to)
        ));
        Ok(())
    }
    fn bind(
        &self,
        sock: &OwnedFd,
        addr: &libc::sockaddr_storage,
        len: libc::socklen_t,
    ) -> Result<(), i32> {
        let sock = self.path_of(sock)?;
        // SAFETY: sockaddr_storage is plain data, `len` of it the gate wrote.
        let raw = unsafe {
            std::slice::from_raw_parts(
                (addr as *const libc::sockaddr_storage).cast::<u8>(),
                len as usize,
            )
        };
        let rest = &raw[std::mem::size_of::<libc::sa_family_t>().min(raw.len())..];
        let path: Vec<u8> = rest.iter().take_while(|&&b| b != 0).copied().collect();
        // A path through a checked directory: `/proc/self/fd/N/NAME`, N a handle of ours.
        let shown = match path.strip_prefix(b"/proc/self/fd/") {
            Some(tail) => {
                let (n, name) = tail.split_at(tail.iter().position(|&b| b == b'/').unwrap());
                let n: RawFd = std::str::from_utf8(n).unwrap().parse().unwrap();
                let dir = self.handles.borrow().get(&n).cloned().ok_or(libc::EBADF)?;
                let path = child(&dir, &name[1..]);
                let pnode = self.node(&dir).ok_or(libc::ENOENT)?;
                if self.node(&path).is_some() {
                    return Err(libc::EADDRINUSE);
                }
                self.add(&path, libc::S_IFSOCK, pnode.dev, pnode.fs);
                path
            }
            None => path,
        };
        self.did(format!(
            "bind {} {}",
            String::from_utf8_lossy(&sock),
            String::from_utf8_lossy(&shown)
        ));
        Ok(())
    }
    fn ftruncate(&self, fd: &OwnedFd, len: i64) -> Result<(), i32> {
        let path = self.path_of(fd)?;
        self.did(format!("truncate {} {len}", String::from_utf8_lossy(&path)));
        Ok(())
    }
    fn truncate_through(&self, fd: &OwnedFd) -> Result<(), i32> {
        self.ftruncate(fd, 0)
    }
    fn unlinkat(&self, dir: &OwnedFd, name: &[u8], flags: i32) -> Result<(), i32> {
        let path = child(&self.path_of(dir)?, trim(name));
        let node = self.node(&path).ok_or(libc::ENOENT)?;
        let is_dir = node.kind == libc::S_IFDIR;
        match (flags & libc::AT_REMOVEDIR != 0, is_dir) {
            (true, false) => return Err(libc::ENOTDIR),
            (false, true) => return Err(libc::EISDIR),
            _ => {}
        }
        let below = [path.as_slice(), b"/"].concat();
        if is_dir && self.nodes.borrow().keys().any(|k| k.starts_with(&below)) {
            return Err(libc::ENOTEMPTY);
        }
        self.nodes.borrow_mut().remove(&path);
        self.did(format!("unlink {}", String::from_utf8_lossy(&path)));
        Ok(())
    }
    fn chmod_fd(&self, fd: &OwnedFd, mode: libc::mode_t) -> Result<(), i32> {
        let path = self.path_of(fd)?;
        self.did(format!("chmod {} {mode:o}", String::from_utf8_lossy(&path)));
        Ok(())
    }
    fn fchmod(&self, fd: &OwnedFd, mode: libc::mode_t) -> Result<(), i32> {
        let path = self.path_of(fd)?;
        self.did(format!(
            "fchmod {} {mode:o}",
            String::from_utf8_lossy(&path)
        ));
        Ok(())
    }
}
