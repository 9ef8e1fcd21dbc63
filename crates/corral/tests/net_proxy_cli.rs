//! `corral proxy` and `corral log` as a user runs them: a standalone proxy with a policy file,
//! reloads on file change (a bad file keeps the old rules), and the log read back as a table,
//! as JSON, filtered to denials, and followed across rotation.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corral_audit::{AuditLog, Decision, Event, NetEvent, NetPhase, Record};

fn corral_bin() -> PathBuf {
    std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")))
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

struct World {
    root: PathBuf,
    project: PathBuf,
    state: PathBuf,
}

impl World {
    fn new() -> World {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!("corral-net-cli-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let project = root.join("proj");
        std::fs::create_dir_all(project.join(".git")).unwrap();
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        World {
            root,
            project,
            state,
        }
    }

    fn corral(&self, args: &[&str]) -> Command {
        let mut c = Command::new(corral_bin());
        c.args(args)
            .current_dir(&self.project)
            .env("XDG_STATE_HOME", &self.state)
            .env("HOME", &self.root)
            .env_remove("CORRAL_AUDIT_LOG")
            .env_remove("NO_COLOR");
        c
    }

    fn write_policy(&self, text: &str) {
        // Write then rename, as editors and corral's engine do; bump the mtime past the last one.
        std::thread::sleep(Duration::from_millis(20));
        let tmp = self.project.join(".corral.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.project.join("corral.toml")).unwrap();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn spawn(mut cmd: Command, stderr: bool) -> Running {
        cmd.stdin(Stdio::null());
        if stderr {
            cmd.stderr(Stdio::piped()).stdout(Stdio::null());
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        }
        let mut child = cmd.spawn().expect("spawn corral");
        let out: Box<dyn Read + Send> = if stderr {
            Box::new(child.stderr.take().unwrap())
        } else {
            Box::new(child.stdout.take().unwrap())
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running { child, lines: rx }
    }

    /// The first line containing `needle`, within 10 s.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(_) => panic!("no line containing {needle:?} within 10 s"),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A one-shot HTTP origin on loopback answering `hello`.
fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut tmp) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                );
            });
        }
    });
    addr
}

fn get(proxy: SocketAddr, url: &str) -> String {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET {url} HTTP/1.1\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn start_proxy(w: &World) -> (Running, SocketAddr, PathBuf) {
    let p = Running::spawn(w.corral(&["proxy", "--listen", "127.0.0.1:0"]), true);
    let line = p.wait_for("audit log ");
    let log = PathBuf::from(line.rsplit(' ').next().unwrap());
    let line = p.wait_for("listening on ");
    let addr: SocketAddr = line.rsplit(' ').next().unwrap().parse().unwrap();
    (p, addr, log)
}

#[test]
fn proxy_cli_serves_reloads_and_keeps_old_rules_on_a_bad_file() {
    let w = World::new();
    let o = origin();
    let port = o.port();
    w.write_policy(&format!(
        "[network]\nallow = [\"localhost:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n"
    ));
    let (proxy, addr, _) = start_proxy(&w);
    let url = format!("http://localhost:{port}/x");
    let r = get(addr, &url);
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("hello"), "{r}");
    // Remove the rule: the next request is denied without a restart.
    w.write_policy("[network]\nallow = []\nallow_cidrs = [\"127.0.0.0/8\"]\n");
    proxy.wait_for("reloaded");
    let r = get(addr, &url);
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    assert!(
        r.contains(&format!("corral run --allow localhost:{port}")),
        "{r}"
    );
    // A file that does not validate keeps the previous (denying) rules.
    w.write_policy(&format!(
        "[network]\nallow = [\"localhost:{port}\"]\nalow = 1\n"
    ));
    let l = proxy.wait_for("keeping the previous rules");
    assert!(l.contains("corral.toml:3:1"), "{l}");
    assert!(get(addr, &url).starts_with("HTTP/1.1 403"));
    // Without allow_cidrs the loopback origin is refused even when the name is allowed.
    w.write_policy(&format!("[network]\nallow = [\"localhost:{port}\"]\n"));
    proxy.wait_for("reloaded");
    let r = get(addr, &url);
    assert!(
        r.starts_with("HTTP/1.1 403") && r.contains("(loopback)"),
        "{r}"
    );

    // The log, as a table and as JSON.
    let out = w.corral(&["log"]).output().unwrap();
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("TIME"), "{table}");
    assert!(
        rows.iter()
            .any(|r| r.contains(" allow ") && r.contains(&format!("GET localhost:{port}"))),
        "{table}"
    );
    assert!(
        rows.iter().any(|r| r.contains("policy-reload-failed")),
        "{table}"
    );
    assert!(
        !table.contains('\x1b'),
        "no colour when stdout is not a terminal"
    );
    let out = w.corral(&["log", "--blocked", "--json"]).output().unwrap();
    let lines: Vec<Record> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(Record::is_blocked));
}

/// `corral proxy` started from `bin`, serving `w`'s policy: its process, and the address it
/// listens on once it says so.
fn proxy_from(w: &World, bin: &Path) -> (Running, SocketAddr) {
    let c = w.corral(&["proxy", "--listen", "127.0.0.1:0"]);
    let mut cmd = Command::new(bin);
    cmd.args(c.get_args()).current_dir(&w.project);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let p = Running::spawn(cmd, true);
    let line = p.wait_for("listening on ");
    let addr: SocketAddr = line.rsplit(' ').next().unwrap().parse().unwrap();
    (p, addr)
}

fn exe_of(p: &Running) -> PathBuf {
    std::fs::read_link(format!("/proc/{}/exe", p.child.id())).unwrap()
}

#[test]
fn corral_proxy_runs_the_lean_executable_next_to_it_and_works_without_it() {
    let w = World::new();
    let o = origin();
    let port = o.port();
    w.write_policy(&format!(
        "[network]\nallow = [\"localhost:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n"
    ));
    let url = format!("http://localhost:{port}/x");
    // Cargo builds corral-proxy next to corral: `corral proxy` executes it (same pid).
    let corral = PathBuf::from(env!("CARGO_BIN_EXE_corral"));
    let lean = PathBuf::from(env!("CARGO_BIN_EXE_corral-proxy"));
    assert_eq!(
        corral.parent(),
        lean.parent(),
        "cargo puts both binaries in one directory"
    );
    let (p, addr) = proxy_from(&w, &corral);
    assert_eq!(
        exe_of(&p).canonicalize().unwrap(),
        lean.canonicalize().unwrap(),
        "the listening process runs corral-proxy"
    );
    let r = get(addr, &url);
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("hello"), "{r}");
    drop(p);

    // A corral with no corral-proxy beside it runs the same proxy in its own process.
    let dir = w.root.join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let alone = dir.join("corral");
    if std::fs::hard_link(&corral, &alone).is_err() {
        // Copied by a child process: a write descriptor open in this (multi-threaded) test
        // process could leak into another test's fork and make the exec fail with ETXTBSY.
        let st = Command::new("cp")
            .arg(&corral)
            .arg(&alone)
            .status()
            .unwrap();
        assert!(st.success(), "cp {} {}", corral.display(), alone.display());
    }
    let (p, addr) = proxy_from(&w, &alone);
    assert_eq!(
        exe_of(&p).canonicalize().unwrap(),
        alone.canonicalize().unwrap(),
        "the listening process is corral itself"
    );
    let r = get(addr, &url);
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("hello"), "{r}");
    // Both wrote their decisions to the project's audit log.
    let out = w.corral(&["log", "--json"]).output().unwrap();
    let allowed = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"decision\":\"allow\""))
        .count();
    assert_eq!(allowed, 2, "one allowed request per proxy");
}

#[test]
fn log_follow_prints_new_denials_and_survives_rotation() {
    let w = World::new();
    w.write_policy("[network]\nallow = []\n");
    let follow = Running::spawn(w.corral(&["log", "--follow", "--blocked"]), false);
    std::thread::sleep(Duration::from_millis(300));
    let (_proxy, addr, log_path) = start_proxy(&w);
    get(addr, "http://denied.example/");
    let row = follow.wait_for("denied.example");
    assert!(
        row.contains("deny") && row.contains("not in network.allow"),
        "{row}"
    );
    // Rotate the way the writer does (rename to .1, new file), then write to the new file.
    rotate_and_write(&log_path, "after-rotation.example");
    follow.wait_for("after-rotation.example");
}

fn rotate_and_write(path: &Path, host: &str) {
    let mut rotated = path.as_os_str().to_owned();
    rotated.push(".1");
    std::fs::rename(path, &rotated).unwrap();
    let log = AuditLog::at(path);
    log.write(&Record::now(
        "test",
        Event::Net(NetEvent {
            phase: NetPhase::Decision,
            client: "t".into(),
            method: "CONNECT".into(),
            host: host.into(),
            port: 443,
            decision: Some(Decision::Deny),
            rule: "not in network.allow".into(),
            ..Default::default()
        }),
    ))
    .unwrap();
}

/// `corral proxy` under SIGTERM (how a container engine stops it), with 256 descriptors: the
/// tunnels still open are ended and each gets its close record with its bytes, and the
/// connections it refused for want of a descriptor are counted in `refused` records, all before
/// it exits. Control: until the SIGTERM there is no close record (the origin never closes).
#[test]
fn on_sigterm_the_proxy_records_every_open_tunnel_and_every_refusal() {
    let w = World::new();
    // An echo origin that never closes first.
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in echo.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    w.write_policy(&format!(
        "[network]\nallow = [\"localhost:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n"
    ));
    let mut cmd = w.corral(&["proxy", "--listen", "127.0.0.1:0"]);
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut p = Running::spawn(cmd, true);
    let line = p.wait_for("audit log ");
    let log = AuditLog::at(line.rsplit(' ').next().unwrap());
    let line = p.wait_for("listening on ");
    let addr: SocketAddr = line.rsplit(' ').next().unwrap().parse().unwrap();
    let connect = format!("CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n");
    let (mut sent, mut refused, mut conns) = (Vec::new(), 0u64, Vec::new());
    for i in 0..300usize {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(connect.as_bytes()).unwrap();
        let mut head = [0u8; 39];
        s.read_exact(&mut head[..12]).unwrap();
        if &head[..12] == b"HTTP/1.1 503" {
            refused += 1;
            continue;
        }
        assert_eq!(&head[..12], b"HTTP/1.1 200");
        s.read_exact(&mut head[12..]).unwrap();
        let payload = vec![b'z'; 1 + i * 13];
        s.write_all(&payload).unwrap();
        let mut back = vec![0u8; payload.len()];
        s.read_exact(&mut back).unwrap();
        sent.push(payload.len() as u64);
        conns.push(s);
    }
    let ok = sent.len() as u64;
    assert!(ok > 50 && refused > 50, "{ok} served, {refused} refused");
    let closes = |log: &AuditLog| -> Vec<NetEvent> {
        let (records, _) = log.read_all().unwrap();
        records
            .into_iter()
            .filter_map(|r| match r.event {
                Event::Net(n) if n.phase == NetPhase::Close => Some(n),
                _ => None,
            })
            .collect()
    };
    assert!(closes(&log).is_empty(), "control: no tunnel has ended");

    // SAFETY: kill sends a signal to the child we started.
    assert_eq!(unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) }, 0);
    let status = p.child.wait().unwrap();
    assert!(status.success(), "{status}");

    let got = closes(&log);
    assert_eq!(got.len() as u64, ok, "one close record per tunnel");
    let mut up: Vec<u64> = got.iter().map(|c| c.bytes_up).collect();
    let mut down: Vec<u64> = got.iter().map(|c| c.bytes_down).collect();
    let mut want = sent.clone();
    up.sort();
    down.sort();
    want.sort();
    assert_eq!((up, down), (want.clone(), want));
    let (records, _) = log.read_all().unwrap();
    let mut counted = 0;
    let mut dial_refused = 0;
    for r in records {
        if let Event::Net(n) = r.event {
            if n.phase == NetPhase::Refused {
                counted += n.count;
            } else if n.phase == NetPhase::Decision && n.rule.contains("out of file descriptors") {
                dial_refused += 1;
            }
        }
    }
    assert!(counted > 0);
    assert_eq!(counted + dial_refused, refused, "every 503 is in the log");
    // `corral log --blocked` shows them, counted.
    let out = w.corral(&["log", "--blocked"]).output().unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.lines().any(|l| l.contains(" refused ")
            && l.contains("the proxy")
            && l.contains("corral was out of file descriptors")
            && l.contains('×')),
        "{table}"
    );
}
