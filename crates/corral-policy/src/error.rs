//! The policy engine's errors. Every problem found in a policy file names the file, the line and
//! the column, and says what was expected.

use std::path::PathBuf;

/// Why a policy could not be loaded or resolved.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A problem at a place in a policy file (syntax, unknown key, wrong type, bad value).
    #[error("{}:{line}:{col}: {message}", file.display())]
    At {
        file: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
    /// A problem with a value that did not come from a file (a command-line flag, a profile name).
    #[error("{0}")]
    Invalid(String),
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Some other I/O step of resolution failed (creating the scratch directory, walking the
    /// project).
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PolicyError {
    /// An error at a byte offset of `text`, the content of `file`.
    pub(crate) fn at(file: &std::path::Path, text: &str, offset: usize, message: String) -> Self {
        let (line, col) = line_col(text, offset);
        PolicyError::At {
            file: file.to_path_buf(),
            line,
            col,
            message,
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..text.floor_char_boundary_compat(offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        while i > 0 && !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}
