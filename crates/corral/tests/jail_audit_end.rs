//! Every tunnel and every refusal of a real `corral run` is in its audit log. corral starts
//! with 1,024 descriptors; processes in the jail open 1,500 CONNECT tunnels to an origin that
//! holds them and never closes, send bytes through each, and exit with them open. The
//! connections refused for want of a descriptor are counted in `refused` records, whose total
//! the run's `exit` record repeats; every tunnel served has exactly one close record, written
//! by the proxy's shutdown before the `exit` record, with the bytes sent through it.
//! Runs as root and, through scripts/test-rootless, as an unprivileged user.

mod jail_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use corral_audit::{AuditLog, Event, JailEvent, NetPhase};
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

#[test]
fn the_runs_tunnels_and_refusals_are_all_in_its_audit_log() {
    let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    // The origin accepts and holds: it never reads, answers or closes.
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
PROCS, EACH = 2, 750
def child(i):
    counts = {{"200": 0, "503": 0, "other": 0}}
    sent = 0
    held = []
    for k in range(EACH):
        s = socket.socket()
        s.settimeout(20)
        try:
            s.connect(("127.0.0.1", 3128))
            s.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
            head = s.recv(39)
        except OSError:
            counts["other"] += 1
            s.close()
            continue
        key = head[9:12].decode(errors="replace")
        if key == "200":
            n = 1 + (k * 7) % 500
            s.sendall(b"y" * n)
            sent += n
        counts[key if key in counts else "other"] += 1
        held.append(s)
    print("COUNTS", counts["200"], counts["503"], counts["other"], sent, flush=True)
    open(f"done-{{i}}", "w").close()
    for _ in range(1200):
        if all(os.path.exists(f"done-{{j}}") for j in range(PROCS)):
            break
        time.sleep(0.1)
    # Exit with every tunnel still open.
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
    let o = out.both();
    let (mut ok, mut refused, mut sent) = (0u64, 0u64, 0u64);
    for line in out.stdout.lines().filter(|l| l.starts_with("COUNTS ")) {
        let n: Vec<u64> = line[7..].split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(n[2], 0, "a connection failed otherwise: {line}\n{o}");
        ok += n[0];
        refused += n[1];
        sent += n[3];
    }
    eprintln!("{ok} tunnels served ({sent} bytes sent), {refused} refused");
    assert_eq!(ok + refused, 1500, "{o}");
    assert!(ok > 200 && refused > 500, "{ok} served, {refused} refused");

    let log = AuditLog::at(audit_log(&w).expect("no audit log"));
    let (records, bad) = log.read_all().unwrap();
    assert_eq!(bad, 0);
    let exit_at = records
        .iter()
        .position(|r| matches!(r.event, Event::Jail(JailEvent::Exit { .. })))
        .expect("no exit record");
    let Event::Jail(JailEvent::Exit {
        exit_code,
        refused: totals,
    }) = &records[exit_at].event
    else {
        unreachable!()
    };
    assert_eq!(*exit_code, 0, "{o}");
    let mut closes = Vec::new();
    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    let mut dial_refused = 0;
    for (i, r) in records.iter().enumerate() {
        let Event::Net(n) = &r.event else { continue };
        match n.phase {
            NetPhase::Close => {
                assert!(i < exit_at, "a close record after the exit record: {n:?}");
                closes.push(n.clone());
            }
            NetPhase::Refused => {
                assert!(i < exit_at, "a refused record after the exit record: {n:?}");
                *counted.entry(n.rule.clone()).or_insert(0) += n.count;
            }
            NetPhase::Decision if n.rule.contains("out of file descriptors") => dial_refused += 1,
            _ => {}
        }
    }
    // Every tunnel served: one close record, with the bytes the jail sent through it.
    assert_eq!(closes.len() as u64, ok, "close records for {ok} tunnels");
    assert_eq!(closes.iter().map(|c| c.bytes_up).sum::<u64>(), sent);
    // Control: each was still open when the run ended (the origin never closes), so without
    // the shutdown's records none of them would be in the log.
    for c in &closes {
        assert_eq!(c.rule, "closed by corral: the proxy shut down", "{c:?}");
    }
    // Every 503: counted, or (no descriptor for the destination) its own decision record.
    assert_eq!(
        &counted, totals,
        "the refused records and the exit record's totals"
    );
    let at_accept: u64 = counted.values().sum();
    assert_eq!(
        at_accept + dial_refused,
        refused,
        "{counted:?}, {dial_refused}"
    );
    // Control: the connections refused at accept have no decision record of their own.
    let decisions = records
        .iter()
        .filter(|r| matches!(&r.event, Event::Net(n) if n.phase == NetPhase::Decision))
        .count() as u64;
    assert_eq!(decisions, ok + dial_refused);
}

/// A connection to a `--publish`ed port still open when the run ends (the jail's server is
/// gone, the host's client still holds its end) gets its close record with its bytes, before
/// the run's `exit` record. Control: its record says the shutdown closed it (it was open).
#[test]
fn a_published_connection_open_at_the_end_is_recorded() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Stdio;
    let w = World::new();
    let server = r#"
import socket, os, sys, time
port = int(sys.argv[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(8)
print("READY", flush=True)
c, _ = l.accept()
data = c.recv(65536)
c.sendall(data)
for _ in range(600):
    if os.path.exists(".go"):
        break
    time.sleep(0.1)
print("END", flush=True)
os._exit(0)
"#;
    let mut attempt = 0;
    let (published, mut child) = loop {
        attempt += 1;
        let published = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut c = w.corral();
        c.args(["run", "--publish", &published.to_string(), "--"])
            .args(["python3", "-c", server, &published.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("run corral");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() > 0 && line.contains("READY") {
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            break (published, child);
        }
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let _ = child.wait();
        assert!(
            attempt < 3 && err.contains("already in use"),
            "the jail ended before its server was ready: {err}"
        );
    };
    let payload = vec![b'p'; 4321];
    let mut s = std::net::TcpStream::connect(("127.0.0.1", published)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&payload).unwrap();
    let mut back = vec![0u8; payload.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, payload);
    write(&w.project.join(".go"), "");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    drop(s);

    let log = AuditLog::at(audit_log(&w).expect("no audit log"));
    let (records, _) = log.read_all().unwrap();
    let exit_at = records
        .iter()
        .position(|r| matches!(r.event, Event::Jail(JailEvent::Exit { .. })))
        .expect("no exit record");
    let closes: Vec<(usize, &corral_audit::NetEvent)> = records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match &r.event {
            Event::Net(n) if n.phase == NetPhase::Close && n.method == "PUBLISH" => Some((i, n)),
            _ => None,
        })
        .collect();
    assert_eq!(closes.len(), 1, "{closes:?}\n{err}");
    let (at, c) = closes[0];
    assert!(at < exit_at, "the close record after the exit record");
    assert_eq!((c.bytes_up, c.bytes_down), (4321, 4321), "{c:?}");
    assert_eq!(c.rule, "closed by corral: the proxy shut down");
}
