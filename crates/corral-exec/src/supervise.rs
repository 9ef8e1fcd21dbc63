//! Watching one running command until its process group is gone.
//!
//! One loop per command reads its output, waits for it, and ends it: on timeout, when the client
//! goes away, and on server shutdown it sends SIGTERM to the whole group, then SIGKILL after a
//! grace period; when the group leader exits on its own, whatever it left behind in its group
//! is killed at once. The command never outlives its request.

use std::process::ExitStatus;
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::Signal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until};

use crate::proto::{Event, Exit, Stream, Utf8Chunker};
use crate::spawn::{Spawned, kill_group};

/// How long output is still read after the group leader exited and its group was killed (a
/// process that escaped the group with `setsid` could otherwise hold the pipe open forever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);
const READ_BUF: usize = 64 * 1024;

/// Per-command bounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub max_output: u64,
}

/// Why a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndCause {
    Exited,
    TimedOut,
    Disconnected,
    Shutdown,
}

#[derive(Debug)]
pub(crate) struct Outcome {
    pub exit: Exit,
    pub ended: EndCause,
    /// Everything the command wrote, kept or not.
    pub bytes_out: u64,
}

/// Where output goes.
pub(crate) enum Sink {
    /// Seed 003's `/execute`: collected whole. `cancel` fires when the request is dropped.
    Buffer {
        buf: Vec<u8>,
        cancel: oneshot::Receiver<()>,
    },
    /// `/v1/exec`: one NDJSON line per chunk, sent as it is read.
    Channel {
        tx: mpsc::Sender<Bytes>,
        stdout: Utf8Chunker,
        stderr: Utf8Chunker,
    },
}

impl Sink {
    pub fn channel(tx: mpsc::Sender<Bytes>) -> Self {
        Sink::Channel {
            tx,
            stdout: Utf8Chunker::default(),
            stderr: Utf8Chunker::default(),
        }
    }

    /// Resolves when nobody is listening any more.
    async fn gone(&mut self) {
        match self {
            Sink::Buffer { cancel, .. } => {
                let _ = cancel.await;
            }
            Sink::Channel { tx, .. } => tx.closed().await,
        }
    }

    /// Deliver output; false when the client is gone.
    async fn emit(&mut self, stream: Stream, data: &[u8], flush: bool) -> bool {
        match self {
            Sink::Buffer { buf, .. } => {
                buf.extend_from_slice(data);
                true
            }
            Sink::Channel {
                tx, stdout, stderr, ..
            } => {
                let chunker = match stream {
                    Stream::Stdout => stdout,
                    Stream::Stderr => stderr,
                };
                let mut text = chunker.push(data);
                if flush {
                    text.push_str(&chunker.finish());
                }
                if text.is_empty() {
                    return !tx.is_closed();
                }
                let line = Event::Output { stream, data: text }.to_line();
                tx.send(Bytes::from(line)).await.is_ok()
            }
        }
    }

    /// Send a final event (channel only).
    pub async fn event(&mut self, ev: Event) {
        if let Sink::Channel { tx, .. } = self {
            let _ = tx.send(Bytes::from(ev.to_line())).await;
        }
    }
}

async fn read_opt(
    r: &mut Option<Box<dyn AsyncRead + Send + Unpin>>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Run `sp` to the end. Output beyond `bounds.max_output` is dropped after a marker.
pub(crate) async fn supervise(
    mut sp: Spawned,
    stdin: Option<String>,
    sink: &mut Sink,
    bounds: Bounds,
    mut shutdown: watch::Receiver<bool>,
) -> Outcome {
    let pgid = sp.pgid;
    // Last resort: if this future is dropped mid-way (runtime shutdown), the group still dies.
    let guard = GroupGuard(pgid);

    if let Some(mut w) = sp.stdin.take() {
        let data = stdin.unwrap_or_default();
        tokio::spawn(async move {
            let _ = w.write_all(data.as_bytes()).await;
            let _ = w.shutdown().await;
        });
    }

    let mut out = Some(sp.stdout);
    let mut err = sp.stderr.take();
    let mut buf_out = vec![0u8; READ_BUF];
    let mut buf_err = vec![0u8; READ_BUF];
    let mut status: Option<ExitStatus> = None;
    let deadline = Instant::now() + bounds.timeout;
    let mut ended: Option<EndCause> = None;
    let mut kill_at: Option<Instant> = None;
    let mut drain_until: Option<Instant> = None;
    let mut bytes_out: u64 = 0;
    let mut kept: u64 = 0;
    let mut truncated = false;
    let mut client_gone = false;

    // Start ending the command: SIGTERM to the group now, SIGKILL after the grace period.
    let begin_end = |why: EndCause, ended: &mut Option<EndCause>, kill_at: &mut Option<Instant>| {
        if ended.is_none() {
            *ended = Some(why);
            kill_group(pgid, Signal::SIGTERM);
            *kill_at = Some(Instant::now() + bounds.kill_grace);
        }
    };

    loop {
        if status.is_some() && out.is_none() && err.is_none() {
            break;
        }
        let running = status.is_none();
        let chunk: Option<(Stream, usize)> = tokio::select! {
            r = read_opt(&mut out, &mut buf_out) => match r {
                Ok(n) if n > 0 => Some((Stream::Stdout, n)),
                _ => { out = None; None }
            },
            r = read_opt(&mut err, &mut buf_err) => match r {
                Ok(n) if n > 0 => Some((Stream::Stderr, n)),
                _ => { err = None; None }
            },
            s = sp.child.wait(), if running => {
                // A wait error means the child is already reaped; report it as killed.
                status = Some(s.unwrap_or_else(|_| std::os::unix::process::ExitStatusExt::from_raw(9)));
                // Whatever the leader left behind in its group dies with the request.
                kill_group(pgid, Signal::SIGKILL);
                kill_at = None;
                drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                None
            },
            _ = sleep_until(deadline), if running && ended.is_none() => {
                begin_end(EndCause::TimedOut, &mut ended, &mut kill_at);
                None
            },
            _ = sink.gone(), if running && ended.is_none() && !client_gone => {
                client_gone = true;
                begin_end(EndCause::Disconnected, &mut ended, &mut kill_at);
                None
            },
            _ = shutdown.wait_for(|v| *v), if running && ended.is_none() => {
                begin_end(EndCause::Shutdown, &mut ended, &mut kill_at);
                None
            },
            _ = sleep_opt(kill_at), if kill_at.is_some() => {
                kill_group(pgid, Signal::SIGKILL);
                kill_at = None;
                None
            },
            _ = sleep_opt(drain_until), if drain_until.is_some() => break,
        };
        let Some((stream, n)) = chunk else { continue };
        bytes_out += n as u64;
        if truncated || client_gone {
            continue;
        }
        let buf = match stream {
            Stream::Stdout => &buf_out[..n],
            Stream::Stderr => &buf_err[..n],
        };
        let room = bounds.max_output.saturating_sub(kept);
        let take = (n as u64).min(room) as usize;
        kept += take as u64;
        let cut = take < n;
        let mut delivered = tokio::select! {
            ok = sink.emit(stream, &buf[..take], cut) => ok,
            _ = sleep_until(deadline), if ended.is_none() => {
                begin_end(EndCause::TimedOut, &mut ended, &mut kill_at);
                true
            },
        };
        if cut && delivered {
            truncated = true;
            let marker = format!(
                "\n[corral: output truncated after {} bytes (executor.max_output); the rest was discarded]\n",
                bounds.max_output
            );
            delivered = sink.emit(stream, marker.as_bytes(), true).await;
        }
        if !delivered {
            client_gone = true;
            begin_end(EndCause::Disconnected, &mut ended, &mut kill_at);
        }
    }
    // The leader is reaped; make sure nothing of its group survives, and reap what was left
    // (orphans come to the server when it is a child subreaper, see `Server::run`).
    kill_group(pgid, Signal::SIGKILL);
    reap_group(pgid).await;
    std::mem::forget(guard);

    let status = status.expect("the loop ends only after the leader exited");
    let signal = std::os::unix::process::ExitStatusExt::signal(&status);
    let ended = ended.unwrap_or(EndCause::Exited);
    let exit = match (ended, status.code(), signal) {
        (EndCause::TimedOut, _, _) => 124,
        (_, Some(code), _) => code,
        (_, None, Some(sig)) => 128 + sig,
        (_, None, None) => 125,
    };
    Outcome {
        exit: Exit {
            exit,
            signal,
            timed_out: ended == EndCause::TimedOut,
            truncated,
        },
        ended,
        bytes_out,
    }
}

/// Reap the zombies of group `pgid` that are this process's children, for up to two seconds.
/// Only called after the group leader itself was reaped, so it never takes the exit status of
/// a child tokio is waiting for (every other command's leader leads its own group).
async fn reap_group(pgid: i32) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use nix::unistd::Pid;
    let give_up = Instant::now() + Duration::from_secs(2);
    loop {
        match waitpid(Pid::from_raw(-pgid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                if Instant::now() >= give_up {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            // ECHILD: none of our children is left in the group.
            Err(_) => return,
        }
    }
}

/// Kills the group with SIGKILL when dropped.
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0, Signal::SIGKILL);
    }
}
