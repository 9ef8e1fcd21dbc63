//! The git files that `protect` cannot cover with a read-only placeholder, checked after a
//! native run. `.git/commondir` makes git read another directory's config and hooks (a bare
//! repository the jail wrote, whose `core.fsmonitor` runs on the user's next `git status` on the
//! host); `.git/config.worktree` adds config. Git refuses to work when `commondir` exists in any
//! form, so it cannot be held by an empty placeholder during the run; instead, one the jail
//! created or changed is moved aside when the jail has ended (every process of it is gone by
//! then) and reported.

use std::fs;
use std::path::{Path, PathBuf};

const WATCHED: &[&str] = &[".git/commondir", ".git/config.worktree"];

/// What a watched path held before the run: absent, a regular file's bytes, a link's target,
/// or another kind of file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Absent,
    File(Vec<u8>),
    Link(PathBuf),
    Other,
}

fn state(path: &Path) -> State {
    match fs::symlink_metadata(path) {
        Err(_) => State::Absent,
        Ok(m) if m.file_type().is_symlink() => State::Link(fs::read_link(path).unwrap_or_default()),
        Ok(m) if m.is_file() && m.len() <= 64 * 1024 => {
            fs::read(path).map(State::File).unwrap_or(State::Other)
        }
        Ok(_) => State::Other,
    }
}

/// The watched paths of a project before its jail starts.
pub struct Snapshot(Vec<(PathBuf, State)>);

pub fn snapshot(project_root: &Path) -> Snapshot {
    Snapshot(
        WATCHED
            .iter()
            .map(|rel| {
                let path = project_root.join(rel);
                let s = state(&path);
                (path, s)
            })
            .collect(),
    )
}

/// After the jail has ended: move aside each watched path the run created or changed. One
/// message per path, for stderr and the audit log.
pub fn check(snapshot: Snapshot, jail_id: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (path, before) in snapshot.0 {
        let now = state(&path);
        if now == State::Absent || now == before {
            continue;
        }
        let mut aside = path.clone().into_os_string();
        aside.push(format!(".corral-quarantine-{jail_id}"));
        let aside = PathBuf::from(aside);
        match fs::rename(&path, &aside) {
            Ok(()) => out.push(format!(
                "the jail wrote {}, which would make your next git command read another \
                 repository's config and hooks; moved aside to {} (restore it only if you made it)",
                path.display(),
                aside.display()
            )),
            Err(e) => out.push(format!(
                "the jail wrote {} and it could not be moved aside ({e}): remove it before you run \
                 git in this project",
                path.display()
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_run_created_or_changed_is_moved_aside_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        fs::create_dir(&git).unwrap();
        fs::write(git.join("config.worktree"), "[core]\n").unwrap();
        let s = snapshot(dir.path());
        // Unchanged: kept. New: moved aside.
        fs::write(git.join("commondir"), "../evil\n").unwrap();
        let msgs = check(s, "j1");
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(!git.join("commondir").exists());
        assert_eq!(
            fs::read_to_string(git.join("commondir.corral-quarantine-j1")).unwrap(),
            "../evil\n"
        );
        assert!(git.join("config.worktree").exists());
        // Changed, and replaced by a link: moved aside too.
        let s = snapshot(dir.path());
        fs::remove_file(git.join("config.worktree")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", git.join("config.worktree")).unwrap();
        assert_eq!(check(s, "j2").len(), 1);
        assert!(fs::symlink_metadata(git.join("config.worktree")).is_err());
    }
}
