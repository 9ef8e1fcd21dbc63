//! corral's run lifecycle, the same for every backend: a [`Session`] begins (jail id, audit
//! log, change baseline, git snapshot), runs the Plan on a [`Backend`] (the native jail or a
//! container engine), and finishes (the git, state-guard and set-id checks, the change summary,
//! the exit or error record). The CLI only wires a backend to it.
//!
//! The checks are host-side and look at the project and the binds, which every backend shares
//! with the host, so a container run gets the same checks as a native one.

pub mod changes;
pub mod endlines;
pub mod gitguard;
pub mod hostcode;
pub mod hstate;
pub mod journal;
pub mod replaced;
pub mod review;
pub mod runplan;
mod session;
pub mod setid;

pub use runplan::{RunInputs, RunPlan};
pub use session::{
    Backend, Baselined, Checked, Ended, Scope, Session, StartingSession, first_run_line,
};
