//! `corral proxy [--listen ADDR|unix:PATH] [--policy FILE]`: the egress proxy alone (the squid
//! replacement of the container setup). The proxy itself is `corral_net::standalone`; when the
//! lean `corral-proxy` executable sits next to this one, `corral proxy` executes it with the
//! same options (the same code in a process that never mapped the rest of corral), else it runs
//! the proxy in this process.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;

use crate::cli::ProxyArgs;

/// The lean proxy executable's file name.
pub const LEAN_BIN: &str = "corral-proxy";

/// `corral-proxy` in the directory of this executable, if it is there.
fn lean_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.join(LEAN_BIN);
    path.is_file().then_some(path)
}

pub fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    if let Some(lean) = lean_binary() {
        use std::os::unix::process::CommandExt;
        let err = std::process::Command::new(&lean)
            .arg0(LEAN_BIN)
            .args(args.argv())
            .exec();
        // Only reached when the exec failed: the proxy still runs, in this process.
        eprintln!(
            "corral proxy: cannot execute {} ({err}); running the proxy in this process",
            lean.display()
        );
    }
    corral_net::standalone::run(args.options())
        .map_err(|e| anyhow!(corral_net::standalone::error_chain(&e)))?;
    Ok(ExitCode::SUCCESS)
}
