//! `corral undo [RUN]` and `corral log --runs`: the change records of runs (corral-changes;
//! docs/undo.md), kept by corral-run's `record`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use corral_audit::printable;
use corral_changes::Store;
use corral_run::record::retention;

use crate::cli::UndoArgs;

/// This project's store (not made when absent: it then holds no run).
fn store_here() -> anyhow::Result<(Store, PathBuf)> {
    let root = super::log::project_root()?;
    let state = corral_audit::state_dir()?;
    let store = Store::at(&state, &corral_audit::project_key(&root))?;
    Ok((store, root))
}

/// `corral undo [RUN] [--force]`.
pub fn run(args: UndoArgs) -> anyhow::Result<ExitCode> {
    let (store, root) = store_here()?;
    let id = match args.run {
        Some(id) => id,
        None => last_undoable(&store)?,
    };
    let info = store.run(&id)?;
    if Path::new(&info.meta.project) != root {
        anyhow::bail!(
            "run {id} was recorded for {}, not {}",
            info.meta.project,
            root.display()
        );
    }
    let opts = corral_changes::Options {
        force: args.force,
        retention: retention(),
    };
    let report = corral_changes::undo(&store, &id, &root, opts)?;
    println!(
        "corral: undid run {id}: {} removed, {} put back. `corral undo {}` redoes it.",
        report.removed, report.restored, report.record
    );
    Ok(ExitCode::SUCCESS)
}

/// The newest run that is not undone and is not itself an undo.
fn last_undoable(store: &Store) -> anyhow::Result<String> {
    store
        .runs()?
        .into_iter()
        .rev()
        .find(|r| r.undone_by.is_none() && r.meta.undoes.is_none())
        .map(|r| r.meta.id)
        .context("this project has no recorded run to undo (`corral log --runs` lists runs)")
}

/// `corral log --runs`: the recorded runs, oldest first, and the store's use of its bounds.
pub fn log_runs(json: bool) -> anyhow::Result<ExitCode> {
    let (store, _) = store_here()?;
    let runs = store.runs()?;
    if json {
        for r in &runs {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<20} {:<20} {:>7} {:>8} {:>7} {:>9}  COMMAND",
        "RUN", "STARTED", "CREATED", "MODIFIED", "DELETED", "RECORD"
    );
    for r in &runs {
        let mut command = printable(&r.meta.command.join(" "));
        if let Some(by) = &r.undone_by {
            command.push_str(&format!("  (undone by {by})"));
        }
        if r.incomplete.is_some() {
            command.push_str("  (incomplete: cannot be undone)");
        }
        if r.finished.is_none() {
            command.push_str("  (not finished)");
        }
        println!(
            "{:<20} {:<20} {:>7} {:>8} {:>7} {:>9}  {command}",
            r.meta.id,
            r.meta.started,
            r.created,
            r.modified,
            r.deleted,
            size(r.bytes)
        );
    }
    println!("{}", usage_line(&store)?);
    Ok(ExitCode::SUCCESS)
}

/// "N runs, SIZE kept (at most R runs, B)": for `corral log --runs` and `corral doctor`.
pub fn usage_line(store: &Store) -> anyhow::Result<String> {
    let (runs, bytes) = store.usage()?;
    let keep = retention();
    Ok(format!(
        "change record: {runs} run(s), {} kept in {} (at most {} runs and {}; oldest removed first)",
        size(bytes),
        store.root().display(),
        keep.runs,
        size(keep.bytes)
    ))
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{v:.1} {}", UNITS[unit]),
    }
}

/// `corral doctor`'s line on the change record: this project's use of it and the bounds.
pub fn doctor_check() -> corral_sandbox::probe::Check {
    let (status, detail) = match store_here().and_then(|(store, _)| usage_line(&store)) {
        Ok(line) => (corral_sandbox::probe::Status::Info, line),
        Err(e) => (
            corral_sandbox::probe::Status::Info,
            format!("change record: cannot be read here ({e:#}); runs keep none"),
        ),
    };
    corral_sandbox::probe::Check {
        id: "change_record",
        status,
        detail,
        disables: None,
        fix: None,
    }
}
