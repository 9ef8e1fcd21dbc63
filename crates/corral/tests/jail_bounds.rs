//! Bounds of corral's own resources seen from a real jail: the jail's command keeps
//! the caller's open-file limit though corral raises its own, and a request the audit log
//! cannot record is refused, with the count in the end-of-run summary.

mod jail_support;

use std::path::PathBuf;
use std::time::Duration;

use jail_support::*;

fn nofile() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct, which we provide.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (lim.rlim_cur, lim.rlim_max)
}

/// corral is started with a soft limit of 1,024 under a higher hard limit: it raises its own
/// (for the proxy's tunnels), and the jail's command still gets 1,024 (select()-based programs
/// break above it), with the hard limit unchanged; so do the executor's commands.
#[test]
fn the_jails_command_keeps_the_callers_open_file_limit() {
    let (_, hard) = nofile();
    if hard <= 1024 {
        eprintln!("skipping: the hard open-file limit here is {hard}, nothing to raise");
        return;
    }
    let w = World::new();
    let mut c = w.sh_command(
        "proxy",
        "echo SOFT=$(ulimit -Sn) HARD=$(ulimit -Hn); \
         corral exec -- sh -c 'echo EXEC-SOFT=$(ulimit -Sn)'; echo END",
    );
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and allocates nothing.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = run(c);
    ran(&out, "END");
    assert!(
        out.stdout.contains(&format!("SOFT=1024 HARD={hard}")),
        "{}",
        out.both()
    );
    // The executor (started by corral, outside the jail) and its commands get it back too.
    assert!(out.stdout.contains("EXEC-SOFT=1024"), "{}", out.both());
}

/// The project's audit log file, once it exists.
fn audit_log(w: &World) -> Option<PathBuf> {
    let dir = w.home.join(".local/state/corral");
    std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.path().join("audit.jsonl"))
        .find(|p| p.is_file())
}

/// Mid-run the audit log becomes unwritable (replaced by a directory): the jail's next allowed
/// request is refused with 503 and never reaches the origin, where the same request before was
/// served; the end-of-run summary says how many records were lost.
#[test]
fn a_request_the_audit_log_cannot_record_is_refused() {
    let w = World::new();
    let port = origin();
    let policy = w.outside.join("net.toml");
    write(
        &policy,
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"127.0.0.1:{port}\"]\nallow_cidrs = [\"127.0.0.1/32\"]\n\
             [limits]\nenforce = \"best-effort\"\n"
        ),
    );
    let script = format!(
        r#"
get() {{ curl -s --max-time 10 --noproxy '' -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/$1; }}
echo "BEFORE $(get before)"
touch ready
i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo "AFTER $(get after)"
echo END
"#
    );
    let mut c = w.corral();
    c.arg("run")
        .arg("--policy")
        .arg(&policy)
        .args(["--", "sh", "-c", &script]);
    let run_thread = std::thread::spawn(move || run(c));
    let (ready, go) = (w.project.join("ready"), w.project.join("go"));
    for _ in 0..1200 {
        if ready.exists() || run_thread.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ready.exists(), "the jail never got to its first request");
    let log = audit_log(&w).expect("no audit log after the first request");
    std::fs::rename(&log, log.with_file_name("moved.jsonl")).unwrap();
    std::fs::create_dir(&log).unwrap();
    std::fs::write(&go, "").unwrap();
    let out = run_thread.join().unwrap();
    ran(&out, "END");
    let o = out.both();
    assert!(out.stdout.contains("BEFORE 200"), "{o}");
    assert!(out.stdout.contains("AFTER 503"), "{o}");
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("audit record(s) could not be written")
                && l.contains("could not be recorded before it ran was refused")),
        "{o}"
    );
    // The origin answers every request 200: the 503 is the proxy's refusal.
}

/// corral run with a soft and hard open-file limit of 1,024, and 3,000 CONNECT tunnels opened
/// from inside the jail (four processes, each under the jail's own 1,024): every one is
/// answered, 200 or 503, none hangs; corral's stderr has a line or two about it and the
/// end-of-run total, not one line per refusal.
#[test]
fn out_of_descriptors_the_jails_tunnels_get_503_not_a_hang() {
    let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    // The origin only accepts and holds: a tunnel needs nothing more.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in origin.incoming() {
            match s {
                Ok(s) => held.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    let w = World::new();
    let policy = w.outside.join("net.toml");
    write(
        &policy,
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"127.0.0.1:{port}\"]\nallow_cidrs = [\"127.0.0.1/32\"]\n\
             [limits]\nenforce = \"best-effort\"\n"
        ),
    );
    let script = format!(
        r#"
python3 - <<'PY'
import os, socket, time
PROCS, EACH = 4, 750
def child(i):
    counts = {{"200": 0, "503": 0, "hang": 0, "error": 0}}
    held = []
    for _ in range(EACH):
        s = socket.socket()
        s.settimeout(20)
        try:
            s.connect(("127.0.0.1", 3128))
            s.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
            head = s.recv(12)
        except socket.timeout:
            counts["hang"] += 1
            s.close()
            continue
        except OSError:
            counts["error"] += 1
            s.close()
            continue
        key = head[9:12].decode(errors="replace")
        counts[key] = counts.get(key, 0) + 1
        held.append(s)
    print("COUNTS", counts["200"], counts["503"], counts["hang"], counts["error"], flush=True)
    open(f"done-{{i}}", "w").close()
    # Hold the tunnels until every process is done, so the limit stays reached.
    for _ in range(1200):
        if all(os.path.exists(f"done-{{j}}") for j in range(PROCS)):
            break
        time.sleep(0.1)
    os._exit(0)
pids = []
for i in range(PROCS):
    pid = os.fork()
    if pid == 0:
        child(i)
    pids.append(pid)
for p in pids:
    os.waitpid(p, 0)
PY
echo END
"#
    );
    let mut c = w.corral();
    c.arg("run")
        .arg("--policy")
        .arg(&policy)
        .args(["--", "sh", "-c", &script]);
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and allocates nothing.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: 1024,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = run(c);
    ran(&out, "END");
    let (mut ok, mut refused) = (0, 0);
    for line in out.stdout.lines().filter(|l| l.starts_with("COUNTS ")) {
        let n: Vec<usize> = line[7..].split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(
            (n[2], n[3]),
            (0, 0),
            "hung or failed: {line}\n{}",
            out.both()
        );
        ok += n[0];
        refused += n[1];
    }
    eprintln!(
        "{ok} tunnels served, {refused} refused; corral said:\n{}",
        out.stderr
    );
    assert_eq!(ok + refused, 3000, "{}", out.both());
    assert!(ok > 200 && refused > 1000, "{ok} served, {refused} refused");
    let noisy: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("file descriptors"))
        .collect();
    assert!(
        !noisy.is_empty() && noisy.len() <= 6,
        "{} stderr lines about descriptors:\n{}",
        noisy.len(),
        out.stderr
    );
    assert!(
        noisy.iter().any(|l| l.contains("refused in the last 10 s")),
        "no line while it happened:\n{}",
        out.stderr
    );
    assert!(
        noisy
            .iter()
            .any(|l| l.contains("connection(s) refused: corral was out of file descriptors")),
        "no total at the end:\n{}",
        out.stderr
    );
}
