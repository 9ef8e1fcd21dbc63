//! The jail's file system: its mounts in the order they apply, the paths it sees read-only
//! (protected), and corral's layer over the harness's state.

use std::path::{Path, PathBuf};

use crate::plan::{Access, HarnessState, Mount, MountKind, StateLayer, system_mounts};

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
        mounts.extend(harness_mounts(g, m));
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

/// The harness's state (corral's layer over the host's, or with `--allow-harness-config` the
/// host's own, read-write), the profile's read-only paths, and the package of the command
/// found outside the system directories.
fn harness_mounts(g: &Gathered, m: &Layer) -> Vec<Mount> {
    let p = &g.profile;
    let mut out = Vec::new();
    match harness_state(g, m) {
        None => {
            for d in p.state_dirs.iter().chain(&p.state_files) {
                let path = PathBuf::from(expand_home_value(d, &g.home));
                out.push(bind(g, &path, &path, Access::Rw, false));
            }
        }
        Some(state) => out.extend(state_mounts(g, &state)),
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

/// The mounts of corral's layer: each state directory as an overlay over the host's (or the
/// layer's copy of it, bound read-write), each state file as the layer's copy.
fn state_mounts(g: &Gathered, state: &HarnessState) -> Vec<Mount> {
    let dirs = state.dirs.iter().map(|d| {
        let source = g.disk.canonical.get(&d.host).unwrap_or(&d.host).clone();
        let kind = match &d.layer {
            StateLayer::Overlay { upper, work } => MountKind::Overlay {
                upper: upper.clone(),
                work: work.clone(),
                above: Vec::new(),
            },
            StateLayer::Copy { dir } => {
                return Mount {
                    source: dir.clone(),
                    target: d.host.clone(),
                    kind: MountKind::Bind(Access::Rw),
                    optional: false,
                };
            }
        };
        Mount {
            source,
            target: d.host.clone(),
            kind,
            optional: false,
        }
    });
    let files = state.files.iter().map(|f| Mount {
        source: f.copy.clone(),
        target: f.host.clone(),
        kind: MountKind::Bind(Access::Rw),
        optional: false,
    });
    dirs.chain(files).collect()
}

/// corral's layer over the harness's state for this user and profile: `harness/PROFILE` in
/// corral's state directory, with `dirs/KEY/{upper,work}` (or `dirs/KEY/copy` for docker,
/// which has no overlay volume) per state directory and `files/KEY` per state file. `None`
/// with `--allow-harness-config` (the host's state is bound read-write) or no state at all.
pub(in super::super) fn harness_state(g: &Gathered, m: &Layer) -> Option<HarnessState> {
    let p = &g.profile;
    if m.allow_harness_config || (p.state_dirs.is_empty() && p.state_files.is_empty()) {
        return None;
    }
    let engine = m.engine.unwrap_or(super::super::layer::DEFAULT_ENGINE);
    let state_dir = crate::trust::state_dir(&g.env, &g.home);
    Some(crate::harness::layer_for(p, &g.home, &state_dir, engine))
}

/// Every host path either jail binds, as written: what gathering resolves symlinks of.
pub(in super::super) fn bind_sources(g: &Gathered, m: &Layer) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [Side::Agent, Side::Executor]
        .into_iter()
        .flat_map(|side| mounts(g, m, side))
        .filter(|mnt| matches!(mnt.kind, MountKind::Bind(_) | MountKind::Overlay { .. }))
        .map(|mnt| mnt.source)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Paths made read-only in one jail: `filesystem.protect`, the project's `corral.toml` (even
/// when absent, so its creation is blocked too), every policy file and corral directory a
/// read-write bind exposes.
pub(in super::super) fn protected(g: &Gathered, m: &Layer) -> Vec<PathBuf> {
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
