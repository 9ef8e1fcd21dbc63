//! corral's native Linux backend: namespaces, mounts, seccomp, Landlock, cgroups, a tiny init,
//! a pty relay.
//!
//! ```text
//! corral (spawn.rs) ──fork/exec── set-up process (child.rs) ──fork── PID 1 ──fork── command
//!   relay, signals,              unshare, id maps, lo,          mounts.rs,      rlimits, Landlock,
//!   listeners in hand            listeners → corral             pivot_root,     caps, seccomp,
//!                                                               reap, forward   exec
//! ```
//!
//! [`spawn`] takes a [`Plan`](corral_policy::plan::Plan) and returns a [`RunningJail`] whose
//! [`JailNet`] holds the listeners made inside the jail's network namespace; [`RunningJail::wait`]
//! relays the terminal and signals and returns the command's exit code. The binary that calls
//! `spawn` must call [`init_if_requested`] first thing in `main` (it takes over when the first argument is [`INIT_ARG`]; corral's `main`
//! does).
//!
//! Invariants (see docs/ARCHITECTURE.md, "Invariants", and docs/backends.md): the jail dies with corral
//! (PR_SET_PDEATHSIG on the set-up process and on PID 1, PID 1's death ends the PID
//! namespace); no host path the Plan does not name is visible (the root is a fresh tmpfs and
//! the old root is detached); no jail process holds the user's terminal or corral's listeners.

pub mod caps;
pub mod cgroup;
mod child;
mod error;
mod gatexec;
pub mod landlock;
mod mounts;
mod netns;
mod placeholder;
pub mod probe;
mod review;
pub mod rlimit;
pub mod seccomp;
mod sig;
mod spawn;
mod term;
pub mod termfilter;
pub mod termstatus;
mod ucounts;

/// The mountinfo reader the gate uses, for cgroup.rs, spawn.rs and gatexec.rs too.
use corral_namegate::mountinfo;

pub use error::JailError;
pub use gatexec::GATE_EXEC_ARG;
pub use netns::{JailNet, PROXY_PORT, STUB_LO_ADDRESS, STUB_POOL, SocketFactory, capture_ports};
pub use spawn::{
    Ending, JailExit, PlaceholderHold, PreparedJail, RunningJail, SpawnOptions, prepare,
    prepare_early, spawn,
};

/// The first argument that makes the corral binary the jail's set-up process.
pub const INIT_ARG: &str = "__corral-jail-init";

/// Exit code for corral's own errors, including a failed jail set-up.
pub const EXIT_SETUP_FAILED: i32 = 125;
/// Exit code when the command exists but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Exit code when the command is not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// Run as the jail's set-up process if this process was started as one (first argument
/// [`INIT_ARG`]), or as a container's name gate ([`GATE_EXEC_ARG`], gatexec.rs); otherwise
/// return. Call first thing in `main`, before any thread starts.
pub fn init_if_requested() {
    let first = std::env::args_os().nth(1);
    if first.as_ref().is_some_and(|a| a == INIT_ARG) {
        child::init_main();
    }
    if first.is_some_and(|a| a == GATE_EXEC_ARG) {
        gatexec::main(std::env::args_os().skip(2).collect());
    }
}
