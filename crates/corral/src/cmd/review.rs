//! `corral diff [--stat] [PATH...]`, `corral accept [PATH...]`, `corral discard`: a review
//! run's change set (corral-session `review/`, docs/review.md).

use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use corral_session::review::{self, Paths, Pending};

use crate::cli::{AcceptArgs, DiffArgs, DiscardArgs};

/// The project: `--project DIR` as given (symlinks resolved), else the git root or the
/// current directory.
fn project(arg: Option<&Path>) -> anyhow::Result<PathBuf> {
    match arg {
        Some(p) => std::fs::canonicalize(p).with_context(|| format!("no project {}", p.display())),
        None => super::log::project_root(),
    }
}

/// PATH arguments as paths relative to the project (they need not exist on the host: a
/// file the review adds does not). Relative ones are taken from the current directory.
fn relative(root: &Path, paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let cwd = std::env::current_dir()?;
    let cwd = std::fs::canonicalize(&cwd).unwrap_or(cwd);
    paths
        .iter()
        .map(|p| {
            let abs = normal(&cwd.join(p));
            let rel = abs.strip_prefix(root).map_err(|_| {
                anyhow::anyhow!("{} is not in the project {}", p.display(), root.display())
            })?;
            Ok(rel.to_path_buf())
        })
        .collect()
}

/// `path` with `.` and `..` taken lexically.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

pub fn diff(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let root = project(args.project.as_deref())?;
    let paths = Paths::for_project(&root)?;
    if !paths.pending() {
        anyhow::bail!(
            "no review of {} is pending (`corral run --review` starts one)",
            root.display()
        );
    }
    let select = relative(&root, &args.paths)?;
    let changes = review::upper::changes(&paths, &select)?;
    if args.stat {
        for line in review::show::stat_lines(&changes, usize::MAX) {
            println!("{line}");
        }
    } else {
        print!("{}", review::show::unified(&paths, &changes)?);
    }
    review::show::record_manifest(&paths, &select, &changes)?;
    if changes.is_empty() {
        eprintln!(
            "corral: the review holds no changes{}",
            if select.is_empty() {
                ""
            } else {
                " below these paths"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn accept(args: AcceptArgs) -> anyhow::Result<ExitCode> {
    let root = project(args.project.as_deref())?;
    let select = relative(&root, &args.paths)?;
    // What accept changes is kept in the change record, so `corral undo` undoes it (cmd/undo.rs).
    let command: Vec<String> = std::env::args().collect();
    let recording = match corral_run::record::begin_accept(&command, &root) {
        Ok(r) => r,
        Err(e) => anyhow::bail!(
            "cannot start the change record that would let `corral undo` undo this accept \
             ({e:#}); nothing was applied"
        ),
    };
    let keep = |dir: std::os::fd::BorrowedFd, rel: &Path, name: &std::ffi::OsStr| match &recording {
        Some(r) => r.keep(dir, rel, name),
        None => Ok(()),
    };
    let done = review::accept::accept(&root, &select, Some(&keep));
    if let Some(r) = recording {
        // Finished whether or not accept applied everything: what it did apply is undoable.
        // A record that cannot be finished was said; accept's own lines list what it applied.
        let _ = r.finish();
    }
    let done = done?;
    if !done.shown_by_diff {
        eprintln!("corral: no `corral diff` was shown for these changes; applied:");
    } else {
        eprintln!("corral: applied what `corral diff` showed:");
    }
    for line in review::show::stat_lines(&done.applied, usize::MAX) {
        eprintln!("  {line}");
    }
    if done.remaining > 0 {
        eprintln!(
            "corral: {} change{} still pending (`corral diff`, `corral accept`, `corral discard`)",
            done.remaining,
            if done.remaining == 1 { "" } else { "s" }
        );
    } else {
        eprintln!("corral: the review is done");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn discard(args: DiscardArgs) -> anyhow::Result<ExitCode> {
    let root = project(args.project.as_deref())?;
    let pending = Pending::open(&root)?;
    let n = review::upper::changes(&pending.paths, &[])
        .map(|c| c.len())
        .unwrap_or(0);
    pending.discard()?;
    eprintln!(
        "corral: dropped the review of {} ({n} change{}); the project is as it was",
        root.display(),
        if n == 1 { "" } else { "s" }
    );
    Ok(ExitCode::SUCCESS)
}
