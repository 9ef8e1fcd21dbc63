//! Walking the project for the files `filesystem.hide` masks.

use std::path::{Path, PathBuf};

use crate::error::PolicyError;

/// The `hide` glob of one pattern: without a slash it matches at any depth; with one it is
/// anchored at the project root.
pub(super) fn hide_glob(pattern: &str) -> Result<globset::Glob, String> {
    let p = pattern.trim_end_matches('/');
    if p.is_empty() || p == "/" {
        return Err(format!("filesystem.hide: empty pattern {pattern:?}"));
    }
    let g = if let Some(anchored) = p.strip_prefix('/') {
        anchored.to_string()
    } else if p.contains('/') {
        p.to_string()
    } else {
        format!("**/{p}")
    };
    globset::GlobBuilder::new(&g)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("filesystem.hide: invalid pattern {pattern:?}: {e}"))
}

/// Entries a project walk ([`find_masked`], the change summary's) visits on the calling thread
/// before it starts over in parallel: a small project is listed without starting (and waiting
/// for) walker threads, which on a busy machine costs more than the walk itself.
pub const SEQUENTIAL_WALK_MAX: usize = 4096;

/// A walker over the whole of `root` as it is on disk: every ignore filter off (a `.gitignore`
/// must not hide a file from corral), links not followed, and `skip` not entered.
pub fn raw_walker(root: &Path, skip: PathBuf) -> ignore::WalkBuilder {
    let mut builder = ignore::WalkBuilder::new(root);
    builder
        .standard_filters(false)
        .hidden(false)
        .parents(false)
        .ignore(false)
        .git_ignore(false)
        .git_global(false)
        .git_exclude(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(move |e| e.path() != skip);
    builder
}

/// Every entry under `root` matched by one of the `hide` patterns, found with every ignore
/// filter off (a `.gitignore` must not hide `.env` from this search), not descending into
/// `.git/objects` or into a matched directory: on this thread for a tree of at most
/// [`SEQUENTIAL_WALK_MAX`] entries, else in one parallel walk. Sorted.
pub fn find_masked(root: &Path, patterns: &[String]) -> Result<Vec<PathBuf>, PolicyError> {
    let mut b = globset::GlobSetBuilder::new();
    for p in patterns {
        b.add(hide_glob(p).map_err(PolicyError::Invalid)?);
    }
    let set = b
        .build()
        .map_err(|e| PolicyError::Invalid(format!("filesystem.hide: {e}")))?;
    if patterns.is_empty() {
        return Ok(Vec::new());
    }
    let builder = raw_walker(root, root.join(".git/objects"));
    // A small project is walked on this thread: starting the walker's threads (and waiting for
    // every one of them to be scheduled and go idle) costs more than the walk on a busy
    // machine, and this walk is on the path of every `corral run`. Beyond
    // SEQUENTIAL_WALK_MAX entries, start over in parallel.
    let mut small = Vec::new();
    // Matched directories: what lies below them is not listed (their mount covers it).
    let mut covered: Vec<PathBuf> = Vec::new();
    let mut complete = true;
    for (seen, entry) in builder.build().enumerate() {
        if seen >= SEQUENTIAL_WALK_MAX {
            complete = false;
            break;
        }
        // An unreadable directory cannot be listed by the jail's user either.
        let Ok(entry) = entry else { continue };
        let Ok(rel) = entry.path().strip_prefix(root) else {
            continue;
        };
        if rel.as_os_str().is_empty()
            || !set.is_match(rel)
            || covered.iter().any(|d| entry.path().starts_with(d))
        {
            continue;
        }
        if entry.file_type().is_some_and(|t| t.is_dir()) {
            covered.push(entry.path().to_path_buf());
        }
        small.push(entry.path().to_path_buf());
    }
    if complete {
        small.sort();
        return Ok(small);
    }
    let found = std::sync::Mutex::new(Vec::new());
    let errors = std::sync::Mutex::new(None);
    builder.build_parallel().run(|| {
        let set = &set;
        let found = &found;
        let errors = &errors;
        Box::new(move |entry| {
            use ignore::WalkState;
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    // An unreadable directory cannot be listed by the jail's user either;
                    // remember the first error for the report and keep walking.
                    let mut slot = errors.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert_with(|| e.to_string());
                    return WalkState::Continue;
                }
            };
            let Ok(rel) = entry.path().strip_prefix(root) else {
                return WalkState::Continue;
            };
            if rel.as_os_str().is_empty() || !set.is_match(rel) {
                return WalkState::Continue;
            }
            found
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(entry.path().to_path_buf());
            if entry.file_type().is_some_and(|t| t.is_dir()) {
                WalkState::Skip
            } else {
                WalkState::Continue
            }
        })
    });
    let mut found = found.into_inner().unwrap_or_else(|p| p.into_inner());
    found.sort();
    Ok(found)
}
