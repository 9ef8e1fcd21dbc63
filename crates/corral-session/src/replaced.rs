//! Hidden files the host replaced during the run. A hidden file or directory (`filesystem.hide`: `.env`) or
//! a sign-in credential file is, in the jail, a read-only placeholder bound over the one file.
//! When the host replaces that file by rename during the run (an editor that saves by rename,
//! the host's own harness refreshing its credentials), the kernel detaches the jail's bind of
//! it, and from then on the jail reads the host's new file: nothing stops a read-open (the name
//! gate keeps it from being written; docs/host-safety.md, "Known limits"). That cannot be
//! undone after the fact, so it is said: each such file is listed when the run ends, on stderr
//! and in the audit log (`exposed`), so the user knows what to rotate.
//!
//! Likewise for a file `filesystem.hide` matches that nobody masked ([`appeared`]): masking is
//! decided when the run starts, so a `.env` the host made during the run (or the executor, or
//! the jail where the name gate does not run) was readable in the jail.
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

use corral_policy::plan::Plan;

/// The hidden files as they were when the run started: (path, device, inode), each held open
/// (O_PATH) for the run so its inode number cannot pass to a file the host puts in its place.
pub struct Watch(Vec<(PathBuf, u64, u64, Option<std::fs::File>)>);

/// Take the hidden files and directories and the sign-in files of `plan` that exist now.
pub fn snapshot(plan: &Plan) -> Watch {
    let files = plan
        .masked
        .iter()
        .chain(plan.signin.iter().map(|s| &s.file))
        .filter_map(|p| {
            let held = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
                .open(p)
                .ok();
            let m = match &held {
                Some(f) => f.metadata().ok()?,
                None => std::fs::symlink_metadata(p).ok()?,
            };
            Some((p.clone(), m.dev(), m.ino(), held))
        })
        .collect();
    Watch(files)
}

/// One line for each hidden file another file stands at now, or that is gone (the jail cannot
/// remove one while its placeholder is there; after the host replaced it, it could read the new
/// one and then remove it).
pub fn check(watch: Watch) -> Vec<String> {
    watch
        .0
        .into_iter()
        .filter(|(p, dev, ino, _)| {
            std::fs::symlink_metadata(p).map_or(true, |m| (m.dev(), m.ino()) != (*dev, *ino))
        })
        .map(|(p, ..)| {
            format!(
                "{} was replaced or removed on the host during the run (an editor saving by \
                 rename does that), which detached the jail's placeholder of it: from then on \
                 the jail could read whatever the host put there. Treat what it held as seen by \
                 the jail; to avoid this, do not edit hidden files or refresh a jailed \
                 harness's sign-in on the host while a run lasts.",
                corral_audit::printable(&p.display().to_string())
            )
        })
        .collect()
}

/// One line for each file or directory in the project that `plan`'s `filesystem.hide`
/// patterns match now but that was not masked when the run started (`plan.masked`, or below a
/// masked directory): the jail could read it. Found by the same walk and matcher as the
/// masking (the project's tree index, `corral_policy::tree`, updated now); a directory only
/// unreadable to that search is not named unless a pattern matches it.
pub fn appeared(plan: &Plan) -> Vec<String> {
    if plan.hide.is_empty() {
        return Vec::new();
    }
    let root = &plan.project.root;
    appeared_in(
        plan,
        &corral_policy::tree::update(root, std::slice::from_ref(root), &plan.hide),
    )
}

/// [`appeared`] with the project's tree index as updated after the jail ended.
pub fn appeared_in(plan: &Plan, tree: &corral_policy::tree::Tree) -> Vec<String> {
    if plan.hide.is_empty() {
        return Vec::new();
    }
    let root = &plan.project.root;
    // The patterns are compiled only when something was found (most runs: nothing).
    let found = tree
        .masked(&plan.hide)
        .and_then(|found| match found.is_empty() {
            true => Ok((found, None)),
            false => Ok((found, Some(corral_policy::hide::HideSet::new(&plan.hide)?))),
        });
    let (found, set) = match found {
        Ok(f) => f,
        Err(e) => {
            return vec![format!(
                "could not look for hidden files that appeared during the run in {}: {e}",
                corral_audit::printable(&root.display().to_string())
            )];
        }
    };
    found
        .into_iter()
        .filter(|p| {
            p.strip_prefix(root)
                .is_ok_and(|rel| set.as_ref().is_some_and(|s| s.is_match(rel)))
        })
        .filter(|p| !plan.masked.iter().any(|m| p.starts_with(m)))
        .map(|p| {
            format!(
                "{} matches `filesystem.hide` but was not masked in this run (it appeared \
                 during the run: made on the host, by the executor, or by the jail), so the \
                 jail could read it. Treat what it holds as seen by the jail; the next run \
                 masks it.",
                corral_audit::printable(&p.display().to_string())
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_replaced_or_removed_is_listed_and_one_written_in_place_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let env = dir.path().join(".env");
        let kept = dir.path().join("kept");
        let gone = dir.path().join("gone");
        for f in [&env, &kept, &gone] {
            std::fs::write(f, "A=1").unwrap();
        }
        let watch = Watch(
            [&env, &kept, &gone]
                .iter()
                .map(|p| {
                    let m = std::fs::metadata(p).unwrap();
                    (p.to_path_buf(), m.dev(), m.ino(), None)
                })
                .collect(),
        );
        std::fs::write(dir.path().join(".env.tmp"), "A=2").unwrap();
        std::fs::rename(dir.path().join(".env.tmp"), &env).unwrap();
        std::fs::write(&kept, "A=3").unwrap();
        std::fs::remove_file(&gone).unwrap();
        let lines = check(watch);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[1].starts_with(&gone.display().to_string()),
            "{lines:?}"
        );
        assert!(
            lines[0].starts_with(&env.display().to_string()),
            "{lines:?}"
        );
    }

    #[test]
    fn a_hidden_file_that_appeared_is_listed_and_one_masked_at_start_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let mut plan = Plan::minimal(&root, std::path::Path::new("/home/u"), vec!["true".into()]);
        plan.hide = vec![".env".into(), ".env.*".into(), "secrets/".into()];
        for d in ["secrets", "sub"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        for f in [".env", "secrets/.env", "sub/.env.local", "notes.txt"] {
            std::fs::write(root.join(f), "A=1").unwrap();
        }
        // `.env` and `secrets/` were masked when the run started; `sub/.env.local` appeared.
        plan.masked = vec![root.join(".env"), root.join("secrets")];
        let lines = appeared(&plan);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(&format!(
                "{} matches `filesystem.hide` but was not masked",
                root.join("sub/.env.local").display()
            )),
            "{lines:?}"
        );
        // Nothing to say when nothing appeared, or without patterns.
        std::fs::remove_file(root.join("sub/.env.local")).unwrap();
        assert_eq!(appeared(&plan), Vec::<String>::new());
        std::fs::write(root.join("sub/.env.local"), "A=1").unwrap();
        plan.hide.clear();
        assert_eq!(appeared(&plan), Vec::<String>::new());
    }
}
