//! Shared by the end-to-end harness tests: a loopback host name, a test CA, the scripted mock
//! model server (tests/fixtures/mock-model/server.py) over HTTPS, and a directory walk.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::jail_support::{
    OUTSIDE_SECRET, Out, SSH_SECRET, World, corral_bin, run, same_tree, tree, write,
};

/// tests/fixtures/mock-model/server.py
const MOCK_MODEL: &str = include_str!("../fixtures/mock-model/server.py");

/// This machine's host name when it resolves to loopback only (Debian's /etc/hosts maps it to
/// 127.0.1.1): the proxy resolves it itself, and NO_PROXY (localhost) does not apply to it.
pub fn loopback_name() -> Option<String> {
    let out = Command::new("hostname").output().ok()?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if name.is_empty() || name == "localhost" {
        return None;
    }
    let addrs: Vec<_> = (name.as_str(), 443).to_socket_addrs().ok()?.collect();
    (!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())).then_some(name)
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

fn openssl(dir: &Path, args: &[&str]) {
    let st = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(st.success(), "openssl {args:?}");
}

/// A test CA and a leaf for `host` (a name or an IP literal) in `dir` (ca.pem, leaf.pem, leaf.key).
pub fn certs(dir: &Path, host: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=corral test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            &format!("/CN={host}"),
        ],
    );
    // An IP literal gets an IP SAN (what TLS clients check for `https://10.0.0.2/`).
    let san = if host.parse::<std::net::IpAddr>().is_ok() {
        "IP"
    } else {
        "DNS"
    };
    write(&dir.join("ext"), &format!("subjectAltName={san}:{host}\n"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
}

pub struct Mock {
    pub child: Child,
    pub port: u16,
    pub record: PathBuf,
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mock {
    /// Every request body the mock received, as one text: everything the model was sent.
    pub fn bodies(&self) -> String {
        let mut path = self.record.clone().into_os_string();
        path.push(".bodies");
        String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
    }

    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("mock record"))
            .collect()
    }
}

/// Start `cmd` (a test server that prints the port it listens on as its first line), its
/// stdout read for that port and its stderr dropped.
pub fn spawn_printing_port(cmd: &mut Command) -> (Child, u16) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the test server starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("the test server's port");
    (child, port)
}

/// A TLS server for `host` with its own test CA (`dir/ca.pem`, [`certs`]) on 127.0.0.1,
/// answering `mock-ok` and appending each request's path and headers as a JSON line to
/// `dir/seen.jsonl` ([`Mock::record`]).
pub fn header_mock(dir: &Path, host: &str) -> Mock {
    certs(dir, host);
    write(&dir.join("mock.py"), HEADER_MOCK);
    let (child, port) =
        spawn_printing_port(Command::new("python3").arg("mock.py").current_dir(dir));
    Mock {
        child,
        port,
        record: dir.join("seen.jsonl"),
    }
}

const HEADER_MOCK: &str = r#"import http.server, ssl, json
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        with open("seen.jsonl", "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers)}) + "\n")
        b = b"mock-ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("leaf.pem", "leaf.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

pub fn mock_model(dir: &Path, steps: &serde_json::Value) -> Mock {
    // Compiled into the test binary: the rootless pass runs a copy of it as a user who may not
    // be able to read the source tree.
    let server = dir.join("server.py");
    write(&server, MOCK_MODEL);
    write(&dir.join("steps.json"), &steps.to_string());
    let record = dir.join("seen.jsonl");
    let (child, port) = spawn_printing_port(
        Command::new("python3")
            .arg(&server)
            .args(["--script", "steps.json", "--record", "seen.jsonl"])
            .args(["--cert", "leaf.pem", "--key", "leaf.key"])
            .current_dir(dir),
    );
    Mock {
        child,
        port,
        record,
    }
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The three things every harness test makes its harness do through its shell tool: edit the
/// project, read host secrets (the SSH key in the home and a file outside the project), and reach
/// a host that `network.allow` does not list.
pub struct Attacks {
    pub edit: String,
    pub read_secrets: String,
    pub other_host: String,
    /// The project, at the same path inside the jail (for tools that want absolute paths).
    pub project: PathBuf,
    /// Review mode's second step (`review_end_to_end`): print what the harness wrote into
    /// `REVIEW_FILE` (`read=TEXT`, `rc=0`), then wait until the test opens its gate
    /// (`GATE=OPEN`, a text the command itself does not hold: aider prints its commands).
    pub read_back: String,
}

/// What the edit writes into the project's `e2e-proof.txt`.
pub const PROOF: &str = "edited-in-the-jail";
/// The host no policy allows.
pub const OTHER_HOST: &str = "not-allowed.example";

pub fn attacks(w: &World) -> Attacks {
    Attacks {
        edit: format!("echo {PROOF} > e2e-proof.txt; echo rc=$?"),
        read_secrets: format!(
            "cat ~/.ssh/id_ed25519 {}/secret.txt 2>&1; echo rc=$?",
            w.outside.display()
        ),
        other_host: format!("curl -sS -m 20 https://{OTHER_HOST}/ 2>&1; echo rc=$?"),
        project: w.project.clone(),
        // No `$(...)`: Gemini CLI's shell tool refuses it. The wait is bounded: a test that
        // fails before it opens the gate ends the run anyway.
        read_back: format!(
            "printf read=; cat {REVIEW_FILE} && echo rc=0; \
             timeout 60 sh -c 'until [ -e {}/open ]; do sleep 0.1; done' && printf 'GATE=%s\\n' OPEN",
            gate(w).display()
        ),
    }
}

/// The results of the three attacks as the harness sent them back to the model in its last
/// request (`tool_results` of the mock's record): the edit ran, both secret files were absent
/// in the jail (two `No such file`), the proxy refused the other host (403, curl failed).
pub fn judge_tool_results(last: &serde_json::Value) {
    let results: Vec<&str> = last["tool_results"]
        .as_array()
        .expect("tool_results")
        .iter()
        .map(|v| v.as_str().unwrap_or_default())
        .collect();
    assert_eq!(results.len(), 3, "{results:#?}");
    assert!(results[0].contains("rc=0"), "{}", results[0]);
    assert!(
        results[1].matches("No such file").count() == 2 && results[1].contains("rc=1"),
        "{}",
        results[1]
    );
    assert!(
        results[2].contains("403") && !results[2].contains("rc=0"),
        "{}",
        results[2]
    );
}

/// Judge the run on the host: the project file the harness wrote, no secret (the host's files
/// or the real API key) in anything the model was sent or the harness printed, and the proxy's
/// denial of the other host in the audit log.
pub fn judge(w: &World, m: &Mock, out: &Out, real_part: &str) {
    assert_eq!(
        std::fs::read_to_string(w.project.join("e2e-proof.txt"))
            .ok()
            .as_deref(),
        Some(format!("{PROOF}\n").as_str()),
        "the harness's edit of the project is not on the host:\n{}",
        out.both()
    );
    let bodies = m.bodies();
    assert!(!bodies.is_empty(), "the mock model received nothing");
    for secret in [SSH_SECRET, OUTSIDE_SECRET, real_part] {
        assert!(!bodies.contains(secret), "the model was sent {secret}");
        assert!(!out.both().contains(secret), "the harness printed {secret}");
    }
    let records = w.audit_records();
    // What else the harness tried to reach (shown with --nocapture).
    for r in records
        .iter()
        .filter(|r| r["kind"] == "net" && r["decision"] == "deny")
    {
        eprintln!("denied: {r}");
    }
    let denied: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "net" && r["decision"] == "deny" && r["host"] == OTHER_HOST)
        .collect();
    assert!(
        !denied.is_empty(),
        "no denial of {OTHER_HOST} in the audit log: {records:#?}"
    );
    let mut logs = String::new();
    for f in walk(&w.home.join(".local/state/corral")) {
        logs.push_str(&std::fs::read_to_string(f).unwrap_or_default());
    }
    assert!(!logs.contains(real_part), "real value in the audit log");
}

/// How long one harness run may take; `timeout` ends corral (and the jail with it) after that.
const HARNESS_DEADLINE: &str = "180";

/// `corral run PROFILE --network proxy RUN_ARGS -- ARGV` in the world's project, with a clean
/// environment plus `env`; the gateway trusts the mock's CA in `mdir`.
pub fn run_harness(
    w: &World,
    profile: &str,
    run_args: &[&str],
    argv: &[&str],
    env: &[(&str, String)],
    mdir: &Path,
) -> Out {
    let mut c = Command::new("timeout");
    c.arg(HARNESS_DEADLINE)
        .arg(corral_bin())
        .args(["run", profile, "--network", "proxy"])
        .args(run_args)
        .arg("--")
        .args(argv)
        .current_dir(&w.project)
        .env_clear()
        .env("HOME", &w.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", std::env::temp_dir())
        .env("SSL_CERT_FILE", mdir.join("ca.pem"));
    for (k, v) in env {
        c.env(k, v);
    }
    run(c)
}

/// A world whose project allows the mock model (at `host`, scripted by `script` from the
/// world's attacks) through the proxy and declares `secret` (read from the caller's
/// `CALLER_KEY`) for the mock's host, trusted. Returns the world, the mock's directory (its CA)
/// and the running mock.
pub fn world_with_mock(
    host: &str,
    script: impl FnOnce(&Attacks) -> serde_json::Value,
    secret: &str,
) -> (World, PathBuf, Mock) {
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    certs(&mdir, host);
    let m = mock_model(&mdir, &script(&attacks(&w)));
    let port = m.port;
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\n{secret} = {{ from_env = \"CALLER_KEY\", hosts = [\"{host}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    (w, mdir, m)
}

/// The command the profile runs (`corral plan PROFILE --json`: argv[0] resolved on PATH and
/// the profile's own arguments), for a test that appends the harness's non-interactive flags.
pub fn profile_command(w: &World, profile: &str) -> Vec<String> {
    let mut c = w.corral();
    c.args(["plan", profile, "--json"]);
    let out = run(c);
    assert_eq!(out.code, 0, "corral plan {profile} failed:\n{}", out.both());
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).expect("plan JSON");
    plan["command"]
        .as_array()
        .expect("plan.command")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The file each harness writes into the project in review mode, and the line it writes.
pub const REVIEW_FILE: &str = "review-proof.txt";
pub const REVIEW_TEXT: &str = "written-in-review-mode";

/// A directory of the test's, outside the project, read-only in the jail: the harness's
/// read-back step waits there until the test has looked at the host during the run.
fn gate(w: &World) -> PathBuf {
    w.root.join("gate")
}

/// Review mode for the world's runs (`filesystem.review = true` in the user's corral config,
/// which leaves the trusted project policy as it is) and the gate, bound read-only.
pub fn review_mode(w: &World) {
    std::fs::create_dir_all(gate(w)).unwrap();
    let user_config = w.home.join(".config/corral/config.toml");
    let gate = format!("\"{}\"", gate(w).display());
    let mut config = std::fs::read_to_string(&user_config).unwrap();
    config = if config.contains("read_only = [") {
        config.replacen("read_only = [", &format!("read_only = [{gate}, "), 1)
    } else {
        config.replacen(
            "[filesystem]\n",
            &format!("[filesystem]\nread_only = [{gate}]\n"),
            1,
        )
    };
    config = config.replacen("[filesystem]\n", "[filesystem]\nreview = true\n", 1);
    write(&user_config, &config);
}

/// The harness's read-back step saw its own write, and was still running when the test
/// opened the gate, so the test looked at the host during the run (the result of
/// `Attacks::read_back`).
#[track_caller]
pub fn saw_own_write(result: &str) {
    // Some harnesses send the output as a JSON text (newlines escaped).
    let result = result.replace("\\n", "\n");
    assert!(
        result.contains(&format!("read={REVIEW_TEXT}\nrc=0")),
        "the harness did not read back its own write:\n{result}"
    );
    assert!(
        result.contains("GATE=OPEN"),
        "the harness was not held at the gate:\n{result}"
    );
}

fn corral_in(w: &World, args: &[&str]) -> Out {
    let mut c = w.corral();
    c.args(args);
    run(c)
}

/// Review mode end to end around `harness` (the harness's `corral run` in a `review_mode`
/// world, run on a thread of its own): the harness writes `REVIEW_FILE` and reads it back
/// (`Attacks::read_back`), waiting at the gate. Once `corral diff --stat` shows the new file
/// (the run is at the gate or before it, so still going), the host's project is as it was;
/// the gate opens; after the run the host's project is still as it was, `corral diff --stat`
/// shows the file, `corral accept` applies the change set and the host has the file. Returns
/// the run's output for the harness's own checks.
pub fn review_end_to_end(w: &World, harness: impl FnOnce() -> Out + Send) -> Out {
    let before = tree(&w.project);
    let added = format!("A {REVIEW_FILE}");
    let out = std::thread::scope(|s| {
        let run = s.spawn(harness);
        loop {
            if run.is_finished() {
                let out = run.join().unwrap();
                panic!(
                    "the run ended before corral diff showed {REVIEW_FILE}:\n{}",
                    out.both()
                );
            }
            let during = corral_in(w, &["diff", "--stat"]);
            if during.code == 0 && during.stdout.contains(&added) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        same_tree(&before, &tree(&w.project), "during the run");
        write(&gate(w).join("open"), "");
        run.join().unwrap()
    });
    assert_eq!(out.code, 0, "the review run failed:\n{}", out.both());
    assert!(
        out.stderr.contains("held, the project is unchanged"),
        "{}",
        out.stderr
    );
    same_tree(&before, &tree(&w.project), "after the run");
    let stat = corral_in(w, &["diff", "--stat"]);
    assert_eq!(stat.code, 0, "{}", stat.both());
    assert!(stat.stdout.contains(&added), "{}", stat.both());
    let accepted = corral_in(w, &["accept"]);
    assert_eq!(accepted.code, 0, "{}", accepted.both());
    assert_eq!(
        std::fs::read_to_string(w.project.join(REVIEW_FILE))
            .ok()
            .as_deref(),
        Some(format!("{REVIEW_TEXT}\n").as_str()),
        "the accepted write is not on the host"
    );
    out
}
