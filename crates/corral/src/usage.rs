//! How corral and corral-proxy end on a command line they cannot parse, and on a closed
//! standard output (SPEC section 2: 125 is corral's own error, usage errors included, so a
//! wrapper can tell corral's refusal from the command's own exit 2).
//!
//! Shared by both executables (each includes this file).

use std::io::Write;

/// corral's own errors (SPEC section 2): distinct from any child's exit status.
pub const EXIT_CORRAL_ERROR: u8 = 125;

/// Parse the process's command line. `--help` and `--version` print to standard output and
/// end with 0; every usage error prints clap's message on standard error and ends with 125.
/// Either way the exit code is returned for the caller to end with.
pub fn parse<C: clap::Parser>() -> Result<C, u8> {
    C::try_parse().map_err(|e| {
        // A closed pipe (`corral --help | head -1`) is not worth a message.
        let _ = e.print();
        let _ = std::io::stdout().flush();
        if e.use_stderr() { EXIT_CORRAL_ERROR } else { 0 }
    })
}

/// [`parse`] of `args` (program name first) with the parser `cmd`, whose usage lines name the
/// program `bin_name`: for a command parsed on its own (`corral exec`, main.rs).
#[allow(dead_code)] // corral only
pub fn parse_from<C: clap::FromArgMatches>(
    cmd: clap::Command,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<C, u8> {
    let finish = |e: clap::Error| {
        let _ = e.print();
        let _ = std::io::stdout().flush();
        if e.use_stderr() { EXIT_CORRAL_ERROR } else { 0 }
    };
    let mut matches = cmd.try_get_matches_from(args).map_err(finish)?;
    C::from_arg_matches_mut(&mut matches).map_err(finish)
}

/// Whether `err` is, or was caused by, a write to a closed pipe: the reader (`| head`) has
/// what it wanted, and corral ends quietly with 0 instead of a message or a panic.
#[allow(dead_code)] // corral only
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
