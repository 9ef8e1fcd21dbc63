//! What an agent needs works in the jail: the project, /tmp, $HOME, git, python3, node, a TUI
//! under a pty with resizes; exit codes are the command's; the jail dies with corral.

mod jail_support;

use std::io::Write;
use std::process::Command;

use jail_support::*;

#[test]
fn reads_and_writes_the_project_tmp_and_home() {
    let w = World::new();
    let out = w.sh(
        "none",
        "cat README && echo made > made.txt && mkdir -p d/e && echo deep > d/e/f && \
         echo t > /tmp/t && cat /tmp/t && echo h > $HOME/h && cat $HOME/h && \
         test \"$(pwd)\" = \"$PWD\" && echo CWD:$(pwd) && echo END",
    );
    ran(&out, "END");
    assert!(
        out.stdout.contains("hello from the project"),
        "{}",
        out.both()
    );
    assert!(
        out.stdout.contains(&format!("CWD:{}", w.project.display())),
        "{}",
        out.stdout
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("made.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("d/e/f")).unwrap(),
        "deep\n"
    );
    // /tmp and $HOME are private: nothing reaches the host's.
    assert!(
        !w.home.join("h").exists(),
        "the jail's $HOME write reached the host home"
    );
}

#[test]
fn runs_git_python_and_node() {
    let w = World::new();
    let out = w.sh(
        "none",
        "git status --short >/dev/null && echo GIT-OK; \
         git -c user.email=a@example.invalid -c user.name=a commit -q --allow-empty -m jailed && echo COMMIT-OK; \
         python3 -c 'print(\"PY-\" + \"OK\")'; \
         node -e 'console.log(\"NODE-\" + \"OK\")'; \
         echo END",
    );
    ran(&out, "END");
    for marker in ["GIT-OK", "COMMIT-OK", "PY-OK"] {
        assert!(
            out.stdout.contains(marker),
            "{marker} missing:\n{}",
            out.both()
        );
    }
    assert!(
        out.stdout.contains("NODE-OK"),
        "node failed (install nodejs):\n{}",
        out.both()
    );
    let log = Command::new("git")
        .args(["log", "--format=%s"])
        .current_dir(&w.project)
        .env("HOME", &w.home)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&log.stdout).trim(), "jailed");
}

#[test]
fn exit_codes_are_the_commands_own() {
    let w = World::new();
    let cases: [(&[&str], i32); 5] = [
        (&["true"], 0),
        (&["sh", "-c", "exit 3"], 3),
        (&["/etc/passwd"], 126),
        (&["no-such-command-here"], 127),
        (&["sh", "-c", "kill -9 $$"], 137),
    ];
    for (cmd, want) in cases {
        let mut c = w.corral();
        c.args(["run", "--network", "none", "--"]).args(cmd);
        let out = run(c);
        assert_eq!(out.code, want, "{cmd:?}:\n{}", out.both());
    }
}

#[test]
fn a_tui_gets_a_pty_and_resizes() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "python3",
        "-c",
        r#"
import os, signal, sys, time
got = []
signal.signal(signal.SIGWINCH, lambda *a: got.append(1))
sz = os.get_terminal_size(0)
print("TTY", os.isatty(0), "SIZE", sz.lines, sz.columns, flush=True)
print("READY", flush=True)
deadline = time.time() + 20
while not got and time.time() < deadline:
    time.sleep(0.05)
sz = os.get_terminal_size(0)
print("AFTER", bool(got), sz.lines, sz.columns, flush=True)
"#,
    ]);
    let (mut master, _slave, mut child) = under_pty(c, 24, 80);
    let first = read_until(&mut master, "READY", &mut child);
    assert!(first.contains("TTY True SIZE 24 80"), "{first}");
    let ws = nix::pty::Winsize {
        ws_row: 50,
        ws_col: 132,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    use std::os::fd::AsRawFd;
    // SAFETY: TIOCSWINSZ reads one winsize struct, which we provide.
    unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    let rest = read_until(&mut master, "AFTER", &mut child);
    let rest = rest + &read_until(&mut master, "\n", &mut child);
    let _ = master.write_all(b"");
    let status = child.wait().unwrap();
    assert!(
        rest.contains("AFTER True 50 132"),
        "no resize delivered: {status:?}\n{first}{rest}"
    );
    assert_eq!(status.code(), Some(0));
}

#[test]
fn killing_corral_leaves_no_process_behind() {
    let w = World::new();
    let marker = format!("corral-orphan-marker-{}", std::process::id());
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        &format!("sleep 300 & sleep 301; : {marker}"),
    ])
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while processes_with(&marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the jail never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL: corral gets no chance to clean up
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = processes_with(&marker);
        let sleeps = descendants_gone(child.id());
        if left.is_empty() && sleeps {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "processes outlived corral: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Pids whose command line contains `needle` (as seen from the host).
fn processes_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&cmd).contains(needle)
        {
            out.push(pid);
        }
    }
    out
}

/// No process has `pid` as its parent any more (the set-up process is gone too).
fn descendants_gone(pid: u32) -> bool {
    children_of(pid).is_empty()
}

#[test]
fn the_audit_log_records_start_and_exit() {
    let w = World::new();
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--", "sh", "-c", "exit 7"]);
    let out = run(c);
    assert_eq!(out.code, 7, "{}", out.both());
    let lines = w.audit_records();
    let jail: Vec<_> = lines.iter().filter(|v| v["kind"] == "jail").collect();
    let start = jail
        .iter()
        .find(|v| v["event"] == "start")
        .expect("no start record");
    let exit = jail
        .iter()
        .find(|v| v["event"] == "exit")
        .expect("no exit record");
    assert_eq!(start["jail"], exit["jail"]);
    assert_eq!(exit["exit_code"], 7);
    assert_eq!(
        start["detail"]["project"]["root"],
        serde_json::Value::String(w.project.display().to_string()),
        "the start record carries the plan"
    );
}

#[test]
fn scratch_runs_in_a_temporary_directory_removed_afterwards() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--scratch",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "echo x > made && pwd && ls -A",
    ]);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());
    let dir = out.stdout.lines().next().unwrap().to_string();
    assert_ne!(dir, w.project.display().to_string());
    assert!(
        !out.stdout.contains("README"),
        "the project is visible: {}",
        out.stdout
    );
    assert!(!std::path::Path::new(&dir).exists(), "{dir} left behind");
    assert!(!w.project.join("made").exists());
}

#[test]
fn ctrl_c_reaches_the_tui_and_the_terminal_is_restored() {
    use nix::sys::termios::{LocalFlags, tcgetattr};
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "python3",
        "-c",
        "import time\ntry:\n    print('READY', flush=True)\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('GOT-SIGINT', flush=True)\n",
    ]);
    let (mut master, slave, mut child) = under_pty(c, 24, 80);
    let before = tcgetattr(&slave).unwrap();
    assert!(before.local_flags.contains(LocalFlags::ICANON));
    let first = read_until(&mut master, "READY", &mut child);
    assert!(first.contains("READY"), "{first}");
    // While the jail runs, the outer terminal is raw: ^C is a byte for the jail's own pty.
    let during = tcgetattr(&slave).unwrap();
    assert!(
        !during.local_flags.contains(LocalFlags::ICANON),
        "not in raw mode"
    );
    master.write_all(b"\x03").unwrap();
    let rest = read_until(&mut master, "GOT-SIGINT", &mut child);
    let status = child.wait().unwrap();
    assert!(rest.contains("GOT-SIGINT"), "{status:?}: {rest}");
    assert_eq!(status.code(), Some(0));
    let after = tcgetattr(&slave).unwrap();
    assert_eq!(
        after.local_flags, before.local_flags,
        "terminal not restored"
    );
}

/// In the jail: which of 0, 1, 2 are terminals, whether it has a controlling terminal, and
/// each descriptor's device (to compare with the test's own terminal).
const WHICH_ENDS: &str = r#"
import os, sys
print("ISATTY", [os.isatty(fd) for fd in (0, 1, 2)], file=sys.stderr)
try:
    os.open("/dev/tty", os.O_RDWR)
    print("CTTY-OPEN", file=sys.stderr)
except OSError as e:
    print("no ctty:", e.strerror, file=sys.stderr)
for fd in (0, 1, 2):
    st = os.fstat(fd)
    print("FD %d DEV %d RDEV %d" % (fd, st.st_dev, st.st_rdev), file=sys.stderr)
print("END", file=sys.stderr, flush=True)
"#;

/// No descriptor the jail listed (`WHICH_ENDS`) is the test's terminal `ours`.
fn none_is(out: &str, ours: &std::fs::File) {
    use std::os::unix::fs::MetadataExt;
    let ours = ours.metadata().unwrap();
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("FD ")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    for line in lines {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        assert!(
            !(f[1] == ours.dev() && f[2] == ours.rdev()),
            "the jail holds corral's own terminal: {line}"
        );
    }
}

#[test]
fn without_any_terminal_the_jail_gets_no_terminal_at_all() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "python3",
        "-c",
        WHICH_ENDS,
    ])
    .stdin(std::process::Stdio::null());
    let out = run(c);
    assert!(out.stderr.contains("END"), "{}", out.both());
    assert!(
        out.stderr.contains("ISATTY [False, False, False]"),
        "{}",
        out.both()
    );
    assert!(!out.stderr.contains("CTTY-OPEN"), "{}", out.both());
}

#[test]
fn stdout_and_stderr_at_a_terminal_are_the_jails_pty_and_stdin_stays_a_pipe() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "python3",
        "-c",
        WHICH_ENDS,
    ])
    .stdin(std::process::Stdio::null());
    // stdout and stderr are a terminal of the test's; stdin is not.
    let pty = open_pty(24, 80);
    let slave = std::fs::File::from(pty.slave);
    c.stdout(std::process::Stdio::from(slave.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(slave.try_clone().unwrap()));
    let mut child = c.spawn().unwrap();
    let mut master = std::fs::File::from(pty.master);
    let out = read_until(&mut master, "END", &mut child);
    assert_eq!(child.wait().unwrap().code(), Some(0), "{out}");
    assert!(out.contains("ISATTY [False, True, True]"), "{out}");
    // The terminal it has is its own pty.
    assert!(out.contains("CTTY-OPEN"), "{out}");
    none_is(&out, &slave);
}

/// corral under the test's terminal as its stdin and stderr (and controlling terminal), its
/// stdout `stdout`.
fn at_a_terminal_with_stdout(
    mut c: Command,
    stdout: std::process::Stdio,
) -> (std::fs::File, std::fs::File, std::process::Child) {
    let pty = open_pty(24, 80);
    let slave = std::fs::File::from(pty.slave);
    c.stdin(std::process::Stdio::from(slave.try_clone().unwrap()))
        .stdout(stdout)
        .stderr(std::process::Stdio::from(slave.try_clone().unwrap()));
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid and TIOCSCTTY on fd 0 are async-signal-safe syscalls.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = c.spawn().unwrap();
    (std::fs::File::from(pty.master), slave, child)
}

#[test]
fn a_terminal_on_stdin_with_stdout_in_a_file_is_a_terminal_inside() {
    let w = World::new();
    let file = w.root.join("out.txt");
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "test -t 0 && echo in-tty; test -t 1 || echo out-not-tty; test -t 2 && echo err-tty >&2; \
         read line; echo GOT:$line; echo READ-DONE >&2",
    ]);
    let (mut master, _slave, mut child) =
        at_a_terminal_with_stdout(c, std::fs::File::create(&file).unwrap().into());
    master.write_all(b"typed-at-the-terminal\n").unwrap();
    let seen = read_until(&mut master, "READ-DONE", &mut child);
    assert_eq!(child.wait().unwrap().code(), Some(0), "{seen}");
    let out = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        out, "in-tty\nout-not-tty\nGOT:typed-at-the-terminal\n",
        "the file (no pty line endings in it); the terminal showed:\n{seen}"
    );
    // stderr and the echo of what was typed are on the terminal, from the jail's pty.
    assert!(seen.contains("err-tty\r\n"), "{seen}");
    assert!(seen.contains("typed-at-the-terminal"), "{seen}");
}

#[test]
fn a_terminal_on_stdin_is_the_jails_own_pty_not_the_users() {
    let w = World::new();
    let mut c = w.corral();
    let script = format!(
        "{WHICH_ENDS}\n{}",
        r#"
import fcntl, termios
for fd in (0, 2, os.open("/dev/tty", os.O_RDWR)):
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"X")
        print("TIOCSTI-OK fd", fd, file=sys.stderr)
    except OSError:
        pass
print("DONE", file=sys.stderr, flush=True)
"#
    );
    c.args(["run", "--network", "none", "--", "python3", "-c", &script]);
    let (mut master, slave, mut child) = at_a_terminal_with_stdout(c, std::process::Stdio::piped());
    let out = read_until(&mut master, "DONE", &mut child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("ISATTY [True, False, True]"), "{out}");
    assert!(out.contains("CTTY-OPEN"), "{out}");
    none_is(&out, &slave);
    assert!(
        !out.contains("TIOCSTI-OK"),
        "TIOCSTI is allowed in the jail:\n{out}"
    );
    // Nothing is queued on the terminal corral was started from.
    let mut pending: libc::c_int = 0;
    use std::os::fd::AsRawFd;
    // SAFETY: FIONREAD writes one int, which we provide.
    unsafe { libc::ioctl(slave.as_raw_fd(), libc::FIONREAD, &mut pending) };
    assert_eq!(pending, 0, "bytes were injected into the outer terminal");
}

#[test]
fn sigterm_to_corral_reaches_the_command() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "trap 'echo GOT-TERM; exit 5' TERM; echo READY; sleep 60 & wait",
    ])
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("READY") {
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0, "the jail ended before READY");
        seen.extend_from_slice(&buf[..n]);
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    std::io::Read::read_to_end(&mut stdout, &mut seen).unwrap();
    let status = child.wait().unwrap();
    assert!(
        String::from_utf8_lossy(&seen).contains("GOT-TERM"),
        "{seen:?}"
    );
    assert_eq!(status.code(), Some(5));
}

#[test]
fn pid_one_reaps_orphans() {
    let w = World::new();
    let out = w.sh(
        "none",
        "( sleep 0.2 & ) ; sleep 1; \
         for s in /proc/[0-9]*/stat; do read -r line < $s 2>/dev/null && echo \"$line\"; done; echo END",
    );
    ran(&out, "END");
    let zombies: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| {
            l.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .collect();
    assert!(zombies.is_empty(), "zombies in the jail: {zombies:?}");
    assert!(
        out.stdout.lines().any(|l| l.starts_with("1 (")),
        "no PID 1 in the jail's /proc"
    );
}

#[test]
fn corral_shell_is_interactive_with_job_control() {
    let w = World::new();
    let mut c = w.corral();
    c.args(["shell", "--network", "none"]).env("TERM", "dumb");
    let (mut master, _slave, mut child) = under_pty(c, 24, 80);
    master.write_all(b"echo ANSWER-$((6*7))\n").unwrap();
    let out = read_until(&mut master, "ANSWER-42", &mut child);
    assert!(out.contains("ANSWER-42"), "{out}");
    // ^Z stops the foreground job inside the jail; the jail's shell takes over again.
    master.write_all(b"sleep 30\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    master.write_all(b"\x1a").unwrap();
    let out = read_until(&mut master, "Stopped", &mut child);
    assert!(out.contains("Stopped"), "no job control: {out}");
    // SIGKILL reaches the stopped job asynchronously: until bash has collected it, it lists it
    // as stopped, and `exit` then only says "There are stopped jobs." and keeps running.
    master
        .write_all(
            b"kill -9 %1; n=0; while [ -n \"$(jobs -s)\" ] && [ $n -lt 200 ]; do \
              sleep 0.05; n=$((n+1)); done; jobs; echo BACK-$((1+1))\n",
        )
        .unwrap();
    let out = read_until(&mut master, "BACK-2", &mut child);
    assert!(out.contains("BACK-2"), "{out}");
    master.write_all(b"exit 4\n").unwrap();
    let out = read_until(&mut master, "\u{0}never", &mut child);
    // The terminal closes a moment before corral exits: wait for it, but not forever.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the jailed shell did not exit on `exit 4`:\n{out}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(4), "{out}");
}

#[test]
fn ro_and_rw_flags_bind_host_paths() {
    let w = World::new();
    let ro = w.outside.join("ro-dir");
    let rw = w.outside.join("rw-dir");
    write(&ro.join("data.txt"), "READ-ONLY-DATA");
    write(&rw.join("data.txt"), "READ-WRITE-DATA");
    let mut c = w.corral();
    c.args(["run", "--network", "none"])
        .arg("--ro")
        .arg(&ro)
        .arg("--rw")
        .arg(&rw)
        .args([
            "--",
            "sh",
            "-c",
            &format!(
                "cat {ro}/data.txt; echo; cat {rw}/data.txt; echo; \
                 echo x > {ro}/new 2>/dev/null && echo WROTE-RO; \
                 echo written > {rw}/new && echo WROTE-RW; \
                 cat {outside}/secret.txt 2>/dev/null; echo END",
                ro = ro.display(),
                rw = rw.display(),
                outside = w.outside.display()
            ),
        ]);
    let out = run(c);
    ran(&out, "END");
    assert!(out.stdout.contains("READ-ONLY-DATA"), "{}", out.both());
    assert!(out.stdout.contains("READ-WRITE-DATA"), "{}", out.both());
    assert!(!out.stdout.contains("WROTE-RO"), "{}", out.both());
    assert!(out.stdout.contains("WROTE-RW"), "{}", out.both());
    // Binding two directories of `outside` shows those two, not their parent's other files.
    assert!(!out.stdout.contains(OUTSIDE_SECRET), "{}", out.both());
    assert!(!ro.join("new").exists());
    assert_eq!(
        std::fs::read_to_string(rw.join("new")).unwrap(),
        "written\n"
    );
}
