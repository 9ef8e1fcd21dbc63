//! Helpers of the live-policy tests (jail_live_policy.rs, watch_tui.rs): a `corral run` in the
//! background whose script and the test take turns through files in the project, and waits
//! for audit records. Every wait is bounded by a generous deadline and fails the test with
//! what was seen; none asserts how fast anything happened.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::jail_support::{Out, World, run};

/// How long a step may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Shell functions for the jail's script: `try NAME` prints the HTTP status of a request for
/// `/NAME` to the loopback origin on `port` through corral's proxy; `step N TEXT` publishes
/// TEXT as the project's file `stepN` (atomically); `wait_go N` waits for the test's file `goN`.
pub fn script_prelude(port: u16) -> String {
    format!(
        r#"
try() {{ curl -s --max-time 20 --noproxy '' -o /dev/null -w '%{{http_code}}' "http://127.0.0.1:{port}/$1"; }}
step() {{ printf '%s\n' "$2" > ".step$1.tmp" && mv ".step$1.tmp" "step$1"; }}
wait_go() {{ i=0; while [ ! -e "go$1" ]; do i=$((i+1)); if [ $i -gt 2400 ]; then echo "TIMEOUT go$1"; exit 3; fi; sleep 0.05; done; }}
"#
    )
}

/// The project's `corral.toml` of the tests: the proxy, loopback origins reachable by address
/// once a name pattern allows them, and comments that every edit must keep.
pub fn policy(extra_allow: &str) -> String {
    format!(
        "# corral.toml of the live-policy test: this comment stays\n\
         [network]\n\
         mode = \"proxy\"  # through corral's proxy\n\
         allow = [{extra_allow}]\n\
         # loopback origins of the test\n\
         allow_cidrs = [\"127.0.0.1/32\"]\n\
         [limits]\n\
         enforce = \"best-effort\"\n"
    )
}

/// A `corral run -- sh -c SCRIPT` going on in the background.
pub struct Background {
    thread: Option<std::thread::JoinHandle<Out>>,
}

impl Background {
    pub fn start(w: &World, script: &str) -> Background {
        let mut c = w.corral();
        c.args(["run", "--", "sh", "-c", script]);
        Background {
            thread: Some(std::thread::spawn(move || run(c))),
        }
    }

    /// Its output once it ended (the script must end with `echo END`).
    pub fn finish(mut self) -> Out {
        let out = self.thread.take().unwrap().join().expect("the run thread");
        assert!(
            out.stdout.contains("END"),
            "the jail did not reach its end: code {}\n{}",
            out.code,
            out.both()
        );
        out
    }
}

/// The content of `path` once it exists.
#[track_caller]
pub fn wait_file(path: &Path) -> String {
    let start = Instant::now();
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            return t;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{} did not appear within {DEADLINE:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Let the jail's script go on past `wait_go N`.
pub fn go(w: &World, n: u32) {
    std::fs::write(w.project.join(format!("go{n}")), "").unwrap();
}

/// The first audit record of a jail event `event` that `pred` holds for.
#[track_caller]
pub fn wait_record(
    w: &World,
    event: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let records = w.audit_records();
        if let Some(r) = records
            .iter()
            .find(|r| r["kind"] == "jail" && r["event"] == event && pred(r))
        {
            return r.clone();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no {event} record within {DEADLINE:?}; jail records:\n{}",
            records
                .iter()
                .filter(|r| r["kind"] == "jail")
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The summary of a jail event record.
pub fn summary(r: &serde_json::Value) -> String {
    r["detail"]["summary"].as_str().unwrap_or("").to_string()
}

/// `corral ARGS` in the world, which must succeed.
#[track_caller]
pub fn corral_ok(w: &World, args: &[&str]) -> Out {
    let mut c = w.corral();
    c.args(args);
    let out = run(c);
    assert_eq!(out.code, 0, "corral {args:?} failed:\n{}", out.both());
    out
}

/// The control socket of the running jail of the world's project (control.rs: the tests run
/// corral without XDG_RUNTIME_DIR, so under `$TMPDIR/corral-UID/jails`).
#[track_caller]
pub fn control_socket(w: &World) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir().join(format!("corral-{uid}/jails"));
    let start = Instant::now();
    loop {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json")
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(
                    &std::fs::read(&p).unwrap_or_default(),
                )
                && v["project"].as_str() == w.project.to_str()
            {
                return PathBuf::from(v["socket"].as_str().unwrap());
            }
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no running jail of {} registered in {}",
            w.project.display(),
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One request line to a control socket; its answer.
pub fn control(socket: &Path, line: &str) -> String {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(s).read_line(&mut answer).unwrap();
    answer.trim_end().to_string()
}
