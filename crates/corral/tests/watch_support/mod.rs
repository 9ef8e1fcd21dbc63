//! `corral watch` driven in a real terminal (a pty), for watch_tui.rs, jail_ask.rs and
//! engine_live.rs: what it draws is read on a thread so it never blocks on output, and every
//! wait is bounded by a generous deadline that fails the test with what was seen.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(120);

/// `corral watch` in `w`'s environment, for [`Watch::start`].
pub fn corral_watch(w: &crate::jail_support::World) -> Command {
    let mut c = w.corral();
    c.arg("watch");
    c
}

/// A `corral watch` on a pty (40x200 unless sized).
pub struct Watch {
    master: std::fs::File,
    _slave: std::fs::File,
    child: std::process::Child,
    screen: Arc<Mutex<Vec<u8>>>,
}

impl Watch {
    /// Start `watch` (a `corral watch` command with its environment) on a pty.
    pub fn start(watch: Command) -> Watch {
        Watch::start_sized(watch, 40, 200)
    }

    /// [`Watch::start`] on a pty of `rows` x `cols`.
    pub fn start_sized(mut watch: Command, rows: u16, cols: u16) -> Watch {
        watch.env("TERM", "xterm-256color");
        let (master, slave, child) = crate::jail_support::under_pty(watch, rows, cols);
        let screen = Arc::new(Mutex::new(Vec::new()));
        let (mut reader, s) = (master.try_clone().unwrap(), screen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Watch {
            master,
            _slave: slave,
            child,
            screen,
        }
    }

    /// Wait until the terminal output since `from` contains `needle` (a word: the terminal
    /// skips cells already blank, so a phrase arrives in pieces); the output's length then.
    #[track_caller]
    pub fn wait_for(&mut self, from: usize, needle: &str) -> usize {
        let start = Instant::now();
        loop {
            let seen = self.screen.lock().unwrap();
            if let Some(i) = String::from_utf8_lossy(&seen[from.min(seen.len())..]).find(needle) {
                return from + i + needle.len();
            }
            let text = String::from_utf8_lossy(&seen).into_owned();
            drop(seen);
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("corral watch exited ({status}) before showing {needle:?}:\n{text}");
            }
            assert!(
                start.elapsed() < DEADLINE,
                "corral watch did not show {needle:?}:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What it has drawn so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().unwrap()).into_owned()
    }

    /// How much it has drawn so far.
    pub fn len(&self) -> usize {
        self.screen.lock().unwrap().len()
    }

    pub fn key(&mut self, k: &str) {
        self.master.write_all(k.as_bytes()).unwrap();
    }

    /// `q`, and its exit status.
    pub fn quit(mut self) -> std::process::ExitStatus {
        self.key("q");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > DEADLINE {
                let _ = self.child.kill();
                panic!("corral watch did not quit on q");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
