//! corral's layer over a harness's state, on the host side of a run: made, seeded and locked
//! before the jail starts (`prepare`), shown against the host's state (`diff`), copied to the
//! host entry by entry at the user's word (`apply`), dropped (`reset`).
//!
//! Layout (`corral_policy::harness`): `harness/PROFILE/` (0700) in corral's state directory,
//! `dirs/KEY/{upper,work}` per state directory (an overlay's; `dirs/KEY/copy` for docker),
//! `files/KEY` per state file, `lock`, and `runs/ID/` for runs that found the layer in use.
//!
//! Concurrent runs of one profile: an overlay's upper directory mounted twice is undefined, so
//! a run holds an exclusive `flock` on `lock`. A run that cannot take it (another run of the
//! profile is going) gets a layer of its own, `runs/ID/dirs/KEY/{upper,work}`, above the
//! persistent upper (the native backend only; podman refuses: it stacks no layers), held by a
//! lock of its own. The next run that takes `lock` merges each such finished layer into the
//! persistent one (new and changed files and links; deletions are not carried) and removes it.

mod creds;
mod diff;
mod fsops;

pub use creds::{StateSecret, with_real_values};
pub use diff::{Change, ChangeKind, apply, diff, is_code, layer_path};

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use corral_policy::plan::{Engine, HarnessState, MountKind, Plan, StateLayer};

use fsops::{Copied, CopyRules};

/// The most a seeded copy of a state directory (docker) may hold.
pub const MAX_COPY_BYTES: u64 = 2 << 30;
/// The most a state file may hold to be seeded.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The layer held for one run: its lock, and the Plan to run when it differs from the one
/// resolved (a concurrent run's own layer).
pub struct Held {
    _lock: File,
    pub plan: Option<Plan>,
    /// The credentials of the state files' copies: placeholders there, real values for the
    /// gateway.
    pub secrets: Vec<StateSecret>,
    /// Lines for the user (a state file that could not be seeded, a merge that left entries).
    pub notes: Vec<String>,
}

/// Make `plan`'s layer ready for a run on `engine`: the directories, each state file's copy
/// (seeded from the host's file the first time), docker's copy of each state directory, the
/// lock, and for a run that finds the layer in use, its own layer above. `None` when the plan
/// has no layer (`--allow-harness-config`, a profile without state).
pub fn prepare(plan: &Plan, run_id: &str) -> anyhow::Result<Option<Held>> {
    let Some(state) = &plan.harness_state else {
        return Ok(None);
    };
    mkdirs(&state.layer)?;
    prepare_in(plan, state, run_id, upper_unsupported(&state.layer))
}

/// [`prepare`] with the layer's directory made; `copies`: overlayfs cannot keep an upper
/// directory there.
fn prepare_in(
    plan: &Plan,
    state: &HarnessState,
    run_id: &str,
    copies: bool,
) -> anyhow::Result<Option<Held>> {
    let lock = open_lock(&state.layer.join("lock"))?;
    let mut notes = Vec::new();
    let signins = signin_files(state, plan);
    // An overlay cannot keep its upper directory on every file system (one that is itself an
    // overlay, as in many development containers; NFS; FUSE): there the jail (native or
    // podman) gets corral's seeded copy of each state directory bound instead, as docker does.
    // The host's state directory is then not in the jail at all. Concurrent runs share the
    // copy, as docker's do.
    if copies {
        let locked = try_lock(&lock)?;
        if locked {
            notes.extend(merge_finished_runs(state)?);
        }
        for d in &state.dirs {
            let copy = match &d.layer {
                StateLayer::Overlay { upper, .. } => upper.with_file_name("copy"),
                StateLayer::Copy { dir } => dir.clone(),
            };
            if locked {
                notes.extend(seed_copy(&d.host, &copy)?);
                scrub_signin_copies(&signins, &d.host, &copy)?;
            } else if copy.symlink_metadata().is_err() {
                // The run holding the layer seeds it before its jail starts: not done yet.
                bail!(
                    "another run of {} is making corral's copy of its state ({}); run again \
                     when it has started",
                    plan.profile,
                    copy.display()
                );
            }
        }
        let mut run_plan = plan.clone();
        for m in &mut run_plan.mounts {
            let MountKind::Overlay { upper, .. } = &m.kind else {
                continue;
            };
            if !state.dirs.iter().any(|d| d.host == m.target) {
                bail!(
                    "the overlay at {} is not one of the harness's state directories",
                    m.target.display()
                );
            }
            m.source = upper.with_file_name("copy");
            m.kind = MountKind::Bind(corral_policy::plan::Access::Rw);
        }
        for f in &state.files {
            notes.extend(seed_file(&f.host, &f.copy)?);
        }
        let secrets = creds::scrub(state, locked)?;
        notes.push(format!(
            "{} cannot hold an overlay's upper directory (its file system); this run binds \
             corral's copy of the harness state there instead",
            state.layer.display()
        ));
        return Ok(Some(Held {
            _lock: lock,
            plan: Some(run_plan),
            secrets,
            notes,
        }));
    }
    if try_lock(&lock)? {
        notes.extend(merge_finished_runs(state)?);
        for d in &state.dirs {
            match &d.layer {
                StateLayer::Overlay { upper, work } => {
                    mkdirs(upper)?;
                    mkdirs(work)?;
                }
                StateLayer::Copy { dir } => {
                    notes.extend(seed_copy(&d.host, dir)?);
                    scrub_signin_copies(&signins, &d.host, dir)?;
                }
            }
        }
        for f in &state.files {
            notes.extend(seed_file(&f.host, &f.copy)?);
        }
        let secrets = creds::scrub(state, true)?;
        return Ok(Some(Held {
            _lock: lock,
            plan: None,
            secrets,
            notes,
        }));
    }
    // Another run of this profile holds the layer.
    let overlays = plan
        .mounts
        .iter()
        .any(|m| matches!(m.kind, MountKind::Overlay { .. }));
    if !overlays {
        // docker's copy and the state files: bound in both runs, as two host runs share them.
        let secrets = creds::scrub(state, false)?;
        return Ok(Some(Held {
            _lock: lock,
            plan: None,
            secrets,
            notes,
        }));
    }
    if plan.engine == Engine::Podman {
        bail!(
            "another run of {} is using corral's layer over its state ({}); podman cannot stack \
             a layer of this run's own above it: wait for it to end, or use the native backend",
            plan.profile,
            state.layer.display()
        );
    }
    let run_dir = state.layer.join("runs").join(run_id);
    mkdirs(&run_dir)?;
    let run_lock = open_lock(&run_dir.join("lock"))?;
    if !try_lock(&run_lock)? {
        bail!(
            "cannot lock {}: another process holds it",
            run_dir.display()
        );
    }
    let mut run_plan = plan.clone();
    for m in &mut run_plan.mounts {
        let MountKind::Overlay { upper, .. } = &m.kind else {
            continue;
        };
        let Some(d) = state.dirs.iter().find(|d| d.host == m.target) else {
            bail!(
                "the overlay at {} is not one of the harness's state directories",
                m.target.display()
            );
        };
        let base = run_dir.join("dirs").join(&d.key);
        mkdirs(&base.join("upper"))?;
        mkdirs(&base.join("work"))?;
        m.kind = MountKind::Overlay {
            upper: base.join("upper"),
            work: base.join("work"),
            above: vec![upper.clone()],
        };
    }
    for f in &state.files {
        notes.extend(seed_file(&f.host, &f.copy)?);
    }
    let secrets = creds::scrub(state, false)?;
    notes.push(format!(
        "another run of {} is using its state layer: this run writes to a layer of its own \
         ({}), merged into the shared one when the next run starts (new and changed files; \
         what this run deletes stays)",
        plan.profile,
        run_dir.display()
    ));
    drop(lock);
    Ok(Some(Held {
        _lock: run_lock,
        plan: Some(run_plan),
        secrets,
        notes,
    }))
}

/// Whether overlayfs refuses an upper directory on the file system of `dir` (or, when it does
/// not exist yet, of its nearest existing parent): an overlay, NFS, FUSE. (Other refusals,
/// such as a file system without user extended attributes, fail the mount with a message
/// naming the step.)
pub fn upper_unsupported(dir: &Path) -> bool {
    dir.ancestors().find_map(fs_type).is_some_and(upper_refused)
}

fn upper_refused(magic: i64) -> bool {
    const OVERLAYFS: i64 = 0x794c_7630;
    const NFS: i64 = 0x6969;
    const FUSE: i64 = 0x6573_5546;
    matches!(magic, OVERLAYFS | NFS | FUSE)
}

fn fs_type(dir: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statfs` is plain data; zero is a valid value for each field.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a writable `struct statfs`.
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)]
    (rc == 0).then_some(st.f_type as i64)
}

fn mkdirs(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

fn open_lock(path: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot open the lock {}", path.display()))
}

/// Take an exclusive lock on `f` without waiting: whether it was taken.
fn try_lock(f: &File) -> anyhow::Result<bool> {
    // SAFETY: `f` is an open file; flock only acts on its descriptor.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e).context("cannot lock corral's harness state layer")
}

/// Whether the layer is free (no run of the profile holds it): for `corral state reset`.
pub fn lock_idle(state: &HarnessState) -> anyhow::Result<Option<File>> {
    if !state.layer.exists() {
        return Ok(None);
    }
    let lock = open_lock(&state.layer.join("lock"))?;
    Ok(try_lock(&lock)?.then_some(lock))
}

/// Merge every finished concurrent run's layer (`runs/ID`, its lock free) into the persistent
/// one and remove it. Called with the layer's lock held, before any overlay of it is mounted.
fn merge_finished_runs(state: &HarnessState) -> anyhow::Result<Vec<String>> {
    let runs = state.layer.join("runs");
    let Ok(entries) = std::fs::read_dir(&runs) else {
        return Ok(Vec::new());
    };
    let mut notes = Vec::new();
    'runs: for e in entries {
        let run_dir = e?.path();
        let Ok(lock) = open_lock(&run_dir.join("lock")) else {
            continue;
        };
        if !try_lock(&lock)? {
            continue;
        }
        for d in &state.dirs {
            let StateLayer::Overlay { upper, .. } = &d.layer else {
                continue;
            };
            let from = run_dir.join("dirs").join(&d.key).join("upper");
            if !from.is_dir() {
                continue;
            }
            mkdirs(upper)?;
            let src = fsops::open_root(&from)?;
            let dst = fsops::open_root(upper)?;
            let mut done = Copied::default();
            let merged = fsops::copy_tree(
                &src,
                &dst,
                CopyRules {
                    links: true,
                    max_bytes: u64::MAX,
                },
                &mut done,
            );
            if let Err(e) = merged {
                // What a jail wrote must not stop every later run: the layer is set aside, said.
                let aside = state
                    .layer
                    .join("unmerged")
                    .join(run_dir.file_name().unwrap_or_default());
                mkdirs(aside.parent().unwrap_or(&state.layer))?;
                std::fs::rename(&run_dir, &aside)
                    .with_context(|| format!("cannot move {} aside", run_dir.display()))?;
                notes.push(format!(
                    "could not merge the state layer of an earlier concurrent run ({e}); it is \
                     kept at {}",
                    aside.display()
                ));
                continue 'runs;
            }
        }
        remove_tree(&run_dir)?;
        notes.push(format!(
            "merged the state layer of an earlier concurrent run ({}) into {}",
            run_dir.display(),
            state.layer.display()
        ));
    }
    Ok(notes)
}

/// The layer's copy of a state file, seeded from the host's file the first time (not followed
/// when it is a link; 0600). An existing copy is left as jailed runs left it.
fn seed_file(host: &Path, copy: &Path) -> anyhow::Result<Vec<String>> {
    if copy.symlink_metadata().is_ok() {
        return Ok(Vec::new());
    }
    if let Some(parent) = copy.parent() {
        mkdirs(parent)?;
    }
    let (dir, name) = split(host)?;
    let mut notes = Vec::new();
    let bytes = match fsops::open_root(dir) {
        Ok(d) => match fsops::stat_at(&d, name)? {
            None => Vec::new(),
            Some(st) if fsops::kind_of(&st) == fsops::Kind::File => {
                fsops::read_file(&d, name, MAX_FILE_BYTES)
                    .with_context(|| format!("cannot read {}", host.display()))?
            }
            Some(_) => {
                notes.push(format!(
                    "{} is not a regular file (a link?): corral does not follow it; the jail's \
                     copy starts empty",
                    host.display()
                ));
                Vec::new()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", dir.display())),
    };
    let (cdir, cname) = split(copy)?;
    let cdir = fsops::open_root(cdir)?;
    fsops::replace_file(&cdir, cname, &bytes, 0o600)
        .with_context(|| format!("cannot write {}", copy.display()))?;
    Ok(notes)
}

/// The sign-in files of a run of `plan`: the profile's and any the user's policy adds.
fn signin_files(state: &HarnessState, plan: &Plan) -> Vec<PathBuf> {
    let plan_files = plan.signin.iter().map(|s| s.file.clone());
    state
        .signin_files
        .iter()
        .cloned()
        .chain(plan_files)
        .collect()
}

/// The sign-in files in corral's `copy` of the state directory `host`: where the host has one,
/// the jail gets its placeholder bound over that name, so the copy keeps only an empty file
/// there (the mount point), never the host's real one that seeding copied. Where the host has
/// none, what the copy holds is the jail's own (a sign-in made in the jail) and stays; `corral
/// state diff` never lists a sign-in file and `apply` never writes one. Nothing in the copy is
/// followed.
fn scrub_signin_copies(files: &[PathBuf], host: &Path, copy: &Path) -> anyhow::Result<()> {
    for file in files.iter().filter(|f| f.is_file()) {
        let Ok(rel) = file.strip_prefix(host) else {
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let shown = copy.join(rel);
        let root =
            fsops::open_root(copy).with_context(|| format!("cannot open {}", copy.display()))?;
        let (dir, name) = fsops::parent_beneath(&root, rel, true)
            .with_context(|| format!("cannot open {}'s directory", shown.display()))?;
        let empty = fsops::stat_at(&dir, name)?
            .is_some_and(|st| fsops::kind_of(&st) == fsops::Kind::File && st.st_size == 0);
        if empty {
            continue;
        }
        fsops::remove_at(&dir, name)
            .with_context(|| format!("cannot remove {}", shown.display()))?;
        fsops::replace_file(&dir, name, b"", 0o600)
            .with_context(|| format!("cannot write {}", shown.display()))?;
    }
    Ok(())
}

/// corral's copy of a state directory (docker's; the native jail's where an overlay cannot
/// keep its upper directory), seeded once from the host's (no link followed or copied; at
/// most [`MAX_COPY_BYTES`]), with what earlier jailed runs wrote in the overlay's upper
/// directory beside it (`upper`) carried in, so the jail's history goes on.
fn seed_copy(host: &Path, copy: &Path) -> anyhow::Result<Vec<String>> {
    if copy.symlink_metadata().is_ok() {
        return Ok(Vec::new());
    }
    let tmp = copy.with_extension("seeding");
    if tmp.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    mkdirs(&tmp)?;
    let mut done = Copied::default();
    if host.is_dir() {
        let src =
            fsops::open_root(host).with_context(|| format!("cannot open {}", host.display()))?;
        let dst = fsops::open_root(&tmp)?;
        fsops::copy_tree(
            &src,
            &dst,
            CopyRules {
                links: false,
                max_bytes: MAX_COPY_BYTES,
            },
            &mut done,
        )
        .with_context(|| {
            format!(
                "cannot copy {} into corral's layer {} (docker has no overlay volume); use \
                 podman or the native backend, or --allow-harness-config",
                host.display(),
                copy.display()
            )
        })?;
    }
    let upper = copy.with_file_name("upper");
    if upper.is_dir() {
        let src =
            fsops::open_root(&upper).with_context(|| format!("cannot open {}", upper.display()))?;
        let dst = fsops::open_root(&tmp)?;
        let mut carried = Copied::default();
        fsops::carry_upper(
            &src,
            &dst,
            CopyRules {
                links: true,
                max_bytes: MAX_COPY_BYTES,
            },
            &mut carried,
        )
        .with_context(|| {
            format!(
                "cannot carry corral's layer {} into its copy {}",
                upper.display(),
                copy.display()
            )
        })?;
    }
    std::fs::rename(&tmp, copy).with_context(|| format!("cannot create {}", copy.display()))?;
    Ok(if done.skipped.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "corral's copy of {} leaves out {} links and special files",
            host.display(),
            done.skipped.len()
        )]
    })
}

/// Remove a tree of corral's layer. The kernel makes an overlay's `work/work` directory mode
/// 000 (and leaves its deleted entries there), so directories are made searchable by their
/// owner first; no link is followed.
pub fn remove_tree(path: &Path) -> anyhow::Result<()> {
    /// Make `dir` (a directory entry of `parent`, never a link) and every directory below it
    /// searchable by its owner, by descriptor: a name swapped for a link meanwhile is not
    /// followed, a mode-000 directory is changed through its `O_PATH` descriptor.
    fn open_up(parent: &OwnedFd, name: &std::ffi::OsStr) {
        use nix::fcntl::OFlag;
        let Ok(Some(st)) = fsops::stat_at(parent, name) else {
            return;
        };
        if fsops::kind_of(&st) != fsops::Kind::Dir {
            return;
        }
        let Ok(dir) =
            fsops::open_beneath(parent, Path::new(name), OFlag::O_PATH | OFlag::O_DIRECTORY)
        else {
            return;
        };
        let proc = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let _ = nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            proc.as_str(),
            nix::sys::stat::Mode::from_bits_truncate(0o700),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        );
        let Ok(names) = fsops::list(&dir) else {
            return;
        };
        for n in names {
            open_up(&dir, &n);
        }
    }
    if path.symlink_metadata().is_err() {
        return Ok(());
    }
    let (parent, name) = split(path)?;
    let parent =
        fsops::open_root(parent).with_context(|| format!("cannot open {}", parent.display()))?;
    open_up(&parent, name);
    std::fs::remove_dir_all(path).with_context(|| format!("cannot remove {}", path.display()))
}

/// A path's directory and last name.
fn split(p: &Path) -> anyhow::Result<(&Path, &std::ffi::OsStr)> {
    match (p.parent(), p.file_name()) {
        (Some(d), Some(n)) => Ok((d, n)),
        _ => bail!("{} has no directory", p.display()),
    }
}

#[cfg(test)]
mod tests;
