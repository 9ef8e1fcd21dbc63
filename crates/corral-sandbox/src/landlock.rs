//! Landlock: the second wall around the filesystem.
//!
//! The mount namespace already shows the jail only what the Plan names. Landlock restates the
//! same view as access rights enforced by the kernel on every open, so that a mistake in the
//! mount set-up (a bind that exposes more than meant, a path reachable through /proc/PID/root
//! of a process outside, a file descriptor passed in) still does not give access beyond the
//! Plan. It is called in the child after pivot_root, so every path is the jail's own.
//!
//! Rights: read and execute on the Plan's read-only mounts (system directories, curated /etc,
//! `filesystem.read_only`) and /proc; everything on the project (when read-write), home, the
//! read-write binds and state directories, /tmp and /dev/shm; read, write and device ioctls on
//! the rest of /dev (the null, zero, random, tty and pty nodes the backend creates; creating
//! nodes stays denied); and directory listing (names, not contents) from / down, so `ls /`
//! works in the jail's root of mount points. Landlock rights only add up along a hierarchy, so
//! paths that are read-only inside a read-write project (`protect`) rely on their read-only
//! bind mount, and masked files on the mount that hides them.
//!
//! ABI 6 scopes are requested too: the jail cannot connect to abstract unix sockets created
//! outside it (the host's X11, D-Bus and similar listeners, relevant with `network.mode =
//! "host"`, where the jail shares the host's network namespace) and cannot signal processes
//! outside it. ptrace of processes outside the Landlock domain is refused by every ABI.
//!
//! The ABI is negotiated best effort: an older kernel enforces what it knows and the returned
//! [`LandlockStatus`] says what that was; the caller reports it (and `corral doctor` explains).

use std::path::{Path, PathBuf};

use ::landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use corral_policy::plan::{Access as Mode, MountKind, Plan};
use serde::Serialize;
use thiserror::Error;

/// The newest ABI corral's rules are written and tested for.
const TARGET_ABI: ABI = ABI::V6;

#[derive(Debug, Error)]
pub enum LandlockError {
    #[error("landlock: {step} failed: {cause}")]
    Ruleset {
        step: &'static str,
        cause: ::landlock::RulesetError,
    },
    #[error("landlock: opening {path} for a rule failed: {cause}")]
    Path {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// How much of the requested restriction the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Enforcement {
    /// Every right corral asked for is enforced.
    Full,
    /// An older ABI: some rights (e.g. truncate, refer, device ioctls, the scopes) are not.
    Partial,
    /// The kernel has no Landlock (or it is disabled): nothing is enforced.
    None,
}

/// What [`restrict`] achieved, for the exit summary, the audit log and `corral doctor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LandlockStatus {
    /// The kernel's Landlock ABI (`None`: not available).
    pub kernel_abi: Option<u32>,
    pub enforcement: Enforcement,
    /// Abstract unix sockets and signals scoped to the jail (ABI 6).
    pub scoped: bool,
    /// Rule paths that do not exist in the jail (skipped; nothing is granted there).
    pub skipped: Vec<PathBuf>,
}

/// The kernel's Landlock ABI version, by asking it (`landlock_create_ruleset` with
/// `LANDLOCK_CREATE_RULESET_VERSION`). `None` when Landlock is absent or disabled.
pub fn kernel_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_ulong = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the syscall only
    // returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as u32)
}

/// What [`restrict`] will achieve on this kernel, without restricting anything: for the parent
/// (which cannot see the child's result) to report in the run's start line and audit record.
pub fn expected() -> LandlockStatus {
    let kernel_abi = kernel_abi();
    let enforcement = match kernel_abi {
        None => Enforcement::None,
        Some(v) if v >= 6 => Enforcement::Full,
        Some(_) => Enforcement::Partial,
    };
    LandlockStatus {
        kernel_abi,
        enforcement,
        scoped: kernel_abi.is_some_and(|v| v >= 6),
        skipped: Vec::new(),
    }
}

/// One rule: a path and the rights beneath it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub path: PathBuf,
    pub access: RuleAccess,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleAccess {
    /// List directories only (no file contents).
    List,
    /// Read and execute.
    Read,
    /// Everything.
    Write,
    /// Read, write and device ioctls on existing nodes; no creating or removing.
    Device,
}

/// The rules for a Plan, in the jail's own paths. Pure, so it is tested whole.
pub fn rules(plan: &Plan) -> Vec<Rule> {
    let mut out = Vec::new();
    // Each (path, access) once; a set, not a search of `out` per rule (a Plan has dozens).
    let mut seen = std::collections::HashSet::new();
    let mut push = |path: &Path, access| {
        if seen.insert((path.to_path_buf(), access)) {
            out.push(Rule {
                path: path.to_path_buf(),
                access,
            });
        }
    };
    for m in &plan.mounts {
        match m.kind {
            MountKind::Bind(Mode::Ro) => push(&m.target, RuleAccess::Read),
            MountKind::Bind(Mode::Rw) | MountKind::Tmpfs | MountKind::Overlay { .. } => {
                push(&m.target, RuleAccess::Write)
            }
        }
    }
    match plan.project.access {
        Mode::Rw => push(&plan.project.root, RuleAccess::Write),
        Mode::Ro => push(&plan.project.root, RuleAccess::Read),
    }
    push(&plan.home, RuleAccess::Write);
    push(Path::new("/tmp"), RuleAccess::Write);
    push(Path::new("/dev/shm"), RuleAccess::Write);
    push(Path::new("/dev"), RuleAccess::Device);
    push(Path::new("/proc"), RuleAccess::Read);
    // Directory listings of the whole tree, so `ls /` and `find / -name ...` work: the jail's
    // root is a fresh tmpfs holding only the Plan's mount points, and a listing shows names,
    // never contents.
    push(Path::new("/"), RuleAccess::List);
    out
}

fn rights(access: RuleAccess, is_dir: bool) -> BitFlags<AccessFs> {
    let all = match access {
        RuleAccess::List => AccessFs::ReadDir.into(),
        RuleAccess::Read => AccessFs::from_read(TARGET_ABI),
        RuleAccess::Write => AccessFs::from_all(TARGET_ABI),
        RuleAccess::Device => {
            AccessFs::from_read(TARGET_ABI)
                | AccessFs::WriteFile
                | AccessFs::Truncate
                | AccessFs::IoctlDev
        }
    };
    if is_dir {
        all
    } else {
        all & AccessFs::from_file(TARGET_ABI)
    }
}

/// Restrict the calling thread (and what it execs) to the Plan's filesystem view, with the
/// ABI 6 scopes. Call after pivot_root, before the seccomp filter (which does not deny the
/// Landlock syscalls, but runs last by design). Sets no_new_privs.
pub fn restrict(plan: &Plan) -> Result<LandlockStatus, LandlockError> {
    restrict_rules(&rules(plan))
}

/// [`restrict`], with every right beneath `record`: the run's change record, a directory on
/// the host that PID 1 alone holds a descriptor of (no path in the jail's mount tree leads
/// there), where the name gate keeps what the jail changes (corral-changes).
pub fn restrict_with_record(
    plan: &Plan,
    record: Option<std::os::fd::BorrowedFd>,
) -> Result<LandlockStatus, LandlockError> {
    restrict_rules_and(&rules(plan), record)
}

/// [`restrict`] with explicit rules.
pub fn restrict_rules(rules: &[Rule]) -> Result<LandlockStatus, LandlockError> {
    restrict_rules_and(rules, None)
}

fn restrict_rules_and(
    rules: &[Rule],
    record: Option<std::os::fd::BorrowedFd>,
) -> Result<LandlockStatus, LandlockError> {
    let kernel_abi = kernel_abi();
    let step = |step: &'static str| {
        move |source| LandlockError::Ruleset {
            step,
            cause: source,
        }
    };
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .map_err(step("handling filesystem access"))?
        .scope(Scope::from_all(TARGET_ABI))
        .map_err(step("scoping abstract unix sockets and signals"))?
        .create()
        .map_err(step("creating the ruleset"))?;
    let mut skipped = Vec::new();
    for r in rules {
        // One walk of the path: the rule's descriptor (O_PATH, symlinks followed, as
        // `PathFd` opens it), and its type from that descriptor.
        let held = crate::mounts::open_path(&r.path)
            .map(std::fs::File::from)
            .and_then(|f| f.metadata().map(|m| (f, m)));
        let (fd, meta) = match held {
            Ok(held) => held,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                skipped.push(r.path.clone());
                continue;
            }
            Err(source) => {
                return Err(LandlockError::Path {
                    path: r.path.clone(),
                    cause: source,
                });
            }
        };
        created = created
            .add_rule(PathBeneath::new(fd, rights(r.access, meta.is_dir())))
            .map_err(step("adding a rule"))?;
    }
    if let Some(dir) = record {
        created = created
            .add_rule(PathBeneath::new(dir, rights(RuleAccess::Write, true)))
            .map_err(step("adding the change record's rule"))?;
    }
    let status = created
        .restrict_self()
        .map_err(step("restricting the process"))?;
    let enforcement = match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        RulesetStatus::NotEnforced => Enforcement::None,
    };
    Ok(LandlockStatus {
        kernel_abi,
        enforcement,
        scoped: enforcement != Enforcement::None && kernel_abi.is_some_and(|v| v >= 6),
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_for_a_minimal_plan() {
        let plan = Plan::minimal(
            Path::new("/p/proj"),
            Path::new("/home/u"),
            vec!["true".into()],
        );
        let got = rules(&plan);
        let mut expected: Vec<Rule> = corral_policy::plan::system_mounts()
            .into_iter()
            .map(|m| Rule {
                path: m.target,
                access: RuleAccess::Read,
            })
            .collect();
        for (p, a) in [
            ("/home/u", RuleAccess::Write),
            ("/p/proj", RuleAccess::Write),
            ("/tmp", RuleAccess::Write),
            ("/dev/shm", RuleAccess::Write),
            ("/dev", RuleAccess::Device),
            ("/proc", RuleAccess::Read),
            ("/", RuleAccess::List),
        ] {
            expected.push(Rule {
                path: p.into(),
                access: a,
            });
        }
        similar_asserts::assert_eq!(got, expected);
    }

    #[test]
    fn file_rules_get_file_rights_only() {
        assert!(!rights(RuleAccess::Write, false).contains(AccessFs::MakeDir));
        assert!(rights(RuleAccess::Write, true).contains(AccessFs::MakeDir));
        assert!(!rights(RuleAccess::Read, true).contains(AccessFs::WriteFile));
        assert!(!rights(RuleAccess::Device, true).contains(AccessFs::MakeChar));
    }
}
