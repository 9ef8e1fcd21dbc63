//! Real tools from inside the native jail (network mode `proxy`, the proxy variables corral
//! sets, nothing else):
//! - `git clone` over HTTPS reaches a git server (smart HTTP, `git http-backend`) that the test
//!   runs in a network namespace of its own (root), or on this machine's loopback name (the
//!   rootless pass, which may not create namespaces); the same server on a port the policy does
//!   not name, and a host not allowed, get the proxy's 403.
//! - `curl`, `pip download` and `npm view` reach the package registries (pypi.org,
//!   files.pythonhosted.org, registry.npmjs.org) through the proxy; the same tools fail for hosts
//!   not allowed; a direct TCP connection to the registry's address and DNS queries fail.
//!
//! Every decision is checked in the project's audit log, not only the tools' exit codes.

mod e2e_support;
mod jail_support;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use e2e_support::{certs, loopback_name, which};
use jail_support::*;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A git smart-HTTP server over TLS: `git http-backend` as a CGI behind Python's http.server.
/// argv: PROJECT_ROOT BIND_ADDRESS CERT KEY RECORD. Listens on two ports of BIND_ADDRESS and
/// prints them on one line once both listen; every request is appended to RECORD as
/// "PORT METHOD PATH".
const GIT_SERVER: &str = r#"
import http.server, os, ssl, subprocess, sys, threading
root, addr, cert, key, record = sys.argv[1:6]
lock = threading.Lock()

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A client that stalls (in the TLS handshake or mid-request) costs its own thread at most
    # this long, never the accepting thread.
    timeout = 30
    def setup(self):
        self.request.settimeout(self.timeout)
        self.request.do_handshake()
        super().setup()
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.cgi()
    def do_POST(self):
        self.cgi()
    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))
    def cgi(self):
        with lock, open(record, "a") as f:
            f.write("%d %s %s\n" % (self.server.server_address[1], self.command, self.path))
        path, _, query = self.path.partition("?")
        data = self.body()
        env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL="1",
                   PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""),
                   CONTENT_LENGTH=str(len(data)), REMOTE_ADDR=self.client_address[0])
        for h in ("Git-Protocol", "Content-Encoding"):
            if h in self.headers:
                env["HTTP_" + h.upper().replace("-", "_")] = self.headers[h]
        p = subprocess.run(["git", "http-backend"], input=data, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        head, sep, rest = p.stdout.partition(b"\r\n\r\n")
        if not sep:
            self.send_error(500, "git http-backend exited %d" % p.returncode)
            return
        status, fields = 200, []
        for line in head.decode().split("\r\n"):
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                fields.append((k, v.strip()))
        self.send_response(status)
        for k, v in fields:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
ports = []
for _ in range(2):
    s = http.server.ThreadingHTTPServer((addr, 0), H)
    s.daemon_threads = True
    # The handshake runs in the request's thread (H.setup), with its timeout.
    s.socket = ctx.wrap_socket(s.socket, server_side=True, do_handshake_on_connect=False)
    ports.append(s.server_address[1])
    threading.Thread(target=s.serve_forever, daemon=True).start()
print(*ports, flush=True)
threading.Event().wait()
"#;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running `ip {}`: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace joined to the host's by a veth pair with a /30 of 10.222.0.0/16.
/// Removed on drop (also when the test panics).
struct Netns {
    name: String,
    host_if: String,
    ns_ip: IpAddr,
}

impl Netns {
    fn create() -> Netns {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id() as usize;
        let name = format!("corral-nt-{pid}-{n}");
        let host_if = format!("ntg{pid}h{n}");
        let ns_if = format!("ntg{pid}n{n}");
        // A /30 derived from the pid, skipping any the host already has an address in (another
        // test process whose pid maps to the same slot).
        let (host_ip, ns_ip) = (0..64)
            .map(|k| {
                let slot = (pid * 4 + n + k * 7919) % 16384;
                let (a, b) = (slot / 64, (slot % 64) * 4);
                (
                    format!("10.222.{a}.{}", b + 1),
                    format!("10.222.{a}.{}", b + 2),
                )
            })
            .find(|(h, _)| {
                let out = Command::new("ip")
                    .args(["-4", "-o", "addr", "show", "to", &format!("{h}/30")])
                    .output()
                    .expect("ip addr show");
                out.status.success() && out.stdout.is_empty()
            })
            .expect("no free /30 in 10.222.0.0/16 for the test's namespace");
        ip(&["netns", "add", &name]).unwrap();
        let ns = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            ns_ip: ns_ip.parse().unwrap(),
        };
        let steps: [&[&str]; 7] = [
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
            ],
            &["link", "set", &ns_if, "netns", &name],
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
            &["link", "set", &host_if, "up"],
            &[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{ns_ip}/30"),
                "dev",
                &ns_if,
            ],
            &["-n", &name, "link", "set", &ns_if, "up"],
            &["-n", &name, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if let Err(e) = ip(step) {
                panic!("setting up the test namespace {name}: {e}");
            }
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Whatever still runs in the namespace (a server the test did not stop) goes first.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .stdin(Stdio::null())
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The git server, its two ports, and where it runs. Stopped (then its namespace removed) on
/// drop.
struct GitServer {
    child: Child,
    /// The host part of the URLs: the namespace's IP, or the loopback name.
    host: String,
    /// The addresses `host` reaches (for `allow_cidrs`).
    addrs: Vec<IpAddr>,
    ports: [u16; 2],
    record: std::path::PathBuf,
    _netns: Option<Netns>,
}

impl Drop for GitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GitServer {
    /// Serve `dir/repo.git` (with ca.pem/leaf.pem/leaf.key made here for the host).
    fn start(dir: &Path, place: Option<Netns>, loopback: Option<&str>) -> GitServer {
        let (host, bind, addrs) = match (&place, loopback) {
            (Some(ns), _) => (ns.ns_ip.to_string(), ns.ns_ip, vec![ns.ns_ip]),
            (None, Some(name)) => {
                let addrs: Vec<IpAddr> = (name, 443)
                    .to_socket_addrs()
                    .unwrap()
                    .map(|a| a.ip())
                    .collect();
                (name.to_string(), addrs[0], addrs)
            }
            (None, None) => unreachable!(),
        };
        certs(dir, &host);
        let record = dir.join("requests.log");
        write(&record, "");
        write(&dir.join("server.py"), GIT_SERVER);
        let mut cmd = match &place {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name, "python3"]);
                c
            }
            None => Command::new("python3"),
        };
        cmd.arg("server.py")
            .arg(dir)
            .arg(bind.to_string())
            .args(["leaf.pem", "leaf.key"])
            .arg(&record)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("start the git server (python3)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ports: Vec<u16> = line
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(
            ports.len(),
            2,
            "the git server did not report its ports: {line:?}"
        );
        GitServer {
            child,
            host,
            addrs,
            ports: [ports[0], ports[1]],
            record,
            _netns: place,
        }
    }

    fn url(&self, port: u16) -> String {
        format!("https://{}:{port}/repo.git", self.host)
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(&self.record).unwrap()
    }
}

fn git(dir: &Path, home: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A shell function for the jail's scripts: `t TAG CMD...` runs CMD and prints its output (both
/// streams) as `TAG| LINE` lines, then `TAG rc=CODE`.
const TAG_SH: &str = r#"t() { tag=$1; shift; out=$("$@" 2>&1); rc=$?; printf '%s\n' "$out" | sed "s/^/$tag| /"; echo "$tag rc=$rc"; }"#;

/// What `t TAG ...` printed: the command's output and its exit code (None: it did not run).
fn tagged(stdout: &str, tag: &str) -> (String, Option<i32>) {
    let prefix = format!("{tag}| ");
    let output: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect();
    let rc = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{tag} rc=")))
        .map(|c| c.parse().unwrap());
    (output.join("\n"), rc)
}

/// The audit log's network decisions.
fn decisions(w: &World) -> Vec<serde_json::Value> {
    w.audit_records()
        .into_iter()
        .filter(|r| r["kind"] == "net" && r["phase"] == "decision")
        .collect()
}

fn has_decision(net: &[serde_json::Value], host: &str, port: u16, decision: &str) -> bool {
    net.iter().any(|r| {
        r["method"] == "CONNECT"
            && r["host"] == host
            && r["port"] == port
            && r["decision"] == decision
    })
}

#[test]
fn git_clone_over_https_reaches_only_the_allowed_git_server() {
    let loopback = loopback_name();
    let place = if is_root() {
        Some(Netns::create())
    } else {
        match &loopback {
            Some(_) => {
                eprintln!(
                    "not root: no network namespace for the git server (creating one needs \
                     root); it runs on this machine's loopback name instead"
                );
                None
            }
            None => {
                eprintln!(
                    "skipping: not root (no network namespace) and this machine's host name \
                     does not resolve to loopback only"
                );
                return;
            }
        }
    };
    let w = World::new();
    let srv_dir = w.outside.join("git-server");
    std::fs::create_dir_all(&srv_dir).unwrap();

    // The served repository: one commit with a file naming this test run.
    let marker = format!("served by the test's git server {}", w.root.display());
    let src = w.outside.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write(&src.join("README"), &format!("{marker}\n"));
    git(&src, &w.home, &["init", "-q"]);
    git(&src, &w.home, &["add", "README"]);
    git(
        &src,
        &w.home,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t.invalid",
            "commit",
            "-q",
            "-m",
            "served",
        ],
    );
    let head = String::from_utf8(git(&src, &w.home, &["rev-parse", "HEAD"]).stdout).unwrap();
    git(
        &w.outside,
        &w.home,
        &["clone", "-q", "--bare", "src", "git-server/repo.git"],
    );

    let srv = GitServer::start(&srv_dir, place, loopback.as_deref());
    let [allowed, other] = srv.ports;
    // The CA the clones trust, where the jail sees it (not `*.pem`: the policy hides those).
    std::fs::copy(srv_dir.join("ca.pem"), w.project.join("test-ca.crt")).unwrap();
    let cidrs: Vec<String> = srv
        .addrs
        .iter()
        .map(|a| match a {
            IpAddr::V4(_) => format!("\"{a}/32\""),
            IpAddr::V6(_) => format!("\"{a}/128\""),
        })
        .collect();
    let policy = w.outside.join("net.toml");
    write(
        &policy,
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{}:{allowed}\"]\nallow_cidrs = [{}]\n\
             [limits]\nenforce = \"best-effort\"\n",
            srv.host,
            cidrs.join(", ")
        ),
    );
    let script = format!(
        r#"{TAG_SH}
clone() {{ t "$1" git -c http.sslCAInfo="$PWD/test-ca.crt" clone -q "$2" "$3"; }}
# Into the jail's /tmp: a new repository cannot be made in the project while the run lasts
# (the name gate, jail_gitwindow); what was cloned is copied out.
clone CLONE {ok} /tmp/cloned
cp /tmp/cloned/README cloned-README; git -C /tmp/cloned rev-parse HEAD > cloned-HEAD
clone DENIED-PORT {other} /tmp/denied-port
clone DENIED-NAME https://github.com/git/git.git /tmp/denied-name
for d in denied-port denied-name; do [ -e /tmp/$d/.git ] && echo "CLONED-$d"; done
echo END
"#,
        ok = srv.url(allowed),
        other = srv.url(other),
    );
    let out = w.sh_policy(&policy, &script);
    let o = out.both();

    // The allowed clone has the served commit and file.
    assert_eq!(tagged(&out.stdout, "CLONE").1, Some(0), "{o}");
    assert_eq!(
        std::fs::read_to_string(w.project.join("cloned-README")).unwrap(),
        format!("{marker}\n"),
        "{o}"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("cloned-HEAD")).unwrap(),
        head
    );
    // The other port and the other host: the proxy's 403, nothing cloned.
    for what in ["DENIED-PORT", "DENIED-NAME"] {
        let (said, rc) = tagged(&out.stdout, what);
        assert!(rc.is_some_and(|c| c != 0), "{what}: {o}");
        assert!(
            said.contains("CONNECT tunnel failed, response 403"),
            "{what}: {o}"
        );
    }
    assert!(!out.stdout.contains("CLONED-"), "{o}");
    // The server saw the allowed clone and nothing on the other port.
    let seen = srv.requests();
    assert!(
        seen.contains(&format!(
            "{allowed} GET /repo.git/info/refs?service=git-upload-pack"
        )),
        "{seen}"
    );
    assert!(
        seen.contains(&format!("{allowed} POST /repo.git/git-upload-pack")),
        "{seen}"
    );
    assert!(
        !seen.lines().any(|l| l.starts_with(&format!("{other} "))),
        "a denied clone reached the server: {seen}"
    );

    // The audit log has each decision.
    let net = decisions(&w);
    assert!(has_decision(&net, &srv.host, allowed, "allow"), "{net:#?}");
    assert!(has_decision(&net, &srv.host, other, "deny"), "{net:#?}");
    assert!(has_decision(&net, "github.com", 443, "deny"), "{net:#?}");
    assert!(
        net.iter()
            .filter(|r| r["decision"] == "deny")
            .all(|r| r["rule"].as_str().unwrap().contains("not in network.allow")),
        "{net:#?}"
    );

    // Control: the denied port serves the same repository, so only the policy refused it.
    let control = w.outside.join("control");
    let ca = srv_dir.join("ca.pem");
    git(
        &w.outside,
        &w.home,
        &[
            "-c",
            &format!("http.sslCAInfo={}", ca.display()),
            "clone",
            "-q",
            &srv.url(other),
            control.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(control.join("README")).unwrap(),
        format!("{marker}\n")
    );
}

const REGISTRIES: [&str; 3] = ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"];

#[test]
fn pip_npm_and_curl_reach_the_registries_through_the_proxy_and_nothing_else() {
    for tool in ["curl", "python3", "npm", "getent"] {
        assert!(
            which(tool).is_some(),
            "{tool} is not on PATH: .ci/run installs it (apt python3-pip, nodejs with npm)"
        );
    }
    // Resolve the registries on the host; an address the classifier denies (this machine's
    // mirror is in a documentation range) is opened for exactly that address.
    let mut cidrs = Vec::new();
    // The non-public addresses opened that way: an allowed connection may only go there or to
    // a public address.
    let mut opened: Vec<IpAddr> = Vec::new();
    let mut registry_addr = None;
    for name in REGISTRIES {
        let addrs: Vec<SocketAddr> = match (name, 443).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                eprintln!("skipping: {name} does not resolve on the host ({e}): no network");
                return;
            }
        };
        for a in &addrs {
            let class = corral_policy::addr::classify(a.ip());
            if !class.is_public() {
                let net = match a.ip() {
                    IpAddr::V4(_) => format!("{}/32", a.ip()),
                    IpAddr::V6(_) => format!("{}/128", a.ip()),
                };
                eprintln!(
                    "{name} resolves to {} on this machine, a {class} address the proxy denies \
                     by default: allow_cidrs gets {net}",
                    a.ip()
                );
                if !cidrs.contains(&net) {
                    cidrs.push(net);
                    opened.push(a.ip());
                }
            }
        }
        // Every registry must answer from the host, or the jail's failures would say nothing.
        let mut errors = Vec::new();
        let reached = addrs.iter().any(|a| {
            TcpStream::connect_timeout(a, Duration::from_secs(5))
                .map_err(|e| errors.push(format!("{a}: {e}")))
                .is_ok()
        });
        if !reached {
            eprintln!(
                "skipping: {name} is not reachable from the host on port 443 ({}): no network",
                if errors.is_empty() {
                    "no address".to_string()
                } else {
                    errors.join(", ")
                }
            );
            return;
        }
        if name == "pypi.org" {
            registry_addr = addrs.iter().find(|a| a.is_ipv4()).copied();
        }
    }
    let Some(registry_addr) = registry_addr else {
        eprintln!("skipping: pypi.org has no IPv4 address on this machine");
        return;
    };
    let nameserver = std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("nameserver").map(|s| s.trim().to_string()))
        .filter(|s| s.parse::<std::net::Ipv4Addr>().is_ok())
        .unwrap_or_else(|| "192.0.2.53".to_string());

    let w = World::new();
    let policy = w.outside.join("net.toml");
    let cidrs: Vec<String> = cidrs.iter().map(|c| format!("\"{c}\"")).collect();
    write(
        &policy,
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"pypi.org\", \"files.pythonhosted.org\", \
             \"registry.npmjs.org\"]\nallow_cidrs = [{}]\n[limits]\nenforce = \"best-effort\"\n",
            cidrs.join(", ")
        ),
    );
    let ip = registry_addr.ip();
    let script = format!(
        r#"{TAG_SH}
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
# Node's own CA list plus the system's (where this machine's registry mirror is trusted).
[ -f /etc/ssl/certs/ca-certificates.crt ] && export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
# Every tool is bounded: its own network timeouts, and `timeout 120` around it.
# One retry: pip prints the proxy's answer (PIP-DENIED) only when it retries.
pipdl() {{ timeout 120 python3 -m pip download --no-deps --no-cache-dir \
    --disable-pip-version-check --only-binary :all: --timeout 30 --retries 1 "$@"; }}
npmv() {{ timeout 120 npm view left-pad version --fetch-timeout=30000 "$@"; }}

t CURL timeout 120 curl -sS --retry 2 -m 60 -o simple.html -w '%{{http_code}}' https://pypi.org/simple/six/
t PIP pipdl -d dl six==1.16.0
t NPM npmv --fetch-retries=1

t CURL-DENIED timeout 120 curl -sS -m 10 -o /dev/null -w '%{{http_connect}}' https://test.pypi.org/simple/six/
t PIP-DENIED pipdl --index-url https://test.pypi.org/simple/ -d dl-denied six==1.16.0
t NPM-DENIED npmv --registry=https://registry.yarnpkg.com/ --fetch-retries=0

t GETENT timeout 120 getent hosts pypi.org
timeout 120 python3 - <<'PY'
import socket, struct
try:
    socket.create_connection(("{ip}", 443), timeout=5)
    print("DIRECT connected")
except OSError as e:
    print("DIRECT failed", type(e).__name__, e.errno)
try:
    print("RESOLVED", socket.getaddrinfo("pypi.org", 443))
except OSError as e:
    print("GETADDRINFO failed", type(e).__name__)
# A DNS query for pypi.org, straight to the host's resolver over UDP and TCP.
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p for p in (b"pypi", b"org")) + b"\0" + struct.pack(">HH", 1, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
try:
    u.sendto(q, ("{nameserver}", 53))
    print("UDP-DNS answered", len(u.recvfrom(512)[0]))
except OSError as e:
    print("UDP-DNS failed", type(e).__name__, e.errno)
try:
    t = socket.create_connection(("{nameserver}", 53), timeout=5)
    t.sendall(struct.pack(">H", len(q)) + q)
    print("TCP-DNS answered", len(t.recv(512)))
except OSError as e:
    print("TCP-DNS failed", type(e).__name__, e.errno)
PY
echo END
"#
    );
    let out = w.sh_policy(&policy, &script);
    let o = out.both();

    // Allowed: curl gets the simple index, pip the wheel (index on pypi.org, file on
    // files.pythonhosted.org), npm the version.
    // The status code is curl's last line (a retry may have printed a warning before it).
    let (said, rc) = tagged(&out.stdout, "CURL");
    assert_eq!(rc, Some(0), "{o}");
    assert_eq!(said.lines().last(), Some("200"), "{o}");
    let simple = std::fs::read_to_string(w.project.join("simple.html")).unwrap();
    assert!(
        simple.contains("six-1.16.0-py2.py3-none-any.whl"),
        "{simple}"
    );
    assert_eq!(tagged(&out.stdout, "PIP").1, Some(0), "{o}");
    let wheel = std::fs::read(w.project.join("dl/six-1.16.0-py2.py3-none-any.whl"))
        .unwrap_or_else(|e| panic!("pip's wheel in the project: {e}\n{o}"));
    assert!(wheel.starts_with(b"PK\x03\x04"), "not a wheel (zip)");
    let (version, rc) = tagged(&out.stdout, "NPM");
    assert_eq!(rc, Some(0), "{o}");
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "npm view printed a version: {o}"
    );

    // Denied: each tool fails and shows the proxy's 403.
    let (said, rc) = tagged(&out.stdout, "CURL-DENIED");
    assert!(rc.is_some_and(|c| c != 0), "{o}");
    assert!(said.contains("CONNECT tunnel failed, response 403"), "{o}");
    let (said, rc) = tagged(&out.stdout, "PIP-DENIED");
    assert!(rc.is_some_and(|c| c != 0), "{o}");
    assert!(
        said.contains("Tunnel connection failed: 403 Forbidden"),
        "{o}"
    );
    let (said, rc) = tagged(&out.stdout, "NPM-DENIED");
    assert!(rc.is_some_and(|c| c != 0), "{o}");
    assert!(said.contains("403 Forbidden"), "{o}");
    assert!(
        std::fs::read_dir(w.project.join("dl-denied"))
            .map(|mut d| d.next().is_none())
            .unwrap_or(true),
        "pip saved something from a denied index: {o}"
    );
    // Outside the proxy: no DNS, no direct connection.
    assert_eq!(tagged(&out.stdout, "GETENT").1, Some(2), "{o}");
    assert!(out.stdout.contains("DIRECT failed"), "{o}");
    assert!(out.stdout.contains("GETADDRINFO failed"), "{o}");
    assert!(out.stdout.contains("UDP-DNS failed"), "{o}");
    assert!(out.stdout.contains("TCP-DNS failed"), "{o}");

    // The audit log: each registry allowed, each other host denied, nothing else asked for
    // (the direct connection never reached the proxy).
    let net = decisions(&w);
    for name in REGISTRIES {
        assert!(has_decision(&net, name, 443, "allow"), "{name}: {net:#?}");
    }
    for name in ["test.pypi.org", "registry.yarnpkg.com"] {
        assert!(has_decision(&net, name, 443, "deny"), "{name}: {net:#?}");
    }
    for r in &net {
        let host = r["host"].as_str().unwrap();
        match r["decision"].as_str().unwrap() {
            "allow" => {
                assert!(REGISTRIES.contains(&host), "{r}");
                // Not re-resolved here (a CDN's answer rotates): the address connected to is
                // public, or one the policy's allow_cidrs opened.
                let addr: IpAddr = r["address"].as_str().unwrap().parse().unwrap();
                assert!(
                    corral_policy::addr::classify(addr).is_public() || opened.contains(&addr),
                    "{r}: {addr} is neither public nor in allow_cidrs {opened:?}"
                );
            }
            "deny" => assert!(
                ["test.pypi.org", "registry.yarnpkg.com"].contains(&host),
                "{r}"
            ),
            d => panic!("unexpected decision {d}: {r}"),
        }
    }
}
