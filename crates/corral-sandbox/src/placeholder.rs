//! Protected paths are read-only inside the jail even when they do not exist yet.
//!
//! A mount needs an existing path to cover, and nothing in the kernel denies creating one name
//! in an otherwise writable directory. So for every protected path that is absent (the
//! project's `corral.toml`, `.git/hooks` in a repository without one, `.git` itself in a
//! directory that is no repository yet), corral creates its first missing component on the host
//! before the jail starts, the jail binds it read-only, and corral removes it when the run ends
//! if it is still empty and still the one corral made. Below the placeholder nothing can be
//! created either, so one placeholder covers every protected path under it (`.git` covers
//! `.git/hooks` and `.git/config`: a directory that is no repository cannot become one inside
//! the jail, `git init` there fails read-only; run it on the host first).
//!
//! The placeholder is an empty file for a policy file (an empty policy adds nothing) or a name
//! with an extension (`trusted.json`: an empty trust store trusts nothing), and an empty
//! directory otherwise. It is created by descriptor below the directory the jail can
//! write, never through a symlink (one a previous run planted is refused, naming it). Every run
//! holds a shared `flock` on each placeholder while it runs; the run that created one removes
//! it only if it gets the lock exclusively, i.e. no other jail of the project is using it.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use corral_policy::plan::Plan;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::error::JailError;
use crate::mounts::{Kind, deepest_below, open_path, planted_link, walk, writable_roots};

/// The placeholders and protected paths one run holds. Dropping it removes what it created.
pub(crate) struct Placeholder {
    /// Kept for their `Drop`, which removes what this run created.
    _held: Vec<HeldPlaceholder>,
    /// The placeholders this run created.
    made: Vec<PathBuf>,
}

/// One placeholder or protected path this run holds locked; dropping it removes the
/// placeholder if this run created it and no other jail still binds it.
struct HeldPlaceholder {
    /// O_PATH descriptor of the directory holding it, and its name there.
    parent: OwnedFd,
    name: OsString,
    lock: Option<Flock<File>>,
    created: bool,
    dir: bool,
}

impl Placeholder {
    /// Make sure every protected path of `plan` exists, or a placeholder above it that the
    /// jail will bind read-only; returns the plan to run, with the placeholders added to its
    /// protected paths.
    pub(crate) fn ensure(plan: &Plan) -> Result<(Option<Placeholder>, Plan), JailError> {
        let mut out = plan.clone();
        let mut held: Vec<HeldPlaceholder> = Vec::new();
        let mut made: Vec<PathBuf> = Vec::new();
        let roots = writable_roots(plan);
        for path in &plan.protected {
            // Only where the jail could write: elsewhere it cannot create the path either.
            let Some(root) = deepest_below(roots.iter().copied(), path) else {
                continue;
            };
            if made.iter().any(|m| path.starts_with(m)) {
                continue; // under a placeholder of this run: covered by it
            }
            let is_policy = *path == plan.project.policy_file || plan.sources.contains(path);
            if let Some((h, created_at)) = hold(root, path, is_policy)? {
                if let Some(at) = created_at {
                    if !out.protected.contains(&at) {
                        out.protected.push(at.clone());
                    }
                    made.push(at);
                }
                held.push(h);
            }
        }
        out.protected.sort();
        Ok((Some(Placeholder { _held: held, made }), out))
    }

    /// The placeholders this run created (it removes them when dropped).
    pub(crate) fn made(&self) -> &[PathBuf] {
        &self.made
    }
}

/// Hold `path` below `root`: lock it when it exists, else create its first missing component
/// and lock that. Returns what is held and, when it was created, its path.
fn hold(
    root: &Path,
    path: &Path,
    is_policy: bool,
) -> Result<Option<(HeldPlaceholder, Option<PathBuf>)>, JailError> {
    let step = "hold a protected path";
    let rel = path.strip_prefix(root).unwrap_or(path);
    for _ in 0..8 {
        let base = match open_path(root) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(JailError::at(step, root, e)),
        };
        let w = walk(base, root, rel).map_err(|e| JailError::at(step, path, e))?;
        if let Kind::Link(to) = &w.kind {
            return Err(JailError::at(step, path, planted_link(&w.at, to, root)));
        }
        if w.complete() {
            // It exists: hold it so that a run that created it does not remove it under us.
            let (Some(parent_rel), Some(name)) = (rel.parent(), rel.file_name()) else {
                return Ok(None);
            };
            let base = open_path(root).map_err(|e| JailError::at(step, root, e))?;
            let parent = walk(base, root, parent_rel).map_err(|e| JailError::at(step, path, e))?;
            if !parent.complete() || parent.kind != Kind::Dir {
                continue; // changed meanwhile
            }
            #[cfg(test)]
            tests::between_walk_and_lock(path);
            match lock(parent.fd, name.to_os_string(), false, w.kind == Kind::Dir) {
                Ok(Some(h)) => return Ok(Some((h, None))),
                // Gone or replaced between the walk and the open (another run of the project
                // removed its placeholder): walk again, and make one if it is missing now.
                Ok(None) => continue,
                // It exists but this user cannot read it: not a placeholder (corral makes
                // those readable), so no run removes it; the jail binds it read-only, and
                // refuses to start if it is missing by then.
                Err(Errno::EACCES | Errno::EPERM) => return Ok(None),
                Err(e) => return Err(JailError::at("lock a protected path", path, e)),
            }
        }
        if w.kind != Kind::Dir {
            return Ok(None); // a file on the way: the jail makes that one read-only
        }
        let name = w.rest[0].clone();
        let at = w.at.join(&name);
        // The path itself: a file when it is a policy file or its name has an extension
        // (`trusted.json`), a directory otherwise (`.git/hooks`). Above it: a directory.
        let file = w.rest.len() == 1 && (is_policy || Path::new(&name).extension().is_some());
        let dir = !file;
        let made = if dir {
            mkdirat(&w.fd, name.as_os_str(), Mode::from_bits_truncate(0o755))
        } else {
            openat(
                &w.fd,
                name.as_os_str(),
                OFlag::O_RDONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .map(drop)
        };
        let created = match made {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            // A read-only file system: the jail cannot create it either.
            Err(Errno::EROFS) => return Ok(None),
            Err(e @ (Errno::EACCES | Errno::EPERM)) => {
                return Err(JailError::at(
                    "create a placeholder so that a protected path can be made read-only \
                     (corral may not write in its directory, which the jail can write: make \
                     that directory writable for you, or create the path yourself)",
                    &at,
                    e,
                ));
            }
            Err(e) => {
                return Err(JailError::at(
                    "create a placeholder so that a protected path can be made read-only",
                    &at,
                    e,
                ));
            }
        };
        if !created {
            continue; // someone made it meanwhile: walk again and hold what is there
        }
        return match lock(w.fd, name, true, dir) {
            Ok(Some(h)) => Ok(Some((h, Some(at)))),
            Ok(None) => Err(JailError::at(
                "lock a placeholder (it was replaced right after corral made it)",
                &at,
                std::io::Error::from(std::io::ErrorKind::WouldBlock),
            )),
            Err(e) => Err(JailError::at("lock a placeholder", &at, e)),
        };
    }
    Err(JailError::at(
        "hold a protected path (it keeps being replaced)",
        path,
        std::io::Error::from(std::io::ErrorKind::WouldBlock),
    ))
}

/// Open `parent`/`name` without following a link and hold a shared lock on it. `Ok(None)`
/// when it is not the entry at that name any more (gone, or replaced by another kind); the
/// error of the open or the lock otherwise (EACCES: unreadable).
fn lock(
    parent: OwnedFd,
    name: OsString,
    created: bool,
    dir: bool,
) -> Result<Option<HeldPlaceholder>, Errno> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    if dir {
        flags |= OFlag::O_DIRECTORY;
    }
    let fd = match openat(&parent, name.as_os_str(), flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => return Ok(None),
        Err(e) => return Err(e),
    };
    let lock = Flock::lock(File::from(fd), FlockArg::LockShared).map_err(|(_, e)| e)?;
    let held = HeldPlaceholder {
        parent,
        name,
        lock: Some(lock),
        created,
        dir,
    };
    Ok(held.is_there().then_some(held))
}

fn same(a: &FileStat, b: &FileStat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

impl HeldPlaceholder {
    /// Whether the locked entry is still the one at its name.
    fn is_there(&self) -> bool {
        let Some(lock) = &self.lock else { return false };
        match (
            fstat(&**lock),
            fstatat(
                &self.parent,
                self.name.as_os_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ),
        ) {
            (Ok(a), Ok(b)) => same(&a, &b),
            _ => false,
        }
    }
}

impl Drop for HeldPlaceholder {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else { return };
        if !self.created {
            return;
        }
        let file = match lock.unlock() {
            Ok(f) => f,
            Err(_) => return,
        };
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            return; // another jail of this project still binds it
        };
        self.lock = Some(lock);
        if !self.is_there() {
            return;
        }
        if self.dir {
            // Fails on a directory that is not empty any more: then it is the user's now.
            let _ = unlinkat(
                &self.parent,
                self.name.as_os_str(),
                UnlinkatFlags::RemoveDir,
            );
        } else {
            let empty = self
                .lock
                .as_ref()
                .and_then(|l| l.metadata().ok())
                .is_some_and(|m| m.len() == 0);
            if empty {
                let _ = unlinkat(
                    &self.parent,
                    self.name.as_os_str(),
                    UnlinkatFlags::NoRemoveDir,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::os::unix::fs::PermissionsExt;

    type Race = Box<dyn FnOnce(&Path)>;

    thread_local! {
        /// Run once between the walk that found a protected path and the lock on it: stands
        /// in for another run of the project removing its placeholder right then.
        static RACE: RefCell<Option<Race>> = const { RefCell::new(None) };
    }

    pub(super) fn between_walk_and_lock(path: &Path) {
        if let Some(f) = RACE.with(|r| r.borrow_mut().take()) {
            f(path);
        }
    }

    #[test]
    fn a_placeholder_removed_between_walk_and_lock_is_made_again() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let hooks = root.join(".git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        RACE.with(|r| {
            *r.borrow_mut() = Some(Box::new(|p: &Path| std::fs::remove_dir(p).unwrap()));
        });
        let (held, created) = hold(root, &hooks, false)
            .unwrap()
            .expect("the path is held, not left to the jail");
        assert_eq!(created, Some(hooks.clone()));
        assert!(hooks.is_dir(), "the placeholder is there again");
        drop(held);
        assert!(!hooks.exists(), "the run removes the placeholder it made");
    }

    #[test]
    fn a_placeholder_that_cannot_be_made_refuses_naming_the_path() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_path_buf();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sealed = root.join("sealed");
        std::fs::create_dir(&sealed).unwrap();
        std::fs::set_permissions(&sealed, std::fs::Permissions::from_mode(0o555)).unwrap();
        let path = sealed.join("hooks");
        // In a thread of its own, as another user for file access: root would pass the
        // permission check (the file-system uid is per thread, and leaving 0 drops
        // CAP_DAC_OVERRIDE for that thread alone).
        let result = std::thread::spawn(move || {
            // SAFETY: setfsuid changes only this thread's file-system uid; it has no memory
            // effects.
            unsafe { libc::setfsuid(65534) };
            hold(&root, &path, false).map(|h| h.is_some())
        })
        .join()
        .unwrap();
        let e = result.expect_err("EACCES must refuse the run, not leave the path unprotected");
        assert!(
            e.to_string()
                .contains(&d.path().join("sealed/hooks").display().to_string()),
            "{e}"
        );
        assert!(!d.path().join("sealed/hooks").exists());
    }
}
