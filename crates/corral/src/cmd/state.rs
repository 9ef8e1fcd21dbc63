//! `corral state diff|apply|reset PROFILE`: corral's layer over a harness's state
//! (corral-session `hstate`).

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use corral_policy::plan::{Engine, HarnessState, StateLayer};
use corral_session::hstate;

use crate::cli::StateCommand;

pub fn run(cmd: StateCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        StateCommand::Diff { profile, json } => diff(&profile, json),
        StateCommand::Apply {
            profile,
            paths,
            yes,
        } => apply(&profile, &paths, yes),
        StateCommand::Reset { profile } => reset(&profile),
    }
}

/// The layer of `profile` for this user, with both layouts of each state directory that
/// exist (the overlay's upper, docker's copy).
fn layers(profile: &str) -> anyhow::Result<Vec<HarnessState>> {
    let (env, home) = corral_policy::resolve::caller_env_and_home()?;
    let p = corral_policy::profile::profile(profile)?;
    if p.state_dirs.is_empty() && p.state_files.is_empty() {
        bail!("profile {profile} keeps no state");
    }
    let state_dir = corral_policy::trust::state_dir(&env, &home);
    let overlay = corral_policy::harness::layer_for(&p, &home, &state_dir, Engine::Native);
    let copy = corral_policy::harness::layer_for(&p, &home, &state_dir, Engine::Docker);
    let copy_used = copy.dirs.iter().any(|d| match &d.layer {
        StateLayer::Copy { dir } => dir.exists(),
        StateLayer::Overlay { .. } => false,
    });
    let mut out = vec![overlay];
    if copy_used {
        let mut c = copy;
        // The state files are the same in both: compared once.
        c.files.clear();
        out.push(c);
    }
    Ok(out)
}

fn diff(profile: &str, json: bool) -> anyhow::Result<ExitCode> {
    let mut changes = Vec::new();
    for l in layers(profile)? {
        changes.extend(hstate::diff(&l)?);
    }
    let mut o = std::io::stdout().lock();
    if json {
        for c in &changes {
            let v = serde_json::json!({
                "path": c.path,
                "change": c.kind.word(),
                "code": c.code,
            });
            writeln!(o, "{v}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if changes.is_empty() {
        writeln!(
            o,
            "no change: jailed runs of {profile} see the host's state as it is"
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    // Code first: what would run on the host if applied.
    let (code, data): (Vec<_>, Vec<_>) = changes.iter().partition(|c| c.code.is_some());
    for c in code.iter().chain(&data) {
        let path = corral_audit::printable(&c.path.display().to_string());
        match &c.code {
            Some(why) => writeln!(o, "{:<8} {path}  [CODE: {why}]", c.kind.word())?,
            None => writeln!(o, "{:<8} {path}", c.kind.word())?,
        }
    }
    writeln!(
        o,
        "\n`corral state apply {profile} PATH...` copies what you pick to the host; entries \
         marked CODE run or steer code when the host's harness starts: review them first"
    )?;
    Ok(ExitCode::SUCCESS)
}

fn apply(profile: &str, paths: &[PathBuf], yes: bool) -> anyhow::Result<ExitCode> {
    let layers = layers(profile)?;
    let (_, home) = corral_policy::resolve::caller_env_and_home()?;
    let mut failed = false;
    for p in paths {
        let path = absolute(p, &home)?;
        let Some(l) = pick(&layers, &path) else {
            bail!(
                "{} is not in one of {profile}'s state directories or files",
                path.display()
            );
        };
        if let Some(why) = hstate::is_code(l, &path)
            && !yes
            && !ask(&format!(
                "{} is code ({why}): the host's harness runs or loads it. Copy it to the host?",
                path.display()
            ))?
        {
            eprintln!("corral: left {} as it is", path.display());
            failed = true;
            continue;
        }
        match hstate::apply(l, &path) {
            Ok(line) => eprintln!("corral: {line}"),
            Err(e) => {
                eprintln!("corral: {e:#}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `~/x` or a path relative to the home (as `diff` prints them absolute).
fn absolute(p: &Path, home: &Path) -> anyhow::Result<PathBuf> {
    let s = p.to_string_lossy();
    let out = if let Some(rest) = s.strip_prefix("~/") {
        home.join(rest)
    } else if p.is_absolute() {
        p.to_path_buf()
    } else {
        home.join(p)
    };
    if out
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        bail!("{}: `..` is not allowed", p.display());
    }
    Ok(out)
}

/// The layer to copy `path` from: of the layouts that hold an entry there (the overlay's
/// upper, corral's copy), the one written last; a deletion in the copy (no entry) when the
/// upper has nothing there either; else the overlay's, which says it has nothing.
fn pick<'l>(layers: &'l [HarnessState], path: &Path) -> Option<&'l HarnessState> {
    let holding: Vec<&HarnessState> = layers.iter().filter(|l| holds(l, path)).collect();
    let written = |l: &HarnessState| {
        hstate::layer_path(l, path)
            .and_then(|p| p.symlink_metadata().ok())
            .and_then(|m| m.modified().ok())
    };
    holding
        .iter()
        .filter_map(|l| written(l).map(|t| (t, *l)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, l)| l)
        .or_else(|| {
            holding
                .iter()
                .find(|l| {
                    l.dirs
                        .iter()
                        .any(|d| matches!(d.layer, StateLayer::Copy { .. }))
                })
                .copied()
        })
        .or_else(|| holding.first().copied())
}

fn holds(l: &HarnessState, path: &Path) -> bool {
    l.files.iter().any(|f| f.host == path)
        || l.dirs
            .iter()
            .any(|d| path.starts_with(&d.host) && path != d.host)
}

fn ask(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        eprintln!("corral: {question} (not asked: no terminal; pass --yes to copy it)");
        return Ok(false);
    }
    eprint!("corral: {question} [y/N] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

fn reset(profile: &str) -> anyhow::Result<ExitCode> {
    let layers = layers(profile)?;
    let layer = &layers[0];
    if !layer.layer.exists() {
        eprintln!("corral: {profile} has no layer; nothing to drop");
        return Ok(ExitCode::SUCCESS);
    }
    let Some(_lock) = hstate::lock_idle(layer)? else {
        bail!(
            "a jailed run of {profile} is using its layer ({}); reset it when the run ended",
            layer.layer.display()
        );
    };
    hstate::remove_tree(&layer.layer)?;
    eprintln!(
        "corral: dropped corral's layer of {profile} ({}): the next jailed run starts from the \
         host's state",
        layer.layer.display()
    );
    Ok(ExitCode::SUCCESS)
}
