//! `corral-proxy`: the egress proxy as an executable of its own, what `corral proxy` runs when
//! this file is next to it. The same flags and the same code (`corral_net::standalone`) as
//! `corral proxy`, in a process that maps only the proxy's code: the container setup's proxy and
//! a long-running standalone proxy stay small.

use std::process::ExitCode;

use clap::Parser;

#[path = "../proxy_args.rs"]
mod proxy_args;

/// corral's own errors (SPEC section 2), as `corral` exits with them.
const EXIT_CORRAL_ERROR: u8 = 125;

#[derive(Debug, Parser)]
#[command(
    name = "corral-proxy",
    version,
    about = "corral's egress proxy alone: the same as `corral proxy`, in a smaller process",
    long_about = "corral's egress proxy alone (the squid replacement in the container setup): \
                  the [network] rules of a policy file, reloaded on SIGHUP and when the file \
                  changes, every decision in the audit log. The same options and code as \
                  `corral proxy`, which executes this file when it is next to the corral \
                  executable."
)]
struct Cli {
    #[command(flatten)]
    args: proxy_args::ProxyArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match corral_net::standalone::run(cli.args.options()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corral: {}", corral_net::standalone::error_chain(&e));
            ExitCode::from(EXIT_CORRAL_ERROR)
        }
    }
}
