//! What this host supports, found by trying (for `corral doctor`).
//!
//! Every probe does the real thing where it can: a user namespace is created in a forked child
//! (and a tmpfs mounted in it), the seccomp filter is installed in a forked child and a denied
//! syscall tried, a cgroup with memory, cpu and pids limits is created and removed, a pty is
//! opened. Each check says what a missing piece disables and how to fix it.

use std::ffi::CString;
use std::fs;
use std::process::Command;

use serde::Serialize;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Works.
    Ok,
    /// Missing or restricted, but corral still runs (weaker or with a feature off).
    Warn,
    /// Missing, and the native backend cannot run without it.
    Missing,
    /// Informational (e.g. an optional container engine not installed).
    Info,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable identifier (`user_namespaces`, `landlock`, ...).
    pub id: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What the missing piece disables.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disables: Option<String>,
    /// How to fix it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kernel: String,
    pub arch: &'static str,
    pub uid: u32,
    pub checks: Vec<Check>,
    /// The native backend can build a jail here (user namespaces, seccomp).
    pub native_backend: bool,
    /// ... and enforce memory/cpu/pids limits with `limits.enforce = "strict"`.
    pub strict_limits: bool,
    /// How this user's jails get their limits: `cgroup-v2-delegated`, `cgroup-v1-writable`
    /// or `rlimit-fallback`.
    pub limits_path: &'static str,
    /// The kernel's Landlock ABI, when it has Landlock.
    pub landlock_abi: Option<u32>,
    /// The seccomp filter every jail gets: each rule and why.
    pub seccomp_filter: Vec<FilterRule>,
}

/// One rule of the jail's seccomp filter.
#[derive(Debug, Clone, Serialize)]
pub struct FilterRule {
    pub syscall: &'static str,
    pub rule: &'static str,
}

fn filter_rules() -> Vec<FilterRule> {
    let mut v: Vec<FilterRule> = crate::seccomp::ARGUMENT_RULES
        .iter()
        .map(|(syscall, rule)| FilterRule { syscall, rule })
        .collect();
    v.extend(
        crate::seccomp::denied_syscalls()
            .into_iter()
            .map(|d| FilterRule {
                syscall: d.name,
                rule: d.reason,
            }),
    );
    v
}

impl Report {
    /// 0: the native backend runs with strict limits and Landlock; 1: it runs, degraded
    /// (no strict limits, or no Landlock); 2: it cannot run.
    pub fn exit_code(&self) -> u8 {
        if !self.native_backend {
            2
        } else if !self.strict_limits || self.checks.iter().any(|c| c.status == Status::Warn) {
            1
        } else {
            0
        }
    }

    pub fn summary(&self) -> String {
        match self.exit_code() {
            0 => "the native backend runs here, with strict limits and every hardening layer.".into(),
            1 if !self.strict_limits => "the native backend runs here, but no cgroup can enforce limits: the built-in default limits fall back to rlimits (said in one line per run); limits you set with enforce = \"strict\" (the default) refuse to start; see the cgroups fix above, or use limits.enforce = \"best-effort\".".into(),
            1 => "the native backend runs here, with the weaker hardening listed above.".into(),
            _ => "the native backend cannot run here (see the missing items above); use --engine podman or docker if one is installed.".into(),
        }
    }
}

fn check(id: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        id,
        status,
        detail: detail.into(),
        disables: None,
        fix: None,
    }
}

impl Check {
    fn disables(mut self, s: impl Into<String>) -> Self {
        self.disables = Some(s.into());
        self
    }
    fn fix(mut self, s: impl Into<String>) -> Self {
        self.fix = Some(s.into());
        self
    }
}

/// Run every probe.
pub fn run() -> Report {
    let landlock_abi = crate::landlock::kernel_abi();
    let userns = probe_userns();
    let (seccomp, gate) = probe_seccomp();
    let (cgroups, version) = probe_cgroups();
    let strict_limits = cgroups.status == Status::Ok;
    let limits_path = match version {
        Some(crate::cgroup::Version::V2) => "cgroup-v2-delegated",
        Some(crate::cgroup::Version::V1) => "cgroup-v1-writable",
        None => "rlimit-fallback",
    };
    let checks = vec![
        userns,
        probe_landlock(landlock_abi),
        seccomp,
        gate,
        cgroups,
        probe_pty(),
        probe_tiocsti(),
        probe_engine("podman"),
        probe_engine("docker"),
    ];
    let native_backend = !checks.iter().any(|c| c.status == Status::Missing);
    let u = nix::sys::utsname::uname().ok();
    Report {
        kernel: u
            .as_ref()
            .map(|u| {
                format!(
                    "{} {}",
                    u.sysname().to_string_lossy(),
                    u.release().to_string_lossy()
                )
            })
            .unwrap_or_default(),
        arch: std::env::consts::ARCH,
        uid: nix::unistd::getuid().as_raw(),
        checks,
        native_backend,
        strict_limits,
        limits_path,
        landlock_abi,
        seccomp_filter: filter_rules(),
    }
}

fn read_sysctl(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Fork; run `f` in the child, which exits with the code `f` returns; the parent gets it.
/// `f` must not allocate (the child of a threaded process may only do async-signal-safe work).
fn in_child(f: impl FnOnce() -> i32) -> Result<i32, String> {
    // SAFETY: the child only runs `f` (raw syscalls, no allocation) and then _exit.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork failed: {}", std::io::Error::last_os_error())),
        0 => {
            let code = f();
            // SAFETY: terminate the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
        pid => {
            let mut status = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
                return Err(format!(
                    "waitpid failed: {}",
                    std::io::Error::last_os_error()
                ));
            }
            if libc::WIFEXITED(status) {
                Ok(libc::WEXITSTATUS(status))
            } else {
                Err(format!(
                    "the probe child died from signal {}",
                    libc::WTERMSIG(status)
                ))
            }
        }
    }
}

/// Write `data` to the file at `path` with raw syscalls (for forked children).
fn raw_write(path: &CString, data: &[u8]) -> bool {
    // SAFETY: open/write/close on a NUL-terminated path and a buffer we own.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let ok = libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize;
        libc::close(fd);
        ok
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn probe_userns() -> Check {
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let setgroups = CString::new("/proc/self/setgroups").unwrap();
    let uid_map_path = CString::new("/proc/self/uid_map").unwrap();
    let gid_map_path = CString::new("/proc/self/gid_map").unwrap();
    let uid_map = format!("{uid} {uid} 1");
    let gid_map = format!("{gid} {gid} 1");
    let root = CString::new("/").unwrap();
    let tmp = CString::new("/tmp").unwrap();
    let tmpfs = CString::new("tmpfs").unwrap();
    // Exit codes: 0 ok; 10+errno unshare failed; 3 uid map; 4 gid map; 5 mount failed.
    let r = in_child(|| {
        // SAFETY: raw syscalls with NUL-terminated strings prepared before fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return 10 + errno().min(200);
            }
            raw_write(&setgroups, b"deny");
            if !raw_write(&uid_map_path, uid_map.as_bytes()) {
                return 3;
            }
            if !raw_write(&gid_map_path, gid_map.as_bytes()) {
                return 4;
            }
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
                || libc::mount(
                    tmpfs.as_ptr(),
                    tmp.as_ptr(),
                    tmpfs.as_ptr(),
                    0,
                    std::ptr::null(),
                ) != 0
            {
                return 5;
            }
        }
        0
    });
    let mut notes = Vec::new();
    if let Some(v) = read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") {
        notes.push(format!(
            "kernel.apparmor_restrict_unprivileged_userns = {v}"
        ));
    }
    if let Some(v) = read_sysctl("/proc/sys/kernel/unprivileged_userns_clone") {
        notes.push(format!("kernel.unprivileged_userns_clone = {v}"));
    }
    if let Some(v) = read_sysctl("/proc/sys/user/max_user_namespaces") {
        notes.push(format!("user.max_user_namespaces = {v}"));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    let fix = "allow unprivileged user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` \
               (Debian before 11), `sysctl -w user.max_user_namespaces=15000`, or on Ubuntu 23.10+ \
               `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor profile for \
               corral with `userns,`); persist it in /etc/sysctl.d/";
    let disables =
        "the native backend (every jail needs a user namespace); use --engine podman or docker";
    match r {
        Ok(0) => check(
            "user_namespaces",
            Status::Ok,
            format!("created a user and mount namespace, mapped the uid, mounted a tmpfs{notes}"),
        ),
        Ok(c) if c >= 10 => {
            let e = std::io::Error::from_raw_os_error(c - 10);
            check("user_namespaces", Status::Missing, format!("unshare(CLONE_NEWUSER) failed: {e}{notes}"))
                .disables(disables)
                .fix(fix)
        }
        Ok(c) => check(
            "user_namespaces",
            Status::Missing,
            format!(
                "a user namespace was created but {}{notes}: unprivileged user namespaces are restricted",
                match c {
                    3 => "writing its uid_map failed",
                    4 => "writing its gid_map failed",
                    _ => "mounting a tmpfs in it failed",
                }
            ),
        )
        .disables(disables)
        .fix(fix),
        Err(e) => check("user_namespaces", Status::Missing, e).disables(disables).fix(fix),
    }
}

fn probe_landlock(abi: Option<u32>) -> Check {
    let fix_kernel = "Landlock needs Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK and enabled at boot \
                      (`lsm=landlock,...` on the kernel command line, or CONFIG_LSM including landlock)";
    match abi {
        None => check(
            "landlock",
            Status::Warn,
            "not available in this kernel (or disabled at boot)",
        )
        .disables("the second wall around the filesystem: only the mount namespace confines files")
        .fix(fix_kernel),
        Some(v) if v >= 6 => check(
            "landlock",
            Status::Ok,
            format!(
                "ABI {v}: filesystem rules, truncate, device ioctls, abstract unix socket and signal scopes"
            ),
        ),
        Some(v) => {
            let mut lacks = Vec::new();
            if v < 2 {
                lacks.push("cross-directory rename/link control (ABI 2)");
            }
            if v < 3 {
                lacks.push("truncate control (ABI 3)");
            }
            if v < 5 {
                lacks.push("device ioctl control (ABI 5)");
            }
            lacks.push("abstract unix socket and signal scoping (ABI 6)");
            check("landlock", Status::Warn, format!("ABI {v}: partial"))
                .disables(format!("lacks {}", lacks.join(", ")))
                .fix("a kernel 6.12 or newer has Landlock ABI 6")
        }
    }
}

/// The seccomp check, and the name gate's (namegate.rs: a listener that waits killably, Linux
/// 5.19), tried in the same child.
fn probe_seccomp() -> (Check, Check) {
    let gate_missing = |why: &str| {
        check("name_gate", Status::Warn, why.to_string())
            .disables(
                "refusing new git repositories while a run lasts (they are checked when it ends)",
            )
            .fix("use Linux 5.19 or later")
    };
    probe_seccomp_with(&gate_missing)
}

fn probe_seccomp_with(gate_missing: &dyn Fn(&str) -> Check) -> (Check, Check) {
    let gate_prog = crate::seccomp::build_gate_filter().ok();
    let no_gate = || gate_missing("not tried: seccomp is missing");
    let mode = fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim().to_string()))
    });
    let Some(mode) = mode else {
        return (
            check(
                "seccomp",
                Status::Missing,
                "the kernel has no seccomp (no Seccomp: line in /proc/self/status)",
            )
            .disables("the native backend: corral never runs a jail without its syscall filter")
            .fix("use a kernel built with CONFIG_SECCOMP_FILTER, or --engine podman/docker"),
            no_gate(),
        );
    };
    let prog = match crate::seccomp::build_filter() {
        Ok(p) => p,
        Err(e) => return (check("seccomp", Status::Missing, e.to_string()), no_gate()),
    };
    // In a child: install corral's real filter, then try what it must deny and what it must not.
    let r = in_child(|| {
        if crate::seccomp::install_program(&prog).is_err() {
            return 3;
        }
        // SAFETY: raw syscalls with integer arguments.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER) == 0 || errno() != libc::EPERM {
                return 4;
            }
            if libc::getppid() <= 0 {
                return 5;
            }
        }
        match gate_prog.as_deref().map(crate::seccomp::install_gate) {
            Some(Ok(Some(_))) => 0,
            _ => 6,
        }
    });
    let inherited = if mode == "0" {
        String::new()
    } else {
        format!("; corral itself already runs under a seccomp filter (mode {mode}), which stacks")
    };
    let gate_ok = || {
        check(
            "name_gate",
            Status::Ok,
            "seccomp user notification with a killable wait: new git repositories are refused \
             while a run lasts",
        )
    };
    let seccomp_ok = || {
        check(
            "seccomp",
            Status::Ok,
            format!(
                "corral's filter installed in a child; unshare(CLONE_NEWUSER) got EPERM there{inherited}"
            ),
        )
    };
    match r {
        Ok(0) => (seccomp_ok(), gate_ok()),
        Ok(6) => (
            seccomp_ok(),
            gate_missing("this kernel cannot install the name gate's listener"),
        ),
        Ok(c) => (
            check(
                "seccomp",
                Status::Missing,
                match c {
                    3 => "installing corral's seccomp filter failed".to_string(),
                    4 => "the filter did not deny unshare(CLONE_NEWUSER)".to_string(),
                    _ => "ordinary syscalls failed under the filter".to_string(),
                },
            )
            .disables("the native backend: corral never runs a jail without its syscall filter")
            .fix("use a kernel built with CONFIG_SECCOMP_FILTER, or --engine podman/docker"),
            no_gate(),
        ),
        Err(e) => (check("seccomp", Status::Missing, e), no_gate()),
    }
}

/// The cgroups check, and the cgroup version that enforces limits for this user, if any.
fn probe_cgroups() -> (Check, Option<crate::cgroup::Version>) {
    let hs = crate::cgroup::hierarchies();
    let v1: Vec<String> = hs
        .iter()
        .filter(|h| h.version == crate::cgroup::Version::V1)
        .flat_map(|h| h.controllers.clone())
        .filter(|c| !c.starts_with("name="))
        .collect();
    let v2 = hs.iter().any(|h| h.version == crate::cgroup::Version::V2);
    let layout = match (v1.is_empty(), v2) {
        (true, true) => "cgroup v2 (unified)".to_string(),
        (false, true) => format!(
            "hybrid: cgroup v1 controllers ({}) plus a cgroup v2 hierarchy",
            v1.join(", ")
        ),
        (false, false) => format!("cgroup v1 ({})", v1.join(", ")),
        (true, false) => "no cgroup filesystem mounted".to_string(),
    };
    match crate::cgroup::probe() {
        Ok(v) => (check(
            "cgroups",
            Status::Ok,
            format!("{layout}; created and removed a {v:?} cgroup with memory, cpu and pids limits"),
        ), Some(v)),
        Err(why) => (check("cgroups", Status::Warn, format!("{layout}; cannot create a limited cgroup: {why}"))
            .disables(
                "enforcing limits.memory/cpus/pids with a cgroup: corral's built-in default limits fall back \
                 to per-process rlimits (memory, processes; no CPU limit) and each run says so in one line; \
                 limits you set refuse to start with limits.enforce = \"strict\" (the default), and fall \
                 back the same way with \"best-effort\"",
            )
            .fix(
                "on cgroup v2 run corral in a delegated scope: `systemd-run --user --scope -p Delegate=yes corral run ...` \
                 (with Delegate=memory pids cpu for user@.service: `systemctl edit user@.service`); \
                 on cgroup v1 only root can; or set limits.enforce = \"best-effort\"",
            ), None),
    }
}

fn probe_pty() -> Check {
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let r = posix_openpt(nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NOCTTY).and_then(|m| {
        grantpt(&m)?;
        unlockpt(&m)?;
        ptsname_r(&m)
    });
    match r {
        Ok(name) => check(
            "pty",
            Status::Ok,
            format!("opened a pseudo-terminal ({name})"),
        ),
        Err(e) => check(
            "pty",
            Status::Warn,
            format!("opening /dev/ptmx failed: {e}"),
        )
        .disables("interactive harnesses: the jail's own terminal (corral run from a tty)")
        .fix("mount devpts (`mount -t devpts devpts /dev/pts`) and make /dev/ptmx available"),
    }
}

fn probe_tiocsti() -> Check {
    match read_sysctl("/proc/sys/dev/tty/legacy_tiocsti").as_deref() {
        Some("0") => check(
            "tiocsti",
            Status::Ok,
            "dev.tty.legacy_tiocsti = 0: TIOCSTI is disabled host-wide",
        ),
        Some(v) => check(
            "tiocsti",
            Status::Ok,
            format!(
                "dev.tty.legacy_tiocsti = {v}: TIOCSTI works on this host; corral's jails get their own pty and \
                 the seccomp filter denies TIOCSTI, so a jailed process cannot type into your shell \
                 (`sysctl -w dev.tty.legacy_tiocsti=0` protects other programs too)"
            ),
        ),
        None => check(
            "tiocsti",
            Status::Ok,
            "no dev.tty.legacy_tiocsti (kernel before 6.2): TIOCSTI works host-wide; corral's own pty and \
             seccomp filter keep jailed processes from using it",
        ),
    }
}

fn probe_engine(name: &'static str) -> Check {
    let id = if name == "podman" { "podman" } else { "docker" };
    match Command::new(name).arg("--version").output() {
        Ok(o) if o.status.success() => check(
            id,
            Status::Ok,
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        ),
        Ok(o) => check(
            id,
            Status::Info,
            format!(
                "`{name} --version` failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        )
        .disables(format!("--engine {name}")),
        Err(_) => check(id, Status::Info, format!("{name} is not installed")).disables(format!(
            "--engine {name} (the native backend does not need it)"
        )),
    }
}
