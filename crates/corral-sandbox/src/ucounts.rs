//! What the jail can take of the caller's per-user kernel counts.
//!
//! Some kernel counts are per user, not per process or cgroup: inotify instances and watches,
//! fanotify groups and marks. The jail's processes are the caller's uid, so without a bound a
//! jail can take every inotify instance the user has (128 by default) for as long as it runs,
//! and the user's editor and file watchers on the host then fail. Since Linux 5.11 these counts
//! are kept per user namespace (ucounts) and charged to every ancestor namespace too; each
//! namespace has its own maximum in `/proc/sys/user/`, which only a process with
//! `CAP_SYS_RESOURCE` in that namespace may change. The set-up process holds that capability in
//! the jail's fresh user namespace (the jail's command and PID 1 drop it), so it sets the jail's
//! maxima to a share of the caller's: by construction the jail can take no more, whatever it
//! does, and the host keeps the rest.

use std::io;
use std::path::Path;

use crate::error::JailError;

/// One per-user count: the file that holds its maximum for the calling user namespace, the
/// host-wide file that holds it for the initial namespace (the lower of the two is what the
/// caller has), and the smallest share worth giving a jail.
struct Count {
    per_namespace: &'static str,
    initial: &'static str,
    least: u64,
}

const COUNTS: [Count; 4] = [
    Count {
        per_namespace: "/proc/sys/user/max_inotify_instances",
        initial: "/proc/sys/fs/inotify/max_user_instances",
        least: 8,
    },
    Count {
        per_namespace: "/proc/sys/user/max_inotify_watches",
        initial: "/proc/sys/fs/inotify/max_user_watches",
        least: 8192,
    },
    Count {
        per_namespace: "/proc/sys/user/max_fanotify_groups",
        initial: "/proc/sys/fs/fanotify/max_user_groups",
        least: 1,
    },
    Count {
        per_namespace: "/proc/sys/user/max_fanotify_marks",
        initial: "/proc/sys/fs/fanotify/max_user_marks",
        least: 1024,
    },
];

/// The part of each count the jail gets: a quarter of what the caller has (so the host keeps
/// three quarters with one jail running), never less than the count's `least`.
pub(crate) const SHARE_DIVISOR: u64 = 4;

/// The jail's maximum for each count this kernel keeps per user namespace, read from the
/// caller's namespace before the jail's is made.
pub(crate) struct JailCounts(Vec<(&'static str, u64)>);

impl JailCounts {
    /// Read the caller's maxima (call before unsharing the user namespace). A count the kernel
    /// does not keep per namespace (no file under `/proc/sys/user`) is left out: there is no
    /// maximum to set for it. Any other error refuses the jail: a bound that cannot be read is
    /// not silently skipped.
    pub(crate) fn read() -> Result<JailCounts, JailError> {
        let mut out = Vec::new();
        for count in &COUNTS {
            let Some(own) = read_count(Path::new(count.per_namespace))? else {
                continue;
            };
            let caller = match read_count(Path::new(count.initial))? {
                Some(initial) => own.min(initial),
                None => own,
            };
            out.push((count.per_namespace, jail_share(caller, count.least)));
        }
        Ok(JailCounts(out))
    }

    /// Set the jail's maxima in the jail's user namespace (call in the set-up process, after
    /// the id maps are written, while it holds `CAP_SYS_RESOURCE` there).
    pub(crate) fn apply(&self) -> Result<(), JailError> {
        for (file, value) in &self.0 {
            std::fs::write(file, value.to_string())
                .map_err(|e| JailError::at("bound the jail's per-user kernel counts", file, e))?;
        }
        Ok(())
    }
}

/// A jail's share of a count the caller has `caller` of.
pub(crate) fn jail_share(caller: u64, least: u64) -> u64 {
    (caller / SHARE_DIVISOR).max(least).min(caller)
}

/// The number in a /proc/sys file; `None` when the file does not exist.
fn read_count(path: &Path) -> Result<Option<u64>, JailError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(JailError::at("read a per-user kernel count", path, e)),
    };
    text.trim().parse().map(Some).map_err(|_| {
        JailError::at(
            "read a per-user kernel count",
            path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a number: {text:?}"),
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jail_gets_a_quarter_of_each_count_never_less_than_its_least_nor_more_than_the_caller() {
        let cases = [
            // (caller's maximum, least, jail's maximum)
            (128, 8, 32),
            (192_546, 8192, 48_136),
            (16, 8, 8),
            (4, 8, 4),
            (0, 8, 0),
            (i32::MAX as u64, 1, i32::MAX as u64 / 4),
        ];
        for (caller, least, want) in cases {
            assert_eq!(
                jail_share(caller, least),
                want,
                "caller {caller}, least {least}"
            );
        }
    }

    #[test]
    fn a_count_this_kernel_does_not_keep_is_absent_and_garbage_is_an_error() {
        let dir = std::env::temp_dir().join(format!("corral-ucounts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(read_count(&dir.join("absent")).unwrap().is_none());
        std::fs::write(dir.join("n"), "128\n").unwrap();
        assert_eq!(read_count(&dir.join("n")).unwrap(), Some(128));
        std::fs::write(dir.join("bad"), "many\n").unwrap();
        let err = read_count(&dir.join("bad")).unwrap_err().to_string();
        assert!(err.contains("not a number"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_callers_counts_are_read_here() {
        // This kernel keeps inotify per user namespace (5.11+); a jail gets a share of each.
        let counts = JailCounts::read().unwrap();
        if !Path::new(COUNTS[0].per_namespace).exists() {
            eprintln!("skipped: this kernel keeps no per-namespace inotify count");
            return;
        }
        assert!(
            counts
                .0
                .iter()
                .any(|(f, n)| *f == COUNTS[0].per_namespace && *n >= 1)
        );
    }
}
