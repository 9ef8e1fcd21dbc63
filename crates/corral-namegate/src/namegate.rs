//! The name gate: while the jail runs, no git repository can appear where git on the host
//! would find it (the git window during a run; docs/host-safety.md).
//!
//! Git run in a directory finds its repository through an entry named `.git`, or by taking
//! the directory itself for a git directory when it holds a `HEAD`, an `objects` and a `refs`
//! (which only need to pass `access(X_OK)`), or a `commondir` that sends it to another one. A
//! shell prompt or an editor runs git every few seconds in the directory the user is in, so a
//! repository the jail creates there is live before any check after the run could see it. The
//! gate closes that by construction: every syscall that creates a name (open/openat with
//! O_CREAT, creat, mkdir, mknod, link, symlink, rename, and bind of any socket, which names a
//! path for a Unix one; `seccomp::build_gate_filter`) is stopped by a seccomp user
//! notification and performed here, by a thread of the jail's PID 1 (one of two: [`Shift`]),
//! on the path (and the descriptor) it read once from the caller. Outside the jail's own file
//! systems ([`Gate::allows`]):
//! - `.git` and `commondir` are refused;
//! - a `HEAD` only in a git directory that existed when the run started, or below one in a
//!   directory holding no `objects` (git's `logs/HEAD`, `refs/remotes/origin/HEAD`);
//! - an `objects` never beside a `HEAD` (checked and created under a flock of the directory,
//!   which every gate of the run takes, so the second of the pair sees the first);
//! - a variant spelling, or any non-ASCII name, only where the directory does not fold names;
//! - in the project, no name the Plan's `filesystem.hide` patterns match ([`Hidden`]): hidden
//!   files are masked when the run starts, so one the jail made during the run (a `.env.local`
//!   the user then fills in) would be readable in it.
//!
//! The jail's own file systems (its tmpfs /tmp, home, /dev) are invisible to the host: a clone
//! or `git init` there works. A rename cannot carry a repository from them into a bind (EXDEV).
//!
//! Why performed here and not let through (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`): the kernel
//! would read the path again from the caller's memory, which another thread can change between
//! the check and the call. Performing the call on the copy that was checked leaves nothing to
//! race: only umask(2), which takes no path and no descriptor, is let through ([`continues`]);
//! a bind is performed on the socket taken from the caller, whatever its family. A lookup the
//! rules make fails closed: only ENOENT means a name is absent ([`Seen`]). The performer has the caller's rights: PID 1 applied the jail's Landlock domain
//! before it forked the command (one domain for both); the gate's thread holds no capability
//! but CAP_SYS_PTRACE over the jail's user namespace (to read a non-dumpable caller's memory)
//! and takes the caller's umask before each creation. The caller's cwd and directory
//! descriptors are opened through `/proc/TID/`; paths are resolved with
//! `openat2(RESOLVE_NO_MAGICLINKS)` so no `/proc` magic link resolves to PID 1's own files, and
//! the caller's own magic names (`/proc/self/fd/N`, `/dev/stdout`, `/dev/fd/N`, `/dev/tty`) are
//! translated to the caller's. A final symlink that an O_CREAT open would follow is followed
//! here, one hop at a time, so the name finally created is the one checked. Since a Landlock
//! domain nested in the jail would not bind what the gate performs, `landlock_restrict_self` is
//! refused while the gate runs.
//!
//! While the run keeps a change record ([`Gate::with_record`]; docs/undo.md), the filter also
//! stops unlink/unlinkat/rmdir and chmod/fchmod/fchmodat/fchmodat2 (`build_gate_filter_with`),
//! and the gate performs them through the seam too; before each call that changes a name in the
//! project (those, and every creation, open for writing, truncate, rename and link) the record
//! keeps what the name is (namegate/record.rs). A name whose record fails is not changed.
//!
//! PID 1 is an ancestor of every process of the jail (Yama's `ptrace_scope=1` lets it read
//! their memory) and non-dumpable (they cannot read or trace it).

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;

use corral_policy::plan::Plan;

mod protected;
mod record;
pub mod sys;
use protected::Use;
pub use record::Recorder;
use sys::{Real, Sys};

/// Longest path the gate reads from a caller (the kernel's PATH_MAX, with its NUL).
const PATH_MAX: usize = 4096;
/// Symlinks an O_CREAT open follows at most (the kernel's MAXSYMLINKS).
const MAX_HOPS: usize = 40;
/// Refusals reported on the jail's stderr, at most (each path once).
const REPORT_MAX: usize = 20;
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// What PID 1 knows before it forks the command: where a `HEAD` may be created, and which
/// file systems are the jail's own. `S` makes the gate's system calls ([`Sys`]): the kernel
/// ([`Real`]), or a test's fake.
pub struct Gate<S = Real> {
    /// The read-only binds of one file or directory, kept read-only if the host replaces it.
    protected: protected::Protected,
    /// (device, inode) of each git directory that existed when the run started and held a
    /// `HEAD` (the Plan's `git.dirs`, as the jail sees them).
    git_dirs: HashSet<(u64, u64)>,
    /// Their descriptors, held for the run: an inode number cannot be reused while it is open.
    _held: Vec<OwnedFd>,
    /// Devices of the file systems the jail made (tmpfs root, /tmp, /dev, /dev/shm, the
    /// Plan's tmpfs mounts), each taken right after its mount: nothing there is visible to
    /// the host.
    private_devs: HashSet<u64>,
    /// `fs.protected_symlinks`: the gate follows links itself, so it applies the rule itself.
    protected_symlinks: bool,
    /// The jail's uid (the gate's own, as the caller's).
    uid: libc::uid_t,
    /// The `filesystem.hide` patterns, refused as new names in the project.
    pub hidden: Option<Hidden>,
    reports: Reporter,
    umasks: Umasks,
    fifo_waits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The run's change record (record.rs): what each name in the project was before the
    /// gate changed it.
    record: Option<Recorder>,
    /// PID 1's root (the jail's `/`), opened on the first absolute path and kept: the jail
    /// cannot mount, so it stays the root every absolute path starts from.
    root: std::sync::OnceLock<OwnedFd>,
    sys: S,
}

/// What a name is to git's discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// `.git`: where git finds a repository from a directory.
    DotGit,
    /// `HEAD`: makes a directory a git directory (with `objects` and `refs`).
    Head,
    /// `commondir`: sends git to another git directory.
    Commondir,
    /// `objects` beside a `HEAD` (with `refs`, a git directory).
    Part,
    /// A non-ASCII name in a directory that folds names: it may stand for a git name.
    Folded,
}

impl Refusal {
    /// The name's meaning to git, and whether it is spelled exactly as git spells it (a
    /// variant, `.GIT` or `.git.`, is the same name only on a case-insensitive or
    /// name-normalising file system).
    fn of(name: &[u8]) -> Option<(Refusal, bool)> {
        let trimmed = {
            let end = name
                .iter()
                .rposition(|&b| b != b'.' && b != b' ')
                .map_or(0, |i| i + 1);
            // ".git" itself ends in no dot to trim; keep a name made of dots as it is.
            if name.starts_with(b".") && end <= 1 {
                name
            } else {
                &name[..end]
            }
        };
        let (kind, exact): (Refusal, &[u8]) = if trimmed.eq_ignore_ascii_case(b".git") {
            (Refusal::DotGit, b".git")
        } else if trimmed.eq_ignore_ascii_case(b"head") {
            (Refusal::Head, b"HEAD")
        } else if trimmed.eq_ignore_ascii_case(b"commondir") {
            (Refusal::Commondir, b"commondir")
        } else if trimmed.eq_ignore_ascii_case(b"objects") {
            (Refusal::Part, b"objects")
        } else {
            return None;
        };
        Some((kind, name == exact))
    }
}

impl Gate {
    /// The gate for `plan`, or `None` when the Plan lets the jail create repositories
    /// (`filesystem.allow_new_repositories`: what the jail makes is checked when the run ends,
    /// and so is a protected file the host replaced). Runs in PID 1 once the root is built.
    pub fn prepare(plan: &Plan, private: &[u64]) -> io::Result<Option<Gate>> {
        if plan.git.new_repositories {
            return Ok(None);
        }
        let mountinfo = crate::mountinfo::read_proc("/proc/self/mountinfo")?;
        let mut gate = Gate::new(
            &plan.git.dirs,
            private.iter().copied().collect(),
            &mountinfo,
        )?;
        gate.hidden = Hidden::of(plan)?;
        Ok(Some(gate))
    }

    /// Keep the run's change record: before each change of a name in the project, the gate
    /// has `record` keep what the name is. The gate's filter must then also stop removals
    /// and mode changes (`seccomp::build_gate_filter`).
    pub fn with_record(mut self, mut record: Recorder) -> Gate {
        record.set_private_devs(&self.private_devs);
        self.record = Some(record);
        self
    }

    /// The gate for the git directories `dirs` (as this process sees them), with the file
    /// systems of `private_devs` exempt. The protected files and directories are the
    /// read-only binds of one in `mountinfo` (this process's).
    pub fn new(
        dirs: &[std::path::PathBuf],
        private_devs: HashSet<u64>,
        mountinfo: &[u8],
    ) -> io::Result<Gate> {
        let mut git_dirs = HashSet::new();
        let mut held = Vec::new();
        for dir in dirs {
            let Ok(fd) = open_path(libc::AT_FDCWD, dir.as_os_str(), libc::O_DIRECTORY) else {
                continue;
            };
            if fstatat(&fd, OsStr::new("HEAD"), libc::AT_SYMLINK_NOFOLLOW).is_err() {
                continue;
            }
            if let Ok(st) = fstat(&fd) {
                git_dirs.insert((st.st_dev, st.st_ino));
                held.push(fd);
            }
        }
        let protected = protected::Protected::from_mountinfo(mountinfo, &private_devs, &git_dirs)?;
        let protected_symlinks = std::fs::read_to_string("/proc/sys/fs/protected_symlinks")
            .map(|v| v.trim() != "0")
            .unwrap_or(true);
        Ok(Gate {
            protected,
            git_dirs,
            _held: held,
            private_devs,
            protected_symlinks,
            // SAFETY: getuid cannot fail.
            uid: unsafe { libc::getuid() },
            hidden: None,
            reports: Reporter::default(),
            umasks: Umasks::default(),
            fifo_waits: Default::default(),
            record: None,
            root: std::sync::OnceLock::new(),
            sys: Real,
        })
    }

    /// Serve the command's notifications on a thread of PID 1, once the command's process
    /// sends its listener on `from` (nothing: the gate could not be installed, or the command
    /// failed before; then the thread ends). Called right after PID 1 forked the command and
    /// before it drops its capabilities: the thread keeps CAP_SYS_PTRACE in the jail's user
    /// namespace alone, to read the memory of a caller that is not dumpable (a program whose
    /// file is not readable starts so), and nothing else: `keep_only_ptrace` reduces the
    /// calling thread's capabilities to [`CAP_SYS_PTRACE`] (corral-sandbox's
    /// `caps::keep_only`), and the gate serves nothing unless it succeeds.
    pub fn serve<E: std::fmt::Display>(
        self,
        from: OwnedFd,
        keep_only_ptrace: impl FnOnce() -> Result<(), E> + Send + 'static,
    ) {
        let gate = self;
        let spawned = std::thread::Builder::new()
            .name("corral-gate".into())
            .spawn(move || {
                if let Err(e) = keep_only_ptrace() {
                    eprintln!("corral: jail: name gate: {e}");
                    return;
                }
                let Some(listener) = receive_listener(&from) else {
                    return;
                };
                drop(from);
                // Wake the caller on this CPU when answering (Linux 6.6; older kernels refuse
                // the flag and wake it the usual way): the caller and the gate take turns.
                let sync_wake_up: u64 = 1; // SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
                // SAFETY: SET_FLAGS reads one u64 flag word, passed by value.
                unsafe {
                    libc::ioctl(
                        listener.as_raw_fd(),
                        libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS as _,
                        sync_wake_up,
                    )
                };
                gate.work(listener);
            });
        if let Err(e) = spawned {
            // The command waits on its first creation until the listener's last copy closes,
            // then gets ENOSYS: nothing is created unchecked.
            eprintln!("corral: jail: cannot start the name gate ({e}); file creation fails");
        }
    }
}

/// Which of the gate's two threads serves the listener: the one under SCHED_IDLE while the
/// machine has a CPU to spare, the one under the normal policy while it has none.
///
/// Answering an open installs a descriptor in the caller (`SECCOMP_IOCTL_NOTIF_ADDFD`), and the
/// kernel wakes the caller for that the ordinary way, not on the gate's CPU as the other
/// answers are (`SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP`): the scheduler places the caller on an
/// idle CPU rather than on the gate's busy one, and the caller installing the descriptor wakes
/// the gate on its CPU in turn. Waking a CPU that sleeps costs tens of microseconds in a
/// virtual machine that halts idle vCPUs (and on hardware in a deep C-state), twice per
/// creation: on the benchmark VM 70-80 us per file created in the jail's /tmp, against 15-25
/// us when the caller stays on the gate's CPU (docs/BENCHMARKS.md, "Name gate"). A CPU that
/// runs only SCHED_IDLE tasks counts as idle when a woken task is placed, so under SCHED_IDLE
/// the caller stays on the gate's CPU and preempts the gate there at once.
///
/// SCHED_IDLE yields to every normal task of the machine, though: with more runnable tasks
/// than CPUs, the gate, and every call of the jail waiting on it, would wait for a turn. A
/// thread cannot leave SCHED_IDLE without CAP_SYS_NICE, so the gate has two threads, and the
/// one serving reads the number of running tasks (`/proc/loadavg`) at most every
/// [`SHIFT_CHECK`] after a call: more than the CPUs the jail may use, and it hands the listener
/// to the normal thread; fewer, and the normal thread hands it back. The other thread waits
/// on a condition variable meanwhile, not on the listener (a woken normal thread on the
/// caller's CPU would take the placement back).
struct Shift {
    state: Mutex<ShiftState>,
    turn: std::sync::Condvar,
    /// The CPUs the jail may run on.
    cpus: usize,
    /// When the serving thread last read the load (ms of CLOCK_MONOTONIC_COARSE).
    checked: std::sync::atomic::AtomicU64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    /// Under SCHED_IDLE: the caller stays on the gate's CPU.
    Idle,
    /// Under the normal policy: served in its turn when every CPU is busy.
    Normal,
}

struct ShiftState {
    serving: Role,
    /// The listener is done (no process holds its filter): both threads end.
    done: bool,
}

/// How often the serving thread reads the machine's load, at most.
const SHIFT_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

impl Shift {
    fn new() -> Shift {
        Shift {
            state: Mutex::new(ShiftState {
                serving: Role::Idle,
                done: false,
            }),
            turn: std::sync::Condvar::new(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            checked: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Wait until `role` serves; `false` once the gate is done.
    fn wait_turn(&self, role: Role) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.serving != role && !s.done {
            s = self.turn.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        !s.done
    }

    fn finish(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).done = true;
        self.turn.notify_all();
    }

    /// After a call `role` answered: read the load if [`SHIFT_CHECK`] has passed, and hand the
    /// listener to the other thread if the load says so.
    fn after_call(&self, role: Role) {
        let now = coarse_ms();
        let last = self.checked.load(std::sync::atomic::Ordering::Relaxed);
        if now.saturating_sub(last) < SHIFT_CHECK.as_millis() as u64 {
            return;
        }
        self.checked
            .store(now, std::sync::atomic::Ordering::Relaxed);
        let Some(running) = running_tasks() else {
            return;
        };
        let want = shift_for(running, self.cpus, role);
        if want != role {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).serving = want;
            self.turn.notify_all();
        }
    }
}

/// The role that should serve with `running` tasks running (this thread among them) on
/// `cpus` CPUs, `now` serving: the normal one once there are more than CPUs, the idle one
/// once a CPU is free; in between, whichever serves.
fn shift_for(running: usize, cpus: usize, now: Role) -> Role {
    if running > cpus {
        Role::Normal
    } else if running < cpus {
        Role::Idle
    } else {
        now
    }
}

/// Tasks running or runnable on the machine now (`/proc/loadavg`'s fourth field, before the
/// slash), or `None` when it cannot be read.
fn running_tasks() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// CLOCK_MONOTONIC_COARSE in milliseconds (a vDSO read, no system call).
fn coarse_ms() -> u64 {
    // SAFETY: timespec is plain data the call fills in.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000
}

/// Put the calling thread under SCHED_IDLE (see [`Shift`]); failing only costs time.
fn idle_policy() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets this thread's own policy; `param` is read only.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
}

impl<S: Sys> Gate<S> {
    /// The same gate making its system calls with `sys` (a test's fake).
    #[cfg(test)]
    fn with_sys<T>(self, sys: T) -> Gate<T> {
        Gate {
            protected: self.protected,
            git_dirs: self.git_dirs,
            _held: self._held,
            private_devs: self.private_devs,
            protected_symlinks: self.protected_symlinks,
            uid: self.uid,
            hidden: self.hidden,
            reports: self.reports,
            umasks: self.umasks,
            fifo_waits: self.fifo_waits,
            record: self.record,
            root: std::sync::OnceLock::new(),
            sys,
        }
    }

    /// The jail's root, opened once ([`Gate::root`]'s field).
    fn root(&self) -> Result<&OwnedFd, i32> {
        if let Some(fd) = self.root.get() {
            return Ok(fd);
        }
        let fd = self
            .sys
            .open_path(libc::AT_FDCWD, b"/", libc::O_DIRECTORY)?;
        // Another thread of the gate may have set it meanwhile: either is the same root.
        let _ = self.root.set(fd);
        Ok(self.root.get().expect("set just above"))
    }

    /// May `name` be created in the directory `parent`?
    /// `class` is `Refusal::of(name)`.
    fn allows(
        &self,
        parent: &OwnedFd,
        name: &[u8],
        class: Option<(Refusal, bool)>,
    ) -> Result<(), Refusal> {
        let Some((kind, exact)) = class else {
            // A directory that folds names may take a non-ASCII name for a git one (`objectſ`,
            // a zero-width joiner in `.git`): such names are refused there (host-visible).
            if !name.is_ascii() && folds_names(&self.sys, parent) {
                let st = self.sys.fstat(parent).map_err(|_| Refusal::Folded)?;
                if !self.private_devs.contains(&st.st_dev) {
                    return Err(Refusal::Folded);
                }
            }
            return Ok(());
        };
        let st = self.sys.fstat(parent).map_err(|_| kind)?;
        if self.private_devs.contains(&st.st_dev) {
            return Ok(());
        }
        if !exact && !folds_names(&self.sys, parent) {
            // `.GIT` in a case-sensitive directory is not git's `.git`.
            return Ok(());
        }
        let in_git_dir = self.git_dirs.contains(&(st.st_dev, st.st_ino));
        rule(
            kind,
            in_git_dir,
            &InspectedDir {
                gate: self,
                dir: parent,
                st,
            },
        )
    }

    /// Is `dir` (whose stat is `st`) below one of the run's git directories?
    fn below_git_dir(&self, dir: &OwnedFd, st: libc::stat) -> bool {
        let mut at = (st.st_dev, st.st_ino);
        let mut up: Option<OwnedFd> = None;
        for _ in 0..256 {
            if self.git_dirs.contains(&at) {
                return true;
            }
            let from = up.as_ref().unwrap_or(dir);
            let Ok(parent) = self
                .sys
                .open_path(from.as_raw_fd(), b"..", libc::O_DIRECTORY)
            else {
                return false;
            };
            let Ok(pst) = self.sys.fstat(&parent) else {
                return false;
            };
            if (pst.st_dev, pst.st_ino) == at {
                return false; // the root
            }
            at = (pst.st_dev, pst.st_ino);
            up = Some(parent);
        }
        // Deeper than any path: not below one (then a `HEAD` is refused).
        false
    }

    /// The kernel's `fs.protected_symlinks` rule for a link the gate is about to follow on a
    /// caller's behalf: in a sticky world-writable directory, only a link owned by the caller
    /// or by the directory's owner is followed.
    fn may_follow(&self, entry: &Entry, link: Option<libc::stat>) -> Result<(), i32> {
        let (Some(link), true) = (link, self.protected_symlinks) else {
            return Ok(());
        };
        let dir = self.sys.fstat(&entry.parent)?;
        let sticky_world = dir.st_mode & libc::S_ISVTX != 0 && dir.st_mode & libc::S_IWOTH != 0;
        if sticky_world && link.st_uid != self.uid && link.st_uid != dir.st_uid {
            return Err(libc::EACCES);
        }
        Ok(())
    }

    /// One stderr line per refused path (at most [`REPORT_MAX`]), written by a thread of its
    /// own: the jail can stop its terminal's output, which must not stop the gate.
    fn report(&self, kind: Refusal, parent: &OwnedFd, name: &[u8]) {
        let path = path_of(&self.sys, parent, name);
        let what = match kind {
            Refusal::DotGit => "a `.git`",
            Refusal::Head => "a `HEAD` outside the run's git directories",
            Refusal::Commondir => "a `commondir`",
            Refusal::Part => "an `objects` beside a `HEAD`",
            Refusal::Folded => {
                "a non-ASCII name in a directory that folds names (it may stand for `.git`)"
            }
        };
        self.reports.send(
            path.clone(),
            format!(
                "corral: refused creating {what} at {} during the run: git on the host would \
                 take it for a repository before corral could check it. Create repositories \
                 under /tmp in the jail, or allow it with `filesystem.allow_new_repositories = \
                 true` in your user config (checked when the run ends instead).",
                String::from_utf8_lossy(&path)
            ),
        );
    }

    /// May `name` be created in the directory `parent`, as `filesystem.hide` goes? `Err` holds
    /// the pattern that matches it. The jail's own file systems are invisible to the host:
    /// anything may be made there. A directory whose file system cannot be told is not taken
    /// for one of them.
    fn hide_allows(&self, entry: &Entry) -> Result<(), String> {
        let Some(hidden) = &self.hidden else {
            return Ok(());
        };
        if entry.private {
            return Ok(());
        }
        let (parent, name) = (&entry.parent, entry.name());
        if !hidden.may_match(name) {
            // A pattern matches a path only where its last component matches the name: none
            // does, wherever the directory is (most names: no lookup of its path).
            return Ok(());
        }
        let dir = self.sys.fd_path(parent);
        match hidden.refuses(dir.as_deref(), name) {
            Some(pattern) => Err(pattern.to_string()),
            None => Ok(()),
        }
    }

    /// The stderr line for a name refused because `filesystem.hide` matches it.
    fn report_hidden(&self, parent: &OwnedFd, name: &[u8], pattern: &str) {
        let path = path_of(&self.sys, parent, name);
        self.reports.send(
            path.clone(),
            format!(
                "corral: refused creating {:?} during the run: it matches `filesystem.hide` \
                 ({pattern:?}), whose files corral masks when a run starts, so whatever was put \
                 in it later would be readable in the jail. If the jail should have this file, \
                 create it on the host (the next run masks it), or give it a name \
                 `filesystem.hide` does not match (or, for a pattern of your own policy, remove \
                 the pattern).",
                String::from_utf8_lossy(&path)
            ),
        );
    }
}

/// `name` in the directory `parent` (its path as the kernel names it now, in PID 1's root, the
/// jail's), for a report (`?` for a directory that cannot be named).
fn path_of<S: Sys>(sys: &S, parent: &OwnedFd, name: &[u8]) -> Vec<u8> {
    let mut path = sys.fd_path(parent).unwrap_or_else(|| b"?".to_vec());
    if path.last() != Some(&b'/') {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The Plan's `filesystem.hide` patterns and the project root they are relative to (where
/// the jail sees the project: at its own path), matched with the one matcher the masking walk
/// uses (`corral_policy::hide::HideSet`).
pub struct Hidden {
    /// The patterns as written, in the order of `tail_patterns`.
    patterns: Vec<String>,
    /// Each pattern's last component, matching at any depth (`config/secrets.yml`:
    /// `secrets.yml`; `a/**`: anything), for a directory whose path cannot be read.
    tail_patterns: Vec<String>,
    /// The root without a trailing slash (empty for `/`).
    root: Vec<u8>,
    /// Both compiled at the first name made in the project (a regex set costs about 0.1 ms
    /// the first time in a process: a run that makes no name there compiles none). `None`
    /// if they did not compile after all: every name is then refused.
    sets: std::sync::OnceLock<Option<HiddenSets>>,
}

struct HiddenSets {
    set: corral_policy::hide::HideSet,
    tails: corral_policy::hide::HideSet,
}

impl Hidden {
    /// The patterns of `plan`, or `None` when it has none. A pattern that does not compile is
    /// an error: the jail does not start without the rule.
    fn of(plan: &Plan) -> io::Result<Option<Hidden>> {
        Hidden::of_patterns(&plan.hide, &plan.project.root)
    }

    /// `patterns` below the project at `root` (a container's gate: `gatexec.rs`), or `None`
    /// without a pattern.
    pub fn of_patterns(patterns: &[String], root: &std::path::Path) -> io::Result<Option<Hidden>> {
        if patterns.is_empty() {
            return Ok(None);
        }
        let hidden = Hidden::new(patterns, root.as_os_str().as_bytes());
        Ok(Some(hidden.map_err(io::Error::other)?))
    }

    fn new(patterns: &[String], root: &[u8]) -> Result<Hidden, corral_policy::error::PolicyError> {
        let end = root.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
        let tail_patterns: Vec<String> = patterns
            .iter()
            .map(|p| {
                let p = p.trim_end_matches('/');
                p.rsplit('/').next().unwrap_or(p).to_string()
            })
            .collect();
        // Each pattern parses (so the jail does not start without its rule); the sets are
        // compiled when first needed.
        corral_policy::hide::HideSet::check(patterns)?;
        corral_policy::hide::HideSet::check(&tail_patterns)?;
        Ok(Hidden {
            patterns: patterns.to_vec(),
            tail_patterns,
            root: root[..end].to_vec(),
            sets: std::sync::OnceLock::new(),
        })
    }

    fn sets(&self) -> Option<&HiddenSets> {
        self.sets
            .get_or_init(|| {
                Some(HiddenSets {
                    set: corral_policy::hide::HideSet::new(&self.patterns).ok()?,
                    tails: corral_policy::hide::HideSet::new(&self.tail_patterns).ok()?,
                })
            })
            .as_ref()
    }

    /// Whether some pattern's last component matches `name` (or the sets did not compile):
    /// only then can a pattern match a path ending in `name`.
    fn may_match(&self, name: &[u8]) -> bool {
        self.sets().is_none_or(|s| {
            s.tails
                .matching(std::path::Path::new(OsStr::from_bytes(name)))
                .is_some()
        })
    }

    /// The pattern that `name`, made in the directory whose path is `dir`, matches (`None`:
    /// it may be made). A directory outside the project is not the patterns' concern. A
    /// directory whose path cannot be read (`None`) may be anywhere in the project, below any
    /// directory: `name` is refused when it matches a pattern's last component (for a pattern
    /// without a slash, the same answer as anywhere in the project; for `config/secrets.yml`,
    /// every `secrets.yml`; for `a/**`, every name).
    fn refuses(&self, dir: Option<&[u8]>, name: &[u8]) -> Option<&str> {
        let Some(sets) = self.sets() else {
            // Not compiled: fail closed.
            return self.patterns.first().map(String::as_str);
        };
        let rel: Vec<u8> = match dir {
            None => {
                let tail = sets
                    .tails
                    .matching(std::path::Path::new(OsStr::from_bytes(name)))?;
                let i = self.tail_patterns.iter().position(|t| t == tail)?;
                return Some(self.patterns[i].as_str());
            }
            Some(dir) => match dir.strip_prefix(self.root.as_slice()) {
                Some(b"" | b"/") => name.to_vec(),
                Some([b'/', below @ ..]) => [below, b"/", name].concat(),
                _ => return None,
            },
        };
        sets.set
            .matching(std::path::Path::new(OsStr::from_bytes(&rel)))
    }
}

/// What a lookup of a name says to a rule of the gate: only ENOENT is absence. Any other
/// error (EACCES while the jail has taken the search permission off the directory, ELOOP,
/// EIO, ENOMEM, ...) says nothing about the name, so the name counts as there: a rule that
/// allows a creation only when a name is absent then refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Absent,
    Present,
}

impl Seen {
    fn of<T>(lookup: Result<T, i32>) -> Seen {
        match lookup {
            Err(libc::ENOENT) => Seen::Absent,
            _ => Seen::Present,
        }
    }
}

/// What the rules for a `HEAD` and an `objects` ask of the directory they would be made in:
/// the real directory ([`InspectedDir`]), or answers and errors a test injects.
trait Dir {
    /// fstatat of `name` in the directory, not following a link (an entry of any type
    /// counts: git needs `objects` only to pass `access(X_OK)`).
    fn lookup(&self, name: &str) -> Result<(), i32>;
    /// Is the directory below one of the run's git directories? (`false` when that cannot be
    /// told: then a `HEAD` is refused.)
    fn below_git_dir(&self) -> bool;
}

/// The rule for a git name `kind` (spelled as git takes it, outside the jail's own file
/// systems) in a directory that is one of the run's git directories or not (`in_git_dir`).
/// A git directory is a directory holding `HEAD`, `objects` and `refs` (or a `commondir`):
/// below the run's git directories, where git writes `HEAD` files of its own (`logs/HEAD`,
/// `refs/remotes/origin/HEAD`), no directory may hold both a `HEAD` and an `objects`;
/// elsewhere there may be no `HEAD` at all, and no `objects` beside a `HEAD` that was there
/// before the run. Creations of the pair are performed one at a time under a lock of the
/// directory, so the second always sees the first; a lookup that fails otherwise than with
/// ENOENT counts as finding the name ([`Seen`]).
fn rule(kind: Refusal, in_git_dir: bool, dir: &impl Dir) -> Result<(), Refusal> {
    match kind {
        Refusal::DotGit | Refusal::Commondir | Refusal::Folded => Err(kind),
        _ if in_git_dir => Ok(()),
        Refusal::Head => {
            if Seen::of(dir.lookup("objects")) == Seen::Absent && dir.below_git_dir() {
                Ok(())
            } else {
                Err(kind)
            }
        }
        Refusal::Part => match Seen::of(dir.lookup("HEAD")) {
            Seen::Absent => Ok(()),
            Seen::Present => Err(kind),
        },
    }
}

/// The directory a `HEAD` or an `objects` would be made in, looked at for real.
struct InspectedDir<'a, S> {
    gate: &'a Gate<S>,
    dir: &'a OwnedFd,
    st: libc::stat,
}

impl<S: Sys> Dir for InspectedDir<'_, S> {
    fn lookup(&self, name: &str) -> Result<(), i32> {
        self.gate
            .sys
            .fstatat(self.dir, name.as_bytes(), libc::AT_SYMLINK_NOFOLLOW)
            .map(drop)
    }
    fn below_git_dir(&self) -> bool {
        self.gate.below_git_dir(self.dir, self.st)
    }
}

/// What is at `name` in `dir` now (not following a link): `None` only when the kernel says
/// there is nothing (ENOENT); any other error is the caller's error, not an absence.
fn entry_at<S: Sys>(sys: &S, dir: &OwnedFd, name: &[u8]) -> Result<Option<libc::stat>, i32> {
    match sys.fstatat(dir, name, libc::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// CAP_SYS_PTRACE's number: the one capability the gate's thread keeps ([`Gate::serve`]).
pub const CAP_SYS_PTRACE: u32 = 19;

/// The gate's stderr lines, written by a thread so a stopped terminal cannot stall the gate.
#[derive(Default)]
struct Reporter {
    state: Mutex<ReporterState>,
}

#[derive(Default)]
struct ReporterState {
    seen: HashSet<Vec<u8>>,
    to: Option<std::sync::mpsc::SyncSender<String>>,
}

impl Reporter {
    fn send(&self, key: Vec<u8>, line: String) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.seen.len() >= REPORT_MAX || !s.seen.insert(key) {
            return;
        }
        if s.to.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel::<String>(REPORT_MAX);
            let writer = std::thread::Builder::new()
                .name("corral-gate-log".into())
                .spawn(move || {
                    for line in rx {
                        eprintln!("{line}");
                    }
                });
            if writer.is_err() {
                return;
            }
            s.to = Some(tx);
        }
        if let Some(tx) = &s.to {
            let _ = tx.try_send(line);
        }
    }
}

/// Does the directory compare names without case or drop trailing dots (vfat, exFAT, SMB,
/// NTFS, HFS+, or an ext4/f2fs directory with the casefold flag)? Asked only of a variant of a
/// git name.
fn folds_names<S: Sys>(sys: &S, dir: &OwnedFd) -> bool {
    folds(sys.fstatfs_type(dir), || sys.inode_flags(dir))
}

/// [`folds_names`] from what the kernel said: the file system's type (a folding one folds),
/// then the directory's inode flags (the casefold flag). A file system without inode flags
/// (ENOTTY, EOPNOTSUPP: tmpfs before 6.x, overlayfs over one) folds nothing; any other error
/// (EACCES on a directory the jail made unreadable, ...) cannot tell, and counts as folding.
fn folds(fs_type: Result<i64, i32>, flags: impl FnOnce() -> Result<libc::c_long, i32>) -> bool {
    const FOLDING: [i64; 8] = [
        0x4d44,     // MSDOS_SUPER_MAGIC (vfat)
        0x2011bab0, // EXFAT_SUPER_MAGIC
        0xff534d42, // CIFS_SUPER_MAGIC
        0xfe534d42, // SMB2_SUPER_MAGIC
        0x517b,     // SMB_SUPER_MAGIC
        0x5346544e, // NTFS_SB_MAGIC (ntfs3)
        0x482b,     // HFSPLUS_SUPER_MAGIC
        0x4244,     // HFS_SUPER_MAGIC
    ];
    match fs_type {
        Ok(t) if FOLDING.contains(&t) => return true,
        Ok(_) => {}
        Err(_) => return true,
    }
    match flags() {
        Ok(f) => f & FS_CASEFOLD_FL != 0,
        Err(libc::ENOTTY | libc::EOPNOTSUPP) => false,
        Err(_) => true,
    }
}

const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_CASEFOLD_FL: libc::c_long = 0x4000_0000;

fn openat_entry_raw(dir: &OwnedFd, name: &std::ffi::CStr, flags: i32) -> Result<OwnedFd, i32> {
    // SAFETY: our own path and descriptor; the result is a new descriptor.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The command's process: send the gate's listener (or nothing: the kernel lacks what the gate
/// needs) to PID 1 on `to`, the command's end of the gate's socket pair (corral-sandbox's
/// `seccomp::install_and_send`, just before exec). One byte, the listener with it as
/// SCM_RIGHTS.
pub fn send_listener(to: RawFd, listener: Option<&OwnedFd>) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds: Vec<RawFd> = listener.map(|l| vec![l.as_raw_fd()]).unwrap_or_default();
    let cmsgs: Vec<ControlMessage> = if fds.is_empty() {
        vec![]
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    loop {
        match sendmsg::<()>(
            to,
            &[io::IoSlice::new(b"L")],
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// PID 1's gate thread: the listener [`send_listener`] sent, or `None` (nothing sent, the
/// socket closed, or anything but one descriptor).
pub fn receive_listener(from: &OwnedFd) -> Option<OwnedFd> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut fds = Vec::new();
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let msg = loop {
        match recvmsg::<()>(
            from.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => break msg,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    };
    for c in msg.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(r) = c {
            // SAFETY: the kernel just installed these descriptors in this process for us.
            fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if msg.bytes != 1 || fds.len() != 1 {
        return None;
    }
    fds.pop()
}

impl Gate {
    /// Serve `listener` on this thread, under SCHED_IDLE, and on a second one under this
    /// thread's policy while every CPU is busy ([`Shift`]), until no process holds its filter;
    /// return once both threads ended (what [`Gate::serve`]'s thread runs, once it has the
    /// listener). Without the second thread, this one serves alone under its own policy.
    pub fn work(self, listener: OwnedFd) {
        let both = std::sync::Arc::new((self, listener, Shift::new()));
        let other = both.clone();
        // Made before this thread takes SCHED_IDLE, which a new thread would inherit; it has
        // this thread's capabilities (CAP_SYS_PTRACE alone) too.
        let spawned = std::thread::Builder::new()
            .name("corral-gate-n".into())
            .spawn(move || {
                let (gate, listener, shift) = &*other;
                worker(gate, listener, Some((shift, Role::Normal)));
            });
        let (gate, listener, shift) = &*both;
        match spawned {
            Ok(other) => {
                idle_policy();
                worker(gate, listener, Some((shift, Role::Idle)));
                // This worker's end ended the other's turn (`Ends`).
                let _ = other.join();
            }
            Err(_) => worker(gate, listener, None),
        }
    }
}

fn worker(gate: &Gate, listener: &OwnedFd, shift: Option<(&Shift, Role)>) {
    /// However this thread ends, the other one ends too (it may wait for its turn).
    struct Ends<'a>(Option<&'a Shift>);
    impl Drop for Ends<'_> {
        fn drop(&mut self) {
            if let Some(shift) = self.0 {
                shift.finish();
            }
        }
    }
    let _ends = Ends(shift.map(|(s, _)| s));
    // Each thread its own umask (set to the caller's before each creation).
    // SAFETY: unshare of this thread's fs attributes only.
    if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
        eprintln!(
            "corral: jail: name gate: unshare(CLONE_FS) failed: {}",
            io::Error::last_os_error()
        );
        return;
    }
    loop {
        if let Some((shift, role)) = shift
            && !shift.wait_turn(role)
        {
            return;
        }
        // A call to answer, or none ever again: once no process holds the filter (the jail's
        // command and all it started are gone), the listener reports a hang-up with nothing
        // to read (Linux 5.9+). A RECV alone would block then until PID 1 exits, or (Linux
        // 6.11+) fail at once with ENOENT, which reads as one caller's death: retried, it
        // spun on a CPU the jail's end needed.
        match next_call(listener) {
            ListenerWait::Call => {}
            ListenerWait::Again => continue,
            ListenerWait::Gone => return,
        }
        // SAFETY: seccomp_notif is plain data; the kernel wants it zeroed.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: the RECV ioctl fills `req`, which is the size the request number encodes.
        let rc = unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV as _,
                &mut req,
            )
        };
        if rc != 0 {
            match io::Error::last_os_error().raw_os_error() {
                // The caller died, or a signal: next one.
                Some(libc::ENOENT | libc::EINTR) => continue,
                // The jail is gone (no filter left holding the listener).
                _ => return,
            }
        }
        let call = Call {
            id: req.id,
            tid: req.pid as libc::pid_t,
            nr: i64::from(req.data.nr),
            args: req.data.args,
        };
        let verdict = handle(gate, listener, &call);
        respond(listener, call.id, verdict);
        if let Some((shift, role)) = shift {
            shift.after_call(role);
        }
    }
}

/// What waiting on the seccomp listener gave.
enum ListenerWait {
    /// A notification waits to be received.
    Call,
    /// Nothing yet (a signal): wait again.
    Again,
    /// No process holds the filter any more, or the listener failed: the gate is done.
    Gone,
}

/// Wait until `listener` has a notification, or reports that no process uses its filter.
fn next_call(listener: &OwnedFd) -> ListenerWait {
    let mut p = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of ours.
    if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
        return match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => ListenerWait::Again,
            _ => ListenerWait::Gone,
        };
    }
    if p.revents & libc::POLLIN != 0 {
        ListenerWait::Call
    } else if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        ListenerWait::Gone
    } else {
        ListenerWait::Again
    }
}

struct Call {
    id: u64,
    tid: libc::pid_t,
    nr: i64,
    args: [u64; 6],
}

impl Call {
    fn fd_arg(&self, i: usize) -> i32 {
        self.args[i] as u32 as i32
    }
    fn int_arg(&self, i: usize) -> i32 {
        self.args[i] as u32 as i32
    }
}

/// What the caller's syscall returns.
enum Verdict {
    /// This value (0 for the calls that return no descriptor).
    Value(i64),
    /// -1 with this errno.
    Errno(i32),
    /// Install this descriptor in the caller and return its number.
    Fd(OwnedFd, bool),
    /// Already answered (a blocking open finished on its own thread).
    Answered,
    /// Let the call run as the caller made it (a call with no path: nothing to re-read).
    Continue,
}

fn respond(listener: &OwnedFd, id: u64, verdict: Verdict) {
    match verdict {
        Verdict::Answered => {}
        Verdict::Continue => {
            let resp = libc::seccomp_notif_resp {
                id,
                val: 0,
                error: 0,
                flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
            };
            // SAFETY: SEND reads `resp`.
            unsafe {
                libc::ioctl(
                    listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_SEND as _,
                    &resp,
                )
            };
        }
        Verdict::Fd(fd, cloexec) => {
            let addfd = libc::seccomp_notif_addfd {
                id,
                flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                srcfd: fd.as_raw_fd() as u32,
                newfd: 0,
                newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
            };
            // SAFETY: ADDFD reads `addfd`; with SEND it also answers the notification.
            let rc = unsafe {
                libc::ioctl(
                    listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_ADDFD as _,
                    &addfd,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                // EMFILE and the like: the caller gets the error (ENOENT: it is gone).
                if e != libc::ENOENT {
                    send(listener, id, 0, e);
                }
            }
        }
        Verdict::Value(v) => send(listener, id, v, 0),
        Verdict::Errno(e) => send(listener, id, 0, e),
    }
}

fn send(listener: &OwnedFd, id: u64, val: i64, error: i32) {
    let resp = libc::seccomp_notif_resp {
        id,
        val,
        error: -error,
        flags: 0,
    };
    // SAFETY: SEND reads `resp`; ENOENT (the caller died meanwhile) needs nothing more.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND as _,
            &resp,
        )
    };
}

/// The caller, as the gate reads it: its memory, and its ids in /proc.
pub struct Caller<'a, S = Real> {
    tid: libc::pid_t,
    id: u64,
    listener: &'a OwnedFd,
    gate: &'a Gate<S>,
}

impl<S: Sys> Caller<'_, S> {
    /// Is the notification still pending? Then the caller is alive and blocked in its call, so
    /// what was just read from `tid` was read from it (a tid is reused only once its task is
    /// gone, and the notification goes with it).
    fn still_waiting(&self) -> Result<(), i32> {
        match self.gate.sys.notification_valid(self.listener, self.id) {
            true => Ok(()),
            false => Err(libc::ENOENT),
        }
    }

    /// The NUL-terminated string at `addr` in the caller's memory (process_vm_readv: PID 1 is
    /// an ancestor of every jail process, which Yama's ptrace_scope=1 asks for).
    fn string(&self, addr: u64) -> Result<Vec<u8>, i32> {
        if addr == 0 {
            return Err(libc::EFAULT);
        }
        let mut out = Vec::new();
        let mut at = addr;
        let mut buf = [0u8; 4096];
        while out.len() < PATH_MAX {
            // Up to the end of the page: the next one may be unmapped.
            let chunk = ((4096 - (at % 4096)) as usize).min(PATH_MAX - out.len());
            let n = match self.read_mem(at, &mut buf[..chunk]) {
                Ok(0) => Err(libc::EFAULT),
                Ok(n) => Ok(n),
                Err(libc::ESRCH) => Err(libc::ENOENT),
                Err(libc::EPERM) => Err(libc::EPERM),
                Err(_) => Err(libc::EFAULT),
            }?;
            if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
                out.extend_from_slice(&buf[..end]);
                self.still_waiting()?;
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
            at += n as u64;
        }
        Err(libc::ENAMETOOLONG)
    }

    /// `len` bytes at `addr` in the caller's memory (a socket address).
    fn bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, i32> {
        let mut buf = vec![0u8; len];
        if len == 0 {
            return Ok(buf);
        }
        if self.read_mem(addr, &mut buf) != Ok(len) {
            return Err(libc::EFAULT);
        }
        self.still_waiting()?;
        Ok(buf)
    }

    /// process_vm_readv of `buf.len()` bytes at `addr`: the bytes read, or the errno.
    fn read_mem(&self, addr: u64, buf: &mut [u8]) -> Result<usize, i32> {
        self.gate.sys.read_mem(self.tid, addr, buf)
    }

    /// Take the caller's umask for the creation about to be performed on this thread.
    fn take_umask(&self) -> Result<(), i32> {
        self.gate.sys.take_umask(self)
    }

    /// The directory a relative path of the caller starts from.
    fn dirfd(&self, fd: i32) -> Result<OwnedFd, i32> {
        let link = match fd {
            libc::AT_FDCWD => format!("/proc/{}/cwd", self.tid),
            n if n >= 0 => format!("/proc/{}/fd/{n}", self.tid),
            _ => return Err(libc::EBADF),
        };
        let fd = (self.gate.sys)
            .open_path(libc::AT_FDCWD, link.as_bytes(), 0)
            .map_err(|e| match e {
                libc::ENOENT => libc::EBADF,
                e => e,
            })?;
        // Opened from the caller's tid: still the caller's (not a reused tid's).
        self.still_waiting()?;
        Ok(fd)
    }

    /// The caller's own names for itself, in terms of its /proc directory.
    fn translate(&self, path: &[u8]) -> Vec<u8> {
        let own = format!("/proc/{}", self.tid).into_bytes();
        let std = |n: &str| [own.as_slice(), b"/fd/", n.as_bytes()].concat();
        match path {
            b"/dev/stdin" => return std("0"),
            b"/dev/stdout" => return std("1"),
            b"/dev/stderr" => return std("2"),
            _ => {}
        }
        for (prefix, with) in [
            (&b"/dev/fd"[..], [own.as_slice(), b"/fd"].concat()),
            (b"/proc/self", own.clone()),
            (b"/proc/thread-self", own.clone()),
        ] {
            if let Some(rest) = path.strip_prefix(prefix)
                && (rest.is_empty() || rest[0] == b'/')
            {
                return [with.as_slice(), rest].concat();
            }
        }
        path.to_vec()
    }
}

/// Where a path names an entry: the directory holding it, and its last component (with any
/// trailing slashes, which the kernel interprets).
struct Entry {
    parent: OwnedFd,
    last: Vec<u8>,
    /// `parent` is on one of the jail's own file systems (its device is one of the gate's
    /// `private_devs`, as fstat said when the path was resolved): nothing there is the host's,
    /// so no rule, protected file or record applies to a name in it.
    private: bool,
}

impl Entry {
    /// The last component without trailing slashes: the name checked.
    fn name(&self) -> &[u8] {
        let end = self
            .last
            .iter()
            .rposition(|&b| b != b'/')
            .map_or(0, |i| i + 1);
        &self.last[..end]
    }
    fn c_last(&self) -> CString {
        CString::new(self.last.clone()).unwrap_or_default()
    }
}

/// Where a caller's path leads: a plain entry (a directory and a last component), or one of
/// the caller's own /proc entries, which PID 1 reopens for it.
enum Resolved {
    Entry(Entry),
    /// `/proc/TID/fd/N`, `/proc/TID/cwd`, `/proc/TID/root` (the caller's own files, through
    /// their magic links: opened as the caller would), or one plain file of `/proc/TID/`
    /// (`oom_score_adj`), which is opened beneath `/proc/TID` with no link followed.
    Own(OwnProc),
}

enum OwnProc {
    /// The path of the caller's magic link.
    Magic(String),
    /// `/proc/TID` and one plain name in it.
    File(OwnedFd, Vec<u8>),
}

impl OwnProc {
    /// Open it with `flags` (no O_CREAT: it exists; O_EXCL makes that EEXIST, and a
    /// directory opened to create gives EISDIR, as the kernel would say), `mode` for an
    /// O_TMPFILE in it.
    fn open(&self, flags: i32, mode: libc::mode_t) -> Result<OwnedFd, i32> {
        if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
            return Err(libc::EEXIST);
        }
        let flags = (flags & !(libc::O_CREAT | libc::O_EXCL)) | libc::O_NOCTTY | libc::O_CLOEXEC;
        let fd = match self {
            OwnProc::Magic(link) => {
                let c = CString::new(link.as_bytes()).map_err(|_| libc::EINVAL)?;
                // SAFETY: our own path; the result is a new descriptor.
                let fd = unsafe { libc::open(c.as_ptr(), flags, mode as libc::c_uint) };
                if fd < 0 {
                    return Err(errno());
                }
                // SAFETY: fresh descriptor.
                unsafe { OwnedFd::from_raw_fd(fd) }
            }
            OwnProc::File(dir, name) => openat2_beneath(dir, name, flags)?,
        };
        Ok(fd)
    }

    /// An O_PATH descriptor of it (for link).
    fn path_fd(&self) -> Result<OwnedFd, i32> {
        match self {
            OwnProc::Magic(link) => open_path(libc::AT_FDCWD, OsStr::new(link), 0),
            OwnProc::File(dir, name) => openat2_beneath(dir, name, libc::O_PATH),
        }
    }
}

fn resolve<S: Sys>(caller: &Caller<S>, dirfd: i32, path: &[u8]) -> Result<Resolved, i32> {
    let sys = &caller.gate.sys;
    if path.is_empty() {
        return Err(libc::ENOENT);
    }
    let path = caller.translate(path);
    let own = format!("/proc/{}/", caller.tid).into_bytes();
    if let Some(rest) = path.strip_prefix(own.as_slice()) {
        let (first, tail) = split_first(rest);
        let link = |what: &str| format!("/proc/{}/{what}", caller.tid);
        let magic = match first {
            b"fd" => {
                let (n, tail2) = split_first(tail);
                (!n.is_empty() && n.iter().all(u8::is_ascii_digit))
                    .then(|| (link(&format!("fd/{}", String::from_utf8_lossy(n))), tail2))
            }
            b"cwd" => Some((link("cwd"), tail)),
            b"root" => Some((link("root"), tail)),
            _ => None,
        };
        if let Some((link, tail)) = magic {
            if tail.iter().all(|&b| b == b'/') {
                return Ok(Resolved::Own(OwnProc::Magic(link)));
            }
            // Below the caller's own directory descriptor, cwd or root: resolved from there.
            let base = sys.open_path(libc::AT_FDCWD, link.as_bytes(), 0)?;
            return split(caller.gate, Base::Owned(base), tail).map(Resolved::Entry);
        }
        // One plain name of the caller's /proc directory, nothing else.
        if tail.is_empty() && !first.is_empty() && first != b"." && first != b".." {
            let dir = sys.open_path(libc::AT_FDCWD, link("").as_bytes(), libc::O_DIRECTORY)?;
            return Ok(Resolved::Own(OwnProc::File(dir, first.to_vec())));
        }
        return Err(libc::EACCES);
    }
    let base = if path[0] == b'/' {
        Base::Root(caller.gate.root()?)
    } else {
        Base::Owned(caller.dirfd(dirfd)?)
    };
    split(caller.gate, base, &path).map(Resolved::Entry)
}

/// Where [`split`] starts: a descriptor of the caller's (its cwd, a directory descriptor), or
/// the gate's own root (PID 1's `/`, the jail's, opened once: the jail cannot mount).
enum Base<'a> {
    Owned(OwnedFd),
    Root(&'a OwnedFd),
}

fn split_first(p: &[u8]) -> (&[u8], &[u8]) {
    match p.iter().position(|&b| b == b'/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (p, &[]),
    }
}

/// Open the directory part of `path` (relative to `base`) and return it with the last
/// component. A directory on /proc is refused (another process's files, /proc/sys): PID 1
/// may reach more of /proc than the caller; the caller's own entries are [`resolve`]'s.
///
/// The directory's device is read once here: on one of the jail's own file systems (a tmpfs
/// the jail made, never /proc) the name needs no further check ([`Entry::private`]).
fn split<S: Sys>(gate: &Gate<S>, base: Base<'_>, path: &[u8]) -> Result<Entry, i32> {
    let sys = &gate.sys;
    let owned = |base: Base<'_>| match base {
        Base::Owned(fd) => Ok(fd),
        Base::Root(_) => sys.open_path(libc::AT_FDCWD, b"/", libc::O_DIRECTORY),
    };
    let trimmed_end = path.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
    let (parent, last) = if trimmed_end == 0 {
        // "/" or "///": the root itself.
        (owned(base)?, b".".to_vec())
    } else {
        let (dir, last) = match path[..trimmed_end].iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..=i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        let parent = if dir.is_empty() {
            owned(base)?
        } else {
            let from = match &base {
                Base::Owned(fd) => fd,
                Base::Root(fd) => *fd,
            };
            sys.openat2_path(from, dir, libc::O_DIRECTORY)?
        };
        (parent, last.to_vec())
    };
    let private = sys
        .fstat(&parent)
        .is_ok_and(|st| gate.private_devs.contains(&st.st_dev));
    if !private && sys.fstatfs_type(&parent)? == PROC_SUPER_MAGIC {
        return Err(libc::EACCES);
    }
    Ok(Entry {
        parent,
        last,
        private,
    })
}

fn handle<S: Sys>(gate: &Gate<S>, listener: &OwnedFd, call: &Call) -> Verdict {
    if continues(call.nr) {
        // The caller's umask changes: forget every one known (threads share theirs).
        gate.umasks.changing(call.tid);
        return Verdict::Continue;
    }
    let caller = Caller {
        tid: call.tid,
        id: call.id,
        listener,
        gate,
    };
    match perform(gate, listener, &caller, call) {
        Ok(v) => v,
        Err(e) => Verdict::Errno(e),
    }
}

/// Is the stopped call `nr` let continue (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`)? Only a call
/// whose outcome depends on nothing the gate read: the kernel runs it again from the caller's
/// registers, memory and descriptor table, which the jail can change after any check. umask(2)
/// takes one integer and no path or descriptor; the gate checks nothing on it (it only forgets
/// the umasks it knows). Every other stopped call is performed here, on what was checked.
pub fn continues(nr: i64) -> bool {
    nr == libc::SYS_umask
}

fn perform<S: Sys>(
    gate: &Gate<S>,
    listener: &OwnedFd,
    caller: &Caller<S>,
    call: &Call,
) -> Result<Verdict, i32> {
    let a = &call.args;
    let s = |i: usize| caller.string(a[i]);
    match call.nr {
        libc::SYS_openat => open(
            gate,
            listener,
            caller,
            call,
            call.fd_arg(0),
            &s(1)?,
            call.int_arg(2),
            a[3] as libc::mode_t,
        ),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open => open(
            gate,
            listener,
            caller,
            call,
            libc::AT_FDCWD,
            &s(0)?,
            call.int_arg(1),
            a[2] as libc::mode_t,
        ),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_creat => open(
            gate,
            listener,
            caller,
            call,
            libc::AT_FDCWD,
            &s(0)?,
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            a[1] as libc::mode_t,
        ),
        libc::SYS_mkdirat => mkdir(gate, caller, call.fd_arg(0), &s(1)?, a[2] as libc::mode_t),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mkdir => mkdir(gate, caller, libc::AT_FDCWD, &s(0)?, a[1] as libc::mode_t),
        libc::SYS_mknodat => mknod(
            gate,
            caller,
            call.fd_arg(0),
            &s(1)?,
            a[2] as libc::mode_t,
            a[3],
        ),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mknod => mknod(
            gate,
            caller,
            libc::AT_FDCWD,
            &s(0)?,
            a[1] as libc::mode_t,
            a[2],
        ),
        libc::SYS_symlinkat => symlink(gate, caller, &s(0)?, call.fd_arg(1), &s(2)?),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_symlink => symlink(gate, caller, &s(0)?, libc::AT_FDCWD, &s(1)?),
        libc::SYS_linkat => {
            let flags = call.int_arg(4);
            // With AT_EMPTY_PATH a NULL path is taken for the empty one (the descriptor
            // itself is linked, and the new name checked as any); any other path is read, and
            // a read that fails is the caller's error, never "empty".
            let old = if flags & libc::AT_EMPTY_PATH != 0 && a[1] == 0 {
                Vec::new()
            } else {
                s(1)?
            };
            link(
                gate,
                caller,
                call.fd_arg(0),
                &old,
                call.fd_arg(2),
                &s(3)?,
                flags,
            )
        }
        #[cfg(target_arch = "x86_64")]
        libc::SYS_link => link(
            gate,
            caller,
            libc::AT_FDCWD,
            &s(0)?,
            libc::AT_FDCWD,
            &s(1)?,
            0,
        ),
        libc::SYS_renameat2 => rename(
            gate,
            caller,
            call.fd_arg(0),
            &s(1)?,
            call.fd_arg(2),
            &s(3)?,
            a[4] as u32,
        ),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_renameat => rename(
            gate,
            caller,
            call.fd_arg(0),
            &s(1)?,
            call.fd_arg(2),
            &s(3)?,
            0,
        ),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_rename => rename(
            gate,
            caller,
            libc::AT_FDCWD,
            &s(0)?,
            libc::AT_FDCWD,
            &s(1)?,
            0,
        ),
        libc::SYS_bind => bind(gate, caller, call.fd_arg(0), a[1], a[2]),
        libc::SYS_truncate => truncate(gate, caller, &s(0)?, a[1] as i64),
        libc::SYS_unlinkat => unlink(gate, caller, call.fd_arg(0), &s(1)?, call.int_arg(2)),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_unlink => unlink(gate, caller, libc::AT_FDCWD, &s(0)?, 0),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_rmdir => unlink(gate, caller, libc::AT_FDCWD, &s(0)?, libc::AT_REMOVEDIR),
        libc::SYS_fchmodat => chmod(
            gate,
            caller,
            call.fd_arg(0),
            &s(1)?,
            a[2] as libc::mode_t,
            0,
        ),
        SYS_FCHMODAT2 => {
            let flags = call.int_arg(3);
            let path = if flags & libc::AT_EMPTY_PATH != 0 && a[1] == 0 {
                Vec::new()
            } else {
                s(1)?
            };
            chmod(
                gate,
                caller,
                call.fd_arg(0),
                &path,
                a[2] as libc::mode_t,
                flags,
            )
        }
        libc::SYS_fchmod => fchmod(gate, caller, call.fd_arg(0), a[1] as libc::mode_t),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_chmod => chmod(
            gate,
            caller,
            libc::AT_FDCWD,
            &s(0)?,
            a[1] as libc::mode_t,
            0,
        ),
        _ => Err(libc::ENOSYS),
    }
}

/// bind(2), performed here for every socket: a Unix socket bound to a path is a new name (a
/// socket passes git's `access(objects, X_OK)` check). The caller's socket is taken once with
/// pidfd_getfd and its address read once from the caller's memory; the bind is made on that
/// socket with that copy, whatever the family. Letting a bind of another family continue would
/// have the kernel look the descriptor number and the address up again, after another thread
/// of the caller swapped in a Unix socket (dup2) or rewrote the address: a name never checked.
/// A Unix socket is bound to an abstract or unnamed address as asked, to a path through the
/// checked directory (`/proc/self/fd/DIR/NAME`). The gate's thread has the caller's uid and
/// Landlock domain and no capability the caller lacks (CAP_SYS_PTRACE only), and a socket
/// keeps its network namespace: the bind is what the caller's own would have been.
fn bind<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    fd: i32,
    addr: u64,
    len: u64,
) -> Result<Verdict, i32> {
    let sock = caller_fd(caller, fd)?;
    let domain = gate.sys.socket_domain(&sock)?;
    let len = bind_len(len)?;
    let raw = caller.bytes(addr, len)?;
    let held = match bind_address(domain, &raw)? {
        Address::AsGiven => None,
        Address::Path(path) => {
            let entry = new_entry(caller, libc::AT_FDCWD, &path)?;
            gate.protected_entry(&entry, Use::Bind)?;
            let lock = check(gate, &entry)?;
            caller.take_umask()?;
            Some((entry, lock))
        }
    };
    let (storage, slen) = match &held {
        None => sockaddr_of(&raw),
        Some((entry, _)) => {
            let via = format!("/proc/self/fd/{}/", entry.parent.as_raw_fd()).into_bytes();
            let full = [via.as_slice(), entry.last.as_slice()].concat();
            sockaddr_un_of(&full)?
        }
    };
    // `sock` is our duplicate of the caller's socket.
    gate.sys.bind(&sock, &storage, slen)?;
    Ok(Verdict::Value(0))
}

/// The caller's descriptor `fd`, duplicated into this process (pidfd_getfd): what the caller's
/// table holds now; a later dup2 in the caller changes its table, not this descriptor.
fn caller_fd<S: Sys>(caller: &Caller<S>, fd: i32) -> Result<OwnedFd, i32> {
    let got = caller.gate.sys.caller_fd(caller.tid, fd)?;
    // Taken from the caller's tid: still the caller's (not a reused tid's).
    caller.still_waiting()?;
    Ok(got)
}

/// bind(2)'s length argument as the kernel takes it (an int, at most a sockaddr_storage).
fn bind_len(len: u64) -> Result<usize, i32> {
    let len = len as u32 as i32;
    if len < 0 || len as usize > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(libc::EINVAL);
    }
    Ok(len as usize)
}

/// What a bind's address makes.
#[derive(Debug, PartialEq, Eq)]
enum Address {
    /// No name in a directory (another family, an abstract or unnamed Unix address, or one
    /// the kernel refuses): bound with the bytes read, as given.
    AsGiven,
    /// A Unix socket file at this path: checked, and bound through the checked directory.
    Path(Vec<u8>),
}

/// What the address `raw` (read once from the caller) makes for a socket of `domain`.
fn bind_address(domain: libc::c_int, raw: &[u8]) -> Result<Address, i32> {
    if domain != libc::AF_UNIX {
        return Ok(Address::AsGiven);
    }
    if raw.len() > std::mem::size_of::<libc::sockaddr_un>() {
        return Err(libc::EINVAL);
    }
    let path_off = std::mem::size_of::<libc::sa_family_t>();
    let family = raw
        .get(..path_off)
        .map(|f| libc::sa_family_t::from_ne_bytes([f[0], f[1]]));
    if family != Some(libc::AF_UNIX as libc::sa_family_t) {
        // The kernel refuses it (EINVAL): nothing is named.
        return Ok(Address::AsGiven);
    }
    let rest = &raw[path_off..];
    if rest.first().is_none_or(|&b| b == 0) {
        // Unnamed (autobind) or abstract.
        return Ok(Address::AsGiven);
    }
    Ok(Address::Path(
        rest.iter().take_while(|&&b| b != 0).copied().collect(),
    ))
}

/// `raw` as a socket address of its own length.
fn sockaddr_of(raw: &[u8]) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = raw.len().min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: at most sizeof(sockaddr_storage) bytes copied into it.
    unsafe {
        std::ptr::copy_nonoverlapping(
            raw.as_ptr(),
            (&mut ss as *mut libc::sockaddr_storage).cast::<u8>(),
            n,
        )
    };
    (ss, n as libc::socklen_t)
}

/// A Unix socket address for `path` (NUL-terminated).
fn sockaddr_un_of(path: &[u8]) -> Result<(libc::sockaddr_storage, libc::socklen_t), i32> {
    // SAFETY: sockaddr_un is plain data.
    let un: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.len() >= un.sun_path.len() {
        return Err(libc::ENAMETOOLONG);
    }
    let family = (libc::AF_UNIX as libc::sa_family_t).to_ne_bytes();
    let raw = [family.as_slice(), path, &[0]].concat();
    Ok(sockaddr_of(&raw))
}

/// Check the name `entry` would create. For a `HEAD` or an `objects` (whose rule depends on
/// what the directory holds), the directory stays locked (flock) until the returned guard is
/// dropped, after the creation: the jail's other gates (an executor command's, another run's
/// in the same project) take the same lock, so one of a pair always sees the other.
fn check<S: Sys>(gate: &Gate<S>, entry: &Entry) -> Result<Option<OwnedFd>, i32> {
    if entry.private {
        // The jail's own file systems: nothing the host reads, so any name may be made
        // (what `allows` and `hide_allows` each say there).
        return Ok(None);
    }
    let name = entry.name();
    let class = Refusal::of(name);
    let paired = matches!(class, Some((Refusal::Head | Refusal::Part, _)));
    let lock = if paired {
        Some(gate.sys.lock_dir(&entry.parent)?)
    } else {
        None
    };
    gate.allows(&entry.parent, name, class).map_err(|kind| {
        gate.report(kind, &entry.parent, name);
        libc::EPERM
    })?;
    gate.hide_allows(entry).map_err(|pattern| {
        gate.report_hidden(&entry.parent, name, &pattern);
        libc::EACCES
    })?;
    Ok(lock)
}

/// An exclusive flock on `dir` (a descriptor of its own), waited for at most 5 s: a process
/// of the jail holding it longer gets its creation refused (EAGAIN) rather than stall the gate.
fn lock_dir(dir: &OwnedFd) -> Result<OwnedFd, i32> {
    let d = openat_entry_raw(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY)?;
    for _ in 0..500 {
        // SAFETY: flock on our own descriptor.
        if unsafe { libc::flock(d.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(d);
        }
        match errno() {
            libc::EWOULDBLOCK | libc::EINTR => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            e => return Err(e),
        }
    }
    Err(libc::EAGAIN)
}

/// The entry a new name goes in: only a plain entry (not one of the caller's /proc files).
fn new_entry<S: Sys>(caller: &Caller<S>, dirfd: i32, path: &[u8]) -> Result<Entry, i32> {
    match resolve(caller, dirfd, path)? {
        Resolved::Entry(e) => Ok(e),
        // /proc files and the caller's descriptors exist: nothing new is named there.
        Resolved::Own(..) => Err(libc::EEXIST),
    }
}

#[allow(clippy::too_many_arguments)]
fn open<S: Sys>(
    gate: &Gate<S>,
    listener: &OwnedFd,
    caller: &Caller<S>,
    call: &Call,
    dirfd: i32,
    path: &[u8],
    flags: i32,
    mode: libc::mode_t,
) -> Result<Verdict, i32> {
    let cloexec = flags & libc::O_CLOEXEC != 0;
    let creates = flags & libc::O_CREAT != 0;
    // O_EXCL means "do not follow" only with O_CREAT.
    let follows = flags & libc::O_NOFOLLOW == 0 && !(creates && flags & libc::O_EXCL != 0);
    let (entry, existing) = match follow(gate, caller, dirfd, path, follows, creates)? {
        Target::Entry(entry, existing) => (entry, existing),
        Target::Own(own) => return own_open(gate, caller, &own, flags, mode),
    };
    let kind = existing.map(|st| st.st_mode & libc::S_IFMT);
    let mut flags = flags;
    if creates && existing.is_some() {
        // What exists is not created: O_EXCL says so first, and an O_CREAT of a directory is
        // refused, as the kernel does; a read-only O_CREAT of a file opens it, makes nothing.
        if flags & libc::O_EXCL != 0 {
            return Err(libc::EEXIST);
        }
        if kind == Some(libc::S_IFDIR) {
            return Err(libc::EISDIR);
        }
        if !writes(flags) {
            flags &= !libc::O_CREAT;
        }
    }
    let creates = flags & libc::O_CREAT != 0;
    if writes(flags) || creates {
        gate.protected_entry(
            &entry,
            if writes(flags) {
                Use::Write
            } else {
                Use::Create
            },
        )?;
    }
    // The name a creating open ends at, whether or not it exists now (it may be gone by
    // the time of the open, which then creates it), a directory too (it may be removed
    // meanwhile). An open that cannot create has no name to check.
    let _held = if creates { check(gate, &entry)? } else { None };
    if writes(flags) || creates {
        record::before(gate.record.as_ref(), &entry)?;
    }
    match existing {
        Some(st) if kind == Some(libc::S_IFCHR) && st.st_rdev == libc::makedev(5, 0) => {
            // /dev/tty: the caller's controlling terminal, not PID 1's.
            return controlling_tty(caller, flags).map(|fd| Verdict::Fd(fd, cloexec));
        }
        Some(_) if kind == Some(libc::S_IFIFO) && flags & libc::O_NONBLOCK == 0 => {
            // A blocking FIFO open waits for the other end: on its own thread, so the gate
            // keeps serving the rest of the jail meanwhile.
            return Ok(open_fifo_later(
                gate, listener, call.id, entry, flags, cloexec,
            ));
        }
        _ => {}
    }
    if creates || flags & libc::O_TMPFILE == libc::O_TMPFILE {
        // It may be created (or be gone and created by the open): with the caller's umask.
        caller.take_umask()?;
    }
    // A device may block its open (a FIFO went to its own thread above): open it without
    // waiting, then as the caller asked. O_TRUNC waits for the file's check.
    let device = matches!(kind, Some(libc::S_IFCHR | libc::S_IFBLK));
    let nonblock = if device { libc::O_NONBLOCK } else { 0 };
    let open_flags = (flags & !libc::O_TRUNC) | libc::O_NOFOLLOW | nonblock;
    if creates && existing.is_none() {
        // Nothing at the name when it was looked up: made with O_EXCL, the file is the one this
        // open created (the kernel's own open truncates no file it created), unless another
        // process made the name meanwhile, which is then opened as any existing file is.
        match gate
            .sys
            .openat(&entry.parent, &entry.last, open_flags | libc::O_EXCL, mode)
        {
            Ok(fd) => {
                // A new file: `protected_entry` above checked its one name and directory, and
                // no other name can lead to an inode made just now (a link or rename to it is
                // the gate's, checked as its own name), so nothing protected is written
                // through it.
                return Ok(Verdict::Fd(fd, cloexec));
            }
            Err(libc::EEXIST) if flags & libc::O_EXCL == 0 => {}
            Err(e) => return Err(e),
        }
    }
    let fd = gate
        .sys
        .openat(&entry.parent, &entry.last, open_flags, mode)?;
    let fd = checked_write_open(gate, fd, flags)?;
    if device && flags & libc::O_NONBLOCK == 0 {
        set_blocking(&fd);
    }
    Ok(Verdict::Fd(fd, cloexec))
}

/// Where an open of `path` ends.
enum Target {
    /// A name (which may not exist: it is created) and what is there now.
    Entry(Entry, Option<libc::stat>),
    /// One of the caller's own /proc entries.
    Own(OwnProc),
}

/// Resolve `path` as the kernel would for an open: a final symlink is followed when `follows`,
/// here, one hop at a time, so the name finally opened or created is the one checked.
fn follow<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    dirfd: i32,
    path: &[u8],
    follows: bool,
    creates: bool,
) -> Result<Target, i32> {
    let mut entry = match resolve(caller, dirfd, path)? {
        Resolved::Entry(e) => e,
        Resolved::Own(own) => return Ok(Target::Own(own)),
    };
    for _ in 0..MAX_HOPS {
        if creates && entry.last.ends_with(b"/") && entry.name() != b"." && entry.name() != b".." {
            // O_CREAT with a trailing slash: the kernel refuses it so.
            return Err(libc::EISDIR);
        }
        // What cannot be looked up (EACCES while the jail toggles a directory's search
        // permission) is the caller's error, as the kernel's own lookup would say: taken for
        // absent, a link or a FIFO there would be opened as a plain file.
        let existing = entry_at(&gate.sys, &entry.parent, entry.name())?;
        if !follows || existing.is_none_or(|st| st.st_mode & libc::S_IFMT != libc::S_IFLNK) {
            return Ok(Target::Entry(entry, existing));
        }
        gate.may_follow(&entry, existing)?;
        let mut target = gate.sys.readlinkat(&entry.parent, entry.name())?;
        if entry.last.ends_with(b"/") {
            // `link/` must end at a directory, wherever the link leads.
            target.push(b'/');
        }
        entry = match target.first() {
            Some(b'/') => match resolve(caller, libc::AT_FDCWD, &target)? {
                Resolved::Entry(e) => e,
                Resolved::Own(own) => return Ok(Target::Own(own)),
            },
            _ => split(gate, Base::Owned(entry.parent), &target)?,
        };
    }
    Err(libc::ELOOP)
}

/// truncate(2): the file is opened for writing as an open of the path would be (links
/// followed here, a protected file refused) and cut to `len` through that descriptor.
fn truncate<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    path: &[u8],
    len: i64,
) -> Result<Verdict, i32> {
    let fd = match follow(gate, caller, libc::AT_FDCWD, path, true, false)? {
        Target::Own(own) => {
            let fd = own.open(libc::O_WRONLY | libc::O_NONBLOCK, 0)?;
            record::before_fd(gate.record.as_ref(), &fd)?;
            fd
        }
        Target::Entry(entry, existing) => {
            gate.protected_entry(&entry, Use::Write)?;
            match existing.map(|st| st.st_mode & libc::S_IFMT) {
                None => return Err(libc::ENOENT),
                Some(libc::S_IFDIR) => return Err(libc::EISDIR),
                Some(libc::S_IFREG) => {}
                Some(_) => return Err(libc::EINVAL),
            }
            record::before(gate.record.as_ref(), &entry)?;
            gate.sys.openat(
                &entry.parent,
                &entry.last,
                libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW,
                0,
            )?
        }
    };
    if gate.sys.fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(libc::EINVAL);
    }
    gate.protected_file(&fd, Use::Write)?;
    gate.sys.ftruncate(&fd, len)?;
    Ok(Verdict::Value(0))
}

/// Does an open with `flags` write (or truncate) what it opens? O_PATH opens nothing.
fn writes(flags: i32) -> bool {
    flags & libc::O_PATH == 0
        && (flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0)
}

/// An open performed without O_TRUNC: refused when it writes the file now at a protected name
/// (reached by a path that is not that name), else truncated as the caller asked (a regular
/// file only, as the kernel does: FIFOs, terminals and devices ignore O_TRUNC).
fn checked_write_open<S: Sys>(gate: &Gate<S>, fd: OwnedFd, flags: i32) -> Result<OwnedFd, i32> {
    if !writes(flags) {
        return Ok(fd);
    }
    gate.protected_file(&fd, Use::Write)?;
    let kind = gate.sys.fstat(&fd)?.st_mode & libc::S_IFMT;
    if flags & libc::O_TRUNC != 0 && kind == libc::S_IFDIR {
        // O_TRUNC asks to write: a directory refuses it, as the kernel would.
        return Err(libc::EISDIR);
    }
    if flags & libc::O_TRUNC != 0 && kind == libc::S_IFREG {
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            // O_RDONLY|O_TRUNC truncates too, given write permission, which truncate(2)
            // checks on the file as the open would have.
            gate.sys.truncate_through(&fd)?;
        } else {
            gate.sys.ftruncate(&fd, 0)?;
        }
    }
    Ok(fd)
}

/// The caller opening one of its own /proc entries (`/proc/self/fd/1` is `/dev/stdout`).
fn own_open<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    own: &OwnProc,
    flags: i32,
    mode: libc::mode_t,
) -> Result<Verdict, i32> {
    let cloexec = flags & libc::O_CLOEXEC != 0;
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        // An unnamed file in the caller's directory (`/proc/self/cwd`): the caller's umask.
        caller.take_umask()?;
    }
    let fd = own.open(flags & !libc::O_TRUNC, mode)?;
    if flags & libc::O_CREAT != 0 && gate.sys.fstat(&fd)?.st_mode & libc::S_IFMT == libc::S_IFDIR {
        return Err(libc::EISDIR);
    }
    if writes(flags) {
        record::before_fd(gate.record.as_ref(), &fd)?;
    }
    let fd = checked_write_open(gate, fd, flags)?;
    Ok(Verdict::Fd(fd, cloexec))
}

fn openat_entry(entry: &Entry, flags: i32, mode: libc::mode_t) -> Result<OwnedFd, i32> {
    let flags = flags | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: a path we own, on a directory descriptor we own; the result is a new descriptor.
    let fd = unsafe {
        libc::openat(
            entry.parent.as_raw_fd(),
            entry.c_last().as_ptr(),
            flags,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_blocking(fd: &OwnedFd) {
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// FIFO opens waiting at once, at most (each holds a thread of PID 1 until the other end
/// opens, or the jail ends).
const FIFO_WAITS_MAX: usize = 64;

/// A FIFO that exists: opened (never created: O_CREAT dropped, so a FIFO removed meanwhile
/// gives ENOENT) on a thread of its own, which answers the caller when the other end opens.
fn open_fifo_later<S: Sys>(
    gate: &Gate<S>,
    listener: &OwnedFd,
    id: u64,
    entry: Entry,
    flags: i32,
    cloexec: bool,
) -> Verdict {
    use std::sync::atomic::Ordering;
    if gate.fifo_waits.fetch_add(1, Ordering::SeqCst) >= FIFO_WAITS_MAX {
        gate.fifo_waits.fetch_sub(1, Ordering::SeqCst);
        return Verdict::Errno(libc::EAGAIN);
    }
    let Ok(listener) = listener.try_clone() else {
        gate.fifo_waits.fetch_sub(1, Ordering::SeqCst);
        return Verdict::Errno(libc::EMFILE);
    };
    let waits = gate.fifo_waits.clone();
    let spawned = std::thread::Builder::new()
        .name("corral-gate-fifo".into())
        .spawn(move || {
            let plain = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
            let verdict = match openat_entry(&entry, plain | libc::O_NOFOLLOW, 0) {
                // The name was a FIFO when checked; anything else now was put there meanwhile
                // (and would skip the checks of a file): try again.
                Ok(fd) if fstat(&fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO) => {
                    Verdict::Fd(fd, cloexec)
                }
                Ok(_) => Verdict::Errno(libc::EAGAIN),
                Err(e) => Verdict::Errno(e),
            };
            respond(&listener, id, verdict);
            waits.fetch_sub(1, Ordering::SeqCst);
        });
    match spawned {
        Ok(_) => Verdict::Answered,
        Err(_) => {
            gate.fifo_waits.fetch_sub(1, Ordering::SeqCst);
            Verdict::Errno(libc::EAGAIN)
        }
    }
}

/// `/dev/tty` for the caller: its controlling terminal (field 7 of /proc/PID/stat), which in
/// the jail can only be one of its own pseudo-terminals.
fn controlling_tty<S: Sys>(caller: &Caller<S>, flags: i32) -> Result<OwnedFd, i32> {
    let stat =
        std::fs::read_to_string(format!("/proc/{}/stat", caller.tid)).map_err(|_| libc::ESRCH)?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).ok_or(libc::ESRCH)?;
    let tty_nr: u32 = after
        .split_whitespace()
        .nth(4)
        .and_then(|v| v.parse().ok())
        .ok_or(libc::ESRCH)?;
    let major = (tty_nr >> 8) & 0xfff;
    let minor = (tty_nr & 0xff) | ((tty_nr >> 12) & 0xfff00);
    if tty_nr == 0 || !(136..=143).contains(&major) {
        return Err(libc::ENXIO);
    }
    let n = minor + (major - 136) * 256;
    OwnProc::Magic(format!("/dev/pts/{n}")).open(flags, 0)
}

fn mkdir<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    dirfd: i32,
    path: &[u8],
    mode: libc::mode_t,
) -> Result<Verdict, i32> {
    let entry = new_entry(caller, dirfd, path)?;
    // A name that is there already: the kernel's mkdir looks the name up first and says
    // EEXIST before any permission, mount or Landlock check, so nothing is checked, recorded
    // or made here either. `mkdir -p`, Python's `makedirs(exist_ok=True)` and git's object
    // directories mostly ask for directories that exist. A lookup that fails otherwise goes
    // the whole way, as any name.
    if let Ok(Some(_)) = entry_at(&gate.sys, &entry.parent, entry.name()) {
        return Err(libc::EEXIST);
    }
    gate.protected_entry(&entry, Use::Create)?;
    let _held = check(gate, &entry)?;
    record::before(gate.record.as_ref(), &entry)?;
    caller.take_umask()?;
    gate.sys.mkdirat(&entry.parent, &entry.last, mode)?;
    Ok(Verdict::Value(0))
}

fn mknod<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    dirfd: i32,
    path: &[u8],
    mode: libc::mode_t,
    dev: u64,
) -> Result<Verdict, i32> {
    let entry = new_entry(caller, dirfd, path)?;
    gate.protected_entry(&entry, Use::Create)?;
    let _held = check(gate, &entry)?;
    record::before(gate.record.as_ref(), &entry)?;
    caller.take_umask()?;
    gate.sys.mknodat(&entry.parent, &entry.last, mode, dev)?;
    Ok(Verdict::Value(0))
}

fn symlink<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    target: &[u8],
    dirfd: i32,
    path: &[u8],
) -> Result<Verdict, i32> {
    let entry = new_entry(caller, dirfd, path)?;
    gate.protected_entry(&entry, Use::Create)?;
    let _held = check(gate, &entry)?;
    record::before(gate.record.as_ref(), &entry)?;
    gate.sys.symlinkat(target, &entry.parent, &entry.last)?;
    Ok(Verdict::Value(0))
}

fn link<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    olddir: i32,
    old: &[u8],
    newdir: i32,
    new: &[u8],
    flags: i32,
) -> Result<Verdict, i32> {
    let entry = new_entry(caller, newdir, new)?;
    gate.protected_entry(&entry, Use::Create)?;
    let _held = check(gate, &entry)?;
    // The file linked: opened here (O_PATH) and linked through this process's own descriptor,
    // so no magic link is ever followed on the caller's behalf.
    let source = if old.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
        gate.sys.open_path(
            libc::AT_FDCWD,
            format!("/proc/{}/fd/{olddir}", caller.tid).as_bytes(),
            0,
        )?
    } else {
        match resolve(caller, olddir, old)? {
            Resolved::Own(own) => own.path_fd()?,
            Resolved::Entry(e) => {
                let nofollow = if flags & libc::AT_SYMLINK_FOLLOW == 0 {
                    libc::O_NOFOLLOW
                } else {
                    0
                };
                gate.sys.openat2_path(&e.parent, &e.last, nofollow)?
            }
        }
    };
    gate.protected_file(&source, Use::Link)?;
    record::before(gate.record.as_ref(), &entry)?;
    // The file linked gets a second name, through which it can be written unseen by its
    // first: its content is kept now.
    record::before_fd(gate.record.as_ref(), &source)?;
    gate.sys.link_fd(&source, &entry.parent, &entry.last)?;
    Ok(Verdict::Value(0))
}

fn rename<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    olddir: i32,
    old: &[u8],
    newdir: i32,
    new: &[u8],
    flags: u32,
) -> Result<Verdict, i32> {
    let to = new_entry(caller, newdir, new)?;
    let from = new_entry(caller, olddir, old)?;
    gate.protected_entry(&to, Use::Rename)?;
    gate.protected_entry(&from, Use::Rename)?;
    let _held_to = check(gate, &to)?;
    let mut _held_from = None;
    if flags & libc::RENAME_EXCHANGE != 0 {
        // Both names get a new entry.
        _held_from = check(gate, &from)?;
    }
    record::before_rename(
        gate.record.as_ref(),
        &from,
        &to,
        flags & libc::RENAME_EXCHANGE != 0,
    )?;
    gate.sys
        .renameat2(&from.parent, &from.last, &to.parent, &to.last, flags)?;
    Ok(Verdict::Value(0))
}

/// fchmodat2(2) (Linux 6.6), which takes flags; its number is the same on every architecture.
pub const SYS_FCHMODAT2: i64 = 452;

/// unlink/unlinkat/rmdir, performed here once the record kept what the name was (stopped only
/// when the run keeps a change record). The last component is never followed.
fn unlink<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    dirfd: i32,
    path: &[u8],
    flags: i32,
) -> Result<Verdict, i32> {
    if flags & !libc::AT_REMOVEDIR != 0 {
        return Err(libc::EINVAL);
    }
    let entry = new_entry(caller, dirfd, path)?;
    record::before(gate.record.as_ref(), &entry)?;
    gate.sys.unlinkat(&entry.parent, &entry.last, flags)?;
    Ok(Verdict::Value(0))
}

/// chmod/fchmodat/fchmodat2, performed here once the record kept the mode (stopped only when
/// the run keeps a change record): the name is resolved as the kernel would (a final symlink
/// followed here unless AT_SYMLINK_NOFOLLOW), opened without following anything more, and
/// changed through that descriptor.
fn chmod<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    dirfd: i32,
    path: &[u8],
    mode: libc::mode_t,
    flags: i32,
) -> Result<Verdict, i32> {
    if flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH) != 0 {
        return Err(libc::EINVAL);
    }
    let target = if path.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
        caller.dirfd(dirfd)?
    } else {
        let follows = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        match follow(gate, caller, dirfd, path, follows, false)? {
            Target::Own(own) => own.path_fd()?,
            Target::Entry(entry, existing) => {
                let Some(st) = existing else {
                    return Err(libc::ENOENT);
                };
                if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    // A symlink's mode cannot change (the kernel says so too).
                    return Err(libc::EOPNOTSUPP);
                }
                gate.sys
                    .openat2_path(&entry.parent, &entry.last, libc::O_NOFOLLOW)?
            }
        }
    };
    record::before_fd(gate.record.as_ref(), &target)?;
    gate.sys.chmod_fd(&target, mode)?;
    Ok(Verdict::Value(0))
}

/// fchmod(2), performed here once the record kept the mode (stopped only when the run keeps a
/// change record): on the caller's open file itself, taken once with pidfd_getfd, so the mode
/// changes on what the caller's descriptor is open on now, as the kernel's would (a pipe or a
/// socket too), and a number the caller has no descriptor for is EBADF. An `O_PATH` descriptor
/// cannot change a mode (EBADF, as the kernel says): refused before anything is recorded.
fn fchmod<S: Sys>(
    gate: &Gate<S>,
    caller: &Caller<S>,
    fd: i32,
    mode: libc::mode_t,
) -> Result<Verdict, i32> {
    let file = caller_fd(caller, fd)?;
    if gate.sys.fd_flags(&file)? & libc::O_PATH != 0 {
        return Err(libc::EBADF);
    }
    record::before_fd(gate.record.as_ref(), &file)?;
    gate.sys.fchmod(&file, mode)?;
    Ok(Verdict::Value(0))
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `openat(base, path, O_PATH | extra)`, following links as the kernel does for a caller,
/// magic links of /proc allowed (only for paths the gate built itself).
fn open_path(base: RawFd, path: &OsStr, extra: i32) -> Result<OwnedFd, i32> {
    let c = CString::new(path.as_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: our own path; the result is a new descriptor.
    let fd = unsafe { libc::openat(base, c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | extra) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(base, path, O_PATH | extra, RESOLVE_NO_MAGICLINKS)`: a caller's path, resolved as
/// the kernel would for the caller except that no /proc magic link is followed (it would
/// resolve to PID 1's own files).
fn openat2_path(base: &OwnedFd, path: &[u8], extra: i32) -> Result<OwnedFd, i32> {
    openat2(
        base,
        path,
        libc::O_PATH | libc::O_CLOEXEC | extra,
        libc::RESOLVE_NO_MAGICLINKS,
    )
}

/// `openat2(dir, name, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS)`:
/// one plain entry of `dir`, no link followed.
fn openat2_beneath(dir: &OwnedFd, name: &[u8], flags: i32) -> Result<OwnedFd, i32> {
    // openat2 refuses any other flag beside O_PATH.
    let extra = if flags & libc::O_PATH != 0 {
        libc::O_CLOEXEC
    } else {
        libc::O_CLOEXEC | libc::O_NOCTTY
    };
    openat2(
        dir,
        name,
        flags | extra,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS,
    )
}

fn openat2(base: &OwnedFd, path: &[u8], flags: i32, resolve: u64) -> Result<OwnedFd, i32> {
    let c = CString::new(path.to_vec()).map_err(|_| libc::EINVAL)?;
    // SAFETY: open_how is plain data.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: `how` and the path outlive the call; the result is a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            base.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn fstat(fd: &OwnedFd) -> Result<libc::stat, i32> {
    // SAFETY: stat is plain data, filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our own descriptor; AT_EMPTY_PATH stats it.
    let rc = unsafe { libc::fstatat(fd.as_raw_fd(), c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH) };
    if rc != 0 {
        return Err(errno());
    }
    Ok(st)
}

fn fstatat(dir: &OwnedFd, name: &OsStr, flags: i32) -> Result<libc::stat, i32> {
    let c = CString::new(name.as_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: as fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our own path and descriptor.
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, flags) };
    if rc != 0 {
        return Err(errno());
    }
    Ok(st)
}

fn fstatfs_type(fd: &OwnedFd) -> Result<i64, i32> {
    // SAFETY: statfs is plain data, filled by the kernel.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: our own descriptor.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st.f_type as i64)
}

fn readlinkat(dir: &OwnedFd, name: &[u8]) -> Result<Vec<u8>, i32> {
    let c = CString::new(name.to_vec()).map_err(|_| libc::EINVAL)?;
    let mut buf = vec![0u8; PATH_MAX];
    // SAFETY: the buffer is PATH_MAX bytes long, as passed.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// The callers' umasks. /proc/PID/status, the only place a umask shows, costs about 50 µs to
/// read on a small VM (it renders every field), so each task's is kept once read, with a pidfd
/// of that task: an entry is used only while its task lives (a tid is reused only after).
/// A umask changes only through umask(2), which the gate's filter also stops and lets
/// continue: every entry is then forgotten, and none is kept again until the task that called
/// it has made another gated call (so its umask(2) has returned) or is gone; a task sharing
/// that umask could otherwise read and keep the old value in between.
#[derive(Default)]
struct Umasks {
    known: Mutex<UmaskTable>,
}

#[derive(Default)]
struct UmaskTable {
    by_tid: std::collections::HashMap<libc::pid_t, (OwnedFd, libc::mode_t)>,
    /// Tasks whose umask(2) may not have run yet.
    changing: std::collections::HashMap<libc::pid_t, Option<OwnedFd>>,
}

const UMASKS_KEPT: usize = 512;
/// `pidfd_open` of a thread that is not its group's leader (Linux 6.9).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 to a pidfd we own: an existence check.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, 0usize, 0) == 0 }
}

impl Umasks {
    fn of<S: Sys>(&self, caller: &Caller<S>) -> Result<libc::mode_t, i32> {
        let mut t = self.known.lock().unwrap_or_else(|p| p.into_inner());
        // This task's umask(2), if it made one, has returned: it is in another call now.
        t.changing.remove(&caller.tid);
        t.changing
            .retain(|_, pidfd| pidfd.as_ref().is_none_or(alive));
        if let Some((pidfd, mask)) = t.by_tid.get(&caller.tid) {
            if alive(pidfd) {
                return Ok(*mask);
            }
            t.by_tid.remove(&caller.tid);
        }
        let status =
            std::fs::read(format!("/proc/{}/status", caller.tid)).map_err(|_| libc::ESRCH)?;
        let mask = std::str::from_utf8(&status)
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:")))
            .and_then(|v| libc::mode_t::from_str_radix(v.trim(), 8).ok())
            .ok_or(libc::ESRCH)?;
        if t.changing.is_empty()
            && let Some(pidfd) = pidfd_open(caller.tid)
        {
            // Still the caller (alive and waiting): the pidfd is its task's.
            caller.still_waiting()?;
            if t.by_tid.len() >= UMASKS_KEPT {
                t.by_tid.clear();
            }
            t.by_tid.insert(caller.tid, (pidfd, mask));
        }
        Ok(mask)
    }

    /// `tid` calls umask(2).
    fn changing(&self, tid: libc::pid_t) {
        let mut t = self.known.lock().unwrap_or_else(|p| p.into_inner());
        t.by_tid.clear();
        t.changing.insert(tid, pidfd_open(tid));
    }
}

fn pidfd_open(tid: libc::pid_t) -> Option<OwnedFd> {
    for flags in [0, PIDFD_THREAD] {
        // SAFETY: pidfd_open returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, flags) };
        if fd >= 0 {
            // SAFETY: fresh descriptor.
            return Some(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
    }
    None
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod table_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors a lookup can give that say nothing about whether the name is there.
    const NOT_ENOENT: [i32; 7] = [
        libc::EACCES,
        libc::ELOOP,
        libc::EIO,
        libc::ENOMEM,
        libc::ENOTDIR,
        libc::ENAMETOOLONG,
        libc::EOVERFLOW,
    ];

    #[test]
    fn only_enoent_is_absent() {
        assert_eq!(Seen::of(Err::<(), _>(libc::ENOENT)), Seen::Absent);
        assert_eq!(Seen::of(Ok::<(), i32>(())), Seen::Present);
        for e in NOT_ENOENT {
            assert_eq!(Seen::of(Err::<(), _>(e)), Seen::Present, "errno {e}");
        }
    }

    #[test]
    fn the_normal_thread_serves_while_more_tasks_run_than_cpus() {
        // (running, cpus, serving now, serving next)
        let table = [
            (1, 2, Role::Idle, Role::Idle),
            (1, 2, Role::Normal, Role::Idle),
            (2, 2, Role::Idle, Role::Idle),
            (2, 2, Role::Normal, Role::Normal),
            (3, 2, Role::Idle, Role::Normal),
            (9, 2, Role::Normal, Role::Normal),
            (1, 1, Role::Normal, Role::Normal),
            (2, 1, Role::Idle, Role::Normal),
        ];
        for (running, cpus, now, next) in table {
            assert_eq!(
                shift_for(running, cpus, now),
                next,
                "{running} on {cpus}, {now:?}"
            );
        }
        // This thread runs while it reads the count.
        assert!(running_tasks().is_some_and(|n| n >= 1));
    }

    #[test]
    fn a_thread_waiting_for_its_turn_serves_once_handed_it_and_ends_with_the_gate() {
        let shift = std::sync::Arc::new(Shift::new());
        let (turns, got) = std::sync::mpsc::channel();
        let waiting = {
            let shift = shift.clone();
            std::thread::spawn(move || {
                while shift.wait_turn(Role::Normal) {
                    turns.send(()).unwrap();
                    shift.state.lock().unwrap().serving = Role::Idle;
                }
            })
        };
        let timeout = std::time::Duration::from_secs(20);
        assert!(
            got.recv_timeout(std::time::Duration::from_millis(50))
                .is_err()
        );
        shift.state.lock().unwrap().serving = Role::Normal;
        shift.turn.notify_all();
        got.recv_timeout(timeout).expect("its turn came");
        shift.finish();
        waiting.join().unwrap();
        assert!(
            !shift.wait_turn(Role::Idle),
            "nobody serves once the gate is done"
        );
    }

    fn hidden(root: &str) -> Hidden {
        let patterns: Vec<String> = [".env", ".env.*", "*.pem", "config/secrets.yml", "/top.key"]
            .map(String::from)
            .to_vec();
        Hidden::new(&patterns, root.as_bytes()).unwrap()
    }

    /// The sets are compiled at the first name; a bad pattern is refused before that, and
    /// sets that did not compile after all refuse every name (fail closed).
    #[test]
    fn hide_patterns_are_checked_at_once_compiled_at_the_first_name_and_fail_closed() {
        let h = hidden("/work/proj");
        assert!(h.sets.get().is_none(), "compiled before any name");
        assert!(!h.may_match(b"notes.txt"));
        assert!(h.sets.get().is_some_and(Option::is_some));
        let bad = Hidden::new(&["a[".to_string()], b"/work/proj");
        assert!(bad.is_err(), "a pattern that does not parse was taken");
        let broken = hidden("/work/proj");
        broken.sets.set(None).ok().unwrap();
        assert!(broken.may_match(b"notes.txt"));
        assert_eq!(
            broken.refuses(Some(b"/work/proj"), b"notes.txt"),
            Some(broken.patterns[0].as_str())
        );
        assert!(broken.refuses(None, b"notes.txt").is_some());
    }

    #[test]
    fn hide_patterns_refuse_names_in_the_project_as_the_masking_walk_matches_them() {
        let h = hidden("/work/proj/");
        // (directory the name is made in, name, the pattern that refuses it)
        let table: [(Option<&str>, &str, Option<&str>); 19] = [
            (Some("/work/proj"), ".env", Some(".env")),
            (Some("/work/proj"), ".env.local", Some(".env.*")),
            // A rename or link target, a directory (mkdir): the same name, the same answer.
            (Some("/work/proj/a/b"), ".env.prod", Some(".env.*")),
            (Some("/work/proj/a"), ".env.d", Some(".env.*")),
            (Some("/work/proj/deep/er"), "id.pem", Some("*.pem")),
            (
                Some("/work/proj/config"),
                "secrets.yml",
                Some("config/secrets.yml"),
            ),
            (Some("/work/proj/x/config"), "secrets.yml", None),
            (Some("/work/proj"), "top.key", Some("/top.key")),
            (Some("/work/proj/sub"), "top.key", None),
            (Some("/work/proj"), ".envrc", None),
            (Some("/work/proj"), "env", None),
            (Some("/work/proj"), "notes.txt", None),
            // Outside the project: not the patterns' concern.
            (Some("/work/proj2"), ".env", None),
            (Some("/home/u/.codex"), ".env.local", None),
            (Some("/"), ".env", None),
            // A directory that cannot be named may be anywhere in the project: each
            // pattern's last component.
            (None, ".env.local", Some(".env.*")),
            (None, "top.key", Some("/top.key")),
            (None, "secrets.yml", Some("config/secrets.yml")),
            (None, "notes.txt", None),
        ];
        for (dir, name, want) in table {
            assert_eq!(
                h.refuses(dir.map(str::as_bytes), name.as_bytes()),
                want,
                "{name} in {dir:?}"
            );
        }
        // A project at the root of the file system.
        let at_root = hidden("/");
        assert_eq!(at_root.refuses(Some(b"/"), b".env"), Some(".env"));
        assert_eq!(
            at_root.refuses(Some(b"/config"), b"secrets.yml"),
            Some("config/secrets.yml")
        );
    }

    #[test]
    fn a_hidden_name_is_refused_with_eacces_in_the_project_and_made_in_the_jails_own_files() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        // As `split` makes it for `gate`: private when its directory is on one of the gate's
        // own file systems.
        let entry_for = |gate: &Gate, dir: &str, name: &str| {
            let parent = open_path(
                libc::AT_FDCWD,
                root.join(dir).as_os_str(),
                libc::O_DIRECTORY,
            )
            .unwrap();
            let private = gate.private_devs.contains(&fstat(&parent).unwrap().st_dev);
            Entry {
                parent,
                last: name.as_bytes().to_vec(),
                private,
            }
        };
        let with_hidden = |private: HashSet<u64>| {
            let mut gate = Gate::new(&[], private, b"").unwrap();
            gate.hidden = Some(hidden(root.to_str().unwrap()));
            gate
        };
        let gate = with_hidden(HashSet::new());
        let entry = |dir: &str, name: &str| entry_for(&gate, dir, name);
        for (dir, name) in [
            ("", ".env.local"),
            ("sub", ".env"),
            ("sub", "key.pem"),
            ("", ".env.d/"),
        ] {
            assert_eq!(
                check(&gate, &entry(dir, name)).err(),
                Some(libc::EACCES),
                "{dir}/{name}"
            );
        }
        assert!(check(&gate, &entry("sub", "notes.txt")).is_ok());
        // An anchored pattern: its last component alone lets the name on to its directory's
        // path, which decides.
        std::fs::create_dir(root.join("config")).unwrap();
        assert_eq!(
            check(&gate, &entry("config", "secrets.yml")).err(),
            Some(libc::EACCES)
        );
        assert!(check(&gate, &entry("sub", "secrets.yml")).is_ok());
        // Control: the same names on a file system of the jail's own (its /tmp).
        let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(&root).unwrap());
        let own = with_hidden([dev].into_iter().collect());
        assert!(check(&own, &entry_for(&own, "", ".env.local")).is_ok());
        // And without the patterns, as before.
        let none = Gate::new(&[], HashSet::new(), b"").unwrap();
        assert!(check(&none, &entry_for(&none, "", ".env.local")).is_ok());
    }

    /// A directory whose lookups answer as told.
    struct Fake {
        head: Result<(), i32>,
        objects: Result<(), i32>,
        below: bool,
    }

    impl Dir for Fake {
        fn lookup(&self, name: &str) -> Result<(), i32> {
            match name {
                "HEAD" => self.head,
                "objects" => self.objects,
                other => panic!("the rules looked up {other}"),
            }
        }
        fn below_git_dir(&self) -> bool {
            self.below
        }
    }

    /// Each rule a row: the name, whether the directory is one of the run's git directories,
    /// what its lookups answer, and the verdict.
    #[test]
    fn the_rules_for_head_and_objects_fail_closed_on_any_lookup_error() {
        let absent = Err(libc::ENOENT);
        let there = Ok(());
        let mut rows: Vec<(Refusal, bool, Fake, bool)> = vec![
            // objects: only beside no HEAD.
            (
                Refusal::Part,
                false,
                Fake {
                    head: absent,
                    objects: absent,
                    below: false,
                },
                true,
            ),
            (
                Refusal::Part,
                false,
                Fake {
                    head: there,
                    objects: absent,
                    below: false,
                },
                false,
            ),
            // in a git directory of the run: git's own objects.
            (
                Refusal::Part,
                true,
                Fake {
                    head: there,
                    objects: absent,
                    below: false,
                },
                true,
            ),
            // HEAD: below a git directory, beside no objects.
            (
                Refusal::Head,
                false,
                Fake {
                    head: absent,
                    objects: absent,
                    below: true,
                },
                true,
            ),
            (
                Refusal::Head,
                false,
                Fake {
                    head: absent,
                    objects: there,
                    below: true,
                },
                false,
            ),
            (
                Refusal::Head,
                false,
                Fake {
                    head: absent,
                    objects: absent,
                    below: false,
                },
                false,
            ),
            (
                Refusal::Head,
                true,
                Fake {
                    head: there,
                    objects: there,
                    below: false,
                },
                true,
            ),
        ];
        for e in NOT_ENOENT {
            // A HEAD that cannot be looked up is there: no objects beside it.
            rows.push((
                Refusal::Part,
                false,
                Fake {
                    head: Err(e),
                    objects: absent,
                    below: true,
                },
                false,
            ));
            // objects that cannot be looked up are there: no HEAD beside them.
            rows.push((
                Refusal::Head,
                false,
                Fake {
                    head: absent,
                    objects: Err(e),
                    below: true,
                },
                false,
            ));
        }
        for kind in [Refusal::DotGit, Refusal::Commondir, Refusal::Folded] {
            for in_git_dir in [false, true] {
                rows.push((
                    kind,
                    in_git_dir,
                    Fake {
                        head: absent,
                        objects: absent,
                        below: true,
                    },
                    false,
                ));
            }
        }
        for (i, (kind, in_git_dir, dir, allowed)) in rows.iter().enumerate() {
            let got = rule(*kind, *in_git_dir, dir);
            assert_eq!(
                got.is_ok(),
                *allowed,
                "row {i}: {kind:?} in_git_dir={in_git_dir} head={:?} objects={:?} below={}: {got:?}",
                dir.head,
                dir.objects,
                dir.below
            );
            if let Err(k) = got {
                assert_eq!(k, *kind, "row {i}");
            }
        }
    }

    /// Whether a directory folds names: a file system or flag that cannot be read counts as
    /// folding; only "no inode flags here" (ENOTTY, EOPNOTSUPP) counts as not.
    #[test]
    fn a_directory_that_cannot_be_asked_counts_as_folding_names() {
        const EXT4: i64 = 0xef53;
        const VFAT: i64 = 0x4d44;
        let never = || -> Result<libc::c_long, i32> { panic!("flags asked of a folding fs") };
        /// The file system's type, the directory's flags, and whether it folds names.
        type Row = (Result<i64, i32>, Result<libc::c_long, i32>, bool);
        let rows: Vec<Row> = vec![
            (Ok(EXT4), Ok(0), false),
            (Ok(EXT4), Ok(FS_CASEFOLD_FL), true),
            (Ok(EXT4), Err(libc::ENOTTY), false),
            (Ok(EXT4), Err(libc::EOPNOTSUPP), false),
            (Ok(EXT4), Err(libc::EACCES), true),
            (Ok(EXT4), Err(libc::EIO), true),
            (Ok(EXT4), Err(libc::ENOMEM), true),
            (Err(libc::EIO), Ok(0), true),
            (Err(libc::EACCES), Ok(0), true),
        ];
        for (i, (fs, flags, want)) in rows.into_iter().enumerate() {
            assert_eq!(
                folds(fs, || flags),
                want,
                "row {i}: fs {fs:?} flags {flags:?}"
            );
        }
        assert!(folds(Ok(VFAT), never));
    }

    fn addr(family: libc::c_int, rest: &[u8]) -> Vec<u8> {
        [(family as libc::sa_family_t).to_ne_bytes().as_slice(), rest].concat()
    }

    /// What a bind's address makes, decided once from the bytes read: a name only for a Unix
    /// socket with a path; every other bind is made as given, on the socket the gate took.
    #[test]
    fn a_bind_names_a_path_only_for_a_unix_socket() {
        let rows: Vec<(libc::c_int, Vec<u8>, Result<Address, i32>)> = vec![
            (
                libc::AF_UNIX,
                addr(libc::AF_UNIX, b"a/.git\0"),
                Ok(Address::Path(b"a/.git".to_vec())),
            ),
            (
                libc::AF_UNIX,
                addr(libc::AF_UNIX, b"objects"),
                Ok(Address::Path(b"objects".to_vec())),
            ),
            (
                libc::AF_UNIX,
                addr(libc::AF_UNIX, b"\0abstract"),
                Ok(Address::AsGiven),
            ),
            (
                libc::AF_UNIX,
                addr(libc::AF_UNIX, b""),
                Ok(Address::AsGiven),
            ),
            (
                libc::AF_UNIX,
                addr(libc::AF_INET, b".git"),
                Ok(Address::AsGiven),
            ),
            (libc::AF_UNIX, vec![1], Ok(Address::AsGiven)),
            (
                libc::AF_UNIX,
                addr(libc::AF_UNIX, &[b'a'; 120]),
                Err(libc::EINVAL),
            ),
            // Another family: no name, whatever the bytes say (a Unix address on an INET
            // socket is the kernel's EINVAL, made on the socket the gate holds).
            (
                libc::AF_INET,
                addr(libc::AF_UNIX, b".git\0"),
                Ok(Address::AsGiven),
            ),
            (
                libc::AF_INET6,
                addr(libc::AF_INET6, &[0; 26]),
                Ok(Address::AsGiven),
            ),
            (
                libc::AF_NETLINK,
                addr(libc::AF_NETLINK, &[0; 10]),
                Ok(Address::AsGiven),
            ),
        ];
        for (i, (domain, raw, want)) in rows.into_iter().enumerate() {
            assert_eq!(bind_address(domain, &raw), want, "row {i}");
        }
        assert_eq!(bind_len(16), Ok(16));
        assert_eq!(bind_len(0), Ok(0));
        assert_eq!(bind_len(128), Ok(128));
        assert_eq!(bind_len(129), Err(libc::EINVAL));
        assert_eq!(bind_len(u64::from(u32::MAX)), Err(libc::EINVAL));
        // The upper half of the register is not the kernel's int.
        assert_eq!(bind_len((1 << 32) | 16), Ok(16));
    }
}
