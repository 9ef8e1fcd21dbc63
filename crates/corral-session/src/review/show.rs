//! `corral diff`: the change set as a stat (one line per change) or a git-style unified
//! diff, and the manifest of what was shown (`manifest.json`, what accept checks against).

use std::fmt::Write as _;
use std::os::fd::AsFd;
use std::path::Path;

use anyhow::Context;

use super::Paths;
use super::upper::{Change, Entry, What};

/// Text bigger than this is not diffed line by line.
const DIFF_MAX: u64 = 4 << 20;

/// A path the host may run or load as code (hostcode.rs); git's objects are data.
fn host_code(path: &Path) -> bool {
    !path.starts_with(".git/objects") && crate::hostcode::is_host_code(&path.to_string_lossy())
}

/// One line per change, host code first (crate `hostcode.rs`'s names), at most `max` lines
/// and a count of the rest (`usize::MAX`: all).
pub fn stat_lines(changes: &[Change], max: usize) -> Vec<String> {
    let mut order: Vec<&Change> = changes.iter().collect();
    order.sort_by_key(|c| !host_code(&c.path));
    let mut lines: Vec<String> = order.iter().take(max).map(|c| stat_line(c)).collect();
    if order.len() > max {
        lines.push(format!("... and {} more", order.len() - max));
    }
    lines
}

fn stat_line(c: &Change) -> String {
    let letter = match c.what {
        What::Added => "A",
        What::Modified => "M",
        What::Deleted => "D",
    };
    let mut line = format!("{letter} {}", shown(&c.path));
    if c.new.is_dir() || (c.what == What::Deleted && c.old.is_dir()) {
        line.push('/');
    }
    let detail = match (&c.old, &c.new) {
        (_, Entry::Symlink { target }) => format!(" -> {}", corral_audit::printable(target)),
        (
            Entry::File {
                mode: a, sha256: x, ..
            },
            Entry::File {
                mode: b,
                sha256: y,
                size,
            },
        ) => {
            let mut d = String::new();
            if x != y {
                let _ = write!(d, " ({size} bytes)");
            }
            if a != b {
                let _ = write!(d, " mode {a:o} -> {b:o}");
            }
            d
        }
        (Entry::Dir { mode: a }, Entry::Dir { mode: b }) if a != b => {
            format!(" mode {a:o} -> {b:o}")
        }
        (_, Entry::File { size, .. }) => format!(" ({size} bytes)"),
        (_, Entry::Special { what }) => format!(" ({what}: accept refuses it)"),
        _ => String::new(),
    };
    line.push_str(&detail);
    if host_code(&c.path) {
        line.push_str("  [runs on the host]");
    }
    line
}

/// The unified diff of `changes`: the host's project (`a/`) against the review (`b/`).
pub fn unified(paths: &Paths, changes: &[Change]) -> anyhow::Result<String> {
    let host = std::fs::File::open(&paths.root)
        .with_context(|| format!("cannot open {}", paths.root.display()))?;
    let upper = std::fs::File::open(&paths.upper)
        .with_context(|| format!("cannot open {}", paths.upper.display()))?;
    let mut out = String::new();
    for c in changes {
        let p = shown(&c.path);
        match (&c.old, &c.new) {
            (Entry::Dir { mode: a }, Entry::Dir { mode: b }) => {
                let _ = writeln!(
                    out,
                    "diff --git a/{p}/ b/{p}/\nold mode {:o}\nnew mode {:o}",
                    0o40000 | a,
                    0o40000 | b
                );
                continue;
            }
            (Entry::Absent, Entry::Dir { mode }) => {
                let _ = writeln!(
                    out,
                    "diff --git a/{p}/ b/{p}/\nnew directory mode {:o}",
                    0o40000 | mode
                );
                continue;
            }
            (Entry::Dir { .. }, Entry::Absent) => {
                let _ = writeln!(
                    out,
                    "diff --git a/{p}/ b/{p}/\ndeleted directory (and everything below it)"
                );
                continue;
            }
            _ => {}
        }
        let _ = writeln!(out, "diff --git a/{p} b/{p}");
        match (git_mode(&c.old), git_mode(&c.new)) {
            (None, Some(m)) => {
                let _ = writeln!(out, "new file mode {m:o}");
            }
            (Some(m), None) => {
                let _ = writeln!(out, "deleted file mode {m:o}");
            }
            (Some(a), Some(b)) if a != b => {
                let _ = writeln!(out, "old mode {a:o}\nnew mode {b:o}");
            }
            _ => {}
        }
        if let Entry::Special { what } = &c.new {
            let _ = writeln!(out, "a {what}: accept refuses it");
            continue;
        }
        let old = content(host.as_fd(), &c.path, &c.old)?;
        let new = content(upper.as_fd(), &c.path, &c.new)?;
        if old == new {
            continue;
        }
        let (a, b) = (
            if matches!(c.old, Entry::Absent) {
                "/dev/null".to_string()
            } else {
                format!("a/{p}")
            },
            if matches!(c.new, Entry::Absent) {
                "/dev/null".to_string()
            } else {
                format!("b/{p}")
            },
        );
        match (text(&old), text(&new)) {
            (Some(x), Some(y)) => {
                let diff = similar::TextDiff::from_lines(x, y);
                let _ = write!(
                    out,
                    "{}",
                    diff.unified_diff().context_radius(3).header(&a, &b)
                );
                if !y.is_empty() && !y.ends_with('\n') || !x.is_empty() && !x.ends_with('\n') {
                    let _ = writeln!(out, "\\ No newline at end of file");
                }
            }
            _ => {
                let _ = writeln!(out, "Binary files {a} and {b} differ");
            }
        }
    }
    Ok(terminal_safe(&out))
}

/// A path the jail named, as printed: control, invisible and look-alike characters escaped
/// (`corral_audit::printable`, the one escaping function).
pub fn shown(path: &Path) -> String {
    corral_audit::printable(&path.to_string_lossy())
}

/// The diff's text with what would act on the terminal or hide text escaped: control
/// characters but newline and tab, and the bidirectional controls (a jail's file could
/// otherwise move the cursor, set the clipboard, or show code other than what accept applies).
fn terminal_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.extend(c.escape_default()),
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
                out.extend(c.escape_unicode())
            }
            c => out.push(c),
        }
    }
    out
}

fn git_mode(e: &Entry) -> Option<u32> {
    match e {
        Entry::File { mode, .. } => Some(0o100000 | (mode & 0o777)),
        Entry::Symlink { .. } => Some(0o120000),
        _ => None,
    }
}

/// A file's bytes, a link's target; empty for anything else.
fn content(
    root: std::os::fd::BorrowedFd,
    rel: &Path,
    e: &Entry,
) -> anyhow::Result<Option<Vec<u8>>> {
    Ok(match e {
        Entry::File { size, .. } if *size > DIFF_MAX => None,
        Entry::File { .. } => {
            let parent = rel.parent().unwrap_or(Path::new(""));
            let dir = super::hostfs::open_dir(root, parent)?
                .with_context(|| format!("{} is gone", shown(parent)))?;
            let name = rel.file_name().context("a change without a name")?;
            let (bytes, _) = super::hostfs::read_file(dir.as_fd(), name, DIFF_MAX)
                .with_context(|| format!("cannot read {}", shown(rel)))?;
            Some(bytes)
        }
        Entry::Symlink { target } => Some(target.as_bytes().to_vec()),
        _ => Some(Vec::new()),
    })
}

fn text(b: &Option<Vec<u8>>) -> Option<&str> {
    let b = b.as_ref()?;
    if b.contains(&0) {
        return None;
    }
    std::str::from_utf8(b).ok()
}

/// Record `changes` as what `corral diff` showed (for `select`): accept applies only this.
pub fn record_manifest(
    paths: &Paths,
    select: &[std::path::PathBuf],
    changes: &[Change],
) -> anyhow::Result<()> {
    let m = Manifest {
        select: select.to_vec(),
        changes: changes.to_vec(),
    };
    let tmp = paths.dir.join("manifest.json.new");
    let _ = std::fs::remove_file(&tmp);
    super::write_new(&tmp, &serde_json::to_vec_pretty(&m)?)?;
    std::fs::rename(&tmp, paths.manifest())
        .with_context(|| format!("cannot write {}", paths.manifest().display()))?;
    Ok(())
}

/// What one `corral diff` showed.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub select: Vec<std::path::PathBuf>,
    pub changes: Vec<Change>,
}

pub fn read_manifest(paths: &Paths) -> anyhow::Result<Option<Manifest>> {
    match std::fs::read(paths.manifest()) {
        Ok(b) => Ok(Some(serde_json::from_slice(&b).with_context(|| {
            format!("{} is not a manifest", paths.manifest().display())
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", paths.manifest().display())),
    }
}
