//! `corral state diff` and `apply`: what jailed runs changed in corral's layer against the
//! host's state, and copying what the user picks to the host.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use corral_policy::plan::{ConfigFormat, GuardedKeys, HarnessState, StateLayer};
use nix::fcntl::OFlag;
use serde_json::Value;

use super::fsops::{self, Kind};

/// One difference between the layer and the host's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The host path it concerns.
    pub path: PathBuf,
    pub kind: ChangeKind,
    /// Why it is code (a code path of the profile, the code keys that differ), if it is.
    pub code: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Changed,
    Deleted,
}

impl ChangeKind {
    pub fn word(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Changed => "changed",
            ChangeKind::Deleted => "deleted",
        }
    }
}

/// Files compared whole up to this size; larger ones by size only.
const MAX_COMPARE: u64 = 64 << 20;

/// What jailed runs changed against the host's state: each state directory's layer (an
/// overlay's upper: whiteouts are deletions, an opaque directory hides what the host has
/// below it; docker's copy: compared both ways) and each state file's copy.
pub fn diff(state: &HarnessState) -> anyhow::Result<Vec<Change>> {
    let mut out = Vec::new();
    for d in &state.dirs {
        let host = open_opt(&d.host)?;
        match &d.layer {
            StateLayer::Overlay { upper, .. } => {
                if let Some(up) = open_opt(upper)? {
                    walk_upper(&up, host.as_ref(), &d.host, &mut out)?;
                }
            }
            StateLayer::Copy { dir } => {
                if let Some(copy) = open_opt(dir)? {
                    walk_copy(&copy, host.as_ref(), &d.host, &mut out)?;
                }
            }
        }
    }
    for f in &state.files {
        let Some(copy) = read_opt(&f.copy)? else {
            continue;
        };
        let host = read_opt(&f.host)?;
        // Compared as JSON when both are (the copy with the host's real values back in place
        // of its placeholders), else byte for byte.
        let same_json = |h: &[u8]| {
            let ours = super::creds::with_real_values(state, &f.host, &copy);
            let theirs: Option<Value> = serde_json::from_slice(h).ok();
            ours.is_some() && ours == theirs
        };
        let kind = match &host {
            None if copy.is_empty() => continue,
            None => ChangeKind::Added,
            Some(h) if *h == copy || same_json(h) => continue,
            Some(_) => ChangeKind::Changed,
        };
        out.push(Change {
            path: f.host.clone(),
            kind,
            code: None,
        });
    }
    // The sign-in files are the host's (the jail saw placeholders bound over them): what a
    // layer holds at their names is never a change to take.
    out.retain(|c| !state.signin_files.contains(&c.path));
    for c in &mut out {
        c.code = code_reason(state, &c.path);
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn open_opt(p: &Path) -> anyhow::Result<Option<std::os::fd::OwnedFd>> {
    match fsops::open_root(p) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot open {}", p.display())),
    }
}

/// A file's bytes, not followed (`None` when absent).
fn read_opt(p: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
        return Ok(None);
    };
    let Some(d) = open_opt(dir)? else {
        return Ok(None);
    };
    match fsops::stat_at(&d, name)? {
        None => Ok(None),
        Some(st) if fsops::kind_of(&st) == Kind::File => Ok(Some(
            fsops::read_file(&d, name, MAX_COMPARE)
                .with_context(|| format!("cannot read {}", p.display()))?,
        )),
        Some(_) => bail!(
            "{} is not a regular file; corral does not follow it",
            p.display()
        ),
    }
}

fn sub(dir: &std::os::fd::OwnedFd, name: &OsStr) -> anyhow::Result<std::os::fd::OwnedFd> {
    Ok(fsops::open_beneath(
        dir,
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
    )?)
}

/// The same entry in the layer and on the host: same kind and, for files, same bytes; for
/// links, same target.
fn same(
    a: &std::os::fd::OwnedFd,
    b: &std::os::fd::OwnedFd,
    name: &OsStr,
    ka: Kind,
    kb: Kind,
) -> anyhow::Result<bool> {
    if ka != kb {
        return Ok(false);
    }
    Ok(match ka {
        Kind::File => {
            fsops::read_file(a, name, MAX_COMPARE)? == fsops::read_file(b, name, MAX_COMPARE)?
        }
        Kind::Link => {
            use std::os::fd::AsFd;
            nix::fcntl::readlinkat(a.as_fd(), name)? == nix::fcntl::readlinkat(b.as_fd(), name)?
        }
        Kind::Dir | Kind::Whiteout | Kind::Other => true,
    })
}

fn walk_upper(
    up: &std::os::fd::OwnedFd,
    host: Option<&std::os::fd::OwnedFd>,
    at: &Path,
    out: &mut Vec<Change>,
) -> anyhow::Result<()> {
    for name in fsops::list(up)? {
        let Some(st) = fsops::stat_at(up, &name)? else {
            continue;
        };
        let path = at.join(&name);
        let k = fsops::kind_of(&st);
        let h = match host {
            Some(h) => fsops::stat_at(h, &name)?.map(|s| fsops::kind_of(&s)),
            None => None,
        };
        match (k, h) {
            (Kind::Whiteout, Some(_)) => out.push(Change {
                path,
                kind: ChangeKind::Deleted,
                code: None,
            }),
            (Kind::Whiteout, None) => {}
            (Kind::Dir, Some(Kind::Dir)) => {
                let u = sub(up, &name)?;
                let hd = sub(host.expect("a host entry"), &name)?;
                if fsops::is_opaque(&u) {
                    // What the host has below is hidden: each entry not in the layer is gone.
                    for n in fsops::list(&hd)? {
                        if fsops::stat_at(&u, &n)?.is_none() {
                            out.push(Change {
                                path: path.join(&n),
                                kind: ChangeKind::Deleted,
                                code: None,
                            });
                        }
                    }
                }
                walk_upper(&u, Some(&hd), &path, out)?;
            }
            (Kind::Dir, _) => {
                if h.is_some() {
                    out.push(Change {
                        path: path.clone(),
                        kind: ChangeKind::Changed,
                        code: None,
                    });
                }
                let u = sub(up, &name)?;
                walk_upper(&u, None, &path, out)?;
            }
            (_, None) => out.push(Change {
                path,
                kind: ChangeKind::Added,
                code: None,
            }),
            (k, Some(hk)) => {
                if !same(up, host.expect("a host entry"), &name, k, hk)? {
                    out.push(Change {
                        path,
                        kind: ChangeKind::Changed,
                        code: None,
                    });
                }
            }
        }
    }
    Ok(())
}

fn walk_copy(
    copy: &std::os::fd::OwnedFd,
    host: Option<&std::os::fd::OwnedFd>,
    at: &Path,
    out: &mut Vec<Change>,
) -> anyhow::Result<()> {
    let mut names = fsops::list(copy)?;
    if let Some(h) = host {
        for n in fsops::list(h)? {
            if fsops::stat_at(copy, &n)?.is_none() {
                names.push(n);
            }
        }
    }
    names.sort();
    for name in names {
        let path = at.join(&name);
        let c = fsops::stat_at(copy, &name)?.map(|s| fsops::kind_of(&s));
        let h = match host {
            Some(h) => fsops::stat_at(h, &name)?.map(|s| fsops::kind_of(&s)),
            None => None,
        };
        match (c, h) {
            // The copy never holds links or special files (seeding leaves them out).
            (None, Some(Kind::Link | Kind::Other | Kind::Whiteout)) => {}
            (None, Some(_)) => out.push(Change {
                path,
                kind: ChangeKind::Deleted,
                code: None,
            }),
            (None, None) => {}
            (Some(Kind::Dir), hk) => {
                if hk.is_some_and(|k| k != Kind::Dir) {
                    out.push(Change {
                        path: path.clone(),
                        kind: ChangeKind::Changed,
                        code: None,
                    });
                }
                let hd = match (hk, host) {
                    (Some(Kind::Dir), Some(h)) => Some(sub(h, &name)?),
                    _ => None,
                };
                walk_copy(&sub(copy, &name)?, hd.as_ref(), &path, out)?;
            }
            (Some(_), None) => out.push(Change {
                path,
                kind: ChangeKind::Added,
                code: None,
            }),
            (Some(ck), Some(hk)) => {
                if !same(copy, host.expect("a host entry"), &name, ck, hk)? {
                    out.push(Change {
                        path,
                        kind: ChangeKind::Changed,
                        code: None,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Why a change at `path` is code: it is (or is below, or holds) one of the profile's code
/// paths, or it is a file with code keys and those keys differ from the host's.
fn code_reason(state: &HarnessState, path: &Path) -> Option<String> {
    if let Some(c) = state
        .code_paths
        .iter()
        .find(|c| path.starts_with(c) || c.starts_with(path))
    {
        return Some(format!("code: {}", c.display()));
    }
    let ck = state.code_keys.iter().find(|k| k.path == path)?;
    let layer = layer_path(state, path)?;
    let parse = |p: &Path| -> Option<Value> {
        let bytes = read_opt(p).ok().flatten().unwrap_or_default();
        let text = String::from_utf8(bytes).ok()?;
        if text.trim().is_empty() {
            return Some(Value::Object(Default::default()));
        }
        match ck.format {
            ConfigFormat::Json => serde_json::from_str(&text).ok(),
            ConfigFormat::Toml => toml::from_str::<toml::Value>(&text)
                .ok()
                .and_then(|v| serde_json::to_value(v).ok()),
        }
    };
    let new = match (ck.format, read_opt(&layer).ok().flatten()) {
        (ConfigFormat::Json, Some(bytes)) if state.files.iter().any(|f| f.host == path) => {
            super::creds::with_real_values(state, path, &bytes)
        }
        _ => parse(&layer),
    };
    let (Some(new), Some(old)) = (new, parse(path)) else {
        return Some("code keys: the file does not parse; review it whole".into());
    };
    let mut differing = code_keys_differing(&ck.keys, &old, &new);
    differing.extend(commands_differing(&ck.commands, &old, &new));
    (!differing.is_empty()).then(|| format!("code keys: {}", differing.join(", ")))
}

/// Where the layer holds the entry the jail sees at host path `path`.
pub fn layer_path(state: &HarnessState, path: &Path) -> Option<PathBuf> {
    if let Some(f) = state.files.iter().find(|f| f.host == path) {
        return Some(f.copy.clone());
    }
    let d = state
        .dirs
        .iter()
        .filter(|d| path.starts_with(&d.host) && path != d.host)
        .max_by_key(|d| d.host.components().count())?;
    let rel = path.strip_prefix(&d.host).ok()?;
    Some(match &d.layer {
        StateLayer::Overlay { upper, .. } => upper.join(rel),
        StateLayer::Copy { dir } => dir.join(rel),
    })
}

/// The code key paths (as the profile names them, `*` for any name) whose values differ.
fn code_keys_differing(keys: &GuardedKeys, old: &Value, new: &Value) -> Vec<String> {
    match keys {
        GuardedKeys::Code(paths) => paths
            .iter()
            .filter(|p| {
                let parts: Vec<&str> = p.split('.').collect();
                collect(old, &parts) != collect(new, &parts)
            })
            .cloned()
            .collect(),
        GuardedKeys::AllBut(data) => {
            let strip = |v: &Value| {
                let mut v = v.clone();
                for d in data {
                    // A dotted name (`security.auth`) takes out that key alone, not its whole
                    // section (the rest of `security` is code).
                    let parts: Vec<&str> = d.split('.').collect();
                    let Some((last, parents)) = parts.split_last() else {
                        continue;
                    };
                    let mut at = Some(&mut v);
                    for p in parents {
                        at = at.and_then(|a| a.get_mut(*p));
                    }
                    if let Some(Value::Object(m)) = at {
                        m.remove(*last);
                    }
                }
                v
            };
            if strip(old) == strip(new) {
                Vec::new()
            } else {
                vec![format!("every key but {}", data.join(", "))]
            }
        }
    }
}

/// The key paths (as the profile names them) whose values the harness runs as a shell command
/// when they start with `!`, where such a command differs from the host's.
fn commands_differing(paths: &[String], old: &Value, new: &Value) -> Vec<String> {
    let commands = |v: &Value, parts: &[&str]| -> Vec<(String, Value)> {
        collect(v, parts)
            .into_iter()
            .filter(|(_, val)| {
                val.as_str()
                    .is_some_and(|s| s.trim_start().starts_with('!'))
            })
            .collect()
    };
    paths
        .iter()
        .filter(|p| {
            let parts: Vec<&str> = p.split('.').collect();
            commands(old, &parts) != commands(new, &parts)
        })
        .map(|p| format!("{p} (a `!` command)"))
        .collect()
}

/// The values at a key path (`*` matching every name), with the names that led there.
fn collect(v: &Value, parts: &[&str]) -> Vec<(String, Value)> {
    let Some((first, rest)) = parts.split_first() else {
        return vec![(String::new(), v.clone())];
    };
    let Value::Object(m) = v else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, child) in m {
        if *first == "*" || k == first {
            for (p, val) in collect(child, rest) {
                out.push((format!("{k}.{p}"), val));
            }
        }
    }
    out
}

/// Copy `path` (a host path in the harness's state, as `diff` shows it) from the layer to the
/// host: a file or a directory tree is copied, a deletion is done, a state file's copy
/// replaces the host's file. No link is followed on either side: the layer's entry is opened
/// beneath the layer, the host's beneath its state directory (or the file's directory), each
/// component without following links, and links in the layer are not copied.
pub fn apply(state: &HarnessState, path: &Path) -> anyhow::Result<String> {
    if let Some(f) = state.signin_files.iter().find(|f| f.starts_with(path)) {
        // The jail saw a placeholder there; what a layer holds in its place (stale, or the
        // jail's own sign-in) never replaces the host's credentials.
        bail!(
            "{} is (or holds) the sign-in file {}, which corral never writes from its layer; \
             apply the other entries one by one",
            path.display(),
            f.display()
        );
    }
    if let Some(f) = state.files.iter().find(|f| f.host == path) {
        let bytes = read_opt(&f.copy)?
            .with_context(|| format!("corral's layer has no copy of {}", path.display()))?;
        // Never a placeholder over a credential the host has: its real value goes back in.
        let as_is: Option<Value> = serde_json::from_slice(&bytes).ok();
        let bytes = match super::creds::with_real_values(state, path, &bytes) {
            Some(v) if Some(&v) != as_is.as_ref() => serde_json::to_vec_pretty(&v)?,
            _ => bytes,
        };
        let (dir, name) = (
            f.host.parent().context("a state file has a directory")?,
            f.host.file_name().context("a state file has a name")?,
        );
        let d = fsops::open_root(dir).with_context(|| format!("cannot open {}", dir.display()))?;
        if let Some(st) = fsops::stat_at(&d, name)?
            && fsops::kind_of(&st) != Kind::File
        {
            bail!(
                "{} is not a regular file on the host; corral does not write through it",
                path.display()
            );
        }
        fsops::replace_file(&d, name, &bytes, 0o600)
            .with_context(|| format!("cannot write {}", path.display()))?;
        return Ok(format!("copied corral's {} to the host", path.display()));
    }
    let d = state
        .dirs
        .iter()
        .filter(|d| path.starts_with(&d.host) && path != d.host)
        .max_by_key(|d| d.host.components().count())
        .with_context(|| {
            format!(
                "{} is not in one of the harness's state directories or files",
                path.display()
            )
        })?;
    let rel = path.strip_prefix(&d.host).expect("checked above");
    let layer_root = match &d.layer {
        StateLayer::Overlay { upper, .. } => upper,
        StateLayer::Copy { dir } => dir,
    };
    let layer = fsops::open_root(layer_root)
        .with_context(|| format!("cannot open {}", layer_root.display()))?;
    let host =
        fsops::open_root(&d.host).with_context(|| format!("cannot open {}", d.host.display()))?;
    let refuse_link = |e: std::io::Error, side: &str| -> anyhow::Error {
        if matches!(
            e.raw_os_error(),
            Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR)
        ) {
            anyhow::anyhow!(
                "{}: a symbolic link (or a file) is on its path in {side}; corral does not \
                 follow it",
                path.display()
            )
        } else {
            anyhow::Error::new(e).context(format!("{}: in {side}", path.display()))
        }
    };
    let (lparent, name) =
        fsops::parent_beneath(&layer, rel, false).map_err(|e| refuse_link(e, "corral's layer"))?;
    let lkind = fsops::stat_at(&lparent, name)?.map(|s| fsops::kind_of(&s));
    let deleted_in_copy = matches!(d.layer, StateLayer::Copy { .. }) && lkind.is_none();
    match lkind {
        Some(Kind::Link) => bail!(
            "{} is a symbolic link in corral's layer; corral does not copy links to the host \
             (make it on the host yourself if you want it)",
            path.display()
        ),
        Some(Kind::Other) => bail!(
            "{} is not a file or a directory in corral's layer",
            path.display()
        ),
        None if !deleted_in_copy => bail!("{} is not in corral's layer", path.display()),
        _ => {}
    }
    let (hparent, hname) =
        fsops::parent_beneath(&host, rel, true).map_err(|e| refuse_link(e, "the host's state"))?;
    match lkind {
        Some(Kind::Whiteout) | None => {
            fsops::remove_at(&hparent, hname)
                .with_context(|| format!("cannot remove {}", path.display()))?;
            Ok(format!("deleted {} on the host", path.display()))
        }
        Some(Kind::File) => {
            let st = fsops::stat_at(&lparent, name)?.context("the layer's entry went away")?;
            let bytes = fsops::read_file(&lparent, name, super::MAX_COPY_BYTES)?;
            if let Some(h) = fsops::stat_at(&hparent, hname)?
                && fsops::kind_of(&h) == Kind::Dir
            {
                fsops::remove_at(&hparent, hname)?;
            }
            fsops::replace_file(&hparent, hname, &bytes, st.st_mode & 0o777)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(format!("copied {} to the host", path.display()))
        }
        Some(Kind::Dir) => {
            let src = fsops::open_beneath(
                &lparent,
                Path::new(name),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            )?;
            if let Some(h) = fsops::stat_at(&hparent, hname)?
                && fsops::kind_of(&h) != Kind::Dir
            {
                bail!(
                    "{} is not a directory on the host; corral does not replace it",
                    path.display()
                );
            }
            match nix::sys::stat::mkdirat(
                std::os::fd::AsFd::as_fd(&hparent),
                hname,
                nix::sys::stat::Mode::from_bits_truncate(0o700),
            ) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", path.display()));
                }
            }
            let dst = fsops::open_beneath(
                &hparent,
                Path::new(hname),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            )
            .map_err(|e| refuse_link(e, "the host's state"))?;
            let mut done = fsops::Copied::default();
            fsops::copy_tree(
                &src,
                &dst,
                fsops::CopyRules {
                    links: false,
                    max_bytes: super::MAX_COPY_BYTES,
                },
                &mut done,
            )
            .with_context(|| format!("cannot copy {} to the host", path.display()))?;
            let skipped = if done.skipped.is_empty() {
                String::new()
            } else {
                format!(
                    " (left out, links, deletions and special files: {})",
                    done.skipped
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            Ok(format!("copied {} to the host{skipped}", path.display()))
        }
        Some(Kind::Link | Kind::Other) => unreachable!("refused above"),
    }
}

/// Whether applying `path` would bring code to the host: for the question `apply` asks.
pub fn is_code(state: &HarnessState, path: &Path) -> Option<String> {
    code_reason(state, path).or_else(|| {
        state
            .code_keys
            .iter()
            .any(|k| k.path == path)
            .then(|| "a file with code keys".to_string())
    })
}
