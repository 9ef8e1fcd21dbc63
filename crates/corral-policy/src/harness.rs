//! Files in a harness's state directories that its settings name as commands.
//!
//! A setting that runs a command can name a script kept next to the settings: Claude Code's
//! `/statusline` writes `~/.claude/statusline-command.sh` and points `statusLine.command` at it,
//! hooks call `~/.claude/hooks/x.sh`, pi's `extensions` list files. The settings themselves are
//! read-only or guarded, but the script they name would stay writable in the jail, and a host
//! run of the harness would run what the jail wrote into it. So every existing regular file
//! below a state directory that a string value of a code-bearing settings file names (a word of
//! it, `~/` or `$HOME/` expanded) is protected as well.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::plan::ConfigFormat;

/// Settings files larger than this are not searched.
const MAX_BYTES: u64 = 1 << 20;

/// The existing regular files strictly below one of `state_dirs` that a string value of one of
/// `settings` (path and syntax; missing or unreadable ones are skipped) names.
pub fn named_files(
    settings: &[(PathBuf, ConfigFormat)],
    state_dirs: &[PathBuf],
    home: &Path,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (file, format) in settings {
        let Some(value) = load(file, *format) else {
            continue;
        };
        let mut strings = Vec::new();
        collect_strings(&value, &mut strings);
        for s in strings {
            for word in words(s) {
                let Some(path) = expand(word, home) else {
                    continue;
                };
                let below = state_dirs.iter().any(|d| path.starts_with(d) && path != *d);
                let is_file = path
                    .symlink_metadata()
                    .is_ok_and(|m| m.file_type().is_file());
                if below && is_file && !out.contains(&path) {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    out
}

fn load(file: &Path, format: ConfigFormat) -> Option<Value> {
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_BYTES {
        return None;
    }
    let text = std::fs::read_to_string(file).ok()?;
    match format {
        ConfigFormat::Json => serde_json::from_str(&text).ok(),
        ConfigFormat::Toml => toml::from_str(&text).ok(),
    }
}

fn collect_strings<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(m) => m.values().for_each(|v| collect_strings(v, out)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The words of a command line, split at blanks, quotes and shell operators.
fn words(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| c.is_whitespace() || "\"'`;&|()<>=".contains(c))
        .filter(|w| !w.is_empty())
}

/// A word as an absolute path: `~/`, `$HOME/` and `${HOME}/` expanded; `None` when relative.
fn expand(word: &str, home: &Path) -> Option<PathBuf> {
    for prefix in ["~/", "$HOME/", "${HOME}/"] {
        if let Some(rest) = word.strip_prefix(prefix) {
            return Some(normal(&home.join(rest)));
        }
    }
    word.starts_with('/').then(|| normal(Path::new(word)))
}

/// `..` and `.` resolved lexically, so `~/.claude/../.bashrc` is not below `~/.claude`.
fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_that_settings_name_in_a_state_directory_are_found() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().canonicalize().unwrap();
        let claude = home.join(".claude");
        std::fs::create_dir_all(claude.join("hooks")).unwrap();
        for f in ["statusline-command.sh", "hooks/check.sh", "CLAUDE.md"] {
            std::fs::write(claude.join(f), "#!/bin/sh\n").unwrap();
        }
        std::fs::write(home.join("outside.sh"), "").unwrap();
        let settings = claude.join("settings.json");
        std::fs::write(
            &settings,
            serde_json::json!({
                "statusLine": {"type": "command", "command": "bash ~/.claude/statusline-command.sh"},
                "hooks": {"PreToolUse": [{"hooks": [{"type": "command",
                    "command": format!("\"{}\" --strict", claude.join("hooks/check.sh").display())}]}]},
                "apiKeyHelper": "$HOME/outside.sh",
                "other": "cd ~/.claude && ls; cat ~/.claude/../outside.sh ~/.claude/missing.sh ~/.claude"
            })
            .to_string(),
        )
        .unwrap();
        assert_eq!(
            named_files(
                &[
                    (settings, ConfigFormat::Json),
                    (claude.join("absent.json"), ConfigFormat::Json)
                ],
                std::slice::from_ref(&claude),
                &home
            ),
            vec![
                claude.join("hooks/check.sh"),
                claude.join("statusline-command.sh")
            ]
        );
    }
}
