//! The jail's filesystem, built in the jail's own mount namespace by its PID 1.
//!
//! The order is the kernel's: make every inherited mount private, put a tmpfs "base" at /tmp and
//! pivot into it (the host root is then at /oldroot, so sources anywhere, /tmp included, stay
//! reachable), build the new root on a tmpfs at /newroot (/tmp, /dev, /proc, the Plan's mounts in
//! order, masked files, protected paths), then pivot into /newroot and detach the old root. After
//! that no host path the Plan does not name is reachable from the jail.

use std::ffi::CStr;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use corral_policy::plan::{Access, MountKind, Plan};
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, openat, openat2, readlinkat};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, mkdirat};

use crate::error::JailError;

const BASE: &str = "/tmp";
const OLD: &str = "/oldroot";
const NEW: &str = "/newroot";
/// Mode-000 empty file and directory that masked paths are bound to (in the base tmpfs).
const MASK_FILE: &str = "/mask/file";
const MASK_DIR: &str = "/mask/dir";

const NONE: Option<&str> = None;

/// Build the jail's root from `plan` and pivot into it. Runs in the jail's PID 1, which owns the
/// jail's user and mount namespaces. `own_devpts`: the set-up process mounted the jail's devpts
/// instance over /dev/pts already (the jail's pty is in it); else a fresh one is mounted.
pub fn set_up_root(plan: &Plan, own_devpts: bool) -> Result<PrivateDevices, JailError> {
    make_mounts_private()?;
    pivot_into_base()?;
    mount_new_root()?;
    // The devices of the file systems made here, each taken right after its mount (a bind of
    // the Plan may cover its path later): what the jail writes there, the host never sees
    // (the name gate, namegate.rs).
    let mut private = PrivateDevices::default();
    private.add(NEW)?;
    let sizes = TmpfsSizes::of(plan);
    mount_private_tmp(&sizes.tmp)?;
    private.add(&format!("{NEW}/tmp"))?;
    mount_dev(&sizes.other, own_devpts)?;
    private.add(&format!("{NEW}/dev"))?;
    private.add(&format!("{NEW}/dev/shm"))?;
    mount_proc()?;
    // Which mounts a later mount point below them is walked through (`mount_point`): decided
    // once, not again for each later mount.
    let walked: Vec<bool> = plan
        .mounts
        .iter()
        .map(|e| {
            e.kind == MountKind::Bind(Access::Rw)
                || matches!(e.kind, MountKind::Overlay { .. })
                || (matches!(e.kind, MountKind::Bind(_)) && e.target == plan.project.root)
        })
        .collect();
    for index in 0..plan.mounts.len() {
        if let Some(tmpfs) = apply_plan_mount(plan, index, &sizes.other, &walked)? {
            private.add(&tmpfs)?;
        }
    }
    make_mask_sources()?;
    let masks = Masks::open()?;
    for path in &plan.masked {
        mask_path(plan, path, &masks)?;
    }
    drop(masks);
    pin_protected_ancestors(plan)?;
    for path in &plan.protected {
        protect_path(plan, path)?;
    }
    pivot_into_new_root()?;
    detach_old_root()?;
    remount_root_read_only()?;
    Ok(private)
}

/// The devices (`st_dev`) of the file systems the jail made itself.
#[derive(Default, Debug)]
pub(crate) struct PrivateDevices(pub(crate) Vec<u64>);

impl PrivateDevices {
    fn add(&mut self, path: &str) -> Result<(), JailError> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)
            .map_err(|e| JailError::at("stat a tmpfs the jail made", path, e))?;
        self.0.push(m.dev());
        Ok(())
    }
}

fn make_mounts_private() -> Result<(), JailError> {
    mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_PRIVATE, NONE)
        .map_err(|e| JailError::at("make mounts private", "/", e))
}

fn pivot_into_base() -> Result<(), JailError> {
    mount(
        Some("tmpfs"),
        BASE,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )
    .map_err(|e| JailError::at("mount the base tmpfs", BASE, e))?;
    let old = format!("{BASE}{OLD}");
    mkdir(&old, 0o755, "create the old root's mount point")?;
    nix::unistd::pivot_root(BASE, old.as_str())
        .map_err(|e| JailError::at("pivot_root into the base tmpfs", BASE, e))?;
    nix::unistd::chdir("/").map_err(|e| JailError::at("chdir", "/", e))
}

fn mount_new_root() -> Result<(), JailError> {
    mkdir(NEW, 0o755, "create the new root")?;
    mount(
        Some("tmpfs"),
        NEW,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )
    .map_err(|e| JailError::at("mount the new root tmpfs", NEW, e))
}

/// The size options of the tmpfs mounts the jail can write: /tmp, /dev/shm and the Plan's
/// (the private home). Their pages are memory, and nothing else bounds them when no cgroup
/// enforces `limits.memory` (best-effort), so together they hold at most `limits.memory`:
/// /tmp gets half of it (builds and test runs write there), the others share the other half.
/// Each also gets an inode count of one per KiB of its size, since an empty file costs kernel
/// memory too. Without a memory limit, the kernel's defaults (half of RAM each).
#[derive(Debug, PartialEq, Eq)]
struct TmpfsSizes {
    /// Extra mount options for /tmp (empty, or `,size=...,nr_inodes=...`).
    tmp: String,
    /// The same for /dev/shm and each tmpfs of the Plan.
    other: String,
}

impl TmpfsSizes {
    fn of(plan: &Plan) -> TmpfsSizes {
        let others = 1 + plan
            .mounts
            .iter()
            .filter(|m| m.kind == MountKind::Tmpfs)
            .count() as u64;
        let Some(memory) = plan.limits.memory else {
            return TmpfsSizes {
                tmp: String::new(),
                other: String::new(),
            };
        };
        let option = |size: u64| {
            let size = size.max(1 << 20);
            format!(",size={size},nr_inodes={}", (size / 1024).max(1024))
        };
        TmpfsSizes {
            tmp: option(memory / 2),
            other: option(memory / 2 / others),
        }
    }
}

fn mount_private_tmp(size: &str) -> Result<(), JailError> {
    let tmp = format!("{NEW}/tmp");
    mkdir(&tmp, 0o1777, "create /tmp")?;
    mount(
        Some("tmpfs"),
        tmp.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("mode=1777{size}").as_str()),
    )
    .map_err(|e| JailError::at("mount the private /tmp", "/tmp", e))
}

/// A minimal /dev: the harmless character devices bound from the host (a user namespace cannot
/// mknod), a private devpts with its own ptmx (the set-up process's when `own_devpts`: never
/// the host's), a tmpfs /dev/shm, the usual symlinks.
///
/// The device binds are read-only: they are the host's own nodes, which a root-run jail's uid
/// 0 owns, so `chmod 666 /dev/full` or `touch /dev/null` would change them on the host. A
/// read-only mount refuses every change to the node (mode, owner, times) but not the device's
/// own I/O: writing to /dev/null or reading /dev/urandom works as before.
fn mount_dev(shm_size: &str, own_devpts: bool) -> Result<(), JailError> {
    let dev = format!("{NEW}/dev");
    mkdir(&dev, 0o755, "create /dev")?;
    mount(
        Some("tmpfs"),
        dev.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755"),
    )
    .map_err(|e| JailError::at("mount the /dev tmpfs", "/dev", e))?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = format!("{dev}/{name}");
        let source = format!("{OLD}/dev/{name}");
        touch(Path::new(&target))?;
        mount(
            Some(source.as_str()),
            target.as_str(),
            NONE,
            MsFlags::MS_BIND,
            NONE,
        )
        .map_err(|e| JailError::at("bind a device", format!("/dev/{name}"), e))?;
        let path = std::ffi::CString::new(target)
            .map_err(|e| JailError::at("make a device read-only", format!("/dev/{name}"), e))?;
        mount_setattr(
            libc::AT_FDCWD,
            &path,
            0,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
        )
        .map_err(|e| {
            JailError::at(
                "make a device read-only (mount_setattr, Linux 5.12 or later)",
                format!("/dev/{name}"),
                e,
            )
        })?;
    }
    let pts = format!("{dev}/pts");
    mkdir(&pts, 0o755, "create /dev/pts")?;
    if own_devpts {
        let source = format!("{OLD}/dev/pts");
        mount(
            Some(source.as_str()),
            pts.as_str(),
            NONE,
            MsFlags::MS_BIND,
            NONE,
        )
        .map_err(|e| JailError::at("bind the jail's devpts", "/dev/pts", e))?;
    } else {
        mount(
            Some("devpts"),
            pts.as_str(),
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        )
        .map_err(|e| JailError::at("mount a private devpts", "/dev/pts", e))?;
    }
    let shm = format!("{dev}/shm");
    mkdir(&shm, 0o1777, "create /dev/shm")?;
    mount(
        Some("tmpfs"),
        shm.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("mode=1777{shm_size}").as_str()),
    )
    .map_err(|e| JailError::at("mount /dev/shm", "/dev/shm", e))?;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let at = format!("{dev}/{link}");
        std::os::unix::fs::symlink(to, &at)
            .map_err(|e| JailError::at("create a /dev symlink", format!("/dev/{link}"), e))?;
    }
    Ok(())
}

/// A fresh procfs of the jail's own PID namespace: it shows the jail's processes only.
fn mount_proc() -> Result<(), JailError> {
    let proc = format!("{NEW}/proc");
    mkdir(&proc, 0o555, "create /proc")?;
    mount(
        Some("proc"),
        proc.as_str(),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        NONE,
    )
    .map_err(|e| {
        JailError::at(
            "mount a fresh /proc (the kernel refuses when the host's /proc is partly covered, as in some containers)",
            "/proc",
            e,
        )
    })
}

/// Apply one mount of the Plan; a tmpfs's path (to stat it) is returned.
fn apply_plan_mount(
    plan: &Plan,
    index: usize,
    tmpfs_size: &str,
    walked: &[bool],
) -> Result<Option<String>, JailError> {
    let m = &plan.mounts[index];
    match &m.kind {
        MountKind::Tmpfs => {
            let target = mount_point(plan, index, true, walked)?;
            let path = proc_fd_path(&target);
            mount(
                Some("tmpfs"),
                path.as_str(),
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(format!("mode=0755{tmpfs_size}").as_str()),
            )
            .map_err(|e| JailError::at("mount a tmpfs", &m.target, e))?;
            // Stat it through its path: the descriptor is the directory below the mount.
            Ok(Some(under(NEW, &m.target).to_string_lossy().into_owned()))
        }
        MountKind::Bind(access) => {
            let access = *access;
            check_named_path(plan, &m.target)?;
            let Some(source) = open_source(plan, index)? else {
                return Ok(None);
            };
            let is_dir = kind_of(&source, None)
                .map_err(|e| JailError::at("find a mount's source", &m.source, e))?
                == Kind::Dir;
            let target = mount_point(plan, index, is_dir, walked)?;
            // Review mode: the project is an overlay over it, not the project itself.
            if let Some(review) = &plan.project.review
                && m.target == plan.project.root
                && access == Access::Rw
            {
                let proc = format!("{NEW}/proc");
                return crate::review::mount_overlay(
                    &source, &target, review, OLD, &proc, &m.target,
                )
                .map(|()| None);
            }
            bind_fd(&source, &target, access, &m.target).map(|()| None)
        }
        MountKind::Overlay { upper, work, above } => {
            check_named_path(plan, &m.target)?;
            let Some(lower) = open_source(plan, index)? else {
                return Ok(None);
            };
            let open = |p: &Path| {
                open_path(&under(OLD, p))
                    .map_err(|e| JailError::at("open a layer of the harness state", p, e))
            };
            let upper_fd = open(upper)?;
            let work_fd = open(work)?;
            let above_fds = above
                .iter()
                .map(|p| open(p))
                .collect::<Result<Vec<_>, _>>()?;
            let target = mount_point(plan, index, true, walked)?;
            mount_overlay(&lower, &above_fds, &upper_fd, &work_fd, &target, &m.target)
                .map(|()| None)
        }
    }
}

/// The source of `plan.mounts[index]` (a bind's, an overlay's lower directory), opened: below a
/// directory a jail can write without following any symlink; elsewhere as the host resolves it
/// (a top-level system symlink is recreated in the new root, and `None` returned, as for an
/// optional source that is missing).
fn open_source(plan: &Plan, index: usize) -> Result<Option<OwnedFd>, JailError> {
    let m = &plan.mounts[index];
    let roots = writable_roots(plan);
    let source = match deepest_below(roots.iter().copied(), &m.source) {
        // Below a directory a jail can write: no symlink is followed.
        Some(root) => {
            let base = open_path(&under(OLD, root))
                .map_err(|e| JailError::at("open a mount's source", root, e))?;
            let rel = m.source.strip_prefix(root).unwrap_or(&m.source);
            let w = walk(base, root, rel)
                .map_err(|e| JailError::at("open a mount's source", &m.source, e))?;
            if let Kind::Link(to) = &w.kind {
                return Err(JailError::at(
                    "open a mount's source",
                    &m.source,
                    planted_link(&w.at, to, root),
                ));
            }
            if !w.complete() {
                if m.optional {
                    return Ok(None);
                }
                return Err(JailError::at(
                    "find a mount's source",
                    &m.source,
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                ));
            }
            w.fd
        }
        None => {
            let source = under(OLD, &m.source);
            let meta = match fs::symlink_metadata(&source) {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && m.optional => {
                    return Ok(None);
                }
                Err(e) => {
                    return Err(JailError::at("find a mount's source", &m.source, e));
                }
            };
            // A top-level symlink of the system (/bin -> usr/bin on merged-/usr hosts)
            // is recreated as the same symlink, so the jail's layout matches the host's.
            if meta.file_type().is_symlink() && m.source == m.target {
                let to = fs::read_link(&source)
                    .map_err(|e| JailError::at("read a symlink", &m.source, e))?;
                let target = under(NEW, &m.target);
                if let Some(parent) = target.parent() {
                    mkdir_all(parent)?;
                }
                return std::os::unix::fs::symlink(&to, &target)
                    .map(|()| None)
                    .map_err(|e| JailError::at("recreate a symlink", &m.target, e));
            }
            open_path(&source).map_err(|e| JailError::at("open a mount's source", &m.source, e))?
        }
    };
    Ok(Some(source))
}

/// Mount an overlay at `target` (a descriptor of the mount point): `lower` (the host's
/// directory) at the bottom, `above` over it (topmost first), `upper` where the jail's writes
/// go. Every layer is named by its descriptor (`/proc/self/fd/N`), so what is layered is
/// exactly what was opened. `userxattr`: the overlay is mounted in the jail's own user
/// namespace (rootless, and as root too), where its whiteouts and opaque markers are
/// `user.overlay.*` attributes.
fn mount_overlay(
    lower: &OwnedFd,
    above: &[OwnedFd],
    upper: &OwnedFd,
    work: &OwnedFd,
    target: &OwnedFd,
    shown: &Path,
) -> Result<(), JailError> {
    let lowers: Vec<String> = above
        .iter()
        .chain(std::iter::once(lower))
        .map(proc_fd_path)
        .collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lowers.join(":"),
        proc_fd_path(upper),
        proc_fd_path(work)
    );
    mount(
        Some("overlay"),
        proc_fd_path(target).as_str(),
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(|e| JailError::at(OVERLAY_STEP, shown, e))
}

/// The step named when the harness state's overlay cannot be mounted.
pub(crate) const OVERLAY_STEP: &str = "mount corral's layer over the harness state (an overlay \
     in the jail's user namespace: Linux 5.11 or later, and user extended attributes on the file \
     system of corral's state directory; set XDG_STATE_HOME to a directory on one that has \
     them, or run with --allow-harness-config to bind the host's state read-write instead)";

/// The resolver gives a bind's source with every symlink resolved (so that it can be found
/// from the old root), and its target as named: the state directory, the `--ro` path. When
/// that named path lies below a directory a jail can write, no link below that directory may
/// be on it: the link could have been planted, and the source would be wherever it points.
fn check_named_path(plan: &Plan, named: &Path) -> Result<(), JailError> {
    let step = "check a bind's path";
    let roots = writable_roots(plan);
    let Some(root) = deepest_below(roots.iter().copied(), named) else {
        return Ok(());
    };
    let base = match open_path(&under(OLD, root)) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(JailError::at(step, root, e)),
    };
    let rel = named.strip_prefix(root).unwrap_or(named);
    let w = walk(base, root, rel).map_err(|e| JailError::at(step, named, e))?;
    match &w.kind {
        Kind::Link(to) => Err(JailError::at(step, named, planted_link(&w.at, to, root))),
        _ => Ok(()),
    }
}

/// The mount point of `plan.mounts[index]` in the new root, created (a directory, or an empty
/// file) when missing. Below an earlier bind the jail can write (the project holds
/// `--ro vendor`) it is walked and created without following symlinks; elsewhere it lies in
/// the jail's own skeleton or a system directory. `walked[i]`: whether `plan.mounts[i]` is
/// such a bind (read-write, or the project's).
fn mount_point(
    plan: &Plan,
    index: usize,
    dir: bool,
    walked: &[bool],
) -> Result<OwnedFd, JailError> {
    let m = &plan.mounts[index];
    // Below an earlier bind the jail can write (below a read-only system directory the links
    // are the host's own: a CA bundle overlaid in /etc/ssl is found as before).
    let earlier = plan.mounts[..index]
        .iter()
        .zip(walked)
        .filter(|(_, walked)| **walked)
        .map(|(e, _)| e.target.as_path());
    let Some(root) = deepest_below(earlier, &m.target) else {
        let target = under(NEW, &m.target);
        if dir {
            mkdir_all(&target)?;
        } else {
            if let Some(parent) = target.parent() {
                mkdir_all(parent)?;
            }
            touch(&target)?;
        }
        return open_path(&target).map_err(|e| JailError::at("open a mount point", &m.target, e));
    };
    let rel = m.target.strip_prefix(root).unwrap_or(&m.target);
    let step = "create a mount point";
    // Each round creates one missing component (or finds it made meanwhile).
    for _ in 0..=rel.components().count() * 2 {
        let base = open_path(&under(NEW, root)).map_err(|e| JailError::at(step, root, e))?;
        let w = walk(base, root, rel).map_err(|e| JailError::at(step, &m.target, e))?;
        if let Kind::Link(to) = &w.kind {
            return Err(JailError::at(
                step,
                &m.target,
                planted_link(&w.at, to, root),
            ));
        }
        if w.complete() {
            return Ok(w.fd);
        }
        if w.kind != Kind::Dir {
            return Err(JailError::at(
                step,
                &m.target,
                std::io::Error::other(format!("{} is not a directory", w.at.display())),
            ));
        }
        let name = w.rest[0].as_os_str();
        let last = w.rest.len() == 1;
        let made = if dir || !last {
            mkdirat(&w.fd, name, Mode::from_bits_truncate(0o755))
        } else {
            openat(
                &w.fd,
                name,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .map(drop)
        };
        match made {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(JailError::at(step, w.at.join(name), e)),
        }
    }
    Err(JailError::at(
        step,
        &m.target,
        std::io::Error::other("it keeps changing while it is created"),
    ))
}

/// `/proc/self/fd/N` of the new root's fresh procfs: a path that reaches exactly the entry of
/// descriptor N, for the calls that take a path only.
fn proc_fd_path(fd: &OwnedFd) -> String {
    format!("{NEW}/proc/self/fd/{}", fd.as_raw_fd())
}

/// Where a masked or protected `path` is looked up: the deepest bind of the Plan that holds
/// it (the project, usually), opened in the new root, and `path` relative to it. Paths held by
/// no bind are in the jail's own skeleton.
fn beneath_bind<'p>(
    plan: &Plan,
    path: &'p Path,
) -> Result<(OwnedFd, PathBuf, &'p Path), JailError> {
    let binds = plan
        .mounts
        .iter()
        .filter(|m| matches!(m.kind, MountKind::Bind(_)))
        .map(|m| m.target.as_path());
    let root = deepest_below(binds, path)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let base =
        open_path(&under(NEW, &root)).map_err(|e| JailError::at("open a directory", &root, e))?;
    let rel = path
        .strip_prefix(&root)
        .map_err(|_| JailError::Plan(format!("{} is not absolute", path.display())))?;
    Ok((base, root, rel))
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// Bind the entry `source` (recursively) onto the entry `target`, both descriptors (O_PATH is
/// enough), with nosuid, nodev, and read-only for `Access::Ro` set on every mount of the copy
/// before it is attached. Nothing is resolved by path, so what is bound is exactly what the
/// caller opened and checked. A target may be a symlink: the mount then covers the link itself.
fn bind_fd(
    source: &OwnedFd,
    target: &OwnedFd,
    access: Access,
    shown: &Path,
) -> Result<(), JailError> {
    let empty = c"";
    // SAFETY: `source` is an open descriptor and `empty` a NUL-terminated string; open_tree
    // returns a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            source.as_raw_fd(),
            empty.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE | AT_EMPTY_PATH,
        )
    };
    if tree < 0 {
        return Err(JailError::at(
            "copy a mount (open_tree, Linux 5.2 or later)",
            shown,
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if access == Access::Ro {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    mount_setattr(tree.as_raw_fd(), empty, AT_EMPTY_PATH | AT_RECURSIVE, attrs).map_err(|e| {
        JailError::at(
            if access == Access::Ro {
                "make a bind read-only (mount_setattr, Linux 5.12 or later)"
            } else {
                "make a bind nosuid,nodev (mount_setattr, Linux 5.12 or later)"
            },
            shown,
            e,
        )
    })?;
    // SAFETY: both descriptors are open and the paths are NUL-terminated empty strings.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(JailError::at(
            "attach a bind (move_mount)",
            shown,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const AT_EMPTY_PATH: libc::c_uint = libc::AT_EMPTY_PATH as libc::c_uint;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Add `attrs` to the mount at `dirfd`/`path` (and every mount below it with `AT_RECURSIVE`).
/// `mount_setattr(2)` only sets the given flags, so flags the kernel locked (inherited from a
/// more privileged namespace) stay as they are.
fn mount_setattr(
    dirfd: RawFd,
    path: &CStr,
    flags: libc::c_uint,
    attrs: u64,
) -> std::io::Result<()> {
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is NUL-terminated and `attr` a properly laid out `struct mount_attr`
    // whose size we pass; the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// An empty mode-000 file and directory on a read-only tmpfs: masked paths are bound to them,
/// so they are present, empty, unreadable, and their mode cannot be changed.
fn make_mask_sources() -> Result<(), JailError> {
    mkdir("/mask", 0o755, "create the mask directory")?;
    mount(
        Some("tmpfs"),
        "/mask",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=4k"),
    )
    .map_err(|e| JailError::at("mount the mask tmpfs", "/mask", e))?;
    touch(Path::new(MASK_FILE))?;
    fs::set_permissions(MASK_FILE, fs::Permissions::from_mode(0o000))
        .map_err(|e| JailError::at("chmod the mask file", MASK_FILE, e))?;
    mkdir(MASK_DIR, 0o000, "create the mask directory")?;
    fs::set_permissions(MASK_DIR, fs::Permissions::from_mode(0o000))
        .map_err(|e| JailError::at("chmod the mask directory", MASK_DIR, e))?;
    mount(
        NONE,
        "/mask",
        NONE,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        NONE,
    )
    .map_err(|e| JailError::at("make the mask tmpfs read-only", "/mask", e))
}

/// Cover a masked path. A path that no longer exists is left alone (nothing to read). A
/// masked symlink is covered itself (the jail sees an empty unreadable file, not the link), and
/// what it points to inside the same bind is covered too, so reading through the link shows
/// nothing either way.
fn mask_path(plan: &Plan, path: &Path, masks: &Masks) -> Result<(), JailError> {
    let step = "find a masked path";
    let (base, root, rel) = beneath_bind(plan, path)?;
    let beneath = base
        .try_clone()
        .map_err(|e| JailError::at(step, &root, e))?;
    let w = walk(base, &root, rel).map_err(|e| JailError::at(step, path, e))?;
    if !w.complete() {
        if let Kind::Link(to) = &w.kind {
            return Err(JailError::at(step, path, planted_link(&w.at, to, &root)));
        }
        return Ok(());
    }
    if matches!(w.kind, Kind::Link(_)) {
        // What the link points to, resolved as the jail would but never leaving `root` (an
        // absolute link or one that climbs out fails: outside the bind is the Plan's business).
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        if let Ok(target) = openat2(&beneath, rel, how) {
            let kind = kind_of(&target, None).map_err(|e| JailError::at(step, path, e))?;
            if !same_entry(&target, &beneath) {
                bind_fd(masks.for_kind(&kind), &target, Access::Ro, path)?;
            }
        }
    }
    bind_fd(masks.for_kind(&w.kind), &w.fd, Access::Ro, path)
}

/// The mode-000 sources masked paths are covered with.
struct Masks {
    file: OwnedFd,
    dir: OwnedFd,
}

impl Masks {
    fn open() -> Result<Masks, JailError> {
        Ok(Masks {
            file: open_path(Path::new(MASK_FILE))
                .map_err(|e| JailError::at("open the mask file", MASK_FILE, e))?,
            dir: open_path(Path::new(MASK_DIR))
                .map_err(|e| JailError::at("open the mask directory", MASK_DIR, e))?,
        })
    }

    fn for_kind(&self, kind: &Kind) -> &OwnedFd {
        if *kind == Kind::Dir {
            &self.dir
        } else {
            &self.file
        }
    }
}

fn same_entry(a: &OwnedFd, b: &OwnedFd) -> bool {
    match (nix::sys::stat::fstat(a), nix::sys::stat::fstat(b)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// A read-only bind cannot be renamed or removed, but its parent directory can: with `.git`
/// renamed away, a fresh `.git/hooks` is the host's. Every directory between a protected path
/// and the read-write bind holding it is bound onto itself (writable as before), which makes
/// it a mount point the jail cannot rename or remove either.
fn pin_protected_ancestors(plan: &Plan) -> Result<(), JailError> {
    let rw_roots: Vec<&Path> = plan
        .mounts
        .iter()
        .filter(|m| m.kind == MountKind::Bind(Access::Rw))
        .map(|m| m.target.as_path())
        .collect();
    let mut dirs = std::collections::BTreeSet::new();
    for path in &plan.protected {
        let Some(root) = deepest_below(rw_roots.iter().copied(), path) else {
            continue;
        };
        dirs.extend(
            path.ancestors()
                .skip(1)
                .take_while(|d| *d != root && d.starts_with(root))
                .map(Path::to_path_buf),
        );
    }
    // Parents first (a BTreeSet of paths orders a directory before what it holds).
    for dir in dirs {
        let step = "find a protected path's directory";
        let (base, root, rel) = beneath_bind(plan, &dir)?;
        let w = walk(base, &root, rel).map_err(|e| JailError::at(step, &dir, e))?;
        match &w.kind {
            Kind::Link(to) => {
                return Err(JailError::at(step, &dir, planted_link(&w.at, to, &root)));
            }
            Kind::Dir if w.complete() => bind_fd(&w.fd, &w.fd, Access::Rw, &dir)?,
            _ => {}
        }
    }
    Ok(())
}

/// Make a protected path read-only by binding it onto itself. corral creates a placeholder
/// for each absent one before the jail starts (`placeholder.rs`) and adds it to the Plan, so
/// what is still missing here could not be created by this user, hence not by the jail either.
/// When a file stands where the path needs a directory (a worktree's `.git` file under
/// `.git/hooks`), that file is made read-only: replacing it by a directory would create the
/// path. A symlink at the path or on the way refuses the run: protecting what it points to
/// would leave the path itself to whoever wrote the link.
/// A path still missing in a directory the jail can write (its placeholder vanished, or
/// could not be made) refuses the run: the jail could create it.
fn protect_path(plan: &Plan, path: &Path) -> Result<(), JailError> {
    let step = "find a protected path";
    let (base, root, rel) = beneath_bind(plan, path)?;
    let w = walk(base, &root, rel).map_err(|e| JailError::at(step, path, e))?;
    match &w.kind {
        Kind::Link(to) => Err(JailError::at(step, path, planted_link(&w.at, to, &root))),
        _ if w.complete() => bind_fd(&w.fd, &w.fd, Access::Ro, path),
        Kind::Other if w.at != root => bind_fd(&w.fd, &w.fd, Access::Ro, path),
        Kind::Dir if root != Path::new("/") => missing_in(&w.fd, &w.at, path),
        _ => Ok(()),
    }
}

/// `path` is missing and `dir` (an O_PATH descriptor, shown as `at`) is where it would be
/// created: fine when that directory is on a read-only mount (a protected placeholder above
/// it, a read-only bind), an error naming the path otherwise.
pub(crate) fn missing_in(dir: &OwnedFd, at: &Path, path: &Path) -> Result<(), JailError> {
    let step = "protect a path";
    let st = nix::sys::statvfs::fstatvfs(dir).map_err(|e| JailError::at(step, at, e))?;
    if st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
        return Ok(());
    }
    Err(JailError::at(
        step,
        path,
        std::io::Error::other(format!(
            "it is missing and the jail could create it in {}, which it can write (another \
             run of this project may have removed its placeholder meanwhile): run again",
            at.display()
        )),
    ))
}

/// pivot_root(".", ".") stacks the old root (the base tmpfs, with the host root below it at
/// /oldroot) on top of the new root; detaching it leaves only the new root.
fn pivot_into_new_root() -> Result<(), JailError> {
    nix::unistd::chdir(NEW).map_err(|e| JailError::at("chdir", NEW, e))?;
    nix::unistd::pivot_root(".", ".")
        .map_err(|e| JailError::at("pivot_root into the new root", NEW, e))
}

fn detach_old_root() -> Result<(), JailError> {
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| JailError::at("detach the old root", "/", e))?;
    nix::unistd::chdir("/").map_err(|e| JailError::at("chdir", "/", e))
}

/// The root tmpfs itself becomes read-only: the jail writes only where the Plan (or /tmp,
/// /dev/shm) says it may.
fn remount_root_read_only() -> Result<(), JailError> {
    mount(
        NONE,
        "/",
        NONE,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        NONE,
    )
    .map_err(|e| JailError::at("make the root read-only", "/", e))
}

/// `base` joined with the absolute `path`, keeping only normal components (no `..` escapes).
pub(crate) fn under(base: &str, path: &Path) -> PathBuf {
    let mut out = PathBuf::from(base);
    for c in path.components() {
        if let Component::Normal(part) = c {
            out.push(part);
        }
    }
    out
}

fn mkdir(path: &str, mode: u32, step: &'static str) -> Result<(), JailError> {
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(JailError::at(step, path, e)),
    }
}

fn mkdir_all(path: &Path) -> Result<(), JailError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| JailError::at("create a mount point", shown(path), e))
}

fn touch(path: &Path) -> Result<(), JailError> {
    // A file that is already there (e.g. a system file under a read-only bind, which a
    // credential-gateway CA bundle overlays) is its own mount point: opening it for writing
    // would fail on the read-only mount for nothing.
    if path.symlink_metadata().is_ok() {
        return Ok(());
    }
    match fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) => Err(JailError::at("create a mount point", shown(path), e)),
    }
}

/// A path under /newroot or /oldroot as the user knows it.
fn shown(path: &Path) -> PathBuf {
    for prefix in [NEW, OLD] {
        if let Ok(rest) = path.strip_prefix(prefix) {
            return Path::new("/").join(rest);
        }
    }
    path.to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// Opening paths that a jail could have changed.
//
// The project (and every read-write bind, every state directory) is writable in the jail, so
// any of its entries may be a symlink a previous run planted. Below such a root nothing is
// resolved by path: each component is opened with `openat(O_PATH|O_NOFOLLOW)` from its parent's
// descriptor, a symlink is never followed, and mounts are made by descriptor (`open_tree` +
// `move_mount`), so what gets bound is exactly the entry that was checked.

/// What a component-by-component walk reached.
pub(crate) struct Walked {
    /// O_PATH descriptor of the deepest entry reached: the path itself when `rest` is empty.
    pub(crate) fd: OwnedFd,
    /// That entry's path, as shown to the user.
    pub(crate) at: PathBuf,
    pub(crate) kind: Kind,
    /// Components not reached: empty when the whole path exists. The walk stops at a missing
    /// component, at a symlink, and at an entry that is not a directory.
    pub(crate) rest: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    /// A symlink, and what it points to.
    Link(PathBuf),
    /// Anything else: a regular file, a socket, a device...
    Other,
}

impl Walked {
    pub(crate) fn complete(&self) -> bool {
        self.rest.is_empty()
    }
}

/// Walk `rel` below the directory `base` (shown as `base_at`) without following any symlink.
pub(crate) fn walk(base: OwnedFd, base_at: &Path, rel: &Path) -> std::io::Result<Walked> {
    let parts: Vec<std::ffi::OsString> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_os_string()),
            _ => None,
        })
        .collect();
    let mut w = Walked {
        kind: kind_of(&base, None)?,
        fd: base,
        at: base_at.to_path_buf(),
        rest: Vec::new(),
    };
    for (i, part) in parts.iter().enumerate() {
        if w.kind != Kind::Dir {
            w.rest = parts[i..].to_vec();
            return Ok(w);
        }
        match openat(
            &w.fd,
            part.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(next) => {
                w.kind = kind_of(&next, Some((&w.fd, part)))?;
                w.fd = next;
                w.at.push(part);
            }
            Err(Errno::ENOENT) => {
                w.rest = parts[i..].to_vec();
                return Ok(w);
            }
            Err(e) => return Err(std::io::Error::from(e)),
        }
    }
    Ok(w)
}

/// The kind of the entry `fd` (an O_PATH descriptor); for a symlink its text, read through
/// its parent directory and name.
fn kind_of(fd: &OwnedFd, parent: Option<(&OwnedFd, &std::ffi::OsString)>) -> std::io::Result<Kind> {
    let st = nix::sys::stat::fstat(fd)?;
    Ok(match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Link(match parent {
            Some((dir, name)) => PathBuf::from(readlinkat(dir, name.as_os_str())?),
            None => PathBuf::from("?"),
        }),
        _ => Kind::Other,
    })
}

/// O_PATH descriptor of `path`, resolved normally (its components are the host's or the
/// user's own layout, or the jail's skeleton).
pub(crate) fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(openat(
        AT_FDCWD,
        path,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// The deepest of `roots` that holds `path` strictly below it.
pub(crate) fn deepest_below<'a>(
    roots: impl IntoIterator<Item = &'a Path>,
    path: &Path,
) -> Option<&'a Path> {
    roots
        .into_iter()
        .filter(|r| path.starts_with(r) && path != *r)
        .max_by_key(|r| r.components().count())
}

/// The directories a jail could write into on the host, by the Plan: the project (whatever
/// this run's access, an earlier run may have had it read-write) and every read-write bind
/// (state directories, `--rw`). Their own paths are the user's choice; what lies below them
/// is not followed through symlinks.
pub(crate) fn writable_roots(plan: &Plan) -> Vec<&Path> {
    let mut roots: Vec<&Path> = plan
        .mounts
        .iter()
        .filter_map(|m| match &m.kind {
            MountKind::Bind(Access::Rw) => Some(m.source.as_path()),
            // What the jail writes in an overlay lands in its upper directory.
            MountKind::Overlay { upper, .. } => Some(upper.as_path()),
            MountKind::Bind(Access::Ro) | MountKind::Tmpfs => None,
        })
        .collect();
    roots.push(plan.project.root.as_path());
    roots
}

/// The error for a symlink found where a jail could have planted it.
pub(crate) fn planted_link(at: &Path, to: &Path, root: &Path) -> std::io::Error {
    std::io::Error::other(format!(
        "{} is a symbolic link (to {}) inside {}, which a jail can write, so corral does not \
         follow it; a previous run may have planted it: check it, then remove it or name the \
         real path",
        at.display(),
        to.display(),
        root.display(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_keeps_normal_components_only() {
        assert_eq!(
            under(NEW, Path::new("/usr/lib")),
            PathBuf::from("/newroot/usr/lib")
        );
        assert_eq!(
            under(OLD, Path::new("/a/../../etc")),
            PathBuf::from("/oldroot/a/etc")
        );
        assert_eq!(under(NEW, Path::new("/")), PathBuf::from("/newroot"));
    }

    #[test]
    fn tmpfs_mounts_share_the_memory_limit() {
        let dir = Path::new("/p");
        let mut plan = Plan::minimal(dir, Path::new("/home/u"), vec!["true".into()]);
        assert_eq!(
            TmpfsSizes::of(&plan),
            TmpfsSizes {
                tmp: String::new(),
                other: String::new()
            }
        );
        // 256 MiB: /tmp 128 MiB, /dev/shm and the home 64 MiB each.
        plan.limits.memory = Some(256 << 20);
        assert_eq!(
            TmpfsSizes::of(&plan),
            TmpfsSizes {
                tmp: ",size=134217728,nr_inodes=131072".into(),
                other: ",size=67108864,nr_inodes=65536".into(),
            }
        );
        // A tiny limit still leaves a usable /tmp.
        plan.limits.memory = Some(1000);
        assert_eq!(TmpfsSizes::of(&plan).tmp, ",size=1048576,nr_inodes=1024");
    }

    #[test]
    fn shown_strips_the_set_up_prefixes() {
        assert_eq!(
            shown(Path::new("/newroot/home/u")),
            PathBuf::from("/home/u")
        );
        assert_eq!(shown(Path::new("/oldroot/etc")), PathBuf::from("/etc"));
        assert_eq!(shown(Path::new("/mask/file")), PathBuf::from("/mask/file"));
    }

    #[test]
    fn deepest_below_picks_the_nearest_strict_ancestor() {
        let roots = [Path::new("/p"), Path::new("/p/sub"), Path::new("/q")];
        assert_eq!(
            deepest_below(roots, Path::new("/p/sub/x")),
            Some(Path::new("/p/sub"))
        );
        assert_eq!(
            deepest_below(roots, Path::new("/p/sub")),
            Some(Path::new("/p"))
        );
        assert_eq!(deepest_below(roots, Path::new("/p")), None);
        assert_eq!(deepest_below(roots, Path::new("/pq/x")), None);
    }

    #[test]
    fn a_protected_path_missing_in_a_writable_directory_refuses_the_run() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(".git");
        let e = missing_in(&open_path(d.path()).unwrap(), d.path(), &path).unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert!(e.to_string().contains("could create it"), "{e}");
    }

    #[test]
    fn an_overlay_that_cannot_be_mounted_is_an_error_naming_the_step_and_the_state_directory() {
        // Outside a jail's set-up (no new root's procfs, no mount namespace of its own) the
        // mount fails: the error says what failed, where, and what to do, and nothing else
        // is mounted in its place.
        let d = tempfile::tempdir().unwrap();
        for sub in ["lower", "upper", "work", "target"] {
            std::fs::create_dir(d.path().join(sub)).unwrap();
        }
        let fd = |sub: &str| open_path(&d.path().join(sub)).unwrap();
        let shown = Path::new("/home/u/.claude");
        let e = mount_overlay(
            &fd("lower"),
            &[],
            &fd("upper"),
            &fd("work"),
            &fd("target"),
            shown,
        )
        .unwrap_err();
        match &e {
            JailError::Step { step, path, .. } => {
                assert_eq!(*step, OVERLAY_STEP);
                assert_eq!(path.as_deref(), Some(shown));
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("--allow-harness-config"), "{e}");
        assert!(
            std::fs::read_dir(d.path().join("target"))
                .unwrap()
                .next()
                .is_none()
        );
    }

    #[test]
    fn walk_stops_at_links_missing_entries_and_files() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("a/link")).unwrap();
        let w = |rel: &str| walk(open_path(root).unwrap(), root, Path::new(rel)).unwrap();

        let full = w("a/b");
        assert!(full.complete());
        assert_eq!(full.kind, Kind::Dir);
        assert_eq!(full.at, root.join("a/b"));

        let missing = w("a/b/c/d");
        assert_eq!(missing.at, root.join("a/b"));
        assert_eq!(missing.rest, vec!["c", "d"]);

        let link = w("a/link/passwd");
        assert_eq!(link.kind, Kind::Link(PathBuf::from("/etc")));
        assert_eq!(link.at, root.join("a/link"));
        assert_eq!(link.rest, vec!["passwd"]);

        let file = w("a/f/x");
        assert_eq!(file.kind, Kind::Other);
        assert_eq!(file.rest, vec!["x"]);
    }
}
