//! The `corral` binary: parses the command line and wires the crates together. Behaviour lives
//! in the libraries; each command's wiring lives in `cmd/`.

/// `print!` for what a command prints as its output: a write error (a closed pipe: `| head`)
/// is returned, for main to end quietly on, instead of the panic `print!` would give.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `println!` for what a command prints as its output (see [`out!`]).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod cli;
mod cmd;
mod usage;

use std::process::ExitCode;

pub use usage::EXIT_CORRAL_ERROR;

fn main() -> ExitCode {
    // The jail's set-up process, when it is this binary re-executed: it never reaches the CLI.
    corral_sandbox::init_if_requested();
    // `corral exec`: its own parser alone (cli::ExecCli), and nothing else of corral's start.
    if std::env::args_os().nth(1).is_some_and(|a| a == "exec") {
        return cmd::exec_main();
    }
    // `corral run` and `corral shell` serve the jail's proxy: two descriptors a tunnel, so the
    // soft open-file limit goes up to the hard one, first (the jail's command gets the original
    // back: SpawnOptions::nofile_soft).
    if cmd::serves_a_proxy(std::env::args_os())
        && let Err(e) = corral_net::bounds::raise_nofile_limit()
    {
        eprintln!("corral: cannot raise the open-file limit: {e}");
    }
    // A command that runs a native jail forks the jail's set-up process now, before anything
    // is read (corral_sandbox::prepare_early says what it holds): it is ready when the Plan is,
    // and handed to the run that starts the jail.
    let early = match cmd::starts_a_jail(std::env::args_os()) {
        true => corral_sandbox::prepare_early(),
        false => None,
    };
    let cli = match usage::parse::<cli::Cli>() {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    match cmd::dispatch(cli, early) {
        Ok(code) => code,
        Err(err) if usage::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("corral: {err:#}");
            ExitCode::from(EXIT_CORRAL_ERROR)
        }
    }
}
