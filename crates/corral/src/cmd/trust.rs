//! `corral trust [PATH] [--list | --revoke]`: the user's record of the project policy files
//! they trusted, which the gate every run passes reads (corral-run's `trust.rs`, where what is
//! gated and why is said).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use corral_policy::plan::ProjectTrust;
use corral_policy::trust::{self, TrustStore};
use corral_run::trust::env_home;

use crate::cli::TrustArgs;

/// A project policy file the user's own corral command outside any jail just wrote (`corral
/// init`) or edited (`corral allow`/`deny`): its new content is trusted when the file is new or
/// its previous content was trusted, since the user reviewed that and added only this change. A
/// file never trusted stays untrusted: the user has not read the rest of it. Whether the new
/// content is trusted.
pub fn carry_over(file: &Path, before: Option<&[u8]>) -> anyhow::Result<bool> {
    let (env, home) = env_home()?;
    let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let store_path = trust::store_path(&env, &home);
    let mut store = TrustStore::load(&store_path)?;
    if let Some(before) = before
        && !store.is_trusted(&file, &trust::sha256_hex(before))
    {
        return Ok(false);
    }
    let after = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
    store.trust(&file, &trust::sha256_hex(&after));
    store.save(&store_path)?;
    Ok(true)
}

/// The project directory named by PATH (a directory or a file in it), else the current one.
fn project_dir(path: Option<&Path>) -> anyhow::Result<PathBuf> {
    let p = match path {
        Some(p) => p.to_path_buf(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let dir = if p.is_dir() {
        p.clone()
    } else {
        p.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    dir.canonicalize()
        .with_context(|| format!("cannot find the project directory {}", dir.display()))
}

pub fn run(args: TrustArgs) -> anyhow::Result<ExitCode> {
    let (env, home) = env_home()?;
    let store_path = trust::store_path(&env, &home);
    let mut store = TrustStore::load(&store_path)?;
    if args.list {
        return list(&store, &store_path, args.json);
    }
    // `--project DIR` names the project exactly, as it does for `corral run`.
    let (dir, file) = match &args.jail.project {
        Some(p) => {
            let dir = p
                .canonicalize()
                .with_context(|| format!("--project {}", p.display()))?;
            let file = dir.join("corral.toml");
            (dir, file)
        }
        None => {
            let dir = project_dir(args.path.as_deref())?;
            let file = corral_policy::resolve::project_root(&dir).join("corral.toml");
            (dir, file)
        }
    };
    if args.revoke {
        if store.revoke(&file) {
            store.save(&store_path)?;
            eprintln!("corral: no longer trusted: {}", file.display());
        } else {
            eprintln!("corral: {} was not trusted", file.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(p) = &args.path
        && p.is_file()
        && p.canonicalize().ok().as_ref() != Some(&file)
    {
        bail!(
            "{} is not the project's corral.toml ({}): only that file is gated; a file you pass \
             with --policy is your own choice and needs no trust",
            p.display(),
            file.display()
        );
    }
    if !file.is_file() {
        bail!("no policy file to trust: {} does not exist", file.display());
    }
    if args.jail.scratch {
        bail!("--scratch reads no project policy: there is nothing to trust");
    }
    if args.jail.policy.is_some() {
        bail!("a file you pass with --policy is your own choice and needs no trust");
    }
    // The plan as `corral run` in that directory would resolve it: the grants are measured
    // against your user config, your options and the profile the file picks.
    let mut req = super::plan::request(None, &args.jail, Vec::new())?;
    req.cwd = dir;
    let plan = corral_policy::resolve(&req)?;
    let t = plan
        .project_trust
        .with_context(|| format!("{} was not read as the project's policy", file.display()))?;
    // Recorded first: a closed standard output (`| head`) must not leave it half done.
    store.trust(&t.file, &t.sha256);
    store.save(&store_path)?;
    if t.grants.is_empty() {
        outln!(
            "{} grants nothing beyond your own settings (it only narrows or sets harmless things)",
            t.file.display()
        )?;
    } else {
        outln!(
            "{} grants (a repository may be hostile: review these):",
            t.file.display()
        )?;
        for g in &t.grants {
            outln!("  {g}")?;
        }
    }
    eprintln!(
        "corral: trusted {} (sha256 {}) in {}; any change to the file must be trusted again",
        t.file.display(),
        t.sha256,
        store_path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `corral trust --list [--json]`: each trusted file, its hash, when, and whether it still has
/// that content (`current`, `changed`: not in force, `missing`).
fn list(store: &TrustStore, store_path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let rows: Vec<(&trust::TrustedFile, &str)> = store
        .files
        .iter()
        .map(|f| {
            let state = match std::fs::read(&f.path) {
                Ok(bytes) if trust::sha256_hex(&bytes) == f.sha256 => "current",
                Ok(_) => "changed",
                Err(_) => "missing",
            };
            (f, state)
        })
        .collect();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(f, state)| {
                serde_json::json!({
                    "path": f.path,
                    "sha256": f.sha256,
                    "trusted_at": f.trusted_at,
                    "state": state,
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        outln!("no trusted project policy files ({})", store_path.display())?;
    }
    for (f, state) in rows {
        let state = match state {
            "changed" => "CHANGED since trusted (not in force)",
            s => s,
        };
        outln!(
            "{}  sha256 {}  trusted {}  {state}",
            f.path.display(),
            f.sha256,
            f.trusted_at
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// For `corral plan`: whether the file's grants are trusted.
pub fn status(t: &ProjectTrust) -> &'static str {
    let Ok((env, home)) = env_home() else {
        return "unknown (no HOME)";
    };
    match TrustStore::load(&trust::store_path(&env, &home)) {
        Ok(s) if s.is_trusted(&t.file, &t.sha256) => "trusted (this content, by corral trust)",
        Ok(s) if s.get(&t.file).is_some() => {
            "CHANGED since you trusted it: corral run refuses until you run `corral trust` again"
        }
        Ok(_) => "NOT trusted: corral run refuses until you run `corral trust`",
        Err(_) => "unknown (the trust store cannot be read)",
    }
}
