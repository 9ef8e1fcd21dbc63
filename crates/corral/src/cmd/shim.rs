//! `corral shim install|list|remove [PROFILE...]`: wrappers on PATH so that `pi`, `claude`, ...
//! run jailed by their usual names (seed 000's "adding it to the PATH... the tool opens as
//! normal", seed 003's `pi` shell function and its `pi-ns`).
//!
//! A shim is a small POSIX sh script named like the harness, in a directory early on PATH
//! (default `~/.local/bin`). It runs `corral run PROFILE -- <the real binary> "$@"`, where the real
//! binary is looked up on PATH at every run, skipping the shim's own directory, relative PATH
//! entries and any file carrying the shim marker (so two shims never call each other); the path
//! found at install time is the fallback. `--scratch` also writes `NAME-ns`, which adds
//! `--scratch` (a fresh temporary directory instead of the project).
//!
//! Installing over an existing file that is not a shim moves that file aside, into
//! `DIR/.corral-shim-displaced/`, and `remove` puts it back; `remove` deletes only files that
//! carry the marker.
//!
//! The name a shim is called by is the profile's own command (`corral_policy::profile`), for
//! every built-in profile except `shell`, whose command is the user's shell itself.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::cli::ShimCommand;

/// The marker every shim carries in its first lines: how a shim recognises another shim, how
/// `remove` knows a file is its own, and how `corral run` skips shims on PATH.
pub const MARKER: &str = corral_policy::resolve::SHIM_MARKER;

/// Where displaced files wait, inside the shim directory.
const DISPLACED: &str = ".corral-shim-displaced";

/// (profile, the harness's command name) for every built-in profile that wraps a harness.
/// `shell` has none: its command is `bash`, and `corral shell` is its way in.
pub fn harnesses() -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in corral_policy::profile::names() {
        if name == "shell" {
            continue;
        }
        let profile = corral_policy::profile::profile(name)?;
        let command = profile
            .command
            .first()
            .and_then(|c| Path::new(c).file_name())
            .map(|c| c.to_string_lossy().into_owned())
            .with_context(|| format!("profile {name} names no command"))?;
        out.push((name.to_string(), command));
    }
    Ok(out)
}

pub fn run(cmd: ShimCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ShimCommand::Install {
            profiles,
            dir,
            scratch,
        } => {
            let dir = shim_dir(dir)?;
            let path = std::env::var_os("PATH").unwrap_or_default();
            let corral = std::env::current_exe()
                .context("cannot find the running corral executable")?
                .canonicalize()
                .context("cannot resolve the running corral executable")?;
            let report = install(&dir, &profiles, scratch, &path, &corral)?;
            for line in report {
                outln!("{line}")?;
            }
            for warning in path_warnings(&dir, &path) {
                eprintln!("corral: {warning}");
            }
            Ok(ExitCode::SUCCESS)
        }
        ShimCommand::List { dir, json } => {
            let dir = shim_dir(dir)?;
            let shims = list(&dir)?;
            if json {
                let v: Vec<serde_json::Value> = shims.iter().map(Shim::json).collect();
                outln!("{}", serde_json::to_string_pretty(&v)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            if shims.is_empty() {
                eprintln!("corral: no shims in {}", dir.display());
            }
            for s in shims {
                outln!("{}", s.describe())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ShimCommand::Remove { profiles, dir } => {
            let dir = shim_dir(dir)?;
            for line in remove(&dir, &profiles)? {
                outln!("{line}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn shim_dir(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let dir = match dir {
        Some(d) => d,
        None => {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|h| h.is_absolute())
                .context("HOME is not set to an absolute path; pass --dir DIR")?;
            home.join(".local/bin")
        }
    };
    if dir.is_absolute() {
        Ok(dir)
    } else {
        Ok(std::env::current_dir()
            .context("cannot read the current directory")?
            .join(dir))
    }
}

/// The command name a profile's shim is called by.
pub fn command_of(profile: &str) -> anyhow::Result<String> {
    if profile == "shell" {
        bail!(
            "the `shell` profile has no harness binary to wrap; run `corral shell` or `corral run shell -- CMD`"
        );
    }
    let all = harnesses()?;
    match all.iter().find(|(p, _)| p == profile) {
        Some((_, c)) => Ok(c.clone()),
        None => {
            let known: Vec<&str> = all.iter().map(|(p, _)| p.as_str()).collect();
            let hint = corral_policy::config::closest(profile, known.iter().copied())
                .map(|n| format!(" (did you mean {n:?}?)"))
                .unwrap_or_default();
            bail!(
                "unknown profile {profile:?}{hint}; shims exist for {}",
                known.join(", ")
            )
        }
    }
}

/// Whether the file at `path` is a shim (carries the marker in its first bytes).
pub fn is_shim(path: &Path) -> bool {
    corral_policy::resolve::is_shim(path)
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The real `name` on `path`: the first executable file named so in an absolute PATH entry
/// other than `skip_dir`, that is not a shim. The same rule the shim applies at run time.
pub fn find_real(name: &str, path: &std::ffi::OsStr, skip_dir: &Path) -> Option<PathBuf> {
    let skip = skip_dir
        .canonicalize()
        .unwrap_or_else(|_| skip_dir.to_path_buf());
    std::env::split_paths(path)
        .filter(|d| d.is_absolute())
        .filter(|d| d.canonicalize().map_or(true, |c| c != skip))
        .map(|d| d.join(name))
        .find(|c| is_executable_file(c) && !is_shim(c))
}

/// Quote for a POSIX sh single-quoted string.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The shim script.
pub fn script(
    profile: &str,
    name: &str,
    scratch: bool,
    corral: &Path,
    installed_real: &Path,
) -> String {
    let scratch_flag = if scratch { " --scratch" } else { "" };
    // The profile's own arguments after its command (codex: its sandbox off inside the jail),
    // which `-- <the real binary>` would otherwise drop.
    let profile_args: String = corral_policy::profile::profile(profile)
        .map(|p| {
            p.command
                .iter()
                .skip(1)
                .map(|a| format!(" {}", sh_quote(a)))
                .collect()
        })
        .unwrap_or_default();
    let shim_name = if scratch {
        format!("{name}-ns")
    } else {
        name.to_string()
    };
    format!(
        r#"#!/bin/sh
{MARKER}: `{shim_name}` runs `corral run {profile}{scratch_flag} -- <the real {name}>`.
# Written by `corral shim install`; `corral shim remove {profile}` takes it out again.
# profile={profile} command={name} scratch={scratch}
corral_bin={corral}
name={name_q}
installed_real={installed}
marker='{MARKER}'
self_dir=$(CDPATH= cd -- "$(dirname -- "$0")" 2>/dev/null && pwd -P)
real=
set -f
saved_ifs=$IFS
IFS=:
for d in $PATH; do
  case $d in /*) ;; *) continue ;; esac
  d_real=$(CDPATH= cd -- "$d" 2>/dev/null && pwd -P) || continue
  [ "$d_real" = "$self_dir" ] && continue
  c=$d_real/$name
  [ -f "$c" ] && [ -x "$c" ] || continue
  head -c 512 -- "$c" 2>/dev/null | grep -qF -- "$marker" && continue
  real=$c
  break
done
IFS=$saved_ifs
set +f
if [ -z "$real" ] && [ -f "$installed_real" ] && [ -x "$installed_real" ] &&
  ! head -c 512 -- "$installed_real" 2>/dev/null | grep -qF -- "$marker"; then
  real=$installed_real
fi
if [ -z "$real" ]; then
  echo "corral shim: cannot find the real $name on PATH (outside $self_dir); install it, or remove this shim with: corral shim remove {profile}" >&2
  exit 127
fi
if [ ! -x "$corral_bin" ]; then
  corral_bin=$(command -v corral) || {{
    echo "corral shim: corral is not at $corral_bin any more nor on PATH; reinstall the shim with: corral shim install {profile}" >&2
    exit 127
  }}
fi
exec "$corral_bin" run {profile}{scratch_flag} -- "$real"{profile_args} "$@"
"#,
        corral = sh_quote(&corral.to_string_lossy()),
        name_q = sh_quote(name),
        installed = sh_quote(&installed_real.to_string_lossy()),
    )
}

/// Install shims for `profiles` (all harnesses found on PATH when empty) into `dir`.
/// Returns one line per shim written.
pub fn install(
    dir: &Path,
    profiles: &[String],
    scratch: bool,
    path: &std::ffi::OsStr,
    corral: &Path,
) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut wanted: Vec<(String, String)> = Vec::new();
    let explicit = !profiles.is_empty();
    if explicit {
        for p in profiles {
            wanted.push((p.clone(), command_of(p)?));
        }
    } else {
        wanted = harnesses()?;
    }
    let mut lines = Vec::new();
    let mut missing = Vec::new();
    for (profile, name) in &wanted {
        let (profile, name) = (profile.as_str(), name.as_str());
        let target = dir.join(name);
        // `None`: the real binary is the file at `target` itself, found at its new place once
        // it has been moved aside.
        let mut real = match find_real(name, path, dir) {
            Some(r) => Some(r),
            // The only copy may be the one the shim is about to displace (an npm prefix of
            // ~/.local puts `pi` in ~/.local/bin itself). A symlink is resolved now (a relative
            // one would break once moved); a file is used where it is moved to.
            None if !is_shim(&target) && is_executable_file(&target) => {
                if std::fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
                    Some(
                        target
                            .canonicalize()
                            .with_context(|| format!("cannot resolve {}", target.display()))?,
                    )
                } else {
                    None
                }
            }
            None => {
                missing.push(name);
                continue;
            }
        };
        let mut names = vec![(name.to_string(), false)];
        if scratch {
            names.push((format!("{name}-ns"), true));
        }
        for (file, is_scratch) in names {
            let at = dir.join(&file);
            if let Some(displaced) = displace(dir, &file)? {
                lines.push(format!(
                    "moved the existing {} to {} (restored by `corral shim remove {profile}`)",
                    at.display(),
                    displaced.display()
                ));
                if real.is_none() && file == name {
                    real = Some(displaced);
                }
            }
            let real = real
                .clone()
                .with_context(|| format!("lost track of the real {name} in {}", dir.display()))?;
            let text = script(profile, name, is_scratch, corral, &real);
            write_executable(&at, &text)?;
            let flag = if is_scratch { " --scratch" } else { "" };
            lines.push(format!(
                "{}: corral run {profile}{flag} -- {}",
                at.display(),
                real.display()
            ));
        }
    }
    if !missing.is_empty() {
        let msg = format!(
            "not found on PATH (outside {}): {}",
            dir.display(),
            missing.join(", ")
        );
        if explicit {
            bail!("{msg}; install the harness first, then run `corral shim install` again");
        }
        if lines.is_empty() {
            bail!("no harness found on PATH to wrap ({msg})");
        }
        lines.push(format!("skipped, {msg}"));
    }
    Ok(lines)
}

/// Move a non-shim file at `dir/file` aside; `Ok(None)` when there was none (or a shim).
fn displace(dir: &Path, file: &str) -> anyhow::Result<Option<PathBuf>> {
    let at = dir.join(file);
    match std::fs::symlink_metadata(&at) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", at.display())),
        Ok(_) if is_shim(&at) => return Ok(None),
        Ok(_) => {}
    }
    let store = dir.join(DISPLACED);
    std::fs::create_dir_all(&store)
        .with_context(|| format!("cannot create {}", store.display()))?;
    let to = store.join(file);
    if std::fs::symlink_metadata(&to).is_ok() {
        bail!(
            "{} is already kept aside at {}; move one of them away by hand",
            at.display(),
            to.display()
        );
    }
    std::fs::rename(&at, &to)
        .with_context(|| format!("cannot move {} to {}", at.display(), to.display()))?;
    Ok(Some(to))
}

fn write_executable(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.corral-{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// An installed shim, as read back from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shim {
    pub path: PathBuf,
    pub profile: String,
    pub command: String,
    pub scratch: bool,
}

impl Shim {
    /// `corral shim list --json`: the wrapper's path, profile, the real command it runs and
    /// whether it adds `--scratch`.
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "path": self.path,
            "profile": self.profile,
            "command": self.command,
            "scratch": self.scratch,
        })
    }

    fn describe(&self) -> String {
        let flag = if self.scratch { " --scratch" } else { "" };
        format!(
            "{}\tcorral run {}{flag} -- {}",
            self.path.display(),
            self.profile,
            self.command
        )
    }
}

fn read_shim(path: &Path) -> Option<Shim> {
    if !is_shim(path) {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("# profile="))?;
    let mut profile = None;
    let mut command = None;
    let mut scratch = false;
    for kv in line.trim_start_matches("# ").split(' ') {
        match kv.split_once('=') {
            Some(("profile", v)) => profile = Some(v.to_string()),
            Some(("command", v)) => command = Some(v.to_string()),
            Some(("scratch", v)) => scratch = v == "true",
            _ => {}
        }
    }
    Some(Shim {
        path: path.to_path_buf(),
        profile: profile?,
        command: command?,
        scratch,
    })
}

/// The shims in `dir`, sorted by file name.
pub fn list(dir: &Path) -> anyhow::Result<Vec<Shim>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut shims: Vec<Shim> = entries
        .filter_map(Result::ok)
        .filter_map(|e| read_shim(&e.path()))
        .collect();
    shims.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(shims)
}

/// Remove the shims of `profiles` (every shim in `dir` when empty) and restore what they
/// displaced.
pub fn remove(dir: &Path, profiles: &[String]) -> anyhow::Result<Vec<String>> {
    for p in profiles {
        command_of(p)?;
    }
    let mut lines = Vec::new();
    for shim in list(dir)? {
        if !profiles.is_empty() && !profiles.contains(&shim.profile) {
            continue;
        }
        std::fs::remove_file(&shim.path)
            .with_context(|| format!("cannot remove {}", shim.path.display()))?;
        lines.push(format!("removed {}", shim.path.display()));
        let file = shim.path.file_name().expect("a shim has a name").to_owned();
        let kept = dir.join(DISPLACED).join(&file);
        if std::fs::symlink_metadata(&kept).is_ok() {
            std::fs::rename(&kept, &shim.path).with_context(|| {
                format!(
                    "cannot restore {} to {}",
                    kept.display(),
                    shim.path.display()
                )
            })?;
            lines.push(format!("restored {}", shim.path.display()));
        }
    }
    // The store goes away once it is empty (remove_dir refuses a non-empty one).
    let _ = std::fs::remove_dir(dir.join(DISPLACED));
    if lines.is_empty() {
        let which = if profiles.is_empty() {
            String::new()
        } else {
            format!(" for {}", profiles.join(", "))
        };
        lines.push(format!("no shims{which} in {}", dir.display()));
    }
    Ok(lines)
}

/// Warnings about PATH order: the shim directory must come before the directories holding the
/// real binaries, or the harness still runs unjailed by its usual name.
pub fn path_warnings(dir: &Path, path: &std::ffi::OsStr) -> Vec<String> {
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let dir_c = canon(dir);
    let entries: Vec<PathBuf> = std::env::split_paths(path).collect();
    let Some(pos) = entries.iter().position(|e| canon(e) == dir_c) else {
        return vec![format!(
            "{} is not on PATH; add it in front, e.g. `export PATH=\"{}:$PATH\"` in your shell's rc file",
            dir.display(),
            dir.display()
        )];
    };
    let mut out = Vec::new();
    for shim in list(dir).unwrap_or_default() {
        let name = shim.path.file_name().unwrap_or_default();
        if let Some(earlier) = entries[..pos]
            .iter()
            .filter(|e| e.is_absolute())
            .find(|e| is_executable_file(&e.join(name)) && !is_shim(&e.join(name)))
        {
            out.push(format!(
                "{} comes before {} on PATH: `{}` still runs {} unjailed; put {} first",
                earlier.display(),
                dir.display(),
                name.to_string_lossy(),
                earlier.join(name).display(),
                dir.display()
            ));
        }
    }
    out
}
