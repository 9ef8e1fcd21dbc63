//! Signals as bytes on a pipe (the self-pipe trick), so each process's main loop handles them
//! in ordinary code: the handler only calls `write(2)`, which is async-signal-safe.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::fcntl::OFlag;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signo: libc::c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = signo as u8;
        // SAFETY: write(2) is async-signal-safe; `byte` lives for the call. A full pipe drops the
        // byte, which only coalesces repeated signals (the main loop re-checks children anyway).
        unsafe {
            libc::write(fd, (&byte as *const u8).cast(), 1);
        }
    }
}

/// The read end of this process's signal pipe. One per process at a time (the handler writes to
/// the most recently installed one): one jail per corral process.
pub struct SignalPipe {
    read: OwnedFd,
    _write: OwnedFd,
    signals: Vec<Signal>,
}

impl SignalPipe {
    /// Route `signals` to a fresh non-blocking pipe. Replaces any earlier pipe of this process
    /// (a forked child calls this again to get its own).
    pub fn install(signals: &[Signal]) -> nix::Result<SignalPipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        WRITE_FD.store(write.as_raw_fd(), Ordering::Relaxed);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        for &sig in signals {
            // SAFETY: the handler only performs an async-signal-safe write(2).
            unsafe { sigaction(sig, &action) }?;
        }
        Ok(SignalPipe {
            read,
            _write: write,
            signals: signals.to_vec(),
        })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.read
    }

    /// Signals received since the last call (non-blocking).
    pub fn drain(&self) -> Vec<Signal> {
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            match nix::unistd::read(&self.read, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend(
                    buf[..n]
                        .iter()
                        .filter_map(|&b| Signal::try_from(b as libc::c_int).ok()),
                ),
            }
        }
        out
    }

    /// Block until a signal arrives (or `timeout_ms` passes), then drain.
    pub fn wait(&self, timeout_ms: i32) -> Vec<Signal> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(self.read.as_fd(), PollFlags::POLLIN)];
        let _ = poll(
            &mut fds,
            PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::NONE),
        );
        self.drain()
    }

    /// Put the default dispositions back (before exec, or when the caller is done).
    pub fn restore_defaults(&self) {
        WRITE_FD.store(-1, Ordering::Relaxed);
        reset_dispositions(&self.signals);
    }
}

impl Drop for SignalPipe {
    /// The handler must never write to this pipe's descriptor number once it is closed (the
    /// number could be reused by an unrelated file).
    fn drop(&mut self) {
        self.restore_defaults();
    }
}

/// Default dispositions for `signals`.
pub fn reset_dispositions(signals: &[Signal]) {
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for &sig in signals {
        // SAFETY: restoring SIG_DFL installs no Rust code as a handler.
        let _ = unsafe { sigaction(sig, &dfl) };
    }
}
