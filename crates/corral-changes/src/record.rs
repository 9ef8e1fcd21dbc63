//! The record of one run as it happens: before the jail changes a name in the project, what
//! the name is now is kept once (the first time the run touches that path).
//!
//! In the jail it lives in PID 1's name gate, on a descriptor of the run's directory in the
//! store that PID 1 alone holds; on the host, `corral undo` records itself the same way.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::bytes::Bytes;
use crate::path;
use crate::state::{self, State};
use crate::store::{self, RunMeta};
use crate::sys;

/// One line of a run's manifest: a path and what it was before the run first changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Line {
    pub path: Bytes,
    pub before: State,
}

/// A name about to change: the directory holding it (a descriptor), that directory's path
/// relative to the project (empty: the root) and the name (empty: the directory itself).
#[derive(Clone, Copy)]
pub struct Place<'a> {
    pub dir: BorrowedFd<'a>,
    pub rel_dir: &'a [u8],
    pub name: &'a [u8],
}

impl Place<'_> {
    fn rel(&self) -> Vec<u8> {
        path::join(self.rel_dir, self.name)
    }
}

/// The record of one run, being written.
pub struct RunRecord {
    id: String,
    dir: OwnedFd,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The run's directory (a descriptor of its own), for the `incomplete` mark.
    dir: OwnedFd,
    seen: HashSet<Vec<u8>>,
    manifest: File,
    next_blob: u64,
    bytes: u64,
    budget: u64,
    over_budget: bool,
}

impl RunRecord {
    /// The record whose run directory is `dir` (as [`crate::Store::begin`] made it; in the
    /// jail, the descriptor corral passed). Paths already in its manifest stay as recorded.
    pub fn from_dir_fd(dir: OwnedFd) -> io::Result<RunRecord> {
        let meta: RunMeta = store::read_json_at(dir.as_fd(), store::META)?;
        let lines = store::read_manifest_growing(dir.as_fd())?;
        let manifest = File::from(sys::openat(
            dir.as_fd(),
            store::MANIFEST.as_bytes(),
            libc::O_WRONLY | libc::O_APPEND,
            0,
        )?);
        let next_blob = lines.len() as u64;
        let bytes = store::dir_bytes(dir.as_fd())?;
        // Only "not there" means complete.
        let over_budget = match sys::fstatat(dir.as_fd(), store::INCOMPLETE.as_bytes(), 0) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
            Err(e) => return Err(e),
        };
        let own = dir.try_clone()?;
        Ok(RunRecord {
            id: meta.id,
            dir,
            inner: Mutex::new(Inner {
                dir: own,
                seen: lines.into_iter().map(|l| l.path.0).collect(),
                manifest,
                next_blob,
                bytes,
                budget: meta.budget,
                over_budget,
            }),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The run's directory in the store, to hand to the jail's PID 1.
    pub fn dir_fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Keep what `place` is now, unless the run already touched that path: a file's content
    /// (a reflink or a copy in the store), a directory's mode, a symlink's target, or that it
    /// is absent. Call it before the change; an error means nothing was kept, and the change
    /// should not be made. `.` and `..` name no entry of their own: nothing to keep.
    pub fn before_change(&self, place: Place) -> io::Result<()> {
        if place.name == b"." || place.name == b".." {
            return Ok(());
        }
        let rel = place.rel();
        if !path::valid(&rel) || place.name.contains(&b'/') {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut inner = self.lock();
        if inner.seen.contains(&rel) {
            // Kept already (the first state is the one before the run).
            return Ok(());
        }
        // Over its budget (marked incomplete: undo refuses it) the record keeps no more
        // content, but still notes each name and what it was, a file by its metadata: the
        // change summary is made from these names.
        let before = self.keep(&mut inner, place)?;
        inner.append(&rel, before)
    }

    /// [`Self::before_change`] of the project path `rel` (below the project's root `project`),
    /// for a writer on the host (`corral undo`, an accept of a review): its directory is
    /// opened beneath the project with no symlink on the way (a symlink there is an error); a
    /// directory that is not there means the path is absent (record each directory made
    /// before it, too).
    pub fn before_path(&self, project: BorrowedFd, rel: &[u8]) -> io::Result<()> {
        if !path::valid(rel) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let (dir, name) = path::split(rel);
        // Not O_PATH: with O_NOFOLLOW that would open a final symlink itself; so it is ELOOP.
        match sys::open_beneath(project, dir, libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(fd) => self.before_change(Place {
                dir: fd.as_fd(),
                rel_dir: dir,
                name,
            }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                no_link_on_the_way(project, dir)?;
                self.lock().append_absent(rel)
            }
            Err(e) => Err(e),
        }
    }

    /// Before a rename of `from` to `to` (or their exchange): both names, and when either is a
    /// directory everything below it, and the names below the other one that the move fills
    /// (absent until then), so that undo can put each file back.
    pub fn before_rename(&self, from: Place, to: Place, exchange: bool) -> io::Result<()> {
        let to_below = self.before_tree(to)?;
        let from_below = self.before_tree(from)?;
        let mut inner = self.lock();
        for sub in &from_below {
            inner.append_absent(&path::join(&to.rel(), sub))?;
        }
        if exchange {
            for sub in &to_below {
                inner.append_absent(&path::join(&from.rel(), sub))?;
            }
        }
        Ok(())
    }

    /// [`Self::before_change`] of `place` and of everything below it when it is a directory;
    /// returns the paths below it (relative to it).
    fn before_tree(&self, place: Place) -> io::Result<Vec<Vec<u8>>> {
        self.before_change(place)?;
        let mut below = Vec::new();
        if matches!(place.name, b"" | b"." | b"..") {
            // No entry of its own (the kernel refuses to move it).
            return Ok(below);
        }
        let top = match sys::openat(place.dir, place.name, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                ) =>
            {
                return Ok(below);
            }
            Err(e) => return Err(e),
        };
        let top_dev = sys::fstat(top.as_fd())?.st_dev;
        let base = place.rel();
        // Directories still to walk, by path below `top` (opened when their turn comes: a wide
        // tree holds one descriptor at a time, not one per directory waiting).
        let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
        while let Some(sub) = stack.pop() {
            let dir = match sub.is_empty() {
                true => top.try_clone()?,
                false => sys::open_beneath(top.as_fd(), &sub, libc::O_RDONLY | libc::O_DIRECTORY)?,
            };
            for name in sys::list(dir.as_fd())? {
                let st = sys::fstatat(dir.as_fd(), &name, 0)?;
                if st.st_dev != top_dev {
                    // A mount of the jail's own (a masked file): not the project's content,
                    // and it does not move with the directory on the host's side.
                    continue;
                }
                let rel_sub = path::join(&sub, &name);
                self.before_change(Place {
                    dir: dir.as_fd(),
                    rel_dir: &path::join(&base, &sub),
                    name: &name,
                })?;
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    stack.push(rel_sub.clone());
                }
                below.push(rel_sub);
            }
        }
        Ok(below)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `place` is now, a file's content copied into a new blob of the run.
    fn keep(&self, inner: &mut Inner, place: Place) -> io::Result<State> {
        for _ in 0..8 {
            let got = state::inspect(place.dir, place.name, |fd, st| {
                let size = st.st_size as u64;
                let mode = state::perm(st);
                if inner.over_budget || inner.bytes.saturating_add(size) > inner.budget {
                    inner.mark_over_budget_here()?;
                    return Ok(State::File {
                        mode,
                        size,
                        blob: None,
                        sha256: None,
                        stat: Some(state::Stat::of(st)),
                    });
                }
                // Another writer of the same record (an executor command's jail) may have
                // taken the next name: the first free one.
                let (name, blob) = loop {
                    let name = format!("b{}", inner.next_blob);
                    inner.next_blob += 1;
                    match sys::openat(
                        self.dir.as_fd(),
                        name.as_bytes(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                        0o600,
                    ) {
                        Ok(fd) => break (name, fd),
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                        Err(e) => return Err(e),
                    }
                };
                let copied = sys::copy_all(fd, blob.as_fd())?;
                if copied != size {
                    // The file changed size while it was copied: a writer outside this call
                    // (one that opened it earlier). Keep what was read; undo compares content.
                    inner.bytes += copied;
                } else {
                    inner.bytes += size;
                }
                Ok(State::File {
                    mode,
                    size: copied,
                    blob: Some(name),
                    sha256: None,
                    stat: None,
                })
            });
            match got {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                other => return other,
            }
        }
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }
}

impl Inner {
    fn append(&mut self, rel: &[u8], before: State) -> io::Result<()> {
        let mut line = serde_json::to_vec(&Line {
            path: Bytes(rel.to_vec()),
            before,
        })
        .map_err(io::Error::other)?;
        line.push(b'\n');
        if self.bytes.saturating_add(line.len() as u64) > self.budget {
            // Past the budget the names are still noted (the change summary needs every one).
            self.mark_over_budget_here()?;
        }
        // One write of an O_APPEND file: a line is whole or absent.
        self.manifest.write_all(&line)?;
        self.bytes += line.len() as u64;
        self.seen.insert(rel.to_vec());
        Ok(())
    }

    fn append_absent(&mut self, rel: &[u8]) -> io::Result<()> {
        if self.seen.contains(rel) {
            return Ok(());
        }
        self.append(rel, State::Absent)
    }

    fn mark_over_budget_here(&mut self) -> io::Result<()> {
        if self.over_budget {
            return Ok(());
        }
        let mut f = File::from(sys::openat(
            self.dir.as_fd(),
            store::INCOMPLETE.as_bytes(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o600,
        )?);
        writeln!(
            f,
            "the run changed more than the record's budget of {} bytes keeps",
            self.budget
        )?;
        self.over_budget = true;
        Ok(())
    }
}

/// ELOOP when a component of `dir` (below `project`) is a symlink before the first one that is
/// missing or not a directory; else the path below is plainly absent.
fn no_link_on_the_way(project: BorrowedFd, dir: &[u8]) -> io::Result<()> {
    let mut end = 0;
    for part in dir.split(|&b| b == b'/') {
        end += part.len();
        match sys::fstatat(project, &dir[..end], 0) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
            Ok(_) => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        end += 1;
    }
    Ok(())
}
