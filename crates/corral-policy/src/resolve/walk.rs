//! Walking the project for the files `filesystem.hide` masks.

use std::path::{Path, PathBuf};

use crate::error::PolicyError;

/// Entries a project walk ([`walk_tree`]) visits on the calling thread before the directories
/// it has not read yet are shared among threads: a small project is listed without starting
/// (and waiting for) threads, which on a busy machine costs more than the walk itself.
pub const SEQUENTIAL_WALK_MAX: usize = 4096;

/// What a [`walk_tree`] visitor makes of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read this entry (a directory) too.
    Enter,
    /// Go on with the next entry.
    Next,
    /// End the walk, on every thread.
    Stop,
}

/// What a [`walk_tree`] visitor is shown.
pub enum Seen<'a> {
    /// An entry of a directory being read.
    Entry(&'a std::fs::DirEntry),
    /// A directory that could not be opened, or whose listing failed partway (the entries read
    /// before the error were shown): the rest of it is not read.
    Unreadable(&'a Path, &'a std::io::Error),
}

/// Read every directory under `root` once, as it is on disk (no ignore file applies, links are
/// not followed), calling `visit` with each entry (and each directory it cannot read) and the
/// calling thread's output list: only the entries it answers [`Step::Enter`] are read in turn.
/// Plain `readdir`: an entry's type comes with it (`DirEntry::file_type`), so nothing costs a
/// `stat` the visitor does not ask for. On this thread up to [`SEQUENTIAL_WALK_MAX`] entries;
/// beyond, the directories not read yet are shared among up to four threads (nothing is read
/// twice). Returns what the visitors put out, in no particular order, and whether one of them
/// stopped the walk. A visitor's panic ends the walk on every thread and goes on in the caller.
pub fn walk_tree<T, F>(root: &Path, visit: F) -> (Vec<T>, bool)
where
    T: Send,
    F: Fn(Seen<'_>, &mut Vec<T>) -> Step + Sync,
{
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    let mut seen = 0;
    // Asked once the tree is known to be large (it reads the process's cgroup files).
    let mut threads = None;
    while let Some(dir) = dirs.pop() {
        match read_dir_into(&dir, &visit, &mut out, &mut dirs) {
            None => return (out, true),
            Some(n) => seen += n,
        }
        if seen > SEQUENTIAL_WALK_MAX && dirs.len() > 1 {
            let threads = *threads.get_or_insert_with(|| {
                std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
            });
            if threads > 1 {
                return walk_shared(dirs, threads, &visit, out);
            }
        }
    }
    (out, false)
}

/// Visit the entries of `dir`, pushing those to enter on `dirs`: how many it had, or `None`
/// when the visitor stopped.
fn read_dir_into<T, F>(
    dir: &Path,
    visit: &F,
    out: &mut Vec<T>,
    dirs: &mut Vec<PathBuf>,
) -> Option<usize>
where
    F: Fn(Seen<'_>, &mut Vec<T>) -> Step,
{
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return (visit(Seen::Unreadable(dir, &e), out) != Step::Stop).then_some(0),
    };
    let mut n = 0;
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => return (visit(Seen::Unreadable(dir, &e), out) != Step::Stop).then_some(n),
        };
        n += 1;
        match visit(Seen::Entry(&entry), out) {
            Step::Enter => dirs.push(entry.path()),
            Step::Next => {}
            Step::Stop => return None,
        }
    }
    Some(n)
}

/// The rest of a [`walk_tree`]: `threads` threads take directories from one shared stack until
/// it is empty and no thread is reading one (or a visitor stopped).
fn walk_shared<T, F>(
    dirs: Vec<PathBuf>,
    threads: usize,
    visit: &F,
    mut out: Vec<T>,
) -> (Vec<T>, bool)
where
    T: Send,
    F: Fn(Seen<'_>, &mut Vec<T>) -> Step + Sync,
{
    struct Shared {
        dirs: Vec<PathBuf>,
        /// Threads reading a directory (which may add more).
        busy: usize,
        stopped: bool,
    }
    let shared = std::sync::Mutex::new(Shared {
        dirs,
        busy: 0,
        stopped: false,
    });
    let more = std::sync::Condvar::new();
    let lock = || shared.lock().unwrap_or_else(|p| p.into_inner());
    let outputs: Vec<Vec<T>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    let mut found = Vec::new();
                    loop {
                        let dir = {
                            let mut g = lock();
                            loop {
                                if g.stopped {
                                    return mine;
                                }
                                if let Some(d) = g.dirs.pop() {
                                    g.busy += 1;
                                    break d;
                                }
                                if g.busy == 0 {
                                    return mine;
                                }
                                g = more.wait(g).unwrap_or_else(|p| p.into_inner());
                            }
                        };
                        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            read_dir_into(&dir, visit, &mut mine, &mut found)
                        }));
                        let stop = match read {
                            Ok(read) => read.is_none(),
                            Err(panic) => {
                                // The others must not wait for this thread's directories.
                                let mut g = lock();
                                g.busy -= 1;
                                g.stopped = true;
                                drop(g);
                                more.notify_all();
                                std::panic::resume_unwind(panic);
                            }
                        };
                        let mut g = lock();
                        g.busy -= 1;
                        g.stopped |= stop;
                        g.dirs.append(&mut found);
                        drop(g);
                        more.notify_all();
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for o in outputs {
        out.extend(o);
    }
    let stopped = shared
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .stopped;
    (out, stopped)
}

/// Every entry under `root` matched by one of the `hide` patterns, found with every ignore
/// filter off (a `.gitignore` must not hide `.env` from this search), not descending into
/// `.git/objects` or into a matched directory, links not followed. Sorted.
///
/// One [`walk_tree`], which reads each directory once and stats no file (the `ignore` crate's
/// walker, used before, cost several times the CPU per entry, and walked a tree of more than
/// [`SEQUENTIAL_WALK_MAX`] entries twice: docs/BENCHMARKS.md "Policy"). A directory below the
/// root that cannot be read is masked whole: the jail's user may be its owner, able to make
/// it readable and read what this walk could not see.
pub fn find_masked(root: &Path, patterns: &[String]) -> Result<Vec<PathBuf>, PolicyError> {
    let set = crate::hide::HideSet::new(patterns)?;
    if set.is_empty() {
        return Ok(Vec::new());
    }
    let objects = root.join(".git/objects");
    let (mut found, _) = walk_tree(root, |seen, found: &mut Vec<PathBuf>| {
        let entry = match seen {
            Seen::Entry(entry) => entry,
            // The jail runs as the directory's owner, who could make it readable and read a
            // file this walk did not see: it is masked whole. One that is gone is not.
            Seen::Unreadable(dir, e) => {
                if dir != root && e.kind() != std::io::ErrorKind::NotFound {
                    found.push(dir.to_path_buf());
                }
                return Step::Next;
            }
        };
        let path = entry.path();
        if path == objects {
            return Step::Next;
        }
        match path.strip_prefix(root) {
            // A matched directory's mount covers what lies below it.
            Ok(rel) if set.is_match(rel) => found.push(path),
            Ok(_) if entry.file_type().is_ok_and(|t| t.is_dir()) => return Step::Enter,
            _ => {}
        }
        Step::Next
    });
    found.sort();
    // A directory whose listing failed partway is masked whole, after some of its entries
    // were: one mount covers them (a path sorts right before those below it).
    found.dedup_by(|below, dir| below.starts_with(dir));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dirs` directories of `files` files each under `root/many`, each with a directory
    /// `deeper` of 5 files, and one symlink to `root`.
    fn tree(root: &Path, dirs: usize, files: usize) {
        for d in 0..dirs {
            let sub = root.join(format!("many/d{d}"));
            std::fs::create_dir_all(sub.join("deeper")).unwrap();
            for f in 0..files {
                std::fs::write(sub.join(format!("f{f}")), "").unwrap();
            }
            for f in 0..5 {
                std::fs::write(sub.join(format!("deeper/g{f}")), "").unwrap();
            }
        }
        std::os::unix::fs::symlink(root, root.join("many/loop")).unwrap();
    }

    /// Every entry under `root`, directories entered; from the `at`-th entry on, `then()`
    /// answers instead.
    fn walk_until(root: &Path, at: usize, then: impl Fn() -> Step + Sync) -> (Vec<PathBuf>, bool) {
        let count = std::sync::atomic::AtomicUsize::new(0);
        walk_tree(root, |seen, out: &mut Vec<PathBuf>| {
            let Seen::Entry(e) = seen else {
                return Step::Next;
            };
            if count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= at {
                return then();
            }
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                Step::Enter
            } else {
                Step::Next
            }
        })
    }

    #[test]
    fn a_walk_lists_each_entry_once_on_one_thread_or_shared() {
        for (dirs, files) in [(3, 5), (60, 100)] {
            let t = tempfile::tempdir().unwrap();
            tree(t.path(), dirs, files);
            let (mut found, stopped) = walk_until(t.path(), usize::MAX, || Step::Next);
            assert!(!stopped);
            let n = found.len();
            found.sort();
            found.dedup();
            assert_eq!(found.len(), n, "an entry listed twice");
            // many, its directories, their files and `deeper`s, the link (not followed).
            assert_eq!(n, 1 + dirs * (1 + files + 1 + 5) + 1);
            for last in [format!("f{}", files - 1), "deeper/g4".into()] {
                let path = t.path().join(format!("many/d{}/{last}", dirs - 1));
                assert!(found.contains(&path), "{} not listed", path.display());
            }
        }
    }

    #[test]
    fn a_visitor_stops_the_walk_on_every_thread() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path(), 60, 100);
        let (found, stopped) = walk_until(t.path(), 5000, || Step::Stop);
        assert!(stopped);
        assert!(
            found.len() <= 5000,
            "{} entries after the stop",
            found.len()
        );
    }

    #[test]
    fn a_visitor_that_panics_ends_the_walk_and_the_panic_goes_on() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path(), 60, 100);
        // Past the first 4,096 entries: on the shared threads.
        let walk =
            std::panic::catch_unwind(|| walk_until(t.path(), 5000, || panic!("a visitor's bug")));
        assert!(walk.is_err(), "the panic was swallowed");
    }

    #[test]
    fn an_unreadable_directory_is_shown_to_the_visitor() {
        let t = tempfile::tempdir().unwrap();
        let (found, _) = walk_tree(&t.path().join("absent"), |seen, out: &mut Vec<String>| {
            if let Seen::Unreadable(dir, e) = seen {
                out.push(format!("{}: {:?}", dir.display(), e.kind()));
            }
            Step::Next
        });
        assert_eq!(found.len(), 1);
        assert!(found[0].ends_with("absent: NotFound"), "{found:?}");
    }

    #[test]
    fn masked_entries_are_found_in_a_large_tree_but_not_below_a_match() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path(), 60, 100);
        for d in [0, 59] {
            std::fs::write(t.path().join(format!("many/d{d}/.env")), "").unwrap();
        }
        std::fs::create_dir_all(t.path().join("secrets.d/inner")).unwrap();
        std::fs::write(t.path().join("secrets.d/inner/.env"), "").unwrap();
        std::fs::create_dir_all(t.path().join(".git/objects/aa")).unwrap();
        std::fs::write(t.path().join(".git/objects/aa/.env"), "").unwrap();
        let found = find_masked(t.path(), &[".env".into(), "secrets.d".into()]).unwrap();
        let rel: Vec<_> = found
            .iter()
            .map(|p| {
                p.strip_prefix(t.path())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(rel, ["many/d0/.env", "many/d59/.env", "secrets.d"]);
    }
}
