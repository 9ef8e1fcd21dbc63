//! The terminal side of a jail, in corral: a pty of the jail's own, the user's terminal in raw
//! mode while the jail runs, and bytes, window size and signals relayed between them.
//!
//! The jail holds only the pty's slave, never the user's terminal, so TIOCSTI inside the jail
//! can only push bytes into the jail's own input. What the jail writes reaches the user's
//! terminal through [`OutputFilter`] (`termfilter.rs`): no escape sequence that acts outside
//! the jail's own screen (clipboard, files, keys, the window) gets through.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::pty::Winsize;
use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};

use crate::termfilter::{Dropped, OutputFilter};

pub(crate) fn is_tty(fd: BorrowedFd<'_>) -> bool {
    nix::unistd::isatty(fd).unwrap_or(false)
}

pub(crate) fn window_size(fd: BorrowedFd<'_>) -> Option<Winsize> {
    let mut ws = Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize struct, which we provide.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (rc == 0).then_some(ws)
}

pub(crate) fn set_window_size(fd: BorrowedFd<'_>, ws: &Winsize) {
    // SAFETY: TIOCSWINSZ reads one winsize struct, which we provide.
    unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, ws) };
}

/// The user's terminal settings and window size onto the jail's pty (through its master:
/// termios requests on a master act on the slave). A user without them leaves the defaults.
pub(crate) fn copy_terminal(user: BorrowedFd<'_>, master: BorrowedFd<'_>) {
    if let Ok(termios) = tcgetattr(user) {
        let _ = tcsetattr(master, SetArg::TCSANOW, &termios);
    }
    if let Some(ws) = window_size(user) {
        set_window_size(master, &ws);
    }
}

/// The user's terminal in raw mode until dropped (every exit path of the relay restores it).
pub(crate) struct RawMode<'a> {
    fd: BorrowedFd<'a>,
    saved: Termios,
}

impl<'a> RawMode<'a> {
    pub(crate) fn enter(fd: BorrowedFd<'a>) -> Option<RawMode<'a>> {
        let saved = tcgetattr(fd).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(fd, SetArg::TCSADRAIN, &raw).ok()?;
        Some(RawMode { fd, saved })
    }
}

impl Drop for RawMode<'_> {
    fn drop(&mut self) {
        let _ = tcsetattr(self.fd, SetArg::TCSADRAIN, &self.saved);
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) {
    if let Ok(bits) = fcntl(fd, FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(bits) | OFlag::O_NONBLOCK;
        let _ = fcntl(fd, FcntlArg::F_SETFL(flags));
    }
}

/// One pass of the relay; `Relay::step` is called until the jail is gone.
pub(crate) struct Relay {
    master: OwnedFd,
    stdin_open: bool,
    master_open: bool,
    to_master: Vec<u8>,
    filter: OutputFilter,
}

impl Relay {
    pub(crate) fn new(master: OwnedFd, filter: OutputFilter) -> Relay {
        set_nonblocking(master.as_fd());
        Relay {
            master,
            stdin_open: true,
            master_open: true,
            to_master: Vec::new(),
            filter,
        }
    }

    pub(crate) fn master(&self) -> BorrowedFd<'_> {
        self.master.as_fd()
    }

    /// What the output filter kept from the user's terminal so far.
    pub(crate) fn dropped(&self) -> Dropped {
        self.filter.dropped()
    }

    /// Wait up to `timeout_ms` for input, output or a signal byte on `sigfd`, and move bytes.
    pub(crate) fn step(&mut self, sigfd: BorrowedFd<'_>, timeout_ms: i32) {
        let stdin = std::io::stdin();
        let stdin_fd = stdin.as_fd();
        let mut fds = vec![PollFd::new(sigfd, PollFlags::POLLIN)];
        let master_flags = if self.to_master.is_empty() {
            PollFlags::POLLIN
        } else {
            PollFlags::POLLIN | PollFlags::POLLOUT
        };
        let mi = if self.master_open {
            fds.push(PollFd::new(self.master.as_fd(), master_flags));
            Some(fds.len() - 1)
        } else {
            None
        };
        // Stop reading the user while the jail has not taken what we already read.
        let si = if self.stdin_open && self.to_master.len() < 64 * 1024 {
            fds.push(PollFd::new(stdin_fd, PollFlags::POLLIN));
            Some(fds.len() - 1)
        } else {
            None
        };
        let timeout = PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::NONE);
        if poll(&mut fds, timeout).is_err() {
            return;
        }
        let ready = |i: Option<usize>, flag: PollFlags| {
            i.and_then(|i| fds[i].revents())
                .is_some_and(|r| r.intersects(flag | PollFlags::POLLHUP | PollFlags::POLLERR))
        };
        let master_in = ready(mi, PollFlags::POLLIN);
        let master_out = mi
            .and_then(|i| fds[i].revents())
            .is_some_and(|r| r.contains(PollFlags::POLLOUT));
        let stdin_in = ready(si, PollFlags::POLLIN);
        drop(fds);
        if stdin_in {
            let mut buf = [0u8; 8192];
            match nix::unistd::read(stdin_fd, &mut buf) {
                Ok(0) => self.stdin_open = false,
                Ok(n) => self.to_master.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Err(_) => self.stdin_open = false,
            }
        }
        if master_out || !self.to_master.is_empty() {
            self.flush_to_master();
        }
        if master_in {
            self.pump_output();
        }
    }

    fn flush_to_master(&mut self) {
        while !self.to_master.is_empty() {
            match nix::unistd::write(&self.master, &self.to_master) {
                Ok(n) => {
                    self.to_master.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => {
                    self.to_master.clear();
                    break;
                }
            }
        }
    }

    /// Copy everything the jail wrote that is available now to our stdout, filtered.
    pub(crate) fn pump_output(&mut self) {
        let mut buf = [0u8; 16384];
        let mut filtered = Vec::with_capacity(buf.len());
        let mut out = std::io::stdout().lock();
        loop {
            match nix::unistd::read(&self.master, &mut buf) {
                Ok(0) => {
                    self.master_open = false;
                    break;
                }
                Ok(n) => {
                    filtered.clear();
                    self.filter.push(&buf[..n], &mut filtered);
                    if out.write_all(&filtered).is_err() {
                        break;
                    }
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => break,
                // EIO: every slave descriptor is closed (the jail is gone).
                Err(_) => {
                    self.master_open = false;
                    break;
                }
            }
        }
        let _ = out.flush();
    }
}
