//! One module per command. Each returns the process exit code, or an error printed as
//! `corral: ...` with exit 125.

use std::process::ExitCode;

use anyhow::bail;

use crate::cli::{Cli, Command};

mod generate;
mod rules;
mod shim;
mod doctor;
mod down;
pub mod engine_run;
mod image;
pub mod init;
pub mod log;
pub mod plan;
mod proxy;
mod run;
mod secrets;
mod shell;

/// A command whose capability has not landed yet: a clear error, never a fake success.
fn not_yet(what: &str) -> anyhow::Result<ExitCode> {
    bail!("`corral {what}` is not yet implemented in this version")
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Shell(args) => shell::shell(args),
        Command::Exec(_) => not_yet("exec"),
        Command::Serve(_) => not_yet("serve"),
        Command::Proxy(args) => proxy::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Init(args) => init::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Log(args) => log::run(args),
        Command::Image(cmd) => image::run(cmd),
        Command::Down(args) => down::run(args),
        Command::Shim(cmd) => shim::run(cmd),
        Command::Allow(args) => rules::run(rules::Rule::Allow, args),
        Command::Deny(args) => rules::run(rules::Rule::Deny, args),
        Command::Skill(_) => not_yet("skill"),
        Command::Generate(cmd) => generate::run(cmd),
    }
}
