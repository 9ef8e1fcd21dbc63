//! corral's own lines at the end of a run, on a terminal the jail has just written to.
//!
//! What the jail writes reaches the user's terminal through the output filter
//! (corral-sandbox `termfilter.rs`), which passes everything that acts on the jail's own screen:
//! attributes (conceal, SGR 8; foreground on background), character sets (DEC line drawing),
//! the alternate screen, scroll margins, a hidden cursor, an open string that swallows what
//! follows. (Colour changes, which outlast the jail and which only a reset undoes, are not
//! passed: a reset would undo the palette the user's own shell set too.) Left that way, corral's summary and quarantine lines
//! would be invisible, scrolled in a two-row region, or drawn in line-drawing glyphs, and the
//! jail's own "corral: nothing changed" would be what the user reads. So once the jail is gone
//! and before corral writes a line of its own, [`restore_terminal`] writes [`TERMINAL_RESET`]
//! to corral's stderr when that is a terminal, and [`say`] starts corral's lines after a blank
//! line, each on a single-width line.
//!
//! The terminal's settings (termios): a native jail never holds the user's terminal (a pty of
//! its own, or pipes), and the raw mode corral sets for the relay is undone when the relay ends
//! (corral-sandbox `term.rs` `RawMode`); a container run with `--tty` gives the container the
//! terminal itself. So [`save_terminal`] keeps the settings at the start, and
//! [`restore_terminal`] puts them back when they differ at the end (echo off, no line editing),
//! when corral is in the terminal's foreground (a background corral would be stopped).

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU8, Ordering};

/// What puts back the terminal state a jail can leave, without moving the cursor, clearing the
/// screen or printing anything. In order:
///
/// - CAN and ST: end a sequence or string (an OSC title, a DCS) the jail left open, which would
///   swallow what follows;
/// - DECSC then leave the alternate screen (1049; 47): the cursor saved is per screen, so a
///   terminal already on the main screen stays where it is;
/// - end a synchronized update (2026), which holds what the terminal shows;
/// - DECSC, full scroll margins (DECSTBM, homes the cursor), no left/right margins (69), DECRC:
///   the cursor back where it was;
/// - soft reset (DECSTR), then each mode it covers set again for terminals without it:
///   autowrap on (a line is not cut at the edge), insert mode off, reverse video off, cursor
///   visible, normal cursor keys and keypad, mouse reporting, focus events and bracketed
///   paste off;
/// - G0-G3 designated ASCII, G0 shifted in (SI);
/// - SGR 0: no conceal, no colour, no attribute.
pub const TERMINAL_RESET: &str = concat!(
    "\x18\x1b\\",
    "\x1b7\x1b[?1049l\x1b[?47l",
    "\x1b[?2026l",
    "\x1b7\x1b[r\x1b[?69l\x1b8",
    "\x1b[!p",
    "\x1b[?7h\x1b[4l\x1b[?5l\x1b[?25h\x1b[?1l\x1b>",
    "\x1b[?9l\x1b[?1000l\x1b[?1001l\x1b[?1002l\x1b[?1003l\x1b[?1004l\x1b[?1005l\x1b[?1006l\x1b[?1015l\x1b[?1016l\x1b[?2004l",
    "\x1b(B\x1b)B\x1b*B\x1b+B\x0f",
    "\x1b[0m",
);

/// DECSWL: the line the cursor is on is single-width, single-height (a jail can leave lines
/// double-width, which shows half of what is written on them).
pub const SINGLE_WIDTH_LINE: &str = "\x1b#5";

/// Where the end of the run is: no reset written yet; reset, no line yet; lines being said.
const QUIET: u8 = 0;
const RESET: u8 = 1;
const SAYING: u8 = 2;
static STAGE: AtomicU8 = AtomicU8::new(QUIET);

/// The user's terminal (the first of stdin, stdout, stderr that is one) and its settings at
/// the start of the run.
static SAVED: std::sync::Mutex<Option<(i32, nix::sys::termios::Termios)>> =
    std::sync::Mutex::new(None);

/// Keep the settings of the user's terminal before the jail starts, for [`restore_terminal`].
pub fn save_terminal() {
    for fd in [0, 1, 2] {
        // SAFETY: 0-2 are open for the process's life (or not a terminal: isatty fails).
        let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        if nix::unistd::isatty(b).unwrap_or(false) {
            if let Ok(t) = nix::sys::termios::tcgetattr(b) {
                *SAVED.lock().unwrap_or_else(|p| p.into_inner()) = Some((fd, t));
            }
            return;
        }
    }
}

/// The settings [`save_terminal`] kept, put back when they changed and corral is in the
/// terminal's foreground.
fn restore_settings() {
    use nix::sys::termios::{SetArg, Termios, tcgetattr, tcsetattr};
    let Some((fd, saved)) = SAVED.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return;
    };
    // SAFETY: as in `save_terminal`.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let same = |a: &Termios, b: &Termios| {
        a.input_flags == b.input_flags
            && a.output_flags == b.output_flags
            && a.control_flags == b.control_flags
            && a.local_flags == b.local_flags
            && a.control_chars == b.control_chars
    };
    let Ok(now) = tcgetattr(b) else { return };
    let foreground = nix::unistd::tcgetpgrp(b).is_ok_and(|g| g == nix::unistd::getpgrp());
    if !same(&now, &saved) && foreground {
        let _ = tcsetattr(b, SetArg::TCSADRAIN, &saved);
    }
}

/// The jail is gone: put back the terminal state it may have left, on corral's stderr when
/// that is a terminal (where corral's lines go), else on its stdout when that is one (the
/// user's shell comes next there). Call once, before corral's first end-of-run line, and never
/// while a jail writes to the terminal (an executor command's session runs while its run's
/// jail does).
pub fn restore_terminal() {
    restore_settings();
    let is_tty = |fd: std::os::fd::BorrowedFd<'_>| nix::unistd::isatty(fd).unwrap_or(false);
    let stderr = std::io::stderr();
    if is_tty(stderr.as_fd()) {
        let mut err = stderr.lock();
        if err
            .write_all(TERMINAL_RESET.as_bytes())
            .and_then(|()| err.flush())
            .is_ok()
        {
            STAGE.store(RESET, Ordering::SeqCst);
        }
        return;
    }
    let stdout = std::io::stdout();
    if is_tty(stdout.as_fd()) {
        let mut out = stdout.lock();
        let _ = out
            .write_all(TERMINAL_RESET.as_bytes())
            .and_then(|()| out.flush());
    }
}

/// Write one of corral's end-of-run lines on stderr. After [`restore_terminal`] reset a
/// terminal, the first line comes after a blank line (what the jail printed last is apart from
/// what corral says) and each starts with [`SINGLE_WIDTH_LINE`]. `line` must be escaped already
/// where it quotes what the jail chose (`corral_audit::printable`).
pub fn say(line: &str) {
    let stage = STAGE
        .compare_exchange(RESET, SAYING, Ordering::SeqCst, Ordering::SeqCst)
        .unwrap_or_else(|s| s);
    let mut err = std::io::stderr().lock();
    let _ = match stage {
        QUIET => writeln!(err, "{line}"),
        RESET => write!(err, "\n{SINGLE_WIDTH_LINE}{line}\n"),
        _ => writeln!(err, "{SINGLE_WIDTH_LINE}{line}"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reset prints nothing, homes nothing, clears nothing: every byte is inside an escape
    /// sequence or one of the controls it means (CAN, SI), and no sequence that moves the
    /// cursor or erases stands outside a DECSC/DECRC pair.
    #[test]
    fn the_reset_prints_nothing_and_leaves_the_cursor() {
        let bytes = TERMINAL_RESET.as_bytes();
        let mut i = 0;
        let mut saved = 0;
        while i < bytes.len() {
            match bytes[i] {
                0x18 | 0x0f => i += 1,
                0x1b => {
                    let rest = &TERMINAL_RESET[i + 1..];
                    let len = if let Some(csi) = rest.strip_prefix('[') {
                        1 + csi
                            .find(|c: char| ('@'..='~').contains(&c))
                            .expect("CSI final")
                            + 1
                    } else if rest.starts_with(']') {
                        rest.find("\x1b\\").expect("OSC ends with ST") + 2
                    } else if rest.starts_with(['(', ')', '*', '+', '#']) {
                        2
                    } else {
                        1
                    };
                    let seq = &rest[..len];
                    match seq {
                        "7" => saved += 1,
                        "8" | "[?1049l" => saved -= 1,
                        "[r" => assert_eq!(saved, 1, "DECSTBM homes the cursor: only saved"),
                        _ => {}
                    }
                    assert!(
                        !["[H", "[2J", "[J", "[K", "c"].contains(&seq),
                        "{seq:?} moves or erases"
                    );
                    i += 1 + len;
                }
                b => panic!("byte {b:#x} at {i} would be printed"),
            }
        }
        // Each DECSC is restored: by leaving the alternate screen, or by DECRC.
        assert_eq!(saved, 0);
    }

    /// Each thing a jail can leave has its undoing in the reset, in an order that keeps it
    /// undone (SGR 0 after the DECRC that restores saved attributes).
    #[test]
    fn the_reset_undoes_what_a_jail_can_leave() {
        let at = |s: &str| {
            TERMINAL_RESET
                .rfind(s)
                .unwrap_or_else(|| panic!("{s:?} missing"))
        };
        for part in [
            "\x1b[0m",
            "\x1b(B",
            "\x0f",
            "\x1b[?1049l",
            "\x1b[?25h",
            "\x1b[r",
            "\x1b[?7h",
            "\x1b[?2026l",
            "\x1b[?1000l",
            "\x1b[?2004l",
            "\x1b[4l",
        ] {
            at(part);
        }
        assert!(TERMINAL_RESET.starts_with('\x18'));
        assert!(at("\x1b[0m") > at("\x1b8") && at("\x1b(B") > at("\x1b8"));
        assert!(TERMINAL_RESET.ends_with("\x1b[0m"));
        // The user's own palette and colours stay (the jail's changes never reach them).
        assert!(!TERMINAL_RESET.contains("\x1b]1"), "{TERMINAL_RESET:?}");
    }
}
