//! The executor's SKILL.md in `corral kube render`, as a user runs it for a harness profile
//! (pi): with the executor's Pod, the sandbox gets the text `corral skill` prints, read-only at
//! the plan's skill directory, and the harness the skill's arguments; the manifests validate
//! strictly. Without the executor nothing of it is rendered, and stderr says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

const KUBERNETES_VERSION: &str = "1.35.0";

fn corral_bin() -> PathBuf {
    std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")))
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A project (a git root) and a home beside it, removed on drop.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root =
            std::env::temp_dir().join(format!("corral-kube-skill-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proj/.git")).unwrap();
        std::fs::create_dir_all(root.join("home")).unwrap();
        Scratch { root }
    }

    fn corral(&self, args: &[&str]) -> Output {
        Command::new(corral_bin())
            .args(args)
            .current_dir(self.root.join("proj"))
            .env("HOME", self.root.join("home"))
            .env("XDG_CONFIG_HOME", self.root.join("home/.config"))
            .env("XDG_STATE_HOME", self.root.join("home/.state"))
            .output()
            .unwrap()
    }

    /// `corral kube render pi ...`: (YAML, stderr).
    fn render(&self, extra: &[&str]) -> (String, String) {
        let mut args = vec![
            "kube",
            "render",
            "pi",
            "--proxy-ip",
            "10.96.0.50",
            "--pids-by-node",
            "--seccomp",
            "runtime-default",
        ];
        args.extend(extra);
        let out = self.corral(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "corral kube render pi failed: {stderr}"
        );
        (String::from_utf8(out.stdout).unwrap(), stderr)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(doc).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .collect()
}

/// The sandbox Pod (the Pod that is not the executor's).
fn sandbox(docs: &[Value]) -> &Value {
    docs.iter()
        .find(|d| d["kind"] == "Pod" && d["metadata"]["labels"]["corral.dev/role"] == "sandbox")
        .expect("the sandbox Pod")
}

fn validator() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CORRAL_KUBERNETES_VALIDATE") {
        return Some(PathBuf::from(p));
    }
    let ci = Path::new("/opt/corral-ci-kube/bin/kubernetes-validate");
    ci.exists().then(|| ci.to_path_buf())
}

#[test]
fn the_skill_reaches_the_sandbox_with_the_executor() {
    let s = Scratch::new();
    let (yaml, _) = s.render(&["--executor-ip", "10.96.0.51"]);
    let docs = documents(&yaml);
    let skill_text = s.corral(&["skill", "pi"]);
    assert!(skill_text.status.success());
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "corral-proj-skill")
        .expect("the skill's ConfigMap");
    assert_eq!(
        cm["data"]["SKILL.md"].as_str().unwrap(),
        String::from_utf8(skill_text.stdout).unwrap(),
        "not the text `corral skill pi` prints"
    );
    let pod = sandbox(&docs);
    let c = &pod["spec"]["containers"][0];
    // The plan's skill directory and arguments, as `corral plan` shows them for the native jail.
    let plan: Value = serde_json::from_slice(&s.corral(&["plan", "pi", "--json"]).stdout).unwrap();
    let dir = plan["skill"]["dir"]
        .as_str()
        .expect("pi's plan has a skill");
    let skill_args: Vec<&Value> = plan["skill"]["args"].as_array().unwrap().iter().collect();
    let args: Vec<&Value> = c["args"].as_array().unwrap().iter().collect();
    assert!(
        args.ends_with(&skill_args),
        "harness args {args:?} lack {skill_args:?}"
    );
    let flag = skill_args[0];
    assert_eq!(args.iter().filter(|a| **a == flag).count(), 1, "{args:?}");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    assert_eq!(mount["readOnly"], true);
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "corral-proj-skill");

    let Some(bin) = validator() else {
        eprintln!("SKIP (validation only): kubernetes-validate not found");
        return;
    };
    let file = s.root.join("jail.yaml");
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
    assert!(text.contains("configmap/corral-proj-skill "), "{text}");
}

#[test]
fn without_the_executor_the_skill_is_left_out_and_said() {
    let s = Scratch::new();
    let (yaml, stderr) = s.render(&[]);
    assert!(!yaml.contains("SKILL"), "{yaml}");
    assert!(!yaml.contains("--skill"), "{yaml}");
    assert!(
        stderr.contains("SKILL.md at") && stderr.contains("rendered only with the executor"),
        "{stderr}"
    );
}
