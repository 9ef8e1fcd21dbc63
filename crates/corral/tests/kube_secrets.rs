//! `[secrets]` in `corral kube render`, for real. The rendered manifests validate strictly; no
//! object but the proxy's Secret holds the real value or the run CA's key, and that Secret holds
//! both; `jail.yaml` is its owner's only. Then the proxy Deployment's own command line runs
//! (`corral-proxy` with the Secret's and ConfigMaps' files written out as the kubelet mounts
//! them) on loopback: a client trusting only the sandbox's CA ConfigMap sends the sandbox's
//! placeholder to a TLS origin the secret is bound to, and the origin gets the real value; the
//! same placeholder sent to a host the secret is not bound to arrives as the placeholder.

mod e2e_support;
mod jail_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use e2e_support::loopback_name;
use jail_support::corral_bin;
use serde_json::Value;

const REAL: &str = "sk-test-REALkeyREALkeyREALkey0123456789abc";
const REAL_PART: &str = "REALkeyREALkey";
/// The Kubernetes release the manifests are built for (k8s-openapi's `v1_35`).
const KUBERNETES_VERSION: &str = "1.35.0";

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A scratch directory: a project (a git root) with a home, removed on drop.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root =
            std::env::temp_dir().join(format!("corral-kube-secrets-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proj/.git")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        Scratch { root }
    }

    fn project(&self) -> PathBuf {
        self.root.join("proj")
    }

    /// `corral kube render ... -o out` with `CALLER_TOKEN` set to the real value: the YAML.
    fn render(&self, policy: &str) -> String {
        std::fs::write(self.project().join("corral.toml"), policy).unwrap();
        let out_dir = self.root.join("out");
        let out = Command::new(corral_bin())
            .args([
                "kube",
                "render",
                "--proxy-ip",
                "10.96.0.50",
                "--pids-by-node",
            ])
            .args(["--seccomp", "runtime-default", "-o"])
            .arg(&out_dir)
            .args(["--", "sh", "-c", "echo hi"])
            .current_dir(self.project())
            .env("HOME", self.root.join("home"))
            .env("XDG_CONFIG_HOME", self.root.join("home/.config"))
            .env("XDG_STATE_HOME", self.root.join("home/.state"))
            .env("CALLER_TOKEN", REAL)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "corral kube render failed: {stderr}");
        assert!(
            !stderr.contains(REAL_PART),
            "real value on stderr: {stderr}"
        );
        let file = out_dir.join("jail.yaml");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "jail.yaml holds the proxy's Secret");
        std::fs::read_to_string(file).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn policy(bound: &str, unbound: &str) -> String {
    format!(
        "[network]\nmode = \"proxy\"\nallow = [\"{bound}\", \"{unbound}\"]\n\
         allow_cidrs = [\"127.0.0.0/8\"]\n\n\
         [secrets]\nAPI_TOKEN = {{ from_env = \"CALLER_TOKEN\", hosts = [\"{}\"] }}\n",
        bound.split(':').next().unwrap()
    )
}

/// Each YAML document as JSON, with its text.
fn documents(yaml: &str) -> Vec<(Value, String)> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(doc).unwrap();
            let text = serde_yaml_ng::to_string(&v).unwrap();
            (serde_json::to_value(v).unwrap(), text)
        })
        .collect()
}

fn find<'a>(docs: &'a [(Value, String)], kind: &str, name_ends: &str) -> &'a Value {
    &docs
        .iter()
        .find(|(d, _)| {
            d["kind"] == kind
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(name_ends))
        })
        .unwrap_or_else(|| panic!("no {kind} named *{name_ends}"))
        .0
}

fn is_proxy_secret(d: &Value) -> bool {
    d["kind"] == "Secret"
        && d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-proxy-secrets"))
}

/// `kubernetes-validate`: $CORRAL_KUBERNETES_VALIDATE, the CI's venv, else PATH.
fn validator() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CORRAL_KUBERNETES_VALIDATE") {
        return Some(PathBuf::from(p));
    }
    let ci = Path::new("/opt/corral-ci-kube/bin/kubernetes-validate");
    if ci.exists() {
        return Some(ci.to_path_buf());
    }
    e2e_support::which("kubernetes-validate")
}

#[test]
fn rendered_secrets_validate_and_stay_in_the_proxy_secret() {
    let s = Scratch::new();
    let yaml = s.render(&policy("api.example.com", "other.example.com"));
    let docs = documents(&yaml);
    // Exactly one object holds the real value and the key: the proxy's Secret.
    let mut secrets = 0;
    for (d, text) in &docs {
        if is_proxy_secret(d) {
            secrets += 1;
            let data = &d["stringData"];
            assert!(data["secrets.json"].as_str().unwrap().contains(REAL));
            assert!(data["ca-key.pem"].as_str().unwrap().contains("PRIVATE KEY"));
            let ph: BTreeMap<String, String> =
                serde_json::from_str(data["placeholders.json"].as_str().unwrap()).unwrap();
            assert!(ph.contains_key("API_TOKEN"));
            continue;
        }
        for leak in [REAL_PART, "PRIVATE KEY"] {
            assert!(
                !text.contains(leak),
                "{leak} outside the proxy's Secret:\n{text}"
            );
        }
    }
    assert_eq!(secrets, 1);
    // The Secret is mounted by the proxy's Deployment only.
    for (d, text) in &docs {
        let mounts_it = text.contains("secretName: corral-proj-proxy-secrets");
        assert_eq!(mounts_it, d["kind"] == "Deployment", "{text}");
    }
    // The sandbox holds the placeholder, trusts the CA by the CA variables.
    let pod = find(&docs, "Pod", "proj");
    let env = pod_env(pod);
    let ph = &env["API_TOKEN"];
    assert!(ph.starts_with("sk-test-") && ph.len() == REAL.len() && !ph.contains(REAL_PART));
    assert_eq!(env["SSL_CERT_FILE"], "/var/run/corral/trust/ca-bundle.pem");

    let Some(bin) = validator() else {
        eprintln!(
            "SKIP (validation only): kubernetes-validate not found (pip install \
             kubernetes-validate into /opt/corral-ci-kube, or set CORRAL_KUBERNETES_VALIDATE)"
        );
        return;
    };
    let file = s.root.join("check.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let out = Command::new(&bin)
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .arg(&file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "kubernetes-validate --strict refused:\n{text}"
    );
    for kind in [
        "secret/corral-proj-proxy-secrets ",
        "configmap/corral-proj-run-ca ",
        "deployment/corral-proj-proxy ",
        "pod/corral-proj ",
    ] {
        assert!(text.contains(kind), "no {kind} validated:\n{text}");
    }
}

/// The harness container's environment, by name.
fn pod_env(pod: &Value) -> BTreeMap<String, String> {
    pod["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A TLS origin for `host` with its own test CA (`dir/ca.pem`) on 127.0.0.1
/// (`e2e_support::header_mock`, answering `mock-ok`). Killed on drop.
fn origin(dir: &Path, host: &str) -> e2e_support::Mock {
    std::fs::create_dir_all(dir).unwrap();
    e2e_support::header_mock(dir, host)
}

/// The Authorization header of each request `origin` received.
fn authorizations(origin: &e2e_support::Mock) -> Vec<String> {
    origin
        .requests()
        .iter()
        .map(|v| {
            v["headers"]["Authorization"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// A volume's files as the kubelet writes them: a ConfigMap's `data` or a Secret's
/// `stringData`, each key a file (mode `defaultMode`), or an empty directory.
fn materialize(docs: &[(Value, String)], volume: &Value, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let (data, mode) = if let Some(cm) = volume.get("configMap") {
        let name = cm["name"].as_str().unwrap();
        (&find(docs, "ConfigMap", name)["data"], &cm["defaultMode"])
    } else if let Some(sec) = volume.get("secret") {
        let name = sec["secretName"].as_str().unwrap();
        (
            &find(docs, "Secret", name)["stringData"],
            &sec["defaultMode"],
        )
    } else {
        assert!(volume.get("emptyDir").is_some(), "{volume}");
        return;
    };
    for (key, text) in data.as_object().unwrap() {
        let f = dir.join(key);
        std::fs::write(&f, text.as_str().unwrap()).unwrap();
        let mode = mode.as_u64().unwrap_or(0o644) as u32;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// The proxy Deployment's container command line, its mounts written out under `root` and its
/// paths pointed there, listening on an ephemeral loopback port.
fn proxy_command(docs: &[(Value, String)], root: &Path) -> Vec<String> {
    let dep = find(docs, "Deployment", "-proxy");
    let spec = &dep["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(c["command"], serde_json::json!(["corral-proxy"]));
    let volumes = spec["volumes"].as_array().unwrap();
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let v = volumes.iter().find(|v| v["name"] == name).unwrap();
        let local = root.join(name);
        materialize(docs, v, &local);
        mounts.push((m["mountPath"].as_str().unwrap().to_string(), local));
    }
    let mut args: Vec<String> = Vec::new();
    let mut it = c["args"].as_array().unwrap().iter();
    while let Some(a) = it.next() {
        let a = a.as_str().unwrap();
        if a == "--listen" {
            it.next();
            args.extend(["--listen".into(), "127.0.0.1:0".into()]);
            continue;
        }
        let mapped = mounts.iter().find_map(|(at, local)| {
            a.strip_prefix(at.as_str())
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))
                .map(|rest| format!("{}{rest}", local.display()))
        });
        args.push(mapped.unwrap_or_else(|| a.to_string()));
    }
    args
}

/// The proxy, killed on drop; its audit log (standard output) in a file.
struct Proxy {
    child: Child,
    addr: String,
    stderr: String,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_proxy(args: &[String], upstream_ca: &Path, audit: &Path) -> Proxy {
    let mut child = Command::new(env!("CARGO_BIN_EXE_corral-proxy"))
        .args(args)
        // The gateway verifies the real origin with the system store; the origin's test CA is
        // added the way a corporate CA would be.
        .env("SSL_CERT_FILE", upstream_ca)
        .stdout(std::fs::File::create(audit).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral-proxy");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut stderr = String::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("corral-proxy ended before listening:\n{stderr}");
        };
        stderr.push_str(&line);
        stderr.push('\n');
        if let Some(a) = line.strip_prefix("corral proxy: listening on ") {
            break a.trim().to_string();
        }
    };
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Proxy {
        child,
        addr,
        stderr,
    }
}

/// The proxy's command line without `--ca-cert FILE --ca-key FILE`.
fn strip_ca_flags(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--ca-cert" || a == "--ca-key" {
            it.next();
        } else {
            out.push(a.clone());
        }
    }
    out
}

/// curl through the proxy, trusting only `ca`, sending `token` as a bearer token.
fn curl(proxy: &str, ca: &Path, url: &str, token: &str) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--noproxy", ""])
        .args(["--proxy", &format!("http://{proxy}")])
        .arg("--cacert")
        .arg(ca)
        .args(["-H", &format!("Authorization: Bearer {token}"), url])
        .env_remove("SSL_CERT_FILE")
        .env_remove("CURL_CA_BUNDLE")
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_rendered_proxy_swaps_the_placeholder_for_the_bound_host_only() {
    let Some(host) = loopback_name() else {
        eprintln!("SKIP: this machine's host name does not resolve to loopback only");
        return;
    };
    for tool in ["openssl", "curl", "python3"] {
        if e2e_support::which(tool).is_none() {
            eprintln!("SKIP: {tool} missing");
            return;
        }
    }
    let s = Scratch::new();
    let bound = origin(&s.root.join("bound"), &host);
    let unbound = origin(&s.root.join("unbound"), "localhost");
    let yaml = s.render(&policy(
        &format!("{host}:{}", bound.port),
        &format!("localhost:{}", unbound.port),
    ));
    let docs = documents(&yaml);

    // The sandbox's side: its placeholder, and the run CA from its ConfigMap only.
    let pod = find(&docs, "Pod", "proj");
    let ph = pod_env(pod)["API_TOKEN"].clone();
    let sandbox_ca = s.root.join("sandbox-ca.pem");
    let ca_map = find(&docs, "ConfigMap", "-run-ca");
    std::fs::write(
        &sandbox_ca,
        ca_map["data"]["corral-run-ca.pem"].as_str().unwrap(),
    )
    .unwrap();

    let args = proxy_command(&docs, &s.root.join("proxy-volumes"));
    let audit = s.root.join("audit.jsonl");
    let proxy = start_proxy(&args, &s.root.join("bound/ca.pem"), &audit);
    assert!(
        proxy.stderr.contains("credential gateway for API_TOKEN"),
        "{}",
        proxy.stderr
    );

    // The bound host: the gateway's leaf, issued by the rendered CA, is trusted, and the
    // origin receives the real value.
    let url = format!("https://{host}:{}/bound", bound.port);
    let (ok, out) = curl(&proxy.addr, &sandbox_ca, &url, &ph);
    assert!(ok && out.contains("mock-ok"), "bound request failed: {out}");
    assert_eq!(authorizations(&bound), [format!("Bearer {REAL}")]);

    // The attack: the placeholder sent to a host the secret is not bound to (an opaque tunnel;
    // the client trusts that origin's own CA) arrives as the useless placeholder.
    let url = format!("https://localhost:{}/unbound", unbound.port);
    let (ok, out) = curl(&proxy.addr, &s.root.join("unbound/ca.pem"), &url, &ph);
    assert!(
        ok && out.contains("mock-ok"),
        "unbound request failed: {out}"
    );
    assert_eq!(authorizations(&unbound), [format!("Bearer {ph}")]);

    // Control: the same proxy without the rendered CA (it makes a fresh one, as the container
    // backends' does) is not trusted by the sandbox's client: what it trusts is the CA render
    // made and the proxy was given.
    let fresh: Vec<String> = strip_ca_flags(&args);
    assert_ne!(fresh, args);
    let other = start_proxy(
        &fresh,
        &s.root.join("bound/ca.pem"),
        &s.root.join("audit2.jsonl"),
    );
    let url = format!("https://{host}:{}/fresh-ca", bound.port);
    let (ok, out) = curl(&other.addr, &sandbox_ca, &url, &ph);
    assert!(!ok, "a fresh CA was trusted: {out}");
    assert_eq!(
        authorizations(&bound).len(),
        1,
        "the request reached the origin"
    );

    // The audit log (the cluster's log stack) names the secret, never its value.
    drop(proxy);
    let log = std::fs::read_to_string(&audit).unwrap();
    assert!(log.contains("API_TOKEN"), "{log}");
    assert!(!log.contains(REAL_PART), "real value in the audit log");
}
