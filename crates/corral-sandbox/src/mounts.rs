//! The jail's filesystem, built in the jail's own mount namespace by its PID 1.
//!
//! The order is the kernel's: make every inherited mount private, put a tmpfs "base" at /tmp and
//! pivot into it (the host root is then at /oldroot, so sources anywhere, /tmp included, stay
//! reachable), build the new root on a tmpfs at /newroot (/tmp, /dev, /proc, the Plan's mounts in
//! order, masked files, protected paths), then pivot into /newroot and detach the old root. After
//! that no host path the Plan does not name is reachable from the jail.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use corral_policy::plan::{Access, Mount, MountKind, Plan};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::JailError;

const BASE: &str = "/tmp";
const OLD: &str = "/oldroot";
const NEW: &str = "/newroot";
/// Mode-000 empty file and directory that masked paths are bound to (in the base tmpfs).
const MASK_FILE: &str = "/mask/file";
const MASK_DIR: &str = "/mask/dir";

const NONE: Option<&str> = None;

/// Build the jail's root from `plan` and pivot into it. Runs in the jail's PID 1, which owns the
/// jail's user and mount namespaces.
pub fn set_up_root(plan: &Plan) -> Result<(), JailError> {
    make_mounts_private()?;
    pivot_into_base()?;
    mount_new_root()?;
    mount_private_tmp()?;
    mount_dev()?;
    mount_proc()?;
    for m in &plan.mounts {
        apply_plan_mount(m)?;
    }
    make_mask_sources()?;
    for path in &plan.masked {
        mask_path(path)?;
    }
    pin_protected_ancestors(plan)?;
    for path in &plan.protected {
        protect_path(path)?;
    }
    pivot_into_new_root()?;
    detach_old_root()?;
    remount_root_read_only()?;
    Ok(())
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

fn mount_private_tmp() -> Result<(), JailError> {
    let tmp = format!("{NEW}/tmp");
    mkdir(&tmp, 0o1777, "create /tmp")?;
    mount(
        Some("tmpfs"),
        tmp.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )
    .map_err(|e| JailError::at("mount the private /tmp", "/tmp", e))
}

/// A minimal /dev: the harmless character devices bound from the host (a user namespace cannot
/// mknod), a private devpts with its own ptmx, a tmpfs /dev/shm, the usual symlinks.
fn mount_dev() -> Result<(), JailError> {
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
    }
    let pts = format!("{dev}/pts");
    mkdir(&pts, 0o755, "create /dev/pts")?;
    mount(
        Some("devpts"),
        pts.as_str(),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| JailError::at("mount a private devpts", "/dev/pts", e))?;
    let shm = format!("{dev}/shm");
    mkdir(&shm, 0o1777, "create /dev/shm")?;
    mount(
        Some("tmpfs"),
        shm.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
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

fn apply_plan_mount(m: &Mount) -> Result<(), JailError> {
    let target = under(NEW, &m.target);
    match m.kind {
        MountKind::Tmpfs => {
            mkdir_all(&target)?;
            mount(
                Some("tmpfs"),
                &target,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=0755"),
            )
            .map_err(|e| JailError::at("mount a tmpfs", &m.target, e))
        }
        MountKind::Bind(access) => {
            let source = under(OLD, &m.source);
            let meta = match fs::symlink_metadata(&source) {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && m.optional => return Ok(()),
                Err(e) => return Err(JailError::at("find a mount's source", &m.source, e)),
            };
            // A top-level symlink of the system (/bin -> usr/bin on merged-/usr hosts) is
            // recreated as the same symlink, so the jail's layout matches the host's.
            if meta.file_type().is_symlink() && m.source == m.target {
                let to = fs::read_link(&source)
                    .map_err(|e| JailError::at("read a symlink", &m.source, e))?;
                if let Some(parent) = target.parent() {
                    mkdir_all(parent)?;
                }
                return std::os::unix::fs::symlink(&to, &target)
                    .map_err(|e| JailError::at("recreate a symlink", &m.target, e));
            }
            let is_dir = fs::metadata(&source)
                .map_err(|e| JailError::at("find a mount's source", &m.source, e))?
                .is_dir();
            if is_dir {
                mkdir_all(&target)?;
            } else {
                if let Some(parent) = target.parent() {
                    mkdir_all(parent)?;
                }
                touch(&target)?;
            }
            bind(&source, &target, access, &m.target)
        }
    }
}

/// Bind `source` at `target` (recursively) and set its flags: nosuid, nodev, and read-only for
/// `Access::Ro`, applied to every mount below it too.
fn bind(source: &Path, target: &Path, access: Access, shown: &Path) -> Result<(), JailError> {
    mount(
        Some(source),
        target,
        NONE,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        NONE,
    )
    .map_err(|e| JailError::at("bind", shown, e))?;
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if access == Access::Ro {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    set_mount_attrs(target, attrs).map_err(|e| {
        JailError::at(
            if access == Access::Ro {
                "make a bind read-only"
            } else {
                "make a bind nosuid,nodev"
            },
            shown,
            e,
        )
    })
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const AT_RECURSIVE: libc::c_uint = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Add `attrs` to the mount at `path` and every mount below it. `mount_setattr(2)` only sets
/// the given flags, so flags the kernel locked (inherited from a more privileged namespace)
/// stay as they are. Falls back to a plain remount that preserves them on kernels before 5.12.
fn set_mount_attrs(path: &Path, attrs: u64) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `c` is a valid NUL-terminated path and `attr` a properly laid out `struct
    // mount_attr` whose size we pass; the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOSYS) {
        return Err(err);
    }
    remount_preserving_locked(path, attrs & MOUNT_ATTR_RDONLY != 0)
}

/// Remount a bind with nosuid,nodev (and rdonly) plus whatever flags it already carries.
fn remount_preserving_locked(path: &Path, read_only: bool) -> std::io::Result<()> {
    let st = nix::sys::statvfs::statvfs(path)?;
    use nix::sys::statvfs::FsFlags;
    let f = st.flags();
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if read_only || f.contains(FsFlags::ST_RDONLY) {
        flags |= MsFlags::MS_RDONLY;
    }
    for (have, want) in [
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(have) {
            flags |= want;
        }
    }
    mount(NONE, path, NONE, flags, NONE)?;
    Ok(())
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

/// Cover a masked path. A path that no longer exists is left alone (nothing to read).
fn mask_path(path: &Path) -> Result<(), JailError> {
    let target = under(NEW, path);
    let meta = match fs::symlink_metadata(&target) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(JailError::at("find a masked path", path, e)),
    };
    let source = if meta.is_dir() { MASK_DIR } else { MASK_FILE };
    bind(Path::new(source), &target, Access::Ro, path)
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
        let Some(root) = rw_roots
            .iter()
            .filter(|r| path.starts_with(r) && path != *r)
            .max_by_key(|r| r.components().count())
        else {
            continue;
        };
        dirs.extend(
            path.ancestors()
                .skip(1)
                .take_while(|d| d != root && d.starts_with(root))
                .map(Path::to_path_buf),
        );
    }
    // Parents first (a BTreeSet of paths orders a directory before what it holds).
    for dir in dirs {
        let target = under(NEW, &dir);
        match fs::symlink_metadata(&target) {
            Ok(meta) if meta.is_dir() => bind(&target, &target, Access::Rw, &dir)?,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(JailError::at("find a protected path's directory", &dir, e)),
        }
    }
    Ok(())
}

/// Make a protected path read-only by binding it onto itself. A path that does not exist is
/// left alone: corral creates a placeholder for the policy file before the jail starts (see
/// `placeholder.rs`), so that one always exists here.
fn protect_path(path: &Path) -> Result<(), JailError> {
    let target = under(NEW, path);
    match fs::symlink_metadata(&target) {
        Ok(_) => bind(&target, &target, Access::Ro, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(JailError::at("find a protected path", path, e)),
    }
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
    fn shown_strips_the_set_up_prefixes() {
        assert_eq!(
            shown(Path::new("/newroot/home/u")),
            PathBuf::from("/home/u")
        );
        assert_eq!(shown(Path::new("/oldroot/etc")), PathBuf::from("/etc"));
        assert_eq!(shown(Path::new("/mask/file")), PathBuf::from("/mask/file"));
    }
}
