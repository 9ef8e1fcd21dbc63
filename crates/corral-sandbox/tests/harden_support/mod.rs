//! Shared by the harden_* tests: run a test body in a process of its own.
//!
//! A seccomp filter, a Landlock domain or a capability drop cannot be undone, so each test
//! re-executes this test binary filtered down to itself (birdcage's harness does the same):
//! the parent only waits and reports, the child applies the restriction and tries the attack.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

const CHILD_VAR: &str = "CORRAL_HARDEN_CHILD";

/// Run `body` in a fresh process when called from the test named `name` (the function name).
pub fn isolated(name: &str, body: impl FnOnce()) {
    isolated_with(name, |_| {}, body)
}

/// As [`isolated`], letting the caller adjust the child's command (uid, executable, ...).
pub fn isolated_with(name: &str, adjust: impl FnOnce(&mut Command), body: impl FnOnce()) {
    if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, name);
    adjust(&mut cmd);
    let out = cmd.output().expect("re-executing the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "isolated test {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // The filter must have matched exactly this test, or nothing was checked.
    assert!(
        stdout.contains("1 passed"),
        "isolated test {name} did not run in the child:\n{stdout}\n{stderr}"
    );
    eprint!("{stderr}");
}

/// A unique name for temporary things: pid plus a counter.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh directory that is not under /tmp (the jail's rules grant /tmp), removed on drop:
/// under the target directory, else (not writable, e.g. a copied binary run by another user)
/// under /var/tmp.
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let make = |base: &Path| {
        std::fs::create_dir_all(base).ok()?;
        tempfile::Builder::new()
            .prefix(&unique(prefix))
            .tempdir_in(base)
            .ok()
    };
    // The Landlock rules open /tmp and /dev/shm (the jail's private ones) read-write, so a
    // directory meant to be outside the Plan must not lie under them, even when the checkout
    // (and so the target dir) does.
    let inside_open_dirs = |p: &Path| p.starts_with("/tmp") || p.starts_with("/dev/shm");
    (!inside_open_dirs(&target))
        .then(|| make(&target))
        .flatten()
        .or_else(|| make(Path::new("/var/tmp")))
        .expect("no writable directory outside /tmp for test files (target dir or /var/tmp)")
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The last OS error of a raw syscall.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Does `program` exist on PATH?
pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| Path::new(&d).join(program).is_file()))
        .unwrap_or(false)
}
