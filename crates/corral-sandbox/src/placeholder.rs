//! The policy file is read-only inside the jail even when it does not exist yet.
//!
//! A mount needs an existing path to cover, and nothing in the kernel denies creating one file
//! name in an otherwise writable directory. So when the project's `corral.toml` is absent, corral
//! creates it empty (an empty policy adds nothing) before the jail starts, the jail binds it
//! read-only, and corral removes it when the run ends if it is still the empty file corral
//! made. Every run holds a shared `flock` on the file while it runs; the run that created it
//! removes it only if it gets the lock exclusively, i.e. no other jail of the project is using it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::JailError;

pub(crate) struct Placeholder {
    path: PathBuf,
    lock: Option<Flock<File>>,
    created: bool,
}

impl Placeholder {
    /// Make sure `path` exists (creating it empty when its directory does), and hold a shared
    /// lock on it. `Ok(None)` when the directory itself is missing (then no file is made).
    pub(crate) fn ensure(path: &Path) -> Result<Option<Placeholder>, JailError> {
        if !path.parent().is_some_and(Path::is_dir) {
            return Ok(None);
        }
        for _ in 0..8 {
            let (file, created) = match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
            {
                Ok(f) => (f, true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match File::open(path) {
                    Ok(f) => (f, false),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(JailError::at("open the policy file", path, e)),
                },
                // The caller cannot create it, so neither can the jail (same uid, no
                // capabilities): nothing to hold.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EACCES | libc::EPERM | libc::EROFS)
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) => {
                    return Err(JailError::at(
                        "create an empty policy file so it can be made read-only",
                        path,
                        e,
                    ));
                }
            };
            let lock = Flock::lock(file, FlockArg::LockShared)
                .map_err(|(_, e)| JailError::at("lock the policy file", path, e))?;
            // The file may have been removed by a run that ended meanwhile: retry on a new one.
            if same_file(&lock, path) {
                return Ok(Some(Placeholder {
                    path: path.to_path_buf(),
                    lock: Some(lock),
                    created,
                }));
            }
        }
        Err(JailError::at(
            "hold the policy file (it keeps being replaced)",
            path,
            std::io::Error::from(std::io::ErrorKind::WouldBlock),
        ))
    }
}

fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

impl Drop for Placeholder {
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
        let empty = lock.metadata().map(|m| m.len() == 0).unwrap_or(false);
        if empty && same_file(&lock, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
