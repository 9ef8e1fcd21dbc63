//! The trust store: the project policy files the user has accepted, each by path and SHA-256.
//!
//! A project's `corral.toml` comes with the repository, so a cloned hostile repository writes
//! it. What such a file grants beyond the user's own layers (`Plan::project_trust`) is used only
//! after the user trusted exactly that content with `corral trust`; an edited file (another
//! hash) needs trusting again. The store is `$XDG_CONFIG_HOME/corral/trusted.json`, beside the
//! user config and outside anything a jail can write: a project file may not bind corral's
//! config or state directories (`resolve.rs`), and when a bind the user asked for would expose
//! them read-write, the Plan protects them (bound read-only over themselves).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;

/// The store's file name, in corral's config directory.
pub const STORE_FILE: &str = "trusted.json";

/// corral's config directory: `$XDG_CONFIG_HOME/corral`, `~/.config/corral` when unset or
/// relative (where the user config lives too).
pub fn config_dir(env: &BTreeMap<String, String>, home: &Path) -> PathBuf {
    match env.get("XDG_CONFIG_HOME") {
        Some(x) if x.starts_with('/') => PathBuf::from(x).join("corral"),
        _ => home.join(".config/corral"),
    }
}

/// corral's state directory (audit logs) for this environment: `corral_audit::state_dir_in`.
pub fn state_dir(env: &BTreeMap<String, String>, home: &Path) -> PathBuf {
    let xdg = env.get("XDG_STATE_HOME").map(String::as_str);
    corral_audit::state_dir_in(xdg, Some(home)).expect("a state directory whenever a home is given")
}

/// The trust store's path for this environment.
pub fn store_path(env: &BTreeMap<String, String>, home: &Path) -> PathBuf {
    config_dir(env, home).join(STORE_FILE)
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One trusted file: its path and the hash of the content the user accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustedFile {
    pub path: PathBuf,
    pub sha256: String,
    /// When it was trusted (RFC 3339, UTC).
    pub trusted_at: String,
}

/// The store's content: one entry per file, the content trusted last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustStore {
    #[serde(default)]
    pub files: Vec<TrustedFile>,
}

impl TrustStore {
    /// Read the store at `path`; an absent or empty file is an empty store.
    pub fn load(path: &Path) -> Result<TrustStore, PolicyError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TrustStore::default()),
            Err(source) => {
                return Err(PolicyError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        if text.trim().is_empty() {
            return Ok(TrustStore::default());
        }
        serde_json::from_str(&text).map_err(|e| {
            PolicyError::Invalid(format!(
                "{}: the trust store is not valid ({e}); fix or remove it (then trust your \
                 projects' policy files again with `corral trust`)",
                path.display()
            ))
        })
    }

    /// Whether `file` is trusted with exactly the content hashed `sha256`.
    pub fn is_trusted(&self, file: &Path, sha256: &str) -> bool {
        self.get(file).is_some_and(|t| t.sha256 == sha256)
    }

    /// The entry of `file`, whatever content it was trusted with.
    pub fn get(&self, file: &Path) -> Option<&TrustedFile> {
        self.files.iter().find(|t| t.path == file)
    }

    /// Trust `file` with the content hashed `sha256` (replacing an earlier content's entry).
    pub fn trust(&mut self, file: &Path, sha256: &str) {
        self.files.retain(|t| t.path != file);
        self.files.push(TrustedFile {
            path: file.to_path_buf(),
            sha256: sha256.to_string(),
            trusted_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        });
        self.files.sort_by(|a, b| a.path.cmp(&b.path));
    }

    /// Forget `file`; whether it was trusted.
    pub fn revoke(&mut self, file: &Path) -> bool {
        let before = self.files.len();
        self.files.retain(|t| t.path != file);
        self.files.len() != before
    }

    /// Write the store to `path` (its directory created 0700, the file 0600, replaced by
    /// rename so a reader never sees half of it).
    pub fn save(&self, path: &Path) -> Result<(), PolicyError> {
        let io = |what: &'static str, p: &Path| {
            let p = p.to_path_buf();
            move |source| PolicyError::Io {
                what,
                path: p,
                source,
            }
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("cannot create the trust store's directory", dir))?;
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|e| PolicyError::Invalid(format!("cannot serialize the trust store: {e}")))?;
        text.push('\n');
        let tmp = dir.join(format!(".{STORE_FILE}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io("cannot write the trust store", path)(e)
        })
    }
}

/// Create corral's config and state directories (0700), or the trust store, when the Plan
/// protects them and they do not exist yet: a protected path is bound read-only over itself, and a missing one could
/// otherwise be created from inside the jail (a planted user config or trust store).
pub fn ensure_protected_dirs(
    plan: &crate::Plan,
    env: &BTreeMap<String, String>,
    home: &Path,
) -> Result<(), PolicyError> {
    let store = store_path(env, home);
    if plan.protected.contains(&store) && store.symlink_metadata().is_err() {
        // The project lies inside corral's config directory: the store file alone is protected.
        TrustStore::default().save(&store)?;
    }
    for dir in [config_dir(env, home), state_dir(env, home)] {
        if plan.protected.contains(&dir) && dir.symlink_metadata().is_err() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|source| PolicyError::Io {
                    what: "cannot create corral's directory (so the jail cannot)",
                    path: dir.clone(),
                    source,
                })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn trust_replace_revoke_and_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sub/trusted.json");
        let mut s = TrustStore::load(&path).unwrap();
        assert!(s.files.is_empty());
        let f = Path::new("/p/corral.toml");
        s.trust(f, "aa");
        s.trust(f, "bb");
        assert!(s.is_trusted(f, "bb"));
        assert!(!s.is_trusted(f, "aa"), "a new content replaces the old one");
        s.save(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let back = TrustStore::load(&path).unwrap();
        assert_eq!(back, s);
        let mut back = back;
        assert!(back.revoke(f));
        assert!(!back.revoke(f));
        assert!(!back.is_trusted(f, "bb"));
    }

    #[test]
    fn a_broken_store_is_an_error_that_names_it() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("trusted.json");
        std::fs::write(&path, "{not json").unwrap();
        let e = TrustStore::load(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }
}
