//! The name gate in a container: `corral __corral-gate-exec [--git-dir D]... [--host-path P]...
//! -- COMMAND...` is the harness container's entrypoint (corral-engine `argv.rs`), under the
//! engine's small init. It does for the container what the native jail's PID 1 does: it forks
//! the command with corral's whole seccomp filter and the name gate's filter on it, and serves
//! the gate's notifications on a thread of its own (namegate.rs) until the command ends, whose
//! exit status it returns as a shell would.
//!
//! The container's own profile is corral's rules less the three syscalls the gate makes
//! (`seccomp::oci_profile_gated`); the command gets the whole filter here, before it runs,
//! so it and everything it starts are held to every rule. This process is non-dumpable: the
//! command (same uid, no capabilities) can neither read its memory nor take its descriptors.
//! It can kill it (the same uid), which leaves every creation failing (the listener's last copy
//! closes: ENOSYS), never one performed unchecked.
//!
//! What is the container's own: every mount but the read-write binds the plan names
//! (`--host-path`), compared by device. The image's root, its tmpfs /tmp, /run and home are
//! not the host's (a clone in /tmp works); a device that one of those binds is on is checked
//! everywhere.

use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use nix::sys::signal::{SigHandler, Signal, signal};
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
    command: Vec<OsString>,
}

fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Spec, String> {
    let mut spec = Spec {
        git_dirs: Vec::new(),
        host_paths: Vec::new(),
        command: Vec::new(),
    };
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let list = match a.to_str() {
            Some("--") => {
                spec.command = args.collect();
                break;
            }
            Some("--git-dir") => &mut spec.git_dirs,
            Some("--host-path") => &mut spec.host_paths,
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
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        eprintln!(
            "corral: gate-exec: set PR_SET_DUMPABLE 0: {}",
            std::io::Error::last_os_error()
        );
        return EXIT_SETUP_FAILED;
    }
    let gate = crate::namegate::Gate::new(&spec.git_dirs, own_devices(&spec.host_paths));
    let step = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("corral: gate-exec: {what}: {e}");
        EXIT_SETUP_FAILED
    };
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
    // SAFETY: single-threaded (called first thing in main; the gate's threads start after).
    match unsafe { fork() } {
        Err(e) => step("fork the command's process", &e),
        Ok(ForkResult::Child) => {
            drop(from_command);
            std::process::exit(exec_command(&spec.command, &base, &gate_prog, to_gate))
        }
        Ok(ForkResult::Parent { child }) => {
            drop(to_gate);
            // The command has the terminal's foreground: a background write must not stop the
            // gate (with `stty tostop`), nor a read.
            for sig in [Signal::SIGTTOU, Signal::SIGTTIN] {
                // SAFETY: SIG_IGN installs no handler.
                let _ = unsafe { signal(sig, SigHandler::SigIgn) };
            }
            gate.serve(from_command);
            if let Err(e) = crate::caps::drop_all() {
                eprintln!("corral: gate-exec: drop capabilities: {e}");
            }
            crate::child::wait_forwarding(child, false, None)
        }
    }
}

/// The devices of every mount this process sees but those the read-write binds `host` are on.
fn own_devices(host: &[PathBuf]) -> HashSet<u64> {
    let dev = |p: &std::path::Path| std::fs::symlink_metadata(p).ok().map(|m| m.dev());
    let host: HashSet<u64> = host.iter().filter_map(|p| dev(p)).collect();
    let mountinfo = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    mountinfo
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .filter_map(|point| dev(std::path::Path::new(&OsString::from_vec(unescape(point)))))
        .filter(|d| !host.contains(d))
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// The command's process, from fork to exec: the terminal's foreground, no core dumps, no
/// descriptor but the standard ones, corral's filter, the gate's filter (its listener sent to
/// the gate), exec on PATH. Returns the exit status when it cannot exec.
fn exec_command(
    command: &[OsString],
    base: &[libc::sock_filter],
    gate: &[libc::sock_filter],
    to_gate: OwnedFd,
) -> i32 {
    crate::sig::reset_dispositions(FORWARDED);
    crate::sig::reset_dispositions(&[Signal::SIGCHLD, Signal::SIGPIPE]);
    take_foreground();
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("corral: gate-exec: {what}: {e}");
        EXIT_SETUP_FAILED
    };
    // No core dumps: with a core_pattern naming the file after the program (`%e`), a process
    // could name a file `objects` without a syscall the gate sees.
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
        return fail("disable core dumps", &std::io::Error::last_os_error());
    }
    let to_gate = match crate::child::close_other_fds(Some(to_gate)) {
        Ok(Some(fd)) => fd,
        Ok(None) => unreachable!("the socket was passed"),
        Err(e) => return fail("close inherited descriptors", &e),
    };
    if let Err(e) = crate::seccomp::install_program(base) {
        return fail("install the seccomp filter", &e);
    }
    let listener = match crate::seccomp::install_gate(gate) {
        Ok(Some(l)) => Some(l),
        Ok(None) => {
            eprintln!(
                "corral: this kernel lacks what the name gate needs (Linux 5.19): git \
                 repositories the container creates are checked when the run ends instead"
            );
            None
        }
        Err(e) => return fail("install the name gate's filter", &e),
    };
    if let Err(e) = crate::namegate::send_listener(to_gate.as_raw_fd(), listener.as_ref()) {
        return fail("send the name gate's listener", &e);
    }
    drop(listener);
    drop(to_gate);
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
                command: args(&["bash", "--git-dir", "-c"]),
            }
        );
        for bad in [
            &["--"][..],
            &["bash"],
            &["--git-dir"],
            &["--host-path", "/p"],
        ] {
            assert!(parse(args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(br"/a\040b\134c\011"), b"/a b\\c\t");
        assert_eq!(unescape(br"/x\04"), br"/x\04");
        assert_eq!(unescape(br"/x\999"), br"/x\999");
    }

    #[test]
    fn a_bind_of_the_host_is_never_counted_as_the_containers_own() {
        let here = std::env::current_dir().unwrap();
        let dev = std::fs::metadata(&here).unwrap().dev();
        assert!(!own_devices(std::slice::from_ref(&here)).contains(&dev));
        assert!(own_devices(&[]).contains(&std::fs::metadata("/").unwrap().dev()));
    }
}
