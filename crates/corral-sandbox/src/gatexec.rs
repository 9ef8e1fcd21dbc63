//! The name gate in a container: `corral __corral-gate-exec [--git-dir D]... [--host-path P]...
//! -- COMMAND...` is the harness container's entrypoint and PID 1 (corral-engine `argv.rs`; no
//! engine init). It does for the container what the native jail's PID 1 does: it forks the
//! command with corral's whole seccomp filter and the name gate's filter on it, serves the
//! gate's notifications on a thread of its own (namegate.rs), passes signals on, reaps every
//! orphan, and exits with the command's status as a shell would.
//!
//! The container's own profile is corral's rules less the three syscalls the gate makes
//! (`seccomp::oci_profile_gated`); the command gets the whole filter here, before it runs,
//! so it and everything it starts are held to every rule, and the only process without it is
//! this one. It is non-dumpable: the command (same uid, no capabilities) can neither read nor
//! write its memory, nor take its descriptors; as the PID namespace's init it cannot be killed
//! or stopped from inside. An engine init (catatonit, tini) is not used: it would be a dumpable
//! process of the same uid outside the command's filters, whose memory the command could write
//! where Yama allows it.
//!
//! What is the container's own (exempt: a clone in /tmp works) is an allow-list: a tmpfs or
//! overlay mounted whole (mount root `/`), not at or below a bind of the plan (`--host-path`,
//! read-only ones too: the engines bind recursively, so a host mount nested in a bind appears
//! as a mount of its own), on no device a bind is on. Anything else, a submount of the host's
//! inside the project included, is checked.
use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use nix::sys::signal::{SigHandler, SigSet, Signal, signal};
use nix::unistd::{ForkResult, fork};

use crate::child::FORWARDED;
use crate::{EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};

/// The first argument that makes the corral binary a container's gate.
pub const GATE_EXEC_ARG: &str = "__corral-gate-exec";

/// What the entrypoint was told.
#[derive(Debug, PartialEq, Eq)]
struct Spec {
    /// The run's git directories, as the container sees them (the Plan's `git.dirs`).
    git_dirs: Vec<PathBuf>,
    /// The plan's read-write binds, as the container sees them: what the host sees too.
    host_paths: Vec<PathBuf>,
    /// The Plan's `filesystem.hide` patterns (`--hide`), refused as new names below
    /// `project` (`--project`, where the container sees the project).
    hide: Vec<String>,
    project: Option<PathBuf>,
    /// `--init`: this process must be the container's PID 1 (the engines' and compose's
    /// entrypoint): anything else there would be a process outside the command's filters.
    init: bool,
    /// `--require-gate`: a kernel without what the gate needs is an error, not a warning (the
    /// compose executor: a service with no run whose end would check what it made).
    require_gate: bool,
    command: Vec<OsString>,
}

fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Spec, String> {
    let mut spec = Spec {
        git_dirs: Vec::new(),
        host_paths: Vec::new(),
        hide: Vec::new(),
        project: None,
        init: false,
        require_gate: false,
        command: Vec::new(),
    };
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let list = match a.to_str() {
            Some("--") => {
                spec.command = args.collect();
                break;
            }
            Some("--init") => {
                spec.init = true;
                continue;
            }
            Some("--require-gate") => {
                spec.require_gate = true;
                continue;
            }
            Some("--git-dir") => &mut spec.git_dirs,
            Some("--host-path") => &mut spec.host_paths,
            Some("--hide") => {
                let pattern = args.next().ok_or("--hide needs a pattern")?;
                let pattern = pattern
                    .into_string()
                    .map_err(|p| format!("--hide {p:?}: not UTF-8"))?;
                spec.hide.push(pattern);
                continue;
            }
            Some("--project") => {
                let dir = args.next().ok_or("--project needs a path")?;
                spec.project = Some(PathBuf::from(dir));
                continue;
            }
            _ => return Err(format!("unknown argument {a:?}")),
        };
        let value = args
            .next()
            .ok_or_else(|| format!("{} needs a path", a.to_string_lossy()))?;
        list.push(PathBuf::from(value));
    }
    if spec.command.is_empty() {
        return Err("no command after `--`".into());
    }
    if !spec.hide.is_empty() && spec.project.is_none() {
        return Err("--hide needs --project (where the patterns apply)".into());
    }
    Ok(spec)
}

/// Run as the container's gate (arguments after [`GATE_EXEC_ARG`]) and exit with the command's
/// status. Call before any thread starts (it forks).
pub(crate) fn main(args: Vec<OsString>) -> ! {
    let code = match parse(args) {
        Ok(spec) => run(&spec),
        Err(why) => {
            eprintln!("corral: gate-exec: {why}");
            EXIT_SETUP_FAILED
        }
    };
    std::process::exit(code)
}

fn run(spec: &Spec) -> i32 {
    let step = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("corral: gate-exec: {what}: {e}");
        EXIT_SETUP_FAILED
    };
    if spec.init && std::process::id() != 1 {
        return step(
            "start",
            &format!(
                "it must be the container's PID 1, and is {} (an image ENTRYPOINT or an engine \
                 init in front of it would be a process outside the command's filters)",
                std::process::id()
            ),
        );
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return step("set PR_SET_DUMPABLE 0", &std::io::Error::last_os_error());
    }
    let mountinfo = match crate::mountinfo::read_proc("/proc/self/mountinfo") {
        Ok(m) => m,
        Err(e) => return step("read /proc/self/mountinfo", &e),
    };
    let own = match own_devices(&mountinfo, &spec.host_paths) {
        Ok(own) => own,
        Err(e) => return step("find the container's own file systems", &e),
    };
    let mut gate = match corral_namegate::Gate::new(&spec.git_dirs, own, &mountinfo) {
        Ok(gate) => gate,
        Err(e) => return step("hold the protected files", &e),
    };
    if let Some(project) = &spec.project {
        match corral_namegate::Hidden::of_patterns(&spec.hide, project) {
            Ok(hidden) => gate.hidden = hidden,
            Err(e) => return step("read the hide patterns", &e),
        }
    }
    let base = match crate::seccomp::build_filter() {
        Ok(p) => p,
        Err(e) => return step("build the seccomp filter", &e),
    };
    let gate_prog = match crate::seccomp::build_gate_filter() {
        Ok(p) => p,
        Err(e) => return step("build the name gate's filter", &e),
    };
    let (to_gate, from_command) = match nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    ) {
        Ok(pair) => pair,
        Err(e) => return step("make the name gate's socket", &e),
    };
    // The signals passed on are held from here until each side has its handling in place:
    // one arriving in between would otherwise find the default action.
    let forwarded: SigSet = FORWARDED.iter().copied().collect();
    let _ = forwarded.thread_block();
    // SAFETY: single-threaded (called first thing in main; the gate's threads start after).
    match unsafe { fork() } {
        Err(e) => step("fork the command's process", &e),
        Ok(ForkResult::Child) => {
            drop(from_command);
            std::process::exit(exec_command(spec, &base, &gate_prog, to_gate))
        }
        Ok(ForkResult::Parent { child }) => {
            drop(to_gate);
            // The command has the terminal's foreground: a background write must not stop the
            // gate (with `stty tostop`), nor a read.
            for sig in [Signal::SIGTTOU, Signal::SIGTTIN] {
                // SAFETY: SIG_IGN installs no handler.
                let _ = unsafe { signal(sig, SigHandler::SigIgn) };
            }
            gate.serve(from_command, || {
                crate::caps::keep_only(corral_namegate::CAP_SYS_PTRACE)
            });
            if let Err(e) = crate::caps::drop_all() {
                eprintln!("corral: gate-exec: drop capabilities: {e}");
            }
            // PID 1: every orphan of the container is reaped here.
            crate::child::wait_forwarding(child, true, None)
        }
    }
}

/// The devices of the container's own file systems in `mountinfo` (this process's): a tmpfs or
/// overlay mounted whole, not at or below any of the plan's binds `host`, on no device one of
/// them is on. A bind that cannot be looked at is an error (its device would go unexcluded).
fn own_devices(mountinfo: &[u8], host: &[PathBuf]) -> std::io::Result<HashSet<u64>> {
    let mut host_devs = HashSet::new();
    let mut resolved = Vec::new();
    for p in host {
        let named =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()));
        host_devs.insert(std::fs::metadata(p).map_err(named)?.dev());
        // Mount points in mountinfo are resolved paths: so is each bind's, to compare them (a
        // bind at /var/run/x is mounted at /run/x where the image links /var/run to /run).
        resolved.push(std::fs::canonicalize(p).map_err(named)?);
    }
    let mut own = HashSet::new();
    for line in mountinfo.split(|&b| b == b'\n') {
        let Some(mount) = crate::mountinfo::Mount::parse(line) else {
            continue;
        };
        let whole = mount.root == b"/";
        let kind = matches!(mount.fstype.as_slice(), b"tmpfs" | b"overlay");
        let point = std::path::Path::new(std::ffi::OsStr::from_bytes(&mount.point));
        let in_bind = host.iter().chain(&resolved).any(|h| point.starts_with(h));
        // The engines make /dev/shm a tmpfs of the host's, in their own storage, bound in.
        let host_shm = point == std::path::Path::new("/dev/shm");
        if !(whole && kind) || in_bind || host_shm {
            continue;
        }
        if let Ok(m) = std::fs::symlink_metadata(point)
            && !host_devs.contains(&m.dev())
        {
            own.insert(m.dev());
        }
    }
    Ok(own)
}

/// The command's process, from fork to exec: the terminal's foreground, no core dumps, no
/// capability, no descriptor but the standard ones, corral's filter, the gate's filter (its
/// listener sent to the gate), exec on PATH. Returns the exit status when it cannot exec.
fn exec_command(
    spec: &Spec,
    base: &[libc::sock_filter],
    gate: &[libc::sock_filter],
    to_gate: OwnedFd,
) -> i32 {
    crate::sig::reset_dispositions(FORWARDED);
    crate::sig::reset_dispositions(&[Signal::SIGCHLD, Signal::SIGPIPE]);
    let _ = SigSet::all().thread_unblock();
    take_foreground();
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("corral: gate-exec: {what}: {e}");
        EXIT_SETUP_FAILED
    };
    if let Err(e) = crate::rlimit::no_core_dumps() {
        return fail("disable core dumps", &e);
    }
    // As the native jail's command: no capability (a container started with none has none
    // to drop).
    if let Err(e) = crate::caps::drop_all() {
        return fail("drop capabilities", &e);
    }
    let to_gate = match crate::child::close_other_fds(Some(to_gate)) {
        Ok(Some(fd)) => fd,
        Ok(None) => unreachable!("the socket was passed"),
        Err(e) => return fail("close inherited descriptors", &e),
    };
    if let Err(e) = crate::seccomp::install_program(base) {
        return fail("install the seccomp filter", &e);
    }
    if let Err((step, e)) = crate::seccomp::install_and_send(
        gate,
        to_gate.as_raw_fd(),
        "the container",
        spec.require_gate,
    ) {
        return fail(step, &e);
    }
    drop(to_gate);
    let command = &spec.command;
    let argv: Result<Vec<CString>, _> =
        command.iter().map(|a| CString::new(a.as_bytes())).collect();
    let Ok(argv) = argv else {
        return fail("the command", &"it holds a NUL byte");
    };
    let err = nix::unistd::execvp(&argv[0], &argv).unwrap_err();
    eprintln!(
        "corral: {}: cannot execute: {}",
        command[0].to_string_lossy(),
        err.desc()
    );
    match err {
        nix::errno::Errno::ENOENT => EXIT_NOT_FOUND,
        _ => EXIT_NOT_EXECUTABLE,
    }
}

/// With the terminal on stdin in this process's foreground (`podman run --tty`), a process
/// group of its own that takes the foreground: the terminal's ^C and ^Z reach the command alone,
/// and the gate passes on what the engine's init sends it.
fn take_foreground() {
    // SAFETY: tcgetpgrp/getpgrp take integers only.
    let foreground = unsafe { libc::tcgetpgrp(0) == libc::getpgrp() };
    if !foreground {
        return;
    }
    // SAFETY: SIG_IGN installs no handler; setpgid/tcsetpgrp take integers only.
    unsafe {
        let _ = signal(Signal::SIGTTOU, SigHandler::SigIgn);
        if libc::setpgid(0, 0) == 0 {
            libc::tcsetpgrp(0, libc::getpid());
        }
        let _ = signal(Signal::SIGTTOU, SigHandler::SigDfl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn arguments_name_git_dirs_host_paths_and_the_command() {
        let spec = parse(args(&[
            "--git-dir",
            "/p/.git",
            "--host-path",
            "/p",
            "--git-dir",
            "/p/sub/.git",
            "--hide",
            ".env",
            "--project",
            "/p",
            "--hide",
            "*.pem",
            "--",
            "bash",
            "--git-dir",
            "-c",
        ]))
        .unwrap();
        assert_eq!(
            spec,
            Spec {
                git_dirs: vec!["/p/.git".into(), "/p/sub/.git".into()],
                host_paths: vec!["/p".into()],
                hide: vec![".env".into(), "*.pem".into()],
                project: Some("/p".into()),
                init: false,
                require_gate: false,
                command: args(&["bash", "--git-dir", "-c"]),
            }
        );
        let spec = parse(args(&["--init", "--require-gate", "--", "sh"])).unwrap();
        assert!(spec.init && spec.require_gate);
        for bad in [
            &["--"][..],
            &["bash"],
            &["--git-dir"],
            &["--host-path", "/p"],
            &["--hide"],
            &["--project"],
            &["--hide", ".env", "--", "sh"],
        ] {
            assert!(parse(args(bad)).is_err(), "{bad:?}");
        }
    }

    /// A mountinfo line for `point` (root `root`, type `fstype`).
    fn line(point: &str, root: &str, fstype: &str) -> String {
        format!("36 35 0:42 {root} {point} rw,nosuid shared:9 - {fstype} none rw\n")
    }

    #[test]
    fn only_whole_tmpfs_and_overlay_mounts_outside_the_binds_are_the_containers_own() {
        // The "bind" is /proc (a device of its own); the candidates are real directories on
        // the temporary directory's device.
        let host = vec![PathBuf::from("/proc")];
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().to_str().unwrap();
        let dev = |p: &str| std::fs::metadata(p).unwrap().dev();
        let own = |lines: &[String], host: &[PathBuf]| {
            own_devices(lines.concat().as_bytes(), host).unwrap()
        };
        // A whole tmpfs or overlay elsewhere is the container's own (its /tmp, /run, home).
        assert_eq!(
            own(&[line(o, "/", "tmpfs")], &host),
            HashSet::from([dev(o)])
        );
        assert_eq!(
            own(&[line(o, "/", "overlay")], &host),
            HashSet::from([dev(o)])
        );
        // A host mount nested in a bind (engines bind recursively), the bind itself, a part of
        // a file system (a bind of the host's), any other type: never.
        for l in [
            line("/proc/sys", "/", "tmpfs"),
            line("/proc", "/", "tmpfs"),
            line(o, "/containers/x/userdata", "tmpfs"),
            line(o, "/", "ext4"),
            line(o, "/", "devpts"),
        ] {
            assert_eq!(own(std::slice::from_ref(&l), &host), HashSet::new(), "{l}");
        }
        // Nor one on a device a bind is on.
        let a = dir.path().join("a");
        std::fs::create_dir(&a).unwrap();
        assert_eq!(own(&[line(o, "/", "tmpfs")], &[a]), HashSet::new());
        // /dev/shm is the engine's tmpfs on the host, bound in.
        assert_eq!(
            own(&[line("/dev/shm", "/", "tmpfs")], &host),
            HashSet::new()
        );
        // A bind named through a link is compared where it resolves to: here a link to / makes
        // /proc (a device of its own) a mount nested in the bind.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/", &link).unwrap();
        let nested = line("/proc", "/", "tmpfs");
        assert_eq!(own(&[nested], std::slice::from_ref(&link)), HashSet::new());
        // Escaped mount points are decoded before they are looked at.
        let spaced = dir.path().join("with space");
        std::fs::create_dir(&spaced).unwrap();
        let escaped = spaced.to_str().unwrap().replace(' ', "\\040");
        assert_eq!(
            own(&[line(&escaped, "/", "tmpfs")], &host),
            HashSet::from([dev(o)])
        );
    }

    #[test]
    fn a_bind_that_cannot_be_looked_at_is_an_error_and_links_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert!(own_devices(b"", &[missing]).is_err());
        // A bind named through a link counts the device the link leads to.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/", &link).unwrap();
        let root_dev = std::fs::metadata("/").unwrap().dev();
        let info = line("/", "/", "overlay");
        assert!(
            !own_devices(info.as_bytes(), &[link])
                .unwrap()
                .contains(&root_dev)
        );
    }
}
