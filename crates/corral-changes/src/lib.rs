//! corral's change record: what each run changed in the project, kept outside it, and the
//! undo that puts the project back (docs/undo.md).
//!
//! - [`Store::open`] the project's store under corral's state directory
//!   (`STATE_DIR/changes/PROJECT_KEY/`), [`Store::begin`] a run: a [`RunRecord`], whose
//!   directory descriptor ([`RunRecord::dir_fd`]) the jail's PID 1 holds;
//! - [`RunRecord::before_change`] before each change of a name in the project (the name gate
//!   calls it), [`RunRecord::before_rename`] before a rename;
//! - [`Store::finish`] once the run ended: what each path is then ([`Store::finish_listed`]
//!   also gives the paths that changed: the run's change summary);
//! - [`Store::runs`] for `corral log --runs`, [`undo`] for `corral undo`.
//!
//! Several writers may keep one run's record (the run's jail and its executor commands'
//! jails, each a [`RunRecord::from_dir_fd`] of the same directory): each appends a path's line
//! before it changes the path, so the first line of a path is its state before the run, and
//! each kept copy takes the first free blob name.

pub mod bytes;
pub mod path;
mod record;
mod state;
mod store;
mod sys;
mod undo;

pub use record::{Place, RunRecord};
pub use state::{Stat, State};
pub use store::{Change, Retention, RunInfo, RunMeta, Store};
pub use undo::{Conflict, Options, Report, UndoError, undo};

use std::path::Path;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    #[error("cannot {what} {path}: {cause}")]
    Io {
        what: &'static str,
        path: String,
        cause: std::io::Error,
    },
    #[error("the change record at {path} is damaged: {why}")]
    Damaged { path: String, why: String },
    #[error("no run {0:?} in this project's change record (`corral log --runs` lists them)")]
    NoRun(String),
}

impl ChangesError {
    pub(crate) fn io(what: &'static str, path: &Path, cause: std::io::Error) -> ChangesError {
        ChangesError::Io {
            what,
            path: path.display().to_string(),
            cause,
        }
    }
}

pub type Result<T> = std::result::Result<T, ChangesError>;

#[cfg(test)]
mod tests;
