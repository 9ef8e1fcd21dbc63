//! `network.on_deny = "ask"`: a request only the allow list refuses is held while
//! `corral watch` asks; the answer (through the run's control socket, or `corral watch`'s keys
//! in a real pty) lets it through or refuses it, no answer refuses it at the timeout. A deny
//! rule and the address checks are never turned into a question, the jail cannot answer its own
//! question, and the held connections are bounded.
//!
//! The jail's script and the test take turns through files in the project (live_support); the
//! test waits for the question to be listed before answering, so nothing depends on timing.

mod jail_support;
mod live_support;
mod watch_support;

use std::time::{Duration, Instant};

use jail_support::*;
use live_support::*;
use watch_support::{Watch, corral_watch};

/// The project's policy: asking, with `extra` lines in `[network]`.
fn ask_policy(extra: &str) -> String {
    policy("").replace(
        "[network]\n",
        &format!("[network]\non_deny = \"ask\"\n{extra}"),
    )
}

/// `try` that waits long enough for any answer (the held request waits for the test).
fn prelude(port: u16) -> String {
    format!(
        "{}get() {{ curl -s --max-time 200 --noproxy '' -o /dev/null -w '%{{http_code}}' \"$1\"; }}\n\
         ask() {{ get \"http://127.0.0.1:{port}/$1\"; }}\n",
        script_prelude(port)
    )
}

/// The questions the run lists once `pred` holds for them.
#[track_caller]
fn wait_asks(
    socket: &std::path::Path,
    pred: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let start = Instant::now();
    loop {
        let answer = control(socket, "asks");
        let json = answer.strip_prefix("ok ").expect(&answer);
        let asks: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
        if pred(&asks) {
            return asks;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the questions did not become as expected: {answer}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The network records of `host`.
fn net_records(w: &World, host: &str) -> Vec<serde_json::Value> {
    w.audit_records()
        .into_iter()
        .filter(|r| r["kind"] == "net" && r["host"] == host)
        .collect()
}

#[test]
fn a_held_request_proceeds_once_allowed_through_the_control_socket() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(
        &w.project.join("corral.toml"),
        &ask_policy("ask_timeout = 300\n"),
    );
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 ready\necho \"HELD $(ask held)\"\necho END\n",
        prelude(port)
    );
    let bg = Background::start(&w, &script);
    wait_file(&w.project.join("step1"));
    let socket = control_socket(&w);
    let asks = wait_asks(&socket, |a| !a.is_empty());
    assert_eq!(asks.len(), 1, "{asks:?}");
    assert_eq!(asks[0]["host"], "127.0.0.1");
    assert_eq!(asks[0]["port"], port);
    assert_eq!(asks[0]["method"], "GET");
    assert_eq!(asks[0]["rule"], format!("not in network.allow"));
    let answer = control(&socket, &format!("allow {target}"));
    assert!(answer.starts_with("ok "), "{answer}");
    let out = bg.finish();
    assert!(out.stdout.contains("HELD 200"), "{}", out.both());
    // The question is in the audit log, then the decision the answer led to.
    let records = net_records(&w, "127.0.0.1");
    assert!(
        records
            .iter()
            .any(|r| r["phase"] == "ask" && r["method"] == "GET"),
        "{records:?}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["phase"] == "decision" && r["decision"] == "allow"),
        "{records:?}"
    );
    wait_record(&w, "live-allow", |r| summary(r).contains(&target));
}

#[test]
fn deny_rules_and_private_addresses_are_refused_at_once_and_the_jail_cannot_answer() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    // The questions would wait 300 s, longer than curl's 200: a held request shows as 000.
    write(
        &w.project.join("corral.toml"),
        &ask_policy("ask_timeout = 300\ndeny = [\"denied.test\"]\n"),
    );
    w.trust_project(&[]);
    let script = format!(
        r#"{}echo "DENIED $(get http://denied.test:{port}/x)"
echo "PRIVATE $(get http://10.0.0.1:{port}/x)"
echo "METADATA $(get http://169.254.169.254/latest/meta-data/)"
( echo "REFUSED $(ask refused)" > refused.out ) &
step 1 ready
wait_go 1
python3 - "$(cat sockpath)" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
    s.sendall(b"allow {target}\n")
    print("CONTROL reached", s.recv(200))
except OSError as e:
    print("CONTROL unreachable", type(e).__name__)
PY
step 2 tried
wait_go 2
wait
cat refused.out
echo END
"#,
        prelude(port)
    );
    let bg = Background::start(&w, &script);
    wait_file(&w.project.join("step1"));
    let socket = control_socket(&w);
    // Only the loopback origin the allow list does not name is asked.
    let asks = wait_asks(&socket, |a| !a.is_empty());
    assert_eq!(asks.len(), 1, "{asks:?}");
    assert_eq!(asks[0]["port"], port, "{asks:?}");
    write(&w.project.join("sockpath"), socket.to_str().unwrap());
    go(&w, 1);
    wait_file(&w.project.join("step2"));
    // The jail's attempt answered nothing: the question still waits.
    let asks = wait_asks(&socket, |_| true);
    assert_eq!(asks.len(), 1, "{asks:?}");
    let answer = control(&socket, &format!("refuse {target}"));
    assert!(answer.starts_with("ok "), "{answer}");
    go(&w, 2);
    let out = bg.finish();
    for line in ["DENIED 403", "PRIVATE 403", "METADATA 403", "REFUSED 403"] {
        assert!(out.stdout.contains(line), "{line}: {}", out.both());
    }
    assert!(out.stdout.contains("CONTROL unreachable"), "{}", out.both());
    for host in ["denied.test", "10.0.0.1", "169.254.169.254"] {
        let records = net_records(&w, host);
        assert!(!records.is_empty(), "no record of {host}");
        assert!(
            records.iter().all(|r| r["phase"] != "ask"),
            "{host} was asked: {records:?}"
        );
    }
    let refused = net_records(&w, "127.0.0.1");
    assert!(
        refused.iter().any(|r| r["decision"] == "deny"
            && r["rule"]
                .as_str()
                .unwrap()
                .ends_with("refused in corral watch")),
        "{refused:?}"
    );
}

#[test]
fn no_answer_refuses_at_the_timeout() {
    let w = World::new();
    let port = origin();
    write(
        &w.project.join("corral.toml"),
        &ask_policy("ask_timeout = 1\n"),
    );
    w.trust_project(&[]);
    let script = format!("{}echo \"LATE $(ask late)\"\necho END\n", prelude(port));
    let out = Background::start(&w, &script).finish();
    assert!(out.stdout.contains("LATE 403"), "{}", out.both());
    let records = net_records(&w, "127.0.0.1");
    assert!(records.iter().any(|r| r["phase"] == "ask"), "{records:?}");
    assert!(
        records.iter().any(|r| r["decision"] == "deny"
            && r["rule"] == "not in network.allow; asked, no answer within 1 s"),
        "{records:?}"
    );
    // `corral log` shows the question, then the refusal.
    let log = corral_ok(&w, &["log"]);
    let target = format!("GET 127.0.0.1:{port}");
    let rows: Vec<&str> = log.stdout.lines().filter(|l| l.contains(&target)).collect();
    assert!(
        rows.iter()
            .any(|l| l.contains(" ask ") && l.contains("not in network.allow")),
        "{}",
        log.stdout
    );
    assert!(
        rows.iter().any(|l| l.contains("no answer within 1 s")),
        "{}",
        log.stdout
    );
}

#[test]
fn held_connections_are_bounded_and_share_one_question() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(
        &w.project.join("corral.toml"),
        &ask_policy("ask_timeout = 300\n"),
    );
    w.trust_project(&[]);
    let script = format!(
        "{}i=0; while [ $i -lt 64 ]; do ( ask held$i > held$i.out ) & i=$((i+1)); done\n\
         step 1 ready\nwait_go 1\necho \"OVER $(ask over)\"\nstep 2 over\nwait_go 2\nwait\n\
         echo \"HELD403 $(grep -lx 403 held*.out | wc -l)\"\necho END\n",
        prelude(port)
    );
    let bg = Background::start(&w, &script);
    wait_file(&w.project.join("step1"));
    let socket = control_socket(&w);
    // Sixty-four connections to one destination: one question.
    let asks = wait_asks(&socket, |a| a.first().is_some_and(|q| q["held"] == 64));
    assert_eq!(asks.len(), 1, "{asks:?}");
    go(&w, 1);
    // The sixty-fifth is refused at once.
    assert!(wait_file(&w.project.join("step2")).contains("over"));
    let answer = control(&socket, &format!("refuse {target}"));
    assert!(answer.starts_with("ok "), "{answer}");
    go(&w, 2);
    let out = bg.finish();
    assert!(out.stdout.contains("OVER 403"), "{}", out.both());
    assert!(out.stdout.contains("HELD403 64"), "{}", out.both());
    let records = net_records(&w, "127.0.0.1");
    assert_eq!(
        records.iter().filter(|r| r["phase"] == "ask").count(),
        1,
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| r["rule"]
            == "not in network.allow; not asked: 64 connections wait for an answer already"),
        "{records:?}"
    );
}

/// A jail with `on_deny = "ask"` whose request to a loopback origin waits for an answer, and
/// `corral watch` on a pty showing the question; the origin's `host:port`.
fn held_in_watch(w: &World) -> (Background, Watch, String) {
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(
        &w.project.join("corral.toml"),
        &ask_policy("ask_timeout = 300\n"),
    );
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 ready\necho \"HELD $(ask held)\"\necho END\n",
        prelude(port)
    );
    let bg = Background::start(w, &script);
    wait_file(&w.project.join("step1"));
    wait_asks(&control_socket(w), |a| !a.is_empty());
    let mut watch = Watch::start(corral_watch(w));
    // The question at the top (words: the terminal skips blank cells).
    watch.wait_for(0, "ASK");
    watch.wait_for(0, &target);
    (bg, watch, target)
}

#[test]
fn corral_watch_shows_the_question_and_a_lets_the_held_request_through() {
    let w = World::new();
    let policy_file = w.project.join("corral.toml");
    let (bg, mut watch, target) = held_in_watch(&w);
    // With its time left.
    watch.wait_for(0, "left");
    let before = std::fs::read_to_string(&policy_file).unwrap();
    watch.key("a");
    let out = bg.finish();
    assert!(out.stdout.contains("HELD 200"), "{}", out.both());
    wait_record(&w, "live-allow", |r| summary(r).contains(&target));
    assert_eq!(
        std::fs::read_to_string(&policy_file).unwrap(),
        before,
        "an allow for the run is written nowhere"
    );
    assert!(watch.quit().success());
}

#[test]
fn corral_watch_r_refuses_the_held_request() {
    let w = World::new();
    let (bg, mut watch, _) = held_in_watch(&w);
    watch.key("r");
    let out = bg.finish();
    assert!(out.stdout.contains("HELD 403"), "{}", out.both());
    let records = net_records(&w, "127.0.0.1");
    assert!(
        records
            .iter()
            .any(|r| r["rule"] == "not in network.allow; refused in corral watch"),
        "{records:?}"
    );
    assert!(watch.quit().success());
}

#[test]
fn corral_watch_p_adds_the_question_to_corral_toml_and_lets_it_through() {
    let w = World::new();
    let policy_file = w.project.join("corral.toml");
    let (bg, mut watch, target) = held_in_watch(&w);
    watch.key("p");
    let out = bg.finish();
    assert!(out.stdout.contains("HELD 200"), "{}", out.both());
    let text = std::fs::read_to_string(&policy_file).unwrap();
    assert!(text.contains(&format!("allow = [\"{target}\"]")), "{text}");
    assert!(
        text.starts_with("# corral.toml of the live-policy test: this comment stays\n"),
        "{text}"
    );
    assert!(watch.quit().success());
}

/// A fake `notify-send` in a directory of the world's, writing its arguments (one a line) to
/// the file `notified` there once; the directory and a PATH that has it first.
fn fake_notify_send(w: &World) -> (std::path::PathBuf, String) {
    let dir = w.root.join("desktop-bin");
    let script = dir.join("notify-send");
    write(
        &script,
        &format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {d}/notified.tmp \
             && mv {d}/notified.tmp {d}/notified\n",
            d = dir.display()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", dir.display());
    (dir, path)
}

/// What the fake `notify-send` was called with.
fn notified(dir: &std::path::Path, target: &str) -> Vec<String> {
    let text = wait_file(&dir.join("notified"));
    let argv: Vec<String> = text.lines().map(str::to_string).collect();
    let host = target.rsplit_once(':').unwrap().0;
    assert_eq!(
        argv,
        vec![
            "--app-name=corral".to_string(),
            "corral: a request waits for an answer".into(),
            format!("{target} is held: answer in `corral watch` (or `corral allow {host}`)"),
        ]
    );
    argv
}

/// All a pty master gives until every slave is closed, gathered on a thread.
struct PtyOutput {
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PtyOutput {
    fn start(mut master: std::fs::File) -> PtyOutput {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let thread = {
            let seen = seen.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                // EIO once no slave is open any more.
                while let Ok(n @ 1..) = master.read(&mut buf) {
                    seen.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            })
        };
        PtyOutput {
            seen,
            thread: Some(thread),
        }
    }

    /// What came so far once it holds `needle`.
    #[track_caller]
    fn wait_for(&self, needle: &[u8]) -> Vec<u8> {
        let start = Instant::now();
        loop {
            let seen = self.seen.lock().unwrap().clone();
            if seen.windows(needle.len()).any(|w| w == needle) {
                return seen;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{:?} did not come; came: {:?}",
                String::from_utf8_lossy(needle),
                String::from_utf8_lossy(&seen)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything, once the terminal hung up.
    fn finish(mut self) -> Vec<u8> {
        self.thread.take().unwrap().join().unwrap();
        self.seen.lock().unwrap().clone()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_held_request_is_said_in_the_title_between_the_jails_sequences_and_on_the_desktop() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(
        &w.project.join("corral.toml"),
        &ask_policy("ask_timeout = 300\n"),
    );
    w.trust_project(&[]);
    let (desktop, path) = fake_notify_send(&w);
    // The jail's title sequence is open (a TUI's sequence split across writes) while its
    // request is held; it completes it once the test says so.
    let script = format!(
        "{}printf '\\033]0;jail-'\n( ask held > held.out ) &\nstep 1 ready\nwait_go 1\n\
         printf 'title\\007<after>'\nwait\necho \" HELD $(cat held.out)\"\necho END\n",
        prelude(port)
    );
    let mut c = w.corral();
    c.env("PATH", &path)
        .env("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")
        .args(["run", "--", "sh", "-c", &script]);
    let (master, slave, mut child) = under_pty(c, 24, 80);
    drop(slave);
    let out = PtyOutput::start(master);
    out.wait_for(b"\x1b]0;jail-");
    wait_file(&w.project.join("step1"));
    let socket = control_socket(&w);
    wait_asks(&socket, |a| !a.is_empty());
    // Told on the desktop (after the title was asked for).
    notified(&desktop, &target);
    go(&w, 1);
    out.wait_for(b"<after>");
    let answer = control(&socket, &format!("allow {target}"));
    assert!(answer.starts_with("ok "), "{answer}");
    assert!(child.wait().unwrap().success());
    let seen = out.finish();
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("HELD 200") && text.contains("END"),
        "{text:?}"
    );
    // The jail's sequence reached the terminal whole; corral's title came after it, with a
    // bell, and the user's title was popped back once nothing waited.
    let jail = find(&seen, b"\x1b]0;jail-title\x07<after>").expect(&text);
    let said =
        format!("\x1b[22;0t\x1b]2;corral: waiting: {target} - answer in `corral watch`\x1b\\\x07");
    let said_at = find(&seen, said.as_bytes()).expect(&text);
    assert!(said_at > jail, "{text:?}");
    let popped = find(&seen, b"\x1b[23;0t").expect(&text);
    assert!(popped > said_at, "{text:?}");
    assert_eq!(text.matches("\x1b]2;").count(), 1, "{text:?}");
    // No line on the screen.
    assert!(!text.contains("corral: held"), "{text:?}");
}

#[test]
fn a_held_request_without_a_terminal_is_a_line_on_stderr() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(
        &w.project.join("corral.toml"),
        &ask_policy("ask_timeout = 300\n"),
    );
    w.trust_project(&[]);
    let (desktop, path) = fake_notify_send(&w);
    let script = format!(
        "{}step 1 ready\necho \"HELD $(ask held)\"\necho END\n",
        prelude(port)
    );
    let mut c = w.corral();
    c.env("PATH", &path)
        .env("DISPLAY", ":99")
        .args(["run", "--", "sh", "-c", &script]);
    let bg = std::thread::spawn(move || run(c));
    wait_file(&w.project.join("step1"));
    let socket = control_socket(&w);
    wait_asks(&socket, |a| !a.is_empty());
    // The desktop is told after the line is written.
    notified(&desktop, &target);
    let answer = control(&socket, &format!("allow {target}"));
    assert!(answer.starts_with("ok "), "{answer}");
    let out = bg.join().unwrap();
    assert!(out.stdout.contains("HELD 200"), "{}", out.both());
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("corral: held "))
        .collect();
    assert_eq!(
        lines,
        vec![format!(
            "corral: held {target}: answer with corral watch (or corral allow 127.0.0.1)"
        )],
        "{}",
        out.both()
    );
    assert!(!out.stderr.contains("\x1b]"), "{}", out.both());
}
