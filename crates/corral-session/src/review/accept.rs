//! `corral accept [PATH...]`: apply the change set to the host's project.
//!
//! What is applied is exactly what `corral diff` showed when it recorded a manifest (the
//! change set read again must equal it, else accept refuses), and each file's bytes are
//! checked against the manifest's hash as they are copied. Accept refuses, before it writes
//! anything, a change that a normal run's name gate or end-of-run checks would refuse or undo:
//! a new git repository (`.git` anywhere, a `HEAD` or `commondir` outside one), git's config,
//! hooks and `commondir`, a name `filesystem.hide` matches, a protected path, a set-id bit, a
//! device, FIFO or socket; a host entry changed since the run started (its ctime is not
//! before the run's start); and git changes when the host's refs moved since the run started.
//! It writes only below the project, opening every parent with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`, replacing entries by rename, so no link (the jail's or the host's)
//! is ever written through.

use std::ffi::OsStr;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};
use nix::fcntl::{OFlag, renameat};
use nix::sys::stat::{Mode, fchmod, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use super::hostfs::{ctime_ns, file_type, hash_copy, open_beneath, open_dir, open_file, stat_at};
use super::show::shown;
use super::upper::{Change, Entry, What};
use super::{Pending, show, upper};

/// Called before each change of a host entry with the directory holding it (a descriptor),
/// that directory's path relative to the project and the entry's name: `corral undo`'s change
/// record keeps what the entry was (cmd/review.rs). An error stops the accept before that change.
pub type Keep<'a> = &'a dyn Fn(BorrowedFd, &Path, &OsStr) -> std::io::Result<()>;

/// What an accept did.
#[derive(Debug)]
pub struct Accepted {
    pub applied: Vec<Change>,
    /// Whether a `corral diff` manifest covered them (else accept showed them itself).
    pub shown_by_diff: bool,
    /// Changes still pending after a partial accept.
    pub remaining: usize,
}

/// Apply the changes of the pending review of `root` below `select` (project-relative; all
/// when empty).
pub fn accept(root: &Path, select: &[PathBuf], keep: Option<Keep>) -> anyhow::Result<Accepted> {
    let pending = Pending::open(root)?;
    let changes = upper::changes(&pending.paths, select)?;
    if changes.is_empty() {
        bail!(
            "nothing to accept{}",
            if select.is_empty() {
                ""
            } else {
                " below the paths given"
            }
        );
    }
    let shown_by_diff = match show::read_manifest(&pending.paths)? {
        Some(m) => {
            same_as_shown(&m, select, &changes)?;
            true
        }
        None => false,
    };
    let refusals = refusals(&pending, &changes)?;
    if !refusals.is_empty() {
        bail!(
            "accept refuses, nothing was applied:\n  {}",
            refusals.join("\n  ")
        );
    }
    let none = |_: BorrowedFd, _: &Path, _: &OsStr| Ok(());
    apply_all(&pending, &changes, keep.unwrap_or(&none))?;
    let remaining = upper::changes(&pending.paths, &[])?.len();
    let mut pending = pending;
    if remaining == 0 {
        pending.discard()?;
    } else {
        pending.meta.refs = super::git_refs(root)?;
        pending.save_meta()?;
        let _ = std::fs::remove_file(pending.paths.manifest());
    }
    Ok(Accepted {
        applied: changes,
        shown_by_diff,
        remaining,
    })
}

/// The change set read now is what `corral diff` recorded for these paths.
fn same_as_shown(m: &show::Manifest, select: &[PathBuf], changes: &[Change]) -> anyhow::Result<()> {
    let covered = |p: &Path| m.select.is_empty() || m.select.iter().any(|s| p.starts_with(s));
    if let Some(c) = changes
        .iter()
        .find(|c| !covered(&c.path) && !c.new.is_dir())
    {
        bail!(
            "{} was not shown by the last `corral diff` (it showed {}): run `corral diff` for it \
             first",
            shown(&c.path),
            m.select
                .iter()
                .map(|p| shown(p))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let was_shown: Vec<&Change> = m
        .changes
        .iter()
        .filter(|c| {
            select.is_empty()
                || select
                    .iter()
                    .any(|s| c.path.starts_with(s) || (c.new.is_dir() && s.starts_with(&c.path)))
        })
        .collect();
    let now: Vec<&Change> = changes.iter().collect();
    let key = |c: &Change| (c.path.clone(), c.what, c.old.clone(), c.new.clone());
    if was_shown.len() != now.len() || was_shown.iter().zip(&now).any(|(a, b)| key(a) != key(b)) {
        let differs = now
            .iter()
            .find(|c| !was_shown.iter().any(|s| key(s) == key(c)))
            .map(|c| shown(&c.path))
            .or_else(|| {
                was_shown
                    .iter()
                    .find(|s| !now.iter().any(|c| key(s) == key(c)))
                    .map(|c| shown(&c.path))
            })
            .unwrap_or_default();
        bail!(
            "the change set is no longer what `corral diff` showed ({differs} differs): nothing \
             was applied; run `corral diff` again and accept what it shows"
        );
    }
    Ok(())
}

/// Every reason to refuse, before anything is written.
fn refusals(p: &Pending, changes: &[Change]) -> anyhow::Result<Vec<String>> {
    let root = &p.paths.root;
    let hide = corral_policy::hide::HideSet::new(&p.meta.hide)?;
    let host = open_root(root)?;
    let mut out = Vec::new();
    let mut start_names = None;
    for c in changes {
        let at = shown(&c.path);
        out.extend(change_refusals(c, &hide, &p.meta.protected, root));
        if let Some(why) = git_refusal(host.as_fd(), c)? {
            out.push(format!("{at}: {why}"));
        }
        if let Some(why) = host_refusal(p, host.as_fd(), c, &mut start_names)? {
            out.push(format!("{at}: {why}"));
        }
    }
    out.extend(refs_refusal(p, changes)?);
    Ok(out)
}

/// What in the change itself a normal run refuses or undoes: a device, FIFO or socket, a
/// set-id bit (seccomp, setid.rs), a hidden name (the name gate), a protected path or a
/// directory above one (read-only in the jail). Pure: the tests below call it.
fn change_refusals(
    c: &Change,
    hide: &corral_policy::hide::HideSet,
    protected: &[PathBuf],
    root: &Path,
) -> Vec<String> {
    let at = shown(&c.path);
    let mut out = Vec::new();
    if let Entry::Special { what } = &c.new {
        out.push(format!("{at}: a {what}; accept makes none"));
    }
    if let Entry::File { mode, .. } = &c.new
        && mode & 0o6000 != 0
    {
        out.push(format!(
            "{at}: mode {mode:o} has a set-user-ID or set-group-ID bit; accept never makes one"
        ));
    }
    if let Some(pattern) = hide.matching(&c.path) {
        out.push(format!(
            "{at}: filesystem.hide matches it ({pattern:?}); a jail may not make or change \
             such a name in the project"
        ));
    }
    let abs = root.join(&c.path);
    if let Some(pr) = protected
        .iter()
        .find(|pr| abs.starts_with(pr) || pr.starts_with(&abs))
    {
        out.push(format!(
            "{at}: {} is protected (read-only in the jail)",
            shown(pr)
        ));
    }
    out
}

/// Why the host's entry is not as it was when the run started, if it is not: changed (its
/// ctime, which no user call can set back, is not before the start), something below a
/// directory to be removed changed, or a file the jail changed was deleted or moved.
fn host_refusal(
    p: &Pending,
    host: BorrowedFd,
    c: &Change,
    start_names: &mut Option<anyhow::Result<std::collections::HashSet<PathBuf>>>,
) -> anyhow::Result<Option<String>> {
    if c.old == Entry::Absent && c.copied_up {
        let names = start_names
            .get_or_insert_with(|| super::start_names(&p.paths))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e:#}"))?;
        if names.contains(&c.path) {
            return Ok(Some(
                "deleted or moved on the host since the run started (the jail changed the \
                 host's file); accept does not bring it back"
                    .into(),
            ));
        }
    }
    if let Some(ctime) = c.old_ctime
        && ctime >= p.meta.started_ns
    {
        return Ok(Some(
            "changed on the host since the run started; accept does not overwrite it (accept \
             the other paths, or `corral discard`)"
                .into(),
        ));
    }
    if c.old.is_dir()
        && !c.new.is_dir()
        && let Some(changed) = changed_below(host, &c.path, p.meta.started_ns)?
    {
        return Ok(Some(format!(
            "{} changed on the host since the run started; accept does not delete it",
            shown(&changed)
        )));
    }
    Ok(None)
}

/// The jail's git changes (anything in the project's `.git`) over refs the host moved since
/// the run started.
fn refs_refusal(p: &Pending, changes: &[Change]) -> anyhow::Result<Option<String>> {
    let git = changes
        .iter()
        .any(|c| c.path.components().next() == Some(Component::Normal(OsStr::new(".git"))));
    let Some(before) = &p.meta.refs else {
        return Ok(None);
    };
    if !git || super::git_refs(&p.paths.root)?.as_ref() == Some(before) {
        return Ok(None);
    }
    Ok(Some(
        ".git: the host's git refs moved since the run started (a commit, checkout or fetch on \
         the host); the jail's commits are not applied over them: accept the other paths \
         (`corral accept PATH...`), or `corral discard`"
            .into(),
    ))
}

/// Why accept will not make this git change, if it will not: what a normal run's name gate
/// refuses (a new repository) and what its end-of-run git check moves aside (config, hooks,
/// `commondir`).
fn git_refusal(host: BorrowedFd, c: &Change) -> anyhow::Result<Option<String>> {
    let parts: Vec<&OsStr> = c.path.components().map(|p| p.as_os_str()).collect();
    if let Some(i) = parts.iter().position(|p| *p == ".git") {
        let git: PathBuf = parts[..=i].iter().collect();
        let host_git_is_dir = {
            let parent = git.parent().unwrap_or(Path::new(""));
            match open_dir(host, parent)? {
                Some(d) => {
                    stat_at(d.as_fd(), parts[i])?.is_some_and(|st| file_type(&st) == libc::S_IFDIR)
                }
                None => false,
            }
        };
        if !host_git_is_dir && c.what != What::Deleted {
            return Ok(Some(format!(
                "makes a git repository ({}); accept never does: run `git init` on the host",
                super::show::shown(&git)
            )));
        }
        let rest = &parts[i + 1..];
        let last = rest.last().copied().unwrap_or_default();
        if rest.contains(&OsStr::new("hooks"))
            || ["config", "config.worktree", "commondir"]
                .iter()
                .any(|n| last == *n)
        {
            return Ok(Some(
                "git's config, hooks and commondir run code on the host; accept never changes them"
                    .into(),
            ));
        }
        return Ok(None);
    }
    let name = parts.last().copied().unwrap_or_default();
    if c.what == What::Added && (name == "HEAD" || name == "commondir") {
        return Ok(Some(format!(
            "a new {} outside .git can make a git repository; accept never makes one",
            name.to_string_lossy()
        )));
    }
    Ok(None)
}

/// The first entry below the host's directory `rel` whose ctime is not before `since`.
fn changed_below(host: BorrowedFd, rel: &Path, since: i128) -> anyhow::Result<Option<PathBuf>> {
    let Some(dir) = open_dir(host, rel)? else {
        return Ok(None);
    };
    let st = nix::sys::stat::fstat(&dir)?;
    if ctime_ns(&st) >= since {
        return Ok(Some(rel.to_path_buf()));
    }
    for name in names(dir.as_fd())? {
        let Some(st) = stat_at(dir.as_fd(), &name)? else {
            continue;
        };
        let path = rel.join(&name);
        if file_type(&st) == libc::S_IFDIR {
            if let Some(p) = changed_below(host, &path, since)? {
                return Ok(Some(p));
            }
        } else if ctime_ns(&st) >= since {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

fn open_root(root: &Path) -> anyhow::Result<OwnedFd> {
    nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("cannot open the project {}", root.display()))
}

fn apply_all(p: &Pending, changes: &[Change], keep: Keep) -> anyhow::Result<()> {
    let host = open_root(&p.paths.root)?;
    let upper = open_root(&p.paths.upper)?;
    for c in changes {
        apply(host.as_fd(), upper.as_fd(), c, keep).with_context(|| {
            format!(
                "cannot apply {} (the changes before it were applied)",
                shown(&c.path)
            )
        })?;
    }
    // The upper directory stays as it is: the change set is it read against the host, and
    // what was applied is the host's now, so no change any more (an opaque directory's
    // deletions, done, have nothing left to delete).
    Ok(())
}

/// Apply one change. Its parent exists on the host by now (directories come first).
fn apply(host: BorrowedFd, upper: BorrowedFd, c: &Change, keep: Keep) -> anyhow::Result<()> {
    let parent = c.path.parent().unwrap_or(Path::new(""));
    let name = c.path.file_name().context("a change without a name")?;
    let dir = open_dir(host, parent)?
        .with_context(|| format!("{} is not a directory on the host", shown(parent)))?;
    let dir = dir.as_fd();
    let now = stat_at(dir, name)?;
    let now_dir = now
        .as_ref()
        .is_some_and(|st| file_type(st) == libc::S_IFDIR);
    // What the host has there now, kept before it changes (a directory to be removed: all
    // below it too, in `remove`).
    keep(dir, parent, name).with_context(|| {
        format!(
            "cannot keep {} in the change record (nothing more was applied)",
            shown(&c.path)
        )
    })?;
    match &c.new {
        Entry::Absent => remove(dir, parent, name, now_dir, keep),
        Entry::Dir { mode } => {
            if now.is_some() && !now_dir {
                unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
            }
            if !now_dir || now.is_none() {
                mkdirat(dir, name, Mode::from_bits_truncate(0o700))?;
            }
            let d = open_beneath(dir, Path::new(name), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
            fchmod(&d, Mode::from_bits_truncate(mode & 0o7777))?;
            Ok(())
        }
        Entry::File {
            mode, sha256: want, ..
        } => {
            let udir = open_dir(upper, parent)?
                .with_context(|| format!("{} left the change set", shown(parent)))?;
            let tmp = copy_in(udir.as_fd(), dir, name, *mode, want)?;
            replace(dir, parent, &tmp, name, now_dir, keep)
        }
        Entry::Symlink { target } => {
            let tmp = temp_name(name);
            symlinkat(target.as_str(), dir, tmp.as_os_str())?;
            replace(dir, parent, &tmp, name, now_dir, keep)
        }
        Entry::Special { what } => bail!("a {what}: accept makes none"),
    }
}

/// Copy the change set's file `name` (in `udir`) to a new name in the host's `dir`, with
/// `mode`, checking that its bytes hash to `want` as they are copied; the new name.
fn copy_in(
    udir: BorrowedFd,
    dir: BorrowedFd,
    name: &OsStr,
    mode: u32,
    want: &str,
) -> anyhow::Result<std::ffi::OsString> {
    let changed = "it changed in the change set since it was read: nothing more was applied";
    let (from, st) = open_file(udir, name)?;
    if st.st_mode & 0o7777 != mode {
        bail!(changed);
    }
    let tmp = temp_name(name);
    let fd = nix::fcntl::openat(
        dir,
        tmp.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    let mut f = std::fs::File::from(fd);
    let written = hash_copy(from, Some(&mut f))
        .and_then(|(got, _)| match got == want {
            true => Ok(()),
            false => Err(std::io::Error::other(changed)),
        })
        .and_then(|()| fchmod(&f, Mode::from_bits_truncate(mode & 0o1777)).map_err(Into::into))
        .and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written {
        let _ = unlinkat(dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        return Err(e.into());
    }
    Ok(tmp)
}

/// Put `tmp` in `name`'s place (a directory there is removed first).
fn replace(
    dir: BorrowedFd,
    rel_dir: &Path,
    tmp: &OsStr,
    name: &OsStr,
    dir_there: bool,
    keep: Keep,
) -> anyhow::Result<()> {
    if dir_there && let Err(e) = remove(dir, rel_dir, name, true, keep) {
        let _ = unlinkat(dir, tmp, UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    renameat(dir, tmp, dir, name)?;
    Ok(())
}

/// Remove `name` in `dir` (a directory with everything below it), never following a link.
/// `rel_dir`: `dir`'s path relative to the project; each entry is kept (`keep`) before it goes.
fn remove(
    dir: BorrowedFd,
    rel_dir: &Path,
    name: &OsStr,
    is_dir: bool,
    keep: Keep,
) -> anyhow::Result<()> {
    keep(dir, rel_dir, name)?;
    if !is_dir {
        return match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    let sub = open_beneath(dir, Path::new(name), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    for n in names(sub.as_fd())? {
        let d = stat_at(sub.as_fd(), &n)?.is_some_and(|st| file_type(&st) == libc::S_IFDIR);
        remove(sub.as_fd(), &rel_dir.join(name), &n, d, keep)?;
    }
    unlinkat(dir, name, UnlinkatFlags::RemoveDir)?;
    Ok(())
}

fn names(dir: BorrowedFd) -> anyhow::Result<Vec<std::ffi::OsString>> {
    use std::os::unix::ffi::OsStrExt;
    let fd = nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let n = OsStr::from_bytes(e?.file_name().to_bytes()).to_os_string();
        if n != "." && n != ".." {
            out.push(n);
        }
    }
    Ok(out)
}

fn temp_name(name: &OsStr) -> std::ffi::OsString {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut s = std::ffi::OsString::from(format!(".corral-accept-{}-{n}-", std::process::id()));
    s.push(name);
    if s.len() > 200 {
        s = format!(".corral-accept-{}-{n}", std::process::id()).into();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &str, what: What, new: Entry) -> Change {
        Change {
            path: PathBuf::from(path),
            what,
            old: Entry::Absent,
            new,
            old_ctime: None,
            copied_up: false,
        }
    }

    fn file(mode: u32) -> Entry {
        Entry::File {
            mode,
            size: 1,
            sha256: "00".into(),
        }
    }

    #[test]
    fn a_change_is_refused_for_its_kind_mode_hidden_name_or_a_protected_path() {
        let hide = corral_policy::hide::HideSet::new(&[".env".into(), ".env.*".into()]).unwrap();
        let root = Path::new("/p");
        let protected = [
            PathBuf::from("/p/corral.toml"),
            PathBuf::from("/p/.git/hooks"),
        ];
        let refused = |c: Change| change_refusals(&c, &hide, &protected, root);
        assert_eq!(
            refused(change("src/a.rs", What::Added, file(0o644))),
            Vec::<String>::new()
        );
        assert_eq!(
            refused(change("tool", What::Added, file(0o4755))),
            ["tool: mode 4755 has a set-user-ID or set-group-ID bit; accept never makes one"]
        );
        assert_eq!(refused(change("tool", What::Added, file(0o2755))).len(), 1);
        assert_eq!(
            refused(change(
                "fifo",
                What::Added,
                Entry::Special {
                    what: "FIFO".into()
                }
            )),
            ["fifo: a FIFO; accept makes none"]
        );
        assert_eq!(
            refused(change(".env.local", What::Added, file(0o600))).len(),
            1
        );
        assert_eq!(
            refused(change("corral.toml", What::Modified, file(0o644))).len(),
            1
        );
        // Below a protected directory, and a directory above a protected path.
        assert_eq!(
            refused(change(".git/hooks/pre-commit", What::Added, file(0o755))).len(),
            1
        );
        assert_eq!(
            refused(change(".git", What::Deleted, Entry::Absent)).len(),
            1
        );
        // A name in the terminal is escaped.
        let odd = refused(change("t\u{1b}]52", What::Added, file(0o4755)));
        assert!(odd[0].starts_with("t\\u{1b}]52:"), "{odd:?}");
    }

    #[test]
    fn accept_takes_only_what_the_last_diff_showed() {
        let shown = show::Manifest {
            select: vec![PathBuf::from("src")],
            changes: vec![change("src/a", What::Added, file(0o644))],
        };
        let now = [change("src/a", What::Added, file(0o644))];
        assert!(same_as_shown(&shown, &[], &now).is_ok());
        // A byte changed (its hash), a mode, a path diff did not show.
        let other = [change("src/a", What::Added, file(0o755))];
        assert!(same_as_shown(&shown, &[], &other).is_err());
        let more = [
            change("src/a", What::Added, file(0o644)),
            change("src/b", What::Added, file(0o644)),
        ];
        assert!(same_as_shown(&shown, &[], &more).is_err());
        let outside = [change("README", What::Modified, file(0o644))];
        let err = same_as_shown(&shown, &[], &outside)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("was not shown by the last `corral diff`"),
            "{err}"
        );
    }
}
