//! `corral doctor`: what this host supports, found by trying, and what each missing piece
//! disables. Exit 0: the native backend runs with strict limits and every hardening layer;
//! 1: it runs, degraded (see the report); 2: it cannot run here.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use corral_sandbox::probe::{self, Report, Status};

use crate::cli::DoctorArgs;

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = probe::run();
    let mut out = std::io::stdout().lock();
    if args.json {
        let json = serde_json::to_string_pretty(&report).context("cannot serialize the report")?;
        writeln!(out, "{json}")?;
    } else {
        out.write_all(render(&report).as_bytes())?;
    }
    Ok(ExitCode::from(report.exit_code()))
}

/// The human report.
pub fn render(r: &Report) -> String {
    let mut s = format!("corral doctor: {} {}, uid {}\n\n", r.kernel, r.arch, r.uid);
    for c in &r.checks {
        let tag = match c.status {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Missing => "MISSING",
            Status::Info => "info",
        };
        s += &format!("  {tag:<8} {:<16} {}\n", c.id, c.detail);
        if let Some(d) = &c.disables {
            s += &format!("  {:<8} {:<16} disables: {d}\n", "", "");
        }
        if let Some(f) = &c.fix {
            s += &format!("  {:<8} {:<16} fix: {f}\n", "", "");
        }
    }
    s += &format!("\n{} (exit {})\n", r.summary(), r.exit_code());
    s
}
