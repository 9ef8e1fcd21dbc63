//! The one error type of the jail: every failure names the step and, where there is one, the path.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A set-up step failed (in corral or in the jail before exec). The cause is part of the
    /// message, not a separate `source`: the set-up process prints this alone, and an error
    /// chain (anyhow's `{:#}`) would otherwise print the cause twice.
    #[error("{step}{}: {cause}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Step {
        step: &'static str,
        path: Option<PathBuf>,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The plan cannot be run by this backend.
    #[error("{0}")]
    Plan(String),
    /// The jail's set-up process ended before the jail was ready; it printed why on stderr.
    #[error(
        "the jail's set-up ended before the jail was ready (exit status {0}); see the message above"
    )]
    SetupFailed(i32),
}

impl JailError {
    pub(crate) fn step(
        step: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> JailError {
        JailError::Step {
            step,
            path: None,
            cause: source.into(),
        }
    }

    pub(crate) fn at(
        step: &'static str,
        path: impl Into<PathBuf>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> JailError {
        JailError::Step {
            step,
            path: Some(path.into()),
            cause: source.into(),
        }
    }
}
