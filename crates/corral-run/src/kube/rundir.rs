//! A kube run's directory (its manifests and what `corral down` needs to delete them), and
//! `corral down`'s deletion of what a killed run left.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::kubectl::{Kubectl, delete};

/// What a run records next to its manifests, for `corral down`.
const RECORD: &str = "run.json";
const MANIFESTS: &str = "jail.yaml";

/// A run's directory: its manifests and what `corral down` needs to delete them
/// (`$XDG_STATE_HOME/corral/kube/<project key>/<name>/`). Made before anything is applied, so a
/// killed run leaves it behind; removed once the run's objects are deleted.
pub(super) struct RunDir {
    pub(super) path: PathBuf,
}

/// What `corral down` reads back.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    name: String,
    kubectl: Kubectl,
}

/// The directory of every kube run of the project at `root`.
fn project_runs_dir(root: &Path) -> anyhow::Result<PathBuf> {
    let state = corral_audit::state_dir().context("cannot find corral's state directory")?;
    Ok(state.join("kube").join(corral_audit::project_key(root)))
}

impl RunDir {
    pub(super) fn create(
        root: &Path,
        name: &str,
        kubectl: &Kubectl,
        yaml: &str,
    ) -> anyhow::Result<RunDir> {
        let path = project_runs_dir(root)?.join(name);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        // The manifests may hold the executor's token: the owner's only.
        super::render::write_private(&path.join(MANIFESTS), yaml)?;
        let record = Record {
            name: name.to_string(),
            kubectl: kubectl.clone(),
        };
        let text = serde_json::to_string_pretty(&record).context("cannot encode the run record")?;
        std::fs::write(path.join(RECORD), text + "\n")
            .with_context(|| format!("cannot write {}", path.join(RECORD).display()))?;
        Ok(RunDir { path })
    }

    /// The run's directory, and the project's when it was the last run in it.
    pub(super) fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(parent) = self.path.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }

    pub(super) fn manifests(&self) -> PathBuf {
        self.path.join(MANIFESTS)
    }
}

/// `corral down`: delete the objects of this project's kube runs that a killed corral left
/// (each run's directory names its context, namespace and name), and their directories. The
/// names of the jails removed.
pub fn down_leftovers(root: &Path) -> anyhow::Result<Vec<String>> {
    let dir = project_runs_dir(root)?;
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime that drives kubectl")?;
    let mut removed = Vec::new();
    let mut failed = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot read {}", dir.display()))?
            .path();
        // Each run on its own: a cluster out of reach keeps its runs' records, not the others'.
        match down_one(&rt, &path) {
            Ok(name) => removed.push(name),
            Err(e) => {
                eprintln!("corral: kube: {e:#}");
                failed.push(path);
            }
        }
    }
    let _ = std::fs::remove_dir(&dir);
    if !failed.is_empty() {
        bail!(
            "{} run(s) kept their objects and records (see above); run `corral down` again once \
             their cluster answers",
            failed.len()
        );
    }
    Ok(removed)
}

/// Delete the objects of the run recorded in `path`, then the record; the jail's name.
fn down_one(rt: &tokio::runtime::Runtime, path: &Path) -> anyhow::Result<String> {
    let record_path = path.join(RECORD);
    let text = std::fs::read_to_string(&record_path)
        .with_context(|| format!("cannot read {}", record_path.display()))?;
    let record: Record = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a kube run record", record_path.display()))?;
    rt.block_on(delete(&record.kubectl, &path.join(MANIFESTS), &record.name))?;
    std::fs::remove_dir_all(path).with_context(|| format!("cannot remove {}", path.display()))?;
    Ok(record.name)
}
