//! `corral serve`, `corral exec` and `corral skill` as users run them: the real binary, real
//! sockets, real processes. Seed 003's own `execute.sh` runs unchanged against `corral serve`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../corral-exec/tests/fixtures")
        .join(name)
}

/// A `corral serve` child on 127.0.0.1:0 with a token, serving a fresh project.
struct Serve {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Serve {
    fn start(extra: &[&str]) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let proj = dir.path().join("proj");
        std::fs::create_dir_all(proj.join("sub")).unwrap();
        std::fs::write(dir.path().join("token"), "tok-123\n").unwrap();
        let mut child = Command::new(CORRAL)
            .args(["serve", "--listen", "127.0.0.1:0", "--token-file"])
            .arg(dir.path().join("token"))
            .arg("--root")
            .arg(&proj)
            .arg("--audit-log")
            .arg(dir.path().join("audit.jsonl"))
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        // Keep draining the server's stderr so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = err.read_to_string(&mut sink);
        });
        Serve { child, addr, dir }
    }

    fn proj(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path().join("proj")).unwrap()
    }

    fn exec_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(CORRAL);
        c.arg("exec").args(args);
        c.env("CORRAL_EXECUTOR", format!("http://{}", self.addr))
            .env("CORRAL_EXECUTOR_TOKEN_FILE", self.dir.path().join("token"))
            .env("CORRAL_PROJECT_ROOT", self.proj())
            // The executor is local: a proxy in the environment must not be used for it.
            .env("HTTP_PROXY", "http://127.0.0.1:9")
            .env("http_proxy", "http://127.0.0.1:9")
            .current_dir(self.proj());
        c
    }

    fn exec(&self, args: &[&str]) -> Output {
        self.exec_cmd(args).output().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exec_separates_streams_and_exits_with_the_commands_code() {
    let s = Serve::start(&[]);
    let out = s.exec(&["--", "sh", "-c", "echo out; echo err >&2; exit 5"]);
    assert_eq!(
        (out.status.code(), text(&out.stdout), text(&out.stderr)),
        (Some(5), "out\n".into(), "err\n".into())
    );
    // Killed by a signal: 128+N, as a shell reports it.
    let out = s.exec(&["--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(137));
    // Not found: 127 with the reason.
    let out = s.exec(&["--", "no-such-program-xyz"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("\"no-such-program-xyz\": executable file not found"),
        "{}",
        text(&out.stderr)
    );
    // Timeout: 124.
    let out = s.exec(&["--timeout", "300ms", "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(text(&out.stderr).contains("timed out after 300ms"));
    // A reader that goes away: corral exec ends like a program killed by SIGPIPE.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("\"$0\" exec -- yes | head -n 2")
        .arg(CORRAL)
        .envs(
            s.exec_cmd(&[])
                .get_envs()
                .filter_map(|(k, v)| Some((k, v?))),
        )
        .current_dir(s.proj())
        .output()
        .unwrap();
    assert_eq!(
        text(&out.stdout).lines().take(2).collect::<Vec<_>>(),
        ["y", "y"]
    );
    assert!(
        !text(&out.stderr).contains("corral exec:"),
        "{}",
        text(&out.stderr)
    );
    // --env and --stdin.
    let mut c = s.exec_cmd(&[
        "--stdin",
        "--env",
        "RUST_LOG=42",
        "--",
        "sh",
        "-c",
        "cat; echo $RUST_LOG",
    ]);
    c.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"piped\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "piped\n42\n".into())
    );
}

#[test]
fn exec_runs_in_the_same_place_of_the_project() {
    let s = Serve::start(&[]);
    let out = s
        .exec_cmd(&["--", "pwd"])
        .current_dir(s.proj().join("sub"))
        .output()
        .unwrap();
    assert_eq!(
        text(&out.stdout),
        format!("{}\n", s.proj().join("sub").display())
    );
    let out = s.exec(&["--cwd", "../..", "--", "pwd"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("may not leave the project root"));
}

#[test]
fn exec_streams_output_as_it_comes() {
    let s = Serve::start(&[]);
    // The command waits for a flag the test creates only after reading the first line from
    // `corral exec`'s stdout: buffering anywhere on the way would hang it until its timeout.
    let mut child = s
        .exec_cmd(&[
            "--timeout",
            "20s",
            "--",
            "sh",
            "-c",
            "echo first; while [ ! -e flag ]; do sleep 0.02; done; echo second",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "first\n");
    std::fs::write(s.proj().join("flag"), "").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "second\n");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn ctrl_c_on_exec_kills_the_remote_command() {
    let s = Serve::start(&[]);
    let mut c = s.exec_cmd(&["--", "sh", "-c", "echo $$; sleep 1000 & exec sleep 1001"]);
    // As from a terminal: a test run from a shell's background job would leave SIGINT ignored,
    // and corral exec keeps what it was given.
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pgid: i32 = line.trim().parse().unwrap();
    assert!(killpg(Pid::from_raw(pgid), None).is_ok());
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(2)
    );
    let until = Instant::now() + Duration::from_secs(10);
    while killpg(Pid::from_raw(pgid), None).is_ok() {
        assert!(
            Instant::now() < until,
            "process group {pgid} survived Ctrl-C on corral exec"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exec_errors_reaching_the_executor_exit_125() {
    let s = Serve::start(&[]);
    let out = s
        .exec_cmd(&["--", "true"])
        .env("CORRAL_EXECUTOR_TOKEN_FILE", "/dev/null")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("HTTP 401"),
        "{}",
        text(&out.stderr)
    );

    let out = s
        .exec_cmd(&["--", "true"])
        .env("CORRAL_EXECUTOR", "http://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("cannot reach the executor at http://127.0.0.1:1"),
        "{}",
        text(&out.stderr)
    );

    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(CORRAL)
        .args(["exec", "--", "true"])
        .env_remove("CORRAL_EXECUTOR")
        .env_remove("CORRAL_PROJECT_ROOT")
        .current_dir(empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("no executor found"));
}

#[test]
fn serve_refuses_to_run_without_a_token_or_explicit_no_auth() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(CORRAL)
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(dir.path())
        .env_remove("CORRAL_EXECUTOR_TOKEN_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("needs --token-file F"),
        "{}",
        text(&out.stderr)
    );
}

/// `corral serve --listen fd:N` takes a listening socket it inherits (how `corral run` starts its
/// executor on first use): a request sent before the server existed waits in the backlog and is
/// served, and the command the server runs does not inherit the listener.
#[test]
fn serve_takes_an_inherited_listener_and_keeps_it_from_its_commands() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(dir.path().join("token"), "tok-fd\n").unwrap();
    let sock = dir.path().join("exec.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let fd = listener.as_raw_fd();
    let inode = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .map(|m| m.ino())
        .unwrap_or(0);
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
    let link = link.to_string_lossy().into_owned();
    assert!(link.starts_with("socket:["), "{link} (inode {inode})");

    // The whole request is sent before any server runs.
    let mut client = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let body = r#"{"command":["sh","-c","ls -l /proc/self/fd/; echo from-exec"]}"#;
    write!(
        client,
        "POST /v1/exec HTTP/1.1\r\nHost: executor\r\nAuthorization: Bearer tok-fd\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();

    let mut cmd = Command::new(CORRAL);
    cmd.args(["serve", "--listen", &format!("fd:{fd}"), "--token-file"])
        .arg(dir.path().join("token"))
        .arg("--root")
        .arg(&proj)
        .arg("--audit-log")
        .arg(dir.path().join("audit.jsonl"))
        .stderr(Stdio::piped());
    // SAFETY: fcntl is async-signal-safe; it clears close-on-exec on the listener in the child
    // alone, which is how the server inherits it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let server = cmd.spawn().unwrap();
    drop(listener);
    client
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut resp = String::new();
    let read = client.read_to_string(&mut resp);
    let _ = kill(Pid::from_raw(server.id() as i32), Signal::SIGTERM);
    let out = server.wait_with_output().unwrap();
    read.unwrap_or_else(|e| panic!("{e}; server: {}", text(&out.stderr)));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("from-exec"), "{resp}");
    assert!(
        text(&out.stderr).contains(&format!("listening on unix:{}", sock.display())),
        "{}",
        text(&out.stderr)
    );
    // The command's descriptors: stdio and `ls`'s own; the listener never reaches it.
    assert!(resp.contains("0 -> /dev/null"), "{resp}");
    assert!(
        !resp.contains(&link),
        "the command inherited the listener {link}:\n{resp}"
    );
}

#[test]
fn serve_refuses_an_fd_that_is_not_a_listening_socket() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "tok\n").unwrap();
    for (addr, want) in [
        ("fd:1", "descriptors 0-2 are stdio"),
        ("fd:987", "not an open descriptor"),
        ("fd:x", "neither HOST:PORT, unix:/PATH nor fd:N"),
    ] {
        let out = Command::new(CORRAL)
            .args(["serve", "--listen", addr, "--token-file"])
            .arg(dir.path().join("token"))
            .arg("--root")
            .arg(dir.path())
            .arg("--audit-log")
            .arg(dir.path().join("audit.jsonl"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{addr}");
        assert!(
            text(&out.stderr).contains(want),
            "{addr}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn skill_prints_the_pi_skill() {
    let out = Command::new(CORRAL).args(["skill", "pi"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let expected = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../corral-exec/src/SKILL.md"),
    )
    .unwrap();
    assert_eq!(text(&out.stdout), expected);
    let front: Vec<&str> = expected.lines().take(4).collect();
    assert_eq!(front[0], "---");
    assert_eq!(front[1], "name: corral-exec");
    assert!(front[2].starts_with("description: Run builds, tests, package installs"));
    assert_eq!(front[3], "---");
    for must in ["corral exec -- cargo test", "| 124 |", "| 125 |", "| 127 |"] {
        assert!(expected.contains(must), "SKILL.md lacks {must:?}");
    }
    let out = Command::new(CORRAL)
        .args(["skill", "nosuch"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Seed 003's `execute.sh`, verbatim, against `corral serve --no-auth`. The script reads the
/// alias `test-project` from docker-compose.override.yml and connects to port 8080, so the test
/// gives it a private network namespace (only loopback, so 8080 collides with nothing) and a
/// private mount namespace where /etc/hosts maps the alias to 127.0.0.1.
#[test]
fn seed_execute_sh_works_unchanged_against_corral_serve() {
    for tool in ["unshare", "ip", "yq", "jq", "curl", "mount"] {
        if !have(tool) {
            eprintln!("skipping: {tool} is not installed (.ci/run installs it)");
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("test-project");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(
        proj.join("docker-compose.override.yml"),
        "services:\n  executor:\n    networks:\n      pi-internal:\n        aliases: [\"test-project\"]\n",
    )
    .unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost test-project\n").unwrap();
    let script = r#"
set -e
ip link set lo up
mount --bind "$HOSTS" /etc/hosts
"$CORRAL" serve --no-auth --listen 127.0.0.1:8080 --root "$PROJ" --audit-log "$DIR/audit.jsonl" 2>"$DIR/serve.log" &
srv=$!
i=0
until curl -s -o /dev/null http://test-project:8080/; do
    i=$((i+1)); [ $i -lt 400 ] || { echo "server did not start" >&2; cat "$DIR/serve.log" >&2; exit 99; }
    sleep 0.025
done
cd "$PROJ"
set +e
sh "$SCRIPT" sh -c 'echo "hello <world> & \"quotes\""; echo "to stderr" >&2; exit 3' >"$DIR/out1"
echo $? >"$DIR/rc1"
sh "$SCRIPT" ls -1 >"$DIR/out2"
echo $? >"$DIR/rc2"
kill $srv
wait $srv
"#;
    let root = nix::unistd::geteuid().is_root();
    let mut cmd = Command::new("unshare");
    if !root {
        cmd.arg("--map-root-user");
    }
    let out = cmd
        .args(["--mount", "--net", "sh", "-c", script])
        .env("HOSTS", &hosts)
        .env("CORRAL", CORRAL)
        .env("PROJ", &proj)
        .env("DIR", dir.path())
        .env("SCRIPT", fixture("execute.sh"))
        .output()
        .unwrap();
    if !out.status.success() && !root && text(&out.stderr).contains("unshare failed") {
        eprintln!(
            "skipping: cannot create user/mount/net namespaces here: {}",
            text(&out.stderr)
        );
        return;
    }
    assert!(
        out.status.success(),
        "driver failed: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    assert_eq!(read("out1"), "hello <world> & \"quotes\"\nto stderr\n");
    assert_eq!(read("rc1").trim(), "3");
    assert_eq!(read("out2"), "docker-compose.override.yml\n");
    assert_eq!(read("rc2").trim(), "0");
    let audit = read("audit.jsonl");
    // Each command: a start record written before it runs (fail closed), then its end record.
    let starts = audit
        .lines()
        .filter(|l| l.contains("\"phase\":\"start\""))
        .count();
    assert_eq!((starts, audit.lines().count()), (2, 4), "{audit}");
    assert!(audit.contains("\"exit_code\":3"));
}
