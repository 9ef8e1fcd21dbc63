//! Hidden files the host replaced during the run. A hidden file or directory (`filesystem.hide`: `.env`) or
//! a sign-in credential file is, in the jail, a read-only placeholder bound over the one file.
//! When the host replaces that file by rename during the run (an editor that saves by rename,
//! the host's own harness refreshing its credentials), the kernel detaches the jail's bind of
//! it, and from then on the jail reads the host's new file: nothing stops a read-open (the name
//! gate keeps it from being written; docs/host-safety.md, "Known limits"). That cannot be
//! undone after the fact, so it is said: each such file is listed when the run ends, on stderr
//! and in the audit log (`exposed`), so the user knows what to rotate.
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
}
