//! Set-user-ID and set-group-ID files a run left where the jail can write.
//!
//! Inside the native jail the seccomp filter refuses every mode with a set-id bit
//! (`corral-sandbox/src/seccomp.rs`), and the jail's binds are nosuid. This is the check for the
//! writers that filter does not cover: a set-id file in the project or a read-write bind would
//! run as its owner (root, when corral runs as root) for whoever starts it on the host, and an
//! executor on the host or in a compose service can make one. When the jail has ended, every
//! regular file there with S_ISUID or S_ISGID whose inode changed since the run started (ctime,
//! which user space cannot set back) loses those bits, and the run's report names it. Set-id
//! files older than the run are the user's own and are left alone.
//!
//! The walk opens every directory from its parent's descriptor without following symlinks and
//! strips the bits through an `O_PATH|O_NOFOLLOW` descriptor of the entry it checked, so a link
//! planted meanwhile cannot point it at a file elsewhere. It runs on a thread while the rest of
//! the end-of-run report is made (docs/BENCHMARKS.md, "Set-id check").

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use corral_policy::plan::{Access, ExecutorTarget, MountKind, Plan};
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::{FileStat, Mode};

/// Entries visited per root at most (a home directory bound read-write is large).
const MAX_ENTRIES: usize = 1_000_000;
/// The kernel stamps ctime with its coarse clock, up to a tick behind a fine clock read.
const CLOCK_SLACK_NS: i128 = 50_000_000;

/// What the check looks at: the writable roots and when the run started.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Watch {
    #[serde(with = "crate::journal::paths_bytes")]
    roots: Vec<PathBuf>,
    /// Nanoseconds since the epoch, less the clock slack.
    since_ns: i128,
}

impl Watch {
    /// A watch of nothing.
    pub fn none() -> Watch {
        Watch {
            roots: Vec::new(),
            since_ns: 0,
        }
    }
}

/// The directories a run could write on the host: the project (not `--scratch`, which is
/// removed anyway) and every read-write bind. Call before the jail starts.
///
/// Only when some writer of the run is not under the jail's seccomp filter: an executor on the
/// host or in a compose service. A run whose every process is filtered (the jail, and the
/// executor's own jail, the default) cannot set the bits, and walks nothing: on a tree of
/// 100,000 files the walk costs about what a `find -perm` of it costs (docs/BENCHMARKS.md).
pub fn watch(plan: &Plan) -> Watch {
    let mut roots = Vec::new();
    let unfiltered_writer = match plan.executor.target {
        ExecutorTarget::Sandbox => false,
        ExecutorTarget::Compose(_) | ExecutorTarget::Host => true,
    };
    if !unfiltered_writer {
        return Watch { roots, since_ns: 0 };
    }
    // The project even when the jail has it read-only: the executor outside the jail does not.
    if !plan.project.scratch {
        roots.push(plan.project.root.clone());
    }
    for m in &plan.mounts {
        if m.kind == MountKind::Bind(Access::Rw) && !roots.iter().any(|r| m.source.starts_with(r)) {
            roots.push(m.source.clone());
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    Watch {
        roots,
        since_ns: now - CLOCK_SLACK_NS,
    }
}

/// One set-id file found, and what was done.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Found {
    pub path: PathBuf,
    /// The mode it had (permission bits, octal in the report).
    pub mode: u32,
    /// Whether the bits were removed.
    pub stripped: bool,
    /// Why not, when they could not be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The check, running on a thread of its own (none when there is nothing to walk).
pub struct Pending(Option<std::thread::JoinHandle<(Vec<Found>, Vec<String>)>>);

/// Start the check. Call once the jail has ended.
pub fn check(watch: Watch) -> Pending {
    if watch.roots.is_empty() {
        return Pending(None);
    }
    Pending(Some(std::thread::spawn(move || {
        let mut found = Vec::new();
        let mut notes = Vec::new();
        for root in &watch.roots {
            if let Err(e) = scan_root(root, watch.since_ns, &mut found) {
                notes.push(format!(
                    "cannot check {} for set-id files: {e}",
                    root.display()
                ));
            }
        }
        (found, notes)
    })))
}

/// Wait for the check, print what it found with the fix, and record it in the audit log
/// (a `Jail` event `setid`).
pub fn report(pending: Pending, audit: &corral_audit::AuditLog, jail_id: &str) {
    let Some(thread) = pending.0 else {
        return;
    };
    let (found, notes) = thread
        .join()
        .unwrap_or_else(|_| (Vec::new(), vec!["the set-id check panicked".into()]));
    for note in &notes {
        crate::endlines::say(&format!("corral: {}", corral_audit::printable(note)));
    }
    if found.is_empty() {
        return;
    }
    for line in lines(&found) {
        crate::endlines::say(&format!("corral: {line}"));
    }
    let record = corral_audit::Record::now(
        jail_id,
        corral_audit::Event::Jail(corral_audit::JailEvent::Setid {
            detail: serde_json::to_value(&found).unwrap_or_default(),
        }),
    );
    if let Err(e) = audit.write(&record) {
        crate::endlines::say(&format!("corral: cannot write the audit log: {e}"));
    }
}

/// The report's lines: one per file, control characters escaped.
fn lines(found: &[Found]) -> Vec<String> {
    let mut out = vec![format!(
        "{} set-user-ID/set-group-ID file(s) appeared during the run where the jail can write; \
         such a file runs as its owner for whoever starts it:",
        found.len()
    )];
    for f in found {
        let path = corral_audit::printable(&f.path.to_string_lossy());
        out.push(match (&f.error, f.stripped) {
            (_, true) => format!(
                "  {path} (mode {:o}): set-id bits removed (now {:o}); if you meant them, check \
                 the file, then `chmod {:o}` it yourself",
                f.mode,
                f.mode & !0o6000,
                f.mode
            ),
            (Some(e), false) => format!(
                "  {path} (mode {:o}): could NOT remove its set-id bits ({e}): run `chmod ug-s` \
                 on it before anyone runs it",
                f.mode
            ),
            (None, false) => format!("  {path} (mode {:o})", f.mode),
        });
    }
    out
}

/// Walk `root` (the user's own path: resolved normally) without following any link below it.
fn scan_root(root: &Path, since_ns: i128, found: &mut Vec<Found>) -> nix::Result<()> {
    let top = match open_dir(AT_FDCWD, root.as_os_str(), false) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    // Each level keeps its directory open while its subdirectories are walked.
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(top, root.to_path_buf())];
    let mut seen = 0usize;
    while let Some((dir, path)) = stack.pop() {
        for (name, kind) in list(&dir)? {
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(nix::errno::Errno::EFBIG);
            }
            match kind {
                Some(libc::DT_DIR) => {
                    if let Ok(sub) = open_dir(dir.as_fd(), &name, true) {
                        stack.push((sub, path.join(&name)));
                    }
                }
                Some(libc::DT_REG) | Some(libc::DT_UNKNOWN) | None => {
                    check_entry(&dir, &name, &path, since_ns, found, &mut stack);
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// A regular file (or an entry whose type the directory did not say) of `dir`.
fn check_entry(
    dir: &OwnedFd,
    name: &OsStr,
    path: &Path,
    since_ns: i128,
    found: &mut Vec<Found>,
    stack: &mut Vec<(OwnedFd, PathBuf)>,
) {
    let Ok(st) =
        nix::sys::stat::fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
    else {
        return;
    };
    let kind = st.st_mode & libc::S_IFMT;
    if kind == libc::S_IFDIR {
        if let Ok(sub) = open_dir(dir.as_fd(), name, true) {
            stack.push((sub, path.join(name)));
        }
        return;
    }
    if kind != libc::S_IFREG || st.st_mode & 0o6000 == 0 || ctime_ns(&st) < since_ns {
        return;
    }
    let error = strip(dir, name, &st).err();
    found.push(Found {
        path: path.join(name),
        mode: st.st_mode & 0o7777,
        stripped: error.is_none(),
        error: error.map(|e| e.to_string()),
    });
}

fn ctime_ns(st: &FileStat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}

/// Remove S_ISUID and S_ISGID from the entry `name` of `dir`, which must still be the file
/// `st` describes.
fn strip(dir: &OwnedFd, name: &OsStr, st: &FileStat) -> std::io::Result<()> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let now = nix::sys::stat::fstat(&fd)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino)
        || now.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        return Err(std::io::Error::other("it was replaced while being checked"));
    }
    // chmod(2) through /proc/self/fd reaches exactly the inode of the O_PATH descriptor.
    let magic = format!("/proc/self/fd/{}", fd.as_raw_fd());
    nix::sys::stat::fchmodat(
        AT_FDCWD,
        magic.as_str(),
        Mode::from_bits_truncate(now.st_mode & 0o7777 & !0o6000),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )?;
    Ok(())
}

/// Open the directory `name` of `dirfd` for listing; `nofollow`: never through a symlink.
fn open_dir(dirfd: BorrowedFd<'_>, name: &OsStr, nofollow: bool) -> nix::Result<OwnedFd> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if nofollow {
        flags |= OFlag::O_NOFOLLOW;
    }
    openat(dirfd, name, flags, Mode::empty())
}

/// The entries of `dir` (without `.` and `..`) and their types as the directory gives them.
fn list(dir: &OwnedFd) -> nix::Result<Vec<(OsString, Option<u8>)>> {
    let mut d = nix::dir::Dir::from_fd(dir.try_clone().map_err(|_| nix::errno::Errno::EMFILE)?)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let kind = e.file_type().map(|t| match t {
            nix::dir::Type::Directory => libc::DT_DIR,
            nix::dir::Type::File => libc::DT_REG,
            _ => libc::DT_LNK,
        });
        out.push((OsStr::from_bytes(name).to_os_string(), kind));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn strips_set_id_files_changed_since_the_start_only() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let old = root.join("old");
        std::fs::write(&old, "x").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        let w = Watch {
            roots: vec![root.to_path_buf()],
            since_ns: now - CLOCK_SLACK_NS,
        };
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        let new = root.join("a/b/new");
        std::fs::write(&new, "x").unwrap();
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o6711)).unwrap();
        let plain = root.join("a/plain");
        std::fs::write(&plain, "x").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A link to a set-id file elsewhere is not followed.
        std::os::unix::fs::symlink(&old, root.join("a/link")).unwrap();
        let (found, notes) = check(w).0.unwrap().join().unwrap();
        assert_eq!(notes, Vec::<String>::new());
        assert_eq!(
            found,
            vec![Found {
                path: new.clone(),
                mode: 0o6711,
                stripped: true,
                error: None
            }]
        );
        assert_eq!(mode(&new), 0o711);
        assert_eq!(mode(&old), 0o4755);
        assert_eq!(mode(&plain), 0o755);
    }

    /// The walk's cost on a tree (docs/BENCHMARKS.md, "Set-id check"):
    /// `CORRAL_SETID_BENCH=DIR cargo test -p corral --bin corral walk_cost -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn walk_cost() {
        let dir = PathBuf::from(std::env::var_os("CORRAL_SETID_BENCH").expect("a directory"));
        let cpu = || {
            // SAFETY: getrusage fills the struct we pass.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
            let t = |v: libc::timeval| v.tv_sec as f64 * 1e3 + v.tv_usec as f64 / 1e3;
            (t(u.ru_utime), t(u.ru_stime))
        };
        let mut times = Vec::new();
        for _ in 0..20 {
            let (u0, s0) = cpu();
            let start = std::time::Instant::now();
            let mut found = Vec::new();
            scan_root(&dir, i128::MAX, &mut found).unwrap();
            let (u1, s1) = cpu();
            times.push((start.elapsed().as_secs_f64() * 1e3, u1 - u0, s1 - s0));
        }
        times.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (wall, user, sys) = times[10];
        eprintln!(
            "walk of {}: median {wall:.1} ms wall ({user:.1} ms user, {sys:.1} ms sys)",
            dir.display()
        );
    }

    #[test]
    fn the_report_names_each_file_with_the_fix_and_escapes_names() {
        let l = lines(&[
            Found {
                path: PathBuf::from("/p/bin/x\x1b]52;c;AAAA\x07"),
                mode: 0o4755,
                stripped: true,
                error: None,
            },
            Found {
                path: PathBuf::from("/p/y"),
                mode: 0o2755,
                stripped: false,
                error: Some("Permission denied".into()),
            },
        ]);
        assert_eq!(l.len(), 3);
        assert!(l[1].contains("/p/bin/x\\u{1b}]52;c;AAAA\\u{7}"), "{}", l[1]);
        assert!(l[1].contains("removed (now 755)"), "{}", l[1]);
        assert!(l[2].contains("could NOT remove") && l[2].contains("chmod ug-s"));
        assert!(l.iter().all(|x| !x.contains('\x1b')));
    }
}
