//! Network rules by method and path (`network.allow = ["HOST/myorg/**", "GET HOST/getonly/**"]`),
//! from inside a native jail: curl in the jail talks through corral's proxy to loopback origins
//! (python, its own test CA) that record every request line they receive.
//!
//! - origin A, named with path rules: its TLS is terminated with the run's CA and each request
//!   decided; every bypass form that broke other path-filtering proxies is tried and must never
//!   reach the origin;
//! - origin B, allowed plainly: still an opaque tunnel (its certificate is the origin's), and
//!   the control: the same bypass request through it reaches its origin as sent;
//! - origin C, plain HTTP named with a path rule: decided the same way.

mod e2e_support;
mod jail_support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use e2e_support::{certs, loopback_name};
use jail_support::*;

const REAL: &str = "sk-test-PATHRULESreal0123456789";

struct Mock {
    child: Child,
    /// TLS, path-ruled; TLS, plainly allowed; plain HTTP, path-ruled.
    ports: [u16; 3],
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three origins for `host`, each appending `PORT METHOD TARGET` to `dir/seen.txt` for every
/// request it receives and answering `origin METHOD TARGET`.
fn mock(dir: &Path, host: &str) -> Mock {
    certs(dir, host);
    write(
        &dir.join("mock.py"),
        r#"import http.server, ssl, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        auth = self.headers.get("Authorization")
        with open("seen.txt", "a") as f:
            f.write("%d %s %s%s\n" % (self.server.server_address[1], self.command, self.path,
                                      " auth=" + auth if auth else ""))
        body = ("origin %s %s\n" % (self.command, self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = answer
    do_POST = answer
    def log_message(self, *a):
        pass
def server(tls):
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    if tls:
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        c.load_cert_chain("leaf.pem", "leaf.key")
        s.socket = c.wrap_socket(s.socket, server_side=True)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s.server_address[1]
ports = [server(True), server(True), server(False)]
print(" ".join(map(str, ports)), flush=True)
threading.Event().wait()
"#,
    );
    let mut child = Command::new("python3")
        .arg("mock.py")
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let p: Vec<u16> = line
        .split_whitespace()
        .map(|p| p.parse().expect("mock port"))
        .collect();
    Mock {
        child,
        ports: [p[0], p[1], p[2]],
    }
}

/// What each case printed: `NAME=CODES`.
fn codes(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("CASE "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The jail's script: each case one curl (`-w` its status codes; `000` when no HTTP answer).
fn script(host: &str, [a, b, c]: [u16; 3]) -> String {
    let ua = format!("https://{host}:{a}");
    let ub = format!("https://{host}:{b}");
    let uc = format!("http://{host}:{c}");
    let code = "curl -sS -o /dev/null -w '%{http_code}'";
    let mut cases: Vec<(&str, String)> = vec![
        ("ok", format!("{code} {ua}/myorg/ok")),
        // The refusal's body, kept for the test to read.
        (
            "secret",
            format!("curl -sS -o refused.txt -w '%{{http_code}}' {ua}/other/secret"),
        ),
        (
            "dotdot",
            format!("{code} --path-as-is {ua}/myorg/../other/secret"),
        ),
        (
            "encdot",
            format!("{code} --path-as-is {ua}/myorg/%2e%2e/other/secret"),
        ),
        (
            "encslash",
            format!("{code} --path-as-is {ua}/myorg%2F..%2Fother/secret"),
        ),
        ("dslash", format!("{code} --path-as-is {ua}//other/secret")),
        (
            "dotseg",
            format!("{code} --path-as-is {ua}/myorg/./../other"),
        ),
        ("case_up", format!("{code} --path-as-is {ua}/MyOrg/..")),
        ("case", format!("{code} {ua}/MyOrg/ok")),
        (
            "overlong",
            format!("{code} --path-as-is {ua}/myorg/%c0%ae%c0%ae/other/secret"),
        ),
        (
            "doubleenc",
            format!("{code} --path-as-is {ua}/myorg/%252e%252e/other/secret"),
        ),
        // Sent exactly as written: curl's URL parser never sees them.
        (
            "semicolon",
            format!("{code} --request-target '/myorg;/../other/secret' {ua}/"),
        ),
        (
            "dotdotsemi",
            format!("{code} --request-target '/myorg/..;/other/secret' {ua}/"),
        ),
        (
            "backslash",
            format!("{code} --request-target '/myorg\\..\\other\\secret' {ua}/"),
        ),
        (
            "absform",
            format!("{code} --request-target 'http://other.example/other/secret' {ua}/"),
        ),
        (
            "hostsni",
            format!("{code} -H 'Host: other.example' {ua}/myorg/ok"),
        ),
        // One kept-alive connection: the second request is decided on its own.
        (
            "keepalive",
            format!(
                "curl -sS -o /dev/null -o /dev/null -w '%{{http_code}},' {ua}/myorg/ok {ua}/other/secret"
            ),
        ),
        // A secret-bound host with path rules: decided first, then the placeholder swapped.
        (
            "secret_ok",
            format!("{code} -H \"Authorization: Bearer $MY_KEY\" {ua}/myorg/auth"),
        ),
        (
            "secret_refused",
            format!("{code} -H \"Authorization: Bearer $MY_KEY\" {ua}/other/auth"),
        ),
        ("get", format!("{code} {ua}/getonly/x")),
        ("post", format!("{code} -X POST -d x=1 {ua}/getonly/x")),
        (
            "socks_ok",
            format!("{code} --proxy \"socks5h://${{HTTPS_PROXY#http://}}\" {ua}/myorg/ok"),
        ),
        (
            "socks_secret",
            format!("{code} --proxy \"socks5h://${{HTTPS_PROXY#http://}}\" {ua}/other/secret"),
        ),
        // A's certificate is the run CA's, not the origin's: TLS was terminated by corral.
        (
            // (curl's exit code: 60, the certificate did not verify)
            "a_origin_ca",
            format!("curl -s -o /dev/null --cacert ./mock-ca.txt {ua}/myorg/ok; echo $?"),
        ),
        (
            "a_run_ca",
            format!("{code} --cacert \"$NODE_EXTRA_CA_CERTS\" {ua}/myorg/ok"),
        ),
        // B is an opaque tunnel: its certificate is the origin's, and the control: the bypass
        // request reaches the origin as sent.
        (
            "b_control",
            format!("{code} --cacert ./mock-ca.txt --path-as-is {ub}/myorg/../other/secret"),
        ),
        (
            "b_run_ca",
            format!("curl -s -o /dev/null --cacert \"$NODE_EXTRA_CA_CERTS\" {ub}/x; echo $?"),
        ),
        ("c_ok", format!("{code} {uc}/myorg/ok")),
        (
            "c_dotdot",
            format!("{code} --path-as-is {uc}/myorg/../other/secret"),
        ),
        ("c_secret", format!("{code} {uc}/other/secret")),
    ];
    let mut s = String::new();
    for (name, cmd) in cases.drain(..) {
        s.push_str(&format!("echo \"CASE {name}=$({cmd} 2>>curl.err)\"; "));
    }
    s.push_str("cat curl.err; echo BODY; cat refused.txt; echo END");
    s
}

#[test]
fn path_rules_decide_each_request_and_no_bypass_reaches_the_origin() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    if Command::new("openssl").arg("version").output().is_err()
        || Command::new("curl").arg("--version").output().is_err()
    {
        eprintln!("skipping: openssl or curl missing");
        return;
    }
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    let m = mock(&mdir, &host);
    let [a, b, c] = m.ports;
    // The mock's CA where curl in the jail can read it (the test's own files are private).
    let ca = std::fs::read_to_string(mdir.join("ca.pem")).unwrap();
    write(&w.project.join("mock-ca.txt"), &ca);
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\n\
             allow = [\"{host}:{a}/myorg/**\", \"GET {host}:{a}/getonly/**\", \"{host}:{b}\", \"{host}:{c}/myorg/**\"]\n\
             allow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nMY_KEY = {{ from_env = \"CALLER_KEY\", hosts = [\"{host}:{a}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    let mut cmd = w.corral();
    // The gateway verifies the real host with the system store; the mock's test CA is added
    // the way a corporate CA would be.
    cmd.env("SSL_CERT_FILE", mdir.join("ca.pem"))
        .env("CALLER_KEY", REAL)
        .args(["run", "--", "sh", "-c", &script(&host, m.ports)]);
    let out = run(cmd);
    ran(&out, "END");
    let all = out.both();
    assert!(
        !all.contains(REAL),
        "the real value reached the jail:\n{all}"
    );
    let got = codes(&out.stdout);
    let want = [
        ("ok", "200"),
        ("secret", "403"),
        ("dotdot", "403"),
        ("encdot", "403"),
        ("encslash", "400"),
        ("dslash", "403"),
        ("dotseg", "403"),
        ("case_up", "403"),
        ("case", "403"),
        ("overlong", "400"),
        ("doubleenc", "400"),
        ("semicolon", "400"),
        ("dotdotsemi", "400"),
        ("backslash", "400"),
        ("absform", "400"),
        ("hostsni", "421"),
        ("keepalive", "200,403,"),
        ("secret_ok", "200"),
        ("secret_refused", "403"),
        ("get", "200"),
        ("post", "403"),
        ("socks_ok", "200"),
        ("socks_secret", "403"),
        ("a_origin_ca", "60"),
        ("a_run_ca", "200"),
        ("b_control", "200"),
        ("b_run_ca", "60"),
        ("c_ok", "200"),
        ("c_dotdot", "403"),
        ("c_secret", "403"),
    ];
    let want: std::collections::BTreeMap<String, String> = want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want, "{all}");

    // The refusal names the host's rules and the entry that would allow the request.
    let body = all.split("BODY").nth(1).unwrap_or_default();
    assert!(
        body.contains(&format!(
            "GET /other/secret is not in network.allow for {host}:{a}"
        )) && body.contains(&format!("{host}:{a}/myorg/**"))
            && body.contains(&format!("corral run --allow 'GET {host}:{a}/other/secret'"))
            && body.contains(&format!("corral allow 'GET {host}:{a}/other/secret'")),
        "{body}"
    );

    // Nothing refused reached an origin; the control did, as sent.
    let seen = std::fs::read_to_string(mdir.join("seen.txt")).unwrap_or_default();
    let mut lines: Vec<&str> = seen.lines().collect();
    lines.sort();
    lines.dedup();
    let mut expected = vec![
        format!("{a} GET /myorg/ok"),
        format!("{a} GET /getonly/x"),
        format!("{a} GET /myorg/auth auth=Bearer {REAL}"),
        format!("{b} GET /myorg/../other/secret"),
        format!("{c} GET /myorg/ok"),
    ];
    expected.sort();
    assert_eq!(lines, expected, "{seen}");

    // The audit log has method and path for what was allowed and what was refused.
    let records = w.audit_records();
    let has = |method: &str, path: &str, decision: &str| {
        records.iter().any(|r| {
            r["kind"] == "net"
                && r["method"] == method
                && r["path"] == path
                && r["decision"] == decision
                && r["port"] == a
        })
    };
    for (method, path, decision) in [
        ("GET", "/myorg/ok", "allow"),
        ("GET", "/getonly/x", "allow"),
        ("GET", "/other/secret", "deny"),
        ("POST", "/getonly/x", "deny"),
        ("GET", "/myorg%2F..%2Fother/secret", "deny"),
    ] {
        assert!(
            has(method, path, decision),
            "no {decision} record for {method} {path}: {records:#?}"
        );
    }
}

#[test]
fn the_plan_shows_the_run_ca_for_path_rules_without_secrets() {
    let w = World::new();
    write(
        &w.project.join("corral.toml"),
        "[network]\nmode = \"proxy\"\nallow = [\"GET api.example.com/repos/myorg/**\"]\n",
    );
    w.trust_project(&[]);
    let mut c = w.corral();
    c.args(["plan", "--json"]);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        plan["network"]["allow_paths"],
        serde_json::json!(["GET api.example.com/repos/myorg/**"]),
        "{plan:#}"
    );
    assert!(
        plan["attachments"]["secrets"]["trust_dir"].is_string(),
        "no trust directory: {plan:#}"
    );
    assert!(
        plan["env"]["SSL_CERT_FILE"].is_string() && plan["env"]["NODE_EXTRA_CA_CERTS"].is_string(),
        "no CA variables: {plan:#}"
    );
}

#[test]
fn malformed_path_rules_and_deny_paths_are_refused_naming_the_entry() {
    for (entry, key, why) in [
        ("GET api.example.com/a?x=1", "allow", "query"),
        ("get api.example.com/a", "allow", "lower-case"),
        ("api.example.com/a/../b", "allow", "`..`"),
        ("api.example.com/a*/b", "allow", "whole segment"),
        (
            "api.example.com/private/**",
            "deny",
            "deny takes hosts only",
        ),
    ] {
        let w = World::new();
        write(
            &w.project.join("corral.toml"),
            &format!("[network]\nmode = \"proxy\"\n{key} = [\"{entry}\"]\n"),
        );
        let mut c = w.corral();
        c.args(["plan"]);
        let out = run(c);
        let all = out.both();
        assert_ne!(out.code, 0, "{entry}: {all}");
        assert!(
            all.contains(entry) && all.contains(why) && all.contains("corral.toml:3:"),
            "{entry}: {all}"
        );
    }
}

#[test]
fn a_container_engine_refuses_path_rules_rather_than_drop_them() {
    let w = World::new();
    write(
        &w.project.join("corral.toml"),
        "[network]\nmode = \"proxy\"\nallow = [\"GET api.example.com/repos/myorg/**\"]\n",
    );
    w.trust_project(&["--engine", "podman"]);
    let mut c = w.corral();
    c.args(["run", "--engine", "podman", "--", "true"]);
    let out = run(c);
    let all = out.both();
    assert_eq!(out.code, 125, "{all}");
    assert!(
        all.contains("GET api.example.com/repos/myorg/**") && all.contains("native backend only"),
        "{all}"
    );
}
