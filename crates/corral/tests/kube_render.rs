//! `corral kube render` as a user runs it: the manifests validate against Kubernetes' own schemas
//! with unknown fields refused (`kubernetes-validate --strict`), `--check` says how to test the
//! NetworkPolicies, and the proxy's audit log goes to standard output with `--audit-log -`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use corral_audit::{Decision, Event, Record};

/// The Kubernetes release the manifests are built for (k8s-openapi's `v1_35`).
const KUBERNETES_VERSION: &str = "1.35.0";

fn corral_bin() -> PathBuf {
    std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")))
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh project directory (a git root) with a file the policy masks, removed on drop.
struct Project {
    root: PathBuf,
}

impl Project {
    fn new() -> Project {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!("corral-kube-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proj/.git")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        std::fs::write(root.join("proj/.env"), "TOKEN=x\n").unwrap();
        Project { root }
    }

    fn dir(&self) -> PathBuf {
        self.root.join("proj")
    }

    fn corral(&self, args: &[&str]) -> Command {
        let mut c = Command::new(corral_bin());
        c.args(args)
            .current_dir(self.dir())
            .env("HOME", self.root.join("home"))
            .env("XDG_CONFIG_HOME", self.root.join("home/.config"))
            .env("XDG_STATE_HOME", self.root.join("home/.state"));
        c
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
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
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("kubernetes-validate"))
            .find(|p| p.exists())
    })
}

/// Run the validator strictly on `file`: its success and its output.
fn validate(bin: &Path, file: &Path) -> (bool, String) {
    let out = Command::new(bin)
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .arg(file)
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn render(p: &Project, network: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "kube",
        "render",
        "--network",
        network,
        "--allow",
        "api.example.com",
        "--proxy-ip",
        "10.96.0.50",
        "--pids-by-node",
        "-n",
        "agents",
    ];
    args.extend(extra);
    args.extend(["--", "sh", "-c", "echo hi"]);
    let out = p.corral(&args).output().unwrap();
    assert!(
        out.status.success(),
        "corral kube render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn rendered_manifests_validate_strictly() {
    let Some(bin) = validator() else {
        eprintln!(
            "SKIP: kubernetes-validate not found (pip install kubernetes-validate into \
             /opt/corral-ci-kube, or set CORRAL_KUBERNETES_VALIDATE)"
        );
        return;
    };
    let p = Project::new();
    for (network, extra) in [
        ("proxy", &["--executor-ip", "10.96.0.51"][..]),
        ("proxy", &[][..]),
        (
            "proxy",
            &["--seccomp", "runtime-default", "--project-hostpath"][..],
        ),
        ("none", &[][..]),
    ] {
        let yaml = render(&p, network, extra);
        let file = p.root.join("jail.yaml");
        std::fs::write(&file, &yaml).unwrap();
        let (ok, text) = validate(&bin, &file);
        assert!(
            ok,
            "{extra:?}: kubernetes-validate --strict refused:\n{text}\n{yaml}"
        );
        for kind in ["pod/", "networkpolicy/", "configmap/"] {
            assert!(
                text.contains(kind),
                "{extra:?}: no {kind} validated:\n{text}"
            );
        }
        if extra.contains(&"--executor-ip") {
            for kind in [
                "secret/corral-proj-executor-token ",
                "networkpolicy/corral-proj-executor ",
                "service/corral-proj-executor ",
                "pod/corral-proj-executor ",
            ] {
                assert!(
                    text.contains(kind),
                    "{extra:?}: no {kind} validated:\n{text}"
                );
            }
        }
        if network == "proxy" {
            for kind in ["deployment/", "service/"] {
                assert!(
                    text.contains(kind),
                    "{extra:?}: no {kind} validated:\n{text}"
                );
            }
        }
    }
    // Control: the validator does refuse an unknown field (strict), so passing means something.
    let yaml = render(&p, "proxy", &[]).replacen(
        "automountServiceAccountToken: false",
        "automountServiceAccountToken: false\n  hostNetworkz: true",
        1,
    );
    let file = p.root.join("tampered.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (ok, text) = validate(&bin, &file);
    assert!(!ok, "an unknown field passed validation:\n{text}");
}

/// The SandboxTemplate's pod template as a Pod (what kubernetes-validate has a schema for), after
/// checking that the fields around it are the CRD's (extensions.agents.x-k8s.io/v1beta1:
/// `spec.podTemplate.{metadata.{labels,annotations},spec}`, `spec.networkPolicyManagement`).
fn template_as_pod(yaml: &str) -> String {
    use serde_yaml_ng::{Mapping, Value};
    let keys = |v: &Value| -> Vec<String> {
        v.as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap().to_string())
            .collect()
    };
    let mut out = String::new();
    for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"] != "SandboxTemplate" {
            out.push_str("---\n");
            out.push_str(&serde_yaml_ng::to_string(&v).unwrap());
            continue;
        }
        assert_eq!(v["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
        assert_eq!(keys(&v), ["apiVersion", "kind", "metadata", "spec"]);
        assert_eq!(keys(&v["spec"]), ["podTemplate", "networkPolicyManagement"]);
        assert_eq!(v["spec"]["networkPolicyManagement"], "Unmanaged");
        let t = &v["spec"]["podTemplate"];
        assert_eq!(keys(t), ["metadata", "spec"]);
        assert!(
            keys(&t["metadata"])
                .iter()
                .all(|k| k == "labels" || k == "annotations")
        );
        let mut meta = t["metadata"].as_mapping().unwrap().clone();
        meta.insert("name".into(), v["metadata"]["name"].clone());
        let mut pod = Mapping::new();
        pod.insert("apiVersion".into(), "v1".into());
        pod.insert("kind".into(), "Pod".into());
        pod.insert("metadata".into(), Value::Mapping(meta));
        pod.insert("spec".into(), t["spec"].clone());
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&pod).unwrap());
    }
    out
}

#[test]
fn rendered_sandbox_template_validates_strictly() {
    let Some(bin) = validator() else {
        eprintln!(
            "SKIP: kubernetes-validate not found (pip install kubernetes-validate into \
             /opt/corral-ci-kube, or set CORRAL_KUBERNETES_VALIDATE)"
        );
        return;
    };
    let p = Project::new();
    let yaml = render(&p, "proxy", &["--target", "agent-sandbox"]);
    assert!(yaml.contains("kind: SandboxTemplate"), "{yaml}");
    assert!(!yaml.contains("kind: Pod"), "{yaml}");
    let file = p.root.join("template.yaml");
    std::fs::write(&file, template_as_pod(&yaml)).unwrap();
    let (ok, text) = validate(&bin, &file);
    assert!(ok, "kubernetes-validate --strict refused:\n{text}\n{yaml}");
    for kind in ["pod/", "networkpolicy/", "deployment/", "service/"] {
        assert!(text.contains(kind), "no {kind} validated:\n{text}");
    }
}

#[test]
fn render_writes_the_directory_and_refuses_what_it_cannot_carry() {
    let p = Project::new();
    let out_dir = p.root.join("out");
    let out = p
        .corral(&[
            "kube",
            "render",
            "--network",
            "proxy",
            "--proxy-ip",
            "10.96.0.50",
            "--pids-by-node",
            "-o",
            out_dir.to_str().unwrap(),
            "--",
            "sh",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = std::fs::read_to_string(out_dir.join("jail.yaml")).unwrap();
    // The file may hold the executor's token: the owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out_dir.join("jail.yaml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(yaml.contains("kind: Pod"), "{yaml}");
    assert!(
        yaml.contains("localhostProfile: corral/seccomp.json"),
        "{yaml}"
    );
    // The profile the Pod names is written beside it, from the native jail's own rules.
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("seccomp.json")).unwrap()).unwrap();
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ALLOW", "{profile}");
    let names: Vec<&str> = profile["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["names"].as_array().unwrap())
        .filter_map(|n| n.as_str())
        .collect();
    for denied in [
        "mount", "ptrace", "bpf", "unshare", "clone", "fchmodat", "openat2",
    ] {
        assert!(names.contains(&denied), "{denied} not in {names:?}");
    }
    // The masked .env is covered with the unreadable empty file.
    let env = format!("mountPath: {}/.env", p.dir().display());
    assert!(yaml.contains(&env), "{yaml}");
    // Without --proxy-ip the sandbox could not reach the proxy: refused, with the way out.
    let out = p
        .corral(&[
            "kube",
            "render",
            "--network",
            "proxy",
            "--pids-by-node",
            "--",
            "sh",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--proxy-ip"), "{err}");
    // A pids limit the user set cannot be set per Pod: refused under enforce = strict.
    let out = p
        .corral(&[
            "kube",
            "render",
            "--network",
            "none",
            "--pids",
            "64",
            "--",
            "sh",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pids-by-node"), "{err}");
}

/// The built-in defaults render as they are (`corral kube render pi --proxy-ip IP`): corral's
/// own pids limit, which no one set, does not block it; stderr says how processes are bounded.
#[test]
fn the_built_in_pids_limit_does_not_block_a_render() {
    let p = Project::new();
    let out = p
        .corral(&["kube", "render", "pi", "--proxy-ip", "10.96.0.50"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains("kind: Pod"), "{yaml}");
    assert!(
        err.contains("limits.pids = ")
            && err.contains("(corral's default)")
            && err.contains("bounded only by the nodes' kubelet podPidsLimit"),
        "{err}"
    );
    // Said to the nodes: the annotation, and no line on stderr.
    let out = p
        .corral(&[
            "kube",
            "render",
            "pi",
            "--proxy-ip",
            "10.96.0.50",
            "--pids-by-node",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("limits.pids"), "{err}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains("corral.dev/pids-limit-by-node"), "{yaml}");
    // The user's own limit, strict by default, still cannot be honoured: refused.
    let out = p
        .corral(&[
            "kube",
            "render",
            "pi",
            "--proxy-ip",
            "10.96.0.50",
            "--pids",
            "200",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pids-by-node"), "{err}");
    // Under best-effort it renders, and says the same.
    let out = p
        .corral(&[
            "kube",
            "render",
            "pi",
            "--proxy-ip",
            "10.96.0.50",
            "--pids",
            "200",
            "--enforce",
            "best-effort",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("limits.pids = 200 (limits.enforce"), "{err}");
}

#[test]
fn check_says_how_to_test_enforcement() {
    let p = Project::new();
    let out = p
        .corral(&[
            "kube", "render", "--check", "--name", "demo", "-n", "agents",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("void where the cluster's CNI"), "{text}");
    assert!(
        text.contains("kubectl -n agents exec demo -- curl --noproxy '*'"),
        "{text}"
    );
}

#[test]
fn proxy_audit_log_to_stdout() {
    let p = Project::new();
    let policy = p.root.join("policy.toml");
    std::fs::write(
        &policy,
        "[network]\nmode = \"proxy\"\nallow = [\"allowed.invalid\"]\n",
    )
    .unwrap();
    let mut child = p
        .corral(&[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--policy",
            policy.to_str().unwrap(),
            "--audit-log",
            "-",
            "--jail",
            "kube-test",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("the proxy exited before listening");
        }
        if let Some(a) = line.trim().strip_prefix("corral proxy: listening on ") {
            break a.to_string();
        }
    };
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(
        b"GET http://denied.invalid/ HTTP/1.1\r\nHost: denied.invalid\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let record: Record = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert_eq!(record.jail, "kube-test");
    match record.event {
        Event::Net(n) => {
            assert_eq!(
                (n.host.as_str(), n.decision),
                ("denied.invalid", Some(Decision::Deny))
            );
        }
        other => panic!("not a network record: {other:?}"),
    }
    // Nothing was written to a file named `-`.
    assert!(!p.dir().join("-").exists());
}
