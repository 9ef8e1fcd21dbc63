//! `[secrets]` for real: a jailed shell sees only the placeholder (in `env`, in
//! /proc/self/environ, in every process's environ it can read), curl inside the jail reaches a
//! TLS mock upstream through corral's proxy and the credential gateway, and the mock receives the
//! real value in Authorization, never the placeholder. The audit log names the secret, never its
//! value.

mod e2e_support;
mod jail_support;

use std::process::Command;

use e2e_support::{certs, loopback_name, walk};
use jail_support::*;

const REAL: &str = "sk-test-REALkeyREALkeyREALkey0123456789abc";
const REAL_PART: &str = "REALkeyREALkey";

#[test]
fn jail_sees_a_placeholder_and_the_upstream_gets_the_real_key() {
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
    let m = e2e_support::header_mock(&mdir, &host);
    let port = m.port;
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nMY_API_KEY = {{ from_env = \"CALLER_REAL_KEY\", hosts = [\"{host}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    // The script never spells the real value (its text is in the audit log's start record):
    // the pattern is assembled at run time.
    let half = &REAL_PART[..REAL_PART.len() / 2];
    let script = format!(
        "A={half}; PAT=$A$A; echo PH=$MY_API_KEY; \
         if env | grep -q $PAT; then echo ENV-LEAK; else echo ENV-CLEAN; fi; \
         if grep -q $PAT /proc/self/environ; then echo PROC-LEAK; else echo PROC-CLEAN; fi; \
         if cat /proc/[0-9]*/environ 2>/dev/null | grep -q $PAT; then echo ALLPROC-LEAK; else echo ALLPROC-CLEAN; fi; \
         if grep -rqs $PAT \"$(dirname \"$SSL_CERT_FILE\")\" /tmp $HOME; then echo FILE-LEAK; else echo FILE-CLEAN; fi; \
         echo BODY=$(curl -sS https://{host}:{port}/jailed -H \"Authorization: Bearer $MY_API_KEY\"); \
         echo SYSBODY=$(env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -sS https://{host}:{port}/system -H \"Authorization: Bearer $MY_API_KEY\"); \
         echo MISDIRECTED=$(curl -s -o /dev/null -w '%{{http_code}}' https://{host}:{port}/spoof -H 'Host: evil.example' -H \"x-api-key: $MY_API_KEY\"); \
         echo END"
    );
    let mut c = w.corral();
    c.env("CALLER_REAL_KEY", REAL)
        // The gateway verifies the real host with the system store; the mock's test CA is
        // added the way a corporate CA would be.
        .env("SSL_CERT_FILE", mdir.join("ca.pem"))
        .args(["run", "--network", "proxy", "--", "sh", "-c", &script]);
    let out = run(c);
    ran(&out, "END");
    let stdout = &out.stdout;
    assert!(
        !out.both().contains(REAL_PART),
        "real value printed:\n{}",
        out.both()
    );
    let ph = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PH="))
        .expect("placeholder line")
        .to_string();
    assert!(ph.starts_with("sk-test-") && ph.len() == REAL.len(), "{ph}");
    for clean in ["ENV-CLEAN", "PROC-CLEAN", "ALLPROC-CLEAN", "FILE-CLEAN"] {
        assert!(stdout.contains(clean), "{clean} missing:\n{}", out.both());
    }
    assert!(stdout.contains("BODY=mock-ok"), "{}", out.both());
    // A program that ignores every CA variable and reads only the system bundle trusts the
    // run CA too: the bundle is overlaid on /etc/ssl/certs/ca-certificates.crt.
    assert!(stdout.contains("SYSBODY=mock-ok"), "{}", out.both());
    assert!(stdout.contains("MISDIRECTED=421"), "{}", out.both());

    let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap_or_default();
    assert!(seen.contains(&format!("Bearer {REAL}")), "mock saw: {seen}");
    assert!(
        !seen.contains(&ph),
        "the placeholder reached the upstream: {seen}"
    );
    assert!(
        !seen.contains("/spoof"),
        "a misdirected request reached the upstream: {seen}"
    );

    // The audit log names the secret and the rule, never the value.
    let state = w.home.join(".local/state/corral");
    let mut logs = String::new();
    for e in walk(&state) {
        logs.push_str(&std::fs::read_to_string(e).unwrap_or_default());
    }
    assert!(!logs.contains(REAL_PART), "real value in the audit log");
    assert!(
        logs.contains("\"secret\":\"MY_API_KEY\"") && logs.contains("injected into authorization"),
        "no gateway record in the audit log:\n{logs}"
    );
    assert!(logs.contains("does not match the destination"), "{logs}");
}

/// A websocket origin (TLS, `dir/ca.pem`) that answers an upgrade to `/ws/AT` with `101`, then
/// one text message `you sent <Authorization>` cut at byte AT into a frame and its
/// continuation, and closes.
const WS_ORIGIN: &str = r#"import http.server, ssl, struct
def frame(fin, opcode, p):
    n = len(p)
    head = bytes([(0x80 if fin else 0) | opcode])
    head += bytes([n]) if n < 126 else bytes([126]) + struct.pack(">H", n)
    return head + p
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        at = int(self.path.rsplit("/", 1)[1])
        msg = ("you sent " + self.headers.get("Authorization", "")).encode()
        self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        self.wfile.write(frame(False, 1, msg[:at]) + frame(True, 0, msg[at:]))
        self.wfile.flush()
        self.close_connection = True
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("leaf.pem", "leaf.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// The websocket client: `python3 ws.py URL TOKEN AT...` (through `$HTTPS_PROXY` when set),
/// one line per AT: `AT=<at> FRAMES=<n> MSG=<the frames' payloads joined>` and, for each frame,
/// `PIECE=<payload>`.
const WS_CLIENT: &str = r#"import os, socket, ssl, sys
url, token, ats = sys.argv[1], sys.argv[2], sys.argv[3:]
hostport = url.split("//", 1)[1]
host, port = hostport.rsplit(":", 1)
proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
def head(s):
    b = b""
    while b"\r\n\r\n" not in b:
        c = s.recv(1)
        if not c:
            break
        b += c
    return b
for at in ats:
    if proxy:
        p = proxy.split("//", 1)[-1].rstrip("/")
        ph, pp = p.rsplit(":", 1)
        raw = socket.create_connection((ph, int(pp)))
        raw.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (hostport, hostport)).encode())
        head(raw)
    else:
        raw = socket.create_connection(("127.0.0.1", int(port)))
    s = ctx.wrap_socket(raw, server_hostname=host)
    s.sendall(("GET /ws/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % (at, host, token)).encode())
    h = head(s)
    rest = b""
    while True:
        try:
            c = s.recv(65536)
        except (ssl.SSLError, OSError):
            break
        if not c:
            break
        rest += c
    pieces = []
    while len(rest) >= 2:
        n = rest[1] & 0x7f
        off = 2
        if n == 126:
            n = int.from_bytes(rest[2:4], "big"); off = 4
        pieces.append(rest[off:off + n])
        rest = rest[off + n:]
    print("AT=%s STATUS=%s FRAMES=%d MSG=%s" % (at, h.split(b" ")[1].decode() if h else "none", len(pieces), b"".join(pieces).decode(errors="replace")))
    for p in pieces:
        print("PIECE=" + p.decode(errors="replace"))
"#;

/// A key reflected by a websocket origin across a text frame and its continuation, cut at every
/// offset, reaches the jail only as its placeholder. Control: straight from the origin with the
/// real key, a cut inside the key leaves no frame holding it whole (what a frame-by-frame
/// scrubber saw), while the joined message does.
#[test]
fn a_key_reflected_across_websocket_frames_reaches_the_jail_as_its_placeholder() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    certs(&mdir, &host);
    write(&mdir.join("ws_origin.py"), WS_ORIGIN);
    write(&w.project.join("ws.py"), WS_CLIENT);
    let (child, port) = e2e_support::spawn_printing_port(
        Command::new("python3")
            .arg("ws_origin.py")
            .current_dir(&mdir),
    );
    let origin = e2e_support::Mock {
        child,
        port,
        record: mdir.join("seen.jsonl"),
    };
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nMY_API_KEY = {{ from_env = \"CALLER_REAL_KEY\", hosts = [\"{host}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    let message_len = "you sent Bearer ".len() + REAL.len();
    let ats: Vec<String> = (0..=message_len).map(|a| a.to_string()).collect();
    let url = format!("https://{host}:{port}");
    let script = format!(
        "python3 ws.py {url} \"$MY_API_KEY\" {}; echo PH=$MY_API_KEY; echo END",
        ats.join(" ")
    );
    let mut c = w.corral();
    c.env("CALLER_REAL_KEY", REAL)
        .env("SSL_CERT_FILE", mdir.join("ca.pem"))
        .args(["run", "--network", "proxy", "--", "sh", "-c", &script]);
    let out = run(c);
    ran(&out, "END");
    let all = out.both();
    assert!(!all.contains(REAL_PART), "the key reached the jail:\n{all}");
    let ph = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PH="))
        .expect("placeholder line");
    let messages: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("AT="))
        .collect();
    assert_eq!(messages.len(), ats.len(), "{all}");
    for (at, l) in ats.iter().zip(&messages) {
        let want = format!("AT={at} STATUS=101 ");
        assert!(l.starts_with(&want), "{l}\n{all}");
        assert!(
            l.ends_with(&format!("MSG=you sent Bearer {ph}")),
            "{l}\n{all}"
        );
    }

    // Control: straight from the origin, with the real key, cut inside it.
    let at = (message_len - REAL.len() / 2).to_string();
    let direct = Command::new("python3")
        .args(["ws.py", &url, REAL, &at])
        .current_dir(&w.project)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env("SSL_CERT_FILE", mdir.join("ca.pem"))
        .output()
        .unwrap();
    let direct = String::from_utf8_lossy(&direct.stdout);
    let pieces: Vec<&str> = direct
        .lines()
        .filter_map(|l| l.strip_prefix("PIECE="))
        .collect();
    assert_eq!(pieces.len(), 2, "control: {direct}");
    assert!(
        pieces.iter().all(|p| !p.contains(REAL)),
        "control: {direct}"
    );
    assert!(
        direct.contains(&format!("MSG=you sent Bearer {REAL}")),
        "control: {direct}"
    );
    drop(origin);
}
