//! Language toolchains installed under the home (rustup and cargo, pyenv, nvm, uv, go): found
//! here so that `corral exec -- cargo test` or `corral run -- python3` work in a jail whose home
//! is a private tmpfs, without the user writing binds.
//!
//! Each is bound read-only: a toolchain is code the host runs later, so the jail must never
//! change it. Only the toolchain itself comes in, never its caches or credentials
//! (`~/.cargo/registry` and `~/.cargo/credentials.toml` stay out: the home's tmpfs takes what
//! the tools write; binding a cache read-write is the user's choice, `--rw`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::plan::Toolchain;

/// A directory from an absolute variable of `env`, else `default` under the home.
fn dir_of(env: &BTreeMap<String, String>, var: &str, home: &Path, default: &str) -> PathBuf {
    env.get(var)
        .filter(|v| v.starts_with('/'))
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(default))
}

/// The caller's PATH entries, in order.
fn caller_path(env: &BTreeMap<String, String>) -> Vec<PathBuf> {
    env.get("PATH")
        .map(|p| {
            p.split(':')
                .filter(|d| d.starts_with('/'))
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Every toolchain present for this caller, in a fixed order.
pub fn find(home: &Path, env: &BTreeMap<String, String>) -> Vec<Toolchain> {
    let path = caller_path(env);
    [
        rust(home, env),
        pyenv(home, env),
        nvm(home, env, &path),
        uv(home),
        go(home, env),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// rustup's toolchains (`RUSTUP_HOME`, `~/.rustup`) and cargo's programs (`CARGO_HOME/bin`,
/// `~/.cargo/bin`): the rustup proxies there need RUSTUP_HOME.
fn rust(home: &Path, env: &BTreeMap<String, String>) -> Option<Toolchain> {
    let rustup = dir_of(env, "RUSTUP_HOME", home, ".rustup");
    let cargo_bin = dir_of(env, "CARGO_HOME", home, ".cargo").join("bin");
    let mut t = toolchain("rust");
    if rustup.is_dir() {
        t.binds.push(rustup.clone());
        t.env
            .insert("RUSTUP_HOME".into(), rustup.display().to_string());
    }
    if cargo_bin.is_dir() {
        t.binds.push(cargo_bin.clone());
        t.path.push(cargo_bin);
    }
    (!t.binds.is_empty()).then_some(t)
}

/// pyenv (`PYENV_ROOT`, `~/.pyenv`): its shims run `pyenv exec`, which needs the whole root.
fn pyenv(home: &Path, env: &BTreeMap<String, String>) -> Option<Toolchain> {
    let root = dir_of(env, "PYENV_ROOT", home, ".pyenv");
    if !root.join("bin").is_dir() && !root.join("libexec").is_dir() {
        return None;
    }
    let mut t = toolchain("pyenv");
    t.binds.push(root.clone());
    for d in ["shims", "bin"] {
        if root.join(d).is_dir() {
            t.path.push(root.join(d));
        }
    }
    t.env
        .insert("PYENV_ROOT".into(), root.display().to_string());
    Some(t)
}

/// nvm's node versions (`NVM_DIR/versions`, `~/.nvm/versions`): the version on the caller's
/// PATH, else the newest installed.
fn nvm(home: &Path, env: &BTreeMap<String, String>, path: &[PathBuf]) -> Option<Toolchain> {
    let versions = dir_of(env, "NVM_DIR", home, ".nvm").join("versions");
    if !versions.is_dir() {
        return None;
    }
    let mut t = toolchain("nvm");
    t.binds.push(versions.clone());
    let active: Vec<PathBuf> = path
        .iter()
        .filter(|d| d.starts_with(&versions))
        .cloned()
        .collect();
    if active.is_empty() {
        let newest = std::fs::read_dir(versions.join("node"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("bin").is_dir())
            .max_by_key(|p| version_key(p));
        t.path.extend(newest.map(|p| p.join("bin")));
    } else {
        t.path.extend(active);
    }
    Some(t)
}

/// `v22.11.0` as numbers, for picking the newest.
fn version_key(p: &Path) -> Vec<u64> {
    p.file_name()
        .map(|n| n.to_string_lossy().trim_start_matches('v').to_string())
        .unwrap_or_default()
        .split('.')
        .map(|x| x.parse().unwrap_or(0))
        .collect()
}

/// uv's own programs (`~/.local/bin/uv`, `uvx`) and the Pythons and tools it installed
/// (`~/.local/share/uv/python`, `tools`); not the rest of `~/.local/share/uv` (credentials).
fn uv(home: &Path) -> Option<Toolchain> {
    let bin = home.join(".local/bin");
    let programs: Vec<PathBuf> = ["uv", "uvx"]
        .iter()
        .map(|p| bin.join(p))
        .filter(|p| p.is_file())
        .collect();
    if programs.is_empty() {
        return None;
    }
    let mut t = toolchain("uv");
    t.binds.extend(programs);
    for d in ["python", "tools"] {
        let p = home.join(".local/share/uv").join(d);
        if p.is_dir() {
            t.binds.push(p);
        }
    }
    t.path.push(bin);
    Some(t)
}

/// go: the official install's programs (`/usr/local/go/bin`, visible with /usr already) and
/// the ones `go install` put in `GOPATH/bin` (`~/go/bin`).
fn go(home: &Path, env: &BTreeMap<String, String>) -> Option<Toolchain> {
    let mut t = toolchain("go");
    let system = Path::new("/usr/local/go/bin");
    if system.is_dir() {
        t.path.push(system.to_path_buf());
    }
    let gobin = dir_of(env, "GOPATH", home, "go").join("bin");
    if gobin.is_dir() {
        t.binds.push(gobin.clone());
        t.path.push(gobin);
    }
    (!t.path.is_empty()).then_some(t)
}

fn toolchain(name: &str) -> Toolchain {
    Toolchain {
        name: name.into(),
        binds: Vec::new(),
        path: Vec::new(),
        env: BTreeMap::new(),
    }
}

/// The toolchains' PATH directories, in the order the caller's PATH has them (those it does
/// not name after, in the toolchains' order).
pub fn path_dirs(toolchains: &[Toolchain], env: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let caller = caller_path(env);
    let mut dirs: Vec<PathBuf> = toolchains.iter().flat_map(|t| t.path.clone()).collect();
    dirs.sort_by_key(|d| caller.iter().position(|c| c == d).unwrap_or(usize::MAX));
    dirs.dedup();
    dirs
}

/// Whether `p` lies in one of the toolchains' binds (a program found there runs as found: a
/// rustup proxy dispatches on the name it is called by).
pub fn covers(toolchains: &[Toolchain], p: &Path) -> bool {
    toolchains
        .iter()
        .flat_map(|t| &t.binds)
        .any(|b| p.starts_with(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn finds_each_layout_and_orders_path_as_the_caller() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path();
        for d in [
            ".rustup/toolchains",
            ".cargo/bin",
            ".cargo/registry",
            ".pyenv/bin",
            ".pyenv/shims",
            ".nvm/versions/node/v9.0.0/bin",
            ".nvm/versions/node/v20.1.0/bin",
            ".local/bin",
            ".local/share/uv/python",
            ".local/share/uv/credentials",
            "go/bin",
        ] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::write(home.join(".local/bin/uv"), "").unwrap();
        let h = |p: &str| home.join(p);
        let path = format!("/usr/bin:{}", h(".pyenv/shims").display());
        let found = find(home, &env(&[("PATH", &path)]));
        let names: Vec<&str> = found.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["rust", "pyenv", "nvm", "uv", "go"]);
        let binds: Vec<PathBuf> = found.iter().flat_map(|t| t.binds.clone()).collect();
        assert_eq!(
            binds,
            [
                h(".rustup"),
                h(".cargo/bin"),
                h(".pyenv"),
                h(".nvm/versions"),
                h(".local/bin/uv"),
                h(".local/share/uv/python"),
                h("go/bin"),
            ]
        );
        assert_eq!(
            path_dirs(&found, &env(&[("PATH", &path)])),
            [
                h(".pyenv/shims"),
                h(".cargo/bin"),
                h(".pyenv/bin"),
                h(".nvm/versions/node/v20.1.0/bin"),
                h(".local/bin"),
                h("go/bin"),
            ]
        );
        assert!(covers(&found, &h(".cargo/bin/cargo")));
        assert!(!covers(&found, &h(".cargo/registry")));
        assert!(
            find(&home.join("none"), &env(&[])).is_empty()
                || Path::new("/usr/local/go/bin").is_dir()
        );
    }
}
