//! Gathering: every read a plan needs of the file system and the caller's situation (the
//! working directory and home resolved, the project chosen, the policy files read and checked,
//! the command found on PATH, toolchains found, the project walked for masked files, symlinks
//! of bound paths resolved), returned as plain data for [`build`](super::build).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::load_policy;
use crate::error::PolicyError;
use crate::plan::{Engine, ProjectSource, Toolchain};
use crate::profile::Profile;

use super::build::{self, Policy, bind_sources};
use super::command::{ResolvedCommand, resolve_command};
use super::layer::{DEFAULT_ENGINE, Layer, PathCtx, Trust, normalize};
use super::policy_file::{file_layer, flags_layer};
use super::project::{Scratch, choose_project};
use super::{RealPaths, Request, real_path};

/// Everything the plan is built from: the caller, the project, the policy's layers and what
/// the disk says about the paths the merged policy names.
#[derive(Debug, Clone)]
pub(super) struct Gathered {
    /// The caller's working directory, symlinks resolved.
    pub(super) cwd: PathBuf,
    /// The caller's home, lexically normalized.
    pub(super) home: PathBuf,
    pub(super) uid: u32,
    pub(super) gid: u32,
    /// The caller's environment: the only source of passed variables.
    pub(super) env: BTreeMap<String, String>,
    pub(super) corral_exe: PathBuf,
    pub(super) user_config: Option<PathBuf>,
    /// corral's own config and state directories (user config, trust store, audit logs).
    pub(super) corral_dirs: Vec<PathBuf>,
    /// The profile named on the command line, and the command after `--`.
    pub(super) profile_arg: Option<String>,
    pub(super) command_arg: Vec<String>,
    /// `--policy FILE` named the project's layer: the user chose it, it needs no trust.
    pub(super) policy_flag: bool,
    /// The project directory (symlinks resolved) and how it was chosen.
    pub(super) root: PathBuf,
    pub(super) source: ProjectSource,
    pub(super) layers: Layers,
    pub(super) profile: Profile,
    pub(super) disk: Disk,
}

/// The policy's layers above the defaults and the profile, each validated and located.
#[derive(Debug, Clone, Default)]
pub(super) struct Layers {
    pub(super) user: Layer,
    /// The project's `corral.toml`, or the `--policy` file.
    pub(super) project: Option<ProjectFile>,
    pub(super) flags: Layer,
    /// What the policy files grant as they were read, one `FILE:LINE:COL: what` line each.
    pub(super) grants: Vec<String>,
    /// The policy files read, lowest precedence first.
    pub(super) sources: Vec<PathBuf>,
}

/// The project's layer and the file it was read from.
#[derive(Debug, Clone)]
pub(super) struct ProjectFile {
    pub(super) path: PathBuf,
    pub(super) text: String,
    pub(super) layer: Layer,
}

/// What the disk says about the paths the merged policy names.
#[derive(Debug, Clone, Default)]
pub(super) struct Disk {
    /// Language toolchains under the home (none for a container engine: its image brings its
    /// own, built for its own libc), and their PATH directories.
    pub(super) toolchains: Vec<Toolchain>,
    pub(super) toolchain_path: Vec<PathBuf>,
    /// The command as found on the caller's PATH, what it needs bound and on PATH.
    pub(super) command: ResolvedCommand,
    /// The project's files `filesystem.hide` matches.
    pub(super) masked: Vec<PathBuf>,
    /// Each bound host path with its symlinks resolved; a path that does not resolve is absent
    /// (it is bound as written).
    pub(super) canonical: BTreeMap<PathBuf, PathBuf>,
    /// Where the project file's bind paths really lead.
    pub(super) real: RealPaths,
    /// Where the jail sees each policy file and corral directory below a read-write bind (the
    /// project's, the policy's): as written and where a symlink on the way really puts it.
    pub(super) rw_views: BTreeMap<PathBuf, Vec<PathBuf>>,
}

impl Gathered {
    /// The project's own policy file, present or not.
    pub(super) fn project_policy_path(&self) -> PathBuf {
        self.root.join("corral.toml")
    }

    /// Where the jail sees `p` through a read-write bind (none when it does not).
    pub(super) fn rw_views(&self, p: &Path) -> &[PathBuf] {
        self.disk.rw_views.get(p).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// Gather everything [`build`](super::build) needs for `req`. With `--scratch` the project is a
/// fresh directory, created here or only named (`scratch`); nothing else is written.
pub(super) fn gather(req: &Request, scratch: Scratch) -> Result<Gathered, PolicyError> {
    let cwd = req.cwd.canonicalize().map_err(|source| PolicyError::Io {
        what: "cannot resolve the working directory",
        path: req.cwd.clone(),
        source,
    })?;
    let home = normalize(&req.home);
    let corral_dirs = vec![
        crate::trust::config_dir(&req.env, &home),
        crate::trust::state_dir(&req.env, &home),
    ];
    let (root, source) = choose_project(req, scratch, &cwd, &home, &corral_dirs)?;
    let ctx = PathCtx {
        home: &home,
        project: &root,
        corral_dirs: &corral_dirs,
    };
    let layers = read_layers(req, &cwd, &ctx, source == ProjectSource::Scratch)?;
    let profile = crate::profile::profile(&profile_name(req.profile.as_ref(), &layers))?;
    let mut g = Gathered {
        cwd,
        home,
        uid: req.uid,
        gid: req.gid,
        env: req.env.clone(),
        corral_exe: req.corral_exe.clone(),
        user_config: req.user_config.clone(),
        corral_dirs,
        profile_arg: req.profile.clone(),
        command_arg: req.command.clone(),
        policy_flag: req.flags.policy.is_some(),
        root,
        source,
        layers,
        profile,
        disk: Disk::default(),
    };
    g.disk = look(&g)?;
    Ok(g)
}

/// The profile: named on the command line, else by the project's file, else by the user
/// config, else `shell`.
fn profile_name(arg: Option<&String>, layers: &Layers) -> String {
    let project = layers
        .project
        .as_ref()
        .and_then(|p| p.layer.profile.as_ref());
    arg.cloned()
        .or_else(|| project.map(|(n, _)| n.clone()))
        .or_else(|| layers.user.profile.as_ref().map(|(n, _)| n.clone()))
        .unwrap_or_else(|| "shell".to_string())
}

/// Read the user config, the project's `corral.toml` (or `--policy FILE`; none for a scratch
/// project unless named) and the flags.
fn read_layers(
    req: &Request,
    cwd: &Path,
    ctx: &PathCtx,
    scratch: bool,
) -> Result<Layers, PolicyError> {
    let user_config = req.user_config.as_deref();
    let mut layers = Layers::default();
    if let Some(uc) = user_config.filter(|p| p.exists()) {
        let (pf, text) = load_policy(uc)?;
        let grants = &mut layers.grants;
        layers.user = file_layer(uc, &text, pf, Trust::User, ctx, user_config, grants)?;
        layers.sources.push(uc.to_path_buf());
    }
    let own = ctx.project.join("corral.toml");
    let project_file = match &req.flags.policy {
        Some(p) => Some(normalize(&cwd.join(p))),
        None if !scratch && own.exists() => Some(own),
        None => None,
    };
    if let Some(path) = project_file {
        let (pf, text) = load_policy(&path)?;
        let grants = &mut layers.grants;
        let layer = file_layer(&path, &text, pf, Trust::Project, ctx, user_config, grants)?;
        layers.sources.push(path.clone());
        layers.project = Some(ProjectFile { path, text, layer });
    }
    layers.flags = flags_layer(&req.flags, cwd, ctx.home)?;
    Ok(layers)
}

/// Look at the disk for what the merged policy names.
fn look(g: &Gathered) -> Result<Disk, PolicyError> {
    let Policy { merged: m, .. } = build::merge(g);
    let toolchains = match m.engine.unwrap_or(DEFAULT_ENGINE) {
        Engine::Native | Engine::Auto => crate::toolchain::find(&g.home, &g.env),
        Engine::Podman | Engine::Docker | Engine::Kube => Vec::new(),
    };
    let argv = build::argv(g, &m);
    let command = resolve_command(&argv, &g.env, &g.cwd, &g.home, &toolchains);
    let hide: Vec<String> = build::dedup(m.hide.iter().map(|(h, _)| h.clone()));
    let mut disk = Disk {
        toolchain_path: crate::toolchain::path_dirs(&toolchains, &g.env),
        toolchains,
        command,
        ..Disk::default()
    };
    if let Some(pf) = &g.layers.project {
        let l = &pf.layer;
        let binds = [
            &l.read_only,
            &l.read_write,
            &l.exec_read_only,
            &l.exec_read_write,
        ];
        for (p, _) in binds.into_iter().flatten() {
            disk.real.record(p);
        }
    }
    disk.rw_views = rw_views_of(g, &m);
    // The mounts as built from what is gathered so far name every bound path.
    let seen = Gathered {
        disk: disk.clone(),
        ..g.clone()
    };
    let sources = bind_sources(&seen, &m);
    for source in &sources {
        if let Ok(real) = source.canonicalize() {
            disk.canonical.insert(source.clone(), real);
        }
    }
    // The `hide` search, over the project's tree index (crate::tree): kept between runs only
    // where nothing the jail binds reaches it. The update is stashed for the git guard's
    // snapshot at the start of the run.
    let reach: Vec<PathBuf> = std::iter::once(g.root.clone()).chain(sources).collect();
    disk.masked = crate::tree::update_and_stash(&g.root, &reach, &hide).masked(&hide)?;
    Ok(disk)
}

/// Where the jail sees each policy file and corral directory through a read-write bind.
fn rw_views_of(g: &Gathered, m: &Layer) -> BTreeMap<PathBuf, Vec<PathBuf>> {
    let rw_roots: Vec<&PathBuf> = std::iter::once(&g.root)
        .chain(m.read_write.iter().map(|(p, _)| p))
        .chain(m.exec_read_write.iter().map(|(p, _)| p))
        .collect();
    let project_file = g.layers.project.as_ref().map(|p| &p.path);
    g.user_config
        .iter()
        .chain(project_file)
        .chain(&g.corral_dirs)
        .map(|p| (p.clone(), rw_views(p, &rw_roots)))
        .collect()
}

/// Where the jail sees the host path `p` inside a read-write bind of `rw_roots` (binds keep
/// their path): `p` itself when written below one, and its real location, spelled below the
/// root that really holds it, when a symlink on the way leads into one.
fn rw_views(p: &Path, rw_roots: &[&PathBuf]) -> Vec<PathBuf> {
    let real = real_path(p);
    let mut out = Vec::new();
    for r in rw_roots {
        if p.starts_with(r) {
            out.push(p.to_path_buf());
        }
        if let Ok(rel) = real.strip_prefix(real_path(r)) {
            out.push(if rel.as_os_str().is_empty() {
                r.to_path_buf()
            } else {
                r.join(rel)
            });
        }
    }
    out.sort();
    out.dedup();
    out
}
