//! corral's run as a library. A run starts from a [`Trusted<Plan>`]: a policy request resolved
//! and passed through the trust gate ([`trust::resolve`], then [`trust::Resolved::gate`] or
//! [`trust::Resolved::gate_in_worktree`]), the only way to get one. The `corral` binary parses
//! the command line, prints, and maps what comes back to exit codes.

pub mod control;
pub mod engine;
pub mod executor;
pub mod held;
pub mod kube;
pub mod live;
pub mod native;
pub mod record;
pub mod review;
pub mod secrets;
pub mod signin;
pub mod target;
pub mod trust;
pub mod worktrees;

pub use trust::{Resolved, Trusted};
