//! Confining a command's working directory to the project root.
//!
//! The root is opened once, when the server starts. A request's `cwd` is resolved relative to
//! that descriptor with `openat2(RESOLVE_BENEATH)`, so the kernel refuses any step (`..`, an
//! absolute path, a symlink) that would leave it, and the resulting directory descriptor is what
//! the command's process `fchdir`s to: a symlink swapped in after the check cannot redirect the
//! command (no time-of-check/time-of-use gap). Absolute paths and `..` components are refused
//! before the kernel is even asked, with a message that says why.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::sys::stat::Mode;

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("project root {path}: {source}")]
    Root {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cwd {cwd:?} is absolute; give a directory relative to the project root")]
    Absolute { cwd: String },
    #[error("cwd {cwd:?} contains '..'; the working directory may not leave the project root")]
    DotDot { cwd: String },
    #[error(
        "cwd {cwd:?} resolves outside the project root (a symlink pointing out of the project)"
    )]
    Escapes { cwd: String },
    #[error("cwd {cwd:?} does not exist in the project")]
    NotFound { cwd: String },
    #[error("cwd {cwd:?} is not a directory")]
    NotDir { cwd: String },
    #[error("cwd {cwd:?}: {source}")]
    Io { cwd: String, source: std::io::Error },
}

/// The project root, held open.
#[derive(Debug)]
pub struct ProjectRoot {
    path: PathBuf,
    fd: OwnedFd,
}

/// A resolved working directory: its descriptor (what the command `fchdir`s to) and its real
/// path (for the audit log and for spawners that need a path, e.g. inside a jail where the
/// project is mounted at its own path).
#[derive(Debug)]
pub struct WorkDir {
    pub path: PathBuf,
    pub fd: OwnedFd,
}

impl ProjectRoot {
    /// Open `path` (symlinks resolved) as the root commands may not leave.
    pub fn open(path: &Path) -> Result<Self, ConfineError> {
        let root_err = |source| ConfineError::Root {
            path: path.to_path_buf(),
            source,
        };
        let canonical = std::fs::canonicalize(path).map_err(root_err)?;
        let fd = open(
            &canonical,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| root_err(e.into()))?;
        Ok(Self {
            path: canonical,
            fd,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolve a request's `cwd` (`None`: the root itself).
    pub fn resolve(&self, cwd: Option<&str>) -> Result<WorkDir, ConfineError> {
        let rel = cwd.unwrap_or(".");
        let p = Path::new(rel);
        if p.is_absolute() {
            return Err(ConfineError::Absolute { cwd: rel.into() });
        }
        if p.components().any(|c| c == Component::ParentDir) {
            return Err(ConfineError::DotDot { cwd: rel.into() });
        }
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = match openat2(self.fd.as_fd(), p, how) {
            Ok(fd) => fd,
            Err(Errno::ENOSYS) => self.open_fallback(rel)?,
            Err(e) => return Err(self.map_errno(rel, e)),
        };
        let path = self.check_inside(rel, &fd)?;
        Ok(WorkDir { path, fd })
    }

    /// Kernels before 5.6 have no openat2: resolve the path, check it, open it, and check the
    /// opened directory again (the second check closes the gap a concurrent rename could use).
    fn open_fallback(&self, rel: &str) -> Result<OwnedFd, ConfineError> {
        let real = std::fs::canonicalize(self.path.join(rel)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ConfineError::NotFound { cwd: rel.into() }
            } else {
                ConfineError::Io {
                    cwd: rel.into(),
                    source: e,
                }
            }
        })?;
        if !real.starts_with(&self.path) {
            return Err(ConfineError::Escapes { cwd: rel.into() });
        }
        open(
            &real,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| self.map_errno(rel, e))
    }

    fn map_errno(&self, rel: &str, e: Errno) -> ConfineError {
        match e {
            Errno::EXDEV | Errno::ELOOP => ConfineError::Escapes { cwd: rel.into() },
            Errno::ENOENT => ConfineError::NotFound { cwd: rel.into() },
            Errno::ENOTDIR => ConfineError::NotDir { cwd: rel.into() },
            e => ConfineError::Io {
                cwd: rel.into(),
                source: e.into(),
            },
        }
    }

    /// The real path of an opened directory, which must lie in the root.
    fn check_inside(&self, rel: &str, fd: &OwnedFd) -> Result<PathBuf, ConfineError> {
        let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let real = std::fs::read_link(&link).map_err(|source| ConfineError::Io {
            cwd: rel.into(),
            source,
        })?;
        if !real.starts_with(&self.path) {
            return Err(ConfineError::Escapes { cwd: rel.into() });
        }
        Ok(real)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_inside_and_refuses_every_way_out() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        std::fs::create_dir_all(root.join("sub/dir")).unwrap();
        std::fs::write(root.join("file"), "").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("in")).unwrap();
        std::os::unix::fs::symlink("/", root.join("abs")).unwrap();
        let r = ProjectRoot::open(&root).unwrap();
        let real_root = std::fs::canonicalize(&root).unwrap();

        assert_eq!(r.resolve(None).unwrap().path, real_root);
        assert_eq!(
            r.resolve(Some("sub/dir")).unwrap().path,
            real_root.join("sub/dir")
        );
        // A symlink that stays inside is fine.
        assert_eq!(
            r.resolve(Some("in/dir")).unwrap().path,
            real_root.join("sub/dir")
        );

        for (cwd, want) in [
            ("../..", "DotDot"),
            ("sub/../..", "DotDot"),
            ("/etc", "Absolute"),
            ("out", "Escapes"),
            ("abs", "Escapes"),
            ("abs/etc", "Escapes"),
            ("missing", "NotFound"),
            ("file", "NotDir"),
        ] {
            let err = r.resolve(Some(cwd)).unwrap_err();
            assert!(
                format!("{err:?}").starts_with(want),
                "{cwd}: expected {want}, got {err:?}"
            );
        }
        // The fallback path refuses the same escapes.
        assert!(matches!(
            r.open_fallback("out"),
            Err(ConfineError::Escapes { .. })
        ));
        assert!(r.open_fallback("sub/dir").is_ok());
    }
}
