//! "The real secret never comes back to the jail", from inside a native jail: curl in the jail
//! talks through corral's proxy and credential gateway to a TLS origin (python, its own test
//! CA) that reflects every request (its Authorization in a response header, its whole head in
//! the body, Content-Length or chunked), through CONNECT and through SOCKS5; TRACE is tried too.
//! The origin receives the real value; the jail only ever sees its placeholder.

mod e2e_support;
mod jail_support;

use std::path::Path;
use std::process::{Child, Command};

use base64::Engine as _;
use e2e_support::{certs, loopback_name};
use jail_support::*;

const REAL: &str = "sk-test-REFLECTrealREFLECTrealREFLECT012345";
const REAL_PART: &str = "REFLECTrealREFLECTreal";

struct Mock {
    child: Child,
    port: u16,
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A reflecting TLS origin for `host`; each request's method and head are appended to
/// `dir/seen.txt`.
fn mock(dir: &Path, host: &str) -> Mock {
    certs(dir, host);
    write(
        &dir.join("mock.py"),
        r#"import http.server, ssl
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reflect(self):
        head = (self.requestline + "\r\n" + str(self.headers)).encode()
        with open("seen.txt", "ab") as f:
            f.write(head)
        self.send_response(200)
        self.send_header("X-Echo-Authorization", self.headers.get("Authorization", ""))
        if self.path.startswith("/chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(head), 5):
                piece = head[i:i + 5]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(head)))
            self.end_headers()
            self.wfile.write(head)
    do_GET = reflect
    do_TRACE = reflect
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("leaf.pem", "leaf.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#,
    );
    let (child, port) =
        e2e_support::spawn_printing_port(Command::new("python3").arg("mock.py").current_dir(dir));
    Mock { child, port }
}

#[test]
fn a_reflecting_origin_never_shows_the_jail_the_real_value() {
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
    let port = m.port;
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nMY_API_KEY = {{ from_env = \"CALLER_REAL_KEY\", hosts = [\"{host}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    let url = format!("https://{host}:{port}");
    // Every answer is printed in full (headers too) for the test to search.
    let script = format!(
        "echo PH=$MY_API_KEY; \
         curl -sS -i {url}/cl -H \"Authorization: Bearer $MY_API_KEY\"; echo; \
         curl -sS -i {url}/chunked -H \"Authorization: Bearer $MY_API_KEY\"; echo; \
         curl -sS -i -u \"user:$MY_API_KEY\" {url}/basic; echo; \
         echo TRACE=$(curl -sS -o /dev/null -w '%{{http_code}}' -X TRACE {url}/trace -H \"Authorization: Bearer $MY_API_KEY\"); \
         curl -sS -i --proxy \"socks5h://${{HTTPS_PROXY#http://}}\" {url}/socks -H \"Authorization: Bearer $MY_API_KEY\"; echo; \
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
    let all = out.both();
    let real_basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{REAL}"));
    assert!(!all.contains(REAL_PART), "the real value came back:\n{all}");
    assert!(
        !all.contains(&real_basic),
        "the real Basic credential came back:\n{all}"
    );
    let ph = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PH="))
        .expect("placeholder line")
        .to_string();
    let ph_basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{ph}"));
    // Reflected as the jail sent it, in the header and the body, both framings and SOCKS5.
    for path in ["/cl", "/chunked", "/socks"] {
        let answer = all
            .split(&format!("GET {path} HTTP/1.1"))
            .nth(1)
            .unwrap_or_else(|| panic!("no reflected {path}:\n{all}"))
            .split("HTTP/1.1 2")
            .next()
            .unwrap_or_default();
        assert!(answer.contains(&format!("Bearer {ph}")), "{path}:\n{all}");
    }
    assert!(
        all.contains(&format!("x-echo-authorization: Basic {ph_basic}"))
            || all.contains(&format!("X-Echo-Authorization: Basic {ph_basic}")),
        "{all}"
    );
    assert!(all.contains("TRACE=405"), "{all}");

    let seen = std::fs::read_to_string(mdir.join("seen.txt")).unwrap_or_default();
    for path in ["/cl", "/chunked", "/socks"] {
        let req = seen
            .split(&format!("GET {path} "))
            .nth(1)
            .unwrap_or_else(|| panic!("{path} did not reach the origin: {seen}"));
        assert!(req.contains(&format!("Bearer {REAL}")), "{path}: {seen}");
    }
    assert!(seen.contains(&real_basic), "{seen}");
    assert!(!seen.contains("TRACE"), "TRACE reached the origin: {seen}");
}
