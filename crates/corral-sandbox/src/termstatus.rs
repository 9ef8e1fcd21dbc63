//! A word from corral on the user's terminal while the jail's pty is relayed there: the
//! terminal's title and a bell (a request held for `corral watch`), never a byte on the screen.
//!
//! The relay writes corral's bytes only where the jail's stream is between escape sequences and
//! characters ([`OutputFilter::at_boundary`](crate::termfilter::OutputFilter::at_boundary)), so
//! a TUI's sequence is never cut nor joined; while the jail keeps a sequence open, corral's
//! word waits. Shown: the title the user had is pushed on the terminal's title stack
//! (`CSI 22;0t`), corral's is set (OSC 2) with a bell; when nothing is to be said any more (and
//! when the relay ends) the title is popped back (`CSI 23;0t`). A terminal without a title stack
//! keeps corral's title until the next program sets one.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use nix::fcntl::OFlag;

/// Longest title corral sets, in characters.
pub const MAX_TITLE: usize = 200;

/// What corral wants the terminal to show: its title, and how many bells so far.
#[derive(Debug, Default)]
struct WantedStatus {
    title: Option<String>,
    /// Bells asked for so far.
    rings: u64,
}

struct Shared {
    want: Mutex<WantedStatus>,
    /// The relay's wake-up pipe (both ends non-blocking): the read end is kept here too, so a
    /// write after the relay ended fills the pipe at worst, never raises SIGPIPE.
    wake: OwnedFd,
    wake_rx: OwnedFd,
}

/// What corral wants the user's terminal to say; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct TermStatus {
    shared: Arc<Shared>,
}

impl TermStatus {
    /// Say `title` in the terminal's title (`None`: nothing to say, the user's title back),
    /// ringing the bell once more when `ring`. Never blocks: the relay picks it up at the next
    /// boundary of the jail's output.
    pub fn set(&self, title: Option<&str>, ring: bool) {
        {
            let mut want = self.shared.want.lock().unwrap_or_else(|e| e.into_inner());
            want.title = title.map(clean_title);
            if ring {
                want.rings += 1;
            }
        }
        // A full pipe already wakes the relay.
        let _ = nix::unistd::write(&self.shared.wake, b"s");
    }
}

/// The relay's side: what corral's title shows now, and the bytes that make it what is wanted.
pub(crate) struct StatusShown {
    shared: Arc<Shared>,
    shown: Option<String>,
    rung: u64,
}

/// A status and the relay's side of it.
pub(crate) fn pair() -> nix::Result<(TermStatus, StatusShown)> {
    let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    let shared = Arc::new(Shared {
        want: Mutex::new(WantedStatus::default()),
        wake: tx,
        wake_rx: rx,
    });
    let shown = StatusShown {
        shared: shared.clone(),
        shown: None,
        rung: 0,
    };
    Ok((TermStatus { shared }, shown))
}

impl StatusShown {
    /// Readable when the wanted status changed.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.shared.wake_rx.as_fd()
    }

    /// Empty the wake-up pipe.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 64];
        while matches!(nix::unistd::read(&self.shared.wake_rx, &mut buf), Ok(n) if n > 0) {}
    }

    /// The bytes that bring the terminal from what it shows to what is wanted (empty when
    /// nothing changed); they are taken as written.
    pub(crate) fn update(&mut self) -> Vec<u8> {
        let (title, rings) = {
            let want = self.shared.want.lock().unwrap_or_else(|e| e.into_inner());
            (want.title.clone(), want.rings)
        };
        let ring = rings > self.rung;
        self.rung = rings;
        let bytes = transition(self.shown.as_deref(), title.as_deref(), ring);
        self.shown = title;
        bytes
    }

    /// The bytes that give the user's title back (the relay ends).
    pub(crate) fn restore(&mut self) -> Vec<u8> {
        transition(self.shown.take().as_deref(), None, false)
    }
}

/// From title `shown` (corral's, `None`: the user's) to `want`, with a bell when `ring` and
/// there is something to say.
fn transition(shown: Option<&str>, want: Option<&str>, ring: bool) -> Vec<u8> {
    let mut out = Vec::new();
    match (shown, want) {
        (None, Some(t)) => {
            out.extend_from_slice(b"\x1b[22;0t");
            osc_title(t, &mut out);
        }
        (Some(a), Some(b)) if a != b => osc_title(b, &mut out),
        (Some(_), None) => out.extend_from_slice(b"\x1b[23;0t"),
        _ => {}
    }
    if ring && want.is_some() {
        out.push(0x07);
    }
    out
}

fn osc_title(title: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(b"\x1b]2;");
    out.extend_from_slice(clean_title(title).as_bytes());
    out.extend_from_slice(b"\x1b\\");
}

/// `title` with no control character (C0, DEL, C1: none can end the OSC early) and at most
/// [`MAX_TITLE`] characters.
fn clean_title(title: &str) -> String {
    title
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_TITLE)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_title_is_pushed_set_changed_and_popped_with_a_bell_per_ring() {
        let (status, mut shown) = pair().unwrap();
        assert_eq!(shown.update(), b"");
        status.set(Some("corral: waiting: a.test:443"), true);
        assert_eq!(
            shown.update(),
            b"\x1b[22;0t\x1b]2;corral: waiting: a.test:443\x1b\\\x07".to_vec()
        );
        assert_eq!(shown.update(), b"", "said once");
        status.set(Some("corral: waiting: b.test:80"), true);
        status.set(Some("corral: waiting: b.test:80"), false);
        assert_eq!(
            shown.update(),
            b"\x1b]2;corral: waiting: b.test:80\x1b\\\x07".to_vec()
        );
        status.set(None, false);
        assert_eq!(shown.update(), b"\x1b[23;0t".to_vec());
        assert_eq!(shown.restore(), b"", "nothing of corral's shown");
        status.set(Some("again"), false);
        assert_eq!(shown.update(), b"\x1b[22;0t\x1b]2;again\x1b\\".to_vec());
        assert_eq!(shown.restore(), b"\x1b[23;0t".to_vec());
    }

    #[test]
    fn a_title_cannot_end_its_sequence_or_grow_without_bound() {
        let (status, mut shown) = pair().unwrap();
        status.set(Some("a\x07b\x1b]52;c;QQ==\u{9c}\u{9d}"), false);
        assert_eq!(
            shown.update(),
            b"\x1b[22;0t\x1b]2;a?b?]52;c;QQ==??\x1b\\".to_vec()
        );
        status.set(Some(&"é".repeat(1000)), false);
        let bytes = shown.update();
        let title = std::str::from_utf8(&bytes[4..bytes.len() - 2]).unwrap();
        assert_eq!(title.chars().count(), MAX_TITLE);
    }

    #[test]
    fn a_change_wakes_the_relay() {
        let (status, shown) = pair().unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(
            nix::unistd::read(&shown.shared.wake_rx, &mut buf),
            Err(nix::errno::Errno::EAGAIN)
        );
        status.set(Some("t"), true);
        assert_eq!(nix::unistd::read(&shown.shared.wake_rx, &mut buf), Ok(1));
        status.set(Some("u"), true);
        status.set(Some("v"), true);
        shown.drain();
        assert_eq!(
            nix::unistd::read(&shown.shared.wake_rx, &mut buf),
            Err(nix::errno::Errno::EAGAIN)
        );
    }
}
