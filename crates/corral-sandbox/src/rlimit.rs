//! The best-effort fallback when no cgroup can enforce a limit (`limits.enforce =
//! "best-effort"`): per-process resource limits, applied in the jail's child before exec.
//!
//! They are weaker than cgroups, and corral says so on stderr when it falls back:
//! - memory → `RLIMIT_DATA`, not `RLIMIT_AS`. Since Linux 4.7 RLIMIT_DATA counts the data
//!   segment and every private writable mapping, i.e. what a process really allocates.
//!   RLIMIT_AS counts address space, and V8 (Node), Go and the JVM reserve many gigabytes they
//!   never touch, so an RLIMIT_AS of "4g" breaks them at start. Either way the limit is per
//!   process: ten processes may use ten times the figure, and shared mappings (shared
//!   anonymous memory, memfd), SysV shared memory, the page cache and kernel memory are not
//!   counted (docs/hardening.md lists it).
//! - pids → `RLIMIT_NPROC`. It counts the processes of the real uid, not of the jail. Since
//!   Linux 5.14 the count is kept per user namespace (ucounts), so inside the jail's own user
//!   namespace it is mostly the jail's processes; but it is not applied at all to a caller whose
//!   uid is 0 on the host, and on older kernels every process of the user counts.
//! - cpus → no rlimit expresses a CPU share (`RLIMIT_CPU` is total CPU seconds, then a kill),
//!   so a cpus limit is not enforced at all without a cgroup.

use std::io;

use corral_policy::plan::Limits;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RlimitError {
    #[error("rlimit: setrlimit({resource}, {value}) failed: {cause}")]
    Set {
        resource: &'static str,
        value: u64,
        cause: io::Error,
    },
}

/// Human lines for stderr that say what the fallback does and does not do for these limits.
pub fn describe_fallback(limits: &Limits) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(m) = limits.memory {
        out.push(format!(
            "memory limit {m} bytes applied per process as RLIMIT_DATA (not a total for the jail, and shared mappings and SysV shared memory are not counted; no cgroup)"
        ));
    }
    if let Some(p) = limits.pids {
        out.push(format!(
            "pids limit {p} applied as RLIMIT_NPROC (counted per user, not per jail; not applied to root)"
        ));
    }
    if let Some(c) = limits.cpus {
        out.push(format!(
            "cpus limit {c} NOT enforced (only a cgroup can limit CPU share)"
        ));
    }
    out
}

/// Apply the fallback rlimits to the calling process (allocation-free: safe between fork and
/// exec). A `cpus` limit has no rlimit equivalent and is ignored here; see
/// [`describe_fallback`].
pub fn apply(limits: &Limits) -> Result<(), RlimitError> {
    if let Some(m) = limits.memory {
        set(libc::RLIMIT_DATA, "RLIMIT_DATA", m)?;
    }
    if let Some(p) = limits.pids {
        set(libc::RLIMIT_NPROC, "RLIMIT_NPROC", p)?;
    }
    Ok(())
}

/// No core dumps (hard and soft `RLIMIT_CORE` 0), for a process under the name gate: with a
/// `core_pattern` naming the file after the program (`%e`), a process could name a file
/// `objects` without a syscall the gate sees. Allocation-free.
pub fn no_core_dumps() -> io::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Set the soft `RLIMIT_NOFILE` to `soft` (never above the hard limit), keeping the hard
/// limit: the caller's own soft limit, given back to the jail's command after corral raised
/// its own. Allocation-free.
pub fn restore_nofile_soft(soft: u64) -> Result<(), RlimitError> {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct, which we provide.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) };
    let lim = libc::rlimit {
        rlim_cur: soft.min(cur.rlim_max),
        rlim_max: cur.rlim_max,
    };
    // SAFETY: setrlimit reads one rlimit struct, which we provide.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(RlimitError::Set {
            resource: "RLIMIT_NOFILE",
            value: soft,
            cause: io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn set(
    resource: libc::__rlimit_resource_t,
    name: &'static str,
    value: u64,
) -> Result<(), RlimitError> {
    // Never raise a hard limit the caller already has below ours (that needs privilege).
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct, which we provide.
    unsafe { libc::getrlimit(resource, &mut cur) };
    let v = value.min(cur.rlim_max);
    let lim = libc::rlimit {
        rlim_cur: v,
        rlim_max: v,
    };
    // SAFETY: setrlimit reads one rlimit struct, which we provide.
    if unsafe { libc::setrlimit(resource, &lim) } != 0 {
        return Err(RlimitError::Set {
            resource: name,
            value: v,
            cause: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The part of `limits` a cgroup did not take (what [`apply`] must do in the child).
pub fn residual(limits: &Limits, cgroup: Option<&crate::cgroup::JailCgroup>) -> Limits {
    let enforced = cgroup.map(|c| c.enforced()).unwrap_or_default();
    Limits {
        memory: limits.memory.filter(|_| !enforced.memory),
        cpus: limits.cpus.filter(|_| !enforced.cpus),
        pids: limits.pids.filter(|_| !enforced.pids),
        enforce: limits.enforce,
        built_in: limits.built_in,
    }
}
