//! The executor server, in process, over real TCP: every refusal and every way a command can end
//! is tried for real, and "no process left behind" is checked on the process group itself.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_audit::{AuditLog, Decision, Event as AuditEvent};
use corral_exec::client::{self, Endpoint, Target};
use corral_exec::spawn::group_alive;
use corral_exec::{Event, ExecRequest, HostSpawner, ListenAddr, Server, ServerConfig};

struct TestServer {
    addr: String,
    audit: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    fn start(adjust: impl FnOnce(&mut ServerConfig)) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        std::fs::create_dir_all(root.join("sub/dir")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let audit = dir.path().join("audit.jsonl");
        let mut cfg = ServerConfig::new(&root);
        cfg.audit = Some(AuditLog::at(&audit));
        cfg.kill_grace = Duration::from_millis(300);
        cfg.timeout = Duration::from_secs(60);
        adjust(&mut cfg);
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let server = Server::bind(
                    &ListenAddr::Tcp("127.0.0.1:0".into()),
                    cfg,
                    Arc::new(HostSpawner::default()),
                )
                .await
                .unwrap();
                addr_tx.send(server.local_addr()).unwrap();
                server
                    .run(async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        let addr = addr_rx.recv().unwrap();
        TestServer {
            addr,
            audit,
            root,
            _dir: dir,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    fn target(&self, token: Option<&str>) -> Target {
        let (host, port) = self.addr.rsplit_once(':').unwrap();
        Target {
            endpoint: Endpoint::Tcp {
                host: host.into(),
                port: port.parse().unwrap(),
            },
            token: token.map(String::from),
            project_root: None,
            found_by: "test".into(),
        }
    }

    /// Run a request through the library client, collecting its events.
    fn exec(&self, req: &ExecRequest) -> (Vec<Event>, Result<i32, client::ClientError>) {
        let mut events = Vec::new();
        let r = client::run(&self.target(None), req, &mut |e| {
            events.push(e.clone());
            Ok(())
        });
        (events, r)
    }

    /// A raw HTTP request: (status, body).
    fn raw(&self, path: &str, extra_headers: &str, body: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        let _ = s.write_all(body);
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        parse_response(&resp)
    }

    /// Every record (start records included: [`is_start`]).
    fn audit_records(&self) -> Vec<corral_audit::Record> {
        AuditLog::at(&self.audit).read_all().unwrap().0
    }

    /// A request any server answers with exit 0: proof that it still serves.
    fn assert_serving(&self) {
        let (status, body) = self.raw("/execute", "", br#"{"command":["true"]}"#);
        assert_eq!(
            (status, body.as_str()),
            (200, "{\"exitCode\":0,\"output\":\"\"}\n")
        );
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn parse_response(resp: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(resp).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        body.to_string()
    };
    (status, body)
}

fn req(cmd: &[&str]) -> ExecRequest {
    ExecRequest::new(cmd.iter().map(|s| s.to_string()).collect())
}

fn stdout_of(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Output {
                stream: corral_exec::Stream::Stdout,
                data,
            } => Some(data.as_str()),
            _ => None,
        })
        .collect()
}

/// Wait (bounded) until process group `pgid` no longer exists.
fn wait_group_gone(pgid: i32) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if !group_alive(pgid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn seed_execute_combines_output_in_order_as_go_does() {
    let s = TestServer::start(|_| {});
    let (status, body) = s.raw(
        "/execute",
        "",
        br#"{"command":["sh","-c","echo a; echo b >&2; echo '<c&>'; exit 3"]}"#,
    );
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "{\"exitCode\":3,\"output\":\"a\\u000ab\\u000a\\u003cc\\u0026\\u003e\\u000a\"}\n"
    );
    let (status, body) = s.raw("/execute", "", br#"{"command":["no-such-program-x"]}"#);
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "{\"exitCode\":127,\"output\":\"exec: \\u0022no-such-program-x\\u0022: executable file not found in $PATH\"}\n"
    );
}

#[test]
fn streaming_delivers_the_first_line_before_the_command_ends() {
    let s = TestServer::start(|_| {});
    let flag = s.root.join("flag");
    // The command cannot finish until the client has seen its first line and answered by
    // creating the flag file: without streaming it would hang until its timeout (exit 124).
    let mut r = req(&[
        "sh",
        "-c",
        "echo first; while [ ! -e flag ]; do sleep 0.02; done; echo second; echo done >&2",
    ]);
    r.timeout_ms = Some(20_000);
    let mut events = Vec::new();
    let code = client::run(&s.target(None), &r, &mut |e| {
        if let Event::Output { data, .. } = e
            && data.contains("first")
        {
            std::fs::write(&flag, "").unwrap();
        }
        events.push(e.clone());
        Ok(())
    })
    .unwrap();
    assert_eq!(code, 0);
    assert_eq!(stdout_of(&events), "first\nsecond\n");
    assert!(events.contains(&Event::Output {
        stream: corral_exec::Stream::Stderr,
        data: "done\n".into()
    }));
    assert_eq!(
        events.last(),
        Some(&Event::Exit(corral_exec::Exit::default()))
    );
}

#[test]
fn stdin_env_and_cwd_reach_the_command() {
    let s = TestServer::start(|_| {});
    let mut r = req(&["sh", "-c", "cat; echo \"$RUST_LOG\"; pwd"]);
    r.stdin = Some("from stdin\n".into());
    r.env.insert("RUST_LOG".into(), "hello".into());
    r.cwd = Some("sub/dir".into());
    let (events, code) = s.exec(&r);
    assert_eq!(code.unwrap(), 0);
    assert_eq!(
        stdout_of(&events),
        format!("from stdin\nhello\n{}\n", s.root.join("sub/dir").display())
    );
}

#[test]
fn timeout_kills_the_whole_group_even_when_it_ignores_sigterm() {
    let s = TestServer::start(|_| {});
    let mut r = req(&[
        "sh",
        "-c",
        "trap '' TERM; echo $$; sleep 1000 & sleep 1000; wait",
    ]);
    r.timeout_ms = Some(300);
    let (events, code) = s.exec(&r);
    assert_eq!(code.unwrap(), 124);
    let pgid: i32 = stdout_of(&events).trim().parse().unwrap();
    match events.last() {
        Some(Event::Exit(x)) => {
            assert!(x.timed_out);
            assert_eq!(x.exit, 124);
        }
        other => panic!("last event {other:?}"),
    }
    // The exit event is sent after the group was killed and reaped.
    assert!(
        !group_alive(pgid),
        "process group {pgid} survived its timeout"
    );
    let rec = s.audit_records().into_iter().last().unwrap();
    match rec.event {
        AuditEvent::Exec(e) => {
            assert!(e.timed_out);
            assert_eq!(e.exit_code, Some(124));
        }
        other => panic!("{other:?}"),
    }
}

/// Whether `r` is a command's start record (written before it runs).
fn is_start(r: &corral_audit::Record) -> bool {
    matches!(&r.event, AuditEvent::Exec(e) if e.phase == corral_audit::ExecPhase::Start)
}

/// Send a request on a raw connection, read until the command printed its pid, then hang up.
fn start_and_disconnect(s: &TestServer, path: &str) -> i32 {
    let body = br#"{"command":["sh","-c","echo $$ > pgid; echo $$; sleep 1000 & sleep 1000"]}"#;
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let pidfile = s.root.join("pgid");
    let until = Instant::now() + Duration::from_secs(10);
    let pgid = loop {
        if let Ok(t) = std::fs::read_to_string(&pidfile)
            && let Ok(p) = t.trim().parse::<i32>()
        {
            break p;
        }
        assert!(Instant::now() < until, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    std::fs::remove_file(&pidfile).unwrap();
    assert!(group_alive(pgid));
    drop(conn);
    pgid
}

#[test]
fn client_disconnect_kills_the_group() {
    let s = TestServer::start(|_| {});
    for path in ["/v1/exec", "/execute"] {
        let pgid = start_and_disconnect(&s, path);
        assert!(
            wait_group_gone(pgid),
            "{path}: process group {pgid} survived the client's disconnect"
        );
    }
    // The record is written right after the group is reaped: give it a moment.
    let until = Instant::now() + Duration::from_secs(10);
    let reasons = loop {
        let reasons: Vec<_> = s
            .audit_records()
            .into_iter()
            .filter_map(|r| match r.event {
                AuditEvent::Exec(e) => e.reason,
                _ => None,
            })
            .collect();
        if reasons.len() >= 2 || Instant::now() > until {
            break reasons;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        reasons,
        vec!["client disconnected; process group killed"; 2]
    );
    s.assert_serving();
}

#[test]
fn server_shutdown_kills_running_commands() {
    let mut s = TestServer::start(|_| {});
    let body = br#"{"command":["sh","-c","echo $$ > pgid; sleep 1000"]}"#;
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    let head = format!(
        "POST /v1/exec HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let pgid = loop {
        if let Ok(p) = std::fs::read_to_string(s.root.join("pgid"))
            .unwrap_or_default()
            .trim()
            .parse::<i32>()
        {
            break p;
        }
        assert!(Instant::now() < until, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    // Stop the server: `run` returns only once its commands are gone.
    s.stop.take().unwrap().send(()).unwrap();
    s.thread.take().unwrap().join().unwrap();
    assert!(
        !group_alive(pgid),
        "process group {pgid} survived the server"
    );
    let mut resp = Vec::new();
    let _ = conn.read_to_end(&mut resp);
    let (status, body) = parse_response(&resp);
    assert_eq!(status, 200);
    assert!(
        body.contains("\"error\":\"the executor is shutting down; the command was killed\""),
        "{body}"
    );
}

#[test]
fn cwd_never_leaves_the_project() {
    let s = TestServer::start(|_| {});
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s3cret").unwrap();
    std::os::unix::fs::symlink(outside.path(), s.root.join("escape")).unwrap();
    std::os::unix::fs::symlink("sub", s.root.join("inside")).unwrap();
    for (cwd, why) in [
        ("../..", "contains '..'"),
        ("/etc", "is absolute"),
        ("escape", "resolves outside the project root"),
        ("sub/../../..", "contains '..'"),
    ] {
        let body = serde_json::json!({"command": ["cat", "secret"], "cwd": cwd}).to_string();
        let (status, text) = s.raw("/v1/exec", "", body.as_bytes());
        assert_eq!(status, 400, "{cwd}: {text}");
        assert!(text.contains(why), "{cwd}: {text}");
        assert!(!text.contains("s3cret"));
    }
    // A symlink that stays inside is fine.
    let mut r = req(&["pwd"]);
    r.cwd = Some("inside/dir".into());
    let (events, code) = s.exec(&r);
    assert_eq!(code.unwrap(), 0);
    assert_eq!(
        stdout_of(&events),
        format!("{}\n", s.root.join("sub/dir").display())
    );
    let denied = s
        .audit_records()
        .into_iter()
        .filter(|r| r.is_blocked())
        .count();
    assert_eq!(denied, 4, "every refused cwd is audited");
}

#[test]
fn token_is_required_when_configured() {
    let s = TestServer::start(|c| c.token = Some("correct-horse".into()));
    let body = br#"{"command":["true"]}"#;
    assert_eq!(s.raw("/v1/exec", "", body).0, 401);
    assert_eq!(s.raw("/execute", "", body).0, 401);
    assert_eq!(
        s.raw("/v1/exec", "Authorization: Bearer wrong-horse!\r\n", body)
            .0,
        401
    );
    assert_eq!(
        s.raw("/v1/exec", "Authorization: Basic correct-horse\r\n", body)
            .0,
        401
    );
    let (status, text) = s.raw("/v1/exec", "Authorization: Bearer correct-horse\r\n", body);
    assert_eq!((status, text.as_str()), (200, "{\"exit\":0}\n"));
    // Through the client: a wrong token is an error with exit 125, the right one works.
    let mut sink = |_: &Event| Ok(());
    let err = client::run(&s.target(Some("nope")), &req(&["true"]), &mut sink).unwrap_err();
    assert!(
        matches!(err, client::ClientError::Refused { status: 401, .. }),
        "{err}"
    );
    assert_eq!(err.exit_code(), 125);
    assert_eq!(
        client::run(
            &s.target(Some("correct-horse")),
            &req(&["sh", "-c", "exit 9"]),
            &mut sink
        )
        .unwrap(),
        9
    );
}

#[test]
fn bad_requests_get_4xx_and_the_server_keeps_serving() {
    let s = TestServer::start(|_| {});
    for (path, body, want, says) in [
        ("/v1/exec", &b"{not json"[..], 400, "not valid JSON"),
        ("/v1/exec", br#"{"command":"ls"}"#, 400, "invalid type"),
        ("/v1/exec", br#"{"command":[1,2]}"#, 400, "invalid type"),
        ("/v1/exec", br#"{"command":[]}"#, 400, "is empty"),
        ("/execute", br#"{"command":[]}"#, 400, "is empty"),
        (
            "/v1/exec",
            br#"{"command":["ls"],"timeout_ms":"x"}"#,
            400,
            "invalid type",
        ),
        (
            "/v1/exec",
            br#"{"command":["ls"],"bogus":1}"#,
            400,
            "unknown field",
        ),
        ("/v1/exec", b"", 400, "not valid JSON"),
        ("/nope", br#"{"command":["ls"]}"#, 404, "no such endpoint"),
    ] {
        let (status, text) = s.raw(path, "", body);
        assert_eq!(
            status,
            want,
            "{path} {:?}: {text}",
            String::from_utf8_lossy(body)
        );
        assert!(text.contains(says), "{text}");
        s.assert_serving();
    }
}

#[test]
fn a_100_mb_body_gets_413_and_the_server_keeps_serving() {
    let s = TestServer::start(|_| {});
    // Declared length: refused before the body is read.
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    conn.write_all(
        b"POST /v1/exec HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\nConnection: close\r\n\r\n{\"command\":[\"true\"],\"stdin\":\"",
    )
    .unwrap();
    let mut resp = Vec::new();
    let _ = conn.read_to_end(&mut resp);
    assert_eq!(parse_response(&resp).0, 413);
    s.assert_serving();

    // Chunked, no declared length: refused once the limit is crossed. The server may close the
    // connection while we are still sending; the status line must arrive first.
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    conn.write_all(
        b"POST /v1/exec HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let reader = conn.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'a'; 1 << 20];
        let head = format!("{:x}\r\n", chunk.len());
        for _ in 0..100 {
            if conn.write_all(head.as_bytes()).is_err()
                || conn.write_all(&chunk).is_err()
                || conn.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
        let _ = conn.write_all(b"0\r\n\r\n");
    });
    let mut status_line = String::new();
    let _ = BufReader::new(reader).read_line(&mut status_line);
    writer.join().unwrap();
    assert!(
        status_line.starts_with("HTTP/1.1 413"),
        "status line {status_line:?}"
    );
    s.assert_serving();
}

#[test]
fn two_hundred_requests_with_a_limit_of_eight_all_complete_or_get_429() {
    let s = Arc::new(TestServer::start(|c| c.max_concurrent = 8));
    let threads: Vec<_> = (0..200)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                s.raw(
                    "/v1/exec",
                    "",
                    br#"{"command":["sh","-c","sleep 0.05; echo ok"]}"#,
                )
            })
        })
        .collect();
    let mut ok = 0;
    let mut busy = 0;
    for t in threads {
        let (status, body) = t.join().unwrap();
        match status {
            200 => {
                assert_eq!(
                    body,
                    "{\"stream\":\"stdout\",\"data\":\"ok\\n\"}\n{\"exit\":0}\n"
                );
                ok += 1;
            }
            429 => {
                assert!(body.contains("executor busy"), "{body}");
                busy += 1;
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert_eq!(ok + busy, 200, "every request is answered");
    assert!(ok >= 8, "at least the first 8 ran (ran {ok})");
    // Every command and every refusal is in the audit log.
    let recs = s.audit_records();
    let ends: Vec<_> = recs.iter().filter(|r| !is_start(r)).collect();
    assert_eq!(ends.len(), 200);
    assert_eq!(ends.iter().filter(|r| r.is_blocked()).count(), busy);
    // Each command that ran was recorded before it started too.
    assert_eq!(recs.len() - ends.len(), 200 - busy);
    s.assert_serving();
}

#[test]
fn output_beyond_the_cap_is_cut_with_a_marker() {
    let s = TestServer::start(|c| c.max_output = 1000);
    let (events, code) = s.exec(&req(&["sh", "-c", "yes | head -c 100000; echo tail >&2"]));
    assert_eq!(code.unwrap(), 0);
    let out = stdout_of(&events);
    let marker = "\n[corral: output truncated after 1000 bytes (executor.max_output); the rest was discarded]\n";
    assert_eq!(out, format!("{}{marker}", "y\n".repeat(500)));
    match events.last() {
        Some(Event::Exit(x)) => assert!(x.truncated),
        other => panic!("{other:?}"),
    }
    // The legacy endpoint cuts the same way.
    let (_, body) = s.raw(
        "/execute",
        "",
        br#"{"command":["sh","-c","yes | head -c 5000"]}"#,
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["output"].as_str().unwrap(),
        format!("{}{marker}", "y\n".repeat(500))
    );
    // The audit log counts everything the command wrote.
    let recs = s.audit_records();
    match &recs.iter().find(|r| !is_start(r)).unwrap().event {
        AuditEvent::Exec(e) => assert_eq!(e.bytes_out, 100005),
        other => panic!("{other:?}"),
    }
}

#[test]
fn programs_outside_the_allowlist_are_refused_and_audited() {
    let s = TestServer::start(|c| c.allow = vec!["echo".into(), "/bin/true".into()]);
    let (events, code) = s.exec(&req(&["echo", "allowed"]));
    assert_eq!((code.unwrap(), stdout_of(&events)), (0, "allowed\n".into()));
    let mut sink = |_: &Event| Ok(());
    let err = client::run(&s.target(None), &req(&["rm", "-rf", "x"]), &mut sink).unwrap_err();
    match &err {
        client::ClientError::Refused {
            status, message, ..
        } => {
            assert_eq!(*status, 403);
            assert!(message.contains("not in executor.allow"), "{message}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(err.exit_code(), 126);
    let (status, body) = s.raw("/execute", "", br#"{"command":["sh","-c","id"]}"#);
    assert_eq!(status, 403);
    assert!(body.starts_with("{\"exitCode\":126,\"output\":\"corral serve: program \\u0022sh\\u0022 is not in executor.allow"), "{body}");
    let recs = s.audit_records();
    let denied: Vec<_> = recs
        .iter()
        .filter_map(|r| match &r.event {
            AuditEvent::Exec(e) if e.decision == Some(Decision::Deny) => {
                Some((e.command[0].clone(), e.reason.clone().unwrap()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(denied.len(), 2);
    assert_eq!(denied[0].0, "rm");
    assert!(denied[0].1.contains("executor.allow"));
    assert_eq!(denied[1].0, "sh");
}

#[test]
fn unix_socket_listener_is_private_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("exec.sock");
    let root = dir.path().to_path_buf();
    let sock2 = sock.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let t = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let mut cfg = ServerConfig::new(&root);
            cfg.token = Some("tok".into());
            let server = Server::bind(
                &ListenAddr::Unix(sock2),
                cfg,
                Arc::new(HostSpawner::default()),
            )
            .await
            .unwrap();
            ready_tx.send(()).unwrap();
            server
                .run(async {
                    let _ = stop_rx.await;
                })
                .await;
        });
    });
    ready_rx.recv().unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let target = Target {
        endpoint: Endpoint::Unix(sock.clone()),
        token: Some("tok".into()),
        project_root: None,
        found_by: "test".into(),
    };
    let mut out = String::new();
    let code = client::run(&target, &req(&["echo", "over unix"]), &mut |e| {
        if let Event::Output { data, .. } = e {
            out.push_str(data);
        }
        Ok(())
    })
    .unwrap();
    assert_eq!((code, out.as_str()), (0, "over unix\n"));
    stop_tx.send(()).unwrap();
    t.join().unwrap();
    assert!(
        !Path::new(&sock).exists(),
        "the socket is removed on shutdown"
    );
}

/// The audit log made unwritable while the server holds it open: moved away, a directory in its
/// place.
fn break_log(log: &Path) {
    std::fs::rename(log, log.with_file_name("moved.jsonl")).unwrap();
    std::fs::create_dir(log).unwrap();
}

/// Fail closed: once the audit log cannot be written, a command is refused with 503 on both
/// endpoints and never runs (its file is not created), where the same command ran while the log
/// was writable; each lost record is counted with the reason.
#[test]
fn a_command_the_audit_log_cannot_record_is_refused_and_never_runs() {
    let mut log = None;
    let s = TestServer::start(|c| log = c.audit.clone());
    let log = log.unwrap();
    let (_, code) = s.exec(&req(&["touch", "before"]));
    assert_eq!(code.unwrap(), 0);
    assert!(s.root.join("before").exists());
    break_log(&s.audit);

    let (events, code) = s.exec(&req(&["touch", "after-v1"]));
    assert!(events.is_empty(), "{events:?}");
    match code {
        Err(client::ClientError::Refused {
            status,
            message,
            exit,
        }) => {
            assert_eq!((status, exit), (503, 125));
            assert!(
                message.contains("the audit log cannot record this command, so it was not run"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    let (status, body) = s.raw("/execute", "", br#"{"command":["touch","after-legacy"]}"#);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("cannot record this command"), "{body}");
    assert!(!s.root.join("after-v1").exists());
    assert!(!s.root.join("after-legacy").exists());
    let f = log.failures().expect("the lost records are counted");
    assert_eq!(f.count, 2);
    assert!(f.reason.contains("directory"), "{f:?}");
}

/// A command that breaks the log while it runs: it ran (its start was recorded), and the end
/// record that could not be written is counted.
#[test]
fn a_lost_end_record_is_counted() {
    let mut log = None;
    let s = TestServer::start(|c| log = c.audit.clone());
    let log = log.unwrap();
    let path = s.audit.display().to_string();
    let script = format!("mv '{path}' '{path}.moved' && mkdir '{path}' && touch ran");
    let (_, code) = s.exec(&req(&["sh", "-c", &script]));
    assert_eq!(code.unwrap(), 0);
    assert!(s.root.join("ran").exists());
    assert_eq!(log.failures().map(|f| f.count), Some(1));
    let moved = std::fs::read_to_string(format!("{path}.moved")).unwrap();
    assert!(moved.contains(r#""phase":"start""#), "{moved}");
    assert_eq!(moved.lines().count(), 1, "{moved}");
}

/// A config the jail planted in the project, and the variables that would make git on the host
/// read it: `HOME` (`~/.gitconfig`: an alias), `XDG_CONFIG_HOME` (`git/config`: a
/// `core.fsmonitor` command `git status` runs) and `GIT_CONFIG_GLOBAL` (an alias that shadows
/// nothing but runs a command). Each entry: (variable, value, git's arguments, the marker the planted command writes).
fn planted_git_configs(root: &Path) -> Vec<(&'static str, PathBuf, Vec<&'static str>, PathBuf)> {
    let evil = root.join("evil");
    std::fs::create_dir_all(evil.join("xdg/git")).unwrap();
    let marker = |n: &str| root.join(format!("planted-{n}-ran"));
    let (alias, fsmonitor, global) = (marker("alias"), marker("fsmonitor"), marker("global"));
    std::fs::write(
        evil.join(".gitconfig"),
        format!("[alias]\n\tst = !touch {}\n", alias.display()),
    )
    .unwrap();
    std::fs::write(
        evil.join("xdg/git/config"),
        format!(
            "[core]\n\tfsmonitor = touch {}; false\n",
            fsmonitor.display()
        ),
    )
    .unwrap();
    std::fs::write(
        evil.join("global.gitconfig"),
        format!("[alias]\n\tlg = !touch {}\n", global.display()),
    )
    .unwrap();
    vec![
        ("HOME", evil.clone(), vec!["st"], alias),
        (
            "XDG_CONFIG_HOME",
            evil.join("xdg"),
            vec!["status"],
            fsmonitor,
        ),
        (
            "GIT_CONFIG_GLOBAL",
            evil.join("global.gitconfig"),
            vec!["lg"],
            global,
        ),
    ]
}

/// The host executor runs git with the server's own home and config: a request that points
/// `HOME`, `XDG_CONFIG_HOME` or `GIT_CONFIG_GLOBAL` at a config planted in the project is refused
/// (with `executor.allow = ["git"]` and without an allowlist alike) and nothing planted runs.
/// Control: the same git with the same variables, started directly, runs each planted command.
#[test]
fn a_request_cannot_point_git_at_a_config_planted_in_the_project() {
    for allow in [vec!["git".to_string()], vec![]] {
        let s = TestServer::start(|c| c.allow = allow.clone());
        let init = std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(&s.root)
            .status()
            .unwrap();
        assert!(init.success());
        let planted = planted_git_configs(&s.root);
        for (name, value, args, marker) in &planted {
            let mut r = req(&[&["git"], args.as_slice()].concat());
            r.env.insert(name.to_string(), value.display().to_string());
            let (events, code) = s.exec(&r);
            assert!(events.is_empty(), "{name}: {events:?}");
            match code {
                Err(client::ClientError::Refused {
                    status,
                    message,
                    exit,
                }) => {
                    assert_eq!((status, exit), (403, 126), "{name}");
                    assert!(
                        message.starts_with(&format!(
                            "the request sets {name}, which a request may not set"
                        )),
                        "{message}"
                    );
                }
                other => panic!("{name}: {other:?}"),
            }
            assert!(!marker.exists(), "{name}: the planted command ran");
        }
        // The refusals are in the audit log, and git itself still runs without the variables.
        let denied = s
            .audit_records()
            .into_iter()
            .filter(
                |r| matches!(&r.event, AuditEvent::Exec(e) if e.decision == Some(Decision::Deny)),
            )
            .count();
        assert_eq!(denied, planted.len());
        let (events, code) = s.exec(&req(&["git", "status", "--short"]));
        assert_eq!(code.unwrap(), 0, "{events:?}");
        for (_, _, _, marker) in &planted {
            assert!(!marker.exists());
        }

        // Control: git started with the request's variables reads each planted config.
        for (name, value, args, marker) in &planted {
            let out = std::process::Command::new("git")
                .args(args)
                .current_dir(&s.root)
                .env_remove("XDG_CONFIG_HOME")
                .env_remove("GIT_CONFIG_GLOBAL")
                .env_remove("GIT_PAGER")
                .env_remove("PAGER")
                .env(name, value)
                .output()
                .unwrap();
            assert!(
                marker.exists(),
                "control: git with {name} did not run the planted command: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
