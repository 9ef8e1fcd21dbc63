//! `[secrets]` on the container backends for real, podman and docker alike: the run gets a
//! gateway proxy container of its own; a TLS origin (a container on the external network) that
//! accepts only the real token accepts the harness's requests to the secret's host, and rejects
//! the same placeholder sent to a host the secret is not bound to (the control: the origin does
//! check, and what the harness holds is useless by itself). While the harness runs, no container
//! of the project carries the real value in its configuration (`inspect`), the harness has no
//! bind of the real values' file, and that file is gone from the host; inside, the harness finds
//! the real value in no environment and no file. Afterwards the gateway container and its files
//! are gone and the audit log names the secret, never its value.
//!
//! Needs root, openssl, and the image `localhost/corral-ci-harness:latest` (ci/podman-setup.sh,
//! ci/docker-setup.sh), as engine_containers.rs.

mod e2e_support;
mod engine_support;
mod jail_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use engine_support::{Engine, IMAGE, World, on_every_engine};

const REAL: &str = "sk-test-REALkeyREALkeyREALkey0123456789abc";
const REAL_PART: &str = "REALkeyREALkey";

on_every_engine!(
    harness_gets_placeholders_and_the_origin_the_real_token,
    sigterm_to_corral_removes_the_gateway_proxy_and_its_files,
    a_value_the_gateway_refuses_is_an_error_naming_the_variable,
    corral_down_removes_what_a_killed_secrets_run_left,
);

/// The files of the project's gateway proxies still in the state directory.
fn gateway_files(w: &World) -> Vec<PathBuf> {
    e2e_support::walk(&w.state)
        .into_iter()
        .filter(|f| f.components().any(|c| c.as_os_str() == "gateway"))
        .collect()
}

/// `corral run --engine E -- /bin/bash -c script` in the project.
fn run_script(w: &World, script: &str) -> std::process::Command {
    w.command(&[
        "run",
        "--engine",
        w.engine.name(),
        "--",
        "/bin/bash",
        "-c",
        script,
    ])
}

/// A trusted project in proxy mode with `$CALLER_TOKEN` as the secret API_TOKEN for
/// api.example.com.
fn trust_secret_project(w: &World) {
    std::fs::write(
        w.project.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n\n\
             [secrets]\nAPI_TOKEN = {{ from_env = \"CALLER_TOKEN\", hosts = [\"api.example.com\"] }}\n"
        ),
    )
    .unwrap();
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{out:?}");
}

/// A run of `trust_secret_project` with the real token whose harness sleeps: started, with
/// corral's output going to `output()`, and waited for until the harness is up (or corral
/// ended). Returns corral and the file the harness touches when it is up.
fn start_sleeping_harness(w: &World, output: fn() -> Stdio) -> (Child, PathBuf) {
    trust_secret_project(w);
    let ready = w.project.join("ready");
    let script = format!("touch {}; exec sleep 300", ready.display());
    let mut child = run_script(w, &script)
        .env("CALLER_TOKEN", REAL)
        .stdout(output())
        .stderr(output())
        .spawn()
        .unwrap();
    for _ in 0..1200 {
        if ready.exists() || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (child, ready)
}

/// The origin: HTTPS on 8443 with a certificate for `host` from the test CA in `mock`; 200
/// `accepted` only for `Authorization: Bearer <mock/real>`, else 401 `rejected`; each request's
/// path and Authorization on its standard output.
fn start_origin(e: Engine, mock: &Path, name: &str, alias: &str, network: &str) {
    std::fs::write(mock.join("real"), REAL).unwrap();
    std::fs::write(
        mock.join("origin.py"),
        r#"import http.server, ssl
real = open("/m/real").read().strip()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        print("SEEN", self.path, auth, flush=True)
        ok = auth == "Bearer " + real
        b = b"accepted" if ok else b"rejected"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("0.0.0.0", 8443), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("/m/leaf.pem", "/m/leaf.key")
s.socket = c.wrap_socket(s.socket, server_side=True)
print("origin listening", flush=True)
s.serve_forever()
"#,
    )
    .unwrap();
    let volume = format!("{}:/m:ro", mock.display());
    e.ok(&[
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        network,
        "--network-alias",
        alias,
        "--volume",
        &volume,
        "--pull",
        "never",
        "--entrypoint",
        "python3",
        IMAGE,
        "-u",
        "/m/origin.py",
    ]);
}

fn harness_gets_placeholders_and_the_origin_the_real_token(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    let w = World::new(e, "s");
    let p = &w.project;
    let api = format!("{}-api", w.prefix);
    let unbound = format!("{}-other", w.prefix);
    let mock = w.dir.path().join("mock");
    std::fs::create_dir_all(&mock).unwrap();
    e2e_support::certs(&mock, &api);
    // The engine reads the bind sources as root; the origin runs as root in its container.
    let external = format!("{}-external", w.prefix);
    e.ok(&["network", "create", &external]);
    let subnet = e.subnet(&external);
    start_origin(e, &mock, &api, &unbound, &external);
    std::fs::write(
        p.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n\
             allow = [\"{api}:8443\", \"{unbound}:8443\"]\nallow_cidrs = [\"{subnet}\"]\n\n\
             [secrets]\nAPI_TOKEN = {{ from_env = \"CALLER_TOKEN\", hosts = [\"{api}\"] }}\n"
        ),
    )
    .unwrap();
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{out:?}");

    let ready = p.join("ready");
    let go = p.join("go");
    // The script never spells the real value: the pattern is assembled at run time.
    let half = &REAL_PART[..REAL_PART.len() / 2];
    let script = format!(
        r#"A={half}; PAT=$A$A
echo PH=$API_TOKEN
if env | grep -q $PAT; then echo ENV-LEAK; else echo ENV-CLEAN; fi
if cat /proc/[0-9]*/environ 2>/dev/null | grep -q $PAT; then echo PROC-LEAK; else echo PROC-CLEAN; fi
if grep -rqs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr $PAT /; then echo FILE-LEAK; else echo FILE-CLEAN; fi
for i in $(seq 150); do curl -s -o /dev/null https://{api}:8443/wait && break; sleep 0.2; done
echo BOUND=$(curl -sS https://{api}:8443/bound -H "Authorization: Bearer $API_TOKEN")
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  echo SYS=$(env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -sS https://{api}:8443/system -H "Authorization: Bearer $API_TOKEN")
else
  echo SYS=no-system-bundle
fi
echo UNBOUND=$(curl -sS -k https://{unbound}:8443/unbound -H "Authorization: Bearer $API_TOKEN")
touch {ready}
while [ ! -e {go} ]; do sleep 0.1; done
echo END
"#,
        ready = ready.display(),
        go = go.display(),
    );
    let mut child = run_script(&w, &script)
        .env("CALLER_TOKEN", REAL)
        // The gateway verifies the real host against the system store; the origin's test CA
        // is added the way a corporate CA would be (corral's SSL_CERT_FILE).
        .env("SSL_CERT_FILE", mock.join("ca.pem"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the harness runs: the engine's view of every container of the project.
    let mut seen_ready = false;
    for _ in 0..1200 {
        if ready.exists() {
            seen_ready = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut inspected = Vec::new();
    if seen_ready {
        let containers = w.containers();
        assert!(
            containers.iter().any(|c| c.ends_with("-gateway")),
            "no gateway proxy container among {containers:?}"
        );
        for c in &containers {
            let config = e.ok(&["container", "inspect", c]);
            assert!(
                !config.contains(REAL_PART),
                "the real value is in the configuration of container {c}"
            );
            if !c.ends_with("-gateway") {
                assert!(
                    !config.contains("secrets.json"),
                    "container {c} has the real values' file:\n{config}"
                );
            }
            inspected.push(c.clone());
        }
        let left: Vec<PathBuf> = e2e_support::walk(&w.state)
            .into_iter()
            .filter(|f| f.ends_with("secrets.json"))
            .collect();
        assert!(
            left.is_empty(),
            "the real values' file is still on the host: {left:?}"
        );
    }
    std::fs::write(&go, "").unwrap();
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    let t = format!("exit {status:?}\n--- stdout\n{stdout}--- stderr\n{stderr}");
    assert!(seen_ready, "the harness never got to its checks:\n{t}");
    assert_eq!(status.code(), Some(0), "{t}");
    assert!(inspected.len() >= 2, "inspected {inspected:?}");
    assert!(!t.contains(REAL_PART), "real value printed:\n{t}");
    let ph = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PH="))
        .expect("placeholder line")
        .to_string();
    assert!(
        ph.starts_with("sk-test-") && ph.len() == REAL.len() && ph != REAL,
        "{ph}"
    );
    for line in [
        "ENV-CLEAN",
        "PROC-CLEAN",
        "FILE-CLEAN",
        "BOUND=accepted",
        "UNBOUND=rejected",
        "END",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line} missing:\n{t}");
    }
    let sys = stdout.lines().find_map(|l| l.strip_prefix("SYS=")).unwrap();
    assert!(
        sys == "accepted" || sys == "no-system-bundle",
        "a program reading only the system bundle: {sys}\n{t}"
    );

    // The origin got the real token for the bound host, the placeholder for the other name.
    let origin = e.ok(&["logs", &api]);
    assert!(
        origin.contains(&format!("SEEN /bound Bearer {REAL}")),
        "origin saw:\n{origin}"
    );
    assert!(
        origin.contains(&format!("SEEN /unbound Bearer {ph}")),
        "origin saw:\n{origin}"
    );
    assert!(!origin.contains(&format!("SEEN /bound Bearer {ph}")));

    // Afterwards: no gateway container, no gateway files; the audit log names the secret only.
    let left = w.containers();
    assert!(
        !left.iter().any(|c| c.ends_with("-gateway")),
        "the gateway proxy outlived the run: {left:?}"
    );
    let gw_dirs = gateway_files(&w);
    assert!(gw_dirs.is_empty(), "gateway files left: {gw_dirs:?}");
    let audit =
        std::fs::read_to_string(w.state.join("corral").join(w.key()).join("audit.jsonl")).unwrap();
    assert!(!audit.contains(REAL_PART), "real value in the audit log");
    assert!(
        audit.contains("\"secret\":\"API_TOKEN\""),
        "no injection record naming the secret:\n{audit}"
    );
}

/// SIGTERM to corral while the harness runs (what a service manager or `kill` sends): the
/// harness stops, and the run's gateway proxy container and its files go with it.
fn sigterm_to_corral_removes_the_gateway_proxy_and_its_files(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    let w = World::new(e, "s");
    let (child, ready) = start_sleeping_harness(&w, Stdio::piped);
    assert!(
        ready.exists(),
        "the harness never started: {:?}",
        child.wait_with_output()
    );
    let running = w.containers();
    assert!(
        running.iter().any(|c| c.ends_with("-gateway")),
        "no gateway proxy among {running:?}"
    );
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let left = w.containers();
    assert!(
        !left.iter().any(|c| c.ends_with("-gateway")),
        "the gateway proxy outlived the run: {left:?}\n{out:?}"
    );
    let files = gateway_files(&w);
    assert!(files.is_empty(), "gateway files left: {files:?}");
}

/// A real value that cannot go into an HTTP header: the gateway proxy refuses it, and the run
/// fails before the harness starts, with the proxy's reason (naming the variable, not the
/// value) and nothing left behind.
fn a_value_the_gateway_refuses_is_an_error_naming_the_variable(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    let w = World::new(e, "s");
    trust_secret_project(&w);
    let started = w.project.join("started");
    let script = format!("touch {}", started.display());
    let bad = "two words REALkeyREALkey";
    let out = run_script(&w, &script)
        .env("CALLER_TOKEN", bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(!started.exists(), "the harness ran");
    assert!(
        stderr.contains("$CALLER_TOKEN holds characters that cannot go into an HTTP header"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(REAL_PART),
        "the value was printed: {stderr}"
    );
    let left = w.containers();
    assert!(
        !left.iter().any(|c| c.ends_with("-gateway")),
        "the gateway proxy outlived the run: {left:?}"
    );
    let files = gateway_files(&w);
    assert!(files.is_empty(), "gateway files left: {files:?}");
}

/// SIGKILL to corral while the harness runs: the containers and the gateway directory stay
/// (nothing can clean up), but the real values' file is already gone; `corral down` removes
/// the rest.
fn corral_down_removes_what_a_killed_secrets_run_left(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    let w = World::new(e, "s");
    // No pipes: the engine client corral started outlives it and would hold them open.
    let (mut child, ready) = start_sleeping_harness(&w, Stdio::null);
    assert!(ready.exists(), "the harness never started");
    child.kill().unwrap();
    child.wait().unwrap();
    let left = gateway_files(&w);
    assert!(
        !left.is_empty(),
        "control: a killed run leaves its gateway directory"
    );
    assert!(
        !left.iter().any(|f| f.ends_with("secrets.json")),
        "the real values' file outlived the gateway's start: {left:?}"
    );
    assert!(w.containers().iter().any(|c| c.ends_with("-gateway")));
    let out = w.corral(&["down", "--engine", e.name()]);
    assert!(out.status.success(), "{out:?}");
    assert!(w.containers().is_empty(), "{:?}", w.containers());
    assert!(gateway_files(&w).is_empty(), "{:?}", gateway_files(&w));
}
