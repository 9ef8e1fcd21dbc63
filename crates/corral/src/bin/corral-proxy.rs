//! `corral-proxy`: the egress proxy as an executable of its own, what `corral proxy` runs when
//! this file is next to it. The same flags and the same code (`corral_net::standalone`) as
//! `corral proxy`, in a process that maps only the proxy's code: the container setup's proxy and
//! a long-running standalone proxy stay small.

use std::process::ExitCode;

#[path = "../proxy_args.rs"]
mod proxy_args;
#[path = "../usage.rs"]
mod usage;

use usage::EXIT_CORRAL_ERROR;

#[derive(Debug, clap::Parser)]
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
    let cli = match usage::parse::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    match corral_net::standalone::run(cli.args.options()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corral: {}", corral_net::standalone::error_chain(&e));
            ExitCode::from(EXIT_CORRAL_ERROR)
        }
    }
}
