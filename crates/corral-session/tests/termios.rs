//! The terminal's settings a run changed (a container given the terminal turns echo and line
//! editing off) are put back before corral's end-of-run lines. One test in its own process: it
//! makes a new session whose controlling terminal is a pty, as the user's shell would.

use std::os::fd::AsFd;

use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};

#[test]
fn settings_the_run_changed_are_put_back() {
    nix::unistd::setsid().expect("setsid");
    // Closing the pty's master at the end hangs the terminal up: not this test's failure.
    // SAFETY: SIG_IGN installs no handler code.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::SIGHUP,
            nix::sys::signal::SigHandler::SigIgn,
        )
    }
    .unwrap();
    let pty = nix::pty::openpty(None, None).unwrap();
    // SAFETY: TIOCSCTTY on a descriptor we own; the process is a session leader now.
    assert_eq!(
        unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&pty.slave),
                libc::TIOCSCTTY,
                0,
            )
        },
        0
    );
    // The slave as stdin: the user's terminal.
    nix::unistd::dup2_stdin(pty.slave.as_fd()).unwrap();
    let cooked = tcgetattr(pty.slave.as_fd()).unwrap();
    assert!(
        cooked
            .local_flags
            .contains(LocalFlags::ECHO | LocalFlags::ICANON)
    );

    corral_session::endlines::save_terminal();
    // What the run did to the terminal.
    let mut raw = cooked.clone();
    raw.local_flags
        .remove(LocalFlags::ECHO | LocalFlags::ICANON);
    tcsetattr(pty.slave.as_fd(), SetArg::TCSANOW, &raw).unwrap();
    // Control: the change holds until corral puts it back.
    let changed = tcgetattr(pty.slave.as_fd()).unwrap();
    assert!(!changed.local_flags.contains(LocalFlags::ECHO));

    corral_session::endlines::restore_terminal();
    let after = tcgetattr(pty.slave.as_fd()).unwrap();
    assert!(
        after
            .local_flags
            .contains(LocalFlags::ECHO | LocalFlags::ICANON),
        "{:?}",
        after.local_flags
    );
}
