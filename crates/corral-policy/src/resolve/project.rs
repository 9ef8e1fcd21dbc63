//! Which directory is the project: `--scratch`, `--project DIR`, the git top level or the
//! working directory, and the directories that are never one.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::PolicyError;
use crate::plan::ProjectSource;

use super::{Request, real_path};

/// The git root of `dir` (the nearest ancestor holding `.git`, a directory or a worktree's
/// file), else `dir` itself.
pub fn project_root(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| d.join(".git").symlink_metadata().is_ok())
        .unwrap_or(dir)
        .to_path_buf()
}

/// Directories that are never a project unless named with `--project`, nor any directory that
/// contains one: the system's own trees, other users' homes, and shared places full of other
/// programs' files and sockets.
pub(super) const NEVER_A_PROJECT: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/local",
    "/var",
    "/var/lib",
    "/var/tmp",
];

/// Choose the project directory: `--scratch`, `--project DIR`, else the enclosing git
/// repository's top level, else `cwd`. A directory chosen by the last two rules is refused when
/// it is not a sensible project ([`why_not_a_project`]).
pub(super) fn choose_project(
    req: &Request,
    scratch: Scratch,
    cwd: &Path,
    home: &Path,
    corral_dirs: &[PathBuf],
) -> Result<(PathBuf, ProjectSource), PolicyError> {
    match (&req.flags.project, req.flags.scratch) {
        (Some(_), true) => Err(PolicyError::Invalid(
            "--project and --scratch name two different projects: pass one of them".into(),
        )),
        (None, true) => Ok((scratch_dir(&req.env, scratch)?, ProjectSource::Scratch)),
        (Some(dir), false) => {
            let dir = cwd.join(dir);
            let real = dir.canonicalize().map_err(|source| PolicyError::Io {
                what: "--project: cannot resolve the directory",
                path: dir.clone(),
                source,
            })?;
            if !real.is_dir() {
                return Err(PolicyError::Invalid(format!(
                    "--project {}: not a directory",
                    dir.display()
                )));
            }
            Ok((real, ProjectSource::ProjectFlag))
        }
        (None, false) => {
            let top = project_root(cwd);
            let source = if top.join(".git").symlink_metadata().is_ok() {
                ProjectSource::GitTopLevel
            } else {
                ProjectSource::CurrentDirectory
            };
            if let Some(why) = why_not_a_project(&top, home, corral_dirs, &req.env) {
                return Err(PolicyError::Invalid(format!(
                    "refusing to make {} the project: it {why}, and the project is mounted read-write \
                     into the jail (chosen as {}). Run corral from your project's directory, or \
                     name the directory the agent may work on: --project DIR (exactly that \
                     directory), or --scratch (a fresh empty directory, removed afterwards)",
                    top.display(),
                    source.describe()
                )));
            }
            Ok((top, source))
        }
    }
}

/// Why `dir` (absolute, symlinks resolved) is not a sensible project, if it is not: it is or
/// contains the user's home, corral's own config or state directory, a system directory, or
/// the user's runtime directory (sockets).
pub fn why_not_a_project(
    dir: &Path,
    home: &Path,
    corral_dirs: &[PathBuf],
    env: &BTreeMap<String, String>,
) -> Option<String> {
    // Each place as written and as it really is (HOME=/home/u with /home -> /var/home).
    let holds = |p: &Path| p.starts_with(dir) || real_path(p).starts_with(dir);
    if dir == Path::new("/") {
        return Some("is the root of the filesystem".into());
    }
    if holds(home) {
        return Some(if home == dir || real_path(home) == dir {
            "is your home directory (your keys, tokens and shell start-up files)".into()
        } else {
            format!("contains your home directory {}", home.display())
        });
    }
    for d in corral_dirs {
        if holds(d) {
            return Some(format!(
                "contains corral's own directory {} (your trust store, config or audit logs)",
                d.display()
            ));
        }
    }
    // As written first (/usr holds /usr, even where /bin really is /usr/bin).
    let system = NEVER_A_PROJECT
        .iter()
        .find(|sys| Path::new(sys).starts_with(dir))
        .or_else(|| NEVER_A_PROJECT.iter().find(|sys| holds(Path::new(sys))));
    if let Some(sys) = system {
        return Some(format!("is or contains the system directory {sys}"));
    }
    if let Some(run) = env.get("XDG_RUNTIME_DIR").filter(|r| r.starts_with('/'))
        && holds(Path::new(run))
    {
        return Some(format!(
            "contains your runtime directory {run} (the sockets of your session's services)"
        ));
    }
    None
}

/// What `--scratch` does to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scratch {
    /// Create the directory (`corral run`: the caller removes it when the run ends).
    Create,
    /// Only name it, below the real `TMPDIR` (`corral plan`: a plan runs nothing).
    NameOnly,
}

/// A fresh scratch directory for `--scratch` under `TMPDIR` (or /tmp), created or only named.
pub(super) fn scratch_dir(
    env: &BTreeMap<String, String>,
    scratch: Scratch,
) -> Result<PathBuf, PolicyError> {
    let base = env
        .get("TMPDIR")
        .filter(|t| t.starts_with('/'))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let mut buf = [0u8; 8];
    getrandom_fill(&mut buf);
    let name: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    if scratch == Scratch::NameOnly {
        let base = base.canonicalize().map_err(|source| PolicyError::Io {
            what: "cannot resolve the directory for the scratch directory (TMPDIR)",
            path: base.clone(),
            source,
        })?;
        return Ok(base.join(format!("corral-scratch-{name}")));
    }
    let dir = base.join(format!("corral-scratch-{name}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|source| PolicyError::Io {
            what: "cannot create the scratch directory",
            path: dir.clone(),
            source,
        })?;
    dir.canonicalize().map_err(|source| PolicyError::Io {
        what: "cannot resolve the scratch directory",
        path: dir.clone(),
        source,
    })
}

/// Unpredictable bytes from the kernel (/dev/urandom), for names only.
pub(super) fn getrandom_fill(buf: &mut [u8]) {
    use std::io::Read;
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok();
    if !filled {
        // Names only need to be unique: fall back to time and pid.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ u128::from(std::process::id());
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (t >> (8 * (i % 16))) as u8;
        }
    }
}
