//! Harness configuration files the jail may write but whose code it may not change.
//!
//! Some harnesses write their configuration at run time for ordinary reasons (Claude Code's
//! `~/.claude.json` on every start, Codex's `config.toml` when a model is chosen), so those files
//! cannot be read-only in the jail; yet some of their keys are code a host run of the harness
//! starts: MCP server commands, hooks, plugins, extension paths (`Plan::guarded`, from the
//! profile's `[[guard]]`). corral reads each file before the jail starts and, once the jail has
//! ended, puts back every code key the run changed, keeping the file as the jail left it under
//! corral's state directory (`quarantine/JAILID/`) and saying so on stderr and in the audit log.
//! A file it cannot read as JSON/TOML afterwards, or that is no regular file any more, is put
//! back whole. Files are reached from their directory's descriptor without following a link at
//! their name (a jail can put a link there; corral never writes through it) and rewritten in
//! place, so a bind of the same file in another running jail stays the file.
//!
//! Paths whose code the harness never needs to write at run time (pi's `extensions/`, Claude
//! Code's `settings.json`) are not here: they are read-only in the jail (`Plan::protected`).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use corral_policy::plan::{Access, ConfigFormat, GuardedFile, GuardedKeys, MountKind, Plan};
use nix::fcntl::{OFlag, open, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstat};
use serde_json::Value;

/// Larger files are not parsed: put back whole when they changed.
const MAX_BYTES: u64 = 64 << 20;

/// What the guarded files were when the jail started.
pub struct Snapshot {
    files: Vec<GuardedFileSnapshot>,
}

/// One guarded file as it was when the jail started, and where it is on the host.
struct GuardedFileSnapshot {
    file: GuardedFile,
    /// The directory holding it on the host (O_PATH), and its name there.
    dir: OwnedFd,
    name: OsString,
    /// Where it is on the host, for messages.
    shown: PathBuf,
    before: Content,
}

#[derive(Debug, Clone, PartialEq)]
enum Content {
    Absent,
    Bytes(Vec<u8>),
    /// A directory, a device, a file too large: not read. What it is (its type, inode, size
    /// and change time), so that a replaced or changed one is noticed.
    Other(String),
    /// A symbolic link, and where it points.
    Link(PathBuf),
}

/// Record the guarded files of `plan` (before the jail starts). A file whose directory is not
/// bound into this jail is not guarded: the jail cannot reach it.
pub fn snapshot(plan: &Plan) -> Snapshot {
    let mut files = Vec::new();
    for g in &plan.guarded {
        let Some((dir, name)) = host_location(plan, &g.path) else {
            continue;
        };
        let Ok(dir_fd) = open(
            &dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let before = read(&dir_fd, &name);
        files.push(GuardedFileSnapshot {
            file: g.clone(),
            dir: dir_fd,
            shown: dir.join(&name),
            name,
            before,
        });
    }
    Snapshot { files }
}

/// The host directory and name of a guarded path: a state file's bind source, or the file of
/// that name in a state directory's bind source (binds are given with links resolved).
fn host_location(plan: &Plan, path: &Path) -> Option<(PathBuf, OsString)> {
    let rw = |target: &Path| {
        plan.mounts
            .iter()
            .find(|m| m.kind == MountKind::Bind(Access::Rw) && m.target == target)
    };
    if let Some(m) = rw(path) {
        let dir = m.source.parent()?.to_path_buf();
        return Some((dir, m.source.file_name()?.to_os_string()));
    }
    let m = rw(path.parent()?)?;
    Some((m.source.clone(), path.file_name()?.to_os_string()))
}

/// Read `dir`/`name` without following a link at the name.
fn read(dir: &OwnedFd, name: &OsString) -> Content {
    use nix::sys::stat::{FileStat, fstatat};
    let other = |st: Option<FileStat>| {
        if let Ok(to) = nix::fcntl::readlinkat(dir, name.as_os_str()) {
            return Content::Link(PathBuf::from(to));
        }
        let st = st.or_else(|| {
            fstatat(
                dir,
                name.as_os_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .ok()
        });
        Content::Other(match st {
            Some(st) => format!(
                "mode {:o}, inode {}, {} bytes, changed {}.{}",
                st.st_mode, st.st_ino, st.st_size, st.st_ctime, st.st_ctime_nsec
            ),
            None => "unreadable".into(),
        })
    };
    let fd = match openat(
        dir,
        name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Content::Absent,
        Err(_) => return other(None),
    };
    match fstat(&fd) {
        Ok(st)
            if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
                && (st.st_size as u64) <= MAX_BYTES => {}
        Ok(st) => return other(Some(st)),
        Err(_) => return other(None),
    }
    let mut bytes = Vec::new();
    match std::fs::File::from(fd)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
    {
        Ok(_) if bytes.len() as u64 <= MAX_BYTES => Content::Bytes(bytes),
        _ => other(None),
    }
}

/// After the jail has ended (no process of it can write any more): put back every code key a
/// guarded file lost or gained during the run. One message per file, for stderr and the audit
/// log, each with the fix.
pub fn check(snapshot: Snapshot, jail_id: &str) -> Vec<String> {
    let keep = corral_audit::state_dir()
        .map(|d| d.join("quarantine").join(jail_id))
        .ok();
    snapshot
        .files
        .into_iter()
        .filter_map(|t| check_one(t, jail_id, keep.as_deref()))
        .collect()
}

fn check_one(t: GuardedFileSnapshot, jail_id: &str, keep: Option<&Path>) -> Option<String> {
    let after = read(&t.dir, &t.name);
    if after == t.before {
        return None;
    }
    let verdict = match (&t.before, &after) {
        (_, Content::Other(what)) => Verdict::Whole(format!("it is {what} now")),
        (_, Content::Link(to)) => Verdict::Whole(format!("it is a link to {} now", to.display())),
        (before, Content::Absent) => match code_changes(&t.file, before, &after) {
            Ok(keys) if keys.is_empty() => return None,
            Ok(keys) => Verdict::Whole(format!(
                "its code keys went with it ({})",
                shown_keys(&keys)
            )),
            Err(why) => Verdict::Whole(why),
        },
        (before, Content::Bytes(now)) => match code_changes(&t.file, before, &after) {
            Ok(keys) if keys.is_empty() => return None,
            Ok(keys) => match repair(&t.file, before, now, &keys) {
                Some(fixed) => Verdict::Keys(keys, fixed),
                None => Verdict::Whole(format!("it changed {}", shown_keys(&keys))),
            },
            Err(why) => Verdict::Whole(why),
        },
    };
    Some(apply(&t, after, verdict, jail_id, keep))
}

enum Verdict {
    /// Put these keys back: the file becomes these bytes.
    Keys(Vec<Vec<String>>, Vec<u8>),
    /// Put the whole file back as it was, for this reason.
    Whole(String),
}

/// Carry out a verdict and say what was done.
fn apply(
    t: &GuardedFileSnapshot,
    after: Content,
    verdict: Verdict,
    jail_id: &str,
    keep: Option<&Path>,
) -> String {
    let fix = "harness code a host run would load; to let a run change it: corral run \
               --allow-harness-config";
    let kept = match &after {
        Content::Bytes(b) => keep_copy(keep, &t.shown, b),
        Content::Other(_) | Content::Link(_) => move_aside(t, jail_id),
        Content::Absent => Ok("the jail removed it".into()),
    };
    let kept = kept.unwrap_or_else(|e| format!("the jail's version could not be kept: {e}"));
    let (what, result) = match verdict {
        Verdict::Keys(keys, fixed) => (
            format!("put back {} in {}", shown_keys(&keys), t.shown.display()),
            write_back(t, &Content::Bytes(fixed)),
        ),
        Verdict::Whole(why) => (
            format!(
                "put back {} as it was before the run ({why})",
                t.shown.display()
            ),
            write_back(t, &t.before),
        ),
    };
    match result {
        Ok(()) => format!("{what}: {fix}; {kept}"),
        Err(e) => format!(
            "the jail changed harness code in {} and corral could not put it back ({e}): check it \
             before you run the harness outside corral; {kept}",
            t.shown.display()
        ),
    }
}

fn shown_keys(keys: &[Vec<String>]) -> String {
    keys.iter()
        .map(|k| {
            if k.is_empty() {
                "the whole file".to_string()
            } else {
                k.join(".")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keep the jail's version of a file under corral's state directory, out of every jail's reach.
fn keep_copy(keep: Option<&Path>, shown: &Path, bytes: &[u8]) -> std::io::Result<String> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = keep.ok_or_else(|| std::io::Error::other("no state directory (HOME unset)"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let name: String = shown
        .to_string_lossy()
        .trim_start_matches('/')
        .replace('/', "%");
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?
        .write_all(bytes)?;
    Ok(format!("the jail's version is in {}", path.display()))
}

/// Move what the jail left at the name (a link, a directory) aside in its directory.
fn move_aside(t: &GuardedFileSnapshot, jail_id: &str) -> std::io::Result<String> {
    let mut aside = t.name.clone();
    aside.push(format!(".corral-quarantine-{jail_id}"));
    renameat(&t.dir, t.name.as_os_str(), &t.dir, aside.as_os_str())?;
    Ok(format!(
        "what the jail left there is moved aside to {}",
        t.shown.with_file_name(&aside).display()
    ))
}

/// Make the file `content`: rewritten in place when it is a regular file (never through a
/// link), created when it is gone, removed when it was absent before the run.
fn write_back(t: &GuardedFileSnapshot, content: &Content) -> std::io::Result<()> {
    let bytes = match content {
        Content::Bytes(b) => b,
        Content::Absent => {
            return match nix::unistd::unlinkat(
                &t.dir,
                t.name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ) {
                Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        Content::Link(to) => {
            // What the jail left there was kept already (a copy, or moved aside).
            match nix::unistd::unlinkat(
                &t.dir,
                t.name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ) {
                Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
            return nix::unistd::symlinkat(to.as_path(), &t.dir, t.name.as_os_str())
                .map_err(Into::into);
        }
        Content::Other(what) => {
            return Err(std::io::Error::other(format!(
                "it was {what} before the run, which corral does not recreate"
            )));
        }
    };
    let fd = openat(
        &t.dir,
        t.name.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    let st = fstat(&fd)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(std::io::Error::other("it is no regular file"));
    }
    let mut f = std::fs::File::from(fd);
    f.set_len(0)?;
    f.write_all(bytes)?;
    f.sync_data()
}

/// The code key paths whose value differs between two versions of a guarded file (the empty
/// path: the whole file). An error says why the versions cannot be compared key by key.
fn code_changes(
    g: &GuardedFile,
    before: &Content,
    after: &Content,
) -> Result<Vec<Vec<String>>, String> {
    let parse = |c: &Content, when: &str| -> Result<Option<Value>, String> {
        match c {
            Content::Absent => Ok(None),
            Content::Bytes(b) => parse(g.format, b)
                .map(Some)
                .map_err(|e| format!("it could not be read {when} the run: {e}")),
            Content::Other(what) => Err(format!("it was {what} {when} the run")),
            Content::Link(to) => Err(format!("it was a link to {} {when} the run", to.display())),
        }
    };
    let b = parse(before, "before")?;
    let a = parse(after, "after")?;
    let mut out = Vec::new();
    diff(g, b.as_ref(), a.as_ref(), &mut Vec::new(), &mut out);
    Ok(out)
}

fn parse(format: ConfigFormat, bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    match format {
        ConfigFormat::Json => serde_json::from_str(text).map_err(|e| e.to_string()),
        ConfigFormat::Toml => toml::from_str(text).map_err(|e| e.to_string()),
    }
}

/// How a key path of a guarded file counts.
#[derive(Debug, PartialEq)]
enum Class {
    /// Code: any change to it (or below it) counts.
    Code,
    /// Data: no change to it counts.
    Data,
    /// Code may lie below it: compare key by key.
    Inside,
    /// A string starting with `!` there is a shell command.
    Command,
}

fn matches(pattern: &[&str], path: &[String]) -> bool {
    pattern.len() <= path.len() && pattern.iter().zip(path).all(|(p, k)| *p == "*" || p == k)
}

fn split(p: &str) -> Vec<&str> {
    p.split('.').collect()
}

/// A value as a table: `Some(None)` when absent, `None` when it is no table.
fn object(v: Option<&Value>) -> Option<Option<&serde_json::Map<String, Value>>> {
    match v {
        None => Some(None),
        Some(Value::Object(m)) => Some(Some(m)),
        Some(_) => None,
    }
}

fn classify(g: &GuardedFile, path: &[String]) -> Class {
    let commands: Vec<Vec<&str>> = g.commands.iter().map(|p| split(p)).collect();
    if commands
        .iter()
        .any(|c| c.len() == path.len() && matches(c, path))
    {
        return Class::Command;
    }
    let below = |pats: &[Vec<&str>]| {
        pats.iter()
            .any(|p| p.len() > path.len() && matches(&p[..path.len()], path))
    };
    match &g.keys {
        GuardedKeys::Code(code) => {
            let code: Vec<Vec<&str>> = code.iter().map(|p| split(p)).collect();
            if code.iter().any(|c| matches(c, path)) {
                Class::Code
            } else if below(&code) || below(&commands) {
                Class::Inside
            } else {
                Class::Data
            }
        }
        GuardedKeys::AllBut(data) => {
            let data: Vec<Vec<&str>> = data.iter().map(|p| split(p)).collect();
            if data.iter().any(|d| matches(d, path)) {
                Class::Data
            } else if below(&data) || below(&commands) {
                Class::Inside
            } else {
                Class::Code
            }
        }
    }
}

/// An empty value (`{}`, `[]`, `false`, `null`, `""`) counts as absent: harnesses write such
/// defaults for every new project (Claude Code's `"mcpServers": {}`, `"allowedTools": []`),
/// and none of them runs anything.
fn meaningful(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| match v {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        Value::Bool(true) | Value::Number(_) => true,
    })
}

/// Collect in `out` the code key paths at or below `path` whose values differ.
fn diff(
    g: &GuardedFile,
    before: Option<&Value>,
    after: Option<&Value>,
    path: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
) {
    let (before, after) = (meaningful(before), meaningful(after));
    if before == after {
        return;
    }
    let is_command = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .is_some_and(|s| s.starts_with('!'))
    };
    match classify(g, path) {
        Class::Data => {}
        Class::Code => out.push(path.clone()),
        Class::Command => {
            if is_command(before) || is_command(after) {
                out.push(path.clone());
            }
        }
        Class::Inside => {
            let (Some(b), Some(a)) = (object(before), object(after)) else {
                // A value where code keys belong is no table: the whole value counts.
                out.push(path.clone());
                return;
            };
            let mut keys: Vec<&String> = b
                .iter()
                .flat_map(|m| m.keys())
                .chain(a.iter().flat_map(|m| m.keys()))
                .collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                path.push(k.clone());
                diff(
                    g,
                    b.and_then(|m| m.get(k)),
                    a.and_then(|m| m.get(k)),
                    path,
                    out,
                );
                path.pop();
            }
        }
    }
}

/// `after` with the values at `keys` put back as they are in `before`; `None` when that
/// cannot be done key by key (then the whole file is put back).
fn repair(
    g: &GuardedFile,
    before: &Content,
    after: &[u8],
    keys: &[Vec<String>],
) -> Option<Vec<u8>> {
    if keys.iter().any(Vec::is_empty) {
        return None;
    }
    let before = match before {
        Content::Bytes(b) => Some(std::str::from_utf8(b).ok()?),
        Content::Absent => None,
        Content::Other(_) | Content::Link(_) => return None,
    };
    let after = std::str::from_utf8(after).ok()?;
    match g.format {
        ConfigFormat::Json => {
            let old: Value = match before {
                Some(b) => serde_json::from_str(b).ok()?,
                None => Value::Object(Default::default()),
            };
            let mut new: Value = serde_json::from_str(after).ok()?;
            for k in keys {
                json_set(&mut new, k, json_get(&old, k).cloned())?;
            }
            let mut text = serde_json::to_string_pretty(&new).ok()?;
            text.push('\n');
            Some(text.into_bytes())
        }
        ConfigFormat::Toml => {
            let old: toml_edit::DocumentMut = before.unwrap_or("").parse().ok()?;
            let mut new: toml_edit::DocumentMut = after.parse().ok()?;
            for k in keys {
                let value = toml_get(old.as_item(), k).cloned();
                toml_set(new.as_item_mut(), k, value)?;
            }
            Some(new.to_string().into_bytes())
        }
    }
}

fn json_get<'v>(v: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, k| v.as_object()?.get(k))
}

/// Set (or with `None` remove) the value at `path`, making the tables on the way.
fn json_set(v: &mut Value, path: &[String], value: Option<Value>) -> Option<()> {
    let (last, parents) = path.split_last()?;
    let mut at = v;
    for k in parents {
        let map = at.as_object_mut()?;
        at = map
            .entry(k.clone())
            .or_insert_with(|| Value::Object(Default::default()));
    }
    let map = at.as_object_mut()?;
    match value {
        Some(v) => {
            map.insert(last.clone(), v);
        }
        None => {
            map.remove(last);
        }
    }
    Some(())
}

fn toml_get<'i>(item: &'i toml_edit::Item, path: &[String]) -> Option<&'i toml_edit::Item> {
    path.iter().try_fold(item, |i, k| i.as_table_like()?.get(k))
}

fn toml_set(
    item: &mut toml_edit::Item,
    path: &[String],
    value: Option<toml_edit::Item>,
) -> Option<()> {
    let (last, parents) = path.split_last()?;
    let mut at = item;
    for k in parents {
        let table = at.as_table_like_mut()?;
        if table.get(k).is_none() {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            table.insert(k, toml_edit::Item::Table(t));
        }
        at = table.get_mut(k)?;
    }
    let table = at.as_table_like_mut()?;
    match value {
        Some(v) => {
            table.insert(last, v);
        }
        None => {
            table.remove(last);
        }
    }
    Some(())
}

#[cfg(test)]
mod tests;
