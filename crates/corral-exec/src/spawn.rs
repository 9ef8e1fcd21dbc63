//! Starting a command: the [`Spawner`] seam and the host implementation.
//!
//! The server never starts processes itself: it asks a `Spawner` for a process group running the
//! request's command in its working directory, with pipes for its output. [`HostSpawner`] runs
//! the command directly on the host (the compose container case, `executor.target = "host"`, and
//! tests); a jailed spawner runs it inside a second jail built from `plan.executor.jail` and
//! returns the jail's outermost process as the group leader, so killing the group tears down the
//! whole jail. Whatever the implementation, the contract is the same: the returned `pgid` names a
//! process group that contains every process the command starts (short of one that calls
//! `setsid` itself, which a jail's PID namespace also catches), and killing it ends the command.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncRead;

use crate::confine::WorkDir;

/// What to start.
#[derive(Debug)]
pub struct SpawnSpec<'a> {
    /// Program and arguments (never empty; the program is looked up on PATH if it has no `/`).
    pub argv: &'a [String],
    /// The working directory, already confined to the project root.
    pub workdir: &'a WorkDir,
    /// Variables added to (or overriding) the spawner's base environment.
    pub env: &'a BTreeMap<String, String>,
    /// Give the command a stdin pipe (else /dev/null).
    pub stdin: bool,
    /// Send stdout and stderr to one pipe, so their interleaving is exactly the order the
    /// command wrote them (seed 003's `/execute`, like Go's `CombinedOutput`).
    pub merge_output: bool,
}

/// A started command.
pub struct Spawned {
    pub child: tokio::process::Child,
    /// The process group holding the command: kill it with [`kill_group`].
    pub pgid: i32,
    pub stdin: Option<tokio::process::ChildStdin>,
    /// Standard output (and standard error too when `merge_output`).
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// Standard error, unless merged into `stdout`.
    pub stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
}

/// Why a command could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No such program (exit 127).
    #[error("exec: {program:?}: executable file not found in $PATH")]
    NotFound { program: String },
    /// The program exists but cannot be executed (exit 126).
    #[error("exec: {program:?}: permission denied")]
    NotExecutable { program: String },
    /// Anything else (exit 125).
    #[error("exec: {program:?}: {source}")]
    Other { program: String, source: io::Error },
}

impl SpawnError {
    /// The exit status a client reports for this failure (as `env`, `timeout` and `podman run`
    /// do).
    pub fn exit_code(&self) -> i32 {
        match self {
            SpawnError::NotFound { .. } => 127,
            SpawnError::NotExecutable { .. } => 126,
            SpawnError::Other { .. } => 125,
        }
    }
}

/// Starts commands in their own process group.
pub trait Spawner: Send + Sync + 'static {
    fn spawn(&self, spec: SpawnSpec<'_>) -> Result<Spawned, SpawnError>;
}

/// Runs commands directly on the host, each as the leader of a new process group.
#[derive(Debug, Clone, Default)]
pub struct HostSpawner {
    /// The base environment; `None` inherits the server's own.
    pub base_env: Option<BTreeMap<String, String>>,
    /// Variables removed from the inherited environment (the executor's own token file, ...).
    pub remove_env: Vec<String>,
}

impl Spawner for HostSpawner {
    fn spawn(&self, spec: SpawnSpec<'_>) -> Result<Spawned, SpawnError> {
        let program = spec.argv[0].clone();
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&spec.argv[1..]);
        if let Some(base) = &self.base_env {
            cmd.env_clear();
            cmd.envs(base);
        }
        for name in &self.remove_env {
            cmd.env_remove(name);
        }
        cmd.envs(spec.env);
        cmd.env("PWD", &spec.workdir.path);
        cmd.process_group(0);
        cmd.kill_on_drop(false);
        cmd.stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });

        let other = |source: io::Error| SpawnError::Other {
            program: program.clone(),
            source,
        };
        let mut merged_reader = None;
        if spec.merge_output {
            let (r, w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| other(e.into()))?;
            let w2 = w.try_clone().map_err(other)?;
            cmd.stdout(Stdio::from(w));
            cmd.stderr(Stdio::from(w2));
            merged_reader = Some(r);
        } else {
            cmd.stdout(Stdio::piped());
            cmd.stderr(Stdio::piped());
        }

        // The confined directory by its descriptor, not by its path (which the command's
        // processes could have renamed or replaced with a link meanwhile): the child changes to
        // its `/proc/self/fd/N`, the descriptor it inherited (still open until its exec), which
        // leads to that directory alone, as fchdir would. A directory rather than a closure
        // run before the exec: the standard library then starts the child with posix_spawn
        // (a vfork: the server's page tables are not copied for each command).
        let dir = format!("/proc/self/fd/{}", spec.workdir.fd.as_raw_fd());
        cmd.current_dir(&dir);

        let mut child = cmd.spawn().map_err(|e| match e.kind() {
            // The directory could not be entered (no /proc here): not a missing program.
            io::ErrorKind::NotFound if !std::path::Path::new(&dir).is_dir() => other(e),
            io::ErrorKind::NotFound => SpawnError::NotFound {
                program: program.clone(),
            },
            io::ErrorKind::PermissionDenied => SpawnError::NotExecutable {
                program: program.clone(),
            },
            _ => other(e),
        })?;
        // `cmd` holds the parent's copies of the merged pipe's write ends: drop them now so the
        // reader sees end-of-file when the command's processes exit.
        drop(cmd);
        let pgid = child
            .id()
            .map(|p| p as i32)
            .ok_or_else(|| other(io::Error::other("the child exited before its pid was read")))?;
        let stdin = child.stdin.take();
        let (stdout, stderr): (Box<dyn AsyncRead + Send + Unpin>, _) = match merged_reader {
            Some(r) => (Box::new(pipe_reader(r).map_err(other)?), None),
            None => {
                let out = child.stdout.take().expect("stdout is piped");
                let err = child.stderr.take().expect("stderr is piped");
                (
                    Box::new(out),
                    Some(Box::new(err) as Box<dyn AsyncRead + Send + Unpin>),
                )
            }
        };
        Ok(Spawned {
            child,
            pgid,
            stdin,
            stdout,
            stderr,
        })
    }
}

fn pipe_reader(fd: OwnedFd) -> io::Result<tokio::net::unix::pipe::Receiver> {
    tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
}

/// Send `signal` to every process of group `pgid`. A group that is already gone is not an error.
pub fn kill_group(pgid: i32, signal: Signal) {
    if pgid > 1 {
        let _ = killpg(Pid::from_raw(pgid), signal);
    }
}

/// Whether any process (zombies included) is still in group `pgid`.
pub fn group_alive(pgid: i32) -> bool {
    pgid > 1 && killpg(Pid::from_raw(pgid), None).is_ok()
}

/// End every child of this process, and with them every process it started: each child is
/// sent SIGKILL and reaped, again and again, until none is left. Call it where nothing else of
/// the process waits for children any more (the end of `corral serve`, of `corral run`), with
/// the process a child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant whose parent died is
/// then re-parented here and ended in a later round, so on return nothing this process started,
/// directly or not, is still running. Children are found in `/proc/self/task/*/children`;
/// only a process whose parent is this one is signalled, so a pid reused meanwhile is never
/// hit. Says once on stderr when it has waited ten seconds.
///
/// `spare`: children left alone, neither signalled nor waited for (a jail's set-up process
/// that is exiting by itself once its jail is empty: its `Ending` reaps it).
pub fn end_children(spare: &[u32]) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use std::time::{Duration, Instant};
    let me = std::process::id();
    let started = Instant::now();
    let mut said = false;
    loop {
        let kids: Vec<u32> = children_of_self()
            .into_iter()
            .filter(|pid| !spare.contains(pid) && parent_of(*pid) == Some(me))
            .collect();
        if kids.is_empty() {
            break;
        }
        for pid in &kids {
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        let mut alive = false;
        for pid in &kids {
            let pid = Pid::from_raw(*pid as i32);
            loop {
                match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => alive = true,
                    Err(nix::errno::Errno::EINTR) => continue,
                    // Reaped, or not a child any more.
                    _ => {}
                }
                break;
            }
        }
        if alive {
            if !said && started.elapsed() > Duration::from_secs(10) {
                eprintln!("corral: still waiting for processes of this run to end");
                said = true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // The list has zombies too (a child stays on it until reaped): none is left now.
}

/// This process's children, from every thread's `children` list in /proc.
fn children_of_self() -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

/// The parent pid of `pid` (field 4 of /proc/PID/stat, after the parenthesised name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}
