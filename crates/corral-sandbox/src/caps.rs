//! Dropping every capability, for the jail's child set-up.
//!
//! Inside its user namespace the jail's process starts with a full set of capabilities over
//! that namespace (which is how it can mount and pivot_root). Before exec they all go: the
//! bounding set (so no later exec of a file with capabilities, and no uid-0 exec, can gain
//! any), the ambient set, then inheritable, permitted and effective with one `capset`. The
//! securebits are locked where the kernel lets us (they keep uid 0 inside the jail from
//! meaning anything on exec), and no_new_privs is set, so setuid binaries do not elevate.

use std::io;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CapsError {
    #[error("capabilities: dropping capability {cap} from the bounding set failed: {cause}")]
    Bounding { cap: u32, cause: io::Error },
    #[error("capabilities: clearing the ambient set failed: {0}")]
    Ambient(io::Error),
    #[error("capabilities: capset (clear permitted, effective, inheritable) failed: {0}")]
    Capset(io::Error),
    #[error("capabilities: prctl(PR_SET_NO_NEW_PRIVS) failed: {0}")]
    NoNewPrivs(io::Error),
    #[error("capabilities: after dropping, {what} is still {value:#x}")]
    StillHeld { what: &'static str, value: u64 },
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Highest capability number we try; the kernel answers EINVAL beyond its own last one.
const CAP_MAX_TRY: u32 = 63;

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drop all capabilities of the calling thread and set no_new_privs. Allocation-free, so it
/// can run between fork/clone and exec.
pub fn drop_all() -> Result<(), CapsError> {
    reduce_to(None)
}

/// Keep only capability `cap` (below 32) in the calling thread, in its bounding, permitted and
/// effective sets, and set no_new_privs: the name gate's thread (namegate.rs) keeps
/// CAP_SYS_PTRACE over the jail's user namespace to read the memory of jail processes that are
/// not dumpable. A thread that does not hold `cap` (the gate in a container started with no
/// capabilities) ends with none.
pub fn keep_only(cap: u32) -> Result<(), CapsError> {
    let held = current()?.permitted & (1u64 << cap) != 0;
    reduce_to(held.then_some(cap))
}

/// Every capability but `keep` out of the bounding, ambient, inheritable, permitted and
/// effective sets, no_new_privs set; with nothing kept, the securebits locked too.
/// Allocation-free.
fn reduce_to(keep: Option<u32>) -> Result<(), CapsError> {
    let holds_nothing = holds_none()?;
    // Bounding set first: it needs CAP_SETPCAP, which goes with the capset below.
    for cap in (0..=CAP_MAX_TRY).filter(|&c| Some(c) != keep) {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break; // past the kernel's last capability
            }
            // EPERM without CAP_SETPCAP (the kernel checks that before the number): fine if
            // the capability is already out of the set; past the last one, READ says EINVAL.
            // SAFETY: prctl with integer arguments only.
            let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
            if held < 0 {
                break;
            }
            // Fine too for a thread that holds no capability at all (an unprivileged user's
            // process, a container's gate): the bounding set only limits what an execve may
            // grant, and no_new_privs, set below, lets execve grant nothing.
            if held != 0 && !holds_nothing {
                return Err(CapsError::Bounding { cap, cause: e });
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // EINVAL: a kernel before 4.3 has no ambient set, so nothing to clear.
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(CapsError::Ambient(e));
        }
    }
    if keep.is_none() {
        // Lock the securebits while CAP_SETPCAP is still held; a kernel or namespace that
        // refuses is not an error: with empty bounding and permitted sets there is nothing left
        // to regain.
        let bits = SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_NO_SETUID_FIXUP
            | SECBIT_NO_SETUID_FIXUP_LOCKED
            | SECBIT_KEEP_CAPS_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
        // SAFETY: prctl with integer arguments only.
        let _ = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) };
    }

    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let bit = keep.map_or(0, |c| 1u32 << c);
    let data = [
        CapData {
            effective: bit,
            permitted: bit,
            inheritable: 0,
        },
        CapData::default(),
    ];
    // SAFETY: capset reads a v3 header and two data structs, which we pass.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    if rc != 0 {
        return Err(CapsError::Capset(io::Error::last_os_error()));
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(CapsError::NoNewPrivs(io::Error::last_os_error()));
    }
    let now = current()?;
    let held = now.effective | now.permitted | now.inheritable;
    if held & !u64::from(bit) != 0 {
        return Err(CapsError::StillHeld {
            what: "the effective/permitted/inheritable set",
            value: held,
        });
    }
    Ok(())
}

/// Whether the calling thread holds no capability (effective, permitted, inheritable).
fn holds_none() -> Result<bool, CapsError> {
    let c = current()?;
    Ok(c.effective | c.permitted | c.inheritable == 0)
}

/// The calling thread's capability sets, as 64-bit masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSets {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
}

/// Read the calling thread's capability sets.
pub fn current() -> Result<CapSets, CapsError> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two data structs for a v3 header, which we provide.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(CapsError::Capset(io::Error::last_os_error()));
    }
    let join = |lo: u32, hi: u32| (hi as u64) << 32 | lo as u64;
    Ok(CapSets {
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}
