//! corral's side of a jail: start the set-up process, hand it the Plan, receive the jail's
//! listeners, then relay the terminal and signals until the jail exits.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use corral_policy::plan::{Limits, Plan};
use nix::sys::signal::Signal;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::child::{CTL_FD, FORWARDED, InitConfig};
use crate::error::JailError;
use crate::netns::{self, JailNet};
use crate::placeholder::Placeholder;
use crate::sig::SignalPipe;
use crate::term::{self, RawMode, Relay};
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
            },
        })
    }
}

/// How the jail's stdio is wired.
enum Io {
    /// stdin and stdout are a terminal: the jail has a pty of its own, relayed by corral.
    Pty(Relay),
    /// Inherited descriptors; those of ours that are terminals replaced by pipes that corral
    /// copies (so no jail process holds the user's terminal).
    Plain(Vec<std::thread::JoinHandle<()>>),
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
    tty: bool,
}

/// A set-up process started ahead of its Plan (see [`prepare`]): it waits for the config.
/// Dropping it kills it.
pub struct PreparedJail {
    jail: RunningJail,
}

/// How a jail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JailExit {
    /// The command's exit code; 128+N when it died of signal N; 125 when the set-up failed.
    pub code: i32,
}

/// Start a jail running `plan.command`. Returns once the jail's namespaces exist and its
/// listeners (network mode `proxy`, `host_ports`) are in hand; the mounts and the command's
/// exec proceed meanwhile.
pub fn spawn(plan: &Plan, opts: &SpawnOptions) -> Result<RunningJail, JailError> {
    prepare(&opts.init_exe)?.start(plan, opts)
}

/// Start the jail's set-up process before the Plan is final, so that loading it overlaps
/// corral's own preparations (secrets, executor, limits); [`PreparedJail::start`] hands it the
/// Plan. The terminal wiring is decided here. Call from the thread that will `wait`.
pub fn prepare(init_exe: &std::path::Path) -> Result<PreparedJail, JailError> {
    let (ctl, ctl_child) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| JailError::step("create the jail's control socket", e))?;

    let stdin = std::io::stdin();
    // A pty when the user is at a terminal on both ends; `corral run -- make > log` from a
    // terminal gets plain pipes (no CR/LF rewriting of the output).
    let tty = term::is_tty(stdin.as_fd()) && term::is_tty(std::io::stdout().as_fd());
    let mut cmd = Command::new(init_exe);
    cmd.arg(INIT_ARG).env_clear();
    let mut master = None;
    let mut pipes = Vec::new();
    if tty {
        let pty = term::open_pty(stdin.as_fd())?;
        let slave = pty.slave;
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| JailError::step("duplicate the pty", e))
        };
        cmd.stdin(Stdio::from(dup(&slave)?))
            .stdout(Stdio::from(dup(&slave)?))
            .stderr(Stdio::from(slave));
        master = Some(pty.master);
    } else {
        if term::is_tty(stdin.as_fd()) {
            // The user's terminal as stdin, without a pty: the jail reads a pipe that corral
            // fills, never the terminal itself. The copying thread is not joined: it ends at
            // the terminal's EOF or the first write after the jail is gone.
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| JailError::step("create an input pipe", e))?;
            cmd.stdin(Stdio::from(r));
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::fs::File::from(w));
            });
        }
        for (i, out) in [(1, true), (2, false)] {
            let is_tty = if out {
                term::is_tty(std::io::stdout().as_fd())
            } else {
                term::is_tty(std::io::stderr().as_fd())
            };
            if !is_tty {
                continue;
            }
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| JailError::step("create an output pipe", e))?;
            if i == 1 {
                cmd.stdout(Stdio::from(w));
            } else {
                cmd.stderr(Stdio::from(w));
            }
            pipes.push((i, r));
        }
    }

    let parent = nix::unistd::getpid().as_raw();
    let child_fd = ctl_child.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (dup2, prctl, getppid, setsid) with no allocation.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(child_fd, CTL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            if libc::setsid() < 0 {
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
    let pid = Pid::from_raw(child.id() as i32);

    let io = match master {
        Some(m) => Io::Pty(Relay::new(m)),
        None => Io::Plain(
            pipes
                .into_iter()
                .map(|(i, r)| std::thread::spawn(move || copy_out(r, i)))
                .collect(),
        ),
    };
    Ok(PreparedJail {
        jail: RunningJail {
            pid,
            net: None,
            factory: None,
            io,
            signals: None,
            _placeholder: None,
            reaped: false,
            ctl: Some(std::fs::File::from(ctl)),
            tty,
        },
    })
}

impl PreparedJail {
    /// Hand the set-up process `plan` and wait until the jail's namespaces exist and its
    /// listeners (network mode `proxy`, `host_ports`) are in hand; the mounts and the
    /// command's exec proceed meanwhile.
    pub fn start(self, plan: &Plan, opts: &SpawnOptions) -> Result<RunningJail, JailError> {
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
        let config = InitConfig {
            plan: plan.clone(),
            tty: jail.tty,
            cgroup_procs: opts.cgroup_procs.clone(),
            rlimits: opts.rlimits.clone(),
        };
        let body = serde_json::to_vec(&config)
            .map_err(|e| JailError::step("encode the jail config", e))?;
        let mut stream = jail
            .ctl
            .take()
            .ok_or_else(|| JailError::Plan("this jail was already started".into()))?;
        let sent = stream
            .write_all(&(body.len() as u64).to_le_bytes())
            .and_then(|()| stream.write_all(&body));
        let net = match sent {
            Ok(()) => netns::recv_listeners(stream.as_raw_fd())?,
            Err(_) => None,
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

fn copy_out(from: OwnedFd, to: i32) {
    let mut file = std::fs::File::from(from);
    let _ = if to == 1 {
        std::io::copy(&mut file, &mut std::io::stdout())
    } else {
        std::io::copy(&mut file, &mut std::io::stderr())
    };
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

    /// Relay terminal and signals until the jail exits; restores the terminal on every path.
    pub fn wait(mut self) -> JailExit {
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
                        return JailExit { code };
                    }
                }
            }
        };
        let code = match &mut self.io {
            Io::Pty(relay) => {
                let stdin = std::io::stdin();
                let _raw = RawMode::enter(stdin.as_fd());
                let code = loop {
                    if let Some(code) = reap(self.pid) {
                        break code;
                    }
                    relay.step(signals.fd().as_fd(), 1000);
                    for sig in signals.drain() {
                        match sig {
                            Signal::SIGWINCH => {
                                if let Some(ws) = term::window_size(stdin.as_fd()) {
                                    term::set_window_size(relay.master(), &ws);
                                }
                            }
                            Signal::SIGCHLD => {}
                            other => crate::child::forward(self.pid, other),
                        }
                    }
                };
                relay.pump_output();
                code
            }
            Io::Plain(threads) => {
                let code = loop {
                    if let Some(code) = reap(self.pid) {
                        break code;
                    }
                    for sig in signals.wait(1000) {
                        if sig != Signal::SIGCHLD {
                            crate::child::forward(self.pid, sig);
                        }
                    }
                };
                for t in threads.drain(..) {
                    let _ = t.join();
                }
                code
            }
        };
        drop(signals);
        self.reaped = true;
        JailExit { code }
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
