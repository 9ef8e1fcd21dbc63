//! Where to answer a held request (`network.on_deny = "ask"`): while the proxy holds a
//! request for `corral watch`, the user is told, without a byte on the jail's screen.
//!
//! - The jail has a pty: the user's terminal title says what waits and where to answer, with a
//!   bell per new question; the user's title comes back when nothing waits (termstatus.rs in
//!   corral-sandbox; written only between the jail's sequences).
//! - The jail has no pty: one line on corral's stderr per question (at most
//!   [`MAX_LINES`] a run).
//! - Either way, a desktop notification when `notify-send` is on PATH and a desktop session is
//!   there (`DBUS_SESSION_BUS_ADDRESS`, `DISPLAY` or `WAYLAND_DISPLAY`): started with an argv
//!   (no shell), never waited for, at most one at a time (a question asked while one is still
//!   running is not notified: the title, `corral watch` and the audit log still have it), at
//!   most [`MAX_NOTIFICATIONS`] a run.
//!
//! Names come from the jail (the destination it asked for): shown escaped
//! (`corral_audit::printable`) and bounded ([`MAX_HOST`]). The proxy only wakes this thread
//! (`Asks::watch`), so nothing here can slow it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use corral_net::ask::{Asks, Question};
use corral_sandbox::termstatus::TermStatus;

/// Longest host name shown, in characters (longer ones are cut, with `...`).
pub const MAX_HOST: usize = 80;
/// Lines on stderr a run says about held requests at most.
pub const MAX_LINES: usize = 100;
/// Desktop notifications a run sends at most (a jail asking for ever new names cannot flood
/// the desktop).
pub const MAX_NOTIFICATIONS: usize = 20;

/// Telling the user about held requests, for as long as it lives.
pub struct HeldNotice {
    asks: Arc<Asks>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HeldNotice {
    /// Follow `asks` on a thread of its own; `terminal`: the jail's pty is shown on the user's
    /// terminal, whose title says it (else stderr does).
    pub fn start(asks: Arc<Asks>, terminal: Option<TermStatus>) -> HeldNotice {
        let woken = asks.watch();
        let thread = {
            let asks = asks.clone();
            std::thread::Builder::new()
                .name("corral-held".into())
                .spawn(move || {
                    let mut tell = HeldNotifier::new(terminal);
                    while woken.recv().is_ok() {
                        tell.questions(&asks.list());
                    }
                    tell.end();
                })
                .ok()
        };
        if thread.is_none() {
            eprintln!("corral: held requests are not announced here this run (no thread)");
        }
        HeldNotice { asks, thread }
    }
}

impl Drop for HeldNotice {
    fn drop(&mut self) {
        self.asks.unwatch();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Tells the user about new held questions: on the terminal's title or stderr, and on the
/// desktop when one is found.
struct HeldNotifier {
    terminal: Option<TermStatus>,
    /// The highest question id told (ids grow: a question above it is new).
    told: u64,
    lines: usize,
    desktop: Option<Desktop>,
    looked_for_desktop: bool,
}

impl HeldNotifier {
    fn new(terminal: Option<TermStatus>) -> HeldNotifier {
        HeldNotifier {
            terminal,
            told: 0,
            lines: 0,
            desktop: None,
            looked_for_desktop: false,
        }
    }

    /// The questions pending now (oldest first).
    fn questions(&mut self, pending: &[Question]) {
        let new: Vec<&Question> = pending.iter().filter(|q| q.id > self.told).collect();
        self.told = pending
            .iter()
            .map(|q| q.id)
            .max()
            .unwrap_or(0)
            .max(self.told);
        match &self.terminal {
            Some(t) => t.set(title(pending).as_deref(), !new.is_empty()),
            None => {
                for q in &new {
                    self.line(q);
                }
            }
        }
        if let Some(q) = new.last() {
            if !self.looked_for_desktop {
                self.looked_for_desktop = true;
                self.desktop = Desktop::find(|k| std::env::var_os(k));
            }
            if let Some(d) = &mut self.desktop {
                d.notify(q);
            }
        }
    }

    fn line(&mut self, q: &Question) {
        self.lines += 1;
        match self.lines {
            n if n < MAX_LINES => eprintln!("{}", stderr_line(q)),
            MAX_LINES => eprintln!(
                "corral: more requests are held than said here: see them in `corral watch`"
            ),
            _ => {}
        }
    }

    fn end(&mut self) {
        if let Some(t) = &self.terminal {
            t.set(None, false);
        }
    }
}

/// The host of `q`, escaped and bounded.
fn host(q: &Question) -> String {
    let printable = corral_audit::printable(&q.host);
    if printable.chars().count() <= MAX_HOST {
        return printable;
    }
    let cut: String = printable.chars().take(MAX_HOST - 3).collect();
    format!("{cut}...")
}

/// `HOST:PORT` of `q`, escaped and bounded.
fn destination(q: &Question) -> String {
    format!("{}:{}", host(q), q.port)
}

/// The terminal's title while questions are pending (the newest named); `None` when none is.
fn title(pending: &[Question]) -> Option<String> {
    let newest = pending.last()?;
    let more = match pending.len() - 1 {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "corral: waiting: {}{more} - answer in `corral watch`",
        destination(newest)
    ))
}

fn stderr_line(q: &Question) -> String {
    format!(
        "corral: held {}: answer with corral watch (or corral allow {})",
        destination(q),
        host(q)
    )
}

/// `notify-send` where a desktop session is.
#[derive(Debug)]
struct Desktop {
    program: PathBuf,
    running: Option<Child>,
    sent: usize,
}

impl Desktop {
    /// `notify-send` on PATH when a desktop session is there (`env`: the environment).
    fn find(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<Desktop> {
        let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
        if !["DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY"]
            .into_iter()
            .any(set)
        {
            return None;
        }
        let program = std::env::split_paths(&env("PATH")?)
            .filter(|d| d.is_absolute())
            .map(|d| d.join("notify-send"))
            .find(|p| is_executable(p))?;
        Some(Desktop {
            program,
            running: None,
            sent: 0,
        })
    }

    /// One notification of `q`, unless the previous one is still running or the run sent
    /// its share.
    fn notify(&mut self, q: &Question) {
        if let Some(child) = &mut self.running
            && matches!(child.try_wait(), Ok(None))
        {
            return;
        }
        if self.sent >= MAX_NOTIFICATIONS {
            return;
        }
        self.sent += 1;
        self.running = Command::new(&self.program)
            .args(notify_args(q))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// notify-send's arguments for `q` (markup characters left out: some desktops read the body
/// as markup).
fn notify_args(q: &Question) -> Vec<String> {
    let plain = |s: String| s.replace(['<', '>', '&'], "?");
    vec![
        "--app-name=corral".into(),
        "corral: a request waits for an answer".into(),
        plain(format!(
            "{} is held: answer in `corral watch` (or `corral allow {}`)",
            destination(q),
            host(q)
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(id: u64, host: &str, port: u16) -> Question {
        Question {
            id,
            method: "CONNECT".into(),
            host: host.into(),
            port,
            rule: "not in network.allow".into(),
            held: 1,
            remaining: 30,
        }
    }

    #[test]
    fn the_words_name_the_destination_escaped_and_bounded() {
        let a = question(1, "a.example", 443);
        assert_eq!(
            stderr_line(&a),
            "corral: held a.example:443: answer with corral watch (or corral allow a.example)"
        );
        assert_eq!(
            title(std::slice::from_ref(&a)).unwrap(),
            "corral: waiting: a.example:443 - answer in `corral watch`"
        );
        let b = question(2, "b\x1b]0;x\x07<i>", 80);
        assert_eq!(
            title(&[a.clone(), b.clone()]).unwrap(),
            "corral: waiting: b\\u{1b}]0;x\\u{7}<i>:80 and 1 more - answer in `corral watch`"
        );
        assert_eq!(title(&[]), None);
        assert_eq!(
            notify_args(&b),
            vec![
                "--app-name=corral",
                "corral: a request waits for an answer",
                "b\\u{1b}]0;x\\u{7}?i?:80 is held: answer in `corral watch` (or `corral allow \
                 b\\u{1b}]0;x\\u{7}?i?`)"
            ]
        );
        let long = question(3, &"x".repeat(300), 1);
        assert_eq!(host(&long), format!("{}...", "x".repeat(MAX_HOST - 3)));
    }

    #[test]
    fn notifications_are_one_at_a_time_and_bounded_per_run() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let bin = dir.path().join("notify-send");
        std::fs::write(
            &bin,
            format!("#!/bin/sh\necho \"$3\" >> {}\n", log.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut d = Desktop {
            program: bin,
            running: None,
            sent: 0,
        };
        // While one runs, a new question is not notified.
        let slow = dir.path().join("slow");
        std::fs::write(&slow, "#!/bin/sh\nread x\n").unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
        let fast = std::mem::replace(&mut d.program, slow);
        d.running = Some(
            Command::new(&d.program)
                .stdin(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        d.notify(&question(1, "early.example", 443));
        assert_eq!(d.sent, 0);
        drop(d.running.as_mut().unwrap().stdin.take());
        d.running.as_mut().unwrap().wait().unwrap();
        d.program = fast;
        for i in 0..MAX_NOTIFICATIONS + 5 {
            d.notify(&question(i as u64, &format!("h{i}.example"), 443));
            if let Some(child) = d.running.as_mut() {
                child.wait().unwrap();
            }
        }
        let sent = std::fs::read_to_string(&log).unwrap();
        assert_eq!(sent.lines().count(), MAX_NOTIFICATIONS, "{sent}");
        assert!(sent.starts_with("h0.example:443 is held"), "{sent}");
    }

    #[test]
    fn a_desktop_needs_a_session_and_notify_send_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("notify-send");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().as_os_str().to_owned();
        let env = |vars: &'static [(&'static str, &'static str)]| {
            let path = path.clone();
            move |k: &str| match k {
                "PATH" => Some(path.clone()),
                _ => vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.into()),
            }
        };
        let found = |vars| Desktop::find(env(vars)).map(|d| d.program);
        assert_eq!(found(&[]), None, "no session");
        assert_eq!(found(&[("DISPLAY", "")]), None, "an empty variable");
        assert_eq!(found(&[("DISPLAY", ":0")]), Some(bin.clone()));
        assert_eq!(
            found(&[("WAYLAND_DISPLAY", "wayland-0")]),
            Some(bin.clone())
        );
        assert_eq!(
            found(&[("DBUS_SESSION_BUS_ADDRESS", "unix:path=/x")]),
            Some(bin.clone())
        );
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(found(&[("DISPLAY", ":0")]), None, "not executable");
    }
}
