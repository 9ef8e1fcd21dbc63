//! The journal of runs in progress: what the after-run checks need, written down before the
//! jail starts, so that a run whose corral was killed (SIGKILL, the OOM killer, a crash) is
//! checked by the next corral command in that project, or by `corral doctor`.
//!
//! A run's entry is `STATE/corral/PROJECT_KEY/journal/JAIL_ID.json` (0600, in a 0700 directory
//! of corral's state, which no jail sees): the jail id, corral's pid, the project, the git
//! snapshot ([`gitguard::Saved`]), the set-id watch ([`setid::Watch`]) and the run's own
//! directories on the host (`Attachments::host_dirs`: the executor's socket, the resolver's and
//! the gateway's files, in the runtime and temporary directories). It is written to a
//! temporary name, locked (`flock`, exclusive), then renamed into place, and the lock is held
//! until the run's checks are done and the entry removed. Its `fsync` runs on a thread while
//! the jail is built; the jail's command waits for it ([`Running::synced`]). The kernel drops the lock when the
//! process dies however it dies, so a lock that can be taken is a run that did not end: no pid
//! is compared, and a pid the system gave again cannot pass for the run.
//!
//! [`finish_unended`] takes each such entry's lock (two commands cannot check one run twice),
//! runs the git check (planted hooks, configs, gitlinks, repositories moved aside) and the
//! set-id check on what the entry names, says what it found, records it in the project's audit
//! log, removes the run's own directories (only this user's, no symlink followed), and removes
//! the entry. Not done for such a run: the change summary (its baseline was in
//! corral's memory).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use corral_audit::{AuditLog, Event, JailEvent, Record, printable};
use nix::fcntl::{Flock, FlockArg};

use crate::{endlines, gitguard, setid};

/// A path written as its bytes (an `OsString`), whatever their encoding.
pub(crate) mod path_bytes {
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    pub fn serialize<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(p.as_os_str(), s)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        <OsString as serde::Deserialize>::deserialize(d).map(PathBuf::from)
    }
}

/// [`path_bytes`] for a list.
pub(crate) mod paths_bytes {
    use std::ffi::OsString;
    use std::path::PathBuf;

    pub fn serialize<S: serde::Serializer>(p: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(p.iter().map(|p| p.as_os_str()))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
        <Vec<OsString> as serde::Deserialize>::deserialize(d)
            .map(|v| v.into_iter().map(PathBuf::from).collect())
    }
}

/// One run in progress.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    jail_id: String,
    /// corral's pid, for the message only (the lock says whether it still runs).
    pid: u32,
    root: OsString,
    git: Option<gitguard::Saved>,
    set_id: setid::Watch,
    /// The run's own directories on the host (`Attachments::host_dirs`), removed at its end.
    #[serde(default, with = "paths_bytes")]
    dirs: Vec<PathBuf>,
}

/// The entry of this process's run, locked until [`Running::done`].
pub struct Running {
    path: PathBuf,
    _lock: Flock<std::fs::File>,
    /// The entry's `fsync`, on a thread of its own while the jail is built ([`Running::synced`]).
    sync: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Running {
    /// Wait until the entry is on disk (not only in the page cache: a machine that goes down
    /// with the run still finds it). Call before the jail's command can run.
    pub fn synced(&mut self) -> anyhow::Result<()> {
        let Some(sync) = self.sync.take() else {
            return Ok(());
        };
        sync.join()
            .map_err(|_| anyhow::anyhow!("the journal's sync thread panicked"))?
            .with_context(|| format!("cannot write the journal entry {}", self.path.display()))
    }

    /// The run's checks are done: its entry goes.
    pub fn done(self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            endlines::say(&format!(
                "corral: cannot remove this run's journal entry {}: {e} (the next run checks \
                 the project again)",
                self.path.display()
            ));
        }
    }
}

/// The journal directory of the project at `root`.
fn dir_of(state: &Path, root: &Path) -> PathBuf {
    state.join(corral_audit::project_key(root)).join("journal")
}

/// Write the entry of a run of the project at `root`, under corral's state directory `state`,
/// before its jail starts. An error fails the run: without an entry, a killed corral would leave
/// what the jail planted unchecked.
pub fn begin(
    state: &Path,
    root: &Path,
    jail_id: &str,
    git: Option<&gitguard::Snapshot>,
    set_id: &setid::Watch,
    dirs: Vec<PathBuf>,
) -> anyhow::Result<Running> {
    let dir = dir_of(state, root);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create the journal directory {}", dir.display()))?;
    let entry = Entry {
        jail_id: jail_id.to_string(),
        pid: std::process::id(),
        root: root.as_os_str().to_os_string(),
        git: git.map(gitguard::Snapshot::saved),
        set_id: set_id.clone(),
        dirs,
    };
    let text = serde_json::to_vec(&entry).context("cannot write the run's journal entry")?;
    let tmp = dir.join(format!(".{jail_id}.tmp"));
    let path = dir.join(format!("{jail_id}.json"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("cannot create the journal entry {}", tmp.display()))?;
    // Locked before it has its name: no other corral can take it for a run that ended.
    let mut lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .with_context(|| format!("cannot lock the journal entry {}", tmp.display()))?;
    // In place at once (a killed corral leaves it for the next command); on disk before the
    // jail's command runs (`Running::synced`): the sync (a journal commit, 1-5 ms on a VM's
    // disk) goes on while the jail is built. It also makes the rename durable.
    let written = lock
        .write_all(&text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| lock.try_clone());
    let file = match written {
        Ok(file) => file,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&path);
            return Err(e)
                .with_context(|| format!("cannot write the journal entry {}", path.display()));
        }
    };
    let sync = std::thread::spawn(move || file.sync_all());
    Ok(Running {
        path,
        _lock: lock,
        sync: Some(sync),
    })
}

/// Which journals [`finish_unended`] looks at.
pub enum Which<'a> {
    /// The project at this root (a run, a shell).
    Project(&'a Path),
    /// Every project's (`corral doctor`).
    All,
}

/// Complete the checks of every run in `which` that did not end, before anything else; what
/// they find is said on stderr and recorded in the run's project's audit log. Runs still going
/// are left alone.
pub fn finish_unended(which: Which<'_>) {
    if let Ok(state) = corral_audit::state_dir() {
        finish_unended_in(&state, which);
    }
}

/// [`finish_unended`] under the state directory `state`.
fn finish_unended_in(state: &Path, which: Which<'_>) {
    let dirs = match which {
        Which::Project(root) => vec![dir_of(state, root)],
        Which::All => match std::fs::read_dir(state) {
            Ok(rd) => rd.flatten().map(|e| e.path().join("journal")).collect(),
            Err(_) => return,
        },
    };
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        entries.sort();
        for path in entries {
            if let Err(e) = finish_one(&path) {
                eprintln!(
                    "corral: a run that did not end is not checked: {}: {e:#} (remove {} once \
                     you have checked its project)",
                    printable(&path.display().to_string()),
                    printable(&path.display().to_string())
                );
            }
        }
    }
}

/// The checks of the run whose entry is `path`, when its corral is gone.
fn finish_one(path: &Path) -> anyhow::Result<()> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        // Another corral finished it meanwhile.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).context("cannot open it"),
    };
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        // Its corral is still running.
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(()),
        Err((_, e)) => return Err(e).context("cannot lock it"),
    };
    let meta = nix::sys::stat::fstat(lock.as_fd()).context("cannot stat it")?;
    // Finished by another corral between our open and our lock.
    if meta.st_nlink == 0 {
        return Ok(());
    }
    let own = std::fs::symlink_metadata(path).context("cannot stat it")?;
    anyhow::ensure!(
        own.ino() == meta.st_ino && own.dev() == meta.st_dev,
        "it was replaced while being read"
    );
    let mut text = Vec::new();
    lock.read_to_end(&mut text).context("cannot read it")?;
    let entry: Entry = serde_json::from_slice(&text).context("cannot parse it")?;
    let root = PathBuf::from(&entry.root);
    let jail_id = &entry.jail_id;
    eprintln!(
        "corral: the run {jail_id} in {} (corral pid {}) ended without its checks (corral was \
         killed or crashed); checking it now",
        printable(&root.display().to_string()),
        entry.pid
    );
    let audit = AuditLog::for_project(&root).context("cannot open its project's audit log")?;
    let git_lines = entry
        .git
        .map(|g| gitguard::check(gitguard::Snapshot::from(g), jail_id))
        .unwrap_or_default();
    let found = !git_lines.is_empty();
    for line in git_lines {
        eprintln!("corral: {}", printable(&line));
        let record = Record::now(jail_id, Event::Jail(JailEvent::Quarantine { detail: line }));
        if let Err(e) = audit.write(&record) {
            eprintln!("corral: cannot write the audit log: {e}");
        }
    }
    setid::report(setid::check(entry.set_id), &audit, jail_id);
    if !found {
        eprintln!("corral: the run {jail_id} left no git file to disarm");
    }
    remove_own_dirs(&entry.dirs, jail_id);
    // The run's private git directory of the change summary (changes.rs, `PROJECT_KEY/changes/
    // JAIL_ID`), which its corral did not live to remove.
    let one_name =
        !jail_id.is_empty() && !jail_id.contains('/') && jail_id != "." && jail_id != "..";
    if let Some(project_dir) = path.parent().and_then(Path::parent)
        && one_name
    {
        let _ = std::fs::remove_dir_all(project_dir.join("changes").join(jail_id));
    }
    std::fs::remove_file(path).context("cannot remove it after its checks")?;
    Ok(())
}

/// Remove the directories a run made for itself on the host (its executor's socket, its
/// resolver's and gateway's files), which its corral did not live to remove. Only a directory
/// whose name ends with the run's id, that is this user's and no symlink: the runtime
/// directory may be /dev/shm or /tmp, where another user could have made one by that name.
fn remove_own_dirs(dirs: &[PathBuf], jail_id: &str) {
    let euid = nix::unistd::geteuid().as_raw();
    for dir in dirs {
        let named = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("corral-") && n.ends_with(&format!("-{jail_id}")));
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            continue;
        };
        if !named || !meta.is_dir() || meta.uid() != euid {
            continue;
        }
        let shown = printable(&dir.display().to_string());
        match std::fs::remove_dir_all(dir) {
            Ok(()) => eprintln!("corral: removed {shown}, which the run {jail_id} left"),
            Err(e) => eprintln!("corral: cannot remove {shown}, which the run {jail_id} left: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry whose corral holds its lock is left alone; once the lock is gone (the process
    /// died), the next look checks the run and removes the entry, once.
    #[test]
    fn an_entry_is_finished_only_once_its_owner_is_gone() {
        let state = tempfile::tempdir().unwrap();
        let state = state.path();
        let project = tempfile::tempdir().unwrap();
        let root = project.path();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        let snap = gitguard::snapshot(root, false, root);
        let watch = setid::Watch::none();
        let dirs = tempfile::tempdir().unwrap();
        let own = |id: &str| {
            ["exec", "dns", "trust"].map(|k| dirs.path().join(format!("corral-{k}-{id}")))
        };
        let running = begin(
            state,
            root,
            "j-test-1",
            Some(&snap),
            &watch,
            own("j-test-1").to_vec(),
        )
        .unwrap();
        let path = dir_of(state, root).join("j-test-1.json");
        assert!(path.exists());
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // The run goes on: the entry stays.
        finish_unended_in(state, Which::Project(root));
        assert!(path.exists());
        // The jail planted a commondir; corral dies (its lock goes without `done`).
        std::fs::write(root.join(".git/commondir"), "../elsewhere\n").unwrap();
        let private = path
            .parent()
            .unwrap()
            .with_file_name("changes")
            .join("j-test-1");
        std::fs::create_dir_all(private.join("objects")).unwrap();
        // The run's executor directory, with its socket's name; its resolver's directory is
        // a symlink (to a directory that must stay), and another run's directory is there.
        let [exec, dns, _trust] = own("j-test-1");
        std::fs::create_dir_all(&exec).unwrap();
        std::fs::write(exec.join("exec.sock"), "").unwrap();
        let kept = dirs.path().join("kept");
        std::fs::create_dir_all(&kept).unwrap();
        std::os::unix::fs::symlink(&kept, &dns).unwrap();
        let other = dirs.path().join("corral-exec-j-test-9");
        std::fs::create_dir_all(&other).unwrap();
        drop(running);
        finish_unended_in(state, Which::All);
        assert!(!path.exists());
        assert!(!exec.exists(), "the run's executor directory stays");
        assert!(
            kept.is_dir() && dns.is_symlink(),
            "a symlink was followed or removed"
        );
        assert!(other.is_dir(), "another run's directory went");
        assert!(!root.join(".git/commondir").exists(), "not disarmed");
        assert!(!private.exists(), "its private git directory stays");
        // A run that ended removes its own entry.
        let running = begin(state, root, "j-test-2", Some(&snap), &watch, Vec::new()).unwrap();
        running.done();
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            0
        );
    }
}
