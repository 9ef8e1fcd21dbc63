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
        serde_json::to_writer_pretty(&mut out, &report).context("writing the report")?;
        writeln!(out)?;
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
    let path = match r.limits_path {
        "cgroup-v2-delegated" => {
            "a cgroup v2 subtree delegated to you: limits are enforced by a cgroup"
        }
        "cgroup-v1-writable" => {
            "cgroup v1 controllers writable by you: limits are enforced by cgroups"
        }
        _ => {
            "rlimit fallback: no cgroup for you here (corral does not ask systemd for a delegated \
             scope itself); built-in defaults apply per process, limits you set follow \
             limits.enforce"
        }
    };
    s += &format!("\n  limits path: {path}\n");
    s += &format!("\n{} (exit {})\n", r.summary(), r.exit_code());
    s
}
