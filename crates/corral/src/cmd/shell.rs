//! `corral shell [PROFILE]`: an interactive shell in the jail the profile would get.

use std::process::ExitCode;

use crate::cli::ShellArgs;

/// `early`: the jail's set-up process main() forked, if it did.
pub fn shell(
    args: ShellArgs,
    early: Option<corral_sandbox::PreparedJail>,
) -> anyhow::Result<ExitCode> {
    let shell = if std::path::Path::new("/bin/bash").exists() {
        "bash"
    } else {
        "sh"
    };
    super::jail::run_jail(
        args.profile,
        &args.jail,
        vec![shell.to_string(), "-i".into()],
        early,
    )
}
