//! `corral trust [PATH] [--list | --revoke]`, and the gate `corral run`/`shell` pass before a
//! jail starts.
//!
//! A project's `corral.toml` comes with the repository. What it grants beyond the user's own
//! layers (`Plan::project_trust`, computed by the policy crate with each grant's place in the
//! file) is used only when the user trusted exactly that content: the store
//! (`corral_policy::trust`) holds the file's path and the SHA-256 of the bytes the plan was
//! resolved from, so an edited file is refused again. On a terminal the gate asks (default no);
//! elsewhere it refuses (exit 125) with the list and the command that accepts it.

use std::collections::BTreeMap;
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use corral_policy::Plan;
use corral_policy::plan::ProjectTrust;
use corral_policy::trust::{self, TrustStore};

use crate::cli::TrustArgs;

/// The caller's environment and home, as the policy crate sees them (HOME must be absolute).
pub(crate) fn env_home() -> anyhow::Result<(BTreeMap<String, String>, PathBuf)> {
    Ok(corral_policy::resolve::caller_env_and_home()?)
}

/// Before a jail starts from `plan`: corral's own directories that the plan protects exist (so
/// the jail cannot create them), and what the project's `corral.toml` grants is trusted.
pub fn gate(plan: &Plan) -> anyhow::Result<()> {
    gate_with(plan, None)
}

/// The gate of a run in a worktree corral made (`corral run --worktree`): the worktree's
/// `corral.toml` is trusted as the gate trusts it, or when its bytes are exactly those the
/// user trusted for `main_file`, the policy file of the repository's main worktree. The caller
/// finds `main_file` from the repository's common git directory and checked that the worktree
/// belongs to it (worktrees.rs); a jail that changed the worktree's file changed its bytes.
pub fn gate_in_worktree(plan: &Plan, worktree: &Path, main_file: &Path) -> anyhow::Result<()> {
    let worktree = worktree
        .canonicalize()
        .with_context(|| format!("cannot resolve the worktree {}", worktree.display()))?;
    let inherited = match &plan.project_trust {
        // Only the worktree's own policy file stands in for the main worktree's.
        Some(t) if t.file.parent() == Some(worktree.as_path()) => Some(main_file),
        _ => None,
    };
    gate_with(plan, inherited)
}

fn gate_with(plan: &Plan, inherited_from: Option<&Path>) -> anyhow::Result<()> {
    let (env, home) = env_home()?;
    trust::ensure_protected_dirs(plan, &env, &home)?;
    let Some(t) = plan.project_trust.as_ref().filter(|t| !t.grants.is_empty()) else {
        return Ok(());
    };
    let store_path = trust::store_path(&env, &home);
    let mut store = TrustStore::load(&store_path)?;
    if store.is_trusted(&t.file, &t.sha256) {
        return Ok(());
    }
    if let Some(main_file) = inherited_from
        && store.is_trusted(main_file, &t.sha256)
    {
        eprintln!(
            "corral: {} has exactly the content you trusted for {}",
            t.file.display(),
            main_file.display()
        );
        return Ok(());
    }
    let changed = store.get(&t.file).is_some();
    let listing = listing(t, changed);
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        eprint!("corral: {listing}\ncorral: trust exactly this content and run? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .context("cannot read the answer from the terminal")?;
        if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            store.trust(&t.file, &t.sha256);
            store.save(&store_path)?;
            eprintln!(
                "corral: trusted {} (sha256 {}); recorded in {}",
                t.file.display(),
                t.sha256,
                store_path.display()
            );
            return Ok(());
        }
        bail!(
            "not trusted: nothing was run; review {} and run `corral trust` when you accept it",
            t.file.display()
        );
    }
    let root = t.file.parent().unwrap_or(Path::new("/"));
    bail!(
        "{listing}\n\
         Review the file, then trust exactly this content with:  corral trust {}\n\
         (or run with your own settings only:  --policy /dev/null)",
        corral_engine::shell_quote(&root.display().to_string())
    )
}

/// Whether what the project's `corral.toml` of `plan` grants is trusted with exactly the content
/// the plan was resolved from (a file that grants nothing needs no trust), without asking: the
/// check a running jail's policy reload passes (live.rs).
pub fn is_trusted(plan: &Plan) -> anyhow::Result<bool> {
    let Some(t) = plan.project_trust.as_ref().filter(|t| !t.grants.is_empty()) else {
        return Ok(true);
    };
    let (env, home) = env_home()?;
    let store = TrustStore::load(&trust::store_path(&env, &home))?;
    Ok(store.is_trusted(&t.file, &t.sha256))
}

/// What the file grants, one line each, and why it is asked.
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

fn listing(t: &ProjectTrust, changed: bool) -> String {
    let mut s = format!(
        "the project's policy file {} grants what only you may grant (a repository may be \
         hostile), and {}:",
        t.file.display(),
        if changed {
            "it changed since you trusted it"
        } else {
            "it is not trusted"
        }
    );
    for g in &t.grants {
        s.push_str("\n  ");
        s.push_str(g);
    }
    s
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
