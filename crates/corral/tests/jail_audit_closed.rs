//! The executor fails closed on its audit log: a command whose start cannot be
//! recorded is refused with a clear error and never runs, and the records that could not be
//! written are counted in the end-of-run summary, for the executor `corral run` starts and for
//! a standalone `corral serve`. Runs as root and, through scripts/test-rootless, as an
//! unprivileged user (the log is made unwritable by replacing it with a directory, which needs
//! no privilege).

mod jail_support;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use corral_audit::WriteFailures;
use jail_support::*;

/// The project's audit log file, once it exists.
fn audit_log(w: &World) -> Option<PathBuf> {
    let dir = w.home.join(".local/state/corral");
    std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.path().join("audit.jsonl"))
        .find(|p| p.is_file())
}

/// The log made unwritable while its writers hold it open: moved away, a directory in its place.
fn break_log(log: &Path) {
    std::fs::rename(log, log.with_file_name("moved.jsonl")).unwrap();
    std::fs::create_dir(log).unwrap();
}

/// The failures the summary lines in `stderr` report.
fn reported_failures(stderr: &str) -> Vec<WriteFailures> {
    stderr
        .lines()
        .filter_map(WriteFailures::parse_summary_line)
        .collect()
}

/// From inside the jail, one executor command runs (the control: it creates its file); then the
/// audit log becomes unwritable and the same kind of command is refused: its file is never
/// created, the client says why and exits 125, and `corral run`'s summary counts the record the
/// executor's server could not write.
#[test]
fn an_executor_command_the_audit_log_cannot_record_is_refused_and_not_run() {
    let w = World::new();
    let script = r#"
corral exec -- touch before-file; echo "RC1=$?"
touch ready
i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
corral exec -- touch after-file; echo "RC2=$?"
echo END
"#;
    let c = w.sh_command("none", script);
    let run_thread = std::thread::spawn(move || run(c));
    let (ready, go) = (w.project.join("ready"), w.project.join("go"));
    for _ in 0..1200 {
        if ready.exists() || run_thread.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ready.exists(), "the jail never got to its first command");
    let log = audit_log(&w).expect("no audit log after the first command");
    break_log(&log);
    std::fs::write(&go, "").unwrap();
    let out = run_thread.join().unwrap();
    ran(&out, "END");
    let o = out.both();
    // The control: with the log writable, the command ran.
    assert!(out.stdout.contains("RC1=0"), "{o}");
    assert!(w.project.join("before-file").exists(), "{o}");
    // The attack: it did not run, and the client was told why.
    assert!(!w.project.join("after-file").exists(), "{o}");
    assert!(out.stdout.contains("RC2=125"), "{o}");
    assert!(
        out.stderr
            .contains("the audit log cannot record this command, so it was not run"),
        "{o}"
    );
    // The server's lost record is in the run's summary (corral's own records of this run all
    // came before the log broke, or after the summary).
    let failures = reported_failures(&out.stderr);
    assert_eq!(failures.len(), 1, "{o}");
    assert_eq!(failures[0].count, 1, "{o}");
    assert!(failures[0].reason.contains("directory"), "{o}");
    // The command that ran was recorded before it started, and when it ended.
    let moved = std::fs::read_to_string(log.with_file_name("moved.jsonl")).unwrap();
    let touch: Vec<serde_json::Value> = moved
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["kind"] == "exec" && r["command"][0] == "touch")
        .collect();
    assert_eq!(touch.len(), 2, "{moved}");
    assert_eq!(touch[0]["phase"], "start", "{moved}");
    assert_eq!(touch[1]["exit_code"], 0, "{moved}");
}

/// A child killed when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A standalone `corral serve`: the same refusal, and its own exit line counts the lost record.
#[test]
fn corral_serve_refuses_what_it_cannot_record_and_says_so_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let proj = std::fs::canonicalize(&proj).unwrap();
    let log = dir.path().join("audit.jsonl");
    let mut server = KillOnDrop(
        Command::new(corral_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--no-auth", "--root"])
            .arg(&proj)
            .arg("--audit-log")
            .arg(&log)
            .env("HOME", dir.path())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = BufReader::new(server.0.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let exec = |file: &str| {
        Command::new(corral_bin())
            .args(["exec", "--", "touch", file])
            .env("CORRAL_EXECUTOR", format!("http://{addr}"))
            .env("CORRAL_PROJECT_ROOT", &proj)
            .current_dir(&proj)
            .output()
            .unwrap()
    };
    let before = exec("before-file");
    assert!(before.status.success(), "{before:?}");
    assert!(proj.join("before-file").exists());
    break_log(&log);
    let after = exec("after-file");
    let after_err = String::from_utf8_lossy(&after.stderr);
    assert_eq!(after.status.code(), Some(125), "{after_err}");
    assert!(
        after_err.contains("the audit log cannot record this command, so it was not run"),
        "{after_err}"
    );
    assert!(!proj.join("after-file").exists());
    let pid = nix::unistd::Pid::from_raw(server.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    server.0.wait().unwrap();
    let stderr = rest.join().unwrap();
    let failures = reported_failures(&stderr);
    assert_eq!(failures.len(), 1, "{stderr}");
    assert_eq!(failures[0].count, 1, "{stderr}");
}
