//! corral's side of a jail: start the set-up process, hand it the Plan, receive the jail's
//! listeners, then relay the terminal and signals until the jail exits.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use corral_policy::plan::{Limits, Plan};
use nix::sys::signal::Signal;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::child::{CTL_FD, FORWARDED, InitConfig, NamespaceConfig};
use crate::error::JailError;
use crate::netns::{self, JailNet};
use crate::placeholder::Placeholder;
use crate::sig::SignalPipe;
use crate::term::{self, PtyEnds, RawMode, Relay};
use crate::termfilter::{Dropped, OutputFilter};
use crate::termstatus::TermStatus;
use crate::{EXIT_SETUP_FAILED, INIT_ARG};

/// How to start a jail, beyond the Plan.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// The corral binary to re-execute as the jail's set-up process (`current_exe()`).
    pub init_exe: PathBuf,
    /// cgroup membership files (`cgroup.procs` / `tasks`) the jail joins before it unshares.
    pub cgroup_procs: Vec<PathBuf>,
    /// Limits to apply as rlimits in the command's process (what no cgroup enforces).
    pub rlimits: Limits,
    /// The soft open-file limit to give the command back (corral raises its own at start; a
    /// program using select() breaks above 1,024).
    pub nofile_soft: Option<u64>,
    /// Hold the command's exec until [`RunningJail::release_exec`]: the namespaces and mounts
    /// are built meanwhile, the command does not run (a change baseline still being taken).
    pub hold_exec: bool,
    /// The run's change record (corral-changes: a directory of the store, on the host): the
    /// jail's PID 1 alone holds it, and its name gate keeps there what each name of the
    /// project was before the jail changed it (removals and mode changes stopped too).
    pub record: Option<std::sync::Arc<OwnedFd>>,
}

impl SpawnOptions {
    /// This binary as the set-up process, no cgroup, no rlimits.
    pub fn new() -> Result<SpawnOptions, JailError> {
        let init_exe = std::env::current_exe()
            .map_err(|e| JailError::at("find corral's own binary", "/proc/self/exe", e))?;
        Ok(SpawnOptions {
            init_exe,
            cgroup_procs: Vec::new(),
            rlimits: Limits {
                memory: None,
                cpus: None,
                pids: None,
                enforce: corral_policy::plan::Enforce::BestEffort,
                built_in: Default::default(),
            },
            nofile_soft: None,
            hold_exec: false,
            record: None,
        })
    }
}

/// How the jail's stdio is wired.
enum Io {
    /// Some of stdin, stdout, stderr are a terminal: they are a pty of the jail's own, relayed
    /// by corral (no jail process holds the user's terminal); the others are corral's own.
    Pty(Relay),
    /// None is a terminal: corral's own descriptors.
    Plain,
}

/// A started jail. Call [`RunningJail::wait`] from the thread that spawned it (the set-up
/// process dies with that thread: PR_SET_PDEATHSIG).
pub struct RunningJail {
    pid: Pid,
    net: Option<JailNet>,
    /// The control socket once the jail runs: sockets made in its network namespace.
    factory: Option<netns::SocketFactory>,
    io: Io,
    signals: Option<SignalPipe>,
    _placeholder: Option<Placeholder>,
    /// Set once `wait` has reaped the set-up process.
    reaped: bool,
    /// The control socket, until the config is sent.
    ctl: Option<std::fs::File>,
    /// The write end of the exec gate ([`SpawnOptions::hold_exec`]) until released.
    gate: Option<OwnedFd>,
    /// The read end of the exit pipe: the set-up process writes the command's exit code there
    /// once it has reaped the jail's PID 1 (the jail is empty), then exits.
    exit_pipe: Option<OwnedFd>,
}

/// The set-up process of a jail that has ended, still exiting (the kernel takes down the
/// jail's namespaces meanwhile): [`RunningJail::wait_ending`] returned before it was reaped.
/// Dropping this reaps it, waiting if need be; its pid must be spared by anything that ends
/// or reaps corral's other children meanwhile.
pub struct Ending {
    pid: Option<Pid>,
}

impl Ending {
    /// The set-up process's pid, `None` when it was already reaped.
    pub fn pid(&self) -> Option<u32> {
        self.pid.map(|p| p.as_raw() as u32)
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            while let Err(nix::errno::Errno::EINTR) = waitpid(pid, None) {}
        }
    }
}

/// A set-up process started ahead of its Plan (see [`prepare`]): it waits for the config.
/// Dropping it kills it.
pub struct PreparedJail {
    jail: RunningJail,
    /// What [`PreparedJail::enter_namespaces`] sent, if it was called.
    namespaces: Option<SentNamespaceConfig>,
}

/// The namespace config sent ahead of the Plan, and whether it got through.
struct SentNamespaceConfig {
    cgroup_procs: Vec<PathBuf>,
    ok: bool,
}

/// The placeholders of a run's absent protected paths (the project's `corral.toml`, a
/// `.git/hooks`), taken out of a [`RunningJail`] with [`RunningJail::keep_placeholders`] so they
/// outlive its `wait`: other jails of the run (the executor's) bind them too, and a placeholder
/// is removed only by the run that made it, only when no jail holds it. Dropping this removes
/// those this run made.
pub struct PlaceholderHold {
    _held: Option<Placeholder>,
}

/// How a jail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JailExit {
    /// The command's exit code; 128+N when it died of signal N; 125 when the set-up failed.
    pub code: i32,
    /// What the output filter kept from the user's terminal (`termfilter.rs`).
    pub terminal: Dropped,
}

/// Start a jail running `plan.command`. Returns once the jail's namespaces exist and its
/// listeners (network mode `proxy`, `host_ports`) are in hand; the mounts and the command's
/// exec proceed meanwhile.
pub fn spawn(plan: &Plan, opts: &SpawnOptions) -> Result<RunningJail, JailError> {
    prepare(&opts.init_exe)?.start(plan, opts)
}

/// Start the jail's set-up process before the Plan is final, so that loading it overlaps
/// corral's own preparations (secrets, executor, limits); [`PreparedJail::start`] hands it the
/// Plan and its stdio. This re-executes `init_exe` (corral) as a fresh process; `corral run`
/// uses the one [`prepare_early`] forked instead when there is one. Call from
/// the thread that will `wait`.
pub fn prepare(init_exe: &std::path::Path) -> Result<PreparedJail, JailError> {
    let (ctl, ctl_child) = control_socket()?;
    let mut cmd = Command::new(init_exe);
    // Until its config arrives the set-up process holds the caller's stderr only (for its own
    // errors); the jail's stdio comes with the config.
    cmd.arg(INIT_ARG)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let parent = nix::unistd::getpid().as_raw();
    let child_fd = ctl_child.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (dup2, prctl, getppid, setsid) with no allocation.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(child_fd, CTL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if !detach_from(parent) {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| JailError::at("start the jail's set-up process", init_exe, e))?;
    drop(cmd);
    drop(ctl_child);
    Ok(PreparedJail::new(
        Pid::from_raw(child.id() as i32),
        ctl.into(),
    ))
}

/// Fork the jail's set-up process now, first thing in `main` and before any thread exists, for
/// a command that is about to run a jail: it is ready (no second exec of corral, no waiting for
/// one) by the time the Plan is. The caller hands it to the run that starts the jail, from
/// the thread that called this (the one that will `wait`); dropped unused, it is killed, and it
/// ends with this process anyway (EOF on its control socket, and PR_SET_PDEATHSIG).
///
/// Forked this early, the child holds nothing corral has read yet: no policy, no secret, no
/// gateway value, only what the kernel put on the initial stack. Of that it overwrites, before
/// anything else, the environment strings (the caller's variables, API keys included) and the
/// arguments after the program's name (its command line then reads `corral
/// __corral-jail-init`, as a re-executed one does: the jail can read PID 1's command line), and
/// empties `environ`. What it shares with corral that a fresh exec would not is the address
/// layout and the stack canary; those stay out of the jail's reach because PID 1 is
/// non-dumpable with no capabilities, and the jail's seccomp filter denies ptrace and
/// process_vm_readv.
///
/// `None` when that cannot be done (no /proc, no socket, no fork): the run then uses
/// [`prepare`].
pub fn prepare_early() -> Option<PreparedJail> {
    let initial = InitialStack::of_self()?;
    let (ctl, ctl_child) = control_socket().ok()?;
    let parent = nix::unistd::getpid().as_raw();
    // SAFETY: called first thing in `main`, before any thread exists, so the child is a
    // complete copy of a single-threaded process and may allocate.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(ctl);
            initial.forget();
            crate::child::init_forked(ctl_child, detach_from(parent))
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(ctl_child);
            Some(PreparedJail::new(child, ctl.into()))
        }
        Err(_) => None,
    }
}

/// corral's end and the set-up process's end of a new control socket (both close-on-exec).
fn control_socket() -> Result<(OwnedFd, OwnedFd), JailError> {
    socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| JailError::step("create the jail's control socket", e))
}

/// In a new set-up process: die with `parent` (the thread that started it), and leave its
/// session and process group so the terminal's signals reach corral alone (corral forwards
/// them). False when `parent` is already gone or a call failed (errno says why).
/// Async-signal-safe: runs between fork and exec.
fn detach_from(parent: libc::pid_t) -> bool {
    // SAFETY: plain syscalls on this process, no memory is touched.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) == 0
            && libc::getppid() == parent
            && libc::setsid() >= 0
    }
}

/// Where the kernel put this process's arguments and environment strings (`/proc/self/stat`
/// fields 48-51).
struct InitialStack {
    args: (usize, usize),
    env: (usize, usize),
}

impl InitialStack {
    fn of_self() -> Option<InitialStack> {
        let stat = crate::mountinfo::read_proc("/proc/self/stat").ok()?;
        let stat = std::str::from_utf8(&stat).ok()?;
        // Fields after the command name's closing parenthesis start at field 3.
        let fields: Vec<usize> = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .skip(45)
            .take(4)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        match fields[..] {
            [a, b, c, d] if a < b && c <= d => Some(InitialStack {
                args: (a, b),
                env: (c, d),
            }),
            _ => None,
        }
    }

    /// In the just-forked set-up process: zero the environment strings and every argument
    /// after the program's name, write [`INIT_ARG`] as the first argument when it fits, and
    /// empty `environ`.
    fn forget(&self) {
        let zero = |from: usize, to: usize| {
            for addr in from..to {
                // SAFETY: [arg_start, arg_end) and [env_start, env_end) are this process's own
                // initial stack, mapped and writable; single-threaded.
                unsafe { std::ptr::write_volatile(addr as *mut u8, 0) };
            }
        };
        zero(self.env.0, self.env.1);
        let (start, end) = self.args;
        // SAFETY: argv[0] is a NUL-terminated string at arg_start, inside [start, end).
        let name = unsafe { libc::strnlen(start as *const libc::c_char, end - start) };
        let rest = start + name + 1;
        zero(rest.min(end), end);
        if rest + INIT_ARG.len() < end {
            for (i, b) in INIT_ARG.bytes().enumerate() {
                // SAFETY: inside the argument area, as above.
                unsafe { std::ptr::write_volatile((rest + i) as *mut u8, b) };
            }
        }
        // SAFETY: single-threaded; nothing holds a reference into the environment.
        unsafe { libc::clearenv() };
    }
}

impl PreparedJail {
    fn new(pid: Pid, ctl: std::fs::File) -> PreparedJail {
        PreparedJail {
            namespaces: None,
            jail: RunningJail {
                pid,
                net: None,
                factory: None,
                io: Io::Plain,
                signals: None,
                _placeholder: None,
                reaped: false,
                ctl: Some(ctl),
                gate: None,
                exit_pipe: None,
            },
        }
    }

    /// Let the set-up process build the jail's namespaces now (join `cgroup_procs`, unshare,
    /// id maps, loopback, the network listeners), from the part of `plan` that is final once
    /// it is resolved (the caller's ids and the network rules), while corral finishes the rest;
    /// [`PreparedJail::start`] must then get a Plan with the same ids and network rules, and
    /// `SpawnOptions::cgroup_procs` equal to `cgroup_procs`. Optional: `start` sends it itself
    /// otherwise. A set-up process that is already gone shows at `start`.
    pub fn enter_namespaces(
        &mut self,
        plan: &Plan,
        cgroup_procs: &[PathBuf],
    ) -> Result<(), JailError> {
        if self.namespaces.is_some() {
            return Err(JailError::Plan(
                "the jail's namespaces were already requested".into(),
            ));
        }
        let config = NamespaceConfig {
            uid: plan.uid,
            gid: plan.gid,
            network: plan.network.clone(),
            cgroup_procs: cgroup_procs.to_vec(),
        };
        let body = serde_json::to_vec(&config)
            .map_err(|e| JailError::step("encode the jail's namespace config", e))?;
        let ctl = self
            .jail
            .ctl
            .as_ref()
            .ok_or_else(|| JailError::Plan("this jail was already started".into()))?;
        let ok = netns::send_frame(ctl.as_raw_fd(), &body, &[]).is_ok();
        self.namespaces = Some(SentNamespaceConfig {
            cgroup_procs: config.cgroup_procs,
            ok,
        });
        Ok(())
    }

    /// Hand the set-up process `plan` and its stdio (and first the namespace config, unless
    /// [`PreparedJail::enter_namespaces`] sent it), and wait until the jail's namespaces exist
    /// and its listeners (network mode `proxy`, `host_ports`) are in hand; the mounts and the
    /// command's exec proceed meanwhile.
    pub fn start(mut self, plan: &Plan, opts: &SpawnOptions) -> Result<RunningJail, JailError> {
        match &self.namespaces {
            None => self.enter_namespaces(plan, &opts.cgroup_procs)?,
            Some(sent) if sent.cgroup_procs != opts.cgroup_procs => {
                return Err(JailError::Plan(
                    "the jail's cgroup differs from the one its namespaces were built for".into(),
                ));
            }
            Some(_) => {}
        }
        let namespaces_ok = self.namespaces.as_ref().is_some_and(|s| s.ok);
        let mut jail = self.jail;
        if plan.command.is_empty() {
            return Err(JailError::Plan("the plan has no command to run".into()));
        }
        // Absent protected paths get placeholders, which the plan sent to the jail protects.
        let (held, plan) = Placeholder::ensure(plan)?;
        jail._placeholder = held;
        let plan = &plan;
        let mut watched = FORWARDED.to_vec();
        watched.push(Signal::SIGCHLD);
        jail.signals = Some(
            SignalPipe::install(&watched)
                .map_err(|e| JailError::step("install corral's signal handlers", e))?,
        );
        let stdio = wire_stdio()?;
        let config = InitConfig {
            plan: plan.clone(),
            pty: stdio.pty,
            rlimits: opts.rlimits.clone(),
            nofile_soft: opts.nofile_soft,
            exec_gate: opts.hold_exec,
            exit_pipe: true,
            record: opts.record.is_some(),
        };
        let body = serde_json::to_vec(&config)
            .map_err(|e| JailError::step("encode the jail config", e))?;
        let stream = jail
            .ctl
            .take()
            .ok_or_else(|| JailError::Plan("this jail was already started".into()))?;
        let mut fds: Vec<RawFd> = stdio.fds.iter().map(|fd| fd.as_raw_fd()).collect();
        // The change record's directory before the exec gate (`InitConfig::record`).
        if let Some(record) = &opts.record {
            fds.push(record.as_raw_fd());
        }
        // The exec gate's read end goes last; corral keeps the write end (`release_exec`).
        let gate_read = match opts.hold_exec {
            true => {
                let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                    .map_err(|e| JailError::step("create the exec gate pipe", e))?;
                jail.gate = Some(w);
                fds.push(r.as_raw_fd());
                Some(r)
            }
            false => None,
        };
        // The exit pipe's write end after it: the set-up process's alone.
        let (exit_read, exit_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| JailError::step("create the exit pipe", e))?;
        fds.push(exit_write.as_raw_fd());
        jail.exit_pipe = Some(exit_read);
        let sent = match namespaces_ok {
            true => {
                netns::send_frame(stream.as_raw_fd(), &body, &fds).map_err(std::io::Error::from)
            }
            false => Err(std::io::ErrorKind::BrokenPipe.into()),
        };
        // The jail's copies are in flight or refused: corral's go now (a pipe's writer must be
        // the jail alone, for the copying thread to see its end).
        drop(stdio.fds);
        drop(gate_read);
        drop(exit_write);
        let net = match sent {
            Ok(()) => netns::recv_listeners(stream.as_raw_fd())?,
            Err(_) => None,
        };
        // At a terminal, the jail's pty comes from its own devpts (child.rs `jail_pty`): its
        // master arrives now, gets the user's terminal settings, and the jail goes on.
        let net = match (net, stdio.pty.any()) {
            (Some(net), true) => {
                match receive_pty(stream.as_raw_fd(), plan.terminal.clipboard, stdio.pty)? {
                    Some(relay) => {
                        jail.io = Io::Pty(relay);
                        Some(net)
                    }
                    None => None,
                }
            }
            (net, _) => net,
        };
        match net {
            Some(net) => {
                // The control socket stays open as the jail's socket factory.
                jail.factory = Some(netns::SocketFactory::new(OwnedFd::from(stream)));
                jail.net = Some(net);
                Ok(jail)
            }
            None => {
                let exit = jail.wait();
                Err(JailError::SetupFailed(exit.code))
            }
        }
    }
}

/// The jail's stdio: which ends are its own pty, and corral's descriptors for the others.
struct JailStdio {
    pty: PtyEnds,
    /// The ends that are not the pty, in order, for the set-up process to install.
    fds: Vec<OwnedFd>,
}

/// The pty master the set-up process sends (child.rs `jail_pty`): the user's terminal settings
/// and window size are copied onto it (termios requests on a master act on its slave), then
/// the set-up process is told to go on. `None`: the set-up process ended first. What the jail
/// writes there reaches the user through the output filter (`clipboard`: `terminal.clipboard`).
fn receive_pty(ctl: RawFd, clipboard: bool, ends: PtyEnds) -> Result<Option<Relay>, JailError> {
    let Some((_, mut fds)) = netns::recv_frame(ctl)? else {
        return Ok(None);
    };
    let master = match (fds.pop(), fds.is_empty()) {
        (Some(m), true) => m,
        _ => {
            return Err(JailError::Plan(
                "the jail sent no pty, or more than one descriptor".into(),
            ));
        }
    };
    let relay = Relay::new(master, OutputFilter::new(clipboard), ends).ok_or_else(|| {
        JailError::Plan("the jail has a pty but no end of corral's is a terminal".into())
    })?;
    term::copy_terminal(relay.user_terminal(), relay.master());
    netns::send_frame(ctl, b"{}", &[])
        .map_err(|e| JailError::step("tell the jail its terminal is ready", e))?;
    Ok(Some(relay))
}

/// Wire the jail's stdio: each of corral's stdin, stdout and stderr that is a terminal is a pty
/// of the jail's own inside (opened by the jail in its own devpts so its name resolves inside),
/// the others are handed over as they are. So a terminal outside is a terminal inside, and a
/// file or pipe stays one: `corral run -- make > log` from a terminal writes the log with no
/// CR/LF rewriting, and reads a terminal. No jail process holds the user's terminal; what the
/// pty shows reaches it through the output filter (`termfilter.rs`).
fn wire_stdio() -> Result<JailStdio, JailError> {
    let pty = PtyEnds::of_corral();
    let fds = pty
        .by_fd()
        .into_iter()
        .zip(0..3)
        .filter(|(is_pty, _)| !is_pty)
        .map(|(_, fd)| own_or_null(term::stdio(fd)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(JailStdio { pty, fds })
}

/// A copy of one of corral's stdio descriptors for the jail; /dev/null when corral has none
/// open there.
fn own_or_null(fd: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd, JailError> {
    match fd.try_clone_to_owned() {
        Ok(owned) => Ok(owned),
        Err(_) => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|e| JailError::at("open", "/dev/null", e)),
    }
}

impl RunningJail {
    /// The set-up process's pid (the jail's outermost process, in corral's namespaces).
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// The listeners created in the jail's network namespace (once; later calls get empty).
    pub fn take_net(&mut self) -> JailNet {
        self.net.take().unwrap_or_default()
    }

    /// The jail's socket factory (once): fresh sockets in the jail's network namespace, made by
    /// its set-up process, for as long as the jail runs. `None` before `start` or when taken.
    pub fn take_socket_factory(&mut self) -> Option<netns::SocketFactory> {
        self.factory.take()
    }

    /// What corral says in the title of the user's terminal while the jail runs; `None` when
    /// the jail has no pty (no end of corral's is a terminal).
    pub fn terminal_status(&self) -> Option<TermStatus> {
        match &self.io {
            Io::Pty(relay) => relay.status(),
            Io::Plain => None,
        }
    }

    /// The placeholders this jail's start made (once), so the caller decides when they go:
    /// after every other process of the run that binds them has ended. Without this they go
    /// when `wait` returns.
    pub fn keep_placeholders(&mut self) -> PlaceholderHold {
        PlaceholderHold {
            _held: self._placeholder.take(),
        }
    }

    /// The placeholders this jail's start created for absent protected paths (empty files and
    /// directories corral removes after the run): not the run's changes.
    pub fn placeholders_made(&self) -> Vec<PathBuf> {
        self._placeholder
            .as_ref()
            .map(|p| p.made().to_vec())
            .unwrap_or_default()
    }

    /// Let the command exec ([`SpawnOptions::hold_exec`]): one byte through the gate, then its
    /// write end closed. Nothing when the jail was started without the gate, or already released.
    pub fn release_exec(&mut self) -> Result<(), JailError> {
        let Some(gate) = self.gate.take() else {
            return Ok(());
        };
        match nix::unistd::write(&gate, b"g") {
            Ok(1) => Ok(()),
            // The jail's PID 1 is gone (its set-up failed): `wait` reports that.
            Err(nix::errno::Errno::EPIPE) => Ok(()),
            Ok(_) => Err(JailError::Plan("the exec gate took no byte".into())),
            Err(e) => Err(JailError::step("open the exec gate", e)),
        }
    }

    /// Relay terminal and signals until the jail exits; restores the terminal on every path.
    /// A gate still held is closed unopened first: the jail's PID 1 then ends without running
    /// the command (exit 125) rather than waiting for ever. The set-up process is reaped.
    pub fn wait(self) -> JailExit {
        let (exit, ending) = self.wait_ending();
        drop(ending);
        exit
    }

    /// [`RunningJail::wait`], returning once the jail is empty: when its set-up process has
    /// reaped PID 1 (every process of the jail's PID namespace is gone then) and said the
    /// code, not once the set-up process itself is gone too. The kernel takes down the
    /// namespaces (mounts, network) as it exits, meanwhile; [`Ending`] reaps it.
    pub fn wait_ending(mut self) -> (JailExit, Ending) {
        drop(self.gate.take());
        let signals = match self.signals.take() {
            Some(s) => s,
            None => {
                let mut watched = FORWARDED.to_vec();
                watched.push(Signal::SIGCHLD);
                match SignalPipe::install(&watched) {
                    Ok(s) => s,
                    Err(_) => {
                        // Without handlers nothing is forwarded; still wait for the jail.
                        let code = loop {
                            if let Some(code) = reap(self.pid) {
                                break code;
                            }
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        };
                        self.reaped = true;
                        let exit = JailExit {
                            code,
                            terminal: Dropped::default(),
                        };
                        return (exit, Ending { pid: None });
                    }
                }
            }
        };
        let mut terminal = Dropped::default();
        let mut ending = None;
        let code = match &mut self.io {
            Io::Pty(relay) => {
                // The user types into the jail's pty only when stdin is one of its ends.
                let _raw = match relay.takes_stdin() {
                    true => RawMode::enter(term::stdio(0)),
                    false => None,
                };
                let user = relay.user_terminal();
                let code = loop {
                    if let Some(code) = reap(self.pid) {
                        break code;
                    }
                    relay.step(signals.fd().as_fd(), 1000);
                    for sig in signals.drain() {
                        match sig {
                            Signal::SIGWINCH => {
                                if let Some(ws) = term::window_size(user) {
                                    term::set_window_size(relay.master(), &ws);
                                }
                            }
                            Signal::SIGCHLD => {}
                            other => crate::child::forward(self.pid, other),
                        }
                    }
                };
                relay.pump_output();
                relay.finish();
                terminal = relay.dropped();
                code
            }
            Io::Plain => loop {
                if let Some(code) = reap(self.pid) {
                    break code;
                }
                if let Some(code) = said_exit(&mut self.exit_pipe, &signals) {
                    ending = Some(self.pid);
                    break code;
                }
                for sig in signals.drain() {
                    if sig != Signal::SIGCHLD {
                        crate::child::forward(self.pid, sig);
                    }
                }
            },
        };
        drop(signals);
        // Reaped, or handed to the `Ending`.
        self.reaped = true;
        (JailExit { code, terminal }, Ending { pid: ending })
    }
}

/// Wait up to a second for the exit pipe or a signal; the exit code when the set-up process
/// said it. The pipe is dropped when it ends without one (the set-up process failed or was
/// killed: reaping it tells then).
fn said_exit(pipe: &mut Option<OwnedFd>, signals: &SignalPipe) -> Option<i32> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = vec![PollFd::new(signals.fd().as_fd(), PollFlags::POLLIN)];
    if let Some(fd) = pipe.as_ref() {
        fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
    }
    let _ = poll(&mut fds, PollTimeout::from(1000u16));
    let ready = fds
        .get(1)
        .and_then(|f| f.revents())
        .is_some_and(|r| !r.is_empty());
    let fd = pipe.as_ref().filter(|_| ready)?;
    let mut buf = [0u8; 4];
    // Four bytes written at once into an empty pipe arrive at once.
    match nix::unistd::read(fd, &mut buf) {
        Ok(4) => Some(i32::from_le_bytes(buf)),
        Err(nix::errno::Errno::EINTR) => None,
        _ => {
            *pipe = None;
            None
        }
    }
}

impl Drop for RunningJail {
    /// A jail that is dropped without `wait` (an error between spawn and wait) is killed and
    /// reaped, never left running.
    fn drop(&mut self) {
        if !self.reaped {
            let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

/// The set-up process's status if it has ended.
fn reap(pid: Pid) -> Option<i32> {
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return Some(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Some(128 + sig as i32),
            Ok(WaitStatus::StillAlive) => return None,
            Ok(_) => return None,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return Some(EXIT_SETUP_FAILED),
        }
    }
}
