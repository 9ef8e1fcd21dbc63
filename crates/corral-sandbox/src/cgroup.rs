//! Memory, CPU and process limits through a cgroup of the jail's own.
//!
//! Strategy, in order:
//! 1. cgroup v2, when this process's cgroup (from `/proc/self/cgroup`, `0::/PATH`) is writable
//!    by us (a delegated subtree: a systemd scope with `Delegate=yes`, or root) and offers the
//!    controllers needed (`cgroup.controllers`). A child `corral-<jailid>` is created, the
//!    controllers are enabled in the parent's `cgroup.subtree_control`, and `memory.max` (plus
//!    `memory.swap.max = 0`), `pids.max` and `cpu.max` are written. When the parent still holds
//!    processes (cgroup v2 forbids controllers there), corral first moves itself into a leaf
//!    `corral-self-<pid>` beside the jail's cgroup, as container runtimes do.
//! 2. cgroup v1, per controller, where the hierarchy of that controller is writable (as root,
//!    or where an administrator chowned a subtree): `<mount>/<our path>/corral-<jailid>` in the
//!    memory, pids and cpu hierarchies, with `memory.limit_in_bytes` (and
//!    `memory.memsw.limit_in_bytes` when swap accounting exists, so the limit cannot be escaped
//!    into swap), `pids.max`, `cpu.cfs_quota_us`/`cpu.cfs_period_us`.
//! 3. Otherwise: with `limits.enforce = "strict"` an error that says how to get delegation or
//!    relax the policy; with "best-effort" the limits a cgroup could not take fall back to
//!    rlimits (see [`crate::rlimit`]) and the notes say so.
//!
//! After the run, [`JailCgroup::events`] reports OOM kills and pids exhaustion (for the exit
//! summary and the audit log), and dropping the [`JailCgroup`] kills whatever is left in it and
//! removes the directories.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_policy::plan::{Enforce, Limits};
use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("{0}")]
    Unenforceable(String),
    #[error("cgroup: {what} {path} failed: {cause}")]
    Io {
        what: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |cause| CgroupError::Io {
        what,
        path: path.to_path_buf(),
        cause,
    }
}

/// Which limits the cgroup enforces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Enforced {
    pub memory: bool,
    pub cpus: bool,
    pub pids: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

/// What happened at the limits during the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LimitEvents {
    /// Processes killed by the OOM killer because the jail hit its memory limit.
    pub oom_kills: u64,
    /// Times an allocation hit the memory limit (v1 `memory.failcnt`, v2 `memory.events max`).
    pub memory_limit_hits: u64,
    /// Forks refused because the jail hit its pids limit (`pids.events max`).
    pub pids_limit_hits: u64,
}

impl LimitEvents {
    /// One line per event worth telling the user, for the exit summary.
    pub fn summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.oom_kills > 0 {
            out.push(format!(
                "{} process(es) killed: out of memory (limits.memory; raise it with --memory)",
                self.oom_kills
            ));
        }
        if self.pids_limit_hits > 0 {
            out.push(format!(
                "{} fork(s) refused: process limit reached (limits.pids; raise it with --pids)",
                self.pids_limit_hits
            ));
        }
        out
    }
}

/// The outcome of setting the limits up.
#[derive(Debug)]
pub struct LimitsSetup {
    /// The jail's cgroup, when one enforces at least one limit.
    pub cgroup: Option<JailCgroup>,
    /// What the child must apply as rlimits ([`crate::rlimit::apply`]): the limits no cgroup took.
    pub fallback: Limits,
    /// Lines for stderr (best-effort fallbacks). Empty when everything is enforced by a cgroup.
    pub notes: Vec<String>,
}

/// The jail's cgroup: one directory (v2) or one per controller (v1).
#[derive(Debug)]
pub struct JailCgroup {
    version: Version,
    /// Directories created, with the controller each serves (v2: one, "unified").
    dirs: Vec<(&'static str, PathBuf)>,
    enforced: Enforced,
    removed: bool,
}

/// Set up the limits of jail `jail_id`: a cgroup when one can enforce them, and per
/// `limits.enforce` an error or a fallback for the rest.
pub fn setup(jail_id: &str, limits: &Limits) -> Result<LimitsSetup, CgroupError> {
    let wanted = Enforced {
        memory: limits.memory.is_some(),
        cpus: limits.cpus.is_some(),
        pids: limits.pids.is_some(),
    };
    if wanted == Enforced::default() {
        return Ok(LimitsSetup {
            cgroup: None,
            fallback: limits.clone(),
            notes: Vec::new(),
        });
    }
    let mut why = Vec::new();
    // Read once for both tries (a v1 host gets to the second).
    let (hs, own) = (hierarchies(), own_cgroups());
    let cgroup = match try_v2(jail_id, limits, wanted, &hs, &own, &mut why)? {
        Some(cg) => Some(cg),
        None => try_v1(jail_id, limits, wanted, &hs, &own, &mut why)?,
    };
    let enforced = cgroup.as_ref().map(|c| c.enforced).unwrap_or_default();
    let b = limits.built_in;
    // (name, not enforced by the cgroup, a built-in default)
    let kinds = [
        ("limits.memory", wanted.memory && !enforced.memory, b.memory),
        ("limits.cpus", wanted.cpus && !enforced.cpus, b.cpus),
        ("limits.pids", wanted.pids && !enforced.pids, b.pids),
    ];
    let missing: Vec<&str> = kinds.iter().filter(|k| k.1).map(|k| k.0).collect();
    // The limits someone set (a policy file or a flag): those follow `limits.enforce`.
    let missing_set: Vec<&str> = kinds.iter().filter(|k| k.1 && !k.2).map(|k| k.0).collect();
    let fallback = crate::rlimit::residual(limits, cgroup.as_ref());
    if missing.is_empty() {
        return Ok(LimitsSetup {
            cgroup,
            fallback,
            notes: Vec::new(),
        });
    }
    if missing_set.is_empty() {
        // Only corral's own defaults: they never stop a run; one line says what is missing.
        let notes = vec![built_in_note(&missing, &fallback)];
        return Ok(LimitsSetup {
            cgroup,
            fallback,
            notes,
        });
    }
    match limits.enforce {
        Enforce::Strict => {
            drop(cgroup); // removes what was created
            Err(CgroupError::Unenforceable(refusal(&missing_set, &why)))
        }
        Enforce::BestEffort => {
            let mut notes = vec![format!(
                "cannot enforce {} with a cgroup ({}); limits.enforce = \"best-effort\", so falling back to rlimits:",
                missing.join(", "),
                why.join("; ")
            )];
            notes.extend(
                crate::rlimit::describe_fallback(&fallback)
                    .into_iter()
                    .map(|l| format!("  {l}")),
            );
            Ok(LimitsSetup {
                cgroup,
                fallback,
                notes,
            })
        }
    }
}

/// The one line a run prints when some of corral's built-in default limits have no cgroup here
/// (`missing`, by key); `fallback` is what the rlimits take instead.
fn built_in_note(missing: &[&str], fallback: &Limits) -> String {
    let mut how = Vec::new();
    if fallback.memory.is_some() {
        how.push("memory per process (RLIMIT_DATA)");
    }
    if fallback.pids.is_some() {
        how.push("processes per user (RLIMIT_NPROC)");
    }
    if fallback.cpus.is_some() {
        how.push("no CPU limit");
    }
    format!(
        "default limits without a cgroup here ({}): {}; set [limits] or --memory/--cpus/--pids \
         to have them enforced or refused, see `corral doctor`",
        missing.join(", "),
        how.join(", ")
    )
}

/// The message for `limits.enforce = "strict"` when a limit cannot be enforced.
fn refusal(missing: &[&str], why: &[String]) -> String {
    format!(
        "cannot enforce {missing}: this user cannot create a cgroup with the needed controllers ({why}).\n\
         corral refuses to run weaker than the policy says (limits.enforce = \"strict\"). Either:\n\
         \x20 - get a delegated cgroup (cgroup v2): run corral inside a scope that delegates its subtree,\n\
         \x20     systemd-run --user --scope -p Delegate=yes corral run ...\n\
         \x20   (needs the unified cgroup v2 hierarchy, booted with systemd.unified_cgroup_hierarchy=1 on\n\
         \x20   older distributions, and controller delegation to user@.service:\n\
         \x20   `systemctl edit user@.service` with [Service] Delegate=memory pids cpu, then re-login);\n\
         \x20 - or run as root, where cgroup v1 controllers are writable;\n\
         \x20 - or relax the policy: pass --enforce best-effort, or set `limits.enforce = \"best-effort\"`\n\
         \x20   in corral.toml (per-process rlimits instead, reported on stderr), or remove the limit\n\
         \x20   ([limits] in corral.toml, or leave out --memory/--cpus/--pids).\n\
         `corral doctor` shows what this host supports.",
        missing = missing.join(", "),
        why = why.join("; ")
    )
}

impl JailCgroup {
    /// Create the jail's cgroup: [`setup`], with best-effort notes printed on stderr.
    /// `Ok(None)` when no cgroup enforces anything (no limits asked, or best-effort fallback):
    /// then apply [`crate::rlimit::residual`] in the child.
    pub fn create(jail_id: &str, limits: &Limits) -> Result<Option<JailCgroup>, CgroupError> {
        let s = setup(jail_id, limits)?;
        for n in &s.notes {
            eprintln!("corral: {n}");
        }
        Ok(s.cgroup)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn enforced(&self) -> Enforced {
        self.enforced
    }

    /// The directories of this cgroup (one per v1 controller).
    pub fn paths(&self) -> Vec<&Path> {
        self.dirs.iter().map(|(_, p)| p.as_path()).collect()
    }

    /// Move process `pid` (and, as it forks, its descendants) into the cgroup. Call it before
    /// the jail's child runs anything (e.g. while it waits for its uid map).
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        for (_, dir) in &self.dirs {
            let p = dir.join("cgroup.procs");
            fs::write(&p, pid.to_string()).map_err(io_err("adding a process to", &p))?;
        }
        Ok(())
    }

    /// OOM kills and limit hits so far.
    pub fn events(&self) -> LimitEvents {
        let mut ev = LimitEvents::default();
        for (ctl, dir) in &self.dirs {
            match (self.version, *ctl) {
                (Version::V2, _) => {
                    let mem = read_kv(&dir.join("memory.events"));
                    ev.oom_kills = get(&mem, "oom_kill");
                    ev.memory_limit_hits = get(&mem, "max");
                    ev.pids_limit_hits = get(&read_kv(&dir.join("pids.events")), "max");
                }
                (Version::V1, "memory") => {
                    ev.oom_kills = get(&read_kv(&dir.join("memory.oom_control")), "oom_kill");
                    ev.memory_limit_hits = read_u64(&dir.join("memory.failcnt")).unwrap_or(0);
                }
                (Version::V1, "pids") => {
                    ev.pids_limit_hits = get(&read_kv(&dir.join("pids.events")), "max");
                }
                _ => {}
            }
        }
        ev
    }

    /// The processes still in the cgroup.
    pub fn processes(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (_, dir) in &self.dirs {
            if let Ok(s) = fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Kill every process left in the cgroup and remove its directories.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_now()
    }

    fn remove_now(&mut self) -> Result<(), CgroupError> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        // cgroup v2 (5.14+): one write kills the whole subtree, race-free.
        for (_, dir) in &self.dirs {
            let kill = dir.join("cgroup.kill");
            if kill.exists() {
                let _ = fs::write(&kill, "1");
            }
        }
        let mut last = None;
        for (_, dir) in self.dirs.iter().rev() {
            for attempt in 0..200 {
                for pid in pids_in(dir) {
                    // SAFETY: kill with a pid read from our own cgroup and a constant signal.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                match fs::remove_dir(dir) {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        last = None;
                        break;
                    }
                    Err(e) => {
                        last = Some((dir.clone(), e));
                        // Killed processes leave the cgroup once they have been reaped.
                        std::thread::sleep(Duration::from_millis(if attempt < 20 {
                            5
                        } else {
                            25
                        }));
                    }
                }
            }
            if let Some((path, source)) = last.take() {
                return Err(CgroupError::Io {
                    what: "removing",
                    path,
                    cause: source,
                });
            }
        }
        Ok(())
    }
}

impl Drop for JailCgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove_now() {
            eprintln!("corral: {e}");
        }
    }
}

fn pids_in(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn read_kv(path: &Path) -> Vec<(String, u64)> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.parse().ok()?))
        })
        .collect()
}

fn get(kv: &[(String, u64)], key: &str) -> u64 {
    kv.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .unwrap_or(0)
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

// ---- discovering the hierarchies ----

/// A mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: Version,
    /// Where it is mounted.
    pub mount: PathBuf,
    /// The mount's root inside the hierarchy (usually "/").
    pub root: String,
    /// v1: the controllers bound to it (`memory`, `pids`, ..., `name=systemd`).
    pub controllers: Vec<String>,
}

/// The cgroup hierarchies mounted in this mount namespace (`/proc/self/mountinfo`).
pub fn hierarchies() -> Vec<Hierarchy> {
    parse_mountinfo(&String::from_utf8_lossy(
        &crate::mountinfo::read_proc("/proc/self/mountinfo").unwrap_or_default(),
    ))
}

fn parse_mountinfo(s: &str) -> Vec<Hierarchy> {
    let mut out = Vec::new();
    for line in s.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 {
            continue;
        }
        let version = match post[0] {
            "cgroup2" => Version::V2,
            "cgroup" => Version::V1,
            _ => continue,
        };
        let controllers = match version {
            Version::V2 => Vec::new(),
            Version::V1 => post[2]
                .split(',')
                .filter(|o| {
                    o.starts_with("name=")
                        || !(o.contains('=')
                            || matches!(
                                *o,
                                "rw" | "ro"
                                    | "xattr"
                                    | "noprefix"
                                    | "clone_children"
                                    | "cpuset_v2_mode"
                            ))
                })
                .map(str::to_string)
                .collect(),
        };
        out.push(Hierarchy {
            version,
            mount: PathBuf::from(unescape(pre[4])),
            root: unescape(pre[3]),
            controllers,
        });
    }
    out
}

/// A mountinfo path field, its `\ooo` escapes decoded (mountinfo.rs).
fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&crate::mountinfo::unescape(s.as_bytes())).into_owned()
}

/// This process's cgroup path per hierarchy (`/proc/self/cgroup`): (controllers, path), the
/// v2 entry with an empty controller list.
fn own_cgroups() -> Vec<(Vec<String>, String)> {
    String::from_utf8_lossy(&crate::mountinfo::read_proc("/proc/self/cgroup").unwrap_or_default())
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let _id = it.next()?;
            let ctls = it.next()?;
            let path = it.next()?;
            let ctls = if ctls.is_empty() {
                Vec::new()
            } else {
                ctls.split(',').map(str::to_string).collect()
            };
            Some((ctls, path.to_string()))
        })
        .collect()
}

/// The directory of this process's own cgroup in hierarchy `h`.
fn own_dir(h: &Hierarchy, own: &[(Vec<String>, String)]) -> Option<PathBuf> {
    let path = match h.version {
        Version::V2 => own.iter().find(|(c, _)| c.is_empty())?.1.clone(),
        Version::V1 => own
            .iter()
            .find(|(c, _)| c.iter().any(|x| h.controllers.contains(x)))?
            .1
            .clone(),
    };
    let rel = if h.root == "/" {
        path.as_str()
    } else {
        path.strip_prefix(h.root.as_str()).unwrap_or(path.as_str())
    };
    let rel = rel.trim_start_matches('/');
    // "(deleted)" or an empty path outside our namespace's view: unusable.
    if rel.contains(" (deleted)") {
        return None;
    }
    Some(if rel.is_empty() {
        h.mount.clone()
    } else {
        h.mount.join(rel)
    })
}

fn writable(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access() reads a NUL-terminated path we own.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn dir_name(jail_id: &str) -> String {
    format!("corral-{jail_id}")
}

/// A jail's cgroup older than this with no process left is stale.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Remove the cgroups of jails whose corral was killed (SIGKILL runs no destructor): sibling
/// `corral-*` directories under `base` that hold no process and were created more than
/// [`STALE_AFTER`] ago (a live corral moves its jail in within milliseconds of creating the
/// cgroup). Errors are ignored: another corral may be sweeping too.
fn sweep_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("corral-") || name.starts_with("corral-self-") {
            continue;
        }
        let dir = e.path();
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if old && e.file_type().is_ok_and(|t| t.is_dir()) && pids_in(&dir).is_empty() {
            let _ = fs::remove_dir(&dir);
        }
    }
}

fn try_v2(
    jail_id: &str,
    limits: &Limits,
    wanted: Enforced,
    hs: &[Hierarchy],
    own: &[(Vec<String>, String)],
    why: &mut Vec<String>,
) -> Result<Option<JailCgroup>, CgroupError> {
    let Some(h) = hs.iter().find(|h| h.version == Version::V2) else {
        why.push("no cgroup v2 hierarchy mounted".into());
        return Ok(None);
    };
    let Some(mut base) = own_dir(h, own) else {
        why.push("this process's cgroup v2 path is not visible".into());
        return Ok(None);
    };
    // Already moved into our leaf by an earlier jail of this process: its parent is the base.
    let in_leaf = base
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("corral-self-"));
    if let Some(parent) = base.parent().filter(|_| in_leaf) {
        base = parent.to_path_buf();
    }
    create_v2(&base, jail_id, limits, wanted, why)
}

/// The jail's cgroup under the v2 cgroup `base` (ours, or our leaf's parent).
fn create_v2(
    base: &Path,
    jail_id: &str,
    limits: &Limits,
    wanted: Enforced,
    why: &mut Vec<String>,
) -> Result<Option<JailCgroup>, CgroupError> {
    let available = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let available: Vec<&str> = available.split_whitespace().collect();
    let needed: Vec<&str> = [
        ("memory", wanted.memory),
        ("cpu", wanted.cpus),
        ("pids", wanted.pids),
    ]
    .into_iter()
    .filter(|(_, w)| *w)
    .map(|(c, _)| c)
    .collect();
    let absent: Vec<&str> = needed
        .iter()
        .copied()
        .filter(|c| !available.contains(c))
        .collect();
    if !absent.is_empty() {
        why.push(format!(
            "cgroup v2 {} offers no {} controller{} (bound to cgroup v1, or not delegated)",
            base.display(),
            absent.join("/"),
            if absent.len() > 1 { "s" } else { "" }
        ));
        return Ok(None);
    }
    if !writable(base) || !writable(&base.join("cgroup.subtree_control")) {
        why.push(format!(
            "cgroup v2 {} is not writable by this user (not delegated)",
            base.display()
        ));
        return Ok(None);
    }
    let enable: String = needed.iter().map(|c| format!("+{c} ")).collect();
    let control = base.join("cgroup.subtree_control");
    if let Err(e) = fs::write(&control, enable.trim_end()) {
        if e.raw_os_error() != Some(libc::EBUSY) {
            why.push(format!(
                "enabling {} in {} failed: {e}",
                enable.trim_end(),
                control.display()
            ));
            return Ok(None);
        }
        // "No internal processes": move ourselves into a leaf, then retry.
        let leaf = base.join(format!("corral-self-{}", std::process::id()));
        let moved = fs::create_dir(&leaf)
            .or_else(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .and_then(|_| fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()))
            .and_then(|_| fs::write(&control, enable.trim_end()));
        if let Err(e) = moved {
            why.push(format!(
                "enabling controllers in {} failed: {e} (other processes live in that cgroup)",
                control.display()
            ));
            return Ok(None);
        }
    }
    sweep_stale(base);
    let dir = base.join(dir_name(jail_id));
    fs::create_dir(&dir).map_err(io_err("creating", &dir))?;
    let mut cg = JailCgroup {
        version: Version::V2,
        dirs: vec![("unified", dir.clone())],
        enforced: Enforced::default(),
        removed: false,
    };
    if let Some(m) = limits.memory {
        write(&dir, "memory.max", &m.to_string())?;
        // Without this the limit could be escaped into swap. Absent without swap accounting.
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            fs::write(&swap, "0").map_err(io_err("writing", &swap))?;
        }
        cg.enforced.memory = true;
    }
    if let Some(p) = limits.pids {
        write(&dir, "pids.max", &p.to_string())?;
        cg.enforced.pids = true;
    }
    if let Some(c) = limits.cpus {
        let period = 100_000u64;
        write(
            &dir,
            "cpu.max",
            &format!("{} {period}", cpu_quota(c, period)),
        )?;
        cg.enforced.cpus = true;
    }
    Ok(Some(cg))
}

fn cpu_quota(cpus: f64, period: u64) -> u64 {
    // The kernel's minimum quota is 1ms.
    ((cpus * period as f64).round() as u64).max(1_000)
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let p = dir.join(file);
    fs::write(&p, value).map_err(io_err("writing", &p))
}

fn try_v1(
    jail_id: &str,
    limits: &Limits,
    wanted: Enforced,
    hs: &[Hierarchy],
    own: &[(Vec<String>, String)],
    why: &mut Vec<String>,
) -> Result<Option<JailCgroup>, CgroupError> {
    let mut cg = JailCgroup {
        version: Version::V1,
        dirs: Vec::new(),
        enforced: Enforced::default(),
        removed: false,
    };
    for (ctl, want) in [
        ("memory", wanted.memory),
        ("pids", wanted.pids),
        ("cpu", wanted.cpus),
    ] {
        if !want {
            continue;
        }
        let Some(h) = hs
            .iter()
            .find(|h| h.version == Version::V1 && h.controllers.iter().any(|c| c == ctl))
        else {
            why.push(format!("no cgroup v1 {ctl} hierarchy mounted"));
            continue;
        };
        let Some(base) = own_dir(h, own) else {
            why.push(format!(
                "this process's cgroup v1 {ctl} path is not visible"
            ));
            continue;
        };
        if !writable(&base) {
            why.push(format!(
                "cgroup v1 {} is not writable by this user",
                base.display()
            ));
            continue;
        }
        sweep_stale(&base);
        let dir = base.join(dir_name(jail_id));
        let shared = cg.dirs.iter().any(|(_, d)| *d == dir); // co-mounted controllers
        if shared {
        } else if let Err(e) = fs::create_dir(&dir) {
            why.push(format!("creating {} failed: {e}", dir.display()));
            continue;
        }
        if !shared {
            cg.dirs.push((ctl, dir.clone()));
        }
        // A controller whose files cannot be written (a kernel without CFS bandwidth control,
        // say) is one limit not enforced, not a failed run: `setup` decides per `enforce`.
        let applied = match ctl {
            "memory" => {
                let m = limits.memory.unwrap_or(u64::MAX).to_string();
                write(&dir, "memory.limit_in_bytes", &m).and_then(|()| {
                    // memsw (memory + swap) must be >= the memory limit; equal means no swap.
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        fs::write(&memsw, &m).map_err(io_err("writing", &memsw))
                    } else {
                        Ok(())
                    }
                })
            }
            "pids" => write(
                &dir,
                "pids.max",
                &limits.pids.unwrap_or(u64::MAX).to_string(),
            ),
            _ => {
                let period = 100_000u64;
                let quota = cpu_quota(limits.cpus.unwrap_or(1.0), period);
                write(&dir, "cpu.cfs_period_us", &period.to_string())
                    .and_then(|()| write(&dir, "cpu.cfs_quota_us", &quota.to_string()))
            }
        };
        match (applied, ctl) {
            (Err(e), _) => why.push(e.to_string()),
            (Ok(()), "memory") => cg.enforced.memory = true,
            (Ok(()), "pids") => cg.enforced.pids = true,
            (Ok(()), _) => cg.enforced.cpus = true,
        }
    }
    if cg.dirs.is_empty() {
        cg.removed = true;
        return Ok(None);
    }
    Ok(Some(cg))
}

/// Can this user create a cgroup enforcing memory, cpu and pids limits here? Tries for real
/// (creates one, then removes it). `Err` carries the reason.
pub fn probe() -> Result<Version, String> {
    let limits = Limits {
        memory: Some(1 << 30),
        cpus: Some(1.0),
        pids: Some(1024),
        enforce: Enforce::Strict,
        built_in: Default::default(),
    };
    let id = format!("probe-{}", std::process::id());
    match setup(&id, &limits) {
        Ok(s) => {
            let v = s
                .cgroup
                .as_ref()
                .map(|c| c.version)
                .ok_or("no cgroup created")?;
            if let Some(cg) = s.cgroup {
                cg.remove().map_err(|e| e.to_string())?;
            }
            Ok(v)
        }
        Err(CgroupError::Unenforceable(msg)) => Err(msg
            .split_once("controllers (")
            .and_then(|(_, r)| r.split_once(").\n"))
            .map(|(w, _)| w.to_string())
            .unwrap_or(msg)),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_hybrid_mountinfo() {
        let mi = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                  35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                  40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,release_agent=/x,name=systemd\n\
                  41 31 0:38 /sub /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
        similar_asserts::assert_eq!(
            parse_mountinfo(mi),
            vec![
                Hierarchy {
                    version: Version::V1,
                    mount: "/sys/fs/cgroup/memory".into(),
                    root: "/".into(),
                    controllers: vec!["memory".into()],
                },
                Hierarchy {
                    version: Version::V1,
                    mount: "/sys/fs/cgroup/systemd".into(),
                    root: "/".into(),
                    controllers: vec!["name=systemd".into()],
                },
                Hierarchy {
                    version: Version::V2,
                    mount: "/sys/fs/cgroup/unified".into(),
                    root: "/sub".into(),
                    controllers: vec![],
                },
            ]
        );
    }

    #[test]
    fn own_dir_joins_mount_and_path() {
        let h = Hierarchy {
            version: Version::V1,
            mount: "/sys/fs/cgroup/memory".into(),
            root: "/".into(),
            controllers: vec!["memory".into()],
        };
        let own = vec![
            (vec!["pids".to_string()], "/".to_string()),
            (vec!["memory".to_string()], "/a/b".to_string()),
            (vec![], "/user.slice".to_string()),
        ];
        assert_eq!(
            own_dir(&h, &own),
            Some(PathBuf::from("/sys/fs/cgroup/memory/a/b"))
        );
        let v2 = Hierarchy {
            version: Version::V2,
            mount: "/sys/fs/cgroup".into(),
            root: "/".into(),
            controllers: vec![],
        };
        assert_eq!(
            own_dir(&v2, &own),
            Some(PathBuf::from("/sys/fs/cgroup/user.slice"))
        );
    }

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape("/a\\040b"), "/a b");
    }

    #[test]
    fn cpu_quota_has_the_kernel_minimum() {
        assert_eq!(cpu_quota(2.0, 100_000), 200_000);
        assert_eq!(cpu_quota(0.001, 100_000), 1_000);
    }

    /// cgroup v2 cannot be exercised on a host whose controllers are bound to v1, so this
    /// checks the files `create_v2` writes on a directory shaped like a delegated cgroup.
    #[test]
    fn v2_writes_the_limits_into_a_delegated_cgroup() {
        let base = tempfile::tempdir().unwrap();
        let b = base.path();
        fs::write(b.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        fs::write(b.join("cgroup.subtree_control"), "").unwrap();
        let l = Limits {
            memory: Some(256 << 20),
            cpus: Some(1.5),
            pids: Some(64),
            enforce: Enforce::Strict,
            built_in: Default::default(),
        };
        let wanted = Enforced {
            memory: true,
            cpus: true,
            pids: true,
        };
        let mut why = Vec::new();
        let cg = create_v2(b, "unit", &l, wanted, &mut why)
            .unwrap()
            .expect("a cgroup");
        assert!(why.is_empty(), "{why:?}");
        assert_eq!(cg.version(), Version::V2);
        assert_eq!(cg.enforced(), wanted);
        let dir = b.join("corral-unit");
        assert_eq!(cg.paths(), vec![dir.as_path()]);
        let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(
            fs::read_to_string(b.join("cgroup.subtree_control")).unwrap(),
            "+memory +cpu +pids"
        );
        assert_eq!(
            (read("memory.max"), read("pids.max"), read("cpu.max")),
            (
                "268435456".to_string(),
                "64".to_string(),
                "150000 100000".to_string()
            )
        );
        for f in ["memory.max", "pids.max", "cpu.max"] {
            fs::remove_file(dir.join(f)).unwrap();
        }
        cg.remove().unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn v2_without_the_controllers_says_why() {
        let base = tempfile::tempdir().unwrap();
        fs::write(base.path().join("cgroup.controllers"), "cpuset io\n").unwrap();
        let l = Limits {
            memory: Some(1 << 30),
            cpus: None,
            pids: Some(10),
            enforce: Enforce::Strict,
            built_in: Default::default(),
        };
        let wanted = Enforced {
            memory: true,
            cpus: false,
            pids: true,
        };
        let mut why = Vec::new();
        assert!(
            create_v2(base.path(), "unit", &l, wanted, &mut why)
                .unwrap()
                .is_none()
        );
        assert_eq!(
            why,
            vec![format!(
                "cgroup v2 {} offers no memory/pids controllers (bound to cgroup v1, or not delegated)",
                base.path().display()
            )]
        );
    }

    #[test]
    fn sweep_removes_only_old_empty_jail_cgroups() {
        let base = tempfile::tempdir().unwrap();
        let b = base.path();
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        for (name, procs, old) in [
            ("corral-stale", "", true),
            ("corral-busy", "123\n", true),
            ("corral-fresh", "", false),
            ("corral-self-42", "", true),
            ("other", "", true),
        ] {
            let d = b.join(name);
            fs::create_dir(&d).unwrap();
            // A real cgroup directory is removable while its control files exist; a plain
            // directory is not, so the fake keeps cgroup.procs only where it must be read.
            if !procs.is_empty() {
                fs::write(d.join("cgroup.procs"), procs).unwrap();
            }
            if old {
                fs::File::open(&d).unwrap().set_modified(long_ago).unwrap();
            }
        }
        sweep_stale(b);
        let mut left: Vec<String> = fs::read_dir(b)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["corral-busy", "corral-fresh", "corral-self-42", "other"]
        );
    }

    #[test]
    fn no_limits_means_no_cgroup() {
        let l = Limits {
            memory: None,
            cpus: None,
            pids: None,
            enforce: Enforce::Strict,
            built_in: Default::default(),
        };
        let s = setup("unit-none", &l).unwrap();
        assert!(s.cgroup.is_none() && s.notes.is_empty());
    }
}
