//! Review mode's project: an overlay whose lower layer is the host's project, opened by
//! descriptor, and whose upper and work directories are corral's (`ReviewPlan`, in corral's
//! state directory). What the jail writes to the project lands in the upper directory; the
//! host's project is never written. `corral diff` reads the upper directory, `corral accept`
//! applies it (corral-session `review/`).
//!
//! The overlay is mounted in the jail's own user namespace (`userxattr`: its whiteouts and
//! opaque markers are `user.overlay.*` attributes and 0:0 character devices). Redirects and
//! metacopy stay off, so every change is in the upper directory as whole files, directories,
//! links and whiteouts, which is all `corral accept` knows how to apply.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use corral_policy::plan::ReviewPlan;
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::mount::{MsFlags, mount};
use nix::sys::stat::Mode;

use crate::error::JailError;

/// Mount the overlay of `lower` (the host's project, the descriptor the plain bind would have
/// bound) with `review`'s upper and work directories onto the mount point `target`.
/// `old` is where the host's root is reachable, `proc` the jail's fresh procfs; `shown` the
/// project's path, for errors.
pub(crate) fn mount_overlay(
    lower: &OwnedFd,
    target: &OwnedFd,
    review: &ReviewPlan,
    old: &str,
    proc: &str,
    shown: &Path,
) -> Result<(), JailError> {
    let upper = open_review_dir(old, &review.upper)?;
    let work = open_review_dir(old, &review.work)?;
    let fd = |f: &OwnedFd| format!("{proc}/self/fd/{}", f.as_raw_fd());
    // Each layer is named by its descriptor: what is mounted is exactly what was opened.
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr,redirect_dir=nofollow,metacopy=off,index=off",
        fd(lower),
        fd(&upper),
        fd(&work),
    );
    mount(
        Some("corral-review"),
        fd(target).as_str(),
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(|e| {
        JailError::at(
            "mount the review overlay over the project (overlayfs in a user namespace, Linux 5.11 \
             or later)",
            shown,
            e,
        )
    })
}

/// A review directory, opened from the host's root. It is in corral's state directory, which
/// no jail can write (the user's own layout, like a system directory's, is followed); its last
/// component is corral's and must be a directory, not a link.
fn open_review_dir(old: &str, dir: &Path) -> Result<OwnedFd, JailError> {
    let at = crate::mounts::under(old, dir);
    openat(
        AT_FDCWD,
        at.as_path(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| JailError::at("open a review directory", dir, e))
}
