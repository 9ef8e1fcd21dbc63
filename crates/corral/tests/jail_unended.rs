//! A run corral did not finish is finished later: corral is killed (SIGKILL) while its jail
//! runs, after the jail planted a repository whose config runs a command on the host's next
//! `git status`. The plant is still there (the control: nothing checked it), and the next
//! `corral doctor`, or the next run in the project, disarms it and says so, from the journal the
//! killed run wrote.

mod jail_support;

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;

use jail_support::*;

/// Start a run that plants a bare repository's config in `plain/` and sleeps; SIGKILL its
/// corral once planted; return when the jail is gone (its stdout closed), with the directory
/// of the run's executor, which its corral did not live to remove.
fn plant_and_kill(w: &World) -> std::path::PathBuf {
    w.allow_new_repositories();
    std::fs::create_dir_all(w.project.join("plain/deeper")).unwrap();
    let script = format!(
        "set -e; cd plain; mkdir objects refs; echo 'ref: refs/heads/main' > HEAD; \
         printf '[core]\\n\\tbare = true\\n\\tfsmonitor = touch {f}\\n' > config; \
         echo PLANTED; exec sleep 1000",
        f = w.outside.join("fsmonitor-ran").display()
    );
    let mut child = w
        .sh_command("none", &script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start corral");
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("PLANTED") {
                let _ = tx.send(());
            }
            line.clear();
        }
        // EOF: no process of the jail holds its stdout any more.
        let _ = tx.send(());
    });
    let deadline = std::time::Duration::from_secs(120);
    let planted = rx.recv_timeout(deadline).is_ok();
    child.kill().unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(planted, "the jail did not plant: {status}\n{err}");
    rx.recv_timeout(deadline)
        .expect("the jail outlived its corral");
    // Control: nothing checked the run, the plant is there and the host's git reads it.
    assert!(w.project.join("plain/config").exists(), "{err}");
    let got = w.host_git(
        &w.project.join("plain/deeper"),
        &["config", "core.fsmonitor"],
    );
    assert!(
        String::from_utf8_lossy(&got.stdout).contains("touch"),
        "control: git does not take the directory for a repository"
    );
    let records = w.audit_records();
    let jail = records
        .iter()
        .find(|r| r["kind"] == "jail" && r["event"] == "start")
        .and_then(|r| r["jail"].as_str())
        .unwrap_or_else(|| panic!("no start record: {records:#?}"));
    // Where the World's corral (no XDG_RUNTIME_DIR) makes it.
    let runtime = corral_session::runplan::runtime_dir(None, std::env::temp_dir());
    let executor = runtime.join(format!("corral-exec-{jail}"));
    assert!(executor.is_dir(), "control: no {}", executor.display());
    executor
}

/// The plant is gone, the host's git runs nothing, the audit log has the quarantine; the
/// killed run's executor directory is removed.
fn assert_disarmed(w: &World, out: &Out, executor: &std::path::Path) {
    assert!(
        !executor.exists(),
        "{} stays\n{}",
        executor.display(),
        out.both()
    );
    assert!(
        out.stderr.contains("ended without its checks"),
        "{}",
        out.both()
    );
    assert!(
        out.stderr.contains("plain/config") && out.stderr.contains("moved aside"),
        "{}",
        out.both()
    );
    assert!(!w.project.join("plain/config").exists(), "{}", out.both());
    let _ = w.host_git(&w.project.join("plain/deeper"), &["status"]);
    assert!(
        !w.outside.join("fsmonitor-ran").exists(),
        "git ran the jail's command"
    );
    assert!(
        w.audit_records().iter().any(|r| r["event"] == "quarantine"
            && r["detail"].as_str().unwrap_or("").contains("plain/config")),
        "no quarantine record"
    );
}

#[test]
fn doctor_finishes_a_run_whose_corral_was_killed() {
    let w = World::new();
    let executor = plant_and_kill(&w);
    let mut c = w.corral();
    c.arg("doctor");
    let out = run(c);
    assert_disarmed(&w, &out, &executor);
    // Done once: the next doctor has nothing left to finish.
    let mut c = w.corral();
    c.arg("doctor");
    let again = run(c);
    assert!(
        !again.stderr.contains("ended without its checks"),
        "{}",
        again.both()
    );
}

#[test]
fn the_next_run_finishes_a_run_whose_corral_was_killed_first() {
    let w = World::new();
    let executor = plant_and_kill(&w);
    let out = w.sh("none", "echo END");
    ran(&out, "END");
    assert_disarmed(&w, &out, &executor);
    // Before the new run's own lines.
    let checked = out.stderr.find("ended without its checks").unwrap();
    if let Some(first) = out.stderr.find("corral: first jailed run") {
        assert!(checked < first, "{}", out.stderr);
    }
}
