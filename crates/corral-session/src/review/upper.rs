//! The change set: the overlay's upper directory read against the host's project. Every
//! entry of the upper directory is a file, directory or link the jail wrote whole (copy-up
//! copies a file entirely; redirects and metacopy are off), a whiteout (a 0:0 character
//! device: the name was deleted), or a directory marked opaque (`user.overlay.opaque`: what
//! the host has below it is gone). Entries the upper holds unchanged (a file opened for
//! writing and not changed) are no change. Anything else, an overlay attribute this does not
//! know included, is refused rather than guessed at.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::Paths;
use super::hostfs::{ctime_ns, file_type, hash_copy, open_dir, open_file, read_link, stat_at};

/// One entry's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Entry {
    /// A regular file: its permission bits, size and SHA-256.
    File {
        mode: u32,
        size: u64,
        sha256: String,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
    /// Something accept never makes (a device, FIFO or socket): shown, refused.
    Special {
        what: String,
    },
    Absent,
}

impl Entry {
    pub fn is_dir(&self) -> bool {
        matches!(self, Entry::Dir { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum What {
    Added,
    Modified,
    Deleted,
}

/// One change: `path` relative to the project, what the host has (`old`), what the review
/// holds (`new`). A deleted directory is one change (its content goes with it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub path: PathBuf,
    pub what: What,
    pub old: Entry,
    pub new: Entry,
    /// The host entry's ctime (ns) when it was read, for `old` entries that exist.
    #[serde(skip)]
    pub old_ctime: Option<i128>,
    /// The overlay copied the entry up from the host's project (`user.overlay.origin`, which
    /// the jail cannot set): the host had it when the jail first wrote it.
    #[serde(skip)]
    pub copied_up: bool,
}

/// The changes of the review at `paths`, in walk order (a directory before what is below it),
/// those below one of `select` (project-relative; all when empty), with the directories
/// that must exist for them.
pub fn changes(paths: &Paths, select: &[PathBuf]) -> anyhow::Result<Vec<Change>> {
    let upper = nix::fcntl::open(
        &paths.upper,
        nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .with_context(|| format!("cannot open {}", paths.upper.display()))?;
    let host = nix::fcntl::open(
        &paths.root,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .with_context(|| format!("cannot open the project {}", paths.root.display()))?;
    let mut out = Vec::new();
    let mut w = Walk { out: &mut out };
    w.dir(upper.as_fd(), Some(host.as_fd()), Path::new(""), false)?;
    Ok(selected(out, select))
}

fn selected(all: Vec<Change>, select: &[PathBuf]) -> Vec<Change> {
    if select.is_empty() {
        return all;
    }
    all.into_iter()
        .filter(|c| {
            select
                .iter()
                .any(|s| c.path.starts_with(s) || (c.new.is_dir() && s.starts_with(&c.path)))
        })
        .collect()
}

struct Walk<'a> {
    out: &'a mut Vec<Change>,
}

impl Walk<'_> {
    /// The upper directory `u` at `rel`, over the host's directory `h` (none when the host has
    /// no directory there). `opaque`: the host's entries below are not part of the merged view.
    fn dir(
        &mut self,
        u: BorrowedFd,
        h: Option<BorrowedFd>,
        rel: &Path,
        opaque: bool,
    ) -> anyhow::Result<()> {
        let names =
            list(u).with_context(|| format!("cannot read the change set at {}", shown(rel)))?;
        for name in &names {
            self.entry(u, h, rel, name, opaque)?;
        }
        if let (true, Some(h)) = (opaque, h) {
            // What the host has here and the upper directory does not: deleted.
            let host_names = list(h).with_context(|| format!("cannot read {}", shown(rel)))?;
            for name in host_names.iter().filter(|n| !names.contains(n)) {
                let path = rel.join(name);
                let Some(st) = stat_at(h, name)? else {
                    continue;
                };
                self.out.push(Change {
                    old: host_entry(h, name, &st, &path)?,
                    what: What::Deleted,
                    new: Entry::Absent,
                    old_ctime: Some(ctime_ns(&st)),
                    copied_up: false,
                    path,
                });
            }
        }
        Ok(())
    }

    fn entry(
        &mut self,
        u: BorrowedFd,
        h: Option<BorrowedFd>,
        rel: &Path,
        name: &OsStr,
        opaque: bool,
    ) -> anyhow::Result<()> {
        let path = rel.join(name);
        if std::str::from_utf8(path.as_os_str().as_bytes()).is_err() {
            bail!(
                "the change set holds a name that is not UTF-8 ({}): accept cannot show or apply it; \
                 `corral discard` drops the review",
                super::show::shown(&path)
            );
        }
        let Some(ust) = stat_at(u, name)? else {
            return Ok(());
        };
        let kind = file_type(&ust);
        let (own_opaque, copied_up) = overlay_marks(u, name, kind, &path)?;
        // The host's entry of that name, compared with what the review holds (below an opaque
        // directory too: the review's entry then replaces it whole).
        let hst = match h {
            Some(h) => stat_at(h, name)?,
            None => None,
        };
        let old = match (h, &hst) {
            (Some(h), Some(st)) => host_entry(h, name, st, &path)?,
            _ => Entry::Absent,
        };
        let old_ctime = hst.as_ref().map(ctime_ns);
        let whiteout = kind == libc::S_IFCHR && ust.st_rdev == 0;
        let new = if whiteout {
            Entry::Absent
        } else {
            match upper_entry(u, name, &ust, &path) {
                Ok(e) => e,
                // Gone since it was listed: the jail removed it while `corral diff` read the
                // change set during the run (accept reads it with no jail running).
                Err(e) if gone(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        };
        let what = match (&old, &new) {
            (Entry::Absent, Entry::Absent) => None,
            (Entry::Absent, _) => Some(What::Added),
            (_, Entry::Absent) => Some(What::Deleted),
            (o, n) if o == n => None,
            // A directory over a directory: changed only in its mode (its content is below).
            (Entry::Dir { mode: a }, Entry::Dir { mode: b }) if a == b => None,
            _ => Some(What::Modified),
        };
        if let Some(what) = what {
            self.out.push(Change {
                path: path.clone(),
                what,
                old: old.clone(),
                new: new.clone(),
                old_ctime,
                copied_up,
            });
        }
        if new.is_dir() {
            let Some(sub) = open_dir(u, Path::new(name))? else {
                return Ok(());
            };
            // The host's directory below, when the merged view still shows its entries.
            let host_sub: Option<OwnedFd> = match (h, &old) {
                (Some(h), Entry::Dir { .. }) => open_dir(h, Path::new(name))?,
                _ => None,
            };
            let opaque_below = opaque || own_opaque;
            self.dir(
                sub.as_fd(),
                host_sub.as_ref().map(|f| f.as_fd()),
                &path,
                opaque_below,
            )?;
        }
        Ok(())
    }
}

use entry_of as upper_entry;

fn host_entry(
    dir: BorrowedFd,
    name: &OsStr,
    st: &nix::sys::stat::FileStat,
    path: &Path,
) -> anyhow::Result<Entry> {
    entry_of(dir, name, st, path)
}

fn entry_of(
    dir: BorrowedFd,
    name: &OsStr,
    st: &nix::sys::stat::FileStat,
    path: &Path,
) -> anyhow::Result<Entry> {
    let mode = st.st_mode & 0o7777;
    Ok(match file_type(st) {
        libc::S_IFREG => {
            let (f, st) = open_file(dir, name)
                .with_context(|| format!("cannot read {}", super::show::shown(path)))?;
            let (sha256, size) = hash_copy(f, None)
                .with_context(|| format!("cannot read {}", super::show::shown(path)))?;
            Entry::File {
                mode: st.st_mode & 0o7777,
                size,
                sha256,
            }
        }
        libc::S_IFDIR => Entry::Dir { mode },
        libc::S_IFLNK => {
            let target = read_link(dir, name)
                .with_context(|| format!("cannot read the link {}", super::show::shown(path)))?;
            Entry::Symlink {
                target: String::from_utf8(std::os::unix::ffi::OsStringExt::into_vec(target))
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "the link {} has a target that is not UTF-8",
                            super::show::shown(path)
                        )
                    })?,
            }
        }
        libc::S_IFCHR => Entry::Special {
            what: "character device".into(),
        },
        libc::S_IFBLK => Entry::Special {
            what: "block device".into(),
        },
        libc::S_IFIFO => Entry::Special {
            what: "FIFO".into(),
        },
        libc::S_IFSOCK => Entry::Special {
            what: "socket".into(),
        },
        _ => Entry::Special {
            what: "unknown file type".into(),
        },
    })
}

/// The overlay's marks on the upper entry `name` in `u`: whether it is an opaque directory,
/// and whether it was copied up from the host's project. Any other overlay attribute (a
/// redirect, metacopy, a whiteout by attribute) is refused, not guessed at.
fn overlay_marks(
    u: BorrowedFd,
    name: &OsStr,
    kind: u32,
    path: &Path,
) -> anyhow::Result<(bool, bool)> {
    let attrs = super::hostfs::overlay_xattrs(u, name).with_context(|| {
        format!(
            "cannot read the overlay's attributes of {}",
            super::show::shown(path)
        )
    })?;
    let (mut opaque, mut copied_up) = (false, false);
    for (attr, value) in &attrs {
        match attr.as_str() {
            "user.overlay.origin" => copied_up = true,
            "user.overlay.impure" => {}
            "user.overlay.opaque" if kind == libc::S_IFDIR && value.as_slice() == b"y" => {
                opaque = true;
            }
            _ => bail!(
                "the change set's {} carries the overlay attribute {attr}, which corral does \
                 not apply; `corral discard` drops the review",
                super::show::shown(path)
            ),
        }
    }
    Ok((opaque, copied_up))
}

/// The error says the entry is no longer there.
fn gone(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            || c.downcast_ref::<nix::errno::Errno>() == Some(&nix::errno::Errno::ENOENT)
    })
}

/// The names in the directory `dir`, sorted.
fn list(dir: BorrowedFd) -> nix::Result<Vec<OsString>> {
    let fd = nix::fcntl::openat(
        dir,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for e in d.iter() {
        let name = OsStr::from_bytes(e?.file_name().to_bytes()).to_os_string();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

fn shown(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        "the project's top".into()
    } else {
        super::show::shown(rel)
    }
}
