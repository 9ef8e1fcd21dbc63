//! The change record's hooks in the gate: before the gate performs a call that changes a name
//! in the project (a creation, an open for writing, a truncate, a rename, a link, a removal,
//! a chmod), the run's record keeps what the name is now (corral-changes; docs/undo.md).
//!
//! The record's directory is a descriptor PID 1 alone holds (corral opened it on the host and
//! passed it to the set-up process; it is close-on-exec, never passed on, and PID 1 is not
//! dumpable): no path in the jail's mount tree leads to it. Only names in the project are
//! recorded, not the jail's own file systems. A name whose record fails is not changed: the
//! caller gets the error.
//!
//! The record reads the project through the kernel itself (it copies what it keeps into the
//! store), not through the gate's seam: only a gate making real calls keeps one
//! ([`Gate::with_record`](super::Gate::with_record) is `Gate<Real>`'s). What the gate performs
//! for the caller once the record is kept (the removal, the mode change, the creation) goes
//! through the seam like its other calls.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use corral_changes::{Place, RunRecord};

use super::sys::{Real, Sys};
use super::{Entry, fstat, openat2};

/// The path of what `fd` is open on, as the kernel names it now.
fn dir_path(fd: &OwnedFd) -> Option<Vec<u8>> {
    Real.fd_path(fd)
}

/// The run's record, and where the project is in the jail.
pub struct Recorder {
    record: RunRecord,
    /// The project's root as PID 1 names it (mounted at itself).
    root_path: Vec<u8>,
    root: OwnedFd,
    private_devs: HashSet<u64>,
}

impl Recorder {
    /// The recorder for `record` of the project at `project_root` (as the jail sees it).
    pub fn new(record: RunRecord, project_root: &std::path::Path) -> io::Result<Recorder> {
        let root = std::fs::File::open(project_root).map(OwnedFd::from)?;
        Ok(Recorder {
            record,
            root_path: project_root.as_os_str().as_bytes().to_vec(),
            root,
            private_devs: HashSet::new(),
        })
    }

    pub(super) fn set_private_devs(&mut self, devs: &HashSet<u64>) {
        self.private_devs = devs.clone();
    }

    /// The path of the directory `dir` relative to the project, when it is in it: its name
    /// as the kernel gives it now, checked by opening that name beneath the project (no
    /// symlink followed) and finding the same directory. `Ok(None)`: not in the project.
    fn rel_dir(&self, dir: &OwnedFd) -> Result<Option<Vec<u8>>, i32> {
        let st = fstat(dir)?;
        if self.private_devs.contains(&st.st_dev) {
            return Ok(None);
        }
        if st.st_nlink == 0 {
            // Removed: no name in it is the host's.
            return Ok(None);
        }
        let path = dir_path(dir).ok_or(libc::EIO)?;
        let rel = if path == self.root_path {
            Vec::new()
        } else {
            match path.strip_prefix(self.root_path.as_slice()) {
                Some(rest) if rest.first() == Some(&b'/') => rest[1..].to_vec(),
                _ => return Ok(None),
            }
        };
        let again = openat2(
            &self.root,
            if rel.is_empty() { b"." } else { &rel },
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
        )?;
        let st2 = fstat(&again)?;
        if (st.st_dev, st.st_ino) != (st2.st_dev, st2.st_ino) {
            // Renamed meanwhile: the caller tries again.
            return Err(libc::EAGAIN);
        }
        Ok(Some(rel))
    }
}

fn errno(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Before `entry` (a name in its directory) changes.
pub(super) fn before(rec: Option<&Recorder>, entry: &Entry) -> Result<(), i32> {
    let Some(rec) = rec else { return Ok(()) };
    if entry.private {
        // On the jail's own file systems (what `rel_dir` says of its device): not the project.
        return Ok(());
    }
    let Some(rel_dir) = rec.rel_dir(&entry.parent)? else {
        return Ok(());
    };
    rec.record
        .before_change(Place {
            dir: entry.parent.as_fd(),
            rel_dir: &rel_dir,
            name: entry.name(),
        })
        .map_err(errno)
}

/// Before the file or directory `fd` (an O_PATH descriptor, or the gate's duplicate of a
/// caller's descriptor) changes in place (a chmod of `.`, an fchmod): recorded by its name in
/// its directory.
pub(super) fn before_fd(rec: Option<&Recorder>, fd: &OwnedFd) -> Result<(), i32> {
    let Some(rec) = rec else { return Ok(()) };
    let st = fstat(fd)?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFDIR {
        // A pipe, a terminal, a socket (`> /dev/stdout`), a file with no name any more (a
        // memfd, an unlinked file), or one on the jail's own file systems: nothing of the
        // project's to keep.
        if kind != libc::S_IFREG || st.st_nlink == 0 || rec.private_devs.contains(&st.st_dev) {
            return Ok(());
        }
        // A file is recorded from its directory, which its path names.
        let path = dir_path(fd).ok_or(libc::EIO)?;
        if !path.starts_with(&rec.root_path) || path.get(rec.root_path.len()) != Some(&b'/') {
            return Ok(());
        }
        let Some(cut) = path.iter().rposition(|&b| b == b'/') else {
            return Err(libc::EIO);
        };
        let parent = super::open_path(
            libc::AT_FDCWD,
            std::ffi::OsStr::from_bytes(if cut == 0 { b"/" } else { &path[..cut] }),
            libc::O_DIRECTORY,
        )?;
        let entry = Entry {
            parent,
            last: path[cut + 1..].to_vec(),
            private: false,
        };
        let now = super::fstatat(
            &entry.parent,
            std::ffi::OsStr::from_bytes(entry.name()),
            libc::AT_SYMLINK_NOFOLLOW,
        )?;
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
            return Err(libc::EAGAIN);
        }
        return before(Some(rec), &entry);
    }
    let Some(rel) = rec.rel_dir(fd)? else {
        return Ok(());
    };
    let (rel_dir, name) = corral_changes::path::split(&rel);
    let dir = match rel.is_empty() {
        true => None,
        false => Some(openat2(
            &rec.root,
            if rel_dir.is_empty() { b"." } else { rel_dir },
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
        )?),
    };
    let place = match &dir {
        Some(d) => Place {
            dir: d.as_fd(),
            rel_dir,
            name,
        },
        // The project's root itself.
        None => Place {
            dir: fd.as_fd(),
            rel_dir: b"",
            name: b"",
        },
    };
    rec.record.before_change(place).map_err(errno)
}

/// Before a rename of `from` to `to` (or their exchange).
pub(super) fn before_rename(
    rec: Option<&Recorder>,
    from: &Entry,
    to: &Entry,
    exchange: bool,
) -> Result<(), i32> {
    let Some(rec) = rec else { return Ok(()) };
    let (f, t) = (rec.rel_dir(&from.parent)?, rec.rel_dir(&to.parent)?);
    match (f, t) {
        (Some(f), Some(t)) => rec
            .record
            .before_rename(
                Place {
                    dir: from.parent.as_fd(),
                    rel_dir: &f,
                    name: from.name(),
                },
                Place {
                    dir: to.parent.as_fd(),
                    rel_dir: &t,
                    name: to.name(),
                },
                exchange,
            )
            .map_err(errno),
        // One side outside the project: the kernel refuses it (EXDEV), or the project's side
        // changes alone.
        (Some(_), None) => before(Some(rec), from),
        (None, Some(_)) => before(Some(rec), to),
        (None, None) => Ok(()),
    }
}
