//! corral's name gate: while a jail runs, its PID 1 performs every file-creating syscall of the
//! jail (seccomp user notifications), refusing names that would make a git repository where
//! the host sees them, names `filesystem.hide` matches in the project, and writes through
//! protected files the host replaced (namegate.rs, namegate/protected.rs). In a run that keeps
//! a change record ([`Gate::with_record`], corral-changes) it also performs removals and mode
//! changes, and keeps what each name of the project was before it changes it
//! (namegate/record.rs).
//!
//! corral-sandbox wires it in: the native jail's PID 1 ([`Gate::prepare`], [`Gate::serve`];
//! child.rs) and a container's entrypoint (gatexec.rs); it installs the gate's seccomp filter
//! in the command's process and sends its listener here ([`send_listener`]).

pub mod mountinfo;
mod namegate;

pub use namegate::sys::{Real, Sys};
pub use namegate::{
    CAP_SYS_PTRACE, Caller, Gate, Hidden, Recorder, SYS_FCHMODAT2, continues, receive_listener,
    send_listener,
};
