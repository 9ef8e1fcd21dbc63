//! The native executor wiring: from inside an agent's jail, `corral exec` reaches the executor
//! `corral run` started outside, and the command runs in a second jail built from
//! `[executor.sandbox]`, not on the bare host. Runs as root and, through scripts/test-rootless,
//! as an unprivileged user.

mod jail_support;

use jail_support::*;

#[test]
fn exec_from_inside_the_jail_runs_in_the_executors_own_jail() {
    let w = World::new();
    let script = "echo agent-sees=$CORRAL_EXECUTOR; ls -A /run/corral/executor | tr '\\n' ' '; echo; \
         corral exec -- sh -c 'echo exec-home=$HOME; cat ~/.ssh/id_ed25519; \
           echo from-exec > exec-marker; ls -a ~; echo END-EXEC'; \
         echo exec-rc=$?; echo END";
    let out = w.sh("none", script);
    ran(&out, "END");
    assert!(out.stdout.contains("END-EXEC"), "{}", out.both());
    assert!(
        out.stdout
            .contains("agent-sees=unix:/run/corral/executor/exec.sock"),
        "{}",
        out.both()
    );
    assert!(
        out.stdout
            .contains(&format!("exec-home={}", w.home.display())),
        "{}",
        out.both()
    );
    // The agent sees the socket and the token, nothing else of the executor's state.
    assert!(
        out.stdout.contains("\nexec.sock token \n"),
        "{}",
        out.both()
    );
    // The secret stays unreadable in the executor's jail too: its home is a fresh tmpfs.
    assert!(
        !out.both().contains(SSH_SECRET),
        "the executor read the host's SSH key:\n{}",
        out.both()
    );
    assert!(
        out.stderr.contains(".ssh/id_ed25519: No such file"),
        "{}",
        out.both()
    );
    assert!(!out.stdout.lines().any(|l| l.trim() == ".ssh"));
    // The project is the same directory, read-write, in both jails.
    assert_eq!(
        std::fs::read_to_string(w.project.join("exec-marker")).unwrap(),
        "from-exec\n"
    );
    // `cat` failed, `echo END-EXEC` succeeded: the command's own status came back.
    assert!(out.stdout.contains("exec-rc=0"), "{}", out.both());
    // The command is in the audit log with its exit status.
    let recs = w.audit_records();
    let exec: Vec<_> = recs
        .iter()
        .filter(|r| r["kind"] == "exec" && r["phase"] != "start")
        .collect();
    assert_eq!(exec.len(), 1, "{recs:#?}");
    // Recorded before it ran, too.
    let started = recs
        .iter()
        .filter(|r| r["kind"] == "exec" && r["phase"] == "start" && r["command"][0] == "sh");
    assert_eq!(started.count(), 1, "{recs:#?}");
    assert_eq!(exec[0]["command"][0], "sh");
    assert_eq!(exec[0]["exit_code"], 0);
    assert_eq!(exec[0]["cwd"], w.project.display().to_string());
}

#[test]
fn exec_exit_codes_and_timeout_come_back_through_the_jails() {
    let w = World::new();
    let tag = 900_000 + std::process::id() % 90_000;
    let script = format!(
        "corral exec -- sh -c 'exit 7'; echo rc1=$?; \
         corral exec -- no-such-tool-xyz; echo rc2=$?; \
         corral exec --timeout 500ms -- sleep {tag}; echo rc3=$?; echo END"
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    for want in ["rc1=7", "rc2=127", "rc3=124"] {
        assert!(out.stdout.contains(want), "{want}:\n{}", out.both());
    }
    // Nothing of the timed-out command survives anywhere on the host.
    let left = std::process::Command::new("pgrep")
        .args(["-f", &format!("sleep {tag}")])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "left behind: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

/// The unjailed host executor (an explicit opt-in) still never hands out a real secret: the
/// gateway's values stay in corral alone, out of every executor's environment.
#[test]
fn the_host_executor_does_not_inherit_real_secrets() {
    let w = World::new();
    write(
        &w.project.join("corral.toml"),
        "[executor]\n\
         target = \"host\"\n\
         [secrets]\n\
         MY_KEY = { from_env = \"CALLER_REAL_KEY\", hosts = [\"api.example.com\"] }\n",
    );
    w.trust_project(&["--allow-host-executor"]);
    let mut c = w.corral();
    c.env("CALLER_REAL_KEY", "real-value-0123456789")
        .args([
            "run",
            "--network",
            "none",
            "--allow-host-executor",
            "--",
            "sh",
            "-c",
        ])
        .arg(
            "corral exec -- sh -c 'echo host-sees=[$CALLER_REAL_KEY][$MY_KEY]; echo END-EXEC'; \
             echo END",
        );
    let out = run(c);
    ran(&out, "END");
    assert!(out.stdout.contains("END-EXEC"), "{}", out.both());
    assert!(
        !out.both().contains("real-value-0123456789"),
        "the host executor handed out the real secret:\n{}",
        out.both()
    );
}

/// The pids of `pid`'s children whose command line is `corral serve ...`.
fn serve_children(pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for child in children_of(pid) {
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.get(1).map(String::as_str) == Some("serve") {
            found.push((child, args.join(" ")));
        }
    }
    found
}

/// Wait until `file` exists; fail (with corral's output) if corral ends first or a minute
/// passes.
fn wait_for(file: &std::path::Path, child: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !file.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!(
                "corral ended ({status}) before {} appeared: {err}",
                file.display()
            );
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} did not appear within a minute", file.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The executor's server is socket-activated: while the jail has not called it, no
/// `corral serve` runs; the first `corral exec` starts it (its connection waits in the socket's
/// backlog meanwhile), and it is gone when the run ends.
#[test]
fn the_executor_server_starts_on_first_use_only() {
    let w = World::new();
    let script = "echo > phase1; while [ ! -e go1 ]; do sleep 0.05; done; \
         corral exec -- sh -c 'echo from-exec'; echo exec-rc=$?; \
         echo > phase2; while [ ! -e go2 ]; do sleep 0.05; done; echo END";
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--", "sh", "-c", script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let pid = child.id();

    wait_for(&w.project.join("phase1"), &mut child);
    let before = serve_children(pid);
    write(&w.project.join("go1"), "");
    wait_for(&w.project.join("phase2"), &mut child);
    let during = serve_children(pid);
    write(&w.project.join("go2"), "");
    let out = child.wait_with_output().unwrap();
    let both = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(both.contains("END"), "{both}");
    assert!(both.contains("from-exec"), "{both}");
    assert!(both.contains("exec-rc=0"), "{both}");
    assert!(
        before.is_empty(),
        "a corral serve ran before anything called the executor: {before:?}"
    );
    assert_eq!(during.len(), 1, "{during:?}\n{both}");
    assert!(
        during[0].1.contains("--listen fd:"),
        "the server did not take corral's listener: {during:?}"
    );
    // corral waited for its server before exiting: it is gone (reaped, or a different process).
    let (server, _) = &during[0];
    let cmdline = std::fs::read(format!("/proc/{server}/cmdline")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("serve"),
        "the executor server outlived the run"
    );
    // Its audit record is there.
    let recs = w.audit_records();
    assert_eq!(
        recs.iter()
            .filter(|r| r["kind"] == "exec" && r["phase"] != "start")
            .count(),
        1,
        "{recs:#?}"
    );
}
