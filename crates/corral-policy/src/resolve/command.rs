//! Finding the command on the caller's PATH, as a shell does, and what it needs bound: its
//! package directory and a script's interpreter.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::layer::normalize;
use super::{SYSTEM_DIRS, SYSTEM_PATH};

pub(super) fn is_system_path(p: &Path) -> bool {
    SYSTEM_DIRS.iter().any(|d| p.starts_with(d))
}

/// The marker every `corral shim` wrapper carries in its first bytes (cmd/shim.rs).
pub const SHIM_MARKER: &str = "# corral-shim v1";

/// Whether the file at `path` is a corral shim (carries [`SHIM_MARKER`] in its first 512 bytes).
pub fn is_shim(path: &Path) -> bool {
    use std::io::Read;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = Vec::with_capacity(512);
    if f.take(512).read_to_end(&mut head).is_err() {
        return false;
    }
    head.windows(SHIM_MARKER.len())
        .any(|w| w == SHIM_MARKER.as_bytes())
}

/// Look `name` up on `path_var` the way a shell does: the first executable regular file,
/// skipping corral's own shims (`pi` on PATH may be the shim that runs `corral run pi`; the
/// jail runs the real one).
pub fn which(name: &str, path_var: &str, cwd: &Path) -> Option<PathBuf> {
    if name.contains('/') {
        let p = normalize(&cwd.join(name));
        return is_executable(&p).then_some(p);
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| cwd.join(d).join(name))
        .find(|p| is_executable(p) && !is_shim(p))
}

pub(super) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The directory a program outside the system directories lives in, to bind read-only: the
/// nearest ancestor that is a package (`package.json`, a Python venv's `pyvenv.cfg`), or an
/// installation prefix (`PREFIX/bin/PROG` beside `PREFIX/lib` and `PREFIX/include`, as nvm
/// lays node out); else the program file alone. Never the home or `/` itself.
pub fn package_dir(exe: &Path, home: &Path) -> PathBuf {
    // The installation prefix first: nvm's own checkout (~/.nvm) holds a package.json that must
    // not turn one node binary into every version nvm has.
    if let Some(bin) = exe
        .parent()
        .filter(|b| b.file_name() == Some("bin".as_ref()))
        && let Some(prefix) = bin.parent()
        && prefix != home
        && !home.starts_with(prefix)
        && prefix.join("lib").is_dir()
        && prefix.join("include").is_dir()
    {
        return prefix.to_path_buf();
    }
    for dir in exe.ancestors().skip(1) {
        if dir == home || dir.parent().is_none() || home.starts_with(dir) {
            break;
        }
        if dir.join("package.json").is_file() || dir.join("pyvenv.cfg").is_file() {
            return dir.to_path_buf();
        }
    }
    exe.to_path_buf()
}

/// The interpreter named by a script's `#!` line (`#!/usr/bin/env node` gives `node`).
pub(super) fn shebang(exe: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(exe).ok()?.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let rest = line.strip_prefix("#!")?.trim();
    let mut words = rest.split_whitespace();
    let first = words.next()?;
    if first.ends_with("/env") {
        words.find(|w| !w.starts_with('-')).map(str::to_string)
    } else {
        Some(first.to_string())
    }
}

/// The resolved command, the binds it needs and the directories to put on PATH.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ResolvedCommand {
    pub(super) argv: Vec<String>,
    pub(super) binds: Vec<PathBuf>,
    pub(super) path_dirs: Vec<PathBuf>,
}

pub(super) fn resolve_command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
    home: &Path,
    toolchains: &[crate::plan::Toolchain],
) -> ResolvedCommand {
    let mut out = ResolvedCommand {
        argv: argv.to_vec(),
        binds: Vec::new(),
        path_dirs: Vec::new(),
    };
    let path_var = env.get("PATH").map(String::as_str).unwrap_or(SYSTEM_PATH);
    let Some(found) = argv.first().and_then(|a| which(a, path_var, cwd)) else {
        return out;
    };
    let canonical = found.canonicalize().unwrap_or_else(|_| found.clone());
    // A toolchain's program that is no script runs by the name it was found under (a rustup
    // proxy is one binary that dispatches on that name), from the toolchain's own bind.
    let multi_call = found.file_name() != canonical.file_name() && shebang(&canonical).is_none();
    if is_system_path(&found) && is_system_path(&canonical)
        || multi_call
            && crate::toolchain::covers(toolchains, &found)
            && crate::toolchain::covers(toolchains, &canonical)
    {
        out.argv[0] = found.display().to_string();
        return out;
    }
    out.argv[0] = canonical.display().to_string();
    out.binds.push(package_dir(&canonical, home));
    // A script's interpreter outside the system directories (node under nvm) comes along.
    if let Some(interp) = shebang(&canonical)
        && let Some(ip) = which(&interp, path_var, cwd)
    {
        let ic = ip.canonicalize().unwrap_or_else(|_| ip.clone());
        if !is_system_path(&ic) {
            out.binds.push(package_dir(&ic, home));
            if let Some(d) = ic.parent() {
                out.path_dirs.push(d.to_path_buf());
            }
        }
    }
    out
}
