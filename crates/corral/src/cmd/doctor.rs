//! `corral doctor`: what this host supports, found by trying, and what each missing piece
//! disables. Exit 0: the native backend runs with strict limits and every hardening layer;
//! 1: it runs, degraded (see the report); 2: it cannot run here.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use corral_sandbox::probe::{self, Check, Report, Status};

use crate::cli::DoctorArgs;

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    // Runs whose corral was killed, in any project: their checks first (journal.rs).
    corral_session::journal::finish_unended(corral_session::journal::Which::All);
    let mut report = probe::run();
    report.checks.push(git_bare_repository());
    report.checks.push(super::undo::doctor_check());
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

/// Whether the user's git discovers bare repositories by itself. git takes any directory that
/// holds `HEAD`, `objects/` and `refs/` for a bare repository when it runs there or below and
/// reads its `config` (`core.fsmonitor`, `core.pager`, ...), unless `safe.bareRepository` is
/// `explicit` (git 2.38 and later). A jail can make one in any directory of the project; corral
/// disarms it when the run ends, but the user's prompt runs git there during the run.
fn git_bare_repository() -> Check {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir("/")
            .env("GIT_PAGER", "cat")
            .env_remove("GIT_DIR")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
    };
    let check = |status, detail: String, disables: Option<&str>, fix: Option<&str>| Check {
        id: "git_bare_repository",
        status,
        detail,
        disables: disables.map(str::to_string),
        fix: fix.map(str::to_string),
    };
    let Some(version) = git(&["--version"]).filter(|o| o.status.success()) else {
        return check(
            Status::Info,
            "git not found: nothing to check".into(),
            None,
            None,
        );
    };
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let disables = "with your git, a directory a jail turns into a bare repository (HEAD, \
                    objects/, refs/ and a config setting core.fsmonitor or core.pager) runs that \
                    command as soon as you (or your prompt) run git in it or below, during the \
                    run; corral disarms such a repository only when the run ends";
    let numbers: Vec<u32> = version
        .split_whitespace()
        .nth(2)
        .unwrap_or("")
        .split('.')
        .map_while(|n| n.parse().ok())
        .collect();
    if numbers.as_slice() < [2, 38].as_slice() {
        return check(
            Status::Info,
            format!("{version} has no safe.bareRepository (git 2.38 and later)"),
            Some(disables),
            Some(
                "upgrade git to 2.38 or later, then: git config --global safe.bareRepository explicit",
            ),
        );
    }
    // Global overrides system; a repository's own config cannot set it.
    let value = [
        ["config", "--global", "--get", "safe.bareRepository"],
        ["config", "--system", "--get", "safe.bareRepository"],
    ]
    .iter()
    .filter_map(|a| git(a))
    .filter(|o| o.status.success())
    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    .next();
    match value {
        Some(v) if v.eq_ignore_ascii_case("explicit") => check(
            Status::Ok,
            format!(
                "{version}: safe.bareRepository = explicit (git uses no bare repository it finds by itself)"
            ),
            None,
            None,
        ),
        other => check(
            Status::Info,
            format!(
                "{version}: safe.bareRepository = {} (git uses any bare repository it finds)",
                other.as_deref().unwrap_or("all, the default")
            ),
            Some(disables),
            Some(
                "git config --global safe.bareRepository explicit (a bare repository then needs --git-dir or GIT_DIR)",
            ),
        ),
    }
}
