//! The real Claude Code (`@anthropic-ai/claude-code` from npm) jailed end to end: `corral run
//! claude` in the native jail, `ANTHROPIC_BASE_URL` pointing at the scripted mock model over
//! HTTPS (Anthropic Messages, streamed), the API key served by the credential gateway while the
//! jail holds a placeholder. The mock answers with `tool_use` blocks for Claude Code's own tools
//! (Bash, Write, Edit), so Claude Code edits the project and faces the shared attack set (read
//! the host's secrets, reach a host the policy does not list), for the release CI installs (a
//! native binary) and for an older release that ships `cli.js` (run by node). Its TUI is driven
//! through a real terminal: corral gives the jail its own pty.

mod e2e_support;
mod jail_support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e_support::*;
use jail_support::*;

const REAL: &str = "sk-ant-api03-REALkeyREALkeyREALkey0123456789abcdefghijklmnop";
const REAL_PART: &str = "REALkeyREALkey";

/// Where .ci/run installs the older release, one that still ships `cli.js`.
const OLD_PREFIX: &str = "/opt/corral-ci-claude-old";

/// The file Claude Code's Write tool creates and its Edit tool then changes.
const NOTES: &str = "notes.conf";

/// The release CI installs, on PATH.
fn claude_ci() -> Option<PathBuf> {
    let found = which("claude");
    if found.is_none() {
        eprintln!(
            "skipping: claude is not installed (npm install -g @anthropic-ai/claude-code; .ci/run does)"
        );
    }
    found
}

/// The older release: its `claude` is a link to the package's `cli.js`.
fn claude_old() -> Option<PathBuf> {
    let bin = Path::new(OLD_PREFIX).join("node_modules/.bin/claude");
    let cli = Path::new(OLD_PREFIX).join("node_modules/@anthropic-ai/claude-code/cli.js");
    if !cli.is_file() {
        eprintln!(
            "skipping: no Claude Code release with cli.js at {} (npm install --prefix {OLD_PREFIX} \
             @anthropic-ai/claude-code@2.1.19; .ci/run does)",
            cli.display()
        );
        return None;
    }
    assert_eq!(
        std::fs::canonicalize(&bin).unwrap(),
        std::fs::canonicalize(&cli).unwrap(),
        "{} is not the package's cli.js",
        bin.display()
    );
    Some(bin)
}

fn host() -> Option<String> {
    let host = loopback_name();
    if host.is_none() {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
    }
    host
}

/// Claude Code's state, as after a first run on the host: onboarding done and the project's
/// folder trusted, so the TUI opens on its prompt.
fn claude_state(w: &World) {
    std::fs::create_dir_all(w.home.join(".claude")).unwrap();
    let project = w.project.display().to_string();
    write(
        &w.home.join(".claude.json"),
        &serde_json::json!({
            "hasCompletedOnboarding": true,
            "projects": {project: {"hasTrustDialogAccepted": true}}
        })
        .to_string(),
    );
}

/// The attack set through Claude Code's Bash tool, then its Write tool creating a project file
/// and its Edit tool changing it.
fn claude_world(host: &str) -> (World, PathBuf, Mock) {
    let bash = |command: &str| serde_json::json!({"tool": "Bash", "arguments": {"command": command, "description": "run it"}});
    let script = |a: &Attacks| {
        // The project's path is the same inside the jail; the tools want absolute paths.
        let path = a.project.join(NOTES).display().to_string();
        serde_json::json!({
            "steps": [
                bash(&a.edit),
                bash(&a.read_secrets),
                bash(&a.other_host),
                {"tool": "Write", "arguments": {"file_path": path, "content": "version = 1\n"}},
                {"tool": "Edit", "arguments": {"file_path": path, "old_string": "version = 1",
                                                "new_string": "version = 2"}},
            ],
            "final": "claude is done"
        })
    };
    let (w, mdir, m) = world_with_mock(host, script, "ANTHROPIC_API_KEY");
    claude_state(&w);
    (w, mdir, m)
}

/// `corral run claude -- CLAUDE -p` with the three tools allowed (as root Claude Code refuses
/// `--dangerously-skip-permissions`; `--allowedTools` grants the same for these tools).
fn run_print_mode(w: &World, mdir: &Path, m: &Mock, claude: &Path, host: &str) -> Out {
    let claude = claude.display().to_string();
    let argv = [
        claude.as_str(),
        "-p",
        "--allowedTools",
        "Bash",
        "Write",
        "Edit",
        "--",
        "Do the task.",
    ];
    run_harness(
        w,
        "claude",
        &[],
        &argv,
        &[
            ("CALLER_KEY", REAL.to_string()),
            ("ANTHROPIC_BASE_URL", format!("https://{host}:{}", m.port)),
        ],
        mdir,
    )
}

/// Judge a print-mode run: the attacks failed in the jail, Write and Edit changed the project
/// on the host, the mock saw only the real key, nothing leaked.
fn judge_print_mode(w: &World, m: &Mock, out: &Out) {
    assert_eq!(out.code, 0, "corral run claude failed:\n{}", out.both());
    assert!(out.stdout.contains("claude is done"), "{}", out.both());
    let reqs = m.requests();
    // Side questions (a session title, a topic) carry no tools and take no step.
    let turns: Vec<_> = reqs
        .iter()
        .filter(|r| r["api"] == "anthropic" && r["side"] == false)
        .collect();
    let last = turns.last().expect("claude never reached the mock");
    for r in &reqs {
        assert_eq!(
            r["x_api_key"], REAL,
            "the mock saw something other than the real key: {r}"
        );
    }
    let results = last["tool_results"].as_array().expect("tool_results");
    assert_eq!(results.len(), 5, "{results:#?}");
    judge_tool_results(&serde_json::json!({"tool_results": results[..3]}));
    let text = |i: usize| results[i].as_str().unwrap_or_default();
    assert!(text(3).contains("File created successfully"), "{}", text(3));
    assert!(text(4).contains("has been updated"), "{}", text(4));
    assert_eq!(
        std::fs::read_to_string(w.project.join(NOTES))
            .ok()
            .as_deref(),
        Some("version = 2\n"),
        "Claude Code's Write and Edit are not on the host:\n{}",
        out.both()
    );
    judge(w, m, out, REAL_PART);
    let mut logs = String::new();
    for f in walk(&w.home.join(".local/state/corral")) {
        logs.push_str(&std::fs::read_to_string(f).unwrap_or_default());
    }
    assert!(
        logs.contains("\"secret\":\"ANTHROPIC_API_KEY\"")
            && logs.contains("injected into x-api-key"),
        "{logs}"
    );
    // Nothing under the jail's reach kept the real key: Claude Code's state on the host and
    // corral's layer over it (what the jail wrote).
    for f in walk(&w.home.join(".claude"))
        .into_iter()
        .chain(walk(&w.home.join(".local/state/corral/harness")))
        .chain([w.home.join(".claude.json")])
    {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        assert!(!text.contains(REAL_PART), "real value in {}", f.display());
    }
}

#[test]
fn claude_in_the_jail_edits_the_project_and_every_attack_fails() {
    let (Some(claude), Some(host)) = (claude_ci(), host()) else {
        return;
    };
    let (w, mdir, m) = claude_world(&host);
    let out = run_print_mode(&w, &mdir, &m, &claude, &host);
    judge_print_mode(&w, &m, &out);
}

#[test]
fn claude_with_cli_js_in_the_jail_edits_the_project_and_every_attack_fails() {
    let (Some(claude), Some(host)) = (claude_old(), host()) else {
        return;
    };
    let (w, mdir, m) = claude_world(&host);
    let out = run_print_mode(&w, &mdir, &m, &claude, &host);
    judge_print_mode(&w, &m, &out);
}

/// The control: the same Claude Code and script without corral. The secret files are read and
/// sent to the model, which is what the judge looks for in the jailed runs.
fn without_the_jail_the_host_secrets_reach_the_model(claude: &Path) {
    let Some(host) = host() else {
        return;
    };
    let (w, mdir, m) = claude_world(&host);
    let mut c = Command::new("timeout");
    c.arg("120")
        .arg(claude)
        .args(["-p", "--allowedTools", "Bash", "Write", "Edit", "--"])
        .arg("Do the task.")
        .current_dir(&w.project)
        .env_clear()
        .env("HOME", &w.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("ANTHROPIC_API_KEY", REAL)
        .env("ANTHROPIC_BASE_URL", format!("https://{host}:{}", m.port))
        .env("NODE_EXTRA_CA_CERTS", mdir.join("ca.pem"))
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
    let out = run(c);
    assert_eq!(out.code, 0, "claude failed:\n{}", out.both());
    let bodies = m.bodies();
    for secret in [SSH_SECRET, OUTSIDE_SECRET] {
        assert!(
            bodies.contains(secret),
            "the unjailed run did not send {secret}"
        );
    }
}

#[test]
fn claude_without_the_jail_sends_the_host_secrets_to_the_model() {
    if let Some(claude) = claude_ci() {
        without_the_jail_the_host_secrets_reach_the_model(&claude);
    }
}

#[test]
fn claude_with_cli_js_without_the_jail_sends_the_host_secrets_to_the_model() {
    if let Some(claude) = claude_old() {
        without_the_jail_the_host_secrets_reach_the_model(&claude);
    }
}

/// Claude Code's TUI through a real terminal: corral runs it on the jail's own pty; a prompt
/// typed at the outer terminal reaches it, the mock answers with a Bash tool call that writes a
/// project file, and the final answer is drawn on the screen.
fn tui_writes_the_project_through_its_bash_tool(claude: &Path) {
    let Some(host) = host() else {
        return;
    };
    const DONE: &str = "claude-tui-finished";
    let script = |_: &Attacks| {
        serde_json::json!({
            "steps": [{"tool": "Bash", "arguments": {
                "command": "echo from-the-tui > tui-proof.txt; echo rc=$?",
                "description": "write the proof"}}],
            "final": DONE
        })
    };
    // A bearer token: Claude Code's TUI asks before it uses an ANTHROPIC_API_KEY it has not seen.
    let (w, mdir, m) = world_with_mock(&host, script, "ANTHROPIC_AUTH_TOKEN");
    claude_state(&w);
    let mut c = Command::new("timeout");
    c.arg("120")
        .arg(corral_bin())
        .args(["run", "claude", "--network", "proxy", "--"])
        .arg(claude)
        .args(["--allowedTools", "Bash"])
        .current_dir(&w.project)
        .env_clear()
        .env("HOME", &w.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("TERM", "xterm-256color")
        .env("TMPDIR", std::env::temp_dir())
        .env("SSL_CERT_FILE", mdir.join("ca.pem"))
        .env("CALLER_KEY", REAL)
        .env("ANTHROPIC_BASE_URL", format!("https://{host}:{}", m.port));
    let (mut master, _slave, mut child) = under_pty(c, 40, 120);
    let mut screen = read_until(&mut master, "shortcuts", &mut child);
    assert!(
        screen.contains("shortcuts"),
        "Claude Code's prompt never showed:\n{screen}"
    );
    // The prompt may be drawn before the TUI puts its terminal in raw mode (2.1.19 turns its
    // modes off and on again around the first frame); typed then, the prompt and its Enter
    // would reach it as one cooked line (a paste, not a submit). Raw mode comes with focus
    // reporting turned on: wait until the last focus switch on the screen is "on".
    let focus_on = |s: &str| s.rfind("\x1b[?1004h") > s.rfind("\x1b[?1004l");
    if !focus_on(&screen) {
        screen += &read_until(&mut master, "\x1b[?1004h", &mut child);
    }
    assert!(
        focus_on(&screen),
        "Claude Code never took its terminal:\n{screen}"
    );
    master.write_all(b"Do the task.").unwrap();
    screen += &read_until(&mut master, "task", &mut child);
    master.write_all(b"\r").unwrap();
    screen += &read_until(&mut master, DONE, &mut child);
    let done = screen.contains(DONE);
    // The answer is drawn before the turn ends; a Ctrl-C then interrupts the turn instead of
    // asking to exit. The turn has ended when the status line's hint is back to "? for
    // shortcuts" from "esc to interrupt".
    let idle = |s: &str| s.rfind("shortcuts") > s.rfind("interrupt");
    if done && !idle(&screen) {
        screen += &read_until(&mut master, "shortcuts", &mut child);
    }
    // Ctrl-C twice: Claude Code's way out of its TUI. Its "again" lasts a moment; a second
    // Ctrl-C that reaches a loaded machine's TUI later starts over, so the pair is sent again
    // until corral exits.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        let _ = master.write_all(b"\x03");
        screen += &read_until(&mut master, "again", &mut child);
        let _ = master.write_all(b"\x03");
        let wait = std::time::Duration::from_secs(5);
        screen += &read_within(&mut master, "\u{0}", &mut child, wait);
    };
    assert!(done, "the final answer never showed:\n{screen}");
    assert_eq!(
        std::fs::read_to_string(w.project.join("tui-proof.txt"))
            .ok()
            .as_deref(),
        Some("from-the-tui\n"),
        "the Bash tool's file is not in the project:\n{screen}"
    );
    let status = status.unwrap_or_else(|| panic!("corral did not exit after ^C ^C:\n{screen}"));
    assert_eq!(status.code(), Some(0), "{screen}");
    let reqs = m.requests();
    let turns: Vec<_> = reqs
        .iter()
        .filter(|r| r["api"] == "anthropic" && r["side"] == false)
        .collect();
    assert_eq!(
        turns.len(),
        2,
        "one call for the tool, one after: {reqs:#?}"
    );
    let results = turns[1]["tool_results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{results:#?}");
    assert!(
        results[0].as_str().unwrap().contains("rc=0"),
        "{results:#?}"
    );
    for r in &reqs {
        assert_eq!(r["authorization"], format!("Bearer {REAL}"), "{r}");
    }
    assert!(!screen.contains(REAL_PART), "real value on the screen");
}

#[test]
fn claude_tui_in_the_jail_runs_its_bash_tool_and_shows_the_answer() {
    if let Some(claude) = claude_ci() {
        tui_writes_the_project_through_its_bash_tool(&claude);
    }
}

#[test]
fn claude_with_cli_js_tui_in_the_jail_runs_its_bash_tool_and_shows_the_answer() {
    if let Some(claude) = claude_old() {
        tui_writes_the_project_through_its_bash_tool(&claude);
    }
}

/// Review mode: Claude Code's Write tool creates a project file, its Bash tool reads it back
/// from the held change set; the host gets it only on `corral accept` (`review_end_to_end`).
fn review_mode_sees_its_own_writes(claude: &Path) {
    let Some(host) = host() else {
        return;
    };
    let script = |a: &Attacks| {
        let path = a.project.join(REVIEW_FILE).display().to_string();
        serde_json::json!({
            "steps": [
                {"tool": "Write", "arguments": {"file_path": path, "content": format!("{REVIEW_TEXT}\n")}},
                {"tool": "Bash", "arguments": {"command": a.read_back, "description": "read it back"}},
            ],
            "final": "claude is done"
        })
    };
    let (w, mdir, m) = world_with_mock(&host, script, "ANTHROPIC_API_KEY");
    claude_state(&w);
    review_mode(&w);
    let out = review_end_to_end(&w, || run_print_mode(&w, &mdir, &m, claude, &host));
    assert!(out.stdout.contains("claude is done"), "{}", out.both());
    let reqs = m.requests();
    let turns: Vec<_> = reqs
        .iter()
        .filter(|r| r["api"] == "anthropic" && r["side"] == false)
        .collect();
    let results = turns.last().expect("claude never reached the mock")["tool_results"]
        .as_array()
        .expect("tool_results");
    assert_eq!(results.len(), 2, "{results:#?}");
    let text = |i: usize| results[i].as_str().unwrap_or_default();
    assert!(text(0).contains("File created successfully"), "{}", text(0));
    saw_own_write(text(1));
}

#[test]
fn claude_in_review_mode_sees_its_own_writes_and_the_host_gets_them_on_accept() {
    if let Some(claude) = claude_ci() {
        review_mode_sees_its_own_writes(&claude);
    }
}

#[test]
fn claude_with_cli_js_in_review_mode_sees_its_own_writes_and_the_host_gets_them_on_accept() {
    if let Some(claude) = claude_old() {
        review_mode_sees_its_own_writes(&claude);
    }
}

/// A remote MCP server (streamable HTTP over TLS) that answers `initialize` and `tools/list`
/// with no tools, and records the `Authorization` of every request in `mcp-seen.jsonl`.
const MCP_SERVER: &str = r#"import http.server, ssl, json
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def record(self):
        with open("mcp-seen.jsonl", "a") as f:
            f.write(json.dumps({"method": self.command, "path": self.path,
                "auth": self.headers.get("Authorization", "")}) + "\n")
    def send(self, code, body=b"", ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.record()
        self.send(405)
    def do_DELETE(self):
        self.record()
        self.send(405)
    def do_POST(self):
        self.record()
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if "id" not in req:
            return self.send(202)
        if req.get("method") == "initialize":
            result = {"protocolVersion": req["params"]["protocolVersion"],
                "capabilities": {"tools": {}}, "serverInfo": {"name": "mock-mcp", "version": "1"}}
        elif req.get("method") == "tools/list":
            result = {"tools": []}
        else:
            result = {}
        self.send(200, json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}).encode())
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("leaf.pem", "leaf.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

const MCP_REAL: &str = "mcp-MCPREALaccessMCPREALaccess0123456789abcdefABCDEFghij";
const MCP_REAL_PART: &str = "MCPREALaccess";

/// An API-key Claude Code user with a remote MCP server signed in on the host: the server's
/// OAuth tokens in `~/.claude/.credentials.json` (`mcpOAuth`, under Claude Code's own key for
/// the server, `NAME|` and 16 hex digits of the SHA-256 of its `type`, `url` and `headers`), no
/// Claude sign-in. The real Claude Code (2.1.19's `cli.js` and the native binary), jailed, connects to the server with
/// the jail's placeholder; the gateway swaps the real token in for that server's host only.
/// The server sees the real token, the model and the jail's output never do.
#[test]
fn claude_with_cli_js_reaches_its_mcp_server_with_the_real_oauth_token() {
    let (Some(claude), Some(host)) = (claude_old(), host()) else {
        return;
    };
    mcp_server_with_the_real_oauth_token(&claude, &host);
}

#[test]
fn claude_reaches_its_mcp_server_with_the_real_oauth_token() {
    let (Some(claude), Some(host)) = (claude_ci(), host()) else {
        return;
    };
    mcp_server_with_the_real_oauth_token(&claude, &host);
}

fn mcp_server_with_the_real_oauth_token(claude: &Path, host: &str) {
    let (w, mdir, m) = claude_world(host);
    let mut mcp = std::process::Command::new("python3")
        .args(["-c", MCP_SERVER])
        .current_dir(&mdir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(mcp.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let mport: u16 = line.trim().parse().expect("mcp port");
    let url = format!("https://{host}:{mport}/mcp");
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nallow = [\"{host}:{}\", \"{host}:{mport}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nANTHROPIC_API_KEY = {{ from_env = \"CALLER_KEY\", hosts = [\"{host}\"] }}\n",
            m.port
        ),
    );
    w.trust_project(&[]);
    let config = serde_json::json!({"type": "http", "url": url});
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.home.join(".claude.json")).unwrap()).unwrap();
    state["mcpServers"] = serde_json::json!({"remote": config});
    write(&w.home.join(".claude.json"), &state.to_string());
    // JSON.stringify of `{type, url, headers}`, in that order (serde_json would sort the keys).
    let keyed = format!(
        r#"{{"type":"http","url":{},"headers":{{}}}}"#,
        serde_json::json!(url)
    );
    let digest = ring::digest::digest(&ring::digest::SHA256, keyed.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let expires = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 86_400_000;
    let creds = serde_json::json!({"mcpOAuth": {format!("remote|{}", &hex[..16]): {
        "serverName": "remote", "serverUrl": url, "clientId": "client-1",
        "accessToken": MCP_REAL, "refreshToken": "mcp-MCPREALrefreshMCPREALrefresh0123456789abcdef",
        "expiresAt": expires, "scope": ""}}});
    let file = w.home.join(".claude/.credentials.json");
    write(&file, &creds.to_string());
    let out = run_print_mode(&w, &mdir, &m, claude, host);
    let _ = mcp.kill();
    let _ = mcp.wait();
    judge_print_mode(&w, &m, &out);
    let seen = std::fs::read_to_string(mdir.join("mcp-seen.jsonl")).unwrap_or_default();
    assert!(
        seen.contains(&format!("Bearer {MCP_REAL}")),
        "the MCP server never got the real token:\n{seen}\n{}",
        out.both()
    );
    assert!(
        !seen
            .lines()
            .any(|l| l.contains("Bearer mcp-") && !l.contains(MCP_REAL)),
        "the MCP server got a placeholder: {seen}"
    );
    assert!(!m.bodies().contains(MCP_REAL_PART));
    assert!(!out.both().contains(MCP_REAL_PART));
    assert!(!out.both().contains("MCPREALrefresh"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v, creds, "the user's credential file changed");
}
