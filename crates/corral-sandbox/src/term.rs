//! The terminal side of a jail, in corral: a pty of the jail's own, the user's terminal in raw
//! mode while the jail runs, and bytes, window size and signals relayed between them.
//!
//! Each of corral's stdin, stdout and stderr that is a terminal is the jail's pty inside
//! ([`PtyEnds`]); the others are handed to the jail as they are (a file, a pipe). So `corral
//! run -- cmd > out` at a terminal gives the command a terminal as stdin and the file as stdout,
//! as the command has without corral.
//!
//! The jail holds only the pty's slave, never the user's terminal, so TIOCSTI inside the jail
//! can only push bytes into the jail's own input. What the jail writes reaches the user's
//! terminal through [`OutputFilter`] (`termfilter.rs`): no escape sequence that acts outside
//! the jail's own screen (clipboard, files, keys, the window) gets through. corral's own word
//! on that terminal (the title while a request waits for `corral watch`: `termstatus.rs`) is
//! written only where the filter is between sequences and characters.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::pty::Winsize;
use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};
use serde::{Deserialize, Serialize};

use crate::termfilter::{Dropped, OutputFilter};
use crate::termstatus::{StatusShown, TermStatus};

pub(crate) fn is_tty(fd: BorrowedFd<'_>) -> bool {
    nix::unistd::isatty(fd).unwrap_or(false)
}

/// Which of the jail's stdin, stdout and stderr are its own pty: those that are a terminal in
/// corral. None of them: the jail has no pty (and no controlling terminal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PtyEnds {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

impl PtyEnds {
    /// The ends of corral's own stdio that are terminals.
    pub(crate) fn of_corral() -> PtyEnds {
        PtyEnds {
            stdin: is_tty(stdio(0)),
            stdout: is_tty(stdio(1)),
            stderr: is_tty(stdio(2)),
        }
    }

    /// Per descriptor 0, 1, 2: whether it is the pty.
    pub(crate) fn by_fd(self) -> [bool; 3] {
        [self.stdin, self.stdout, self.stderr]
    }

    /// Whether the jail has a pty at all.
    pub(crate) fn any(self) -> bool {
        self.by_fd().contains(&true)
    }

    /// The lowest of 0, 1, 2 that is the pty (the one made the controlling terminal).
    pub(crate) fn first(self) -> Option<RawFd> {
        (0..3).find(|&fd| self.by_fd()[fd as usize])
    }

    /// The user's terminal that shows the jail's pty: stdout, else stderr, else stdin (a
    /// terminal is open for writing too). What the jail writes to the pty, and the pty's echo
    /// of what the user types, go there.
    pub(crate) fn shown_on(self) -> Option<BorrowedFd<'static>> {
        [(self.stdout, 1), (self.stderr, 2), (self.stdin, 0)]
            .into_iter()
            .find(|(is, _)| *is)
            .map(|(_, fd)| stdio(fd))
    }

    /// The user's terminal whose settings and window size the jail's pty takes: stdin when it
    /// is one of the ends, else the one the pty is shown on.
    pub(crate) fn user_terminal(self) -> Option<BorrowedFd<'static>> {
        match self.stdin {
            true => Some(stdio(0)),
            false => self.shown_on(),
        }
    }
}

/// corral's own stdin, stdout or stderr (`fd` 0, 1 or 2).
pub(crate) fn stdio(fd: RawFd) -> BorrowedFd<'static> {
    assert!((0..3).contains(&fd), "not a stdio descriptor: {fd}");
    // SAFETY: 0, 1 and 2 stay open for corral's whole life (Rust's runtime opens /dev/null on
    // any that is closed at start, and corral never closes them).
    unsafe { BorrowedFd::borrow_raw(fd) }
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
    /// corral's stdin is the pty's input and has not ended.
    stdin_open: bool,
    master_open: bool,
    to_master: Vec<u8>,
    filter: OutputFilter,
    /// The user's terminal the pty's output goes to.
    shown_on: BorrowedFd<'static>,
    /// The one whose settings and window size the pty takes.
    user_terminal: BorrowedFd<'static>,
    /// corral's stdin is one of the pty's ends.
    takes_stdin: bool,
    /// corral's title on the user's terminal: what is wanted (the handle) and what is shown
    /// (none when its wake-up pipe could not be made: the relay goes on without it).
    status: Option<(TermStatus, StatusShown)>,
}

impl Relay {
    /// The relay of the jail's pty `master` for `ends`: corral's stdin feeds it when stdin is
    /// one of them; its output goes to the user's terminal (`PtyEnds::shown_on`). `None` when
    /// no end is a terminal.
    pub(crate) fn new(master: OwnedFd, filter: OutputFilter, ends: PtyEnds) -> Option<Relay> {
        let shown_on = ends.shown_on()?;
        let user_terminal = ends.user_terminal()?;
        set_nonblocking(master.as_fd());
        Some(Relay {
            status: crate::termstatus::pair().ok(),
            master,
            stdin_open: ends.stdin,
            master_open: true,
            to_master: Vec::new(),
            filter,
            shown_on,
            user_terminal,
            takes_stdin: ends.stdin,
        })
    }

    /// Whether corral's stdin feeds the pty (the user's terminal is then put in raw mode).
    pub(crate) fn takes_stdin(&self) -> bool {
        self.takes_stdin
    }

    /// The user's terminal the pty follows (settings at start, window size on SIGWINCH).
    pub(crate) fn user_terminal(&self) -> BorrowedFd<'static> {
        self.user_terminal
    }

    /// What corral says in the user's terminal title while the jail runs.
    pub(crate) fn status(&self) -> Option<TermStatus> {
        self.status.as_ref().map(|(s, _)| s.clone())
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
        let wi = self.status.as_ref().map(|(_, shown)| {
            fds.push(PollFd::new(shown.fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
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
        let status_in = ready(wi, PollFlags::POLLIN);
        drop(fds);
        if status_in {
            if let Some((_, shown)) = &self.status {
                shown.drain();
            }
            self.show_status();
        }
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

    /// Copy everything the jail wrote that is available now to the user's terminal, filtered.
    pub(crate) fn pump_output(&mut self) {
        let mut buf = [0u8; 16384];
        let mut filtered = Vec::with_capacity(buf.len());
        // What corral itself printed on stdout before goes first.
        if self.shown_on.as_raw_fd() == 1 {
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        loop {
            match nix::unistd::read(&self.master, &mut buf) {
                Ok(0) => {
                    self.master_open = false;
                    break;
                }
                Ok(n) => {
                    filtered.clear();
                    self.filter.push(&buf[..n], &mut filtered);
                    if write_all(self.shown_on, &filtered).is_err() {
                        break;
                    }
                    self.show_status();
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
    }
}

impl Relay {
    /// Bring corral's title to what is wanted, when the jail's output is between sequences and
    /// characters (else at a later boundary: a TUI's sequence is never cut).
    fn show_status(&mut self) {
        if let Some((_, shown)) = &mut self.status
            && self.filter.at_boundary()
        {
            let bytes = shown.update();
            let _ = write_all(self.shown_on, &bytes);
        }
    }

    /// The jail is gone and its output relayed: the user's title back if corral changed it
    /// (whatever the jail left unfinished, nothing of it follows any more).
    pub(crate) fn finish(&mut self) {
        if let Some((_, shown)) = &mut self.status {
            let bytes = shown.restore();
            let _ = write_all(self.shown_on, &bytes);
        }
    }
}

/// All of `buf` to `fd` (a terminal, blocking).
fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> nix::Result<()> {
    while !buf.is_empty() {
        match nix::unistd::write(fd, buf) {
            Ok(0) => return Err(nix::errno::Errno::EIO),
            Ok(n) => buf = &buf[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(stdin: bool, stdout: bool, stderr: bool) -> PtyEnds {
        PtyEnds {
            stdin,
            stdout,
            stderr,
        }
    }

    /// The ends; whether there is a pty; the controlling terminal's descriptor; where the pty
    /// is shown; whose settings it takes.
    type Row = (PtyEnds, bool, Option<RawFd>, Option<RawFd>, Option<RawFd>);

    /// Each combination of terminal ends.
    #[test]
    fn each_combination_of_terminal_ends() {
        let fd = |f: Option<BorrowedFd<'static>>| f.map(|f| f.as_raw_fd());
        let table: Vec<Row> = vec![
            (ends(false, false, false), false, None, None, None),
            (ends(true, true, true), true, Some(0), Some(1), Some(0)),
            (ends(true, false, false), true, Some(0), Some(0), Some(0)),
            (ends(true, false, true), true, Some(0), Some(2), Some(0)),
            (ends(false, true, true), true, Some(1), Some(1), Some(1)),
            (ends(false, false, true), true, Some(2), Some(2), Some(2)),
            (ends(true, true, false), true, Some(0), Some(1), Some(0)),
        ];
        let got: Vec<Row> = table
            .iter()
            .map(|(e, ..)| {
                (
                    *e,
                    e.any(),
                    e.first(),
                    fd(e.shown_on()),
                    fd(e.user_terminal()),
                )
            })
            .collect();
        assert_eq!(got, table);
    }
}
