//! What a name in the project is: before a change (kept to put back) and after the run (to
//! tell whether the host changed it since).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use serde::{Deserialize, Serialize};

use crate::bytes::Bytes;
use crate::sys;

/// One name's state. `mode` is the permission bits (with set-id and sticky bits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum State {
    /// Nothing of that name.
    Absent,
    /// A regular file: before a change its content is the blob `blob` of the run (none when
    /// the run's record went over its budget: the run cannot be undone); after the run its
    /// SHA-256.
    File {
        mode: u32,
        size: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        blob: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        /// What `fstat` said of it, where no content is there to compare: a file the record
        /// kept no blob of (over its budget), and every file after the run. The change
        /// summary then compares these.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stat: Option<Stat>,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: Bytes,
    },
    Fifo {
        mode: u32,
    },
    /// A socket or a device node: recorded, not put back (undo refuses it).
    Other {
        mode: u32,
    },
}

impl State {
    /// `Absent`, `File`, ...: for messages and counts.
    pub fn kind(&self) -> &'static str {
        match self {
            State::Absent => "absent",
            State::File { .. } => "file",
            State::Dir { .. } => "directory",
            State::Symlink { .. } => "symlink",
            State::Fifo { .. } => "fifo",
            State::Other { .. } => "special file",
        }
    }

    pub fn is_absent(&self) -> bool {
        matches!(self, State::Absent)
    }

    pub fn is_dir(&self) -> bool {
        matches!(self, State::Dir { .. })
    }

    /// Is what is there now (`self`, inspected with a hash) what the run left (`after`)?
    pub(crate) fn same_as_after(&self, after: &State) -> bool {
        match (self, after) {
            (
                State::File {
                    mode: m1,
                    size: s1,
                    sha256: h1,
                    ..
                },
                State::File {
                    mode: m2,
                    size: s2,
                    sha256: h2,
                    ..
                },
            ) => m1 == m2 && s1 == s2 && h1.is_some() && h1 == h2,
            (a, b) => a == b,
        }
    }
}

/// A file's identity and times, for a comparison by metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stat {
    /// The same inode with the same times (the device is left out: the jail sees the
    /// project through its own mount of the same file system).
    pub fn same_file_times(&self, other: &Stat) -> bool {
        (self.ino, self.mtime_ns, self.ctime_ns) == (other.ino, other.mtime_ns, other.ctime_ns)
    }

    pub(crate) fn of(st: &libc::stat) -> Stat {
        Stat {
            dev: st.st_dev,
            ino: st.st_ino,
            mtime_ns: st.st_mtime.saturating_mul(1_000_000_000) + st.st_mtime_nsec,
            ctime_ns: st.st_ctime.saturating_mul(1_000_000_000) + st.st_ctime_nsec,
        }
    }
}

/// The permission bits of `st`.
pub(crate) fn perm(st: &libc::stat) -> u32 {
    st.st_mode & 0o7777
}

/// The state of `name` in `dir` with no content kept: a file's content is what the caller
/// does with `file` (the descriptor opened for it, checked to be the inode stat'ed).
pub(crate) fn inspect(
    dir: BorrowedFd,
    name: &[u8],
    mut file: impl FnMut(BorrowedFd, &libc::stat) -> io::Result<State>,
) -> io::Result<State> {
    let st = if name.is_empty() {
        sys::fstat(dir)
    } else {
        sys::fstatat(dir, name, 0)
    };
    let st = match st {
        Ok(st) => st,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(State::Absent),
        Err(e) => return Err(e),
    };
    Ok(match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => State::Dir { mode: perm(&st) },
        libc::S_IFLNK => State::Symlink {
            target: Bytes(sys::readlinkat(dir, name)?),
        },
        libc::S_IFIFO => State::Fifo { mode: perm(&st) },
        libc::S_IFREG => {
            let fd = sys::openat(dir, name, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
            let now = sys::fstat(fd.as_fd())?;
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
                // Replaced between the stat and the open: the caller tries again.
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            file(fd.as_fd(), &now)?
        }
        _ => State::Other { mode: perm(&st) },
    })
}

/// The state of `name` in `dir` as the run left it (or as it is now): a file with its hash.
pub(crate) fn inspect_hashed(dir: BorrowedFd, name: &[u8]) -> io::Result<State> {
    inspect(dir, name, |fd, st| {
        Ok(State::File {
            mode: perm(st),
            size: st.st_size as u64,
            blob: None,
            sha256: Some(sys::sha256(fd)?),
            stat: Some(Stat::of(st)),
        })
    })
}

/// The state of the project path `rel` now: a name whose directory cannot be reached without
/// a symlink, or is not there, is absent (undo puts the directories back first).
pub(crate) fn at_path(project: BorrowedFd, rel: &[u8]) -> io::Result<State> {
    if rel.is_empty() {
        return inspect_hashed(project, b"");
    }
    let (dir, name) = crate::path::split(rel);
    let parent = match sys::open_beneath(project, dir, libc::O_PATH | libc::O_DIRECTORY) {
        Ok(p) => p,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
            ) =>
        {
            return Ok(State::Absent);
        }
        Err(e) => return Err(e),
    };
    inspect_hashed(parent.as_fd(), name)
}
