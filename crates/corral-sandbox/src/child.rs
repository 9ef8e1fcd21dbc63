//! Inside the jail: the set-up process, the jail's PID 1, and the command's process.
//!
//! The set-up process is a fork of corral's main thread taken first thing in `main`
//! (`spawn::prepare_early`: environment and arguments wiped), or `corral __corral-jail-init`,
//! corral re-executed (`spawn::prepare`); either way a single-threaded process with a control
//! socket on fd 3. From there everything reads top to bottom in the order the kernel sees it:
//!
//! 1. set-up process: close inherited descriptors, read the namespace config (ids, network
//!    rules, cgroup), join the cgroup, unshare the namespaces (user, mount, pid, ipc, uts,
//!    cgroup, and net unless `network.mode = "host"`), write the uid/gid maps (setgroups
//!    denied, the caller's ids kept), bound the jail's share of the caller's per-user kernel
//!    counts (`ucounts.rs`), set the hostname, bring lo up and create the
//!    proxy/host_ports listeners, send them to corral; read the Plan (with the jail's stdio),
//!    fork the jail's PID 1; then wait for it,
//!    forwarding signals and serving corral's socket requests on the control socket (sockets
//!    made in the jail's network namespace, for `--publish`).
//! 2. PID 1: die with the set-up process (PDEATHSIG), build the root (`mounts.rs`, ending in
//!    pivot_root and the old root detached), become non-dumpable, fork the command's process;
//!    then reap zombies and forward signals until the command exits, and exit with its status.
//! 3. command's process: a new session (and the pty as controlling terminal when there is one),
//!    working directory, rlimits (best-effort fallback only), Landlock, all capabilities
//!    dropped with no_new_privs, every other fd closed, the seccomp filter, exec.
//!
//! Each step is a function whose error names the step and the path; a failure prints
//! `corral: jail set-up: ...` on the jail's stderr and exits 125.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use corral_policy::plan::{Dns, NetworkMode, NetworkPlan, Plan};
use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use serde::{Deserialize, Serialize};

use crate::error::JailError;
use crate::sig::SignalPipe;
use crate::term::PtyEnds;
use crate::{EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED, mounts, netns};

/// The control socket's fd number in the set-up process.
pub(crate) const CTL_FD: RawFd = 3;

/// Signals the set-up process and PID 1 pass on to the jail.
pub(crate) const FORWARDED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

/// What the set-up process needs to build the jail's namespaces, sent as soon as corral knows
/// it (`PreparedJail::enter_namespaces`): the part of the Plan that is final once it is
/// resolved, and the cgroup. The set-up process works on it while corral finishes the Plan.
#[derive(Serialize, Deserialize)]
pub(crate) struct NamespaceConfig {
    pub uid: u32,
    pub gid: u32,
    pub network: NetworkPlan,
    /// Files the set-up process writes its pid into before unsharing (cgroup membership).
    pub cgroup_procs: Vec<PathBuf>,
}

/// The rest, sent with the jail's stdin, stdout and stderr (`PreparedJail::start`).
#[derive(Serialize, Deserialize)]
pub(crate) struct InitConfig {
    pub plan: Plan,
    /// Which of stdin, stdout and stderr are the jail's own pty (`jail_pty`; the others come
    /// with the config). With any, the pty is the command's controlling terminal.
    pub pty: PtyEnds,
    /// The limits no cgroup enforces, applied as rlimits (the best-effort fallback; with
    /// `strict` corral refused to start instead).
    pub rlimits: corral_policy::plan::Limits,
    /// The soft open-file limit corral started with (it raised its own): the command's.
    #[serde(default)]
    pub nofile_soft: Option<u64>,
    /// The config comes with one more descriptor, last: the read end of the exec gate. PID 1
    /// builds the root, then waits for one byte on it before it forks the command's process
    /// (EOF: corral let the jail go without releasing it; the command never runs).
    #[serde(default)]
    pub exec_gate: bool,
    /// One more descriptor after that one: the write end of the exit pipe. Once it has reaped
    /// PID 1, the set-up process lets go of the jail's stdio and writes the command's exit
    /// code there (4 bytes, little-endian), then exits: corral goes on while the kernel takes
    /// down the namespaces.
    #[serde(default)]
    pub exit_pipe: bool,
    /// One more descriptor before the exec gate's: the run's change record (a directory on
    /// the host), PID 1's alone, for its name gate (namegate/record.rs in corral-namegate).
    #[serde(default)]
    pub record: bool,
}

/// Entry point of `corral __corral-jail-init` (a fresh exec, the control socket on fd 3).
/// Never returns.
pub fn init_main() -> ! {
    exit_with(set_up_process())
}

/// Entry point of a set-up process forked by `prepare_early` (spawn.rs), with its end of the
/// control socket; `detached` says whether it now dies with corral in its own session. Never
/// returns.
pub(crate) fn init_forked(ctl: OwnedFd, detached: bool) -> ! {
    if !detached {
        // corral is already gone, or the jail could outlive it: never start.
        std::process::exit(EXIT_SETUP_FAILED)
    }
    // The control socket goes where a re-executed set-up process finds it (close-on-exec: the
    // jail's processes never get it). Until its config arrives this process holds the caller's
    // stderr only, as a re-executed one does.
    let raw = ctl.into_raw_fd();
    // SAFETY: dup3 onto fd 3 and close of the original, both descriptors of this process that
    // nothing else here uses; `set_up_process` owns fd 3 from here.
    let placed = raw == CTL_FD
        || unsafe { libc::dup3(raw, CTL_FD, libc::O_CLOEXEC) == CTL_FD && libc::close(raw) == 0 };
    if !placed || redirect_to_null(&[0, 1]).is_err() {
        exit_with(Err(JailError::step(
            "place the control socket",
            std::io::Error::last_os_error(),
        )))
    }
    exit_with(set_up_process())
}

fn exit_with(result: Result<i32, JailError>) -> ! {
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("corral: jail set-up: {e}");
            EXIT_SETUP_FAILED
        }
    };
    std::process::exit(code)
}

/// Point each of `fds` at /dev/null.
fn redirect_to_null(fds: &[RawFd]) -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in fds {
        // SAFETY: dup2 onto a stdio descriptor of this process.
        if unsafe { libc::dup2(null.as_raw_fd(), *fd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn set_up_process() -> Result<i32, JailError> {
    // SAFETY: fd 3 was placed there by corral for this process alone.
    let ctl = unsafe { OwnedFd::from_raw_fd(CTL_FD) };
    close_inherited_fds()?;
    let Some((ns, _)) = read_message::<NamespaceConfig>(&ctl, 0)? else {
        return Ok(EXIT_SETUP_FAILED);
    };
    join_cgroup(&ns.cgroup_procs)?;
    let counts = crate::ucounts::JailCounts::read()?;
    unshare_namespaces(ns.network.mode)?;
    write_id_maps(ns.uid, ns.gid)?;
    counts.apply()?;
    nix::unistd::sethostname("corral").map_err(|e| JailError::step("set the hostname", e))?;
    let net = match ns.network.mode {
        NetworkMode::None | NetworkMode::Proxy => {
            netns::bring_up_loopback()?;
            let mut net = netns::create_listeners(
                ns.network.mode == NetworkMode::Proxy,
                &ns.network.host_ports,
            )?;
            match (ns.network.mode, ns.network.dns) {
                (NetworkMode::Proxy, Dns::Stub) => {
                    netns::add_stub_pool()?;
                    netns::create_stub_sockets(&mut net, &netns::capture_ports(&ns.network))?;
                }
                (_, Dns::None) | (NetworkMode::None | NetworkMode::Host, Dns::Stub) => {}
            }
            net
        }
        NetworkMode::Host => netns::JailNet::default(),
    };
    netns::send_listeners(CTL_FD, &net)?;
    drop(net);
    // The jail's stdio comes with the config, except the ends that are a terminal in corral:
    // those are the pty the jail makes below.
    let Some((config, mut stdio)) = read_init(&ctl)? else {
        return Ok(EXIT_SETUP_FAILED);
    };
    // The exit pipe's write end came last (`InitConfig::exit_pipe`): this process's alone,
    // with /dev/null opened now, while this process's root is the host's (PID 1's pivot_root
    // changes it to the jail's).
    let exit_pipe = match config.exit_pipe {
        true => match (stdio.pop(), open_null()) {
            (Some(pipe), Ok(null)) => Some((pipe, OwnedFd::from(null))),
            _ => None,
        },
        false => None,
    };
    // The exec gate's read end before it (`InitConfig::exec_gate`): PID 1's alone.
    let gate = match config.exec_gate {
        true => stdio.pop(),
        false => None,
    };
    let record = match config.record {
        true => stdio.pop(),
        false => None,
    };
    // One Plan: the namespaces were built from the same ids and network rules.
    if (config.plan.uid, config.plan.gid) != (ns.uid, ns.gid) || config.plan.network != ns.network {
        return Err(JailError::Plan(
            "the jail's plan differs from the one its namespaces were built for".into(),
        ));
    }
    let slave = match config.pty.any() {
        true => match jail_pty(&ctl)? {
            Some(slave) => Some(slave),
            None => return Ok(EXIT_SETUP_FAILED),
        },
        false => None,
    };
    install_stdio(config.pty, slave, stdio)?;
    // The control socket stays open: it is now corral's socket factory for the jail's network
    // namespace (`--publish`), served from the wait loop below. The jail never holds it.
    // SAFETY: this process is single-threaded (forked from corral's only thread, or a fresh
    // exec of corral, and it started no thread).
    match unsafe { fork() }.map_err(|e| JailError::step("fork the jail's PID 1", e))? {
        ForkResult::Child => {
            // PID 1 and everything it starts must never reach the factory, nor the exit pipe.
            drop(ctl);
            drop(exit_pipe);
            let code = match pid_one(&config, gate, record) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("corral: jail set-up: {e}");
                    EXIT_SETUP_FAILED
                }
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => {
            drop(gate);
            let code = wait_forwarding(child, false, Some(ctl));
            if let Some((pipe, null)) = exit_pipe {
                say_exit(pipe, null, code);
            }
            Ok(code)
        }
    }
}

/// /dev/null, for reading and writing.
fn open_null() -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
}

/// Tell corral the command's `code` on the exit pipe, the jail being empty (PID 1 reaped): the
/// jail's stdio goes first (it is this process's own 0, 1 and 2: `null` takes their place), so
/// corral's copies of the jail's output see its end now, not once this process has exited. A
/// failure only means corral waits for this process's exit instead.
fn say_exit(pipe: OwnedFd, null: OwnedFd, code: i32) {
    for fd in 0..=2 {
        // SAFETY: dup2 of a descriptor this process owns onto one of its stdio descriptors.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
    let _ = nix::unistd::write(&pipe, &code.to_le_bytes());
}

/// Descriptors the caller of corral leaked to it must not enter the jail, not even its PID 1:
/// keep stdio and the control socket only.
fn close_inherited_fds() -> Result<(), JailError> {
    // SAFETY: close_range on descriptors above the control socket, none of which this process
    // uses (it has opened nothing yet).
    if unsafe { libc::close_range(CTL_FD as libc::c_uint + 1, libc::c_uint::MAX, 0) } != 0 {
        return Err(JailError::step(
            "close inherited descriptors",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The jail's config, with those of its stdin, stdout and stderr that are not its pty.
fn read_init(ctl: &OwnedFd) -> Result<Option<(InitConfig, Vec<OwnedFd>)>, JailError> {
    let Some((body, received)) = netns::recv_frame(ctl.as_raw_fd())? else {
        return Ok(None);
    };
    let config: InitConfig =
        serde_json::from_slice(&body).map_err(|e| JailError::step("decode the jail config", e))?;
    let want = config.pty.by_fd().iter().filter(|p| !**p).count()
        + usize::from(config.record)
        + usize::from(config.exec_gate)
        + usize::from(config.exit_pipe);
    if received.len() != want {
        return Err(JailError::Plan(format!(
            "the jail config came with {} descriptors, not {want}",
            received.len()
        )));
    }
    Ok(Some((config, received)))
}

/// When an end is a terminal in corral: the jail's pty, from a devpts instance of the jail's own mounted over
/// /dev/pts in this mount namespace (PID 1 binds that instance into the jail's /dev), so the
/// terminal has a name inside the jail (`tty`, ttyname(3), /dev/tty all work). The master goes
/// to corral, which copies the user's terminal settings onto it, relays it, and answers; the
/// slave is returned for the jail's stdio. `None`: corral went away first.
fn jail_pty(ctl: &OwnedFd) -> Result<Option<OwnedFd>, JailError> {
    use nix::mount::{MsFlags, mount};
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| JailError::at("make mounts private", "/", e))?;
    mount(
        Some("devpts"),
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| JailError::at("mount the jail's devpts", "/dev/pts", e))?;
    let master = nix::fcntl::open(
        "/dev/pts/ptmx",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NOCTTY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| JailError::at("open the jail's pty", "/dev/pts/ptmx", e))?;
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int, which we provide, on the master just opened.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } != 0 {
        return Err(JailError::step(
            "unlock the jail's pty",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor for the slave.
    let slave = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(JailError::step(
            "open the jail's pty slave",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    netns::send_frame(ctl.as_raw_fd(), b"{}", &[master.as_raw_fd()])
        .map_err(|e| JailError::step("send the jail's pty to corral", e))?;
    drop(master);
    Ok(netns::recv_frame(ctl.as_raw_fd())?.map(|_| slave))
}

/// Read one message corral sends (spawn.rs, a `netns::send_frame` frame) carrying exactly `fds`
/// descriptors. `None` when corral closed the socket before sending it (it ended, or dropped
/// this jail): nothing to report.
fn read_message<T: serde::de::DeserializeOwned>(
    ctl: &OwnedFd,
    fds: usize,
) -> Result<Option<(T, Vec<OwnedFd>)>, JailError> {
    let Some((body, received)) = netns::recv_frame(ctl.as_raw_fd())? else {
        return Ok(None);
    };
    if received.len() != fds {
        return Err(JailError::Plan(format!(
            "a message on the jail's control socket came with {} descriptors, not {fds}",
            received.len()
        )));
    }
    let value =
        serde_json::from_slice(&body).map_err(|e| JailError::step("decode the jail config", e))?;
    Ok(Some((value, received)))
}

/// The jail's stdin, stdout and stderr become this process's 0, 1 and 2: the pty `slave` for
/// the ends in `pty`, corral's descriptors in `others` (in order) for the rest. dup2 clears
/// close-on-exec there, so the command inherits them.
fn install_stdio(
    pty: PtyEnds,
    slave: Option<OwnedFd>,
    others: Vec<OwnedFd>,
) -> Result<(), JailError> {
    let mut others = others.iter();
    let mut fds: Vec<&OwnedFd> = Vec::with_capacity(3);
    for is_pty in pty.by_fd() {
        let fd = match is_pty {
            true => slave.as_ref(),
            false => others.next(),
        };
        fds.push(fd.ok_or_else(|| {
            JailError::Plan("the jail's stdio came without one of its descriptors".into())
        })?);
    }
    for (target, fd) in fds.into_iter().enumerate() {
        // SAFETY: dup2 onto this process's own stdio descriptors.
        if unsafe { libc::dup2(fd.as_raw_fd(), target as RawFd) } < 0 {
            return Err(JailError::step(
                "install the jail's stdio",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

fn join_cgroup(procs: &[PathBuf]) -> Result<(), JailError> {
    for file in procs {
        std::fs::write(file, "0").map_err(|e| JailError::at("join the jail's cgroup", file, e))?;
    }
    Ok(())
}

fn unshare_namespaces(mode: NetworkMode) -> Result<(), JailError> {
    let mut flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWCGROUP;
    match mode {
        NetworkMode::None | NetworkMode::Proxy => flags |= CloneFlags::CLONE_NEWNET,
        NetworkMode::Host => {}
    }
    nix::sched::unshare(flags).map_err(|e| {
        JailError::step(
            "unshare the namespaces (are unprivileged user namespaces enabled? see `corral doctor`)",
            e,
        )
    })
}

/// The caller's uid and gid map to themselves: files keep their owners, and the jail's
/// processes are the caller, not root. setgroups is denied first, as the kernel requires.
fn write_id_maps(uid: u32, gid: u32) -> Result<(), JailError> {
    let write = |path: &str, text: String| {
        std::fs::write(path, text).map_err(|e| JailError::at("write the id maps", path, e))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
}

/// Wait for `child`, passing on forwarded signals, reaping every other child (as PID 1 must)
/// when `reap_all`, and answering corral's socket requests on `ctl` (the set-up process) until
/// corral closes it. Returns the child's exit status as a shell would (signal N: 128+N).
pub(crate) fn wait_forwarding(child: Pid, reap_all: bool, mut ctl: Option<OwnedFd>) -> i32 {
    let mut watched = FORWARDED.to_vec();
    watched.push(Signal::SIGCHLD);
    let pipe = match SignalPipe::install(&watched) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!(
                "corral: jail: cannot install signal handlers ({e}); signals are not forwarded"
            );
            None
        }
    };
    // A caller that held them until now (gatexec.rs) gets them from here on.
    let _ = watched
        .iter()
        .copied()
        .collect::<nix::sys::signal::SigSet>()
        .thread_unblock();
    loop {
        // Reap first: the child may have exited before the handlers were in place.
        loop {
            let target = if reap_all { Pid::from_raw(-1) } else { child };
            match waitpid(target, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => return code,
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => return 128 + sig as i32,
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return EXIT_SETUP_FAILED,
            }
        }
        if let Some(fd) = &ctl
            && control_readable(fd, pipe.as_ref())
        {
            match netns::serve_socket_request(fd.as_raw_fd()) {
                Ok(true) => {}
                Ok(false) => ctl = None,
                Err(e) => {
                    eprintln!("corral: jail: socket factory stopped: {e}");
                    ctl = None;
                }
            }
            continue;
        }
        let signals = match (&pipe, ctl.is_some()) {
            // control_readable already waited on the signal pipe too.
            (Some(p), true) => p.drain(),
            (Some(p), false) => p.wait(1000),
            (None, _) => {
                std::thread::sleep(std::time::Duration::from_millis(50));
                Vec::new()
            }
        };
        for sig in signals {
            if sig != Signal::SIGCHLD {
                let _ = kill(child, sig);
            }
        }
    }
}

/// Block until the control socket or the signal pipe is readable (or a second passes); true
/// when the control socket has a request (or was closed) to handle.
fn control_readable(ctl: &OwnedFd, pipe: Option<&SignalPipe>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = vec![PollFd::new(ctl.as_fd(), PollFlags::POLLIN)];
    if let Some(p) = pipe {
        fds.push(PollFd::new(p.fd().as_fd(), PollFlags::POLLIN));
    }
    let timeout = if pipe.is_some() { 1000u16 } else { 50 };
    match poll(&mut fds, PollTimeout::from(timeout)) {
        Ok(n) if n > 0 => fds[0].revents().is_some_and(|r| !r.is_empty()),
        _ => false,
    }
}

/// The jail's PID 1. With a `gate`, the command's process is forked only once corral released
/// it (`RunningJail::release_exec`): the root is built meanwhile.
fn pid_one(
    config: &InitConfig,
    gate: Option<OwnedFd>,
    record: Option<OwnedFd>,
) -> Result<i32, JailError> {
    die_with_parent()?;
    let private = mounts::set_up_root(&config.plan, config.pty.any())?;
    make_non_dumpable()?;
    if let Some(gate) = gate {
        wait_for_gate(gate)?;
    }
    // The name gate (namegate.rs) performs the command's creations with the command's rights:
    // one Landlock domain for PID 1 and everything it forks; the command drops every
    // capability, PID 1 too once the gate's thread (CAP_SYS_PTRACE only) has started.
    let names = corral_namegate::Gate::prepare(&config.plan, &private.0)
        .map_err(|e| JailError::step("hold the protected files for the name gate", e))?;
    // The change record goes with the gate (which performs every change it records); without
    // a gate (`filesystem.allow_new_repositories`, or no seccomp listener) nothing is recorded
    // and corral says so when the run ends.
    let (names, record_dir) = with_record(names, record, &config.plan)?;
    let filters = Filters::build(names.is_some(), record_dir.is_some())?;
    crate::landlock::restrict_with_record(&config.plan, record_dir.as_ref().map(|d| d.as_fd()))
        .map_err(|e| JailError::step("apply Landlock", e))?;
    let channel = match names {
        Some(_) => Some(
            nix::sys::socket::socketpair(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::Stream,
                None,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            )
            .map_err(|e| JailError::step("make the name gate's socket", e))?,
        ),
        None => None,
    };
    let (to_gate, from_command) = match channel {
        Some((a, b)) => (Some(a), Some(b)),
        None => (None, None),
    };
    // SAFETY: single-threaded (forked from the single-threaded set-up process; the gate's
    // threads start after this fork).
    match unsafe { fork() }.map_err(|e| JailError::step("fork the command's process", e))? {
        ForkResult::Child => {
            drop(from_command);
            let code = match exec_command(config, filters, to_gate) {
                Ok(never) => match never {},
                Err(CommandError::Setup(e)) => {
                    eprintln!("corral: jail set-up: {e}");
                    EXIT_SETUP_FAILED
                }
                Err(CommandError::Exec(code, msg)) => {
                    eprintln!("corral: {msg}");
                    code
                }
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => {
            drop(to_gate);
            if let (Some(names), Some(from)) = (names, from_command) {
                names.serve(from, || {
                    crate::caps::keep_only(corral_namegate::CAP_SYS_PTRACE)
                });
            }
            // PID 1 keeps nothing it does not need: no capabilities, no new privileges.
            crate::caps::drop_all().map_err(|e| JailError::step("drop PID 1's capabilities", e))?;
            Ok(wait_forwarding(child, true, None))
        }
    }
}

/// The gate with the run's change record in it, when both are there; and the record's own
/// descriptor of its directory (for Landlock's rule).
fn with_record(
    names: Option<corral_namegate::Gate>,
    record: Option<OwnedFd>,
    plan: &corral_policy::plan::Plan,
) -> Result<(Option<corral_namegate::Gate>, Option<OwnedFd>), JailError> {
    let (gate, dir) = match (names, record) {
        (Some(gate), Some(dir)) => (gate, dir),
        (names, _) => return Ok((names, None)),
    };
    let step = |e| JailError::at("open the run's change record", &plan.project.root, e);
    let for_landlock = dir.try_clone().map_err(step)?;
    let record = corral_changes::RunRecord::from_dir_fd(dir).map_err(step)?;
    let recorder = corral_namegate::Recorder::new(record, &plan.project.root).map_err(step)?;
    Ok((Some(gate.with_record(recorder)), Some(for_landlock)))
}

/// Block until corral writes the exec gate's byte; its EOF instead (corral let the jail go
/// without releasing it) is an error: the command must not run.
fn wait_for_gate(gate: OwnedFd) -> Result<(), JailError> {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(&gate, &mut byte) {
            Ok(1) => return Ok(()),
            Ok(_) => {
                return Err(JailError::Plan(
                    "corral closed the exec gate without releasing the command".into(),
                ));
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(JailError::step("wait for the exec gate", e)),
        }
    }
}

fn die_with_parent() -> Result<(), JailError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(JailError::step(
            "set PR_SET_PDEATHSIG",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// PID 1 holds the jail's control state; non-dumpable, the command cannot open its fds or memory
/// through /proc/1 or ptrace it.
fn make_non_dumpable() -> Result<(), JailError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(JailError::step(
            "set PR_SET_DUMPABLE 0",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

enum CommandError {
    Setup(JailError),
    Exec(i32, String),
}

impl From<JailError> for CommandError {
    fn from(e: JailError) -> Self {
        CommandError::Setup(e)
    }
}

/// The seccomp programs of the command, built in PID 1 before it forks.
struct Filters {
    base: Vec<libc::sock_filter>,
    gate: Option<Vec<libc::sock_filter>>,
}

impl Filters {
    fn build(gate: bool, recording: bool) -> Result<Filters, JailError> {
        let step = |e| JailError::step("build the seccomp filter", e);
        Ok(Filters {
            base: crate::seccomp::build_filter().map_err(step)?,
            gate: match gate {
                true => Some(crate::seccomp::build_gate_filter_with(recording).map_err(step)?),
                false => None,
            },
        })
    }
}

/// The command's process, from fork to exec. Landlock was PID 1's (the name gate acts in the
/// same domain).
fn exec_command(
    config: &InitConfig,
    filters: Filters,
    to_gate: Option<OwnedFd>,
) -> Result<std::convert::Infallible, CommandError> {
    let plan = &config.plan;
    crate::sig::reset_dispositions(FORWARDED);
    // SIGPIPE too: corral (a Rust program) ignores it, an ignored disposition survives exec,
    // and `corral run -- yes | head` would then end in "yes: Broken pipe" instead of quietly,
    // as std::process::Command's children do.
    crate::sig::reset_dispositions(&[Signal::SIGCHLD, Signal::SIGPIPE]);
    new_session(config.pty.first())?;
    enter_working_directory(&plan.cwd)?;
    let (path, argv, envp) = resolve_command(plan)?;
    apply_rlimits(config)?;
    if filters.gate.is_some() {
        crate::rlimit::no_core_dumps().map_err(|e| JailError::step("disable core dumps", e))?;
    }
    crate::caps::drop_all().map_err(|e| JailError::step("drop capabilities", e))?;
    let to_gate = close_other_fds(to_gate)?;
    crate::seccomp::install_program(&filters.base)
        .map_err(|e| JailError::step("install the seccomp filter", e))?;
    if let (Some(prog), Some(to)) = (&filters.gate, to_gate) {
        crate::seccomp::install_and_send(prog, to.as_raw_fd(), "the jail", false)
            .map_err(|(step, e)| JailError::step(step, e))?;
    }
    let err = nix::unistd::execve(&path, &argv, &envp).unwrap_err();
    let code = match err {
        nix::errno::Errno::ENOENT => EXIT_NOT_FOUND,
        _ => EXIT_NOT_EXECUTABLE,
    };
    Err(CommandError::Exec(
        code,
        format!("{}: cannot execute: {}", path.to_string_lossy(), err.desc()),
    ))
}

/// A session of its own: with a pty (on descriptor `pty`), the pty becomes the controlling
/// terminal (job control and window-size signals work); without one, the jail has no
/// controlling terminal at all.
fn new_session(pty: Option<RawFd>) -> Result<(), JailError> {
    nix::unistd::setsid().map_err(|e| JailError::step("start a new session", e))?;
    if let Some(fd) = pty {
        // SAFETY: TIOCSCTTY on a stdio descriptor that is the jail's pty, with argument 0.
        if unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) } != 0 {
            return Err(JailError::step(
                "make the pty the controlling terminal",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

fn enter_working_directory(cwd: &Path) -> Result<(), JailError> {
    nix::unistd::chdir(cwd).map_err(|e| JailError::at("enter the working directory", cwd, e))
}

type Argv = (CString, Vec<CString>, Vec<CString>);

/// argv[0] looked up on the jail's PATH (the Plan's), as `env` does: not found is 127.
fn resolve_command(plan: &Plan) -> Result<Argv, CommandError> {
    let Some(first) = plan.command.first() else {
        return Err(JailError::Plan("the plan has no command to run".into()).into());
    };
    let cstr = |s: &[u8]| {
        CString::new(s).map_err(|_| {
            CommandError::Setup(JailError::Plan(format!(
                "a NUL byte in the command or environment: {:?}",
                String::from_utf8_lossy(s)
            )))
        })
    };
    let path = if first.contains('/') {
        PathBuf::from(first)
    } else {
        let search = plan
            .env
            .get("PATH")
            .map(String::as_str)
            .unwrap_or("/usr/bin:/bin");
        let found = search
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(first))
            .find(|p| p.is_file());
        match found {
            Some(p) => p,
            None => {
                return Err(CommandError::Exec(
                    EXIT_NOT_FOUND,
                    format!("{first}: command not found in the jail (PATH={search})"),
                ));
            }
        }
    };
    if !path.exists() {
        return Err(CommandError::Exec(
            EXIT_NOT_FOUND,
            format!("{}: no such file in the jail", path.display()),
        ));
    }
    let argv = plan
        .command
        .iter()
        .map(|a| cstr(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = plan
        .env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((cstr(path.as_os_str().as_bytes())?, argv, envp))
}

fn apply_rlimits(config: &InitConfig) -> Result<(), JailError> {
    crate::rlimit::apply(&config.rlimits)
        .map_err(|e| JailError::step("apply the fallback rlimits", e))?;
    if let Some(soft) = config.nofile_soft {
        crate::rlimit::restore_nofile_soft(soft)
            .map_err(|e| JailError::step("restore the caller's open-file limit", e))?;
    }
    Ok(())
}

/// Close every descriptor above 2 but `keep` (the name gate's socket), which moves to 3
/// (close-on-exec).
pub(crate) fn close_other_fds(keep: Option<OwnedFd>) -> Result<Option<OwnedFd>, JailError> {
    let err = |_| {
        JailError::step(
            "close inherited descriptors",
            std::io::Error::last_os_error(),
        )
    };
    let mut first = 3;
    let kept = match keep {
        Some(fd) => {
            let raw = fd.into_raw_fd();
            // SAFETY: dup3 onto fd 3 (whatever was there is closed, as it would be below).
            if raw != 3 && unsafe { libc::dup3(raw, 3, libc::O_CLOEXEC) } != 3 {
                return Err(err(()));
            }
            first = 4;
            // SAFETY: fd 3 now holds the socket, owned here alone.
            Some(unsafe { OwnedFd::from_raw_fd(3) })
        }
        None => None,
    };
    // SAFETY: close_range closes descriptors of this process only; none above 2 (or 3, the
    // gate's socket) is in use by Rust code past this point.
    if unsafe { libc::close_range(first, libc::c_uint::MAX, 0) } != 0 {
        return Err(err(()));
    }
    Ok(kept)
}

/// Forward `sig` to `pid` (used by corral for the set-up process).
pub(crate) fn forward(pid: Pid, sig: Signal) {
    let _ = kill(pid, sig);
}
