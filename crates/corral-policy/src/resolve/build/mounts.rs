//! The jail's file system: its mounts in the order they apply, and the paths it sees
//! read-only (protected) or whose code-bearing keys are put back (guarded).

use std::path::{Path, PathBuf};

use crate::plan::{Access, ConfigFormat, GuardedFile, Mount, MountKind, system_mounts};

use super::super::JAIL_BIN_DIR;
use super::super::gather::Gathered;
use super::super::layer::{DEFAULT_PROJECT_ACCESS, Layer, Loc, expand_home_value};
use super::{Side, dedup};

/// The mounts of one jail, in the order they are applied: the system, a private home, the
/// harness's state (the agent's only), the toolchains, the policy's binds outside the project,
/// the project, corral itself, then the policy's binds inside the project (after the project's
/// own mount, which would otherwise cover them).
pub(in super::super) fn mounts(g: &Gathered, m: &Layer, side: Side) -> Vec<Mount> {
    let mut mounts = system_mounts();
    mounts.push(Mount {
        source: PathBuf::new(),
        target: g.home.clone(),
        kind: MountKind::Tmpfs,
        optional: false,
    });
    if side == Side::Agent {
        mounts.extend(harness_mounts(g));
    }
    for t in g.disk.toolchains.iter().flat_map(|t| &t.binds) {
        mounts.push(bind(g, t, t, Access::Ro, true));
    }
    let (ro, rw) = match side {
        Side::Agent => (&m.read_only, &m.read_write),
        Side::Executor => (&m.exec_read_only, &m.exec_read_write),
    };
    let (inside, outside): (Vec<Mount>, Vec<Mount>) = policy_binds(g, ro, rw)
        .into_iter()
        .partition(|b| b.target.starts_with(&g.root) && b.target != g.root);
    mounts.extend(outside);
    let access = m.project_access.unwrap_or(DEFAULT_PROJECT_ACCESS);
    mounts.push(bind(g, &g.root, &g.root, access, false));
    mounts.push(bind(
        g,
        &g.corral_exe,
        &Path::new(JAIL_BIN_DIR).join("corral"),
        Access::Ro,
        false,
    ));
    mounts.extend(inside);
    mounts
}

/// The harness's state (read-write), the profile's read-only paths, and the package of the
/// command found outside the system directories.
fn harness_mounts(g: &Gathered) -> Vec<Mount> {
    let p = &g.profile;
    let mut out = Vec::new();
    for d in p.state_dirs.iter().chain(&p.state_files) {
        let path = PathBuf::from(expand_home_value(d, &g.home));
        out.push(bind(g, &path, &path, Access::Rw, false));
    }
    for d in &p.read_only {
        let path = PathBuf::from(expand_home_value(d, &g.home));
        out.push(bind(g, &path, &path, Access::Ro, true));
    }
    for b in &g.disk.command.binds {
        out.push(bind(g, b, b, Access::Ro, false));
    }
    out
}

/// The policy's binds, read-only ones first, each path once.
fn policy_binds(g: &Gathered, ro: &[(PathBuf, Loc)], rw: &[(PathBuf, Loc)]) -> Vec<Mount> {
    let mut out = Vec::new();
    for (p, _) in dedup(ro.iter().cloned()) {
        out.push(bind(g, &p, &p, Access::Ro, true));
    }
    for (p, _) in dedup(rw.iter().cloned()) {
        out.push(bind(g, &p, &p, Access::Rw, true));
    }
    out
}

/// A bind of `source` (symlinks resolved, as gathered) at `target`.
fn bind(g: &Gathered, source: &Path, target: &Path, access: Access, optional: bool) -> Mount {
    Mount {
        source: g
            .disk
            .canonical
            .get(source)
            .cloned()
            .unwrap_or_else(|| source.to_path_buf()),
        target: target.to_path_buf(),
        kind: MountKind::Bind(access),
        optional,
    }
}

/// Every host path either jail binds, as written: what gathering resolves symlinks of.
pub(in super::super) fn bind_sources(g: &Gathered, m: &Layer) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [Side::Agent, Side::Executor]
        .into_iter()
        .flat_map(|side| mounts(g, m, side))
        .filter(|mnt| matches!(mnt.kind, MountKind::Bind(_)))
        .map(|mnt| mnt.source)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Paths made read-only in one jail: `filesystem.protect`, the project's `corral.toml` (even
/// when absent, so its creation is blocked too), every policy file and corral directory a
/// read-write bind exposes, and, in the agent's jail, the harness's code in its state
/// directories.
pub(in super::super) fn protected(g: &Gathered, m: &Layer, side: Side) -> Vec<PathBuf> {
    let mut protected: Vec<PathBuf> = dedup(m.protect.iter().map(|(p, _)| g.root.join(p)));
    protected.push(g.project_policy_path());
    // Each is compared as written and as it really is (gathered): `~/.config/corral` may be a
    // symlink into a dotfiles repository that is the project or a `--rw` bind, and then the
    // jail reaches the real files through that bind.
    let project_file = g.layers.project.as_ref().map(|p| &p.path);
    for f in g.user_config.iter().chain(project_file) {
        protected.extend(g.rw_views(f).iter().cloned());
    }
    // corral's own directories (user config, trust store, audit logs): the agent must not trust
    // a policy for itself, plant a user config or rewrite the audit log. A directory that holds
    // the project is left alone (covering it would make the project read-only); the trust
    // store alone is protected then.
    for dir in &g.corral_dirs {
        for seen in g.rw_views(dir) {
            if g.root.starts_with(seen) {
                protected.push(seen.join(crate::trust::STORE_FILE));
            } else {
                protected.push(seen.clone());
            }
        }
    }
    if side == Side::Agent && !m.allow_harness_config {
        protected.extend(harness_code(g));
    }
    // With a compose executor, the override file a plain `compose up` in the project merges
    // stays read-only (defence in depth: `corral init --compose` writes its service into a file
    // of its own outside the project and starts compose with that file only; projects set up
    // by an earlier corral still define the service here).
    if matches!(
        m.exec_target,
        Some((crate::plan::ExecutorTarget::Compose(_), _))
    ) {
        protected.push(g.root.join(crate::plan::COMPOSE_OVERRIDE_FILE));
    }
    protected.sort();
    protected.dedup();
    protected
}

/// The profile's code paths in its state directories, and the files its settings name there.
fn harness_code(g: &Gathered) -> Vec<PathBuf> {
    let code = g.profile.state_code.iter();
    code.map(|c| PathBuf::from(expand_home_value(c, &g.home)))
        .chain(g.disk.harness_files.iter().cloned())
        .collect()
}

/// The profile's guarded configuration files, `~/` expanded; none when the run may change the
/// harness's code.
pub(in super::super) fn guarded(g: &Gathered, m: &Layer) -> Vec<GuardedFile> {
    if m.allow_harness_config {
        return Vec::new();
    }
    g.profile
        .guard
        .iter()
        .map(|e| GuardedFile {
            path: PathBuf::from(expand_home_value(&e.file, &g.home)),
            format: e.format,
            keys: e.keys.clone(),
            commands: e.commands.clone(),
        })
        .collect()
}

/// The harness settings whose string values may name scripts in its state directories (a
/// statusLine script is code too), and those directories: what gathering searches.
pub(in super::super) fn harness_settings(
    g: &Gathered,
) -> (Vec<(PathBuf, ConfigFormat)>, Vec<PathBuf>) {
    let home = &g.home;
    let p = &g.profile;
    let settings = p
        .state_code
        .iter()
        .map(|c| PathBuf::from(expand_home_value(c, home)))
        .filter_map(|p| match p.extension().and_then(|e| e.to_str()) {
            Some("json") => Some((p.clone(), ConfigFormat::Json)),
            Some("toml") => Some((p.clone(), ConfigFormat::Toml)),
            _ => None,
        })
        .chain(
            p.guard
                .iter()
                .map(|e| (PathBuf::from(expand_home_value(&e.file, home)), e.format)),
        )
        .collect();
    let state_dirs = p
        .state_dirs
        .iter()
        .map(|d| PathBuf::from(expand_home_value(d, home)))
        .collect();
    (settings, state_dirs)
}
