//! `corral watch` driven in a real terminal (a pty): it shows the running jail's denial, and
//! its keys have their effect on the running jail and on `corral.toml`: `a` allows for the run
//! (the jail's next request succeeds, the file is untouched), `d` denies in `corral.toml` (which
//! beats the run's allow), `p` adds the allow to `corral.toml` with every comment kept.

mod jail_support;
mod live_support;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jail_support::*;
use live_support::*;

/// `corral watch` on a pty; what it drew is read on a thread so it never blocks on output.
struct Watch {
    master: std::fs::File,
    _slave: std::fs::File,
    child: std::process::Child,
    screen: Arc<Mutex<Vec<u8>>>,
}

impl Watch {
    fn start(w: &World) -> Watch {
        let mut c = w.corral();
        c.arg("watch").env("TERM", "xterm-256color");
        let (master, slave, child) = under_pty(c, 40, 200);
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

    /// Wait until the terminal output since `from` contains `needle`; the output's length.
    #[track_caller]
    fn wait_for(&mut self, from: usize, needle: &str) -> usize {
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

    fn key(&mut self, k: &str) {
        self.master.write_all(k.as_bytes()).unwrap();
    }

    /// `q`, and its exit status.
    fn quit(mut self) -> std::process::ExitStatus {
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

#[test]
fn watch_allows_for_the_run_then_denies_in_corral_toml() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    let policy_file = w.project.join("corral.toml");
    write(&policy_file, &policy(""));
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 \"BEFORE $(try before)\"\nwait_go 1\nstep 2 \"ALLOWED $(try allowed)\"\n\
         wait_go 2\necho \"DENIED $(try denied)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    assert_eq!(wait_file(&w.project.join("step1")).trim(), "BEFORE 403");
    let mut watch = Watch::start(&w);
    // The denial, with the rule that denied it (words: the terminal skips cells that are
    // already blank, so a phrase arrives in pieces).
    watch.wait_for(0, &target);
    watch.wait_for(0, "network.allow");
    let before = std::fs::read_to_string(&policy_file).unwrap();
    watch.key("a");
    wait_record(&w, "live-allow", |r| summary(r).contains(&target));
    go(&w, 1);
    assert_eq!(wait_file(&w.project.join("step2")).trim(), "ALLOWED 200");
    assert_eq!(
        std::fs::read_to_string(&policy_file).unwrap(),
        before,
        "an allow for the run is written nowhere"
    );
    // `d` on the same denial: into corral.toml's deny list, which wins over the run's allow.
    watch.key("d");
    wait_record(&w, "live-policy", |r| {
        summary(r).contains(&format!("network.deny +{target}"))
    });
    let text = std::fs::read_to_string(&policy_file).unwrap();
    assert!(text.contains(&format!("deny = [\"{target}\"]")), "{text}");
    assert!(
        text.starts_with("# corral.toml of the live-policy test: this comment stays\n"),
        "{text}"
    );
    go(&w, 2);
    let out = bg.finish();
    assert!(out.stdout.contains("DENIED 403"), "{}", out.both());
    assert!(watch.quit().success());
}

#[test]
fn watch_adds_the_allow_to_corral_toml_keeping_its_comments() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    let policy_file = w.project.join("corral.toml");
    write(&policy_file, &policy(""));
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 \"BEFORE $(try before)\"\nwait_go 1\necho \"AFTER $(try after)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    assert_eq!(wait_file(&w.project.join("step1")).trim(), "BEFORE 403");
    let mut watch = Watch::start(&w);
    watch.wait_for(0, &target);
    watch.key("p");
    wait_record(&w, "live-policy", |r| {
        summary(r).contains(&format!("network.allow +{target}"))
    });
    // The whole file: only the one array gained the element.
    assert_eq!(
        std::fs::read_to_string(&policy_file).unwrap(),
        policy(&format!("\"{target}\""))
    );
    go(&w, 1);
    let out = bg.finish();
    assert!(out.stdout.contains("AFTER 200"), "{}", out.both());
    // The file stays trusted: the next run starts without asking.
    let again = w.sh("proxy", "echo END");
    ran(&again, "END");
    assert!(watch.quit().success());
}

#[test]
fn watch_without_a_terminal_says_so() {
    let w = World::new();
    let mut c = w.corral();
    c.arg("watch");
    let out = run(c);
    assert_eq!(out.code, 125, "{}", out.both());
    assert!(
        out.stderr
            .contains("corral watch draws on a terminal and reads its keys"),
        "{}",
        out.both()
    );
}
